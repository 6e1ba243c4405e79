//! Queue locks for orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ): a queue belongs to
//! one client id of a group until it unlocks it or stops renewing for LOCK_EXPIRY_MS.

use std::collections::BTreeMap;

/// A lock not renewed for this long is free again (RocketMQ's rebalance lock max live time).
pub const LOCK_EXPIRY_MS: i64 = 60_000;

#[derive(Default)]
pub struct QueueLocks {
    /// (group, topic, queue id) → (client id, last renewal ms)
    pub(crate) owners: BTreeMap<(String, String, u32), (String, i64)>,
}

impl QueueLocks {
    /// Locks (or renews) a queue for `client`; false if another live client holds it.
    pub fn try_lock(
        &mut self,
        group: &str,
        topic: &str,
        queue: u32,
        client: &str,
        now_ms: i64,
    ) -> bool {
        let key = (group.to_string(), topic.to_string(), queue);
        match self.owners.get_mut(&key) {
            Some((owner, renewed)) if owner != client && now_ms - *renewed <= LOCK_EXPIRY_MS => {
                false
            }
            Some(entry) => {
                *entry = (client.to_string(), now_ms);
                true
            }
            None => {
                self.owners.insert(key, (client.to_string(), now_ms));
                true
            }
        }
    }

    pub fn unlock(&mut self, group: &str, topic: &str, queue: u32, client: &str) {
        let key = (group.to_string(), topic.to_string(), queue);
        if self
            .owners
            .get(&key)
            .is_some_and(|(owner, _)| owner == client)
        {
            self.owners.remove(&key);
        }
    }

    /// Drops expired locks so the table stays bounded by the live ones.
    pub fn expire(&mut self, now_ms: i64) {
        self.owners
            .retain(|_, (_, renewed)| now_ms - *renewed <= LOCK_EXPIRY_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_owner_until_unlock_or_expiry() {
        let mut locks = QueueLocks::default();
        assert!(locks.try_lock("g", "t", 0, "a", 0));
        assert!(!locks.try_lock("g", "t", 0, "b", 1));
        assert!(locks.try_lock("g", "t", 0, "a", 2));
        assert!(locks.try_lock("g", "t", 0, "b", 3 + LOCK_EXPIRY_MS));
        locks.unlock("g", "t", 0, "b");
        assert!(locks.try_lock("g", "t", 0, "c", 4 + LOCK_EXPIRY_MS));
    }
}
