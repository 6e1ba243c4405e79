//! The file behind a versioned config table of one shard (`topics.json`,
//! `subscriptionGroup.json`): read from the file or its backup at start, its `dataVersion`
//! bumped on every change, the whole table written durably after it by the table's writer
//! task (`persist::run_writer`, off the shard thread).

use std::path::PathBuf;
use std::rc::Rc;

use crate::body::DataVersion;
use crate::error::now_ms;
use crate::persist;

/// Where a table lives and the version it is at.
pub struct VersionedFile {
    pub persisted: Rc<persist::Persisted>,
    pub data_version: DataVersion,
}

impl VersionedFile {
    /// Reads `path` (or its backup) with `parse`, which splits a table into its version and
    /// entries. A table that parses in neither starts empty, at counter 0, versioned now.
    pub fn load<E: Default>(
        path: PathBuf,
        parse: impl Fn(&[u8]) -> Option<(DataVersion, E)>,
    ) -> (VersionedFile, E) {
        let (data_version, entries) =
            persist::read_with_fallback(&path, parse).unwrap_or_else(|| {
                let fresh = DataVersion {
                    counter: 0,
                    state_version: 0,
                    timestamp: now_ms(),
                };
                (fresh, E::default())
            });
        let persisted = persist::Persisted::new(path);
        (
            VersionedFile {
                persisted,
                data_version,
            },
            entries,
        )
    }

    /// Counts one change (RocketMQ's `DataVersion.nextVersion`).
    pub fn bump(&mut self) {
        self.data_version.counter += 1;
        self.data_version.timestamp = now_ms();
    }

    /// Asks the writer for a write of the table; returns the version to wait for.
    pub fn write_soon(&self) -> u64 {
        self.persisted.note_change()
    }
}
