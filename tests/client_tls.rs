//! TLS with our own tools against the real binary: `serve --tls-server-mode enforcing`
//! (plaintext refused; its self-signed test certificate written to the data directory), the
//! Rust client verifying that certificate produces and push-consumes, and the admin CLI
//! speaks TLS with `--tls` (and fails without it).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::client::{distinct_bodies, record, wait_until, Log};
use common::*;
use shardmq_client::{
    ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer, SendStatus, TlsOptions,
};

const TOPIC: &str = "TlsRustTopic";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rust_client_and_admin_cli_speak_tls_to_an_enforcing_node() {
    let node = Node::start_with(&["--tls-server-mode", "enforcing"]);
    let cert = node.dir.path().join("tls").join("test-cert.pem");
    assert!(cert.exists(), "no test certificate at {}", cert.display());
    let cert_arg = cert.to_str().unwrap();

    let plain = shardmq()
        .args(["admin", "updateTopic", "-t", TOPIC, "-n", &node.namesrv()])
        .output()
        .unwrap();
    assert!(
        !plain.status.success(),
        "plaintext admin succeeded: {plain:?}"
    );
    let admin = shardmq()
        .args(["admin", "updateTopic", "-t", TOPIC, "-r", "4", "-w", "4"])
        .args([
            "-n",
            &node.namesrv(),
            "--tls",
            "--tls-trust-cert-path",
            cert_arg,
        ])
        .output()
        .unwrap();
    assert!(admin.status.success(), "{admin:?}");

    let tls = TlsOptions {
        trust_cert_path: Some(cert.clone()),
        client_cert: None,
    };
    let mut options = node.producer_options("tls-producer");
    options.client.tls = Some(tls.clone());
    let producer = Producer::start(options).await.unwrap();
    for i in 0..20 {
        let result = producer
            .send(Message::new(TOPIC, format!("tls-{i}")))
            .await
            .unwrap();
        assert_eq!(result.status, SendStatus::SendOk);
    }
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let mut options = node.consumer_options("tls-group");
    options.client.tls = Some(tls);
    let mut consumer = PushConsumer::new(options);
    consumer.subscribe(TOPIC, "*").unwrap();
    let sink = log.clone();
    consumer.register_message_listener_concurrently(
        move |messages: &[MessageExt], _: &mut shardmq_client::ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, "c", message);
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        },
    );
    consumer.start().await.unwrap();
    wait_until(&log, Duration::from_secs(30), "20 messages", |seen| {
        distinct_bodies(seen).len() == 20
    })
    .await;
    consumer.shutdown().await;
    producer.shutdown().await;
}
