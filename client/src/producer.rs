//! The producer (Java `DefaultMQProducer`): sync, async (pipelined), oneway and batch sends,
//! queue selectors, retries that avoid the broker that just failed or was slow, compression
//! of large bodies.
//!
//! Send path: route (cached; refreshed every 30 s by the instance; the template topic TBW102
//! for a topic the cluster does not know yet) → pick a queue ([`LatencyFaultTolerance`]) →
//! SEND_MESSAGE_V2 (310) or SEND_BATCH_MESSAGE (320) to that broker's master → on a retryable
//! failure (no answer, connection lost, codes 1 2 14 16 17 204 205 1500) the next attempt
//! picks a queue on another broker, up to `retry_times_when_send_failed` more times and within
//! `send_timeout` overall. Every send is one request on the broker's shared connection, so
//! concurrent sends (from many tasks, or [`Producer::send_async`]) are pipelined on it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::connection::{is_send_stored, Request, Response};
use super::error::{ClientError, ClientResult};
use super::fault::LatencyFaultTolerance;
use super::instance::DEFAULT_TOPIC_QUEUE_NUMS;
use super::instance::{lock, ClientConfig, ClientInstance, AUTO_CREATE_TOPIC_KEY_TOPIC};
use super::message::{
    compress, encode_batch, now_ms, Message, MessageQueue, MESSAGE_BODY_MAX_BYTES,
    RETRY_TOPIC_PREFIX, SYS_FLAG_COMPRESSED, SYS_FLAG_TRANSACTION_PREPARED,
};
use crate::body::{java_string_hash, property};
use crate::remoting::{request_code, response_code};

pub use crate::limits::BATCH_MESSAGES_MAX;

/// Producer settings; [`ProducerOptions::new`] gives Java's defaults.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    pub group: String,
    pub client: ClientConfig,
    /// Deadline of one send, retries included.
    pub send_timeout: Duration,
    /// Extra attempts after a retryable failure (Java `retryTimesWhenSendFailed`, 2).
    pub retry_times_when_send_failed: u32,
    /// Bodies at least this long are zlib-compressed (Java `compressMsgBodyOverHowmuch`).
    pub compress_over_bytes: usize,
    /// zlib level (Java default 5).
    pub compress_level: u32,
    /// Largest body accepted (the broker's limit, 4 MiB).
    pub max_message_size_bytes: usize,
    /// Skip brokers that were slow or failed lately (Java `sendLatencyFaultEnable`).
    pub send_latency_fault_enable: bool,
}

impl ProducerOptions {
    /// Defaults for producer group `group` and name servers `namesrv` ("host:port;...").
    pub fn new(group: &str, namesrv: &str) -> ProducerOptions {
        ProducerOptions {
            group: group.to_string(),
            client: ClientConfig::new(namesrv),
            send_timeout: Duration::from_millis(3_000),
            retry_times_when_send_failed: 2,
            compress_over_bytes: 4 * 1024,
            compress_level: 5,
            max_message_size_bytes: MESSAGE_BODY_MAX_BYTES,
            send_latency_fault_enable: true,
        }
    }
}

/// How a stored send was acknowledged (codes 0, 10, 12, 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    SendOk,
    FlushDiskTimeout,
    FlushSlaveTimeout,
    SlaveNotAvailable,
}

/// The broker's acknowledgement of a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    pub status: SendStatus,
    /// The client id(s) (UNIQ_KEY) of the message(s), comma-joined for a batch.
    pub msg_id: String,
    /// The broker's offset id(s) (store host + commitlog offset), comma-joined for a batch.
    pub offset_msg_id: String,
    /// The queue the message went to.
    pub queue: MessageQueue,
    /// Queue offset of the (first) message.
    pub queue_offset: i64,
    pub transaction_id: Option<String>,
}

/// Picks the queue for [`Producer::send_with_selector`].
pub trait MessageQueueSelector: Send + Sync {
    /// An index into `queues` (taken modulo its length).
    fn select(&self, queues: &[MessageQueue], message: &Message, arg: &str) -> usize;
}

/// Same `arg` (a sharding key: order id, user id), same queue: Java `SelectMessageQueueByHash`,
/// with Java's `String.hashCode`, so Java and Rust producers agree on the queue.
#[derive(Debug, Default, Clone, Copy)]
pub struct SelectByHash;

impl MessageQueueSelector for SelectByHash {
    fn select(&self, queues: &[MessageQueue], _message: &Message, arg: &str) -> usize {
        java_string_hash(arg).unsigned_abs() as usize % queues.len().max(1)
    }
}

/// Queues in turn, whatever the argument.
#[derive(Debug, Default)]
pub struct SelectByRoundRobin {
    next: AtomicU32,
}

impl MessageQueueSelector for SelectByRoundRobin {
    fn select(&self, queues: &[MessageQueue], _message: &Message, _arg: &str) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) as usize % queues.len().max(1)
    }
}

/// How a send waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendMode {
    /// Wait for the broker's answer.
    Sync,
    /// Write the request with the oneway flag; no answer.
    Oneway,
}

/// Where a send goes.
enum Target<'a> {
    /// Let the fault strategy pick (retries move to another broker).
    Any,
    Queue(&'a MessageQueue),
    Selector(&'a dyn MessageQueueSelector, &'a str),
}

/// A started producer. Cheap to clone (shared inside); shut it down with
/// [`Producer::shutdown`].
///
/// ```no_run
/// use shardmq_client::{Message, Producer, ProducerOptions, SelectByHash};
///
/// # async fn demo() -> Result<(), shardmq_client::ClientError> {
/// let producer = Producer::start(ProducerOptions::new("my-producers", "127.0.0.1:9876")).await?;
/// // Sync: waits for the broker's acknowledgement.
/// let result = producer.send(Message::new("orders", "created #1").with_tags("created")).await?;
/// println!("stored at {:?} offset {}", result.queue, result.queue_offset);
/// // Ordered per key: every message of order 42 goes to the same queue.
/// producer.send_with_selector(Message::new("orders", "paid #42"), &SelectByHash, "42").await?;
/// // Oneway: no acknowledgement.
/// producer.send_oneway(Message::new("metrics", "tick")).await?;
/// // Batch: one request, one queue.
/// producer.send_batch(vec![Message::new("orders", "a"), Message::new("orders", "b")]).await?;
/// producer.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    pub(crate) inner: Arc<ProducerInner>,
}

pub(crate) struct ProducerInner {
    pub(crate) options: ProducerOptions,
    pub(crate) instance: Arc<ClientInstance>,
    fault: LatencyFaultTolerance,
}

impl Producer {
    /// Starts a producer: client instance, timers; the first send fetches the route.
    pub async fn start(options: ProducerOptions) -> ClientResult<Producer> {
        if options.group.is_empty() {
            return Err(ClientError::InvalidArgument(
                "producer group is empty".into(),
            ));
        }
        let instance = ClientInstance::start(options.client.clone()).await?;
        lock(&instance.heartbeat_source)
            .producer_groups
            .push(options.group.clone());
        Ok(Producer {
            inner: Arc::new(ProducerInner {
                options,
                instance,
                fault: LatencyFaultTolerance::new(),
            }),
        })
    }

    /// This client's id as brokers see it.
    pub fn client_id(&self) -> &str {
        &self.inner.instance.client_id
    }

    /// Sends and waits for the broker's acknowledgement, retrying on another broker.
    pub async fn send(&self, message: Message) -> ClientResult<SendResult> {
        self.inner
            .send(message, Target::Any, SendMode::Sync)
            .await
            .and_then(expect_result)
    }

    /// Sends to `queue` exactly (no retry elsewhere).
    pub async fn send_to_queue(
        &self,
        message: Message,
        queue: &MessageQueue,
    ) -> ClientResult<SendResult> {
        self.inner
            .send(message, Target::Queue(queue), SendMode::Sync)
            .await
            .and_then(expect_result)
    }

    /// Sends to the queue `selector` picks for `arg` among the topic's writable queues.
    pub async fn send_with_selector(
        &self,
        message: Message,
        selector: &dyn MessageQueueSelector,
        arg: &str,
    ) -> ClientResult<SendResult> {
        self.inner
            .send(message, Target::Selector(selector, arg), SendMode::Sync)
            .await
            .and_then(expect_result)
    }

    /// Sends in the background and calls `callback` with the outcome; returns at once. Many
    /// sends in flight share the broker's connection (pipelined). Needs a tokio runtime.
    pub fn send_async<F>(&self, message: Message, callback: F)
    where
        F: FnOnce(ClientResult<SendResult>) + Send + 'static,
    {
        let producer = self.clone();
        tokio::spawn(async move {
            callback(producer.send(message).await);
        });
    }

    /// Writes the message with the oneway flag and returns once it is queued on the
    /// connection: no acknowledgement, no retry.
    pub async fn send_oneway(&self, message: Message) -> ClientResult<()> {
        self.inner
            .send(message, Target::Any, SendMode::Oneway)
            .await
            .map(|_| ())
    }

    /// Sends `messages` (one topic, no delay, not a retry topic) as one SEND_BATCH_MESSAGE to
    /// one queue; the result's ids are comma-joined, its offset the first message's.
    pub async fn send_batch(&self, messages: Vec<Message>) -> ClientResult<SendResult> {
        let batch = self.inner.prepare_batch(messages)?;
        self.inner
            .send(batch, Target::Any, SendMode::Sync)
            .await
            .and_then(expect_result)
    }

    /// The writable queues of `topic`.
    pub async fn fetch_publish_queues(&self, topic: &str) -> ClientResult<Vec<MessageQueue>> {
        Ok(self
            .inner
            .instance
            .route_for_publish(topic)
            .await?
            .publish_queues
            .clone())
    }

    /// Unregisters from every broker and closes connections.
    pub async fn shutdown(&self) {
        self.inner
            .instance
            .shutdown(Some(&self.inner.options.group), None)
            .await;
    }
}

fn expect_result(result: Option<SendResult>) -> ClientResult<SendResult> {
    result.ok_or(ClientError::State("oneway (no result)"))
}

/// Internal marker property carried by the merged batch message until it is encoded.
const BATCH_MARKER: &str = "__shardmq_batch";
/// Internal: comma-joined UNIQ_KEYs of the batch's messages.
const BATCH_IDS: &str = "__shardmq_batch_ids";

/// Response codes after which a send is tried again on another broker (§2.2).
fn is_retryable_code(code: i32) -> bool {
    matches!(
        code,
        response_code::TOPIC_NOT_EXIST
            | response_code::SERVICE_NOT_AVAILABLE
            | response_code::SYSTEM_ERROR
            | response_code::SYSTEM_BUSY
            | response_code::NO_PERMISSION
            | response_code::NO_BUYER_ID
            | response_code::NOT_IN_CURRENT_UNIT
            | response_code::GO_AWAY
    )
}

impl ProducerInner {
    fn prepare_batch(&self, messages: Vec<Message>) -> ClientResult<Message> {
        let first = messages
            .first()
            .ok_or_else(|| ClientError::InvalidArgument("empty batch".into()))?;
        if messages.len() > BATCH_MESSAGES_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "batch of {} messages exceeds {BATCH_MESSAGES_MAX}",
                messages.len()
            )));
        }
        let topic = first.topic.clone();
        if topic.starts_with(RETRY_TOPIC_PREFIX) {
            return Err(ClientError::InvalidArgument(
                "retry topics cannot take batches".into(),
            ));
        }
        let mut inner = Vec::with_capacity(messages.len());
        for mut message in messages {
            message.validate()?;
            if message.topic != topic {
                return Err(ClientError::InvalidArgument(
                    "a batch's messages must share one topic".into(),
                ));
            }
            if message.delay_level() > 0 {
                return Err(ClientError::InvalidArgument(
                    "delayed messages cannot be batched".into(),
                ));
            }
            if message.unique_id().is_none() {
                message.set_property(property::UNIQ_KEY, self.instance.unique_ids.next_id());
            }
            inner.push(message);
        }
        let ids: Vec<&str> = inner.iter().filter_map(Message::unique_id).collect();
        let ids = ids.join(",");
        let body = encode_batch(&inner);
        if body.len() > self.options.max_message_size_bytes {
            return Err(ClientError::InvalidArgument(format!(
                "batch body of {} bytes exceeds {}",
                body.len(),
                self.options.max_message_size_bytes
            )));
        }
        Ok(Message::new(topic, body)
            .with_property(BATCH_MARKER, "true")
            .with_property(BATCH_IDS, ids)
            .with_property(property::WAIT, "true"))
    }

    async fn send(
        &self,
        mut message: Message,
        target: Target<'_>,
        mode: SendMode,
    ) -> ClientResult<Option<SendResult>> {
        if message.property(BATCH_MARKER).is_none() {
            self.prepare_single(&mut message)?;
        }
        let started = Instant::now();
        let deadline = self.options.send_timeout;
        let attempts = match (mode, &target) {
            (SendMode::Oneway, _) | (_, Target::Queue(_)) => 1,
            _ => 1 + self.options.retry_times_when_send_failed,
        };
        let mut last_broker: Option<String> = None;
        let mut last_error = ClientError::NoRoute(message.topic.clone());
        for _ in 0..attempts {
            let elapsed = started.elapsed();
            if elapsed >= deadline {
                break;
            }
            let queue = self
                .pick_queue(&target, &message, last_broker.as_deref())
                .await?;
            let begin = now_ms();
            let outcome = self
                .send_kernel(&message, &queue, mode, deadline - elapsed)
                .await;
            let latency = now_ms() - begin;
            let error = match outcome {
                Ok(result) => {
                    self.fault.update(&queue.broker_name, latency, false);
                    return Ok(result);
                }
                Err(error) => error,
            };
            self.fault
                .update(&queue.broker_name, latency, error.is_network());
            let retryable = error.is_network()
                || matches!(error, ClientError::NoBrokerAddress(_))
                || error.response_code().is_some_and(is_retryable_code);
            if error.response_code() == Some(response_code::TOPIC_NOT_EXIST) {
                let _ = self.instance.update_route(&message.topic).await;
            }
            last_broker = Some(queue.broker_name.clone());
            last_error = error;
            if !retryable {
                break;
            }
        }
        Err(last_error)
    }

    /// Checks a single message against the limits and gives it its UNIQ_KEY (once, so every
    /// retry carries the same id).
    fn prepare_single(&self, message: &mut Message) -> ClientResult<()> {
        message.validate()?;
        if message.body.len() > self.options.max_message_size_bytes {
            return Err(ClientError::InvalidArgument(format!(
                "message body of {} bytes exceeds {}",
                message.body.len(),
                self.options.max_message_size_bytes
            )));
        }
        if message.unique_id().is_none() {
            message.set_property(property::UNIQ_KEY, self.instance.unique_ids.next_id());
        }
        Ok(())
    }

    /// The queue for the next attempt: the given one, the selector's, or the fault strategy's
    /// (which avoids `last_broker` and brokers that were slow or failed lately).
    async fn pick_queue(
        &self,
        target: &Target<'_>,
        message: &Message,
        last_broker: Option<&str>,
    ) -> ClientResult<MessageQueue> {
        if let Target::Queue(queue) = target {
            return Ok((*queue).clone());
        }
        let route = self.instance.route_for_publish(&message.topic).await?;
        self.instance.heartbeat_if_brokers_changed().await;
        let queues = &route.publish_queues;
        Ok(match target {
            Target::Selector(selector, arg) => {
                queues[selector.select(queues, message, arg) % queues.len()].clone()
            }
            _ => self
                .fault
                .select(queues, last_broker, self.options.send_latency_fault_enable),
        })
    }

    /// One attempt: encodes and sends `message` to `queue`'s broker.
    pub(crate) async fn send_kernel(
        &self,
        message: &Message,
        queue: &MessageQueue,
        mode: SendMode,
        timeout: Duration,
    ) -> ClientResult<Option<SendResult>> {
        let addr = match self.instance.master_addr(&queue.broker_name) {
            Some(addr) => addr,
            None => {
                self.instance.update_route(&queue.topic).await?;
                self.instance.require_master_addr(&queue.broker_name)?
            }
        };
        let (request, msg_id) = self.send_request(message, queue);
        if mode == SendMode::Oneway {
            self.instance
                .remoting
                .invoke_oneway(&addr, &request)
                .await?;
            return Ok(None);
        }
        let response = self
            .instance
            .remoting
            .invoke(&addr, &request, timeout)
            .await?;
        if !is_send_stored(response.code) {
            return Err(response.into_error(&addr));
        }
        send_result(&response, queue, msg_id).map(Some)
    }

    /// SEND_MESSAGE_V2 (or SEND_BATCH_MESSAGE) for `message` to `queue`, and the id(s) the
    /// result reports: compression over the threshold, the transaction-prepared flag, the
    /// retry counters of a `%RETRY%` topic.
    fn send_request(&self, message: &Message, queue: &MessageQueue) -> (Request, String) {
        let is_batch = message.property(BATCH_MARKER).is_some();
        let mut message = message.clone();
        let batch_ids = message.remove_property(BATCH_IDS);
        message.remove_property(BATCH_MARKER);
        let mut sys_flag = 0;
        let mut body = std::mem::take(&mut message.body);
        if !is_batch && body.len() >= self.options.compress_over_bytes {
            body = compress(&body, self.options.compress_level);
            sys_flag |= SYS_FLAG_COMPRESSED;
        }
        if message.property(property::TRAN_MSG) == Some("true") {
            sys_flag |= SYS_FLAG_TRANSACTION_PREPARED;
        }
        let mut reconsume_times = "0".to_string();
        let mut max_reconsume_times = None;
        if queue.topic.starts_with(RETRY_TOPIC_PREFIX) {
            if let Some(times) = message.remove_property(property::RECONSUME_TIME) {
                reconsume_times = times;
            }
            max_reconsume_times = message.remove_property(property::MAX_RECONSUME_TIMES);
        }
        let code = if is_batch {
            request_code::SEND_BATCH_MESSAGE
        } else {
            request_code::SEND_MESSAGE_V2
        };
        let mut request = Request::new(code)
            .ext("a", &self.options.group)
            .ext("b", &queue.topic)
            .ext("c", AUTO_CREATE_TOPIC_KEY_TOPIC)
            .ext("d", DEFAULT_TOPIC_QUEUE_NUMS)
            .ext("e", queue.queue_id)
            .ext("f", sys_flag)
            .ext("g", now_ms())
            .ext("h", message.flag)
            .ext("i", String::from_utf8_lossy(&message.encode_properties()))
            .ext("j", reconsume_times)
            .ext("k", "false");
        if let Some(max) = max_reconsume_times {
            request = request.ext("l", max);
        }
        if is_batch {
            request = request.ext("m", "true");
        }
        let request = request.ext("n", &queue.broker_name).body(body);
        let msg_id = batch_ids
            .or_else(|| message.unique_id().map(str::to_string))
            .unwrap_or_default();
        (request, msg_id)
    }
}

fn send_result(
    response: &Response,
    queue: &MessageQueue,
    msg_id: String,
) -> ClientResult<SendResult> {
    let status = match response.code {
        response_code::FLUSH_DISK_TIMEOUT => SendStatus::FlushDiskTimeout,
        response_code::FLUSH_SLAVE_TIMEOUT => SendStatus::FlushSlaveTimeout,
        response_code::SLAVE_NOT_AVAILABLE => SendStatus::SlaveNotAvailable,
        _ => SendStatus::SendOk,
    };
    let queue_id = response.ext_i64("queueId")?;
    Ok(SendResult {
        status,
        msg_id,
        offset_msg_id: response.ext("msgId").unwrap_or_default().to_string(),
        queue: MessageQueue {
            topic: queue.topic.clone(),
            broker_name: queue.broker_name.clone(),
            queue_id: u32::try_from(queue_id)
                .map_err(|_| ClientError::Malformed(format!("queueId {queue_id}")))?,
        },
        queue_offset: response.ext_i64("queueOffset")?,
        transaction_id: response.ext("transactionId").map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(count: u32) -> Vec<MessageQueue> {
        (0..count)
            .map(|queue_id| MessageQueue {
                topic: "T".into(),
                broker_name: "b".into(),
                queue_id,
            })
            .collect()
    }

    #[test]
    fn hash_selector_is_stable_per_key_and_matches_java() {
        let queues = queues(8);
        let message = Message::new("T", "x");
        let first = SelectByHash.select(&queues, &message, "order-42");
        for _ in 0..5 {
            assert_eq!(SelectByHash.select(&queues, &message, "order-42"), first);
        }
        // Java: Math.abs("42".hashCode()) % 8 = 1662 % 8 = 6.
        assert_eq!(SelectByHash.select(&queues, &message, "42"), 6);
    }

    #[test]
    fn round_robin_selector_cycles() {
        let queues = queues(3);
        let selector = SelectByRoundRobin::default();
        let picks: Vec<usize> = (0..6)
            .map(|_| selector.select(&queues, &Message::new("T", "x"), ""))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn retryable_codes_are_javas() {
        for code in [1, 2, 14, 16, 17, 204, 205, 1500] {
            assert!(is_retryable_code(code), "{code}");
        }
        for code in [0, 13, 29] {
            assert!(!is_retryable_code(code), "{code}");
        }
    }
}
