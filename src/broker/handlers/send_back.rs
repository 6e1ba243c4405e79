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
//! path is in send.rs; both reach the dead-letter queue through `route`'s retry limit.

use std::rc::Rc;

use shards::store::{record, FlushMode};

use crate::body::{
    encode_properties, java_string_hash, parse_properties, property, RETRY_QUEUE_NUMS_DEFAULT,
};
use crate::broker::append::to_v4;
use crate::broker::append::Outgoing;
use crate::broker::route::{route, Destination, RetryLimit, RouteRequest};
use crate::broker::state::schedule::divert_for;
use crate::broker::state::topics::RETRY_GROUP_TOPIC_PREFIX;
use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{response_code, RemotingCommand};
use crate::server::Connection;

/// The delay level of the first retry when the client leaves it to the broker
/// (10 s with the default table): level = RETRY_DELAY_LEVEL_BASE + reconsumeTimes.
pub const RETRY_DELAY_LEVEL_BASE: i32 = 3;

/// What a send-back asks for.
pub(crate) struct SendBack {
    pub(crate) opaque: i32,
    pub(crate) oneway: bool,
    pub(crate) physical_offset: u64,
    pub(crate) group: String,
    pub(crate) delay_level: i32,
    pub(crate) origin_msg_id: Option<String>,
    pub(crate) max_reconsume_times: Option<i32>,
}

impl Broker {
    pub(crate) fn consumer_send_msg_back(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        self.refuse_write_if_slave()?;
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

    pub(crate) async fn send_back(&self, back: &SendBack) -> Result<(), RequestError> {
        let group = self.consumer_group_config(&back.group)?;
        let bytes = self
            .store
            .read_record(shards::CommitLogOffset(back.physical_offset))
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
        let level = if back.delay_level == 0 {
            RETRY_DELAY_LEVEL_BASE + original.reconsume_times
        } else {
            back.delay_level
        };
        let queues = group.retry_queue_nums.max(RETRY_QUEUE_NUMS_DEFAULT);
        let retry_topic = format!("{RETRY_GROUP_TOPIC_PREFIX}{}", back.group);
        let retry_queue = (self.next_retry_queue() % queues as usize) as u32;
        let limit = RetryLimit {
            times: original.reconsume_times + 1,
            max: max_times,
            give_up: back.delay_level < 0,
        };
        let level_text = level.max(0).to_string();
        let wait = divert_for(
            &[(property::DELAY, level_text.as_str())],
            &self.schedule.borrow().levels,
            self.now_ms(),
        )?;
        let destination = route(&RouteRequest {
            topic: &retry_topic,
            queue_id: retry_queue,
            retry: Some((&back.group, limit)),
            half: false,
            wait,
        });
        let mut extra: Vec<(&str, &str)> = vec![
            (property::RETRY_TOPIC, &retry_topic_value),
            (property::ORIGIN_MESSAGE_ID, &origin_id),
        ];
        if matches!(destination, Destination::DeadLetter { .. }) {
            extra.push((property::DLQ_ORIGIN_TOPIC, &retry_topic_value));
            extra.push((property::DLQ_ORIGIN_MESSAGE_ID, &origin_id));
        } else {
            // The level it waits for stays visible in its properties, as in RocketMQ.
            extra.push((property::DELAY, &level_text));
            self.ensure_retry_topic(&back.group, queues);
        }
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
        let message = Outgoing {
            flag: original.flag,
            sys_flag: original.sys_flag,
            born_timestamp_ms: original.born_timestamp_ms,
            born_host: to_v4(original.born_host),
            reconsume_times: original.reconsume_times + 1,
            prepared_transaction_offset: original.prepared_transaction_offset,
            body: original.body,
            properties: &mut properties,
            tags_code,
            keys: None,
            unique_id: "",
            producer_group: "",
        };
        let appended = self.append(message, &destination).map_err(store_error)?;
        self.stats
            .flows
            .borrow_mut()
            .note_sent_back(original.topic, &back.group);
        if self.store.flush_mode() == FlushMode::Sync {
            self.store
                .wait_durable(appended.end_offset)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    /// The retry limit of a send to `%RETRY%<group>` (`route`'s dead-letter rule): the
    /// group's retryMaxTimes, or the request's maxReconsumeTimes. None for other topics.
    pub(crate) fn retry_limit<'t>(
        &self,
        topic: &'t str,
        reconsume_times: i32,
        max_reconsume_times: Option<i32>,
    ) -> Result<Option<(&'t str, RetryLimit)>, RequestError> {
        let Some(group) = topic.strip_prefix(RETRY_GROUP_TOPIC_PREFIX) else {
            return Ok(None);
        };
        let config = self.consumer_group_config(group)?;
        let max = max_reconsume_times
            .filter(|m| *m >= 0)
            .unwrap_or(config.retry_max_times as i32);
        let limit = RetryLimit {
            times: reconsume_times,
            max,
            give_up: false,
        };
        Ok(Some((group, limit)))
    }
}
