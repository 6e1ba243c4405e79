//! What the push and the lite pull consumer share: options, listener traits and their
//! statuses, and the rebalance steps (Java `RebalanceImpl`): who owns which queue, where a
//! newly owned queue starts (consume-from-where), and the broker locks of orderly consumers.
//!
//! Rebalance of one topic: its readable queues (from the route) and the group's client ids
//! (GET_CONSUMER_LIST_BY_GROUP), both sorted, go through the group's [`AllocateStrategy`];
//! broadcasting consumers own every queue. Each consumer then drops queues it no longer owns
//! (committing their offsets first) and starts pulling the new ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::allocate::{AllocateAveragely, AllocateStrategy};
use super::connection::Request;
use super::error::{ClientError, ClientResult};
use super::instance::{ClientConfig, ClientInstance};
use super::message::{now_ms, MessageExt, MessageQueue, RETRY_TOPIC_PREFIX};
use super::offset_store::OffsetStore;
use super::pull_api;
use crate::body::{
    parse_lock_batch_response, property, ConsumeFromWhere, LockBatchRequest, MessageModel,
};
use crate::remoting::request_code;

/// How long a new group starting from a timestamp looks back by default (Java: 30 minutes).
pub const CONSUME_TIMESTAMP_LOOKBACK_MS: i64 = 30 * 60 * 1000;

/// Consumer settings shared by [`super::PushConsumer`] and [`super::LitePullConsumer`];
/// [`ConsumerOptions::new`] gives Java's defaults.
#[derive(Clone)]
pub struct ConsumerOptions {
    pub group: String,
    pub client: ClientConfig,
    /// CLUSTERING (each message to one consumer of the group) or BROADCASTING (to all).
    pub message_model: MessageModel,
    /// Where a queue starts when the group has no committed offset for it.
    pub consume_from_where: ConsumeFromWhere,
    /// For `ConsumeFromWhere::Timestamp`: ms since the epoch (default: 30 minutes ago).
    pub consume_timestamp_ms: Option<i64>,
    pub allocate_strategy: Arc<dyn AllocateStrategy>,
    /// Listener calls running at once (Java `consumeThreadMax`, 20).
    pub consume_thread_max: usize,
    /// Messages handed to one listener call (Java `consumeMessageBatchMaxSize`, 1).
    pub consume_message_batch_max_size: usize,
    /// Messages asked for per pull (Java `pullBatchSize`, 32; lite pull 10).
    pub pull_batch_size: u32,
    /// Flow control: stop pulling a queue with this many messages cached (1,000).
    pub pull_threshold_for_queue: usize,
    /// Flow control: stop pulling a queue with this many body bytes cached (100 MiB).
    pub pull_threshold_size_for_queue_bytes: u64,
    /// Flow control (concurrent listeners): stop pulling when the cached offsets span more (2,000).
    pub consume_concurrently_max_span: i64,
    /// Rebalance period (20 s); a NOTIFY_CONSUMER_IDS_CHANGED rebalances at once.
    pub rebalance_interval: Duration,
    /// Offset commit period (5 s).
    pub persist_consumer_offset_interval: Duration,
    /// Deliveries before a message goes to the dead-letter queue (16).
    pub max_reconsume_times: i32,
    /// Orderly: pause after SUSPEND_CURRENT_QUEUE_A_MOMENT (1 s).
    pub suspend_current_queue_time: Duration,
    /// Wait after a failed pull (Java 3 s).
    pub pull_time_delay_when_exception: Duration,
    /// Longest the broker holds a pull with no new message (15 s).
    pub broker_suspend_max_time: Duration,
    /// Orderly: broker lock renewal period (20 s).
    pub lock_interval: Duration,
    /// Broadcasting offsets live under this directory (Java `~/.rocketmq_offsets`).
    pub offset_store_dir: PathBuf,
    /// How long shutdown waits for running listener calls before committing offsets.
    pub await_termination: Duration,
}

impl ConsumerOptions {
    /// Defaults for consumer group `group` and name servers `namesrv` ("host:port;...").
    pub fn new(group: &str, namesrv: &str) -> ConsumerOptions {
        let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
        ConsumerOptions {
            group: group.to_string(),
            client: ClientConfig::new(namesrv),
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::LastOffset,
            consume_timestamp_ms: None,
            allocate_strategy: Arc::new(AllocateAveragely),
            consume_thread_max: 20,
            consume_message_batch_max_size: 1,
            pull_batch_size: 32,
            pull_threshold_for_queue: 1_000,
            pull_threshold_size_for_queue_bytes: 100 * 1024 * 1024,
            consume_concurrently_max_span: 2_000,
            rebalance_interval: Duration::from_millis(20_000),
            persist_consumer_offset_interval: Duration::from_millis(5_000),
            max_reconsume_times: 16,
            suspend_current_queue_time: Duration::from_millis(1_000),
            pull_time_delay_when_exception: Duration::from_millis(3_000),
            broker_suspend_max_time: Duration::from_millis(15_000),
            lock_interval: Duration::from_millis(20_000),
            offset_store_dir: home.join(".rocketmq_offsets"),
            await_termination: Duration::from_millis(3_000),
        }
    }

    pub(crate) fn validate(&self) -> ClientResult<()> {
        if self.group.is_empty() {
            return Err(ClientError::InvalidArgument(
                "consumer group is empty".into(),
            ));
        }
        if self.consume_thread_max == 0
            || self.consume_message_batch_max_size == 0
            || self.pull_batch_size == 0
        {
            return Err(ClientError::InvalidArgument(
                "consume threads, consume batch and pull batch must be at least 1".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn retry_topic(&self) -> String {
        format!("{RETRY_TOPIC_PREFIX}{}", self.group)
    }

    pub(crate) fn is_clustering(&self) -> bool {
        self.message_model == MessageModel::Clustering
    }
}

/// What a concurrent listener says about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeConcurrentlyStatus {
    /// Consumed (up to `ack_index`); the offset may move past it.
    ConsumeSuccess,
    /// Deliver again later: sent back to the broker's retry queue (clustering).
    ReconsumeLater,
}

/// Handed to a concurrent listener with each batch.
#[derive(Debug, Clone)]
pub struct ConsumeConcurrentlyContext {
    pub queue: MessageQueue,
    /// Delay level for the retry (0: the broker's schedule, 3 + reconsume times; -1: DLQ now).
    pub delay_level_when_next_consume: i32,
    /// On success, messages after this index are treated as failed (default: the last index).
    pub ack_index: usize,
}

/// What an orderly listener says about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumeOrderlyStatus {
    Success,
    /// Pause this queue and deliver the same batch again (the queue's order is kept).
    SuspendCurrentQueueAMoment,
}

/// Handed to an orderly listener with each batch.
#[derive(Debug, Clone)]
pub struct ConsumeOrderlyContext {
    pub queue: MessageQueue,
    /// Pause for a suspended batch; `None` = the consumer's `suspend_current_queue_time`.
    pub suspend_current_queue_time: Option<Duration>,
}

/// A listener for messages consumed in any order, many batches at once.
///
/// Closures `Fn(&[MessageExt], &mut ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus`
/// implement it.
pub trait MessageListenerConcurrently: Send + Sync + 'static {
    fn consume_message(
        &self,
        messages: &[MessageExt],
        context: &mut ConsumeConcurrentlyContext,
    ) -> ConsumeConcurrentlyStatus;
}

impl<F> MessageListenerConcurrently for F
where
    F: Fn(&[MessageExt], &mut ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus
        + Send
        + Sync
        + 'static,
{
    fn consume_message(
        &self,
        messages: &[MessageExt],
        context: &mut ConsumeConcurrentlyContext,
    ) -> ConsumeConcurrentlyStatus {
        self(messages, context)
    }
}

/// A listener for messages consumed one queue at a time, in queue order.
///
/// Closures `Fn(&[MessageExt], &mut ConsumeOrderlyContext) -> ConsumeOrderlyStatus`
/// implement it.
pub trait MessageListenerOrderly: Send + Sync + 'static {
    fn consume_message(
        &self,
        messages: &[MessageExt],
        context: &mut ConsumeOrderlyContext,
    ) -> ConsumeOrderlyStatus;
}

impl<F> MessageListenerOrderly for F
where
    F: Fn(&[MessageExt], &mut ConsumeOrderlyContext) -> ConsumeOrderlyStatus
        + Send
        + Sync
        + 'static,
{
    fn consume_message(
        &self,
        messages: &[MessageExt],
        context: &mut ConsumeOrderlyContext,
    ) -> ConsumeOrderlyStatus {
        self(messages, context)
    }
}

/// The broadcasting offset file: `<offset_store_dir>/<clientIP>@<instanceName>/<group>/offsets.json`,
/// instance name "DEFAULT" unless configured (Java's layout), so a restarted consumer finds it.
/// Two broadcasting consumers of one group on one host need distinct instance names.
pub(crate) fn local_offset_file(options: &ConsumerOptions, instance: &ClientInstance) -> PathBuf {
    let instance_name = options.client.instance_name.as_deref().unwrap_or("DEFAULT");
    let client = format!("{}@{instance_name}", instance.client_ip).replace(['/', '\\', ':'], "_");
    options
        .offset_store_dir
        .join(client)
        .join(&options.group)
        .join("offsets.json")
}

/// The queues of `topic` this consumer owns now (`Err` keeps the current assignment).
async fn allocate(
    instance: &ClientInstance,
    options: &ConsumerOptions,
    topic: &str,
) -> ClientResult<Vec<MessageQueue>> {
    let info = instance
        .route(topic)
        .await?
        .ok_or_else(|| ClientError::NoRoute(topic.to_string()))?;
    let queues = info.subscribe_queues.clone();
    if !options.is_clustering() {
        return Ok(queues);
    }
    let consumers = instance.consumer_ids(topic, &options.group).await?;
    if !consumers.contains(&instance.client_id) {
        // Our heartbeat has not reached that broker yet: decide nothing on a partial view.
        return Err(ClientError::State("not yet registered with the broker"));
    }
    Ok(options
        .allocate_strategy
        .allocate(&instance.client_id, &queues, &consumers))
}

/// One rebalance step for `topic`: `None` while it has no route yet or when allocation fails
/// (the current assignment stays), else the queues this consumer owns now. A heartbeat goes
/// first when the brokers changed, so a new broker knows this consumer before it is asked.
pub(crate) async fn rebalance_topic(
    instance: &ClientInstance,
    options: &ConsumerOptions,
    topic: &str,
) -> Option<Vec<MessageQueue>> {
    instance.route(topic).await.ok().flatten()?;
    instance.heartbeat_if_brokers_changed().await;
    allocate(instance, options, topic).await.ok()
}

/// Where a newly owned queue starts: the committed offset, else per `consume_from_where`
/// (retry queues always from their start).
pub(crate) async fn compute_pull_from_where(
    instance: &ClientInstance,
    options: &ConsumerOptions,
    offsets: &OffsetStore,
    queue: &MessageQueue,
) -> ClientResult<i64> {
    if let Some(offset) = offsets.read_store(queue).await? {
        if offset >= 0 {
            return Ok(offset);
        }
    }
    let is_retry = queue.topic.starts_with(RETRY_TOPIC_PREFIX);
    match options.consume_from_where {
        _ if is_retry => Ok(0),
        ConsumeFromWhere::FirstOffset | ConsumeFromWhere::MinOffset => {
            pull_api::min_offset(instance, queue).await
        }
        ConsumeFromWhere::Timestamp => {
            let timestamp = options
                .consume_timestamp_ms
                .unwrap_or_else(|| now_ms() - CONSUME_TIMESTAMP_LOOKBACK_MS);
            pull_api::search_offset(instance, queue, timestamp).await
        }
        ConsumeFromWhere::LastOffset
        | ConsumeFromWhere::LastOffsetAndFromMinWhenBootFirst
        | ConsumeFromWhere::MaxOffset => pull_api::max_offset(instance, queue).await,
    }
}

/// A message pulled from the group's retry queue gets its original topic back.
pub(crate) fn restore_retry_topic(message: &mut MessageExt, retry_topic: &str) {
    if message.message.topic != retry_topic {
        return;
    }
    if let Some(original) = message.property(property::RETRY_TOPIC).map(str::to_string) {
        message.message.topic = original;
    }
}

/// LOCK_BATCH_MQ for `queues` (grouped by broker); returns the queues now locked by us.
pub(crate) async fn lock_queues(
    instance: &ClientInstance,
    group: &str,
    queues: &[MessageQueue],
) -> Vec<MessageQueue> {
    let mut locked = Vec::new();
    for (addr, request) in lock_batch_requests(instance, group, queues, request_code::LOCK_BATCH_MQ)
    {
        if let Ok(response) = instance.invoke_ok(&addr, &request).await {
            if let Ok(queues) = parse_lock_batch_response(&response.body) {
                locked.extend(queues);
            }
        }
    }
    locked
}

/// UNLOCK_BATCH_MQ for `queues`, waiting for the answers.
pub(crate) async fn unlock_queues(instance: &ClientInstance, group: &str, queues: &[MessageQueue]) {
    let code = request_code::UNLOCK_BATCH_MQ;
    for (addr, request) in lock_batch_requests(instance, group, queues, code) {
        let _ = instance.invoke_ok(&addr, &request).await;
    }
}

/// One LOCK_BATCH_MQ or UNLOCK_BATCH_MQ request (`code`) per broker of `queues` whose master
/// address is known, with that address.
fn lock_batch_requests(
    instance: &ClientInstance,
    group: &str,
    queues: &[MessageQueue],
    code: i32,
) -> Vec<(String, Request)> {
    by_broker(queues)
        .into_iter()
        .filter_map(|(broker_name, queues)| {
            let addr = instance.master_addr(&broker_name)?;
            let body = LockBatchRequest {
                consumer_group: group.to_string(),
                client_id: instance.client_id.clone(),
                mq_set: queues,
                only_this_broker: false,
            }
            .encode();
            Some((addr, Request::new(code).body(body)))
        })
        .collect()
}

fn by_broker(queues: &[MessageQueue]) -> BTreeMap<String, Vec<MessageQueue>> {
    let mut grouped: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
    for queue in queues {
        grouped
            .entry(queue.broker_name.clone())
            .or_default()
            .push(queue.clone());
    }
    grouped
}
