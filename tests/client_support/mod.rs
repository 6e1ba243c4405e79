//! Shared by the `client_*` tests: the real `shardmq` binary on free loopback ports, fast
//! client options (short rebalance, commit and hold intervals so each test takes seconds) and
//! helpers that collect consumed messages.

#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardmq::client::{ConsumeFromWhere, ConsumerOptions, ProducerOptions};

/// Shards per test node: two brokers, so routes span more than one broker.
pub const SHARDS: u16 = 2;

pub struct Node {
    child: Option<Child>,
    pub dir: PathBuf,
    pub namesrv_port: u16,
    pub broker_port: u16,
    /// `Some(namesrv)` for a broker-only node registering with another node's name server.
    joins: Option<(String, String)>,
    /// More command-line options for every start.
    extra_args: Vec<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A base port whose block (namesrv, broker ports of every shard and their VIP ports) is free
/// now; blocks differ per process and per call, so concurrent tests never share a port.
fn free_port_base() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT_BLOCK: AtomicU16 = AtomicU16::new(0);
    const BLOCK_PORTS: u16 = 40;
    const BLOCKS_PER_PROCESS: u16 = 16;
    let process_slot = (std::process::id() % 60) as u16;
    loop {
        let block = NEXT_BLOCK.fetch_add(1, Ordering::SeqCst);
        assert!(block < BLOCKS_PER_PROCESS, "no free port block");
        let base = 21_000 + (process_slot * BLOCKS_PER_PROCESS + block) * BLOCK_PORTS;
        let mut ports = vec![base];
        for shard in 0..SHARDS {
            let broker = base + 20 + 10 * shard;
            ports.extend([broker, broker - 2]);
        }
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return base;
        }
    }
}

impl Node {
    /// Starts `shardmq serve` with two shards on free ports and a fresh data directory.
    pub fn start() -> Node {
        Node::start_with(&[])
    }

    /// Like [`Node::start`], with more command-line options.
    pub fn start_with(extra_args: &[&str]) -> Node {
        let base = free_port_base();
        let dir =
            std::env::temp_dir().join(format!("shardmq-client-{}-{base}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut node = Node {
            child: None,
            dir,
            namesrv_port: base,
            broker_port: base + 20,
            joins: None,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        };
        node.spawn();
        node
    }

    /// A broker-only node (one shard named `<broker_name>-0`) registered with `namesrv`'s
    /// name server, so routes span two processes.
    pub fn start_broker_joining(namesrv: &Node, broker_name: &str) -> Node {
        let base = free_port_base();
        let dir =
            std::env::temp_dir().join(format!("shardmq-client-{}-{base}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut node = Node {
            child: None,
            dir,
            namesrv_port: namesrv.namesrv_port,
            broker_port: base + 20,
            joins: Some((namesrv.namesrv(), broker_name.to_string())),
            extra_args: Vec::new(),
        };
        node.spawn();
        node
    }

    /// Kills the process at once (SIGKILL): its clients see refused connections.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process; a start refused for its ports (the previous run's sockets may
    /// linger a moment after a restart) is tried again, then on fresh ports.
    fn spawn(&mut self) {
        const ATTEMPTS_ON_SAME_PORTS: usize = 20;
        for attempt in 0.. {
            match self.spawn_once() {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(output) => {
                    assert!(
                        attempt < ATTEMPTS_ON_SAME_PORTS + 5,
                        "shardmq never started: {output}"
                    );
                    if attempt >= ATTEMPTS_ON_SAME_PORTS {
                        let base = free_port_base();
                        if self.joins.is_none() {
                            self.namesrv_port = base;
                        }
                        self.broker_port = base + 20;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }

    fn spawn_once(&self) -> Result<Child, String> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_shardmq"));
        // SAFETY: prctl only sets a flag on the child; it is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        match &self.joins {
            None => command
                .args(["serve", "--shards", &SHARDS.to_string()])
                .args(["--namesrv-port", &self.namesrv_port.to_string()]),
            Some((namesrv, broker_name)) => command
                .args(["broker", "--shards", "1", "--namesrv", namesrv])
                .args(["--broker-name", broker_name]),
        };
        let mut child = command
            .args(["--segment-size-mib", "16", "--no-pin", "--flush", "async"])
            .args(["--broker-port", &self.broker_port.to_string()])
            .args(&self.extra_args)
            .arg("--data-dir")
            .arg(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shardmq");
        match wait_for_line(&mut child, "shardmq: ready") {
            Ok(()) => Ok(child),
            Err(output) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(output)
            }
        }
    }

    /// Stops the node with SIGTERM (it flushes and writes offsets), then starts it again on the
    /// same ports and data.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.spawn();
    }

    pub fn namesrv(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    pub fn producer_options(&self, group: &str) -> ProducerOptions {
        ProducerOptions::new(group, &self.namesrv())
    }

    /// Consumer options scaled down for tests: rebalance every 500 ms, commit every 200 ms,
    /// pulls held 1 s, from the first offset.
    pub fn consumer_options(&self, group: &str) -> ConsumerOptions {
        let mut options = ConsumerOptions::new(group, &self.namesrv());
        options.consume_from_where = ConsumeFromWhere::FirstOffset;
        options.rebalance_interval = Duration::from_millis(500);
        options.persist_consumer_offset_interval = Duration::from_millis(200);
        options.broker_suspend_max_time = Duration::from_millis(1_000);
        options.pull_time_delay_when_exception = Duration::from_millis(200);
        options.lock_interval = Duration::from_millis(1_000);
        options.suspend_current_queue_time = Duration::from_millis(100);
        options.client.poll_name_server_interval = Duration::from_millis(1_000);
        options.client.heartbeat_interval = Duration::from_millis(1_000);
        options.offset_store_dir = self.dir.join("client-offsets");
        options
    }
}

/// Ok once `needle` is printed; Err(output) if the process ends first or 60 s pass.
fn wait_for_line(child: &mut Child, needle: &str) -> Result<(), String> {
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
            Ok(line) if line.contains(needle) => return Ok(()),
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => return Err(seen),
        }
    }
}

/// What listeners record: (consumer label, body text, queue, queue offset, reconsume times).
#[derive(Debug, Clone)]
pub struct Seen {
    pub consumer: String,
    pub body: String,
    pub broker_name: String,
    pub queue_id: u32,
    pub queue_offset: i64,
    pub reconsume_times: i32,
    pub topic: String,
    pub tags: Option<String>,
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

pub fn record(log: &Log, consumer: &str, message: &shardmq::client::MessageExt) {
    log.lock().unwrap().push(Seen {
        consumer: consumer.to_string(),
        body: String::from_utf8_lossy(message.body()).into_owned(),
        broker_name: message.broker_name.clone(),
        queue_id: message.queue_id,
        queue_offset: message.queue_offset,
        reconsume_times: message.reconsume_times,
        topic: message.topic().to_string(),
        tags: message.tags().map(str::to_string),
    });
}

/// Waits until `done(log)` holds, polling; panics with `what` after `timeout`.
pub async fn wait_until(log: &Log, timeout: Duration, what: &str, done: impl Fn(&[Seen]) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if done(&log.lock().unwrap()) {
            return;
        }
        if Instant::now() > deadline {
            let log = log.lock().unwrap();
            panic!("timed out waiting for {what}; {} messages seen", log.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Distinct bodies in the log.
pub fn distinct_bodies(log: &[Seen]) -> std::collections::BTreeSet<String> {
    log.iter().map(|seen| seen.body.clone()).collect()
}
