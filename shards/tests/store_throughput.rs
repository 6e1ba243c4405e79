//! A figure, not an assertion: Sync-mode appends per second with many acks in flight.
//! Run with `cargo test -p shards --test store_throughput -- --ignored --nocapture`.

mod store_support;

use std::time::Instant;

use shards::store::{FlushMode, MessageToStore, Store};
use store_support::*;

#[test]
#[ignore]
fn sync_appends_per_second_1kib() {
    let dir = tempfile::tempdir().unwrap();
    let (in_flight, per_task) = (256u64, 200u64);
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Sync, 256 << 20))
            .await
            .unwrap();
        let started = Instant::now();
        let tasks: Vec<_> = (0..in_flight)
            .map(|t| {
                let store = store.clone();
                glommio::spawn_local(async move {
                    for i in 0..per_task {
                        let end = append(&store, "Bench", (t % 8) as u32, i, 1024, "t").end_offset;
                        store.wait_durable(end).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let stats = store.stats();
        println!(
            "sync 1 KiB, {in_flight} in flight: {:.0} appends/s, {} flushes, {:.1} messages/flush, \
             {:.1} MiB zero-filled, per flush {:.0} µs from submission to reaping, \
             {:.0} µs a cycle",
            stats.put_messages as f64 / seconds,
            stats.flushes,
            stats.messages_per_flush(),
            stats.zero_filled_bytes as f64 / (1 << 20) as f64,
            stats.flush_micros as f64 / stats.flushes as f64,
            seconds * 1e6 / stats.flushes as f64,
        );
        store.close().await.unwrap();
    });
}

/// A figure, not an assertion: what one 256 KiB O_DIRECT write and one fdatasync cost through
/// glommio on an idle shard, over space written before (compare with fio on the same disk).
#[test]
#[ignore]
fn dma_write_and_fdatasync_latency() {
    use glommio::io::DmaFile;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latency.dat");
    run(|| async move {
        let file = DmaFile::create(&path).await.unwrap();
        const PIECE: usize = 256 << 10;
        const PIECES: u64 = 256;
        for i in 0..PIECES {
            let mut buffer = file.alloc_dma_buffer(PIECE);
            buffer.as_bytes_mut().fill(0);
            file.write_at(buffer, i * PIECE as u64).await.unwrap();
        }
        file.fdatasync().await.unwrap();
        let (mut writes, mut syncs) = (Vec::new(), Vec::new());
        for i in 0..PIECES {
            let mut buffer = file.alloc_dma_buffer(PIECE);
            buffer.as_bytes_mut().fill(1);
            let started = Instant::now();
            file.write_at(buffer, i * PIECE as u64).await.unwrap();
            let written = Instant::now();
            file.fdatasync().await.unwrap();
            writes.push(written - started);
            syncs.push(written.elapsed());
        }
        writes.sort();
        syncs.sort();
        println!(
            "glommio 256 KiB O_DIRECT write p50 {:?}, fdatasync p50 {:?} (over written space)",
            writes[writes.len() / 2],
            syncs[syncs.len() / 2]
        );
        file.close().await.unwrap();
    });
}

/// A figure, not an assertion: how fast the ASYNC flusher writes when appends of 16 KiB come
/// as fast as one task can make them (no network), next to the flush counters.
#[test]
#[ignore]
fn async_append_bandwidth_16kib() {
    let dir = tempfile::tempdir().unwrap();
    run(|| async {
        let store = Store::open(config(dir.path(), FlushMode::Async, 1 << 30))
            .await
            .unwrap();
        let started = Instant::now();
        let mut appended = 0u64;
        let body = body_of(0, 16 << 10);
        let props = properties("t", "k");
        for i in 0..(1u64 << 16) {
            let msg = MessageToStore {
                topic: "Bench",
                queue_id: (i % 8) as u32,
                flag: 0,
                sys_flag: 0,
                born_timestamp_ms: 1_000,
                born_host: BORN_HOST.parse().unwrap(),
                reconsume_times: 0,
                prepared_transaction_offset: 0,
                body: &body,
                properties: &props,
                tags_code: 0,
            };
            match store.append(&msg) {
                Ok(_) => appended += 1,
                // Busy: 32 MiB wait for the disk; let the flusher catch up.
                Err(_) => glommio::timer::sleep(std::time::Duration::from_micros(100)).await,
            }
            if i % 64 == 0 {
                glommio::yield_if_needed().await;
            }
        }
        let last = store.stats().write_offset;
        store.wait_durable(last).await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let stats = store.stats();
        println!(
            "async 16 KiB appends: {:.0} MB/s stored durably ({appended} appended), {} flushes, \
             flushes move {:.0} MB/s of their own time, {:.0}% of the run flushing",
            stats.put_bytes as f64 / seconds / 1e6,
            stats.flushes,
            stats.put_bytes as f64 / (stats.flush_micros as f64 / 1e6) / 1e6,
            100.0 * stats.flush_micros as f64 / 1e6 / seconds,
        );
        store.close().await.unwrap();
    });
}
