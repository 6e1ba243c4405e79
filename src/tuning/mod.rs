//! Tuning profiles: which cores run shards and how each shard's runtime, store and
//! connections are sized, read from a TOML file (`tuning/*.toml`) and checked before anything
//! starts. `host` inspects the machine for `shardmq tune`.
//!
//! A profile has four sections; every knob, its unit and its bounds are in `KNOBS` (and in
//! the comment above each key of every shipped profile, which a test keeps in step):
//!
//! | section | knobs |
//! |---|---|
//! | `[shards]` | `cpus`, `reserved_cpus`, `pin` |
//! | `[store]` | `flush`, `flush_interval_ms`, `flush_batch_kib`, `segment_size_mib`, `allocation_window_mib`, `read_cache_mib` |
//! | `[runtime]` | `ring_depth_entries`, `io_memory_mib`, `preempt_timer_us`, `spin_before_park_us` |
//! | `[runtime]` (workarounds) | `watchdog_ms`, `store_open_stall_ms` (0 turns each off; see `shards::runtime::workarounds`) |
//! | `[network]` | `read_buffer_kib`, `output_pause_kib`, `in_flight_requests_max`, `connections_per_shard_max` |
//!
//! A key a profile leaves out takes the built-in default (the `default` profile's value); an
//! unknown key, a value of the wrong type, a value out of bounds or a CPU that is not online
//! refuses the whole profile with a message that names the key. Command-line flags given
//! explicitly override the profile, and are checked the same way (the message then names the
//! flag). Profiles shipped with shardmq are compiled into the binary (`EMBEDDED_PROFILES`), so
//! `--profile small-vm` works from any directory; anything else is read as a path.
//!
//! Pure: the online CPU list comes in as an argument.

pub mod host;

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use shards::runtime::{ShardPlacement, RING_DEPTH_MAX_ENTRIES};
use shards::store::{FlushMode, FLUSH_DIRTY_MAX_BYTES_LIMIT};

use crate::server::ConnectionLimits;

/// Profiles compiled into the binary, by name.
pub const EMBEDDED_PROFILES: &[(&str, &str)] = &[
    ("default", include_str!("../../tuning/default.toml")),
    ("small-vm", include_str!("../../tuning/small-vm.toml")),
    ("throughput", include_str!("../../tuning/throughput.toml")),
    ("latency", include_str!("../../tuning/latency.toml")),
    (
        "dedicated-16",
        include_str!("../../tuning/dedicated-16.toml"),
    ),
];

/// The profile used when none is named.
pub const DEFAULT_PROFILE: &str = "default";
/// Most shards one node runs (ports, memory and the route table are sized for it).
pub const SHARDS_MAX: usize = 256;
/// Largest profile file read (a profile is a few dozen lines).
const PROFILE_SIZE_MAX_BYTES: u64 = 64 * 1024;

/// A knob whose value is an integer with a unit and inclusive bounds.
#[derive(Debug, Clone, Copy)]
pub struct NumericKnob {
    /// `section.key`, as written in a profile.
    pub key: &'static str,
    pub unit: &'static str,
    pub min: i64,
    pub max: i64,
    pub power_of_two: bool,
    /// The built-in default (the `default` profile's value).
    pub default: i64,
}

impl NumericKnob {
    /// Unit and bounds, as every profile documents them: `[ms; 1..=60000]`.
    pub fn doc(&self) -> String {
        let power = if self.power_of_two {
            ", a power of two"
        } else {
            ""
        };
        format!("[{}; {}..={}{power}]", self.unit, self.min, self.max)
    }

    fn check(&self, value: i64, origin: &Origin) -> Result<u64, ProfileError> {
        let in_range = (self.min..=self.max).contains(&value);
        let power_ok = !self.power_of_two || (value > 0 && (value as u64).is_power_of_two());
        if in_range && power_ok {
            return Ok(value as u64);
        }
        Err(origin.error(
            self.key,
            format!("{value} is out of bounds: want {}", self.doc()),
        ))
    }
}

pub const FLUSH_INTERVAL_MS: NumericKnob = NumericKnob {
    key: "store.flush_interval_ms",
    unit: "ms",
    min: 1,
    max: 60_000,
    power_of_two: false,
    default: 200,
};
pub const FLUSH_BATCH_KIB: NumericKnob = NumericKnob {
    key: "store.flush_batch_kib",
    unit: "KiB",
    min: 4,
    max: (FLUSH_DIRTY_MAX_BYTES_LIMIT / 1024) as i64,
    power_of_two: false,
    default: (shards::store::FLUSH_DIRTY_BYTES_MAX / 1024) as i64,
};
pub const SEGMENT_SIZE_MIB: NumericKnob = NumericKnob {
    key: "store.segment_size_mib",
    unit: "MiB",
    min: 1,
    max: 16 * 1024,
    power_of_two: false,
    default: 1024,
};
pub const ALLOCATION_WINDOW_MIB: NumericKnob = NumericKnob {
    key: "store.allocation_window_mib",
    unit: "MiB",
    min: (shards::store::ALLOCATION_WINDOW_MIN_BYTES >> 20) as i64,
    max: 16 * 1024,
    power_of_two: false,
    default: (shards::store::ALLOCATION_WINDOW_DEFAULT_BYTES >> 20) as i64,
};
pub const READ_CACHE_MIB: NumericKnob = NumericKnob {
    key: "store.read_cache_mib",
    unit: "MiB",
    min: shards::store::READ_CACHE_WINDOWS_MIN as i64,
    max: 4096,
    power_of_two: false,
    default: shards::store::READ_CACHE_WINDOWS_DEFAULT as i64,
};
pub const RING_DEPTH_ENTRIES: NumericKnob = NumericKnob {
    key: "runtime.ring_depth_entries",
    unit: "entries",
    min: 16,
    max: RING_DEPTH_MAX_ENTRIES as i64,
    power_of_two: true,
    default: shards::runtime::RING_DEPTH_DEFAULT_ENTRIES as i64,
};
pub const IO_MEMORY_MIB: NumericKnob = NumericKnob {
    key: "runtime.io_memory_mib",
    unit: "MiB",
    min: 1,
    max: 1024,
    power_of_two: false,
    default: (shards::runtime::IO_MEMORY_DEFAULT_BYTES_PER_SHARD >> 20) as i64,
};
pub const PREEMPT_TIMER_US: NumericKnob = NumericKnob {
    key: "runtime.preempt_timer_us",
    unit: "us",
    min: 10,
    max: 100_000,
    power_of_two: false,
    default: shards::runtime::PREEMPT_TIMER_DEFAULT_US as i64,
};
pub const SPIN_BEFORE_PARK_US: NumericKnob = NumericKnob {
    key: "runtime.spin_before_park_us",
    unit: "us",
    min: 0,
    max: 100_000,
    power_of_two: false,
    default: 0,
};
pub const WATCHDOG_MS: NumericKnob = NumericKnob {
    key: "runtime.watchdog_ms",
    unit: "ms",
    min: 0,
    max: 10_000,
    power_of_two: false,
    default: shards::runtime::workarounds::WATCHDOG_DEFAULT_MS as i64,
};
pub const STORE_OPEN_STALL_MS: NumericKnob = NumericKnob {
    key: "runtime.store_open_stall_ms",
    unit: "ms",
    min: 0,
    max: 3_600_000,
    power_of_two: false,
    default: shards::runtime::workarounds::STORE_OPEN_STALL_DEFAULT_MS as i64,
};
pub const READ_BUFFER_KIB: NumericKnob = NumericKnob {
    key: "network.read_buffer_kib",
    unit: "KiB",
    min: 4,
    max: 4096,
    power_of_two: false,
    default: (crate::server::READ_CHUNK_BYTES / 1024) as i64,
};
pub const OUTPUT_PAUSE_KIB: NumericKnob = NumericKnob {
    key: "network.output_pause_kib",
    unit: "KiB",
    min: 64,
    max: 1024 * 1024,
    power_of_two: false,
    default: (crate::server::OUTPUT_PAUSE_BYTES / 1024) as i64,
};
pub const IN_FLIGHT_REQUESTS_MAX: NumericKnob = NumericKnob {
    key: "network.in_flight_requests_max",
    unit: "requests",
    min: 1,
    max: 65_536,
    power_of_two: false,
    default: crate::server::IN_FLIGHT_REQUESTS_MAX as i64,
};

pub const CONNECTIONS_PER_SHARD_MAX: NumericKnob = NumericKnob {
    key: "network.connections_per_shard_max",
    unit: "connections",
    min: 16,
    max: 1 << 20,
    power_of_two: false,
    default: crate::server::CONNECTIONS_PER_SHARD_MAX as i64,
};

pub const CONNECTIONS_PER_ADDRESS_MAX: NumericKnob = NumericKnob {
    key: "network.connections_per_address_max",
    unit: "connections",
    min: 1,
    max: 1 << 20,
    power_of_two: false,
    default: crate::server::CONNECTIONS_PER_ADDRESS_MAX as i64,
};

pub const PARTIAL_FRAME_TIMEOUT_MS: NumericKnob = NumericKnob {
    key: "network.partial_frame_timeout_ms",
    unit: "ms",
    min: 0,
    max: 3_600_000,
    power_of_two: false,
    default: crate::server::PARTIAL_FRAME_TIMEOUT_MS as i64,
};

pub const ARRIVING_FRAMES_MAX_MIB: NumericKnob = NumericKnob {
    key: "network.arriving_frames_max_mib",
    unit: "MiB",
    min: 1,
    max: 64 * 1024,
    power_of_two: false,
    default: (crate::server::ARRIVING_FRAMES_MAX_BYTES >> 20) as i64,
};

pub const SHARD_OUTPUT_MAX_MIB: NumericKnob = NumericKnob {
    key: "network.shard_output_max_mib",
    unit: "MiB",
    min: 16,
    max: 1024 * 1024,
    power_of_two: false,
    default: (crate::server::SHARD_OUTPUT_MAX_BYTES >> 20) as i64,
};

/// Every numeric knob.
pub const NUMERIC_KNOBS: &[NumericKnob] = &[
    FLUSH_INTERVAL_MS,
    FLUSH_BATCH_KIB,
    SEGMENT_SIZE_MIB,
    ALLOCATION_WINDOW_MIB,
    READ_CACHE_MIB,
    RING_DEPTH_ENTRIES,
    IO_MEMORY_MIB,
    PREEMPT_TIMER_US,
    SPIN_BEFORE_PARK_US,
    WATCHDOG_MS,
    STORE_OPEN_STALL_MS,
    READ_BUFFER_KIB,
    OUTPUT_PAUSE_KIB,
    IN_FLIGHT_REQUESTS_MAX,
    CONNECTIONS_PER_SHARD_MAX,
    CONNECTIONS_PER_ADDRESS_MAX,
    PARTIAL_FRAME_TIMEOUT_MS,
    ARRIVING_FRAMES_MAX_MIB,
    SHARD_OUTPUT_MAX_MIB,
];

/// The knobs that are not plain integers, with the values they take.
pub const OTHER_KNOBS: &[(&str, &str)] = &[
    (
        "shards.cpus",
        "[\"all\" | a count 1..=256 | a list of online CPU ids]",
    ),
    ("shards.reserved_cpus", "[a list of online CPU ids]"),
    ("shards.pin", "[true | false]"),
    ("store.flush", "[\"sync\" | \"async\"]"),
];

const _: () = assert!(FLUSH_DIRTY_MAX_BYTES_LIMIT.is_multiple_of(1024));

/// A profile refused, or a flag out of bounds: which key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct ProfileError {
    /// Where the value came from: `profile NAME` or `--flag`.
    pub origin: String,
    /// The knob, `section.key` (or the whole file for a syntax error).
    pub key: String,
    pub reason: String,
}

impl ProfileError {
    /// `profile NAME: key: reason`, or `--flag (key): reason` for a flag.
    fn message(&self) -> String {
        match self.origin.starts_with("--") {
            true => format!("{} ({}): {}", self.origin, self.key, self.reason),
            false => format!("{}: {}: {}", self.origin, self.key, self.reason),
        }
    }
}

/// Which cores run shards, as a profile writes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum CpuChoice {
    /// "all" (anything else is refused by validation).
    Word(String),
    /// The first N online cores that are not reserved.
    Count(i64),
    /// Exactly these cores.
    List(Vec<i64>),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    description: Option<String>,
    #[serde(default)]
    shards: RawShards,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default)]
    network: RawNetwork,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShards {
    cpus: Option<CpuChoice>,
    reserved_cpus: Option<Vec<i64>>,
    pin: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    flush: Option<String>,
    flush_interval_ms: Option<i64>,
    flush_batch_kib: Option<i64>,
    segment_size_mib: Option<i64>,
    allocation_window_mib: Option<i64>,
    read_cache_mib: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    ring_depth_entries: Option<i64>,
    io_memory_mib: Option<i64>,
    preempt_timer_us: Option<i64>,
    spin_before_park_us: Option<i64>,
    watchdog_ms: Option<i64>,
    store_open_stall_ms: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    read_buffer_kib: Option<i64>,
    output_pause_kib: Option<i64>,
    in_flight_requests_max: Option<i64>,
    connections_per_shard_max: Option<i64>,
    connections_per_address_max: Option<i64>,
    partial_frame_timeout_ms: Option<i64>,
    arriving_frames_max_mib: Option<i64>,
    shard_output_max_mib: Option<i64>,
}

/// A parsed, not yet checked profile.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The name of an embedded profile, or the path it was read from.
    pub source: String,
    pub description: String,
    raw: RawProfile,
    /// `(key, flag)` for every knob a command-line flag replaced.
    overridden: Vec<(&'static str, &'static str)>,
    /// `--shards N` beyond the cores available floats the shards instead of refusing.
    count_may_float: bool,
}

/// Flags given explicitly on the command line; each replaces its knob.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--shards N`.
    pub shards: Option<usize>,
    /// `--cpus 0,2,4`.
    pub cpus: Option<Vec<usize>>,
    /// `--no-pin`.
    pub no_pin: bool,
    /// `--flush sync|async`.
    pub flush: Option<FlushMode>,
    /// `--flush-interval-ms`.
    pub flush_interval_ms: Option<u64>,
    /// `--segment-size-mib`.
    pub segment_size_mib: Option<u64>,
    /// `--allocation-window-mib`.
    pub allocation_window_mib: Option<u64>,
}

/// A checked profile, in the units the node uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    /// The profile's name or path.
    pub source: String,
    /// Cores and executor knobs of every shard.
    pub placement: ShardPlacement,
    /// Cores kept from shards (for the OS, interrupts or clients).
    pub reserved_cpus: Vec<usize>,
    pub flush_mode: FlushMode,
    pub flush_interval_ms: u64,
    pub flush_dirty_max_bytes: u64,
    pub segment_size_bytes: u64,
    pub allocation_window_bytes: u64,
    /// store.read_cache_mib: windows of 1 MiB each shard's read cache keeps.
    pub read_cache_windows: usize,
    /// runtime.store_open_stall_ms: a store open without progress this long is tried again.
    pub store_open_stall_ms: u64,
    pub connection_limits: ConnectionLimits,
}

/// Where a value came from, for messages.
struct Origin<'a> {
    profile: &'a Profile,
}

impl Origin<'_> {
    fn error(&self, key: &str, reason: String) -> ProfileError {
        let flag = self
            .profile
            .overridden
            .iter()
            .find(|(overridden, _)| *overridden == key)
            .map(|(_, flag)| *flag);
        let origin = match flag {
            Some(flag) => flag.to_string(),
            None => format!("profile {}", self.profile.source),
        };
        ProfileError {
            origin,
            key: key.to_string(),
            reason,
        }
    }
}

impl Profile {
    /// Parses `text`; `source` names it in messages.
    pub fn parse(source: &str, text: &str) -> Result<Profile, ProfileError> {
        let raw: RawProfile = toml::from_str(text).map_err(|error| ProfileError {
            origin: format!("profile {source}"),
            key: toml_error_key(&error, text),
            reason: error.message().to_string(),
        })?;
        Ok(Profile {
            source: source.to_string(),
            description: raw.description.clone().unwrap_or_default(),
            raw,
            overridden: Vec::new(),
            count_may_float: false,
        })
    }

    /// An embedded profile by name, or else a file by path.
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        if let Some((name, text)) = EMBEDDED_PROFILES
            .iter()
            .find(|(name, _)| *name == name_or_path)
        {
            return Profile::parse(name, text);
        }
        let path = Path::new(name_or_path);
        let refuse = |reason: String| ProfileError {
            origin: format!("profile {name_or_path}"),
            key: "(file)".into(),
            reason,
        };
        let metadata = std::fs::metadata(path).map_err(|error| {
            let names: Vec<_> = EMBEDDED_PROFILES.iter().map(|(name, _)| *name).collect();
            refuse(format!(
                "not a built-in profile ({}) and not a readable file: {error}",
                names.join(", ")
            ))
        })?;
        if metadata.len() > PROFILE_SIZE_MAX_BYTES {
            return Err(refuse(format!(
                "{} bytes is too large for a profile (at most {PROFILE_SIZE_MAX_BYTES})",
                metadata.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))?;
        Profile::parse(name_or_path, &text)
    }

    /// Replaces the knobs that explicit flags set.
    pub fn apply(&mut self, overrides: &Overrides) {
        let mut note = |key, flag| self.overridden.push((key, flag));
        if let Some(cpus) = &overrides.cpus {
            let list = cpus.iter().map(|&cpu| cpu as i64).collect();
            self.raw.shards.cpus = Some(CpuChoice::List(list));
            note("shards.cpus", "--cpus");
        } else if let Some(count) = overrides.shards {
            self.raw.shards.cpus = Some(CpuChoice::Count(count as i64));
            self.count_may_float = true;
            note("shards.cpus", "--shards");
        }
        if overrides.no_pin {
            self.raw.shards.pin = Some(false);
            note("shards.pin", "--no-pin");
        }
        if let Some(flush) = overrides.flush {
            let word = match flush {
                FlushMode::Sync => "sync",
                FlushMode::Async => "async",
            };
            self.raw.store.flush = Some(word.to_string());
            note("store.flush", "--flush");
        }
        let as_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        if let Some(interval) = overrides.flush_interval_ms {
            self.raw.store.flush_interval_ms = Some(as_i64(interval));
            note(FLUSH_INTERVAL_MS.key, "--flush-interval-ms");
        }
        if let Some(window) = overrides.allocation_window_mib {
            self.raw.store.allocation_window_mib = Some(as_i64(window));
            note(ALLOCATION_WINDOW_MIB.key, "--allocation-window-mib");
        }
        if let Some(size) = overrides.segment_size_mib {
            self.raw.store.segment_size_mib = Some(as_i64(size));
            note(SEGMENT_SIZE_MIB.key, "--segment-size-mib");
        }
    }

    /// Checks every knob against its bounds and `online` (the online CPU ids) and converts.
    pub fn resolve(&self, online: &[usize]) -> Result<Tuning, ProfileError> {
        let origin = Origin { profile: self };
        let (cpus, reserved, pin) = self.resolve_cpus(online, &origin)?;
        let raw = &self.raw;
        let number = |knob: NumericKnob, value: Option<i64>| {
            knob.check(value.unwrap_or(knob.default), &origin)
        };
        let flush_mode = match raw.store.flush.as_deref().unwrap_or("async") {
            word if word.eq_ignore_ascii_case("sync") || word == "SYNC_FLUSH" => FlushMode::Sync,
            word if word.eq_ignore_ascii_case("async") || word == "ASYNC_FLUSH" => FlushMode::Async,
            other => {
                return Err(origin.error(
                    "store.flush",
                    format!("{other:?} is not a flush mode: want \"sync\" or \"async\""),
                ))
            }
        };
        let shard_cpus: Vec<Option<usize>> = match pin {
            true => cpus.iter().map(|&cpu| Some(cpu)).collect(),
            false => vec![None; cpus.len()],
        };
        let float_cpus = if pin { Vec::new() } else { cpus.clone() };
        let placement = ShardPlacement {
            cpus: shard_cpus,
            float_cpus,
            helper_cpus: reserved.clone(),
            ring_depth_entries: number(RING_DEPTH_ENTRIES, raw.runtime.ring_depth_entries)?
                as usize,
            io_memory_bytes: (number(IO_MEMORY_MIB, raw.runtime.io_memory_mib)? << 20) as usize,
            preempt_timer_us: number(PREEMPT_TIMER_US, raw.runtime.preempt_timer_us)?,
            spin_before_park_us: number(SPIN_BEFORE_PARK_US, raw.runtime.spin_before_park_us)?,
            watchdog_ms: number(WATCHDOG_MS, raw.runtime.watchdog_ms)?,
        };
        let connection_limits = ConnectionLimits {
            read_chunk_bytes: (number(READ_BUFFER_KIB, raw.network.read_buffer_kib)? << 10)
                as usize,
            output_pause_bytes: (number(OUTPUT_PAUSE_KIB, raw.network.output_pause_kib)? << 10)
                as usize,
            in_flight_requests_max: number(
                IN_FLIGHT_REQUESTS_MAX,
                raw.network.in_flight_requests_max,
            )? as usize,
            connections_per_shard_max: number(
                CONNECTIONS_PER_SHARD_MAX,
                raw.network.connections_per_shard_max,
            )? as usize,
            connections_per_address_max: number(
                CONNECTIONS_PER_ADDRESS_MAX,
                raw.network.connections_per_address_max,
            )? as usize,
            partial_frame_timeout_ms: number(
                PARTIAL_FRAME_TIMEOUT_MS,
                raw.network.partial_frame_timeout_ms,
            )?,
            arriving_frames_max_bytes: (number(
                ARRIVING_FRAMES_MAX_MIB,
                raw.network.arriving_frames_max_mib,
            )? << 20) as usize,
            shard_output_max_bytes: (number(
                SHARD_OUTPUT_MAX_MIB,
                raw.network.shard_output_max_mib,
            )? << 20) as usize,
        };
        Ok(Tuning {
            source: self.source.clone(),
            placement,
            reserved_cpus: reserved,
            flush_mode,
            flush_interval_ms: number(FLUSH_INTERVAL_MS, raw.store.flush_interval_ms)?,
            flush_dirty_max_bytes: number(FLUSH_BATCH_KIB, raw.store.flush_batch_kib)? << 10,
            segment_size_bytes: number(SEGMENT_SIZE_MIB, raw.store.segment_size_mib)? << 20,
            allocation_window_bytes: number(
                ALLOCATION_WINDOW_MIB,
                raw.store.allocation_window_mib,
            )? << 20,
            read_cache_windows: number(READ_CACHE_MIB, raw.store.read_cache_mib)? as usize,
            store_open_stall_ms: number(STORE_OPEN_STALL_MS, raw.runtime.store_open_stall_ms)?,
            connection_limits,
        })
    }

    /// The shard cores (in shard order), the reserved cores and whether shards are pinned.
    fn resolve_cpus(
        &self,
        online: &[usize],
        origin: &Origin<'_>,
    ) -> Result<(Vec<usize>, Vec<usize>, bool), ProfileError> {
        let shards = &self.raw.shards;
        let mut pin = shards.pin.unwrap_or(true);
        let online_text = cpu_list_text(online);
        let reserved = check_cpu_list(
            "shards.reserved_cpus",
            shards.reserved_cpus.as_deref().unwrap_or_default(),
            online,
            origin,
        )?;
        let available: Vec<usize> = online
            .iter()
            .copied()
            .filter(|cpu| !reserved.contains(cpu))
            .collect();
        let choice = shards.cpus.clone().unwrap_or(CpuChoice::Word("all".into()));
        let cpus = match choice {
            CpuChoice::Word(word) if word == "all" => {
                if available.is_empty() {
                    return Err(origin.error(
                        "shards.reserved_cpus",
                        format!(
                            "reserves every online CPU ({online_text}); none is left for shards"
                        ),
                    ));
                }
                available
            }
            CpuChoice::Word(word) => {
                return Err(origin.error(
                    "shards.cpus",
                    format!("{word:?} is not \"all\", a count or a list of CPU ids"),
                ))
            }
            CpuChoice::Count(count) => {
                if !(1..=SHARDS_MAX as i64).contains(&count) {
                    return Err(origin.error(
                        "shards.cpus",
                        format!("{count} shards is out of bounds: want 1..={SHARDS_MAX}"),
                    ));
                }
                let count = count as usize;
                if count <= available.len() {
                    available[..count].to_vec()
                } else if self.count_may_float && !available.is_empty() {
                    // More shards than cores: they share the cores, unpinned.
                    pin = false;
                    (0..count).map(|i| available[i % available.len()]).collect()
                } else {
                    return Err(origin.error(
                        "shards.cpus",
                        format!(
                            "asks for {count} cores but only {} are online and not reserved \
                             ({})",
                            available.len(),
                            cpu_list_text(&available)
                        ),
                    ));
                }
            }
            CpuChoice::List(list) => {
                let cpus = check_cpu_list("shards.cpus", &list, online, origin)?;
                if cpus.is_empty() || cpus.len() > SHARDS_MAX {
                    return Err(origin.error(
                        "shards.cpus",
                        format!("lists {} CPUs: want 1..={SHARDS_MAX}", cpus.len()),
                    ));
                }
                if let Some(cpu) = cpus.iter().find(|cpu| reserved.contains(cpu)) {
                    return Err(origin.error(
                        "shards.cpus",
                        format!("names CPU {cpu}, which shards.reserved_cpus keeps from shards"),
                    ));
                }
                cpus
            }
        };
        Ok((cpus, reserved, pin))
    }
}

/// Checks a profile's CPU list: ids that are online, no repeats; keeps the given order.
fn check_cpu_list(
    key: &str,
    list: &[i64],
    online: &[usize],
    origin: &Origin<'_>,
) -> Result<Vec<usize>, ProfileError> {
    let mut seen = BTreeSet::new();
    let mut cpus = Vec::with_capacity(list.len());
    for &cpu in list {
        let known = usize::try_from(cpu).ok().filter(|cpu| online.contains(cpu));
        let Some(cpu) = known else {
            return Err(origin.error(
                key,
                format!(
                    "names CPU {cpu}, which is not online (online: {})",
                    cpu_list_text(online)
                ),
            ));
        };
        if !seen.insert(cpu) {
            return Err(origin.error(key, format!("names CPU {cpu} twice")));
        }
        cpus.push(cpu);
    }
    Ok(cpus)
}

/// `0-3,6,8-9`, as Linux writes CPU lists.
pub fn cpu_list_text(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut index = 0;
    while index < sorted.len() {
        let start = sorted[index];
        let mut end = start;
        while index + 1 < sorted.len() && sorted[index + 1] == end + 1 {
            index += 1;
            end += 1;
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        index += 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}

/// The `section.key` a TOML error points at, read from the line it names.
fn toml_error_key(error: &toml::de::Error, text: &str) -> String {
    let Some(span) = error.span() else {
        return "(file)".into();
    };
    let before = &text[..span.start.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    let line = text[line_start..].lines().next().unwrap_or_default();
    let section = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('[') && line.ends_with(']'))
        .map(|line| line.trim_matches(|c| c == '[' || c == ']').trim());
    match line.split_once('=') {
        Some((key, _)) if !line.trim_start().starts_with('[') => {
            let key = key.trim();
            match section {
                Some(section) => format!("{section}.{key}"),
                None => key.to_string(),
            }
        }
        _ => line.trim().to_string(),
    }
}

#[cfg(test)]
mod tests;
