//! Parked long-polling pulls of one shard, on top of the timer wheel: pure bookkeeping, no
//! clock and no runtime (the shard's ticking task calls `advance` with the real clock; tests
//! with a simulated one).
//!
//! A pull that found nothing is parked under its (topic, queue id) and its connection with a
//! deadline. Exactly one of three things then finishes it, and frees its place at once:
//! - a message reaches its queue (`wake_queue`) → `ParkOutcome::Arrived`;
//! - its deadline passes (`advance`) → `ParkOutcome::Expired`;
//! - its connection closes (`connection_closed`) → `ParkOutcome::ConnectionClosed`.
//!
//! The outcome waits in a small "finished" table until the pull's task takes it
//! (`take_outcome`, or the `ParkedPulls::wait` future); a task that gives up calls `forget`
//! (the future does so when dropped), so nothing stays behind. At most `capacity` pulls are
//! parked at once: `park` beyond it is refused (the broker answers SYSTEM_BUSY).
//!
//! Invariants (checked by the tests against a model): every parked id is in the wheel, in
//! exactly one queue set and in exactly one connection set; a finished id is in none of them.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use crate::wheel::{TimerId, TimerWheel};

/// Identifies the connection a pull came on (the server's connection id).
pub type ConnectionId = u64;

/// How a parked pull ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkOutcome {
    /// A message reached its queue: read again and answer.
    Arrived,
    /// Its suspend timeout ran out: read again and answer (PULL_NOT_FOUND if still empty).
    Expired,
    /// Its connection closed: nobody to answer.
    ConnectionClosed,
}

/// Why a pull could not be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    #[error("{parked} pulls are parked on this shard already (limit {limit})")]
    Full { parked: usize, limit: usize },
}

struct Parked {
    topic: String,
    queue_id: u32,
    connection: ConnectionId,
    waker: Option<Waker>,
}

/// The parked pulls of one shard (see the module docs).
pub struct LongPoll {
    wheel: TimerWheel<Parked>,
    by_queue: HashMap<String, HashMap<u32, BTreeSet<TimerId>>>,
    by_connection: HashMap<ConnectionId, BTreeSet<TimerId>>,
    finished: HashMap<TimerId, ParkOutcome>,
    capacity: usize,
}

impl LongPoll {
    /// Room for `capacity` parked pulls, on a wheel of `slot_count` slots of `tick_ms`,
    /// whose clock starts at `now_ms`.
    pub fn new(tick_ms: u64, slot_count: usize, capacity: usize, now_ms: u64) -> LongPoll {
        LongPoll {
            wheel: TimerWheel::new(tick_ms, slot_count, now_ms),
            by_queue: HashMap::new(),
            by_connection: HashMap::new(),
            finished: HashMap::new(),
            capacity,
        }
    }

    /// Pulls parked now.
    pub fn len(&self) -> usize {
        self.wheel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.wheel.is_empty()
    }

    /// Pulls finished whose task has not taken the outcome yet.
    pub fn finished_len(&self) -> usize {
        self.finished.len()
    }

    /// Parks a pull of (topic, queue_id) from `connection` until `deadline_ms`.
    pub fn park(
        &mut self,
        topic: &str,
        queue_id: u32,
        connection: ConnectionId,
        deadline_ms: u64,
    ) -> Result<TimerId, ParkError> {
        if self.wheel.len() >= self.capacity {
            return Err(ParkError::Full {
                parked: self.wheel.len(),
                limit: self.capacity,
            });
        }
        let parked = Parked {
            topic: topic.to_string(),
            queue_id,
            connection,
            waker: None,
        };
        let id = self.wheel.insert(deadline_ms, parked);
        let queues = match self.by_queue.get_mut(topic) {
            Some(queues) => queues,
            None => self.by_queue.entry(topic.to_string()).or_default(),
        };
        queues.entry(queue_id).or_default().insert(id);
        self.by_connection.entry(connection).or_default().insert(id);
        Ok(id)
    }

    /// A message reached (topic, queue_id): finishes its parked pulls as `Arrived`.
    /// Returns how many. Cheap when nothing waits there (no allocation).
    pub fn wake_queue(&mut self, topic: &str, queue_id: u32) -> usize {
        let Some(queues) = self.by_queue.get_mut(topic) else {
            return 0;
        };
        let Some(ids) = queues.remove(&queue_id) else {
            return 0;
        };
        if queues.is_empty() {
            self.by_queue.remove(topic);
        }
        for id in &ids {
            let parked = self
                .wheel
                .cancel(*id)
                .expect("a queue's parked id is in the wheel");
            remove_from(&mut self.by_connection, &parked.connection, id);
            self.finish(*id, parked, ParkOutcome::Arrived);
        }
        ids.len()
    }

    /// A connection closed: finishes its parked pulls as `ConnectionClosed` and frees their
    /// places at once. Returns how many.
    pub fn connection_closed(&mut self, connection: ConnectionId) -> usize {
        let Some(ids) = self.by_connection.remove(&connection) else {
            return 0;
        };
        for id in &ids {
            let parked = self
                .wheel
                .cancel(*id)
                .expect("a connection's parked id is in the wheel");
            self.unindex_queue(&parked, id);
            self.finish(*id, parked, ParkOutcome::ConnectionClosed);
        }
        ids.len()
    }

    /// When the next parked pull's deadline comes (None: nothing parked).
    pub fn next_due_ms(&self) -> Option<u64> {
        self.wheel.next_due_ms()
    }

    /// Moves the clock to `now_ms`: finishes the pulls whose deadline passed as `Expired`.
    /// Returns how many.
    pub fn advance(&mut self, now_ms: u64) -> usize {
        let expired = self.wheel.advance(now_ms);
        let count = expired.len();
        for (id, parked) in expired {
            self.unindex_queue(&parked, &id);
            remove_from(&mut self.by_connection, &parked.connection, &id);
            self.finish(id, parked, ParkOutcome::Expired);
        }
        count
    }

    /// The outcome of a finished pull (taken once), or None while it is parked, in which
    /// case `waker` is woken when it finishes. An id that is neither (already taken or
    /// forgotten) reads as `Expired`, so that a confused caller answers rather than hangs.
    pub fn take_outcome(&mut self, id: TimerId, waker: &Waker) -> Option<ParkOutcome> {
        if let Some(outcome) = self.finished.remove(&id) {
            return Some(outcome);
        }
        match self.wheel.get_mut(id) {
            Some(parked) => {
                match &mut parked.waker {
                    Some(known) if known.will_wake(waker) => {}
                    slot => *slot = Some(waker.clone()),
                }
                None
            }
            None => Some(ParkOutcome::Expired),
        }
    }

    /// Drops a pull whatever its state (its task gave up): frees its place.
    pub fn forget(&mut self, id: TimerId) {
        if self.finished.remove(&id).is_some() {
            return;
        }
        if let Some(parked) = self.wheel.cancel(id) {
            self.unindex_queue(&parked, &id);
            remove_from(&mut self.by_connection, &parked.connection, &id);
        }
    }

    fn finish(&mut self, id: TimerId, parked: Parked, outcome: ParkOutcome) {
        self.finished.insert(id, outcome);
        if let Some(waker) = parked.waker {
            waker.wake();
        }
    }

    fn unindex_queue(&mut self, parked: &Parked, id: &TimerId) {
        if let Some(queues) = self.by_queue.get_mut(parked.topic.as_str()) {
            remove_from(queues, &parked.queue_id, id);
            if queues.is_empty() {
                self.by_queue.remove(parked.topic.as_str());
            }
        }
    }
}

fn remove_from<K: std::hash::Hash + Eq>(
    sets: &mut HashMap<K, BTreeSet<TimerId>>,
    key: &K,
    id: &TimerId,
) {
    if let Some(set) = sets.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            sets.remove(key);
        }
    }
}

/// `LongPoll` shared by the tasks of one shard, with a future per parked pull.
pub struct ParkedPulls {
    inner: RefCell<LongPoll>,
}

impl ParkedPulls {
    pub fn new(long_poll: LongPoll) -> ParkedPulls {
        ParkedPulls {
            inner: RefCell::new(long_poll),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.borrow().is_empty()
    }

    /// See `LongPoll::park`.
    pub fn park(
        &self,
        topic: &str,
        queue_id: u32,
        connection: ConnectionId,
        deadline_ms: u64,
    ) -> Result<TimerId, ParkError> {
        self.inner
            .borrow_mut()
            .park(topic, queue_id, connection, deadline_ms)
    }

    /// See `LongPoll::wake_queue`.
    pub fn wake_queue(&self, topic: &str, queue_id: u32) -> usize {
        self.inner.borrow_mut().wake_queue(topic, queue_id)
    }

    /// See `LongPoll::connection_closed`.
    pub fn connection_closed(&self, connection: ConnectionId) -> usize {
        self.inner.borrow_mut().connection_closed(connection)
    }

    /// See `LongPoll::next_due_ms`.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.inner.borrow().next_due_ms()
    }

    /// See `LongPoll::advance`.
    pub fn advance(&self, now_ms: u64) -> usize {
        self.inner.borrow_mut().advance(now_ms)
    }

    /// Resolves with the outcome of parked pull `id`; dropping it early forgets the pull.
    pub fn wait(self: &Rc<Self>, id: TimerId) -> ParkedWait {
        ParkedWait {
            pulls: self.clone(),
            id,
            done: false,
        }
    }
}

/// The future of one parked pull (see `ParkedPulls::wait`).
pub struct ParkedWait {
    pulls: Rc<ParkedPulls>,
    id: TimerId,
    done: bool,
}

impl Future for ParkedWait {
    type Output = ParkOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ParkOutcome> {
        let outcome = self
            .pulls
            .inner
            .borrow_mut()
            .take_outcome(self.id, cx.waker());
        match outcome {
            Some(outcome) => {
                self.done = true;
                Poll::Ready(outcome)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for ParkedWait {
    fn drop(&mut self) {
        if !self.done {
            self.pulls.inner.borrow_mut().forget(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    #[test]
    fn a_message_wakes_only_its_queue_at_once() {
        let mut polls = LongPoll::new(10, 64, 100, 0);
        let (count, waker) = counting_waker();
        let a = polls.park("T", 0, 1, 15_000).unwrap();
        let b = polls.park("T", 1, 1, 15_000).unwrap();
        assert_eq!(polls.take_outcome(a, &waker), None);
        assert_eq!(polls.wake_queue("T", 0), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(polls.take_outcome(a, &waker), Some(ParkOutcome::Arrived));
        assert_eq!(polls.take_outcome(b, &waker), None);
        assert_eq!(polls.wake_queue("Other", 0), 0);
        assert_eq!(polls.len(), 1);
    }

    #[test]
    fn expiry_answers_at_the_suspend_timeout() {
        let mut polls = LongPoll::new(5, 16, 100, 1_000);
        let (_, waker) = counting_waker();
        let id = polls.park("T", 0, 7, 1_000 + 400).unwrap();
        assert_eq!(polls.advance(1_399), 0);
        assert_eq!(polls.take_outcome(id, &waker), None);
        assert_eq!(polls.advance(1_400), 1);
        assert_eq!(polls.take_outcome(id, &waker), Some(ParkOutcome::Expired));
        assert!(polls.is_empty());
        assert_eq!(polls.finished_len(), 0);
    }

    #[test]
    fn a_closed_connection_frees_its_places_at_once() {
        let mut polls = LongPoll::new(10, 64, 3, 0);
        let ids: Vec<_> = (0..3)
            .map(|q| polls.park("T", q, 9, 20_000).unwrap())
            .collect();
        assert!(matches!(
            polls.park("T", 0, 10, 20_000),
            Err(ParkError::Full {
                parked: 3,
                limit: 3
            })
        ));
        assert_eq!(polls.connection_closed(9), 3);
        assert_eq!(polls.len(), 0);
        assert!(polls.park("T", 0, 10, 20_000).is_ok(), "room again");
        let (_, waker) = counting_waker();
        for id in ids {
            assert_eq!(
                polls.take_outcome(id, &waker),
                Some(ParkOutcome::ConnectionClosed)
            );
        }
        assert_eq!(polls.wake_queue("T", 1), 0, "closed pulls left their queue");
    }

    #[test]
    fn the_future_resolves_and_a_dropped_one_leaves_nothing() {
        let pulls = Rc::new(ParkedPulls::new(LongPoll::new(10, 8, 10, 0)));
        let id = pulls.park("T", 0, 1, 50).unwrap();
        let mut wait = Box::pin(pulls.wait(id));
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(wait.as_mut().poll(&mut cx), Poll::Pending);
        pulls.advance(50);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken by expiry");
        assert_eq!(
            wait.as_mut().poll(&mut cx),
            Poll::Ready(ParkOutcome::Expired)
        );
        let id = pulls.park("T", 0, 1, 50).unwrap();
        drop(pulls.wait(id));
        assert!(pulls.is_empty());
        let id = pulls.park("T", 0, 1, 50).unwrap();
        let waiting = pulls.wait(id);
        pulls.wake_queue("T", 0);
        drop(waiting);
        assert_eq!(
            pulls.inner.borrow().finished_len(),
            0,
            "finished but never taken"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Park {
            queue: u32,
            connection: u64,
            timeout_ms: u64,
        },
        Message {
            queue: u32,
        },
        Close {
            connection: u64,
        },
        Advance {
            by_ms: u64,
        },
        Take {
            pick: usize,
        },
        Forget {
            pick: usize,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..4, 0u64..4, 0u64..300)
                .prop_map(|(queue, connection, timeout_ms)| Op::Park { queue, connection, timeout_ms }),
            2 => (0u32..4).prop_map(|queue| Op::Message { queue }),
            1 => (0u64..4).prop_map(|connection| Op::Close { connection }),
            3 => (0u64..60).prop_map(|by_ms| Op::Advance { by_ms }),
            2 => any::<usize>().prop_map(|pick| Op::Take { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Forget { pick }),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum ModelState {
        Parked {
            queue: u32,
            connection: u64,
            due_ms: u64,
        },
        Finished(ParkOutcome),
    }

    proptest! {
        /// The bookkeeping against a plain model: which pulls are parked, and how each
        /// finished, under any interleaving of parks, messages, closes, clock moves, takes
        /// and forgets, with a small capacity so that refusals happen too.
        #[test]
        fn long_poll_matches_a_model(ops in proptest::collection::vec(op(), 1..300)) {
            const TICK_MS: u64 = 5;
            const CAPACITY: usize = 6;
            let mut polls = LongPoll::new(TICK_MS, 8, CAPACITY, 0);
            let mut model: BTreeMap<TimerId, ModelState> = BTreeMap::new();
            let mut now_ms = 0u64;
            let mut issued: Vec<TimerId> = Vec::new();
            let (_, waker) = counting_waker();
            for op in ops {
                match op {
                    Op::Park { queue, connection, timeout_ms } => {
                        let parked = model.values().filter(|s| matches!(s, ModelState::Parked { .. })).count();
                        let result = polls.park("T", queue, connection, now_ms + timeout_ms);
                        if parked >= CAPACITY {
                            prop_assert!(result.is_err());
                        } else {
                            let id = result.unwrap();
                            let due_ms = (now_ms + timeout_ms).div_ceil(TICK_MS).max(now_ms / TICK_MS + 1) * TICK_MS;
                            model.insert(id, ModelState::Parked { queue, connection, due_ms });
                            issued.push(id);
                        }
                    }
                    Op::Message { queue: woken } => {
                        let mut expected = 0;
                        for state in model.values_mut() {
                            if matches!(state, ModelState::Parked { queue, .. } if *queue == woken) {
                                *state = ModelState::Finished(ParkOutcome::Arrived);
                                expected += 1;
                            }
                        }
                        prop_assert_eq!(polls.wake_queue("T", woken), expected);
                    }
                    Op::Close { connection: closed } => {
                        let mut expected = 0;
                        for state in model.values_mut() {
                            if matches!(state, ModelState::Parked { connection, .. } if *connection == closed) {
                                *state = ModelState::Finished(ParkOutcome::ConnectionClosed);
                                expected += 1;
                            }
                        }
                        prop_assert_eq!(polls.connection_closed(closed), expected);
                    }
                    Op::Advance { by_ms } => {
                        now_ms += by_ms;
                        let mut expected = 0;
                        for state in model.values_mut() {
                            if matches!(state, ModelState::Parked { due_ms, .. } if *due_ms <= now_ms) {
                                *state = ModelState::Finished(ParkOutcome::Expired);
                                expected += 1;
                            }
                        }
                        prop_assert_eq!(polls.advance(now_ms), expected);
                    }
                    Op::Take { pick } if !issued.is_empty() => {
                        let id = issued[pick % issued.len()];
                        let got = polls.take_outcome(id, &waker);
                        match model.get(&id).copied() {
                            Some(ModelState::Parked { .. }) => prop_assert_eq!(got, None),
                            Some(ModelState::Finished(outcome)) => {
                                prop_assert_eq!(got, Some(outcome));
                                model.remove(&id);
                            }
                            None => prop_assert_eq!(got, Some(ParkOutcome::Expired)),
                        }
                    }
                    Op::Forget { pick } if !issued.is_empty() => {
                        let id = issued[pick % issued.len()];
                        polls.forget(id);
                        model.remove(&id);
                    }
                    Op::Take { .. } | Op::Forget { .. } => {}
                }
                let parked = model.values().filter(|s| matches!(s, ModelState::Parked { .. })).count();
                prop_assert_eq!(polls.len(), parked);
                prop_assert_eq!(polls.finished_len(), model.len() - parked);
                let indexed_by_queue: usize = polls.by_queue.values().flat_map(|q| q.values()).map(|s| s.len()).sum();
                let indexed_by_connection: usize = polls.by_connection.values().map(|s| s.len()).sum();
                prop_assert_eq!(indexed_by_queue, parked);
                prop_assert_eq!(indexed_by_connection, parked);
            }
        }
    }
}
