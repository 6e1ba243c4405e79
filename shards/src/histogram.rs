//! Bucketed counts: the one bound search every histogram of shardmq counts with (message
//! sizes, request and put latencies, durable-write latencies).

/// The bucket of `value` among upper `bounds` (inclusive, ascending): the first bound it does
/// not pass, or `bounds.len()` (the open last bucket) past them all.
pub fn bucket_of(bounds: &[u64], value: u64) -> usize {
    bounds
        .iter()
        .position(|bound| value <= *bound)
        .unwrap_or(bounds.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_the_last_bucket_is_open() {
        let bounds = [1, 10, 100];
        let buckets: Vec<usize> = [0, 1, 2, 10, 11, 100, 101, u64::MAX]
            .iter()
            .map(|value| bucket_of(&bounds, *value))
            .collect();
        assert_eq!(buckets, [0, 0, 1, 1, 2, 2, 3, 3]);
    }
}
