//! Topic configuration bodies: `DataVersion`, `TopicConfig`, the `topics.json` table and the
//! REGISTER_BROKER body (REMOTING.md §4.5, §4.8, §6.1, §6.7).
//!
//! Keys are written in Java's names, sorted like fastjson. Reading is lenient; a topic entry
//! without `topicName` takes its table key. Only the uncompressed JSON registration is read:
//! the `compressed=true` zlib form is answered with [`BodyError::Unsupported`].

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::json::{encode_compact, encode_pretty, parse_object, string_map_value, Fields};
use super::BodyError;

/// Java `PermName` bits.
pub mod perm {
    pub const PRIORITY: u32 = 8;
    pub const READ: u32 = 4;
    pub const WRITE: u32 = 2;
    pub const INHERIT: u32 = 1;

    pub fn is_readable(perm: u32) -> bool {
        perm & READ != 0
    }
    pub fn is_writeable(perm: u32) -> bool {
        perm & WRITE != 0
    }
    pub fn is_inherited(perm: u32) -> bool {
        perm & INHERIT != 0
    }
}

/// `topicFilterType` of every normal topic.
pub const TOPIC_FILTER_TYPE_SINGLE: &str = "SINGLE_TAG";

/// Java `TopicConfig` class defaults for a member missing from the JSON.
const QUEUE_NUMS_DEFAULT: u32 = 16;
const PERM_DEFAULT: u32 = perm::READ | perm::WRITE;

/// A version stamp of a broker's topic set (Java `DataVersion`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataVersion {
    pub counter: i64,
    pub state_version: i64,
    pub timestamp: i64,
}

impl DataVersion {
    pub(crate) fn from_fields(fields: Fields<'_>) -> Result<DataVersion, BodyError> {
        Ok(DataVersion {
            counter: fields.i64("counter")?.unwrap_or(0),
            state_version: fields.i64("stateVersion")?.unwrap_or(0),
            timestamp: fields.i64("timestamp")?.unwrap_or(0),
        })
    }

    /// The `dataVersion` member of a table body; missing is all zero.
    pub(crate) fn member_of(fields: &Fields<'_>) -> Result<DataVersion, BodyError> {
        match fields.object("dataVersion")? {
            Some(version) => DataVersion::from_fields(version),
            None => Ok(DataVersion::default()),
        }
    }

    /// As a JSON value, for the `dataVersion` member of a table body.
    pub(crate) fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Reads a standalone DataVersion body (QUERY_DATA_VERSION).
    pub fn parse(body: &[u8]) -> Result<DataVersion, BodyError> {
        let map = parse_object("DataVersion", body)?;
        DataVersion::from_fields(Fields::new("DataVersion", &map))
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_compact(self)
    }
}

impl<'de> Deserialize<'de> for DataVersion {
    /// Lenient: numbers as strings, missing members zero.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Fields::of("DataVersion", &value)
            .and_then(DataVersion::from_fields)
            .map_err(serde::de::Error::custom)
    }
}

/// One topic's configuration (Java `TopicConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct TopicConfig {
    pub topic_name: String,
    pub read_queue_nums: u32,
    pub write_queue_nums: u32,
    pub perm: u32,
    pub topic_filter_type: String,
    pub topic_sys_flag: u32,
    pub order: bool,
    pub attributes: BTreeMap<String, String>,
}

impl TopicConfig {
    /// A normal topic: `queues` read and write queues, SINGLE_TAG, no flags or attributes.
    pub fn new(name: &str, queues: u32, perm: u32) -> TopicConfig {
        TopicConfig {
            topic_name: name.to_string(),
            read_queue_nums: queues,
            write_queue_nums: queues,
            perm,
            topic_filter_type: TOPIC_FILTER_TYPE_SINGLE.to_string(),
            topic_sys_flag: 0,
            order: false,
            attributes: BTreeMap::new(),
        }
    }

    /// Java's JSON object (keys sorted).
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("attributes".into(), string_map_value(&self.attributes));
        map.insert("order".into(), Value::Bool(self.order));
        map.insert("perm".into(), self.perm.into());
        map.insert("readQueueNums".into(), self.read_queue_nums.into());
        map.insert(
            "topicFilterType".into(),
            self.topic_filter_type.clone().into(),
        );
        map.insert("topicName".into(), self.topic_name.clone().into());
        map.insert("topicSysFlag".into(), self.topic_sys_flag.into());
        map.insert("writeQueueNums".into(), self.write_queue_nums.into());
        Value::Object(map)
    }

    /// Lenient read; `topicName` is required.
    pub fn from_value(value: &Value) -> Result<TopicConfig, BodyError> {
        TopicConfig::from_value_named(value, None)
    }

    /// Lenient read; a missing `topicName` falls back to `name` (the table key).
    pub(crate) fn from_value_named(
        value: &Value,
        name: Option<&str>,
    ) -> Result<TopicConfig, BodyError> {
        let fields = Fields::of("TopicConfig", value)?;
        let topic_name = match (fields.string("topicName")?, name) {
            (Some(topic_name), _) => topic_name,
            (None, Some(name)) => name.to_string(),
            (None, None) => return Err(BodyError::malformed("TopicConfig", "topicName: missing")),
        };
        let attributes = fields.string_map("attributes")?;
        Ok(TopicConfig {
            topic_name,
            read_queue_nums: fields.u32("readQueueNums")?.unwrap_or(QUEUE_NUMS_DEFAULT),
            write_queue_nums: fields.u32("writeQueueNums")?.unwrap_or(QUEUE_NUMS_DEFAULT),
            perm: fields.u32("perm")?.unwrap_or(PERM_DEFAULT),
            topic_filter_type: fields
                .string("topicFilterType")?
                .unwrap_or_else(|| TOPIC_FILTER_TYPE_SINGLE.to_string()),
            topic_sys_flag: fields.u32("topicSysFlag")?.unwrap_or(0),
            order: fields.bool("order")?.unwrap_or(false),
            attributes,
        })
    }
}

/// `topics.json` and the inside of a registration:
/// `{"dataVersion":{..},"topicConfigTable":{"T":{TopicConfig}}}`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopicConfigTable {
    pub data_version: DataVersion,
    pub topics: BTreeMap<String, TopicConfig>,
}

impl TopicConfigTable {
    fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("dataVersion".into(), self.data_version.to_value());
        let topics = self
            .topics
            .iter()
            .map(|(name, config)| (name.clone(), config.to_value()));
        map.insert("topicConfigTable".into(), Value::Object(topics.collect()));
        Value::Object(map)
    }

    fn from_fields(fields: Fields<'_>) -> Result<TopicConfigTable, BodyError> {
        let data_version = DataVersion::member_of(&fields)?;
        let mut topics = BTreeMap::new();
        if let Some(table) = fields.object("topicConfigTable")? {
            for (name, value) in table.map.iter().filter(|(_, value)| !value.is_null()) {
                topics.insert(
                    name.clone(),
                    TopicConfig::from_value_named(value, Some(name))?,
                );
            }
        }
        Ok(TopicConfigTable {
            data_version,
            topics,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&self.to_value())
    }

    /// Indented, for the persisted `topics.json`.
    pub fn encode_pretty(&self) -> Vec<u8> {
        encode_pretty(&self.to_value())
    }

    pub fn parse(body: &[u8]) -> Result<TopicConfigTable, BodyError> {
        let map = parse_object("TopicConfigTable", body)?;
        TopicConfigTable::from_fields(Fields::new("TopicConfigTable", &map))
    }
}

/// REGISTER_BROKER body, uncompressed JSON form.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegisterBrokerBody {
    pub topic_config_table: TopicConfigTable,
    pub filter_server_list: Vec<String>,
}

impl RegisterBrokerBody {
    /// Reads the JSON form; a zlib stream (first byte 0x78) is [`BodyError::Unsupported`].
    /// 5.x static-topic members (`topicQueueMapping*`) are ignored.
    pub fn parse(body: &[u8]) -> Result<RegisterBrokerBody, BodyError> {
        const WHAT: &str = "RegisterBrokerBody";
        if body.first() == Some(&0x78) {
            return Err(compressed_unsupported());
        }
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let topic_config_table = match fields.object("topicConfigSerializeWrapper")? {
            Some(wrapper) => TopicConfigTable::from_fields(wrapper)?,
            None => TopicConfigTable::default(),
        };
        Ok(RegisterBrokerBody {
            topic_config_table,
            filter_server_list: fields.string_array("filterServerList")?,
        })
    }

    /// Reads a body given the request's `compressed` ext field.
    pub fn parse_with_compressed_flag(
        body: &[u8],
        compressed: bool,
    ) -> Result<RegisterBrokerBody, BodyError> {
        if compressed {
            return Err(compressed_unsupported());
        }
        RegisterBrokerBody::parse(body)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut map = Map::new();
        let servers = self
            .filter_server_list
            .iter()
            .cloned()
            .map(Value::String)
            .collect();
        map.insert("filterServerList".into(), Value::Array(servers));
        map.insert(
            "topicConfigSerializeWrapper".into(),
            self.topic_config_table.to_value(),
        );
        encode_compact(&Value::Object(map))
    }
}

fn compressed_unsupported() -> BodyError {
    BodyError::Unsupported {
        what: "RegisterBrokerBody",
        reason: "compressed registrations are not supported; register with compressed=false".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn topic_config_shape_and_defaults() {
        let config = TopicConfig::new("T", 4, 6);
        let text = String::from_utf8(encode_compact(&config.to_value())).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"attributes":{},"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"T","topicSysFlag":0,"writeQueueNums":4}"#
        );
        let sparse = serde_json::json!({"perm": "7", "readQueueNums": 2, "attributes": {"+a": 1}});
        let parsed = TopicConfig::from_value_named(&sparse, Some("K")).expect("parses");
        assert_eq!(parsed.topic_name, "K");
        assert_eq!(
            (parsed.read_queue_nums, parsed.write_queue_nums, parsed.perm),
            (2, 16, 7)
        );
        assert_eq!(parsed.attributes.get("+a").map(String::as_str), Some("1"));
        assert!(TopicConfig::from_value(&sparse).is_err());
        assert!(TopicConfig::from_value(&serde_json::json!({"topicName":"T","perm":-1})).is_err());
    }

    #[test]
    fn data_version_lenient() {
        let version: DataVersion =
            serde_json::from_str(r#"{"counter":"3","timestamp":5}"#).expect("parses");
        assert_eq!(
            version,
            DataVersion {
                counter: 3,
                state_version: 0,
                timestamp: 5
            }
        );
        assert_eq!(DataVersion::parse(&version.encode()).ok(), Some(version));
    }

    #[test]
    fn compressed_registration_is_unsupported() {
        let error = RegisterBrokerBody::parse(&[0x78, 0x9c, 1, 2]).err();
        assert!(matches!(error, Some(BodyError::Unsupported { .. })));
        let error = RegisterBrokerBody::parse_with_compressed_flag(b"{}", true).err();
        assert!(matches!(error, Some(BodyError::Unsupported { .. })));
        assert!(RegisterBrokerBody::parse_with_compressed_flag(b"{}", false).is_ok());
    }

    pub(crate) fn topic_config_strategy() -> impl Strategy<Value = TopicConfig> {
        (
            "[A-Za-z0-9_%-]{1,16}",
            (0u32..2048, 0u32..2048, 0u32..16, 0u32..8),
            "[A-Z_]{1,10}",
            any::<bool>(),
            proptest::collection::btree_map("\\PC{1,6}", "\\PC{0,6}", 0..3),
        )
            .prop_map(
                |(name, (read, write, perm, sys_flag), filter, order, attributes)| TopicConfig {
                    topic_name: name,
                    read_queue_nums: read,
                    write_queue_nums: write,
                    perm,
                    topic_filter_type: filter,
                    topic_sys_flag: sys_flag,
                    order,
                    attributes,
                },
            )
    }

    fn table_strategy() -> impl Strategy<Value = TopicConfigTable> {
        (
            any::<(i64, i64, i64)>(),
            proptest::collection::vec(topic_config_strategy(), 0..5),
        )
            .prop_map(
                |((counter, state_version, timestamp), configs)| TopicConfigTable {
                    data_version: DataVersion {
                        counter,
                        state_version,
                        timestamp,
                    },
                    topics: configs
                        .into_iter()
                        .map(|c| (c.topic_name.clone(), c))
                        .collect(),
                },
            )
    }

    proptest! {
        #[test]
        fn topic_table_round_trip(table in table_strategy()) {
            prop_assert_eq!(TopicConfigTable::parse(&table.encode_pretty()).ok(), Some(table.clone()));
            prop_assert_eq!(TopicConfigTable::parse(&table.encode()).ok(), Some(table));
        }

        #[test]
        fn register_broker_round_trip(
            table in table_strategy(),
            filter_server_list in proptest::collection::vec("[0-9.:]{1,21}", 0..3),
        ) {
            let body = RegisterBrokerBody { topic_config_table: table, filter_server_list };
            prop_assert_eq!(RegisterBrokerBody::parse(&body.encode()).ok(), Some(body));
        }
    }
}
