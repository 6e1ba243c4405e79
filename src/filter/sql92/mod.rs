//! SQL92 property filters (`expressionType` SQL92): RocketMQ's message selector language,
//! parsed once into a tree and evaluated against each candidate message's properties.
//!
//! Pure code: no I/O, no shard state; any shard compiles and evaluates its own copies.
//!
//! The language (see `parser.rs` for the grammar and `eval.rs` for the semantics): property
//! names, string literals in single quotes, numbers (Java int/long/double), TRUE, FALSE,
//! NULL; `=`, `<>`, `<`, `<=`, `>`, `>=`, `[NOT] BETWEEN x AND y`, `[NOT] IN ('a', 'b')`,
//! `IS [NOT] NULL`, `[NOT] CONTAINS / STARTSWITH / ENDSWITH 'text'`, AND, OR, NOT, unary
//! `+`/`-`, parentheses, `--` and `/* */` comments. Every message property is a property of
//! the expression, `TAGS` and `KEYS` included. A property that is absent is NULL: comparing
//! it gives *unknown*, and a message matches only when the expression is TRUE.
//!
//! Limits: [`SQL_EXPRESSION_MAX_BYTES`] of source and [`EXPRESSION_DEPTH_MAX`] levels of
//! nesting, so that a hostile expression costs bounded memory, stack and time per message.

mod eval;
mod lexer;
mod parser;
#[cfg(test)]
mod tests;

use std::fmt;

pub use eval::EvalError;
pub use parser::EXPRESSION_DEPTH_MAX;

use crate::body::find_property;

pub use crate::limits::SQL_EXPRESSION_MAX_BYTES;

/// Why an expression does not parse: what was expected, what was found, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// Byte offset into the expression.
    pub offset: usize,
    /// 1-based line of `offset`.
    pub line: usize,
    /// 1-based column (in characters) of `offset` within its line.
    pub column: usize,
    pub message: String,
}

impl SqlError {
    pub(crate) fn at(source: &str, offset: usize, message: impl Into<String>) -> SqlError {
        let offset = offset.min(source.len());
        let before = source.get(..offset).unwrap_or(source);
        let line = 1 + before.matches('\n').count();
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        let column = 1 + before[line_start..].chars().count();
        SqlError {
            offset,
            line,
            column,
            message: message.into(),
        }
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid SQL92 expression at line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

impl std::error::Error for SqlError {}

/// A compiled SQL92 selector.
#[derive(Debug, Clone, PartialEq)]
pub struct SqlExpression {
    source: String,
    root: eval::Expr,
}

impl SqlExpression {
    /// Parses `source`, with RocketMQ's checks (see `parser.rs`).
    pub fn parse(source: &str) -> Result<SqlExpression, SqlError> {
        if source.len() > SQL_EXPRESSION_MAX_BYTES {
            return Err(SqlError::at(
                source,
                SQL_EXPRESSION_MAX_BYTES,
                format!(
                    "expression is {} bytes long, more than the {SQL_EXPRESSION_MAX_BYTES} \
                     accepted",
                    source.len()
                ),
            ));
        }
        let tokens = lexer::tokenize(source)?;
        let root = parser::Parser::new(source, tokens).parse_selector()?;
        Ok(SqlExpression {
            source: source.to_string(),
            root,
        })
    }

    /// The text it was parsed from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Three-valued result over properties given by `lookup`: `Some(true)` TRUE,
    /// `Some(false)` FALSE, `None` unknown; an error where Java's evaluation throws.
    pub fn evaluate<'a>(
        &'a self,
        lookup: &dyn Fn(&str) -> Option<&'a str>,
    ) -> Result<Option<bool>, EvalError> {
        match self.root.evaluate(lookup)? {
            eval::Value::Bool(value) => Ok(Some(value)),
            eval::Value::Null => Ok(None),
            other => Err(EvalError(format!("{other:?} is not a boolean"))),
        }
    }

    /// Whether a message with this encoded properties string (`name\x01value\x02…`)
    /// matches: the expression is TRUE (unknown and evaluation errors do not match).
    pub fn matches_properties(&self, properties: &[u8]) -> bool {
        let lookup = |name: &str| find_property(properties, name);
        matches!(self.evaluate(&lookup), Ok(Some(true)))
    }
}
