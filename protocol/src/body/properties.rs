//! The message properties string (REMOTING.md §5.4) and the well-known property keys.
//!
//! Layout: `name 0x01 value 0x02` repeated, UTF-8, at most [`PROPERTIES_SIZE_MAX_BYTES`].
//!
//! | bytes | meaning |
//! |---|---|
//! | name | UTF-8, no 0x01/0x02 |
//! | 0x01 | name/value separator |
//! | value | UTF-8, no 0x01/0x02 |
//! | 0x02 | pair terminator (the last one may be missing) |
//!
//! Reading follows Java: pairs with an empty name or value are skipped; so are pairs without a
//! separator or that are not UTF-8. Order is not significant.

pub use crate::limits::PROPERTIES_SIZE_MAX_BYTES;

const NAME_VALUE_SEPARATOR: u8 = 0x01;
const PROPERTY_SEPARATOR: u8 = 0x02;

/// Splits a properties string into `(name, value)` pairs, in wire order.
pub fn parse_properties(props: &[u8]) -> Vec<(&str, &str)> {
    props
        .split(|b| *b == PROPERTY_SEPARATOR)
        .filter_map(parse_pair)
        .collect()
}

fn parse_pair(pair: &[u8]) -> Option<(&str, &str)> {
    let separator = pair.iter().position(|b| *b == NAME_VALUE_SEPARATOR)?;
    let name = std::str::from_utf8(&pair[..separator]).ok()?;
    let value = std::str::from_utf8(&pair[separator + 1..]).ok()?;
    (!name.is_empty() && !value.is_empty()).then_some((name, value))
}

/// The value of property `name`, if present (the last occurrence wins, like Java's map).
pub fn find_property<'a>(props: &'a [u8], name: &str) -> Option<&'a str> {
    props
        .split(|b| *b == PROPERTY_SEPARATOR)
        .rev()
        .filter_map(parse_pair)
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Appends `pairs` to `out`, each terminated by 0x02. Pairs that could not be read back
/// (empty name or value, or a separator byte inside) are skipped rather than corrupting the
/// rest of the string.
pub fn encode_properties(out: &mut Vec<u8>, pairs: &[(&str, &str)]) {
    let writable = |text: &str| {
        !text.is_empty()
            && !text
                .bytes()
                .any(|b| b == NAME_VALUE_SEPARATOR || b == PROPERTY_SEPARATOR)
    };
    for (name, value) in pairs
        .iter()
        .filter(|(name, value)| writable(name) && writable(value))
    {
        out.extend_from_slice(name.as_bytes());
        out.push(NAME_VALUE_SEPARATOR);
        out.extend_from_slice(value.as_bytes());
        out.push(PROPERTY_SEPARATOR);
    }
}

/// Property keys (Java `MessageConst.PROPERTY_*` values).
pub mod property {
    pub const TAGS: &str = "TAGS";
    pub const KEYS: &str = "KEYS";
    pub const WAIT: &str = "WAIT";
    pub const DELAY: &str = "DELAY";
    pub const UNIQ_KEY: &str = "UNIQ_KEY";
    pub const RETRY_TOPIC: &str = "RETRY_TOPIC";
    pub const REAL_TOPIC: &str = "REAL_TOPIC";
    pub const REAL_QID: &str = "REAL_QID";
    pub const TRAN_MSG: &str = "TRAN_MSG";
    pub const PGROUP: &str = "PGROUP";
    pub const TRANSACTION_CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
    pub const CHECK_IMMUNITY_TIME_IN_SECONDS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";
    pub const TRAN_PREPARED_QUEUE_OFFSET: &str = "TRAN_PREPARED_QUEUE_OFFSET";
    pub const TRANSACTION_ID: &str = "__transactionId__";
    pub const MIN_OFFSET: &str = "MIN_OFFSET";
    pub const MAX_OFFSET: &str = "MAX_OFFSET";
    pub const CONSUME_START_TIME: &str = "CONSUME_START_TIME";
    pub const RECONSUME_TIME: &str = "RECONSUME_TIME";
    pub const MAX_RECONSUME_TIMES: &str = "MAX_RECONSUME_TIMES";
    pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
    pub const DLQ_ORIGIN_TOPIC: &str = "DLQ_ORIGIN_TOPIC";
    pub const DLQ_ORIGIN_MESSAGE_ID: &str = "DLQ_ORIGIN_MESSAGE_ID";
    pub const MSG_REGION: &str = "MSG_REGION";
    pub const TRACE_ON: &str = "TRACE_ON";
    pub const CLUSTER: &str = "CLUSTER";
    pub const INSTANCE_ID: &str = "INSTANCE_ID";
    pub const CORRELATION_ID: &str = "CORRELATION_ID";
    pub const REPLY_TO_CLIENT: &str = "REPLY_TO_CLIENT";
    pub const TTL: &str = "TTL";
    pub const ARRIVE_TIME: &str = "ARRIVE_TIME";
    pub const PUSH_REPLY_TIME: &str = "PUSH_REPLY_TIME";
    /// Value `"reply"` for request-reply responses.
    pub const MSG_TYPE: &str = "MSG_TYPE";
    pub const TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
    pub const TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
    pub const TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
    pub const TIMER_OUT_MS: &str = "TIMER_OUT_MS";
    pub const SHARDING_KEY: &str = "__SHARDINGKEY";
    pub const INNER_NUM: &str = "INNER_NUM";
    pub const INNER_BASE: &str = "INNER_BASE";
    pub const POP_CK: &str = "POP_CK";
    pub const POP_CK_OFFSET: &str = "POP_CK_OFFSET";
    pub const FIRST_POP_TIME: &str = "1ST_POP_TIME";
    pub const BUYER_ID: &str = "BUYER_ID";
    pub const TRANSFER_FLAG: &str = "TRANSFER_FLAG";
    pub const CORRECTION_FLAG: &str = "CORRECTION_FLAG";
    pub const MQ2_FLAG: &str = "MQ2_FLAG";
    pub const EXTEND_UNIQ_INFO: &str = "EXTEND_UNIQ_INFO";
    pub const DUP_INFO: &str = "DUP_INFO";
    pub const BORN_HOST: &str = "__BORNHOST";
    pub const BORN_TIMESTAMP: &str = "BORN_TIMESTAMP";
    pub const CRC32: &str = "__CRC32#";
    /// ali-ons/Aliyun absolute deliver time; not implemented by open-source brokers.
    pub const START_DELIVER_TIME: &str = "__STARTDELIVERTIME";
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_tolerates_java_and_cpp_shapes() {
        let props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02\x01empty\x02E\x01\x02noSep\x02WAIT\x01true";
        assert_eq!(
            parse_properties(props),
            vec![("TAGS", "TagA"), ("KEYS", "k1 k2"), ("WAIT", "true")]
        );
        assert_eq!(find_property(props, property::WAIT), Some("true"));
        assert_eq!(find_property(props, property::DELAY), None);
        assert_eq!(
            parse_properties(b"A\x01\xff\x02B\x01b\x02"),
            vec![("B", "b")]
        );
        assert!(parse_properties(b"").is_empty());
        assert_eq!(find_property(b"A\x01x\x02A\x01y\x02", "A"), Some("y"));
    }

    #[test]
    fn encode_skips_unreadable_pairs() {
        let mut out = Vec::new();
        encode_properties(
            &mut out,
            &[
                ("TAGS", "TagA"),
                ("", "x"),
                ("K", ""),
                ("B", "a\x02b"),
                ("UNIQ_KEY", "id"),
            ],
        );
        assert_eq!(out, b"TAGS\x01TagA\x02UNIQ_KEY\x01id\x02");
    }

    proptest! {
        #[test]
        fn properties_round_trip(pairs in proptest::collection::vec(("[^\\x01\\x02]{1,8}", "[^\\x01\\x02]{1,8}"), 0..8)) {
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let mut out = Vec::new();
            encode_properties(&mut out, &pairs);
            prop_assert_eq!(parse_properties(&out), pairs.clone());
            // The trailing separator is optional on read.
            out.pop();
            prop_assert_eq!(parse_properties(&out), pairs);
        }
    }
}
