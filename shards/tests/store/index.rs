//! The message index: lookups by key and unique id, time ranges, collisions, its bound, and
//! what it keeps across a clean stop, a crash, a lost index and a cut commitlog.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::support::*;
use shards::store::{
    record, FlushMode, IndexConfig, MessageQuery, MessageToStore, Store, StoreConfig,
    INDEX_ENTRIES_PER_FILE_MIN,
};

const SEGMENT: u64 = 64 << 10;

fn index_config(dir: &Path) -> StoreConfig {
    let mut config = config(dir, FlushMode::Sync, SEGMENT);
    config.index = IndexConfig {
        slots_per_file: 64,
        entries_per_file: 1024,
        files_max: 8,
    };
    config
}

/// Appends a message with `KEYS` = `keys` and `UNIQ_KEY` = `unique`.
fn append_keyed(store: &Store, topic: &str, keys: &str, unique: &str) -> u64 {
    let props = format!("KEYS\u{1}{keys}\u{2}UNIQ_KEY\u{1}{unique}\u{2}");
    let body = format!("body of {unique}").into_bytes();
    let msg = MessageToStore {
        topic,
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp_ms: 1,
        born_host: BORN_HOST.parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: &body,
        properties: props.as_bytes(),
        tags_code: 0,
    };
    (store.append(&msg).expect("append").physical_offset).0
}

fn query<'a>(topic: &'a str, key: &'a str) -> MessageQuery<'a> {
    MessageQuery {
        topic,
        key,
        max_messages: 64,
        begin_timestamp_ms: 0,
        end_timestamp_ms: i64::MAX,
        unique_key: false,
    }
}

/// UNIQ_KEYs of the records a query answers, in answer order.
async fn found(store: &Store, query: &MessageQuery<'_>) -> Vec<String> {
    let result = store.query_messages(query).await.expect("query");
    let records = record::decode_all(&result.body).expect("query body decodes");
    assert_eq!(records.len() as u32, result.message_count);
    records
        .iter()
        .map(|m| {
            let unique = record::property(m.properties, "UNIQ_KEY").unwrap_or_default();
            String::from_utf8_lossy(unique).into_owned()
        })
        .collect()
}

#[test]
fn finds_by_key_unique_id_and_time_range() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let clock = manual_clock(10_000);
        let store = Store::open_with_clock(index_config(dir.path()), clock.clone())
            .await
            .unwrap();
        for i in 0..30 {
            clock.0.set(10_000 + i * 10);
            let keys = format!("order-{} shared  even-{}", i % 3, i % 2 == 0);
            append_keyed(&store, "Orders", &keys, &format!("U{i}"));
        }
        append_keyed(&store, "Other", "shared", "U-other");

        let newest_first: Vec<String> = (0..30).rev().map(|i| format!("U{i}")).collect();
        assert_eq!(
            found(&store, &query("Orders", "shared")).await,
            newest_first
        );
        assert_eq!(found(&store, &query("Other", "shared")).await, ["U-other"]);
        let order_one: Vec<String> = (0..30)
            .rev()
            .filter(|i| i % 3 == 1)
            .map(|i| format!("U{i}"))
            .collect();
        assert_eq!(found(&store, &query("Orders", "order-1")).await, order_one);
        assert_eq!(found(&store, &query("Orders", "U7")).await, ["U7"]);
        let unique = MessageQuery {
            unique_key: true,
            ..query("Orders", "U7")
        };
        assert_eq!(found(&store, &unique).await, ["U7"]);
        let not_unique = MessageQuery {
            unique_key: true,
            ..query("Orders", "order-1")
        };
        assert!(
            found(&store, &not_unique).await.is_empty(),
            "KEYS are not unique ids"
        );
        let ranged = MessageQuery {
            begin_timestamp_ms: 10_050,
            end_timestamp_ms: 10_080,
            ..query("Orders", "shared")
        };
        assert_eq!(found(&store, &ranged).await, ["U8", "U7", "U6", "U5"]);
        let few = MessageQuery {
            max_messages: 3,
            ..query("Orders", "shared")
        };
        assert_eq!(found(&store, &few).await, ["U29", "U28", "U27"]);
        assert!(found(&store, &query("Orders", "nope")).await.is_empty());
        assert!(found(&store, &query("Nope", "shared")).await.is_empty());
        let last = store.index_last_update();
        assert_eq!(last.timestamp_ms, 10_290);
        let other = store
            .query_messages(&query("Other", "U-other"))
            .await
            .unwrap();
        let other_size = other.body.len() as u64;
        assert_eq!(
            last.physical_offset,
            store.max_physical_offset().0 - other_size
        );
        store.close().await.unwrap();
    });
}

#[test]
fn hash_collisions_and_shared_slots_are_resolved_by_reading_records() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let mut config = index_config(dir.path());
        // One slot: every key shares one list.
        config.index.slots_per_file = 1;
        let store = Store::open(config).await.unwrap();
        // RocketMQ would file "A#B" + "C" and "A" + "B#C" under the same text, "A#B#C".
        append_keyed(&store, "A#B", "C", "U1");
        append_keyed(&store, "A", "B#C", "U2");
        for i in 0..20 {
            append_keyed(&store, "A", &format!("k{i}"), &format!("V{i}"));
        }
        assert_eq!(found(&store, &query("A", "B#C")).await, ["U2"]);
        assert_eq!(found(&store, &query("A#B", "C")).await, ["U1"]);
        assert_eq!(found(&store, &query("A", "k4")).await, ["V4"]);
        store.close().await.unwrap();
    });
}

#[test]
fn index_files_are_bounded_and_expire_with_segments() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let mut config = index_config(dir.path());
        config.index = IndexConfig {
            slots_per_file: 16,
            entries_per_file: INDEX_ENTRIES_PER_FILE_MIN,
            files_max: 3,
        };
        let store = Store::open(config).await.unwrap();
        let mut offsets = Vec::new();
        // Four keys each (UNIQ_KEY + three words): far more than three files hold.
        for i in 0..400 {
            offsets.push(append_keyed(
                &store,
                "T",
                &format!("a{i} b{i} all"),
                &format!("U{i}"),
            ));
        }
        assert_eq!(store.index_file_count(), 3);
        let files = std::fs::read_dir(dir.path().join("index")).unwrap().count();
        assert_eq!(files, 3, "dropped files are deleted");
        assert!(
            found(&store, &query("T", "U0")).await.is_empty(),
            "the oldest aged out"
        );
        assert_eq!(found(&store, &query("T", "U399")).await, ["U399"]);
        // Retention drops every file whose entries all point below the first offset kept.
        let removed = store.expire_index_below(offsets[399]).unwrap();
        assert_eq!(removed, 2);
        assert_eq!(found(&store, &query("T", "U399")).await, ["U399"]);
        store.close().await.unwrap();
    });
}

#[test]
fn survives_clean_stop_and_crash_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        for i in 0..50 {
            append_keyed(&store, "T", "k", &format!("U{i}"));
        }
        store.close().await.unwrap();
    });
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        assert_eq!(found(&store, &query("T", "k")).await.len(), 50);
        for i in 50..80 {
            append_keyed(&store, "T", "k", &format!("U{i}"));
        }
        let last = append_keyed(&store, "T", "k", "U80");
        store
            .wait_durable(shards::CommitLogOffset(last + 1))
            .await
            .unwrap();
        // Let a checkpoint cover some of it, then append more and crash (no close).
        shards::runtime::sleep(std::time::Duration::from_millis(1_200)).await;
        for i in 81..90 {
            append_keyed(&store, "T", "k", &format!("U{i}"));
        }
        let last = append_keyed(&store, "T", "k", "U90");
        store
            .wait_durable(shards::CommitLogOffset(last + 1))
            .await
            .unwrap();
        drop(store);
    });
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        let expected: Vec<String> = (27..=90).rev().map(|i| format!("U{i}")).collect();
        assert_eq!(found(&store, &query("T", "k")).await, expected);
        assert_eq!(found(&store, &query("T", "U85")).await, ["U85"]);
        append_keyed(&store, "T", "k", "U91");
        assert_eq!(found(&store, &query("T", "U91")).await, ["U91"]);
        store.close().await.unwrap();
    });
}

#[test]
fn lost_index_or_old_checkpoint_is_rebuilt_from_the_commitlog() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        for i in 0..40 {
            append_keyed(&store, "T", &format!("k{}", i % 4), &format!("U{i}"));
        }
        store.close().await.unwrap();
    });
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let reopen_and_check = || {
        run(|| async {
            let store = Store::open(index_config(dir.path())).await.unwrap();
            assert_eq!(found(&store, &query("T", "k2")).await.len(), 10);
            assert_eq!(found(&store, &query("T", "U39")).await, ["U39"]);
            store.close().await.unwrap();
        })
    };
    reopen_and_check();
    // A checkpoint written before the index existed has no mark: rebuilt, not duplicated.
    let path = dir.path().join("checkpoint");
    let mut checkpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    checkpoint.as_object_mut().unwrap().remove("index");
    std::fs::write(&path, serde_json::to_vec(&checkpoint).unwrap()).unwrap();
    reopen_and_check();
}

#[test]
fn a_cut_commitlog_cuts_the_index_too() {
    let dir = tempfile::tempdir().unwrap();
    let offsets = run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        let offsets: Vec<u64> = (0..60)
            .map(|i| append_keyed(&store, "T", "k", &format!("U{i}")))
            .collect();
        store.close().await.unwrap();
        offsets
    });
    // Damage the log from record 40 on: the index must forget records 40.. and take new ones.
    let cut = offsets[40] + 3;
    let segment = cut - cut % SEGMENT;
    let file = OpenOptions::new()
        .write(true)
        .open(dir.path().join("commitlog").join(format!("{segment:020}")))
        .unwrap();
    file.write_at(
        &vec![0u8; (segment + SEGMENT - cut) as usize],
        cut - segment,
    )
    .unwrap();
    for entry in std::fs::read_dir(dir.path().join("commitlog")).unwrap() {
        let entry = entry.unwrap();
        let start: u64 = entry.file_name().to_str().unwrap().parse().unwrap();
        if start > segment {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        let expected: Vec<String> = (0..40).rev().map(|i| format!("U{i}")).collect();
        assert_eq!(found(&store, &query("T", "k")).await, expected);
        let offset = append_keyed(&store, "T", "k", "NEW");
        assert_eq!(
            offset, offsets[40],
            "the new record takes the cut one's place"
        );
        assert_eq!(
            found(&store, &query("T", "U40")).await,
            Vec::<String>::new()
        );
        assert_eq!(found(&store, &query("T", "NEW")).await, ["NEW"]);
        store.close().await.unwrap();
    });
}

/// A figure, not an assertion: what indexing costs `append` (CPU only: no flush runs while the
/// loop appends). Run with `cargo test -p shards --release --test store_index -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn index_cost_per_append() {
    const APPENDS: u64 = 80_000;
    let slots: u32 = std::env::var("INDEX_SLOTS").map_or(1 << 17, |s| s.parse().unwrap());
    for keyed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        run(|| async {
            let mut config = config(dir.path(), FlushMode::Async, 64 << 20);
            config.flush_interval_ms = 60_000;
            config.consume_queue_units_per_file = APPENDS;
            config.index.slots_per_file = slots;
            let store = Store::open(config).await.unwrap();
            let body = vec![b'x'; 100];
            let started = std::time::Instant::now();
            for i in 0..APPENDS {
                let props = if keyed {
                    format!(
                        "KEYS\u{1}order-{i} user-{}\u{2}UNIQ_KEY\u{1}U{i:030}\u{2}",
                        i % 97
                    )
                } else {
                    format!("TAGS\u{1}t\u{2}OTHER\u{1}U{i:030}\u{2}")
                };
                let msg = MessageToStore {
                    topic: "Bench",
                    queue_id: (i % 8) as u32,
                    flag: 0,
                    sys_flag: 0,
                    born_timestamp_ms: 1,
                    born_host: BORN_HOST.parse().unwrap(),
                    reconsume_times: 0,
                    prepared_transaction_offset: 0,
                    body: &body,
                    properties: props.as_bytes(),
                    tags_code: 0,
                };
                store.append(&msg).expect("append");
            }
            let per_append_ns = started.elapsed().as_nanos() as f64 / APPENDS as f64;
            println!(
                "keyed {keyed}: {per_append_ns:.0} ns per append (3 index entries when keyed, \
                 {slots} slots)"
            );
            store.close().await.unwrap();
        });
    }
}

#[test]
fn a_damaged_index_never_panics_and_answers_only_real_records() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        for i in 0..40 {
            append_keyed(&store, "T", "k", &format!("U{i}"));
        }
        store.close().await.unwrap();
    });
    let index_file = std::fs::read_dir(dir.path().join("index"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Garbage over the slots and the first entries (the header stays readable).
    let file = OpenOptions::new().write(true).open(&index_file).unwrap();
    file.write_at(&[0xFF; 64 * 4 + 28 * 10], 64).unwrap();
    drop(file);
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        let answered = found(&store, &query("T", "k")).await;
        let real: Vec<String> = (0..40).map(|i| format!("U{i}")).collect();
        assert!(answered.iter().all(|u| real.contains(u)), "{answered:?}");
        append_keyed(&store, "T", "k", "NEW");
        assert_eq!(found(&store, &query("T", "NEW")).await, ["NEW"]);
        store.close().await.unwrap();
    });
    // A header that is not ours: the file goes, and the index is rebuilt from the commitlog.
    let file = OpenOptions::new().write(true).open(&index_file).unwrap();
    file.write_at(b"JUNK", 0).unwrap();
    drop(file);
    run(|| async {
        let store = Store::open(index_config(dir.path())).await.unwrap();
        assert_eq!(found(&store, &query("T", "k")).await.len(), 41);
        store.close().await.unwrap();
    });
}
