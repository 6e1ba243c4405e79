//! One node: the shards of this process and what each runs (namesrv role, broker role or
//! both), their listeners, timers and control-plane messages, and an orderly shutdown on
//! SIGINT/SIGTERM (final flush, offsets written, brokers unregistered).
//!
//! Shared across shards, and nothing else: the immutable `NodeConfig` (an `Arc`), and the
//! process-wide shutdown flag and ready counter below.

use std::cell::RefCell;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shards::mesh::MeshSender;
use shards::runtime::{self, ShardContext, ShardPlacement};
use shards::store::{FlushMode, Store, StoreConfig};

use crate::broker::{self, registration, Broker, BrokerIdentity, TopicChange};
use crate::error::now_ms;
use crate::namesrv::{NamesrvHandler, RouteTable, RouteUpdate};
use crate::remoting::RemotingCommand;
use crate::server::{self, Connection, ConnectionLimits, RequestHandler};

/// Set by SIGINT/SIGTERM, which also wakes every shard (`SHUTDOWN_WAKE_FDS`).
static SHUTDOWN_REQUESTED: AtomicBool = AtomicBool::new(false);
/// The write ends of the shards' shutdown wake-ups, for the signal handler.
static SHUTDOWN_WAKE_FDS: std::sync::OnceLock<Vec<std::os::fd::RawFd>> = std::sync::OnceLock::new();
/// Shards whose broker has completed its first registration.
static SHARDS_READY: AtomicUsize = AtomicUsize::new(0);
/// RocketMQ's scanNotActiveBrokerInterval.
const BROKER_EXPIRY_SCAN_INTERVAL_MS: u64 = 5_000;

/// Everything a node needs to start; immutable once shards run.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub run_namesrv: bool,
    pub run_broker: bool,
    pub data_dir: PathBuf,
    pub listen_ip: Ipv4Addr,
    /// The address advertised to clients (brokerIP1).
    pub broker_ip: Ipv4Addr,
    pub namesrv_port: u16,
    pub broker_port: u16,
    /// Shard i listens on broker_port + i * port_stride.
    pub port_stride: u16,
    /// Where brokers register (the local namesrv when both roles run).
    pub namesrv_addrs: Vec<SocketAddr>,
    pub cluster_name: String,
    pub broker_name: String,
    /// The tuning profile's name or path (for the start-up line).
    pub profile: String,
    pub placement: ShardPlacement,
    pub flush_mode: FlushMode,
    pub flush_interval_ms: u64,
    /// Async flush: dirty bytes that start a flush before the interval ends.
    pub flush_dirty_max_bytes: u64,
    pub segment_size_bytes: u64,
    /// Segment space kept allocated ahead of the writes (store.allocation_window_mib).
    pub allocation_window_bytes: u64,
    /// Windows of 1 MiB each shard's read cache keeps (store.read_cache_mib).
    pub read_cache_windows: usize,
    /// runtime.store_open_stall_ms (0: never abandon a store open).
    pub store_open_stall_ms: u64,
    /// Per-connection buffer sizes and limits of every listener.
    pub connection_limits: ConnectionLimits,
    /// RocketMQ's messageDelayLevel table.
    pub delay_levels: broker::schedule::DelayLevels,
    /// Test-only fault injection: every flush first waits this long (a slow disk).
    pub test_flush_delay_ms: Option<u64>,
    /// Transaction check-back settings (timeout, check interval, check max).
    pub transaction: crate::broker::transaction::TransactionConfig,
    /// Retention and the disk ratios (RocketMQ's fileReservedTime, deleteWhen, …).
    pub retention: shards::store::RetentionConfig,
    /// TLS on every port (`--tls-server-mode`; none when disabled).
    pub tls: Option<Arc<crate::tls::TlsServer>>,
    /// The Prometheus endpoint's port on listen_ip (`--metrics-port`; 0: none).
    pub metrics_port: u16,
    /// Topic auto-creation (autoCreateTopicEnable, defaultTopicQueueNums).
    pub auto_create: crate::broker::topics::AutoCreate,
    /// Where the shards publish their figures for it (made at start when there is a port).
    pub metrics: Option<Arc<crate::metrics::MetricsBoard>>,
    /// `--console-write`: the web console may create topics and groups (else read-only).
    pub console_write: bool,
    /// TLS for the brokers' namesrv connections (`--tls-enable`; none: plaintext).
    pub namesrv_tls: Option<Arc<rustls::ClientConfig>>,
    /// `--acl-file`: ACL on every port of this node (RocketMQ's aclEnable + plain_acl.yml).
    pub acl: Option<Arc<crate::acl::AclSource>>,
    /// What this node's brokers sign their namesrv requests with (RocketMQ 5's
    /// innerClientAuthenticationCredentials); none: unsigned.
    pub inner_credentials: Option<crate::remoting::signature::Credentials>,
    /// brokerRole, brokerId and the HA settings of every shard (`crate::ha`);
    /// `master_address` is shard 0's, shard i adds `port_stride` × i.
    pub ha: crate::ha::HaConfig,
}

impl NodeConfig {
    pub fn shard_port(&self, shard: usize) -> u16 {
        self.broker_port + (shard as u16) * self.port_stride
    }

    /// Shard i's HA port: haListenPort + the stride × i, or its broker port + 1.
    pub fn ha_port(&self, shard: usize) -> u16 {
        let stride = (shard as u16) * self.port_stride;
        self.ha
            .listen_port
            .map_or(self.shard_port(shard) + 1, |port| port + stride)
    }
}

/// What travels between shards.
#[derive(Debug, Clone)]
pub enum ControlMessage {
    Route(RouteUpdate),
    Topic(TopicChange),
}

extern "C" fn on_shutdown_signal(_: libc::c_int) {
    SHUTDOWN_REQUESTED.store(true, Ordering::SeqCst);
    // Async-signal-safe: an atomic load and one send(2) per shard.
    if let Some(fds) = SHUTDOWN_WAKE_FDS.get() {
        for &fd in fds {
            shards::runtime::wake::write_byte(fd);
        }
    }
}

/// Runs the node until SIGINT/SIGTERM.
pub fn run(mut config: NodeConfig) -> anyhow::Result<()> {
    let shard_count = config.placement.cpus.len();
    runtime::check_environment(shard_count, config.placement.io_memory_bytes)
        .map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&config.data_dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot create the data directory {}: {e}",
            config.data_dir.display()
        )
    })?;
    // glommio opens directories relative to nothing: hand it an absolute path.
    config.data_dir = std::fs::canonicalize(&config.data_dir)?;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_shutdown_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_shutdown_signal as *const () as libc::sighandler_t,
        );
    }
    check_ports_free(&config)?;
    if config.metrics_port != 0 && config.run_broker {
        config.metrics = Some(crate::metrics::MetricsBoard::new(shard_count));
    }
    if let Some(acl) = &config.acl {
        acl.watch();
    }
    fit_connections_to_descriptors(&mut config, shard_count);
    let mut shutdown_wakers = Vec::with_capacity(shard_count);
    let mut shutdown_receivers = Vec::with_capacity(shard_count);
    for _ in 0..shard_count {
        let (waker, receiver) = shards::runtime::wake::unbound_pair()?;
        shutdown_wakers.push(waker);
        shutdown_receivers.push(Some(receiver));
    }
    let _ = SHUTDOWN_WAKE_FDS.set(shutdown_wakers.iter().map(|w| w.raw_fd()).collect());
    let shutdown_receivers = Arc::new(std::sync::Mutex::new(shutdown_receivers));
    let config = Arc::new(config);
    let placement = config.placement.clone();
    runtime::run_shards(&placement, move |context: ShardContext<ControlMessage>| {
        let config = config.clone();
        let shutdown = shutdown_receivers
            .lock()
            .ok()
            .and_then(|mut receivers| receivers[context.shard_id.0].take())
            .expect("one shutdown wake-up per shard");
        async move { run_shard(context, config, shutdown.bind()).await }
    })?;
    drop(shutdown_wakers);
    log::info!("stopped");
    Ok(())
}

/// Descriptors kept for the store of each shard (segments, index and queue files being
/// mapped, config writes) and for the process itself, out of RLIMIT_NOFILE.
const DESCRIPTORS_PER_SHARD_STORE: u64 = 1024;
const DESCRIPTORS_PROCESS: u64 = 256;

/// Raises the descriptor limit to its hard limit and lowers the per-shard connection cap
/// when the descriptors left after the stores' share (and the HA and metrics ports' caps)
/// cannot hold it: connections can then never take the descriptors a store needs (a full
/// table used to poison the stores). Then
/// sizes the descriptor table for all of them (`runtime::reserve_descriptor_table`).
fn fit_connections_to_descriptors(config: &mut NodeConfig, shard_count: usize) {
    let limit = match runtime::raise_descriptor_limit() {
        Ok((before, after)) => {
            if after > before {
                log::info!("raised the open-file limit (RLIMIT_NOFILE) from {before} to {after}");
            }
            after
        }
        Err(error) => {
            log::warn!("cannot read or raise the open-file limit: {error}");
            return;
        }
    };
    let shards = shard_count.max(1) as u64;
    let per_shard = DESCRIPTORS_PER_SHARD_STORE + crate::limits::HA_CONNECTIONS_MAX as u64;
    let process = DESCRIPTORS_PROCESS + crate::limits::METRICS_CONNECTIONS_MAX as u64;
    let for_connections = limit.saturating_sub(process + per_shard * shards) / shards;
    let cap = &mut config.connection_limits.connections_per_shard_max;
    let fitted = (*cap as u64).min(for_connections.max(16)) as usize;
    if fitted < *cap {
        log::info!(
            "serving at most {fitted} connections per shard (the open-file limit \
             {limit} leaves that many after {DESCRIPTORS_PER_SHARD_STORE} per store; raise it \
             with `ulimit -n` or LimitNOFILE= to serve {cap})"
        );
        *cap = fitted;
    }
    // Every descriptor the node may hold, in the table from the start: no accept on a shard
    // then waits for the kernel to grow it.
    let needed = process + (per_shard + *cap as u64) * shards;
    match runtime::reserve_descriptor_table(needed) {
        Ok(reserved) => log::debug!("descriptor table sized for {reserved} descriptors"),
        Err(error) => log::warn!("cannot size the descriptor table ahead: {error}"),
    }
}

/// Every shard binds the namesrv port with SO_REUSEPORT, which would let a second process
/// share it silently (and split the traffic); a plain bind of every port first makes
/// "address in use" an error at start, with the port's role named. (The other ports are
/// bound by one shard each, without SO_REUSEPORT.)
fn check_ports_free(config: &NodeConfig) -> anyhow::Result<()> {
    let mut ports = Vec::new();
    if config.run_namesrv {
        ports.push((config.namesrv_port, "namesrv"));
    }
    if config.run_broker {
        for shard in 0..config.placement.cpus.len() {
            ports.push((config.shard_port(shard), "broker"));
            ports.push((config.shard_port(shard) - 2, "broker-vip"));
            ports.push((config.ha_port(shard), "HA"));
        }
    }
    for (i, (port, what)) in ports.iter().enumerate() {
        if let Some((_, other)) = ports[..i].iter().find(|(p, _)| p == port) {
            anyhow::bail!("{other} and {what} are both set to port {port}");
        }
    }
    for (port, what) in ports {
        std::net::TcpListener::bind((config.listen_ip, port)).map_err(|e| {
            anyhow::anyhow!(
                "cannot listen for {what} on {}:{port}: {e}",
                config.listen_ip
            )
        })?;
    }
    Ok(())
}

struct ShardHandler {
    namesrv: Option<Rc<NamesrvHandler>>,
    broker: Option<Rc<Broker>>,
    acl: Option<crate::acl::AclView>,
}

/// Serves one listener's role: the namesrv port or a broker port.
struct RoleHandler {
    shard: Rc<ShardHandler>,
    namesrv_port: bool,
}

impl RequestHandler for RoleHandler {
    fn handle(&self, request: &RemotingCommand<'_>, connection: &Rc<Connection>) {
        if let Some(acl) = &self.shard.acl {
            let role = match self.namesrv_port {
                true => crate::acl::Role::Namesrv,
                false => crate::acl::Role::Broker,
            };
            if let Err(remark) = acl.check(role, request, connection.peer.ip()) {
                log::debug!(
                    "refused by ACL: {} from {}: {remark}",
                    request.code,
                    connection.peer
                );
                connection.respond(
                    request,
                    crate::remoting::response_code::NO_PERMISSION,
                    Some(&remark),
                );
                return;
            }
        }
        match (&self.shard.namesrv, &self.shard.broker, self.namesrv_port) {
            (Some(namesrv), _, true) => namesrv.handle(request, connection),
            (_, Some(broker), false) => broker.handle(request, connection),
            _ => connection.respond(
                request,
                crate::remoting::response_code::SYSTEM_ERROR,
                Some("role not served here"),
            ),
        }
    }

    fn connection_closed(&self, connection: &Rc<Connection>) {
        if self.namesrv_port {
            if let Some(namesrv) = &self.shard.namesrv {
                namesrv.connection_closed(connection);
            }
        } else if let Some(broker) = &self.shard.broker {
            broker.connection_closed(connection);
        }
    }
}

async fn run_shard(
    context: ShardContext<ControlMessage>,
    config: Arc<NodeConfig>,
    mut shutdown: shards::runtime::wake::WakeReceiver,
) {
    let shard_id = context.shard_id;
    let shard_count = context.shard_count;
    let mut mesh = context.mesh;
    let sender = mesh.sender();
    let table = Rc::new(RefCell::new(RouteTable::default()));
    let namesrv = config
        .run_namesrv
        .then(|| Rc::new(make_namesrv(&config, shard_id.0, &table, &sender)));
    let opened = match config.run_broker {
        true => Some(
            open_broker_with_retries(&config, shard_id.0, &sender)
                .await
                .map(|mut broker| {
                    if config.run_namesrv {
                        if let Some(broker) = Rc::get_mut(&mut broker) {
                            let mesh = sender.clone();
                            broker.local_routes = Some(crate::broker::LocalRoutes {
                                table: table.clone(),
                                shard_count,
                                changed: mesh.progress_signal(),
                                replicas_caught_up: Rc::new(move || mesh.all_applied()),
                            });
                        }
                    }
                    broker
                }),
        ),
        false => None,
    };
    let broker = match opened {
        Some(opened) => match opened {
            Ok(broker) => Some(broker),
            Err(error) => {
                log::warn!("shard {shard_id}: {error}");
                std::process::exit(1);
            }
        },
        None => None,
    };
    if let Some(broker) = &broker {
        // Half messages left undecided by the previous run, before any client is served.
        broker.transactions.borrow_mut().config = config.transaction;
        broker.recover_transactions().await;
    }
    let (route_table, topic_broker, peer_namesrv) =
        (table.clone(), broker.clone(), namesrv.clone());
    mesh.spawn_receivers(move |message| match message {
        ControlMessage::Route(update) => {
            route_table.borrow_mut().apply(&update);
            if let Some(namesrv) = &peer_namesrv {
                namesrv.applied_from_peer(&update);
            }
        }
        ControlMessage::Topic(change) => {
            if let Some(broker) = &topic_broker {
                broker.apply_topic_change(&change);
            }
        }
    });
    let shard = Rc::new(ShardHandler {
        namesrv: namesrv.clone(),
        broker: broker.clone(),
        acl: config.acl.clone().map(crate::acl::AclView::new),
    });
    if let Err(error) = start_listeners(&config, shard_id.0, &shard) {
        log::warn!("shard {shard_id}: {error}");
        std::process::exit(1);
    }
    if namesrv.is_some() {
        runtime::spawn_detached(expire_brokers(table.clone()));
    }
    if let Some(broker) = &broker {
        let local_table = config
            .run_namesrv
            .then(|| (table.clone(), sender.progress_signal()));
        start_broker_tasks(&config, broker, shard_count, local_table);
    }
    while !SHUTDOWN_REQUESTED.load(Ordering::SeqCst) {
        if shutdown.wait().await.is_err() {
            break;
        }
    }
    if let Some(broker) = &broker {
        shut_down_broker(&config, broker).await;
    }
    if let Some(namesrv) = &namesrv {
        namesrv.persist_at_shutdown().await;
    }
}

fn make_namesrv(
    config: &NodeConfig,
    shard_id: usize,
    table: &Rc<RefCell<RouteTable>>,
    sender: &MeshSender<ControlMessage>,
) -> NamesrvHandler {
    let kv_path = config.data_dir.join("namesrv").join("kvConfig.json");
    load_kv_config(&kv_path, &mut table.borrow_mut());
    let sender = sender.clone();
    let changed = sender.progress_signal();
    let broadcast = Box::new(move |update: &RouteUpdate| {
        sender.broadcast(&ControlMessage::Route(update.clone()));
        // This replica changed too: its local waiters look again.
        changed.notify();
    });
    NamesrvHandler::new(table.clone(), broadcast, (shard_id == 0).then_some(kv_path))
}

fn load_kv_config(path: &std::path::Path, table: &mut RouteTable) {
    let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).ok();
    let Some(value) = crate::persist::read_with_fallback(path, parse) else {
        return;
    };
    let Some(namespaces) = value.get("configTable").and_then(|v| v.as_object()) else {
        return;
    };
    for (namespace, entries) in namespaces {
        for (key, value) in entries.as_object().into_iter().flatten() {
            if let Some(value) = value.as_str() {
                table.apply(&RouteUpdate::PutKv {
                    namespace: namespace.clone(),
                    key: key.clone(),
                    value: value.to_string(),
                });
            }
        }
    }
}

/// How often a long store open prints its progress.
const STORE_OPEN_PROGRESS_EVERY_MS: u64 = 5_000;

/// Opens the shard's broker and store, watched for progress (the store-open workaround of
/// `shards::runtime::workarounds`): an attempt is abandoned and tried again only when no I/O
/// step completed for `store_open_stall_ms`, never because it takes long.
async fn open_broker_with_retries(
    config: &NodeConfig,
    shard_id: usize,
    sender: &MeshSender<ControlMessage>,
) -> Result<Rc<Broker>, String> {
    use shards::runtime::workarounds::{self, STORE_OPEN_ATTEMPTS_MAX};
    let stall_ms = config.store_open_stall_ms;
    for attempt in 1..=STORE_OPEN_ATTEMPTS_MAX {
        let progress = Rc::new(shards::store::OpenProgress::default());
        let started = std::time::Instant::now();
        let mut last_print = started;
        let print_progress = || {
            let now = std::time::Instant::now();
            if now.duration_since(last_print) < Duration::from_millis(STORE_OPEN_PROGRESS_EVERY_MS)
            {
                return;
            }
            last_print = now;
            let scanned = progress.scanned_bytes.get();
            let seconds = now.duration_since(started).as_secs_f64();
            log::info!(
                "shard {shard_id}: recovering: {} of at most {} MiB of commitlog \
                 scanned ({:.0} MiB/s)",
                scanned >> 20,
                progress.scan_total_bytes.get() >> 20,
                scanned as f64 / 1_048_576.0 / seconds.max(0.001)
            );
        };
        let opened = futures_lite::future::or(
            async { Some(open_broker(config, shard_id, sender, progress.clone()).await) },
            async {
                workarounds::stalled(|| progress.steps.get(), stall_ms, print_progress).await;
                None
            },
        )
        .await;
        match opened {
            Some(result) => {
                report_recovery(shard_id, &progress, started);
                return result;
            }
            None => {
                workarounds::counters()
                    .store_opens_abandoned
                    .fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "shard {shard_id}: opening the store made no progress for \
                     {stall_ms} ms (attempt {attempt} of {STORE_OPEN_ATTEMPTS_MAX}, a lost I/O \
                     completion?); trying again"
                )
            }
        }
    }
    Err(format!(
        "the store made no progress in {STORE_OPEN_ATTEMPTS_MAX} attempts"
    ))
}

fn report_recovery(
    shard_id: usize,
    progress: &shards::store::OpenProgress,
    started: std::time::Instant,
) {
    let Some(summary) = progress.recovered.get() else {
        return;
    };
    let scanned = progress.scanned_bytes.get();
    let seconds = started.elapsed().as_secs_f64();
    log::info!(
        "shard {shard_id}: store open in {seconds:.2} s: {} stop{}, scanned {} MiB from \
         offset {} ({:.0} MiB/s), log ends at {}",
        if summary.clean { "clean" } else { "unclean" },
        if summary.queues_from_catalog {
            ", queues from the catalog"
        } else {
            ""
        },
        scanned >> 20,
        summary.scan_from,
        scanned as f64 / 1_048_576.0 / seconds.max(0.001),
        summary.end
    );
    if summary.damaged_regions > 0 {
        log::error!(
            "shard {shard_id}: recovery stepped over {} damaged region(s) of the commitlog \
             ({} bytes); see the lines above, and run `shardmq verify` on the stopped store",
            summary.damaged_regions,
            summary.damaged_bytes
        );
    }
}

async fn open_broker(
    config: &NodeConfig,
    shard_id: usize,
    sender: &MeshSender<ControlMessage>,
    progress: Rc<shards::store::OpenProgress>,
) -> Result<Rc<Broker>, String> {
    let shard_dir = config.data_dir.join(format!("shard-{shard_id}"));
    let address = SocketAddrV4::new(config.broker_ip, config.shard_port(shard_id));
    let mut store_config = StoreConfig::new(shard_dir.clone(), address);
    store_config.flush_mode = config.flush_mode;
    store_config.flush_interval_ms = config.flush_interval_ms;
    store_config.flush_dirty_max_bytes = config.flush_dirty_max_bytes;
    store_config.segment_size_bytes = config.segment_size_bytes;
    store_config.allocation_window_bytes = config.allocation_window_bytes;
    store_config.read_cache_windows = config.read_cache_windows;
    store_config.progress = progress;
    // A slave's log takes its master's records unsealed: it keeps no recycled file. A live
    // update saved by an earlier run wins over the flags, as it does once the shard runs.
    let saved = crate::broker::handlers::broker_config::saved_live_value(
        &shard_dir,
        "segmentRecycleEnable",
    );
    let recycle = saved
        .and_then(|value| crate::conf::java_bool(&value).ok())
        .unwrap_or(config.retention.segment_recycle_enable);
    store_config.keep_recycled_segments = recycle && config.ha.role != crate::ha::BrokerRole::Slave;
    let store = Store::open(store_config)
        .await
        .map_err(|e| format!("cannot open the store in {}: {e}", shard_dir.display()))?;
    #[cfg(feature = "fault-injection")]
    if let Some(delay_ms) = config.test_flush_delay_ms {
        log::warn!("shard {shard_id}: TEST ONLY: every flush waits {delay_ms} ms first");
        store.set_test_flush_delay(Some(Duration::from_millis(delay_ms)));
    }
    let identity = BrokerIdentity {
        cluster_name: config.cluster_name.clone(),
        broker_name: format!("{}-{shard_id}", config.broker_name),
        address,
        shard_dir,
    };
    let sender = sender.clone();
    let broadcast = Box::new(move |change: &TopicChange| {
        sender.broadcast(&ControlMessage::Topic(change.clone()));
    });
    let options = broker::BrokerOptions {
        delay_levels: config.delay_levels.clone(),
        retention: config.retention.clone(),
        namesrv_credentials: config.inner_credentials.clone(),
        namesrv_tls: config.namesrv_tls.clone(),
        auto_create: config.auto_create,
        acl_enabled: config.acl.is_some(),
        ha: crate::ha::HaConfig {
            master_address: config.ha.master_address.map(|shard0| {
                let port = shard0.port() + (shard_id as u16) * config.port_stride;
                SocketAddr::new(shard0.ip(), port)
            }),
            listen_port: Some(config.ha_port(shard_id)),
            ..config.ha.clone()
        },
    };
    Ok(Rc::new(Broker::new(identity, store, broadcast, options)))
}

fn start_listeners(
    config: &NodeConfig,
    shard_id: usize,
    shard: &Rc<ShardHandler>,
) -> std::io::Result<()> {
    let ip = config.listen_ip;
    let mut listening = Vec::new();
    // One cap for all of this shard's listeners.
    let gate = server::ConnectionGate::new(
        config.connection_limits.connections_per_shard_max,
        config.connection_limits.connections_per_address_max,
    );
    if shard.namesrv.is_some() {
        let addr = SocketAddr::from((ip, config.namesrv_port));
        // Every shard binds the namesrv port (check_ports_free made sure no one else has it).
        let listener = named(runtime::bind_shared(addr), addr, "namesrv")?;
        let handler = Rc::new(RoleHandler {
            shard: shard.clone(),
            namesrv_port: true,
        });
        runtime::spawn_detached(server::serve_listener(
            listener,
            handler,
            config.connection_limits,
            gate.clone(),
            config.tls.clone(),
        ));
        listening.push(format!("namesrv {addr}"));
    }
    if shard.broker.is_some() {
        let port = config.shard_port(shard_id);
        // The HA port (RocketMQ's haListenPort, by default the broker port + 1): slaves connect to it.
        if let Some(broker) = &shard.broker {
            let addr = broker
                .ha
                .config
                .listen_address(SocketAddr::from((ip, port)));
            let listener = bind(addr, "HA")?;
            runtime::spawn_detached(crate::ha::master::serve(listener, broker.clone()));
            listening.push(format!("HA {addr}"));
        }
        // The main port, and port − 2: the "VIP" channel of Java clients older than 4.5.1.
        for (port, what) in [(port, "broker"), (port - 2, "broker-vip")] {
            let addr = SocketAddr::from((ip, port));
            let listener = bind(addr, what)?;
            let handler = Rc::new(RoleHandler {
                shard: shard.clone(),
                namesrv_port: false,
            });
            runtime::spawn_detached(server::serve_listener(
                listener,
                handler,
                config.connection_limits,
                gate.clone(),
                config.tls.clone(),
            ));
            listening.push(format!("{what} {addr}"));
        }
    }
    if let (Some(board), Some(broker)) = (&config.metrics, &shard.broker) {
        runtime::spawn_detached(crate::metrics::publish_every_second(
            broker.clone(),
            board.clone(),
            shard_id,
            gate.clone(),
        ));
        if shard_id == 0 {
            let addr = SocketAddr::from((ip, config.metrics_port));
            match bind(addr, "metrics") {
                Ok(listener) => {
                    let console = crate::console::Console::new(console_access(config), board);
                    runtime::spawn_detached(crate::metrics::http::serve(
                        listener,
                        board.clone(),
                        config.tls.clone(),
                        console,
                    ));
                    listening.push(format!("metrics http://{addr}/metrics, console /"));
                }
                // The brokers run on without it (another node on this host may hold 5557).
                Err(error) => log::warn!("no Prometheus endpoint: {error}"),
            }
        }
    }
    runtime::spawn_detached(server::trim_memory());
    log::info!("shard {shard_id} listening on {}", listening.join(", "));
    Ok(())
}

/// How the web console reaches this node: its namesrv, signed and over TLS as its own
/// brokers reach it.
fn console_access(config: &NodeConfig) -> crate::console::Access {
    let namesrv: Vec<String> = config.namesrv_addrs.iter().map(|a| a.to_string()).collect();
    crate::console::Access {
        namesrv: namesrv.join(";"),
        credentials: config.inner_credentials.clone(),
        tls: config.namesrv_tls.clone(),
        write_enabled: config.console_write,
    }
}

fn bind(addr: SocketAddr, what: &str) -> std::io::Result<shards::runtime::TcpListener> {
    named(runtime::bind(addr), addr, what)
}

/// A bind's result, its error naming the port's role.
fn named<T>(bound: std::io::Result<T>, addr: SocketAddr, what: &str) -> std::io::Result<T> {
    bound.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen for {what} on {addr}: {e}"))
    })
}

fn start_broker_tasks(
    config: &NodeConfig,
    broker: &Rc<Broker>,
    shard_count: usize,
    local_table: Option<(Rc<RefCell<RouteTable>>, Rc<shards::sync::Event>)>,
) {
    broker.start_persisters();
    broker.start_stats_sampling();
    let namesrv_addrs = config.namesrv_addrs.clone();
    // A shard counts as ready once its broker is registered and, when this node also runs
    // the namesrv, once its own route replica lists every shard: clients that ask any
    // replica after "ready" see the whole node.
    let on_ready = move || {
        runtime::spawn_detached(async move {
            if let Some((table, changed)) = local_table {
                let all_listed = || {
                    table
                        .borrow()
                        .route(crate::broker::topics::AUTO_CREATE_TOPIC_KEY_TOPIC)
                        .is_some_and(|route| route.broker_datas.len() >= shard_count)
                };
                while !all_listed() {
                    changed.wait().await;
                }
            }
            if SHARDS_READY.fetch_add(1, Ordering::SeqCst) + 1 == shard_count {
                log::info!("ready ({shard_count} shard(s) registered with the namesrv)");
            }
        });
    };
    runtime::spawn_detached(registration::run(broker.clone(), namesrv_addrs, on_ready));
    if broker.ha.is_slave() {
        runtime::spawn_detached(crate::ha::slave::run(broker.clone()));
        runtime::spawn_detached(crate::ha::metadata::run(broker.clone()));
        if broker.identity.broker_name.ends_with("-0") {
            let (namesrvs, base) = (config.namesrv_addrs.clone(), config.broker_name.clone());
            runtime::spawn_detached(crate::ha::metadata::check_shard_count(
                broker.clone(),
                namesrvs,
                base,
                shard_count,
            ));
        }
    }
    runtime::spawn_detached(broker.clone().run_schedule());
    let every = |broker: &Rc<Broker>, period_ms: u64, work: fn(&Broker)| {
        let broker = broker.clone();
        runtime::spawn_detached(async move {
            loop {
                runtime::sleep(Duration::from_millis(period_ms)).await;
                work(&broker);
            }
        });
    };
    every(broker, broker::OFFSET_FLUSH_INTERVAL_MS, |b| {
        b.offsets.borrow_mut().flush_if_dirty()
    });
    every(broker, broker::CLIENT_SCAN_INTERVAL_MS, |b| {
        b.expire_clients(b.now_ms())
    });
    // The shard's ticking task: the long-poll wheel's clock and the overload gauge.
    runtime::spawn_detached(broker.clone().run_ticking());
    runtime::spawn_detached(broker.clone().run_retention());
    runtime::spawn_detached(broker::tasks::transaction_checks::run_checks(
        broker.clone(),
    ));
}

async fn expire_brokers(table: Rc<RefCell<RouteTable>>) {
    loop {
        runtime::sleep(Duration::from_millis(BROKER_EXPIRY_SCAN_INTERVAL_MS)).await;
        for addr in table.borrow_mut().expire(now_ms()) {
            log::warn!("namesrv: broker {addr} expired (no registration for 120 s)");
        }
    }
}

async fn shut_down_broker(config: &NodeConfig, broker: &Rc<Broker>) {
    let mut namesrvs: Vec<_> = config
        .namesrv_addrs
        .iter()
        .map(|a| registration::NamesrvConnection::new(*a, broker.namesrv_tls.clone()))
        .collect();
    broker.unregister_from_all(&mut namesrvs).await;
    broker.persist_tables().await;
    broker.persist_transactions().await;
    if let Err(error) = broker.store.close().await {
        log::warn!(
            "{}: final flush failed: {error}",
            broker.identity.broker_name
        );
        return;
    }
    // Last, once every re-put message is durable: a restart neither loses nor repeats.
    broker.flush_schedule_progress().await;
}
