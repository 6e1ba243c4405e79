//! The file behind a versioned config table of one shard (`topics.json`,
//! `subscriptionGroup.json`): read from the file or its backup at start with the changes of
//! its journal applied, its `dataVersion` bumped on every change, each change journaled and
//! the whole table written again now and then by the table's writer task
//! (`persist::run_writer`, off the shard thread; see `persist` for the journal).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use serde_json::Value;

use crate::body::{DataVersion, SubscriptionGroupConfig, TopicConfig};
use crate::error::now_ms;
use crate::persist::{self, JournalEntry};

/// An entry of a versioned table, as its journal holds it (Java's JSON object).
pub trait VersionedEntry: Sized {
    fn name(&self) -> &str;
    fn to_value(&self) -> Value;
    fn from_value(value: &Value) -> Option<Self>;
}

impl VersionedEntry for TopicConfig {
    fn name(&self) -> &str {
        &self.topic_name
    }
    fn to_value(&self) -> Value {
        TopicConfig::to_value(self)
    }
    fn from_value(value: &Value) -> Option<Self> {
        TopicConfig::from_value(value).ok()
    }
}

impl VersionedEntry for SubscriptionGroupConfig {
    fn name(&self) -> &str {
        &self.group_name
    }
    fn to_value(&self) -> Value {
        SubscriptionGroupConfig::to_value(self)
    }
    fn from_value(value: &Value) -> Option<Self> {
        SubscriptionGroupConfig::from_value(value).ok()
    }
}

/// Where a table lives and the version it is at.
pub struct VersionedFile {
    pub persisted: Rc<persist::Persisted>,
    pub data_version: DataVersion,
}

impl VersionedFile {
    /// Reads `path` (or its backup) with `parse`, which splits a table into its version and
    /// entries, then applies the journal's newer changes. A table that parses in neither
    /// starts empty, at counter 0, versioned now.
    pub fn load<E: VersionedEntry>(
        path: PathBuf,
        parse: impl Fn(&[u8]) -> Option<(DataVersion, BTreeMap<String, E>)>,
    ) -> (VersionedFile, BTreeMap<String, E>) {
        let (mut data_version, mut entries) = persist::read_with_fallback(&path, parse)
            .unwrap_or_else(|| {
                let fresh = DataVersion {
                    counter: 0,
                    state_version: 0,
                    timestamp: now_ms(),
                };
                (fresh, BTreeMap::new())
            });
        let (changes, journal_bytes) = persist::read_journal(&path, data_version.counter);
        for (counter, change) in changes {
            match change {
                JournalEntry::Set(value) => match E::from_value(&value) {
                    Some(entry) => {
                        entries.insert(entry.name().to_string(), entry);
                    }
                    None => log::warn!(
                        "{}: journal entry {counter} does not parse; skipped",
                        path.display()
                    ),
                },
                JournalEntry::Remove(name) => {
                    entries.remove(&name);
                }
            }
            data_version.counter = counter;
        }
        let persisted = persist::Persisted::journaled(path, journal_bytes);
        (
            VersionedFile {
                persisted,
                data_version,
            },
            entries,
        )
    }

    /// Counts one change (RocketMQ's `DataVersion.nextVersion`).
    fn bump(&mut self) {
        self.data_version.counter += 1;
        self.data_version.timestamp = now_ms();
    }

    /// Counts and journals `entry` as set; returns the version to wait for.
    pub fn set<E: VersionedEntry>(&mut self, entry: &E) -> u64 {
        self.journal(JournalEntry::Set(entry.to_value()))
    }

    /// Counts and journals the removal of `name`; returns the version to wait for.
    pub fn remove(&mut self, name: &str) -> u64 {
        self.journal(JournalEntry::Remove(name.to_string()))
    }

    fn journal(&mut self, change: JournalEntry) -> u64 {
        self.bump();
        let line = persist::journal_line(self.data_version.counter, &change);
        self.persisted.note_journaled_change(&line)
    }

    /// Asks the writer for a write of the whole table; returns the version to wait for.
    pub fn write_soon(&self) -> u64 {
        self.persisted.note_change()
    }
}
