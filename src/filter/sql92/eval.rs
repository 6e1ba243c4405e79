//! The expression tree and its evaluation over one message's properties, with the semantics
//! of RocketMQ's `filter` module (ActiveMQ's selector classes as RocketMQ changed them).
//!
//! Values are three-valued: a comparison with an absent property is *unknown* (`Null`), AND
//! and OR follow SQL's three-valued logic, and a message matches only when the whole
//! expression is TRUE. Property values are strings; comparing one with a number converts the
//! string (`a > 3` with `a = "5"` compares 5 with 3). Where Java throws during evaluation (a
//! string that is not a number compared with a number, `>` between two strings that are not
//! numbers, a boolean compared with a string), evaluation stops with an [`EvalError`] and the
//! message does not match, as RocketMQ's `isMatchedByCommitLog` catches and answers false.
//!
//! | Java class | here | unknown when |
//! |---|---|---|
//! | `ComparisonExpression` `>` `>=` `<` `<=` | [`Expr::Order`] | either side is null |
//! | `ComparisonExpression` `=` (and IS NULL) | [`Expr::Equal`] | only the left side is null |
//! | `UnaryInExpression` IN / NOT IN | [`Expr::In`] | the property is absent |
//! | CONTAINS / STARTSWITH / ENDSWITH (NOT …) | [`Expr::Text`] | never: absent is FALSE |
//! | `LogicExpression` AND / OR (chains flattened) | [`Expr::And`] / [`Expr::Or`] | SQL rules |
//! | `UnaryExpression` NOT, negate, boolean cast | [`Expr::Not`], [`Expr::Negate`], [`Expr::BooleanCast`] | operand null |

use std::cmp::Ordering;

/// A literal of the expression.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Constant {
    Null,
    Bool(bool),
    /// A decimal literal within Java's int range.
    Int(i32),
    /// A decimal literal outside the int range.
    Long(i64),
    Double(f64),
    Str(String),
}

/// `<`, `<=`, `>`, `>=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OrderOp {
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
}

impl OrderOp {
    fn holds(self, ordering: Ordering) -> bool {
        match self {
            OrderOp::Less => ordering == Ordering::Less,
            OrderOp::LessEqual => ordering != Ordering::Greater,
            OrderOp::Greater => ordering == Ordering::Greater,
            OrderOp::GreaterEqual => ordering != Ordering::Less,
        }
    }
}

/// CONTAINS, STARTSWITH, ENDSWITH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TextOp {
    Contains,
    StartsWith,
    EndsWith,
}

/// A parsed expression. BETWEEN, `<>`, IS NULL and IS NOT NULL are built from these nodes
/// the way RocketMQ builds them (BETWEEN is `>= AND <=`, `<>` is `NOT =`, IS NULL is `= NULL`).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Expr {
    Constant(Constant),
    Property(String),
    Negate(Box<Expr>),
    Not(Box<Expr>),
    /// A property used where a boolean is needed: TRUE only if its value is a boolean TRUE,
    /// which a string property never is.
    BooleanCast(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Equal(Box<Expr>, Box<Expr>),
    Order(OrderOp, Box<Expr>, Box<Expr>),
    In {
        property: String,
        values: Vec<String>,
        negated: bool,
    },
    Text {
        op: TextOp,
        operand: Box<Expr>,
        search: String,
        negated: bool,
    },
}

/// A value during evaluation; strings borrow from the expression or the message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Value<'a> {
    Null,
    Bool(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    Str(&'a str),
}

/// Why evaluation stopped where Java throws; the message then does not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(pub(super) String);

type Lookup<'l, 'a> = &'l dyn Fn(&str) -> Option<&'a str>;

impl Expr {
    /// Evaluates the expression; `lookup` gives a property's value (None when absent).
    pub(super) fn evaluate<'a>(&'a self, lookup: Lookup<'_, 'a>) -> Result<Value<'a>, EvalError> {
        Ok(match self {
            Expr::Constant(constant) => constant_value(constant),
            Expr::Property(name) => lookup(name).map_or(Value::Null, Value::Str),
            Expr::Negate(operand) => negate(operand.evaluate(lookup)?),
            Expr::Not(operand) => match as_bool(operand.evaluate(lookup)?)? {
                Some(value) => Value::Bool(!value),
                None => Value::Null,
            },
            Expr::BooleanCast(operand) => match operand.evaluate(lookup)? {
                Value::Null => Value::Null,
                Value::Bool(value) => Value::Bool(value),
                _ => Value::Bool(false),
            },
            Expr::And(operands) => logic(operands, lookup, false)?,
            Expr::Or(operands) => logic(operands, lookup, true)?,
            Expr::Equal(left, right) => equal(left.evaluate(lookup)?, right.evaluate(lookup)?)?,
            Expr::Order(op, left, right) => order(*op, left, right, lookup)?,
            Expr::In {
                property,
                values,
                negated,
            } => match lookup(property) {
                None => Value::Null,
                Some(value) => Value::Bool(values.iter().any(|v| v == value) != *negated),
            },
            Expr::Text {
                op,
                operand,
                search,
                negated,
            } => text(*op, operand.evaluate(lookup)?, search, *negated),
        })
    }
}

fn constant_value(constant: &Constant) -> Value<'_> {
    match constant {
        Constant::Null => Value::Null,
        Constant::Bool(value) => Value::Bool(*value),
        Constant::Int(value) => Value::Int(*value),
        Constant::Long(value) => Value::Long(*value),
        Constant::Double(value) => Value::Double(*value),
        Constant::Str(value) => Value::Str(value),
    }
}

/// Java's negate: numbers change sign (int and long wrap like Java), anything else is null.
fn negate(value: Value<'_>) -> Value<'_> {
    match value {
        Value::Int(v) => Value::Int(v.wrapping_neg()),
        Value::Long(v) => Value::Long(v.wrapping_neg()),
        Value::Double(v) => Value::Double(-v),
        _ => Value::Null,
    }
}

/// A logic operand: TRUE, FALSE or unknown. Anything else is Java's ClassCastException.
fn as_bool(value: Value<'_>) -> Result<Option<bool>, EvalError> {
    match value {
        Value::Null => Ok(None),
        Value::Bool(value) => Ok(Some(value)),
        other => Err(EvalError(format!("{other:?} is not a boolean"))),
    }
}

/// AND (`decisive` false) or OR (`decisive` true): the first operand equal to `decisive`
/// decides (later operands are not evaluated); otherwise unknown if any operand was.
fn logic<'a>(
    operands: &'a [Expr],
    lookup: Lookup<'_, 'a>,
    decisive: bool,
) -> Result<Value<'a>, EvalError> {
    let mut unknown = false;
    for operand in operands {
        match as_bool(operand.evaluate(lookup)?)? {
            Some(value) if value == decisive => return Ok(Value::Bool(decisive)),
            Some(_) => {}
            None => unknown = true,
        }
    }
    Ok(if unknown {
        Value::Null
    } else {
        Value::Bool(!decisive)
    })
}

/// Java's `=`: null = null is TRUE (that is IS NULL), null = x unknown, x = null FALSE;
/// equal values are TRUE, otherwise the values are compared with conversions.
fn equal<'a>(left: Value<'a>, right: Value<'a>) -> Result<Value<'a>, EvalError> {
    let equal = match (left, right) {
        (Value::Null, Value::Null) => true,
        (Value::Null, _) => return Ok(Value::Null),
        (_, Value::Null) => false,
        (Value::Double(l), Value::Double(r)) => java_double_bits(l) == java_double_bits(r),
        (l, r) if l == r => true,
        (l, r) => compare(l, r)? == Ordering::Equal,
    };
    Ok(Value::Bool(equal))
}

fn order<'a>(
    op: OrderOp,
    left: &'a Expr,
    right: &'a Expr,
    lookup: Lookup<'_, 'a>,
) -> Result<Value<'a>, EvalError> {
    let left = left.evaluate(lookup)?;
    if left == Value::Null {
        return Ok(Value::Null);
    }
    let right = right.evaluate(lookup)?;
    let ordering = match (left, right) {
        (_, Value::Null) => return Ok(Value::Null),
        // Two strings are compared as doubles, or not at all.
        (Value::Str(l), Value::Str(r)) => match (java_parse_double(l), java_parse_double(r)) {
            (Some(l), Some(r)) => java_double_compare(l, r),
            _ => {
                return Err(EvalError(format!(
                    "it is illegal to compare strings by <, <=, > or >=: {l:?}, {r:?}"
                )))
            }
        },
        (l, r) => compare(l, r)?,
    };
    Ok(Value::Bool(op.holds(ordering)))
}

fn text<'a>(op: TextOp, value: Value<'a>, search: &str, negated: bool) -> Value<'a> {
    let Value::Str(value) = value else {
        return Value::Bool(false);
    };
    if search.is_empty() {
        return Value::Bool(false);
    }
    let found = match op {
        TextOp::Contains => value.contains(search),
        TextOp::StartsWith => value.starts_with(search),
        TextOp::EndsWith => value.ends_with(search),
    };
    Value::Bool(found != negated)
}

/// Java's `ComparisonExpression.__compare` with string conversion on: numbers widen to the
/// wider side, a string facing a number or boolean is converted to that type (failing as
/// Java's `valueOf` fails), and unrelated types compare as "less" (Java's -1).
fn compare(left: Value<'_>, right: Value<'_>) -> Result<Ordering, EvalError> {
    use Value::{Bool, Double, Int, Long, Null, Str};
    Ok(match (left, right) {
        (Null, _) | (_, Null) => return Err(EvalError("cannot compare with null".into())),
        (Bool(l), Bool(r)) => l.cmp(&r),
        (Int(l), Int(r)) => l.cmp(&r),
        (Long(l), Long(r)) => l.cmp(&r),
        (Double(l), Double(r)) => java_double_compare(l, r),
        (Str(l), Str(r)) => l.encode_utf16().cmp(r.encode_utf16()),
        // Java casts the Boolean to String here and throws ClassCastException.
        (Bool(_), Str(r)) => return Err(EvalError(format!("cannot compare a boolean with {r:?}"))),
        (Int(l), Long(r)) => i64::from(l).cmp(&r),
        (Int(l), Double(r)) => java_double_compare(f64::from(l), r),
        (Int(l), Str(r)) => l.cmp(&parse_number::<i32>(r, "an int")?),
        (Long(l), Int(r)) => l.cmp(&i64::from(r)),
        (Long(l), Double(r)) => java_double_compare(l as f64, r),
        (Long(l), Str(r)) => l.cmp(&parse_number::<i64>(r, "a long")?),
        (Double(l), Int(r)) => java_double_compare(l, f64::from(r)),
        (Double(l), Long(r)) => java_double_compare(l, r as f64),
        (Double(l), Str(r)) => java_double_compare(l, parse_double(r)?),
        (Str(l), Bool(r)) => l.eq_ignore_ascii_case("true").cmp(&r),
        (Str(l), Int(r)) => parse_number::<i32>(l, "an int")?.cmp(&r),
        (Str(l), Long(r)) => parse_number::<i64>(l, "a long")?.cmp(&r),
        (Str(l), Double(r)) => java_double_compare(parse_double(l)?, r),
        (Bool(_) | Int(_) | Long(_) | Double(_), _) => Ordering::Less,
    })
}

/// Java's `Integer.valueOf` / `Long.valueOf`: optional sign, ASCII digits, nothing else.
fn parse_number<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, EvalError> {
    text.parse()
        .map_err(|_| EvalError(format!("{text:?} is not {what}")))
}

fn parse_double(text: &str) -> Result<f64, EvalError> {
    java_parse_double(text).ok_or_else(|| EvalError(format!("{text:?} is not a double")))
}

/// Java's `Double.valueOf` for decimal text: surrounding control characters and blanks
/// trimmed, optional sign, `NaN`, `Infinity`, digits with an optional point and exponent, an
/// optional `f`/`d` suffix. (Java's hexadecimal floats are not accepted.)
pub(super) fn java_parse_double(text: &str) -> Option<f64> {
    let trimmed = text.trim_matches(|c: char| c <= ' ');
    let (negative, unsigned) = match trimmed.as_bytes().first()? {
        b'-' => (true, &trimmed[1..]),
        b'+' => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let magnitude = match unsigned {
        "NaN" => f64::NAN,
        "Infinity" => f64::INFINITY,
        _ => {
            let digits = unsigned
                .strip_suffix(['f', 'F', 'd', 'D'])
                .unwrap_or(unsigned);
            let starts_well = digits
                .as_bytes()
                .first()
                .is_some_and(|b| b.is_ascii_digit() || *b == b'.');
            let plain = digits
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
            if !starts_well || !plain {
                return None;
            }
            digits.parse::<f64>().ok()?
        }
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// Java's `Double.doubleToLongBits`: every NaN is the one canonical NaN.
fn java_double_bits(value: f64) -> i64 {
    if value.is_nan() {
        0x7ff8_0000_0000_0000
    } else {
        value.to_bits() as i64
    }
}

/// Java's `Double.compare`: -0.0 below 0.0, NaN above everything and equal to itself.
fn java_double_compare(left: f64, right: f64) -> Ordering {
    if left < right {
        Ordering::Less
    } else if left > right {
        Ordering::Greater
    } else {
        java_double_bits(left).cmp(&java_double_bits(right))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_double_parsing() {
        assert_eq!(java_parse_double(" 5 "), Some(5.0));
        assert_eq!(java_parse_double("-1.5e2"), Some(-150.0));
        assert_eq!(java_parse_double("+.5"), Some(0.5));
        assert_eq!(java_parse_double("3d"), Some(3.0));
        assert_eq!(java_parse_double("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(java_parse_double("NaN").is_some_and(f64::is_nan));
        for bad in [
            "", "-", "abc", "inf", "nan", "infinity", "1,5", "+-1", "0x10", "e5",
        ] {
            assert_eq!(java_parse_double(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn java_double_order() {
        assert_eq!(java_double_compare(-0.0, 0.0), Ordering::Less);
        assert_eq!(
            java_double_compare(f64::NAN, f64::INFINITY),
            Ordering::Greater
        );
        assert_eq!(java_double_compare(f64::NAN, f64::NAN), Ordering::Equal);
        assert_eq!(java_double_compare(1.0, 2.0), Ordering::Less);
    }

    #[test]
    fn conversions_follow_java() {
        assert_eq!(
            compare(Value::Str("5"), Value::Int(3)),
            Ok(Ordering::Greater)
        );
        assert_eq!(
            compare(Value::Int(3), Value::Str("+3")),
            Ok(Ordering::Equal)
        );
        assert!(compare(Value::Str("5.5"), Value::Int(3)).is_err());
        assert!(compare(Value::Str("3000000000"), Value::Int(3)).is_err());
        assert_eq!(
            compare(Value::Str("3000000000"), Value::Long(3_000_000_000)),
            Ok(Ordering::Equal)
        );
        assert_eq!(
            compare(Value::Str("5.5"), Value::Double(3.0)),
            Ok(Ordering::Greater)
        );
        assert_eq!(
            compare(Value::Int(2), Value::Double(2.5)),
            Ok(Ordering::Less)
        );
        assert_eq!(
            compare(Value::Long(1 << 40), Value::Int(1)),
            Ok(Ordering::Greater)
        );
        assert_eq!(
            compare(Value::Str("TRUE"), Value::Bool(true)),
            Ok(Ordering::Equal)
        );
        assert!(compare(Value::Bool(true), Value::Str("true")).is_err());
        assert_eq!(
            compare(Value::Int(1), Value::Bool(true)),
            Ok(Ordering::Less)
        );
        assert_eq!(negate(Value::Int(i32::MIN)), Value::Int(i32::MIN));
        assert_eq!(negate(Value::Str("1")), Value::Null);
    }
}
