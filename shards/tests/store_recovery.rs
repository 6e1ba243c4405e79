//! Recovery against damaged commitlog tails: cut the log at many points, reopen, check.

mod store_support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use shards::store::{FlushMode, Store};
use store_support::*;

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
    let results = run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, SEGMENT))
            .await
            .unwrap();
        let mut results = Vec::new();
        for i in 0..QUEUES {
            results.push(append(&store, &format!("T{i}"), 0, i, 300, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        // A light checkpoint comes a second after the store opened; then more appends.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !light_path.exists() {
            assert!(std::time::Instant::now() < deadline, "no light checkpoint");
            shards::runtime::sleep(std::time::Duration::from_millis(50)).await;
        }
        for i in QUEUES..QUEUES + 10 {
            results.push(append(&store, "T0", 0, i, 300, "t"));
        }
        store
            .wait_durable(results.last().unwrap().end_offset)
            .await
            .unwrap();
        drop(store); // a crash
        results
    });
    let light: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&light_path).unwrap()).unwrap();
    let light_offset = light["commitlog_offset"].as_u64().unwrap();
    assert!(
        light_offset >= results[QUEUES as usize - 1].end_offset.0,
        "{light}"
    );
    let synced: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoint")).unwrap()).unwrap();
    assert!(
        synced["commitlog_offset"].as_u64().unwrap() < light_offset,
        "{synced}"
    );
    let check = |expect_scan_from_above: Option<u64>| {
        let config = config(dir.path(), FlushMode::Sync, SEGMENT);
        let progress = config.progress.clone();
        run(|| async {
            let store = Store::open(config).await.unwrap();
            let summary = progress.recovered.get().unwrap();
            match expect_scan_from_above {
                Some(floor) => assert!(summary.scan_from >= floor, "{summary:?}"),
                None => assert_eq!(summary.scan_from, 0, "{summary:?}"),
            }
            for i in 0..QUEUES {
                let bodies = pull_all(&store, &format!("T{i}"), 0, 0).await;
                let mut expected = vec![body_of(i, 300)];
                if i == 0 {
                    expected.extend((QUEUES..QUEUES + 10).map(|j| body_of(j, 300)));
                }
                assert_eq!(bodies, expected, "queue T{i}");
            }
            drop(store); // a crash again: the checkpoints stay as recovery left them
        })
    };
    // A crash in this boot: the scan starts at the light checkpoint's segment.
    check(Some(light_offset - light_offset % SEGMENT));
    // A restart of the machine: the light checkpoint names another boot, so the scan starts
    // at the synced checkpoint (the store's start) and writes every unit again.
    let mut light: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&light_path).unwrap()).unwrap();
    light["boot"] = serde_json::Value::from("another-boot");
    std::fs::write(&light_path, serde_json::to_vec(&light).unwrap()).unwrap();
    check(None);
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
