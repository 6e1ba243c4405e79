//! The JSON bodies (and the properties string) carried inside RocketMQ remoting frames.
//!
//! Role: pure translation between body bytes and typed values. Nothing here does I/O, keeps
//! state or knows about shards; any shard (or the namesrv) may call it on its own data.
//!
//! Two rules shape every function here (REMOTING.md §4):
//! - **Reading is lenient**, like fastjson: numbers given as strings and strings given as
//!   numbers, enums as names in any case or as ordinals, bare numeric object keys (`{0:"a"}`),
//!   unknown keys ignored, missing or `null` keys take Java's defaults, trailing whitespace (the
//!   C++ client ends its heartbeat with `\n`) accepted. A value of a plainly wrong shape (an
//!   object where a string belongs) is a [`BodyError`], never a panic.
//! - **Writing is strict standard JSON**: compact, keys sorted like fastjson's bean output,
//!   numeric map keys quoted (`"0"`), `null` members omitted. Every client parses that.
//!
//! Derived data is recomputed, never trusted: a subscription's tag hash codes come from its
//! `subString` ([`TagFilter`]), because the C++ client sends garbage and Go hashes UTF-8 bytes.

mod group;
mod heartbeat;
mod json;
mod lists;
pub mod properties;
mod reset;
mod route;
mod stats;
mod tags;
mod topic;

pub use group::{
    SubscriptionGroupConfig, SubscriptionGroupTable, RETRY_MAX_TIMES_DEFAULT,
    RETRY_QUEUE_NUMS_DEFAULT,
};
pub use heartbeat::{
    CheckClientConfigBody, ConsumeFromWhere, ConsumeType, ConsumerData, HeartbeatData,
    MessageModel, SubscriptionData, EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG,
};
pub use lists::{
    encode_consumer_id_list, encode_kv_table, encode_lock_batch_response, encode_topic_list,
    parse_consumer_id_list, parse_kv_table, parse_lock_batch_response, parse_topic_list,
    ConsumerOffsetTable, LockBatchRequest, MessageQueue,
};
pub use properties::{
    encode_properties, find_property, parse_properties, property, PROPERTIES_SIZE_MAX_BYTES,
};
pub use reset::ResetOffsetBody;
pub use route::{BrokerData, ClusterInfo, QueueData, TopicRouteData};
pub use stats::{
    parse_subscription_group_table, ClientConnection, ConsumeStats, ConsumerConnection,
    OffsetWrapper, ProducerConnection, TopicOffset, TopicStatsTable,
};
pub use tags::{java_string_hash, TagFilter};
pub use topic::{
    perm, DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigTable, TOPIC_FILTER_TYPE_SINGLE,
};

pub use crate::error::BodyError;
