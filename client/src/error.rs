//! The client's one error type. Operating errors only: every variant is something a caller can
//! meet at run time (a broker down, a timeout, a refused request, bad input) and handle; bugs
//! are assertions, never an `Err`.

use crate::remoting::response_code_name;

/// What went wrong with a client call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection could not be opened (or timed out while opening).
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// The connection closed (or failed) before the answer came.
    #[error("connection to {addr} closed: {reason}")]
    ConnectionClosed { addr: String, reason: String },
    /// No answer within the request timeout.
    #[error("request {code} to {addr} timed out after {timeout_ms} ms")]
    Timeout {
        addr: String,
        code: i32,
        timeout_ms: u64,
    },
    /// The peer answered with a response code the call cannot treat as success.
    #[error("{addr} answered code {code} ({}): {remark}", response_code_name(*code).unwrap_or("?"))]
    Broker {
        addr: String,
        code: i32,
        remark: String,
    },
    /// No name server knows a route for the topic (and none for auto-creation either).
    #[error("no route for topic {0}")]
    NoRoute(String),
    /// The route names a broker without a reachable master address.
    #[error("no address for broker {0}")]
    NoBrokerAddress(String),
    /// A body or header from the peer could not be read.
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The caller's input breaks a documented limit or rule.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The client was used before `start` or after `shutdown`.
    #[error("client is {0}")]
    State(&'static str),
    /// A local file (the broadcasting offset store) could not be read or written.
    #[error("local I/O on {path}: {reason}")]
    LocalIo { path: String, reason: String },
}

impl ClientError {
    /// The remoting response code when the broker refused the request.
    pub fn response_code(&self) -> Option<i32> {
        match self {
            ClientError::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Network-level failures: the request may not have reached the broker, or its answer was lost.
    pub fn is_network(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::ConnectionClosed { .. }
                | ClientError::Timeout { .. }
        )
    }
}

/// Result with [`ClientError`].
pub type ClientResult<T> = Result<T, ClientError>;
