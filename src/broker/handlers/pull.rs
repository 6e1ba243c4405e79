//! PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361), with long polling.
//!
//! A pull that finds nothing and may suspend is parked in the shard's long-poll wheel
//! (`shards::long_poll`) under its (topic, queue id) and its connection; the append of a
//! message to that queue wakes it at once, and the shard's ticking task (`tick`, every
//! `PULL_WHEEL_TICK_MS`) expires it when its suspend timeout runs out. Either way it re-runs
//! the read once, without suspending, as RocketMQ does, and answers (PULL_NOT_FOUND if still
//! empty). A closed connection drops its parked pulls at once, unanswered. At most
//! `PARKED_PULLS_MAX` pulls are parked per shard; beyond it a pull gets SYSTEM_BUSY.
//!
//! Reading the store waits for room in the connection's output (`Connection::reserve_output`),
//! so a consumer that never reads its answers never makes the broker buffer without bound.
//!
//! The pull's filter (TAG, or SQL92 over each candidate's properties) is chosen in
//! `filters.rs`; the store applies it in two stages (`shards::store::PullFilter`).

use std::rc::Rc;

use shards::long_poll::ParkOutcome;
use shards::store::{GetMessageResult, GetStatus, PropertiesFilter, PullFilter};

use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::filter::MessageFilter;
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

pub use crate::limits::PULL_BATCH_MAX_MESSAGES;

pub use crate::limits::PULL_BATCH_MAX_BYTES;

pub use crate::limits::PULL_SUSPEND_MAX_MS;

pub use crate::limits::PARKED_PULLS_MAX;

/// Granularity of the long-poll wheel: a parked pull expires at most this late (plus the
/// shard's own lateness), and the shard's ticking task runs this often.
pub const PULL_WHEEL_TICK_MS: u64 = 5;

/// Slots of the long-poll wheel: one turn (20.48 s) covers the clients' usual suspend
/// timeouts (15 s, 20 s), so a slot scan rarely meets an entry due in a later round.
pub const PULL_WHEEL_SLOTS: usize = 4096;

const _: () = assert!(PULL_WHEEL_TICK_MS * PULL_WHEEL_SLOTS as u64 >= 20_000);

pub use crate::limits::PULL_ANSWER_HEADER_MAX_BYTES;

pub(crate) const PULL_FLAG_COMMIT_OFFSET: i32 = 0x1;

pub(crate) const PULL_FLAG_SUSPEND: i32 = 0x2;

pub(crate) const PULL_FLAG_SUBSCRIPTION: i32 = 0x4;

/// The owned parts of a pull request (the frame buffer is reused while the pull waits).
pub(crate) struct PullRequest {
    pub(crate) opaque: i32,
    pub(crate) oneway: bool,
    pub(crate) group: String,
    pub(crate) topic: String,
    pub(crate) queue_id: u32,
    pub(crate) queue_offset: u64,
    pub(crate) max_messages: u32,
    pub(crate) max_bytes: u32,
    pub(crate) suspend_timeout_ms: u64,
    pub(crate) may_suspend: bool,
    pub(crate) filter: MessageFilter,
}

pub(crate) fn respond_error(connection: &Connection, pull: &PullRequest, error: RequestError) {
    if !pull.oneway {
        error.respond(connection, pull.opaque);
    }
}

/// RocketMQ's mapping from store status to pull response code (REMOTING.md §3.3).
pub(crate) fn pull_code(result: &GetMessageResult, requested_offset: u64) -> i32 {
    match result.status {
        GetStatus::Found => response_code::SUCCESS,
        GetStatus::NoMessageInQueue if requested_offset == 0 => response_code::PULL_NOT_FOUND,
        GetStatus::NoMessageInQueue => response_code::PULL_OFFSET_MOVED,
        GetStatus::OffsetOverflowOne => response_code::PULL_NOT_FOUND,
        GetStatus::OffsetTooSmall | GetStatus::OffsetOverflowBadly => {
            response_code::PULL_OFFSET_MOVED
        }
        GetStatus::NoMatchedMessage | GetStatus::OffsetFoundNull => {
            response_code::PULL_RETRY_IMMEDIATELY
        }
    }
}

pub(crate) fn status_name(status: GetStatus) -> &'static str {
    match status {
        GetStatus::Found => "FOUND",
        GetStatus::NoMessageInQueue => "NO_MESSAGE_IN_QUEUE",
        GetStatus::OffsetTooSmall => "OFFSET_TOO_SMALL",
        GetStatus::OffsetOverflowOne => "OFFSET_OVERFLOW_ONE",
        GetStatus::OffsetOverflowBadly => "OFFSET_OVERFLOW_BADLY",
        GetStatus::NoMatchedMessage => "NO_MATCHED_MESSAGE",
        GetStatus::OffsetFoundNull => "OFFSET_FOUND_NULL",
    }
}

impl Broker {
    /// The read queues of `topic` a consumer may name here, and its perm when this shard has
    /// its config. A slave serves the queues it holds copies of before it has copied the
    /// topic's config from its master (every 10 s): the master may be gone by then.
    pub(crate) fn consumable_queues(
        &self,
        topic: &str,
    ) -> Result<(u32, Option<u32>), RequestError> {
        if let Some(config) = self.topics.borrow().get(topic) {
            return Ok((config.read_queue_nums, Some(config.perm)));
        }
        let held = self.ha.is_slave().then(|| {
            let ids = self.store.queue_ids(topic);
            ids.iter().map(|id| id.0 + 1).max()
        });
        let read_queues = held.flatten().ok_or_else(|| {
            RequestError::TopicNotExist(format!("topic[{topic}] not exist, apply first please!"))
        })?;
        Ok((read_queues, None))
    }

    pub(crate) fn pull_message(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("consumerGroup")?;
        let topic = ext.required("topic")?;
        let queue_id = ext.required_i32("queueId")?;
        let queue_offset = ext.required_i64("queueOffset")?.max(0) as u64;
        let sys_flag = ext.optional_i32("sysFlag")?.unwrap_or(0);
        let max_messages = ext.optional_i32("maxMsgNums")?.unwrap_or(32).max(1) as u32;
        let max_bytes = ext
            .optional_i32("maxMsgBytes")?
            .map_or(PULL_BATCH_MAX_BYTES, |b| b.max(1) as u32);
        let suspend_timeout_ms = ext
            .optional_i64("suspendTimeoutMillis")?
            .unwrap_or(15_000)
            .max(0) as u64;
        self.check_group_may_pull(group)?;
        let (read_queues, perm) = self.consumable_queues(topic)?;
        if perm.is_some_and(|perm| perm & crate::body::perm::READ == 0) {
            return Err(RequestError::NoPermission(format!(
                "the topic[{topic}] pulling message is forbidden"
            )));
        }
        if queue_id < 0 || queue_id as u32 >= read_queues {
            return Err(RequestError::InvalidParameter(format!(
                "queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:[{read_queues}]"
            )));
        }
        let filter = match ext.get_non_empty("subscription") {
            Some(expression) if sys_flag & PULL_FLAG_SUBSCRIPTION != 0 => {
                self.compile_filter(group, topic, expression, ext.get("expressionType"))?
            }
            _ => self.subscribed_filter(group, topic)?,
        };
        if sys_flag & PULL_FLAG_COMMIT_OFFSET != 0 {
            if let Some(commit_offset) = ext.optional_i64("commitOffset")? {
                // Past the offsets kept, a pull still reads: its commit is what waits
                // (logged a few times a second at most).
                if let Err(refused) =
                    self.commit_offset(group, topic, queue_id as u32, commit_offset)
                {
                    self.note_refused_commit(&refused);
                }
            }
        }
        let pull = PullRequest {
            opaque: request.opaque,
            oneway: request.is_oneway(),
            group: group.to_string(),
            topic: topic.to_string(),
            queue_id: queue_id as u32,
            queue_offset,
            max_messages: max_messages.min(PULL_BATCH_MAX_MESSAGES),
            max_bytes: max_bytes.min(PULL_BATCH_MAX_BYTES),
            suspend_timeout_ms: suspend_timeout_ms.min(PULL_SUSPEND_MAX_MS),
            may_suspend: sys_flag & PULL_FLAG_SUSPEND != 0,
            filter,
        };
        let broker = self.clone();
        let in_flight = connection.in_flight();
        let connection = connection.clone();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            broker.serve_pull(pull, connection).await
        });
        Ok(())
    }

    /// The group's settings allow this pull: consumeEnable, and consumeBroadcastEnable for
    /// a group whose consumers said BROADCASTING in their heartbeat.
    pub(crate) fn check_group_may_pull(&self, group: &str) -> Result<(), RequestError> {
        let config = self.consumer_group_config(group)?;
        if !config.consume_enable {
            return Err(RequestError::NoPermission(format!(
                "subscription group no permission, {group}"
            )));
        }
        let broadcasting = self
            .clients
            .borrow()
            .consumers
            .get(group)
            .is_some_and(|g| g.message_model == crate::body::MessageModel::Broadcasting);
        if broadcasting && !config.consume_broadcast_enable {
            return Err(RequestError::NoPermission(format!(
                "the consumer group[{group}] can not consume by broadcast way"
            )));
        }
        Ok(())
    }

    pub(crate) async fn serve_pull(self: Rc<Self>, pull: PullRequest, connection: Rc<Connection>) {
        let Some(mut result) = self.read_queue(&pull, &connection).await else {
            return; // its connection closed while it waited for room
        };
        let found_nothing = matches!(&result, Ok(r) if pull_code(r, pull.queue_offset) == response_code::PULL_NOT_FOUND);
        if found_nothing && pull.may_suspend && pull.suspend_timeout_ms > 0 {
            match self.park_pull(&pull, &connection).await {
                Ok(ParkOutcome::ConnectionClosed) => return,
                Ok(ParkOutcome::Arrived | ParkOutcome::Expired) => {}
                Err(error) => return respond_error(&connection, &pull, error),
            }
            let Some(again) = self.read_queue(&pull, &connection).await else {
                return;
            };
            result = again;
        }
        if pull.oneway {
            return;
        }
        match result {
            Ok(found) => self.respond_found(&connection, &pull, found),
            Err(error) => respond_error(&connection, &pull, error),
        }
    }

    /// suggestWhichBrokerId (PullMessageProcessor): with slaveReadEnable, a master suggests
    /// its slave (whichBrokerWhenConsumeSlowly, 1) when what was pulled lies further behind
    /// the log's end than 40% of the host's memory (accessMessageInMemoryMaxRatio: no longer
    /// in memory on a JVM broker); otherwise the master (0).
    fn suggest_broker_id(&self, found: &shards::store::GetMessageResult) -> i64 {
        const PHYSICAL_OFFSET_AT: usize = 28;
        if !self.ha.config.slave_read_enable || self.ha.is_slave() {
            return 0;
        }
        let Some(bytes) = found.body.get(PHYSICAL_OFFSET_AT..PHYSICAL_OFFSET_AT + 8) else {
            return 0;
        };
        let first = u64::from_be_bytes(bytes.try_into().expect("8 bytes"));
        let behind = self.store.max_physical_offset().0.saturating_sub(first);
        // SAFETY: sysconf reads constants of the system.
        let memory = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) as u64 }
            * unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 };
        i64::from(behind > memory / 100 * 40)
    }

    /// Parks a pull that found nothing until a message reaches its queue, its suspend
    /// timeout passes or its connection closes.
    pub(crate) async fn park_pull(
        &self,
        pull: &PullRequest,
        connection: &Connection,
    ) -> Result<ParkOutcome, RequestError> {
        if connection.is_closed() {
            return Ok(ParkOutcome::ConnectionClosed);
        }
        // The read above awaited: a message may have arrived since (nothing awaits between
        // this check and parking, so none can slip in after it).
        let reset = self
            .pending_resets
            .borrow()
            .contains(&pull.group, &pull.topic, pull.queue_id);
        if reset
            || self
                .store
                .max_queue_offset(&pull.topic, shards::QueueId(pull.queue_id))
                > shards::QueueOffset(pull.queue_offset)
        {
            return Ok(ParkOutcome::Arrived);
        }
        let deadline_ms = self.monotonic_ms() + pull.suspend_timeout_ms;
        let id = self
            .pull_waiters
            .park(&pull.topic, pull.queue_id, connection.id, deadline_ms)
            .map_err(|full| {
                RequestError::SystemBusy(format!(
                    "[PULL]too many pulls are waiting on this broker, try again later: {full}"
                ))
            })?;
        connection.note_suspended(pull.opaque);
        Ok(self.pull_waiters.wait(id).await)
    }

    /// Reads what the pull asks for once its answer has room in the connection's output;
    /// None when the connection closed meanwhile (nothing is read: the thousands of pulls a
    /// slow consumer had waiting end at its close without reading the store, which once
    /// made a burst of reads and answers nobody would get — a second of the shard and
    /// hundreds of MB).
    pub(crate) async fn read_queue(
        &self,
        pull: &PullRequest,
        connection: &Rc<Connection>,
    ) -> Option<Result<GetMessageResult, RequestError>> {
        // Held until this pull's answer is in the output buffer (or dropped unanswered).
        let _room = connection
            .reserve_output(pull.max_bytes as usize + PULL_ANSWER_HEADER_MAX_BYTES)
            .await;
        if connection.is_closed() {
            return None;
        }
        Some(self.read_reserved(pull).await)
    }

    async fn read_reserved(&self, pull: &PullRequest) -> Result<GetMessageResult, RequestError> {
        let (group, topic, queue_id) = (&pull.group, &pull.topic, pull.queue_id);
        if let Some(moved) = self.pending_reset_answer(group, topic, queue_id, pull.queue_offset) {
            return Ok(moved);
        }
        let tags_code = |tags_code: i64| pull.filter.matches_tags_code(tags_code);
        let sql = pull.filter.sql();
        let properties = |properties: &[u8]| sql.is_some_and(|e| e.matches_properties(properties));
        let filter = PullFilter {
            tags_code: &tags_code,
            // Only SQL92 filters read records; TAG pulls stay on the consume queue.
            properties: sql.map(|_| &properties as PropertiesFilter<'_>),
        };
        let started = std::time::Instant::now();
        let found = self
            .store
            .get_messages_matching(
                &pull.topic,
                shards::QueueId(pull.queue_id),
                shards::QueueOffset(pull.queue_offset),
                pull.max_messages,
                pull.max_bytes,
                &filter,
            )
            .await
            .map_err(store_error);
        let ms = started.elapsed().as_millis() as u64;
        if ms > self.stats.get_time_max_ms.get() {
            self.stats.get_time_max_ms.set(ms);
        }
        found
    }

    pub(crate) fn respond_found(
        &self,
        connection: &Connection,
        pull: &PullRequest,
        found: GetMessageResult,
    ) {
        let code = pull_code(&found, pull.queue_offset);
        let counter = match code {
            response_code::SUCCESS => &self.stats.gets_found,
            _ => &self.stats.gets_missed,
        };
        counter.set(counter.get() + 1);
        if code == response_code::SUCCESS {
            let got = self.stats.messages_got.get() + u64::from(found.message_count);
            self.stats.messages_got.set(got);
            self.stats.flows.borrow_mut().note_out(
                &pull.topic,
                &pull.group,
                u64::from(found.message_count),
                found.body.len() as u64,
            );
            self.offsets.borrow_mut().note_pulled(
                &pull.group,
                &pull.topic,
                pull.queue_id,
                found.next_begin_offset.0,
            );
        }
        let suggest = self.suggest_broker_id(&found);
        let body = if code == response_code::SUCCESS {
            found.body
        } else {
            Vec::new()
        };
        connection.send_with_body(
            |out, body_bytes| {
                let mut frame = FrameEncoder::response(out, code, pull.opaque);
                frame
                    .remark(status_name(found.status))
                    .ext_i64("suggestWhichBrokerId", suggest)
                    .ext_i64("nextBeginOffset", found.next_begin_offset.0 as i64)
                    .ext_i64("minOffset", found.min_offset.0 as i64)
                    .ext_i64("maxOffset", found.max_offset.0 as i64)
                    .ext_i64("topicSysFlag", 0)
                    .ext_i64("groupSysFlag", 0);
                frame.finish_header(body_bytes);
            },
            body,
        );
    }
}
