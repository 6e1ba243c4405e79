//! A shard's snapshot for the metrics endpoint, taken on the shard's own thread once a second.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::server::ConnectionGate;

use super::{MetricsBoard, ShardSnapshot, SERIES_MAX};

/// How often a shard publishes its figures (the freshest a scrape can see).
pub const PUBLISH_INTERVAL_MS: u64 = 1_000;

/// CPU time of the calling thread, in microseconds.
fn thread_cpu_micros() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; CLOCK_THREAD_CPUTIME_ID exists
    // on every Linux this runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// Publishes `broker`'s snapshot to slot `shard` of `board` every second, for the shard's
/// life; `gate` gives the shard's connection figures.
pub async fn publish_every_second(
    broker: Rc<Broker>,
    board: Arc<MetricsBoard>,
    shard: usize,
    gate: Rc<ConnectionGate>,
) {
    let mut last = (std::time::Instant::now(), thread_cpu_micros());
    loop {
        shards::runtime::sleep(Duration::from_millis(PUBLISH_INTERVAL_MS)).await;
        let now = (std::time::Instant::now(), thread_cpu_micros());
        let wall = now.0.duration_since(last.0).as_micros().max(1) as f64;
        let busy_ratio = (now.1.saturating_sub(last.1) as f64 / wall).min(1.0);
        last = now;
        let mut snapshot = broker.metrics_snapshot();
        snapshot.busy_ratio = busy_ratio;
        snapshot.connections = gate.open() as u64;
        snapshot.connections_refused = gate.refused();
        snapshot.rpc_latency = super::rpc_latency::snapshot();
        board.publish(shard, snapshot);
    }
}

impl Broker {
    /// This shard's figures now (`busy_ratio` and the connection figures are the
    /// publisher's).
    pub fn metrics_snapshot(&self) -> ShardSnapshot {
        let store = self.store.stats();
        let clients = self.clients.borrow();
        let producer_connections = clients.producers.values().map(|c| c.len() as u64).sum();
        let consumer_connections = clients
            .consumers
            .values()
            .map(|group| group.clients.len() as u64)
            .sum();
        drop(clients);
        ShardSnapshot {
            cluster: self.identity.cluster_name.clone(),
            node_id: self.identity.broker_name.clone(),
            flows: self.stats.flows.borrow().clone(),
            topic_number: self.topics.borrow().topics.len() as u64,
            consumer_group_number: self.groups.borrow().groups.len() as u64,
            producer_connections,
            consumer_connections,
            consumer_lag: self.consumer_lag(),
            half_messages: self.transactions.borrow().pending_len() as u64,
            committed_transactions: self.transactions.borrow().stats.committed,
            rolled_back_transactions: self.transactions.borrow().stats.rolled_back,
            storage_size_bytes: self
                .store
                .max_physical_offset()
                .0
                .saturating_sub(self.store.min_physical_offset().0),
            flush_behind_bytes: store.write_offset.saturating_sub(store.durable_offset),
            group_commits: store.flushes,
            group_committed_messages: store.flushed_messages,
            durable_write_micros: store.flush_micros,
            parked_pulls: self.pull_waiters.len() as u64,
            refused_sends_busy: self.load.refused_sends.get(),
            ..ShardSnapshot::default()
        }
    }

    /// (topic, group, messages behind) for every group that committed offsets here: the
    /// queues' max offsets less the committed ones (at most SERIES_MAX entries).
    fn consumer_lag(&self) -> Vec<(String, String, u64)> {
        let offsets = self.offsets.borrow();
        let mut lag = Vec::new();
        for (key, queues) in offsets.entries().iter().take(SERIES_MAX) {
            let Some((topic, group)) = key.split_once('@') else {
                continue;
            };
            let behind: u64 = queues
                .iter()
                .map(|(queue_id, committed)| {
                    let max = self
                        .store
                        .max_queue_offset(topic, shards::QueueId(*queue_id))
                        .0;
                    max.saturating_sub((*committed).max(0) as u64)
                })
                .sum();
            lag.push((topic.to_string(), group.to_string(), behind));
        }
        lag
    }
}
