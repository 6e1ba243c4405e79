//! shardmq-protocol: everything of RocketMQ's that is bytes on the wire or on disk, and pure —
//! bytes in, typed values out, encoders writing into caller-owned buffers, no I/O (apart from
//! [`remoting::read_frame`], which only reads the `std::io::Read` it is handed), no clock, no
//! shared state, no unsafe code. The broker, the client library, the bench and the fuzz
//! targets all speak through it, so each format has one implementation.
//!
//! | module | what |
//! |---|---|
//! | [`remoting`] | frames, JSON and binary headers, request/response codes, the frame encoder (REMOTING.md §1–§3) |
//! | [`body`] | the JSON bodies carried in frames, the properties string, tag expressions (§4, §5.4) |
//! | [`record`] | the stored message record (the commitlog format, PULL bodies), encode and decode (§5.1) |
//! | [`batch`] | the batch body of SEND_BATCH_MESSAGE (§5.5) |
//! | [`msg_id`] | offset msgIds: build and parse (§5.7) |
//! | [`hash`] | Java's `String.hashCode()`: tag hash codes |
//! | [`error`] | every decode error: frames, records, bodies |

#![forbid(unsafe_code)]

pub mod batch;
pub mod body;
pub mod error;
pub mod hash;
pub mod limits;
pub mod msg_id;
pub mod record;
pub mod remoting;

pub use error::{BodyError, DecodeError, RecordError};
