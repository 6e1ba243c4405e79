//! Buffers of pull bodies, kept on the shard for the next pull once their answer is written.
//!
//! A pull's records are copied once into a body buffer, and the connection writes the answer
//! from that buffer (`server::Output`): the buffer lives until its answer is written, not just
//! until it is copied into the output. Left to the allocator, freeing such buffers in
//! batches as answers go out shrank the shard's heap (madvise) and the next bodies faulted
//! their pages in again: 9.6% of a shard's CPU in page faults under 16 lagging consumer
//! groups, more than the copy the own buffers saved. Kept here, the last buffer given back is
//! the next one taken, its pages still mapped and likely still in cache.
//!
//! Bounded: at most `SPARE_BUFFERS_MAX` buffers and `SPARE_BYTES_MAX` bytes of them a shard,
//! none larger than `SPARE_BUFFER_MAX_BYTES` (a rare large body goes back to the allocator).
//! A buffer given back to a full list makes room by dropping the longest unused ones, so the
//! list follows the load: small bodies kept through a quiet day do not stand in the way of
//! the large ones of a catch-up.

use std::cell::RefCell;
use std::collections::VecDeque;

/// Bytes of spare buffers a shard keeps at most.
pub const SPARE_BYTES_MAX: usize = 8 << 20;
/// Spare buffers a shard keeps at most.
pub const SPARE_BUFFERS_MAX: usize = 64;
/// Largest buffer kept: a pull of 32 messages of 32 KiB.
pub const SPARE_BUFFER_MAX_BYTES: usize = 1 << 20;
/// Spare buffers looked at for one that is large enough.
const SEARCH_MAX: usize = 8;

#[derive(Default)]
struct Spares {
    /// Oldest given back first.
    buffers: VecDeque<Vec<u8>>,
    /// Capacity of `buffers`.
    bytes: usize,
}

thread_local! {
    static SPARES: RefCell<Spares> = RefCell::default();
}

/// An empty buffer with room for `capacity` bytes: the most recently given back one that has
/// the room, or a new one.
pub fn take(capacity: usize) -> Vec<u8> {
    if capacity == 0 {
        return Vec::new();
    }
    let spare = SPARES.with(|spares| {
        let mut spares = spares.borrow_mut();
        let count = spares.buffers.len();
        let found = (count.saturating_sub(SEARCH_MAX)..count)
            .rev()
            .find(|&i| spares.buffers[i].capacity() >= capacity)?;
        let buffer = spares.buffers.remove(found)?;
        spares.bytes -= buffer.capacity();
        Some(buffer)
    });
    spare.unwrap_or_else(|| Vec::with_capacity(capacity))
}

/// Gives a buffer back for a later `take` (emptied): dropped when it is too large; else kept,
/// the longest unused spares dropped as the bounds require.
pub fn give_back(mut buffer: Vec<u8>) {
    let capacity = buffer.capacity();
    if capacity == 0 || capacity > SPARE_BUFFER_MAX_BYTES {
        return;
    }
    buffer.clear();
    SPARES.with(|spares| {
        let mut spares = spares.borrow_mut();
        while spares.buffers.len() >= SPARE_BUFFERS_MAX || spares.bytes + capacity > SPARE_BYTES_MAX
        {
            let Some(oldest) = spares.buffers.pop_front() else {
                break;
            };
            spares.bytes -= oldest.capacity();
        }
        spares.bytes += capacity;
        spares.buffers.push_back(buffer);
    });
}

/// Bytes of spare buffers this shard keeps (memory by holder).
pub fn spare_bytes() -> usize {
    SPARES.with(|spares| spares.borrow().bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_buffer_given_back_is_taken_again_within_the_bounds() {
        let first = take(4096);
        let address = first.as_ptr();
        give_back(first);
        assert_eq!(spare_bytes(), 4096);
        let again = take(1000);
        assert_eq!(again.as_ptr(), address, "the spare is reused");
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(spare_bytes(), 0);
        give_back(again);
        let larger = take(8192);
        assert_ne!(larger.capacity(), 4096, "a spare too small is not taken");
        assert_eq!(spare_bytes(), 4096, "and stays");
        give_back(vec![0u8; SPARE_BUFFER_MAX_BYTES + 1]);
        assert_eq!(spare_bytes(), 4096, "too large to keep");
        drop(larger);
    }

    #[test]
    fn a_full_list_makes_room_by_dropping_the_longest_unused_spares() {
        // A quiet time's small bodies fill the list...
        for _ in 0..2 * SPARE_BUFFERS_MAX {
            give_back(Vec::with_capacity(4096));
        }
        assert_eq!(spare_bytes(), SPARE_BUFFERS_MAX * 4096);
        // ...and a catch-up's large ones still find room, and are found again.
        for _ in 0..2 * SPARE_BYTES_MAX / SPARE_BUFFER_MAX_BYTES {
            give_back(Vec::with_capacity(SPARE_BUFFER_MAX_BYTES));
        }
        assert!(spare_bytes() <= SPARE_BYTES_MAX);
        let large = take(SPARE_BUFFER_MAX_BYTES);
        assert_eq!(
            spare_bytes(),
            SPARE_BYTES_MAX - SPARE_BUFFER_MAX_BYTES,
            "the small spares made way; a large one was taken"
        );
        drop(large);
    }
}
