//! Messages as the client sees them: [`Message`] to send, [`MessageExt`] received, the
//! [`MessageQueue`] they travel through, and the byte forms the client writes or reads:
//! the properties string (REMOTING.md §5.4), the batch body (§5.5), zlib compression (§5.3),
//! the client message id `UNIQ_KEY` (§5.7) and the stored records of a PULL body (§5.1,
//! decoded by the store's own [`record::decode`], which checks sizes and BODYCRC).
//!
//! Batch body, per message (all big-endian):
//!
//! | field | size |
//! |---|---|
//! | TOTALSIZE (this record) | 4 |
//! | MAGICCODE (0) | 4 |
//! | BODYCRC (0) | 4 |
//! | FLAG | 4 |
//! | body length + body | 4 + b |
//! | properties length + properties | 2 + p |

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use shardmq_protocol::record::{self, StoredMessage};

use super::error::{ClientError, ClientResult};
use crate::body::{encode_properties, parse_properties, property, PROPERTIES_SIZE_MAX_BYTES};

pub use crate::body::MessageQueue;

pub use crate::limits::MESSAGE_BODY_MAX_BYTES;
/// Largest topic name (REMOTING.md §1.6).
pub const TOPIC_NAME_MAX_CHARS: usize = 127;
pub use crate::limits::DECOMPRESSED_BODY_MAX_BYTES;
/// Message sysFlag bit: the body is compressed (§5.2).
pub const SYS_FLAG_COMPRESSED: i32 = 0x1;
/// Message sysFlag bits 8–10: compression type (0 and 0x300 are zlib).
const SYS_FLAG_COMPRESSION_TYPE_MASK: i32 = 0x700;
const SYS_FLAG_COMPRESSION_ZLIB: i32 = 0x300;
/// Message sysFlag: transaction prepared (half message).
pub const SYS_FLAG_TRANSACTION_PREPARED: i32 = 0x4;
/// Message sysFlag: transaction commit, as END_TRANSACTION's `commitOrRollback`.
pub const SYS_FLAG_TRANSACTION_COMMIT: i32 = 0x8;
/// Message sysFlag: transaction rollback.
pub const SYS_FLAG_TRANSACTION_ROLLBACK: i32 = 0xC;
/// Prefix of a consumer group's retry topic.
pub const RETRY_TOPIC_PREFIX: &str = "%RETRY%";
/// Prefix of a consumer group's dead-letter topic.
pub const DLQ_TOPIC_PREFIX: &str = "%DLQ%";
/// Separator of the keys in the KEYS property.
pub const KEY_SEPARATOR: &str = " ";

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub topic: String,
    pub body: Vec<u8>,
    /// The user flag, stored verbatim.
    pub flag: i32,
    properties: BTreeMap<String, String>,
}

impl Message {
    /// A message for `topic` with `body`.
    ///
    /// ```
    /// use shardmq_client::Message;
    /// let message = Message::new("orders", b"hello".to_vec())
    ///     .with_tags("created")
    ///     .with_keys(["order-1"]);
    /// assert_eq!(message.tags(), Some("created"));
    /// assert_eq!(message.keys(), vec!["order-1"]);
    /// ```
    pub fn new(topic: impl Into<String>, body: impl Into<Vec<u8>>) -> Message {
        Message {
            topic: topic.into(),
            body: body.into(),
            flag: 0,
            properties: BTreeMap::new(),
        }
    }

    /// Sets the tag (the TAGS property consumers filter on).
    pub fn with_tags(mut self, tags: impl Into<String>) -> Message {
        self.set_property(property::TAGS, tags);
        self
    }

    /// Sets the business keys (KEYS, space separated), used for lookups by key.
    pub fn with_keys<I, S>(mut self, keys: I) -> Message
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_string()).collect();
        self.set_property(property::KEYS, joined.join(KEY_SEPARATOR));
        self
    }

    /// Sets the delay level (1..=18: 1 s, 5 s, 10 s, 30 s, 1 m, ...).
    pub fn with_delay_level(mut self, level: u32) -> Message {
        self.set_property(property::DELAY, level.to_string());
        self
    }

    /// Sets a user property.
    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.set_property(name, value);
        self
    }

    /// Sets the user flag.
    pub fn with_flag(mut self, flag: i32) -> Message {
        self.flag = flag;
        self
    }

    pub fn set_property(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.properties.insert(name.into(), value.into());
    }

    pub fn remove_property(&mut self, name: &str) -> Option<String> {
        self.properties.remove(name)
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    pub fn properties(&self) -> &BTreeMap<String, String> {
        &self.properties
    }

    pub fn tags(&self) -> Option<&str> {
        self.property(property::TAGS)
    }

    pub fn keys(&self) -> Vec<&str> {
        self.property(property::KEYS)
            .map(|keys| {
                keys.split(KEY_SEPARATOR)
                    .filter(|k| !k.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn delay_level(&self) -> u32 {
        self.property(property::DELAY)
            .and_then(|level| level.parse().ok())
            .unwrap_or(0)
    }

    /// The client message id (UNIQ_KEY), set when the message is sent.
    pub fn unique_id(&self) -> Option<&str> {
        self.property(property::UNIQ_KEY)
    }

    /// The properties string of §5.4.
    pub fn encode_properties(&self) -> Vec<u8> {
        let pairs: Vec<(&str, &str)> = self
            .properties
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let mut out = Vec::new();
        encode_properties(&mut out, &pairs);
        out
    }

    /// Checks topic, body and properties against the limits the broker enforces.
    pub fn validate(&self) -> ClientResult<()> {
        validate_topic(&self.topic)?;
        if self.body.is_empty() {
            return Err(ClientError::InvalidArgument("message body is empty".into()));
        }
        if self.body.len() > MESSAGE_BODY_MAX_BYTES {
            return Err(ClientError::InvalidArgument(format!(
                "message body of {} bytes exceeds {MESSAGE_BODY_MAX_BYTES}",
                self.body.len()
            )));
        }
        if self.encode_properties().len() > PROPERTIES_SIZE_MAX_BYTES {
            return Err(ClientError::InvalidArgument(format!(
                "properties exceed {PROPERTIES_SIZE_MAX_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

/// Topic names: 1..=127 characters of letters, digits, `%`, `-`, `_` and `|`.
pub fn validate_topic(topic: &str) -> ClientResult<()> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '%' | '-' | '_' | '|');
    if topic.is_empty() || topic.len() > TOPIC_NAME_MAX_CHARS || !topic.chars().all(valid_char) {
        return Err(ClientError::InvalidArgument(format!(
            "topic {topic:?} must be 1..={TOPIC_NAME_MAX_CHARS} characters of [A-Za-z0-9%_|-]"
        )));
    }
    Ok(())
}

/// A received message: what was sent plus where and when it was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageExt {
    /// Topic (the original topic for a retried message), body (decompressed), flag, properties.
    pub message: Message,
    /// The client id (UNIQ_KEY) when present, else the offset id.
    pub msg_id: String,
    /// Store host + commitlog offset, hex (§5.7).
    pub offset_msg_id: String,
    pub broker_name: String,
    pub queue_id: u32,
    pub queue_offset: i64,
    pub commit_log_offset: i64,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    /// How many times this message was consumed and sent back.
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub store_size_bytes: u32,
}

impl MessageExt {
    pub fn topic(&self) -> &str {
        &self.message.topic
    }

    pub fn body(&self) -> &[u8] {
        &self.message.body
    }

    pub fn tags(&self) -> Option<&str> {
        self.message.tags()
    }

    pub fn keys(&self) -> Vec<&str> {
        self.message.keys()
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.message.property(name)
    }

    /// The queue this message was pulled from.
    pub fn queue(&self) -> MessageQueue {
        MessageQueue {
            topic: self.message.topic.clone(),
            broker_name: self.broker_name.clone(),
            queue_id: self.queue_id,
        }
    }

    /// Decodes one stored record (a PULL body item or a CHECK_TRANSACTION_STATE body).
    pub fn from_stored(stored: &StoredMessage<'_>, broker_name: &str) -> ClientResult<MessageExt> {
        let body = if stored.sys_flag & SYS_FLAG_COMPRESSED != 0 {
            decompress(stored.body, stored.sys_flag)?
        } else {
            stored.body.to_vec()
        };
        let mut message = Message::new(stored.topic, body);
        message.flag = stored.flag;
        for (name, value) in parse_properties(stored.properties) {
            message.set_property(name, value);
        }
        let offset_msg_id = offset_msg_id(stored.store_host, stored.physical_offset);
        let msg_id = message
            .unique_id()
            .map(str::to_string)
            .unwrap_or_else(|| offset_msg_id.clone());
        Ok(MessageExt {
            message,
            msg_id,
            offset_msg_id,
            broker_name: broker_name.to_string(),
            queue_id: stored.queue_id,
            queue_offset: stored.queue_offset as i64,
            commit_log_offset: stored.physical_offset as i64,
            sys_flag: stored.sys_flag,
            born_timestamp_ms: stored.born_timestamp_ms,
            born_host: stored.born_host,
            store_timestamp_ms: stored.store_timestamp_ms,
            store_host: stored.store_host,
            reconsume_times: stored.reconsume_times,
            prepared_transaction_offset: stored.prepared_transaction_offset,
            store_size_bytes: stored.total_size,
        })
    }
}

/// Decodes a PULL body: every record, in queue order.
pub fn decode_pull_body(body: &[u8], broker_name: &str) -> ClientResult<Vec<MessageExt>> {
    let records =
        record::decode_all(body).map_err(|error| ClientError::Malformed(error.to_string()))?;
    records
        .iter()
        .map(|stored| MessageExt::from_stored(stored, broker_name))
        .collect()
}

pub use shardmq_protocol::msg_id::{offset_msg_id, parse_offset_msg_id};

/// zlib at Java's default level 5.
pub fn compress(body: &[u8], level: u32) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(
        Vec::with_capacity(body.len() / 2),
        flate2::Compression::new(level.min(9)),
    );
    // Writing into a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

/// Inflates a compressed body (zlib, compression type 0 or ZLIB), bounded in size.
pub fn decompress(body: &[u8], sys_flag: i32) -> ClientResult<Vec<u8>> {
    let kind = sys_flag & SYS_FLAG_COMPRESSION_TYPE_MASK;
    if kind != 0 && kind != SYS_FLAG_COMPRESSION_ZLIB {
        return Err(ClientError::Malformed(format!(
            "unsupported compression type {kind:#x} (only zlib)"
        )));
    }
    let mut out = Vec::with_capacity(body.len() * 2);
    let limit = DECOMPRESSED_BODY_MAX_BYTES as u64 + 1;
    flate2::read::ZlibDecoder::new(body)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|error| ClientError::Malformed(format!("bad zlib body: {error}")))?;
    if out.len() > DECOMPRESSED_BODY_MAX_BYTES {
        return Err(ClientError::Malformed(format!(
            "decompressed body exceeds {DECOMPRESSED_BODY_MAX_BYTES} bytes"
        )));
    }
    Ok(out)
}

/// The batch body of §5.5 for `messages` (each already carrying its UNIQ_KEY).
pub fn encode_batch(messages: &[Message]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        let properties = message.encode_properties();
        shardmq_protocol::batch::encode_entry(&mut out, message.flag, &message.body, &properties);
    }
    out
}

/// Generates client message ids (UNIQ_KEY, §5.7): IP · pid · a per-process random · ms since
/// the generator started · counter, 32 upper-case hex characters for IPv4.
pub struct UniqueIdGenerator {
    prefix: String,
    started_ms: u64,
    counter: AtomicU16,
}

impl UniqueIdGenerator {
    pub fn new(ip: IpAddr) -> UniqueIdGenerator {
        let ip_hex: String = match ip {
            IpAddr::V4(v4) => v4.octets().iter().map(|b| format!("{b:02X}")).collect(),
            IpAddr::V6(v6) => v6.octets().iter().map(|b| format!("{b:02X}")).collect(),
        };
        let pid = std::process::id() & 0xFFFF;
        UniqueIdGenerator {
            prefix: format!("{ip_hex}{pid:04X}{:08X}", random_u32()),
            started_ms: now_ms() as u64,
            counter: AtomicU16::new(0),
        }
    }

    pub fn next_id(&self) -> String {
        let elapsed = (now_ms() as u64).saturating_sub(self.started_ms) as u32;
        let counter = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}{elapsed:08X}{counter:04X}", self.prefix)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A non-cryptographic random number (queue start positions, ids): the std hasher's seed.
pub fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static STATE: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    let mut hasher = STATE.get_or_init(Default::default).build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_round_trips_and_bounds() {
        let body = vec![b'x'; 100_000];
        let compressed = compress(&body, 5);
        assert!(compressed.len() < body.len() / 10);
        assert_eq!(decompress(&compressed, SYS_FLAG_COMPRESSED).unwrap(), body);
        assert_eq!(
            decompress(&compressed, SYS_FLAG_COMPRESSED | 0x300).unwrap(),
            body
        );
        assert!(decompress(&compressed, SYS_FLAG_COMPRESSED | 0x100).is_err());
        assert!(decompress(b"not zlib", SYS_FLAG_COMPRESSED).is_err());
    }

    #[test]
    fn batch_encoding_matches_the_layout() {
        let messages = vec![
            Message::new("T", b"ab".to_vec())
                .with_tags("t1")
                .with_flag(7),
            Message::new("T", b"c".to_vec()),
        ];
        let body = encode_batch(&messages);
        let props = messages[0].encode_properties();
        let first = 20 + 2 + 2 + props.len();
        assert_eq!(
            i32::from_be_bytes(body[0..4].try_into().unwrap()),
            first as i32
        );
        assert_eq!(i32::from_be_bytes(body[12..16].try_into().unwrap()), 7);
        assert_eq!(i32::from_be_bytes(body[16..20].try_into().unwrap()), 2);
        assert_eq!(&body[20..22], b"ab");
        assert_eq!(body.len(), first + 20 + 1 + 2);
    }

    #[test]
    fn unique_ids_are_distinct_and_hex() {
        let generator = UniqueIdGenerator::new("127.0.0.1".parse().unwrap());
        let a = generator.next_id();
        let b = generator.next_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.starts_with("7F000001"));
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn stored_records_decode_with_properties_and_compression() {
        let body = compress(b"hello hello hello", 5);
        let mut props = Vec::new();
        encode_properties(&mut props, &[("TAGS", "A"), ("UNIQ_KEY", "ID1")]);
        let stored = StoredMessage {
            total_size: 0,
            body_crc: 0,
            queue_id: 3,
            flag: 9,
            queue_offset: 5,
            physical_offset: 1234,
            sys_flag: SYS_FLAG_COMPRESSED,
            born_timestamp_ms: 1,
            born_host: "127.0.0.1:1000".parse().unwrap(),
            store_timestamp_ms: 2,
            store_host: "127.0.0.1:10911".parse().unwrap(),
            reconsume_times: 1,
            prepared_transaction_offset: 0,
            body: &body,
            topic: "T",
            properties: &props,
        };
        let mut encoded = Vec::new();
        record::encode_into(&stored, &mut encoded);
        record::encode_into(&stored, &mut encoded);
        let messages = decode_pull_body(&encoded, "broker-0").unwrap();
        assert_eq!(messages.len(), 2);
        let message = &messages[0];
        assert_eq!(message.body(), b"hello hello hello");
        assert_eq!(message.tags(), Some("A"));
        assert_eq!(message.msg_id, "ID1");
        assert_eq!(message.queue_offset, 5);
        assert_eq!(message.queue().broker_name, "broker-0");
        assert_eq!(
            parse_offset_msg_id(&message.offset_msg_id),
            Some(("127.0.0.1:10911".parse().unwrap(), 1234))
        );
        assert!(decode_pull_body(&encoded[..encoded.len() - 1], "b").is_err());
    }

    #[test]
    fn topics_are_validated() {
        assert!(validate_topic("Good_topic-1%|x").is_ok());
        assert!(validate_topic("").is_err());
        assert!(validate_topic("bad topic").is_err());
        assert!(validate_topic(&"x".repeat(128)).is_err());
        assert!(Message::new("T", Vec::new()).validate().is_err());
    }
}
