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

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::index::IndexMark;
use crate::runtime::fs;

const FILE_NAME: &str = "checkpoint";
const TEMP_FILE_NAME: &str = "checkpoint.tmp";
/// A checkpoint larger than this is not ours (it holds one number per queue).
const CHECKPOINT_SIZE_MAX_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub commitlog_offset: u64,
    pub clean: bool,
    pub queues: BTreeMap<String, BTreeMap<u32, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexMark>,
}

/// Reads the checkpoint; None when there is none or it does not parse (recovery then scans
/// the whole commitlog, which is always correct, only slower).
pub(crate) fn read(root: &Path) -> Option<Checkpoint> {
    let path = root.join(FILE_NAME);
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
    for name in [FILE_NAME, TEMP_FILE_NAME] {
        match std::fs::remove_file(root.join(name)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

/// Writes the checkpoint durably and atomically.
pub(crate) async fn write(root: &Path, checkpoint: &Checkpoint) -> io::Result<()> {
    let bytes = serde_json::to_vec(checkpoint).map_err(io::Error::other)?;
    let temp = root.join(TEMP_FILE_NAME);
    fs::write_small_file(&temp, bytes).await?;
    fs::rename(&temp, &root.join(FILE_NAME)).await?;
    fs::sync_dir(root).await
}
