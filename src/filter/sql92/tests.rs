//! Parser and evaluator tests: RocketMQ's semantics case by case, error positions, limits,
//! and property tests that no input makes the parser or the evaluator panic.

use super::*;
use proptest::prelude::*;

fn evaluate(expression: &str, properties: &[(&str, &str)]) -> Result<Option<bool>, EvalError> {
    let compiled = SqlExpression::parse(expression)
        .unwrap_or_else(|error| panic!("{expression:?} should parse: {error}"));
    let lookup = |name: &str| {
        properties
            .iter()
            .rev()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
    };
    compiled.evaluate(&lookup)
}

fn truth(expression: &str, properties: &[(&str, &str)]) -> Option<bool> {
    evaluate(expression, properties)
        .unwrap_or_else(|error| panic!("{expression:?} should evaluate: {error}"))
}

fn parse_error(expression: &str) -> SqlError {
    match SqlExpression::parse(expression) {
        Ok(parsed) => panic!("{expression:?} should not parse: {parsed:?}"),
        Err(error) => error,
    }
}

const FIVE: &[(&str, &str)] = &[("a", "5")];

#[test]
fn numeric_comparisons_convert_the_property() {
    for (expression, expected) in [
        ("a > 3", true),
        ("a > 5", false),
        ("a >= 5", true),
        ("a < 5", false),
        ("a <= 5", true),
        ("a < 6", true),
        ("a = 5", true),
        ("a <> 5", false),
        ("a <> 4", true),
        ("a = 5.0", true),
        ("a > 4.5", true),
        ("a < 5.5", true),
        ("a = '5'", true),
        ("a = -5", false),
        ("a > -1", true),
        ("a > +4", true),
        ("5 = a", true),
        ("3 < a", true),
        ("a = 5L", true),
        ("a < 2147483648", true),
    ] {
        assert_eq!(truth(expression, FIVE), Some(expected), "{expression}");
    }
    assert_eq!(truth("a = -5", &[("a", "-5")]), Some(true));
    assert_eq!(truth("n = 3000000000", &[("n", "3000000000")]), Some(true));
    assert_eq!(truth("n > 2147483648", &[("n", "3000000001")]), Some(true));
    // 2147483647 is an int literal, and Integer.valueOf("3000000000") throws in Java.
    assert!(evaluate("n > 2147483647", &[("n", "3000000000")]).is_err());
    assert_eq!(truth("d > 1.5", &[("d", "1.75")]), Some(true));
    assert_eq!(truth("d = 1.5e3", &[("d", "1500")]), Some(true));
}

#[test]
fn conversions_that_fail_in_java_fail_the_message() {
    // Integer.valueOf("5.5") throws: the message does not match (RocketMQ logs and skips).
    assert!(evaluate("a > 3", &[("a", "5.5")]).is_err());
    assert_eq!(truth("a > 3.0", &[("a", "5.5")]), Some(true));
    assert!(evaluate("a = 5", &[("a", "abc")]).is_err());
    assert!(evaluate("a > 3", &[("a", " 5")]).is_err());
    assert!(evaluate("a > 3", &[("a", "3000000000")]).is_err());
    // An error anywhere stops the whole evaluation, even behind an OR that would be TRUE.
    assert!(evaluate("a = 5 OR b = 'x'", &[("a", "abc"), ("b", "x")]).is_err());
    // ... but not when the operand that fails is never evaluated.
    assert_eq!(
        truth("b = 'x' OR a = 5", &[("a", "abc"), ("b", "x")]),
        Some(true)
    );
    let compiled = SqlExpression::parse("a > 3").unwrap();
    assert!(!compiled.matches_properties(b"a\x01abc\x02"));
    assert!(compiled.matches_properties(b"a\x014\x02"));
}

#[test]
fn absent_properties_are_null_and_comparisons_with_null_are_unknown() {
    for expression in [
        "b > 3",
        "b = 3",
        "b <> 3",
        "b = 'x'",
        "b BETWEEN 1 AND 2",
        "b IN ('x')",
        "b NOT IN ('x')",
        "NOT (b > 1)",
        "b",
    ] {
        assert_eq!(truth(expression, FIVE), None, "{expression}");
    }
    assert_eq!(truth("b IS NULL", FIVE), Some(true));
    assert_eq!(truth("b IS NOT NULL", FIVE), Some(false));
    assert_eq!(truth("a IS NULL", FIVE), Some(false));
    assert_eq!(truth("a IS NOT NULL", FIVE), Some(true));
    // Java: null = null is TRUE, so two absent properties are "equal".
    assert_eq!(truth("b = c", FIVE), Some(true));
    assert_eq!(truth("a = b", FIVE), Some(false));
    assert_eq!(truth("b = a", FIVE), None);
    let compiled = SqlExpression::parse("b > 3").unwrap();
    assert!(!compiled.matches_properties(b"a\x015\x02"));
}

#[test]
fn between_is_inclusive() {
    for (value, inside) in [
        ("2", false),
        ("3", true),
        ("4", true),
        ("5", true),
        ("6", false),
    ] {
        let properties = [("a", value)];
        assert_eq!(
            truth("a BETWEEN 3 AND 5", &properties),
            Some(inside),
            "{value}"
        );
        assert_eq!(
            truth("a NOT BETWEEN 3 AND 5", &properties),
            Some(!inside),
            "{value}"
        );
    }
    assert_eq!(truth("a between 4.5 and 5.5", FIVE), Some(true));
    assert_eq!(truth("a BETWEEN -1 AND 5 AND a = 5", FIVE), Some(true));
    assert_eq!(truth("a BETWEEN 5 AND 5", FIVE), Some(true));
}

#[test]
fn in_lists_compare_strings_exactly() {
    let red = &[("colour", "red")];
    assert_eq!(truth("colour IN ('red', 'blue')", red), Some(true));
    assert_eq!(truth("colour IN ('blue')", red), Some(false));
    assert_eq!(truth("colour IN ('Red')", red), Some(false));
    assert_eq!(truth("colour NOT IN ('blue', 'green')", red), Some(true));
    assert_eq!(truth("colour NOT IN ('red')", red), Some(false));
    assert_eq!(
        truth("colour IN ('a', 'b', 'c', 'd', 'e', 'red')", red),
        Some(true)
    );
    assert_eq!(truth("a IN ('5')", FIVE), Some(true));
}

#[test]
fn logic_is_three_valued() {
    let properties = &[("a", "5"), ("colour", "red")];
    for (expression, expected) in [
        ("b = 1 AND a = 5", None),
        ("b = 1 AND a = 6", Some(false)),
        ("a = 6 AND b = 1", Some(false)),
        ("b = 1 OR a = 5", Some(true)),
        ("b = 1 OR a = 6", None),
        ("a = 6 OR a = 7", Some(false)),
        ("a = 5 AND colour = 'red'", Some(true)),
        ("NOT (a > 2) OR colour = 'red'", Some(true)),
        ("NOT (a > 2) OR colour = 'blue'", Some(false)),
        ("NOT (a > 2)", Some(false)),
        ("NOT NOT (a > 2)", Some(true)),
        ("NOT (b > 2)", None),
        ("TRUE", Some(true)),
        ("FALSE", Some(false)),
        ("NULL", None),
        ("TRUE AND a = 5", Some(true)),
        ("FALSE OR NULL", None),
        ("(a = 5) = TRUE", Some(true)),
        ("a = 1 OR a = 2 OR a = 3 OR a = 5", Some(true)),
        ("a = 5 AND (colour = 'blue' OR colour = 'red')", Some(true)),
        // AND binds tighter than OR.
        ("a = 6 AND colour = 'blue' OR colour = 'red'", Some(true)),
    ] {
        assert_eq!(truth(expression, properties), expected, "{expression}");
    }
}

#[test]
fn strings_text_operators_and_the_tags_property() {
    let properties = &[("s", "it's hello"), ("TAGS", "TagA")];
    assert_eq!(truth("s = 'it''s hello'", properties), Some(true));
    assert_eq!(truth("TAGS = 'TagA'", properties), Some(true));
    assert_eq!(truth("TAGS IN ('TagB', 'TagA')", properties), Some(true));
    assert_eq!(truth("s CONTAINS 'hell'", properties), Some(true));
    assert_eq!(truth("s NOT CONTAINS 'hell'", properties), Some(false));
    assert_eq!(truth("s STARTSWITH 'it'", properties), Some(true));
    assert_eq!(truth("s ENDSWITH 'lo'", properties), Some(true));
    assert_eq!(truth("s NOT ENDSWITH 'x'", properties), Some(true));
    assert_eq!(truth("s NOT STARTSWITH 'it'", properties), Some(false));
    // Absent properties and empty searches are FALSE for these, never unknown.
    assert_eq!(truth("x CONTAINS 'a'", properties), Some(false));
    assert_eq!(truth("x NOT CONTAINS 'a'", properties), Some(false));
    assert_eq!(truth("s CONTAINS ''", properties), Some(false));
    // Strings ordered with <, > compare as numbers or fail.
    assert_eq!(truth("p < q", &[("p", "1.5"), ("q", "10")]), Some(true));
    assert!(evaluate("p < q", &[("p", "x"), ("q", "y")]).is_err());
    // A bare property is a boolean cast: a string is never TRUE.
    assert_eq!(truth("flag", &[("flag", "true")]), Some(false));
    assert_eq!(truth("flag = TRUE", &[("flag", "true")]), Some(true));
    assert_eq!(truth("flag = TRUE", &[("flag", "yes")]), Some(false));
}

#[test]
fn syntax_is_case_insensitive_with_comments_and_lines() {
    let expression = "a between 3 and 5 -- the range\n  /* or a colour */ or colour in ('red')";
    assert_eq!(truth(expression, FIVE), Some(true));
    assert_eq!(truth("colour In ('red') oR A = 5", FIVE), None);
    assert_eq!(truth("a is not null and a is NOT NULL", FIVE), Some(true));
}

#[test]
fn errors_say_what_was_expected_and_where() {
    let error = parse_error("a >");
    assert_eq!((error.line, error.column), (1, 4));
    assert!(error.message.contains("expected a value"), "{error}");
    assert!(error.message.contains("found the end"), "{error}");
    let error = parse_error("a = 1 b");
    assert_eq!(error.column, 7);
    assert!(error.message.contains("expected AND, OR"), "{error}");
    assert!(error.message.contains("property name b"), "{error}");
    let error = parse_error("a = 1 AND\n(b = 2");
    assert_eq!((error.line, error.column), (2, 7));
    assert!(error.message.contains("expected ')'"), "{error}");
    let error = parse_error("a BETWEEN 1 3");
    assert!(error.message.contains("expected AND between"), "{error}");
    assert_eq!(error.column, 13);
    assert!(parse_error("a IN ()")
        .message
        .contains("expected a 'string'"));
    assert!(parse_error("a IN 'x'").message.contains("'(' after IN"));
    assert!(parse_error("a IN ('x' 'y')").message.contains("',' or ')'"));
    assert!(parse_error("a IS 5").message.contains("NULL or NOT NULL"));
    assert!(parse_error("a IS NOT 5").message.contains("expected NULL"));
    assert!(parse_error("a CONTAINS 5").message.contains("'string'"));
    assert!(parse_error("").message.contains("expected a value"));
    assert!(parse_error("   ").message.contains("found the end"));
    assert!(parse_error("*")
        .message
        .contains("unexpected character '*'"));
    assert!(parse_error("a = 1 AND")
        .message
        .contains("expected a value"));
    let shown = parse_error("a >").to_string();
    assert!(
        shown.starts_with("invalid SQL92 expression at line 1, column 4: expected"),
        "{shown}"
    );
}

#[test]
fn rocketmq_construction_checks_are_enforced() {
    for (expression, says) in [
        ("a > 'x'", "cannot be compared"),
        ("a < TRUE", "cannot be compared"),
        ("a >= NULL", "cannot be compared"),
        ("a BETWEEN 'x' AND 'y'", "cannot be compared"),
        ("(a > 1) > 2", "cannot be compared"),
        ("a > 1 > 2", "cannot be compared"),
        ("NOT a > 1", "cannot be compared"),
        ("a = NULL", "IS NULL"),
        ("NULL <> a", "IS NULL"),
        ("TRUE = 1", "cannot be compared with 1"),
        ("'x' IN ('a')", "IN needs a property"),
        ("(a = 1) IN ('a')", "IN needs a property"),
        ("a BETWEEN 5 AND 3", "must not be greater"),
        ("a BETWEEN 2.5 AND 2", "must not be greater"),
        ("a BETWEEN NULL AND 3", "must not be NULL"),
        ("5", "not a boolean"),
        ("'x'", "not a boolean"),
        ("-a", "not a boolean"),
        ("a = 1 AND 5", "not a boolean"),
        ("NOT 5", "not a boolean"),
    ] {
        let error = parse_error(expression);
        assert!(error.message.contains(says), "{expression}: {error}");
    }
    // Java checks BETWEEN bounds only when both are literals; -3 is a negation.
    assert_eq!(truth("a BETWEEN 5 AND -3", FIVE), Some(false));
    assert_eq!(truth("1 = TRUE", FIVE), Some(false));
    assert_eq!(truth("5 IS NULL", FIVE), Some(false));
}

#[test]
fn limits_bound_length_and_nesting() {
    let deep_parens = format!("{}a = 1{}", "(".repeat(100), ")".repeat(100));
    assert!(parse_error(&deep_parens).message.contains("deeper than"));
    let deep_not = format!("{}(a = 1)", "NOT ".repeat(100));
    assert!(parse_error(&deep_not).message.contains("deeper than"));
    // "--" starts a comment, so the minus signs are spaced.
    let deep_minus = format!("a = {}1", "- ".repeat(100));
    assert!(parse_error(&deep_minus).message.contains("deeper than"));
    let long_equality = format!("a{}", " = 1".repeat(100));
    assert!(parse_error(&long_equality).message.contains("deeper than"));
    let within = format!("{}a = 5{}", "(".repeat(40), ")".repeat(40));
    assert_eq!(truth(&within, FIVE), Some(true));
    // Long AND / OR chains are flat, not deep.
    let chain = (0..1000)
        .map(|n| format!("a = {n}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    assert!(chain.len() < SQL_EXPRESSION_MAX_BYTES);
    assert_eq!(truth(&chain, FIVE), Some(true));
    let too_long = format!("a = '{}'", "x".repeat(SQL_EXPRESSION_MAX_BYTES));
    assert!(parse_error(&too_long).message.contains("bytes long"));
}

fn token_soup() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("a"),
        Just("b"),
        Just("TAGS"),
        Just("1"),
        Just("2.5"),
        Just("-"),
        Just("+"),
        Just("'x'"),
        Just("''"),
        Just("("),
        Just(")"),
        Just(","),
        Just("="),
        Just("<>"),
        Just("<"),
        Just(">="),
        Just("AND"),
        Just("OR"),
        Just("NOT"),
        Just("IS"),
        Just("NULL"),
        Just("TRUE"),
        Just("BETWEEN"),
        Just("IN"),
        Just("CONTAINS"),
        Just("--"),
        Just("/*"),
        Just("*/"),
        Just("\n"),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|tokens| tokens.join(" "))
}

fn properties() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("TAGS".to_string())
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        "[ -~]{0,6}",
        Just("x".to_string()),
        Just("true".to_string()),
    ];
    proptest::collection::vec((name, value), 0..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_text_never_panics(source in "\\PC{0,80}") {
        let _ = SqlExpression::parse(&source);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        let source = String::from_utf8_lossy(&bytes);
        let _ = SqlExpression::parse(&source);
    }

    #[test]
    fn token_soup_parses_or_errors_and_evaluates_without_panic(
        source in token_soup(),
        properties in properties(),
    ) {
        match SqlExpression::parse(&source) {
            Ok(compiled) => {
                let lookup = |name: &str| {
                    properties.iter().rev().find(|(key, _)| key == name).map(|(_, v)| v.as_str())
                };
                let _ = compiled.evaluate(&lookup);
            }
            Err(error) => {
                prop_assert!(error.offset <= source.len());
                prop_assert!(error.line >= 1 && error.column >= 1);
                prop_assert!(!error.message.is_empty());
            }
        }
    }

    #[test]
    fn between_agrees_with_arithmetic(value in any::<i32>(), low in -1000i32..1000, span in 0i32..1000) {
        let high = low + span;
        let expression = format!("a BETWEEN {} AND {}", low.max(0), high.max(0));
        let (low, high) = (low.max(0), high.max(0));
        let text = value.to_string();
        let inside = truth(&expression, &[("a", &text)]);
        prop_assert_eq!(inside, Some(low <= value && value <= high));
    }
}
