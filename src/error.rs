//! The one place where a failed request becomes a RocketMQ response code and remark.

use crate::body::BodyError;
use crate::remoting::{response_code, FieldError};
use shards::store::StoreError;

/// Why a request failed; every handler returns these and `code_and_remark` maps them.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("{0}")]
    InvalidParameter(String),
    #[error("{0}")]
    TopicNotExist(String),
    #[error("{0}")]
    NoPermission(String),
    #[error("{0}")]
    MessageIllegal(String),
    #[error("{0}")]
    ServiceNotAvailable(String),
    #[error("{0}")]
    SystemBusy(String),
    #[error("{0}")]
    QueryNotFound(String),
    #[error("{0}")]
    SubscriptionNotExist(String),
    #[error("{0}")]
    SubscriptionParseFailed(String),
    #[error("{0}")]
    SubscriptionGroupNotExist(String),
    #[error("{0}")]
    SystemError(String),
    /// A request code this server does not serve (RocketMQ's remark, leading space included).
    #[error(" request type {0} not supported")]
    NotSupported(i32),
}

impl RequestError {
    /// Answers the request with `opaque` with this error's code and remark.
    pub fn respond(&self, connection: &crate::server::Connection, opaque: i32) {
        let (code, remark) = self.code_and_remark();
        connection.respond_to(opaque, code, Some(&remark));
    }

    pub fn code_and_remark(&self) -> (i32, String) {
        let code = match self {
            RequestError::Field(_) | RequestError::Body(_) => response_code::SYSTEM_ERROR,
            RequestError::InvalidParameter(_) => response_code::INVALID_PARAMETER,
            RequestError::TopicNotExist(_) => response_code::TOPIC_NOT_EXIST,
            RequestError::NoPermission(_) => response_code::NO_PERMISSION,
            RequestError::MessageIllegal(_) => response_code::MESSAGE_ILLEGAL,
            RequestError::ServiceNotAvailable(_) => response_code::SERVICE_NOT_AVAILABLE,
            RequestError::SystemBusy(_) => response_code::SYSTEM_BUSY,
            RequestError::QueryNotFound(_) => response_code::QUERY_NOT_FOUND,
            RequestError::SubscriptionNotExist(_) => response_code::SUBSCRIPTION_NOT_EXIST,
            RequestError::SubscriptionParseFailed(_) => response_code::SUBSCRIPTION_PARSE_FAILED,
            RequestError::SubscriptionGroupNotExist(_) => {
                response_code::SUBSCRIPTION_GROUP_NOT_EXIST
            }
            RequestError::SystemError(_) => response_code::SYSTEM_ERROR,
            RequestError::NotSupported(_) => response_code::REQUEST_CODE_NOT_SUPPORTED,
        };
        (code, self.to_string())
    }
}

/// Store failures as the client sees them (RocketMQ's codes and remarks).
pub fn store_error(error: StoreError) -> RequestError {
    match error {
        StoreError::MessageTooLarge { .. } | StoreError::PropertiesTooLarge { .. } => {
            RequestError::MessageIllegal(error.to_string())
        }
        StoreError::Busy { .. } | StoreError::SpaceNotReady { .. } => RequestError::SystemBusy(
            format!("[PC_SYNCHRONIZED]broker busy, start flow control for a while: {error}"),
        ),
        // RocketMQ's remark for a put refused by a full disk (SendMessageProcessor): the
        // producers retry another broker on code 14.
        StoreError::DiskFull {
            used_ratio,
            ref reason,
        } => RequestError::ServiceNotAvailable(format!(
            "service not available now. It may be caused by one of the following reasons: \
                 the broker's disk is full [CL: {used_ratio:5.2} CQ: {used_ratio:5.2} INDEX: \
                 {used_ratio:5.2}], messages are put to the slave, message store has been shut \
                 down, etc. ({reason})"
        )),
        other => RequestError::ServiceNotAvailable(format!(
            "service not available now, the store refuses writes: {other}"
        )),
    }
}

impl From<StoreError> for RequestError {
    fn from(error: StoreError) -> RequestError {
        store_error(error)
    }
}

/// Milliseconds since the Unix epoch (the wall clock RocketMQ stamps everything with).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
