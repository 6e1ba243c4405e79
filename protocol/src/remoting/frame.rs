//! Frame splitting (REMOTING.md §1.2): finds one whole frame at the front of a read buffer
//! and hands its header to the JSON or binary header decoder.
//!
//! Pure and allocation-free until a header string needs unescaping. Runs on the shard that
//! owns the connection.
//!
//! | Offset | Size | Field                                                              |
//! |--------|------|--------------------------------------------------------------------|
//! | 0      | 4    | `L`: frame length excluding these 4 bytes = 4 + H + B (big-endian)  |
//! | 4      | 4    | byte 4: serialize type (0 JSON, 1 ROCKETMQ); bytes 5–7: H (24 bits) |
//! | 8      | H    | header                                                             |
//! | 8 + H  | B    | body, B = L − 4 − H                                                |
//!
//! Invariants: the length prefix is checked against [`FRAME_SIZE_MAX_BYTES`] before anything
//! else, so a hostile prefix is an error at once, never a wait for 4 GiB; `Ok(None)` is only
//! returned while the buffer is shorter than a frame that would be accepted; a returned
//! `consumed` is exactly `L + 4`.

use super::binary_header;
use super::command::{RemotingCommand, SerializeType};
use super::json_header;
pub use crate::error::DecodeError;

pub use crate::limits::FRAME_SIZE_MAX_BYTES;
/// The big-endian length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;
/// The serialize-type byte plus the 24-bit header length.
pub const HEADER_LENGTH_WORD_BYTES: usize = 4;
pub use crate::limits::HEADER_SIZE_MAX_BYTES;
/// Bytes before the header starts.
pub const FRAME_FIXED_PART_BYTES: usize = LENGTH_PREFIX_BYTES + HEADER_LENGTH_WORD_BYTES;

// The encoder writes the length as an i32 and Java reads it as one.
const _: () = assert!(FRAME_SIZE_MAX_BYTES <= i32::MAX as usize);
const _: () = assert!(FRAME_SIZE_MAX_BYTES > FRAME_FIXED_PART_BYTES);

/// The total size (prefix included) of the frame at the front of `buf`, once its length
/// prefix has arrived; validated like [`decode_frame`] validates it. Lets a reader reserve
/// buffer space for exactly one frame.
pub fn peek_frame_size_bytes(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    let Some(prefix) = buf.first_chunk::<LENGTH_PREFIX_BYTES>() else {
        return Ok(None);
    };
    // u32 -> usize cannot lose bits on the 64-bit targets glommio supports; saturate anyway.
    let length_bytes = usize::try_from(u32::from_be_bytes(*prefix)).unwrap_or(usize::MAX);
    let frame_size_bytes = length_bytes.saturating_add(LENGTH_PREFIX_BYTES);
    if frame_size_bytes > FRAME_SIZE_MAX_BYTES {
        return Err(DecodeError::FrameTooLarge {
            length_bytes: frame_size_bytes,
        });
    }
    if length_bytes < HEADER_LENGTH_WORD_BYTES {
        return Err(DecodeError::FrameTooShort);
    }
    Ok(Some(frame_size_bytes))
}

/// Decodes the frame at the front of `buf`. `Ok(None)`: more bytes are needed; otherwise the
/// command (borrowing from `buf`) and the number of bytes it occupied.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(RemotingCommand<'_>, usize)>, DecodeError> {
    let Some(frame_size_bytes) = peek_frame_size_bytes(buf)? else {
        return Ok(None);
    };
    let Some(frame) = buf.get(..frame_size_bytes) else {
        return Ok(None);
    };
    let (word, rest) = frame[LENGTH_PREFIX_BYTES..]
        .split_first_chunk::<HEADER_LENGTH_WORD_BYTES>()
        .ok_or(DecodeError::FrameTooShort)?;
    let word = u32::from_be_bytes(*word);
    let type_byte = word.to_be_bytes()[0];
    let header_length_bytes = (word & 0x00FF_FFFF) as usize;
    if header_length_bytes > rest.len() {
        return Err(DecodeError::HeaderLengthOutOfRange {
            header_length_bytes,
            available_bytes: rest.len(),
        });
    }
    let (header, body) = rest.split_at(header_length_bytes);
    let command = match SerializeType::from_code(type_byte) {
        Some(SerializeType::Json) => json_header::decode(header, body)?,
        Some(SerializeType::RocketMq) => binary_header::decode(header, body)?,
        None => return Err(DecodeError::UnknownSerializeType(type_byte)),
    };
    Ok(Some((command, frame_size_bytes)))
}
