//! A figure, not an assertion: Sync-mode appends per second with many acks in flight.
//! Run with `cargo test -p shards --test store_throughput -- --ignored --nocapture`.

mod store_support;

use std::time::Instant;

use shards::store::{FlushMode, Store};
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
             {:.1} MiB zero-filled, per flush {:.0} µs writing and {:.0} µs in fdatasync, \
             {:.0} µs a cycle",
            stats.put_messages as f64 / seconds,
            stats.flushes,
            stats.messages_per_flush(),
            stats.zero_filled_bytes as f64 / (1 << 20) as f64,
            stats.flush_write_micros as f64 / stats.flushes as f64,
            stats.flush_sync_micros as f64 / stats.flushes as f64,
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
