//! Raw remoting frames over a blocking `TcpStream`, built by our codec and read with
//! [`shardmq::remoting::read_frame`]: plain request/next-frame calls on a stream, and a
//! [`Client`] that matches answers to requests by opaque and keeps the requests the broker
//! pushes (NOTIFY_CONSUMER_IDS_CHANGED, RESET_CONSUMER_CLIENT_OFFSET,
//! CHECK_TRANSACTION_STATE) for the test to look at.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use shardmq::remoting::{read_frame as read_one_frame, RemotingCommand};
use shardmq::remoting::{request_code as rc, FrameEncoder};

/// Longest a test waits for one answer (held pulls answer within their suspend time), and
/// for the rest of a frame once its first byte is in.
pub const REPLY_WAIT_MAX: Duration = Duration::from_secs(20);

/// One decoded frame, owned.
#[derive(Debug, Clone)]
pub struct Frame {
    pub code: i32,
    pub opaque: i32,
    pub flag: i32,
    pub remark: Option<String>,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Frame {
    /// The ext field `key`; panics naming the fields there are when it is missing.
    pub fn ext(&self, key: &str) -> &str {
        self.get(key)
            .unwrap_or_else(|| panic!("no {key} in {:?}", self.ext))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.ext
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_response(&self) -> bool {
        self.flag & 1 != 0
    }

    /// The remark, `""` when there is none.
    pub fn remark(&self) -> &str {
        self.remark.as_deref().unwrap_or("")
    }
}

impl From<RemotingCommand<'_>> for Frame {
    fn from(command: RemotingCommand<'_>) -> Frame {
        Frame {
            code: command.code,
            opaque: command.opaque,
            flag: command.flag,
            remark: command.remark.map(|r| r.into_owned()),
            ext: command.ext_fields.collect_owned(),
            body: command.body.to_vec(),
        }
    }
}

/// Encodes one request frame.
pub fn request_frame(code: i32, opaque: i32, ext: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    let mut encoder = FrameEncoder::request(&mut frame, code, opaque, false);
    for (k, v) in ext {
        encoder.ext(k, v);
    }
    encoder.finish(body);
    frame
}

/// Sends one request (opaque 7) and reads the next frame, whatever it is.
pub fn call(stream: &mut TcpStream, code: i32, ext: &[(&str, &str)], body: &[u8]) -> Frame {
    stream
        .write_all(&request_frame(code, 7, ext, body))
        .unwrap();
    read_frame(stream, REPLY_WAIT_MAX).expect("a reply within 20 s")
}

/// Why no frame came.
enum NoFrame {
    TimedOut,
    Closed,
}

/// Reads one frame; None when none came within `wait` or the connection has closed.
pub fn read_frame(stream: &mut TcpStream, wait: Duration) -> Option<Frame> {
    next_frame(stream, wait).ok()
}

fn next_frame(stream: &mut TcpStream, wait: Duration) -> Result<Frame, NoFrame> {
    // Wait for the first byte without taking it, then read the whole frame under the longer
    // limit: a wait that runs out never leaves half a frame read.
    stream.set_read_timeout(Some(wait)).unwrap();
    match stream.peek(&mut [0u8; 1]) {
        Ok(0) => return Err(NoFrame::Closed),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(NoFrame::TimedOut)
        }
        Err(e) => panic!("read failed: {e}"),
    }
    stream.set_read_timeout(Some(REPLY_WAIT_MAX)).unwrap();
    let mut buffer = Vec::new();
    match read_one_frame(stream, &mut buffer) {
        Ok(Some(command)) => Ok(Frame::from(command)),
        Ok(None) => Err(NoFrame::Closed),
        Err(e) => panic!("read failed: {e}"),
    }
}

/// A connection to one broker (or namesrv) endpoint that matches answers to requests.
pub struct Client {
    stream: TcpStream,
    next_opaque: i32,
    /// Requests the server sent, oldest first.
    pub pushed: VecDeque<Frame>,
}

impl Client {
    /// Connects to `port` on loopback.
    pub fn connect(port: u16) -> Client {
        Client::connect_to(&format!("127.0.0.1:{port}"))
    }

    /// Connects to `addr` (`host:port`).
    pub fn connect_to(addr: &str) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            next_opaque: 1,
            pushed: VecDeque::new(),
        }
    }

    /// Sends a request and returns its answer (frames pushed meanwhile go to `pushed`).
    pub fn call(&mut self, code: i32, ext: &[(&str, &str)], body: &[u8]) -> Frame {
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        self.stream
            .write_all(&request_frame(code, opaque, ext, body))
            .unwrap();
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
            if frame.is_response() && frame.opaque == opaque {
                return frame;
            }
            if !frame.is_response() {
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
            if !frame.is_response() {
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

    /// The next frame if one arrives by `deadline` (one already waiting is taken even when
    /// the deadline has passed); panics when the connection closes.
    fn read_frame(&mut self, deadline: Instant) -> Option<Frame> {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_frame(&mut self.stream, left.max(Duration::from_millis(1))) {
            Ok(frame) => Some(frame),
            Err(NoFrame::TimedOut) => None,
            Err(NoFrame::Closed) => panic!("connection closed"),
        }
    }
}

/// SEND_MESSAGE_V2 of one message to `queue` of `topic` with extra properties.
pub fn send_v2_frame(
    opaque: i32,
    (topic, queue): (&str, &str),
    body: &[u8],
    properties: &str,
    sys_flag: &str,
    group: &str,
) -> Vec<u8> {
    request_frame(
        rc::SEND_MESSAGE_V2,
        opaque,
        &[
            ("a", group),
            ("b", topic),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", queue),
            ("f", sys_flag),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", properties),
        ],
        body,
    )
}

/// Sends one plain message and reads the reply.
pub fn send(stream: &mut TcpStream, topic: &str, queue: &str, body: &[u8]) -> Frame {
    stream
        .write_all(&send_v2_frame(
            7,
            (topic, queue),
            body,
            "TAGS\u{1}T\u{2}",
            "0",
            "pg",
        ))
        .unwrap();
    read_frame(stream, REPLY_WAIT_MAX).expect("a send reply within 20 s")
}

/// A PULL_MESSAGE frame; with `suspend_ms` the pull may be held (sysFlag SUSPEND |
/// SUBSCRIPTION, expression "*"), without it it answers at once.
pub fn pull_frame(
    opaque: i32,
    (group, topic, queue): (&str, &str, &str),
    offset: u64,
    suspend_ms: Option<u64>,
) -> Vec<u8> {
    let offset = offset.to_string();
    let suspend = suspend_ms.unwrap_or(0).to_string();
    let mut ext = vec![
        ("consumerGroup", group),
        ("topic", topic),
        ("queueId", queue),
        ("queueOffset", offset.as_str()),
        ("maxMsgNums", "32"),
        ("sysFlag", if suspend_ms.is_some() { "6" } else { "0" }),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", suspend.as_str()),
        ("subVersion", "0"),
    ];
    if suspend_ms.is_some() {
        ext.push(("subscription", "*"));
    }
    request_frame(rc::PULL_MESSAGE, opaque, &ext, &[])
}

/// One GET_BROKER_RUNTIME_INFO value of the shard `stream` is connected to.
pub fn runtime_info(stream: &mut TcpStream, key: &str) -> String {
    let reply = call(stream, rc::GET_BROKER_RUNTIME_INFO, &[], &[]);
    let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    value["table"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {value}"))
        .to_string()
}

/// SEND_MESSAGE_V2 of `body` to `queue` of `topic` with these user properties (and TAGS).
pub fn send_with(
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
            shardmq::body::find_property(m.properties, name)
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
