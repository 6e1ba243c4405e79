//! Consume queues: per (topic, queueId), the index of that queue's records in the commitlog.
//!
//! Lives on the shard that owns the store. Files are
//! `<root>/consumequeue/<topic>/<queueId>/<20-digit start byte offset>` (RocketMQ's naming: the
//! name is the first unit's index × 20), each sized for `units_per_file` units but holding
//! disk blocks only for the units written plus `CQ_RESERVE_CHUNK_BYTES` (reserved ahead with
//! posix_fallocate, so a store through the map never meets a hole), written through a shared
//! memory map (page cache is kernel-bounded memory; at most two files per queue
//! are mapped at a time, so mappings grow with the number of queues, not with the data).
//! Recovery and retention read units with pread instead (`probe_unit`): they look into every
//! queue, and a map is made only for a queue that is written or read by a consumer.
//!
//! Unit layout (20 bytes, big-endian, REMOTING.md §5.6):
//!
//! | Offset | Size | Field |
//! |---|---|---|
//! | 0 | 8 | commitlog offset of the record (i64) |
//! | 8 | 4 | record size in bytes (i32); 0 marks a unit never written |
//! | 12 | 8 | tags code (i64) |
//!
//! Invariants: units `[min_offset, max_offset)` are all written and their commitlog offsets
//! increase; units at or past `max_offset` are zero on disk after recovery.
//!
//! A queue may start past the first unit of its first file: a replica that joins its master
//! mid-log takes each queue at the master's offsets (`ConsumeQueue::start_at`). The first unit
//! of that file then holds a start mark (never a unit of a record: its size is 0, so every
//! reader takes it for a unit never written) naming the queue's first offset, which `open`
//! reads back as `min_offset`; the units between the mark and the start are a hole that holds
//! no disk blocks and is never written.
//!
//! | Offset | Size | Start mark field |
//! |---|---|---|
//! | 0 | 8 | the queue's first offset (i64), inside this file |
//! | 8 | 4 | 0 |
//! | 12 | 8 | `QUEUE_START_MARK` |

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use memmap2::MmapMut;

/// Units per queue, by topic and queue id (what a checkpoint records).
pub(crate) type QueueCounts = BTreeMap<String, BTreeMap<u32, u64>>;

/// Size of one consume-queue unit (RocketMQ's CQ_STORE_UNIT_SIZE).
pub const CQ_UNIT_BYTES: u64 = 20;
/// The page a queue file is read and probed in (`PageReader`, `prefetch_units`,
/// `pages_in_use`): what one random read brings into the page cache.
const PAGE_BYTES: u64 = 4096;

/// One consume-queue unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    pub physical_offset: u64,
    pub size_bytes: u32,
    pub tags_code: i64,
}

impl Unit {
    pub(crate) fn decode(bytes: &[u8]) -> Unit {
        let mut offset = [0u8; 8];
        let mut size = [0u8; 4];
        let mut tags = [0u8; 8];
        offset.copy_from_slice(&bytes[0..8]);
        size.copy_from_slice(&bytes[8..12]);
        tags.copy_from_slice(&bytes[12..20]);
        Unit {
            physical_offset: i64::from_be_bytes(offset) as u64,
            size_bytes: i32::from_be_bytes(size) as u32,
            tags_code: i64::from_be_bytes(tags),
        }
    }

    fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&(self.physical_offset as i64).to_be_bytes());
        out[8..12].copy_from_slice(&(self.size_bytes as i32).to_be_bytes());
        out[12..20].copy_from_slice(&self.tags_code.to_be_bytes());
    }

    /// Whether this unit points at a whole record below `end` (commitlog bytes).
    fn points_below(&self, end: u64) -> bool {
        self.size_bytes > 0 && self.physical_offset + u64::from(self.size_bytes) <= end
    }
}

/// A queue file's map. Its descriptor is closed once it is mapped (the map stays valid), so a
/// shard with tens of thousands of queues does not hold as many descriptors; the rare
/// reservation (every `CQ_RESERVE_CHUNK_BYTES` of units) opens it again by its path.
struct MappedFile {
    start_unit: u64,
    map: MmapMut,
    /// Bytes from the file's start known to have their blocks (`reserve_blocks`): units are
    /// written only below it.
    reserved_bytes: u64,
    /// When (`runtime::monotonic_ms`) the file was mapped or its blocks last reserved ahead:
    /// a queue that fills a reservation quickly has the next one faulted in ahead
    /// (`prefault.rs`).
    reserved_at_ms: u64,
}

/// One queue's units.
///
/// A node holds tens of thousands of these, most of them idle, so what is not needed most of
/// the time sits behind a pointer: the maps (`release_maps_if_idle` drops them) and what
/// `load` and recovery learned (`LoadNotes`). With the maps and notes inline the struct was
/// ~290 bytes, and the B-tree of a topic's queues holds it in nodes of 11 slots.
pub(crate) struct ConsumeQueue {
    dir: Box<Path>,
    units_per_file: u64,
    /// First unit index of every file on disk.
    files: FileStarts,
    /// The file appends go to.
    active: Option<Box<MappedFile>>,
    /// The last other file read (pulls of older data).
    cached: Option<Box<MappedFile>>,
    /// A map of this queue was used since the last `release_maps_if_idle`.
    used: bool,
    min_offset: u64,
    max_offset: u64,
    /// Files written since the last checkpoint synced them.
    dirty_files: FileStarts,
    /// The table's count of files made dirty since its last `take_dirty_paths` (shared by
    /// its queues; see `QueueTable::dirty_files`).
    dirty_count: Rc<Cell<usize>>,
    /// None when nothing is noted (every queue once written after a start).
    notes: Option<Box<LoadNotes>>,
    /// A queue created by an append whose directory and first file are still being made
    /// (queue_files.rs): its units so far, held here until the file is there. Also the units
    /// a `Settle::Holding` queue holds back from its files.
    awaiting_file: Option<Box<AwaitingFile>>,
    /// Whether the queue's files are known to hold nothing past its units (`Settle`).
    settle: Settle,
}

/// The units of a queue held in memory: from unit 0 on for a queue whose first file is
/// being made, from `from` on for one that holds them back from its files until it is
/// settled.
#[derive(Default)]
struct AwaitingFile {
    from: u64,
    units: Vec<Unit>,
}

/// Where a queue stands that a start after a restart of the machine took from the synced
/// checkpoint's queue catalog (`recovery.rs`), touching none of its files. Units written
/// before the power loss may follow its count in its files, pointing at records the log
/// lost, and files made after the checkpoint are not listed. Until the queue is settled
/// (`ConsumeQueue::settle`, with its directory listed and its last page read in off the
/// shard, `queue_files.rs`) no checkpoint is written, so a crash meanwhile recovers from the
/// same synced checkpoint and catalog again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Settle {
    /// The files hold nothing past the queue's units.
    #[default]
    Settled,
    /// Not settled: units written at or past its count wait in memory (`awaiting_file`),
    /// so the shard reads no page of its files for them.
    Holding,
    /// Not settled: units go to its files (it held `HOLD_UNITS_MAX`, or held none that a
    /// file could take); the settling still zeroes what follows them and lists its files.
    Writing,
}

/// Units a `Settle::Holding` queue keeps in memory (24 bytes each) before it writes them to
/// its file, waiting for that page on the shard: a hot queue does so once, the other
/// tens of thousands never.
const HOLD_UNITS_MAX: usize = 1024;

/// What `load` and recovery learned of a queue, kept until a write makes it stale.
#[derive(Default)]
struct LoadNotes {
    /// One past the highest unit recovery wrote again (`note_rebuilt`), 0 when none: the
    /// count it tries first once the scan is done.
    rebuilt_end: u64,
    /// Recovery found before its scan that the queue holds exactly this many units and
    /// nothing past them (`check_recorded`); forgotten at the next write or truncation.
    known_end: Option<u64>,
    /// The unit at this index (the first one held) as `load` read it; forgotten at the next
    /// write, or a truncation that cuts it.
    first_unit: Option<(u64, Unit)>,
}

/// First unit indexes of a queue's files, in order. A sorted vector: a queue holds one file
/// or a few, and a B-tree set took a 104-byte node for one file, in every queue.
#[derive(Default)]
struct FileStarts(Vec<u64>);

impl FileStarts {
    /// Adds `start`; false when it was there.
    fn insert(&mut self, start: u64) -> bool {
        match self.0.binary_search(&start) {
            Ok(_) => false,
            Err(at) => {
                // One slot at a time: most queues never hold a second file.
                self.0.reserve_exact(1);
                self.0.insert(at, start);
                true
            }
        }
    }

    fn remove(&mut self, start: u64) {
        if let Ok(at) = self.0.binary_search(&start) {
            self.0.remove(at);
        }
    }

    fn contains(&self, start: u64) -> bool {
        self.0.binary_search(&start).is_ok()
    }

    fn first(&self) -> Option<u64> {
        self.0.first().copied()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The starts past `start`, in order.
    fn after(&self, start: u64) -> &[u64] {
        let at = self.0.partition_point(|&held| held <= start);
        &self.0[at..]
    }

    /// Every start, in order, leaving none (and no allocation) behind.
    fn take(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.0)
    }
}

fn file_name(start_unit: u64) -> String {
    format!("{:020}", start_unit * CQ_UNIT_BYTES)
}

/// Blocks reserved ahead of the units written, per step: a queue file is sized for
/// `units_per_file` units (a sparse file) but holds disk only for what it holds, plus this.
pub const CQ_RESERVE_CHUNK_BYTES: u64 = 32 * 1024;

/// Tags code of a start mark (see the module doc): "SHMQSTRT", which no record's unit needs
/// to be told apart from, since a record's unit never has size 0.
pub const QUEUE_START_MARK: i64 = i64::from_be_bytes(*b"SHMQSTRT");

impl Unit {
    /// The start mark at `file_start` naming `first` as the queue's first offset.
    fn start_mark(first: u64) -> Unit {
        Unit {
            physical_offset: first,
            size_bytes: 0,
            tags_code: QUEUE_START_MARK,
        }
    }

    /// The first offset a start mark in the file starting at `file_start` names, if this is one.
    fn marked_start(&self, file_start: u64, units_per_file: u64) -> Option<u64> {
        let mark = self.size_bytes == 0 && self.tags_code == QUEUE_START_MARK;
        let inside =
            self.physical_offset > file_start && self.physical_offset < file_start + units_per_file;
        (mark && inside).then_some(self.physical_offset)
    }
}

/// Opens a queue file for reads (and writes when `write`) that leave its access time alone
/// (O_NOATIME): under relatime, the first read of a file written since its last read dirties
/// its inode, and a recovery reading 80,000 queue files sent 80,000 inodes to the journal
/// (3.7% of a warm start's samples). O_NOATIME is refused (EPERM) to a process that does not
/// own the file and lacks CAP_FOWNER: the file is then opened as usual.
fn open_without_atime(path: &std::path::Path, write: bool) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = OpenOptions::new();
    options.read(true).write(write);
    match options.clone().custom_flags(libc::O_NOATIME).open(path) {
        Err(error) if error.raw_os_error() == Some(libc::EPERM) => options.open(path),
        opened => opened,
    }
}

/// A failed map of a queue file; ENOMEM there is nearly always the process's map count at
/// vm.max_map_count (every queue with units holds one map): the error says so.
fn map_error(error: io::Error, path: &std::path::Path) -> io::Error {
    if error.raw_os_error() != Some(libc::ENOMEM) {
        return error;
    }
    let limit = fs::read_to_string("/proc/sys/vm/max_map_count").unwrap_or_default();
    io::Error::new(
        error.kind(),
        format!(
            "cannot map consume queue file {}: {error}: each queue holding units takes one map \
             and the process may not hold more than vm.max_map_count ({}); raise it \
             (sysctl -w vm.max_map_count=655360, as RocketMQ's os.sh does, or \
             `shardmq tune --apply`)",
            path.display(),
            limit.trim()
        ),
    )
}

/// `reserve_blocks` of `[from, size_bytes)` of the queue file at `path`.
fn reserve_at(path: &Path, from: u64, size_bytes: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    reserve_blocks(&file, from, size_bytes)
}

/// A queue file opened for reads (and, with `write`, writes) by offset, its readahead off: a
/// read of its unwritten part would otherwise fill the page cache with pages of zeros.
fn open_for_probes(path: &std::path::Path, write: bool) -> io::Result<fs::File> {
    use std::os::unix::io::AsRawFd;
    let file = open_without_atime(path, write)?;
    // SAFETY: plain syscall on a descriptor we own; advice only, its failure is harmless.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    Ok(file)
}

/// The end of what was written from `at` on, read a page at a time with `read` (which fills
/// its buffer from the given position and returns how many bytes it read): units past the end
/// follow it without gaps (appends go in order), so they end at the first page of zeros, and
/// the reads stop there instead of going through the whole 6 MB file (8,000 queues took 100 s
/// to start that way).
fn written_end(
    at: u64,
    size_bytes: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> io::Result<usize>,
) -> io::Result<u64> {
    let mut page = [0u8; PAGE_BYTES as usize];
    let (mut pos, mut stop) = (at, at);
    while pos < size_bytes {
        let page_end = (pos / PAGE_BYTES + 1) * PAGE_BYTES;
        let chunk = &mut page[..(page_end.min(size_bytes) - pos) as usize];
        let got = read(pos, chunk)?;
        match chunk[..got].iter().rposition(|&byte| byte != 0) {
            Some(last) => stop = pos + last as u64 + 1,
            None => break,
        }
        if got < chunk.len() {
            break; // a short file
        }
        pos = page_end;
    }
    Ok(stop)
}

/// Zeroes the file from `at` to the end of what was written past it (`written_end`), with
/// pread and pwrite; true when it wrote.
fn zero_to_first_zero_page(path: &std::path::Path, at: u64, size_bytes: u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let file = open_for_probes(path, true)?;
    let stop = written_end(at, size_bytes, |pos, buf| file.read_at(buf, pos))?;
    if stop == at {
        return Ok(false);
    }
    let zeros = vec![0u8; (stop - at) as usize];
    file.write_all_at(&zeros, at)?;
    Ok(true)
}

/// `zero_to_first_zero_page` through the file's map (held by a queue recovery wrote: dropping
/// the maps of 50,000 queues to zero them by path was a fifth of a recovery, in munmap and
/// the TLB shootdowns it sends to the other shards' cores). Only bytes found written are
/// stored to, so no store lands in a hole.
fn zero_mapped_to_first_zero_page(map: &mut [u8], at: u64) -> bool {
    let size_bytes = map.len() as u64;
    if at >= size_bytes {
        return false;
    }
    let stop = written_end(at, size_bytes, |pos, buf| {
        let from = pos as usize;
        buf.copy_from_slice(&map[from..from + buf.len()]);
        Ok(buf.len())
    })
    .unwrap_or(at);
    if stop == at {
        return false;
    }
    map[at as usize..stop as usize].fill(0);
    true
}

/// Allocates the blocks of `[from, size_bytes)` of the file: a store through a memory map into
/// a hole of a full disk would be a SIGBUS; an error here is an ordinary `DiskFull`, returned
/// before the record is appended.
fn reserve_blocks(file: &std::fs::File, from: u64, size_bytes: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let offset = libc::off_t::try_from(from).map_err(io::Error::other)?;
    let len = libc::off_t::try_from(size_bytes - from).map_err(io::Error::other)?;
    // SAFETY: plain syscall on a descriptor we own.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) };
    match code {
        0 => Ok(()),
        code => Err(io::Error::from_raw_os_error(code)),
    }
}

/// What a queue's directory holds (`QueueFiles::read`): gathered on any thread (`load`
/// reads many at once), made into a `ConsumeQueue` on the shard.
struct QueueFiles {
    dir: PathBuf,
    /// First unit index of every file on disk.
    files: FileStarts,
    min_offset: u64,
    /// What `ConsumeQueue::check_recorded` would find, when `load` was given the count.
    known_end: Option<u64>,
    /// The unit at `min_offset` and its index, when it lies in the first page.
    first_unit: Option<(u64, Unit)>,
}

/// The pages of one queue file read through one descriptor, the last one kept: `load` looks
/// at a queue's start mark, first unit and the units around the checkpoint's count with one
/// open (each open of a queue file was a path walk, and 80,000 queues a shard had four).
struct PageReader {
    file: fs::File,
    /// The page held, by index (zeros past the file's end).
    page: Option<(u64, [u8; PAGE_BYTES as usize])>,
}

impl PageReader {
    /// The bytes at `[at, at + len)` (within one page), zeros past the file's end.
    fn bytes(&mut self, at: u64, len: u64) -> io::Result<&[u8]> {
        use std::os::unix::fs::FileExt;
        let index = at / PAGE_BYTES;
        if self.page.as_ref().is_none_or(|(held, _)| *held != index) {
            let mut buf = [0u8; PAGE_BYTES as usize];
            let mut got = 0;
            while got < buf.len() {
                match self
                    .file
                    .read_at(&mut buf[got..], index * PAGE_BYTES + got as u64)?
                {
                    0 => break,
                    n => got += n,
                }
            }
            self.page = Some((index, buf));
        }
        let Some((_, buf)) = self.page.as_ref() else {
            unreachable!("a page was read just above")
        };
        let from = (at % PAGE_BYTES) as usize;
        Ok(&buf[from..from + len as usize])
    }

    fn unit(&mut self, index_in_file: u64) -> io::Result<Unit> {
        Ok(Unit::decode(
            self.bytes(index_in_file * CQ_UNIT_BYTES, CQ_UNIT_BYTES)?,
        ))
    }

    /// Whether everything from `at` to the end of its page (or `size_bytes`) is zero.
    fn zeros_from(&mut self, at: u64, size_bytes: u64) -> io::Result<bool> {
        let page_end = ((at / PAGE_BYTES + 1) * PAGE_BYTES).min(size_bytes);
        Ok(self.bytes(at, page_end - at)?.iter().all(|&b| b == 0))
    }
}

impl QueueFiles {
    /// Lists the files of the queue directory `dir` (which exists) and reads the start mark of
    /// its first one; with `recorded` (the checkpoint's count of the queue and its commitlog
    /// offset) also what `ConsumeQueue::check_recorded` needs, in the same open.
    fn read(
        dir: PathBuf,
        units_per_file: u64,
        recorded: Option<(u64, u64)>,
    ) -> io::Result<QueueFiles> {
        let mut files = FileStarts::default();
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let Some(start_byte) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue; // not ours (temp files, editors' leftovers)
            };
            if start_byte % (units_per_file * CQ_UNIT_BYTES) != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "consume queue file {:?} in {} does not start at a multiple of \
                         {units_per_file} units (was consume_queue_units_per_file changed?)",
                        name,
                        dir.display()
                    ),
                ));
            }
            files.insert(start_byte / CQ_UNIT_BYTES);
        }
        let mut found = QueueFiles {
            dir,
            files,
            min_offset: 0,
            known_end: None,
            first_unit: None,
        };
        if let Some(first) = found.files.first() {
            found.min_offset = first;
            let path = found.dir.join(file_name(first));
            if let Ok(file) = open_without_atime(&path, false) {
                let mut pages = PageReader { file, page: None };
                // A file cut short or unreadable here is looked at again by the probes.
                let _ = found.look_into_first_file(&mut pages, first, units_per_file, recorded);
            }
        }
        Ok(found)
    }

    /// The start mark (a queue a replica started mid-file begins where its first file's mark
    /// says), the first unit, and whether the queue ends exactly at `recorded`'s count: the
    /// unit before it points below the checkpoint's offset, it and the rest of its page are
    /// zeros, and it lies in the first and only file (else `check_recorded` looks again).
    fn look_into_first_file(
        &mut self,
        pages: &mut PageReader,
        first: u64,
        units_per_file: u64,
        recorded: Option<(u64, u64)>,
    ) -> io::Result<()> {
        if let Some(marked) = pages.unit(0)?.marked_start(first, units_per_file) {
            self.min_offset = marked;
        }
        let min = self.min_offset;
        if (min - first) * CQ_UNIT_BYTES + CQ_UNIT_BYTES <= PAGE_BYTES {
            self.first_unit = Some((min, pages.unit(min - first)?));
        }
        let Some((count, end)) = recorded else {
            return Ok(());
        };
        let only_file = self.files.len() == 1;
        if !only_file || count < min || count >= first + units_per_file {
            return Ok(());
        }
        let before = count == min || pages.unit(count - 1 - first)?.points_below(end);
        if before
            && pages.zeros_from(
                (count - first) * CQ_UNIT_BYTES,
                units_per_file * CQ_UNIT_BYTES,
            )?
        {
            self.known_end = Some(count);
        }
        Ok(())
    }
}

impl ConsumeQueue {
    /// Opens the queue in `dir`, creating the directory when missing. (`QueueTable::load`
    /// reads directories it has just listed: there a `create_dir_all`, a mkdir failing with
    /// EEXIST and a stat, was 8% of the start of 80,000 queues.)
    fn open(dir: PathBuf, units_per_file: u64) -> io::Result<ConsumeQueue> {
        fs::create_dir_all(&dir)?;
        Ok(ConsumeQueue::from_files(
            QueueFiles::read(dir, units_per_file, None)?,
            units_per_file,
        ))
    }

    fn from_files(found: QueueFiles, units_per_file: u64) -> ConsumeQueue {
        let noted = found.known_end.is_some() || found.first_unit.is_some();
        ConsumeQueue {
            dir: found.dir.into_boxed_path(),
            units_per_file,
            files: found.files,
            active: None,
            cached: None,
            used: false,
            min_offset: found.min_offset,
            max_offset: found.min_offset,
            dirty_files: FileStarts::default(),
            dirty_count: Rc::default(),
            notes: noted.then(|| {
                Box::new(LoadNotes {
                    rebuilt_end: 0,
                    known_end: found.known_end,
                    first_unit: found.first_unit,
                })
            }),
            awaiting_file: None,
            settle: Settle::Settled,
        }
    }

    /// A new queue in `dir` whose directory and first file are yet to be made
    /// (`QueueTable::get_or_begin`): it takes units in memory until `file_made`.
    fn awaiting_file(dir: PathBuf, units_per_file: u64) -> ConsumeQueue {
        let found = QueueFiles {
            dir,
            files: FileStarts::default(),
            min_offset: 0,
            known_end: None,
            first_unit: None,
        };
        let mut queue = ConsumeQueue::from_files(found, units_per_file);
        queue.awaiting_file = Some(Box::default());
        queue
    }

    /// Whether the queue's first file is still being made (its units are in memory).
    pub(crate) fn is_awaiting_file(&self) -> bool {
        self.awaiting_file.is_some() && self.settle == Settle::Settled
    }

    /// Whether the queue waits to be settled (`Settle`).
    pub(crate) fn is_unsettled(&self) -> bool {
        self.settle != Settle::Settled
    }

    /// Writes the units a `Settle::Holding` queue held back into its files (reading the
    /// page they go to on this thread), and sends the next ones there too. On failure the
    /// units stay held.
    pub(crate) fn write_held_units(&mut self) -> io::Result<()> {
        if self.settle != Settle::Holding {
            return Ok(());
        }
        self.settle = Settle::Writing;
        let Some(held) = self.awaiting_file.take() else {
            return Ok(());
        };
        let written = held
            .units
            .iter()
            .enumerate()
            .try_for_each(|(at, unit)| self.write_unit(held.from + at as u64, *unit));
        if written.is_err() {
            self.settle = Settle::Holding;
            self.awaiting_file = Some(held);
        }
        written
    }

    /// How many units a `Settle::Holding` queue holds back in memory.
    pub(crate) fn units_held_back(&self) -> usize {
        match (self.settle, self.awaiting_file.as_ref()) {
            (Settle::Holding, Some(held)) => held.units.len(),
            _ => 0,
        }
    }

    /// Settles the queue (`Settle`): `on_disk` is what its directory held when it was
    /// listed off the shard (None: the directory is gone, its topic deleted by hand), its
    /// last page read in meanwhile. Files the catalog listed that retention has removed
    /// since are forgotten, files made after the checkpoint are taken in, the units held
    /// back are written, and what follows the last unit is zeroed (files past it removed),
    /// as recovery does for the queues it reads.
    fn settle(&mut self, on_disk: Option<&[u64]>) -> io::Result<()> {
        if self.settle == Settle::Settled {
            return Ok(());
        }
        let held_from = self
            .awaiting_file
            .as_ref()
            .filter(|_| self.settle == Settle::Holding)
            .map(|held| held.from);
        match on_disk {
            Some(listed) => {
                for start in self.files.0.clone() {
                    let gone = listed.binary_search(&start).is_err()
                        && !self.file_path(start).try_exists()?;
                    if gone {
                        self.forget_file(start);
                    }
                }
                for &start in listed {
                    self.files.insert(start);
                }
                if let Some(first) = self.files.first() {
                    self.min_offset = self.min_offset.max(first).min(self.max_offset);
                }
            }
            None => {
                for start in self.files.0.clone() {
                    self.forget_file(start);
                }
                let from = held_from.unwrap_or(self.max_offset);
                self.min_offset = from;
                if held_from.is_some() {
                    // Units written after the directory went: the queue starts again at
                    // the first of them, as recovery starts a queue whose files are gone.
                    fs::create_dir_all(&self.dir)?;
                    let units = self.awaiting_file.take();
                    let max = self.max_offset;
                    self.max_offset = from;
                    let started = self.start_at(from);
                    self.max_offset = max;
                    self.awaiting_file = units;
                    started?;
                }
            }
        }
        if held_from.is_some() {
            self.write_held_units()?;
        }
        if let Some(notes) = self.notes.as_mut() {
            notes.known_end = None;
        }
        self.settle = Settle::Writing;
        self.truncate_to(self.max_offset)?;
        self.settle = Settle::Settled;
        Ok(())
    }

    /// Before a write of unit `index` to a `Settle::Holding` queue: a write at or past its
    /// count starts holding units back (a queue without files has none to hold them back
    /// from: it writes); past a gap, or with `HOLD_UNITS_MAX` held, the held units go to the
    /// file and so do the next ones. A write below the count goes to the file.
    fn hold_back_or_write(&mut self, index: u64) -> io::Result<()> {
        if self.awaiting_file.is_none() && index >= self.max_offset {
            if self.files.is_empty() {
                self.settle = Settle::Writing;
                return Ok(());
            }
            self.awaiting_file = Some(Box::new(AwaitingFile {
                from: self.max_offset,
                units: Vec::new(),
            }));
        }
        if let Some(held) = self.awaiting_file.as_ref() {
            let next = held.from + held.units.len() as u64;
            if index > next || (index == next && held.units.len() >= HOLD_UNITS_MAX) {
                self.write_held_units()?;
            }
        }
        Ok(())
    }

    /// Drops the file starting at unit `start` from what the queue holds (its map too).
    fn forget_file(&mut self, start: u64) {
        for held in [&mut self.active, &mut self.cached] {
            if held.as_ref().is_some_and(|f| f.start_unit == start) {
                *held = None;
            }
        }
        self.files.remove(start);
        self.dirty_files.remove(start);
    }

    /// The queue's first file was made (`make_first_file`, off the shard), holding its first
    /// `written` units: maps it and writes the other units held in memory into it (none
    /// left: it is mapped on its next use). On failure the units stay in memory (a write of
    /// a unit twice is harmless) and the queue still awaits its file.
    fn file_made(&mut self, written: usize) -> io::Result<()> {
        let Some(awaiting) = self.awaiting_file.take() else {
            return Ok(());
        };
        let written = written.min(awaiting.units.len());
        let result = (|| {
            if written > 0 {
                self.files.insert(0);
                self.mark_dirty(0);
            }
            if written < awaiting.units.len() && self.active.is_none() {
                let mut mapped = self
                    .map_file(0, false)?
                    .ok_or_else(|| io::Error::other("the queue file just made is gone"))?;
                mapped.reserved_bytes = CQ_RESERVE_CHUNK_BYTES.min(mapped.map.len() as u64);
                self.files.insert(0);
                self.active = Some(mapped);
            }
            for (index, unit) in awaiting.units.iter().enumerate().skip(written) {
                self.write_unit(index as u64, *unit)?;
            }
            Ok(())
        })();
        if result.is_err() {
            self.awaiting_file = Some(awaiting);
        }
        result
    }

    /// How many units the queue holds in memory while it awaits its file; None when it
    /// has its files.
    pub(crate) fn units_in_memory(&self) -> Option<u64> {
        let awaiting = self.awaiting_file.as_ref()?;
        Some(awaiting.from + awaiting.units.len() as u64)
    }

    /// The notes, made when there are none.
    fn notes_mut(&mut self) -> &mut LoadNotes {
        self.notes.get_or_insert_with(Box::default)
    }

    /// Forgets what a write makes stale: the known end and the first unit (the rebuilt end
    /// stays, recovery reads it after its writes).
    fn forget_on_write(&mut self) {
        if let Some(notes) = self.notes.as_mut() {
            notes.known_end = None;
            notes.first_unit = None;
            if notes.rebuilt_end == 0 {
                self.notes = None;
            }
        }
    }

    fn known_end_is(&self, count: u64) -> bool {
        self.notes.as_ref().and_then(|n| n.known_end) == Some(count)
    }

    /// The path of the file starting at unit `start`.
    fn file_path(&self, start: u64) -> PathBuf {
        self.dir.join(file_name(start))
    }

    pub(crate) fn min_offset(&self) -> u64 {
        self.min_offset
    }

    pub(crate) fn max_offset(&self) -> u64 {
        self.max_offset
    }

    /// Recovery wrote unit `index` again: its count after the scan is likely one past the
    /// highest such unit (`rebuilt_end`).
    pub(crate) fn note_rebuilt(&mut self, index: u64) {
        let notes = self.notes_mut();
        notes.rebuilt_end = notes.rebuilt_end.max(index + 1);
    }

    /// One past the highest unit recovery wrote again, 0 when it wrote none.
    pub(crate) fn rebuilt_end(&self) -> u64 {
        self.notes.as_ref().map_or(0, |n| n.rebuilt_end)
    }

    /// Whether no file of this queue exists (a queue created just now).
    pub(crate) fn holds_no_files(&self) -> bool {
        self.files.is_empty()
    }

    fn file_start(&self, index: u64) -> u64 {
        index - index % self.units_per_file
    }

    fn map_file(&self, start_unit: u64, create: bool) -> io::Result<Option<Box<MappedFile>>> {
        let path = self.file_path(start_unit);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // A new file gets its first blocks now; an existing one reserves as units are
        // written (`write_unit`).
        let reserved_bytes = size_queue_file(&file, &path, self.units_per_file, false)?;
        // SAFETY: the file is private to this shard's store; nothing else truncates it while
        // it is mapped (truncate_to drops the maps first). Stores go only below
        // `reserved_bytes`; loads of a hole read zeros.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|error| map_error(error, &path))?;
        // No readahead: a fault maps its own page. With readahead every first touch of a
        // queue read (and zeroed) a large folio of the sparse file: at 8,000 queues per shard
        // the kernel's memset of those pages was 77% of the shard.
        map.advise(memmap2::Advice::Random)?;
        drop(file);
        Ok(Some(Box::new(MappedFile {
            start_unit,
            map,
            reserved_bytes,
            reserved_at_ms: crate::runtime::monotonic_ms(),
        })))
    }

    /// The mapped file holding unit `index`, mapping it if needed; None when it does not exist
    /// and `create` is false.
    fn slot(&mut self, index: u64, create: bool) -> io::Result<Option<&mut MappedFile>> {
        self.used = true;
        let start = self.file_start(index);
        let in_active = self.active.as_ref().is_some_and(|f| f.start_unit == start);
        if in_active {
            return Ok(self.active.as_deref_mut());
        }
        if self.cached.as_ref().is_some_and(|f| f.start_unit == start) {
            return Ok(self.cached.as_deref_mut());
        }
        let Some(mapped) = self.map_file(start, create)? else {
            return Ok(None);
        };
        self.files.insert(start);
        // The file holding the write position (or beyond it) becomes the active one.
        if start >= self.file_start(self.max_offset) {
            self.active = Some(mapped);
            Ok(self.active.as_deref_mut())
        } else {
            self.cached = Some(mapped);
            Ok(self.cached.as_deref_mut())
        }
    }

    /// Writes unit `index` (recovery re-dispatch writes at the index the record carries).
    pub(crate) fn write_unit(&mut self, index: u64, unit: Unit) -> io::Result<()> {
        if self.settle == Settle::Holding {
            self.hold_back_or_write(index)?;
        }
        if let Some(awaiting) = self
            .awaiting_file
            .as_mut()
            .filter(|held| index >= held.from)
        {
            // Units wait in memory, from `from` on and without gaps, until the file is made
            // (or the queue settled).
            let at = usize::try_from(index - awaiting.from).map_err(io::Error::other)?;
            match at.cmp(&awaiting.units.len()) {
                std::cmp::Ordering::Less => awaiting.units[at] = unit,
                std::cmp::Ordering::Equal => awaiting.units.push(unit),
                std::cmp::Ordering::Greater => {
                    return Err(io::Error::other(format!(
                        "unit {index} of a queue whose file is being made, past its {} units",
                        awaiting.units.len()
                    )))
                }
            }
            self.used = true;
            return Ok(());
        }
        self.forget_on_write();
        let units_per_file = self.units_per_file;
        let at = ((index % units_per_file) * CQ_UNIT_BYTES) as usize;
        let end = at as u64 + CQ_UNIT_BYTES;
        let vanished = || io::Error::other("file vanished");
        let mut file = self.slot(index, true)?.ok_or_else(vanished)?;
        if end > file.reserved_bytes {
            let (start_unit, reserved_bytes) = (file.start_unit, file.reserved_bytes);
            let reserved = self.reserve_through(start_unit, reserved_bytes, end)?;
            file = self.slot(index, true)?.ok_or_else(vanished)?;
            file.reserved_bytes = reserved;
            let now_ms = crate::runtime::monotonic_ms();
            if now_ms.saturating_sub(file.reserved_at_ms) < super::prefault::HOT_RESERVE_MS {
                super::prefault::populate_ahead(&file.map, end as usize, reserved as usize);
            }
            file.reserved_at_ms = now_ms;
        }
        unit.encode(&mut file.map[at..at + CQ_UNIT_BYTES as usize]);
        let start_unit = file.start_unit;
        self.mark_dirty(start_unit);
        Ok(())
    }

    /// Reserves the blocks of the file starting at unit `start_unit` from `reserved_bytes`
    /// to `CQ_RESERVE_CHUNK_BYTES` past `end`, or on a full disk just through `end`; returns
    /// the bytes reserved from its start now.
    fn reserve_through(&self, start_unit: u64, reserved_bytes: u64, end: u64) -> io::Result<u64> {
        let size_bytes = self.units_per_file * CQ_UNIT_BYTES;
        let want = (end + CQ_RESERVE_CHUNK_BYTES)
            .next_multiple_of(4096)
            .min(size_bytes);
        let path = self.file_path(start_unit);
        match reserve_at(&path, reserved_bytes, want) {
            Ok(()) => Ok(want),
            // A full disk: no room ahead, but the unit's own block may be there already
            // (recovery writes units again over a file that holds them).
            Err(error) if super::error::is_space_error(&error) => {
                let need = end.next_multiple_of(4096).min(size_bytes);
                reserve_at(&path, reserved_bytes, need)?;
                Ok(need)
            }
            Err(error) => Err(error),
        }
    }

    /// Appends a unit at `max_offset`; returns its queue offset.
    pub(crate) fn append(&mut self, unit: Unit) -> io::Result<u64> {
        let index = self.max_offset;
        self.write_unit(index, unit)?;
        self.max_offset = index + 1;
        Ok(index)
    }

    /// Reads unit `index`; None when its file does not exist.
    pub(crate) fn read_unit(&mut self, index: u64) -> io::Result<Option<Unit>> {
        if let Some(awaiting) = self
            .awaiting_file
            .as_ref()
            .filter(|held| index >= held.from)
        {
            let held = usize::try_from(index - awaiting.from)
                .ok()
                .and_then(|i| awaiting.units.get(i));
            return Ok(held.copied());
        }
        let units_per_file = self.units_per_file;
        let Some(file) = self.slot(index, false)? else {
            return Ok(None);
        };
        let at = ((index % units_per_file) * CQ_UNIT_BYTES) as usize;
        Ok(Some(Unit::decode(
            &file.map[at..at + CQ_UNIT_BYTES as usize],
        )))
    }

    /// Drops the queue's maps when none was used since the last call: an idle queue then
    /// holds no map, page or page table, and its next read or write maps its file again
    /// (`slot`). True when a map was dropped. What the maps held stays in the page cache,
    /// dirty pages included (a checkpoint syncs them by path).
    pub(crate) fn release_maps_if_idle(&mut self) -> bool {
        let held = self.active.is_some() || self.cached.is_some();
        let release = held && !self.used;
        if release {
            self.active = None;
            self.cached = None;
        }
        self.used = false;
        release
    }

    /// The map held of the file starting at unit `start`, if any.
    fn mapped(&self, start: u64) -> Option<&MappedFile> {
        [&self.active, &self.cached]
            .into_iter()
            .flatten()
            .map(|m| &**m)
            .find(|m| m.start_unit == start)
    }

    /// The file starting at unit `start`, opened for probes (`opened` keeps the last one
    /// for the next probe); None when the queue holds no such file.
    fn probe_file<'a>(
        &self,
        start: u64,
        opened: &'a mut Option<(u64, fs::File)>,
    ) -> io::Result<Option<&'a fs::File>> {
        if !self.files.contains(start) {
            return Ok(None);
        }
        if opened.as_ref().is_none_or(|(held, _)| *held != start) {
            match open_for_probes(&self.file_path(start), false) {
                Ok(file) => *opened = Some((start, file)),
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(error) => return Err(error),
            }
        }
        Ok(opened.as_ref().map(|(_, file)| file))
    }

    /// Reads unit `index` without mapping its file: through its map when it is mapped, else
    /// with pread (`opened` keeps the last file opened for the next probe). Recovery and
    /// retention look into every queue: a map each was an mmap and a munmap per queue, which
    /// the shards' threads serialize on the process's map lock and pay a TLB shootdown for
    /// (at 100,000 queues most of a start), and each map kept counted against
    /// vm.max_map_count. None when the file does not exist.
    fn probe_unit(
        &self,
        index: u64,
        opened: &mut Option<(u64, fs::File)>,
    ) -> io::Result<Option<Unit>> {
        use std::os::unix::fs::FileExt;
        let start = self.file_start(index);
        let at = (index % self.units_per_file) * CQ_UNIT_BYTES;
        if let Some(mapped) = self.mapped(start) {
            let at = at as usize;
            return Ok(Some(Unit::decode(
                &mapped.map[at..at + CQ_UNIT_BYTES as usize],
            )));
        }
        let Some(file) = self.probe_file(start, opened)? else {
            return Ok(None);
        };
        let mut raw = [0u8; CQ_UNIT_BYTES as usize];
        match file.read_exact_at(&mut raw, at) {
            Ok(()) => {}
            // Past a short file's end: a unit never written.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                raw = [0; CQ_UNIT_BYTES as usize]
            }
            Err(error) => return Err(error),
        }
        Ok(Some(Unit::decode(&raw)))
    }

    /// Whether unit `index` points at a whole record below `end` (`probe_unit`).
    fn probe_below(
        &self,
        index: u64,
        end: u64,
        opened: &mut Option<(u64, fs::File)>,
    ) -> io::Result<bool> {
        Ok(self
            .probe_unit(index, opened)?
            .is_some_and(|u| u.points_below(end)))
    }

    /// Number of leading units (from `min_offset`) that point at whole records below `end`:
    /// a binary search, valid because those units form a prefix (see module invariants).
    pub(crate) fn count_units_below(&self, end: u64) -> io::Result<u64> {
        let mut opened = None;
        for &start in self.files.0.iter().rev() {
            // The first file of a queue started mid-file holds units from `min_offset` on.
            let first = start.max(self.min_offset);
            if !self.probe_below(first, end, &mut opened)? {
                continue;
            }
            let (mut low, mut high) = (first + 1, start + self.units_per_file);
            while low < high {
                let mid = low + (high - low) / 2;
                if self.probe_below(mid, end, &mut opened)? {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            return Ok(low);
        }
        Ok(self.min_offset)
    }

    /// Recovery, before its scan: the units held below `end` (the checkpoint's offset),
    /// counted as `count_units_below_near` does with the checkpoint's count `recorded` as the
    /// guess. When that is `recorded` and nothing is written past it (the unit at `recorded`
    /// and the rest of its page are zeros, and no later file exists), the queue remembers
    /// that it ends there (`known_end`): unless the scan writes to it, recovery needs no other
    /// look into its files (with 80,000 queues a shard, each look was an open and a read).
    pub(crate) fn check_recorded(&mut self, end: u64, recorded: u64) -> io::Result<u64> {
        if self.known_end_is(recorded) {
            return Ok(recorded); // `load` found it, given the same count and offset
        }
        let mut opened = None;
        let exact = recorded >= self.min_offset
            && (recorded == self.min_offset || self.probe_below(recorded - 1, end, &mut opened)?)
            && self.files.after(self.file_start(recorded)).is_empty()
            && self.nothing_written_from(recorded, &mut opened)?;
        if exact {
            self.notes_mut().known_end = Some(recorded);
            return Ok(recorded);
        }
        self.count_units_below_near(end, recorded)
    }

    /// What `check_recorded` found, while nothing has been written since.
    pub(crate) fn known_end(&self) -> Option<u64> {
        self.notes.as_ref().and_then(|n| n.known_end)
    }

    /// Whether the unit at `index` and the rest of its page are zeros (no file there counts
    /// as zeros): what `truncate_to` would zero from there is nothing.
    fn nothing_written_from(
        &self,
        index: u64,
        opened: &mut Option<(u64, fs::File)>,
    ) -> io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let start = self.file_start(index);
        let at = (index % self.units_per_file) * CQ_UNIT_BYTES;
        let page_end =
            ((at / PAGE_BYTES + 1) * PAGE_BYTES).min(self.units_per_file * CQ_UNIT_BYTES);
        if let Some(mapped) = self.mapped(start) {
            return Ok(mapped.map[at as usize..page_end as usize]
                .iter()
                .all(|&b| b == 0));
        }
        let Some(file) = self.probe_file(start, opened)? else {
            return Ok(true);
        };
        let mut page = [0u8; PAGE_BYTES as usize];
        let chunk = &mut page[..(page_end - at) as usize];
        let got = file.read_at(chunk, at)?;
        Ok(chunk[..got].iter().all(|&b| b == 0))
    }

    /// `count_units_below`, tried first at a guess (the checkpoint's count): when unit `guess - 1` points below `end` and unit `guess` does not,
    /// the count is `guess`, since those units form a prefix. One page read instead of a binary
    /// search of the last file, whose every probe into its unwritten part faults a page of
    /// zeros into the page cache (~19 per queue: with 80,000 queues that was most of a start).
    pub(crate) fn count_units_below_near(&self, end: u64, guess: u64) -> io::Result<u64> {
        if guess >= self.min_offset {
            let mut opened = None;
            let below_guess =
                guess == self.min_offset || self.probe_below(guess - 1, end, &mut opened)?;
            if below_guess && !self.probe_below(guess, end, &mut opened)? {
                return Ok(guess);
            }
        }
        self.count_units_below(end)
    }

    /// Makes this empty queue start at `index` (a replica taking a queue at its master's
    /// offsets): its files go (they hold no unit still in the queue), and when `index` is not
    /// the first unit of its file, that file starts with a start mark (module doc). Only the
    /// blocks from `index`'s own on are reserved: the hole before it is never written (units
    /// are written from `min_offset` on). Afterwards `min_offset == max_offset == index`; a
    /// failure leaves the queue empty at `index` without its mark (a reopen then takes it for
    /// empty from its file's start: harmless, since it holds nothing).
    pub(crate) fn start_at(&mut self, index: u64) -> io::Result<()> {
        assert_eq!(
            self.min_offset, self.max_offset,
            "only an empty queue moves its start"
        );
        self.active = None;
        self.cached = None;
        for start in self.files.take() {
            crate::runtime::fs::remove_if_present(&self.file_path(start))?;
        }
        self.dirty_files.take();
        self.min_offset = index;
        self.max_offset = index;
        let file_start = self.file_start(index);
        if file_start == index {
            return Ok(());
        }
        let units_per_file = self.units_per_file;
        let vanished = || io::Error::other("file vanished");
        let reserved_bytes = self.slot(index, true)?.ok_or_else(vanished)?.reserved_bytes;
        let at = (index % units_per_file) * CQ_UNIT_BYTES;
        let size_bytes = units_per_file * CQ_UNIT_BYTES;
        let want = (at + CQ_UNIT_BYTES + CQ_RESERVE_CHUNK_BYTES)
            .next_multiple_of(4096)
            .min(size_bytes);
        if want > reserved_bytes {
            let from = (at - at % 4096).max(reserved_bytes);
            reserve_at(&self.file_path(file_start), from, want)?;
        }
        let file = self.slot(index, true)?.ok_or_else(vanished)?;
        // Below `from` only the mark's first blocks are held; nothing is written there.
        file.reserved_bytes = file.reserved_bytes.max(want);
        Unit::start_mark(index).encode(&mut file.map[..CQ_UNIT_BYTES as usize]);
        self.mark_dirty(file_start);
        Ok(())
    }

    /// Drops every unit at or past `new_max`: zeroes the rest of its file, deletes later files.
    pub(crate) fn truncate_to(&mut self, new_max: u64) -> io::Result<()> {
        if self.settle == Settle::Holding {
            let from = self.awaiting_file.as_ref().map(|held| held.from);
            match from {
                // Only held units go: the files are zeroed past the end when it settles.
                Some(from) if new_max >= from => {
                    if let Some(held) = self.awaiting_file.as_mut() {
                        held.units.truncate((new_max - from) as usize);
                    }
                    self.max_offset = new_max.max(self.min_offset);
                    if let Some(notes) = self.notes.as_mut() {
                        notes.known_end = None;
                    }
                    return Ok(());
                }
                Some(_) => {
                    // Below the held units: they all go, and the files are cut as usual.
                    self.awaiting_file = None;
                    self.settle = Settle::Writing;
                }
                None => {}
            }
        }
        let keep_start = self.file_start(new_max);
        // Maps of files that stay are kept (recovery truncates every queue it wrote).
        for held in [&mut self.active, &mut self.cached] {
            if held.as_ref().is_some_and(|f| f.start_unit > keep_start) {
                *held = None;
            }
        }
        let later: Vec<u64> = self.files.after(keep_start).to_vec();
        for start in later {
            fs::remove_file(self.file_path(start))?;
            self.files.remove(start);
            self.dirty_files.remove(start);
        }
        // A queue recovery found ending at `new_max` holds nothing past it to zero.
        if self.files.contains(keep_start) && !self.known_end_is(new_max) {
            // Zero the dropped units in place, and only where something was written: no
            // truncate (ext4 reuses freed blocks only after its next commit, so shrinking and
            // re-reserving fails on a full disk), and nothing to do in the usual case.
            // Through the map a queue holds already, else with pread/pwrite: a file is not
            // mapped for this (`probe_unit` says why).
            let at = (new_max % self.units_per_file) * CQ_UNIT_BYTES;
            let mapped = [&mut self.active, &mut self.cached]
                .into_iter()
                .flatten()
                .find(|f| f.start_unit == keep_start);
            let wrote = match mapped {
                Some(file) => zero_mapped_to_first_zero_page(&mut file.map[..], at),
                None => {
                    let path = self.file_path(keep_start);
                    zero_to_first_zero_page(&path, at, self.units_per_file * CQ_UNIT_BYTES)?
                }
            };
            if wrote {
                self.mark_dirty(keep_start);
            }
        }
        if let Some(awaiting) = self.awaiting_file.as_mut() {
            let kept = new_max.saturating_sub(awaiting.from);
            awaiting
                .units
                .truncate(usize::try_from(kept).unwrap_or(usize::MAX));
        }
        if self.files.is_empty() {
            self.min_offset = new_max.min(self.min_offset);
        }
        self.max_offset = new_max.max(self.min_offset);
        if let Some(notes) = self.notes.as_mut() {
            notes.known_end = None;
            // The first unit stays unless it was cut (recovery truncates every queue before
            // it finds their retention floors, which read it).
            if notes.first_unit.is_some_and(|(index, _)| index >= new_max) {
                notes.first_unit = None;
            }
        }
        Ok(())
    }

    /// Retention: takes out the files whose every unit points below `min_physical` (the
    /// first commitlog offset still held), never the last file, and moves `min_offset` to
    /// the first unit at or past it (RocketMQ's deleteExpiredFile + correctMinOffset). The
    /// files are unmapped here; the caller removes them (`paths`), off the shard's thread.
    pub(crate) fn expire_below(
        &mut self,
        min_physical: u64,
        paths: &mut Vec<PathBuf>,
    ) -> io::Result<()> {
        // A queue taken from a synced checkpoint's catalog and not settled yet holds the units
        // recovery rebuilt past its count in memory (`Settle::Holding`): its files are
        // searched below them only (past them they may hold units of records the log lost).
        // Any other queue awaiting its file is new: its records are the newest.
        let held_from = self
            .awaiting_file
            .as_ref()
            .filter(|_| self.settle == Settle::Holding)
            .map(|held| held.from);
        if self.awaiting_file.is_some() && held_from.is_none() {
            return Ok(());
        }
        let mut opened = None;
        while self.files.len() > 1 {
            let Some(first) = self.files.first() else {
                break;
            };
            let last_unit = self.probe_unit(first + self.units_per_file - 1, &mut opened)?;
            let expired = last_unit.is_none_or(|u| u.physical_offset < min_physical);
            if !expired {
                break;
            }
            self.forget_file(first);
            paths.push(self.file_path(first));
        }
        let floor = self.files.first().unwrap_or(self.max_offset);
        let high = held_from.unwrap_or(self.max_offset);
        let (mut low, mut high) = (self.min_offset.max(floor).min(high), high);
        let kept = |unit: Unit| unit.size_bytes > 0 && unit.physical_offset >= min_physical;
        let held = |queue: &Self, index, opened: &mut _| -> io::Result<bool> {
            Ok(queue.probe_unit(index, opened)?.is_some_and(kept))
        };
        // Most queues lose nothing: their first unit is held, one read (none when `load`
        // read it).
        let first_held = match self.notes.as_ref().and_then(|n| n.first_unit) {
            Some((index, unit)) if index == low => kept(unit),
            _ => low < high && held(self, low, &mut opened)?,
        };
        if low < high && first_held {
            high = low;
        }
        // Units' commitlog offsets increase along the queue: the first one held is a binary
        // search (a unit never written counts as below).
        while low < high {
            let mid = low + (high - low) / 2;
            if held(self, mid, &mut opened)? {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        self.min_offset = low;
        Ok(())
    }

    /// Notes that the file starting at unit `start` was written since the last checkpoint.
    fn mark_dirty(&mut self, start: u64) {
        if self.dirty_files.insert(start) {
            self.dirty_count.set(self.dirty_count.get() + 1);
        }
    }

    fn take_dirty_paths(&mut self, out: &mut Vec<PathBuf>) {
        for start in self.dirty_files.take() {
            out.push(self.file_path(start));
        }
    }
}

/// Reads the pages at `offsets` of each file into the page cache, on several threads
/// (`runtime::fan_out`), while `go_on` says so; a file that cannot be opened is skipped (the
/// probe or map that needs it reports the error). Returns how many files it read.
pub(crate) fn read_pages(
    files: Vec<(PathBuf, BTreeSet<u64>)>,
    go_on: &(dyn Fn() -> bool + Sync),
) -> usize {
    let read = crate::runtime::fan_out::map(files, |(path, offsets)| {
        use std::os::unix::fs::FileExt;
        if !go_on() {
            return false;
        }
        let Ok(file) = open_for_probes(&path, false) else {
            return false;
        };
        let mut byte = [0u8; 1];
        for offset in offsets {
            let _ = file.read_at(&mut byte, offset);
        }
        true
    });
    read.into_iter().filter(|&read| read).count()
}

/// A queue handed out to be settled (`QueueTable::take_to_settle`).
pub(crate) struct ToSettle {
    pub topic: String,
    pub queue_id: u32,
    dir: PathBuf,
    /// The file (its first unit) and byte of the queue's first unit and of its end.
    pages: [(u64, u64); 2],
}

/// Off the shard, before a queue is settled (`ConsumeQueue::settle`): lists its directory
/// (None when it is gone) and reads into the page cache the page of its first unit, which
/// its first pull reads, and its file from the queue's end to the first page of zeros,
/// which the settling writes and zeroes. With the page cache cold after a restart of the
/// machine, these are the random reads of a queue that a start from the synced catalog
/// left out: done here on several threads, the shard then meets none of them.
pub(crate) fn look_before_settling(
    queue: &ToSettle,
    units_per_file: u64,
) -> io::Result<Option<Vec<u64>>> {
    let entries = match fs::read_dir(&queue.dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut listed = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let start = name.to_str().and_then(|n| n.parse::<u64>().ok());
        if let Some(start) = start.filter(|s| s % (units_per_file * CQ_UNIT_BYTES) == 0) {
            listed.push(start / CQ_UNIT_BYTES);
        }
    }
    listed.sort_unstable();
    let size_bytes = units_per_file * CQ_UNIT_BYTES;
    let [(first_file, first_at), (end_file, end_at)] = queue.pages;
    if listed.binary_search(&first_file).is_ok() {
        use std::os::unix::fs::FileExt;
        if let Ok(file) = open_for_probes(&queue.dir.join(file_name(first_file)), false) {
            let mut page = [0u8; PAGE_BYTES as usize];
            let _ = file.read_at(&mut page, first_at - first_at % PAGE_BYTES);
        }
    }
    if listed.binary_search(&end_file).is_ok() {
        use std::os::unix::fs::FileExt;
        let file = open_for_probes(&queue.dir.join(file_name(end_file)), false)?;
        written_end(end_at, size_bytes, |pos, buf| file.read_at(buf, pos))?;
    }
    Ok(Some(listed))
}

/// All consume queues of one store.
pub(crate) struct QueueTable {
    root: PathBuf,
    units_per_file: u64,
    topics: BTreeMap<String, BTreeMap<u32, ConsumeQueue>>,
    /// Files made dirty since the last `take_dirty_paths`, over every queue (each queue holds
    /// it too and counts its own): what the next checkpoint has to sync, known without a walk
    /// over the queues. Files that go away meanwhile (a topic deleted, retention, a cut) stay
    /// counted until then, so it may be high, never low.
    dirty: Rc<Cell<usize>>,
    /// Queues created by appends whose files are being made (`get_or_begin`), and those
    /// not yet handed out to be made (`take_files_to_make`).
    awaiting: BTreeSet<(String, u32)>,
    to_make: VecDeque<(String, u32)>,
    /// Queues taken from a synced checkpoint's catalog not yet handed out to be settled
    /// (`Settle`, `take_to_settle`).
    to_settle: VecDeque<(String, u32)>,
    /// The commitlog offset every queue's first unit was last found at or past (`expire_below`
    /// succeeded with it): a queue catalog records it, and a start whose log begins there
    /// has nothing to expire.
    expired_below: u64,
}

/// `error` of making the files of queue `topic`/`queue_id`, saying so (its OS error code
/// kept: a full disk or a lack of descriptors is told apart by it).
fn files_of_queue_error(topic: &str, queue_id: u32, error: io::Error) -> io::Error {
    let what = format!("making the files of consume queue {topic}/{queue_id}");
    match crate::runtime::fs::raw_os_error_of(&error) {
        Some(code) => crate::runtime::fs::os_error_with_context(code, what),
        None => io::Error::new(error.kind(), format!("{what}: {error}")),
    }
}

/// Makes the directory and first file of a new queue in `dir` (queue_files.rs runs it off
/// the shard: a mkdir and a file creation wait for the filesystem's journal, which took up
/// to 0.9 s while 160,000 queues got their first message): sized for `units_per_file`
/// units, its first `CQ_RESERVE_CHUNK_BYTES` reserved. A file that cannot get its blocks is
/// removed again. The file gets `units` (recovery's), as many as it holds, with their
/// blocks reserved first; returns how many it got.
pub(crate) fn make_first_file(
    dir: &Path,
    units_per_file: u64,
    units: &[Unit],
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    // A directory this call creates is empty; one that was there may hold a life before's.
    let existing_dir = match fs::create_dir(dir) {
        Ok(()) => false,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => true,
        Err(_) => {
            fs::create_dir_all(dir)?;
            false
        }
    };
    if existing_dir {
        remove_later_files(dir)?;
    }
    let path = dir.join(file_name(0));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    let existed = file.metadata()?.len() != 0;
    let reserved = size_queue_file(&file, &path, units_per_file, true)?;
    let units = &units[..units.len().min(units_per_file as usize)];
    if existed {
        // Left by a life before a restart of the machine that the synced checkpoint's
        // catalog does not list: what it holds past the units written now points at
        // records the log lost, and a later recovery must not count it.
        zero_to_first_zero_page(
            &path,
            units.len() as u64 * CQ_UNIT_BYTES,
            units_per_file * CQ_UNIT_BYTES,
        )?;
    }
    if units.is_empty() {
        return Ok(0);
    }
    let mut bytes = vec![0u8; units.len() * CQ_UNIT_BYTES as usize];
    for (unit, out) in units
        .iter()
        .zip(bytes.chunks_exact_mut(CQ_UNIT_BYTES as usize))
    {
        unit.encode(out);
    }
    // Through the block that holds the last unit, not past the file's end: fallocate would
    // grow the file.
    let end = (bytes.len() as u64)
        .next_multiple_of(4096)
        .min(units_per_file * CQ_UNIT_BYTES);
    if end > reserved {
        reserve_blocks(&file, reserved, end)?;
    }
    file.write_all_at(&bytes, 0)?;
    Ok(units.len())
}

/// Removes the files past the first from the directory of a queue whose first file is being
/// made: no file of this life exists yet, so any is a leftover of a life before (a restart of
/// the machine whose synced catalog does not list the queue, or a directory retention had
/// emptied of its first files), and its units would count once the queue reached it.
fn remove_later_files(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let later = name
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|start_byte| start_byte > 0);
        if later {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Sizes the queue file `file` (at `path`) for `units_per_file` units, a sparse file. One
/// found empty (just created), or any with `reserve_first`, gets its first
/// `CQ_RESERVE_CHUNK_BYTES` of blocks; an empty one that cannot is removed again, so a
/// creation that fails leaves nothing behind. Returns the bytes reserved from its start.
fn size_queue_file(
    file: &fs::File,
    path: &Path,
    units_per_file: u64,
    reserve_first: bool,
) -> io::Result<u64> {
    let size_bytes = units_per_file * CQ_UNIT_BYTES;
    let len = file.metadata()?.len();
    let sized = (|| {
        if len != size_bytes {
            file.set_len(size_bytes)?;
        }
        if len != 0 && !reserve_first {
            return Ok(0);
        }
        let first = CQ_RESERVE_CHUNK_BYTES.min(size_bytes);
        reserve_blocks(file, 0, first)?;
        Ok(first)
    })();
    if sized.is_err() && len == 0 {
        let _ = fs::remove_file(path);
    }
    sized
}

impl QueueTable {
    /// Bytes of the mapped queue files that have blocks behind them (what the maps can make
    /// resident), over every queue.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        let queues = self.topics.values().flat_map(BTreeMap::values);
        queues
            .map(|queue| {
                let maps = [&queue.active, &queue.cached];
                maps.iter()
                    .filter_map(|map| map.as_ref())
                    .map(|map| map.reserved_bytes)
                    .sum::<u64>()
            })
            .sum()
    }

    /// One step of a pass over the table that drops the maps of the queues idle since the
    /// previous pass (`ConsumeQueue::release_maps_if_idle`): the topics after `after` (from
    /// the first when None), whole topics, until at least `look_max` queues were looked at.
    /// Returns how many queues let go of their maps, and the last topic looked at (None when
    /// the pass is over).
    pub(crate) fn release_idle_maps(
        &mut self,
        after: Option<&str>,
        look_max: usize,
    ) -> (usize, Option<String>) {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let (mut looked, mut released) = (0, 0);
        for (topic, queues) in self.topics.range_mut::<str, _>((from, Bound::Unbounded)) {
            for queue in queues.values_mut() {
                looked += 1;
                released += usize::from(queue.release_maps_if_idle());
            }
            if looked >= look_max {
                return (released, Some(topic.clone()));
            }
        }
        (released, None)
    }

    /// A table with no queue, under `root`, touching no file (a store emptied by a reset,
    /// which removes the files itself).
    pub(crate) fn empty(root: PathBuf, units_per_file: u64) -> QueueTable {
        QueueTable::holding(root, units_per_file, BTreeMap::new(), Rc::default(), 0)
    }

    /// A table of `topics`, whose queues count their dirty files in `dirty`, none awaiting
    /// its files.
    fn holding(
        root: PathBuf,
        units_per_file: u64,
        topics: BTreeMap<String, BTreeMap<u32, ConsumeQueue>>,
        dirty: Rc<Cell<usize>>,
        expired_below: u64,
    ) -> QueueTable {
        QueueTable {
            root,
            units_per_file,
            topics,
            dirty,
            awaiting: BTreeSet::new(),
            to_make: VecDeque::new(),
            to_settle: VecDeque::new(),
            expired_below,
        }
    }

    /// Opens every queue found under `root` (`<root>/<topic>/<queueId>/`). The topics'
    /// directories are read on several threads (`runtime::fan_out`): with the page cache cold
    /// each queue is a directory block, an inode and a page read from disk, and 80,000 queues
    /// read one at a time took 10–20 s of a start.
    #[cfg(test)]
    pub(crate) fn load(root: PathBuf, units_per_file: u64) -> io::Result<QueueTable> {
        QueueTable::load_with(root, units_per_file, None)
    }

    /// `load`, given the checkpoint's counts and commitlog offset (recovery's): each queue's
    /// file is looked into for `ConsumeQueue::check_recorded` in the same open as its start
    /// mark.
    pub(crate) fn load_with(
        root: PathBuf,
        units_per_file: u64,
        recorded: Option<(&QueueCounts, u64)>,
    ) -> io::Result<QueueTable> {
        let recorded_of = |topic: &str, queue_id: u32| {
            let (counts, end) = recorded?;
            Some((*counts.get(topic)?.get(&queue_id)?, end))
        };
        fs::create_dir_all(&root)?;
        let mut topic_dirs = Vec::new();
        for topic_entry in fs::read_dir(&root)? {
            let topic_entry = topic_entry?;
            let Ok(topic) = topic_entry.file_name().into_string() else {
                continue;
            };
            if topic_entry.file_type()?.is_dir() {
                topic_dirs.push((topic_entry.ino(), (topic, topic_entry.path())));
            }
        }
        // In inode order rather than the directory's hash order: directories made one after
        // the other lie near each other on the disk, and each fan-out thread takes a run of
        // neighbours. With the page cache cold (80,000 queues a shard after a power loss)
        // most of this open waits for directory blocks, and the order took 7-9% off it.
        topic_dirs.sort_unstable_by_key(|(ino, _)| *ino);
        let topic_dirs: Vec<(String, PathBuf)> = topic_dirs.into_iter().map(|(_, t)| t).collect();
        let read_topic = |(topic, dir): (String, PathBuf)| -> io::Result<_> {
            let mut queue_dirs = Vec::new();
            for queue_entry in fs::read_dir(&dir)? {
                let queue_entry = queue_entry?;
                let name = queue_entry.file_name();
                let Some(queue_id) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                queue_dirs.push((queue_entry.ino(), queue_id, queue_entry.path()));
            }
            queue_dirs.sort_unstable_by_key(|(ino, _, _)| *ino);
            let mut queues = Vec::with_capacity(queue_dirs.len());
            for (_, queue_id, dir) in queue_dirs {
                let recorded = recorded_of(&topic, queue_id);
                queues.push((queue_id, QueueFiles::read(dir, units_per_file, recorded)?));
            }
            Ok((topic, queues))
        };
        let mut topics: BTreeMap<String, BTreeMap<u32, ConsumeQueue>> = BTreeMap::new();
        let dirty: Rc<Cell<usize>> = Rc::default();
        for read in crate::runtime::fan_out::map(topic_dirs, read_topic) {
            let (topic, queues) = read?;
            let held = topics.entry(topic).or_default();
            for (queue_id, found) in queues {
                let mut queue = ConsumeQueue::from_files(found, units_per_file);
                queue.dirty_count = dirty.clone();
                held.insert(queue_id, queue);
            }
        }
        Ok(QueueTable::holding(root, units_per_file, topics, dirty, 0))
    }

    /// The table a clean stop's queue catalog lists (`catalog.rs`), touching no queue file:
    /// each queue ends at `recorded`'s count (the clean checkpoint's) with nothing written
    /// past it, as `check_recorded` would find, unless a later file is listed. With
    /// `unsettled` (a synced checkpoint's catalog, after a restart of the machine) units
    /// may follow that count in the files, and each queue waits to be settled (`Settle`):
    /// it holds back the units written at or past its count until then.
    pub(crate) fn from_catalog(
        root: PathBuf,
        units_per_file: u64,
        catalog: super::catalog::Catalog,
        recorded: &QueueCounts,
        unsettled: bool,
    ) -> QueueTable {
        let mut to_settle = VecDeque::new();
        let mut topics: BTreeMap<String, BTreeMap<u32, ConsumeQueue>> = BTreeMap::new();
        let dirty: Rc<Cell<usize>> = Rc::default();
        for listed in catalog.queues {
            let dir = root.join(&listed.topic).join(listed.queue_id.to_string());
            let mut files = FileStarts::default();
            for start in listed.files {
                files.insert(start);
            }
            let count = recorded
                .get(&listed.topic)
                .and_then(|queues| queues.get(&listed.queue_id))
                .copied();
            let known_end = count.filter(|&count| {
                let start = count - count % units_per_file;
                count >= listed.min_offset && files.after(start).is_empty()
            });
            let found = QueueFiles {
                dir,
                files,
                min_offset: listed.min_offset,
                known_end,
                first_unit: None,
            };
            let mut queue = ConsumeQueue::from_files(found, units_per_file);
            queue.dirty_count = dirty.clone();
            if unsettled {
                // Without a known end recovery looks into the files (`count_units_below`)
                // and writes to them, as after a walk; the settling still lists them.
                queue.settle = match known_end {
                    Some(count) => {
                        queue.max_offset = count;
                        Settle::Holding
                    }
                    None => Settle::Writing,
                };
                to_settle.push_back((listed.topic.clone(), listed.queue_id));
            }
            topics
                .entry(listed.topic)
                .or_default()
                .insert(listed.queue_id, queue);
        }
        let mut table =
            QueueTable::holding(root, units_per_file, topics, dirty, catalog.expired_below);
        table.to_settle = to_settle;
        table
    }

    /// Up to `max` of the queues waiting to be settled (`Settle`), each handed out once,
    /// with what `look_before_settling` needs: its directory, the first unit of its last
    /// file and the units a pull and the settling read first.
    pub(crate) fn take_to_settle(&mut self, max: usize) -> Vec<ToSettle> {
        let mut taken = Vec::new();
        while taken.len() < max {
            let Some((topic, queue_id)) = self.to_settle.pop_front() else {
                break;
            };
            let units_per_file = self.units_per_file;
            let Some(queue) = self.get(&topic, queue_id).filter(|q| q.is_unsettled()) else {
                continue;
            };
            let pages = [queue.min_offset, queue.max_offset].map(|index| {
                (
                    queue.file_start(index),
                    (index % units_per_file) * CQ_UNIT_BYTES,
                )
            });
            taken.push(ToSettle {
                dir: queue.dir.to_path_buf(),
                pages,
                topic,
                queue_id,
            });
        }
        if self.to_settle.is_empty() {
            self.to_settle = VecDeque::new(); // 80,000 entries' worth of memory
        }
        taken
    }

    /// How many queues wait to be settled and are not handed out yet.
    pub(crate) fn queues_to_settle(&self) -> usize {
        self.to_settle.len()
    }

    /// Settles a queue handed out by `take_to_settle`, with what its directory held
    /// (`look_before_settling`). A queue deleted meanwhile is passed over.
    pub(crate) fn settle(
        &mut self,
        topic: &str,
        queue_id: u32,
        on_disk: Option<&[u64]>,
    ) -> io::Result<()> {
        let Some(queue) = self.get_mut(topic, queue_id) else {
            return Ok(());
        };
        if on_disk.is_none() && queue.units_held_back() == 0 {
            // Its directory went with its topic (a deletion after the checkpoint): the
            // queue goes too, as a walk of the directories would not find it.
            if let Some(queues) = self.topics.get_mut(topic) {
                queues.remove(&queue_id);
                if queues.is_empty() {
                    self.topics.remove(topic);
                }
            }
            return Ok(());
        }
        queue.settle(on_disk)
    }

    /// Hands a queue out to be settled again (its settling failed).
    pub(crate) fn settle_again(&mut self, topic: String, queue_id: u32) {
        self.to_settle.push_back((topic, queue_id));
    }

    /// The queue catalog of this table (`catalog.rs`) stamped `stamp`: every queue with its
    /// files (those awaiting theirs are rebuilt from the log instead).
    pub(crate) fn catalog(&self, stamp: u64) -> Vec<u8> {
        let listed: Vec<(&str, u32, u64, &[u64])> = self
            .queues()
            .filter(|(_, _, queue)| !queue.is_awaiting_file())
            .map(|(topic, queue_id, queue)| {
                (topic, queue_id, queue.min_offset, queue.files.0.as_slice())
            })
            .collect();
        super::catalog::encode(
            stamp,
            self.units_per_file,
            self.expired_below,
            listed.into_iter(),
        )
    }

    /// See `expired_below` (the field).
    pub(crate) fn expired_below(&self) -> u64 {
        self.expired_below
    }

    /// Reads into the page cache, on several threads (`runtime::fan_out`), the pages that
    /// probes of `units` (topic, queue, unit index) are about to read with pread one at a
    /// time (`count_units_below_near`, the zeroing of `truncate_to`): after a reboot each is
    /// a random read of the disk, and 80,000 of them in turn kept a recovery waiting for
    /// seconds. Units of a mapped file, of a file that does not exist or of a queue not held
    /// are left out; a failed read is left for the probe to meet and report.
    pub(crate) fn prefetch_units<'a>(&self, units: impl Iterator<Item = (&'a str, u32, u64)>) {
        // Pages of one file go to one thread, in order. (Keyed by the queue and file, not by
        // the file's path: comparing paths component by component was 4% of a start.)
        let mut pages: BTreeMap<(&str, u32, u64), (&ConsumeQueue, BTreeSet<u64>)> = BTreeMap::new();
        for (topic, queue_id, index) in units {
            let Some(queue) = self.get(topic, queue_id) else {
                continue;
            };
            let start = queue.file_start(index);
            if queue.mapped(start).is_some() || !queue.files.contains(start) {
                continue;
            }
            let at = (index - start) * CQ_UNIT_BYTES;
            if queue.files.first() == Some(start) && at < PAGE_BYTES {
                // `load` read that page for the start mark (most queues: they hold fewer
                // than 200 units): an open and a read saved per queue.
                continue;
            }
            let (_, offsets) = pages
                .entry((topic, queue_id, start))
                .or_insert_with(|| (queue, BTreeSet::new()));
            offsets.insert(at - at % PAGE_BYTES);
        }
        let files: Vec<(PathBuf, BTreeSet<u64>)> = pages
            .into_iter()
            .map(|((_, _, start), (queue, offsets))| (queue.file_path(start), offsets))
            .collect();
        read_pages(files, &|| true);
    }

    /// The pages a queue's first pull and next append touch, by file: its first unit held and
    /// its last one, for every queue with files and no map. A start from the queue catalog
    /// reads none of them; `read_pages` reads them in behind it (`Store::open`), so the
    /// shard does not wait for each one at a queue's first use.
    pub(crate) fn pages_in_use(&self) -> Vec<(PathBuf, BTreeSet<u64>)> {
        let mut files: BTreeMap<PathBuf, BTreeSet<u64>> = BTreeMap::new();
        for (_, _, queue) in self.queues() {
            if queue.is_awaiting_file() || queue.active.is_some() {
                continue;
            }
            let last = queue.max_offset.saturating_sub(1).max(queue.min_offset);
            for index in [queue.min_offset, last] {
                let start = queue.file_start(index);
                if queue.files.contains(start) {
                    let at = (index - start) * CQ_UNIT_BYTES;
                    files
                        .entry(queue.file_path(start))
                        .or_default()
                        .insert(at - at % PAGE_BYTES);
                }
            }
        }
        files.into_iter().collect()
    }

    pub(crate) fn get_mut(&mut self, topic: &str, queue_id: u32) -> Option<&mut ConsumeQueue> {
        self.topics.get_mut(topic)?.get_mut(&queue_id)
    }

    pub(crate) fn get(&self, topic: &str, queue_id: u32) -> Option<&ConsumeQueue> {
        self.topics.get(topic)?.get(&queue_id)
    }

    /// The queue, created (directory and all) on first use.
    pub(crate) fn get_or_create(
        &mut self,
        topic: &str,
        queue_id: u32,
    ) -> io::Result<&mut ConsumeQueue> {
        if self.get(topic, queue_id).is_none() {
            let queue = ConsumeQueue::open(self.queue_dir(topic, queue_id), self.units_per_file)?;
            return Ok(self.insert(topic, queue_id, queue));
        }
        self.get_mut(topic, queue_id)
            .ok_or_else(|| io::Error::other("queue just looked up"))
    }

    /// Where the queue's files are (or go).
    fn queue_dir(&self, topic: &str, queue_id: u32) -> PathBuf {
        self.root.join(topic).join(queue_id.to_string())
    }

    /// Adds a queue made just now (it counts its dirty files in the table's count).
    fn insert(&mut self, topic: &str, queue_id: u32, mut queue: ConsumeQueue) -> &mut ConsumeQueue {
        queue.dirty_count = self.dirty.clone();
        let queues = self.topics.entry(topic.to_string()).or_default();
        queues.entry(queue_id).insert_entry(queue).into_mut()
    }

    /// The queue, created on first use without touching the disk: its directory and first
    /// file are made off the shard (`take_files_to_make`, `file_made`), and its units wait in
    /// memory meanwhile. The second value says that a file is wanted now.
    pub(crate) fn get_or_begin(
        &mut self,
        topic: &str,
        queue_id: u32,
    ) -> io::Result<(&mut ConsumeQueue, bool)> {
        if self.get(topic, queue_id).is_none() {
            self.awaiting.insert((topic.to_string(), queue_id));
            self.to_make.push_back((topic.to_string(), queue_id));
            let queue =
                ConsumeQueue::awaiting_file(self.queue_dir(topic, queue_id), self.units_per_file);
            return Ok((self.insert(topic, queue_id, queue), true));
        }
        let queue = self
            .get_mut(topic, queue_id)
            .ok_or_else(|| io::Error::other("queue just looked up"))?;
        Ok((queue, false))
    }

    /// Up to `max` of the queues whose files are to be made, with their directories, each
    /// handed out once.
    pub(crate) fn take_files_to_make(&mut self, max: usize) -> Vec<(String, u32, PathBuf)> {
        let count = max.min(self.to_make.len());
        let taken: Vec<(String, u32)> = self.to_make.drain(..count).collect();
        taken
            .into_iter()
            .map(|(topic, queue_id)| {
                let dir = self.queue_dir(&topic, queue_id);
                (topic, queue_id, dir)
            })
            .collect()
    }

    /// How many queues await their files (being made or not yet handed out).
    pub(crate) fn queues_awaiting_files(&self) -> usize {
        self.awaiting.len()
    }

    /// How many queues await files not yet handed out to be made.
    pub(crate) fn files_to_make(&self) -> usize {
        self.to_make.len()
    }

    /// Makes the files of every queue awaiting them that is not handed out yet, on several
    /// threads (`runtime::fan_out`), and writes their units into them. Recovery's way (the
    /// store serves nothing yet, its thread may wait): made one at a time, the files of
    /// 80,000 queues that a crash left to recovery took it 30 s.
    /// The files get the units with `pwrite` there, so the shard maps none of them.
    ///
    /// The topics' directories are made first, then each thread takes whole topics: a mkdir
    /// holds its parent directory's lock, which every other thread's walk through that
    /// directory then waits for (with 16 threads making 80,000 queues in random order, most
    /// of their time went to waiting for the lock of `consumequeue/` and the topics').
    pub(crate) fn make_files_now(&mut self) -> io::Result<()> {
        let mut wanted = self.take_files_to_make(usize::MAX);
        wanted.sort_unstable();
        let mut topic_dirs: Vec<PathBuf> = wanted
            .iter()
            .filter_map(|(_, _, dir)| dir.parent().map(Path::to_path_buf))
            .collect();
        topic_dirs.dedup();
        // A failure here shows again, with its queue, in `make_first_file`.
        crate::runtime::fan_out::map(topic_dirs, |dir| fs::create_dir(dir).ok());
        let wanted: Vec<_> = wanted
            .into_iter()
            .map(|(topic, queue_id, dir)| {
                let units = self.take_units_in_memory(&topic, queue_id);
                (topic, queue_id, dir, units)
            })
            .collect();
        let units_per_file = self.units_per_file;
        let made = crate::runtime::fan_out::map(wanted, |(topic, queue_id, dir, units)| {
            let written = make_first_file(&dir, units_per_file, &units);
            (topic, queue_id, units, written)
        });
        for (topic, queue_id, units, written) in made {
            self.give_back_units(&topic, queue_id, units);
            written
                .and_then(|written| self.file_made(&topic, queue_id, written).map(drop))
                .map_err(|error| files_of_queue_error(&topic, queue_id, error))?;
        }
        Ok(())
    }

    /// The units a queue awaiting its file holds in memory, taken out of it (for
    /// `give_back_units`).
    fn take_units_in_memory(&mut self, topic: &str, queue_id: u32) -> Vec<Unit> {
        let awaiting = self
            .get_mut(topic, queue_id)
            .and_then(|q| q.awaiting_file.as_mut());
        awaiting
            .map(|a| std::mem::take(&mut a.units))
            .unwrap_or_default()
    }

    /// Puts back what `take_units_in_memory` took.
    fn give_back_units(&mut self, topic: &str, queue_id: u32, units: Vec<Unit>) {
        let awaiting = self
            .get_mut(topic, queue_id)
            .and_then(|q| q.awaiting_file.as_mut());
        if let Some(awaiting) = awaiting {
            awaiting.units = units;
        }
    }

    /// Makes the files of one queue awaiting them now, on this thread, and writes its units
    /// into them (recovery, for a gap in its units, which only a file can hold).
    pub(crate) fn make_files_of(&mut self, topic: &str, queue_id: u32) -> io::Result<()> {
        self.to_make
            .retain(|(held, id)| (held.as_str(), *id) != (topic, queue_id));
        make_first_file(&self.queue_dir(topic, queue_id), self.units_per_file, &[])
            .and_then(|written| self.file_made(topic, queue_id, written).map(drop))
            .map_err(|error| files_of_queue_error(topic, queue_id, error))
    }

    /// Hands the queue out to be made again (its making failed).
    pub(crate) fn make_again(&mut self, topic: String, queue_id: u32) {
        if self.awaiting.contains(&(topic.clone(), queue_id)) {
            self.to_make.push_back((topic, queue_id));
        }
    }

    /// The files of a queue that awaited them were made, holding its first `written` units:
    /// the others go into them. Ok(false) when the table no longer awaits that queue (its
    /// topic was deleted, the store reset).
    pub(crate) fn file_made(
        &mut self,
        topic: &str,
        queue_id: u32,
        written: usize,
    ) -> io::Result<bool> {
        let key = (topic.to_string(), queue_id);
        if !self.awaiting.contains(&key) {
            return Ok(false);
        }
        let Some(queue) = self.get_mut(topic, queue_id) else {
            self.awaiting.remove(&key);
            return Ok(false);
        };
        queue.file_made(written)?;
        self.awaiting.remove(&key);
        Ok(true)
    }

    /// The lowest commitlog offset of a unit held in memory by a queue awaiting its file:
    /// a checkpoint leaves those queues out, and recovery must scan from there to rebuild
    /// them (`Checkpoint::awaiting_from`).
    pub(crate) fn first_awaiting_physical(&self) -> Option<u64> {
        self.awaiting
            .iter()
            .filter_map(|(topic, queue_id)| self.get(topic, *queue_id))
            .filter_map(|queue| queue.awaiting_file.as_ref()?.units.first())
            .map(|unit| unit.physical_offset)
            .min()
    }

    /// Whether the table holds no queue at all (a store that never held a message).
    pub(crate) fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    pub(crate) fn queue_ids(&self, topic: &str) -> Vec<u32> {
        self.topics
            .get(topic)
            .map(|q| q.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Forgets the topic's queues and removes their files.
    pub(crate) fn delete_topic(&mut self, topic: &str) -> io::Result<()> {
        if self.topics.remove(topic).is_some() {
            self.awaiting.retain(|(held, _)| held != topic);
            self.to_make.retain(|(held, _)| held != topic);
            self.to_settle.retain(|(held, _)| held != topic);
            // Only queues awaiting their files: no directory yet.
            crate::runtime::fs::remove_dir_all_if_present(&self.root.join(topic))?;
        }
        Ok(())
    }

    pub(crate) fn queues(&self) -> impl Iterator<Item = (&str, u32, &ConsumeQueue)> {
        self.topics
            .iter()
            .flat_map(|(topic, queues)| queues.iter().map(move |(id, q)| (topic.as_str(), *id, q)))
    }

    pub(crate) fn queues_mut(&mut self) -> impl Iterator<Item = (&str, u32, &mut ConsumeQueue)> {
        self.topics.iter_mut().flat_map(|(topic, queues)| {
            queues
                .iter_mut()
                .map(move |(id, q)| (topic.as_str(), *id, q))
        })
    }

    /// (topic, queueId) → max offset of every queue.
    pub(crate) fn max_offsets(&self) -> QueueCounts {
        self.max_offsets_of(|_| true)
    }

    /// `max_offsets` of the queues whose units are in their files, for the checkpoint:
    /// those awaiting their files are left out (recovery rebuilds them from the scan, which
    /// `first_awaiting_physical` tells where to start).
    pub(crate) fn max_offsets_in_files(&self) -> QueueCounts {
        self.max_offsets_of(|queue| !queue.is_awaiting_file())
    }

    /// The max offsets of the queues `counted` takes; a topic with none is left out.
    fn max_offsets_of(&self, counted: impl Fn(&ConsumeQueue) -> bool) -> QueueCounts {
        let mut counts = QueueCounts::new();
        for (topic, queues) in &self.topics {
            let held: BTreeMap<u32, u64> = queues
                .iter()
                .filter(|(_, queue)| counted(queue))
                .map(|(id, queue)| (*id, queue.max_offset))
                .collect();
            if !held.is_empty() {
                counts.insert(topic.clone(), held);
            }
        }
        counts
    }

    /// Retention for every queue (`ConsumeQueue::expire_below`): the paths of the files to
    /// remove.
    pub(crate) fn expire_below(&mut self, min_physical: u64) -> io::Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        for queues in self.topics.values_mut() {
            for queue in queues.values_mut() {
                queue.expire_below(min_physical, &mut paths)?;
            }
        }
        self.expired_below = self.expired_below.max(min_physical);
        Ok(paths)
    }

    /// Paths of the files written since the last call (they need an fdatasync).
    pub(crate) fn take_dirty_paths(&mut self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for queues in self.topics.values_mut() {
            for queue in queues.values_mut() {
                queue.take_dirty_paths(&mut out);
            }
        }
        self.dirty.set(0);
        out
    }

    /// How many queue files were written since the last `take_dirty_paths` (at least those
    /// it would return now).
    pub(crate) fn dirty_files(&self) -> usize {
        self.dirty.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(offset: u64) -> Unit {
        Unit {
            physical_offset: offset,
            size_bytes: 100,
            tags_code: offset as i64,
        }
    }

    /// A queue of units 0-5 (files 0 and 4, 4 units each) taken from a synced checkpoint's
    /// catalog that says retention went up to `expired_below`, holding units 6-8 back.
    fn holding_units_from_a_catalog(expired_below: u64) -> (tempfile::TempDir, QueueTable) {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_or_create("T", 0).unwrap();
        for i in 0..6 {
            queue.append(unit(1_000 + i * 100)).unwrap();
        }
        let counts = table.max_offsets();
        let catalog = super::super::catalog::Catalog {
            expired_below,
            queues: vec![super::super::catalog::Listed {
                topic: "T".into(),
                queue_id: 0,
                min_offset: 0,
                files: vec![0, 4],
            }],
        };
        drop(table);
        let mut table =
            QueueTable::from_catalog(dir.path().to_path_buf(), 4, catalog, &counts, true);
        let queue = table.get_mut("T", 0).unwrap();
        for i in 6..9 {
            queue.append(unit(1_000 + i * 100)).unwrap();
        }
        assert_eq!(queue.units_held_back(), 3);
        (dir, table)
    }

    /// A queue taken from a synced catalog whose directory went (its topic removed by hand
    /// after the checkpoint) starts again at the units it held back, and keeps them.
    #[test]
    fn a_queue_settled_without_its_directory_keeps_the_units_it_held_back() {
        let (dir, mut table) = holding_units_from_a_catalog(0);
        std::fs::remove_dir_all(dir.path().join("T")).unwrap();
        let taken = table.take_to_settle(10);
        assert_eq!(taken.len(), 1);
        let on_disk = look_before_settling(&taken[0], 4).unwrap();
        assert_eq!(on_disk, None);
        table.settle("T", 0, on_disk.as_deref()).unwrap();
        let queue = table.get_mut("T", 0).unwrap();
        assert!(!queue.is_unsettled());
        assert_eq!((queue.min_offset(), queue.max_offset()), (6, 9));
        for i in 6..9 {
            assert_eq!(
                queue.read_unit(i).unwrap(),
                Some(unit(1_000 + i * 100)),
                "unit {i}"
            );
        }
    }

    /// A crash after a segment's deletion and before a checkpoint after it: recovery takes
    /// the queue from the synced checkpoint's catalog (its minimum from before the deletion)
    /// and, holding the units it rebuilt in memory, must still move the minimum past the
    /// deleted segment (it kept the old one, and pulls there found no record).
    #[test]
    fn a_queue_holding_units_from_a_catalog_still_expires_below_the_log() {
        let (_dir, mut table) = holding_units_from_a_catalog(1_000);
        // The log now starts at 1,250: units 0-2 point below it.
        table.expire_below(1_250).unwrap();
        let queue = table.get("T", 0).unwrap();
        assert_eq!((queue.min_offset(), queue.max_offset()), (3, 9));
        // Past every unit of the files: the minimum goes to the first unit held back.
        table.expire_below(1_650).unwrap();
        let queue = table.get_mut("T", 0).unwrap();
        assert_eq!((queue.min_offset(), queue.max_offset()), (6, 9));
        assert_eq!(queue.read_unit(6).unwrap(), Some(unit(1_600)));
    }

    #[test]
    fn a_queue_an_append_creates_holds_its_units_in_memory_until_its_file_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue_dir = dir.path().join("T").join("0");
        let (queue, began) = table.get_or_begin("T", 0).unwrap();
        assert!(began);
        for i in 0..6 {
            assert_eq!(queue.append(unit(1_000 + i * 100)).unwrap(), i);
        }
        assert!(!table.get_or_begin("T", 0).unwrap().1, "begun once");
        // Nothing on disk yet; reads come from memory; the checkpoint leaves it out.
        assert!(!queue_dir.exists());
        let queue = table.get_mut("T", 0).unwrap();
        assert_eq!(queue.read_unit(5).unwrap(), Some(unit(1_500)));
        assert_eq!(queue.read_unit(6).unwrap(), None);
        assert_eq!((queue.min_offset(), queue.max_offset()), (0, 6));
        assert!(table.max_offsets_in_files().is_empty());
        assert_eq!(table.max_offsets()["T"][&0], 6);
        assert_eq!(table.first_awaiting_physical(), Some(1_000));
        assert_eq!(table.expire_below(5_000).unwrap(), Vec::<PathBuf>::new());
        assert_eq!(
            table.get("T", 0).unwrap().min_offset(),
            0,
            "retention waits"
        );

        let made = table.take_files_to_make(10);
        assert_eq!(made.len(), 1);
        assert!(table.take_files_to_make(10).is_empty(), "handed out once");
        let written = make_first_file(&made[0].2, 4, &[]).unwrap();
        assert!(table.file_made("T", 0, written).unwrap());
        assert_eq!(table.first_awaiting_physical(), None);
        assert_eq!(table.max_offsets_in_files()["T"][&0], 6);
        // The units went into the files (the second file made on the shard, as before).
        let queue = table.get_mut("T", 0).unwrap();
        queue.append(unit(1_600)).unwrap();
        assert_eq!(queue.read_unit(5).unwrap(), Some(unit(1_500)));
        drop(table);
        let mut reopened = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = reopened.get_mut("T", 0).unwrap();
        for i in 0..7 {
            assert_eq!(queue.read_unit(i).unwrap(), Some(unit(1_000 + i * 100)));
        }

        // A topic deleted while its queue awaits its file: the made file is a stray.
        let (queue, _) = reopened.get_or_begin("U", 1).unwrap();
        queue.append(unit(9_000)).unwrap();
        reopened.delete_topic("U").unwrap();
        let made = reopened.take_files_to_make(10);
        assert!(made.is_empty(), "its making was called off");
        make_first_file(&dir.path().join("U").join("1"), 4, &[]).unwrap();
        assert!(!reopened.file_made("U", 1, 0).unwrap());
    }

    /// A directory a life before left with more than one file: making the queue's first file
    /// zeroes what that file held past the units written now and removes the others, so that
    /// none of their units counts once the queue grows into them.
    #[test]
    fn a_leftover_directory_is_emptied_when_its_queue_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        // A start that did not see the directory (a catalog not listing it).
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue_dir = dir.path().join("T").join("0");
        fs::create_dir_all(&queue_dir).unwrap();
        let stale: Vec<u8> = (0..4u64)
            .flat_map(|k| {
                let mut bytes = [0u8; CQ_UNIT_BYTES as usize];
                unit(50_000 + k * 100).encode(&mut bytes);
                bytes
            })
            .collect();
        for start in [0, 4, 8] {
            fs::write(queue_dir.join(file_name(start)), &stale).unwrap();
        }
        fs::write(queue_dir.join("notes.txt"), b"not ours").unwrap();
        // The queue made again: five units, into its first file and its second.
        let (queue, _) = table.get_or_begin("T", 0).unwrap();
        for i in 0..5 {
            queue.append(unit(1_000 + i * 100)).unwrap();
        }
        let made = table.take_files_to_make(10);
        let written = make_first_file(&made[0].2, 4, &[]).unwrap();
        assert!(table.file_made("T", 0, written).unwrap());
        drop(table);
        let mut names: Vec<String> = fs::read_dir(&queue_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [file_name(0), file_name(4), "notes.txt".to_string()]);
        let mut reopened = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = reopened.get_mut("T", 0).unwrap();
        for i in 0..5 {
            assert_eq!(queue.read_unit(i).unwrap(), Some(unit(1_000 + i * 100)));
        }
        // Past them, the second file holds nothing of the life before.
        for i in 5..8 {
            let read = queue.read_unit(i).unwrap();
            assert!(read.is_none_or(|u| u.size_bytes == 0), "unit {i}: {read:?}");
        }
    }

    /// Recovery's way: the files of many new queues made at once on several threads, each
    /// written its units with pwrite (no map), those past its first file written on the shard.
    #[test]
    fn files_made_at_once_hold_the_units_their_queues_held_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let topics = 2 * crate::runtime::fan_out::FAN_OUT_MIN_ITEMS as u64;
        let units_of = |t: u64| 1 + t % 7; // up to 7: some past the first file's 4
        for t in 0..topics {
            let (queue, _) = table.get_or_begin(&format!("T{t}"), 0).unwrap();
            for i in 0..units_of(t) {
                queue.write_unit(i, unit(t * 1_000 + i)).unwrap();
            }
        }
        assert_eq!(table.files_to_make(), topics as usize);
        table.make_files_now().unwrap();
        assert_eq!(table.files_to_make(), 0);
        assert_eq!(table.first_awaiting_physical(), None);
        for t in 0..topics {
            let queue = table.get(&format!("T{t}"), 0).unwrap();
            assert_eq!(queue.units_in_memory(), None);
        }
        for t in 0..topics {
            let first_file = dir
                .path()
                .join(format!("T{t}"))
                .join("0")
                .join(file_name(0));
            let len = fs::metadata(first_file).unwrap().len();
            assert_eq!(
                len,
                4 * CQ_UNIT_BYTES,
                "queue T{t}'s first file keeps its size"
            );
        }
        drop(table);
        let mut reopened = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        for t in 0..topics {
            let queue = reopened.get_mut(&format!("T{t}"), 0).unwrap();
            for i in 0..units_of(t) {
                assert_eq!(queue.read_unit(i).unwrap(), Some(unit(t * 1_000 + i)));
            }
        }
    }

    #[test]
    fn queues_unused_for_a_pass_let_go_of_their_maps_and_map_again_when_used() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        for topic in ["A", "B", "C"] {
            for id in 0..2 {
                let queue = table.get_or_create(topic, id).unwrap();
                for i in 0..6 {
                    queue.append(unit(i * 100)).unwrap();
                }
                assert_eq!(
                    queue.read_unit(1).unwrap(),
                    Some(unit(100)),
                    "an older file"
                );
            }
        }
        let maps = |table: &QueueTable| {
            table
                .queues()
                .map(|(_, _, q)| usize::from(q.active.is_some()) + usize::from(q.cached.is_some()))
                .sum::<usize>()
        };
        assert_eq!(maps(&table), 12);
        // The first pass only notes that they were used.
        assert_eq!(table.release_idle_maps(None, 100), (0, None));
        // B/1 is read and A/0 written between passes; the pass goes a topic at a time.
        assert_eq!(
            table.get_mut("B", 1).unwrap().read_unit(5).unwrap(),
            Some(unit(500))
        );
        table.get_mut("A", 0).unwrap().append(unit(600)).unwrap();
        let (released, after) = table.release_idle_maps(None, 1);
        assert_eq!(
            (released, after.as_deref()),
            (1, Some("A")),
            "A/1, a topic at a time"
        );
        let (released, after) = table.release_idle_maps(after.as_deref(), 3);
        assert_eq!(
            (released, after.as_deref()),
            (3, Some("C")),
            "B/0, C/0 and C/1"
        );
        assert_eq!(table.release_idle_maps(after.as_deref(), 3), (0, None));
        assert_eq!(maps(&table), 4, "A/0's and B/1's, two each");
        // Every unit reads back, through maps made again, and writes go on.
        for (topic, id, queue) in table.queues_mut() {
            let held = if (topic, id) == ("A", 0) { 7 } else { 6 };
            for i in 0..held {
                assert_eq!(
                    queue.read_unit(i).unwrap(),
                    Some(unit(i * 100)),
                    "{topic}/{id}"
                );
            }
            assert_eq!(queue.append(unit(held * 100)).unwrap(), held);
        }
        let reopened = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        assert_eq!(reopened.get("C", 1).unwrap().min_offset(), 0);
    }

    #[test]
    fn append_read_across_files_and_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_or_create("T", 1).unwrap();
        for i in 0..10 {
            assert_eq!(queue.append(unit(i * 100)).unwrap(), i);
        }
        assert_eq!(queue.read_unit(7).unwrap(), Some(unit(700)));
        assert_eq!(queue.read_unit(13).unwrap(), None);
        assert_eq!(queue.count_units_below(1000).unwrap(), 10);
        assert_eq!(queue.count_units_below(650).unwrap(), 6);
        queue.truncate_to(6).unwrap();
        assert_eq!(queue.max_offset(), 6);
        assert_eq!(queue.read_unit(6).unwrap().map(|u| u.size_bytes), Some(0));
        assert_eq!(queue.read_unit(9).unwrap(), None);

        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_mut("T", 1).unwrap();
        assert_eq!(queue.count_units_below(u64::MAX / 2).unwrap(), 6);
    }

    /// What a synced checkpoint's catalog costs the shard (it is encoded there, with the
    /// counts): 10,000 topics x 8 queues, each with one file. Prints the figure.
    /// `cargo test --release -p shards --lib catalog_of_80000_queues -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn catalog_of_80000_queues() {
        let listed = (0..10_000)
            .flat_map(|t| {
                (0..8).map(move |queue_id| super::super::catalog::Listed {
                    topic: format!("BP-{t}"),
                    queue_id,
                    min_offset: 0,
                    files: vec![0],
                })
            })
            .collect();
        let catalog = super::super::catalog::Catalog {
            expired_below: 0,
            queues: listed,
        };
        let table = QueueTable::from_catalog(
            PathBuf::from("/nonexistent"),
            300_000,
            catalog,
            &QueueCounts::new(),
            false,
        );
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let counts = table.max_offsets_in_files();
            let counted = started.elapsed();
            let bytes = table.catalog(1);
            println!(
                "counts of 80,000 queues: {:.2} ms; their catalog: {:.2} ms, {} bytes",
                counted.as_secs_f64() * 1e3,
                (started.elapsed() - counted).as_secs_f64() * 1e3,
                bytes.len()
            );
            drop(counts);
        }
    }

    #[test]
    fn a_table_of_many_topics_loads_on_threads_as_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let topics = 3 * crate::runtime::fan_out::FAN_OUT_MIN_ITEMS as u64;
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        for t in 0..topics {
            for queue_id in 0..2 {
                let queue = table.get_or_create(&format!("T{t}"), queue_id).unwrap();
                for i in 0..(t % 7) {
                    queue.append(unit(i * 100 + 1)).unwrap();
                }
            }
        }
        // A queue started mid-file (a replica's) keeps the first offset its mark names.
        table
            .get_or_create("Marked", 0)
            .unwrap()
            .start_at(6)
            .unwrap();
        drop(table);
        let table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let wanted: Vec<(String, u32, u64)> = (0..topics)
            .flat_map(|t| [(format!("T{t}"), 0, t % 7), (format!("T{t}"), 1, 0)])
            .collect();
        table.prefetch_units(wanted.iter().map(|(t, q, u)| (t.as_str(), *q, *u)));
        for t in 0..topics {
            for queue_id in 0..2 {
                let queue = table.get(&format!("T{t}"), queue_id).unwrap();
                assert_eq!(queue.min_offset(), 0);
                assert_eq!(
                    queue.count_units_below(u64::MAX / 2).unwrap(),
                    t % 7,
                    "T{t}"
                );
            }
        }
        let marked = table.get("Marked", 0).unwrap();
        assert_eq!((marked.min_offset(), marked.max_offset()), (6, 6));
        assert_eq!(table.queue_ids("Marked"), vec![0]);
    }

    #[test]
    fn a_guess_gives_the_searched_count_right_or_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_or_create("T", 1).unwrap();
        for i in 0..10 {
            queue.append(unit(i * 100)).unwrap();
        }
        for end in [0, 50, 100, 650, 1000, u64::MAX / 2] {
            let searched = queue.count_units_below(end).unwrap();
            for guess in 0..14 {
                let near = queue.count_units_below_near(end, guess).unwrap();
                assert_eq!(near, searched, "end {end}, guess {guess}");
            }
        }
    }

    #[test]
    fn a_recorded_count_is_known_as_the_end_only_when_nothing_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
            let queue = table.get_or_create("T", 1).unwrap();
            for i in 0..10 {
                queue.append(unit(i * 100)).unwrap();
            }
        }
        // `load` given the checkpoint's count looks as `check_recorded` does, in its open:
        // here it finds nothing when the queue has files past the first one.
        let counts = |count: u64| BTreeMap::from([("T".to_string(), BTreeMap::from([(1, count)]))]);
        for (count, end) in [(3, 300), (10, 1_000)] {
            let table =
                QueueTable::load_with(dir.path().to_path_buf(), 4, Some((&counts(count), end)))
                    .unwrap();
            assert_eq!(table.get("T", 1).unwrap().known_end(), None);
        }
        // Read back as recovery does (pread, no map).
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_mut("T", 1).unwrap();
        // Units follow the count (a later file, or a later unit in its file): not known.
        for recorded in [3, 4, 7] {
            assert_eq!(
                queue.check_recorded(recorded * 100, recorded).unwrap(),
                recorded
            );
            assert_eq!(queue.known_end(), None, "recorded {recorded}");
        }
        // The count is wrong: searched, not known.
        assert_eq!(queue.check_recorded(1_000, 12).unwrap(), 10);
        assert_eq!(queue.known_end(), None);
        // Exactly what the queue holds: known, and forgotten by a truncation or a write.
        assert_eq!(queue.check_recorded(1_000, 10).unwrap(), 10);
        assert_eq!(queue.known_end(), Some(10));
        queue.truncate_to(10).unwrap();
        assert_eq!((queue.known_end(), queue.max_offset()), (None, 10));
        assert_eq!(queue.check_recorded(1_000, 10).unwrap(), 10);
        queue.write_unit(10, unit(1_000)).unwrap();
        assert_eq!(queue.known_end(), None);
        // A unit past a zero one in the same page: what truncate_to would zero, so not known.
        queue
            .write_unit(
                9,
                Unit {
                    physical_offset: 0,
                    size_bytes: 0,
                    tags_code: 0,
                },
            )
            .unwrap();
        assert_eq!(queue.check_recorded(1_000, 9).unwrap(), 9);
        assert_eq!(queue.known_end(), None);
    }

    #[test]
    fn load_given_the_counts_finds_the_queues_that_end_at_them() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut table = QueueTable::load(dir.path().to_path_buf(), 64).unwrap();
            for (queue_id, units) in [(0, 0u64), (1, 1), (2, 5), (3, 63)] {
                let queue = table.get_or_create("T", queue_id).unwrap();
                for i in 0..units {
                    queue.append(unit(i * 100)).unwrap();
                }
            }
        }
        let counts: QueueCounts = BTreeMap::from([(
            "T".to_string(),
            BTreeMap::from([(0, 0), (1, 1), (2, 4), (3, 63)]),
        )]);
        let table =
            QueueTable::load_with(dir.path().to_path_buf(), 64, Some((&counts, 10_000))).unwrap();
        let known = |queue_id| table.get("T", queue_id).unwrap().known_end();
        // Queue 0 holds no file (nothing to look into), queue 2 holds a unit past the count.
        assert_eq!(
            [known(0), known(1), known(2), known(3)],
            [None, Some(1), None, Some(63)]
        );
        // The count's last unit must point below the checkpoint's offset.
        let table =
            QueueTable::load_with(dir.path().to_path_buf(), 64, Some((&counts, 6_200))).unwrap();
        assert_eq!(table.get("T", 3).unwrap().known_end(), None);
        assert_eq!(table.get("T", 1).unwrap().known_end(), Some(1));
        // The retention floor from the first unit `load` kept, as from a probe: units point
        // at i * 100, so the first held at `min_physical` is the next multiple of 100.
        for min_physical in [0, 50, 100, 150, 250] {
            let mut table = QueueTable::load(dir.path().to_path_buf(), 64).unwrap();
            let queue = table.get_mut("T", 2).unwrap();
            queue.truncate_to(5).unwrap(); // as recovery does first: the first unit stays
            assert!(queue.notes.as_ref().is_some_and(|n| n.first_unit.is_some()));
            table.expire_below(min_physical).unwrap();
            let floor = table.get("T", 2).unwrap().min_offset();
            assert_eq!(floor, min_physical.div_ceil(100).min(5), "{min_physical}");
        }
        // What `load` found is what `check_recorded` finds.
        let mut table = QueueTable::load(dir.path().to_path_buf(), 64).unwrap();
        for (queue_id, count) in [(1, 1), (2, 4), (3, 63)] {
            let queue = table.get_mut("T", queue_id).unwrap();
            queue.check_recorded(10_000, count).unwrap();
            assert_eq!(queue.known_end(), known(queue_id), "queue {queue_id}");
        }
    }

    #[test]
    fn a_queue_file_holds_disk_for_what_it_holds() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let units_per_file = 300_000; // 6 MB files, as the default
        let mut table = QueueTable::load(dir.path().to_path_buf(), units_per_file).unwrap();
        let queue = table.get_or_create("T", 0).unwrap();
        let path = dir.path().join("T").join("0").join(file_name(0));
        let on_disk = |path: &std::path::Path| fs::metadata(path).unwrap().blocks() * 512;
        queue.append(unit(0)).unwrap();
        assert!(
            on_disk(&path) <= CQ_RESERVE_CHUNK_BYTES + 4096,
            "{}",
            on_disk(&path)
        );
        // Writing on reserves as it goes, and every unit reads back after a reopen.
        let units = 3 * CQ_RESERVE_CHUNK_BYTES / CQ_UNIT_BYTES;
        for i in 1..units {
            queue.append(unit(i * 100)).unwrap();
        }
        let held = on_disk(&path);
        assert!(
            held >= units * CQ_UNIT_BYTES
                && held <= (units * CQ_UNIT_BYTES) + 2 * CQ_RESERVE_CHUNK_BYTES,
            "{held}"
        );
        let mut table = QueueTable::load(dir.path().to_path_buf(), units_per_file).unwrap();
        let queue = table.get_mut("T", 0).unwrap();
        assert_eq!(queue.count_units_below(u64::MAX / 2).unwrap(), units);
        queue.truncate_to(units).unwrap(); // as recovery sets the end
        queue.append(unit(units * 100)).unwrap();
        assert_eq!(queue.read_unit(units).unwrap(), Some(unit(units * 100)));
    }

    #[test]
    fn retention_drops_whole_files_below_and_moves_the_minimum() {
        let dir = tempfile::tempdir().unwrap();
        let mut table = QueueTable::load(dir.path().to_path_buf(), 4).unwrap();
        let queue = table.get_or_create("T", 0).unwrap();
        for i in 0..10 {
            queue.append(unit(i * 100)).unwrap();
        }
        // Units 0..=5 point below 550: file 0 (units 0-3) goes, the minimum moves to 6.
        let paths = table.expire_below(550).unwrap();
        assert_eq!(paths.len(), 1);
        assert!(paths[0].ends_with("00000000000000000000"));
        let queue = table.get_mut("T", 0).unwrap();
        assert_eq!((queue.min_offset(), queue.max_offset()), (6, 10));
        for path in paths {
            std::fs::remove_file(path).unwrap();
        }
        // Everything below: the last file stays, the queue is empty from its max on.
        let paths = table.expire_below(10_000).unwrap();
        assert_eq!(paths.len(), 1, "file 4-7 goes, file 8-11 stays");
        let queue = table.get_mut("T", 0).unwrap();
        assert_eq!((queue.min_offset(), queue.max_offset()), (10, 10));
        assert_eq!(queue.append(unit(20_000)).unwrap(), 10);
        assert_eq!(queue.read_unit(10).unwrap(), Some(unit(20_000)));
    }
}
