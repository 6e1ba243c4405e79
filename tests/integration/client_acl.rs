//! ACL with our own tools against the real binary (`serve --acl-file`): the admin CLI creates
//! a topic only with an admin account's `--access-key/--secret-key`; the Rust client with
//! `SessionCredentials` produces and push-consumes; a wrong secret is refused with
//! NO_PERMISSION and its remark, and nothing is stored.

use std::process::Output;

use crate::common::client::send_then_consume;
use crate::common::*;
use shardmq_client::{ClientError, Message, Producer, SessionCredentials};

const RULES: &str = "\
accounts:
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
  - accessKey: app-key
    secretKey: app-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [AclRustTopic=PUB|SUB]
";
const TOPIC: &str = "AclRustTopic";

/// A node with ACL on, and the directory of its ACL file (kept while the node runs).
fn start() -> (Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let acl_file = dir.path().join("plain_acl.yml");
    std::fs::write(&acl_file, RULES).unwrap();
    let node = Node::start_with(&["--acl-file", acl_file.to_str().unwrap()]);
    (node, dir)
}

fn admin(node: &Node, keys: Option<(&str, &str)>, args: &[&str]) -> Output {
    let mut command = shardmq();
    command
        .arg("admin")
        .args(args)
        .args(["-n", &node.namesrv()]);
    if let Some((access_key, secret_key)) = keys {
        command.args(["--access-key", access_key, "--secret-key", secret_key]);
    }
    command.output().expect("run shardmq admin")
}

#[test]
fn the_admin_cli_signs_and_only_an_admin_account_creates_topics() {
    let (node, _acl_dir) = start();
    let create = ["updateTopic", "-t", TOPIC, "-r", "4", "-w", "4"];
    for keys in [None, Some(("app-key", "app-secret"))] {
        let output = admin(&node, keys, &create);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{keys:?}: {output:?}");
        assert!(stderr.contains("NO_PERMISSION"), "{keys:?}: {stderr}");
        println!("updateTopic with {keys:?}: {}", stderr.trim());
    }
    let output = admin(&node, Some(("admin-key", "admin-secret")), &create);
    assert!(output.status.success(), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_produces_and_consumes_with_session_credentials() {
    let (node, _acl_dir) = start();
    let output = admin(
        &node,
        Some(("admin-key", "admin-secret")),
        &["updateTopic", "-t", TOPIC, "-r", "4", "-w", "4"],
    );
    assert!(output.status.success(), "{output:?}");

    let credentials = SessionCredentials::new("app-key", "app-secret");
    let mut producer = node.producer_options("acl-producer");
    producer.client.credentials = Some(credentials.clone());
    let mut consumer = node.consumer_options("acl-group");
    consumer.client.credentials = Some(credentials);
    send_then_consume(producer, consumer, TOPIC, "acl", 20).await;

    // A wrong secret: refused, with the reason, and not stored.
    let mut options = node.producer_options("acl-intruder");
    options.client.credentials = Some(SessionCredentials::new("app-key", "guessed"));
    options.retry_times_when_send_failed = 0;
    let intruder = Producer::start(options).await.unwrap();
    let error = intruder
        .send(Message::new(TOPIC, "must not be stored"))
        .await
        .unwrap_err();
    println!("wrong secret: {error}");
    match &error {
        ClientError::Broker { code, remark, .. } => {
            assert_eq!(*code, shardmq::remoting::response_code::NO_PERMISSION);
            assert!(remark.contains("Check signature failed for accessKey=app-key"));
        }
        other => panic!("expected NO_PERMISSION from the broker, got {other:?}"),
    }
    intruder.shutdown().await;
    let output = admin(
        &node,
        Some(("admin-key", "admin-secret")),
        &["topicStatus", "-t", TOPIC, "--json"],
    );
    assert!(output.status.success(), "{output:?}");
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let stored: i64 = status["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|queue| queue["maxOffset"].as_i64().unwrap())
        .sum();
    assert_eq!(stored, 20, "only the 20 signed sends are stored");
}
