//! Retention: deleting sealed segments moves every queue's minimum, drops the consume-queue
//! and index files behind it, and survives restarts and crashes in between.

use std::path::Path;

use crate::support::*;
use shards::store::{FlushMode, GetStatus, Store};
use shards::{CommitLogOffset, QueueId, QueueOffset};

const SEGMENT: u64 = 64 << 10;
const MESSAGES: u64 = 600;

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| entries.count())
}

fn segment_files(dir: &Path) -> usize {
    files_in(&dir.join("commitlog"))
}

/// Appends MESSAGES of ~1 KiB over two queues and waits until they are durable.
async fn fill(store: &Store) {
    let mut last = CommitLogOffset(0);
    for i in 0..MESSAGES {
        last = append(store, "T", (i % 2) as u32, i, 1000, "tag").end_offset;
    }
    store.wait_durable(last).await.unwrap();
    // The new queues' first files are made off the shard (their units wait in memory till
    // then): the checks below count files.
    wait_until("queue files not made", 30, || {
        store.queues_awaiting_files() == 0
    })
    .await;
}

/// Deletes every sealed segment, once a synced checkpoint covers the durable log (retention
/// waits for one; asking for a segment asks for the checkpoint).
async fn delete_all_sealed(store: &Store, recycle: bool) -> usize {
    let durable = store.durable_offset().0;
    wait_until("no synced checkpoint covering the durable log", 30, || {
        let _ = store.oldest_sealed_segment();
        store.synced_checkpoint_covers().0 >= durable
    })
    .await;
    let mut deleted = 0;
    while let Some(segment) = store.oldest_sealed_segment() {
        assert!(segment.end.0 <= store.durable_offset().0);
        let done = store.delete_oldest_segment(segment, recycle).await.unwrap();
        let done = done.expect("the oldest sealed segment goes");
        assert_eq!(done.start, segment.start);
        deleted += 1;
    }
    deleted
}

async fn check_minimum_moved(store: &Store) -> (u64, u64) {
    let min_physical = store.min_physical_offset().0;
    let mut mins = (0, 0);
    for queue in 0..2u32 {
        let min = store.min_queue_offset("T", QueueId(queue)).0;
        let max = store.max_queue_offset("T", QueueId(queue)).0;
        assert!(min > 0 && min <= max, "queue {queue}: min {min} max {max}");
        // Below the minimum: OffsetTooSmall, pointing at the minimum.
        let below = pull_batch(store, "T", queue, 0).await;
        assert_eq!(below.status, GetStatus::OffsetTooSmall);
        assert_eq!(below.next_begin_offset.0, min);
        // From the minimum: every message still held, the first one at or past the
        // commitlog's first offset.
        let unit = store
            .queue_unit("T", QueueId(queue), QueueOffset(min))
            .unwrap()
            .expect("the minimum is held");
        assert!(unit.0 .0 >= min_physical);
        if min > 0 {
            assert!(store
                .queue_unit("T", QueueId(queue), QueueOffset(min - 1))
                .unwrap()
                .is_none());
        }
        let bodies = pull_all(store, "T", queue, min).await;
        assert_eq!(bodies.len() as u64, max - min);
        for (k, body) in bodies.iter().enumerate() {
            let i = (min + k as u64) * 2 + u64::from(queue);
            assert_eq!(body, &body_of(i, 1000));
        }
        if queue == 0 {
            mins.0 = min;
        } else {
            mins.1 = min;
        }
    }
    mins
}

#[test]
fn deleting_sealed_segments_moves_each_queues_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let (mins, segments_before) = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        fill(&store).await;
        let before = segment_files(dir.path());
        let queue_files = files_in(&dir.path().join("consumequeue/T/0"));
        assert!(queue_files >= 4, "units_per_file 64: {queue_files} files");
        let deleted = delete_all_sealed(&store, false).await;
        assert_eq!(store.stats().segments_recycled, 0);
        assert!(deleted >= 5, "{deleted} of {before} segments deleted");
        // No file is left below the commitlog's new start (files ahead are allocated space).
        let min_physical = store.min_physical_offset().0;
        assert_eq!(min_physical, deleted as u64 * SEGMENT);
        let below = std::fs::read_dir(dir.path().join("commitlog"))
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_str().unwrap().parse::<u64>().unwrap() < min_physical
            })
            .count();
        assert_eq!(below, 0);
        assert!(files_in(&dir.path().join("consumequeue/T/0")) < queue_files);
        assert!(store.stats().segments_deleted >= 5);
        let mins = check_minimum_moved(&store).await;
        // The active segment and everything after it stay.
        assert!(store.oldest_sealed_segment().is_none());
        store.close().await.unwrap();
        (mins, before)
    });
    assert!(segments_before > 0);
    // A clean restart finds the same minimums.
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        assert_eq!(check_minimum_moved(&store).await, mins);
        store.close().await.unwrap();
    });
}

#[test]
fn a_crash_between_a_segments_deletion_and_its_queues_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        fill(&store).await;
        store.close().await.unwrap();
    });
    // The segments go as if retention had removed them and the node died before the queues
    // followed: every consume-queue file is still there.
    let mut starts: Vec<u64> = std::fs::read_dir(dir.path().join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    starts.sort_unstable();
    for start in &starts[..4] {
        std::fs::remove_file(dir.path().join("commitlog").join(format!("{start:020}"))).unwrap();
    }
    std::fs::remove_file(dir.path().join("checkpoint")).unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        assert_eq!(store.min_physical_offset().0, starts[4]);
        check_minimum_moved(&store).await;
        // Appends go on after the repair.
        let more = append(&store, "T", 0, MESSAGES * 2, 1000, "tag");
        store.wait_durable(more.end_offset).await.unwrap();
        assert_eq!(
            more.queue_offset.0,
            store.max_queue_offset("T", QueueId(0)).0 - 1
        );
        store.close().await.unwrap();
    });
}

#[test]
fn the_active_segment_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, SEGMENT))
            .await
            .unwrap();
        // Less than a segment: nothing is sealed.
        for i in 0..20 {
            append(&store, "T", 0, i, 1000, "tag");
        }
        assert!(store.oldest_sealed_segment().is_none());
        store.close().await.unwrap();
    });
}

fn recycled_files(dir: &Path) -> Vec<u64> {
    let mut starts: Vec<u64> = std::fs::read_dir(dir.join("commitlog"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".recycled").map(|d| d.parse().unwrap())
        })
        .collect();
    starts.sort_unstable();
    starts
}

/// Every message of both queues from its minimum to its end is there, with its body.
async fn every_message_from_the_minimum(store: &Store) {
    for queue in 0..2u32 {
        let min = store.min_queue_offset("T", QueueId(queue)).0;
        let bodies = pull_all(store, "T", queue, min).await;
        for (k, body) in bodies.iter().enumerate() {
            let n = (min + k as u64) * 2 + u64::from(queue);
            assert_eq!(body, &body_of(n, 1000));
        }
        let max = store.max_queue_offset("T", QueueId(queue)).0;
        assert_eq!(min + bodies.len() as u64, max);
    }
}

/// The record of `size` bytes at `offset`, read from its segment's file.
fn record_on_disk(dir: &Path, offset: u64, size: u32) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let start = offset - offset % SEGMENT;
    let plain = dir.join("commitlog").join(format!("{start:020}"));
    let recycled = dir.join("commitlog").join(format!("{start:020}.recycled"));
    let file = std::fs::File::open(if recycled.exists() { recycled } else { plain }).unwrap();
    let mut bytes = vec![0u8; size as usize];
    file.read_exact_at(&mut bytes, offset - start).unwrap();
    bytes
}

/// Appends messages `first`, `first + 1`, … over both queues until one lies a block past
/// `offset`.
async fn append_into(store: &Store, offset: u64, first: u64) -> Vec<shards::store::AppendResult> {
    let mut i = first;
    let mut results = Vec::new();
    while results
        .last()
        .is_none_or(|r: &shards::store::AppendResult| r.physical_offset.0 < offset + 4096)
    {
        match try_append(store, "T", (i % 2) as u32, i, 1000, "tag") {
            Ok(result) => {
                results.push(result);
                i += 1;
            }
            // Allocation (a task of the store) has not reached so far yet.
            Err(_) => shards::runtime::sleep(std::time::Duration::from_millis(1)).await,
        }
    }
    results
}

fn config_keeping(path: &Path, keep_recycled_segments: bool) -> shards::store::StoreConfig {
    let mut config = config(path, FlushMode::Sync, SEGMENT);
    config.keep_recycled_segments = keep_recycled_segments;
    config
}

/// A master demoted to slave: its log ends in a recycled file, with more ahead, and it goes
/// on with its new master's records, unsealed (that master does not recycle). Opened as a
/// store that keeps no recycled file, it makes them plain, and a crash after the copied
/// records keeps every one of them (a recycled file would have cut the log at the first).
#[test]
fn a_store_that_keeps_no_recycled_file_makes_them_plain_and_keeps_unsealed_records() {
    let old = tempfile::tempdir().unwrap();
    let old_path = old.path();
    let (end, next, recycled) = run(|| async {
        let store = Store::open(config(old_path, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        fill(&store).await;
        delete_all_sealed(&store, true).await;
        let recycled = recycled_files(old_path);
        assert!(recycled.len() >= 2, "{recycled:?}");
        let results = append_into(&store, recycled[0], MESSAGES).await;
        let end = results.last().unwrap().end_offset;
        store.wait_durable(end).await.unwrap();
        store.close().await.unwrap();
        (end.0, MESSAGES + results.len() as u64, recycled)
    });
    let holding_end = end - end % SEGMENT;
    assert_eq!(
        holding_end, recycled[0],
        "the log ends in the first recycled file"
    );
    // The new master: a copy of the log so far, whose records from here on are unsealed.
    let new = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", old_path.display()))
        .arg(new.path())
        .status()
        .unwrap();
    assert!(status.success());
    let copied = run(|| async {
        let store = Store::open(config_keeping(new.path(), false))
            .await
            .unwrap();
        let results = append_into(&store, holding_end + SEGMENT + 8192, next).await;
        let new_end = results.last().unwrap().end_offset.0;
        store.wait_durable(CommitLogOffset(new_end)).await.unwrap();
        let mut bytes = Vec::new();
        while end + (bytes.len() as u64) < new_end {
            let more = store
                .read_log(end + bytes.len() as u64, 1 << 20)
                .await
                .unwrap();
            bytes.extend_from_slice(&more);
        }
        store.close().await.unwrap();
        bytes
    });
    let new_end = end + copied.len() as u64;
    run(|| async {
        let (store, summary) = open_recovered(config_keeping(old_path, false)).await;
        assert_eq!(summary.end, end);
        assert!(
            recycled_files(old_path).is_empty(),
            "{:?}",
            recycled_files(old_path)
        );
        // Past the end the file holding it reads as zeros, not its earlier life's records.
        {
            use std::os::unix::fs::FileExt;
            let file = std::fs::File::open(
                old_path
                    .join("commitlog")
                    .join(format!("{holding_end:020}")),
            )
            .unwrap();
            let mut rest = vec![0xffu8; (holding_end + SEGMENT - end) as usize];
            file.read_exact_at(&mut rest, end - holding_end).unwrap();
            assert!(rest.iter().all(|&b| b == 0), "old bytes past the end");
        }
        every_message_from_the_minimum(&store).await;
        let mut taken = 0;
        while taken < copied.len() {
            match store.append_replicated(end + taken as u64, &copied[taken..]) {
                Ok(n) if n > 0 => taken += n,
                // Allocation has not reached so far yet.
                Ok(_) | Err(_) => shards::runtime::sleep(std::time::Duration::from_millis(1)).await,
            }
        }
        store.wait_durable(CommitLogOffset(new_end)).await.unwrap();
        // A crash.
        drop(store);
    });
    let report = shards::store::verify::verify_store(old_path, Some(SEGMENT)).unwrap();
    assert_eq!(report.damage, 0, "{:?}", report.findings);
    assert_eq!(report.log_end, new_end);
    run(|| async {
        let (store, summary) = open_recovered(config_keeping(old_path, false)).await;
        assert_eq!(summary.end, new_end, "every copied record recovered");
        every_message_from_the_minimum(&store).await;
        let max: u64 = (0..2u32)
            .map(|q| store.max_queue_offset("T", QueueId(q)).0)
            .sum();
        assert!(max > next, "{max} messages held, {next} before the copy");
        store.close().await.unwrap();
    });
}

#[test]
fn recycled_segments_take_later_writes_sealed_and_recover_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let (last, torn, recycled) = run(|| async {
        let store = Store::open(config(path, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        fill(&store).await;
        let deleted = delete_all_sealed(&store, true).await;
        let recycled = recycled_files(path);
        let ahead_max = shards::store::recycled_ahead_max(SEGMENT) as usize;
        assert!(deleted >= 5, "{deleted} segments deleted");
        assert_eq!(store.stats().segments_recycled as usize, recycled.len());
        assert!(
            recycled.len() >= 2 && recycled.len() <= ahead_max,
            "{recycled:?}, at most {ahead_max}"
        );
        // They lie past the log's end, each after the last segment of its time.
        assert!(recycled[0] > store.durable_offset().0);
        // Appends go on until the log writes in the first recycled file.
        let results = append_into(&store, recycled[0], MESSAGES).await;
        let i = MESSAGES + results.len() as u64;
        let last = *results.last().unwrap();
        store.wait_durable(last.end_offset).await.unwrap();
        // Every record written over a recycled file carries a seal, the others none.
        for result in &results {
            let bytes = record_on_disk(path, result.physical_offset.0, result.record_size_bytes);
            let start = result.physical_offset.0 - result.physical_offset.0 % SEGMENT;
            let sealed = shards::store::record::seal_holds(&bytes);
            assert_eq!(
                sealed,
                recycled.contains(&start),
                "record at {}",
                result.physical_offset.0
            );
        }
        every_message_from_the_minimum(&store).await;
        // One more, left as a torn write leaves it over recycled space: its last block holds
        // what the file held there before (here: other bytes of the old records).
        let torn = append(&store, "T", 0, i, 1000, "tag");
        store.wait_durable(torn.end_offset).await.unwrap();
        // A crash: the store is dropped without its close.
        drop(store);
        (last, torn, recycled)
    });
    {
        use std::os::unix::fs::FileExt;
        let offset = torn.physical_offset.0;
        let start = offset - offset % SEGMENT;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path.join("commitlog").join(format!("{start:020}.recycled")))
            .unwrap();
        let tail_at = offset + u64::from(torn.record_size_bytes) - 16 - start;
        // Old properties' text, not zeros: no NUL at the end, so only the seal tells.
        file.write_all_at(b"AGS\x01tag\x02KEYS\x01k9", tail_at)
            .unwrap();
    }
    // The offline verifier reads the recycled files' old bytes as the log's end, not damage.
    let report = shards::store::verify::verify_store(path, Some(SEGMENT)).unwrap();
    assert_eq!(report.damage, 0, "{:?}", report.findings);
    assert_eq!(report.log_end, last.end_offset.0);
    run(|| async {
        let (store, summary) = open_recovered(config(path, FlushMode::Sync, SEGMENT)).await;
        // The recycled files past the end stay for the segments retention gave them to.
        assert_eq!(recycled_files(path), recycled);
        // The log ends before the torn record, after every acknowledged one, however many
        // old records the recycled file holds past it.
        assert_eq!(summary.end, torn.physical_offset.0);
        assert_eq!(summary.end, last.end_offset.0);
        every_message_from_the_minimum(&store).await;
        // Appends after the recovery land over the recycled file again, sealed.
        let more = append(&store, "T", 1, 99_999, 1000, "tag");
        store.wait_durable(more.end_offset).await.unwrap();
        assert_eq!(more.physical_offset, torn.physical_offset);
        store.close().await.unwrap();
        let bytes = record_on_disk(path, more.physical_offset.0, more.record_size_bytes);
        assert!(shards::store::record::seal_holds(&bytes));
    });
    let report = shards::store::verify::verify_store(path, Some(SEGMENT)).unwrap();
    assert_eq!(report.damage, 0, "{:?}", report.findings);
}

/// A power loss soon after retention emptied a queue made since the last synced checkpoint:
/// retention waited for a synced checkpoint that counts the queue, so the queue comes back
/// with its offsets and its next message takes the next one. (It used to come back empty,
/// its next message at offset 0, below what its consumers had read: a power-cut test under
/// load found one such queue.)
#[test]
fn a_power_loss_after_retention_emptied_a_new_queue_keeps_its_offsets() {
    const NEW: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    run(|| async {
        let store = Store::open(config(root, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        fill(&store).await;
        delete_all_sealed(&store, false).await;
        // New's records then lie in the oldest segment, the next to go.
        let mut new_end = 0;
        for i in 0..NEW {
            new_end = append(&store, "New", 0, MESSAGES + i, 1000, "tag")
                .end_offset
                .0;
        }
        // Enough behind it to seal its segment and the next.
        let mut last = CommitLogOffset(0);
        for i in 0..(3 * SEGMENT / 1000) {
            last = append(&store, "T", 0, MESSAGES + NEW + i, 1000, "tag").end_offset;
        }
        store.wait_durable(last).await.unwrap();
        // Retention at its most eager: each segment as soon as it may go, until New's go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.min_physical_offset().0 < new_end {
            match store.oldest_sealed_segment() {
                Some(segment) => {
                    store.delete_oldest_segment(segment, false).await.unwrap();
                }
                None => {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "New's records never went"
                    );
                    shards::runtime::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        }
        drop(store); // a crash at once, before any later checkpoint
    });
    // The power went too: the light checkpoint, of this boot, no longer holds.
    let _ = std::fs::remove_file(root.join("checkpoint.light"));
    run(|| async {
        let store = Store::open(config(root, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let (min, max) = (
            store.min_queue_offset("New", QueueId(0)).0,
            store.max_queue_offset("New", QueueId(0)).0,
        );
        assert_eq!((min, max), (NEW, NEW), "New's offsets after the power loss");
        let next = append(&store, "New", 0, 1 << 20, 1000, "tag");
        assert_eq!(next.queue_offset.0, NEW);
        store.close().await.unwrap();
    });
}
