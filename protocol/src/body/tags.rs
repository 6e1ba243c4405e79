//! Tag expressions and tag hash codes (REMOTING.md §4.4).
//!
//! A consume-queue unit stores `tagsCode` = Java `String.hashCode()` of the message's tag
//! (sign-extended to a long); a TAG subscription `"a || b"` matches when `(int) tagsCode` is
//! one of the expression's hash codes. The hash runs over UTF-16 code units, so a tag with
//! non-ASCII characters hashes exactly as a Java client computes it.

pub use crate::hash::java_string_hash;

/// A parsed TAG sub expression.
#[derive(Debug, Clone, PartialEq)]
pub enum TagFilter {
    /// `"*"` or `""`: every message, with or without a tag.
    All,
    /// The named tags (deduplicated, in first-seen order) and their hash codes, index-aligned.
    Tags { tags: Vec<String>, codes: Vec<i32> },
}

impl TagFilter {
    /// `"*"` or blank → [`TagFilter::All`]; else split on `"||"`, trim, skip empty pieces.
    /// An expression with only separators (`"||"`) names no tag and matches nothing.
    pub fn parse(expression: &str) -> TagFilter {
        let expression = expression.trim();
        if expression.is_empty() || expression == "*" {
            return TagFilter::All;
        }
        let mut tags: Vec<String> = Vec::new();
        for tag in expression
            .split("||")
            .map(str::trim)
            .filter(|tag| !tag.is_empty())
        {
            if !tags.iter().any(|known| known == tag) {
                tags.push(tag.to_string());
            }
        }
        let codes = tags.iter().map(|tag| java_string_hash(tag)).collect();
        TagFilter::Tags { tags, codes }
    }

    /// Matches a consume-queue `tagsCode`, compared as Java's `(int) tagsCode`.
    pub fn matches_code(&self, tags_code: i64) -> bool {
        match self {
            TagFilter::All => true,
            // Truncation is the point: Java compares `(int) tagsCode` with the hash set.
            TagFilter::Tags { codes, .. } => codes.contains(&(tags_code as i32)),
        }
    }

    /// Matches a message's tag exactly (the client-side second check). A message without a
    /// tag only matches [`TagFilter::All`].
    pub fn matches_tag(&self, tag: Option<&str>) -> bool {
        match (self, tag) {
            (TagFilter::All, _) => true,
            (TagFilter::Tags { tags, .. }, Some(tag)) => tags.iter().any(|known| known == tag),
            (TagFilter::Tags { .. }, None) => false,
        }
    }

    /// The tag names (empty for [`TagFilter::All`]).
    pub fn tags(&self) -> &[String] {
        match self {
            TagFilter::All => &[],
            TagFilter::Tags { tags, .. } => tags,
        }
    }

    /// The tag hash codes (empty for [`TagFilter::All`]).
    pub fn codes(&self) -> &[i32] {
        match self {
            TagFilter::All => &[],
            TagFilter::Tags { codes, .. } => codes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_java_hashes() {
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("TagA"), 2598919);
        assert_eq!(java_string_hash("hello"), 99162322);
        // 'a' = 97, 'é' = U+00E9 = 233: 97 * 31 + 233.
        assert_eq!(java_string_hash("aé"), 3240);
        // U+1F600 is the surrogate pair D83D DE00: 55357 * 31 + 56832.
        assert_eq!(java_string_hash("😀"), 1772899);
        // Overflow wraps like Java int ("polygenelubricants".hashCode() == Integer.MIN_VALUE).
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
    }

    #[test]
    fn parse_expressions() {
        assert_eq!(TagFilter::parse("*"), TagFilter::All);
        assert_eq!(TagFilter::parse(""), TagFilter::All);
        assert_eq!(TagFilter::parse(" * "), TagFilter::All);
        let filter = TagFilter::parse("TagA || TagB||TagA|| ");
        assert_eq!(filter.tags(), ["TagA", "TagB"]);
        assert_eq!(filter.codes(), [2598919, java_string_hash("TagB")]);
        assert_eq!(
            TagFilter::parse("||"),
            TagFilter::Tags {
                tags: vec![],
                codes: vec![]
            }
        );
    }

    #[test]
    fn matching() {
        let filter = TagFilter::parse("TagA");
        assert!(filter.matches_code(2598919));
        assert!(filter.matches_code(2598919 + (1i64 << 32)));
        assert!(!filter.matches_code(1));
        assert!(filter.matches_tag(Some("TagA")));
        assert!(!filter.matches_tag(Some("TagB")));
        assert!(!filter.matches_tag(None));
        assert!(TagFilter::All.matches_tag(None));
        assert!(TagFilter::All.matches_code(-5));
    }

    proptest! {
        #[test]
        fn every_named_tag_matches(tags in proptest::collection::vec("[^|\\s]{1,8}", 1..5)) {
            let filter = TagFilter::parse(&tags.join(" || "));
            for tag in &tags {
                prop_assert!(filter.matches_tag(Some(tag)));
                prop_assert!(filter.matches_code(i64::from(java_string_hash(tag))));
            }
        }
    }
}
