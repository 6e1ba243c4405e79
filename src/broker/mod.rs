//! The broker role of one shard: shard i is broker `<brokerName>-<i>`, one RocketMQ broker
//! endpoint with its own port, store, topics, offsets, clients and long-poll waiters.
//!
//! Handlers live one family per file (send, pull, offsets and lookups, clients, admin);
//! each answers every request it is given, and errors reach the wire through
//! `RequestError::code_and_remark`.

mod append;
pub mod handlers;
#[cfg(test)]
pub mod harness;
pub mod route;
pub mod state;
pub mod tasks;

pub use state::{schedule, store_stats, topics, transactions as transaction};
pub use tasks::registration;

use std::cell::{Cell, RefCell};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::rc::Rc;

use shards::long_poll::{LongPoll, ParkedPulls};
use shards::store::Store;

use crate::body::TopicConfig;
use crate::error::RequestError;
use crate::remoting::{request_code as rc, RemotingCommand};
use crate::server::Connection;

use handlers::pull;
use state::{clients, groups, locks, offsets, resets};
use tasks::{durable, ticking};

pub use clients::{ClientTable, CLIENT_EXPIRY_MS, CLIENT_SCAN_INTERVAL_MS};
pub use offsets::{OffsetTable, OFFSET_FLUSH_INTERVAL_MS};
pub use pull::PULL_WHEEL_TICK_MS;
pub use topics::TopicTable;

/// A topic change one shard tells the others about (topics live on every shard of a node).
#[derive(Debug, Clone)]
pub enum TopicChange {
    Upsert(TopicConfig),
    Delete(String),
}

/// The namesrv side of this node, as a topic change waits for it (see `Broker::local_routes`).
#[derive(Clone)]
pub struct LocalRoutes {
    pub table: Rc<RefCell<crate::namesrv::RouteTable>>,
    pub shard_count: usize,
    /// Whether every replica has applied every update broadcast so far.
    pub replicas_caught_up: Rc<dyn Fn() -> bool>,
    /// Notified whenever this shard's route replica may have changed (a local update, one
    /// from another shard, or another shard's progress).
    pub changed: Rc<shards::sync::Event>,
}

/// What identifies this shard's broker to the world.
#[derive(Debug, Clone)]
pub struct BrokerIdentity {
    pub cluster_name: String,
    /// `<brokerName>-<shard>`
    pub broker_name: String,
    /// The address clients are given (brokerIP1:port).
    pub address: SocketAddrV4,
    pub shard_dir: PathBuf,
}

/// Running totals for GET_BROKER_RUNTIME_INFO.
#[derive(Default)]
pub struct BrokerStats {
    pub messages_put: Cell<u64>,
    pub messages_got: Cell<u64>,
    pub started_at_ms: Cell<i64>,
    /// Messages in and out by topic and group, sizes (the metrics endpoint's counters).
    pub flows: RefCell<crate::metrics::Flows>,
    /// Pulls that found messages, and that found none (getFoundTps, getMissTps).
    pub gets_found: Cell<u64>,
    pub gets_missed: Cell<u64>,
    /// The longest store read of a pull, ms (getMessageEntireTimeMax).
    pub get_time_max_ms: Cell<u64>,
    /// How long sends take to be answered (SYNC_FLUSH: once durable), from the request
    /// timing (`store_stats::record_put`).
    pub put_latency: Rc<RefCell<store_stats::PutLatency>>,
    /// The samples RocketMQ's rates and VIEW_BROKER_STATS_DATA are computed from.
    pub history: RefCell<store_stats::StatsHistory>,
    pub day_marks: Cell<store_stats::DayMarks>,
    /// Sends refused, by reason (`shardmq_refused_sends_total`).
    pub refused_sends: Cell<crate::metrics::RefusedSends>,
}

pub struct Broker {
    pub identity: BrokerIdentity,
    pub store: Store,
    /// The shard's source of time (the store's clock): nothing in the broker reads the
    /// system clock itself, so tests drive time by hand.
    pub clock: Rc<dyn shards::store::Clock>,
    pub topics: RefCell<TopicTable>,
    pub offsets: RefCell<OffsetTable>,
    pub groups: RefCell<groups::GroupTable>,
    pub clients: RefCell<ClientTable>,
    pub locks: RefCell<locks::QueueLocks>,
    /// Delay levels, timer messages and their delivery progress.
    pub schedule: RefCell<schedule::ScheduleState>,
    /// Pulls parked until a message reaches (topic, queue id), their timeout passes or their
    /// connection closes: the shard's long-poll wheel.
    pub pull_waiters: Rc<ParkedPulls>,
    /// How late this shard runs (overload.rs).
    pub load: ticking::ShardLoad,
    /// Segment retention and the disk monitor (tasks/retention.rs).
    pub retention: tasks::retention::Retention,
    /// Half messages waiting for their transaction's end (transaction.rs).
    pub transactions: RefCell<transaction::Transactions>,
    /// Queues reset by INVOKE_BROKER_TO_RESET_OFFSET that their group has not pulled since.
    pub pending_resets: RefCell<resets::PendingResets>,
    /// Compiled SQL92 pull filters, per (group, topic).
    pub sql_filters: RefCell<crate::filter::SqlFilterCache>,
    /// Tells the other shards about a topic change.
    pub broadcast_topic: Box<dyn Fn(&TopicChange)>,
    /// Asks the registration task to register with the namesrv now.
    pub registration: crate::broker::tasks::registration::RegistrationRequests,
    pub stats: BrokerStats,
    /// aclEnable, for GET_BROKER_CONFIG.
    pub acl_enabled: bool,
    /// Bumped by each UPDATE_BROKER_CONFIG (GET_BROKER_CONFIG's data version counter).
    pub config_version: std::cell::Cell<u64>,
    /// Replication: role, slaves, master (`crate::ha`).
    pub ha: crate::ha::HaState,
    /// UPDATE_BROKER_CONFIG's saved settings (`config/broker.properties`).
    pub live_config: handlers::broker_config::LiveConfig,
    /// SYNC_FLUSH answers waiting for their group commit (durable.rs).
    pub durable_replies: Rc<durable::DurableReplies>,
    /// The namesrv replica of this shard when the node runs both roles, and the number of
    /// brokers (shards) of this node: a topic change is answered once the route shows it
    /// on every shard, as a Java broker answers after registering it with the namesrv.
    pub local_routes: Option<LocalRoutes>,
    /// Signs this broker's namesrv requests (BrokerOptions::namesrv_credentials).
    pub namesrv_credentials: Option<crate::remoting::signature::Credentials>,
    /// TLS towards the namesrv (BrokerOptions::namesrv_tls).
    pub namesrv_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Language and version of each client connection (GET_CONSUMER_CONNECTION_LIST).
    client_languages: RefCell<clients::ClientLanguages>,
    next_unique_id: Cell<u32>,
    /// Round-robin position for sends that leave the queue to the broker.
    next_queue: Cell<u32>,
    /// Round-robin position among the retry queues of a group.
    next_retry_queue: Cell<usize>,
}

/// Settings of a shard's broker that come from the command line.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// RocketMQ's messageDelayLevel table.
    pub delay_levels: schedule::DelayLevels,
    /// fileReservedTime, deleteWhen, the disk ratios (tasks/retention.rs).
    pub retention: shards::store::RetentionConfig,
    /// Signs REGISTER_BROKER / UNREGISTER_BROKER for a namesrv with ACL on.
    pub namesrv_credentials: Option<crate::remoting::signature::Credentials>,
    /// TLS for the connections to the namesrv.
    pub namesrv_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// autoCreateTopicEnable, defaultTopicQueueNums.
    pub auto_create: topics::AutoCreate,
    /// RocketMQ's aclEnable (GET_BROKER_CONFIG shows it).
    pub acl_enabled: bool,
    /// brokerRole, brokerId and the HA settings (`crate::ha`).
    pub ha: crate::ha::HaConfig,
}

impl Broker {
    pub fn new(
        identity: BrokerIdentity,
        store: Store,
        broadcast_topic: Box<dyn Fn(&TopicChange)>,
        options: BrokerOptions,
    ) -> Broker {
        let config_dir = identity.shard_dir.join("config");
        let topics = TopicTable::load(
            config_dir.join("topics.json"),
            &identity.cluster_name,
            &identity.broker_name,
            options.auto_create,
        );
        let offsets = OffsetTable::load(config_dir.join("consumerOffset.json"));
        let groups = groups::GroupTable::load(config_dir.join("subscriptionGroup.json"));
        let clock = store.clock();
        let schedule = schedule::ScheduleState::load(
            config_dir.join("delayOffset.json"),
            options.delay_levels,
            clock.now_ms(),
        );
        let stats = BrokerStats::default();
        stats.started_at_ms.set(clock.now_ms());
        let pull_waiters = Rc::new(ParkedPulls::new(LongPoll::new(
            pull::PULL_WHEEL_TICK_MS,
            pull::PULL_WHEEL_SLOTS,
            pull::PARKED_PULLS_MAX,
            clock.monotonic_ms(),
        )));
        // Every message the store appends wakes the pulls parked on its queue, and the HA
        // streams waiting for the log to grow.
        let waiters = Rc::downgrade(&pull_waiters);
        let ha = crate::ha::HaState::new(options.ha.clone());
        let log_grew = Rc::downgrade(&ha.log_grew);
        store.set_arrival_listener(Rc::new(
            move |topic: &str, queue_id: shards::QueueId, _offset: shards::QueueOffset| {
                if let Some(waiters) = waiters.upgrade() {
                    waiters.wake_queue(topic, queue_id.0);
                }
                if let Some(log_grew) = log_grew.upgrade() {
                    log_grew.notify();
                }
            },
        ));
        let retention = tasks::retention::Retention::new(options.retention);
        store.set_segment_listener(retention.waker());
        store_stats::register_put_sink(&stats.put_latency);
        let durable_replies = Rc::default();
        let broker = Broker {
            identity,
            store,
            clock,
            topics: RefCell::new(topics),
            offsets: RefCell::new(offsets),
            groups: RefCell::new(groups),
            clients: RefCell::new(ClientTable::default()),
            locks: RefCell::new(locks::QueueLocks::default()),
            schedule: RefCell::new(schedule),
            pull_waiters,
            load: ticking::ShardLoad::default(),
            retention,
            transactions: RefCell::new(transaction::Transactions::new(&config_dir)),
            pending_resets: RefCell::new(resets::PendingResets::default()),
            sql_filters: RefCell::new(crate::filter::SqlFilterCache::default()),
            broadcast_topic,
            registration: Default::default(),
            stats,
            acl_enabled: options.acl_enabled,
            config_version: Default::default(),
            live_config: Default::default(),
            ha,
            durable_replies,
            local_routes: None,
            namesrv_credentials: options.namesrv_credentials,
            namesrv_tls: options.namesrv_tls,
            client_languages: RefCell::new(clients::ClientLanguages::default()),
            next_unique_id: Cell::new(0),
            next_queue: Cell::new(0),
            next_retry_queue: Cell::new(0),
        };
        broker.apply_saved_live_config();
        broker.load_epoch();
        broker
    }

    pub fn handle(self: &Rc<Self>, request: &RemotingCommand<'_>, connection: &Rc<Connection>) {
        self.note_request();
        if let Err(error) = self.dispatch(request, connection) {
            if matches!(
                request.code,
                rc::SEND_MESSAGE | rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE
            ) {
                let mut refused = self.stats.refused_sends.get();
                refused.note(crate::metrics::RefusalReason::of(&error));
                self.stats.refused_sends.set(refused);
            }
            let (code, remark) = error.code_and_remark();
            connection.respond(request, code, Some(&remark));
        }
    }

    fn dispatch(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        match request.code {
            rc::SEND_MESSAGE | rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE => {
                self.send_message(request, connection)
            }
            rc::PULL_MESSAGE | rc::LITE_PULL_MESSAGE => self.pull_message(request, connection),
            rc::QUERY_CONSUMER_OFFSET => self.query_consumer_offset(request, connection),
            rc::UPDATE_CONSUMER_OFFSET => self.update_consumer_offset(request, connection),
            rc::GET_MAX_OFFSET => self.get_max_offset(request, connection),
            rc::GET_MIN_OFFSET => self.get_min_offset(request, connection),
            rc::SEARCH_OFFSET_BY_TIMESTAMP => self.search_offset_by_timestamp(request, connection),
            rc::INVOKE_BROKER_TO_RESET_OFFSET => {
                self.invoke_broker_to_reset_offset(request, connection)
            }
            rc::GET_EARLIEST_MSG_STORETIME => self.earliest_msg_store_time(request, connection),
            rc::VIEW_MESSAGE_BY_ID => self.view_message_by_id(request, connection),
            rc::HEART_BEAT => {
                self.client_languages.borrow_mut().note(
                    connection.id,
                    request.language,
                    request.version,
                );
                self.heart_beat(request, connection)
            }
            rc::UNREGISTER_CLIENT => self.unregister_client(request, connection),
            rc::GET_CONSUMER_LIST_BY_GROUP => self.consumer_list_by_group(request, connection),
            rc::CHECK_CLIENT_CONFIG => self.check_client_config(request, connection),
            rc::LOCK_BATCH_MQ => self.lock_batch_mq(request, connection),
            rc::UNLOCK_BATCH_MQ => self.unlock_batch_mq(request, connection),
            rc::UPDATE_AND_CREATE_TOPIC => self.update_and_create_topic(request, connection),
            rc::DELETE_TOPIC_IN_BROKER => self.delete_topic(request, connection),
            rc::GET_ALL_TOPIC_CONFIG => self.all_topic_config(request, connection),
            rc::GET_BROKER_RUNTIME_INFO => self.runtime_info(request, connection),
            rc::GET_CONSUMER_RUNNING_INFO => self.consumer_running_info(request, connection),
            rc::GET_BROKER_CONFIG => self.get_broker_config(request, connection),
            rc::UPDATE_BROKER_CONFIG => self.update_broker_config(request, connection),
            rc::VIEW_BROKER_STATS_DATA => self.view_broker_stats_data(request, connection),
            rc::GET_ALL_CONSUMER_OFFSET => self.all_consumer_offset(request, connection),
            rc::QUERY_MESSAGE => self.query_message(request, connection),
            rc::GET_TOPIC_STATS_INFO => self.topic_stats_info(request, connection),
            rc::GET_CONSUME_STATS => self.consume_stats(request, connection),
            rc::QUERY_TOPIC_CONSUME_BY_WHO => self.topic_consume_by_who(request, connection),
            rc::GET_CONSUMER_CONNECTION_LIST => self.consumer_connection_list(request, connection),
            rc::GET_PRODUCER_CONNECTION_LIST => self.producer_connection_list(request, connection),
            rc::GET_ALL_PRODUCER_INFO => self.all_producer_info(request, connection),
            rc::END_TRANSACTION => self.end_transaction(request, connection),
            rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => {
                self.update_and_create_subscription_group(request, connection)
            }
            rc::GET_ALL_SUBSCRIPTIONGROUP_CONFIG => {
                self.all_subscription_group_config(request, connection)
            }
            rc::GET_SUBSCRIPTIONGROUP_CONFIG => {
                self.get_subscription_group_config(request, connection)
            }
            rc::CONSUMER_SEND_MSG_BACK => self.consumer_send_msg_back(request, connection),
            rc::GET_ALL_DELAY_OFFSET => self.all_delay_offset(request, connection),
            rc::DELETE_SUBSCRIPTIONGROUP => self.delete_subscription_group(request, connection),
            rc::DELETE_EXPIRED_COMMITLOG | rc::TRIGGER_DELETE_FILES => {
                self.delete_expired_files(request, connection)
            }
            code => Err(RequestError::NotSupported(code)),
        }
    }

    /// Samples the shard's counters once a second (RocketMQ's StoreStatsService and
    /// BrokerStatsManager sampling, `store_stats`), for as long as the broker lives.
    pub fn start_stats_sampling(self: &Rc<Self>) {
        let weak = Rc::downgrade(self);
        shards::runtime::spawn_detached(async move {
            let mut seconds: u64 = 0;
            loop {
                let Some(broker) = weak.upgrade() else { return };
                broker.sample_stats(seconds);
                broker.ha.sample_transfer_rate();
                drop(broker);
                seconds += 1;
                shards::runtime::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
    }

    fn sample_stats(&self, seconds: u64) {
        let counts = store_stats::StoreCounts {
            puts: self.stats.messages_put.get(),
            gets_found: self.stats.gets_found.get(),
            gets_missed: self.stats.gets_missed.get(),
            transferred: self.stats.messages_got.get(),
        };
        let flows = self.stats.flows.borrow();
        let now_ms = self.clock.now_ms();
        self.stats
            .history
            .borrow_mut()
            .sample(now_ms, counts, &flows, &self.identity.cluster_name);
        let marks = self.stats.day_marks.get();
        let marks = marks.advance(now_ms, counts.puts, counts.transferred);
        self.stats.day_marks.set(marks);
        if seconds % 60 == 59 {
            self.stats.put_latency.borrow_mut().roll_minute();
        }
    }

    /// Starts the writer tasks of the shard's config tables (topics, groups, offsets): each
    /// writes its file off the shard thread whenever it changed (`persist::run_writer`).
    pub fn start_persisters(self: &Rc<Self>) {
        let weak = Rc::downgrade(self);
        let topics = self.topics.borrow().persisted().clone();
        shards::runtime::spawn_detached(crate::persist::run_writer(topics, move || {
            let table = weak.upgrade()?.topics.borrow().snapshot();
            Some(Box::new(move || table.encode_pretty()))
        }));
        let weak = Rc::downgrade(self);
        let groups = self.groups.borrow().persisted().clone();
        shards::runtime::spawn_detached(crate::persist::run_writer(groups, move || {
            let table = weak.upgrade()?.groups.borrow().snapshot();
            Some(Box::new(move || table.encode_pretty()))
        }));
        let weak = Rc::downgrade(self);
        let offsets = self.offsets.borrow().persisted.clone();
        shards::runtime::spawn_detached(crate::persist::run_writer(offsets, move || {
            let table = weak.upgrade()?.offsets.borrow().snapshot();
            Some(Box::new(move || table.encode_pretty()))
        }));
    }

    /// Waits until every config table is on disk (a clean stop); logs what could not be.
    pub async fn persist_tables(&self) {
        self.offsets.borrow_mut().flush_if_dirty();
        let files = [
            self.topics.borrow().persisted().clone(),
            self.groups.borrow().persisted().clone(),
            self.offsets.borrow().persisted.clone(),
        ];
        for file in files {
            if let Err(why) = file.durable(file.latest()).await {
                log::warn!("{}: at shutdown: {why}", self.identity.broker_name);
            }
        }
    }

    /// Answers `opaque` once `version` of `file` is on disk: SUCCESS, or SYSTEM_ERROR saying
    /// that the change is kept in memory and written again until it is on disk.
    pub(crate) fn answer_when_durable(
        &self,
        file: Rc<crate::persist::Persisted>,
        version: u64,
        connection: &Rc<Connection>,
        request: &RemotingCommand<'_>,
    ) {
        let (connection, opaque, oneway) =
            (connection.clone(), request.opaque, request.is_oneway());
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let result = file.durable(version).await;
            if oneway {
                return;
            }
            match result {
                Ok(()) => {
                    connection.respond_to(opaque, crate::remoting::response_code::SUCCESS, None)
                }
                Err(why) => RequestError::SystemError(format!(
                    "the change is applied in memory but not yet on disk ({why}); it is \
                     written again every {} ms until it is",
                    crate::persist::PERSIST_RETRY_MS
                ))
                .respond(&connection, opaque),
            }
        });
    }

    /// Wall-clock milliseconds from the shard's clock (the store's).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Monotonic milliseconds from the shard's clock.
    pub fn monotonic_ms(&self) -> u64 {
        self.clock.monotonic_ms()
    }

    /// Applies a topic change that another shard made.
    pub fn apply_topic_change(&self, change: &TopicChange) {
        match change {
            TopicChange::Upsert(config) => {
                if self.topics.borrow_mut().upsert(config.clone()) {
                    self.registration.topic_changed(&config.topic_name);
                }
            }
            TopicChange::Delete(topic) => {
                if self.remove_topic_locally(topic) {
                    self.registration.everything();
                }
            }
        }
    }

    /// Creates or updates a topic here and on every other shard.
    pub fn upsert_topic_everywhere(&self, config: TopicConfig) {
        if self.topics.borrow_mut().upsert(config.clone()) {
            self.registration.topic_changed(&config.topic_name);
            (self.broadcast_topic)(&TopicChange::Upsert(config));
        }
    }

    fn remove_topic_locally(&self, topic: &str) -> bool {
        let removed = self.topics.borrow_mut().remove(topic);
        if removed {
            self.store.delete_topic(topic);
            self.offsets.borrow_mut().remove_topic(topic);
        }
        removed
    }

    /// The next retry queue index (callers take it modulo the group's retry queues).
    fn next_retry_queue(&self) -> usize {
        let next = self.next_retry_queue.get();
        self.next_retry_queue.set(next.wrapping_add(1));
        next
    }

    /// A client connection closed: drop its clients and parked pulls.
    pub fn connection_closed(&self, connection: &Rc<Connection>) {
        let changed = self
            .clients
            .borrow_mut()
            .remove_where(|c| c.connection.id == connection.id);
        self.client_languages.borrow_mut().forget(connection.id);
        self.notify_groups(&changed);
        self.pull_waiters.connection_closed(connection.id);
    }

    /// Drops clients silent for longer than CLIENT_EXPIRY_MS.
    pub fn expire_clients(&self, now_ms: i64) {
        let changed = self
            .clients
            .borrow_mut()
            .remove_where(|c| now_ms - c.last_update_ms > CLIENT_EXPIRY_MS);
        self.notify_groups(&changed);
    }

    fn notify_groups(&self, groups: &[String]) {
        let clients = self.clients.borrow();
        for group in groups {
            clients.notify_group(group);
        }
    }

    /// A broker-generated UNIQ_KEY for messages sent without one (ali-ons sends none).
    fn generate_unique_id(&self) -> String {
        let counter = self.next_unique_id.get();
        self.next_unique_id.set(counter.wrapping_add(1));
        let ip = u32::from(*self.identity.address.ip());
        let pid = std::process::id() & 0xFFFF;
        let millis = self.now_ms() as u64 & 0xFFFF_FFFF;
        let port = u32::from(self.identity.address.port());
        format!(
            "{ip:08X}{pid:04X}{port:08X}{millis:08X}{:04X}",
            counter & 0xFFFF
        )
    }
}
