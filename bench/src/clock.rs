//! One time base for a run: monotonic instants for intervals and latencies, turned into Unix
//! microseconds where a time crosses the wire (BENCH_SENT_US), so that the producer's stamp
//! and the consumer's receipt in one process are compared on one clock.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::send_frame::{BORN_TIMESTAMP_MIN_MS, SENT_MICROS_MIN};

/// The run's start, on both clocks.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    pub start: Instant,
    start_unix_micros: u64,
}

impl RunClock {
    pub fn start_now() -> RunClock {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        RunClock {
            start: Instant::now(),
            start_unix_micros: u64::try_from(since_epoch.as_micros())
                .unwrap_or(u64::MAX)
                .max(SENT_MICROS_MIN),
        }
    }

    /// `at` in Unix microseconds (at or after the run's start).
    pub fn unix_micros(&self, at: Instant) -> u64 {
        let since_start = at.saturating_duration_since(self.start);
        self.start_unix_micros + since_start.as_micros() as u64
    }

    /// `at` in Unix milliseconds, never below the 13-digit range the templates hold.
    pub fn unix_millis(&self, at: Instant) -> u64 {
        (self.unix_micros(at) / 1000).max(BORN_TIMESTAMP_MIN_MS)
    }

    /// Time from `unix_micros` (a stamp) to `at`; zero when the stamp is later.
    pub fn since_unix_micros(&self, unix_micros: u64, at: Instant) -> Duration {
        Duration::from_micros(self.unix_micros(at).saturating_sub(unix_micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_map_to_unix_time_and_back() {
        let clock = RunClock::start_now();
        let later = clock.start + Duration::from_millis(1500);
        let micros = clock.unix_micros(later);
        assert_eq!(micros - clock.unix_micros(clock.start), 1_500_000);
        assert_eq!(clock.unix_millis(later), micros / 1000);
        let stamp = clock.unix_micros(clock.start + Duration::from_millis(500));
        assert_eq!(
            clock.since_unix_micros(stamp, later),
            Duration::from_millis(1000)
        );
        assert_eq!(clock.since_unix_micros(micros + 5, later), Duration::ZERO);
    }
}
