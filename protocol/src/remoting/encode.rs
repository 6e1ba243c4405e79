//! The frame encoder: writes one frame with a JSON header straight into a caller-owned
//! buffer (REMOTING.md §1.2, §1.3), with no intermediate allocation.
//!
//! Emission rules, from the strictest client parser (§1.3): type byte 0; `"language":"JAVA"`,
//! `"version":479`, `"serializeTypeCurrentRPC":"JSON"`; every extFields value a JSON string;
//! no nulls; compact. Control characters are escaped as `\u00XX` (message properties carry
//! `\u0001`/`\u0002`), `"` and `\` with a backslash; all other text is written as UTF-8.
//! Key order is `code, flag, language, opaque, serializeTypeCurrentRPC, version, remark,
//! extFields`: every client parses headers by key, so the order only needs to be stable.
//!
//! Invariants: the length prefix and header-length word are patched by `finish`, and are
//! exact; an encoder dropped before `finish` truncates the buffer back to where it started,
//! so a buffer never holds half a frame; a finished frame never exceeds
//! [`FRAME_SIZE_MAX_BYTES`] (a bigger one is a caller bug and panics: bodies are bounded by
//! far smaller limits upstream).

use super::command::{FLAG_ONEWAY, FLAG_RESPONSE};
use super::frame::{
    FRAME_FIXED_PART_BYTES, FRAME_SIZE_MAX_BYTES, HEADER_SIZE_MAX_BYTES, LENGTH_PREFIX_BYTES,
};
use super::BROKER_VERSION;

/// Where the header is: `remark` may only come before the first ext entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    FixedFields,
    Remark,
    ExtFields,
}

/// Writes one frame; see the module docs for the exact layout.
#[derive(Debug)]
pub struct FrameEncoder<'o> {
    out: &'o mut Vec<u8>,
    frame_start: usize,
    section: Section,
    finished: bool,
}

impl<'o> FrameEncoder<'o> {
    /// A response (flag 1) to the request with `opaque`; appends to `out`.
    pub fn response(out: &'o mut Vec<u8>, code: i32, opaque: i32) -> Self {
        Self::start(out, code, opaque, FLAG_RESPONSE)
    }

    /// A server-initiated request (flag 0, or 2 when oneway); appends to `out`.
    pub fn request(out: &'o mut Vec<u8>, code: i32, opaque: i32, oneway: bool) -> Self {
        Self::start(out, code, opaque, if oneway { FLAG_ONEWAY } else { 0 })
    }

    fn start(out: &'o mut Vec<u8>, code: i32, opaque: i32, flag: i32) -> Self {
        let frame_start = out.len();
        // Length prefix and header-length word, patched in `finish_header`.
        out.extend_from_slice(&[0; FRAME_FIXED_PART_BYTES]);
        out.extend_from_slice(b"{\"code\":");
        write_decimal(out, i64::from(code));
        out.extend_from_slice(b",\"flag\":");
        write_decimal(out, i64::from(flag));
        out.extend_from_slice(b",\"language\":\"JAVA\",\"opaque\":");
        write_decimal(out, i64::from(opaque));
        out.extend_from_slice(b",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
        write_decimal(out, i64::from(BROKER_VERSION));
        FrameEncoder {
            out,
            frame_start,
            section: Section::FixedFields,
            finished: false,
        }
    }

    /// Sets the remark. Call at most once, before any ext entry (a misuse panics).
    pub fn remark(&mut self, remark: &str) -> &mut Self {
        assert_eq!(
            self.section,
            Section::FixedFields,
            "remark after remark or ext"
        );
        self.out.extend_from_slice(b",\"remark\":");
        write_json_string(self.out, remark);
        self.section = Section::Remark;
        self
    }

    /// Adds an extFields entry; key and value are JSON-escaped.
    pub fn ext(&mut self, key: &str, value: &str) -> &mut Self {
        self.ext_key(key);
        write_json_string(self.out, value);
        self
    }

    /// Adds an extFields entry whose value is `value` in decimal, as a JSON string (`"123"`).
    pub fn ext_i64(&mut self, key: &str, value: i64) -> &mut Self {
        self.ext_key(key);
        self.out.push(b'"');
        write_decimal(self.out, value);
        self.out.push(b'"');
        self
    }

    /// Adds an extFields entry `"true"` or `"false"` (a JSON string).
    pub fn ext_bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.ext_key(key);
        self.out
            .extend_from_slice(if value { b"\"true\"" } else { b"\"false\"" });
        self
    }

    fn ext_key(&mut self, key: &str) {
        if self.section == Section::ExtFields {
            self.out.push(b',');
        } else {
            self.out.extend_from_slice(b",\"extFields\":{");
            self.section = Section::ExtFields;
        }
        write_json_string(self.out, key);
        self.out.push(b':');
    }

    /// Closes the header and appends `body`.
    pub fn finish(mut self, body: &[u8]) {
        self.close_header(body.len());
        self.out.extend_from_slice(body);
    }

    /// Closes the header of a frame whose `body_size_bytes` bytes the caller appends to the
    /// buffer or sends after it itself (for example straight from a mapped file).
    pub fn finish_header(mut self, body_size_bytes: usize) {
        self.close_header(body_size_bytes);
    }

    fn close_header(&mut self, body_size_bytes: usize) {
        if self.section == Section::ExtFields {
            self.out.push(b'}');
        }
        self.out.push(b'}');
        let header_start = self.frame_start + FRAME_FIXED_PART_BYTES;
        let header_size_bytes = self.out.len() - header_start;
        assert!(
            header_size_bytes <= HEADER_SIZE_MAX_BYTES,
            "header exceeds 24 bits"
        );
        let frame_size_bytes = FRAME_FIXED_PART_BYTES + header_size_bytes + body_size_bytes;
        assert!(
            frame_size_bytes <= FRAME_SIZE_MAX_BYTES,
            "frame of {frame_size_bytes} bytes exceeds FRAME_SIZE_MAX_BYTES"
        );
        // Both fit in u32: FRAME_SIZE_MAX_BYTES <= i32::MAX (checked at compile time).
        let length = (frame_size_bytes - LENGTH_PREFIX_BYTES) as u32;
        let header_word = header_size_bytes as u32; // type byte 0 (JSON) in the top byte
        let prefix = &mut self.out[self.frame_start..header_start];
        prefix[..LENGTH_PREFIX_BYTES].copy_from_slice(&length.to_be_bytes());
        prefix[LENGTH_PREFIX_BYTES..].copy_from_slice(&header_word.to_be_bytes());
        self.finished = true;
    }
}

impl Drop for FrameEncoder<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.out.truncate(self.frame_start);
        }
    }
}

/// The code, flag and opaque at the head of a frame this encoder wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedHead {
    pub code: i32,
    pub flag: i32,
    pub opaque: i32,
    /// Bytes of the whole frame, length prefix included.
    pub frame_size_bytes: usize,
}

impl EncodedHead {
    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }
}

/// Reads back the head of a frame [`FrameEncoder`] wrote (`frame` starts at its length
/// prefix; the body need not be there): a server times each answer by the code and opaque
/// of what it writes, without a second path for answers. Relies on the fixed key order of
/// the module docs; None for bytes laid out otherwise.
pub fn encoded_head(frame: &[u8]) -> Option<EncodedHead> {
    let length = u32::from_be_bytes(*frame.first_chunk::<LENGTH_PREFIX_BYTES>()?);
    let mut rest = frame.get(FRAME_FIXED_PART_BYTES..)?;
    let code = head_field(&mut rest, b"{\"code\":")?;
    let flag = head_field(&mut rest, b",\"flag\":")?;
    let opaque = head_field(&mut rest, b",\"language\":\"JAVA\",\"opaque\":")?;
    Some(EncodedHead {
        code,
        flag,
        opaque,
        frame_size_bytes: length as usize + LENGTH_PREFIX_BYTES,
    })
}

/// `key` (a fixed literal: compared inline, without a call) then a decimal i32, consumed from
/// `rest`. This runs for every answer a shard writes.
fn head_field<const N: usize>(rest: &mut &[u8], key: &[u8; N]) -> Option<i32> {
    let (found, after) = rest.split_first_chunk::<N>()?;
    if found != key {
        return None;
    }
    let (negative, digits) = match after.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, after),
    };
    let mut value: i64 = 0;
    let mut count = 0;
    for digit in digits.iter().take(11) {
        if !digit.is_ascii_digit() {
            break;
        }
        value = value * 10 + i64::from(digit - b'0');
        count += 1;
    }
    *rest = &digits[count..];
    let value = if negative { -value } else { value };
    if count == 0 {
        return None;
    }
    i32::try_from(value).ok()
}

/// Writes `text` as a JSON string literal.
pub(crate) fn write_json_string(out: &mut Vec<u8>, text: &str) {
    const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    // Most values need no escape (ids, numbers, names): one pass over every byte without an
    // early exit, which the compiler vectorizes, then one copy.
    let plain = !bytes.iter().fold(false, |escape, &byte| {
        escape | (byte < 0x20) | (byte == b'"') | (byte == b'\\')
    });
    if plain {
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    out.push(b'"');
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        if byte >= 0x20 && byte != b'"' && byte != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[run_start..index]);
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            _ => out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX_DIGITS[usize::from(byte >> 4)],
                HEX_DIGITS[usize::from(byte & 0xF)],
            ]),
        }
        run_start = index + 1;
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// Writes `value` in decimal without going through `fmt`.
pub(crate) fn write_decimal(out: &mut Vec<u8>, value: i64) {
    const DIGITS_MAX: usize = 20; // u64::MAX has 20 digits
    let mut digits = [0u8; DIGITS_MAX];
    let mut magnitude = value.unsigned_abs();
    let mut start = DIGITS_MAX;
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[start..]);
}
