//! The flusher: group commit, zero-fill ahead of the writes, and checkpoints.
//!
//! Commitlog files are written only through the store's own io_uring ring (`commit_ring.rs`),
//! in chains of three kinds, at most one of each in flight:
//! - a flush of data: the dirty range `[align_down(written_end), align_up(end))` (re-writing
//!   the partial last block), written straight from the tail's chunks (`Tail::flush_pieces`),
//!   one write per segment split at `FLUSH_WRITE_MAX_BYTES`. SYNC_FLUSH writes carry
//!   RWF_DSYNC: when the reaper (`reap`) collects the chain it sets `written_end =
//!   durable_end = end` and wakes every waiter at or below it. Because appends go on while a
//!   chain runs, the next flush carries all of them: that is the group commit.
//!   ASYNC_FLUSH writes are plain and move only `written_end`.
//! - ASYNC_FLUSH, a sync: an fdatasync of every segment file written since its last one
//!   (`unsynced_segments`), in a chain of its own beside the next flush of data, once the
//!   last one started `flush_interval_ms` ago, when somebody waits for durability
//!   (`wait_durable`), or when a flush must be durable (`flush`: checkpoints, close). It
//!   moves `durable_end` to what was written when it started. Why not RWF_DSYNC writes as
//!   under SYNC_FLUSH: over fallocated space each one commits the extents it converts to the
//!   journal, 186-296 MB/s of 4 MiB writes against 357-1,200 MB/s plain on this project's
//!   virtio disks (dd, alternated), and the async store met "bytes wait for the disk" at
//!   that rate; and why not an fdatasync at the end of a flush's chain: writes stopped while
//!   it ran (100-250 ms each).
//! - a zero-fill: `ZERO_FILL_CHUNK_BYTES` of zeros ahead of the write position, then an
//!   fdatasync, while the store is quiet. Data written over space that was written before
//!   makes a cheap durable write; over space only fallocated, every durable write also commits
//!   the extent conversion to the journal (a lone one ~2.5x dearer here, ARCHITECTURE §3).
//!   Under load none runs: beside SYNC_FLUSH writes the zeros cost more than they saved
//!   (`zero_fill_range`). A flush whose range reaches a zero-fill in flight waits for it (the
//!   zero-fill's end starts it), so zeros never land on data.
//!
//! Who starts a flush: the append itself (`kick`) when one is due (SYNC_FLUSH:
//! `SYNC_KICK_MIN_BYTES` dirty; ASYNC_FLUSH: `flush_dirty_max_bytes` dirty) and no flush is in
//! flight; the reaper when a chain ends and as much is due, so group commits follow one
//! another without waiting for a task to be scheduled; and the flusher task, which under
//! SYNC_FLUSH flushes anything dirty (one per store, spawned by `Store::open`; it holds only a
//! weak reference, so a store dropped without `close` stops it, which is what a crash leaves
//! behind for tests), each turn doing one thing in this order of priority:
//!
//! | Action | When |
//! |---|---|
//! | reset (empty the store, `reset.rs`) | `Store::reset_empty_at` asked for one (a flush under way gives up) |
//! | exit (final flush + clean checkpoint) | `close` was called (after allocation and segment creation in flight) |
//! | allocate (in a task of its own) | less than half the allocation window is left ahead of the appends (`space.rs`) |
//! | create a segment file ahead (in a task of its own) | one within `segments_prepared_ahead` of the allocation target is missing |
//! | checkpoint (take the counts and the dirty files here; wait for the flushes to make its offset durable, sync the files and write the record in a task of its own, one at a time) | when something changed and `checkpoint_due` (1 s apart with few queues; with thousands of dirty queue files synced ones up to 30 s or 2 GiB apart, light ones each second between), or when asked (delete_topic) |
//! | flush | Sync: anything dirty and no flush in flight (a segment file to create, a test delay); Async: dirty for `flush_interval_ms` |
//! | sync (Async) | written and not durable, none in flight, and `sync_due` |
//! | zero-fill one chunk | none in flight and one is due (`zero_fill_range`: nothing waits to be written and no flush for `ZERO_FILL_IDLE_MS`; up to the end of the next segment) |
//! | wait | for an append, a chain's end, a `wait_durable`, `close` or the next deadline |
//!
//! A store's pauses thus zero the space its next writes take, up to the end of the next
//! segment within the allocation window; a steady load that outruns that writes over
//! fallocated space (dearer durable writes, still correct, and cheaper than zeroing beside
//! them).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::io;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::runtime::fs::DirectFile;
use crate::runtime::wake::WakeReceiver;

use super::checkpoint::{self, Checkpoint};
use super::commit_ring::{ChainWrite, Slot, Zeros, CHAIN_ENTRIES_MAX};
use super::error::{is_resource_error, is_space_error, os_error_with_context, Poison};
use super::segments::{align_down, align_up, create_segment, BLOCK_BYTES};
use super::space::{
    FullCause, Space, ALLOCATION_PIECE_MIN_BYTES, ALLOCATION_RETRY_MS, FLUSH_RETRY_MS,
};
use super::tail::TailPiece;
use super::{
    disk_used_ratio, FlushMode, Inner, LogState, StoreError, TAIL_READ_KEEP_BYTES,
    TAIL_UNDURABLE_MAX_BYTES,
};

pub use crate::limits::FLUSH_DIRTY_BYTES_MAX;
pub use crate::limits::FLUSH_WRITE_MAX_BYTES;
/// SYNC_FLUSH: dirty bytes at which an append, or the end of the flush before, starts the
/// next flush at once. Less waits for the flusher task, which runs once the tasks ahead of it
/// give the executor back (a connection task hands it back when its client's requests read so
/// far are handled): a busy shard then commits what it handled, not each message. Started at
/// once, a fast device's flush (tmpfs: a copy) ended before the next message arrived, and one
/// shard ran 33,663 group commits a second of 3.8 messages each, at 7.5 µs of CPU a message
/// against 3.3 µs under ASYNC_FLUSH. A slow device's flush ends with more than this dirty, so
/// the next one starts at once as before.
pub const SYNC_KICK_MIN_BYTES: u64 = 64 << 10;
/// Zero-fill write size: one fdatasync (one journal commit of converted extents) per chunk.
pub const ZERO_FILL_CHUNK_BYTES: u64 = 4 << 20;
/// Time between checkpoints: the shortest between synced ones (consume queues synced, the
/// checkpoint written), and the time between light ones (`checkpoint.rs`), which bound the
/// recovery after a crash of the process; a synced checkpoint is due after it when
/// `checkpoint_due` says so.
pub const CHECKPOINT_INTERVAL_MS: u64 = 1000;
/// Longest time between synced checkpoints while anything changes.
pub const CHECKPOINT_INTERVAL_MAX_MS: u64 = 30_000;
/// Commitlog bytes a synced checkpoint waits for per dirty consume-queue file (between the
/// shortest and the longest interval). A synced checkpoint costs per dirty file: its syncfs
/// writes back a page of each, and each page the writeback cleaned takes a write fault on the
/// shard at the next unit stored through the map (ext4's page_mkwrite, ~13 µs with its mtime
/// update): at 80,000 written queues a shard, a checkpoint a second was 80,000 faults a
/// second and the write-back of 320 MB, and at 1,000 topics the disk took 10,000 small
/// writes a second. Recovery rebuilds units past the checkpoint from the commitlog, so the
/// queues' durability rides on the commitlog's (`Sync` sends wait for the commitlog only):
/// a rarer synced checkpoint costs only a longer recovery scan after a restart of the
/// machine, bounded by `CHECKPOINT_LOG_BYTES_MAX` (after a crash of the process, the light
/// checkpoints bound it to a second's worth).
pub const CHECKPOINT_LOG_BYTES_PER_DIRTY_FILE: u64 = 256 << 10;
/// Dirty consume-queue files a checkpoint syncs at no wait for the log (their faults cost
/// ~13 ms a second): up to this many, checkpoints stay synced and a second apart whatever
/// the load.
pub const CHECKPOINT_DIRTY_FILES_FREE: usize = 1024;
/// Commitlog bytes past the last synced checkpoint at which one is due whatever the dirty
/// files (after the shortest interval): what a recovery scan after a restart of the machine
/// reads at most, beside the longest interval's worth (RocketMQ's abnormal recovery reads
/// its last three 1 GiB commitlog files).
pub const CHECKPOINT_LOG_BYTES_MAX: u64 = 2 << 30;
/// A closing store whose writes find the disk full tries this many more times
/// (`FLUSH_RETRY_MS` apart) before it reports that the final flush failed.
pub const CLOSE_FLUSH_RETRIES_MAX: u32 = 10;
/// The reaper looks at the ring at least this often, wake-up byte or not.
const REAP_FALLBACK_MS: u64 = 50;
/// A checkpoint with more dirty consume-queue and index files than this syncs them with one
/// syncfs(2) of the store's filesystem instead of one fdatasync each.
pub const SYNCFS_FILES_MIN: usize = 16;
/// Zero-filling waits until no flush has run for this long.
pub const ZERO_FILL_IDLE_MS: u64 = 20;

/// Writes one flush of data hands the ring at most: its chain's entries less the wake-up send
/// and an injected fdatasync failure's stand-in. Binds only when the dirty range spans more
/// segments than that (small segments, or a replica's batch of many records): the flush
/// then ends at the last write that fits and the next one goes on from there.
const FLUSH_CHAIN_WRITES_MAX: usize = CHAIN_ENTRIES_MAX - 2;

/// ASYNC_FLUSH: segment files written and not synced past which they are synced whatever the
/// interval, and no flush writes to another one before (small segments; a sync chain takes
/// an fdatasync per file and the wake-up send).
const UNSYNCED_SEGMENTS_MAX: usize = 8;
const _: () = assert!(UNSYNCED_SEGMENTS_MAX < CHAIN_ENTRIES_MAX);

/// ASYNC_FLUSH: bytes written and not yet durable that make a sync due at once: a quarter of
/// what appends may run ahead of the durable end, so syncs keep the appends going.
const SYNC_AFTER_BYTES: u64 = TAIL_UNDURABLE_MAX_BYTES / 4;

const _: () = assert!(FLUSH_CHAIN_WRITES_MAX >= 2);
const _: () = assert!(FLUSH_WRITE_MAX_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(ZERO_FILL_CHUNK_BYTES.is_multiple_of(BLOCK_BYTES));

/// A disk failure to simulate on the next commitlog write or fdatasync (fault-injection hook).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// The next write fails with this errno (e.g. libc::EIO, libc::ENOSPC).
    WriteError { errno: i32 },
    /// The next fdatasync (for a flush of data: the sync part of its durable write) fails
    /// with this errno.
    FdatasyncError { errno: i32 },
}

/// Flush bookkeeping, inside the store's `LogState`.
pub(crate) struct FlushState {
    /// Everything below this commitlog offset is written and durable.
    pub(crate) durable_end: u64,
    /// Everything below this commitlog offset is written to its segment file (at or past
    /// `durable_end`; the same under SYNC_FLUSH, whose writes are durable): the tail may let
    /// go of those bytes, and the next flush starts at its block.
    pub(crate) written_end: u64,
    /// ASYNC_FLUSH: the segments (by start offset) written since their last fdatasync, each
    /// with the number of the last flush that wrote it.
    unsynced_segments: BTreeMap<u64, u64>,
    /// Flushes of data handed to the ring so far (their numbers).
    data_chains: u64,
    /// ASYNC_FLUSH: when the last sync chain was started.
    last_sync_at: Instant,
    /// ASYNC_FLUSH: the sync chain in flight: it makes durable what was written below this
    /// end, by the flushes numbered up to this one.
    sync_in_flight: Option<(u64, u64)>,
    /// `wait_durable` callers by the offset they wait for.
    waiters: BTreeMap<u64, Vec<Waker>>,
    /// `wait_written` callers by the offset they wait for (an ASYNC_FLUSH write is due at
    /// once while there are any).
    written_waiters: BTreeMap<u64, Vec<Waker>>,
    close_waiters: Vec<Waker>,
    /// When the oldest unflushed append happened (Async deadline).
    dirty_since: Option<Instant>,
    pub(crate) checkpoint_wanted: bool,
    /// Every record below this commitlog offset has its consume-queue unit counted by the
    /// synced checkpoint on disk: its offset, or the first unit of a queue that still awaited
    /// its files (`awaiting_from`), whichever is lower. Retention deletes no segment past it
    /// (retention.rs): after a power loss recovery starts from that checkpoint, and a unit it
    /// does not count, of a record retention took, could be neither trusted nor rebuilt.
    pub(crate) synced_covers: u64,
    /// A checkpoint failed for want of resources (a full disk) since the last synced one:
    /// retention then deletes past `synced_covers` rather than keep a full disk full.
    pub(crate) checkpoints_failing: bool,
    /// A checkpoint task is under way (it runs beside the flusher's loop: its sync of
    /// thousands of consume-queue files must not hold up allocation and flushes).
    pub(crate) checkpoint_running: bool,
    /// A segment file is being created ahead of the writes (`prepare_segment`).
    segment_preparing: bool,
    /// Allocation runs in a task of its own (`Action::Allocate`).
    allocating: bool,
    /// The helper thread is making files of new consume queues (queue_files.rs).
    pub(crate) queue_files_making: bool,
    /// Queues about to be settled are being looked into off the shard (queue_files.rs);
    /// while queues wait to be settled no checkpoint is written (`Settle` in
    /// consume_queue.rs).
    pub(crate) queue_settle_job: bool,
    /// Creating a segment ahead failed for want of resources: not tried again before this.
    segment_retry_at: Option<Instant>,
    /// The last checkpoint of either kind (light ones see `checkpoint.rs`).
    last_checkpoint_at: Instant,
    last_checkpoint_offset: u64,
    /// The last synced checkpoint.
    last_synced_at: Instant,
    last_synced_offset: u64,
    /// Queue or index files may hold units that no dirty path lists and no sync reached (the
    /// store opened on a light checkpoint): the next synced checkpoint syncs the whole
    /// filesystem.
    syncfs_next: bool,
    /// When the last flush of data finished (Async zero-fill waits for a quiet spell).
    last_flush_at: Instant,
    /// Commitlog offset up to which segment space has been zero-filled ahead of writes.
    zero_fill_next: u64,
    /// `ZERO_FILL_CHUNK_BYTES` of zeros, written again and again by zero-fill.
    zero_buffer: Option<Rc<Zeros>>,
    messages_at_last_flush: u64,
    pub(crate) fault: Option<InjectedFault>,
    /// Test hook: every flush of dirty data waits this long first, as a slow disk would.
    pub(crate) test_flush_delay: Option<Duration>,
    /// When the flush under way started (None between flushes): how long the disk has kept
    /// the appends since it waiting, which the broker's overload check reads.
    pub(crate) flush_started_at: Option<Instant>,
    /// The flush of data in flight.
    data_in_flight: Option<DataChain>,
    /// The zero-fill in flight: `[pos, stop)`.
    zero_in_flight: Option<(u64, u64)>,
    /// Woken when a chain ends (and when the store is poisoned).
    chain_waiters: Vec<Waker>,
    /// Chains ended (reaped) so far, per `Slot`.
    chains_ended: [u64; 3],
    /// The flusher has exited (after `close`); the result `close` reports.
    done: Option<Result<(), Poison>>,
    /// A zero-fill failed for want of resources: not tried again before this.
    zero_fill_retry_at: Option<Instant>,
    /// Files a failed checkpoint did not sync (synced first by the next one).
    unsynced_paths: Vec<std::path::PathBuf>,
    unsynced_dir: Option<std::path::PathBuf>,
    /// Repeated resource failures (a full disk, no descriptors) are logged at this rate.
    trouble_log: crate::throttle::LogThrottle,
}

/// A flush of data handed to the commitlog ring.
#[derive(Clone, Copy)]
struct DataChain {
    /// What it writes ends here...
    end: u64,
    /// ...with this many messages appended by then.
    messages: u64,
}

impl FlushState {
    /// Files a checkpoint took and did not sync (it failed, or gave up) stay for the next
    /// one, beside any an earlier one left: a light checkpoint takes none of those, and its
    /// failure must not drop them.
    fn keep_unsynced(&mut self, paths: Vec<std::path::PathBuf>, dir: Option<std::path::PathBuf>) {
        self.unsynced_paths.extend(paths);
        if self.unsynced_dir.is_none() {
            self.unsynced_dir = dir;
        }
    }

    /// `unsynced_files`: recovery left written files unsynced and wrote a light checkpoint
    /// (`Recovered::unsynced_files`): the first synced checkpoint syncs the whole filesystem
    /// (`syncfs_next`), and it is due at once.
    /// `synced_covers`: what the synced checkpoint on disk covers (`checkpoint::synced_covers`).
    pub(crate) fn new(
        durable_end: u64,
        zero_fill_next: u64,
        unsynced_files: bool,
        synced_covers: u64,
    ) -> FlushState {
        FlushState {
            durable_end,
            written_end: durable_end,
            unsynced_segments: BTreeMap::new(),
            data_chains: 0,
            last_sync_at: Instant::now(),
            sync_in_flight: None,
            waiters: BTreeMap::new(),
            written_waiters: BTreeMap::new(),
            close_waiters: Vec::new(),
            dirty_since: None,
            checkpoint_wanted: unsynced_files,
            synced_covers,
            checkpoints_failing: false,
            checkpoint_running: false,
            segment_preparing: false,
            allocating: false,
            queue_files_making: false,
            queue_settle_job: false,
            segment_retry_at: None,
            last_checkpoint_at: Instant::now(),
            last_checkpoint_offset: durable_end,
            last_synced_at: Instant::now(),
            last_synced_offset: durable_end,
            syncfs_next: unsynced_files,
            // As if the last flush were long past: a fresh store zero-fills at once.
            last_flush_at: Instant::now()
                .checked_sub(Duration::from_millis(ZERO_FILL_IDLE_MS))
                .unwrap_or_else(Instant::now),
            zero_fill_next,
            zero_buffer: None,
            messages_at_last_flush: 0,
            fault: None,
            test_flush_delay: None,
            flush_started_at: None,
            data_in_flight: None,
            zero_in_flight: None,
            chain_waiters: Vec::new(),
            chains_ended: [0; 3],
            done: None,
            zero_fill_retry_at: None,
            unsynced_paths: Vec::new(),
            unsynced_dir: None,
            trouble_log: crate::throttle::LogThrottle::default(),
        }
    }

    /// Records an append ending at `end`; true when a flush may be due (`kick` decides) or
    /// the flusher task must learn of it (the Async deadline starts).
    pub(crate) fn note_append(&mut self, mode: FlushMode, end: u64, dirty_max_bytes: u64) -> bool {
        match mode {
            FlushMode::Sync => true,
            FlushMode::Async => {
                let first_dirty = self.dirty_since.is_none();
                if first_dirty {
                    self.dirty_since = Some(Instant::now());
                }
                first_dirty || end - self.written_end >= dirty_max_bytes
            }
        }
    }

    /// A store that never held anything starts its log at `offset` (`Store::start_empty_at`):
    /// everything below it counts as durable, and zero-fill goes on from there (zeros already
    /// written past it stay valid). No flush can be in flight: nothing was ever dirty.
    pub(crate) fn start_at(&mut self, offset: u64) {
        assert!(
            self.data_in_flight.is_none() && offset >= self.durable_end,
            "an empty log moves its start forward, with no flush in flight"
        );
        self.durable_end = offset;
        self.written_end = offset;
        self.zero_fill_next = self.zero_fill_next.max(offset);
        self.dirty_since = None;
        self.checkpoint_wanted = true;
    }

    /// A store emptied in process starts again at `offset` (`reset.rs`), below or above the
    /// old end: nothing is dirty, the new segment files are holes (zero-fill starts at
    /// `offset`), the checkpoint is due, and every `wait_durable` returns (what it waited
    /// for is gone). `messages`: the appends counted so far. No chain may be in flight.
    pub(crate) fn reset_to(&mut self, offset: u64, messages: u64) {
        assert!(
            self.data_in_flight.is_none()
                && self.zero_in_flight.is_none()
                && self.sync_in_flight.is_none(),
            "a reset waits for the chains in flight"
        );
        assert!(
            offset.is_multiple_of(BLOCK_BYTES),
            "a reset offset starts a segment"
        );
        self.durable_end = offset;
        self.written_end = offset;
        // Files that are gone.
        self.unsynced_segments.clear();
        self.zero_fill_next = offset;
        self.zero_fill_retry_at = None;
        self.dirty_since = None;
        self.flush_started_at = None;
        self.messages_at_last_flush = messages;
        self.checkpoint_wanted = true;
        // Paths of files that are gone, or that a new file of the same name took.
        self.unsynced_paths.clear();
        self.unsynced_dir = None;
        self.wake_all_waiters();
    }

    fn wake_waiters_up_to(&mut self, end: u64) {
        wake_up_to(&mut self.waiters, end);
    }

    fn wake_written_waiters_up_to(&mut self, end: u64) {
        wake_up_to(&mut self.written_waiters, end);
    }

    /// Wakes every `wait_durable` and `wait_written` caller.
    fn wake_all_waiters(&mut self) {
        self.wake_waiters_up_to(u64::MAX);
        self.wake_written_waiters_up_to(u64::MAX);
    }

    fn wake_everyone(&mut self) {
        self.wake_all_waiters();
        for waker in self.close_waiters.drain(..) {
            waker.wake();
        }
        self.wake_chain_waiters();
    }

    fn wake_chain_waiters(&mut self) {
        for waker in self.chain_waiters.drain(..) {
            waker.wake();
        }
    }
}

/// Wakes the waiters of `waiters` for offsets up to `end`.
fn wake_up_to(waiters: &mut BTreeMap<u64, Vec<Waker>>, end: u64) {
    let later = waiters.split_off(&end.saturating_add(1));
    for waker in std::mem::replace(waiters, later).into_values().flatten() {
        waker.wake();
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

    pub(crate) fn wait(&self) -> impl Future<Output = ()> + '_ {
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
    Reset,
    Exit,
    Allocate,
    /// Create the segment file that starts here, in a task of its own (`prepare_segment`).
    PrepareSegment {
        start: u64,
    },
    /// Write what is dirty; make it durable too when `durable`.
    Flush {
        durable: bool,
    },
    /// ASYNC_FLUSH: sync what is written.
    Sync,
    /// A synced checkpoint, or a light one (`checkpoint.rs`).
    Checkpoint {
        synced: bool,
    },
    ZeroFill,
    Wait(Option<Duration>),
}

pub(crate) fn spawn(inner: &Rc<Inner>, wake_rx: WakeReceiver) {
    let weak = Rc::downgrade(inner);
    let notify = inner.notify.clone();
    crate::runtime::spawn_detached(run(weak.clone(), notify));
    crate::runtime::spawn_detached(reaper(weak, wake_rx));
}

/// Reads the wake-up bytes the commitlog ring's chains end with and reaps them. Ends when the
/// store is gone (the ring's end of the socket pair closes with it). While a chain is in
/// flight it also reaps every `REAP_FALLBACK_MS` without a wake-up, so that a lost wake-up
/// byte cannot leave a chain unreaped; with nothing in flight it sleeps until a byte or the
/// next submission (`note_submitted`): an idle store makes no wake-ups.
async fn reaper(weak: Weak<Inner>, mut wake_rx: WakeReceiver) {
    let mut bytes = [0u8; 4096];
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let in_flight = inner.log.borrow().ring.any_busy();
        let submitted = inner.reaper.clone();
        drop(inner);
        submitted.idle.set(!in_flight);
        let read = async { Some(wake_rx.read_some(&mut bytes).await) };
        let woken = if in_flight {
            futures_lite::future::or(read, async {
                crate::runtime::sleep(Duration::from_millis(REAP_FALLBACK_MS)).await;
                None
            })
            .await
        } else {
            futures_lite::future::or(read, async {
                submitted.notify.wait().await;
                None
            })
            .await
        };
        submitted.idle.set(false);
        match woken {
            // The ring (and its end of the pair) went with the store.
            Some(Ok(0)) => return,
            Some(Err(error)) => {
                log::warn!("store: reading the commitlog ring's wake-ups: {error}");
                crate::runtime::sleep(Duration::from_millis(REAP_FALLBACK_MS)).await;
            }
            _ => {}
        }
        let Some(inner) = weak.upgrade() else { return };
        reap(&inner);
    }
}

/// The reaper's state as submitters see it.
#[derive(Default)]
pub(crate) struct ReaperState {
    /// The reaper waits with nothing in flight (no fallback timer armed).
    idle: Cell<bool>,
    notify: Notify,
}

/// A chain was just submitted: an idle reaper arms its fallback timer (one wake-up, and none
/// at all under load, when the reaper is already watching).
fn note_submitted(inner: &Inner) {
    if inner.reaper.idle.get() {
        inner.reaper.notify.signal();
    }
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
                        futures_lite::future::or(notify.wait(), crate::runtime::sleep(t)).await
                    }
                    None => notify.wait().await,
                }
                continue;
            }
            action => action,
        };
        let Some(inner) = weak.upgrade() else { return };
        match ran {
            Action::Reset => super::reset::run(&inner).await,
            Action::Exit => return exit(&inner).await,
            Action::Allocate => {
                // Beside the loop: a fallocate took up to 0.3 s under a busy journal, and
                // flushes go on meanwhile.
                inner.log.borrow_mut().flush.allocating = true;
                let inner = Rc::clone(&inner);
                crate::runtime::spawn_detached(async move {
                    allocate_ahead(&inner).await;
                    inner.log.borrow_mut().flush.allocating = false;
                    inner.notify.signal();
                });
            }
            Action::PrepareSegment { start } => prepare_segment(&inner, start),
            Action::Flush { durable } => {
                flush_to(&inner, durable).await;
            }
            Action::Sync => {
                start_sync(&inner, false);
            }
            Action::Checkpoint { synced } => {
                // The taking of the counts and of the dirty files here; the wait for the log
                // to be durable up to the checkpoint's offset, the files' sync (a syncfs of
                // thousands of queue files can take a second) and the write in a task of their
                // own, so that allocation and flushes go on meanwhile. The loop used to flush
                // up to the offset itself: under SYNC_FLUSH load that took it 150-200 ms a
                // checkpoint, in which no allocation was started, and sends ran into the end
                // of the allocated space ("space is being prepared"). The task holds the store
                // only weakly: a store dropped meanwhile (a crash, in tests) is not kept.
                let Some(plan) = plan_checkpoint(&inner, false, synced, false).await else {
                    continue;
                };
                inner.log.borrow_mut().flush.checkpoint_running = true;
                let (root, weak) = (inner.config.root_dir.clone(), Rc::downgrade(&inner));
                crate::runtime::spawn_detached(async move {
                    let offset = plan.record.commitlog_offset;
                    if !durable_through(&weak, offset).await {
                        // Given up (closing, a reset, a failed store): the files it took stay
                        // to be synced by the next checkpoint.
                        if let Some(inner) = weak.upgrade() {
                            let mut log = inner.log.borrow_mut();
                            log.flush.keep_unsynced(plan.paths, plan.dir);
                            log.flush.checkpoint_running = false;
                            drop(log);
                            inner.notify.signal();
                        }
                        return;
                    }
                    let outcome = write_checkpoint(root, plan).await;
                    if let Some(inner) = weak.upgrade() {
                        checkpoint_done(&inner, outcome);
                        inner.log.borrow_mut().flush.checkpoint_running = false;
                        inner.notify.signal();
                    }
                });
            }
            Action::ZeroFill => zero_fill_step(&inner).await,
            Action::Wait(_) => {}
        }
    }
}

fn next_action(inner: &Inner) -> Action {
    let log = inner.log.borrow();
    let flush = &log.flush;
    // Before the exit: a reset asked for before `close` is done first (it refuses to start
    // after it). Both wait for allocation, for a segment file being created ahead and for
    // files of new queues being made (their end wakes the loop).
    if log.reset.is_some() || log.closing {
        let queue_jobs = flush.queue_files_making || flush.queue_settle_job;
        return if flush.segment_preparing || flush.allocating || queue_jobs {
            Action::Wait(None)
        } else if log.reset.is_some() {
            Action::Reset
        } else {
            Action::Exit
        };
    }
    if log.poison.is_some() {
        return Action::Wait(None);
    }
    let now = Instant::now();
    let end = log.tail.end();
    let mut deadlines = Vec::new();
    // Space first: appends stop at the allocated end (space.rs).
    let size = inner.config.segment_size_bytes;
    if !flush.allocating && log.space.allocation_due(end, size, now) {
        return Action::Allocate;
    }
    deadlines.extend(log.space.allocation_retry_at.filter(|at| *at > now));
    let segment_waits = flush.segment_retry_at.filter(|at| *at > now);
    deadlines.extend(segment_waits);
    if !flush.segment_preparing && segment_waits.is_none() {
        if let Some(start) = segment_to_prepare(&log, end, size) {
            return Action::PrepareSegment { start };
        }
    }
    // Checkpoints come before flushes (a checkpoint flushes first): under constant Sync load
    // the log is always dirty, and recovery work must stay bounded all the same. A checkpoint
    // runs as a task of its own, so the loop goes on allocating and flushing meanwhile (its
    // syncfs of thousands of queue files took a second, and sends met "space is being
    // prepared" while it ran).
    // A synced checkpoint is spaced by the queue files it syncs (`checkpoint_due`); between
    // two, a light one each `CHECKPOINT_INTERVAL_MS` keeps a crash's recovery short.
    let changed = end != flush.last_synced_offset || flush.checkpoint_wanted;
    // Queues taken from a synced checkpoint's catalog and not yet settled: the synced
    // checkpoint and its catalog must stay what a crash recovers from (`Settle`).
    let settling = flush.queue_settle_job || inner.queues.borrow().queues_to_settle() > 0;
    if changed && !flush.checkpoint_running && !settling {
        if flush.checkpoint_wanted {
            return Action::Checkpoint { synced: true };
        }
        let since = now.saturating_duration_since(flush.last_synced_at);
        let log_bytes = end.saturating_sub(flush.last_synced_offset);
        let dirty_files = inner.queues.borrow().dirty_files();
        match checkpoint_due(since, log_bytes, dirty_files) {
            Ok(()) => return Action::Checkpoint { synced: true },
            Err(wait) => deadlines.push(now + wait),
        }
        if end != flush.last_checkpoint_offset && checkpoint::boot_id().is_some() {
            let light_at = flush.last_checkpoint_at + Duration::from_millis(CHECKPOINT_INTERVAL_MS);
            if now >= light_at {
                return Action::Checkpoint { synced: false };
            }
            deadlines.push(light_at);
        }
    }
    // A flush in flight or held up by a zero-fill is started again by the reaper.
    let flush_free = !log.ring.busy(Slot::Data) && flush.zero_in_flight.is_none();
    let flush_waits = log.space.flush_retry_at.filter(|at| *at > now);
    deadlines.extend(flush_waits);
    if end > flush.durable_end && flush_free && flush_waits.is_none() {
        match inner.config.flush_mode {
            FlushMode::Sync => return Action::Flush { durable: true },
            FlushMode::Async => {
                let interval = Duration::from_millis(inner.config.flush_interval_ms);
                let since = flush.dirty_since.unwrap_or(now);
                if end > flush.written_end {
                    // Dirty for a whole interval (a light load): written and synced now, so
                    // an append is durable within the interval; a batch is only written.
                    if now >= since + interval {
                        return Action::Flush { durable: true };
                    }
                    if flush_due(inner, &log) {
                        return Action::Flush { durable: false };
                    }
                    deadlines.push(since + interval);
                }
            }
        }
    }
    // ASYNC_FLUSH: what is written becomes durable within the interval.
    if flush.written_end > flush.durable_end && !log.ring.busy(Slot::Sync) {
        if sync_due(inner, flush, now) {
            return Action::Sync;
        }
        deadlines.push(flush.last_sync_at + Duration::from_millis(inner.config.flush_interval_ms));
    }
    let zero_fill_waits = flush.zero_fill_retry_at.filter(|at| *at > now);
    deadlines.extend(zero_fill_waits);
    if !log.ring.busy(Slot::ZeroFill)
        && zero_fill_waits.is_none()
        && zero_fill_range(inner, &log).is_some()
    {
        if quiet(&log, now) {
            return Action::ZeroFill;
        }
        // A dirty log is no quiet spell whatever the time: its flush's end wakes the loop.
        if end == flush.written_end {
            deadlines.push(flush.last_flush_at + Duration::from_millis(ZERO_FILL_IDLE_MS));
        }
    }
    Action::Wait(
        deadlines
            .into_iter()
            .min()
            .map(|d| d.saturating_duration_since(now)),
    )
}

/// Whether a checkpoint is due `since` the last one with `log_bytes` appended meanwhile and
/// `dirty_files` consume-queue files to sync: Ok, or Err with the longest wait until it is
/// (more appends may make it due sooner; the flusher looks again when it wakes). Due once the
/// shortest interval has passed and the log has grown by `CHECKPOINT_LOG_BYTES_PER_DIRTY_FILE`
/// per dirty file past `CHECKPOINT_DIRTY_FILES_FREE` or by `CHECKPOINT_LOG_BYTES_MAX`, and
/// always after the longest interval. Up to a thousand written queue files keep the checkpoint
/// a second; 80,000 take it every few seconds at full rate.
pub(crate) fn checkpoint_due(
    since: Duration,
    log_bytes: u64,
    dirty_files: usize,
) -> Result<(), Duration> {
    let shortest = Duration::from_millis(CHECKPOINT_INTERVAL_MS);
    let longest = Duration::from_millis(CHECKPOINT_INTERVAL_MAX_MS);
    if since < shortest {
        return Err(shortest - since);
    }
    let wanted_bytes = (dirty_files.saturating_sub(CHECKPOINT_DIRTY_FILES_FREE) as u64)
        .saturating_mul(CHECKPOINT_LOG_BYTES_PER_DIRTY_FILE)
        .min(CHECKPOINT_LOG_BYTES_MAX);
    if log_bytes >= wanted_bytes || since >= longest {
        return Ok(());
    }
    Err(longest - since)
}

/// Quiet zero-filling aims at the end of the segment after the one being written, but covers
/// only allocated space (the window ahead of the writes, `space.rs`): an idle store's disk use
/// is its data plus the window.
fn zero_fill_target(inner: &Inner, log: &LogState, end: u64) -> u64 {
    let size = inner.config.segment_size_bytes;
    (align_down(end, size) + 2 * size).min(align_down(log.space.allocated_end, BLOCK_BYTES))
}

/// Nothing waits to be written and no flush of data has ended for `ZERO_FILL_IDLE_MS`:
/// zero-fill may go anywhere ahead. Between the flushes of a steady ASYNC_FLUSH load (a
/// `flush_dirty_max_bytes` write every few tens of milliseconds) the log is dirty, so that
/// load is not taken for a quiet store: zeros written there doubled the bytes the disk took.
fn quiet(log: &LogState, now: Instant) -> bool {
    log.tail.end() == log.flush.written_end
        && now >= log.flush.last_flush_at + Duration::from_millis(ZERO_FILL_IDLE_MS)
}

/// The next zero-fill chunk, `[pos, stop)` inside one segment, for a quiet store (either
/// mode): from the write position up to the end of the next segment. None under load: zeros
/// written beside a steady load double the bytes the disk takes and hold up its writes.
/// Under ASYNC_FLUSH the durable writes are few and large. Under SYNC_FLUSH each durable
/// write over space only fallocated also commits its extent conversion to the journal
/// (a lone 128 KiB one: 711 µs against 277 µs over written space on this project's VM). Yet
/// zeros paced with the writes in the next segment ran SYNC load at 0.60-0.75 of the
/// throughput without them, with a p99 of 25-35 ms against 5-6 ms (docs/performance.md).
fn zero_fill_range(inner: &Inner, log: &LogState) -> Option<(u64, u64)> {
    let end = log.tail.end();
    let size = inner.config.segment_size_bytes;
    let target = zero_fill_target(inner, log, end);
    let mut pos = log.flush.zero_fill_next.max(align_up(end, BLOCK_BYTES));
    // A recycled segment's blocks were all written in its earlier life: zeros gain nothing.
    while log.segments.sealed_at(pos) && pos < target {
        pos = align_down(pos, size) + size;
    }
    let stop = (pos + ZERO_FILL_CHUNK_BYTES)
        .min(align_down(pos, size) + size)
        .min(target);
    assert!(
        pos.is_multiple_of(BLOCK_BYTES) && stop.is_multiple_of(BLOCK_BYTES),
        "zero-fill writes whole blocks"
    );
    (pos < stop).then_some((pos, stop))
}

/// A failure of `context`: a shortage of resources is logged (throttled) and left for the
/// caller's retry; anything else poisons the store. True when it poisoned.
fn fail(inner: &Inner, context: &str, error: &io::Error) -> bool {
    if !is_resource_error(error) {
        poison(inner, context, error);
        return true;
    }
    let mut log = inner.log.borrow_mut();
    if let Some(left_out) = log.flush.trouble_log.allow(Instant::now()) {
        log::warn!(
            "store {}: {context}: {error}; trying again later{}",
            inner.config.root_dir.display(),
            crate::throttle::LogThrottle::repeats(left_out)
        );
    }
    false
}

pub(crate) fn poison(inner: &Inner, context: &str, error: &io::Error) {
    let poison = Poison::from_io(context, error);
    log::error!("store {}: {poison:?}", inner.config.root_dir.display());
    let mut log = inner.log.borrow_mut();
    if log.poison.is_none() {
        log.poison = Some(poison);
    }
    log.flush.flush_started_at = None;
    log.flush.wake_everyone();
}

/// Allocates segment space up to the window ahead of the write position (`space.rs`),
/// creating segment files on the way. Short of space, it takes what the disk still has in
/// pieces down to `ALLOCATION_PIECE_MIN_BYTES`, then marks the store full and waits
/// `ALLOCATION_RETRY_MS`; success clears that. Other failures poison the store.
pub(crate) async fn allocate_ahead(inner: &Inner) {
    let size = inner.config.segment_size_bytes;
    let (target, resets) = {
        let log = inner.log.borrow();
        (log.space.target(log.tail.end(), size), log.resets)
    };
    loop {
        let from = inner.log.borrow().space.allocated_end;
        if from >= target {
            break;
        }
        let segment = align_down(from, size);
        let mut stop = target.min(segment + size);
        let result = loop {
            match allocate_in_segment(inner, segment, stop, resets).await {
                Err(error)
                    if is_space_error(&error) && stop - from > ALLOCATION_PIECE_MIN_BYTES =>
                {
                    stop = from
                        + align_down((stop - from) / 2, BLOCK_BYTES)
                            .max(ALLOCATION_PIECE_MIN_BYTES);
                }
                other => break other,
            }
        };
        if inner.log.borrow().resets != resets {
            // The store was emptied meanwhile (`start_empty_at` allocates beside the
            // flusher, which runs resets): this space lies in files that are gone.
            return;
        }
        if let Err(error) = result {
            allocation_failed(inner, from, &error);
            return;
        }
        let mut log = inner.log.borrow_mut();
        log.space.allocated_end = log.space.allocated_end.max(stop);
    }
    let mut log = inner.log.borrow_mut();
    log.space.allocation_retry_at = None;
    if log.space.clear(FullCause::Allocation) {
        log::warn!(
            "store {}: commitlog space allocated again; sends resume",
            inner.config.root_dir.display()
        );
    }
}

/// The first segment file missing from the one `end` lies in up to `segments_prepared_ahead`
/// after the segment that allocation aims into (`Space::target`): created ahead by
/// `prepare_segment`, that many segments of appends before allocation needs them.
fn segment_to_prepare(log: &LogState, end: u64, size: u64) -> Option<u64> {
    let first = align_down(end, size).max(log.min_physical_offset);
    let last = align_down(log.space.target(end, size), size) + segments_prepared_ahead(size) * size;
    (first..=last)
        .step_by(size as usize)
        .find(|segment| log.segments.file_for(*segment).is_none())
}

/// Commitlog bytes whose segment files are created ahead of the one allocation aims into
/// (`segment_to_prepare`): ~20 s of a shard's appends at 100 MB/s. A directory's sync waited
/// up to 20 s for the journal with 160,000 written queue files on this project's VMs.
const SEGMENTS_PREPARED_AHEAD_BYTES: u64 = 2 << 30;
/// Segment files created ahead, at least and at most (sparse: they hold no blocks until
/// allocation reaches them; recovery removes those past the next one).
const SEGMENTS_PREPARED_AHEAD_MIN: u64 = 2;
const SEGMENTS_PREPARED_AHEAD_MAX: u64 = 8;

/// Segment files created ahead of the one allocation aims into, for `size`-byte segments.
fn segments_prepared_ahead(size: u64) -> u64 {
    (SEGMENTS_PREPARED_AHEAD_BYTES / size)
        .clamp(SEGMENTS_PREPARED_AHEAD_MIN, SEGMENTS_PREPARED_AHEAD_MAX)
}

/// Creates the segment file starting at `start` in a task of its own, before allocation
/// needs it. Creating a file syncs its directory, and that waits for the journal to commit
/// everything before it: with 160,000 written consume-queue files that took 2.6-20 s here,
/// and when allocation made it, every append past the allocated end waited. Allocation then
/// only fallocates inside the file. A failure is left to allocation, which meets it again
/// and reports it; this tries again after `ALLOCATION_RETRY_MS`.
fn prepare_segment(inner: &Rc<Inner>, start: u64) {
    inner.log.borrow_mut().flush.segment_preparing = true;
    let inner = Rc::clone(inner);
    crate::runtime::spawn_detached(async move {
        let result = ensure_segments(&inner, start, start + 1).await;
        let mut log = inner.log.borrow_mut();
        log.flush.segment_preparing = false;
        if let Err(error) = result {
            log::debug!(
                "store {}: creating segment {start} ahead: {error}",
                inner.config.root_dir.display()
            );
            log.flush.segment_retry_at =
                Some(Instant::now() + Space::retry_delay(ALLOCATION_RETRY_MS));
        }
        drop(log);
        inner.notify.signal();
    });
}

/// Makes `[segment, stop)` of a segment file allocated, creating the file if needed; does
/// nothing once the store was emptied since `resets` (`LogState::resets`).
async fn allocate_in_segment(
    inner: &Inner,
    segment: u64,
    stop: u64,
    resets: u64,
) -> io::Result<()> {
    let size = inner.config.segment_size_bytes;
    if segment < inner.log.borrow().min_physical_offset {
        // The log's start moved past it while allocation was under way (`start_empty_at`).
        return Ok(());
    }
    ensure_segments(inner, segment, segment + 1)
        .await
        .map_err(store_io)?;
    if inner.log.borrow().resets != resets {
        return Ok(());
    }
    let file = inner
        .log
        .borrow()
        .segments
        .file_for(segment)
        .map(|(_, f)| f);
    let Some(file) = file else {
        return Err(io::Error::other("segment file vanished"));
    };
    debug_assert!(stop - segment <= size);
    file.allocate(stop - segment).await.map(|_| ())
}

fn allocation_failed(inner: &Inner, from: u64, error: &io::Error) {
    let context = format!("allocating commitlog space at offset {from}");
    if fail(inner, &context, error) {
        return;
    }
    let mut log = inner.log.borrow_mut();
    log.space.allocation_retry_at = Some(Instant::now() + Space::retry_delay(ALLOCATION_RETRY_MS));
    if is_space_error(error) {
        log.space.used_ratio = disk_used_ratio(&inner.config.root_dir).unwrap_or(1.0);
        let why = format!("{context}: {error}");
        if log.space.set_full(FullCause::Allocation, why) {
            log::warn!(
                "store {}: the disk is full; appends go on up to offset {} (space \
                 already allocated), then are refused until space returns",
                inner.config.root_dir.display(),
                log.space.allocated_end
            );
        }
    }
}

/// Creates the segment files covering `[start, end)` that do not exist yet. None is created
/// below the log's start: `start_empty_at` may move it past a creation under way (such a
/// file is removed again), and a file there would become the log's first on a reopen. A file
/// another caller created meanwhile (`start_empty_at` allocates beside the flusher) is kept,
/// and this one's descriptor closed: replacing it could close a descriptor a chain writes.
/// Once the store was emptied meanwhile (a reset, `LogState::resets`) it stops: the file it
/// made may be one the reset removed; one made after is left for the new log to open again.
pub(crate) async fn ensure_segments(inner: &Inner, start: u64, end: u64) -> Result<(), StoreError> {
    let size = inner.config.segment_size_bytes;
    let (mut segment, resets) = {
        let log = inner.log.borrow();
        (
            align_down(start, size).max(log.min_physical_offset),
            log.resets,
        )
    };
    while segment < end {
        // Retention may be moving a file it recycles here (`retention.rs`), or another
        // caller creating it: that one's file is this segment's.
        while inner.log.borrow().segments.claimed.contains(&segment) {
            crate::runtime::sleep(Duration::from_millis(1)).await;
        }
        let missing = inner.log.borrow().segments.file_for(segment).is_none();
        if missing {
            let dir = inner.log.borrow().segments.dir.clone();
            inner.log.borrow_mut().segments.claimed.insert(segment);
            let created = create_segment(&dir, size, segment).await;
            inner.log.borrow_mut().segments.claimed.remove(&segment);
            let file = created?;
            let (below_start, created_meanwhile, emptied) = {
                let log = inner.log.borrow();
                (
                    segment < log.min_physical_offset,
                    log.segments.files.contains_key(&segment),
                    log.resets != resets,
                )
            };
            if below_start || created_meanwhile || emptied {
                DirectFile::close_shared(Rc::new(file)).await;
                if below_start {
                    let path = inner.log.borrow().segments.path_of(segment);
                    // A reset's wipe may have removed it already.
                    crate::runtime::fs::remove_if_present(&path)?;
                }
                if emptied {
                    return Ok(());
                }
                segment += size;
                continue;
            }
            inner
                .log
                .borrow_mut()
                .segments
                .files
                .insert(segment, Rc::new(file));
            let listener = inner.segment_listener.borrow().clone();
            if let Some(listener) = listener {
                listener();
            }
        }
        segment += size;
    }
    Ok(())
}

/// The injected fault for the next write (or fdatasync), taken.
fn take_fault(flush: &mut FlushState, write: bool) -> Option<i32> {
    let errno = match flush.fault {
        Some(InjectedFault::WriteError { errno }) if write => errno,
        Some(InjectedFault::FdatasyncError { errno }) if !write => errno,
        _ => return None,
    };
    flush.fault = None;
    Some(errno)
}

/// A flush is due now: Sync, anything dirty; Async, `flush_dirty_max_bytes` dirty, or
/// anything dirty while somebody waits for it to be written (`wait_written`).
fn flush_due(inner: &Inner, log: &LogState) -> bool {
    let dirty = log.tail.end() - log.flush.written_end;
    match inner.config.flush_mode {
        FlushMode::Sync => dirty > 0,
        FlushMode::Async => {
            dirty >= inner.config.flush_dirty_max_bytes
                || (dirty > 0 && !log.flush.written_waiters.is_empty())
        }
    }
}

/// ASYNC_FLUSH: a sync of what is written is due: the last one started `flush_interval_ms`
/// ago, somebody waits for durability, `SYNC_AFTER_BYTES` are written and not durable (appends
/// stop at `TAIL_UNDURABLE_MAX_BYTES` past the durable end), or `UNSYNCED_SEGMENTS_MAX`
/// segment files wait for one (small segments; a chain has room for a few fdatasyncs).
fn sync_due(inner: &Inner, flush: &FlushState, now: Instant) -> bool {
    let interval = Duration::from_millis(inner.config.flush_interval_ms);
    !flush.waiters.is_empty()
        || now >= flush.last_sync_at + interval
        || flush.written_end - flush.durable_end >= SYNC_AFTER_BYTES
        || flush.unsynced_segments.len() >= UNSYNCED_SEGMENTS_MAX
}

/// What `start_flush` did.
enum Started {
    /// A flush is in flight (this one, or one already running), or one will start when the
    /// zero-fill in flight ends.
    Running,
    /// Nothing is dirty.
    Clean,
    /// The dirty range reaches `[start, end)` where a segment file is still to be created
    /// (asynchronously, by the flusher task).
    NeedsSegments {
        start: u64,
        end: u64,
    },
    Poisoned,
}

/// Starts a flush of everything dirty now, unless one is already in flight. Synchronous: the
/// chain goes to the kernel before this returns.
fn start_flush(inner: &Inner) -> Started {
    let mut log = inner.log.borrow_mut();
    if log.poison.is_some() {
        return Started::Poisoned;
    }
    if log.ring.busy(Slot::Data) {
        return Started::Running;
    }
    let mode = inner.config.flush_mode;
    let written_end = log.flush.written_end;
    let end = log.tail.end();
    if end == written_end {
        return Started::Clean;
    }
    let start = align_down(written_end, BLOCK_BYTES);
    let stop = align_up(end, BLOCK_BYTES);
    if log.flush.zero_in_flight.is_some_and(|(pos, _)| stop > pos) {
        // Zeros are on their way to part of this range: the zero-fill's end starts the flush.
        return Started::Running;
    }
    let size = inner.config.segment_size_bytes;
    let state = &mut *log;
    let mut writes: Vec<ChainWrite> = Vec::new();
    let seq = state.flush.data_chains + 1;
    let mut pos = start;
    // Straight from the tail's chunks: one write per segment and per FLUSH_WRITE_MAX_BYTES.
    'pieces: for piece in state.tail.flush_pieces(start) {
        let (mut offset, mut left) = (piece.offset, piece.len);
        while left > 0 {
            let Some((segment, file)) = state.segments.file_for(pos) else {
                return Started::NeedsSegments { start: pos, end };
            };
            let len = left.min((segment + size - pos) as usize);
            let (fd, position) = (file.as_raw_fd(), pos - segment);
            let extends = writes.last().is_some_and(|last| {
                last.fd == fd
                    && last.position + last.len() as u64 == position
                    && last.len() + len <= FLUSH_WRITE_MAX_BYTES as usize
            });
            if !extends {
                let unsynced = &mut state.flush.unsynced_segments;
                // ASYNC_FLUSH: a sync chain has room for the fdatasyncs of a few files.
                let too_many_files = mode == FlushMode::Async
                    && !unsynced.contains_key(&segment)
                    && unsynced.len() >= UNSYNCED_SEGMENTS_MAX;
                if writes.len() == FLUSH_CHAIN_WRITES_MAX || too_many_files {
                    // A new write starts at a segment or chunk boundary: block-aligned.
                    break 'pieces;
                }
                if mode == FlushMode::Async {
                    unsynced.insert(segment, seq);
                }
                let mut write = ChainWrite::new(fd, position);
                write.fail_with = take_fault(&mut state.flush, true);
                writes.push(write);
            }
            let run = TailPiece {
                chunk: piece.chunk.clone(),
                offset,
                len,
            };
            writes.last_mut().expect("a write").push_tail(run);
            (offset, left, pos) = (offset + len, left - len, pos + len as u64);
        }
    }
    if writes.is_empty() {
        // ASYNC_FLUSH with as many files waiting for a sync as one can take: the end of the
        // sync starts the flush.
        drop(log);
        return if start_sync(inner, true) {
            Started::Running
        } else {
            Started::Poisoned
        };
    }
    // The flush covers `[start, new_end)`: all that is dirty, unless the chain was cut.
    assert!(pos == stop || (pos < end && pos.is_multiple_of(BLOCK_BYTES)));
    let new_end = pos.min(end);
    // SYNC_FLUSH writes are durable (RWF_DSYNC); the reaper marks them so.
    let durable = mode == FlushMode::Sync;
    // SYNC_FLUSH writes are durable and need no fdatasync; an injected fdatasync failure
    // stands in for the sync part of the first one. ASYNC_FLUSH syncs in chains of their own.
    let sync_fault: Vec<_> = match mode {
        FlushMode::Sync => take_fault(&mut state.flush, false)
            .map(|errno| (writes[0].fd, Some(errno)))
            .into_iter()
            .collect(),
        FlushMode::Async => Vec::new(),
    };
    if let Err(error) = state.ring.submit(Slot::Data, writes, &sync_fault, durable) {
        drop(log);
        poison(inner, "commitlog ring submit", &error);
        return Started::Poisoned;
    }
    let messages = log.stats.put_messages;
    log.flush.data_chains = seq;
    log.flush.data_in_flight = Some(DataChain {
        end: new_end,
        messages,
    });
    log.flush.flush_started_at.get_or_insert_with(Instant::now);
    drop(log);
    note_submitted(inner);
    Started::Running
}

/// ASYNC_FLUSH: starts a chain of fdatasyncs of every segment file written since its last
/// one, if none is in flight and something written is not durable; with `forced`, whether
/// or not one is due (`sync_due`). It makes durable what earlier flushes wrote (reaped before
/// it starts): writes go on beside it. True when a sync is in flight afterwards.
fn start_sync(inner: &Inner, forced: bool) -> bool {
    let mut log = inner.log.borrow_mut();
    if inner.config.flush_mode != FlushMode::Async || log.poison.is_some() {
        return false;
    }
    if log.ring.busy(Slot::Sync) {
        return true;
    }
    let flush = &log.flush;
    if flush.written_end <= flush.durable_end || !(forced || sync_due(inner, flush, Instant::now()))
    {
        return false;
    }
    // Segments written by the flush in flight, if any, are synced too, but only what was
    // reaped before now counts as covered.
    let covered_seq = flush.data_chains - u64::from(flush.data_in_flight.is_some());
    let end = flush.written_end;
    let state = &mut *log;
    let mut sync_fds: Vec<(i32, Option<i32>)> = state
        .flush
        .unsynced_segments
        .keys()
        .filter_map(|&segment| state.segments.file_for(segment))
        .map(|(_, file)| (file.as_raw_fd(), None))
        .collect();
    state.flush.last_sync_at = Instant::now();
    if sync_fds.is_empty() {
        // Nothing written waits for a sync (the files went with a reset).
        drop(log);
        mark_durable(inner, end);
        return false;
    }
    sync_fds[0].1 = take_fault(&mut state.flush, false);
    if let Err(error) = state.ring.submit(Slot::Sync, Vec::new(), &sync_fds, false) {
        drop(log);
        poison(inner, "commitlog ring submit", &error);
        return false;
    }
    log.flush.sync_in_flight = Some((end, covered_seq));
    drop(log);
    note_submitted(inner);
    true
}

/// After an append (or a chain's end): starts a flush at once if one is due, none is in
/// flight and, under SYNC_FLUSH, `SYNC_KICK_MIN_BYTES` are dirty. True when a flush is in
/// flight afterwards or will start when the zero-fill in flight ends; false when the flusher
/// task must see to it (less dirty, nothing due yet, a segment file to create, a test delay).
pub(crate) fn kick(inner: &Inner) -> bool {
    {
        let log = inner.log.borrow();
        let retry_waits = log.space.flush_retry_at.is_some();
        if log.flush.test_flush_delay.is_some()
            || log.closing
            || log.reset.is_some()
            || retry_waits
            || !flush_due(inner, &log)
            || (inner.config.flush_mode == FlushMode::Sync
                && log.tail.end() - log.flush.written_end < SYNC_KICK_MIN_BYTES)
        {
            return false;
        }
    }
    matches!(start_flush(inner), Started::Running)
}

/// Collects the commitlog ring's completions; for each chain that ended applies it (durable
/// end, zero-fill mark, or poison), wakes whoever waits on it, and starts the next flush if
/// one is due. Called by the reaper task, and from busy request loops through the store's
/// poll hook (`runtime::run_poll_hooks`).
pub(crate) fn reap(inner: &Inner) {
    let ended = inner.log.borrow_mut().ring.reap();
    if ended.is_empty() {
        return;
    }
    for (slot, outcome) in ended {
        let mut log = inner.log.borrow_mut();
        log.flush.chains_ended[slot as usize] += 1;
        let (data, zeros, synced) = match slot {
            Slot::Data => {
                if let Some(started) = log.flush.flush_started_at.take() {
                    let took = micros(started.elapsed());
                    log.stats.flush_micros += took;
                    let bucket =
                        crate::histogram::bucket_of(&super::FLUSH_LATENCY_BUCKETS_US, took);
                    log.stats.flush_latency_buckets[bucket] += 1;
                }
                (log.flush.data_in_flight.take(), None, None)
            }
            Slot::ZeroFill => (None, log.flush.zero_in_flight.take(), None),
            Slot::Sync => (None, None, log.flush.sync_in_flight.take()),
        };
        drop(log);
        if let Err(failure) = outcome {
            chain_failed(inner, slot, failure.context, &failure.error);
            continue;
        }
        if let Some(chain) = data {
            mark_written(inner, chain.end, chain.messages);
            if inner.config.flush_mode == FlushMode::Sync {
                mark_durable(inner, chain.end);
            }
            let mut log = inner.log.borrow_mut();
            log.space.flush_retry_at = None;
            if log.space.clear(FullCause::Write) {
                log::warn!(
                    "store {}: the disk takes writes again",
                    inner.config.root_dir.display()
                );
            }
        }
        if let Some((pos, stop)) = zeros {
            let mut log = inner.log.borrow_mut();
            log.flush.zero_fill_next = log.flush.zero_fill_next.max(stop);
            log.stats.zero_filled_bytes += stop - pos;
        }
        if let Some((end, covered_seq)) = synced {
            // Files written again since the sync started stay listed for the next one.
            let mut log = inner.log.borrow_mut();
            log.flush
                .unsynced_segments
                .retain(|_, last_write| *last_write > covered_seq);
            drop(log);
            mark_durable(inner, end);
        }
    }
    inner.log.borrow_mut().flush.wake_chain_waiters();
    kick(inner);
    start_sync(inner, false);
    // The flusher task decides what else is due (a deadline flush, the next zero-fill).
    inner.notify.signal();
}

/// A chain that failed: a data write that found the disk full keeps its bytes in the tail and
/// is tried again after `FLUSH_RETRY_MS` (appends refused meanwhile); a zero-fill short of
/// resources is tried again later; anything else poisons the store.
fn chain_failed(inner: &Inner, slot: Slot, context: &str, error: &io::Error) {
    if fail(inner, context, error) {
        return;
    }
    let retry_at = |ms| Some(Instant::now() + Space::retry_delay(ms));
    let mut log = inner.log.borrow_mut();
    match slot {
        Slot::Data | Slot::Sync => {
            if is_space_error(error) {
                log.space.used_ratio = disk_used_ratio(&inner.config.root_dir).unwrap_or(1.0);
                log.space
                    .set_full(FullCause::Write, format!("{context}: {error}"));
            }
            log.space.flush_retry_at = retry_at(FLUSH_RETRY_MS);
        }
        Slot::ZeroFill => log.flush.zero_fill_retry_at = retry_at(ALLOCATION_RETRY_MS),
    }
}

/// Resolves once the chain in flight in `slot` at the call has ended (at once when none is).
/// Unlike `chain_ended` it does not wait for the slot to be free. Under SYNC_FLUSH load the end
/// of one flush starts the next at once, so a wait for a free slot could last as long as the
/// load: the flusher's loop, waiting so in `flush_to`, was held up to 270 ms, and started no
/// allocation meanwhile ("space is being prepared").
async fn this_chain_ended(inner: &Inner, slot: Slot) {
    let ended = inner.log.borrow().flush.chains_ended[slot as usize];
    poll_fn(|cx| {
        let mut log = inner.log.borrow_mut();
        if !log.ring.busy(slot) || log.flush.chains_ended[slot as usize] != ended {
            return Poll::Ready(());
        }
        log.flush.chain_waiters.push(cx.waker().clone());
        Poll::Pending
    })
    .await
}

/// Resolves once the chain in `slot` has ended (reaped; a failed chain ends too).
pub(crate) async fn chain_ended(inner: &Inner, slot: Slot) {
    poll_fn(|cx| {
        let mut log = inner.log.borrow_mut();
        if !log.ring.busy(slot) {
            return Poll::Ready(());
        }
        log.flush.chain_waiters.push(cx.waker().clone());
        Poll::Pending
    })
    .await
}

/// Makes everything appended so far durable. Returns false when the store is (or got)
/// poisoned.
pub(crate) async fn flush(inner: &Inner) -> bool {
    flush_to(inner, true).await
}

/// Writes everything appended so far, and makes it durable when `durable` (under SYNC_FLUSH
/// a write is durable). Returns false when the store is (or got) poisoned.
async fn flush_to(inner: &Inner, durable: bool) -> bool {
    let target = inner.log.borrow().tail.end();
    let mut delayed = false;
    let mut retries = 0u32;
    loop {
        {
            let log = inner.log.borrow();
            if log.poison.is_some() {
                return false;
            }
            let done = if durable {
                log.flush.durable_end
            } else {
                log.flush.written_end
            };
            if done >= target {
                return true;
            }
            if log.reset.is_some() {
                // What is left to write is about to be thrown away; the reset waits for the
                // flusher (a full disk could keep this loop going for long).
                return false;
            }
        }
        let test_delay = inner.log.borrow().flush.test_flush_delay;
        if let (Some(delay), false) = (test_delay, delayed) {
            // The slow disk is under way: appends wait on it from now (the overload check).
            inner.log.borrow_mut().flush.flush_started_at = Some(Instant::now());
            delayed = true;
            crate::runtime::sleep(delay).await;
            continue;
        }
        let retry_at = inner.log.borrow().space.flush_retry_at;
        if let Some(at) = retry_at {
            // The disk refused the last write for want of space: wait, then try again. A
            // closing store gives up after `CLOSE_FLUSH_RETRIES_MAX` waits (and says so).
            retries += 1;
            if inner.log.borrow().closing && retries > CLOSE_FLUSH_RETRIES_MAX {
                return false;
            }
            crate::runtime::sleep(at.saturating_duration_since(Instant::now())).await;
            inner.log.borrow_mut().space.flush_retry_at = None;
            continue;
        }
        if inner.log.borrow().flush.written_end >= target {
            // Written, not yet durable (ASYNC_FLUSH): a sync of it, or of less then another.
            if start_sync(inner, true) {
                this_chain_ended(inner, Slot::Sync).await;
            }
            continue;
        }
        let started = start_flush(inner);
        let zero_fill_ahead = inner.log.borrow().flush.zero_in_flight.is_some();
        match started {
            Started::Running if inner.log.borrow().ring.busy(Slot::Data) => {
                this_chain_ended(inner, Slot::Data).await
            }
            // Held up by a zero-fill in flight, or by a sync (too many files unsynced).
            Started::Running if zero_fill_ahead => this_chain_ended(inner, Slot::ZeroFill).await,
            Started::Running if inner.log.borrow().ring.busy(Slot::Sync) => {
                this_chain_ended(inner, Slot::Sync).await
            }
            Started::Running => {}
            // Everything is written: the loop's next turn sees to the rest.
            Started::Clean => continue,
            Started::Poisoned => return false,
            Started::NeedsSegments { start, end } => {
                if let Err(error) = ensure_segments(inner, start, end).await {
                    if fail(inner, "creating a commitlog segment", &store_io(error)) {
                        return false;
                    }
                    let retry_at = Instant::now() + Space::retry_delay(FLUSH_RETRY_MS);
                    inner.log.borrow_mut().space.flush_retry_at = Some(retry_at);
                }
            }
        }
    }
}

/// The zeros zero-fill writes (mapped once); None while they cannot be mapped (the process
/// is out of maps: zero-fill waits, the writes go on without it).
fn zeros(flush: &mut FlushState) -> Option<Rc<Zeros>> {
    if flush.zero_buffer.is_none() {
        flush.zero_buffer = Zeros::new(ZERO_FILL_CHUNK_BYTES as usize).ok();
    }
    flush.zero_buffer.clone()
}

/// A flush of data ended: everything below `end` is written.
fn mark_written(inner: &Inner, end: u64, messages: u64) {
    let mut log = inner.log.borrow_mut();
    assert!(
        end >= log.flush.written_end,
        "the written end never goes backwards"
    );
    let before = log.flush.written_end;
    log.flush.written_end = end;
    log.flush.wake_written_waiters_up_to(end);
    log.flush.last_flush_at = Instant::now();
    log.stats.flushes += 1;
    log.stats.flushed_messages += messages - log.flush.messages_at_last_flush;
    log.flush.messages_at_last_flush = messages;
    log.flush.dirty_since = (log.tail.end() > end).then(Instant::now);
    // The bytes just written stay, and TAIL_READ_KEEP_BYTES before them: readers of what was
    // just written (the HA stream sends only written bytes, and an ASYNC_FLUSH write carries
    // up to flush_dirty_max_bytes) get it from memory, not from the disk.
    let keep_from = align_down(before, BLOCK_BYTES).saturating_sub(TAIL_READ_KEEP_BYTES);
    log.tail.drop_before(keep_from);
}

/// A durable flush or a sync ended: everything below `end` (written, `mark_written`) is
/// durable.
fn mark_durable(inner: &Inner, end: u64) {
    let mut log = inner.log.borrow_mut();
    // Syncs run one at a time and each covers what was written when it started: in order.
    assert!(
        end >= log.flush.durable_end && end <= log.flush.written_end,
        "the durable end never goes backwards, nor past what is written"
    );
    log.flush.durable_end = end;
    log.flush.wake_waiters_up_to(end);
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn store_io(error: StoreError) -> io::Error {
    match error {
        StoreError::Io(e) => e,
        StoreError::DiskFull { reason, .. } => os_error_with_context(libc::ENOSPC, reason),
        other => io::Error::other(other.to_string()),
    }
}

/// Starts zero-filling the next chunk ahead of the write position (creating its segment file
/// first if needed); its end is reaped like a flush's.
async fn zero_fill_step(inner: &Inner) {
    let range = {
        let log = inner.log.borrow();
        zero_fill_range(inner, &log).filter(|_| quiet(&log, Instant::now()))
    };
    let Some((pos, stop)) = range else {
        return;
    };
    if let Err(error) = ensure_segments(inner, pos, stop).await {
        if !fail(inner, "creating a commitlog segment", &store_io(error)) {
            let retry_at = Instant::now() + Space::retry_delay(ALLOCATION_RETRY_MS);
            inner.log.borrow_mut().flush.zero_fill_retry_at = Some(retry_at);
        }
        return;
    }
    let mut log = inner.log.borrow_mut();
    if log.poison.is_some() || log.ring.busy(Slot::ZeroFill) {
        return;
    }
    // Appends may have moved on while the file was created: take the range afresh.
    let range = zero_fill_range(inner, &log).filter(|_| quiet(&log, Instant::now()));
    let Some((pos, stop)) = range else {
        return;
    };
    let Some((segment, file)) = log.segments.file_for(pos) else {
        return;
    };
    // A flush in flight stays below the write position, and zero-fill starts at or past it.
    debug_assert!(log
        .flush
        .data_in_flight
        .is_none_or(|chain| align_up(chain.end, BLOCK_BYTES) <= pos));
    let Some(zeros) = zeros(&mut log.flush) else {
        let retry_at = Instant::now() + Space::retry_delay(ALLOCATION_RETRY_MS);
        log.flush.zero_fill_retry_at = Some(retry_at);
        return;
    };
    let mut write = ChainWrite::new(file.as_raw_fd(), pos - segment);
    write.push_zeros(&zeros, (stop - pos) as usize);
    let submitted = log.ring.submit(
        Slot::ZeroFill,
        vec![write],
        &[(file.as_raw_fd(), None)],
        false,
    );
    match submitted {
        Ok(()) => {
            log.flush.zero_in_flight = Some((pos, stop));
            drop(log);
            note_submitted(inner);
        }
        Err(error) => {
            drop(log);
            poison(inner, "commitlog ring submit", &error);
        }
    }
}

/// Makes the consume queues durable up to the current end and records it in the checkpoint.
pub(crate) async fn checkpoint(inner: &Inner, clean: bool) -> bool {
    let Some(plan) = plan_checkpoint(inner, clean, true, true).await else {
        return false;
    };
    let outcome = write_checkpoint(inner.config.root_dir.clone(), plan).await;
    checkpoint_done(inner, outcome)
}

/// What a checkpoint records, and the files written through maps that must be durable first
/// (none for a light checkpoint).
pub(crate) struct CheckpointPlan {
    record: Checkpoint,
    /// A clean stop's queue catalog and its stamp (`catalog.rs`), written before the record.
    catalog: Option<(u64, Vec<u8>)>,
    paths: Vec<std::path::PathBuf>,
    dir: Option<std::path::PathBuf>,
    /// Sync the whole filesystem, whatever `paths` holds (`FlushState::syncfs_next`).
    whole_fs: bool,
}

/// A checkpoint's first step, on the store: with `flush_now`, flushes what is appended (else
/// the record waits for the flusher's own flushes, `durable_through`) and, for a synced one,
/// takes the files written since the last synced one (a light one leaves them for it). None
/// when the flush failed.
async fn plan_checkpoint(
    inner: &Inner,
    clean: bool,
    synced: bool,
    flush_now: bool,
) -> Option<CheckpointPlan> {
    let (offset, queues, index, awaiting_from, catalog) = {
        let log = inner.log.borrow();
        let index = inner.index.borrow().mark();
        let table = inner.queues.borrow();
        let awaiting_from = table.first_awaiting_physical();
        // A synced checkpoint names a catalog of the queues as it counts them: after a
        // restart of the machine the start takes them from it (`catalog.rs`).
        let catalog = synced.then(|| {
            let stamp = super::catalog::new_stamp();
            (stamp, table.catalog(stamp))
        });
        (
            log.tail.end(),
            table.max_offsets_in_files(),
            index,
            awaiting_from,
            catalog,
        )
    };
    if flush_now && inner.log.borrow().flush.durable_end < offset && !flush(inner).await {
        return None;
    }
    let record = Checkpoint {
        commitlog_offset: offset,
        clean,
        queues,
        index: Some(index),
        boot: (!synced)
            .then(checkpoint::boot_id)
            .flatten()
            .map(str::to_string),
        awaiting_from,
        catalog: None,
    };
    if !synced {
        return Some(CheckpointPlan {
            record,
            catalog: None,
            paths: Vec::new(),
            dir: None,
            whole_fs: false,
        });
    }
    // Files a failed checkpoint left unsynced come first.
    let (mut paths, dir) = {
        let mut log = inner.log.borrow_mut();
        (
            std::mem::take(&mut log.flush.unsynced_paths),
            log.flush.unsynced_dir.take(),
        )
    };
    paths.extend(inner.queues.borrow_mut().take_dirty_paths());
    let (index_paths, index_dir) = inner.index.borrow_mut().take_dirty_paths();
    paths.extend(index_paths);
    Some(CheckpointPlan {
        record,
        catalog,
        paths,
        dir: dir.or(index_dir),
        whole_fs: inner.log.borrow().flush.syncfs_next,
    })
}

/// How often a periodic checkpoint looks whether the log is durable up to its offset.
const CHECKPOINT_DURABLE_POLL_MS: u64 = 5;

/// Waits until the flusher's own flushes made the log durable through `offset` (true), or
/// gives up (false): the store is gone, closing, being reset or failed. It looks every
/// `CHECKPOINT_DURABLE_POLL_MS` rather than waiting as a send does, because the exit and a
/// reset wait for the checkpoint under way before they flush.
async fn durable_through(weak: &std::rc::Weak<Inner>, offset: u64) -> bool {
    loop {
        {
            let Some(inner) = weak.upgrade() else {
                return false;
            };
            let log = inner.log.borrow();
            if log.flush.durable_end >= offset {
                return true;
            }
            if log.closing || log.reset.is_some() || log.poison.is_some() {
                return false;
            }
        }
        crate::runtime::sleep(Duration::from_millis(CHECKPOINT_DURABLE_POLL_MS)).await;
    }
}

/// A checkpoint written: its offset, whether it was a synced one, and whether that synced
/// the whole filesystem.
pub(crate) struct CheckpointWritten {
    offset: u64,
    /// Below it every record's unit is counted (`FlushState::synced_covers`).
    covers: u64,
    synced: bool,
    whole_fs: bool,
}

/// A checkpoint's second step, which needs only the store's directory (so it can go on
/// while the store does other work, or after it is gone): syncs the files, then writes the
/// record (a light one is only written).
async fn write_checkpoint(
    root: std::path::PathBuf,
    mut plan: CheckpointPlan,
) -> Result<CheckpointWritten, SyncFailure> {
    let synced = !plan.record.light();
    if synced {
        sync_written(&root, plan.paths, plan.dir, plan.whole_fs).await?;
    }
    if let Some((stamp, bytes)) = plan.catalog {
        // Without it the next start reads every queue's directory: slower, as correct.
        match super::catalog::write(&root, bytes).await {
            Ok(()) => plan.record.catalog = Some(stamp),
            Err(error) => log::warn!(
                "store {}: cannot write the queue catalog ({error}); the next start reads \
                 every queue's directory",
                root.display()
            ),
        }
    }
    checkpoint::write(&root, &plan.record)
        .await
        .map_err(|error| SyncFailure {
            context: "checkpoint write",
            error,
            paths: Vec::new(),
            dir: None,
        })?;
    Ok(CheckpointWritten {
        offset: plan.record.commitlog_offset,
        covers: plan.record.covers(),
        synced,
        whole_fs: plan.whole_fs,
    })
}

/// Applies a checkpoint's outcome to the store; true when it was written.
fn checkpoint_done(inner: &Inner, outcome: Result<CheckpointWritten, SyncFailure>) -> bool {
    match outcome {
        Ok(written) => {
            let mut log = inner.log.borrow_mut();
            let now = Instant::now();
            log.flush.last_checkpoint_at = now;
            log.flush.last_checkpoint_offset = written.offset;
            if written.synced {
                log.flush.last_synced_at = now;
                log.flush.last_synced_offset = written.offset;
                log.flush.synced_covers = written.covers;
                log.flush.checkpoints_failing = false;
                log.flush.checkpoint_wanted = false;
                if written.whole_fs {
                    log.flush.syncfs_next = false;
                }
            }
            log.stats.checkpoints += 1;
            true
        }
        Err(failure) => {
            let mut log = inner.log.borrow_mut();
            log.flush.keep_unsynced(failure.paths, failure.dir);
            drop(log);
            checkpoint_failed(inner, failure.context, &failure.error);
            false
        }
    }
}

/// A checkpoint step failed: short of resources, the checkpoint is tried again after
/// `CHECKPOINT_INTERVAL_MS` (the old one stays valid: recovery then scans a little more);
/// anything else poisons the store.
fn checkpoint_failed(inner: &Inner, context: &str, error: &io::Error) {
    if !fail(inner, context, error) {
        let mut log = inner.log.borrow_mut();
        let now = Instant::now();
        log.flush.last_checkpoint_at = now;
        log.flush.last_synced_at = now;
        log.flush.checkpoint_wanted = false;
        log.flush.checkpoints_failing = true;
    }
}

/// The checkpoint's sync of what was written through maps, on failure: the step that failed,
/// its error, and what is not known durable yet.
pub(crate) struct SyncFailure {
    pub(crate) context: &'static str,
    pub(crate) error: io::Error,
    pub(crate) paths: Vec<std::path::PathBuf>,
    pub(crate) dir: Option<std::path::PathBuf>,
}

/// Makes the consume-queue and index files `paths` (written through memory maps) and the
/// index directory `dir` durable. Many files (thousands of queues written since the last
/// checkpoint, or re-dispatched by recovery) take one syncfs of the store's filesystem, whose
/// cost follows the dirty bytes: an open + fdatasync + close per file held the flusher for a
/// second of every second at a thousand queues, and took 100 s to start with 16,000. So do
/// files no path lists (`whole_fs`: the store opened on a light checkpoint). A file deleted
/// meanwhile (a topic, the index bound) needs no sync.
pub(crate) async fn sync_written(
    root: &std::path::Path,
    paths: Vec<std::path::PathBuf>,
    dir: Option<std::path::PathBuf>,
    whole_fs: bool,
) -> Result<(), SyncFailure> {
    if whole_fs || paths.len() > SYNCFS_FILES_MIN {
        return crate::runtime::fs::syncfs(root)
            .await
            .map_err(|error| SyncFailure {
                context: "consume queue and index syncfs",
                error,
                paths,
                dir,
            });
    }
    let mut left = paths.into_iter();
    while let Some(path) = left.next() {
        if let Err(error) = sync_file(&path).await {
            if error.kind() != io::ErrorKind::NotFound {
                return Err(SyncFailure {
                    context: "consume queue or index fdatasync",
                    error,
                    paths: std::iter::once(path).chain(left).collect(),
                    dir,
                });
            }
        }
    }
    if let Some(dir) = dir {
        if let Err(error) = super::segments::sync_dir(&dir).await {
            return Err(SyncFailure {
                context: "message index directory fsync",
                error,
                paths: Vec::new(),
                dir: Some(dir),
            });
        }
    }
    Ok(())
}

/// fdatasync of a file by path (consume-queue files are written through memory maps).
pub(crate) use crate::runtime::fs::fdatasync_path as sync_file;

async fn exit(inner: &Inner) {
    // A periodic checkpoint under way ends first (one checkpoint writer at a time).
    while inner.log.borrow().flush.checkpoint_running {
        inner.notify.wait().await;
    }
    // Queues not yet settled are settled now: a clean checkpoint's catalog lists them as
    // they are. Should that fail, the synced checkpoint and its catalog stay, and the next
    // start recovers from them as after a crash.
    let settled = super::queue_files::settle_the_rest(inner).await;
    // Every acknowledged message is written (`ok`) even when the clean checkpoint cannot be
    // (a full disk has no block for its new file): recovery then scans from the last one.
    let ok = flush(inner).await;
    if ok && !settled {
        log::warn!(
            "store {}: every message is on disk, but not every consume queue could be \
             settled; the next start recovers from the last synced checkpoint",
            inner.config.root_dir.display()
        );
    } else if ok && !checkpoint(inner, true).await {
        log::warn!(
            "store {}: every message is on disk, but the final checkpoint could not \
             be written; the next start scans from the previous one",
            inner.config.root_dir.display()
        );
    }
    // No chain may still be writing to the files about to close.
    chain_ended(inner, Slot::ZeroFill).await;
    chain_ended(inner, Slot::Data).await;
    chain_ended(inner, Slot::Sync).await;
    let files: Vec<_> = {
        let mut log = inner.log.borrow_mut();
        std::mem::take(&mut log.segments.files)
            .into_values()
            .collect()
    };
    for file in files {
        // A reader still holding the file closes it when it drops its reference.
        DirectFile::close_shared(file).await;
    }
    let mut log = inner.log.borrow_mut();
    let result = match (&log.poison, ok) {
        (Some(poison), _) => Err(poison.clone()),
        (None, true) => Ok(()),
        (None, false) => Err(Poison::new(
            "the final flush failed: the disk refused its writes for want of space",
        )),
    };
    log.flush.done = Some(result);
    log.flush.wake_everyone();
}

/// Resolves once a write + fdatasync covering `end_offset` has completed.
pub(crate) async fn wait_durable(inner: &Inner, end_offset: u64) -> Result<(), StoreError> {
    wait_for(inner, end_offset, Reach::Durable).await
}

/// Resolves once everything below `end_offset` is written to its segment file (a kill of the
/// process then keeps it; under SYNC_FLUSH that is once it is durable). Under ASYNC_FLUSH the
/// write starts now instead of within `flush_interval_ms` or at `flush_dirty_max_bytes`.
pub(crate) async fn wait_written(inner: &Inner, end_offset: u64) -> Result<(), StoreError> {
    wait_for(inner, end_offset, Reach::Written).await
}

/// The end a waiter waits for.
#[derive(Clone, Copy)]
enum Reach {
    Durable,
    Written,
}

async fn wait_for(inner: &Inner, end_offset: u64, reach: Reach) -> Result<(), StoreError> {
    poll_fn(|cx| {
        let mut log = inner.log.borrow_mut();
        // An offset past the end can only be a caller's mistake; wait for the end instead.
        let target = end_offset.min(log.tail.end());
        let reached = match reach {
            Reach::Durable => log.flush.durable_end,
            Reach::Written => log.flush.written_end,
        };
        // Durable before a later failure is durable: such a send is answered SUCCESS.
        if reached >= target {
            return Poll::Ready(Ok(()));
        }
        if let Some(poison) = &log.poison {
            return Poll::Ready(Err(poison.to_error()));
        }
        if log.flush.done.is_some() {
            return Poll::Ready(Err(StoreError::Closed));
        }
        let waiters = match reach {
            Reach::Durable => &mut log.flush.waiters,
            Reach::Written => &mut log.flush.written_waiters,
        };
        waiters.entry(target).or_default().push(cx.waker().clone());
        if inner.config.flush_mode == FlushMode::Async {
            // A sync (`sync_due`) or a write (`flush_due`) is due now: the flusher starts it
            // if no flush will.
            inner.notify.signal();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn checkpoints_come_a_second_apart_with_few_queues() {
        assert_eq!(checkpoint_due(MS * 999, 1 << 30, 16), Err(MS));
        // Up to CHECKPOINT_DIRTY_FILES_FREE files, even a trickle is checkpointed each second.
        assert_eq!(checkpoint_due(MS * 1000, 1, 16), Ok(()));
        let free = CHECKPOINT_DIRTY_FILES_FREE;
        assert_eq!(checkpoint_due(MS * 1000, 1, free), Ok(()));
        // One more wants 256 KiB of log; a trickle waits for the longest interval.
        let wanted = CHECKPOINT_LOG_BYTES_PER_DIRTY_FILE;
        assert_eq!(
            checkpoint_due(MS * 1000, wanted - 1, free + 1),
            Err(Duration::from_millis(CHECKPOINT_INTERVAL_MAX_MS - 1000))
        );
        assert_eq!(checkpoint_due(MS * 1000, wanted, free + 1), Ok(()));
        assert_eq!(
            checkpoint_due(
                Duration::from_millis(CHECKPOINT_INTERVAL_MAX_MS),
                1,
                free + 1
            ),
            Ok(())
        );
    }

    #[test]
    fn many_dirty_queue_files_space_checkpoints_out_to_a_bound() {
        // 5,000 files want about 1 GiB of log per checkpoint.
        let files = 5_000;
        let wanted =
            (files - CHECKPOINT_DIRTY_FILES_FREE) as u64 * CHECKPOINT_LOG_BYTES_PER_DIRTY_FILE;
        assert!(checkpoint_due(MS * 3000, wanted - 1, files).is_err());
        assert_eq!(checkpoint_due(MS * 3000, wanted, files), Ok(()));
        // 80,000 files: the recovery scan bound comes first, then the longest interval.
        assert!(checkpoint_due(MS * 2000, CHECKPOINT_LOG_BYTES_MAX - 1, 80_000).is_err());
        assert_eq!(
            checkpoint_due(MS * 2000, CHECKPOINT_LOG_BYTES_MAX, 80_000),
            Ok(())
        );
        assert_eq!(
            checkpoint_due(Duration::from_millis(CHECKPOINT_INTERVAL_MAX_MS), 0, 80_000),
            Ok(())
        );
    }
}
