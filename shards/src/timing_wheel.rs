//! A hashed timing wheel for one shard's timers (delayed deliveries): `slots` buckets of
//! `tick_ms` each; an item lands in the bucket of the tick its deadline falls in, and one
//! turn of the wheel later it is looked at again if its deadline is further away. Insert is
//! O(1); `advance` touches only the buckets of the ticks that passed (at most one turn).
//! Pure and clock-free: the caller passes the time, so tests drive it with a simulated clock.

/// Items with deadlines, handed back once their deadline has passed.
pub struct TimerWheel<T> {
    tick_ms: u64,
    buckets: Vec<Vec<(u64, T)>>,
    /// The tick of the last `advance` (its bucket is looked at again by the next one, since
    /// it may hold items due later within that tick).
    current_tick: u64,
    len: usize,
}

impl<T> TimerWheel<T> {
    /// A wheel of `slots` buckets of `tick_ms`, starting at time `now_ms`.
    pub fn new(tick_ms: u64, slots: usize, now_ms: u64) -> TimerWheel<T> {
        assert!(tick_ms > 0 && slots > 0, "a wheel needs a tick and a slot");
        TimerWheel {
            tick_ms,
            buckets: (0..slots).map(|_| Vec::new()).collect(),
            current_tick: now_ms / tick_ms,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `item`, due at `deadline_ms`; a deadline already passed is due at the next
    /// `advance`.
    pub fn insert(&mut self, deadline_ms: u64, item: T) {
        let tick = (deadline_ms / self.tick_ms).max(self.current_tick);
        let slot = (tick % self.buckets.len() as u64) as usize;
        self.buckets[slot].push((deadline_ms, item));
        self.len += 1;
    }

    /// Moves the wheel to `now_ms`; returns every item whose deadline is at or before it,
    /// in deadline order.
    pub fn advance(&mut self, now_ms: u64) -> Vec<T> {
        let now_tick = now_ms / self.tick_ms;
        if now_tick < self.current_tick {
            return Vec::new();
        }
        let slots = self.buckets.len() as u64;
        let ticks = (now_tick - self.current_tick + 1).min(slots);
        let mut due: Vec<(u64, T)> = Vec::new();
        for tick in self.current_tick..self.current_tick + ticks {
            let bucket = &mut self.buckets[(tick % slots) as usize];
            let mut index = 0;
            while index < bucket.len() {
                if bucket[index].0 <= now_ms {
                    due.push(bucket.swap_remove(index));
                } else {
                    index += 1;
                }
            }
        }
        self.current_tick = now_tick;
        self.len -= due.len();
        due.sort_by_key(|(deadline, _)| *deadline);
        due.into_iter().map(|(_, item)| item).collect()
    }

    /// A time at or before the earliest deadline held (the start of the first non-empty
    /// bucket's next tick); None when empty. Waking then and calling `advance` never misses
    /// an item.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let slots = self.buckets.len() as u64;
        let tick = (self.current_tick..self.current_tick + slots)
            .find(|tick| !self.buckets[(tick % slots) as usize].is_empty())?;
        // Items of later buckets are due at their tick or later; the current bucket may also
        // hold items whose deadline had already passed when they were inserted.
        let bucket = &self.buckets[(tick % slots) as usize];
        let passed = bucket.iter().map(|(deadline, _)| *deadline).min();
        Some(passed.map_or(tick * self.tick_ms, |d| d.min(tick * self.tick_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn items_come_out_when_due_and_not_before() {
        let mut wheel = TimerWheel::new(100, 8, 1_000);
        wheel.insert(1_250, "a");
        wheel.insert(1_050, "b");
        wheel.insert(5_000, "far"); // several turns away
        assert_eq!(wheel.advance(1_100), vec!["b"]);
        assert_eq!(wheel.advance(1_249), Vec::<&str>::new());
        assert_eq!(wheel.advance(1_250), vec!["a"]);
        assert_eq!(wheel.len(), 1);
        assert!(wheel.next_deadline().unwrap() <= 5_000);
        assert_eq!(wheel.advance(4_999), Vec::<&str>::new());
        assert_eq!(wheel.advance(5_000), vec!["far"]);
        assert!(wheel.is_empty());
        assert_eq!(wheel.next_deadline(), None);
        wheel.insert(10, "late"); // already passed
        assert_eq!(wheel.advance(5_001), vec!["late"]);
    }

    proptest! {
        /// Against a model: after any sequence of inserts and advances (a simulated clock
        /// that only moves forward), exactly the items due have come out, each once, and
        /// none early.
        #[test]
        fn matches_a_sorted_model(
            tick in 1u64..50,
            slots in 1usize..16,
            steps in proptest::collection::vec((0u64..2_000, 0u64..300, any::<bool>()), 1..200),
        ) {
            let mut now = 10_000u64;
            let mut wheel = TimerWheel::new(tick, slots, now);
            let mut model: Vec<(u64, usize)> = Vec::new();
            let mut out: Vec<usize> = Vec::new();
            for (id, (delay, step, insert)) in steps.into_iter().enumerate() {
                if insert {
                    wheel.insert(now + delay, id);
                    model.push((now + delay, id));
                }
                now += step;
                if let Some(next) = wheel.next_deadline() {
                    let earliest = model.iter().map(|(d, _)| *d).min().unwrap();
                    prop_assert!(next <= earliest);
                }
                for item in wheel.advance(now) {
                    let position = model.iter().position(|(_, i)| *i == item).unwrap();
                    let (deadline, _) = model.remove(position);
                    prop_assert!(deadline <= now, "item {item} came out early");
                    out.push(item);
                }
                prop_assert!(model.iter().all(|(d, _)| *d > now), "a due item stayed in");
                prop_assert_eq!(wheel.len(), model.len());
            }
        }
    }
}
