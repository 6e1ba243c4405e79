//! One shard's message store: commitlog, consume queues, checkpoint and recovery.
//!
//! A `Store` lives on one glommio executor (`Rc`/`RefCell`, `!Send`) and is owned by the shard
//! that serves its queues. Data path:
//!
//! 1. `append` (synchronous) assigns the queue offset and the commitlog offset, encodes the
//!    record in RocketMQ's stored format into the in-memory tail (`tail.rs`) and writes the
//!    20-byte consume-queue unit (`consume_queue.rs`); the message is readable at once.
//! 2. A flush (`flusher.rs`) hands writes of the dirty block-aligned range, gathered straight
//!    from the tail's chunks, and a wake-up to the kernel as one chain on the store's own
//!    io_uring ring (`commit_ring.rs`, the only writer of commitlog files). Sync mode writes
//!    with RWF_DSYNC whatever is dirty: at once when 64 KiB are (the append starts it, the end
//!    of one flush starts the next), else once the tasks ahead of the flusher's have run; the
//!    reaper then marks everything up to the written end durable and wakes every
//!    `wait_durable` it covers (group commit). Async mode writes plainly within
//!    `flush_interval_ms` or when `flush_dirty_max_bytes` is passed, and a chain of its own
//!    fdatasyncs the files written, beside the next writes, once the last sync is
//!    `flush_interval_ms` old, 8 MiB wait for one, or somebody waits for durability.
//!    Zero-fill chains (write + fdatasync) write segment space ahead of the write position
//!    while the store is quiet.
//! 3. Reads (`pull.rs`) copy bytes still in the tail from memory and read older bytes with DMA.
//! 4. Every second or more (`flusher::checkpoint_due`: less often as more queue files are
//!    written) the flusher syncs the consume queues and writes the checkpoint
//!    (`checkpoint.rs`); `open` recovers from it (`recovery.rs`).
//! 5. `append` also files the record's keys (UNIQ_KEY, KEYS) in the message index
//!    (`index.rs`), which QUERY_MESSAGE reads (`index_query.rs`); the checkpoint syncs it too.
//! 6. Replication (`replica.rs`): a master serves raw commitlog bytes (`read_log`); a slave
//!    appends them at the same offsets (`append_replicated`, with every limit `append` keeps)
//!    and files them in its queues and index as recovery does. A slave whose log cannot
//!    continue its master's empties the whole store in process and starts again at the
//!    master's offset (`reset_empty_at`, `reset.rs`).
//!
//! Invariants (asserted, kept in release): the commitlog end, the durable end and every queue's
//! max offset never go backwards (a reset starts them anew: the old log and queues are gone); a
//! record's size equals its computed size; flushed ranges are block-aligned; store timestamps
//! never decrease.
//!
//! Failure (`error.rs`): a failed durable write poisons the store (`StoreError::Poisoned`):
//! appends and `wait_durable` fail from then on, reads keep working, and only a restart
//! (recovery) brings writes back. A shortage of resources (a full disk, no descriptors) is an
//! answer, retried by the store until it clears (`space.rs`): appends stop at the space already
//! allocated ahead of them, so an acknowledged message is always written, even on a full disk.
//! Directory layout under `root_dir`:
//! `commitlog/<20-digit offset>`, `consumequeue/<topic>/<queueId>/<20-digit offset>`,
//! `index/<20-digit offset>`, `checkpoint` and `checkpoint.light` (`checkpoint.rs`),
//! `consumequeue.catalog` after a clean stop (`catalog.rs`), and `.dma_probe` (see `open`); `reset-in-progress`
//! only while a reset removes files (`open` then finishes the reset first).

mod catalog;
mod checkpoint;
mod commit_ring;
mod consume_queue;
mod error;
mod flusher;
mod idle_maps;
mod index;
mod index_query;
mod prefault;
mod pull;
mod queue_files;
mod read_cache;
pub use shardmq_protocol::record;
mod recovery;
mod replica;
mod reset;
mod retention;
mod segments;
mod space;
mod tail;
pub mod verify;

use std::cell::RefCell;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::rc::Rc;

pub use crate::types::{CommitLogOffset, QueueId, QueueOffset};
pub use checkpoint::boot_id;
pub use error::StoreError;
pub use flusher::{InjectedFault, FLUSH_DIRTY_BYTES_MAX, SYNC_KICK_MIN_BYTES};
pub use index::{
    key_hash, IndexConfig, IndexLastUpdate, MessageKeys, INDEX_ENTRIES_PER_FILE_MIN,
    INDEX_KEYS_PER_MESSAGE_MAX,
};
pub use index_query::{MessageQuery, QueryMessageResult, QUERY_MESSAGES_MAX};
pub use pull::{
    GetMessageResult, GetStatus, PropertiesFilter, PullFilter, PROPERTY_FILTER_READ_MAX_BYTES,
};
pub use read_cache::{
    WINDOWS_DEFAULT as READ_CACHE_WINDOWS_DEFAULT, WINDOWS_MIN as READ_CACHE_WINDOWS_MIN,
};
pub use replica::{REPLICA_READ_MAX_BYTES, REPLICA_UNIT_MAX_BYTES};
pub use retention::{
    parse_delete_when, recycled_ahead_max, DeletedSegment, DiskVerdict, RetentionConfig,
    SealedSegment, DELETE_FILES_BATCH_MAX, MANUAL_DELETE_RUNS,
};
pub use space::{ALLOCATION_RETRY_MS, ALLOCATION_WINDOW_DEFAULT_BYTES, FLUSH_RETRY_MS};

use commit_ring::CommitRing;
pub use commit_ring::RingCounts;
use consume_queue::{QueueTable, Unit};
use error::Poison;
use flusher::{FlushState, Notify};
use record::StoredMessage;
use segments::Segments;
use space::Space;
use tail::Tail;

pub use crate::limits::FLUSH_DIRTY_MAX_BYTES_LIMIT;
pub use crate::limits::MESSAGE_SIZE_MAX_BYTES;
pub use crate::limits::PROPERTIES_SIZE_MAX_BYTES;
/// The longest properties a message may bring to the store: what a seal may add to them in a
/// recycled segment (`record::SEAL_BYTES_MAX`) still fits RocketMQ's 32,767.
pub const STORED_PROPERTIES_MAX_BYTES: usize = PROPERTIES_SIZE_MAX_BYTES - record::SEAL_BYTES_MAX;
pub use crate::limits::RECORD_SIZE_MAX_BYTES;
pub use crate::limits::SEGMENT_SIZE_MIN_BYTES;
pub use crate::limits::TAIL_READ_KEEP_BYTES;
pub use crate::limits::TAIL_UNDURABLE_MAX_BYTES;
pub use crate::limits::TOPIC_NAME_MAX_BYTES;
/// Default commitlog segment size (RocketMQ's).
pub const SEGMENT_SIZE_DEFAULT_BYTES: u64 = 1 << 30;
/// Default consume-queue file size in units (RocketMQ's).
pub const CONSUME_QUEUE_UNITS_PER_FILE_DEFAULT: u64 = 300_000;

pub use crate::limits::ALLOCATION_WINDOW_MIN_BYTES;

const _: () = assert!(TAIL_UNDURABLE_MAX_BYTES >= 2 * RECORD_SIZE_MAX_BYTES as u64);
const _: () = assert!(ALLOCATION_WINDOW_DEFAULT_BYTES >= ALLOCATION_WINDOW_MIN_BYTES);
const _: () = assert!(TAIL_READ_KEEP_BYTES.is_multiple_of(tail::TAIL_CHUNK_BYTES));
const _: () = assert!(tail::TAIL_CHUNK_BYTES.is_multiple_of(segments::BLOCK_BYTES));

/// When a send is acknowledged: after the fdatasync covering it, or once appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    Sync,
    Async,
}

/// One shard's store configuration.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// This shard's own directory (commitlog/, consumequeue/, checkpoint live below it).
    pub root_dir: PathBuf,
    /// Commitlog segment size; a multiple of 4096, at least `SEGMENT_SIZE_MIN_BYTES`.
    pub segment_size_bytes: u64,
    pub flush_mode: FlushMode,
    /// Async mode: longest time from an append to the write and the sync that cover it.
    pub flush_interval_ms: u64,
    /// Async mode: dirty bytes that start a flush before `flush_interval_ms` ends (the
    /// group-commit batch); at most `FLUSH_DIRTY_MAX_BYTES_LIMIT`.
    pub flush_dirty_max_bytes: u64,
    /// Written as STOREHOST in every record, used in offset msgIds.
    pub store_host: SocketAddrV4,
    pub consume_queue_units_per_file: u64,
    /// Tags code of a stored record, used when recovery rebuilds consume-queue units (the
    /// append path takes the caller's). Default: Java hashCode of the TAGS property.
    pub tags_code_of: fn(&StoredMessage<'_>) -> i64,
    /// Sizes and bound of the message index (`index.rs`).
    pub index: IndexConfig,
    /// Segment space kept allocated (and zero-filled while the store is quiet) ahead of the
    /// write position (`space.rs`); the rest of a segment stays a hole until writes near it.
    /// A multiple of 4096, at least `ALLOCATION_WINDOW_MIN_BYTES`.
    pub allocation_window_bytes: u64,
    /// Windows of `read_cache::WINDOW_BYTES` (1 MiB) the read cache keeps for pulls of
    /// durable records (`read_cache.rs`): consumer groups catching up at more places in the
    /// log than this read more of it than they consume. At least `READ_CACHE_WINDOWS_MIN`.
    pub read_cache_windows: usize,
    /// What `open` has done so far (recovery's progress), for whoever watches it.
    pub progress: Rc<OpenProgress>,
    /// Whether `open` keeps the recycled segment files it finds (`retention.rs`): true for a
    /// master that recycles. False turns them back into plain ones (`recovery::plain_again`):
    /// for a slave, whose log takes its master's records unsealed, and for a node with
    /// recycling turned off (after which a build that does not know recycled files can read
    /// the store).
    pub keep_recycled_segments: bool,
}

/// How far `Store::open` has got: every completed step of recovery moves `steps`, so a
/// watcher can tell a long recovery (steps keep coming) from a stuck one (they stop).
#[derive(Debug, Default)]
pub struct OpenProgress {
    /// Completed I/O steps (segment opens, reads of the scan, zeroing, writes).
    pub steps: std::cell::Cell<u64>,
    /// Commitlog bytes the scan has read and checked so far.
    pub scanned_bytes: std::cell::Cell<u64>,
    /// Commitlog bytes the scan will read at most (from its start to the end of the files).
    pub scan_total_bytes: std::cell::Cell<u64>,
    /// Set once recovery is done: where the log ends and how many bytes past the last valid
    /// record were cut.
    pub recovered: std::cell::Cell<Option<RecoverySummary>>,
}

impl OpenProgress {
    pub(crate) fn step(&self) {
        self.steps.set(self.steps.get() + 1);
    }
}

/// What recovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoverySummary {
    /// Where the scan started (the checkpoint's segment, or the first segment).
    pub scan_from: u64,
    /// The end of the valid log: appends continue here.
    pub end: u64,
    /// Whether the previous stop was clean (its checkpoint matched the end).
    pub clean: bool,
    /// Damaged regions in the middle of the log the scan stepped over, and their bytes.
    pub damaged_regions: u64,
    pub damaged_bytes: u64,
    /// The queues were taken from the clean stop's queue catalog (`catalog.rs`), not read
    /// from their directories.
    pub queues_from_catalog: bool,
}

impl StoreConfig {
    /// Defaults: 1 GiB segments, Async flush every 200 ms, 300 000 units per queue file.
    pub fn new(root_dir: PathBuf, store_host: SocketAddrV4) -> StoreConfig {
        StoreConfig {
            root_dir,
            segment_size_bytes: SEGMENT_SIZE_DEFAULT_BYTES,
            flush_mode: FlushMode::Async,
            flush_interval_ms: 200,
            flush_dirty_max_bytes: flusher::FLUSH_DIRTY_BYTES_MAX,
            store_host,
            consume_queue_units_per_file: CONSUME_QUEUE_UNITS_PER_FILE_DEFAULT,
            tags_code_of: record::tags_code_from_properties,
            index: IndexConfig::default(),
            allocation_window_bytes: ALLOCATION_WINDOW_DEFAULT_BYTES,
            read_cache_windows: READ_CACHE_WINDOWS_DEFAULT,
            progress: Rc::default(),
            keep_recycled_segments: true,
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        let size = self.segment_size_bytes;
        if !size.is_multiple_of(segments::BLOCK_BYTES) || size < SEGMENT_SIZE_MIN_BYTES {
            return Err(StoreError::Config(format!(
                "segment_size_bytes {size} must be a multiple of 4096 and at least \
                 {SEGMENT_SIZE_MIN_BYTES}"
            )));
        }
        let dirty = self.flush_dirty_max_bytes;
        if !(segments::BLOCK_BYTES..=FLUSH_DIRTY_MAX_BYTES_LIMIT).contains(&dirty) {
            return Err(StoreError::Config(format!(
                "flush_dirty_max_bytes {dirty} must be between {} and \
                 {FLUSH_DIRTY_MAX_BYTES_LIMIT}",
                segments::BLOCK_BYTES
            )));
        }
        let window = self.allocation_window_bytes;
        if !window.is_multiple_of(segments::BLOCK_BYTES) || window < ALLOCATION_WINDOW_MIN_BYTES {
            return Err(StoreError::Config(format!(
                "allocation_window_bytes {window} must be a multiple of 4096 and at least \
                 {ALLOCATION_WINDOW_MIN_BYTES}"
            )));
        }
        if self.read_cache_windows < READ_CACHE_WINDOWS_MIN {
            return Err(StoreError::Config(format!(
                "read_cache_windows {} must be at least {READ_CACHE_WINDOWS_MIN}",
                self.read_cache_windows
            )));
        }
        if self.consume_queue_units_per_file == 0 || self.flush_interval_ms == 0 {
            return Err(StoreError::Config(
                "consume_queue_units_per_file and flush_interval_ms must be positive".into(),
            ));
        }
        self.index.validate().map_err(StoreError::Config)
    }
}

/// The source of time for a shard: store timestamps, and everything the broker on that
/// shard reads the time for (client expiry, long-poll deadlines, transaction checks). Tests
/// replace it with a clock they move by hand.
pub trait Clock {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Milliseconds on a clock that never goes backwards (deadlines, timers).
    fn monotonic_ms(&self) -> u64 {
        crate::runtime::monotonic_ms()
    }
}

/// Wall-clock time.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

/// A message as the broker hands it to the store.
pub struct MessageToStore<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddrV4,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: &'a [u8],
    /// Already-encoded properties string.
    pub properties: &'a [u8],
    /// Consume-queue tag hash, computed by the caller.
    pub tags_code: i64,
}

/// Where an append landed.
#[derive(Debug, Clone, Copy)]
pub struct AppendResult {
    pub physical_offset: CommitLogOffset,
    pub queue_offset: QueueOffset,
    pub record_size_bytes: u32,
    pub store_timestamp_ms: i64,
    /// physical_offset + record size: what to pass to `wait_durable`.
    pub end_offset: CommitLogOffset,
}

/// Upper bounds (µs, inclusive) of the buckets durable writes are counted in: a virtio or
/// NVMe write with its cache flush takes 0.1–2 ms, a struggling disk tens to hundreds.
pub const FLUSH_LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];

/// Counters of one store.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreStats {
    pub put_messages: u64,
    pub put_bytes: u64,
    pub flushes: u64,
    /// Messages made durable by those flushes.
    pub flushed_messages: u64,
    pub durable_offset: u64,
    pub write_offset: u64,
    pub zero_filled_bytes: u64,
    pub checkpoints: u64,
    /// Time flushes took from submission to reaping (their writes, fdatasyncs and the
    /// wake-up of the reaper: where a SYNC_FLUSH send's wait goes), in microseconds.
    pub flush_micros: u64,
    /// Those flushes by how long each took (bounds `FLUSH_LATENCY_BUCKETS_US`; the last
    /// bucket: longer than all).
    pub flush_latency_buckets: [u64; FLUSH_LATENCY_BUCKETS_US.len() + 1],
    /// What the commitlog's io_uring ring handed the kernel (commit_ring.rs).
    pub ring: commit_ring::RingCounts,
    /// Commitlog segments deleted by retention.
    pub segments_deleted: u64,
    /// Of those, the ones whose file became a later segment (`retention.rs`, recycling).
    pub segments_recycled: u64,
    /// Damaged records a pull met and did not serve (`pull::record_fault`).
    pub corrupt_records: u64,
    /// Pulls' lookups of cold commitlog windows found in the read cache, and those that read
    /// one from disk themselves (read_cache.rs; read-ahead reads count in neither).
    pub read_cache_hits: u64,
    pub read_cache_misses: u64,
    /// Of those misses, the ones of a window evicted lately: the windows the pulls read did
    /// not all fit, and read ahead was paused for a while (read_cache.rs).
    pub read_cache_refetches: u64,
    /// Of those misses, the ones with no room for their window (every window held was in
    /// use, or being read): the pull read its own records' span past the cache.
    pub read_cache_bypasses: u64,
    /// Of those, the ones that took a span another pull had read or was reading (the pulls
    /// of one group's queues read the same stretch of the log at once).
    pub read_cache_span_shares: u64,
}

impl StoreStats {
    /// Average messages carried by one flush (the group-commit factor).
    pub fn messages_per_flush(&self) -> f64 {
        if self.flushes == 0 {
            0.0
        } else {
            self.flushed_messages as f64 / self.flushes as f64
        }
    }
}

/// Memory one store holds, by holder, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Commitlog tail chunks: appended bytes not yet durable or kept for readers, the chunk
    /// being filled, spares (heap, DMA-aligned).
    pub commitlog_tail: u64,
    /// Windows of cold commitlog kept for pulls (heap).
    pub read_cache: u64,
    /// Consume-queue file bytes mapped with blocks behind them (page cache the maps may hold
    /// resident).
    pub consume_queue_maps: u64,
    /// Index file bytes mapped likewise.
    pub index_maps: u64,
}

impl LogState {
    /// Whether appends may go on: not after a failed write (its first cause), not while the
    /// store closes.
    pub(crate) fn writable(&self) -> Result<(), StoreError> {
        if let Some(poison) = &self.poison {
            return Err(poison.to_error());
        }
        if self.closing {
            return Err(StoreError::Closed);
        }
        if let Some(reset) = &self.reset {
            return Err(StoreError::Resetting {
                offset: reset.offset,
            });
        }
        Ok(())
    }
}

/// Commitlog state shared by the append path, the readers and the flusher.
pub(crate) struct LogState {
    pub(crate) tail: Tail,
    pub(crate) segments: Segments,
    pub(crate) min_physical_offset: u64,
    pub(crate) last_store_timestamp_ms: i64,
    pub(crate) stats: StoreStats,
    pub(crate) poison: Option<Poison>,
    /// Allocated space ahead of the writes, and whether a full disk refuses them.
    pub(crate) space: Space,
    pub(crate) closing: bool,
    pub(crate) flush: FlushState,
    /// The only path commitlog files are written through (see `commit_ring.rs`).
    pub(crate) ring: CommitRing,
    scratch: Vec<u8>,
    /// A reset asked for (`Store::reset_empty_at`, reset.rs) and not yet past its wipe:
    /// meanwhile appends are refused, `kick` starts no flush and retention picks no segment.
    pub(crate) reset: Option<Rc<reset::ResetRequest>>,
    /// Resets done so far: an allocation or segment creation begun before one (by
    /// `start_empty_at`, beside the flusher) sees the count move and drops what it did.
    pub(crate) resets: u64,
    /// Retention is deleting a segment and the files that point into it (a reset waits
    /// for that to end: its removals are by name).
    pub(crate) deleting_segment: bool,
}

pub(crate) struct Inner {
    pub(crate) config: StoreConfig,
    clock: Rc<dyn Clock>,
    pub(crate) log: RefCell<LogState>,
    pub(crate) queues: RefCell<QueueTable>,
    pub(crate) index: RefCell<index::Index>,
    pub(crate) notify: Rc<Notify>,
    /// Wakes the task that makes the files of new queues (queue_files.rs).
    pub(crate) queue_files: Rc<crate::sync::Signal>,
    /// Reaps the commitlog ring from busy loops (`runtime::run_poll_hooks`, which holds it
    /// weakly: it goes with the store).
    reap_hook: Rc<dyn Fn()>,
    /// Told of every message appended to a queue (`Store::set_arrival_listener`).
    pub(crate) arrival_listener: RefCell<Option<ArrivalListener>>,
    /// Told whenever a commitlog segment file is created (`Store::set_segment_listener`).
    pub(crate) segment_listener: RefCell<Option<Rc<dyn Fn()>>>,
    /// Whether the ring's reaper task waits idle (flusher.rs).
    pub(crate) reaper: Rc<flusher::ReaperState>,
    /// Windows of durable commitlog read for pulls of cold data (read_cache.rs).
    pub(crate) read_cache: RefCell<read_cache::ReadCache>,
    /// Held while the store lives: threads working beside it (`warm_queue_pages`) hold it
    /// weakly and stop once it is gone.
    alive: std::sync::Arc<()>,
}

/// Called with (topic, queue id, queue offset) of every message the store appends, once it
/// is readable: RocketMQ's MessageArrivingListener. The broker wakes the pulls parked on
/// that queue with it; no caller of `append` has to remember to.
pub type ArrivalListener = Rc<dyn Fn(&str, QueueId, QueueOffset)>;

/// One shard's store. Cloning is cheap (a reference count).
#[derive(Clone)]
pub struct Store {
    inner: Rc<Inner>,
}

/// Used fraction (0..=1) of the filesystem holding `path`, as `df` and RocketMQ's
/// getDiskPartitionSpaceUsedPercent compute it: used / (used + available to users), where
/// used = total − free (statvfs); the blocks reserved for root count as neither.
pub fn disk_used_ratio(path: &std::path::Path) -> Option<f64> {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the struct we pass; the name is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(name.as_ptr(), &mut stat) } != 0 || stat.f_blocks == 0 {
        return None;
    }
    let used = stat.f_blocks.saturating_sub(stat.f_bfree) as f64;
    let entire = used + stat.f_bavail as f64;
    if entire <= 0.0 {
        return None;
    }
    Some((used / entire).clamp(0.0, 1.0))
}

pub(crate) fn validate_topic(topic: &str) -> Result<(), StoreError> {
    let bad = topic.is_empty()
        || topic.len() > TOPIC_NAME_MAX_BYTES
        || topic == "."
        || topic == ".."
        || topic.contains(['/', '\0']);
    if bad {
        return Err(StoreError::InvalidTopic(topic.to_string()));
    }
    Ok(())
}

/// After a start from the queue catalog, which read no queue file, reads in the pages each
/// queue's first pull and next append touch, on a thread of its own (fanning out): the shard
/// serves meanwhile. Without it, the first pull of each queue after a reboot waited on the
/// shard for a directory block, an inode and a page (a catch-up of 160,000 queues took 25 s
/// instead of 7 s). It stops once the store is gone.
fn warm_queue_pages(inner: &Rc<Inner>) {
    let pages = inner.queues.borrow().pages_in_use();
    let alive = std::sync::Arc::downgrade(&inner.alive);
    let root = inner.config.root_dir.clone();
    let started = std::time::Instant::now();
    let spawned = std::thread::Builder::new()
        .name("queue-warm-up".into())
        .spawn(move || {
            // Behind the shard it shares a core with: SCHED_IDLE (its fan-out threads
            // inherit it) runs only when the core has nothing else to run.
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: plain syscall on this thread; its failure only leaves the priority.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            let files = pages.len();
            let read = consume_queue::read_pages(pages, &|| alive.strong_count() > 0);
            // The list (tens of MB at 80,000 queues) and the catalog's, freed, would stay in
            // glibc's arenas: ~40 MB of RSS for good after a start.
            crate::runtime::trim_free_memory();
            log::info!(
                "store {}: read in the pages in use of {read} of {files} queue files in \
                 {:.2} s (after a start from the queue catalog)",
                root.display(),
                started.elapsed().as_secs_f64()
            );
        });
    if let Err(error) = spawned {
        log::warn!("store: no thread to read in the queues' pages ({error}); each is read at its first use");
    }
}

impl Store {
    /// Opens (or creates) the store in `config.root_dir`: primes glommio's poll probe, runs
    /// recovery, and spawns the flusher on the current executor.
    pub async fn open(config: StoreConfig) -> Result<Store, StoreError> {
        Store::open_with_clock(config, Rc::new(SystemClock)).await
    }

    /// `open` with a replaceable clock for store timestamps.
    pub async fn open_with_clock(
        config: StoreConfig,
        clock: Rc<dyn Clock>,
    ) -> Result<Store, StoreError> {
        config.validate()?;
        let recovered = recovery::recover(&config).await?;
        let (ring, wake_rx) = CommitRing::new(!crate::runtime::io_worker_cpus().is_empty())
            .map_err(|error| {
                StoreError::Io(error::os_error_with_context(
                    error.raw_os_error().unwrap_or(libc::EIO),
                    "setting up the commitlog's io_uring ring".to_string(),
                ))
            })?;
        let log = LogState {
            tail: recovered.tail,
            segments: recovered.segments,
            min_physical_offset: recovered.min_physical_offset,
            last_store_timestamp_ms: 0,
            stats: StoreStats::default(),
            poison: None,
            space: Space::new(recovered.allocated_end, config.allocation_window_bytes),
            closing: false,
            flush: FlushState::new(
                recovered.durable_end,
                recovered.zero_fill_next,
                recovered.unsynced_files,
                checkpoint::synced_covers(&config.root_dir),
            ),
            ring,
            scratch: Vec::new(),
            reset: None,
            resets: 0,
            deleting_segment: false,
        };
        let read_cache = read_cache::ReadCache::new(config.read_cache_windows);
        let inner = Rc::new_cyclic(|weak: &std::rc::Weak<Inner>| {
            let weak = weak.clone();
            Inner {
                config,
                clock,
                log: RefCell::new(log),
                queues: RefCell::new(recovered.queues),
                index: RefCell::new(recovered.index),
                notify: Rc::new(Notify::default()),
                queue_files: Rc::default(),
                reap_hook: Rc::new(move || {
                    if let Some(inner) = weak.upgrade() {
                        flusher::reap(&inner);
                    }
                }),
                arrival_listener: RefCell::new(None),
                segment_listener: RefCell::new(None),
                reaper: Rc::default(),
                read_cache: RefCell::new(read_cache),
                alive: std::sync::Arc::new(()),
            }
        });
        crate::runtime::register_poll_hook(&inner.reap_hook);
        // The first window of space before any append (a full disk starts the store in its
        // full state: reads served, sends refused until space returns).
        flusher::allocate_ahead(&inner).await;
        if let Some(poison) = inner.log.borrow().poison.as_ref() {
            return Err(poison.to_error());
        }
        flusher::spawn(&inner, wake_rx);
        idle_maps::spawn(&inner);
        queue_files::spawn(&inner);
        // New queues recovery found wait for their files like those of a creation storm.
        if inner.queues.borrow().files_to_make() > 0 {
            inner.queue_files.notify();
        }
        if recovered.settling {
            // Reads in the pages the shard would wait for, as the warm-up does, and more.
            queue_files::spawn_settling(&inner);
        } else if recovered.queues_from_catalog {
            warm_queue_pages(&inner);
        }
        Ok(Store { inner })
    }

    /// How many new queues hold their units in memory while their files are made
    /// (`queue_files.rs`).
    pub fn queues_awaiting_files(&self) -> usize {
        self.inner.queues.borrow().queues_awaiting_files()
    }

    /// Appends one message (synchronous: no I/O waits). The message is readable at once and
    /// durable once `wait_durable(result.end_offset)` resolves.
    pub fn append(&self, msg: &MessageToStore<'_>) -> Result<AppendResult, StoreError> {
        self.append_with_keys(msg, MessageKeys::of(msg.properties))
    }

    /// [`Store::append`] with the message's index keys already read from its properties by
    /// the caller (they must be what [`MessageKeys::of`] finds in them).
    pub fn append_with_keys(
        &self,
        msg: &MessageToStore<'_>,
        keys: MessageKeys<'_>,
    ) -> Result<AppendResult, StoreError> {
        validate_topic(msg.topic)?;
        if msg.body.len() > MESSAGE_SIZE_MAX_BYTES {
            return Err(StoreError::MessageTooLarge {
                size_bytes: msg.body.len(),
                limit_bytes: MESSAGE_SIZE_MAX_BYTES,
            });
        }
        if msg.properties.len() > STORED_PROPERTIES_MAX_BYTES {
            return Err(StoreError::PropertiesTooLarge {
                size_bytes: msg.properties.len(),
                limit_bytes: STORED_PROPERTIES_MAX_BYTES,
            });
        }
        if msg.properties.last() == Some(&0) {
            // Recovery reads a trailing NUL as the mark of a torn write (see recovery.rs).
            return Err(StoreError::PropertiesInvalid(
                "properties end with a NUL byte".into(),
            ));
        }
        let inner = &*self.inner;
        let plain_size =
            record::encoded_size(msg.body.len(), msg.topic.len(), msg.properties.len());
        let segment_size = inner.config.segment_size_bytes;
        let mut log = inner.log.borrow_mut();
        log.writable()?;
        // In a recycled segment the record is sealed (`record::encode_sealed_to`).
        let sealed_size = record::encoded_size(
            msg.body.len(),
            msg.topic.len(),
            record::sealed_properties_len(msg.properties),
        );
        let largest = plain_size.max(sealed_size);
        if (largest + record::BLANK_HEADER_BYTES) as u64 > segment_size {
            // Only with segments smaller than a largest record (tests).
            return Err(StoreError::MessageTooLarge {
                size_bytes: largest,
                limit_bytes: segment_size as usize - record::BLANK_HEADER_BYTES,
            });
        }
        let end = log.tail.end();
        let segment_end = segments::align_down(end, segment_size) + segment_size;
        // A segment always keeps room for the blank filler header at its end.
        let size_in = |sealed: bool| if sealed { sealed_size } else { plain_size };
        let sealed_here = log.segments.sealed_at(end);
        let filler =
            if end + (size_in(sealed_here) + record::BLANK_HEADER_BYTES) as u64 > segment_end {
                segment_end - end
            } else {
                0
            };
        let physical_offset = end + filler;
        let sealed = if filler > 0 {
            log.segments.sealed_at(physical_offset)
        } else {
            sealed_here
        };
        let size = size_in(sealed);
        self.room_for(&log, physical_offset + size as u64)?;
        let keys = if index::indexes_sys_flag(msg.sys_flag) {
            keys
        } else {
            MessageKeys::none()
        };
        // Room in the index first: after this nothing below can fail half-way. The keys' hash
        // slots are then fetched into cache while the record is encoded (each is a random line
        // of the slot table, a cache miss when touched cold).
        let hashes = {
            let mut index = inner.index.borrow_mut();
            index.prepare(keys.as_slice().len(), physical_offset)?;
            index.hash_and_prefetch(msg.topic, keys.as_slice())
        };
        let unit = Unit {
            physical_offset,
            size_bytes: size as u32,
            tags_code: msg.tags_code,
        };
        let queue_offset = {
            let mut queues = inner.queues.borrow_mut();
            let (queue, began) = queues.get_or_begin(msg.topic, msg.queue_id)?;
            let queue_offset = queue.append(unit)?;
            if began {
                inner.queue_files.notify();
            }
            queue_offset
        };
        let store_timestamp_ms = inner.clock.now_ms().max(log.last_store_timestamp_ms);
        log.last_store_timestamp_ms = store_timestamp_ms;
        if filler > 0 {
            let mut header = [0u8; record::BLANK_HEADER_BYTES];
            header[..4].copy_from_slice(&(filler as i32).to_be_bytes());
            header[4..].copy_from_slice(&record::BLANK_MAGIC_CODE.to_be_bytes());
            log.tail.push(&header);
            log.tail
                .push_zeros(filler - record::BLANK_HEADER_BYTES as u64);
        }
        assert_eq!(log.tail.end(), physical_offset, "records are contiguous");
        let stored = StoredMessage {
            total_size: size as u32,
            body_crc: 0,
            queue_id: msg.queue_id,
            flag: msg.flag,
            queue_offset,
            physical_offset,
            sys_flag: msg.sys_flag,
            born_timestamp_ms: msg.born_timestamp_ms,
            born_host: SocketAddr::V4(msg.born_host),
            store_timestamp_ms,
            store_host: SocketAddr::V4(inner.config.store_host),
            reconsume_times: msg.reconsume_times,
            prepared_transaction_offset: msg.prepared_transaction_offset,
            body: msg.body,
            topic: msg.topic,
            properties: msg.properties,
        };
        let mut scratch = std::mem::take(&mut log.scratch);
        log.tail.push_with(size, &mut scratch, |out| {
            if sealed {
                record::encode_sealed_to(&stored, out)
            } else {
                record::encode_to(&stored, out)
            }
        });
        log.scratch = scratch;
        log.stats.put_messages += 1;
        log.stats.put_bytes += size as u64;
        let end_offset = log.tail.end();
        {
            let mut index = inner.index.borrow_mut();
            index.add_hashed(&hashes, physical_offset, store_timestamp_ms);
            index.note_indexed(end_offset);
        }
        let wake_flusher = log.flush.note_append(
            inner.config.flush_mode,
            end_offset,
            inner.config.flush_dirty_max_bytes,
        );
        drop(log);
        // SYNC_FLUSH: the group commit starts now when enough is dirty and none is under way
        // (whose end starts the next); otherwise the flusher task decides.
        if wake_flusher && !flusher::kick(inner) {
            inner.notify.signal();
        }
        let listener = inner.arrival_listener.borrow().clone();
        if let Some(listener) = listener {
            listener(msg.topic, QueueId(msg.queue_id), QueueOffset(queue_offset));
        }
        Ok(AppendResult {
            physical_offset: CommitLogOffset(physical_offset),
            queue_offset: QueueOffset(queue_offset),
            record_size_bytes: size as u32,
            store_timestamp_ms,
            end_offset: CommitLogOffset(end_offset),
        })
    }

    /// Sets the listener told of every appended message (see [`ArrivalListener`]).
    pub fn set_arrival_listener(&self, listener: ArrivalListener) {
        *self.inner.arrival_listener.borrow_mut() = Some(listener);
    }

    /// Sets the listener told whenever a new commitlog segment file takes its space: the
    /// disk monitor measures then, since that is when the store's use of the disk jumps.
    pub fn set_segment_listener(&self, listener: Rc<dyn Fn()>) {
        *self.inner.segment_listener.borrow_mut() = Some(listener);
    }

    /// Resolves once the bytes waiting for the disk are down to half of
    /// `TAIL_UNDURABLE_MAX_BYTES` (room for appends refused as `Busy`), or the store fails.
    pub fn room(&self) -> impl std::future::Future<Output = ()> + 'static {
        let store = self.clone();
        let target = self
            .inner
            .log
            .borrow()
            .tail
            .end()
            .saturating_sub(TAIL_UNDURABLE_MAX_BYTES / 2);
        async move {
            let _ = store.wait_durable(CommitLogOffset(target)).await;
        }
    }

    /// Resolves once a write + fdatasync covering `end_offset` has completed.
    pub async fn wait_durable(&self, end_offset: CommitLogOffset) -> Result<(), StoreError> {
        flusher::wait_durable(&self.inner, end_offset.0).await
    }

    /// Resolves once everything below `end_offset` is written to its segment file, where a
    /// kill of the process cannot take it (under ASYNC_FLUSH, written now rather than within
    /// `flush_interval_ms`; not synced: see `wait_durable`).
    pub async fn wait_written(&self, end_offset: CommitLogOffset) -> Result<(), StoreError> {
        flusher::wait_written(&self.inner, end_offset.0).await
    }

    /// Everything below this commitlog offset is written to its segment file (at or past
    /// `durable_offset`).
    pub fn written_offset(&self) -> CommitLogOffset {
        CommitLogOffset(self.inner.log.borrow().flush.written_end)
    }

    /// This store's clock (the shard's source of time).
    pub fn clock(&self) -> Rc<dyn Clock> {
        self.inner.clock.clone()
    }

    pub fn flush_mode(&self) -> FlushMode {
        self.inner.config.flush_mode
    }

    /// The settings the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Units written to the queue (the next queue offset); 0 for an unknown queue.
    pub fn max_queue_offset(&self, topic: &str, queue_id: QueueId) -> QueueOffset {
        QueueOffset(
            self.inner
                .queues
                .borrow()
                .get(topic, queue_id.0)
                .map_or(0, |q| q.max_offset()),
        )
    }

    /// First queue offset still held; 0 for an unknown queue.
    pub fn min_queue_offset(&self, topic: &str, queue_id: QueueId) -> QueueOffset {
        QueueOffset(
            self.inner
                .queues
                .borrow()
                .get(topic, queue_id.0)
                .map_or(0, |q| q.min_offset()),
        )
    }

    /// Reads up to `max_messages` / `max_bytes` of the queue from `offset`, skipping units
    /// whose tags code fails `filter` (REMOTING.md §3.3).
    pub async fn get_messages(
        &self,
        topic: &str,
        queue_id: QueueId,
        offset: QueueOffset,
        max_messages: u32,
        max_bytes: u32,
        filter: &dyn Fn(i64) -> bool,
    ) -> Result<GetMessageResult, StoreError> {
        let filter = PullFilter {
            tags_code: filter,
            properties: None,
        };
        self.get_messages_matching(topic, queue_id, offset, max_messages, max_bytes, &filter)
            .await
    }

    /// `get_messages` with both filter stages: a unit is taken when its tags code passes
    /// `filter.tags_code` and, if `filter.properties` is given, its record's PROPERTIES pass
    /// it too (RocketMQ's isMatchedByConsumeQueue, then isMatchedByCommitLog). Only the
    /// second stage reads records to filter them.
    pub async fn get_messages_matching(
        &self,
        topic: &str,
        queue_id: QueueId,
        offset: QueueOffset,
        max_messages: u32,
        max_bytes: u32,
        filter: &PullFilter<'_>,
    ) -> Result<GetMessageResult, StoreError> {
        let request = pull::PullRequest {
            topic,
            queue_id: queue_id.0,
            offset: offset.0,
            max_messages,
            max_bytes,
        };
        pull::get_messages(&self.inner, &request, filter).await
    }

    /// Whether `bytes` of records (a batch) can be appended now without hitting the
    /// undurable-bytes limit: lets a caller refuse a whole batch instead of storing part of
    /// it. Allows for one segment filler on the way.
    pub fn check_room(&self, bytes: u64) -> Result<(), StoreError> {
        let log = self.inner.log.borrow();
        if let Some(poison) = &log.poison {
            return Err(poison.to_error());
        }
        let needed_end = log.tail.end() + bytes + RECORD_SIZE_MAX_BYTES as u64;
        self.room_for(&log, needed_end)
    }

    /// Whether the log may grow to `needed_end` now, as `append` decides: within the allocated
    /// space (else the flusher is told to look at allocation now), and within
    /// `TAIL_UNDURABLE_MAX_BYTES` of the durable end (recovery zeroes that much past the end
    /// it finds after a crash, `RECOVERY_ZERO_WINDOW_BYTES`).
    pub(crate) fn room_for(&self, log: &LogState, needed_end: u64) -> Result<(), StoreError> {
        if let Some(refusal) = log.space.refusal(needed_end) {
            // Only marks the flusher runnable: nothing here runs while the log is borrowed.
            self.inner.notify.signal();
            return Err(refusal);
        }
        let unflushed = needed_end - log.flush.durable_end;
        if unflushed > TAIL_UNDURABLE_MAX_BYTES {
            return Err(StoreError::Busy {
                unflushed_bytes: unflushed,
                limit_bytes: TAIL_UNDURABLE_MAX_BYTES,
            });
        }
        Ok(())
    }

    /// The consume-queue unit at `offset` of (topic, queue): (commitlog offset, record size,
    /// tags code); None when the queue does not hold that offset (below min or at/after max).
    /// Schedule queues keep the delivery time in the tags code, so their readers decide
    /// from the unit alone whether the record is due.
    pub fn queue_unit(
        &self,
        topic: &str,
        queue_id: QueueId,
        offset: QueueOffset,
    ) -> Result<Option<(CommitLogOffset, u32, i64)>, StoreError> {
        let offset = offset.0;
        let mut queues = self.inner.queues.borrow_mut();
        let Some(queue) = queues.get_mut(topic, queue_id.0) else {
            return Ok(None);
        };
        if offset < queue.min_offset() || offset >= queue.max_offset() {
            return Ok(None);
        }
        let unit = queue.read_unit(offset).map_err(StoreError::Io)?;
        Ok(unit.filter(|u| u.size_bytes > 0).map(|u| {
            (
                CommitLogOffset(u.physical_offset),
                u.size_bytes,
                u.tags_code,
            )
        }))
    }

    /// The whole stored record starting at `physical_offset`; None if no valid record does.
    pub async fn read_record(
        &self,
        physical_offset: CommitLogOffset,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        pull::read_record(&self.inner, physical_offset.0).await
    }

    /// SEARCH_OFFSET_BY_TIMESTAMP: lower (default): first offset stored at or after
    /// `timestamp_ms` (max offset if none); upper: last offset stored at or before it (min
    /// offset if none).
    pub async fn queue_offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: QueueId,
        timestamp_ms: i64,
        upper: bool,
    ) -> Result<QueueOffset, StoreError> {
        pull::offset_by_timestamp(&self.inner, topic, queue_id.0, timestamp_ms, upper)
            .await
            .map(QueueOffset)
    }

    /// Store time of the queue's first message; None for an empty or unknown queue.
    pub async fn earliest_store_time(
        &self,
        topic: &str,
        queue_id: QueueId,
    ) -> Result<Option<i64>, StoreError> {
        pull::earliest_store_time(&self.inner, topic, queue_id.0).await
    }

    /// QUERY_MESSAGE: the records of `query.topic` filed under `query.key` (a KEYS word or a
    /// UNIQ_KEY) in the message index, newest first, each read back and checked.
    pub async fn query_messages(
        &self,
        query: &MessageQuery<'_>,
    ) -> Result<QueryMessageResult, StoreError> {
        index_query::query_messages(&self.inner, query).await
    }

    /// When the message index was last written (QUERY_MESSAGE's indexLastUpdate* fields).
    pub fn index_last_update(&self) -> IndexLastUpdate {
        self.inner.index.borrow().last_update()
    }

    /// Retention hook: drops the index files whose entries all point below
    /// `physical_offset` (call it with the first commitlog offset still held once segments
    /// are deleted). Returns how many files went.
    pub fn expire_index_below(&self, physical_offset: u64) -> Result<usize, StoreError> {
        let paths = self.inner.index.borrow_mut().expire_below(physical_offset);
        for path in &paths {
            std::fs::remove_file(path)?;
        }
        Ok(paths.len())
    }

    /// Message index files held now (each `IndexConfig`-sized; at most `files_max`).
    pub fn index_file_count(&self) -> usize {
        self.inner.index.borrow().file_count()
    }

    /// Drops the topic's consume queues and their files, and asks for a checkpoint soon.
    /// Records stay in the commitlog until retention deletes them; a crash before that
    /// checkpoint can bring back units for the messages appended since the previous one.
    pub fn delete_topic(&self, topic: &str) {
        let removed = self.inner.queues.borrow_mut().delete_topic(topic);
        if let Err(error) = removed {
            log::warn!("store: delete_topic {topic}: removing its files failed: {error}");
        }
        self.inner.log.borrow_mut().flush.checkpoint_wanted = true;
        self.inner.notify.signal();
    }

    /// Queue ids of the topic that hold (or held) messages in this store.
    pub fn queue_ids(&self, topic: &str) -> Vec<QueueId> {
        self.inner
            .queues
            .borrow()
            .queue_ids(topic)
            .into_iter()
            .map(QueueId)
            .collect()
    }

    /// Everything below this commitlog offset is durable.
    pub fn durable_offset(&self) -> CommitLogOffset {
        CommitLogOffset(self.inner.log.borrow().flush.durable_end)
    }

    /// Commitlog end: the offset the next record is appended at (after a filler).
    pub fn max_physical_offset(&self) -> CommitLogOffset {
        CommitLogOffset(self.inner.log.borrow().tail.end())
    }

    pub fn min_physical_offset(&self) -> CommitLogOffset {
        CommitLogOffset(self.inner.log.borrow().min_physical_offset)
    }

    /// The oldest commitlog segment retention may delete now (sealed and durable, never the
    /// last file, its records' units counted by the synced checkpoint on disk), with its age;
    /// None when there is none (a synced checkpoint is then asked for, should one be missing).
    pub fn oldest_sealed_segment(&self) -> Option<SealedSegment> {
        retention::oldest_sealed(&self.inner)
    }

    /// Below this offset every record's consume-queue unit is counted by the synced
    /// checkpoint on disk: retention deletes no segment past it (retention.rs).
    pub fn synced_checkpoint_covers(&self) -> CommitLogOffset {
        CommitLogOffset(self.inner.log.borrow().flush.synced_covers)
    }

    /// Deletes `segment` (from `oldest_sealed_segment`) if it still is the oldest that may go,
    /// with the consume-queue and index files that only point into it; each queue's minimum
    /// offset moves past it. The files are removed off the shard's thread.
    ///
    /// With `recycle`, its file may become a segment after the last one instead of being
    /// removed (see retention.rs: for a master whose disk has room); `recycled_to` says so.
    pub async fn delete_oldest_segment(
        &self,
        segment: SealedSegment,
        recycle: bool,
    ) -> Result<Option<DeletedSegment>, StoreError> {
        retention::delete_oldest(&self.inner, segment, recycle).await
    }

    /// Why writes are refused for want of disk space right now (None: they are not).
    pub fn space_refusal(&self) -> Option<String> {
        self.inner.log.borrow().space.refusing().map(str::to_string)
    }

    /// Commitlog space allocated ahead of the writes ends here.
    pub fn allocated_end(&self) -> u64 {
        self.inner.log.borrow().space.allocated_end
    }

    /// The disk monitor's verdict: `Some(remark)` refuses appends (the disk is past its
    /// warning ratio), `None` lifts that refusal. Reads go on either way.
    pub fn set_over_ratio(&self, remark: Option<String>, used_ratio: f64) {
        let mut log = self.inner.log.borrow_mut();
        log.space.used_ratio = used_ratio;
        log.space.over_ratio = remark;
    }

    /// (total, available to users) bytes of the filesystem holding this store, measured now.
    pub fn disk_capacity_bytes(&self) -> Option<(u64, u64)> {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::CString::new(self.inner.config.root_dir.as_os_str().as_bytes());
        let name = name.ok()?;
        // SAFETY: statvfs writes into the struct we pass; the name is NUL-terminated.
        let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(name.as_ptr(), &mut stat) } != 0 {
            return None;
        }
        let block = stat.f_frsize as u64;
        Some((stat.f_blocks as u64 * block, stat.f_bavail as u64 * block))
    }

    /// Used fraction (0..=1) of the filesystem holding this store, measured now.
    pub fn disk_used_ratio(&self) -> Option<f64> {
        disk_used_ratio(&self.inner.config.root_dir)
    }

    /// Whether the store is poisoned (a failed durable write: only a restart clears it).
    pub fn poisoned(&self) -> Option<String> {
        self.inner
            .log
            .borrow()
            .poison
            .as_ref()
            .map(|p| p.text().to_string())
    }

    pub fn stats(&self) -> StoreStats {
        let log = self.inner.log.borrow();
        let cache = self.inner.read_cache.borrow();
        StoreStats {
            durable_offset: log.flush.durable_end,
            write_offset: log.tail.end(),
            read_cache_hits: cache.hits,
            read_cache_misses: cache.misses,
            read_cache_refetches: cache.misses_evicted_lately,
            read_cache_bypasses: cache.bypasses,
            read_cache_span_shares: cache.span_shares,
            ring: log.ring.counts,
            ..log.stats
        }
    }

    /// Memory this store holds, by holder.
    pub fn memory(&self) -> StoreMemory {
        StoreMemory {
            commitlog_tail: self.inner.log.borrow().tail.held_bytes(),
            read_cache: self.inner.read_cache.borrow().held_bytes(),
            consume_queue_maps: self.inner.queues.borrow().mapped_bytes(),
            index_maps: self.inner.index.borrow().mapped_bytes(),
        }
    }

    /// How long the flush under way has been running at `now` (zero between flushes): the
    /// time the oldest appends still waiting for the disk have waited at least, as far as
    /// the disk is to blame.
    pub fn flush_running_for(&self, now: std::time::Instant) -> std::time::Duration {
        self.inner
            .log
            .borrow()
            .flush
            .flush_started_at
            .map_or(std::time::Duration::ZERO, |started| {
                now.saturating_duration_since(started)
            })
    }

    /// Test hook: every later flush of dirty data first waits `delay`, as a slow disk would
    /// (None: back to full speed). Only with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    pub fn set_test_flush_delay(&self, delay: Option<std::time::Duration>) {
        self.inner.log.borrow_mut().flush.test_flush_delay = delay;
    }

    /// Test hook: makes the next commitlog write or fdatasync fail as the disk would. Only with
    /// the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, fault: InjectedFault) {
        self.inner.log.borrow_mut().flush.fault = Some(fault);
    }

    /// Final flush and checkpoint; the store refuses appends afterwards.
    pub async fn close(&self) -> Result<(), StoreError> {
        flusher::close(&self.inner).await
    }
}
