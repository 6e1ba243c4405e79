//! The one place a message is written: `Broker::append` stores an [`Outgoing`] message at
//! the [`Destination`] that `route` chose, and counts it. Whatever a destination needs is done
//! here and nowhere else:
//!
//! | Destination | stored in | also |
//! |---|---|---|
//! | `Queue` | the queue | — |
//! | `DeadLetter` | `%DLQ%<group>` queue 0 (created, write-only, when missing) | — |
//! | `Half` | `RMQ_SYS_TRANS_HALF_TOPIC` 0, with `REAL_TOPIC`, `REAL_QID`, `__transactionId__`, `PGROUP`; the transaction bits of sysFlag cleared | registered as pending (transaction.rs) |
//! | `DelayLevel` | `SCHEDULE_TOPIC_XXXX` level − 1, with `REAL_TOPIC`, `REAL_QID`; tags code = delivery time | the delivery task is woken |
//! | `Timer` | `rmq_sys_wheel_timer` 0, the same plus `TIMER_OUT_MS` | the delivery task is woken |
//!
//! Parked pulls are woken by the store itself (its arrival listener, set in `Broker::new`),
//! so no path can forget to.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use shards::store::{AppendResult, MessageKeys, MessageToStore, StoreError};

use crate::body::{encode_properties, find_property, perm, property, TopicConfig};

use super::route::Destination;
use super::schedule::{SCHEDULE_TOPIC, TIMER_TOPIC};
use super::topics::DLQ_GROUP_TOPIC_PREFIX;
use super::transaction::{self, RMQ_SYS_TRANS_HALF_TOPIC};
use super::Broker;

/// A message as a path built it, before its destination's changes.
pub struct Outgoing<'a> {
    pub flag: i32,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddrV4,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: &'a [u8],
    /// Its encoded properties; the destination's are appended to it.
    pub properties: &'a mut Vec<u8>,
    /// Consume-queue tags code of its real queue (hash of TAGS).
    pub tags_code: i64,
    /// Index keys already read from the properties (None: read them here).
    pub keys: Option<MessageKeys<'a>>,
    /// UNIQ_KEY (a half's `__transactionId__`).
    pub unique_id: &'a str,
    /// The producer group (a half's `PGROUP` when the message carries none).
    pub producer_group: &'a str,
}

/// Property appended to a message's encoded properties (which may lack a last separator).
fn add_properties(properties: &mut Vec<u8>, pairs: &[(&str, &str)]) {
    if !properties.is_empty() && properties.last() != Some(&2) {
        properties.push(2);
    }
    encode_properties(properties, pairs);
}

impl Broker {
    /// Stores `message` at `destination` (see the module doc); the store's answer.
    pub(crate) fn append(
        &self,
        message: Outgoing<'_>,
        destination: &Destination<'_>,
    ) -> Result<AppendResult, StoreError> {
        let dead_letter_topic;
        let mut sys_flag = message.sys_flag;
        let mut tags_code = message.tags_code;
        let (topic, queue_id) = match *destination {
            Destination::Queue { topic, queue_id } => (topic, queue_id),
            Destination::DeadLetter { group } => {
                dead_letter_topic = format!("{DLQ_GROUP_TOPIC_PREFIX}{group}");
                self.ensure_dead_letter_topic(&dead_letter_topic);
                (dead_letter_topic.as_str(), 0)
            }
            Destination::Half { topic, queue_id } => {
                let queue = queue_id.to_string();
                let mut added = vec![
                    (property::REAL_TOPIC, topic),
                    (property::REAL_QID, queue.as_str()),
                    (property::TRANSACTION_ID, message.unique_id),
                ];
                if find_property(message.properties, property::PGROUP).is_none() {
                    added.push((property::PGROUP, message.producer_group));
                }
                add_properties(message.properties, &added);
                sys_flag = transaction::half_sys_flag(sys_flag);
                (RMQ_SYS_TRANS_HALF_TOPIC, transaction::HALF_QUEUE_ID)
            }
            Destination::DelayLevel {
                topic,
                queue_id,
                level,
                deliver_ms,
            } => {
                let queue = queue_id.to_string();
                add_properties(
                    message.properties,
                    &[(property::REAL_TOPIC, topic), (property::REAL_QID, &queue)],
                );
                tags_code = deliver_ms;
                (SCHEDULE_TOPIC, level - 1)
            }
            Destination::Timer {
                topic,
                queue_id,
                deliver_ms,
            } => {
                let (queue, deliver) = (queue_id.to_string(), deliver_ms.to_string());
                add_properties(
                    message.properties,
                    &[
                        (property::REAL_TOPIC, topic),
                        (property::REAL_QID, &queue),
                        (property::TIMER_OUT_MS, &deliver),
                    ],
                );
                tags_code = deliver_ms;
                (TIMER_TOPIC, 0)
            }
        };
        let to_store = MessageToStore {
            topic,
            queue_id,
            flag: message.flag,
            sys_flag,
            born_timestamp_ms: message.born_timestamp_ms,
            born_host: message.born_host,
            reconsume_times: message.reconsume_times,
            prepared_transaction_offset: message.prepared_transaction_offset,
            body: message.body,
            properties: message.properties,
            tags_code,
        };
        let appended = match message.keys {
            Some(keys) => self.store.append_with_keys(&to_store, keys)?,
            None => self.store.append(&to_store)?,
        };
        self.stats
            .messages_put
            .set(self.stats.messages_put.get() + 1);
        let mut flows = self.stats.flows.borrow_mut();
        match destination {
            // Counted under the topic the producer named (RocketMQ's messages_in_total).
            Destination::Queue { topic, .. }
            | Destination::Half { topic, .. }
            | Destination::DelayLevel { topic, .. }
            | Destination::Timer { topic, .. } => flows.note_in(topic, to_store.body.len() as u64),
            Destination::DeadLetter { .. } => {
                flows.note_in(topic, to_store.body.len() as u64);
                flows.to_dead_letter += 1;
            }
        }
        drop(flows);
        match destination {
            Destination::Half { .. } => self.half_stored(message.properties, &appended),
            Destination::DelayLevel { .. } | Destination::Timer { .. } => {
                self.schedule.borrow().wakeup.notify()
            }
            Destination::Queue { .. } | Destination::DeadLetter { .. } => {}
        }
        Ok(appended)
    }

    /// Creates `%DLQ%<group>` (one queue, write-only, as RocketMQ) on every shard when missing.
    pub(crate) fn ensure_dead_letter_topic(&self, topic: &str) {
        if self.topics.borrow().get(topic).is_none() {
            self.upsert_topic_everywhere(TopicConfig::new(topic, 1, perm::WRITE));
        }
    }
}

/// The peer as an IPv4 host (stored records use IPv4 hosts; v4-mapped v6 peers unwrap).
pub(crate) fn to_v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr.ip() {
        IpAddr::V4(ip) => SocketAddrV4::new(ip, addr.port()),
        IpAddr::V6(ip) => SocketAddrV4::new(
            ip.to_ipv4_mapped().unwrap_or(std::net::Ipv4Addr::LOCALHOST),
            addr.port(),
        ),
    }
}
