//! `shardmq-bench`: load tool for shardmq and any other cluster speaking RocketMQ's
//! remoting protocol (REMOTING.md). One mode so far, `producer`: pipelined
//! SEND_MESSAGE_V2 requests to every master broker of a topic's route, with RocketMQ's
//! benchmark line every second and a summary (optionally JSON) at the end.
//!
//! Layout: `route` asks the name server where to send, `send_frame` pre-encodes the frames,
//! `worker` drives the sockets, `stats` counts and prints, `producer` ties them together.

mod producer;
mod route;
mod send_frame;
mod stats;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use producer::{ProducerOptions, RunLength};

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
    /// Send messages as fast as the in-flight window allows and report throughput and latency.
    Producer(ProducerArgs),
}

#[derive(Args)]
struct ProducerArgs {
    /// Name server address(es), `host:port[;host:port...]`.
    #[arg(long, default_value = "127.0.0.1:9876")]
    namesrv: String,
    /// Topic to send to; an unknown topic is auto-created via TBW102 if the cluster allows.
    #[arg(long, default_value = "BenchTopic")]
    topic: String,
    /// Message body size in bytes.
    #[arg(long, default_value_t = 1024)]
    message_size: usize,
    /// Requests outstanding per connection (pipelined).
    #[arg(long, default_value_t = 256)]
    in_flight: usize,
    /// Connections to each master broker of the route.
    #[arg(long, default_value_t = 1)]
    connections_per_broker: usize,
    /// Run for this long (default 10 s unless --messages is given).
    #[arg(long, conflicts_with = "messages")]
    duration_secs: Option<u64>,
    /// Send this many messages in all, then stop.
    #[arg(long)]
    messages: Option<u64>,
    /// Worker threads; connections are spread over them.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Message tag (TAGS property).
    #[arg(long, default_value = "TagA")]
    tag: String,
    /// Producer group (header field a).
    #[arg(long, default_value = "shardmq_bench_producer")]
    producer_group: String,
    /// A request unanswered after this long counts as Send Failed.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
    /// Also write the summary as JSON to this file.
    #[arg(long)]
    report: Option<PathBuf>,
}

impl ProducerArgs {
    fn into_options(self) -> ProducerOptions {
        let run_length = match (self.messages, self.duration_secs) {
            (Some(count), _) => RunLength::Messages(count),
            (None, secs) => {
                RunLength::Duration(Duration::from_secs(secs.unwrap_or(DEFAULT_DURATION_SECS)))
            }
        };
        ProducerOptions {
            namesrv: self.namesrv,
            topic: self.topic,
            producer_group: self.producer_group,
            tag: self.tag,
            message_size_bytes: self.message_size,
            in_flight: self.in_flight,
            connections_per_broker: self.connections_per_broker,
            threads: self.threads,
            run_length,
            request_timeout: Duration::from_millis(self.timeout_ms),
            report: self.report,
        }
    }
}

/// Errors end the run with status 1 and one line: the chain of causes, no backtrace.
fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Producer(args) => producer::run(&args.into_options()),
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
    fn duration_and_messages_exclude_each_other() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        assert!(parse(&["b", "producer", "--messages", "5", "--duration-secs", "3"]).is_err());
        let Command::Producer(args) = parse(&["b", "producer"]).unwrap().command;
        assert!(matches!(
            args.into_options().run_length,
            RunLength::Duration(duration) if duration == Duration::from_secs(10)
        ));
    }
}
