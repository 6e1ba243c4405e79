//! The transaction check task (every `check_interval_ms`), and the restart bookkeeping of
//! half messages: `config/transactionProgress.json` written after each round, read back by
//! `recover_transactions` (state/transactions.rs has the model).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use shards::store::{record, GetStatus};

use crate::body::property;
use crate::broker::state::transactions::{
    PendingHalf, Progress, HALF_QUEUE_ID, OP_QUEUE_ID, RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
};
use crate::broker::Broker;
use crate::remoting::{request_code, FrameEncoder};

pub use crate::limits::CHECKS_PER_ROUND_MAX;

/// Records one recovery read takes from a queue.
pub(crate) const RECOVERY_BATCH_MESSAGES: u32 = 256;

pub(crate) const RECOVERY_BATCH_BYTES: u32 = 4 << 20;

/// The check request's body: the half record re-encoded with its real topic and queue.
pub(crate) fn check_body(record: &[u8]) -> Option<Vec<u8>> {
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

/// The check task of one shard: a round every `check_interval_ms`, then the progress file.
pub async fn run_checks(broker: Rc<Broker>) {
    loop {
        let interval = broker.transactions.borrow().config.check_interval_ms;
        shards::runtime::sleep(Duration::from_millis(interval)).await;
        if broker.ha.is_slave() {
            continue; // its master checks (and writes the op records that replicate here)
        }
        broker.check_transactions().await;
        broker.persist_transactions().await;
    }
}

impl Broker {
    /// One round of the check task: writes op records left unwritten, discards halves
    /// checked `check_max` times, and checks every half older than `timeout_ms` once.
    pub async fn check_transactions(&self) {
        let config = self.transactions.borrow().config;
        let now = self.now_ms();
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
        let commitlog_start = self.store.min_physical_offset().0;
        for (half_offset, pending) in due {
            if pending.commitlog_offset < commitlog_start {
                // Retention deleted its segment: nothing is left to check or deliver.
                log::warn!(
                    "{}: dropped the half message at offset {half_offset} (msgId {}, group \
                     {}): its commitlog segment was deleted by retention before its \
                     transaction ended",
                    self.identity.broker_name,
                    pending.unique_id,
                    pending.producer_group
                );
                self.forget_half(half_offset);
                self.transactions.borrow_mut().stats.discarded += 1;
            } else if pending.op_unwritten {
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
            log::warn!(
                "{}: {count} half message(s) of group {group} wait for a live producer of the \
                 group to check them",
                self.identity.broker_name
            );
        }
    }

    pub(crate) fn forget_half(&self, half_offset: u64) {
        let mut transactions = self.transactions.borrow_mut();
        transactions.pending.remove(&half_offset);
        transactions.dirty = true;
    }

    pub(crate) fn discard_half(&self, half_offset: u64, pending: &PendingHalf) {
        if let Err(error) = self.append_op_record(half_offset) {
            log::warn!(
                "{}: cannot discard the half message at offset {half_offset} yet: \
                 {error}",
                self.identity.broker_name
            );
            return;
        }
        log::warn!(
            "{}: discarded the half message at offset {half_offset} (msgId {}, \
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
    pub(crate) async fn check_half(&self, half_offset: u64, pending: &PendingHalf) -> bool {
        let Some(producer) = self
            .clients
            .borrow()
            .producer_connection(&pending.producer_group)
        else {
            return false;
        };
        let record = self
            .store
            .read_record(shards::CommitLogOffset(pending.commitlog_offset))
            .await;
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

    pub(crate) fn log_check_failure(&self, half_offset: u64, why: &str) {
        log::warn!(
            "{}: cannot check the half message at offset {half_offset}: {why}",
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
                half_scanned_offset: (self
                    .store
                    .max_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, shards::QueueId(HALF_QUEUE_ID)))
                .0,
                op_scanned_offset: (self
                    .store
                    .max_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, shards::QueueId(OP_QUEUE_ID)))
                .0,
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
            log::warn!(
                "{}: transaction progress not written, the store failed: {error}",
                self.identity.broker_name
            );
            return;
        }
        let (target, json) = (path.clone(), progress.to_json());
        let written =
            shards::runtime::blocking(move || crate::persist::write_json_file(&target, &json))
                .await;
        if let Err(error) = written {
            self.transactions.borrow_mut().dirty = true;
            log::warn!(
                "{}: cannot write {}: {error}",
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
            .max_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, shards::QueueId(HALF_QUEUE_ID));
        let mut next = progress.half_scanned_offset.max(
            (self
                .store
                .min_queue_offset(RMQ_SYS_TRANS_HALF_TOPIC, shards::QueueId(HALF_QUEUE_ID)))
            .0,
        );
        while next < half_end.0 {
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
            log::warn!(
                "{}: {count} half message(s) wait for their transaction's end",
                self.identity.broker_name
            );
        }
    }

    /// Half offsets named by the op records from queue offset `from` on.
    pub(crate) async fn read_op_offsets(&self, from: u64) -> Vec<u64> {
        let end = self
            .store
            .max_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, shards::QueueId(OP_QUEUE_ID));
        let mut next = from.max(
            (self
                .store
                .min_queue_offset(RMQ_SYS_TRANS_OP_HALF_TOPIC, shards::QueueId(OP_QUEUE_ID)))
            .0,
        );
        let mut offsets = Vec::new();
        while next < end.0 {
            let result = self
                .store
                .get_messages(
                    RMQ_SYS_TRANS_OP_HALF_TOPIC,
                    shards::QueueId(OP_QUEUE_ID),
                    shards::QueueOffset(next),
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
            next = (result.next_begin_offset.max(shards::QueueOffset(next + 1))).0;
        }
        offsets
    }

    /// Up to `max` half records from `offset`, as pending entries by queue offset.
    pub(crate) async fn read_halves(&self, offset: u64, max: u32) -> Vec<(u64, PendingHalf)> {
        let result = self
            .store
            .get_messages(
                RMQ_SYS_TRANS_HALF_TOPIC,
                shards::QueueId(HALF_QUEUE_ID),
                shards::QueueOffset(offset),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::encode_properties;
    use std::net::SocketAddr;

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
