//! Send request frames, encoded once per queue id and patched in place for every request
//! (REMOTING.md §1.2, §3.2, §5.4, §5.5). Pure: no I/O, no clock.
//!
//! A single message goes as SEND_MESSAGE_V2 (310) with its properties in header `i`; a
//! batch of B messages goes as SEND_BATCH_MESSAGE (320) with `m` = "true", header `i` =
//! `WAIT\u{1}true\u{2}` and a body of B records (§5.5: TOTALSIZE, MAGICCODE 0, BODYCRC 0,
//! FLAG, body length + body, properties length + properties), each with its own properties.
//!
//! Between two requests to the same queue only these change, each written at a fixed width
//! so that a template encoded once stays a valid frame and a request costs one copy of the
//! template plus a few small overwrites:
//!
//! | Field                      | Width        | Why the width never changes                  |
//! |----------------------------|--------------|----------------------------------------------|
//! | `opaque`                   | 10 digits    | opaques run in `OPAQUE_FIRST..=i32::MAX`     |
//! | `g` bornTimestamp          | 13 digits    | Unix ms have 13 digits from 2001 to 2286     |
//! | UNIQ_KEY, per message      | 32 hex chars | run (16) + connection (4) + sequence (12)    |
//! | KEYS, per message (--keys) | 32 hex chars | the message's UNIQ_KEY, a unique business key |
//! | BENCH_SENT_US, per message | 16 digits    | Unix µs have 16 digits from 2001 to 2286     |
//!
//! BENCH_SENT_US (end-to-end mode only) is the request's intended send time in Unix
//! microseconds; the consumer subtracts it from the time of receipt.
//!
//! Header fields, as the Java producer sends them: a producer group, b topic, c "TBW102",
//! d "4", e queue id, f "0" (no sysFlag bits), g born timestamp, h "0", i properties, j "0",
//! k "false", m batch (l is null for a normal topic, so Java omits it).
//!
//! Invariants: every patched slot lies inside the frame, was found exactly once (single
//! sends) or recorded while the body was built (batches), and has exactly its table width;
//! length prefixes therefore never need rewriting.

use anyhow::{bail, ensure};
use shardmq_protocol::body::PROPERTIES_SIZE_MAX_BYTES;
use shardmq_protocol::remoting::signature::{self, Credentials};
use shardmq_protocol::remoting::{decode_frame, request_code, FrameEncoder};

/// Topic whose route and config a broker copies when it auto-creates a topic (§6.1).
pub const DEFAULT_TOPIC: &str = "TBW102";
/// Queue count asked for on auto-create; every client sends 4.
pub const DEFAULT_TOPIC_QUEUE_NUMS: u32 = 4;
/// First opaque of a connection; the smallest i32 with ten decimal digits.
pub const OPAQUE_FIRST: i32 = 1_000_000_000;
const OPAQUE_DIGITS: usize = 10;
/// Unix milliseconds have 13 digits from 2001-09-09 to 2286-11-20.
const BORN_TIMESTAMP_DIGITS: usize = 13;
pub const BORN_TIMESTAMP_MIN_MS: u64 = 1_000_000_000_000;
/// Unix microseconds have 16 digits over the same span.
const SENT_MICROS_DIGITS: usize = 16;
pub const SENT_MICROS_MIN: u64 = 1_000_000_000_000_000;
/// Property carrying a message's intended send time (end-to-end mode).
pub const SENT_MICROS_PROPERTY: &str = "BENCH_SENT_US";
/// Java's client message ids are 16 bytes in hex (§5.7); ours have the same length.
pub const UNIQ_KEY_HEX_CHARS: usize = 32;
const UNIQ_KEY_PREFIX_HEX_CHARS: usize = 16;
const UNIQ_KEY_CONNECTION_HEX_CHARS: usize = 4;
const UNIQ_KEY_SEQUENCE_HEX_CHARS: usize = 12;
/// Connections per run: the connection index fills four hex digits of UNIQ_KEY.
pub const CONNECTIONS_MAX: usize = 1 << (4 * UNIQ_KEY_CONNECTION_HEX_CHARS);
/// Messages in one batch request: far above what clients send (Java splits at 4 MiB).
pub const BATCH_MAX_MESSAGES: usize = 1024;
/// The broker's and Java producer's default `maxMessageSize`, which a batch body must
/// also respect (REMOTING.md §1.6).
pub const MESSAGE_SIZE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Fixed part of one record in a batch body: TOTALSIZE, MAGICCODE, BODYCRC, FLAG, body
/// length (4 bytes each) and properties length (2).
const BATCH_RECORD_FIXED_BYTES: usize = 4 * 5 + 2;

const _: () = assert!(
    UNIQ_KEY_PREFIX_HEX_CHARS + UNIQ_KEY_CONNECTION_HEX_CHARS + UNIQ_KEY_SEQUENCE_HEX_CHARS
        == UNIQ_KEY_HEX_CHARS
);
// Every opaque in OPAQUE_FIRST..=i32::MAX has exactly OPAQUE_DIGITS digits.
const _: () = assert!(OPAQUE_FIRST as i64 == 1_000_000_000 && (i32::MAX as i64) < 10_000_000_000);
const _: () =
    assert!(MESSAGE_SIZE_MAX_BYTES < shardmq_protocol::remoting::FRAME_SIZE_MAX_BYTES / 2);

/// What stays the same in every message of a run.
#[derive(Debug, Clone)]
pub struct SendFields<'a> {
    pub producer_group: &'a str,
    pub topic: &'a str,
    pub tag: &'a str,
    /// Give every message a KEYS property (its UNIQ_KEY).
    pub keys: bool,
    /// Stamp every message with BENCH_SENT_US (end-to-end mode).
    pub stamp_sent_time: bool,
    /// Messages per request: 1 sends SEND_MESSAGE_V2, more SEND_BATCH_MESSAGE.
    pub batch: usize,
    /// Sign every request (brokers with ACL on).
    pub credentials: Option<&'a Credentials>,
}

/// Base64 of a 20-byte HmacSHA1: always 28 characters.
const SIGNATURE_CHARS: usize = 28;

/// Where a signed template's `Signature` value is, and the key that makes it.
#[derive(Debug, Clone)]
struct Signing {
    secret_key: String,
    signature_at: usize,
}

/// Where one message's per-message slots are in the frame.
#[derive(Debug, Clone, Copy)]
struct MessageSlots {
    uniq_key_at: usize,
    keys_at: Option<usize>,
    sent_micros_at: Option<usize>,
}

/// One queue's pre-encoded frame and where its variable slots are.
#[derive(Debug, Clone)]
pub struct SendTemplate {
    frame: Vec<u8>,
    opaque_at: usize,
    born_timestamp_at: usize,
    messages: Vec<MessageSlots>,
    signing: Option<Signing>,
}

/// The per-request values patched into a template.
#[derive(Debug, Clone, Copy)]
pub struct RequestStamp {
    pub opaque: i32,
    pub born_timestamp_ms: u64,
    /// Intended send time, Unix µs (written only when the template stamps it).
    pub sent_micros: u64,
}

impl SendTemplate {
    /// Encodes the frame for `queue_id` with `fields.batch` copies of `body`. Fails on a tag
    /// that would break the properties encoding, properties over Java's limit, or a batch
    /// over the message size limit.
    pub fn new(fields: &SendFields<'_>, queue_id: u32, body: &[u8]) -> anyhow::Result<Self> {
        if fields.tag.is_empty() || fields.tag.chars().any(char::is_control) {
            bail!(
                "tag {:?} must be non-empty and free of control characters",
                fields.tag
            );
        }
        ensure!(
            (1..=BATCH_MAX_MESSAGES).contains(&fields.batch),
            "batch must be 1..={BATCH_MAX_MESSAGES} messages"
        );
        let properties = message_properties(fields);
        ensure!(
            properties.len() <= PROPERTIES_SIZE_MAX_BYTES,
            "properties of {} bytes exceed the limit of {PROPERTIES_SIZE_MAX_BYTES}",
            properties.len()
        );
        if fields.batch == 1 {
            Self::single(fields, queue_id, body, &properties)
        } else {
            Self::batch(fields, queue_id, body, &properties)
        }
    }

    fn single(
        fields: &SendFields<'_>,
        queue_id: u32,
        body: &[u8],
        properties: &str,
    ) -> anyhow::Result<Self> {
        let properties = format!("{properties}WAIT\u{1}true\u{2}");
        let mut frame = Vec::with_capacity(512 + properties.len() + body.len());
        encode_header(
            &mut frame,
            fields,
            queue_id,
            request_code::SEND_MESSAGE_V2,
            &properties,
            body,
        );
        let header = &frame[..frame.len() - body.len()];
        // The encoder escapes U+0001 as the six characters `\u0001`.
        let slots = MessageSlots {
            uniq_key_at: find_slot(header, b"UNIQ_KEY\\u0001", UNIQ_KEY_HEX_CHARS)?,
            keys_at: match fields.keys {
                true => Some(find_slot(header, b"KEYS\\u0001", UNIQ_KEY_HEX_CHARS)?),
                false => None,
            },
            sent_micros_at: match fields.stamp_sent_time {
                true => {
                    let marker = format!("{SENT_MICROS_PROPERTY}\\u0001");
                    Some(find_slot(header, marker.as_bytes(), SENT_MICROS_DIGITS)?)
                }
                false => None,
            },
        };
        Ok(SendTemplate {
            opaque_at: find_slot(header, b"\"opaque\":", OPAQUE_DIGITS)?,
            born_timestamp_at: find_slot(header, b"\"g\":\"", BORN_TIMESTAMP_DIGITS)?,
            signing: signing(fields, header)?,
            frame,
            messages: vec![slots],
        })
    }

    fn batch(
        fields: &SendFields<'_>,
        queue_id: u32,
        body: &[u8],
        properties: &str,
    ) -> anyhow::Result<Self> {
        let record_bytes = BATCH_RECORD_FIXED_BYTES + body.len() + properties.len();
        let body_bytes = record_bytes * fields.batch;
        ensure!(
            body_bytes <= MESSAGE_SIZE_MAX_BYTES,
            "a batch of {} messages is {body_bytes} bytes, over the {MESSAGE_SIZE_MAX_BYTES}-byte \
             message size limit",
            fields.batch
        );
        let mut batch_body = Vec::with_capacity(body_bytes);
        let mut body_slots = Vec::with_capacity(fields.batch);
        for _ in 0..fields.batch {
            let start = batch_body.len();
            batch_body.extend_from_slice(&(record_bytes as i32).to_be_bytes());
            batch_body.extend_from_slice(&0i32.to_be_bytes()); // MAGICCODE: clients send 0
            batch_body.extend_from_slice(&0i32.to_be_bytes()); // BODYCRC: the broker computes it
            batch_body.extend_from_slice(&0i32.to_be_bytes()); // FLAG
            batch_body.extend_from_slice(&(body.len() as i32).to_be_bytes());
            batch_body.extend_from_slice(body);
            batch_body.extend_from_slice(&(properties.len() as u16).to_be_bytes());
            let properties_at = batch_body.len();
            batch_body.extend_from_slice(properties.as_bytes());
            assert_eq!(batch_body.len() - start, record_bytes);
            let slot_in = |marker: &str, width| {
                find_slot(&batch_body[properties_at..], marker.as_bytes(), width)
                    .map(|at| at + properties_at)
            };
            body_slots.push(MessageSlots {
                uniq_key_at: slot_in("UNIQ_KEY\u{1}", UNIQ_KEY_HEX_CHARS)?,
                keys_at: match fields.keys {
                    true => Some(slot_in("KEYS\u{1}", UNIQ_KEY_HEX_CHARS)?),
                    false => None,
                },
                sent_micros_at: match fields.stamp_sent_time {
                    true => Some(slot_in(
                        &format!("{SENT_MICROS_PROPERTY}\u{1}"),
                        SENT_MICROS_DIGITS,
                    )?),
                    false => None,
                },
            });
        }
        let mut frame = Vec::with_capacity(512 + batch_body.len());
        encode_header(
            &mut frame,
            fields,
            queue_id,
            request_code::SEND_BATCH_MESSAGE,
            "WAIT\u{1}true\u{2}",
            &batch_body,
        );
        let body_at = frame.len() - batch_body.len();
        let header = &frame[..body_at];
        let messages = body_slots
            .into_iter()
            .map(|slots| MessageSlots {
                uniq_key_at: slots.uniq_key_at + body_at,
                keys_at: slots.keys_at.map(|at| at + body_at),
                sent_micros_at: slots.sent_micros_at.map(|at| at + body_at),
            })
            .collect();
        Ok(SendTemplate {
            opaque_at: find_slot(header, b"\"opaque\":", OPAQUE_DIGITS)?,
            born_timestamp_at: find_slot(header, b"\"g\":\"", BORN_TIMESTAMP_DIGITS)?,
            signing: signing(fields, header)?,
            frame,
            messages,
        })
    }

    /// Bytes of one frame on the wire.
    pub fn frame_size_bytes(&self) -> usize {
        self.frame.len()
    }

    /// Messages one request carries.
    pub fn messages_per_request(&self) -> usize {
        self.messages.len()
    }

    /// Appends one frame stamped with `stamp`, each message with the next key of `keys`.
    pub fn append(&self, out: &mut Vec<u8>, stamp: RequestStamp, keys: &mut UniqKeyGenerator) {
        assert!(
            stamp.opaque >= OPAQUE_FIRST,
            "opaque {} below OPAQUE_FIRST",
            stamp.opaque
        );
        assert!(stamp.born_timestamp_ms >= BORN_TIMESTAMP_MIN_MS);
        let start = out.len();
        out.extend_from_slice(&self.frame);
        let frame = &mut out[start..];
        write_fixed_decimal(
            &mut frame[self.opaque_at..self.opaque_at + OPAQUE_DIGITS],
            stamp.opaque as u64,
        );
        write_fixed_decimal(
            &mut frame[self.born_timestamp_at..self.born_timestamp_at + BORN_TIMESTAMP_DIGITS],
            stamp.born_timestamp_ms,
        );
        for slots in &self.messages {
            let key = keys.next_key();
            frame[slots.uniq_key_at..slots.uniq_key_at + UNIQ_KEY_HEX_CHARS].copy_from_slice(key);
            if let Some(at) = slots.keys_at {
                frame[at..at + UNIQ_KEY_HEX_CHARS].copy_from_slice(key);
            }
            if let Some(at) = slots.sent_micros_at {
                assert!(stamp.sent_micros >= SENT_MICROS_MIN);
                write_fixed_decimal(&mut frame[at..at + SENT_MICROS_DIGITS], stamp.sent_micros);
            }
        }
        if let Some(signing) = &self.signing {
            // The signature covers the patched values: decode them as the broker will.
            let value = {
                let (command, _) = decode_frame(frame)
                    .ok()
                    .flatten()
                    .expect("a template decodes");
                signature::sign(&signing.secret_key, command.ext_fields.iter(), command.body)
            };
            let at = signing.signature_at;
            frame[at..at + SIGNATURE_CHARS].copy_from_slice(value.as_bytes());
        }
    }
}

/// One message's properties with zeroed slots: TAGS, KEYS (optional), UNIQ_KEY,
/// BENCH_SENT_US (optional).
fn message_properties(fields: &SendFields<'_>) -> String {
    let zero_key = "0".repeat(UNIQ_KEY_HEX_CHARS);
    let mut properties = format!("TAGS\u{1}{}\u{2}", fields.tag);
    if fields.keys {
        properties.push_str(&format!("KEYS\u{1}{zero_key}\u{2}"));
    }
    properties.push_str(&format!("UNIQ_KEY\u{1}{zero_key}\u{2}"));
    if fields.stamp_sent_time {
        let zero_micros = "0".repeat(SENT_MICROS_DIGITS);
        properties.push_str(&format!("{SENT_MICROS_PROPERTY}\u{1}{zero_micros}\u{2}"));
    }
    properties
}

fn encode_header(
    frame: &mut Vec<u8>,
    fields: &SendFields<'_>,
    queue_id: u32,
    code: i32,
    properties: &str,
    body: &[u8],
) {
    let mut encoder = FrameEncoder::request(frame, code, OPAQUE_FIRST, false);
    encoder
        .ext("a", fields.producer_group)
        .ext("b", fields.topic)
        .ext("c", DEFAULT_TOPIC)
        .ext_i64("d", i64::from(DEFAULT_TOPIC_QUEUE_NUMS))
        .ext_i64("e", i64::from(queue_id))
        .ext("f", "0")
        .ext_i64("g", BORN_TIMESTAMP_MIN_MS as i64)
        .ext("h", "0")
        .ext("i", properties)
        .ext("j", "0")
        .ext("k", "false")
        .ext("m", if fields.batch > 1 { "true" } else { "false" });
    if let Some(credentials) = fields.credentials {
        encoder
            .ext(signature::ACCESS_KEY, &credentials.access_key)
            .ext(signature::SIGNATURE, &"A".repeat(SIGNATURE_CHARS));
    }
    encoder.finish(body);
}

/// Where the placeholder `Signature` of a signed template is (`None` unsigned).
fn signing(fields: &SendFields<'_>, header: &[u8]) -> anyhow::Result<Option<Signing>> {
    let Some(credentials) = fields.credentials else {
        return Ok(None);
    };
    let marker = format!("\"{}\":\"", signature::SIGNATURE);
    let at = header
        .windows(marker.len())
        .position(|window| window == marker.as_bytes())
        .map(|at| at + marker.len())
        .ok_or_else(|| anyhow::anyhow!("send template: no Signature slot"))?;
    Ok(Some(Signing {
        secret_key: credentials.secret_key.clone(),
        signature_at: at,
    }))
}

/// The offset just after the only occurrence of `marker` in `haystack`, checked to be
/// followed by `width` ASCII digits.
fn find_slot(haystack: &[u8], marker: &[u8], width: usize) -> anyhow::Result<usize> {
    let mut found = haystack
        .windows(marker.len())
        .enumerate()
        .filter(|(_, window)| *window == marker)
        .map(|(at, _)| at + marker.len());
    let (Some(at), None) = (found.next(), found.next()) else {
        bail!(
            "send template: {:?} not found exactly once",
            marker.escape_ascii().to_string()
        );
    };
    let slot = haystack.get(at..at + width).unwrap_or_default();
    ensure!(
        slot.len() == width && slot.iter().all(u8::is_ascii_digit),
        "send template: slot after {:?} is not {width} digits",
        marker.escape_ascii().to_string()
    );
    Ok(at)
}

/// Writes `value` in decimal filling `field` exactly, with leading zeros (a bug if it does
/// not fit).
fn write_fixed_decimal(field: &mut [u8], mut value: u64) {
    for byte in field.iter_mut().rev() {
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
    assert_eq!(value, 0, "value wider than its {}-digit slot", field.len());
}

/// Writes `value` in upper-case hex filling `field` exactly; higher bits are dropped on
/// purpose (sequence numbers wrap).
fn write_fixed_hex(field: &mut [u8], mut value: u64) {
    const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for byte in field.iter_mut().rev() {
        *byte = HEX_DIGITS[(value & 0xF) as usize];
        value >>= 4;
    }
}

/// Opaques of one connection: `OPAQUE_FIRST..=i32::MAX`, then around again. The span (over a
/// billion) dwarfs any in-flight window, so a live opaque is never reused.
#[derive(Debug)]
pub struct OpaqueSequence {
    next: i32,
}

impl OpaqueSequence {
    pub fn new() -> Self {
        OpaqueSequence { next: OPAQUE_FIRST }
    }

    pub fn next_opaque(&mut self) -> i32 {
        let opaque = self.next;
        self.next = if opaque == i32::MAX {
            OPAQUE_FIRST
        } else {
            opaque + 1
        };
        opaque
    }
}

/// UNIQ_KEY values of one connection: a run prefix shared by the process, the connection
/// index, and a per-connection sequence, so keys are unique across connections and runs.
#[derive(Debug)]
pub struct UniqKeyGenerator {
    key: [u8; UNIQ_KEY_HEX_CHARS],
    sequence: u64,
}

impl UniqKeyGenerator {
    /// `run_prefix` should differ between runs (process id and start time, say).
    pub fn new(run_prefix: u64, connection_index: usize) -> Self {
        assert!(
            connection_index < CONNECTIONS_MAX,
            "connection index beyond UNIQ_KEY room"
        );
        let mut key = [b'0'; UNIQ_KEY_HEX_CHARS];
        let (prefix, rest) = key.split_at_mut(UNIQ_KEY_PREFIX_HEX_CHARS);
        write_fixed_hex(prefix, run_prefix);
        write_fixed_hex(
            &mut rest[..UNIQ_KEY_CONNECTION_HEX_CHARS],
            connection_index as u64,
        );
        UniqKeyGenerator { key, sequence: 0 }
    }

    /// The next key; valid until the next call.
    pub fn next_key(&mut self) -> &[u8; UNIQ_KEY_HEX_CHARS] {
        let sequence_at = UNIQ_KEY_HEX_CHARS - UNIQ_KEY_SEQUENCE_HEX_CHARS;
        write_fixed_hex(&mut self.key[sequence_at..], self.sequence);
        self.sequence = self.sequence.wrapping_add(1);
        &self.key
    }
}

#[cfg(test)]
mod tests;
