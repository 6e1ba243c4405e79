//! Shared by the raw-frame tests of filters and offset resets: a node of the real binary on
//! free loopback ports, and a client connection that matches answers to requests by opaque
//! and keeps the requests the broker pushes (NOTIFY_CONSUMER_IDS_CHANGED,
//! RESET_CONSUMER_CLIENT_OFFSET) for the test to look at.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardmq::remoting::{decode_frame, request_code as rc, FrameEncoder};

/// Longest a test waits for one answer (held pulls answer within their suspend time).
const REPLY_WAIT_MAX: Duration = Duration::from_secs(20);

pub struct Node {
    child: Child,
    dir: std::path::PathBuf,
    pub namesrv_port: u16,
    pub broker_port: u16,
}

impl Node {
    /// Shard `shard`'s broker port.
    pub fn shard_port(&self, shard: u16) -> u16 {
        self.broker_port + 10 * shard
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The binary, killed if this test's thread dies first.
fn shardmq() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardmq"));
    // SAFETY: prctl only sets a flag on the child; it is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
}

/// A base port whose block (namesrv, 2 shards × 3 ports) is free now; blocks of one process
/// never overlap (shards bind with SO_REUSEPORT, so two nodes must not share a port).
fn free_port_base() -> u16 {
    static NEXT_BLOCK: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let process_slot = (std::process::id() % 250) as u16;
    loop {
        let block = NEXT_BLOCK.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert!(block < 4, "no free port block");
        let base = 20_000 + process_slot * 160 + block * 40;
        let ports = [base, base + 18, base + 20, base + 28, base + 30];
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return base;
        }
    }
}

/// A two-shard node (`serve`), ready for clients.
pub fn start_node(name: &str) -> Node {
    let base = free_port_base();
    let dir = std::env::temp_dir().join(format!("shardmq-{name}-{}-{base}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (namesrv_port, broker_port) = (base, base + 20);
    let mut child = shardmq()
        .args(["serve", "--shards", "2", "--segment-size-mib", "16"])
        .args(["--namesrv-port", &namesrv_port.to_string()])
        .args(["--broker-port", &broker_port.to_string()])
        .arg("--data-dir")
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start shardmq");
    wait_for_line(&mut child, "shardmq: ready");
    Node {
        child,
        dir,
        namesrv_port,
        broker_port,
    }
}

/// Waits (at most 60 s) for a stdout line containing `needle`; the rest is drained.
fn wait_for_line(child: &mut Child, needle: &str) {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = lines_tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(_) => panic!("no line with {needle:?} within 60 s"),
        }
    }
}

/// One decoded frame.
#[derive(Debug, Clone)]
pub struct Frame {
    pub code: i32,
    pub opaque: i32,
    pub is_response: bool,
    pub remark: Option<String>,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Frame {
    pub fn ext(&self, key: &str) -> &str {
        self.try_ext(key)
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
    }

    pub fn try_ext(&self, key: &str) -> Option<&str> {
        self.ext
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn remark(&self) -> &str {
        self.remark.as_deref().unwrap_or("")
    }
}

/// A connection to one broker (or namesrv) endpoint.
pub struct Client {
    stream: TcpStream,
    buffer: Vec<u8>,
    next_opaque: i32,
    /// Requests the server sent, oldest first.
    pub pushed: VecDeque<Frame>,
}

impl Client {
    pub fn connect(port: u16) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buffer: Vec::new(),
            next_opaque: 1,
            pushed: VecDeque::new(),
        }
    }

    /// Sends a request and returns its answer (frames pushed meanwhile go to `pushed`).
    pub fn call(&mut self, code: i32, ext: &[(&str, &str)], body: &[u8]) -> Frame {
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        let mut frame = Vec::new();
        let mut encoder = FrameEncoder::request(&mut frame, code, opaque, false);
        for (key, value) in ext {
            encoder.ext(key, value);
        }
        encoder.finish(body);
        self.stream.write_all(&frame).unwrap();
        self.answer_to(code, opaque)
    }

    /// `call` with a header that names `language` ("CPP", "GO", …) instead of JAVA.
    pub fn call_as(
        &mut self,
        language: &str,
        code: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) -> Frame {
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        let ext: serde_json::Map<String, serde_json::Value> = ext
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        let header = serde_json::json!({
            "code": code, "flag": 0, "language": language, "opaque": opaque,
            "serializeTypeCurrentRPC": "JSON", "version": 317, "extFields": ext,
        })
        .to_string();
        let total = 4 + header.len() + body.len();
        let mut frame = (total as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&(header.len() as u32).to_be_bytes());
        frame.extend_from_slice(header.as_bytes());
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).unwrap();
        self.answer_to(code, opaque)
    }

    fn answer_to(&mut self, code: i32, opaque: i32) -> Frame {
        let deadline = Instant::now() + REPLY_WAIT_MAX;
        loop {
            let frame = self
                .read_frame(deadline)
                .unwrap_or_else(|| panic!("no answer to request {code} within 20 s"));
            if frame.is_response && frame.opaque == opaque {
                return frame;
            }
            if !frame.is_response {
                self.pushed.push_back(frame);
            }
        }
    }

    /// The first pushed request with `code` arriving within `wait`, if any.
    pub fn wait_pushed(&mut self, code: i32, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(at) = self.pushed.iter().position(|f| f.code == code) {
                return self.pushed.remove(at);
            }
            let frame = self.read_frame(deadline)?;
            if !frame.is_response {
                self.pushed.push_back(frame);
            }
        }
    }

    /// Answers a pushed request (as a client answers RESET_CONSUMER_CLIENT_OFFSET).
    pub fn answer(&mut self, request: &Frame, code: i32, body: &[u8]) {
        let mut frame = Vec::new();
        FrameEncoder::response(&mut frame, code, request.opaque).finish(body);
        self.stream.write_all(&frame).unwrap();
    }

    fn read_frame(&mut self, deadline: Instant) -> Option<Frame> {
        let mut chunk = [0u8; 65536];
        loop {
            if let Some((command, used)) = decode_frame(&self.buffer).unwrap() {
                let frame = Frame {
                    code: command.code,
                    opaque: command.opaque,
                    is_response: command.is_response(),
                    remark: command.remark.map(|r| r.into_owned()),
                    ext: command
                        .ext_fields
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    body: command.body.to_vec(),
                };
                self.buffer.drain(..used);
                return Some(frame);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("connection closed"),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }
}

/// SEND_MESSAGE_V2 of `body` to `queue` of `topic` with these user properties (and TAGS).
pub fn send(
    client: &mut Client,
    topic: &str,
    queue: u32,
    body: &[u8],
    properties: &[(&str, &str)],
) -> Frame {
    let mut encoded = String::new();
    for (name, value) in properties {
        encoded.push_str(&format!("{name}\u{1}{value}\u{2}"));
    }
    let queue = queue.to_string();
    let born = shardmq::error::now_ms().to_string();
    client.call(
        rc::SEND_MESSAGE_V2,
        &[
            ("a", "raw-producer"),
            ("b", topic),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", &queue),
            ("f", "0"),
            ("g", &born),
            ("h", "0"),
            ("i", &encoded),
        ],
        body,
    )
}

/// How a pull names its filter.
pub enum Expression<'a> {
    /// No subscription in the request: the group's heartbeat subscription applies.
    FromHeartbeat,
    /// `subscription` + `expressionType` in the request (sysFlag subscription bit).
    Given { text: &'a str, kind: &'a str },
}

/// PULL_MESSAGE (or `code`) of `queue` of `topic` from `offset`, held up to `suspend_ms`.
pub fn pull_with(
    client: &mut Client,
    code: i32,
    (group, topic, queue): (&str, &str, u32),
    offset: u64,
    expression: Expression<'_>,
    suspend_ms: u64,
) -> Frame {
    let (queue, offset, suspend) = (
        queue.to_string(),
        offset.to_string(),
        suspend_ms.to_string(),
    );
    // sysFlag: SUSPEND (2) when held, SUBSCRIPTION (4) when the expression is given.
    let mut sys_flag = if suspend_ms > 0 { 2 } else { 0 };
    let mut ext = vec![
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", queue.as_str()),
        ("queueOffset", offset.as_str()),
        ("maxMsgNums", "32"),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", suspend.as_str()),
        ("subVersion", "0"),
    ];
    if let Expression::Given { text, kind } = expression {
        sys_flag |= 4;
        ext.push(("subscription", text));
        ext.push(("expressionType", kind));
    }
    let sys_flag = sys_flag.to_string();
    ext.push(("sysFlag", &sys_flag));
    client.call(code, &ext, &[])
}

/// A pull that answers at once with the SQL92 `expression` given in the request.
pub fn pull_sql(
    client: &mut Client,
    (group, topic, queue): (&str, &str, u32),
    offset: u64,
    expression: &str,
) -> Frame {
    let given = Expression::Given {
        text: expression,
        kind: "SQL92",
    };
    pull_with(
        client,
        rc::PULL_MESSAGE,
        (group, topic, queue),
        offset,
        given,
        0,
    )
}

/// The value of property `name` in each record of a pull body.
pub fn property_values(body: &[u8], name: &str) -> Vec<String> {
    shards::store::record::decode_all(body)
        .expect("pull body decodes")
        .iter()
        .map(|m| {
            shardmq::protocol::find_property(m.properties, name)
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// HEART_BEAT of a consumer `group` subscribed to `topic` with `expression` of `kind`.
pub fn heartbeat(
    client: &mut Client,
    client_id: &str,
    group: &str,
    topic: &str,
    expression: &str,
    kind: &str,
) -> Frame {
    heartbeat_as(client, "JAVA", client_id, group, topic, expression, kind)
}

/// `heartbeat` from a client of `language` (the broker remembers it per client).
pub fn heartbeat_as(
    client: &mut Client,
    language: &str,
    client_id: &str,
    group: &str,
    topic: &str,
    expression: &str,
    kind: &str,
) -> Frame {
    let body = serde_json::json!({
        "clientID": client_id,
        "consumerDataSet": [{
            "groupName": group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
            "subscriptionDataSet": [{
                "topic": topic,
                "subString": expression,
                "expressionType": kind,
                "subVersion": 1,
            }],
        }],
        "producerDataSet": [],
    });
    client.call_as(language, rc::HEART_BEAT, &[], body.to_string().as_bytes())
}
