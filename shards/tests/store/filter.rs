//! The two filter stages of a pull: tags code on the consume queue, then the record's
//! properties (RocketMQ's isMatchedByConsumeQueue / isMatchedByCommitLog).

use std::cell::Cell;

use crate::support::*;
use shards::store::{
    record, FlushMode, GetStatus, PullFilter, Store, PROPERTY_FILTER_READ_MAX_BYTES,
};

const SEGMENT: u64 = 1 << 20;

fn key_number(properties: &[u8]) -> u64 {
    let key = record::property(properties, "KEYS").expect("KEYS");
    std::str::from_utf8(&key[1..]).unwrap().parse().unwrap()
}

fn queue_offsets(body: &[u8]) -> Vec<u64> {
    record::decode_all(body)
        .unwrap()
        .iter()
        .map(|m| m.queue_offset)
        .collect()
}

#[test]
fn properties_stage_keeps_only_matching_records() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, SEGMENT))
            .await
            .unwrap();
        for i in 0..40 {
            let tag = if i % 2 == 0 { "Even" } else { "Odd" };
            append(&store, "T", 0, i, 100, tag);
        }
        let evaluated = Cell::new(0u32);
        let multiple_of_three = |properties: &[u8]| {
            evaluated.set(evaluated.get() + 1);
            key_number(properties).is_multiple_of(3)
        };
        let filter = PullFilter {
            tags_code: &|_| true,
            properties: Some(&multiple_of_three),
        };
        let found = store
            .get_messages_matching(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(1),
                32,
                1 << 20,
                &filter,
            )
            .await
            .unwrap();
        assert_eq!(found.status, GetStatus::Found);
        assert_eq!(
            queue_offsets(&found.body),
            (1..14).map(|k| 3 * k).collect::<Vec<_>>()
        );
        assert_eq!(found.message_count, 13);
        assert_eq!(found.next_begin_offset.0, shards::QueueOffset(40));
        assert_eq!(evaluated.get(), 39);

        // Both stages: the tags stage drops odd units before any record is read.
        let even = i64::from(record::java_string_hash("Even"));
        evaluated.set(0);
        let both = PullFilter {
            tags_code: &|code| code == even,
            properties: Some(&multiple_of_three),
        };
        let found = store
            .get_messages_matching(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(0),
                32,
                1 << 20,
                &both,
            )
            .await
            .unwrap();
        assert_eq!(queue_offsets(&found.body), vec![0, 6, 12, 18, 24, 30, 36]);
        assert_eq!(evaluated.get(), 20);

        // Batch limits count matching records only; once the batch is full the next unit
        // is not examined and next_begin_offset points at it (RocketMQ checks the batch
        // before filtering).
        let three = store
            .get_messages_matching(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(0),
                3,
                1 << 20,
                &filter,
            )
            .await
            .unwrap();
        assert_eq!(queue_offsets(&three.body), vec![0, 3, 6]);
        assert_eq!(three.next_begin_offset.0, shards::QueueOffset(7));

        // Nothing matches: NoMatchedMessage, and the scan goes on from past the window.
        let none = |_: &[u8]| false;
        let nothing = PullFilter {
            tags_code: &|_| true,
            properties: Some(&none),
        };
        let unmatched = store
            .get_messages_matching(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(5),
                32,
                1 << 20,
                &nothing,
            )
            .await
            .unwrap();
        assert_eq!(unmatched.status, GetStatus::NoMatchedMessage);
        assert_eq!(
            (unmatched.message_count, unmatched.next_begin_offset.0),
            (0, 40)
        );
        assert!(unmatched.body.is_empty());

        // The end of the queue answers as without a filter.
        let at_end = store
            .get_messages_matching(
                "T",
                shards::QueueId(0),
                shards::QueueOffset(40),
                32,
                1 << 20,
                &filter,
            )
            .await
            .unwrap();
        assert_eq!(at_end.status, GetStatus::OffsetOverflowOne);
        store.close().await.unwrap();
    });
}

#[test]
fn properties_stage_reads_a_bounded_amount_per_pull() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, 16 << 20))
            .await
            .unwrap();
        let record_bytes = 200 << 10;
        let count = 60u64;
        for i in 0..count {
            append(&store, "Big", 0, i, record_bytes, "T");
        }
        assert!(count * record_bytes as u64 > PROPERTY_FILTER_READ_MAX_BYTES);
        let evaluated = Cell::new(0u64);
        let only_last = |properties: &[u8]| {
            evaluated.set(evaluated.get() + 1);
            key_number(properties) == count - 1
        };
        let filter = PullFilter {
            tags_code: &|_| true,
            properties: Some(&only_last),
        };
        let first = store
            .get_messages_matching(
                "Big",
                shards::QueueId(0),
                shards::QueueOffset(0),
                32,
                1 << 20,
                &filter,
            )
            .await
            .unwrap();
        assert_eq!(first.status, GetStatus::NoMatchedMessage);
        let read = evaluated.get() * (record_bytes as u64);
        assert!(read <= PROPERTY_FILTER_READ_MAX_BYTES, "read {read} bytes");
        assert!(
            first.next_begin_offset.0 > (shards::QueueOffset(0)).0
                && first.next_begin_offset.0 < (shards::QueueOffset(count)).0
        );
        assert_eq!(
            first.next_begin_offset.0,
            shards::QueueOffset(evaluated.get())
        );
        // Going on from there finds the last record.
        let mut offset = first.next_begin_offset.0;
        let found = loop {
            let next = store
                .get_messages_matching(
                    "Big",
                    shards::QueueId(0),
                    shards::QueueOffset(offset),
                    32,
                    1 << 20,
                    &filter,
                )
                .await
                .unwrap();
            if next.status == GetStatus::Found {
                break next;
            }
            assert_eq!(next.status, GetStatus::NoMatchedMessage);
            assert!(next.next_begin_offset.0 > offset);
            offset = next.next_begin_offset.0;
        };
        assert_eq!(queue_offsets(&found.body), vec![count - 1]);
        assert_eq!(evaluated.get(), count);
        store.close().await.unwrap();
    });
}
