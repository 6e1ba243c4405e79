//! One shard's figures as RocketMQ's tools read them: the rates and latencies of
//! StoreStatsService (GET_BROKER_RUNTIME_INFO's `putTps`, `getTotalTps`, … as "10 s 60 s
//! 600 s" triples, `putMessageDistributeTime`, `putLatency99`) and the sampled items of
//! BrokerStatsManager that VIEW_BROKER_STATS_DATA (315) answers (TOPIC_PUT_NUMS, GROUP_GET_NUMS,
//! …: sum, tps and avgpt over the last minute, hour and day).
//!
//! Counting happens where messages move (plain cells, the shard's thread only); the sampler
//! task (`Broker::sample_stats`, once a second) takes snapshots the answers subtract, as the
//! Java broker does: a rate over N seconds needs N + 1 one-second samples and is empty before
//! (RocketMQ's format, which its tools expect), an item's minute is 7 samples 10 s apart, its
//! hour 7 samples 10 min apart, its day 25 samples an hour apart.
//!
//! Bounds: `SECOND_SAMPLES_KEPT` store samples; items only for the series the shard's flows
//! keep (`metrics::SERIES_MAX` per kind), each holding at most 39 samples.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::{Rc, Weak};

use crate::metrics::Flows;

/// One-second samples kept: enough for the 600 s rate.
pub const SECOND_SAMPLES_KEPT: usize = 601;
/// RocketMQ's StatsItem sampling: (period in seconds, samples kept) for minute, hour, day.
pub const ITEM_SAMPLING: [(u64, usize); 3] = [(10, 7), (600, 7), (3600, 25)];

thread_local! {
    /// The put latency of this thread's broker (one per shard thread): fed by the request
    /// timing of `metrics::rpc_latency` for the send codes, so a send reads the clock no more
    /// than any request does.
    static PUT_SINK: RefCell<Weak<RefCell<PutLatency>>> = const { RefCell::new(Weak::new()) };
}

/// Makes `latency` the one this thread's sends are recorded in.
pub fn register_put_sink(latency: &Rc<RefCell<PutLatency>>) {
    PUT_SINK.with(|sink| *sink.borrow_mut() = Rc::downgrade(latency));
}

/// A send answered `micros` after it was taken up (for SYNC_FLUSH: after it was durable).
pub fn record_put(micros: u64) {
    PUT_SINK.with(|sink| {
        if let Some(latency) = sink.borrow().upgrade() {
            latency.borrow_mut().record_micros(micros);
        }
    });
}

/// RocketMQ's PUT_MESSAGE_ENTIRE_TIME_MAX_DESC buckets: upper bounds in ms (the last one
/// open-ended), and their names in `putMessageDistributeTime`.
const PUT_TIME_BOUNDS_MS: [u64; 12] = [
    0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000,
];
const PUT_TIME_NAMES: [&str; 13] = [
    "[<=0ms]",
    "[0~10ms]",
    "[10~50ms]",
    "[50~100ms]",
    "[100~200ms]",
    "[200~500ms]",
    "[500ms~1s]",
    "[1~2s]",
    "[2~3s]",
    "[3~4s]",
    "[4~5s]",
    "[5~10s]",
    "[10s~]",
];

/// The totals at the start of today and of yesterday (UTC days), for RocketMQ's
/// msgPutTotalTodayMorning / YesterdayMorning (its *TodayNow are totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DayMarks {
    /// Days since the epoch of the last sample; None before the first.
    pub day: Option<i64>,
    pub put_today_morning: u64,
    pub put_yesterday_morning: u64,
    pub get_today_morning: u64,
    pub get_yesterday_morning: u64,
}

impl DayMarks {
    /// The marks after a sample at `now_ms` of the totals `puts`, `gets`.
    pub fn advance(self, now_ms: i64, puts: u64, gets: u64) -> DayMarks {
        let day = now_ms.div_euclid(86_400_000);
        match self.day {
            Some(last) if day > last => DayMarks {
                day: Some(day),
                put_today_morning: puts,
                put_yesterday_morning: self.put_today_morning,
                get_today_morning: gets,
                get_yesterday_morning: self.get_today_morning,
            },
            _ => DayMarks {
                day: Some(day),
                ..self
            },
        }
    }
}

/// Counters of the store's work since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub puts: u64,
    /// Pulls that found messages / found none (getFoundTps, getMissTps).
    pub gets_found: u64,
    pub gets_missed: u64,
    /// Messages pulls delivered (getTransferedTps).
    pub transferred: u64,
}

/// The latencies of stores: this minute's and the last full minute's (RocketMQ reports the
/// last minute's distribution and percentiles), and the worst since start.
#[derive(Debug)]
pub struct PutLatency {
    current: hdrhistogram::Histogram<u64>,
    last_minute: hdrhistogram::Histogram<u64>,
    buckets: [u64; 13],
    last_buckets: [u64; 13],
    pub max_ms: u64,
    pub failures: u64,
}

impl Default for PutLatency {
    fn default() -> PutLatency {
        let histogram =
            || hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("bounds");
        PutLatency {
            current: histogram(),
            last_minute: histogram(),
            buckets: [0; 13],
            last_buckets: [0; 13],
            max_ms: 0,
            failures: 0,
        }
    }
}

impl PutLatency {
    pub fn record_micros(&mut self, micros: u64) {
        let _ = self.current.record(micros.max(1));
        let ms = micros / 1000;
        let bucket = crate::metrics::bucket_of(&PUT_TIME_BOUNDS_MS, ms);
        self.buckets[bucket] += 1;
        self.max_ms = self.max_ms.max(ms);
    }

    /// Every minute: this minute becomes the last one.
    pub fn roll_minute(&mut self) {
        std::mem::swap(&mut self.current, &mut self.last_minute);
        self.current.reset();
        self.last_buckets = std::mem::take(&mut self.buckets);
    }

    /// `putMessageDistributeTime`: `[<=0ms]:N [0~10ms]:N … ` as RocketMQ prints it.
    pub fn distribution(&self) -> String {
        PUT_TIME_NAMES
            .iter()
            .zip(self.last_buckets)
            .map(|(name, count)| format!("{name}:{count} "))
            .collect()
    }

    /// `putLatency99` and the like: ms with two decimals, over the last minute.
    pub fn percentile_ms(&self, quantile: f64) -> String {
        let micros = match self.last_minute.len() {
            0 => 0,
            _ => self.last_minute.value_at_quantile(quantile),
        };
        format!("{:.2}", micros as f64 / 1000.0)
    }
}

/// What one stats item counts (StatsItem's value and times), or two that share their key
/// and times (a topic's TOPIC_PUT_NUMS and TOPIC_PUT_SIZE, a group's GROUP_GET_NUMS and
/// GROUP_GET_SIZE: `values` holds the NUMS then the SIZE), sampled as one (`item_family`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ItemCount {
    values: [u64; 2],
    times: u64,
}

#[derive(Debug, Clone, Copy)]
struct ItemSample {
    at_ms: i64,
    count: ItemCount,
}

/// RocketMQ's BrokerStatsItem: one window's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    pub sum: u64,
    pub tps: f64,
    pub avgpt: f64,
}

/// The stats names VIEW_BROKER_STATS_DATA knows (BrokerStatsManager's).
pub const STATS_NAMES: [&str; 7] = [
    "TOPIC_PUT_NUMS",
    "TOPIC_PUT_SIZE",
    "GROUP_GET_NUMS",
    "GROUP_GET_SIZE",
    "SNDBCK_PUT_NUMS",
    "BROKER_PUT_NUMS",
    "BROKER_GET_NUMS",
];

/// The samples of one shard.
#[derive(Debug, Default)]
pub struct StatsHistory {
    /// (time ms, counts), one a second, oldest first.
    seconds: VecDeque<(i64, StoreCounts)>,
    /// (stats name index of the family, key) → its minute, hour and day samples
    /// (`item_family`). Every topic and group the flows keep has one, sampled whether it
    /// moves or not, so its size is per topic: one key and at most 39 samples of 32 bytes.
    items: HashMap<(usize, String), [VecDeque<ItemSample>; 3]>,
    ticks: u64,
}

impl StatsHistory {
    /// One sampler tick (every second): the store counts, and every item whose period is
    /// due. `cluster` keys BROKER_PUT_NUMS / BROKER_GET_NUMS as RocketMQ does.
    pub fn sample(&mut self, now_ms: i64, counts: StoreCounts, flows: &Flows, cluster: &str) {
        if self.seconds.len() == SECOND_SAMPLES_KEPT {
            self.seconds.pop_front();
        }
        self.seconds.push_back((now_ms, counts));
        let tick = self.ticks;
        self.ticks += 1;
        let due: Vec<usize> = (0..ITEM_SAMPLING.len())
            .filter(|window| tick.is_multiple_of(ITEM_SAMPLING[*window].0))
            .collect();
        if due.is_empty() {
            return;
        }
        for (name, key, count) in item_counts(flows, cluster) {
            let rings = self.items.entry((name, key)).or_default();
            for window in &due {
                let (period_s, _) = ITEM_SAMPLING[*window];
                let ring = &mut rings[*window];
                if ring.is_empty() {
                    // As StatsItem's sampling: a new item starts from nothing one period ago.
                    let at_ms = now_ms - period_s as i64 * 1000;
                    let count = ItemCount::default();
                    ring.push_back(ItemSample { at_ms, count });
                }
                let kept = ITEM_SAMPLING[*window].1;
                if ring.len() == kept {
                    ring.pop_front();
                } else if ring.len() == ring.capacity() {
                    // Grown by doubling up to what it keeps, not past it.
                    let want = (ring.len() * 2).clamp(2, kept);
                    ring.reserve_exact(want - ring.len());
                }
                ring.push_back(ItemSample {
                    at_ms: now_ms,
                    count,
                });
            }
        }
    }

    /// RocketMQ's "tps10 tps60 tps600" of one counter: each rate empty until its samples
    /// exist; the rates as Java prints a double.
    pub fn rates(&self, counter: impl Fn(&StoreCounts) -> u64) -> String {
        let rate = |seconds: usize| -> String {
            let Some((last_at, last)) = self.seconds.back() else {
                return String::new();
            };
            if self.seconds.len() <= seconds {
                return String::new();
            }
            let (first_at, first) = &self.seconds[self.seconds.len() - 1 - seconds];
            let elapsed_ms = (last_at - first_at).max(1) as f64;
            let delta = counter(last).saturating_sub(counter(first)) as f64;
            java_double(delta * 1000.0 / elapsed_ms)
        };
        format!("{} {} {}", rate(10), rate(60), rate(600))
    }

    /// The minute, hour and day of one item (None: RocketMQ's "not exist").
    pub fn windows(&self, name: &str, key: &str) -> Option<[Window; 3]> {
        let name = STATS_NAMES.iter().position(|n| *n == name)?;
        let (family, lane) = item_family(name);
        let rings = self.items.get(&(family, key.to_string()))?;
        Some(std::array::from_fn(|window| compute(&rings[window], lane)))
    }
}

/// The family a stats name is sampled in (the index of its first name) and its lane in
/// `ItemCount::values`.
fn item_family(name: usize) -> (usize, usize) {
    match name {
        1 | 3 => (name - 1, 1),
        _ => (name, 0),
    }
}

/// One window of lane `lane` of a ring.
fn compute(ring: &VecDeque<ItemSample>, lane: usize) -> Window {
    let (Some(first), Some(last)) = (ring.front(), ring.back()) else {
        return Window::default();
    };
    let sum = last.count.values[lane].saturating_sub(first.count.values[lane]);
    let elapsed_ms = last.at_ms - first.at_ms;
    // One sample: Java divides by zero (NaN); a rate of nothing yet is 0.
    let tps = if elapsed_ms > 0 {
        sum as f64 * 1000.0 / elapsed_ms as f64
    } else {
        0.0
    };
    let times = last.count.times.saturating_sub(first.count.times);
    let avgpt = if times > 0 {
        sum as f64 / times as f64
    } else {
        0.0
    };
    Window { sum, tps, avgpt }
}

/// Every item family the flows hold now: (stats name index of the family, key, count).
fn item_counts(flows: &Flows, cluster: &str) -> Vec<(usize, String, ItemCount)> {
    let mut items = Vec::new();
    for (topic, flow) in &flows.in_by_topic {
        let count = ItemCount {
            values: [flow.messages, flow.bytes],
            times: flow.calls,
        };
        items.push((0, topic.clone(), count));
    }
    for (topic, groups) in &flows.out_by_group {
        for (group, flow) in groups {
            let count = ItemCount {
                values: [flow.messages, flow.bytes],
                times: flow.calls,
            };
            items.push((2, format!("{topic}@{group}"), count));
        }
    }
    for (key, count) in &flows.sent_back {
        let count = ItemCount {
            values: [*count, 0],
            times: *count,
        };
        items.push((4, key.clone(), count));
    }
    let totals = [(5, flows.in_total), (6, flows.out_total)];
    for (name, flow) in totals {
        let count = ItemCount {
            values: [flow.messages, 0],
            times: flow.calls,
        };
        items.push((name, cluster.to_string(), count));
    }
    items
}

/// A double as Java's `String.valueOf` prints it: `0.0`, `12.5`, `1.2345678E7`.
pub fn java_double(value: f64) -> String {
    if !value.is_finite() {
        return if value.is_nan() {
            "NaN"
        } else if value > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .to_string();
    }
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-3..1e7).contains(&magnitude) {
        let text = format!("{value:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_string()
        } else {
            format!("{mantissa}.0")
        };
        return format!("{mantissa}E{exponent}");
    }
    let text = format!("{value}");
    if text.contains('.') {
        text
    } else {
        format!("{text}.0")
    }
}

/// RocketMQ's `runtime`: `[ 0 days, 1 hours, 2 minutes, 3 seconds ]`.
pub fn format_runtime(elapsed_ms: i64) -> String {
    let seconds = elapsed_ms.max(0) / 1000;
    format!(
        "[ {} days, {} hours, {} minutes, {} seconds ]",
        seconds / 86_400,
        seconds % 86_400 / 3600,
        seconds % 3600 / 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_doubles() {
        assert_eq!(java_double(0.0), "0.0");
        assert_eq!(java_double(12.5), "12.5");
        assert_eq!(java_double(100.0), "100.0");
        assert_eq!(java_double(12_345_678.0), "1.2345678E7");
        assert_eq!(
            format_runtime(90_061_000),
            "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"
        );
    }

    #[test]
    fn rates_are_empty_until_their_samples_exist() {
        let mut history = StatsHistory::default();
        let flows = Flows::default();
        for second in 0..=10 {
            let counts = StoreCounts {
                puts: second * 100,
                ..StoreCounts::default()
            };
            history.sample(second as i64 * 1000, counts, &flows, "c");
        }
        assert_eq!(history.rates(|c| c.puts), "100.0  ");
        assert_eq!(history.rates(|c| c.gets_found), "0.0  ");
    }

    #[test]
    fn items_window_like_stats_item() {
        let mut history = StatsHistory::default();
        let mut flows = Flows::default();
        assert!(history.windows("TOPIC_PUT_NUMS", "T").is_none());
        for second in 0..=20 {
            flows.note_in("T", 10);
            flows.note_in("T", 10);
            history.sample(second * 1000, StoreCounts::default(), &flows, "c");
        }
        // Samples at -10 (nothing, as StatsItem starts a new item), 0, 10 and 20 s: 42
        // messages in 30 s.
        let [minute, hour, _] = history.windows("TOPIC_PUT_NUMS", "T").unwrap();
        assert_eq!(minute.sum, 42);
        assert!((minute.tps - 1.4).abs() < 1e-9, "{minute:?}");
        assert_eq!(minute.avgpt, 1.0);
        assert_eq!(hour.sum, 2, "the hour's first sample, over its zero start");
        let [size, _, _] = history.windows("TOPIC_PUT_SIZE", "T").unwrap();
        assert_eq!(size.sum, 420);
        assert!(history.windows("BROKER_PUT_NUMS", "c").is_some());
        assert!(history.windows("NO_SUCH", "T").is_none());
    }

    #[test]
    fn put_latency_distribution_rolls_each_minute() {
        let mut latency = PutLatency::default();
        latency.record_micros(300);
        latency.record_micros(20_000);
        assert!(latency.distribution().starts_with("[<=0ms]:0 "));
        latency.roll_minute();
        assert!(latency
            .distribution()
            .starts_with("[<=0ms]:1 [0~10ms]:0 [10~50ms]:1 "));
        assert_eq!(latency.max_ms, 20);
        let p99: f64 = latency.percentile_ms(0.99).parse().unwrap();
        assert!((p99 - 20.0).abs() < 0.3, "{p99}");
    }
}
