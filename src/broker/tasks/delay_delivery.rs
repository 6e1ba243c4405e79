//! The shard's delivery task for delayed and timer messages (state/schedule.rs has the
//! model): delivers what is due through `append`, sleeps until the next is due or a new one is
//! stored, and writes delivery progress once what it counts is durable.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use shards::store::record;

use crate::body::{encode_properties, java_string_hash, parse_properties, property};
use crate::broker::append::to_v4;
use crate::broker::append::Outgoing;
use crate::broker::route::Destination;
use crate::broker::state::schedule::{
    SCHEDULE_TOPIC, TIMER_PENDING_MAX, TIMER_TOPIC, WAIT_PROPERTIES,
};
use crate::broker::Broker;
use crate::persist;

pub use crate::limits::DELIVER_BATCH_MAX;

/// Longest the delivery task sleeps when nothing is due sooner.
pub const DELIVER_IDLE_WAKE_MS: i64 = 1_000;

/// How often delivery progress is written (when it changed).
pub const DELAY_PROGRESS_FLUSH_INTERVAL_MS: u64 = 1_000;

/// One message re-put to its real queue, owned (the record buffer is dropped first).
pub(crate) struct Due {
    pub(crate) topic: String,
    pub(crate) queue_id: u32,
    pub(crate) flag: i32,
    pub(crate) sys_flag: i32,
    pub(crate) born_timestamp_ms: i64,
    pub(crate) born_host: SocketAddr,
    pub(crate) reconsume_times: i32,
    pub(crate) prepared_transaction_offset: i64,
    pub(crate) body: Vec<u8>,
    pub(crate) properties: Vec<u8>,
    pub(crate) tags_code: i64,
}

impl Due {
    pub(crate) fn from_record(bytes: &[u8]) -> Result<Due, String> {
        let msg = record::decode(bytes).map_err(|e| format!("{e}"))?;
        let pairs = parse_properties(msg.properties);
        let lookup = |key: &str| pairs.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let topic = lookup(property::REAL_TOPIC)
            .ok_or("the record has no REAL_TOPIC")?
            .to_string();
        let queue_id = lookup(property::REAL_QID)
            .and_then(|q| q.parse::<u32>().ok())
            .ok_or("the record has no valid REAL_QID")?;
        let kept: Vec<(&str, &str)> = pairs
            .iter()
            .filter(|(k, _)| !WAIT_PROPERTIES.contains(k))
            .copied()
            .collect();
        let mut properties = Vec::with_capacity(msg.properties.len());
        encode_properties(&mut properties, &kept);
        let tags_code = lookup(property::TAGS).map_or(0, |tag| i64::from(java_string_hash(tag)));
        Ok(Due {
            topic,
            queue_id,
            flag: msg.flag,
            sys_flag: msg.sys_flag,
            born_timestamp_ms: msg.born_timestamp_ms,
            born_host: msg.born_host,
            reconsume_times: msg.reconsume_times,
            prepared_transaction_offset: msg.prepared_transaction_offset,
            body: msg.body.to_vec(),
            properties,
            tags_code,
        })
    }
}

impl Broker {
    /// Re-puts a due message to its real queue; false when it cannot be (logged).
    pub(crate) fn put_due(&self, due: &Due) -> bool {
        let queue_id = match self.topics.borrow().get(&due.topic) {
            Some(config) => due.queue_id % config.write_queue_nums.max(1),
            None => {
                log::warn!(
                    "{}: delayed message for deleted topic {} dropped",
                    self.identity.broker_name,
                    due.topic
                );
                return false;
            }
        };
        let mut properties = due.properties.clone();
        let message = Outgoing {
            flag: due.flag,
            sys_flag: due.sys_flag,
            born_timestamp_ms: due.born_timestamp_ms,
            born_host: to_v4(due.born_host),
            reconsume_times: due.reconsume_times,
            prepared_transaction_offset: due.prepared_transaction_offset,
            body: &due.body,
            properties: &mut properties,
            tags_code: due.tags_code,
            keys: None,
            unique_id: "",
            producer_group: "",
        };
        let destination = Destination::Queue {
            topic: &due.topic,
            queue_id,
        };
        match self.append(message, &destination) {
            Ok(_) => true,
            Err(error) => {
                log::warn!(
                    "{}: cannot deliver a delayed message yet: {error}",
                    self.identity.broker_name
                );
                false
            }
        }
    }

    /// Delivers what is due on every level; returns the earliest time something else is due.
    pub(crate) async fn deliver_due_levels(&self, now: i64) -> Option<i64> {
        let mut next_due: Option<i64> = None;
        let max_level = self.schedule.borrow().levels.max_level();
        for level in 1..=max_level {
            let queue_id = level - 1;
            for _ in 0..DELIVER_BATCH_MAX {
                let offset = self
                    .schedule
                    .borrow()
                    .level_offsets
                    .get(&level)
                    .copied()
                    .unwrap_or(0)
                    .max(
                        (self
                            .store
                            .min_queue_offset(SCHEDULE_TOPIC, shards::QueueId(queue_id)))
                        .0,
                    );
                let unit = match self.store.queue_unit(
                    SCHEDULE_TOPIC,
                    shards::QueueId(queue_id),
                    shards::QueueOffset(offset),
                ) {
                    Ok(Some(unit)) => unit,
                    Ok(None) => break,
                    Err(error) => {
                        log::warn!("schedule queue {queue_id}: {error}");
                        break;
                    }
                };
                let (physical_offset, _, deliver_ms) = unit;
                if deliver_ms > now {
                    next_due = Some(next_due.map_or(deliver_ms, |d| d.min(deliver_ms)));
                    break;
                }
                if !self.deliver_record(physical_offset.0).await {
                    // The store refuses writes for now: try again on the next round.
                    return Some(now + DELIVER_IDLE_WAKE_MS);
                }
                let mut schedule = self.schedule.borrow_mut();
                schedule.level_offsets.insert(level, offset + 1);
                schedule.dirty = true;
            }
        }
        next_due
    }

    /// Reads the record at `physical_offset` and re-puts it; a record that cannot be read
    /// or lacks its destination is logged and skipped (true), a refused append is false.
    pub(crate) async fn deliver_record(&self, physical_offset: u64) -> bool {
        let due = match self
            .store
            .read_record(shards::CommitLogOffset(physical_offset))
            .await
        {
            Ok(Some(bytes)) => Due::from_record(&bytes),
            Ok(None) => Err("no record at that offset".to_string()),
            Err(error) => Err(error.to_string()),
        };
        match due {
            Ok(due) => self.put_due(&due) || self.topics.borrow().get(&due.topic).is_none(),
            Err(why) => {
                log::warn!(
                    "{}: delayed message at {physical_offset} skipped: {why}",
                    self.identity.broker_name
                );
                true
            }
        }
    }

    /// Moves newly stored timer messages into the wheel.
    pub(crate) fn scan_timers(&self) {
        let mut schedule = self.schedule.borrow_mut();
        let end = self.store.max_queue_offset(TIMER_TOPIC, shards::QueueId(0));
        let min = self.store.min_queue_offset(TIMER_TOPIC, shards::QueueId(0));
        schedule.timer_scan = schedule.timer_scan.max(min.0);
        schedule.timer_floor = schedule.timer_floor.max(min.0);
        while schedule.timer_scan < end.0 && schedule.timer_wheel.len() < TIMER_PENDING_MAX {
            let offset = schedule.timer_scan;
            schedule.timer_scan += 1;
            if schedule.timer_delivered.contains(&offset) {
                continue;
            }
            match self.store.queue_unit(
                TIMER_TOPIC,
                shards::QueueId(0),
                shards::QueueOffset(offset),
            ) {
                Ok(Some((_, _, deliver_ms))) => {
                    schedule
                        .timer_wheel
                        .insert(deliver_ms.max(0) as u64, offset);
                }
                Ok(None) => schedule.mark_timer_delivered(offset),
                Err(error) => {
                    log::warn!("timer queue: {error}");
                    schedule.timer_scan = offset;
                    break;
                }
            }
        }
    }

    /// Delivers the timer messages whose time has come; returns when the next tick is due.
    pub(crate) async fn deliver_due_timers(&self, now: i64) -> Option<i64> {
        self.scan_timers();
        let expired = self.schedule.borrow_mut().timer_wheel.advance(now as u64);
        let mut retry_later = Vec::new();
        for (_, offset) in expired {
            let unit =
                self.store
                    .queue_unit(TIMER_TOPIC, shards::QueueId(0), shards::QueueOffset(offset));
            let delivered = match unit {
                Ok(Some((physical_offset, _, _))) => self.deliver_record(physical_offset.0).await,
                Ok(None) => true,
                Err(_) => false,
            };
            if delivered {
                self.schedule.borrow_mut().mark_timer_delivered(offset);
            } else {
                retry_later.push(offset);
            }
        }
        let mut schedule = self.schedule.borrow_mut();
        let retry_at = (now + DELIVER_IDLE_WAKE_MS) as u64;
        for offset in retry_later {
            schedule.timer_wheel.insert(retry_at, offset);
        }
        schedule.timer_wheel.next_due_ms().map(|at| at as i64)
    }

    /// Writes delivery progress if it changed, once what it counts is durable.
    pub async fn flush_schedule_progress(&self) {
        let (json, end) = {
            let mut schedule = self.schedule.borrow_mut();
            if !schedule.dirty {
                return;
            }
            schedule.dirty = false;
            (schedule.to_json(), self.store.max_physical_offset())
        };
        if let Err(error) = self.store.wait_durable(end).await {
            self.schedule.borrow_mut().dirty = true;
            log::warn!("delay progress not written: {error}");
            return;
        }
        let path = self.schedule.borrow().path.clone();
        if !persist::write_json_off_shard(path, json).await {
            self.schedule.borrow_mut().dirty = true;
        }
    }

    /// The shard's delivery task: delivers due messages, sleeps until the next is due (or a
    /// new one is diverted), and writes progress every DELAY_PROGRESS_FLUSH_INTERVAL_MS.
    pub async fn run_schedule(self: Rc<Self>) {
        let flusher = self.clone();
        shards::runtime::spawn_detached(async move {
            loop {
                shards::runtime::sleep(Duration::from_millis(DELAY_PROGRESS_FLUSH_INTERVAL_MS))
                    .await;
                flusher.flush_schedule_progress().await;
            }
        });
        let wakeup = self.schedule.borrow().wakeup.clone();
        loop {
            if self.ha.is_slave() {
                // A slave's copies are delivered by its master (whose deliveries replicate
                // here).
                let idle = Duration::from_millis(DELIVER_IDLE_WAKE_MS as u64);
                shards::runtime::sleep(idle).await;
                continue;
            }
            let now = self.now_ms();
            let levels_due = self.deliver_due_levels(now).await;
            let timers_due = self.deliver_due_timers(now).await;
            let next = [levels_due, timers_due].into_iter().flatten().min();
            let wait_ms = next.map_or(DELIVER_IDLE_WAKE_MS, |at| {
                (at - self.now_ms()).clamp(0, DELIVER_IDLE_WAKE_MS)
            });
            // A full batch leaves more due at once: a 1 ms pause lets requests run between.
            let wait_ms = wait_ms.max(1) as u64;
            shards::runtime::timeout(Duration::from_millis(wait_ms), wakeup.wait()).await;
        }
    }
}
