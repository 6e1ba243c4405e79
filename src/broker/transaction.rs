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
use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use shards::store::{record, AppendResult, FlushMode, GetStatus, MessageToStore};

use crate::body::property;
use crate::body::{encode_properties, find_property, java_string_hash, parse_properties};
use crate::error::{now_ms, RequestError};
use crate::remoting::{request_code, response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

use super::schedule::{divert_for, Divert};
use super::Broker;
use crate::error::store_error;

/// Where half messages wait (RocketMQ's TopicValidator name).
pub const RMQ_SYS_TRANS_HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// Where op records mark halves as ended.
pub const RMQ_SYS_TRANS_OP_HALF_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
const HALF_QUEUE_ID: u32 = 0;
const OP_QUEUE_ID: u32 = 0;
/// RocketMQ's TransactionalMessageUtil.REMOVE_TAG.
const OP_REMOVE_TAG: &str = "d";

/// MessageSysFlag transaction types (bits 2–3).
pub const TRANSACTION_NOT_TYPE: i32 = 0;
pub const TRANSACTION_PREPARED_TYPE: i32 = 0x4;
pub const TRANSACTION_COMMIT_TYPE: i32 = 0x8;
pub const TRANSACTION_ROLLBACK_TYPE: i32 = 0xC;
const TRANSACTION_TYPE_MASK: i32 = 0xC;

/// Halves one shard keeps waiting for their end; beyond it a half send gets SYSTEM_BUSY (a
/// producer that never ends its transactions cannot grow the broker without bound).
pub const HALF_MESSAGES_PENDING_MAX: usize = 100_000;
/// Checks one round sends at most, so that a round never holds the shard long.
pub const CHECKS_PER_ROUND_MAX: usize = 10_000;
/// Records one recovery read takes from a queue.
const RECOVERY_BATCH_MESSAGES: u32 = 256;
const RECOVERY_BATCH_BYTES: u32 = 4 << 20;

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
struct PendingHalf {
    commitlog_offset: u64,
    stored_at_ms: i64,
    producer_group: String,
    unique_id: String,
    check_times: u32,
    /// An END_TRANSACTION is reading it (no second one, no check meanwhile).
    ending: bool,
    /// Ended, but its op record could not be written yet (the store refused): retried by
    /// the next round, never checked again.
    op_unwritten: bool,
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
    pending: BTreeMap<u64, PendingHalf>,
    progress_path: PathBuf,
    /// Pending halves changed since the progress file was last written.
    dirty: bool,
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
struct Progress {
    half_scanned_offset: u64,
    op_scanned_offset: u64,
    /// Pending half-queue offsets and their check counts.
    pending: Vec<(u64, u32)>,
}

impl Progress {
    fn to_json(&self) -> serde_json::Value {
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

    fn parse(bytes: &[u8]) -> Option<Progress> {
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

/// The END_TRANSACTION request header.
struct EndHeader {
    producer_group: String,
    half_offset: u64,
    commitlog_offset: u64,
    commit: bool,
    from_check: bool,
}

impl Broker {
    /// Send hook: when the message is a transactional half (`TRAN_MSG` true), adds the
    /// half-message properties and says so; the send then stores it in the half topic
    /// (`half_destination`) and calls `half_stored`.
    pub(super) fn prepare_half(
        &self,
        properties: &mut Vec<u8>,
        unique_id: &str,
        (topic, queue_id): (&str, u32),
        producer_group: &str,
    ) -> Result<bool, RequestError> {
        let half = find_property(properties, property::TRAN_MSG)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"));
        if !half {
            return Ok(false);
        }
        if self.transactions.borrow().pending.len() >= HALF_MESSAGES_PENDING_MAX {
            return Err(RequestError::SystemBusy(format!(
                "[TRANSACTION]{HALF_MESSAGES_PENDING_MAX} half messages wait for their end on \
                 this broker, try again later"
            )));
        }
        let queue = queue_id.to_string();
        let mut added = vec![
            (property::REAL_TOPIC, topic),
            (property::REAL_QID, queue.as_str()),
            (property::TRANSACTION_ID, unique_id),
        ];
        if find_property(properties, property::PGROUP).is_none() {
            added.push((property::PGROUP, producer_group));
        }
        encode_properties(properties, &added);
        Ok(true)
    }

    /// Registers a half just appended (its properties as stored).
    pub(super) fn half_stored(&self, properties: &[u8], appended: &AppendResult) {
        let pending = PendingHalf {
            commitlog_offset: appended.physical_offset,
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
        transactions.pending.insert(appended.queue_offset, pending);
        transactions.dirty = true;
    }

    /// END_TRANSACTION (37).
    pub(super) fn end_transaction(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let commit = match ext.required_i32("commitOrRollback")? {
            TRANSACTION_COMMIT_TYPE => true,
            TRANSACTION_ROLLBACK_TYPE => false,
            // Unknown yet: the check-back will ask again. RocketMQ answers nothing.
            TRANSACTION_NOT_TYPE => return Ok(()),
            other => {
                return Err(RequestError::InvalidParameter(format!(
                    "commitOrRollback {other} is not 0 (unknown), 8 (commit) or 12 (rollback)"
                )))
            }
        };
        let header = EndHeader {
            producer_group: ext.required("producerGroup")?.to_string(),
            half_offset: ext.required_i64("tranStateTableOffset")?.max(0) as u64,
            commitlog_offset: ext.required_i64("commitLogOffset")?.max(0) as u64,
            commit,
            from_check: ext.bool_lenient("fromTransactionCheck") == Some(true),
        };
        self.claim_half(&header)?;
        let (broker, connection) = (self.clone(), connection.clone());
        let (opaque, oneway) = (request.opaque, request.is_oneway());
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let ended = broker.end_half(&header).await;
            let answer = match ended {
                Ok(end_offset) => match broker.store.flush_mode() {
                    FlushMode::Sync => broker
                        .store
                        .wait_durable(end_offset)
                        .await
                        .map_err(store_error),
                    FlushMode::Async => Ok(()),
                },
                Err(error) => Err(error),
            };
            if oneway {
                return;
            }
            match answer {
                Ok(()) => connection.respond_to(opaque, response_code::SUCCESS, None),
                Err(error) => error.respond(&connection, opaque),
            }
        });
        Ok(())
    }

    /// Checks the request against the pending half and marks it as being ended.
    fn claim_half(&self, header: &EndHeader) -> Result<(), RequestError> {
        let mut transactions = self.transactions.borrow_mut();
        let Some(pending) = transactions.pending.get_mut(&header.half_offset) else {
            return Err(RequestError::SystemError(format!(
                "Find prepared transaction message failed: the half message at offset {} is \
                 not waiting (already committed, rolled back or discarded, or never stored)",
                header.half_offset
            )));
        };
        if pending.producer_group != header.producer_group {
            return Err(RequestError::SystemError("The producer group wrong".into()));
        }
        if pending.commitlog_offset != header.commitlog_offset {
            return Err(RequestError::SystemError(
                "The commit log offset wrong".into(),
            ));
        }
        if pending.ending || pending.op_unwritten {
            return Err(RequestError::SystemError(format!(
                "the transaction of the half message at offset {} is being ended already",
                header.half_offset
            )));
        }
        pending.ending = true;
        Ok(())
    }

    /// Commits or rolls back a claimed half; returns the commitlog end to wait durable for.
    async fn end_half(&self, header: &EndHeader) -> Result<u64, RequestError> {
        let read = self.store.read_record(header.commitlog_offset).await;
        let unclaim = || {
            if let Some(pending) = self
                .transactions
                .borrow_mut()
                .pending
                .get_mut(&header.half_offset)
            {
                pending.ending = false;
            }
        };
        let record = match read {
            Ok(Some(record)) => record,
            Ok(None) => {
                unclaim();
                return Err(RequestError::SystemError(format!(
                    "Find prepared transaction message failed: no record at commitlog offset {}",
                    header.commitlog_offset
                )));
            }
            Err(error) => {
                unclaim();
                return Err(store_error(error));
            }
        };
        // From here on nothing awaits: the commit, its op record and the bookkeeping happen
        // together (and reach the disk in the same flush).
        let committed_end = if header.commit {
            match self.append_committed(&record, header.commitlog_offset) {
                Ok(end) => Some(end),
                Err(error) => {
                    unclaim();
                    return Err(error);
                }
            }
        } else {
            None
        };
        let op_end = self.finish_half(header.half_offset, header.commit);
        if header.from_check {
            eprintln!(
                "shardmq: {}: the producer {} the half message at offset {} when checked",
                self.identity.broker_name,
                if header.commit {
                    "committed"
                } else {
                    "rolled back"
                },
                header.half_offset
            );
        }
        Ok(op_end.or(committed_end).unwrap_or(0))
    }

    /// Appends the committed message for its real topic and queue; returns its end offset.
    fn append_committed(
        &self,
        record: &[u8],
        half_commitlog_offset: u64,
    ) -> Result<u64, RequestError> {
        let half = record::decode(record).map_err(|e| {
            RequestError::SystemError(format!("the half message record is unreadable: {e}"))
        })?;
        let pairs = parse_properties(half.properties);
        let lookup = |key: &str| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let (Some(real_topic), Some(real_queue)) = (
            lookup(property::REAL_TOPIC),
            lookup(property::REAL_QID).and_then(|q| q.parse::<u32>().ok()),
        ) else {
            return Err(RequestError::SystemError(
                "the half message has no REAL_TOPIC/REAL_QID".into(),
            ));
        };
        let kept: Vec<(&str, &str)> = pairs
            .iter()
            .copied()
            .filter(|(key, _)| {
                ![property::REAL_TOPIC, property::REAL_QID, property::TRAN_MSG].contains(key)
            })
            .collect();
        let mut properties = Vec::with_capacity(half.properties.len());
        encode_properties(&mut properties, &kept);
        let tags_code = lookup(property::TAGS).map_or(0, |tag| i64::from(java_string_hash(tag)));
        // A delayed or timed message waits for its time from its commit on, as in RocketMQ.
        let divert = divert_for(&kept, &self.schedule.borrow().levels, now_ms())?;
        let (mut topic, mut queue_id, mut tags_code) = (real_topic, real_queue, tags_code);
        if divert != Divert::None {
            (topic, queue_id, tags_code) =
                self.divert(divert, real_topic, real_queue, &mut properties);
        }
        let message = MessageToStore {
            topic,
            queue_id,
            flag: half.flag,
            sys_flag: (half.sys_flag & !TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
            born_timestamp_ms: half.born_timestamp_ms,
            born_host: v4_or_local(half.born_host),
            reconsume_times: half.reconsume_times,
            prepared_transaction_offset: half_commitlog_offset as i64,
            body: half.body,
            properties: &properties,
            tags_code,
        };
        let appended = self.store.append(&message).map_err(store_error)?;
        self.stats
            .messages_put
            .set(self.stats.messages_put.get() + 1);
        if divert == Divert::None {
            self.notify_message_arrived(real_topic, real_queue);
        }
        Ok(appended.end_offset)
    }

    /// Marks a half as ended: its op record, then it leaves the pending table. If the store
    /// refuses the op record, the half stays, marked, and the next round writes it.
    fn finish_half(&self, half_offset: u64, committed: bool) -> Option<u64> {
        let op = self.append_op_record(half_offset);
        let mut transactions = self.transactions.borrow_mut();
        if committed {
            transactions.stats.committed += 1;
        } else {
            transactions.stats.rolled_back += 1;
        }
        transactions.dirty = true;
        match op {
            Ok(end) => {
                transactions.pending.remove(&half_offset);
                Some(end)
            }
            Err(error) => {
                eprintln!(
                    "shardmq: {}: the op record of the half message at offset {half_offset} \
                     was refused ({error}); retried by the next check round",
                    self.identity.broker_name
                );
                if let Some(pending) = transactions.pending.get_mut(&half_offset) {
                    pending.ending = false;
                    pending.op_unwritten = true;
                }
                None
            }
        }
    }

    /// Appends the op record "half `half_offset` has ended" (tag "d", body = the offset).
    fn append_op_record(&self, half_offset: u64) -> Result<u64, RequestError> {
        let body = half_offset.to_string();
        let mut properties = Vec::new();
        encode_properties(&mut properties, &[(property::TAGS, OP_REMOVE_TAG)]);
        let message = MessageToStore {
            topic: RMQ_SYS_TRANS_OP_HALF_TOPIC,
            queue_id: OP_QUEUE_ID,
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: now_ms(),
            born_host: self.identity.address,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: body.as_bytes(),
            properties: &properties,
            tags_code: i64::from(java_string_hash(OP_REMOVE_TAG)),
        };
        Ok(self.store.append(&message).map_err(store_error)?.end_offset)
    }

    /// One round of the check task: writes op records left unwritten, discards halves
    /// checked `check_max` times, and checks every half older than `timeout_ms` once.
    pub async fn check_transactions(&self) {
        let config = self.transactions.borrow().config;
        let now = now_ms();
        let due: Vec<(u64, PendingHalf)> = self
            .transactions
            .borrow()
            .pending
            .iter()
            .filter(|(_, p)| {
                p.op_unwritten || (!p.ending && now - p.stored_at_ms >= config.timeout_ms as i64)
            })
            .take(CHECKS_PER_ROUND_MAX)
            .map(|(offset, p)| (*offset, p.clone()))
            .collect();
        let mut waiting_for_producer: BTreeMap<String, usize> = BTreeMap::new();
        for (half_offset, pending) in due {
            if pending.op_unwritten {
                if self.append_op_record(half_offset).is_ok() {
                    self.forget_half(half_offset);
                }
            } else if pending.check_times >= config.check_max {
                self.discard_half(half_offset, &pending);
            } else if !self.check_half(half_offset, &pending).await {
                *waiting_for_producer
                    .entry(pending.producer_group.clone())
                    .or_default() += 1;
            }
        }
        for (group, count) in waiting_for_producer {
            eprintln!(
                "shardmq: {}: {count} half message(s) of group {group} wait for a live producer                  of the group to check them",
                self.identity.broker_name
            );
        }
    }

    fn forget_half(&self, half_offset: u64) {
        let mut transactions = self.transactions.borrow_mut();
        transactions.pending.remove(&half_offset);
        transactions.dirty = true;
    }

    fn discard_half(&self, half_offset: u64, pending: &PendingHalf) {
        if let Err(error) = self.append_op_record(half_offset) {
            eprintln!(
                "shardmq: {}: cannot discard the half message at offset {half_offset} yet: \
                 {error}",
                self.identity.broker_name
            );
            return;
        }
        eprintln!(
            "shardmq: {}: discarded the half message at offset {half_offset} (msgId {}, \
             group {}): checked {} times without an answer",
            self.identity.broker_name,
            pending.unique_id,
            pending.producer_group,
            pending.check_times
        );
        self.forget_half(half_offset);
        self.transactions.borrow_mut().stats.discarded += 1;
    }

    /// Sends CHECK_TRANSACTION_STATE for one half to a live producer of its group. A check
    /// counts towards the limit once it is sent, or when the half cannot be read (so an
    /// unreadable half ends); while no producer of the group is connected (a producer
    /// reconnecting after a broker restart heartbeats within 30 s) the half just waits, and
    /// this returns false. RocketMQ counts those rounds too, and with its 30 s interval
    /// seldom runs out of them; counting only real checks keeps a half from being discarded
    /// unasked.
    async fn check_half(&self, half_offset: u64, pending: &PendingHalf) -> bool {
        let Some(producer) = self
            .clients
            .borrow()
            .producer_connection(&pending.producer_group)
        else {
            return false;
        };
        let record = self.store.read_record(pending.commitlog_offset).await;
        {
            let mut transactions = self.transactions.borrow_mut();
            let Some(current) = transactions.pending.get_mut(&half_offset) else {
                return true; // ended meanwhile
            };
            if current.ending || current.op_unwritten {
                return true;
            }
            current.check_times += 1;
            transactions.dirty = true;
        }
        let body = match record {
            Ok(Some(record)) => match check_body(&record) {
                Some(body) => body,
                None => {
                    self.log_check_failure(half_offset, "its record is unreadable");
                    return true;
                }
            },
            Ok(None) => {
                self.log_check_failure(half_offset, "its record is gone");
                return true;
            }
            Err(error) => {
                self.log_check_failure(half_offset, &error.to_string());
                return true;
            }
        };
        let real_topic = record::decode(&body)
            .map(|m| m.topic.to_string())
            .unwrap_or_default();
        let offset_msg_id =
            record::offset_msg_id(self.identity.address.into(), pending.commitlog_offset);
        let opaque = producer.next_opaque();
        producer.send_with(|out| {
            let mut frame =
                FrameEncoder::request(out, request_code::CHECK_TRANSACTION_STATE, opaque, true);
            frame
                .ext("topic", &real_topic)
                .ext_i64("tranStateTableOffset", half_offset as i64)
                .ext_i64("commitLogOffset", pending.commitlog_offset as i64)
                .ext("msgId", &pending.unique_id)
                .ext("transactionId", &pending.unique_id)
                .ext("offsetMsgId", &offset_msg_id)
                .ext("bname", &self.identity.broker_name);
            frame.finish(&body);
        });
        self.transactions.borrow_mut().stats.checks_sent += 1;
        true
    }

    fn log_check_failure(&self, half_offset: u64, why: &str) {
        eprintln!(
            "shardmq: {}: cannot check the half message at offset {half_offset}: {why}",
            self.identity.broker_name
        );
    }

    /// Writes `transactionProgress.json` if the pending halves changed, once the commitlog
    /// is durable up to the state it describes.
    pub async fn persist_transactions(&self) {
        let (progress, path) = {
            let mut transactions = self.transactions.borrow_mut();
            if !transactions.dirty {
                return;
            }
            transactions.dirty = false;
            let progress = Progress {
                half_scanned_offset: self
                    .store
                    .max_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID),
                op_scanned_offset: self
                    .store
                    .max_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, OP_QUEUE_ID),
                pending: transactions
                    .pending
                    .iter()
                    .map(|(offset, p)| (*offset, p.check_times))
                    .collect(),
            };
            (progress, transactions.progress_path.clone())
        };
        let described_end = self.store.max_physical_offset();
        if let Err(error) = self.store.wait_durable(described_end).await {
            self.transactions.borrow_mut().dirty = true;
            eprintln!(
                "shardmq: {}: transaction progress not written, the store failed: {error}",
                self.identity.broker_name
            );
            return;
        }
        if let Err(error) = crate::persist::write_json_file(&path, &progress.to_json()) {
            self.transactions.borrow_mut().dirty = true;
            eprintln!(
                "shardmq: {}: cannot write {}: {error}",
                self.identity.broker_name,
                path.display()
            );
        }
    }

    /// Rebuilds the pending halves at start (see the module docs); before serving.
    pub async fn recover_transactions(&self) {
        let path = self.transactions.borrow().progress_path.clone();
        let progress =
            crate::persist::read_with_fallback(&path, Progress::parse).unwrap_or_default();
        let mut found: BTreeMap<u64, PendingHalf> = BTreeMap::new();
        // Halves listed by the progress file: read each one.
        for &(offset, check_times) in &progress.pending {
            let records = self.read_halves(offset, 1).await;
            if let Some((_, half)) = records.into_iter().find(|(o, _)| *o == offset) {
                found.insert(
                    offset,
                    PendingHalf {
                        check_times,
                        ..half
                    },
                );
            }
        }
        // Halves appended after it.
        let half_end = self
            .store
            .max_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID);
        let mut next = progress.half_scanned_offset.max(
            self.store
                .min_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID),
        );
        while next < half_end {
            let records = self.read_halves(next, RECOVERY_BATCH_MESSAGES).await;
            let Some(last) = records.last().map(|(offset, _)| *offset) else {
                break;
            };
            for (offset, half) in records {
                found.insert(offset, half);
            }
            next = last + 1;
        }
        // Ends recorded after it.
        let ended = self.read_op_offsets(progress.op_scanned_offset).await;
        for offset in &ended {
            found.remove(offset);
        }
        let count = found.len();
        let mut transactions = self.transactions.borrow_mut();
        transactions.pending = found;
        transactions.dirty = true;
        if count > 0 {
            eprintln!(
                "shardmq: {}: {count} half message(s) wait for their transaction's end",
                self.identity.broker_name
            );
        }
    }

    /// Half offsets named by the op records from queue offset `from` on.
    async fn read_op_offsets(&self, from: u64) -> Vec<u64> {
        let end = self
            .store
            .max_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, OP_QUEUE_ID);
        let mut next = from.max(
            self.store
                .min_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, OP_QUEUE_ID),
        );
        let mut offsets = Vec::new();
        while next < end {
            let result = self
                .store
                .get_messages(
                    RMQ_SYS_TRANS_OP_HALF_TOPIC,
                    OP_QUEUE_ID,
                    next,
                    RECOVERY_BATCH_MESSAGES,
                    RECOVERY_BATCH_BYTES,
                    &|_| true,
                )
                .await;
            let Ok(result) = result else { break };
            if result.status != GetStatus::Found {
                break;
            }
            let Ok(records) = record::decode_all(&result.body) else {
                break;
            };
            for op in &records {
                // RocketMQ 5 batches several offsets in one op body, comma-separated.
                let text = String::from_utf8_lossy(op.body);
                offsets.extend(text.split(',').filter_map(|o| o.trim().parse::<u64>().ok()));
            }
            next = result.next_begin_offset.max(next + 1);
        }
        offsets
    }

    /// Up to `max` half records from `offset`, as pending entries by queue offset.
    async fn read_halves(&self, offset: u64, max: u32) -> Vec<(u64, PendingHalf)> {
        let result = self
            .store
            .get_messages(
                RMQ_SYS_TRANS_HALF_TOPIC,
                HALF_QUEUE_ID,
                offset,
                max,
                RECOVERY_BATCH_BYTES,
                &|_| true,
            )
            .await;
        let Ok(result) = result else {
            return Vec::new();
        };
        if result.status != GetStatus::Found {
            return Vec::new();
        }
        let Ok(records) = record::decode_all(&result.body) else {
            return Vec::new();
        };
        records
            .iter()
            .map(|half| {
                let text = |key| {
                    record::property(half.properties, key)
                        .and_then(|v| std::str::from_utf8(v).ok())
                        .unwrap_or_default()
                        .to_string()
                };
                let pending = PendingHalf {
                    commitlog_offset: half.physical_offset,
                    stored_at_ms: half.store_timestamp_ms,
                    producer_group: text(property::PGROUP),
                    unique_id: text(property::UNIQ_KEY),
                    check_times: 0,
                    ending: false,
                    op_unwritten: false,
                };
                (half.queue_offset, pending)
            })
            .collect()
    }
}

/// The check request's body: the half record re-encoded with its real topic and queue.
fn check_body(record: &[u8]) -> Option<Vec<u8>> {
    let half = record::decode(record).ok()?;
    let real_topic =
        std::str::from_utf8(record::property(half.properties, property::REAL_TOPIC)?).ok()?;
    let real_queue = std::str::from_utf8(record::property(half.properties, property::REAL_QID)?)
        .ok()?
        .parse::<u32>()
        .ok()?;
    let mut body = Vec::with_capacity(record.len());
    let shown = record::StoredMessage {
        topic: real_topic,
        queue_id: real_queue,
        ..half
    };
    record::encode_into(&shown, &mut body);
    Some(body)
}

fn v4_or_local(addr: SocketAddr) -> SocketAddrV4 {
    match addr {
        SocketAddr::V4(v4) => v4,
        SocketAddr::V6(v6) => SocketAddrV4::new(
            v6.ip()
                .to_ipv4_mapped()
                .unwrap_or(std::net::Ipv4Addr::LOCALHOST),
            v6.port(),
        ),
    }
}

/// The check task of one shard: a round every `check_interval_ms`, then the progress file.
pub async fn run_checks(broker: Rc<Broker>) {
    loop {
        let interval = broker.transactions.borrow().config.check_interval_ms;
        shards::runtime::sleep(Duration::from_millis(interval)).await;
        broker.check_transactions().await;
        broker.persist_transactions().await;
    }
}

/// Where a send stores a half message: (topic, queue id).
pub(super) const HALF_QUEUE: (&str, u32) = (RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID);

/// A half message's sysFlag: the sender's, transaction bits cleared (as RocketMQ stores it).
pub(super) fn half_sys_flag(sys_flag: i32) -> i32 {
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

    #[test]
    fn the_check_body_names_the_real_topic_and_queue() {
        let mut properties = Vec::new();
        encode_properties(
            &mut properties,
            &[
                (property::REAL_TOPIC, "Orders"),
                (property::REAL_QID, "3"),
                (property::PGROUP, "P"),
            ],
        );
        let host = SocketAddr::from(([127, 0, 0, 1], 10911));
        let half = record::StoredMessage {
            total_size: 0,
            body_crc: 0,
            queue_id: 0,
            flag: 0,
            queue_offset: 5,
            physical_offset: 4096,
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: host,
            store_timestamp_ms: 2,
            store_host: host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: b"payload",
            topic: RMQ_SYS_TRANS_HALF_TOPIC,
            properties: &properties,
        };
        let mut stored = Vec::new();
        record::encode_into(&half, &mut stored);
        let body = check_body(&stored).unwrap();
        let shown = record::decode(&body).unwrap();
        assert_eq!((shown.topic, shown.queue_id), ("Orders", 3));
        assert_eq!(shown.body, b"payload");
        assert_eq!(shown.total_size as usize, body.len());
        assert_eq!(
            record::property(shown.properties, property::PGROUP),
            Some(&b"P"[..])
        );
        assert!(check_body(b"garbage").is_none());
    }
}
