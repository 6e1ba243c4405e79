//! What a producer counts and how it is printed: per-worker tallies that the main thread
//! merges, the once-a-second line in RocketMQ's benchmark format, the final summary and the
//! JSON report. Pure: durations come in as arguments. (`consume_stats` is the consumer's.)
//!
//! Meaning of the counters, as in RocketMQ's `Producer` benchmark:
//! - sent (TPS): messages of a send request answered with SUCCESS (0); only these requests
//!   feed the latency histogram, one value per request (a batch is one request), in
//!   microseconds from the request's intended send time (when its frame joined the output
//!   buffer; in open loop, when the schedule said it was due) to reading the response;
//! - Send Failed: the request got no answer (timeout, connection lost);
//! - Response Failed: the broker answered with any other code (10/11/12 included, on
//!   purpose: a benchmark that stores without the asked-for flush is not measuring it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use shardmq_protocol::remoting::response_code_name;

/// Highest latency tracked exactly; slower answers saturate here. Ten minutes is beyond any
/// sensible `--timeout-ms`, after which a request is a send failure, not a latency.
pub const LATENCY_HIGHEST_TRACKABLE_US: u64 = 600_000_000;
/// hdrhistogram precision: values are kept within 0.1 %.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;
/// "MB" in figures and reports is 10^6 bytes.
pub const BYTES_PER_MB: f64 = 1_000_000.0;

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SendFailure {
    /// No response within `--timeout-ms`.
    Timeout,
    /// The connection failed or closed with the request outstanding (or unsent).
    ConnectionLost,
}

impl SendFailure {
    pub fn name(self) -> &'static str {
        match self {
            SendFailure::Timeout => "timeout",
            SendFailure::ConnectionLost => "connection_lost",
        }
    }
}

/// Responses with one non-SUCCESS code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFailures {
    pub count: u64,
    /// The remark of the first such response (empty when it had none).
    pub first_remark: String,
}

/// Counts and latencies of one worker over one interval, or of the whole run once merged.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Messages stored (every message of a successful request).
    pub succeeded: u64,
    /// Successful requests (equal to `succeeded` without batches).
    pub requests: u64,
    /// Responses whose request had already timed out, or whose opaque is unknown.
    pub late_responses: u64,
    pub response_failures: BTreeMap<i32, ResponseFailures>,
    pub send_failures: BTreeMap<SendFailure, u64>,
    pub latency_us: Histogram<u64>,
}

impl Tally {
    pub fn new() -> Self {
        let latency_us =
            Histogram::new_with_bounds(1, LATENCY_HIGHEST_TRACKABLE_US, LATENCY_SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid");
        Tally {
            succeeded: 0,
            requests: 0,
            late_responses: 0,
            response_failures: BTreeMap::new(),
            send_failures: BTreeMap::new(),
            latency_us,
        }
    }

    /// One successful request that carried `messages` messages.
    pub fn record_success(&mut self, latency: Duration, messages: u64) {
        self.succeeded += messages;
        self.requests += 1;
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.saturating_record(latency_us);
    }

    pub fn record_response_failure(&mut self, code: i32, remark: Option<&str>) {
        let entry = self
            .response_failures
            .entry(code)
            .or_insert_with(|| ResponseFailures {
                count: 0,
                first_remark: remark.unwrap_or_default().to_owned(),
            });
        entry.count += 1;
    }

    pub fn record_send_failures(&mut self, kind: SendFailure, count: u64) {
        if count > 0 {
            *self.send_failures.entry(kind).or_default() += count;
        }
    }

    pub fn response_failed(&self) -> u64 {
        self.response_failures
            .values()
            .map(|failures| failures.count)
            .sum()
    }

    pub fn send_failed(&self) -> u64 {
        self.send_failures.values().sum()
    }

    /// Adds `other` in; returns the response codes this tally had not seen before, so the
    /// caller can print each code's first remark once.
    pub fn merge(&mut self, other: &Tally) -> Vec<i32> {
        self.succeeded += other.succeeded;
        self.requests += other.requests;
        self.late_responses += other.late_responses;
        let mut new_codes = Vec::new();
        for (&code, failures) in &other.response_failures {
            match self.response_failures.get_mut(&code) {
                Some(mine) => mine.count += failures.count,
                None => {
                    self.response_failures.insert(code, failures.clone());
                    new_codes.push(code);
                }
            }
        }
        for (&kind, &count) in &other.send_failures {
            self.record_send_failures(kind, count);
        }
        self.latency_us
            .add(&other.latency_us)
            .expect("histograms share their bounds");
        new_codes
    }
}

/// Latency percentiles in microseconds; all zero when nothing was recorded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p99_9_us: u64,
    pub p99_99_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return LatencySummary {
                count: 0,
                min_us: 0,
                mean_us: 0.0,
                p50_us: 0,
                p90_us: 0,
                p99_us: 0,
                p99_9_us: 0,
                p99_99_us: 0,
                max_us: 0,
            };
        }
        LatencySummary {
            count: histogram.len(),
            min_us: histogram.min(),
            mean_us: histogram.mean(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p99_9_us: histogram.value_at_quantile(0.999),
            p99_99_us: histogram.value_at_quantile(0.9999),
            max_us: histogram.max(),
        }
    }

    /// `min … p50 … p90 … p99 … p99.9 … p99.99 … max … mean …`: the summary lines' figures.
    pub fn to_text(self) -> String {
        format!(
            "min {} p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {} mean {:.1}",
            self.min_us,
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p99_9_us,
            self.p99_99_us,
            self.max_us,
            self.mean_us
        )
    }

    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "min": self.min_us,
            "mean": round3(self.mean_us),
            "p50": self.p50_us,
            "p90": self.p90_us,
            "p99": self.p99_us,
            "p99_9": self.p99_9_us,
            "p99_99": self.p99_99_us,
            "max": self.max_us,
        })
    }
}

/// RocketMQ's (5.x) benchmark line for one interval, then this interval's percentiles. Send
/// Failed and Response Failed are totals so far, as RocketMQ prints them; TPS, Max RT and
/// Average RT belong to the interval (RT in ms with microsecond digits).
pub fn interval_line(interval: &Tally, interval_length: Duration, totals: &Tally) -> String {
    let latency = LatencySummary::of(&interval.latency_us);
    let tps = per_second(interval.succeeded, interval_length);
    format!(
        "Send TPS: {tps:.0} | Max RT(ms): {:.3} | Average RT(ms): {:.3} | Send Failed: {} | \
         Response Failed: {} | p50 p99 p99.9 p99.99 (us): {} {} {} {}",
        latency.max_us as f64 / 1000.0,
        latency.mean_us / 1000.0,
        totals.send_failed(),
        totals.response_failed(),
        latency.p50_us,
        latency.p99_us,
        latency.p99_9_us,
        latency.p99_99_us,
    )
}

/// The whole run, as printed at the end and written with `--report`.
#[derive(Debug)]
pub struct RunSummary<'a> {
    pub total: &'a Tally,
    /// From the first send to the last response (or the end of draining).
    pub elapsed: Duration,
    pub message_size_bytes: usize,
}

impl RunSummary<'_> {
    pub fn messages_per_second(&self) -> f64 {
        per_second(self.total.succeeded, self.elapsed)
    }

    /// Message bodies stored per second, in MB (10^6 bytes); headers not counted.
    pub fn payload_mb_per_second(&self) -> f64 {
        self.messages_per_second() * self.message_size_bytes as f64 / BYTES_PER_MB
    }

    pub fn to_text(&self) -> String {
        let total = self.total;
        let latency = LatencySummary::of(&total.latency_us);
        let mut text = String::new();
        let _ = writeln!(
            text,
            "Sent: {} ({} requests) Send Failed: {} Response Failed: {} Late responses: {}",
            total.succeeded,
            total.requests,
            total.send_failed(),
            total.response_failed(),
            total.late_responses
        );
        for (code, failures) in &total.response_failures {
            let _ = writeln!(
                text,
                "  response code {code} ({}): {} (first remark: {:?})",
                response_code_name(*code).unwrap_or("UNKNOWN"),
                failures.count,
                failures.first_remark
            );
        }
        for (kind, count) in &total.send_failures {
            let _ = writeln!(text, "  send failure {}: {count}", kind.name());
        }
        let _ = writeln!(
            text,
            "Elapsed: {:.3} s Throughput: {:.0} msgs/s {:.2} MB/s (bodies of {} bytes)",
            self.elapsed.as_secs_f64(),
            self.messages_per_second(),
            self.payload_mb_per_second(),
            self.message_size_bytes
        );
        let _ = write!(text, "Send latency (us): {}", latency.to_text());
        text
    }

    /// The same figures as `to_text`, with `config` (the producer's options) alongside.
    pub fn to_json(&self, config: Value) -> Value {
        let total = self.total;
        let response_failures = response_failures_json(&total.response_failures);
        let send_failures = send_failures_json(&total.send_failures);
        json!({
            "config": config,
            "sent": total.succeeded,
            "requests": total.requests,
            "send_failed": total.send_failed(),
            "response_failed": total.response_failed(),
            "late_responses": total.late_responses,
            "response_failures_by_code": response_failures,
            "send_failures_by_reason": send_failures,
            "elapsed_secs": round3(self.elapsed.as_secs_f64()),
            "messages_per_sec": round3(self.messages_per_second()),
            "payload_mb_per_sec": round3(self.payload_mb_per_second()),
            "latency_us": LatencySummary::of(&total.latency_us).to_json(),
        })
    }
}

/// Failure responses by code, as the JSON reports show them: `{"<code>": {name, count,
/// first_remark}}`.
pub fn response_failures_json(failures: &BTreeMap<i32, ResponseFailures>) -> Value {
    let by_code: serde_json::Map<String, Value> = failures
        .iter()
        .map(|(code, failures)| {
            let entry = json!({
                "name": response_code_name(*code),
                "count": failures.count,
                "first_remark": failures.first_remark,
            });
            (code.to_string(), entry)
        })
        .collect();
    Value::Object(by_code)
}

/// Requests that got no answer, by reason: `{"<reason>": count}`.
pub fn send_failures_json(failures: &BTreeMap<SendFailure, u64>) -> Value {
    let by_reason: serde_json::Map<String, Value> = failures
        .iter()
        .map(|(kind, count)| (kind.name().to_owned(), json!(count)))
        .collect();
    Value::Object(by_reason)
}

pub fn per_second(count: u64, length: Duration) -> f64 {
    let secs = length.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

pub fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally_with_latencies(latencies_us: impl IntoIterator<Item = u64>) -> Tally {
        let mut tally = Tally::new();
        for latency_us in latencies_us {
            tally.record_success(Duration::from_micros(latency_us), 1);
        }
        tally
    }

    #[test]
    fn percentiles_of_one_to_ten_thousand() {
        let summary = LatencySummary::of(&tally_with_latencies(1..=10_000).latency_us);
        assert_eq!(summary.count, 10_000);
        assert_eq!(summary.min_us, 1);
        // Within hdrhistogram's 0.1 % (3 significant digits).
        let close = |value: u64, expected: u64| value.abs_diff(expected) <= expected / 1000 + 1;
        assert!(close(summary.p50_us, 5_000), "p50 {}", summary.p50_us);
        assert!(close(summary.p90_us, 9_000), "p90 {}", summary.p90_us);
        assert!(close(summary.p99_us, 9_900), "p99 {}", summary.p99_us);
        assert!(close(summary.p99_9_us, 9_990), "p99.9 {}", summary.p99_9_us);
        assert!(
            close(summary.p99_99_us, 9_999),
            "p99.99 {}",
            summary.p99_99_us
        );
        assert!(close(summary.max_us, 10_000), "max {}", summary.max_us);
        assert!(
            (summary.mean_us - 5_000.5).abs() < 5.0,
            "mean {}",
            summary.mean_us
        );
    }

    #[test]
    fn empty_histogram_summarises_to_zero() {
        let summary = LatencySummary::of(&Tally::new().latency_us);
        assert_eq!(summary.count, 0);
        assert_eq!(summary.p99_99_us, 0);
        assert_eq!(summary.max_us, 0);
    }

    #[test]
    fn merge_adds_counts_and_reports_new_codes_once() {
        let mut total = tally_with_latencies([100, 200]);
        total.record_response_failure(2, Some("[REJECTREQUEST]system busy"));

        let mut interval = tally_with_latencies([300]);
        interval.record_response_failure(2, Some("another remark"));
        interval.record_response_failure(17, None);
        interval.record_send_failures(SendFailure::Timeout, 3);
        interval.late_responses = 1;

        assert_eq!(total.merge(&interval), vec![17]);
        assert_eq!(total.succeeded, 3);
        assert_eq!(total.latency_us.len(), 3);
        assert_eq!(total.response_failed(), 3);
        assert_eq!(
            total.response_failures[&2].first_remark,
            "[REJECTREQUEST]system busy"
        );
        assert_eq!(total.response_failures[&17].first_remark, "");
        assert_eq!(total.send_failed(), 3);
        assert_eq!(total.late_responses, 1);
        assert!(total.merge(&interval).is_empty());
    }

    #[test]
    fn interval_line_has_rocketmq_fields() {
        let interval = tally_with_latencies([1_000, 2_000]);
        let mut totals = interval.clone();
        totals.record_send_failures(SendFailure::ConnectionLost, 2);
        totals.record_response_failure(14, None);
        let line = interval_line(&interval, Duration::from_millis(500), &totals);
        assert!(
            line.starts_with(
                "Send TPS: 4 | Max RT(ms): 2.000 | Average RT(ms): 1.500 | Send Failed: 2 | \
                 Response Failed: 1 | p50 p99 p99.9 p99.99 (us): 1000 2000 2000 2000"
            ),
            "{line}"
        );
    }

    #[test]
    fn run_summary_figures_and_json() {
        let mut total = tally_with_latencies(std::iter::repeat_n(50, 1_000));
        total.record_response_failure(2, Some("busy"));
        let summary = RunSummary {
            total: &total,
            elapsed: Duration::from_secs(2),
            message_size_bytes: 1_000,
        };
        assert_eq!(summary.messages_per_second(), 500.0);
        assert_eq!(summary.payload_mb_per_second(), 0.5);
        let report = summary.to_json(json!({"topic": "T"}));
        assert_eq!(report["sent"], 1_000);
        assert_eq!(report["response_failed"], 1);
        assert_eq!(
            report["response_failures_by_code"]["2"]["name"],
            "SYSTEM_BUSY"
        );
        assert_eq!(
            report["response_failures_by_code"]["2"]["first_remark"],
            "busy"
        );
        assert_eq!(report["messages_per_sec"], 500.0);
        assert_eq!(report["latency_us"]["p99"], 50);
        assert_eq!(report["config"]["topic"], "T");
        let text = summary.to_text();
        assert!(text.contains("response code 2 (SYSTEM_BUSY): 1"), "{text}");
        assert!(text.contains("Throughput: 500 msgs/s 0.50 MB/s"), "{text}");
    }
}
