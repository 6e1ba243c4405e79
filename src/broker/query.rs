//! Message lookup and admin statistics of one shard's broker: QUERY_MESSAGE (by key or by
//! unique id, through the store's message index), GET_TOPIC_STATS_INFO, GET_CONSUME_STATS
//! and GET_CONSUMER_CONNECTION_LIST.
//!
//! Clients and admin tools send these to every broker of a topic's route and merge the
//! answers, so each shard answers for its own queues, store and clients only. Bodies are
//! Java's (`body::stats`), MessageQueue keys included.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use shards::store::{record, MessageQuery, Store};

use crate::body::{
    ClientConnection, ConsumeStats, ConsumerConnection, MessageQueue, OffsetWrapper, TopicOffset,
    TopicStatsTable,
};
use crate::error::RequestError;
use crate::namesrv::respond_body;
use crate::remoting::{response_code, FrameEncoder, LanguageCode, RemotingCommand};
use crate::server::Connection;

use super::Broker;
use crate::error::store_error;

/// Messages a unique-key query returns (RocketMQ's defaultQueryMaxNum, which it forces).
pub const QUERY_UNIQUE_KEY_MESSAGES: u32 = 32;
/// The ext key that marks a query by UNIQ_KEY (RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG).
pub const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";
/// Topics one GET_CONSUME_STATS reports, at most (a group's offsets name its topics).
pub const CONSUME_STATS_TOPICS_MAX: usize = 1024;
/// Separator of GET_CONSUME_STATS's `topicList`.
const TOPIC_LIST_SEPARATOR: char = ';';

/// The language and version each client connection announced in its HEART_BEAT header
/// (GET_CONSUMER_CONNECTION_LIST reports them), by connection id.
#[derive(Default)]
pub struct ClientLanguages {
    by_connection: BTreeMap<u64, (LanguageCode, i32)>,
}

impl ClientLanguages {
    pub fn note(&mut self, connection_id: u64, language: LanguageCode, version: i32) {
        self.by_connection
            .insert(connection_id, (language, version));
    }

    pub fn forget(&mut self, connection_id: u64) {
        self.by_connection.remove(&connection_id);
    }

    fn of(&self, connection_id: u64) -> (LanguageCode, i32) {
        self.by_connection
            .get(&connection_id)
            .copied()
            .unwrap_or((LanguageCode::Other, 0))
    }
}

/// Store time of the message at `queue_offset`; 0 when there is none (RocketMQ's
/// getMessageStoreTimeStamp answers -1 then; admin bodies carry 0).
async fn store_time_at(store: &Store, topic: &str, queue_id: u32, queue_offset: u64) -> i64 {
    let found = store
        .get_messages(topic, queue_id, queue_offset, 1, 1, &|_| true)
        .await;
    let Ok(found) = found else { return 0 };
    record::decode(&found.body).map_or(0, |m| m.store_timestamp_ms)
}

impl Broker {
    pub(super) fn query_message(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let topic = ext.required("topic")?.to_string();
        let key = ext.required("key")?.to_string();
        let mut max_messages = ext.required_i32("maxNum")?.max(1) as u32;
        let begin_timestamp_ms = ext.required_i64("beginTimestamp")?;
        let end_timestamp_ms = ext.required_i64("endTimestamp")?;
        let unique_key = ext.get(UNIQUE_MSG_QUERY_FLAG) == Some("true");
        if unique_key {
            max_messages = QUERY_UNIQUE_KEY_MESSAGES;
        }
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let query = MessageQuery {
                topic: &topic,
                key: &key,
                max_messages,
                begin_timestamp_ms,
                end_timestamp_ms,
                unique_key,
            };
            let result = match broker.store.query_messages(&query).await {
                Ok(result) => result,
                Err(error) => return store_error(error).respond(&connection, opaque),
            };
            let last = result.index_last_update;
            connection.send_with(|out| {
                let found = result.message_count > 0;
                let code = if found {
                    response_code::SUCCESS
                } else {
                    response_code::QUERY_NOT_FOUND
                };
                let mut frame = FrameEncoder::response(out, code, opaque);
                if !found {
                    frame.remark("can not find message, maybe time range not correct");
                }
                frame
                    .ext_i64("indexLastUpdateTimestamp", last.timestamp_ms)
                    .ext_i64("indexLastUpdatePhyoffset", last.physical_offset as i64);
                frame.finish(&result.body);
            });
        });
        Ok(())
    }

    pub(super) fn topic_stats_info(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?.to_string();
        let config = self.topics.borrow().get(&topic).cloned();
        let Some(config) = config else {
            return Err(RequestError::TopicNotExist(format!(
                "topic[{topic}] not exist"
            )));
        };
        let queue_count = config.write_queue_nums.max(config.read_queue_nums);
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let mut table = TopicStatsTable::default();
            for queue_id in 0..queue_count {
                let min_offset = broker.store.min_queue_offset(&topic, queue_id);
                let max_offset = broker.store.max_queue_offset(&topic, queue_id);
                let last_update_timestamp = match max_offset {
                    0 => 0,
                    max => store_time_at(&broker.store, &topic, queue_id, max - 1).await,
                };
                table.offset_table.push((
                    broker.message_queue(&topic, queue_id),
                    TopicOffset {
                        min_offset: min_offset as i64,
                        max_offset: max_offset as i64,
                        last_update_timestamp,
                    },
                ));
            }
            if !oneway {
                respond_body_to(&connection, opaque, &table.encode());
            }
        });
        Ok(())
    }

    pub(super) fn consume_stats(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("consumerGroup")?.to_string();
        let topic_list: Vec<String> = ext
            .get_non_empty("topicList")
            .map(|list| {
                list.split(TOPIC_LIST_SEPARATOR)
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let topics = if topic_list.is_empty() {
            self.consumed_topics(&group, ext.get_non_empty("topic"))
        } else {
            topic_list
        };
        let mut queues = Vec::new();
        for topic in topics.iter().take(CONSUME_STATS_TOPICS_MAX) {
            let Some(config) = self.topics.borrow().get(topic).cloned() else {
                continue;
            };
            let offsets = self.offsets.borrow();
            for queue_id in 0..config.read_queue_nums {
                let consumer_offset = offsets.query(&group, topic, queue_id).unwrap_or(0).max(0);
                queues.push((topic.clone(), queue_id, consumer_offset));
            }
        }
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let mut stats = ConsumeStats::default();
            for (topic, queue_id, consumer_offset) in queues {
                let broker_offset = broker.store.max_queue_offset(&topic, queue_id) as i64;
                let last_timestamp = match consumer_offset {
                    0 => 0,
                    offset => {
                        let at = (offset - 1) as u64;
                        store_time_at(&broker.store, &topic, queue_id, at).await
                    }
                };
                stats.offset_table.push((
                    broker.message_queue(&topic, queue_id),
                    OffsetWrapper {
                        broker_offset,
                        consumer_offset,
                        pull_offset: consumer_offset,
                        last_timestamp,
                    },
                ));
            }
            if !oneway {
                respond_body_to(&connection, opaque, &stats.encode());
            }
        });
        Ok(())
    }

    /// The topics GET_CONSUME_STATS reports for a group without a topic list: the asked
    /// topic, or every topic the group committed offsets for; while the group is online,
    /// only those it subscribes (RocketMQ's rule).
    fn consumed_topics(&self, group: &str, topic: Option<&str>) -> Vec<String> {
        let mut topics: BTreeSet<String> = match topic {
            Some(topic) => BTreeSet::from([topic.to_string()]),
            None => self
                .offsets
                .borrow()
                .entries()
                .keys()
                .filter_map(|key| key.split_once('@'))
                .filter(|(_, key_group)| *key_group == group)
                .map(|(topic, _)| topic.to_string())
                .collect(),
        };
        let clients = self.clients.borrow();
        if let Some(online) = clients.consumers.get(group) {
            if !online.subscriptions.is_empty() {
                topics.retain(|t| online.subscriptions.contains_key(t));
            }
        }
        topics.into_iter().collect()
    }

    pub(super) fn consumer_connection_list(
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
        let languages = self.client_languages.borrow();
        let connections = online
            .clients
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
            .collect();
        let body = ConsumerConnection {
            connections,
            subscriptions: online.subscriptions.values().cloned().collect(),
            consume_type: online.consume_type,
            message_model: online.message_model,
            consume_from_where: online.consume_from_where,
        };
        respond_body(connection, request, &body.encode());
        Ok(())
    }

    fn message_queue(&self, topic: &str, queue_id: u32) -> MessageQueue {
        MessageQueue {
            topic: topic.to_string(),
            broker_name: self.identity.broker_name.clone(),
            queue_id,
        }
    }
}

/// A SUCCESS response with `body` to the request with `opaque` (answered later).
fn respond_body_to(connection: &Connection, opaque: i32, body: &[u8]) {
    connection.send_with(|out| {
        FrameEncoder::response(out, response_code::SUCCESS, opaque).finish(body);
    });
}
