//! The real binary on loopback, driven with raw remoting frames built by our codec: route
//! data, send, pull, offsets, and the bad-input answers, checked field by field.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use shardmq::remoting::{request_code as rc, response_code};

fn send_v2(stream: &mut TcpStream, topic: &str, queue: &str, body: &[u8], tag: &str) -> Frame {
    let properties = format!("TAGS\u{1}{tag}\u{2}KEYS\u{1}k-{tag}\u{2}");
    call(
        stream,
        rc::SEND_MESSAGE_V2,
        &[
            ("a", "pg"),
            ("b", topic),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", queue),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", &properties),
        ],
        body,
    )
}

/// PULL_MESSAGE for `queue` of `topic` from `offset`; with an expression the pull may be held
/// (sysFlag SUSPEND | SUBSCRIPTION, as the C++ client sends), without it it answers at once.
fn pull(
    stream: &mut TcpStream,
    (group, topic, queue): (&str, &str, &str),
    offset: &str,
    expression: Option<&str>,
    suspend_ms: &str,
) -> Frame {
    let mut ext = vec![
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", queue),
        ("queueOffset", offset),
        ("maxMsgNums", "32"),
        ("sysFlag", if expression.is_some() { "6" } else { "0" }),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", suspend_ms),
        ("subVersion", "0"),
    ];
    if let Some(expression) = expression {
        ext.push(("subscription", expression));
    }
    call(stream, rc::PULL_MESSAGE, &ext, &[])
}

#[test]
fn route_send_pull_and_offsets_on_the_real_binary() {
    let node = start_node(&[]);
    let mut namesrv = TcpStream::connect(("127.0.0.1", node.namesrv_port)).unwrap();
    let route = call(
        &mut namesrv,
        rc::GET_ROUTEINFO_BY_TOPIC,
        &[("topic", "TBW102")],
        &[],
    );
    assert_eq!(route.code, response_code::SUCCESS);
    let route_text = String::from_utf8(route.body).unwrap();
    assert!(
        route_text.contains(&format!("\"0\":\"127.0.0.1:{}\"", node.broker_port)),
        "{route_text}"
    );
    assert!(
        route_text.contains(&format!("\"0\":\"127.0.0.1:{}\"", node.broker_port + 10)),
        "{route_text}"
    );

    let mut broker = TcpStream::connect(("127.0.0.1", node.broker_port)).unwrap();
    let sent = send_v2(&mut broker, "RawTopic", "1", b"hello", "TagA");
    assert_eq!(sent.code, response_code::SUCCESS, "{:?}", sent.remark);
    assert_eq!(sent.ext("queueId"), "1");
    assert_eq!(sent.ext("queueOffset"), "0");
    assert_eq!(sent.ext("msgId").len(), 32);
    let sent = send_v2(&mut broker, "RawTopic", "1", b"world", "TagB");
    assert_eq!(sent.ext("queueOffset"), "1");

    let pulled = pull(&mut broker, ("cg", "RawTopic", "1"), "0", Some("*"), "1000");
    assert_eq!(pulled.code, response_code::SUCCESS, "{:?}", pulled.remark);
    assert_eq!(pulled.ext("nextBeginOffset"), "2");
    assert_eq!(pulled.ext("maxOffset"), "2");
    let records = shards::store::record::decode_all(&pulled.body).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].body, b"hello");
    assert_eq!(records[1].body, b"world");
    assert_eq!(records[1].queue_offset, 1);
    let filtered = pull(
        &mut broker,
        ("cg", "RawTopic", "1"),
        "0",
        Some("TagB"),
        "1000",
    );
    let records = shards::store::record::decode_all(&filtered.body).unwrap();
    assert_eq!(records.len(), 1, "tag filter");
    assert_eq!(records[0].body, b"world");

    // Long polling: a pull at the end waits, and a send wakes it at once.
    let started = Instant::now();
    let empty = pull(&mut broker, ("cg", "RawTopic", "1"), "2", Some("*"), "1000");
    assert_eq!(empty.code, response_code::PULL_NOT_FOUND);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "pull was not held"
    );

    let commit = call(
        &mut broker,
        rc::UPDATE_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "cg"),
            ("topic", "RawTopic"),
            ("queueId", "1"),
            ("commitOffset", "2"),
        ],
        &[],
    );
    assert_eq!(commit.code, response_code::SUCCESS);
    let offset = call(
        &mut broker,
        rc::QUERY_CONSUMER_OFFSET,
        &[
            ("consumerGroup", "cg"),
            ("topic", "RawTopic"),
            ("queueId", "1"),
        ],
        &[],
    );
    assert_eq!(offset.ext("offset"), "2");
    let max = call(
        &mut broker,
        rc::GET_MAX_OFFSET,
        &[("topic", "RawTopic"), ("queueId", "1")],
        &[],
    );
    assert_eq!(max.ext("offset"), "2");
}

#[test]
fn bad_input_gets_clear_answers_and_loses_nothing() {
    let node = start_node(&[]);
    let mut broker = TcpStream::connect(("127.0.0.1", node.broker_port)).unwrap();
    let unknown = call(&mut broker, 9999, &[], &[]);
    assert_eq!(unknown.code, response_code::REQUEST_CODE_NOT_SUPPORTED);
    assert!(unknown.remark.unwrap().contains("9999"));
    let bad_topic = send_v2(&mut broker, "bad topic!", "0", b"x", "T");
    assert_eq!(bad_topic.code, response_code::INVALID_PARAMETER);
    let ok = send_v2(&mut broker, "Kept", "0", b"kept", "T");
    assert_eq!(ok.code, response_code::SUCCESS);
    let huge = vec![b'x'; 4 * 1024 * 1024 + 1];
    let too_big = send_v2(&mut broker, "Kept", "0", &huge, "T");
    assert_eq!(too_big.code, response_code::MESSAGE_ILLEGAL);
    let missing = pull(&mut broker, ("g", "Nope", "0"), "0", None, "0");
    assert_eq!(missing.code, response_code::TOPIC_NOT_EXIST);
    let bad_queue = pull(&mut broker, ("g", "Kept", "99"), "0", None, "0");
    assert_eq!(bad_queue.code, response_code::INVALID_PARAMETER);

    // A huge length prefix closes that connection only.
    let mut hostile = TcpStream::connect(("127.0.0.1", node.broker_port)).unwrap();
    hostile
        .write_all(&[0x7F, 0xFF, 0xFF, 0xFF, 0, 0, 0, 2, b'{', b'}'])
        .unwrap();
    hostile
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        hostile.read(&mut byte).unwrap_or(0),
        0,
        "connection should be closed"
    );
    // Garbage JSON header likewise.
    let mut garbage = TcpStream::connect(("127.0.0.1", node.broker_port)).unwrap();
    garbage
        .write_all(&[0, 0, 0, 9, 0, 0, 0, 5, b'{', b'x', b'x', b'x', b'x'])
        .unwrap();
    garbage
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        garbage.read(&mut byte).unwrap_or(0),
        0,
        "connection should be closed"
    );

    let mut fresh = TcpStream::connect(("127.0.0.1", node.broker_port)).unwrap();
    let pulled = pull(&mut fresh, ("g", "Kept", "0"), "0", None, "0");
    assert_eq!(pulled.code, response_code::SUCCESS);
    let records = shards::store::record::decode_all(&pulled.body).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body, b"kept");
}

#[test]
fn broker_registers_with_a_separate_namesrv_process() {
    let ports = free_port_block();
    let dir = DataDir::fresh();
    let (namesrv_port, broker_port) = (ports.base, ports.base + 20);
    let mut namesrv = shardmq()
        .args([
            "namesrv",
            "--shards",
            "2",
            "--namesrv-port",
            &namesrv_port.to_string(),
        ])
        .arg("--data-dir")
        .arg(dir.join("namesrv"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&mut namesrv, "listening");
    let _namesrv = KillOnDrop(namesrv);
    let mut broker = shardmq()
        .args(["broker", "--shards", "2", "--segment-size-mib", "16"])
        .args(["--namesrv", &format!("127.0.0.1:{namesrv_port}")])
        .args([
            "--broker-port",
            &broker_port.to_string(),
            "--broker-name",
            "split",
        ])
        .arg("--data-dir")
        .arg(dir.join("broker"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&mut broker, "ready");
    let _broker = KillOnDrop(broker);
    // Every namesrv shard's replica knows both brokers: ask on several connections.
    // Registrations reach the replica that took them at once and the others over the mesh
    // within milliseconds: each connection (landing on any replica) sees both soon.
    for _ in 0..6 {
        let mut stream = TcpStream::connect(("127.0.0.1", namesrv_port)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let cluster = call(&mut stream, rc::GET_BROKER_CLUSTER_INFO, &[], &[]);
            let text = String::from_utf8(cluster.body).unwrap();
            if text.contains("\"split-0\"") && text.contains("\"split-1\"") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica never listed both brokers: {text}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let route = call(
            &mut stream,
            rc::GET_ROUTEINFO_BY_TOPIC,
            &[("topic", "TBW102")],
            &[],
        );
        assert_eq!(route.code, response_code::SUCCESS);
    }
}

#[test]
fn serve_accepts_a_relative_data_dir() {
    // `cargo run --release -- serve` uses the relative default `shardmq-data`.
    let ports = free_port_block();
    let base = ports.base;
    let dir = DataDir::fresh();
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = shardmq()
        .current_dir(dir.path())
        .args(["serve", "--shards", "2", "--segment-size-mib", "16"])
        .args([
            "--namesrv-port",
            &base.to_string(),
            "--broker-port",
            &(base + 20).to_string(),
        ])
        .args(["--data-dir", "shardmq-data"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&mut child, "shardmq: ready");
    let _child = KillOnDrop(child);
    assert!(dir.join("shardmq-data/shard-1/commitlog").is_dir());
}
