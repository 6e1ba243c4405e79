//! SEND_MESSAGE (10, long header names), SEND_MESSAGE_V2 (310, one-letter names) and
//! SEND_BATCH_MESSAGE (320, or any send whose `batch` flag is set, as the C++ client sends
//! batches as code 10).
//!
//! Checks, in order: topic name, forbidden system topics, topic exists or is auto-created
//! from the template topic, queue id in range, body and properties size. A message without
//! UNIQ_KEY gets one; `CLUSTER` is added. The record is appended to the store at once; with
//! SYNC_FLUSH the answer waits for the group commit that covers it.

use std::borrow::Cow;
use std::rc::Rc;

use shards::store::{self, record, AppendResult, FlushMode, MessageKeys, StoreError};
use smallvec::{smallvec, SmallVec};

use crate::body::{java_string_hash, parse_properties, property, TopicConfig};
use crate::broker::append::{to_v4, Outgoing};
use crate::broker::route::{route, Destination, RouteRequest};
use crate::broker::state::schedule::{divert_for, Divert};
use crate::broker::state::topics::{self, validate_topic_name};
use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{
    parse_bool_lenient, parse_number, request_code, response_code, FieldError, FrameEncoder,
    RemotingCommand,
};
use crate::server::Connection;

pub use crate::limits::SEND_BATCH_MESSAGES_MAX as BATCH_MESSAGES_MAX;

/// The send request header, whichever name set it came in.
pub(crate) struct SendHeader<'a> {
    pub(crate) producer_group: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) default_topic: &'a str,
    pub(crate) default_topic_queue_nums: i32,
    pub(crate) queue_id: i32,
    pub(crate) sys_flag: i32,
    pub(crate) born_timestamp_ms: i64,
    pub(crate) flag: i32,
    pub(crate) properties: &'a str,
    pub(crate) reconsume_times: i32,
    pub(crate) max_reconsume_times: Option<i32>,
    pub(crate) batch: bool,
}

/// The header fields by wire name: (SEND_MESSAGE's long name, SEND_MESSAGE_V2's letter), in
/// the order of [`SendHeader::parse`]'s slots. V2's `k` (unitMode) is not read.
pub(crate) const SEND_FIELDS: [(&str, &str); 12] = [
    ("producerGroup", "a"),
    ("topic", "b"),
    ("defaultTopic", "c"),
    ("defaultTopicQueueNums", "d"),
    ("queueId", "e"),
    ("sysFlag", "f"),
    ("bornTimestamp", "g"),
    ("flag", "h"),
    ("properties", "i"),
    ("reconsumeTimes", "j"),
    ("maxReconsumeTimes", "l"),
    ("batch", "m"),
];

impl<'a> SendHeader<'a> {
    /// Reads the header in one pass over its entries (this runs for every message, and a
    /// lookup per field costs a dozen string compares each). A repeated key keeps its last
    /// value, as [`ExtFields::get`] does.
    pub(crate) fn parse(request: &'a RemotingCommand<'a>) -> Result<SendHeader<'a>, RequestError> {
        let short = request.code != request_code::SEND_MESSAGE;
        let mut values: [Option<&'a str>; SEND_FIELDS.len()] = [None; SEND_FIELDS.len()];
        for (key, value) in request.ext_fields.iter() {
            let slot = match (short, key.as_bytes()) {
                (true, &[letter @ b'a'..=b'j']) => Some(usize::from(letter - b'a')),
                (true, b"l") => Some(10),
                (true, b"m") => Some(11),
                (true, _) => None,
                (false, _) => SEND_FIELDS.iter().position(|(long, _)| *long == key),
            };
            if let Some(slot) = slot {
                values[slot] = Some(value);
            }
        }
        let name = |slot: usize| match short {
            true => SEND_FIELDS[slot].1,
            false => SEND_FIELDS[slot].0,
        };
        let required = |slot: usize| values[slot].ok_or(FieldError::Missing(name(slot)));
        // Absent or "" is None (ExtFields::optional_i32); an int out of range is NotANumber.
        let optional_i32 = |slot: usize| -> Result<Option<i32>, FieldError> {
            let text = values[slot].filter(|text| !text.is_empty());
            text.map(|text| parse_number(name(slot), text)).transpose()
        };
        Ok(SendHeader {
            producer_group: required(0)?,
            topic: required(1)?,
            default_topic: values[2].unwrap_or(topics::AUTO_CREATE_TOPIC_KEY_TOPIC),
            default_topic_queue_nums: optional_i32(3)?.unwrap_or(4),
            queue_id: parse_number(name(4), required(4)?)?,
            sys_flag: optional_i32(5)?.unwrap_or(0),
            born_timestamp_ms: match values[6].filter(|text| !text.is_empty()) {
                None => 0,
                Some(text) => parse_number(name(6), text)?,
            },
            flag: optional_i32(7)?.unwrap_or(0),
            properties: values[8].unwrap_or(""),
            reconsume_times: optional_i32(9)?.unwrap_or(0),
            max_reconsume_times: optional_i32(10)?,
            batch: request.code == request_code::SEND_BATCH_MESSAGE
                || values[11].is_some_and(parse_bool_lenient),
        })
    }
}

/// What the send path needs from a message's properties, read in one pass.
#[derive(Default)]
pub(crate) struct PropertyScan<'a> {
    /// The first TAGS value.
    pub(crate) tags: Option<&'a str>,
    /// The first UNIQ_KEY value.
    pub(crate) unique_key: Option<&'a str>,
    /// The first KEYS value (space-separated words, indexed).
    pub(crate) keys: Option<&'a str>,
    pub(crate) has_cluster: bool,
    /// DELAY, a TIMER_* or __STARTDELIVERTIME is present: the message may wait (schedule.rs).
    pub(crate) may_wait: bool,
    /// The last TRAN_MSG says "true" (a transactional half).
    pub(crate) transaction: bool,
}

impl<'a> PropertyScan<'a> {
    /// Pairs with an empty name or value are skipped, as `parse_properties` skips them.
    pub(crate) fn of(properties: &'a str) -> PropertyScan<'a> {
        let mut scan = PropertyScan::default();
        // Split at byte positions: the separators are ASCII, so every cut is on a char
        // boundary, and a plain loop beats a char searcher on strings this short.
        let bytes = properties.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let end = bytes[start..]
                .iter()
                .position(|&byte| byte == 2)
                .map_or(bytes.len(), |offset| start + offset);
            let pair = &properties[start..end];
            start = end + 1;
            let Some(at) = pair.bytes().position(|byte| byte == 1) else {
                continue;
            };
            let (name, value) = (&pair[..at], &pair[at + 1..]);
            if name.is_empty() || value.is_empty() {
                continue;
            }
            match name {
                property::TAGS => {
                    scan.tags.get_or_insert(value);
                }
                property::UNIQ_KEY => {
                    scan.unique_key.get_or_insert(value);
                }
                property::KEYS => {
                    scan.keys.get_or_insert(value);
                }
                property::CLUSTER => scan.has_cluster = true,
                property::TRAN_MSG => scan.transaction = value.eq_ignore_ascii_case("true"),
                property::DELAY | property::START_DELIVER_TIME => scan.may_wait = true,
                _ if name.starts_with("TIMER_") => scan.may_wait = true,
                _ => {}
            }
        }
        scan
    }
}

/// One message ready to append: its properties completed (UNIQ_KEY, CLUSTER).
pub(crate) struct Prepared<'a> {
    pub(crate) flag: i32,
    pub(crate) body: &'a [u8],
    pub(crate) properties: Vec<u8>,
    pub(crate) unique_id: Cow<'a, str>,
    pub(crate) tags_code: i64,
    /// Whether (and where) the message waits before its real queue.
    pub(crate) divert: Divert,
    /// TRAN_MSG=true: a half message, when sent alone (batches carry none).
    pub(crate) transaction: bool,
    /// The KEYS value, for the index.
    pub(crate) keys: Option<&'a str>,
}

pub(crate) fn push_property(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(1);
    out.extend_from_slice(value.as_bytes());
    out.push(2);
}

/// What a send answers: ids and offsets of what was stored, and the first message's
/// UNIQ_KEY (SYNC_FLUSH answers are encoded at once and sent after the group commit).
pub(crate) struct SendReply<'a> {
    pub(crate) msg_id: String,
    pub(crate) queue_id: u32,
    pub(crate) queue_offset: u64,
    pub(crate) transaction_id: &'a str,
}

impl<'a> SendReply<'a> {
    pub(crate) fn new(
        broker: &Broker,
        queue_id: u32,
        messages: &'a [Prepared<'_>],
        results: &[AppendResult],
    ) -> Self {
        let mut msg_id =
            String::with_capacity(results.len() * (record::OFFSET_MSG_ID_V4_CHARS + 1));
        for (i, result) in results.iter().enumerate() {
            if i > 0 {
                msg_id.push(',');
            }
            record::push_offset_msg_id(
                &mut msg_id,
                broker.identity.address.into(),
                result.physical_offset.0,
            );
        }
        SendReply {
            msg_id,
            queue_id,
            queue_offset: results.first().map_or(0, |r| r.queue_offset.0),
            transaction_id: messages.first().map_or("", |m| m.unique_id.as_ref()),
        }
    }

    pub(crate) fn send(&self, connection: &Connection, opaque: i32, code: i32) {
        connection.send_with(|out| self.encode(out, opaque, code));
    }

    /// The answer frame, appended to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>, opaque: i32, code: i32) {
        let mut frame = FrameEncoder::response(out, code, opaque);
        frame
            .ext("msgId", &self.msg_id)
            .ext_i64("queueId", i64::from(self.queue_id))
            .ext_i64("queueOffset", self.queue_offset as i64)
            .ext("transactionId", self.transaction_id)
            .ext("MSG_REGION", "DefaultRegion")
            .ext("TRACE_ON", "true");
        frame.finish(&[]);
    }
}

impl Broker {
    pub(crate) fn send_message(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        self.refuse_write_if_slave()?;
        self.refuse_send_if_overloaded(connection.dispatched_at())?;
        let header = SendHeader::parse(request)?;
        validate_topic_name(header.topic)?;
        if topics::NOT_ALLOWED_SEND_TOPICS.contains(&header.topic) {
            return Err(RequestError::NoPermission(format!(
                "Sending message to topic[{}] is forbidden.",
                header.topic
            )));
        }
        let queue_id = self.resolve_queue(&header)?;
        let mut messages: SmallVec<[Prepared<'_>; 1]> = if header.batch {
            SmallVec::from_vec(self.prepare_batch(request.body, header.properties)?)
        } else {
            smallvec![self.prepare_one(header.flag, request.body, header.properties)?]
        };
        let retry = self.retry_limit(
            header.topic,
            header.reconsume_times,
            header.max_reconsume_times,
        )?;
        // A transactional half travels alone (batches carry none).
        let half = !header.batch && messages[0].transaction;
        if half {
            self.admit_half()?;
        }
        let born_host = to_v4(connection.peer);
        if messages.len() > 1 {
            // A batch is stored whole or not at all: refuse it up front when the store has
            // no room for all of it (RocketMQ stores a batch as one unit).
            let topic_len = header.topic.len();
            let total: usize = messages
                .iter()
                .map(|m| record::encoded_size(m.body.len(), topic_len, m.properties.len() + 64))
                .sum();
            self.store
                .check_room(total as u64)
                .map_err(|error| self.refused_by_store(error, connection))?;
        }
        let mut results: SmallVec<[AppendResult; 1]> = SmallVec::with_capacity(messages.len());
        let mut reply_queue_id = queue_id;
        for message in &mut messages {
            let destination = route(&RouteRequest {
                topic: header.topic,
                queue_id,
                retry,
                half,
                wait: message.divert,
            });
            if matches!(destination, Destination::DeadLetter { .. }) {
                reply_queue_id = 0;
            }
            let outgoing = Outgoing {
                flag: message.flag,
                sys_flag: header.sys_flag,
                born_timestamp_ms: header.born_timestamp_ms,
                born_host,
                reconsume_times: header.reconsume_times,
                prepared_transaction_offset: 0,
                body: message.body,
                properties: &mut message.properties,
                tags_code: message.tags_code,
                keys: Some(MessageKeys::from_parts(
                    Some(&message.unique_id),
                    message.keys,
                )),
                unique_id: &message.unique_id,
                producer_group: header.producer_group,
            };
            let appended = self.append(outgoing, &destination).map_err(|error| {
                self.stats.put_latency.borrow_mut().failures += 1;
                self.refused_by_store(error, connection)
            })?;
            results.push(appended);
        }
        let queue_id = reply_queue_id;
        if request.is_oneway() {
            return Ok(());
        }
        let reply = SendReply::new(self, queue_id, &messages, &results);
        let opaque = request.opaque;
        let topic_version = self.topics.borrow_mut().version_to_wait_for(header.topic);
        if let Some(version) = topic_version {
            // A topic just created: answered once its config is on disk (and, SYNC_FLUSH,
            // the message too).
            let end_offset = results.last().map_or(0, |r| r.end_offset.0);
            self.answer_after_topic_durable(version, end_offset, connection, opaque, |out| {
                reply.encode(out, opaque, response_code::SUCCESS)
            });
            return Ok(());
        }
        let end_offset = results.last().map_or(0, |r| r.end_offset.0);
        // SYNC_MASTER: answered once the slave has the records; with no slave in sync, at
        // once (or once durable) as SLAVE_NOT_AVAILABLE, the message stored (RocketMQ).
        let mut code = response_code::SUCCESS;
        if self.ha.role() == crate::ha::BrokerRole::SyncMaster {
            if self.ha.slave_in_sync(end_offset) {
                let replies = self.ha.sync_replies.clone();
                replies.push(self, end_offset, connection, opaque, |out, code| {
                    reply.encode(out, opaque, code)
                });
                return Ok(());
            }
            code = response_code::SLAVE_NOT_AVAILABLE;
        }
        match self.store.flush_mode() {
            FlushMode::Async => reply.send(connection, opaque, code),
            FlushMode::Sync => {
                self.durable_replies
                    .push(&self.store, end_offset, connection, opaque, |out| {
                        reply.encode(out, opaque, code)
                    });
            }
        }
        Ok(())
    }

    /// A slave takes no writes (RocketMQ's checkBeforePutMessage: SERVICE_NOT_AVAILABLE).
    pub(crate) fn refuse_write_if_slave(&self) -> Result<(), RequestError> {
        if let Some(holder) = self.ha.replaced.borrow().as_ref() {
            return Err(RequestError::ServiceNotAvailable(format!(
                "service not available now: {} was replaced as master of its broker name \
                 ({holder}); send to the master the namesrv routes to",
                self.identity.broker_name
            )));
        }
        if !self.ha.is_slave() {
            return Ok(());
        }
        Err(RequestError::ServiceNotAvailable(format!(
            "service not available now. It may be caused by one of the following reasons: the \
             broker's disk is full, messages are put to the slave, message store has been shut \
             down, etc. ({} is a SLAVE: send to its master)",
            self.identity.broker_name
        )))
    }

    /// Sends the answer `encode` writes once the topics file is on disk up to `version` and,
    /// with SYNC_FLUSH, the store up to `end_offset`; a failed wait answers its error.
    fn answer_after_topic_durable(
        &self,
        version: u64,
        end_offset: u64,
        connection: &Rc<Connection>,
        opaque: i32,
        encode: impl FnOnce(&mut Vec<u8>),
    ) {
        let mut answer = Vec::new();
        encode(&mut answer);
        let file = self.topics.borrow().persisted().clone();
        let store = (self.store.flush_mode() == FlushMode::Sync).then(|| self.store.clone());
        let connection = connection.clone();
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            if let Err(why) = file.durable(version).await {
                let error = RequestError::ServiceNotAvailable(format!(
                    "the topic's config could not be written ({why}); the message is stored, \
                     the topic is written again every {} ms",
                    crate::persist::PERSIST_RETRY_MS
                ));
                return error.respond(&connection, opaque);
            }
            if let Some(store) = store {
                if let Err(error) = store
                    .wait_durable(shards::CommitLogOffset(end_offset))
                    .await
                {
                    return store_error(error).respond(&connection, opaque);
                }
            }
            connection.send_with(|out| out.extend_from_slice(&answer));
        });
    }

    /// A send the store refused. Refused for want of room (the disk is behind), the
    /// connection reads no more requests until the disk has caught up by half the bound, or
    /// `SEND_QUEUE_WAIT_MAX_MS`: a closed-loop client would otherwise keep sending frames
    /// that are read and refused at once (with batches, as many bytes as were stored: half the
    /// shard's time and memory bandwidth, which the disk then lacks).
    pub(crate) fn refused_by_store(
        &self,
        error: StoreError,
        connection: &Rc<Connection>,
    ) -> RequestError {
        if matches!(error, StoreError::Busy { .. }) {
            let room = self.store.room();
            let limit = std::time::Duration::from_millis(
                crate::broker::tasks::ticking::SEND_QUEUE_WAIT_MAX_MS,
            );
            connection.hold_reads_until(async move {
                futures_lite::future::or(room, shards::runtime::sleep(limit)).await
            });
        }
        store_error(error)
    }

    /// The queue to write: the asked one (auto-creating the topic if needed) or, when the
    /// client leaves it to us (< 0), the next one round-robin.
    pub(crate) fn resolve_queue(&self, header: &SendHeader<'_>) -> Result<u32, RequestError> {
        // Only what is needed is taken from the table: a clone of the topic's config cost
        // two allocations and frees a message.
        let needed =
            |config: &TopicConfig| (config.perm, config.read_queue_nums, config.write_queue_nums);
        let existing = self.topics.borrow().get(header.topic).map(needed);
        let (perm, read_queue_nums, write_queue_nums) = match existing {
            Some(existing) => existing,
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
                self.topics
                    .borrow()
                    .check_room(header.topic, crate::limits::TOPICS_MAX)?;
                let taken = needed(&created);
                self.upsert_topic_everywhere(created);
                taken
            }
        };
        if perm & crate::body::perm::WRITE == 0 {
            return Err(RequestError::NoPermission(format!(
                "the topic[{}] sending message is forbidden",
                header.topic
            )));
        }
        let queue_count = write_queue_nums.max(read_queue_nums);
        if header.queue_id < 0 {
            let next = self.next_queue.get();
            self.next_queue.set(next.wrapping_add(1));
            return Ok(next % write_queue_nums.max(1));
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

    pub(crate) fn prepare_one<'a>(
        &self,
        flag: i32,
        body: &'a [u8],
        properties: &'a str,
    ) -> Result<Prepared<'a>, RequestError> {
        if body.len() > store::MESSAGE_SIZE_MAX_BYTES {
            return Err(RequestError::MessageIllegal(format!(
                "the message body size {} is over the limit {}",
                body.len(),
                store::MESSAGE_SIZE_MAX_BYTES
            )));
        }
        let scan = PropertyScan::of(properties);
        let tags_code = scan.tags.map_or(0, |tag| i64::from(java_string_hash(tag)));
        let divert = if scan.may_wait {
            divert_for(
                &parse_properties(properties.as_bytes()),
                &self.schedule.borrow().levels,
                self.now_ms(),
            )?
        } else {
            Divert::None
        };
        let mut completed = Vec::with_capacity(properties.len() + 64);
        completed.extend_from_slice(properties.as_bytes());
        if !completed.is_empty() && completed.last() != Some(&2) {
            completed.push(2);
        }
        let unique_id = match scan.unique_key {
            Some(id) => Cow::Borrowed(id),
            None => {
                let id = self.generate_unique_id();
                push_property(&mut completed, property::UNIQ_KEY, &id);
                Cow::Owned(id)
            }
        };
        if !scan.has_cluster {
            push_property(
                &mut completed,
                property::CLUSTER,
                &self.identity.cluster_name,
            );
        }
        if completed.len() > store::STORED_PROPERTIES_MAX_BYTES {
            return Err(RequestError::MessageIllegal(format!(
                "the message properties length {} is over the limit {}",
                completed.len(),
                store::STORED_PROPERTIES_MAX_BYTES
            )));
        }
        Ok(Prepared {
            flag,
            body,
            properties: completed,
            unique_id,
            tags_code,
            divert,
            transaction: scan.transaction,
            keys: scan.keys,
        })
    }

    /// Splits a batch body (§5.5) and prepares each of its messages.
    pub(crate) fn prepare_batch<'a>(
        &self,
        body: &'a [u8],
        _outer_properties: &str,
    ) -> Result<Vec<Prepared<'a>>, RequestError> {
        let entries = shardmq_protocol::batch::decode(body, BATCH_MESSAGES_MAX)
            .map_err(|why| RequestError::MessageIllegal(format!("bad batch body: {why}")))?;
        entries
            .iter()
            .map(|entry| self.prepare_one(entry.flag, entry.body, entry.properties))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remoting::{LanguageCode, SerializeType};

    fn request<'a>(code: i32, fields: &[(&'a str, &'a str)]) -> RemotingCommand<'a> {
        let mut ext_fields = crate::remoting::ExtFields::new();
        for (key, value) in fields {
            ext_fields.push(*key, *value);
        }
        RemotingCommand {
            code,
            language: LanguageCode::Java,
            version: 0,
            opaque: 1,
            flag: 0,
            remark: None,
            ext_fields,
            body: b"",
            serialize_type: SerializeType::Json,
        }
    }

    fn field_error(result: Result<SendHeader<'_>, RequestError>) -> String {
        match result {
            Err(RequestError::Field(error)) => error.to_string(),
            Err(other) => panic!("not a field error: {other}"),
            Ok(_) => panic!("parsed"),
        }
    }

    #[test]
    fn v2_letters_and_v1_names_read_the_same_header() {
        let v2 = request(
            request_code::SEND_MESSAGE_V2,
            &[
                ("a", "G"),
                ("b", "T"),
                ("d", "8"),
                ("e", "3"),
                ("f", ""),
                ("g", "1700000000000"),
                ("i", "UNIQ_KEY\u{1}U\u{2}"),
                ("j", "2"),
                ("k", "false"),
                ("l", "16"),
                ("m", "1"),
                ("e", "5"),
            ],
        );
        let header = SendHeader::parse(&v2).unwrap();
        assert_eq!((header.producer_group, header.topic), ("G", "T"));
        assert_eq!(header.default_topic, topics::AUTO_CREATE_TOPIC_KEY_TOPIC);
        assert_eq!(header.default_topic_queue_nums, 8);
        assert_eq!(header.queue_id, 5, "a repeated key keeps its last value");
        assert_eq!(header.sys_flag, 0, "an empty number is absent");
        assert_eq!(header.born_timestamp_ms, 1_700_000_000_000);
        assert_eq!(header.properties, "UNIQ_KEY\u{1}U\u{2}");
        assert_eq!(header.reconsume_times, 2);
        assert_eq!(header.max_reconsume_times, Some(16));
        assert!(header.batch, "C++ sends booleans as 1/0");

        let v1 = request(
            request_code::SEND_MESSAGE,
            &[
                ("producerGroup", "G"),
                ("topic", "T"),
                ("defaultTopic", "D"),
                ("queueId", "1"),
                ("sysFlag", "4"),
                ("flag", "7"),
                ("a", "ignored: a V2 letter in a V1 header"),
            ],
        );
        let header = SendHeader::parse(&v1).unwrap();
        assert_eq!(header.producer_group, "G");
        assert_eq!(header.default_topic, "D");
        assert_eq!((header.queue_id, header.sys_flag, header.flag), (1, 4, 7));
        assert_eq!(header.max_reconsume_times, None);
        assert!(!header.batch);
    }

    #[test]
    fn missing_and_malformed_fields_are_named() {
        let no_group = request(request_code::SEND_MESSAGE_V2, &[("b", "T"), ("e", "0")]);
        assert!(field_error(SendHeader::parse(&no_group)).contains("<a>"));
        let no_queue = request(
            request_code::SEND_MESSAGE,
            &[("producerGroup", "G"), ("topic", "T")],
        );
        assert!(field_error(SendHeader::parse(&no_queue)).contains("<queueId>"));
        let bad = request(
            request_code::SEND_MESSAGE_V2,
            &[("a", "G"), ("b", "T"), ("e", "0"), ("f", "4294967296")],
        );
        let error = field_error(SendHeader::parse(&bad));
        assert!(
            error.contains("<f>") && error.contains("4294967296"),
            "{error}"
        );
        let empty_queue = request(
            request_code::SEND_MESSAGE_V2,
            &[("a", "G"), ("b", "T"), ("e", "")],
        );
        assert!(field_error(SendHeader::parse(&empty_queue)).contains("<e>"));
    }

    #[test]
    fn one_pass_over_the_properties_finds_what_the_send_path_needs() {
        let scan = PropertyScan::of(
            "TAGS\u{1}\u{2}TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}UNIQ_KEY\u{1}U1\u{2}UNIQ_KEY\u{1}U2\u{2}\
             TRAN_MSG\u{1}true\u{2}CLUSTER\u{1}c\u{2}TIMER_DELAY_SEC\u{1}3\u{2}junk\u{2}",
        );
        assert_eq!(scan.tags, Some("a"), "an empty value is skipped");
        assert_eq!(scan.unique_key, Some("U1"));
        assert_eq!(scan.keys, Some("k1 k2"));
        assert!(scan.transaction && scan.has_cluster && scan.may_wait);
        let plain = PropertyScan::of("WAIT\u{1}true\u{2}TRAN_MSG\u{1}TRUE\u{2}TRAN_MSG\u{1}false");
        assert!(!plain.transaction, "the last TRAN_MSG counts");
        assert!(!plain.may_wait && !plain.has_cluster && plain.unique_key.is_none());
        assert!(PropertyScan::of("DELAY\u{1}2").may_wait);
    }
}
