//! One shard's subscription groups: `config/subscriptionGroup.json` (+ `.bak`), RocketMQ's
//! defaults, name checks, the bound on how many a shard keeps.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::body::{SubscriptionGroupConfig, SubscriptionGroupTable};
use crate::broker::state::topics::validate_name;
use crate::broker::state::versioned::VersionedFile;
use crate::error::RequestError;

pub use crate::limits::SUBSCRIPTION_GROUPS_MAX;

pub use crate::limits::GROUP_NAME_MAX_CHARS;

/// Groups created with the broker (RocketMQ's built-in tool and self-test groups).
pub(crate) const BUILTIN_GROUPS: [&str; 3] =
    ["TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP"];

/// Checks a group name: RocketMQ's character set and length limit.
pub fn validate_group_name(group: &str) -> Result<(), RequestError> {
    validate_name("group", group, GROUP_NAME_MAX_CHARS)
}

pub struct GroupTable {
    pub(crate) file: VersionedFile,
    pub(crate) groups: BTreeMap<String, SubscriptionGroupConfig>,
}

impl GroupTable {
    /// Loads `subscriptionGroup.json` (or its backup), adding the built-in groups.
    pub fn load(path: PathBuf) -> GroupTable {
        let (file, groups) = VersionedFile::load(path, |bytes| {
            let table = SubscriptionGroupTable::parse(bytes).ok()?;
            Some((table.data_version, table.groups))
        });
        let mut table = GroupTable { file, groups };
        let mut changed = false;
        for name in BUILTIN_GROUPS {
            if !table.groups.contains_key(name) {
                table
                    .groups
                    .insert(name.to_string(), SubscriptionGroupConfig::new(name));
                changed = true;
            }
        }
        if changed {
            table.persist();
        }
        table
    }

    pub fn get(&self, group: &str) -> Option<&SubscriptionGroupConfig> {
        self.groups.get(group)
    }

    /// The group's config, created with the defaults when missing (None: the name is not
    /// valid or the table is full).
    pub fn find_or_create(&mut self, group: &str) -> Option<SubscriptionGroupConfig> {
        if let Some(config) = self.groups.get(group) {
            return Some(config.clone());
        }
        if validate_group_name(group).is_err() || self.groups.len() >= SUBSCRIPTION_GROUPS_MAX {
            return None;
        }
        let config = SubscriptionGroupConfig::new(group);
        self.file.set(&config);
        self.groups.insert(group.to_string(), config.clone());
        Some(config)
    }

    pub fn upsert(&mut self, config: SubscriptionGroupConfig) -> Result<(), RequestError> {
        validate_group_name(&config.group_name)?;
        if !self.groups.contains_key(&config.group_name)
            && self.groups.len() >= SUBSCRIPTION_GROUPS_MAX
        {
            return Err(RequestError::SystemBusy(format!(
                "this broker already holds {SUBSCRIPTION_GROUPS_MAX} subscription groups"
            )));
        }
        if self.groups.get(&config.group_name) != Some(&config) {
            self.file.set(&config);
            self.groups.insert(config.group_name.clone(), config);
        }
        Ok(())
    }

    pub fn remove(&mut self, group: &str) -> bool {
        let removed = self.groups.remove(group).is_some();
        if removed {
            self.file.remove(group);
        }
        removed
    }

    pub fn snapshot(&self) -> SubscriptionGroupTable {
        SubscriptionGroupTable {
            data_version: self.file.data_version.clone(),
            groups: self.groups.clone(),
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
    fn groups_persist_and_reload() {
        let dir = std::env::temp_dir().join(format!("shardmq-groups-{}", std::process::id()));
        let path = dir.join("subscriptionGroup.json");
        let _ = std::fs::remove_dir_all(&dir);
        let mut table = GroupTable::load(path.clone());
        assert!(table.get("TOOLS_CONSUMER").is_some());
        let created = table.find_or_create("G1").unwrap();
        assert_eq!(created.retry_max_times, 16);
        let mut changed = SubscriptionGroupConfig::new("G2");
        changed.consume_enable = false;
        table.upsert(changed).unwrap();
        assert!(table.find_or_create("bad group").is_none());
        assert!(table.upsert(SubscriptionGroupConfig::new("")).is_err());
        assert!(
            table.persisted().latest() >= 2,
            "each change asks its writer for a write"
        );
        // What the writer task writes (persist::run_writer).
        let write = |table: &GroupTable| {
            crate::persist::write_file_durably(&path, &table.snapshot().encode_pretty()).unwrap()
        };
        write(&table);
        let reloaded = GroupTable::load(path.clone());
        assert!(reloaded.get("G1").is_some());
        assert!(!reloaded.get("G2").unwrap().consume_enable);
        let mut reloaded = reloaded;
        assert!(reloaded.remove("G1"));
        assert!(!reloaded.remove("G1"));
        write(&reloaded);
        assert!(GroupTable::load(path.clone()).get("G1").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
