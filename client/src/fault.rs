//! Send-side broker selection (Java `MQFaultStrategy` + `LatencyFaultToleranceImpl`): after
//! each send the producer records the broker's latency; a slow or failed broker is kept out of
//! the rotation for a while that grows with its latency, and a retry avoids the broker the
//! previous attempt used.
//!
//! | latency at least (ms) | 50 | 100 | 550 | 1000 | 2000 | 3000 | 15000 |
//! |---|---|---|---|---|---|---|---|
//! | unavailable for (ms)  | 0  | 0   | 30000 | 60000 | 120000 | 180000 | 600000 |
//!
//! A failed send (no answer, connection refused) counts as [`ISOLATION_LATENCY_MS`], which
//! isolates the broker for the longest period. Shared by the tasks of one producer (a mutex
//! held for a map lookup).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::instance::lock;
use super::message::{now_ms, random_u32, MessageQueue};

/// Latency thresholds, ascending.
const LATENCY_MAX_MS: [i64; 7] = [50, 100, 550, 1_000, 2_000, 3_000, 15_000];
/// How long a broker is skipped once its latency reached the threshold at the same index.
const NOT_AVAILABLE_DURATION_MS: [i64; 7] = [0, 0, 30_000, 60_000, 120_000, 180_000, 600_000];
/// The latency a failed send counts as.
pub const ISOLATION_LATENCY_MS: i64 = 30_000;

const _: () = assert!(LATENCY_MAX_MS.len() == NOT_AVAILABLE_DURATION_MS.len());

#[derive(Debug, Clone, Copy)]
struct FaultItem {
    available_from_ms: i64,
}

/// Per-broker latency records and the queue rotation.
#[derive(Debug, Default)]
pub struct LatencyFaultTolerance {
    items: Mutex<HashMap<String, FaultItem>>,
    next_queue: AtomicU32,
}

impl LatencyFaultTolerance {
    pub fn new() -> LatencyFaultTolerance {
        LatencyFaultTolerance {
            items: Mutex::default(),
            next_queue: AtomicU32::new(random_u32()),
        }
    }

    /// Records a send to `broker_name` that took `latency_ms` (or failed: `isolate`).
    pub fn update(&self, broker_name: &str, latency_ms: i64, isolate: bool) {
        self.update_at(broker_name, latency_ms, isolate, now_ms());
    }

    fn update_at(&self, broker_name: &str, latency_ms: i64, isolate: bool, now: i64) {
        let latency_ms = if isolate {
            ISOLATION_LATENCY_MS
        } else {
            latency_ms
        };
        let duration = not_available_duration_ms(latency_ms);
        lock(&self.items).insert(
            broker_name.to_string(),
            FaultItem {
                available_from_ms: now + duration,
            },
        );
    }

    fn is_available_at(&self, broker_name: &str, now: i64) -> bool {
        lock(&self.items)
            .get(broker_name)
            .is_none_or(|item| now >= item.available_from_ms)
    }

    /// Picks a queue of `queues` (not empty): the next one in rotation whose broker is
    /// available and is not `avoid`; failing that, one of an available broker; failing that,
    /// one not on `avoid`; failing that, the next in rotation.
    pub fn select(
        &self,
        queues: &[MessageQueue],
        avoid: Option<&str>,
        use_latency: bool,
    ) -> MessageQueue {
        self.select_at(queues, avoid, use_latency, now_ms())
    }

    fn select_at(
        &self,
        queues: &[MessageQueue],
        avoid: Option<&str>,
        use_latency: bool,
        now: i64,
    ) -> MessageQueue {
        assert!(!queues.is_empty(), "callers check for an empty route");
        let count = queues.len();
        let start = self.next_queue.fetch_add(1, Ordering::Relaxed) as usize;
        let candidates = (0..count).map(|step| &queues[(start + step) % count]);
        let not_avoided = |q: &&MessageQueue| avoid != Some(q.broker_name.as_str());
        let available =
            |q: &&MessageQueue| !use_latency || self.is_available_at(&q.broker_name, now);
        let chosen = candidates
            .clone()
            .find(|q| not_avoided(q) && available(q))
            .or_else(|| candidates.clone().find(available))
            .or_else(|| candidates.clone().find(not_avoided))
            .unwrap_or(&queues[start % count]);
        chosen.clone()
    }
}

fn not_available_duration_ms(latency_ms: i64) -> i64 {
    LATENCY_MAX_MS
        .iter()
        .rposition(|threshold| latency_ms >= *threshold)
        .map_or(0, |index| NOT_AVAILABLE_DURATION_MS[index])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues() -> Vec<MessageQueue> {
        ["a", "b"]
            .iter()
            .flat_map(|broker| {
                (0..2).map(move |queue_id| MessageQueue {
                    topic: "T".into(),
                    broker_name: broker.to_string(),
                    queue_id,
                })
            })
            .collect()
    }

    #[test]
    fn durations_follow_the_table() {
        assert_eq!(not_available_duration_ms(10), 0);
        assert_eq!(not_available_duration_ms(100), 0);
        assert_eq!(not_available_duration_ms(600), 30_000);
        assert_eq!(not_available_duration_ms(2_500), 120_000);
        assert_eq!(not_available_duration_ms(ISOLATION_LATENCY_MS), 600_000);
    }

    #[test]
    fn a_failed_broker_is_skipped_until_its_time_passes() {
        let fault = LatencyFaultTolerance::new();
        fault.update_at("a", 0, true, 1_000);
        for _ in 0..8 {
            let queue = fault.select_at(&queues(), None, true, 2_000);
            assert_eq!(queue.broker_name, "b");
        }
        assert!(fault.is_available_at("a", 1_000 + 600_000));
        // Fast brokers stay available.
        fault.update_at("b", 20, false, 2_000);
        assert!(fault.is_available_at("b", 2_000));
    }

    #[test]
    fn a_retry_avoids_the_last_broker_and_falls_back_when_all_are_down() {
        let fault = LatencyFaultTolerance::new();
        for _ in 0..8 {
            assert_eq!(
                fault.select_at(&queues(), Some("a"), false, 0).broker_name,
                "b"
            );
        }
        fault.update_at("a", 0, true, 0);
        fault.update_at("b", 0, true, 0);
        // Everything is isolated: still pick something, preferring not the last broker.
        assert_eq!(
            fault.select_at(&queues(), Some("b"), true, 1).broker_name,
            "a"
        );
        let single = &queues()[..1];
        assert_eq!(fault.select_at(single, Some("a"), true, 1).broker_name, "a");
    }
}
