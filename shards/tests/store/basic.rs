//! Append, pull, decode: the store's data path on one executor.

use std::net::SocketAddr;

use crate::support::*;
use shards::store::{record, FlushMode, GetStatus, MessageToStore, Store, StoreError};

const SEGMENT: u64 = 1 << 20;

#[test]
fn appended_records_decode_to_what_was_stored() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let clock = manual_clock(1_700_000_000_000);
        let config = config(dir.path(), FlushMode::Sync, SEGMENT);
        let store = Store::open_with_clock(config, clock.clone()).await.unwrap();
        let mut results = Vec::new();
        for i in 0..10u64 {
            clock.0.set(1_700_000_000_000 + i as i64);
            results.push(append(&store, "TopicA", (i % 2) as u32, i, 100, "TagA"));
        }
        assert_eq!(results[0].physical_offset, shards::CommitLogOffset(0));
        for pair in results.windows(2) {
            assert_eq!(pair[0].end_offset, pair[1].physical_offset);
        }
        assert_eq!(
            store.max_queue_offset("TopicA", shards::QueueId(0)),
            shards::QueueOffset(5)
        );
        assert_eq!(
            store.max_queue_offset("TopicA", shards::QueueId(1)),
            shards::QueueOffset(5)
        );
        assert_eq!(
            store.max_queue_offset("TopicA", shards::QueueId(2)),
            shards::QueueOffset(0)
        );
        assert_eq!(store.queue_ids("TopicA"), vec![0, 1]);

        let found = store
            .get_messages(
                "TopicA",
                shards::QueueId(1),
                shards::QueueOffset(0),
                32,
                1 << 20,
                &|_| true,
            )
            .await
            .unwrap();
        assert_eq!(found.status, GetStatus::Found);
        assert_eq!((found.message_count, found.next_begin_offset.0), (5, 5));
        assert_eq!((found.min_offset.0, found.max_offset.0), (0, 5));
        let messages = record::decode_all(&found.body).unwrap();
        for (k, msg) in messages.iter().enumerate() {
            let i = 2 * k as u64 + 1;
            let appended = &results[i as usize];
            assert_eq!(msg.topic, "TopicA");
            assert_eq!(msg.queue_id, 1);
            assert_eq!(msg.queue_offset, k as u64);
            assert_eq!(msg.physical_offset, appended.physical_offset);
            assert_eq!(msg.total_size, appended.record_size_bytes);
            assert_eq!(msg.body, body_of(i, 100).as_slice());
            assert_eq!(
                msg.properties,
                properties("TagA", &format!("k{i}")).as_slice()
            );
            assert_eq!(msg.flag, 5);
            assert_eq!(msg.born_timestamp_ms, 1_000 + i as i64);
            assert_eq!(msg.store_timestamp_ms, 1_700_000_000_000 + i as i64);
            assert_eq!(msg.store_timestamp_ms, appended.store_timestamp_ms);
            assert_eq!(msg.born_host, BORN_HOST.parse::<SocketAddr>().unwrap());
            assert_eq!(msg.store_host, STORE_HOST.parse::<SocketAddr>().unwrap());
            assert_eq!(msg.body_crc, record::body_crc(msg.body));
        }
        store.close().await.unwrap();
    });
}

#[test]
fn pull_status_mapping() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, SEGMENT))
            .await
            .unwrap();
        let all = |_: i64| true;
        let empty = store
            .get_messages(
                "Nope",
                shards::QueueId(0),
                shards::QueueOffset(0),
                32,
                1 << 20,
                &all,
            )
            .await
            .unwrap();
        assert_eq!(
            (empty.status, empty.next_begin_offset.0),
            (GetStatus::NoMessageInQueue, 0)
        );
        let moved = store
            .get_messages(
                "Nope",
                shards::QueueId(0),
                shards::QueueOffset(7),
                32,
                1 << 20,
                &all,
            )
            .await
            .unwrap();
        assert_eq!(
            (moved.status, moved.next_begin_offset.0),
            (GetStatus::NoMessageInQueue, 0)
        );
        for i in 0..3 {
            append(&store, "T", 0, i, 10, "a");
        }
        let one = store
            .get_messages(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(3),
                32,
                1 << 20,
                &all,
            )
            .await
            .unwrap();
        assert_eq!(
            (one.status, one.next_begin_offset.0),
            (GetStatus::OffsetOverflowOne, 3)
        );
        let bad = store
            .get_messages(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(9),
                32,
                1 << 20,
                &all,
            )
            .await
            .unwrap();
        assert_eq!(
            (bad.status, bad.next_begin_offset.0),
            (GetStatus::OffsetOverflowBadly, 3)
        );
        let none = |_: i64| false;
        let unmatched = store
            .get_messages(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(1),
                32,
                1 << 20,
                &none,
            )
            .await
            .unwrap();
        assert_eq!(unmatched.status, GetStatus::NoMatchedMessage);
        assert_eq!(
            (unmatched.next_begin_offset.0, unmatched.message_count),
            (3, 0)
        );
        assert!(unmatched.body.is_empty());
        store.close().await.unwrap();
    });
}

#[test]
fn tag_filter_and_batch_limits() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, SEGMENT))
            .await
            .unwrap();
        let mut sizes = Vec::new();
        for i in 0..40 {
            let tag = if i % 4 == 0 { "Red" } else { "Blue" };
            sizes.push(append(&store, "T", 3, i, 200, tag).record_size_bytes);
        }
        let red = i64::from(record::java_string_hash("Red"));
        let only_red = move |code: i64| code == red;
        let found = store
            .get_messages(
                "T",
                shards::QueueId(3),
                shards::QueueOffset(1),
                32,
                1 << 20,
                &only_red,
            )
            .await
            .unwrap();
        assert_eq!(found.status, GetStatus::Found);
        assert_eq!(found.message_count, 9); // 4, 8, ..., 36
        assert_eq!(found.next_begin_offset.0, shards::QueueOffset(40));
        let offsets: Vec<u64> = record::decode_all(&found.body)
            .unwrap()
            .iter()
            .map(|m| m.queue_offset)
            .collect();
        assert_eq!(offsets, (1..10).map(|k| 4 * k).collect::<Vec<_>>());

        let all = |_: i64| true;
        let three = store
            .get_messages(
                "T",
                shards::QueueId(3),
                shards::QueueOffset(5),
                3,
                1 << 20,
                &all,
            )
            .await
            .unwrap();
        assert_eq!((three.message_count, three.next_begin_offset.0), (3, 8));
        let two = sizes[0] + sizes[1];
        let by_bytes = store
            .get_messages(
                "T",
                shards::QueueId(3),
                shards::QueueOffset(0),
                32,
                two + sizes[2] - 1,
                &all,
            )
            .await
            .unwrap();
        assert_eq!(
            (by_bytes.message_count, by_bytes.next_begin_offset.0),
            (2, 2)
        );
        assert_eq!(by_bytes.body.len(), two as usize);
        let first_always = store
            .get_messages("T", shards::QueueId(3), shards::QueueOffset(0), 32, 1, &all)
            .await
            .unwrap();
        assert_eq!(
            (first_always.message_count, first_always.next_begin_offset.0),
            (1, 1)
        );
        // Filtered units at the start of a full batch still count in next_begin_offset.
        let skip_then_full = store
            .get_messages(
                "T",
                shards::QueueId(3),
                shards::QueueOffset(1),
                1,
                1 << 20,
                &only_red,
            )
            .await
            .unwrap();
        assert_eq!(
            (
                skip_then_full.message_count,
                skip_then_full.next_begin_offset.0
            ),
            (1, 5)
        );
        store.close().await.unwrap();
    });
}

#[test]
fn read_record_by_offset_and_msg_id() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let config = config(dir.path(), FlushMode::Sync, SEGMENT);
        let host = config.store_host;
        let store = Store::open(config).await.unwrap();
        let a = append(&store, "T", 0, 1, 50, "x");
        let b = append(&store, "T", 0, 2, 50, "x");
        store.wait_durable(b.end_offset).await.unwrap();
        let id = record::offset_msg_id(host.into(), b.physical_offset.0);
        let (addr, offset) = record::parse_offset_msg_id(&id).unwrap();
        assert_eq!(addr, SocketAddr::V4(host));
        let bytes = store
            .read_record(shards::CommitLogOffset(offset))
            .await
            .unwrap()
            .expect("record at b");
        let msg = record::decode(&bytes).unwrap();
        assert_eq!(msg.body, body_of(2, 50).as_slice());
        assert_eq!(bytes.len() as u32, b.record_size_bytes);
        assert!(store
            .read_record(a.physical_offset + 1)
            .await
            .unwrap()
            .is_none());
        assert!(store.read_record(b.end_offset).await.unwrap().is_none());
        assert!(store
            .read_record(shards::CommitLogOffset(u64::MAX - 10))
            .await
            .unwrap()
            .is_none());
        store.close().await.unwrap();
    });
}

#[test]
fn offsets_by_store_time() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let clock = manual_clock(10_000);
        let config = config(dir.path(), FlushMode::Async, SEGMENT);
        let store = Store::open_with_clock(config, clock.clone()).await.unwrap();
        assert_eq!(
            store
                .earliest_store_time("T", shards::QueueId(0))
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            store
                .queue_offset_by_timestamp("T", shards::QueueId(0), 5, false)
                .await
                .unwrap(),
            shards::QueueOffset(0)
        );
        for i in 0..10 {
            clock.0.set(10_000 + 100 * i as i64); // stored at 10000, 10100, ... 10900
            append(&store, "T", 0, i, 10, "t");
        }
        assert_eq!(
            store
                .earliest_store_time("T", shards::QueueId(0))
                .await
                .unwrap(),
            Some(10_000)
        );
        let search =
            |ts, upper| store.queue_offset_by_timestamp("T", shards::QueueId(0), ts, upper);
        assert_eq!(search(10_250, false).await.unwrap(), shards::QueueOffset(3));
        assert_eq!(search(10_250, true).await.unwrap(), shards::QueueOffset(2));
        assert_eq!(search(10_300, false).await.unwrap(), shards::QueueOffset(3));
        assert_eq!(search(10_300, true).await.unwrap(), shards::QueueOffset(3));
        assert_eq!(search(1, false).await.unwrap(), shards::QueueOffset(0));
        assert_eq!(search(1, true).await.unwrap(), shards::QueueOffset(0));
        assert_eq!(
            search(99_999, false).await.unwrap(),
            shards::QueueOffset(10)
        );
        assert_eq!(search(99_999, true).await.unwrap(), shards::QueueOffset(9));
        // A clock that steps back never makes store times decrease.
        clock.0.set(5);
        let late = append(&store, "T", 0, 10, 10, "t");
        assert_eq!(late.store_timestamp_ms, 10_900);
        store.close().await.unwrap();
    });
}

#[test]
fn rejects_bad_input_and_deletes_topics() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, SEGMENT))
            .await
            .unwrap();
        let big = vec![0u8; shards::store::MESSAGE_SIZE_MAX_BYTES + 1];
        let props = vec![b'p'; shards::store::PROPERTIES_SIZE_MAX_BYTES + 1];
        let mut msg = MessageToStore {
            topic: "T",
            queue_id: 0,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: 0,
            born_host: BORN_HOST.parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: &big,
            properties: b"",
            tags_code: 0,
        };
        assert!(matches!(
            store.append(&msg),
            Err(StoreError::MessageTooLarge { .. })
        ));
        msg.body = b"ok";
        msg.properties = &props;
        assert!(matches!(
            store.append(&msg),
            Err(StoreError::PropertiesTooLarge { .. })
        ));
        msg.properties = b"";
        let long = "x".repeat(128);
        for bad in ["", "..", "a/b", long.as_str()] {
            msg.topic = bad;
            assert!(
                matches!(store.append(&msg), Err(StoreError::InvalidTopic(_))),
                "{bad:?}"
            );
        }
        append(&store, "Gone", 0, 0, 10, "t");
        append(&store, "Gone", 1, 1, 10, "t");
        assert_eq!(store.queue_ids("Gone"), vec![0, 1]);
        store.delete_topic("Gone");
        assert!(store.queue_ids("Gone").is_empty());
        assert_eq!(
            store.max_queue_offset("Gone", shards::QueueId(0)),
            shards::QueueOffset(0)
        );
        assert!(!dir.path().join("consumequeue").join("Gone").exists());
        store.close().await.unwrap();
        msg.topic = "T";
        assert!(matches!(store.append(&msg), Err(StoreError::Closed)));
    });
}
