//! The message index: from a message's keys (`KEYS`, space-separated) and its client id
//! (`UNIQ_KEY`) to the commitlog offsets of the records carrying them, with their store time.
//! It serves QUERY_MESSAGE (by key or unique id, within a store-time range).
//!
//! Lives on the store's shard, beside the consume queues; `append` writes it synchronously,
//! so a record is findable as soon as it is readable. The design has RocketMQ's IndexFile
//! properties (hash slots heading linked lists of fixed-size entries, fixed-size files), in
//! a layout of our own.
//!
//! Files: `<root>/index/<20-digit commitlog offset of the first record indexed in it>`, each
//! `HEADER + slots × 4 + entries × 28` bytes, written through a shared memory map. The file
//! is sized at creation and its blocks are reserved (`posix_fallocate`) ahead of the entries
//! written, `INDEX_RESERVE_CHUNK_BYTES` at a time, so a store through the map never lands in
//! a hole of a full disk (a SIGBUS); a failed reservation is an ordinary `DiskFull` returned
//! before the record is appended. When a file is full the next one starts; at most
//! `index_files_max` files are kept (the oldest is dropped first), which bounds the index's
//! disk use, and `expire_below` drops files that only point below a commitlog offset (the
//! hook for segment retention).
//!
//! Header (64 bytes, big-endian):
//!
//! | Offset | Size | Field |
//! |---|---|---|
//! | 0 | 4 | magic `SMQI` |
//! | 4 | 4 | layout version (1) |
//! | 8 | 4 | hash slots |
//! | 12 | 4 | entry capacity |
//! | 16 | 4 | entries written |
//! | 20 | 4 | reserved |
//! | 24 | 8 | commitlog offset of the first entry's record |
//! | 32 | 8 | commitlog offset of the last entry's record |
//! | 40 | 8 | store time (ms) of the first entry |
//! | 48 | 8 | store time (ms) of the last entry |
//! | 56 | 8 | reserved |
//!
//! Then `slots` u32 heads (entry number, 1-based; 0 = empty), then the entries:
//!
//! | Offset | Size | Field |
//! |---|---|---|
//! | 0 | 8 | `key_hash(topic, key)` |
//! | 8 | 8 | commitlog offset of the record |
//! | 16 | 8 | store time of the record (ms) |
//! | 24 | 4 | previous entry of the same slot (1-based; 0 = none) |
//!
//! A lookup walks one slot's list from the newest entry back; hash collisions (and entries
//! whose record is gone) are resolved by the caller, which reads each record and compares
//! its topic and keys.
//!
//! Durability and recovery: the checkpoint syncs every index file written since the last one
//! and records an `IndexMark` (last file, entries in it) taken at the same instant as its
//! commitlog offset; since `append` indexes synchronously, every record below that offset is
//! indexed by the entries the mark covers. `open` trusts exactly that: files after the mark
//! are deleted, the last file is cut back to the marked count and, after an unclean stop,
//! its slot heads are rebuilt from its entries (heads written after the checkpoint may point
//! past the cut). Recovery then re-dispatches records from the marked offset on, and cuts the
//! index back to the recovered commitlog end. Without a mark (no checkpoint, or one written
//! before the index existed) the index is rebuilt from the first segment.
//!
//! Invariants: entries of a file are in commitlog order (asserted) and their store times never
//! decrease (a time that would is clamped); a slot head and a `previous` link always name an
//! earlier entry (a lookup stops at one that does not).

use std::collections::{BTreeSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;
use serde::{Deserialize, Serialize};

/// Bytes of a file's header.
pub const INDEX_HEADER_BYTES: usize = 64;
/// Bytes of one hash slot (a u32 entry number).
pub const INDEX_SLOT_BYTES: usize = 4;
/// Bytes of one entry.
pub const INDEX_ENTRY_BYTES: usize = 28;
/// Default hash slots per file: 512 KiB of heads. Every append reads and writes a random
/// slot, so the slots should stay in a core's cache (measured with 3 keys per message: about
/// +0.5 µs per append with 128 Ki slots, +1 µs with 1 Mi); lists then average 32 entries in a
/// full file, which only queries walk.
pub const INDEX_SLOTS_PER_FILE_DEFAULT: u32 = 1 << 17;
/// Default entries per file (112 MiB).
pub const INDEX_ENTRIES_PER_FILE_DEFAULT: u32 = 4 << 20;
/// Default bound on index files per store (about 3.7 GiB at the default size).
pub const INDEX_FILES_MAX_DEFAULT: usize = 32;
pub use crate::limits::INDEX_KEYS_PER_MESSAGE_MAX;
/// Smallest entry capacity: a file always holds every key of several messages, so the
/// entries of one record never span more than two files.
pub const INDEX_ENTRIES_PER_FILE_MIN: u32 = 4 * INDEX_KEYS_PER_MESSAGE_MAX as u32;
/// Disk space reserved ahead of the entries written, per reservation.
pub const INDEX_RESERVE_CHUNK_BYTES: u64 = 1 << 20;
/// Entries one lookup walks, at most, whatever the chains look like (a hostile key reused by
/// millions of messages makes long chains; the query asks for few results anyway).
pub const INDEX_LOOKUP_STEPS_MAX: usize = 1 << 20;

pub(crate) const INDEX_MAGIC: u32 = u32::from_be_bytes(*b"SMQI");
const INDEX_LAYOUT_VERSION: u32 = 1;
const DIR_NAME: &str = "index";
/// Properties string separators (REMOTING.md §5.4) and the KEYS word separator.
const NAME_VALUE_SEPARATOR: u8 = 0x01;
const PROPERTY_SEPARATOR: u8 = 0x02;
const KEY_SEPARATOR: char = ' ';
/// TRANSACTION_ROLLBACK_TYPE in the sysFlag: RocketMQ does not index rolled-back messages.
const TRANSACTION_TYPE_MASK: i32 = 0xC;
const TRANSACTION_ROLLBACK_TYPE: i32 = 0xC;

const _: () = assert!(INDEX_RESERVE_CHUNK_BYTES as usize >= INDEX_ENTRY_BYTES);
const _: () = assert!(INDEX_ENTRIES_PER_FILE_DEFAULT >= INDEX_ENTRIES_PER_FILE_MIN);

/// What the checkpoint records about the index (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexMark {
    /// Start (name) of the newest file; None when the index had no file.
    pub last_file: Option<u64>,
    /// Entries written in that file.
    pub entries: u32,
}

/// Sizes and bounds of a store's index.
#[derive(Debug, Clone, Copy)]
pub struct IndexConfig {
    pub slots_per_file: u32,
    pub entries_per_file: u32,
    pub files_max: usize,
}

impl IndexConfig {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.slots_per_file == 0
            || self.entries_per_file < INDEX_ENTRIES_PER_FILE_MIN
            || self.files_max < 2
        {
            return Err(format!(
                "index: slots_per_file must be positive, entries_per_file at least \
                 {INDEX_ENTRIES_PER_FILE_MIN}, files_max at least 2 (got {self:?})"
            ));
        }
        Ok(())
    }
}

impl Default for IndexConfig {
    fn default() -> IndexConfig {
        IndexConfig {
            slots_per_file: INDEX_SLOTS_PER_FILE_DEFAULT,
            entries_per_file: INDEX_ENTRIES_PER_FILE_DEFAULT,
            files_max: INDEX_FILES_MAX_DEFAULT,
        }
    }
}

/// The hash every entry of `key` in `topic` is filed under: 64 bits, eight bytes per step
/// (the append path hashes every key of every message), each part's length mixed in so that
/// ("a#b", "c") and ("a", "b#c") differ, and a final avalanche so that `hash % slots` spreads.
/// Stable: it is written to disk.
pub fn key_hash(topic: &str, key: &str) -> u64 {
    const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut hash = SEED;
    for part in [topic.as_bytes(), key.as_bytes()] {
        hash = mix(hash, part.len() as u64);
        let mut chunks = part.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            hash = mix(hash, u64::from_le_bytes(word));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        hash = mix(hash, u64::from_le_bytes(tail));
    }
    avalanche(hash)
}

fn mix(hash: u64, word: u64) -> u64 {
    (hash.rotate_left(5) ^ word).wrapping_mul(0x517C_C1B7_2722_0A95)
}

/// MurmurHash3's 64-bit finalizer.
fn avalanche(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    hash ^ (hash >> 33)
}

/// The keys RocketMQ indexes for a message: its UNIQ_KEY, then every non-empty word of KEYS;
/// at most `INDEX_KEYS_PER_MESSAGE_MAX`, duplicates dropped. The append path computes it for
/// every message, so the usual few keys are held inline (small enough to pass around by
/// value); a message with more spills them into a `Vec`.
pub struct MessageKeys<'a> {
    keys: InlineVec<&'a str>,
}

/// Keys a message carries without allocating for them (UNIQ_KEY and a few KEYS words).
const MESSAGE_KEYS_INLINE: usize = 6;

impl<'a> MessageKeys<'a> {
    /// No keys (a record that is not indexed).
    pub fn none() -> MessageKeys<'a> {
        MessageKeys {
            keys: InlineVec::default(),
        }
    }

    /// The keys of an encoded properties string, found in one pass over it.
    pub fn of(properties: &'a [u8]) -> MessageKeys<'a> {
        let (mut unique, mut words) = (None, None);
        for pair in properties.split(|&b| b == PROPERTY_SEPARATOR) {
            let Some(at) = pair.iter().position(|&b| b == NAME_VALUE_SEPARATOR) else {
                continue;
            };
            let (name, value) = (&pair[..at], &pair[at + 1..]);
            if name == b"UNIQ_KEY" && unique.is_none() {
                unique = std::str::from_utf8(value).ok();
            } else if name == b"KEYS" && words.is_none() {
                words = std::str::from_utf8(value).ok();
            }
        }
        MessageKeys::from_parts(unique, words)
    }

    /// The keys of a message whose UNIQ_KEY and KEYS values the caller has already read (the
    /// send path scans the properties once for everything it needs).
    pub fn from_parts(unique: Option<&'a str>, words: Option<&'a str>) -> MessageKeys<'a> {
        let mut keys = MessageKeys::none();
        let words = words.into_iter().flat_map(|k| k.split(KEY_SEPARATOR));
        for key in unique.into_iter().chain(words) {
            if keys.keys.len() == INDEX_KEYS_PER_MESSAGE_MAX {
                break;
            }
            if !key.is_empty() && !keys.keys.contains(&key) {
                keys.keys.push(key);
            }
        }
        keys
    }

    pub fn as_slice(&self) -> &[&'a str] {
        &self.keys
    }
}

/// A few values inline, more spilled into a `Vec`: what the append path keeps per message
/// (index keys and their hashes) without allocating for the usual handful.
#[derive(Default)]
pub(crate) struct InlineVec<T: Copy + Default> {
    inline: [T; MESSAGE_KEYS_INLINE],
    len: usize,
    /// Every value, once there are more than `MESSAGE_KEYS_INLINE`.
    spilled: Vec<T>,
}

impl<T: Copy + Default> InlineVec<T> {
    fn push(&mut self, value: T) {
        if self.spilled.is_empty() && self.len < MESSAGE_KEYS_INLINE {
            self.inline[self.len] = value;
        } else {
            if self.spilled.is_empty() {
                self.spilled.extend_from_slice(&self.inline);
            }
            self.spilled.push(value);
        }
        self.len += 1;
    }
}

impl<T: Copy + Default> std::ops::Deref for InlineVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }
}

/// One record's key hashes, in the order of its keys.
pub(crate) type KeyHashes = InlineVec<u64>;

/// Hints the CPU to load the cache line at the start of `bytes` (never faults, changes nothing).
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is only a hint; the pointer is in bounds of a live slice anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Whether RocketMQ indexes a record with this sysFlag (rolled-back halves are skipped).
pub fn indexes_sys_flag(sys_flag: i32) -> bool {
    sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_ROLLBACK_TYPE
}

/// One record's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) hash: u64,
    pub(crate) physical_offset: u64,
    pub(crate) store_timestamp_ms: i64,
    /// 1-based; 0 = none.
    pub(crate) previous: u32,
}

impl Entry {
    /// The entry in `bytes` (`INDEX_ENTRY_BYTES` of them, the layout in the module docs).
    pub(crate) fn decode(bytes: &[u8]) -> Entry {
        Entry {
            hash: read_u64(bytes, 0),
            physical_offset: read_u64(bytes, 8),
            store_timestamp_ms: read_u64(bytes, 16) as i64,
            previous: read_u32(bytes, 24),
        }
    }
}

pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(field)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(field)
}

fn file_name(start: u64) -> String {
    format!("{start:020}")
}

/// One index file and its memory map.
struct IndexFile {
    start: u64,
    path: PathBuf,
    file: File,
    map: MmapMut,
    slots: u32,
    capacity: u32,
    count: u32,
    /// Bytes of the file whose blocks are reserved.
    reserved_bytes: u64,
}

impl IndexFile {
    fn size_bytes(slots: u32, capacity: u32) -> u64 {
        (INDEX_HEADER_BYTES + slots as usize * INDEX_SLOT_BYTES) as u64
            + u64::from(capacity) * INDEX_ENTRY_BYTES as u64
    }

    fn entries_at(&self) -> usize {
        INDEX_HEADER_BYTES + self.slots as usize * INDEX_SLOT_BYTES
    }

    fn create(dir: &Path, start: u64, config: &IndexConfig) -> io::Result<IndexFile> {
        let path = dir.join(file_name(start));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let (slots, capacity) = (config.slots_per_file, config.entries_per_file);
        file.set_len(IndexFile::size_bytes(slots, capacity))?;
        // SAFETY: the file is private to this shard's store and is never truncated while
        // mapped (files are unmapped before they are deleted).
        let map = unsafe { MmapMut::map_mut(&file)? };
        // Slots are touched at random: no readahead (see consume_queue.rs's maps).
        map.advise(memmap2::Advice::Random)?;
        let mut index_file = IndexFile {
            start,
            path,
            file,
            map,
            slots,
            capacity,
            count: 0,
            reserved_bytes: 0,
        };
        let head_bytes = index_file.entries_at() as u64;
        index_file.reserve(head_bytes)?;
        // The slot table is written at random: every page of it soon.
        super::prefault::populate_ahead(&index_file.map, INDEX_HEADER_BYTES, head_bytes as usize);
        let header = &mut index_file.map[..INDEX_HEADER_BYTES];
        header[0..4].copy_from_slice(&INDEX_MAGIC.to_be_bytes());
        header[4..8].copy_from_slice(&INDEX_LAYOUT_VERSION.to_be_bytes());
        header[8..12].copy_from_slice(&slots.to_be_bytes());
        header[12..16].copy_from_slice(&capacity.to_be_bytes());
        index_file.write_count(0);
        Ok(index_file)
    }

    /// Opens an existing file; None (with a log line) when it is not an index file of ours.
    fn open(path: PathBuf, start: u64) -> io::Result<Option<IndexFile>> {
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = file.metadata()?.len();
        if len < INDEX_HEADER_BYTES as u64 {
            log::warn!("store: ignoring short index file {}", path.display());
            return Ok(None);
        }
        // SAFETY: as in `create`.
        let map = unsafe { MmapMut::map_mut(&file)? };
        map.advise(memmap2::Advice::Random)?;
        let (magic, version) = (read_u32(&map, 0), read_u32(&map, 4));
        let (slots, capacity, count) = (read_u32(&map, 8), read_u32(&map, 12), read_u32(&map, 16));
        let fits = slots > 0 && len == IndexFile::size_bytes(slots, capacity) && count <= capacity;
        if magic != INDEX_MAGIC || version != INDEX_LAYOUT_VERSION || !fits {
            log::warn!(
                "store: ignoring index file {} (not an index file of this version)",
                path.display()
            );
            return Ok(None);
        }
        Ok(Some(IndexFile {
            start,
            path,
            file,
            map,
            slots,
            capacity,
            count,
            // Blocks of an existing file were reserved when it was written; reserving again
            // from the entries written on is harmless.
            reserved_bytes: 0,
        }))
    }

    /// Reserves the file's blocks up to `end` bytes (rounded up to a chunk).
    fn reserve(&mut self, end: u64) -> io::Result<()> {
        if end <= self.reserved_bytes {
            return Ok(());
        }
        let size = self.map.len() as u64;
        let target = end
            .div_ceil(INDEX_RESERVE_CHUNK_BYTES)
            .saturating_mul(INDEX_RESERVE_CHUNK_BYTES)
            .min(size);
        reserve_blocks(
            &self.file,
            self.reserved_bytes,
            target - self.reserved_bytes,
        )?;
        self.reserved_bytes = target;
        super::prefault::populate_ahead(&self.map, end as usize, target as usize);
        Ok(())
    }

    fn write_count(&mut self, count: u32) {
        self.count = count;
        self.map[16..20].copy_from_slice(&count.to_be_bytes());
    }

    fn entry_range(&self, number: u32) -> std::ops::Range<usize> {
        assert!(
            number >= 1 && number <= self.capacity,
            "index entry in range"
        );
        let at = self.entries_at() + (number as usize - 1) * INDEX_ENTRY_BYTES;
        at..at + INDEX_ENTRY_BYTES
    }

    fn entry(&self, number: u32) -> Entry {
        Entry::decode(&self.map[self.entry_range(number)])
    }

    fn slot_at(&self, hash: u64) -> usize {
        INDEX_HEADER_BYTES + (hash % u64::from(self.slots)) as usize * INDEX_SLOT_BYTES
    }

    fn head(&self, hash: u64) -> u32 {
        read_u32(&self.map, self.slot_at(hash))
    }

    fn set_head(&mut self, hash: u64, number: u32) {
        let at = self.slot_at(hash);
        self.map[at..at + 4].copy_from_slice(&number.to_be_bytes());
    }

    fn first_offset(&self) -> Option<u64> {
        (self.count > 0).then(|| read_u64(&self.map, 24))
    }

    fn last_offset(&self) -> Option<u64> {
        (self.count > 0).then(|| read_u64(&self.map, 32))
    }

    fn first_timestamp_ms(&self) -> i64 {
        read_u64(&self.map, 40) as i64
    }

    fn last_timestamp_ms(&self) -> i64 {
        read_u64(&self.map, 48) as i64
    }

    fn is_full(&self) -> bool {
        self.count >= self.capacity
    }

    /// Appends an entry; the caller reserved its bytes and checked there is room. A store
    /// time below the last entry's (a clock stepped back across a restart) is filed as the
    /// last entry's, so that times along every list still never decrease.
    fn push(&mut self, hash: u64, physical_offset: u64, store_timestamp_ms: i64) {
        assert!(!self.is_full(), "index file has room");
        let mut store_timestamp_ms = store_timestamp_ms;
        if let Some(last) = self.last_offset() {
            assert!(physical_offset >= last, "index entries in commitlog order");
            store_timestamp_ms = store_timestamp_ms.max(self.last_timestamp_ms());
        }
        let number = self.count + 1;
        let previous = self.head(hash);
        let range = self.entry_range(number);
        let bytes = &mut self.map[range];
        bytes[0..8].copy_from_slice(&hash.to_be_bytes());
        bytes[8..16].copy_from_slice(&physical_offset.to_be_bytes());
        bytes[16..24].copy_from_slice(&(store_timestamp_ms as u64).to_be_bytes());
        bytes[24..28].copy_from_slice(&previous.to_be_bytes());
        self.set_head(hash, number);
        if number == 1 {
            self.map[24..32].copy_from_slice(&physical_offset.to_be_bytes());
            self.map[40..48].copy_from_slice(&(store_timestamp_ms as u64).to_be_bytes());
        }
        self.map[32..40].copy_from_slice(&physical_offset.to_be_bytes());
        self.map[48..56].copy_from_slice(&(store_timestamp_ms as u64).to_be_bytes());
        self.write_count(number);
    }

    /// Keeps the first `count` entries: slot heads are rebuilt from them, the header is
    /// rewritten from the last one kept.
    fn cut_to(&mut self, count: u32) {
        assert!(count <= self.capacity, "index cut within the file");
        let slots_end = self.entries_at();
        self.map[INDEX_HEADER_BYTES..slots_end].fill(0);
        for number in 1..=count {
            let hash = self.entry(number).hash;
            self.set_head(hash, number);
        }
        self.write_count(count);
        if count > 0 {
            let last = self.entry(count);
            self.map[32..40].copy_from_slice(&last.physical_offset.to_be_bytes());
            self.map[48..56].copy_from_slice(&(last.store_timestamp_ms as u64).to_be_bytes());
        }
    }

    /// Entries (of the first `count`) whose record starts below `end`: they form a prefix.
    fn count_below(&self, end: u64) -> u32 {
        let (mut low, mut high) = (0u32, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.entry(mid + 1).physical_offset < end {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Newest first: offsets of entries filed under `hash` stored within `[begin, end]`.
    fn select(&self, hash: u64, range: (i64, i64), limit: usize, out: &mut Vec<u64>) {
        let (begin, end) = range;
        let mut number = self.head(hash);
        let mut steps = 0;
        while number != 0 && number <= self.count && out.len() < limit {
            steps += 1;
            if steps > INDEX_LOOKUP_STEPS_MAX {
                break;
            }
            let entry = self.entry(number);
            if entry.store_timestamp_ms < begin {
                break;
            }
            if entry.hash == hash && entry.store_timestamp_ms <= end {
                out.push(entry.physical_offset);
            }
            // Links only ever point back; anything else is damage, and ends the walk.
            if entry.previous >= number {
                break;
            }
            number = entry.previous;
        }
    }
}

/// Reserves `len` bytes of blocks at `offset` (see the module docs).
fn reserve_blocks(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    if len == 0 {
        return Ok(());
    }
    let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // SAFETY: plain syscall on a descriptor we own.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) };
    match code {
        0 => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    }
}

/// When the index was last written: QUERY_MESSAGE's indexLastUpdate* response fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexLastUpdate {
    pub timestamp_ms: i64,
    pub physical_offset: u64,
}

/// The index of one store.
pub(crate) struct Index {
    dir: PathBuf,
    config: IndexConfig,
    /// Oldest first.
    files: VecDeque<IndexFile>,
    /// Every record below this commitlog offset is indexed.
    indexed_end: u64,
    /// Starts of the files written since the last `take_dirty_paths`.
    dirty: BTreeSet<u64>,
    /// A file was created or deleted since the last `take_dirty_paths`: the directory needs
    /// an fsync too.
    dir_dirty: bool,
}

impl Index {
    /// Bytes of the mapped index files that have blocks behind them.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.files.iter().map(|file| file.reserved_bytes).sum()
    }

    /// An index with no file under `root`, touching no file (a store emptied by a reset,
    /// which removes the files itself), with every record below `indexed_end` counted as
    /// indexed (the new log starts there).
    pub(crate) fn empty(root: &Path, config: IndexConfig, indexed_end: u64) -> Index {
        Index {
            dir: root.join(DIR_NAME),
            config,
            files: VecDeque::new(),
            indexed_end,
            dirty: BTreeSet::new(),
            dir_dirty: false,
        }
    }

    /// Opens the index under `root`, trusting what `mark` (from a checkpoint taken at
    /// commitlog offset `marked_offset`) covers; see the module docs. `clean`: the previous
    /// stop wrote that checkpoint last.
    pub(crate) fn open(
        root: &Path,
        config: IndexConfig,
        mark: Option<(IndexMark, u64)>,
        clean: bool,
    ) -> io::Result<Index> {
        let dir = root.join(DIR_NAME);
        fs::create_dir_all(&dir)?;
        let mut index = Index {
            dir,
            config,
            files: VecDeque::new(),
            indexed_end: 0,
            dirty: BTreeSet::new(),
            dir_dirty: false,
        };
        let mut starts = Vec::new();
        for entry in fs::read_dir(&index.dir)? {
            let name = entry?.file_name();
            if let Some(start) = name.to_str().and_then(|n| n.parse::<u64>().ok()) {
                starts.push(start);
            }
        }
        starts.sort_unstable();
        for start in starts {
            let path = index.dir.join(file_name(start));
            match IndexFile::open(path.clone(), start)? {
                Some(file) => index.files.push_back(file),
                None => fs::remove_file(&path)?,
            }
        }
        match mark {
            Some((mark, offset)) if index.trust(mark, offset, clean)? => index.indexed_end = offset,
            _ => {
                if !index.files.is_empty() {
                    log::warn!(
                        "store: index {} not covered by a checkpoint: rebuilding it \
                         from the commitlog",
                        index.dir.display()
                    );
                }
                index.remove_newer_than(None)?;
            }
        }
        Ok(index)
    }

    /// Applies a checkpoint mark taken at commitlog offset `marked_offset`; false when the
    /// files on disk do not match it (every entry it covers points below that offset).
    fn trust(&mut self, mark: IndexMark, marked_offset: u64, clean: bool) -> io::Result<bool> {
        self.remove_newer_than(mark.last_file)?;
        let Some(last_start) = mark.last_file else {
            return Ok(true);
        };
        let Some(last) = self.files.back_mut() else {
            return Ok(false);
        };
        if last.start != last_start || last.count < mark.entries {
            return Ok(false);
        }
        if !clean || last.count != mark.entries {
            last.cut_to(mark.entries);
            self.dirty.insert(last_start);
        }
        Ok(last.last_offset().is_none_or(|o| o < marked_offset))
    }

    /// Deletes the files that start after `keep_until` (all of them for None).
    fn remove_newer_than(&mut self, keep_until: Option<u64>) -> io::Result<()> {
        while let Some(file) = self.files.back() {
            if keep_until.is_some_and(|keep| file.start <= keep) {
                break;
            }
            self.remove_last()?;
        }
        Ok(())
    }

    fn remove_last(&mut self) -> io::Result<()> {
        match self.files.pop_back() {
            Some(file) => self.delete(file),
            None => Ok(()),
        }
    }

    fn remove_oldest(&mut self) -> io::Result<()> {
        match self.files.pop_front() {
            Some(file) => self.delete(file),
            None => Ok(()),
        }
    }

    /// Unmaps and deletes a file already taken out of `files`.
    fn delete(&mut self, file: IndexFile) -> io::Result<()> {
        self.dirty.remove(&file.start);
        self.dir_dirty = true;
        let path = file.path.clone();
        drop(file);
        fs::remove_file(path)
    }

    /// Every record below this commitlog offset is indexed.
    pub(crate) fn indexed_end(&self) -> u64 {
        self.indexed_end
    }

    /// Makes room for `keys` more entries of the record at `physical_offset`: rolls to a new
    /// file when the last one cannot take them, and reserves their disk blocks. After this,
    /// `add` of that many keys cannot fail.
    pub(crate) fn prepare(&mut self, keys: usize, physical_offset: u64) -> io::Result<()> {
        assert!(
            keys <= INDEX_KEYS_PER_MESSAGE_MAX,
            "keys per message bounded"
        );
        if keys == 0 {
            return Ok(());
        }
        let needs_file = self
            .files
            .back()
            .is_none_or(|f| f.count as usize + keys > f.capacity as usize);
        if needs_file {
            if self.files.len() >= self.config.files_max {
                let oldest = self.files.front().map(|f| f.path.display().to_string());
                log::warn!(
                    "store: index holds {} files (the limit): dropping the oldest, {}",
                    self.files.len(),
                    oldest.unwrap_or_default()
                );
                self.remove_oldest()?;
            }
            let file = IndexFile::create(&self.dir, physical_offset, &self.config)?;
            self.dir_dirty = true;
            self.files.push_back(file);
        }
        let last = self.files.back_mut().expect("a file exists now");
        let end = last.entries_at() as u64
            + (u64::from(last.count) + keys as u64) * INDEX_ENTRY_BYTES as u64;
        last.reserve(end)
    }

    /// Indexes the record at `physical_offset` under each of `keys`, after `prepare`.
    pub(crate) fn add(
        &mut self,
        topic: &str,
        keys: &[&str],
        physical_offset: u64,
        store_timestamp_ms: i64,
    ) {
        let hashes = self.hash_and_prefetch(topic, keys);
        self.add_hashed(&hashes, physical_offset, store_timestamp_ms);
    }

    /// The hashes of `keys` (for [`Index::add_hashed`]), with their slots in the file that
    /// `prepare` made ready asked into the CPU cache. Call after `prepare`.
    pub(crate) fn hash_and_prefetch(&self, topic: &str, keys: &[&str]) -> KeyHashes {
        let mut hashes = KeyHashes::default();
        for key in keys {
            let hash = key_hash(topic, key);
            if let Some(last) = self.files.back() {
                prefetch(&last.map[last.slot_at(hash)..]);
            }
            hashes.push(hash);
        }
        hashes
    }

    /// Adds one record's keys by their hashes (see [`key_hash`]).
    pub(crate) fn add_hashed(
        &mut self,
        hashes: &[u64],
        physical_offset: u64,
        store_timestamp_ms: i64,
    ) {
        if hashes.is_empty() {
            return;
        }
        let last = self.files.back_mut().expect("prepare made a file");
        for &hash in hashes {
            last.push(hash, physical_offset, store_timestamp_ms);
        }
        self.dirty.insert(last.start);
    }

    /// Records that everything below `end` is indexed (after a record that had nothing to
    /// index, too).
    pub(crate) fn note_indexed(&mut self, end: u64) {
        self.indexed_end = self.indexed_end.max(end);
    }

    /// Drops entries of records at or past `end` (recovery's cut of the commitlog).
    pub(crate) fn truncate_to(&mut self, end: u64) -> io::Result<()> {
        while self
            .files
            .back()
            .is_some_and(|f| f.first_offset().is_none_or(|o| o >= end))
        {
            self.remove_last()?;
        }
        if let Some(last) = self.files.back_mut() {
            let mut keep = last.count_below(end);
            // The search relies on entries in commitlog order; damaged ones may not be.
            while keep > 0 && last.entry(keep).physical_offset >= end {
                keep -= 1;
            }
            if keep < last.count {
                last.cut_to(keep);
                self.dirty.insert(last.start);
            }
        }
        self.indexed_end = end;
        Ok(())
    }

    /// Takes out the files whose entries all point below `physical_offset` (the retention
    /// hook: called with the first offset still held after commitlog segments went), never
    /// the last one. They are unmapped here; the caller removes the returned paths (off the
    /// shard's thread: an index file is hundreds of MiB).
    pub(crate) fn expire_below(&mut self, physical_offset: u64) -> Vec<std::path::PathBuf> {
        let mut paths = Vec::new();
        while self.files.len() > 1
            && self
                .files
                .front()
                .is_some_and(|f| f.last_offset().is_none_or(|o| o < physical_offset))
        {
            let Some(file) = self.files.pop_front() else {
                break;
            };
            self.dirty.remove(&file.start);
            self.dir_dirty = true;
            paths.push(file.path.clone());
        }
        paths
    }

    /// Newest first: up to `limit` commitlog offsets filed under `topic#key` with a store
    /// time in `[begin_ms, end_ms]`, deduplicated.
    pub(crate) fn lookup(
        &self,
        topic: &str,
        key: &str,
        (begin_ms, end_ms): (i64, i64),
        limit: usize,
    ) -> Vec<u64> {
        let hash = key_hash(topic, key);
        let mut found = Vec::new();
        for file in self.files.iter().rev() {
            if file.count == 0 {
                continue;
            }
            if file.last_timestamp_ms() < begin_ms {
                break;
            }
            if file.first_timestamp_ms() <= end_ms {
                file.select(hash, (begin_ms, end_ms), limit, &mut found);
            }
            if found.len() >= limit {
                break;
            }
        }
        let mut seen = BTreeSet::new();
        found.retain(|offset| seen.insert(*offset));
        found
    }

    /// The checkpoint's view of the index now.
    pub(crate) fn mark(&self) -> IndexMark {
        match self.files.back() {
            Some(file) => IndexMark {
                last_file: Some(file.start),
                entries: file.count,
            },
            None => IndexMark {
                last_file: None,
                entries: 0,
            },
        }
    }

    pub(crate) fn last_update(&self) -> IndexLastUpdate {
        self.files
            .back()
            .filter(|f| f.count > 0)
            .map_or(IndexLastUpdate::default(), |f| IndexLastUpdate {
                timestamp_ms: f.last_timestamp_ms(),
                physical_offset: f.last_offset().unwrap_or(0),
            })
    }

    /// Number of index files (for stats and tests).
    pub(crate) fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Paths of the files written since the last call (they need an fdatasync), and the
    /// directory when files were created or deleted in it (it needs an fsync).
    pub(crate) fn take_dirty_paths(&mut self) -> (Vec<PathBuf>, Option<PathBuf>) {
        let dirty = std::mem::take(&mut self.dirty);
        let files = self
            .files
            .iter()
            .filter(|f| dirty.contains(&f.start))
            .map(|f| f.path.clone())
            .collect();
        let dir = std::mem::take(&mut self.dir_dirty).then(|| self.dir.clone());
        (files, dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> IndexConfig {
        IndexConfig {
            slots_per_file: 7,
            entries_per_file: INDEX_ENTRIES_PER_FILE_MIN,
            files_max: 3,
        }
    }

    fn add(index: &mut Index, topic: &str, keys: &[&str], offset: u64, time: i64) {
        index.prepare(keys.len(), offset).unwrap();
        index.add(topic, keys, offset, time);
        index.note_indexed(offset + 100);
    }

    #[test]
    fn keys_of_a_message() {
        let props = b"KEYS\x01a b  a c\x02UNIQ_KEY\x01U1\x02TAGS\x01t\x02";
        assert_eq!(MessageKeys::of(props).as_slice(), ["U1", "a", "b", "c"]);
        assert!(MessageKeys::of(b"TAGS\x01t\x02").as_slice().is_empty());
        let many: String = (0..200).map(|i| format!("k{i} ")).collect();
        let props = format!("KEYS\u{1}{many}\u{2}");
        let keys = MessageKeys::of(props.as_bytes());
        assert_eq!(keys.as_slice().len(), INDEX_KEYS_PER_MESSAGE_MAX);
        let expected: Vec<String> = (0..INDEX_KEYS_PER_MESSAGE_MAX)
            .map(|i| format!("k{i}"))
            .collect();
        assert_eq!(keys.as_slice(), expected);
        let seven = MessageKeys::from_parts(Some("U"), Some("a b c d e f a"));
        assert_eq!(seven.as_slice(), ["U", "a", "b", "c", "d", "e", "f"]);
        assert!(indexes_sys_flag(0x8));
        assert!(!indexes_sys_flag(0xC));
        assert_ne!(key_hash("T", "a#b"), key_hash("T#a", "b"));
        assert_ne!(key_hash("T", "12345678"), key_hash("T", "123456780"));
        assert_eq!(
            key_hash("T", "k"),
            0xFC29_2336_F1C0_A15B,
            "stable: it is on disk"
        );
    }

    #[test]
    fn lookup_walks_chains_across_files_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = Index::open(dir.path(), small(), None, false).unwrap();
        for i in 0..600u64 {
            let key = format!("k{}", i % 10);
            add(&mut index, "T", &[&key, "all"], i * 100, 1_000 + i as i64);
        }
        assert_eq!(index.file_count(), 3, "bounded by files_max");
        let hits = index.lookup("T", "k3", (0, i64::MAX), 1000);
        // The oldest files were dropped: only what the last three files hold remains.
        assert!(hits.iter().all(|o| (o / 100) % 10 == 3));
        assert!(hits.windows(2).all(|w| w[0] > w[1]), "newest first");
        assert_eq!(index.lookup("T", "k3", (0, i64::MAX), 2).len(), 2);
        let ranged = index.lookup("T", "all", (1_500, 1_509), 1000);
        assert_eq!(
            ranged,
            (500..510).rev().map(|i| i * 100).collect::<Vec<_>>()
        );
        assert!(index.lookup("U", "k3", (0, i64::MAX), 10).is_empty());
        let removed = index.expire_below(599 * 100);
        assert_eq!(removed.len(), 2);
        for path in removed {
            std::fs::remove_file(path).unwrap();
        }
        assert!(!index.lookup("T", "all", (0, i64::MAX), 1000).is_empty());
    }

    #[test]
    fn mark_cut_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = Index::open(dir.path(), small(), None, false).unwrap();
        for i in 0..50u64 {
            add(&mut index, "T", &["x"], i * 100, i as i64);
        }
        let mark = index.mark();
        for i in 50..80u64 {
            add(&mut index, "T", &["x"], i * 100, i as i64);
        }
        drop(index);
        // An unclean stop after the mark: entries past it are dropped, heads rebuilt.
        let mut index = Index::open(dir.path(), small(), Some((mark, 5_000)), false).unwrap();
        assert_eq!(index.indexed_end(), 5_000);
        assert_eq!(index.lookup("T", "x", (0, i64::MAX), 1000).len(), 50);
        index.truncate_to(2_050).unwrap();
        assert_eq!(index.lookup("T", "x", (0, i64::MAX), 1000).len(), 21);
        add(&mut index, "T", &["x"], 2_100, 100);
        assert_eq!(index.lookup("T", "x", (0, i64::MAX), 1)[0], 2_100);
        index.truncate_to(0).unwrap();
        assert_eq!(index.file_count(), 0);
        // No mark: nothing is trusted.
        add(&mut index, "T", &["x"], 0, 1);
        drop(index);
        let index = Index::open(dir.path(), small(), None, false).unwrap();
        assert_eq!(index.file_count(), 0);
    }
}
