//! Helpers shared by the raw-frame tests on the real binary: start a node on free ports,
//! send request frames built by our codec, read the replies, look at the node's memory.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardmq::remoting::{decode_frame, request_code as rc, FrameEncoder};

/// A node started by `start_node`: killed and its data removed when dropped (unless
/// `keep_dir` was set, for restarts).
pub struct Node {
    pub child: Child,
    pub dir: std::path::PathBuf,
    pub namesrv_port: u16,
    pub broker_port: u16,
    pub keep_dir: bool,
    _ports: PortBlock,
}

impl Node {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Resident memory of the node, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    pub fn connect(&self) -> TcpStream {
        TcpStream::connect(("127.0.0.1", self.broker_port)).unwrap()
    }

    /// Kills the node with SIGKILL (a crash) and keeps its data for a restart.
    pub fn kill(mut self) -> std::path::PathBuf {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.keep_dir = true;
        self.dir.clone()
    }

    /// Stops the node with SIGTERM (an orderly shutdown) and waits for it.
    pub fn stop(mut self) -> std::path::PathBuf {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let _ = self.child.wait();
        self.keep_dir = true;
        self.dir.clone()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The binary, killed if this test's thread dies first (a killed test run leaves nothing).
pub fn shardmq() -> Command {
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

/// A block of ports held for one node: the lock file's flock keeps other test processes of
/// ours off it (released when the process dies), and every port was free when taken.
pub struct PortBlock {
    pub base: u16,
    _lock: std::fs::File,
}

/// Ports of a block: namesrv at base, shard i's broker at base + 20 + 10·i (and that − 2,
/// + 1), two shards.
const PORT_BLOCK_SIZE: u16 = 40;
/// Blocks are taken below the Linux ephemeral range, so client sockets never collide.
const PORT_BLOCKS_FIRST: u16 = 12_000;
const PORT_BLOCKS_COUNT: u16 = 500;

/// A free block of ports (see `PortBlock`).
pub fn free_port_block() -> PortBlock {
    let start = (std::process::id() % u32::from(PORT_BLOCKS_COUNT)) as u16;
    for step in 0..PORT_BLOCKS_COUNT {
        let block = (start + step * 7) % PORT_BLOCKS_COUNT;
        let base = PORT_BLOCKS_FIRST + block * PORT_BLOCK_SIZE;
        // Empty lock files, one per block, kept in one directory (never deleted: a deleted
        // lock file would let two processes hold "the same" lock on different files).
        let locks = std::env::temp_dir().join("shardmq-test-ports");
        let _ = std::fs::create_dir_all(&locks);
        let Ok(lock) = std::fs::File::create(locks.join(format!("{base}.lock"))) else {
            continue;
        };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let ports = [
            base,
            base + 18,
            base + 20,
            base + 21,
            base + 28,
            base + 30,
            base + 31,
        ];
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return PortBlock { base, _lock: lock };
        }
    }
    panic!("no free port block");
}

/// Starts `serve` with two shards, 16 MiB segments, SYNC flush and `extra` arguments, in a
/// fresh data dir (or `dir` when given, for restarts), and waits until it is ready.
pub fn start_node(extra: &[&str], dir: Option<std::path::PathBuf>) -> Node {
    let ports = free_port_block();
    let base = ports.base;
    // Named by a counter, not by the ports: a restarted node keeps its directory while its
    // old ports go to another test.
    static NEXT_DIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = dir.unwrap_or_else(|| {
        let number = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("shardmq-it-{}-{number}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        dir
    });
    let (namesrv_port, broker_port) = (base, base + 20);
    let mut child = shardmq()
        .args(["serve", "--shards", "2", "--no-pin"])
        .args(["--segment-size-mib", "16", "--flush", "sync"])
        .args(["--namesrv-port", &namesrv_port.to_string()])
        .args(["--broker-port", &broker_port.to_string()])
        .arg("--data-dir")
        .arg(&dir)
        .args(extra)
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
        keep_dir: false,
        _ports: ports,
    }
}

/// Waits (at most 60 s) for a line of the child's stdout containing `needle`; the rest of
/// its output keeps being drained in the background.
pub fn wait_for_line(child: &mut Child, needle: &str) {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // A send fails once nobody listens; keep draining so the child never blocks.
            let _ = lines_tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => panic!("no line with {needle:?} within 60 s; output so far:\n{seen}"),
        }
    }
}

/// One decoded frame.
#[derive(Debug)]
pub struct Reply {
    pub code: i32,
    pub opaque: i32,
    pub flag: i32,
    pub remark: Option<String>,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
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

/// Sends one request and reads the next frame.
pub fn call(stream: &mut TcpStream, code: i32, ext: &[(&str, &str)], body: &[u8]) -> Reply {
    stream
        .write_all(&request_frame(code, 7, ext, body))
        .unwrap();
    read_frame(stream, Duration::from_secs(20)).expect("a reply within 20 s")
}

/// Reads one frame; None when none came within `wait` or the connection has closed.
pub fn read_frame(stream: &mut TcpStream, wait: Duration) -> Option<Reply> {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buffer = Vec::new();
    // Frame by frame: read exactly the 4-byte length, then the rest.
    let mut length = [0u8; 4];
    match stream.read(&mut length[..1]) {
        Ok(0) => return None,
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return None
        }
        Err(e) => panic!("read failed: {e}"),
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.read_exact(&mut length[1..]).unwrap();
    let size = u32::from_be_bytes(length) as usize;
    buffer.extend_from_slice(&length);
    buffer.resize(4 + size, 0);
    stream.read_exact(&mut buffer[4..]).unwrap();
    let (command, _) = decode_frame(&buffer).unwrap().expect("a whole frame");
    Some(Reply {
        code: command.code,
        opaque: command.opaque,
        flag: command.flag,
        remark: command.remark.map(|r| r.into_owned()),
        ext: command
            .ext_fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        body: command.body.to_vec(),
    })
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
pub fn send(stream: &mut TcpStream, topic: &str, queue: &str, body: &[u8]) -> Reply {
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
    read_frame(stream, Duration::from_secs(20)).expect("a send reply within 20 s")
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

/// Polls `check` every 10 ms until it holds or `within` passes; true if it held.
pub fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
