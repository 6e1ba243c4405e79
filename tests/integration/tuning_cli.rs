//! Tuning profiles and `shardmq tune` on the real binary: a profile's knobs reach the
//! running shards (their CPU affinity, their io_uring ring depth), a bad profile or flag is
//! refused naming the key, and `tune` inspects without changing anything.

use std::path::Path;
use std::process::Output;

use crate::common::{shardmq, DataDir, Node};

/// A fresh directory (created), removed with its contents on drop.
fn scratch_dir() -> DataDir {
    let dir = DataDir::fresh();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `serve` with `args` (a profile chooses shards, pinning and ring depth) and small segments.
fn start(args: &[&str]) -> Node {
    let mut args = args.to_vec();
    args.extend(["--segment-size-mib", "4"]);
    Node::serve_as_given(&args)
}

fn run(args: &[&str]) -> Output {
    shardmq().args(args).output().expect("run shardmq")
}

fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `Cpus_allowed_list` of each thread named `shard-N`.
fn shard_affinities(pid: i32) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let allowed = status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_default();
        let is_shard = comm
            .trim()
            .strip_prefix("shard-")
            .is_some_and(|id| id.bytes().all(|b| b.is_ascii_digit()));
        if is_shard {
            found.push((comm.trim().to_string(), allowed.trim().to_string()));
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Submission ring sizes (SqMask + 1) of every io_uring the process holds.
fn io_uring_depths(pid: i32) -> Vec<u64> {
    let mut depths = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        if !target.to_string_lossy().contains("io_uring") {
            continue;
        }
        let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
        let info = std::fs::read_to_string(info).unwrap_or_default();
        let mask = info
            .lines()
            .find_map(|line| line.strip_prefix("SqMask:"))
            .map(|mask| u64::from_str_radix(mask.trim().trim_start_matches("0x"), 16).unwrap());
        depths.extend(mask.map(|mask| mask + 1));
    }
    depths
}

fn write_profile(dir: &Path, text: &str) -> String {
    let path = dir.join("profile.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn serve_with_the_small_vm_profile_starts_or_names_the_missing_core() {
    if online_cpus() >= 2 {
        let node = start(&["--profile", "small-vm"]);
        assert!(
            node.startup
                .iter()
                .any(|line| line.contains("2 shard(s), profile small-vm")),
            "{:?}",
            node.startup
        );
        // small-vm floats its two shards over cores 0 and 1.
        let affinities = shard_affinities(node.pid());
        assert!(!affinities.is_empty());
        for (thread, allowed) in &affinities {
            assert_eq!(allowed, "0-1", "{thread}");
        }
        assert!(io_uring_depths(node.pid()).contains(&256));
    } else {
        let output = run(&[
            "serve",
            "--profile",
            "small-vm",
            "--data-dir",
            "/nonexistent",
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("shards.cpus: names CPU 1"), "{stderr}");
    }
}

#[test]
fn a_profile_file_sets_cores_and_ring_depth_of_the_running_shards() {
    let dir = scratch_dir();
    // With a second core, it is kept from shards and runs the shard's helper thread.
    let reserved = if online_cpus() >= 2 { "[1]" } else { "[]" };
    let profile = write_profile(
        &dir,
        &format!(
            "[shards]\ncpus = [0]\nreserved_cpus = {reserved}\npin = true\n\
             [runtime]\nring_depth_entries = 64\n"
        ),
    );
    let node = start(&["--profile", &profile]);
    // One shard: its executor thread pinned to CPU 0, and glommio's helper thread of the
    // same name on the reserved core.
    let affinities = shard_affinities(node.pid());
    let shard = |allowed: &str| ("shard-0".to_string(), allowed.to_string());
    assert!(affinities.contains(&shard("0")), "{affinities:?}");
    if reserved == "[1]" {
        assert!(affinities.contains(&shard("1")), "{affinities:?}");
    }
    assert!(affinities.iter().all(|(thread, _)| thread == "shard-0"));
    // glommio's three rings take the profile's depth; the rings of the runtime's own (the
    // commitlog's, 64 entries, and the one that watches the client sockets) have fixed sizes.
    let depths = io_uring_depths(node.pid());
    let watching = u64::from(shards::runtime::sockets::WATCH_RING_ENTRIES);
    let profiled: Vec<u64> = depths.into_iter().filter(|&d| d != watching).collect();
    assert!(
        profiled.len() >= 3 && profiled.iter().all(|&depth| depth == 64),
        "{profiled:?}"
    );
}

#[test]
fn bad_profiles_and_flags_are_refused_naming_the_key() {
    let dir = scratch_dir();
    let cases = [
        (
            "[shards]\ncpus = [0, 4096]\n",
            "shards.cpus: names CPU 4096, which is not online",
        ),
        (
            "[store]\nflush_interval_ms = 0\n",
            "store.flush_interval_ms: 0 is out of bounds: want [ms; 1..=60000]",
        ),
        (
            "[runtime]\nring_depth_entries = 100\n",
            "runtime.ring_depth_entries: 100 is out of bounds",
        ),
        (
            "[network]\nread_buffer = 5\n",
            "network.read_buffer: unknown field",
        ),
    ];
    for (text, expected) in cases {
        let profile = write_profile(&dir, text);
        let output = run(&["serve", "--profile", &profile, "--data-dir", "/nonexistent"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{text}: {stderr}");
        assert!(stderr.contains(expected), "{text}: {stderr}");
        assert!(!stderr.contains("backtrace"), "{stderr}");
    }
    let output = run(&[
        "serve",
        "--segment-size-mib",
        "0",
        "--data-dir",
        "/nonexistent",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--segment-size-mib (store.segment_size_mib): 0 is out of bounds"),
        "{stderr}"
    );
    let output = run(&["serve", "--profile", "no-such-profile"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a built-in profile"));
    assert!(!Path::new("/nonexistent").exists());
}

#[test]
fn tune_inspects_the_host_and_applies_nothing() {
    let dir = scratch_dir();
    let output = run(&["tune", "--data-dir", &dir.to_string_lossy()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for area in [
        "io_uring:",
        "locked memory:",
        "cpus:",
        "cpu governor:",
        "interrupts:",
        "transparent huge pages:",
        "listen backlog:",
        "tcp congestion control:",
    ] {
        assert!(stdout.contains(area), "no {area} in {stdout}");
    }
    assert!(stdout.contains("nothing applied"), "{stdout}");
}
