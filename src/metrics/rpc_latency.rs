//! `rocketmq_rpc_latency`: how long requests take, from the moment their frame is dispatched
//! to the moment their answer is in the connection's output buffer, by request code, response
//! code and whether the request was parked for long polling, as RocketMQ 5's
//! `RemotingMetricsManager` counts it (`NettyRemotingAbstract.writeResponse`: milliseconds,
//! its buckets, labels `request_code`, `response_code`, `is_long_polling`).
//!
//! Counted per shard on the shard's own thread, in a thread-local table of plain cells: the
//! read loop (`server::dispatch`) reads the clock before it hands a frame to the handler, and
//! the connection records the latency when the answer's frame is written into its output
//! (`Connection::time_answers` reads the code and opaque back from the frame), whether during
//! the call or later. The hot path costs one `Instant` read, the read-back of the frame's
//! head and one increment; the shard's publisher copies the table once a second.
//!
//! Codes below `REQUEST_CODE_SLOTS` get their own row; any other code is counted in the last
//! row, rendered as `request_code="other"`. Each row holds one histogram per (response code,
//! long polling) it has seen (a handful). Oneway requests have no answer and are not counted
//! (RocketMQ records the latency when it writes a response).

use std::cell::RefCell;
use std::time::Instant;

use crate::remoting::request_code;

/// Requests that store messages (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE): their
/// latency is also the broker's put latency (GET_BROKER_RUNTIME_INFO's putLatency99, …).
pub const SEND_CODES: [i32; 3] = [
    request_code::SEND_MESSAGE,
    request_code::SEND_MESSAGE_V2,
    request_code::SEND_BATCH_MESSAGE,
];

/// RocketMQ 5's buckets of `rocketmq_rpc_latency` (milliseconds).
pub const RPC_LATENCY_BUCKETS_MS: [u64; 9] = [1, 3, 5, 7, 10, 100, 1_000, 2_000, 3_000];

/// Request codes with a row of their own: RocketMQ's broker, namesrv and controller codes all
/// fall below it (its 2000xx codes and unknown ones share the last row). 1,025 rows of 12
/// words: about 100 KiB per shard.
pub const REQUEST_CODE_SLOTS: usize = 1024;

/// The row of codes without one of their own.
const OTHER_ROW: usize = REQUEST_CODE_SLOTS;

/// Counts of request latencies per bucket (the last one: longer than every bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub buckets: [u64; RPC_LATENCY_BUCKETS_MS.len() + 1],
    pub sum_ms: u64,
    pub count: u64,
}

impl LatencyHistogram {
    pub fn record(&mut self, elapsed_ms: u64) {
        let bucket = super::bucket_of(&RPC_LATENCY_BUCKETS_MS, elapsed_ms);
        self.buckets[bucket] += 1;
        self.sum_ms += elapsed_ms;
        self.count += 1;
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.sum_ms += other.sum_ms;
        self.count += other.count;
    }

    /// The latency under which `quantile` (0..=1) of the requests fell, in milliseconds,
    /// interpolated linearly inside its bucket as Prometheus' `histogram_quantile` does; the
    /// open last bucket answers its lower bound. None when nothing was counted.
    pub fn quantile_ms(&self, quantile: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = quantile.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (index, count) in self.buckets.iter().enumerate() {
            let lower = if index == 0 {
                0.0
            } else {
                RPC_LATENCY_BUCKETS_MS[index - 1] as f64
            };
            let Some(upper) = RPC_LATENCY_BUCKETS_MS.get(index) else {
                return Some(lower);
            };
            if *count > 0 && (below + count) as f64 >= rank {
                let inside = (rank - below as f64) / *count as f64;
                return Some(lower + (*upper as f64 - lower) * inside);
            }
            below += count;
        }
        Some(*RPC_LATENCY_BUCKETS_MS.last().unwrap_or(&0) as f64)
    }
}

/// One row's histograms: (response code, long polling, histogram), in the order first seen.
type Row = Vec<(i32, bool, LatencyHistogram)>;

/// One shard's histograms, one row per request code (see the module doc).
struct RpcLatencyTable {
    rows: Vec<Row>,
}

thread_local! {
    static TABLE: RefCell<RpcLatencyTable> = RefCell::new(RpcLatencyTable {
        rows: vec![Row::new(); REQUEST_CODE_SLOTS + 1],
    });
}

/// A request of `request_code` dispatched at `started` has been answered at `answered` with
/// `response_code`; `long_polling`: it was parked waiting for messages. (`answered` is taken
/// once for all the answers written together: a SYNC_FLUSH group commit answers dozens.)
pub fn record(
    request_code: i32,
    response_code: i32,
    long_polling: bool,
    started: Instant,
    answered: Instant,
) {
    let elapsed = answered.saturating_duration_since(started);
    let elapsed_ms = elapsed.as_millis() as u64;
    if SEND_CODES.contains(&request_code) {
        crate::broker::store_stats::record_put(elapsed.as_micros() as u64);
    }
    let row = usize::try_from(request_code)
        .ok()
        .filter(|code| *code < REQUEST_CODE_SLOTS)
        .unwrap_or(OTHER_ROW);
    TABLE.with(|table| {
        let row = &mut table.borrow_mut().rows[row];
        let key = |(code, polling, _): &&mut (i32, bool, LatencyHistogram)| {
            *code == response_code && *polling == long_polling
        };
        match row.iter_mut().find(key) {
            Some((_, _, histogram)) => histogram.record(elapsed_ms),
            None => {
                let mut histogram = LatencyHistogram::default();
                histogram.record(elapsed_ms);
                row.push((response_code, long_polling, histogram));
            }
        }
    });
}

/// The request code a row is rendered with (None: the row of other codes).
pub type RequestCode = Option<i32>;

/// One histogram of the table: the requests of one code answered with one code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcSeries {
    pub request_code: RequestCode,
    pub response_code: i32,
    pub long_polling: bool,
    pub histogram: LatencyHistogram,
}

/// This thread's histograms, by request code, response code and long polling.
pub fn snapshot() -> Vec<RpcSeries> {
    TABLE.with(|table| {
        let table = table.borrow();
        let rows = table.rows.iter().enumerate();
        rows.flat_map(|(index, row)| {
            let request_code = (index != OTHER_ROW).then_some(index as i32);
            row.iter()
                .map(move |(response_code, long_polling, histogram)| RpcSeries {
                    request_code,
                    response_code: *response_code,
                    long_polling: *long_polling,
                    histogram: *histogram,
                })
        })
        .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_rocketmq_5s_and_quantiles_interpolate() {
        let mut histogram = LatencyHistogram::default();
        assert_eq!(histogram.quantile_ms(0.5), None);
        for elapsed_ms in [0, 1, 2, 3, 4, 4, 8, 50, 5_000, 9_000] {
            histogram.record(elapsed_ms);
        }
        assert_eq!(histogram.buckets, [2, 2, 2, 0, 1, 1, 0, 0, 0, 2]);
        assert_eq!(histogram.count, 10);
        assert_eq!(histogram.sum_ms, 14_072);
        // Rank 5 of 10: the first of the (3, 5] bucket's two → halfway in it.
        assert_eq!(histogram.quantile_ms(0.5), Some(4.0));
        // Rank 9.9: in the open bucket, which answers its lower bound.
        assert_eq!(histogram.quantile_ms(0.99), Some(3_000.0));
        let mut merged = LatencyHistogram::default();
        merged.merge(&histogram);
        merged.merge(&histogram);
        assert_eq!(merged.count, 20);
        assert_eq!(merged.quantile_ms(0.5), histogram.quantile_ms(0.5));
    }

    #[test]
    fn the_table_counts_by_code_with_one_row_for_others() {
        let started = Instant::now();
        record(10, 0, false, started, Instant::now());
        record(10, 0, false, started, Instant::now());
        record(10, 2, false, started, Instant::now());
        record(11, 19, true, started, Instant::now());
        record(90_000, 0, false, started, Instant::now());
        record(-1, 0, false, started, Instant::now());
        let rows = snapshot();
        let counts: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.request_code,
                    r.response_code,
                    r.long_polling,
                    r.histogram.count,
                )
            })
            .collect();
        assert_eq!(
            counts,
            [
                (Some(10), 0, false, 2),
                (Some(10), 2, false, 1),
                (Some(11), 19, true, 1),
                (None, 0, false, 2)
            ]
        );
    }
}
