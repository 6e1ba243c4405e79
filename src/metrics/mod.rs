//! Prometheus metrics (CAPABILITIES.md §3): each shard counts in plain cells on its own
//! thread (`Flows`, kept by its broker), publishes a snapshot of its figures once a second
//! (`MetricsBoard`, the only shared state: one slot per shard behind a mutex, never touched on
//! the data path), and `GET /metrics` on the metrics port (`http.rs`, RocketMQ 5's
//! `metricsPromExporterPort`, 5557) renders the latest snapshots in the text format, with
//! RocketMQ 5's names and labels (`rocketmq_messages_in_total{cluster, node_type, node_id,
//! topic}`, …) so existing dashboards work, and `shardmq_` figures per shard.
//!
//! `rocketmq_rpc_latency` (`rpc_latency.rs`) times every answered request by request code,
//! response code and long polling.
//!
//! Cardinality is bounded: a shard keeps at most `SERIES_MAX` topic and topic × group series;
//! what goes past it is still in the shard's totals and counted in
//! `shardmq_metrics_series_dropped_total`.

pub mod http;
mod render;
pub mod rpc_latency;
mod snapshot;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use render::render;
pub use snapshot::publish_every_second;

/// Topic and topic × group series one shard keeps (RocketMQ's metricsOtelCardinalityLimit
/// is 50,000 for a whole broker).
pub const SERIES_MAX: usize = 10_000;

/// RocketMQ 5's buckets of `rocketmq_message_size` (bytes).
pub const MESSAGE_SIZE_BUCKETS: [u64; 6] = [1 << 10, 4 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20];

/// Messages and bytes that went one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    pub messages: u64,
    pub bytes: u64,
    /// Stores or pulls that moved them (RocketMQ's StatsItem times).
    pub calls: u64,
}

impl Flow {
    fn add(&mut self, messages: u64, bytes: u64) {
        self.messages += messages;
        self.bytes += bytes;
        self.calls += 1;
    }
}

/// Counts of message sizes per bucket (the last one: larger than every bound).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SizeHistogram {
    pub buckets: [u64; MESSAGE_SIZE_BUCKETS.len() + 1],
    pub sum: u64,
    pub count: u64,
}

pub use shards::histogram::bucket_of;

impl SizeHistogram {
    pub fn record(&mut self, bytes: u64) {
        let bucket = bucket_of(&MESSAGE_SIZE_BUCKETS, bytes);
        self.buckets[bucket] += 1;
        self.sum += bytes;
        self.count += 1;
    }
}

/// What one shard's broker counts as messages come in and go out (its own thread only).
#[derive(Debug, Clone, Default)]
pub struct Flows {
    pub in_by_topic: HashMap<String, Flow>,
    /// topic → consumer group → what pulls delivered.
    pub out_by_group: HashMap<String, HashMap<String, Flow>>,
    /// Series in `out_by_group`.
    pub out_series: usize,
    pub in_total: Flow,
    pub out_total: Flow,
    pub message_size: SizeHistogram,
    /// Messages sent back to a dead letter queue (rocketmq_send_to_dlq_messages_total).
    pub to_dead_letter: u64,
    /// Messages given back by consumers, by `topic@group` (SNDBCK_PUT_NUMS).
    pub sent_back: HashMap<String, u64>,
    /// Series not kept because the shard already held SERIES_MAX of them.
    pub series_dropped: u64,
}

impl Flows {
    /// One message of `bytes` stored for `topic`.
    pub fn note_in(&mut self, topic: &str, bytes: u64) {
        self.in_total.add(1, bytes);
        self.message_size.record(bytes);
        if let Some(flow) = self.in_by_topic.get_mut(topic) {
            flow.add(1, bytes);
        } else if self.in_by_topic.len() < SERIES_MAX {
            let flow = Flow {
                messages: 1,
                bytes,
                calls: 1,
            };
            self.in_by_topic.insert(topic.to_string(), flow);
        } else {
            self.series_dropped += 1;
        }
    }

    /// `messages` of `bytes` in all delivered from `topic` to `group` by a pull.
    pub fn note_out(&mut self, topic: &str, group: &str, messages: u64, bytes: u64) {
        self.out_total.add(messages, bytes);
        let flow = self
            .out_by_group
            .get_mut(topic)
            .and_then(|groups| groups.get_mut(group));
        if let Some(flow) = flow {
            flow.add(messages, bytes);
        } else if self.out_series < SERIES_MAX {
            self.out_series += 1;
            self.out_by_group
                .entry(topic.to_string())
                .or_default()
                .insert(
                    group.to_string(),
                    Flow {
                        messages,
                        bytes,
                        calls: 1,
                    },
                );
        } else {
            self.series_dropped += 1;
        }
    }
}

impl Flows {
    /// A consumer gave a message of `topic` back for `group` to retry.
    pub fn note_sent_back(&mut self, topic: &str, group: &str) {
        let key = format!("{topic}@{group}");
        if let Some(count) = self.sent_back.get_mut(&key) {
            *count += 1;
        } else if self.sent_back.len() < SERIES_MAX {
            self.sent_back.insert(key, 1);
        } else {
            self.series_dropped += 1;
        }
    }
}

/// Why a send was refused (`shardmq_refused_sends_total{reason}`), as its answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// SYSTEM_BUSY [TIMEOUT_CLEAN_QUEUE]: the shard's requests waited too long.
    TimeInQueue,
    /// SYSTEM_BUSY [PC_SYNCHRONIZED]: the disk is behind (a long flush, no room ahead).
    DiskBehind,
    /// SYSTEM_BUSY [TRANSACTION]: too many half messages wait for their end.
    Transactions,
    /// SERVICE_NOT_AVAILABLE: the disk is full or the store cannot write.
    ServiceNotAvailable,
    /// MESSAGE_ILLEGAL, or a malformed request (too large, bad properties, missing fields).
    BadMessage,
    NoPermission,
    TopicNotExist,
    Other,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 8] = [
        RefusalReason::TimeInQueue,
        RefusalReason::DiskBehind,
        RefusalReason::Transactions,
        RefusalReason::ServiceNotAvailable,
        RefusalReason::BadMessage,
        RefusalReason::NoPermission,
        RefusalReason::TopicNotExist,
        RefusalReason::Other,
    ];

    pub fn of(error: &crate::error::RequestError) -> RefusalReason {
        use crate::error::RequestError as E;
        match error {
            E::SystemBusy(remark) if remark.starts_with("[TIMEOUT_CLEAN_QUEUE]") => {
                RefusalReason::TimeInQueue
            }
            E::SystemBusy(remark) if remark.starts_with("[TRANSACTION]") => {
                RefusalReason::Transactions
            }
            E::SystemBusy(_) => RefusalReason::DiskBehind,
            E::ServiceNotAvailable(_) => RefusalReason::ServiceNotAvailable,
            E::MessageIllegal(_) | E::InvalidParameter(_) | E::Field(_) | E::Body(_) => {
                RefusalReason::BadMessage
            }
            E::NoPermission(_) => RefusalReason::NoPermission,
            E::TopicNotExist(_) => RefusalReason::TopicNotExist,
            _ => RefusalReason::Other,
        }
    }

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            RefusalReason::TimeInQueue => "time_in_queue",
            RefusalReason::DiskBehind => "disk_behind",
            RefusalReason::Transactions => "transactions",
            RefusalReason::ServiceNotAvailable => "service_not_available",
            RefusalReason::BadMessage => "bad_message",
            RefusalReason::NoPermission => "no_permission",
            RefusalReason::TopicNotExist => "topic_not_exist",
            RefusalReason::Other => "other",
        }
    }
}

/// What pulls of records no longer in memory met in the store's read cache (read_cache.rs in
/// shards): windows found there and read from disk; of the misses, windows evicted lately,
/// pulls that read past the cache, and those of them that took another pull's span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCacheCounts {
    pub hits: u64,
    pub misses: u64,
    pub refetches: u64,
    pub bypasses: u64,
    pub span_shares: u64,
}

/// Sends refused, by reason (indexed as `RefusalReason::ALL`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusedSends(pub [u64; RefusalReason::ALL.len()]);

impl RefusedSends {
    pub fn note(&mut self, reason: RefusalReason) {
        self.0[reason as usize] += 1;
    }
}

/// Memory a shard holds, by holder (`shardmq_memory_bytes{holder}`), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardMemory {
    pub store: shards::store::StoreMemory,
    /// Connections' read and output buffers, and the shard's spare pull-body buffers.
    pub connection_buffers: u64,
}

/// One shard's figures at one moment, as the endpoint renders them.
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    pub cluster: String,
    /// The shard's broker name (RocketMQ's node_id label).
    pub node_id: String,
    pub flows: Flows,
    pub topic_number: u64,
    pub consumer_group_number: u64,
    pub producer_connections: u64,
    pub consumer_connections: u64,
    /// (topic, group) → messages not yet consumed (max offset − committed offset, over the
    /// queues the group has committed on this shard).
    pub consumer_lag: Vec<(String, String, u64)>,
    /// (topic, group) → ms since the oldest message the group has not consumed was stored
    /// (rocketmq_consumer_lag_latency; only groups with a lag).
    pub consumer_lag_latency_ms: Vec<(String, String, u64)>,
    /// (topic, group) → messages pulled and not yet committed
    /// (rocketmq_consumer_inflight_messages, RocketMQ's ConsumerLagCalculator: last pull's
    /// end less the committed offset, per queue).
    pub consumer_inflight: Vec<(String, String, u64)>,
    /// (topic, group) → messages stored and not yet pulled (rocketmq_consumer_ready_messages).
    pub consumer_ready: Vec<(String, String, u64)>,
    /// Delay-level and timer messages waiting for their time (rocketmq_timing_messages).
    pub timing_messages: u64,
    pub half_messages: u64,
    pub committed_transactions: u64,
    pub rolled_back_transactions: u64,
    pub storage_size_bytes: u64,
    pub flush_behind_bytes: u64,
    pub busy_ratio: f64,
    pub group_commits: u64,
    pub group_committed_messages: u64,
    /// Commitlog segments retention deleted, and those of them whose file was recycled.
    pub segments_deleted: u64,
    pub segments_recycled: u64,
    /// The read cache's counters (`shards::store::StoreStats::read_cache_*`).
    pub read_cache: ReadCacheCounts,
    pub durable_write_micros: u64,
    pub parked_pulls: u64,
    pub refused_sends: RefusedSends,
    pub connections: u64,
    /// Bytes of answers waiting in connections' output (buffered, being written, promised).
    pub output_waiting_bytes: u64,
    pub memory: ShardMemory,
    /// Durable writes by latency (bounds `shards::store::FLUSH_LATENCY_BUCKETS_US`).
    pub durable_write_buckets: [u64; shards::store::FLUSH_LATENCY_BUCKETS_US.len() + 1],
    /// Entries the shard gave io_uring, and io_uring_enter calls, by ring ("commitlog":
    /// the store's own; "executor": glommio's file reads and writes, whose enters it does
    /// not count).
    pub io_uring: Vec<(&'static str, u64, Option<u64>)>,
    pub connections_refused: u64,
    /// Request latencies by request code, response code and long polling.
    pub rpc_latency: Vec<rpc_latency::RpcSeries>,
}

/// The latest snapshot of every shard; shared by the shards (which publish) and the
/// endpoint (which reads).
#[derive(Debug, Default)]
pub struct MetricsBoard {
    slots: Mutex<Vec<Option<ShardSnapshot>>>,
}

impl MetricsBoard {
    pub fn new(shards: usize) -> Arc<MetricsBoard> {
        Arc::new(MetricsBoard {
            slots: Mutex::new(vec![None; shards]),
        })
    }

    pub fn publish(&self, shard: usize, snapshot: ShardSnapshot) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get_mut(shard) {
            *slot = Some(snapshot);
        }
    }

    /// The snapshots published so far.
    pub fn snapshots(&self) -> Vec<ShardSnapshot> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.iter().flatten().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_count_by_topic_and_group_and_bound_their_series() {
        let mut flows = Flows::default();
        flows.note_in("T", 1000);
        flows.note_in("T", 5000);
        flows.note_out("T", "g", 2, 6000);
        assert_eq!(
            flows.in_by_topic["T"],
            Flow {
                messages: 2,
                bytes: 6000,
                calls: 2,
            }
        );
        assert_eq!(flows.out_by_group["T"]["g"].messages, 2);
        assert_eq!(flows.message_size.buckets[..3], [1, 0, 1]);
        for index in 0..SERIES_MAX + 5 {
            flows.note_in(&format!("t{index}"), 10);
        }
        assert_eq!(flows.in_by_topic.len(), SERIES_MAX);
        assert_eq!(flows.series_dropped, 6);
        assert_eq!(flows.in_total.messages, 2 + SERIES_MAX as u64 + 5);
    }
}
