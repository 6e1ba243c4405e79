//! Delayed delivery, per shard: RocketMQ 4's delay levels and RocketMQ 5's timer messages.
//!
//! - A message with `DELAY` = level > 0 is stored in `SCHEDULE_TOPIC_XXXX`, queue level − 1,
//!   with its real topic and queue in `REAL_TOPIC` / `REAL_QID` and its delivery time in the
//!   consume-queue tags code. Each level's queue is in delivery-time order (one delay per
//!   level), so its progress is one offset: delivery re-reads the head of each level and
//!   re-puts every due message to its real queue (new commitlog and queue offset, `DELAY`
//!   removed), then moves that level's offset.
//! - A message with `TIMER_DELIVER_MS` (absolute), `TIMER_DELAY_SEC`, `TIMER_DELAY_MS` or
//!   ali-ons' `__STARTDELIVERTIME` (absolute) is stored in `rmq_sys_wheel_timer` queue 0.
//!   That queue is in arrival order, not delivery order: its units are scanned into the
//!   shard's timing wheel (`shards::wheel`, 100 ms ticks) and delivered when their slot
//!   comes round, within a tick of the time asked. At most `TIMER_PENDING_MAX` wait in memory;
//!   beyond that the scan pauses (the rest stay on disk, later than asked).
//!
//! Progress (`config/delayOffset.json`, with `.bak`): per level, the next schedule-queue
//! offset; for timers, the first offset not yet delivered plus the delivered offsets above it.
//! It is written at most every `DELAY_PROGRESS_FLUSH_INTERVAL_MS`, and only once the re-put
//! messages it counts are durable, so a crash never loses a due message: at worst a message
//! delivered in the last interval before a kill -9 is delivered again. A clean shutdown
//! writes it last, after the store's final flush, so a restart neither loses nor repeats.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use serde_json::{json, Value};
use shards::store::{record, MessageToStore};
use shards::sync::Signal;
use shards::wheel::TimerWheel;

use crate::body::{encode_properties, java_string_hash, parse_properties, property};
use crate::error::{now_ms, RequestError};
use crate::persist;

use super::send::to_v4;
use super::Broker;

pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
/// RocketMQ's messageDelayLevel default.
pub const DELAY_LEVELS_DEFAULT: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";
/// Most delay levels a table may have (one schedule queue each).
pub const DELAY_LEVELS_MAX: usize = 64;
/// Longest timer delay accepted (RocketMQ's timerMaxDelaySec, 3 days).
pub const TIMER_DELAY_MAX_MS: i64 = 3 * 24 * 3600 * 1000;
/// Timer messages held in memory at once; the scan of the timer queue pauses beyond it.
pub const TIMER_PENDING_MAX: usize = 1_000_000;
/// Tick of the timer wheel: timer messages are delivered within this of their time.
pub const TIMER_TICK_MS: u64 = 100;
/// Slots of the timer wheel (one turn = slots × tick; longer delays wait whole turns).
pub const TIMER_WHEEL_SLOTS: usize = 4096;
/// Messages one delivery round re-puts per level (and for timers) before yielding.
pub const DELIVER_BATCH_MAX: usize = 4096;
/// Longest the delivery task sleeps when nothing is due sooner.
pub const DELIVER_IDLE_WAKE_MS: i64 = 1_000;
/// How often delivery progress is written (when it changed).
pub const DELAY_PROGRESS_FLUSH_INTERVAL_MS: u64 = 1_000;

/// The delay of each level, in milliseconds (level 1 first).
#[derive(Debug, Clone, PartialEq)]
pub struct DelayLevels {
    delays_ms: Vec<i64>,
}

impl Default for DelayLevels {
    fn default() -> Self {
        DelayLevels::parse(DELAY_LEVELS_DEFAULT).expect("the default delay table parses")
    }
}

impl DelayLevels {
    /// Parses RocketMQ's `messageDelayLevel` form: durations with unit `ms`, `s`, `m`, `h`
    /// or `d`, separated by spaces.
    pub fn parse(text: &str) -> Result<DelayLevels, String> {
        let mut delays_ms = Vec::new();
        for word in text.split_whitespace() {
            let split = word
                .find(|c: char| !c.is_ascii_digit())
                .ok_or_else(|| format!("delay level '{word}' has no unit (ms, s, m, h or d)"))?;
            let (number, unit) = word.split_at(split);
            let number: i64 = number
                .parse()
                .map_err(|_| format!("delay level '{word}' does not start with a number"))?;
            let unit_ms = match unit {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return Err(format!("delay level '{word}': unknown unit '{unit}'")),
            };
            let delay = number
                .checked_mul(unit_ms)
                .filter(|d| (1..=TIMER_DELAY_MAX_MS * 10).contains(d))
                .ok_or_else(|| format!("delay level '{word}' is out of range"))?;
            delays_ms.push(delay);
        }
        if delays_ms.is_empty() || delays_ms.len() > DELAY_LEVELS_MAX {
            return Err(format!(
                "a delay table needs 1 to {DELAY_LEVELS_MAX} levels, got {}",
                delays_ms.len()
            ));
        }
        Ok(DelayLevels { delays_ms })
    }

    pub fn max_level(&self) -> u32 {
        self.delays_ms.len() as u32
    }

    /// Delay of `level` (clamped into 1..=max, as RocketMQ clamps higher levels).
    pub fn delay_ms(&self, level: u32) -> i64 {
        let index = level.clamp(1, self.max_level()) as usize - 1;
        self.delays_ms[index]
    }
}

/// Where a message goes before its real queue, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Divert {
    /// Deliver now.
    None,
    /// Delay level (already clamped), delivered at `deliver_ms`.
    Level { level: u32, deliver_ms: i64 },
    /// Timer message due at `deliver_ms`.
    Timer { deliver_ms: i64 },
}

/// Decides from a message's properties whether it waits, and where.
pub fn divert_for(
    pairs: &[(&str, &str)],
    levels: &DelayLevels,
    now_ms: i64,
) -> Result<Divert, RequestError> {
    let lookup = |key: &str| pairs.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v);
    let number = |key: &str| -> Result<Option<i64>, RequestError> {
        match lookup(key) {
            None => Ok(None),
            Some(text) => text.trim().parse::<i64>().map(Some).map_err(|_| {
                RequestError::MessageIllegal(format!("property {key}={text} is not a number"))
            }),
        }
    };
    let timer_at = if let Some(at) = number(property::TIMER_DELIVER_MS)? {
        Some(at)
    } else if let Some(seconds) = number(property::TIMER_DELAY_SEC)? {
        Some(now_ms.saturating_add(seconds.saturating_mul(1000)))
    } else if let Some(millis) = number(property::TIMER_DELAY_MS)? {
        Some(now_ms.saturating_add(millis))
    } else {
        number(property::START_DELIVER_TIME)?
    };
    if let Some(deliver_ms) = timer_at {
        if deliver_ms - now_ms > TIMER_DELAY_MAX_MS {
            return Err(RequestError::MessageIllegal(format!(
                "timer message delivery time is more than {} s away",
                TIMER_DELAY_MAX_MS / 1000
            )));
        }
        if deliver_ms <= now_ms {
            return Ok(Divert::None);
        }
        return Ok(Divert::Timer { deliver_ms });
    }
    match number(property::DELAY)? {
        Some(level) if level > 0 => {
            let level = level.min(i64::from(levels.max_level())) as u32;
            Ok(Divert::Level {
                level,
                deliver_ms: now_ms + levels.delay_ms(level),
            })
        }
        _ => Ok(Divert::None),
    }
}

/// Properties a re-put message loses: those that made it wait.
const WAIT_PROPERTIES: [&str; 7] = [
    property::DELAY,
    property::REAL_TOPIC,
    property::REAL_QID,
    property::TIMER_DELIVER_MS,
    property::TIMER_DELAY_SEC,
    property::TIMER_DELAY_MS,
    property::START_DELIVER_TIME,
];

/// The delivery progress of one shard (see the module docs).
pub struct ScheduleState {
    path: PathBuf,
    pub levels: DelayLevels,
    /// Level → next offset of schedule queue level − 1.
    level_offsets: BTreeMap<u32, u64>,
    /// Every timer offset below this was delivered.
    timer_floor: u64,
    /// Delivered timer offsets at or above the floor.
    timer_delivered: BTreeSet<u64>,
    /// Next timer offset to scan into the wheel.
    timer_scan: u64,
    timer_wheel: TimerWheel<u64>,
    dirty: bool,
    /// Woken when a message is diverted, so the delivery task looks again.
    pub wakeup: Rc<Signal>,
}

impl ScheduleState {
    pub fn load(path: PathBuf, levels: DelayLevels) -> ScheduleState {
        let loaded =
            persist::read_with_fallback(&path, |bytes| serde_json::from_slice::<Value>(bytes).ok());
        let mut state = ScheduleState {
            path,
            levels,
            level_offsets: BTreeMap::new(),
            timer_floor: 0,
            timer_delivered: BTreeSet::new(),
            timer_scan: 0,
            timer_wheel: TimerWheel::new(TIMER_TICK_MS, TIMER_WHEEL_SLOTS, now_ms() as u64),
            dirty: false,
            wakeup: Rc::new(Signal::default()),
        };
        if let Some(value) = loaded {
            if let Some(table) = value.get("offsetTable").and_then(Value::as_object) {
                for (level, offset) in table {
                    if let (Ok(level), Some(offset)) = (level.parse::<u32>(), offset.as_u64()) {
                        state.level_offsets.insert(level, offset);
                    }
                }
            }
            if let Some(timer) = value.get("timerProgress") {
                state.timer_floor = timer.get("floor").and_then(Value::as_u64).unwrap_or(0);
                if let Some(runs) = timer.get("delivered").and_then(Value::as_array) {
                    for run in runs {
                        let bounds = run.as_array().map(|r| {
                            (
                                r.first().and_then(Value::as_u64),
                                r.get(1).and_then(Value::as_u64),
                            )
                        });
                        if let Some((Some(first), Some(last))) = bounds {
                            let last = last.min(first + TIMER_PENDING_MAX as u64 * 4);
                            state.timer_delivered.extend(first..=last);
                        }
                    }
                }
            }
        }
        state.timer_scan = state.timer_floor;
        state
    }

    /// The JSON written to delayOffset.json.
    fn to_json(&self) -> Value {
        let table: serde_json::Map<String, Value> = self
            .level_offsets
            .iter()
            .map(|(level, offset)| (level.to_string(), json!(offset)))
            .collect();
        let mut runs: Vec<[u64; 2]> = Vec::new();
        for &offset in &self.timer_delivered {
            match runs.last_mut() {
                Some(run) if run[1] + 1 == offset => run[1] = offset,
                _ => runs.push([offset, offset]),
            }
        }
        json!({
            "offsetTable": table,
            "timerProgress": {"floor": self.timer_floor, "delivered": runs},
            "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": now_ms()},
        })
    }

    fn mark_timer_delivered(&mut self, offset: u64) {
        self.timer_delivered.insert(offset);
        while self.timer_delivered.remove(&self.timer_floor) {
            self.timer_floor += 1;
        }
        self.dirty = true;
    }

    /// Messages waiting, per level and in the timer wheel (GET_ALL_DELAY_OFFSET, admin).
    pub fn level_offsets(&self) -> &BTreeMap<u32, u64> {
        &self.level_offsets
    }

    pub fn timers_pending(&self) -> usize {
        self.timer_wheel.len()
    }
}

/// One message re-put to its real queue, owned (the record buffer is dropped first).
struct Due {
    topic: String,
    queue_id: u32,
    flag: i32,
    sys_flag: i32,
    born_timestamp_ms: i64,
    born_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body: Vec<u8>,
    properties: Vec<u8>,
    tags_code: i64,
}

impl Due {
    fn from_record(bytes: &[u8]) -> Result<Due, String> {
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
    fn put_due(&self, due: &Due) -> bool {
        let queue_id = match self.topics.borrow().get(&due.topic) {
            Some(config) => due.queue_id % config.write_queue_nums.max(1),
            None => {
                eprintln!(
                    "shardmq: {}: delayed message for deleted topic {} dropped",
                    self.identity.broker_name, due.topic
                );
                return false;
            }
        };
        let message = MessageToStore {
            topic: &due.topic,
            queue_id,
            flag: due.flag,
            sys_flag: due.sys_flag,
            born_timestamp_ms: due.born_timestamp_ms,
            born_host: to_v4(due.born_host),
            reconsume_times: due.reconsume_times,
            prepared_transaction_offset: due.prepared_transaction_offset,
            body: &due.body,
            properties: &due.properties,
            tags_code: due.tags_code,
        };
        match self.store.append(&message) {
            Ok(_) => {
                self.notify_message_arrived(&due.topic, queue_id);
                true
            }
            Err(error) => {
                eprintln!(
                    "shardmq: {}: cannot deliver a delayed message yet: {error}",
                    self.identity.broker_name
                );
                false
            }
        }
    }

    /// Delivers what is due on every level; returns the earliest time something else is due.
    async fn deliver_due_levels(&self, now: i64) -> Option<i64> {
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
                    .max(self.store.min_queue_offset(SCHEDULE_TOPIC, queue_id));
                let unit = match self.store.queue_unit(SCHEDULE_TOPIC, queue_id, offset) {
                    Ok(Some(unit)) => unit,
                    Ok(None) => break,
                    Err(error) => {
                        eprintln!("shardmq: schedule queue {queue_id}: {error}");
                        break;
                    }
                };
                let (physical_offset, _, deliver_ms) = unit;
                if deliver_ms > now {
                    next_due = Some(next_due.map_or(deliver_ms, |d| d.min(deliver_ms)));
                    break;
                }
                if !self.deliver_record(physical_offset).await {
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
    async fn deliver_record(&self, physical_offset: u64) -> bool {
        let due = match self.store.read_record(physical_offset).await {
            Ok(Some(bytes)) => Due::from_record(&bytes),
            Ok(None) => Err("no record at that offset".to_string()),
            Err(error) => Err(error.to_string()),
        };
        match due {
            Ok(due) => self.put_due(&due) || self.topics.borrow().get(&due.topic).is_none(),
            Err(why) => {
                eprintln!(
                    "shardmq: {}: delayed message at {physical_offset} skipped: {why}",
                    self.identity.broker_name
                );
                true
            }
        }
    }

    /// Moves newly stored timer messages into the wheel.
    fn scan_timers(&self) {
        let mut schedule = self.schedule.borrow_mut();
        let end = self.store.max_queue_offset(TIMER_TOPIC, 0);
        let min = self.store.min_queue_offset(TIMER_TOPIC, 0);
        schedule.timer_scan = schedule.timer_scan.max(min);
        schedule.timer_floor = schedule.timer_floor.max(min);
        while schedule.timer_scan < end && schedule.timer_wheel.len() < TIMER_PENDING_MAX {
            let offset = schedule.timer_scan;
            schedule.timer_scan += 1;
            if schedule.timer_delivered.contains(&offset) {
                continue;
            }
            match self.store.queue_unit(TIMER_TOPIC, 0, offset) {
                Ok(Some((_, _, deliver_ms))) => {
                    schedule
                        .timer_wheel
                        .insert(deliver_ms.max(0) as u64, offset);
                }
                Ok(None) => schedule.mark_timer_delivered(offset),
                Err(error) => {
                    eprintln!("shardmq: timer queue: {error}");
                    schedule.timer_scan = offset;
                    break;
                }
            }
        }
    }

    /// Delivers the timer messages whose time has come; returns when the next tick is due.
    async fn deliver_due_timers(&self, now: i64) -> Option<i64> {
        self.scan_timers();
        let expired = self.schedule.borrow_mut().timer_wheel.advance(now as u64);
        let mut retry_later = Vec::new();
        for (_, offset) in expired {
            let unit = self.store.queue_unit(TIMER_TOPIC, 0, offset);
            let delivered = match unit {
                Ok(Some((physical_offset, _, _))) => self.deliver_record(physical_offset).await,
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
            eprintln!("shardmq: delay progress not written: {error}");
            return;
        }
        let path = self.schedule.borrow().path.clone();
        if !persist::write_json_or_log(&path, &json) {
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
            let now = now_ms();
            let levels_due = self.deliver_due_levels(now).await;
            let timers_due = self.deliver_due_timers(now).await;
            let next = [levels_due, timers_due].into_iter().flatten().min();
            let wait_ms = next.map_or(DELIVER_IDLE_WAKE_MS, |at| {
                (at - now_ms()).clamp(0, DELIVER_IDLE_WAKE_MS)
            });
            // A full batch leaves more due at once: a 1 ms pause lets requests run between.
            let wait_ms = wait_ms.max(1) as u64;
            shards::runtime::timeout(Duration::from_millis(wait_ms), wakeup.wait()).await;
        }
    }

    /// Rewrites a message that must wait: its destination goes into properties and it is
    /// stored in the schedule or timer queue instead. Returns (topic, queue id, tags code).
    pub(super) fn divert(
        &self,
        divert: Divert,
        topic: &str,
        queue_id: u32,
        properties: &mut Vec<u8>,
    ) -> (&'static str, u32, i64) {
        let queue_text = queue_id.to_string();
        let mut extra = vec![
            (property::REAL_TOPIC, topic),
            (property::REAL_QID, queue_text.as_str()),
        ];
        let (target, target_queue, deliver_ms) = match divert {
            Divert::Level { level, deliver_ms } => (SCHEDULE_TOPIC, level - 1, deliver_ms),
            Divert::Timer { deliver_ms } => (TIMER_TOPIC, 0, deliver_ms),
            Divert::None => unreachable!("divert called for a message that does not wait"),
        };
        let deliver_text = deliver_ms.to_string();
        if matches!(divert, Divert::Timer { .. }) {
            extra.push((property::TIMER_OUT_MS, deliver_text.as_str()));
        }
        if !properties.is_empty() && properties.last() != Some(&2) {
            properties.push(2);
        }
        encode_properties(properties, &extra);
        self.schedule.borrow().wakeup.notify();
        (target, target_queue, deliver_ms)
    }
}

impl Broker {
    /// GET_ALL_DELAY_OFFSET (45): the delayOffset.json form of this shard's progress.
    pub(super) fn all_delay_offset(
        &self,
        request: &crate::remoting::RemotingCommand<'_>,
        connection: &Rc<crate::server::Connection>,
    ) -> Result<(), RequestError> {
        let json = self.schedule.borrow().to_json();
        let body = serde_json::to_vec(&json).unwrap_or_default();
        crate::namesrv::respond_body(connection, request, &body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_tables_parse() {
        let levels = DelayLevels::default();
        assert_eq!(levels.max_level(), 18);
        assert_eq!(levels.delay_ms(1), 1_000);
        assert_eq!(levels.delay_ms(3), 10_000);
        assert_eq!(levels.delay_ms(18), 7_200_000);
        assert_eq!(levels.delay_ms(99), 7_200_000);
        let short = DelayLevels::parse("200ms 1s 2m 1h 1d").unwrap();
        assert_eq!(short.delay_ms(1), 200);
        assert_eq!(short.delay_ms(5), 86_400_000);
        for bad in ["", "5", "5x", "s", "0s", "-1s"] {
            assert!(DelayLevels::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_are_diverted_by_their_properties() {
        let levels = DelayLevels::default();
        let now = 1_000_000;
        assert_eq!(divert_for(&[], &levels, now).unwrap(), Divert::None);
        assert_eq!(
            divert_for(&[("DELAY", "2")], &levels, now).unwrap(),
            Divert::Level {
                level: 2,
                deliver_ms: now + 5_000
            }
        );
        assert_eq!(
            divert_for(&[("DELAY", "40")], &levels, now).unwrap(),
            Divert::Level {
                level: 18,
                deliver_ms: now + 7_200_000
            }
        );
        assert_eq!(
            divert_for(&[("DELAY", "0")], &levels, now).unwrap(),
            Divert::None
        );
        assert_eq!(
            divert_for(&[("TIMER_DELAY_SEC", "3")], &levels, now).unwrap(),
            Divert::Timer {
                deliver_ms: now + 3_000
            }
        );
        assert_eq!(
            divert_for(&[("TIMER_DELIVER_MS", "1500000")], &levels, now).unwrap(),
            Divert::Timer {
                deliver_ms: 1_500_000
            }
        );
        assert_eq!(
            divert_for(&[("__STARTDELIVERTIME", "999")], &levels, now).unwrap(),
            Divert::None
        );
        assert!(divert_for(&[("TIMER_DELAY_MS", "x")], &levels, now).is_err());
        assert!(divert_for(
            &[(
                "TIMER_DELAY_SEC",
                &(TIMER_DELAY_MAX_MS / 1000 + 5).to_string()
            )],
            &levels,
            now
        )
        .is_err());
    }

    #[test]
    fn timer_progress_round_trips() {
        let dir = std::env::temp_dir().join(format!("shardmq-sched-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("delayOffset.json");
        let mut state = ScheduleState::load(path.clone(), DelayLevels::default());
        state.level_offsets.insert(2, 7);
        for offset in [0, 1, 3, 4, 6] {
            state.mark_timer_delivered(offset);
        }
        assert_eq!(state.timer_floor, 2);
        persist::write_json_file(&path, &state.to_json()).unwrap();
        let loaded = ScheduleState::load(path, DelayLevels::default());
        assert_eq!(loaded.level_offsets.get(&2), Some(&7));
        assert_eq!(loaded.timer_floor, 2);
        assert_eq!(loaded.timer_scan, 2);
        assert_eq!(
            loaded.timer_delivered.iter().copied().collect::<Vec<_>>(),
            vec![3, 4, 6]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
