//! Flushing, segments, reopen and recovery: what must survive a stop.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use crate::support::*;
use futures_lite::future::zip;
use shards::runtime::fs::DirectFile;
use shards::store::{record, FlushMode, GetStatus, Store, StoreError};

const SMALL_SEGMENT: u64 = 64 << 10;

fn segment_path(dir: &Path, start: u64) -> std::path::PathBuf {
    dir.join("commitlog").join(format!("{start:020}"))
}

#[test]
fn sync_mode_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        let first = append(&store, "T", 0, 0, 64, "t");
        store.wait_durable(first.end_offset).await.unwrap();
        assert!(store.stats().durable_offset >= first.end_offset.0);
        let before = store.stats();
        let ends: Vec<u64> = (1..=300)
            .map(|i| append(&store, "T", 0, i, 64, "t").end_offset.0)
            .collect();
        for &end in &ends {
            store
                .wait_durable(shards::CommitLogOffset(end))
                .await
                .unwrap();
        }
        let after = store.stats();
        // Appends made without giving the executor back (a connection task handling its
        // client's window) share one group commit while less than `SYNC_KICK_MIN_BYTES` is
        // dirty: the flusher task starts it once the appending task yields. Started at the
        // first append, the first message would go alone and the rest in a second flush.
        let dirty = ends.last().unwrap() - first.end_offset.0;
        assert!(dirty < shards::store::SYNC_KICK_MIN_BYTES, "{dirty}");
        let flushes = after.flushes - before.flushes;
        assert_eq!(flushes, 1, "300 appends took {flushes} flushes");
        assert_eq!(after.durable_offset, *ends.last().unwrap());
        assert_eq!(after.put_messages, 301);
        assert!(after.messages_per_flush() > 1.0);
        store.close().await.unwrap();
    });
}

/// SYNC_FLUSH load that keeps the data slot busy (the end of each flush starts the next) while
/// the flusher's loop runs flushes of its own (each writer's first append leaves less than
/// `SYNC_KICK_MIN_BYTES` dirty): allocation keeps up, and no append meets the end of the
/// allocated space. The loop once waited for a free slot there as long as the load lasted,
/// and started no allocation meanwhile.
#[test]
fn sync_load_that_keeps_the_data_slot_busy_meets_no_unallocated_space() {
    let dir = tempfile::tempdir().unwrap();
    let total: u64 = 512 << 20;
    let refused = run(|| async {
        let mut config = config(dir.path(), FlushMode::Sync, 64 << 20);
        config.allocation_window_bytes = shards::limits::ALLOCATION_WINDOW_MIN_BYTES;
        let store = Store::open(config).await.unwrap();
        let refused = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let tasks: Vec<_> = (0..32u32)
            .map(|w| {
                let (store, refused) = (store.clone(), refused.clone());
                shards::runtime::spawn(async move {
                    let mut i = u64::from(w) << 32;
                    let mut round = u64::from(w);
                    while store.stats().write_offset < total {
                        let mut last = None;
                        round += 1;
                        for _ in 0..=round % 8 {
                            i += 1;
                            match try_append(&store, "Slot", w % 4, i, 4000, "t") {
                                Ok(appended) => last = Some(appended.end_offset),
                                Err(StoreError::SpaceNotReady { .. }) => {
                                    refused.set(refused.get() + 1)
                                }
                                Err(error) => panic!("{error}"),
                            }
                            // As a connection task does after each request: collect the ends
                            // of chains, which start the next flush when enough is dirty.
                            shards::runtime::run_poll_hooks();
                        }
                        match last {
                            Some(end) => store.wait_durable(end).await.unwrap(),
                            None => shards::runtime::sleep(Duration::from_millis(1)).await,
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await;
        }
        store.close().await.unwrap();
        refused.get()
    });
    assert_eq!(refused, 0, "appends refused for space not yet allocated");
}

#[test]
fn concurrent_waiters_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        // Two producers appending and waiting in turn: each flush carries the other's appends.
        let producer = |queue: u32| {
            let store = store.clone();
            shards::runtime::spawn(async move {
                for i in 0..200 {
                    let end = append(&store, "T", queue, i, 128, "t").end_offset;
                    store.wait_durable(end).await.unwrap();
                }
            })
        };
        zip(producer(0), producer(1)).await;
        let stats = store.stats();
        assert_eq!(stats.put_messages, 400);
        assert!(
            stats.flushes < 400,
            "{} flushes for 400 acknowledged appends",
            stats.flushes
        );
        store.close().await.unwrap();
    });
}

#[test]
fn async_mode_flushes_within_interval() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, 1 << 20))
            .await
            .unwrap();
        let end = append(&store, "T", 0, 0, 64, "t").end_offset;
        let started = std::time::Instant::now();
        store.wait_durable(end).await.unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(store.stats().durable_offset, end);
        store.close().await.unwrap();
    });
}

#[test]
fn async_flush_batch_starts_a_flush_before_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let mut small_batch = config(dir.path(), FlushMode::Async, 1 << 20);
        small_batch.flush_interval_ms = 60_000;
        small_batch.flush_dirty_max_bytes = 8192;
        let store = Store::open(small_batch).await.unwrap();
        let first = append(&store, "T", 0, 0, 64, "t").end_offset;
        shards::runtime::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            store.stats().durable_offset < first.0,
            "under the batch, a message waits for the 60 s interval"
        );
        let mut end = first;
        for i in 1..=64 {
            end = append(&store, "T", 0, i, 200, "t").end_offset;
        }
        let started = std::time::Instant::now();
        store.wait_durable(end).await.unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        store.close().await.unwrap();
    });
    let mut refused = config(dir.path(), FlushMode::Async, 1 << 20);
    refused.flush_dirty_max_bytes = 0;
    let error = run(|| async { Store::open(refused).await.err() });
    assert!(matches!(error, Some(StoreError::Config(_))), "{error:?}");
}

#[test]
fn async_mode_writes_at_once_for_a_written_waiter_without_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let mut slow = config(dir.path(), FlushMode::Async, 1 << 20);
        slow.flush_interval_ms = 60_000;
        let store = Store::open(slow).await.unwrap();
        let first = append(&store, "T", 0, 0, 64, "t").end_offset;
        shards::runtime::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            store.written_offset() < first,
            "unasked, an append waits for the 60 s interval"
        );
        let started = std::time::Instant::now();
        store.wait_written(first).await.unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert!(store.written_offset() >= first);
        assert!(
            store.durable_offset() < first,
            "a write asked for is not a sync"
        );
        // Written already: it returns at once.
        store.wait_written(first).await.unwrap();
        store.close().await.unwrap();
    });
}

#[test]
fn async_mode_syncs_what_it_wrote_within_the_interval_unasked() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let mut async_config = config(dir.path(), FlushMode::Async, 1 << 20);
        async_config.flush_interval_ms = 50;
        async_config.flush_dirty_max_bytes = 8192;
        let store = Store::open(async_config).await.unwrap();
        let mut end = shards::CommitLogOffset(0);
        for i in 0..100 {
            end = append(&store, "T", 0, i, 200, "t").end_offset;
        }
        // Nobody waits: the writes (past the batch) and then a sync come by themselves.
        let started = std::time::Instant::now();
        while store.stats().durable_offset < end.0 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "durable at {} of {end} after 5 s",
                store.stats().durable_offset
            );
            shards::runtime::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(store.stats().flushes >= 1);
        store.close().await.unwrap();
    });
}

#[test]
fn async_mode_across_many_small_segments_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut async_config = config(dir.path(), FlushMode::Async, SMALL_SEGMENT);
    // Syncs come only when asked for or when too many files wait: never by the clock.
    async_config.flush_interval_ms = 60_000;
    async_config.flush_dirty_max_bytes = 16 << 10;
    let count = 3_000u64;
    let durable = run(|| async {
        let store = Store::open(async_config.clone()).await.unwrap();
        let mut end = shards::CommitLogOffset(0);
        for i in 0..count {
            end = append(&store, "T", 0, i, 700, "t").end_offset;
            if i % 97 == 0 {
                // Let the flusher write (the tail is bounded, appends would be refused).
                shards::runtime::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        assert!(
            end.0 > 20 * SMALL_SEGMENT,
            "the load spans more segments than a sync chain takes at once"
        );
        store.wait_durable(end).await.unwrap();
        assert_eq!(store.stats().durable_offset, end.0);
        end.0
        // Dropped without close: what a crash leaves.
    });
    run(|| async {
        let store = Store::open(async_config).await.unwrap();
        assert!(store.max_physical_offset() >= shards::CommitLogOffset(durable));
        let bodies = pull_all(&store, "T", 0, 0).await;
        assert_eq!(bodies.len() as u64, count);
        for (i, body) in bodies.iter().enumerate() {
            assert_eq!(body, &body_of(i as u64, 700));
        }
        store.close().await.unwrap();
    });
}

#[test]
fn segments_roll_and_read_back_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let count = 200u64;
    let rolled = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        let mut last = None;
        for i in 0..count {
            last = Some(append(
                &store,
                "Roll",
                (i % 3) as u32,
                i,
                1000 + (i % 7) as usize,
                "t",
            ));
        }
        store.wait_durable(last.unwrap().end_offset).await.unwrap();
        let end = store.max_physical_offset();
        assert!(
            end > shards::CommitLogOffset(3 * SMALL_SEGMENT),
            "the log spans several segments: {end}"
        );
        // No record crosses a segment boundary.
        for q in 0..3 {
            let bodies = pull_all(&store, "Roll", q, 0).await;
            assert_eq!(
                bodies.len() as u64,
                store.max_queue_offset("Roll", shards::QueueId(q))
            );
        }
        store.close().await.unwrap();
        end
    });
    assert!(segment_path(dir.path(), 2 * SMALL_SEGMENT).exists());
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        assert_eq!(store.max_physical_offset(), rolled);
        let mut seen = 0;
        for q in 0..3u32 {
            let bodies = pull_all(&store, "Roll", q, 0).await;
            for (k, body) in bodies.iter().enumerate() {
                let i = q as u64 + 3 * k as u64;
                assert_eq!(body, &body_of(i, 1000 + (i % 7) as usize));
            }
            seen += bodies.len() as u64;
        }
        assert_eq!(seen, count);
        let next = append(&store, "Roll", 0, count, 1000, "t");
        assert_eq!(next.physical_offset, rolled);
        assert_eq!(next.queue_offset, shards::QueueOffset(count.div_ceil(3)));
        store.close().await.unwrap();
    });
}

/// Writes `count` records of `size(i)` bytes (`body_of(i, …)`) to `topic`'s queues 0 to 3 in
/// turn in a SYNC_FLUSH store of `segment`-byte segments, and closes it once they are
/// durable; returns where the log ends.
fn written_over_four_queues(
    dir: &Path,
    segment: u64,
    topic: &str,
    count: u64,
    size: impl Fn(u64) -> usize,
) -> u64 {
    run(|| async {
        let store = Store::open(config(dir, FlushMode::Sync, segment))
            .await
            .unwrap();
        let mut last = None;
        for i in 0..count {
            let appended = append(&store, topic, (i % 4) as u32, i, size(i), "t");
            // (The store refuses appends past 32 MiB that are not yet durable.)
            if i % 4096 == 4095 {
                store.wait_durable(appended.end_offset).await.unwrap();
            }
            last = Some(appended);
        }
        store.wait_durable(last.unwrap().end_offset).await.unwrap();
        let end = store.max_physical_offset().0;
        store.close().await.unwrap();
        end
    })
}

/// Pulls of cold records read the log through 1 MiB windows held as their DMA reads brought
/// them in (read_cache.rs): records that straddle a window's end, interleaved across queues,
/// come back whole and in order after a reopen, when nothing is in the in-memory tail.
#[test]
fn cold_pulls_read_records_that_straddle_windows_whole() {
    const SEGMENT: u64 = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let count = 4_000u64;
    let size = |i: u64| 700 + (i % 13) as usize * 61;
    let end = written_over_four_queues(dir.path(), SEGMENT, "Cold", count, size);
    assert!(end > 3 << 20);
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        for q in 0..4u32 {
            let bodies = pull_all(&store, "Cold", q, 0).await;
            assert_eq!(bodies.len() as u64, count / 4, "queue {q}");
            for (k, body) in bodies.iter().enumerate() {
                let i = u64::from(q) + 4 * k as u64;
                assert_eq!(body, &body_of(i, size(i)), "queue {q} offset {k}");
            }
        }
        let stats = store.stats();
        assert!(
            stats.read_cache_misses > 0 && stats.read_cache_hits > 0,
            "the pulls read through the windows: {} hits, {} misses",
            stats.read_cache_hits,
            stats.read_cache_misses
        );
        store.close().await.unwrap();
    });
}

/// Consumers catching up at more places in the log than the read cache has windows: those
/// whose windows are held keep them, the others read their own records' spans past the cache
/// (read_cache.rs, `Lookup::Bypass`), the pulls of one consumer's queues sharing them, and
/// every consumer gets every record whole and in order. A cache of more windows
/// (`read_cache_windows`, the knob `store.read_cache_mib`) holds them all.
#[test]
fn pulls_at_more_places_than_the_cache_holds_read_past_it() {
    let default = pulls_at_places(shards::store::READ_CACHE_WINDOWS_DEFAULT);
    assert!(
        default.read_cache_bypasses > 0 && default.read_cache_hits > 0,
        "{} hits, {} misses, {} of them past the cache",
        default.read_cache_hits,
        default.read_cache_misses,
        default.read_cache_bypasses
    );
    assert!(
        default.read_cache_span_shares * 2 > default.read_cache_bypasses,
        "most pulls past the cache take a span another of the same consumer read: {} of {}",
        default.read_cache_span_shares,
        default.read_cache_bypasses
    );
    let larger = pulls_at_places(64);
    assert!(
        larger.read_cache_misses < default.read_cache_misses
            && larger.read_cache_bypasses * 10 < default.read_cache_bypasses,
        "with 64 windows {} misses, {} past the cache; with 16 {} and {}",
        larger.read_cache_misses,
        larger.read_cache_bypasses,
        default.read_cache_misses,
        default.read_cache_bypasses
    );
}

/// 24 consumers at 24 places over a reopened store with `windows` in its read cache, each
/// checking every record it gets; the store's counters after them.
fn pulls_at_places(windows: usize) -> shards::store::StoreStats {
    const SEGMENT: u64 = 16 << 20;
    const PLACES: u64 = 24;
    const PER_QUEUE: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let size = |i: u64| 900 + (i % 11) as usize * 37;
    let count = PLACES * PER_QUEUE + 4 * 600;
    written_over_four_queues(dir.path(), SEGMENT, "Places", count, size);
    run(|| async {
        let mut config = config(dir.path(), FlushMode::Sync, SEGMENT);
        config.read_cache_windows = windows;
        let store = Store::open(config).await.unwrap();
        // Each consumer starts a window or more past the one before and reads 600 records
        // of each of the 4 queues, its 4 queues pulled at once (as clients pipeline them).
        let consumers: Vec<_> = (0..PLACES)
            .flat_map(|place| (0..4u32).map(move |q| (place, q)))
            .map(|(place, q)| {
                let store = store.clone();
                shards::runtime::spawn(async move {
                    let mut next = place * PER_QUEUE / 4;
                    let end = next + 600;
                    while next < end {
                        let found = pull_batch(&store, "Places", q, next).await;
                        assert!(found.message_count > 0, "place {place} queue {q} at {next}");
                        for message in record::decode_all(&found.body).unwrap() {
                            let i = u64::from(q) + 4 * message.queue_offset;
                            assert_eq!(message.queue_offset, next);
                            assert_eq!(message.body, &body_of(i, size(i))[..], "record {i}");
                            next += 1;
                        }
                    }
                })
            })
            .collect();
        for consumer in consumers {
            consumer.await;
        }
        let stats = store.stats();
        assert_eq!(stats.corrupt_records, 0);
        store.close().await.unwrap();
        stats
    })
}

/// Segment files are created well ahead of the appends (creating one syncs the directory,
/// which can wait seconds for the journal under load), hold no blocks until allocation
/// reaches them, and the ones past the next are removed by the recovery of the next open.
#[test]
fn segment_files_are_created_ahead_and_hold_no_blocks() {
    use std::os::unix::fs::MetadataExt;
    const SEGMENT: u64 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    // The window (128 MiB) aims into segment 2; eight more files are prepared past it.
    let last = 10 * SEGMENT;
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let first = append(&store, "Ahead", 0, 0, 1000, "t");
        store.wait_durable(first.end_offset).await.unwrap();
        let mut waited = 0;
        while !segment_path(dir.path(), last).exists() {
            assert!(waited < 10_000, "segment {last} was not created ahead");
            shards::runtime::sleep(std::time::Duration::from_millis(10)).await;
            waited += 10;
        }
        for k in 3..=10 {
            let meta = std::fs::metadata(segment_path(dir.path(), k * SEGMENT)).unwrap();
            assert_eq!(meta.len(), SEGMENT);
            assert_eq!(meta.blocks(), 0, "segment {k} holds blocks");
        }
        assert!(!segment_path(dir.path(), last + SEGMENT).exists());
        let second = append(&store, "Ahead", 0, 1, 1000, "t");
        store.wait_durable(second.end_offset).await.unwrap();
        store.close().await.unwrap();
    });
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let bodies = pull_all(&store, "Ahead", 0, 0).await;
        assert_eq!(bodies, vec![body_of(0, 1000), body_of(1, 1000)]);
        store.close().await.unwrap();
    });
}

/// SYNC_FLUSH load that never pauses, across several segments: group commits follow one
/// another, zero-fill waits for a quiet spell (none under load), so most of the durable
/// writes land on space only fallocated, and every acknowledged message reads back after a
/// reopen.
#[test]
fn sync_load_across_segments_writes_over_fallocated_space() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 1u64 << 20;
    let (writers, per_writer) = (32u64, 160u64);
    let size = |i: u64| 1000 + (i % 13) as usize;
    let written = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, segment))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let store = store.clone();
                shards::runtime::spawn(async move {
                    for k in 0..per_writer {
                        let i = w + writers * k;
                        let end =
                            append(&store, "Steady", w as u32 % 4, i, size(i), "t").end_offset;
                        store.wait_durable(end).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await;
        }
        let stats = store.stats();
        assert!(stats.write_offset > 4 * segment, "{stats:?}");
        assert_eq!(stats.durable_offset, stats.write_offset);
        // The fresh store's first quiet spell zeroes up to the end of its second segment;
        // zeros paced with the writes would have covered every segment they reached.
        assert!(stats.zero_filled_bytes < stats.write_offset, "{stats:?}");
        assert!(
            stats.flushes < stats.put_messages,
            "group commit: {stats:?}"
        );
        store.close().await.unwrap();
        stats.write_offset
    });
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, segment))
            .await
            .unwrap();
        assert_eq!(
            store.max_physical_offset(),
            shards::CommitLogOffset(written)
        );
        let mut seen = 0;
        for q in 0..4u32 {
            let bodies = pull_all(&store, "Steady", q, 0).await;
            seen += bodies.len() as u64;
        }
        assert_eq!(seen, writers * per_writer);
        store.close().await.unwrap();
    });
}

#[test]
fn freshly_created_segment_reads_back_through_dma() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        let mut last = append(&store, "T", 0, 0, 500, "t");
        while last.end_offset < shards::CommitLogOffset(SMALL_SEGMENT + 600) {
            last = append(&store, "T", 0, (last.queue_offset + 1).0, 500, "t");
        }
        store.wait_durable(last.end_offset).await.unwrap();
        // The second segment was created by this store a moment ago; read its first record
        // with a DMA read, as the store's readers do.
        let file = DirectFile::open_read_only(&segment_path(dir.path(), SMALL_SEGMENT))
            .await
            .unwrap();
        let mut bytes = vec![0u8; 4096];
        file.read_exact_at(0, &mut bytes)
            .await
            .expect("DMA read of a fresh segment");
        let first = record::decode(&bytes).unwrap();
        assert_eq!(first.physical_offset, SMALL_SEGMENT);
        file.close().await.unwrap();
        let again = store
            .read_record(shards::CommitLogOffset(SMALL_SEGMENT))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            record::decode(&again).unwrap().queue_offset,
            first.queue_offset
        );
        store.close().await.unwrap();
    });
}

#[test]
fn probe_trap_is_detected_when_an_empty_dma_file_came_first() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir_in(dir.path()).unwrap();
    let opened = std::thread::spawn({
        let root = dir.path().join("store");
        let empty = elsewhere.path().join("empty");
        move || {
            run(|| async move {
                let file = DirectFile::open(&empty, true).await.unwrap();
                file.close().await.unwrap();
                Store::open(config(&root, FlushMode::Sync, SMALL_SEGMENT))
                    .await
                    .map(|_| ())
            })
        }
    })
    .join()
    .unwrap();
    eprintln!("probe trap outcome on this machine: {opened:?}");
    // On devices without polled I/O (virtio) the trap makes DMA reads fail: the store says so.
    // Where polling really works the probe's verdict is right and the store opens.
    match opened {
        Ok(()) => {}
        Err(StoreError::Config(text)) => assert!(text.contains("EOPNOTSUPP"), "{text}"),
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[test]
fn reopen_keeps_messages_and_rebuilds_deleted_queues() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        for i in 0..150 {
            append(
                &store,
                if i % 2 == 0 { "Even" } else { "Odd" },
                (i % 4) as u32,
                i,
                300,
                "t",
            );
        }
        store.close().await.unwrap();
    });
    let expected = [
        (("Even", 0), 38),
        (("Even", 2), 37),
        (("Odd", 1), 38),
        (("Odd", 3), 37),
    ];
    for delete_queues in [false, true] {
        if delete_queues {
            std::fs::remove_dir_all(dir.path().join("consumequeue")).unwrap();
        }
        run(|| async {
            let config = config(dir.path(), FlushMode::Sync, SMALL_SEGMENT);
            let store = Store::open(config).await.unwrap();
            for ((topic, q), count) in expected {
                assert_eq!(
                    store.max_queue_offset(topic, shards::QueueId(q)),
                    shards::QueueOffset(count),
                    "{topic}/{q}"
                );
                let bodies = pull_all(&store, topic, q, 0).await;
                assert_eq!(bodies.len() as u64, count);
                let first = q as u64; // message i goes to queue i % 4
                assert_eq!(bodies[0], body_of(first, 300));
            }
            store.close().await.unwrap();
        });
    }
}

#[test]
fn unclean_stop_keeps_acknowledged_messages() {
    let dir = tempfile::tempdir().unwrap();
    let acknowledged = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        let mut end = 0;
        for i in 0..120 {
            end = append(&store, "T", 0, i, 700, "t").end_offset.0;
        }
        store
            .wait_durable(shards::CommitLogOffset(end))
            .await
            .unwrap();
        // Not waited for: may or may not survive.
        append(&store, "T", 0, 120, 700, "t");
        end
        // The store is dropped without close: the flusher stops, nothing more is written.
    });
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        assert!(store.max_physical_offset() >= shards::CommitLogOffset(acknowledged));
        let max = store.max_queue_offset("T", shards::QueueId(0));
        assert!(
            max == shards::QueueOffset(120) || max == shards::QueueOffset(121),
            "max offset {max}"
        );
        let bodies = pull_all(&store, "T", 0, 0).await;
        assert_eq!(bodies.len() as u64, max);
        for (i, body) in bodies.iter().enumerate() {
            assert_eq!(body, &body_of(i as u64, 700));
        }
        store.close().await.unwrap();
    });
}

#[test]
fn torn_tail_is_cut_at_the_last_good_record() {
    let dir = tempfile::tempdir().unwrap();
    let (last, previous_end) = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        let mut results = Vec::new();
        for i in 0..30 {
            results.push(append(&store, "T", 1, i, 900, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        store.close().await.unwrap();
        let last = *results.last().unwrap();
        (last, results[results.len() - 2].end_offset)
    });
    // Tear the last record: flip a byte of its body on disk.
    let segment = last.physical_offset - last.physical_offset % SMALL_SEGMENT;
    let file = OpenOptions::new()
        .write(true)
        .open(segment_path(dir.path(), segment.0))
        .unwrap();
    let body_at = last.physical_offset - segment + 100;
    file.write_at(b"\xFF\xFE", body_at).unwrap();
    file.sync_all().unwrap();
    drop(file);
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        assert_eq!(store.max_physical_offset(), previous_end);
        assert_eq!(
            store.max_queue_offset("T", shards::QueueId(1)),
            shards::QueueOffset(29)
        );
        assert!(store
            .read_record(last.physical_offset)
            .await
            .unwrap()
            .is_none());
        let next = append(&store, "T", 1, 99, 900, "t");
        assert_eq!(
            (next.physical_offset.0, next.queue_offset.0),
            (previous_end.0, 29)
        );
        store.wait_durable(next.end_offset).await.unwrap();
        drop(store);
    });
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        assert_eq!(
            store.max_queue_offset("T", shards::QueueId(1)),
            shards::QueueOffset(30)
        );
        let bodies = pull_all(&store, "T", 1, 0).await;
        assert_eq!(bodies[29], body_of(99, 900));
        store.close().await.unwrap();
    });
}

#[test]
fn truncated_file_tail_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let results = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        let results: Vec<_> = (0..10)
            .map(|i| append(&store, "T", 0, i, 2000, "t"))
            .collect();
        store.wait_durable(results[9].end_offset).await.unwrap();
        store.close().await.unwrap();
        results
    });
    // Zero everything from the middle of record 7: as if its last blocks never reached disk.
    let file = OpenOptions::new()
        .write(true)
        .open(segment_path(dir.path(), 0))
        .unwrap();
    let cut = results[7].physical_offset + 50;
    file.write_at(&vec![0u8; (results[9].end_offset - cut) as usize], cut.0)
        .unwrap();
    drop(file);
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SMALL_SEGMENT))
            .await
            .unwrap();
        assert_eq!(
            store.max_queue_offset("T", shards::QueueId(0)),
            shards::QueueOffset(7)
        );
        assert_eq!(store.max_physical_offset(), results[7].physical_offset);
        let found = pull_batch(&store, "T", 0, 7).await;
        assert_eq!(found.status, GetStatus::OffsetOverflowOne);
        store.close().await.unwrap();
    });
}

#[test]
fn failed_write_poisons_the_store() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        let ok = append(&store, "T", 0, 0, 10, "t");
        store.wait_durable(ok.end_offset).await.unwrap();
        store.inject_fault(shards::store::InjectedFault::WriteError { errno: libc::EIO });
        let doomed = append(&store, "T", 0, 1, 10, "t");
        let waited = store.wait_durable(doomed.end_offset).await;
        assert!(matches!(waited, Err(StoreError::Poisoned(_))), "{waited:?}");
        let refused = store.append(&shards::store::MessageToStore {
            topic: "T",
            queue_id: 0,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: 0,
            born_host: BORN_HOST.parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: b"x",
            properties: b"",
            tags_code: 0,
        });
        assert!(matches!(refused, Err(StoreError::Poisoned(ref text)) if text.contains("write")));
        // Reads still work.
        assert!(store
            .read_record(ok.physical_offset)
            .await
            .unwrap()
            .is_some());
        assert!(store.close().await.is_err());
    });
    // A restart recovers: the acknowledged message is there.
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        assert!(store.max_queue_offset("T", shards::QueueId(0)) >= shards::QueueOffset(1));
        store.close().await.unwrap();
    });
}

#[test]
fn failed_fdatasync_poisons_too() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        store.inject_fault(shards::store::InjectedFault::FdatasyncError { errno: libc::EIO });
        let end = append(&store, "T", 0, 0, 10, "t").end_offset;
        assert!(matches!(
            store.wait_durable(end).await,
            Err(StoreError::Poisoned(_))
        ));
    });
}

#[test]
fn failed_fdatasync_poisons_an_async_store() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, 1 << 20))
            .await
            .unwrap();
        let ok = append(&store, "T", 0, 0, 10, "t").end_offset;
        store.wait_durable(ok).await.unwrap();
        store.inject_fault(shards::store::InjectedFault::FdatasyncError { errno: libc::EIO });
        let end = append(&store, "T", 0, 1, 10, "t").end_offset;
        let waited = store.wait_durable(end).await;
        assert!(matches!(waited, Err(StoreError::Poisoned(_))), "{waited:?}");
        let refused = store.append(&message(b"after"));
        assert!(
            matches!(refused, Err(StoreError::Poisoned(ref text)) if text.contains("fdatasync")),
            "{refused:?}"
        );
    });
}

#[test]
fn a_write_that_finds_the_disk_full_is_retried_not_poisoned() {
    let dir = tempfile::tempdir().unwrap();
    let accepted = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        store.inject_fault(shards::store::InjectedFault::WriteError {
            errno: libc::ENOSPC,
        });
        let started = std::time::Instant::now();
        let first = append(&store, "T", 0, 0, 10, "t");
        // While the write waits for its retry, appends are refused as a full disk.
        let mut accepted = 1;
        let refused = loop {
            match store.append(&message(b"second")) {
                Err(error) => break error,
                Ok(_) if started.elapsed() < std::time::Duration::from_secs(1) => {
                    // Taken before the failed write was reaped.
                    accepted += 1;
                    shards::runtime::sleep(std::time::Duration::from_millis(1)).await
                }
                Ok(_) => panic!("no append was refused while the disk was full"),
            }
        };
        assert!(matches!(refused, StoreError::DiskFull { .. }), "{refused}");
        assert!(store.space_refusal().is_some());
        // The retry writes it: the send waiting for it succeeds, and writes go on.
        store.wait_durable(first.end_offset).await.unwrap();
        assert!(
            started.elapsed()
                >= std::time::Duration::from_millis(shards::store::FLUSH_RETRY_MS - 100)
        );
        assert!(store.space_refusal().is_none(), "cleared by itself");
        assert!(store.poisoned().is_none());
        let next = append(&store, "T", 0, 1, 10, "t");
        store.wait_durable(next.end_offset).await.unwrap();
        store.close().await.unwrap();
        accepted + 1
    });
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        assert_eq!(
            store.max_queue_offset("T", shards::QueueId(0)),
            shards::QueueOffset(accepted)
        );
        store.close().await.unwrap();
    });
}

fn message(body: &[u8]) -> shards::store::MessageToStore<'_> {
    shards::store::MessageToStore {
        topic: "T",
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp_ms: 0,
        born_host: BORN_HOST.parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body,
        properties: b"",
        tags_code: 0,
    }
}

/// A periodic checkpoint waits for the flusher's own flushes to make its offset durable (the
/// flusher goes on allocating meanwhile). A close that comes while it waits on a slow disk
/// goes ahead, and the close's own checkpoint covers every message.
#[test]
fn a_checkpoint_waiting_for_a_slow_flush_lets_the_close_go_ahead() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 1 << 20))
            .await
            .unwrap();
        let first = append(&store, "T", 0, 0, 64, "t");
        store.wait_durable(first.end_offset).await.unwrap();
        let before = store.stats().checkpoints;
        store.set_test_flush_delay(Some(std::time::Duration::from_millis(1_500)));
        append(&store, "T", 0, 1, 64, "t");
        // A checkpoint is due a second after the last: it is planned at the second append's
        // end and waits, with the flush, for the slow disk.
        shards::runtime::sleep(std::time::Duration::from_millis(1_200)).await;
        assert_eq!(
            store.stats().checkpoints,
            before,
            "nothing was durable to record"
        );
        store.close().await.unwrap();
    });
    run(|| async {
        let (store, summary) = open_recovered(config(dir.path(), FlushMode::Sync, 1 << 20)).await;
        assert!(summary.clean);
        assert_eq!(
            pull_all(&store, "T", 0, 0).await,
            vec![body_of(0, 64), body_of(1, 64)]
        );
        store.close().await.unwrap();
    });
}
