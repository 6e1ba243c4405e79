//! The three modes, from options to report: `producer` (send load), `consumer` (pull load,
//! or catch-up of what is stored) and `e2e` (both at once, measuring each message from its
//! intended send time to its receipt).
//!
//! Each mode resolves the route (creating the topic when `--queues` is given), connects
//! before the clock starts, runs its workers (`worker` for producers, `consumer`), gathers
//! their figures on the main thread (`collect`) and ends with a summary, an optional JSON
//! report and an SVG plot. Every option is checked against a named limit before anything
//! connects.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use serde_json::{json, Value};
use shardmq_protocol::body::TopicRouteData;

use crate::clock::RunClock;
use crate::collect::{Collected, Collector, Headline, IntervalPoint};
use crate::consume_stats::ConsumeSummary;
use crate::consumer::{self, ConsumerPlan, ProducersDone, PullConnectionPlan, PullQueue, StopWhen};
use crate::plot;
use crate::route::{self, PublishTarget, SubscribeTarget, QUEUES_MAX};
use crate::send_frame::{
    SendFields, SendTemplate, BATCH_MAX_MESSAGES, CONNECTIONS_MAX, MESSAGE_SIZE_MAX_BYTES,
};
use crate::stats::{round3, RunSummary, LATENCY_HIGHEST_TRACKABLE_US};
use crate::worker::{self, ConnectionPlan, Pacing, WorkerPlan, IN_FLIGHT_MAX_REQUESTS};

/// More connections than this per broker measures the kernel, not the broker.
pub const CONNECTIONS_PER_BROKER_MAX: usize = 1024;
/// Worker threads; far more than any box this tool should share with a broker.
pub const THREADS_MAX: usize = 256;
/// Open-loop rates, in messages per second.
pub const RATE_MAX_MESSAGES_PER_SEC: f64 = 100_000_000.0;
/// Messages one pull asks for at most (the broker caps it further, RocketMQ at 32).
pub const PULL_BATCH_MAX_MESSAGES: u32 = 1024;
/// Longest long-poll hold a pull asks for (clients time out at 30 s).
pub const SUSPEND_MAX_MS: u64 = 25_000;
/// Longest wait for stragglers after the producers stop (end-to-end mode).
pub const DRAIN_MAX: Duration = Duration::from_secs(600);
/// Queues an end-to-end run creates per broker when the topic does not exist.
pub const E2E_DEFAULT_QUEUES: u32 = 4;
/// Topic names (§1.6).
const TOPIC_NAME_MAX_CHARS: usize = 127;
/// Group names (§1.6, 5.x).
const GROUP_NAME_MAX_CHARS: usize = 120;

/// How long the load runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    Duration(Duration),
    /// This many messages in all (producers: a multiple of the batch).
    Messages(u64),
    /// Consumer catch-up: until every queue is drained.
    UntilDrained,
}

/// Options every mode has.
#[derive(Debug, Clone)]
pub struct CommonOptions {
    pub namesrv: String,
    pub topic: String,
    /// Create (or resize) the topic with this many queues per broker first.
    pub queues: Option<u32>,
    /// Producer: send to this many topics `<topic>-00000…` (created with `queues` each).
    pub topics: Option<u32>,
    pub run_length: RunLength,
    pub request_timeout: Duration,
    pub report: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub progress: bool,
}

/// Options of the sending side.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub producer_group: String,
    pub tag: String,
    /// Give every message a unique KEYS property.
    pub keys: bool,
    pub message_size_bytes: usize,
    /// Messages per request (1: SEND_MESSAGE_V2; more: SEND_BATCH_MESSAGE).
    pub batch: usize,
    pub in_flight: usize,
    pub connections_per_broker: usize,
    pub threads: usize,
    /// Open loop: messages per second in all; None: closed loop.
    pub rate: Option<f64>,
}

/// Where a consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// Offset 0 of every queue (or its minimum).
    First,
    /// The current end of every queue.
    Last,
}

/// Options of the pulling side.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub consumer_group: String,
    /// Groups reading every message: `consumer_group`, or `<consumer_group>-000…` when > 1.
    pub groups: u32,
    pub subscription: String,
    pub pull_batch: u32,
    pub suspend_ms: u64,
    pub start_at: StartAt,
    /// Pull what is stored, without long polling, and stop once every queue is drained.
    pub catch_up: bool,
    /// End-to-end: how long to wait for stragglers after the producers stop.
    pub drain: Duration,
    /// Consumer threads the connections are spread over (at most one a connection).
    pub threads: usize,
}

/// Most topics one `--topics` run spreads its sends over.
pub const TOPICS_MAX: u32 = 100_000;

impl CommonOptions {
    /// The topics a producer sends to: `--topic`, or `<topic>-00000…` with `--topics N`.
    pub fn topic_names(&self) -> Vec<String> {
        match self.topics {
            None => vec![self.topic.clone()],
            Some(count) => (0..count)
                .map(|i| format!("{}-{i:05}", self.topic))
                .collect(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        check_resource_name("topic", &self.topic, TOPIC_NAME_MAX_CHARS)?;
        if let Some(topics) = self.topics {
            ensure!(
                (1..=TOPICS_MAX).contains(&topics),
                "--topics must be 1..={TOPICS_MAX}"
            );
            ensure!(
                self.queues.is_some(),
                "--topics needs --queues (each topic is created)"
            );
            check_resource_name("topic", &self.topic_names()[0], TOPIC_NAME_MAX_CHARS)?;
        }
        if let Some(queues) = self.queues {
            ensure!(
                (1..=QUEUES_MAX).contains(&queues),
                "--queues must be 1..={QUEUES_MAX}"
            );
        }
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
            RunLength::UntilDrained => {}
        }
        Ok(())
    }

    fn config_json(&self) -> Value {
        let (duration_secs, messages) = match self.run_length {
            RunLength::Duration(duration) => (Some(duration.as_secs()), None),
            RunLength::Messages(count) => (None, Some(count)),
            RunLength::UntilDrained => (None, None),
        };
        json!({
            "namesrv": self.namesrv,
            "topic": self.topic,
            "queues": self.queues,
            "duration_secs": duration_secs,
            "messages": messages,
            "timeout_ms": self.request_timeout.as_millis() as u64,
        })
    }
}

impl ProducerOptions {
    fn validate(&self, run_length: RunLength) -> anyhow::Result<()> {
        check_resource_name("producer group", &self.producer_group, GROUP_NAME_MAX_CHARS)?;
        ensure!(
            (1..=MESSAGE_SIZE_MAX_BYTES).contains(&self.message_size_bytes),
            "--message-size must be 1..={MESSAGE_SIZE_MAX_BYTES} bytes"
        );
        ensure!(
            (1..=BATCH_MAX_MESSAGES).contains(&self.batch),
            "--batch must be 1..={BATCH_MAX_MESSAGES}"
        );
        if let RunLength::Messages(count) = run_length {
            ensure!(
                count % self.batch as u64 == 0,
                "--messages ({count}) must be a multiple of --batch ({})",
                self.batch
            );
        }
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
        if let Some(rate) = self.rate {
            ensure!(
                rate.is_finite() && (1.0..=RATE_MAX_MESSAGES_PER_SEC).contains(&rate),
                "--rate must be 1..={RATE_MAX_MESSAGES_PER_SEC} messages per second"
            );
        }
        Ok(())
    }

    fn config_json(&self, targets: &[PublishTarget]) -> Value {
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
            "producer_group": self.producer_group,
            "tag": self.tag,
            "keys": self.keys,
            "message_size_bytes": self.message_size_bytes,
            "batch": self.batch,
            "in_flight": self.in_flight,
            "connections_per_broker": self.connections_per_broker,
            "threads": self.threads,
            "rate": self.rate,
            "loop": if self.rate.is_some() { "open" } else { "closed" },
            "brokers": brokers,
        })
    }
}

/// Most consumer groups one run pulls with.
pub const GROUPS_MAX: u32 = 1_000;

impl ConsumerOptions {
    /// The groups the consumer pulls as.
    pub fn group_names(&self) -> Vec<String> {
        match self.groups {
            0 | 1 => vec![self.consumer_group.clone()],
            count => (0..count)
                .map(|i| format!("{}-{i:03}", self.consumer_group))
                .collect(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            (1..=GROUPS_MAX).contains(&self.groups),
            "--groups must be 1..={GROUPS_MAX}"
        );
        for group in self.group_names() {
            check_resource_name("consumer group", &group, GROUP_NAME_MAX_CHARS)?;
        }
        ensure!(
            !self.subscription.is_empty() && !self.subscription.chars().any(char::is_control),
            "--subscription must be a TAG expression such as * or TagA||TagB"
        );
        ensure!(
            (1..=PULL_BATCH_MAX_MESSAGES).contains(&self.pull_batch),
            "--pull-batch must be 1..={PULL_BATCH_MAX_MESSAGES}"
        );
        ensure!(
            self.suspend_ms <= SUSPEND_MAX_MS,
            "--suspend-ms must be 0..={SUSPEND_MAX_MS}"
        );
        ensure!(
            self.drain <= DRAIN_MAX,
            "--drain-secs must be 0..={}",
            DRAIN_MAX.as_secs()
        );
        ensure!(
            (1..=THREADS_MAX).contains(&self.threads),
            "--consumer-threads must be 1..={THREADS_MAX}"
        );
        Ok(())
    }

    fn config_json(&self, targets: &[SubscribeTarget]) -> Value {
        let brokers: Vec<_> = targets
            .iter()
            .map(|target| {
                json!({
                    "broker_name": target.broker_name,
                    "broker_addr": target.broker_addr,
                    "read_queue_nums": target.read_queue_nums,
                })
            })
            .collect();
        json!({
            "consumer_group": self.consumer_group,
            "groups": self.groups,
            "subscription": self.subscription,
            "pull_batch": self.pull_batch,
            "suspend_ms": if self.catch_up { 0 } else { self.suspend_ms },
            "start_at": match self.start_at { StartAt::First => "first", StartAt::Last => "last" },
            "catch_up": self.catch_up,
            "drain_secs": self.drain.as_secs(),
            "threads": self.threads,
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

/// `producer` mode.
pub fn run_producer(common: &CommonOptions, producer: &ProducerOptions) -> anyhow::Result<()> {
    common.validate()?;
    producer.validate(common.run_length)?;
    ensure!(
        common.run_length != RunLength::UntilDrained,
        "a producer runs for a duration or a message count"
    );
    let names = common.topic_names();
    let created = std::time::Instant::now();
    let mut topics = Vec::with_capacity(names.len());
    for name in names {
        let targets = match common.queues {
            Some(queues) => {
                let route =
                    route::create_topic(&common.namesrv, &name, queues, common.request_timeout)?;
                route::publish_targets(&route, None)?
            }
            None => route::fetch_publish_targets(&common.namesrv, &name, common.request_timeout)?,
        };
        topics.push((name, targets));
    }
    if topics.len() > 1 {
        println!(
            "Created {} topics of {} queue(s) per broker in {:.1} s",
            topics.len(),
            common.queues.unwrap_or(0),
            created.elapsed().as_secs_f64()
        );
    }
    let targets = topics[0].1.clone();
    let connections = connect_producers(common, producer, &topics, false)?;
    let connection_count = connections.len();
    let clock = RunClock::start_now();
    let (sender, receiver) = mpsc::channel();
    let handles = start_producers(common, producer, connections, clock, &sender)?;
    drop(sender);
    let collected = Collector {
        producers: handles.len(),
        consumers: 0,
        headline: Headline::Send,
        clock,
        planned: planned_length(common),
        progress: common.progress,
        on_producers_done: None,
    }
    .collect(&receiver);
    join(handles);
    let producer_json = print_producer_summary(&collected, clock, producer);
    let config = merged(common.config_json(), producer.config_json(&targets));
    finish(
        common,
        "producer",
        Headline::Send,
        config,
        &collected,
        [("producer", producer_json)],
    )?;
    if collected.producer_connections_lost == connection_count {
        bail!("every connection was lost");
    }
    if collected.send.succeeded == 0 {
        bail!("no message was stored (see the failures above)");
    }
    Ok(())
}

/// The route of each topic of the run: created (or resized) with `--queues`, else looked up,
/// else what `missing` makes of a topic without one.
fn topic_routes(
    common: &CommonOptions,
    missing: impl Fn(&str) -> anyhow::Result<TopicRouteData>,
) -> anyhow::Result<Vec<(String, TopicRouteData)>> {
    let timeout = common.request_timeout;
    let mut routes = Vec::new();
    for name in common.topic_names() {
        let route = match common.queues {
            Some(queues) => route::create_topic(&common.namesrv, &name, queues, timeout)?,
            None => match route::fetch_route(&common.namesrv, &name, timeout)? {
                Some(route) => route,
                None => missing(&name)?,
            },
        };
        routes.push((name, route));
    }
    Ok(routes)
}

/// `consumer` mode.
pub fn run_consumer(common: &CommonOptions, consumer: &ConsumerOptions) -> anyhow::Result<()> {
    common.validate()?;
    consumer.validate()?;
    let routes = topic_routes(common, |name| {
        bail!("topic {name} has no route: produce to it first, or give --queues")
    })?;
    let mut topics = Vec::with_capacity(routes.len());
    for (name, route) in routes {
        topics.push((name, route::subscribe_targets(&route)?));
    }
    let targets = topics[0].1.clone();
    let start_at = if consumer.catch_up {
        StartAt::First
    } else {
        consumer.start_at
    };
    let connections = connect_consumer(common, consumer, &topics, start_at)?;
    let clock = RunClock::start_now();
    let stop = StopWhen {
        deadline: match common.run_length {
            RunLength::Duration(duration) => Some(clock.start + duration),
            _ => None,
        },
        messages: match common.run_length {
            RunLength::Messages(count) => Some(count),
            _ => None,
        },
        drained: consumer.catch_up,
        follow: None,
    };
    let (sender, receiver) = mpsc::channel();
    let topic_names = topics.into_iter().map(|(name, _)| name).collect();
    let plan = PullPlan {
        connections,
        topics: topic_names,
        clock,
        stop,
    };
    let (handles, received) = start_consumers(common, consumer, plan, 0, &sender)?;
    drop(sender);
    let collected = Collector {
        producers: 0,
        consumers: handles.len(),
        headline: Headline::Pull,
        clock,
        planned: planned_length(common),
        progress: common.progress,
        on_producers_done: None,
    }
    .collect(&receiver);
    join(handles);
    print_group_spread(&received);
    let consumer_json = print_consumer_summary(&collected, clock);
    let config = merged(common.config_json(), consumer.config_json(&targets));
    finish(
        common,
        "consumer",
        Headline::Pull,
        config,
        &collected,
        [("consumer", consumer_json)],
    )?;
    if collected.consume.messages == 0 {
        bail!("no message was received");
    }
    Ok(())
}

/// `e2e` mode: producers and a consumer at once.
pub fn run_end_to_end(
    common: &CommonOptions,
    producer: &ProducerOptions,
    consumer: &ConsumerOptions,
) -> anyhow::Result<()> {
    common.validate()?;
    producer.validate(common.run_length)?;
    consumer.validate()?;
    ensure!(
        !consumer.catch_up && common.run_length != RunLength::UntilDrained,
        "e2e runs for a duration or a message count, without --catch-up"
    );
    let timeout = common.request_timeout;
    let routes = topic_routes(common, |name| {
        println!(
            "Topic {name} has no route; creating it with {E2E_DEFAULT_QUEUES} queues per broker"
        );
        route::create_topic(&common.namesrv, name, E2E_DEFAULT_QUEUES, timeout)
    })?;
    let mut publish_topics = Vec::with_capacity(routes.len());
    let mut subscribe_topics = Vec::with_capacity(routes.len());
    for (name, route) in &routes {
        publish_topics.push((name.clone(), route::publish_targets(route, None)?));
        subscribe_topics.push((name.clone(), route::subscribe_targets(route)?));
    }
    let publish = publish_topics[0].1.clone();
    let subscribe = subscribe_topics[0].1.clone();
    let pull_connections = connect_consumer(common, consumer, &subscribe_topics, StartAt::Last)?;
    let connections = connect_producers(common, producer, &publish_topics, true)?;
    let clock = RunClock::start_now();
    let producers_done = Arc::new(ProducersDone::default());
    let safety_deadline = match common.run_length {
        RunLength::Duration(duration) => {
            Some(clock.start + duration + consumer.drain + timeout + Duration::from_secs(1))
        }
        _ => None,
    };
    let stop = StopWhen {
        deadline: safety_deadline,
        messages: None,
        drained: false,
        follow: Some((producers_done.clone(), consumer.drain)),
    };
    let (sender, receiver) = mpsc::channel();
    let mut handles = start_producers(common, producer, connections, clock, &sender)?;
    let producer_count = handles.len();
    let plan = PullPlan {
        connections: pull_connections,
        topics: routes.into_iter().map(|(name, _)| name).collect(),
        clock,
        stop,
    };
    let (consumer_handles, received) =
        start_consumers(common, consumer, plan, producer_count, &sender)?;
    let consumer_count = consumer_handles.len();
    handles.extend(consumer_handles);
    drop(sender);
    let collected = Collector {
        producers: producer_count,
        consumers: consumer_count,
        headline: Headline::EndToEnd,
        clock,
        planned: planned_length(common),
        progress: common.progress,
        on_producers_done: Some(Box::new(|produced, finished_at| {
            let _ = producers_done.outcome.set((produced, finished_at));
        })),
    }
    .collect(&receiver);
    join(handles);
    print_group_spread(&received);
    let producer_json = print_producer_summary(&collected, clock, producer);
    let consumer_json = print_consumer_summary(&collected, clock);
    let expected = collected.send.succeeded * u64::from(consumer.groups.max(1));
    let missing = expected.saturating_sub(collected.consume.messages);
    println!(
        "End to end: {} sent, {} received ({} group(s)), {missing} not received within {} s of \
         the last send",
        collected.send.succeeded,
        collected.consume.messages,
        consumer.groups.max(1),
        consumer.drain.as_secs()
    );
    let config = merged(
        common.config_json(),
        json!({
            "producer": producer.config_json(&publish),
            "consumer": consumer.config_json(&subscribe),
        }),
    );
    finish(
        common,
        "e2e",
        Headline::EndToEnd,
        config,
        &collected,
        [("producer", producer_json), ("consumer", consumer_json)],
    )?;
    if collected.send.succeeded == 0 || collected.consume.end_to_end_us.is_empty() {
        bail!("no message made it end to end");
    }
    Ok(())
}

fn planned_length(common: &CommonOptions) -> Option<Duration> {
    match common.run_length {
        RunLength::Duration(duration) => Some(duration),
        _ => None,
    }
}

fn merged(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

fn join(handles: Vec<thread::JoinHandle<()>>) {
    for handle in handles {
        handle
            .join()
            .expect("worker threads do not panic (panic = abort)");
    }
}

fn print_producer_summary(
    collected: &Collected,
    clock: RunClock,
    producer: &ProducerOptions,
) -> Value {
    let finished = collected.producers_finished_at.unwrap_or_else(Instant::now);
    let summary = RunSummary {
        total: &collected.send,
        elapsed: finished.saturating_duration_since(clock.start),
        message_size_bytes: producer.message_size_bytes,
    };
    println!(
        "--- shardmq-bench producer summary ---\n{}",
        summary.to_text()
    );
    summary.to_json(Value::Null)
}

fn print_consumer_summary(collected: &Collected, clock: RunClock) -> Value {
    let finished = collected.consumers_finished_at.unwrap_or_else(Instant::now);
    let summary = ConsumeSummary {
        total: &collected.consume,
        elapsed: finished.saturating_duration_since(clock.start),
    };
    println!(
        "--- shardmq-bench consumer summary ---\n{}",
        summary.to_text()
    );
    summary.to_json(Value::Null)
}

/// Writes the JSON report and the plot, as asked.
fn finish<const N: usize>(
    common: &CommonOptions,
    mode: &str,
    headline: Headline,
    config: Value,
    collected: &Collected,
    sections: [(&str, Value); N],
) -> anyhow::Result<()> {
    let plot_path = common.plot.clone().or_else(|| {
        common
            .report
            .as_ref()
            .map(|report| report.with_extension("svg"))
    });
    if let Some(path) = &plot_path {
        let title = format!("shardmq-bench {mode}: {}", common.topic);
        let svg = plot::render_svg(&title, headline.name(), &collected.series);
        std::fs::write(path, svg)
            .with_context(|| format!("writing the plot to {}", path.display()))?;
        println!("Plot written to {}", path.display());
    }
    if let Some(path) = &common.report {
        let mut report = json!({
            "mode": mode,
            "config": config,
            "headline_latency": headline.name(),
            "intervals": intervals_json(&collected.series),
            "plot": plot_path.as_deref().map(Path::display).map(|p| p.to_string()),
        });
        for (name, mut section) in sections {
            if let Some(section) = section.as_object_mut() {
                section.remove("config");
            }
            report[name] = section;
        }
        let text = serde_json::to_string_pretty(&report).expect("a JSON value serialises");
        std::fs::write(path, text + "\n")
            .with_context(|| format!("writing the report to {}", path.display()))?;
        println!("Report written to {}", path.display());
    }
    Ok(())
}

fn intervals_json(series: &[IntervalPoint]) -> Value {
    series
        .iter()
        .map(|point| {
            json!({
                "t_secs": point.t_secs,
                "send_tps": round3(point.send_tps),
                "consume_tps": round3(point.consume_tps),
                "latency_us": point.latency.to_json(),
            })
        })
        .collect()
}

/// One blocking connect per connection, before the clock starts; sockets are handed over
/// non-blocking. Requests in `--messages` mode are split evenly, remainder first; an
/// open-loop rate is split evenly too, each connection's schedule offset by its share.
/// Each broker's connections cycle through the frames of every topic's queues on it.
fn connect_producers(
    common: &CommonOptions,
    producer: &ProducerOptions,
    topics: &[(String, Vec<PublishTarget>)],
    stamp_sent_time: bool,
) -> anyhow::Result<Vec<ConnectionPlan>> {
    let targets = &topics[0].1;
    let connection_count = targets.len() * producer.connections_per_broker;
    ensure!(
        connection_count <= CONNECTIONS_MAX,
        "{connection_count} connections exceed the limit of {CONNECTIONS_MAX}"
    );
    let body = message_body(producer.message_size_bytes);
    let fields_of = |topic| SendFields {
        producer_group: &producer.producer_group,
        topic,
        tag: &producer.tag,
        keys: producer.keys,
        stamp_sent_time,
        batch: producer.batch,
        credentials: crate::route::credentials(),
    };
    let total_requests = match common.run_length {
        RunLength::Messages(count) => Some(count / producer.batch as u64),
        _ => None,
    };
    let interval = producer.rate.map(|rate| {
        let requests_per_sec = rate / producer.batch as f64 / connection_count as f64;
        Duration::from_secs_f64(1.0 / requests_per_sec)
    });
    let mut plans = Vec::with_capacity(connection_count);
    for target in targets {
        let mut templates = Vec::new();
        for (topic, topic_targets) in topics {
            let on_this = topic_targets
                .iter()
                .find(|t| t.broker_addr == target.broker_addr)
                .map_or(0, |t| t.write_queue_nums);
            let fields = fields_of(topic.as_str());
            for queue_id in 0..on_this {
                templates.push(SendTemplate::new(&fields, queue_id, &body)?);
            }
        }
        ensure!(
            !templates.is_empty(),
            "broker {} has no write queue",
            target.broker_name
        );
        println!(
            "Broker {} at {}: {} write queue(s){}, {}-byte frames of {} message(s)",
            target.broker_name,
            target.broker_addr,
            templates.len(),
            if topics.len() > 1 {
                format!(" over {} topics", topics.len())
            } else {
                String::new()
            },
            templates.first().map_or(0, SendTemplate::frame_size_bytes),
            producer.batch
        );
        let templates = Arc::new(templates);
        for _ in 0..producer.connections_per_broker {
            let context = || format!("broker {} ({})", target.broker_name, target.broker_addr);
            let stream = route::connect(&target.broker_addr, common.request_timeout)
                .with_context(context)?;
            stream.set_nodelay(true).with_context(context)?;
            stream.set_nonblocking(true).with_context(context)?;
            let index = plans.len();
            plans.push(ConnectionPlan {
                index,
                broker_addr: target.broker_addr.clone(),
                tls: route::tls_session(&target.broker_addr).with_context(context)?,
                stream,
                templates: Arc::clone(&templates),
                quota_requests: total_requests.map(|total| share(total, index, connection_count)),
                pacing: interval.map(|interval| Pacing {
                    // Set when the clock starts (`start_producers`).
                    next_due: Instant::now(),
                    interval,
                }),
            });
        }
    }
    Ok(plans)
}

/// Share `index` of `total` split over `count`, remainder first.
fn share(total: u64, index: usize, count: usize) -> u64 {
    let (count, index) = (count as u64, index as u64);
    total / count + u64::from(index < total % count)
}

fn start_producers(
    common: &CommonOptions,
    producer: &ProducerOptions,
    connections: Vec<ConnectionPlan>,
    clock: RunClock,
    reports: &mpsc::Sender<crate::collect::Report>,
) -> anyhow::Result<Vec<thread::JoinHandle<()>>> {
    let connection_count = connections.len();
    let worker_count = producer.threads.min(connection_count);
    println!(
        "Producing to {}: {connection_count} connection(s), {worker_count} thread(s), {} in \
         flight per connection, {}-byte bodies, {} message(s) per request, {}",
        common.topic,
        producer.in_flight,
        producer.message_size_bytes,
        producer.batch,
        match producer.rate {
            Some(rate) => format!("open loop at {rate:.0} msg/s"),
            None => "closed loop".to_string(),
        }
    );
    let deadline = match common.run_length {
        RunLength::Duration(duration) => Some(clock.start + duration),
        _ => None,
    };
    let mut per_worker: Vec<Vec<ConnectionPlan>> = (0..worker_count).map(|_| Vec::new()).collect();
    for (index, mut connection) in connections.into_iter().enumerate() {
        // The schedule starts with the clock, each connection offset by its share.
        if let Some(pacing) = &mut connection.pacing {
            let offset = pacing
                .interval
                .mul_f64(index as f64 / connection_count as f64);
            pacing.next_due = clock.start + offset;
        }
        per_worker[index % worker_count].push(connection);
    }
    let mut handles = Vec::with_capacity(worker_count);
    for (worker, connections) in per_worker.into_iter().enumerate() {
        let plan = WorkerPlan {
            worker,
            connections,
            in_flight_max: producer.in_flight,
            run_prefix: run_prefix(),
            clock,
            deadline,
            request_timeout: common.request_timeout,
            reports: reports.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("bench-producer-{worker}"))
            .spawn(move || worker::run_worker(plan))
            .context("starting a producer thread")?;
        handles.push(handle);
    }
    Ok(handles)
}

/// Connects to every broker of the topics once per group and finds each queue's start
/// offset.
fn connect_consumer(
    common: &CommonOptions,
    consumer: &ConsumerOptions,
    topics: &[(String, Vec<SubscribeTarget>)],
    start_at: StartAt,
) -> anyhow::Result<Vec<PullConnectionPlan>> {
    // Broker address → (broker name, queues to pull there, for one group).
    let mut brokers: std::collections::BTreeMap<String, (String, Vec<PullQueue>)> =
        Default::default();
    for (topic_index, (topic, targets)) in topics.iter().enumerate() {
        for target in targets {
            let offsets = match start_at {
                StartAt::First => vec![0; target.read_queue_nums as usize],
                StartAt::Last => route::max_offsets(
                    &target.broker_addr,
                    topic,
                    target.read_queue_nums,
                    common.request_timeout,
                )?,
            };
            let (_, queues) = brokers
                .entry(target.broker_addr.clone())
                .or_insert_with(|| (target.broker_name.clone(), Vec::new()));
            for (queue_id, offset) in (0..target.read_queue_nums).zip(offsets) {
                queues.push(PullQueue {
                    topic: topic_index,
                    group: 0,
                    queue_id,
                    offset,
                });
            }
        }
    }
    let groups = consumer.groups.max(1) as usize;
    let mut plans = Vec::with_capacity(brokers.len() * groups);
    for (broker_addr, (broker_name, queues)) in &brokers {
        println!(
            "Pulling from broker {broker_name} at {broker_addr}: {} read queue(s) over {} \
             topic(s), {groups} group(s), starting at the {} offset",
            queues.len(),
            topics.len(),
            match start_at {
                StartAt::First => "first",
                StartAt::Last => "last",
            }
        );
        for group in 0..groups {
            let context = || format!("broker {broker_name} ({broker_addr})");
            let stream =
                route::connect(broker_addr, common.request_timeout).with_context(context)?;
            stream.set_nodelay(true).with_context(context)?;
            stream.set_nonblocking(true).with_context(context)?;
            let queues = queues.iter().map(|q| PullQueue { group, ..*q }).collect();
            plans.push(PullConnectionPlan {
                broker_addr: broker_addr.clone(),
                tls: route::tls_session(broker_addr).with_context(context)?,
                stream,
                queues,
            });
        }
    }
    Ok(plans)
}

/// What one consumer thread pulls, and until when.
struct PullPlan {
    connections: Vec<PullConnectionPlan>,
    topics: Vec<String>,
    clock: RunClock,
    stop: StopWhen,
}

/// Starts the consumer threads (`--consumer-threads`, at most one a connection), the
/// connections dealt out in turn; their report sources are `first_source` and on.
fn start_consumers(
    common: &CommonOptions,
    consumer: &ConsumerOptions,
    pull: PullPlan,
    first_source: usize,
    reports: &mpsc::Sender<crate::collect::Report>,
) -> anyhow::Result<(Vec<thread::JoinHandle<()>>, Arc<consumer::Received>)> {
    let groups = consumer.group_names();
    let received = consumer::Received::new(groups.len());
    let threads = consumer.threads.clamp(1, pull.connections.len().max(1));
    let mut shares: Vec<Vec<PullConnectionPlan>> = (0..threads).map(|_| Vec::new()).collect();
    for (index, connection) in pull.connections.into_iter().enumerate() {
        shares[index % threads].push(connection);
    }
    let mut handles = Vec::with_capacity(threads);
    for (index, connections) in shares.into_iter().enumerate() {
        let plan = ConsumerPlan {
            source: first_source + index,
            connections,
            topics: pull.topics.clone(),
            groups: groups.clone(),
            subscription: consumer.subscription.clone(),
            pull_batch: consumer.pull_batch,
            suspend_ms: if consumer.catch_up {
                0
            } else {
                consumer.suspend_ms
            },
            clock: pull.clock,
            stop: pull.stop.clone(),
            request_timeout: common.request_timeout,
            reports: reports.clone(),
            received: received.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("bench-consumer-{index}"))
            .spawn(move || consumer::run_consumer(plan))
            .context("starting a consumer thread")?;
        handles.push(handle);
    }
    Ok((handles, received))
}

/// The least and most messages any group received, when the run had several groups.
fn print_group_spread(received: &consumer::Received) {
    if let Some((min, max)) = received.group_spread() {
        println!(
            "Consumer groups: {}, messages received per group: min {min} max {max}",
            received.per_group.len()
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_evenly_remainder_first() {
        let shares: Vec<_> = (0..4).map(|index| share(10, index, 4)).collect();
        assert_eq!(shares, [3, 3, 2, 2]);
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

    #[test]
    fn options_out_of_bounds_are_refused() {
        let producer = ProducerOptions {
            producer_group: "g".into(),
            tag: "t".into(),
            keys: false,
            message_size_bytes: 1024,
            batch: 1,
            in_flight: 64,
            connections_per_broker: 1,
            threads: 1,
            rate: None,
        };
        let run_length = RunLength::Messages(64);
        assert!(producer.validate(run_length).is_ok());
        for bad in [
            ProducerOptions {
                batch: 0,
                ..producer.clone()
            },
            ProducerOptions {
                rate: Some(0.0),
                ..producer.clone()
            },
            ProducerOptions {
                rate: Some(f64::NAN),
                ..producer.clone()
            },
            ProducerOptions {
                in_flight: 0,
                ..producer.clone()
            },
        ] {
            assert!(bad.validate(run_length).is_err(), "{bad:?}");
        }
        let batch_of_three = ProducerOptions {
            batch: 3,
            ..producer
        };
        assert!(
            batch_of_three.validate(run_length).is_err(),
            "64 is no multiple of 3"
        );
    }
}
