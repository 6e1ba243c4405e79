//! `shardmq-bench producer`: resolves the topic's route, connects to every master broker,
//! starts the workers (worker.rs), prints one line per second and a summary at the end.
//!
//! Runs on the main thread; the only state shared with workers is the immutable frame
//! templates (`Arc`), and figures come back as messages. Limits on every option are named
//! below and checked before anything connects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use serde_json::json;
use shardmq::remoting::response_code_name;

use crate::route::{self, PublishTarget};
use crate::send_frame::{SendFields, SendTemplate, CONNECTIONS_MAX};
use crate::stats::{interval_line, RunSummary, Tally, LATENCY_HIGHEST_TRACKABLE_US};
use crate::worker::{self, ConnectionPlan, WorkerPlan, WorkerReport, IN_FLIGHT_MAX_REQUESTS};

/// The broker's and Java producer's default `maxMessageSize` (REMOTING.md §1.6).
pub const MESSAGE_SIZE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// More connections than this per broker measures the kernel, not the broker.
pub const CONNECTIONS_PER_BROKER_MAX: usize = 1024;
/// Worker threads; far more than any box this tool should share with a broker.
pub const THREADS_MAX: usize = 256;
/// Topic names (§1.6).
const TOPIC_NAME_MAX_CHARS: usize = 127;
/// Group names (§1.6, 5.x).
const GROUP_NAME_MAX_CHARS: usize = 120;

const _: () = assert!(MESSAGE_SIZE_MAX_BYTES < shardmq::remoting::FRAME_SIZE_MAX_BYTES / 2);

/// How long the load runs.
#[derive(Debug, Clone, Copy)]
pub enum RunLength {
    Duration(Duration),
    /// This many messages in all, split evenly over the connections.
    Messages(u64),
}

/// Every option of the producer mode.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub namesrv: String,
    pub topic: String,
    pub producer_group: String,
    pub tag: String,
    pub message_size_bytes: usize,
    pub in_flight: usize,
    pub connections_per_broker: usize,
    pub threads: usize,
    pub run_length: RunLength,
    pub request_timeout: Duration,
    pub report: Option<PathBuf>,
}

impl ProducerOptions {
    fn validate(&self) -> anyhow::Result<()> {
        check_resource_name("topic", &self.topic, TOPIC_NAME_MAX_CHARS)?;
        check_resource_name("producer group", &self.producer_group, GROUP_NAME_MAX_CHARS)?;
        ensure!(
            (1..=MESSAGE_SIZE_MAX_BYTES).contains(&self.message_size_bytes),
            "--message-size must be 1..={MESSAGE_SIZE_MAX_BYTES} bytes"
        );
        ensure!(
            (1..=IN_FLIGHT_MAX_REQUESTS).contains(&self.in_flight),
            "--in-flight must be 1..={IN_FLIGHT_MAX_REQUESTS}"
        );
        ensure!(
            (1..=CONNECTIONS_PER_BROKER_MAX).contains(&self.connections_per_broker),
            "--connections-per-broker must be 1..={CONNECTIONS_PER_BROKER_MAX}"
        );
        ensure!(
            (1..=THREADS_MAX).contains(&self.threads),
            "--threads must be 1..={THREADS_MAX}"
        );
        let timeout_ms_max = LATENCY_HIGHEST_TRACKABLE_US / 1000;
        ensure!(
            (1..=u128::from(timeout_ms_max)).contains(&self.request_timeout.as_millis()),
            "--timeout-ms must be 1..={timeout_ms_max}"
        );
        match self.run_length {
            RunLength::Duration(duration) => {
                ensure!(!duration.is_zero(), "--duration-secs must be at least 1")
            }
            RunLength::Messages(count) => ensure!(count > 0, "--messages must be at least 1"),
        }
        Ok(())
    }

    fn config_json(&self, targets: &[PublishTarget]) -> serde_json::Value {
        let (duration_secs, messages) = match self.run_length {
            RunLength::Duration(duration) => (Some(duration.as_secs()), None),
            RunLength::Messages(count) => (None, Some(count)),
        };
        let brokers: Vec<_> = targets
            .iter()
            .map(|target| {
                json!({
                    "broker_name": target.broker_name,
                    "broker_addr": target.broker_addr,
                    "write_queue_nums": target.write_queue_nums,
                })
            })
            .collect();
        json!({
            "namesrv": self.namesrv,
            "topic": self.topic,
            "producer_group": self.producer_group,
            "tag": self.tag,
            "message_size_bytes": self.message_size_bytes,
            "in_flight": self.in_flight,
            "connections_per_broker": self.connections_per_broker,
            "threads": self.threads,
            "duration_secs": duration_secs,
            "messages": messages,
            "timeout_ms": self.request_timeout.as_millis() as u64,
            "brokers": brokers,
        })
    }
}

/// RocketMQ's charset for topic and group names: letters, digits, `%`, `-`, `_`, `|`.
fn check_resource_name(what: &str, name: &str, max_chars: usize) -> anyhow::Result<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '%' | '-' | '_' | '|');
    ensure!(
        !name.is_empty() && name.len() <= max_chars && name.chars().all(allowed),
        "{what} {name:?} must be 1..={max_chars} characters of [A-Za-z0-9%_|-]"
    );
    Ok(())
}

/// Runs the producer benchmark; an error is a run that could not start or stored nothing.
pub fn run(options: &ProducerOptions) -> anyhow::Result<()> {
    options.validate()?;
    let targets =
        route::fetch_publish_targets(&options.namesrv, &options.topic, options.request_timeout)?;
    let connections = connect_all(options, &targets)?;
    let connection_count = connections.len();
    let worker_count = options.threads.min(connection_count);
    println!(
        "Producing to {}: {} broker(s), {connection_count} connection(s), {worker_count} \
         thread(s), {} in flight per connection, {}-byte bodies",
        options.topic,
        targets.len(),
        options.in_flight,
        options.message_size_bytes
    );

    let start = Instant::now();
    let deadline = match options.run_length {
        RunLength::Duration(duration) => Some(start + duration),
        RunLength::Messages(_) => None,
    };
    let (reports, receiver) = mpsc::channel();
    let mut per_worker: Vec<Vec<ConnectionPlan>> = (0..worker_count).map(|_| Vec::new()).collect();
    for (index, connection) in connections.into_iter().enumerate() {
        per_worker[index % worker_count].push(connection);
    }
    let mut handles = Vec::with_capacity(worker_count);
    for (worker, connections) in per_worker.into_iter().enumerate() {
        let plan = WorkerPlan {
            worker,
            connections,
            in_flight_max: options.in_flight,
            run_prefix: run_prefix(),
            start,
            deadline,
            request_timeout: options.request_timeout,
            reports: reports.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("bench-worker-{worker}"))
            .spawn(move || worker::run_worker(plan))
            .context("starting a worker thread")?;
        handles.push(handle);
    }
    drop(reports);
    let outcome = collect_reports(&receiver, worker_count);
    for handle in handles {
        handle
            .join()
            .expect("worker threads do not panic (panic = abort)");
    }

    let summary = RunSummary {
        total: &outcome.total,
        elapsed: outcome.finished_at.saturating_duration_since(start),
        message_size_bytes: options.message_size_bytes,
    };
    println!(
        "--- shardmq-bench producer summary ---\n{}",
        summary.to_text()
    );
    if let Some(path) = &options.report {
        let report = summary.to_json(options.config_json(&targets));
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serialises");
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the report to {}", path.display()))?;
        println!("Report written to {}", path.display());
    }
    if outcome.connections_lost == connection_count {
        bail!("every connection was lost");
    }
    if outcome.total.succeeded == 0 {
        bail!("no message was stored (see the failures above)");
    }
    Ok(())
}

/// One blocking connect per connection, before the clock starts; sockets are handed over
/// non-blocking. Messages in `--messages` mode are split evenly, remainder first.
fn connect_all(
    options: &ProducerOptions,
    targets: &[PublishTarget],
) -> anyhow::Result<Vec<ConnectionPlan>> {
    let connection_count = targets.len() * options.connections_per_broker;
    ensure!(
        connection_count <= CONNECTIONS_MAX,
        "{connection_count} connections exceed the limit of {CONNECTIONS_MAX}"
    );
    let body = message_body(options.message_size_bytes);
    let fields = SendFields {
        producer_group: &options.producer_group,
        topic: &options.topic,
        tag: &options.tag,
    };
    let mut plans = Vec::with_capacity(connection_count);
    for target in targets {
        let templates = (0..target.write_queue_nums)
            .map(|queue_id| SendTemplate::new(&fields, queue_id, &body))
            .collect::<anyhow::Result<Vec<_>>>()?;
        println!(
            "Broker {} at {}: {} write queue(s), {}-byte frames",
            target.broker_name,
            target.broker_addr,
            target.write_queue_nums,
            templates.first().map_or(0, SendTemplate::frame_size_bytes)
        );
        let templates = Arc::new(templates);
        for _ in 0..options.connections_per_broker {
            let context = || format!("broker {} ({})", target.broker_name, target.broker_addr);
            let stream = route::connect(&target.broker_addr, options.request_timeout)
                .with_context(context)?;
            stream.set_nodelay(true).with_context(context)?;
            stream.set_nonblocking(true).with_context(context)?;
            let index = plans.len();
            plans.push(ConnectionPlan {
                index,
                broker_addr: target.broker_addr.clone(),
                stream,
                templates: Arc::clone(&templates),
                quota_messages: quota(options.run_length, index, connection_count),
            });
        }
    }
    Ok(plans)
}

/// Messages for connection `index` of `count` in `--messages` mode.
fn quota(run_length: RunLength, index: usize, count: usize) -> Option<u64> {
    match run_length {
        RunLength::Duration(_) => None,
        RunLength::Messages(total) => {
            let count = count as u64;
            let index = index as u64;
            Some(total / count + u64::from(index < total % count))
        }
    }
}

/// Printable, deterministic body bytes (`a`..`z`, `0`..`9` repeated).
fn message_body(size_bytes: usize) -> Vec<u8> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    ALPHABET.iter().copied().cycle().take(size_bytes).collect()
}

/// Differs between runs, so UNIQ_KEYs of two runs never collide: process id and start second.
fn run_prefix() -> u64 {
    let start_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    (u64::from(std::process::id()) << 32) | (start_secs & 0xFFFF_FFFF)
}

struct Outcome {
    total: Tally,
    finished_at: Instant,
    connections_lost: usize,
}

/// Gathers the workers' reports until every worker is done, printing each one-second line
/// once every live worker has reported that tick.
fn collect_reports(receiver: &mpsc::Receiver<WorkerReport>, worker_count: usize) -> Outcome {
    let mut total = Tally::new();
    let mut live: BTreeSet<usize> = (0..worker_count).collect();
    let mut pending: BTreeMap<u64, (Tally, BTreeSet<usize>)> = BTreeMap::new();
    let mut finished_at = None;
    let mut connections_lost = 0;
    while let Ok(report) = receiver.recv() {
        match report {
            WorkerReport::Interval {
                worker,
                tick,
                tally,
            } => {
                let (merged, reported) = pending
                    .entry(tick)
                    .or_insert_with(|| (Tally::new(), BTreeSet::new()));
                merged.merge(&tally);
                reported.insert(worker);
            }
            WorkerReport::Done {
                worker,
                tally,
                finished_at: worker_finished_at,
                connections_lost: lost,
            } => {
                live.remove(&worker);
                print_first_remarks(&total.merge(&tally), &total);
                finished_at = finished_at.max(Some(worker_finished_at));
                connections_lost += lost;
            }
        }
        while let Some(entry) = pending.first_entry() {
            if !live.is_subset(&entry.get().1) {
                break;
            }
            let (interval, _) = entry.remove();
            print_first_remarks(&total.merge(&interval), &total);
            println!("{}", interval_line(&interval, worker::TICK, &total));
        }
    }
    Outcome {
        total,
        finished_at: finished_at.unwrap_or_else(Instant::now),
        connections_lost,
    }
}

fn print_first_remarks(new_codes: &[i32], total: &Tally) {
    for code in new_codes {
        let remark = &total.response_failures[code].first_remark;
        let name = response_code_name(*code).unwrap_or("UNKNOWN");
        eprintln!("First response with code {code} ({name}): {remark:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_evenly_remainder_first() {
        let run_length = RunLength::Messages(10);
        let quotas: Vec<_> = (0..4)
            .map(|index| quota(run_length, index, 4).unwrap())
            .collect();
        assert_eq!(quotas, [3, 3, 2, 2]);
        assert_eq!(
            quota(RunLength::Duration(Duration::from_secs(1)), 0, 4),
            None
        );
    }

    #[test]
    fn resource_names_follow_rocketmq_charset() {
        assert!(check_resource_name("topic", "Bench_Topic-1%x|y", 127).is_ok());
        assert!(check_resource_name("topic", "", 127).is_err());
        assert!(check_resource_name("topic", "a b", 127).is_err());
        assert!(check_resource_name("topic", &"t".repeat(128), 127).is_err());
    }

    #[test]
    fn body_has_the_asked_size() {
        assert_eq!(message_body(40).len(), 40);
        assert_eq!(&message_body(40)[36..], b"abcd");
    }
}
