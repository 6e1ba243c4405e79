//! Namesrv request handlers (one shard's replica). Every request gets an answer; unknown
//! codes get REQUEST_CODE_NOT_SUPPORTED.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;

use crate::body::{self, DataVersion, RegisterBrokerBody};
use crate::error::{now_ms, RequestError};
use crate::remoting::{request_code as rc, response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

use super::table::{BrokerRegistration, RouteTable, RouteUpdate};

/// Topics in one registration after which the allocator gives its free pages back
/// (`runtime::release_free_memory`).
const TRIM_AFTER_REGISTERED_TOPICS: usize = 1_000;

/// The namesrv side of a shard.
pub struct NamesrvHandler {
    pub table: Rc<RefCell<RouteTable>>,
    /// Sends an applied update to the other replicas.
    pub broadcast: Box<dyn Fn(&RouteUpdate)>,
    /// The KV config file this replica writes (only one shard persists), if any; its writer
    /// task writes it off the shard thread after every change.
    kv_file: Option<Rc<crate::persist::Persisted>>,
    /// Brokers registered over each connection: unregistered when it closes (as Java does).
    registered_by_connection: RefCell<BTreeMap<u64, Vec<RouteUpdate>>>,
}

impl NamesrvHandler {
    pub fn new(
        table: Rc<RefCell<RouteTable>>,
        broadcast: Box<dyn Fn(&RouteUpdate)>,
        kv_config_path: Option<PathBuf>,
    ) -> Self {
        let kv_file = kv_config_path.map(|path| {
            let file = crate::persist::Persisted::new(path);
            let weak = Rc::downgrade(&table);
            shards::runtime::spawn_detached(crate::persist::run_writer(file.clone(), move || {
                let json = serde_json::json!({ "configTable": weak.upgrade()?.borrow().kv_all() });
                Some(Box::new(move || {
                    serde_json::to_vec_pretty(&json).unwrap_or_default()
                }))
            }));
            file
        });
        NamesrvHandler {
            table,
            broadcast,
            kv_file,
            registered_by_connection: RefCell::new(BTreeMap::new()),
        }
    }

    /// Applies locally and broadcasts to the other replicas.
    fn apply(&self, update: RouteUpdate) {
        self.table.borrow_mut().apply(&update);
        (self.broadcast)(&update);
        if matches!(
            update,
            RouteUpdate::PutKv { .. } | RouteUpdate::DeleteKv { .. }
        ) {
            self.persist_kv();
        }
    }

    fn persist_kv(&self) {
        if let Some(file) = &self.kv_file {
            file.note_change();
        }
    }

    /// Waits until the KV config on disk has every change (a clean stop).
    pub async fn persist_at_shutdown(&self) {
        if let Some(file) = &self.kv_file {
            if let Err(why) = file.durable(file.latest()).await {
                log::warn!("namesrv: at shutdown: {why}");
            }
        }
    }

    /// An update another replica made, applied to this one's table: the persisting replica
    /// writes KV changes whichever shard received them.
    pub fn applied_from_peer(&self, update: &RouteUpdate) {
        if matches!(
            update,
            RouteUpdate::PutKv { .. } | RouteUpdate::DeleteKv { .. }
        ) {
            self.persist_kv();
        }
    }

    pub fn handle(&self, request: &RemotingCommand<'_>, connection: &Rc<Connection>) {
        if let Err(error) = self.dispatch(request, connection) {
            let (code, remark) = error.code_and_remark();
            connection.respond(request, code, Some(&remark));
        }
    }

    fn dispatch(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        match request.code {
            rc::REGISTER_BROKER => self.register_broker(request, connection),
            rc::UNREGISTER_BROKER => self.unregister_broker(request, connection),
            rc::GET_ROUTEINFO_BY_TOPIC => self.route_by_topic(request, connection),
            rc::GET_BROKER_CLUSTER_INFO => {
                let body = self.table.borrow().cluster_info().encode();
                connection.respond_body(request, &body);
                Ok(())
            }
            rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => {
                let body = body::encode_topic_list(&self.table.borrow().topic_names());
                connection.respond_body(request, &body);
                Ok(())
            }
            rc::GET_TOPICS_BY_CLUSTER => {
                let cluster = request.ext_fields.required("cluster")?;
                let topics = self.table.borrow().topics_of_cluster(cluster);
                connection.respond_body(request, &body::encode_topic_list(&topics));
                Ok(())
            }
            rc::DELETE_TOPIC_IN_NAMESRV => {
                let topic = request.ext_fields.required("topic")?.to_string();
                let cluster_name = request
                    .ext_fields
                    .get_non_empty("clusterName")
                    .map(String::from);
                self.apply(RouteUpdate::DeleteTopic {
                    topic,
                    cluster_name,
                });
                connection.respond(request, response_code::SUCCESS, None);
                Ok(())
            }
            rc::PUT_KV_CONFIG => self.put_kv(request, connection),
            rc::GET_KV_CONFIG => self.get_kv(request, connection),
            rc::DELETE_KV_CONFIG => {
                let namespace = request.ext_fields.required("namespace")?.to_string();
                let key = request.ext_fields.required("key")?.to_string();
                self.apply(RouteUpdate::DeleteKv { namespace, key });
                connection.respond(request, response_code::SUCCESS, None);
                Ok(())
            }
            rc::GET_KVLIST_BY_NAMESPACE => {
                let namespace = request.ext_fields.required("namespace")?;
                let table = self.table.borrow();
                match table.kv_namespace(namespace) {
                    Some(entries) => {
                        connection.respond_body(request, &body::encode_kv_table(entries))
                    }
                    None => connection.respond(
                        request,
                        response_code::QUERY_NOT_FOUND,
                        Some(&format!("No config item, Namespace: {namespace}")),
                    ),
                }
                Ok(())
            }
            rc::QUERY_DATA_VERSION => self.query_data_version(request, connection),
            code => Err(RequestError::NotSupported(code)),
        }
    }

    fn register_broker(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let body_crc = ext.optional_i64("bodyCrc32")?.unwrap_or(0);
        if body_crc != 0 && i64::from(crc32fast::hash(request.body) & 0x7FFF_FFFF) != body_crc {
            return Err(RequestError::SystemError("crc32 not match".into()));
        }
        if ext.bool_lenient("compressed") == Some(true) {
            return Err(RequestError::SystemError(
                "compressed broker registrations are not supported; register with \
                 compressed=false"
                    .into(),
            ));
        }
        let (topics, data_version) = if request.body.is_empty() {
            (
                Vec::new(),
                DataVersion {
                    counter: 0,
                    state_version: 0,
                    timestamp: now_ms(),
                },
            )
        } else {
            let body = RegisterBrokerBody::parse(request.body)?;
            let table = body.topic_config_table;
            (table.topics.into_values().collect(), table.data_version)
        };
        let broker_id = ext.required_i64("brokerId")?;
        let registration = BrokerRegistration {
            cluster_name: ext.required("clusterName")?.to_string(),
            broker_name: ext.required("brokerName")?.to_string(),
            broker_addr: ext.required("brokerAddr")?.to_string(),
            broker_id: u64::try_from(broker_id).map_err(|_| {
                RequestError::InvalidParameter(format!(
                    "brokerId {broker_id} is negative: 0 is a master, more a slave"
                ))
            })?,
            ha_server_addr: ext.get("haServerAddr").unwrap_or_default().to_string(),
            heartbeat_timeout_ms: ext.optional_i64("heartbeatTimeoutMillis")?.unwrap_or(0),
            data_version,
            topics,
            received_at_ms: now_ms(),
            peer_ip: Some(connection.peer.ip()),
        };
        validate_registration(&registration)?;
        if let Some(conflict) = self
            .table
            .borrow()
            .registration_conflict(&registration, registration.received_at_ms)
        {
            log::warn!(
                "namesrv: registration from {} refused: {conflict}",
                connection.peer
            );
            return Err(RequestError::NoPermission(conflict));
        }
        let (held, added) = {
            let table = self.table.borrow();
            (table.routes(), table.routes_added_by(&registration))
        };
        if held + added > super::table::ROUTES_MAX {
            let why = format!(
                "the namesrv holds {held} topic routes and this registration of broker {} \
                 ({}) adds {added}: past the limit of {}",
                registration.broker_name,
                registration.broker_addr,
                super::table::ROUTES_MAX
            );
            log::warn!(
                "namesrv: registration from {} refused: {why}",
                connection.peer
            );
            return Err(RequestError::SystemError(why));
        }
        let unregister = RouteUpdate::Unregister {
            cluster_name: registration.cluster_name.clone(),
            broker_name: registration.broker_name.clone(),
            broker_addr: registration.broker_addr.clone(),
            broker_id: registration.broker_id,
            peer_ip: registration.peer_ip,
        };
        let (broker_name, broker_id) = (registration.broker_name.clone(), registration.broker_id);
        let topic_count = registration.topics.len();
        self.apply(RouteUpdate::Register(registration));
        if topic_count >= TRIM_AFTER_REGISTERED_TOPICS {
            // The broker's routes were replaced: the old ones are freed between the new
            // ones, and glibc keeps those blocks (10,000 topics from two shards grew the
            // process by 12-25 MB every 30 s, given back only at a trim).
            shards::runtime::spawn_detached(shards::runtime::release_free_memory());
        }
        let mut by_connection = self.registered_by_connection.borrow_mut();
        let registered = by_connection.entry(connection.id).or_default();
        if !registered.iter().any(|u| same_broker(u, &unregister)) {
            registered.push(unregister);
        }
        drop(by_connection);
        // A slave is told its master's address and HA address (RouteInfoManager).
        let (master_addr, ha_server_addr) = match broker_id {
            0 => (None, String::new()),
            _ => {
                let table = self.table.borrow();
                let master = table.master_addr_of(&broker_name).map(String::from);
                let ha = master.as_deref().and_then(|m| table.ha_server_addr_of(m));
                let ha = ha.unwrap_or_default().to_string();
                (master, ha)
            }
        };
        if request.is_oneway() {
            return Ok(());
        }
        connection.send_with(|out| {
            let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
            if !ha_server_addr.is_empty() {
                frame.ext("haServerAddr", &ha_server_addr);
            }
            if let Some(master_addr) = &master_addr {
                frame.ext("masterAddr", master_addr);
            }
            frame.finish(&[]);
        });
        Ok(())
    }

    fn unregister_broker(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let update = RouteUpdate::Unregister {
            cluster_name: ext.required("clusterName")?.to_string(),
            broker_name: ext.required("brokerName")?.to_string(),
            broker_addr: ext.required("brokerAddr")?.to_string(),
            broker_id: ext.required_i64("brokerId")?.max(0) as u64,
            peer_ip: Some(connection.peer.ip()),
        };
        if let Some(registered) = self
            .registered_by_connection
            .borrow_mut()
            .get_mut(&connection.id)
        {
            registered.retain(|u| !same_broker(u, &update));
        }
        self.apply(update);
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    fn route_by_topic(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?;
        let route = self.table.borrow().route(topic);
        match route {
            Some(route) => connection.respond_body(request, &route.encode()),
            None => connection.respond(
                request,
                response_code::TOPIC_NOT_EXIST,
                Some(&format!(
                    "No topic route info in name server for the topic: {topic}"
                )),
            ),
        }
        Ok(())
    }

    fn put_kv(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let (namespace, key, value) = (
            ext.required("namespace")?,
            ext.required("key")?,
            ext.required("value")?,
        );
        {
            let after = self
                .table
                .borrow()
                .kv_bytes_after_put(namespace, key, value);
            if after > super::table::KV_BYTES_MAX {
                return Err(RequestError::SystemError(format!(
                    "the KV config would hold {after} bytes with this entry, past the limit of \
                     {}: {namespace} {key} is not set",
                    super::table::KV_BYTES_MAX
                )));
            }
        }
        self.apply(RouteUpdate::PutKv {
            namespace: namespace.to_string(),
            key: key.to_string(),
            value: value.to_string(),
        });
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }

    fn get_kv(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let namespace = request.ext_fields.required("namespace")?;
        let key = request.ext_fields.required("key")?;
        let table = self.table.borrow();
        match table.kv_get(namespace, key) {
            Some(value) => connection.answer_with(request, |out| {
                let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
                frame.ext("value", value);
                frame.finish(&[]);
            }),
            None => connection.respond(
                request,
                response_code::QUERY_NOT_FOUND,
                Some(&format!(
                    "No config item, Namespace: {namespace} Key: {key}"
                )),
            ),
        }
        Ok(())
    }

    fn query_data_version(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let broker_addr = request.ext_fields.required("brokerAddr")?;
        let theirs = DataVersion::parse(request.body).ok();
        let mut table = self.table.borrow_mut();
        let ours = table.data_version_of(broker_addr).cloned();
        let changed = match (&ours, &theirs) {
            (Some(ours), Some(theirs)) => ours != theirs,
            _ => true,
        };
        table.touch(broker_addr, now_ms());
        drop(table);
        let body = ours.map(|v| v.encode()).unwrap_or_default();
        connection.answer_with(request, |out| {
            let mut frame = FrameEncoder::response(out, response_code::SUCCESS, request.opaque);
            frame.ext_bool("changed", changed);
            frame.finish(&body);
        });
        Ok(())
    }

    /// A broker's namesrv connection closed: its registrations go at once (as Java does).
    pub fn connection_closed(&self, connection: &Rc<Connection>) {
        let registered = self
            .registered_by_connection
            .borrow_mut()
            .remove(&connection.id);
        for update in registered.unwrap_or_default() {
            self.apply(update);
        }
    }
}

/// Longest cluster or broker name a namesrv takes (RocketMQ's names are short; this bounds
/// what a stranger can make every replica hold).
pub const BROKER_NAME_MAX_CHARS: usize = 255;

/// A name of a cluster or broker: not blank, bounded, letters, digits and `-_.%|:`.
fn validate_broker_name(kind: &str, name: &str) -> Result<(), RequestError> {
    let valid =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '%' | '|' | ':');
    if name.is_empty() || name.len() > BROKER_NAME_MAX_CHARS || !name.chars().all(valid) {
        let shown: String = name.chars().take(64).collect();
        return Err(RequestError::InvalidParameter(format!(
            "{kind} {shown:?}{} is not a valid name: 1 to {BROKER_NAME_MAX_CHARS} letters, \
             digits or -_.%|:",
            if name.chars().count() > 64 { "…" } else { "" }
        )));
    }
    Ok(())
}

/// An address a client can connect to: `host:port`, a port of 1 to 65535, a host of letters,
/// digits, `.`, `-` or `:` (IPv6), at most 255 characters.
fn validate_address(kind: &str, addr: &str) -> Result<(), RequestError> {
    let invalid = || {
        let shown: String = addr.chars().take(64).collect();
        RequestError::InvalidParameter(format!(
            "{kind} {shown:?} is not an address: want host:port"
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(invalid)?;
    let host_ok = !host.is_empty()
        && addr.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
    if host_ok && port_ok {
        Ok(())
    } else {
        Err(invalid())
    }
}

/// What a namesrv checks in every registration before any replica takes it: the names, the
/// addresses, and every topic name (as a broker checks a topic it creates).
fn validate_registration(registration: &BrokerRegistration) -> Result<(), RequestError> {
    validate_broker_name("clusterName", &registration.cluster_name)?;
    validate_broker_name("brokerName", &registration.broker_name)?;
    validate_address("brokerAddr", &registration.broker_addr)?;
    if !registration.ha_server_addr.is_empty() {
        validate_address("haServerAddr", &registration.ha_server_addr)?;
    }
    for topic in &registration.topics {
        crate::broker::state::topics::validate_topic_name(&topic.topic_name).map_err(|error| {
            RequestError::InvalidParameter(format!(
                "topic {:?} of the registration: {error}",
                topic.topic_name.chars().take(64).collect::<String>()
            ))
        })?;
    }
    Ok(())
}

fn same_broker(a: &RouteUpdate, b: &RouteUpdate) -> bool {
    match (a, b) {
        (
            RouteUpdate::Unregister {
                broker_addr: a,
                broker_id: ai,
                ..
            },
            RouteUpdate::Unregister {
                broker_addr: b,
                broker_id: bi,
                ..
            },
        ) => a == b && ai == bi,
        _ => false,
    }
}
