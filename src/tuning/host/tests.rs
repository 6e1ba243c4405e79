//! `shardmq tune` on a fake /proc and /sys tree: what it finds, that inspecting writes
//! nothing, and that applying writes exactly the suggested values.

use std::fs;
use std::os::unix::fs::MetadataExt;

use super::*;
use crate::tuning::Profile;

const INTERRUPTS: &str = "\
           CPU0       CPU1       CPU2       CPU3
 24:          1          0          0          0  IO-APIC   5-edge      ACPI:Ged
 36:          0          0     778113          0  PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 38:       3767          0          0          0  PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0
 41:          0          0          0          0  PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx
 42:          0          0          0      18814  PCI-MSIX-0000:00:04.0   2-edge      virtio3-tx
NMI:          0          0          0          0   Non-maskable interrupts
LOC:    2719357    2764019    2719357    2764019   Local timer interrupts
ERR:          0
";

struct FakeHost {
    root: PathBuf,
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl FakeHost {
    fn new(name: &str) -> FakeHost {
        let root = std::env::temp_dir().join(format!("shardmq-tune-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("data")).unwrap();
        FakeHost { root }
    }

    fn put(&self, relative: &str, text: &str) {
        let path = self.root.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn get(&self, relative: &str) -> String {
        fs::read_to_string(self.root.join(relative)).unwrap()
    }

    /// `sys/dev/block/M:m` of the device the fake data dir lives on; None on tmpfs.
    fn data_device_dir(&self) -> Option<String> {
        let dev = fs::metadata(self.root.join("data")).unwrap().dev();
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        (major != 0).then(|| format!("sys/dev/block/{major}:{minor}"))
    }
}

fn dedicated_tuning() -> Tuning {
    Profile::parse("test", "[shards]\ncpus = [2, 3]\nreserved_cpus = [0, 1]\n")
        .unwrap()
        .resolve(&[0, 1, 2, 3])
        .unwrap()
}

fn not_root() -> ProcessFacts {
    ProcessFacts {
        is_root: false,
        memlock_limit_bytes: 8 << 20,
    }
}

fn lay_out_busy_host(host: &FakeHost) {
    host.put("proc/sys/kernel/io_uring_disabled", "2\n");
    host.put("sys/devices/system/cpu/online", "0-3\n");
    for cpu in 0..4 {
        let dir = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq");
        host.put(&format!("{dir}/scaling_governor"), "powersave\n");
        host.put(
            &format!("{dir}/scaling_available_governors"),
            "performance powersave\n",
        );
    }
    host.put("proc/interrupts", INTERRUPTS);
    host.put("proc/irq/36/smp_affinity_list", "0-3\n");
    host.put("proc/cmdline", "quiet console=ttyS0\n");
    host.put(
        "sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never\n",
    );
    host.put("proc/sys/net/core/somaxconn", "128\n");
    host.put("proc/sys/net/ipv4/tcp_congestion_control", "bbr\n");
    host.put("proc/sys/vm/max_map_count", "65530\n");
    if let Some(device) = host.data_device_dir() {
        host.put(&format!("{device}/queue/scheduler"), "[mq-deadline] none\n");
        host.put(&format!("{device}/queue/rotational"), "0\n");
        host.put(&format!("{device}/queue/write_cache"), "write back\n");
    }
}

fn find<'a>(findings: &'a [Finding], area: &str) -> Vec<&'a Finding> {
    findings.iter().filter(|f| f.area == area).collect()
}

#[test]
fn a_busy_host_gets_every_suggestion_and_nothing_is_written() {
    let fake = FakeHost::new("busy");
    lay_out_busy_host(&fake);
    let host = Host::at(&fake.root);
    let findings = inspect(
        &host,
        not_root(),
        &dedicated_tuning(),
        &fake.root.join("data"),
    );
    let text = render(&findings);

    let io_uring = find(&findings, "io_uring")[0];
    assert_eq!(io_uring.verdict, Verdict::Manual, "{text}");
    assert!(io_uring
        .how
        .as_ref()
        .unwrap()
        .contains("io_uring_disabled=0"));
    // 2 shards x 10 MiB = 20 MiB > 8 MiB for a user that is not root.
    assert_eq!(find(&findings, "locked memory")[0].verdict, Verdict::Manual);

    let governor = find(&findings, "cpu governor")[0];
    assert_eq!(governor.verdict, Verdict::Change);
    let governor_paths: Vec<&str> = governor.writes.iter().map(|w| w.path.as_str()).collect();
    assert_eq!(
        governor_paths,
        [
            "/sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
            "/sys/devices/system/cpu/cpu3/cpufreq/scaling_governor"
        ],
        "only the shard cores"
    );

    let interrupts = find(&findings, "interrupts")[0];
    assert_eq!(interrupts.verdict, Verdict::Change, "{text}");
    let expected_irq_writes = [
        Write {
            path: "/proc/irq/36/smp_affinity_list".into(),
            value: "0-1".into(),
        },
        Write {
            path: "/proc/irq/42/smp_affinity_list".into(),
            value: "0-1".into(),
        },
    ];
    assert_eq!(interrupts.writes, expected_irq_writes);
    assert!(interrupts.summary.contains("796927 of 800695"), "{text}");

    let thp = find(&findings, "transparent huge pages")[0];
    assert_eq!(thp.verdict, Verdict::Change);
    assert_eq!(
        find(&findings, "listen backlog")[0].verdict,
        Verdict::Change
    );
    if fake.data_device_dir().is_some() {
        let disk = find(&findings, "disk");
        assert_eq!(disk[0].verdict, Verdict::Change, "{text}");
        assert_eq!(disk[0].writes[0].value, "none");
        assert!(disk[1].why.as_ref().unwrap().contains("not applied"));
    }
    assert!(text.contains("[change] cpu governor: cpu2 powersave, cpu3 powersave"));
    // BBR is only pointed out: it may be chosen for clients far away.
    let congestion = find(&findings, "tcp congestion control")[0];
    assert_eq!(congestion.verdict, Verdict::Info, "{text}");
    assert!(congestion.writes.is_empty());
    assert!(
        congestion.how.as_ref().unwrap().contains("=cubic"),
        "{text}"
    );

    // Inspecting changed nothing.
    assert_eq!(
        fake.get("sys/kernel/mm/transparent_hugepage/enabled"),
        "[always] madvise never\n"
    );
    assert_eq!(fake.get("proc/irq/36/smp_affinity_list"), "0-3\n");
}

#[test]
fn apply_writes_the_suggested_values_and_reports_what_failed() {
    let fake = FakeHost::new("apply");
    lay_out_busy_host(&fake);
    let host = Host::at(&fake.root);
    let findings = inspect(
        &host,
        not_root(),
        &dedicated_tuning(),
        &fake.root.join("data"),
    );
    let applied = apply(&host, &findings);
    let failed: Vec<&str> = applied
        .iter()
        .filter(|a| a.result.is_err())
        .map(|a| a.write.path.as_str())
        .collect();
    // The fake tree has no smp_affinity_list for irq 42: that write fails and says so.
    assert_eq!(failed, ["/proc/irq/42/smp_affinity_list"]);
    assert_eq!(fake.get("proc/irq/36/smp_affinity_list"), "0-1");
    assert_eq!(
        fake.get("sys/devices/system/cpu/cpu2/cpufreq/scaling_governor"),
        "performance"
    );
    assert_eq!(
        fake.get("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "powersave\n",
        "a reserved core is left alone"
    );
    assert_eq!(
        fake.get("sys/kernel/mm/transparent_hugepage/enabled"),
        "madvise"
    );
    assert_eq!(fake.get("proc/sys/net/core/somaxconn"), "1024");
    assert_eq!(fake.get("proc/sys/vm/max_map_count"), "655360");
    // io_uring and memlock are never applied.
    assert_eq!(fake.get("proc/sys/kernel/io_uring_disabled"), "2\n");
}

#[test]
fn a_tidy_host_needs_nothing() {
    let fake = FakeHost::new("tidy");
    fake.put("proc/sys/kernel/io_uring_disabled", "0\n");
    fake.put("sys/devices/system/cpu/online", "0-1\n");
    fake.put("proc/interrupts", INTERRUPTS);
    fake.put(
        "sys/kernel/mm/transparent_hugepage/enabled",
        "always [madvise] never\n",
    );
    fake.put("proc/sys/net/core/somaxconn", "4096\n");
    fake.put("proc/sys/net/ipv4/tcp_congestion_control", "cubic\n");
    fake.put("proc/sys/vm/max_map_count", "1048576\n");
    let tuning = Profile::load("small-vm").unwrap().resolve(&[0, 1]).unwrap();
    let root = ProcessFacts {
        is_root: true,
        memlock_limit_bytes: 64 << 10,
    };
    let findings = inspect(
        &Host::at(&fake.root),
        root,
        &tuning,
        &fake.root.join("data"),
    );
    let text = render(&findings);
    assert!(
        findings
            .iter()
            .all(|f| matches!(f.verdict, Verdict::Ok | Verdict::Info)),
        "{text}"
    );
    assert!(text.contains("no cpufreq"), "{text}");
    assert!(text.contains("2 shard(s) floating on 0-1"), "{text}");
    assert_eq!(
        find(&findings, "tcp congestion control")[0].verdict,
        Verdict::Ok,
        "{text}"
    );
    // Without reserved cores, interrupts on shard cores are only reported.
    assert!(
        find(&findings, "interrupts")[0]
            .why
            .as_ref()
            .unwrap()
            .contains("reserved_cpus"),
        "{text}"
    );
}

#[test]
fn proc_interrupts_parses_device_lines_only() {
    let irqs = parse_interrupts(INTERRUPTS);
    assert_eq!(irqs.len(), 5);
    assert_eq!(irqs[1].irq, 36);
    assert_eq!(irqs[1].name, "virtio1-req.0");
    assert_eq!(irqs[1].per_cpu, vec![(0, 0), (1, 0), (2, 778_113), (3, 0)]);
    assert!(parse_interrupts("").is_empty());
}

#[test]
fn selectors_and_cpu_lists_parse() {
    assert_eq!(bracketed_choice("always [madvise] never"), Some("madvise"));
    assert_eq!(bracketed_choice("[none] mq-deadline"), Some("none"));
    assert_eq!(bracketed_choice("none"), None);
    assert_eq!(parse_cpu_list("0-3,6,8-9\n"), vec![0, 1, 2, 3, 6, 8, 9]);
    assert_eq!(parse_cpu_list("x,2"), vec![2]);
}

#[test]
fn a_read_cache_larger_than_the_io_memory_is_pointed_out() {
    let fits = check_read_cache(&dedicated_tuning());
    assert_eq!(
        fits.verdict,
        Verdict::Ok,
        "16 windows in 24 MiB: {}",
        fits.summary
    );
    let larger = Profile::parse(
        "test",
        "[shards]\ncpus = [2, 3]\n[store]\nread_cache_mib = 64\n",
    )
    .unwrap()
    .resolve(&[0, 1, 2, 3])
    .unwrap();
    let finding = check_read_cache(&larger);
    assert_eq!(finding.verdict, Verdict::Info);
    assert!(
        finding.summary.contains("64 windows"),
        "{}",
        finding.summary
    );
    assert!(
        finding.how.as_ref().unwrap().contains("io_memory_mib = 72"),
        "{:?}",
        finding.how
    );
    assert!(
        finding
            .why
            .as_ref()
            .unwrap()
            .contains("48 of the 64 windows"),
        "{:?}",
        finding.why
    );
}
