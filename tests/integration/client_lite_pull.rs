//! The lite pull consumer against the real binary: assign, poll, seek, commit, resume from the
//! committed offset, and subscribe mode sharing a topic between two consumers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::Node;
use shardmq_client::{AllocateAveragelyByCircle, LitePullConsumer, Message, MessageExt, Producer};

async fn poll_until(consumer: &LitePullConsumer, count: usize) -> Vec<MessageExt> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut all = Vec::new();
    while all.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} messages polled",
            all.len()
        );
        all.extend(consumer.poll(Duration::from_millis(200)).await);
    }
    all
}

fn bodies(messages: &[MessageExt]) -> Vec<String> {
    messages
        .iter()
        .map(|m| String::from_utf8_lossy(m.body()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn assign_poll_seek_commit_and_resume() {
    let node = Node::start();
    let topic = "ClientLiteAssign";
    let group = "lite-assign";
    let producer = Producer::start(node.producer_options("lite-producer"))
        .await
        .unwrap();
    producer.send(Message::new(topic, "create")).await.unwrap();
    let queue = producer.fetch_publish_queues(topic).await.unwrap()[0].clone();
    let first = producer
        .send_to_queue(Message::new(topic, "q-0"), &queue)
        .await
        .unwrap()
        .queue_offset;
    for i in 1..20 {
        producer
            .send_to_queue(Message::new(topic, format!("q-{i}")), &queue)
            .await
            .unwrap();
    }

    let mut consumer = LitePullConsumer::new(node.consumer_options(group));
    consumer.set_auto_commit(false);
    consumer.start().await.unwrap();
    let queues = consumer.fetch_message_queues(topic).await.unwrap();
    assert!(queues.contains(&queue));
    consumer.assign(vec![queue.clone()]).await.unwrap();
    assert_eq!(consumer.assignment(), vec![queue.clone()]);
    let polled = poll_until(&consumer, 20 + (first as usize)).await;
    let tail: Vec<String> = bodies(&polled)
        .into_iter()
        .filter(|b| b.starts_with("q-"))
        .collect();
    assert_eq!(
        tail,
        (0..20).map(|i| format!("q-{i}")).collect::<Vec<_>>(),
        "queue order"
    );

    // Seek back: the next messages start at the seek offset, nothing older leaks through.
    consumer.seek(&queue, first + 5).await.unwrap();
    let again = poll_until(&consumer, 15).await;
    assert_eq!(again[0].queue_offset, first + 5);
    assert_eq!(
        bodies(&again[..15]),
        (5..20).map(|i| format!("q-{i}")).collect::<Vec<_>>()
    );
    assert!(
        consumer.seek(&queue, first + 1_000).await.is_err(),
        "past the end"
    );

    // Nothing committed yet (auto-commit off; a young queue may report 0, the broker's
    // "young queue" rule); commit_sync stores the consumed offset.
    let before = consumer.committed(&queue).await.unwrap();
    assert!(matches!(before, None | Some(0)), "{before:?}");
    consumer.commit_sync().await.unwrap();
    assert_eq!(consumer.committed(&queue).await.unwrap(), Some(first + 20));
    consumer.shutdown().await;

    // A new consumer of the group resumes after the committed offset.
    for i in 20..23 {
        producer
            .send_to_queue(Message::new(topic, format!("q-{i}")), &queue)
            .await
            .unwrap();
    }
    let mut resumed = LitePullConsumer::new(node.consumer_options(group));
    resumed.start().await.unwrap();
    resumed.assign(vec![queue.clone()]).await.unwrap();
    let next = poll_until(&resumed, 3).await;
    assert_eq!(bodies(&next), ["q-20", "q-21", "q-22"]);
    resumed.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribed_consumers_share_the_topic() {
    let node = Node::start();
    let topic = "ClientLiteSubscribe";
    let producer = Producer::start(node.producer_options("lite-sub-producer"))
        .await
        .unwrap();
    for i in 0..100 {
        producer
            .send(Message::new(topic, format!("s-{i}")))
            .await
            .unwrap();
    }
    let mut consumers = Vec::new();
    for _ in 0..2 {
        // Queues dealt round the circle rather than in ranges.
        let mut options = node.consumer_options("lite-sub");
        options.allocate_strategy = Arc::new(AllocateAveragelyByCircle);
        let mut consumer = LitePullConsumer::new(options);
        consumer.subscribe(topic, "*").unwrap();
        consumer.start().await.unwrap();
        consumers.push(consumer);
    }
    // Wait until the two split the queues, then drain.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (a, b) = (consumers[0].assignment(), consumers[1].assignment());
        let a_topic: BTreeSet<_> = a.iter().filter(|q| q.topic == topic).collect();
        let b_topic: BTreeSet<_> = b.iter().filter(|q| q.topic == topic).collect();
        let interleaved = a_topic.len() == 4 && b_topic.len() == 4 && a_topic.is_disjoint(&b_topic);
        if interleaved {
            // By circle: the sorted queues alternate between the two consumers.
            let mut all: Vec<_> = a_topic.iter().chain(b_topic.iter()).cloned().collect();
            all.sort();
            for pair in all.windows(2) {
                assert_ne!(
                    a_topic.contains(pair[0]),
                    a_topic.contains(pair[1]),
                    "{a_topic:?} {b_topic:?}"
                );
            }
            break;
        }
        assert!(Instant::now() < deadline, "never split: {a:?} {b:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen.len() < 100 {
        assert!(Instant::now() < deadline, "only {} of 100", seen.len());
        for consumer in &consumers {
            seen.extend(bodies(&consumer.poll(Duration::from_millis(100)).await));
        }
    }
    assert_eq!(
        seen,
        (0..100).map(|i| format!("s-{i}")).collect::<BTreeSet<_>>()
    );
    for consumer in &consumers {
        consumer.shutdown().await;
    }
    producer.shutdown().await;
}
