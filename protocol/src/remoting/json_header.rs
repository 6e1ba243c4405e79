//! The JSON header decoder (REMOTING.md §1.3): a hand-written scanner over the header bytes
//! that fills a [`RemotingCommand`] without building a JSON tree.
//!
//! This is the hottest code in the broker (every SEND header passes here), so strings are
//! borrowed from the input and only unescaped into an owned `String` when the wire form has
//! a backslash. The header is checked to be UTF-8 once, up front; every slice boundary after
//! that sits next to an ASCII byte, so slices are always on char boundaries.
//!
//! Accepted like Java's fastjson reads it: unknown top-level keys ignored, whitespace and
//! C++'s trailing `\n` tolerated, `remark`/`extFields`/`language` absent or null, integers
//! also as strings, any `language` name (unknown → `OTHER`), `serializeTypeCurrentRPC`
//! ignored. Ext values that are numbers keep their text, booleans become `"true"`/`"false"`,
//! null drops the entry, objects and arrays keep their raw JSON text. A lone UTF-16
//! surrogate in a `\u` escape becomes U+FFFD. Raw control bytes inside strings are accepted.
//!
//! Invariants: every loop advances `pos` or returns; nesting is bounded by
//! [`JSON_NESTING_DEPTH_MAX`]; entries by [`EXT_FIELDS_COUNT_MAX`]; malformed input is an
//! error, never a panic.

use std::borrow::Cow;

use super::command::{
    leading_decimal, ExtFields, LanguageCode, RemotingCommand, SerializeType, Text,
};
use super::EXT_FIELDS_COUNT_MAX;
use crate::error::DecodeError;

pub use crate::limits::JSON_NESTING_DEPTH_MAX;
/// Typical SEND headers carry 11–15 ext entries; one allocation covers them.
const EXT_FIELDS_CAPACITY_INITIAL: usize = 16;

/// Decodes a JSON header; `body` is attached to the command as is.
pub(crate) fn decode<'a>(
    header: &'a [u8],
    body: &'a [u8],
) -> Result<RemotingCommand<'a>, DecodeError> {
    let text = std::str::from_utf8(header).map_err(|error| DecodeError::JsonHeaderNotUtf8 {
        at: error.valid_up_to(),
    })?;
    let mut scanner = Scanner {
        text,
        pos: 0,
        fault: "",
    };
    let mut command = RemotingCommand {
        code: 0,
        language: LanguageCode::Java,
        version: 0,
        opaque: 0,
        flag: 0,
        remark: None,
        ext_fields: ExtFields::new(),
        body,
        serialize_type: SerializeType::Json,
    };
    scanner.header_object(&mut command)?;
    scanner.skip_whitespace();
    if scanner.pos != text.len() {
        return Err(scanner.error("trailing bytes after the header object"));
    }
    Ok(command)
}

struct Scanner<'a> {
    text: &'a str,
    pos: usize,
    /// Why the last [`Scanner::raw_string`] returned `None` (its position is `pos`).
    fault: &'static str,
}

/// A string's text between its quotes, found without decoding it: small enough to come back
/// in registers (header strings are found by the dozen per SEND).
#[derive(Debug, Clone, Copy)]
struct RawString {
    start: u32,
    end: u32,
    escaped: bool,
}

impl<'a> Scanner<'a> {
    fn error(&self, reason: &'static str) -> DecodeError {
        DecodeError::MalformedJsonHeader {
            reason,
            at: self.pos,
        }
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    #[inline(always)]
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    #[inline(always)]
    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), DecodeError> {
        self.skip_whitespace();
        if self.peek() != Some(byte) {
            return Err(self.error(reason));
        }
        self.pos += 1;
        Ok(())
    }

    #[inline(always)]
    fn slice(&self, start: usize, end: usize) -> Result<&'a str, DecodeError> {
        self.text
            .get(start..end)
            .ok_or(self.error("slice off a char boundary"))
    }

    /// Walks `{ "key": value, ... }`, calling `on_member` with each key as found (not
    /// unescaped: see [`Scanner::key_text`]) and the scanner positioned at its value
    /// (whitespace skipped); `on_member` must consume exactly that value.
    #[inline(always)]
    fn members<F>(&mut self, mut on_member: F) -> Result<(), DecodeError>
    where
        F: FnMut(&mut Self, RawString) -> Result<(), DecodeError>,
    {
        if self.object_is_empty()? {
            return Ok(());
        }
        loop {
            let key = self.member_key()?;
            self.expect(b':', "expected ':' after an object key")?;
            self.skip_whitespace();
            on_member(self, key)?;
            if self.object_ends()? {
                return Ok(());
            }
        }
    }

    /// With `pos` at an object: moves past its `{`, and past its `}` too when it is empty
    /// (true).
    #[inline(always)]
    fn object_is_empty(&mut self) -> Result<bool, DecodeError> {
        self.expect(b'{', "expected '{'")?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// The key of an object's next member, found (not unescaped) and moved past.
    #[inline(always)]
    fn member_key(&mut self) -> Result<RawString, DecodeError> {
        self.skip_whitespace();
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a string"));
        }
        match self.raw_string() {
            Some(key) => Ok(key),
            None => Err(self.error(self.fault)),
        }
    }

    /// After an object's member: moves past the `,` before the next one, or past the
    /// object's `}` (true).
    #[inline(always)]
    fn object_ends(&mut self) -> Result<bool, DecodeError> {
        self.skip_whitespace();
        match self.peek() {
            Some(b',') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b'}') => {
                self.pos += 1;
                Ok(true)
            }
            _ => Err(self.error("expected ',' or '}' in an object")),
        }
    }

    /// The text of a key that [`Scanner::members`] found; `pos` is left where it was.
    fn key_text(&mut self, key: RawString) -> Result<Cow<'a, str>, DecodeError> {
        if !key.escaped {
            return self.borrowed(key).map(Cow::Borrowed);
        }
        let at = self.pos;
        let text = self.unescape(key)?;
        self.pos = at;
        Ok(Cow::Owned(text))
    }

    /// The text of a string without escapes, as it is in the header.
    #[inline(always)]
    fn borrowed(&self, raw: RawString) -> Result<&'a str, DecodeError> {
        self.slice(raw.start as usize, raw.end as usize)
    }

    /// The header object. Its members are told apart by their key's bytes as they are on
    /// the wire: a key with an escape (no client writes one) is unescaped first.
    fn header_object(&mut self, command: &mut RemotingCommand<'a>) -> Result<(), DecodeError> {
        self.members(|scanner, key| {
            if key.escaped {
                let key = scanner.key_text(key)?;
                scanner.header_member(key.as_bytes(), command)
            } else {
                // Matched as the header's bytes: through `key_text` (a `Cow` and a char
                // boundary check a key) a header took ~290 more instructions.
                let bytes: &'a [u8] = scanner.text.as_bytes();
                scanner.header_member(&bytes[key.start as usize..key.end as usize], command)
            }
        })
    }

    /// With `pos` at the value of the header member `key`: reads it into `command`.
    #[inline(always)]
    fn header_member(
        &mut self,
        key: &[u8],
        command: &mut RemotingCommand<'a>,
    ) -> Result<(), DecodeError> {
        match key {
            b"code" => set_if_present(&mut command.code, self.integer()?),
            b"opaque" => set_if_present(&mut command.opaque, self.integer()?),
            b"flag" => set_if_present(&mut command.flag, self.integer()?),
            b"version" => set_if_present(&mut command.version, self.integer()?),
            b"language" => {
                if let Some(name) = self.string_or_null("language must be a string")? {
                    command.language = LanguageCode::from_name(&name);
                }
            }
            b"remark" => command.remark = self.string_or_null("remark must be a string")?,
            b"extFields" => command.ext_fields = self.ext_fields()?,
            _ => self.skip_value(2)?,
        }
        Ok(())
    }

    /// An i32 written as a JSON number or a numeric string; `None` for null.
    fn integer(&mut self) -> Result<Option<i32>, DecodeError> {
        let start = self.pos;
        if let Some(value) = self.plain_integer() {
            return Ok(Some(value));
        }
        let text: Cow<'a, str> = match self.peek() {
            Some(b'-' | b'0'..=b'9') => Cow::Borrowed(self.number()?),
            Some(b'"') => self.string()?,
            Some(b'n') => {
                self.literal("null")?;
                return Ok(None);
            }
            _ => return Err(self.error("expected an integer")),
        };
        text.parse()
            .map(Some)
            .map_err(|_| DecodeError::MalformedJsonHeader {
                reason: "integer field is not an i32",
                at: start,
            })
    }

    /// The common form of an integer member, read without slicing: `-?[0-9]{1,10}` in
    /// i32's range, not followed by a fraction or an exponent. `None` for anything else,
    /// which [`Scanner::integer`] then reads from `pos` as before.
    #[inline(always)]
    fn plain_integer(&mut self) -> Option<i32> {
        let rest = self.text.as_bytes().get(self.pos..)?;
        let (number, length) = leading_decimal(rest, 10)?;
        if matches!(rest.get(length), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let value = i32::try_from(number).ok()?;
        self.pos += length;
        Some(value)
    }

    fn string_or_null(
        &mut self,
        reason: &'static str,
    ) -> Result<Option<Cow<'a, str>>, DecodeError> {
        match self.peek() {
            Some(b'"') => self.string().map(Some),
            Some(b'n') => self.literal("null").map(|_| None),
            _ => Err(self.error(reason)),
        }
    }

    fn ext_fields(&mut self) -> Result<ExtFields<'a>, DecodeError> {
        if self.peek() == Some(b'n') {
            self.literal("null")?;
            return Ok(ExtFields::new());
        }
        // The walk of `members`, written out: a closure that pushes to `fields` kept the
        // fields in memory across each entry (400 more instructions a SEND header).
        let mut fields = ExtFields::with_capacity(EXT_FIELDS_CAPACITY_INITIAL);
        if self.object_is_empty()? {
            return Ok(fields);
        }
        loop {
            let key = self.member_key()?;
            let key = self.ext_text(&mut fields, key)?;
            self.expect(b':', "expected ':' after an object key")?;
            self.skip_whitespace();
            match self.ext_value(&mut fields)? {
                Some(value) => {
                    if fields.len() == EXT_FIELDS_COUNT_MAX {
                        return Err(DecodeError::TooManyExtFields {
                            limit: EXT_FIELDS_COUNT_MAX,
                        });
                    }
                    fields.push_text(key, value);
                }
                None => fields.forget_decoded(key),
            }
            if self.object_ends()? {
                return Ok(fields);
            }
        }
    }

    /// One extFields value as text; `None` for null (the entry is dropped).
    #[inline(always)]
    fn ext_value(&mut self, fields: &mut ExtFields<'a>) -> Result<Option<Text<'a>>, DecodeError> {
        let start = self.pos;
        let value = match self.peek() {
            Some(b'"') => {
                let Some(raw) = self.raw_string() else {
                    return Err(self.error(self.fault));
                };
                self.ext_text(fields, raw)?
            }
            Some(b'-' | b'0'..=b'9') => Text::Frame(self.number()?),
            Some(b't') => Text::Frame(self.literal("true")?),
            Some(b'f') => Text::Frame(self.literal("false")?),
            Some(b'n') => {
                self.literal("null")?;
                return Ok(None);
            }
            Some(b'{' | b'[') => {
                self.skip_value(3)?;
                Text::Frame(self.slice(start, self.pos)?)
            }
            _ => return Err(self.error("expected an extFields value")),
        };
        Ok(Some(value))
    }

    /// A string of the extFields as found by [`Scanner::raw_string`]: a slice of the header,
    /// or unescaped into `fields`; `pos` is left where it was.
    #[inline(always)]
    fn ext_text(
        &mut self,
        fields: &mut ExtFields<'a>,
        raw: RawString,
    ) -> Result<Text<'a>, DecodeError> {
        if !raw.escaped {
            return self.borrowed(raw).map(Text::Frame);
        }
        let at = self.pos;
        self.pos = raw.start as usize;
        let mut unescaped = Ok(());
        let length_hint = (raw.end - raw.start) as usize;
        let text = fields.decode_with(length_hint, |out| unescaped = self.unescape_rest(out));
        unescaped?;
        debug_assert_eq!(
            self.pos,
            raw.end as usize + 1,
            "unescaping ends at the closing quote"
        );
        self.pos = at;
        Ok(text)
    }

    fn literal(&mut self, word: &'static str) -> Result<&'a str, DecodeError> {
        let end = self.pos + word.len();
        if self.text.as_bytes().get(self.pos..end) != Some(word.as_bytes()) {
            return Err(self.error("invalid literal"));
        }
        self.pos = end;
        Ok(word)
    }

    /// `-? digits (. digits)? ([eE] [+-]? digits)?`, returned as its text.
    fn number(&mut self) -> Result<&'a str, DecodeError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        self.digits()?;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.digits()?;
        }
        self.slice(start, self.pos)
    }

    fn digits(&mut self) -> Result<(), DecodeError> {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a digit"));
        }
        Ok(())
    }

    /// A string starting at `"`: borrowed when it has no escapes.
    #[inline(always)]
    fn string(&mut self) -> Result<Cow<'a, str>, DecodeError> {
        if self.peek() != Some(b'"') {
            return Err(self.error("expected a string"));
        }
        let Some(raw) = self.raw_string() else {
            return Err(self.error(self.fault));
        };
        if raw.escaped {
            return self.unescape(raw).map(Cow::Owned);
        }
        Ok(Cow::Borrowed(
            self.slice(raw.start as usize, raw.end as usize)?,
        ))
    }

    /// With `pos` at an opening quote: moves past the closing one and returns the text
    /// between. Escapes are only stepped over here (their backslash and the ASCII byte after
    /// it); [`Scanner::unescape`] decodes and checks them. `None` with `fault` set when the
    /// string or an escape never ends, or an escape is not ASCII.
    #[inline(always)]
    fn raw_string(&mut self) -> Option<RawString> {
        let bytes = self.text.as_bytes();
        let start = self.pos + 1;
        let mut at = start;
        let mut escaped = false;
        loop {
            let Some(stop) = find_quote_or_backslash(bytes, at) else {
                self.pos = at;
                self.fault = "unterminated string";
                return None;
            };
            if bytes[stop] == b'"' {
                self.pos = stop + 1;
                // Headers are under 16 MiB (checked before decoding), so offsets fit in u32.
                return Some(RawString {
                    start: start as u32,
                    end: stop as u32,
                    escaped,
                });
            }
            escaped = true;
            match bytes.get(stop + 1) {
                Some(byte) if byte.is_ascii() => at = stop + 2,
                Some(_) => {
                    self.pos = stop + 1;
                    self.fault = "invalid escape";
                    return None;
                }
                None => {
                    self.pos = stop + 1;
                    self.fault = "unterminated escape";
                    return None;
                }
            }
        }
    }

    /// Decodes a string with escapes that [`Scanner::raw_string`] found; `pos` ends up just
    /// past its closing quote again.
    #[inline(never)]
    fn unescape(&mut self, raw: RawString) -> Result<String, DecodeError> {
        let (start, end) = (raw.start as usize, raw.end as usize);
        let mut owned = String::with_capacity(end - start + 16);
        self.pos = start;
        self.unescape_rest(&mut owned)?;
        debug_assert_eq!(self.pos, end + 1, "unescaping ends at the closing quote");
        Ok(owned)
    }

    /// Index of the next `"` or `\` at or after `pos`; an error when the string never ends.
    fn find_quote_or_backslash(&self) -> Result<usize, DecodeError> {
        find_quote_or_backslash(self.text.as_bytes(), self.pos).ok_or(
            DecodeError::MalformedJsonHeader {
                reason: "unterminated string",
                at: self.pos,
            },
        )
    }

    /// With `pos` at a backslash inside a string: decodes up to and past the closing quote.
    fn unescape_rest(&mut self, owned: &mut String) -> Result<(), DecodeError> {
        loop {
            let end = self.find_quote_or_backslash()?;
            owned.push_str(self.slice(self.pos, end)?);
            self.pos = end + 1;
            let bytes = self.text.as_bytes();
            if bytes[end] == b'"' {
                return Ok(());
            }
            // `\u0001` and `\u0002`, the separators of every message's properties, and any
            // other ASCII byte written as `\u00XX`, without the general escape's steps.
            if let Some(&[b'u', b'0', b'0', high, low]) = bytes.get(self.pos..self.pos + 5) {
                if let (Some(high @ 0..=7), Some(low)) = (hex_digit(high), hex_digit(low)) {
                    owned.push(char::from(high << 4 | low));
                    self.pos += 5;
                    continue;
                }
            }
            self.escape(owned)?;
        }
    }

    /// With `pos` just after a backslash: decodes one escape.
    fn escape(&mut self, owned: &mut String) -> Result<(), DecodeError> {
        let Some(byte) = self.peek() else {
            return Err(self.error("unterminated escape"));
        };
        self.pos += 1;
        let decoded = match byte {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => self.unicode_escape()?,
            _ => {
                self.pos -= 1;
                return Err(self.error("invalid escape"));
            }
        };
        owned.push(decoded);
        Ok(())
    }

    /// With `pos` after `\u`: four hex digits, joined with a following `\uDC00`–`\uDFFF`
    /// when they are a high surrogate.
    fn unicode_escape(&mut self) -> Result<char, DecodeError> {
        let unit = self.hex4()?;
        if !(0xD800..0xDC00).contains(&unit) {
            return Ok(char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER));
        }
        let bytes = self.text.as_bytes();
        if bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
            return Ok(char::REPLACEMENT_CHARACTER);
        }
        let saved = self.pos;
        self.pos += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            self.pos = saved;
            return Ok(char::REPLACEMENT_CHARACTER);
        }
        let combined = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        Ok(char::from_u32(combined).unwrap_or(char::REPLACEMENT_CHARACTER))
    }

    fn hex4(&mut self) -> Result<u32, DecodeError> {
        let Some(digits) = self.text.as_bytes().get(self.pos..self.pos + 4) else {
            return Err(self.error("truncated \\u escape"));
        };
        let mut unit = 0u32;
        for &digit in digits {
            let Some(value) = hex_digit(digit) else {
                return Err(self.error("invalid hex digit in \\u escape"));
            };
            unit = unit << 4 | u32::from(value);
        }
        self.pos += 4;
        Ok(unit)
    }

    /// Skips any JSON value; `depth` counts the containers around it, plus one (a member of
    /// the header object is at depth 2).
    fn skip_value(&mut self, depth: usize) -> Result<(), DecodeError> {
        if depth > JSON_NESTING_DEPTH_MAX {
            return Err(self.error("nesting deeper than JSON_NESTING_DEPTH_MAX"));
        }
        match self.peek() {
            Some(b'"') => self.skip_string(),
            Some(b'{') => self.members(|scanner, _key| scanner.skip_value(depth + 1)),
            Some(b'[') => self.skip_array(depth),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            Some(b't') => self.literal("true").map(drop),
            Some(b'f') => self.literal("false").map(drop),
            Some(b'n') => self.literal("null").map(drop),
            _ => Err(self.error("expected a JSON value")),
        }
    }

    fn skip_array(&mut self, depth: usize) -> Result<(), DecodeError> {
        self.expect(b'[', "expected '['")?;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.skip_value(depth + 1)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(self.error("expected ',' or ']' in an array")),
            }
        }
    }

    /// Skips a string without decoding it (escapes are checked only for their backslash).
    fn skip_string(&mut self) -> Result<(), DecodeError> {
        match self.raw_string() {
            Some(_) => Ok(()),
            None => Err(self.error(self.fault)),
        }
    }
}

/// The value of one hex digit.
#[inline(always)]
fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Index of the next `"` or `\` at or after `from`.
///
/// Most header strings are short (V2 keys are one letter), where a SIMD search costs more to
/// set up than it saves; they are scanned eight bytes at a time in a `u64` (SWAR: a byte
/// equal to the target becomes zero, and the borrow trick flags the lowest zero byte of a
/// word exactly). Past `SWAR_SCAN_BYTES` without a stop (long properties) memchr goes on.
#[inline(always)]
fn find_quote_or_backslash(bytes: &[u8], from: usize) -> Option<usize> {
    const SWAR_SCAN_BYTES: usize = 64;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let (quote, backslash) = (word ^ QUOTES, word ^ BACKSLASHES);
        let zero_bytes = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash))
            & HIGHS;
        if zero_bytes != 0 {
            return Some(at + (zero_bytes.trailing_zeros() / 8) as usize);
        }
        at += 8;
        if at - from >= SWAR_SCAN_BYTES {
            let rest = bytes.get(at..)?;
            return memchr::memchr2(b'"', b'\\', rest).map(|offset| at + offset);
        }
    }
    let rest = bytes.get(at..)?;
    rest.iter()
        .position(|&byte| byte == b'"' || byte == b'\\')
        .map(|offset| at + offset)
}

fn set_if_present(slot: &mut i32, value: Option<i32>) {
    if let Some(value) = value {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::find_quote_or_backslash;

    fn naive(bytes: &[u8], from: usize) -> Option<usize> {
        (from..bytes.len()).find(|&i| bytes[i] == b'"' || bytes[i] == b'\\')
    }

    proptest! {
        #[test]
        fn the_word_at_a_time_search_finds_what_a_byte_loop_finds(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'"'), Just(b'\\'), Just(b'!'), Just(b'#'), Just(0x22 ^ 0x80), Just(0x5C + 1), any::<u8>()],
                0..200,
            ),
            sparse in any::<bool>(),
            from in 0usize..210,
        ) {
            // Sparse inputs keep stops rare, so the memchr tail past 64 bytes is reached too.
            let bytes: Vec<u8> = if sparse {
                bytes.iter().enumerate().map(|(i, &b)| if i % 97 == 96 { b } else { b'a' }).collect()
            } else {
                bytes
            };
            let from = from.min(bytes.len());
            prop_assert_eq!(find_quote_or_backslash(&bytes, from), naive(&bytes, from));
        }
    }
}
