//! The commitlog's own io_uring ring: a flush's writes and a wake-up byte go to the kernel as
//! one linked chain the moment the flush is built, and the kernel runs the links in order
//! without coming back to user space between them.
//!
//! Why not glommio's rings: glommio hands queued I/O to the kernel, and collects completions,
//! only between task-queue runs, that is when the running task gives the executor back. A
//! connection task that keeps finding requests in its socket holds the executor through a
//! whole client window, so a SYNC_FLUSH write waited for the window to be handled, and its
//! fdatasync for the next hand-back: the shard handled requests and flushed them in turns
//! (0.51-0.58 of ASYNC_FLUSH throughput at 256 in flight). Here submission is one
//! non-blocking io_uring_enter made by the code that builds the flush.
//!
//! Durability: SYNC_FLUSH data writes carry RWF_DSYNC (each is durable when it completes, as
//! with O_DSYNC: the kernel writes, then flushes the device cache and any metadata needed to
//! read the data back), so a flush needs no fdatasync request and no io-wq worker to run one:
//! the fastest durable write measured on these virtio disks (`store_throughput
//! durable_write_latency`: 128 KiB p50 128 µs, against 134 µs for write + fdatasync linked).
//! ASYNC_FLUSH data writes and zero-fill chains write without it; a chain that must make
//! them durable ends with an fdatasync per file.
//!
//! Completion: busy request loops collect completions themselves after every request (the
//! store's poll hook, `runtime::run_poll_hooks`: a few memory reads, plus one io_uring_enter
//! when the kernel flags completion work pending), so the next group commit starts as soon as
//! the disk is done. For a shard with nothing else to do, the chain's last link sends one
//! byte on a socket pair whose other end the store's reaper task reads through glommio: that
//! wakes a parked shard. Every link is a hard link, so the wake-up byte is sent even when a
//! step fails (the reaper then reads the error).
//!
//! Three chains at most are in flight, one per `Slot`: a flush of data, a zero-fill and
//! (ASYNC_FLUSH) a sync of what earlier flushes wrote. The caller keeps the writes' ranges
//! apart. Buffers stay owned by their chain until its last completion is reaped; dropping the
//! ring waits for the chains in flight.

use std::any::Any;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::rc::Rc;

#[cfg(test)]
use crate::runtime::fs::AlignedBuffer;
use crate::runtime::wake::{self, WakeReceiver, Waker};
use io_uring::{opcode, squeue, types, IoUring};

use super::tail::{TailPiece, TAIL_CHUNK_BYTES};

/// Ring entries: a chain of a few writes (a flush splits at `FLUSH_WRITE_MAX_BYTES` and at
/// segment ends), an fdatasync per file and a wake-up send, twice over. A chain's entries go
/// to the kernel as it is submitted, so the submission queue holds one chain at a time; the
/// completion queue (twice as long) has room for every chain in flight.
const RING_ENTRIES: u32 = 64;
/// Entries one chain may take: half of the ring (a flush over many small segments is cut to
/// fit, `flusher::start_flush`).
pub(crate) const CHAIN_ENTRIES_MAX: usize = RING_ENTRIES as usize / 2;

/// What the kernel sends on the wake-up socket when a chain ends.
static WAKE_BYTE: [u8; 1] = [1];

/// Which of the two chains a submission is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A flush of data: RWF_DSYNC writes (SYNC_FLUSH), or plain writes and an fdatasync now
    /// and then (ASYNC_FLUSH).
    Data = 0,
    /// Zeros ahead of the write position: plain writes, then an fdatasync per file.
    ZeroFill = 1,
    /// ASYNC_FLUSH: an fdatasync of each file the flushes of data wrote since its last one,
    /// beside the next flush.
    Sync = 2,
}

/// Block-aligned zeros that zero-fill writes again and again: a read-only anonymous map, whose
/// pages are all the kernel's one zero page, so they take no memory of their own. Not glommio's
/// DMA memory: this ring does not use glommio's registered buffers, and those are kept for the
/// reads that do (the read cache's windows, `read_cache.rs`).
pub(crate) struct Zeros {
    start: NonNull<u8>,
    len: usize,
}

impl Zeros {
    /// `len` bytes of zeros (a positive multiple of the block size).
    pub(crate) fn new(len: usize) -> io::Result<Rc<Zeros>> {
        assert!(len > 0 && len.is_multiple_of(4096), "whole blocks of zeros");
        // SAFETY: a new private anonymous map; no memory of ours is touched.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if start == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = NonNull::new(start.cast()).expect("mmap returns no null map");
        Ok(Rc::new(Zeros { start, len }))
    }
}

impl Drop for Zeros {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; the last reference (and with it the last
        // write from it) is gone.
        unsafe { libc::munmap(self.start.as_ptr().cast(), self.len) };
    }
}

/// One write of a chain: `position` of the file `fd` gets the pieces, in order. Each piece is
/// memory kept alive by the chain until its last completion is reaped: zeros (zero-fill) or a
/// run of a tail chunk (a flush of data, written straight from the tail).
pub(crate) struct ChainWrite {
    pub(crate) fd: RawFd,
    pub(crate) position: u64,
    pieces: Vec<libc::iovec>,
    owners: Vec<Rc<dyn Any>>,
    /// Fault injection: the write is not issued and fails with this errno.
    pub(crate) fail_with: Option<i32>,
}

impl ChainWrite {
    /// A write with no bytes yet (add them with `push_zeros` / `push_tail`).
    pub(crate) fn new(fd: RawFd, position: u64) -> ChainWrite {
        ChainWrite {
            fd,
            position,
            pieces: Vec::new(),
            owners: Vec::new(),
            fail_with: None,
        }
    }

    /// Adds `len` bytes of zeros.
    pub(crate) fn push_zeros(&mut self, zeros: &Rc<Zeros>, len: usize) {
        assert!(len <= zeros.len, "a write stays inside its zeros");
        self.push(zeros.start.as_ptr(), len, zeros.clone());
    }

    /// Adds the first `len` bytes of `buffer`.
    #[cfg(test)]
    pub(crate) fn push_buffer(&mut self, buffer: Rc<AlignedBuffer>, len: usize) {
        assert!(len <= buffer.len(), "a write stays inside its buffer");
        self.push(buffer.as_ptr(), len, buffer);
    }

    /// Adds a run of a tail chunk.
    pub(crate) fn push_tail(&mut self, piece: TailPiece) {
        assert!(piece.offset + piece.len <= TAIL_CHUNK_BYTES as usize);
        let start = piece.chunk.at(piece.offset);
        self.push(start, piece.len, piece.chunk);
    }

    fn push(&mut self, start: *const u8, len: usize, owner: Rc<dyn Any>) {
        assert!(
            len.is_multiple_of(4096) && (start as usize).is_multiple_of(4096),
            "O_DIRECT writes whole aligned blocks"
        );
        self.pieces.push(libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: len,
        });
        self.owners.push(owner);
    }

    /// Bytes written.
    pub(crate) fn len(&self) -> usize {
        self.pieces.iter().map(|piece| piece.iov_len).sum()
    }
}

/// How a chain went wrong: which step, and the error.
#[derive(Debug)]
pub(crate) struct ChainFailure {
    pub(crate) context: &'static str,
    pub(crate) error: io::Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A write of this many bytes.
    Write(usize),
    Sync,
    Wake,
}

struct Chain {
    steps: Vec<Step>,
    /// Each step's result (bytes or -errno) once reaped.
    results: Vec<Option<i32>>,
    remaining: usize,
    /// The writes' memory and iovec arrays, kept until the kernel is done with them (a
    /// linked or offloaded write reads its iovecs when it is issued, after `submit`).
    _writes: Vec<ChainWrite>,
}

pub(crate) struct CommitRing {
    ring: IoUring,
    /// The end the kernel sends the wake-up byte on (the reaper reads the other end).
    wake_tx: Waker,
    chains: [Option<Chain>; 3],
    /// Chains start on an io_uring worker (IOSQE_ASYNC) bound to other CPUs.
    offload: bool,
    /// What this ring handed the kernel: entries, and io_uring_enter calls (submissions and
    /// completion collections) — `shardmq_io_uring_*` metrics.
    pub(crate) counts: RingCounts,
}

/// Work a ring handed the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingCounts {
    pub entries: u64,
    pub enters: u64,
}

/// user_data of a step: its slot and its index in the chain.
fn user_data(slot: usize, index: usize) -> u64 {
    ((slot as u64) << 32) | index as u64
}

impl CommitRing {
    /// A ring, and the socket end the reaper task reads to learn that a chain ended. With
    /// `offload` (this thread's io_uring workers are bound to other CPUs,
    /// `runtime::bind_io_workers`), each chain is started by one of those workers instead of
    /// inline in the submitting call.
    pub(crate) fn new(offload: bool) -> io::Result<(CommitRing, WakeReceiver)> {
        // Completions do not interrupt the shard (no IPI while it runs): their task work runs
        // at its next system call, or when `reap` sees the kernel's flag that some is pending;
        // a parked shard is still woken. Only the shard's thread submits.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_single_issuer()
            .build(RING_ENTRIES)?;
        // The kernel sends the byte itself (the chain's last link), on the runtime's wake-up
        // pair that the reaper waits on.
        let (wake_tx, wake_rx) = wake::pair()?;
        Ok((
            CommitRing {
                ring,
                wake_tx,
                chains: [None, None, None],
                offload,
                counts: RingCounts::default(),
            },
            wake_rx,
        ))
    }

    /// A chain is in flight in `slot`.
    pub(crate) fn busy(&self, slot: Slot) -> bool {
        self.chains[slot as usize].is_some()
    }

    /// Any chain is in flight.
    pub(crate) fn any_busy(&self) -> bool {
        self.chains.iter().any(Option::is_some)
    }

    /// Hands a chain to the kernel: `writes` one after the other (each with RWF_DSYNC when
    /// `dsync`), then an fdatasync of each of `sync_fds`, then the wake-up send. `slot` must be
    /// free; a chain may hold no write (a sync of what earlier chains wrote) but not nothing.
    pub(crate) fn submit(
        &mut self,
        slot: Slot,
        writes: Vec<ChainWrite>,
        sync_fds: &[(RawFd, Option<i32>)],
        dsync: bool,
    ) -> io::Result<()> {
        let s = slot as usize;
        assert!(self.chains[s].is_none(), "one chain per slot at a time");
        assert!(!writes.is_empty() || !sync_fds.is_empty());
        let count = writes.len() + sync_fds.len() + 1;
        assert!(
            count <= CHAIN_ENTRIES_MAX,
            "a chain fits its half of the ring"
        );
        let mut steps = Vec::with_capacity(count);
        // Each step's result: an injected fault's errno at once (its step is a no-op).
        let mut results = Vec::with_capacity(count);
        let mut entries = Vec::with_capacity(count);
        let rw_flags = if dsync { libc::RWF_DSYNC } else { 0 };
        for write in &writes {
            let len = write.len();
            assert!(
                len > 0 && write.position.is_multiple_of(4096),
                "O_DIRECT writes whole aligned blocks"
            );
            entries.push(match write.fail_with {
                Some(_) => opcode::Nop::new().build(),
                None => opcode::Writev::new(
                    types::Fd(write.fd),
                    write.pieces.as_ptr(),
                    write.pieces.len() as u32,
                )
                .offset(write.position)
                .rw_flags(rw_flags)
                .build(),
            });
            steps.push(Step::Write(len));
            results.push(write.fail_with.map(|errno| -errno));
        }
        for &(fd, fail_with) in sync_fds {
            entries.push(match fail_with {
                Some(_) => opcode::Nop::new().build(),
                None => opcode::Fsync::new(types::Fd(fd))
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
            });
            steps.push(Step::Sync);
            results.push(fail_with.map(|errno| -errno));
        }
        let wake_fd = types::Fd(self.wake_tx.raw_fd());
        // Never waits for room: a full socket already holds wake-ups the reaper has yet to
        // read (a chain whose send blocked would not end until the reaper ran).
        entries.push(
            opcode::Send::new(wake_fd, WAKE_BYTE.as_ptr(), 1)
                .flags(libc::MSG_DONTWAIT)
                .build(),
        );
        steps.push(Step::Wake);
        results.push(None);
        {
            let mut queue = self.ring.submission();
            let last = entries.len() - 1;
            for (index, entry) in entries.into_iter().enumerate() {
                let entry = entry.user_data(user_data(s, index));
                let mut flags = if index < last {
                    squeue::Flags::IO_HARDLINK
                } else {
                    squeue::Flags::empty()
                };
                // Issuing an O_DIRECT write (pinning pages, building the request, notifying
                // the virtio disk, a VM exit) costs ~25 µs of the submitting core here.
                if index == 0 && self.offload {
                    flags |= squeue::Flags::ASYNC;
                }
                let entry = entry.flags(flags);
                // SAFETY: the writes (their iovecs and the memory those point to) are kept in
                // the chain until every completion is reaped (`drop` waits for that);
                // WAKE_BYTE is static.
                unsafe { queue.push(&entry) }.expect("a chain fits its half of the ring");
            }
        }
        self.counts.entries += count as u64;
        loop {
            self.counts.enters += 1;
            match self.ring.submit() {
                Ok(_) => break,
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => continue,
                // The caller poisons the store: nothing is submitted on this ring again.
                Err(error) => return Err(error),
            }
        }
        self.chains[s] = Some(Chain {
            remaining: steps.len(),
            steps,
            results,
            _writes: writes,
        });
        Ok(())
    }

    /// Collects completions; the chains that ended, each with its first failure, if any.
    /// Cheap when nothing is in flight or nothing has completed (a few memory reads).
    pub(crate) fn reap(&mut self) -> Vec<(Slot, Result<(), ChainFailure>)> {
        if !self.any_busy() {
            return Vec::new();
        }
        // Completions may wait for this thread to run their task work: post them (no waiting).
        match crate::runtime::post_ring_task_work(&mut self.ring) {
            Ok(entered) => self.counts.enters += u64::from(entered),
            Err(error) => {
                self.counts.enters += 1;
                log::warn!("store: collecting commitlog completions failed: {error}");
            }
        }
        for cqe in self.ring.completion() {
            let slot = (cqe.user_data() >> 32) as usize;
            let index = (cqe.user_data() & u32::MAX as u64) as usize;
            let Some(chain) = self.chains.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if let Some(result) = chain.results.get_mut(index) {
                // An injected fault keeps its errno whatever the no-op returned.
                if result.is_none() {
                    *result = Some(cqe.result());
                }
                chain.remaining -= 1;
            }
        }
        let mut ended = Vec::new();
        for (s, slot) in [(0, Slot::Data), (1, Slot::ZeroFill), (2, Slot::Sync)] {
            if self.chains[s].as_ref().is_some_and(|c| c.remaining == 0) {
                let chain = self.chains[s].take().expect("checked");
                ended.push((slot, outcome(&chain)));
            }
        }
        ended
    }

    /// Blocks until the chains in flight have ended: their buffers may then be freed.
    fn wait_idle(&mut self) {
        while self.any_busy() {
            let remaining: usize = self.chains.iter().flatten().map(|c| c.remaining).sum();
            match self.ring.submit_and_wait(remaining.min(1)) {
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(error) => {
                    log::warn!("store: waiting for the commitlog ring failed: {error}");
                    // Leak the buffers rather than free memory the kernel may still read.
                    for chain in &mut self.chains {
                        std::mem::forget(chain.take());
                    }
                    return;
                }
            }
            let _ = self.reap();
        }
    }
}

impl Drop for CommitRing {
    fn drop(&mut self) {
        self.wait_idle();
    }
}

fn outcome(chain: &Chain) -> Result<(), ChainFailure> {
    for (step, result) in chain.steps.iter().zip(&chain.results) {
        let result = result.expect("every step reaped");
        let context = match step {
            Step::Write(_) => "commitlog write",
            Step::Sync => "commitlog fdatasync",
            // A lost wake-up byte costs nothing once the chain is reaped.
            Step::Wake => continue,
        };
        if result < 0 {
            return Err(ChainFailure {
                context,
                error: io::Error::from_raw_os_error(-result),
            });
        }
        if let Step::Write(len) = step {
            if (result as usize) < *len {
                return Err(ChainFailure {
                    context,
                    error: io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short write: {result} of {len} bytes"),
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fs::DirectFile;

    /// Waits for wake-up bytes until `count` chains have ended; their outcomes by slot.
    async fn ended(
        ring: &mut CommitRing,
        wake_rx: &mut WakeReceiver,
        count: usize,
    ) -> Vec<(Slot, Result<(), ChainFailure>)> {
        let mut all = Vec::new();
        while all.len() < count {
            let mut bytes = [0u8; 8];
            assert!(wake_rx.read_some(&mut bytes).await.unwrap() > 0);
            all.extend(ring.reap());
        }
        assert!(!ring.any_busy());
        all
    }

    fn filled(file: &DirectFile, len: usize, byte: u8) -> Rc<AlignedBuffer> {
        let mut buffer = file.alloc_buffer(len);
        buffer.as_bytes_mut().fill(byte);
        Rc::new(buffer)
    }

    fn write(file: &DirectFile, position: u64, buffer: Rc<AlignedBuffer>) -> ChainWrite {
        let mut write = ChainWrite::new(file.as_raw_fd(), position);
        let len = buffer.len();
        write.push_buffer(buffer, len);
        write
    }

    async fn open(path: &std::path::Path) -> DirectFile {
        DirectFile::open(path, true).await.unwrap()
    }

    #[test]
    fn chains_of_both_slots_land_and_wake_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::run_local(|| async {
            let file = open(&dir.path().join("log")).await;
            let (mut ring, mut wake_rx) = CommitRing::new(false).unwrap();
            // The second write gathers two buffers (the flush of a tail run across chunks).
            let mut gathered = write(&file, 4096, filled(&file, 4096, b'b'));
            gathered.push_buffer(filled(&file, 8192, b'c'), 4096);
            let writes = vec![write(&file, 0, filled(&file, 4096, b'a')), gathered];
            ring.submit(Slot::Data, writes, &[], true).unwrap();
            let zeros = vec![write(&file, 1 << 20, filled(&file, 4096, 0))];
            ring.submit(Slot::ZeroFill, zeros, &[(file.as_raw_fd(), None)], false)
                .unwrap();
            assert!(ring.busy(Slot::Data) && ring.busy(Slot::ZeroFill));
            let outcomes = ended(&mut ring, &mut wake_rx, 2).await;
            assert_eq!(outcomes.len(), 2);
            for (_, outcome) in &outcomes {
                assert!(outcome.is_ok(), "{outcome:?}");
            }
            // Read back without glommio: its first DMA file on a device decides whether reads
            // are polled (ARCHITECTURE §5), and this one was empty.
            let read = std::fs::read(dir.path().join("log")).unwrap();
            assert!(read[..4096].iter().all(|&b| b == b'a'));
            assert!(read[4096..8192].iter().all(|&b| b == b'b'));
            assert!(read[8192..12288].iter().all(|&b| b == b'c'));
            assert_eq!(read.len(), (1 << 20) + 4096);
            file.close().await.unwrap();
        });
    }

    #[test]
    fn a_failed_step_is_reported_and_the_chain_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::run_local(|| async {
            let path = dir.path().join("log");
            let file = open(&path).await;
            let (mut ring, mut wake_rx) = CommitRing::new(false).unwrap();
            // An injected fault: the step is not issued and fails with its errno.
            let mut faulty = write(&file, 0, filled(&file, 4096, 1));
            faulty.fail_with = Some(libc::EIO);
            ring.submit(Slot::Data, vec![faulty], &[], true).unwrap();
            let (slot, outcome) = ended(&mut ring, &mut wake_rx, 1).await.remove(0);
            assert_eq!(slot, Slot::Data);
            let failure = outcome.unwrap_err();
            assert_eq!(failure.context, "commitlog write");
            assert_eq!(failure.error.raw_os_error(), Some(libc::EIO));
            // A real failure (writing through a read-only descriptor): the hard links still run
            // the fdatasync and the wake-up after it.
            let read_only = std::fs::File::open(&path).unwrap();
            let mut rejected = write(&file, 0, filled(&file, 4096, 2));
            rejected.fd = std::os::fd::AsRawFd::as_raw_fd(&read_only);
            ring.submit(
                Slot::ZeroFill,
                vec![rejected],
                &[(file.as_raw_fd(), None)],
                false,
            )
            .unwrap();
            let (slot, outcome) = ended(&mut ring, &mut wake_rx, 1).await.remove(0);
            assert_eq!(slot, Slot::ZeroFill);
            let failure = outcome.unwrap_err();
            assert_eq!(failure.context, "commitlog write");
            assert_eq!(failure.error.raw_os_error(), Some(libc::EBADF));
            // An injected fdatasync fault after a good write.
            let good = write(&file, 0, filled(&file, 4096, 3));
            ring.submit(
                Slot::Data,
                vec![good],
                &[(file.as_raw_fd(), Some(libc::EIO))],
                true,
            )
            .unwrap();
            let (_, outcome) = ended(&mut ring, &mut wake_rx, 1).await.remove(0);
            assert_eq!(outcome.unwrap_err().context, "commitlog fdatasync");
            file.close().await.unwrap();
        });
    }

    #[test]
    fn dropping_the_ring_waits_for_a_chain_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        crate::runtime::run_local(|| async {
            let file = open(&dir.path().join("log")).await;
            let (mut ring, _wake_rx) = CommitRing::new(false).unwrap();
            let buffer = filled(&file, 1 << 20, 7);
            ring.submit(Slot::Data, vec![write(&file, 0, buffer.clone())], &[], true)
                .unwrap();
            drop(ring);
            // The chain's reference went with it: the kernel is done with the buffer.
            assert_eq!(Rc::strong_count(&buffer), 1);
            let read = std::fs::read(dir.path().join("log")).unwrap();
            assert!(read.len() == 1 << 20 && read.iter().all(|&b| b == 7));
            file.close().await.unwrap();
        });
    }
}
