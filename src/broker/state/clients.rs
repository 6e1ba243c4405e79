//! Producer and consumer clients known to one shard (HEART_BEAT, UNREGISTER_CLIENT), their
//! subscriptions, consumer-group membership and the NOTIFY_CONSUMER_IDS_CHANGED pushes that
//! make clients rebalance. A client whose connection closes, or that has not sent a heartbeat
//! for CLIENT_EXPIRY_MS, is removed and its group told.
//!
//! Also the language and version each connection announced (GET_CONSUMER_CONNECTION_LIST).

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::body::{ConsumeFromWhere, ConsumeType, HeartbeatData, MessageModel, SubscriptionData};
use crate::remoting::{request_code, FrameEncoder, LanguageCode};
use crate::server::Connection;

/// A client silent this long is dropped (RocketMQ's channel expiry).
pub const CLIENT_EXPIRY_MS: i64 = 120_000;

/// How often expired clients are looked for.
pub const CLIENT_SCAN_INTERVAL_MS: u64 = 10_000;

pub use crate::limits::CONSUMER_GROUPS_CONNECTED_MAX as GROUPS_MAX;
pub use crate::limits::{CLIENTS_PER_GROUP_MAX, PRODUCER_GROUPS_CONNECTED_MAX};

pub struct ClientChannel {
    pub connection: Rc<Connection>,
    pub last_update_ms: i64,
    /// The language of its last heartbeat: pushed bodies differ for C++ clients.
    pub language: LanguageCode,
}

pub struct ConsumerGroup {
    pub clients: BTreeMap<String, ClientChannel>,
    pub subscriptions: BTreeMap<String, SubscriptionData>,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
}

#[derive(Default)]
pub struct ClientTable {
    pub consumers: BTreeMap<String, ConsumerGroup>,
    pub producers: BTreeMap<String, BTreeMap<String, ClientChannel>>,
}

impl ClientTable {
    /// Why `data` may not be registered: it would take a table past its bound (new consumer
    /// or producer groups, or new clients in a full group). `None`: it fits.
    pub fn refuses(&self, data: &HeartbeatData) -> Option<String> {
        let client = &data.client_id;
        let new_consumer_groups = data
            .consumers
            .iter()
            .filter(|c| !self.consumers.contains_key(&c.group_name))
            .count();
        if new_consumer_groups > 0 && self.consumers.len() + new_consumer_groups > GROUPS_MAX {
            return Some(format!(
                "too many consumer groups on this broker (at most {GROUPS_MAX})"
            ));
        }
        let new_producer_groups = data
            .producer_groups
            .iter()
            .filter(|g| !self.producers.contains_key(*g))
            .count();
        if new_producer_groups > 0
            && self.producers.len() + new_producer_groups > PRODUCER_GROUPS_CONNECTED_MAX
        {
            return Some(format!(
                "too many producer groups on this broker (at most {PRODUCER_GROUPS_CONNECTED_MAX})"
            ));
        }
        let full = |clients: Option<usize>, has_client: bool| {
            clients.is_some_and(|n| n >= CLIENTS_PER_GROUP_MAX) && !has_client
        };
        for consumer in &data.consumers {
            let group = self.consumers.get(&consumer.group_name);
            if full(
                group.map(|g| g.clients.len()),
                group.is_some_and(|g| g.clients.contains_key(client)),
            ) {
                return Some(format!(
                    "consumer group {} already has {CLIENTS_PER_GROUP_MAX} clients on this broker",
                    consumer.group_name
                ));
            }
        }
        for name in &data.producer_groups {
            let group = self.producers.get(name);
            if full(
                group.map(|g| g.len()),
                group.is_some_and(|g| g.contains_key(client)),
            ) {
                return Some(format!(
                    "producer group {name} already has {CLIENTS_PER_GROUP_MAX} clients on this broker"
                ));
            }
        }
        None
    }

    /// Registers a heartbeat; returns the groups whose membership or subscriptions changed.
    pub fn heartbeat(
        &mut self,
        data: &HeartbeatData,
        connection: &Rc<Connection>,
        language: LanguageCode,
        now_ms: i64,
    ) -> Vec<String> {
        for group in &data.producer_groups {
            self.producers.entry(group.clone()).or_default().insert(
                data.client_id.clone(),
                ClientChannel {
                    connection: connection.clone(),
                    last_update_ms: now_ms,
                    language,
                },
            );
        }
        let mut changed = Vec::new();
        for consumer in &data.consumers {
            let group = self
                .consumers
                .entry(consumer.group_name.clone())
                .or_insert_with(|| ConsumerGroup {
                    clients: BTreeMap::new(),
                    subscriptions: BTreeMap::new(),
                    consume_type: consumer.consume_type,
                    message_model: consumer.message_model,
                    consume_from_where: consumer.consume_from_where,
                });
            group.consume_type = consumer.consume_type;
            group.message_model = consumer.message_model;
            group.consume_from_where = consumer.consume_from_where;
            let previous = group.clients.insert(
                data.client_id.clone(),
                ClientChannel {
                    connection: connection.clone(),
                    last_update_ms: now_ms,
                    language,
                },
            );
            let mut group_changed = match previous {
                None => true,
                Some(previous) => previous.connection.id != connection.id,
            };
            for subscription in &consumer.subscriptions {
                let known = group.subscriptions.get(&subscription.topic);
                let same = known.is_some_and(|s| {
                    s.sub_string == subscription.sub_string
                        && s.expression_type == subscription.expression_type
                });
                if !same {
                    group_changed = true;
                }
                group
                    .subscriptions
                    .insert(subscription.topic.clone(), subscription.clone());
            }
            if group_changed {
                changed.push(consumer.group_name.clone());
            }
        }
        changed
    }

    /// Removes a client from the named groups ("" or None means none); returns changed groups.
    pub fn unregister(
        &mut self,
        client_id: &str,
        producer_group: Option<&str>,
        consumer_group: Option<&str>,
    ) -> Vec<String> {
        if let Some(group) = producer_group {
            if let Some(clients) = self.producers.get_mut(group) {
                clients.remove(client_id);
                if clients.is_empty() {
                    self.producers.remove(group);
                }
            }
        }
        let mut changed = Vec::new();
        if let Some(name) = consumer_group {
            if let Some(group) = self.consumers.get_mut(name) {
                if group.clients.remove(client_id).is_some() {
                    changed.push(name.to_string());
                }
                if group.clients.is_empty() {
                    self.consumers.remove(name);
                }
            }
        }
        changed
    }

    /// Removes every client matching `gone`; returns the consumer groups that changed.
    pub fn remove_where(&mut self, gone: impl Fn(&ClientChannel) -> bool) -> Vec<String> {
        for clients in self.producers.values_mut() {
            clients.retain(|_, channel| !gone(channel));
        }
        self.producers.retain(|_, clients| !clients.is_empty());
        let mut changed = Vec::new();
        for (name, group) in self.consumers.iter_mut() {
            let before = group.clients.len();
            group.clients.retain(|_, channel| !gone(channel));
            if group.clients.len() != before {
                changed.push(name.clone());
            }
        }
        self.consumers.retain(|_, group| !group.clients.is_empty());
        changed
    }

    /// Client ids of a group's live consumers, sorted (clients allocate queues by this order).
    pub fn consumer_ids(&self, group: &str) -> Vec<String> {
        self.consumers
            .get(group)
            .map(|g| g.clients.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A live connection of a producer of `group` (the most recently heard from), for the
    /// transaction check-back.
    pub fn producer_connection(&self, group: &str) -> Option<Rc<Connection>> {
        self.producers
            .get(group)?
            .values()
            .filter(|channel| !channel.connection.is_closed())
            .max_by_key(|channel| channel.last_update_ms)
            .map(|channel| channel.connection.clone())
    }

    pub fn subscription(&self, group: &str, topic: &str) -> Option<&SubscriptionData> {
        self.consumers.get(group)?.subscriptions.get(topic)
    }

    /// Sends NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every client of `group`.
    pub fn notify_group(&self, group: &str) {
        let Some(consumers) = self.consumers.get(group) else {
            return;
        };
        for channel in consumers.clients.values() {
            let connection = &channel.connection;
            let opaque = connection.next_opaque();
            connection.send_with(|out| {
                let mut frame = FrameEncoder::request(
                    out,
                    request_code::NOTIFY_CONSUMER_IDS_CHANGED,
                    opaque,
                    true,
                );
                frame.ext("consumerGroup", group);
                frame.finish(&[]);
            });
        }
    }
}

/// The language and version each client connection announced in its HEART_BEAT header
/// (GET_CONSUMER_CONNECTION_LIST reports them), by connection id.
#[derive(Default)]
pub struct ClientLanguages {
    pub(crate) by_connection: BTreeMap<u64, (LanguageCode, i32)>,
}

impl ClientLanguages {
    pub fn note(&mut self, connection_id: u64, language: LanguageCode, version: i32) {
        self.by_connection
            .insert(connection_id, (language, version));
    }

    pub fn forget(&mut self, connection_id: u64) {
        self.by_connection.remove(&connection_id);
    }

    pub(crate) fn of(&self, connection_id: u64) -> (LanguageCode, i32) {
        self.by_connection
            .get(&connection_id)
            .copied()
            .unwrap_or((LanguageCode::Other, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remoting::LanguageCode;

    fn producer_heartbeat(client: &str, groups: &[&str]) -> HeartbeatData {
        HeartbeatData {
            client_id: client.to_string(),
            producer_groups: groups.iter().map(|g| g.to_string()).collect(),
            consumers: Vec::new(),
        }
    }

    #[test]
    fn a_group_takes_clients_up_to_its_bound_and_known_clients_stay_welcome() {
        let mut table = ClientTable::default();
        let connection = Connection::detached(1, "127.0.0.1:1".parse().unwrap());
        for index in 0..CLIENTS_PER_GROUP_MAX {
            let beat = producer_heartbeat(&format!("c{index}"), &["pg"]);
            assert_eq!(table.refuses(&beat), None);
            table.heartbeat(&beat, &connection, LanguageCode::Java, 0);
        }
        let newcomer = producer_heartbeat("one-too-many", &["pg"]);
        let why = table.refuses(&newcomer).expect("refused");
        assert!(
            why.contains("producer group pg already has 10000 clients"),
            "{why}"
        );
        // A client already in the group keeps its place; another group still has room.
        assert_eq!(table.refuses(&producer_heartbeat("c7", &["pg"])), None);
        assert_eq!(
            table.refuses(&producer_heartbeat("one-too-many", &["pg2"])),
            None
        );
    }
}
