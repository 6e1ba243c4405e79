//! The RocketMQ remoting codec (REMOTING.md §1–§2): bytes in, typed frames out, and frames
//! written into caller-owned buffers. Pure apart from [`read_frame`]: no I/O of its own, no clock,
//! no shared state, so every shard uses it on its own connections and tests drive it with plain
//! byte slices.
//!
//! - [`decode_frame`] splits one frame off a read buffer and decodes its JSON
//!   ([`json_header`]) or binary ([`binary_header`]) header into a [`RemotingCommand`] that
//!   borrows from the buffer. `Ok(None)` means "need more bytes".
//! - [`FrameEncoder`] writes a frame with a JSON header, the only form the broker sends.
//! - [`request_code`] / [`response_code`] name every code of §2.
//! - [`read_frame`] reads one whole frame from a blocking `std::io::Read` (the admin client,
//!   tests); the only I/O here, and it only reads what it is handed.
//!
//! Invariants: every length read from the wire is checked against its limit before it is
//! used ([`FRAME_SIZE_MAX_BYTES`], the 24-bit header length, [`EXT_FIELDS_COUNT_MAX`],
//! [`JSON_NESTING_DEPTH_MAX`]); malformed input is a [`DecodeError`], never a panic; unknown
//! codes, languages and header keys are kept or ignored, not rejected.

pub mod binary_header;
mod blocking;
mod codes;
mod command;
mod encode;
mod frame;
pub mod json_header;
pub mod signature;

#[cfg(test)]
mod tests;

pub use blocking::{read_frame, ReadFrameError};
pub use codes::{request_code, request_code_name, response_code, response_code_name};
pub use command::{
    parse_bool_lenient, parse_number, ExtFields, FieldError, LanguageCode, RemotingCommand,
    SerializeType, FLAG_ONEWAY, FLAG_RESPONSE,
};
pub use encode::{encoded_head, EncodedHead, FrameEncoder};
pub use frame::{
    decode_frame, peek_frame_size_bytes, DecodeError, FRAME_FIXED_PART_BYTES, FRAME_SIZE_MAX_BYTES,
    HEADER_SIZE_MAX_BYTES, LENGTH_PREFIX_BYTES,
};
pub use json_header::JSON_NESTING_DEPTH_MAX;

/// The version we answer with: V5_3_3. Java clients gate features on the broker version they
/// learn from HEART_BEAT responses (SQL92 filters need ≥ V4_1_0), and Go needs it to fit i16.
pub const BROKER_VERSION: i32 = 479;

pub use crate::limits::EXT_FIELDS_COUNT_MAX;

const _: () = assert!(BROKER_VERSION <= i16::MAX as i32);
