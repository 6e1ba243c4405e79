//! Tokens of RocketMQ's SQL92 selector grammar (its `SelectorParser.jj` token section).
//!
//! | token | form |
//! |---|---|
//! | keywords (any case) | NOT AND OR BETWEEN IN TRUE FALSE NULL IS CONTAINS STARTSWITH ENDSWITH |
//! | decimal | `0` or `[1-9][0-9]*` with an optional `l`/`L` suffix; must fit a Java long |
//! | floating point | `5.5`, `5.`, `.5`, `5E10`, `5.5e-3` (exponent `E`, any case, optional sign) |
//! | string | `'…'`, a quote inside written `''`; may span lines |
//! | identifier | `[A-Za-z_$][A-Za-z0-9_$]*` (ASCII only), unless it spells a keyword |
//! | operators | `=` `<>` `>` `>=` `<` `<=` `(` `)` `,` `+` `-` |
//!
//! Blanks (space, tab, CR, LF, form feed), `-- line comments` and `/* block comments */` are
//! skipped. Longest match wins, and a keyword beats an identifier of the same length, as in
//! JavaCC: `ORDER` is an identifier, `or` the keyword. A line comment may also end at the end
//! of the input (JavaCC wants a line break there).

use super::SqlError;

/// What a token is; literals carry their value.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum TokenKind {
    Not,
    And,
    Or,
    Between,
    In,
    True,
    False,
    Null,
    Is,
    Contains,
    StartsWith,
    EndsWith,
    /// A decimal literal, range-checked against Java's long.
    Decimal(i64),
    FloatingPoint(f64),
    /// A string literal, `''` already turned into `'`.
    String(String),
    Identifier(String),
    Equal,
    NotEqual,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
    LeftParen,
    RightParen,
    Comma,
    Plus,
    Minus,
    /// End of the input (always the last token).
    End,
}

impl TokenKind {
    /// How an error message names this token.
    pub(super) fn describe(&self) -> String {
        match self {
            TokenKind::Not => "NOT".into(),
            TokenKind::And => "AND".into(),
            TokenKind::Or => "OR".into(),
            TokenKind::Between => "BETWEEN".into(),
            TokenKind::In => "IN".into(),
            TokenKind::True => "TRUE".into(),
            TokenKind::False => "FALSE".into(),
            TokenKind::Null => "NULL".into(),
            TokenKind::Is => "IS".into(),
            TokenKind::Contains => "CONTAINS".into(),
            TokenKind::StartsWith => "STARTSWITH".into(),
            TokenKind::EndsWith => "ENDSWITH".into(),
            TokenKind::Decimal(value) => format!("number {value}"),
            TokenKind::FloatingPoint(value) => format!("number {value}"),
            TokenKind::String(text) => format!("string '{}'", text.replace('\'', "''")),
            TokenKind::Identifier(name) => format!("property name {name}"),
            TokenKind::Equal => "'='".into(),
            TokenKind::NotEqual => "'<>'".into(),
            TokenKind::Greater => "'>'".into(),
            TokenKind::GreaterEqual => "'>='".into(),
            TokenKind::Less => "'<'".into(),
            TokenKind::LessEqual => "'<='".into(),
            TokenKind::LeftParen => "'('".into(),
            TokenKind::RightParen => "')'".into(),
            TokenKind::Comma => "','".into(),
            TokenKind::Plus => "'+'".into(),
            TokenKind::Minus => "'-'".into(),
            TokenKind::End => "the end of the expression".into(),
        }
    }
}

/// One token and where it starts and ends (byte offsets into the source).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Token {
    pub(super) kind: TokenKind,
    pub(super) start: usize,
    pub(super) end: usize,
}

const KEYWORDS: &[(&str, TokenKind)] = &[
    ("NOT", TokenKind::Not),
    ("AND", TokenKind::And),
    ("OR", TokenKind::Or),
    ("BETWEEN", TokenKind::Between),
    ("IN", TokenKind::In),
    ("TRUE", TokenKind::True),
    ("FALSE", TokenKind::False),
    ("NULL", TokenKind::Null),
    ("IS", TokenKind::Is),
    ("CONTAINS", TokenKind::Contains),
    ("STARTSWITH", TokenKind::StartsWith),
    ("ENDSWITH", TokenKind::EndsWith),
];

/// Splits `source` into tokens, ending with [`TokenKind::End`].
pub(super) fn tokenize(source: &str) -> Result<Vec<Token>, SqlError> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    loop {
        at = skip_blanks_and_comments(source, at)?;
        let Some(&first) = bytes.get(at) else {
            tokens.push(Token {
                kind: TokenKind::End,
                start: at,
                end: at,
            });
            return Ok(tokens);
        };
        let (kind, end) = match first {
            b'\'' => string_literal(source, at)?,
            b'0'..=b'9' | b'.' => number(source, at)?,
            b'a'..=b'z' | b'A'..=b'Z' | b'_' | b'$' => word(source, at),
            _ => operator(source, at)?,
        };
        tokens.push(Token {
            kind,
            start: at,
            end,
        });
        at = end;
    }
}

fn skip_blanks_and_comments(source: &str, mut at: usize) -> Result<usize, SqlError> {
    let bytes = source.as_bytes();
    loop {
        match bytes.get(at..at + 2) {
            Some(b"--") => {
                at = bytes[at..]
                    .iter()
                    .position(|&b| b == b'\n' || b == b'\r')
                    .map_or(bytes.len(), |n| at + n);
                continue;
            }
            Some(b"/*") => {
                let Some(close) = source[at + 2..].find("*/") else {
                    return Err(SqlError::at(
                        source,
                        at,
                        "comment opened here is never closed: expected '*/'",
                    ));
                };
                at += 2 + close + 2;
                continue;
            }
            _ => {}
        }
        match bytes.get(at) {
            Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c') => at += 1,
            _ => return Ok(at),
        }
    }
}

fn string_literal(source: &str, start: usize) -> Result<(TokenKind, usize), SqlError> {
    let bytes = source.as_bytes();
    let mut text = String::new();
    let mut at = start + 1;
    let mut piece_start = at;
    loop {
        match bytes.get(at) {
            None => {
                return Err(SqlError::at(
                    source,
                    start,
                    "string literal opened here is never closed: expected a closing quote (')",
                ))
            }
            Some(b'\'') if bytes.get(at + 1) == Some(&b'\'') => {
                // `''` is one quote inside the literal.
                text.push_str(&source[piece_start..=at]);
                at += 2;
                piece_start = at;
            }
            Some(b'\'') => {
                text.push_str(&source[piece_start..at]);
                return Ok((TokenKind::String(text), at + 1));
            }
            Some(_) => at += 1,
        }
    }
}

fn digits_end(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

/// End of an exponent (`E`, optional sign, digits) starting at `at`, if one is there.
fn exponent_end(bytes: &[u8], at: usize) -> Option<usize> {
    if !matches!(bytes.get(at), Some(b'e' | b'E')) {
        return None;
    }
    let mut digits = at + 1;
    if matches!(bytes.get(digits), Some(b'+' | b'-')) {
        digits += 1;
    }
    let end = digits_end(bytes, digits);
    (end > digits).then_some(end)
}

/// A decimal or floating-point literal starting at `start` (a digit or a dot).
fn number(source: &str, start: usize) -> Result<(TokenKind, usize), SqlError> {
    let bytes = source.as_bytes();
    let int_end = digits_end(bytes, start);
    let has_int = int_end > start;
    // Floating point: digits "." digits* exp? | "." digits exp? | digits exp.
    let float_end = if bytes.get(int_end) == Some(&b'.') {
        let fraction_end = digits_end(bytes, int_end + 1);
        if has_int || fraction_end > int_end + 1 {
            Some(exponent_end(bytes, fraction_end).unwrap_or(fraction_end))
        } else {
            None
        }
    } else if has_int {
        exponent_end(bytes, int_end)
    } else {
        None
    };
    if let Some(end) = float_end {
        let text = &source[start..end];
        let value: f64 = text.parse().map_err(|_| {
            SqlError::at(
                source,
                start,
                format!("number {text} is not a valid double"),
            )
        })?;
        if value.is_infinite() {
            return Err(SqlError::at(
                source,
                start,
                format!("number {text} is greater than the largest double"),
            ));
        }
        return Ok((TokenKind::FloatingPoint(value), end));
    }
    if !has_int {
        return Err(SqlError::at(
            source,
            start,
            "unexpected '.': expected digits around it (a number such as 0.5)",
        ));
    }
    // Decimal: "0" alone, or a non-zero digit then digits, with an optional L suffix.
    let (digits_stop, end) = if bytes[start] == b'0' {
        (start + 1, start + 1)
    } else if matches!(bytes.get(int_end), Some(b'l' | b'L')) {
        (int_end, int_end + 1)
    } else {
        (int_end, int_end)
    };
    let text = &source[start..digits_stop];
    let value: i64 = text.parse().map_err(|_| {
        SqlError::at(
            source,
            start,
            format!("number {text} is out of the long range"),
        )
    })?;
    Ok((TokenKind::Decimal(value), end))
}

fn word(source: &str, start: usize) -> (TokenKind, usize) {
    let bytes = source.as_bytes();
    let mut end = start + 1;
    while bytes
        .get(end)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$')
    {
        end += 1;
    }
    let text = &source[start..end];
    let kind = KEYWORDS
        .iter()
        .find(|(keyword, _)| keyword.eq_ignore_ascii_case(text))
        .map_or_else(
            || TokenKind::Identifier(text.to_string()),
            |(_, kind)| kind.clone(),
        );
    (kind, end)
}

fn operator(source: &str, start: usize) -> Result<(TokenKind, usize), SqlError> {
    let bytes = source.as_bytes();
    let next = bytes.get(start + 1).copied();
    let (kind, len) = match (bytes[start], next) {
        (b'<', Some(b'>')) => (TokenKind::NotEqual, 2),
        (b'<', Some(b'=')) => (TokenKind::LessEqual, 2),
        (b'>', Some(b'=')) => (TokenKind::GreaterEqual, 2),
        (b'<', _) => (TokenKind::Less, 1),
        (b'>', _) => (TokenKind::Greater, 1),
        (b'=', _) => (TokenKind::Equal, 1),
        (b'(', _) => (TokenKind::LeftParen, 1),
        (b')', _) => (TokenKind::RightParen, 1),
        (b',', _) => (TokenKind::Comma, 1),
        (b'+', _) => (TokenKind::Plus, 1),
        (b'-', _) => (TokenKind::Minus, 1),
        _ => {
            let found = source[start..].chars().next().unwrap_or('?');
            let hint = match found {
                '!' => " (write <> for 'not equal', NOT for negation)",
                '"' => " (string literals use single quotes)",
                '&' | '|' => " (write AND / OR)",
                _ => "",
            };
            return Err(SqlError::at(
                source,
                start,
                format!("unexpected character {found:?}{hint}"),
            ));
        }
    };
    Ok((kind, start + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(source: &str) -> Vec<TokenKind> {
        tokenize(source)
            .unwrap()
            .into_iter()
            .map(|t| t.kind)
            .collect()
    }

    #[test]
    fn keywords_identifiers_and_operators() {
        assert_eq!(
            kinds("a nOt BETWEEN order or_x OR <> <= >= < > = ( ) , + -"),
            vec![
                TokenKind::Identifier("a".into()),
                TokenKind::Not,
                TokenKind::Between,
                TokenKind::Identifier("order".into()),
                TokenKind::Identifier("or_x".into()),
                TokenKind::Or,
                TokenKind::NotEqual,
                TokenKind::LessEqual,
                TokenKind::GreaterEqual,
                TokenKind::Less,
                TokenKind::Greater,
                TokenKind::Equal,
                TokenKind::LeftParen,
                TokenKind::RightParen,
                TokenKind::Comma,
                TokenKind::Plus,
                TokenKind::Minus,
                TokenKind::End,
            ]
        );
        assert_eq!(
            kinds("$x _y TAGS"),
            vec![
                TokenKind::Identifier("$x".into()),
                TokenKind::Identifier("_y".into()),
                TokenKind::Identifier("TAGS".into()),
                TokenKind::End
            ]
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(
            kinds("0 7 12L 2147483648 5. .5 5.5E10 5e-3 1E+2"),
            vec![
                TokenKind::Decimal(0),
                TokenKind::Decimal(7),
                TokenKind::Decimal(12),
                TokenKind::Decimal(2_147_483_648),
                TokenKind::FloatingPoint(5.0),
                TokenKind::FloatingPoint(0.5),
                TokenKind::FloatingPoint(5.5e10),
                TokenKind::FloatingPoint(5e-3),
                TokenKind::FloatingPoint(100.0),
                TokenKind::End,
            ]
        );
        // "0" takes no suffix and no more digits; "5E" without digits is 5 then E.
        assert_eq!(
            kinds("007 5E"),
            vec![
                TokenKind::Decimal(0),
                TokenKind::Decimal(0),
                TokenKind::Decimal(7),
                TokenKind::Decimal(5),
                TokenKind::Identifier("E".into()),
                TokenKind::End,
            ]
        );
        let error = tokenize("a = 9223372036854775808").unwrap_err();
        assert!(error.message.contains("out of the long range"), "{error}");
        assert_eq!(error.column, 5);
        assert!(tokenize("1e999").unwrap_err().message.contains("largest"));
        assert!(tokenize("a = .").unwrap_err().message.contains("'.'"));
    }

    #[test]
    fn strings_and_comments() {
        assert_eq!(
            kinds("'it''s' '' 'a\nb' -- comment\n /* block * / */ x -- at end"),
            vec![
                TokenKind::String("it's".into()),
                TokenKind::String(String::new()),
                TokenKind::String("a\nb".into()),
                TokenKind::Identifier("x".into()),
                TokenKind::End,
            ]
        );
        let open = tokenize("a = 'abc").unwrap_err();
        assert!(open.message.contains("never closed"), "{open}");
        assert_eq!((open.line, open.column), (1, 5));
        assert!(tokenize("/* x").unwrap_err().message.contains("'*/'"));
    }

    #[test]
    fn bad_characters_are_named_with_their_position() {
        let error = tokenize("a = 1\n AND b != 2").unwrap_err();
        assert_eq!((error.line, error.column), (2, 8));
        assert!(error.message.contains("'!'"), "{error}");
        assert!(error.message.contains("<>"), "{error}");
        let error = tokenize("é = 1").unwrap_err();
        assert!(error.message.contains("'é'"), "{error}");
        assert!(tokenize("a && b").unwrap_err().message.contains("AND"));
        assert!(tokenize("a = \"x\"")
            .unwrap_err()
            .message
            .contains("single"));
    }
}
