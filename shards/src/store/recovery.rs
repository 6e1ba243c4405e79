//! Opening a store: the glommio probe trap, then recovery of the commitlog and the queues.
//!
//! Runs once in `Store::open`, before the flusher exists, so it may write files itself.
//!
//! 0. A reset that a crash interrupted (its marker is there, `reset.rs`) is finished first:
//!    every message, consume queue, index file and the checkpoint go, and the store opens
//!    empty.
//!
//! 1. Prime glommio's io_uring poll-ring probe with a non-empty file (ARCHITECTURE §5): glommio
//!    0.9 reads the first DMA file opened on a device (per thread) to decide whether the device
//!    takes polled I/O; on an empty file the read "succeeds", the device is marked pollable,
//!    and every later O_DIRECT read on a virtio disk fails with EOPNOTSUPP (os error 95).
//! 2. Scan the commitlog from the start of the segment holding the checkpoint (or from the
//!    first segment when there is none, it does not fit the files, or a queue on disk holds
//!    fewer units than it recorded), checking every record's TOTALSIZE, magic, BODYCRC,
//!    PHYSICALOFFSET, topic and the last byte of its properties (see `dispatch`). A blank
//!    filler moves to the next segment. Zeros past what the checkpoint knew durable end the
//!    log; so does any other bad record there, unless a valid record follows beyond what a
//!    torn flush can reach (`past_damage`): that is damage in the middle of the log, as is
//!    any bad record below the checkpoint's mark. Damage is logged with its offsets and
//!    stepped over (those records are lost; the rest is kept), never served.
//! 3. Re-dispatch a consume-queue unit for every scanned record (at the QUEUEOFFSET it
//!    carries, so it is idempotent), except the records below the checkpoint whose units the
//!    queues were found holding, then cut every queue back to its units below the end. The
//!    queues are read here with pread, not mapped (`ConsumeQueue::probe_unit`): a node with
//!    100,000 queues opens in seconds and holds no map for a queue nobody writes. A queue
//!    the scan finds without files (a crash came while a creation storm's files were being
//!    made) holds its units in memory, as during the storm, and the store opens without
//!    making its files: they are made once it serves (`queue_files.rs`), and the checkpoint
//!    recovery writes leaves those queues out (`Checkpoint::awaiting_from`). Only past
//!    `NEW_QUEUES_MAX` such queues or `UNITS_IN_MEMORY_MAX` units does the scan make their
//!    files itself, on several threads, writing the units with pwrite.
//! 4. Unless the previous stop was clean, zero the commitlog from the end for as many bytes as
//!    a flush could have written past the durable end, so that a torn or unacknowledged tail
//!    never reappears once later appends land in front of it; delete segments past the next
//!    (but for recycled ones, `retention.rs`). A store that keeps no recycled file (a slave,
//!    or recycling turned off) makes them plain again (`plain_again`).
//!
//! After a restart of the machine (the checkpoint a synced one that names a queue catalog,
//! `catalog.rs`) the queues come from that catalog, and no queue directory or file is read:
//! a queue takes the checkpoint's count as its end, the units the scan rebuilds at or past it
//! wait in memory, and units its files may hold past that count (written before the power
//! loss for records the log lost) are zeroed once the store serves, when the queue is settled
//! (`Settle` in consume_queue.rs). Until then no checkpoint is written, recovery's own
//! included. A queue directory the catalog does not list and the scan does not write is left
//! alone; a later start that walks the directories finds it counted by no trusted checkpoint
//! and written by no record, and takes it for empty (its units point at records the log
//! lost, and would point at the records written since in their place).
//!
//! 5. Move every queue's minimum offset to its first unit at or past the first segment (the
//!    files below it that retention had not removed yet go), then write a (not clean)
//!    checkpoint at the recovered end. After a crash (the saved checkpoint not clean) on a
//!    machine that names its boot it is a light one, and the rebuilt queues are left to the
//!    flusher's first synced checkpoint, asked for at once: the synced checkpoint stays
//!    until then, so a power loss meanwhile recovers from it again. Otherwise the rebuilt
//!    queues are synced first and the checkpoint is a synced one.
//!
//! The message index (`index.rs`) rides along: it is opened first, trusting what the
//! checkpoint's mark covers; the scan starts no later than the segment holding its indexed
//! end, indexes every record at or past that end, and the index is then cut back to the
//! recovered end like the queues.

use std::io;
use std::path::Path;

use crate::runtime::fs::DirectFile;
use crate::runtime::read_ahead::ReadAhead;
use crate::runtime::workarounds;

use super::catalog;
use super::checkpoint::{self, Checkpoint};
use super::consume_queue::{QueueTable, Unit};
use super::flusher::ZERO_FILL_CHUNK_BYTES;
use super::index::{self, Index, MessageKeys};
use super::record::{self, BLANK_MAGIC_CODE, MAGIC_CODE_V1, MAGIC_CODE_V2};
use super::segments::{align_down, align_up, Segments, BLOCK_BYTES};
use super::tail::{Tail, TAIL_CHUNK_BYTES};
use super::TAIL_UNDURABLE_MAX_BYTES;
use super::{validate_topic, StoreConfig, StoreError, RECORD_SIZE_MAX_BYTES};

/// Commitlog bytes read per recovery step: one largest record always fits in one read.
pub const RECOVERY_READ_BYTES: u64 = 8 << 20;
/// Bytes zeroed past the recovered end after an unclean stop: all a flush can write beyond
/// the durable end (the undurable tail bound, its partial block, and a blank filler).
pub const RECOVERY_ZERO_WINDOW_BYTES: u64 =
    TAIL_UNDURABLE_MAX_BYTES + RECORD_SIZE_MAX_BYTES as u64 + BLOCK_BYTES;

const _: () = assert!(RECOVERY_READ_BYTES >= RECORD_SIZE_MAX_BYTES as u64 + BLOCK_BYTES);

pub(crate) struct Recovered {
    pub tail: Tail,
    pub segments: Segments,
    pub queues: QueueTable,
    pub index: Index,
    pub min_physical_offset: u64,
    pub durable_end: u64,
    pub zero_fill_next: u64,
    /// Space known to be allocated past the recovered end: none yet (`Store::open`
    /// allocates the window before the store takes appends).
    pub allocated_end: u64,
    /// Recovery started from a light checkpoint (`checkpoint.rs`), or left what its scan
    /// wrote unsynced and wrote a light one: queue and index files may hold unsynced units
    /// that no dirty path lists.
    pub unsynced_files: bool,
    /// The queues came from a clean stop's catalog: none of their files was read.
    pub queues_from_catalog: bool,
    /// They came from a synced checkpoint's catalog, and wait to be settled (`Settle` in
    /// consume_queue.rs): no checkpoint until then.
    pub settling: bool,
}

pub(crate) async fn recover(config: &StoreConfig) -> Result<Recovered, StoreError> {
    let root = &config.root_dir;
    let size = config.segment_size_bytes;
    // A reset a crash interrupted may have removed part of the files: none of them is
    // trusted, the store opens empty (reset.rs).
    super::reset::finish_interrupted(root).await?;
    std::fs::create_dir_all(root.join("commitlog"))?;
    std::fs::create_dir_all(root.join("consumequeue"))?;
    prime_dma_probe(root).await?;
    let mut segments = Segments::open(root.join("commitlog"), size, &config.progress).await?;
    let saved = checkpoint::read(root);
    let queue_root = root.join("consumequeue");
    let units_per_file = config.consume_queue_units_per_file;
    // After a clean stop, its queue catalog lists the queues: no directory is read. After a
    // restart of the machine, so does the synced checkpoint's, and the queues are settled
    // once the store serves (`Settle` in consume_queue.rs).
    let stamp = saved.as_ref().and_then(|c| c.catalog);
    let synced_catalog = saved.as_ref().is_some_and(|c| !c.clean && !c.light());
    let listed = catalog::take(root, &queue_root, stamp, units_per_file, synced_catalog).await?;
    let from_catalog = listed.is_some();
    let settling = from_catalog && synced_catalog;
    let mut queues = match (listed, saved.as_ref()) {
        (Some(listed), Some(saved)) => {
            QueueTable::from_catalog(queue_root, units_per_file, listed, &saved.queues, settling)
        }
        _ => QueueTable::load_with(
            queue_root,
            units_per_file,
            saved.as_ref().map(|c| (&c.queues, c.commitlog_offset)),
        )?,
    };
    let mark = saved
        .as_ref()
        .and_then(|c| c.index.map(|mark| (mark, c.commitlog_offset)));
    let clean_before = saved.as_ref().is_some_and(|c| c.clean);
    let mut index = Index::open(root, config.index, mark, clean_before)?;
    let first = segments.first_start().unwrap_or(0);
    let files_end = segments.last_start().map_or(0, |s| s + size);
    if let Some(saved) = saved.as_ref() {
        // `scan_start` probes each queue at the checkpoint's count, unless it is known to
        // end there.
        let queues = &queues;
        queues.prefetch_units(saved.queues.iter().flat_map(|(topic, counts)| {
            counts
                .iter()
                .filter(move |(&queue_id, &count)| {
                    queues
                        .get(topic, queue_id)
                        .is_none_or(|queue| queue.known_end() != Some(count))
                })
                .flat_map(move |(&queue_id, &count)| {
                    [count.saturating_sub(1), count].map(|unit| (topic.as_str(), queue_id, unit))
                })
        }));
    }
    let (scan_from, trusted) = scan_start(saved.as_ref(), &mut queues, first, files_end, size)?;
    let scan_from = scan_from.min(align_down(index.indexed_end(), size).max(first));
    // The scan writes each queue's units from its count at the checkpoint on, or from its
    // first unit when the checkpoint does not count it (or is not trusted): each of those
    // writes first faults in a page of the queue's file, one at a time.
    let recorded = |topic: &str, queue_id: u32| {
        let saved = saved.as_ref().filter(|_| trusted)?;
        saved.queues.get(topic)?.get(&queue_id).copied()
    };
    queues.prefetch_units(
        queues
            .queues()
            .filter(|(topic, queue_id, _)| recorded(topic, *queue_id).is_none())
            .map(|(topic, queue_id, queue)| (topic, queue_id, queue.min_offset())),
    );
    let mut rebuilt = Rebuilt {
        queues: &mut queues,
        index: &mut index,
        units_held: saved.as_ref().filter(|_| trusted),
        unindexed: 0,
        units_in_memory: 0,
        units_held_back: 0,
    };
    config
        .progress
        .scan_total_bytes
        .set(files_end.saturating_sub(scan_from));
    // What the checkpoint knew durable: a bad record below it is damage, not a torn tail.
    let durable_mark = saved
        .as_ref()
        .map_or(0, |c| c.commitlog_offset)
        .min(files_end);
    let mut damage = Damage::default();
    let end = scan(
        &segments,
        config,
        scan_from,
        durable_mark,
        &mut rebuilt,
        &mut damage,
    )
    .await?;
    index.truncate_to(end)?;
    let queue_ids: Vec<(String, u32)> = queues
        .queues_mut()
        .map(|(t, id, _)| (t.to_string(), id))
        .collect();
    for (topic, queue_id) in queue_ids {
        if let Some(queue) = queues.get_mut(&topic, queue_id) {
            // Most queues hold what the checkpoint counted, or end at the last unit the scan
            // wrote: one probe each. Any other takes the binary search, whose probes into the
            // unwritten part of a mapped file each fault in a page of zeros (with 80,000
            // queues written, 40% of a recovery went to zeroing those pages). The pages of
            // queues the scan did not write were read in before it (`prefetch_units`).
            let recorded = saved
                .as_ref()
                .and_then(|c| c.queues.get(&topic)?.get(&queue_id).copied());
            let guess = recorded
                .unwrap_or(queue.min_offset())
                .max(queue.rebuilt_end());
            // A queue the scan did not write, found before it to end at the checkpoint's
            // count, ends there (the log ends past the checkpoint): no look into its files.
            let known = queue
                .known_end()
                .filter(|_| queue.rebuilt_end() == 0 && trusted && end >= durable_mark);
            // A queue on disk that a trusted checkpoint does not count and the scan did not
            // write holds no unit of a record the log keeps: its files are what a life before
            // a restart of the machine made for records the log lost (a start from the
            // synced checkpoint's catalog does not list them). Counted, those units would
            // point at the records written since in their place.
            let lost = trusted
                && recorded.is_none()
                && queue.rebuilt_end() == 0
                && queue.units_in_memory().is_none();
            let units = match (queue.units_in_memory(), known) {
                // A new queue whose units wait in memory: the scan wrote them all, below
                // the end.
                (Some(held), _) => held,
                (None, Some(units)) => units,
                (None, None) if lost => queue.min_offset(),
                (None, None) => queue.count_units_below_near(end, guess)?,
            };
            queue.truncate_to(units)?;
        }
    }
    // Segments retention deleted: the units and index entries that pointed into them go
    // (a crash between a segment's deletion and theirs leaves them behind).
    // Nothing to expire when the catalog's queues were expired up to where the log begins.
    let expired = from_catalog && first <= queues.expired_below();
    let queue_paths = if expired {
        Vec::new()
    } else {
        queues.expire_below(first)?
    };
    for path in queue_paths.into_iter().chain(index.expire_below(first)) {
        crate::runtime::fs::remove_if_present(&path)?;
    }
    let clean = saved
        .as_ref()
        .is_some_and(|c| c.clean && c.commitlog_offset == end);
    config.progress.recovered.set(Some(super::RecoverySummary {
        scan_from,
        end,
        clean,
        damaged_regions: damage.regions,
        damaged_bytes: damage.bytes,
        queues_from_catalog: from_catalog,
    }));
    if !clean {
        zero_after_end(&segments, end, &config.progress).await?;
    }
    let removed = remove_segments_after(&mut segments, end, config.keep_recycled_segments).await?;
    if !config.keep_recycled_segments {
        let renamed = plain_again(&mut segments, end).await?;
        if renamed + removed > 0 {
            log::info!(
                "store {}: recycled commitlog files made plain again, as this store does not \
                 keep them (a slave's, or segmentRecycleEnable=false): {renamed} renamed, \
                 {removed} past the log's end removed",
                root.display()
            );
        }
    }
    let tail = read_tail(&segments, first, end).await?;
    // From a light checkpoint (a crash in this boot), the units below it and those the scan
    // wrote are in the page cache: a light checkpoint records the end, and the first synced
    // one syncs the whole filesystem. After a crash that left a synced checkpoint only (a
    // restart of the machine), the same holds for what the scan wrote: the record is a
    // light one too, and the synced checkpoint stays, so a power loss before the flusher's
    // first synced checkpoint (asked for at once, `FlushState::new`) recovers from it again.
    // The sync of every queue the scan wrote (80,000 a shard, 1.6-3.7 s of a cold start)
    // is thus done while the store serves. Without a boot to name (or after a clean stop,
    // or with no checkpoint) what the scan wrote is synced here.
    let this_boot = checkpoint::boot_id();
    let unsynced_files = settling
        || saved
            .as_ref()
            .is_some_and(|saved| saved.light() || (!saved.clean && this_boot.is_some()));
    if !unsynced_files {
        let (index_paths, index_dir) = index.take_dirty_paths();
        let mut dirty = queues.take_dirty_paths();
        dirty.extend(index_paths);
        super::flusher::sync_written(root, dirty, index_dir, false)
            .await
            .map_err(|failure| failure.error)?;
    }
    let record = Checkpoint {
        commitlog_offset: end,
        clean: false,
        // New queues still awaiting their files are left out, as in the flusher's
        // checkpoints: a crash before they are made scans from their first unit again.
        queues: queues.max_offsets_in_files(),
        index: Some(index.mark()),
        boot: this_boot.filter(|_| unsynced_files).map(str::to_string),
        awaiting_from: queues.first_awaiting_physical(),
        catalog: None,
    };
    // Queues to settle: no checkpoint until they are (`Settle`), the synced one and its
    // catalog stay, and a crash meanwhile recovers from them again.
    let written = if settling {
        Ok(())
    } else {
        checkpoint::write(root, &record).await
    };
    match written {
        Ok(()) => {}
        // A full disk has no block for the new checkpoint: the old one (or none) stays, and
        // the next start scans a little more. The store opens all the same.
        Err(error) if super::error::is_resource_error(&error) => log::warn!(
            "store {}: cannot write the checkpoint after recovery ({error}); the \
             flusher writes it once it can",
            root.display()
        ),
        Err(error) => return Err(error.into()),
    }
    // Zero-fill starts again at the end: the space past it may be a hole (segments are
    // allocated a window at a time) or old zeros; writing zeros again is harmless.
    let zero_fill_next = align_up(end, BLOCK_BYTES);
    Ok(Recovered {
        tail,
        segments,
        queues,
        index,
        min_physical_offset: first,
        durable_end: end,
        zero_fill_next,
        allocated_end: end,
        unsynced_files,
        queues_from_catalog: from_catalog,
        settling,
    })
}

/// Step 1 (`runtime::workarounds::prime_dma_probe`): a wrong answer of glommio's device
/// probe is a configuration error.
async fn prime_dma_probe(root: &Path) -> Result<(), StoreError> {
    workarounds::prime_dma_probe(root).await.map_err(|error| {
        if error.kind() == io::ErrorKind::Unsupported {
            StoreError::Config(error.to_string())
        } else {
            StoreError::Io(error)
        }
    })
}

/// Where the scan starts: the start of the segment holding the checkpoint (so the whole last
/// segment is validated, as a torn or damaged tail may sit just before the checkpoint), or the
/// first segment when the checkpoint is missing, does not fit the files, or a queue lost units.
/// True when every queue holds the units the checkpoint counted (`Rebuilt::units_held`).
fn scan_start(
    saved: Option<&Checkpoint>,
    queues: &mut QueueTable,
    first: u64,
    files_end: u64,
    segment_size_bytes: u64,
) -> Result<(u64, bool), StoreError> {
    let Some(saved) = saved else {
        return Ok((first, false));
    };
    let offset = saved.commitlog_offset;
    if offset < first || offset > files_end {
        return Ok((first, false));
    }
    for (topic, recorded) in &saved.queues {
        for (&queue_id, &max_offset) in recorded {
            let held = match queues.get_mut(topic, queue_id) {
                Some(queue) => queue.check_recorded(offset, max_offset)?,
                None => 0,
            };
            if held < max_offset {
                log::warn!(
                    "store: consume queue {topic}/{queue_id} holds {held} units, the \
                     checkpoint says {max_offset}: rebuilding all queues from the commitlog"
                );
                return Ok((first, false));
            }
        }
    }
    // Queues that awaited their files are not counted: their units from `awaiting_from` on
    // are rebuilt by the scan.
    let from = saved
        .awaiting_from
        .map_or(offset, |awaiting| awaiting.min(offset));
    Ok((align_down(from, segment_size_bytes).max(first), true))
}

/// What the scan found at one position.
enum Found {
    Record(usize),
    Blank,
    NeedMore,
    End,
}

fn classify(window: &[u8], at_offset: u64, segment_end: u64) -> Found {
    let Some((size, magic)) = record::peek_header(window) else {
        return if at_offset + window.len() as u64 >= segment_end {
            Found::End
        } else {
            Found::NeedMore
        };
    };
    let Ok(size) = usize::try_from(size) else {
        return Found::End;
    };
    let fits = at_offset + size as u64 <= segment_end;
    if magic == BLANK_MAGIC_CODE {
        let exact = at_offset + size as u64 == segment_end && size >= record::BLANK_HEADER_BYTES;
        return if exact { Found::Blank } else { Found::End };
    }
    let valid_magic = magic == MAGIC_CODE_V1 || magic == MAGIC_CODE_V2;
    let plausible_size = (record::RECORD_FIXED_BYTES..=RECORD_SIZE_MAX_BYTES).contains(&size);
    if !valid_magic || !plausible_size || !fits {
        return Found::End;
    }
    if size > window.len() {
        return Found::NeedMore;
    }
    Found::Record(size)
}

/// What the scan re-dispatches records into.
struct Rebuilt<'a> {
    queues: &'a mut QueueTable,
    index: &'a mut Index,
    /// The checkpoint, when every queue was found holding the units it counted: a record
    /// below its offset whose unit is among those is not written again. The scan reads the
    /// whole segment holding the checkpoint to validate it, and writing each of its units
    /// again mapped and unmapped every queue file it touched (at 100,000 queues, most of a
    /// start).
    units_held: Option<&'a Checkpoint>,
    /// Records left out of the index because the disk had no room for it: a full disk must
    /// not stop the store from opening for an index of keys (queries by key miss them).
    unindexed: u64,
    /// Units written to new queues that await their files (`QueueTable::get_or_begin`).
    units_in_memory: u64,
    /// Units queues taken from a synced checkpoint's catalog hold back from their files
    /// (`ConsumeQueue::units_held_back`).
    units_held_back: u64,
}

/// Units the scan lets queues hold back from their files (24 bytes each) before a queue it
/// writes to writes its own into its file: a scan of much more than the checkpoint's
/// segment keeps its memory bounded.
const UNITS_HELD_BACK_MAX: u64 = 2 << 20;

/// New queues whose files the scan lets wait (~300 bytes of memory each) before it makes
/// them all at once.
const NEW_QUEUES_MAX: usize = 131_072;
/// Units held in memory by new queues (24 bytes each) that make the scan make their files.
const UNITS_IN_MEMORY_MAX: u64 = 524_288;

impl Rebuilt<'_> {
    /// Makes the files of the new queues (`dispatch`) on several threads, once enough of them
    /// wait or hold enough units in memory. Those still waiting when the scan ends are made
    /// off the shard once the store serves (`queue_files.rs`), as during a creation storm.
    fn make_new_queue_files(&mut self) -> Result<(), StoreError> {
        let waiting = self.queues.files_to_make();
        let enough = waiting >= NEW_QUEUES_MAX || self.units_in_memory >= UNITS_IN_MEMORY_MAX;
        if enough {
            if waiting > 0 {
                self.queues.make_files_now()?;
            }
            self.units_in_memory = 0;
        }
        Ok(())
    }
}

/// Damage in the middle of the log the scan stepped over.
#[derive(Default)]
struct Damage {
    regions: u64,
    bytes: u64,
}

/// Step 2 and the re-dispatch of step 3. Returns the end of the valid log.
///
/// Each segment is read ahead of the checks on a helper thread (`runtime::read_ahead`), so
/// the disk and the shard work at once; a record crossing two chunks is put together in
/// front of the second one.
async fn scan(
    segments: &Segments,
    config: &StoreConfig,
    from: u64,
    durable_mark: u64,
    rebuilt: &mut Rebuilt<'_>,
    damage: &mut Damage,
) -> Result<u64, StoreError> {
    let size = config.segment_size_bytes;
    let progress = &config.progress;
    let mut pos = from;
    'segments: loop {
        let Some((segment, _)) = segments.file_for(pos) else {
            return Ok(pos);
        };
        let segment_end = segment + size;
        let read_from = align_down(pos - segment, BLOCK_BYTES);
        let mut ahead = ReadAhead::start(
            &segments.path_of(segment),
            read_from,
            size,
            RECORD_SIZE_MAX_BYTES,
        )?;
        // Bytes from `pos` up to the next chunk that the last one left unfinished.
        let mut carry: Vec<u8> = Vec::new();
        let mut skip = (pos - segment - read_from) as usize;
        loop {
            let mut chunk = match ahead.next_chunk() {
                Some(chunk) => chunk?,
                // The range ended (a short segment file): what is left ends the log here.
                None => return Ok(pos),
            };
            progress.step();
            progress
                .scanned_bytes
                .set(segment + chunk.pos + chunk.len as u64 - from);
            // The open's watch prints progress lines meanwhile (`next_chunk` above blocks).
            crate::runtime::yield_now().await;
            rebuilt.make_new_queue_files()?;
            let window_all = chunk.with_front(&carry);
            let window = &window_all[skip..];
            skip = 0;
            let window_end = pos + window.len() as u64;
            let mut at = 0usize;
            let mut next_chunk = false;
            loop {
                let here = pos + at as u64;
                if here == segment_end {
                    break;
                }
                match classify(&window[at..], here, segment_end) {
                    Found::Record(record_size) => {
                        let bytes = &window[at..at + record_size];
                        let sealed = segments.recycled.contains(&segment);
                        if dispatch(bytes, here, sealed, config, rebuilt)? {
                            at += record_size;
                            continue;
                        }
                    }
                    Found::Blank => {
                        at = (segment_end - pos) as usize;
                        break;
                    }
                    Found::NeedMore if window_end < segment_end => {
                        next_chunk = true;
                        break;
                    }
                    Found::NeedMore | Found::End => {}
                }
                // A bad record at `here`: the log's end, or damage to step over.
                let blank_end = window[at..].iter().all(|&b| b == 0) && here >= durable_mark;
                if blank_end {
                    return Ok(here);
                }
                match past_damage(segments, size, here, durable_mark).await? {
                    Some(next) => {
                        log::error!(
                            "store {}: damaged commitlog at offsets {here}..{next} ({} bytes, \
                             inside the log, not a torn tail): the records there are lost; \
                             recovery goes on after them; run `shardmq verify` to see the rest",
                            config.root_dir.display(),
                            next - here
                        );
                        damage.regions += 1;
                        damage.bytes += next - here;
                        pos = next;
                        continue 'segments;
                    }
                    None => return Ok(here),
                }
            }
            if next_chunk {
                carry = window[at..].to_vec();
                pos += at as u64;
                ahead.recycle(chunk);
                continue;
            }
            // The segment is done (its end, or a blank filler): on to the next one.
            pos = segment_end;
            continue 'segments;
        }
    }
}

/// A record at `here` is bad. The log goes on past it (returns where) when this is damage in
/// its middle: the bad record lies below what the checkpoint knew durable, or a valid record
/// follows beyond all a torn flush can reach (`RECOVERY_ZERO_WINDOW_BYTES`). Otherwise it is
/// the torn tail of an unclean stop and the log ends at `here` (None).
async fn past_damage(
    segments: &Segments,
    size: u64,
    here: u64,
    durable_mark: u64,
) -> Result<Option<u64>, StoreError> {
    let reach = here + RECOVERY_ZERO_WINDOW_BYTES;
    let search_end = (reach + 2 * RECOVERY_READ_BYTES)
        .max(durable_mark.saturating_add(RECOVERY_ZERO_WINDOW_BYTES));
    let next = next_valid_record(segments, size, here + 1, search_end).await?;
    // A later segment that starts beyond a torn flush's reach with a valid record (the
    // checkpoint may be gone) also says the log went on.
    let mut later = None;
    if next.is_none_or(|next| next < reach) {
        let beyond = segments.segments_from(align_up(reach, size)).next();
        if let Some((start, file)) = beyond {
            let sealed = segments.recycled.contains(&start);
            if valid_record_at(&file, start, start + size, start, sealed).await? {
                later = Some(start);
            }
        }
    }
    let middle = here < durable_mark || next.is_some_and(|n| n >= reach) || later.is_some();
    Ok(if middle { next.or(later) } else { None })
}

/// The first position in `[from, search_end)` of `from`'s segment, or else the start of the
/// next segment, that holds a whole valid record naming its own position (PHYSICALOFFSET).
/// Candidates are found by their magic code's first byte (memchr), so zeros go by fast.
pub(crate) async fn next_valid_record(
    segments: &Segments,
    size: u64,
    from: u64,
    search_end: u64,
) -> Result<Option<u64>, StoreError> {
    let Some((segment, file)) = segments.file_for(from) else {
        return Ok(None);
    };
    let segment_end = segment + size;
    let stop = search_end.min(segment_end);
    let sealed = segments.recycled.contains(&segment);
    // Windows overlap by a header (`record_start_candidates`).
    let mut pos = from;
    while pos < stop {
        let len = RECOVERY_READ_BYTES.min(segment_end - pos) as usize;
        let mut window = vec![0u8; len];
        file.read_exact_at(pos - segment, &mut window).await?;
        for at in record_start_candidates(&window) {
            let candidate = pos + at as u64;
            if candidate >= stop {
                break;
            }
            // A record names its own position: the bytes a recycled segment held before
            // (whole records of another start) are passed over without a read.
            if names_another_position(&window[at..], candidate) {
                continue;
            }
            if valid_record_at(&file, segment, segment_end, candidate, sealed).await? {
                return Ok(Some(candidate));
            }
        }
        if pos + len as u64 >= segment_end {
            break;
        }
        pos += len as u64 - record::BLANK_HEADER_BYTES as u64;
    }
    if let Some((_, next_file)) = segments.file_for(segment_end) {
        let sealed = segments.recycled.contains(&segment_end);
        let next = (segment_end, segment_end + size);
        if valid_record_at(&next_file, next.0, next.1, segment_end, sealed).await? {
            return Ok(Some(segment_end));
        }
    }
    Ok(None)
}

/// Whether the record header at the start of `bytes`, when they hold its PHYSICALOFFSET,
/// names another position than `offset`.
pub(crate) fn names_another_position(bytes: &[u8], offset: u64) -> bool {
    let field = record::PHYSICAL_OFFSET_AT..record::PHYSICAL_OFFSET_AT + 8;
    bytes
        .get(field)
        .is_some_and(|named| u64::from_be_bytes(named.try_into().unwrap()) != offset)
}

/// Offsets in `window` where a record could start: 4 bytes before each V1 or V2 magic code,
/// found by its first byte (memchr), so zeros go by fast. A magic code that ends past the
/// window is not listed: callers overlap their windows by a header.
pub(crate) fn record_start_candidates(window: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut at = 4usize;
    std::iter::from_fn(move || {
        while at + 4 <= window.len() {
            let found = memchr::memchr(0xDA, &window[at..window.len() - 3])?;
            let magic_at = at + found;
            at = magic_at + 1;
            let magic = i32::from_be_bytes(window[magic_at..magic_at + 4].try_into().unwrap());
            if magic == MAGIC_CODE_V1 || magic == MAGIC_CODE_V2 {
                return Some(magic_at - 4);
            }
        }
        None
    })
}

/// The size of the record whose TOTALSIZE and magic start `header`, when it can be a record:
/// magic V1 or V2, a size a record can have, and no more than the `room` left before the end.
pub(crate) fn plausible_record_size(header: &[u8], room: u64) -> Option<usize> {
    let (size, magic) = record::peek_header(header)?;
    let size = usize::try_from(size).ok()?;
    let plausible = (magic == MAGIC_CODE_V1 || magic == MAGIC_CODE_V2)
        && (record::RECORD_FIXED_BYTES..=RECORD_SIZE_MAX_BYTES).contains(&size)
        && size as u64 <= room;
    plausible.then_some(size)
}

/// Whether a whole valid record that names `offset` as its position starts at `offset` (and,
/// in a recycled segment, carries its seal).
async fn valid_record_at(
    file: &DirectFile,
    segment: u64,
    segment_end: u64,
    offset: u64,
    sealed: bool,
) -> Result<bool, StoreError> {
    let mut header = [0u8; record::BLANK_HEADER_BYTES];
    if offset + header.len() as u64 > segment_end {
        return Ok(false);
    }
    file.read_exact_at(offset - segment, &mut header).await?;
    let Some(size) = plausible_record_size(&header, segment_end - offset) else {
        return Ok(false);
    };
    let mut bytes = vec![0u8; size];
    file.read_exact_at(offset - segment, &mut bytes).await?;
    Ok(is_record_at(&bytes, offset, sealed))
}

/// Whether `bytes` are one whole valid record that names `offset` as its position (and, in a
/// recycled segment, holds its seal).
pub(crate) fn is_record_at(bytes: &[u8], offset: u64, sealed: bool) -> bool {
    (!sealed || record::seal_holds(bytes))
        && record::decode(bytes).is_ok_and(|m| m.physical_offset == offset)
}

/// Re-dispatches one record's unit (and its index entries, past the index's end); false when
/// the record is not valid (the log ends there).
fn dispatch(
    bytes: &[u8],
    offset: u64,
    sealed: bool,
    config: &StoreConfig,
    rebuilt: &mut Rebuilt<'_>,
) -> Result<bool, StoreError> {
    let Ok(message) = record::decode(bytes) else {
        return Ok(false);
    };
    // BODYCRC does not cover the topic and properties that follow the body. A torn write
    // leaves zeros from a sector boundary on, so zeros there mean the record never fully
    // reached the disk: the topic may hold no NUL, and properties may not end with one
    // (`append` refuses such properties, so no acknowledged record is ever dropped here).
    let torn_properties = message.properties.last() == Some(&0);
    // In a recycled segment a torn write leaves the bytes of the segment's earlier life, not
    // zeros: there every record carries a seal over all its bytes (`record::seal_holds`).
    if message.physical_offset != offset
        || validate_topic(message.topic).is_err()
        || torn_properties
        || sealed && !record::seal_holds(bytes)
    {
        return Ok(false);
    }
    let context = |step: &str, error: std::io::Error| {
        let what = format!(
            "re-dispatching {}/{} queue offset {} (commitlog offset {offset}): {step}",
            message.topic, message.queue_id, message.queue_offset
        );
        match crate::runtime::fs::raw_os_error_of(&error) {
            Some(code) => crate::runtime::fs::os_error_with_context(code, what),
            None => std::io::Error::new(error.kind(), what),
        }
    };
    let held = rebuilt.units_held.is_some_and(|saved| {
        let counted = saved.queues.get(message.topic);
        let counted = counted.and_then(|queues| queues.get(&message.queue_id));
        offset + u64::from(message.total_size) <= saved.commitlog_offset
            && counted.is_some_and(|&units| message.queue_offset < units)
    });
    if !held {
        let queues = &mut *rebuilt.queues;
        let (topic, queue_id, at) = (message.topic, message.queue_id, message.queue_offset);
        let queue = match queues.get(topic, queue_id) {
            // A new queue from its first unit on: its units wait in memory and its files are
            // made with those of other new queues, on several threads (`make_new_queue_files`).
            None if at == 0 => queues.get_or_begin(topic, queue_id).map(|(queue, _)| queue),
            // A gap in the units of a queue awaiting its files (damage stepped over): only a
            // file holds units past a gap, so they are made now.
            Some(queue)
                if queue.is_awaiting_file()
                    && queue.units_in_memory().is_some_and(|held| at > held) =>
            {
                queues
                    .make_files_of(topic, queue_id)
                    .and_then(|()| queues.get_or_create(topic, queue_id))
            }
            _ => queues.get_or_create(topic, queue_id),
        }
        .map_err(|e| context("opening the queue", e))?;
        if queue.is_awaiting_file() {
            rebuilt.units_in_memory += 1;
        } else if queue.holds_no_files() && message.queue_offset != queue.max_offset() {
            // A queue rebuilt from a log that starts past its beginning (retention, or a
            // replica that joined mid-log) starts at its first record's offset.
            queue
                .start_at(message.queue_offset)
                .map_err(|e| context("starting the queue", e))?;
        }
        let unit = Unit {
            physical_offset: offset,
            size_bytes: message.total_size,
            tags_code: (config.tags_code_of)(&message),
        };
        let held_before = queue.units_held_back() as u64;
        queue
            .write_unit(message.queue_offset, unit)
            .map_err(|e| context("writing the unit", e))?;
        queue.note_rebuilt(message.queue_offset);
        let held = queue.units_held_back() as u64;
        rebuilt.units_held_back = (rebuilt.units_held_back + held).saturating_sub(held_before);
        if rebuilt.units_held_back > UNITS_HELD_BACK_MAX && held > 0 {
            queue
                .write_held_units()
                .map_err(|e| context("writing the units held back", e))?;
            rebuilt.units_held_back = rebuilt.units_held_back.saturating_sub(held);
        }
    }
    let index = &mut *rebuilt.index;
    if offset >= index.indexed_end() && index::indexes_sys_flag(message.sys_flag) {
        let keys = MessageKeys::of(message.properties);
        match index.prepare(keys.as_slice().len(), offset) {
            Ok(()) => index.add(
                message.topic,
                keys.as_slice(),
                offset,
                message.store_timestamp_ms,
            ),
            Err(error) if super::error::is_space_error(&error) => {
                if rebuilt.unindexed == 0 {
                    log::warn!(
                        "store {}: {}; the records from here on are left out of the message                          index (their queues are rebuilt; queries by key miss them)",
                        config.root_dir.display(),
                        context("preparing the index", error)
                    );
                }
                rebuilt.unindexed += 1;
            }
            Err(error) => return Err(context("preparing the index", error).into()),
        }
    }
    index.note_indexed(offset + u64::from(message.total_size));
    Ok(true)
}

/// Step 4: zeroes `[end, end + RECOVERY_ZERO_WINDOW_BYTES)` within the existing segments,
/// keeping the bytes of `end`'s block that precede it.
async fn zero_after_end(
    segments: &Segments,
    end: u64,
    progress: &super::OpenProgress,
) -> Result<(), StoreError> {
    let window_end = align_up(end + RECOVERY_ZERO_WINDOW_BYTES, BLOCK_BYTES);
    let size = segments.segment_size_bytes;
    let mut pos = align_down(end, BLOCK_BYTES);
    let mut touched: Vec<std::rc::Rc<DirectFile>> = Vec::new();
    while pos < window_end {
        let Some((segment, file)) = segments.file_for(pos) else {
            break;
        };
        let stop = (pos + ZERO_FILL_CHUNK_BYTES)
            .min(segment + size)
            .min(window_end);
        zero_keeping(&file, segment, pos, stop, end).await?;
        progress.step();
        if !touched.iter().any(|f| std::rc::Rc::ptr_eq(f, &file)) {
            touched.push(file);
        }
        pos = stop;
    }
    for file in touched {
        file.fdatasync().await?;
    }
    Ok(())
}

/// Zeroes `[pos, stop)` of the segment starting at `segment` (block-aligned, one chunk at
/// most), keeping the bytes before `end`. Not synced.
async fn zero_keeping(
    file: &DirectFile,
    segment: u64,
    pos: u64,
    stop: u64,
    end: u64,
) -> Result<(), StoreError> {
    let mut buffer = file.alloc_buffer((stop - pos) as usize);
    if pos < end {
        let keep = (end - pos) as usize;
        file.read_exact_at(pos - segment, &mut buffer.as_bytes_mut()[..keep])
            .await?;
    }
    if let Err(error) = file.write_at(pos - segment, buffer).await {
        if !super::error::is_space_error(&error) {
            return Err(error.into());
        }
        // Part of the range is a hole (never allocated, so no flush wrote there, and it
        // reads as zeros): zero it block by block, skipping the blocks the disk has no
        // room for.
        zero_blocks_where_allocated(file, segment, pos, stop, end).await?;
    }
    Ok(())
}

/// `zero_keeping`'s fallback for a range that is partly a hole on a full disk: each block
/// of `[pos, stop)` is zeroed (keeping the bytes before `end`), except where writing it would
/// need a new block (a hole, which reads as zeros anyway).
async fn zero_blocks_where_allocated(
    file: &DirectFile,
    segment: u64,
    pos: u64,
    stop: u64,
    end: u64,
) -> Result<(), StoreError> {
    let mut block = pos;
    while block < stop {
        let mut buffer = file.alloc_buffer(BLOCK_BYTES as usize);
        if block < end {
            let keep = (end - block).min(BLOCK_BYTES) as usize;
            file.read_exact_at(block - segment, &mut buffer.as_bytes_mut()[..keep])
                .await?;
        }
        match file.write_at(block - segment, buffer).await {
            Ok(()) => {}
            Err(error) if super::error::is_space_error(&error) => {}
            Err(error) => return Err(error.into()),
        }
        block += BLOCK_BYTES;
    }
    Ok(())
}

/// Turns the recycled segment files back into plain ones, for a store that is not to keep
/// them (`StoreConfig::keep_recycled_segments`: a slave, whose log takes its master's records
/// unsealed, or a node with recycling turned off). In a recycled file recovery takes only
/// sealed records, so an unsealed one written there would cut the log at the next start;
/// in a plain file the bytes of the file's earlier life past the end would read as records.
/// So once the files past the segment holding `end` are gone (`remove_segments_after`), the
/// one holding `end` is zeroed past it (its space given back, not written) and synced before
/// its rename, and the ones below it (whole segments of the log, ended by a blank record) are
/// renamed. A crash part way leaves recycled files that recover as before, and the next open
/// goes on. Returns how many files were renamed.
async fn plain_again(segments: &mut Segments, end: u64) -> Result<usize, StoreError> {
    let size = segments.segment_size_bytes;
    let holding_end = align_down(end, size);
    if segments.recycled.contains(&holding_end) {
        if let Some((segment, file)) = segments.file_for(end) {
            let whole = align_up(end, BLOCK_BYTES).min(segment + size);
            if whole > end {
                zero_keeping(&file, segment, align_down(end, BLOCK_BYTES), whole, end).await?;
            }
            if whole < segment + size
                && !file
                    .deallocate(whole - segment, segment + size - whole)
                    .await?
            {
                // No hole punching on this filesystem: zeros, a chunk at a time.
                let mut pos = whole;
                while pos < segment + size {
                    let stop = (pos + ZERO_FILL_CHUNK_BYTES).min(segment + size);
                    zero_keeping(&file, segment, pos, stop, end).await?;
                    pos = stop;
                }
            }
            file.fdatasync().await?;
        }
    }
    let renamed: Vec<u64> = segments.recycled.iter().copied().collect();
    for start in &renamed {
        let from = segments.path_of(*start);
        segments.recycled.remove(start);
        crate::runtime::fs::rename(&from, &segments.path_of(*start)).await?;
    }
    if !renamed.is_empty() {
        super::segments::sync_dir(&segments.dir).await?;
    }
    Ok(renamed.len())
}

/// Deletes segments that start after the one following `end`'s: nothing durable is there.
/// Recycled files past `end`'s segment stay when `keep_recycled` (retention gave them to
/// those segments, and their records will be sealed: removed, their space would be
/// allocated again, unwritten); otherwise they go too, the next segment's included, as
/// nothing of the log is in them (`plain_again`). Returns how many recycled files went.
async fn remove_segments_after(
    segments: &mut Segments,
    end: u64,
    keep_recycled: bool,
) -> Result<usize, StoreError> {
    let size = segments.segment_size_bytes;
    let keep_until = align_down(end, size) + size;
    let doomed: Vec<(u64, bool)> = segments
        .files
        .range(align_down(end, size) + 1..)
        .map(|(&s, _)| (s, segments.recycled.contains(&s)))
        .filter(|&(s, recycled)| {
            if recycled {
                !keep_recycled
            } else {
                s > keep_until
            }
        })
        .collect();
    for &(start, _) in &doomed {
        let path = segments.path_of(start);
        if let Some(file) = segments.files.remove(&start) {
            DirectFile::close_shared(file).await;
        }
        segments.recycled.remove(&start);
        std::fs::remove_file(path)?;
    }
    let recycled = doomed.iter().filter(|&&(_, recycled)| recycled).count();
    if recycled > 0 {
        super::segments::sync_dir(&segments.dir).await?;
    }
    Ok(recycled)
}

/// The tail's first chunk: the bytes of `[align_down(end, TAIL_CHUNK_BYTES), end)`.
async fn read_tail(segments: &Segments, first: u64, end: u64) -> Result<Tail, StoreError> {
    let base = align_down(end, TAIL_CHUNK_BYTES);
    let mut prefix = vec![0u8; (end - base) as usize];
    let mut pos = base.max(first);
    while pos < end {
        let Some((segment, file)) = segments.file_for(pos) else {
            return Err(StoreError::Corrupt {
                offset: pos,
                reason: "commitlog segment missing below the end".into(),
            });
        };
        let stop = end.min(segment + segments.segment_size_bytes);
        let out = &mut prefix[(pos - base) as usize..(stop - base) as usize];
        file.read_exact_at(pos - segment, out).await?;
        pos = stop;
    }
    Ok(Tail::new(end, &prefix))
}
