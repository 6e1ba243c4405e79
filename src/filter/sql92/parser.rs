//! Recursive-descent parser for RocketMQ's SQL92 selector grammar (`SelectorParser.jj`),
//! with the checks RocketMQ makes while it builds the expression.
//!
//! ```text
//! selector   := or END                                   (the whole is a boolean)
//! or         := and (OR and)*
//! and        := equality (AND equality)*
//! equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
//! comparison := unary ( ('>' | '>=' | '<' | '<=') unary
//!                     | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string
//!                     | [NOT] BETWEEN unary AND unary
//!                     | [NOT] IN '(' string (',' string)* ')' )*
//! unary      := '+' unary | '-' unary | NOT unary | primary
//! primary    := number | string | TRUE | FALSE | NULL | property | '(' or ')'
//! ```
//!
//! NOT binds tighter than comparisons, as in RocketMQ: `NOT a > 1` is `(NOT a) > 1`, which
//! is refused; write `NOT (a > 1)`. Checks (each one Java's): `<` `<=` `>` `>=` and BETWEEN
//! take no string, boolean or NULL literal and no boolean expression; `=` and `<>` take no
//! NULL literal (use IS NULL) and no `TRUE = 1`; IN needs a property on its left; BETWEEN
//! bounds that are literals must not be NULL and must be in order; AND, OR, NOT and the whole
//! selector need boolean operands (a bare property counts, through a boolean cast).
//!
//! Unlike RocketMQ (whose generated parser stops reading after the first complete
//! expression), anything left after the expression is an error, and so is nesting deeper
//! than [`EXPRESSION_DEPTH_MAX`]. A float literal of 0.0 is accepted (Java refuses floats
//! below `Double.MIN_VALUE`, 0.0 included).

use super::eval::{Constant, Expr, OrderOp, TextOp};
use super::lexer::{Token, TokenKind};
use super::SqlError;

pub use crate::limits::SQL_EXPRESSION_DEPTH_MAX as EXPRESSION_DEPTH_MAX;

const EXPECTED_VALUE: &str =
    "a value (a number, a 'string', TRUE, FALSE, NULL, a property name or '(')";
const EXPECTED_OPERATOR: &str = "AND, OR, a comparison (=, <>, <, <=, >, >=, IS, BETWEEN, IN, \
     CONTAINS, STARTSWITH, ENDSWITH) or the end of the expression";

/// A parsed piece: its tree, the tree's depth, and its place in the source (for messages).
struct Node {
    expr: Expr,
    depth: usize,
    start: usize,
    end: usize,
}

pub(super) struct Parser<'s> {
    source: &'s str,
    tokens: Vec<Token>,
    at: usize,
    /// Parentheses and prefix operators currently open (the parser's own recursion).
    nesting: usize,
}

impl<'s> Parser<'s> {
    pub(super) fn new(source: &'s str, tokens: Vec<Token>) -> Parser<'s> {
        Parser {
            source,
            tokens,
            at: 0,
            nesting: 0,
        }
    }

    /// The whole selector: one boolean expression, then the end of the input.
    pub(super) fn parse_selector(mut self) -> Result<Expr, SqlError> {
        let node = self.or()?;
        if self.peek() != &TokenKind::End {
            return Err(self.unexpected(EXPECTED_OPERATOR));
        }
        Ok(self.as_boolean(node)?.expr)
    }

    fn peek(&self) -> &TokenKind {
        &self.tokens[self.at].kind
    }

    fn peek_second(&self) -> &TokenKind {
        let index = (self.at + 1).min(self.tokens.len() - 1);
        &self.tokens[index].kind
    }

    fn token(&self) -> &Token {
        &self.tokens[self.at]
    }

    fn advance(&mut self) -> Token {
        let token = self.tokens[self.at].clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        token
    }

    fn eat(&mut self, kind: &TokenKind) -> bool {
        let found = self.peek() == kind;
        if found {
            self.advance();
        }
        found
    }

    fn expect(&mut self, kind: &TokenKind, expected: &str) -> Result<Token, SqlError> {
        if self.peek() == kind {
            Ok(self.advance())
        } else {
            Err(self.unexpected(expected))
        }
    }

    fn unexpected(&self, expected: &str) -> SqlError {
        let token = self.token();
        SqlError::at(
            self.source,
            token.start,
            format!("expected {expected}, found {}", token.kind.describe()),
        )
    }

    fn error_at(&self, node: &Node, message: impl std::fmt::Display) -> SqlError {
        SqlError::at(self.source, node.start, message.to_string())
    }

    fn text(&self, node: &Node) -> &'s str {
        &self.source[node.start..node.end]
    }

    /// A node over children whose deepest is `child_depth` deep (0 for a leaf).
    fn node(
        &self,
        expr: Expr,
        child_depth: usize,
        start: usize,
        end: usize,
    ) -> Result<Node, SqlError> {
        let depth = child_depth + 1;
        if depth > EXPRESSION_DEPTH_MAX {
            return Err(SqlError::at(
                self.source,
                start,
                format!("expression nests deeper than {EXPRESSION_DEPTH_MAX} levels"),
            ));
        }
        Ok(Node {
            expr,
            depth,
            start,
            end,
        })
    }

    fn enter(&mut self) -> Result<(), SqlError> {
        self.nesting += 1;
        if self.nesting > EXPRESSION_DEPTH_MAX {
            return Err(SqlError::at(
                self.source,
                self.token().start,
                format!("expression nests deeper than {EXPRESSION_DEPTH_MAX} levels"),
            ));
        }
        Ok(())
    }

    /// RocketMQ's `asBooleanExpression`: boolean expressions pass, a property is cast, the
    /// rest (numbers, strings, negations) cannot be a condition.
    fn as_boolean(&self, node: Node) -> Result<Node, SqlError> {
        match &node.expr {
            Expr::Property(_) => {
                let (start, end) = (node.start, node.end);
                let cast = Expr::BooleanCast(Box::new(node.expr));
                Ok(Node {
                    expr: cast,
                    depth: node.depth + 1,
                    start,
                    end,
                })
            }
            expr if is_boolean(expr) => Ok(node),
            _ => Err(self.error_at(
                &node,
                format!(
                    "expected a condition, found {}, which is not a boolean value",
                    self.text(&node)
                ),
            )),
        }
    }

    /// AND / OR chains, flattened into one node per chain.
    fn chain(
        &mut self,
        operator: &TokenKind,
        operand: fn(&mut Self) -> Result<Node, SqlError>,
        build: fn(Vec<Expr>) -> Expr,
    ) -> Result<Node, SqlError> {
        let first = operand(self)?;
        if self.peek() != operator {
            return Ok(first);
        }
        let (start, mut end, mut depth) = (first.start, first.end, first.depth);
        let mut exprs = vec![self.as_boolean(first)?.expr];
        while self.eat(operator) {
            let next = operand(self)?;
            let next = self.as_boolean(next)?;
            (end, depth) = (next.end, depth.max(next.depth));
            exprs.push(next.expr);
        }
        // The boolean cast of a property adds a level.
        self.node(build(exprs), depth + 1, start, end)
    }

    fn or(&mut self) -> Result<Node, SqlError> {
        self.chain(&TokenKind::Or, Self::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Node, SqlError> {
        self.chain(&TokenKind::And, Self::equality, Expr::And)
    }

    fn equality(&mut self) -> Result<Node, SqlError> {
        let mut left = self.comparison()?;
        loop {
            left = match self.peek() {
                TokenKind::Equal | TokenKind::NotEqual => {
                    let negated = self.advance().kind == TokenKind::NotEqual;
                    let right = self.comparison()?;
                    self.check_equal_operands(&left, &right)?;
                    let (start, end) = (left.start, right.end);
                    let depth = left.depth.max(right.depth);
                    let equal = Expr::Equal(Box::new(left.expr), Box::new(right.expr));
                    let node = self.node(equal, depth, start, end)?;
                    if negated {
                        self.not(node, start)?
                    } else {
                        node
                    }
                }
                TokenKind::Is => {
                    self.advance();
                    let negated = self.eat(&TokenKind::Not);
                    let null = self.expect(
                        &TokenKind::Null,
                        if negated { "NULL" } else { "NULL or NOT NULL" },
                    )?;
                    let (start, end) = (left.start, null.end);
                    let null = Box::new(Expr::Constant(Constant::Null));
                    let depth = left.depth;
                    let is_null = Expr::Equal(Box::new(left.expr), null);
                    let node = self.node(is_null, depth, start, end)?;
                    if negated {
                        self.not(node, start)?
                    } else {
                        node
                    }
                }
                _ => return Ok(left),
            };
        }
    }

    fn not(&self, operand: Node, start: usize) -> Result<Node, SqlError> {
        let (end, depth) = (operand.end, operand.depth);
        self.node(Expr::Not(Box::new(operand.expr)), depth, start, end)
    }

    fn comparison(&mut self) -> Result<Node, SqlError> {
        let mut left = self.unary()?;
        loop {
            let negated = self.peek() == &TokenKind::Not
                && matches!(
                    self.peek_second(),
                    TokenKind::Contains
                        | TokenKind::StartsWith
                        | TokenKind::EndsWith
                        | TokenKind::Between
                        | TokenKind::In
                );
            if negated {
                self.advance();
            }
            left = match self.peek().clone() {
                TokenKind::Greater => self.order(left, OrderOp::Greater)?,
                TokenKind::GreaterEqual => self.order(left, OrderOp::GreaterEqual)?,
                TokenKind::Less => self.order(left, OrderOp::Less)?,
                TokenKind::LessEqual => self.order(left, OrderOp::LessEqual)?,
                TokenKind::Contains => self.text_match(left, TextOp::Contains, negated)?,
                TokenKind::StartsWith => self.text_match(left, TextOp::StartsWith, negated)?,
                TokenKind::EndsWith => self.text_match(left, TextOp::EndsWith, negated)?,
                TokenKind::Between => self.between(left, negated)?,
                TokenKind::In => self.in_list(left, negated)?,
                _ => return Ok(left),
            };
        }
    }

    fn order(&mut self, left: Node, op: OrderOp) -> Result<Node, SqlError> {
        self.advance();
        let right = self.unary()?;
        self.order_node(op, left, right)
    }

    fn order_node(&self, op: OrderOp, left: Node, right: Node) -> Result<Node, SqlError> {
        self.check_orderable(&left)?;
        self.check_orderable(&right)?;
        let (start, end, depth) = (left.start, right.end, left.depth.max(right.depth));
        let expr = Expr::Order(op, Box::new(left.expr), Box::new(right.expr));
        self.node(expr, depth, start, end)
    }

    fn text_match(&mut self, left: Node, op: TextOp, negated: bool) -> Result<Node, SqlError> {
        self.advance();
        let search = self.string_literal()?;
        let end = self.tokens[self.at.saturating_sub(1)].end;
        let expr = Expr::Text {
            op,
            operand: Box::new(left.expr),
            search,
            negated,
        };
        self.node(expr, left.depth, left.start, end)
    }

    fn string_literal(&mut self) -> Result<String, SqlError> {
        match self.peek().clone() {
            TokenKind::String(text) => {
                self.advance();
                Ok(text)
            }
            _ => Err(self.unexpected("a 'string' literal")),
        }
    }

    /// `v BETWEEN low AND high` is `v >= low AND v <= high`; NOT BETWEEN is
    /// `v < low OR v > high`.
    fn between(&mut self, value: Node, negated: bool) -> Result<Node, SqlError> {
        self.advance();
        let low = self.unary()?;
        self.expect(&TokenKind::And, "AND between the two bounds of BETWEEN")?;
        let high = self.unary()?;
        if let (Expr::Constant(low_value), Expr::Constant(high_value)) = (&low.expr, &high.expr) {
            if *low_value == Constant::Null || *high_value == Constant::Null {
                return Err(self.error_at(&low, "the bounds of BETWEEN must not be NULL"));
            }
            self.check_orderable(&low)?;
            self.check_orderable(&high)?;
            if constant_greater(low_value, high_value) {
                return Err(self.error_at(
                    &low,
                    format!(
                        "the lower bound of BETWEEN ({}) must not be greater than its upper \
                         bound ({})",
                        self.text(&low),
                        self.text(&high)
                    ),
                ));
            }
        }
        let (first_op, second_op) = if negated {
            (OrderOp::Less, OrderOp::Greater)
        } else {
            (OrderOp::GreaterEqual, OrderOp::LessEqual)
        };
        let (start, end) = (value.start, high.end);
        let value_copy = Node {
            expr: value.expr.clone(),
            ..value
        };
        let first = self.order_node(first_op, value_copy, low)?;
        let second = self.order_node(second_op, value, high)?;
        let depth = first.depth.max(second.depth);
        let pair = vec![first.expr, second.expr];
        let expr = if negated {
            Expr::Or(pair)
        } else {
            Expr::And(pair)
        };
        self.node(expr, depth, start, end)
    }

    fn in_list(&mut self, left: Node, negated: bool) -> Result<Node, SqlError> {
        let Expr::Property(property) = &left.expr else {
            return Err(self.error_at(
                &left,
                format!(
                    "IN needs a property name on its left, found {}",
                    self.text(&left)
                ),
            ));
        };
        let property = property.clone();
        self.advance();
        self.expect(&TokenKind::LeftParen, "'(' after IN")?;
        let mut values = vec![self.string_literal()?];
        while self.eat(&TokenKind::Comma) {
            values.push(self.string_literal()?);
        }
        let close = self.expect(&TokenKind::RightParen, "',' or ')' in the IN list")?;
        let expr = Expr::In {
            property,
            values,
            negated,
        };
        self.node(expr, left.depth, left.start, close.end)
    }

    fn unary(&mut self) -> Result<Node, SqlError> {
        let start = self.token().start;
        let prefix = self.peek().clone();
        if !matches!(prefix, TokenKind::Plus | TokenKind::Minus | TokenKind::Not) {
            return self.primary();
        }
        self.advance();
        self.enter()?;
        let operand = self.unary()?;
        self.nesting -= 1;
        match prefix {
            TokenKind::Plus => Ok(Node { start, ..operand }),
            TokenKind::Minus => {
                let (end, depth) = (operand.end, operand.depth);
                self.node(Expr::Negate(Box::new(operand.expr)), depth, start, end)
            }
            _ => {
                let operand = self.as_boolean(operand)?;
                self.not(operand, start)
            }
        }
    }

    fn primary(&mut self) -> Result<Node, SqlError> {
        let token = self.token().clone();
        let constant = match &token.kind {
            TokenKind::Decimal(value) => Some(match i32::try_from(*value) {
                Ok(int) => Constant::Int(int),
                Err(_) => Constant::Long(*value),
            }),
            TokenKind::FloatingPoint(value) => Some(Constant::Double(*value)),
            TokenKind::String(text) => Some(Constant::Str(text.clone())),
            TokenKind::True => Some(Constant::Bool(true)),
            TokenKind::False => Some(Constant::Bool(false)),
            TokenKind::Null => Some(Constant::Null),
            _ => None,
        };
        if let Some(constant) = constant {
            self.advance();
            return self.node(Expr::Constant(constant), 0, token.start, token.end);
        }
        match &token.kind {
            TokenKind::Identifier(name) => {
                self.advance();
                self.node(Expr::Property(name.clone()), 0, token.start, token.end)
            }
            TokenKind::LeftParen => {
                self.advance();
                self.enter()?;
                let inner = self.or()?;
                let close = self.expect(
                    &TokenKind::RightParen,
                    &format!("')' or {EXPECTED_OPERATOR}"),
                )?;
                self.nesting -= 1;
                Ok(Node {
                    start: token.start,
                    end: close.end,
                    ..inner
                })
            }
            _ => Err(self.unexpected(EXPECTED_VALUE)),
        }
    }

    /// Java's `checkLessThanOperand`: only numbers (or non-boolean expressions) compare.
    fn check_orderable(&self, node: &Node) -> Result<(), SqlError> {
        let orderable = match &node.expr {
            Expr::Constant(constant) => matches!(
                constant,
                Constant::Int(_) | Constant::Long(_) | Constant::Double(_)
            ),
            expr => !is_boolean(expr),
        };
        if orderable {
            return Ok(());
        }
        Err(self.error_at(
            node,
            format!(
                "{} cannot be compared with <, <=, >, >= or BETWEEN (only numbers can)",
                self.text(node)
            ),
        ))
    }

    /// Java's `checkEqualOperand` and `checkEqualOperandCompatability`.
    fn check_equal_operands(&self, left: &Node, right: &Node) -> Result<(), SqlError> {
        for node in [left, right] {
            if node.expr == Expr::Constant(Constant::Null) {
                return Err(self.error_at(
                    node,
                    "NULL cannot be compared with = or <>: write IS NULL or IS NOT NULL",
                ));
            }
        }
        if let (Expr::Constant(Constant::Bool(_)), Expr::Constant(other)) =
            (&left.expr, &right.expr)
        {
            if !matches!(other, Constant::Bool(_)) {
                return Err(self.error_at(
                    left,
                    format!(
                        "{} cannot be compared with {}",
                        self.text(left),
                        self.text(right)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Whether literal `low` is greater than literal `high` (numbers only; others never are).
fn constant_greater(low: &Constant, high: &Constant) -> bool {
    let number = |constant: &Constant| match constant {
        Constant::Int(value) => Some(f64::from(*value)),
        Constant::Long(value) => Some(*value as f64),
        Constant::Double(value) => Some(*value),
        _ => None,
    };
    match (low, high) {
        (Constant::Long(l), Constant::Long(h)) => l > h,
        (Constant::Int(l), Constant::Long(h)) => i64::from(*l) > *h,
        (Constant::Long(l), Constant::Int(h)) => *l > i64::from(*h),
        (Constant::Int(l), Constant::Int(h)) => l > h,
        _ => match (number(low), number(high)) {
            (Some(l), Some(h)) => l > h,
            _ => false,
        },
    }
}

/// Whether RocketMQ treats the expression as a `BooleanExpression`.
fn is_boolean(expr: &Expr) -> bool {
    match expr {
        Expr::Constant(Constant::Null | Constant::Bool(_)) => true,
        Expr::Constant(_) | Expr::Property(_) | Expr::Negate(_) => false,
        Expr::Not(_)
        | Expr::BooleanCast(_)
        | Expr::And(_)
        | Expr::Or(_)
        | Expr::Equal(..)
        | Expr::Order(..)
        | Expr::In { .. }
        | Expr::Text { .. } => true,
    }
}
