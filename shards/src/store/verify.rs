//! The offline verifier behind `shardmq verify`: checks a stopped store, file by file.
//!
//! It runs without a shard (plain positional reads; nothing is written), on a store no broker
//! has open, as an operator runs it before and after moving a disk:
//!
//! 1. The commitlog, every segment from its first byte: each record decodes whole (TOTALSIZE,
//!    magic, field lengths, BODYCRC) and names its own position (PHYSICALOFFSET); a blank
//!    filler ends a segment; zeros end the data (in the last segment; in an earlier one the
//!    segment ended early). In a recycled segment (`<start>.recycled`) each record must also
//!    hold its seal, and bytes no valid record follows end the data as zeros do (they are the
//!    file's earlier life). Anything else is damage: reported with its offsets, then the scan
//!    resynchronises on the next valid record (`recovery::next_valid_record`'s rule) and goes on.
//! 2. Every consume-queue unit from the queue's first one on: it points into the log that is
//!    left (units below the first segment are expired, not damage; units past the log's end
//!    are what recovery cuts after an unclean stop), at a valid record of its size, topic,
//!    queue id and queue offset; a unit never written between written ones is a hole.
//! 3. Every index file: its header, its slot heads and links within its entries, and each
//!    entry at or past the first segment pointing at the start of a valid record.
//! 4. The config files (`config/*.json`, the checkpoint): each one parses as JSON.
//! 5. The queue catalog of a clean stop, when the next start would take it: it lists the
//!    queues and files that step 2 found (an edit by hand below a topic directory is not seen
//!    by such a start).
//!
//! What counts as damage makes `shardmq verify` exit non-zero; notes (expired units, units
//! past the end, a store not stopped cleanly) do not.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::record::{self, BLANK_MAGIC_CODE};
use super::recovery::{
    is_record_at, names_another_position, plausible_record_size, record_start_candidates,
};
use super::segments::{parse_segment_name, recycled_name, segment_name};
use super::RECORD_SIZE_MAX_BYTES;

/// Commitlog bytes read per step.
const READ_BYTES: usize = 8 << 20;
/// Damage lines kept per store (the count goes on).
const FINDINGS_KEPT_MAX: usize = 100;

/// What the verifier found in one store (one shard's directory).
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub root: PathBuf,
    pub segments: u64,
    pub segment_size_bytes: u64,
    /// First byte of the first segment, end of the valid log.
    pub log_start: u64,
    pub log_end: u64,
    pub records: u64,
    pub record_bytes: u64,
    pub queues: u64,
    pub units: u64,
    pub expired_units: u64,
    pub units_past_end: u64,
    pub index_files: u64,
    pub index_entries: u64,
    pub config_files: u64,
    /// Damage found: count, and the first `FINDINGS_KEPT_MAX` descriptions.
    pub damage: u64,
    pub findings: Vec<String>,
    /// Things worth knowing that are not damage.
    pub notes: Vec<String>,
    /// Units whose record the log keeps (step 2, one queue at a time).
    matched_units: u64,
}

impl VerifyReport {
    fn damaged(&mut self, what: String) {
        self.damage += 1;
        if self.findings.len() < FINDINGS_KEPT_MAX {
            self.findings.push(what);
        }
    }

    /// Adds what one queue's check found (`check_queue`, into a report of its own).
    fn absorb(&mut self, part: VerifyReport) {
        self.units += part.units;
        self.expired_units += part.expired_units;
        self.units_past_end += part.units_past_end;
        let untold = part.damage - part.findings.len() as u64;
        for finding in part.findings {
            self.damaged(finding);
        }
        self.damage += untold;
    }

    /// Takes back the last `damaged` (only `damaged` adds findings).
    fn not_damaged_after_all(&mut self) {
        if self.damage as usize <= FINDINGS_KEPT_MAX {
            self.findings.pop();
        }
        self.damage -= 1;
    }
}

/// One commitlog segment, opened for reading.
struct Segment {
    start: u64,
    file: File,
    len: u64,
    /// A recycled file (`<start>.recycled`): its records are sealed, and past the log's end
    /// it holds its earlier life's bytes.
    recycled: bool,
}

struct Log {
    segments: Vec<Segment>,
    size: u64,
}

impl Log {
    fn segment_of(&self, offset: u64) -> Option<&Segment> {
        let i = self.segments.partition_point(|s| s.start <= offset);
        let segment = self.segments.get(i.checked_sub(1)?)?;
        (offset < segment.start + self.size).then_some(segment)
    }

    /// The record at `offset`, if a whole valid one naming that position starts there.
    fn record_at(&self, offset: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(segment) = self.segment_of(offset) else {
            return Ok(None);
        };
        let within = offset - segment.start;
        let mut header = [0u8; record::BLANK_HEADER_BYTES];
        if within + header.len() as u64 > segment.len {
            return Ok(None);
        }
        segment.file.read_exact_at(&mut header, within)?;
        let room = segment.len.min(self.size) - within;
        let Some(size) = plausible_record_size(&header, room) else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; size];
        segment.file.read_exact_at(&mut bytes, within)?;
        Ok(is_record_at(&bytes, offset, segment.recycled).then_some(bytes))
    }
}

/// Verifies the store in `root` (a shard's directory: `commitlog/`, `consumequeue/`, …).
/// `segment_size_bytes`: None infers it from the segment names (or the one file's length).
pub fn verify_store(root: &Path, segment_size_bytes: Option<u64>) -> io::Result<VerifyReport> {
    let mut report = VerifyReport {
        root: root.to_path_buf(),
        ..VerifyReport::default()
    };
    let log = open_log(root, segment_size_bytes, &mut report)?;
    scan_log(&log, &mut report)?;
    let catalog = catalog_the_next_start_takes(root, &mut report);
    let found = check_queues(root, &log, catalog.as_ref(), &mut report)?;
    check_index(root, &log, &mut report)?;
    check_config(root, &mut report);
    if let Some(catalog) = catalog {
        check_catalog(&catalog, &found, &mut report);
    }
    Ok(report)
}

fn open_log(root: &Path, size: Option<u64>, report: &mut VerifyReport) -> io::Result<Log> {
    let dir = root.join("commitlog");
    let mut starts = Vec::new();
    if dir.is_dir() {
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name();
            match name.to_str().and_then(parse_segment_name) {
                Some(found) => starts.push(found),
                None => report.notes.push(format!(
                    "commitlog/{} is not a segment (ignored)",
                    name.to_string_lossy()
                )),
            }
        }
    }
    // A start with both names: the store opens with the recycled one and removes the other
    // (`Segments::open`).
    starts.sort_unstable_by_key(|&(start, recycled)| (start, !recycled));
    starts.dedup_by_key(|(start, _)| *start);
    let mut segments = Vec::new();
    for &(start, recycled) in &starts {
        let path = dir.join(match recycled {
            true => recycled_name(start),
            false => segment_name(start),
        });
        let file = File::open(&path)?;
        let len = file.metadata()?.len();
        segments.push(Segment {
            start,
            file,
            len,
            recycled,
        });
    }
    let starts: Vec<u64> = starts.iter().map(|&(start, _)| start).collect();
    let inferred = starts.windows(2).map(|w| w[1] - w[0]).min();
    let size = match (size, inferred) {
        (Some(size), Some(gap)) if gap % size != 0 => {
            report.damaged(format!(
                "segments are {gap} bytes apart, not a multiple of the segment size {size} given"
            ));
            size
        }
        (Some(size), _) => size,
        (None, Some(gap)) => gap,
        (None, None) => segments.first().map_or(0, |s| s.len),
    };
    for segment in &segments {
        if segment.start % size.max(1) != 0 {
            report.damaged(format!(
                "segment {:020} does not start at a multiple of the segment size {size}",
                segment.start
            ));
        }
        if segment.len > size {
            report.damaged(format!(
                "segment {:020} is {} bytes, more than the segment size {size}",
                segment.start, segment.len
            ));
        }
    }
    for pair in starts.windows(2) {
        if pair[1] != pair[0] + size {
            report.damaged(format!(
                "commitlog segments missing between {:020} and {:020}",
                pair[0], pair[1]
            ));
        }
    }
    report.segments = segments.len() as u64;
    report.segment_size_bytes = size;
    report.log_start = starts.first().copied().unwrap_or(0);
    report.log_end = report.log_start;
    Ok(Log { segments, size })
}

/// Step 1: every record of every segment.
fn scan_log(log: &Log, report: &mut VerifyReport) -> io::Result<()> {
    // Where the data stopped (zeros), if it did: segments past it are allocated ahead and
    // must hold nothing.
    let mut ended_at: Option<u64> = None;
    for segment in &log.segments {
        let data_end = segment.len.min(log.size);
        if let Some(end) = ended_at {
            if log.record_at(segment.start)?.is_none() {
                continue;
            }
            report.damaged(format!(
                "{end}..{}: the log stops (zeros) but segment {:020} holds records (records \
                 lost)",
                segment.start, segment.start
            ));
            ended_at = None;
        }
        let mut within = 0u64;
        let mut window = Vec::new();
        let mut window_at = u64::MAX;
        'records: while within < data_end {
            // Keep a window holding the record at `within` (one largest record fits).
            let need = (RECORD_SIZE_MAX_BYTES as u64).min(data_end - within);
            if window_at == u64::MAX
                || within < window_at
                || within + need > window_at + window.len() as u64
            {
                let len = (READ_BYTES as u64).min(data_end - within) as usize;
                window.resize(len, 0);
                segment.file.read_exact_at(&mut window, within)?;
                window_at = within;
            }
            let at = (within - window_at) as usize;
            let here = segment.start + within;
            let rest = &window[at..];
            let Some((size, magic)) = record::peek_header(rest) else {
                if rest.iter().all(|&b| b == 0) {
                    break 'records;
                }
                report.damaged(format!(
                    "{here}: a partial record header at a segment's end"
                ));
                break 'records;
            };
            if size == 0 && magic == 0 {
                // Zeros: the data ends here. Past here the segment must be zeros too.
                if let Some(next) = next_valid(log, segment, within + 1, data_end)? {
                    report.damaged(format!(
                        "{here}..{}: {} bytes of zeros inside the log (records lost)",
                        segment.start + next,
                        next - within
                    ));
                    within = next;
                    continue 'records;
                }
                ended_at = Some(here);
                break 'records;
            }
            if magic == BLANK_MAGIC_CODE {
                let exact =
                    size >= record::BLANK_HEADER_BYTES as i32 && within + size as u64 == log.size;
                if exact {
                    break 'records;
                }
                report.damaged(format!(
                    "{here}: a blank filler of {size} bytes that does not end its segment"
                ));
            } else if let Some(bytes) = rest.get(..usize::try_from(size).unwrap_or(usize::MAX)) {
                match record::decode(bytes) {
                    Ok(_) if segment.recycled && !record::seal_holds(bytes) => {
                        report.damaged(format!("{here}: a record without its seal"))
                    }
                    Ok(message) if message.physical_offset == here => {
                        report.records += 1;
                        report.record_bytes += size as u64;
                        report.log_end = here + size as u64;
                        within += size as u64;
                        continue 'records;
                    }
                    Ok(message) => report.damaged(format!(
                        "{here}: a record whose PHYSICALOFFSET reads {}",
                        message.physical_offset
                    )),
                    Err(error) => report.damaged(format!("{here}: {error}")),
                }
            } else {
                report.damaged(format!(
                    "{here}: TOTALSIZE {size} runs past its segment or is not a size"
                ));
            }
            // Damage: go on at the next valid record of this segment, if any.
            match next_valid(log, segment, within + 1, data_end)? {
                Some(next) => {
                    report.findings.last_mut().into_iter().for_each(|f| {
                        f.push_str(&format!(" (skipped to {})", segment.start + next))
                    });
                    within = next;
                }
                // In a recycled file, bytes no valid record follows are its earlier life's:
                // the log ends here, as at zeros elsewhere.
                None if segment.recycled => {
                    report.not_damaged_after_all();
                    ended_at = Some(here);
                    break 'records;
                }
                None => break 'records,
            }
        }
    }
    Ok(())
}

/// The first position in `[from, end)` of `segment` where a valid record starts (windows
/// overlap by a header, as recovery's search).
fn next_valid(log: &Log, segment: &Segment, from: u64, end: u64) -> io::Result<Option<u64>> {
    let mut pos = from;
    let mut window = vec![0u8; READ_BYTES];
    while pos < end {
        let len = (READ_BYTES as u64).min(end - pos) as usize;
        segment.file.read_exact_at(&mut window[..len], pos)?;
        for at in record_start_candidates(&window[..len]) {
            let candidate = pos + at as u64;
            // As recovery's search: a recycled file's old records are passed without a read.
            if names_another_position(&window[at..len], segment.start + candidate) {
                continue;
            }
            if log.record_at(segment.start + candidate)?.is_some() {
                return Ok(Some(candidate));
            }
        }
        if pos + len as u64 >= end {
            break;
        }
        pos += len as u64 - record::BLANK_HEADER_BYTES as u64;
    }
    Ok(None)
}

/// Step 2: every consume-queue unit.
/// Every queue directory found: (topic, queue id) → the first unit of each of its files.
type QueueListing = BTreeMap<(String, u32), Vec<u64>>;

/// The queue directories step 2 found, and those of them that are leftovers: not in the
/// catalog the next start takes, holding no unit of a record the log keeps.
#[derive(Default)]
struct FoundQueues {
    listing: QueueListing,
    leftovers: u64,
    leftover_units: u64,
}

/// A queue directory that the clean stop's catalog does not list, whose units point at no
/// record the log keeps, is what a life before a restart of the machine left for records the
/// log lost (the start from the synced checkpoint's catalog that followed did not list it,
/// `recovery.rs`). The next start leaves it alone, and a queue made there again zeroes
/// what it holds (`make_first_file`): not damage, and its units' findings are dropped.
fn check_queues(
    root: &Path,
    log: &Log,
    catalog: Option<&NextStartCatalog>,
    report: &mut VerifyReport,
) -> io::Result<FoundQueues> {
    let dir = root.join("consumequeue");
    let mut found = FoundQueues::default();
    if !dir.is_dir() {
        return Ok(found);
    }
    for topic_entry in fs::read_dir(&dir)? {
        let topic_entry = topic_entry?;
        let topic = topic_entry.file_name().to_string_lossy().into_owned();
        for queue_entry in fs::read_dir(topic_entry.path())? {
            let queue_entry = queue_entry?;
            let queue_name = queue_entry.file_name().to_string_lossy().into_owned();
            let Ok(queue_id) = queue_name.parse::<u32>() else {
                report.notes.push(format!(
                    "consumequeue/{topic}/{queue_name} is not a queue (ignored)"
                ));
                continue;
            };
            let mut part = VerifyReport {
                log_end: report.log_end,
                ..VerifyReport::default()
            };
            let files = check_queue(&queue_entry.path(), &topic, queue_id, log, &mut part)?;
            let key = (topic.clone(), queue_id);
            let unlisted = catalog.is_some_and(|c| !c.rebuilt_too && !c.listed.contains_key(&key));
            if unlisted && part.matched_units == 0 {
                found.leftovers += 1;
                found.leftover_units += part.units + part.expired_units + part.units_past_end;
            } else {
                found.listing.insert(key, files);
                report.queues += 1;
                report.absorb(part);
            }
        }
    }
    Ok(found)
}

fn check_queue(
    dir: &Path,
    topic: &str,
    queue_id: u32,
    log: &Log,
    report: &mut VerifyReport,
) -> io::Result<Vec<u64>> {
    let unit_bytes = super::consume_queue::CQ_UNIT_BYTES;
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(start) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok())
        {
            files.insert(start, entry.path());
        }
    }
    let mut hole_from: Option<u64> = None;
    let mut seen_written = false;
    let mut last_physical = 0u64;
    let starts = files
        .keys()
        .filter(|&&start| start % unit_bytes == 0)
        .map(|start| start / unit_bytes)
        .collect();
    for (start, path) in files {
        if start % unit_bytes != 0 {
            report.damaged(format!(
                "{}: a name that is not a unit boundary",
                path.display()
            ));
            continue;
        }
        let (bytes, length) = read_written(&path, unit_bytes)?;
        for (i, unit) in bytes.chunks_exact(unit_bytes as usize).enumerate() {
            let queue_offset = start / unit_bytes + i as u64;
            let super::consume_queue::Unit {
                physical_offset: physical,
                size_bytes: size,
                ..
            } = super::consume_queue::Unit::decode(unit);
            if size == 0 {
                hole_from.get_or_insert(queue_offset);
                continue;
            }
            let name = format!("{topic}/{queue_id} unit {queue_offset}");
            if let Some(from) = hole_from.take() {
                if seen_written {
                    report.damaged(format!(
                        "{topic}/{queue_id}: units {from}..{queue_offset} never written \
                         between written ones"
                    ));
                }
            }
            seen_written = true;
            if physical < last_physical {
                report.damaged(format!(
                    "{name}: commitlog offset {physical} goes backwards"
                ));
            }
            last_physical = physical;
            if physical < log.log_start() {
                report.expired_units += 1;
                continue;
            }
            if physical >= report.log_end {
                report.units_past_end += 1;
                continue;
            }
            report.units += 1;
            match log.record_at(physical)? {
                None => report.damaged(format!(
                    "{name}: no valid record at commitlog offset {physical}"
                )),
                Some(record_bytes) => {
                    let message = record::decode(&record_bytes).expect("checked by record_at");
                    let matches = message.total_size == size
                        && message.topic == topic
                        && message.queue_id == queue_id
                        && message.queue_offset == queue_offset;
                    if matches {
                        report.matched_units += 1;
                    } else {
                        report.damaged(format!(
                            "{name} ({size} bytes at {physical}) points at the record of {}/{} \
                             queue offset {} ({} bytes)",
                            message.topic,
                            message.queue_id,
                            message.queue_offset,
                            message.total_size
                        ));
                    }
                }
            }
        }
        if (bytes.len() as u64) < length {
            // The units past what was read lie in a hole: never written, as zeros would say.
            hole_from.get_or_insert(start / unit_bytes + bytes.len() as u64 / unit_bytes);
        }
    }
    Ok(starts)
}

/// A queue file's bytes up to the end of its last data (whole units), and its length. Queue
/// files are sparse and long (6 MB): read whole, a node's 2,400 near-empty queues took 11-31
/// s of zero-filled pages. Holes inside what is read come back as zeros, as before.
fn read_written(path: &Path, unit_bytes: u64) -> io::Result<(Vec<u8>, u64)> {
    let file = File::open(path)?;
    let length = file.metadata()?.len();
    let end = (data_end(&file, length).div_ceil(unit_bytes) * unit_bytes).min(length);
    let mut bytes = vec![0u8; end as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok((bytes, length))
}

/// Where the data of a file of `length` bytes ends (past it only holes), by SEEK_DATA and
/// SEEK_HOLE; `length` where the filesystem does not say.
fn data_end(file: &File, length: u64) -> u64 {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    let (mut end, mut pos) = (0u64, 0i64);
    while end < length {
        // SAFETY: plain syscalls on a descriptor the caller holds open for the call.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let none_left = io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
            return if none_left { end } else { length };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return length;
        }
        (end, pos) = (hole as u64, hole);
    }
    end.min(length)
}

impl Log {
    fn log_start(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.start)
    }
}

/// Step 3: every index file.
fn check_index(root: &Path, log: &Log, report: &mut VerifyReport) -> io::Result<()> {
    use super::index::{
        read_u32, Entry, INDEX_ENTRY_BYTES as ENTRY, INDEX_HEADER_BYTES as HEADER, INDEX_MAGIC,
        INDEX_SLOT_BYTES as SLOT,
    };
    let dir = root.join("index");
    if !dir.is_dir() {
        return Ok(());
    }
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
        .collect();
    paths.sort();
    for path in paths {
        report.index_files += 1;
        let bytes = fs::read(&path)?;
        let name = path.display();
        if bytes.len() < HEADER || read_u32(&bytes, 0) != INDEX_MAGIC {
            report.damaged(format!("{name}: not an index file (header)"));
            continue;
        }
        let field = |at: usize| read_u32(&bytes, at) as usize;
        let (slots, capacity, entries) = (field(8), field(12), field(16));
        let entries_at = HEADER + slots * SLOT;
        if entries > capacity || entries_at + capacity * ENTRY > bytes.len() {
            report.damaged(format!(
                "{name}: {entries} entries of {capacity}, {slots} slots do not fit its {} bytes",
                bytes.len()
            ));
            continue;
        }
        for slot in 0..slots {
            let head = field(HEADER + slot * SLOT);
            if head > entries {
                report.damaged(format!(
                    "{name}: slot {slot} names entry {head} of {entries}"
                ));
            }
        }
        let mut previous_offset = 0u64;
        for number in 1..=entries {
            let at = entries_at + (number - 1) * ENTRY;
            let entry = Entry::decode(&bytes[at..at + ENTRY]);
            let (physical, link) = (entry.physical_offset, entry.previous as usize);
            report.index_entries += 1;
            if link >= number {
                report.damaged(format!("{name}: entry {number} links forward to {link}"));
            }
            if physical < previous_offset {
                report.damaged(format!(
                    "{name}: entry {number} goes back to offset {physical}"
                ));
            }
            previous_offset = physical;
            if physical >= log.log_start()
                && physical < report.log_end
                && log.record_at(physical)?.is_none()
            {
                report.damaged(format!(
                    "{name}: entry {number} points at {physical}, where no valid record starts"
                ));
            }
        }
    }
    Ok(())
}

/// The catalog a clean stop wrote, which the next start takes (`catalog.rs`), and whether
/// that start also rebuilds queues that awaited their files (`awaiting_from`).
struct NextStartCatalog {
    listed: QueueListing,
    rebuilt_too: bool,
}

/// Step 5, first half: whether the next start takes the queues from the catalog a clean
/// stop wrote (`catalog.rs`), and its listing; otherwise a note says why not.
fn catalog_the_next_start_takes(
    root: &Path,
    report: &mut VerifyReport,
) -> Option<NextStartCatalog> {
    let name = super::catalog::FILE_NAME;
    if !root.join(name).exists() {
        return None;
    }
    let checkpoint: Option<serde_json::Value> = fs::read(root.join("checkpoint"))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let clean = checkpoint
        .as_ref()
        .filter(|c| c.get("clean") == Some(&serde_json::Value::Bool(true)));
    let synced_stamp = checkpoint
        .as_ref()
        .filter(|_| clean.is_none())
        .and_then(|c| c.get("catalog")?.as_u64());
    if synced_stamp.is_some() {
        report.notes.push(format!(
            "{name} is named by the synced checkpoint: a start from it (after a restart of the \
             machine) takes the queues from it and settles them once it serves"
        ));
        return None;
    }
    let Some(stamp) = clean.and_then(|c| c.get("catalog")?.as_u64()) else {
        report.notes.push(format!(
            "{name} is named by no clean checkpoint: the next start reads the queue \
             directories (and removes it)"
        ));
        return None;
    };
    let rebuilt_too = clean.is_some_and(|c| c.get("awaiting_from").is_some_and(|a| !a.is_null()));
    let catalog = match super::catalog::usable(root, &root.join("consumequeue"), stamp, None) {
        Ok(catalog) => catalog,
        Err(why) => {
            report.notes.push(format!(
                "the next start does not take the queues from {name} ({why}): it reads \
                 the queue directories"
            ));
            return None;
        }
    };
    let listed = catalog
        .queues
        .into_iter()
        .map(|queue| ((queue.topic, queue.queue_id), queue.files))
        .collect();
    Some(NextStartCatalog {
        listed,
        rebuilt_too,
    })
}

/// Step 5: the catalog the next start takes must list the queues and files step 2 found: a
/// queue directory or file made or removed by hand below a topic directory is not seen by a
/// start that takes the catalog. Queues found but not listed are harmless when the
/// checkpoint has recovery rebuild queues that awaited their files (`awaiting_from`), and
/// when they are leftovers (`check_queues`).
fn check_catalog(catalog: &NextStartCatalog, found: &FoundQueues, report: &mut VerifyReport) {
    let name = super::catalog::FILE_NAME;
    let (listed, rebuilt_too) = (&catalog.listed, catalog.rebuilt_too);
    if found.leftovers > 0 {
        report.notes.push(format!(
            "{} queue director(ies) not in {name} hold no unit of a record the log keeps \
             ({} unit(s) of records a power loss took from the log): the next start leaves \
             them alone, and a queue made there again zeroes them",
            found.leftovers, found.leftover_units
        ));
    }
    let mut differ = Vec::new();
    for (queue, files) in listed {
        match found.listing.get(queue) {
            None => differ.push(format!("{}/{} listed, not on disk", queue.0, queue.1)),
            Some(on_disk) if on_disk != files => differ.push(format!(
                "{}/{} lists files at units {files:?}, the disk holds {on_disk:?}",
                queue.0, queue.1
            )),
            Some(_) => {}
        }
    }
    let unlisted = found.listing.keys().filter(|q| !listed.contains_key(*q));
    if rebuilt_too {
        let count = unlisted.count();
        if count > 0 {
            report.notes.push(format!(
                "{count} queue(s) on disk are not in {name}: the next start rebuilds them \
                 from the commitlog (they awaited their files at the stop)"
            ));
        }
    } else {
        differ.extend(unlisted.map(|q| format!("{}/{} on disk, not listed", q.0, q.1)));
    }
    if differ.is_empty() {
        report.notes.push(format!(
            "the next start takes its {} queue(s) from {name}",
            listed.len()
        ));
        return;
    }
    let shown: Vec<&str> = differ.iter().take(3).map(String::as_str).collect();
    report.damaged(format!(
        "{name} does not match the queue directories ({} queue(s) differ: {}): remove it \
         before the next start, which would take its listing",
        differ.len(),
        shown.join("; ")
    ));
}

/// Step 4: the config files and the checkpoint parse.
fn check_config(root: &Path, report: &mut VerifyReport) {
    let mut paths = vec![root.join("checkpoint")];
    if let Ok(entries) = fs::read_dir(root.join("config")) {
        for entry in entries.flatten() {
            paths.push(entry.path());
        }
    }
    for path in paths {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if name.ends_with(".tmp") {
            report.notes.push(format!(
                "{} is a leftover of an interrupted write (the file beside it is the one read)",
                path.display()
            ));
            continue;
        }
        let Ok(text) = fs::read(&path) else {
            if name != "checkpoint" {
                report.damaged(format!("{}: unreadable", path.display()));
            } else {
                report
                    .notes
                    .push("no checkpoint: the next start scans the whole log".into());
            }
            continue;
        };
        if name.ends_with(".json.journal") {
            report.config_files += 1;
            check_journal(&path, &text, report);
            continue;
        }
        if !name.ends_with(".json") && name != "checkpoint" {
            continue;
        }
        report.config_files += 1;
        match serde_json::from_slice::<serde_json::Value>(&text) {
            Ok(value) => {
                if name == "checkpoint"
                    && value.get("clean") == Some(&serde_json::Value::Bool(false))
                {
                    report.notes.push(
                        "the checkpoint says the store was not stopped cleanly: recovery cuts \
                         what follows the last durable record"
                            .into(),
                    );
                }
            }
            Err(error) => report.damaged(format!("{}: not JSON: {error}", path.display())),
        }
    }
}

/// A config table's journal (`<file>.json.journal`, one JSON change per line): a line that
/// does not parse is damage, unless it is the last one (an append torn by a crash, whose
/// change was never acknowledged; the broker ignores it).
fn check_journal(path: &Path, text: &[u8], report: &mut VerifyReport) {
    let lines: Vec<&[u8]> = text
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .collect();
    for (i, line) in lines.iter().enumerate() {
        if serde_json::from_slice::<serde_json::Value>(line).is_ok() {
            continue;
        }
        if i + 1 == lines.len() && !text.ends_with(b"\n") {
            report.notes.push(format!(
                "{}: its last line is torn (a crash during an append); it is ignored",
                path.display()
            ));
        } else {
            report.damaged(format!(
                "{}: line {} does not parse; the changes after it are lost",
                path.display(),
                i + 1
            ));
        }
        return;
    }
}
