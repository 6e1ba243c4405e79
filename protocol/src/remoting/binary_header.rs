//! The ROCKETMQ binary header decoder (REMOTING.md §1.4, type byte 1). No known client
//! sends it by default (Java does with `-Drocketmq.serialize.type=ROCKETMQ`), and the broker
//! always answers in JSON, so only decoding lives here; a test-only encoder feeds the tests.
//!
//! | Offset  | Size | Field                                                          |
//! |---------|------|----------------------------------------------------------------|
//! | 0       | 2    | code (i16)                                                     |
//! | 2       | 1    | language code (u8)                                             |
//! | 3       | 2    | version (i16)                                                  |
//! | 5       | 4    | opaque (i32)                                                   |
//! | 9       | 4    | flag (i32)                                                     |
//! | 13      | 4    | remark length R (i32; 0 = null)                                |
//! | 17      | R    | remark, UTF-8                                                  |
//! | 17 + R  | 4    | extFields block length E (i32; 0 = none)                       |
//! | 21 + R  | E    | entries: key length (i16), key, value length (i32), value      |
//!
//! Read as Java reads it: code and version sign-extended from i16, an unknown language byte
//! is `OTHER`, invalid UTF-8 is replaced (U+FFFD) like `new String(bytes, UTF_8)`, an entry
//! with an empty value is dropped (Java decodes a zero-length string as null, so the field
//! arrives absent), bytes after the ext block are ignored. Every length is checked against
//! the bytes that remain before it is used; a negative length is an error.

use super::command::{ExtFields, LanguageCode, RemotingCommand, SerializeType};
use super::EXT_FIELDS_COUNT_MAX;
use crate::error::DecodeError;

/// code + language + version + opaque + flag + remark length + ext block length.
pub const BINARY_HEADER_FIXED_PART_BYTES: usize = 21;

/// Decodes a binary header; `body` is attached to the command as is.
pub(crate) fn decode<'a>(
    header: &'a [u8],
    body: &'a [u8],
) -> Result<RemotingCommand<'a>, DecodeError> {
    if header.len() < BINARY_HEADER_FIXED_PART_BYTES {
        return Err(DecodeError::MalformedBinaryHeader {
            reason: "shorter than the 21-byte fixed part",
            at: header.len(),
        });
    }
    let mut reader = Reader {
        bytes: header,
        pos: 0,
    };
    let code = i32::from(reader.i16()?);
    let language = LanguageCode::from_code(reader.u8()?);
    let version = i32::from(reader.i16()?);
    let opaque = reader.i32()?;
    let flag = reader.i32()?;
    let remark_bytes = reader.length_prefixed_i32("remark length out of range")?;
    let remark = (!remark_bytes.is_empty()).then(|| String::from_utf8_lossy(remark_bytes));
    let ext_block = reader.length_prefixed_i32("extFields block length out of range")?;
    let ext_fields = decode_ext_block(ext_block, reader.pos - ext_block.len())?;
    Ok(RemotingCommand {
        code,
        language,
        version,
        opaque,
        flag,
        remark,
        ext_fields,
        body,
        serialize_type: SerializeType::RocketMq,
    })
}

/// `block` is the ext block; `block_offset` its position in the header (for error offsets).
fn decode_ext_block(block: &[u8], block_offset: usize) -> Result<ExtFields<'_>, DecodeError> {
    let mut fields = ExtFields::new();
    let mut reader = Reader {
        bytes: block,
        pos: 0,
    };
    while reader.pos < block.len() {
        let key = reader.length_prefixed_i16("ext key length out of range");
        let value = key.and_then(|key| {
            let value = reader.length_prefixed_i32("ext value length out of range")?;
            Ok((key, value))
        });
        let (key, value) = value.map_err(|error| error.shifted(block_offset))?;
        if value.is_empty() {
            continue;
        }
        if fields.len() == EXT_FIELDS_COUNT_MAX {
            return Err(DecodeError::TooManyExtFields {
                limit: EXT_FIELDS_COUNT_MAX,
            });
        }
        fields.push(String::from_utf8_lossy(key), String::from_utf8_lossy(value));
    }
    Ok(fields)
}

impl DecodeError {
    /// Moves a binary-header error offset from a sub-slice into header coordinates.
    fn shifted(self, offset: usize) -> Self {
        match self {
            DecodeError::MalformedBinaryHeader { reason, at } => {
                DecodeError::MalformedBinaryHeader {
                    reason,
                    at: at + offset,
                }
            }
            other => other,
        }
    }
}

/// A bounds-checked big-endian cursor.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize, reason: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(count);
        let Some(taken) = end.and_then(|end| self.bytes.get(self.pos..end)) else {
            return Err(DecodeError::MalformedBinaryHeader {
                reason,
                at: self.pos,
            });
        };
        self.pos += count;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let taken = self.take(N, "truncated fixed-size field")?;
        let mut array = [0u8; N];
        array.copy_from_slice(taken);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn length_prefixed_i16(&mut self, reason: &'static str) -> Result<&'a [u8], DecodeError> {
        let length = self.i16()?;
        self.length_prefixed(i64::from(length), reason)
    }

    fn length_prefixed_i32(&mut self, reason: &'static str) -> Result<&'a [u8], DecodeError> {
        let length = self.i32()?;
        self.length_prefixed(i64::from(length), reason)
    }

    fn length_prefixed(
        &mut self,
        length: i64,
        reason: &'static str,
    ) -> Result<&'a [u8], DecodeError> {
        let Ok(length) = usize::try_from(length) else {
            return Err(DecodeError::MalformedBinaryHeader {
                reason,
                at: self.pos,
            });
        };
        self.take(length, reason)
    }
}

/// Test-only encoder for the binary header, the mirror of [`decode`].
#[cfg(test)]
pub(crate) fn encode_for_test(command: &RemotingCommand<'_>, ext: &[(&str, &str)]) -> Vec<u8> {
    let mut header = Vec::new();
    header.extend_from_slice(&(command.code as i16).to_be_bytes());
    header.push(command.language.code());
    header.extend_from_slice(&(command.version as i16).to_be_bytes());
    header.extend_from_slice(&command.opaque.to_be_bytes());
    header.extend_from_slice(&command.flag.to_be_bytes());
    let remark = command.remark.as_deref().unwrap_or("");
    header.extend_from_slice(&(remark.len() as i32).to_be_bytes());
    header.extend_from_slice(remark.as_bytes());
    let mut block = Vec::new();
    for (key, value) in ext {
        block.extend_from_slice(&(key.len() as i16).to_be_bytes());
        block.extend_from_slice(key.as_bytes());
        block.extend_from_slice(&(value.len() as i32).to_be_bytes());
        block.extend_from_slice(value.as_bytes());
    }
    header.extend_from_slice(&(block.len() as i32).to_be_bytes());
    header.extend_from_slice(&block);
    header
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn command(remark: Option<&str>) -> RemotingCommand<'_> {
        RemotingCommand {
            code: 310,
            language: LanguageCode::Java,
            version: 479,
            opaque: -7,
            flag: 2,
            remark: remark.map(Cow::Borrowed),
            ext_fields: ExtFields::new(),
            body: b"",
            serialize_type: SerializeType::RocketMq,
        }
    }

    #[test]
    fn decodes_fields_and_drops_empty_values() {
        let header = encode_for_test(&command(Some("hé")), &[("a", "g1"), ("b", ""), ("", "x")]);
        let decoded = decode(&header, b"body").expect("valid header");
        assert_eq!(
            (decoded.code, decoded.version, decoded.opaque, decoded.flag),
            (310, 479, -7, 2)
        );
        assert_eq!(decoded.remark.as_deref(), Some("hé"));
        let entries: Vec<_> = decoded.ext_fields.iter().collect();
        assert_eq!(entries, vec![("a", "g1"), ("", "x")]);
        assert_eq!(decoded.body, b"body");
        assert_eq!(decoded.serialize_type, SerializeType::RocketMq);
    }

    #[test]
    fn short_negative_and_overlong_lengths_are_errors() {
        let header = encode_for_test(&command(None), &[("topic", "T")]);
        for cut in 0..header.len() {
            assert!(decode(&header[..cut], b"").is_err(), "cut at {cut}");
        }
        let mut negative = encode_for_test(&command(None), &[]);
        negative[13..17].copy_from_slice(&(-1i32).to_be_bytes());
        assert!(matches!(
            decode(&negative, b""),
            Err(DecodeError::MalformedBinaryHeader { at: 17, .. })
        ));
        let mut negative_key = encode_for_test(&command(None), &[("k", "v")]);
        negative_key[21..23].copy_from_slice(&(-2i16).to_be_bytes());
        assert!(matches!(
            decode(&negative_key, b""),
            Err(DecodeError::MalformedBinaryHeader { at: 23, .. })
        ));
    }

    #[test]
    fn code_sign_extends_and_language_falls_back_to_other() {
        let mut header = encode_for_test(&command(None), &[]);
        header[0..2].copy_from_slice(&(-3i16).to_be_bytes());
        header[2] = 99;
        let decoded = decode(&header, b"").expect("valid header");
        assert_eq!(decoded.code, -3);
        assert_eq!(decoded.language, LanguageCode::Other);
        assert!(decoded.remark.is_none());
    }
}
