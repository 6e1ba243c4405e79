//! A figure, not an assertion: Sync-mode appends per second with many acks in flight.
//! Run with `cargo test --release -p shards --test store throughput:: -- --ignored --nocapture`.

use std::time::Instant;

use crate::support::*;
use shards::store::{FlushMode, MessageToStore, Store};

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
                shards::runtime::spawn(async move {
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
/// the runtime (glommio) on an idle shard, over space written before (compare with fio on the same disk).
#[test]
#[ignore]
fn dma_write_and_fdatasync_latency() {
    use shards::runtime::fs::DirectFile;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latency.dat");
    run(|| async move {
        let file = DirectFile::open(&path, true).await.unwrap();
        const PIECE: usize = 256 << 10;
        const PIECES: u64 = 256;
        for i in 0..PIECES {
            let buffer = file.alloc_buffer(PIECE);
            file.write_at(i * PIECE as u64, buffer).await.unwrap();
        }
        file.fdatasync().await.unwrap();
        let (mut writes, mut syncs) = (Vec::new(), Vec::new());
        for i in 0..PIECES {
            let mut buffer = file.alloc_buffer(PIECE);
            buffer.as_bytes_mut().fill(1);
            let started = Instant::now();
            file.write_at(i * PIECE as u64, buffer).await.unwrap();
            let written = Instant::now();
            file.fdatasync().await.unwrap();
            writes.push(written - started);
            syncs.push(written.elapsed());
        }
        writes.sort();
        syncs.sort();
        println!(
            "runtime 256 KiB O_DIRECT write p50 {:?}, fdatasync p50 {:?} (over written space)",
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
                Err(_) => shards::runtime::sleep(std::time::Duration::from_micros(100)).await,
            }
            if i % 64 == 0 {
                shards::runtime::yield_now().await;
            }
        }
        let last = store.stats().write_offset;
        store
            .wait_durable(shards::CommitLogOffset(last))
            .await
            .unwrap();
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

/// A figure, not an assertion: the durable write choices for a 128 KiB flush through a plain
/// io_uring ring, depth 1, p50/p90 over 2,000 writes each: a write then an fdatasync (separate
/// submissions), the two linked with a wake-up send after them (the old flush chain), and one
/// RWF_DSYNC write (what flushes use) -- over space written before and over space only
/// fallocated (what zero-fill ahead avoids).
#[test]
#[ignore]
fn durable_write_latency() {
    use io_uring::{opcode, squeue, types, IoUring};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    const LEN: usize = 128 << 10;
    const REGION: u64 = 256 << 20;
    let dir = tempfile::tempdir().unwrap();
    for fresh in [false, true] {
        let path = dir
            .path()
            .join(if fresh { "fallocated" } else { "written" });
        {
            let file = std::fs::File::create(&path).unwrap();
            if fresh {
                // SAFETY: fallocate on a file we own.
                assert_eq!(
                    unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 4 * REGION as i64) },
                    0
                );
            } else {
                use std::io::Write;
                let zeros = vec![0u8; 1 << 20];
                let mut file = file;
                for _ in 0..((4 * REGION) >> 20) {
                    file.write_all(&zeros).unwrap();
                }
            }
            std::fs::File::open(&path).unwrap().sync_all().unwrap();
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let fd = types::Fd(file.as_raw_fd());
        let layout = std::alloc::Layout::from_size_align(LEN, 4096).unwrap();
        // SAFETY: a non-zero size; freed below.
        let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
        let mut ring = IoUring::new(8).unwrap();
        let (wake_tx, _wake_rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let byte = [1u8];
        for (index, way) in [
            "write, then fdatasync",
            "write + fdatasync + wake linked",
            "RWF_DSYNC write",
        ]
        .iter()
        .enumerate()
        {
            let mut micros = Vec::new();
            let mut pos = index as u64 * REGION;
            for _ in 0..2000 {
                let started = Instant::now();
                let write = opcode::Write::new(fd, buffer, LEN as u32).offset(pos);
                let sync = || opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC);
                let steps: Vec<squeue::Entry> = match index {
                    0 => vec![write.build()],
                    1 => vec![
                        write.build().flags(squeue::Flags::IO_HARDLINK),
                        sync().build().flags(squeue::Flags::IO_HARDLINK),
                        opcode::Send::new(types::Fd(wake_tx.as_raw_fd()), byte.as_ptr(), 1)
                            .flags(libc::MSG_DONTWAIT)
                            .build(),
                    ],
                    _ => vec![write.rw_flags(libc::RWF_DSYNC).build()],
                };
                let mut rounds = vec![steps];
                if index == 0 {
                    rounds.push(vec![sync().build()]);
                }
                for steps in rounds {
                    let count = steps.len();
                    for step in &steps {
                        // SAFETY: the buffer and the byte outlive the wait below.
                        unsafe { ring.submission().push(step).unwrap() };
                    }
                    ring.submit_and_wait(count).unwrap();
                    for cqe in ring.completion() {
                        // The wake-up send may find the socket full (nobody reads it here).
                        assert!(
                            cqe.result() >= 0 || cqe.result() == -libc::EAGAIN,
                            "{way}: {}",
                            cqe.result()
                        );
                    }
                }
                micros.push(started.elapsed().as_micros() as u64);
                pos = index as u64 * REGION + (pos + LEN as u64) % REGION;
            }
            micros.sort_unstable();
            println!(
                "{way:32} over {} space: p50 {} µs, p90 {} µs",
                if fresh { "fallocated" } else { "written" },
                micros[micros.len() / 2],
                micros[micros.len() * 9 / 10]
            );
        }
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(buffer, layout) };
    }
}
