//! `shardmq tune`: looks at the host a profile is about to run on and says what it would
//! change and why; it changes nothing unless asked (`--apply`), and then only kernel settings
//! that are safe to flip on a running host and are undone by a reboot (a CPU governor,
//! transparent huge pages, a disk scheduler, interrupt affinity, the listen backlog cap).
//! Security and durability switches (io_uring enablement, memlock limits, a disk's write
//! cache) are only ever advised.
//!
//! What is read, all under one root (`/` on a real host, a fake tree in tests):
//!
//! | check | source |
//! |---|---|
//! | io_uring enabled | `proc/sys/kernel/io_uring_disabled`, and a test ring on a real host |
//! | locked memory | RLIMIT_MEMLOCK of this process against the profile's DMA memory |
//! | CPUs | `sys/devices/system/cpu/online`, `proc/cmdline` (isolcpus) |
//! | CPU governor | `sys/devices/system/cpu/cpuN/cpufreq/scaling_governor` of the shard cores |
//! | interrupt spread | `proc/interrupts`; `proc/irq/N/smp_affinity_list` to move them |
//! | transparent huge pages | `sys/kernel/mm/transparent_hugepage/enabled` |
//! | disk of the data dir | `sys/dev/block/MAJ:MIN` → `queue/{scheduler,rotational,write_cache}` |
//! | listen backlog cap | `proc/sys/net/core/somaxconn` |
//! | memory maps | `proc/sys/vm/max_map_count` (one per consume queue holding units) |

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use super::{cpu_list_text, Tuning};

/// Backlog shardmq asks for on each listener (the runtime's listen(2) argument).
const LISTEN_BACKLOG_CONNECTIONS: u64 = shards::runtime::LISTEN_BACKLOG_CONNECTIONS as u64;
/// Device interrupts named per finding, busiest first.
const IRQS_LISTED_MAX: usize = 5;
/// Largest /proc or /sys file read (proc/interrupts on a big host is tens of KiB).
const HOST_FILE_SIZE_MAX_BYTES: usize = 4 << 20;

/// Where the host's /proc and /sys are: `/`, or a fake tree for tests.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
}

impl Host {
    /// The machine this process runs on.
    pub fn real() -> Host {
        Host { root: "/".into() }
    }

    /// A tree laid out like `/` (tests).
    pub fn at(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    fn is_real(&self) -> bool {
        self.root == Path::new("/")
    }

    /// `relative` (written without a leading slash) under the root.
    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative)
    }

    fn read(&self, relative: &str) -> Option<String> {
        read_small(&self.path(relative))
    }
}

fn read_small(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    (text.len() <= HOST_FILE_SIZE_MAX_BYTES).then(|| text.trim_end().to_string())
}

/// How a finding reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to change.
    Ok,
    /// Worth knowing; nothing to change, or nothing safe to change.
    Info,
    /// `--apply` would write `writes`.
    Change,
    /// Needs the operator (a security, limits or durability decision): `how` says what to do.
    Manual,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "[ok]    ",
            Verdict::Info => "[info]  ",
            Verdict::Change => "[change]",
            Verdict::Manual => "[manual]",
        }
    }
}

/// One file write `--apply` would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Path as on the real host (`/sys/...`).
    pub path: String,
    pub value: String,
}

/// One thing looked at.
#[derive(Debug, Clone)]
pub struct Finding {
    pub verdict: Verdict,
    pub area: &'static str,
    /// What was seen (and, for a change, what it would become).
    pub summary: String,
    pub why: Option<String>,
    /// For Manual (and Change, as the shell equivalent): what to run.
    pub how: Option<String>,
    pub writes: Vec<Write>,
}

impl Finding {
    fn new(verdict: Verdict, area: &'static str, summary: String) -> Finding {
        Finding {
            verdict,
            area,
            summary,
            why: None,
            how: None,
            writes: Vec::new(),
        }
    }

    fn why(mut self, why: impl Into<String>) -> Finding {
        self.why = Some(why.into());
        self
    }

    fn how(mut self, how: impl Into<String>) -> Finding {
        self.how = Some(how.into());
        self
    }

    fn writes(mut self, writes: Vec<Write>) -> Finding {
        let commands: Vec<String> = writes
            .iter()
            .map(|write| format!("echo '{}' > {}", write.value, write.path))
            .collect();
        self.how = Some(commands.join("; "));
        self.writes = writes;
        self
    }
}

/// Facts about this process that a fake tree cannot hold.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFacts {
    pub is_root: bool,
    /// Soft RLIMIT_MEMLOCK in bytes (u64::MAX: unlimited).
    pub memlock_limit_bytes: u64,
}

impl ProcessFacts {
    pub fn of_this_process() -> ProcessFacts {
        ProcessFacts {
            is_root: shards::runtime::is_root(),
            memlock_limit_bytes: shards::runtime::memlock_limit_bytes(),
        }
    }
}

/// Every check, in the order printed.
pub fn inspect(host: &Host, facts: ProcessFacts, tuning: &Tuning, data_dir: &Path) -> Vec<Finding> {
    let mut findings = vec![check_io_uring(host, facts.is_root)];
    findings.push(check_memlock(facts, tuning));
    findings.push(check_read_cache(tuning));
    findings.push(check_cpus(host, tuning));
    findings.push(check_governor(host, tuning));
    findings.extend(check_interrupts(host, tuning));
    findings.push(check_transparent_huge_pages(host));
    findings.extend(check_disk(host, data_dir));
    findings.push(check_listen_backlog(host));
    findings.push(check_congestion_control(host));
    findings.push(check_map_count(host));
    findings
}

fn check_io_uring(host: &Host, is_root: bool) -> Finding {
    let area = "io_uring";
    let probe = if host.is_real() {
        match probe_io_uring() {
            Ok(()) => "; a test ring was set up".to_string(),
            Err(error) => format!("; setting up a test ring failed: {error}"),
        }
    } else {
        String::new()
    };
    // Where io_uring is allowed, the test ring decides whether it really works here.
    let allowed_verdict = if probe.contains("failed") {
        Verdict::Manual
    } else {
        Verdict::Ok
    };
    match host.read("proc/sys/kernel/io_uring_disabled").as_deref() {
        Some("2") => Finding::new(
            Verdict::Manual,
            area,
            format!("disabled (kernel.io_uring_disabled = 2){probe}"),
        )
        .why("shardmq's shards do all their disk and network I/O through io_uring")
        .how("sysctl -w kernel.io_uring_disabled=0 (a security policy: not applied by --apply)"),
        Some("1") if !is_root => Finding::new(
            Verdict::Manual,
            area,
            format!("restricted to root and kernel.io_uring_group (= 1){probe}"),
        )
        .why("this user is not root; shardmq needs io_uring")
        .how("add the user to the group in kernel.io_uring_group, or sysctl -w kernel.io_uring_disabled=0"),
        Some(value) => Finding::new(
            allowed_verdict,
            area,
            format!("enabled (kernel.io_uring_disabled = {value}){probe}"),
        )
        .how_if(
            allowed_verdict == Verdict::Manual,
            "a container's seccomp profile can block io_uring: allow io_uring_setup, \
             io_uring_enter and io_uring_register",
        ),
        None => Finding::new(
            allowed_verdict,
            area,
            format!("no kernel.io_uring_disabled switch (kernel before 6.6){probe}"),
        ),
    }
}

impl Finding {
    fn how_if(self, condition: bool, how: &str) -> Finding {
        if condition {
            self.how(how)
        } else {
            self
        }
    }
}

/// Sets up and closes a two-entry ring: the one sure test that io_uring works here.
fn probe_io_uring() -> io::Result<()> {
    /// `struct io_uring_params` is 120 bytes; zeroed asks for nothing special.
    const PARAMS_WORDS: usize = 30;
    let mut params = [0u32; PARAMS_WORDS];
    // SAFETY: io_uring_setup writes at most sizeof(io_uring_params) = 120 bytes into params.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned to us and is closed once.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

fn check_memlock(facts: ProcessFacts, tuning: &Tuning) -> Finding {
    let area = "locked memory";
    let shards = tuning.placement.cpus.len() as u64;
    let needed = tuning.placement.io_memory_bytes as u64 * shards;
    let needed_text = format!(
        "{shards} shard(s) x {} MiB of io_uring DMA memory = {} MiB",
        tuning.placement.io_memory_bytes >> 20,
        needed >> 20
    );
    let limit = facts.memlock_limit_bytes;
    let limit_text = if limit == u64::MAX {
        "unlimited".to_string()
    } else {
        format!("{} KiB", limit / 1024)
    };
    if facts.is_root {
        return Finding::new(
            Verdict::Ok,
            area,
            format!("RLIMIT_MEMLOCK {limit_text}, not binding for root; {needed_text}"),
        );
    }
    if limit >= needed {
        return Finding::new(
            Verdict::Ok,
            area,
            format!("RLIMIT_MEMLOCK {limit_text} covers {needed_text}"),
        );
    }
    Finding::new(
        Verdict::Manual,
        area,
        format!("RLIMIT_MEMLOCK {limit_text} is below {needed_text}"),
    )
    .why("shardmq serve refuses to start: glommio locks its DMA buffers")
    .how(
        "ulimit -l unlimited before starting, LimitMEMLOCK=infinity in a systemd unit, \
         --ulimit memlock=-1 for docker run; or lower runtime.io_memory_mib",
    )
}

/// io_uring memory a shard needs beside the read cache's windows (its other DMA buffers), as
/// the profiles' comments say: keep `runtime.io_memory_mib` this far above
/// `store.read_cache_mib`.
const IO_MEMORY_BESIDE_READ_CACHE_MIB: u64 = 8;

/// Whether the read cache's windows fit in the io_uring memory each shard registers: those
/// past it are heap pages, faulted in and cleared at every window read.
fn check_read_cache(tuning: &Tuning) -> Finding {
    let area = "read cache";
    // One window is 1 MiB.
    let windows_mib = tuning.read_cache_windows as u64;
    let io_mib = (tuning.placement.io_memory_bytes >> 20) as u64;
    let summary = format!(
        "{windows_mib} windows of 1 MiB a shard (store.read_cache_mib) in {io_mib} MiB of \
         io_uring memory (runtime.io_memory_mib)"
    );
    let wanted_mib = windows_mib + IO_MEMORY_BESIDE_READ_CACHE_MIB;
    if io_mib >= wanted_mib {
        return Finding::new(Verdict::Ok, area, summary);
    }
    let in_io = io_mib
        .saturating_sub(IO_MEMORY_BESIDE_READ_CACHE_MIB)
        .min(windows_mib);
    Finding::new(Verdict::Info, area, summary)
        .why(format!(
            "about {} of the {windows_mib} windows live in heap pages (the io_uring memory \
             holds {in_io} beside its other buffers), faulted in and cleared at every window \
             read while consumers read from disk (up to a quarter of the broker's CPU a message \
             with 16 lagging groups)",
            windows_mib - in_io
        ))
        .how(format!(
            "runtime.io_memory_mib = {wanted_mib} in the profile, where RLIMIT_MEMLOCK allows \
             it (see locked memory); a small VM may keep it lower on purpose"
        ))
}

fn check_cpus(host: &Host, tuning: &Tuning) -> Finding {
    let online = host
        .read("sys/devices/system/cpu/online")
        .map(|text| parse_cpu_list(&text))
        .unwrap_or_default();
    let placement = &tuning.placement;
    let (shard_cpus, how_placed) = match placement.cpus.iter().all(Option::is_some) {
        true => (placement.cpus.iter().flatten().copied().collect(), "pinned"),
        false => (placement.float_cpus.clone(), "floating"),
    };
    let isolated = host
        .read("proc/cmdline")
        .and_then(|cmdline| {
            cmdline
                .split_whitespace()
                .find_map(|word| word.strip_prefix("isolcpus=").map(str::to_string))
        })
        .unwrap_or_else(|| "none".into());
    let summary = format!(
        "{} online ({}); profile {}: {} shard(s) {how_placed} on {}; reserved {}; \
         isolcpus {isolated}",
        online.len(),
        cpu_list_text(&online),
        tuning.source,
        placement.cpus.len(),
        cpu_list_text(&shard_cpus),
        cpu_list_text(&tuning.reserved_cpus),
    );
    let finding = Finding::new(Verdict::Info, "cpus", summary);
    if !tuning.reserved_cpus.is_empty() && isolated == "none" {
        return finding.why(
            "the scheduler may still put other threads on shard cores; booting with \
             isolcpus= or nohz_full= on the shard cores keeps them away (a boot setting: \
             not applied)",
        );
    }
    finding
}

/// The cores whose settings matter: where shards run (pinned) or may run (floating).
fn shard_cores(tuning: &Tuning) -> Vec<usize> {
    let mut cores: Vec<usize> = tuning.placement.cpus.iter().flatten().copied().collect();
    cores.extend(&tuning.placement.float_cpus);
    cores.sort_unstable();
    cores.dedup();
    cores
}

fn check_governor(host: &Host, tuning: &Tuning) -> Finding {
    let area = "cpu governor";
    let mut seen = Vec::new();
    let mut writes = Vec::new();
    for cpu in shard_cores(tuning) {
        let relative = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor");
        let Some(governor) = host.read(&relative) else {
            continue;
        };
        let available = host
            .read(&format!(
                "sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_available_governors"
            ))
            .unwrap_or_default();
        if governor != "performance" && available.split_whitespace().any(|g| g == "performance") {
            writes.push(Write {
                path: format!("/{relative}"),
                value: "performance".into(),
            });
        }
        seen.push(format!("cpu{cpu} {governor}"));
    }
    if seen.is_empty() {
        return Finding::new(
            Verdict::Info,
            area,
            "no cpufreq on the shard cores (a VM, or a fixed clock): nothing to change".into(),
        );
    }
    if writes.is_empty() {
        return Finding::new(Verdict::Ok, area, seen.join(", "));
    }
    Finding::new(
        Verdict::Change,
        area,
        format!(
            "{} -> performance on {} core(s)",
            seen.join(", "),
            writes.len()
        ),
    )
    .why(
        "a power-saving governor clocks an idle shard core down, and the next burst of \
         requests runs on a slow core until it clocks up again",
    )
    .writes(writes)
}

/// One line of /proc/interrupts for a device (numbered) interrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIrq {
    pub irq: u32,
    /// Interrupts served so far, by CPU id.
    pub per_cpu: Vec<(usize, u64)>,
    /// The device's name (the last word of the line).
    pub name: String,
}

impl DeviceIrq {
    fn total(&self) -> u64 {
        self.per_cpu.iter().map(|(_, count)| count).sum()
    }
}

/// The numbered (device) interrupts of /proc/interrupts; the named ones (LOC, RES, ...) are
/// per-CPU by nature and left out.
pub fn parse_interrupts(text: &str) -> Vec<DeviceIrq> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cpus: Vec<usize> = header
        .split_whitespace()
        .filter_map(|column| column.strip_prefix("CPU")?.parse().ok())
        .collect();
    let mut irqs = Vec::new();
    for line in lines {
        let Some((label, rest)) = line.split_once(':') else {
            continue;
        };
        let Ok(irq) = label.trim().parse::<u32>() else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let per_cpu: Vec<(usize, u64)> = cpus
            .iter()
            .map_while(|&cpu| Some((cpu, words.next()?.parse().ok()?)))
            .collect();
        let name = words.last().unwrap_or_default().to_string();
        irqs.push(DeviceIrq { irq, per_cpu, name });
    }
    irqs
}

fn check_interrupts(host: &Host, tuning: &Tuning) -> Vec<Finding> {
    let area = "interrupts";
    let Some(text) = host.read("proc/interrupts") else {
        return vec![Finding::new(
            Verdict::Info,
            area,
            "proc/interrupts unreadable".into(),
        )];
    };
    let mut irqs: Vec<DeviceIrq> = parse_interrupts(&text)
        .into_iter()
        .filter(|irq| irq.total() > 0)
        .collect();
    irqs.sort_by_key(|irq| std::cmp::Reverse(irq.total()));
    let shard_cores = shard_cores(tuning);
    let on_shard_cores = |irq: &DeviceIrq| -> u64 {
        irq.per_cpu
            .iter()
            .filter(|(cpu, _)| shard_cores.contains(cpu))
            .map(|(_, count)| count)
            .sum()
    };
    let describe = |irq: &DeviceIrq| {
        let spread: Vec<String> = irq
            .per_cpu
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(cpu, count)| format!("cpu{cpu} {count}"))
            .collect();
        format!("{} (irq {}: {})", irq.name, irq.irq, spread.join(", "))
    };
    let busiest: Vec<String> = irqs.iter().take(IRQS_LISTED_MAX).map(describe).collect();
    let total: u64 = irqs.iter().map(DeviceIrq::total).sum();
    let on_shards: u64 = irqs.iter().map(on_shard_cores).sum();
    let summary = format!(
        "{on_shards} of {total} device interrupts so far landed on shard cores; busiest: {}",
        busiest.join("; ")
    );
    if tuning.reserved_cpus.is_empty() || on_shards == 0 {
        let finding = Finding::new(Verdict::Info, area, summary);
        return vec![if on_shards > 0 {
            finding.why(
                "every core runs a shard, so device interrupts share cores with shards; a \
                 profile with shards.reserved_cpus (dedicated-16) lets tune move them off",
            )
        } else {
            finding
        }];
    }
    let target = cpu_list_text(&tuning.reserved_cpus);
    let writes: Vec<Write> = irqs
        .iter()
        .filter(|irq| on_shard_cores(irq) > 0)
        .map(|irq| Write {
            path: format!("/proc/irq/{}/smp_affinity_list", irq.irq),
            value: target.clone(),
        })
        .collect();
    let mut findings = vec![Finding::new(
        Verdict::Change,
        area,
        format!(
            "{summary}; would move {} interrupt(s) to the reserved cores {target}",
            writes.len()
        ),
    )
    .why("an interrupt on a shard core preempts the shard mid-request and adds latency")
    .writes(writes)];
    if irqbalance_running(host) {
        findings.push(
            Finding::new(Verdict::Manual, area, "irqbalance is running".into())
                .why("irqbalance moves interrupts back onto the shard cores")
                .how(format!(
                    "set IRQBALANCE_BANNED_CPULIST={} in irqbalance's config and restart it, \
                     or stop irqbalance",
                    cpu_list_text(&shard_cores)
                )),
        );
    }
    findings
}

fn irqbalance_running(host: &Host) -> bool {
    let Ok(entries) = std::fs::read_dir(host.path("proc")) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit());
        is_pid && read_small(&entry.path().join("comm")).as_deref() == Some("irqbalance")
    })
}

/// The bracketed choice of a sysfs selector: `always [madvise] never` gives `madvise`.
pub fn bracketed_choice(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'))
}

fn check_transparent_huge_pages(host: &Host) -> Finding {
    let area = "transparent huge pages";
    let relative = "sys/kernel/mm/transparent_hugepage/enabled";
    let Some(text) = host.read(relative) else {
        return Finding::new(Verdict::Info, area, "not available on this kernel".into());
    };
    match bracketed_choice(&text) {
        Some("always") => Finding::new(Verdict::Change, area, "always -> madvise".into())
            .why(
                "with always, page faults and khugepaged compact memory and can stall a shard \
                 for milliseconds; shardmq's buffers gain nothing from huge pages",
            )
            .writes(vec![Write {
                path: format!("/{relative}"),
                value: "madvise".into(),
            }]),
        Some(choice) => Finding::new(Verdict::Ok, area, choice.to_string()),
        None => Finding::new(Verdict::Info, area, format!("unreadable setting {text:?}")),
    }
}

/// The block device (its sysfs directory with `queue/`) holding `data_dir`.
fn data_disk(host: &Host, data_dir: &Path) -> Result<(String, PathBuf), String> {
    let absolute = match data_dir.is_absolute() {
        true => data_dir.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|e| e.to_string())?
            .join(data_dir),
    };
    let mut existing = absolute.as_path();
    while !existing.exists() {
        existing = existing.parent().ok_or("no existing parent directory")?;
    }
    let dev = std::os::unix::fs::MetadataExt::dev(
        &std::fs::metadata(existing).map_err(|e| e.to_string())?,
    );
    // glibc's gnu_dev_major/minor.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    if major == 0 {
        return Err(format!(
            "{} is on a filesystem without a block device (tmpfs, overlay)",
            existing.display()
        ));
    }
    let link = host.path(&format!("sys/dev/block/{major}:{minor}"));
    let device = std::fs::canonicalize(&link)
        .map_err(|_| format!("no {} for device {major}:{minor}", link.display()))?;
    // A partition's queue settings live on its parent disk.
    let disk = if device.join("queue").is_dir() {
        device
    } else {
        device.parent().map(Path::to_path_buf).unwrap_or(device)
    };
    let name = disk
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("{major}:{minor}"));
    Ok((name, disk))
}

fn check_disk(host: &Host, data_dir: &Path) -> Vec<Finding> {
    let area = "disk";
    let (name, disk) = match data_disk(host, data_dir) {
        Ok(found) => found,
        Err(reason) => return vec![Finding::new(Verdict::Info, area, reason)],
    };
    let queue = disk.join("queue");
    let sysfs_path = |file: &str| {
        let relative = queue.join(file);
        let shown = relative
            .strip_prefix(&host.root)
            .map(|path| format!("/{}", path.display()))
            .unwrap_or_else(|_| relative.display().to_string());
        (relative, shown)
    };
    let rotational = read_small(&queue.join("rotational"));
    let mut findings = Vec::new();
    let (scheduler_path, scheduler_shown) = sysfs_path("scheduler");
    if let Some(text) = read_small(&scheduler_path) {
        let current = bracketed_choice(&text).unwrap_or("?").to_string();
        let offers_none = text
            .split_whitespace()
            .any(|w| w.trim_matches(['[', ']']) == "none");
        let summary = format!("{name} scheduler {current}");
        findings.push(match rotational.as_deref() {
            Some("0") if current != "none" && offers_none => {
                Finding::new(Verdict::Change, area, format!("{summary} -> none"))
                    .why(
                        "a flash disk needs no reordering: none saves CPU per I/O and adds no \
                         queueing delay to group commits",
                    )
                    .writes(vec![Write {
                        path: scheduler_shown,
                        value: "none".into(),
                    }])
            }
            Some("1") if current != "none" => Finding::new(Verdict::Info, area, summary).why(
                "the disk says it is rotational (virtual disks often do): keeping the \
                 scheduler; if it is flash underneath, none is cheaper",
            ),
            _ => Finding::new(Verdict::Ok, area, summary),
        });
    }
    let (cache_path, cache_shown) = sysfs_path("write_cache");
    if let Some(cache) = read_small(&cache_path) {
        let summary = format!("{name} write cache: {cache}");
        findings.push(if cache == "write back" {
            Finding::new(Verdict::Info, area, summary).why(format!(
                "every fdatasync also flushes the device cache, so each sync-flush group \
                 commit pays a cache flush; only if the cache is power-loss protected, \
                 `echo 'write through' > {cache_shown}` lets the kernel skip those flushes \
                 (a durability decision: not applied)"
            ))
        } else {
            Finding::new(Verdict::Ok, area, summary)
        });
    }
    findings
}

fn check_listen_backlog(host: &Host) -> Finding {
    check_sysctl_at_least(
        host,
        "listen backlog",
        "net.core.somaxconn",
        LISTEN_BACKLOG_CONNECTIONS,
        |_| {
            format!(
                "shardmq listens with a backlog of {LISTEN_BACKLOG_CONNECTIONS} and the kernel \
                 caps it at somaxconn; a burst of connecting clients beyond it waits for SYN \
                 retries (1 s and more)"
            )
        },
    )
}

/// The TCP congestion control new connections get. BBR paces every connection's sends,
/// loopback ones too, with a timer: a consumer on the same host catching up from disk read
/// 0.77-0.93x the MB/s for 1.23-1.32x the broker's CPU against cubic (docs/performance.md;
/// small sends were the same). Only reported: BBR is often chosen on purpose, for clients
/// that come over long or lossy links.
fn check_congestion_control(host: &Host) -> Finding {
    let area = "tcp congestion control";
    let Some(text) = host.read("proc/sys/net/ipv4/tcp_congestion_control") else {
        return Finding::new(Verdict::Info, area, "unreadable".into());
    };
    let name = text.trim();
    let summary = format!("net.ipv4.tcp_congestion_control {name}");
    if name != "bbr" {
        return Finding::new(Verdict::Ok, area, summary);
    }
    Finding::new(Verdict::Info, area, summary)
        .why(
            "bbr paces the sends of every connection, loopback ones too: pulls of large answers \
             to a consumer on the same host catching up measured 0.77-0.93x the MB/s for \
             1.23-1.32x the broker's CPU against cubic; small sends were the same",
        )
        .how(
            "where consumers run on this host: sysctl -w net.ipv4.tcp_congestion_control=cubic \
             (connections made after it), and in /etc/sysctl.d to keep it; keep bbr where \
             clients come over long or lossy links",
        )
}

/// vm.max_map_count wanted: RocketMQ's os.sh value.
pub const MAP_COUNT_WANTED: u64 = 655_360;

fn check_map_count(host: &Host) -> Finding {
    check_sysctl_at_least(
        host,
        "memory maps",
        "vm.max_map_count",
        MAP_COUNT_WANTED,
        |limit| {
            format!(
                "every consume queue holding units is one memory map (and every index file): a \
             node with more than ~{} queues cannot map the next one, and sends to it are \
             refused (RocketMQ's os.sh sets {MAP_COUNT_WANTED})",
                limit.saturating_sub(1_000)
            )
        },
    )
}

/// A sysctl (`net.core.somaxconn`, read at `proc/sys/net/core/somaxconn`) that should be at
/// least `wanted`: a change to `wanted` when below it, saying `why` (given the value read).
fn check_sysctl_at_least(
    host: &Host,
    area: &'static str,
    name: &str,
    wanted: u64,
    why: impl Fn(u64) -> String,
) -> Finding {
    let relative = format!("proc/sys/{}", name.replace('.', "/"));
    match host
        .read(&relative)
        .and_then(|text| text.parse::<u64>().ok())
    {
        Some(value) if value < wanted => {
            Finding::new(Verdict::Change, area, format!("{name} {value} -> {wanted}"))
                .why(why(value))
                .writes(vec![Write {
                    path: format!("/{relative}"),
                    value: wanted.to_string(),
                }])
        }
        Some(value) => Finding::new(Verdict::Ok, area, format!("{name} {value}")),
        None => Finding::new(Verdict::Info, area, format!("{name} unreadable")),
    }
}

/// `0-3,6` → [0, 1, 2, 3, 6]; malformed parts are skipped.
pub fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|part| !part.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                if let (Ok(first), Ok(last)) = (first.parse::<usize>(), last.parse::<usize>()) {
                    cpus.extend(first..=last.min(first + 65_536));
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus
}

/// The findings as `shardmq tune` prints them.
pub fn render(findings: &[Finding]) -> String {
    let mut text = String::new();
    for finding in findings {
        let _ = writeln!(
            text,
            "{} {}: {}",
            finding.verdict.label(),
            finding.area,
            finding.summary
        );
        if let Some(why) = &finding.why {
            let _ = writeln!(text, "           why: {why}");
        }
        if let Some(how) = &finding.how {
            let _ = writeln!(text, "           how: {how}");
        }
    }
    text
}

/// What `--apply` did with one write.
#[derive(Debug)]
pub struct Applied {
    pub write: Write,
    pub result: io::Result<()>,
}

/// Makes every write of every Change finding, in order, and reports each.
pub fn apply(host: &Host, findings: &[Finding]) -> Vec<Applied> {
    findings
        .iter()
        .filter(|finding| finding.verdict == Verdict::Change)
        .flat_map(|finding| finding.writes.iter())
        .map(|write| {
            let path = host.path(write.path.trim_start_matches('/'));
            let result = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .and_then(|mut file| io::Write::write_all(&mut file, write.value.as_bytes()));
            Applied {
                write: write.clone(),
                result,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
