//! Retention and the disk monitor of one shard: RocketMQ's CleanCommitLogService, per shard.
//!
//! Every `DISK_CHECK_INTERVAL_MS` (or `cleanResourceInterval`, when shorter), and whenever the
//! store creates a segment file (the moment its use of the disk jumps), the task reads
//! the used ratio of the store's filesystem (`df`'s and RocketMQ's formula). Past `diskSpaceWarningLevelRatio` the store
//! refuses appends (SERVICE_NOT_AVAILABLE with RocketMQ's disk-full remark); back under it,
//! appends are taken again, by themselves. Every `cleanResourceInterval`, and at every check
//! while the disk is past `diskMaxUsedSpaceRatio` or after a manual trigger, it runs a
//! deletion pass when the hour is
//! one of `deleteWhen`'s, the disk is past `diskMaxUsedSpaceRatio`, or a manual trigger
//! (DELETE_EXPIRED_COMMITLOG 329, TRIGGER_DELETE_FILES 27) has runs left: oldest first, it
//! deletes sealed segments that expired (`fileReservedTime` after their last write), or any
//! sealed segment while the disk is past `diskSpaceCleanForciblyRatio` (measured again before
//! each), stopping at the first one it may not delete, at most `DELETE_FILES_BATCH_MAX` per pass,
//! `deleteCommitLogFilesInterval` apart. The policy itself is `shards::store::retention`.
//!
//! Shards share a filesystem but not their files: each deletes its own oldest segments, so
//! a full disk is relieved by every shard at once.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use shards::store::{RetentionConfig, DELETE_FILES_BATCH_MAX, MANUAL_DELETE_RUNS};

use crate::broker::Broker;

/// Longest time between two reads of the disk's used ratio (a statvfs: microseconds).
pub const DISK_CHECK_INTERVAL_MS: u64 = 250;

/// A shard's retention state.
pub struct Retention {
    /// Changed live by UPDATE_BROKER_CONFIG (25); each pass reads it afresh.
    config: RefCell<RetentionConfig>,
    /// Deletion passes a manual trigger still asks for.
    manual_runs: Cell<u32>,
    /// A manual trigger came since the last pass: the next pass runs now.
    triggered: Cell<bool>,
    /// Wakes the task before its next check: a manual trigger, or a new segment file.
    wake: Rc<shards::sync::Signal>,
    /// The used ratio last read (None: not yet, or it could not be read).
    used_ratio: Cell<Option<f64>>,
    /// Whether this task refuses appends for the warning ratio now.
    refusing: Cell<bool>,
    /// Segments deleted and their bytes, since start.
    pub deleted_segments: Cell<u64>,
    pub deleted_bytes: Cell<u64>,
}

impl Retention {
    /// The settings in force now.
    pub fn config(&self) -> RetentionConfig {
        self.config.borrow().clone()
    }

    /// New settings (already validated); the task picks them up at its next check.
    pub fn set_config(&self, config: RetentionConfig) {
        *self.config.borrow_mut() = config;
        self.wake.notify();
    }

    pub fn new(config: RetentionConfig) -> Retention {
        Retention {
            config: RefCell::new(config),
            manual_runs: Cell::new(0),
            triggered: Cell::new(false),
            wake: Rc::new(shards::sync::Signal::default()),
            used_ratio: Cell::new(None),
            refusing: Cell::new(false),
            deleted_segments: Cell::new(0),
            deleted_bytes: Cell::new(0),
        }
    }

    /// DELETE_EXPIRED_COMMITLOG / TRIGGER_DELETE_FILES: the next `MANUAL_DELETE_RUNS` passes
    /// run whatever the hour, the first one now.
    pub fn trigger_manual(&self) {
        self.manual_runs.set(MANUAL_DELETE_RUNS);
        self.triggered.set(true);
        self.wake.notify();
    }

    /// Something to call when the disk's use may have jumped (a new segment file): the task
    /// measures at once instead of at its next check.
    pub fn waker(&self) -> Rc<dyn Fn()> {
        let wake = Rc::downgrade(&self.wake);
        Rc::new(move || {
            if let Some(wake) = wake.upgrade() {
                wake.notify();
            }
        })
    }

    /// The used ratio of the store's filesystem when last read (0..=1).
    pub fn used_ratio(&self) -> Option<f64> {
        self.used_ratio.get()
    }

    /// Whether appends are refused now because the disk is past its warning ratio.
    pub fn refusing_writes(&self) -> bool {
        self.refusing.get()
    }
}

/// The hour of the day (0..=23) in local time at `now_ms`, as RocketMQ's deleteWhen reads it.
pub fn local_hour(now_ms: i64) -> u8 {
    let seconds = (now_ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes into the struct we pass and reads only `seconds`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&seconds, &mut tm).is_null() };
    if ok {
        tm.tm_hour.clamp(0, 23) as u8
    } else {
        ((now_ms / 3_600_000) % 24) as u8
    }
}

impl Broker {
    /// The retention task (see the module docs); runs for the life of the shard.
    pub async fn run_retention(self: Rc<Self>) {
        let retention = &self.retention;
        let mut next_pass_ms = self.monotonic_ms() + retention.config().clean_resource_interval_ms;
        loop {
            let config = retention.config();
            let check_ms = DISK_CHECK_INTERVAL_MS.min(config.clean_resource_interval_ms);
            shards::runtime::timeout(Duration::from_millis(check_ms), retention.wake.wait()).await;
            let verdict = self.check_disk();
            let now = self.monotonic_ms();
            let manual = retention.manual_runs.get() > 0;
            let triggered = retention.triggered.replace(false);
            // Past diskMaxUsedSpaceRatio a pass runs at every check (and a check runs at
            // every new segment file), not only every cleanResourceInterval: a disk filling
            // at 1 GB/s cannot wait 10 s. A pass that finds nothing to delete costs a stat.
            if now < next_pass_ms && !verdict.space_to_delete && !triggered {
                continue;
            }
            next_pass_ms = now + config.clean_resource_interval_ms;
            let time_up = config.time_to_delete(local_hour(self.now_ms()));
            if !(time_up || verdict.space_to_delete || manual) {
                continue;
            }
            if manual {
                retention.manual_runs.set(retention.manual_runs.get() - 1);
            }
            self.delete_pass().await;
        }
    }

    /// Reads the disk's used ratio and refuses or takes appends again by it.
    fn check_disk(&self) -> shards::store::DiskVerdict {
        let retention = &self.retention;
        let ratio = self.store.disk_used_ratio();
        retention.used_ratio.set(ratio);
        let config = retention.config();
        let verdict = config.disk_verdict(ratio);
        let name = &self.identity.broker_name;
        let percent = ratio.unwrap_or(0.0) * 100.0;
        if verdict.refuse_writes {
            let remark = format!(
                "disk {percent:.1}% used, past diskSpaceWarningLevelRatio {}%",
                config.disk_space_warning_level_ratio
            );
            if !retention.refusing.replace(true) {
                log::warn!("{name}: {remark}: sends are refused until space returns");
            }
            self.store
                .set_over_ratio(Some(remark), ratio.unwrap_or(1.0));
        } else {
            if retention.refusing.replace(false) {
                log::info!("{name}: disk {percent:.1}% used: sends are taken again");
            }
            self.store.set_over_ratio(None, ratio.unwrap_or(0.0));
        }
        verdict
    }

    /// One deletion pass: oldest first, while the segment may go. An unexpired segment goes
    /// only while the disk is past the forced ratio, measured again before each one (RocketMQ
    /// decides once per pass, and so deletes more than it must).
    async fn delete_pass(&self) {
        let retention = &self.retention;
        let config = &retention.config();
        let name = &self.identity.broker_name;
        for deleted in 0..DELETE_FILES_BATCH_MAX {
            // The interval keeps deletion from crowding the shard's sends; while sends are
            // refused for want of space there are none to crowd, and the space is what counts.
            let refused = retention.refusing_writes() || self.store.space_refusal().is_some();
            if deleted > 0 && config.delete_commit_log_files_interval_ms > 0 && !refused {
                shards::runtime::sleep(Duration::from_millis(
                    config.delete_commit_log_files_interval_ms,
                ))
                .await;
            }
            let Some(segment) = self.store.oldest_sealed_segment() else {
                return;
            };
            let now_ms = self.now_ms();
            let expired = config.expired(segment.last_modified_ms, now_ms);
            if !expired && !self.check_disk().clean_immediately {
                return;
            }
            let age_s = (now_ms - segment.last_modified_ms) as f64 / 1000.0;
            let why = if expired {
                format!(
                    "expired: last written {} ago, fileReservedTime {} h",
                    age_text(age_s),
                    config.file_reserved_time_hours
                )
            } else {
                format!(
                    "disk {:.1}% used, past diskSpaceCleanForciblyRatio {}%",
                    retention.used_ratio().unwrap_or(1.0) * 100.0,
                    config.disk_space_clean_forcibly_ratio
                )
            };
            // An expired segment's file becomes a later one while the disk has room (a
            // master's only: a slave's log is its master's bytes, unsealed; and unless
            // segmentRecycleEnable is off), see shards/src/store/retention.rs.
            let recycle = expired
                && config.segment_recycle_enable
                && !self.ha.is_slave()
                && !self.check_disk().space_to_delete;
            match self.store.delete_oldest_segment(segment, recycle).await {
                Ok(Some(done)) => {
                    let bytes = done.end.0 - done.start.0;
                    retention
                        .deleted_segments
                        .set(retention.deleted_segments.get() + 1);
                    retention
                        .deleted_bytes
                        .set(retention.deleted_bytes.get() + bytes);
                    let file = match done.recycled_to {
                        Some(to) => format!("its file recycled as segment {:020}", to.0),
                        None => "its file removed".to_string(),
                    };
                    log::info!(
                        "{name}: retention deleted commitlog segment {:020} ({} MiB; {why}; \
                         {file}) with {} consume-queue and {} index file(s) in {} ms; the \
                         commitlog now starts at {}",
                        done.start.0,
                        bytes >> 20,
                        done.queue_files,
                        done.index_files,
                        done.unlink.as_millis(),
                        self.store.min_physical_offset().0
                    );
                }
                Ok(None) => return,
                Err(error) => {
                    log::warn!(
                        "{name}: retention could not delete segment {:020}: {error}",
                        segment.start.0
                    );
                    return;
                }
            }
        }
    }
}

/// An age as a person reads it: seconds under two minutes, then hours.
fn age_text(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{:.2} h", seconds / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hours_are_hours() {
        for ms in [0i64, 3_599_999, 1_800_000_000_000, 1_764_590_400_000] {
            assert!(local_hour(ms) < 24);
        }
    }
}
