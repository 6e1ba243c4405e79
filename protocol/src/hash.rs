//! Java's `String.hashCode()`: the consume-queue tags code of a tag, computed exactly as a
//! Java client computes it (over UTF-16 code units, wrapping like a Java int). The one copy
//! in the tree.

/// Java's `String.hashCode()` over UTF-16 code units: the consume-queue tags code of a tag.
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}
