//! Connections: one read task and one write task per TCP connection, on the shard that
//! accepted it.
//!
//! The read task decodes frames and hands each to the shard's handler, which answers at once
//! (most requests) or spawns a task that answers later (a SYNC_FLUSH send waiting for its
//! group commit, a long-polling pull). Answers are appended to the connection's output buffer
//! and the write task sends whatever has accumulated in one write, so pipelined requests get
//! batched responses. A large body (a pull's records) stays in its own buffer and is written
//! from there, gathered with the frames around it (`Output`), rather than copied in. A frame
//! that cannot be decoded closes that one connection, logged; a full output buffer pauses
//! reading (backpressure) instead of growing without bound.
//!
//! Pending output of one connection is bounded: the bytes waiting in its buffer, plus the
//! bytes being written, plus the room promised to answers being prepared
//! (`reserve_output`, taken by pulls before they read the store) stay under the output pause
//! limit (`ConnectionLimits`, default `OUTPUT_PAUSE_BYTES`) plus one reservation. A consumer
//! that stops reading therefore costs the broker at most that much memory, however many pulls
//! it pipelines: its pulls wait for room, and once the in-flight limit (default
//! `IN_FLIGHT_REQUESTS_MAX`) of them wait the connection stops being read.
//!
//! Per client, a shard also bounds the connections of one remote address
//! (`connections_per_address_max`) and the time a frame may take to arrive whole
//! (`partial_frame_timeout_ms`); over all of them, the memory frames still arriving take
//! (`arriving_frames_max_bytes`, `FrameRoom`) and the output they hold
//! (`shard_output_max_bytes`, `ShardOutput`). With TLS on (`crate::tls`), a connection's
//! first read tells a handshake from a plaintext frame; a TLS connection's reads and writes
//! go through its rustls session, below the frame codec, and nothing above it changes.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;

use shards::runtime::sockets::Socket;
use shards::runtime::{self, TcpListener};
use shards::sync::{Signal, WaiterSet};

use crate::remoting::{self, FrameEncoder, RemotingCommand};

pub use crate::limits::IN_FLIGHT_REQUESTS_MAX;
pub use crate::limits::OUTPUT_PAUSE_BYTES;
pub use crate::limits::READ_CHUNK_BYTES;

pub use crate::limits::{
    ARRIVING_FRAMES_MAX_BYTES, CONNECTIONS_PER_ADDRESS_MAX, CONNECTIONS_PER_SHARD_MAX,
    PARTIAL_FRAME_TIMEOUT_MS, SHARD_OUTPUT_MAX_BYTES,
};

/// Per-connection buffer sizes and limits (a tuning profile's `[network]` section).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Bytes asked for per read(2); the read buffer grows past it only for a larger frame.
    pub read_chunk_bytes: usize,
    /// Output waiting to be written past which the connection stops reading requests.
    pub output_pause_bytes: usize,
    /// Requests still being served past which the connection stops reading requests.
    pub in_flight_requests_max: usize,
    /// Connections one shard serves at once, all its listeners together.
    pub connections_per_shard_max: usize,
    /// Connections one shard serves from one remote address.
    pub connections_per_address_max: usize,
    /// A frame must arrive whole this soon after its first byte (0: no limit).
    pub partial_frame_timeout_ms: u64,
    /// Bytes the frames still arriving on one shard's connections may take past their read
    /// buffers (`FrameRoom`).
    pub arriving_frames_max_bytes: usize,
    /// Output all of one shard's connections may hold before a pull's answer waits for room
    /// (`Connection::reserve_output`).
    pub shard_output_max_bytes: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            read_chunk_bytes: READ_CHUNK_BYTES,
            output_pause_bytes: OUTPUT_PAUSE_BYTES,
            in_flight_requests_max: IN_FLIGHT_REQUESTS_MAX,
            connections_per_shard_max: CONNECTIONS_PER_SHARD_MAX,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX,
            partial_frame_timeout_ms: PARTIAL_FRAME_TIMEOUT_MS,
            arriving_frames_max_bytes: ARRIVING_FRAMES_MAX_BYTES,
            shard_output_max_bytes: SHARD_OUTPUT_MAX_BYTES,
        }
    }
}

/// One client connection as the handlers see it.
pub struct Connection {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    output: RefCell<Output>,
    output_ready: Signal,
    output_drained: Signal,
    closed: Cell<bool>,
    next_opaque: Cell<i32>,
    in_flight_requests: Cell<usize>,
    limits: ConnectionLimits,
    /// Bytes handed to the socket by the writer and not yet written.
    writing_bytes: Cell<usize>,
    /// Output room promised to answers being prepared (see `reserve_output`).
    reserved_bytes: Cell<usize>,
    /// This connection's pending output as the shard's sum (`ShardOutput`) counts it.
    counted_output: Cell<usize>,
    /// Tasks waiting for output room.
    room_waiters: Rc<WaiterSet<()>>,
    /// Since when (monotonic ms) the start of a frame waits for the rest of it.
    partial_since_ms: Cell<Option<u64>>,
    /// Whether the task that closes a connection whose frame takes too long runs.
    partial_watch_running: Cell<bool>,
    /// What the read loop waits for before its next read (`hold_reads_until`).
    read_hold: RefCell<Option<Pin<Box<dyn Future<Output = ()>>>>>,
    /// The request being dispatched: answered during the call, its latency is recorded at
    /// once; an `in_flight` guard taken during the call moves it to `answers_due`.
    dispatching: Cell<Option<Timing>>,
    /// Requests answered later (by the tasks holding their `in_flight` guards), by opaque:
    /// timed when their answer is written (`rocketmq_rpc_latency`).
    answers_due: RefCell<std::collections::HashMap<i32, Timing, shards::hash::IntHash>>,
    /// Capacity of the read loop's buffer (memory by holder).
    read_buffer_bytes: Cell<usize>,
    /// Requests this side sent the client and waits to hear back on (`call`), by opaque.
    calls: RefCell<std::collections::HashMap<i32, Rc<CallSlot>>>,
}

/// Requests to one client awaiting its answer at once (GET_CONSUMER_RUNNING_INFO, …): an
/// operator's tool asks a handful; more is refused rather than queued.
pub const CLIENT_CALLS_MAX: usize = 64;

/// A client's answer to a request the broker sent it.
#[derive(Debug, Clone)]
pub struct ClientAnswer {
    pub code: i32,
    pub remark: Option<String>,
    pub body: Vec<u8>,
}

#[derive(Default)]
struct CallSlot {
    answer: RefCell<Option<ClientAnswer>>,
    ready: Signal,
}

/// Output room promised by `Connection::reserve_output`, given back when dropped.
pub struct OutputReservation {
    connection: Rc<Connection>,
    bytes: usize,
}

impl Drop for OutputReservation {
    fn drop(&mut self) {
        let connection = &self.connection;
        connection
            .reserved_bytes
            .set(connection.reserved_bytes.get() - self.bytes);
        connection.count_output();
        connection.room_freed();
    }
}

/// The output one shard's connections hold together (waiting, being written, promised), and
/// what wakes the answers waiting for room among it.
#[derive(Default)]
struct ShardOutput {
    held: Cell<usize>,
    freed: shards::sync::Event,
}

thread_local! {
    static SHARD_OUTPUT: Rc<ShardOutput> = Rc::default();
}

impl Drop for Connection {
    fn drop(&mut self) {
        let counted = self.counted_output.replace(0);
        if counted > 0 {
            SHARD_OUTPUT.with(|output| {
                output.held.set(output.held.get() - counted);
                output.freed.notify();
            });
        }
    }
}

/// A request being timed for `rocketmq_rpc_latency`, from its dispatch to its answer.
#[derive(Debug, Clone, Copy)]
struct Timing {
    request_code: i32,
    opaque: i32,
    started: std::time::Instant,
    /// Parked for long polling before its answer (RocketMQ's `is_long_polling`).
    suspended: bool,
}

/// Counts one request of a connection as being served until dropped (the opaque of a
/// request taken while it was dispatched: its timing ends with the guard if it was never
/// answered).
pub struct InFlight(Rc<Connection>, Option<i32>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let connection = &self.0;
        if let Some(opaque) = self.1 {
            connection.answers_due.borrow_mut().remove(&opaque);
        }
        connection
            .in_flight_requests
            .set(connection.in_flight_requests.get() - 1);
        connection.output_drained.notify();
    }
}

impl Connection {
    fn new(id: u64, peer: SocketAddr, local: SocketAddr, limits: ConnectionLimits) -> Rc<Self> {
        Rc::new(Connection {
            id,
            peer,
            local,
            // Grows with the first answer: an idle connection holds no output buffer.
            output: RefCell::new(Output::default()),
            output_ready: Signal::default(),
            output_drained: Signal::default(),
            closed: Cell::new(false),
            next_opaque: Cell::new(1),
            in_flight_requests: Cell::new(0),
            limits,
            writing_bytes: Cell::new(0),
            reserved_bytes: Cell::new(0),
            counted_output: Cell::new(0),
            room_waiters: Rc::new(WaiterSet::default()),
            partial_since_ms: Cell::new(None),
            partial_watch_running: Cell::new(false),
            read_hold: RefCell::new(None),
            dispatching: Cell::new(None),
            answers_due: RefCell::default(),
            read_buffer_bytes: Cell::new(0),
            calls: RefCell::default(),
        })
    }

    /// A connection with no socket (the in-process test harness): handlers answer into its
    /// output, which `take_output` hands over.
    pub fn detached(id: u64, peer: SocketAddr) -> Rc<Self> {
        let local = SocketAddr::from(([127, 0, 0, 1], 10911));
        Connection::new(id, peer, local, ConnectionLimits::default())
    }

    /// Everything answered on this connection since the last call (the harness reads its
    /// frames from it; a served connection's writer task drains it instead).
    pub fn take_output(&self) -> Vec<u8> {
        let output = std::mem::take(&mut *self.output.borrow_mut()).into_bytes();
        self.count_output();
        output
    }

    /// Brings the shard's sum of pending output (`ShardOutput`) up to date with this
    /// connection's, after its output, writes or promises changed.
    fn count_output(&self) {
        let now = self.pending_output_bytes();
        let before = self.counted_output.replace(now);
        if now == before {
            return;
        }
        SHARD_OUTPUT.with(|output| {
            output.held.set(output.held.get() - before + now);
            if now < before {
                output.freed.notify();
            }
        });
    }

    /// Stops reading this connection's requests until `until` resolves (the frames already
    /// read are still handled): backpressure through TCP for a client whose requests cannot
    /// be served now, instead of reading, and refusing, everything it keeps sending. A hold
    /// already set stays; bound `until` in time.
    pub fn hold_reads_until(&self, until: impl Future<Output = ()> + 'static) {
        let mut hold = self.read_hold.borrow_mut();
        if hold.is_none() {
            *hold = Some(Box::pin(until));
        }
    }

    /// When the request being dispatched was taken up (now, for one that is not timed).
    pub fn dispatched_at(&self) -> std::time::Instant {
        match self.dispatching.get() {
            Some(timing) => timing.started,
            None => std::time::Instant::now(),
        }
    }

    /// Marks a request as served later (by a spawned task); hold the guard until answered.
    pub fn in_flight(self: &Rc<Self>) -> InFlight {
        self.in_flight_requests
            .set(self.in_flight_requests.get() + 1);
        let timing = self.dispatching.take();
        if let Some(timing) = timing {
            self.answers_due.borrow_mut().insert(timing.opaque, timing);
        }
        InFlight(self.clone(), timing.map(|t| t.opaque))
    }

    /// The request with `opaque` waits for messages (long polling): its latency is counted
    /// with `is_long_polling="true"`.
    pub fn note_suspended(&self, opaque: i32) {
        if let Some(timing) = self.answers_due.borrow_mut().get_mut(&opaque) {
            timing.suspended = true;
        }
    }

    /// Records the latency of every request `written` (frames just put in the output)
    /// answers.
    fn time_answers(&self, mut written: &[u8], answered: std::time::Instant) {
        while let Some(head) = remoting::encoded_head(written) {
            if head.is_response() {
                self.time_answer(head.opaque, head.code, answered);
            }
            let Some(rest) = written.get(head.frame_size_bytes..) else {
                break;
            };
            written = rest;
        }
    }

    fn time_answer(&self, opaque: i32, response_code: i32, answered: std::time::Instant) {
        let timing = match self.dispatching.get() {
            Some(timing) if timing.opaque == opaque => self.dispatching.take(),
            _ if self.answers_due.borrow().is_empty() => None,
            _ => self.answers_due.borrow_mut().remove(&opaque),
        };
        if let Some(timing) = timing {
            crate::metrics::rpc_latency::record(
                timing.request_code,
                response_code,
                timing.suspended,
                timing.started,
                answered,
            );
        }
    }

    /// (output waiting: buffered, being written or promised; memory its buffers hold: the
    /// output buffer's room, the bytes being written, the read buffer's room).
    pub fn buffered_bytes(&self) -> (usize, usize) {
        let memory = self.output.borrow().held_bytes()
            + self.writing_bytes.get()
            + self.read_buffer_bytes.get();
        (self.pending_output_bytes(), memory)
    }

    fn must_pause(&self) -> bool {
        self.pending_output_bytes() > self.limits.output_pause_bytes
            || self.in_flight_requests.get() > self.limits.in_flight_requests_max
    }

    /// Output buffered, being written, or promised to answers being prepared.
    fn pending_output_bytes(&self) -> usize {
        self.output_len() + self.writing_bytes.get() + self.reserved_bytes.get()
    }

    /// Waits until `bytes` more of output fit under the output pause limit and the shard's
    /// (`shard_output_max_bytes`), or nothing at all is pending on this connection, so that
    /// one answer always proceeds, and promises them to the caller until the returned guard
    /// drops: take it before producing a large answer, and write the answer before dropping
    /// it. A closed connection grants at once (its output is dropped).
    pub async fn reserve_output(self: &Rc<Self>, bytes: usize) -> OutputReservation {
        let shard = SHARD_OUTPUT.with(Rc::clone);
        let fits = || {
            let pending = self.pending_output_bytes();
            let limit = self.limits.output_pause_bytes;
            self.is_closed()
                || pending == 0
                || (pending + bytes <= limit
                    && shard.held.get() + bytes <= self.limits.shard_output_max_bytes)
        };
        while !fits() {
            // Room comes back on this connection (its writes) or on any of the shard's.
            futures_lite::future::or(self.room_waiters.wait_until((), fits), shard.freed.wait())
                .await;
        }
        self.reserved_bytes.set(self.reserved_bytes.get() + bytes);
        self.count_output();
        OutputReservation {
            connection: self.clone(),
            bytes,
        }
    }

    /// Output room may have been freed: let waiting answers re-check.
    fn room_freed(&self) {
        if !self.room_waiters.is_empty() {
            self.room_waiters.wake_all();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Writes one frame into the output buffer with `write` and wakes the writer. A closed
    /// connection discards it.
    pub fn send_with(&self, write: impl FnOnce(&mut Vec<u8>)) {
        self.send_with_at(std::time::Instant::now(), write);
    }

    /// [`Connection::send_with`], for answers counted as given at `answered` (one clock read
    /// for all the answers of a group commit).
    pub fn send_with_at(&self, answered: std::time::Instant, write: impl FnOnce(&mut Vec<u8>)) {
        self.send_into(answered, |output| write(&mut output.bytes));
    }

    /// Writes one frame whose body is `body`: `head` writes the frame up to the body, given
    /// the body's length (the header closed with `FrameEncoder::finish_header`). A large
    /// body is written from its own buffer, not copied into the output (`Output`).
    pub fn send_with_body(&self, head: impl FnOnce(&mut Vec<u8>, usize), body: Vec<u8>) {
        self.send_into(std::time::Instant::now(), |output| {
            head(&mut output.bytes, body.len());
            output.push_body(body);
        });
    }

    /// Puts one frame into the output with `write`, times the answers whose heads it wrote
    /// and wakes the writer; a closed connection discards it.
    fn send_into(&self, answered: std::time::Instant, write: impl FnOnce(&mut Output)) {
        if self.closed.get() {
            return;
        }
        let mut output = self.output.borrow_mut();
        let start = output.bytes.len();
        write(&mut output);
        // A body in a buffer of its own is not in `bytes`: the head there is what is timed.
        self.time_answers(&output.bytes[start..], answered);
        drop(output);
        self.count_output();
        self.output_ready.notify();
    }

    /// The answer to `request`, written by `write` (nothing for a oneway request: RocketMQ
    /// never answers those).
    pub fn answer_with(&self, request: &RemotingCommand<'_>, write: impl FnOnce(&mut Vec<u8>)) {
        if !request.is_oneway() {
            self.send_with(write);
        }
    }

    /// A response with no ext fields and no body.
    pub fn respond(&self, request: &RemotingCommand<'_>, code: i32, remark: Option<&str>) {
        if request.is_oneway() {
            return;
        }
        self.respond_to(request.opaque, code, remark);
    }

    /// SUCCESS with `body` and no ext fields (nothing for a oneway request).
    pub fn respond_body(&self, request: &RemotingCommand<'_>, body: &[u8]) {
        if !request.is_oneway() {
            self.respond_body_to(request.opaque, body);
        }
    }

    /// SUCCESS with `body` and no ext fields to the request with `opaque` (an answer given
    /// later, once the request frame itself is gone).
    pub fn respond_body_to(&self, opaque: i32, body: &[u8]) {
        self.send_with(|out| {
            FrameEncoder::response(out, crate::remoting::response_code::SUCCESS, opaque)
                .finish(body);
        });
    }

    /// A response with no ext fields and no body to the request with `opaque` (for answers
    /// given later, once the request frame itself is gone).
    pub fn respond_to(&self, opaque: i32, code: i32, remark: Option<&str>) {
        self.send_with(|out| {
            let mut frame = FrameEncoder::response(out, code, opaque);
            if let Some(remark) = remark {
                frame.remark(remark);
            }
            frame.finish(&[]);
        });
    }

    /// The next opaque for a server-to-client request on this connection.
    /// Sends the client the request `encode` writes (with the opaque given) and waits up to
    /// `timeout` for its answer; None when it does not come, the connection closes first, or
    /// CLIENT_CALLS_MAX calls already wait.
    pub async fn call(
        &self,
        timeout: std::time::Duration,
        encode: impl FnOnce(&mut Vec<u8>, i32),
    ) -> Option<ClientAnswer> {
        if self.closed.get() || self.calls.borrow().len() >= CLIENT_CALLS_MAX {
            return None;
        }
        let opaque = self.next_opaque();
        let slot = Rc::new(CallSlot::default());
        self.calls.borrow_mut().insert(opaque, slot.clone());
        self.send_with(|out| encode(out, opaque));
        let _ = runtime::timeout(timeout, slot.ready.wait()).await;
        self.calls.borrow_mut().remove(&opaque);
        let answer = slot.answer.borrow_mut().take();
        answer
    }

    /// The connection closed: every `call` waiting on it returns None now.
    fn wake_calls(&self) {
        for (_, slot) in self.calls.borrow_mut().drain() {
            slot.ready.notify();
        }
    }

    /// A response frame from the client: the answer of a `call`, if one waits for it.
    fn answered(&self, command: &remoting::RemotingCommand<'_>) {
        let Some(slot) = self.calls.borrow_mut().remove(&command.opaque) else {
            return;
        };
        *slot.answer.borrow_mut() = Some(ClientAnswer {
            code: command.code,
            remark: command.remark.as_deref().map(str::to_string),
            body: command.body.to_vec(),
        });
        slot.ready.notify();
    }

    pub fn next_opaque(&self) -> i32 {
        let opaque = self.next_opaque.get();
        self.next_opaque.set(opaque.wrapping_add(1));
        opaque
    }

    fn output_len(&self) -> usize {
        self.output.borrow().len()
    }
}

/// Bodies shorter than this are copied into the output's buffer: an own buffer saves the copy
/// but costs a piece of its own in the send.
const OWN_BUFFER_BODY_MIN_BYTES: usize = 16 << 10;

/// A connection's answers waiting to be written: frames encoded into one buffer, and large
/// bodies in their own (each one's place in the stream marked by where the buffer stood when
/// it came). The writer sends them in order in one gathering write. Copying each pull's
/// records into the buffer was a second copy of every byte served (the kernel's into the
/// socket being the other), a tenth of a shard's CPU under lagging consumer groups.
#[derive(Default)]
struct Output {
    bytes: Vec<u8>,
    /// Bodies and the length `bytes` had when each came, in order.
    bodies: Vec<(usize, Vec<u8>)>,
    /// Bytes of `bodies`.
    body_bytes: usize,
}

impl Output {
    fn len(&self) -> usize {
        self.bytes.len() + self.body_bytes
    }

    /// Memory the output holds (the buffer's room, the bodies' buffers).
    fn held_bytes(&self) -> usize {
        let bodies: usize = self.bodies.iter().map(|(_, body)| body.capacity()).sum();
        self.bytes.capacity() + bodies
    }

    fn push_body(&mut self, body: Vec<u8>) {
        if body.len() < OWN_BUFFER_BODY_MIN_BYTES {
            self.bytes.extend_from_slice(&body);
            shards::buffers::give_back(body);
            return;
        }
        self.body_bytes += body.len();
        self.bodies.push((self.bytes.len(), body));
    }

    /// The output in stream order, as pieces of the buffer and the bodies between them.
    fn pieces(&self) -> Vec<&[u8]> {
        let mut pieces = Vec::with_capacity(2 * self.bodies.len() + 1);
        let mut at = 0;
        for (before, body) in &self.bodies {
            pieces.push(&self.bytes[at..*before]);
            pieces.push(&body[..]);
            at = *before;
        }
        pieces.push(&self.bytes[at..]);
        pieces
    }

    /// Empties the output, keeping the buffer's room; the bodies' buffers go back to the
    /// shard's spares (`shards::buffers`).
    fn clear(&mut self) {
        self.bytes.clear();
        for (_, body) in self.bodies.drain(..) {
            shards::buffers::give_back(body);
        }
        self.body_bytes = 0;
    }

    /// The output as one run of bytes.
    fn into_bytes(self) -> Vec<u8> {
        if self.bodies.is_empty() {
            return self.bytes;
        }
        self.pieces().concat()
    }
}

/// What a shard plugs into its listeners: called for every decoded request.
pub trait RequestHandler: 'static {
    fn handle(&self, request: &RemotingCommand<'_>, connection: &Rc<Connection>);
    /// Called once when a connection has closed.
    fn connection_closed(&self, connection: &Rc<Connection>);
}

thread_local! {
    static NEXT_CONNECTION_ID: Cell<u64> = const { Cell::new(1) };
}

/// The connections of one shard, all its listeners together: at most `max` are served; one
/// more is accepted and closed at once (the client sees the connection reset and tries
/// another broker), with a throttled log line. The node sizes `max` to its descriptor limit,
/// so the accept itself always has a descriptor left.
pub struct ConnectionGate {
    open: Cell<usize>,
    max: usize,
    /// Connections open per remote address, and the most one address may hold.
    per_address: RefCell<std::collections::HashMap<std::net::IpAddr, usize>>,
    max_per_address: usize,
    refused: Cell<u64>,
    refusal_log: RefCell<shards::throttle::LogThrottle>,
    address_refusal_log: RefCell<shards::throttle::LogThrottle>,
    accept_error_log: RefCell<shards::throttle::LogThrottle>,
}

impl ConnectionGate {
    pub fn new(max: usize, max_per_address: usize) -> Rc<ConnectionGate> {
        Rc::new(ConnectionGate {
            open: Cell::new(0),
            max,
            per_address: RefCell::default(),
            max_per_address,
            refused: Cell::new(0),
            refusal_log: RefCell::default(),
            address_refusal_log: RefCell::default(),
            accept_error_log: RefCell::default(),
        })
    }

    /// Connections served now.
    pub fn open(&self) -> usize {
        self.open.get()
    }

    /// Connections refused at the cap so far.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    fn admit(self: &Rc<Self>, peer: Option<SocketAddr>) -> Option<GateTicket> {
        if self.open.get() >= self.max {
            let peer = peer.map_or("?".to_string(), |p| p.to_string());
            return self.refuse(
                &self.refusal_log,
                format_args!(
                    "refusing a connection from {peer}: this shard serves {} connections \
                     (network.connections_per_shard_max)",
                    self.max
                ),
            );
        }
        let ip = peer.map(|peer| peer.ip());
        if let Some(ip) = ip {
            let mut per_address = self.per_address.borrow_mut();
            let open = per_address.entry(ip).or_insert(0);
            if *open >= self.max_per_address {
                return self.refuse(
                    &self.address_refusal_log,
                    format_args!(
                        "refusing a connection from {ip}: it has {} open on this shard \
                         (network.connections_per_address_max)",
                        self.max_per_address
                    ),
                );
            }
            *open += 1;
        }
        self.open.set(self.open.get() + 1);
        Some(GateTicket(self.clone(), ip))
    }
}

impl ConnectionGate {
    /// Counts a refused connection and logs `why` (a few times a second at most, through
    /// `log`, with the number left out).
    fn refuse(
        &self,
        log: &RefCell<shards::throttle::LogThrottle>,
        why: std::fmt::Arguments<'_>,
    ) -> Option<GateTicket> {
        self.refused.set(self.refused.get() + 1);
        if let Some(left_out) = log.borrow_mut().allow(std::time::Instant::now()) {
            log::warn!("{why}{}", shards::throttle::LogThrottle::repeats(left_out));
        }
        None
    }
}

/// One admitted connection; gives its place back when dropped.
struct GateTicket(Rc<ConnectionGate>, Option<std::net::IpAddr>);

/// The connections of a port that is not a remoting one (HA, metrics): at most `max` at
/// once; one more is closed at once by its acceptor, with a log line a few times a second
/// at most. Their descriptors are part of the node's budget (`node.rs`).
pub struct PortGate {
    what: &'static str,
    open: Cell<usize>,
    max: usize,
    log: RefCell<shards::throttle::LogThrottle>,
}

/// One connection a `PortGate` admitted; gives its place back when dropped.
pub struct PortTicket(Rc<PortGate>);

impl PortGate {
    pub fn new(what: &'static str, max: usize) -> Rc<PortGate> {
        Rc::new(PortGate {
            what,
            open: Cell::new(0),
            max,
            log: RefCell::default(),
        })
    }

    /// A place for a connection from `peer`, or None (logged): the caller closes it.
    pub fn admit(self: &Rc<Self>, peer: Option<SocketAddr>) -> Option<PortTicket> {
        if self.open.get() >= self.max {
            if let Some(left_out) = self.log.borrow_mut().allow(std::time::Instant::now()) {
                let peer = peer.map_or("?".to_string(), |p| p.to_string());
                log::warn!(
                    "refusing a connection from {peer} to the {} port: it serves {} at once{}",
                    self.what,
                    self.max,
                    shards::throttle::LogThrottle::repeats(left_out)
                );
            }
            return None;
        }
        self.open.set(self.open.get() + 1);
        Some(PortTicket(self.clone()))
    }
}

impl Drop for PortTicket {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get() - 1);
    }
}

thread_local! {
    /// The connections this shard serves, by id (for figures summed over them).
    static LIVE: RefCell<std::collections::HashMap<u64, std::rc::Weak<Connection>>> =
        RefCell::default();
}

/// Over the connections this shard serves: (bytes of output waiting, bytes their buffers
/// hold, with the shard's spare body buffers); see `Connection::buffered_bytes`.
pub fn connection_buffers() -> (u64, u64) {
    let spare = shards::buffers::spare_bytes() as u64;
    LIVE.with(|live| {
        let live = live.borrow();
        let each = live.values().filter_map(std::rc::Weak::upgrade);
        each.fold((0, spare), |(waiting, memory), connection| {
            let (w, m) = connection.buffered_bytes();
            (waiting + w as u64, memory + m as u64)
        })
    })
}

thread_local! {
    /// Connections this shard closed since its memory was last given back (`trim_memory`).
    static CLOSED_SINCE_TRIM: Cell<u64> = const { Cell::new(0) };
}

/// Connections closed that make a shard give freed memory back to the system.
const CLOSED_CONNECTIONS_PER_TRIM: u64 = 64;
/// How often a shard looks whether it should.
const TRIM_CHECK_INTERVAL_MS: u64 = 2_000;

/// Gives the memory of closed connections back to the system: glibc keeps freed blocks in
/// its arenas (4,000 closed connections held 58 MB for good), so after a burst of closes
/// the shard asks it to release free pages (malloc_trim). Runs for the shard's life.
pub async fn trim_memory() {
    loop {
        runtime::sleep(std::time::Duration::from_millis(TRIM_CHECK_INTERVAL_MS)).await;
        if CLOSED_SINCE_TRIM.with(|closed| closed.get()) < CLOSED_CONNECTIONS_PER_TRIM {
            continue;
        }
        CLOSED_SINCE_TRIM.with(|closed| closed.set(0));
        runtime::release_free_memory().await;
    }
}

impl Drop for GateTicket {
    fn drop(&mut self) {
        CLOSED_SINCE_TRIM.with(|closed| closed.set(closed.get() + 1));
        let gate = &self.0;
        gate.open.set(gate.open.get() - 1);
        if let Some(ip) = self.1 {
            let mut per_address = gate.per_address.borrow_mut();
            if let Some(open) = per_address.get_mut(&ip) {
                *open -= 1;
                if *open == 0 {
                    per_address.remove(&ip);
                }
            }
        }
    }
}

/// Wait after a failed accept (descriptors or memory short) before the next.
const ACCEPT_RETRY_MS: u64 = 50;

/// Accepts connections forever, serving each with `handler` under `limits`, as `gate` admits,
/// over TLS where `tls` says so.
pub async fn serve_listener(
    listener: TcpListener,
    handler: Rc<dyn RequestHandler>,
    limits: ConnectionLimits,
    gate: Rc<ConnectionGate>,
    tls: Option<std::sync::Arc<crate::tls::TlsServer>>,
) {
    let mut acceptor = listener.acceptor();
    loop {
        match acceptor.accept().await {
            Ok(stream) => {
                let Some(ticket) = gate.admit(stream.peer_addr().ok()) else {
                    drop(stream);
                    continue;
                };
                let (handler, tls) = (handler.clone(), tls.clone());
                runtime::spawn_detached(async move {
                    let _ticket = ticket;
                    serve_connection(stream, handler, limits, tls).await
                });
            }
            Err(error) => {
                let allowed = gate
                    .accept_error_log
                    .borrow_mut()
                    .allow(std::time::Instant::now());
                if let Some(left_out) = allowed {
                    log::warn!(
                        "accept failed: {error}; trying again every {ACCEPT_RETRY_MS} \
                         ms{}",
                        shards::throttle::LogThrottle::repeats(left_out)
                    );
                }
                runtime::sleep(std::time::Duration::from_millis(ACCEPT_RETRY_MS)).await;
            }
        }
    }
}

/// A connection's TLS session (rustls, sans-I/O), shared by its read and write tasks.
struct TlsSession {
    conn: RefCell<rustls::ServerConnection>,
    /// Received TLS bytes rustls has not taken in yet.
    raw: RefCell<Vec<u8>>,
}

/// Peeks at a new connection's first bytes when TLS is on: a handshake starts a TLS session
/// (fed those bytes), a plaintext frame is served as before in permissive mode (the bytes
/// returned are its start) and refused in enforcing mode (`None`: close).
async fn sniff(
    reader: &Socket,
    tls: &crate::tls::TlsServer,
    peer: SocketAddr,
) -> Option<(Vec<u8>, Option<Rc<TlsSession>>)> {
    let mut first = vec![0u8; IDLE_READ_BYTES];
    let read = match reader.read(&mut first).await {
        Ok(0) | Err(_) => return None,
        Ok(read) => read,
    };
    first.truncate(read);
    if first[0] == crate::tls::TLS_HANDSHAKE_BYTE {
        let mut conn = match rustls::ServerConnection::new(tls.config.clone()) {
            Ok(conn) => conn,
            Err(error) => {
                log::warn!("TLS session for {peer} not started: {error}");
                return None;
            }
        };
        // Output is bounded by the connection's own limits; rustls need not bound it again.
        conn.set_buffer_limit(None);
        let session = TlsSession {
            conn: RefCell::new(conn),
            raw: RefCell::new(first),
        };
        return Some((Vec::new(), Some(Rc::new(session))));
    }
    if tls.mode == crate::tls::TlsMode::Enforcing {
        PLAINTEXT_REFUSAL_LOG.with(|log| {
            if let Some(left_out) = log.borrow_mut().allow(std::time::Instant::now()) {
                log::warn!(
                    "refusing a plaintext connection from {peer}: TLS is enforced \
                     (tls.server.mode){}",
                    shards::throttle::LogThrottle::repeats(left_out)
                );
            }
        });
        return None;
    }
    Some((first, None))
}

thread_local! {
    /// Plaintext connections refused by enforcing mode, logged at most a few times a second.
    static PLAINTEXT_REFUSAL_LOG: RefCell<shards::throttle::LogThrottle> = RefCell::default();
}

/// Reads plaintext of a TLS session into `into`: what rustls holds first, else more bytes
/// from the socket (through `scratch`). 0 at the end of the stream.
async fn tls_read(
    reader: &Socket,
    session: &TlsSession,
    into: &mut [u8],
    scratch: &mut [u8],
    connection: &Connection,
) -> Result<usize, String> {
    use std::io::Read;
    loop {
        {
            let mut conn = session.conn.borrow_mut();
            match conn.reader().read(into) {
                Ok(read) => return Ok(read),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(format!("TLS: {error}")),
            }
            let mut raw = session.raw.borrow_mut();
            if !raw.is_empty() {
                let taken = conn
                    .read_tls(&mut &raw[..])
                    .map_err(|e| format!("TLS: {e}"))?;
                raw.drain(..taken);
                let processed = conn.process_new_packets();
                if conn.wants_write() {
                    // Handshake messages or an alert: the write task sends them.
                    connection.output_ready.notify();
                }
                processed.map_err(|e| format!("TLS: {e}"))?;
                continue;
            }
        }
        let read = reader.read(scratch).await.map_err(|e| e.to_string())?;
        if read == 0 {
            return Ok(0);
        }
        session.raw.borrow_mut().extend_from_slice(&scratch[..read]);
    }
}

async fn serve_connection(
    stream: std::net::TcpStream,
    handler: Rc<dyn RequestHandler>,
    limits: ConnectionLimits,
    tls: Option<std::sync::Arc<crate::tls::TlsServer>>,
) {
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let id = NEXT_CONNECTION_ID.with(|next| {
        let id = next.get();
        next.set(id + 1);
        id
    });
    let socket = match Socket::adopt(stream) {
        Ok(socket) => Rc::new(socket),
        Err(error) => {
            log::warn!("closing the connection from {peer}: {error}");
            return;
        }
    };
    let (initial, session) = match &tls {
        None => (Vec::new(), None),
        Some(tls) => match sniff(&socket, tls, peer).await {
            Some(sniffed) => sniffed,
            None => return,
        },
    };
    let connection = Connection::new(id, peer, local, limits);
    LIVE.with(|live| live.borrow_mut().insert(id, Rc::downgrade(&connection)));
    let writer_task = runtime::spawn(write_loop(
        socket.clone(),
        connection.clone(),
        session.clone(),
    ));
    let transport = Transport {
        socket,
        session,
        initial,
    };
    if let Err(reason) = read_loop(transport, &connection, handler.as_ref()).await {
        log::debug!("closing connection from {peer}: {reason}");
    }
    connection.closed.set(true);
    connection.wake_calls();
    connection.output_ready.notify();
    connection.room_freed();
    handler.connection_closed(&connection);
    writer_task.await;
    LIVE.with(|live| live.borrow_mut().remove(&id));
}

/// Read buffer of a connection until a read fills it (then: `read_chunk_bytes`).
pub const IDLE_READ_BYTES: usize = 4 * 1024;

/// Reads between two checks whether a connection's grown read buffer can shrink back.
const READS_BEFORE_SHRINK: u32 = 256;

/// Where a connection's requests come from: the socket, through TLS or not, after the
/// bytes the first read (TLS sniffing) already took.
struct Transport {
    socket: Rc<Socket>,
    session: Option<Rc<TlsSession>>,
    initial: Vec<u8>,
}

async fn read_loop(
    mut transport: Transport,
    connection: &Rc<Connection>,
    handler: &dyn RequestHandler,
) -> Result<(), String> {
    let fd = transport.socket.raw_fd();
    let mut scratch = match transport.session {
        Some(_) => vec![0u8; connection.limits.read_chunk_bytes],
        None => Vec::new(),
    };
    // An idle connection holds a small buffer; the first read that fills it grows it to the
    // read chunk for good (a 64 KiB buffer for every idle connection was 74 KiB of RSS each).
    let mut chunk_bytes = IDLE_READ_BYTES.min(connection.limits.read_chunk_bytes);
    let mut buffer: Vec<u8> = Vec::with_capacity(chunk_bytes);
    let mut filled = 0usize;
    // The most the buffer had to hold (pending bytes + a read) since the last shrink check.
    let mut needed = 0usize;
    let mut reads_since_check = 0u32;
    let mut room = FrameRoom::default();
    loop {
        while connection.must_pause() && !connection.is_closed() {
            connection.output_drained.wait().await;
        }
        // A frame larger than the read buffer takes room for all of itself first.
        let arriving = arriving_frame_bytes(&buffer[..filled]);
        if arriving <= connection.limits.read_chunk_bytes {
            room.release();
        } else if !wait_for_frame_room(&mut room, arriving, connection).await {
            return Ok(());
        }
        let hold = connection.read_hold.borrow_mut().take();
        if let Some(hold) = hold {
            hold.await;
        }
        if connection.is_closed() {
            return Ok(());
        }
        if buffer.len() < filled + chunk_bytes {
            buffer.resize(filled + chunk_bytes, 0);
        }
        let into = &mut buffer[filled..];
        let read = if !transport.initial.is_empty() {
            let read = transport.initial.len().min(into.len());
            into[..read].copy_from_slice(&transport.initial[..read]);
            transport.initial.drain(..read);
            read
        } else {
            match &transport.session {
                None => transport
                    .socket
                    .read(into)
                    .await
                    .map_err(|e| e.to_string())?,
                Some(session) => {
                    tls_read(&transport.socket, session, into, &mut scratch, connection).await?
                }
            }
        };
        if read == 0 {
            return Ok(());
        }
        if filled + read == buffer.len() {
            chunk_bytes = connection.limits.read_chunk_bytes;
        }
        filled += read;
        let consumed = decode_and_dispatch(&buffer[..filled], connection, handler)?;
        buffer.copy_within(consumed..filled, 0);
        filled -= consumed;
        note_partial_frame(connection, filled, consumed, fd);
        // A buffer grown for large frames (batches) stays while they keep coming: shrinking
        // after each one made every batch grow it again (allocation, page faults, zeroing).
        // It goes back to its usual size after READS_BEFORE_SHRINK reads that needed less,
        // or at once past 16 reads' worth (a rare huge message must not stay resident).
        needed = needed.max(filled + chunk_bytes);
        reads_since_check += 1;
        let huge = buffer.len() > 16 * chunk_bytes && filled < chunk_bytes;
        if huge || reads_since_check == READS_BEFORE_SHRINK {
            if huge || (buffer.len() > 4 * chunk_bytes && needed <= 2 * chunk_bytes) {
                buffer.truncate(2 * chunk_bytes);
                buffer.shrink_to(2 * chunk_bytes);
            }
            reads_since_check = 0;
            needed = 0;
        }
        connection.read_buffer_bytes.set(buffer.capacity());
        // Finished commitlog flushes are collected after every frame (`decode_and_dispatch`)
        // and here. No yield between reads: glommio's I/O poll each time the preemption timer
        // fired cost ~20% more broker CPU per message and gained no throughput (A/B, 512 in
        // flight: 455,338 vs 371,977 msgs/s per busy core at the same msgs/s).
        runtime::run_poll_hooks();
    }
}

/// Keeps the start time of a frame that is not whole yet (`filled` bytes of it wait) and
/// starts the watch that closes the connection if it is not whole in time.
fn note_partial_frame(
    connection: &Rc<Connection>,
    filled: usize,
    consumed: usize,
    fd: std::os::fd::RawFd,
) {
    let timeout_ms = connection.limits.partial_frame_timeout_ms;
    if filled == 0 {
        connection.partial_since_ms.set(None);
        return;
    }
    if timeout_ms == 0 {
        return;
    }
    if consumed > 0 || connection.partial_since_ms.get().is_none() {
        connection
            .partial_since_ms
            .set(Some(runtime::monotonic_ms()));
    }
    if connection.partial_watch_running.replace(true) {
        return;
    }
    let connection = connection.clone();
    runtime::spawn_detached(async move {
        while let Some(since) = connection.partial_since_ms.get() {
            if connection.is_closed() {
                break;
            }
            let now = runtime::monotonic_ms();
            let deadline = since + timeout_ms;
            if now >= deadline {
                PARTIAL_FRAME_LOG.with(|log| {
                    if let Some(left_out) = log.borrow_mut().allow(std::time::Instant::now()) {
                        log::warn!(
                            "closing the connection from {}: a frame begun {} ms ago is still \
                             not whole (network.partial_frame_timeout_ms){}",
                            connection.peer,
                            now - since,
                            shards::throttle::LogThrottle::repeats(left_out)
                        );
                    }
                });
                // The read waiting on the socket ends; the connection closes as on EOF. The
                // socket is still open: it is closed only after the read loop returns, on
                // this same thread.
                // SAFETY: shutdown(2) on a descriptor this connection owns and has not closed.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                break;
            }
            runtime::sleep(std::time::Duration::from_millis(deadline - now)).await;
        }
        connection.partial_watch_running.set(false);
    });
}

thread_local! {
    /// Closings for an incomplete frame, logged at most a few times a second per shard.
    static PARTIAL_FRAME_LOG: RefCell<shards::throttle::LogThrottle> = RefCell::default();
}

/// What the frames still arriving on one shard's connections hold past their read buffers.
#[derive(Default)]
struct ArrivingFrames {
    held: Cell<usize>,
    /// Notified when room is given back.
    freed: shards::sync::Event,
    /// Connections made to wait for room, logged at most a few times a second.
    log: RefCell<shards::throttle::LogThrottle>,
}

thread_local! {
    static ARRIVING: Rc<ArrivingFrames> = Rc::default();
}

/// A wait for frame room looks again at least this often (the connection may have closed).
const FRAME_ROOM_RECHECK_MS: u64 = 1_000;

/// The room one connection's arriving frame takes among the shard's (the whole frame, taken
/// once its length prefix is read); given back once the frame is read, or when dropped.
#[derive(Default)]
struct FrameRoom {
    bytes: usize,
}

impl FrameRoom {
    /// Takes room for a frame of `bytes`: true when it holds it. One frame alone always
    /// gets it, however large, so a low limit slows big frames down but never stops them.
    fn take(&mut self, bytes: usize, max: usize) -> bool {
        if self.bytes == bytes {
            return true;
        }
        self.release();
        ARRIVING.with(|arriving| {
            let others = arriving.held.get();
            if others > 0 && others + bytes > max {
                return false;
            }
            arriving.held.set(others + bytes);
            self.bytes = bytes;
            true
        })
    }

    fn release(&mut self) {
        if self.bytes == 0 {
            return;
        }
        ARRIVING.with(|arriving| {
            arriving.held.set(arriving.held.get() - self.bytes);
            arriving.freed.notify();
        });
        self.bytes = 0;
    }
}

impl Drop for FrameRoom {
    fn drop(&mut self) {
        self.release();
    }
}

/// The length of the frame whose start `pending` holds (0 before its length prefix is in).
/// `decode_frame` has checked the prefix against the frame size limit.
fn arriving_frame_bytes(pending: &[u8]) -> usize {
    match pending.get(..4) {
        Some(prefix) => 4 + i32::from_be_bytes(prefix.try_into().unwrap()).max(0) as usize,
        None => 0,
    }
}

/// Waits until `room` holds `bytes` for the frame the connection is reading. False: the
/// frame's time ran out (`partial_frame_timeout_ms`; its watch logs it and shuts the
/// socket) or the connection closed meanwhile.
async fn wait_for_frame_room(room: &mut FrameRoom, bytes: usize, connection: &Connection) -> bool {
    let max = connection.limits.arriving_frames_max_bytes;
    let arriving = ARRIVING.with(Rc::clone);
    let mut told = false;
    loop {
        if room.take(bytes, max) {
            return true;
        }
        if connection.is_closed() {
            return false;
        }
        let timeout_ms = connection.limits.partial_frame_timeout_ms;
        let wait_ms = match connection.partial_since_ms.get() {
            Some(since) if timeout_ms > 0 => {
                let (now, deadline) = (runtime::monotonic_ms(), since + timeout_ms);
                if now >= deadline {
                    return false;
                }
                (deadline - now).min(FRAME_ROOM_RECHECK_MS)
            }
            _ => FRAME_ROOM_RECHECK_MS,
        };
        if !told {
            told = true;
            if let Some(left_out) = arriving.log.borrow_mut().allow(std::time::Instant::now()) {
                log::warn!(
                    "the connection from {} waits to read a frame of {bytes} bytes: frames \
                     arriving on this shard hold {} of {max} bytes \
                     (network.arriving_frames_max_mib){}",
                    connection.peer,
                    arriving.held.get(),
                    shards::throttle::LogThrottle::repeats(left_out)
                );
            }
        }
        let timer = runtime::sleep(std::time::Duration::from_millis(wait_ms));
        futures_lite::future::or(arriving.freed.wait(), timer).await;
    }
}

/// Hands one request to the handler, timing it for `rocketmq_rpc_latency` until its answer
/// is written (`Connection::time_answers`), during the call or later.
fn dispatch(
    command: &RemotingCommand<'_>,
    connection: &Rc<Connection>,
    handler: &dyn RequestHandler,
) {
    if command.is_oneway() {
        return handler.handle(command, connection);
    }
    connection.dispatching.set(Some(Timing {
        request_code: command.code,
        opaque: command.opaque,
        started: std::time::Instant::now(),
        suspended: false,
    }));
    handler.handle(command, connection);
    // Neither answered nor taken by an in_flight guard: nothing to time.
    connection.dispatching.set(None);
}

/// Decodes and dispatches every whole frame in `input`; returns the bytes consumed.
fn decode_and_dispatch(
    input: &[u8],
    connection: &Rc<Connection>,
    handler: &dyn RequestHandler,
) -> Result<usize, String> {
    let mut consumed = 0;
    loop {
        match remoting::decode_frame(&input[consumed..]) {
            Ok(Some((command, length))) => {
                consumed += length;
                if command.is_response() {
                    connection.answered(&command);
                } else {
                    dispatch(&command, connection, handler);
                }
                // A finished commitlog flush is collected (and the next one started) at once,
                // not at the end of the read.
                runtime::run_poll_hooks();
            }
            Ok(None) => return Ok(consumed),
            Err(error) => return Err(format!("undecodable frame: {error}")),
        }
    }
}

async fn write_loop(
    writer: Rc<Socket>,
    connection: Rc<Connection>,
    session: Option<Rc<TlsSession>>,
) {
    let limits = connection.limits;
    let mut spare = Output::default();
    loop {
        let tls_pending = session
            .as_ref()
            .is_some_and(|session| session.conn.borrow().wants_write());
        if connection.output_len() == 0 && !tls_pending {
            if connection.is_closed() {
                return;
            }
            connection.output_ready.wait().await;
            continue;
        }
        std::mem::swap(&mut spare, &mut connection.output.borrow_mut());
        if let Some(session) = &session {
            // The answers become TLS records (and handshake messages or alerts go too).
            use std::io::Write;
            let mut conn = session.conn.borrow_mut();
            // Neither can fail: rustls buffers without a limit here and writes into a Vec.
            for piece in spare.pieces() {
                let _ = conn.writer().write_all(piece);
            }
            spare.clear();
            while conn.wants_write() && conn.write_tls(&mut spare.bytes).is_ok() {}
        }
        connection.writing_bytes.set(spare.len());
        connection.count_output();
        let result = writer.write_all_vectored(&spare.pieces()).await;
        connection.writing_bytes.set(0);
        connection.count_output();
        spare.clear();
        if spare.bytes.capacity() > 4 * limits.output_pause_bytes {
            spare.bytes.shrink_to(limits.read_chunk_bytes);
        }
        connection.output_drained.notify();
        connection.room_freed();
        if result.is_err() {
            connection.closed.set(true);
            connection.wake_calls();
            connection.output.borrow_mut().clear();
            connection.count_output();
            connection.output_drained.notify();
            connection.room_freed();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(id: u64, limits: ConnectionLimits) -> Rc<Connection> {
        let address: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Connection::new(id, address, address, limits)
    }

    fn shard_output() -> usize {
        SHARD_OUTPUT.with(|output| output.held.get())
    }

    #[test]
    fn the_shard_counts_each_connections_output_until_it_goes() {
        let start = shard_output();
        let (a, b) = (
            connection(1, Default::default()),
            connection(2, Default::default()),
        );
        a.send_with(|out| out.extend_from_slice(&[1; 100]));
        b.send_with(|out| out.extend_from_slice(&[2; 50]));
        assert_eq!(shard_output() - start, 150);
        let promised = futures_lite::future::block_on(a.reserve_output(1000));
        assert_eq!(shard_output() - start, 1150, "a promise counts");
        drop(promised);
        assert_eq!(shard_output() - start, 150);
        assert_eq!(a.take_output().len(), 100);
        assert_eq!(shard_output() - start, 50);
        drop(b);
        assert_eq!(shard_output(), start, "a connection's output goes with it");
    }

    #[test]
    fn a_large_answer_waits_for_the_shards_room_unless_its_connection_has_nothing_waiting() {
        let limits = ConnectionLimits {
            shard_output_max_bytes: 1000,
            ..Default::default()
        };
        let (a, b, c) = (
            connection(1, limits),
            connection(2, limits),
            connection(3, limits),
        );
        a.send_with(|out| out.extend_from_slice(&[1; 600]));
        b.send_with(|out| out.extend_from_slice(&[2; 300]));
        let mut waiting = Box::pin(b.reserve_output(200));
        let once = futures_lite::future::poll_once(waiting.as_mut());
        assert!(
            futures_lite::future::block_on(once).is_none(),
            "900 held, 200 more do not fit under 1000"
        );
        let alone = futures_lite::future::poll_once(c.reserve_output(5000));
        assert!(
            futures_lite::future::block_on(alone).is_some(),
            "a connection with nothing waiting gets one answer whatever the shard holds"
        );
        a.take_output();
        let once = futures_lite::future::poll_once(waiting.as_mut());
        assert!(
            futures_lite::future::block_on(once).is_some(),
            "room came back on another connection"
        );
    }

    #[test]
    fn an_output_writes_large_bodies_from_their_own_buffers_in_stream_order() {
        let mut output = Output::default();
        output.bytes.extend_from_slice(b"head1|");
        let large = vec![b'L'; OWN_BUFFER_BODY_MIN_BYTES];
        let large_address = large.as_ptr();
        output.push_body(large);
        output.bytes.extend_from_slice(b"head2|");
        output.push_body(b"small".to_vec());
        output.bytes.extend_from_slice(b"head3|");
        output.push_body(vec![b'M'; OWN_BUFFER_BODY_MIN_BYTES + 1]);
        let expected = [
            &b"head1|"[..],
            &[b'L'; OWN_BUFFER_BODY_MIN_BYTES],
            b"head2|small",
            b"head3|",
            &[b'M'; OWN_BUFFER_BODY_MIN_BYTES + 1],
        ]
        .concat();
        assert_eq!(output.len(), expected.len());
        let pieces = output.pieces();
        assert_eq!(pieces.len(), 5, "a small body is copied into the buffer");
        assert_eq!(pieces[1].as_ptr(), large_address, "a large one is not");
        assert!(pieces[4].is_empty(), "nothing after the last body");
        assert_eq!(pieces.concat(), expected);
        output.clear();
        assert_eq!(output.len(), 0);
        assert!(output.pieces().concat().is_empty());
        assert!(
            shards::buffers::spare_bytes() >= 2 * OWN_BUFFER_BODY_MIN_BYTES,
            "the bodies' buffers went back to the spares"
        );
        output.bytes.extend_from_slice(b"next");
        output.push_body(shards::buffers::take(OWN_BUFFER_BODY_MIN_BYTES));
        assert_eq!(output.into_bytes(), b"next");
    }
}
