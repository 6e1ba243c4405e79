//! The Rust client library: producer, push consumer, lite pull consumer and transactional
//! producer for shardmq and any other broker that speaks RocketMQ's remoting protocol.
//!
//! Built on tokio (async, multi-threaded runtime): that is what Rust users of a client
//! library already run, and it gives pipelining for free — every request is a future on one
//! multiplexed connection per broker, so thousands of sends can be in flight without a thread
//! each. The broker's own glommio runtime is thread-per-core and `!Send`, the wrong shape for
//! a library that user code calls from anywhere. Listener callbacks are plain functions run on
//! tokio's blocking pool, so user code may block.
//!
//! Wire work reuses the crate's pure codec ([`crate::remoting`]) and bodies
//! ([`crate::protocol`]); PULL bodies are decoded with the store's own record decoder.

mod allocate;
mod consumer;
mod error;
mod fault;
mod instance;
mod lite_pull;
mod message;
mod offset_store;
mod process_queue;
mod producer;
mod pull_api;
mod push_consumer;
mod remoting;
mod transaction;

pub use crate::protocol::{ConsumeFromWhere, MessageModel};
pub use allocate::{AllocateAveragely, AllocateAveragelyByCircle, AllocateStrategy};
pub use consumer::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, ConsumerOptions, MessageListenerConcurrently, MessageListenerOrderly,
};
pub use error::{ClientError, ClientResult};
pub use fault::LatencyFaultTolerance;
pub use instance::{ClientConfig, TopicRouteInfo};
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
pub use transaction::{
    LocalTransactionState, TransactionListener, TransactionProducer, TransactionSendResult,
};
