//! The decoded frame: [`RemotingCommand`], its custom header [`ExtFields`] and the two small
//! enums that travel in every header ([`LanguageCode`], [`SerializeType`]).
//!
//! Lives on whichever shard owns the connection; everything here borrows from that
//! connection's read buffer (`'a`) and is dropped before the buffer is compacted. Strings
//! borrow from it unless the wire form contained a JSON escape: then an ext field's text is
//! kept in one buffer of its `ExtFields`, a remark in a `Cow::Owned`.
//!
//! Invariants: `ExtFields` keeps entries in wire order; when a key repeats, lookups return
//! the last value (what Java's `HashMap::put` leaves), `iter` yields every entry.

use std::borrow::Cow;

/// How the header of a frame is serialized: the top byte of the header-length word (§1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SerializeType {
    /// Type byte 0: JSON text header (every known client, and everything we emit).
    Json,
    /// Type byte 1: the compact binary header of §1.4.
    RocketMq,
}

impl SerializeType {
    /// The type byte, `None` for bytes other than 0 and 1.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(SerializeType::Json),
            1 => Some(SerializeType::RocketMq),
            _ => None,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    /// The `serializeTypeCurrentRPC` text.
    pub fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

/// The sender's implementation language (§1.4): a name in JSON headers, a byte in binary ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LanguageCode {
    Java = 0,
    Cpp = 1,
    Dotnet = 2,
    Python = 3,
    Delphi = 4,
    Erlang = 5,
    Ruby = 6,
    Other = 7,
    Http = 8,
    Go = 9,
    Php = 10,
    Oms = 11,
    Rust = 12,
    NodeJs = 13,
}

/// Index = the binary code of §1.4.
const LANGUAGES: [(LanguageCode, &str); 14] = [
    (LanguageCode::Java, "JAVA"),
    (LanguageCode::Cpp, "CPP"),
    (LanguageCode::Dotnet, "DOTNET"),
    (LanguageCode::Python, "PYTHON"),
    (LanguageCode::Delphi, "DELPHI"),
    (LanguageCode::Erlang, "ERLANG"),
    (LanguageCode::Ruby, "RUBY"),
    (LanguageCode::Other, "OTHER"),
    (LanguageCode::Http, "HTTP"),
    (LanguageCode::Go, "GO"),
    (LanguageCode::Php, "PHP"),
    (LanguageCode::Oms, "OMS"),
    (LanguageCode::Rust, "RUST"),
    (LanguageCode::NodeJs, "NODE_JS"),
];

impl LanguageCode {
    /// The enum name as sent in JSON headers; unknown names are `Other` (§1.3: accept any).
    pub fn from_name(name: &str) -> Self {
        LANGUAGES
            .iter()
            .find(|(_, text)| *text == name)
            .map_or(LanguageCode::Other, |(language, _)| *language)
    }

    /// The binary header byte; unknown bytes are `Other`.
    pub fn from_code(code: u8) -> Self {
        LANGUAGES
            .get(usize::from(code))
            .map_or(LanguageCode::Other, |(language, _)| *language)
    }

    pub fn name(self) -> &'static str {
        LANGUAGES[usize::from(self.code())].1
    }

    pub fn code(self) -> u8 {
        self as u8
    }
}

/// One decoded frame, borrowing from the input buffer.
#[derive(Debug)]
pub struct RemotingCommand<'a> {
    /// Request code for requests, response code for responses; unknown codes are kept.
    pub code: i32,
    pub language: LanguageCode,
    /// The sender's MQVersion ordinal (C++ 63, ali-ons 121, Go 317, Java 401/479).
    pub version: i32,
    /// Request id; a response echoes its request's opaque.
    pub opaque: i32,
    /// Bit 0: response; bit 1: oneway request.
    pub flag: i32,
    pub remark: Option<Cow<'a, str>>,
    pub ext_fields: ExtFields<'a>,
    pub body: &'a [u8],
    /// The header's encoding on the wire (the type byte), not `serializeTypeCurrentRPC`.
    pub serialize_type: SerializeType,
}

/// Flag bit 0 (§1.3).
pub const FLAG_RESPONSE: i32 = 0x1;
/// Flag bit 1 (§1.5); only Java and Rust clients set it on the wire.
pub const FLAG_ONEWAY: i32 = 0x2;

impl RemotingCommand<'_> {
    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// RocketMQ's name of `code`, read as a response code or a request code per the flag.
    pub fn code_name(&self) -> Option<&'static str> {
        if self.is_response() {
            super::codes::response_code_name(self.code)
        } else {
            super::codes::request_code_name(self.code)
        }
    }
}

/// A missing or unparsable custom header field; the handler maps it to a response code.
#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    #[error("the custom field <{0}> is null")]
    Missing(&'static str),
    #[error("the custom field <{key}> is not a number: {value}")]
    NotANumber { key: &'static str, value: String },
}

/// The custom header (`extFields`): string keys to string values, in wire order.
///
/// An entry's text is either a slice of the frame or, when the wire form had to be decoded
/// (a JSON escape, a binary value that is not UTF-8, a `String` pushed), a range of one
/// buffer that the fields own. Entries are plain `Copy` pairs: an entry of `Cow`s was built
/// on the stack and copied into the `Vec` with 16-byte loads over 8-byte stores, a stall at
/// every entry (13% of decoding a SEND header in `cargo bench --bench codec`).
#[derive(Debug, Default, Clone)]
pub struct ExtFields<'a> {
    entries: Vec<(Text<'a>, Text<'a>)>,
    decoded: String,
}

/// Where an entry's key or value is: in the frame, or in [`ExtFields`]'s own buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Text<'a> {
    Frame(&'a str),
    Decoded { start: u32, end: u32 },
}

impl<'a> ExtFields<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        ExtFields {
            entries: Vec::with_capacity(capacity),
            decoded: String::new(),
        }
    }

    /// Appends an entry; a repeated key shadows the earlier one for lookups.
    pub fn push(&mut self, key: impl Into<Cow<'a, str>>, value: impl Into<Cow<'a, str>>) {
        let key = self.text(key.into());
        let value = self.text(value.into());
        self.entries.push((key, value));
    }

    fn text(&mut self, text: Cow<'a, str>) -> Text<'a> {
        match text {
            Cow::Borrowed(text) => Text::Frame(text),
            Cow::Owned(text) => self.decode_with(text.len(), |decoded| decoded.push_str(&text)),
        }
    }

    /// Appends an entry of texts made by [`ExtFields::decode_with`] or borrowed from the frame.
    #[inline(always)]
    pub(crate) fn push_text(&mut self, key: Text<'a>, value: Text<'a>) {
        self.entries.push((key, value));
    }

    /// A text that `write` appends to the fields' own buffer (an unescaped string), made
    /// room for with `length_hint` bytes.
    pub(crate) fn decode_with(
        &mut self,
        length_hint: usize,
        write: impl FnOnce(&mut String),
    ) -> Text<'a> {
        self.decoded.reserve(length_hint);
        let start = self.decoded.len();
        write(&mut self.decoded);
        // Headers are under 16 MiB (checked before decoding), and so is what they decode to.
        Text::Decoded {
            start: start as u32,
            end: self.decoded.len() as u32,
        }
    }

    /// Takes back what the last [`ExtFields::decode_with`] wrote (its text was not kept).
    pub(crate) fn forget_decoded(&mut self, text: Text<'a>) {
        if let Text::Decoded { start, .. } = text {
            self.decoded.truncate(start as usize);
        }
    }

    #[inline(always)]
    fn resolve<'s>(&'s self, text: &Text<'a>) -> &'s str {
        match *text {
            Text::Frame(text) => text,
            Text::Decoded { start, end } => &self.decoded[start as usize..end as usize],
        }
    }

    /// The value of `key`; `""` is returned as `Some("")`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(entry_key, _)| self.resolve(entry_key) == key)
            .map(|(_, value)| self.resolve(value))
    }

    /// The value of `key`, treating `""` as absent (C++ sends `""` for unused groups).
    pub fn get_non_empty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|value| !value.is_empty())
    }

    /// The value of `key`, `Missing` when absent (an empty value is present).
    pub fn required(&self, key: &'static str) -> Result<&str, FieldError> {
        self.get(key).ok_or(FieldError::Missing(key))
    }

    /// A decimal `long` (Java `Long.parseLong`); `""` or other text is `NotANumber`.
    pub fn required_i64(&self, key: &'static str) -> Result<i64, FieldError> {
        parse_number(key, self.required(key)?)
    }

    /// A decimal `int` (Java `Integer.parseInt`); out of range is `NotANumber`.
    pub fn required_i32(&self, key: &'static str) -> Result<i32, FieldError> {
        parse_number(key, self.required(key)?)
    }

    /// Absent or `""` is `None`; other text must be a decimal `long`.
    pub fn optional_i64(&self, key: &'static str) -> Result<Option<i64>, FieldError> {
        self.get_non_empty(key)
            .map(|value| parse_number(key, value))
            .transpose()
    }

    /// Absent or `""` is `None`; other text must be a decimal `int`.
    pub fn optional_i32(&self, key: &'static str) -> Result<Option<i32>, FieldError> {
        self.get_non_empty(key)
            .map(|value| parse_number(key, value))
            .transpose()
    }

    /// `"true"`/`"false"` in any case and C++'s `"1"`/`"0"`; any other text is `false`, as
    /// Java's `Boolean.parseBoolean` reads it. `None` only when the key is absent.
    pub fn bool_lenient(&self, key: &str) -> Option<bool> {
        self.get(key).map(parse_bool_lenient)
    }

    /// Every entry in wire order, repeated keys included.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.entries
            .iter()
            .map(|(key, value)| (self.resolve(key), self.resolve(value)))
    }

    /// Every entry copied out of the frame into `C` (a `Vec` of pairs in wire order, or a map,
    /// where a repeated key keeps its last value as [`ExtFields::get`] does).
    pub fn collect_owned<C: FromIterator<(String, String)>>(&self) -> C {
        self.iter()
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Equal when they hold the same entries in the same order, wherever their texts are kept.
impl PartialEq for ExtFields<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for ExtFields<'_> {}

/// `"true"`/`"false"` in any case and C++'s `"1"`/`"0"`; any other text is `false`
/// ([`ExtFields::bool_lenient`] for a value already looked up).
pub fn parse_bool_lenient(value: &str) -> bool {
    value.eq_ignore_ascii_case("true") || value == "1"
}

/// A decimal number (Java's `parseInt`/`parseLong`) of field `key`; other text is
/// `NotANumber` ([`ExtFields::required_i32`] and friends for a value already looked up).
pub fn parse_number<T>(key: &'static str, value: &str) -> Result<T, FieldError>
where
    T: std::str::FromStr + TryFrom<i64>,
{
    // The common form, up to 18 digits (no i64 overflows), read in place; anything else
    // (a sign, more digits, other text, out of `T`'s range) goes through `FromStr`.
    if let Some((number, length)) = leading_decimal(value.as_bytes(), 18) {
        if length == value.len() {
            if let Ok(number) = T::try_from(number) {
                return Ok(number);
            }
        }
    }
    value.parse().map_err(|_| FieldError::NotANumber {
        key,
        value: value.to_owned(),
    })
}

/// The decimal number `-?[0-9]{1,digits_max}` at the start of `bytes`, and the bytes it
/// takes; None when there is no digit or more than `digits_max` (at most 18: no i64
/// overflow).
#[inline(always)]
pub(crate) fn leading_decimal(bytes: &[u8], digits_max: usize) -> Option<(i64, usize)> {
    debug_assert!(digits_max <= 18, "at most 18 digits fit an i64");
    let negative = bytes.first() == Some(&b'-');
    let first = usize::from(negative);
    let mut at = first;
    let mut magnitude: i64 = 0;
    while let Some(&digit @ b'0'..=b'9') = bytes.get(at) {
        if at - first == digits_max {
            return None;
        }
        magnitude = magnitude * 10 + i64::from(digit - b'0');
        at += 1;
    }
    if at == first {
        return None;
    }
    Some((if negative { -magnitude } else { magnitude }, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> ExtFields<'static> {
        let mut fields = ExtFields::new();
        for (key, value) in [
            ("queueId", "3"),
            ("consumerGroup", ""),
            ("unitMode", "0"),
            ("batch", "1"),
            ("k", "TRUE"),
            ("odd", "yes"),
            ("big", "1795948689289"),
            ("bad", "12x"),
            ("queueId", "4"),
        ] {
            fields.push(key, value);
        }
        fields
    }

    #[test]
    fn lookups_follow_java_semantics() {
        let fields = fields();
        assert_eq!(
            fields.get("queueId"),
            Some("4"),
            "the last repeated key wins"
        );
        assert_eq!(fields.get("consumerGroup"), Some(""));
        assert_eq!(fields.get_non_empty("consumerGroup"), None);
        assert_eq!(fields.required_i32("queueId").ok(), Some(4));
        assert_eq!(fields.required_i64("big").ok(), Some(1_795_948_689_289));
        assert!(matches!(
            fields.required_i32("big"),
            Err(FieldError::NotANumber { .. })
        ));
        assert!(matches!(
            fields.required_i64("bad"),
            Err(FieldError::NotANumber { .. })
        ));
        assert!(matches!(
            fields.required("nope"),
            Err(FieldError::Missing("nope"))
        ));
        assert!(matches!(
            fields.required_i64("consumerGroup"),
            Err(FieldError::NotANumber { .. })
        ));
        assert_eq!(fields.optional_i64("consumerGroup").ok(), Some(None));
        assert_eq!(fields.optional_i32("nope").ok(), Some(None));
        assert_eq!(fields.optional_i32("queueId").ok(), Some(Some(4)));
        assert!(fields.optional_i32("bad").is_err());
        assert_eq!(fields.bool_lenient("unitMode"), Some(false));
        assert_eq!(fields.bool_lenient("batch"), Some(true));
        assert_eq!(fields.bool_lenient("k"), Some(true));
        assert_eq!(fields.bool_lenient("odd"), Some(false));
        assert_eq!(fields.bool_lenient("nope"), None);
        assert_eq!(fields.len(), 9);
        assert_eq!(fields.iter().next(), Some(("queueId", "3")));
        let pairs: Vec<(String, String)> = fields.collect_owned();
        assert_eq!(pairs.len(), 9);
        let map: std::collections::BTreeMap<String, String> = fields.collect_owned();
        assert_eq!(map["queueId"], "4", "a map keeps the last repeated value");
    }

    #[test]
    fn numbers_read_in_place_read_as_from_str_does() {
        let i32_of = |text| parse_number::<i32>("k", text).ok();
        let i64_of = |text| parse_number::<i64>("k", text).ok();
        for text in [
            "0",
            "-0",
            "7",
            "-7",
            "+7",
            "007",
            "2147483647",
            "-2147483648",
        ] {
            assert_eq!(i32_of(text), text.parse().ok(), "{text}");
        }
        for text in [
            "2147483648",
            "-2147483649",
            "",
            "-",
            "+",
            "1-",
            " 1",
            "1.0",
            "٣",
        ] {
            assert_eq!(i32_of(text), None, "{text}");
        }
        for text in [
            "999999999999999999",
            "-999999999999999999",
            "9223372036854775807",
        ] {
            assert_eq!(i64_of(text), text.parse().ok(), "{text}");
        }
        assert_eq!(i64_of("9223372036854775808"), None);
    }

    #[test]
    fn field_error_messages_match_java() {
        let error = FieldError::Missing("topic");
        assert_eq!(error.to_string(), "the custom field <topic> is null");
    }

    #[test]
    fn language_names_and_codes() {
        for code in 0..=13u8 {
            let language = LanguageCode::from_code(code);
            assert_eq!(language.code(), code);
            assert_eq!(LanguageCode::from_name(language.name()), language);
        }
        assert_eq!(LanguageCode::from_name("NODE_JS"), LanguageCode::NodeJs);
        assert_eq!(LanguageCode::from_name("KOTLIN"), LanguageCode::Other);
        assert_eq!(LanguageCode::from_code(200), LanguageCode::Other);
    }
}
