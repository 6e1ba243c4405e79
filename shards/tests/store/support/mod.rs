//! Helpers shared by the store tests: an executor per phase, configs, messages.
#![allow(dead_code)]

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddrV4;
use std::path::Path;
use std::rc::Rc;

use shards::store::{
    record, Clock, FlushMode, GetMessageResult, MessageToStore, RecoverySummary, Store, StoreConfig,
};

pub const STORE_HOST: &str = "10.1.2.3:10911";
pub const BORN_HOST: &str = "192.168.0.9:40000";

/// Runs `make()` to completion on a fresh executor on this thread.
pub fn run<F, Fut>(make: F) -> Fut::Output
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    shards::runtime::run_local(make)
}

/// Waits, looking every 20 ms, until `done` holds; fails the test with `what` after `secs`
/// seconds (work the store does behind the caller: files made, checkpoints written).
pub async fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} within {secs} s"
        );
        shards::runtime::sleep(std::time::Duration::from_millis(20)).await;
    }
}

pub fn config(dir: &Path, mode: FlushMode, segment_size_bytes: u64) -> StoreConfig {
    let host: SocketAddrV4 = STORE_HOST.parse().unwrap();
    let mut config = StoreConfig::new(dir.to_path_buf(), host);
    config.flush_mode = mode;
    config.segment_size_bytes = segment_size_bytes;
    config.flush_interval_ms = 20;
    config.consume_queue_units_per_file = 64;
    config
}

/// A clock tests move by hand.
#[derive(Default)]
pub struct ManualClock(pub Cell<i64>);

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}

/// Opens the store `config` describes, with what its recovery found.
pub async fn open_recovered(config: StoreConfig) -> (Store, RecoverySummary) {
    let progress = config.progress.clone();
    let store = Store::open(config).await.unwrap();
    let summary = progress
        .recovered
        .get()
        .expect("an open store has its recovery summary");
    (store, summary)
}

pub fn properties(tag: &str, key: &str) -> Vec<u8> {
    format!("TAGS\u{1}{tag}\u{2}KEYS\u{1}{key}\u{2}").into_bytes()
}

pub fn body_of(i: u64, len: usize) -> Vec<u8> {
    let mut body = format!("message-{i}-").into_bytes();
    body.resize(len.max(body.len()), b'a' + (i % 26) as u8);
    body
}

/// Appends one message whose body is `body_of(i, len)` and whose tag is `tag`.
pub fn append(
    store: &Store,
    topic: &str,
    queue_id: u32,
    i: u64,
    len: usize,
    tag: &str,
) -> shards::store::AppendResult {
    try_append(store, topic, queue_id, i, len, tag).expect("append")
}

/// `append`, with the store's refusal (busy, full) returned instead of a panic.
pub fn try_append(
    store: &Store,
    topic: &str,
    queue_id: u32,
    i: u64,
    len: usize,
    tag: &str,
) -> Result<shards::store::AppendResult, shards::store::StoreError> {
    let body = body_of(i, len);
    let props = properties(tag, &format!("k{i}"));
    let msg = MessageToStore {
        topic,
        queue_id,
        flag: 5,
        sys_flag: 0,
        born_timestamp_ms: 1_000 + i as i64,
        born_host: BORN_HOST.parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: &body,
        properties: &props,
        tags_code: i64::from(record::java_string_hash(tag)),
    };
    store.append(&msg)
}

/// One pull of a queue from `offset`: up to 32 records, 1 MiB, no filter.
pub async fn pull_batch(
    store: &Store,
    topic: &str,
    queue_id: u32,
    offset: u64,
) -> GetMessageResult {
    store
        .get_messages(
            topic,
            shards::QueueId(queue_id),
            shards::QueueOffset(offset),
            32,
            1 << 20,
            &|_| true,
        )
        .await
        .expect("get_messages")
}

/// Pulls everything of a queue from `offset`, in batches, returning the bodies in order.
pub async fn pull_all(store: &Store, topic: &str, queue_id: u32, offset: u64) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    let mut next = offset;
    loop {
        let found = pull_batch(store, topic, queue_id, next).await;
        if found.message_count == 0 {
            return bodies;
        }
        for msg in record::decode_all(&found.body).expect("decode pull body") {
            assert_eq!(msg.queue_offset, offset + bodies.len() as u64);
            bodies.push(msg.body.to_vec());
        }
        next = found.next_begin_offset.0;
    }
}

pub fn manual_clock(start_ms: i64) -> Rc<ManualClock> {
    Rc::new(ManualClock(Cell::new(start_ms)))
}
