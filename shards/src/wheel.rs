//! A hashed timer wheel: pure bookkeeping of deadlines, no clock and no runtime of its own.
//!
//! The owner (one shard) calls `advance(now_ms)` from its ticking task with the real clock;
//! tests call it with a simulated one. Time is cut into ticks of `tick_ms`; the wheel has
//! `slot_count` slots and an entry due at tick `t` lives in slot `t % slot_count`, so deadlines
//! further away than one turn of the wheel simply stay in their slot for more rounds (each
//! entry keeps its absolute deadline tick, and a slot scan takes only the entries that are due).
//!
//! Entries live in a slab of nodes chained into one doubly linked list per slot: `insert`
//! and `cancel` are O(1); `advance` costs one slot scan per elapsed tick (at most one scan of
//! every slot, however far the clock jumped).
//!
//! Contract (what the tests check against a plain ordered-map model):
//! - an entry inserted with deadline `d` while the wheel has processed tick `p` is due at
//!   tick `max(ceil(d / tick_ms), p + 1)`: never before its deadline, never in the tick it was
//!   inserted in;
//! - `advance(now_ms)` processes every tick up to `floor(now_ms / tick_ms)` and returns every
//!   entry due at or before it; time never goes backwards (an earlier `now_ms` does nothing);
//! - a cancelled or returned entry's `TimerId` is dead: `cancel`/`get_mut` on it return None
//!   (ids carry a generation, so a reused slab node is not mistaken for the old entry).

/// Where an entry lives in the wheel; stale once the entry has been cancelled or returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

/// End of a list, in `prev`/`next`/slot heads.
const NIL: u32 = u32::MAX;
pub use crate::limits::WHEEL_ENTRIES_MAX;

struct Node<T> {
    /// None while the node is on the free list.
    item: Option<T>,
    deadline_tick: u64,
    generation: u32,
    prev: u32,
    /// Next in the slot's list, or next free node.
    next: u32,
}

/// A hashed timer wheel of items `T` (see the module docs).
pub struct TimerWheel<T> {
    tick_ms: u64,
    slot_heads: Vec<u32>,
    nodes: Vec<Node<T>>,
    free_head: u32,
    /// The last tick processed: every entry due at or before it has been returned.
    processed_tick: u64,
    len: usize,
}

impl<T> TimerWheel<T> {
    /// A wheel of `slot_count` slots of `tick_ms` each, whose clock starts at `now_ms`.
    /// Panics if either is zero (a configuration bug).
    pub fn new(tick_ms: u64, slot_count: usize, now_ms: u64) -> TimerWheel<T> {
        assert!(
            tick_ms > 0 && slot_count > 0,
            "tick and slots must be positive"
        );
        TimerWheel {
            tick_ms,
            slot_heads: vec![NIL; slot_count],
            nodes: Vec::new(),
            free_head: NIL,
            processed_tick: now_ms / tick_ms,
            len: 0,
        }
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }

    /// The earliest time (ms) at which an entry inserted now with `deadline_ms` can be
    /// returned: its deadline rounded up to the tick, and after the current tick.
    pub fn due_ms(&self, deadline_ms: u64) -> u64 {
        self.due_tick(deadline_ms) * self.tick_ms
    }

    fn due_tick(&self, deadline_ms: u64) -> u64 {
        deadline_ms
            .div_ceil(self.tick_ms)
            .max(self.processed_tick + 1)
    }

    /// Adds `item`, due at `deadline_ms` (see the contract in the module docs).
    pub fn insert(&mut self, deadline_ms: u64, item: T) -> TimerId {
        assert!(self.len < WHEEL_ENTRIES_MAX, "timer wheel full");
        let deadline_tick = self.due_tick(deadline_ms);
        let index = match self.free_head {
            NIL => {
                self.nodes.push(Node {
                    item: None,
                    deadline_tick: 0,
                    generation: 0,
                    prev: NIL,
                    next: NIL,
                });
                (self.nodes.len() - 1) as u32
            }
            free => {
                self.free_head = self.nodes[free as usize].next;
                free
            }
        };
        let slot = self.slot_of(deadline_tick);
        let head = self.slot_heads[slot];
        let node = &mut self.nodes[index as usize];
        debug_assert!(node.item.is_none(), "a free node holds no item");
        node.item = Some(item);
        node.deadline_tick = deadline_tick;
        node.prev = NIL;
        node.next = head;
        let generation = node.generation;
        if head != NIL {
            self.nodes[head as usize].prev = index;
        }
        self.slot_heads[slot] = index;
        self.len += 1;
        TimerId { index, generation }
    }

    /// A time at or before which nothing can come out of `advance`: the start of the first
    /// tick, after the processed one, whose slot holds an entry (None when empty). An owner
    /// that sleeps until then and advances misses nothing and idles otherwise.
    pub fn next_due_ms(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let slots = self.slot_heads.len() as u64;
        (1..=slots)
            .map(|step| self.processed_tick + step)
            .find(|tick| self.slot_heads[self.slot_of(*tick)] != NIL)
            .map(|tick| tick * self.tick_ms)
    }

    /// Removes a waiting entry and gives its item back; None if `id` is no longer waiting.
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        self.live(id)?;
        Some(self.unlink(id.index))
    }

    /// The item of a waiting entry.
    pub fn get_mut(&mut self, id: TimerId) -> Option<&mut T> {
        self.live(id)?;
        self.nodes[id.index as usize].item.as_mut()
    }

    /// Processes every tick up to `now_ms` and returns the entries now due, with their ids.
    pub fn advance(&mut self, now_ms: u64) -> Vec<(TimerId, T)> {
        let now_tick = now_ms / self.tick_ms;
        let mut due = Vec::new();
        if now_tick <= self.processed_tick {
            return due;
        }
        // Every entry due by now_tick is due after processed_tick, so it sits in one of the
        // slots of the ticks (processed_tick, now_tick]; past a whole turn that is every slot.
        let ticks = (now_tick - self.processed_tick).min(self.slot_heads.len() as u64);
        for step in 1..=ticks {
            let slot = self.slot_of(self.processed_tick + step);
            let mut cursor = self.slot_heads[slot];
            while cursor != NIL {
                let node = &self.nodes[cursor as usize];
                let next = node.next;
                if node.deadline_tick <= now_tick {
                    let generation = node.generation;
                    let item = self.unlink(cursor);
                    due.push((
                        TimerId {
                            index: cursor,
                            generation,
                        },
                        item,
                    ));
                }
                cursor = next;
            }
        }
        self.processed_tick = now_tick;
        due
    }

    fn slot_of(&self, tick: u64) -> usize {
        (tick % self.slot_heads.len() as u64) as usize
    }

    fn live(&self, id: TimerId) -> Option<()> {
        let node = self.nodes.get(id.index as usize)?;
        (node.generation == id.generation && node.item.is_some()).then_some(())
    }

    /// Takes node `index` out of its slot list and puts it on the free list.
    fn unlink(&mut self, index: u32) -> T {
        let (prev, next, deadline_tick) = {
            let node = &self.nodes[index as usize];
            (node.prev, node.next, node.deadline_tick)
        };
        if prev == NIL {
            let slot = self.slot_of(deadline_tick);
            debug_assert_eq!(self.slot_heads[slot], index, "a list head has no prev");
            self.slot_heads[slot] = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        let free_head = self.free_head;
        let node = &mut self.nodes[index as usize];
        let item = node.item.take().expect("a linked node holds an item");
        node.generation = node.generation.wrapping_add(1);
        node.prev = NIL;
        node.next = free_head;
        self.free_head = index;
        self.len -= 1;
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn entries_fire_at_their_tick_not_before() {
        let mut wheel = TimerWheel::new(10, 8, 1_000);
        let a = wheel.insert(1_025, "a");
        let b = wheel.insert(1_030, "b");
        assert_eq!(wheel.due_ms(1_025), 1_030);
        assert!(wheel.advance(1_029).is_empty());
        let due = wheel.advance(1_030);
        let mut ids: Vec<_> = due.iter().map(|(id, item)| (*id, *item)).collect();
        ids.sort();
        assert_eq!(ids, vec![(a, "a"), (b, "b")]);
        assert!(wheel.is_empty());
        assert_eq!(wheel.cancel(a), None, "a returned entry's id is dead");
    }

    #[test]
    fn deadlines_past_one_turn_wait_their_rounds() {
        let mut wheel = TimerWheel::new(5, 4, 0);
        wheel.insert(100, 1u32); // tick 20: five turns of a 4-slot wheel
        for now in (0..100).step_by(5) {
            assert!(wheel.advance(now).is_empty(), "fired early at {now}");
        }
        assert_eq!(wheel.advance(100).len(), 1);
    }

    #[test]
    fn a_past_deadline_fires_on_the_next_tick_and_a_jump_returns_everything() {
        let mut wheel = TimerWheel::new(10, 16, 500);
        wheel.insert(0, 'p');
        assert!(
            wheel.advance(505).is_empty(),
            "not in the tick it was inserted in"
        );
        assert_eq!(wheel.advance(510).len(), 1);
        for i in 0..100u64 {
            wheel.insert(600 + i * 37, 'x');
        }
        assert_eq!(wheel.advance(1_000_000).len(), 100);
        assert!(wheel.advance(10).is_empty(), "time never goes backwards");
    }

    #[test]
    fn cancel_frees_the_node_for_reuse_and_old_ids_stay_dead() {
        let mut wheel = TimerWheel::new(1, 4, 0);
        let first = wheel.insert(3, 1);
        assert_eq!(wheel.cancel(first), Some(1));
        let second = wheel.insert(3, 2);
        assert_ne!(first, second, "same node, new generation");
        assert_eq!(wheel.get_mut(first), None);
        *wheel.get_mut(second).unwrap() += 40;
        assert_eq!(wheel.advance(3), vec![(second, 42)]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert { delay_ms: u64 },
        Cancel { pick: usize },
        Advance { by_ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..400).prop_map(|delay_ms| Op::Insert { delay_ms }),
            2 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
            3 => prop_oneof![0u64..20, 0u64..500].prop_map(|by_ms| Op::Advance { by_ms }),
        ]
    }

    proptest! {
        /// The wheel against an ordered map of due ticks: same entries due at the same
        /// advance, same cancellations, same lengths, whatever the interleaving.
        #[test]
        fn wheel_matches_an_ordered_map_model(
            tick_ms in 1u64..20,
            slot_count in 1usize..40,
            start_ms in 0u64..10_000,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut wheel = TimerWheel::new(tick_ms, slot_count, start_ms);
            // id -> (due tick, value)
            let mut model: BTreeMap<TimerId, (u64, u32)> = BTreeMap::new();
            let mut processed_tick = start_ms / tick_ms;
            let mut now_ms = start_ms;
            let mut issued: Vec<TimerId> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert { delay_ms } => {
                        // Deadlines may lie in the past, up to 50 ms back.
                        let deadline = (now_ms + delay_ms).saturating_sub(50);
                        let id = wheel.insert(deadline, step as u32);
                        let due = deadline.div_ceil(tick_ms).max(processed_tick + 1);
                        prop_assert!(model.insert(id, (due, step as u32)).is_none());
                        issued.push(id);
                    }
                    Op::Cancel { pick } if !issued.is_empty() => {
                        let id = issued[pick % issued.len()];
                        let expected = model.remove(&id).map(|(_, value)| value);
                        prop_assert_eq!(wheel.cancel(id), expected);
                    }
                    Op::Cancel { .. } => {}
                    Op::Advance { by_ms } => {
                        now_ms += by_ms;
                        let now_tick = now_ms / tick_ms;
                        let mut got = wheel.advance(now_ms);
                        got.sort();
                        let expected: Vec<(TimerId, u32)> = model
                            .iter()
                            .filter(|(_, (due, _))| *due <= now_tick)
                            .map(|(id, (_, value))| (*id, *value))
                            .collect();
                        for (id, _) in &expected {
                            model.remove(id);
                        }
                        processed_tick = processed_tick.max(now_tick);
                        prop_assert_eq!(got, expected);
                    }
                }
                prop_assert_eq!(wheel.len(), model.len());
                // next_due_ms is a lower bound of every waiting entry's due time.
                let earliest = model.values().map(|(due, _)| due * tick_ms).min();
                match (wheel.next_due_ms(), earliest) {
                    (None, None) => {}
                    (Some(next), Some(earliest)) => prop_assert!(next <= earliest),
                    (next, earliest) => prop_assert!(false, "{:?} vs {:?}", next, earliest),
                }
            }
        }
    }
}
