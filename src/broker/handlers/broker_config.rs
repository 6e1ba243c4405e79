//! GET_BROKER_CONFIG (26), UPDATE_BROKER_CONFIG (25) and VIEW_BROKER_STATS_DATA (315), as
//! AdminBrokerProcessor answers them, so `mqadmin getBrokerConfig / updateBrokerConfig /
//! statsAll`, rocketmq-exporter and rocketmq-dashboard work unchanged.
//!
//! The config is this shard's, with RocketMQ's key names (`listenPort` is the shard's own
//! port), as properties text (`key=value` lines, MixAll.properties2String) and the config's
//! data version in the `version` ext field. An update changes only what can change while the
//! shard runs (retention and topic auto-creation); any other key is refused naming it, and
//! nothing is applied unless every key is. The change lasts until a restart: the settings a
//! node starts with are its flags or `-c` file.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// Keys UPDATE_BROKER_CONFIG changes live.
pub const LIVE_KEYS: [&str; 9] = [
    "fileReservedTime",
    "deleteWhen",
    "diskMaxUsedSpaceRatio",
    "diskSpaceCleanForciblyRatio",
    "diskSpaceWarningLevelRatio",
    "cleanFileForciblyEnable",
    "cleanResourceInterval",
    "deleteCommitLogFilesInterval",
    "autoCreateTopicEnable",
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
            ("brokerId", "0".into()),
            ("brokerRole", "ASYNC_MASTER".into()),
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
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let text = std::str::from_utf8(request.body)
            .map_err(|_| RequestError::SystemError("the config body is not UTF-8 text".into()))?;
        let entries = crate::conf::parse_properties(text).map_err(RequestError::SystemError)?;
        let mut retention = self.retention.config();
        let mut auto_create = self.topics.borrow().auto_create_topic_enable();
        for entry in &entries {
            let (key, value) = (entry.key.as_str(), entry.value.as_str());
            apply_live(key, value, &mut retention, &mut auto_create)
                .map_err(|why| RequestError::SystemError(format!("{key}={value}: {why}")))?;
        }
        retention.validate().map_err(RequestError::SystemError)?;
        self.retention.set_config(retention);
        self.topics
            .borrow_mut()
            .set_auto_create_topic_enable(auto_create);
        self.config_version.set(self.config_version.get() + 1);
        let keys: Vec<&str> = entries.iter().map(|entry| entry.key.as_str()).collect();
        log::info!(
            "{}: UPDATE_BROKER_CONFIG from {} changed {} (until restart)",
            self.identity.broker_name,
            connection.peer,
            keys.join(", ")
        );
        connection.respond_body(request, b"");
        Ok(())
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

/// One key of UPDATE_BROKER_CONFIG applied to the settings being built.
fn apply_live(
    key: &str,
    value: &str,
    retention: &mut shards::store::RetentionConfig,
    auto_create: &mut bool,
) -> Result<(), String> {
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
        "autoCreateTopicEnable" => *auto_create = flag(value)?,
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
