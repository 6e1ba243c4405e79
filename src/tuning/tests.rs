//! Profile parsing and checking: every shipped profile, every way a profile is refused.

use super::*;

const SIXTEEN_CPUS: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

fn resolve(text: &str, online: &[usize]) -> Result<Tuning, ProfileError> {
    Profile::parse("test", text)?.resolve(online)
}

fn refusal(text: &str, online: &[usize]) -> ProfileError {
    resolve(text, online).expect_err("the profile should be refused")
}

#[test]
fn every_embedded_profile_parses_and_resolves_on_sixteen_cores() {
    for (name, _) in EMBEDDED_PROFILES {
        let profile = Profile::load(name).unwrap();
        assert!(!profile.description.is_empty(), "{name} has no description");
        let tuning = profile
            .resolve(SIXTEEN_CPUS)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(tuning.source, *name);
        assert!(!tuning.placement.cpus.is_empty(), "{name}");
    }
}

#[test]
fn every_embedded_profile_sets_and_documents_every_knob() {
    let mut keys: Vec<(String, String)> = NUMERIC_KNOBS
        .iter()
        .map(|knob| (knob.key.to_string(), knob.doc()))
        .collect();
    keys.extend(
        OTHER_KNOBS
            .iter()
            .map(|(key, doc)| (key.to_string(), doc.to_string())),
    );
    for (name, text) in EMBEDDED_PROFILES {
        let lines: Vec<&str> = text.lines().collect();
        for (key, doc) in &keys {
            let (section, knob) = key.split_once('.').unwrap();
            let section_at = lines
                .iter()
                .position(|line| *line == format!("[{section}]"))
                .unwrap_or_else(|| panic!("{name}: no [{section}]"));
            let key_at = lines[section_at..]
                .iter()
                .position(|line| line.starts_with(&format!("{knob} = ")))
                .map(|at| at + section_at)
                .unwrap_or_else(|| panic!("{name}: {key} not set"));
            assert_eq!(
                lines[key_at - 1],
                format!("# {doc}"),
                "{name}: the comment above {key} must give its unit and bounds"
            );
        }
    }
}

#[test]
fn default_profile_is_the_built_in_default() {
    let from_file = Profile::load("default")
        .unwrap()
        .resolve(SIXTEEN_CPUS)
        .unwrap();
    let from_nothing = resolve("", SIXTEEN_CPUS).unwrap();
    assert_eq!(
        Tuning {
            source: "test".into(),
            ..from_file.clone()
        },
        from_nothing
    );
    assert_eq!(from_file.placement.cpus.len(), 16);
    assert!(from_file.placement.cpus.iter().all(Option::is_some));
    assert_eq!(from_file.flush_mode, FlushMode::Async);
    assert_eq!(from_file.flush_interval_ms, 200);
    assert_eq!(from_file.segment_size_bytes, 1 << 30);
    assert_eq!(from_file.read_cache_windows, 16);
    let larger = resolve("[store]\nread_cache_mib = 64\n", SIXTEEN_CPUS).unwrap();
    assert_eq!(larger.read_cache_windows, 64);
    assert_eq!(from_file.connection_limits, ConnectionLimits::default());
    assert_eq!(
        from_file.placement,
        ShardPlacement {
            cpus: SIXTEEN_CPUS.iter().map(|&cpu| Some(cpu)).collect(),
            float_cpus: Vec::new(),
            ..ShardPlacement::first_cpus(0)
        }
    );
}

#[test]
fn shipped_profiles_say_what_their_names_promise() {
    let load = |name: &str| Profile::load(name).unwrap().resolve(SIXTEEN_CPUS).unwrap();
    let small = load("small-vm");
    assert_eq!(small.placement.cpus, vec![None, None]);
    assert_eq!(small.placement.float_cpus, vec![0, 1]);
    assert_eq!(small.placement.spin_before_park_us, 0);
    let dedicated = load("dedicated-16");
    assert_eq!(dedicated.reserved_cpus, vec![0, 1]);
    assert_eq!(
        dedicated.placement.helper_cpus,
        vec![0, 1],
        "helpers on the kept cores"
    );
    let shard_cpus: Vec<_> = (2..16).map(Some).collect();
    assert_eq!(dedicated.placement.cpus, shard_cpus);
    let throughput = load("throughput");
    let latency = load("latency");
    assert!(throughput.flush_dirty_max_bytes > latency.flush_dirty_max_bytes);
    assert!(latency.placement.preempt_timer_us < throughput.placement.preempt_timer_us);
    assert!(latency.placement.spin_before_park_us > 0);
    // A 2-core host runs small-vm, but not dedicated-16.
    assert!(Profile::load("small-vm").unwrap().resolve(&[0, 1]).is_ok());
    let error = Profile::load("dedicated-16")
        .unwrap()
        .resolve(&[0, 1])
        .unwrap_err();
    assert_eq!(error.key, "shards.cpus");
    assert!(
        error.to_string().contains("CPU 2, which is not online"),
        "{error}"
    );
}

#[test]
fn a_missing_core_is_refused_naming_the_key() {
    let error = refusal("[shards]\ncpus = [0, 7]\n", &[0, 1]);
    assert_eq!(error.key, "shards.cpus");
    assert_eq!(error.origin, "profile test");
    assert_eq!(
        error.to_string(),
        "profile test: shards.cpus: names CPU 7, which is not online (online: 0-1)"
    );
    let error = refusal("[shards]\nreserved_cpus = [3]\n", &[0, 1]);
    assert_eq!(error.key, "shards.reserved_cpus");
    let error = refusal("[shards]\ncpus = 3\n", &[0, 1]);
    assert_eq!(error.key, "shards.cpus");
    assert!(
        error.reason.contains("asks for 3 cores but only 2"),
        "{error}"
    );
    let error = refusal("[shards]\ncpus = [1, 1]\n", &[0, 1]);
    assert!(error.reason.contains("CPU 1 twice"), "{error}");
    let error = refusal("[shards]\ncpus = [-1]\n", &[0, 1]);
    assert!(error.reason.contains("CPU -1"), "{error}");
}

#[test]
fn reserved_cores_are_kept_from_shards() {
    let tuning = resolve("[shards]\nreserved_cpus = [0]\n", &[0, 1, 2, 3]).unwrap();
    let shard_cpus: Vec<_> = [1, 2, 3].into_iter().map(Some).collect();
    assert_eq!(tuning.placement.cpus, shard_cpus);
    let tuning = resolve("[shards]\ncpus = 2\nreserved_cpus = [0]\n", &[0, 1, 2, 3]).unwrap();
    assert_eq!(tuning.placement.cpus, vec![Some(1), Some(2)]);
    let error = refusal("[shards]\ncpus = [0, 1]\nreserved_cpus = [1]\n", &[0, 1]);
    assert_eq!(error.key, "shards.cpus");
    let error = refusal("[shards]\nreserved_cpus = [0, 1]\n", &[0, 1]);
    assert_eq!(error.key, "shards.reserved_cpus");
}

#[test]
fn out_of_range_values_are_refused_naming_the_key() {
    for knob in NUMERIC_KNOBS {
        let (section, key) = knob.key.split_once('.').unwrap();
        for bad in [knob.min - 1, knob.max + 1] {
            let text = format!("[{section}]\n{key} = {bad}\n");
            let error = refusal(&text, &[0, 1]);
            assert_eq!(error.key, knob.key, "{text}");
            assert_eq!(error.origin, "profile test");
            assert!(error.reason.contains(&knob.doc()), "{error}");
        }
        let text = format!("[{section}]\n{key} = {}\n", knob.max);
        resolve(&text, &[0, 1]).unwrap_or_else(|error| panic!("{text}: {error}"));
    }
    let error = refusal("[runtime]\nring_depth_entries = 100\n", &[0]);
    assert_eq!(error.key, "runtime.ring_depth_entries");
    assert!(error.reason.contains("a power of two"), "{error}");
    let error = refusal("[store]\nflush = \"sometimes\"\n", &[0]);
    assert_eq!(error.key, "store.flush");
    let error = refusal("[shards]\ncpus = \"most\"\n", &[0]);
    assert_eq!(error.key, "shards.cpus");
}

#[test]
fn unknown_keys_and_wrong_types_are_refused_naming_the_key() {
    let error = refusal("[store]\nflush_interval = 5\n", &[0]);
    assert_eq!(error.key, "store.flush_interval");
    assert!(error.reason.contains("unknown field"), "{error}");
    let error = refusal("[runtime]\npreempt_timer_us = \"fast\"\n", &[0]);
    assert_eq!(error.key, "runtime.preempt_timer_us");
    let error = refusal("[nothing]\na = 1\n", &[0]);
    assert_eq!(error.key, "[nothing]");
    let error = refusal("[store\n", &[0]);
    assert_eq!(error.origin, "profile test");
}

#[test]
fn flags_override_the_profile_and_are_named_when_out_of_bounds() {
    let mut profile = Profile::load("small-vm").unwrap();
    profile.apply(&Overrides {
        shards: Some(1),
        flush: Some(FlushMode::Sync),
        segment_size_mib: Some(16),
        ..Overrides::default()
    });
    let tuning = profile.resolve(&[0, 1]).unwrap();
    assert_eq!(tuning.placement.cpus, vec![None]);
    assert_eq!(tuning.flush_mode, FlushMode::Sync);
    assert_eq!(tuning.segment_size_bytes, 16 << 20);
    // Knobs no flag touched keep the profile's values.
    assert_eq!(tuning.placement.ring_depth_entries, 256);

    let mut profile = Profile::load("default").unwrap();
    profile.apply(&Overrides {
        flush_interval_ms: Some(0),
        ..Overrides::default()
    });
    let error = profile.resolve(&[0, 1]).unwrap_err();
    assert_eq!(error.origin, "--flush-interval-ms");
    assert_eq!(error.key, "store.flush_interval_ms");

    let mut profile = Profile::load("default").unwrap();
    profile.apply(&Overrides {
        cpus: Some(vec![5]),
        ..Overrides::default()
    });
    assert_eq!(profile.resolve(&[0, 1]).unwrap_err().origin, "--cpus");
}

#[test]
fn more_shards_than_cores_float_only_when_asked_by_flag() {
    let mut profile = Profile::load("default").unwrap();
    profile.apply(&Overrides {
        shards: Some(4),
        ..Overrides::default()
    });
    let tuning = profile.resolve(&[0, 1]).unwrap();
    assert_eq!(tuning.placement.cpus, vec![None; 4]);
    assert_eq!(tuning.placement.float_cpus, vec![0, 1, 0, 1]);
    assert!(refusal("[shards]\ncpus = 4\n", &[0, 1])
        .reason
        .contains("asks for 4 cores"));
}

#[test]
fn unknown_profile_names_say_what_exists() {
    let error = Profile::load("no-such-profile").unwrap_err();
    assert!(error.reason.contains("small-vm"), "{error}");
}

#[test]
fn cpu_lists_print_as_linux_writes_them() {
    assert_eq!(cpu_list_text(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
    assert_eq!(cpu_list_text(&[5]), "5");
    assert_eq!(cpu_list_text(&[]), "none");
}
