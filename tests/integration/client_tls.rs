//! TLS with our own tools against the real binary: `serve --tls-server-mode enforcing`
//! (plaintext refused; its self-signed test certificate written to the data directory), the
//! Rust client verifying that certificate produces and push-consumes, and the admin CLI
//! speaks TLS with `--tls` (and fails without it).

use crate::common::client::send_then_consume;
use crate::common::*;
use shardmq_client::TlsOptions;

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
    let mut producer = node.producer_options("tls-producer");
    producer.client.tls = Some(tls.clone());
    let mut consumer = node.consumer_options("tls-group");
    consumer.client.tls = Some(tls);
    send_then_consume(producer, consumer, TOPIC, "tls", 20).await;
}
