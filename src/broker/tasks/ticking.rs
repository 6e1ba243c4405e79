//! Overload on one shard: sends are refused with SYSTEM_BUSY, quickly, when the shard
//! cannot keep up, so that clients back off or go to another broker instead of the broker
//! growing memory or latency. The thread-per-core counterparts of RocketMQ's answers:
//!
//! | RocketMQ | here | limit |
//! |---|---|---|
//! | `[TIMEOUT_CLEAN_QUEUE]`: a send waited in the send thread pool's queue longer than `waitTimeMillsInSendQueue` | the shard's executor runs late: its ticking task (every `PULL_WHEEL_TICK_MS`) fired, or would have fired, this much late, so requests read now have waited about as long in the socket | `SEND_QUEUE_WAIT_MAX_MS` |
//! | `[PC_SYNCHRONIZED]`: the commitlog put lock held longer than `osPageCacheBusyTimeOutMills` | the store's flush under way has been running this long (the disk keeps every append since waiting) | `STORE_FLUSH_BUSY_MS` |
//! | `[PC_SYNCHRONIZED]` / `[PCBUSY_CLEAN_QUEUE]` when the page cache is full | the store answers `Busy`: `TAIL_UNDURABLE_MAX_BYTES` wait for the disk (see `send::store_error`); the connection then reads no more requests until half of that is on disk, or `SEND_QUEUE_WAIT_MAX_MS` (`Broker::refused_by_store`), like a send waiting in RocketMQ's queue | `TAIL_UNDURABLE_MAX_BYTES` |
//!
//! The checks cost two clock reads per send. Consumers are bounded elsewhere: a consumer that
//! stops reading only fills its own connection's output cap (`server::OUTPUT_PAUSE_BYTES`).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::broker::handlers::pull::PULL_WHEEL_TICK_MS;
use crate::broker::Broker;
use crate::error::RequestError;

/// RocketMQ's waitTimeMillsInSendQueue: a shard running this late refuses sends.
pub const SEND_QUEUE_WAIT_MAX_MS: u64 = 200;

/// RocketMQ's osPageCacheBusyTimeOutMills: a flush running this long refuses sends.
pub const STORE_FLUSH_BUSY_MS: u64 = 1_000;

/// How long a late tick's lateness keeps counting: the requests that queued during a stall
/// are read over the next few executor turns (in whatever order glommio reaps its rings),
/// not necessarily before the next tick.
pub const LATENESS_HOLD_MS: u64 = 50;

/// Longest the ticking task sleeps while the shard is idle: an idle shard wakes about once a
/// second, not every `PULL_WHEEL_TICK_MS`.
pub const IDLE_TICK_MAX_MS: u64 = 1_000;
/// A shard with no request for this long is idle (its ticks slow down to `IDLE_TICK_MAX_MS`).
pub const IDLE_AFTER_MS: u64 = 10_000;

/// How late this shard runs, as its ticking task sees it.
#[derive(Default)]
pub struct ShardLoad {
    /// Requests handled since start (the ticking task tells an idle shard by it).
    pub(crate) requests: Cell<u64>,
    /// The ticking task sleeps long (the shard was idle): a request wakes it, and the shard
    /// does not count as late meanwhile.
    pub(crate) idle: Cell<bool>,
    pub(crate) wake: shards::sync::Signal,
    /// When the ticking task last ran (None before its first run).
    pub(crate) last_tick_at: Cell<Option<Instant>>,
    /// The worst lateness of a recent tick, and until when it counts.
    pub(crate) held_lateness: Cell<(Duration, Option<Instant>)>,
    /// Sends refused as overload since start (GET_BROKER_RUNTIME_INFO `sendRefusedBusy`).
    pub refused_sends: Cell<u64>,
}

impl ShardLoad {
    /// Called by the ticking task each time it runs.
    pub(crate) fn on_tick(&self, now: Instant) {
        if let Some(last) = self.last_tick_at.get() {
            let period = Duration::from_millis(PULL_WHEEL_TICK_MS);
            let lateness = now.saturating_duration_since(last).saturating_sub(period);
            if lateness >= self.held(now) {
                let until = now + Duration::from_millis(LATENESS_HOLD_MS);
                self.held_lateness.set((lateness, Some(until)));
            }
        }
        self.last_tick_at.set(Some(now));
    }

    pub(crate) fn held(&self, now: Instant) -> Duration {
        match self.held_lateness.get() {
            (lateness, Some(until)) if now < until => lateness,
            _ => Duration::ZERO,
        }
    }

    /// How late the shard runs at `now`: the worst lateness of the ticks of the last
    /// `LATENESS_HOLD_MS`, or how overdue the next tick is, whichever is more (a stalled
    /// shard has not ticked at all).
    pub fn lateness(&self, now: Instant) -> Duration {
        let Some(last) = self.last_tick_at.get() else {
            return Duration::ZERO;
        };
        if self.idle.get() {
            return Duration::ZERO;
        }
        let period = Duration::from_millis(PULL_WHEEL_TICK_MS);
        let overdue = now.saturating_duration_since(last).saturating_sub(period);
        overdue.max(self.held(now))
    }
}

impl Broker {
    /// One tick: measures how late the shard runs and expires parked pulls.
    pub fn tick(&self) {
        self.load.on_tick(Instant::now());
        self.pull_waiters.advance(self.monotonic_ms());
    }

    /// Counts a request; wakes the ticking task if it sleeps for idleness (one `Cell` read
    /// per request otherwise).
    pub(crate) fn note_request(&self) {
        self.load.requests.set(self.load.requests.get() + 1);
        if self.load.idle.get() {
            // Waking from idleness is not lateness: the gauge counts from now.
            self.load.idle.set(false);
            self.load.last_tick_at.set(Some(Instant::now()));
            self.load.wake.notify();
        }
    }

    /// The shard's ticking task: every `PULL_WHEEL_TICK_MS` while requests come and for
    /// `IDLE_AFTER_MS` after the last one (so a stall of a shard in use shows as lateness);
    /// after that it sleeps until the next parked pull's deadline, at most `IDLE_TICK_MAX_MS`,
    /// or until a request wakes it.
    pub async fn run_ticking(self: Rc<Self>) {
        let tick = Duration::from_millis(PULL_WHEEL_TICK_MS);
        let mut seen = self.load.requests.get();
        // Idle until the first request.
        let mut last_active = Instant::now()
            .checked_sub(Duration::from_millis(IDLE_AFTER_MS))
            .unwrap_or_else(Instant::now);
        loop {
            self.tick();
            let requests = self.load.requests.get();
            if requests != seen {
                (seen, last_active) = (requests, Instant::now());
            }
            if last_active.elapsed() < Duration::from_millis(IDLE_AFTER_MS) {
                shards::runtime::sleep(tick).await;
                continue;
            }
            let now = self.monotonic_ms();
            let sleep_ms = self
                .pull_waiters
                .next_due_ms()
                .map_or(IDLE_TICK_MAX_MS, |due| due.saturating_sub(now))
                .clamp(PULL_WHEEL_TICK_MS, IDLE_TICK_MAX_MS);
            self.load.idle.set(true);
            shards::runtime::timeout(Duration::from_millis(sleep_ms), self.load.wake.wait()).await;
            self.load.idle.set(false);
            // Waking from idleness is not lateness.
            self.load.last_tick_at.set(Some(Instant::now()));
        }
    }

    /// SYSTEM_BUSY when this shard is overloaded (see the module docs); called before a send
    /// touches the store.
    /// `now`: when the send was taken up (the clock read that times its answer).
    pub(crate) fn refuse_send_if_overloaded(&self, now: Instant) -> Result<(), RequestError> {
        let lateness = self.load.lateness(now);
        if lateness > Duration::from_millis(SEND_QUEUE_WAIT_MAX_MS) {
            return Err(self.refuse(format!(
                "[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in \
                 queue: {}ms, size of queue: 0",
                lateness.as_millis()
            )));
        }
        let flushing = self.store.flush_running_for(now);
        if flushing > Duration::from_millis(STORE_FLUSH_BUSY_MS) {
            return Err(self.refuse(format!(
                "[PC_SYNCHRONIZED]broker busy, start flow control for a while: the disk has \
                 been flushing for {}ms",
                flushing.as_millis()
            )));
        }
        Ok(())
    }

    pub(crate) fn refuse(&self, remark: String) -> RequestError {
        self.load
            .refused_sends
            .set(self.load.refused_sends.get() + 1);
        RequestError::SystemBusy(remark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_the_overdue_tick_or_a_recent_late_one() {
        let load = ShardLoad::default();
        let start = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(
            load.lateness(start + ms(9_000)),
            Duration::ZERO,
            "not ticking yet"
        );
        load.on_tick(start);
        let tick = ms(PULL_WHEEL_TICK_MS);
        assert_eq!(load.lateness(start + tick), Duration::ZERO);
        // Stalled: no tick for 300 ms.
        let stalled = start + ms(300);
        assert_eq!(load.lateness(stalled), ms(300) - tick);
        // The late tick runs: its lateness holds for LATENESS_HOLD_MS, across on-time ticks.
        load.on_tick(stalled);
        assert_eq!(load.lateness(stalled), ms(300) - tick);
        load.on_tick(stalled + tick);
        assert_eq!(load.lateness(stalled + tick), ms(300) - tick);
        let after_hold = stalled + ms(LATENESS_HOLD_MS);
        load.on_tick(after_hold);
        assert!(load.lateness(after_hold + ms(1)) < ms(LATENESS_HOLD_MS));
    }
}
