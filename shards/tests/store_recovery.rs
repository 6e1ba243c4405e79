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
