//! What a consumer counts and how it is printed, as RocketMQ's `Consumer` benchmark does
//! (5.x line: `Consume TPS | AVG(B2C) RT(ms) | AVG(S2C) RT(ms) | MAX(B2C) RT(ms) |
//! MAX(S2C) RT(ms) | Consume Fail | Consume Success`), plus pull round trips and, in
//! end-to-end mode, the latency from each message's intended send time to its receipt.
//! Pure: durations come in as arguments.
//!
//! - B2C: born timestamp (producer's clock, ms) to receipt; S2C: store timestamp (broker's
//!   clock, ms) to receipt. Both in whole milliseconds, as the records carry them.
//! - pull RT: from writing a PULL_MESSAGE to reading its response, in microseconds; a
//!   long-polled pull that waited for messages counts its wait.
//! - end-to-end: BENCH_SENT_US (intended send time, µs) to receipt, in microseconds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use shardmq_protocol::remoting::response_code_name;

use crate::stats::{
    per_second, response_failures_json, round3, send_failures_json, LatencySummary,
    ResponseFailures, SendFailure, BYTES_PER_MB, LATENCY_HIGHEST_TRACKABLE_US,
    LATENCY_SIGNIFICANT_DIGITS,
};

/// Sum, count and maximum of whole-millisecond delays (B2C, S2C).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayMs {
    pub sum_ms: u64,
    pub count: u64,
    pub max_ms: u64,
}

impl DelayMs {
    pub fn record(&mut self, delay_ms: i64) {
        let delay_ms = delay_ms.max(0) as u64;
        self.sum_ms += delay_ms;
        self.count += 1;
        self.max_ms = self.max_ms.max(delay_ms);
    }

    fn merge(&mut self, other: &DelayMs) {
        self.sum_ms += other.sum_ms;
        self.count += other.count;
        self.max_ms = self.max_ms.max(other.max_ms);
    }

    pub fn average_ms(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ms as f64 / self.count as f64
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_HIGHEST_TRACKABLE_US, LATENCY_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// A consumer's counts over one interval, or over the run once merged.
#[derive(Debug, Clone)]
pub struct ConsumeTally {
    pub messages: u64,
    /// Message bodies received, in bytes.
    pub body_bytes: u64,
    /// Pulls answered with SUCCESS.
    pub pulls: u64,
    /// Pulls answered PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY or PULL_OFFSET_MOVED.
    pub empty_pulls: u64,
    /// Pulls answered with any other code.
    pub pull_failures: BTreeMap<i32, ResponseFailures>,
    /// Pulls that got no answer.
    pub pull_send_failures: BTreeMap<SendFailure, u64>,
    /// SUCCESS bodies that could not be walked to the end.
    pub malformed_bodies: u64,
    pub pull_latency_us: Histogram<u64>,
    pub born_to_consume: DelayMs,
    pub store_to_consume: DelayMs,
    /// End-to-end latency of every message that carried BENCH_SENT_US.
    pub end_to_end_us: Histogram<u64>,
}

impl ConsumeTally {
    pub fn new() -> Self {
        ConsumeTally {
            messages: 0,
            body_bytes: 0,
            pulls: 0,
            empty_pulls: 0,
            pull_failures: BTreeMap::new(),
            pull_send_failures: BTreeMap::new(),
            malformed_bodies: 0,
            pull_latency_us: histogram(),
            born_to_consume: DelayMs::default(),
            store_to_consume: DelayMs::default(),
            end_to_end_us: histogram(),
        }
    }

    pub fn record_pull_latency(&mut self, latency: Duration) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.pull_latency_us.saturating_record(latency_us);
    }

    pub fn record_end_to_end(&mut self, latency: Duration) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.end_to_end_us.saturating_record(latency_us.max(1));
    }

    pub fn record_pull_failure(&mut self, code: i32, remark: Option<&str>) {
        let entry = self
            .pull_failures
            .entry(code)
            .or_insert_with(|| ResponseFailures {
                count: 0,
                first_remark: remark.unwrap_or_default().to_owned(),
            });
        entry.count += 1;
    }

    pub fn record_send_failures(&mut self, kind: SendFailure, count: u64) {
        if count > 0 {
            *self.pull_send_failures.entry(kind).or_default() += count;
        }
    }

    /// Pulls that failed, answered or not.
    pub fn failed(&self) -> u64 {
        self.pull_failures.values().map(|f| f.count).sum::<u64>()
            + self.pull_send_failures.values().sum::<u64>()
    }

    /// Adds `other` in; returns the failure codes not seen before.
    pub fn merge(&mut self, other: &ConsumeTally) -> Vec<i32> {
        self.messages += other.messages;
        self.body_bytes += other.body_bytes;
        self.pulls += other.pulls;
        self.empty_pulls += other.empty_pulls;
        self.malformed_bodies += other.malformed_bodies;
        let mut new_codes = Vec::new();
        for (&code, failures) in &other.pull_failures {
            match self.pull_failures.get_mut(&code) {
                Some(mine) => mine.count += failures.count,
                None => {
                    self.pull_failures.insert(code, failures.clone());
                    new_codes.push(code);
                }
            }
        }
        for (&kind, &count) in &other.pull_send_failures {
            self.record_send_failures(kind, count);
        }
        self.born_to_consume.merge(&other.born_to_consume);
        self.store_to_consume.merge(&other.store_to_consume);
        self.pull_latency_us
            .add(&other.pull_latency_us)
            .expect("histograms share their bounds");
        self.end_to_end_us
            .add(&other.end_to_end_us)
            .expect("histograms share their bounds");
        new_codes
    }
}

/// RocketMQ's (5.x) consumer line for one interval, then MB/s and pull round trips.
/// Consume Fail and Consume Success are totals so far.
pub fn consume_line(interval: &ConsumeTally, length: Duration, totals: &ConsumeTally) -> String {
    let pull = LatencySummary::of(&interval.pull_latency_us);
    format!(
        "Consume TPS: {:.0} | AVG(B2C) RT(ms): {:7.3} | AVG(S2C) RT(ms): {:7.3} | MAX(B2C) \
         RT(ms): {} | MAX(S2C) RT(ms): {} | Consume Fail: {} | Consume Success: {} | MB/s: {:.2} \
         | pull RT p50 p99 p99.9 p99.99 (us): {} {} {} {}",
        per_second(interval.messages, length),
        interval.born_to_consume.average_ms(),
        interval.store_to_consume.average_ms(),
        interval.born_to_consume.max_ms,
        interval.store_to_consume.max_ms,
        totals.failed(),
        totals.messages,
        per_second(interval.body_bytes, length) / BYTES_PER_MB,
        pull.p50_us,
        pull.p99_us,
        pull.p99_9_us,
        pull.p99_99_us,
    )
}

/// The end-to-end line of one interval (end-to-end mode).
pub fn end_to_end_line(interval: &ConsumeTally) -> String {
    let latency = LatencySummary::of(&interval.end_to_end_us);
    format!(
        "E2E messages: {} | e2e p50 p99 p99.9 p99.99 (us): {} {} {} {} | max (us): {}",
        latency.count,
        latency.p50_us,
        latency.p99_us,
        latency.p99_9_us,
        latency.p99_99_us,
        latency.max_us
    )
}

/// A consumer's whole run.
#[derive(Debug)]
pub struct ConsumeSummary<'a> {
    pub total: &'a ConsumeTally,
    pub elapsed: Duration,
}

impl ConsumeSummary<'_> {
    pub fn messages_per_second(&self) -> f64 {
        per_second(self.total.messages, self.elapsed)
    }

    pub fn mb_per_second(&self) -> f64 {
        per_second(self.total.body_bytes, self.elapsed) / BYTES_PER_MB
    }

    pub fn to_text(&self) -> String {
        let total = self.total;
        let mut text = String::new();
        let _ = writeln!(
            text,
            "Consumed: {} in {} pulls ({} empty) Pull failures: {} Malformed bodies: {}",
            total.messages,
            total.pulls,
            total.empty_pulls,
            total.failed(),
            total.malformed_bodies
        );
        for (code, failures) in &total.pull_failures {
            let _ = writeln!(
                text,
                "  pull answered {code} ({}): {} (first remark: {:?})",
                response_code_name(*code).unwrap_or("UNKNOWN"),
                failures.count,
                failures.first_remark
            );
        }
        for (kind, count) in &total.pull_send_failures {
            let _ = writeln!(text, "  pull failure {}: {count}", kind.name());
        }
        let _ = writeln!(
            text,
            "Elapsed: {:.3} s Throughput: {:.0} msgs/s {:.2} MB/s (bodies) \
             AVG(B2C) {:.3} ms AVG(S2C) {:.3} ms",
            self.elapsed.as_secs_f64(),
            self.messages_per_second(),
            self.mb_per_second(),
            total.born_to_consume.average_ms(),
            total.store_to_consume.average_ms(),
        );
        let pull = LatencySummary::of(&total.pull_latency_us);
        let _ = write!(
            text,
            "Pull RT (us): p50 {} p99 {} p99.9 {} p99.99 {} max {}",
            pull.p50_us, pull.p99_us, pull.p99_9_us, pull.p99_99_us, pull.max_us
        );
        let e2e = LatencySummary::of(&total.end_to_end_us);
        if e2e.count > 0 {
            let _ = write!(
                text,
                "\nEnd-to-end latency (us, from intended send time): {}",
                e2e.to_text()
            );
        }
        text
    }

    pub fn to_json(&self, config: Value) -> Value {
        let total = self.total;
        let failures = response_failures_json(&total.pull_failures);
        let send_failures = send_failures_json(&total.pull_send_failures);
        json!({
            "config": config,
            "consumed": total.messages,
            "body_bytes": total.body_bytes,
            "pulls": total.pulls,
            "empty_pulls": total.empty_pulls,
            "pull_failed": total.failed(),
            "pull_failures_by_code": failures,
            "pull_failures_by_reason": send_failures,
            "malformed_bodies": total.malformed_bodies,
            "elapsed_secs": round3(self.elapsed.as_secs_f64()),
            "messages_per_sec": round3(self.messages_per_second()),
            "payload_mb_per_sec": round3(self.mb_per_second()),
            "born_to_consume_ms": {
                "avg": round3(total.born_to_consume.average_ms()),
                "max": total.born_to_consume.max_ms,
            },
            "store_to_consume_ms": {
                "avg": round3(total.store_to_consume.average_ms()),
                "max": total.store_to_consume.max_ms,
            },
            "pull_latency_us": LatencySummary::of(&total.pull_latency_us).to_json(),
            "end_to_end_latency_us": LatencySummary::of(&total.end_to_end_us).to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally() -> ConsumeTally {
        let mut tally = ConsumeTally::new();
        tally.messages = 2_000;
        tally.body_bytes = 2_000_000;
        tally.pulls = 63;
        for delay in [1, 3] {
            tally.born_to_consume.record(delay);
            tally.store_to_consume.record(delay - 1);
        }
        tally.record_pull_latency(Duration::from_micros(250));
        tally.record_end_to_end(Duration::from_micros(900));
        tally
    }

    #[test]
    fn consume_line_has_rocketmq_fields() {
        let interval = tally();
        let mut totals = interval.clone();
        totals.record_pull_failure(25, Some("no sub"));
        totals.record_send_failures(SendFailure::Timeout, 1);
        let line = consume_line(&interval, Duration::from_secs(2), &totals);
        assert!(
            line.starts_with(
                "Consume TPS: 1000 | AVG(B2C) RT(ms):   2.000 | AVG(S2C) RT(ms):   1.000 | \
                 MAX(B2C) RT(ms): 3 | MAX(S2C) RT(ms): 2 | Consume Fail: 2 | \
                 Consume Success: 2000 | MB/s: 1.00 | pull RT p50 p99 p99.9 p99.99 (us): 250"
            ),
            "{line}"
        );
        assert!(end_to_end_line(&interval).contains("(us): 900 900 900 900"));
    }

    #[test]
    fn merge_and_summary() {
        let mut total = tally();
        let mut other = tally();
        other.record_pull_failure(24, None);
        assert_eq!(total.merge(&other), vec![24]);
        assert_eq!(total.messages, 4_000);
        assert_eq!(total.born_to_consume.count, 4);
        assert_eq!(total.born_to_consume.max_ms, 3);
        assert_eq!(total.end_to_end_us.len(), 2);
        let summary = ConsumeSummary {
            total: &total,
            elapsed: Duration::from_secs(4),
        };
        let report = summary.to_json(json!({}));
        assert_eq!(report["consumed"], 4_000);
        assert_eq!(report["messages_per_sec"], 1_000.0);
        assert_eq!(report["payload_mb_per_sec"], 1.0);
        assert_eq!(report["end_to_end_latency_us"]["count"], 2);
        assert_eq!(report["pull_failures_by_code"]["24"]["count"], 1);
        assert!(summary.to_text().contains("End-to-end latency"));
    }
}
