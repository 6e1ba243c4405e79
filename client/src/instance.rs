//! One client's link to the cluster (Java `MQClientInstance`): its id, its connections, the
//! topic routes it learned from the name servers, the broker addresses, the heartbeats and
//! the broker-to-client requests it dispatches.
//!
//! Every producer and consumer owns one instance (Java shares one per process; owning one
//! each keeps their lifetimes and client ids apart, which the tests with several consumers
//! in one process need). Timers: route refresh every `poll_name_server_interval` (30 s),
//! heartbeat to every known broker every `heartbeat_interval` (30 s).
//!
//! Invariants: a route is replaced whole, never edited; the broker address table only grows
//! from routes (an address a route no longer names stays until the next refresh replaces it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use super::connection::{
    RemotingClient, Request, Response, ServerRequest, SERVER_REQUESTS_QUEUED_MAX,
};
use super::error::{ClientError, ClientResult};
use super::message::{MessageQueue, UniqueIdGenerator};
use crate::body::{parse_consumer_id_list, perm, ConsumerData, HeartbeatData, TopicRouteData};
use crate::remoting::{request_code, response_code};

/// The template topic whose route a producer borrows for a topic the cluster does not know yet.
pub const AUTO_CREATE_TOPIC_KEY_TOPIC: &str = "TBW102";
/// Queues an auto-created topic gets (Java `defaultTopicQueueNums`).
pub const DEFAULT_TOPIC_QUEUE_NUMS: u32 = 4;

/// Where the cluster is and how often the client refreshes what it knows.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Name server addresses, "host:port".
    pub namesrv_addrs: Vec<String>,
    /// Part of the client id; `None` = `<pid>#<sequence>#<nanos>` (unique per client object).
    pub instance_name: Option<String>,
    /// Timeout of ordinary requests (route, heartbeat, offsets, sends).
    pub request_timeout: Duration,
    /// Route refresh period (Java `pollNameServerInterval`, 30 s).
    pub poll_name_server_interval: Duration,
    /// Heartbeat period (Java `heartbeatBrokerInterval`, 30 s).
    pub heartbeat_interval: Duration,
    /// AccessKey/SecretKey every request is signed with (brokers with ACL on need them).
    pub credentials: Option<crate::SessionCredentials>,
    /// Speak TLS to every server (RocketMQ's `useTLS`); `None`: plaintext.
    pub tls: Option<crate::tls::TlsOptions>,
}

impl ClientConfig {
    /// Name servers as RocketMQ writes them: `"host:port;host:port"`.
    pub fn new(namesrv: &str) -> ClientConfig {
        ClientConfig {
            namesrv_addrs: namesrv
                .split(';')
                .map(str::trim)
                .filter(|addr| !addr.is_empty())
                .map(str::to_string)
                .collect(),
            instance_name: None,
            request_timeout: Duration::from_millis(3_000),
            poll_name_server_interval: Duration::from_millis(30_000),
            heartbeat_interval: Duration::from_millis(30_000),
            credentials: None,
            tls: None,
        }
    }
}

/// A topic's route as the client uses it.
#[derive(Debug, Clone)]
pub struct TopicRouteInfo {
    pub route: TopicRouteData,
    /// Writable queues of brokers with a master, sorted.
    pub publish_queues: Vec<MessageQueue>,
    /// Readable queues, sorted.
    pub subscribe_queues: Vec<MessageQueue>,
}

impl TopicRouteInfo {
    /// Publish and subscribe queues of `topic` per REMOTING.md §4.3.
    pub fn new(topic: &str, route: TopicRouteData) -> TopicRouteInfo {
        let has_master = |broker_name: &str| {
            route
                .broker_datas
                .iter()
                .any(|b| b.broker_name == broker_name && b.master_addr().is_some())
        };
        let mut publish_queues = Vec::new();
        let mut subscribe_queues = Vec::new();
        for queue_data in &route.queue_datas {
            let queue = |queue_id| MessageQueue {
                topic: topic.to_string(),
                broker_name: queue_data.broker_name.clone(),
                queue_id,
            };
            if perm::is_writeable(queue_data.perm) && has_master(&queue_data.broker_name) {
                publish_queues.extend((0..queue_data.write_queue_nums).map(queue));
            }
            if perm::is_readable(queue_data.perm) {
                subscribe_queues.extend((0..queue_data.read_queue_nums).map(queue));
            }
        }
        publish_queues.sort();
        subscribe_queues.sort();
        TopicRouteInfo {
            route,
            publish_queues,
            subscribe_queues,
        }
    }
}

/// Handles CHECK_TRANSACTION_STATE requests for a transactional producer.
pub type TransactionCheckHandler = Arc<dyn Fn(ServerRequest) + Send + Sync>;

/// What the client tells brokers in its heartbeats.
#[derive(Debug, Clone, Default)]
pub struct HeartbeatSource {
    pub producer_groups: Vec<String>,
    pub consumers: Vec<ConsumerData>,
}

/// See the module docs.
pub struct ClientInstance {
    pub config: ClientConfig,
    pub client_id: String,
    pub client_ip: IpAddr,
    pub remoting: RemotingClient,
    pub unique_ids: UniqueIdGenerator,
    routes: RwLock<HashMap<String, Arc<TopicRouteInfo>>>,
    brokers: RwLock<HashMap<String, BTreeMap<u64, String>>>,
    /// Topics whose routes the refresh timer keeps current.
    topics_in_use: Mutex<BTreeSet<String>>,
    namesrv_index: AtomicUsize,
    pub heartbeat_source: Mutex<HeartbeatSource>,
    /// Woken by NOTIFY_CONSUMER_IDS_CHANGED: the consumer rebalances at once.
    pub rebalance_now: Notify,
    pub transaction_check: Mutex<Option<TransactionCheckHandler>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shut_down: AtomicBool,
    /// Bumped when a route brings a broker address not seen before.
    brokers_version: AtomicU64,
    /// `brokers_version` at the last heartbeat every broker accepted.
    heartbeat_version: AtomicU64,
}

static INSTANCE_SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl ClientInstance {
    /// Opens nothing yet: finds the local IP towards the first name server, names the client
    /// and starts the dispatcher of broker requests and the route/heartbeat timers.
    pub async fn start(config: ClientConfig) -> ClientResult<Arc<ClientInstance>> {
        let first = config
            .namesrv_addrs
            .first()
            .ok_or_else(|| ClientError::InvalidArgument("no name server address".into()))?;
        let client_ip = RemotingClient::local_ip_towards(first)
            .await
            .unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let instance_name = config.instance_name.clone().unwrap_or_else(|| {
            let sequence = INSTANCE_SEQUENCE.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            format!("{}#{sequence}#{nanos}", std::process::id())
        });
        let tls = config
            .tls
            .as_ref()
            .map(crate::tls::TlsOptions::client_config)
            .transpose()
            .map_err(ClientError::InvalidArgument)?;
        let (server_tx, server_rx) = mpsc::channel(SERVER_REQUESTS_QUEUED_MAX);
        let instance = Arc::new(ClientInstance {
            client_id: format!("{client_ip}@{instance_name}"),
            client_ip,
            remoting: RemotingClient::new(server_tx)
                .with_credentials(config.credentials.clone())
                .with_tls(tls),
            unique_ids: UniqueIdGenerator::new(client_ip),
            routes: RwLock::default(),
            brokers: RwLock::default(),
            topics_in_use: Mutex::default(),
            namesrv_index: AtomicUsize::new(0),
            heartbeat_source: Mutex::default(),
            rebalance_now: Notify::new(),
            transaction_check: Mutex::new(None),
            tasks: Mutex::default(),
            shut_down: AtomicBool::new(false),
            brokers_version: AtomicU64::new(0),
            heartbeat_version: AtomicU64::new(0),
            config,
        });
        let dispatcher = tokio::spawn(dispatch_server_requests(
            Arc::downgrade(&instance),
            server_rx,
        ));
        let timers = tokio::spawn(run_timers(Arc::downgrade(&instance)));
        instance.add_task(dispatcher);
        instance.add_task(timers);
        Ok(instance)
    }

    /// Keeps `task` to abort at shutdown.
    pub fn add_task(&self, task: JoinHandle<()>) {
        lock(&self.tasks).push(task);
    }

    /// Asks the name servers, starting with the last one that answered, moving on when one fails.
    pub async fn invoke_namesrv(&self, request: &Request) -> ClientResult<Response> {
        let count = self.config.namesrv_addrs.len();
        let start = self.namesrv_index.load(Ordering::Relaxed);
        let mut last_error = ClientError::InvalidArgument("no name server address".into());
        for step in 0..count {
            let index = (start + step) % count;
            let addr = &self.config.namesrv_addrs[index];
            match self
                .remoting
                .invoke(addr, request, self.config.request_timeout)
                .await
            {
                Ok(response) => {
                    self.namesrv_index.store(index, Ordering::Relaxed);
                    return Ok(response);
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// Sends `request` to `addr` and fails on any response code but SUCCESS.
    pub async fn invoke_ok(&self, addr: &str, request: &Request) -> ClientResult<Response> {
        let response = self
            .remoting
            .invoke(addr, request, self.config.request_timeout)
            .await?;
        if response.code != response_code::SUCCESS {
            return Err(response.into_error(addr));
        }
        Ok(response)
    }

    /// Fetches `topic`'s route from the name servers; `Ok(None)` when none knows it.
    pub async fn fetch_route(&self, topic: &str) -> ClientResult<Option<TopicRouteData>> {
        let request = Request::new(request_code::GET_ROUTEINFO_BY_TOPIC).ext("topic", topic);
        let response = self.invoke_namesrv(&request).await?;
        match response.code {
            response_code::SUCCESS => TopicRouteData::parse(&response.body)
                .map(Some)
                .map_err(|error| ClientError::Malformed(error.to_string())),
            response_code::TOPIC_NOT_EXIST => Ok(None),
            _ => Err(response.into_error("name server")),
        }
    }

    /// Refreshes `topic`'s route now; `Ok(None)` when the cluster does not know the topic.
    pub async fn update_route(&self, topic: &str) -> ClientResult<Option<Arc<TopicRouteInfo>>> {
        let Some(route) = self.fetch_route(topic).await? else {
            return Ok(None);
        };
        Ok(Some(self.install_route(topic, route)))
    }

    fn install_route(&self, topic: &str, route: TopicRouteData) -> Arc<TopicRouteInfo> {
        {
            let mut brokers = write(&self.brokers);
            for broker in &route.broker_datas {
                let previous =
                    brokers.insert(broker.broker_name.clone(), broker.broker_addrs.clone());
                if previous.as_ref() != Some(&broker.broker_addrs) {
                    self.brokers_version.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        let info = Arc::new(TopicRouteInfo::new(topic, route));
        write(&self.routes).insert(topic.to_string(), info.clone());
        lock(&self.topics_in_use).insert(topic.to_string());
        info
    }

    /// The cached route of `topic`, fetched when absent.
    pub async fn route(&self, topic: &str) -> ClientResult<Option<Arc<TopicRouteInfo>>> {
        if let Some(info) = read(&self.routes).get(topic) {
            return Ok(Some(info.clone()));
        }
        self.update_route(topic).await
    }

    /// The route a producer sends with: the topic's own, else the template topic's brokers
    /// with [`DEFAULT_TOPIC_QUEUE_NUMS`] queues each (the broker creates the topic on the first
    /// send, and the next refresh brings the real route).
    pub async fn route_for_publish(&self, topic: &str) -> ClientResult<Arc<TopicRouteInfo>> {
        if let Some(info) = self.route(topic).await? {
            if !info.publish_queues.is_empty() {
                return Ok(info);
            }
        }
        let Some(mut template) = self.fetch_route(AUTO_CREATE_TOPIC_KEY_TOPIC).await? else {
            return Err(ClientError::NoRoute(topic.to_string()));
        };
        for queue_data in &mut template.queue_datas {
            let queues = queue_data.write_queue_nums.min(DEFAULT_TOPIC_QUEUE_NUMS);
            queue_data.write_queue_nums = queues;
            queue_data.read_queue_nums = queues;
        }
        let info = self.install_route(topic, template);
        if info.publish_queues.is_empty() {
            return Err(ClientError::NoRoute(topic.to_string()));
        }
        Ok(info)
    }

    /// The master address of `broker_name`, from the routes seen so far.
    pub fn master_addr(&self, broker_name: &str) -> Option<String> {
        read(&self.brokers)
            .get(broker_name)
            .and_then(|addrs| addrs.get(&0).cloned())
    }

    /// Like [`Self::master_addr`], as an error when unknown.
    pub fn require_master_addr(&self, broker_name: &str) -> ClientResult<String> {
        self.master_addr(broker_name)
            .ok_or_else(|| ClientError::NoBrokerAddress(broker_name.to_string()))
    }

    /// The broker name whose master listens on `addr`.
    pub fn broker_name_of(&self, addr: &str) -> Option<String> {
        read(&self.brokers)
            .iter()
            .find(|(_, addrs)| addrs.values().any(|a| a == addr))
            .map(|(name, _)| name.clone())
    }

    /// Every master address known.
    pub fn master_addrs(&self) -> Vec<String> {
        let mut addrs: Vec<String> = read(&self.brokers)
            .values()
            .filter_map(|addrs| addrs.get(&0).cloned())
            .collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }

    /// Client ids of `group`'s consumers, asked of a broker that serves `topic` (sorted).
    pub async fn consumer_ids(&self, topic: &str, group: &str) -> ClientResult<Vec<String>> {
        let info = self
            .route(topic)
            .await?
            .ok_or_else(|| ClientError::NoRoute(topic.to_string()))?;
        let mut brokers: Vec<&str> = info
            .route
            .broker_datas
            .iter()
            .map(|b| b.broker_name.as_str())
            .collect();
        brokers.sort_unstable();
        // Start at a random broker, as Java does, and fall through the others on failure.
        let count = brokers.len().max(1);
        let start = super::message::random_u32() as usize % count;
        let mut last_error = ClientError::NoRoute(topic.to_string());
        for step in 0..brokers.len() {
            let Some(addr) = self.master_addr(brokers[(start + step) % count]) else {
                continue;
            };
            let request =
                Request::new(request_code::GET_CONSUMER_LIST_BY_GROUP).ext("consumerGroup", group);
            match self.invoke_ok(&addr, &request).await {
                Ok(response) => {
                    let mut ids = parse_consumer_id_list(&response.body)
                        .map_err(|error| ClientError::Malformed(error.to_string()))?;
                    ids.sort();
                    return Ok(ids);
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// Heartbeats at once when routes brought brokers this client has not told about itself
    /// yet (a consumer must be registered before the group's rebalance sees it; a
    /// transactional producer before the broker can send it checks). Cheap when nothing changed.
    pub async fn heartbeat_if_brokers_changed(&self) {
        let version = self.brokers_version.load(Ordering::Acquire);
        if self.heartbeat_version.swap(version, Ordering::AcqRel) == version {
            return;
        }
        // Brokers that refuse it now get the periodic heartbeat, not one per send.
        self.send_heartbeat_to_all().await;
    }

    /// Sends a heartbeat to every known master; returns how many accepted it.
    pub async fn send_heartbeat_to_all(&self) -> usize {
        let body = {
            let source = lock(&self.heartbeat_source);
            HeartbeatData {
                client_id: self.client_id.clone(),
                producer_groups: source.producer_groups.clone(),
                consumers: source.consumers.clone(),
            }
            .encode()
        };
        let request = Request::new(request_code::HEART_BEAT).body(body);
        let mut accepted = 0;
        for addr in self.master_addrs() {
            if self.invoke_ok(&addr, &request).await.is_ok() {
                accepted += 1;
            }
        }
        accepted
    }

    /// Refreshes the route of every topic in use, then forgets brokers no route names.
    pub async fn refresh_routes(&self) {
        let topics: Vec<String> = lock(&self.topics_in_use).iter().cloned().collect();
        for topic in topics {
            let _ = self.update_route(&topic).await;
        }
        let named: std::collections::HashSet<String> = read(&self.routes)
            .values()
            .flat_map(|info| info.route.broker_datas.iter())
            .map(|broker| broker.broker_name.clone())
            .collect();
        write(&self.brokers).retain(|name, _| named.contains(name));
    }

    /// Stops the timers, sends UNREGISTER_CLIENT for each group to every known master, closes
    /// the connections.
    pub async fn shutdown(&self, producer_group: Option<&str>, consumer_group: Option<&str>) {
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        let mut request =
            Request::new(request_code::UNREGISTER_CLIENT).ext("clientID", &self.client_id);
        if let Some(group) = producer_group {
            request = request.ext("producerGroup", group);
        }
        if let Some(group) = consumer_group {
            request = request.ext("consumerGroup", group);
        }
        for addr in self.master_addrs() {
            let _ = self.invoke_ok(&addr, &request).await;
        }
        self.remoting.close_all().await;
    }
}

async fn run_timers(instance: std::sync::Weak<ClientInstance>) {
    let (route_period, heartbeat_period) = match instance.upgrade() {
        Some(instance) => (
            instance.config.poll_name_server_interval,
            instance.config.heartbeat_interval,
        ),
        None => return,
    };
    let mut routes = tokio::time::interval(route_period);
    let mut heartbeats = tokio::time::interval(heartbeat_period);
    routes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Both fire at once first; the owner has already sent its first heartbeat itself.
    routes.tick().await;
    heartbeats.tick().await;
    loop {
        tokio::select! {
            _ = routes.tick() => {
                let Some(instance) = instance.upgrade() else { return };
                instance.refresh_routes().await;
            }
            _ = heartbeats.tick() => {
                let Some(instance) = instance.upgrade() else { return };
                instance.send_heartbeat_to_all().await;
            }
        }
    }
}

async fn dispatch_server_requests(
    instance: std::sync::Weak<ClientInstance>,
    mut requests: mpsc::Receiver<ServerRequest>,
) {
    while let Some(server_request) = requests.recv().await {
        let Some(instance) = instance.upgrade() else {
            return;
        };
        let request = &server_request.request;
        match request.code {
            request_code::NOTIFY_CONSUMER_IDS_CHANGED => instance.rebalance_now.notify_one(),
            request_code::CHECK_TRANSACTION_STATE => {
                let handler = lock(&instance.transaction_check).clone();
                if let Some(handler) = handler {
                    handler(server_request);
                }
            }
            code if !request.oneway => {
                let remark = format!(" request type {code} not supported");
                let _ = instance
                    .remoting
                    .respond(
                        &server_request.addr,
                        request.opaque,
                        response_code::REQUEST_CODE_NOT_SUPPORTED,
                        Some(&remark),
                    )
                    .await;
            }
            _ => {}
        }
    }
}

/// Locks a short-held std mutex; a poisoned one (a panic elsewhere) is still used.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{BrokerData, QueueData};

    #[test]
    fn publish_and_subscribe_queues_follow_perm_and_masters() {
        let route = TopicRouteData {
            order_topic_conf: None,
            queue_datas: vec![
                QueueData {
                    broker_name: "b".into(),
                    read_queue_nums: 2,
                    write_queue_nums: 3,
                    perm: 6,
                    topic_sys_flag: 0,
                },
                QueueData {
                    broker_name: "a".into(),
                    read_queue_nums: 1,
                    write_queue_nums: 1,
                    perm: 4,
                    topic_sys_flag: 0,
                },
                QueueData {
                    broker_name: "c".into(),
                    read_queue_nums: 1,
                    write_queue_nums: 1,
                    perm: 6,
                    topic_sys_flag: 0,
                },
            ],
            broker_datas: vec![
                BrokerData {
                    cluster: "C".into(),
                    broker_name: "b".into(),
                    broker_addrs: BTreeMap::from([(0, "127.0.0.1:1".to_string())]),
                    enable_acting_master: false,
                },
                BrokerData {
                    cluster: "C".into(),
                    broker_name: "c".into(),
                    broker_addrs: BTreeMap::from([(1, "127.0.0.1:2".to_string())]),
                    enable_acting_master: false,
                },
            ],
        };
        let info = TopicRouteInfo::new("T", route);
        let names = |queues: &[MessageQueue]| {
            queues
                .iter()
                .map(|q| format!("{}{}", q.broker_name, q.queue_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&info.publish_queues), ["b0", "b1", "b2"]);
        assert_eq!(names(&info.subscribe_queues), ["a0", "b0", "b1", "c0"]);
    }
}
