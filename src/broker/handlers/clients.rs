//! Client sessions: HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
//! CHECK_CLIENT_CONFIG (46), LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42),
//! GET_CONSUMER_CONNECTION_LIST (203).

use std::rc::Rc;

use crate::body::{
    self, perm, CheckClientConfigBody, ClientConnection, ConsumerConnection, HeartbeatData,
    LockBatchRequest, ProducerConnection, TopicConfig,
};
use crate::broker::state::clients::ClientChannel;
use crate::broker::state::topics::{validate_topic_name, RETRY_GROUP_TOPIC_PREFIX};
use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

impl Broker {
    pub(crate) fn heart_beat(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let data = HeartbeatData::parse(request.body)?;
        if let Some(why) = self.clients.borrow().refuses(&data) {
            return Err(RequestError::SystemBusy(why));
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
                .heartbeat(&data, connection, request.language, self.now_ms());
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
}

impl Broker {
    /// Creates `%RETRY%<group>` (on every shard) when missing.
    pub(crate) fn ensure_retry_topic(&self, group: &str, queues: u32) {
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
}

impl Broker {
    pub(crate) fn unregister_client(
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
}

impl Broker {
    pub(crate) fn consumer_list_by_group(
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
        connection.respond_body(request, &body::encode_consumer_id_list(&ids));
        Ok(())
    }
}

impl Broker {
    pub(crate) fn check_client_config(
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
}

impl Broker {
    pub(crate) fn lock_batch_mq(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body = LockBatchRequest::parse(request.body)?;
        let now = self.now_ms();
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
        connection.respond_body(request, &body::encode_lock_batch_response(&locked));
        Ok(())
    }
}

impl Broker {
    pub(crate) fn unlock_batch_mq(
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
}

impl Broker {
    /// The connections of a group's clients as the admin answers list them.
    fn client_connections(
        &self,
        clients: &std::collections::BTreeMap<String, ClientChannel>,
    ) -> Vec<ClientConnection> {
        let languages = self.client_languages.borrow();
        clients
            .iter()
            .map(|(client_id, channel)| {
                let (language, version) = languages.of(channel.connection.id);
                ClientConnection {
                    client_id: client_id.clone(),
                    client_addr: channel.connection.peer.to_string(),
                    language: language.name().to_string(),
                    version,
                }
            })
            .collect()
    }

    /// GET_PRODUCER_CONNECTION_LIST (204): the producers of a group on this broker, as
    /// AdminBrokerProcessor answers (SYSTEM_ERROR "the producer group[…] not exist" when
    /// none is connected).
    pub(crate) fn producer_connection_list(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let group = request.ext_fields.required("producerGroup")?;
        let clients = self.clients.borrow();
        let Some(producers) = clients.producers.get(group).filter(|p| !p.is_empty()) else {
            return Err(RequestError::SystemError(format!(
                "the producer group[{group}] not exist"
            )));
        };
        let connections = self.client_connections(producers);
        connection.respond_body(request, &ProducerConnection { connections }.encode());
        Ok(())
    }

    /// GET_ALL_PRODUCER_INFO (328): every producer group of this broker and its clients, as
    /// ProducerManager.getProducerTable builds it (`{"data":{group:[ProducerInfo]}}`; remoteIP
    /// as Java prints a socket address, "/ip:port").
    pub(crate) fn all_producer_info(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let clients = self.clients.borrow();
        let languages = self.client_languages.borrow();
        let mut data = serde_json::Map::new();
        for (group, producers) in &clients.producers {
            let infos: Vec<serde_json::Value> = producers
                .iter()
                .map(|(client_id, channel)| {
                    let (language, version) = languages.of(channel.connection.id);
                    serde_json::json!({
                        "clientId": client_id,
                        "remoteIP": format!("/{}", channel.connection.peer),
                        "language": language.name(),
                        "version": version,
                        "lastUpdateTimestamp": channel.last_update_ms,
                    })
                })
                .collect();
            data.insert(group.clone(), serde_json::Value::Array(infos));
        }
        let body = serde_json::json!({ "data": data }).to_string();
        connection.respond_body(request, body.as_bytes());
        Ok(())
    }

    pub(crate) fn consumer_connection_list(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let group = request.ext_fields.required("consumerGroup")?;
        let clients = self.clients.borrow();
        let Some(online) = clients.consumers.get(group) else {
            connection.respond(
                request,
                response_code::CONSUMER_NOT_ONLINE,
                Some(&format!("the consumer group[{group}] not online")),
            );
            return Ok(());
        };
        let connections = self.client_connections(&online.clients);
        let body = ConsumerConnection {
            connections,
            subscriptions: online.subscriptions.values().cloned().collect(),
            consume_type: online.consume_type,
            message_model: online.message_model,
            consume_from_where: online.consume_from_where,
        };
        connection.respond_body(request, &body.encode());
        Ok(())
    }
}
