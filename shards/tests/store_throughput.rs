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
             {:.1} MiB zero-filled",
            stats.put_messages as f64 / seconds,
            stats.flushes,
            stats.messages_per_flush(),
            stats.zero_filled_bytes as f64 / (1 << 20) as f64
        );
        store.close().await.unwrap();
    });
}
