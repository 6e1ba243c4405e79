//! Where a consumer group starts, and moving it, on the real binary with raw frames:
//! the answers the three consume-from-where modes need (QUERY_CONSUMER_OFFSET,
//! GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP), and INVOKE_BROKER_TO_RESET_OFFSET with
//! its RESET_CONSUMER_CLIENT_OFFSET push (fastjson form, to non-C++ consumers) and the pull
//! path that moves every consumer, C++ ones included.

use std::time::Duration;

use crate::common::*;
use shardmq::body::ResetOffsetBody;
use shardmq::remoting::{request_code as rc, response_code};

const PUSH_WAIT: Duration = Duration::from_secs(5);

fn now_ms() -> i64 {
    shardmq::error::now_ms()
}

/// Sends `count` messages to each of `queues`.
fn send_batch(client: &mut Client, topic: &str, queues: &[u32], count: usize) {
    for queue in queues {
        for _ in 0..count {
            let sent = send_with(client, topic, *queue, b"m", &[("k", "v")]);
            assert_eq!(sent.code, response_code::SUCCESS, "{:?}", sent.remark);
        }
    }
}

/// Two batches of three with a gap between them; returns (before both, between them).
fn two_batches(client: &mut Client, topic: &str, queues: &[u32]) -> (i64, i64) {
    let before = now_ms() - 1;
    send_batch(client, topic, queues, 3);
    std::thread::sleep(Duration::from_millis(30));
    let between = now_ms();
    std::thread::sleep(Duration::from_millis(30));
    send_batch(client, topic, queues, 3);
    (before, between)
}

fn offset_call(client: &mut Client, code: i32, ext: &[(&str, &str)]) -> Frame {
    let answer = client.call(code, ext, &[]);
    assert!(
        answer.code == response_code::SUCCESS || answer.code == response_code::QUERY_NOT_FOUND,
        "{code}: {answer:?}"
    );
    answer
}

fn search(client: &mut Client, topic: &str, timestamp: i64, boundary: &str) -> String {
    let timestamp = timestamp.to_string();
    let ext = [
        ("topic", topic),
        ("queueId", "0"),
        ("timestamp", timestamp.as_str()),
        ("boundaryType", boundary),
    ];
    offset_call(client, rc::SEARCH_OFFSET_BY_TIMESTAMP, &ext)
        .ext("offset")
        .to_string()
}

#[test]
fn consume_from_where_gets_what_each_mode_needs() {
    let node = Node::start();
    let mut broker = Client::connect(node.broker_port);
    let topic = "FromWhere";
    let (before, between) = two_batches(&mut broker, topic, &[0]);
    let query = |broker: &mut Client, queue: &str, zero_if_not_found: Option<&str>| {
        let mut ext = vec![
            ("consumerGroup", "fresh"),
            ("topic", topic),
            ("queueId", queue),
        ];
        if let Some(flag) = zero_if_not_found {
            ext.push(("setZeroIfNotFound", flag));
        }
        offset_call(broker, rc::QUERY_CONSUMER_OFFSET, &ext)
    };
    // A new group: "not found" (the client then applies its consume-from-where), except on a
    // young queue whose messages are all still there, or an empty one (as Java's broker), where
    // it starts at 0 and misses none of what comes.
    let young = query(&mut broker, "0", None);
    assert_eq!((young.code, young.ext("offset")), (0, "0"));
    let strict = query(&mut broker, "0", Some("false"));
    assert_eq!(strict.code, response_code::QUERY_NOT_FOUND);
    let empty = query(&mut broker, "1", None);
    assert_eq!((empty.code, empty.ext("offset")), (0, "0"));

    // CONSUME_FROM_LAST_OFFSET starts at the max offset, FIRST at the min (0).
    let queue = [("topic", topic), ("queueId", "0")];
    let max = offset_call(&mut broker, rc::GET_MAX_OFFSET, &queue);
    assert_eq!(max.ext("offset"), "6");
    let min = offset_call(&mut broker, rc::GET_MIN_OFFSET, &queue);
    assert_eq!(min.ext("offset"), "0");

    // CONSUME_FROM_TIMESTAMP: the first message stored at or after the time.
    assert_eq!(search(&mut broker, topic, before, "lower"), "0");
    assert_eq!(search(&mut broker, topic, between, "lower"), "3");
    assert_eq!(search(&mut broker, topic, between, "upper"), "2");
    assert_eq!(search(&mut broker, topic, now_ms() + 60_000, "lower"), "6");

    // Once the group commits, its offset is what it gets.
    let commit = broker.call(
        rc::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "fresh"),
            ("topic", topic),
            ("queueId", "0"),
            ("commitOffset", "4"),
        ],
        &[],
    );
    assert_eq!(commit.code, response_code::SUCCESS);
    assert_eq!(query(&mut broker, "0", Some("false")).ext("offset"), "4");
}

fn reset(client: &mut Client, topic: &str, group: &str, timestamp: i64, force: bool) -> Frame {
    let timestamp = timestamp.to_string();
    let force = force.to_string();
    let ext = [
        ("topic", topic),
        ("group", group),
        ("timestamp", timestamp.as_str()),
        ("isForce", force.as_str()),
    ];
    client.call(rc::INVOKE_BROKER_TO_RESET_OFFSET, &ext, &[])
}

/// The offsets of queues 0 and 1 in a reset table, and the broker names it names.
fn offsets_of(body: &[u8]) -> (Vec<i64>, Vec<String>) {
    let table = ResetOffsetBody::parse(body)
        .expect("reset body parses")
        .offset_table;
    let mut offsets = vec![-1; 2];
    let mut brokers = Vec::new();
    for (queue, offset) in table {
        if queue.queue_id < 2 {
            offsets[queue.queue_id as usize] = offset;
        }
        brokers.push(queue.broker_name);
    }
    (offsets, brokers)
}

fn committed(client: &mut Client, group: &str, topic: &str, queue: &str) -> String {
    let ext = [
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", queue),
    ];
    let answer = client.call(rc::QUERY_CONSUMER_OFFSET, &ext, &[]);
    assert_eq!(answer.code, response_code::SUCCESS, "{answer:?}");
    answer.ext("offset").to_string()
}

#[test]
fn reset_offset_moves_the_group_and_tells_its_consumers() {
    let node = Node::start();
    let topic = "ResetTopic";
    let mut admin = Client::connect(node.broker_port);
    let (before, between) = two_batches(&mut admin, topic, &[0, 1]);

    // Two live consumers of the group on shard 0: a Java one and a C++ one.
    let mut java = Client::connect(node.broker_port);
    let mut cpp = Client::connect(node.broker_port);
    heartbeat_as(&mut java, "JAVA", "java-1", "rg", topic, "*", "TAG");
    heartbeat_as(&mut cpp, "CPP", "cpp-1", "rg", topic, "*", "TAG");
    for queue in ["0", "1"] {
        let ext = [
            ("consumerGroup", "rg"),
            ("topic", topic),
            ("queueId", queue),
            ("commitOffset", "6"),
        ];
        assert_eq!(admin.call(rc::UPDATE_CONSUMER_OFFSET, &ext, &[]).code, 0);
    }

    let answer = reset(&mut admin, topic, "rg", between, false);
    assert_eq!(answer.code, response_code::SUCCESS, "{:?}", answer.remark);
    assert!(
        answer.body.starts_with(b"{\"offsetTable\":{{"),
        "fastjson form"
    );
    let (offsets, brokers) = offsets_of(&answer.body);
    assert_eq!(offsets, [3, 3]);
    assert!(brokers.iter().all(|b| b == "broker-0"), "{brokers:?}");
    assert_eq!(committed(&mut admin, "rg", topic, "0"), "3");
    assert_eq!(committed(&mut admin, "rg", topic, "1"), "3");

    // Each consumer is told, in the form its language reads.
    let to_java = java
        .wait_pushed(rc::RESET_CONSUMER_CLIENT_OFFSET, PUSH_WAIT)
        .expect("the Java consumer is told");
    assert_eq!(to_java.ext("topic"), topic);
    assert_eq!(to_java.ext("group"), "rg");
    assert_eq!(to_java.ext("timestamp"), between.to_string());
    assert_eq!(to_java.ext("isForce"), "false");
    assert!(to_java.body.starts_with(b"{\"offsetTable\":{{"));
    assert_eq!(offsets_of(&to_java.body).0, [3, 3]);
    // C++ consumers get no push (their client deadlocks on it, see src/broker/reset.rs):
    // their next pull moves them instead.
    assert!(cpp
        .wait_pushed(rc::RESET_CONSUMER_CLIENT_OFFSET, Duration::from_millis(300))
        .is_none());
    let pull_at = |client: &mut Client, queue: u32, offset: u64| {
        let given = Expression::Given {
            text: "*",
            kind: "TAG",
        };
        pull_with(
            client,
            rc::PULL_MESSAGE,
            ("rg", topic, queue),
            offset,
            given,
            0,
        )
    };
    let moved = pull_at(&mut cpp, 0, 6);
    assert_eq!(
        moved.code,
        response_code::PULL_RETRY_IMMEDIATELY,
        "{moved:?}"
    );
    assert_eq!(moved.ext("nextBeginOffset"), "3");
    assert!(moved.body.is_empty());
    // Once only: the group's next pull there is served as asked.
    let again = pull_at(&mut cpp, 0, 6);
    assert_eq!(again.code, response_code::PULL_NOT_FOUND);
    // A pull that already asks for the reset offset is served at once.
    let from_reset = pull_at(&mut cpp, 1, 3);
    assert_eq!(from_reset.code, response_code::SUCCESS);
    assert_eq!(from_reset.ext("nextBeginOffset"), "6");

    // A pull held at the end of a queue is answered as soon as the queue is reset.
    let port = node.broker_port;
    let held = std::thread::spawn(move || {
        let mut consumer = Client::connect(port);
        let given = Expression::Given {
            text: "*",
            kind: "TAG",
        };
        let started = std::time::Instant::now();
        let answer = pull_with(
            &mut consumer,
            rc::PULL_MESSAGE,
            ("rg", "ResetTopic", 0),
            6,
            given,
            10_000,
        );
        (answer, started.elapsed())
    });
    wait_for_parked_pulls(port, 1);
    let _ = reset(&mut admin, topic, "rg", before, true);
    let (answer, waited) = held.join().unwrap();
    assert_eq!(
        answer.code,
        response_code::PULL_RETRY_IMMEDIATELY,
        "{answer:?}"
    );
    assert_eq!(answer.ext("nextBeginOffset"), "0");
    assert!(waited < Duration::from_secs(3), "held {waited:?}");

    // Not forced, a queue only moves back; forced, it moves either way; -1 is the end.
    let back = reset(&mut admin, topic, "rg", before, false);
    assert_eq!(offsets_of(&back.body).0, [0, 0]);
    let not_forward = reset(&mut admin, topic, "rg", between, false);
    assert_eq!(offsets_of(&not_forward.body).0, [0, 0]);
    let forced = reset(&mut admin, topic, "rg", between, true);
    assert_eq!(offsets_of(&forced.body).0, [3, 3]);
    let to_end = reset(&mut admin, topic, "rg", -1, true);
    assert_eq!(offsets_of(&to_end.body).0, [6, 6]);
    assert_eq!(committed(&mut admin, "rg", topic, "1"), "6");

    // 5.x: one queue to an explicit offset.
    let one_queue = admin.call(
        rc::INVOKE_BROKER_TO_RESET_OFFSET,
        &[
            ("topic", topic),
            ("group", "rg"),
            ("timestamp", "0"),
            ("isForce", "true"),
            ("queueId", "1"),
            ("offset", "2"),
        ],
        &[],
    );
    let table = ResetOffsetBody::parse(&one_queue.body)
        .unwrap()
        .offset_table;
    assert_eq!(table.len(), 1);
    assert_eq!((table[0].0.queue_id, table[0].1), (1, 2));
    assert_eq!(committed(&mut admin, "rg", topic, "1"), "2");
    assert_eq!(committed(&mut admin, "rg", topic, "0"), "6");
    let out_of_range = admin.call(
        rc::INVOKE_BROKER_TO_RESET_OFFSET,
        &[
            ("topic", topic),
            ("group", "rg"),
            ("timestamp", "0"),
            ("isForce", "true"),
            ("queueId", "1"),
            ("offset", "99"),
        ],
        &[],
    );
    assert_eq!(out_of_range.code, response_code::SYSTEM_ERROR);
    assert!(
        out_of_range.remark().contains("[0-6]"),
        "{}",
        out_of_range.remark()
    );

    // A group nobody runs is reset too (it starts there later); unknown topics are refused.
    let offline = reset(&mut admin, topic, "nobody", before, false);
    assert_eq!(offline.code, response_code::SUCCESS);
    assert_eq!(committed(&mut admin, "nobody", topic, "0"), "0");
    let unknown = reset(&mut admin, "NoSuchTopic", "rg", before, true);
    assert_eq!(unknown.code, response_code::TOPIC_NOT_EXIST);

    // Every shard answers for its own queues (the admin asks each broker of the route).
    let mut shard1 = Client::connect(node.shard_port(1));
    let other = reset(&mut shard1, topic, "rg", before, true);
    assert_eq!(other.code, response_code::SUCCESS, "{:?}", other.remark);
    let (_, brokers) = offsets_of(&other.body);
    assert!(!brokers.is_empty() && brokers.iter().all(|b| b == "broker-1"));
}
