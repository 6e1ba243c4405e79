//! For the `client_*` tests of our client library: fast client options for a [`Node`] (short
//! rebalance, commit and hold intervals so each test takes seconds) and helpers that collect
//! consumed messages.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq_client::{ConsumeFromWhere, ConsumerOptions, ProducerOptions};

use super::Node;

impl Node {
    pub fn producer_options(&self, group: &str) -> ProducerOptions {
        ProducerOptions::new(group, &self.namesrv())
    }

    /// Consumer options scaled down for tests: rebalance every 500 ms, commit every 200 ms,
    /// pulls held 1 s, from the first offset.
    pub fn consumer_options(&self, group: &str) -> ConsumerOptions {
        let mut options = ConsumerOptions::new(group, &self.namesrv());
        options.consume_from_where = ConsumeFromWhere::FirstOffset;
        options.rebalance_interval = Duration::from_millis(500);
        options.persist_consumer_offset_interval = Duration::from_millis(200);
        options.broker_suspend_max_time = Duration::from_millis(1_000);
        options.pull_time_delay_when_exception = Duration::from_millis(200);
        options.lock_interval = Duration::from_millis(1_000);
        options.suspend_current_queue_time = Duration::from_millis(100);
        options.client.poll_name_server_interval = Duration::from_millis(1_000);
        options.client.heartbeat_interval = Duration::from_millis(1_000);
        options.offset_store_dir = self.dir.join("client-offsets");
        options
    }
}

/// What listeners record: (consumer label, body text, queue, queue offset, reconsume times).
#[derive(Debug, Clone)]
pub struct Seen {
    pub consumer: String,
    pub body: String,
    pub broker_name: String,
    pub queue_id: u32,
    pub queue_offset: i64,
    pub reconsume_times: i32,
    pub topic: String,
    pub tags: Option<String>,
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

pub fn record(log: &Log, consumer: &str, message: &shardmq_client::MessageExt) {
    log.lock().unwrap().push(Seen {
        consumer: consumer.to_string(),
        body: String::from_utf8_lossy(message.body()).into_owned(),
        broker_name: message.broker_name.clone(),
        queue_id: message.queue_id,
        queue_offset: message.queue_offset,
        reconsume_times: message.reconsume_times,
        topic: message.topic().to_string(),
        tags: message.tags().map(str::to_string),
    });
}

/// Waits until `done(log)` holds, polling; panics with `what` after `timeout`.
pub async fn wait_until(log: &Log, timeout: Duration, what: &str, done: impl Fn(&[Seen]) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if done(&log.lock().unwrap()) {
            return;
        }
        if Instant::now() > deadline {
            let log = log.lock().unwrap();
            panic!("timed out waiting for {what}; {} messages seen", log.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Distinct bodies in the log.
pub fn distinct_bodies(log: &[Seen]) -> std::collections::BTreeSet<String> {
    log.iter().map(|seen| seen.body.clone()).collect()
}

/// Sends `count` messages (`<prefix>-<i>`) to `topic` with a producer of `producer` options,
/// then push-consumes them with `consumer` options until all `count` bodies arrived (or
/// panics after 30 s): the round trip the ACL and TLS tests make with their settings.
pub async fn send_then_consume(
    producer: ProducerOptions,
    consumer: ConsumerOptions,
    topic: &str,
    prefix: &str,
    count: usize,
) {
    use shardmq_client::{
        ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, Message, MessageExt, Producer,
        PushConsumer, SendStatus,
    };
    let sender = Producer::start(producer).await.unwrap();
    for i in 0..count {
        let result = sender
            .send(Message::new(topic, format!("{prefix}-{i}")))
            .await
            .unwrap();
        assert_eq!(result.status, SendStatus::SendOk);
    }
    sender.shutdown().await;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let mut receiver = PushConsumer::new(consumer);
    receiver.subscribe(topic, "*").unwrap();
    let sink = log.clone();
    receiver.register_message_listener_concurrently(
        move |messages: &[MessageExt], _: &mut ConsumeConcurrentlyContext| {
            for message in messages {
                record(&sink, "c", message);
            }
            ConsumeConcurrentlyStatus::ConsumeSuccess
        },
    );
    receiver.start().await.unwrap();
    let what = format!("{count} messages");
    wait_until(&log, Duration::from_secs(30), &what, |seen| {
        distinct_bodies(seen).len() == count
    })
    .await;
    receiver.shutdown().await;
}
