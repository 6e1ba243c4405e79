//! One shard's topic table: `config/topics.json`, the built-in topics, name validation and
//! auto-creation through the template topic `TBW102`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::body::{perm, TopicConfig, TopicConfigTable};
use crate::broker::state::versioned::VersionedFile;
use crate::error::RequestError;

pub const AUTO_CREATE_TOPIC_KEY_TOPIC: &str = "TBW102";

/// Queues of the template topic (RocketMQ's defaultTopicQueueNums).
pub const DEFAULT_TOPIC_QUEUE_NUMS: u32 = 8;

/// Topic auto-creation: RocketMQ's autoCreateTopicEnable and defaultTopicQueueNums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCreate {
    pub enable: bool,
    pub default_topic_queue_nums: u32,
}

impl Default for AutoCreate {
    fn default() -> AutoCreate {
        AutoCreate {
            enable: true,
            default_topic_queue_nums: DEFAULT_TOPIC_QUEUE_NUMS,
        }
    }
}

pub use crate::limits::TOPIC_NAME_MAX_CHARS;

pub use crate::limits::SYSTEM_TOPIC_NAME_MAX_CHARS;

pub const RETRY_GROUP_TOPIC_PREFIX: &str = "%RETRY%";

pub const DLQ_GROUP_TOPIC_PREFIX: &str = "%DLQ%";

/// Topics a client may not send to directly.
pub const NOT_ALLOWED_SEND_TOPICS: [&str; 6] = [
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
];

/// Checks a topic name: RocketMQ's character set and length limit.
pub fn validate_topic_name(topic: &str) -> Result<(), RequestError> {
    let limit = if topic.starts_with(RETRY_GROUP_TOPIC_PREFIX)
        || topic.starts_with(DLQ_GROUP_TOPIC_PREFIX)
    {
        SYSTEM_TOPIC_NAME_MAX_CHARS
    } else {
        TOPIC_NAME_MAX_CHARS
    };
    validate_name("topic", topic, limit)
}

/// Checks the name of a `kind` of resource (topic, group): not blank, at most `limit` bytes,
/// only `^[%|a-zA-Z0-9_-]+$` (RocketMQ's Validators).
pub(crate) fn validate_name(kind: &str, name: &str, limit: usize) -> Result<(), RequestError> {
    if name.is_empty() {
        return Err(RequestError::InvalidParameter(format!(
            "the specified {kind} is blank"
        )));
    }
    if name.len() > limit {
        return Err(RequestError::InvalidParameter(format!(
            "the specified {kind} is longer than {kind} max length {limit}."
        )));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '%' | '-' | '_' | '|');
    if !name.chars().all(valid) {
        return Err(RequestError::InvalidParameter(format!(
            "the specified {kind}[{name}] contains illegal characters, allowing only \
             ^[%|a-zA-Z0-9_-]+$"
        )));
    }
    Ok(())
}

/// The topic table of one shard.
pub struct TopicTable {
    pub(crate) file: VersionedFile,
    /// RocketMQ's autoCreateTopicEnable: whether a send may create its topic from TBW102.
    auto_create_topic_enable: bool,
    pub topics: BTreeMap<String, TopicConfig>,
    /// Topics created or changed by a version of the file not yet known to be on disk: a
    /// send to one of them is answered once it is (a message acknowledged in a topic that a
    /// crash forgets would be unreadable after the restart).
    not_durable: BTreeMap<String, u64>,
}

impl TopicTable {
    /// Loads `topics.json` (or its backup), adding the built-in topics when missing. TBW102
    /// gets `auto_create.default_topic_queue_nums` queues at every start (RocketMQ keeps the
    /// file's count; an operator who changes defaultTopicQueueNums means it to apply).
    pub fn load(
        path: PathBuf,
        cluster_name: &str,
        broker_name: &str,
        auto_create: AutoCreate,
    ) -> TopicTable {
        let (file, topics) = VersionedFile::load(path, |bytes| {
            let table = TopicConfigTable::parse(bytes).ok()?;
            Some((table.data_version, table.topics))
        });
        let mut table = TopicTable {
            file,
            auto_create_topic_enable: auto_create.enable,
            topics,
            not_durable: BTreeMap::new(),
        };
        let builtin = [
            (
                AUTO_CREATE_TOPIC_KEY_TOPIC,
                auto_create.default_topic_queue_nums,
                perm::READ | perm::WRITE | perm::INHERIT,
            ),
            ("SELF_TEST_TOPIC", 1, perm::READ | perm::WRITE),
            ("OFFSET_MOVED_EVENT", 1, perm::READ | perm::WRITE),
            ("SCHEDULE_TOPIC_XXXX", 18, perm::READ | perm::WRITE),
            ("RMQ_SYS_TRANS_HALF_TOPIC", 1, perm::READ | perm::WRITE),
            (cluster_name, 16, perm::READ | perm::WRITE | perm::INHERIT),
            (broker_name, 1, perm::READ | perm::WRITE | perm::INHERIT),
        ];
        let mut changed = false;
        for (name, queues, topic_perm) in builtin {
            if !table.topics.contains_key(name) {
                table
                    .topics
                    .insert(name.to_string(), TopicConfig::new(name, queues, topic_perm));
                changed = true;
            }
        }
        if let Some(template) = table.topics.get_mut(AUTO_CREATE_TOPIC_KEY_TOPIC) {
            let queues = auto_create.default_topic_queue_nums;
            if template.write_queue_nums != queues || template.read_queue_nums != queues {
                (template.write_queue_nums, template.read_queue_nums) = (queues, queues);
                changed = true;
            }
        }
        if changed {
            table.persist();
        }
        table
    }

    pub fn get(&self, topic: &str) -> Option<&TopicConfig> {
        self.topics.get(topic)
    }

    /// Refuses to create `topic` when the table holds `max` topics already (`TOPICS_MAX`);
    /// a topic it holds may always change.
    pub fn check_room(&self, topic: &str, max: usize) -> Result<(), RequestError> {
        if self.topics.len() < max || self.topics.contains_key(topic) {
            return Ok(());
        }
        Err(RequestError::SystemError(format!(
            "this broker already holds {} topics, the most it creates: topic[{topic}] is \
             not created",
            self.topics.len()
        )))
    }

    /// Inserts or replaces a topic; returns whether anything changed.
    pub fn upsert(&mut self, config: TopicConfig) -> bool {
        if self.topics.get(&config.topic_name) == Some(&config) {
            return false;
        }
        let version = self.file.set(&config);
        let name = config.topic_name.clone();
        self.topics.insert(name.clone(), config);
        self.not_durable.insert(name, version);
        true
    }

    /// The file version a send to `topic` must wait for, if its config is not on disk yet
    /// (one map lookup while some topic waits, nothing otherwise).
    pub fn version_to_wait_for(&mut self, topic: &str) -> Option<u64> {
        if self.not_durable.is_empty() {
            return None;
        }
        let durable = self.file.persisted.durable_version();
        self.not_durable.retain(|_, version| *version > durable);
        self.not_durable.get(topic).copied()
    }

    pub fn auto_create_topic_enable(&self) -> bool {
        self.auto_create_topic_enable
    }

    /// UPDATE_BROKER_CONFIG's autoCreateTopicEnable.
    pub fn set_auto_create_topic_enable(&mut self, enable: bool) {
        self.auto_create_topic_enable = enable;
    }

    pub fn remove(&mut self, topic: &str) -> bool {
        let removed = self.topics.remove(topic).is_some();
        if removed {
            self.file.remove(topic);
        }
        removed
    }

    /// The config auto-creation would give `topic` from `template` (None: not allowed).
    pub fn auto_create_config(
        &self,
        topic: &str,
        template: &str,
        requested_queue_nums: u32,
    ) -> Option<TopicConfig> {
        if topic.starts_with(RETRY_GROUP_TOPIC_PREFIX) {
            return Some(TopicConfig::new(topic, 1, perm::READ | perm::WRITE));
        }
        // As RocketMQ's createTopicInSendMessageMethod: with autoCreateTopicEnable off, TBW102
        // does not pass its INHERIT on, whatever the file says.
        if template == AUTO_CREATE_TOPIC_KEY_TOPIC && !self.auto_create_topic_enable {
            return None;
        }
        let template = self.topics.get(template)?;
        if template.perm & perm::INHERIT == 0 {
            return None;
        }
        let queues = requested_queue_nums.clamp(1, template.write_queue_nums.max(1));
        let mut config = TopicConfig::new(topic, queues, template.perm & !perm::INHERIT);
        config.topic_filter_type = template.topic_filter_type.clone();
        Some(config)
    }

    pub fn snapshot(&self) -> TopicConfigTable {
        TopicConfigTable {
            data_version: self.file.data_version.clone(),
            topics: self.topics.clone(),
        }
    }

    /// The table with only the topics in `names` (those still here).
    pub fn snapshot_of(&self, names: &std::collections::BTreeSet<String>) -> TopicConfigTable {
        let topics = names
            .iter()
            .filter_map(|name| Some((name.clone(), self.topics.get(name)?.clone())))
            .collect();
        TopicConfigTable {
            data_version: self.file.data_version.clone(),
            topics,
        }
    }

    pub(crate) fn persist(&self) {
        self.file.write_soon();
    }

    /// The file behind the table (its writer and durable versions).
    pub fn persisted(&self) -> &std::rc::Rc<crate::persist::Persisted> {
        &self.file.persisted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_are_checked() {
        assert!(validate_topic_name("Topic_A-1|x%y").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("bad topic").is_err());
        assert!(validate_topic_name("bad/topic").is_err());
        assert!(validate_topic_name(&"x".repeat(128)).is_err());
        assert!(validate_topic_name(&format!("%RETRY%{}", "g".repeat(200))).is_ok());
    }

    #[test]
    fn no_topic_is_created_past_the_most_a_broker_holds() {
        let dir = std::env::temp_dir().join(format!("topics-room-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = TopicTable::load(dir.join("topics.json"), "C", "B", AutoCreate::default());
        let held = table.topics.len();
        assert!(table.check_room("New", held + 1).is_ok());
        let refused = table.check_room("New", held).unwrap_err();
        assert!(
            refused.to_string().contains("topic[New] is not created"),
            "{refused}"
        );
        assert!(
            table.check_room("TBW102", held).is_ok(),
            "a topic held may change"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
