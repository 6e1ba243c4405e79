//! Emptying a store in process (`Store::reset_empty_at`, replica.rs): a replica whose log
//! cannot continue its master's (it fell behind the master's retained range, or its bytes
//! diverge from some offset on) throws away everything it holds and goes on, empty, at the
//! master's offset, without a restart.
//!
//! Runs on the store's shard, as one action of the flusher task (`flusher::run`): while it
//! runs no flush, zero-fill, allocation or segment creation of the flusher's own is under
//! way, so no file is written after it was removed, nor under the name of one the new log
//! creates again (the segment at the offset, a queue's `00000000000000000000`). Steps:
//!
//! 1. The request (`Store::reset_empty_at`): from now on appends are refused
//!    (`LogState::writable`: `StoreError::Resetting`), `kick` starts no flush, a flush under
//!    way gives up, and retention picks no segment.
//! 2. Quiet: the checkpoint task and a retention deletion under way end (either could remove
//!    or write a file under a name the new log takes), then the ring's chains.
//! 3. The marker `<root>/reset-in-progress` (empty) is made durable with its directory. A
//!    marker that cannot be written refuses the reset; the store goes on unchanged.
//! 4. In one synchronous step the store's state becomes that of an empty store starting at
//!    the offset (`swap_in_empty`): tail, positions, allocated space, segment table, queue
//!    table, index, read cache; `wait_durable` callers and the pulls parked on the old queues
//!    are woken (they read again and find nothing).
//! 5. The files go, on the helper thread (`remove_everything`): `commitlog/`, `consumequeue/`
//!    and `index/` are removed and made again, empty, and the checkpoint is removed; the root
//!    directory is synced, then the marker is removed and the root synced again. A failure
//!    here poisons the store: a restart finishes the wipe.
//! 6. Appends are taken again; the segment at the offset is created and the allocation window
//!    ahead of it taken before the request is answered, as `start_empty_at` does.
//!
//! What a crash (kill -9) reopens: before the marker is durable, the old store unchanged;
//! from then until the marker is removed, an empty store at 0, because `Store::open` finishes
//! the wipe first when it finds the marker (`finish_interrupted`, before recovery); after
//! that and before the segment at the offset exists, an empty store at 0 too (empty
//! directories); from then on the reset store (recovery takes the first segment file as the
//! log's start). Never old queues pointing at removed commitlog, nor commitlog without its
//! queues: while both exist on disk, the marker does too.

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::rc::Rc;

use crate::runtime::fs::DirectFile;
use crate::sync::Event;

use super::checkpoint;
use super::commit_ring::Slot;
use super::consume_queue::QueueTable;
use super::flusher;
use super::index::Index;
use super::segments::sync_dir;
use super::tail::{Tail, TAIL_CHUNK_BYTES};
use super::{Inner, QueueId, QueueOffset, StoreError};

/// Present in the store's root while a reset may have removed part of what the store holds.
pub(crate) const MARKER_FILE_NAME: &str = "reset-in-progress";
/// The directories a reset empties (everything else the store holds is the checkpoint).
const EMPTIED_DIRS: [&str; 3] = ["commitlog", "consumequeue", "index"];

/// A reset asked of the flusher, and its outcome for the caller who waits on it.
pub(crate) struct ResetRequest {
    pub(crate) offset: u64,
    outcome: RefCell<Option<Result<(), StoreError>>>,
    done: Event,
}

impl ResetRequest {
    pub(crate) fn new(offset: u64) -> Rc<ResetRequest> {
        Rc::new(ResetRequest {
            offset,
            outcome: RefCell::new(None),
            done: Event::default(),
        })
    }

    /// Resolves with the outcome once the flusher has run the reset.
    pub(crate) async fn outcome(&self) -> Result<(), StoreError> {
        loop {
            let taken = self.outcome.borrow_mut().take();
            if let Some(outcome) = taken {
                return outcome;
            }
            self.done.wait().await;
        }
    }

    fn finish(&self, outcome: Result<(), StoreError>) {
        *self.outcome.borrow_mut() = Some(outcome);
        self.done.notify();
    }
}

/// The flusher's action: runs the reset asked for, and answers it.
pub(crate) async fn run(inner: &Rc<Inner>) {
    let Some(request) = inner.log.borrow().reset.clone() else {
        return;
    };
    let outcome = reset(inner, request.offset).await;
    let mut log = inner.log.borrow_mut();
    // Appends may have been taken again already (step 6), and another reset asked for since.
    if log.reset.as_ref().is_some_and(|r| Rc::ptr_eq(r, &request)) {
        log.reset = None;
    }
    drop(log);
    request.finish(outcome);
}

async fn reset(inner: &Rc<Inner>, offset: u64) -> Result<(), StoreError> {
    quiet(inner).await;
    if let Some(poison) = &inner.log.borrow().poison {
        return Err(StoreError::StartRefused {
            offset,
            reason: poison.to_error().to_string(),
        });
    }
    let root = &inner.config.root_dir;
    write_marker(root).await?;
    let old_segments = swap_in_empty(inner, offset);
    // No chain writes through them (step 2); a reader still holding one closes it later.
    for file in old_segments {
        DirectFile::close_shared(file).await;
    }
    if let Err(error) = remove_everything(root).await {
        flusher::poison(
            inner,
            "emptying the store for a reset (a restart finishes it)",
            &error,
        );
        let poison = inner.log.borrow().poison.clone();
        return Err(poison.map_or(StoreError::Io(error), |p| p.to_error()));
    }
    inner.log.borrow_mut().reset = None;
    flusher::allocate_ahead(inner).await;
    if let Some(poison) = &inner.log.borrow().poison {
        return Err(poison.to_error());
    }
    // Allocation short of space may not have got as far as the file.
    flusher::ensure_segments(inner, offset, offset + 1).await?;
    let dir = inner.log.borrow().segments.dir.clone();
    sync_dir(&dir).await?;
    log::warn!(
        "store {}: emptied (every message, consume queue and index file removed); the log \
         starts again at offset {offset}",
        root.display()
    );
    Ok(())
}

/// Step 2: waits until no checkpoint task, retention deletion or chain is under way. None
/// starts meanwhile: the flusher (which starts checkpoints, zero-fills and flushes) is here,
/// `kick` and retention look at the request.
async fn quiet(inner: &Inner) {
    loop {
        let tasks_busy = {
            let log = inner.log.borrow();
            log.flush.checkpoint_running || log.deleting_segment
        };
        if tasks_busy {
            // Both signal the flusher when they end.
            inner.notify.wait().await;
            continue;
        }
        flusher::chain_ended(inner, Slot::ZeroFill).await;
        flusher::chain_ended(inner, Slot::Data).await;
        flusher::chain_ended(inner, Slot::Sync).await;
        let log = inner.log.borrow();
        if !log.ring.any_busy() && !log.flush.checkpoint_running && !log.deleting_segment {
            return;
        }
    }
}

/// Step 3. On failure the marker is taken away again, so the store is left as it was.
async fn write_marker(root: &Path) -> Result<(), StoreError> {
    let path = root.join(MARKER_FILE_NAME);
    let written = match crate::runtime::fs::write_small_file(&path, Vec::new()).await {
        Ok(()) => sync_dir(root).await,
        Err(error) => Err(error),
    };
    if let Err(error) = written {
        if let Err(removal) = crate::runtime::fs::remove_if_present(&path) {
            log::error!(
                "store {}: a reset was refused ({error}), but its marker {} could not be \
                 removed ({removal}): the next start empties the store",
                root.display(),
                path.display()
            );
        }
        return Err(error.into());
    }
    Ok(())
}

/// Step 4: the store's state becomes that of an empty store whose log starts at `offset`.
/// Returns the old segment files, taken out of the table, for the caller to close.
fn swap_in_empty(inner: &Inner, offset: u64) -> Vec<Rc<DirectFile>> {
    let config = &inner.config;
    let old_queues = std::mem::replace(
        &mut *inner.queues.borrow_mut(),
        QueueTable::empty(
            config.root_dir.join("consumequeue"),
            config.consume_queue_units_per_file,
        ),
    );
    // The old maps go with it, before their files are removed.
    drop(std::mem::replace(
        &mut *inner.index.borrow_mut(),
        Index::empty(&config.root_dir, config.index, offset),
    ));
    let old_segments = {
        let mut log = inner.log.borrow_mut();
        let files = std::mem::take(&mut log.segments.files);
        log.segments.recycled.clear();
        // The chunk holding `offset` starts below it: zeros there, never read (below the
        // minimum) nor written (flushes start at the durable end).
        let prefix = vec![0u8; (offset % TAIL_CHUNK_BYTES) as usize];
        log.tail = Tail::new(offset, &prefix);
        log.min_physical_offset = offset;
        log.resets += 1;
        let messages = log.stats.put_messages;
        log.flush.reset_to(offset, messages);
        log.space.reset_to(offset);
        files.into_values().collect()
    };
    inner.read_cache.borrow_mut().forget_all();
    // Pulls parked on the old queues read again, and find nothing there.
    let old_queue_ids = old_queues.max_offsets();
    drop(old_queues);
    let listener = inner.arrival_listener.borrow().clone();
    if let Some(listener) = listener {
        for (topic, queues) in &old_queue_ids {
            for &queue_id in queues.keys() {
                listener(topic, QueueId(queue_id), QueueOffset(0));
            }
        }
    }
    old_segments
}

/// Step 5 (and what `finish_interrupted` does): removes every message, consume queue, index
/// file and the checkpoint under `root`, makes that durable, then removes the marker.
async fn remove_everything(root: &Path) -> io::Result<()> {
    let owned = root.to_path_buf();
    // Thousands of queue directories take a while to remove: off the shard's thread.
    crate::runtime::blocking(move || -> io::Result<()> {
        for name in EMPTIED_DIRS {
            let dir = owned.join(name);
            crate::runtime::fs::remove_dir_all_if_present(&dir)?;
            std::fs::create_dir_all(&dir)?;
        }
        checkpoint::remove(&owned)
    })
    .await?;
    sync_dir(root).await?;
    std::fs::remove_file(root.join(MARKER_FILE_NAME))?;
    sync_dir(root).await
}

/// At `Store::open`, before recovery: a reset that a crash interrupted is finished (the
/// store opens empty, its log at 0). True when there was one.
pub(crate) async fn finish_interrupted(root: &Path) -> io::Result<bool> {
    if !root.join(MARKER_FILE_NAME).try_exists()? {
        return Ok(false);
    }
    log::warn!(
        "store {}: a reset was under way when the store stopped; finishing it: the store \
         opens empty",
        root.display()
    );
    remove_everything(root).await?;
    Ok(true)
}
