//! Real client bodies from `tests/golden/*.jsonl` through `shardmq::body`.
//!
//! Every HEART_BEAT request, REGISTER_BROKER request, successful GET_ROUTEINFO_BY_TOPIC
//! response and GET_CONSUMER_LIST_BY_GROUP response in the captures must parse, and the parsed
//! values must be the ones the clients meant (C++ ordinals and garbage tag codes included).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;
use shardmq::body::{
    java_string_hash, parse_consumer_id_list, perm, ConsumeFromWhere, ConsumeType, HeartbeatData,
    MessageModel, RegisterBrokerBody, SubscriptionData, TopicRouteData,
};

const TAG_A_CODE: i32 = 2598919;

/// One captured frame with its exact body bytes.
struct Frame {
    record: Value,
    body: Vec<u8>,
}

impl Frame {
    fn int(&self, key: &str) -> Option<i64> {
        self.record.get(key).and_then(Value::as_i64)
    }
    fn is_request(&self, code: i64) -> bool {
        self.record["type"] == "request" && self.int("code") == Some(code)
    }
    fn is_success_response_to(&self, request_code: i64) -> bool {
        self.record["type"] == "response"
            && self.int("code") == Some(0)
            && self.int("request_code") == Some(request_code)
    }
}

fn captures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn decode_hex(hex: &str) -> Vec<u8> {
    let digits = hex.as_bytes();
    assert!(digits.len().is_multiple_of(2), "odd hex length");
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).expect("hex is ASCII");
            u8::from_str_radix(text, 16).expect("hex digit")
        })
        .collect()
}

/// Frames of one capture file that carry a complete body.
fn frames(file: &str) -> Vec<Frame> {
    let path = captures_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str::<Value>(line).expect("capture line is JSON"))
        .filter(|record| record["event"] == "frame" && record["body_truncated"] != true)
        .map(|record| {
            let body = record["body_hex"]
                .as_str()
                .map(decode_hex)
                .unwrap_or_default();
            Frame { record, body }
        })
        .collect()
}

fn all_capture_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(captures_dir())
        .expect("captures directory")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".jsonl"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "expected the six capture files, found {files:?}"
    );
    files
}

fn heartbeats(file: &str) -> Vec<HeartbeatData> {
    frames(file)
        .iter()
        .filter(|frame| frame.is_request(34) && !frame.body.is_empty())
        .map(|frame| {
            let parsed = HeartbeatData::parse(&frame.body)
                .unwrap_or_else(|e| panic!("{file}: heartbeat {:?}: {e}", frame.record["seq"]));
            // What the shim forwarded (Java's shape) must mean exactly the same.
            if let Some(forwarded) = frame.record["shim"]["forwarded_body_text"].as_str() {
                assert_eq!(
                    HeartbeatData::parse(forwarded.as_bytes()).ok().as_ref(),
                    Some(&parsed)
                );
            }
            assert_eq!(
                HeartbeatData::parse(&parsed.encode()).ok().as_ref(),
                Some(&parsed)
            );
            parsed
        })
        .collect()
}

fn consumer_lists(file: &str) -> Vec<Vec<String>> {
    frames(file)
        .iter()
        .filter(|frame| frame.is_success_response_to(38))
        .map(|frame| parse_consumer_id_list(&frame.body).expect("consumer id list parses"))
        .collect()
}

fn assert_tag_a_subscription(subscription: &SubscriptionData, topic: &str) {
    assert_eq!(subscription.topic, topic);
    assert_eq!(subscription.sub_string, "TagA");
    assert_eq!(subscription.tags_set, vec!["TagA".to_string()]);
    assert_eq!(subscription.code_set, vec![TAG_A_CODE]);
    assert_eq!(subscription.expression_type, "TAG");
    assert!(!subscription.class_filter_mode);
}

fn assert_retry_subscription(subscription: &SubscriptionData, group: &str) {
    assert_eq!(subscription.topic, format!("%RETRY%{group}"));
    assert_eq!(subscription.sub_string, "*");
    assert!(subscription.tags_set.is_empty() && subscription.code_set.is_empty());
    assert_eq!(subscription.expression_type, "TAG");
}

fn find_subscription<'a>(
    heartbeat: &'a HeartbeatData,
    topic: &str,
) -> Option<&'a SubscriptionData> {
    heartbeat
        .consumers
        .iter()
        .flat_map(|c| &c.subscriptions)
        .find(|s| s.topic == topic)
}

#[test]
fn java_string_hash_known_values() {
    assert_eq!(java_string_hash("TagA"), TAG_A_CODE);
    assert_eq!(java_string_hash(""), 0);
    assert_eq!(java_string_hash("hello"), 99162322);
    // "中文": U+4E2D = 20013, U+6587 = 25991 → 20013 * 31 + 25991.
    assert_eq!(java_string_hash("中文"), 646394);
    // U+1F600 is the surrogate pair D83D DE00: 55357 * 31 + 56832.
    assert_eq!(java_string_hash("😀"), 1772899);
}

#[test]
fn cpp_heartbeats_take_ordinals_and_recompute_codes() {
    let file = "rocketmq-python-cpp.jsonl";
    let heartbeats = heartbeats(file);
    assert!(!heartbeats.is_empty());
    assert!(heartbeats
        .iter()
        .all(|h| h.client_id == "5947-127.0.0.1@DEFAULT"));
    assert!(heartbeats
        .iter()
        .any(|h| h.producer_groups == ["cap_py_cg_producer"]));
    let consumer_heartbeat = heartbeats
        .iter()
        .find(|h| !h.consumers.is_empty())
        .expect("consumer");
    let consumer = &consumer_heartbeat.consumers[0];
    assert_eq!(consumer.group_name, "cap_py_cg");
    assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
    assert_eq!(consumer.message_model, MessageModel::Clustering);
    assert_eq!(consumer.consume_from_where, ConsumeFromWhere::LastOffset);
    assert!(!consumer.unit_mode);
    assert_eq!(consumer.subscriptions.len(), 2);
    assert_retry_subscription(&consumer.subscriptions[0], "cap_py_cg");
    // The client sent "codeSet":[0]; the parsed code is the real hash.
    assert_tag_a_subscription(&consumer.subscriptions[1], "LabCapturePy");
    assert_eq!(consumer.subscriptions[1].sub_version, 1795948679746);
    assert_eq!(
        consumer_lists(file),
        vec![vec!["5947-127.0.0.1@DEFAULT".to_string()]]
    );
}

#[test]
fn ali_ons_heartbeats_default_expression_type() {
    let file = "ali-ons.jsonl";
    let heartbeats = heartbeats(file);
    assert_eq!(heartbeats.len(), 2);
    for heartbeat in &heartbeats {
        assert_eq!(heartbeat.client_id, "127.0.0.1@6239");
        assert!(heartbeat.producer_groups.is_empty());
        let consumer = &heartbeat.consumers[0];
        assert_eq!(consumer.group_name, "cap_ons_cg");
        assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
        assert_eq!(consumer.message_model, MessageModel::Clustering);
        assert_eq!(consumer.consume_from_where, ConsumeFromWhere::FirstOffset);
        assert_tag_a_subscription(&consumer.subscriptions[0], "LabCaptureOns");
        assert_eq!(consumer.subscriptions[0].sub_version, 1795948689289);
    }
    // The %RETRY% subscription only appears from the second heartbeat.
    assert!(find_subscription(&heartbeats[0], "%RETRY%cap_ons_cg").is_none());
    let retry = find_subscription(&heartbeats[1], "%RETRY%cap_ons_cg").expect("retry");
    assert_retry_subscription(retry, "cap_ons_cg");
    let lists = consumer_lists(file);
    assert_eq!(lists.len(), 3);
    assert!(lists.iter().all(|ids| ids == &["127.0.0.1@6239"]));
}

#[test]
fn rust_client_heartbeats_are_java_shaped() {
    let file = "rocketmq-client-rust.jsonl";
    let heartbeats = heartbeats(file);
    assert_eq!(heartbeats.len(), 5);
    assert!(heartbeats
        .iter()
        .all(|h| h.client_id.starts_with("192.0.2.2@6514#")));
    assert!(heartbeats
        .iter()
        .any(|h| h.producer_groups == ["CLIENT_INNER_PRODUCER", "cap_rust_cg_producer"]));
    let consumer_heartbeats: Vec<&HeartbeatData> = heartbeats
        .iter()
        .filter(|h| !h.consumers.is_empty())
        .collect();
    assert!(!consumer_heartbeats.is_empty());
    for heartbeat in &consumer_heartbeats {
        let consumer = &heartbeat.consumers[0];
        assert_eq!(consumer.group_name, "cap_rust_cg");
        assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
        assert_eq!(consumer.consume_from_where, ConsumeFromWhere::FirstOffset);
        assert_tag_a_subscription(
            find_subscription(heartbeat, "LabCaptureRust").expect("sub"),
            "LabCaptureRust",
        );
        assert_retry_subscription(
            find_subscription(heartbeat, "%RETRY%cap_rust_cg").expect("retry"),
            "cap_rust_cg",
        );
    }
    let consumer_ids: BTreeSet<&str> = consumer_heartbeats
        .iter()
        .map(|h| h.client_id.as_str())
        .collect();
    let lists = consumer_lists(file);
    assert_eq!(lists.len(), 2);
    for ids in &lists {
        assert_eq!(
            ids.iter().map(String::as_str).collect::<BTreeSet<_>>(),
            consumer_ids
        );
    }
}

#[test]
fn every_capture_body_parses() {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for file in all_capture_files() {
        for frame in frames(&file) {
            if frame.is_request(34) && !frame.body.is_empty() {
                HeartbeatData::parse(&frame.body).unwrap_or_else(|e| panic!("{file}: {e}"));
                *counts.entry("heartbeat").or_default() += 1;
            } else if frame.is_request(103) {
                RegisterBrokerBody::parse(&frame.body).unwrap_or_else(|e| panic!("{file}: {e}"));
                *counts.entry("register").or_default() += 1;
            } else if frame.is_success_response_to(105) {
                TopicRouteData::parse(&frame.body).unwrap_or_else(|e| panic!("{file}: {e}"));
                *counts.entry("route").or_default() += 1;
            } else if frame.is_success_response_to(38) {
                parse_consumer_id_list(&frame.body).unwrap_or_else(|e| panic!("{file}: {e}"));
                *counts.entry("consumer list").or_default() += 1;
            }
        }
    }
    let expected = BTreeMap::from([
        ("consumer list", 6),
        ("heartbeat", 10),
        ("register", 2),
        ("route", 14),
    ]);
    assert_eq!(counts, expected);
}

/// The topic each GET_ROUTEINFO_BY_TOPIC request asked for, by (connection, opaque).
fn route_request_topics(frames: &[Frame]) -> BTreeMap<(i64, i64), String> {
    frames
        .iter()
        .filter(|frame| frame.is_request(105))
        .filter_map(|frame| {
            let topic = frame.record["ext_fields"]["topic"].as_str()?;
            Some((
                (frame.int("conn")?, frame.int("opaque")?),
                topic.to_string(),
            ))
        })
        .collect()
}

/// Queue count and perm the capture's broker registered for a topic.
fn expected_queues(topic: &str) -> (u32, u32) {
    if topic.starts_with("LabCapture") {
        (4, perm::READ | perm::WRITE)
    } else if topic.starts_with("%RETRY%") {
        (1, perm::READ | perm::WRITE)
    } else {
        assert_eq!(topic, "TBW102");
        (8, perm::READ | perm::WRITE | perm::INHERIT)
    }
}

#[test]
fn route_responses_name_the_advertised_broker() {
    let mut seen = 0;
    for file in all_capture_files() {
        let frames = frames(&file);
        let topics = route_request_topics(&frames);
        for frame in frames.iter().filter(|f| f.is_success_response_to(105)) {
            let key = (
                frame.int("conn").unwrap_or(-1),
                frame.int("opaque").unwrap_or(-1),
            );
            let (queues, queue_perm) = expected_queues(&topics[&key]);
            let route = TopicRouteData::parse(&frame.body).expect("route parses");
            assert_eq!(route.order_topic_conf, None);
            assert_eq!(route.queue_datas.len(), 1);
            let queue = &route.queue_datas[0];
            assert_eq!(queue.broker_name, "broker-a");
            assert_eq!(
                (queue.read_queue_nums, queue.write_queue_nums),
                (queues, queues)
            );
            assert_eq!(queue.perm, queue_perm);
            assert_eq!(queue.topic_sys_flag, 0);
            assert_eq!(route.broker_datas.len(), 1);
            let broker = &route.broker_datas[0];
            assert_eq!(broker.cluster, "DefaultCluster");
            assert_eq!(broker.broker_name, "broker-a");
            assert_eq!(
                broker.broker_addrs,
                BTreeMap::from([(0, "127.0.0.3:10931".to_string())])
            );
            assert_eq!(broker.master_addr(), Some("127.0.0.3:10931"));
            assert!(!broker.enable_acting_master);
            let encoded = route.encode();
            assert!(!encoded.iter().any(u8::is_ascii_whitespace));
            assert_eq!(TopicRouteData::parse(&encoded).ok(), Some(route));
            seen += 1;
        }
    }
    assert_eq!(seen, 14);
}

#[test]
fn register_broker_bodies_carry_the_builtin_topics() {
    let registrations: Vec<RegisterBrokerBody> = frames("rocketmq-rust-broker-to-namesrv.jsonl")
        .iter()
        .filter(|frame| frame.is_request(103))
        .map(|frame| RegisterBrokerBody::parse(&frame.body).expect("register parses"))
        .collect();
    assert_eq!(registrations.len(), 2);
    for body in &registrations {
        assert!(body.filter_server_list.is_empty());
        let table = &body.topic_config_table;
        assert_eq!(
            (table.data_version.counter, table.data_version.timestamp),
            (0, 0)
        );
        let tbw = &table.topics["TBW102"];
        assert_eq!(
            (tbw.read_queue_nums, tbw.write_queue_nums, tbw.perm),
            (8, 8, 7)
        );
        assert!(perm::is_inherited(tbw.perm));
        let schedule = &table.topics["SCHEDULE_TOPIC_XXXX"];
        assert_eq!((schedule.read_queue_nums, schedule.perm), (18, 6));
        assert_eq!(table.topics["BenchmarkTest"].write_queue_nums, 1024);
        assert_eq!(table.topics["rmq_sys_SYNC_BROKER_MEMBER__broker-a"].perm, 1);
        for (name, config) in &table.topics {
            assert_eq!(&config.topic_name, name);
            assert_eq!(config.topic_filter_type, "SINGLE_TAG");
            assert!(!config.order && config.attributes.is_empty());
        }
        assert_eq!(
            RegisterBrokerBody::parse(&body.encode()).ok().as_ref(),
            Some(body)
        );
    }
    // Both registrations carry the same topic set (in different key orders on the wire).
    assert_eq!(registrations[0], registrations[1]);
}
