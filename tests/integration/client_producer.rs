//! The producer against the real binary: every send mode, both selectors, compression, and a
//! push consumer reading back exactly what was sent.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::client::{distinct_bodies, record, wait_until, Log};
use crate::common::Node;
use shardmq_client::{
    ConsumeConcurrentlyStatus, Message, MessageExt, Producer, PushConsumer, SelectByHash,
    SelectByRoundRobin, SendStatus,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_send_mode_arrives_intact() {
    let node = Node::start();
    let topic = "ClientSendModes";
    let producer = Producer::start(node.producer_options("send-modes"))
        .await
        .unwrap();

    // Sync.
    let mut expected = BTreeSet::new();
    for i in 0..10 {
        let body = format!("sync-{i}");
        let result = producer
            .send(
                Message::new(topic, body.clone())
                    .with_tags("sync")
                    .with_keys([&body]),
            )
            .await
            .unwrap();
        assert_eq!(result.status, SendStatus::SendOk);
        assert_eq!(result.msg_id.len(), 32, "UNIQ_KEY: {}", result.msg_id);
        assert_eq!(result.offset_msg_id.len(), 32);
        assert_eq!(result.queue.topic, topic);
        expected.insert(body);
    }

    // Async: 200 sends in flight at once on the shared connections.
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..200 {
        let body = format!("async-{i}");
        expected.insert(body.clone());
        let done_tx = done_tx.clone();
        producer.send_async(Message::new(topic, body), move |result| {
            let _ = done_tx.send(result);
        });
    }
    let mut async_offsets = BTreeSet::new();
    for _ in 0..200 {
        let result = done_rx.recv().await.unwrap().unwrap();
        assert!(async_offsets.insert((result.queue.clone(), result.queue_offset)));
    }

    // Oneway.
    for i in 0..10 {
        let body = format!("oneway-{i}");
        producer
            .send_oneway(Message::new(topic, body.clone()))
            .await
            .unwrap();
        expected.insert(body);
    }

    // Batch: one request, consecutive offsets in one queue.
    let batch: Vec<Message> = (0..10)
        .map(|i| Message::new(topic, format!("batch-{i}")).with_tags("batch"))
        .collect();
    expected.extend((0..10).map(|i| format!("batch-{i}")));
    let result = producer.send_batch(batch).await.unwrap();
    assert_eq!(result.msg_id.split(',').count(), 10);
    assert_eq!(result.offset_msg_id.split(',').count(), 10);

    // Compression: a body above the 4 KiB threshold goes zlib-compressed and comes back whole.
    let big = format!("big-{}", "0123456789".repeat(1_000));
    producer
        .send(Message::new(topic, big.clone()))
        .await
        .unwrap();
    expected.insert(big.clone());

    let log: Log = Arc::default();
    let mut consumer = PushConsumer::new(node.consumer_options("send-modes-reader"));
    consumer.subscribe(topic, "*").unwrap();
    let sink = log.clone();
    consumer.register_message_listener_concurrently(
        move |messages: &[MessageExt], _: &mut shardmq_client::ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, "reader", message);
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        },
    );
    consumer.start().await.unwrap();
    let total = expected.len();
    wait_until(&log, Duration::from_secs(20), "every message", |seen| {
        distinct_bodies(seen).len() >= total
    })
    .await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(distinct_bodies(&seen), expected);
    let tags: BTreeSet<Option<String>> = seen
        .iter()
        .filter(|s| s.body.starts_with("batch-"))
        .map(|s| s.tags.clone())
        .collect();
    assert_eq!(tags, BTreeSet::from([Some("batch".to_string())]));
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn selectors_pick_queues_by_key_and_in_turn() {
    let node = Node::start();
    let topic = "ClientSelectors";
    let producer = Producer::start(node.producer_options("selectors"))
        .await
        .unwrap();
    // Make the topic exist so its real route is used.
    producer.send(Message::new(topic, "warm-up")).await.unwrap();
    let queues = producer.fetch_publish_queues(topic).await.unwrap();
    assert!(queues.len() >= 4, "{queues:?}");

    let by_key = Mutex::new(std::collections::BTreeMap::new());
    for i in 0..40 {
        let key = format!("order-{}", i % 5);
        let result = producer
            .send_with_selector(
                Message::new(topic, format!("{key}-{i}")),
                &SelectByHash,
                &key,
            )
            .await
            .unwrap();
        let previous = by_key
            .lock()
            .unwrap()
            .insert(key.clone(), result.queue.clone());
        if let Some(previous) = previous {
            assert_eq!(previous, result.queue, "one key, one queue");
        }
    }

    let round_robin = SelectByRoundRobin::default();
    let mut picked = Vec::new();
    for i in 0..queues.len() * 2 {
        let result = producer
            .send_with_selector(Message::new(topic, format!("rr-{i}")), &round_robin, "")
            .await
            .unwrap();
        picked.push(result.queue);
    }
    let distinct: BTreeSet<_> = picked.iter().collect();
    assert_eq!(
        distinct.len(),
        queues.len(),
        "round robin visits every queue"
    );
    assert_eq!(picked[..queues.len()], picked[queues.len()..]);

    // An explicit queue is used as given.
    let target = queues[queues.len() - 1].clone();
    let result = producer
        .send_to_queue(Message::new(topic, "direct"), &target)
        .await
        .unwrap();
    assert_eq!(result.queue, target);
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_an_error_not_a_panic() {
    let node = Node::start();
    let producer = Producer::start(node.producer_options("bad-input"))
        .await
        .unwrap();
    assert!(producer.send(Message::new("bad topic", "x")).await.is_err());
    assert!(producer.send(Message::new("T", Vec::new())).await.is_err());
    let too_big = vec![b'x'; 5 * 1024 * 1024];
    assert!(producer.send(Message::new("T", too_big)).await.is_err());
    assert!(producer.send_batch(Vec::new()).await.is_err());
    let mixed = vec![Message::new("A", "1"), Message::new("B", "2")];
    assert!(producer.send_batch(mixed).await.is_err());
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_move_to_another_broker_when_one_dies() {
    let node = Node::start();
    let mut other = Node::start_broker_joining(&node, "other");
    let producer = Producer::start(node.producer_options("failover"))
        .await
        .unwrap();
    // The template route spans both processes (broker-0, broker-1, other-0) once every name
    // server replica has the second node; each fresh topic name asks again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut attempt = 0;
    let topic = loop {
        let topic = format!("ClientFailover{attempt}");
        let queues = producer.fetch_publish_queues(&topic).await.unwrap();
        if queues.iter().any(|q| q.broker_name == "other-0") {
            break topic;
        }
        assert!(std::time::Instant::now() < deadline, "{queues:?}");
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let topic = topic.as_str();
    let mut on_other = 0;
    for i in 0..30 {
        let result = producer
            .send(Message::new(topic, format!("before-{i}")))
            .await
            .unwrap();
        on_other += usize::from(result.queue.broker_name == "other-0");
    }
    assert!(on_other > 0, "the rotation uses every broker");

    other.kill();
    // Every send still succeeds: a refused connection moves the attempt to another broker,
    // and the dead broker is then left out of the rotation.
    let started = std::time::Instant::now();
    for i in 0..60 {
        let result = producer
            .send(Message::new(topic, format!("after-{i}")))
            .await
            .unwrap();
        assert_ne!(result.queue.broker_name, "other-0");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    producer.shutdown().await;
}
