//! The control-plane mesh between the shards of one node.
//!
//! Control messages only (topic create/delete fan-out, route replica updates): the data path
//! never crosses cores. Every broadcast is numbered per sender, and every shard records the
//! last number it applied from each sender (`Progress`, shared atomics of the control plane
//! only), so a shard can wait until everything broadcast so far has been applied everywhere. Each shard has one bounded inbox that every other shard can send to;
//! a full inbox is an answer (the message is dropped, counted and logged), never a wait.
//! The inbox is drained by a task every `MESH_POLL_INTERVAL_MS`: control traffic is rare and
//! a few milliseconds of delay is nothing to it. (glommio's own channel mesh was tried first:
//! its join hung now and then at start-up on these machines, so the mesh uses std channels.)

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use crate::ShardId;

/// How often a shard looks at its inbox.
pub const MESH_POLL_INTERVAL_MS: u64 = 2;
/// Messages handled per look, so a burst cannot monopolise the shard.
pub const MESH_MESSAGES_PER_POLL_MAX: usize = 256;

/// Creates the inboxes of `shard_count` shards: one `Mesh` per shard, in shard order.
pub fn build<M: Send + 'static>(shard_count: usize, capacity: usize) -> Vec<Mesh<M>> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..shard_count)
        .map(|_| std::sync::mpsc::sync_channel::<Envelope<M>>(capacity))
        .unzip();
    let progress = Arc::new(Progress {
        sent: (0..shard_count).map(|_| AtomicU64::new(0)).collect(),
        applied: (0..shard_count)
            .map(|_| (0..shard_count).map(|_| AtomicU64::new(0)).collect())
            .collect(),
    });
    receivers
        .into_iter()
        .enumerate()
        .map(|(shard_id, inbox)| Mesh {
            shard_id,
            peers: senders.clone(),
            inbox: Some(inbox),
            progress: progress.clone(),
        })
        .collect()
}

/// A message with its sender and its number in that sender's sequence.
struct Envelope<M> {
    origin: ShardId,
    sequence: u64,
    message: M,
}

/// Delivery progress of the whole mesh.
struct Progress {
    /// Broadcasts numbered so far, per sender.
    sent: Vec<AtomicU64>,
    /// `applied[receiver][sender]`: the last number the receiver applied from the sender.
    applied: Vec<Vec<AtomicU64>>,
}

impl Progress {
    fn all_applied(&self) -> bool {
        (0..self.sent.len()).all(|origin| {
            let sent = self.sent[origin].load(Ordering::SeqCst);
            (0..self.sent.len()).all(|receiver| {
                receiver == origin || self.applied[receiver][origin].load(Ordering::SeqCst) >= sent
            })
        })
    }
}

/// This shard's end of the mesh.
pub struct Mesh<M: Send + 'static> {
    shard_id: ShardId,
    peers: Vec<SyncSender<Envelope<M>>>,
    inbox: Option<Receiver<Envelope<M>>>,
    progress: Arc<Progress>,
}

impl<M: Send + 'static> Mesh<M> {
    /// A handle that can send but not receive (for handlers that broadcast).
    pub fn sender(&self) -> MeshSender<M> {
        MeshSender {
            shard_id: self.shard_id,
            peers: Rc::new(self.peers.clone()),
            dropped_messages: Rc::new(Cell::new(0)),
            progress: self.progress.clone(),
        }
    }

    /// Spawns the task that feeds every incoming message to `handle` (once per shard).
    pub fn spawn_receivers(&mut self, handle: impl Fn(M) + 'static) {
        let Some(inbox) = self.inbox.take() else {
            return;
        };
        let (progress, me) = (self.progress.clone(), self.shard_id);
        glommio::spawn_local(async move {
            loop {
                for _ in 0..MESH_MESSAGES_PER_POLL_MAX {
                    match inbox.try_recv() {
                        Ok(envelope) => {
                            handle(envelope.message);
                            progress.applied[me][envelope.origin]
                                .store(envelope.sequence, Ordering::SeqCst);
                        }
                        Err(_) => break,
                    }
                }
                glommio::timer::sleep(Duration::from_millis(MESH_POLL_INTERVAL_MS)).await;
            }
        })
        .detach();
    }
}

/// The sending half of a shard's mesh end.
#[derive(Clone)]
pub struct MeshSender<M: Send + 'static> {
    shard_id: ShardId,
    peers: Rc<Vec<SyncSender<Envelope<M>>>>,
    dropped_messages: Rc<Cell<u64>>,
    progress: Arc<Progress>,
}

impl<M: Send + Clone + 'static> MeshSender<M> {
    /// Sends `message` to every other shard; returns how many peers could not take it.
    pub fn broadcast(&self, message: &M) -> usize {
        let mut dropped = 0;
        let sequence = self.progress.sent[self.shard_id].fetch_add(1, Ordering::SeqCst) + 1;
        for (peer, sender) in self.peers.iter().enumerate() {
            if peer == self.shard_id {
                continue;
            }
            let envelope = Envelope {
                origin: self.shard_id,
                sequence,
                message: message.clone(),
            };
            match sender.try_send(envelope) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => dropped += 1,
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

    /// Messages dropped so far because a peer's inbox was full or gone.
    pub fn dropped_messages(&self) -> u64 {
        self.dropped_messages.get()
    }
}

impl<M: Send + 'static> MeshSender<M> {
    /// Whether every message broadcast so far, by any shard, has been applied by every other
    /// shard. (A dropped message is never applied: waiters must bound their wait.)
    pub fn all_applied(&self) -> bool {
        self.progress.all_applied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_reaches_every_other_shard_and_a_full_inbox_drops() {
        let mut meshes = build::<u32>(3, 1);
        let sender = meshes[0].sender();
        assert_eq!(sender.broadcast(&7), 0);
        assert_eq!(sender.broadcast(&8), 2, "inboxes of capacity 1 are full");
        assert_eq!(sender.dropped_messages(), 2);
        let inbox = meshes[1].inbox.take().unwrap();
        assert_eq!(inbox.try_recv().ok().map(|e| e.message), Some(7));
        assert!(!sender.all_applied(), "nothing was applied yet");
        assert!(
            meshes[0].inbox.take().unwrap().try_recv().is_err(),
            "no message to self"
        );
    }
}
