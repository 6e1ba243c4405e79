//! Retention: which commitlog segments may go, and deleting them without stalling the shard.
//!
//! The policy is RocketMQ's `CleanCommitLogService` (CAPABILITIES.md §1.1), with its names and
//! defaults, and pure: `RetentionConfig` says from the disk's used ratio, the hour and the
//! segment's age what may be deleted; the broker's retention task (one per shard) asks it every
//! `cleanResourceInterval` and deletes with `Store::delete_oldest_segment`, one segment at a
//! time, `deleteCommitLogFilesInterval` apart.
//!
//! | Setting | Default | Meaning |
//! |---|---|---|
//! | `fileReservedTime` | 72 h | a segment expires this long after its last write (file mtime) |
//! | `deleteWhen` | "04" | hours of the day (`;`-separated) when expired segments go |
//! | `diskMaxUsedSpaceRatio` | 75 % | above it, expired segments go at any hour |
//! | `diskSpaceCleanForciblyRatio` | 85 % | above it, the oldest segments go even when not expired |
//! | `diskSpaceWarningLevelRatio` | 90 % | above it, appends are refused (`Store::set_over_ratio`) |
//! | `cleanFileForciblyEnable` | true | allows the forced deletion |
//! | `segmentRecycleEnable` | true | shardmq's own: allows recycling (below) |
//!
//! Deletion (`delete_oldest`): only a sealed segment goes (every byte of it durable, appends
//! past its end, and never the last file), oldest first, and only once the synced checkpoint
//! on disk counts the consume-queue units of all its records (`FlushState::synced_covers`;
//! one is asked for when it does not yet). After a power loss recovery starts from that
//! checkpoint, and units it does not count are neither trusted (their files may not have
//! reached the disk) nor rebuilt from records retention took: such a queue came back shorter,
//! or not at all, and its next message took an offset consumers had already passed. While
//! checkpoints fail for want of space (a full disk) deletion goes on without that wait. In
//! one synchronous step the segment leaves the table, the commitlog's minimum offset moves to
//! the next one, and the consume queues and the message index drop the files that only point
//! below it (each queue's minimum offset moves to its first unit still held, so pulls below
//! it get OffsetTooSmall from then on). The files are then removed on the shard's helper
//! thread: the shard keeps an extra descriptor of the segment so that neither its own close
//! nor the unlink frees the blocks (what takes time for a 1 GiB file); the helper thread's
//! close does.
//!
//! Recycling: when the caller allows it (a master whose disk is below
//! `diskMaxUsedSpaceRatio`, deleting an expired segment, with `segmentRecycleEnable`), the
//! segment's file is not removed
//! but renamed to the segment after the last one, `<start>.recycled` (`segments.rs`), and
//! made durable there, while fewer than `recycled_ahead_max` segments lie ahead of the one
//! being written. Writes then land on blocks the disk has written before: over space only
//! fallocated, each durable write also commits the conversion of its extents to the journal
//! (ext4), which made SYNC_FLUSH 1.5-1.6x slower than the same writes over written blocks on
//! this project's VMs (docs/performance.md). The bytes past the log's end in such a file are
//! its earlier life's records, not zeros, so a torn write there cannot be told by its zeros:
//! every record in a recycled segment carries a seal, a CRC32 over all its bytes
//! (`record::encode_sealed_to`), which recovery requires there (`recovery.rs`). The disk's
//! use then stays what retention keeps plus those few files; past `diskMaxUsedSpaceRatio`
//! expired segments are deleted, as before. A store opened without
//! `StoreConfig::keep_recycled_segments` (a slave's, or with recycling off) turns the recycled
//! files it finds back into plain segments (`recovery::plain_again`).

use std::io;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use super::segments::{align_down, recycled_name, segment_name, sync_dir};
use super::{Inner, StoreError};
use crate::runtime::{self, fs::DirectFile};
use crate::types::CommitLogOffset;

/// Most segments one retention run deletes (RocketMQ's deleteFileBatchMax).
pub const DELETE_FILES_BATCH_MAX: usize = 10;
/// Runs a manual trigger (DELETE_EXPIRED_COMMITLOG, TRIGGER_DELETE_FILES) lasts (RocketMQ's
/// MAX_MANUAL_DELETE_FILE_TIMES).
pub const MANUAL_DELETE_RUNS: u32 = 20;
/// How long a deletion waits for reads still using the segment before closing it anyway.
pub const READERS_WAIT_MS: u64 = 2_000;

/// Bounds of the ratios, in percent; values outside are refused. RocketMQ clamps the warning
/// ratio to 35..=90 and the forced one to 30..=85; shardmq lets both go higher, because its
/// disk filled to the last block refuses sends without losing or poisoning anything
/// (`space.rs`), so an operator may use more of the disk than a Java broker can.
pub const DISK_MAX_USED_SPACE_RATIO_RANGE: (u32, u32) = (10, 95);
pub const DISK_SPACE_CLEAN_FORCIBLY_RATIO_RANGE: (u32, u32) = (30, 98);
pub const DISK_SPACE_WARNING_LEVEL_RATIO_RANGE: (u32, u32) = (35, 99);

/// One shard's retention settings, RocketMQ's names in the comments.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// `fileReservedTime`, hours (fractions allowed).
    pub file_reserved_time_hours: f64,
    /// `deleteWhen`: hours of the day (0..=23).
    pub delete_when_hours: Vec<u8>,
    /// `diskMaxUsedSpaceRatio`, percent.
    pub disk_max_used_space_ratio: u32,
    /// `diskSpaceCleanForciblyRatio`, percent.
    pub disk_space_clean_forcibly_ratio: u32,
    /// `diskSpaceWarningLevelRatio`, percent.
    pub disk_space_warning_level_ratio: u32,
    /// `cleanFileForciblyEnable`.
    pub clean_file_forcibly_enable: bool,
    /// `cleanResourceInterval`, ms.
    pub clean_resource_interval_ms: u64,
    /// `deleteCommitLogFilesInterval`, ms.
    pub delete_commit_log_files_interval_ms: u64,
    /// `segmentRecycleEnable` (shardmq's own): whether a master whose disk has room gives an
    /// expired segment's file to a later segment instead of removing it.
    pub segment_recycle_enable: bool,
}

impl Default for RetentionConfig {
    fn default() -> RetentionConfig {
        RetentionConfig {
            file_reserved_time_hours: 72.0,
            delete_when_hours: vec![4],
            disk_max_used_space_ratio: 75,
            disk_space_clean_forcibly_ratio: 85,
            disk_space_warning_level_ratio: 90,
            clean_file_forcibly_enable: true,
            clean_resource_interval_ms: 10_000,
            delete_commit_log_files_interval_ms: 100,
            segment_recycle_enable: true,
        }
    }
}

/// What the disk's used ratio asks of retention (RocketMQ's isSpaceToDelete).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskVerdict {
    /// Past `diskSpaceWarningLevelRatio`: refuse appends.
    pub refuse_writes: bool,
    /// Past `diskSpaceCleanForciblyRatio` (and forced deletion enabled): delete the oldest
    /// segments even when not expired.
    pub clean_immediately: bool,
    /// Past `diskMaxUsedSpaceRatio`: delete expired segments whatever the hour.
    pub space_to_delete: bool,
}

/// `deleteWhen`: hours of the day separated by `;` ("04", "04;05").
pub fn parse_delete_when(text: &str) -> Result<Vec<u8>, String> {
    let mut hours = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u8>() {
            Ok(hour) if hour < 24 => hours.push(hour),
            _ => {
                return Err(format!(
                    "deleteWhen {text:?}: {part:?} is not an hour of the day (0..=23)"
                ))
            }
        }
    }
    if hours.is_empty() {
        return Err(format!("deleteWhen {text:?} names no hour"));
    }
    Ok(hours)
}

impl RetentionConfig {
    pub fn validate(&self) -> Result<(), String> {
        let hours = self.file_reserved_time_hours;
        if !hours.is_finite() || hours <= 0.0 || hours > 24.0 * 365.0 * 100.0 {
            return Err(format!(
                "fileReservedTime {hours} must be a positive number of hours"
            ));
        }
        let ratios = [
            (
                "diskMaxUsedSpaceRatio",
                self.disk_max_used_space_ratio,
                DISK_MAX_USED_SPACE_RATIO_RANGE,
            ),
            (
                "diskSpaceCleanForciblyRatio",
                self.disk_space_clean_forcibly_ratio,
                DISK_SPACE_CLEAN_FORCIBLY_RATIO_RANGE,
            ),
            (
                "diskSpaceWarningLevelRatio",
                self.disk_space_warning_level_ratio,
                DISK_SPACE_WARNING_LEVEL_RATIO_RANGE,
            ),
        ];
        for (name, value, (low, high)) in ratios {
            if !(low..=high).contains(&value) {
                return Err(format!(
                    "{name} {value} is out of bounds: want {low}..={high} (%)"
                ));
            }
        }
        if self.delete_when_hours.is_empty() || self.delete_when_hours.iter().any(|&h| h > 23) {
            return Err("deleteWhen must name hours of the day (0..=23)".into());
        }
        if self.clean_resource_interval_ms == 0 || self.clean_resource_interval_ms > 3_600_000 {
            return Err(format!(
                "cleanResourceInterval {} is out of bounds: want 1..=3600000 (ms)",
                self.clean_resource_interval_ms
            ));
        }
        if self.delete_commit_log_files_interval_ms > 60_000 {
            return Err(format!(
                "deleteCommitLogFilesInterval {} is out of bounds: want 0..=60000 (ms)",
                self.delete_commit_log_files_interval_ms
            ));
        }
        Ok(())
    }

    /// `fileReservedTime` in milliseconds.
    pub fn reserved_ms(&self) -> i64 {
        (self.file_reserved_time_hours * 3_600_000.0) as i64
    }

    /// Whether `hour` (local time, 0..=23) is one of `deleteWhen`'s.
    pub fn time_to_delete(&self, hour: u8) -> bool {
        self.delete_when_hours.contains(&hour)
    }

    /// The verdict for a disk `used_ratio` full (0..=1); None (it could not be measured)
    /// counts as past `diskMaxUsedSpaceRatio`, as RocketMQ's -1 does.
    pub fn disk_verdict(&self, used_ratio: Option<f64>) -> DiskVerdict {
        let Some(ratio) = used_ratio else {
            return DiskVerdict {
                refuse_writes: false,
                clean_immediately: false,
                space_to_delete: true,
            };
        };
        let percent = ratio * 100.0;
        let refuse_writes = percent > f64::from(self.disk_space_warning_level_ratio);
        let forcibly = refuse_writes || percent > f64::from(self.disk_space_clean_forcibly_ratio);
        DiskVerdict {
            refuse_writes,
            clean_immediately: forcibly && self.clean_file_forcibly_enable,
            space_to_delete: percent > f64::from(self.disk_max_used_space_ratio),
        }
    }

    /// Whether a segment last written at `last_modified_ms` has expired at `now_ms`.
    pub fn expired(&self, last_modified_ms: i64, now_ms: i64) -> bool {
        now_ms >= last_modified_ms.saturating_add(self.reserved_ms())
    }
}

/// A commitlog segment retention may delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedSegment {
    pub start: CommitLogOffset,
    pub end: CommitLogOffset,
    /// The segment file's last modification (ms since the epoch), as RocketMQ ages files.
    pub last_modified_ms: i64,
}

/// What one deletion did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedSegment {
    pub start: CommitLogOffset,
    pub end: CommitLogOffset,
    /// Consume-queue files removed with it.
    pub queue_files: usize,
    /// Message index files removed with it.
    pub index_files: usize,
    /// How long the removal took on the helper thread (unlink and the freeing close).
    pub unlink: Duration,
    /// Where the segment's file went when it was recycled instead of removed.
    pub recycled_to: Option<CommitLogOffset>,
}

/// Most recycled segments ahead of the one being written: what recycling may hold of the disk
/// beyond what retention keeps.
pub fn recycled_ahead_max(segment_size_bytes: u64) -> u64 {
    (RECYCLED_AHEAD_BYTES / segment_size_bytes).clamp(2, 8)
}
const RECYCLED_AHEAD_BYTES: u64 = 2 << 30;

/// The oldest segment that may go: not the last file, wholly below the durable end and below
/// the write position, and what the synced checkpoint on disk covers (else one is asked for).
pub(crate) fn oldest_sealed(inner: &Inner) -> Option<SealedSegment> {
    let log = inner.log.borrow();
    let resetting = log.reset.is_some();
    if log.closing || log.poison.is_some() || resetting || log.segments.files.len() < 2 {
        return None;
    }
    let start = log.segments.first_start()?;
    let end = start + inner.config.segment_size_bytes;
    if end > log.flush.durable_end || end > log.tail.end() {
        return None;
    }
    if end > log.flush.synced_covers && !log.flush.checkpoints_failing {
        // Not before a synced checkpoint counts every unit of its records (see the module
        // doc): one is asked for at once.
        drop(log);
        inner.log.borrow_mut().flush.checkpoint_wanted = true;
        inner.notify.signal();
        return None;
    }
    let path = log.segments.path_of(start);
    drop(log);
    let last_modified_ms = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    Some(SealedSegment {
        start: CommitLogOffset(start),
        end: CommitLogOffset(end),
        last_modified_ms,
    })
}

/// Deletes the segment `oldest_sealed` names, if it still is the oldest one that may go.
pub(crate) async fn delete_oldest(
    inner: &Inner,
    expected: SealedSegment,
    recycle: bool,
) -> Result<Option<DeletedSegment>, StoreError> {
    if oldest_sealed(inner).map(|s| s.start) != Some(expected.start) {
        return Ok(None);
    }
    let _deleting = Deleting::start(inner);
    let start = expected.start.0;
    let (file, path, keep) = {
        let mut log = inner.log.borrow_mut();
        let path = log.segments.path_of(start);
        // A second descriptor, so the shard's close below is never the last one.
        let keep = std::fs::File::open(&path)?;
        let Some(file) = log.segments.files.remove(&start) else {
            return Ok(None);
        };
        let next = log
            .segments
            .first_start()
            .expect("the last segment is never deleted");
        log.min_physical_offset = next;
        inner.read_cache.borrow_mut().forget_below(next);
        log.flush.checkpoint_wanted = true;
        log.stats.segments_deleted += 1;
        (file, path, keep)
    };
    let min_physical = expected.end.0;
    let mut doomed = inner.queues.borrow_mut().expire_below(min_physical)?;
    let queue_files = doomed.len();
    let index_paths = inner.index.borrow_mut().expire_below(min_physical);
    let index_files = index_paths.len();
    doomed.extend(index_paths);
    inner.notify.signal();
    wait_for_readers(&file).await;
    let recycled_to = match recycle.then(|| claim_recycling(inner, &file)).flatten() {
        Some(target) => recycle_file(inner, start, &path, file, target).await,
        None => {
            DirectFile::close_shared(file).await;
            None
        }
    };
    let unlink = runtime::blocking(move || -> std::io::Result<Duration> {
        let started = std::time::Instant::now();
        let mut result = match recycled_to {
            Some(_) => Ok(()),
            None => std::fs::remove_file(&path),
        };
        drop(keep);
        for other in doomed {
            result = result.and(runtime::fs::remove_if_present(&other));
        }
        result.map(|()| started.elapsed())
    })
    .await?;
    inner.log.borrow_mut().segments.recycled.remove(&start);
    Ok(Some(DeletedSegment {
        start: expected.start,
        end: expected.end,
        queue_files,
        index_files,
        unlink,
        recycled_to: recycled_to.map(CommitLogOffset),
    }))
}

/// The start a deleted segment's file may be recycled to, claimed (`Segments::claimed`): the
/// first segment past the one being written and past the one allocation reaches into that
/// holds no recycled file yet (a sparse file created ahead, `flusher::segment_to_prepare`, or
/// none), when no reader holds the file any more and fewer than
/// `recycled_ahead_max` recycled files wait past the one being written. Allocation into a
/// claimed segment waits for the claim (`flusher::ensure_segments`), and appends wait for
/// allocation: no byte of the log reaches the segment until the recycled file is its own.
fn claim_recycling(inner: &Inner, file: &Rc<DirectFile>) -> Option<u64> {
    let mut log = inner.log.borrow_mut();
    let size = inner.config.segment_size_bytes;
    let usable = !log.closing && log.poison.is_none() && log.reset.is_none();
    let writing = align_down(log.tail.end(), size);
    // Past the segment allocation may be working in: any allocation beyond meets the claim.
    let mut target = (align_down(log.space.allocated_end, size) + size).max(writing + size);
    while log.segments.recycled.contains(&target) {
        target += size;
    }
    let waiting = log.segments.recycled.range(writing + 1..).count() as u64;
    let free = !log.segments.claimed.contains(&target);
    if !usable || Rc::strong_count(file) > 1 || waiting >= recycled_ahead_max(size) || !free {
        return None;
    }
    log.segments.claimed.insert(target);
    Some(target)
}

/// Renames the file of the deleted segment `start` to `<target>.recycled` and makes that
/// durable; the segment `target` then holds it, and the sparse file it had, if any, goes.
/// Until that one is removed both names exist, and recovery keeps the recycled one
/// (`Segments::open`): the other never took a byte of the log. None (the file closed, to be
/// removed as a deleted one) when that fails.
async fn recycle_file(
    inner: &Inner,
    start: u64,
    path: &std::path::Path,
    file: Rc<DirectFile>,
    target: u64,
) -> Option<u64> {
    let dir = inner.log.borrow().segments.dir.clone();
    let to = dir.join(recycled_name(target));
    let moved = match runtime::fs::rename(path, &to).await {
        Ok(()) => sync_dir(&dir).await.map_err(|error| (error, true)),
        Err(error) => Err((error, false)),
    };
    let replaced = {
        let mut log = inner.log.borrow_mut();
        log.segments.claimed.remove(&target);
        let reached = log.tail.end() > target;
        match moved {
            Ok(()) if !reached => {
                log.segments.recycled.insert(target);
                log.stats.segments_recycled += 1;
                Ok(log.segments.files.insert(target, file))
            }
            Ok(()) => Err((io::Error::other("the log reached it meanwhile"), true, file)),
            Err((error, renamed)) => Err((error, renamed, file)),
        }
    };
    let failure = match replaced {
        Ok(None) => return Some(target),
        Ok(Some(sparse)) => {
            DirectFile::close_shared(sparse).await;
            let plain = dir.join(segment_name(target));
            let removed = runtime::fs::remove_if_present(&plain);
            if let Err(error) = removed.and(sync_dir(&dir).await) {
                // Recovery removes it, as it would after a crash here.
                log::warn!(
                    "store {}: recycled segment {target}: removing the file it replaces: \
                     {error}",
                    inner.config.root_dir.display()
                );
            }
            return Some(target);
        }
        Err(failure) => failure,
    };
    let (error, renamed, file) = failure;
    log::warn!(
        "store {}: could not recycle commitlog segment {start} as {target}: {error}; it is \
         deleted instead",
        inner.config.root_dir.display()
    );
    if renamed {
        // Back to the name the deletion removes (after a crash, recovery takes it for a
        // segment below the log's start).
        let _ = runtime::fs::rename(&to, path).await;
    }
    DirectFile::close_shared(file).await;
    None
}

/// Marks a deletion under way for as long as it lives (`LogState::deleting_segment`): a reset
/// waits for it, since the files it removes by name may otherwise be the reset log's.
struct Deleting<'a>(&'a Inner);

impl<'a> Deleting<'a> {
    fn start(inner: &'a Inner) -> Deleting<'a> {
        inner.log.borrow_mut().deleting_segment = true;
        Deleting(inner)
    }
}

impl Drop for Deleting<'_> {
    fn drop(&mut self) {
        self.0.log.borrow_mut().deleting_segment = false;
        // The flusher runs resets: one may be waiting for this.
        self.0.notify.signal();
    }
}

/// Reads in flight hold the segment's file: give them `READERS_WAIT_MS` to finish.
async fn wait_for_readers(file: &Rc<DirectFile>) {
    let mut waited = 0;
    while Rc::strong_count(file) > 1 && waited < READERS_WAIT_MS {
        runtime::sleep(Duration::from_millis(10)).await;
        waited += 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_decide_as_rocketmq_does() {
        let config = RetentionConfig::default();
        let at = |percent: f64| config.disk_verdict(Some(percent / 100.0));
        assert_eq!(
            at(50.0),
            DiskVerdict {
                refuse_writes: false,
                clean_immediately: false,
                space_to_delete: false
            }
        );
        assert!(at(76.0).space_to_delete && !at(76.0).clean_immediately);
        assert!(at(86.0).clean_immediately && !at(86.0).refuse_writes);
        assert!(at(91.0).refuse_writes && at(91.0).clean_immediately);
        assert!(config.disk_verdict(None).space_to_delete);
        let gentle = RetentionConfig {
            clean_file_forcibly_enable: false,
            ..RetentionConfig::default()
        };
        assert!(!gentle.disk_verdict(Some(0.95)).clean_immediately);
        assert!(gentle.disk_verdict(Some(0.95)).refuse_writes);
    }

    #[test]
    fn hours_and_ages() {
        assert_eq!(parse_delete_when("04").unwrap(), vec![4]);
        assert_eq!(parse_delete_when("04;05; 23").unwrap(), vec![4, 5, 23]);
        assert!(parse_delete_when("24").is_err());
        assert!(parse_delete_when("").is_err());
        assert!(parse_delete_when("four").is_err());
        let config = RetentionConfig {
            file_reserved_time_hours: 0.5,
            ..RetentionConfig::default()
        };
        assert!(config.time_to_delete(4) && !config.time_to_delete(5));
        assert!(!config.expired(1_000, 1_000 + 1_799_999));
        assert!(config.expired(1_000, 1_000 + 1_800_000));
        assert!(config.validate().is_ok());
        let bad = RetentionConfig {
            disk_space_warning_level_ratio: 100,
            ..RetentionConfig::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("diskSpaceWarningLevelRatio"));
    }
}
