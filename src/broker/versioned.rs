//! The file behind a versioned config table of one shard (`topics.json`,
//! `subscriptionGroup.json`): read from the file or its backup at start, its `dataVersion`
//! bumped on every change, the whole table written durably after it.

use std::path::PathBuf;

use crate::error::now_ms;
use crate::persist;
use crate::protocol::DataVersion;

/// Where a table lives and the version it is at.
pub struct VersionedFile {
    path: PathBuf,
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
        (VersionedFile { path, data_version }, entries)
    }

    /// Counts one change (RocketMQ's `DataVersion.nextVersion`).
    pub fn bump(&mut self) {
        self.data_version.counter += 1;
        self.data_version.timestamp = now_ms();
    }

    /// Writes the encoded table durably; a failure is logged and the table stays in memory.
    pub fn write(&self, bytes: &[u8]) {
        persist::write_or_log(&self.path, bytes);
    }
}
