//! SYNC_FLUSH answers waiting for the group commit that covers them.
//!
//! A SYNC_FLUSH send is answered once the flush covering its record is durable. Each answer
//! is encoded when its send is handled and queued here; appends on a shard are in commitlog
//! order, so the queue is too. One task per shard waits for the oldest answer's offset to be
//! durable, then hands every answer that flush covered to its connection: one wake-up per
//! group commit, where a task per send cost a spawn, a waker in the store's waiter map and a
//! wake-up each. The answers are encoded back to back into one buffer (no allocation per
//! send once it has grown).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use shards::store::Store;

use crate::error::store_error;
use crate::server::{Connection, InFlight};

/// The answers of one shard's SYNC_FLUSH sends, oldest first.
#[derive(Default)]
pub struct DurableReplies {
    pub(crate) queue: RefCell<VecDeque<WaitingReply>>,
    /// The queued answers' frames, back to back; `WaitingReply::frame_end` indexes it. Cleared
    /// whenever the queue empties, compacted when its sent front grows past half of it.
    pub(crate) frames: RefCell<Vec<u8>>,
    /// Bytes at the front of `frames` already sent.
    pub(crate) frames_sent: Cell<usize>,
    pub(crate) queued: shards::sync::Signal,
    pub(crate) running: Cell<bool>,
}

pub(crate) struct WaitingReply {
    /// Commitlog offset the send's last record ends at.
    pub(crate) end_offset: u64,
    pub(crate) connection: Rc<Connection>,
    pub(crate) opaque: i32,
    /// Where the encoded success answer ends in `frames` (it starts where the previous one
    /// ends, or at `frames_sent` for the first).
    pub(crate) frame_end: usize,
    /// Counts against the connection's requests in flight until answered.
    pub(crate) _in_flight: InFlight,
}

impl DurableReplies {
    /// Queues the answer `encode` writes to the request `opaque` on `connection`, sent once
    /// `store` is durable up to `end_offset` (or replaced by an error answer if the store
    /// fails).
    pub fn push(
        self: &Rc<Self>,
        store: &Store,
        end_offset: u64,
        connection: &Rc<Connection>,
        opaque: i32,
        encode: impl FnOnce(&mut Vec<u8>),
    ) {
        if !self.running.replace(true) {
            shards::runtime::spawn_detached(self.clone().run(store.clone()));
        }
        let frame_end = {
            let mut frames = self.frames.borrow_mut();
            encode(&mut frames);
            frames.len()
        };
        let reply = WaitingReply {
            end_offset,
            connection: connection.clone(),
            opaque,
            frame_end,
            _in_flight: connection.in_flight(),
        };
        self.queue.borrow_mut().push_back(reply);
        self.queued.notify();
    }

    pub(crate) async fn run(self: Rc<Self>, store: Store) {
        loop {
            let oldest = self.queue.borrow().front().map(|reply| reply.end_offset);
            let Some(oldest) = oldest else {
                self.queued.wait().await;
                continue;
            };
            let waited = store
                .wait_durable(shards::CommitLogOffset(oldest))
                .await
                .map_err(store_error);
            let durable = store.durable_offset();
            let answered = std::time::Instant::now();
            loop {
                let reply = {
                    let mut queue = self.queue.borrow_mut();
                    match queue.front() {
                        Some(reply) if waited.is_err() || reply.end_offset <= durable.0 => {
                            queue.pop_front()
                        }
                        _ => None,
                    }
                };
                let Some(reply) = reply else { break };
                let start = self.frames_sent.replace(reply.frame_end);
                match &waited {
                    Ok(()) => reply.connection.send_with_at(answered, |out| {
                        out.extend_from_slice(&self.frames.borrow()[start..reply.frame_end])
                    }),
                    Err(error) => error.respond(&reply.connection, reply.opaque),
                }
            }
            self.drop_sent_frames();
        }
    }

    /// Forgets the frames already sent: all of them when nothing waits, else (moving the rest
    /// to the front) once they are more than half of the buffer.
    pub(crate) fn drop_sent_frames(&self) {
        let sent = self.frames_sent.get();
        let mut frames = self.frames.borrow_mut();
        let mut queue = self.queue.borrow_mut();
        if queue.is_empty() {
            frames.clear();
        } else if sent > frames.len() / 2 {
            frames.drain(..sent);
            for reply in queue.iter_mut() {
                reply.frame_end -= sent;
            }
        } else {
            return;
        }
        self.frames_sent.set(0);
    }
}
