//! shardmq-client, the Rust client library: producer, push consumer, lite pull consumer and transactional
//! producer for shardmq and for any other broker that speaks RocketMQ's remoting protocol
//! (they only use the request codes of REMOTING.md §7.6, with Java's headers and bodies).
//!
//! | type | RocketMQ counterpart | what it does |
//! |---|---|---|
//! | [`Producer`] | `DefaultMQProducer` | sync, async (pipelined), oneway and batch sends; queue selectors; retries on another broker; compression over 4 KiB |
//! | [`TransactionProducer`] | `TransactionMQProducer` | half message, local transaction, END_TRANSACTION, broker checks |
//! | [`PushConsumer`] | `DefaultMQPushConsumer` | clustering or broadcasting; concurrent or orderly listeners; rebalance; retries through the broker; offsets committed every 5 s |
//! | [`LitePullConsumer`] | `DefaultLitePullConsumer` | `poll` when the application wants; assign or subscribe; seek; commit |
//!
//! ```no_run
//! use shardmq_client::{
//!     ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumerOptions, Message,
//!     MessageExt, Producer, ProducerOptions, PushConsumer,
//! };
//!
//! # async fn demo() -> Result<(), shardmq_client::ClientError> {
//! let producer = Producer::start(ProducerOptions::new("greeters", "127.0.0.1:9876")).await?;
//! producer.send(Message::new("greetings", "hello").with_tags("en")).await?;
//!
//! let mut consumer = PushConsumer::new(ConsumerOptions::new("readers", "127.0.0.1:9876"));
//! consumer.subscribe("greetings", "en || fr")?;
//! consumer.register_message_listener_concurrently(
//!     |messages: &[MessageExt], _context: &mut ConsumeConcurrentlyContext| {
//!         for message in messages {
//!             println!("{}", String::from_utf8_lossy(message.body()));
//!         }
//!         ConsumeConcurrentlyStatus::ConsumeSuccess
//!     },
//! );
//! consumer.start().await?;
//! # consumer.shutdown().await;
//! # producer.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! **Runtime.** The library runs on tokio (multi-threaded runtime; every public call is an
//! `async fn` or spawns onto the current runtime). That is what Rust users of a client library
//! already run, and it gives pipelining for free: every request is a future waiting on one
//! multiplexed connection per broker, so thousands of sends can be in flight without a thread
//! each. The broker's own glommio runtime is thread-per-core and `!Send`, the wrong shape for a
//! library that user code calls from anywhere. Listener callbacks are plain functions run on
//! tokio's blocking pool (at most `consume_thread_max` at once), so user code may block.
//!
//! **Timers** (Java's defaults, all in the options): route refresh 30 s, heartbeat 30 s,
//! rebalance 20 s (and at once on NOTIFY_CONSUMER_IDS_CHANGED), offset commit 5 s, orderly
//! lock renewal 20 s, long-poll hold 15 s.
//!
//! **Delivery** is at least once: offsets only move past messages a listener accepted or that
//! went back to the broker, so a crash or a rebalance may deliver a message again, never lose
//! one.
//!
//! **Reuse.** Frames are written and read with the crate's pure codec ([`crate::remoting`]),
//! bodies with [`crate::body`], and PULL bodies are decoded with the store's own record
//! decoder (sizes and BODYCRC checked); compressed bodies (sysFlag 0x1, zlib) are inflated.
//! All three are the `shardmq-protocol` crate: this crate names no glommio and no io_uring,
//! so it builds on any platform tokio does.

mod allocate;
pub mod connection;
mod consumer;
mod error;
mod fault;
mod instance;
pub mod limits;
mod lite_pull;
mod message;
mod offset_store;
mod process_queue;
mod producer;
mod pull_api;
mod push_consumer;
pub mod tls;
mod transaction;

// The codec (`crate::remoting`) and the bodies (`crate::body`) are the protocol crate's.
use shardmq_protocol::{body, remoting};

pub use crate::body::{ConsumeFromWhere, MessageModel};
pub use allocate::{AllocateAveragely, AllocateAveragelyByCircle, AllocateStrategy};
pub use consumer::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, ConsumerOptions, MessageListenerConcurrently, MessageListenerOrderly,
};
pub use error::{ClientError, ClientResult};
pub use instance::ClientConfig;
pub use lite_pull::LitePullConsumer;
pub use message::{
    validate_topic, Message, MessageExt, MessageQueue, DLQ_TOPIC_PREFIX, MESSAGE_BODY_MAX_BYTES,
    RETRY_TOPIC_PREFIX,
};
pub use producer::{
    MessageQueueSelector, Producer, ProducerOptions, SelectByHash, SelectByRoundRobin, SendResult,
    SendStatus,
};
pub use push_consumer::PushConsumer;
/// AccessKey, SecretKey (and STS token) a client signs every request with (RocketMQ's
/// `SessionCredentials`; the signature is CAPABILITIES.md §4.2's).
pub use shardmq_protocol::remoting::signature::Credentials as SessionCredentials;
pub use tls::TlsOptions;
pub use transaction::{
    LocalTransactionState, TransactionListener, TransactionProducer, TransactionSendResult,
};
