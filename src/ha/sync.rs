//! SYNC_MASTER answers waiting for the slave (RocketMQ's GroupTransferService).
//!
//! A SYNC_MASTER send is answered once a slave has reported an offset at or past the end of
//! its record (and, with SYNC_FLUSH too, once the record is durable here). Answers are encoded
//! when the send is handled and queued in commitlog order; one task per shard waits for the
//! oldest, and every report of the slave answers, in one pass, every send it covers: one
//! wake-up per report, not one per send, as group commit does for the disk. A send still
//! waiting after slaveTimeout is answered FLUSH_SLAVE_TIMEOUT (12) with its send result (the
//! message is stored; RocketMQ's client reports SendStatus.FLUSH_SLAVE_TIMEOUT).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use shards::store::FlushMode;

use crate::broker::Broker;
use crate::error::store_error;
use crate::server::{Connection, InFlight};

#[derive(Default)]
pub struct SlaveReplies {
    queue: RefCell<VecDeque<Waiting>>,
    queued: shards::sync::Signal,
    running: Cell<bool>,
    /// Sends answered FLUSH_SLAVE_TIMEOUT since start.
    pub timeouts: Cell<u64>,
}

struct Waiting {
    end_offset: u64,
    deadline: Instant,
    connection: Rc<Connection>,
    opaque: i32,
    /// The answer once the slave has the record, and the one after slaveTimeout.
    success: Vec<u8>,
    timed_out: Vec<u8>,
    _in_flight: InFlight,
}

impl SlaveReplies {
    /// Queues the answer of a send whose last record ends at `end_offset`; `encode` writes
    /// the answer with the code it is given.
    pub fn push(
        self: &Rc<Self>,
        broker: &Rc<Broker>,
        end_offset: u64,
        connection: &Rc<Connection>,
        opaque: i32,
        encode: impl Fn(&mut Vec<u8>, i32),
    ) {
        if !self.running.replace(true) {
            shards::runtime::spawn_detached(self.clone().run(broker.clone()));
        }
        let mut success = Vec::new();
        encode(&mut success, crate::remoting::response_code::SUCCESS);
        let mut timed_out = Vec::new();
        encode(
            &mut timed_out,
            crate::remoting::response_code::FLUSH_SLAVE_TIMEOUT,
        );
        let timeout = Duration::from_millis(broker.ha.config.slave_timeout_ms);
        self.queue.borrow_mut().push_back(Waiting {
            end_offset,
            deadline: Instant::now() + timeout,
            connection: connection.clone(),
            opaque,
            success,
            timed_out,
            _in_flight: connection.in_flight(),
        });
        self.queued.notify();
    }

    pub fn len(&self) -> usize {
        self.queue.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.borrow().is_empty()
    }

    async fn run(self: Rc<Self>, broker: Rc<Broker>) {
        let sync_flush = broker.store.flush_mode() == FlushMode::Sync;
        loop {
            let front = self
                .queue
                .borrow()
                .front()
                .map(|w| (w.end_offset, w.deadline));
            let Some((end_offset, deadline)) = front else {
                self.queued.wait().await;
                continue;
            };
            if sync_flush {
                let durable = broker
                    .store
                    .wait_durable(shards::CommitLogOffset(end_offset))
                    .await;
                if let Err(error) = durable {
                    let error = store_error(error);
                    while let Some(waiting) = self.pop_if(|w| w.end_offset <= end_offset) {
                        error.respond(&waiting.connection, waiting.opaque);
                    }
                    continue;
                }
            }
            // Taken before looking, so a report that lands in between is not missed.
            let reported = broker.ha.acked.wait();
            let acked = broker.ha.slave_ack_offset().unwrap_or(0);
            let now = Instant::now();
            let mut answered = false;
            while let Some(waiting) = self.pop_if(|w| w.end_offset <= acked) {
                waiting
                    .connection
                    .send_with(|out| out.extend_from_slice(&waiting.success));
                answered = true;
            }
            while let Some(waiting) = self.pop_if(|w| w.deadline <= now) {
                self.timeouts.set(self.timeouts.get() + 1);
                waiting
                    .connection
                    .send_with(|out| out.extend_from_slice(&waiting.timed_out));
                answered = true;
            }
            if !answered {
                let left = deadline.saturating_duration_since(now);
                let _ = shards::runtime::timeout(left, reported).await;
            }
        }
    }

    fn pop_if(&self, test: impl Fn(&Waiting) -> bool) -> Option<Waiting> {
        let mut queue = self.queue.borrow_mut();
        if queue.front().is_some_and(test) {
            queue.pop_front()
        } else {
            None
        }
    }
}
