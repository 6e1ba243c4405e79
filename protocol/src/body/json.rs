//! Lenient JSON reading shared by every body type, and the one strict writer.
//!
//! Reading goes through `serde_json::Value` and [`Fields`], whose accessors accept what
//! fastjson accepts (REMOTING.md §4.1 item 4): numbers as strings, strings as numbers, `null`
//! as missing. A body that is not JSON is retried once after [`quote_bare_numeric_keys`], the
//! fastjson/Java namesrv habit of writing `{0:"addr"}`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use super::BodyError;

/// Parses a body into a JSON value; tolerates trailing whitespace/NULs and bare numeric keys.
pub(crate) fn parse_body(what: &'static str, body: &[u8]) -> Result<Value, BodyError> {
    let end = body
        .iter()
        .rposition(|b| !b.is_ascii_whitespace() && *b != 0)
        .map_or(0, |i| i + 1);
    let body = &body[..end];
    if body.is_empty() {
        return Err(BodyError::malformed(what, "empty body"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(value) => Ok(value),
        Err(first_error) => {
            let quoted = quote_bare_numeric_keys(body);
            serde_json::from_slice::<Value>(&quoted)
                .map_err(|_| BodyError::malformed(what, first_error.to_string()))
        }
    }
}

/// Parses a body that must be a JSON object.
pub(crate) fn parse_object(
    what: &'static str,
    body: &[u8],
) -> Result<Map<String, Value>, BodyError> {
    match parse_body(what, body)? {
        Value::Object(map) => Ok(map),
        other => Err(BodyError::malformed(
            what,
            format!("expected an object, got {}", kind(&other)),
        )),
    }
}

/// Compact standard JSON of one of our own wire structs.
pub(crate) fn encode_compact<T: Serialize>(value: &T) -> Vec<u8> {
    // Our wire structs have string or integer map keys only, which serde_json always accepts:
    // a failure here is a bug in this module, not bad input.
    serde_json::to_vec(value).expect("protocol wire structs always serialize")
}

/// Pretty-printed JSON (persisted files, for people to read).
pub(crate) fn encode_pretty<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("protocol wire structs always serialize")
}

/// Rewrites bare numeric object keys (`{0:"a",1:"b"}`) as quoted ones; everything else,
/// including numbers in arrays and values and text inside strings, is copied unchanged.
pub(crate) fn quote_bare_numeric_keys(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + 16);
    let mut containers: Vec<u8> = Vec::new();
    let mut expect_key = false;
    let mut index = 0;
    while index < input.len() {
        let byte = input[index];
        match byte {
            b'"' => {
                let end = string_end(input, index);
                out.extend_from_slice(&input[index..end]);
                index = end;
                expect_key = false;
                continue;
            }
            b'{' | b'[' => {
                containers.push(byte);
                expect_key = byte == b'{';
            }
            b'}' | b']' => {
                containers.pop();
                expect_key = false;
            }
            b',' => expect_key = containers.last() == Some(&b'{'),
            b'-' | b'0'..=b'9' if expect_key => {
                let end = input[index..]
                    .iter()
                    .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .map_or(input.len(), |offset| index + offset);
                out.push(b'"');
                out.extend_from_slice(&input[index..end]);
                out.push(b'"');
                index = end;
                expect_key = false;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => expect_key = false,
        }
        out.push(byte);
        index += 1;
    }
    out
}

/// Index just past the string literal that starts at `start` (a `"`), or the input's end.
pub(crate) fn string_end(input: &[u8], start: usize) -> usize {
    let mut index = start + 1;
    while index < input.len() {
        match input[index] {
            b'\\' => index += 2,
            b'"' => return index + 1,
            _ => index += 1,
        }
    }
    input.len()
}

pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Lenient typed access to one JSON object's members. `null` counts as missing.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub what: &'static str,
    pub map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub fn new(what: &'static str, map: &'a Map<String, Value>) -> Fields<'a> {
        Fields { what, map }
    }

    /// Wraps a value that must be an object.
    pub fn of(what: &'static str, value: &'a Value) -> Result<Fields<'a>, BodyError> {
        match value {
            Value::Object(map) => Ok(Fields { what, map }),
            other => Err(BodyError::malformed(
                what,
                format!("expected an object, got {}", kind(other)),
            )),
        }
    }

    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|value| !value.is_null())
    }

    fn wrong(&self, key: &str, expected: &str, value: &Value) -> BodyError {
        BodyError::malformed(
            self.what,
            format!("{key}: expected {expected}, got {}", kind(value)),
        )
    }

    /// A string member; numbers and booleans are taken as their text.
    pub fn string(&self, key: &str) -> Result<Option<String>, BodyError> {
        self.get(key)
            .map(|value| value_to_string(value).ok_or_else(|| self.wrong(key, "a string", value)))
            .transpose()
    }

    pub fn required_string(&self, key: &str) -> Result<String, BodyError> {
        self.string(key)?
            .ok_or_else(|| BodyError::malformed(self.what, format!("{key}: missing")))
    }

    /// An integer member; strings holding an integer are accepted.
    pub fn i64(&self, key: &str) -> Result<Option<i64>, BodyError> {
        self.get(key)
            .map(|value| value_to_i64(value).ok_or_else(|| self.wrong(key, "an integer", value)))
            .transpose()
    }

    /// A non-negative integer member that fits in u32.
    pub fn u32(&self, key: &str) -> Result<Option<u32>, BodyError> {
        match self.i64(key)? {
            None => Ok(None),
            Some(number) => u32::try_from(number).map(Some).map_err(|_| {
                BodyError::malformed(self.what, format!("{key}: {number} out of range"))
            }),
        }
    }

    /// A boolean member; `"true"` (any case) and non-zero numbers are true, like fastjson.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, BodyError> {
        self.get(key)
            .map(|value| value_to_bool(value).ok_or_else(|| self.wrong(key, "a boolean", value)))
            .transpose()
    }

    /// An array member; missing is empty.
    pub fn array(&self, key: &str) -> Result<&'a [Value], BodyError> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(self.wrong(key, "an array", other)),
        }
    }

    /// An object member; missing is `None`.
    pub fn object(&self, key: &str) -> Result<Option<Fields<'a>>, BodyError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields {
                what: self.what,
                map,
            })),
            Some(other) => Err(self.wrong(key, "an object", other)),
        }
    }

    /// An object member of strings (numbers and booleans taken as their text, `null` entries
    /// skipped), as Java's `Map<String, String>` attributes; missing is empty.
    pub fn string_map(&self, key: &str) -> Result<BTreeMap<String, String>, BodyError> {
        let mut entries = BTreeMap::new();
        if let Some(table) = self.object(key)? {
            for (name, value) in table.map.iter().filter(|(_, value)| !value.is_null()) {
                let value = value_to_string(value).ok_or_else(|| {
                    BodyError::malformed(self.what, format!("{key}.{name}: not a string"))
                })?;
                entries.insert(name.clone(), value);
            }
        }
        Ok(entries)
    }

    /// An array of strings (numbers accepted as text); missing is empty.
    pub fn string_array(&self, key: &str) -> Result<Vec<String>, BodyError> {
        self.array(key)?
            .iter()
            .filter(|value| !value.is_null())
            .map(|value| value_to_string(value).ok_or_else(|| self.wrong(key, "strings", value)))
            .collect()
    }
}

/// A string map as a JSON object of strings (the writing side of [`Fields::string_map`]).
pub(crate) fn string_map_value(map: &BTreeMap<String, String>) -> Value {
    let entries = map
        .iter()
        .map(|(key, value)| (key.clone(), Value::String(value.clone())));
    Value::Object(entries.collect())
}

pub(crate) fn value_to_string(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

pub(crate) fn value_to_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64().or_else(|| {
            // fastjson truncates a fractional number given for an integer field.
            number
                .as_f64()
                .filter(|f| f.is_finite() && f.abs() < 9.2e18)
                .map(|f| f as i64)
        }),
        Value::String(text) => text.trim().parse::<i64>().ok(),
        _ => None,
    }
}

pub(crate) fn value_to_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(flag) => Some(*flag),
        Value::Number(number) => Some(number.as_f64().is_some_and(|f| f != 0.0)),
        Value::String(text) => {
            let text = text.trim();
            Some(text.eq_ignore_ascii_case("true") || text == "1")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quote(text: &str) -> String {
        String::from_utf8(quote_bare_numeric_keys(text.as_bytes())).unwrap_or_default()
    }

    #[test]
    fn quotes_only_bare_keys() {
        assert_eq!(quote(r#"{0:"a", 1 :"b"}"#), r#"{"0":"a", "1" :"b"}"#);
        assert_eq!(
            quote(r#"{"x":[1,2,{3:4}],"y":5}"#),
            r#"{"x":[1,2,{"3":4}],"y":5}"#
        );
        assert_eq!(quote(r#"{"s":"{0:1,\"2:3"}"#), r#"{"s":"{0:1,\"2:3"}"#);
        assert_eq!(quote(r#"{ -1:2}"#), r#"{ "-1":2}"#);
    }

    #[test]
    fn parse_body_trims_and_retries() {
        let value = parse_body("t", b"{0:\"a\"}\n\0").ok();
        assert_eq!(value, Some(serde_json::json!({"0": "a"})));
        assert!(parse_body("t", b"  \n").is_err());
        assert!(parse_body("t", b"{0:").is_err());
    }

    #[test]
    fn lenient_scalars() {
        let map = serde_json::json!({"a": "12", "b": 7, "c": "true", "d": 0, "e": null, "f": {}});
        let Value::Object(map) = map else {
            panic!("object")
        };
        let fields = Fields::new("t", &map);
        assert_eq!(fields.i64("a").ok().flatten(), Some(12));
        assert_eq!(fields.string("b").ok().flatten().as_deref(), Some("7"));
        assert_eq!(fields.bool("c").ok().flatten(), Some(true));
        assert_eq!(fields.bool("d").ok().flatten(), Some(false));
        assert_eq!(fields.i64("e").ok().flatten(), None);
        assert!(fields.string("f").is_err());
        assert!(fields.u32("x").ok().flatten().is_none());
    }

    #[test]
    fn string_maps_read_leniently_and_write_back() {
        let map =
            serde_json::json!({"attributes": {"a": "x", "n": 3, "gone": null}, "bad": {"k": []}});
        let Value::Object(map) = map else {
            panic!("object")
        };
        let fields = Fields::new("t", &map);
        let attributes = fields.string_map("attributes").unwrap();
        assert_eq!(attributes.len(), 2);
        assert_eq!(attributes["n"], "3");
        assert!(fields.string_map("missing").unwrap().is_empty());
        let error = fields.string_map("bad").unwrap_err().to_string();
        assert!(error.contains("bad.k: not a string"), "{error}");
        let written = string_map_value(&attributes);
        assert_eq!(written, serde_json::json!({"a": "x", "n": "3"}));
    }
}
