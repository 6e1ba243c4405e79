//! A consumer's view of one assigned queue (Java `ProcessQueue`): the messages pulled and not
//! yet consumed, ordered by queue offset, with the numbers flow control looks at (count, bytes,
//! offset span) and, for orderly consumption, the broker lock state and the batch in progress.
//!
//! Shared by the queue's pull task and its consume tasks behind one short mutex. Invariants:
//! the offset to commit is always the smallest offset not yet consumed (or one past the highest
//! pulled when nothing is cached), so a commit never skips an unconsumed message; once
//! `dropped`, the queue's tasks stop and commit nothing more.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use super::instance::lock;
use super::message::{now_ms, MessageExt};

/// A broker lock not renewed for this long is treated as lost (Java `REBALANCE_LOCK_MAX_LIVE_TIME`).
pub const LOCK_MAX_LIVE_MS: i64 = 30_000;

#[derive(Default)]
struct Cached {
    messages: BTreeMap<i64, MessageExt>,
    size_bytes: u64,
    /// Highest queue offset ever put here.
    max_offset: i64,
    /// Orderly: the batch being consumed, taken out of `messages`.
    consuming: BTreeMap<i64, MessageExt>,
    /// A consume task is running or scheduled for this queue (orderly dispatch).
    dispatched: bool,
}

#[derive(Default)]
pub struct ProcessQueue {
    cached: Mutex<Cached>,
    dropped: AtomicBool,
    locked: AtomicBool,
    last_lock_ms: AtomicI64,
    /// Orderly: held while a batch is consumed, so a queue is released only between batches.
    pub consume_lock: tokio::sync::Mutex<()>,
}

impl ProcessQueue {
    pub fn new() -> ProcessQueue {
        let queue = ProcessQueue::default();
        lock(&queue.cached).max_offset = -1;
        queue
    }

    pub fn is_dropped(&self) -> bool {
        self.dropped.load(Ordering::Acquire)
    }

    pub fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Release);
    }

    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Acquire)
            && now_ms() - self.last_lock_ms.load(Ordering::Acquire) <= LOCK_MAX_LIVE_MS
    }

    pub fn set_locked(&self, locked: bool) {
        if locked {
            self.last_lock_ms.store(now_ms(), Ordering::Release);
        }
        self.locked.store(locked, Ordering::Release);
    }

    /// Adds pulled messages; true when an orderly consume task should be started for them.
    pub fn put(&self, messages: Vec<MessageExt>) -> bool {
        let mut cached = lock(&self.cached);
        for message in messages {
            cached.max_offset = cached.max_offset.max(message.queue_offset);
            let size = message.body().len() as u64;
            if cached
                .messages
                .insert(message.queue_offset, message)
                .is_none()
            {
                cached.size_bytes += size;
            }
        }
        let start = !cached.dispatched && !cached.messages.is_empty();
        if start {
            cached.dispatched = true;
        }
        start
    }

    /// Removes consumed messages; returns the offset to commit (`None` if nothing was ever put).
    pub fn remove(&self, offsets: &[i64]) -> Option<i64> {
        let mut cached = lock(&self.cached);
        for offset in offsets {
            if let Some(message) = cached.messages.remove(offset) {
                cached.size_bytes = cached
                    .size_bytes
                    .saturating_sub(message.body().len() as u64);
            }
        }
        commit_offset(&cached)
    }

    pub fn cached_count(&self) -> usize {
        let cached = lock(&self.cached);
        cached.messages.len() + cached.consuming.len()
    }

    pub fn cached_size_bytes(&self) -> u64 {
        lock(&self.cached).size_bytes
    }

    /// Offset distance between the oldest and the newest cached message.
    pub fn offset_span(&self) -> i64 {
        let cached = lock(&self.cached);
        match (
            cached.messages.first_key_value(),
            cached.messages.last_key_value(),
        ) {
            (Some((first, _)), Some((last, _))) => last - first,
            _ => 0,
        }
    }

    /// Orderly: takes up to `count` messages in offset order; an empty result ends the
    /// dispatch (the next `put` starts a new consume task).
    pub fn take(&self, count: usize) -> Vec<MessageExt> {
        let mut cached = lock(&self.cached);
        let mut taken = Vec::new();
        while taken.len() < count {
            let Some((offset, message)) = cached.messages.pop_first() else {
                break;
            };
            cached.consuming.insert(offset, message.clone());
            taken.push(message);
        }
        if taken.is_empty() {
            cached.dispatched = false;
        }
        taken
    }

    /// Orderly: the batch was consumed; returns the offset to commit.
    pub fn commit(&self) -> Option<i64> {
        let mut cached = lock(&self.cached);
        let consumed = std::mem::take(&mut cached.consuming);
        for message in consumed.values() {
            cached.size_bytes = cached
                .size_bytes
                .saturating_sub(message.body().len() as u64);
        }
        commit_offset(&cached)
    }

    /// Orderly: puts the batch back to be consumed again (with its retry counts raised).
    pub fn make_available_again(&self, messages: Vec<MessageExt>) {
        let mut cached = lock(&self.cached);
        for message in messages {
            cached.consuming.remove(&message.queue_offset);
            cached.messages.insert(message.queue_offset, message);
        }
    }
}

fn commit_offset(cached: &Cached) -> Option<i64> {
    if let Some((first, _)) = cached.consuming.first_key_value() {
        return Some(*first);
    }
    match cached.messages.first_key_value() {
        Some((first, _)) => Some(*first),
        None if cached.max_offset >= 0 => Some(cached.max_offset + 1),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    fn message(offset: i64) -> MessageExt {
        MessageExt {
            message: Message::new("T", vec![0u8; 10]),
            msg_id: offset.to_string(),
            offset_msg_id: String::new(),
            broker_name: "b".into(),
            queue_id: 0,
            queue_offset: offset,
            commit_log_offset: 0,
            sys_flag: 0,
            born_timestamp_ms: 0,
            born_host: "127.0.0.1:1".parse().unwrap(),
            store_timestamp_ms: 0,
            store_host: "127.0.0.1:2".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            store_size_bytes: 0,
        }
    }

    #[test]
    fn commit_offset_never_skips_an_unconsumed_message() {
        let queue = ProcessQueue::new();
        assert_eq!(queue.remove(&[]), None);
        queue.put((5..10).map(message).collect());
        assert_eq!(queue.cached_count(), 5);
        assert_eq!(queue.cached_size_bytes(), 50);
        assert_eq!(queue.offset_span(), 4);
        assert_eq!(queue.remove(&[6, 7]), Some(5));
        assert_eq!(queue.remove(&[5]), Some(8));
        assert_eq!(queue.remove(&[8, 9]), Some(10));
        assert_eq!(queue.cached_size_bytes(), 0);
    }

    #[test]
    fn orderly_take_commit_and_retry() {
        let queue = ProcessQueue::new();
        assert!(queue.put((0..3).map(message).collect()));
        assert!(!queue.put(vec![message(3)]), "already dispatched");
        let batch = queue.take(2);
        assert_eq!(
            batch.iter().map(|m| m.queue_offset).collect::<Vec<_>>(),
            [0, 1]
        );
        queue.make_available_again(batch);
        assert_eq!(queue.take(2).len(), 2);
        assert_eq!(queue.commit(), Some(2));
        assert_eq!(queue.take(10).len(), 2);
        assert_eq!(queue.commit(), Some(4));
        assert!(queue.take(1).is_empty());
        assert!(
            queue.put(vec![message(4)]),
            "a new dispatch after the queue ran dry"
        );
    }
}
