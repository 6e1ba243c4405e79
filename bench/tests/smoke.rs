//! CI smoke test: the real `shardmq-bench` against the real `shardmq` binary on loopback, a
//! couple of seconds per mode; each run must write a report with non-zero counts (and the
//! counts must agree: a catch-up receives exactly what was produced, an end-to-end run
//! receives every message it sent). Figures are not judged here: they come from real runs.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the node may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Message body size used throughout.
const MESSAGE_SIZE_BYTES: u64 = 200;

/// The broker binary, built beside this package's binary by `cargo test --workspace`.
fn shardmq_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_shardmq-bench"));
    let binary = bench.with_file_name("shardmq");
    assert!(
        binary.exists(),
        "{} is missing: build it first (cargo build --release -p shardmq)",
        binary.display()
    );
    binary
}

/// A command killed if the test process dies first.
fn command(program: &Path) -> Command {
    let mut command = Command::new(program);
    // SAFETY: prctl only sets a flag on the child; it is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
}

struct Node {
    child: Child,
    dir: PathBuf,
    namesrv: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The port blocks, just below Linux's ephemeral range (32768-60999): a client's port there,
/// live or in TIME_WAIT, would keep a node off its port (a run after a connection churn found
/// every block it tried taken when they lay at 40,000 and up). The integration tests and the
/// end-to-end suite use ports below these, and never run beside them.
const PORT_BLOCKS_FIRST: u16 = 32_000;
const PORT_BLOCK_SIZE: u16 = 22;
const PORT_BLOCKS: u16 = 34;
const _: () = assert!(PORT_BLOCKS_FIRST + PORT_BLOCKS * PORT_BLOCK_SIZE <= 32_768);

/// A namesrv port whose block (namesrv, 2 shards × 3 ports) is free right now.
fn free_ports() -> (u16, u16) {
    // Tests run in parallel: each call starts from a block of its own.
    static CALLS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let first = CALLS.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    let process_slot = (std::process::id() % u32::from(PORT_BLOCKS)) as u16;
    for block in first..first + 8 {
        let base = PORT_BLOCKS_FIRST + (process_slot + block) % PORT_BLOCKS * PORT_BLOCK_SIZE;
        // The namesrv, and per shard its broker, VIP (broker - 2) and HA (broker + 1) ports.
        let ports = [
            base,
            base + 8,
            base + 10,
            base + 11,
            base + 18,
            base + 20,
            base + 21,
        ];
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return (base, base + 10);
        }
    }
    panic!("no free port block");
}

fn start_node(name: &str) -> Node {
    start_node_with(name, &[])
}

/// `serve` with two floating shards, small segments and `extra` options.
fn start_node_with(name: &str, extra: &[&str]) -> Node {
    let mut serve = vec![
        "serve",
        "--shards",
        "2",
        "--no-pin",
        "--segment-size-mib",
        "16",
    ];
    serve.extend_from_slice(extra);
    start_server(&shardmq_binary(), name, &serve, "shardmq: ready")
}

/// Starts `program args` with free namesrv and broker ports and a data dir of its own; waits
/// for a line containing `ready`.
fn start_server(program: &Path, name: &str, args: &[&str], ready: &str) -> Node {
    let dir =
        std::env::temp_dir().join(format!("shardmq-bench-smoke-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A port found free can be taken before the server binds it (any outgoing connection of
    // the parallel tests may get it as its ephemeral port): a server that exits before it is
    // ready is started again on other ports, up to STARTS times.
    const STARTS: usize = 5;
    let mut attempt = 0;
    let (namesrv_port, child, lines) = loop {
        attempt += 1;
        let (namesrv_port, broker_port) = free_ports();
        let mut child = command(program)
            .args(args)
            .args(["--namesrv-port", &namesrv_port.to_string()])
            .args(["--broker-port", &broker_port.to_string()])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", program.display()));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + READY_TIMEOUT;
        let ready_now = loop {
            assert!(Instant::now() < deadline, "{name} never got ready");
            match lines.next() {
                Some(line) => {
                    if line.unwrap().contains(ready) {
                        break true;
                    }
                }
                None => break false,
            }
        };
        if ready_now {
            break (namesrv_port, child, lines);
        }
        let _ = child.wait();
        assert!(
            attempt < STARTS,
            "{name} exited before it was ready, {STARTS} times"
        );
        eprintln!("{name} exited before it was ready (a port taken meanwhile?); starting it again");
    };
    std::thread::spawn(move || lines.for_each(drop));
    Node {
        child,
        dir,
        namesrv: format!("127.0.0.1:{namesrv_port}"),
    }
}

/// Runs the bench with `args`; returns its JSON report.
fn bench(node: &Node, name: &str, args: &[&str]) -> Value {
    let report = node.dir.join(format!("{name}.json"));
    let output = command(Path::new(env!("CARGO_BIN_EXE_shardmq-bench")))
        .args(args)
        .args(["--namesrv", &node.namesrv, "--no-progress", "--report"])
        .arg(&report)
        .output()
        .expect("run shardmq-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name}: {args:?} failed\n{stdout}\n{stderr}"
    );
    let svg = std::fs::read_to_string(report.with_extension("svg")).expect("a plot");
    assert!(svg.starts_with("<svg"), "{name}: plot");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("a report")).unwrap();
    if args.contains(&"--duration-secs") {
        // A timed run has whole seconds to plot.
        assert!(svg.contains("<polyline"), "{name}: plot without lines");
        assert!(!report["intervals"].as_array().unwrap().is_empty());
    }
    report
}

fn count(report: &Value, path: &[&str]) -> u64 {
    let mut value = report;
    for key in path {
        value = &value[*key];
    }
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} in {report}"))
}

#[test]
fn every_mode_reports_real_counts() {
    let node = start_node("modes");
    let size = MESSAGE_SIZE_BYTES.to_string();

    // Producer, closed loop, for two seconds.
    let report = bench(
        &node,
        "producer",
        &[
            "producer",
            "--topic",
            "SmokeP",
            "--duration-secs",
            "2",
            "--message-size",
            &size,
        ],
    );
    assert_eq!(report["mode"], "producer");
    assert!(count(&report, &["producer", "sent"]) > 0);
    assert_eq!(count(&report, &["producer", "send_failed"]), 0);
    assert!(count(&report, &["producer", "latency_us", "count"]) > 0);
    assert!(!report["intervals"].as_array().unwrap().is_empty());

    // A counted batch load with keys, then a catch-up that must read exactly that back.
    let produced = 3_000;
    let report = bench(
        &node,
        "batches",
        &[
            "producer",
            "--topic",
            "SmokeC",
            "--queues",
            "2",
            "--messages",
            "3000",
            "--batch",
            "8",
            "--keys",
            "--message-size",
            &size,
        ],
    );
    assert_eq!(count(&report, &["producer", "sent"]), produced);
    assert_eq!(count(&report, &["producer", "requests"]), produced / 8);
    let report = bench(
        &node,
        "consumer",
        &["consumer", "--topic", "SmokeC", "--catch-up"],
    );
    assert_eq!(report["mode"], "consumer");
    assert_eq!(count(&report, &["consumer", "consumed"]), produced);
    assert_eq!(
        count(&report, &["consumer", "body_bytes"]),
        produced * MESSAGE_SIZE_BYTES
    );
    assert_eq!(count(&report, &["consumer", "malformed_bodies"]), 0);
    // The same over two threads (a connection to each shard each): the same count, once.
    let report = bench(
        &node,
        "consumer-threads",
        &[
            "consumer",
            "--topic",
            "SmokeC",
            "--catch-up",
            "--consumer-threads",
            "2",
        ],
    );
    assert_eq!(count(&report, &["consumer", "consumed"]), produced);
    assert_eq!(report["config"]["threads"], 2);

    // End to end, open loop, for two seconds.
    let report = bench(
        &node,
        "e2e",
        &[
            "e2e",
            "--topic",
            "SmokeE",
            "--rate",
            "2000",
            "--duration-secs",
            "2",
            "--message-size",
            &size,
        ],
    );
    assert_eq!(report["mode"], "e2e");
    let sent = count(&report, &["producer", "sent"]);
    assert!(sent > 0);
    assert_eq!(count(&report, &["consumer", "consumed"]), sent);
    assert_eq!(
        count(&report, &["consumer", "end_to_end_latency_us", "count"]),
        sent
    );
}

#[test]
fn groups_and_topics_each_get_every_message() {
    let node = start_node("groups");
    let report = bench(
        &node,
        "e2e-groups",
        &[
            "e2e",
            "--topic",
            "SmokeG",
            "--topics",
            "2",
            "--queues",
            "2",
            "--groups",
            "3",
            "--consumer-threads",
            "4",
            "--rate",
            "1000",
            "--duration-secs",
            "2",
        ],
    );
    let sent = count(&report, &["producer", "sent"]);
    assert!(sent > 0);
    assert_eq!(
        count(&report, &["consumer", "consumed"]),
        3 * sent,
        "each of 3 groups receives every message of both topics, over 4 threads"
    );
}

/// `shardmq-bench limit` (the bare-core server) serves the producer: every send of a counted
/// run, single and batched, is acknowledged.
#[test]
fn limit_server_acknowledges_every_send() {
    let limit = ["limit", "--cpus", "0", "--ring-mib", "64"];
    let program = Path::new(env!("CARGO_BIN_EXE_shardmq-bench"));
    let node = start_server(program, "limit", &limit, "shard 0 ready");
    for (name, batch) in [("limit-single", "1"), ("limit-batch", "8")] {
        let report = bench(
            &node,
            name,
            &[
                "producer",
                "--topic",
                "SmokeL",
                "--queues",
                "2",
                "--messages",
                "4000",
                "--batch",
                batch,
            ],
        );
        assert_eq!(count(&report, &["producer", "sent"]), 4000, "{name}");
        assert_eq!(count(&report, &["producer", "send_failed"]), 0, "{name}");
    }
    let log = node.dir.join("data").join("limit-0.log");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 64 << 20, "the ring");
}

#[test]
fn out_of_bounds_options_are_refused_before_connecting() {
    let output = command(Path::new(env!("CARGO_BIN_EXE_shardmq-bench")))
        .args(["producer", "--rate", "0", "--namesrv", "127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("--rate must be"), "{stderr}");
    let output = command(Path::new(env!("CARGO_BIN_EXE_shardmq-bench")))
        .args([
            "consumer",
            "--consumer-threads",
            "0",
            "--namesrv",
            "127.0.0.1:1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("--consumer-threads must be"), "{stderr}");
}

#[test]
fn producer_and_consumer_sign_and_speak_tls() {
    // A node that refuses plaintext and unsigned requests: every load connection must do both.
    let dir = std::env::temp_dir().join(format!("shardmq-bench-smoke-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let acl = dir.join("plain_acl.yml");
    std::fs::write(
        &acl,
        "accounts:\n  - accessKey: smoke-admin\n    secretKey: smoke-secret\n    admin: true\n",
    )
    .unwrap();
    let secure_node = [
        "--tls-server-mode",
        "enforcing",
        "--acl-file",
        acl.to_str().unwrap(),
    ];
    let node = start_node_with("secure", &secure_node);
    let secure = [
        "--tls",
        "--access-key",
        "smoke-admin",
        "--secret-key",
        "smoke-secret",
    ];
    let with = |args: &[&'static str]| -> Vec<&'static str> {
        let mut all = args.to_vec();
        all.extend_from_slice(&secure);
        all
    };
    let report = bench(
        &node,
        "secure-producer",
        &with(&[
            "producer",
            "--topic",
            "SmokeS",
            "--queues",
            "2",
            "--messages",
            "500",
        ]),
    );
    assert_eq!(count(&report, &["producer", "sent"]), 500);
    assert_eq!(count(&report, &["producer", "send_failed"]), 0);
    let report = bench(
        &node,
        "secure-consumer",
        &with(&["consumer", "--topic", "SmokeS", "--catch-up"]),
    );
    assert_eq!(count(&report, &["consumer", "consumed"]), 500);
    let _ = std::fs::remove_dir_all(&dir);
}
