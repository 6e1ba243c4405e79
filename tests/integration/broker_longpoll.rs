//! Long polling and overload on the real binary, with raw frames: a parked pull expires with
//! PULL_NOT_FOUND at its suspend timeout, a message wakes it at once, a closed connection
//! frees its parked pulls at once; a consumer that never reads costs bounded memory; a slow
//! disk and a stalled shard turn sends into quick SYSTEM_BUSY answers.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common::*;
use shardmq::remoting::response_code;

#[test]
fn a_parked_pull_expires_with_pull_not_found_at_its_suspend_timeout() {
    let node = start_node(&[]);
    let mut stream = node.connect();
    assert_eq!(send(&mut stream, "LpExpire", "0", b"m").code, 0);
    for suspend_ms in [300u64, 800] {
        let started = Instant::now();
        stream
            .write_all(&pull_frame(11, ("g", "LpExpire", "1"), 0, Some(suspend_ms)))
            .unwrap();
        let reply = read_frame(&mut stream, Duration::from_secs(10)).expect("an answer");
        let held = started.elapsed();
        assert_eq!(
            reply.code,
            response_code::PULL_NOT_FOUND,
            "{:?}",
            reply.remark
        );
        assert_eq!(reply.opaque, 11);
        assert!(
            held >= Duration::from_millis(suspend_ms - 20)
                && held < Duration::from_millis(suspend_ms + 1_500),
            "held {held:?} for a {suspend_ms} ms suspend timeout"
        );
    }
}

#[test]
fn a_message_wakes_its_parked_pull_at_once() {
    let node = start_node(&[]);
    let mut consumer = node.connect();
    let mut producer = node.connect();
    assert_eq!(send(&mut producer, "LpWake", "0", b"first").code, 0);
    consumer
        .write_all(&pull_frame(21, ("g", "LpWake", "2"), 0, Some(15_000)))
        .unwrap();
    assert!(
        read_frame(&mut consumer, Duration::from_millis(300)).is_none(),
        "the pull is held"
    );
    let sent_at = Instant::now();
    assert_eq!(send(&mut producer, "LpWake", "2", b"wake up").code, 0);
    let reply = read_frame(&mut consumer, Duration::from_secs(10)).expect("an answer");
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    assert!(
        sent_at.elapsed() < Duration::from_secs(2),
        "woken {:?} after the send, not at once",
        sent_at.elapsed()
    );
    let records = shards::store::record::decode_all(&reply.body).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body, b"wake up");
}

#[test]
fn a_closed_connection_frees_its_parked_pulls_at_once() {
    let node = start_node(&[]);
    let mut watcher = node.connect();
    assert_eq!(send(&mut watcher, "LpClose", "0", b"m").code, 0);
    let mut consumer = node.connect();
    // Each at the end of its queue: queue 0 holds one message, the others none.
    for (queue, offset) in [("0", 1), ("1", 0), ("2", 0), ("3", 0)] {
        consumer
            .write_all(&pull_frame(
                30,
                ("g", "LpClose", queue),
                offset,
                Some(20_000),
            ))
            .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(5), || runtime_info(
            &mut watcher,
            "parkedPulls"
        ) == "4"),
        "four pulls parked"
    );
    drop(consumer);
    let closed_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(2), || runtime_info(
            &mut watcher,
            "parkedPulls"
        ) == "0"),
        "parked pulls still held after the connection closed"
    );
    assert!(closed_at.elapsed() < Duration::from_secs(2));
    // Nothing was answered to the closed connection; the queue still serves new pulls.
    watcher
        .write_all(&pull_frame(31, ("g", "LpClose", "0"), 0, None))
        .unwrap();
    let reply = read_frame(&mut watcher, Duration::from_secs(5)).unwrap();
    assert_eq!(reply.code, response_code::SUCCESS);
}

/// A consumer that pipelines pulls and never reads their answers: the broker holds about its
/// connection's output cap (32 MiB) for it, twice over at most (the buffer being written and
/// the one filling) plus the answers being read, not one answer per pull (here 3,000 answers
/// of ~250 KiB, ~730 MiB). Measured: ~100 MiB of growth; ~200 MiB before pulls reserved
/// output room (they read the store while the connection's output was already full).
#[test]
fn a_consumer_that_never_reads_does_not_grow_the_broker() {
    const PULLS: usize = 3_000;
    let node = start_node(&[]);
    let mut producer = node.connect();
    // 8 MiB in the queue, so that its first messages are read from disk, not from the
    // in-memory tail: such pulls take a while, and many would be under way at once.
    let body = vec![b'x'; 8 * 1024];
    let mut sends = Vec::new();
    for opaque in 0..1024 {
        sends.extend_from_slice(&send_v2_frame(
            opaque,
            ("LpSlow", "0"),
            &body,
            "",
            "0",
            "pg",
        ));
    }
    producer.write_all(&sends).unwrap();
    let mut refused = 0;
    for _ in 0..1024 {
        let reply = read_frame(&mut producer, Duration::from_secs(20)).expect("send answered");
        // SYSTEM_BUSY is the overload answer on a loaded test machine: send those again.
        if reply.code == response_code::SYSTEM_BUSY {
            refused += 1;
            continue;
        }
        assert_eq!(reply.code, response_code::SUCCESS);
    }
    while refused > 0 {
        let frame = send_v2_frame(9_999, ("LpSlow", "0"), &body, "", "0", "pg");
        producer.write_all(&frame).unwrap();
        let reply = read_frame(&mut producer, Duration::from_secs(20)).expect("send answered");
        if reply.code == response_code::SUCCESS {
            refused -= 1;
        } else {
            assert_eq!(reply.code, response_code::SYSTEM_BUSY);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let rss_before_kib = node.rss_kib();
    let mut frames = Vec::new();
    for opaque in 0..PULLS as i32 {
        frames.extend_from_slice(&pull_frame(opaque, ("g", "LpSlow", "0"), 0, None));
    }
    let mut silent = node.connect();
    // The broker stops reading this connection once its output is full: write from a thread.
    let writer = std::thread::spawn(move || {
        let _ = silent.write_all(&frames);
        std::thread::sleep(Duration::from_secs(4));
        drop(silent);
    });
    let mut peak_kib = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        peak_kib = peak_kib.max(node.rss_kib());
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown_mib = peak_kib.saturating_sub(rss_before_kib) / 1024;
    eprintln!("broker RSS {rss_before_kib} KiB before, peak {peak_kib} KiB (+{grown_mib} MiB)");
    assert!(
        grown_mib < 150,
        "broker grew {grown_mib} MiB for a consumer that never reads"
    );
    // Other connections are served meanwhile.
    let mut other = node.connect();
    other
        .write_all(&pull_frame(5, ("g", "LpSlow", "0"), 31, None))
        .unwrap();
    let reply = read_frame(&mut other, Duration::from_secs(5)).expect("served");
    assert_eq!(reply.code, response_code::SUCCESS);
    writer.join().unwrap();
}

#[test]
fn a_slow_disk_turns_sends_into_quick_system_busy() {
    let node = start_node(&["--test-only-flush-delay-ms", "1500"]);
    let mut first = node.connect();
    let mut second = node.connect();
    first
        .write_all(&send_v2_frame(41, ("LpDisk", "0"), b"a", "", "0", "pg"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_150));
    let asked_at = Instant::now();
    let refused = send(&mut second, "LpDisk", "1", b"b");
    assert_eq!(
        refused.code,
        response_code::SYSTEM_BUSY,
        "{:?}",
        refused.remark
    );
    assert!(
        refused
            .remark
            .as_deref()
            .unwrap_or("")
            .contains("[PC_SYNCHRONIZED]"),
        "{:?}",
        refused.remark
    );
    assert!(
        asked_at.elapsed() < Duration::from_millis(500),
        "answered quickly"
    );
    let accepted = read_frame(&mut first, Duration::from_secs(10)).expect("first send answered");
    assert_eq!(accepted.code, response_code::SUCCESS);
    assert!(
        runtime_info(&mut second, "sendRefusedBusy")
            .parse::<u64>()
            .unwrap()
            >= 1
    );
}

#[test]
fn a_connection_refused_for_a_full_store_waits_for_the_disk_before_reading_more() {
    // Every flush first waits 100 ms: 48 pipelined 1 MiB sends fill the 32 MiB the store
    // keeps waiting for the disk long before the first flush lands.
    let node = start_node(&["--test-only-flush-delay-ms", "100"]);
    let mut stream = node.connect();
    let body = vec![b'x'; 1 << 20];
    let count = 48;
    let mut frames = Vec::new();
    for opaque in 0..count {
        frames.extend(send_v2_frame(
            1000 + opaque,
            ("LpFull", "0"),
            &body,
            "",
            "0",
            "pg",
        ));
    }
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&frames).unwrap());
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..count {
        let reply = read_frame(&mut stream, Duration::from_secs(30)).expect("an answer");
        codes.insert(reply.opaque, reply.code);
    }
    sender.join().unwrap();
    let refused: Vec<_> = codes
        .iter()
        .filter(|(_, code)| **code == response_code::SYSTEM_BUSY)
        .map(|(opaque, _)| opaque - 1000)
        .collect();
    assert!(!refused.is_empty(), "the store never filled up: {codes:?}");
    // Read and refused at once, the 16 sends past the bound would all be refused; the
    // connection instead stops reading until the disk has caught up.
    assert!(
        refused.len() <= 4,
        "only sends already read when the store filled are refused: {refused:?}"
    );
    assert_eq!(
        codes[&(1000 + count - 1)],
        response_code::SUCCESS,
        "the sends that came next were stored: {refused:?}"
    );
}

#[test]
fn a_stalled_shard_answers_the_sends_that_waited_with_system_busy() {
    let node = start_node(&[]);
    let mut stream = node.connect();
    assert_eq!(send(&mut stream, "LpStall", "0", b"before").code, 0);
    // SAFETY: signals to our own child.
    unsafe { libc::kill(node.pid(), libc::SIGSTOP) };
    assert!(
        eventually(Duration::from_secs(5), || every_thread_stopped(node.pid())),
        "the node did not stop"
    );
    stream
        .write_all(&send_v2_frame(
            51,
            ("LpStall", "0"),
            b"waited",
            "",
            "0",
            "pg",
        ))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(node.pid(), libc::SIGCONT) };
    let reply = read_frame(&mut stream, Duration::from_secs(10)).expect("an answer");
    assert_eq!(reply.code, response_code::SYSTEM_BUSY, "{:?}", reply.remark);
    assert!(
        reply
            .remark
            .as_deref()
            .unwrap_or("")
            .contains("[TIMEOUT_CLEAN_QUEUE]"),
        "{:?}",
        reply.remark
    );
    // Once the shard runs on time again, sends go through.
    assert!(eventually(Duration::from_secs(2), || send(
        &mut stream,
        "LpStall",
        "0",
        b"after"
    )
    .code
        == 0));
}

/// Whether every thread of process `pid` is stopped (state T in /proc).
fn every_thread_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}
