//! Reads: PULL batches, whole records by commitlog offset, and searches by store time.
//!
//! Runs on the store's shard. Bytes still in the in-memory tail are copied from memory; older
//! bytes (always durable) are read from the segment files with DMA reads. A pull body is the
//! stored records copied as they are, never re-encoded.
//!
//! PULL status mapping (REMOTING.md §3.3), `offset` being the requested queue offset:
//!
//! | Condition | Status | next_begin_offset |
//! |---|---|---|
//! | queue empty or unknown (max = 0) | NoMessageInQueue | 0 |
//! | offset < min | OffsetTooSmall | min |
//! | offset = max | OffsetOverflowOne | offset |
//! | offset > max | OffsetOverflowBadly | max |
//! | messages found | Found | last unit taken + 1 (filtered units count) |
//! | scan limit reached, no unit matched | NoMatchedMessage | first unit not scanned |
//! | only units pointing at deleted commitlog | OffsetFoundNull | first unit not scanned |
//!
//! Filtering has two stages, as RocketMQ's `MessageFilter`: every unit's tags code goes
//! through the consume-queue filter (no record is read for it), and when the pull also has a
//! properties filter (SQL92), each unit that passed is read from the commitlog and its
//! PROPERTIES field decides. Only matching records count toward the batch limits; records
//! read for that stage are bounded by `PROPERTY_FILTER_READ_MAX_BYTES` per pull (the pull then
//! answers with what it found and the offset to go on from).

use std::rc::{Rc, Weak};

use super::consume_queue::Unit;
use super::read_cache::{Window, WindowBytes};
use super::record;
use super::recovery::plausible_record_size;
use super::{Inner, LogState, StoreError, RECORD_SIZE_MAX_BYTES};
use crate::runtime::fs::DirectFile;
use crate::types::QueueOffset;

/// Consume-queue bytes a pull scans at least before answering NoMatchedMessage (RocketMQ's
/// 16000 bytes), in units.
pub const PULL_SCAN_MIN_UNITS: u64 = 16_000 / 20;
pub use crate::limits::PROPERTY_FILTER_READ_MAX_BYTES;
pub use crate::limits::STORE_READ_MAX_BYTES as PULL_BATCH_MAX_BYTES;
pub use crate::limits::STORE_READ_MESSAGES_MAX as PULL_BATCH_MAX_MESSAGES;
/// Contiguous records read in one go by the properties stage, at most (one record at least).
const PROPERTY_FILTER_RUN_MAX_BYTES: u64 = 256 << 10;
/// A read past the cache goes this fraction past the pull's own records (see `span_bytes`).
const SPAN_MARGIN_DIVISOR: u64 = 4;
/// Bytes read to find a record's STORETIMESTAMP (it ends at 76 with an IPv6 born host).
const RECORD_HEADER_READ_BYTES: usize = 76;

const _: () = assert!(RECORD_HEADER_READ_BYTES <= record::RECORD_FIXED_BYTES);
const _: () = assert!(PROPERTY_FILTER_READ_MAX_BYTES >= RECORD_SIZE_MAX_BYTES as u64);

/// Result of a store lookup, in RocketMQ's GetMessageStatus terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetStatus {
    Found,
    NoMessageInQueue,
    OffsetTooSmall,
    OffsetOverflowOne,
    OffsetOverflowBadly,
    NoMatchedMessage,
    OffsetFoundNull,
}

/// What a pull found.
#[derive(Debug)]
pub struct GetMessageResult {
    pub status: GetStatus,
    pub next_begin_offset: QueueOffset,
    pub min_offset: QueueOffset,
    pub max_offset: QueueOffset,
    pub message_count: u32,
    /// Concatenated stored records, exactly as on disk.
    pub body: Vec<u8>,
}

pub(crate) struct PullRequest<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub offset: u64,
    pub max_messages: u32,
    pub max_bytes: u32,
}

/// The commitlog stage of a filter: given a record's PROPERTIES bytes, whether it matches.
pub type PropertiesFilter<'a> = &'a dyn Fn(&[u8]) -> bool;

/// The two filter stages of a pull (see the module doc).
pub struct PullFilter<'a> {
    /// Consume-queue stage, on each unit's tags code.
    pub tags_code: &'a dyn Fn(i64) -> bool,
    /// Commitlog stage, on the PROPERTIES bytes of each record that passed the first; None
    /// for filters that need no properties (no record is read to filter).
    pub properties: Option<PropertiesFilter<'a>>,
}

/// The units a pull takes (or, with a properties filter, its candidates), decided from the
/// consume queue alone.
struct Plan {
    result: GetMessageResult,
    units: Vec<Unit>,
    /// Queue offset of each unit, index-aligned.
    indexes: Vec<u64>,
    /// Whether the scan met units pointing at deleted commitlog.
    saw_null: bool,
}

/// Reads the scan window's units and applies the tags-code stage. With `take_all` every
/// passing unit of the window is a candidate (the properties stage applies the batch
/// limits); without it the batch limits end the scan.
fn plan(
    inner: &Inner,
    request: &PullRequest<'_>,
    filter: &dyn Fn(i64) -> bool,
    take_all: bool,
) -> Result<Plan, StoreError> {
    let min_physical = inner.log.borrow().min_physical_offset;
    let queues = inner.queues.borrow();
    let (min, max) = match queues.get(request.topic, request.queue_id) {
        Some(queue) => (queue.min_offset(), queue.max_offset()),
        None => (0, 0),
    };
    let offset = request.offset;
    let answer = |status, next_begin_offset| {
        let result = GetMessageResult {
            status,
            next_begin_offset: QueueOffset(next_begin_offset),
            min_offset: QueueOffset(min),
            max_offset: QueueOffset(max),
            message_count: 0,
            body: Vec::new(),
        };
        Ok(Plan {
            result,
            units: Vec::new(),
            indexes: Vec::new(),
            saw_null: false,
        })
    };
    if max == 0 {
        return answer(GetStatus::NoMessageInQueue, 0);
    }
    if offset < min {
        return answer(GetStatus::OffsetTooSmall, min);
    }
    if offset == max {
        return answer(GetStatus::OffsetOverflowOne, offset);
    }
    if offset > max {
        return answer(GetStatus::OffsetOverflowBadly, max);
    }
    let max_messages = request.max_messages.clamp(1, PULL_BATCH_MAX_MESSAGES);
    let max_bytes = u64::from(request.max_bytes.min(PULL_BATCH_MAX_BYTES));
    let scan_end = max.min(offset + PULL_SCAN_MIN_UNITS.max(u64::from(max_messages)));
    drop(queues);
    let (mut units, mut indexes, mut bytes, mut saw_null) = (Vec::new(), Vec::new(), 0u64, false);
    let mut index = offset;
    // Units are read a batch's worth at a time (a pull that filters nothing reads only the
    // units it takes, not the whole scan window), each batch before the filter runs on it,
    // with the queue table's borrow ended, so that a filter may call back into the store.
    let mut scanned = Vec::with_capacity(max_messages as usize);
    'scan: while index < scan_end {
        if !take_all && units.len() as u32 >= max_messages {
            break;
        }
        let batch_end = scan_end.min(index + u64::from(max_messages));
        {
            let mut queues = inner.queues.borrow_mut();
            let Some(queue) = queues.get_mut(request.topic, request.queue_id) else {
                break;
            };
            for at in index..batch_end {
                scanned.push(queue.read_unit(at)?);
            }
        }
        for unit in scanned.drain(..) {
            let Some(unit) = unit.filter(|u| u.size_bytes > 0 && u.physical_offset >= min_physical)
            else {
                saw_null = true;
                index += 1;
                continue;
            };
            let size = u64::from(unit.size_bytes);
            let full = !units.is_empty()
                && (units.len() as u32 >= max_messages || bytes + size > max_bytes);
            if full && !take_all {
                break 'scan;
            }
            if filter(unit.tags_code) {
                units.push(unit);
                indexes.push(index);
                bytes += size;
            }
            index += 1;
        }
    }
    let status = match (units.is_empty(), saw_null) {
        (false, _) => GetStatus::Found,
        (true, true) => GetStatus::OffsetFoundNull,
        (true, false) => GetStatus::NoMatchedMessage,
    };
    let result = GetMessageResult {
        status,
        next_begin_offset: QueueOffset(index),
        min_offset: QueueOffset(min),
        max_offset: QueueOffset(max),
        message_count: units.len() as u32,
        // With every candidate taken, the properties stage decides what the body holds.
        // From the shard's spares: the body is written to the client from this buffer, which
        // comes back once it has been (`buffers`).
        body: crate::buffers::take(if take_all { 0 } else { bytes as usize }),
    };
    Ok(Plan {
        result,
        units,
        indexes,
        saw_null,
    })
}

pub(crate) async fn get_messages(
    inner: &Rc<Inner>,
    request: &PullRequest<'_>,
    filter: &PullFilter<'_>,
) -> Result<GetMessageResult, StoreError> {
    if let Some(properties) = filter.properties {
        let plan = plan(inner, request, filter.tags_code, true)?;
        return take_matching(inner, request, plan, properties).await;
    }
    let Plan {
        mut result,
        units,
        indexes,
        ..
    } = plan(inner, request, filter.tags_code, false)?;
    let mut run_start = 0;
    let mut reads = PullReads {
        windows: Vec::new(),
        own: None,
        end: units
            .last()
            .map_or(0, |unit| unit.physical_offset + u64::from(unit.size_bytes)),
    };
    while run_start < units.len() {
        // Records that follow each other in the commitlog are read in one go.
        let mut run_end = run_start + 1;
        while run_end < units.len() && follows(&units[run_end - 1], &units[run_end]) {
            run_end += 1;
        }
        let first = units[run_start].physical_offset;
        let last = &units[run_end - 1];
        let len = (last.physical_offset + u64::from(last.size_bytes) - first) as usize;
        read_range_windowed(inner, first, len, &mut result.body, &mut reads).await?;
        run_start = run_end;
    }
    let faults = vet_records(
        inner,
        request,
        &units,
        &indexes,
        &result.body,
        &reads.windows,
    );
    if !faults.is_empty() {
        let mut body = Vec::with_capacity(result.body.len());
        let mut at = 0usize;
        for (i, unit) in units.iter().enumerate() {
            let size = unit.size_bytes as usize;
            if !faults.contains(&i) {
                body.extend_from_slice(&result.body[at..at + size]);
            }
            at += size;
        }
        result.body = body;
        result.message_count -= faults.len() as u32;
        if result.message_count == 0 {
            // As for units of deleted commitlog: PULL_RETRY_IMMEDIATELY, past them.
            result.status = GetStatus::OffsetFoundNull;
        }
    }
    Ok(result)
}

/// Why the record a unit points at may not be served (None: it may): it must decode whole
/// (magic, TOTALSIZE, field lengths, BODYCRC) and be the record the unit names (its size, its
/// PHYSICALOFFSET, the queue's topic, QUEUEID and the unit's QUEUEOFFSET). Damage inside the
/// log that the flusher wrote whole (a bad sector, a stray write) is caught here.
pub(crate) fn record_fault(
    unit: &Unit,
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
    bytes: &[u8],
    check_body_crc: bool,
) -> Option<String> {
    let decoded = if check_body_crc {
        record::decode(bytes)
    } else {
        record::decode_body_unchecked(bytes)
    };
    let message = match decoded {
        Ok(message) => message,
        Err(error) => return Some(error.to_string()),
    };
    if message.total_size != unit.size_bytes {
        return Some(format!(
            "TOTALSIZE {} differs from its unit's {}",
            message.total_size, unit.size_bytes
        ));
    }
    if message.physical_offset != unit.physical_offset {
        return Some(format!("PHYSICALOFFSET reads {}", message.physical_offset));
    }
    if message.topic != topic
        || message.queue_id != queue_id
        || message.queue_offset != queue_offset
    {
        return Some(format!(
            "the record is of {}/{} at queue offset {}",
            message.topic, message.queue_id, message.queue_offset
        ));
    }
    None
}

/// Checks every record of a pull body against its unit; the positions of the bad ones (each
/// logged by [`vet_record`]) are not served. `windows` are those the body was read from
/// (their start in the commitlog and their bytes, while the cache or a pull holds them).
///
/// A record's BODYCRC guards against damage on the way through the disk, so it is checked
/// once per window read (sixteen consumer groups pull every record of a window: each
/// computed it again, 4-5% of a shard serving them) and not at all for a record read from the
/// tail's memory that this process appended there (bytes that never left memory; not the
/// prefix a recovery read back from disk). Everything else is checked every time.
fn vet_records(
    inner: &Inner,
    request: &PullRequest<'_>,
    units: &[Unit],
    indexes: &[u64],
    body: &[u8],
    windows: &[(u64, Weak<Window>)],
) -> Vec<usize> {
    // The tail's base only moves up: a record above it now was read from the tail (and, past
    // what a recovery read back, from the bytes this process appended).
    let in_memory_from = inner.log.borrow().tail.in_memory_from();
    let mut faults = Vec::new();
    let mut at = 0usize;
    for (i, (unit, &queue_offset)) in units.iter().zip(indexes).enumerate() {
        let size = unit.size_bytes as usize;
        let bytes = &body[at..at + size];
        at += size;
        let (start, end) = (unit.physical_offset, unit.physical_offset + size as u64);
        // (A window read again after the store was emptied may hold other bytes at the same
        // offsets: a record that two windows hold is checked in full.)
        let mut holders = windows
            .iter()
            .filter_map(|(window_start, window)| Some((*window_start, window.upgrade()?)))
            .filter(|(window_start, window)| {
                *window_start <= start && end <= window_start + window.len() as u64
            });
        let window = match (holders.next(), holders.next()) {
            (Some((window_start, window)), None) => Some((window, (start - window_start) as usize)),
            _ => None,
        };
        let check_body_crc = match &window {
            Some((window, offset)) => !window.crc_checked(*offset),
            None => start < in_memory_from,
        };
        if !vet_record(inner, request, unit, queue_offset, bytes, check_body_crc) {
            faults.push(i);
        } else if let (true, Some((window, offset))) = (check_body_crc, window) {
            window.note_crc_checked(offset);
        }
    }
    faults
}

/// Whether the record `bytes` may be served for `unit` ([`record_fault`]); a damaged one is
/// logged with where it lies and counted in `StoreStats::corrupt_records`.
fn vet_record(
    inner: &Inner,
    request: &PullRequest<'_>,
    unit: &Unit,
    queue_offset: u64,
    bytes: &[u8],
    check_body_crc: bool,
) -> bool {
    let fault = record_fault(
        unit,
        request.topic,
        request.queue_id,
        queue_offset,
        bytes,
        check_body_crc,
    );
    let Some(why) = fault else {
        return true;
    };
    log::error!(
        "store {}: damaged record not served: {}/{} queue offset {queue_offset} at commitlog \
         offset {} ({} bytes): {why}; run `shardmq verify` on the stopped store",
        inner.config.root_dir.display(),
        request.topic,
        request.queue_id,
        unit.physical_offset,
        unit.size_bytes
    );
    inner.log.borrow_mut().stats.corrupt_records += 1;
    false
}

/// The properties stage: reads the candidates in runs of contiguous records and keeps those
/// whose properties match, up to the batch limits and `PROPERTY_FILTER_READ_MAX_BYTES` read.
async fn take_matching(
    inner: &Inner,
    request: &PullRequest<'_>,
    plan: Plan,
    properties_match: &dyn Fn(&[u8]) -> bool,
) -> Result<GetMessageResult, StoreError> {
    let Plan {
        mut result,
        units,
        indexes,
        saw_null,
    } = plan;
    if units.is_empty() {
        return Ok(result);
    }
    let max_messages = request.max_messages.clamp(1, PULL_BATCH_MAX_MESSAGES);
    let max_bytes = u64::from(request.max_bytes.min(PULL_BATCH_MAX_BYTES));
    let (mut taken, mut body_bytes, mut read_bytes) = (0u32, 0u64, 0u64);
    let mut next_begin = result.next_begin_offset.0;
    let mut run_start = 0;
    'runs: while run_start < units.len() {
        let first = units[run_start];
        let mut run_end = run_start + 1;
        let mut run_bytes = u64::from(first.size_bytes);
        while run_end < units.len()
            && follows(&units[run_end - 1], &units[run_end])
            && run_bytes + u64::from(units[run_end].size_bytes) <= PROPERTY_FILTER_RUN_MAX_BYTES
        {
            run_bytes += u64::from(units[run_end].size_bytes);
            run_end += 1;
        }
        if read_bytes > 0 && read_bytes + run_bytes > PROPERTY_FILTER_READ_MAX_BYTES {
            next_begin = indexes[run_start];
            break;
        }
        read_bytes += run_bytes;
        let bytes = read_range(inner, first.physical_offset, run_bytes as usize).await?;
        let mut at = 0usize;
        let run = units[run_start..run_end]
            .iter()
            .zip(&indexes[run_start..run_end]);
        for (unit, index) in run {
            let size = unit.size_bytes as usize;
            let full = taken > 0 && (taken >= max_messages || body_bytes + size as u64 > max_bytes);
            if full {
                next_begin = *index;
                break 'runs;
            }
            let record = &bytes[at..at + size];
            at += size;
            if !vet_record(inner, request, unit, *index, record, true) {
                continue;
            }
            let properties = record::properties_of(record).unwrap_or_default();
            if properties_match(properties) {
                result.body.extend_from_slice(record);
                taken += 1;
                body_bytes += size as u64;
            }
        }
        run_start = run_end;
    }
    result.message_count = taken;
    result.next_begin_offset = QueueOffset(next_begin);
    result.status = match (taken > 0, saw_null) {
        (true, _) => GetStatus::Found,
        (false, true) => GetStatus::OffsetFoundNull,
        (false, false) => GetStatus::NoMatchedMessage,
    };
    Ok(result)
}

fn follows(previous: &Unit, next: &Unit) -> bool {
    previous.physical_offset + u64::from(previous.size_bytes) == next.physical_offset
}

/// Copies commitlog bytes `[pos, pos + len)`: the part in the tail from memory, the part
/// below it (durable) with DMA reads.
pub(crate) async fn read_range(inner: &Inner, pos: u64, len: usize) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::with_capacity(len);
    read_range_into(inner, pos, len, &mut out).await?;
    Ok(out)
}

/// Appends commitlog bytes `[pos, pos + len)` to `out` as [`read_range`] reads them: the
/// tail's part straight from its chunks (no zeroed buffer in between, no second copy). On an
/// error `out` is as it was.
async fn read_range_into(
    inner: &Inner,
    pos: u64,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), StoreError> {
    let start = out.len();
    let end = pos + len as u64;
    let mut pieces: Vec<(u64, u64, u64, Rc<DirectFile>)> = Vec::new();
    {
        let log = inner.log.borrow();
        if pos < log.min_physical_offset || end > log.tail.end() {
            return Err(StoreError::Corrupt {
                offset: pos,
                reason: format!("range of {len} bytes lies outside the commitlog"),
            });
        }
        let split = log.tail.base().clamp(pos, end);
        let mut at = pos;
        while at < split {
            let (segment, file) = segment_file(&log, at)?;
            let stop = split.min(segment + inner.config.segment_size_bytes);
            pieces.push((segment, at, stop, file));
            at = stop;
        }
        // The durable part is read into zeros below; the tail's part is copied now, while
        // the tail still holds it.
        out.resize(start + (split - pos) as usize, 0);
        if split < end {
            log.tail.append_range(split, (end - split) as usize, out);
        }
    }
    for (segment, at, stop, file) in pieces {
        let out_range = start + (at - pos) as usize..start + (stop - pos) as usize;
        if let Err(error) = file.read_exact_at(at - segment, &mut out[out_range]).await {
            out.truncate(start);
            return Err(error.into());
        }
    }
    Ok(())
}

/// The segment holding commitlog offset `at` (its start and file), for a read below the tail;
/// a segment missing there is damage, unless the store is closing.
fn segment_file(log: &LogState, at: u64) -> Result<(u64, Rc<DirectFile>), StoreError> {
    log.segments.file_for(at).ok_or_else(|| {
        if log.closing {
            StoreError::Closed
        } else {
            StoreError::Corrupt {
                offset: at,
                reason: "commitlog segment missing".into(),
            }
        }
    })
}

/// What one pull read below the tail, for the records it reads next and their checks.
struct PullReads {
    /// The cache's windows and the spans past it read from (once each, with their start),
    /// not kept alive by this: a pull waiting for a read would keep windows the cache let go
    /// of, and their registered memory (the reads then fell back to fresh heap pages: a
    /// sixth of the msgs/s of 16 groups catching up, in one run).
    windows: Vec<(u64, Weak<Window>)>,
    /// The span past the cache it reads from now, when the cache had no room
    /// (`Lookup::Bypass`), and where it starts: read by this pull (the rest of its records in
    /// that window, in one read) or by another that still holds it.
    own: Option<(u64, WindowBytes)>,
    /// Where the pull's last record ends.
    end: u64,
}

impl PullReads {
    /// Notes a window or span read from, for the checks of its records.
    fn note(&mut self, start: u64, bytes: &WindowBytes) {
        let seen = self
            .windows
            .iter()
            .any(|(_, seen)| std::ptr::eq(seen.as_ptr(), Rc::as_ptr(bytes)));
        if !seen {
            self.windows.push((start, Rc::downgrade(bytes)));
        }
    }
}

/// Appends commitlog bytes `[pos, pos + len)` to `out` as [`read_range`] reads them, but the
/// durable part through the store's window cache (read_cache.rs): for pull bodies, which
/// walk the log. When the cache has no room for a window, the pull takes the span past the
/// cache that another pull of the same stretch read or is reading, or reads the span of its
/// own records in it (blocks from `pos` on, not a window: `span_bytes`), and keeps it in
/// `reads`.
async fn read_range_windowed(
    inner: &Rc<Inner>,
    pos: u64,
    len: usize,
    out: &mut Vec<u8>,
    reads: &mut PullReads,
) -> Result<(), StoreError> {
    let end = pos + len as u64;
    let mut at = pos;
    while at < end {
        if let Some((own_start, own)) = &reads.own {
            let own_end = own_start + own.len() as u64;
            if *own_start <= at && at < own_end {
                let to = end.min(own_end);
                out.extend_from_slice(&own[(at - own_start) as usize..(to - own_start) as usize]);
                at = to;
                continue;
            }
        }
        let window = match cacheable_window(inner, at) {
            Some(window) => window,
            // In (or next to) the tail: read as it is.
            None => {
                return read_range_into(inner, at, (end - at) as usize, out).await;
            }
        };
        read_ahead(inner, window.1);
        let Some(bytes) = window_bytes(inner, window).await? else {
            // The span it was reading lies behind: let go of it before waiting for another.
            reads.own = None;
            let span = span_bytes(inner, at, window.1, reads.end).await?;
            reads.note(span.0, &span.1);
            reads.own = Some(span);
            continue;
        };
        let from = (at - window.0) as usize;
        let to = (end.min(window.1) - window.0) as usize;
        out.extend_from_slice(&bytes[from..to]);
        reads.note(window.0, &bytes);
        at = window.1.min(end);
    }
    Ok(())
}

/// The bytes past the cache holding `at` (the cache had no room for its window, which ends at
/// `window_end`): a span another pull holds or is reading, or, with none, the blocks from `at`
/// to a quarter past `pull_end` (the pull's last record) within the window, read now. The
/// caller holds no span: a pull waits for room holding none, so pulls cannot wait for each
/// other.
async fn span_bytes(
    inner: &Rc<Inner>,
    at: u64,
    window_end: u64,
    pull_end: u64,
) -> Result<(u64, WindowBytes), StoreError> {
    use super::read_cache::SpanLookup;
    use super::segments::BLOCK_BYTES;
    let from = at / BLOCK_BYTES * BLOCK_BYTES;
    // A quarter more than its own records: the pulls of the group's other queues end a few
    // records past this one's, and find those in it rather than reading them again.
    let to = (pull_end + (pull_end - from) / SPAN_MARGIN_DIVISOR)
        .min(window_end)
        .next_multiple_of(BLOCK_BYTES)
        .min(window_end);
    let mut room = None;
    loop {
        let lookup = inner.read_cache.borrow_mut().lookup_span(at);
        match lookup {
            SpanLookup::Held(start, bytes) => {
                inner.read_cache.borrow_mut().took_span();
                return Ok((start, bytes));
            }
            SpanLookup::Reading(start, read) => {
                room = None;
                match read.wait().await {
                    Some(bytes) => {
                        inner.read_cache.borrow_mut().took_span();
                        return Ok((start, bytes));
                    }
                    None => continue,
                }
            }
            // Nobody holds one: room first, then look again (another pull may have begun
            // reading one while this waited for room).
            SpanLookup::None if room.is_none() => {
                room = Some(SpanRoom::take(inner, from, to - from).await);
                continue;
            }
            SpanLookup::None => {}
        }
        let room = room.expect("room taken above");
        let generation = inner.read_cache.borrow_mut().start_span(from, to);
        let read = read_file_aligned(inner, (from, to)).await;
        let bytes = read.map(|bytes| Window::new(SpanBytes { bytes, _room: room }));
        inner
            .read_cache
            .borrow_mut()
            .finish_span(from, bytes.as_ref().ok(), generation);
        return Ok((from, bytes?));
    }
}

/// A span read past the cache, with the room it takes among such reads (given back when the
/// last pull holding it lets go).
struct SpanBytes {
    bytes: crate::runtime::fs::DmaBytes,
    _room: SpanRoom,
}

impl std::ops::Deref for SpanBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Room taken for a read past the cache at `start` (`ReadCache::take_span`), given back when
/// the pulls let go of its bytes (never while the cache is borrowed: pulls drop their spans
/// outside it).
struct SpanRoom {
    inner: Rc<Inner>,
    start: u64,
    bytes: u64,
}

impl SpanRoom {
    async fn take(inner: &Rc<Inner>, start: u64, bytes: u64) -> SpanRoom {
        loop {
            let freed = {
                let mut cache = inner.read_cache.borrow_mut();
                if cache.take_span(bytes) {
                    return SpanRoom {
                        inner: inner.clone(),
                        start,
                        bytes,
                    };
                }
                cache.spans_freed()
            };
            freed.wait().await;
        }
    }
}

impl Drop for SpanRoom {
    fn drop(&mut self) {
        self.inner
            .read_cache
            .borrow_mut()
            .release_span(self.start, self.bytes);
    }
}

/// The window `[start, end)` holding `at`, when it lies wholly in one segment and below the
/// tail (its bytes are durable and never change); None otherwise.
fn cacheable_window(inner: &Inner, at: u64) -> Option<(u64, u64)> {
    use super::read_cache::WINDOW_BYTES;
    let log = inner.log.borrow();
    let size = inner.config.segment_size_bytes;
    let segment = at / size * size;
    let start = (at / WINDOW_BYTES * WINDOW_BYTES).max(segment);
    let end = (start / WINDOW_BYTES * WINDOW_BYTES + WINDOW_BYTES).min(segment + size);
    (start >= log.min_physical_offset && end <= log.tail.base()).then_some((start, end))
}

/// The bytes of a window: from the cache, after the read under way, or read now; None when
/// the cache has no room for it (the caller reads what it needs past the cache).
async fn window_bytes(
    inner: &Inner,
    window: (u64, u64),
) -> Result<Option<WindowBytes>, StoreError> {
    use super::read_cache::Lookup;
    loop {
        let lookup = inner.read_cache.borrow_mut().lookup(window.0);
        match lookup {
            Lookup::Cached(bytes) => return Ok(Some(bytes)),
            Lookup::Reading(event) => event.wait().await,
            Lookup::Missing => return read_window(inner, window).await.map(Some),
            Lookup::Bypass => return Ok(None),
        }
    }
}

/// Reads a window its caller registered as its reader (`ReadCache::lookup`,
/// `start_read_ahead`) and hands it to the cache, which wakes whoever waits for it.
async fn read_window(inner: &Inner, window: (u64, u64)) -> Result<WindowBytes, StoreError> {
    let generation = inner.read_cache.borrow().generation();
    let bytes = read_file_aligned(inner, window).await.map(Window::new);
    let kept = bytes.as_ref().ok().cloned();
    inner
        .read_cache
        .borrow_mut()
        .finish(window.0, kept, generation);
    bytes
}

/// One DMA read of the block-aligned commitlog bytes `[start, end)` (a window, or a span past
/// the cache), inside one segment and below the tail, kept in the buffer they were read into.
async fn read_file_aligned(
    inner: &Inner,
    (start, end): (u64, u64),
) -> Result<crate::runtime::fs::DmaBytes, StoreError> {
    let (segment, file) = {
        let log = inner.log.borrow();
        if start < log.min_physical_offset || end > log.tail.base() {
            return Err(StoreError::Corrupt {
                offset: start,
                reason: format!("window [{start}, {end}) is not durable commitlog"),
            });
        }
        segment_file(&log, start)?
    };
    debug_assert!(end <= segment + inner.config.segment_size_bytes);
    Ok(file
        .read_exact_aligned(start - segment, (end - start) as usize)
        .await?)
}

/// Starts reading the `READ_AHEAD_WINDOWS` windows from `start` in the background, those that
/// are durable and neither cached nor being read (a consumer walking the log finds them ready,
/// and the disk has that many reads to work on).
fn read_ahead(inner: &Rc<Inner>, mut start: u64) {
    for _ in 0..super::read_cache::READ_AHEAD_WINDOWS {
        let Some(window) = cacheable_window(inner, start) else {
            return;
        };
        start = window.1;
        if !inner.read_cache.borrow_mut().start_read_ahead(window.0) {
            continue;
        }
        let inner = inner.clone();
        crate::runtime::spawn_detached(async move {
            // A failed read-ahead is left to the pull that needs the window.
            let _ = read_window(&inner, window).await;
        });
    }
}

pub(crate) async fn read_record(
    inner: &Inner,
    physical_offset: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let (min, end) = {
        let log = inner.log.borrow();
        (log.min_physical_offset, log.tail.end())
    };
    let header_bytes = record::RECORD_FIXED_BYTES as u64;
    if physical_offset < min || physical_offset.saturating_add(header_bytes) > end {
        return Ok(None);
    }
    let header = read_range(inner, physical_offset, record::BLANK_HEADER_BYTES).await?;
    let Some(size) = plausible_record_size(&header, end - physical_offset) else {
        return Ok(None);
    };
    let bytes = read_range(inner, physical_offset, size).await?;
    let valid = record::decode(&bytes).is_ok_and(|m| m.physical_offset == physical_offset);
    Ok(valid.then_some(bytes))
}

/// STORETIMESTAMP of the record a unit points at (i64::MIN for units of deleted commitlog).
async fn store_timestamp(inner: &Inner, unit: Unit) -> Result<i64, StoreError> {
    if unit.physical_offset < inner.log.borrow().min_physical_offset || unit.size_bytes == 0 {
        return Ok(i64::MIN);
    }
    let header = read_range(inner, unit.physical_offset, RECORD_HEADER_READ_BYTES).await?;
    let mut field = [0u8; 4];
    field.copy_from_slice(&header[36..40]);
    let sys_flag = i32::from_be_bytes(field);
    let at = if sys_flag & record::BORNHOST_V6_FLAG != 0 {
        record::STORE_TIMESTAMP_OFFSET_V4_BORN + 12
    } else {
        record::STORE_TIMESTAMP_OFFSET_V4_BORN
    };
    let mut stamp = [0u8; 8];
    stamp.copy_from_slice(&header[at..at + 8]);
    Ok(i64::from_be_bytes(stamp))
}

fn unit_at(inner: &Inner, topic: &str, queue_id: u32, index: u64) -> Result<Unit, StoreError> {
    let mut queues = inner.queues.borrow_mut();
    let unit = match queues.get_mut(topic, queue_id) {
        Some(queue) => queue.read_unit(index)?,
        None => None,
    };
    unit.ok_or_else(|| StoreError::Corrupt {
        offset: index,
        reason: format!("consume queue {topic}/{queue_id} has no unit {index}"),
    })
}

fn queue_bounds(inner: &Inner, topic: &str, queue_id: u32) -> (u64, u64) {
    match inner.queues.borrow().get(topic, queue_id) {
        Some(queue) => (queue.min_offset(), queue.max_offset()),
        None => (0, 0),
    }
}

pub(crate) async fn offset_by_timestamp(
    inner: &Inner,
    topic: &str,
    queue_id: u32,
    timestamp_ms: i64,
    upper: bool,
) -> Result<u64, StoreError> {
    let (min, max) = queue_bounds(inner, topic, queue_id);
    // Store timestamps never decrease along a queue, so both bounds are binary searches for
    // the first unit past a predicate.
    let (mut low, mut high) = (min, max);
    while low < high {
        let mid = low + (high - low) / 2;
        let unit = unit_at(inner, topic, queue_id, mid)?;
        let stamp = store_timestamp(inner, unit).await?;
        let before = if upper {
            stamp <= timestamp_ms
        } else {
            stamp < timestamp_ms
        };
        if before {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    if upper {
        // `low` is the first unit stored after the time: the answer is the one before it.
        Ok(if low > min { low - 1 } else { min })
    } else {
        Ok(low)
    }
}

pub(crate) async fn earliest_store_time(
    inner: &Inner,
    topic: &str,
    queue_id: u32,
) -> Result<Option<i64>, StoreError> {
    let (min, max) = queue_bounds(inner, topic, queue_id);
    if min >= max {
        return Ok(None);
    }
    let unit = unit_at(inner, topic, queue_id, min)?;
    Ok(Some(store_timestamp(inner, unit).await?))
}
