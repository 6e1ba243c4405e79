//! The transactional producer against the real binary: a committed half message reaches
//! consumers, a rolled-back one never does, and an unknown one is settled by the broker's
//! CHECK_TRANSACTION_STATE through the check listener.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::client::{distinct_bodies, record, wait_until, Log};
use common::Node;
use shardmq::client::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, LocalTransactionState, Message,
    MessageExt, PushConsumer, TransactionListener, TransactionProducer,
};

/// Decides by the argument; the check commits what was left unknown and counts its calls.
struct ByArgument {
    checks: Arc<AtomicUsize>,
}

impl TransactionListener for ByArgument {
    fn execute_local_transaction(&self, _message: &Message, arg: &str) -> LocalTransactionState {
        match arg {
            "commit" => LocalTransactionState::CommitMessage,
            "rollback" => LocalTransactionState::RollbackMessage,
            _ => LocalTransactionState::Unknown,
        }
    }

    fn check_local_transaction(&self, message: &MessageExt) -> LocalTransactionState {
        self.checks.fetch_add(1, Ordering::SeqCst);
        assert_eq!(message.property("PGROUP"), Some("tx-producer"));
        LocalTransactionState::CommitMessage
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_rollback_and_check() {
    // Undecided half messages are checked after 1 s, looked for every 300 ms.
    let node = Node::start_with(&[
        "--transaction-timeout-ms",
        "1000",
        "--transaction-check-interval-ms",
        "300",
    ]);
    let topic = "ClientTransactions";
    let checks = Arc::new(AtomicUsize::new(0));
    let producer = TransactionProducer::start(
        node.producer_options("tx-producer"),
        ByArgument {
            checks: checks.clone(),
        },
    )
    .await
    .unwrap();
    // Make the topic exist before the consumer starts.
    producer
        .producer()
        .send(Message::new(topic, "plain"))
        .await
        .unwrap();

    let log: Log = Arc::default();
    let mut consumer = PushConsumer::new(node.consumer_options("tx-readers"));
    consumer.subscribe(topic, "*").unwrap();
    let sink = log.clone();
    consumer.register_message_listener_concurrently(
        move |messages: &[MessageExt], _: &mut ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, "reader", message);
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        },
    );
    consumer.start().await.unwrap();

    for (body, arg) in [
        ("committed", "commit"),
        ("rolled-back", "rollback"),
        ("checked", "unknown"),
    ] {
        let result = producer
            .send_message_in_transaction(Message::new(topic, body), arg)
            .await
            .unwrap();
        assert!(!result.send_result.offset_msg_id.is_empty());
    }
    // The broker checks a half message left unknown once it is older than its check timeout.
    wait_until(
        &log,
        Duration::from_secs(90),
        "the committed and the checked message",
        |seen| {
            let bodies = distinct_bodies(seen);
            bodies.contains("committed") && bodies.contains("checked")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bodies = distinct_bodies(&log.lock().unwrap());
    assert_eq!(
        bodies,
        BTreeSet::from(["plain", "committed", "checked"].map(String::from)),
        "the rolled-back message never shows"
    );
    assert!(checks.load(Ordering::SeqCst) >= 1);
    consumer.shutdown().await;
    producer.shutdown().await;
}
