//! Transactions on the real binary, with raw frames and a fake producer connection that
//! heartbeats as a producer of its group and answers CHECK_TRANSACTION_STATE: commit visible
//! once (even when it arrives twice), rollback never visible, unknown → checked back →
//! committed, a restart still checks an undecided half (and only it), a half never answered
//! is discarded after `--transaction-check-max` checks and stays discarded across a restart.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use shardmq::remoting::{request_code as rc, response_code};
use shards::store::record;

const GROUP: &str = "TxGroup";
/// Check-back fast enough for tests: a half 300 ms old is checked, every 200 ms.
const FAST_CHECKS: [&str; 4] = [
    "--transaction-timeout-ms",
    "300",
    "--transaction-check-interval-ms",
    "200",
];

/// A producer connection of GROUP (heartbeat sent) on shard 0.
fn producer(node: &Node, client_id: &str) -> TcpStream {
    let mut stream = node.connect();
    let heartbeat = format!(
        "{{\"clientID\":\"{client_id}\",\"producerDataSet\":[{{\"groupName\":\"{GROUP}\"}}],\
         \"consumerDataSet\":[]}}"
    );
    let reply = call(&mut stream, rc::HEART_BEAT, &[], heartbeat.as_bytes());
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    stream
}

/// What END_TRANSACTION needs of a half send's answer.
struct Half {
    queue_offset: String,
    commitlog_offset: u64,
    offset_msg_id: String,
    unique_id: String,
}

fn send_half(
    stream: &mut TcpStream,
    (topic, queue): (&str, &str),
    body: &[u8],
    uniq: &str,
) -> Half {
    let properties = format!(
        "TRAN_MSG\u{1}true\u{2}PGROUP\u{1}{GROUP}\u{2}UNIQ_KEY\u{1}{uniq}\u{2}TAGS\u{1}TagT\u{2}"
    );
    let frame = send_v2_frame(9, (topic, queue), body, &properties, "4", GROUP);
    stream.write_all(&frame).unwrap();
    let reply = next_response(stream);
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    assert_eq!(reply.ext("transactionId"), uniq);
    assert_eq!(
        reply.ext("queueId"),
        queue,
        "the answer names the real queue"
    );
    let offset_msg_id = reply.ext("msgId").to_string();
    let (_, commitlog_offset) = record::parse_offset_msg_id(&offset_msg_id).unwrap();
    Half {
        queue_offset: reply.ext("queueOffset").to_string(),
        commitlog_offset,
        offset_msg_id,
        unique_id: uniq.to_string(),
    }
}

/// END_TRANSACTION as Go and C++ send it (no oneway bit, so the broker answers).
fn end_transaction(
    stream: &mut TcpStream,
    half: &Half,
    commit_or_rollback: &str,
    from_check: bool,
) {
    let commitlog_offset = half.commitlog_offset.to_string();
    let frame = request_frame(
        rc::END_TRANSACTION,
        77,
        &[
            ("producerGroup", GROUP),
            ("tranStateTableOffset", &half.queue_offset),
            ("commitLogOffset", &commitlog_offset),
            ("commitOrRollback", commit_or_rollback),
            (
                "fromTransactionCheck",
                if from_check { "true" } else { "false" },
            ),
            ("msgId", &half.unique_id),
            ("transactionId", &half.unique_id),
        ],
        &[],
    );
    stream.write_all(&frame).unwrap();
}

fn ended(stream: &mut TcpStream, half: &Half, commit_or_rollback: &str, from_check: bool) -> Frame {
    end_transaction(stream, half, commit_or_rollback, from_check);
    next_response(stream)
}

/// The next response on a producer connection (requests from the broker are skipped).
fn next_response(stream: &mut TcpStream) -> Frame {
    loop {
        let frame = read_frame(stream, Duration::from_secs(20)).expect("a response");
        if frame.is_response() {
            return frame;
        }
    }
}

/// CHECK_TRANSACTION_STATE requests the producer receives within `within`.
fn checks_within(stream: &mut TcpStream, within: Duration) -> Vec<Frame> {
    let deadline = Instant::now() + within;
    let mut checks = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match read_frame(stream, left.max(Duration::from_millis(1))) {
            Some(frame) if frame.code == rc::CHECK_TRANSACTION_STATE && !frame.is_response() => {
                checks.push(frame)
            }
            Some(_) => {}
            None => break,
        }
    }
    checks
}

/// The first check within `within`.
fn next_check(stream: &mut TcpStream, within: Duration) -> Frame {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = read_frame(stream, left.max(Duration::from_millis(1)))
            .expect("a CHECK_TRANSACTION_STATE in time");
        if frame.code == rc::CHECK_TRANSACTION_STATE && !frame.is_response() {
            return frame;
        }
    }
}

/// Bodies of the messages of (topic, queue) from offset 0 (a fresh consumer connection).
fn visible(node: &Node, topic: &str, queue: &str) -> Vec<Vec<u8>> {
    let mut consumer = node.connect();
    consumer
        .write_all(&pull_frame(3, ("TxConsumers", topic, queue), 0, None))
        .unwrap();
    let reply = read_frame(&mut consumer, Duration::from_secs(10)).expect("a pull answer");
    if reply.code == response_code::PULL_NOT_FOUND {
        return Vec::new();
    }
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    record::decode_all(&reply.body)
        .unwrap()
        .iter()
        .map(|m| m.body.to_vec())
        .collect()
}

#[test]
fn a_commit_is_visible_once_even_when_it_arrives_twice() {
    let node = start_node(&[]);
    let mut stream = producer(&node, "tx-commit");
    let half = send_half(&mut stream, ("TxCommit", "1"), b"order-1", "UNIQ-COMMIT-1");
    assert!(
        visible(&node, "TxCommit", "1").is_empty(),
        "a half message is invisible"
    );
    // It waits in the half topic (which RocketMQ, too, keeps as a system topic), with its
    // real destination in its properties and the transaction bits of its sysFlag cleared.
    let mut consumer = node.connect();
    let half_topic = ("TxConsumers", "RMQ_SYS_TRANS_HALF_TOPIC", "0");
    consumer
        .write_all(&pull_frame(4, half_topic, 0, None))
        .unwrap();
    let stored = read_frame(&mut consumer, Duration::from_secs(5)).unwrap();
    assert_eq!(stored.code, response_code::SUCCESS);
    let records = record::decode_all(&stored.body).unwrap();
    assert_eq!(records.len(), 1);
    let parked = &records[0];
    assert_eq!(parked.sys_flag & 0xC, 0);
    assert_eq!(parked.queue_offset.to_string(), half.queue_offset);
    assert_eq!(parked.physical_offset, half.commitlog_offset);
    let property = |key| record::property(parked.properties, key);
    assert_eq!(property("REAL_TOPIC"), Some(&b"TxCommit"[..]));
    assert_eq!(property("REAL_QID"), Some(&b"1"[..]));
    assert_eq!(property("__transactionId__"), Some(&b"UNIQ-COMMIT-1"[..]));

    let reply = ended(&mut stream, &half, "8", false);
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    let mut consumer = node.connect();
    consumer
        .write_all(&pull_frame(5, ("TxConsumers", "TxCommit", "1"), 0, None))
        .unwrap();
    let pulled = read_frame(&mut consumer, Duration::from_secs(5)).unwrap();
    assert_eq!(pulled.code, response_code::SUCCESS);
    let records = record::decode_all(&pulled.body).unwrap();
    assert_eq!(records.len(), 1);
    let message = &records[0];
    assert_eq!(
        (message.topic, message.queue_id, message.body),
        ("TxCommit", 1, &b"order-1"[..])
    );
    assert_eq!(message.sys_flag & 0xC, 0x8, "committed type");
    assert_eq!(
        message.prepared_transaction_offset as u64,
        half.commitlog_offset
    );
    let property = |key| record::property(message.properties, key);
    assert_eq!(
        property("UNIQ_KEY"),
        Some(&b"UNIQ-COMMIT-1"[..]),
        "same msgId for consumers"
    );
    assert_eq!(property("PGROUP"), Some(GROUP.as_bytes()));
    assert_eq!(property("TRAN_MSG"), None);
    assert_eq!(property("REAL_TOPIC"), None);
    assert_eq!(property("REAL_QID"), None);

    let again = ended(&mut stream, &half, "8", false);
    assert_eq!(
        again.code,
        response_code::SYSTEM_ERROR,
        "{:?}",
        again.remark
    );
    assert_eq!(visible(&node, "TxCommit", "1").len(), 1, "committed once");
    let mut watcher = node.connect();
    assert_eq!(runtime_info(&mut watcher, "transactionCommitted"), "1");
    assert_eq!(runtime_info(&mut watcher, "transactionHalfPending"), "0");
    let wrong_group = request_frame(
        rc::END_TRANSACTION,
        78,
        &[
            ("producerGroup", "Other"),
            ("tranStateTableOffset", "999"),
            ("commitLogOffset", "0"),
            ("commitOrRollback", "8"),
        ],
        &[],
    );
    stream.write_all(&wrong_group).unwrap();
    assert_eq!(next_response(&mut stream).code, response_code::SYSTEM_ERROR);
}

#[test]
fn a_rollback_is_never_visible_nor_checked() {
    let node = start_node(&FAST_CHECKS);
    let mut stream = producer(&node, "tx-rollback");
    let half = send_half(
        &mut stream,
        ("TxRollback", "0"),
        b"never",
        "UNIQ-ROLLBACK-1",
    );
    let reply = ended(&mut stream, &half, "12", false);
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    assert!(
        checks_within(&mut stream, Duration::from_millis(1_200)).is_empty(),
        "an ended half is never checked"
    );
    assert!(visible(&node, "TxRollback", "0").is_empty());
    let late_commit = ended(&mut stream, &half, "8", false);
    assert_eq!(late_commit.code, response_code::SYSTEM_ERROR);
    assert!(visible(&node, "TxRollback", "0").is_empty());
    assert_eq!(runtime_info(&mut stream, "transactionRolledBack"), "1");
}

#[test]
fn an_unknown_transaction_is_checked_back_and_committed() {
    let node = start_node(&FAST_CHECKS);
    let mut stream = producer(&node, "tx-unknown");
    let half = send_half(
        &mut stream,
        ("TxUnknown", "2"),
        b"checked",
        "UNIQ-UNKNOWN-1",
    );
    end_transaction(&mut stream, &half, "0", false);
    assert!(
        read_frame(&mut stream, Duration::from_millis(150)).is_none(),
        "UNKNOWN gets no answer"
    );
    let check = next_check(&mut stream, Duration::from_secs(5));
    assert_eq!(check.ext("tranStateTableOffset"), half.queue_offset);
    assert_eq!(
        check.ext("commitLogOffset"),
        half.commitlog_offset.to_string()
    );
    assert_eq!(check.ext("msgId"), "UNIQ-UNKNOWN-1");
    assert_eq!(check.ext("transactionId"), "UNIQ-UNKNOWN-1");
    assert_eq!(check.ext("offsetMsgId"), half.offset_msg_id);
    assert!(check.flag & 2 != 0, "sent oneway");
    let shown = record::decode(&check.body).unwrap();
    assert_eq!(
        (shown.topic, shown.queue_id, shown.body),
        ("TxUnknown", 2, &b"checked"[..])
    );
    assert_eq!(
        record::property(shown.properties, "PGROUP"),
        Some(GROUP.as_bytes())
    );
    assert!(
        visible(&node, "TxUnknown", "2").is_empty(),
        "not before the answer"
    );

    let reply = ended(&mut stream, &half, "8", true);
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    assert_eq!(visible(&node, "TxUnknown", "2"), vec![b"checked".to_vec()]);
    assert!(
        checks_within(&mut stream, Duration::from_millis(800)).is_empty(),
        "no check once ended"
    );
}

#[test]
fn a_restarted_broker_checks_its_undecided_half_and_only_it() {
    let mut node = start_node(&FAST_CHECKS);
    let mut stream = producer(&node, "tx-restart");
    let committed = send_half(&mut stream, ("TxRestart", "0"), b"committed", "UNIQ-R-1");
    assert_eq!(ended(&mut stream, &committed, "8", false).code, 0);
    let undecided = send_half(&mut stream, ("TxRestart", "0"), b"undecided", "UNIQ-R-2");
    // Killed at once (SIGKILL): no check round has run for the undecided half yet.
    node.kill();
    node.start_again();
    let mut stream = producer(&node, "tx-restart-2");
    let check = next_check(&mut stream, Duration::from_secs(5));
    assert_eq!(check.ext("tranStateTableOffset"), undecided.queue_offset);
    assert_eq!(check.ext("msgId"), "UNIQ-R-2");
    let reply = ended(&mut stream, &undecided, "8", true);
    assert_eq!(reply.code, response_code::SUCCESS, "{:?}", reply.remark);
    assert_eq!(
        visible(&node, "TxRestart", "0"),
        vec![b"committed".to_vec(), b"undecided".to_vec()],
        "each once"
    );
    assert!(checks_within(&mut stream, Duration::from_millis(800)).is_empty());
}

#[test]
fn a_half_never_answered_is_discarded_after_check_max_checks_for_good() {
    let mut args = FAST_CHECKS.to_vec();
    args.extend(["--transaction-check-max", "2"]);
    let mut node = start_node(&args);
    let mut stream = producer(&node, "tx-silent");
    let half = send_half(&mut stream, ("TxSilent", "0"), b"silent", "UNIQ-S-1");
    let first = next_check(&mut stream, Duration::from_secs(5));
    assert_eq!(first.ext("tranStateTableOffset"), half.queue_offset);
    // Stopped after the first check (a second one may go out while it stops): the count
    // survives the restart, so the checks before and after add up to transactionCheckMax.
    node.stop();
    let before = 1 + checks_within(&mut stream, Duration::from_millis(200)).len();
    node.start_again();
    let mut stream = producer(&node, "tx-silent-2");
    let after = checks_within(&mut stream, Duration::from_millis(2_500));
    assert_eq!(
        before + after.len(),
        2,
        "checked transactionCheckMax times in all"
    );
    assert!(after
        .iter()
        .all(|c| c.ext("tranStateTableOffset") == half.queue_offset));
    // Discarded (here, or already while the first node stopped).
    let mut watcher = node.connect();
    assert!(eventually(Duration::from_secs(3), || runtime_info(
        &mut watcher,
        "transactionHalfPending"
    ) == "0"));
    assert!(visible(&node, "TxSilent", "0").is_empty());
    drop(watcher);
    // Discarded for good: another restart does not bring it back.
    node.restart();
    let mut stream = producer(&node, "tx-silent-3");
    assert!(checks_within(&mut stream, Duration::from_millis(1_000)).is_empty());
    assert_eq!(runtime_info(&mut stream, "transactionHalfPending"), "0");
    assert!(visible(&node, "TxSilent", "0").is_empty());
}
