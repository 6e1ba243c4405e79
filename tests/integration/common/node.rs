//! The real `shardmq` binary as the tests run it: free port blocks reserved across concurrent
//! test processes, data directories removed on drop, processes killed with the test, and a
//! [`Node`] (`serve`, or a broker joining another node's name server) that can be killed,
//! stopped and started again on the same ports and data.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Shards of a `serve` node: two brokers, so routes span more than one broker.
pub const SHARDS: u16 = 2;
/// The line a node prints once every shard is registered and clients may connect.
pub const READY_LINE: &str = "shardmq: ready";
/// Longest wait for a line of a starting process.
const START_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for an orderly (SIGTERM) stop before the process is killed.
const STOP_WAIT: Duration = Duration::from_secs(20);
/// Starts on the same ports tried before moving to fresh ones (a restarted node's old
/// sockets may linger a moment), and fresh-port starts tried after that.
const ATTEMPTS_ON_SAME_PORTS: usize = 20;
const ATTEMPTS_ON_FRESH_PORTS: usize = 5;
/// Pause between start attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

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

/// A free block of ports (see [`PortBlock`]).
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

/// A fresh directory under the temp dir (not created), removed with everything in it on drop.
pub struct DataDir(PathBuf);

impl DataDir {
    /// Named by a counter, not by ports: a node keeps its directory across restarts on
    /// other ports, and ports go back to other tests.
    pub fn fresh() -> DataDir {
        static NEXT_DIR: AtomicU32 = AtomicU32::new(0);
        let number = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
        let name = format!("shardmq-it-{}-{number}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        DataDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for DataDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for DataDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 60 s) for a line of the child's stdout containing `needle`; the rest of
/// its output keeps being drained in the background. Panics with the output seen otherwise.
pub fn wait_for_line(child: &mut Child, needle: &str) {
    if let Err(seen) = try_wait_for_line(child, needle) {
        panic!("no line with {needle:?} within 60 s; output so far:\n{seen}");
    }
}

/// The lines printed up to the first containing `needle` (included); Err(output so far) if
/// the process ends first or 60 s pass.
fn try_wait_for_line(child: &mut Child, needle: &str) -> Result<Vec<String>, String> {
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
    let deadline = Instant::now() + START_WAIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return Ok(seen);
                }
            }
            Err(_) => return Err(seen.join("\n")),
        }
    }
}

/// What a [`Node`] runs.
enum Role {
    /// `serve`: name server and [`SHARDS`] brokers in one process, unpinned, 16 MiB segments.
    Serve,
    /// `serve` with nothing but the ports, the data directory and the caller's options (a
    /// tuning profile chooses shards, pinning and sizes).
    ServeAsGiven,
    /// `broker` with one shard named `<broker_name>-0`, registered with `namesrv`.
    Joining {
        namesrv: String,
        broker_name: String,
    },
}

/// A node of the real binary on a free port block and its own data directory. Dropping it
/// kills the process and removes the data; [`Node::kill`], [`Node::stop`] and
/// [`Node::start_again`] restart it on the same ports and data.
pub struct Node {
    child: Option<Child>,
    pub dir: DataDir,
    pub namesrv_port: u16,
    pub broker_port: u16,
    role: Role,
    /// More command-line options for every start.
    extra_args: Vec<String>,
    ports: PortBlock,
    /// What the process printed up to its ready line (included), on its last start.
    pub startup: Vec<String>,
}

/// `serve` with SYNC flush (a send is acknowledged after its fdatasync) and `extra` options:
/// the node the raw-frame tests of durability, long polling and transactions use.
pub fn start_node(extra: &[&str]) -> Node {
    let mut args = vec!["--flush", "sync"];
    args.extend_from_slice(extra);
    Node::start_with(&args)
}

impl Node {
    /// `shardmq serve` with two shards (unpinned, 16 MiB segments, async flush) on free ports
    /// and a fresh data directory, once it is ready.
    pub fn start() -> Node {
        Node::start_with(&[])
    }

    /// Like [`Node::start`], with more command-line options.
    pub fn start_with(extra_args: &[&str]) -> Node {
        let ports = free_port_block();
        Node::launch(ports.base, Role::Serve, extra_args, ports)
    }

    /// `shardmq serve` with only the ports and data directory added to `args`: for tests of
    /// options that choose the shards, their pinning and sizes themselves (tuning profiles).
    pub fn serve_as_given(args: &[&str]) -> Node {
        let ports = free_port_block();
        Node::launch(ports.base, Role::ServeAsGiven, args, ports)
    }

    /// A broker-only node (one shard named `<broker_name>-0`) registered with `namesrv`'s
    /// name server, so routes span two processes.
    pub fn start_broker_joining(namesrv: &Node, broker_name: &str) -> Node {
        let role = Role::Joining {
            namesrv: namesrv.namesrv(),
            broker_name: broker_name.to_string(),
        };
        Node::launch(namesrv.namesrv_port, role, &[], free_port_block())
    }

    fn launch(namesrv_port: u16, role: Role, extra_args: &[&str], ports: PortBlock) -> Node {
        let mut node = Node {
            child: None,
            dir: DataDir::fresh(),
            namesrv_port,
            broker_port: ports.base + 20,
            role,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            ports,
            startup: Vec::new(),
        };
        node.start_again();
        node
    }

    /// Starts the process (again) on this node's data; a start refused for its ports (the
    /// previous run's sockets may linger a moment after a restart) is tried again, then on
    /// fresh ports.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the node is running");
        for attempt in 0.. {
            match self.spawn_once() {
                Ok((child, startup)) => {
                    self.child = Some(child);
                    self.startup = startup;
                    return;
                }
                Err(output) => {
                    assert!(
                        attempt < ATTEMPTS_ON_SAME_PORTS + ATTEMPTS_ON_FRESH_PORTS,
                        "shardmq never started: {output}"
                    );
                    if attempt >= ATTEMPTS_ON_SAME_PORTS {
                        self.ports = free_port_block();
                        if !matches!(self.role, Role::Joining { .. }) {
                            self.namesrv_port = self.ports.base;
                        }
                        self.broker_port = self.ports.base + 20;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    fn spawn_once(&self) -> Result<(Child, Vec<String>), String> {
        let mut command = shardmq();
        let namesrv_port = self.namesrv_port.to_string();
        match &self.role {
            Role::Serve => command
                .args(["serve", "--shards", &SHARDS.to_string()])
                .args(["--namesrv-port", &namesrv_port])
                .args(["--segment-size-mib", "16", "--no-pin"]),
            Role::ServeAsGiven => command.args(["serve", "--namesrv-port", &namesrv_port]),
            Role::Joining {
                namesrv,
                broker_name,
            } => command
                .args(["broker", "--shards", "1", "--namesrv", namesrv])
                .args(["--broker-name", broker_name])
                .args(["--segment-size-mib", "16", "--no-pin"]),
        };
        let mut child = command
            .args(["--broker-port", &self.broker_port.to_string()])
            .args(&self.extra_args)
            .arg("--data-dir")
            .arg(self.dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shardmq");
        match try_wait_for_line(&mut child, READY_LINE) {
            Ok(startup) => Ok((child, startup)),
            Err(output) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(output)
            }
        }
    }

    /// Kills the process at once (SIGKILL, a crash): its clients see refused connections.
    /// The data stays for [`Node::start_again`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process with SIGTERM (an orderly shutdown: it flushes and writes offsets)
    /// and waits for it (killing it after 20 s). The data stays for [`Node::start_again`].
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WAIT;
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Node::stop`], then [`Node::start_again`] on the same ports and data.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("the node is running").id() as i32
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

    /// Shard `shard`'s broker port.
    pub fn shard_port(&self, shard: u16) -> u16 {
        self.broker_port + 10 * shard
    }

    /// The name server's address, `127.0.0.1:port`.
    pub fn namesrv(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    /// Shard `shard`'s broker address, `127.0.0.1:port`.
    pub fn broker(&self, shard: u16) -> String {
        format!("127.0.0.1:{}", self.shard_port(shard))
    }

    /// A connection to shard 0's broker.
    pub fn connect(&self) -> std::net::TcpStream {
        std::net::TcpStream::connect(("127.0.0.1", self.broker_port)).unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The process goes before its data directory (a field, dropped after this).
        self.kill();
    }
}
