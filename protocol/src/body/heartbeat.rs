//! HEART_BEAT body (`HeartbeatData`, REMOTING.md §4.4) and CHECK_CLIENT_CONFIG body (§3.5).
//!
//! Every captured client sends a different dialect; all of them are read here:
//!
//! | client | quirk accepted |
//! |---|---|
//! | C++ 2.x | enum ordinals, `subVersion` as a string, `consumerDataSet`/`producerDataSet` absent, no `unitMode`/`classFilterMode`/`expressionType`, `codeSet` garbage, trailing `\n` |
//! | Go | `codeSet` entries as strings (ignored anyway), upper-case names |
//! | ali-ons | no `expressionType` |
//! | Rust | Java shape in another key order, `subVersion` 0 |
//!
//! Invariant: `tags_set`/`code_set` of a parsed [`SubscriptionData`] are recomputed from
//! `sub_string` for TAG expressions (empty otherwise); the client's values are never kept.
//! Missing enums take the push consumer's Java defaults: CONSUME_PASSIVELY, CLUSTERING,
//! CONSUME_FROM_LAST_OFFSET.

use serde::Serialize;
use serde_json::Value;

use super::json::{encode_compact, parse_object, value_to_i64, Fields};
use super::tags::TagFilter;
use super::BodyError;

/// `expressionType` of tag subscriptions (the default).
pub const EXPRESSION_TYPE_TAG: &str = "TAG";
/// `expressionType` of SQL92 property-filter subscriptions.
pub const EXPRESSION_TYPE_SQL92: &str = "SQL92";

const WHAT: &str = "HeartbeatData";

/// Declares a Java enum: variants with Java names (index = ordinal), `name_str`, lenient read.
macro_rules! java_enum {
    ($(#[$meta:meta])* $name:ident, $prefix:literal, [$($variant:ident = $java:literal),+ $(,)?]) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl $name {
            /// Every variant, in Java ordinal order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The Java enum constant name, as fastjson writes it.
            pub fn name_str(self) -> &'static str {
                match self { $($name::$variant => $java),+ }
            }

            /// The Java ordinal.
            pub fn ordinal(self) -> u32 {
                // ALL is in declaration order and holds every variant.
                Self::ALL.iter().position(|v| *v == self).unwrap_or(0) as u32
            }

            /// Name in any case (with or without the Java prefix), ordinal, or ordinal string.
            pub fn from_json(value: &Value) -> Option<$name> {
                if let Some(ordinal) = value_to_i64(value) {
                    return usize::try_from(ordinal).ok().and_then(|i| Self::ALL.get(i)).copied();
                }
                let text = value.as_str()?.trim().to_ascii_uppercase();
                let bare = text.strip_prefix($prefix).unwrap_or(&text);
                Self::ALL.iter().copied().find(|v| {
                    let java = v.name_str();
                    java == text || java.strip_prefix($prefix) == Some(bare)
                })
            }
        }
    };
}

java_enum!(
    /// How the consumer takes messages (Java `ConsumeType`).
    ConsumeType, "CONSUME_", [
        ConsumeActively = "CONSUME_ACTIVELY",
        ConsumePassively = "CONSUME_PASSIVELY",
        ConsumePop = "CONSUME_POP",
    ]
);
java_enum!(
    /// Java `MessageModel`.
    MessageModel, "", [Broadcasting = "BROADCASTING", Clustering = "CLUSTERING"]
);
java_enum!(
    /// Where a group without a committed offset starts (Java `ConsumeFromWhere`).
    ConsumeFromWhere, "CONSUME_FROM_", [
        LastOffset = "CONSUME_FROM_LAST_OFFSET",
        LastOffsetAndFromMinWhenBootFirst = "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
        MinOffset = "CONSUME_FROM_MIN_OFFSET",
        MaxOffset = "CONSUME_FROM_MAX_OFFSET",
        FirstOffset = "CONSUME_FROM_FIRST_OFFSET",
        Timestamp = "CONSUME_FROM_TIMESTAMP",
    ]
);

fn read_enum<T>(
    fields: Fields<'_>,
    key: &str,
    default: T,
    from_json: fn(&Value) -> Option<T>,
) -> Result<T, BodyError> {
    match fields.get(key) {
        None => Ok(default),
        Some(value) => from_json(value).ok_or_else(|| {
            BodyError::malformed(fields.what, format!("{key}: unknown value {value}"))
        }),
    }
}

/// One subscription of a consumer group (Java `SubscriptionData`).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionData {
    pub topic: String,
    pub sub_string: String,
    pub tags_set: Vec<String>,
    /// Recomputed from `sub_string`, never taken from the client.
    pub code_set: Vec<i32>,
    pub sub_version: i64,
    /// `"TAG"` (default) or `"SQL92"`.
    pub expression_type: String,
    pub class_filter_mode: bool,
}

impl SubscriptionData {
    /// A TAG subscription with tags and codes computed from `sub_string`.
    pub fn new(topic: &str, sub_string: &str, sub_version: i64) -> SubscriptionData {
        let filter = TagFilter::parse(sub_string);
        SubscriptionData {
            topic: topic.to_string(),
            sub_string: sub_string.to_string(),
            tags_set: filter.tags().to_vec(),
            code_set: filter.codes().to_vec(),
            sub_version,
            expression_type: EXPRESSION_TYPE_TAG.to_string(),
            class_filter_mode: false,
        }
    }

    /// True for TAG expressions (the expression type compared without case).
    pub fn is_tag_type(&self) -> bool {
        self.expression_type
            .eq_ignore_ascii_case(EXPRESSION_TYPE_TAG)
    }

    /// The filter this subscription applies; SQL92 and other types yield `None`.
    pub fn tag_filter(&self) -> Option<TagFilter> {
        self.is_tag_type()
            .then(|| TagFilter::parse(&self.sub_string))
    }

    pub(crate) fn from_fields(fields: Fields<'_>) -> Result<SubscriptionData, BodyError> {
        let topic = fields.required_string("topic")?;
        let sub_string = fields
            .string("subString")?
            .unwrap_or_else(|| "*".to_string());
        let expression_type = fields
            .string("expressionType")?
            .unwrap_or_else(|| EXPRESSION_TYPE_TAG.to_string());
        let mut subscription = SubscriptionData::new(&topic, &sub_string, 0);
        subscription.sub_version = fields.i64("subVersion")?.unwrap_or(0);
        subscription.class_filter_mode = fields.bool("classFilterMode")?.unwrap_or(false);
        subscription.expression_type = expression_type;
        if !subscription.is_tag_type() {
            subscription.tags_set.clear();
            subscription.code_set.clear();
        }
        Ok(subscription)
    }

    fn wire(&self) -> SubscriptionWire<'_> {
        SubscriptionWire {
            class_filter_mode: self.class_filter_mode,
            code_set: &self.code_set,
            expression_type: &self.expression_type,
            sub_string: &self.sub_string,
            sub_version: self.sub_version,
            tags_set: &self.tags_set,
            topic: &self.topic,
        }
    }
}

/// One consumer group a client belongs to (Java `ConsumerData`).
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerData {
    pub group_name: String,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
    pub unit_mode: bool,
    pub subscriptions: Vec<SubscriptionData>,
}

impl ConsumerData {
    fn from_fields(fields: Fields<'_>) -> Result<ConsumerData, BodyError> {
        let subscriptions = fields
            .array("subscriptionDataSet")?
            .iter()
            .map(|item| SubscriptionData::from_fields(Fields::of(WHAT, item)?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ConsumerData {
            group_name: fields.required_string("groupName")?,
            consume_type: read_enum(
                fields,
                "consumeType",
                ConsumeType::ConsumePassively,
                ConsumeType::from_json,
            )?,
            message_model: read_enum(
                fields,
                "messageModel",
                MessageModel::Clustering,
                MessageModel::from_json,
            )?,
            consume_from_where: read_enum(
                fields,
                "consumeFromWhere",
                ConsumeFromWhere::LastOffset,
                ConsumeFromWhere::from_json,
            )?,
            unit_mode: fields.bool("unitMode")?.unwrap_or(false),
            subscriptions,
        })
    }
}

/// HEART_BEAT request body.
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatData {
    pub client_id: String,
    pub producer_groups: Vec<String>,
    pub consumers: Vec<ConsumerData>,
}

impl HeartbeatData {
    /// Reads any client's heartbeat; `clientID` is required, everything else defaults.
    pub fn parse(body: &[u8]) -> Result<HeartbeatData, BodyError> {
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let producer_groups = fields
            .array("producerDataSet")?
            .iter()
            .map(|item| Fields::of(WHAT, item)?.required_string("groupName"))
            .collect::<Result<Vec<_>, _>>()?;
        let consumers = fields
            .array("consumerDataSet")?
            .iter()
            .map(|item| ConsumerData::from_fields(Fields::of(WHAT, item)?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HeartbeatData {
            client_id: fields.required_string("clientID")?,
            producer_groups,
            consumers,
        })
    }

    /// Java's shape: keys sorted, enums as names, V2 fields zero (fingerprint 0, withoutSub false).
    pub fn encode(&self) -> Vec<u8> {
        let consumers: Vec<ConsumerWire<'_>> = self
            .consumers
            .iter()
            .map(|consumer| ConsumerWire {
                consume_from_where: consumer.consume_from_where.name_str(),
                consume_type: consumer.consume_type.name_str(),
                group_name: &consumer.group_name,
                message_model: consumer.message_model.name_str(),
                subscription_data_set: consumer.subscriptions.iter().map(|s| s.wire()).collect(),
                unit_mode: consumer.unit_mode,
            })
            .collect();
        let producers: Vec<ProducerWire<'_>> = self
            .producer_groups
            .iter()
            .map(|group_name| ProducerWire { group_name })
            .collect();
        encode_compact(&HeartbeatWire {
            client_id: &self.client_id,
            consumer_data_set: consumers,
            heartbeat_fingerprint: 0,
            producer_data_set: producers,
            without_sub: false,
        })
    }
}

// Wire structs: fields in alphabetical order, as fastjson writes beans.

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct HeartbeatWire<'a> {
    #[serde(rename = "clientID")]
    client_id: &'a str,
    consumer_data_set: Vec<ConsumerWire<'a>>,
    heartbeat_fingerprint: i64,
    producer_data_set: Vec<ProducerWire<'a>>,
    without_sub: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ProducerWire<'a> {
    group_name: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConsumerWire<'a> {
    consume_from_where: &'static str,
    consume_type: &'static str,
    group_name: &'a str,
    message_model: &'static str,
    subscription_data_set: Vec<SubscriptionWire<'a>>,
    unit_mode: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SubscriptionWire<'a> {
    class_filter_mode: bool,
    code_set: &'a [i32],
    expression_type: &'a str,
    sub_string: &'a str,
    sub_version: i64,
    tags_set: &'a [String],
    topic: &'a str,
}

/// CHECK_CLIENT_CONFIG request body: `{"clientId","group","subscriptionData":{…},"namespace"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckClientConfigBody {
    pub group: String,
    pub subscription: Option<SubscriptionData>,
}

impl CheckClientConfigBody {
    pub fn parse(body: &[u8]) -> Result<CheckClientConfigBody, BodyError> {
        const WHAT: &str = "CheckClientConfigBody";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let subscription = fields
            .object("subscriptionData")?
            .map(SubscriptionData::from_fields)
            .transpose()?;
        Ok(CheckClientConfigBody {
            group: fields.string("group")?.unwrap_or_default(),
            subscription,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::java_string_hash;
    use proptest::prelude::*;

    #[test]
    fn enums_read_leniently() {
        use serde_json::json;
        assert_eq!(
            ConsumeType::from_json(&json!(1)),
            Some(ConsumeType::ConsumePassively)
        );
        assert_eq!(
            ConsumeType::from_json(&json!("2")),
            Some(ConsumeType::ConsumePop)
        );
        assert_eq!(
            ConsumeType::from_json(&json!("consume_actively")),
            Some(ConsumeType::ConsumeActively)
        );
        assert_eq!(
            ConsumeType::from_json(&json!("PASSIVELY")),
            Some(ConsumeType::ConsumePassively)
        );
        assert_eq!(
            MessageModel::from_json(&json!("Clustering")),
            Some(MessageModel::Clustering)
        );
        assert_eq!(
            MessageModel::from_json(&json!(0)),
            Some(MessageModel::Broadcasting)
        );
        assert_eq!(MessageModel::from_json(&json!(2)), None);
        assert_eq!(MessageModel::from_json(&json!(-1)), None);
        assert_eq!(
            ConsumeFromWhere::from_json(&json!("CONSUME_FROM_TIMESTAMP")),
            Some(ConsumeFromWhere::Timestamp)
        );
        assert_eq!(
            ConsumeFromWhere::from_json(&json!("first_offset")),
            Some(ConsumeFromWhere::FirstOffset)
        );
        assert_eq!(ConsumeFromWhere::MinOffset.ordinal(), 2);
        assert_eq!(ConsumeFromWhere::from_json(&json!({})), None);
    }

    #[test]
    fn cpp_heartbeat_is_read_with_defaults() {
        let body = br#"{"clientID":"5947-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,"groupName":"g","messageModel":1,"subscriptionDataSet":[{"subString":"*","subVersion":"17","topic":"%RETRY%g"},{"codeSet":[0],"subString":"TagA","subVersion":"17","tagsSet":["TagA"],"topic":"T"}]}]}
"#;
        let heartbeat = HeartbeatData::parse(body).expect("parses");
        assert!(heartbeat.producer_groups.is_empty());
        let consumer = &heartbeat.consumers[0];
        assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
        assert_eq!(consumer.message_model, MessageModel::Clustering);
        assert_eq!(consumer.consume_from_where, ConsumeFromWhere::LastOffset);
        assert!(!consumer.unit_mode);
        assert_eq!(
            consumer.subscriptions[0],
            SubscriptionData::new("%RETRY%g", "*", 17)
        );
        assert_eq!(
            consumer.subscriptions[1].code_set,
            vec![java_string_hash("TagA")]
        );
        assert_eq!(consumer.subscriptions[1].expression_type, "TAG");
    }

    #[test]
    fn go_heartbeat_code_strings_are_ignored() {
        let body = r#"{"clientID":"10.0.0.9@1#2","producerDataSet":[],"consumerDataSet":[{"groupName":"g","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_TIMESTAMP","unitMode":false,"subscriptionDataSet":[{"topic":"T","subString":"é || b","tagsSet":["é","b"],"codeSet":["195","98"],"subVersion":5,"expressionType":"TAG","classFilterMode":false}]}]}"#;
        let heartbeat = HeartbeatData::parse(body.as_bytes()).expect("parses");
        let consumer = &heartbeat.consumers[0];
        assert_eq!(consumer.consume_from_where, ConsumeFromWhere::Timestamp);
        // Go hashes UTF-8 bytes; the UTF-16 hash of "é" is 233.
        assert_eq!(consumer.subscriptions[0].code_set, vec![233, 98]);
    }

    #[test]
    fn sql_subscription_has_no_tags_and_bad_bodies_fail() {
        let body = br#"{"group":"g","subscriptionData":{"topic":"T","subString":"a > 1","expressionType":"SQL92","codeSet":["5"]}}"#;
        let check = CheckClientConfigBody::parse(body).expect("parses");
        let subscription = check.subscription.expect("present");
        assert!(subscription.code_set.is_empty() && subscription.tag_filter().is_none());
        assert!(HeartbeatData::parse(b"{}").is_err());
        assert!(HeartbeatData::parse(
            br#"{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":9}]}"#
        )
        .is_err());
        assert!(HeartbeatData::parse(br#"{"clientID":"c","consumerDataSet":{}}"#).is_err());
        assert!(HeartbeatData::parse(b"[1]").is_err());
    }

    fn subscription_strategy() -> impl Strategy<Value = SubscriptionData> {
        let expression = prop_oneof![
            Just("*".to_string()),
            proptest::collection::vec("[A-Za-z0-9é_]{1,6}", 1..4).prop_map(|t| t.join(" || ")),
        ];
        (
            "[%A-Za-z0-9_]{1,12}",
            expression,
            any::<i64>(),
            any::<bool>(),
        )
            .prop_map(|(topic, expression, version, class_filter_mode)| {
                let mut subscription = SubscriptionData::new(&topic, &expression, version);
                subscription.class_filter_mode = class_filter_mode;
                subscription
            })
    }

    fn consumer_strategy() -> impl Strategy<Value = ConsumerData> {
        (
            "[A-Za-z0-9_]{1,10}",
            proptest::sample::select(ConsumeType::ALL),
            proptest::sample::select(MessageModel::ALL),
            proptest::sample::select(ConsumeFromWhere::ALL),
            any::<bool>(),
            proptest::collection::vec(subscription_strategy(), 0..4),
        )
            .prop_map(
                |(
                    group_name,
                    consume_type,
                    message_model,
                    consume_from_where,
                    unit_mode,
                    subscriptions,
                )| {
                    ConsumerData {
                        group_name,
                        consume_type,
                        message_model,
                        consume_from_where,
                        unit_mode,
                        subscriptions,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn heartbeat_round_trip(
            client_id in "\\PC{1,20}",
            producer_groups in proptest::collection::vec("\\PC{1,10}", 0..3),
            consumers in proptest::collection::vec(consumer_strategy(), 0..3),
        ) {
            let heartbeat = HeartbeatData { client_id, producer_groups, consumers };
            let parsed = HeartbeatData::parse(&heartbeat.encode());
            prop_assert_eq!(parsed.ok(), Some(heartbeat));
        }
    }
}
