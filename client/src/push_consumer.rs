//! The push consumer (Java `DefaultMQPushConsumer`): the client pulls with long polling and
//! calls the user's listener for each batch, as if the broker pushed.
//!
//! Tasks of one started consumer (all tokio tasks, aborted at shutdown):
//! - **rebalance**: at start, every `rebalance_interval` (20 s) and on
//!   NOTIFY_CONSUMER_IDS_CHANGED; computes the owned queues (see [`super::consumer`]), drops the
//!   ones it lost (commits their offsets; orderly: unlocks them) and starts the new ones.
//! - **one pull task per owned queue**: long-polls PULL_MESSAGE (15 s hold), applies flow
//!   control (`pull_threshold_for_queue` messages, `..._size_...` bytes,
//!   `consume_concurrently_max_span` offsets) and hands messages to the consume side.
//! - **consume**: concurrent listeners run up to `consume_thread_max` batches at once on the
//!   blocking pool; failed messages go back to the broker (CONSUMER_SEND_MSG_BACK, or a resend
//!   to `%RETRY%<group>` if the broker refuses) and are retried locally after 5 s if both fail.
//!   Orderly listeners consume one batch per queue at a time, in offset order, only while the
//!   broker lock (LOCK_BATCH_MQ, renewed every `lock_interval`) is held.
//! - **offset commit** every `persist_consumer_offset_interval` (5 s) and at shutdown: to the
//!   broker (clustering) or a local file (broadcasting).
//!
//! Delivery is at least once: an offset only moves past messages the listener accepted or that
//! were sent back, so a crash or a rebalance can deliver a message twice, never lose one.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::connection::Request;
use super::consumer::{
    compute_pull_from_where, local_offset_file, lock_queues, rebalance_topic, restore_retry_topic,
    unlock_queues, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, ConsumerOptions, MessageListenerConcurrently, MessageListenerOrderly,
};
use super::error::{ClientError, ClientResult};
use super::instance::{lock, ClientInstance};
use super::message::{Message, MessageExt, MessageQueue};
use super::offset_store::{OffsetBackend, OffsetStore};
use super::producer::{Producer, ProducerOptions};
use super::pull_api::{pull, PullSpec, PullStatus};
use crate::body::{property, ConsumeType, ConsumerData, MessageModel, SubscriptionData};
use crate::remoting::{request_code, response_code};

/// Wait before a message whose send-back failed is consumed again locally (Java: 5 s).
const LOCAL_RETRY_DELAY_MS: u64 = 5_000;
/// Pause of a pull task held back by flow control (Java: 50 ms).
const FLOW_CONTROL_DELAY_MS: u64 = 50;
/// Pause of an orderly queue waiting for its broker lock.
const LOCK_WAIT_DELAY_MS: u64 = 200;
/// How long dropping an orderly queue waits for its running batch before unlocking anyway.
const ORDERLY_DROP_WAIT_MS: u64 = 1_000;
/// Producer group of the resend fallback (Java `CLIENT_INNER_PRODUCER`).
const CLIENT_INNER_PRODUCER_GROUP: &str = "CLIENT_INNER_PRODUCER";

#[derive(Clone)]
enum Listener {
    Concurrently(Arc<dyn MessageListenerConcurrently>),
    Orderly(Arc<dyn MessageListenerOrderly>),
}

/// A push consumer; configure, [`start`](PushConsumer::start), then
/// [`shutdown`](PushConsumer::shutdown).
///
/// ```no_run
/// use shardmq_client::{
///     ConsumeConcurrentlyStatus, ConsumerOptions, PushConsumer,
/// };
///
/// # async fn demo() -> Result<(), shardmq_client::ClientError> {
/// let mut consumer = PushConsumer::new(ConsumerOptions::new("order-readers", "127.0.0.1:9876"));
/// consumer.subscribe("orders", "created || paid")?;
/// consumer.register_message_listener_concurrently(|messages: &[_], _context: &mut _| {
///     for message in messages {
///         let message: &shardmq_client::MessageExt = message;
///         println!("{} {:?}", message.msg_id, String::from_utf8_lossy(message.body()));
///     }
///     ConsumeConcurrentlyStatus::ConsumeSuccess
/// });
/// consumer.start().await?;
/// // ... later
/// consumer.shutdown().await;
/// # Ok(()) }
/// ```
pub struct PushConsumer {
    options: ConsumerOptions,
    subscriptions: BTreeMap<String, String>,
    listener: Option<Listener>,
    inner: Option<Arc<PushInner>>,
}

struct QueueEntry {
    process_queue: Arc<ProcessQueueHandle>,
    pull_task: JoinHandle<()>,
}

/// A process queue plus the per-queue facts the tasks need.
struct ProcessQueueHandle {
    queue: MessageQueue,
    state: super::process_queue::ProcessQueue,
}

struct PushInner {
    options: ConsumerOptions,
    instance: Arc<ClientInstance>,
    offsets: OffsetStore,
    listener: Listener,
    subscriptions: BTreeMap<String, SubscriptionData>,
    table: Mutex<HashMap<MessageQueue, QueueEntry>>,
    consume_permits: Arc<Semaphore>,
    /// Resends failed messages to the retry topic when CONSUMER_SEND_MSG_BACK fails.
    fallback_producer: tokio::sync::OnceCell<Producer>,
    rebalance_lock: tokio::sync::Mutex<()>,
    shutting_down: AtomicBool,
}

impl PushConsumer {
    pub fn new(options: ConsumerOptions) -> PushConsumer {
        PushConsumer {
            options,
            subscriptions: BTreeMap::new(),
            listener: None,
            inner: None,
        }
    }

    /// Subscribes to `topic` with a tag expression: `"*"`, `"a"` or `"a || b"`.
    pub fn subscribe(&mut self, topic: &str, expression: &str) -> ClientResult<()> {
        super::message::validate_topic(topic)?;
        if self.inner.is_some() {
            return Err(ClientError::State("already started"));
        }
        self.subscriptions
            .insert(topic.to_string(), expression.to_string());
        Ok(())
    }

    /// Messages go to `listener`, many batches at once, in no particular order.
    pub fn register_message_listener_concurrently(
        &mut self,
        listener: impl MessageListenerConcurrently,
    ) {
        self.listener = Some(Listener::Concurrently(Arc::new(listener)));
    }

    /// Messages go to `listener` one queue at a time, in queue order (clustering: only while
    /// this consumer holds the queue's broker lock).
    pub fn register_message_listener_orderly(&mut self, listener: impl MessageListenerOrderly) {
        self.listener = Some(Listener::Orderly(Arc::new(listener)));
    }

    /// This consumer's client id (after start).
    pub fn client_id(&self) -> Option<&str> {
        self.inner
            .as_ref()
            .map(|inner| inner.instance.client_id.as_str())
    }

    /// The queues this consumer owns now (after start).
    pub fn assigned_queues(&self) -> Vec<MessageQueue> {
        let Some(inner) = &self.inner else {
            return Vec::new();
        };
        let mut queues: Vec<MessageQueue> = lock(&inner.table).keys().cloned().collect();
        queues.sort();
        queues
    }

    /// Starts: routes, heartbeat, first rebalance, timers.
    pub async fn start(&mut self) -> ClientResult<()> {
        if self.inner.is_some() {
            return Err(ClientError::State("already started"));
        }
        self.options.validate()?;
        let listener = self
            .listener
            .clone()
            .ok_or(ClientError::State("missing a message listener"))?;
        if self.subscriptions.is_empty() {
            return Err(ClientError::State("missing a subscription"));
        }
        let instance = ClientInstance::start(self.options.client.clone()).await?;
        let inner = Arc::new(PushInner::new(
            self.options.clone(),
            instance,
            listener,
            &self.subscriptions,
        ));
        for topic in inner.subscriptions.keys() {
            let _ = inner.instance.update_route(topic).await;
        }
        inner.instance.heartbeat_if_brokers_changed().await;
        let rebalance = tokio::spawn(rebalance_loop(inner.clone()));
        let persist = tokio::spawn(persist_loop(inner.clone()));
        inner.instance.add_task(rebalance);
        inner.instance.add_task(persist);
        if matches!(inner.listener, Listener::Orderly(_)) && inner.options.is_clustering() {
            inner
                .instance
                .add_task(tokio::spawn(lock_loop(inner.clone())));
        }
        self.inner = Some(inner);
        Ok(())
    }

    /// Runs a rebalance now (it also runs on its own timer and on notifications).
    pub async fn rebalance_now(&self) {
        if let Some(inner) = &self.inner {
            inner.rebalance().await;
        }
    }

    /// Stops pulling, waits up to `await_termination` for running listener calls, commits
    /// offsets (orderly: releases the broker locks), unregisters and closes connections.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        if inner.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        let _rebalance = inner.rebalance_lock.lock().await;
        let entries: Vec<(MessageQueue, Arc<ProcessQueueHandle>)> = {
            let table = lock(&inner.table);
            for entry in table.values() {
                entry.pull_task.abort();
            }
            table
                .iter()
                .map(|(queue, entry)| (queue.clone(), entry.process_queue.clone()))
                .collect()
        };
        let permits = inner.options.consume_thread_max as u32;
        let _ = tokio::time::timeout(
            inner.options.await_termination,
            inner.consume_permits.acquire_many(permits),
        )
        .await;
        for (_, process_queue) in &entries {
            process_queue.state.mark_dropped();
        }
        let queues: Vec<MessageQueue> = entries.into_iter().map(|(queue, _)| queue).collect();
        let _ = inner.offsets.persist_all(&queues).await;
        if matches!(inner.listener, Listener::Orderly(_)) && inner.options.is_clustering() {
            unlock_queues(&inner.instance, &inner.options.group, &queues).await;
        }
        lock(&inner.table).clear();
        if let Some(producer) = inner.fallback_producer.get() {
            producer.shutdown().await;
        }
        inner
            .instance
            .shutdown(None, Some(&inner.options.group))
            .await;
    }
}

impl PushInner {
    fn new(
        options: ConsumerOptions,
        instance: Arc<ClientInstance>,
        listener: Listener,
        expressions: &BTreeMap<String, String>,
    ) -> PushInner {
        let version = super::message::now_ms();
        let mut subscriptions: BTreeMap<String, SubscriptionData> = expressions
            .iter()
            .map(|(topic, expression)| {
                (
                    topic.clone(),
                    SubscriptionData::new(topic, expression, version),
                )
            })
            .collect();
        if options.is_clustering() {
            let retry = options.retry_topic();
            subscriptions.insert(retry.clone(), SubscriptionData::new(&retry, "*", version));
        }
        lock(&instance.heartbeat_source).consumers = vec![ConsumerData {
            group_name: options.group.clone(),
            consume_type: ConsumeType::ConsumePassively,
            message_model: options.message_model,
            consume_from_where: options.consume_from_where,
            unit_mode: false,
            subscriptions: subscriptions.values().cloned().collect(),
        }];
        let backend = match options.message_model {
            MessageModel::Clustering => OffsetBackend::Broker,
            MessageModel::Broadcasting => {
                OffsetBackend::LocalFile(local_offset_file(&options, &instance))
            }
        };
        PushInner {
            offsets: OffsetStore::new(instance.clone(), &options.group, backend),
            consume_permits: Arc::new(Semaphore::new(options.consume_thread_max)),
            options,
            instance,
            listener,
            subscriptions,
            table: Mutex::default(),
            fallback_producer: tokio::sync::OnceCell::new(),
            rebalance_lock: tokio::sync::Mutex::new(()),
            shutting_down: AtomicBool::new(false),
        }
    }

    fn is_orderly(&self) -> bool {
        matches!(self.listener, Listener::Orderly(_))
    }

    async fn rebalance(self: &Arc<Self>) {
        let _guard = self.rebalance_lock.lock().await;
        if self.shutting_down.load(Ordering::Acquire) {
            return;
        }
        for topic in self.subscriptions.keys() {
            if let Some(assigned) = rebalance_topic(&self.instance, &self.options, topic).await {
                self.apply_assignment(topic, assigned).await;
            }
        }
    }

    async fn apply_assignment(self: &Arc<Self>, topic: &str, assigned: Vec<MessageQueue>) {
        let lost: Vec<(MessageQueue, Arc<ProcessQueueHandle>)> = {
            let mut table = lock(&self.table);
            let lost_queues: Vec<MessageQueue> = table
                .keys()
                .filter(|queue| queue.topic == topic && !assigned.contains(queue))
                .cloned()
                .collect();
            lost_queues
                .into_iter()
                .filter_map(|queue| {
                    let entry = table.remove(&queue)?;
                    entry.pull_task.abort();
                    entry.process_queue.state.mark_dropped();
                    Some((queue, entry.process_queue))
                })
                .collect()
        };
        for (queue, process_queue) in lost {
            self.release_queue(&queue, &process_queue).await;
        }
        let new_queues: Vec<MessageQueue> = {
            let table = lock(&self.table);
            assigned
                .into_iter()
                .filter(|queue| !table.contains_key(queue))
                .collect()
        };
        for queue in new_queues {
            self.take_queue(queue).await;
        }
    }

    /// Commits a lost queue's offset (orderly: after its running batch, then unlocks it).
    async fn release_queue(&self, queue: &MessageQueue, process_queue: &ProcessQueueHandle) {
        if self.is_orderly() && self.options.is_clustering() {
            let running = process_queue.state.consume_lock.lock();
            let _guard =
                tokio::time::timeout(Duration::from_millis(ORDERLY_DROP_WAIT_MS), running).await;
            let _ = self.offsets.persist(queue).await;
            unlock_queues(
                &self.instance,
                &self.options.group,
                std::slice::from_ref(queue),
            )
            .await;
        } else {
            let _ = self.offsets.persist(queue).await;
        }
        self.offsets.remove(queue);
    }

    async fn take_queue(self: &Arc<Self>, queue: MessageQueue) {
        let orderly_clustering = self.is_orderly() && self.options.is_clustering();
        if orderly_clustering {
            let locked = lock_queues(
                &self.instance,
                &self.options.group,
                std::slice::from_ref(&queue),
            )
            .await;
            if !locked.contains(&queue) {
                return; // Another consumer still holds it; the next rebalance tries again.
            }
        }
        self.offsets.remove(&queue);
        let Ok(next_offset) =
            compute_pull_from_where(&self.instance, &self.options, &self.offsets, &queue).await
        else {
            return;
        };
        let process_queue = Arc::new(ProcessQueueHandle {
            queue: queue.clone(),
            state: super::process_queue::ProcessQueue::new(),
        });
        if orderly_clustering {
            process_queue.state.set_locked(true);
        }
        let pull_task = tokio::spawn(pull_loop(self.clone(), process_queue.clone(), next_offset));
        lock(&self.table).insert(
            queue,
            QueueEntry {
                process_queue,
                pull_task,
            },
        );
    }

    fn queues(&self) -> Vec<MessageQueue> {
        lock(&self.table).keys().cloned().collect()
    }

    /// Flow control: true when the queue has too much cached to pull more now.
    fn must_wait(&self, process_queue: &ProcessQueueHandle) -> bool {
        let state = &process_queue.state;
        state.cached_count() > self.options.pull_threshold_for_queue
            || state.cached_size_bytes() > self.options.pull_threshold_size_for_queue_bytes
            || (!self.is_orderly()
                && state.offset_span() > self.options.consume_concurrently_max_span)
            || (self.is_orderly() && self.options.is_clustering() && !state.is_locked())
    }

    fn dispatch(
        self: &Arc<Self>,
        process_queue: &Arc<ProcessQueueHandle>,
        messages: Vec<MessageExt>,
    ) {
        match &self.listener {
            Listener::Concurrently(_) => {
                process_queue.state.put(messages.clone());
                let batch = self.options.consume_message_batch_max_size;
                for chunk in messages.chunks(batch) {
                    tokio::spawn(consume_concurrently(
                        self.clone(),
                        process_queue.clone(),
                        chunk.to_vec(),
                    ));
                }
            }
            Listener::Orderly(_) => {
                if process_queue.state.put(messages) {
                    tokio::spawn(consume_orderly(self.clone(), process_queue.clone()));
                }
            }
        }
    }

    /// Sends a failed message back for a later retry: CONSUMER_SEND_MSG_BACK to the broker it
    /// came from, else a resend to the group's retry topic.
    async fn send_back(&self, message: &MessageExt, delay_level: i32) -> ClientResult<()> {
        let back = self.send_back_to_broker(message, delay_level).await;
        if back.is_ok() {
            return back;
        }
        let producer = self
            .fallback_producer
            .get_or_try_init(|| async {
                let mut options = ProducerOptions::new(CLIENT_INNER_PRODUCER_GROUP, "unused:0");
                options.client = self.options.client.clone();
                Producer::start(options).await
            })
            .await?;
        let mut resend = Message::new(self.options.retry_topic(), message.body().to_vec());
        resend.flag = message.message.flag;
        for (name, value) in message.message.properties() {
            resend.set_property(name.clone(), value.clone());
        }
        if resend.property(property::RETRY_TOPIC).is_none() {
            resend.set_property(property::RETRY_TOPIC, message.topic());
        }
        if resend.property(property::ORIGIN_MESSAGE_ID).is_none() {
            resend.set_property(property::ORIGIN_MESSAGE_ID, message.msg_id.clone());
        }
        resend.set_property(
            property::RECONSUME_TIME,
            (message.reconsume_times + 1).to_string(),
        );
        resend.set_property(
            property::MAX_RECONSUME_TIMES,
            self.options.max_reconsume_times.to_string(),
        );
        resend.remove_property(property::TRAN_MSG);
        let delay = match delay_level {
            level if level < 0 => 0,
            0 => 3 + message.reconsume_times,
            level => level,
        };
        if delay > 0 {
            resend.set_property(property::DELAY, delay.min(18).to_string());
        }
        producer.send(resend).await.map(|_| ())
    }

    async fn send_back_to_broker(
        &self,
        message: &MessageExt,
        delay_level: i32,
    ) -> ClientResult<()> {
        let addr = self.instance.require_master_addr(&message.broker_name)?;
        let request = Request::new(request_code::CONSUMER_SEND_MSG_BACK)
            .ext("offset", message.commit_log_offset)
            .ext("group", &self.options.group)
            .ext("delayLevel", delay_level)
            .ext("originMsgId", &message.msg_id)
            .ext("originTopic", message.topic())
            .ext("unitMode", "false")
            .ext("maxReconsumeTimes", self.options.max_reconsume_times);
        let response = self
            .instance
            .remoting
            .invoke(&addr, &request, self.instance.config.request_timeout)
            .await?;
        if response.code != response_code::SUCCESS {
            return Err(response.into_error(&addr));
        }
        Ok(())
    }
}

async fn rebalance_loop(inner: Arc<PushInner>) {
    loop {
        inner.rebalance().await;
        tokio::select! {
            _ = tokio::time::sleep(inner.options.rebalance_interval) => {}
            _ = inner.instance.rebalance_now.notified() => {}
        }
    }
}

async fn persist_loop(inner: Arc<PushInner>) {
    loop {
        tokio::time::sleep(inner.options.persist_consumer_offset_interval).await;
        let queues = inner.queues();
        let _ = inner.offsets.persist_all(&queues).await;
    }
}

async fn lock_loop(inner: Arc<PushInner>) {
    loop {
        tokio::time::sleep(inner.options.lock_interval).await;
        let entries: Vec<(MessageQueue, Arc<ProcessQueueHandle>)> = lock(&inner.table)
            .iter()
            .map(|(queue, entry)| (queue.clone(), entry.process_queue.clone()))
            .collect();
        let queues: Vec<MessageQueue> = entries.iter().map(|(queue, _)| queue.clone()).collect();
        let locked = lock_queues(&inner.instance, &inner.options.group, &queues).await;
        for (queue, process_queue) in entries {
            process_queue.state.set_locked(locked.contains(&queue));
        }
    }
}

async fn pull_loop(
    inner: Arc<PushInner>,
    process_queue: Arc<ProcessQueueHandle>,
    mut next_offset: i64,
) {
    let queue = process_queue.queue.clone();
    let Some(subscription) = inner.subscriptions.get(&queue.topic).cloned() else {
        return;
    };
    let retry_topic = inner.options.retry_topic();
    let suspend_ms = inner.options.broker_suspend_max_time.as_millis() as u64;
    while !process_queue.state.is_dropped() {
        if inner.must_wait(&process_queue) {
            tokio::time::sleep(Duration::from_millis(FLOW_CONTROL_DELAY_MS)).await;
            continue;
        }
        let commit_offset = if inner.options.is_clustering() {
            inner.offsets.read_memory(&queue)
        } else {
            None
        };
        let spec = PullSpec {
            group: &inner.options.group,
            queue: &queue,
            offset: next_offset,
            max_nums: inner.options.pull_batch_size,
            commit_offset,
            suspend_ms,
            subscription: &subscription,
            lite: false,
        };
        let outcome = match pull(&inner.instance, &spec).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tokio::time::sleep(inner.options.pull_time_delay_when_exception).await;
                continue;
            }
        };
        if process_queue.state.is_dropped() {
            return;
        }
        next_offset = outcome.next_begin_offset;
        match outcome.status {
            PullStatus::Found if !outcome.messages.is_empty() => {
                let mut messages = outcome.messages;
                for message in &mut messages {
                    restore_retry_topic(message, &retry_topic);
                }
                inner.dispatch(&process_queue, messages);
            }
            PullStatus::Found | PullStatus::NoNewMessage | PullStatus::NoMatchedMessage => {
                // Nothing cached: the offset may move past filtered-out messages.
                if process_queue.state.cached_count() == 0 {
                    inner.offsets.update(&queue, next_offset, true);
                }
            }
            PullStatus::OffsetIllegal => {
                inner.offsets.update(&queue, next_offset, false);
                let _ = inner.offsets.persist(&queue).await;
            }
        }
    }
}

/// Consumes one batch; messages whose send-back failed are consumed again after
/// [`LOCAL_RETRY_DELAY_MS`], until they succeed, are sent back, or the queue is dropped.
async fn consume_concurrently(
    inner: Arc<PushInner>,
    process_queue: Arc<ProcessQueueHandle>,
    mut messages: Vec<MessageExt>,
) {
    loop {
        let retry_locally = consume_batch(&inner, &process_queue, messages).await;
        if retry_locally.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(LOCAL_RETRY_DELAY_MS)).await;
        messages = retry_locally;
    }
}

/// Calls a user listener (`consume`) with `messages` and `context` on the blocking pool, so a
/// slow listener never stalls the runtime; one that panicked yields `on_panic`'s context and
/// status instead. Gives the messages back with the context and status.
async fn call_listener<C, S>(
    messages: Vec<MessageExt>,
    mut context: C,
    consume: impl FnOnce(&[MessageExt], &mut C) -> S + Send + 'static,
    on_panic: impl FnOnce() -> (C, S),
) -> (Vec<MessageExt>, C, S)
where
    C: Send + 'static,
    S: Send + 'static,
{
    let batch = Arc::new(messages);
    let handed = batch.clone();
    let call = tokio::task::spawn_blocking(move || {
        let status = consume(&handed, &mut context);
        (context, status)
    });
    let (context, status) = call.await.unwrap_or_else(|_| on_panic());
    (Arc::unwrap_or_clone(batch), context, status)
}

/// One listener call; returns the messages to consume again locally.
async fn consume_batch(
    inner: &Arc<PushInner>,
    process_queue: &Arc<ProcessQueueHandle>,
    messages: Vec<MessageExt>,
) -> Vec<MessageExt> {
    let Listener::Concurrently(listener) = inner.listener.clone() else {
        return Vec::new();
    };
    let Ok(permit) = inner.consume_permits.clone().acquire_owned().await else {
        return Vec::new();
    };
    if process_queue.state.is_dropped() {
        return Vec::new();
    }
    let queue = process_queue.queue.clone();
    let context = ConsumeConcurrentlyContext {
        queue: queue.clone(),
        delay_level_when_next_consume: 0,
        ack_index: messages.len().saturating_sub(1),
    };
    let consume = move |batch: &[MessageExt], context: &mut ConsumeConcurrentlyContext| {
        listener.consume_message(batch, context)
    };
    // A listener that panicked failed the batch, as a Java listener that throws does.
    let (messages, context, status) = call_listener(messages, context, consume, || {
        let context = ConsumeConcurrentlyContext {
            queue: queue.clone(),
            delay_level_when_next_consume: 0,
            ack_index: 0,
        };
        (context, ConsumeConcurrentlyStatus::ReconsumeLater)
    })
    .await;
    drop(permit);
    let acked = match status {
        ConsumeConcurrentlyStatus::ConsumeSuccess => (context.ack_index + 1).min(messages.len()),
        ConsumeConcurrentlyStatus::ReconsumeLater => 0,
    };
    let mut retry_locally = Vec::new();
    if inner.options.is_clustering() {
        for message in &messages[acked..] {
            if inner
                .send_back(message, context.delay_level_when_next_consume)
                .await
                .is_err()
            {
                let mut again = message.clone();
                again.reconsume_times += 1;
                retry_locally.push(again);
            }
        }
    }
    let done: Vec<i64> = messages
        .iter()
        .filter(|m| {
            !retry_locally
                .iter()
                .any(|r| r.queue_offset == m.queue_offset)
        })
        .map(|m| m.queue_offset)
        .collect();
    if let Some(offset) = process_queue.state.remove(&done) {
        if !process_queue.state.is_dropped() {
            inner.offsets.update(&queue, offset, true);
        }
    }
    retry_locally
}

async fn consume_orderly(inner: Arc<PushInner>, process_queue: Arc<ProcessQueueHandle>) {
    let Listener::Orderly(listener) = inner.listener.clone() else {
        return;
    };
    let queue = process_queue.queue.clone();
    let must_lock = inner.options.is_clustering();
    loop {
        if process_queue.state.is_dropped() {
            return;
        }
        if must_lock && !process_queue.state.is_locked() {
            tokio::time::sleep(Duration::from_millis(LOCK_WAIT_DELAY_MS)).await;
            continue;
        }
        let Ok(_permit) = inner.consume_permits.clone().acquire_owned().await else {
            return;
        };
        let running = process_queue.state.consume_lock.lock().await;
        if process_queue.state.is_dropped() {
            return;
        }
        let messages = process_queue
            .state
            .take(inner.options.consume_message_batch_max_size);
        if messages.is_empty() {
            return;
        }
        let listener = listener.clone();
        let context = ConsumeOrderlyContext {
            queue: queue.clone(),
            suspend_current_queue_time: None,
        };
        let consume = move |batch: &[MessageExt], context: &mut ConsumeOrderlyContext| {
            listener.consume_message(batch, context)
        };
        // A listener that panicked suspends the queue, as a Java listener that throws does.
        let (messages, context, status) = call_listener(messages, context, consume, || {
            let context = ConsumeOrderlyContext {
                queue: queue.clone(),
                suspend_current_queue_time: None,
            };
            (context, ConsumeOrderlyStatus::SuspendCurrentQueueAMoment)
        })
        .await;
        let committed = match status {
            ConsumeOrderlyStatus::Success => true,
            ConsumeOrderlyStatus::SuspendCurrentQueueAMoment => {
                inner
                    .give_up_or_retry(&process_queue, messages, &context)
                    .await
            }
        };
        if committed {
            if let Some(offset) = process_queue.state.commit() {
                if !process_queue.state.is_dropped() {
                    inner.offsets.update(&queue, offset, false);
                }
            }
        }
        drop(running);
        if !committed {
            let pause = context
                .suspend_current_queue_time
                .unwrap_or(inner.options.suspend_current_queue_time);
            tokio::time::sleep(pause).await;
        }
    }
}

impl PushInner {
    /// An orderly batch failed: messages past `max_reconsume_times` go to the dead-letter
    /// queue and the batch counts as consumed (true); otherwise it is put back (false).
    async fn give_up_or_retry(
        &self,
        process_queue: &ProcessQueueHandle,
        mut messages: Vec<MessageExt>,
        _context: &ConsumeOrderlyContext,
    ) -> bool {
        let exhausted = messages
            .iter()
            .any(|m| m.reconsume_times >= self.options.max_reconsume_times);
        if exhausted && self.options.is_clustering() {
            let mut all_sent = true;
            for message in &messages {
                // delayLevel -1: straight to the dead-letter queue.
                all_sent &= self.send_back(message, -1).await.is_ok();
            }
            if all_sent {
                return true;
            }
        } else if exhausted {
            return true; // Broadcasting: nowhere to send it; skip it.
        }
        for message in &mut messages {
            message.reconsume_times += 1;
        }
        process_queue.state.make_available_again(messages);
        false
    }
}
