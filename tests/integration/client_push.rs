//! The push consumer against the real binary: clustering with consumers joining and leaving
//! (no loss), broadcasting, orderly order per queue, send-back of failed messages, and offsets
//! resumed after a node restart.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::common::client::{distinct_bodies, record, wait_until, Log};
use crate::common::Node;
use shardmq_client::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, ConsumerOptions, Message, MessageExt, MessageModel, Producer,
    PushConsumer, SelectByHash,
};

fn concurrent_consumer(
    options: ConsumerOptions,
    topic: &str,
    label: &str,
    log: &Log,
) -> PushConsumer {
    let mut consumer = PushConsumer::new(options);
    consumer.subscribe(topic, "*").unwrap();
    let (sink, label) = (log.clone(), label.to_string());
    consumer.register_message_listener_concurrently(
        move |messages: &[MessageExt], _: &mut ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, &label, message);
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        },
    );
    consumer
}

/// Every queue of the topic owned by exactly one of `consumers`.
async fn wait_for_partition(consumers: &[&PushConsumer], topic: &str, queue_count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let owned: Vec<_> = consumers
            .iter()
            .flat_map(|c| c.assigned_queues())
            .filter(|q| q.topic == topic)
            .collect();
        let distinct: BTreeSet<_> = owned.iter().collect();
        let all_have_some = consumers
            .iter()
            .all(|c| c.assigned_queues().iter().any(|q| q.topic == topic));
        if owned.len() == queue_count && distinct.len() == queue_count && all_have_some {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queues never partitioned: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clustering_rebalances_as_consumers_join_and_leave_without_loss() {
    let node = Node::start();
    let topic = "ClientClustering";
    let group = "clustering-group";
    let producer = Producer::start(node.producer_options("clustering-producer"))
        .await
        .unwrap();
    producer.send(Message::new(topic, "m-0")).await.unwrap();
    let queue_count = producer.fetch_publish_queues(topic).await.unwrap().len();
    let log: Log = Arc::default();

    // Messages flow the whole time consumers come and go.
    let sender = {
        let producer = producer.clone();
        tokio::spawn(async move {
            for i in 1..600 {
                producer
                    .send(Message::new(topic, format!("m-{i}")))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut first = concurrent_consumer(node.consumer_options(group), topic, "c1", &log);
    first.start().await.unwrap();
    wait_for_partition(&[&first], topic, queue_count).await;
    let mut second = concurrent_consumer(node.consumer_options(group), topic, "c2", &log);
    second.start().await.unwrap();
    let mut third = concurrent_consumer(node.consumer_options(group), topic, "c3", &log);
    third.start().await.unwrap();
    wait_for_partition(&[&first, &second, &third], topic, queue_count).await;
    wait_until(
        &log,
        Duration::from_secs(10),
        "the third consumer's first message",
        |seen| seen.iter().any(|s| s.consumer == "c3"),
    )
    .await;
    second.shutdown().await;
    wait_for_partition(&[&first, &third], topic, queue_count).await;
    sender.await.unwrap();

    let expected: BTreeSet<String> = (0..600).map(|i| format!("m-{i}")).collect();
    wait_until(&log, Duration::from_secs(20), "every message", |seen| {
        distinct_bodies(seen).len() == expected.len()
    })
    .await;
    let seen = log.lock().unwrap().clone();
    assert_eq!(distinct_bodies(&seen), expected, "no message lost");
    let duplicates = seen.len() - expected.len();
    println!(
        "clustering: {} deliveries of {} messages",
        seen.len(),
        expected.len()
    );
    assert!(
        duplicates < 100,
        "duplicates only around the changes: {duplicates}"
    );
    let by_consumer: BTreeMap<&str, usize> = seen.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.consumer.as_str()).or_default() += 1;
        m
    });
    assert_eq!(
        by_consumer.len(),
        3,
        "each consumer consumed: {by_consumer:?}"
    );
    first.shutdown().await;
    third.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broadcasting_gives_every_consumer_every_message() {
    let node = Node::start();
    let topic = "ClientBroadcast";
    let producer = Producer::start(node.producer_options("broadcast-producer"))
        .await
        .unwrap();
    producer.send(Message::new(topic, "b-0")).await.unwrap();
    let log: Log = Arc::default();
    let mut consumers = Vec::new();
    for label in ["b1", "b2"] {
        let mut options = node.consumer_options("broadcast-group");
        options.message_model = MessageModel::Broadcasting;
        options.client.instance_name = Some(label.to_string());
        let mut consumer = concurrent_consumer(options, topic, label, &log);
        consumer.start().await.unwrap();
        consumers.push(consumer);
    }
    for i in 1..50 {
        producer
            .send(Message::new(topic, format!("b-{i}")))
            .await
            .unwrap();
    }
    let expected: BTreeSet<String> = (0..50).map(|i| format!("b-{i}")).collect();
    for label in ["b1", "b2"] {
        wait_until(
            &log,
            Duration::from_secs(15),
            "all messages at each consumer",
            |seen| {
                seen.iter()
                    .filter(|s| s.consumer == label)
                    .map(|s| &s.body)
                    .collect::<BTreeSet<_>>()
                    .len()
                    == expected.len()
            },
        )
        .await;
    }
    for consumer in &consumers {
        consumer.shutdown().await;
    }
    // Broadcasting offsets live in a local file per consumer.
    let files = walk(&node.dir.join("client-offsets"));
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("broadcast-group/offsets.json")),
        "{files:?}"
    );
    producer.shutdown().await;
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orderly_listener_sees_each_queue_in_order() {
    let node = Node::start();
    let topic = "ClientOrderly";
    let producer = Producer::start(node.producer_options("orderly-producer"))
        .await
        .unwrap();
    producer.send(Message::new(topic, "warm-up")).await.unwrap();
    for i in 0..200 {
        let key = format!("k{}", i % 7);
        producer
            .send_with_selector(
                Message::new(topic, format!("{key}:{i}")),
                &SelectByHash,
                &key,
            )
            .await
            .unwrap();
    }
    let log: Log = Arc::default();
    let mut consumer = PushConsumer::new(node.consumer_options("orderly-group"));
    consumer.subscribe(topic, "*").unwrap();
    let sink = log.clone();
    let failed_once = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    consumer.register_message_listener_orderly(
        move |messages: &[MessageExt], _: &mut ConsumeOrderlyContext| {
            // Suspend the first delivery of every 25th message: the queue must not move past it.
            for message in messages {
                let body = String::from_utf8_lossy(message.body()).into_owned();
                let index: usize = body
                    .rsplit(':')
                    .next()
                    .and_then(|i| i.parse().ok())
                    .unwrap_or(1);
                if index.is_multiple_of(25) && failed_once.lock().unwrap().insert(body) {
                    return ConsumeOrderlyStatus::SuspendCurrentQueueAMoment;
                }
            }
            for message in messages {
                record(&sink, "orderly", message);
            }
            ConsumeOrderlyStatus::Success
        },
    );
    consumer.start().await.unwrap();
    wait_until(
        &log,
        Duration::from_secs(20),
        "all ordered messages",
        |seen| distinct_bodies(seen).len() == 201,
    )
    .await;
    let seen = log.lock().unwrap().clone();
    let mut last_offset: BTreeMap<(String, u32), i64> = BTreeMap::new();
    let mut last_index: BTreeMap<String, usize> = BTreeMap::new();
    for s in &seen {
        let queue = (s.broker_name.clone(), s.queue_id);
        if let Some(previous) = last_offset.insert(queue, s.queue_offset) {
            assert!(s.queue_offset > previous, "queue order broken at {s:?}");
        }
        if let Some((key, index)) = s.body.split_once(':') {
            let index: usize = index.parse().unwrap();
            if let Some(previous) = last_index.insert(key.to_string(), index) {
                assert!(index > previous, "key order broken at {s:?}");
            }
        }
    }
    assert_eq!(
        seen.len(),
        201,
        "no duplicates without failures of the consumer"
    );
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_messages_come_back_through_the_retry_topic() {
    let node = Node::start();
    let topic = "ClientSendBack";
    let producer = Producer::start(node.producer_options("send-back-producer"))
        .await
        .unwrap();
    for i in 0..10 {
        producer
            .send(Message::new(topic, format!("r-{i}")).with_tags("T1"))
            .await
            .unwrap();
    }
    let log: Log = Arc::default();
    let mut consumer = PushConsumer::new(node.consumer_options("send-back-group"));
    consumer.subscribe(topic, "*").unwrap();
    let sink = log.clone();
    consumer.register_message_listener_concurrently(
        move |messages: &[MessageExt], context: &mut ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, "c", message);
            }
            // Retry after delay level 1 (1 s) rather than the broker's default 10 s.
            context.delay_level_when_next_consume = 1;
            if messages.iter().any(|m| m.reconsume_times == 0) {
                ConsumeConcurrentlyStatus::ReconsumeLater
            } else {
                ConsumeConcurrentlyStatus::ConsumeSuccess
            }
        },
    );
    consumer.start().await.unwrap();
    wait_until(
        &log,
        Duration::from_secs(30),
        "every message retried once",
        |seen| {
            seen.iter()
                .filter(|s| s.reconsume_times >= 1)
                .map(|s| &s.body)
                .collect::<BTreeSet<_>>()
                .len()
                == 10
        },
    )
    .await;
    let seen = log.lock().unwrap().clone();
    for s in seen.iter().filter(|s| s.reconsume_times >= 1) {
        assert_eq!(s.topic, topic, "a retried message shows its original topic");
        assert_eq!(s.tags.as_deref(), Some("T1"));
    }
    consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn offsets_resume_after_a_node_restart() {
    let mut node = Node::start();
    let topic = "ClientResume";
    let group = "resume-group";
    let producer = Producer::start(node.producer_options("resume-producer"))
        .await
        .unwrap();
    for i in 0..30 {
        producer
            .send(Message::new(topic, format!("old-{i}")))
            .await
            .unwrap();
    }
    producer.shutdown().await;
    let log: Log = Arc::default();
    let mut consumer = concurrent_consumer(node.consumer_options(group), topic, "before", &log);
    consumer.start().await.unwrap();
    wait_until(&log, Duration::from_secs(15), "the old messages", |seen| {
        distinct_bodies(seen).len() == 30
    })
    .await;
    consumer.shutdown().await;

    node.restart();
    let producer = Producer::start(node.producer_options("resume-producer"))
        .await
        .unwrap();
    for i in 0..20 {
        producer
            .send(Message::new(topic, format!("new-{i}")))
            .await
            .unwrap();
    }
    let mut consumer = concurrent_consumer(node.consumer_options(group), topic, "after", &log);
    consumer.start().await.unwrap();
    wait_until(&log, Duration::from_secs(15), "the new messages", |seen| {
        seen.iter().filter(|s| s.consumer == "after").count() >= 20
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.consumer == "after")
        .map(|s| s.body.clone())
        .collect();
    assert!(
        after.iter().all(|b| b.starts_with("new-")),
        "old messages redelivered: {after:?}"
    );
    assert_eq!(after.len(), 20);
    consumer.shutdown().await;
    producer.shutdown().await;
}
