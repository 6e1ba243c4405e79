//! Message filters a pull applies on the broker: TAG expressions (`TagA || TagB`, matched by
//! tag hash on the consume queue, exactly on the client) and SQL92 property filters
//! (evaluated against each candidate message's stored properties).
//!
//! RocketMQ filters in two stages, and so does the store here: `isMatchedByConsumeQueue` on
//! each unit's tags code (TAG filters; free, no record is read), then
//! `isMatchedByCommitLog` on the record's properties (SQL92 filters; the record is read and
//! its properties found). A [`MessageFilter`] says which stages it needs, so a TAG pull never
//! reads a record to filter it.
//!
//! Compiled SQL expressions are kept per shard in a [`SqlFilterCache`] keyed by
//! (group, topic), so a consumer's expression is parsed once, not on every pull.

pub mod sql92;

use std::collections::HashMap;
use std::rc::Rc;

use crate::body::{TagFilter, EXPRESSION_TYPE_SQL92, EXPRESSION_TYPE_TAG};

pub use sql92::{SqlError, SqlExpression};

/// The filter of one pull.
#[derive(Debug, Clone)]
pub enum MessageFilter {
    /// A TAG expression: consume-queue stage only.
    Tags(TagFilter),
    /// A SQL92 expression: every unit is a candidate, its record's properties decide.
    Sql(Rc<SqlExpression>),
}

impl MessageFilter {
    /// The consume-queue stage (Java's `isMatchedByConsumeQueue`).
    pub fn matches_tags_code(&self, tags_code: i64) -> bool {
        match self {
            MessageFilter::Tags(filter) => filter.matches_code(tags_code),
            // RocketMQ's bloom-filter prefilter is not kept here: every unit goes on.
            MessageFilter::Sql(_) => true,
        }
    }

    /// The commitlog stage, if this filter has one (Java's `isMatchedByCommitLog`).
    pub fn sql(&self) -> Option<&SqlExpression> {
        match self {
            MessageFilter::Tags(_) => None,
            MessageFilter::Sql(expression) => Some(expression),
        }
    }
}

/// An `expressionType` a subscription may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressionType {
    Tag,
    Sql92,
}

impl ExpressionType {
    /// `TAG` (also when absent or empty) or `SQL92`, any case; anything else is refused with
    /// the message a client sees.
    pub fn parse(name: Option<&str>) -> Result<ExpressionType, String> {
        match name.map(str::trim).filter(|name| !name.is_empty()) {
            None => Ok(ExpressionType::Tag),
            Some(name) if name.eq_ignore_ascii_case(EXPRESSION_TYPE_TAG) => Ok(ExpressionType::Tag),
            Some(name) if name.eq_ignore_ascii_case(EXPRESSION_TYPE_SQL92) => {
                Ok(ExpressionType::Sql92)
            }
            Some(name) => Err(format!(
                "The broker does not support consumer to filter message by {name}; use \
                 {EXPRESSION_TYPE_TAG} or {EXPRESSION_TYPE_SQL92}"
            )),
        }
    }
}

pub use crate::limits::SQL_FILTER_CACHE_ENTRIES_MAX;

struct CachedExpression {
    source: String,
    compiled: Result<Rc<SqlExpression>, SqlError>,
}

/// Compiled SQL92 expressions of one shard, per (group, topic). A group that changes its
/// expression replaces its entry; parse failures are cached too (as RocketMQ's parser cache
/// does), so a client retrying a bad expression costs a lookup.
#[derive(Default)]
pub struct SqlFilterCache {
    entries: HashMap<(String, String), CachedExpression>,
}

impl SqlFilterCache {
    /// The compiled `expression` for (group, topic), parsing it only when it changed.
    pub fn get_or_parse(
        &mut self,
        group: &str,
        topic: &str,
        expression: &str,
    ) -> Result<Rc<SqlExpression>, SqlError> {
        let key = (group.to_string(), topic.to_string());
        if let Some(cached) = self.entries.get(&key) {
            if cached.source == expression {
                return cached.compiled.clone();
            }
        }
        let compiled = SqlExpression::parse(expression).map(Rc::new);
        if self.entries.len() >= SQL_FILTER_CACHE_ENTRIES_MAX && !self.entries.contains_key(&key) {
            self.entries.clear();
        }
        let entry = CachedExpression {
            source: expression.to_string(),
            compiled: compiled.clone(),
        };
        self.entries.insert(key, entry);
        compiled
    }

    /// Entries held (for tests and runtime info).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expression_types() {
        assert_eq!(ExpressionType::parse(None), Ok(ExpressionType::Tag));
        assert_eq!(ExpressionType::parse(Some("")), Ok(ExpressionType::Tag));
        assert_eq!(ExpressionType::parse(Some("tag")), Ok(ExpressionType::Tag));
        assert_eq!(
            ExpressionType::parse(Some("sql92")),
            Ok(ExpressionType::Sql92)
        );
        let refused = ExpressionType::parse(Some("CLASS")).unwrap_err();
        assert!(refused.contains("by CLASS"), "{refused}");
    }

    #[test]
    fn cache_parses_once_per_group_topic_and_expression() {
        let mut cache = SqlFilterCache::default();
        let first = cache.get_or_parse("g", "T", "a > 1").unwrap();
        let again = cache.get_or_parse("g", "T", "a > 1").unwrap();
        assert!(Rc::ptr_eq(&first, &again));
        let changed = cache.get_or_parse("g", "T", "a > 2").unwrap();
        assert!(!Rc::ptr_eq(&first, &changed));
        assert_eq!(cache.len(), 1);
        cache.get_or_parse("g2", "T", "a > 2").unwrap();
        assert_eq!(cache.len(), 2);
        let bad = cache.get_or_parse("g", "T", "a >").unwrap_err();
        assert_eq!(cache.get_or_parse("g", "T", "a >").unwrap_err(), bad);
        for n in 0..SQL_FILTER_CACHE_ENTRIES_MAX + 10 {
            cache.get_or_parse(&format!("g{n}"), "T", "a > 1").unwrap();
        }
        assert!(cache.len() <= SQL_FILTER_CACHE_ENTRIES_MAX);
    }

    #[test]
    fn stages() {
        let tags = MessageFilter::Tags(TagFilter::parse("TagA"));
        assert!(tags.sql().is_none());
        assert!(!tags.matches_tags_code(1));
        let sql = MessageFilter::Sql(Rc::new(SqlExpression::parse("a = 1").unwrap()));
        assert!(sql.matches_tags_code(1));
        assert!(sql
            .sql()
            .is_some_and(|e| e.matches_properties(b"a\x011\x02")));
    }
}
