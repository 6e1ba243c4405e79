//! Reset-offset bodies (REMOTING.md §4.7): the offsets a consumer group is moved to, per
//! queue, carried by RESET_CONSUMER_CLIENT_OFFSET (broker → client) and in the answer to
//! INVOKE_BROKER_TO_RESET_OFFSET (broker → admin).
//!
//! | form | bytes | read by |
//! |---|---|---|
//! | `ResetOffsetBody` (fastjson, map keyed by object) | `{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:12}}` | Java, Go, mqadmin |
//! | `ResetOffsetBodyForC` | `{"offsetTable":[{"brokerName":"b","offset":12,"queueId":0,"topic":"T"}]}` | the C++ client (and its Python, Node wrappers) |
//!
//! The first is not JSON at all (an object as a key), but it is what fastjson writes and what
//! Java's and Go's clients parse; the C++ client's JSON reader fails on it and reads the
//! second. Both are written here with keys sorted, as fastjson writes beans; both are read.

use serde_json::{json, Value};

use super::json::{value_to_i64, Fields};
use super::lists::MessageQueue;
use super::stats::{parse_queue_keyed, queue_entries};
use super::BodyError;

const WHAT: &str = "ResetOffsetBody";

/// Queue → offset to consume next.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResetOffsetBody {
    pub offset_table: Vec<(MessageQueue, i64)>,
}

fn queue_json(queue: &MessageQueue) -> Value {
    json!({
        "brokerName": queue.broker_name,
        "queueId": queue.queue_id,
        "topic": queue.topic,
    })
}

impl ResetOffsetBody {
    /// fastjson's `ResetOffsetBody`: queues as object keys.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = b"{\"offsetTable\":{".to_vec();
        for (index, (queue, offset)) in self.offset_table.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            out.extend_from_slice(queue_json(queue).to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(offset.to_string().as_bytes());
        }
        out.extend_from_slice(b"}}");
        out
    }

    /// `ResetOffsetBodyForC`: a list of queues with their offsets (standard JSON).
    pub fn encode_for_cpp(&self) -> Vec<u8> {
        let list: Vec<Value> = self
            .offset_table
            .iter()
            .map(|(queue, offset)| {
                json!({
                    "brokerName": queue.broker_name,
                    "offset": offset,
                    "queueId": queue.queue_id,
                    "topic": queue.topic,
                })
            })
            .collect();
        json!({ "offsetTable": list }).to_string().into_bytes()
    }

    /// Reads either form.
    pub fn parse(body: &[u8]) -> Result<ResetOffsetBody, BodyError> {
        let map = parse_queue_keyed(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        if let Some(Value::Array(items)) = fields.get("offsetTable") {
            let mut offset_table = Vec::with_capacity(items.len());
            for item in items {
                let queue = MessageQueue::from_value(WHAT, item)?;
                let offset = Fields::of(WHAT, item)?
                    .i64("offset")?
                    .ok_or_else(|| BodyError::malformed(WHAT, "offsetTable[].offset: missing"))?;
                offset_table.push((queue, offset));
            }
            return Ok(ResetOffsetBody { offset_table });
        }
        let offset_table = queue_entries(WHAT, &fields, |value| {
            value_to_i64(value).ok_or_else(|| BodyError::malformed(WHAT, "offset is not a number"))
        })?;
        Ok(ResetOffsetBody { offset_table })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn queue(topic: &str, broker: &str, queue_id: u32) -> MessageQueue {
        MessageQueue {
            topic: topic.to_string(),
            broker_name: broker.to_string(),
            queue_id,
        }
    }

    #[test]
    fn both_forms_as_fastjson_writes_them() {
        let body = ResetOffsetBody {
            offset_table: vec![
                (queue("T", "broker-0", 0), 12),
                (queue("T", "broker-0", 1), 7),
            ],
        };
        assert_eq!(
            String::from_utf8(body.encode()).unwrap(),
            r#"{"offsetTable":{{"brokerName":"broker-0","queueId":0,"topic":"T"}:12,{"brokerName":"broker-0","queueId":1,"topic":"T"}:7}}"#
        );
        assert_eq!(
            String::from_utf8(body.encode_for_cpp()).unwrap(),
            r#"{"offsetTable":[{"brokerName":"broker-0","offset":12,"queueId":0,"topic":"T"},{"brokerName":"broker-0","offset":7,"queueId":1,"topic":"T"}]}"#
        );
        assert_eq!(ResetOffsetBody::parse(&body.encode()).unwrap(), body);
        assert_eq!(
            ResetOffsetBody::parse(&body.encode_for_cpp()).unwrap(),
            body
        );
        let empty = ResetOffsetBody::default();
        assert_eq!(empty.encode(), br#"{"offsetTable":{}}"#);
        assert_eq!(ResetOffsetBody::parse(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn java_spacing_and_bad_bodies() {
        let spaced = br#"{ "offsetTable" : { {"topic":"T","queueId":3,"brokerName":"b"} : 5 } }"#;
        assert_eq!(
            ResetOffsetBody::parse(spaced).unwrap().offset_table,
            vec![(queue("T", "b", 3), 5)]
        );
        assert!(ResetOffsetBody::parse(b"{}")
            .unwrap()
            .offset_table
            .is_empty());
        for bad in [
            &b"x"[..],
            b"{\"offsetTable\":{{\"topic\":\"T\"}:1}}",
            b"{\"offsetTable\":{1:2}}",
        ] {
            assert!(
                ResetOffsetBody::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    proptest! {
        #[test]
        fn round_trip(entries in proptest::collection::vec(("\\PC{1,8}", "\\PC{0,8}", 0u32..64, any::<i64>()), 0..5)) {
            let body = ResetOffsetBody {
                offset_table: entries.iter().map(|(t, b, q, o)| (queue(t, b, *q), *o)).collect(),
            };
            // The object-key form comes back in key order (order carries no meaning there).
            let sorted = |mut table: Vec<(MessageQueue, i64)>| {
                table.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
                table
            };
            prop_assert_eq!(
                sorted(ResetOffsetBody::parse(&body.encode()).unwrap().offset_table),
                sorted(body.offset_table.clone())
            );
            prop_assert_eq!(ResetOffsetBody::parse(&body.encode_for_cpp()).unwrap(), body);
        }
    }
}
