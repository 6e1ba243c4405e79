//! Rate limits for repeated log lines: the first occurrence is logged at once, repeats at
//! most once per interval with the count of those left out, so a failure that repeats every
//! millisecond (an accept loop out of descriptors, a disk that stays full) writes a line a
//! minute, not a thousand a second. Plain state, owned by whoever logs (one shard).

use std::time::{Duration, Instant};

/// Default shortest gap between two lines of one throttled message.
pub const LOG_REPEAT_INTERVAL_MS: u64 = 60_000;

/// One throttled message.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl Default for LogThrottle {
    fn default() -> Self {
        LogThrottle::new(Duration::from_millis(LOG_REPEAT_INTERVAL_MS))
    }
}

impl LogThrottle {
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval,
            last_logged: None,
            suppressed: 0,
        }
    }

    /// Whether to log an occurrence at `now`: `Some(n)` with the `n` occurrences left out
    /// since the last line, `None` to leave this one out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            self.suppressed += 1;
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// The message's suffix for `left_out` repeats (empty for none).
    pub fn repeats(left_out: u64) -> String {
        match left_out {
            0 => String::new(),
            n => format!(" ({n} more like this since the last line)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_at_once_then_one_per_interval_with_the_count() {
        let mut throttle = LogThrottle::new(Duration::from_secs(60));
        let start = Instant::now();
        assert_eq!(throttle.allow(start), Some(0));
        for i in 1..=5 {
            assert_eq!(throttle.allow(start + Duration::from_secs(i)), None);
        }
        assert_eq!(throttle.allow(start + Duration::from_secs(61)), Some(5));
        assert_eq!(
            LogThrottle::repeats(5),
            " (5 more like this since the last line)"
        );
        assert_eq!(LogThrottle::repeats(0), "");
    }
}
