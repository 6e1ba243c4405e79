//! Transactional messages, broker side (RocketMQ's two-phase send), on the shard that stored
//! the half message: END_TRANSACTION (37) and the CHECK_TRANSACTION_STATE (39) check-back.
//!
//! 1. A send whose `TRAN_MSG` property is "true" is stored as a **half message** in
//!    `RMQ_SYS_TRANS_HALF_TOPIC` queue 0, invisible to consumers (no topic config, no route),
//!    its real topic and queue kept in `REAL_TOPIC`/`REAL_QID`, `__transactionId__` = its
//!    UNIQ_KEY, the transaction bits of its sysFlag cleared. The send answer names the half:
//!    msgId = its offset msgId (this shard's store host, so END_TRANSACTION comes back here),
//!    queueOffset = its half-queue offset (`tranStateTableOffset`).
//! 2. END_TRANSACTION COMMIT rebuilds the message for its real topic and queue (sysFlag with
//!    the commit type, `REAL_TOPIC`/`REAL_QID`/`TRAN_MSG` dropped, UNIQ_KEY kept so consumers
//!    see the same msgId, preparedTransactionOffset = the half's commitlog offset), appends
//!    it, wakes the pulls parked on that queue, and appends an **op record** to
//!    `RMQ_SYS_TRANS_OP_HALF_TOPIC` (tag "d", body = the half-queue offset). ROLLBACK appends
//!    only the op record. UNKNOWN (0) leaves it for the check-back, unanswered as in RocketMQ.
//!    A half that is no longer pending (ended, or discarded) is never ended again: a commit
//!    arriving twice commits once.
//! 3. The check task (every `check_interval_ms`) sends CHECK_TRANSACTION_STATE, oneway, to a
//!    live producer connection of the half's group (`PGROUP`) for every half older than
//!    `timeout_ms`, once per round, at most `check_max` times; the next round discards it
//!    (an op record, and a log line).
//!
//! Pending halves live in memory (`Transactions::pending`, at most `HALF_MESSAGES_PENDING_MAX`;
//! beyond it a half send gets SYSTEM_BUSY). Restarts: after each round that changed anything
//! the shard writes `config/transactionProgress.json` (persist.rs) with the half- and op-queue
//! ends it has seen and the pending offsets with their check counts, once the commitlog is
//! durable up to that point. `recover` rebuilds from it: the listed halves, plus the halves
//! appended after it, minus the op records appended after it. So no half is forgotten and no
//! ended half is checked again. One window remains, as in RocketMQ: a crash that keeps the
//! committed message but tears off its op record (they are appended back to back and flushed
//! together) would have the half checked and committed again after the restart.

use std::collections::BTreeMap;
use std::path::PathBuf;

use shards::store::AppendResult;

use crate::body::{find_property, property};
use crate::broker::Broker;
use crate::error::RequestError;

/// Where half messages wait (RocketMQ's TopicValidator name).
pub const RMQ_SYS_TRANS_HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";

/// Where op records mark halves as ended.
pub const RMQ_SYS_TRANS_OP_HALF_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";

pub(crate) const HALF_QUEUE_ID: u32 = 0;
pub(crate) const OP_QUEUE_ID: u32 = 0;
/// RocketMQ's TransactionalMessageUtil.REMOVE_TAG.
pub(crate) const OP_REMOVE_TAG: &str = "d";

/// MessageSysFlag transaction types (bits 2–3).
pub const TRANSACTION_NOT_TYPE: i32 = 0;

pub const TRANSACTION_PREPARED_TYPE: i32 = 0x4;

pub const TRANSACTION_COMMIT_TYPE: i32 = 0x8;

pub const TRANSACTION_ROLLBACK_TYPE: i32 = 0xC;

pub(crate) const TRANSACTION_TYPE_MASK: i32 = 0xC;

pub use crate::limits::HALF_MESSAGES_PENDING_MAX;

/// RocketMQ's broker settings for transactions (BrokerConfig defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionConfig {
    /// transactionTimeOut: a half this old (by its store time) gets checked.
    pub timeout_ms: u64,
    /// transactionCheckInterval: how often the check task runs.
    pub check_interval_ms: u64,
    /// transactionCheckMax: checks per half before it is discarded.
    pub check_max: u32,
}

impl Default for TransactionConfig {
    fn default() -> Self {
        TransactionConfig {
            timeout_ms: 6_000,
            check_interval_ms: 30_000,
            check_max: 15,
        }
    }
}

/// A half message waiting for its end, by its half-queue offset.
#[derive(Debug, Clone)]
pub(crate) struct PendingHalf {
    pub(crate) commitlog_offset: u64,
    pub(crate) stored_at_ms: i64,
    pub(crate) producer_group: String,
    pub(crate) unique_id: String,
    pub(crate) check_times: u32,
    /// An END_TRANSACTION is reading it (no second one, no check meanwhile).
    pub(crate) ending: bool,
    /// Ended, but its op record could not be written yet (the store refused): retried by
    /// the next round, never checked again.
    pub(crate) op_unwritten: bool,
}

/// Counters shown by GET_BROKER_RUNTIME_INFO.
#[derive(Debug, Default, Clone, Copy)]
pub struct TransactionStats {
    pub committed: u64,
    pub rolled_back: u64,
    pub checks_sent: u64,
    pub discarded: u64,
}

/// The transaction state of one shard (see the module docs).
pub struct Transactions {
    pub config: TransactionConfig,
    pub(crate) pending: BTreeMap<u64, PendingHalf>,
    pub(crate) progress_path: PathBuf,
    /// Pending halves changed since the progress file was last written.
    pub(crate) dirty: bool,
    pub stats: TransactionStats,
}

impl Transactions {
    pub fn new(config_dir: &std::path::Path) -> Transactions {
        Transactions {
            config: TransactionConfig::default(),
            pending: BTreeMap::new(),
            progress_path: config_dir.join("transactionProgress.json"),
            dirty: false,
            stats: TransactionStats::default(),
        }
    }

    /// Halves waiting for their end.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// What `transactionProgress.json` holds (see the module docs).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Progress {
    pub(crate) half_scanned_offset: u64,
    pub(crate) op_scanned_offset: u64,
    /// Pending half-queue offsets and their check counts.
    pub(crate) pending: Vec<(u64, u32)>,
}

impl Progress {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let pending: Vec<serde_json::Value> = self
            .pending
            .iter()
            .map(|(offset, checks)| serde_json::json!({"offset": offset, "checkTimes": checks}))
            .collect();
        serde_json::json!({
            "halfScannedOffset": self.half_scanned_offset,
            "opScannedOffset": self.op_scanned_offset,
            "pending": pending,
        })
    }

    pub(crate) fn parse(bytes: &[u8]) -> Option<Progress> {
        let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let pending = value
            .get("pending")?
            .as_array()?
            .iter()
            .map(|entry| {
                let offset = entry.get("offset")?.as_u64()?;
                let checks = entry.get("checkTimes")?.as_u64()?;
                Some((offset, u32::try_from(checks).ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Progress {
            half_scanned_offset: value.get("halfScannedOffset")?.as_u64()?,
            op_scanned_offset: value.get("opScannedOffset")?.as_u64()?,
            pending,
        })
    }
}

impl Broker {
    /// Admission of a transactional half: refused (SYSTEM_BUSY) while
    /// `HALF_MESSAGES_PENDING_MAX` halves wait for their end.
    pub(crate) fn admit_half(&self) -> Result<(), RequestError> {
        if self.transactions.borrow().pending.len() >= HALF_MESSAGES_PENDING_MAX {
            return Err(RequestError::SystemBusy(format!(
                "[TRANSACTION]{HALF_MESSAGES_PENDING_MAX} half messages wait for their end on \
                 this broker, try again later"
            )));
        }
        Ok(())
    }
}

impl Broker {
    /// Registers a half just appended (its properties as stored).
    pub(crate) fn half_stored(&self, properties: &[u8], appended: &AppendResult) {
        let pending = PendingHalf {
            commitlog_offset: appended.physical_offset.0,
            stored_at_ms: appended.store_timestamp_ms,
            producer_group: find_property(properties, property::PGROUP)
                .unwrap_or_default()
                .to_string(),
            unique_id: find_property(properties, property::UNIQ_KEY)
                .unwrap_or_default()
                .to_string(),
            check_times: 0,
            ending: false,
            op_unwritten: false,
        };
        let mut transactions = self.transactions.borrow_mut();
        transactions
            .pending
            .insert(appended.queue_offset.0, pending);
        transactions.dirty = true;
    }
}

/// A half message's sysFlag: the sender's, transaction bits cleared (as RocketMQ stores it).
pub(crate) fn half_sys_flag(sys_flag: i32) -> i32 {
    sys_flag & !TRANSACTION_TYPE_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_bad_files_are_refused() {
        let progress = Progress {
            half_scanned_offset: 12,
            op_scanned_offset: 7,
            pending: vec![(3, 0), (9, 4)],
        };
        let text = serde_json::to_vec(&progress.to_json()).unwrap();
        assert_eq!(Progress::parse(&text), Some(progress));
        assert_eq!(Progress::parse(b"{\"halfScannedOffset\": -1}"), None);
        assert_eq!(Progress::parse(b"not json"), None);
    }
}
