//! Epochs: which bytes of a log a master may stream to a slave that already holds some.
//!
//! RocketMQ's classic HA protocol has the slave report only its end offset, and the master
//! streams from there: it cannot tell a slave whose bytes came from it from one whose bytes
//! came from somewhere else. After a promotion by hand (`promote.rs`) that happens: the old
//! master, brought back as a slave of the promoted one, may hold bytes past the offset where
//! the promoted node took over, bytes the new master never had (ASYNC_MASTER) while it wrote
//! its own at those offsets. Streamed from its end, it would append the new master's records
//! behind a tail of the old one's: two logs mixed, offsets that mean different messages on the
//! two nodes.
//!
//! So a promoted master keeps its epoch, the offset its log became its own at and when
//! (`config/haEpoch`, shown as `haEpoch` in GET_BROKER_RUNTIME_INFO; a node that was always a
//! master has none: 0@0), and a slave records the epoch it last copied from
//! (`config/haMasterEpoch`). Before it connects, a slave whose log goes past its master's
//! epoch start checks it copied those bytes from this epoch; if not, it does not replicate and
//! says so (`haDiverged`), or with haResetWhenBehind discards its store and copies the
//! master's from its oldest segment. Its bytes below the epoch start are the master's too: the
//! promoted node copied them from the same log.
//!
//! A master that starts after an unclean stop begins an epoch too, at the end of the log it
//! recovered (`promote.rs`): the stream sends bytes before they are written or durable, so
//! after a kill -9 or a power loss a slave may hold a tail its master lost, at offsets the
//! master then fills with other records. Below that end the bytes are the ones the slave
//! copied.

use std::path::{Path, PathBuf};

/// Where a master's own log begins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Epoch {
    /// The log's end when this node was promoted (0: always a master).
    pub start_offset: u64,
    /// Wall-clock ms of the promotion (0: always a master); tells two promotions at the same
    /// offset apart.
    pub promoted_at_ms: u64,
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.start_offset, self.promoted_at_ms)
    }
}

impl Epoch {
    /// `start@ms`, as Display writes it.
    pub fn parse(text: &str) -> Option<Epoch> {
        let (start, at) = text.trim().split_once('@')?;
        Some(Epoch {
            start_offset: start.parse().ok()?,
            promoted_at_ms: at.parse().ok()?,
        })
    }

    /// The epoch in `path`; none when there is no such file.
    pub fn load(path: &Path) -> Result<Option<Epoch>, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => Epoch::parse(&text)
                .map(Some)
                .ok_or_else(|| format!("{}: not an epoch (start@ms): {text:?}", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("cannot read {}: {error}", path.display())),
        }
    }

    /// Writes it to `path` durably (blocking: call through `runtime::blocking`).
    pub fn save(self, path: &Path) -> std::io::Result<()> {
        crate::persist::write_file_durably(path, format!("{self}\n").as_bytes())
    }
}

/// A master's own epoch file.
pub fn master_epoch_path(shard_dir: &Path) -> PathBuf {
    shard_dir.join("config").join("haEpoch")
}

/// The epoch a slave last copied from.
pub fn copied_epoch_path(shard_dir: &Path) -> PathBuf {
    shard_dir.join("config").join("haMasterEpoch")
}

/// Whether a slave whose log ends at `end`, having last copied from `copied`, may continue
/// from a master of epoch `master`: None if so, else why not.
pub fn divergence(end: u64, copied: Option<Epoch>, master: Epoch) -> Option<String> {
    if master.start_offset == 0 || end <= master.start_offset || copied == Some(master) {
        return None;
    }
    Some(format!(
        "this slave's log ends at {end}, past offset {} where its master's log became its own \
         (epoch {master}: a promotion, or a restart after an unclean stop), and its bytes there \
         did not come from that master (it last copied from epoch {}): they are another log's \
         (this node was the master before a promotion, or its master lost them to a power \
         loss). Replication would mix the two, so it does not run: move this shard's \
         directory aside and start it empty, or set haResetWhenBehind to discard its store \
         and copy the master's",
        master.start_offset,
        copied.map_or("none".to_string(), |e| e.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slave_continues_only_the_log_it_copied() {
        let promoted = Epoch {
            start_offset: 1000,
            promoted_at_ms: 7,
        };
        assert_eq!(Epoch::parse(&promoted.to_string()), Some(promoted));
        assert_eq!(Epoch::parse("12"), None);
        // Always a master: nothing to compare.
        assert!(divergence(5000, None, Epoch::default()).is_none());
        // Up to the epoch start, the bytes are the promoted node's too.
        assert!(divergence(1000, None, promoted).is_none());
        assert!(divergence(0, None, promoted).is_none());
        // Past it: only bytes copied from this epoch.
        assert!(divergence(1001, Some(promoted), promoted).is_none());
        let why = divergence(1001, None, promoted).expect("the old master's tail");
        assert!(why.contains("past offset 1000"), "{why}");
        let earlier = Epoch {
            promoted_at_ms: 3,
            ..promoted
        };
        assert!(divergence(2000, Some(earlier), promoted).is_some());
    }
}
