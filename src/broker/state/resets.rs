//! Queues reset by INVOKE_BROKER_TO_RESET_OFFSET that their group has not pulled since: the
//! next pull of such a queue is answered OFFSET_MOVED to the reset offset (handlers/reset_offset.rs).

use std::collections::BTreeMap;

pub use crate::limits::PENDING_RESETS_MAX_QUEUES;

/// (group, topic, queue) reset to an offset whose group has not pulled there since.
#[derive(Default)]
pub struct PendingResets {
    pub(crate) offsets: BTreeMap<(String, String, u32), u64>,
}

impl PendingResets {
    pub(crate) fn insert(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) {
        let key = (group.to_string(), topic.to_string(), queue_id);
        if self.offsets.len() < PENDING_RESETS_MAX_QUEUES || self.offsets.contains_key(&key) {
            self.offsets.insert(key, offset);
        }
    }

    /// Whether a reset of (group, topic, queue) waits for the group's next pull.
    pub fn contains(&self, group: &str, topic: &str, queue_id: u32) -> bool {
        !self.offsets.is_empty()
            && self
                .offsets
                .contains_key(&(group.to_string(), topic.to_string(), queue_id))
    }

    /// Consumes the pending reset of (group, topic, queue); returns the offset a pull of
    /// `pulled_offset` must move to, None when there is none or it already asks for it.
    pub fn take(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        pulled_offset: u64,
    ) -> Option<u64> {
        if self.offsets.is_empty() {
            return None;
        }
        let key = (group.to_string(), topic.to_string(), queue_id);
        self.offsets
            .remove(&key)
            .filter(|offset| *offset != pulled_offset)
    }

    /// Queues waiting (for runtime info and tests).
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
}
