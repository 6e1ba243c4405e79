//! Master/slave replication, the store's side (RocketMQ's classic HA): the master hands out raw
//! commitlog bytes from any offset it still holds (`Store::read_log`); the slave writes them at
//! the same offsets, byte for byte, and files them in its consume queues and message index the
//! way recovery's re-dispatch does (`Store::append_replicated`). A slave that never held
//! anything first moves its log's start to one of the master's segment starts
//! (`Store::start_empty_at`), as RocketMQ's slave creates its first file at the master's offset.
//! A slave whose log cannot continue its master's (it fell behind the master's retained range,
//! or its bytes diverge from the master's past some offset) throws away everything and starts
//! again, empty, at one of the master's segment starts (`Store::reset_empty_at`, `reset.rs`).
//!
//! Lives on the store's shard, like the rest of the store. The HA stream cuts the log at
//! arbitrary points (`[offset u64][size u32][bytes]` frames): `append_replicated` takes whole
//! units — records and blank fillers — from the front of what it is given and leaves a trailing
//! partial one to its caller, who therefore holds at most `REPLICA_UNIT_MAX_BYTES` between
//! calls.
//!
//! Invariants (the positions asserted, kept in release):
//! - over `[min_physical_offset, max_physical_offset)` the slave's commitlog is the master's,
//!   byte for byte: the tail is given exactly the bytes received, fillers included, each unit
//!   at the log's end;
//! - a unit is taken whole or not at all: everything that can refuse it (poison, closing,
//!   allocated space, `TAIL_UNDURABLE_MAX_BYTES`, its checks, its queue, the index's room) is
//!   settled before a byte of it reaches the tail, as in `append`;
//! - queue offsets are the master's: a record must continue its queue, or find it empty (the
//!   queue then starts at the record's offset, `ConsumeQueue::start_at`), so a slave that
//!   joined mid-log serves the master's queue offsets, and its queues recover the same way.
//!
//! A unit that would be refused by this store's own recovery is refused here too
//! (`StoreError::Corrupt`): a record that does not decode, names another position, has a bad
//! topic or properties ending in NUL (read as a torn write), or does not leave room for a
//! filler header before its segment's end; a filler that does not end exactly at the segment's
//! end (the master's `segment_size_bytes` differs). Stored, any of them would be cut away by the
//! slave's next recovery along with everything after it.

use std::rc::Rc;

use super::consume_queue::Unit as QueueUnit;
use super::flusher;
use super::index::{self, MessageKeys};
use super::record::{self, StoredMessage, BLANK_MAGIC_CODE, MAGIC_CODE_V1, MAGIC_CODE_V2};
use super::segments::{align_down, sync_dir};
use super::tail::{Tail, TAIL_CHUNK_BYTES};
use super::{
    validate_topic, LogState, QueueId, QueueOffset, Store, StoreError, RECORD_SIZE_MAX_BYTES,
    TAIL_UNDURABLE_MAX_BYTES,
};

/// Most bytes one `read_log` returns, whatever the slave asks: bounds the buffer a request
/// makes the master allocate (RocketMQ's master sends 32 KiB batches, haTransferBatchSize).
pub const REPLICA_READ_MAX_BYTES: usize = 8 << 20;
/// The largest unit `append_replicated` takes: a largest record, or a filler (shorter than the
/// record that did not fit plus a filler header). A caller keeps at most this much unconsumed.
pub const REPLICA_UNIT_MAX_BYTES: usize = RECORD_SIZE_MAX_BYTES + record::BLANK_HEADER_BYTES;

// One read of the most a master sends always completes a unit a slave holds part of.
const _: () = assert!(REPLICA_READ_MAX_BYTES >= REPLICA_UNIT_MAX_BYTES);
// A largest unit is never refused as Busy on its own.
const _: () = assert!(REPLICA_UNIT_MAX_BYTES as u64 <= TAIL_UNDURABLE_MAX_BYTES);

/// One unit taken into the log, or the lack of one.
enum Taken<'a> {
    /// The bytes end inside the unit (or its header): the caller sends more.
    NeedMore,
    Filler {
        size_bytes: usize,
    },
    Record(Arrival<'a>),
}

/// A record appended to a queue: what the arrival listener is told, and its size.
struct Arrival<'a> {
    topic: &'a str,
    queue_id: u32,
    queue_offset: u64,
    size_bytes: usize,
}

/// Whether `error` says "not now" (the disk is behind or short of space): after some units
/// were taken it ends the call with what was taken; the caller waits for room and calls again.
fn is_wait_error(error: &StoreError) -> bool {
    matches!(
        error,
        StoreError::Busy { .. } | StoreError::SpaceNotReady { .. } | StoreError::DiskFull { .. }
    )
}

/// What the bytes at the front of a transfer hold, from their header.
enum UnitKind {
    /// The header, or the unit it announces, is not all there yet.
    NeedMore,
    /// A blank filler of this many bytes, to its segment's end.
    Filler(usize),
    /// A record of this many bytes (not decoded yet: `check_record`).
    Record(usize),
}

/// Classifies the unit at `here` by its TOTALSIZE and magic, as recovery's scan does, and
/// refuses what this store would not have written there (`StoreError::Corrupt`).
fn classify(here: u64, rest: &[u8], segment_size_bytes: u64) -> Result<UnitKind, StoreError> {
    let Some((size, magic)) = record::peek_header(rest) else {
        return Ok(UnitKind::NeedMore);
    };
    let corrupt = |reason: String| StoreError::Corrupt {
        offset: here,
        reason: format!("replicated {reason}"),
    };
    let segment_end = align_down(here, segment_size_bytes) + segment_size_bytes;
    let size = usize::try_from(size)
        .map_err(|_| corrupt(format!("unit with a negative TOTALSIZE {size}")))?;
    let unit = if magic == BLANK_MAGIC_CODE {
        let fits = (record::BLANK_HEADER_BYTES..=REPLICA_UNIT_MAX_BYTES).contains(&size);
        if !fits || here + size as u64 != segment_end {
            return Err(corrupt(format!(
                "blank filler of {size} bytes does not end at its segment's end {segment_end} \
                 (is segment_size_bytes {segment_size_bytes} the master's?)"
            )));
        }
        UnitKind::Filler(size)
    } else {
        if magic != MAGIC_CODE_V1 && magic != MAGIC_CODE_V2 {
            return Err(corrupt(format!(
                "unit with an unknown magic code {magic:#x}"
            )));
        }
        if !(record::RECORD_FIXED_BYTES..=RECORD_SIZE_MAX_BYTES).contains(&size) {
            return Err(corrupt(format!(
                "record of an impossible size, {size} bytes"
            )));
        }
        // `append` always leaves a filler header's room before the segment's end.
        if here + (size + record::BLANK_HEADER_BYTES) as u64 > segment_end {
            return Err(corrupt(format!(
                "record of {size} bytes leaves no room for a filler header before its \
                 segment's end {segment_end} (is segment_size_bytes {segment_size_bytes} the \
                 master's?)"
            )));
        }
        UnitKind::Record(size)
    };
    Ok(if rest.len() < size {
        UnitKind::NeedMore
    } else {
        unit
    })
}

/// Decodes a whole record received for `here` and checks it as recovery's dispatch does:
/// BODYCRC and field bounds, its own position, its topic, and no trailing NUL in its
/// properties (which recovery would read as a torn write, cutting the log there).
fn check_record(bytes: &[u8], here: u64) -> Result<StoredMessage<'_>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        offset: here,
        reason: format!("replicated record: {reason}"),
    };
    let message = record::decode(bytes).map_err(|e| corrupt(e.to_string()))?;
    if message.physical_offset != here {
        return Err(corrupt(format!(
            "names commitlog offset {} as its own",
            message.physical_offset
        )));
    }
    if validate_topic(message.topic).is_err() {
        return Err(corrupt(format!("invalid topic {:?}", message.topic)));
    }
    if message.properties.last() == Some(&0) {
        return Err(corrupt("its properties end with a NUL byte".into()));
    }
    Ok(message)
}

impl Store {
    /// The commitlog bytes `[from, from + n)`, `n = min(max_bytes, REPLICA_READ_MAX_BYTES,
    /// max_physical_offset - from)`: what a master sends its slave. Written bytes are served
    /// whether durable or not, as RocketMQ's master does (the tail from memory, older bytes with
    /// DMA reads, `pull::read_range`). Empty at the end of the log; `OutOfRange` below the
    /// first byte held or past the end.
    pub async fn read_log(&self, from: u64, max_bytes: usize) -> Result<Vec<u8>, StoreError> {
        let (min, max) = {
            let log = self.inner.log.borrow();
            (log.min_physical_offset, log.tail.end())
        };
        if from < min || from > max {
            return Err(StoreError::OutOfRange {
                offset: from,
                min,
                max,
            });
        }
        let len = (max - from).min(max_bytes.min(REPLICA_READ_MAX_BYTES) as u64) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        // No await since the check: the range is still inside the log when the read starts.
        super::pull::read_range(&self.inner, from, len).await
    }

    /// Appends a master's commitlog bytes, received from offset `at` (which must be this log's
    /// end, else `ReplicaMismatch`), at the same offsets: the whole units at the front of
    /// `bytes` go into the log, their records into the consume queues (at the queue offsets
    /// they carry) and the index, exactly as recovery re-dispatches them. Returns the bytes
    /// consumed; a trailing partial unit is left (0 when the first one is partial), to be
    /// given again with the bytes that complete it.
    ///
    /// Refusals: as `append` when the first unit cannot be taken now (`Busy`, `SpaceNotReady`,
    /// `DiskFull`: wait for `room()` or space and call again); once some units are taken such a
    /// refusal ends the call with `Ok` of what was taken. `Corrupt` for a unit this store's
    /// recovery would not accept, `ReplicaQueueMismatch` for a record that does not continue its
    /// queue: both are returned at once, after the units before it were taken (the error names
    /// its offset, `max_physical_offset` says where the log ends).
    pub fn append_replicated(&self, at: u64, bytes: &[u8]) -> Result<usize, StoreError> {
        let inner = &*self.inner;
        {
            let log = inner.log.borrow();
            if let Some(poison) = &log.poison {
                return Err(poison.to_error());
            }
            let end = log.tail.end();
            if at != end {
                return Err(StoreError::ReplicaMismatch {
                    expected: end,
                    got: at,
                });
            }
        }
        let mut arrivals = Vec::new();
        let mut consumed = 0usize;
        let stopped = loop {
            match self.take_unit(at + consumed as u64, &bytes[consumed..]) {
                Ok(Taken::NeedMore) => break None,
                Ok(Taken::Filler { size_bytes }) => consumed += size_bytes,
                Ok(Taken::Record(arrival)) => {
                    consumed += arrival.size_bytes;
                    arrivals.push(arrival);
                }
                Err(error) => break Some(error),
            }
        };
        if consumed > 0 {
            self.after_replicated_append(&arrivals);
        }
        match stopped {
            Some(error) if consumed == 0 || !is_wait_error(&error) => Err(error),
            _ => Ok(consumed),
        }
    }

    /// What `append` does once a record is in: the flush it may start (one for all the units
    /// of the call), and the arrival listener told of each record so parked pulls wake.
    fn after_replicated_append(&self, arrivals: &[Arrival<'_>]) {
        let inner = &*self.inner;
        let wake_flusher = {
            let mut log = inner.log.borrow_mut();
            let end = log.tail.end();
            log.flush.note_append(
                inner.config.flush_mode,
                end,
                inner.config.flush_dirty_max_bytes,
            )
        };
        if wake_flusher && !flusher::kick(inner) {
            inner.notify.signal();
        }
        let listener = inner.arrival_listener.borrow().clone();
        if let Some(listener) = listener {
            for arrival in arrivals {
                listener(
                    arrival.topic,
                    QueueId(arrival.queue_id),
                    QueueOffset(arrival.queue_offset),
                );
            }
        }
    }

    /// Takes the unit at the front of `rest` into the log at `here` (the log's end), whole,
    /// or nothing.
    fn take_unit<'a>(&self, here: u64, rest: &'a [u8]) -> Result<Taken<'a>, StoreError> {
        let inner = &*self.inner;
        let segment_size = inner.config.segment_size_bytes;
        let mut log = inner.log.borrow_mut();
        log.writable()?;
        assert_eq!(
            log.tail.end(),
            here,
            "replicated units are taken back to back"
        );
        match classify(here, rest, segment_size)? {
            UnitKind::NeedMore => Ok(Taken::NeedMore),
            UnitKind::Filler(size) => {
                let segment_end = align_down(here, segment_size) + segment_size;
                self.room_for(&log, segment_end)?;
                // The filler's bytes as received (a header, then zeros on any master of ours).
                log.tail.push(&rest[..size]);
                Ok(Taken::Filler { size_bytes: size })
            }
            UnitKind::Record(size) => {
                let bytes = &rest[..size];
                let message = check_record(bytes, here)?;
                self.room_for(&log, here + size as u64)?;
                self.file_record(&mut log, bytes, &message)
            }
        }
    }

    /// Files a checked record at the log's end: its queue's unit and its index keys, then its
    /// bytes into the tail. What can fail (its queue, the index's room, the queue file) comes
    /// before the first byte is pushed.
    fn file_record<'a>(
        &self,
        log: &mut LogState,
        bytes: &'a [u8],
        message: &StoredMessage<'a>,
    ) -> Result<Taken<'a>, StoreError> {
        let inner = &*self.inner;
        let here = message.physical_offset;
        let (topic, queue_id, queue_offset) =
            (message.topic, message.queue_id, message.queue_offset);
        if let Some(queue) = inner.queues.borrow().get(topic, queue_id) {
            let (min, max) = (queue.min_offset(), queue.max_offset());
            if queue_offset != max && min != max {
                return Err(StoreError::ReplicaQueueMismatch {
                    offset: here,
                    topic: topic.to_string(),
                    queue_id,
                    expected: max,
                    got: queue_offset,
                });
            }
        }
        // As recovery's dispatch: the keys of the records RocketMQ indexes.
        let keys = if index::indexes_sys_flag(message.sys_flag) {
            MessageKeys::of(message.properties)
        } else {
            MessageKeys::none()
        };
        inner
            .index
            .borrow_mut()
            .prepare(keys.as_slice().len(), here)?;
        let unit = QueueUnit {
            physical_offset: here,
            size_bytes: message.total_size,
            tags_code: (inner.config.tags_code_of)(message),
        };
        {
            let mut queues = inner.queues.borrow_mut();
            let queue = queues.get_or_create(topic, queue_id)?;
            if queue.max_offset() != queue_offset {
                // An empty queue (checked above) starts at the master's offset.
                queue.start_at(queue_offset)?;
            }
            let written = queue.append(unit)?;
            assert_eq!(
                written, queue_offset,
                "a replicated unit lands at its queue offset"
            );
        }
        log.tail.push(bytes);
        log.last_store_timestamp_ms = log.last_store_timestamp_ms.max(message.store_timestamp_ms);
        log.stats.put_messages += 1;
        log.stats.put_bytes += bytes.len() as u64;
        let end = log.tail.end();
        let mut index = inner.index.borrow_mut();
        index.add(topic, keys.as_slice(), here, message.store_timestamp_ms);
        index.note_indexed(end);
        Ok(Taken::Record(Arrival {
            topic,
            queue_id,
            queue_offset,
            size_bytes: bytes.len(),
        }))
    }

    /// Moves the start of a store that never held anything (no message, queue or index file)
    /// to `offset`, a multiple of `segment_size_bytes`: afterwards `min_physical_offset() ==
    /// max_physical_offset() == offset`, and `append_replicated(offset, ..)` continues a master
    /// whose log is held from there. Calling it again at the same offset does nothing more.
    ///
    /// The segment files below `offset` (the empty ones `open` allocated) are removed, the one
    /// at `offset` is created and the allocation window ahead of it taken before this returns,
    /// and the directory is synced: a crash or a close from then on reopens the store at
    /// `offset` (recovery takes the first segment file as the log's start). A crash before that
    /// reopens it still empty, at 0 or at another segment start up to `offset` (so it can be
    /// started again). Async because that takes file I/O; the store's state moves at once, so
    /// appends made meanwhile land at `offset`, or are refused until its space is allocated.
    pub async fn start_empty_at(&self, offset: u64) -> Result<(), StoreError> {
        let inner = &self.inner;
        let segment_size = inner.config.segment_size_bytes;
        if !offset.is_multiple_of(segment_size) {
            return Err(StoreError::StartRefused {
                offset,
                reason: format!("not a multiple of segment_size_bytes {segment_size}"),
            });
        }
        let old_files = self.move_empty_start(offset)?;
        let dir = inner.log.borrow().segments.dir.clone();
        for &(start, _) in &old_files {
            // A zero-fill still under way on it writes into the unlinked file, harmlessly.
            let path = inner.log.borrow().segments.path_of(start);
            crate::runtime::fs::remove_if_present(&path)?;
            inner.log.borrow_mut().segments.recycled.remove(&start);
        }
        if !old_files.is_empty() {
            // Their descriptors close once no zero-fill chain can be writing through them; a
            // task of its own, so that dropping this future cannot close one too early.
            let keep = inner.clone();
            crate::runtime::spawn_detached(async move {
                flusher::chain_ended(&keep, super::commit_ring::Slot::ZeroFill).await;
                for (_, file) in old_files {
                    crate::runtime::fs::DirectFile::close_shared(file).await;
                }
            });
        }
        flusher::allocate_ahead(inner).await;
        if let Some(poison) = inner.log.borrow().poison.as_ref() {
            return Err(poison.to_error());
        }
        // Allocation short of space may not have got as far as the file.
        flusher::ensure_segments(inner, offset, offset + 1).await?;
        sync_dir(&dir).await?;
        Ok(())
    }

    /// Throws away everything the store holds — every message, consume queue, index file and
    /// the checkpoint's positions — and leaves it as `start_empty_at(offset)` leaves a store
    /// that never held anything: `min_physical_offset() == max_physical_offset() == offset`,
    /// no queue (`queue_ids` empty, every `max_queue_offset` 0), no index entry, and
    /// `append_replicated(offset, ..)` continues a master whose log is held from there. For a
    /// slave whose log cannot continue its master's; `offset` (a multiple of
    /// `segment_size_bytes`) may lie below, at or above the old end.
    ///
    /// The flusher does the work (`reset.rs`); meanwhile appends are refused
    /// (`StoreError::Resetting`). Pulls parked on the old queues are woken through the arrival
    /// listener and find nothing when they read again; `wait_durable` callers return (what
    /// they waited for is gone). Returns once the files are gone and the segment at `offset`
    /// is created with its allocation window, as `start_empty_at` does; a future dropped
    /// before that does not stop the reset.
    ///
    /// Crash safety: a marker file is made durable before anything is removed, and
    /// `Store::open` finishes an interrupted reset before recovery, so a crash reopens the old
    /// store unchanged, an empty store at 0 (to be started again with `start_empty_at`), or
    /// the reset store; never part of the old one.
    ///
    /// Refusals (`StartRefused`, the store unchanged): `offset` is not a segment start, the
    /// store does not take writes (poisoned, closing), or another reset is under way. A marker
    /// that cannot be written (a full disk) is refused with its I/O error, also unchanged. A
    /// failure once files are being removed poisons the store (a restart finishes the reset).
    pub async fn reset_empty_at(&self, offset: u64) -> Result<(), StoreError> {
        let segment_size = self.inner.config.segment_size_bytes;
        let refuse = |reason: String| StoreError::StartRefused { offset, reason };
        if !offset.is_multiple_of(segment_size) {
            return Err(refuse(format!(
                "not a multiple of segment_size_bytes {segment_size}"
            )));
        }
        let request = {
            let mut log = self.inner.log.borrow_mut();
            log.writable().map_err(|error| refuse(error.to_string()))?;
            let request = super::reset::ResetRequest::new(offset);
            log.reset = Some(request.clone());
            request
        };
        self.inner.notify.signal();
        request.outcome().await
    }

    /// `start_empty_at`'s synchronous part: checks that the store is empty and moves every
    /// position to `offset`. Returns the segment files below `offset`, taken out of the table.
    fn move_empty_start(
        &self,
        offset: u64,
    ) -> Result<Vec<(u64, Rc<crate::runtime::fs::DirectFile>)>, StoreError> {
        let inner = &*self.inner;
        let refuse = |reason: String| StoreError::StartRefused { offset, reason };
        let mut log = inner.log.borrow_mut();
        log.writable()?;
        let (min, end) = (log.min_physical_offset, log.tail.end());
        let never_held = end == min
            && inner.queues.borrow().is_empty()
            && inner.index.borrow().file_count() == 0;
        if !never_held {
            return Err(refuse(format!(
                "the store is not empty (its log holds [{min}, {end}), or it has consume \
                 queues or index files)"
            )));
        }
        if offset < end {
            return Err(refuse(format!(
                "the empty log starts at {end}; its start only moves forward"
            )));
        }
        if offset == end {
            return Ok(Vec::new());
        }
        let kept = log.segments.files.split_off(&offset);
        let old: Vec<_> = std::mem::replace(&mut log.segments.files, kept)
            .into_iter()
            .collect();
        // The chunk holding `offset` starts below it: zeros there, never read (below the
        // minimum) nor written (flushes start at the durable end).
        let prefix = vec![0u8; (offset % TAIL_CHUNK_BYTES) as usize];
        log.tail = Tail::new(offset, &prefix);
        log.min_physical_offset = offset;
        log.flush.start_at(offset);
        // Space already allocated past `offset` lies in the files kept.
        log.space.allocated_end = log.space.allocated_end.max(offset);
        drop(log);
        inner.index.borrow_mut().note_indexed(offset);
        inner.read_cache.borrow_mut().forget_below(offset);
        inner.notify.signal();
        Ok(old)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::path::Path;
    use std::rc::Rc;

    use super::*;
    use crate::store::reset::MARKER_FILE_NAME;
    use crate::store::{
        checkpoint, FlushMode, GetStatus, MessageQuery, MessageToStore, StoreConfig,
    };

    /// Small segments, so a few hundred messages cross several of them (with fillers), and
    /// small queue files, so queues that start mid-log start inside a file.
    const SEGMENT_BYTES: u64 = 64 << 10;
    const UNITS_PER_FILE: u64 = 64;
    const QUEUES: u32 = 3;
    /// An awkward transfer size: the HA stream cuts records anywhere.
    const CHUNK_BYTES: usize = 1000;

    fn config(dir: &Path) -> StoreConfig {
        let mut config = StoreConfig::new(dir.to_path_buf(), "10.1.2.3:10911".parse().unwrap());
        config.flush_mode = FlushMode::Async;
        config.flush_interval_ms = 20;
        config.segment_size_bytes = SEGMENT_BYTES;
        config.consume_queue_units_per_file = UNITS_PER_FILE;
        config
    }

    /// Body lengths vary so that records end anywhere in a segment.
    fn body_len(i: u64) -> usize {
        100 + (i as usize * 397) % 1500
    }

    fn append(store: &Store, topic: &str, i: u64) {
        try_append(store, topic, i).expect("append");
    }

    /// `append`, waiting while the store asks to (a log that outruns its allocation window).
    async fn append_waiting(store: &Store, topic: &str, i: u64) {
        loop {
            match try_append(store, topic, i) {
                Ok(()) => return,
                Err(error) if is_wait_error(&error) => {
                    crate::runtime::sleep(std::time::Duration::from_millis(5)).await
                }
                Err(error) => panic!("append {i}: {error}"),
            }
        }
    }

    fn try_append(store: &Store, topic: &str, i: u64) -> Result<(), StoreError> {
        let mut body = format!("message-{i}-").into_bytes();
        body.resize(body_len(i), b'a' + (i % 26) as u8);
        let properties = format!("TAGS\u{1}tag{}\u{2}KEYS\u{1}k{i}\u{2}", i % 5);
        let message = MessageToStore {
            topic,
            queue_id: (i % u64::from(QUEUES)) as u32,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: 1_000 + i as i64,
            born_host: "192.168.0.9:40000".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: &body,
            properties: properties.as_bytes(),
            tags_code: i64::from(record::java_string_hash(&format!("tag{}", i % 5))),
        };
        store.append(&message).map(|_| ())
    }

    /// The whole raw log `[from, max)`, read in `CHUNK_BYTES` pieces.
    async fn raw_log(store: &Store, from: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        loop {
            let piece = store
                .read_log(from + bytes.len() as u64, CHUNK_BYTES)
                .await
                .unwrap();
            if piece.is_empty() {
                return bytes;
            }
            assert!(piece.len() <= CHUNK_BYTES);
            bytes.extend_from_slice(&piece);
        }
    }

    /// Replicates `master`'s log from `slave`'s end to `master`'s, as an HA client does:
    /// `CHUNK_BYTES` transfers, the unconsumed rest kept and given again with the next one.
    async fn replicate(master: &Store, slave: &Store) {
        let mut pending: Vec<u8> = Vec::new();
        let end = master.max_physical_offset().0;
        let mut next = slave.max_physical_offset().0;
        while next < end {
            let piece = master.read_log(next, CHUNK_BYTES).await.unwrap();
            next += piece.len() as u64;
            pending.extend_from_slice(&piece);
            loop {
                let at = slave.max_physical_offset().0;
                match slave.append_replicated(at, &pending) {
                    Ok(consumed) => {
                        pending.drain(..consumed);
                        break;
                    }
                    Err(error) if is_wait_error(&error) => {
                        crate::runtime::sleep(std::time::Duration::from_millis(5)).await
                    }
                    Err(error) => panic!("append_replicated at {at}: {error}"),
                }
            }
            assert!(pending.len() <= REPLICA_UNIT_MAX_BYTES);
        }
        // Whatever is left is a unit the next transfer completes: none at the master's end.
        let at = slave.max_physical_offset().0;
        assert_eq!(
            slave.append_replicated(at, &pending).unwrap(),
            pending.len()
        );
        assert_eq!(slave.max_physical_offset(), master.max_physical_offset());
    }

    /// One queue as a consumer sees it: its bounds and every record pulled from its minimum,
    /// as stored (printed by size and checksum, so a failure reads at a glance).
    #[derive(Clone, PartialEq)]
    struct QueueView {
        min: u64,
        max: u64,
        body: Vec<u8>,
    }

    impl std::fmt::Debug for QueueView {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let crc = crc32fast::hash(&self.body);
            let (min, max, len) = (self.min, self.max, self.body.len());
            write!(f, "[{min}, {max}) {len} bytes crc {crc:08x}")
        }
    }

    /// Every queue of topic "T".
    async fn queues_of(store: &Store) -> Vec<QueueView> {
        let mut out = Vec::new();
        for queue in 0..QUEUES {
            let id = QueueId(queue);
            let (min, max) = (
                store.min_queue_offset("T", id).0,
                store.max_queue_offset("T", id).0,
            );
            let mut body = Vec::new();
            let mut next = min;
            while next < max {
                let found = store
                    .get_messages("T", id, QueueOffset(next), 32, 1 << 20, &|_| true)
                    .await
                    .unwrap();
                assert!(found.message_count > 0, "queue {queue} at {next}");
                body.extend_from_slice(&found.body);
                next = found.next_begin_offset.0;
            }
            out.push(QueueView { min, max, body });
        }
        out
    }

    async fn found_by_key(store: &Store, key: &str) -> u32 {
        let query = MessageQuery {
            topic: "T",
            key,
            max_messages: 8,
            begin_timestamp_ms: 0,
            end_timestamp_ms: i64::MAX,
            unique_key: false,
        };
        store.query_messages(&query).await.unwrap().message_count
    }

    fn first_segment_file(dir: &Path) -> String {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("commitlog"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names.remove(0)
    }

    #[test]
    fn a_slave_fed_in_awkward_chunks_holds_the_masters_log_byte_for_byte() {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        crate::runtime::run_local(|| async {
            let master = Store::open(config(master_dir.path())).await.unwrap();
            const MESSAGES: u64 = 300;
            for i in 0..MESSAGES {
                append(&master, "T", i);
            }
            assert!(
                master.max_physical_offset().0 > 3 * SEGMENT_BYTES,
                "crosses segments"
            );
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            let arrivals = Rc::new(Cell::new(0u64));
            let counted = arrivals.clone();
            slave.set_arrival_listener(Rc::new(move |_, _, _| counted.set(counted.get() + 1)));
            replicate(&master, &slave).await;
            assert_eq!(arrivals.get(), MESSAGES, "every record wakes its pulls");
            assert_eq!(slave.stats().put_messages, MESSAGES);
            assert_eq!(raw_log(&slave, 0).await, raw_log(&master, 0).await);
            let masters = queues_of(&master).await;
            assert_eq!(queues_of(&slave).await, masters);
            for i in [0, 1, 150, MESSAGES - 1] {
                assert_eq!(found_by_key(&slave, &format!("k{i}")).await, 1, "k{i}");
            }

            slave.close().await.unwrap();
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            assert_eq!(slave.max_physical_offset(), master.max_physical_offset());
            assert_eq!(queues_of(&slave).await, masters);
            assert_eq!(found_by_key(&slave, "k150").await, 1);
            // It goes on where it stopped.
            for i in MESSAGES..MESSAGES + 50 {
                append(&master, "T", i);
            }
            replicate(&master, &slave).await;
            assert_eq!(queues_of(&slave).await, queues_of(&master).await);
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn an_empty_slave_starts_at_the_masters_last_segment_with_its_queue_offsets() {
        // Queues that go on into a second consume-queue file after the one they start in.
        start_at_the_masters_last_segment(UNITS_PER_FILE);
    }

    #[test]
    fn a_queue_that_starts_inside_its_only_file_recovers_its_start() {
        // Nothing past the first file: only its start mark tells where the queue begins.
        start_at_the_masters_last_segment(4 * UNITS_PER_FILE);
    }

    fn start_at_the_masters_last_segment(slave_units_per_file: u64) {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let slave_config = |dir: &Path| StoreConfig {
            consume_queue_units_per_file: slave_units_per_file,
            ..config(dir)
        };
        crate::runtime::run_local(|| async {
            let master = Store::open(config(master_dir.path())).await.unwrap();
            for i in 0..400 {
                append(&master, "T", i);
            }
            let last_segment = align_down(master.max_physical_offset().0, SEGMENT_BYTES);
            assert!(last_segment >= 2 * SEGMENT_BYTES, "2+ segments before it");
            let slave = Store::open(slave_config(slave_dir.path())).await.unwrap();
            slave.start_empty_at(last_segment).await.unwrap();
            assert_eq!(slave.min_physical_offset().0, last_segment);
            assert_eq!(slave.max_physical_offset().0, last_segment);
            assert_eq!(
                first_segment_file(slave_dir.path()),
                format!("{last_segment:020}")
            );
            replicate(&master, &slave).await;
            assert_eq!(
                raw_log(&slave, last_segment).await,
                raw_log(&master, last_segment).await
            );

            // Each queue starts at the master's offset of its first record in that segment.
            let check = |slave_queues: Vec<QueueView>| {
                let mut mid_file = false;
                for (queue, QueueView { min, max, body }) in slave_queues.into_iter().enumerate() {
                    let id = QueueId(queue as u32);
                    assert_eq!(max, master.max_queue_offset("T", id).0);
                    let unit = master
                        .queue_unit("T", id, QueueOffset(min))
                        .unwrap()
                        .unwrap();
                    assert!(unit.0 .0 >= last_segment, "queue {queue}");
                    let before = master.queue_unit("T", id, QueueOffset(min - 1)).unwrap();
                    assert!(before.unwrap().0 .0 < last_segment, "queue {queue}");
                    let first = record::decode(&body).unwrap();
                    assert_eq!(first.queue_offset, min);
                    mid_file |= min % slave_units_per_file != 0;
                }
                assert!(mid_file, "a queue starts inside a consume-queue file");
            };
            let slave_queues = queues_of(&slave).await;
            check(slave_queues.clone());
            for (queue, QueueView { min, max, body }) in slave_queues.iter().enumerate() {
                let id = QueueId(queue as u32);
                let from_master = master
                    .get_messages("T", id, QueueOffset(*min), 1024, 16 << 20, &|_| true)
                    .await
                    .unwrap();
                assert_eq!(from_master.message_count as u64, max - min);
                assert_eq!(&from_master.body, body);
                assert_eq!(
                    slave.queue_unit("T", id, QueueOffset(min - 1)).unwrap(),
                    None
                );
            }

            slave.close().await.unwrap();
            let slave = Store::open(slave_config(slave_dir.path())).await.unwrap();
            assert_eq!(slave.min_physical_offset().0, last_segment);
            assert_eq!(slave.max_physical_offset(), master.max_physical_offset());
            assert_eq!(queues_of(&slave).await, slave_queues);
            for i in 400..450 {
                append(&master, "T", i);
            }
            replicate(&master, &slave).await;
            check(queues_of(&slave).await);
            assert_eq!(found_by_key(&slave, "k449").await, 1);
            // A crash (no close) recovers the same.
            let end = slave.max_physical_offset();
            slave.wait_durable(end).await.unwrap();
            let after = queues_of(&slave).await;
            drop(slave);
            let slave = Store::open(slave_config(slave_dir.path())).await.unwrap();
            assert_eq!(slave.max_physical_offset(), end);
            assert_eq!(queues_of(&slave).await, after);
            // Queues lost with their files are rebuilt from the log, at the same offsets.
            slave.close().await.unwrap();
            std::fs::remove_dir_all(slave_dir.path().join("consumequeue")).unwrap();
            let slave = Store::open(slave_config(slave_dir.path())).await.unwrap();
            assert_eq!(queues_of(&slave).await, after);
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn a_refusal_after_some_units_answers_with_what_was_taken() {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        crate::runtime::run_local(|| async {
            let master = Store::open(config(master_dir.path())).await.unwrap();
            // More than the slave has allocated ahead of its writes (64 KiB segments: the
            // window is bounded by its file count), so one call cannot take it all.
            let mut i = 0;
            while master.max_physical_offset().0 < 6 << 20 {
                append_waiting(&master, "T", i).await;
                i += 1;
            }
            let log = raw_log(&master, 0).await;
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            let taken = slave.append_replicated(0, &log).unwrap();
            assert!(taken > 0 && taken < log.len(), "{taken} of {}", log.len());
            assert_eq!(slave.max_physical_offset().0, taken as u64);
            let refused = slave.append_replicated(taken as u64, &log[taken..]);
            assert!(
                matches!(&refused, Err(error) if is_wait_error(error)),
                "{refused:?}"
            );
            replicate(&master, &slave).await;
            assert_eq!(raw_log(&slave, 0).await, log);
            assert_eq!(queues_of(&slave).await, queues_of(&master).await);
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        crate::runtime::run_local(|| async {
            let master = Store::open(config(dirs[0].path())).await.unwrap();
            for i in 0..3 {
                append(&master, "T", i * u64::from(QUEUES)); // all on queue 0
            }
            let log = raw_log(&master, 0).await;
            let slave = Store::open(config(dirs[1].path())).await.unwrap();

            let wrong_at = slave.append_replicated(5, &log);
            assert!(matches!(
                wrong_at,
                Err(StoreError::ReplicaMismatch {
                    expected: 0,
                    got: 5
                })
            ));
            let garbage = slave.append_replicated(0, &[0xAB; 300]);
            assert!(matches!(
                garbage,
                Err(StoreError::Corrupt { offset: 0, .. })
            ));
            // The second record at the log's start names another position.
            let first_size = record::peek_header(&log).unwrap().0 as usize;
            let misplaced = slave.append_replicated(0, &log[first_size..]);
            assert!(matches!(
                misplaced,
                Err(StoreError::Corrupt { offset: 0, .. })
            ));
            let mut damaged = log.clone();
            damaged[100] ^= 0xFF; // in the first record's body: BODYCRC fails
            assert!(matches!(
                slave.append_replicated(0, &damaged),
                Err(StoreError::Corrupt { offset: 0, .. })
            ));
            assert_eq!(slave.max_physical_offset().0, 0, "nothing taken");

            // A partial record waits for the rest; then it is taken whole.
            assert_eq!(
                slave.append_replicated(0, &log[..first_size - 1]).unwrap(),
                0
            );
            assert_eq!(
                slave.append_replicated(0, &log[..first_size]).unwrap(),
                first_size
            );
            // A unit after a good one: the good one stays, the error names the bad one.
            let mut tail = log[first_size..].to_vec();
            tail[4] = 0x11; // the second record's magic
            let at = first_size as u64;
            assert!(matches!(
                slave.append_replicated(at, &tail),
                Err(StoreError::Corrupt { offset, .. }) if offset == at
            ));

            // The other master's log holds, at the same position, a record of the same size
            // in queue 0 with queue offset 0: it does not continue the slave's queue.
            let other = Store::open(config(dirs[2].path())).await.unwrap();
            append(&other, "X", 0);
            append(&other, "T", 0);
            let other_log = raw_log(&other, 0).await;
            assert_eq!(
                record::peek_header(&other_log).unwrap().0 as usize,
                first_size
            );
            let mismatch = slave.append_replicated(at, &other_log[first_size..]);
            assert!(
                matches!(
                    mismatch,
                    Err(StoreError::ReplicaQueueMismatch {
                        expected: 1,
                        got: 0,
                        ..
                    })
                ),
                "{mismatch:?}"
            );
            assert_eq!(slave.max_physical_offset().0, at, "nothing of it stored");

            let below = slave.read_log(0, 10).await;
            assert!(below.is_ok());
            let past = slave.read_log(at + 1, 10).await;
            assert!(
                matches!(past, Err(StoreError::OutOfRange { offset, min: 0, max }) if
                offset == at + 1 && max == at)
            );
            assert!(slave.read_log(at, 10).await.unwrap().is_empty());

            let not_empty = slave.start_empty_at(SEGMENT_BYTES).await;
            assert!(matches!(not_empty, Err(StoreError::StartRefused { .. })));
            let empty = Store::open(config(dirs[2].path().join("empty").as_path()))
                .await
                .unwrap();
            let unaligned = empty.start_empty_at(SEGMENT_BYTES + 4096).await;
            assert!(matches!(unaligned, Err(StoreError::StartRefused { .. })));
            empty.start_empty_at(2 * SEGMENT_BYTES).await.unwrap();
            empty.start_empty_at(2 * SEGMENT_BYTES).await.unwrap();
            let backwards = empty.start_empty_at(SEGMENT_BYTES).await;
            assert!(matches!(backwards, Err(StoreError::StartRefused { .. })));
            let below_min = empty.read_log(0, 10).await;
            assert!(matches!(
                below_min,
                Err(StoreError::OutOfRange { offset: 0, min, max }) if min == max
                    && min == 2 * SEGMENT_BYTES
            ));
            for store in [empty, other, slave, master] {
                store.close().await.unwrap();
            }
        });
    }

    /// Messages of this store's own, before a reset: topic "T" (keys k1000.., which no master
    /// of these tests writes) and topic "OLD", in every queue, with their index entries.
    async fn hold_old_messages(store: &Store) {
        for i in 1000..1100 {
            append_waiting(store, "T", i).await;
            append_waiting(store, "OLD", i).await;
        }
        assert_eq!(store.queue_ids("OLD").len(), QUEUES as usize);
        assert!(store.index_file_count() > 0);
        assert_eq!(found_by_key(store, "k1050").await, 1);
    }

    /// A master holding `messages` records of topic "T" (keys k0..), and its last segment's
    /// start, where a slave reset past its own end takes up.
    async fn master_with(dir: &Path, messages: u64) -> (Store, u64) {
        let master = Store::open(config(dir)).await.unwrap();
        for i in 0..messages {
            append_waiting(&master, "T", i).await;
        }
        let last_segment = align_down(master.max_physical_offset().0, SEGMENT_BYTES);
        (master, last_segment)
    }

    fn segment_starts(dir: &Path) -> Vec<u64> {
        let mut starts: Vec<u64> = std::fs::read_dir(dir.join("commitlog"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .map(|name| name.parse().unwrap())
            .collect();
        starts.sort_unstable();
        starts
    }

    fn entries_in(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().count()
    }

    /// What a store emptied at `offset` answers, and holds on disk.
    async fn assert_empty_at(store: &Store, dir: &Path, offset: u64) {
        assert_eq!(store.min_physical_offset().0, offset);
        assert_eq!(store.max_physical_offset().0, offset);
        assert_eq!(store.durable_offset().0, offset);
        assert_eq!(store.stats().write_offset, offset);
        for topic in ["T", "OLD"] {
            assert!(store.queue_ids(topic).is_empty(), "{topic}");
            for queue in 0..QUEUES {
                let id = QueueId(queue);
                assert_eq!(store.max_queue_offset(topic, id).0, 0);
                assert_eq!(store.min_queue_offset(topic, id).0, 0);
                let pulled = store
                    .get_messages(topic, id, QueueOffset(5), 32, 1 << 20, &|_| true)
                    .await
                    .unwrap();
                assert_eq!(pulled.status, GetStatus::NoMessageInQueue);
                assert_eq!((pulled.message_count, pulled.max_offset.0), (0, 0));
                assert!(pulled.body.is_empty());
            }
        }
        assert_eq!(store.index_file_count(), 0);
        assert_eq!(found_by_key(store, "k1050").await, 0);
        assert!(store.read_log(offset, 10).await.unwrap().is_empty());
        if offset > 0 {
            assert!(matches!(
                store.read_log(offset - 4096, 10).await,
                Err(StoreError::OutOfRange { min, .. }) if min == offset
            ));
        }
        let starts = segment_starts(dir);
        assert_eq!(starts.first(), Some(&offset), "the first segment file");
        assert_eq!(entries_in(&dir.join("consumequeue")), 0);
        assert_eq!(entries_in(&dir.join("index")), 0);
        assert!(!dir.join(MARKER_FILE_NAME).exists());
        // A checkpoint written since describes the empty log, never the old one.
        if let Some(saved) = checkpoint::read(dir) {
            assert_eq!(saved.commitlog_offset, offset);
            assert!(saved.queues.is_empty(), "{:?}", saved.queues);
        }
    }

    /// The slave's queues hold exactly the master's records from the slave's log start on,
    /// at the master's queue offsets.
    async fn assert_queues_follow(slave: &Store, master: &Store, start: u64) {
        assert!(slave.queue_ids("OLD").is_empty());
        let ids: Vec<u32> = slave.queue_ids("T").into_iter().map(|id| id.0).collect();
        assert_eq!(ids, (0..QUEUES).collect::<Vec<_>>());
        for (queue, QueueView { min, max, body }) in queues_of(slave).await.into_iter().enumerate()
        {
            let id = QueueId(queue as u32);
            assert_eq!(max, master.max_queue_offset("T", id).0, "queue {queue}");
            let first = master
                .queue_unit("T", id, QueueOffset(min))
                .unwrap()
                .unwrap();
            assert!(
                first.0 .0 >= start,
                "queue {queue} starts in the slave's log"
            );
            if min > 0 {
                let before = master.queue_unit("T", id, QueueOffset(min - 1)).unwrap();
                assert!(before.unwrap().0 .0 < start, "queue {queue} misses nothing");
            }
            let from_master = master
                .get_messages("T", id, QueueOffset(min), 1024, 16 << 20, &|_| true)
                .await
                .unwrap();
            assert_eq!(from_master.message_count as u64, max - min);
            assert_eq!(from_master.body, body, "queue {queue}");
        }
    }

    #[test]
    fn a_slave_reset_past_its_end_follows_its_master_from_there() {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        crate::runtime::run_local(|| async {
            let (master, start) = master_with(master_dir.path(), 600).await;
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            hold_old_messages(&slave).await;
            let old_end = slave.max_physical_offset().0;
            assert!(start > old_end, "{start} past the slave's end {old_end}");
            let told = Rc::new(std::cell::RefCell::new(Vec::new()));
            let telling = told.clone();
            slave.set_arrival_listener(Rc::new(move |topic, id, offset| {
                telling
                    .borrow_mut()
                    .push((topic.to_string(), id.0, offset.0));
            }));

            slave.reset_empty_at(start).await.unwrap();
            // Pulls parked on every old queue are woken to read again.
            let mut woken = told.take();
            woken.sort();
            let every_old_queue: Vec<_> = ["OLD", "T"]
                .into_iter()
                .flat_map(|topic| (0..QUEUES).map(move |id| (topic.to_string(), id, 0)))
                .collect();
            assert_eq!(woken, every_old_queue);
            assert_empty_at(&slave, slave_dir.path(), start).await;
            // Again, now at its end: the same store.
            slave.reset_empty_at(start).await.unwrap();
            assert_empty_at(&slave, slave_dir.path(), start).await;
            assert_eq!(told.take().len(), 0, "no queue to wake");

            replicate(&master, &slave).await;
            assert_eq!(raw_log(&slave, start).await, raw_log(&master, start).await);
            assert_eq!(slave.min_physical_offset().0, start);
            assert_queues_follow(&slave, &master, start).await;
            let arrived = told.take().len() as u64;
            let queued: u64 = queues_of(&slave).await.iter().map(|q| q.max - q.min).sum();
            assert_eq!(arrived, queued, "each new record wakes its pulls");
            assert_eq!(found_by_key(&slave, "k599").await, 1);
            assert_eq!(found_by_key(&slave, "k1050").await, 0, "an old key");
            assert_eq!(
                found_by_key(&slave, "k0").await,
                0,
                "below the reset offset"
            );
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn a_slave_reset_to_zero_or_below_its_end_takes_another_masters_log() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        crate::runtime::run_local(|| async {
            // The old master's log and the new one's part at offset 0 (a promoted slave that
            // never had the old master's records), or anywhere after.
            let old_master = Store::open(config(dirs[0].path())).await.unwrap();
            for i in 1000..1300 {
                append_waiting(&old_master, "T", i).await;
            }
            let (new_master, _) = master_with(dirs[1].path(), 300).await;
            let slave = Store::open(config(dirs[2].path())).await.unwrap();
            replicate(&old_master, &slave).await;
            assert_eq!(found_by_key(&slave, "k1050").await, 1);

            slave.reset_empty_at(0).await.unwrap();
            assert_empty_at(&slave, dirs[2].path(), 0).await;
            replicate(&new_master, &slave).await;
            assert_eq!(raw_log(&slave, 0).await, raw_log(&new_master, 0).await);
            assert_eq!(queues_of(&slave).await, queues_of(&new_master).await);
            assert_eq!(found_by_key(&slave, "k150").await, 1);
            assert_eq!(found_by_key(&slave, "k1050").await, 0);

            let inside = 2 * SEGMENT_BYTES;
            assert!(inside < slave.max_physical_offset().0, "below the end");
            slave.reset_empty_at(inside).await.unwrap();
            assert_empty_at(&slave, dirs[2].path(), inside).await;
            replicate(&new_master, &slave).await;
            assert_eq!(
                raw_log(&slave, inside).await,
                raw_log(&new_master, inside).await
            );
            assert_queues_follow(&slave, &new_master, inside).await;
            assert!(slave.min_queue_offset("T", QueueId(0)).0 > 0);
            assert_eq!(found_by_key(&slave, "k299").await, 1);
            assert_eq!(found_by_key(&slave, "k0").await, 0);
            for store in [slave, new_master, old_master] {
                store.close().await.unwrap();
            }
        });
    }

    #[test]
    fn a_reset_store_reopens_reset() {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        crate::runtime::run_local(|| async {
            let (master, start) = master_with(master_dir.path(), 600).await;
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            hold_old_messages(&slave).await;
            slave.reset_empty_at(start).await.unwrap();
            slave.close().await.unwrap();
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            assert_empty_at(&slave, slave_dir.path(), start).await;
            let recovered = slave.config().progress.recovered.get().unwrap();
            assert_eq!((recovered.scan_from, recovered.end), (start, start));

            replicate(&master, &slave).await;
            slave.close().await.unwrap();
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            assert_eq!(raw_log(&slave, start).await, raw_log(&master, start).await);
            assert_queues_follow(&slave, &master, start).await;
            assert_eq!(found_by_key(&slave, "k599").await, 1);

            // A crash just after a reset (below the end this time) reopens it reset too.
            slave.reset_empty_at(SEGMENT_BYTES).await.unwrap();
            drop(slave);
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            assert_empty_at(&slave, slave_dir.path(), SEGMENT_BYTES).await;
            // And what it replicated since, once durable.
            replicate(&master, &slave).await;
            let end = slave.max_physical_offset();
            slave.wait_durable(end).await.unwrap();
            let queues = queues_of(&slave).await;
            drop(slave);
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            assert_eq!(slave.max_physical_offset(), end);
            assert_eq!(queues_of(&slave).await, queues);
            assert_queues_follow(&slave, &master, SEGMENT_BYTES).await;
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn a_reset_cut_short_by_a_crash_reopens_empty() {
        let master_dir = tempfile::tempdir().unwrap();
        // Where a crash can leave the files once the marker is durable: all of them still
        // there, the queues and checkpoint gone (recovery would rebuild the queues from the
        // log), the commitlog gone (the queues would point at removed records).
        let cuts: [&[&str]; 3] = [&[], &["consumequeue", "checkpoint"], &["commitlog"]];
        crate::runtime::run_local(|| async {
            let (master, start) = master_with(master_dir.path(), 600).await;
            for removed in cuts {
                let slave_dir = tempfile::tempdir().unwrap();
                let dir = slave_dir.path();
                let slave = Store::open(config(dir)).await.unwrap();
                hold_old_messages(&slave).await;
                slave.close().await.unwrap();
                std::fs::write(dir.join(MARKER_FILE_NAME), b"").unwrap();
                for name in removed {
                    let path = dir.join(name);
                    if path.is_dir() {
                        std::fs::remove_dir_all(path).unwrap();
                    } else {
                        std::fs::remove_file(path).unwrap();
                    }
                }

                let slave = Store::open(config(dir)).await.unwrap();
                assert_empty_at(&slave, dir, 0).await;
                let recovered = slave.config().progress.recovered.get().unwrap();
                assert_eq!(recovered.end, 0, "{removed:?}");
                // The slave starts again as any empty one does.
                slave.start_empty_at(start).await.unwrap();
                replicate(&master, &slave).await;
                assert_queues_follow(&slave, &master, start).await;
                slave.close().await.unwrap();
            }
            master.close().await.unwrap();
        });
    }

    #[test]
    fn a_reset_forgets_the_cold_windows_read_from_the_old_log() {
        let (master_dir, slave_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Past the bytes the tail keeps in memory, so that pulls of the log's start read
        // windows from disk into the read cache.
        const LOG_BYTES: u64 = 6 << 20;
        let pull_start = |store: &Store| {
            let store = store.clone();
            async move {
                let found = store
                    .get_messages("T", QueueId(0), QueueOffset(0), 32, 1 << 20, &|_| true)
                    .await
                    .unwrap();
                assert_eq!(found.message_count, 32);
                found.body
            }
        };
        crate::runtime::run_local(|| async {
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            let mut i = 1_000_000;
            while slave.max_physical_offset().0 < LOG_BYTES {
                append_waiting(&slave, "T", i).await;
                i += 1;
            }
            slave.close().await.unwrap();
            let slave = Store::open(config(slave_dir.path())).await.unwrap();
            let old_body = pull_start(&slave).await;
            assert!(slave.stats().read_cache_misses > 0, "read from disk");

            let master = Store::open(config(master_dir.path())).await.unwrap();
            let mut i = 0;
            while master.max_physical_offset().0 < LOG_BYTES {
                append_waiting(&master, "T", i).await;
                i += 1;
            }
            slave.reset_empty_at(0).await.unwrap();
            replicate(&master, &slave).await;
            let end = slave.max_physical_offset();
            slave.wait_durable(end).await.unwrap();
            let new_body = pull_start(&slave).await;
            assert_ne!(new_body, old_body);
            assert_eq!(new_body, pull_start(&master).await);
            assert_eq!(slave.stats().corrupt_records, 0);
            slave.close().await.unwrap();
            master.close().await.unwrap();
        });
    }

    #[test]
    fn a_reset_is_refused_unaligned_twice_at_once_or_closing() {
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::run_local(|| async {
            let store = Store::open(config(dir.path())).await.unwrap();
            hold_old_messages(&store).await;
            let (end, queues) = (store.max_physical_offset(), queues_of(&store).await);
            let unaligned = store.reset_empty_at(SEGMENT_BYTES + 4096).await;
            assert!(
                matches!(unaligned, Err(StoreError::StartRefused { offset, .. })
                    if offset == SEGMENT_BYTES + 4096),
                "{unaligned:?}"
            );
            assert_eq!(store.max_physical_offset(), end, "unchanged");
            assert_eq!(queues_of(&store).await, queues);
            assert_eq!(found_by_key(&store, "k1050").await, 1);

            // While one reset runs, a second one and appends are refused.
            let offset = 8 * SEGMENT_BYTES;
            let (first, (second, appended)) =
                futures_lite::future::zip(store.reset_empty_at(offset), async {
                    (store.reset_empty_at(0).await, try_append(&store, "T", 7))
                })
                .await;
            first.unwrap();
            assert!(
                matches!(&second, Err(StoreError::StartRefused { offset: 0, reason })
                    if reason.contains("emptied")),
                "{second:?}"
            );
            assert!(
                matches!(appended, Err(StoreError::Resetting { offset: o }) if o == offset),
                "{appended:?}"
            );
            assert_empty_at(&store, dir.path(), offset).await;
            assert_eq!(
                store.stats().put_messages,
                200,
                "the refused append is not counted"
            );

            store.close().await.unwrap();
            let closed = store.reset_empty_at(0).await;
            assert!(
                matches!(closed, Err(StoreError::StartRefused { offset: 0, .. })),
                "{closed:?}"
            );
        });
    }
}
