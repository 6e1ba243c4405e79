//! Offsets and positions: QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15),
//! GET_MAX_OFFSET (30), GET_MIN_OFFSET (31), SEARCH_OFFSET_BY_TIMESTAMP (29),
//! GET_EARLIEST_MSG_STORETIME (32), GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45).

use std::rc::Rc;

use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{response_code, ExtFields, FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// A queue whose first unit lies within this many bytes of the commitlog's end is "young":
/// a new group starts there at 0 and misses nothing (RocketMQ's message-still-in-memory rule,
/// with a fixed window instead of 40% of RAM).
pub const YOUNG_QUEUE_WINDOW_BYTES: u64 = 4 << 30;

pub(crate) fn topic_and_queue<'a>(ext: &'a ExtFields<'a>) -> Result<(&'a str, u32), RequestError> {
    let topic = ext.required("topic")?;
    let queue_id = ext.required_i32("queueId")?;
    if queue_id < 0 {
        return Err(RequestError::InvalidParameter(format!(
            "queueId[{queue_id}] is illegal"
        )));
    }
    Ok((topic, queue_id as u32))
}

/// SUCCESS with `key` = `value` in its ext fields, to `request` (nothing for a oneway one).
pub(crate) fn respond_offset(
    connection: &Connection,
    request: &RemotingCommand<'_>,
    key: &str,
    value: i64,
) {
    if !request.is_oneway() {
        respond_offset_to(connection, request.opaque, key, value);
    }
}

/// [`respond_offset`], to the request with `opaque` (answered later, once it is gone).
pub(crate) fn respond_offset_to(connection: &Connection, opaque: i32, key: &str, value: i64) {
    connection.send_with(|out| {
        let mut frame = FrameEncoder::response(out, response_code::SUCCESS, opaque);
        frame.ext_i64(key, value);
        frame.finish(&[]);
    });
}

impl Broker {
    pub(crate) fn query_consumer_offset(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("consumerGroup")?;
        let (topic, queue_id) = topic_and_queue(ext)?;
        if let Some(offset) = self.offsets.borrow().query(group, topic, queue_id) {
            respond_offset(connection, request, "offset", offset);
            return Ok(());
        }
        let min_offset = self
            .store
            .min_queue_offset(topic, shards::QueueId(queue_id));
        let max_offset = self
            .store
            .max_queue_offset(topic, shards::QueueId(queue_id));
        // As Java's broker: a queue that never lost its first message and whose offset 0 is
        // not on disk yet (here: the store is young; always for an empty queue) starts a new
        // group at 0. Answering "not found" for an empty queue made a consumer started before
        // the first sends fall back to the max offset, racing (and skipping) them.
        let young = min_offset == shards::QueueOffset(0)
            && (max_offset == shards::QueueOffset(0)
                || self
                    .store
                    .max_physical_offset()
                    .0
                    .saturating_sub(self.store.min_physical_offset().0)
                    <= YOUNG_QUEUE_WINDOW_BYTES);
        if young && ext.bool_lenient("setZeroIfNotFound") != Some(false) {
            respond_offset(connection, request, "offset", 0);
        } else {
            connection.respond(
                request,
                response_code::QUERY_NOT_FOUND,
                Some("Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"),
            );
        }
        Ok(())
    }
}

impl Broker {
    pub(crate) fn update_consumer_offset(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("consumerGroup")?;
        let (topic, queue_id) = topic_and_queue(ext)?;
        let offset = ext.required_i64("commitOffset")?;
        // As RocketMQ 5: the topic must be this broker's, and the queue one a consumer may
        // pull (on a slave, one it holds a copy of, as the pull itself).
        let (read_queues, _) = self.consumable_queues(topic)?;
        if queue_id >= read_queues {
            return Err(RequestError::InvalidParameter(format!(
                "queueId[{queue_id}] is illegal, topic [{topic}] has {read_queues} read queues"
            )));
        }
        self.commit_offset(group, topic, queue_id, offset)?;
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    /// A client's commit (UPDATE_CONSUMER_OFFSET, or a pull's commitOffset). On a slave it is
    /// also kept apart, to outlive the master's older offsets and be handed back to the
    /// master when it returns (`ha::metadata`). Refused for a queue offset not kept yet once
    /// `CONSUMER_OFFSETS_MAX` are.
    pub(crate) fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: i64,
    ) -> Result<(), RequestError> {
        let mut offsets = self.offsets.borrow_mut();
        let held = offsets.queue_count();
        if held >= crate::limits::CONSUMER_OFFSETS_MAX && !offsets.holds(group, topic, queue_id) {
            return Err(RequestError::SystemError(format!(
                "this broker already keeps {held} consumer offsets, the most it keeps: the \
                 offset of {group} on {topic} queue {queue_id} is not kept"
            )));
        }
        offsets.commit(group, topic, queue_id, offset);
        drop(offsets);
        if self.ha.is_slave() && offset >= 0 {
            let key = (group.to_string(), topic.to_string(), queue_id);
            self.ha
                .master
                .local_commits
                .borrow_mut()
                .insert(key, offset);
        }
        Ok(())
    }

    /// A pull's commit that `commit_offset` refused: logged a few times a second at most.
    pub(crate) fn note_refused_commit(&self, refused: &RequestError) {
        REFUSED_COMMIT_LOG.with(|log| {
            if let Some(left_out) = log.borrow_mut().allow(std::time::Instant::now()) {
                log::warn!(
                    "{}: a pull's commitOffset: {refused}{}",
                    self.identity.broker_name,
                    shards::throttle::LogThrottle::repeats(left_out)
                );
            }
        });
    }
}

thread_local! {
    static REFUSED_COMMIT_LOG: std::cell::RefCell<shards::throttle::LogThrottle> =
        std::cell::RefCell::default();
}

impl Broker {
    pub(crate) fn get_max_offset(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let (topic, queue_id) = topic_and_queue(&request.ext_fields)?;
        let offset = self
            .store
            .max_queue_offset(topic, shards::QueueId(queue_id));
        respond_offset(connection, request, "offset", offset.0 as i64);
        Ok(())
    }
}

impl Broker {
    pub(crate) fn get_min_offset(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let (topic, queue_id) = topic_and_queue(&request.ext_fields)?;
        let offset = self
            .store
            .min_queue_offset(topic, shards::QueueId(queue_id));
        respond_offset(connection, request, "offset", offset.0 as i64);
        Ok(())
    }
}

impl Broker {
    pub(crate) fn search_offset_by_timestamp(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let (topic, queue_id) = topic_and_queue(ext)?;
        let timestamp_ms = ext.required_i64("timestamp")?;
        let upper = ext
            .get("boundaryType")
            .is_some_and(|b| b.eq_ignore_ascii_case("upper"));
        if request.is_oneway() {
            return Ok(()); // a lookup nobody waits for
        }
        let (broker, connection, topic) = (self.clone(), connection.clone(), topic.to_string());
        let opaque = request.opaque;
        shards::runtime::spawn_detached(async move {
            let found = broker.store.queue_offset_by_timestamp(
                &topic,
                shards::QueueId(queue_id),
                timestamp_ms,
                upper,
            );
            match found.await {
                Ok(offset) => respond_offset_to(&connection, opaque, "offset", offset.0 as i64),
                Err(error) => store_error(error).respond(&connection, opaque),
            }
        });
        Ok(())
    }
}

impl Broker {
    pub(crate) fn earliest_msg_store_time(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let (topic, queue_id) = topic_and_queue(&request.ext_fields)?;
        if request.is_oneway() {
            return Ok(()); // a lookup nobody waits for
        }
        let (broker, connection, topic) = (self.clone(), connection.clone(), topic.to_string());
        let opaque = request.opaque;
        shards::runtime::spawn_detached(async move {
            match broker
                .store
                .earliest_store_time(&topic, shards::QueueId(queue_id))
                .await
            {
                Ok(time) => respond_offset_to(&connection, opaque, "timestamp", time.unwrap_or(-1)),
                Err(error) => store_error(error).respond(&connection, opaque),
            }
        });
        Ok(())
    }
}

impl Broker {
    pub(crate) fn all_consumer_offset(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let table = crate::body::ConsumerOffsetTable {
            offsets: self.offsets.borrow().entries().clone(),
        };
        connection.respond_body(request, &table.encode_pretty());
        Ok(())
    }
}

impl Broker {
    /// GET_ALL_DELAY_OFFSET (45): the delayOffset.json form of this shard's progress.
    pub(crate) fn all_delay_offset(
        &self,
        request: &crate::remoting::RemotingCommand<'_>,
        connection: &Rc<crate::server::Connection>,
    ) -> Result<(), RequestError> {
        let json = self.schedule.borrow().to_json();
        let body = serde_json::to_vec(&json).unwrap_or_default();
        connection.respond_body(request, &body);
        Ok(())
    }
}
