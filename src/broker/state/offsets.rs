//! Consumer offsets of one shard's queues: `config/consumerOffset.json` (+ `.bak`), keyed
//! `topic@group` → queue id → next offset to consume. Written every few seconds when
//! changed and at shutdown, by its writer task (`persist::run_writer`, off the shard thread).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::body::ConsumerOffsetTable;
use crate::persist;

/// How often changed offsets are written (RocketMQ's flushConsumerOffsetInterval).
pub const OFFSET_FLUSH_INTERVAL_MS: u64 = 5_000;

pub struct OffsetTable {
    pub persisted: Rc<persist::Persisted>,
    pub(crate) offsets: BTreeMap<String, BTreeMap<u32, i64>>,
    pub(crate) dirty: bool,
}

pub(crate) fn key(topic: &str, group: &str) -> String {
    format!("{topic}@{group}")
}

impl OffsetTable {
    pub fn load(path: PathBuf) -> OffsetTable {
        let offsets =
            persist::read_with_fallback(&path, |bytes| ConsumerOffsetTable::parse(bytes).ok())
                .map(|table| table.offsets)
                .unwrap_or_default();
        OffsetTable {
            persisted: persist::Persisted::new(path),
            offsets,
            dirty: false,
        }
    }

    pub fn query(&self, group: &str, topic: &str, queue_id: u32) -> Option<i64> {
        self.offsets
            .get(&key(topic, group))?
            .get(&queue_id)
            .copied()
    }

    /// Commits an offset; negative offsets (ali-ons commits -1 for untouched queues) are
    /// ignored so the queue stays "not found".
    pub fn commit(&mut self, group: &str, topic: &str, queue_id: u32, offset: i64) {
        if offset < 0 {
            return;
        }
        let queues = self.offsets.entry(key(topic, group)).or_default();
        if queues.insert(queue_id, offset) != Some(offset) {
            self.dirty = true;
        }
    }

    pub fn remove_topic(&mut self, topic: &str) {
        let prefix = format!("{topic}@");
        let before = self.offsets.len();
        self.offsets.retain(|k, _| !k.starts_with(&prefix));
        self.dirty |= self.offsets.len() != before;
    }

    /// Drops every offset of `group` (DELETE_SUBSCRIPTIONGROUP with cleanOffset).
    pub fn remove_group(&mut self, group: &str) {
        let suffix = format!("@{group}");
        let before = self.offsets.len();
        self.offsets.retain(|k, _| !k.ends_with(&suffix));
        self.dirty |= self.offsets.len() != before;
    }

    /// All (topic@group, queue → offset) entries, for admin.
    pub fn entries(&self) -> &BTreeMap<String, BTreeMap<u32, i64>> {
        &self.offsets
    }

    /// Asks the writer for a write if the table changed since the last ask.
    pub fn flush_if_dirty(&mut self) {
        if std::mem::take(&mut self.dirty) {
            self.persisted.note_change();
        }
    }

    /// The table as written to disk (`encode_pretty`).
    pub fn snapshot(&self) -> ConsumerOffsetTable {
        ConsumerOffsetTable {
            offsets: self.offsets.clone(),
        }
    }
}
