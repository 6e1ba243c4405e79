//! One shard's replica of the route table (pure data, no I/O; unit-tested below).
//!
//! Invariants: a broker name appears in `topic_queues` only while it has a live address (its
//! master or a slave); a topic with no queue data left is gone (TOPIC_NOT_EXIST).

use std::collections::{BTreeMap, BTreeSet};

use crate::body::{BrokerData, ClusterInfo, DataVersion, QueueData, TopicConfig, TopicRouteData};

/// How long a broker stays routable after its last registration, unless it says otherwise.
pub const BROKER_EXPIRY_MS_DEFAULT: i64 = 120_000;

/// The most (topic, broker name) routes a replica holds: a registration that would add more
/// is refused. 200 brokers of 10,000 topics each, or 20 of 100,000; about 200 bytes each, in
/// every shard's replica. Without it, one connection registering made-up brokers grew the
/// namesrv by 4 MiB for each 20,000 topics, without end.
pub const ROUTES_MAX: usize = 2_000_000;

/// The most bytes the KV config (namespaces, keys and values together) holds in a replica:
/// a PUT_KV_CONFIG that would pass it is refused. RocketMQ keeps a few small entries there
/// (ORDER_TOPIC_CONFIG); without a bound, each PUT of a 16 MiB value took 16 MiB in every
/// shard's replica.
pub const KV_BYTES_MAX: usize = 16 << 20;

/// One REGISTER_BROKER, decoded.
#[derive(Debug, Clone)]
pub struct BrokerRegistration {
    pub cluster_name: String,
    pub broker_name: String,
    pub broker_addr: String,
    pub broker_id: u64,
    pub ha_server_addr: String,
    pub heartbeat_timeout_ms: i64,
    pub data_version: DataVersion,
    pub topics: Vec<TopicConfig>,
    /// When it was received (ms since the epoch), the replica's ordering stamp.
    pub received_at_ms: i64,
    /// The IP address the registration came from (None: not known).
    pub peer_ip: Option<std::net::IpAddr>,
}

/// A change to the route table, as applied locally and broadcast to the other replicas.
#[derive(Debug, Clone)]
pub enum RouteUpdate {
    Register(BrokerRegistration),
    Unregister {
        cluster_name: String,
        broker_name: String,
        broker_addr: String,
        broker_id: u64,
        /// Who asks: a live broker registered from another IP address stays (None: anyone).
        peer_ip: Option<std::net::IpAddr>,
    },
    PutKv {
        namespace: String,
        key: String,
        value: String,
    },
    DeleteKv {
        namespace: String,
        key: String,
    },
    DeleteTopic {
        topic: String,
        cluster_name: Option<String>,
    },
}

#[derive(Debug, Clone)]
struct LiveBroker {
    broker_name: String,
    cluster_name: String,
    last_update_ms: i64,
    timeout_ms: i64,
    data_version: DataVersion,
    peer_ip: Option<std::net::IpAddr>,
    ha_server_addr: String,
}

/// One topic's queue data, one per broker name, in the order of the names. A sorted vector:
/// a topic has a few broker names, and as a B-tree map each topic took a ~700-byte node and
/// every name twice (10,000 topics from two brokers: 8.5 MB a replica).
#[derive(Debug, Default)]
struct TopicQueues(Vec<QueueData>);

impl TopicQueues {
    fn position(&self, broker_name: &str) -> Result<usize, usize> {
        self.0
            .binary_search_by(|held| held.broker_name.as_str().cmp(broker_name))
    }

    /// Sets the queue data of its broker name; true when the name was not there.
    fn insert(&mut self, queue_data: QueueData) -> bool {
        match self.position(&queue_data.broker_name) {
            Ok(at) => {
                self.0[at] = queue_data;
                false
            }
            Err(at) => {
                self.0.reserve_exact(1);
                self.0.insert(at, queue_data);
                true
            }
        }
    }

    /// True when the name was there.
    fn remove(&mut self, broker_name: &str) -> bool {
        match self.position(broker_name) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn retain(&mut self, keep: impl FnMut(&QueueData) -> bool) {
        self.0.retain(keep);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> impl Iterator<Item = &QueueData> {
        self.0.iter()
    }
}

/// The replica.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// broker name → (cluster, broker id → address)
    brokers: BTreeMap<String, (String, BTreeMap<u64, String>)>,
    /// cluster → broker names
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// topic → queue data of each broker name
    topic_queues: BTreeMap<String, TopicQueues>,
    /// broker address → liveness
    live: BTreeMap<String, LiveBroker>,
    /// namespace → key → value
    kv: BTreeMap<String, BTreeMap<String, String>>,
    /// Queue data held in `topic_queues`, all topics together (its routes).
    routes: usize,
    /// Bytes of `kv`: namespaces, keys and values.
    kv_bytes: usize,
}

impl RouteTable {
    pub fn apply(&mut self, update: &RouteUpdate) {
        match update {
            RouteUpdate::Register(registration) => self.register(registration),
            RouteUpdate::Unregister {
                broker_name,
                broker_addr,
                broker_id,
                cluster_name,
                peer_ip,
            } => self.unregister(cluster_name, broker_name, broker_addr, *broker_id, *peer_ip),
            RouteUpdate::PutKv {
                namespace,
                key,
                value,
            } => {
                self.kv_bytes = self.kv_bytes_after_put(namespace, key, value);
                self.kv
                    .entry(namespace.clone())
                    .or_default()
                    .insert(key.clone(), value.clone());
            }
            RouteUpdate::DeleteKv { namespace, key } => {
                if let Some(table) = self.kv.get_mut(namespace) {
                    if let Some(value) = table.remove(key) {
                        self.kv_bytes -= key.len() + value.len();
                    }
                }
            }
            RouteUpdate::DeleteTopic {
                topic,
                cluster_name,
            } => self.delete_topic(topic, cluster_name),
        }
    }

    fn register(&mut self, registration: &BrokerRegistration) {
        if let Some(live) = self.live.get(&registration.broker_addr) {
            if live.last_update_ms > registration.received_at_ms {
                return; // an older registration arriving late
            }
        }
        let name = &registration.broker_name;
        self.clusters
            .entry(registration.cluster_name.clone())
            .or_default()
            .insert(name.clone());
        let (cluster, addrs) = self
            .brokers
            .entry(name.clone())
            .or_insert_with(|| (registration.cluster_name.clone(), BTreeMap::new()));
        *cluster = registration.cluster_name.clone();
        // The same address under another id (slave promoted to master) replaces the old entry.
        addrs.retain(|id, addr| *addr != registration.broker_addr || *id == registration.broker_id);
        addrs.insert(registration.broker_id, registration.broker_addr.clone());
        if registration.broker_id == 0 {
            for topic in &registration.topics {
                let queue_data = QueueData {
                    broker_name: name.clone(),
                    read_queue_nums: topic.read_queue_nums,
                    write_queue_nums: topic.write_queue_nums,
                    perm: topic.perm,
                    topic_sys_flag: topic.topic_sys_flag,
                };
                let added = self
                    .topic_queues
                    .entry(topic.topic_name.clone())
                    .or_default()
                    .insert(queue_data);
                self.routes += usize::from(added);
            }
        }
        let timeout_ms = if registration.heartbeat_timeout_ms > 0 {
            registration.heartbeat_timeout_ms
        } else {
            BROKER_EXPIRY_MS_DEFAULT
        };
        self.live.insert(
            registration.broker_addr.clone(),
            LiveBroker {
                broker_name: name.clone(),
                cluster_name: registration.cluster_name.clone(),
                last_update_ms: registration.received_at_ms,
                timeout_ms,
                data_version: registration.data_version.clone(),
                peer_ip: registration.peer_ip,
                ha_server_addr: registration.ha_server_addr.clone(),
            },
        );
    }

    fn unregister(
        &mut self,
        cluster: &str,
        broker_name: &str,
        broker_addr: &str,
        broker_id: u64,
        peer_ip: Option<std::net::IpAddr>,
    ) {
        if let (Some(live), Some(asking)) = (self.live.get(broker_addr), peer_ip) {
            if live.peer_ip.is_some_and(|registrant| registrant != asking) {
                return; // not the registrant's to remove
            }
        }
        self.live.remove(broker_addr);
        let mut name_gone = false;
        if let Some((_, addrs)) = self.brokers.get_mut(broker_name) {
            if addrs.get(&broker_id).map(String::as_str) == Some(broker_addr) {
                addrs.remove(&broker_id);
            }
            name_gone = addrs.is_empty();
        }
        if name_gone {
            self.brokers.remove(broker_name);
            if let Some(names) = self.clusters.get_mut(cluster) {
                names.remove(broker_name);
                if names.is_empty() {
                    self.clusters.remove(cluster);
                }
            }
        }
        // The queues stay routed while a slave of the name is live (RocketMQ's
        // RouteInfoManager removes a broker name's topics only with its last address):
        // consumers read from the slave when the master is gone.
        if name_gone {
            let mut removed = 0;
            self.topic_queues.retain(|_, queues| {
                removed += usize::from(queues.remove(broker_name));
                !queues.is_empty()
            });
            self.routes -= removed;
        }
    }

    fn delete_topic(&mut self, topic: &str, cluster_name: &Option<String>) {
        match cluster_name {
            None => {
                if let Some(queues) = self.topic_queues.remove(topic) {
                    self.routes -= queues.len();
                }
            }
            Some(cluster) => {
                let names = self.clusters.get(cluster).cloned().unwrap_or_default();
                if let Some(queues) = self.topic_queues.get_mut(topic) {
                    let before = queues.len();
                    queues.retain(|queue_data| !names.contains(&queue_data.broker_name));
                    self.routes -= before - queues.len();
                    if queues.is_empty() {
                        self.topic_queues.remove(topic);
                    }
                }
            }
        }
    }

    /// Removes brokers whose last registration is older than their timeout; returns them.
    pub fn expire(&mut self, now_ms: i64) -> Vec<String> {
        let expired: Vec<(String, LiveBroker)> = self
            .live
            .iter()
            .filter(|(_, live)| now_ms - live.last_update_ms > live.timeout_ms)
            .map(|(addr, live)| (addr.clone(), live.clone()))
            .collect();
        for (addr, live) in &expired {
            let id = self.broker_id_of(&live.broker_name, addr).unwrap_or(0);
            self.unregister(&live.cluster_name, &live.broker_name, addr, id, None);
        }
        expired.into_iter().map(|(addr, _)| addr).collect()
    }

    fn broker_id_of(&self, broker_name: &str, addr: &str) -> Option<u64> {
        let (_, addrs) = self.brokers.get(broker_name)?;
        addrs
            .iter()
            .find(|(_, a)| a.as_str() == addr)
            .map(|(id, _)| *id)
    }

    pub fn route(&self, topic: &str) -> Option<TopicRouteData> {
        let queues = self.topic_queues.get(topic)?;
        let mut route = TopicRouteData::default();
        for queue_data in queues.iter() {
            let name = &queue_data.broker_name;
            route.queue_datas.push(queue_data.clone());
            if let Some((cluster, addrs)) = self.brokers.get(name) {
                route.broker_datas.push(BrokerData {
                    cluster: cluster.clone(),
                    broker_name: name.clone(),
                    broker_addrs: addrs.clone(),
                    enable_acting_master: false,
                });
            }
        }
        if route.broker_datas.is_empty() {
            return None;
        }
        route.order_topic_conf = self
            .kv
            .get("ORDER_TOPIC_CONFIG")
            .and_then(|table| table.get(topic))
            .cloned();
        Some(route)
    }

    pub fn cluster_info(&self) -> ClusterInfo {
        let mut info = ClusterInfo {
            broker_addr_table: BTreeMap::new(),
            cluster_addr_table: BTreeMap::new(),
        };
        for (name, (cluster, addrs)) in &self.brokers {
            info.broker_addr_table.insert(
                name.clone(),
                BrokerData {
                    cluster: cluster.clone(),
                    broker_name: name.clone(),
                    broker_addrs: addrs.clone(),
                    enable_acting_master: false,
                },
            );
        }
        for (cluster, names) in &self.clusters {
            info.cluster_addr_table
                .insert(cluster.clone(), names.clone());
        }
        info
    }

    pub fn topic_names(&self) -> Vec<String> {
        self.topic_queues.keys().cloned().collect()
    }

    pub fn topics_of_cluster(&self, cluster: &str) -> Vec<String> {
        let names = self.clusters.get(cluster).cloned().unwrap_or_default();
        self.topic_queues
            .iter()
            .filter(|(_, queues)| queues.iter().any(|q| names.contains(&q.broker_name)))
            .map(|(topic, _)| topic.clone())
            .collect()
    }

    pub fn kv_get(&self, namespace: &str, key: &str) -> Option<&str> {
        self.kv.get(namespace)?.get(key).map(String::as_str)
    }

    pub fn kv_namespace(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.kv.get(namespace)
    }

    pub fn kv_all(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.kv
    }

    /// For QUERY_DATA_VERSION: whether the stored version differs, and the stored one.
    pub fn data_version_of(&self, broker_addr: &str) -> Option<&DataVersion> {
        self.live.get(broker_addr).map(|live| &live.data_version)
    }

    /// Bytes the KV config would hold after a PUT_KV_CONFIG of these (the value it replaces
    /// gone).
    pub fn kv_bytes_after_put(&self, namespace: &str, key: &str, value: &str) -> usize {
        let held = self.kv_bytes + value.len();
        match self.kv.get(namespace) {
            None => held + namespace.len() + key.len(),
            Some(table) => match table.get(key) {
                None => held + key.len(),
                Some(replaced) => held - replaced.len(),
            },
        }
    }

    /// Routes held (queue data of a topic on a broker name), all topics together.
    pub fn routes(&self) -> usize {
        self.routes
    }

    /// Routes `registration` would add: its topics this broker name does not route yet.
    pub fn routes_added_by(&self, registration: &BrokerRegistration) -> usize {
        if registration.broker_id != 0 {
            return 0;
        }
        let name = &registration.broker_name;
        registration
            .topics
            .iter()
            .filter(|topic| {
                self.topic_queues
                    .get(&topic.topic_name)
                    .is_none_or(|queues| queues.position(name).is_err())
            })
            .count()
    }

    /// Why `registration` may not replace what a live broker registered (None: it may): the
    /// name and id are held by a live broker at another address, or the address by a live
    /// broker of another name or registered from another IP address. An expired or
    /// unregistered broker's place is free.
    pub fn registration_conflict(
        &self,
        registration: &BrokerRegistration,
        now_ms: i64,
    ) -> Option<String> {
        let alive = |addr: &str| {
            self.live
                .get(addr)
                .filter(|live| now_ms - live.last_update_ms <= live.timeout_ms)
        };
        let name = &registration.broker_name;
        let id = registration.broker_id;
        let addr = &registration.broker_addr;
        if let Some((_, addrs)) = self.brokers.get(name) {
            if let Some(held) = addrs.get(&id).filter(|held| *held != addr) {
                if let Some(live) = alive(held) {
                    return Some(format!(
                        "broker {name} id {id} is registered at {held} and alive (last \
                         registration {} ms ago); a registration of {addr} under that name \
                         and id is refused until it unregisters or expires",
                        now_ms - live.last_update_ms
                    ));
                }
            }
        }
        let live = alive(addr)?;
        if live.broker_name != *name {
            return Some(format!(
                "{addr} is registered as broker {} and alive; it cannot register as {name} \
                 until that one unregisters or expires",
                live.broker_name
            ));
        }
        match (live.peer_ip, registration.peer_ip) {
            (Some(registrant), Some(asking)) if registrant != asking => Some(format!(
                "broker {name} at {addr} is registered from {registrant} and alive; a \
                 registration from {asking} is refused until it unregisters or expires"
            )),
            _ => None,
        }
    }

    pub fn master_addr_of(&self, broker_name: &str) -> Option<&str> {
        self.brokers.get(broker_name)?.1.get(&0).map(String::as_str)
    }

    /// The haServerAddr a live broker registered with.
    pub fn ha_server_addr_of(&self, broker_addr: &str) -> Option<&str> {
        let live = self.live.get(broker_addr)?;
        Some(live.ha_server_addr.as_str()).filter(|addr| !addr.is_empty())
    }

    /// Refreshes a broker's liveness (QUERY_DATA_VERSION does this without a full register).
    pub fn touch(&mut self, broker_addr: &str, now_ms: i64) {
        if let Some(live) = self.live.get_mut(broker_addr) {
            live.last_update_ms = live.last_update_ms.max(now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(name: &str, addr: &str, topics: &[&str], at_ms: i64) -> BrokerRegistration {
        BrokerRegistration {
            cluster_name: "DefaultCluster".into(),
            broker_name: name.into(),
            broker_addr: addr.into(),
            broker_id: 0,
            ha_server_addr: String::new(),
            heartbeat_timeout_ms: 0,
            peer_ip: None,
            data_version: DataVersion {
                counter: 1,
                state_version: 0,
                timestamp: at_ms,
            },
            topics: topics.iter().map(|t| TopicConfig::new(t, 4, 6)).collect(),
            received_at_ms: at_ms,
        }
    }

    /// The master `name` at `addr` unregistering, from anywhere.
    fn unregister(name: &str, addr: &str) -> RouteUpdate {
        RouteUpdate::Unregister {
            cluster_name: "DefaultCluster".into(),
            broker_name: name.into(),
            broker_addr: addr.into(),
            broker_id: 0,
            peer_ip: None,
        }
    }

    #[test]
    fn route_lists_every_broker_hosting_the_topic() {
        let mut table = RouteTable::default();
        table.apply(&RouteUpdate::Register(registration(
            "b-0",
            "127.0.0.1:10911",
            &["T"],
            1,
        )));
        table.apply(&RouteUpdate::Register(registration(
            "b-1",
            "127.0.0.1:10921",
            &["T"],
            1,
        )));
        let route = table.route("T").expect("route");
        assert_eq!(route.queue_datas.len(), 2);
        assert_eq!(route.broker_datas.len(), 2);
        assert_eq!(
            route.broker_datas[1].broker_addrs.get(&0).unwrap(),
            "127.0.0.1:10921"
        );
        assert!(table.route("missing").is_none());
    }

    #[test]
    fn brokers_expire_after_their_timeout_and_late_registrations_are_ignored() {
        let mut table = RouteTable::default();
        table.apply(&RouteUpdate::Register(registration(
            "b-0",
            "a:1",
            &["T"],
            1_000,
        )));
        table.apply(&RouteUpdate::Register(registration("b-0", "a:1", &[], 500)));
        assert_eq!(
            table.expire(1_000 + BROKER_EXPIRY_MS_DEFAULT),
            Vec::<String>::new()
        );
        assert_eq!(
            table.expire(1_001 + BROKER_EXPIRY_MS_DEFAULT),
            vec!["a:1".to_string()]
        );
        assert!(table.route("T").is_none());
        assert!(table.cluster_info().broker_addr_table.is_empty());
    }

    #[test]
    fn a_live_brokers_name_and_address_are_its_own() {
        let ip = |last: u8| Some(std::net::IpAddr::from([127, 0, 0, last]));
        let mut table = RouteTable::default();
        let mut real = registration("b-0", "a:1", &["T"], 1_000);
        real.peer_ip = ip(1);
        table.apply(&RouteUpdate::Register(real.clone()));
        let mut other_addr = registration("b-0", "x:1", &["T"], 1_100);
        other_addr.peer_ip = ip(2);
        assert!(table.registration_conflict(&other_addr, 1_100).is_some());
        let mut spoof = real.clone();
        spoof.peer_ip = ip(2);
        assert!(table.registration_conflict(&spoof, 1_100).is_some());
        assert!(table.registration_conflict(&real, 1_100).is_none());
        // Expired, the place is free.
        let later = 1_000 + BROKER_EXPIRY_MS_DEFAULT + 1;
        assert!(table.registration_conflict(&other_addr, later).is_none());
        // Only its registrant's address removes it.
        let unregister = |peer_ip| RouteUpdate::Unregister {
            cluster_name: "DefaultCluster".into(),
            broker_name: "b-0".into(),
            broker_addr: "a:1".into(),
            broker_id: 0,
            peer_ip,
        };
        table.apply(&unregister(ip(2)));
        assert!(table.route("T").is_some());
        table.apply(&unregister(ip(1)));
        assert!(table.route("T").is_none());
    }

    #[test]
    fn unregister_drops_queue_data_and_kv_round_trips() {
        let mut table = RouteTable::default();
        table.apply(&RouteUpdate::Register(registration(
            "b-0",
            "a:1",
            &["T"],
            1,
        )));
        table.apply(&unregister("b-0", "a:1"));
        assert!(table.route("T").is_none());
        table.apply(&RouteUpdate::PutKv {
            namespace: "n".into(),
            key: "k".into(),
            value: "v".into(),
        });
        assert_eq!(table.kv_get("n", "k"), Some("v"));
        table.apply(&RouteUpdate::DeleteKv {
            namespace: "n".into(),
            key: "k".into(),
        });
        assert_eq!(table.kv_get("n", "k"), None);
    }

    #[test]
    fn the_kv_configs_bytes_are_counted_as_entries_come_change_and_go() {
        let mut table = RouteTable::default();
        let put = |namespace: &str, key: &str, value: &str| RouteUpdate::PutKv {
            namespace: namespace.into(),
            key: key.into(),
            value: value.into(),
        };
        assert_eq!(table.kv_bytes_after_put("ns", "key", "value"), 10);
        table.apply(&put("ns", "key", "value"));
        assert_eq!(table.kv_bytes, 10);
        assert_eq!(
            table.kv_bytes_after_put("ns", "k2", "v"),
            10 + 3,
            "the namespace is there"
        );
        assert_eq!(
            table.kv_bytes_after_put("ns", "key", "longer"),
            10 + 6 - 5,
            "the old value goes"
        );
        table.apply(&put("ns", "key", "longer"));
        assert_eq!(table.kv_bytes, 11);
        table.apply(&put("ns", "k2", "v"));
        table.apply(&RouteUpdate::DeleteKv {
            namespace: "ns".into(),
            key: "key".into(),
        });
        assert_eq!(table.kv_bytes, 5, "the namespace stays, as in RocketMQ");
    }

    #[test]
    fn routes_are_counted_as_registrations_unregistrations_deletions_and_expiry_change_them() {
        let mut table = RouteTable::default();
        let first = registration("b-0", "a:1", &["T1", "T2"], 1);
        assert_eq!(table.routes_added_by(&first), 2);
        table.apply(&RouteUpdate::Register(first.clone()));
        assert_eq!(
            table.routes_added_by(&first),
            0,
            "registered again: nothing new"
        );
        let more = registration("b-0", "a:1", &["T2", "T3"], 2);
        assert_eq!(table.routes_added_by(&more), 1);
        table.apply(&RouteUpdate::Register(more));
        table.apply(&RouteUpdate::Register(registration(
            "b-1",
            "b:1",
            &["T1"],
            3,
        )));
        assert_eq!(table.routes(), 4, "T1 on two names, T2 and T3 on one");
        table.apply(&RouteUpdate::DeleteTopic {
            topic: "T3".into(),
            cluster_name: None,
        });
        assert_eq!(table.routes(), 3);
        table.apply(&RouteUpdate::DeleteTopic {
            topic: "T1".into(),
            cluster_name: Some("DefaultCluster".into()),
        });
        assert_eq!(table.routes(), 1, "T1 gone from both names of the cluster");
        table.apply(&RouteUpdate::Register(registration(
            "b-1",
            "b:1",
            &["T4"],
            4,
        )));
        table.apply(&unregister("b-0", "a:1"));
        assert_eq!(table.routes(), 1, "b-0's T2 went with it");
        table.expire(4 + BROKER_EXPIRY_MS_DEFAULT + 1);
        assert_eq!(table.routes(), 0, "b-1 expired with its T4");
    }
}
