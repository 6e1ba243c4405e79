//! The consumer load: a thread pulls the queues of its connections (one per broker and group;
//! `--consumer-threads` spreads them over several threads), each thread with one ppoll(2) loop
//! over non-blocking sockets.
//!
//! Each queue has at most one PULL_MESSAGE (11, REMOTING.md §3.3) outstanding, as RocketMQ's
//! consumers do (the next offset comes from the answer), and the pulls of all queues of a
//! broker are pipelined on its connection. Pulls carry the subscription themselves
//! (sysFlag SUBSCRIPTION, like the C++ client) so no heartbeat is needed, and never commit
//! offsets. With `suspend_ms` > 0 an empty queue's pull is long-polled by the broker; with 0
//! (catch-up) a PULL_NOT_FOUND marks the queue drained.
//!
//! | Answer | Then |
//! |---|---|
//! | SUCCESS | count the records (§5.1), pull again from `nextBeginOffset` |
//! | PULL_NOT_FOUND | catch-up: the queue is drained; otherwise pull again (the broker held it) |
//! | PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED | pull again from `nextBeginOffset` |
//! | anything else | count a failure, pull again after `PULL_FAILURE_BACKOFF` |
//!
//! Invariants: a queue is `pending` exactly while its pull is in `in_flight`; buffers are
//! bounded as in the producer worker.

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use shardmq_protocol::remoting::{
    decode_frame, request_code, response_code, FrameEncoder, RemotingCommand,
};

use crate::clock::RunClock;
use crate::collect::{Figures, Report};
use crate::consume_stats::ConsumeTally;
use crate::send_frame::{SENT_MICROS_MIN, SENT_MICROS_PROPERTY};
use crate::stats::SendFailure;
use crate::worker::{poll_with_timeout, Wire, READS_PER_WAKEUP_MAX, TICK};
use shardmq_protocol::record;

/// Pause before pulling a queue again after a failed pull.
const PULL_FAILURE_BACKOFF: Duration = Duration::from_millis(100);
/// Bytes asked for per read(2): a pull answer carries up to 256 KiB of messages.
const READ_CHUNK_BYTES: usize = 1024 * 1024;
/// Reads per connection per wake-up, so one busy connection cannot starve the others.
/// PullSysFlag bits (§3.3).
const PULL_FLAG_SUSPEND: i32 = 0x2;
const PULL_FLAG_SUBSCRIPTION: i32 = 0x4;
/// Expired pulls are looked for this often.
const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// One broker to pull from, already connected, with each queue's start offset.
#[derive(Debug)]
pub struct PullConnectionPlan {
    pub broker_addr: String,
    pub stream: TcpStream,
    /// The TLS session over `stream` (`--tls`).
    pub tls: Option<rustls::ClientConnection>,
    pub queues: Vec<PullQueue>,
}

/// One queue a connection pulls, for one group.
#[derive(Debug, Clone, Copy)]
pub struct PullQueue {
    /// Index into [`ConsumerPlan::topics`].
    pub topic: usize,
    /// Index into [`ConsumerPlan::groups`].
    pub group: usize,
    pub queue_id: u32,
    /// First offset to pull.
    pub offset: u64,
}

/// The producers' outcome, set once they have all stopped (end-to-end mode).
#[derive(Debug, Default)]
pub struct ProducersDone {
    /// Messages the producers had stored, and when they stopped.
    pub outcome: OnceLock<(u64, Instant)>,
}

/// When the consumer stops; the first rule met wins.
#[derive(Debug, Clone)]
pub struct StopWhen {
    pub deadline: Option<Instant>,
    /// Once this many messages arrived.
    pub messages: Option<u64>,
    /// Once every queue answered PULL_NOT_FOUND (catch-up).
    pub drained: bool,
    /// Once every message the producers stored arrived, or this long after they stopped.
    pub follow: Option<(Arc<ProducersDone>, Duration)>,
}

/// What the consumer threads count together: the stop rules (`--messages`, e2e's "every
/// message arrived") and the per-group figures are over all of them.
#[derive(Debug)]
pub struct Received {
    /// Messages received, all threads.
    pub total: AtomicU64,
    /// Messages received per group, all threads.
    pub per_group: Vec<AtomicU64>,
}

impl Received {
    pub fn new(groups: usize) -> Arc<Received> {
        Arc::new(Received {
            total: AtomicU64::new(0),
            per_group: (0..groups).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Least and most any group received, when there are several groups.
    pub fn group_spread(&self) -> Option<(u64, u64)> {
        if self.per_group.len() < 2 {
            return None;
        }
        let counts = self.per_group.iter().map(|c| c.load(Ordering::Relaxed));
        Some((counts.clone().min()?, counts.max()?))
    }
}

/// What one consumer thread runs.
#[derive(Debug)]
pub struct ConsumerPlan {
    pub source: usize,
    pub connections: Vec<PullConnectionPlan>,
    pub topics: Vec<String>,
    /// Consumer groups; each reads every message of every topic.
    pub groups: Vec<String>,
    /// TAG expression ("*" for everything).
    pub subscription: String,
    /// maxMsgNums of every pull.
    pub pull_batch: u32,
    /// suspendTimeoutMillis; 0 disables long polling (catch-up).
    pub suspend_ms: u64,
    pub clock: RunClock,
    pub stop: StopWhen,
    /// A pull unanswered after suspend_ms plus this counts as failed.
    pub request_timeout: Duration,
    pub reports: Sender<Report>,
    /// Shared with the other consumer threads of the run.
    pub received: Arc<Received>,
}

struct QueueState {
    topic: usize,
    group: usize,
    queue_id: u32,
    offset: u64,
    pending: bool,
    drained: bool,
    retry_at: Option<Instant>,
}

/// Everything a pull answer is handled with.
struct PullContext<'a> {
    clock: &'a RunClock,
    catch_up: bool,
    tally: &'a mut ConsumeTally,
    /// Messages received per group, over the whole run (all threads).
    per_group: &'a [AtomicU64],
}

struct PullConnection {
    broker_addr: String,
    wire: Wire,
    queues: Vec<QueueState>,
    next_opaque: i32,
    /// Opaque → (queue index, when the pull was queued).
    in_flight: HashMap<i32, (usize, Instant)>,
    out: Vec<u8>,
    out_written: usize,
    input: Vec<u8>,
    input_filled: usize,
    open: bool,
}

impl PullConnection {
    fn new(plan: PullConnectionPlan) -> Self {
        let queues = plan
            .queues
            .into_iter()
            .map(|queue| QueueState {
                topic: queue.topic,
                group: queue.group,
                queue_id: queue.queue_id,
                offset: queue.offset,
                pending: false,
                drained: false,
                retry_at: None,
            })
            .collect();
        PullConnection {
            broker_addr: plan.broker_addr,
            wire: Wire {
                stream: plan.stream,
                tls: plan.tls,
            },
            queues,
            next_opaque: 1,
            in_flight: HashMap::new(),
            out: Vec::new(),
            out_written: 0,
            input: vec![0; READ_CHUNK_BYTES],
            input_filled: 0,
            open: true,
        }
    }

    /// Queues a pull for every idle queue whose back-off is over.
    fn fill(&mut self, now: Instant, plan: &ConsumerPlan) {
        let mut sys_flag = PULL_FLAG_SUBSCRIPTION;
        if plan.suspend_ms > 0 {
            sys_flag |= PULL_FLAG_SUSPEND;
        }
        for (index, queue) in self.queues.iter_mut().enumerate() {
            let waiting = queue.retry_at.is_some_and(|at| at > now);
            if queue.pending || queue.drained || waiting {
                continue;
            }
            let opaque = self.next_opaque;
            self.next_opaque = self.next_opaque.wrapping_add(1).max(1);
            let mut fields: Vec<(String, String)> = [
                ("consumerGroup", plan.groups[queue.group].clone()),
                ("topic", plan.topics[queue.topic].clone()),
                ("queueId", queue.queue_id.to_string()),
                ("queueOffset", queue.offset.to_string()),
                ("maxMsgNums", plan.pull_batch.to_string()),
                ("sysFlag", sys_flag.to_string()),
                ("commitOffset", "0".to_string()),
                ("suspendTimeoutMillis", plan.suspend_ms.to_string()),
                ("subscription", plan.subscription.clone()),
                ("subVersion", "0".to_string()),
                ("expressionType", "TAG".to_string()),
            ]
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect();
            if let Some(credentials) = crate::route::credentials() {
                credentials.sign_request(&mut fields, &[]);
            }
            let mut encoder =
                FrameEncoder::request(&mut self.out, request_code::PULL_MESSAGE, opaque, false);
            for (key, value) in &fields {
                encoder.ext(key, value);
            }
            encoder.finish(&[]);
            queue.pending = true;
            queue.retry_at = None;
            let previous = self.in_flight.insert(opaque, (index, now));
            assert!(
                previous.is_none(),
                "pull opaque {opaque} reused while in flight"
            );
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.wire.write(&self.out, &mut self.out_written)?;
        if self.out_written == self.out.len() {
            self.out.clear();
            self.out_written = 0;
        }
        Ok(())
    }

    /// Reads what came, and pulls again for the queues answered after each read, as a
    /// client's pull callback does at each answer (before, after up to `READS_PER_WAKEUP_MAX`
    /// reads: the answers to the 8 queues of a catch-up came and went back together).
    fn receive(&mut self, plan: &ConsumerPlan, context: &mut PullContext<'_>) -> io::Result<()> {
        for _ in 0..READS_PER_WAKEUP_MAX {
            if !self
                .wire
                .read_some(&mut self.input, &mut self.input_filled)?
            {
                break;
            }
            let now = Instant::now();
            if self.complete(now, context)? > 0 {
                self.fill(now, plan);
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Handles the whole frames read; the answers among them.
    fn complete(&mut self, now: Instant, context: &mut PullContext<'_>) -> io::Result<usize> {
        let mut answers = 0;
        let mut consumed_total = 0;
        loop {
            let unread = &self.input[consumed_total..self.input_filled];
            match decode_frame(unread) {
                Ok(Some((command, consumed))) => {
                    if command.is_response() {
                        if let Some((index, sent_at)) = self.in_flight.remove(&command.opaque) {
                            let queue = &mut self.queues[index];
                            queue.pending = false;
                            handle_answer(queue, &command, sent_at, now, context);
                            answers += 1;
                        }
                    }
                    consumed_total += consumed;
                }
                Ok(None) => break,
                Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
            }
        }
        self.input.copy_within(consumed_total..self.input_filled, 0);
        self.input_filled -= consumed_total;
        if self.input.len() > READ_CHUNK_BYTES && self.input_filled <= READ_CHUNK_BYTES {
            self.input.truncate(READ_CHUNK_BYTES);
        }
        Ok(answers)
    }

    /// Gives up on pulls older than `timeout`; their queues are pulled again.
    fn expire(&mut self, now: Instant, timeout: Duration, tally: &mut ConsumeTally) {
        let queues = &mut self.queues;
        let before = self.in_flight.len();
        self.in_flight.retain(|_, (index, sent_at)| {
            let alive = now.saturating_duration_since(*sent_at) < timeout;
            if !alive {
                queues[*index].pending = false;
            }
            alive
        });
        tally.record_send_failures(SendFailure::Timeout, (before - self.in_flight.len()) as u64);
    }

    fn close(&mut self, error: &io::Error, tally: &mut ConsumeTally) {
        eprintln!(
            "consumer connection to {} lost: {error}; {} pulls outstanding",
            self.broker_addr,
            self.in_flight.len()
        );
        tally.record_send_failures(SendFailure::ConnectionLost, self.in_flight.len() as u64);
        self.in_flight.clear();
        self.open = false;
        let _ = self.wire.stream.shutdown(std::net::Shutdown::Both);
    }

    fn all_drained(&self) -> bool {
        !self.open || self.queues.iter().all(|queue| queue.drained)
    }

    fn next_retry(&self) -> Option<Instant> {
        self.queues.iter().filter_map(|queue| queue.retry_at).min()
    }
}

fn ext_offset(command: &RemotingCommand<'_>, key: &str) -> Option<u64> {
    command
        .ext_fields
        .get(key)?
        .parse::<i64>()
        .ok()
        .map(|v| v.max(0) as u64)
}

fn handle_answer(
    queue: &mut QueueState,
    command: &RemotingCommand<'_>,
    sent_at: Instant,
    now: Instant,
    context: &mut PullContext<'_>,
) {
    let next_offset = ext_offset(command, "nextBeginOffset");
    match command.code {
        response_code::SUCCESS => {
            context.tally.pulls += 1;
            context
                .tally
                .record_pull_latency(now.saturating_duration_since(sent_at));
            let count = count_records(command.body, now, context);
            context.per_group[queue.group].fetch_add(count, Ordering::Relaxed);
            if let Some(next) = next_offset {
                queue.offset = next;
            }
        }
        response_code::PULL_NOT_FOUND
        | response_code::PULL_RETRY_IMMEDIATELY
        | response_code::PULL_OFFSET_MOVED => {
            context.tally.empty_pulls += 1;
            if let Some(next) = next_offset {
                queue.offset = next;
            }
            if command.code == response_code::PULL_NOT_FOUND && context.catch_up {
                queue.drained = true;
            }
        }
        code => {
            context
                .tally
                .record_pull_failure(code, command.remark.as_deref());
            queue.retry_at = Some(now + PULL_FAILURE_BACKOFF);
        }
    }
}

/// Counts the records of a pull answer; returns how many.
fn count_records(body: &[u8], now: Instant, context: &mut PullContext<'_>) -> u64 {
    let now_ms = (context.clock.unix_micros(now) / 1000) as i64;
    let tally = &mut *context.tally;
    let before = tally.messages;
    for message in record::iter(body) {
        let Ok(message) = message else {
            tally.malformed_bodies += 1;
            break;
        };
        tally.messages += 1;
        tally.body_bytes += message.body.len() as u64;
        tally
            .born_to_consume
            .record(now_ms - message.born_timestamp_ms);
        tally
            .store_to_consume
            .record(now_ms - message.store_timestamp_ms);
        let sent = record::property(message.properties, SENT_MICROS_PROPERTY)
            .and_then(|value| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
            .filter(|&micros| micros >= SENT_MICROS_MIN);
        if let Some(sent_micros) = sent {
            tally.record_end_to_end(context.clock.since_unix_micros(sent_micros, now));
        }
    }
    tally.messages - before
}

fn should_stop(plan: &ConsumerPlan, now: Instant, drained: bool) -> bool {
    let stop = &plan.stop;
    let consumed = plan.received.total.load(Ordering::Relaxed);
    if stop.deadline.is_some_and(|deadline| now >= deadline) {
        return true;
    }
    if stop.messages.is_some_and(|count| consumed >= count) {
        return true;
    }
    if stop.drained && drained {
        return true;
    }
    if let Some((producers, drain)) = &stop.follow {
        if let Some(&(produced, finished_at)) = producers.outcome.get() {
            let expected = produced * plan.groups.len() as u64;
            return consumed >= expected || now >= finished_at + *drain;
        }
    }
    false
}

/// Runs the consumer to completion; reports go to `plan.reports`.
pub fn run_consumer(mut plan: ConsumerPlan) {
    let mut connections: Vec<PullConnection> = plan
        .connections
        .drain(..)
        .map(PullConnection::new)
        .collect();
    let mut tally = ConsumeTally::new();
    let received = plan.received.clone();
    let mut tick = 0;
    let start = plan.clock.start;
    let mut next_tick_at = start + TICK;
    let mut next_expiry_at = start + EXPIRY_CHECK_INTERVAL;
    let pull_timeout = Duration::from_millis(plan.suspend_ms) + plan.request_timeout;
    let mut poll_fds: Vec<libc::pollfd> = Vec::with_capacity(connections.len());
    loop {
        let now = Instant::now();
        let drained = connections.iter().all(PullConnection::all_drained);
        if should_stop(&plan, now, drained) || connections.iter().all(|c| !c.open) {
            break;
        }
        for connection in connections.iter_mut().filter(|c| c.open) {
            connection.fill(now, &plan);
            if let Err(error) = connection.flush() {
                connection.close(&error, &mut tally);
            }
        }
        if now >= next_expiry_at {
            for connection in connections.iter_mut().filter(|c| c.open) {
                connection.expire(now, pull_timeout, &mut tally);
            }
            next_expiry_at = now + EXPIRY_CHECK_INTERVAL;
        }
        while now >= next_tick_at {
            let interval = std::mem::replace(&mut tally, ConsumeTally::new());
            let _ = plan.reports.send(Report::Interval {
                source: plan.source,
                tick,
                figures: Figures::Consume(interval),
            });
            tick += 1;
            next_tick_at += TICK;
        }
        let mut wake_at = next_tick_at.min(next_expiry_at);
        for retry in connections.iter().filter_map(PullConnection::next_retry) {
            wake_at = wake_at.min(retry);
        }
        if let Some(deadline) = plan.stop.deadline {
            wake_at = wake_at.min(deadline);
        }
        poll_fds.clear();
        for connection in connections.iter().filter(|c| c.open) {
            let mut events = libc::POLLIN;
            if connection.out_written < connection.out.len() || connection.wire.tls_output_waits() {
                events |= libc::POLLOUT;
            }
            poll_fds.push(libc::pollfd {
                fd: connection.wire.stream.as_raw_fd(),
                events,
                revents: 0,
            });
        }
        poll_with_timeout(&mut poll_fds, wake_at.saturating_duration_since(now));
        let before = tally.messages;
        let mut context = PullContext {
            clock: &plan.clock,
            catch_up: plan.suspend_ms == 0,
            tally: &mut tally,
            per_group: &received.per_group,
        };
        let open = connections.iter_mut().filter(|c| c.open);
        for (poll_fd, connection) in poll_fds.iter().zip(open) {
            if poll_fd.revents == 0 {
                continue;
            }
            if let Err(error) = connection.receive(&plan, &mut context) {
                connection.close(&error, context.tally);
            }
        }
        received
            .total
            .fetch_add(tally.messages - before, Ordering::Relaxed);
    }
    let connections_lost = connections.iter().filter(|c| !c.open).count();
    let _ = plan.reports.send(Report::Done {
        source: plan.source,
        figures: Figures::Consume(tally),
        finished_at: Instant::now(),
        connections_lost,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_with(stop: StopWhen) -> ConsumerPlan {
        ConsumerPlan {
            source: 0,
            connections: Vec::new(),
            topics: vec!["T".into()],
            groups: vec!["G".into()],
            subscription: "*".into(),
            pull_batch: 32,
            suspend_ms: 0,
            clock: RunClock::start_now(),
            stop,
            request_timeout: Duration::from_secs(1),
            reports: std::sync::mpsc::channel().0,
            received: Received::new(1),
        }
    }

    /// `should_stop` once the run's threads have received `consumed` messages in all.
    fn stops(plan: &ConsumerPlan, now: Instant, consumed: u64, drained: bool) -> bool {
        plan.received.total.store(consumed, Ordering::Relaxed);
        should_stop(plan, now, drained)
    }

    #[test]
    fn stop_rules() {
        let now = Instant::now();
        let none = StopWhen {
            deadline: None,
            messages: None,
            drained: false,
            follow: None,
        };
        assert!(!stops(&plan_with(none.clone()), now, 10, true));
        let count = StopWhen {
            messages: Some(10),
            ..none.clone()
        };
        assert!(stops(&plan_with(count.clone()), now, 10, false));
        assert!(!stops(&plan_with(count), now, 9, false));
        let drained = StopWhen {
            drained: true,
            ..none.clone()
        };
        assert!(stops(&plan_with(drained), now, 0, true));
        let producers = Arc::new(ProducersDone::default());
        let follow = StopWhen {
            follow: Some((producers.clone(), Duration::from_secs(5))),
            ..none
        };
        let plan = plan_with(follow);
        assert!(!stops(&plan, now, 100, false), "producers still running");
        producers.outcome.set((100, now)).unwrap();
        assert!(stops(&plan, now, 100, false));
        assert!(!stops(&plan, now, 99, false));
        assert!(stops(&plan, now + Duration::from_secs(5), 99, false));
    }
}
