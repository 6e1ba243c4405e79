//! The client side of the remoting transport: one multiplexed TCP connection per peer address,
//! many requests in flight on it, answers matched to requests by `opaque` (REMOTING.md §1.5).
//!
//! Each connection has two tokio tasks: a writer that drains a bounded channel of encoded
//! frames (coalescing whatever is queued into one `write_all`), and a reader that splits frames
//! with the crate's pure codec ([`decode_frame`]) and completes the waiting request, or hands a
//! server-initiated request (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE, ...) to the
//! owner's channel. Requests are written with [`FrameEncoder`] (JSON header, string values).
//!
//! Invariants: a pending request is completed exactly once (answer, connection loss or its own
//! timeout removes it from the table); a connection that failed is removed from the pool, so the
//! next call reconnects; nothing here grows without bound: frames queued per connection are
//! limited by [`WRITE_QUEUE_FRAMES_MAX`], server requests waiting for the owner by
//! [`SERVER_REQUESTS_QUEUED_MAX`] (extra ones are dropped, as a busy Java client drops them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::error::{ClientError, ClientResult};
use crate::remoting::{decode_frame, response_code, FrameEncoder};
use crate::SessionCredentials;

pub use crate::limits::SERVER_REQUESTS_QUEUED_MAX;
pub use crate::limits::WRITE_QUEUE_FRAMES_MAX;
/// How long opening a connection may take.
pub const CONNECT_TIMEOUT_MS: u64 = 3_000;
pub use crate::limits::REQUEST_BODY_MAX_BYTES;
/// Bytes read from the socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;

type BoxedReader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type BoxedWriter = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// A request to send: code, extFields (all strings) and body.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub code: i32,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn new(code: i32) -> Request {
        Request {
            code,
            ..Request::default()
        }
    }

    /// Adds an extFields entry.
    pub fn ext(mut self, key: &str, value: impl ToString) -> Request {
        self.ext.push((key.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: Vec<u8>) -> Request {
        self.body = body;
        self
    }

    /// The frame of this request; signed (AccessKey, Signature) when `credentials` are given.
    fn encode(
        &self,
        out: &mut Vec<u8>,
        opaque: i32,
        oneway: bool,
        credentials: Option<&SessionCredentials>,
    ) {
        let signed;
        let fields = match credentials {
            Some(credentials) => {
                let mut fields = self.ext.clone();
                credentials.sign_request(&mut fields, &self.body);
                signed = fields;
                &signed
            }
            None => &self.ext,
        };
        let mut frame = FrameEncoder::request(out, self.code, opaque, oneway);
        for (key, value) in fields {
            frame.ext(key, value);
        }
        frame.finish(&self.body);
    }
}

/// An owned frame from the peer: an answer, or a request the broker sends to the client.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub code: i32,
    pub opaque: i32,
    pub oneway: bool,
    pub remark: Option<String>,
    pub ext: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn ext(&self, key: &str) -> Option<&str> {
        self.ext.get(key).map(String::as_str)
    }

    /// A required decimal ext field.
    pub fn ext_i64(&self, key: &str) -> ClientResult<i64> {
        let text = self
            .ext(key)
            .ok_or_else(|| ClientError::Malformed(format!("answer lacks {key}")))?;
        text.trim()
            .parse()
            .map_err(|_| ClientError::Malformed(format!("{key} is not a number: {text}")))
    }

    /// The answer as an error for `addr` (for codes the caller does not accept).
    pub fn into_error(self, addr: &str) -> ClientError {
        ClientError::Broker {
            addr: addr.to_string(),
            code: self.code,
            remark: self.remark.unwrap_or_default(),
        }
    }
}

/// A request the broker sent to this client, with the address of the connection it came on.
#[derive(Debug, Clone)]
pub struct ServerRequest {
    pub addr: String,
    pub request: Response,
}

type Pending = Arc<Mutex<HashMap<i32, oneshot::Sender<Response>>>>;

/// One TCP connection to a peer.
struct Connection {
    addr: String,
    frames: mpsc::Sender<Vec<u8>>,
    pending: Pending,
    closed: Arc<AtomicBool>,
}

/// Connections to every peer this client talks to, keyed by "ip:port".
pub struct RemotingClient {
    /// Held only for map lookups and inserts, never across a connect.
    connections: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    next_opaque: AtomicI32,
    server_requests: mpsc::Sender<ServerRequest>,
    /// Every request is signed with these when set (brokers with ACL on need it).
    credentials: Option<SessionCredentials>,
    /// Every connection speaks TLS when set.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl RemotingClient {
    /// A client whose server-initiated requests go to `server_requests`.
    pub fn new(server_requests: mpsc::Sender<ServerRequest>) -> RemotingClient {
        RemotingClient {
            connections: tokio::sync::Mutex::new(HashMap::new()),
            next_opaque: AtomicI32::new(1),
            server_requests,
            credentials: None,
            tls: None,
        }
    }

    /// Every connection of this client speaks TLS with `tls` (`crate::tls::TlsOptions`).
    pub fn with_tls(mut self, tls: Option<Arc<rustls::ClientConfig>>) -> RemotingClient {
        self.tls = tls;
        self
    }

    /// This client signs every request it sends with `credentials` (RocketMQ's
    /// AclClientRPCHook).
    pub fn with_credentials(mut self, credentials: Option<SessionCredentials>) -> RemotingClient {
        self.credentials = credentials;
        self
    }

    fn opaque(&self) -> i32 {
        // Wraps after 2^31 requests; opaques only need to be unique among those in flight.
        self.next_opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX
    }

    /// The open connection to `addr`, opened now if needed. The pool lock is not held while
    /// connecting, so a dead or slow peer never delays requests to the others; two callers
    /// racing to open the same address keep the first connection that made it into the pool.
    async fn connection(&self, addr: &str) -> ClientResult<Arc<Connection>> {
        if let Some(connection) = self.pooled(addr).await {
            return Ok(connection);
        }
        let opened = Arc::new(self.open(addr).await?);
        let mut connections = self.connections.lock().await;
        if let Some(existing) = connections.get(addr) {
            if !existing.closed.load(Ordering::Acquire) {
                opened.closed.store(true, Ordering::Release);
                return Ok(existing.clone());
            }
        }
        connections.insert(addr.to_string(), opened.clone());
        Ok(opened)
    }

    async fn pooled(&self, addr: &str) -> Option<Arc<Connection>> {
        let connections = self.connections.lock().await;
        connections
            .get(addr)
            .filter(|connection| !connection.closed.load(Ordering::Acquire))
            .cloned()
    }

    async fn open(&self, addr: &str) -> ClientResult<Connection> {
        let connect = TcpStream::connect(addr);
        let stream =
            match tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return Err(connect_error(addr, error.to_string())),
                Err(_) => return Err(connect_error(addr, "timed out".to_string())),
            };
        let _ = stream.set_nodelay(true);
        let (frames, frames_rx) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let spawn_loops = |reader, writer| {
            tokio::spawn(write_loop(writer, frames_rx, closed.clone()));
            tokio::spawn(read_loop(
                reader,
                addr.to_string(),
                pending.clone(),
                closed.clone(),
                self.server_requests.clone(),
            ));
        };
        match &self.tls {
            None => {
                let (reader, writer) = stream.into_split();
                spawn_loops(
                    Box::new(reader) as BoxedReader,
                    Box::new(writer) as BoxedWriter,
                );
            }
            Some(config) => {
                let name = crate::tls::server_name(addr).map_err(|e| connect_error(addr, e))?;
                let connector = tokio_rustls::TlsConnector::from(config.clone());
                let handshake = connector.connect(name, stream);
                let stream = match tokio::time::timeout(
                    Duration::from_millis(CONNECT_TIMEOUT_MS),
                    handshake,
                )
                .await
                {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => return Err(connect_error(addr, format!("TLS: {error}"))),
                    Err(_) => return Err(connect_error(addr, "TLS handshake timed out".into())),
                };
                let (reader, writer) = tokio::io::split(stream);
                spawn_loops(
                    Box::new(reader) as BoxedReader,
                    Box::new(writer) as BoxedWriter,
                );
            }
        }
        Ok(Connection {
            addr: addr.to_string(),
            frames,
            pending,
            closed,
        })
    }

    /// The local address this client uses towards `addr` (to name the client by its IP).
    pub async fn local_ip_towards(addr: &str) -> Option<std::net::IpAddr> {
        let connect = TcpStream::connect(addr);
        let stream = tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), connect)
            .await
            .ok()?
            .ok()?;
        stream.local_addr().ok().map(|local| local.ip())
    }

    /// Sends `request` and waits for its answer (any response code) up to `timeout`.
    pub async fn invoke(
        &self,
        addr: &str,
        request: &Request,
        timeout: Duration,
    ) -> ClientResult<Response> {
        check_body(request)?;
        let connection = self.connection(addr).await?;
        let opaque = self.opaque();
        let (answer_tx, answer_rx) = oneshot::channel();
        lock(&connection.pending).insert(opaque, answer_tx);
        let mut frame = Vec::with_capacity(request.body.len() + 256);
        request.encode(&mut frame, opaque, false, self.credentials.as_ref());
        let outcome = tokio::time::timeout(timeout, async {
            if connection.frames.send(frame).await.is_err() {
                return Err(closed_error(&connection.addr, "writer stopped"));
            }
            answer_rx
                .await
                .map_err(|_| closed_error(&connection.addr, "no answer before close"))
        })
        .await;
        match outcome {
            Ok(result) => result,
            Err(_) => {
                lock(&connection.pending).remove(&opaque);
                Err(ClientError::Timeout {
                    addr: addr.to_string(),
                    code: request.code,
                    timeout_ms: timeout.as_millis() as u64,
                })
            }
        }
    }

    /// Sends `request` with the oneway flag: no answer is expected or waited for.
    pub async fn invoke_oneway(&self, addr: &str, request: &Request) -> ClientResult<()> {
        check_body(request)?;
        let connection = self.connection(addr).await?;
        let mut frame = Vec::with_capacity(request.body.len() + 256);
        request.encode(&mut frame, self.opaque(), true, self.credentials.as_ref());
        connection
            .frames
            .send(frame)
            .await
            .map_err(|_| closed_error(addr, "writer stopped"))
    }

    /// Answers a server-initiated request on the connection it came from.
    pub async fn respond(
        &self,
        addr: &str,
        opaque: i32,
        code: i32,
        remark: Option<&str>,
    ) -> ClientResult<()> {
        let connection = self.connection(addr).await?;
        let mut frame = Vec::new();
        let mut encoder = FrameEncoder::response(&mut frame, code, opaque);
        if let Some(remark) = remark {
            encoder.remark(remark);
        }
        encoder.finish(&[]);
        connection
            .frames
            .send(frame)
            .await
            .map_err(|_| closed_error(addr, "writer stopped"))
    }

    /// Closes every connection (their tasks end; pending requests fail).
    pub async fn close_all(&self) {
        let mut connections = self.connections.lock().await;
        for connection in connections.values() {
            connection.closed.store(true, Ordering::Release);
        }
        connections.clear();
    }
}

fn check_body(request: &Request) -> ClientResult<()> {
    if request.body.len() > REQUEST_BODY_MAX_BYTES {
        return Err(ClientError::InvalidArgument(format!(
            "request body of {} bytes exceeds {REQUEST_BODY_MAX_BYTES}",
            request.body.len()
        )));
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short locks is a bug elsewhere; keep serving.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn connect_error(addr: &str, reason: String) -> ClientError {
    ClientError::Connect {
        addr: addr.to_string(),
        reason,
    }
}

fn closed_error(addr: &str, reason: &str) -> ClientError {
    ClientError::ConnectionClosed {
        addr: addr.to_string(),
        reason: reason.to_string(),
    }
}

async fn write_loop(
    mut writer: impl tokio::io::AsyncWrite + Unpin,
    mut frames: mpsc::Receiver<Vec<u8>>,
    closed: Arc<AtomicBool>,
) {
    /// Coalesce queued frames up to this many bytes per write.
    const COALESCE_BYTES_MAX: usize = 1024 * 1024;
    let mut batch = Vec::new();
    while let Some(frame) = frames.recv().await {
        if closed.load(Ordering::Acquire) {
            break;
        }
        batch.clear();
        batch.extend_from_slice(&frame);
        while batch.len() < COALESCE_BYTES_MAX {
            match frames.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if writer.write_all(&batch).await.is_err() {
            break;
        }
    }
    closed.store(true, Ordering::Release);
    let _ = writer.shutdown().await;
}

async fn read_loop(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    addr: String,
    pending: Pending,
    closed: Arc<AtomicBool>,
    server_requests: mpsc::Sender<ServerRequest>,
) {
    let mut buffer: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    'read: loop {
        let read = tokio::select! {
            read = reader.read(&mut chunk) => read,
            // Wake now and then to notice a close requested by `close_all`.
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if closed.load(Ordering::Acquire) { break 'read; }
                continue 'read;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
        let mut consumed_total = 0;
        loop {
            match decode_frame(&buffer[consumed_total..]) {
                Ok(Some((command, consumed))) => {
                    let is_response = command.is_response();
                    let frame = Response {
                        code: command.code,
                        opaque: command.opaque,
                        oneway: command.is_oneway(),
                        remark: command.remark.map(|r| r.into_owned()),
                        ext: command.ext_fields.collect_owned(),
                        body: command.body.to_vec(),
                    };
                    consumed_total += consumed;
                    deliver(frame, is_response, &addr, &pending, &server_requests);
                }
                Ok(None) => break,
                Err(_) => break 'read, // Java closes on a malformed frame; so do we.
            }
        }
        buffer.drain(..consumed_total);
    }
    closed.store(true, Ordering::Release);
    // Dropping the senders fails every request still waiting on this connection.
    lock(&pending).clear();
}

fn deliver(
    frame: Response,
    is_response: bool,
    addr: &str,
    pending: &Pending,
    server_requests: &mpsc::Sender<ServerRequest>,
) {
    if is_response {
        if let Some(waiter) = lock(pending).remove(&frame.opaque) {
            let _ = waiter.send(frame);
        }
        return;
    }
    let request = ServerRequest {
        addr: addr.to_string(),
        request: frame,
    };
    // A full queue drops the request: the broker repeats checks and notifications.
    let _ = server_requests.try_send(request);
}

/// True for answers that carry a stored send (§2.2: 10, 11, 12 are "stored, with a caveat").
pub fn is_send_stored(code: i32) -> bool {
    matches!(
        code,
        response_code::SUCCESS
            | response_code::FLUSH_DISK_TIMEOUT
            | response_code::SLAVE_NOT_AVAILABLE
            | response_code::FLUSH_SLAVE_TIMEOUT
    )
}
