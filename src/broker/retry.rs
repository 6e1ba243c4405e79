//! CONSUMER_SEND_MSG_BACK (36): a consumer gives a message back after failing to consume
//! it. The broker stores a copy in `%RETRY%<group>`, delayed by level 3 + reconsumeTimes (or
//! the level the client asks for), so the group gets it again later; after the group's
//! retryMaxTimes (or the request's maxReconsumeTimes) the copy goes to `%DLQ%<group>`
//! instead, undelayed and write-only, as RocketMQ does. The copy keeps body, flag, sysFlag,
//! born time and host and UNIQ_KEY (so the consumer sees the same msgId), and carries the
//! original topic in RETRY_TOPIC and the first failed copy's offset msgId in
//! ORIGIN_MESSAGE_ID; its reconsumeTimes is one more.
//!
//! A client whose send-back failed re-sends the message itself to `%RETRY%<group>`; that
//! path is in send.rs (`retry_or_dead_letter`).

use std::rc::Rc;

use shards::store::{record, FlushMode, MessageToStore};

use crate::body::{encode_properties, java_string_hash, parse_properties, perm, property};
use crate::body::{TopicConfig, RETRY_QUEUE_NUMS_DEFAULT};
use crate::error::RequestError;
use crate::remoting::{response_code, RemotingCommand};
use crate::server::Connection;

use super::schedule::{divert_for, Divert};
use super::send::to_v4;
use super::topics::{DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX};
use super::Broker;
use crate::error::store_error;

/// The delay level of the first retry when the client leaves it to the broker
/// (10 s with the default table): level = RETRY_DELAY_LEVEL_BASE + reconsumeTimes.
pub const RETRY_DELAY_LEVEL_BASE: i32 = 3;

/// What a send-back asks for.
struct SendBack {
    opaque: i32,
    oneway: bool,
    physical_offset: u64,
    group: String,
    delay_level: i32,
    origin_msg_id: Option<String>,
    max_reconsume_times: Option<i32>,
}

impl Broker {
    pub(super) fn consumer_send_msg_back(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let back = SendBack {
            opaque: request.opaque,
            oneway: request.is_oneway(),
            physical_offset: ext.required_i64("offset")?.max(0) as u64,
            group: ext.required("group")?.to_string(),
            delay_level: ext.optional_i32("delayLevel")?.unwrap_or(0),
            origin_msg_id: ext.get_non_empty("originMsgId").map(str::to_string),
            max_reconsume_times: ext.optional_i32("maxReconsumeTimes")?,
        };
        self.consumer_group_config(&back.group)?;
        let broker = self.clone();
        let in_flight = connection.in_flight();
        let connection = connection.clone();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let result = broker.send_back(&back).await;
            if back.oneway {
                return;
            }
            match result {
                Ok(()) => connection.respond_to(back.opaque, response_code::SUCCESS, None),
                Err(error) => error.respond(&connection, back.opaque),
            }
        });
        Ok(())
    }

    async fn send_back(&self, back: &SendBack) -> Result<(), RequestError> {
        let group = self.consumer_group_config(&back.group)?;
        let bytes = self
            .store
            .read_record(back.physical_offset)
            .await
            .map_err(store_error)?
            .ok_or_else(|| {
                RequestError::SystemError(format!(
                    "look message by offset failed, {}",
                    back.physical_offset
                ))
            })?;
        let original = record::decode(&bytes).map_err(|e| {
            RequestError::SystemError(format!(
                "look message by offset failed, {}: {e}",
                back.physical_offset
            ))
        })?;
        let max_times = back
            .max_reconsume_times
            .filter(|m| *m >= 0)
            .unwrap_or(group.retry_max_times as i32);
        let dead = original.reconsume_times >= max_times || back.delay_level < 0;
        let pairs = parse_properties(original.properties);
        let lookup = |key: &str| pairs.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let offset_msg_id =
            record::offset_msg_id(self.identity.address.into(), back.physical_offset);
        let origin_id = lookup(property::ORIGIN_MESSAGE_ID)
            .map(str::to_string)
            .or_else(|| back.origin_msg_id.clone())
            .unwrap_or_else(|| offset_msg_id.clone());
        let retry_topic_value = lookup(property::RETRY_TOPIC)
            .unwrap_or(original.topic)
            .to_string();
        let level_text;
        let mut extra: Vec<(&str, &str)> = vec![
            (property::RETRY_TOPIC, &retry_topic_value),
            (property::ORIGIN_MESSAGE_ID, &origin_id),
        ];
        let (topic, queue_id) = if dead {
            let dlq = format!("{DLQ_GROUP_TOPIC_PREFIX}{}", back.group);
            self.ensure_dlq_topic(&dlq);
            extra.push((property::DLQ_ORIGIN_TOPIC, &retry_topic_value));
            extra.push((property::DLQ_ORIGIN_MESSAGE_ID, &origin_id));
            (dlq, 0)
        } else {
            let level = if back.delay_level == 0 {
                RETRY_DELAY_LEVEL_BASE + original.reconsume_times
            } else {
                back.delay_level
            };
            level_text = level.to_string();
            extra.push((property::DELAY, &level_text));
            let queues = group.retry_queue_nums.max(RETRY_QUEUE_NUMS_DEFAULT);
            self.ensure_retry_topic(&back.group, queues);
            let retry = format!("{RETRY_GROUP_TOPIC_PREFIX}{}", back.group);
            let queue_id = (self.next_retry_queue() % queues as usize) as u32;
            (retry, queue_id)
        };
        let replaced = [
            property::RETRY_TOPIC,
            property::ORIGIN_MESSAGE_ID,
            property::DELAY,
            property::DLQ_ORIGIN_TOPIC,
            property::DLQ_ORIGIN_MESSAGE_ID,
            property::REAL_TOPIC,
            property::REAL_QID,
        ];
        let mut kept: Vec<(&str, &str)> = pairs
            .iter()
            .filter(|(k, _)| !replaced.contains(k))
            .copied()
            .collect();
        kept.extend(extra.iter().copied());
        let mut properties = Vec::with_capacity(original.properties.len() + 96);
        encode_properties(&mut properties, &kept);
        let tags_code = lookup(property::TAGS).map_or(0, |tag| i64::from(java_string_hash(tag)));
        let mut store_topic: &str = &topic;
        let mut store_queue = queue_id;
        let mut store_tags = tags_code;
        let divert = divert_for(
            &kept,
            &self.schedule.borrow().levels,
            crate::error::now_ms(),
        )?;
        if divert != Divert::None {
            let (t, q, deliver_ms) = self.divert(divert, &topic, queue_id, &mut properties);
            store_topic = t;
            store_queue = q;
            store_tags = deliver_ms;
        }
        let message = MessageToStore {
            topic: store_topic,
            queue_id: store_queue,
            flag: original.flag,
            sys_flag: original.sys_flag,
            born_timestamp_ms: original.born_timestamp_ms,
            born_host: to_v4(original.born_host),
            reconsume_times: original.reconsume_times + 1,
            prepared_transaction_offset: original.prepared_transaction_offset,
            body: original.body,
            properties: &properties,
            tags_code: store_tags,
        };
        let appended = self.store.append(&message).map_err(store_error)?;
        if divert == Divert::None {
            self.notify_message_arrived(store_topic, store_queue);
        }
        if self.store.flush_mode() == FlushMode::Sync {
            self.store
                .wait_durable(appended.end_offset)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    /// Creates `%DLQ%<group>` (one queue, write-only, as RocketMQ) on every shard when missing.
    fn ensure_dlq_topic(&self, topic: &str) {
        if self.topics.borrow().get(topic).is_none() {
            self.upsert_topic_everywhere(TopicConfig::new(topic, 1, perm::WRITE));
        }
    }

    /// The dead-letter rule of a send to `%RETRY%<group>`: past the group's retryMaxTimes
    /// (or the request's maxReconsumeTimes) the message goes to `%DLQ%<group>` queue 0,
    /// undelayed. Returns the topic to store in and whether it is the DLQ.
    pub(super) fn retry_or_dead_letter(
        &self,
        topic: &str,
        reconsume_times: i32,
        max_reconsume_times: Option<i32>,
    ) -> Result<Option<String>, RequestError> {
        let Some(group) = topic.strip_prefix(RETRY_GROUP_TOPIC_PREFIX) else {
            return Ok(None);
        };
        let config = self.consumer_group_config(group)?;
        let max = max_reconsume_times
            .filter(|m| *m >= 0)
            .unwrap_or(config.retry_max_times as i32);
        if reconsume_times > max {
            let dlq = format!("{DLQ_GROUP_TOPIC_PREFIX}{group}");
            self.ensure_dlq_topic(&dlq);
            return Ok(Some(dlq));
        }
        Ok(None)
    }
}
