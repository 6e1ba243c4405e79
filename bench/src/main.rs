//! `shardmq-bench`: load tool for shardmq and any other cluster speaking RocketMQ's
//! remoting protocol (REMOTING.md). Three modes:
//!
//! - `producer`: pipelined sends (SEND_MESSAGE_V2, or SEND_BATCH_MESSAGE with `--batch`) to
//!   every master broker of a topic's route, closed loop (a window of requests in flight) or
//!   open loop (`--rate`, latency from each request's intended send time);
//! - `consumer`: pipelined pulls over every queue of the topic (`--catch-up`: read what is
//!   stored from offset 0 and stop when drained);
//! - `e2e`: both at once; every message carries its intended send time and the consumer
//!   measures receipt minus that time.
//!
//! Every second it prints RocketMQ's own benchmark lines plus p50/p99/p99.9/p99.99 in
//! microseconds (HDR histograms); at the end a summary, and with `--report` a JSON report
//! and an SVG plot of throughput and latency percentiles over time.
//!
//! Layout: `route` asks the name server and brokers, `send_frame` pre-encodes send frames,
//! `worker` drives producer sockets, `consumer` pulls, `records` reads stored messages,
//! `stats`/`consume_stats` count and print, `collect` gathers per second, `plot` draws,
//! `run` ties each mode together.

mod clock;
mod collect;
mod consume_stats;
mod consumer;
mod limit;
mod plot;
mod route;
mod run;
mod send_frame;
mod stats;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use run::{CommonOptions, ConsumerOptions, ProducerOptions, RunLength, StartAt};

/// Default `--duration-secs` when neither it nor `--messages` is given.
const DEFAULT_DURATION_SECS: u64 = 10;

#[derive(Parser)]
#[command(
    name = "shardmq-bench",
    version,
    about = "Load tool for RocketMQ-compatible clusters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send messages (closed loop, or open loop with --rate) and report throughput and
    /// send latency.
    Producer {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        producer: ProducerArgs,
    },
    /// Pull every queue of a topic and report throughput, B2C/S2C delays and pull round
    /// trips (--catch-up: read what is stored, then stop).
    Consumer {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        consumer: ConsumerArgs,
    },
    /// The ceiling of this machine: a minimal server (namesrv + one broker endpoint per
    /// core) that appends sends with O_DIRECT and acknowledges after write + fdatasync
    /// (group commit), to run `producer` against beside a broker. Runs until stopped.
    Limit(LimitArgs),
    /// Produce and consume at once; report latency from each message's intended send time
    /// to its receipt.
    E2e {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        producer: ProducerArgs,
        #[command(flatten)]
        consumer: ConsumerArgs,
    },
}

#[derive(Args)]
struct CommonArgs {
    /// Name server address(es), `host:port[;host:port...]`.
    #[arg(long, default_value = "127.0.0.1:9876")]
    namesrv: String,
    /// Topic; a producer auto-creates an unknown one via TBW102 if the cluster allows.
    #[arg(long, default_value = "BenchTopic")]
    topic: String,
    /// Create (or resize) the topic first with this many read and write queues on every
    /// master broker of the cluster.
    #[arg(long)]
    queues: Option<u32>,
    /// Spread the sends (and the pulls) over this many topics, `<topic>-00000` and on, each
    /// created first with --queues queues per broker (many topics × queues, as a real
    /// deployment).
    #[arg(long)]
    topics: Option<u32>,
    /// Run for this long (default 10 s unless --messages is given; a catch-up runs until
    /// drained).
    #[arg(long, conflicts_with = "messages")]
    duration_secs: Option<u64>,
    /// Send (or receive) this many messages in all, then stop.
    #[arg(long, alias = "count")]
    messages: Option<u64>,
    /// A request unanswered after this long counts as failed.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
    /// Write the summary and the per-second series as JSON to this file (and the plot
    /// beside it, as .svg, unless --plot says where).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the SVG plot of throughput and latency percentiles over time here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress line on stderr (it is drawn only when stderr is a terminal).
    #[arg(long)]
    no_progress: bool,
    /// AccessKey to sign every request with (brokers with ACL on).
    #[arg(long, requires = "secret_key")]
    access_key: Option<String>,
    /// SecretKey of --access-key.
    #[arg(long, requires = "access_key")]
    secret_key: Option<String>,
    /// Speak TLS to every server (the producer's load too).
    #[arg(long)]
    tls: bool,
    /// Verify the servers' certificates against these PEM CA certificates (without it, any
    /// certificate is taken, as RocketMQ's clients do without tls.client.trustCertPath).
    #[arg(long, requires = "tls")]
    tls_trust_cert_path: Option<PathBuf>,
}

#[derive(Args)]
struct ProducerArgs {
    /// Message body size in bytes.
    #[arg(long, default_value_t = 1024)]
    message_size: usize,
    /// Messages per request: 1 sends SEND_MESSAGE_V2, more send SEND_BATCH_MESSAGE.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Open loop: send this many messages per second in all, on a fixed schedule, and
    /// measure latency from each request's scheduled time. Default: closed loop.
    #[arg(long)]
    rate: Option<f64>,
    /// Requests outstanding per connection (pipelined).
    #[arg(long, default_value_t = 256)]
    in_flight: usize,
    /// Connections to each master broker of the route.
    #[arg(long, default_value_t = 1)]
    connections_per_broker: usize,
    /// Producer worker threads; connections are spread over them.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Message tag (TAGS property).
    #[arg(long, default_value = "TagA")]
    tag: String,
    /// Give every message a unique KEYS property (a business key, as order ids are).
    #[arg(long)]
    keys: bool,
    /// Producer group (header field a).
    #[arg(long, default_value = "shardmq_bench_producer")]
    producer_group: String,
}

#[derive(Args)]
struct LimitArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    listen_ip: std::net::IpAddr,
    #[arg(long, default_value_t = 9876)]
    namesrv_port: u16,
    /// Port of shard 0; shard i listens on broker_port + port_stride · i.
    #[arg(long, default_value_t = 10911)]
    broker_port: u16,
    #[arg(long, default_value_t = 10)]
    port_stride: u16,
    /// Number of shards, pinned to CPUs 0, 1, … (see --cpus).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Comma-separated CPU ids to pin the shards to (overrides --shards).
    #[arg(long, value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// Where each shard's log file (`limit-<i>.log`) goes; put it on the disk to measure.
    #[arg(long, default_value = "shardmq-limit-data")]
    data_dir: std::path::PathBuf,
    /// sync: acknowledge after the write and fdatasync that cover a send; async: on arrival.
    #[arg(long, value_enum, default_value = "sync")]
    flush: LimitFlush,
    /// Size of each shard's file, zeroed at start and written round and round, in MiB.
    #[arg(long, default_value_t = 1024)]
    ring_mib: u64,
    /// Only allocate the file (fallocate) instead of zeroing it: until the writes come round,
    /// each durable write also commits its extent conversion, as a fresh store's writes into
    /// new segment files do. Make the ring larger than a run writes.
    #[arg(long)]
    unwritten: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum LimitFlush {
    Sync,
    Async,
}

impl LimitArgs {
    fn into_options(self) -> limit::LimitOptions {
        limit::LimitOptions {
            listen_ip: self.listen_ip,
            namesrv_port: self.namesrv_port,
            broker_port: self.broker_port,
            port_stride: self.port_stride,
            cpus: self.cpus.unwrap_or_else(|| (0..self.shards).collect()),
            data_dir: self.data_dir,
            flush: match self.flush {
                LimitFlush::Sync => limit::Flush::Sync,
                LimitFlush::Async => limit::Flush::Async,
            },
            ring_bytes: self.ring_mib.clamp(64, 1 << 20) << 20,
            unwritten: self.unwritten,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Start {
    First,
    Last,
}

#[derive(Args)]
struct ConsumerArgs {
    /// Consumer group named in every pull (offsets are never committed).
    #[arg(long, default_value = "shardmq_bench_consumer")]
    consumer_group: String,
    /// Pull as this many groups, `<consumer-group>-000` and on, each reading every message
    /// (one connection per group and broker).
    #[arg(long, default_value_t = 1)]
    groups: u32,
    /// TAG expression the pulls filter on.
    #[arg(long, default_value = "*")]
    subscription: String,
    /// Messages asked for per pull (maxMsgNums).
    #[arg(long, default_value_t = 32)]
    pull_batch: u32,
    /// Long-poll hold asked for when a queue is empty (suspendTimeoutMillis).
    #[arg(long, default_value_t = 1000)]
    suspend_ms: u64,
    /// Where the consumer starts in each queue (e2e always starts at the last offset).
    #[arg(long, value_enum, default_value = "last")]
    from: Start,
    /// Read every stored message from the first offset without long polling, and stop once
    /// every queue is drained.
    #[arg(long)]
    catch_up: bool,
    /// End-to-end: seconds to wait for the last messages after the producers stop.
    #[arg(long, default_value_t = 5)]
    drain_secs: u64,
    /// Pull with this many threads: the connections (one per group and broker) are dealt
    /// out over them, as the instances of a consumer group share its queues.
    #[arg(long, default_value_t = 1)]
    consumer_threads: usize,
}

impl CommonArgs {
    fn into_options(self, catch_up: bool) -> CommonOptions {
        if self.tls {
            let options = shardmq_client::TlsOptions {
                trust_cert_path: self.tls_trust_cert_path.clone(),
                client_cert: None,
            };
            match options.client_config() {
                Ok(config) => route::set_tls(config),
                Err(error) => {
                    eprintln!("shardmq-bench: --tls: {error}");
                    std::process::exit(2);
                }
            }
        }
        if let (Some(access_key), Some(secret_key)) = (&self.access_key, &self.secret_key) {
            route::set_credentials(shardmq_protocol::remoting::signature::Credentials::new(
                access_key, secret_key,
            ));
        }
        let run_length = match (self.messages, self.duration_secs) {
            (Some(count), _) => RunLength::Messages(count),
            (None, Some(secs)) => RunLength::Duration(Duration::from_secs(secs)),
            (None, None) if catch_up => RunLength::UntilDrained,
            (None, None) => RunLength::Duration(Duration::from_secs(DEFAULT_DURATION_SECS)),
        };
        CommonOptions {
            namesrv: self.namesrv,
            topic: self.topic,
            queues: self.queues,
            topics: self.topics,
            run_length,
            request_timeout: Duration::from_millis(self.timeout_ms),
            report: self.report,
            plot: self.plot,
            progress: !self.no_progress,
        }
    }
}

impl ProducerArgs {
    fn into_options(self) -> ProducerOptions {
        ProducerOptions {
            producer_group: self.producer_group,
            tag: self.tag,
            keys: self.keys,
            message_size_bytes: self.message_size,
            batch: self.batch,
            in_flight: self.in_flight,
            connections_per_broker: self.connections_per_broker,
            threads: self.threads,
            rate: self.rate,
        }
    }
}

impl ConsumerArgs {
    fn into_options(self) -> ConsumerOptions {
        ConsumerOptions {
            consumer_group: self.consumer_group,
            groups: self.groups,
            subscription: self.subscription,
            pull_batch: self.pull_batch,
            suspend_ms: self.suspend_ms,
            start_at: match self.from {
                Start::First => StartAt::First,
                Start::Last => StartAt::Last,
            },
            catch_up: self.catch_up,
            drain: Duration::from_secs(self.drain_secs),
            threads: self.consumer_threads,
        }
    }
}

/// Errors end the run with status 1 and one line: the chain of causes, no backtrace.
fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Producer { common, producer } => {
            run::run_producer(&common.into_options(false), &producer.into_options())
        }
        Command::Consumer { common, consumer } => {
            let catch_up = consumer.catch_up;
            run::run_consumer(&common.into_options(catch_up), &consumer.into_options())
        }
        Command::Limit(limit) => limit::run_limit(limit.into_options()),
        Command::E2e {
            common,
            producer,
            consumer,
        } => run::run_end_to_end(
            &common.into_options(false),
            &producer.into_options(),
            &consumer.into_options(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shardmq-bench: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_length_follows_the_flags() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        assert!(parse(&["b", "producer", "--messages", "5", "--duration-secs", "3"]).is_err());
        let Command::Producer { common, .. } = parse(&["b", "producer"]).unwrap().command else {
            panic!("producer")
        };
        assert_eq!(
            common.into_options(false).run_length,
            RunLength::Duration(Duration::from_secs(10))
        );
        let Command::Consumer { common, consumer } =
            parse(&["b", "consumer", "--catch-up"]).unwrap().command
        else {
            panic!("consumer")
        };
        assert!(consumer.catch_up);
        assert_eq!(
            common.into_options(true).run_length,
            RunLength::UntilDrained
        );
        let Command::E2e { common, .. } = parse(&["b", "e2e", "--count", "7", "--rate", "100"])
            .unwrap()
            .command
        else {
            panic!("e2e")
        };
        assert_eq!(
            common.into_options(false).run_length,
            RunLength::Messages(7)
        );
    }
}
