//! `plain_acl.yml`, RocketMQ's ACL 1.0 file (CAPABILITIES.md §4.1), parsed into the rules a
//! request is checked against. The keys and values are RocketMQ's own, so a file from a
//! RocketMQ deployment is used as it is:
//!
//! ```yaml
//! globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]
//! accounts:
//!   - accessKey: RocketMQ
//!     secretKey: 12345678
//!     whiteRemoteAddress:
//!     admin: false
//!     defaultTopicPerm: DENY
//!     defaultGroupPerm: SUB
//!     topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
//!     groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]
//! ```
//!
//! A file that does not parse is refused as a whole, naming what is wrong (at start the node
//! does not start; on a reload the previous rules stay).

use std::collections::HashMap;

use serde_yaml::Value;

use super::address::AddressPattern;

/// RocketMQ's permission bits (`Permission.java`). An owned DENY always fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm(pub u8);

impl Perm {
    pub const DENY: Perm = Perm(1);
    pub const ANY: Perm = Perm(2);
    pub const PUB: Perm = Perm(4);
    pub const SUB: Perm = Perm(8);

    pub fn parse(text: &str) -> Option<Perm> {
        match text.trim() {
            "DENY" => Some(Perm::DENY),
            "PUB" => Some(Perm::PUB),
            "SUB" => Some(Perm::SUB),
            "PUB|SUB" | "SUB|PUB" => Some(Perm(Perm::PUB.0 | Perm::SUB.0)),
            _ => None,
        }
    }

    /// Whether owning `self` grants `needed` (`Permission.checkPermission`).
    pub fn grants(self, needed: Perm) -> bool {
        if self.0 & Perm::DENY.0 != 0 {
            return false;
        }
        if needed.0 & Perm::ANY.0 != 0 {
            return self.0 & (Perm::PUB.0 | Perm::SUB.0) != 0;
        }
        needed.0 & self.0 != 0
    }

    pub fn name(self) -> &'static str {
        match self.0 & (Perm::DENY.0 | Perm::PUB.0 | Perm::SUB.0) {
            0 => "ANY",
            1 => "DENY",
            4 => "PUB",
            8 => "SUB",
            12 => "PUB|SUB",
            _ => "DENY",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Account {
    pub access_key: String,
    pub secret_key: String,
    /// Requests from these addresses pass without a signature (RocketMQ's rule).
    pub white_remote_address: AddressPattern,
    pub admin: bool,
    pub default_topic_perm: Perm,
    pub default_group_perm: Perm,
    pub topic_perms: HashMap<String, Perm>,
    /// By group name (RocketMQ keys them by the group's retry topic; same thing).
    pub group_perms: HashMap<String, Perm>,
}

#[derive(Debug, Clone, Default)]
pub struct AclRules {
    /// Requests from these addresses pass every check (RocketMQ's global white list).
    pub global_white_remote_addresses: Vec<AddressPattern>,
    pub accounts: HashMap<String, Account>,
}

/// RocketMQ refuses shorter keys (`PlainPermissionManager.checkPlainAccessConfig`).
pub const KEY_MIN_CHARS: usize = 6;

impl AclRules {
    pub fn parse(text: &str) -> Result<AclRules, String> {
        let document: Value =
            serde_yaml::from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
        let mut rules = AclRules::default();
        let top = match &document {
            Value::Null => return Ok(rules),
            Value::Mapping(top) => top,
            _ => return Err("the file must be a mapping with `accounts`".into()),
        };
        for (key, value) in top {
            match key.as_str().unwrap_or_default() {
                "globalWhiteRemoteAddresses" => {
                    for text in string_list(value, "globalWhiteRemoteAddresses")? {
                        rules.global_white_remote_addresses.push(
                            AddressPattern::parse(&text)
                                .map_err(|why| format!("globalWhiteRemoteAddresses: {why}"))?,
                        );
                    }
                }
                "accounts" => {
                    let accounts = match value {
                        Value::Null => &Vec::new(),
                        Value::Sequence(accounts) => accounts,
                        _ => return Err("accounts: must be a list".into()),
                    };
                    for (index, account) in accounts.iter().enumerate() {
                        let account = parse_account(account)
                            .map_err(|why| format!("accounts[{index}]: {why}"))?;
                        if rules.accounts.contains_key(&account.access_key) {
                            return Err(format!(
                                "accounts[{index}]: accessKey {} is listed twice",
                                account.access_key
                            ));
                        }
                        rules.accounts.insert(account.access_key.clone(), account);
                    }
                }
                // Written by RocketMQ's updateAclConfig; carries nothing a check needs.
                "dataVersion" => {}
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        Ok(rules)
    }

    /// The first admin account, by accessKey order (what the node's own brokers sign their
    /// namesrv requests with when no inner credentials are given).
    pub fn first_admin(&self) -> Option<&Account> {
        let mut admins: Vec<&Account> = self.accounts.values().filter(|a| a.admin).collect();
        admins.sort_by(|a, b| a.access_key.cmp(&b.access_key));
        admins.first().copied()
    }
}

fn parse_account(value: &Value) -> Result<Account, String> {
    let Value::Mapping(fields) = value else {
        return Err("an account must be a mapping".into());
    };
    let mut account = Account {
        access_key: String::new(),
        secret_key: String::new(),
        white_remote_address: AddressPattern::Nothing,
        admin: false,
        // Absent default permissions read as DENY, as RocketMQ reads them.
        default_topic_perm: Perm::DENY,
        default_group_perm: Perm::DENY,
        topic_perms: HashMap::new(),
        group_perms: HashMap::new(),
    };
    for (key, value) in fields {
        let key = key.as_str().unwrap_or_default();
        match key {
            "accessKey" => account.access_key = scalar(value, key)?,
            "secretKey" => account.secret_key = scalar(value, key)?,
            "whiteRemoteAddress" => {
                account.white_remote_address = AddressPattern::parse(&scalar(value, key)?)
                    .map_err(|why| format!("whiteRemoteAddress: {why}"))?
            }
            "admin" => {
                account.admin = match value {
                    Value::Null => false,
                    Value::Bool(admin) => *admin,
                    Value::String(text) => text.trim().eq_ignore_ascii_case("true"),
                    _ => return Err("admin: must be true or false".into()),
                }
            }
            "defaultTopicPerm" => account.default_topic_perm = perm(value, key)?,
            "defaultGroupPerm" => account.default_group_perm = perm(value, key)?,
            "topicPerms" => account.topic_perms = resource_perms(value, key)?,
            "groupPerms" => account.group_perms = resource_perms(value, key)?,
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    let name = if account.access_key.is_empty() {
        "(no accessKey)".to_string()
    } else {
        account.access_key.clone()
    };
    if account.access_key.chars().count() < KEY_MIN_CHARS {
        return Err(format!(
            "{name}: accessKey must have at least {KEY_MIN_CHARS} characters"
        ));
    }
    if account.secret_key.chars().count() < KEY_MIN_CHARS {
        return Err(format!(
            "{name}: secretKey must have at least {KEY_MIN_CHARS} characters"
        ));
    }
    Ok(account)
}

/// A string, or a number or boolean as its text (`secretKey: 12345678` is an integer in YAML).
fn scalar(value: &Value, key: &str) -> Result<String, String> {
    match value {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.trim().to_string()),
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        _ => Err(format!("{key}: must be a single value")),
    }
}

fn string_list(value: &Value, key: &str) -> Result<Vec<String>, String> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Sequence(items) => items.iter().map(|item| scalar(item, key)).collect(),
        single => Ok(vec![scalar(single, key)?]),
    }
}

fn perm(value: &Value, key: &str) -> Result<Perm, String> {
    let text = scalar(value, key)?;
    if text.is_empty() {
        return Ok(Perm::DENY);
    }
    Perm::parse(&text).ok_or_else(|| format!("{key}: {text:?} is not DENY, PUB, SUB or PUB|SUB"))
}

/// `[name=PERM, …]`: RocketMQ splits each on '='.
fn resource_perms(value: &Value, key: &str) -> Result<HashMap<String, Perm>, String> {
    let mut perms = HashMap::new();
    for entry in string_list(value, key)? {
        let Some((name, text)) = entry.split_once('=') else {
            return Err(format!("{key}: {entry:?} is not name=PERM"));
        };
        let (name, text) = (name.trim(), text.trim());
        let perm = Perm::parse(text).ok_or_else(|| {
            format!("{key}: {entry:?}: {text:?} is not DENY, PUB, SUB or PUB|SUB")
        })?;
        if name.is_empty() {
            return Err(format!("{key}: {entry:?} names nothing"));
        }
        perms.insert(name.to_string(), perm);
    }
    Ok(perms)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RocketMQ 4.9.7's distribution/conf/plain_acl.yml, as shipped.
    const DISTRIBUTED: &str = r#"
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB

    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"#;

    #[test]
    fn reads_rocketmqs_own_file() {
        let rules = AclRules::parse(DISTRIBUTED).unwrap();
        assert_eq!(rules.global_white_remote_addresses.len(), 2);
        let account = &rules.accounts["RocketMQ"];
        assert_eq!(account.secret_key, "12345678");
        assert!(!account.admin);
        assert_eq!(account.white_remote_address, AddressPattern::Nothing);
        assert_eq!(account.default_topic_perm, Perm::DENY);
        assert_eq!(account.default_group_perm, Perm::SUB);
        assert_eq!(account.topic_perms["topicB"], Perm(12));
        assert_eq!(account.group_perms["groupA"], Perm::DENY);
        let admin = &rules.accounts["rocketmq2"];
        assert!(admin.admin);
        assert_eq!(admin.default_topic_perm, Perm::DENY);
        assert_eq!(rules.first_admin().unwrap().access_key, "rocketmq2");
    }

    #[test]
    fn permission_checks_as_rocketmq() {
        assert!(Perm(12).grants(Perm::PUB));
        assert!(Perm(12).grants(Perm::SUB));
        assert!(!Perm::SUB.grants(Perm::PUB));
        assert!(!Perm::DENY.grants(Perm::PUB));
        assert!(Perm::SUB.grants(Perm::ANY));
        assert!(!Perm(Perm::DENY.0 | Perm::PUB.0).grants(Perm::PUB));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            ("accounts: [{accessKey: abc, secretKey: 12345678}]", "at least 6"),
            ("accounts: [{accessKey: abcdefg}]", "secretKey"),
            (
                "accounts: [{accessKey: abcdefg, secretKey: 12345678, topicPerms: [t=ALL]}]",
                "\"ALL\" is not",
            ),
            (
                "accounts: [{accessKey: abcdefg, secretKey: 12345678, topicPrems: []}]",
                "unknown key \"topicPrems\"",
            ),
            (
                "accounts: [{accessKey: abcdefg, secretKey: 12345678}, {accessKey: abcdefg, secretKey: 12345678}]",
                "twice",
            ),
            ("globalWhiteRemoteAddresses: [10.0.0]", "globalWhiteRemoteAddresses"),
            ("accounts: [", "not valid YAML"),
        ];
        for (text, expected) in cases {
            let error = AclRules::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
