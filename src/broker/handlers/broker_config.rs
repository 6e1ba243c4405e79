//! GET_BROKER_CONFIG (26), UPDATE_BROKER_CONFIG (25) and VIEW_BROKER_STATS_DATA (315), as
//! AdminBrokerProcessor answers them, so `mqadmin getBrokerConfig / updateBrokerConfig /
//! statsAll`, rocketmq-exporter and rocketmq-dashboard work unchanged.
//!
//! The config is this shard's, with RocketMQ's key names (`listenPort` is the shard's own
//! port), as properties text (`key=value` lines, MixAll.properties2String) and the config's
//! data version in the `version` ext field. An update changes only what can change while the
//! shard runs (retention, topic auto-creation, and brokerRole/brokerId for a slave's
//! promotion, `ha::promote`); any other key is refused naming it, and
//! nothing is applied unless every key is. An update is saved before it is applied, as
//! RocketMQ's Configuration.persist saves it, in the shard's `config/broker.properties` (the
//! keys changed live, nothing else), and the shard applies that file when it starts again,
//! over its flags and `-c` file (logged, one line per key); deleting the file goes back to
//! them.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// The file of a shard's live updates, under its config directory (RocketMQ's name).
pub const LIVE_CONFIG_FILE: &str = "broker.properties";

/// The file of the live updates of the shard whose directory is `shard_dir`.
fn live_config_path(shard_dir: &std::path::Path) -> std::path::PathBuf {
    shard_dir.join("config").join(LIVE_CONFIG_FILE)
}

/// The live updates an earlier run saved in the shard directory `shard_dir`: None when there
/// are none; an error naming the file when it cannot be read or parsed.
fn saved_live_entries(
    shard_dir: &std::path::Path,
) -> Result<Option<Vec<crate::conf::Entry>>, String> {
    let path = live_config_path(shard_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    };
    crate::conf::parse_properties(&text)
        .map(Some)
        .map_err(|why| format!("{} left unread: {why}", path.display()))
}

/// The value a live update of an earlier run saved for `key` in the shard directory
/// `shard_dir` (`config/broker.properties`), for what the shard reads before it applies that
/// file (`segmentRecycleEnable` at the store's open); None when none is saved or the file
/// cannot be read (`apply_saved_live_config` says why).
pub fn saved_live_value(shard_dir: &std::path::Path, key: &str) -> Option<String> {
    let entries = saved_live_entries(shard_dir).ok().flatten()?;
    entries.into_iter().find(|e| e.key == key).map(|e| e.value)
}

/// Keys UPDATE_BROKER_CONFIG changes live.
pub const LIVE_KEYS: [&str; 12] = [
    "fileReservedTime",
    "deleteWhen",
    "diskMaxUsedSpaceRatio",
    "diskSpaceCleanForciblyRatio",
    "diskSpaceWarningLevelRatio",
    "cleanFileForciblyEnable",
    "cleanResourceInterval",
    "deleteCommitLogFilesInterval",
    "segmentRecycleEnable",
    "autoCreateTopicEnable",
    "brokerRole",
    "brokerId",
];

impl Broker {
    /// The shard's settings under RocketMQ's keys.
    pub fn broker_config(&self) -> BTreeMap<&'static str, String> {
        let store = self.store.config();
        let retention = self.retention.config();
        let transactions = self.transactions.borrow().config;
        let flush = match store.flush_mode {
            shards::store::FlushMode::Sync => "SYNC_FLUSH",
            shards::store::FlushMode::Async => "ASYNC_FLUSH",
        };
        let delete_when: Vec<String> = retention
            .delete_when_hours
            .iter()
            .map(|hour| format!("{hour:02}"))
            .collect();
        let store_root = store.root_dir.display().to_string();
        let pairs = [
            ("brokerClusterName", self.identity.cluster_name.clone()),
            ("brokerName", self.identity.broker_name.clone()),
            ("brokerId", self.ha.broker_id().to_string()),
            ("brokerRole", self.ha.role().name().into()),
            (
                "haMasterAddress",
                self.ha
                    .master
                    .ha_address
                    .borrow()
                    .map_or(String::new(), |a| a.to_string()),
            ),
            (
                "haListenPort",
                self.ha
                    .config
                    .listen_address(std::net::SocketAddr::V4(self.identity.address))
                    .port()
                    .to_string(),
            ),
            (
                "haSendHeartbeatInterval",
                self.ha.config.heartbeat_interval_ms.to_string(),
            ),
            (
                "haHousekeepingInterval",
                self.ha.config.housekeeping_interval_ms.to_string(),
            ),
            (
                "haTransferBatchSize",
                self.ha.config.transfer_batch_bytes.to_string(),
            ),
            (
                "haMaxGapNotInSync",
                self.ha.config.max_gap_bytes.to_string(),
            ),
            ("slaveTimeout", self.ha.config.slave_timeout_ms.to_string()),
            (
                "slaveReadEnable",
                self.ha.config.slave_read_enable.to_string(),
            ),
            ("brokerIP1", self.identity.address.ip().to_string()),
            ("listenPort", self.identity.address.port().to_string()),
            ("storePathRootDir", store_root.clone()),
            ("storePathCommitLog", format!("{store_root}/commitlog")),
            (
                "mappedFileSizeCommitLog",
                store.segment_size_bytes.to_string(),
            ),
            ("flushDiskType", flush.into()),
            (
                "flushIntervalCommitLog",
                store.flush_interval_ms.to_string(),
            ),
            (
                "fileReservedTime",
                retention.file_reserved_time_hours.to_string(),
            ),
            ("deleteWhen", delete_when.join(";")),
            (
                "diskMaxUsedSpaceRatio",
                retention.disk_max_used_space_ratio.to_string(),
            ),
            (
                "diskSpaceCleanForciblyRatio",
                retention.disk_space_clean_forcibly_ratio.to_string(),
            ),
            (
                "diskSpaceWarningLevelRatio",
                retention.disk_space_warning_level_ratio.to_string(),
            ),
            (
                "cleanFileForciblyEnable",
                retention.clean_file_forcibly_enable.to_string(),
            ),
            (
                "cleanResourceInterval",
                retention.clean_resource_interval_ms.to_string(),
            ),
            (
                "deleteCommitLogFilesInterval",
                retention.delete_commit_log_files_interval_ms.to_string(),
            ),
            (
                "segmentRecycleEnable",
                retention.segment_recycle_enable.to_string(),
            ),
            (
                "autoCreateTopicEnable",
                self.topics.borrow().auto_create_topic_enable().to_string(),
            ),
            (
                "messageDelayLevel",
                delay_level_text(&self.schedule.borrow().levels),
            ),
            ("transactionTimeOut", transactions.timeout_ms.to_string()),
            (
                "transactionCheckInterval",
                transactions.check_interval_ms.to_string(),
            ),
            ("transactionCheckMax", transactions.check_max.to_string()),
            (
                "maxMessageSize",
                shards::limits::MESSAGE_SIZE_MAX_BYTES.to_string(),
            ),
            ("aclEnable", self.acl_enabled.to_string()),
        ];
        pairs.into_iter().collect()
    }

    pub(crate) fn get_broker_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body: String = self
            .broker_config()
            .iter()
            .map(|(key, value)| format!("{key}={value}\n"))
            .collect();
        let version = serde_json::json!({
            "counter": self.config_version.get(),
            "stateVersion": 0,
            "timestamp": self.stats.started_at_ms.get(),
        })
        .to_string();
        if !request.is_oneway() {
            connection.send_with(|out| {
                let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
                frame.ext("version", &version);
                frame.finish(body.as_bytes())
            });
        }
        Ok(())
    }

    pub(crate) fn update_broker_config(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let text = std::str::from_utf8(request.body)
            .map_err(|_| RequestError::SystemError("the config body is not UTF-8 text".into()))?;
        let entries = crate::conf::parse_properties(text).map_err(RequestError::SystemError)?;
        if entries.is_empty() {
            // Nothing to change, so nothing to save (RocketMQ answers SUCCESS here too).
            connection.respond_body(request, b"");
            return Ok(());
        }
        let mut settings = self.live_settings();
        for entry in &entries {
            let (key, value) = (entry.key.as_str(), entry.value.as_str());
            apply_live(key, value, &mut settings)
                .map_err(|why| RequestError::SystemError(format!("{key}={value}: {why}")))?;
        }
        settings
            .retention
            .validate()
            .map_err(RequestError::SystemError)?;
        let role_change = self
            .role_change(settings.role, settings.broker_id)
            .map_err(RequestError::SystemError)?;
        if self.live_config.saving.get() {
            return Err(RequestError::SystemBusy(
                "another UPDATE_BROKER_CONFIG is being saved, try again".into(),
            ));
        }
        let mut saved = self.live_config.saved.borrow().clone();
        for entry in &entries {
            saved.insert(entry.key.clone(), entry.value.clone());
        }
        // A promotion: the stream from the old master appends nothing more, so the log's end
        // now is where this shard's own log begins.
        let epoch = match role_change {
            Some(_) if self.ha.is_slave() => {
                self.ha.halted.set(true);
                Some(crate::ha::epoch::Epoch {
                    start_offset: self.store.max_physical_offset().0,
                    promoted_at_ms: crate::error::now_ms().max(0) as u64,
                })
            }
            _ => None,
        };
        let path = live_config_path(&self.identity.shard_dir);
        let epoch_path = crate::ha::epoch::master_epoch_path(&self.identity.shard_dir);
        let bytes = live_config_text(&saved).into_bytes();
        let keys: Vec<String> = entries.iter().map(|entry| entry.key.clone()).collect();
        let (broker, connection) = (self.clone(), connection.clone());
        let (in_flight, opaque, oneway) =
            (connection.in_flight(), request.opaque, request.is_oneway());
        self.live_config.saving.set(true);
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let target = path.clone();
            let written = shards::runtime::blocking(move || {
                // The epoch first: a role saved without it would let an old master's tail in.
                if let Some(epoch) = epoch {
                    epoch.save(&epoch_path)?;
                }
                crate::persist::write_file_durably(&target, &bytes)
            })
            .await;
            broker.live_config.saving.set(false);
            if let Err(why) = written {
                broker.ha.halted.set(false);
                let error = RequestError::SystemError(format!(
                    "the update could not be saved in {} ({why}); nothing was changed",
                    path.display()
                ));
                log::warn!(
                    "{}: UPDATE_BROKER_CONFIG: {error}",
                    broker.identity.broker_name
                );
                if !oneway {
                    error.respond(&connection, opaque);
                }
                return;
            }
            *broker.live_config.saved.borrow_mut() = saved;
            broker.retention.set_config(settings.retention);
            broker
                .topics
                .borrow_mut()
                .set_auto_create_topic_enable(settings.auto_create);
            if let Some(role) = role_change {
                broker.take_role(role, epoch.unwrap_or(broker.ha.epoch.get()));
            }
            broker.config_version.set(broker.config_version.get() + 1);
            log::info!(
                "{}: UPDATE_BROKER_CONFIG from {} changed {} (saved in {})",
                broker.identity.broker_name,
                connection.peer,
                keys.join(", "),
                path.display()
            );
            if !oneway {
                connection.respond_body_to(opaque, b"");
            }
        });
        Ok(())
    }

    /// The settings UPDATE_BROKER_CONFIG changes, as they are now.
    fn live_settings(&self) -> LiveSettings {
        LiveSettings {
            retention: self.retention.config(),
            auto_create: self.topics.borrow().auto_create_topic_enable(),
            role: None,
            broker_id: None,
        }
    }

    /// Applies the live updates saved by an earlier run (`config/broker.properties`) over
    /// the settings the shard started with; a key that no longer applies is logged and left.
    pub(crate) fn apply_saved_live_config(&self) {
        let shard_dir = &self.identity.shard_dir;
        let path = live_config_path(shard_dir);
        let entries = match saved_live_entries(shard_dir) {
            Ok(Some(entries)) => entries,
            Ok(None) => return,
            Err(why) => return log::warn!("{}: {why}", self.identity.broker_name),
        };
        let mut settings = self.live_settings();
        let mut saved = BTreeMap::new();
        for entry in entries {
            let mut tried = settings.clone();
            let applied = apply_live(&entry.key, &entry.value, &mut tried)
                .and_then(|()| tried.retention.validate());
            match applied {
                Ok(()) => {
                    log::info!(
                        "{}: {}={} from {}:{} (an UPDATE_BROKER_CONFIG of an earlier run)",
                        self.identity.broker_name,
                        entry.key,
                        entry.value,
                        path.display(),
                        entry.line
                    );
                    settings = tried;
                    saved.insert(entry.key, entry.value);
                }
                Err(why) => log::warn!(
                    "{}: {}:{}: {}={} not applied: {why}",
                    self.identity.broker_name,
                    path.display(),
                    entry.line,
                    entry.key,
                    entry.value
                ),
            }
        }
        self.retention.set_config(settings.retention);
        self.topics
            .borrow_mut()
            .set_auto_create_topic_enable(settings.auto_create);
        // A promotion of an earlier run: the shard starts as the master it became.
        let role = settings.role.unwrap_or(self.ha.role());
        let broker_id = settings.broker_id.unwrap_or(self.ha.broker_id());
        let checked = crate::ha::HaConfig {
            role,
            broker_id,
            ..self.ha.config.clone()
        };
        match checked.validate() {
            Ok(()) => self.ha.set_role(role, broker_id),
            Err(why) => log::error!(
                "{}: brokerRole {} brokerId {broker_id} of {} not applied: {why}",
                self.identity.broker_name,
                role.name(),
                path.display()
            ),
        }
        *self.live_config.saved.borrow_mut() = saved;
    }

    /// VIEW_BROKER_STATS_DATA (315): one BrokerStatsManager item's minute, hour and day.
    pub(crate) fn view_broker_stats_data(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let name = request.ext_fields.required("statsName")?;
        let key = request.ext_fields.required("statsKey")?;
        let windows = self.stats.history.borrow().windows(name, key);
        let Some([minute, hour, day]) = windows else {
            return Err(RequestError::SystemError(format!(
                "The stats <{name}> <{key}> not exist"
            )));
        };
        let item = |window: crate::broker::store_stats::Window| serde_json::json!({ "avgpt": window.avgpt, "sum": window.sum, "tps": window.tps });
        let body = serde_json::json!({
            "statsDay": item(day),
            "statsHour": item(hour),
            "statsMinute": item(minute),
        })
        .to_string();
        connection.respond_body(request, body.as_bytes());
        Ok(())
    }
}

/// What UPDATE_BROKER_CONFIG changes.
#[derive(Clone)]
struct LiveSettings {
    retention: shards::store::RetentionConfig,
    auto_create: bool,
    /// brokerRole and brokerId, when asked: a promotion (`ha::promote`).
    role: Option<crate::ha::BrokerRole>,
    broker_id: Option<u64>,
}

/// One key of UPDATE_BROKER_CONFIG applied to the settings being built.
fn apply_live(key: &str, value: &str, settings: &mut LiveSettings) -> Result<(), String> {
    let retention = &mut settings.retention;
    let number = |value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| "not a whole number".to_string())
    };
    let flag = crate::conf::java_bool;
    let ratio = |value: &str| {
        value
            .parse::<u32>()
            .map_err(|_| "not a whole percentage".to_string())
    };
    match key {
        "fileReservedTime" => {
            retention.file_reserved_time_hours =
                value.parse().map_err(|_| "not a number of hours")?;
        }
        "deleteWhen" => retention.delete_when_hours = shards::store::parse_delete_when(value)?,
        "diskMaxUsedSpaceRatio" => retention.disk_max_used_space_ratio = ratio(value)?,
        "diskSpaceCleanForciblyRatio" => retention.disk_space_clean_forcibly_ratio = ratio(value)?,
        "diskSpaceWarningLevelRatio" => retention.disk_space_warning_level_ratio = ratio(value)?,
        "cleanFileForciblyEnable" => retention.clean_file_forcibly_enable = flag(value)?,
        "cleanResourceInterval" => retention.clean_resource_interval_ms = number(value)?,
        "deleteCommitLogFilesInterval" => {
            retention.delete_commit_log_files_interval_ms = number(value)?
        }
        "segmentRecycleEnable" => retention.segment_recycle_enable = flag(value)?,
        "autoCreateTopicEnable" => settings.auto_create = flag(value)?,
        "brokerRole" => settings.role = Some(crate::ha::BrokerRole::parse(value)?),
        "brokerId" => settings.broker_id = Some(number(value)?),
        _ => {
            return Err(format!(
                "cannot change while the broker runs (live keys: {}); set it in the -c file \
                 or its flag and restart",
                LIVE_KEYS.join(", ")
            ))
        }
    }
    Ok(())
}

/// The live updates saved so far, and whether a save is under way.
#[derive(Default)]
pub struct LiveConfig {
    saved: std::cell::RefCell<BTreeMap<String, String>>,
    saving: std::cell::Cell<bool>,
}

/// `config/broker.properties` as written: a comment saying what it is, then `key=value`.
fn live_config_text(saved: &BTreeMap<String, String>) -> String {
    let mut text = String::from(
        "# Settings changed by UPDATE_BROKER_CONFIG (mqadmin updateBrokerConfig); applied at\n\
         # start over the flags and -c file. Delete this file to go back to them.\n",
    );
    for (key, value) in saved {
        text.push_str(&format!("{key}={value}\n"));
    }
    text
}

/// messageDelayLevel as RocketMQ writes it: each delay in its largest whole unit.
fn delay_level_text(levels: &crate::broker::schedule::DelayLevels) -> String {
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    levels
        .delays_ms
        .iter()
        .map(|ms| {
            units
                .iter()
                .find(|(unit, _)| *ms >= *unit && ms % unit == 0)
                .map_or(format!("{ms}ms"), |(unit, name)| {
                    format!("{}{name}", ms / unit)
                })
        })
        .collect::<Vec<_>>()
        .join(" ")
}
