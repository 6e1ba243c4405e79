//! Subscription groups: Java `SubscriptionGroupConfig` (the body of
//! UPDATE_AND_CREATE_SUBSCRIPTIONGROUP and GET_SUBSCRIPTIONGROUP_CONFIG) and the table of
//! GET_ALL_SUBSCRIPTIONGROUP_CONFIG and `subscriptionGroup.json`:
//! `{"subscriptionGroupTable":{"G":{..}},"forbiddenTable":{},"dataVersion":{..}}`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::json::{encode_compact, encode_pretty, parse_object, string_map_value, Fields};
use super::{BodyError, DataVersion};

/// RocketMQ's defaults for a group created on first use (REMOTING.md §6.6).
pub const RETRY_QUEUE_NUMS_DEFAULT: u32 = 1;
pub const RETRY_MAX_TIMES_DEFAULT: u32 = 16;
/// Largest retryQueueNums / retryMaxTimes accepted from an admin (sanity bounds).
pub const RETRY_QUEUE_NUMS_MAX: u32 = 64;
pub const RETRY_MAX_TIMES_MAX: u32 = 1_000;

/// One consumer group's settings on one broker.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionGroupConfig {
    pub group_name: String,
    /// false: pulls of this group are refused (NO_PERMISSION).
    pub consume_enable: bool,
    pub consume_from_min_enable: bool,
    /// false: BROADCASTING consumers of this group are refused.
    pub consume_broadcast_enable: bool,
    pub consume_message_orderly: bool,
    /// Queues of `%RETRY%<group>`.
    pub retry_queue_nums: u32,
    /// Deliveries after which a failed message goes to `%DLQ%<group>`.
    pub retry_max_times: u32,
    pub broker_id: i64,
    pub which_broker_when_consume_slowly: i64,
    pub notify_consumer_ids_changed_enable: bool,
    pub group_sys_flag: i64,
    pub consume_timeout_minute: i64,
    pub attributes: BTreeMap<String, String>,
}

impl SubscriptionGroupConfig {
    /// A group with RocketMQ's defaults.
    pub fn new(group_name: &str) -> SubscriptionGroupConfig {
        SubscriptionGroupConfig {
            group_name: group_name.to_string(),
            consume_enable: true,
            consume_from_min_enable: true,
            consume_broadcast_enable: true,
            consume_message_orderly: false,
            retry_queue_nums: RETRY_QUEUE_NUMS_DEFAULT,
            retry_max_times: RETRY_MAX_TIMES_DEFAULT,
            broker_id: 0,
            which_broker_when_consume_slowly: 1,
            notify_consumer_ids_changed_enable: true,
            group_sys_flag: 0,
            consume_timeout_minute: 15,
            attributes: BTreeMap::new(),
        }
    }

    /// Java's JSON object (keys sorted).
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("attributes".into(), string_map_value(&self.attributes));
        map.insert("brokerId".into(), self.broker_id.into());
        map.insert(
            "consumeBroadcastEnable".into(),
            self.consume_broadcast_enable.into(),
        );
        map.insert("consumeEnable".into(), self.consume_enable.into());
        map.insert(
            "consumeFromMinEnable".into(),
            self.consume_from_min_enable.into(),
        );
        map.insert(
            "consumeMessageOrderly".into(),
            self.consume_message_orderly.into(),
        );
        map.insert(
            "consumeTimeoutMinute".into(),
            self.consume_timeout_minute.into(),
        );
        map.insert("groupName".into(), self.group_name.clone().into());
        map.insert("groupSysFlag".into(), self.group_sys_flag.into());
        map.insert(
            "notifyConsumerIdsChangedEnable".into(),
            self.notify_consumer_ids_changed_enable.into(),
        );
        map.insert("retryMaxTimes".into(), self.retry_max_times.into());
        map.insert("retryQueueNums".into(), self.retry_queue_nums.into());
        map.insert(
            "whichBrokerWhenConsumeSlowly".into(),
            self.which_broker_when_consume_slowly.into(),
        );
        Value::Object(map)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&self.to_value())
    }

    /// Lenient read of a request body; `groupName` is required.
    pub fn parse(body: &[u8]) -> Result<SubscriptionGroupConfig, BodyError> {
        let map = parse_object("SubscriptionGroupConfig", body)?;
        SubscriptionGroupConfig::from_fields(Fields::new("SubscriptionGroupConfig", &map), None)
    }

    /// Lenient read of Java's JSON object (as [`SubscriptionGroupConfig::parse`]).
    pub fn from_value(value: &Value) -> Result<SubscriptionGroupConfig, BodyError> {
        SubscriptionGroupConfig::from_fields(Fields::of("SubscriptionGroupConfig", value)?, None)
    }

    fn from_fields(
        fields: Fields<'_>,
        name: Option<&str>,
    ) -> Result<SubscriptionGroupConfig, BodyError> {
        const WHAT: &str = "SubscriptionGroupConfig";
        let group_name = match (fields.string("groupName")?, name) {
            (Some(group_name), _) if !group_name.is_empty() => group_name,
            (_, Some(name)) => name.to_string(),
            _ => return Err(BodyError::malformed(WHAT, "groupName: missing")),
        };
        let defaults = SubscriptionGroupConfig::new(&group_name);
        let retry_queue_nums = fields
            .u32("retryQueueNums")?
            .unwrap_or(defaults.retry_queue_nums);
        if retry_queue_nums == 0 || retry_queue_nums > RETRY_QUEUE_NUMS_MAX {
            return Err(BodyError::malformed(
                WHAT,
                format!(
                    "retryQueueNums {retry_queue_nums} must be within 1..={RETRY_QUEUE_NUMS_MAX}"
                ),
            ));
        }
        let retry_max_times = match fields.i64("retryMaxTimes")? {
            None => defaults.retry_max_times,
            Some(n) if (0..=i64::from(RETRY_MAX_TIMES_MAX)).contains(&n) => n as u32,
            Some(n) => {
                return Err(BodyError::malformed(
                    WHAT,
                    format!("retryMaxTimes {n} must be within 0..={RETRY_MAX_TIMES_MAX}"),
                ))
            }
        };
        let attributes = fields.string_map("attributes")?;
        Ok(SubscriptionGroupConfig {
            group_name,
            consume_enable: fields.bool("consumeEnable")?.unwrap_or(true),
            consume_from_min_enable: fields.bool("consumeFromMinEnable")?.unwrap_or(true),
            consume_broadcast_enable: fields.bool("consumeBroadcastEnable")?.unwrap_or(true),
            consume_message_orderly: fields.bool("consumeMessageOrderly")?.unwrap_or(false),
            retry_queue_nums,
            retry_max_times,
            broker_id: fields.i64("brokerId")?.unwrap_or(0),
            which_broker_when_consume_slowly: fields
                .i64("whichBrokerWhenConsumeSlowly")?
                .unwrap_or(1),
            notify_consumer_ids_changed_enable: fields
                .bool("notifyConsumerIdsChangedEnable")?
                .unwrap_or(true),
            group_sys_flag: fields.i64("groupSysFlag")?.unwrap_or(0),
            consume_timeout_minute: fields.i64("consumeTimeoutMinute")?.unwrap_or(15),
            attributes,
        })
    }
}

/// The group table of one broker (GET_ALL_SUBSCRIPTIONGROUP_CONFIG, subscriptionGroup.json).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubscriptionGroupTable {
    pub data_version: DataVersion,
    pub groups: BTreeMap<String, SubscriptionGroupConfig>,
}

impl SubscriptionGroupTable {
    fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("dataVersion".into(), self.data_version.to_value());
        map.insert("forbiddenTable".into(), Value::Object(Map::new()));
        let groups = self
            .groups
            .iter()
            .map(|(name, config)| (name.clone(), config.to_value()));
        map.insert(
            "subscriptionGroupTable".into(),
            Value::Object(groups.collect()),
        );
        Value::Object(map)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&self.to_value())
    }

    pub fn encode_pretty(&self) -> Vec<u8> {
        encode_pretty(&self.to_value())
    }

    pub fn parse(body: &[u8]) -> Result<SubscriptionGroupTable, BodyError> {
        const WHAT: &str = "SubscriptionGroupWrapper";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let data_version = DataVersion::member_of(&fields)?;
        let mut groups = BTreeMap::new();
        if let Some(table) = fields.object("subscriptionGroupTable")? {
            for (name, value) in table.map.iter().filter(|(_, value)| !value.is_null()) {
                let group = SubscriptionGroupConfig::from_fields(
                    Fields::of("SubscriptionGroupConfig", value)?,
                    Some(name),
                )?;
                groups.insert(name.clone(), group);
            }
        }
        Ok(SubscriptionGroupTable {
            data_version,
            groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_body_is_read_leniently() {
        let body = br#"{"groupName":"G","consumeEnable":"false","retryMaxTimes":"3",
            "retryQueueNums":2,"brokerId":0,"whichBrokerWhenConsumeSlowly":1,"unknown":7}"#;
        let group = SubscriptionGroupConfig::parse(body).unwrap();
        assert_eq!(group.group_name, "G");
        assert!(!group.consume_enable);
        assert!(group.consume_broadcast_enable);
        assert_eq!(group.retry_max_times, 3);
        assert_eq!(group.retry_queue_nums, 2);
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let error = SubscriptionGroupConfig::parse(br#"{"groupName":"G","retryQueueNums":0}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("retryQueueNums"), "{error}");
        let error = SubscriptionGroupConfig::parse(br#"{"groupName":"G","retryMaxTimes":-2}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("retryMaxTimes"), "{error}");
        assert!(SubscriptionGroupConfig::parse(br#"{"consumeEnable":true}"#).is_err());
    }

    #[test]
    fn table_round_trips() {
        let mut table = SubscriptionGroupTable::default();
        let mut group = SubscriptionGroupConfig::new("G1");
        group.retry_max_times = 2;
        group.attributes.insert("k".into(), "v".into());
        table.groups.insert("G1".into(), group);
        table.data_version.counter = 4;
        let parsed = SubscriptionGroupTable::parse(&table.encode_pretty()).unwrap();
        assert_eq!(parsed, table);
        // Bare numeric keys and a missing groupName inside the table (fastjson habits).
        let parsed = SubscriptionGroupTable::parse(
            br#"{"subscriptionGroupTable":{"G":{"retryMaxTimes":5}}}"#,
        )
        .unwrap();
        assert_eq!(parsed.groups["G"].retry_max_times, 5);
    }
}
