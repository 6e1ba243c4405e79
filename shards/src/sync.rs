//! Single-shard wake-up primitives (no atomics: everything here lives on one executor).
//!
//! `Signal` wakes one waiting task (a connection's writer); `Event` wakes every waiting task
//! (the mesh's progress, which several waits watch); `WaiterSet` holds many parked
//! tasks keyed by id so that a parked task that gives up removes itself (no growth from
//! timed-out waiters): a connection's answers waiting for output room. Long-polling pulls
//! have their own structure with deadlines and per-connection bookkeeping (`long_poll`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Wakes one task waiting for "something changed"; a notify before the wait is not lost.
#[derive(Default)]
pub struct Signal {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    pub fn notify(&self) {
        self.notified.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Resolves once `notify` was called since the last wait returned.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.notified.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

/// Wakes every task waiting for "something changed" (any number of them); a waiter that
/// started waiting before a notify is never missed, one that starts after waits for the next.
#[derive(Default)]
pub struct Event {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Event {
    pub fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Resolves at the next `notify` after this call.
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        let started = self.generation.get();
        std::future::poll_fn(move |cx| {
            if self.generation.get() != started {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

/// Parked tasks grouped by key; `wake_key` wakes every task parked under one key.
pub struct WaiterSet<K: Ord + Clone> {
    next_id: Cell<u64>,
    by_key: RefCell<BTreeMap<K, BTreeMap<u64, Waker>>>,
    count: Cell<usize>,
}

impl<K: Ord + Clone> Default for WaiterSet<K> {
    fn default() -> Self {
        WaiterSet {
            next_id: Cell::new(0),
            by_key: RefCell::new(BTreeMap::new()),
            count: Cell::new(0),
        }
    }
}

impl<K: Ord + Clone> WaiterSet<K> {
    /// Number of parked tasks.
    pub fn len(&self) -> usize {
        self.count.get()
    }

    pub fn is_empty(&self) -> bool {
        self.count.get() == 0
    }

    /// Wakes every task parked under `key`.
    pub fn wake_key(&self, key: &K) {
        let wakers = self.by_key.borrow_mut().remove(key);
        if let Some(wakers) = wakers {
            self.count.set(self.count.get() - wakers.len());
            for (_, waker) in wakers {
                waker.wake();
            }
        }
    }

    /// Wakes every parked task (used when a connection closes; each re-checks its condition).
    pub fn wake_all(&self) {
        let all = std::mem::take(&mut *self.by_key.borrow_mut());
        self.count.set(0);
        for (_, wakers) in all {
            for (_, waker) in wakers {
                waker.wake();
            }
        }
    }

    /// Waits under `key` until `ready()` holds (checked on every wake-up).
    pub fn wait_until<'a>(
        self: &'a Rc<Self>,
        key: K,
        ready: impl Fn() -> bool + 'a,
    ) -> impl Future<Output = ()> + 'a {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        ParkedWait {
            set: self,
            key,
            id,
            ready,
        }
    }

    fn park(&self, key: &K, id: u64, waker: &Waker) {
        let mut by_key = self.by_key.borrow_mut();
        let slot = by_key.entry(key.clone()).or_default();
        if slot.insert(id, waker.clone()).is_none() {
            self.count.set(self.count.get() + 1);
        }
    }

    fn unpark(&self, key: &K, id: u64) {
        let mut by_key = self.by_key.borrow_mut();
        if let Some(slot) = by_key.get_mut(key) {
            if slot.remove(&id).is_some() {
                self.count.set(self.count.get() - 1);
            }
            if slot.is_empty() {
                by_key.remove(key);
            }
        }
    }
}

struct ParkedWait<'a, K: Ord + Clone, F: Fn() -> bool> {
    set: &'a Rc<WaiterSet<K>>,
    key: K,
    id: u64,
    ready: F,
}

impl<K: Ord + Clone, F: Fn() -> bool> Future for ParkedWait<'_, K, F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if (self.ready)() {
            self.set.unpark(&self.key, self.id);
            return Poll::Ready(());
        }
        self.set.park(&self.key, self.id, cx.waker());
        Poll::Pending
    }
}

impl<K: Ord + Clone, F: Fn() -> bool> Drop for ParkedWait<'_, K, F> {
    fn drop(&mut self) {
        self.set.unpark(&self.key, self.id);
    }
}
