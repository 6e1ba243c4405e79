//! The in-memory tail of the commitlog: the bytes not yet durable, plus a bounded window of
//! recently flushed bytes kept for hot reads.
//!
//! Lives on the store's shard. The tail is a deque of fixed chunks of `TAIL_CHUNK_BYTES`
//! covering commitlog offsets `[base, end)`; `base` is chunk-aligned (so it is also
//! block-aligned). Appends copy into the last chunk(s); sliding drops whole chunks from the
//! front, so no byte is ever moved. Dropped chunks are kept for reuse without being cleared
//! (clearing 1 MiB per MiB appended cost a few percent of a busy shard), so the bytes past
//! `end` hold old data: `copy_out` reads them as zeros.
//!
//! Flushes write straight from the chunks (`flush_pieces`), which are block-aligned
//! allocations shared (`Rc`) with the commitlog ring until the kernel is done with them:
//! copying each flush into a DMA buffer first was a third of a shard's time under batched
//! produce, and the disk sat idle during the copy. A flush's last block is partial: its bytes
//! past `end` are zeroed before the write, and appends landing there while the write is in
//! flight are harmless (that block is written again by the next flush, and recovery checks
//! every record).

use std::alloc::{self, Layout};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::rc::Rc;

use super::segments::BLOCK_BYTES;

pub use crate::limits::TAIL_CHUNK_BYTES;

/// One chunk of the tail: `TAIL_CHUNK_BYTES` of block-aligned memory (O_DIRECT writes take
/// it as is). The tail is the only one that reads or writes its bytes; the commitlog ring
/// holds a reference while the kernel writes from it, so it is freed only after that.
pub(crate) struct TailChunk {
    start: NonNull<u8>,
}

impl TailChunk {
    fn layout() -> Layout {
        Layout::from_size_align(TAIL_CHUNK_BYTES as usize, BLOCK_BYTES as usize)
            .expect("a valid chunk layout")
    }

    fn new() -> Rc<TailChunk> {
        // SAFETY: the layout has a non-zero size.
        let start = unsafe { alloc::alloc_zeroed(Self::layout()) };
        let start =
            NonNull::new(start).unwrap_or_else(|| alloc::handle_alloc_error(Self::layout()));
        Rc::new(TailChunk { start })
    }

    /// The address of byte `offset` of the chunk (for the kernel to write from).
    pub(crate) fn at(&self, offset: usize) -> *const u8 {
        assert!(offset <= TAIL_CHUNK_BYTES as usize);
        // SAFETY: within the allocation (or one past its end).
        unsafe { self.start.as_ptr().add(offset) }
    }

    /// The chunk's bytes. Only the tail calls it, and never while it holds another slice of
    /// the same chunk.
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: the allocation is TAIL_CHUNK_BYTES long and zero-initialised; the tail
        // (single-threaded, the only user) never holds two slices of a chunk at once; the
        // kernel only reads the memory.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), TAIL_CHUNK_BYTES as usize) }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: as in `bytes_mut`.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), TAIL_CHUNK_BYTES as usize) }
    }
}

impl Drop for TailChunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the last reference is gone.
        unsafe { alloc::dealloc(self.start.as_ptr(), Self::layout()) }
    }
}

/// A block-aligned run of a flush inside one chunk: `len` bytes from byte `offset` of `chunk`.
pub(crate) struct TailPiece {
    pub(crate) chunk: Rc<TailChunk>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

pub(crate) struct Tail {
    base: u64,
    end: u64,
    /// Where the bytes appended by this process start: those below (the prefix `new` was
    /// given, read back from disk) did not stay in memory since they were written.
    appended_from: u64,
    chunks: VecDeque<Rc<TailChunk>>,
    /// Dropped chunks kept for the next ones (at most `SPARE_CHUNKS_MAX`), not cleared.
    spare: Vec<Rc<TailChunk>>,
}

/// Dropped chunks kept for reuse: enough for a tail that fills to its undurable bound and
/// drains again without going back to the allocator (a fresh chunk is zeroed).
const SPARE_CHUNKS_MAX: usize = 16;

impl Tail {
    /// Bytes of the chunks the tail holds, spares included.
    pub(crate) fn held_bytes(&self) -> u64 {
        (self.chunks.len() + self.spare.len()) as u64 * TAIL_CHUNK_BYTES
    }

    /// A tail starting at commitlog offset `end`, holding `prefix`: the bytes of
    /// `[align_down(end, TAIL_CHUNK_BYTES), end)` (read back from disk on recovery).
    pub(crate) fn new(end: u64, prefix: &[u8]) -> Tail {
        let base = end - end % TAIL_CHUNK_BYTES;
        assert_eq!(
            prefix.len() as u64,
            end - base,
            "tail prefix covers [base, end)"
        );
        let chunk = TailChunk::new();
        chunk.bytes_mut()[..prefix.len()].copy_from_slice(prefix);
        Tail {
            base,
            end,
            appended_from: end,
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

    /// The offset from which the tail's bytes (what it holds of them) were appended in this
    /// process and never left memory: its base, or the end it was made with if higher.
    pub(crate) fn in_memory_from(&self) -> u64 {
        self.base.max(self.appended_from)
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
            self.chunks[index].bytes_mut()[within..within + room].copy_from_slice(&rest[..room]);
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
            fill(&mut self.chunks[index].bytes_mut()[within..within + len]);
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
            self.chunks[index].bytes_mut()[within..within + room as usize].fill(0);
            rest -= room;
            self.end += room;
        }
    }

    fn add_chunk(&mut self) {
        let chunk = self.spare.pop().unwrap_or_else(TailChunk::new);
        self.chunks.push_back(chunk);
    }

    fn locate(&self, offset: u64) -> (usize, usize) {
        let relative = offset - self.base;
        (
            (relative / TAIL_CHUNK_BYTES) as usize,
            (relative % TAIL_CHUNK_BYTES) as usize,
        )
    }

    /// Appends the bytes of `[offset, offset + len)` to `out`, straight from the chunks. Bytes
    /// past `end` within the last chunk read as zeros; the range must lie within the chunks
    /// held.
    pub(crate) fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) {
        assert!(offset >= self.base, "tail read below its base");
        let held_end = self.base + self.chunks.len() as u64 * TAIL_CHUNK_BYTES;
        assert!(offset + len as u64 <= held_end, "tail read past its chunks");
        let held = self.end.saturating_sub(offset).min(len as u64) as usize;
        out.reserve(len);
        let mut done = 0;
        while done < held {
            let (index, within) = self.locate(offset + done as u64);
            let room = (TAIL_CHUNK_BYTES as usize - within).min(held - done);
            out.extend_from_slice(&self.chunks[index].bytes()[within..within + room]);
            done += room;
        }
        out.resize(out.len() + (len - held), 0);
    }

    /// What a flush of `[start, align_up(end))` writes, chunk by chunk (`start` block-aligned,
    /// at or past `base`): the bytes past `end` in the last block are zeroed first.
    pub(crate) fn flush_pieces(&mut self, start: u64) -> Vec<TailPiece> {
        assert!(start >= self.base && start <= self.end && start.is_multiple_of(BLOCK_BYTES));
        let stop = self.end.next_multiple_of(BLOCK_BYTES);
        if stop > self.end {
            // The block holding `end` lies inside one chunk (chunks are whole blocks).
            let (index, within) = self.locate(self.end);
            let pad = (stop - self.end) as usize;
            self.chunks[index].bytes_mut()[within..within + pad].fill(0);
        }
        let mut pieces = Vec::new();
        let mut pos = start;
        while pos < stop {
            let (index, within) = self.locate(pos);
            let len = (TAIL_CHUNK_BYTES as usize - within).min((stop - pos) as usize);
            pieces.push(TailPiece {
                chunk: self.chunks[index].clone(),
                offset: within,
                len,
            });
            pos += len as u64;
        }
        pieces
    }

    /// Drops whole chunks that end at or below `offset`.
    pub(crate) fn drop_before(&mut self, offset: u64) {
        while self.chunks.len() > 1 && self.base + TAIL_CHUNK_BYTES <= offset {
            let chunk = self.chunks.pop_front().expect("more than one chunk");
            // A chunk the commitlog ring still writes from is freed by the ring.
            if self.spare.len() < SPARE_CHUNKS_MAX && Rc::strong_count(&chunk) == 1 {
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
        assert_eq!(read(&tail, TAIL_CHUNK_BYTES + 1, 6), [2, 3, 9, 9, 9, 9]);
        tail.push_zeros(5);
        assert_eq!(read(&tail, tail.end() - 7, 6), [9, 9, 0, 0, 0, 0]);
        tail.drop_before(2 * TAIL_CHUNK_BYTES + 1);
        assert_eq!(tail.base(), 2 * TAIL_CHUNK_BYTES);
        let mut scratch = Vec::new();
        tail.push_with(3, &mut scratch, |out| out.copy_from_slice(&[7, 8, 9]));
        assert_eq!(read(&tail, tail.end() - 4, 4), [0, 7, 8, 9]);
        let across = TAIL_CHUNK_BYTES as usize - (tail.end() % TAIL_CHUNK_BYTES) as usize + 2;
        tail.push_with(across, &mut scratch, |out| out.fill(5));
        assert_eq!(
            read(&tail, tail.end() - 3, 3),
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
        let mut after = vec![9u8; 2];
        tail.append_range(tail.end() - 4, 8, &mut after);
        assert_eq!(
            after,
            [9, 9, 0, 0, 0, 1, 0, 0, 0, 0],
            "appended after what `out` held; {filled_end}"
        );
    }

    #[test]
    fn flush_pieces_are_aligned_chunk_runs_zeroed_past_the_end() {
        // Start inside a chunk, at a block boundary; end mid-block two chunks later.
        let start = TAIL_CHUNK_BYTES + BLOCK_BYTES;
        let prefix = vec![3u8; BLOCK_BYTES as usize];
        let mut tail = Tail::new(start, &prefix);
        // A recycled chunk holds old bytes: make the tail reuse one.
        tail.push(&vec![1u8; 2 * TAIL_CHUNK_BYTES as usize]);
        tail.drop_before(tail.end());
        tail.push(&vec![2u8; TAIL_CHUNK_BYTES as usize + 100]);
        let end = tail.end();
        let from = align(end - TAIL_CHUNK_BYTES - 100 - BLOCK_BYTES);
        let pieces = tail.flush_pieces(from);
        let stop = end.next_multiple_of(BLOCK_BYTES);
        assert_eq!(
            pieces.iter().map(|p| p.len as u64).sum::<u64>(),
            stop - from
        );
        let mut pos = from;
        for piece in &pieces {
            assert_eq!(
                piece.chunk.at(piece.offset) as usize % BLOCK_BYTES as usize,
                0
            );
            assert!(piece.offset + piece.len <= TAIL_CHUNK_BYTES as usize);
            let expected = read(&tail, pos, piece.len);
            assert_eq!(
                &piece.chunk.bytes()[piece.offset..piece.offset + piece.len],
                &expected[..],
                "the chunk holds what the tail reads, zeros past the end"
            );
            pos += piece.len as u64;
        }
        let last = pieces.last().unwrap();
        let past_end = &last.chunk.bytes()[last.offset + last.len - (stop - end) as usize..];
        assert!(past_end[..(stop - end) as usize].iter().all(|&b| b == 0));
        // A chunk the ring still holds is not recycled when the tail drops it.
        let held = pieces[0].chunk.clone();
        drop(pieces);
        let spare_before = tail.spare.len();
        tail.drop_before(end);
        assert_eq!(
            tail.spare.len(),
            spare_before,
            "the held chunk is not reused"
        );
        assert_eq!(Rc::strong_count(&held), 1, "the tail let go of it");
    }

    fn read(tail: &Tail, offset: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        tail.append_range(offset, len, &mut out);
        out
    }

    fn align(offset: u64) -> u64 {
        offset - offset % BLOCK_BYTES
    }
}
