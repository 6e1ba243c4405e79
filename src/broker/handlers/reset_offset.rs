//! INVOKE_BROKER_TO_RESET_OFFSET (222): moves a consumer group's offsets on this shard's
//! queues of a topic to a point in time, and tells the group's live consumers
//! (RESET_CONSUMER_CLIENT_OFFSET, 220) so that they start over from there.
//!
//! The admin (`mqadmin resetOffsetByTime`) sends the request to every broker of the topic's
//! route, i.e. to every shard; each shard answers for its own queues. Header: `topic`,
//! `group`, `timestamp` (ms; negative means "the end of each queue"), `isForce` (false: a
//! queue only moves back, never forward), and from 5.x optionally `queueId` with `offset`
//! (one queue, to an explicit offset).
//!
//! What happens, per queue (RocketMQ's `Broker2Client.resetOffset` and 5.x's server-side
//! reset together): the offset is found by store time (the first message stored at or after
//! `timestamp`, the queue's end if none), kept if not forced and the group is already before
//! it, and committed to this shard's offset table, so a consumer that starts later, or
//! re-reads its offset, begins there. The admin gets the table as a `ResetOffsetBody`.
//! Unlike RocketMQ 4.x, a group with no live consumer is reset too (as 5.x does) instead of
//! being answered CONSUMER_NOT_ONLINE.
//!
//! Live consumers are moved two ways:
//! - Java, Go and other non-C++ consumer connections of the group get a oneway 220 with the
//!   table as a fastjson `ResetOffsetBody`, as RocketMQ 4.x sends it; they drop what they
//!   hold and pull again from the new offsets.
//! - Every queue is also marked in [`PendingResets`] and its parked pulls woken: the group's
//!   next pull there that asks for another offset is answered PULL_RETRY_IMMEDIATELY with
//!   `nextBeginOffset` at the reset offset (the remark says NO_MATCHED_MESSAGE), and every
//!   client then pulls from there (5.x answers OFFSET_MOVED; a Java client drops its queue on
//!   that until its next rebalance, so the gentler answer is used). This is how C++ clients
//!   are moved: they are sent no 220, because the C++ client (the one in PyPI `rocketmq`
//!   0.4.4 at least) handles it on its network threads and waits there for its own held
//!   pulls to finish, so the pushes of two shards block both threads and it deadlocks (seen
//!   in its log: "has unfinished pullMsgEvent" forever). `ResetOffsetBodyForC` is still
//!   written correctly by the protocol module for clients that want it.

use std::rc::Rc;

use shards::store::{GetMessageResult, GetStatus};

use crate::body::{MessageQueue, ResetOffsetBody};
use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{request_code, response_code, FrameEncoder, LanguageCode, RemotingCommand};
use crate::server::Connection;

/// What one reset asks for, owned (it is served after the request buffer moves on).
pub(crate) struct ResetRequest {
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) timestamp_ms: i64,
    pub(crate) force: bool,
    /// One queue and, optionally, its explicit target offset (5.x); None: every queue.
    pub(crate) single_queue: Option<(u32, Option<u64>)>,
}

impl Broker {
    pub(crate) fn invoke_broker_to_reset_offset(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let topic = ext.required("topic")?;
        let group = ext.required("group")?;
        let timestamp_ms = ext.required_i64("timestamp")?;
        let force = ext.bool_lenient("isForce").unwrap_or(false);
        let read_queues = match self.topics.borrow().get(topic) {
            Some(config) => config.read_queue_nums,
            None => {
                return Err(RequestError::TopicNotExist(format!(
                    "[reset-offset] reset offset failed, no topic in this broker. topic={topic}"
                )))
            }
        };
        let single_queue = match ext.optional_i32("queueId")? {
            None | Some(-1) => None,
            Some(queue_id) if queue_id >= 0 && (queue_id as u32) < read_queues => {
                let offset = ext.optional_i64("offset")?.filter(|offset| *offset != -1);
                if offset.is_some_and(|offset| offset < 0) {
                    return Err(RequestError::InvalidParameter(format!(
                        "offset {offset:?} is illegal"
                    )));
                }
                Some((queue_id as u32, offset.map(|offset| offset as u64)))
            }
            Some(queue_id) => {
                return Err(RequestError::InvalidParameter(format!(
                    "queueId[{queue_id}] is illegal, topic:[{topic}] readQueueNums:[{read_queues}]"
                )))
            }
        };
        let reset = ResetRequest {
            topic: topic.to_string(),
            group: group.to_string(),
            timestamp_ms,
            force,
            single_queue,
        };
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            match broker.reset_offsets(&reset, read_queues).await {
                Ok(table) => {
                    broker.push_reset_to_consumers(&reset, &table);
                    if !oneway {
                        let body = table.encode();
                        connection.send_with(|out| {
                            FrameEncoder::response(out, response_code::SUCCESS, opaque)
                                .finish(&body);
                        });
                    }
                }
                Err(error) if !oneway => error.respond(&connection, opaque),
                Err(_) => {}
            }
        });
        Ok(())
    }
}

impl Broker {
    /// Finds each queue's target offset and commits it; returns the table the group now has.
    pub(crate) async fn reset_offsets(
        &self,
        reset: &ResetRequest,
        read_queues: u32,
    ) -> Result<ResetOffsetBody, RequestError> {
        let queues: Vec<(u32, Option<u64>)> = match reset.single_queue {
            Some(single) => vec![single],
            None => (0..read_queues).map(|queue_id| (queue_id, None)).collect(),
        };
        let mut table = ResetOffsetBody::default();
        for (queue_id, explicit) in queues {
            let target = self
                .reset_target(&reset.topic, queue_id, explicit, reset.timestamp_ms)
                .await?;
            let current = self
                .offsets
                .borrow()
                .query(&reset.group, &reset.topic, queue_id);
            // Not forced: a queue only moves back (RocketMQ keeps an offset already before it).
            let offset = match current {
                Some(current) if !reset.force && current <= target as i64 => current,
                _ => target as i64,
            };
            self.offsets
                .borrow_mut()
                .commit(&reset.group, &reset.topic, queue_id, offset);
            self.pending_resets.borrow_mut().insert(
                &reset.group,
                &reset.topic,
                queue_id,
                offset as u64,
            );
            // Held pulls of the queue re-read now and meet the pending reset.
            self.pull_waiters.wake_queue(&reset.topic, queue_id);
            let queue = MessageQueue {
                topic: reset.topic.clone(),
                broker_name: self.identity.broker_name.clone(),
                queue_id,
            };
            table.offset_table.push((queue, offset));
        }
        Ok(table)
    }
}

impl Broker {
    /// The offset a queue is reset to: the explicit one (checked against the queue's
    /// bounds), the queue's end for a negative timestamp, else the first message stored at
    /// or after the timestamp.
    pub(crate) async fn reset_target(
        &self,
        topic: &str,
        queue_id: u32,
        explicit: Option<u64>,
        timestamp_ms: i64,
    ) -> Result<u64, RequestError> {
        let (min, max) = (
            self.store
                .min_queue_offset(topic, shards::QueueId(queue_id)),
            self.store
                .max_queue_offset(topic, shards::QueueId(queue_id)),
        );
        if let Some(offset) = explicit {
            if offset < min.0 || offset > max.0 {
                return Err(RequestError::SystemError(format!(
                    "Target offset {offset} not in consume queue range [{min}-{max}]"
                )));
            }
            return Ok(offset);
        }
        if timestamp_ms < 0 {
            return Ok(max.0);
        }
        self.store
            .queue_offset_by_timestamp(topic, shards::QueueId(queue_id), timestamp_ms, false)
            .await
            .map(|offset| offset.0)
            .map_err(store_error)
    }
}

impl Broker {
    /// RESET_CONSUMER_CLIENT_OFFSET (oneway) to every non-C++ consumer connection of the
    /// group here (C++ ones are moved by the pull path, see the module doc).
    pub(crate) fn push_reset_to_consumers(&self, reset: &ResetRequest, table: &ResetOffsetBody) {
        let clients = self.clients.borrow();
        let Some(group) = clients.consumers.get(&reset.group) else {
            return;
        };
        let mut body = None;
        for channel in group.clients.values() {
            if channel.language == LanguageCode::Cpp {
                continue;
            }
            let body = body.get_or_insert_with(|| table.encode());
            let connection = &channel.connection;
            let opaque = connection.next_opaque();
            connection.send_with(|out| {
                let mut frame = FrameEncoder::request(
                    out,
                    request_code::RESET_CONSUMER_CLIENT_OFFSET,
                    opaque,
                    true,
                );
                frame
                    .ext("topic", &reset.topic)
                    .ext("group", &reset.group)
                    .ext_i64("timestamp", reset.timestamp_ms)
                    .ext_bool("isForce", reset.force);
                frame.finish(body);
            });
        }
    }
}

impl Broker {
    /// The pull path of a reset: a pull of `offset` on a queue reset since the group last
    /// pulled there is answered PULL_RETRY_IMMEDIATELY with `nextBeginOffset` at the reset.
    pub(crate) fn pending_reset_answer(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Option<GetMessageResult> {
        let reset_to = self
            .pending_resets
            .borrow_mut()
            .take(group, topic, queue_id, offset)?;
        Some(GetMessageResult {
            status: GetStatus::NoMatchedMessage,
            next_begin_offset: shards::QueueOffset(reset_to),
            min_offset: self
                .store
                .min_queue_offset(topic, shards::QueueId(queue_id)),
            max_offset: self
                .store
                .max_queue_offset(topic, shards::QueueId(queue_id)),
            message_count: 0,
            body: Vec::new(),
        })
    }
}
