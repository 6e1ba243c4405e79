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
    /// Queue offsets held, all keys together.
    queues: usize,
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
        let queues = offsets.values().map(BTreeMap::len).sum();
        OffsetTable {
            persisted: persist::Persisted::new(path),
            offsets,
            dirty: false,
            pulled: Default::default(),
            pulled_series: 0,
            queues,
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
        let before = queues.insert(queue_id, offset);
        if before != Some(offset) {
            self.dirty = true;
        }
        self.queues += usize::from(before.is_none());
    }

    /// Queue offsets held, all groups and topics together.
    pub fn queue_count(&self) -> usize {
        self.queues
    }

    /// Whether `group` has an offset for `topic`'s queue `queue_id`.
    pub fn holds(&self, group: &str, topic: &str, queue_id: u32) -> bool {
        self.query(group, topic, queue_id).is_some()
    }

    /// Drops the keys `drop` picks; true when any went.
    fn drop_keys(&mut self, mut drop: impl FnMut(&str) -> bool) -> bool {
        let mut removed = 0;
        self.offsets.retain(|k, queues| {
            let gone = drop(k);
            removed += if gone { queues.len() } else { 0 };
            !gone
        });
        self.queues -= removed;
        removed > 0
    }

    pub fn remove_topic(&mut self, topic: &str) {
        let prefix = format!("{topic}@");
        self.dirty |= self.drop_keys(|k| k.starts_with(&prefix));
        if let Some(groups) = self.pulled.remove(topic) {
            self.pulled_series -= groups.len();
        }
    }

    /// Drops every offset of `group` (DELETE_SUBSCRIPTIONGROUP with cleanOffset).
    pub fn remove_group(&mut self, group: &str) {
        let suffix = format!("@{group}");
        self.dirty |= self.drop_keys(|k| k.ends_with(&suffix));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_offsets_are_counted_as_they_come_and_go() {
        let dir = std::env::temp_dir().join(format!("offsets-count-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut table = OffsetTable::load(dir.join("consumerOffset.json"));
        table.commit("g1", "T", 0, 5);
        table.commit("g1", "T", 0, 6);
        table.commit("g1", "T", 1, 1);
        table.commit("g2", "T", 0, 1);
        table.commit("g2", "U", 3, 1);
        table.commit("g3", "U", 0, -1);
        assert_eq!(
            table.queue_count(),
            4,
            "a queue once, however often; -1 not kept"
        );
        assert!(table.holds("g1", "T", 1) && !table.holds("g3", "U", 0));
        table.remove_topic("T");
        assert_eq!(table.queue_count(), 1);
        table.remove_group("g2");
        assert_eq!(table.queue_count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
