//! The Prometheus text format (version 0.0.4) of the shards' snapshots: RocketMQ 5's names
//! and labels (BrokerMetricsConstant, DefaultStoreMetricsConstant), then `shardmq_` figures.

use std::fmt::Write;

use super::rpc_latency::RPC_LATENCY_BUCKETS_MS;
use super::{ShardSnapshot, MESSAGE_SIZE_BUCKETS};

/// A label value with `\`, `"` and newlines escaped as the format wants.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (index, (key, label)) in labels.iter().enumerate() {
                if index > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape(label));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// One family with one sample per shard: `value` of each snapshot, labelled by its node.
fn per_node<T: std::fmt::Display>(
    out: &mut Out,
    shards: &[ShardSnapshot],
    name: &str,
    kind: &str,
    help: &str,
    value: impl Fn(&ShardSnapshot) -> T,
) {
    out.family(name, kind, help);
    for shard in shards {
        out.sample(name, &node_labels(shard), value(shard));
    }
}

fn node_labels(shard: &ShardSnapshot) -> [(&'static str, &str); 3] {
    [
        ("cluster", &shard.cluster),
        ("node_type", "broker"),
        ("node_id", &shard.node_id),
    ]
}

/// A counter of each shard: name, help, and which figure of the shard it shows.
type ShardCounter = (&'static str, &'static str, fn(&ShardSnapshot) -> u64);

/// A counter family over flows: name, help, and which figure of a flow it shows.
type FlowFamily = (&'static str, &'static str, fn(&super::Flow) -> u64);

/// Labels beyond the node's, and the flow they count.
type FlowSeries<'s> = Vec<(Vec<(&'static str, &'s str)>, super::Flow)>;

/// Two counter families (messages and bytes) over the flow series of every shard; each
/// shard's series are collected and sorted once, for both.
fn flow_families<'s>(
    out: &mut Out,
    shards: &'s [ShardSnapshot],
    families: [FlowFamily; 2],
    series_of: impl Fn(&'s ShardSnapshot) -> FlowSeries<'s>,
) {
    let series: Vec<(&ShardSnapshot, FlowSeries<'s>)> = shards
        .iter()
        .map(|shard| {
            let mut series = series_of(shard);
            series.sort_by(|a, b| a.0.cmp(&b.0));
            (shard, series)
        })
        .collect();
    for (name, help, value) in families {
        out.family(name, "counter", help);
        for (shard, series) in &series {
            for (extra, flow) in series {
                let mut labels = node_labels(shard).to_vec();
                labels.extend_from_slice(extra);
                out.sample(name, &labels, value(flow));
            }
        }
    }
}

/// `request_code` as RocketMQ's RemotingHelper.getRequestCodeDesc gives it: the code's name
/// in lower case (`send_message_v2`), else its number.
fn request_code_label(code: super::rpc_latency::RequestCode) -> String {
    match code {
        Some(code) => match crate::remoting::request_code_name(code) {
            Some(name) => name.to_ascii_lowercase(),
            None => code.to_string(),
        },
        None => "other".to_string(),
    }
}

/// `response_code` as RemotingHelper.getResponseCodeDesc gives it: the name in lower case
/// (`system_busy`), else the number.
fn response_code_label(code: i32) -> String {
    match crate::remoting::response_code_name(code) {
        Some(name) => name.to_ascii_lowercase(),
        None => code.to_string(),
    }
}

/// `rocketmq_rpc_latency`: one histogram per shard, request code, response code and long
/// polling, in milliseconds.
fn rpc_latency(out: &mut Out, shards: &[ShardSnapshot]) {
    out.family(
        "rocketmq_rpc_latency",
        "histogram",
        "Time from a request's dispatch to its answer, by request and response code, in \
         milliseconds.",
    );
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        for series in &shard.rpc_latency {
            let code = request_code_label(series.request_code);
            let response = response_code_label(series.response_code);
            let histogram = &series.histogram;
            let labels = [
                cluster,
                node_type,
                node_id,
                ("protocol_type", "remoting"),
                ("request_code", code.as_str()),
                ("response_code", response.as_str()),
                (
                    "is_long_polling",
                    if series.long_polling { "true" } else { "false" },
                ),
            ];
            let mut cumulative = 0;
            for (index, count) in histogram.buckets.iter().enumerate() {
                cumulative += count;
                let bound = RPC_LATENCY_BUCKETS_MS
                    .get(index)
                    .map_or("+Inf".to_string(), |b| b.to_string());
                let mut bucket_labels = labels.to_vec();
                bucket_labels.push(("le", bound.as_str()));
                out.sample("rocketmq_rpc_latency_bucket", &bucket_labels, cumulative);
            }
            out.sample("rocketmq_rpc_latency_sum", &labels, histogram.sum_ms);
            out.sample("rocketmq_rpc_latency_count", &labels, histogram.count);
        }
    }
}

/// `shardmq_durable_write_seconds`: the durable writes (group commits) of each shard by how
/// long each took, submission to completion.
fn durable_write_seconds(out: &mut Out, shards: &[ShardSnapshot]) {
    const NAME: &str = "shardmq_durable_write_seconds";
    out.family(
        NAME,
        "histogram",
        "Durable writes (group commits) by how long each took, submission to completion, in \
         seconds.",
    );
    let bounds = shards::store::FLUSH_LATENCY_BUCKETS_US;
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        let mut cumulative = 0;
        for (index, count) in shard.durable_write_buckets.iter().enumerate() {
            cumulative += count;
            let bound = bounds
                .get(index)
                .map_or("+Inf".to_string(), |us| format!("{}", *us as f64 / 1e6));
            let labels = [cluster, node_type, node_id, ("le", bound.as_str())];
            out.sample(&format!("{NAME}_bucket"), &labels, cumulative);
        }
        let sum = format!("{:.6}", shard.durable_write_micros as f64 / 1e6);
        out.sample(&format!("{NAME}_sum"), &node_labels(shard), sum);
        out.sample(&format!("{NAME}_count"), &node_labels(shard), cumulative);
    }
}

/// A gauge by topic and consumer group, each shard's series under its node labels.
fn topic_group_gauge(
    out: &mut Out,
    shards: &[ShardSnapshot],
    name: &str,
    help: &str,
    series: fn(&ShardSnapshot) -> &Vec<(String, String, u64)>,
) {
    out.family(name, "gauge", help);
    for shard in shards {
        for (topic, group, value) in series(shard) {
            let [cluster, node_type, node_id] = node_labels(shard);
            let labels = [
                cluster,
                node_type,
                node_id,
                ("topic", topic.as_str()),
                ("consumer_group", group.as_str()),
            ];
            out.sample(name, &labels, value);
        }
    }
}

pub fn render(shards: &[ShardSnapshot]) -> String {
    let mut out = Out {
        text: String::with_capacity(16 * 1024),
    };
    let topic_families: [FlowFamily; 2] = [
        (
            "rocketmq_messages_in_total",
            "Messages stored, by topic.",
            |f| f.messages,
        ),
        (
            "rocketmq_throughput_in_total",
            "Message bytes stored, by topic.",
            |f| f.bytes,
        ),
    ];
    flow_families(&mut out, shards, topic_families, |shard| {
        let flows = shard.flows.in_by_topic.iter();
        flows
            .map(|(topic, flow)| (vec![("topic", topic.as_str())], *flow))
            .collect()
    });
    let group_families: [FlowFamily; 2] = [
        (
            "rocketmq_messages_out_total",
            "Messages delivered by pulls, by topic and group.",
            |f| f.messages,
        ),
        (
            "rocketmq_throughput_out_total",
            "Bytes of stored records delivered, by topic and group.",
            |f| f.bytes,
        ),
    ];
    flow_families(&mut out, shards, group_families, |shard| {
        let topics = shard.flows.out_by_group.iter();
        topics
            .flat_map(|(topic, groups)| {
                groups.iter().map(move |(group, flow)| {
                    let labels = vec![
                        ("topic", topic.as_str()),
                        ("consumer_group", group.as_str()),
                    ];
                    (labels, *flow)
                })
            })
            .collect()
    });
    out.family(
        "rocketmq_message_size",
        "histogram",
        "Sizes of the messages stored, in bytes.",
    );
    for shard in shards {
        let histogram = &shard.flows.message_size;
        let [cluster, node_type, node_id] = node_labels(shard);
        let mut cumulative = 0;
        for (index, count) in histogram.buckets.iter().enumerate() {
            cumulative += count;
            let bound = MESSAGE_SIZE_BUCKETS
                .get(index)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let labels = [cluster, node_type, node_id, ("le", bound.as_str())];
            out.sample("rocketmq_message_size_bucket", &labels, cumulative);
        }
        out.sample(
            "rocketmq_message_size_sum",
            &node_labels(shard),
            histogram.sum,
        );
        out.sample(
            "rocketmq_message_size_count",
            &node_labels(shard),
            histogram.count,
        );
    }
    rpc_latency(&mut out, shards);
    topic_group_gauge(
        &mut out,
        shards,
        "rocketmq_consumer_lag_messages",
        "Messages a group has not consumed yet, by topic and group.",
        |s| &s.consumer_lag,
    );
    topic_group_gauge(
        &mut out,
        shards,
        "rocketmq_consumer_inflight_messages",
        "Messages pulled by a group and not yet committed, by topic and group.",
        |s| &s.consumer_inflight,
    );
    topic_group_gauge(
        &mut out,
        shards,
        "rocketmq_consumer_ready_messages",
        "Messages stored and not yet pulled by a group, by topic and group.",
        |s| &s.consumer_ready,
    );
    topic_group_gauge(
        &mut out,
        shards,
        "rocketmq_consumer_lag_latency",
        "Milliseconds since the oldest message a group has not consumed was stored.",
        |s| &s.consumer_lag_latency_ms,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_timing_messages",
        "gauge",
        "Delay-level and timer messages waiting for their time.",
        |s| s.timing_messages,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_send_to_dlq_messages_total",
        "counter",
        "Messages moved to a dead letter queue.",
        |s| s.flows.to_dead_letter,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_topic_number",
        "gauge",
        "Topics.",
        |s| s.topic_number,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_consumer_group_number",
        "gauge",
        "Subscription groups.",
        |s| s.consumer_group_number,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_producer_connections",
        "gauge",
        "Producer clients connected.",
        |s| s.producer_connections,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_consumer_connections",
        "gauge",
        "Consumer clients connected.",
        |s| s.consumer_connections,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_commit_messages_total",
        "counter",
        "Transaction messages committed.",
        |s| s.committed_transactions,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_rollback_messages_total",
        "counter",
        "Transaction messages rolled back.",
        |s| s.rolled_back_transactions,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_half_messages",
        "gauge",
        "Transaction half messages waiting for their end.",
        |s| s.half_messages,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_storage_size",
        "gauge",
        "Bytes of commitlog held, in bytes.",
        |s| s.storage_size_bytes,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_storage_flush_behind_bytes",
        "gauge",
        "Commitlog bytes written and not yet durable.",
        |s| s.flush_behind_bytes,
    );
    per_node(
        &mut out,
        shards,
        "rocketmq_storage_dispatch_behind_bytes",
        "gauge",
        "Commitlog bytes not yet in consume queues (dispatch is synchronous here).",
        |_| 0,
    );
    per_node(
        &mut out,
        shards,
        "shardmq_shard_busy_ratio",
        "gauge",
        "Share of the last second the shard's thread was on a CPU.",
        |s| format!("{:.4}", s.busy_ratio),
    );
    per_node(
        &mut out,
        shards,
        "shardmq_group_commits_total",
        "counter",
        "Durable writes (group commits) of the commitlog.",
        |s| s.group_commits,
    );
    per_node(
        &mut out,
        shards,
        "shardmq_group_committed_messages_total",
        "counter",
        "Messages made durable by those writes (divide by the commits: messages per commit).",
        |s| s.group_committed_messages,
    );
    durable_write_seconds(&mut out, shards);
    per_node(
        &mut out,
        shards,
        "shardmq_deleted_segments_total",
        "counter",
        "Commitlog segments retention deleted.",
        |s| s.segments_deleted,
    );
    per_node(
        &mut out,
        shards,
        "shardmq_recycled_segments_total",
        "counter",
        "Of those, the ones whose file became a later segment (written over, not unlinked).",
        |s| s.segments_recycled,
    );
    let read_cache: [ShardCounter; 5] = [
        (
            "shardmq_read_cache_hits_total",
            "Pulls' lookups of commitlog windows no longer in memory found in the read cache.",
            |s| s.read_cache.hits,
        ),
        (
            "shardmq_read_cache_misses_total",
            "Those that were not there: the pull read the window from disk, or read past the \
             cache.",
            |s| s.read_cache.misses,
        ),
        (
            "shardmq_read_cache_refetches_total",
            "Of the misses, windows evicted lately: the windows the groups read do not all fit.",
            |s| s.read_cache.refetches,
        ),
        (
            "shardmq_read_cache_bypasses_total",
            "Of the misses, pulls that found every window in use and read their own records' \
             span past the cache (raise store.read_cache_mib).",
            |s| s.read_cache.bypasses,
        ),
        (
            "shardmq_read_cache_span_shares_total",
            "Of those, pulls that took a span another pull had read or was reading.",
            |s| s.read_cache.span_shares,
        ),
    ];
    for (name, help, value) in read_cache {
        per_node(&mut out, shards, name, "counter", help, value);
    }
    per_node(
        &mut out,
        shards,
        "shardmq_parked_pulls",
        "gauge",
        "Pulls waiting for messages (long polling).",
        |s| s.parked_pulls,
    );
    out.family(
        "shardmq_refused_sends_total",
        "counter",
        "Sends refused, by reason (time_in_queue, disk_behind, transactions: SYSTEM_BUSY; \
         service_not_available: a full or failed disk; bad_message, no_permission, \
         topic_not_exist, other).",
    );
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        for reason in super::RefusalReason::ALL {
            let labels = [cluster, node_type, node_id, ("reason", reason.label())];
            let count = shard.refused_sends.0[reason as usize];
            out.sample("shardmq_refused_sends_total", &labels, count);
        }
    }
    per_node(
        &mut out,
        shards,
        "shardmq_output_waiting_bytes",
        "gauge",
        "Bytes of answers waiting in the shard's connections (buffered, being written, \
         promised to answers being prepared).",
        |s| s.output_waiting_bytes,
    );
    out.family(
        "shardmq_memory_bytes",
        "gauge",
        "Memory the shard holds, by holder (maps: file bytes mapped with blocks behind them, \
         page cache they may hold resident).",
    );
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        let memory = &shard.memory;
        for (holder, bytes) in [
            ("commitlog_tail", memory.store.commitlog_tail),
            ("read_cache", memory.store.read_cache),
            ("consume_queue_maps", memory.store.consume_queue_maps),
            ("index_maps", memory.store.index_maps),
            ("connection_buffers", memory.connection_buffers),
        ] {
            let labels = [cluster, node_type, node_id, ("holder", holder)];
            out.sample("shardmq_memory_bytes", &labels, bytes);
        }
    }
    out.family(
        "shardmq_io_uring_submissions_total",
        "counter",
        "Entries the shard handed io_uring, by ring (commitlog: the store's own ring; \
         executor: the runtime's file reads and writes).",
    );
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        for (ring, entries, _) in &shard.io_uring {
            let labels = [cluster, node_type, node_id, ("ring", ring)];
            out.sample("shardmq_io_uring_submissions_total", &labels, entries);
        }
    }
    out.family(
        "shardmq_io_uring_enters_total",
        "counter",
        "io_uring_enter calls of the store's own ring (submissions and completion collection).",
    );
    for shard in shards {
        let [cluster, node_type, node_id] = node_labels(shard);
        for (ring, _, enters) in &shard.io_uring {
            if let Some(enters) = enters {
                let labels = [cluster, node_type, node_id, ("ring", ring)];
                out.sample("shardmq_io_uring_enters_total", &labels, enters);
            }
        }
    }
    per_node(
        &mut out,
        shards,
        "shardmq_connections",
        "gauge",
        "Client connections the shard serves.",
        |s| s.connections,
    );
    per_node(
        &mut out,
        shards,
        "shardmq_connections_refused_total",
        "counter",
        "Connections refused at a cap.",
        |s| s.connections_refused,
    );
    per_node(
        &mut out,
        shards,
        "shardmq_metrics_series_dropped_total",
        "counter",
        "Updates of topic or group series past the series bound (counted in totals only).",
        |s| s.flows.series_dropped,
    );
    if let (Some(resident), Some(shard)) = (resident_bytes(), shards.first()) {
        out.family(
            "shardmq_process_resident_bytes",
            "gauge",
            "Resident memory of the whole process (every shard and the threads beside them).",
        );
        out.sample(
            "shardmq_process_resident_bytes",
            &[("cluster", shard.cluster.as_str()), ("node_type", "broker")],
            resident,
        );
    }
    out.text
}

/// The process's resident set, from /proc/self/statm (pages).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page_bytes).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_rocketmq_names_with_their_labels() {
        let mut shard = ShardSnapshot {
            cluster: "DefaultCluster".into(),
            node_id: "broker-0".into(),
            ..ShardSnapshot::default()
        };
        shard.flows.note_in("Orders", 2000);
        shard.flows.note_out("Orders", "billing", 1, 2000);
        shard
            .consumer_lag
            .push(("Orders".into(), "billing".into(), 0));
        shard.read_cache.hits = 5;
        shard.read_cache.span_shares = 2;
        let mut sends = super::super::rpc_latency::LatencyHistogram::default();
        sends.record(2);
        for (request_code, response_code) in [(Some(310), 0), (None, 2)] {
            shard
                .rpc_latency
                .push(super::super::rpc_latency::RpcSeries {
                    request_code,
                    response_code,
                    long_polling: false,
                    histogram: sends,
                });
        }
        let page = render(&[shard]);
        let node = r#"cluster="DefaultCluster",node_type="broker",node_id="broker-0""#;
        for line in [
            format!("rocketmq_messages_in_total{{{node},topic=\"Orders\"}} 1"),
            format!("rocketmq_throughput_in_total{{{node},topic=\"Orders\"}} 2000"),
            format!(
                "rocketmq_messages_out_total{{{node},topic=\"Orders\",consumer_group=\"billing\"}} 1"
            ),
            format!("rocketmq_message_size_bucket{{{node},le=\"1024\"}} 0"),
            format!("rocketmq_message_size_bucket{{{node},le=\"4096\"}} 1"),
            format!("rocketmq_message_size_bucket{{{node},le=\"+Inf\"}} 1"),
            format!(
                "rocketmq_consumer_lag_messages{{{node},topic=\"Orders\",consumer_group=\"billing\"}} 0"
            ),
            "# TYPE rocketmq_messages_in_total counter".to_string(),
            format!("shardmq_read_cache_hits_total{{{node}}} 5"),
            format!("shardmq_read_cache_misses_total{{{node}}} 0"),
            format!("shardmq_read_cache_span_shares_total{{{node}}} 2"),
            "# TYPE shardmq_read_cache_bypasses_total counter".to_string(),
            format!(
                "rocketmq_rpc_latency_bucket{{{node},protocol_type=\"remoting\",\
                 request_code=\"send_message_v2\",response_code=\"success\",\
                 is_long_polling=\"false\",le=\"1\"}} 0"
            ),
            format!(
                "rocketmq_rpc_latency_bucket{{{node},protocol_type=\"remoting\",\
                 request_code=\"send_message_v2\",response_code=\"success\",\
                 is_long_polling=\"false\",le=\"3\"}} 1"
            ),
            format!(
                "rocketmq_rpc_latency_count{{{node},protocol_type=\"remoting\",\
                 request_code=\"other\",response_code=\"system_busy\",\
                 is_long_polling=\"false\"}} 1"
            ),
        ] {
            assert!(page.lines().any(|l| l == line), "missing {line}\n{page}");
        }
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
