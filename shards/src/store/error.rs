//! Store errors: operating errors the caller handles, and the poison that stops writes.
//!
//! Two kinds of environment failure, never mixed:
//! - **Not retryable** (EIO, any other failed durable write or fdatasync of data): the store is
//!   poisoned (`StoreError::Poisoned`): fsync errors cannot be retried, the kernel may already
//!   have dropped the dirty pages. Appends and `wait_durable` fail from then on, reads keep
//!   working, and only a restart (recovery) brings writes back.
//! - **Resources** (`is_resource_error`: ENOSPC, EDQUOT, EMFILE, ENFILE, ENOMEM, EAGAIN): an
//!   answer and a log line. A full disk refuses appends (`StoreError::DiskFull`) until space
//!   returns; the store tries again by itself and clears the state, without a restart.

use std::io;

/// Errors of the shard store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store poisoned after a failed write or fdatasync, refusing writes: {0}")]
    Poisoned(String),
    #[error("message too large: {size_bytes} bytes, limit {limit_bytes}")]
    MessageTooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
    #[error("properties too large: {size_bytes} bytes, limit {limit_bytes}")]
    PropertiesTooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
    #[error("invalid properties: {0}")]
    PropertiesInvalid(String),
    #[error("invalid topic name {0:?}: 1..=127 bytes, no '/', not '.' or '..'")]
    InvalidTopic(String),
    #[error("disk full ({:.0}% used), writes are refused until space returns: {reason}", used_ratio * 100.0)]
    DiskFull {
        /// Used fraction of the store's filesystem when the state was last measured.
        used_ratio: f64,
        reason: String,
    },
    #[error(
        "store busy: commitlog space up to {allocated_end} is ready, the append needs \
         {needed_end} (space is being prepared)"
    )]
    SpaceNotReady { needed_end: u64, allocated_end: u64 },
    #[error("store busy: {unflushed_bytes} bytes wait for the disk (limit {limit_bytes})")]
    Busy {
        unflushed_bytes: u64,
        limit_bytes: u64,
    },
    #[error("store closed")]
    Closed,
    #[error("bad store configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Io(io::Error),
    #[error("corrupt record at {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    /// A read of the raw log (`read_log`) outside `[min, max]`: below the first byte still
    /// held (retention deleted it), or past the end (a replica ahead of this log).
    #[error("commitlog offset {offset} lies outside the log [{min}, {max}]")]
    OutOfRange { offset: u64, min: u64, max: u64 },
    /// Replicated bytes (`append_replicated`) that do not start where this log ends.
    #[error("replicated bytes start at commitlog offset {got}, but this log ends at {expected}")]
    ReplicaMismatch { expected: u64, got: u64 },
    /// A replicated record whose queue offset does not continue its queue here: the replica's
    /// queue and its master's have parted (the master re-created the topic, or this store's
    /// queue files were lost). Nothing of the record is stored.
    #[error(
        "replicated record at commitlog offset {offset} has queue offset {got} in \
         {topic}/{queue_id}, whose next offset here is {expected}"
    )]
    ReplicaQueueMismatch {
        offset: u64,
        topic: String,
        queue_id: u32,
        expected: u64,
        got: u64,
    },
    /// `start_empty_at` or `reset_empty_at` refused: the offset is not a segment start, the
    /// store is not empty (`start_empty_at`), or it does not take writes now.
    #[error("cannot start the commitlog at {offset}: {reason}")]
    StartRefused { offset: u64, reason: String },
    /// A write refused while `reset_empty_at` empties the store.
    #[error("the store is being emptied to start again at commitlog offset {offset}")]
    Resetting { offset: u64 },
}

/// Why the store stopped taking writes; kept so every later call reports the first cause.
#[derive(Debug, Clone)]
pub(crate) struct Poison(String);

impl Poison {
    pub(crate) fn from_io(context: &str, error: &io::Error) -> Poison {
        Poison(format!("{context}: {error}"))
    }

    pub(crate) fn new(text: impl Into<String>) -> Poison {
        Poison(text.into())
    }

    pub(crate) fn text(&self) -> &str {
        &self.0
    }

    pub(crate) fn to_error(&self) -> StoreError {
        StoreError::Poisoned(self.0.clone())
    }
}

/// Whether `error` says the machine is short of a resource (space, descriptors, memory)
/// rather than that the disk failed: such an error is retried later, never a poison.
pub(crate) fn is_resource_error(error: &io::Error) -> bool {
    matches!(
        raw_os_error_of(error),
        Some(
            libc::ENOSPC | libc::EDQUOT | libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN
        )
    )
}

/// Whether `error` is a full disk (or quota).
pub(crate) fn is_space_error(error: &io::Error) -> bool {
    matches!(raw_os_error_of(error), Some(libc::ENOSPC | libc::EDQUOT))
}

pub(crate) use crate::runtime::fs::{os_error_with_context, raw_os_error_of};

impl From<io::Error> for StoreError {
    fn from(error: io::Error) -> StoreError {
        if is_space_error(&error) {
            StoreError::DiskFull {
                used_ratio: 1.0,
                reason: error.to_string(),
            }
        } else {
            StoreError::Io(error)
        }
    }
}
