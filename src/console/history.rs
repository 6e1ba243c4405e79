//! The console's short memory of the node's totals, on shard 0: a sample of the shards'
//! published figures every `HISTORY_INTERVAL_MS`, at most `HISTORY_SAMPLES_MAX` kept (ten
//! minutes), from which the charts' rates and send latency percentiles and the tables'
//! per-topic and per-group rates are differences. Only the samples the rates span keep the
//! per-topic, per-group and per-node counts. Pure state: the sampler task feeds it.

use std::collections::{HashMap, VecDeque};

use serde_json::{json, Value};

use crate::metrics::rpc_latency::LatencyHistogram;
use crate::metrics::ShardSnapshot;

/// How often the console samples the shards' figures (they publish once a second).
pub const HISTORY_INTERVAL_MS: u64 = 2_000;
/// Samples kept: ten minutes at `HISTORY_INTERVAL_MS`.
pub const HISTORY_SAMPLES_MAX: usize = 300;
/// Samples the per-topic and per-group rates span (the last ten seconds).
pub const RATE_SPAN_SAMPLES: usize = 5;

/// The request codes whose latency the console charts as "send latency".
pub use crate::metrics::rpc_latency::SEND_CODES as SEND_REQUEST_CODES;

/// The node's totals at one moment.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub at_ms: u64,
    pub in_messages: u64,
    pub out_messages: u64,
    pub send_latency: LatencyHistogram,
    /// topic → messages stored.
    pub in_by_topic: HashMap<String, u64>,
    /// consumer group → messages delivered.
    pub out_by_group: HashMap<String, u64>,
    /// shard's broker name → (messages stored, messages delivered).
    pub by_node: HashMap<String, (u64, u64)>,
}

impl Sample {
    pub fn of(at_ms: u64, shards: &[ShardSnapshot]) -> Sample {
        let mut sample = Sample {
            at_ms,
            ..Sample::default()
        };
        for shard in shards {
            sample.in_messages += shard.flows.in_total.messages;
            sample.out_messages += shard.flows.out_total.messages;
            let node = (
                shard.flows.in_total.messages,
                shard.flows.out_total.messages,
            );
            sample.by_node.insert(shard.node_id.clone(), node);
            for (topic, flow) in &shard.flows.in_by_topic {
                *sample.in_by_topic.entry(topic.clone()).or_default() += flow.messages;
            }
            for groups in shard.flows.out_by_group.values() {
                for (group, flow) in groups {
                    *sample.out_by_group.entry(group.clone()).or_default() += flow.messages;
                }
            }
            for series in &shard.rpc_latency {
                let code = series.request_code;
                if code.is_some_and(|code| SEND_REQUEST_CODES.contains(&code)) {
                    sample.send_latency.merge(&series.histogram);
                }
            }
        }
        sample
    }
}

/// What one histogram counted since an earlier copy of it.
fn since(now: &LatencyHistogram, earlier: &LatencyHistogram) -> LatencyHistogram {
    let mut delta = *now;
    for (bucket, before) in delta.buckets.iter_mut().zip(earlier.buckets) {
        *bucket = bucket.saturating_sub(before);
    }
    delta.sum_ms = now.sum_ms.saturating_sub(earlier.sum_ms);
    delta.count = now.count.saturating_sub(earlier.count);
    delta
}

fn per_second(now: u64, earlier: u64, elapsed_ms: u64) -> f64 {
    now.saturating_sub(earlier) as f64 * 1000.0 / elapsed_ms.max(1) as f64
}

#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    pub fn push(&mut self, sample: Sample) {
        if self.samples.len() == HISTORY_SAMPLES_MAX {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        // Only the last `RATE_SPAN_SAMPLES + 1` samples' maps are read (`span`): older ones
        // keep the totals the charts draw. Kept whole, ten minutes of samples held every
        // topic 300 times (10,000 topics: ~200 MB).
        if let Some(aged) = self
            .samples
            .len()
            .checked_sub(RATE_SPAN_SAMPLES + 2)
            .and_then(|at| self.samples.get_mut(at))
        {
            aged.in_by_topic = HashMap::new();
            aged.out_by_group = HashMap::new();
            aged.by_node = HashMap::new();
        }
    }

    /// Points of the charts: `[{"atMs","produceTps","consumeTps","sendP50Ms","sendP99Ms"}]`,
    /// one per interval between samples (percentiles null where nothing was sent).
    pub fn points(&self) -> Value {
        let points: Vec<Value> = self
            .samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .map(|(earlier, now)| {
                let elapsed = now.at_ms.saturating_sub(earlier.at_ms);
                let sends = since(&now.send_latency, &earlier.send_latency);
                json!({
                    "atMs": now.at_ms,
                    "produceTps": per_second(now.in_messages, earlier.in_messages, elapsed),
                    "consumeTps": per_second(now.out_messages, earlier.out_messages, elapsed),
                    "sendP50Ms": sends.quantile_ms(0.5),
                    "sendP99Ms": sends.quantile_ms(0.99),
                })
            })
            .collect();
        json!(points)
    }

    /// (the sample `RATE_SPAN_SAMPLES` back, the latest), when there are two.
    fn span(&self) -> Option<(&Sample, &Sample)> {
        let latest = self.samples.back()?;
        let back = self.samples.len().saturating_sub(RATE_SPAN_SAMPLES + 1);
        let earlier = self.samples.get(back).filter(|e| e.at_ms < latest.at_ms)?;
        Some((earlier, latest))
    }

    /// Messages per second stored for `topic` lately (0 without two samples).
    pub fn topic_rate(&self, topic: &str) -> f64 {
        self.span().map_or(0.0, |(earlier, now)| {
            let of = |s: &Sample| s.in_by_topic.get(topic).copied().unwrap_or(0);
            per_second(of(now), of(earlier), now.at_ms - earlier.at_ms)
        })
    }

    /// (stored, delivered) messages per second of one shard's broker lately.
    pub fn node_rates(&self, node_id: &str) -> (f64, f64) {
        self.span().map_or((0.0, 0.0), |(earlier, now)| {
            let of = |s: &Sample| s.by_node.get(node_id).copied().unwrap_or((0, 0));
            let (then, latest, elapsed) = (of(earlier), of(now), now.at_ms - earlier.at_ms);
            (
                per_second(latest.0, then.0, elapsed),
                per_second(latest.1, then.1, elapsed),
            )
        })
    }

    /// Messages per second delivered to `group` lately.
    pub fn group_rate(&self, group: &str) -> f64 {
        self.span().map_or(0.0, |(earlier, now)| {
            let of = |s: &Sample| s.out_by_group.get(group).copied().unwrap_or(0);
            per_second(of(now), of(earlier), now.at_ms - earlier.at_ms)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::rpc_latency::RpcSeries;
    use crate::remoting::request_code as rc;

    fn shard(stored: u64, send_ms: &[u64]) -> ShardSnapshot {
        let mut shard = ShardSnapshot::default();
        for _ in 0..stored {
            shard.flows.note_in("T", 10);
        }
        shard.flows.note_out("T", "g", stored / 2, 10);
        let mut sends = LatencyHistogram::default();
        for ms in send_ms {
            sends.record(*ms);
        }
        for code in [rc::SEND_MESSAGE_V2, rc::PULL_MESSAGE] {
            shard.rpc_latency.push(RpcSeries {
                request_code: Some(code),
                response_code: 0,
                long_polling: false,
                histogram: sends,
            });
        }
        shard
    }

    #[test]
    fn rates_and_latency_are_differences_between_samples() {
        let mut history = History::default();
        assert_eq!(history.points(), json!([]));
        history.push(Sample::of(0, &[shard(10, &[2])]));
        history.push(Sample::of(2_000, &[shard(30, &[2, 50, 50])]));
        let points = history.points();
        assert_eq!(points[0]["produceTps"], json!(10.0));
        assert_eq!(points[0]["consumeTps"], json!(5.0));
        // The two sends of the interval took 50 ms: both in (10, 100].
        assert_eq!(points[0]["sendP50Ms"], json!(55.0));
        assert_eq!(history.topic_rate("T"), 10.0);
        assert_eq!(history.group_rate("g"), 5.0);
        assert_eq!(history.node_rates(""), (10.0, 5.0));
        assert_eq!(history.group_rate("other"), 0.0);
        for index in 0..HISTORY_SAMPLES_MAX + 3 {
            history.push(Sample::of(4_000 + index as u64, &[]));
        }
        assert_eq!(history.samples.len(), HISTORY_SAMPLES_MAX);
        let with_topics = history.samples.iter().filter(|s| !s.in_by_topic.is_empty());
        assert_eq!(
            with_topics.count(),
            0,
            "the rates span only empty samples now"
        );
    }

    #[test]
    fn only_the_samples_the_rates_span_keep_their_topics() {
        let mut history = History::default();
        for index in 0..40 {
            history.push(Sample::of(index * 2_000, &[shard(10 * index, &[])]));
        }
        let kept: Vec<bool> = history
            .samples
            .iter()
            .map(|s| !s.in_by_topic.is_empty() && !s.by_node.is_empty())
            .collect();
        assert_eq!(kept.iter().filter(|k| **k).count(), RATE_SPAN_SAMPLES + 1);
        assert!(kept[kept.len() - RATE_SPAN_SAMPLES - 1..]
            .iter()
            .all(|k| *k));
        // The charts' totals stay in every sample; the rates still see their span.
        assert_eq!(history.points().as_array().unwrap().len(), 39);
        assert_eq!(history.topic_rate("T"), 5.0);
        assert_eq!(history.node_rates(""), (5.0, 2.5));
    }
}
