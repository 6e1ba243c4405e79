//! `shardmq admin` against the real binary: a node (`shardmq serve`, 2 shards) on free ports,
//! every command run as its own process with `--json`, its output parsed and checked against
//! what the test did to the node (sends, a consumer's heartbeat and commits).

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;
use shardmq::remoting::{request_code as rc, response_code};

/// Runs `shardmq admin <args> --json -n <namesrv>`.
fn admin(node: &Node, args: &[&str]) -> Output {
    shardmq()
        .arg("admin")
        .args(args)
        .args(["--json", "-n", &node.namesrv()])
        .output()
        .expect("run shardmq admin")
}

/// Runs an admin command without `--json`; returns its text (it must succeed).
fn admin_text(node: &Node, args: &[&str]) -> String {
    let output = shardmq()
        .arg("admin")
        .args(args)
        .args(["-n", &node.namesrv()])
        .output()
        .expect("run shardmq admin");
    assert!(output.status.success(), "{args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// Runs an admin command that must succeed; returns its JSON document.
fn admin_ok(node: &Node, args: &[&str]) -> Value {
    let output = admin(node, args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "shardmq admin {args:?} failed ({}):\nstdout: {stdout}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: bad JSON ({e}): {stdout}"))
}

/// Runs an admin command that must fail with exit status 1; returns its error text, after
/// checking the JSON error document and the stderr line agree.
fn admin_err(node: &Node, args: &[&str]) -> String {
    let output = admin(node, args);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{args:?} should fail: {output:?}"
    );
    let doc: Value = serde_json::from_slice(&output.stdout).expect("JSON error document");
    let error = doc["error"].as_str().expect("error text").to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&error), "stderr names the error: {stderr}");
    error
}

fn queues_of<'a>(doc: &'a Value, key: &str) -> &'a Vec<Value> {
    doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} array in {doc}"))
}

#[test]
fn cluster_topic_and_message_commands() {
    let node = Node::start();
    let clusters = admin_ok(&node, &["clusterList"]);
    let brokers = queues_of(&clusters["clusters"][0], "brokers");
    assert_eq!(clusters["clusters"][0]["name"], "DefaultCluster");
    assert_eq!(brokers.len(), 2);
    assert_eq!(brokers[0]["brokerName"], "broker-0");
    assert_eq!(brokers[1]["addr"], node.broker(1));
    assert!(brokers.iter().all(|b| b["reachable"] == true));
    let text = admin_text(&node, &["clusterList"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("#Cluster Name"), "{text}");
    let words: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(
        words[..4],
        ["DefaultCluster", "broker-1", "0", &node.broker(1)],
        "{text}"
    );
    assert_eq!(
        lines[1].find("broker-0"),
        lines[0].find("#Broker Name"),
        "aligned: {text}"
    );
    let status = admin_ok(&node, &["brokerStatus", "-b", &node.broker(0)]);
    assert_eq!(status["brokers"][0]["runtime"]["brokerActive"], "true");

    let created = admin_ok(
        &node,
        &["updateTopic", "-t", "AdminT", "-r", "2", "-w", "2"],
    );
    assert_eq!(queues_of(&created, "brokers").len(), 2);
    let topics = admin_ok(&node, &["topicList"]);
    assert!(queues_of(&topics, "topics").contains(&Value::from("AdminT")));
    let route = admin_ok(&node, &["topicRoute", "-t", "AdminT"]);
    let queue_datas = queues_of(&route, "queueDatas");
    assert_eq!(queue_datas.len(), 2);
    assert!(queue_datas.iter().all(|q| q["writeQueueNums"] == 2));

    // Three messages to broker-1 queue 1 (two share the key "order-7"), one to broker-0 queue 0.
    let mut sent = Vec::new();
    for (broker, queue, keys) in [
        ("broker-1", "1", "order-7 a"),
        ("broker-1", "1", "b"),
        ("broker-1", "1", "order-7 c"),
        ("broker-0", "0", "d"),
    ] {
        let body = format!("body of {keys}");
        let args = [
            "sendMessage",
            "-t",
            "AdminT",
            "-p",
            &body,
            "-k",
            keys,
            "-c",
            "TagA",
        ];
        let result = admin_ok(&node, &[&args[..], &["-b", broker, "-i", queue]].concat());
        assert_eq!(result["status"], "SEND_OK");
        assert_eq!(result["brokerName"], broker);
        assert_eq!(result["queueId"].to_string(), queue);
        sent.push(result);
    }
    assert_eq!(sent[2]["queueOffset"], 2);

    let stats = admin_ok(&node, &["topicStatus", "-t", "AdminT"]);
    let queues = queues_of(&stats, "queues");
    assert_eq!(queues.len(), 4);
    let max_offsets: Vec<i64> = queues
        .iter()
        .map(|q| q["maxOffset"].as_i64().unwrap())
        .collect();
    assert_eq!(
        max_offsets,
        [1, 0, 0, 3],
        "broker-0 q0, q1, broker-1 q0, q1"
    );
    assert!(queues[3]["lastUpdateTimestamp"].as_i64().unwrap() > 0);
    assert_eq!(queues[1]["lastUpdateTimestamp"], 0);

    let by_key = admin_ok(&node, &["queryMsgByKey", "-t", "AdminT", "-k", "order-7"]);
    let messages = queues_of(&by_key, "messages");
    let unique: Vec<&Value> = messages.iter().map(|m| &m["uniqKey"]).collect();
    assert_eq!(
        unique,
        [&sent[2]["msgId"], &sent[0]["msgId"]],
        "newest first"
    );
    assert_eq!(messages[0]["bodyPreview"], "body of order-7 c");
    assert_eq!(messages[0]["properties"]["TAGS"], "TagA");
    assert_eq!(messages[0]["queueOffset"], 2);
    let text = admin_text(&node, &["queryMsgByKey", "-t", "AdminT", "-k", "order-7"]);
    assert!(
        text.contains("Property TAGS") && text.contains("body of order-7 c"),
        "{text}"
    );
    let none = admin_ok(&node, &["queryMsgByKey", "-t", "AdminT", "-k", "order-8"]);
    assert!(queues_of(&none, "messages").is_empty());

    let offset_id = sent[3]["offsetMsgId"].as_str().unwrap();
    let by_offset_id = admin_ok(&node, &["queryMsgById", "-i", offset_id]);
    assert_eq!(by_offset_id["idKind"], "offsetMsgId");
    assert_eq!(by_offset_id["messages"][0]["keys"], "d");
    let unique_id = sent[1]["msgId"].as_str().unwrap();
    let by_unique_id = admin_ok(&node, &["queryMsgById", "-i", unique_id]);
    assert_eq!(by_unique_id["idKind"], "uniqKey");
    assert_eq!(by_unique_id["messages"][0]["keys"], "b");
    assert_eq!(by_unique_id["messages"][0]["msgId"], sent[1]["offsetMsgId"]);
    let by_unique_key = admin_ok(
        &node,
        &["queryMsgByUniqueKey", "-t", "AdminT", "-i", unique_id],
    );
    assert_eq!(by_unique_key["messages"].as_array().unwrap().len(), 1);
    let at = admin_ok(
        &node,
        &[
            "queryMsgByOffset",
            "-t",
            "AdminT",
            "-b",
            "broker-1",
            "-q",
            "1",
            "-o",
            "1",
        ],
    );
    assert_eq!(at["messages"][0]["uniqKey"], sent[1]["msgId"]);

    // Clear errors, exit status 1.
    let error = admin_err(&node, &["topicStatus", "-t", "NoSuchTopic"]);
    assert!(error.contains("unknown topic NoSuchTopic"), "{error}");
    let error = admin_err(
        &node,
        &["queryMsgByUniqueKey", "-t", "AdminT", "-i", "FFFF"],
    );
    assert!(error.contains("no message with unique key FFFF"), "{error}");
    let error = admin_err(
        &node,
        &[
            "queryMsgByOffset",
            "-t",
            "AdminT",
            "-b",
            "broker-1",
            "-q",
            "1",
            "-o",
            "9",
        ],
    );
    assert!(
        error.contains("no message at offset 9") && error.contains("max offset 3"),
        "{error}"
    );
    let error = admin_err(&node, &["updateTopic", "-t", "T", "-c", "NoCluster"]);
    assert!(error.contains("unknown cluster NoCluster"), "{error}");

    let deleted = admin_ok(&node, &["deleteTopic", "-t", "AdminT"]);
    assert_eq!(deleted["namesrv"], true);
    let error = admin_err(&node, &["topicRoute", "-t", "AdminT"]);
    assert!(error.contains("unknown topic AdminT"), "{error}");
}

#[test]
fn unreachable_namesrv_and_bad_arguments() {
    let output = shardmq()
        .args(["admin", "topicList", "--json", "-n", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&output.stdout).unwrap();
    let error = doc["error"].as_str().unwrap();
    assert!(
        error.contains("cannot reach the name server (127.0.0.1:1"),
        "{error}"
    );
    let output = shardmq().args(["admin", "topicStatus"]).output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "a missing --topic is a usage error"
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("--topic"));
}

/// A consumer as the broker sees one: a heartbeat on a connection kept open (the group is
/// online while it lasts) and offset commits.
fn heartbeat(client: &mut Client, group: &str, topic: &str) {
    let body = serde_json::json!({
        "clientID": "127.0.0.1@admin-test",
        "consumerDataSet": [{
            "groupName": group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "subscriptionDataSet": [{"topic": topic, "subString": "*"}],
        }],
    });
    let reply = client.call(rc::HEART_BEAT, &[], body.to_string().as_bytes());
    assert_eq!(reply.code, response_code::SUCCESS);
}

fn commit(addr: &str, group: &str, topic: &str, queue: u32, offset: i64) {
    let (queue, offset) = (queue.to_string(), offset.to_string());
    let ext = [
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", queue.as_str()),
        ("commitOffset", offset.as_str()),
    ];
    assert_eq!(
        Client::connect_to(addr)
            .call(rc::UPDATE_CONSUMER_OFFSET, &ext, &[])
            .code,
        response_code::SUCCESS
    );
}

fn send_to(node: &Node, topic: &str, broker: &str, queue: &str) {
    let args = [
        "sendMessage",
        "-t",
        topic,
        "-p",
        "x",
        "-b",
        broker,
        "-i",
        queue,
    ];
    admin_ok(node, &args);
}

#[test]
fn consumer_progress_lag_matches_what_was_produced_and_consumed() {
    let node = Node::start();
    let (topic, group) = ("ProgressT", "ProgressG");
    admin_ok(&node, &["updateTopic", "-t", topic, "-r", "2", "-w", "2"]);
    // Produced: broker-0 q0: 5, q1: 2; broker-1 q0: 3, q1: 0.
    for (broker, queue, count) in [
        ("broker-0", "0", 5),
        ("broker-0", "1", 2),
        ("broker-1", "0", 3),
    ] {
        for _ in 0..count {
            send_to(&node, topic, broker, queue);
        }
    }
    let error = admin_err(&node, &["consumerProgress", "-g", group]);
    assert!(
        error.contains("unknown consumer group ProgressG"),
        "{error}"
    );

    let mut consumers: Vec<Client> = (0..2)
        .map(|shard| Client::connect_to(&node.broker(shard)))
        .collect();
    for client in &mut consumers {
        heartbeat(client, group, topic);
    }
    // Consumed: broker-0 q0: 4 of 5, q1: 2 of 2; broker-1 q0: 1 of 3.
    commit(&node.broker(0), group, topic, 0, 4);
    commit(&node.broker(0), group, topic, 1, 2);
    commit(&node.broker(1), group, topic, 0, 1);

    let progress = admin_ok(&node, &["consumerProgress", "-g", group, "-t", topic]);
    let rows: Vec<(String, i64, i64, i64, i64)> = queues_of(&progress, "queues")
        .iter()
        .map(|q| {
            (
                q["brokerName"].as_str().unwrap().to_string(),
                q["queueId"].as_i64().unwrap(),
                q["brokerOffset"].as_i64().unwrap(),
                q["consumerOffset"].as_i64().unwrap(),
                q["lag"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("broker-0", 0, 5, 4, 1),
        ("broker-0", 1, 2, 2, 0),
        ("broker-1", 0, 3, 1, 2),
        ("broker-1", 1, 0, 0, 0),
    ];
    let expected: Vec<(String, i64, i64, i64, i64)> = expected
        .iter()
        .map(|(b, q, m, c, l)| (b.to_string(), *q, *m, *c, *l))
        .collect();
    assert_eq!(rows, expected);
    assert_eq!(progress["totalLag"], 3);
    assert_eq!(progress["online"], true);
    let clients = queues_of(&progress, "clients");
    assert_eq!(clients.len(), 1);
    assert_eq!(clients[0]["clientId"], "127.0.0.1@admin-test");
    assert_eq!(clients[0]["language"], "JAVA");
    assert!(
        queues_of(&progress, "queues")[0]["lastTimestamp"]
            .as_i64()
            .unwrap()
            > 0
    );
    assert_eq!(progress["subscriptions"][0]["topic"], topic);

    // Without --topic the group's topics come from its offsets (and its subscriptions).
    let all = admin_ok(&node, &["consumerProgress", "-g", group]);
    assert_eq!(all["totalLag"], 3);

    // Offline: the lag stays, the clients are gone.
    drop(consumers);
    let deadline = Instant::now() + Duration::from_secs(10);
    let offline = loop {
        let progress = admin_ok(&node, &["consumerProgress", "-g", group, "-t", topic]);
        if progress["online"] == false || Instant::now() > deadline {
            break progress;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(offline["online"], false);
    assert_eq!(offline["totalLag"], 3);
    assert!(queues_of(&offline, "clients").is_empty());

    reset_offsets(&node, topic, group);
}

/// resetOffsetByTime to the beginning, on the offline group: every offset goes back to 0.
fn reset_offsets(node: &Node, topic: &str, group: &str) {
    let output = admin(
        node,
        &["resetOffsetByTime", "-g", group, "-t", topic, "-s", "0"],
    );
    assert!(
        output.status.success(),
        "resetOffsetByTime failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reset: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        queues_of(&reset, "queues").iter().all(|q| q["offset"] == 0),
        "{reset}"
    );
    let progress = admin_ok(node, &["consumerProgress", "-g", group, "-t", topic]);
    assert_eq!(progress["totalLag"], 10, "everything is to consume again");
}

/// Subscription groups: updateSubGroup, subGroupList, deleteSubGroup on every master.
#[test]
fn subscription_group_commands() {
    let node = Node::start();
    let created = admin_ok(
        &node,
        &["updateSubGroup", "-g", "SubG", "--retry-max-times", "3"],
    );
    assert_eq!(queues_of(&created, "brokers").len(), 2);
    let listed = admin_ok(&node, &["subGroupList"]);
    let group = queues_of(&listed, "groups")
        .iter()
        .find(|g| g["groupName"] == "SubG")
        .cloned()
        .expect("SubG listed");
    assert_eq!(group["config"]["retryMaxTimes"], 3);
    assert_eq!(group["config"]["consumeEnable"], true);
    assert_eq!(group["brokers"].as_array().unwrap().len(), 2);
    // On one broker only, by address.
    admin_ok(
        &node,
        &[
            "updateSubGroup",
            "-g",
            "OneG",
            "-b",
            &node.broker(1),
            "--consume-enable",
            "false",
        ],
    );
    let listed = admin_ok(&node, &["subGroupList"]);
    let one = queues_of(&listed, "groups")
        .iter()
        .find(|g| g["groupName"] == "OneG")
        .cloned()
        .expect("OneG listed");
    assert_eq!(one["brokers"], serde_json::json!(["broker-1"]));
    assert_eq!(one["config"]["consumeEnable"], false);
    admin_ok(&node, &["deleteSubGroup", "-g", "SubG", "--remove-offset"]);
    let listed = admin_ok(&node, &["subGroupList"]);
    assert!(!queues_of(&listed, "groups")
        .iter()
        .any(|g| g["groupName"] == "SubG"));
    let error = admin_err(&node, &["subGroupList", "-c", "NoCluster"]);
    assert!(error.contains("unknown cluster NoCluster"), "{error}");
}
