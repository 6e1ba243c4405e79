//! Clients and administration: HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP,
//! CHECK_CLIENT_CONFIG, LOCK/UNLOCK_BATCH_MQ, UPDATE_AND_CREATE_TOPIC,
//! DELETE_TOPIC_IN_BROKER, GET_ALL_TOPIC_CONFIG, GET_BROKER_RUNTIME_INFO.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::body::{
    self, perm, CheckClientConfigBody, HeartbeatData, LockBatchRequest, TopicConfig,
};
use crate::error::{now_ms, RequestError};
use crate::namesrv::respond_body;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand, BROKER_VERSION};
use crate::server::Connection;

use super::topics::{validate_topic_name, RETRY_GROUP_TOPIC_PREFIX};

/// Longest a topic creation waits for the local route replica to list every shard.
const ROUTE_WAIT_MAX_MS: u64 = 3_000;
const ROUTE_WAIT_POLL_MS: u64 = 2;
use super::Broker;

impl Broker {
    pub(super) fn heart_beat(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let data = HeartbeatData::parse(request.body)?;
        if self.clients.borrow().consumers.len() >= super::clients::GROUPS_MAX {
            return Err(RequestError::SystemBusy(
                "too many consumer groups on this broker".into(),
            ));
        }
        for consumer in &data.consumers {
            // RocketMQ creates the group on first use and its retry topic with the group's
            // retryQueueNums; an invalid group name gets neither (its pulls are refused).
            let Some(group) = self
                .groups
                .borrow_mut()
                .find_or_create(&consumer.group_name)
            else {
                continue;
            };
            self.ensure_retry_topic(&consumer.group_name, group.retry_queue_nums);
        }
        let changed =
            self.clients
                .borrow_mut()
                .heartbeat(&data, connection, request.language, now_ms());
        self.notify_groups(&changed);
        if request.is_oneway() {
            return Ok(());
        }
        connection.send_with(|out| {
            let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
            frame
                .ext_bool("IS_SUPPORT_HEART_BEAT_V2", false)
                .ext_bool("IS_SUB_CHANGE", !changed.is_empty());
            frame.finish(&[]);
        });
        Ok(())
    }

    /// Creates `%RETRY%<group>` (on every shard) when missing.
    pub(super) fn ensure_retry_topic(&self, group: &str, queues: u32) {
        let retry_topic = format!("{RETRY_GROUP_TOPIC_PREFIX}{group}");
        if validate_topic_name(&retry_topic).is_ok()
            && self.topics.borrow().get(&retry_topic).is_none()
        {
            self.upsert_topic_everywhere(TopicConfig::new(
                &retry_topic,
                queues.max(1),
                perm::READ | perm::WRITE,
            ));
        }
    }

    pub(super) fn unregister_client(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let client_id = ext.required("clientID")?;
        let changed = self.clients.borrow_mut().unregister(
            client_id,
            ext.get_non_empty("producerGroup"),
            ext.get_non_empty("consumerGroup"),
        );
        self.notify_groups(&changed);
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    pub(super) fn consumer_list_by_group(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let group = request.ext_fields.required("consumerGroup")?;
        let ids = self.clients.borrow().consumer_ids(group);
        if ids.is_empty() {
            return Err(RequestError::SystemError(format!(
                "no consumer for this group, {group}"
            )));
        }
        respond_body(connection, request, &body::encode_consumer_id_list(&ids));
        Ok(())
    }

    pub(super) fn check_client_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body = CheckClientConfigBody::parse(request.body)?;
        if let Some(subscription) = &body.subscription {
            self.check_subscription(
                &body.group,
                &subscription.topic,
                &subscription.sub_string,
                &subscription.expression_type,
            )?;
        }
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    pub(super) fn lock_batch_mq(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body = LockBatchRequest::parse(request.body)?;
        let now = now_ms();
        let mut locks = self.locks.borrow_mut();
        locks.expire(now);
        let locked: Vec<_> = body
            .mq_set
            .iter()
            .filter(|mq| mq.broker_name == self.identity.broker_name)
            .filter(|mq| {
                locks.try_lock(
                    &body.consumer_group,
                    &mq.topic,
                    mq.queue_id,
                    &body.client_id,
                    now,
                )
            })
            .cloned()
            .collect();
        drop(locks);
        respond_body(
            connection,
            request,
            &body::encode_lock_batch_response(&locked),
        );
        Ok(())
    }

    pub(super) fn unlock_batch_mq(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body = LockBatchRequest::parse(request.body)?;
        let mut locks = self.locks.borrow_mut();
        for mq in &body.mq_set {
            locks.unlock(
                &body.consumer_group,
                &mq.topic,
                mq.queue_id,
                &body.client_id,
            );
        }
        drop(locks);
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    pub(super) fn update_and_create_topic(
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
            while !routed() && std::time::Instant::now() < deadline {
                shards::runtime::sleep(Duration::from_millis(ROUTE_WAIT_POLL_MS)).await;
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

    pub(super) fn delete_topic(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?.to_string();
        if self.remove_topic_locally(&topic) {
            self.register_now.notify();
        }
        (self.broadcast_topic)(&super::TopicChange::Delete(topic));
        let file = self.topics.borrow().persisted().clone();
        self.answer_when_durable(file.clone(), file.latest(), connection, request);
        Ok(())
    }

    pub(super) fn all_topic_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let snapshot = self.topics.borrow().snapshot();
        let total = snapshot.topics.len();
        let body = snapshot.encode();
        connection.send_with(|out| {
            let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
            frame.ext_i64("totalTopicNum", total as i64);
            frame.finish(&body);
        });
        Ok(())
    }

    pub(super) fn runtime_info(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let stats = self.store.stats();
        let mut table = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            table.insert(key.to_string(), value);
        };
        put("brokerVersion", BROKER_VERSION.to_string());
        put(
            "brokerVersionDesc",
            format!("shardmq {}", env!("CARGO_PKG_VERSION")),
        );
        put("brokerActive", "true".into());
        put(
            "msgPutTotalTodayNow",
            self.stats.messages_put.get().to_string(),
        );
        put(
            "msgGetTotalTodayNow",
            self.stats.messages_got.get().to_string(),
        );
        put("bootTimestamp", self.stats.started_at_ms.get().to_string());
        put(
            "commitLogMaxOffset",
            self.store.max_physical_offset().to_string(),
        );
        put(
            "commitLogMinOffset",
            self.store.min_physical_offset().to_string(),
        );
        put("storeStats", format!("{stats:?}"));
        put("parkedPulls", self.pull_waiters.len().to_string());
        put("sendRefusedBusy", self.load.refused_sends.get().to_string());
        let transactions = self.transactions.borrow();
        put(
            "transactionHalfPending",
            transactions.pending_len().to_string(),
        );
        let tx = transactions.stats;
        put("transactionCommitted", tx.committed.to_string());
        put("transactionRolledBack", tx.rolled_back.to_string());
        put("transactionChecksSent", tx.checks_sent.to_string());
        put("transactionDiscarded", tx.discarded.to_string());
        drop(transactions);
        put("flushDiskType", format!("{:?}", self.store.flush_mode()));
        respond_body(connection, request, &body::encode_kv_table(&table));
        Ok(())
    }
}
