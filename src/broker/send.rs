//! SEND_MESSAGE (10, long header names), SEND_MESSAGE_V2 (310, one-letter names) and
//! SEND_BATCH_MESSAGE (320, or any send whose `batch` flag is set, as the C++ client sends
//! batches as code 10).
//!
//! Checks, in order: topic name, forbidden system topics, topic exists or is auto-created
//! from the template topic, queue id in range, body and properties size. A message without
//! UNIQ_KEY gets one; `CLUSTER` is added. The record is appended to the store at once; with
//! SYNC_FLUSH the answer waits for the group commit that covers it.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::rc::Rc;

use shards::store::{self, record, AppendResult, FlushMode, MessageToStore, StoreError};

use crate::error::RequestError;
use crate::protocol::{java_string_hash, parse_properties, property};
use crate::remoting::{request_code, response_code, ExtFields, FrameEncoder, RemotingCommand};
use crate::server::Connection;

use super::schedule::{divert_for, Divert};
use super::topics::{self, validate_topic_name};
use super::{transaction, Broker};

/// Messages one batch may carry (a client cannot make the broker loop without bound).
pub const BATCH_MESSAGES_MAX: usize = 10_000;

/// The send request header, whichever name set it came in.
struct SendHeader<'a> {
    producer_group: &'a str,
    topic: &'a str,
    default_topic: &'a str,
    default_topic_queue_nums: i32,
    queue_id: i32,
    sys_flag: i32,
    born_timestamp_ms: i64,
    flag: i32,
    properties: &'a str,
    reconsume_times: i32,
    max_reconsume_times: Option<i32>,
    batch: bool,
}

impl<'a> SendHeader<'a> {
    fn parse(request: &'a RemotingCommand<'a>) -> Result<SendHeader<'a>, RequestError> {
        let ext: &'a ExtFields<'a> = &request.ext_fields;
        let short = request.code != request_code::SEND_MESSAGE;
        let name = |long: &'static str, letter: &'static str| if short { letter } else { long };
        Ok(SendHeader {
            producer_group: ext.required(name("producerGroup", "a"))?,
            topic: ext.required(name("topic", "b"))?,
            default_topic: ext
                .get(name("defaultTopic", "c"))
                .unwrap_or(topics::AUTO_CREATE_TOPIC_KEY_TOPIC),
            default_topic_queue_nums: ext
                .optional_i32(name("defaultTopicQueueNums", "d"))?
                .unwrap_or(4),
            queue_id: ext.required_i32(name("queueId", "e"))?,
            sys_flag: ext.optional_i32(name("sysFlag", "f"))?.unwrap_or(0),
            born_timestamp_ms: ext.optional_i64(name("bornTimestamp", "g"))?.unwrap_or(0),
            flag: ext.optional_i32(name("flag", "h"))?.unwrap_or(0),
            properties: ext.get(name("properties", "i")).unwrap_or(""),
            reconsume_times: ext.optional_i32(name("reconsumeTimes", "j"))?.unwrap_or(0),
            max_reconsume_times: ext.optional_i32(name("maxReconsumeTimes", "l"))?,
            batch: request.code == request_code::SEND_BATCH_MESSAGE
                || ext.bool_lenient(name("batch", "m")) == Some(true),
        })
    }
}

/// One message ready to append: its properties completed (UNIQ_KEY, CLUSTER).
struct Prepared<'a> {
    flag: i32,
    body: &'a [u8],
    properties: Vec<u8>,
    unique_id: String,
    tags_code: i64,
    /// Whether (and where) the message waits before its real queue.
    divert: Divert,
}

impl Broker {
    pub(super) fn send_message(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        self.refuse_send_if_overloaded()?;
        let header = SendHeader::parse(request)?;
        validate_topic_name(header.topic)?;
        if topics::NOT_ALLOWED_SEND_TOPICS.contains(&header.topic) {
            return Err(RequestError::NoPermission(format!(
                "Sending message to topic[{}] is forbidden.",
                header.topic
            )));
        }
        let queue_id = self.resolve_queue(&header)?;
        let mut messages = if header.batch {
            self.prepare_batch(request.body, header.properties)?
        } else {
            vec![self.prepare_one(header.flag, request.body, header.properties)?]
        };
        // A retry past its group's limit goes to the dead-letter queue, undelayed.
        let dead_letter = self.retry_or_dead_letter(
            header.topic,
            header.reconsume_times,
            header.max_reconsume_times,
        )?;
        let (topic, queue_id) = match &dead_letter {
            Some(dlq) => (dlq.as_str(), 0),
            None => (header.topic, queue_id),
        };
        // A transactional half message waits in the half topic (transaction.rs), undelayed.
        let first = &mut messages[0];
        let half = !header.batch
            && dead_letter.is_none()
            && self.prepare_half(
                &mut first.properties,
                &first.unique_id,
                (topic, queue_id),
                header.producer_group,
            )?;
        let sys_flag = match half {
            true => transaction::half_sys_flag(header.sys_flag),
            false => header.sys_flag,
        };
        let born_host = to_v4(connection.peer);
        if messages.len() > 1 {
            // A batch is stored whole or not at all: refuse it up front when the store has
            // no room for all of it (RocketMQ stores a batch as one unit).
            let total: usize = messages
                .iter()
                .map(|m| record::encoded_size(m.body.len(), topic.len(), m.properties.len() + 64))
                .sum();
            self.store.check_room(total as u64).map_err(store_error)?;
        }
        let mut results = Vec::with_capacity(messages.len());
        let mut arrived = false;
        for message in &mut messages {
            let (mut store_topic, mut store_queue, mut tags_code) =
                (topic, queue_id, message.tags_code);
            if half {
                (store_topic, store_queue) = transaction::HALF_QUEUE;
            } else if message.divert != Divert::None && dead_letter.is_none() {
                (store_topic, store_queue, tags_code) =
                    self.divert(message.divert, topic, queue_id, &mut message.properties);
            } else {
                arrived = true;
            }
            let to_store = MessageToStore {
                topic: store_topic,
                queue_id: store_queue,
                flag: message.flag,
                sys_flag,
                born_timestamp_ms: header.born_timestamp_ms,
                born_host,
                reconsume_times: header.reconsume_times,
                prepared_transaction_offset: 0,
                body: message.body,
                properties: &message.properties,
                tags_code,
            };
            let appended = self.store.append(&to_store).map_err(store_error)?;
            results.push(appended);
        }
        self.stats
            .messages_put
            .set(self.stats.messages_put.get() + results.len() as u64);
        if half {
            self.half_stored(&messages[0].properties, &results[0]);
        }
        if arrived {
            self.notify_message_arrived(topic, queue_id);
        }
        let reply = SendReply::new(self, queue_id, &messages, &results);
        if request.is_oneway() {
            return Ok(());
        }
        let opaque = request.opaque;
        match self.store.flush_mode() {
            FlushMode::Async => reply.send(connection, opaque, response_code::SUCCESS),
            FlushMode::Sync => {
                let end_offset = results.last().map_or(0, |r| r.end_offset);
                let broker = self.clone();
                let in_flight = connection.in_flight();
                let connection = connection.clone();
                shards::runtime::spawn_detached(async move {
                    let _in_flight = in_flight;
                    match broker.store.wait_durable(end_offset).await {
                        Ok(()) => reply.send(&connection, opaque, response_code::SUCCESS),
                        Err(error) => store_error(error).respond(&connection, opaque),
                    }
                });
            }
        }
        Ok(())
    }

    /// The queue to write: the asked one (auto-creating the topic if needed) or, when the
    /// client leaves it to us (< 0), the next one round-robin.
    fn resolve_queue(&self, header: &SendHeader<'_>) -> Result<u32, RequestError> {
        let existing = self.topics.borrow().get(header.topic).cloned();
        let config = match existing {
            Some(config) => config,
            None => {
                let requested = header.default_topic_queue_nums.max(1) as u32;
                let created = self
                    .topics
                    .borrow()
                    .auto_create_config(header.topic, header.default_topic, requested)
                    .ok_or_else(|| {
                        RequestError::TopicNotExist(format!(
                            "topic[{}] not exist, apply first please!",
                            header.topic
                        ))
                    })?;
                self.upsert_topic_everywhere(created.clone());
                created
            }
        };
        if config.perm & crate::protocol::perm::WRITE == 0 {
            return Err(RequestError::NoPermission(format!(
                "the topic[{}] sending message is forbidden",
                header.topic
            )));
        }
        let queue_count = config.write_queue_nums.max(config.read_queue_nums);
        if header.queue_id < 0 {
            let next = self.next_queue.get();
            self.next_queue.set(next.wrapping_add(1));
            return Ok(next % config.write_queue_nums.max(1));
        }
        let queue_id = header.queue_id as u32;
        if queue_id >= queue_count {
            return Err(RequestError::InvalidParameter(format!(
                "request queueId[{queue_id}] is illegal, topic [{}] has {queue_count} queues",
                header.topic
            )));
        }
        Ok(queue_id)
    }

    fn prepare_one<'a>(
        &self,
        flag: i32,
        body: &'a [u8],
        properties: &str,
    ) -> Result<Prepared<'a>, RequestError> {
        if body.len() > store::MESSAGE_SIZE_MAX_BYTES {
            return Err(RequestError::MessageIllegal(format!(
                "the message body size {} is over the limit {}",
                body.len(),
                store::MESSAGE_SIZE_MAX_BYTES
            )));
        }
        let pairs = parse_properties(properties.as_bytes());
        let lookup = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let tags_code = lookup(property::TAGS).map_or(0, |tag| i64::from(java_string_hash(tag)));
        let may_wait = pairs.iter().any(|(k, _)| {
            *k == property::DELAY || k.starts_with("TIMER_") || *k == property::START_DELIVER_TIME
        });
        let divert = if may_wait {
            divert_for(
                &pairs,
                &self.schedule.borrow().levels,
                crate::error::now_ms(),
            )?
        } else {
            Divert::None
        };
        let mut completed = Vec::with_capacity(properties.len() + 64);
        completed.extend_from_slice(properties.as_bytes());
        if !completed.is_empty() && completed.last() != Some(&2) {
            completed.push(2);
        }
        let unique_id = match lookup(property::UNIQ_KEY) {
            Some(id) => id.to_string(),
            None => {
                let id = self.generate_unique_id();
                push_property(&mut completed, property::UNIQ_KEY, &id);
                id
            }
        };
        if lookup(property::CLUSTER).is_none() {
            push_property(
                &mut completed,
                property::CLUSTER,
                &self.identity.cluster_name,
            );
        }
        if completed.len() > store::PROPERTIES_SIZE_MAX_BYTES {
            return Err(RequestError::MessageIllegal(format!(
                "the message properties length {} is over the limit {}",
                completed.len(),
                store::PROPERTIES_SIZE_MAX_BYTES
            )));
        }
        Ok(Prepared {
            flag,
            body,
            properties: completed,
            unique_id,
            tags_code,
            divert,
        })
    }

    /// Splits a batch body (§5.5: TOTALSIZE, MAGIC, BODYCRC, FLAG, body, properties).
    fn prepare_batch<'a>(
        &self,
        mut body: &'a [u8],
        _outer_properties: &str,
    ) -> Result<Vec<Prepared<'a>>, RequestError> {
        let illegal = |why: &str| RequestError::MessageIllegal(format!("bad batch body: {why}"));
        let mut messages = Vec::new();
        while !body.is_empty() {
            if messages.len() == BATCH_MESSAGES_MAX {
                return Err(illegal("too many messages"));
            }
            if body.len() < 20 {
                return Err(illegal("truncated record"));
            }
            let total = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            let flag = i32::from_be_bytes([body[12], body[13], body[14], body[15]]);
            let body_len = i32::from_be_bytes([body[16], body[17], body[18], body[19]]);
            if total < 22 || total as usize > body.len() || body_len < 0 {
                return Err(illegal("record length out of range"));
            }
            let record_bytes = &body[..total as usize];
            let body_end = 20 + body_len as usize;
            if body_end + 2 > record_bytes.len() {
                return Err(illegal("body length out of range"));
            }
            let inner_body = &record_bytes[20..body_end];
            let props_len =
                u16::from_be_bytes([record_bytes[body_end], record_bytes[body_end + 1]]) as usize;
            let props_start = body_end + 2;
            if props_start + props_len > record_bytes.len() {
                return Err(illegal("properties length out of range"));
            }
            let props = std::str::from_utf8(&record_bytes[props_start..props_start + props_len])
                .map_err(|_| illegal("properties are not UTF-8"))?;
            messages.push(self.prepare_one(flag, inner_body, props)?);
            body = &body[total as usize..];
        }
        if messages.is_empty() {
            return Err(illegal("no message in the batch"));
        }
        Ok(messages)
    }
}

fn push_property(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(1);
    out.extend_from_slice(value.as_bytes());
    out.push(2);
}

/// What a send answers: ids and offsets of what was stored.
struct SendReply {
    msg_id: String,
    queue_id: u32,
    queue_offset: u64,
    transaction_id: String,
}

impl SendReply {
    fn new(
        broker: &Broker,
        queue_id: u32,
        messages: &[Prepared<'_>],
        results: &[AppendResult],
    ) -> Self {
        let msg_ids: Vec<String> = results
            .iter()
            .map(|r| record::offset_msg_id(broker.identity.address, r.physical_offset))
            .collect();
        SendReply {
            msg_id: msg_ids.join(","),
            queue_id,
            queue_offset: results.first().map_or(0, |r| r.queue_offset),
            transaction_id: messages
                .first()
                .map(|m| m.unique_id.clone())
                .unwrap_or_default(),
        }
    }

    fn send(&self, connection: &Connection, opaque: i32, code: i32) {
        connection.send_with(|out| {
            let mut frame = FrameEncoder::response(out, code, opaque);
            frame
                .ext("msgId", &self.msg_id)
                .ext_i64("queueId", i64::from(self.queue_id))
                .ext_i64("queueOffset", self.queue_offset as i64)
                .ext("transactionId", &self.transaction_id)
                .ext("MSG_REGION", "DefaultRegion")
                .ext("TRACE_ON", "true");
            frame.finish(&[]);
        });
    }
}

/// Store failures as the client sees them.
pub(super) fn store_error(error: StoreError) -> RequestError {
    match error {
        StoreError::MessageTooLarge { .. } | StoreError::PropertiesTooLarge { .. } => {
            RequestError::MessageIllegal(error.to_string())
        }
        StoreError::Busy { .. } => RequestError::SystemBusy(format!(
            "[PC_SYNCHRONIZED]broker busy, start flow control for a while: {error}"
        )),
        other => RequestError::ServiceNotAvailable(format!(
            "service not available now, the store refuses writes: {other}"
        )),
    }
}

/// The peer as an IPv4 host (stored records use IPv4 hosts; v4-mapped v6 peers unwrap).
pub(super) fn to_v4(addr: SocketAddr) -> SocketAddrV4 {
    match addr.ip() {
        IpAddr::V4(ip) => SocketAddrV4::new(ip, addr.port()),
        IpAddr::V6(ip) => SocketAddrV4::new(
            ip.to_ipv4_mapped().unwrap_or(std::net::Ipv4Addr::LOCALHOST),
            addr.port(),
        ),
    }
}
