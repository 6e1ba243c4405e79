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
    /// Where each group's last pull of each queue ended (topic → group → queue →
    /// nextBeginOffset): RocketMQ's pullOffsetTable, in memory only. Pulled and not yet
    /// committed is in flight (rocketmq_consumer_inflight_messages).
    pulled: std::collections::HashMap<String, std::collections::HashMap<String, PulledQueues>>,
    pulled_series: usize,
}

/// Queue → where the group's last pull of it ended.
pub(crate) type PulledQueues = std::collections::HashMap<u32, u64>;

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
            pulled: Default::default(),
            pulled_series: 0,
        }
    }

    /// A pull of `group` on `topic`'s queue answered messages up to `next_offset`. At most
    /// `metrics::SERIES_MAX` topic × group entries are kept.
    pub fn note_pulled(&mut self, group: &str, topic: &str, queue_id: u32, next_offset: u64) {
        let queues = self
            .pulled
            .get_mut(topic)
            .and_then(|groups| groups.get_mut(group));
        match queues {
            Some(queues) => {
                queues.insert(queue_id, next_offset);
            }
            None if self.pulled_series < crate::metrics::SERIES_MAX => {
                self.pulled_series += 1;
                let groups = self.pulled.entry(topic.to_string()).or_default();
                let queues = groups.entry(group.to_string()).or_default();
                queues.insert(queue_id, next_offset);
            }
            None => {}
        }
    }

    /// Where `group`'s pulls of `topic` ended, by queue.
    pub(crate) fn pulled(&self, group: &str, topic: &str) -> Option<&PulledQueues> {
        self.pulled.get(topic)?.get(group)
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
        if let Some(groups) = self.pulled.remove(topic) {
            self.pulled_series -= groups.len();
        }
    }

    /// Drops every offset of `group` (DELETE_SUBSCRIPTIONGROUP with cleanOffset).
    pub fn remove_group(&mut self, group: &str) {
        let suffix = format!("@{group}");
        let before = self.offsets.len();
        self.offsets.retain(|k, _| !k.ends_with(&suffix));
        self.dirty |= self.offsets.len() != before;
        for groups in self.pulled.values_mut() {
            if groups.remove(group).is_some() {
                self.pulled_series -= 1;
            }
        }
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
