//! A hasher for small integer keys (a request's opaque, a commitlog offset): one
//! multiplication (Fibonacci hashing), which spreads consecutive values, and multiples of a
//! power of two, over the high bits a hash table uses. SipHash, the standard map's default,
//! cost more than the rest of the work at both places that use this (server.rs' answers due,
//! the store's read cache). Keys are not chosen by clients in a way that could flood a table:
//! opaques only live on their own connection's table, offsets are the store's.

use std::hash::{BuildHasherDefault, Hasher};

/// See the module doc.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

/// The `BuildHasher` of [`IntHasher`], for `HashMap::with_hasher` and the map's type.
pub type IntHash = BuildHasherDefault<IntHasher>;

const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    /// Keys other than integers (none are hashed today): FNV-1a, byte by byte.
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_i32(&mut self, value: i32) {
        self.write_u64(u64::from(value as u32));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value.wrapping_mul(FIBONACCI);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn spreads_consecutive_keys_and_window_starts_over_the_high_bits() {
        let build = IntHash::default();
        // The top 7 bits pick among 128 groups of a table: consecutive opaques and offsets
        // one MiB apart land in many of them, not one.
        for keys in [
            (0..128u64).collect::<Vec<_>>(),
            (0..128u64).map(|i| i << 20).collect(),
        ] {
            let groups: HashSet<u64> = keys.iter().map(|key| build.hash_one(key) >> 57).collect();
            assert!(groups.len() > 64, "{} groups", groups.len());
        }
        assert_eq!(build.hash_one(7i32), build.hash_one(7u32));
    }
}
