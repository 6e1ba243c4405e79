//! The one place where a failed request becomes a RocketMQ response code and remark.

use crate::protocol::BodyError;
use crate::remoting::{response_code, FieldError};

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

/// Milliseconds since the Unix epoch (the wall clock RocketMQ stamps everything with).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
