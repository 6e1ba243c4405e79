//! Commitlog space: how far ahead of the write position segment space is reserved on disk, and
//! whether a full disk refuses writes.
//!
//! Lives inside the store's `LogState`, on its shard. The rule that keeps an acknowledged
//! message safe on a full disk: an append must end at or below `allocated_end`, and every byte
//! below it lies in an existing segment file whose blocks are allocated (fallocate). A flush
//! then never needs a new block, so it succeeds whatever the disk's free space, and so does
//! the final flush of a clean stop. The flusher keeps `allocated_end` about
//! `allocation_window_bytes` ahead of the write position (never past the end of the segment
//! after the current one); the space past it stays a hole, so disk use follows the data.
//!
//! A full disk is a state, not a poison. Allocation that fails for want of resources
//! (ENOSPC, EMFILE, …) is tried again after `ALLOCATION_RETRY_MS`; appends go on while they
//! fit below `allocated_end` (the current segment is used to its end), then are refused with
//! `DiskFull`. A data write refused with ENOSPC (only where fallocate is not supported) keeps
//! its bytes in the tail and is tried again after `FLUSH_RETRY_MS`, appends refused meanwhile.
//! Each state clears by itself when the retry succeeds. The broker's disk monitor adds a third
//! cause (`over_ratio`: the disk is past its warning ratio), cleared by the monitor.

use std::time::{Duration, Instant};

use super::segments::{align_down, align_up, BLOCK_BYTES};

/// Default segment space kept allocated (and, when the store is quiet, zero-filled) ahead of
/// the write position.
pub const ALLOCATION_WINDOW_DEFAULT_BYTES: u64 = 128 << 20;
/// Wait before allocation is tried again after it failed for want of resources.
pub const ALLOCATION_RETRY_MS: u64 = 1_000;
/// Wait before a flush is tried again after the disk refused its write for want of space.
pub const FLUSH_RETRY_MS: u64 = 1_000;
/// Segment files allocation may run ahead of the current one, at most (binds only for
/// segments smaller than a 64th of the window: tests).
pub const ALLOCATION_SEGMENTS_AHEAD_MAX: u64 = 64;
/// Smallest piece allocation falls back to when the whole window does not fit on the disk
/// (the last free space is used in pieces down to this size).
pub const ALLOCATION_PIECE_MIN_BYTES: u64 = 1 << 20;

const _: () = assert!(ALLOCATION_WINDOW_DEFAULT_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(ALLOCATION_PIECE_MIN_BYTES.is_multiple_of(BLOCK_BYTES));

/// What refuses writes for want of space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FullCause {
    /// Segment space could not be allocated ahead of the writes.
    Allocation,
    /// A data write found the disk full.
    Write,
}

pub(crate) struct Space {
    /// Every commitlog byte below this offset is in an existing, allocated segment file.
    pub(crate) allocated_end: u64,
    /// Bytes kept allocated ahead of the write position (`StoreConfig`).
    window_bytes: u64,
    /// Why the disk refuses writes, if it does.
    pub(crate) full: Option<(FullCause, String)>,
    /// The broker's disk monitor found the disk past its warning ratio (its remark).
    pub(crate) over_ratio: Option<String>,
    /// Allocation failed: not tried again before this.
    pub(crate) allocation_retry_at: Option<Instant>,
    /// A data write found the disk full: the flush is not tried again before this.
    pub(crate) flush_retry_at: Option<Instant>,
    /// Times writes were refused for space (appends refused, not counted per append).
    pub(crate) full_events: u64,
    /// Used fraction of the store's filesystem when last measured (refusals report it).
    pub(crate) used_ratio: f64,
}

impl Space {
    pub(crate) fn new(allocated_end: u64, window_bytes: u64) -> Space {
        Space {
            allocated_end,
            window_bytes,
            full: None,
            over_ratio: None,
            allocation_retry_at: None,
            flush_retry_at: None,
            full_events: 0,
            used_ratio: 0.0,
        }
    }

    /// Where allocation aims for a write position at `end`: the window ahead of it, but never
    /// more than `ALLOCATION_SEGMENTS_AHEAD_MAX` segment files ahead.
    pub(crate) fn target(&self, end: u64, segment_size_bytes: u64) -> u64 {
        let files_limit = align_down(end, segment_size_bytes)
            + (1 + ALLOCATION_SEGMENTS_AHEAD_MAX) * segment_size_bytes;
        (align_up(end, BLOCK_BYTES) + self.window_bytes).min(files_limit)
    }

    /// Whether the flusher should allocate now: less than half the window is left ahead of
    /// `end` (or the end crossed into a segment the target does not cover yet), and no retry
    /// wait is under way.
    pub(crate) fn allocation_due(&self, end: u64, segment_size_bytes: u64, now: Instant) -> bool {
        if self.allocation_retry_at.is_some_and(|at| now < at) {
            return false;
        }
        let target = self.target(end, segment_size_bytes);
        let low = align_up(end, BLOCK_BYTES) + self.window_bytes / 2;
        self.allocated_end < target && self.allocated_end < low.min(target)
    }

    /// The error an append ending at `needed_end` gets, if it may not be made.
    pub(crate) fn refusal(&self, needed_end: u64) -> Option<super::StoreError> {
        let full = |why: &str| super::StoreError::DiskFull {
            used_ratio: self.used_ratio,
            reason: why.to_string(),
        };
        if let Some(remark) = &self.over_ratio {
            return Some(full(remark));
        }
        if let Some((FullCause::Write, why)) = &self.full {
            return Some(full(why));
        }
        if needed_end <= self.allocated_end {
            return None;
        }
        Some(match &self.full {
            Some((_, why)) => full(why),
            None => super::StoreError::SpaceNotReady {
                needed_end,
                allocated_end: self.allocated_end,
            },
        })
    }

    /// A store emptied in process starts again at `offset` (`reset.rs`): nothing is
    /// allocated in its new files yet, and a data write the disk refused is gone with the
    /// data (its refusal with it). A refusal of allocation and the disk monitor's stay.
    pub(crate) fn reset_to(&mut self, offset: u64) {
        self.allocated_end = offset;
        self.flush_retry_at = None;
        self.clear(FullCause::Write);
    }

    /// Records that `cause` refuses writes; true when that is news (log it then, not on
    /// every retry).
    pub(crate) fn set_full(&mut self, cause: FullCause, why: String) -> bool {
        let news = self.full.as_ref().is_none_or(|(c, _)| *c != cause);
        if news {
            self.full_events += 1;
        }
        self.full = Some((cause, why));
        news
    }

    /// A retry of `cause` succeeded: true when that cleared the full state.
    pub(crate) fn clear(&mut self, cause: FullCause) -> bool {
        if self.full.as_ref().is_some_and(|(c, _)| *c == cause) {
            self.full = None;
            return true;
        }
        false
    }

    /// Whether writes are refused now for want of space, and why.
    pub(crate) fn refusing(&self) -> Option<&str> {
        self.over_ratio
            .as_deref()
            .or(self.full.as_ref().map(|(_, why)| why.as_str()))
    }

    pub(crate) fn retry_delay(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocation_keeps_a_window_ahead_within_the_next_segment() {
        let space = Space::new(0, 128 * MIB);
        let now = Instant::now();
        assert_eq!(space.target(0, 1024 * MIB), 128 * MIB);
        assert!(space.allocation_due(0, 1024 * MIB, now));
        assert_eq!(space.target(0, 64 * MIB), 128 * MIB, "across segments");
        assert_eq!(space.target(100 * MIB + 1, 64 * MIB), 228 * MIB + 4096);
        assert_eq!(
            space.target(0, 64 << 10),
            65 * (64 << 10),
            "a bounded number of files"
        );
        let mut ahead = Space::new(128 * MIB, 128 * MIB);
        assert!(
            !ahead.allocation_due(10 * MIB, 1024 * MIB, now),
            "most of the window left"
        );
        assert!(
            ahead.allocation_due(70 * MIB, 1024 * MIB, now),
            "less than half left"
        );
        ahead.allocation_retry_at = Some(now + Duration::from_secs(1));
        assert!(
            !ahead.allocation_due(70 * MIB, 1024 * MIB, now),
            "waits for its retry"
        );
    }

    #[test]
    fn appends_fit_below_the_allocated_end_even_when_the_disk_is_full() {
        let mut space = Space::new(64 * MIB, 128 * MIB);
        assert!(space.refusal(64 * MIB).is_none());
        assert!(matches!(
            space.refusal(64 * MIB + 1),
            Some(super::super::StoreError::SpaceNotReady { .. })
        ));
        assert!(space.set_full(FullCause::Allocation, "ENOSPC".into()));
        assert!(
            !space.set_full(FullCause::Allocation, "ENOSPC".into()),
            "no news"
        );
        assert!(
            space.refusal(64 * MIB).is_none(),
            "the current segment is used to its end"
        );
        assert!(matches!(
            space.refusal(64 * MIB + 1),
            Some(super::super::StoreError::DiskFull { .. })
        ));
        assert!(!space.clear(FullCause::Write), "another cause");
        assert!(space.clear(FullCause::Allocation));
        space.set_full(FullCause::Write, "write ENOSPC".into());
        assert!(
            space.refusal(1).is_some(),
            "a failing write refuses every append"
        );
        space.clear(FullCause::Write);
        space.over_ratio = Some("disk 91% used".into());
        assert!(space.refusal(1).is_some());
        assert_eq!(space.refusing(), Some("disk 91% used"));
    }
}
