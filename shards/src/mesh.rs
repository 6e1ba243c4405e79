//! The control-plane mesh between the shards of one node.
//!
//! Control messages only (topic create/delete fan-out, route replica updates): the data path
//! never crosses cores. Every broadcast is numbered per sender, and every shard records the
//! last number it applied from each sender (`Progress`, shared atomics of the control plane
//! only), so a shard can wait until everything broadcast so far has been applied everywhere. Each shard has one bounded inbox that every other shard can send to;
//! a full inbox is an answer (the message is dropped, counted and logged), never a wait.
//! A sender wakes the receiving shard through the runtime's wake-up pair after its message is
//! in the inbox (`runtime::wake`), so an idle shard sleeps and a message is handled at once;
//! a shard that applied messages wakes their senders too, whose `progress` signal tells the
//! tasks waiting for every replica to catch up to look again. (glommio's own channel mesh was
//! tried first: its join hung now and then at start-up on these machines, so the mesh uses std
//! channels.)

use crate::runtime::wake::{self, UnboundReceiver, WakeReceiver, Waker};
use crate::sync::Event;
use crate::ShardId;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;

pub use crate::limits::MESH_MESSAGES_PER_POLL_MAX;

/// Creates the inboxes of `shard_count` shards: one `MeshEnd` per shard, in shard order, each
/// to be bound on its shard (`MeshEnd::bind`).
pub fn build<M: Send + 'static>(
    shard_count: usize,
    capacity: usize,
) -> std::io::Result<Vec<MeshEnd<M>>> {
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..shard_count)
        .map(|_| std::sync::mpsc::sync_channel::<Envelope<M>>(capacity))
        .unzip();
    let mut wakers = Vec::with_capacity(shard_count);
    let mut wake_receivers = Vec::with_capacity(shard_count);
    for _ in 0..shard_count {
        let (waker, receiver) = wake::unbound_pair()?;
        wakers.push(waker);
        wake_receivers.push(Some(receiver));
    }
    let progress = Arc::new(Progress {
        sent: (0..shard_count).map(|_| AtomicU64::new(0)).collect(),
        applied: (0..shard_count)
            .map(|_| (0..shard_count).map(|_| AtomicU64::new(0)).collect())
            .collect(),
    });
    let meshes = receivers
        .into_iter()
        .zip(wake_receivers)
        .enumerate()
        .map(|(shard_id, (inbox, wake_receiver))| MeshEnd {
            shard_id: ShardId(shard_id),
            peers: senders.clone(),
            wakers: wakers.clone(),
            inbox,
            wake_receiver: wake_receiver.expect("one per shard"),
            progress: progress.clone(),
        })
        .collect();
    Ok(meshes)
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

/// A shard's end of the mesh as it travels to its shard (`Send`).
pub struct MeshEnd<M: Send + 'static> {
    shard_id: ShardId,
    peers: Vec<SyncSender<Envelope<M>>>,
    wakers: Vec<Waker>,
    inbox: Receiver<Envelope<M>>,
    wake_receiver: UnboundReceiver,
    progress: Arc<Progress>,
}

impl<M: Send + 'static> MeshEnd<M> {
    /// The end, bound to the current shard.
    pub fn bind(self) -> Mesh<M> {
        Mesh {
            shard_id: self.shard_id,
            peers: self.peers,
            wakers: self.wakers,
            inbox: Some(self.inbox),
            wake_receiver: Some(self.wake_receiver.bind()),
            progress: self.progress,
            progress_signal: Rc::new(Event::default()),
        }
    }
}

/// This shard's end of the mesh.
pub struct Mesh<M: Send + 'static> {
    shard_id: ShardId,
    peers: Vec<SyncSender<Envelope<M>>>,
    /// Every shard's wake-up (index = shard id).
    wakers: Vec<Waker>,
    inbox: Option<Receiver<Envelope<M>>>,
    /// What the receiving task waits on (taken by `spawn_receivers`).
    wake_receiver: Option<WakeReceiver>,
    progress: Arc<Progress>,
    /// Notified on this shard whenever it was woken (messages, or peers' progress).
    progress_signal: Rc<Event>,
}

impl<M: Send + 'static> Mesh<M> {
    /// A handle that can send but not receive (for handlers that broadcast).
    pub fn sender(&self) -> MeshSender<M> {
        MeshSender {
            shard_id: self.shard_id,
            peers: Rc::new(self.peers.clone()),
            wakers: Rc::new(self.wakers.clone()),
            dropped_messages: Rc::new(Cell::new(0)),
            progress: self.progress.clone(),
            progress_signal: self.progress_signal.clone(),
        }
    }

    /// Spawns the task that feeds every incoming message to `handle` (once per shard).
    pub fn spawn_receivers(&mut self, handle: impl Fn(M) + 'static) {
        let (Some(inbox), Some(mut wake_receiver)) = (self.inbox.take(), self.wake_receiver.take())
        else {
            return;
        };
        let (progress, me) = (self.progress.clone(), self.shard_id);
        let (wakers, signal) = (self.wakers.clone(), self.progress_signal.clone());
        crate::runtime::spawn_detached(async move {
            let mut origins = vec![false; wakers.len()];
            loop {
                let mut handled = 0;
                while handled < MESH_MESSAGES_PER_POLL_MAX {
                    let Ok(envelope) = inbox.try_recv() else {
                        break;
                    };
                    handle(envelope.message);
                    progress.applied[me.0][envelope.origin.0]
                        .store(envelope.sequence, Ordering::SeqCst);
                    origins[envelope.origin.0] = true;
                    handled += 1;
                }
                // Senders waiting for every replica look again.
                for (origin, woke) in origins.iter_mut().enumerate() {
                    if std::mem::take(woke) {
                        wakers[origin].wake();
                    }
                }
                signal.notify();
                if handled == MESH_MESSAGES_PER_POLL_MAX {
                    // More may wait: let the shard serve requests first.
                    crate::runtime::yield_now().await;
                    continue;
                }
                if wake_receiver.wait().await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The sending half of a shard's mesh end.
#[derive(Clone)]
pub struct MeshSender<M: Send + 'static> {
    shard_id: ShardId,
    peers: Rc<Vec<SyncSender<Envelope<M>>>>,
    wakers: Rc<Vec<Waker>>,
    dropped_messages: Rc<Cell<u64>>,
    progress: Arc<Progress>,
    progress_signal: Rc<Event>,
}

impl<M: Send + Clone + 'static> MeshSender<M> {
    /// Sends `message` to every other shard; returns how many peers could not take it.
    pub fn broadcast(&self, message: &M) -> usize {
        let mut dropped = 0;
        let sequence = self.progress.sent[self.shard_id.0].fetch_add(1, Ordering::SeqCst) + 1;
        for (peer, sender) in self.peers.iter().enumerate() {
            if peer == self.shard_id.0 {
                continue;
            }
            let envelope = Envelope {
                origin: self.shard_id,
                sequence,
                message: message.clone(),
            };
            match sender.try_send(envelope) {
                Ok(()) => self.wakers[peer].wake(),
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => dropped += 1,
            }
        }
        if dropped > 0 {
            self.dropped_messages
                .set(self.dropped_messages.get() + dropped as u64);
            log::warn!(
                "shard {}: {dropped} control message(s) dropped",
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

    /// Resolves once every message broadcast so far has been applied by every other shard,
    /// or after `timeout` (a dropped message is never applied). True when applied.
    pub async fn wait_all_applied(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.all_applied() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            crate::runtime::timeout(left, self.progress_signal.wait()).await;
        }
    }

    /// The signal notified whenever this shard's mesh end was woken (a message applied
    /// here, or a peer's progress): what route-replica waiters wait on.
    pub fn progress_signal(&self) -> Rc<Event> {
        self.progress_signal.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_reaches_every_other_shard_and_a_full_inbox_drops() {
        crate::runtime::run_local(|| async {
            let mut meshes: Vec<_> = build::<u32>(3, 1)
                .unwrap()
                .into_iter()
                .map(MeshEnd::bind)
                .collect();
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
        });
    }
}
