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
use std::path::PathBuf;
use std::rc::Rc;

use serde_json::{json, Value};
use shards::sync::Signal;
use shards::wheel::TimerWheel;

use crate::body::property;
use crate::error::{now_ms, RequestError};
use crate::persist;

pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";

pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";

/// RocketMQ's messageDelayLevel default.
pub const DELAY_LEVELS_DEFAULT: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

pub use crate::limits::DELAY_LEVELS_MAX;

pub use crate::limits::TIMER_DELAY_MAX_MS;

pub use crate::limits::TIMER_PENDING_MAX;

/// Tick of the timer wheel: timer messages are delivered within this of their time.
pub const TIMER_TICK_MS: u64 = 100;

/// Slots of the timer wheel (one turn = slots × tick; longer delays wait whole turns).
pub const TIMER_WHEEL_SLOTS: usize = 4096;

/// The delay of each level, in milliseconds (level 1 first).
#[derive(Debug, Clone, PartialEq)]
pub struct DelayLevels {
    pub(crate) delays_ms: Vec<i64>,
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
pub(crate) const WAIT_PROPERTIES: [&str; 7] = [
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
    pub(crate) path: PathBuf,
    pub levels: DelayLevels,
    /// Level → next offset of schedule queue level − 1.
    pub(crate) level_offsets: BTreeMap<u32, u64>,
    /// Every timer offset below this was delivered.
    pub(crate) timer_floor: u64,
    /// Delivered timer offsets at or above the floor.
    pub(crate) timer_delivered: BTreeSet<u64>,
    /// Next timer offset to scan into the wheel.
    pub(crate) timer_scan: u64,
    pub(crate) timer_wheel: TimerWheel<u64>,
    pub(crate) dirty: bool,
    /// Woken when a message is diverted, so the delivery task looks again.
    pub wakeup: Rc<Signal>,
}

impl ScheduleState {
    /// Loads progress; `now_ms` (the shard clock) starts the timer wheel.
    pub fn load(path: PathBuf, levels: DelayLevels, now_ms: i64) -> ScheduleState {
        let loaded =
            persist::read_with_fallback(&path, |bytes| serde_json::from_slice::<Value>(bytes).ok());
        let mut state = ScheduleState {
            path,
            levels,
            level_offsets: BTreeMap::new(),
            timer_floor: 0,
            timer_delivered: BTreeSet::new(),
            timer_scan: 0,
            timer_wheel: TimerWheel::new(TIMER_TICK_MS, TIMER_WHEEL_SLOTS, now_ms.max(0) as u64),
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
    pub(crate) fn to_json(&self) -> Value {
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

    pub(crate) fn mark_timer_delivered(&mut self, offset: u64) {
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
        let mut state = ScheduleState::load(path.clone(), DelayLevels::default(), 0);
        state.level_offsets.insert(2, 7);
        for offset in [0, 1, 3, 4, 6] {
            state.mark_timer_delivered(offset);
        }
        assert_eq!(state.timer_floor, 2);
        persist::write_json_file(&path, &state.to_json()).unwrap();
        let loaded = ScheduleState::load(path, DelayLevels::default(), 0);
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
