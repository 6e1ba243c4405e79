//! The lite pull consumer (Java `DefaultLitePullConsumer`): the application calls
//! [`LitePullConsumer::poll`] when it wants messages; background tasks keep a bounded buffer
//! filled with LITE_PULL_MESSAGE (361) long polls, one task per queue.
//!
//! Queues come from [`subscribe`](LitePullConsumer::subscribe) (the group rebalances them, as
//! push consumers do) or from [`assign`](LitePullConsumer::assign) (the application chooses).
//! The consumed offset of a queue is one past the last message `poll` returned; it is
//! committed by [`commit_sync`](LitePullConsumer::commit_sync), and every
//! `auto_commit_interval` from `poll` when auto-commit is on. [`seek`](LitePullConsumer::seek)
//! moves a queue: batches pulled before the seek are discarded (each carries the queue's seek
//! generation), so `poll` never returns a message from before a seek.
//!
//! Bounds: at most `pull_threshold_for_queue` messages buffered per queue (its task waits),
//! and [`BUFFERED_BATCHES_MAX`] batches in all (tasks wait on the channel).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::consumer::{
    compute_pull_from_where, local_offset_file, rebalance_topic, ConsumerOptions,
};
use super::error::{ClientError, ClientResult};
use super::instance::{lock, ClientInstance};
use super::message::{now_ms, validate_topic, MessageExt, MessageQueue};
use super::offset_store::{OffsetBackend, OffsetStore};
use super::pull_api::{self, pull, PullSpec, PullStatus};
use crate::body::{ConsumeType, ConsumerData, MessageModel, SubscriptionData};

pub use crate::limits::BUFFERED_BATCHES_MAX;
/// Pause of a queue task held back by its buffer limit or a pause.
const FLOW_CONTROL_DELAY_MS: u64 = 50;

/// A lite pull consumer; see the module docs.
///
/// ```no_run
/// use std::time::Duration;
/// use shardmq_client::{ConsumerOptions, LitePullConsumer};
///
/// # async fn demo() -> Result<(), shardmq_client::ClientError> {
/// let mut consumer = LitePullConsumer::new(ConsumerOptions::new("audit", "127.0.0.1:9876"));
/// consumer.subscribe("orders", "*")?;
/// consumer.start().await?;
/// loop {
///     let messages = consumer.poll(Duration::from_secs(1)).await;
///     for message in &messages {
///         println!("{} at offset {}", message.msg_id, message.queue_offset);
///     }
///     if messages.is_empty() {
///         break;
///     }
/// }
/// consumer.commit_sync().await?;
/// consumer.shutdown().await;
/// # Ok(()) }
/// ```
pub struct LitePullConsumer {
    options: ConsumerOptions,
    auto_commit: bool,
    auto_commit_interval: Duration,
    subscriptions: BTreeMap<String, String>,
    inner: Option<Arc<LiteInner>>,
}

/// Where one queue stands.
#[derive(Debug)]
struct Position {
    /// Bumped by every seek; batches of an older generation are dropped.
    generation: u64,
    /// Next offset to pull; `None` until computed from the committed offset.
    pull_offset: Option<i64>,
}

struct QueueState {
    queue: MessageQueue,
    position: Mutex<Position>,
    dropped: AtomicBool,
    paused: AtomicBool,
    buffered_messages: AtomicUsize,
}

struct QueueEntry {
    state: Arc<QueueState>,
    task: JoinHandle<()>,
}

struct Batch {
    state: Arc<QueueState>,
    generation: u64,
    messages: Vec<MessageExt>,
}

struct LiteInner {
    options: ConsumerOptions,
    instance: Arc<ClientInstance>,
    offsets: OffsetStore,
    /// Subscribe mode: topic → subscription (plus the retry topic when clustering).
    subscriptions: BTreeMap<String, SubscriptionData>,
    table: Mutex<HashMap<MessageQueue, QueueEntry>>,
    batches_tx: mpsc::Sender<Batch>,
    batches_rx: tokio::sync::Mutex<mpsc::Receiver<Batch>>,
    auto_commit: bool,
    auto_commit_interval: Duration,
    last_commit: Mutex<Instant>,
    rebalance_lock: tokio::sync::Mutex<()>,
    shutting_down: AtomicBool,
}

impl LitePullConsumer {
    /// A consumer with auto-commit every 5 s (Java's defaults).
    pub fn new(options: ConsumerOptions) -> LitePullConsumer {
        LitePullConsumer {
            options,
            auto_commit: true,
            auto_commit_interval: Duration::from_millis(5_000),
            subscriptions: BTreeMap::new(),
            inner: None,
        }
    }

    /// Turns auto-commit on or off (before start).
    pub fn set_auto_commit(&mut self, auto_commit: bool) {
        self.auto_commit = auto_commit;
    }

    pub fn set_auto_commit_interval(&mut self, interval: Duration) {
        self.auto_commit_interval = interval;
    }

    /// Subscribes to `topic` with a tag expression (before start); the group shares its queues.
    pub fn subscribe(&mut self, topic: &str, expression: &str) -> ClientResult<()> {
        validate_topic(topic)?;
        if self.inner.is_some() {
            return Err(ClientError::State("already started"));
        }
        self.subscriptions
            .insert(topic.to_string(), expression.to_string());
        Ok(())
    }

    /// Starts the client; in subscribe mode also the rebalance.
    pub async fn start(&mut self) -> ClientResult<()> {
        if self.inner.is_some() {
            return Err(ClientError::State("already started"));
        }
        self.options.validate()?;
        let instance = ClientInstance::start(self.options.client.clone()).await?;
        let version = now_ms();
        // No retry topic: a lite pull consumer never sends messages back.
        let subscriptions: BTreeMap<String, SubscriptionData> = self
            .subscriptions
            .iter()
            .map(|(topic, expression)| {
                (
                    topic.clone(),
                    SubscriptionData::new(topic, expression, version),
                )
            })
            .collect();
        let backend = match self.options.message_model {
            MessageModel::Clustering => OffsetBackend::Broker,
            MessageModel::Broadcasting => {
                OffsetBackend::LocalFile(local_offset_file(&self.options, &instance))
            }
        };
        lock(&instance.heartbeat_source).consumers = vec![ConsumerData {
            group_name: self.options.group.clone(),
            consume_type: ConsumeType::ConsumeActively,
            message_model: self.options.message_model,
            consume_from_where: self.options.consume_from_where,
            unit_mode: false,
            subscriptions: subscriptions.values().cloned().collect(),
        }];
        let (batches_tx, batches_rx) = mpsc::channel(BUFFERED_BATCHES_MAX);
        let inner = Arc::new(LiteInner {
            offsets: OffsetStore::new(instance.clone(), &self.options.group, backend),
            options: self.options.clone(),
            instance,
            subscriptions,
            table: Mutex::default(),
            batches_tx,
            batches_rx: tokio::sync::Mutex::new(batches_rx),
            auto_commit: self.auto_commit,
            auto_commit_interval: self.auto_commit_interval,
            last_commit: Mutex::new(Instant::now()),
            rebalance_lock: tokio::sync::Mutex::new(()),
            shutting_down: AtomicBool::new(false),
        });
        for topic in inner.subscriptions.keys() {
            let _ = inner.instance.update_route(topic).await;
        }
        inner.instance.heartbeat_if_brokers_changed().await;
        if !inner.subscriptions.is_empty() {
            inner
                .instance
                .add_task(tokio::spawn(rebalance_loop(inner.clone())));
        }
        self.inner = Some(inner);
        Ok(())
    }

    fn started(&self) -> ClientResult<&Arc<LiteInner>> {
        self.inner.as_ref().ok_or(ClientError::State("not started"))
    }

    /// The readable queues of `topic` (for [`assign`](Self::assign)).
    pub async fn fetch_message_queues(&self, topic: &str) -> ClientResult<Vec<MessageQueue>> {
        let inner = self.started()?;
        let info = inner
            .instance
            .update_route(topic)
            .await?
            .ok_or_else(|| ClientError::NoRoute(topic.to_string()))?;
        Ok(info.subscribe_queues.clone())
    }

    /// Takes exactly `queues` (assign mode; not with subscriptions): queues not listed any
    /// more are committed and dropped, new ones start at their committed offset.
    pub async fn assign(&self, queues: Vec<MessageQueue>) -> ClientResult<()> {
        let inner = self.started()?;
        if !inner.subscriptions.is_empty() {
            return Err(ClientError::State(
                "subscribed; assign is for unsubscribed consumers",
            ));
        }
        for queue in &queues {
            if inner.instance.master_addr(&queue.broker_name).is_none() {
                let _ = inner.instance.update_route(&queue.topic).await;
            }
        }
        inner.instance.heartbeat_if_brokers_changed().await;
        inner.apply_assignment(None, queues).await;
        Ok(())
    }

    /// The queues this consumer pulls now.
    pub fn assignment(&self) -> Vec<MessageQueue> {
        let Some(inner) = &self.inner else {
            return Vec::new();
        };
        let mut queues: Vec<MessageQueue> = lock(&inner.table).keys().cloned().collect();
        queues.sort();
        queues
    }

    /// The next batch of messages (from one queue), waiting up to `timeout`; empty if none came.
    pub async fn poll(&self, timeout: Duration) -> Vec<MessageExt> {
        let Ok(inner) = self.started() else {
            return Vec::new();
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut receiver = inner.batches_rx.lock().await;
        loop {
            let batch = match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(batch)) => batch,
                _ => return Vec::new(),
            };
            let state = &batch.state;
            state
                .buffered_messages
                .fetch_sub(batch.messages.len(), Ordering::AcqRel);
            let current = lock(&state.position).generation;
            if state.dropped.load(Ordering::Acquire) || batch.generation != current {
                continue;
            }
            if let Some(last) = batch.messages.last() {
                inner
                    .offsets
                    .update(&state.queue, last.queue_offset + 1, false);
            }
            drop(receiver);
            inner.maybe_auto_commit().await;
            return batch.messages;
        }
    }

    /// Moves `queue` to `offset` (between its min and max offsets): the next message polled
    /// from it is the one at `offset`.
    pub async fn seek(&self, queue: &MessageQueue, offset: i64) -> ClientResult<()> {
        let inner = self.started()?;
        let state = inner.queue_state(queue)?;
        let min = pull_api::min_offset(&inner.instance, queue).await?;
        let max = pull_api::max_offset(&inner.instance, queue).await?;
        if offset < min || offset > max {
            return Err(ClientError::InvalidArgument(format!(
                "offset {offset} outside [{min}, {max}] of {queue:?}"
            )));
        }
        {
            let mut position = lock(&state.position);
            position.generation += 1;
            position.pull_offset = Some(offset);
        }
        inner.offsets.update(queue, offset, false);
        Ok(())
    }

    /// [`seek`](Self::seek) to the queue's oldest stored message.
    pub async fn seek_to_begin(&self, queue: &MessageQueue) -> ClientResult<()> {
        let inner = self.started()?;
        let min = pull_api::min_offset(&inner.instance, queue).await?;
        self.seek(queue, min).await
    }

    /// [`seek`](Self::seek) past the queue's newest message.
    pub async fn seek_to_end(&self, queue: &MessageQueue) -> ClientResult<()> {
        let inner = self.started()?;
        let max = pull_api::max_offset(&inner.instance, queue).await?;
        self.seek(queue, max).await
    }

    /// Stops pulling `queues` until [`resume`](Self::resume).
    pub fn pause(&self, queues: &[MessageQueue]) {
        self.set_paused(queues, true);
    }

    pub fn resume(&self, queues: &[MessageQueue]) {
        self.set_paused(queues, false);
    }

    fn set_paused(&self, queues: &[MessageQueue], paused: bool) {
        let Some(inner) = &self.inner else {
            return;
        };
        let table = lock(&inner.table);
        for queue in queues {
            if let Some(entry) = table.get(queue) {
                entry.state.paused.store(paused, Ordering::Release);
            }
        }
    }

    /// Commits the consumed offsets of every assigned queue now.
    pub async fn commit_sync(&self) -> ClientResult<()> {
        let inner = self.started()?;
        inner.commit_all().await
    }

    /// The committed offset of `queue` (broker or local file); `None` if never committed.
    pub async fn committed(&self, queue: &MessageQueue) -> ClientResult<Option<i64>> {
        let inner = self.started()?;
        inner.offsets.fetch_committed(queue).await
    }

    /// Commits (when auto-commit is on), unregisters and closes connections.
    pub async fn shutdown(&self) {
        let Some(inner) = &self.inner else {
            return;
        };
        if inner.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        let _rebalance = inner.rebalance_lock.lock().await;
        let queues: Vec<MessageQueue> = {
            let table = lock(&inner.table);
            for entry in table.values() {
                entry.task.abort();
                entry.state.dropped.store(true, Ordering::Release);
            }
            table.keys().cloned().collect()
        };
        if inner.auto_commit {
            let _ = inner.offsets.persist_all(&queues).await;
        }
        lock(&inner.table).clear();
        inner
            .instance
            .shutdown(None, Some(&inner.options.group))
            .await;
    }
}

impl LiteInner {
    fn queue_state(&self, queue: &MessageQueue) -> ClientResult<Arc<QueueState>> {
        lock(&self.table)
            .get(queue)
            .map(|entry| entry.state.clone())
            .ok_or_else(|| ClientError::InvalidArgument(format!("{queue:?} is not assigned")))
    }

    async fn maybe_auto_commit(&self) {
        if !self.auto_commit {
            return;
        }
        let due = {
            let mut last = lock(&self.last_commit);
            let due = last.elapsed() >= self.auto_commit_interval;
            if due {
                *last = Instant::now();
            }
            due
        };
        if due {
            let _ = self.commit_all().await;
        }
    }

    async fn commit_all(&self) -> ClientResult<()> {
        let queues: Vec<MessageQueue> = lock(&self.table).keys().cloned().collect();
        self.offsets.persist_all(&queues).await
    }

    async fn rebalance(self: &Arc<Self>) {
        let _guard = self.rebalance_lock.lock().await;
        if self.shutting_down.load(Ordering::Acquire) {
            return;
        }
        for topic in self.subscriptions.keys() {
            if let Some(assigned) = rebalance_topic(&self.instance, &self.options, topic).await {
                self.apply_assignment(Some(topic), assigned).await;
            }
        }
    }

    /// Makes the queues of `topic` (every topic when `None`) exactly `assigned`.
    async fn apply_assignment(self: &Arc<Self>, topic: Option<&str>, assigned: Vec<MessageQueue>) {
        let lost: Vec<MessageQueue> = {
            let mut table = lock(&self.table);
            let lost: Vec<MessageQueue> = table
                .keys()
                .filter(|q| topic.is_none_or(|t| q.topic == t) && !assigned.contains(q))
                .cloned()
                .collect();
            for queue in &lost {
                if let Some(entry) = table.remove(queue) {
                    entry.task.abort();
                    entry.state.dropped.store(true, Ordering::Release);
                }
            }
            lost
        };
        for queue in &lost {
            let _ = self.offsets.persist(queue).await;
            self.offsets.remove(queue);
        }
        let mut table = lock(&self.table);
        for queue in assigned {
            if table.contains_key(&queue) {
                continue;
            }
            let state = Arc::new(QueueState {
                queue: queue.clone(),
                position: Mutex::new(Position {
                    generation: 0,
                    pull_offset: None,
                }),
                dropped: AtomicBool::new(false),
                paused: AtomicBool::new(false),
                buffered_messages: AtomicUsize::new(0),
            });
            let task = tokio::spawn(pull_loop(self.clone(), state.clone()));
            table.insert(queue, QueueEntry { state, task });
        }
    }

    fn subscription_for(&self, topic: &str) -> SubscriptionData {
        self.subscriptions
            .get(topic)
            .cloned()
            .unwrap_or_else(|| SubscriptionData::new(topic, "*", 0))
    }
}

async fn rebalance_loop(inner: Arc<LiteInner>) {
    loop {
        inner.rebalance().await;
        tokio::select! {
            _ = tokio::time::sleep(inner.options.rebalance_interval) => {}
            _ = inner.instance.rebalance_now.notified() => {}
        }
    }
}

async fn pull_loop(inner: Arc<LiteInner>, state: Arc<QueueState>) {
    let queue = state.queue.clone();
    let subscription = inner.subscription_for(&queue.topic);
    let suspend_ms = inner.options.broker_suspend_max_time.as_millis() as u64;
    let delay_on_error = inner.options.pull_time_delay_when_exception;
    while !state.dropped.load(Ordering::Acquire) {
        let buffered = state.buffered_messages.load(Ordering::Acquire);
        if state.paused.load(Ordering::Acquire)
            || buffered >= inner.options.pull_threshold_for_queue
        {
            tokio::time::sleep(Duration::from_millis(FLOW_CONTROL_DELAY_MS)).await;
            continue;
        }
        let Some((generation, offset)) = pull_position(&inner, &state).await else {
            tokio::time::sleep(delay_on_error).await;
            continue;
        };
        let spec = PullSpec {
            group: &inner.options.group,
            queue: &queue,
            offset,
            max_nums: inner.options.pull_batch_size,
            commit_offset: None,
            suspend_ms,
            subscription: &subscription,
            lite: true,
        };
        let outcome = match pull(&inner.instance, &spec).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tokio::time::sleep(delay_on_error).await;
                continue;
            }
        };
        {
            let mut position = lock(&state.position);
            if position.generation != generation {
                continue; // A seek moved the queue while this pull was out.
            }
            position.pull_offset = Some(outcome.next_begin_offset);
        }
        if outcome.status == PullStatus::Found && !outcome.messages.is_empty() {
            let messages = outcome.messages;
            state
                .buffered_messages
                .fetch_add(messages.len(), Ordering::AcqRel);
            let batch = Batch {
                state: state.clone(),
                generation,
                messages,
            };
            if inner.batches_tx.send(batch).await.is_err() {
                return;
            }
        }
    }
}

/// The queue's seek generation and next offset to pull; the first call computes the offset
/// from the committed one (`None` when that failed: try again later).
async fn pull_position(inner: &LiteInner, state: &QueueState) -> Option<(u64, i64)> {
    let (generation, offset) = {
        let position = lock(&state.position);
        (position.generation, position.pull_offset)
    };
    if let Some(offset) = offset {
        return Some((generation, offset));
    }
    let offset = compute_pull_from_where(
        &inner.instance,
        &inner.options,
        &inner.offsets,
        &state.queue,
    )
    .await
    .ok()?;
    let mut position = lock(&state.position);
    if position.generation == generation {
        position.pull_offset = Some(offset);
    }
    Some((position.generation, position.pull_offset.unwrap_or(offset)))
}
