//! The control-plane mesh between the shards of one node.
//!
//! Control messages only (topic create/delete fan-out, route replica updates, shutdown): the
//! data path never crosses cores. Channels are bounded; a full channel is an answer (the
//! message is dropped and counted), never an unbounded wait.

use std::cell::Cell;
use std::rc::Rc;

use futures_lite::StreamExt;
use glommio::channels::channel_mesh::{Receivers, Senders};

use crate::ShardId;

/// This shard's end of the mesh. Cloning shares the same senders.
pub struct Mesh<M: Send + 'static> {
    shard_id: ShardId,
    senders: Rc<Senders<M>>,
    receivers: Option<Receivers<M>>,
    dropped_messages: Rc<Cell<u64>>,
}

impl<M: Send + 'static> Mesh<M> {
    pub(crate) fn new(shard_id: ShardId, senders: Senders<M>, receivers: Receivers<M>) -> Self {
        Mesh {
            shard_id,
            senders: Rc::new(senders),
            receivers: Some(receivers),
            dropped_messages: Rc::new(Cell::new(0)),
        }
    }

    pub fn shard_id(&self) -> ShardId {
        self.shard_id
    }

    pub fn shard_count(&self) -> usize {
        self.senders.nr_consumers()
    }

    /// Messages dropped so far because a peer's inbox was full or closed.
    pub fn dropped_messages(&self) -> u64 {
        self.dropped_messages.get()
    }

    /// A handle that can send but not receive (for handlers that broadcast).
    pub fn sender(&self) -> MeshSender<M> {
        MeshSender {
            shard_id: self.shard_id,
            senders: self.senders.clone(),
            dropped_messages: self.dropped_messages.clone(),
        }
    }

    /// Spawns one task per peer that feeds every incoming message to `handle`.
    pub fn spawn_receivers(&mut self, handle: impl Fn(ShardId, M) + Clone + 'static) {
        let Some(mut receivers) = self.receivers.take() else {
            return;
        };
        for (peer, mut stream) in receivers.streams() {
            let handle = handle.clone();
            glommio::spawn_local(async move {
                while let Some(message) = stream.next().await {
                    handle(peer, message);
                }
            })
            .detach();
        }
    }
}

/// The sending half of a shard's mesh end.
#[derive(Clone)]
pub struct MeshSender<M: Send + 'static> {
    shard_id: ShardId,
    senders: Rc<Senders<M>>,
    dropped_messages: Rc<Cell<u64>>,
}

impl<M: Send + Clone + 'static> MeshSender<M> {
    /// Sends `message` to every other shard; returns how many peers could not take it.
    pub fn broadcast(&self, message: &M) -> usize {
        let mut dropped = 0;
        for peer in 0..self.senders.nr_consumers() {
            if peer == self.shard_id {
                continue;
            }
            if self.senders.try_send_to(peer, message.clone()).is_err() {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.dropped_messages
                .set(self.dropped_messages.get() + dropped as u64);
            eprintln!(
                "shardmq: shard {}: {dropped} control message(s) dropped",
                self.shard_id
            );
        }
        dropped
    }
}
