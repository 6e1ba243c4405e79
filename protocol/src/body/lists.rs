//! Small bodies (REMOTING.md §4.5, §6.7): consumer id list, topic list, KV table,
//! `MessageQueue`, lock/unlock batch bodies and the persisted consumer offset table.
//!
//! All written compact (the offset table pretty) with quoted keys; all read leniently,
//! including `consumerOffset.json` files written by Java with bare queue-id keys.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::json::{
    encode_compact, encode_pretty, parse_object, value_to_i64, value_to_string, Fields,
};
use super::BodyError;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConsumerIdListWire<'a> {
    consumer_id_list: &'a [String],
}

/// GET_CONSUMER_LIST_BY_GROUP response: `{"consumerIdList":[..]}`.
pub fn encode_consumer_id_list(ids: &[String]) -> Vec<u8> {
    encode_compact(&ConsumerIdListWire {
        consumer_id_list: ids,
    })
}

pub fn parse_consumer_id_list(body: &[u8]) -> Result<Vec<String>, BodyError> {
    const WHAT: &str = "GetConsumerListByGroupResponseBody";
    let map = parse_object(WHAT, body)?;
    Fields::new(WHAT, &map).string_array("consumerIdList")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopicListWire<'a> {
    topic_list: &'a [String],
}

/// TopicList body: `{"topicList":[..]}`.
pub fn encode_topic_list(topics: &[String]) -> Vec<u8> {
    encode_compact(&TopicListWire { topic_list: topics })
}

/// Reads a TopicList; the optional `brokerAddr` member is ignored.
pub fn parse_topic_list(body: &[u8]) -> Result<Vec<String>, BodyError> {
    const WHAT: &str = "TopicList";
    let map = parse_object(WHAT, body)?;
    Fields::new(WHAT, &map).string_array("topicList")
}

#[derive(Serialize)]
struct KvTableWire<'a> {
    table: &'a BTreeMap<String, String>,
}

/// KVTable body: `{"table":{"k":"v"}}`.
pub fn encode_kv_table(table: &BTreeMap<String, String>) -> Vec<u8> {
    encode_compact(&KvTableWire { table })
}

/// Reads a KVTable; numbers/booleans as values are taken as text, nulls skipped.
pub fn parse_kv_table(body: &[u8]) -> Result<BTreeMap<String, String>, BodyError> {
    const WHAT: &str = "KVTable";
    let map = parse_object(WHAT, body)?;
    let mut table = BTreeMap::new();
    if let Some(entries) = Fields::new(WHAT, &map).object("table")? {
        for (key, value) in entries.map.iter().filter(|(_, value)| !value.is_null()) {
            let value = value_to_string(value)
                .ok_or_else(|| BodyError::malformed(WHAT, format!("table.{key}: not a string")))?;
            table.insert(key.clone(), value);
        }
    }
    Ok(table)
}

/// A queue of a topic on one broker name. Ordered by topic, broker name, queue id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageQueue {
    pub topic: String,
    pub broker_name: String,
    pub queue_id: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageQueueWire<'a> {
    broker_name: &'a str,
    queue_id: u32,
    topic: &'a str,
}

impl MessageQueue {
    fn wire(&self) -> MessageQueueWire<'_> {
        MessageQueueWire {
            broker_name: &self.broker_name,
            queue_id: self.queue_id,
            topic: &self.topic,
        }
    }

    pub(crate) fn from_value(what: &'static str, value: &Value) -> Result<MessageQueue, BodyError> {
        let fields = Fields::of(what, value)?;
        Ok(MessageQueue {
            topic: fields.required_string("topic")?,
            broker_name: fields.string("brokerName")?.unwrap_or_default(),
            queue_id: fields
                .u32("queueId")?
                .ok_or_else(|| BodyError::malformed(what, "queueId: missing"))?,
        })
    }
}

fn queues_from(what: &'static str, items: &[Value]) -> Result<Vec<MessageQueue>, BodyError> {
    items
        .iter()
        .map(|item| MessageQueue::from_value(what, item))
        .collect()
}

/// LOCK_BATCH_MQ request body; UNLOCK_BATCH_MQ bodies have the same shape and parse here too.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LockBatchRequest {
    pub consumer_group: String,
    pub client_id: String,
    pub mq_set: Vec<MessageQueue>,
    /// Go omits it: false.
    pub only_this_broker: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LockBatchRequestWire<'a> {
    client_id: &'a str,
    consumer_group: &'a str,
    mq_set: Vec<MessageQueueWire<'a>>,
    only_this_broker: bool,
}

impl LockBatchRequest {
    pub fn parse(body: &[u8]) -> Result<LockBatchRequest, BodyError> {
        const WHAT: &str = "LockBatchRequestBody";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        Ok(LockBatchRequest {
            consumer_group: fields.string("consumerGroup")?.unwrap_or_default(),
            client_id: fields.string("clientId")?.unwrap_or_default(),
            mq_set: queues_from(WHAT, fields.array("mqSet")?)?,
            only_this_broker: fields.bool("onlyThisBroker")?.unwrap_or(false),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&LockBatchRequestWire {
            client_id: &self.client_id,
            consumer_group: &self.consumer_group,
            mq_set: self.mq_set.iter().map(MessageQueue::wire).collect(),
            only_this_broker: self.only_this_broker,
        })
    }
}

#[derive(Serialize)]
struct LockBatchResponseWire<'a> {
    #[serde(rename = "lockOKMQSet")]
    lock_ok_mq_set: Vec<MessageQueueWire<'a>>,
}

/// LOCK_BATCH_MQ response: `{"lockOKMQSet":[MQ..]}`.
pub fn encode_lock_batch_response(locked: &[MessageQueue]) -> Vec<u8> {
    encode_compact(&LockBatchResponseWire {
        lock_ok_mq_set: locked.iter().map(MessageQueue::wire).collect(),
    })
}

/// Reads a LOCK_BATCH_MQ response; an empty body (Go accepts it) is an empty set.
pub fn parse_lock_batch_response(body: &[u8]) -> Result<Vec<MessageQueue>, BodyError> {
    const WHAT: &str = "LockBatchResponseBody";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let map = parse_object(WHAT, body)?;
    queues_from(WHAT, Fields::new(WHAT, &map).array("lockOKMQSet")?)
}

/// `consumerOffset.json`: `{"offsetTable":{"T@G":{"0":12,"1":7}}}`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsumerOffsetTable {
    /// `topic@group` → queue id → next offset to consume.
    pub offsets: BTreeMap<String, BTreeMap<u32, i64>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConsumerOffsetWire<'a> {
    offset_table: &'a BTreeMap<String, BTreeMap<u32, i64>>,
}

impl ConsumerOffsetTable {
    /// Indented, quoted queue-id keys.
    pub fn encode_pretty(&self) -> Vec<u8> {
        encode_pretty(&ConsumerOffsetWire {
            offset_table: &self.offsets,
        })
    }

    /// Reads bare or quoted queue-id keys; other members (`dataVersion`) are ignored.
    pub fn parse(body: &[u8]) -> Result<ConsumerOffsetTable, BodyError> {
        const WHAT: &str = "ConsumerOffsetTable";
        let map = parse_object(WHAT, body)?;
        let mut offsets = BTreeMap::new();
        if let Some(table) = Fields::new(WHAT, &map).object("offsetTable")? {
            for (key, queues) in table.map.iter().filter(|(_, queues)| !queues.is_null()) {
                let queues = Fields::of(WHAT, queues)?;
                let mut by_queue = BTreeMap::new();
                for (queue_id, offset) in queues.map.iter().filter(|(_, offset)| !offset.is_null())
                {
                    let queue_id = queue_id.trim().parse::<u32>().map_err(|_| {
                        BodyError::malformed(WHAT, format!("{key}: bad queue id {queue_id:?}"))
                    })?;
                    let offset = value_to_i64(offset)
                        .ok_or_else(|| BodyError::malformed(WHAT, format!("{key}: bad offset")))?;
                    by_queue.insert(queue_id, offset);
                }
                offsets.insert(key.clone(), by_queue);
            }
        }
        Ok(ConsumerOffsetTable { offsets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shapes() {
        let ids = vec!["a@1".to_string()];
        assert_eq!(
            encode_consumer_id_list(&ids),
            br#"{"consumerIdList":["a@1"]}"#
        );
        assert_eq!(encode_topic_list(&ids), br#"{"topicList":["a@1"]}"#);
        let table = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert_eq!(encode_kv_table(&table), br#"{"table":{"k":"v"}}"#);
        let mq = MessageQueue {
            topic: "T".into(),
            broker_name: "b".into(),
            queue_id: 0,
        };
        assert_eq!(
            encode_lock_batch_response(&[mq]),
            br#"{"lockOKMQSet":[{"brokerName":"b","queueId":0,"topic":"T"}]}"#
        );
    }

    #[test]
    fn lenient_reads() {
        let go_lock = br#"{"consumerGroup":"G","clientId":"c","mqSet":[{"topic":"T","brokerName":"b","queueId":"3"}]}"#;
        let request = LockBatchRequest::parse(go_lock).expect("parses");
        assert!(!request.only_this_broker);
        assert_eq!(request.mq_set[0].queue_id, 3);
        assert_eq!(parse_lock_batch_response(b"").ok(), Some(vec![]));
        let java_offsets =
            b"{\n\t\"offsetTable\":{\n\t\t\"T@G\":{0:12,1:7}\n\t},\"dataVersion\":{}\n}";
        let table = ConsumerOffsetTable::parse(java_offsets).expect("parses");
        assert_eq!(table.offsets["T@G"], BTreeMap::from([(0, 12), (1, 7)]));
        assert!(ConsumerOffsetTable::parse(br#"{"offsetTable":{"T@G":{"x":1}}}"#).is_err());
        assert!(parse_consumer_id_list(br#"{"consumerIdList":[{}]}"#).is_err());
        assert_eq!(
            parse_kv_table(br#"{"table":{"a":1,"b":null}}"#)
                .ok()
                .map(|t| t.len()),
            Some(1)
        );
    }

    fn queue_strategy() -> impl Strategy<Value = MessageQueue> {
        ("\\PC{1,10}", "\\PC{0,10}", any::<u32>()).prop_map(|(topic, broker_name, queue_id)| {
            MessageQueue {
                topic,
                broker_name,
                queue_id,
            }
        })
    }

    proptest! {
        #[test]
        fn lists_round_trip(items in proptest::collection::vec("\\PC{0,12}", 0..6)) {
            prop_assert_eq!(parse_consumer_id_list(&encode_consumer_id_list(&items)).ok(), Some(items.clone()));
            prop_assert_eq!(parse_topic_list(&encode_topic_list(&items)).ok(), Some(items));
        }

        #[test]
        fn kv_round_trip(table in proptest::collection::btree_map("\\PC{0,8}", "\\PC{0,8}", 0..6)) {
            prop_assert_eq!(parse_kv_table(&encode_kv_table(&table)).ok(), Some(table));
        }

        #[test]
        fn lock_round_trip(
            consumer_group in "\\PC{0,8}",
            client_id in "\\PC{0,8}",
            mq_set in proptest::collection::vec(queue_strategy(), 0..5),
            only_this_broker in any::<bool>(),
        ) {
            let request = LockBatchRequest { consumer_group, client_id, mq_set, only_this_broker };
            prop_assert_eq!(LockBatchRequest::parse(&request.encode()).ok(), Some(request.clone()));
            let locked = parse_lock_batch_response(&encode_lock_batch_response(&request.mq_set)).ok();
            prop_assert_eq!(locked, Some(request.mq_set));
        }

        #[test]
        fn offsets_round_trip(
            offsets in proptest::collection::btree_map(
                "\\PC{1,10}",
                proptest::collection::btree_map(any::<u32>(), any::<i64>(), 0..5),
                0..5,
            ),
        ) {
            let table = ConsumerOffsetTable { offsets };
            prop_assert_eq!(ConsumerOffsetTable::parse(&table.encode_pretty()).ok(), Some(table));
        }
    }
}
