//! The in-memory tail of the commitlog: the bytes not yet durable, plus a bounded window of
//! recently flushed bytes kept for hot reads.
//!
//! Lives on the store's shard. The tail is a deque of fixed chunks of `TAIL_CHUNK_BYTES`
//! covering commitlog offsets `[base, end)`; `base` is chunk-aligned (so it is also
//! block-aligned). Appends copy into the last chunk(s); sliding drops whole chunks from the
//! front, so no byte is ever moved. Dropped chunks are kept for reuse without being cleared
//! (clearing 1 MiB per MiB appended cost a few percent of a busy shard), so the bytes past
//! `end` hold old data: `copy_out` reads them as zeros, which is what a flush writes after the
//! last record of a partial block.

use std::collections::VecDeque;

/// Size of one tail chunk: big enough that a 1 KiB append rarely crosses a chunk, small enough
/// that sliding frees memory promptly.
pub const TAIL_CHUNK_BYTES: u64 = 1 << 20;

pub(crate) struct Tail {
    base: u64,
    end: u64,
    chunks: VecDeque<Box<[u8]>>,
    /// Dropped chunks kept for the next ones (at most `SPARE_CHUNKS_MAX`), not cleared.
    spare: Vec<Box<[u8]>>,
}

/// Dropped chunks kept for reuse.
const SPARE_CHUNKS_MAX: usize = 4;

fn new_chunk() -> Box<[u8]> {
    vec![0u8; TAIL_CHUNK_BYTES as usize].into_boxed_slice()
}

impl Tail {
    /// A tail starting at commitlog offset `end`, holding `prefix`: the bytes of
    /// `[align_down(end, TAIL_CHUNK_BYTES), end)` (read back from disk on recovery).
    pub(crate) fn new(end: u64, prefix: &[u8]) -> Tail {
        let base = end - end % TAIL_CHUNK_BYTES;
        assert_eq!(
            prefix.len() as u64,
            end - base,
            "tail prefix covers [base, end)"
        );
        let mut chunk = new_chunk();
        chunk[..prefix.len()].copy_from_slice(prefix);
        Tail {
            base,
            end,
            chunks: VecDeque::from([chunk]),
            spare: Vec::new(),
        }
    }

    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Appends `bytes` at `end`.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let (index, within) = self.locate(self.end);
            if index == self.chunks.len() {
                self.add_chunk();
            }
            let room = (TAIL_CHUNK_BYTES as usize - within).min(rest.len());
            self.chunks[index][within..within + room].copy_from_slice(&rest[..room]);
            rest = &rest[room..];
            self.end += room as u64;
        }
    }

    /// Appends `len` bytes written by `fill` straight into the last chunk when they fit in
    /// it (the usual case: no staging copy); otherwise `fill` writes into `scratch`, which is
    /// then pushed.
    pub(crate) fn push_with(
        &mut self,
        len: usize,
        scratch: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]),
    ) {
        let (index, within) = self.locate(self.end);
        if index == self.chunks.len() {
            self.add_chunk();
        }
        if within + len <= TAIL_CHUNK_BYTES as usize {
            fill(&mut self.chunks[index][within..within + len]);
            self.end += len as u64;
            return;
        }
        scratch.clear();
        scratch.resize(len, 0);
        fill(scratch);
        self.push(scratch);
    }

    /// Advances `end` by `count` zero bytes (the body of a blank filler).
    pub(crate) fn push_zeros(&mut self, count: u64) {
        let mut rest = count;
        while rest > 0 {
            let (index, within) = self.locate(self.end);
            if index == self.chunks.len() {
                self.add_chunk();
            }
            let room = (TAIL_CHUNK_BYTES - within as u64).min(rest);
            self.chunks[index][within..within + room as usize].fill(0);
            rest -= room;
            self.end += room;
        }
    }

    fn add_chunk(&mut self) {
        let chunk = self.spare.pop().unwrap_or_else(new_chunk);
        self.chunks.push_back(chunk);
    }

    fn locate(&self, offset: u64) -> (usize, usize) {
        let relative = offset - self.base;
        (
            (relative / TAIL_CHUNK_BYTES) as usize,
            (relative % TAIL_CHUNK_BYTES) as usize,
        )
    }

    /// Copies `[offset, offset + dst.len())` into `dst`. Bytes past `end` within the last
    /// chunk read as zeros; the range must lie within the chunks held.
    pub(crate) fn copy_out(&self, offset: u64, dst: &mut [u8]) {
        assert!(offset >= self.base, "tail read below its base");
        let held_end = self.base + self.chunks.len() as u64 * TAIL_CHUNK_BYTES;
        assert!(
            offset + dst.len() as u64 <= held_end,
            "tail read past its chunks"
        );
        let held = self.end.saturating_sub(offset).min(dst.len() as u64) as usize;
        let (written, past_end) = dst.split_at_mut(held);
        past_end.fill(0);
        let mut done = 0;
        while done < written.len() {
            let (index, within) = self.locate(offset + done as u64);
            let room = (TAIL_CHUNK_BYTES as usize - within).min(written.len() - done);
            written[done..done + room].copy_from_slice(&self.chunks[index][within..within + room]);
            done += room;
        }
    }

    /// Drops whole chunks that end at or below `offset`.
    pub(crate) fn drop_before(&mut self, offset: u64) {
        while self.chunks.len() > 1 && self.base + TAIL_CHUNK_BYTES <= offset {
            let chunk = self.chunks.pop_front().expect("more than one chunk");
            if self.spare.len() < SPARE_CHUNKS_MAX {
                self.spare.push(chunk);
            }
            self.base += TAIL_CHUNK_BYTES;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_read_slide() {
        let mut tail = Tail::new(TAIL_CHUNK_BYTES + 3, &[1, 2, 3]);
        assert_eq!(tail.base(), TAIL_CHUNK_BYTES);
        let big = vec![9u8; TAIL_CHUNK_BYTES as usize + 10];
        tail.push(&big);
        assert_eq!(tail.end(), 2 * TAIL_CHUNK_BYTES + 13);
        let mut out = [0u8; 6];
        tail.copy_out(TAIL_CHUNK_BYTES + 1, &mut out);
        assert_eq!(out, [2, 3, 9, 9, 9, 9]);
        tail.push_zeros(5);
        tail.copy_out(tail.end() - 7, &mut out);
        assert_eq!(out, [9, 9, 0, 0, 0, 0]);
        tail.drop_before(2 * TAIL_CHUNK_BYTES + 1);
        assert_eq!(tail.base(), 2 * TAIL_CHUNK_BYTES);
        let mut scratch = Vec::new();
        tail.push_with(3, &mut scratch, |out| out.copy_from_slice(&[7, 8, 9]));
        tail.copy_out(tail.end() - 4, &mut out[..4]);
        assert_eq!(out[..4], [0, 7, 8, 9]);
        let across = TAIL_CHUNK_BYTES as usize - (tail.end() % TAIL_CHUNK_BYTES) as usize + 2;
        tail.push_with(across, &mut scratch, |out| out.fill(5));
        let mut two = [0u8; 4];
        tail.copy_out(tail.end() - 3, &mut two[..3]);
        assert_eq!(
            two[..3],
            [5, 5, 5],
            "a record across chunks goes through the scratch"
        );
        // A recycled chunk still holds old bytes; past `end` they read as zeros all the same.
        let filled_end = tail.end();
        tail.push(&vec![6u8; 2 * TAIL_CHUNK_BYTES as usize]);
        tail.drop_before(tail.end() - 10);
        assert!(!tail.spare.is_empty(), "dropped chunks are kept");
        let next_chunk = (tail.end() / TAIL_CHUNK_BYTES + 1) * TAIL_CHUNK_BYTES;
        tail.push_zeros(next_chunk - tail.end() + 3);
        tail.push(&[1]);
        let mut after = [9u8; 8];
        tail.copy_out(tail.end() - 4, &mut after);
        assert_eq!(after, [0, 0, 0, 1, 0, 0, 0, 0], "{filled_end}");
    }
}
