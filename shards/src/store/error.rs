//! Store errors: operating errors the caller handles, and the poison that stops writes.
//!
//! A failed write or fdatasync poisons the store (fsync errors are not retryable: the kernel
//! may already have dropped the dirty pages). ENOSPC poisons it too, as `DiskFull`: the store
//! refuses writes until the process restarts and recovery runs again.

use std::io;

use glommio::GlommioError;

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
    #[error("disk full (ENOSPC): the store refuses writes until it is reopened: {0}")]
    DiskFull(String),
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
}

/// Why the store stopped taking writes; kept so every later call reports the first cause.
#[derive(Debug, Clone)]
pub(crate) enum Poison {
    DiskFull(String),
    Failed(String),
}

impl Poison {
    pub(crate) fn from_io(context: &str, error: &io::Error) -> Poison {
        let text = format!("{context}: {error}");
        if raw_os_error_of(error) == Some(libc::ENOSPC) {
            Poison::DiskFull(text)
        } else {
            Poison::Failed(text)
        }
    }

    pub(crate) fn to_error(&self) -> StoreError {
        match self {
            Poison::DiskFull(text) => StoreError::DiskFull(text.clone()),
            Poison::Failed(text) => StoreError::Poisoned(text.clone()),
        }
    }
}

/// glommio's error as an io::Error that keeps the OS error code (glommio's own conversion
/// drops it for errors that carry a path, and we need ENOSPC and EOPNOTSUPP).
pub(crate) fn io_error<T>(error: GlommioError<T>) -> io::Error {
    match error {
        GlommioError::IoError(e) => e,
        GlommioError::EnhancedIoError {
            source,
            op,
            path,
            fd,
        } => {
            let context = format!("{op} {path:?} (fd {fd:?})");
            match source.raw_os_error() {
                Some(code) => os_error_with_context(code, context),
                None => io::Error::new(source.kind(), format!("{context}: {source}")),
            }
        }
        other => io::Error::from(other),
    }
}

/// An io::Error for OS error `code` that also says what we were doing.
pub(crate) fn os_error_with_context(code: i32, context: String) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, OsErrorWithContext { code, context })
}

/// An OS error code plus what we were doing; `raw_os_error_of` finds the code again.
#[derive(Debug)]
pub(crate) struct OsErrorWithContext {
    pub(crate) code: i32,
    context: String,
}

impl std::fmt::Display for OsErrorWithContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.context,
            io::Error::from_raw_os_error(self.code)
        )
    }
}

impl std::error::Error for OsErrorWithContext {}

/// The OS error code of `error`, also when it was wrapped by `io_error`.
pub(crate) fn raw_os_error_of(error: &io::Error) -> Option<i32> {
    error.raw_os_error().or_else(|| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<OsErrorWithContext>())
            .map(|e| e.code)
    })
}

impl From<io::Error> for StoreError {
    fn from(error: io::Error) -> StoreError {
        if raw_os_error_of(&error) == Some(libc::ENOSPC) {
            StoreError::DiskFull(error.to_string())
        } else {
            StoreError::Io(error)
        }
    }
}

impl<T> From<GlommioError<T>> for StoreError {
    fn from(error: GlommioError<T>) -> StoreError {
        StoreError::from(io_error(error))
    }
}
