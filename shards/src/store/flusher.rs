//! The flusher: the one task per store that writes commitlog files, and group commit.
//!
//! Runs on the store's executor, spawned by `Store::open`; it holds only a weak reference, so
//! a store dropped without `close` stops it (what a crash leaves behind, for tests). Each turn
//! it does one thing, in this order of priority:
//!
//! | Action | When |
//! |---|---|
//! | exit (final flush + clean checkpoint) | `close` was called |
//! | checkpoint (flush, sync queues, write) | every `CHECKPOINT_INTERVAL_MS` when something changed, or when asked (delete_topic) |
//! | flush | Sync: anything dirty; Async: dirty for `flush_interval_ms` or more than `flush_dirty_max_bytes` dirty |
//! | zero-fill one chunk (write + fdatasync) | idle and the next segment is not yet ready |
//! | wait | for an append, a `wait_durable`, `close` or the next deadline |
//!
//! A flush writes `[align_down(durable_end), align_up(end))` (re-writing the partial last
//! block) in one `write_at` per segment (split at `FLUSH_WRITE_MAX_BYTES`), then one
//! `fdatasync`, then sets `durable_end = end` and wakes every waiter at or below it. Because
//! appends go on during a flush, the next flush carries all of them: that is the group commit.
//!
//! Zero-filling runs on its own when no flush has run for `ZERO_FILL_IDLE_MS`. Under load
//! that never pauses (Sync mode at depth) the flusher is never idle, so a Sync flush whose
//! zeroed margin ahead of the write position is below `ZERO_FILL_AHEAD_MIN_BYTES` also writes
//! a zero-fill chunk about as large as its data, together with it, before its fdatasync:
//! data keeps landing on written extents, and the extent conversion that makes fdatasync over
//! fallocated-but-unwritten space ~30% dearer (ARCHITECTURE §3) is paid once per chunk, not
//! by every sync. An idle-time zero-fill chunk in progress delays the next flush by one
//! 1 MiB write + fdatasync.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::io;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use glommio::io::{BufferedFile, DmaBuffer, DmaFile};

use super::checkpoint::{self, Checkpoint};
use super::error::{io_error, os_error_with_context, Poison};
use super::segments::{align_down, align_up, create_segment, write_shared_buffer_at, BLOCK_BYTES};
use super::{FlushMode, Inner, StoreError, TAIL_READ_KEEP_BYTES};

/// Async mode: default dirty bytes that trigger a flush before the interval ends (one large
/// write is as cheap as a small one; more would delay durability and grow the write).
/// `StoreConfig::flush_dirty_max_bytes` sets it per store.
pub const FLUSH_DIRTY_BYTES_MAX: u64 = 4 << 20;
/// Largest single DMA write: bounds the DMA buffer a flush allocates.
pub const FLUSH_WRITE_MAX_BYTES: u64 = 8 << 20;
/// Zero-fill write size: large enough to be efficient, small enough not to delay a flush.
pub const ZERO_FILL_CHUNK_BYTES: u64 = 1 << 20;
/// How often consume queues are synced and the checkpoint written (bounds recovery work).
pub const CHECKPOINT_INTERVAL_MS: u64 = 1000;
/// Zeroed space a flush keeps ahead of the write position when the flusher never idles:
/// below this margin a flush also writes one zero-fill chunk, covered by its own fdatasync.
pub const ZERO_FILL_AHEAD_MIN_BYTES: u64 = 8 << 20;
/// Smallest zero-fill chunk a flush carries (a flush carries about as much as it writes).
pub const ZERO_FILL_CARRIED_MIN_BYTES: u64 = 64 << 10;
/// Zero-filling on its own waits until no flush has run for this long: between two group
/// commits of a steady SYNC_FLUSH load the log is clean only while the acked clients send
/// their next requests, and a 1 MiB zero-fill write + fdatasync slipped in there would delay
/// the next group commit (under load, flushes carry zero-fill chunks instead).
pub const ZERO_FILL_IDLE_MS: u64 = 20;

const _: () = assert!(FLUSH_WRITE_MAX_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(ZERO_FILL_CHUNK_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(ZERO_FILL_CARRIED_MIN_BYTES.is_multiple_of(BLOCK_BYTES));

/// A disk failure to simulate on the next commitlog write or fdatasync (fault-injection hook).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// The next write fails with this errno (e.g. libc::EIO, libc::ENOSPC).
    WriteError { errno: i32 },
    /// The next fdatasync fails with this errno.
    FdatasyncError { errno: i32 },
}

/// Flush bookkeeping, inside the store's `LogState`.
pub(crate) struct FlushState {
    /// Everything below this commitlog offset is written and fdatasync'ed.
    pub(crate) durable_end: u64,
    /// `wait_durable` callers by the offset they wait for.
    waiters: BTreeMap<u64, Vec<Waker>>,
    close_waiters: Vec<Waker>,
    /// When the oldest unflushed append happened (Async deadline).
    dirty_since: Option<Instant>,
    pub(crate) checkpoint_wanted: bool,
    last_checkpoint_at: Instant,
    last_checkpoint_offset: u64,
    /// When the last flush of data finished (idle-time zero-fill waits for a quiet spell).
    last_flush_at: Instant,
    /// Commitlog offset up to which segment space has been zero-filled ahead of writes.
    zero_fill_next: u64,
    /// Zeroed DMA buffers by size, written again and again by zero-fill (power-of-two sizes
    /// from `ZERO_FILL_CARRIED_MIN_BYTES` to `ZERO_FILL_CHUNK_BYTES`).
    zero_buffers: Vec<Rc<DmaBuffer>>,
    messages_at_last_flush: u64,
    pub(crate) fault: Option<InjectedFault>,
    /// Test hook: every flush of dirty data waits this long first, as a slow disk would.
    pub(crate) test_flush_delay: Option<Duration>,
    /// When the flush under way started (None between flushes): how long the disk has kept
    /// the appends since it waiting, which the broker's overload check reads.
    pub(crate) flush_started_at: Option<Instant>,
    /// The flusher has exited (after `close`); the result `close` reports.
    done: Option<Result<(), Poison>>,
}

impl FlushState {
    pub(crate) fn new(durable_end: u64, zero_fill_next: u64) -> FlushState {
        FlushState {
            durable_end,
            waiters: BTreeMap::new(),
            close_waiters: Vec::new(),
            dirty_since: None,
            checkpoint_wanted: false,
            last_checkpoint_at: Instant::now(),
            last_checkpoint_offset: durable_end,
            // As if the last flush were long past: a fresh store zero-fills at once.
            last_flush_at: Instant::now()
                .checked_sub(Duration::from_millis(ZERO_FILL_IDLE_MS))
                .unwrap_or_else(Instant::now),
            zero_fill_next,
            zero_buffers: Vec::new(),
            messages_at_last_flush: 0,
            fault: None,
            test_flush_delay: None,
            flush_started_at: None,
            done: None,
        }
    }

    /// Records an append ending at `end`; true when the flusher must be woken.
    pub(crate) fn note_append(&mut self, mode: FlushMode, end: u64, dirty_max_bytes: u64) -> bool {
        match mode {
            FlushMode::Sync => true,
            FlushMode::Async => {
                let first_dirty = self.dirty_since.is_none();
                if first_dirty {
                    self.dirty_since = Some(Instant::now());
                }
                first_dirty || end - self.durable_end >= dirty_max_bytes
            }
        }
    }

    fn wake_waiters_up_to(&mut self, end: u64) {
        let later = self.waiters.split_off(&(end + 1));
        for waker in std::mem::replace(&mut self.waiters, later)
            .into_values()
            .flatten()
        {
            waker.wake();
        }
    }

    fn wake_everyone(&mut self) {
        for waker in std::mem::take(&mut self.waiters).into_values().flatten() {
            waker.wake();
        }
        for waker in self.close_waiters.drain(..) {
            waker.wake();
        }
    }
}

/// A one-slot wake-up signal for the flusher.
#[derive(Default)]
pub(crate) struct Notify {
    signalled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    pub(crate) fn signal(&self) {
        self.signalled.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    fn wait(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| {
            if self.signalled.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

enum Action {
    Exit,
    Flush,
    Checkpoint,
    ZeroFill,
    Wait(Option<Duration>),
}

pub(crate) fn spawn(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    let notify = inner.notify.clone();
    glommio::spawn_local(run(weak, notify)).detach();
}

async fn run(weak: Weak<Inner>, notify: Rc<Notify>) {
    loop {
        let action = match weak.upgrade() {
            Some(inner) => next_action(&inner),
            None => return,
        };
        let ran = match action {
            Action::Wait(timeout) => {
                match timeout {
                    Some(t) => {
                        futures_lite::future::or(notify.wait(), glommio::timer::sleep(t)).await
                    }
                    None => notify.wait().await,
                }
                continue;
            }
            action => action,
        };
        let Some(inner) = weak.upgrade() else { return };
        match ran {
            Action::Exit => return exit(&inner).await,
            Action::Flush => {
                flush(&inner).await;
                drop(inner);
                // Let the tasks this flush woke append again before deciding what is next, so
                // that an idle-time zero-fill does not slip in front of their flush.
                futures_lite::future::yield_now().await;
            }
            Action::Checkpoint => {
                checkpoint(&inner, false).await;
            }
            Action::ZeroFill => {
                zero_fill_step(&inner).await;
            }
            Action::Wait(_) => {}
        }
    }
}

fn next_action(inner: &Inner) -> Action {
    let log = inner.log.borrow();
    let flush = &log.flush;
    if log.closing {
        return Action::Exit;
    }
    if log.poison.is_some() {
        return Action::Wait(None);
    }
    let now = Instant::now();
    let end = log.tail.end();
    let dirty = end > flush.durable_end;
    let zero_fill_target = zero_fill_target(inner, end);
    let zero_fill_next = flush.zero_fill_next.max(align_up(end, BLOCK_BYTES));
    let zero_fill_pending = zero_fill_next < zero_fill_target;
    let mut deadlines = Vec::new();
    // Checkpoints come before flushes (a checkpoint flushes first): under constant Sync load
    // the log is always dirty, and recovery work must stay bounded all the same.
    let checkpoint_every = Duration::from_millis(CHECKPOINT_INTERVAL_MS);
    let changed = end != flush.last_checkpoint_offset || flush.checkpoint_wanted;
    if changed {
        let due = flush.last_checkpoint_at + checkpoint_every;
        if now >= due || flush.checkpoint_wanted {
            return Action::Checkpoint;
        }
        deadlines.push(due);
    }
    if dirty {
        match inner.config.flush_mode {
            FlushMode::Sync => return Action::Flush,
            FlushMode::Async => {
                let interval = Duration::from_millis(inner.config.flush_interval_ms);
                let since = flush.dirty_since.unwrap_or(now);
                let dirty_max_bytes = inner.config.flush_dirty_max_bytes;
                if end - flush.durable_end >= dirty_max_bytes || now >= since + interval {
                    return Action::Flush;
                }
                deadlines.push(since + interval);
            }
        }
    }
    if zero_fill_pending {
        let quiet_from = flush.last_flush_at + Duration::from_millis(ZERO_FILL_IDLE_MS);
        if now >= quiet_from {
            return Action::ZeroFill;
        }
        deadlines.push(quiet_from);
    }
    Action::Wait(
        deadlines
            .into_iter()
            .min()
            .map(|d| d.saturating_duration_since(now)),
    )
}

/// Zero-filling aims at the end of the segment after the one being written.
fn zero_fill_target(inner: &Inner, end: u64) -> u64 {
    let size = inner.config.segment_size_bytes;
    align_down(end, size) + 2 * size
}

fn poison(inner: &Inner, context: &str, error: &io::Error) {
    let poison = Poison::from_io(context, error);
    eprintln!(
        "shardmq: store {}: {poison:?}",
        inner.config.root_dir.display()
    );
    let mut log = inner.log.borrow_mut();
    if log.poison.is_none() {
        log.poison = Some(poison);
    }
    log.flush.wake_everyone();
}

/// Creates the segment files covering `[start, end)` that do not exist yet.
async fn ensure_segments(inner: &Inner, start: u64, end: u64) -> Result<(), StoreError> {
    let size = inner.config.segment_size_bytes;
    let mut segment = align_down(start, size);
    while segment < end {
        let missing = inner.log.borrow().segments.file_for(segment).is_none();
        if missing {
            let dir = inner.log.borrow().segments.dir.clone();
            let file = create_segment(&dir, size, segment).await?;
            inner
                .log
                .borrow_mut()
                .segments
                .files
                .insert(segment, Rc::new(file));
        }
        segment += size;
    }
    Ok(())
}

fn take_fault(inner: &Inner, write: bool) -> Option<io::Error> {
    let mut log = inner.log.borrow_mut();
    let errno = match log.flush.fault {
        Some(InjectedFault::WriteError { errno }) if write => errno,
        Some(InjectedFault::FdatasyncError { errno }) if !write => errno,
        _ => return None,
    };
    log.flush.fault = None;
    Some(io::Error::from_raw_os_error(errno))
}

/// One flush of everything dirty now. Returns false when the store is (or got) poisoned.
pub(crate) async fn flush(inner: &Inner) -> bool {
    inner.log.borrow_mut().flush.flush_started_at = Some(Instant::now());
    let flushed = flush_dirty(inner).await;
    inner.log.borrow_mut().flush.flush_started_at = None;
    flushed
}

async fn flush_dirty(inner: &Inner) -> bool {
    let (start, end, messages) = {
        let log = inner.log.borrow();
        if log.poison.is_some() {
            return false;
        }
        (
            align_down(log.flush.durable_end, BLOCK_BYTES),
            log.tail.end(),
            log.stats.put_messages,
        )
    };
    if end == inner.log.borrow().flush.durable_end {
        return true;
    }
    let test_delay = inner.log.borrow().flush.test_flush_delay;
    if let Some(delay) = test_delay {
        glommio::timer::sleep(delay).await;
    }
    if let Err(error) = ensure_segments(inner, start, end).await {
        poison(inner, "creating a commitlog segment", &store_io(error));
        return false;
    }
    let size = inner.config.segment_size_bytes;
    let mut jobs = Vec::new();
    {
        let log = inner.log.borrow();
        let stop = align_up(end, BLOCK_BYTES);
        let mut pos = start;
        while pos < stop {
            let Some((segment, file)) = log.segments.file_for(pos) else {
                drop(log);
                poison(inner, "flush", &io::Error::other("segment vanished"));
                return false;
            };
            let piece_end = stop.min(segment + size).min(pos + FLUSH_WRITE_MAX_BYTES);
            let mut buffer = file.alloc_dma_buffer((piece_end - pos) as usize);
            log.tail.copy_out(pos, buffer.as_bytes_mut());
            jobs.push((file, pos - segment, Rc::new(buffer)));
            pos = piece_end;
        }
    }
    // Only SYNC_FLUSH waits on fdatasync per group commit; ASYNC flushes are rare and large,
    // and carrying zeros would double what they write (idle-time zero-fill still runs).
    let zero_fill = match inner.config.flush_mode {
        FlushMode::Sync => zero_fill_job(inner, end, end - start),
        FlushMode::Async => None,
    };
    let zero_filled_to = zero_fill.as_ref().map(|(_, _, _, stop)| *stop);
    jobs.extend(zero_fill.map(|(file, pos, buffer, _)| (file, pos, buffer)));
    let mut synced: Vec<Rc<DmaFile>> = Vec::new();
    let writes_started = Instant::now();
    // The writes go to the disk together (the data and the zero-fill chunk ahead of it): a
    // virtio disk serves a few requests in parallel in about the time of one.
    let mut writes = Vec::with_capacity(jobs.len());
    for (file, pos, buffer) in jobs {
        let fault = take_fault(inner, true);
        if !synced.iter().any(|f| Rc::ptr_eq(f, &file)) {
            synced.push(file.clone());
        }
        writes.push(async move {
            match fault {
                Some(error) => Err(error),
                None => write_shared_buffer_at(&file, pos, buffer).await,
            }
        });
    }
    for result in join_all(writes).await {
        if let Err(error) = result {
            poison(inner, "commitlog write", &error);
            return false;
        }
    }
    let syncs_started = Instant::now();
    for file in synced {
        let result = match take_fault(inner, false) {
            Some(error) => Err(error),
            None => file.fdatasync().await.map_err(io_error),
        };
        if let Err(error) = result {
            poison(inner, "commitlog fdatasync", &error);
            return false;
        }
    }
    {
        let stats = &mut inner.log.borrow_mut().stats;
        stats.flush_write_micros += micros(syncs_started - writes_started);
        stats.flush_sync_micros += micros(syncs_started.elapsed());
    }
    mark_durable(inner, end, messages);
    if let Some(stop) = zero_filled_to {
        let mut log = inner.log.borrow_mut();
        let pos = log.flush.zero_fill_next.max(align_up(end, BLOCK_BYTES));
        log.flush.zero_fill_next = log.flush.zero_fill_next.max(stop);
        log.stats.zero_filled_bytes += stop.saturating_sub(pos);
    }
    true
}

/// The zero-fill chunk a flush of data ending at `end` carries along, if the zeroed margin
/// ahead of it is short: (file, position in file, zeroed buffer, commitlog offset it ends at).
/// The chunk stays inside the segment already created for the position (creating files is
/// left to idle-time zero-fill and to flushes of data).
fn zero_fill_job(
    inner: &Inner,
    end: u64,
    flushed_bytes: u64,
) -> Option<(Rc<DmaFile>, u64, Rc<DmaBuffer>, u64)> {
    let mut log = inner.log.borrow_mut();
    let data_end = align_up(end, BLOCK_BYTES);
    let pos = log.flush.zero_fill_next.max(data_end);
    if pos - data_end >= ZERO_FILL_AHEAD_MIN_BYTES {
        return None;
    }
    // As much as this flush writes (the margin keeps pace with the data), in a piece that
    // costs about what the data write costs, so the two finish together.
    let chunk = flushed_bytes
        .next_power_of_two()
        .clamp(ZERO_FILL_CARRIED_MIN_BYTES, ZERO_FILL_CHUNK_BYTES);
    let size = inner.config.segment_size_bytes;
    let stop = (pos + chunk)
        .min(align_down(pos, size) + size)
        .min(zero_fill_target(inner, end));
    if pos >= stop {
        return None;
    }
    let (segment, file) = log.segments.file_for(pos)?;
    let buffer = zeros(&mut log.flush, &file, stop - pos);
    Some((file, pos - segment, buffer, stop))
}

/// A zeroed DMA buffer of `len` bytes: a kept one for the usual sizes, else a new one.
fn zeros(flush: &mut FlushState, file: &DmaFile, len: u64) -> Rc<DmaBuffer> {
    let kept = len.is_power_of_two()
        && (ZERO_FILL_CARRIED_MIN_BYTES..=ZERO_FILL_CHUNK_BYTES).contains(&len);
    if let Some(buffer) = flush.zero_buffers.iter().find(|b| b.len() as u64 == len) {
        return buffer.clone();
    }
    let mut buffer = file.alloc_dma_buffer(len as usize);
    buffer.as_bytes_mut().fill(0);
    let buffer = Rc::new(buffer);
    if kept {
        flush.zero_buffers.push(buffer.clone());
    }
    buffer
}

fn mark_durable(inner: &Inner, end: u64, messages: u64) {
    let mut log = inner.log.borrow_mut();
    assert!(
        end >= log.flush.durable_end,
        "the durable end never goes backwards"
    );
    log.flush.durable_end = end;
    log.flush.last_flush_at = Instant::now();
    log.stats.flushes += 1;
    log.stats.flushed_messages += messages - log.flush.messages_at_last_flush;
    log.flush.messages_at_last_flush = messages;
    log.flush.dirty_since = (log.tail.end() > end).then(Instant::now);
    log.flush.wake_waiters_up_to(end);
    let keep_from = align_down(end, BLOCK_BYTES).saturating_sub(TAIL_READ_KEEP_BYTES);
    log.tail.drop_before(keep_from);
}

/// Runs `futures` together on this shard; their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut all_done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn store_io(error: StoreError) -> io::Error {
    match error {
        StoreError::Io(e) => e,
        StoreError::DiskFull(text) => os_error_with_context(libc::ENOSPC, text),
        other => io::Error::other(other.to_string()),
    }
}

/// Writes zeros over the next chunk of segment space ahead of the write position.
async fn zero_fill_step(inner: &Inner) {
    let (pos, stop) = {
        let log = inner.log.borrow();
        let end = log.tail.end();
        let pos = log.flush.zero_fill_next.max(align_up(end, BLOCK_BYTES));
        let size = inner.config.segment_size_bytes;
        let stop = (pos + ZERO_FILL_CHUNK_BYTES).min(align_down(pos, size) + size);
        (pos, stop.min(zero_fill_target(inner, end)))
    };
    if pos >= stop {
        return;
    }
    if let Err(error) = ensure_segments(inner, pos, stop).await {
        poison(inner, "creating a commitlog segment", &store_io(error));
        return;
    }
    let Some((segment, file)) = inner.log.borrow().segments.file_for(pos) else {
        return;
    };
    let buffer = zeros(&mut inner.log.borrow_mut().flush, &file, stop - pos);
    let written = write_shared_buffer_at(&file, pos - segment, buffer).await;
    let synced = match written {
        Ok(()) => file.fdatasync().await.map_err(io_error),
        Err(error) => Err(error),
    };
    if let Err(error) = synced {
        poison(inner, "commitlog zero-fill", &error);
        return;
    }
    let mut log = inner.log.borrow_mut();
    log.flush.zero_fill_next = log.flush.zero_fill_next.max(stop);
    log.stats.zero_filled_bytes += stop - pos;
}

/// Makes the consume queues durable up to the current end and records it in the checkpoint.
pub(crate) async fn checkpoint(inner: &Inner, clean: bool) -> bool {
    let (offset, queues, index) = {
        let log = inner.log.borrow();
        let index = inner.index.borrow().mark();
        (log.tail.end(), inner.queues.borrow().max_offsets(), index)
    };
    if inner.log.borrow().flush.durable_end < offset && !flush(inner).await {
        return false;
    }
    let paths = inner.queues.borrow_mut().take_dirty_paths();
    for path in paths {
        if let Err(error) = sync_file(&path).await {
            if error.kind() != io::ErrorKind::NotFound {
                poison(inner, "consume queue fdatasync", &error);
                return false;
            }
        }
    }
    if !sync_index(inner).await {
        return false;
    }
    let record = Checkpoint {
        commitlog_offset: offset,
        clean,
        queues,
        index: Some(index),
    };
    if let Err(error) = checkpoint::write(&inner.config.root_dir, &record).await {
        poison(inner, "checkpoint write", &error);
        return false;
    }
    let mut log = inner.log.borrow_mut();
    log.flush.last_checkpoint_at = Instant::now();
    log.flush.last_checkpoint_offset = offset;
    log.flush.checkpoint_wanted = false;
    log.stats.checkpoints += 1;
    true
}

/// Syncs the message index files written since the last checkpoint (and their directory
/// when files came or went). False when the store got poisoned.
async fn sync_index(inner: &Inner) -> bool {
    let (paths, dir) = inner.index.borrow_mut().take_dirty_paths();
    for path in paths {
        if let Err(error) = sync_file(&path).await {
            // A file the retention bound deleted meanwhile needs no sync.
            if error.kind() != io::ErrorKind::NotFound {
                poison(inner, "message index fdatasync", &error);
                return false;
            }
        }
    }
    if let Some(dir) = dir {
        if let Err(error) = super::segments::sync_dir(&dir).await {
            poison(inner, "message index directory fsync", &store_io(error));
            return false;
        }
    }
    true
}

/// fdatasync of a file by path (consume-queue files are written through memory maps).
pub(crate) async fn sync_file(path: &std::path::Path) -> io::Result<()> {
    let file = BufferedFile::open(path).await.map_err(io_error)?;
    let synced = file.fdatasync().await.map_err(io_error);
    file.close().await.map_err(io_error)?;
    synced
}

async fn exit(inner: &Inner) {
    let ok = flush(inner).await && checkpoint(inner, true).await;
    let files: Vec<_> = {
        let mut log = inner.log.borrow_mut();
        std::mem::take(&mut log.segments.files)
            .into_values()
            .collect()
    };
    for file in files {
        // A reader still holding the file closes it when it drops its reference.
        let _ = file.close_rc().await;
    }
    let mut log = inner.log.borrow_mut();
    let result = match (&log.poison, ok) {
        (Some(poison), _) => Err(poison.clone()),
        (None, true) => Ok(()),
        (None, false) => Err(Poison::Failed("final flush failed".to_string())),
    };
    log.flush.done = Some(result);
    log.flush.wake_everyone();
}

pub(crate) async fn wait_durable(inner: &Inner, end_offset: u64) -> Result<(), StoreError> {
    poll_fn(|cx| {
        let mut log = inner.log.borrow_mut();
        if let Some(poison) = &log.poison {
            return Poll::Ready(Err(poison.to_error()));
        }
        // An offset past the end can only be a caller's mistake; wait for the end instead.
        let target = end_offset.min(log.tail.end());
        if log.flush.durable_end >= target {
            return Poll::Ready(Ok(()));
        }
        if log.flush.done.is_some() {
            return Poll::Ready(Err(StoreError::Closed));
        }
        log.flush
            .waiters
            .entry(target)
            .or_default()
            .push(cx.waker().clone());
        Poll::Pending
    })
    .await
}

pub(crate) async fn close(inner: &Inner) -> Result<(), StoreError> {
    inner.log.borrow_mut().closing = true;
    inner.notify.signal();
    poll_fn(|cx| {
        let mut log = inner.log.borrow_mut();
        match &log.flush.done {
            Some(Ok(())) => Poll::Ready(Ok(())),
            Some(Err(poison)) => Poll::Ready(Err(poison.to_error())),
            None => {
                log.flush.close_waiters.push(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await
}
