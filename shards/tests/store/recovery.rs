//! Recovery against damaged commitlog tails: cut the log at many points, reopen, check.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::support::*;
use shards::store::{record, FlushMode, Store};

const SEGMENT: u64 = 64 << 10;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Zeroes the commitlog from `cut` to the end of its segment, and deletes later segments.
fn cut_log(dir: &Path, cut: u64) {
    let segment = cut - cut % SEGMENT;
    let path = dir.join("commitlog").join(format!("{segment:020}"));
    let file = OpenOptions::new().write(true).open(path).unwrap();
    file.write_at(
        &vec![0u8; (segment + SEGMENT - cut) as usize],
        cut - segment,
    )
    .unwrap();
    for entry in std::fs::read_dir(dir.join("commitlog")).unwrap() {
        let entry = entry.unwrap();
        let start: u64 = entry.file_name().to_str().unwrap().parse().unwrap();
        if start > segment {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
}

#[test]
fn every_cut_recovers_to_the_records_before_it() {
    let original = tempfile::tempdir().unwrap();
    let results = run(|| async {
        let store = Store::open(config(original.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let results: Vec<_> = (0..150)
            .map(|i| {
                append(
                    &store,
                    "T",
                    (i % 2) as u32,
                    i,
                    500 + (i % 5) as usize * 97,
                    "t",
                )
            })
            .collect();
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        drop(store); // an unclean stop: the checkpoint stays behind the end
        results
    });
    let end = results.last().unwrap().end_offset.0;
    // A fixed pseudo-random sequence of cut points (seeded: rerun gives the same cuts).
    let seed = 0x5EED_u64;
    let mut state = seed;
    let mut cuts = vec![
        1,
        results[1].physical_offset.0,
        results[100].physical_offset.0 + 1,
        end - 1,
    ];
    for _ in 0..12 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        cuts.push(1 + (state >> 33) % (end - 1));
    }
    for cut in cuts {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(original.path(), copy.path());
        cut_log(copy.path(), cut);
        let survivors: Vec<_> = results
            .iter()
            .filter(|r| r.end_offset <= shards::CommitLogOffset(cut))
            .collect();
        run(|| async {
            let store = Store::open(config(copy.path(), FlushMode::Sync, SEGMENT))
                .await
                .unwrap();
            let expected_end = survivors.last().map_or(0, |r| r.end_offset.0);
            // The end is the last whole record, or the next segment start after a filler.
            let end = store.max_physical_offset();
            assert!(
                end == shards::CommitLogOffset(expected_end)
                    || (end % SEGMENT == 0
                        && end > shards::CommitLogOffset(expected_end)
                        && end <= shards::CommitLogOffset(cut)),
                "seed {seed:#x} cut {cut}: end {end}, expected {expected_end}"
            );
            for q in 0..2u32 {
                let expected = (0..survivors.len()).filter(|i| *i as u32 % 2 == q).count();
                let max = store.max_queue_offset("T", shards::QueueId(q));
                assert_eq!(
                    max,
                    shards::QueueOffset(expected as u64),
                    "seed {seed:#x} cut {cut} queue {q}"
                );
                let bodies = pull_all(&store, "T", q, 0).await;
                assert_eq!(bodies.len(), expected);
            }
            // Appends continue right after the recovered end, and survive another reopen.
            let next = append(&store, "T", 0, 999, 100, "t");
            assert_eq!(next.physical_offset, end);
            store.wait_durable(next.end_offset).await.unwrap();
            store.close().await.unwrap();
            let store = Store::open(config(copy.path(), FlushMode::Sync, SEGMENT))
                .await
                .unwrap();
            assert_eq!(store.max_physical_offset(), next.end_offset);
            let bodies = pull_all(&store, "T", 0, 0).await;
            assert_eq!(bodies.last().unwrap(), &body_of(999, 100));
            store.close().await.unwrap();
        });
    }
}

/// With more queues written than a synced checkpoint takes each second, light checkpoints
/// come between the synced ones: a crash recovers from the light one (a scan from near the
/// end), and after a restart of the machine (another boot: the light one no longer holds)
/// from the synced one.
#[test]
fn a_crash_recovers_from_the_light_checkpoint_and_a_reboot_from_the_synced_one() {
    if shards::store::boot_id().is_none() {
        println!("could not run: this machine names no boot (/proc/sys/kernel/random/boot_id)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    const QUEUES: u64 = 1_500; // past CHECKPOINT_DIRTY_FILES_FREE dirty files
    let light_path = dir.path().join("checkpoint.light");
    let (results, extra) = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let mut results = Vec::new();
        for i in 0..QUEUES {
            results.push(append(&store, &format!("T{i}"), 0, i, 300, "t"));
        }
        // The new queues' files are made off the shard, a batch at a time: once they are
        // all there, a second unit to each queue dirties them all at once.
        wait_until("queue files not made", 60, || {
            store.queues_awaiting_files() == 0
        })
        .await;
        for i in QUEUES..2 * QUEUES {
            results.push(append(&store, &format!("T{}", i - QUEUES), 0, i, 300, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        // A light checkpoint comes within a second; then more appends, until the crash finds
        // a light checkpoint at the end, newer than the synced one. (While few queue files
        // are dirty a synced checkpoint is due each second too, and one may come last.)
        wait_until("no light checkpoint", 10, || light_path.exists()).await;
        let offset_in = |path: &Path| -> u64 {
            let value: serde_json::Value =
                serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            value["commitlog_offset"].as_u64().unwrap()
        };
        let synced_path = dir.path().join("checkpoint");
        let mut extra = 2 * QUEUES;
        loop {
            for _ in 0..10 {
                results.push(append(&store, "T0", 0, extra, 300, "t"));
                extra += 1;
            }
            let end = results.last().unwrap().end_offset.0;
            store
                .wait_durable(results.last().unwrap().end_offset)
                .await
                .unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while offset_in(&light_path) < end && std::time::Instant::now() < deadline {
                shards::runtime::sleep(std::time::Duration::from_millis(20)).await;
            }
            let light = offset_in(&light_path);
            if light >= end && offset_in(&synced_path) < light {
                break;
            }
            assert!(
                extra < 2 * QUEUES + 100,
                "no light checkpoint newer than the synced one"
            );
        }
        drop(store); // a crash
        (results, extra)
    });
    let light: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&light_path).unwrap()).unwrap();
    let light_offset = light["commitlog_offset"].as_u64().unwrap();
    assert!(
        light_offset >= results[2 * QUEUES as usize - 1].end_offset.0,
        "{light}"
    );
    let synced: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoint")).unwrap()).unwrap();
    let synced_offset = synced["commitlog_offset"].as_u64().unwrap();
    assert!(synced_offset < light_offset, "{synced}");
    // Taken while new queues awaited their files, it is rebuilt from their first unit.
    let synced_from = synced["awaiting_from"]
        .as_u64()
        .map_or(synced_offset, |from| from.min(synced_offset));
    // The scan starts in the segment of the checkpoint it trusts.
    let check = |scan_from: u64| {
        run(|| async {
            let (store, summary) =
                open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
            assert_eq!(summary.scan_from, scan_from, "{summary:?}");
            for i in 0..QUEUES {
                let bodies = pull_all(&store, &format!("T{i}"), 0, 0).await;
                let mut expected = vec![body_of(i, 300), body_of(QUEUES + i, 300)];
                if i == 0 {
                    expected.extend((2 * QUEUES..extra).map(|j| body_of(j, 300)));
                }
                assert_eq!(bodies, expected, "queue T{i}");
            }
            drop(store); // a crash again: the checkpoints stay as recovery left them
        })
    };
    // A crash in this boot: the scan starts at the light checkpoint's segment.
    let synced_bytes = std::fs::read(dir.path().join("checkpoint")).unwrap();
    check(light_offset - light_offset % SEGMENT);
    // A restart of the machine: the light checkpoint names another boot, so the scan starts
    // at the synced checkpoint (taken before the second units) and writes those again. The
    // store just opened asked for a synced checkpoint at once: the machine restarts as if
    // before that one.
    std::fs::write(dir.path().join("checkpoint"), synced_bytes).unwrap();
    let mut light: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&light_path).unwrap()).unwrap();
    light["boot"] = serde_json::Value::from("another-boot");
    std::fs::write(&light_path, serde_json::to_vec(&light).unwrap()).unwrap();
    check(synced_from - synced_from % SEGMENT);
}

/// After a restart of the machine (a crash that leaves the synced checkpoint only), recovery
/// does not sync the queues its scan wrote: it writes a light checkpoint at the end, the
/// synced one stays, and the flusher takes a synced checkpoint (syncing the filesystem) as
/// soon as the store serves. A second restart of the machine before that one recovers from
/// the old synced checkpoint again; after it, from the new one.
#[test]
fn after_a_restart_of_the_machine_the_rebuilt_queues_are_synced_while_the_store_serves() {
    let Some(boot) = shards::store::boot_id() else {
        println!("could not run: this machine names no boot (/proc/sys/kernel/random/boot_id)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let synced_path = dir.path().join("checkpoint");
    let light_path = dir.path().join("checkpoint.light");
    let offset_of = |path: &Path| -> (u64, serde_json::Value) {
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        (value["commitlog_offset"].as_u64().unwrap(), value)
    };
    const QUEUES: u64 = 8;
    let (first_end, results) = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let mut results = Vec::new();
        for i in 0..100 {
            results.push(append(&store, &format!("T{}", i % QUEUES), 0, i, 300, "t"));
        }
        let first_end = results.last().unwrap().end_offset;
        store.wait_durable(first_end).await.unwrap();
        // A synced checkpoint at the first appends' end (a second apart with few queues).
        wait_until("no synced checkpoint", 10, || {
            synced_path.exists() && offset_of(&synced_path).0 >= first_end.0
        })
        .await;
        for i in 100..400 {
            results.push(append(&store, &format!("T{}", i % QUEUES), 0, i, 300, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        drop(store); // a crash
        (first_end.0, results)
    });
    let end = results.last().unwrap().end_offset.0;
    let expected = |queue: u64| -> Vec<Vec<u8>> {
        (0..400)
            .filter(|i| i % QUEUES == queue)
            .map(|i| body_of(i, 300))
            .collect()
    };
    // Each start is a restart of the machine: the light checkpoints no longer hold.
    let restart = |check_open: &dyn Fn(u64)| {
        let _ = std::fs::remove_file(&light_path);
        run(|| async {
            let (store, summary) =
                open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
            assert_eq!(summary.end, end, "{summary:?}");
            // Before the store has run anything: what recovery itself wrote.
            check_open(summary.scan_from);
            for queue in 0..QUEUES {
                let bodies = pull_all(&store, &format!("T{queue}"), 0, 0).await;
                assert_eq!(bodies, expected(queue), "queue T{queue}");
            }
            // The flusher's first synced checkpoint comes at once, at the end.
            wait_until("no synced checkpoint", 10, || {
                offset_of(&synced_path).0 >= end
            })
            .await;
            drop(store); // a crash again
        })
    };
    let old_synced = offset_of(&synced_path).0;
    assert!(old_synced >= first_end && old_synced < end, "{old_synced}");
    restart(&|scan_from| {
        assert!(scan_from <= old_synced, "{scan_from} > {old_synced}");
        // The queues came from the synced checkpoint's catalog and wait to be settled: no
        // checkpoint yet, the synced one is the old one.
        assert_eq!(offset_of(&synced_path).0, old_synced);
        assert!(!light_path.exists());
    });
    // Without the catalog (a start walks the queue directories) the rebuilt queues are not
    // synced by recovery either: the record at the end is a light one of this boot.
    let synced = offset_of(&synced_path).0;
    std::fs::remove_file(dir.path().join("consumequeue.catalog")).unwrap();
    restart(&|scan_from| {
        assert_eq!(scan_from, synced - synced % SEGMENT);
        let (light_offset, light) = offset_of(&light_path);
        assert_eq!(light_offset, end, "{light}");
        assert_eq!(light["boot"].as_str(), Some(boot), "{light}");
    });
    // The synced checkpoint the flusher took holds: the next restart scans from its segment.
    restart(&|scan_from| assert_eq!(scan_from, end - end % SEGMENT));
}

/// After a restart of the machine the queues come from the synced checkpoint's catalog,
/// touching no queue file before the store serves, and the units the queue files kept for
/// records the log lost are never counted: not by that start, not once new records lie where
/// those units point, not by a crash before the queues are settled (no checkpoint is written
/// until then), and not by a later start that walks the queue directories. Queues made after
/// the checkpoint (their files on disk, the catalog not listing them) are rebuilt or, when
/// the log lost all their records, stay empty.
#[test]
fn after_a_restart_of_the_machine_queues_come_from_the_synced_catalog_and_lost_units_stay_lost() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let synced_path = root.join("checkpoint");
    let synced = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&synced_path).unwrap()).unwrap()
    };
    const OLD: u64 = 6; // topics T0..T5, written before the synced checkpoint
    const NEW: u64 = 3; // topics N0..N2, made after it
    let topic_of = |i: u64| -> String {
        if i < 60 || !i.is_multiple_of(4) {
            format!("T{}", i % OLD)
        } else {
            // N0 before the cut below, N1 on both sides of it, N2 only after it.
            format!(
                "N{}",
                [i >= 90, i >= 150].into_iter().filter(|&b| b).count()
            )
        }
    };
    let (results, checkpointed) = run(|| async {
        let store = Store::open(config(root, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let mut results = Vec::new();
        for i in 0..60 {
            results.push(append(&store, &topic_of(i), 0, i, 300, "t"));
        }
        let first_end = results.last().unwrap().end_offset.0;
        store.wait_durable(results[59].end_offset).await.unwrap();
        wait_until("no synced checkpoint naming a catalog", 10, || {
            let record = synced();
            record["commitlog_offset"].as_u64().unwrap() >= first_end && record["catalog"].is_u64()
        })
        .await;
        let checkpointed = synced()["commitlog_offset"].as_u64().unwrap();
        for i in 60..180 {
            results.push(append(&store, &topic_of(i), 0, i, 300, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        wait_until("no files of the new queues", 10, || {
            store.queues_awaiting_files() == 0
        })
        .await;
        drop(store); // a crash
        (results, checkpointed)
    });
    // A power loss: the log keeps the records below `cut`, the queue files keep every unit
    // (the kernel wrote their pages), and the light checkpoint no longer holds.
    let kept = 110;
    let cut = results[kept].physical_offset.0;
    assert!(cut > checkpointed);
    cut_log(root, cut);
    let _ = std::fs::remove_file(root.join("checkpoint.light"));
    // A later file of T0/0 that cannot be removed (a directory): T0/0 cannot be settled.
    let blocker = root
        .join("consumequeue/T0/0")
        .join(format!("{:020}", 64 * 20));
    std::fs::create_dir(&blocker).unwrap();
    let topics: Vec<String> = (0..OLD)
        .map(|q| format!("T{q}"))
        .chain((0..NEW).map(|q| format!("N{q}")))
        .collect();
    let mut expected: std::collections::BTreeMap<String, Vec<Vec<u8>>> =
        topics.iter().map(|t| (t.clone(), Vec::new())).collect();
    for i in 0..kept as u64 {
        expected
            .get_mut(&topic_of(i))
            .unwrap()
            .push(body_of(i, 300));
    }
    // N2 lost all its records: its files stay on disk, with units of the lost ones.
    assert!(expected["N2"].is_empty());
    assert!(root.join("consumequeue/N2/0").exists());
    let check = |store: &Store, expected: &std::collections::BTreeMap<String, Vec<Vec<u8>>>| {
        let (store, expected) = (store.clone(), expected.clone());
        async move {
            for (topic, bodies) in &expected {
                assert_eq!(
                    &pull_all(&store, topic, 0, 0).await,
                    bodies,
                    "queue {topic}"
                );
                let max = store.max_queue_offset(topic, shards::QueueId(0)).0;
                assert_eq!(max, bodies.len() as u64, "max offset of queue {topic}");
            }
        }
    };
    // The start after the power loss, then sends whose records take the lost ones' place.
    // Not N2: its files stay as the power loss left them.
    let new_end = run(|| async {
        let (store, summary) = open_recovered(config(root, FlushMode::Sync, SEGMENT)).await;
        assert_eq!(summary.end, cut, "{summary:?}");
        assert!(summary.queues_from_catalog, "{summary:?}");
        check(&store, &expected).await;
        let mut last = None;
        for i in 1000..1040u64 {
            let topic = &topics[(i % 8) as usize];
            last = Some(append(&store, topic, 0, i, 300, "t"));
            expected.get_mut(topic).unwrap().push(body_of(i, 300));
        }
        let last = last.unwrap().end_offset;
        store.wait_durable(last).await.unwrap();
        check(&store, &expected).await;
        // T0/0 is not settled: no checkpoint is written meanwhile.
        shards::runtime::sleep(std::time::Duration::from_millis(1500)).await;
        assert_eq!(synced()["commitlog_offset"].as_u64(), Some(checkpointed));
        assert!(!root.join("checkpoint.light").exists());
        drop(store); // a crash before every queue was settled
        last.0
    });
    // A stop before every queue could be settled writes no clean checkpoint: the next start
    // recovers from the synced one and its catalog again.
    run(|| async {
        let (store, summary) = open_recovered(config(root, FlushMode::Sync, SEGMENT)).await;
        assert!(summary.queues_from_catalog, "{summary:?}");
        store.close().await.unwrap();
        assert_eq!(synced()["commitlog_offset"].as_u64(), Some(checkpointed));
        assert_eq!(synced()["clean"].as_bool(), Some(false));
    });
    // Again from the synced checkpoint and its catalog; then everything is settled.
    run(|| async {
        let (store, summary) = open_recovered(config(root, FlushMode::Sync, SEGMENT)).await;
        assert_eq!(summary.end, new_end, "{summary:?}");
        assert!(summary.queues_from_catalog, "{summary:?}");
        check(&store, &expected).await;
        std::fs::remove_dir(&blocker).unwrap();
        wait_until("no synced checkpoint after the settling", 10, || {
            synced()["commitlog_offset"].as_u64() >= Some(new_end)
        })
        .await;
        check(&store, &expected).await;
        drop(store); // a crash
    });
    // A stop right after a start from the synced catalog settles every queue first, then
    // writes its clean checkpoint and catalog.
    run(|| async {
        let (store, summary) = open_recovered(config(root, FlushMode::Sync, SEGMENT)).await;
        assert!(summary.queues_from_catalog, "{summary:?}");
        store.close().await.unwrap();
        let record = synced();
        assert_eq!(
            record["commitlog_offset"].as_u64(),
            Some(new_end),
            "{record}"
        );
        assert_eq!(record["clean"].as_bool(), Some(true), "{record}");
        assert!(record["catalog"].is_u64(), "{record}");
    });
    // A start that walks the directories and probes the queue files: every lost unit was
    // zeroed, or its queue left out, and none is counted.
    std::fs::remove_file(root.join("consumequeue.catalog")).unwrap();
    let _ = std::fs::remove_file(root.join("checkpoint.light"));
    run(|| async {
        let (store, summary) = open_recovered(config(root, FlushMode::Sync, SEGMENT)).await;
        assert_eq!(summary.end, new_end, "{summary:?}");
        assert!(!summary.queues_from_catalog, "{summary:?}");
        check(&store, &expected).await;
        store.close().await.unwrap();
    });
}

/// A checkpoint taken while queues created by appends awaited their files leaves them out
/// and records where their units start (`awaiting_from`): recovery scans from there and
/// rebuilds them, even when that is segments before the checkpoint's own.
#[test]
fn queues_left_out_of_a_checkpoint_while_their_files_were_made_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (a_count, b_offset) = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let b = append(&store, "B", 0, 0, 300, "t");
        let (mut last, mut i) = (b, 1);
        while last.end_offset.0 < 2 * SEGMENT + 1 {
            last = append(&store, "A", 0, i, 300, "t");
            i += 1;
        }
        store.wait_durable(last.end_offset).await.unwrap();
        store.close().await.unwrap();
        (i - 1, b.physical_offset.0)
    });
    // As a checkpoint taken while B awaited its file: B uncounted, B's files not made.
    let path = dir.path().join("checkpoint");
    let mut taken: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    taken["queues"].as_object_mut().unwrap().remove("B");
    let reopen = |checkpoint: &serde_json::Value| {
        let _ = std::fs::remove_dir_all(dir.path().join("consumequeue").join("B"));
        let _ = std::fs::remove_file(dir.path().join("checkpoint.light"));
        std::fs::write(&path, serde_json::to_vec(checkpoint).unwrap()).unwrap();
        run(|| async {
            let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
                .await
                .unwrap();
            let b = pull_all(&store, "B", 0, 0).await;
            let a = pull_all(&store, "A", 0, 0).await.len() as u64;
            store.close().await.unwrap();
            (b, a)
        })
    };
    // Without the mark the scan starts in the checkpoint's segment, past B's record.
    assert_eq!(reopen(&taken), (Vec::<Vec<u8>>::new(), a_count));
    taken["awaiting_from"] = serde_json::Value::from(b_offset);
    assert_eq!(reopen(&taken), (vec![body_of(0, 300)], a_count));
}

/// Names of the topic directories under `consumequeue/`.
fn queue_dirs(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join("consumequeue")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// New queues whose files a crash left unmade (here: none of the store's are there) are
/// rebuilt in memory: the store opens without making a file, serves them at once, and makes
/// their files afterwards, off the shard. A crash before that (a copy of the files taken
/// right after the open) rebuilds them again: the checkpoint recovery writes leaves them out
/// and marks where they start.
#[test]
fn new_queues_a_crash_left_without_files_open_at_once_and_get_their_files_later() {
    const TOPICS: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let expected = |t: u64| vec![body_of(t, 300), body_of(TOPICS + t, 300)];
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let mut last = None;
        for i in 0..2 * TOPICS {
            last = Some(append(&store, &format!("N{}", i % TOPICS), 0, i, 300, "t"));
        }
        store.wait_durable(last.unwrap().end_offset).await.unwrap();
        store.close().await.unwrap();
    });
    std::fs::remove_dir_all(dir.path().join("consumequeue")).unwrap();
    let crashed_copy = crashed.path().join("store");
    for (path, copy_to) in [(dir.path(), Some(&crashed_copy)), (&crashed_copy, None)] {
        run(|| async {
            let (store, summary) = open_recovered(config(path, FlushMode::Sync, SEGMENT)).await;
            assert_eq!(summary.scan_from, 0);
            // Nothing has run on the shard since the open: recovery made no queue's files.
            assert_eq!(queue_dirs(path), Vec::<String>::new());
            if let Some(copy_to) = copy_to {
                copy_dir(path, copy_to);
            }
            for t in 0..TOPICS {
                assert_eq!(pull_all(&store, &format!("N{t}"), 0, 0).await, expected(t));
            }
            assert_eq!(store.queues_awaiting_files(), TOPICS as usize);
            wait_until("files not made", 30, || store.queues_awaiting_files() == 0).await;
            assert_eq!(queue_dirs(path).len(), TOPICS as usize);
            store.close().await.unwrap();
        });
        // After a clean close every queue is read from its files.
        run(|| async {
            let (store, summary) = open_recovered(config(path, FlushMode::Sync, SEGMENT)).await;
            assert!(summary.clean);
            for t in 0..TOPICS {
                assert_eq!(pull_all(&store, &format!("N{t}"), 0, 0).await, expected(t));
            }
            store.close().await.unwrap();
        });
    }
}

/// Damage stepped over leaves a gap in a new queue's units, which only a file can hold:
/// recovery makes that queue's file at once and writes the units on both sides of the gap.
#[test]
fn a_gap_in_a_new_queues_units_gets_its_file_made_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let written = written_and_closed(dir.path(), "G", 3);
    // Unit 1's record is damaged (a body byte flipped), below what the checkpoint knew
    // durable; the queue's files are gone.
    flip_commitlog_byte(dir.path(), SEGMENT, written[1].physical_offset.0 + 200);
    std::fs::remove_dir_all(dir.path().join("consumequeue")).unwrap();
    run(|| async {
        let (store, summary) = open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
        assert_eq!(summary.damaged_regions, 1);
        // Made during recovery, with unit 0 and unit 2 in it.
        assert_eq!(queue_dirs(dir.path()), vec!["G".to_string()]);
        for (offset, i) in [(0, 0), (2, 2)] {
            let bodies = pulled_bodies(&store, "G", offset, 1).await;
            assert_eq!(bodies, vec![body_of(i, 300)], "offset {offset}");
        }
        store.close().await.unwrap();
    });
}

/// Appends `count` messages of 300 bytes (`body_of(i, 300)`) to `topic` 0 of a new store in
/// `dir`, makes them durable and closes the store.
fn written_and_closed(dir: &Path, topic: &str, count: u64) -> Vec<shards::store::AppendResult> {
    run(|| async {
        let store = Store::open(config(dir, FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let written: Vec<_> = (0..count)
            .map(|i| append(&store, topic, 0, i, 300, "t"))
            .collect();
        let last = written.last().expect("something written").end_offset;
        store.wait_durable(last).await.unwrap();
        store.close().await.unwrap();
        written
    })
}

/// Flips one byte of the commitlog on disk, at `offset` (segments of `segment` bytes).
fn flip_commitlog_byte(dir: &Path, segment: u64, offset: u64) {
    let (start, offset) = (offset / segment * segment, offset % segment);
    let segment = dir.join("commitlog").join(format!("{start:020}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, offset).unwrap();
    file.write_all_at(&[byte[0] ^ 0xff], offset).unwrap();
}

/// The bodies a pull of up to `count` messages from `offset` of `topic` 0 serves.
async fn pulled_bodies(store: &Store, topic: &str, offset: u64, count: u32) -> Vec<Vec<u8>> {
    let found = store
        .get_messages(
            topic,
            shards::QueueId(0),
            shards::QueueOffset(offset),
            count,
            1 << 20,
            &|_| true,
        )
        .await
        .unwrap();
    record::decode_all(&found.body)
        .unwrap()
        .iter()
        .map(|message| message.body.to_vec())
        .collect()
}

/// A record's BODYCRC is checked once per window read (pull.rs, `vet_records`): a record
/// damaged on disk is refused by every pull of its window, the first and those that find the
/// window cached, and the records around it are served.
#[test]
fn a_record_damaged_on_disk_is_refused_by_every_pull_of_its_window() {
    const BODY: usize = 4000;
    const SEGMENT: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        // 6 MiB in batches the flusher keeps up with: the first records leave the tail's
        // memory (it keeps 4 MiB) and pulls read them through windows.
        let mut written = Vec::new();
        for batch in 0..96u64 {
            for i in batch * 16..(batch + 1) * 16 {
                written.push(append(&store, "W", 0, i, BODY, "t"));
            }
            let last = written.last().unwrap().end_offset;
            store.wait_durable(last).await.unwrap();
        }
        flip_commitlog_byte(dir.path(), SEGMENT, written[3].physical_offset.0 + 300);
        let expected: Vec<Vec<u8>> = [0, 1, 2, 4, 5, 6, 7]
            .iter()
            .map(|i| body_of(*i, BODY))
            .collect();
        for pull in 1..=3 {
            assert_eq!(
                pulled_bodies(&store, "W", 0, 8).await,
                expected,
                "pull {pull}"
            );
            assert_eq!(
                store.stats().corrupt_records,
                pull,
                "refused again by pull {pull}"
            );
        }
        store.close().await.unwrap();
    });
}

/// The bodies of records in the tail's memory are not checked again when pulled, but only
/// those appended by this process: the part of the tail a restart read back from disk is
/// checked like any read from disk, and a record damaged there is refused.
#[test]
fn a_record_damaged_in_the_tail_read_back_at_a_restart_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let written = written_and_closed(dir.path(), "T", 5);
    flip_commitlog_byte(dir.path(), SEGMENT, written[1].physical_offset.0 + 200);
    run(|| async {
        let (store, _) = open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
        let later = append(&store, "T", 0, 5, 300, "t");
        store.wait_durable(later.end_offset).await.unwrap();
        let expected: Vec<Vec<u8>> = [0, 2, 3, 4, 5].iter().map(|i| body_of(*i, 300)).collect();
        assert_eq!(pulled_bodies(&store, "T", 0, 6).await, expected);
        assert_eq!(store.stats().corrupt_records, 1);
        store.close().await.unwrap();
    });
}

/// Every queue's offsets, units and bodies, in topic order: what a start found.
type Found = Vec<(String, u32, u64, u64, Vec<Vec<u8>>)>;

async fn found_in(store: &Store, queues: &[(String, u32)]) -> Found {
    let mut found = Vec::new();
    for (topic, queue_id) in queues {
        let id = shards::QueueId(*queue_id);
        let min = store.min_queue_offset(topic, id).0;
        let max = store.max_queue_offset(topic, id).0;
        let bodies = pull_all(store, topic, *queue_id, min).await;
        found.push((topic.clone(), *queue_id, min, max, bodies));
    }
    found
}

/// A clean stop lists every queue in `consumequeue.catalog`, and the next start takes the
/// queues from it instead of reading their directories: it finds what a walk of the
/// directories finds (units, minimums past retention, maximums, a queue over several files),
/// and removes the catalog before anything changes. A topic directory removed after the stop
/// makes the start walk instead; a crash after a start from the catalog recovers as any crash.
#[test]
fn a_clean_stop_lists_the_queues_and_the_next_start_reads_no_directory() {
    const TOPICS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("consumequeue.catalog");
    let mut queues: Vec<(String, u32)> = (0..TOPICS)
        .flat_map(|t| [(format!("T{t}"), 0), (format!("T{t}"), 1)])
        .collect();
    queues.push(("Long".to_string(), 0));
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        // Long/0 spans several files (64 units a file) and several segments, which retention
        // then deletes: its minimum moves past unit 0.
        let mut i = 400;
        for k in 0..i {
            append(&store, "Long", 0, k, 600, "t");
        }
        let mut last = None;
        for t in 0..TOPICS {
            for queue_id in std::iter::repeat_n(0, 1 + (t % 5) as usize).chain([1]) {
                last = Some(append(&store, &format!("T{t}"), queue_id, i, 300, "t"));
                i += 1;
            }
        }
        store.wait_durable(last.unwrap().end_offset).await.unwrap();
        wait_until("queue files not made", 30, || {
            store.queues_awaiting_files() == 0
        })
        .await;
        // Retention waits for a synced checkpoint that counts the segment's units.
        wait_until("no segment retention may delete", 30, || {
            store.oldest_sealed_segment().is_some()
        })
        .await;
        let oldest = store.oldest_sealed_segment().unwrap();
        store
            .delete_oldest_segment(oldest, false)
            .await
            .unwrap()
            .unwrap();
        assert!(store.min_queue_offset("Long", shards::QueueId(0)).0 > 0);
        store.close().await.unwrap();
    });
    assert!(catalog.exists());
    let open = |from_catalog: bool| -> Found {
        run(|| async {
            let (store, summary) =
                open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
            assert!(summary.clean, "{summary:?}");
            assert_eq!(summary.queues_from_catalog, from_catalog, "{summary:?}");
            // Gone once the store is open: its queue files may change from here on.
            assert!(!catalog.exists());
            let found = found_in(&store, &queues).await;
            store.close().await.unwrap();
            found
        })
    };
    let listed = open(true);
    assert_eq!(listed.len(), queues.len());
    assert!(listed.iter().all(|(_, _, _, max, _)| *max > 0));
    // The same data directory without the catalog: every directory read.
    std::fs::remove_file(&catalog).unwrap();
    let walked = open(false);
    assert_eq!(listed, walked);
    // The catalog that stop wrote, then the one a start from a catalog stopped with.
    assert_eq!(open(true), walked);
    assert_eq!(open(true), walked);
    // `shardmq verify` finds the catalog the start would take in step with the disk...
    let verified = shards::store::verify::verify_store(dir.path(), Some(SEGMENT)).unwrap();
    assert_eq!(verified.damage, 0, "{:?}", verified.findings);
    let takes = format!("the next start takes its {} queue(s)", queues.len());
    assert!(
        verified.notes.iter().any(|n| n.starts_with(&takes)),
        "{:?}",
        verified.notes
    );
    // ... and a queue directory removed by hand, which that start would not see, as damage.
    let queue_dir = dir.path().join("consumequeue").join("T5").join("1");
    std::fs::rename(&queue_dir, dir.path().join("T5-1")).unwrap();
    let verified = shards::store::verify::verify_store(dir.path(), Some(SEGMENT)).unwrap();
    assert_eq!(verified.damage, 1, "{:?}", verified.findings);
    assert!(
        verified.findings[0].contains("T5/1 listed, not on disk"),
        "{:?}",
        verified.findings
    );
    std::fs::rename(dir.path().join("T5-1"), &queue_dir).unwrap();
    // A queue directory the catalog does not list, whose units point past the log's end: what
    // a life before a power loss leaves for records the log lost. The start leaves it alone
    // (a queue made there again zeroes it), so verify notes it, not damage.
    let leftover = dir.path().join("consumequeue").join("T7").join("9");
    std::fs::create_dir_all(&leftover).unwrap();
    let units: Vec<u8> = (0..3u64)
        .flat_map(|k| {
            let physical = (verified.log_end + k * 300) as i64;
            [
                &physical.to_be_bytes()[..],
                &300i32.to_be_bytes(),
                &0i64.to_be_bytes(),
            ]
            .concat()
        })
        .collect();
    std::fs::write(leftover.join(format!("{:020}", 0)), units).unwrap();
    let verified = shards::store::verify::verify_store(dir.path(), Some(SEGMENT)).unwrap();
    assert_eq!(verified.damage, 0, "{:?}", verified.findings);
    let noted = "1 queue director(ies) not in consumequeue.catalog hold no unit";
    assert!(
        verified.notes.iter().any(|n| n.starts_with(noted)),
        "{:?}",
        verified.notes
    );
    std::fs::remove_dir_all(&leftover).unwrap();
    // A topic directory removed after the stop: the catalog no longer tells the disk, the
    // start reads the directories (and rebuilds the topic from the log).
    std::fs::remove_dir_all(dir.path().join("consumequeue").join("T3")).unwrap();
    assert_eq!(open(false), walked);

    // A crash after a start from the catalog: appends to listed and new queues since.
    let crashed = tempfile::tempdir().unwrap();
    let copy = crashed.path().join("store");
    run(|| async {
        let (store, summary) = open_recovered(config(dir.path(), FlushMode::Sync, SEGMENT)).await;
        assert!(summary.queues_from_catalog);
        append(&store, "T0", 0, 10_000, 300, "t");
        let last = append(&store, "New", 0, 10_001, 300, "t");
        store.wait_durable(last.end_offset).await.unwrap();
        copy_dir(dir.path(), &copy);
        store.close().await.unwrap();
    });
    run(|| async {
        let (store, summary) = open_recovered(config(&copy, FlushMode::Sync, SEGMENT)).await;
        assert!(
            !summary.clean && !summary.queues_from_catalog,
            "{summary:?}"
        );
        let mut expected = walked.clone();
        expected[0].3 += 1;
        expected[0].4.push(body_of(10_000, 300));
        assert_eq!(found_in(&store, &queues).await, expected);
        assert_eq!(
            pull_all(&store, "New", 0, 0).await,
            vec![body_of(10_001, 300)]
        );
        store.close().await.unwrap();
    });
}

/// `shardmq verify` reads a queue file up to the end of its data, not its whole sparse length
/// (2,400 near-empty queues took it 11-31 s of zero-filled pages), and still finds units never
/// written between written ones.
#[test]
fn verify_reads_a_queue_file_to_its_data_and_still_finds_a_hole_between_units() {
    const UNITS: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    run(|| async {
        let mut config = config(path, FlushMode::Sync, SEGMENT);
        config.consume_queue_units_per_file = shards::store::CONSUME_QUEUE_UNITS_PER_FILE_DEFAULT;
        let store = Store::open(config).await.unwrap();
        let mut last = None;
        for i in 0..UNITS {
            last = Some(append(&store, "T", 0, i, 100, "tag"));
        }
        store.wait_durable(last.unwrap().end_offset).await.unwrap();
        store.close().await.unwrap();
    });
    let queue_file = path.join("consumequeue/T/0").join(format!("{:020}", 0));
    let file = OpenOptions::new().write(true).open(&queue_file).unwrap();
    assert!(
        file.metadata().unwrap().len() > 1 << 20,
        "a long sparse file"
    );
    let report = shards::store::verify::verify_store(path, Some(SEGMENT)).unwrap();
    assert_eq!(report.damage, 0, "{:?}", report.findings);
    assert_eq!(report.units, UNITS);

    // The second page of units back to a hole, as if never written.
    use std::os::unix::io::AsRawFd;
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: a plain syscall on a descriptor held open for the call.
    assert_eq!(
        unsafe { libc::fallocate(file.as_raw_fd(), mode, 4096, 4096) },
        0
    );
    let report = shards::store::verify::verify_store(path, Some(SEGMENT)).unwrap();
    assert_eq!(report.damage, 1, "{:?}", report.findings);
    assert!(
        report.findings[0].contains("never written between written ones"),
        "{:?}",
        report.findings
    );
}
