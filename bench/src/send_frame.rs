//! SEND_MESSAGE_V2 (310) request frames, encoded once per queue id and patched in place for
//! every message (REMOTING.md §1.2, §3.2, §5.4). Pure: no I/O, no clock.
//!
//! Between two messages to the same queue only three things change: the opaque, the born
//! timestamp (`g`) and the UNIQ_KEY property. Each is written at a fixed width, so a template
//! encoded once by `FrameEncoder` stays a valid frame and a message costs one copy of the
//! template plus three small overwrites:
//!
//! | Field             | Width        | Why the width never changes                         |
//! |-------------------|--------------|-----------------------------------------------------|
//! | `opaque`          | 10 digits    | opaques run in `OPAQUE_FIRST..=i32::MAX`            |
//! | `g` bornTimestamp | 13 digits    | Unix milliseconds have 13 digits from 2001 to 2286  |
//! | UNIQ_KEY          | 32 hex chars | run (16) + connection (4) + sequence (12) hex, §5.7 |
//!
//! Header fields, as the Java producer sends them: a producer group, b topic, c "TBW102",
//! d "4", e queue id, f "0" (no sysFlag bits), g born timestamp, h "0", i properties
//! `TAGS\u{1}tag\u{2}UNIQ_KEY\u{1}id\u{2}WAIT\u{1}true\u{2}`, j "0", k "false", m "false"
//! (l is null for a normal topic, so Java omits it).
//!
//! Invariants: every patched slot lies inside the header, was found exactly once in it, and
//! has exactly its table width; the frame length prefix therefore never needs rewriting.

use anyhow::{bail, ensure};
use shardmq::protocol::PROPERTIES_SIZE_MAX_BYTES;
use shardmq::remoting::{request_code, FrameEncoder};

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
/// Java's client message ids are 16 bytes in hex (§5.7); ours have the same length.
pub const UNIQ_KEY_HEX_CHARS: usize = 32;
const UNIQ_KEY_PREFIX_HEX_CHARS: usize = 16;
const UNIQ_KEY_CONNECTION_HEX_CHARS: usize = 4;
const UNIQ_KEY_SEQUENCE_HEX_CHARS: usize = 12;
/// Connections per run: the connection index fills four hex digits of UNIQ_KEY.
pub const CONNECTIONS_MAX: usize = 1 << (4 * UNIQ_KEY_CONNECTION_HEX_CHARS);

const _: () = assert!(
    UNIQ_KEY_PREFIX_HEX_CHARS + UNIQ_KEY_CONNECTION_HEX_CHARS + UNIQ_KEY_SEQUENCE_HEX_CHARS
        == UNIQ_KEY_HEX_CHARS
);
// Every opaque in OPAQUE_FIRST..=i32::MAX has exactly OPAQUE_DIGITS digits.
const _: () = assert!(OPAQUE_FIRST as i64 == 1_000_000_000 && (i32::MAX as i64) < 10_000_000_000);

/// What stays the same in every message of a run.
#[derive(Debug, Clone)]
pub struct SendFields<'a> {
    pub producer_group: &'a str,
    pub topic: &'a str,
    pub tag: &'a str,
}

/// One queue's pre-encoded frame and where its variable slots are.
#[derive(Debug, Clone)]
pub struct SendTemplate {
    frame: Vec<u8>,
    opaque_at: usize,
    born_timestamp_at: usize,
    uniq_key_at: usize,
}

/// The per-message values patched into a template.
#[derive(Debug, Clone, Copy)]
pub struct MessageStamp<'k> {
    pub opaque: i32,
    pub born_timestamp_ms: u64,
    pub uniq_key: &'k [u8; UNIQ_KEY_HEX_CHARS],
}

impl SendTemplate {
    /// Encodes the frame for `queue_id` with `body`. Fails on a tag that would break the
    /// properties encoding or a properties string over Java's limit.
    pub fn new(fields: &SendFields<'_>, queue_id: u32, body: &[u8]) -> anyhow::Result<Self> {
        if fields.tag.is_empty() || fields.tag.chars().any(char::is_control) {
            bail!(
                "tag {:?} must be non-empty and free of control characters",
                fields.tag
            );
        }
        let properties = format!(
            "TAGS\u{1}{}\u{2}UNIQ_KEY\u{1}{}\u{2}WAIT\u{1}true\u{2}",
            fields.tag,
            "0".repeat(UNIQ_KEY_HEX_CHARS)
        );
        ensure!(
            properties.len() <= PROPERTIES_SIZE_MAX_BYTES,
            "properties of {} bytes exceed the limit of {PROPERTIES_SIZE_MAX_BYTES}",
            properties.len()
        );
        let mut frame = Vec::with_capacity(512 + properties.len() + body.len());
        let mut encoder = FrameEncoder::request(
            &mut frame,
            request_code::SEND_MESSAGE_V2,
            OPAQUE_FIRST,
            false,
        );
        encoder
            .ext("a", fields.producer_group)
            .ext("b", fields.topic)
            .ext("c", DEFAULT_TOPIC)
            .ext_i64("d", i64::from(DEFAULT_TOPIC_QUEUE_NUMS))
            .ext_i64("e", i64::from(queue_id))
            .ext("f", "0")
            .ext_i64("g", BORN_TIMESTAMP_MIN_MS as i64)
            .ext("h", "0")
            .ext("i", &properties)
            .ext("j", "0")
            .ext("k", "false")
            .ext("m", "false");
        encoder.finish(body);
        let header_end = frame.len() - body.len();
        let header = &frame[..header_end];
        let opaque_at = find_slot(header, b"\"opaque\":", OPAQUE_DIGITS)?;
        let born_timestamp_at = find_slot(header, b"\"g\":\"", BORN_TIMESTAMP_DIGITS)?;
        // The encoder escapes U+0001 as the six characters `\u0001`.
        let uniq_key_at = find_slot(header, b"UNIQ_KEY\\u0001", UNIQ_KEY_HEX_CHARS)?;
        Ok(SendTemplate {
            frame,
            opaque_at,
            born_timestamp_at,
            uniq_key_at,
        })
    }

    /// Bytes of one frame on the wire.
    pub fn frame_size_bytes(&self) -> usize {
        self.frame.len()
    }

    /// Appends one frame stamped with `stamp` to `out`.
    pub fn append(&self, out: &mut Vec<u8>, stamp: MessageStamp<'_>) {
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
        frame[self.uniq_key_at..self.uniq_key_at + UNIQ_KEY_HEX_CHARS]
            .copy_from_slice(stamp.uniq_key);
    }
}

/// The offset just after the only occurrence of `marker` in `header`, checked to be followed
/// by `width` ASCII digits.
fn find_slot(header: &[u8], marker: &[u8], width: usize) -> anyhow::Result<usize> {
    let mut found = header
        .windows(marker.len())
        .enumerate()
        .filter(|(_, window)| *window == marker)
        .map(|(at, _)| at + marker.len());
    let (Some(at), None) = (found.next(), found.next()) else {
        bail!(
            "SEND_MESSAGE_V2 template: {:?} not found exactly once",
            marker.escape_ascii()
        );
    };
    let slot = header.get(at..at + width).unwrap_or_default();
    ensure!(
        slot.len() == width && slot.iter().all(u8::is_ascii_digit),
        "SEND_MESSAGE_V2 template: slot after {:?} is not {width} digits",
        marker.escape_ascii()
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
mod tests {
    use super::*;
    use shardmq::protocol::parse_properties;
    use shardmq::remoting::decode_frame;

    fn fields() -> SendFields<'static> {
        SendFields {
            producer_group: "bench_group",
            topic: "BenchTopic",
            tag: "TagA",
        }
    }

    #[test]
    fn stamped_frame_decodes_with_every_header_field() {
        let body = vec![b'x'; 100];
        let template = SendTemplate::new(&fields(), 3, &body).unwrap();
        let mut keys = UniqKeyGenerator::new(0x0123_4567_89AB_CDEF, 7);
        let mut out = Vec::new();
        let stamp = MessageStamp {
            opaque: 1_234_567_890,
            born_timestamp_ms: 1_700_000_000_123,
            uniq_key: keys.next_key(),
        };
        template.append(&mut out, stamp);
        assert_eq!(out.len(), template.frame_size_bytes());

        let (command, consumed) = decode_frame(&out).unwrap().unwrap();
        assert_eq!(consumed, out.len());
        assert_eq!(command.code, request_code::SEND_MESSAGE_V2);
        assert_eq!(command.opaque, 1_234_567_890);
        assert!(!command.is_response() && !command.is_oneway());
        assert_eq!(command.body, &body[..]);
        let ext = &command.ext_fields;
        let expected = [
            ("a", "bench_group"),
            ("b", "BenchTopic"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "3"),
            ("f", "0"),
            ("g", "1700000000123"),
            ("h", "0"),
            ("j", "0"),
            ("k", "false"),
            ("m", "false"),
        ];
        for (key, value) in expected {
            assert_eq!(ext.get(key), Some(value), "ext {key}");
        }
        assert_eq!(
            ext.get("i"),
            Some(concat!(
                "TAGS\u{1}TagA\u{2}",
                "UNIQ_KEY\u{1}0123456789ABCDEF0007000000000000\u{2}",
                "WAIT\u{1}true\u{2}"
            ))
        );
        let properties = parse_properties(ext.get("i").unwrap().as_bytes());
        assert!(properties.iter().any(|&(k, v)| k == "WAIT" && v == "true"));
    }

    #[test]
    fn frames_appended_back_to_back_decode_in_order() {
        let template = SendTemplate::new(&fields(), 0, b"hello").unwrap();
        let mut opaques = OpaqueSequence::new();
        let mut keys = UniqKeyGenerator::new(1, 0);
        let mut out = Vec::new();
        for _ in 0..3 {
            let stamp = MessageStamp {
                opaque: opaques.next_opaque(),
                born_timestamp_ms: BORN_TIMESTAMP_MIN_MS,
                uniq_key: keys.next_key(),
            };
            template.append(&mut out, stamp);
        }
        let mut rest = &out[..];
        for index in 0..3 {
            let (command, consumed) = decode_frame(rest).unwrap().unwrap();
            assert_eq!(command.opaque, OPAQUE_FIRST + index);
            let key = format!("UNIQ_KEY\u{1}{:016X}{:04X}{:012X}\u{2}", 1, 0, index);
            assert!(command.ext_fields.get("i").unwrap().contains(&key));
            rest = &rest[consumed..];
        }
        assert!(rest.is_empty());
    }

    #[test]
    fn tag_with_separator_or_quote_is_handled() {
        assert!(SendTemplate::new(
            &SendFields {
                tag: "a\u{1}b",
                ..fields()
            },
            0,
            b"x"
        )
        .is_err());
        assert!(SendTemplate::new(
            &SendFields {
                tag: "",
                ..fields()
            },
            0,
            b"x"
        )
        .is_err());
        // A quote in the tag is escaped by the encoder and cannot fake a slot marker.
        let tag = "\"g\":\"1";
        let template = SendTemplate::new(&SendFields { tag, ..fields() }, 0, b"x").unwrap();
        let mut out = Vec::new();
        let key = [b'A'; UNIQ_KEY_HEX_CHARS];
        let stamp = MessageStamp {
            opaque: OPAQUE_FIRST,
            born_timestamp_ms: 2_000_000_000_000,
            uniq_key: &key,
        };
        template.append(&mut out, stamp);
        let (command, _) = decode_frame(&out).unwrap().unwrap();
        assert_eq!(command.ext_fields.get("g"), Some("2000000000000"));
    }

    #[test]
    fn opaque_sequence_wraps_to_ten_digits() {
        let mut opaques = OpaqueSequence { next: i32::MAX };
        assert_eq!(opaques.next_opaque(), i32::MAX);
        assert_eq!(opaques.next_opaque(), OPAQUE_FIRST);
    }

    #[test]
    fn fixed_width_writers() {
        let mut field = [0u8; 5];
        write_fixed_decimal(&mut field, 42);
        assert_eq!(&field, b"00042");
        write_fixed_hex(&mut field, 0xABCDEF);
        assert_eq!(&field, b"BCDEF");
    }

    #[test]
    #[should_panic(expected = "wider than")]
    fn fixed_decimal_overflow_is_a_bug() {
        write_fixed_decimal(&mut [0u8; 2], 100);
    }
}
