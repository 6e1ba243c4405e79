//! END_TRANSACTION (37): the end of a transactional half message (see state/transactions.rs
//! for the whole protocol). COMMIT rebuilds the message for its real topic and queue and
//! appends it through `route`/`append`, then the op record; ROLLBACK writes only the op record.

use std::rc::Rc;

use shards::store::{record, FlushMode};

use crate::body::{encode_properties, java_string_hash, parse_properties, property};
use crate::broker::append::{to_v4, Outgoing};
use crate::broker::route::{route, Destination, RouteRequest};
use crate::broker::state::schedule::divert_for;
use crate::broker::state::transactions::{
    OP_QUEUE_ID, OP_REMOVE_TAG, RMQ_SYS_TRANS_OP_HALF_TOPIC, TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK,
};
use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{response_code, RemotingCommand};
use crate::server::Connection;

/// The END_TRANSACTION request header.
pub(crate) struct EndHeader {
    pub(crate) producer_group: String,
    pub(crate) half_offset: u64,
    pub(crate) commitlog_offset: u64,
    pub(crate) commit: bool,
    pub(crate) from_check: bool,
}

impl Broker {
    /// END_TRANSACTION (37).
    pub(crate) fn end_transaction(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        self.refuse_write_if_slave()?;
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
                        .wait_durable(shards::CommitLogOffset(end_offset))
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
}

impl Broker {
    /// Checks the request against the pending half and marks it as being ended.
    pub(crate) fn claim_half(&self, header: &EndHeader) -> Result<(), RequestError> {
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
}

impl Broker {
    /// Commits or rolls back a claimed half; returns the commitlog end to wait durable for.
    pub(crate) async fn end_half(&self, header: &EndHeader) -> Result<u64, RequestError> {
        let read = self
            .store
            .read_record(shards::CommitLogOffset(header.commitlog_offset))
            .await;
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
            log::warn!(
                "{}: the producer {} the half message at offset {} when checked",
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
}

impl Broker {
    /// Appends the committed message for its real topic and queue; returns its end offset.
    pub(crate) fn append_committed(
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
        let wait = divert_for(&kept, &self.schedule.borrow().levels, self.now_ms())?;
        let destination = route(&RouteRequest {
            topic: real_topic,
            queue_id: real_queue,
            retry: None,
            half: false,
            wait,
        });
        let message = Outgoing {
            flag: half.flag,
            sys_flag: (half.sys_flag & !TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
            born_timestamp_ms: half.born_timestamp_ms,
            born_host: to_v4(half.born_host),
            reconsume_times: half.reconsume_times,
            prepared_transaction_offset: half_commitlog_offset as i64,
            body: half.body,
            properties: &mut properties,
            tags_code,
            keys: None,
            unique_id: "",
            producer_group: "",
        };
        let appended = self.append(message, &destination).map_err(store_error)?;
        Ok(appended.end_offset.0)
    }
}

impl Broker {
    /// Marks a half as ended: its op record, then it leaves the pending table. If the store
    /// refuses the op record, the half stays, marked, and the next round writes it.
    pub(crate) fn finish_half(&self, half_offset: u64, committed: bool) -> Option<u64> {
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
                log::warn!(
                    "{}: the op record of the half message at offset {half_offset} \
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
}

impl Broker {
    /// Appends the op record "half `half_offset` has ended" (tag "d", body = the offset).
    pub(crate) fn append_op_record(&self, half_offset: u64) -> Result<u64, RequestError> {
        let body = half_offset.to_string();
        let mut properties = Vec::new();
        encode_properties(&mut properties, &[(property::TAGS, OP_REMOVE_TAG)]);
        let message = Outgoing {
            flag: 0,
            sys_flag: 0,
            born_timestamp_ms: self.now_ms(),
            born_host: self.identity.address,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: body.as_bytes(),
            properties: &mut properties,
            tags_code: i64::from(java_string_hash(OP_REMOVE_TAG)),
            keys: None,
            unique_id: "",
            producer_group: "",
        };
        let destination = Destination::Queue {
            topic: RMQ_SYS_TRANS_OP_HALF_TOPIC,
            queue_id: OP_QUEUE_ID,
        };
        Ok((self
            .append(message, &destination)
            .map_err(store_error)?
            .end_offset)
            .0)
    }
}
