//! Every way bytes from the wire or the disk fail to decode, in one place: frames and their
//! headers (`DecodeError`), stored records (`RecordError`) and JSON bodies (`BodyError`).
//! Operating errors: a caller answers or closes one connection, it never stops a shard.

use crate::remoting::FRAME_SIZE_MAX_BYTES;

/// Why a frame could not be decoded. Java closes the connection on all of these, without a
/// response (§1.2); so does the broker.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("frame of {length_bytes} bytes exceeds the limit of {FRAME_SIZE_MAX_BYTES} bytes")]
    FrameTooLarge { length_bytes: usize },
    #[error("frame length prefix is below 4: no room for the header-length word")]
    FrameTooShort,
    #[error(
        "header length {header_length_bytes} exceeds the {available_bytes} bytes left in the frame"
    )]
    HeaderLengthOutOfRange {
        header_length_bytes: usize,
        available_bytes: usize,
    },
    #[error("unknown serialize type byte {0}")]
    UnknownSerializeType(u8),
    #[error("JSON header is not valid UTF-8 at byte {at}")]
    JsonHeaderNotUtf8 { at: usize },
    #[error("malformed JSON header at byte {at}: {reason}")]
    MalformedJsonHeader { reason: &'static str, at: usize },
    #[error("malformed ROCKETMQ binary header at byte {at}: {reason}")]
    MalformedBinaryHeader { reason: &'static str, at: usize },
    #[error("header has more than {limit} extFields entries")]
    TooManyExtFields { limit: usize },
}

/// Why bytes are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record truncated: need {need_bytes} bytes, have {have_bytes}")]
    Truncated {
        need_bytes: usize,
        have_bytes: usize,
    },
    #[error("bad TOTALSIZE {0}")]
    BadSize(i32),
    #[error("bad MAGICCODE {0:#x}")]
    BadMagic(i32),
    #[error("BODYCRC mismatch: stored {stored:#x}, computed {computed:#x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("field {0} runs past TOTALSIZE")]
    FieldOverrun(&'static str),
    #[error("record ends at {fields_end_bytes} but TOTALSIZE is {total_size_bytes}")]
    SizeMismatch {
        fields_end_bytes: usize,
        total_size_bytes: usize,
    },
    #[error("topic is not UTF-8")]
    TopicNotUtf8,
}

/// Why a body could not be read. Operating error: the caller answers the client with a
/// response code, it never stops the shard.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Not JSON, or JSON of a shape no known client sends.
    #[error("malformed {what} body: {reason}")]
    Malformed { what: &'static str, reason: String },
    /// A well-formed body in a form this server does not implement (compressed registration).
    #[error("unsupported {what} body: {reason}")]
    Unsupported { what: &'static str, reason: String },
}

impl BodyError {
    pub(crate) fn malformed(what: &'static str, reason: impl Into<String>) -> BodyError {
        BodyError::Malformed {
            what,
            reason: reason.into(),
        }
    }
}
