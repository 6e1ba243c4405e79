//! Client sockets whose readiness comes from one epoll set per shard, not from one io_uring
//! poll per socket: a shard's cost per turn no longer grows with the connections it holds.
//!
//! Why not glommio's streams: a glommio stream waiting to be readable holds a POLL_ADD on the
//! shard's main ring, and every turn of glommio's loop cancels and re-arms a timer on that
//! ring. The kernel looks for the request to cancel among the ring's polls first: a walk of
//! one bucket of a hash of 32 buckets at ring depth 512 (256 at most), each entry a cache miss.
//! With 5,000 idle connections on a shard that walk (`io_poll_find`) was 20% of the shard's
//! CPU at 20,000 requests a second; with 500, 2%. Every connection made every turn dearer.
//!
//! How: each socket is in the shard's epoll set, edge-triggered, for input and output. The
//! set is watched by one poll on a small ring of our own, linked to a send of one byte on the
//! runtime's wake pair (`wake`): a parked shard wakes on that byte, as for the commitlog's
//! ring. The ring sets COOP_TASKRUN, so the client's CPU does not interrupt a busy shard to
//! tell it (glommio's rings do: a reschedule IPI for many of the completions). The task that
//! reads the wake byte collects the ready sockets and arms the poll again, once per turn of
//! glommio's loop however many sockets became ready (collecting also from the poll hook busy
//! loops call between requests made a round of every readiness: 0.12 system calls a message
//! in a closed loop of 4 connections, against 0.11 without and 0.08 with glommio's polls).
//! Reads and writes are plain non-blocking `recv`/`send`. Listeners are in the set too
//! (`Listening`): their connections are taken with a non-blocking `accept4`.
//!
//! Invariants: a socket's readiness flag is cleared before each attempt, so an edge after the
//! attempt sets it again and no wake-up is lost (once the peer's end or an error was seen the
//! flag stays set: no edge follows those); a socket waits for an edge only after an
//! attempt that left it drained (a short read, EAGAIN, a short send). A slot's generation
//! changes when its socket goes, so an event collected for an old socket is ignored. All of
//! it lives on one shard's thread.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::task::{Poll, Waker};

use io_uring::{opcode, squeue, types, IoUring};

use super::wake;

/// Entries of the watching ring: one poll and its linked send, with room for a chain whose
/// send is still to complete while the next is armed.
pub const WATCH_RING_ENTRIES: u32 = 8;
/// Events taken from the epoll set per epoll_wait; more are taken by waiting again.
const EVENTS_PER_WAIT: usize = 256;
/// The watching ring's user data: the poll of the epoll set, the wake-up send.
const POLL_USER_DATA: u64 = 1;
const WAKE_USER_DATA: u64 = 2;
/// Buffers one send(2) of `Socket::write_all_vectored` gathers at most (the kernel takes up
/// to IOV_MAX, 1,024).
const IOVECS_PER_SEND: usize = 64;
/// What the kernel sends on the wake-up pair when the epoll set has events.
static WAKE_BYTE: [u8; 1] = [1];

/// A connected socket of the current shard, read and written without blocking. Shared by
/// a connection's read and write tasks (`Rc`); closed when the last holder drops it.
pub struct Socket {
    fd: OwnedFd,
    token: u64,
    /// The last read left nothing to read: the next waits for an edge first.
    read_drained: Cell<bool>,
    /// The last send could not take everything: the next waits for an edge first.
    write_full: Cell<bool>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

impl Socket {
    /// Takes over a connection accepted through the runtime (`runtime::Acceptor`).
    pub fn adopt(stream: std::net::TcpStream) -> io::Result<Socket> {
        let fd = OwnedFd::from(stream);
        let token = with_reactor(|reactor| reactor.register(fd.as_raw_fd()))??;
        Ok(Socket {
            fd,
            token,
            read_drained: Cell::new(false),
            write_full: Cell::new(false),
        })
    }

    /// The descriptor (for shutdown(2)); it stays this socket's.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads what has arrived, up to `into.len()` bytes, waiting for some if none has; 0 at
    /// the end of the stream.
    pub async fn read(&self, into: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.read_drained.get() {
                ready(self.token, Direction::Read).await?;
            }
            clear(self.token, Direction::Read);
            // SAFETY: recv(2) into a live, exclusively borrowed buffer of `into.len()` bytes.
            let read = unsafe {
                libc::recv(
                    self.raw_fd(),
                    into.as_mut_ptr().cast(),
                    into.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if read >= 0 {
                let read = read as usize;
                self.read_drained.set(read > 0 && read < into.len());
                return Ok(read);
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::WouldBlock => self.read_drained.set(true),
                io::ErrorKind::Interrupted => {}
                _ => return Err(error),
            }
        }
    }

    /// Writes all of `bytes`, waiting for room as often as the peer's window needs.
    pub async fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        self.write_all_vectored(&[bytes]).await
    }

    /// Writes all of `pieces`, in order, as one stream: each send(2) gathers as many pieces
    /// as it can (up to `IOVECS_PER_SEND`), so bytes held in buffers of their own (a pull's
    /// records) go out from there without being copied together first.
    pub async fn write_all_vectored(&self, pieces: &[&[u8]]) -> io::Result<()> {
        let total: usize = pieces.iter().map(|piece| piece.len()).sum();
        // The piece being written and how much of it is gone.
        let (mut index, mut within) = (0usize, 0usize);
        let mut written = 0usize;
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        while written < total {
            if self.write_full.get() {
                ready(self.token, Direction::Write).await?;
            }
            clear(self.token, Direction::Write);
            // Past the pieces written whole (and the empty ones).
            while within == pieces[index].len() {
                index += 1;
                within = 0;
            }
            // On the stack, not held across the wait above: every connection's writer task
            // would carry it.
            let mut iovecs = [empty; IOVECS_PER_SEND];
            let (mut gathered, mut gathered_bytes) = (0, 0);
            let mut skip = within;
            for piece in pieces[index..].iter().filter(|piece| !piece.is_empty()) {
                let rest = &piece[skip..];
                skip = 0;
                iovecs[gathered] = libc::iovec {
                    iov_base: rest.as_ptr() as *mut libc::c_void,
                    iov_len: rest.len(),
                };
                gathered += 1;
                gathered_bytes += rest.len();
                if gathered == IOVECS_PER_SEND {
                    break;
                }
            }
            let iovecs = &mut iovecs[..gathered];
            // MSG_NOSIGNAL: a peer that went away is an EPIPE here, not a signal.
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            let sent = if let [only] = iovecs {
                // One piece (most writes: no body of its own): send(2), which takes no
                // vector to copy in.
                // SAFETY: send(2) from a live buffer of `only.iov_len` bytes.
                unsafe { libc::send(self.raw_fd(), only.iov_base, only.iov_len, flags) }
            } else {
                // SAFETY: an all-zero msghdr is valid; it points at `iovecs`, which describe
                // live buffers the kernel only reads during the call.
                let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
                message.msg_iov = iovecs.as_mut_ptr();
                message.msg_iovlen = iovecs.len() as _;
                unsafe { libc::sendmsg(self.raw_fd(), &message, flags) }
            };
            if sent >= 0 {
                let mut sent = sent as usize;
                written += sent;
                // Short of what this send gathered: the socket's buffer is full, and an edge
                // comes when it has room. All of it (fewer pieces than remain): no edge
                // would come, so the next send goes at once.
                self.write_full.set(sent < gathered_bytes);
                while sent > 0 {
                    let left = pieces[index].len() - within;
                    if sent < left {
                        within += sent;
                        break;
                    }
                    sent -= left;
                    index += 1;
                    within = 0;
                }
                continue;
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::WouldBlock => self.write_full.set(true),
                io::ErrorKind::Interrupted => {}
                _ => return Err(error),
            }
        }
        Ok(())
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // Out of the set before the descriptor closes (its number may be reused at once).
        let _ = with_reactor(|reactor| reactor.unregister(self.fd.as_raw_fd(), self.token));
    }
}

/// A listening socket of this shard in the epoll set: a connection is taken with a
/// non-blocking accept4 when the listener's queue holds one, and the task waits for an edge
/// only after an accept found the queue empty. No accept request waits on a ring of
/// glommio's, where a completed accept whose completion was not collected left connections
/// unserved (see `runtime::TcpListener`).
pub struct Listening {
    /// The listener's descriptor, owned by the listener, which outlives this.
    fd: RawFd,
    token: u64,
    /// The last accept found the queue empty: the next waits for an edge first.
    drained: Cell<bool>,
}

impl Listening {
    /// Adds listener `fd` (non-blocking) to this shard's set.
    pub(crate) fn register(fd: RawFd) -> io::Result<Listening> {
        let token = with_reactor(|reactor| reactor.register(fd))??;
        Ok(Listening {
            fd,
            token,
            drained: Cell::new(false),
        })
    }

    /// The next connection of the listener's queue, waiting for one if none is there. An
    /// error (descriptors or memory short) leaves the connection queued for the next call.
    pub(crate) async fn accept(&self) -> io::Result<OwnedFd> {
        loop {
            if self.drained.get() {
                ready(self.token, Direction::Read).await?;
            }
            clear(self.token, Direction::Read);
            // SAFETY: accept4(2) on the listener's open descriptor; the new descriptor it
            // returns is owned by the OwnedFd made from it.
            let accepted = unsafe {
                libc::accept4(
                    self.fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if accepted >= 0 {
                // The queue may hold more: the next call tries before it waits.
                self.drained.set(false);
                // SAFETY: a descriptor accept4 just made, owned here alone.
                return Ok(unsafe { OwnedFd::from_raw_fd(accepted) });
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EAGAIN) => self.drained.set(true),
                // A connection reset while queued, or a signal: the queue may hold more.
                Some(libc::ECONNABORTED) | Some(libc::EINTR) => {}
                _ => return Err(error),
            }
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = with_reactor(|reactor| reactor.unregister(self.fd, self.token));
    }
}

/// Resolves once an edge in `direction` (or a hang-up or error) was collected for `token`
/// since its flag was last cleared; an error when the shard is stopping.
async fn ready(token: u64, direction: Direction) -> io::Result<()> {
    poll_fn(|cx| {
        match with_reactor(|reactor| reactor.ready_or_wait(token, direction, cx.waker())) {
            Ok(false) => Poll::Pending,
            Ok(true) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(error)),
        }
    })
    .await
}

/// Clears a socket's flag before an attempt; an end or error seen stays (no edge follows it,
/// and a read may return the bytes before the end first).
fn clear(token: u64, direction: Direction) {
    let _ = with_reactor(|reactor| {
        if let Some(slot) = reactor.slot(token) {
            match direction {
                Direction::Read => slot.readable = slot.read_ended,
                Direction::Write => slot.writable = slot.write_ended,
            }
        }
    });
}

#[derive(Default)]
struct Slot {
    generation: u32,
    readable: bool,
    writable: bool,
    /// The peer's end of its output, a hang-up or an error was seen: every read goes to the
    /// socket.
    read_ended: bool,
    /// A hang-up or an error was seen: every write goes to the socket (it fails). A peer that
    /// only ended its output may still read.
    write_ended: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
}

/// A shard's epoll set, the ring that watches it, and the sockets' slots.
struct Reactor {
    epoll: OwnedFd,
    ring: IoUring,
    wake_tx: wake::Waker,
    /// The poll of the epoll set is in flight (its completion not yet collected).
    poll_armed: bool,
    /// Arming failed: the wake-up task retries after a pause instead of waiting for a byte.
    arm_failed: bool,
    slots: Vec<Slot>,
    free: Vec<u32>,
    events: Vec<libc::epoll_event>,
}

thread_local! {
    static REACTOR: RefCell<Option<Reactor>> = const { RefCell::new(None) };
}

/// Runs `f` on this shard's reactor, making it on first use; an error when it could not be
/// made (or the thread is ending).
fn with_reactor<R>(f: impl FnOnce(&mut Reactor) -> R) -> io::Result<R> {
    let made = REACTOR
        .try_with(|cell| cell.borrow().is_some())
        .map_err(|_| io::Error::other("the shard is stopping"))?;
    if !made {
        start_reactor()?;
    }
    REACTOR.with(|cell| Ok(f(cell.borrow_mut().as_mut().expect("made above"))))
}

fn start_reactor() -> io::Result<()> {
    // SAFETY: epoll_create1 with a valid flag; the result is checked.
    let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epoll < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned here alone.
    let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
    // As the commitlog's ring: completions do not interrupt the shard; only it submits.
    let ring = IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .setup_single_issuer()
        .build(WATCH_RING_ENTRIES)?;
    let (wake_tx, mut wake_rx) = wake::pair()?;
    let mut reactor = Reactor {
        epoll,
        ring,
        wake_tx,
        poll_armed: false,
        arm_failed: false,
        slots: Vec::new(),
        free: Vec::new(),
        events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_PER_WAIT],
    };
    reactor.arm();
    // In place, and not borrowed, before the task is spawned: the new task may run at once and
    // looks the reactor up itself.
    REACTOR.with(|cell| *cell.borrow_mut() = Some(reactor));
    super::spawn_detached(async move {
        loop {
            let retry = REACTOR.with(|cell| cell.borrow().as_ref().is_some_and(|r| r.arm_failed));
            if retry {
                super::sleep(std::time::Duration::from_millis(1)).await;
            } else if wake_rx.wait().await.is_err() {
                return;
            }
            pump_if_fired();
        }
    });
    Ok(())
}

/// Collects the ready sockets and wakes their tasks if the epoll set's poll has fired (or
/// is not armed), then arms it again. A few memory reads when it has not fired (the wake byte
/// of an earlier round).
fn pump_if_fired() {
    let wakers = REACTOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        let reactor = cell.as_mut()?;
        reactor.collect_completions();
        if reactor.poll_armed {
            return None;
        }
        let wakers = reactor.collect_ready();
        reactor.arm();
        Some(wakers)
    });
    for waker in wakers.into_iter().flatten() {
        waker.wake();
    }
}

impl Reactor {
    fn register(&mut self, fd: RawFd) -> io::Result<u64> {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.readable = true;
        slot.writable = true;
        slot.read_ended = false;
        slot.write_ended = false;
        let token = (u64::from(slot.generation) << 32) | u64::from(index);
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: both descriptors are open; `event` is a live epoll_event.
        let added =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if added < 0 {
            let error = io::Error::last_os_error();
            self.release(index);
            return Err(error);
        }
        Ok(token)
    }

    fn unregister(&mut self, fd: RawFd, token: u64) {
        // SAFETY: epoll_ctl(DEL) of a descriptor still open; the event argument is unused.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
        if self.slot(token).is_some() {
            self.release(token as u32);
        }
    }

    fn release(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.reader = None;
        slot.writer = None;
        self.free.push(index);
    }

    /// The live slot `token` names (`None` once its socket went).
    fn slot(&mut self, token: u64) -> Option<&mut Slot> {
        let slot = self.slots.get_mut((token & u64::from(u32::MAX)) as usize)?;
        (u64::from(slot.generation) == token >> 32).then_some(slot)
    }

    fn ready_or_wait(&mut self, token: u64, direction: Direction, waker: &Waker) -> bool {
        let Some(slot) = self.slot(token) else {
            return true;
        };
        let (ready, waiting) = match direction {
            Direction::Read => (slot.readable, &mut slot.reader),
            Direction::Write => (slot.writable, &mut slot.writer),
        };
        if !ready {
            match waiting {
                Some(old) if old.will_wake(waker) => {}
                _ => *waiting = Some(waker.clone()),
            }
        }
        ready
    }

    /// Takes the watching ring's completions; clears `poll_armed` when the poll's is among
    /// them.
    fn collect_completions(&mut self) {
        // The poll may have completed in the kernel and wait for this thread to post it.
        let _ = super::post_ring_task_work(&mut self.ring);
        for cqe in self.ring.completion() {
            if cqe.user_data() == POLL_USER_DATA {
                self.poll_armed = false;
            }
        }
    }

    /// Takes every event of the epoll set; the wakers of the tasks waiting on those sockets.
    fn collect_ready(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::new();
        loop {
            // SAFETY: `events` is a live array of `events.len()` entries; timeout 0.
            let count = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    self.events.len() as libc::c_int,
                    0,
                )
            };
            if count <= 0 {
                return wakers;
            }
            for index in 0..count as usize {
                let libc::epoll_event { events, u64: token } = self.events[index];
                let Some(slot) = self.slot(token) else {
                    continue;
                };
                let hang_up = (libc::EPOLLHUP | libc::EPOLLERR) as u32;
                slot.read_ended |= events & (hang_up | libc::EPOLLRDHUP as u32) != 0;
                slot.write_ended |= events & hang_up != 0;
                if events & ((libc::EPOLLIN | libc::EPOLLRDHUP) as u32 | hang_up) != 0 {
                    slot.readable = true;
                    wakers.extend(slot.reader.take());
                }
                if events & (libc::EPOLLOUT as u32 | hang_up) != 0 {
                    slot.writable = true;
                    wakers.extend(slot.writer.take());
                }
            }
            if (count as usize) < self.events.len() {
                return wakers;
            }
        }
    }

    /// Arms the poll of the epoll set, linked to the wake-up send. It fires at once if the
    /// set already has events.
    fn arm(&mut self) {
        let poll = opcode::PollAdd::new(types::Fd(self.epoll.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(POLL_USER_DATA)
            .flags(squeue::Flags::IO_HARDLINK);
        // Never waits for room: a full wake-up socket already holds a wake-up.
        let send = opcode::Send::new(types::Fd(self.wake_tx.raw_fd()), WAKE_BYTE.as_ptr(), 1)
            .flags(libc::MSG_DONTWAIT)
            .build()
            .user_data(WAKE_USER_DATA);
        // After a failed submission the pair is still queued: it is submitted again.
        let mut queue = self.ring.submission();
        if queue.is_empty() {
            // SAFETY: both entries point at nothing that can go before they complete (the
            // epoll set and the socket live as long as the ring; WAKE_BYTE is static).
            unsafe { queue.push_multiple(&[poll, send]) }.expect("an empty queue has room");
        }
        drop(queue);
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => continue,
                Err(error) => {
                    log::warn!("sockets: watching the epoll set failed, retrying: {error}");
                    self.arm_failed = true;
                    return;
                }
            }
        }
        self.poll_armed = true;
        self.arm_failed = false;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use super::Socket;
    use crate::runtime;

    /// CPU time of this thread so far.
    fn thread_cpu() -> Duration {
        // SAFETY: getrusage(2) into a zeroed struct it fills.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
            usage
        };
        let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
    }

    /// A connected pair: a socket of this shard and a plain blocking peer.
    async fn pair() -> (Socket, std::net::TcpStream) {
        let listener = runtime::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || std::net::TcpStream::connect(address).unwrap());
        let stream = listener.acceptor().accept().await.unwrap();
        (Socket::adopt(stream).unwrap(), peer.join().unwrap())
    }

    #[test]
    fn a_listener_hands_over_queued_connections_and_waits_for_the_next() {
        runtime::run_local(|| async {
            let listener = runtime::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let address = listener.local_addr().unwrap();
            let mut acceptor = listener.acceptor();
            // Three queued before the first accept, then one after the acceptor has waited.
            let peers = std::thread::spawn(move || {
                let mut peers: Vec<_> = (0..3)
                    .map(|_| std::net::TcpStream::connect(address).unwrap())
                    .collect();
                std::thread::sleep(Duration::from_millis(300));
                peers.push(std::net::TcpStream::connect(address).unwrap());
                peers
            });
            let mut accepted = Vec::new();
            for _ in 0..4 {
                accepted.push(acceptor.accept().await.unwrap().peer_addr().unwrap());
            }
            let peers = peers.join().unwrap();
            let expected: Vec<_> = peers.iter().map(|p| p.local_addr().unwrap()).collect();
            assert_eq!(accepted, expected, "every connection, in the order it came");
            // The listener stays non-blocking: the acceptor's attempts never block the shard.
            let fd = acceptor.listening.as_ref().unwrap().fd;
            // SAFETY: F_GETFL on a descriptor the listener owns.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            assert_ne!(flags & libc::O_NONBLOCK, 0);
        });
    }

    #[test]
    fn an_idle_acceptor_sleeps() {
        runtime::run_local(|| async {
            let listener = runtime::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let address = listener.local_addr().unwrap();
            let peer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                std::net::TcpStream::connect(address).unwrap()
            });
            let cpu_before = thread_cpu();
            let stream = listener.acceptor().accept().await.unwrap();
            let cpu = thread_cpu() - cpu_before;
            let peer = peer.join().unwrap();
            assert_eq!(stream.peer_addr().unwrap(), peer.local_addr().unwrap());
            assert!(
                cpu < Duration::from_millis(50),
                "{cpu:?} of CPU waiting 500 ms"
            );
        });
    }

    #[test]
    fn a_read_waits_for_bytes_and_sees_the_end_of_the_stream() {
        runtime::run_local(|| async {
            let (socket, mut peer) = pair().await;
            let writer = std::thread::spawn(move || {
                for chunk in [&b"first"[..], b"second"] {
                    std::thread::sleep(Duration::from_millis(50));
                    peer.write_all(chunk).unwrap();
                }
                // Closing ends the stream.
            });
            let mut got = Vec::new();
            let mut buffer = [0u8; 64];
            loop {
                let read = socket.read(&mut buffer).await.unwrap();
                if read == 0 {
                    break;
                }
                got.extend_from_slice(&buffer[..read]);
            }
            writer.join().unwrap();
            assert_eq!(got, b"firstsecond");
        });
    }

    #[test]
    fn a_write_larger_than_the_socket_buffers_waits_for_the_peer_to_read() {
        runtime::run_local(|| async {
            let (socket, mut peer) = pair().await;
            // A peer that ended its output still reads: the end seen must not make every
            // write attempt at once (a spin on EAGAIN while the peer reads slowly).
            peer.shutdown(std::net::Shutdown::Write).unwrap();
            assert_eq!(socket.read(&mut [0u8; 8]).await.unwrap(), 0);
            let bytes: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
            let expected = bytes.clone();
            let reader = std::thread::spawn(move || {
                // Let the writer fill every buffer and wait first, then read slowly.
                std::thread::sleep(Duration::from_millis(100));
                let mut got = Vec::new();
                let mut chunk = vec![0u8; 64 << 10];
                loop {
                    let read = peer.read(&mut chunk).unwrap();
                    if read == 0 {
                        return got;
                    }
                    got.extend_from_slice(&chunk[..read]);
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let cpu_before = thread_cpu();
            let started = std::time::Instant::now();
            socket.write_all(&bytes).await.unwrap();
            let (cpu, wall) = (thread_cpu() - cpu_before, started.elapsed());
            assert!(
                wall >= Duration::from_millis(200),
                "it waited for the peer: {wall:?}"
            );
            assert!(cpu < wall / 8, "{cpu:?} of CPU in {wall:?}: it spun");
            drop(socket);
            assert!(reader.join().unwrap() == expected, "every byte, in order");
        });
    }

    #[test]
    fn a_vectored_write_sends_its_pieces_in_order_across_partial_sends() {
        runtime::run_local(|| async {
            let (socket, mut peer) = pair().await;
            // More pieces than one send gathers, empty ones among them, and more bytes than
            // the socket buffers hold: sends end inside pieces and between them.
            let pieces: Vec<Vec<u8>> = (0..300usize)
                .map(|i| {
                    let len = if i % 7 == 0 {
                        0
                    } else {
                        (i * 7919) % (48 << 10)
                    };
                    (0..len).map(|j| ((i + j) % 253) as u8).collect()
                })
                .collect();
            let expected = pieces.concat();
            let reader = std::thread::spawn(move || {
                // Let the writer fill the socket buffers first.
                std::thread::sleep(Duration::from_millis(50));
                let mut got = Vec::new();
                peer.read_to_end(&mut got).unwrap();
                got
            });
            let slices: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            // A send that took all it gathered but not all there is must not wait for an
            // edge (none comes while the socket has room): it hung here once.
            let write = async {
                socket.write_all_vectored(&slices).await.unwrap();
                socket.write_all_vectored(&[&[], b"end"]).await.unwrap();
                true
            };
            let timeout = async {
                runtime::sleep(Duration::from_secs(30)).await;
                false
            };
            assert!(
                futures_lite::future::or(write, timeout).await,
                "the write did not end in 30 s"
            );
            drop(socket);
            let got = reader.join().unwrap();
            assert_eq!(got.len(), expected.len() + 3);
            assert!(
                got[..expected.len()] == expected[..],
                "every byte, in order"
            );
            assert_eq!(&got[expected.len()..], b"end");
        });
    }

    #[test]
    fn a_closed_socket_leaves_the_set_and_its_slot_serves_the_next() {
        runtime::run_local(|| async {
            let (first, mut first_peer) = pair().await;
            let first_token = first.token;
            drop(first);
            // The peer sees the close.
            let mut buffer = [0u8; 8];
            assert_eq!(first_peer.read(&mut buffer).unwrap(), 0);
            let (second, mut second_peer) = pair().await;
            assert_eq!(
                second.token & 0xffff_ffff,
                first_token & 0xffff_ffff,
                "slot reused"
            );
            assert_ne!(second.token, first_token, "with a new generation");
            second_peer.write_all(b"x").unwrap();
            assert_eq!(second.read(&mut buffer).await.unwrap(), 1);
            second.write_all(b"y").await.unwrap();
            assert_eq!(second_peer.read(&mut buffer).unwrap(), 1);
        });
    }

    #[test]
    fn many_sockets_waiting_at_once_each_get_their_bytes() {
        runtime::run_local(|| async {
            let mut sockets = Vec::new();
            let mut peers = Vec::new();
            for _ in 0..200 {
                let (socket, peer) = pair().await;
                sockets.push(std::rc::Rc::new(socket));
                peers.push(peer);
            }
            let tasks: Vec<_> = sockets
                .iter()
                .map(|socket| {
                    let socket = socket.clone();
                    runtime::spawn(async move {
                        let mut buffer = [0u8; 16];
                        let read = socket.read(&mut buffer).await.unwrap();
                        buffer[..read].to_vec()
                    })
                })
                .collect();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                for (index, peer) in peers.iter_mut().enumerate().rev() {
                    peer.write_all(format!("{index}").as_bytes()).unwrap();
                }
                peers
            });
            for (index, task) in tasks.into_iter().enumerate() {
                assert_eq!(task.await, format!("{index}").into_bytes());
            }
            writer.join().unwrap();
        });
    }
}
