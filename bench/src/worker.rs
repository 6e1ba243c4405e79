//! The producer load: each worker thread owns a set of broker connections and drives them
//! with one loop over non-blocking sockets: an epoll set says which are ready (`Readiness`)
//! and a heap of due times which must send (`Agenda`). Nothing is shared between workers but
//! the read-only frame templates; counts go to the main thread as messages, one `Tally` per
//! worker per one-second tick.
//!
//! Per connection, at most `in_flight_max` send requests are outstanding. Closed loop (no
//! `--rate`): the loop tops the window up in one burst (one write for many frames), reads
//! whatever responses arrived, matches them by opaque and tops up again; a request's intended
//! send time is the moment its frame joins the output buffer. Open loop (`--rate`): each
//! connection has a schedule, one request every `interval`, and a request's intended send
//! time is its slot in the schedule, whether or not the window let it go then; a broker that
//! stalls therefore shows its stall in every request that was due meanwhile (no coordinated
//! omission). Latency runs from the intended send time to the read that returned the
//! response, so time queued in our own buffer counts, as a client would see it.
//!
//! Invariants: an opaque is in `in_flight` exactly while its request is unanswered and
//! unexpired; the unsent part of the output buffer stays under `OUT_PENDING_MAX_BYTES` plus
//! one frame; the input buffer never outgrows one maximal frame or `READ_CHUNK_BYTES`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardmq_protocol::remoting::{
    decode_frame, peek_frame_size_bytes, response_code, RemotingCommand,
};

use crate::clock::RunClock;
use crate::collect::{Figures, Report};
use crate::send_frame::{OpaqueSequence, RequestStamp, SendTemplate, UniqKeyGenerator};
use crate::stats::{SendFailure, Tally};

/// Outstanding requests per connection: bounds the opaque table and the output buffer,
/// and stays far below the billion-wide opaque span (no live opaque is ever reused).
pub const IN_FLIGHT_MAX_REQUESTS: usize = 65_536;
/// No new frame is queued while this much is still unsent: a slow socket gets a bounded
/// backlog, not an unbounded one.
const OUT_PENDING_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Bytes asked for per read(2); many small responses arrive per read.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Reads per connection per wake-up, so one busy connection cannot starve the others.
pub(crate) const READS_PER_WAKEUP_MAX: usize = 16;
/// The loop wakes at least this often to check ticks, timeouts and the deadline.
pub const POLL_WAIT_MAX: Duration = Duration::from_millis(100);
/// Expired requests are looked for this often.
const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Length of one reporting interval.
pub const TICK: Duration = Duration::from_secs(1);
/// After a busy answer (SYSTEM_BUSY, SERVICE_NOT_AVAILABLE: the broker's flow control) a
/// connection sends nothing new for this long, as RocketMQ clients back off.
const BUSY_BACKOFF: Duration = Duration::from_millis(1);
/// Answers that mean "not now": counted as Response Failed, and in `--messages` mode the
/// request is sent again, so that the count stored is the count asked for.
const BUSY_CODES: [i32; 2] = [
    response_code::SYSTEM_BUSY,
    response_code::SERVICE_NOT_AVAILABLE,
];

const _: () =
    assert!(IN_FLIGHT_MAX_REQUESTS < (i32::MAX - crate::send_frame::OPAQUE_FIRST) as usize);

/// One connection handed to a worker, already connected.
#[derive(Debug)]
pub struct ConnectionPlan {
    /// Unique in the run; part of every UNIQ_KEY.
    pub index: usize,
    pub broker_addr: String,
    pub stream: TcpStream,
    /// The TLS session over `stream` (`--tls`).
    pub tls: Option<rustls::ClientConnection>,
    /// One frame per write queue of the broker, by queue id.
    pub templates: Arc<Vec<SendTemplate>>,
    /// Requests to send on this connection; `None`: until the deadline.
    pub quota_requests: Option<u64>,
    /// Open loop: this connection's schedule (first slot, then one request per interval).
    pub pacing: Option<Pacing>,
}

/// An open-loop schedule.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// When the next request is due.
    pub next_due: Instant,
    pub interval: Duration,
}

/// What a worker runs and where it reports.
#[derive(Debug)]
pub struct WorkerPlan {
    /// Index of this worker, named in its reports.
    pub worker: usize,
    pub connections: Vec<ConnectionPlan>,
    pub in_flight_max: usize,
    pub run_prefix: u64,
    pub clock: RunClock,
    /// No new request after this instant (duration mode).
    pub deadline: Option<Instant>,
    pub request_timeout: Duration,
    pub reports: Sender<Report>,
}

struct Connection {
    broker_addr: String,
    wire: Wire,
    templates: Arc<Vec<SendTemplate>>,
    next_queue_id: usize,
    opaques: OpaqueSequence,
    uniq_keys: UniqKeyGenerator,
    /// Opaque → the request's intended send time and its message count.
    in_flight: HashMap<i32, (Instant, u64)>,
    in_flight_max: usize,
    quota_requests: Option<u64>,
    pacing: Option<Pacing>,
    /// No new request before this (after a busy answer).
    backoff_until: Option<Instant>,
    out: Vec<u8>,
    out_written: usize,
    input: Vec<u8>,
    input_filled: usize,
    open: bool,
}

impl Connection {
    fn new(plan: ConnectionPlan, in_flight_max: usize, run_prefix: u64) -> Self {
        assert!(
            !plan.templates.is_empty(),
            "a broker without write queues is no target"
        );
        assert!((1..=IN_FLIGHT_MAX_REQUESTS).contains(&in_flight_max));
        Connection {
            broker_addr: plan.broker_addr,
            wire: Wire {
                stream: plan.stream,
                tls: plan.tls,
            },
            templates: plan.templates,
            next_queue_id: 0,
            opaques: OpaqueSequence::new(),
            uniq_keys: UniqKeyGenerator::new(run_prefix, plan.index),
            in_flight: HashMap::with_capacity(in_flight_max),
            in_flight_max,
            quota_requests: plan.quota_requests,
            pacing: plan.pacing,
            backoff_until: None,
            out: Vec::new(),
            out_written: 0,
            input: vec![0; READ_CHUNK_BYTES],
            input_filled: 0,
            open: true,
        }
    }

    fn unsent_bytes(&self) -> usize {
        self.out.len() - self.out_written + usize::from(self.wire.tls_output_waits())
    }

    fn quota_left(&self) -> bool {
        self.quota_requests != Some(0)
    }

    fn window_open(&self) -> bool {
        self.in_flight.len() < self.in_flight_max && self.unsent_bytes() < OUT_PENDING_MAX_BYTES
    }

    /// When the loop must wake to send: the end of a back-off, or (open loop) when the next
    /// request is due, if the window would let it go.
    fn next_due(&self) -> Option<Instant> {
        if !self.open || !self.window_open() || !self.quota_left() {
            return None;
        }
        match (self.backoff_until, &self.pacing) {
            (Some(until), Some(pacing)) => Some(until.max(pacing.next_due)),
            (Some(until), None) => Some(until),
            (None, Some(pacing)) => Some(pacing.next_due),
            (None, None) => None,
        }
    }

    /// Queues frames until the window, the output bound or the quota is reached (and, in
    /// open loop, until no request is due yet).
    fn fill(&mut self, now: Instant, clock: &RunClock) {
        if self.backoff_until.is_some_and(|until| until > now) {
            return;
        }
        self.backoff_until = None;
        let born_timestamp_ms = clock.unix_millis(now);
        while self.window_open() && self.quota_left() {
            let intended = match &mut self.pacing {
                Some(pacing) if pacing.next_due > now => break,
                Some(pacing) => {
                    let due = pacing.next_due;
                    pacing.next_due += pacing.interval;
                    due
                }
                None => now,
            };
            let template = &self.templates[self.next_queue_id];
            self.next_queue_id = (self.next_queue_id + 1) % self.templates.len();
            let opaque = self.opaques.next_opaque();
            let stamp = RequestStamp {
                opaque,
                born_timestamp_ms,
                sent_micros: clock.unix_micros(intended),
            };
            template.append(&mut self.out, stamp, &mut self.uniq_keys);
            let messages = template.messages_per_request() as u64;
            let previous = self.in_flight.insert(opaque, (intended, messages));
            assert!(previous.is_none(), "opaque {opaque} reused while in flight");
            if let Some(quota) = &mut self.quota_requests {
                *quota -= 1;
            }
        }
    }

    /// Writes what the socket takes now.
    fn flush(&mut self) -> io::Result<()> {
        self.wire.write(&self.out, &mut self.out_written)?;
        if self.out_written == self.out.len() {
            self.out.clear();
            self.out_written = 0;
        } else if self.out_written >= OUT_PENDING_MAX_BYTES {
            self.out.drain(..self.out_written);
            self.out_written = 0;
        }
        Ok(())
    }

    /// Reads and completes every response that has arrived. A plain socket is drained once a
    /// read leaves room in the buffer: no further read is made to hear EAGAIN (the epoll set
    /// is level-triggered, so bytes that come after are reported again).
    fn receive(&mut self, tally: &mut Tally) -> io::Result<()> {
        for _ in 0..READS_PER_WAKEUP_MAX {
            let room = self.input.len() - self.input_filled;
            let filled_before = self.input_filled;
            if !self
                .wire
                .read_some(&mut self.input, &mut self.input_filled)?
            {
                break;
            }
            let drained = self.wire.tls.is_none() && self.input_filled - filled_before < room;
            self.complete_responses(Instant::now(), tally)?;
            if drained {
                break;
            }
        }
        Ok(())
    }

    fn complete_responses(&mut self, now: Instant, tally: &mut Tally) -> io::Result<()> {
        let mut consumed_total = 0;
        loop {
            let unread = &self.input[consumed_total..self.input_filled];
            match decode_frame(unread) {
                Ok(Some((command, consumed))) => {
                    let busy = complete_response(&mut self.in_flight, &command, now, tally);
                    if busy {
                        self.backoff_until = Some(now + BUSY_BACKOFF);
                        if let Some(quota) = &mut self.quota_requests {
                            *quota += 1;
                        }
                    }
                    consumed_total += consumed;
                }
                Ok(None) => break,
                Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
            }
        }
        self.input.copy_within(consumed_total..self.input_filled, 0);
        self.input_filled -= consumed_total;
        Ok(())
    }

    /// Gives up on requests older than `timeout`.
    fn expire(&mut self, now: Instant, timeout: Duration, tally: &mut Tally) {
        let before = self.in_flight.len();
        self.in_flight
            .retain(|_, (intended, _)| now.saturating_duration_since(*intended) < timeout);
        tally.record_send_failures(SendFailure::Timeout, (before - self.in_flight.len()) as u64);
    }

    /// Closes after an error: outstanding and never-sent messages count as lost.
    fn close(&mut self, error: &io::Error, tally: &mut Tally) {
        let outstanding = self.in_flight.len() as u64;
        let never_sent = self.quota_requests.take().unwrap_or(0);
        eprintln!(
            "connection to {} lost: {error}; {outstanding} requests outstanding, \
             {never_sent} never sent",
            self.broker_addr
        );
        tally.record_send_failures(SendFailure::ConnectionLost, outstanding + never_sent);
        self.in_flight.clear();
        self.out.clear();
        self.out_written = 0;
        self.open = false;
        let _ = self.wire.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Nothing left to send or wait for.
    fn finished(&self, sending: bool) -> bool {
        !self.open
            || (self.in_flight.is_empty()
                && self.unsent_bytes() == 0
                && (!sending || !self.quota_left()))
    }
}

/// Counts one response; true when it was a busy answer to one of our requests.
fn complete_response(
    in_flight: &mut HashMap<i32, (Instant, u64)>,
    response: &RemotingCommand<'_>,
    now: Instant,
    tally: &mut Tally,
) -> bool {
    if !response.is_response() {
        return false; // A broker-initiated request; a producer that never heartbeats gets none.
    }
    let Some((intended, messages)) = in_flight.remove(&response.opaque) else {
        tally.late_responses += 1;
        return false;
    };
    if response.code == response_code::SUCCESS {
        tally.record_success(now.saturating_duration_since(intended), messages);
        return false;
    }
    tally.record_response_failure(response.code, response.remark.as_deref());
    BUSY_CODES.contains(&response.code)
}

/// Runs one worker to completion; reports go to `plan.reports`.
///
/// A turn costs what its due and ready connections need, not what the worker holds: only
/// those are filled, flushed and looked at again (`Agenda`), so a thousand connections at a
/// low rate each cost about what sixteen at the same total rate do. Every connection is
/// looked at when the run starts, when it stops sending, and at each expiry check.
pub fn run_worker(plan: WorkerPlan) {
    let mut connections: Vec<Connection> = plan
        .connections
        .into_iter()
        .map(|connection| Connection::new(connection, plan.in_flight_max, plan.run_prefix))
        .collect();
    let mut tally = Tally::new();
    let mut tick = 0;
    let start = plan.clock.start;
    let mut next_tick_at = start + TICK;
    let mut next_expiry_at = start + EXPIRY_CHECK_INTERVAL;
    let mut readiness = Readiness::new(&connections);
    let mut ready = Vec::with_capacity(connections.len());
    let mut agenda = Agenda::new(connections.len());
    let mut finished = vec![false; connections.len()];
    let mut unfinished = connections.len();
    let mut was_sending = true;
    loop {
        let now = Instant::now();
        let sending = plan.deadline.is_none_or(|deadline| now < deadline);
        if sending != was_sending {
            agenda.touch_all();
            was_sending = sending;
        }
        if sending {
            agenda.touch_due(now);
        }
        if now >= next_expiry_at {
            for connection in &mut connections {
                connection.expire(now, plan.request_timeout, &mut tally);
            }
            agenda.touch_all();
            next_expiry_at = now + EXPIRY_CHECK_INTERVAL;
        }
        while let Some(index) = agenda.next_touched() {
            let connection = &mut connections[index];
            if connection.open {
                if sending {
                    connection.fill(now, &plan.clock);
                }
                if let Err(error) = connection.flush() {
                    connection.close(&error, &mut tally);
                }
            }
            readiness.update(index, connection);
            agenda.schedule(index, connection.next_due().filter(|_| sending));
            let done = connection.finished(sending);
            if done != finished[index] {
                finished[index] = done;
                if done {
                    unfinished -= 1;
                } else {
                    unfinished += 1;
                }
            }
        }
        while now >= next_tick_at {
            let interval = std::mem::replace(&mut tally, Tally::new());
            // The main thread outlives every worker; a send error cannot happen.
            let _ = plan.reports.send(Report::Interval {
                source: plan.worker,
                tick,
                figures: Figures::Send(interval),
            });
            tick += 1;
            next_tick_at += TICK;
        }
        if unfinished == 0 {
            break;
        }
        let mut wake_at = next_tick_at.min(next_expiry_at);
        if let Some(deadline) = plan.deadline.filter(|_| sending) {
            wake_at = wake_at.min(deadline);
        }
        if let Some(due) = agenda.earliest_due() {
            wake_at = wake_at.min(due.max(now));
        }
        readiness.wait(wake_at.saturating_duration_since(now), &mut ready);
        for &index in &ready {
            let connection = &mut connections[index];
            if !connection.open {
                continue;
            }
            if let Err(error) = connection.receive(&mut tally) {
                connection.close(&error, &mut tally);
            }
            agenda.touch(index);
        }
    }
    let connections_lost = connections
        .iter()
        .filter(|connection| !connection.open)
        .count();
    let _ = plan.reports.send(Report::Done {
        source: plan.worker,
        figures: Figures::Send(tally),
        finished_at: Instant::now(),
        connections_lost,
    });
}

/// Which connections the worker must look at this turn: those touched (ready, or all of
/// them), and those whose time to send has come, from a heap of each connection's next due
/// time. A connection has one live entry at most; an entry it has since replaced is skipped
/// when it reaches the top.
struct Agenda {
    /// (due, connection), earliest first; may hold replaced entries.
    due: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Per connection: the due time of its live entry.
    scheduled: Vec<Option<Instant>>,
    touched: Vec<usize>,
    is_touched: Vec<bool>,
}

impl Agenda {
    /// Every connection starts touched.
    fn new(count: usize) -> Agenda {
        Agenda {
            due: BinaryHeap::new(),
            scheduled: vec![None; count],
            touched: (0..count).rev().collect(),
            is_touched: vec![true; count],
        }
    }

    fn touch(&mut self, index: usize) {
        if !std::mem::replace(&mut self.is_touched[index], true) {
            self.touched.push(index);
        }
    }

    fn touch_all(&mut self) {
        for index in 0..self.scheduled.len() {
            self.touch(index);
        }
    }

    /// Touches every connection due by `now`, and forgets their entries.
    fn touch_due(&mut self, now: Instant) {
        while let Some(&Reverse((due, index))) = self.due.peek() {
            if due > now {
                break;
            }
            self.due.pop();
            if self.scheduled[index] == Some(due) {
                self.scheduled[index] = None;
                self.touch(index);
            }
        }
    }

    fn next_touched(&mut self) -> Option<usize> {
        let index = self.touched.pop()?;
        self.is_touched[index] = false;
        Some(index)
    }

    /// Sets when `index` is next due (`None`: not until something else touches it).
    fn schedule(&mut self, index: usize, due: Option<Instant>) {
        if self.scheduled[index] == due {
            return;
        }
        self.scheduled[index] = due;
        if let Some(due) = due {
            self.due.push(Reverse((due, index)));
        }
    }

    /// The earliest live due time.
    fn earliest_due(&mut self) -> Option<Instant> {
        while let Some(&Reverse((due, index))) = self.due.peek() {
            if self.scheduled[index] == Some(due) {
                return Some(due);
            }
            self.due.pop();
        }
        None
    }
}

/// Which connections are ready, at a cost that follows the ready ones, not the open ones
/// (ppoll over a thousand sockets per wake-up was the bench's own limit): an epoll set,
/// level-triggered, one entry per open connection (writable interest only while it has
/// output pending), waited on through a ppoll of the epoll fd itself for the sub-millisecond
/// timeout an open-loop schedule needs.
struct Readiness {
    epoll: std::os::fd::OwnedFd,
    /// Per connection: registered, and with writable interest.
    registered: Vec<bool>,
    writable: Vec<bool>,
    events: Vec<libc::epoll_event>,
}

impl Readiness {
    fn new(connections: &[Connection]) -> Readiness {
        use std::os::fd::FromRawFd;
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(
            fd >= 0,
            "epoll_create1 failed: {}",
            io::Error::last_os_error()
        );
        // SAFETY: `fd` was just created and is owned by nothing else.
        let epoll = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mut readiness = Readiness {
            epoll,
            registered: vec![false; connections.len()],
            writable: vec![false; connections.len()],
            events: vec![libc::epoll_event { events: 0, u64: 0 }; connections.len().max(1)],
        };
        for (index, connection) in connections.iter().enumerate() {
            if connection.open {
                readiness.control(libc::EPOLL_CTL_ADD, index, connection, false);
                readiness.registered[index] = true;
            }
        }
        readiness
    }

    fn control(&self, op: libc::c_int, index: usize, connection: &Connection, writable: bool) {
        let epoll = self.epoll.as_raw_fd();
        let flags = libc::EPOLLIN | if writable { libc::EPOLLOUT } else { 0 };
        let mut event = libc::epoll_event {
            events: flags as u32,
            u64: index as u64,
        };
        // SAFETY: `event` is a live epoll_event; both fds are open.
        let result =
            unsafe { libc::epoll_ctl(epoll, op, connection.wire.stream.as_raw_fd(), &mut event) };
        assert!(
            result == 0,
            "epoll_ctl failed: {}",
            io::Error::last_os_error()
        );
    }

    /// Follows a connection that was looked at: removed once closed, writable interest
    /// while it has output pending.
    fn update(&mut self, index: usize, connection: &Connection) {
        if !connection.open {
            if self.registered[index] {
                self.control(libc::EPOLL_CTL_DEL, index, connection, false);
                self.registered[index] = false;
            }
            return;
        }
        let writable = connection.unsent_bytes() > 0;
        if writable != self.writable[index] {
            self.control(libc::EPOLL_CTL_MOD, index, connection, writable);
            self.writable[index] = writable;
        }
    }

    /// Waits up to `wait` for a ready connection; `ready` gets the indexes of those ready.
    /// One epoll_pwait2(2) (Linux 5.11; nanosecond timeout); on an older kernel a ppoll of
    /// the epoll fd, then an epoll_wait that does not block.
    fn wait(&mut self, wait: Duration, ready: &mut Vec<usize>) {
        ready.clear();
        let wait = wait.min(POLL_WAIT_MAX);
        let epoll = self.epoll.as_raw_fd();
        let count = match epoll_pwait2(epoll, &mut self.events, wait) {
            Some(count) => count,
            None => {
                let mut poll_fd = [libc::pollfd {
                    fd: epoll,
                    events: libc::POLLIN,
                    revents: 0,
                }];
                poll_with_timeout(&mut poll_fd, wait);
                if poll_fd[0].revents == 0 {
                    return;
                }
                // SAFETY: `events` is a live array of `events.len()` entries; timeout 0
                // never blocks.
                unsafe {
                    libc::epoll_wait(
                        epoll,
                        self.events.as_mut_ptr(),
                        self.events.len() as libc::c_int,
                        0,
                    )
                }
            }
        };
        for event in &self.events[..count.max(0) as usize] {
            ready.push(event.u64 as usize);
        }
    }
}

/// Set once the kernel has answered ENOSYS to epoll_pwait2.
static EPOLL_PWAIT2_MISSING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// epoll_pwait2(2) through its system call (older C libraries lack the wrapper): the count of
/// events, 0 on EINTR, `None` where the kernel has no such call.
fn epoll_pwait2(
    epoll: libc::c_int,
    events: &mut [libc::epoll_event],
    wait: Duration,
) -> Option<i32> {
    use std::sync::atomic::Ordering;
    if EPOLL_PWAIT2_MISSING.load(Ordering::Relaxed) {
        return None;
    }
    let timeout = timespec(wait);
    // SAFETY: `events` is a live array of `events.len()` entries, `timeout` a valid timespec;
    // no signal mask is passed (its size argument is then unused).
    let count = unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait2,
            epoll,
            events.as_mut_ptr(),
            events.len() as libc::c_int,
            &timeout as *const libc::timespec,
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        )
    };
    if count >= 0 {
        return Some(count as i32);
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENOSYS) => {
            EPOLL_PWAIT2_MISSING.store(true, Ordering::Relaxed);
            None
        }
        Some(libc::EINTR) => Some(0),
        _ => panic!("epoll_pwait2 failed: {error}"),
    }
}

/// ppoll(2) with microsecond precision (an open-loop schedule has sub-millisecond slots);
/// EINTR leaves every `revents` zero.
pub fn poll_with_timeout(poll_fds: &mut [libc::pollfd], wait: Duration) {
    let timeout = timespec(wait.min(POLL_WAIT_MAX));
    // SAFETY: `poll_fds` is a live, exclusively borrowed array of `poll_fds.len()` entries;
    // the timeout is a valid timespec and no signal mask is passed.
    let ready = unsafe {
        libc::ppoll(
            poll_fds.as_mut_ptr(),
            poll_fds.len() as libc::nfds_t,
            &timeout,
            std::ptr::null(),
        )
    };
    if ready < 0 {
        let error = io::Error::last_os_error();
        // EINTR is a spurious wake-up; anything else (EFAULT, EINVAL) is a bug here.
        assert_eq!(
            error.kind(),
            io::ErrorKind::Interrupted,
            "poll failed: {error}"
        );
        for poll_fd in poll_fds.iter_mut() {
            poll_fd.revents = 0;
        }
    }
}

/// `wait` as the timespec of a system call's timeout.
fn timespec(wait: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    }
}

/// A load connection's socket, and its TLS session when the run speaks TLS (`--tls`).
pub(crate) struct Wire {
    pub stream: TcpStream,
    pub tls: Option<rustls::ClientConnection>,
}

impl Wire {
    /// TLS records (or handshake messages) wait to be written.
    pub fn tls_output_waits(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.wants_write())
    }

    /// Writes what the socket takes now of `out[*written..]`, advancing `written`. Over TLS
    /// every frame goes into the session at once (the caller's window bounds them) and its
    /// records go out as the socket takes them.
    pub fn write(&mut self, out: &[u8], written: &mut usize) -> io::Result<()> {
        let Some(tls) = &mut self.tls else {
            while *written < out.len() {
                match (&self.stream).write(&out[*written..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(count) => *written += count,
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            }
            return Ok(());
        };
        tls.writer().write_all(&out[*written..])?;
        *written = out.len();
        while tls.wants_write() {
            match tls.write_tls(&mut &self.stream) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// One read into `input[*filled..]` (`read_some`), through TLS when there is a session.
    pub fn read_some(&mut self, input: &mut Vec<u8>, filled: &mut usize) -> io::Result<bool> {
        match &mut self.tls {
            None => read_some(&self.stream, input, filled),
            Some(tls) => tls_read_some(tls, &self.stream, input, filled),
        }
    }
}

/// `read_some` through a TLS session: records from the socket in, plaintext out.
fn tls_read_some(
    tls: &mut rustls::ClientConnection,
    stream: &TcpStream,
    input: &mut Vec<u8>,
    filled: &mut usize,
) -> io::Result<bool> {
    let mut came = false;
    loop {
        if *filled == input.len() {
            grow_for_frame(input, *filled)?;
        }
        match tls.reader().read(&mut input[*filled..]) {
            Ok(0) => {
                let message = "the broker closed the TLS session";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
            }
            Ok(read) => {
                *filled += read;
                return Ok(true);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
        if came {
            // What came was handshake or a partial record: no plaintext yet.
            return Ok(false);
        }
        match tls.read_tls(&mut &*stream) {
            Ok(0) => {
                let message = "the broker closed the connection";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
            }
            Ok(_) => {
                came = true;
                tls.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

/// Grows a full read buffer to the size of the frame it holds the start of.
fn grow_for_frame(input: &mut Vec<u8>, filled: usize) -> io::Result<()> {
    let frame_size_bytes = peek_frame_size_bytes(&input[..filled])
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?
        .expect("a full buffer holds a length prefix");
    assert!(
        frame_size_bytes > input.len(),
        "complete frames were consumed"
    );
    input.resize(frame_size_bytes, 0);
    Ok(())
}

/// One read from a non-blocking connection into `input[filled..]`: true when bytes came,
/// false when none are waiting. A full buffer holds the start of one frame bigger than it
/// (complete frames are consumed after every read), so it first grows to that frame's size.
/// The broker closing the connection is an error.
pub(crate) fn read_some(
    stream: &TcpStream,
    input: &mut Vec<u8>,
    filled: &mut usize,
) -> io::Result<bool> {
    if *filled == input.len() {
        grow_for_frame(input, *filled)?;
    }
    loop {
        match (&*stream).read(&mut input[*filled..]) {
            Ok(0) => {
                let message = "the broker closed the connection";
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
            }
            Ok(read) => {
                *filled += read;
                return Ok(true);
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send_frame::SendFields;

    fn test_connection(
        in_flight_max: usize,
        pacing: Option<Pacing>,
        quota: Option<u64>,
    ) -> Connection {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fields = SendFields {
            producer_group: "g",
            topic: "T",
            tag: "t",
            keys: false,
            stamp_sent_time: true,
            batch: 2,
            credentials: None,
        };
        let template = SendTemplate::new(&fields, 0, b"body").unwrap();
        let plan = ConnectionPlan {
            index: 0,
            broker_addr: "test".into(),
            tls: None,
            stream,
            templates: Arc::new(vec![template]),
            quota_requests: quota,
            pacing,
        };
        Connection::new(plan, in_flight_max, 1)
    }

    #[test]
    fn open_loop_requests_keep_their_scheduled_time_when_the_window_holds_them_back() {
        let clock = RunClock::start_now();
        let interval = Duration::from_millis(10);
        let pacing = Pacing {
            next_due: clock.start,
            interval,
        };
        let mut connection = test_connection(3, Some(pacing), None);
        // 100 ms in, ten requests are due but the window lets three go: they carry the
        // schedule's times, not the time they were sent.
        let late = clock.start + Duration::from_millis(100);
        connection.fill(late, &clock);
        let mut intended: Vec<Duration> = connection
            .in_flight
            .values()
            .map(|(at, messages)| {
                assert_eq!(*messages, 2, "a batch of two per request");
                at.duration_since(clock.start)
            })
            .collect();
        intended.sort();
        assert_eq!(intended, [Duration::ZERO, interval, interval * 2]);
        assert_eq!(connection.next_due(), None, "the window is full");
        // One answer frees a slot: the next request still counts from its own slot.
        let (&opaque, _) = connection.in_flight.iter().next().unwrap();
        connection.in_flight.remove(&opaque);
        assert_eq!(connection.next_due(), Some(clock.start + interval * 3));
        connection.fill(late, &clock);
        assert!(connection
            .in_flight
            .values()
            .any(|(at, _)| *at == clock.start + interval * 3));
        // Nothing is sent ahead of its slot.
        let mut idle = test_connection(100, Some(pacing), None);
        idle.fill(clock.start + Duration::from_millis(25), &clock);
        assert_eq!(idle.in_flight.len(), 3, "slots at 0, 10 and 20 ms only");
    }

    #[test]
    fn a_busy_answer_backs_off_and_sends_the_request_again() {
        let clock = RunClock::start_now();
        let mut connection = test_connection(8, None, Some(2));
        connection.fill(clock.start, &clock);
        assert_eq!(connection.in_flight.len(), 2);
        assert!(!connection.quota_left());
        let mut opaques: Vec<i32> = connection.in_flight.keys().copied().collect();
        opaques.sort();
        let mut answers = Vec::new();
        shardmq_protocol::remoting::FrameEncoder::response(
            &mut answers,
            response_code::SERVICE_NOT_AVAILABLE,
            opaques[0],
        )
        .finish(&[]);
        shardmq_protocol::remoting::FrameEncoder::response(
            &mut answers,
            response_code::SUCCESS,
            opaques[1],
        )
        .finish(&[]);
        connection.input[..answers.len()].copy_from_slice(&answers);
        connection.input_filled = answers.len();
        let mut tally = Tally::new();
        let now = clock.start + Duration::from_millis(1);
        connection.complete_responses(now, &mut tally).unwrap();
        assert_eq!(tally.succeeded, 2, "one request of two messages stored");
        assert_eq!(tally.response_failed(), 1);
        assert!(connection.quota_left(), "the busy request is owed again");
        assert_eq!(connection.next_due(), Some(now + BUSY_BACKOFF));
        connection.fill(now, &clock);
        assert!(
            connection.in_flight.is_empty(),
            "nothing new during the back-off"
        );
        connection.fill(now + BUSY_BACKOFF, &clock);
        assert_eq!(connection.in_flight.len(), 1);
        assert!(!connection.quota_left());
    }

    #[test]
    fn closed_loop_fills_the_window_up_to_the_quota() {
        let clock = RunClock::start_now();
        let mut connection = test_connection(8, None, Some(5));
        connection.fill(clock.start, &clock);
        assert_eq!(connection.in_flight.len(), 5);
        assert!(!connection.quota_left());
        assert!(connection
            .in_flight
            .values()
            .all(|(at, _)| *at == clock.start));
    }

    #[test]
    fn the_agenda_hands_out_touched_and_due_connections_once_each() {
        let start = Instant::now();
        let mut agenda = Agenda::new(3);
        let mut first_turn: Vec<usize> = std::iter::from_fn(|| agenda.next_touched()).collect();
        first_turn.sort();
        assert_eq!(first_turn, [0, 1, 2], "every connection is looked at first");
        agenda.schedule(0, Some(start + Duration::from_millis(30)));
        agenda.schedule(1, Some(start + Duration::from_millis(10)));
        agenda.schedule(2, Some(start + Duration::from_millis(20)));
        // Connection 1 is looked at (a response came) and is next due later: its first
        // entry is replaced, not handed out.
        agenda.touch(1);
        agenda.touch(1);
        assert_eq!(agenda.next_touched(), Some(1));
        assert_eq!(agenda.next_touched(), None, "a touch is handed out once");
        agenda.schedule(1, Some(start + Duration::from_millis(40)));
        assert_eq!(
            agenda.earliest_due(),
            Some(start + Duration::from_millis(20))
        );
        agenda.touch_due(start + Duration::from_millis(30));
        let mut due: Vec<usize> = std::iter::from_fn(|| agenda.next_touched()).collect();
        due.sort();
        assert_eq!(due, [0, 2]);
        assert_eq!(
            agenda.earliest_due(),
            Some(start + Duration::from_millis(40))
        );
        agenda.schedule(1, None);
        assert_eq!(agenda.earliest_due(), None, "nothing is due once cleared");
        agenda.touch_due(start + Duration::from_secs(1));
        assert_eq!(agenda.next_touched(), None);
    }
}
