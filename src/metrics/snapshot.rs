//! A shard's snapshot for the metrics endpoint, taken on the shard's own thread once a second.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::server::ConnectionGate;

use super::{MetricsBoard, ShardSnapshot, SERIES_MAX};
use crate::broker::handlers::stats::store_time_at;
use crate::broker::schedule::SCHEDULE_TOPIC;

/// Lagging queues whose oldest unconsumed message is looked up per snapshot (one store read
/// each): bounds the work of rocketmq_consumer_lag_latency to a few ms a second.
pub const LAG_LATENCY_QUEUES_MAX: usize = 1024;

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
        snapshot.consumer_lag_latency_ms = broker.consumer_lag_latency().await;
        snapshot.busy_ratio = busy_ratio;
        snapshot.connections = gate.open() as u64;
        snapshot.connections_refused = gate.refused();
        snapshot.rpc_latency = super::rpc_latency::snapshot();
        let (reads, writes) = shards::runtime::executor_file_ops();
        snapshot.io_uring.push(("executor", reads + writes, None));
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
        let (consumer_lag, consumer_inflight, consumer_ready) = self.consumer_positions();
        let (output_waiting_bytes, connection_buffers) = crate::server::connection_buffers();
        let refused_sends = self.stats.refused_sends.get();
        ShardSnapshot {
            cluster: self.identity.cluster_name.clone(),
            node_id: self.identity.broker_name.clone(),
            flows: self.stats.flows.borrow().clone(),
            topic_number: self.topics.borrow().topics.len() as u64,
            consumer_group_number: self.groups.borrow().groups.len() as u64,
            producer_connections,
            consumer_connections,
            consumer_lag,
            consumer_inflight,
            consumer_ready,
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
            segments_deleted: store.segments_deleted,
            segments_recycled: store.segments_recycled,
            read_cache: super::ReadCacheCounts {
                hits: store.read_cache_hits,
                misses: store.read_cache_misses,
                refetches: store.read_cache_refetches,
                bypasses: store.read_cache_bypasses,
                span_shares: store.read_cache_span_shares,
            },
            durable_write_micros: store.flush_micros,
            parked_pulls: self.pull_waiters.len() as u64,
            timing_messages: self.timing_messages(),
            refused_sends,
            output_waiting_bytes,
            memory: super::ShardMemory {
                store: self.store.memory(),
                connection_buffers,
            },
            durable_write_buckets: store.flush_latency_buckets,
            io_uring: vec![("commitlog", store.ring.entries, Some(store.ring.enters))],
            ..ShardSnapshot::default()
        }
    }

    /// Delay-level messages not yet delivered (each level's queue end less its delivery
    /// progress) and timer messages pending.
    fn timing_messages(&self) -> u64 {
        let schedule = self.schedule.borrow();
        let delayed: u64 = (1..=schedule.levels.max_level())
            .map(|level| {
                let queue = shards::QueueId(level - 1);
                let end = self.store.max_queue_offset(SCHEDULE_TOPIC, queue).0;
                let first = self.store.min_queue_offset(SCHEDULE_TOPIC, queue).0;
                let delivered = schedule.level_offsets().get(&level).copied().unwrap_or(0);
                end.saturating_sub(delivered.max(first))
            })
            .sum();
        delayed + schedule.timers_pending() as u64
    }

    /// (topic, group, ms) for every group behind on this shard: how long ago the oldest
    /// message it has not consumed was stored. One store read per lagging queue, at most
    /// LAG_LATENCY_QUEUES_MAX a second (what lies past the bound is left out).
    pub async fn consumer_lag_latency(&self) -> Vec<(String, String, u64)> {
        let mut behind = Vec::new();
        for (key, queues) in self.offsets.borrow().entries().iter().take(SERIES_MAX) {
            let Some((topic, group)) = key.split_once('@') else {
                continue;
            };
            for (queue_id, committed) in queues {
                let committed = (*committed).max(0) as u64;
                let max = self
                    .store
                    .max_queue_offset(topic, shards::QueueId(*queue_id))
                    .0;
                if max > committed && behind.len() < LAG_LATENCY_QUEUES_MAX {
                    behind.push((topic.to_string(), group.to_string(), *queue_id, committed));
                }
            }
        }
        let now_ms = self.clock.now_ms();
        let mut oldest: std::collections::BTreeMap<(String, String), i64> = Default::default();
        for (topic, group, queue_id, committed) in behind {
            let stored = store_time_at(&self.store, &topic, queue_id, committed).await;
            if stored > 0 {
                let entry = oldest.entry((topic, group)).or_insert(stored);
                *entry = (*entry).min(stored);
            }
        }
        oldest
            .into_iter()
            .map(|((topic, group), stored)| {
                (topic, group, now_ms.saturating_sub(stored).max(0) as u64)
            })
            .collect()
    }

    /// For every group that committed offsets here (at most SERIES_MAX): (topic, group,
    /// messages) behind (queues' max offsets less the committed ones), in flight (pulled, not
    /// committed) and ready (stored, not pulled), as RocketMQ's ConsumerLagCalculator counts
    /// them (a queue never pulled counts from its committed offset).
    #[allow(clippy::type_complexity)]
    fn consumer_positions(
        &self,
    ) -> (
        Vec<(String, String, u64)>,
        Vec<(String, String, u64)>,
        Vec<(String, String, u64)>,
    ) {
        let offsets = self.offsets.borrow();
        let (mut lag, mut inflight, mut ready) = (Vec::new(), Vec::new(), Vec::new());
        for (key, queues) in offsets.entries().iter().take(SERIES_MAX) {
            let Some((topic, group)) = key.split_once('@') else {
                continue;
            };
            let pulled = offsets.pulled(group, topic);
            let (mut behind, mut pulled_not_committed, mut not_pulled) = (0, 0, 0);
            for (queue_id, committed) in queues {
                let max = self
                    .store
                    .max_queue_offset(topic, shards::QueueId(*queue_id))
                    .0;
                let committed = (*committed).max(0) as u64;
                let pull = pulled
                    .and_then(|queues| queues.get(queue_id))
                    .map_or(committed, |pull| (*pull).max(committed));
                behind += max.saturating_sub(committed);
                pulled_not_committed += pull - committed;
                not_pulled += max.saturating_sub(pull);
            }
            let (topic, group) = (topic.to_string(), group.to_string());
            lag.push((topic.clone(), group.clone(), behind));
            inflight.push((topic.clone(), group.clone(), pulled_not_committed));
            ready.push((topic, group, not_pulled));
        }
        (lag, inflight, ready)
    }
}
