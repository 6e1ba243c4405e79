//! RocketMQ's configuration files: `shardmq serve -c broker.conf`, `shardmq broker -c …`,
//! `shardmq namesrv -c namesrv.properties` read the property files a RocketMQ broker or
//! name server starts from (`mqbroker -c`), with RocketMQ's key names, so migrating a broker
//! is a copy of its file.
//!
//! A file is turned into command-line settings, never into a second configuration path: each
//! key that has a counterpart here becomes the flag it stands for (`listenPort=10911` is
//! `--broker-port 10911`), checked first so that a bad value is refused naming the key and
//! its line, and the command line, parsed after the file, wins over it. Keys RocketMQ knows
//! but that mean nothing here (JVM thread pools, page-cache settings, …) are accepted with one
//! line each saying why they are ignored (`keys.rs` lists every key RocketMQ 4.9 and 5.3 read);
//! anything else is refused as unknown, since RocketMQ would drop a misspelt key silently.
//! A value that would ask for what this build does not do (`brokerId=-1`,
//! `enableDLegerCommitLog=true`) is refused rather than ignored.
//!
//! Runs once at start, before the logger, on the main thread.

mod keys;

use std::path::{Path, PathBuf};

/// The largest configuration file read (RocketMQ's own are a few KiB).
pub const CONF_FILE_MAX_BYTES: u64 = 1 << 20;

/// Which role the file configures: a broker file for `serve` and `broker`, a namesrv one
/// for `namesrv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Serve,
    Broker,
    Namesrv,
}

/// One setting the file gives: the command-line argument (its clap id) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileArg {
    /// The argument's id (the field name in `main.rs`'s option structs).
    pub id: &'static str,
    pub value: String,
    /// The key and line it came from, for `--print-config` and error messages.
    pub key: String,
    pub line: usize,
}

/// A key accepted but without effect here, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    pub key: String,
    pub line: usize,
    pub reason: &'static str,
}

/// What one file says.
#[derive(Debug, Clone, Default)]
pub struct FileSettings {
    pub path: PathBuf,
    pub args: Vec<FileArg>,
    pub ignored: Vec<Ignored>,
}

/// Reads `path` for `role`; the error names the file, line and key.
pub fn load(path: &Path, role: Role) -> Result<FileSettings, String> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the configuration file {shown}: {e}"))?
        .len();
    if size > CONF_FILE_MAX_BYTES {
        return Err(format!(
            "{shown} is {size} bytes, larger than a configuration file can be \
             ({CONF_FILE_MAX_BYTES})"
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the configuration file {shown}: {e}"))?;
    let entries = parse_properties(&text).map_err(|e| format!("{shown}: {e}"))?;
    let base_dir = path.parent().unwrap_or(Path::new("."));
    translate(&entries, role, base_dir)
        .map(|(args, ignored)| FileSettings {
            path: path.to_path_buf(),
            args,
            ignored,
        })
        .map_err(|e| format!("{shown}: {e}"))
}

/// One `key=value` of a property file, with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
    pub line: usize,
}

/// Java's `Properties.load` format: `#` and `!` comments, `key=value`, `key: value` or
/// `key value`, a trailing backslash continuing the line, `\t \n \r \f \uXXXX` escapes; values
/// are trimmed (RocketMQ would refuse `listenPort=10911 ` with a NumberFormatException, we
/// read what was meant). A key given twice keeps its last value, as Java does.
pub fn parse_properties(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, raw)) = lines.next() {
        let first_line = index + 1;
        let mut logical = raw.trim_start().to_string();
        if logical.is_empty() || logical.starts_with('#') || logical.starts_with('!') {
            continue;
        }
        while ends_with_odd_backslashes(&logical) {
            logical.pop();
            match lines.next() {
                Some((_, next)) => logical.push_str(next.trim_start()),
                None => break,
            }
        }
        let (key, value) = split_key_value(&logical);
        let key = unescape(key).map_err(|e| format!("line {first_line}: {e}"))?;
        let value = unescape(value).map_err(|e| format!("line {first_line}, key {key}: {e}"))?;
        entries.retain(|entry| entry.key != key);
        entries.push(Entry {
            key,
            value: value.trim().to_string(),
            line: first_line,
        });
    }
    Ok(entries)
}

fn ends_with_odd_backslashes(line: &str) -> bool {
    line.bytes().rev().take_while(|b| *b == b'\\').count() % 2 == 1
}

/// The key ends at the first unescaped `=`, `:` or white space; one `=`/`:` after the white
/// space is part of the separator.
fn split_key_value(line: &str) -> (&str, &str) {
    let bytes = line.as_bytes();
    let mut end = bytes.len();
    let mut escaped = false;
    for (at, byte) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if *byte == b'\\' {
            escaped = true;
        } else if matches!(byte, b'=' | b':' | b' ' | b'\t' | b'\x0c') {
            end = at;
            break;
        }
    }
    let key = &line[..end];
    let rest = line[end..].trim_start_matches([' ', '\t', '\x0c']);
    let rest = rest
        .strip_prefix('=')
        .or_else(|| rest.strip_prefix(':'))
        .unwrap_or(rest);
    (key, rest.trim_start_matches([' ', '\t', '\x0c']))
}

fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('f') => out.push('\x0c'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 4)
                    .and_then(char::from_u32)
                    .ok_or_else(|| format!("bad \\u escape \\u{hex}"))?;
                out.push(code);
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    Ok(out)
}

/// What a key's value becomes.
enum Action {
    /// `--flag value`.
    Set(&'static str, String),
    /// Nothing to pass (the value is what this build does anyway).
    Nothing,
    Ignore(&'static str),
}

/// How a key maps, or None when it has no counterpart.
fn map_key(key: &str, value: &str, role: Role, base_dir: &Path) -> Option<Result<Action, String>> {
    use Action::*;
    let set = |id: &'static str| Some(Ok(Set(id, value.to_string())));
    let number = |id: &'static str| {
        Some(
            value
                .parse::<u64>()
                .map(|_| Set(id, value.to_string()))
                .map_err(|_| format!("{value:?} is not a whole number")),
        )
    };
    let switch = |id: &'static str| Some(java_bool(value).map(|on| Set(id, on.to_string())));
    if role == Role::Namesrv {
        return match key {
            "listenPort" => port(value, "namesrv_port"),
            _ => None,
        };
    }
    match key {
        "brokerClusterName" => set("cluster_name"),
        "brokerName" => set("broker_name"),
        "brokerId" => Some(match value.parse::<u64>() {
            Ok(_) => Ok(Set("broker_id", value.to_string())),
            Err(_) => Err(format!(
                "{value}: a brokerId is 0 (a master) or more (a slave); controller mode (-1) \
                 is not served: classic master/slave replication is"
            )),
        }),
        "brokerRole" => {
            Some(crate::ha::BrokerRole::parse(value).map(|_| Set("broker_role", value.to_string())))
        }
        "haMasterAddress" => set("ha_master_address"),
        "haSendHeartbeatInterval" => number("ha_send_heartbeat_interval"),
        "haHousekeepingInterval" => number("ha_housekeeping_interval"),
        "haTransferBatchSize" => number("ha_transfer_batch_size"),
        "haMaxGapNotInSync" | "haSlaveFallbehindMax" => number("ha_max_gap_not_in_sync"),
        "slaveTimeout" => number("slave_timeout"),
        "slaveReadEnable" => switch("slave_read_enable"),
        "haResetWhenBehind" => switch("ha_reset_when_behind"),
        "segmentRecycleEnable" => switch("segment_recycle_enable"),
        "haListenPort" => port(value, "ha_listen_port"),
        "listenPort" => port(value, "broker_port"),
        "namesrvAddr" => match role {
            Role::Broker => set("namesrv"),
            _ => Some(Ok(Ignore(
                "`serve` registers with its own name server; `shardmq broker -c` uses it",
            ))),
        },
        "brokerIP1" => Some(
            value
                .parse::<std::net::Ipv4Addr>()
                .map(|_| Set("broker_ip", value.to_string()))
                .map_err(|_| format!("{value:?} is not an IPv4 address")),
        ),
        "storePathRootDir" => set("data_dir"),
        "storePathCommitLog" => Some(Ok(Nothing)),
        "mapedFileSizeCommitLog" | "mappedFileSizeCommitLog" => Some(segment_size(value)),
        "flushDiskType" => Some(match value {
            "ASYNC_FLUSH" => Ok(Set("flush", "async".into())),
            "SYNC_FLUSH" => Ok(Set("flush", "sync".into())),
            _ => Err(format!("{value:?} is not ASYNC_FLUSH or SYNC_FLUSH")),
        }),
        "flushIntervalCommitLog" => number("flush_interval_ms"),
        "fileReservedTime" => Some(
            value
                .parse::<f64>()
                .map(|_| Set("file_reserved_time", value.to_string()))
                .map_err(|_| format!("{value:?} is not a number of hours")),
        ),
        "deleteWhen" => set("delete_when"),
        "diskMaxUsedSpaceRatio" => number("disk_max_used_space_ratio"),
        "diskSpaceCleanForciblyRatio" => number("disk_space_clean_forcibly_ratio"),
        "diskSpaceWarningLevelRatio" => number("disk_space_warning_level_ratio"),
        "cleanFileForciblyEnable" => switch("clean_file_forcibly_enable"),
        "cleanResourceInterval" => number("clean_resource_interval"),
        "deleteCommitLogFilesInterval" => number("delete_commit_log_files_interval"),
        "messageDelayLevel" => set("message_delay_level"),
        "transactionTimeOut" => number("transaction_timeout_ms"),
        "transactionCheckInterval" => number("transaction_check_interval_ms"),
        "transactionCheckMax" => number("transaction_check_max"),
        "autoCreateTopicEnable" => switch("auto_create_topic_enable"),
        "defaultTopicQueueNums" => number("default_topic_queue_nums"),
        "metricsPromExporterPort" => port(value, "metrics_port"),
        "aclEnable" => Some(java_bool(value).and_then(|on| acl_file(on, base_dir))),
        "maxMessageSize" => Some(match value.parse::<usize>() {
            Ok(size) if size == shards::limits::MESSAGE_SIZE_MAX_BYTES => Ok(Nothing),
            _ => Err(format!(
                "maxMessageSize {value}: messages are limited to {} bytes in this build \
                 (RocketMQ's default) and that is the only value taken",
                shards::limits::MESSAGE_SIZE_MAX_BYTES
            )),
        }),
        "enableDLegerCommitLog" | "enableControllerMode" | "enableSlaveActingMaster" => {
            Some(java_bool(value).and_then(|on| match on {
                false => Ok(Nothing),
                true => Err(format!(
                    "{key}=true asks for DLedger or controller replication; this build runs \
                     RocketMQ's classic master/slave (brokerRole, brokerId)"
                )),
            }))
        }
        "autoCreateSubscriptionGroup" => Some(java_bool(value).and_then(|on| {
            match on {
                true => Ok(Nothing),
                false => Err(
                    "groups are always created on first use here; false cannot be \
                          honoured"
                        .to_string(),
                ),
            }
        })),
        _ => None,
    }
}

fn port(value: &str, id: &'static str) -> Option<Result<Action, String>> {
    Some(
        value
            .parse::<u16>()
            .map(|_| Action::Set(id, value.to_string()))
            .map_err(|_| format!("{value:?} is not a port (0-65535)")),
    )
}

/// Java's Boolean.parseBoolean takes anything but "true" as false; a typo there would
/// silently turn a feature off, so only true and false (any case) are taken.
pub fn java_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{value:?} is not true or false")),
    }
}

fn segment_size(value: &str) -> Result<Action, String> {
    let bytes: u64 = value
        .parse()
        .map_err(|_| format!("{value:?} is not a size in bytes"))?;
    if bytes == 0 || !bytes.is_multiple_of(1 << 20) {
        return Err(format!(
            "{bytes} bytes: commitlog segments here are whole MiB (RocketMQ's default is \
             1073741824)"
        ));
    }
    Ok(Action::Set("segment_size_mib", (bytes >> 20).to_string()))
}

/// RocketMQ reads its accounts from `conf/plain_acl.yml` beside broker.conf
/// (`${rocketmq.home.dir}/conf`); so does this.
fn acl_file(on: bool, base_dir: &Path) -> Result<Action, String> {
    if !on {
        return Ok(Action::Nothing);
    }
    let path = base_dir.join("plain_acl.yml");
    if !path.is_file() {
        return Err(format!(
            "aclEnable=true reads the accounts from plain_acl.yml beside the configuration \
             file, and {} is not there (or give --acl-file)",
            path.display()
        ));
    }
    Ok(Action::Set("acl_file", path.display().to_string()))
}

fn translate(
    entries: &[Entry],
    role: Role,
    base_dir: &Path,
) -> Result<(Vec<FileArg>, Vec<Ignored>), String> {
    let mut args = Vec::new();
    let mut ignored = Vec::new();
    let root = entries
        .iter()
        .find(|entry| entry.key == "storePathRootDir")
        .map(|entry| PathBuf::from(&entry.value));
    for entry in entries {
        let (key, value, line) = (entry.key.as_str(), entry.value.as_str(), entry.line);
        if key == "storePathCommitLog" {
            check_commitlog_path(value, root.as_deref()).map_err(|e| at(line, key, e))?;
        }
        let action = match map_key(key, value, role, base_dir) {
            Some(action) => action.map_err(|e| at(line, key, e))?,
            None if known(key, role) => Action::Ignore(ignored_reason(key)),
            None => {
                return Err(format!(
                    "line {line}: unknown key {key:?} (not one RocketMQ's {} reads; a typo?)",
                    match role {
                        Role::Namesrv => "namesrv",
                        _ => "broker",
                    }
                ))
            }
        };
        let (id, value) = match action {
            Action::Set(id, value) => (id, value),
            Action::Nothing => continue,
            Action::Ignore(reason) => {
                ignored.push(Ignored {
                    key: key.to_string(),
                    line,
                    reason,
                });
                continue;
            }
        };
        args.push(FileArg {
            id,
            value,
            key: key.to_string(),
            line,
        });
    }
    Ok((args, ignored))
}

fn at(line: usize, key: &str, error: String) -> String {
    format!("line {line}, {key}: {error}")
}

/// Each shard keeps its commitlog under the data directory (`shard-<i>/commitlog`), so the
/// only storePathCommitLog that can be honoured is RocketMQ's default, `<root>/commitlog`.
fn check_commitlog_path(value: &str, root: Option<&Path>) -> Result<(), String> {
    let wanted = root.map(|root| root.join("commitlog"));
    match wanted {
        Some(wanted) if Path::new(value) == wanted => Ok(()),
        _ => Err(format!(
            "{value}: each shard's commitlog lives under storePathRootDir here, so only \
             <storePathRootDir>/commitlog (RocketMQ's default) can be taken"
        )),
    }
}

fn known(key: &str, role: Role) -> bool {
    let found = |list: &[&str]| list.binary_search(&key).is_ok();
    found(keys::BROKER_KEYS) || (role == Role::Namesrv && found(keys::NAMESRV_KEYS))
}

/// Why a key RocketMQ reads means nothing here: by the family its name belongs to.
fn ignored_reason(key: &str) -> &'static str {
    let has = |words: &[&str]| words.iter().any(|word| key.contains(word));
    if has(&["Thread", "thread", "QueueCapacity", "PoolNums"]) {
        "a JVM thread pool or its queue: each shard serves its connections on its own core"
    } else if key.starts_with("server") || key.starts_with("client") || has(&["Netty", "Epoll"]) {
        "a Netty setting: connections are served through io_uring on the shards"
    } else if has(&[
        "transientStorePool",
        "PageCache",
        "Mmap",
        "mmap",
        "warmMapedFile",
    ]) || has(&[
        "flushLeast",
        "FlushLeast",
        "MappedFile",
        "mappedFile",
        "mapedFile",
    ]) {
        "a page-cache or memory-map setting: the commitlog is written with O_DIRECT and \
         group commit"
    } else if key.starts_with("ha")
        || has(&["Slave", "slave", "Master", "brokerIP2"])
        || has(&[
            "Replica",
            "InSync",
            "Controller",
            "controller",
            "DLeger",
            "dLeger",
        ])
    {
        "a replication setting of RocketMQ's other HA modes (DLedger, controller, acting \
         master, flow control) or of the JVM broker's HA threads: classic master/slave runs \
         with brokerRole, brokerId, haMasterAddress and the ha* intervals"
    } else if has(&["Pop", "pop", "revive", "Revive"]) {
        "RocketMQ 5's POP consumption is not served"
    } else if has(&[
        "Timer",
        "timer",
        "Rocksdb",
        "RocksDB",
        "rocksdb",
        "Compaction",
    ]) {
        "a store layout of RocketMQ 5 (timer log, RocksDB, compaction) that is not used here"
    } else if has(&["rocketmqHome", "kvConfigPath", "configStorePath"]) {
        "a path of RocketMQ's install tree; shardmq keeps everything under its data directory"
    } else {
        "no counterpart in shardmq; accepted so RocketMQ's files load unchanged"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<(String, String)> {
        parse_properties(text)
            .unwrap()
            .into_iter()
            .map(|entry| (entry.key, entry.value))
            .collect()
    }

    #[test]
    fn java_properties_syntax() {
        let text = "# comment\n! also\n  brokerName = broker-a\nlistenPort:10911\n\
                    deleteWhen 04\nmessageDelayLevel=1s 5s \\\n   10s\nx=\\u0041\\tb\n\
                    brokerName=broker-b\nempty=\n";
        assert_eq!(
            entries(text),
            vec![
                ("listenPort".into(), "10911".into()),
                ("deleteWhen".into(), "04".into()),
                ("messageDelayLevel".into(), "1s 5s 10s".into()),
                ("x".into(), "A\tb".into()),
                ("brokerName".into(), "broker-b".into()),
                ("empty".into(), "".into()),
            ]
        );
        assert!(parse_properties("k=\\u00zz").is_err());
    }

    #[test]
    fn distribution_file_maps_to_flags() {
        let text = "brokerClusterName=DefaultCluster\nbrokerName=broker-a\nbrokerId=0\n\
                    deleteWhen=04\nfileReservedTime=48\nbrokerRole=ASYNC_MASTER\n\
                    flushDiskType=ASYNC_FLUSH\nsendMessageThreadPoolNums=16\n";
        let entries = parse_properties(text).unwrap();
        let (args, ignored) = translate(&entries, Role::Serve, Path::new(".")).unwrap();
        let pairs: Vec<_> = args.iter().map(|arg| (arg.id, arg.value.clone())).collect();
        assert_eq!(
            pairs,
            vec![
                ("cluster_name", "DefaultCluster".to_string()),
                ("broker_name", "broker-a".to_string()),
                ("broker_id", "0".to_string()),
                ("delete_when", "04".to_string()),
                ("file_reserved_time", "48".to_string()),
                ("broker_role", "ASYNC_MASTER".to_string()),
                ("flush", "async".to_string()),
            ]
        );
        assert_eq!(ignored.len(), 1);
        assert!(ignored[0].reason.contains("thread pool"), "{ignored:?}");
    }

    #[test]
    fn refusals_name_the_key() {
        let refuse = |text: &str| {
            let entries = parse_properties(text).unwrap();
            translate(&entries, Role::Serve, Path::new("/nonexistent")).unwrap_err()
        };
        assert!(refuse("listenPort=abc").contains("line 1, listenPort"));
        assert!(refuse("brokerRole=slave").contains("is not a broker role"));
        assert!(refuse("brokerId=-1").contains("controller mode"));
        assert!(refuse("brokerNmae=x").contains("unknown key \"brokerNmae\""));
        assert!(refuse("autoCreateTopicEnable=yes").contains("not true or false"));
        assert!(refuse("mappedFileSizeCommitLog=1000").contains("whole MiB"));
        assert!(refuse("aclEnable=true").contains("plain_acl.yml"));
        assert!(
            refuse("storePathRootDir=/a\nstorePathCommitLog=/b/commitlog")
                .contains("storePathCommitLog")
        );
        let fine = "storePathRootDir=/a\nstorePathCommitLog=/a/commitlog\naclEnable=false";
        let entries = parse_properties(fine).unwrap();
        let (args, _) = translate(&entries, Role::Serve, Path::new(".")).unwrap();
        assert_eq!(args.len(), 1);
        assert_eq!(args[0].id, "data_dir");
    }

    #[test]
    fn namesrv_role() {
        let entries = parse_properties("listenPort=9877\nrocketmqHome=/opt/rmq\n").unwrap();
        let (args, ignored) = translate(&entries, Role::Namesrv, Path::new(".")).unwrap();
        assert_eq!(args[0].id, "namesrv_port");
        assert_eq!(ignored[0].key, "rocketmqHome");
    }

    #[test]
    fn key_lists_are_sorted_for_binary_search() {
        assert!(keys::BROKER_KEYS.windows(2).all(|w| w[0] < w[1]));
        assert!(keys::NAMESRV_KEYS.windows(2).all(|w| w[0] < w[1]));
        assert!(known("sendMessageThreadPoolNums", Role::Serve));
        assert!(known("rocketmqHome", Role::Namesrv));
    }
}
