//! Admin bodies keyed by `MessageQueue` (REMOTING.md §4.1 item 3), and the consumer
//! connection list: `TopicStatsTable` (GET_TOPIC_STATS_INFO), `ConsumeStats`
//! (GET_CONSUME_STATS) and `ConsumerConnection` (GET_CONSUMER_CONNECTION_LIST).
//!
//! Java's fastjson writes a map keyed by an object with the object itself as the key, which
//! is not JSON: `{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}}`. We write
//! exactly that (Java's admin tools read it with fastjson, and so does Go's special-cased
//! reset-offset parser); the readers here accept it, and keys given as JSON strings holding
//! the object too. Everything else follows the module rules: keys sorted, compact, numbers
//! as fastjson writes them (doubles always with a fraction).

use serde_json::{json, Map, Value};

use super::json::{encode_compact, parse_object, string_end, Fields};
use super::{BodyError, ConsumeFromWhere, ConsumeType, MessageModel, MessageQueue};
use super::{SubscriptionData, EXPRESSION_TYPE_TAG};

/// One queue's offsets in a TopicStatsTable (Java `TopicOffset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicOffset {
    pub min_offset: i64,
    pub max_offset: i64,
    /// Store time of the queue's last message; 0 when it is empty.
    pub last_update_timestamp: i64,
}

/// GET_TOPIC_STATS_INFO response body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopicStatsTable {
    pub offset_table: Vec<(MessageQueue, TopicOffset)>,
    pub topic_put_tps: f64,
}

/// One queue of a consumer group in a ConsumeStats (Java `OffsetWrapper`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffsetWrapper {
    /// The queue's max offset (messages written).
    pub broker_offset: i64,
    /// The group's committed offset (0 when none).
    pub consumer_offset: i64,
    pub pull_offset: i64,
    /// Store time of the last consumed message; 0 when none.
    pub last_timestamp: i64,
}

/// GET_CONSUME_STATS response body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsumeStats {
    pub offset_table: Vec<(MessageQueue, OffsetWrapper)>,
    pub consume_tps: f64,
}

impl ConsumeStats {
    /// Messages not yet consumed, over every queue (Java `computeTotalDiff`).
    pub fn total_lag(&self) -> i64 {
        self.offset_table
            .iter()
            .map(|(_, w)| (w.broker_offset - w.consumer_offset).max(0))
            .sum()
    }
}

/// One client connection of a group (Java `Connection`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConnection {
    pub client_id: String,
    pub client_addr: String,
    /// `LanguageCode` name ("JAVA", "CPP", ...).
    pub language: String,
    pub version: i32,
}

/// GET_CONSUMER_CONNECTION_LIST response body.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerConnection {
    pub connections: Vec<ClientConnection>,
    pub subscriptions: Vec<SubscriptionData>,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
}

/// A MessageQueue as fastjson writes it inside a key: keys sorted, compact.
fn queue_json(queue: &MessageQueue) -> Vec<u8> {
    encode_compact(&json!({
        "brokerName": queue.broker_name,
        "queueId": queue.queue_id,
        "topic": queue.topic,
    }))
}

/// `{MQ:value,...}` with bare object keys, in the given order.
fn write_queue_map(out: &mut Vec<u8>, entries: impl Iterator<Item = (Vec<u8>, Value)>) {
    out.push(b'{');
    for (index, (key, value)) in entries.enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&key);
        out.push(b':');
        out.extend_from_slice(&encode_compact(&value));
    }
    out.push(b'}');
}

/// fastjson writes doubles with a fraction (`0.0`); serde_json does the same for f64.
fn double(value: f64) -> Vec<u8> {
    encode_compact(&if value.is_finite() { value } else { 0.0 })
}

impl TopicStatsTable {
    /// Java's form: `{"offsetTable":{{MQ}:{..}},"topicPutTps":0.0}`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = b"{\"offsetTable\":".to_vec();
        write_queue_map(
            &mut out,
            self.offset_table.iter().map(|(queue, offset)| {
                let value = json!({
                    "lastUpdateTimestamp": offset.last_update_timestamp,
                    "maxOffset": offset.max_offset,
                    "minOffset": offset.min_offset,
                });
                (queue_json(queue), value)
            }),
        );
        out.extend_from_slice(b",\"topicPutTps\":");
        out.extend_from_slice(&double(self.topic_put_tps));
        out.push(b'}');
        out
    }

    pub fn parse(body: &[u8]) -> Result<TopicStatsTable, BodyError> {
        const WHAT: &str = "TopicStatsTable";
        let map = parse_queue_keyed(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let offset_table = queue_entries(WHAT, &fields, |value| {
            let fields = Fields::of(WHAT, value)?;
            Ok(TopicOffset {
                min_offset: fields.i64("minOffset")?.unwrap_or(0),
                max_offset: fields.i64("maxOffset")?.unwrap_or(0),
                last_update_timestamp: fields.i64("lastUpdateTimestamp")?.unwrap_or(0),
            })
        })?;
        Ok(TopicStatsTable {
            offset_table,
            topic_put_tps: number(&fields, "topicPutTps"),
        })
    }
}

impl ConsumeStats {
    /// Java's form: `{"consumeTps":0.0,"offsetTable":{{MQ}:{..}}}`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = b"{\"consumeTps\":".to_vec();
        out.extend_from_slice(&double(self.consume_tps));
        out.extend_from_slice(b",\"offsetTable\":");
        write_queue_map(
            &mut out,
            self.offset_table.iter().map(|(queue, offset)| {
                let value = json!({
                    "brokerOffset": offset.broker_offset,
                    "consumerOffset": offset.consumer_offset,
                    "lastTimestamp": offset.last_timestamp,
                    "pullOffset": offset.pull_offset,
                });
                (queue_json(queue), value)
            }),
        );
        out.push(b'}');
        out
    }

    pub fn parse(body: &[u8]) -> Result<ConsumeStats, BodyError> {
        const WHAT: &str = "ConsumeStats";
        let map = parse_queue_keyed(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let offset_table = queue_entries(WHAT, &fields, |value| {
            let fields = Fields::of(WHAT, value)?;
            Ok(OffsetWrapper {
                broker_offset: fields.i64("brokerOffset")?.unwrap_or(0),
                consumer_offset: fields.i64("consumerOffset")?.unwrap_or(0),
                pull_offset: fields.i64("pullOffset")?.unwrap_or(0),
                last_timestamp: fields.i64("lastTimestamp")?.unwrap_or(0),
            })
        })?;
        Ok(ConsumeStats {
            offset_table,
            consume_tps: number(&fields, "consumeTps"),
        })
    }
}

/// GET_PRODUCER_CONNECTION_LIST response body (Java `ProducerConnection`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProducerConnection {
    pub connections: Vec<ClientConnection>,
}

impl ProducerConnection {
    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&json!({ "connectionSet": connections_json(&self.connections) }))
    }
}

fn connections_json(connections: &[ClientConnection]) -> Vec<Value> {
    connections
        .iter()
        .map(|c| {
            json!({
                "clientAddr": c.client_addr,
                "clientId": c.client_id,
                "language": c.language,
                "version": c.version,
            })
        })
        .collect()
}

impl ConsumerConnection {
    pub fn encode(&self) -> Vec<u8> {
        let connections = connections_json(&self.connections);
        let subscriptions: Map<String, Value> = self
            .subscriptions
            .iter()
            .map(|s| (s.topic.clone(), subscription_json(s)))
            .collect();
        encode_compact(&json!({
            "connectionSet": connections,
            "consumeFromWhere": self.consume_from_where.name_str(),
            "consumeType": self.consume_type.name_str(),
            "messageModel": self.message_model.name_str(),
            "subscriptionTable": subscriptions,
        }))
    }

    pub fn parse(body: &[u8]) -> Result<ConsumerConnection, BodyError> {
        const WHAT: &str = "ConsumerConnection";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let connections = fields
            .array("connectionSet")?
            .iter()
            .map(|item| {
                let fields = Fields::of(WHAT, item)?;
                Ok(ClientConnection {
                    client_id: fields.string("clientId")?.unwrap_or_default(),
                    client_addr: fields.string("clientAddr")?.unwrap_or_default(),
                    language: fields.string("language")?.unwrap_or_default(),
                    version: fields.i64("version")?.unwrap_or(0) as i32,
                })
            })
            .collect::<Result<Vec<_>, BodyError>>()?;
        let mut subscriptions = Vec::new();
        if let Some(table) = fields.object("subscriptionTable")? {
            for value in table.map.values().filter(|v| !v.is_null()) {
                subscriptions.push(SubscriptionData::from_fields(Fields::of(WHAT, value)?)?);
            }
        }
        let consume_type = fields
            .get("consumeType")
            .and_then(ConsumeType::from_json)
            .unwrap_or(ConsumeType::ConsumePassively);
        let message_model = fields
            .get("messageModel")
            .and_then(MessageModel::from_json)
            .unwrap_or(MessageModel::Clustering);
        let consume_from_where = fields
            .get("consumeFromWhere")
            .and_then(ConsumeFromWhere::from_json)
            .unwrap_or(ConsumeFromWhere::LastOffset);
        Ok(ConsumerConnection {
            connections,
            subscriptions,
            consume_type,
            message_model,
            consume_from_where,
        })
    }
}

/// GET_ALL_SUBSCRIPTIONGROUP_CONFIG's `SubscriptionGroupWrapper`: group name → its
/// SubscriptionGroupConfig, kept as JSON (admin prints them; brokers add fields over time).
pub fn parse_subscription_group_table(body: &[u8]) -> Result<Map<String, Value>, BodyError> {
    const WHAT: &str = "SubscriptionGroupWrapper";
    let map = parse_object(WHAT, body)?;
    let fields = Fields::new(WHAT, &map);
    Ok(fields
        .object("subscriptionGroupTable")?
        .map(|table| table.map.clone())
        .unwrap_or_default())
}

/// A SubscriptionData as Java writes it (keys sorted).
fn subscription_json(subscription: &SubscriptionData) -> Value {
    let expression_type = if subscription.expression_type.is_empty() {
        EXPRESSION_TYPE_TAG
    } else {
        &subscription.expression_type
    };
    json!({
        "classFilterMode": subscription.class_filter_mode,
        "codeSet": subscription.code_set,
        "expressionType": expression_type,
        "subString": subscription.sub_string,
        "subVersion": subscription.sub_version,
        "tagsSet": subscription.tags_set,
        "topic": subscription.topic,
    })
}

fn number(fields: &Fields<'_>, key: &str) -> f64 {
    match fields.get(key) {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// Reads the `offsetTable` member as (queue, value) pairs, in body order.
pub(crate) fn queue_entries<T>(
    what: &'static str,
    fields: &Fields<'_>,
    read: impl Fn(&Value) -> Result<T, BodyError>,
) -> Result<Vec<(MessageQueue, T)>, BodyError> {
    let Some(table) = fields.object("offsetTable")? else {
        return Ok(Vec::new());
    };
    let mut entries = Vec::with_capacity(table.map.len());
    for (key, value) in table.map.iter().filter(|(_, v)| !v.is_null()) {
        let queue_value: Value = serde_json::from_str(key)
            .map_err(|e| BodyError::malformed(what, format!("offsetTable key {key:?}: {e}")))?;
        entries.push((MessageQueue::from_value(what, &queue_value)?, read(value)?));
    }
    Ok(entries)
}

/// Parses a body whose maps may have object keys: each such key is first rewritten as a JSON
/// string holding the object's text (`{{"a":1}:2}` → `{"{\"a\":1}":2}`).
pub(crate) fn parse_queue_keyed(
    what: &'static str,
    body: &[u8],
) -> Result<Map<String, Value>, BodyError> {
    parse_object(what, &quote_object_keys(body))
}

/// Rewrites object keys as string keys; everything else is copied unchanged.
pub(crate) fn quote_object_keys(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + 64);
    // For each open container: is it an object, and does it expect a key next?
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let mut index = 0;
    while index < input.len() {
        let byte = input[index];
        let expect_key = stack.last().is_some_and(|&(object, key)| object && key);
        match byte {
            b'"' => {
                let end = string_end(input, index);
                out.extend_from_slice(&input[index..end]);
                index = end;
                if let Some(top) = stack.last_mut() {
                    top.1 = false;
                }
                continue;
            }
            b'{' if expect_key => {
                let end = container_end(input, index);
                write_json_string(&mut out, &input[index..end]);
                index = end;
                if let Some(top) = stack.last_mut() {
                    top.1 = false;
                }
                continue;
            }
            b'{' | b'[' => stack.push((byte == b'{', byte == b'{')),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(top) = stack.last_mut() {
                    top.1 = top.0;
                }
            }
            _ => {}
        }
        out.push(byte);
        index += 1;
    }
    out
}

/// Index just past the object or array starting at `start` (strings skipped), or the end.
fn container_end(input: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut index = start;
    while index < input.len() {
        match input[index] {
            b'"' => {
                index = string_end(input, index);
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return index + 1;
                }
            }
            _ => {}
        }
        index += 1;
    }
    input.len()
}

fn write_json_string(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    for &byte in bytes {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' | b'\r' | b'\t' => out.push(b' '),
            _ => out.push(byte),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(topic: &str, queue_id: u32) -> MessageQueue {
        MessageQueue {
            topic: topic.into(),
            broker_name: "broker-0".into(),
            queue_id,
        }
    }

    #[test]
    fn topic_stats_in_java_form() {
        let table = TopicStatsTable {
            offset_table: vec![(
                queue("T", 0),
                TopicOffset {
                    min_offset: 0,
                    max_offset: 5,
                    last_update_timestamp: 1_700_000_000_000,
                },
            )],
            topic_put_tps: 0.0,
        };
        let body = table.encode();
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            r#"{"offsetTable":{{"brokerName":"broker-0","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":1700000000000,"maxOffset":5,"minOffset":0}},"topicPutTps":0.0}"#
        );
        assert_eq!(TopicStatsTable::parse(&body).unwrap(), table);
    }

    #[test]
    fn consume_stats_round_trip_and_lag() {
        let wrapper = |broker_offset, consumer_offset| OffsetWrapper {
            broker_offset,
            consumer_offset,
            pull_offset: consumer_offset,
            last_timestamp: 0,
        };
        let stats = ConsumeStats {
            offset_table: vec![
                (queue("T", 0), wrapper(10, 4)),
                (queue("T", 1), wrapper(3, 3)),
            ],
            consume_tps: 1.5,
        };
        let parsed = ConsumeStats::parse(&stats.encode()).unwrap();
        assert_eq!(parsed, stats);
        assert_eq!(parsed.total_lag(), 6);
        // Keys given as strings holding the object are read too; and Java's spacing.
        let quoted = br#"{"consumeTps":0,"offsetTable":{"{\"brokerName\":\"b\",\"queueId\":2,\"topic\":\"T\"}":{"brokerOffset":7,"consumerOffset":1}}}"#;
        let parsed = ConsumeStats::parse(quoted).unwrap();
        assert_eq!(parsed.offset_table[0].0.queue_id, 2);
        assert_eq!(parsed.total_lag(), 6);
    }

    #[test]
    fn consumer_connection_round_trip() {
        let connection = ConsumerConnection {
            connections: vec![ClientConnection {
                client_id: "127.0.0.1@1#2".into(),
                client_addr: "127.0.0.1:5555".into(),
                language: "CPP".into(),
                version: 63,
            }],
            subscriptions: vec![SubscriptionData::new("T", "TagA || TagB", 7)],
            consume_type: ConsumeType::ConsumePassively,
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::LastOffset,
        };
        let body = connection.encode();
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(
            text.contains(r#""consumeType":"CONSUME_PASSIVELY""#),
            "{text}"
        );
        assert_eq!(ConsumerConnection::parse(&body).unwrap(), connection);
    }

    #[test]
    fn object_keys_inside_strings_are_left_alone() {
        let text = br#"{"a":"{x}:{y}","m":{{"k":"}"}:[1,{"n":2}]}}"#;
        let quoted = quote_object_keys(text);
        let value: Value = serde_json::from_slice(&quoted).unwrap();
        assert_eq!(value["a"], "{x}:{y}");
        assert_eq!(value["m"][r#"{"k":"}"}"#][1]["n"], 2);
    }
}
