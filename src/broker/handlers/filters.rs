//! Which filter a pull applies, and the SQL92 checks of CHECK_CLIENT_CONFIG.
//!
//! A pull's expression comes from the request (`subscription` + `expressionType`) when its
//! sysFlag carries the subscription bit (C++ and Go clients, Java's first pull of a queue),
//! else from the group's subscription in its last heartbeat (Java after the first pull);
//! without either every message goes (the client filters again). SQL92 expressions are
//! compiled once per (group, topic, expression) in the shard's `SqlFilterCache`.

use crate::body::TagFilter;
use crate::broker::Broker;
use crate::error::RequestError;
use crate::filter::{ExpressionType, MessageFilter, SqlError};

pub(crate) fn parse_failed(expression: &str, error: &SqlError) -> RequestError {
    RequestError::SubscriptionParseFailed(format!(
        "parse the consumer's subscription[{expression}] failed: {error}"
    ))
}

impl Broker {
    /// The filter for `expression` of type `expression_type` (TAG when absent).
    pub(crate) fn compile_filter(
        &self,
        group: &str,
        topic: &str,
        expression: &str,
        expression_type: Option<&str>,
    ) -> Result<MessageFilter, RequestError> {
        match ExpressionType::parse(expression_type) {
            Ok(ExpressionType::Tag) => Ok(MessageFilter::Tags(TagFilter::parse(expression))),
            Ok(ExpressionType::Sql92) => self
                .sql_filters
                .borrow_mut()
                .get_or_parse(group, topic, expression)
                .map(MessageFilter::Sql)
                .map_err(|error| parse_failed(expression, &error)),
            Err(message) => Err(RequestError::SubscriptionParseFailed(message)),
        }
    }

    /// The filter of the group's heartbeat subscription to `topic`; everything without one.
    pub(crate) fn subscribed_filter(
        &self,
        group: &str,
        topic: &str,
    ) -> Result<MessageFilter, RequestError> {
        let subscription = self
            .clients
            .borrow()
            .subscription(group, topic)
            .map(|s| (s.sub_string.clone(), s.expression_type.clone()));
        match subscription {
            Some((expression, expression_type)) => {
                self.compile_filter(group, topic, &expression, Some(&expression_type))
            }
            None => Ok(MessageFilter::Tags(TagFilter::All)),
        }
    }

    /// CHECK_CLIENT_CONFIG's subscription check (Java clients call it before subscribing
    /// with SQL92): TAG passes, SQL92 must compile, other types are refused.
    pub(crate) fn check_subscription(
        &self,
        group: &str,
        topic: &str,
        expression: &str,
        expression_type: &str,
    ) -> Result<(), RequestError> {
        match ExpressionType::parse(Some(expression_type)) {
            Ok(ExpressionType::Tag) => Ok(()),
            Ok(ExpressionType::Sql92) => self
                .sql_filters
                .borrow_mut()
                .get_or_parse(group, topic, expression)
                .map(drop)
                .map_err(|error| RequestError::SubscriptionParseFailed(error.to_string())),
            Err(message) => Err(RequestError::SystemError(message)),
        }
    }
}
