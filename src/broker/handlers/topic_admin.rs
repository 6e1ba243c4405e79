//! Topic administration: UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215),
//! GET_ALL_TOPIC_CONFIG (21). A topic lives on every shard of the node: a change made here is
//! broadcast to the others, and answered once it is on disk and in the local route.

use std::rc::Rc;
use std::time::Duration;

use crate::body::TopicConfig;
use crate::broker::state::topics::validate_topic_name;
use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// Longest a topic creation waits for the local route replica to list every shard.
pub(crate) const ROUTE_WAIT_MAX_MS: u64 = 3_000;

impl Broker {
    pub(crate) fn update_and_create_topic(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let topic = ext.required("topic")?;
        validate_topic_name(topic)?;
        let read = ext.optional_i32("readQueueNums")?.unwrap_or(16);
        let write = ext.optional_i32("writeQueueNums")?.unwrap_or(16);
        let topic_perm = ext.optional_i32("perm")?.unwrap_or(6);
        if !(1..=1024).contains(&read) || !(1..=1024).contains(&write) {
            return Err(RequestError::InvalidParameter(format!(
                "queue counts must be between 1 and 1024 (read {read}, write {write})"
            )));
        }
        let mut config = TopicConfig::new(topic, write as u32, topic_perm as u32);
        config.read_queue_nums = read as u32;
        if let Some(filter_type) = ext.get_non_empty("topicFilterType") {
            config.topic_filter_type = filter_type.to_string();
        }
        config.topic_sys_flag = ext.optional_i32("topicSysFlag")?.unwrap_or(0).max(0) as u32;
        config.order = ext.bool_lenient("order").unwrap_or(false);
        self.topics
            .borrow()
            .check_room(topic, crate::limits::TOPICS_MAX)?;
        self.upsert_topic_everywhere(config.clone());
        let file = self.topics.borrow().persisted().clone();
        let version = file.latest();
        let Some(local) = self.local_routes.clone() else {
            self.answer_when_durable(file, version, connection, request);
            return Ok(());
        };
        let (connection, opaque, oneway) =
            (connection.clone(), request.opaque, request.is_oneway());
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let routed = || {
                let table = local.table.borrow();
                let complete = table.route(&config.topic_name).is_some_and(|route| {
                    route.queue_datas.len() >= local.shard_count
                        && route
                            .queue_datas
                            .iter()
                            .all(|q| q.write_queue_nums == config.write_queue_nums)
                });
                complete && (local.replicas_caught_up)()
            };
            let deadline = std::time::Instant::now() + Duration::from_millis(ROUTE_WAIT_MAX_MS);
            while !routed() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                shards::runtime::timeout(left, local.changed.wait()).await;
            }
            let durable = file.durable(version).await;
            if oneway {
                return;
            }
            match durable {
                Ok(()) => connection.respond_to(opaque, response_code::SUCCESS, None),
                Err(why) => RequestError::SystemError(format!(
                    "topic {} is created in memory but not yet on disk ({why}); it is \
                     written again every {} ms until it is",
                    config.topic_name,
                    crate::persist::PERSIST_RETRY_MS
                ))
                .respond(&connection, opaque),
            }
        });
        Ok(())
    }
}

impl Broker {
    pub(crate) fn delete_topic(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?.to_string();
        if self.remove_topic_locally(&topic) {
            self.registration.everything();
        }
        (self.broadcast_topic)(&crate::broker::TopicChange::Delete(topic));
        let file = self.topics.borrow().persisted().clone();
        self.answer_when_durable(file.clone(), file.latest(), connection, request);
        Ok(())
    }
}

impl Broker {
    pub(crate) fn all_topic_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let snapshot = self.topics.borrow().snapshot();
        let total = snapshot.topics.len();
        let body = snapshot.encode();
        connection.answer_with(request, |out| {
            let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
            frame.ext_i64("totalTopicNum", total as i64);
            frame.finish(&body);
        });
        Ok(())
    }
}
