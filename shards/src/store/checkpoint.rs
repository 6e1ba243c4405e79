//! The checkpoint: how far recovery may trust the consume queues.
//!
//! `<root>/checkpoint` is a JSON object written by the flusher (temp file, fdatasync, rename,
//! directory fsync) after the commitlog is durable up to `commitlog_offset` and every
//! consume-queue file written before it has been fdatasync'ed:
//!
//! | Field | Meaning |
//! |---|---|
//! | `commitlog_offset` | every record below it has its consume-queue unit on disk; a record boundary |
//! | `clean` | written by `close`: nothing was appended after it |
//! | `queues` | topic → queueId → max offset at that point; a queue on disk with fewer units (files deleted) makes recovery rebuild every queue from the first segment |
//! | `index` | the message index's last file and entry count at that point (`index.rs`); absent in checkpoints older than the index, which then is rebuilt from the first segment |
//! | `boot` | only in `checkpoint.light`: the boot of the machine it holds for |
//! | `catalog` | in a clean stop's and a synced one: the stamp of the queue catalog written before it (`catalog.rs`), which a start from it reads instead of every queue's directory |
//! | `awaiting_from` | present when queues created by appends still awaited their files (their units in memory, queue_files.rs): they are not in `queues`, and recovery scans from the segment holding this commitlog offset, the first of their units, to rebuild them |
//!
//! A store with many queues written also writes light checkpoints, `<root>/checkpoint.light`
//! (the same record with `boot`), between the synced ones: the commitlog is durable up to
//! `commitlog_offset` and every unit below it is written to its queue file through the map,
//! but the queue and index files are not synced. A kill -9 loses no page cache, so while the
//! machine has not restarted (`boot` is this boot's `/proc/sys/kernel/random/boot_id`) those
//! units are all there, and recovery takes the light checkpoint when it is the newer one.
//! After a restart of the machine (a power loss, a kernel crash) it takes the synced one,
//! whose files a syncfs made durable. The light checkpoint is written without fdatasync: a
//! torn one does not parse and is ignored, and after a restart it is ignored anyway. So a
//! crash costs a recovery scan from at most a second back, whatever the number of queues,
//! while the syncfs of tens of thousands of queue files (a write of a page of each, and a
//! write fault on each at its next unit) comes every half minute instead of every second.
//! Recovery after a crash writes a light checkpoint too, whichever one it started from
//! (`recovery.rs`, step 5): the queues its scan rebuilt are synced by the flusher's first
//! synced checkpoint, taken as soon as the store serves, not before the store opens.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::index::IndexMark;
use crate::runtime::fs;

const FILE_NAME: &str = "checkpoint";
const TEMP_FILE_NAME: &str = "checkpoint.tmp";
const LIGHT_FILE_NAME: &str = "checkpoint.light";
const LIGHT_TEMP_FILE_NAME: &str = "checkpoint.light.tmp";
/// Where Linux names this boot of the machine.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// A checkpoint larger than this is not ours (it holds one number per queue).
const CHECKPOINT_SIZE_MAX_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub commitlog_offset: u64,
    pub clean: bool,
    pub queues: BTreeMap<String, BTreeMap<u32, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexMark>,
    /// A light checkpoint: the boot it holds for (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    /// The first commitlog offset of a unit of a queue left out of `queues` because its
    /// files were being made (see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_from: Option<u64>,
    /// In a clean stop's and a synced checkpoint: the stamp of the queue catalog written just
    /// before it (`catalog.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<u64>,
}

impl Checkpoint {
    /// Whether this is a light checkpoint: the queue and index files below it may be in the
    /// page cache only, so the next synced checkpoint must sync the whole filesystem.
    pub(crate) fn light(&self) -> bool {
        self.boot.is_some()
    }

    /// The commitlog offset below which every record's consume-queue unit is counted here:
    /// the checkpoint's offset, or the first unit of a queue that awaited its files.
    pub(crate) fn covers(&self) -> u64 {
        self.awaiting_from
            .map_or(self.commitlog_offset, |awaiting| {
                awaiting.min(self.commitlog_offset)
            })
    }
}

/// This boot of the machine, read once; None where Linux does not say (then every
/// checkpoint is a synced one).
pub fn boot_id() -> Option<&'static str> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        let text = std::fs::read_to_string(BOOT_ID_PATH).ok()?;
        let id = text.trim();
        (!id.is_empty()).then(|| id.to_string())
    })
    .as_deref()
}

/// Reads the checkpoint recovery may trust: the light one when it was written in this boot
/// and is newer than the synced one, else the synced one. None when there is neither (or
/// neither parses): recovery then scans the whole commitlog, which is always correct, only
/// slower.
pub(crate) fn read(root: &Path) -> Option<Checkpoint> {
    let synced = read_file(root, FILE_NAME).map(|mut synced| {
        synced.boot = None;
        synced
    });
    let light = read_file(root, LIGHT_FILE_NAME)
        .filter(|light| light.boot.is_some() && light.boot.as_deref() == boot_id());
    choose(synced, light)
}

/// What the synced checkpoint in `root` covers (`Checkpoint::covers`); 0 when there is none.
pub(crate) fn synced_covers(root: &Path) -> u64 {
    read_file(root, FILE_NAME).map_or(0, |synced| synced.covers())
}

/// The newer of a synced and a light checkpoint of this boot (the synced one at a tie).
fn choose(synced: Option<Checkpoint>, light: Option<Checkpoint>) -> Option<Checkpoint> {
    match (synced, light) {
        (Some(synced), Some(light)) if light.commitlog_offset > synced.commitlog_offset => {
            Some(light)
        }
        (None, light) => light,
        (synced, _) => synced,
    }
}

fn read_file(root: &Path, name: &str) -> Option<Checkpoint> {
    let path = root.join(name);
    let size = std::fs::metadata(&path).ok()?.len();
    if size > CHECKPOINT_SIZE_MAX_BYTES {
        log::warn!("store: ignoring oversized checkpoint {}", path.display());
        return None;
    }
    let text = std::fs::read(&path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(checkpoint) => Some(checkpoint),
        Err(error) => {
            log::warn!(
                "store: ignoring unreadable checkpoint {}: {error}",
                path.display()
            );
            None
        }
    }
}

/// Removes the checkpoint and a temp file left by an interrupted write (a store emptied by a
/// reset: its checkpoint describes the log that is gone). The caller syncs the directory.
pub(crate) fn remove(root: &Path) -> io::Result<()> {
    for name in [
        FILE_NAME,
        TEMP_FILE_NAME,
        LIGHT_FILE_NAME,
        LIGHT_TEMP_FILE_NAME,
    ] {
        fs::remove_if_present(&root.join(name))?;
    }
    Ok(())
}

/// Writes the checkpoint atomically: a synced one durably to `checkpoint`, a light one
/// (`boot` set) to `checkpoint.light` in the page cache only.
pub(crate) async fn write(root: &Path, checkpoint: &Checkpoint) -> io::Result<()> {
    let bytes = serde_json::to_vec(checkpoint).map_err(io::Error::other)?;
    if checkpoint.light() {
        let temp = root.join(LIGHT_TEMP_FILE_NAME);
        fs::write_small_file_cached(&temp, bytes).await?;
        return fs::rename(&temp, &root.join(LIGHT_FILE_NAME)).await;
    }
    let temp = root.join(TEMP_FILE_NAME);
    fs::write_small_file(&temp, bytes).await?;
    fs::rename(&temp, &root.join(FILE_NAME)).await?;
    fs::sync_dir(root).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64, boot: Option<&str>) -> Checkpoint {
        Checkpoint {
            commitlog_offset: offset,
            clean: false,
            queues: BTreeMap::new(),
            index: None,
            boot: boot.map(str::to_string),
            awaiting_from: None,
            catalog: None,
        }
    }

    #[test]
    fn the_newer_checkpoint_is_trusted_and_a_light_one_only_in_its_boot() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |name: &str, checkpoint: &Checkpoint| {
            std::fs::write(root.join(name), serde_json::to_vec(checkpoint).unwrap()).unwrap()
        };
        let Some(boot) = boot_id() else {
            println!("no {BOOT_ID_PATH} here: light checkpoints are never written");
            return;
        };
        assert_eq!(read(root), None);
        write(FILE_NAME, &at(100, None));
        assert_eq!(read(root), Some(at(100, None)));
        // A light checkpoint of this boot, newer: taken.
        write(LIGHT_FILE_NAME, &at(200, Some(boot)));
        assert_eq!(read(root), Some(at(200, Some(boot))));
        // Of another boot (the machine restarted since): the page cache it relied on is gone.
        write(LIGHT_FILE_NAME, &at(200, Some("another-boot")));
        assert_eq!(read(root), Some(at(100, None)));
        // Older than the synced one (a synced checkpoint, or a clean stop, came after it).
        write(LIGHT_FILE_NAME, &at(100, Some(boot)));
        assert_eq!(read(root), Some(at(100, None)));
        // A torn light checkpoint is ignored; a light one alone is taken.
        std::fs::write(root.join(LIGHT_FILE_NAME), b"{\"commitlog_off").unwrap();
        assert_eq!(read(root), Some(at(100, None)));
        std::fs::remove_file(root.join(FILE_NAME)).unwrap();
        write(LIGHT_FILE_NAME, &at(300, Some(boot)));
        assert_eq!(read(root), Some(at(300, Some(boot))));
        // A synced file never counts as light.
        write(FILE_NAME, &at(400, Some(boot)));
        assert_eq!(read(root), Some(at(400, None)));
        remove(root).unwrap();
        assert_eq!(read(root), None);
    }
}
