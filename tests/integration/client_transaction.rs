//! The transactional producer against the real binary: a committed half message reaches
//! consumers, a rolled-back one never does, and an unknown one is settled by the broker's
//! CHECK_TRANSACTION_STATE through the check listener.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::client::{distinct_bodies, record, wait_until, Log};
use crate::common::Node;
use shardmq_client::{
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

/// Decides by the body's prefix: "c-" commit, "r-" rollback, "u*" unknown at first; the
/// broker's check then settles "uc-" as commit and "ur-" as rollback.
struct ByPrefix;

impl TransactionListener for ByPrefix {
    fn execute_local_transaction(&self, message: &Message, _arg: &str) -> LocalTransactionState {
        let body = String::from_utf8_lossy(&message.body).into_owned();
        if body.starts_with("c-") {
            LocalTransactionState::CommitMessage
        } else if body.starts_with("r-") {
            LocalTransactionState::RollbackMessage
        } else {
            LocalTransactionState::Unknown
        }
    }

    fn check_local_transaction(&self, message: &MessageExt) -> LocalTransactionState {
        let body = String::from_utf8_lossy(message.body()).into_owned();
        if body.starts_with("uc-") || body.starts_with("c-") {
            LocalTransactionState::CommitMessage
        } else {
            LocalTransactionState::RollbackMessage
        }
    }
}

/// 1,000 mixed transactions, with the broker restarted (SIGTERM) right after the first half
/// while the last of them are still undecided: exactly the committed ones are consumed, each
/// stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_mixed_transactions_across_a_restart() {
    const TRANSACTIONS: usize = 1_000;
    const SEND_ATTEMPTS_MAX: u32 = 50;
    let mut node = Node::start_with(&[
        "--transaction-timeout-ms",
        "1000",
        "--transaction-check-interval-ms",
        "300",
    ]);
    let topic = "ClientTransactionsMixed";
    // The producer heartbeats every second, so the restarted broker soon knows whom to check.
    let mut options = node.producer_options("tx-mixed");
    options.client.heartbeat_interval = Duration::from_secs(1);
    let producer = TransactionProducer::start(options, ByPrefix).await.unwrap();
    producer
        .producer()
        .send(Message::new(topic, "plain"))
        .await
        .unwrap();
    let log: Log = Arc::default();
    let mut consumer = PushConsumer::new(node.consumer_options("tx-mixed-readers"));
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

    let mut expected = BTreeSet::from(["plain".to_string()]);
    for index in 0..TRANSACTIONS {
        if index == TRANSACTIONS / 2 {
            // The halves sent in the last second are undecided ("u*" wait for a check).
            node.restart();
        }
        let prefix = ["c", "r", "uc", "ur"][index % 4];
        let body = format!("{prefix}-{index}");
        if prefix == "c" || prefix == "uc" {
            expected.insert(body.clone());
        }
        let mut attempt = 1;
        loop {
            // Connections to the restarted node fail before anything is stored: retry.
            match producer
                .send_message_in_transaction(Message::new(topic, body.as_str()), "")
                .await
            {
                Ok(_) => break,
                Err(error) if attempt < SEND_ATTEMPTS_MAX => {
                    attempt += 1;
                    eprintln!("transaction {body}: {error}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("transaction {body} failed {attempt} times: {error}"),
            }
        }
    }
    wait_until(
        &log,
        Duration::from_secs(120),
        "every committed transaction",
        |seen| distinct_bodies(seen).is_superset(&expected),
    )
    .await;
    // Checks of the rolled-back ones come in the same rounds: give a straggler time to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(distinct_bodies(&seen), expected, "only committed messages");
    // Each committed transaction is stored once: one (broker, queue, offset) per body. The
    // consumer may see a stored message again around the restart (at-least-once delivery of
    // offsets committed every 200 ms); that is counted, not a second commit.
    let mut stored = std::collections::BTreeMap::<String, BTreeSet<(String, u32, i64)>>::new();
    for entry in &seen {
        stored.entry(entry.body.clone()).or_default().insert((
            entry.broker_name.clone(),
            entry.queue_id,
            entry.queue_offset,
        ));
    }
    let committed_twice: Vec<_> = stored.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(
        committed_twice.is_empty(),
        "committed more than once: {committed_twice:?}"
    );
    let redelivered = seen.len() - stored.len();
    eprintln!("{redelivered} redeliveries of already consumed messages around the restart");
    consumer.shutdown().await;
    producer.shutdown().await;
}
