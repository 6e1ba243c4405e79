//! The `shardmq` command: `serve` (namesrv + broker on every shard, the embedded default),
//! `namesrv` and `broker` (the roles apart), `tune` (inspect the host for a tuning profile)
//! and `admin` (the operator's tool, see `shardmq::admin`).
//!
//! Every role runs under a tuning profile (`--profile NAME|PATH`, default `default`; see
//! `tuning/`); the flags below that a user gives explicitly override the profile's knobs.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use provenance::Provenance;
use shardmq::node::{self, NodeConfig};
use shardmq::tuning::{self, host, Overrides, Profile, Tuning};
use shards::store::FlushMode;

mod provenance;

#[derive(Parser)]
#[command(
    name = "shardmq",
    version,
    about = "A thread-per-core broker that speaks RocketMQ's remoting protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Namesrv and broker in one process, one broker endpoint per shard.
    Serve(ServeArgs),
    /// Only the namesrv role (route table replicated on every shard).
    Namesrv(NamesrvArgs),
    /// Only the broker role, registering with the given namesrv(s).
    Broker(BrokerArgs),
    /// Inspect this host for a tuning profile and say what would change and why; change
    /// nothing unless --apply is given.
    Tune(TuneArgs),
    /// Administration against shardmq or any RocketMQ name server (like mqadmin).
    Admin(shardmq::admin::AdminArgs),
    /// Check a stopped node's stores offline (records, consume queues, index, config files);
    /// exit status 1 when damage is found.
    Verify(shardmq::verify::VerifyArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Flush {
    Sync,
    Async,
}

#[derive(Args)]
struct ShardArgs {
    /// Read RocketMQ's property file (broker.conf, namesrv.properties) with RocketMQ's key
    /// names; flags given here win over it.
    #[arg(short = 'c', long = "config-file")]
    config_file: Option<PathBuf>,
    /// Print the resolved settings and where each came from (default, profile, file, flag),
    /// then exit without starting.
    #[arg(long)]
    print_config: bool,
    /// Tuning profile: a built-in name (default, small-vm, throughput, latency,
    /// dedicated-16) or the path of a TOML file; flags given here override its knobs.
    #[arg(long, default_value = tuning::DEFAULT_PROFILE)]
    profile: String,
    /// Number of shards (one pinned core each; more shards than cores float); overrides
    /// the profile's shards.cpus.
    #[arg(long)]
    shards: Option<usize>,
    /// Comma-separated CPU ids to pin shards to (overrides --shards and shards.cpus).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Leave shards unpinned (let the kernel place them): for hosts shared with other busy
    /// processes, such as test machines running several nodes at once.
    #[arg(long)]
    no_pin: bool,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    listen_ip: Ipv4Addr,
    /// Where data and config live.
    #[arg(long, default_value = "shardmq-data")]
    data_dir: PathBuf,
    /// What is logged: error, warn, info, debug (refusals of requests) or trace.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Write the log to DIR/shardmq.log, rotated at 64 MiB (4 old files kept), instead of
    /// standard output.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Turn ACL on (RocketMQ's aclEnable) with this plain_acl.yml: every request to the
    /// broker must be signed by an account it lists and have the permission it needs;
    /// namesrv writes need an admin account. Re-read within a second when it changes.
    #[arg(long)]
    acl_file: Option<PathBuf>,
    /// TLS on every port (RocketMQ's tls.server.mode): permissive serves TLS and plaintext
    /// on the same port (told apart by the first byte), enforcing refuses plaintext.
    #[arg(long, value_enum, default_value = "permissive")]
    tls_server_mode: shardmq::tls::TlsMode,
    /// PEM certificate chain of the server (tls.server.certPath).
    #[arg(long)]
    tls_server_cert_path: Option<PathBuf>,
    /// PEM private key of that certificate (tls.server.keyPath).
    #[arg(long)]
    tls_server_key_path: Option<PathBuf>,
    /// Ask clients for a certificate (tls.server.need.client.auth): none, optional, require.
    #[arg(long, value_enum, default_value = "none")]
    tls_server_need_client_auth: shardmq::tls::ClientAuth,
    /// PEM CA certificates client certificates must chain to (tls.server.trustCertPath).
    #[arg(long)]
    tls_server_trust_cert_path: Option<PathBuf>,
    /// With no certificate given, make a self-signed one at start (tls.test.mode.enable),
    /// written to <data-dir>/tls/test-cert.pem.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    tls_test_mode_enable: bool,
}

impl ShardArgs {
    fn tls_options(&self) -> shardmq::tls::TlsOptions {
        shardmq::tls::TlsOptions {
            mode: self.tls_server_mode,
            cert_path: self.tls_server_cert_path.clone(),
            key_path: self.tls_server_key_path.clone(),
            need_client_auth: self.tls_server_need_client_auth,
            trust_cert_path: self.tls_server_trust_cert_path.clone(),
            test_mode: self.tls_test_mode_enable,
        }
    }
}

#[derive(Args)]
struct BrokerOptions {
    /// Port of shard 0's broker endpoint; shard i uses broker_port + 10·i (and that − 2).
    #[arg(long, default_value_t = 10911)]
    broker_port: u16,
    /// Gap between the ports of consecutive shards.
    #[arg(long, default_value_t = 10)]
    port_stride: u16,
    /// The address advertised to clients (RocketMQ's brokerIP1); default: the listen address,
    /// or 127.0.0.1 when listening on 0.0.0.0.
    #[arg(long)]
    broker_ip: Option<Ipv4Addr>,
    #[arg(long, default_value = "DefaultCluster")]
    cluster_name: String,
    /// Base broker name; shard i registers as <name>-<i>.
    #[arg(long, default_value = "broker")]
    broker_name: String,
    /// sync: acknowledge a send after the fdatasync that covers it; async: after append
    /// (overrides the profile's store.flush; default async).
    #[arg(long, value_enum)]
    flush: Option<Flush>,
    /// Async flush: longest time between an append and its flush (overrides
    /// store.flush_interval_ms; default 200).
    #[arg(long)]
    flush_interval_ms: Option<u64>,
    /// Commitlog segment size in MiB (overrides store.segment_size_mib; default 1024).
    #[arg(long)]
    segment_size_mib: Option<u64>,
    /// Segment space kept allocated ahead of the writes, in MiB (overrides
    /// store.allocation_window_mib; default 128, at least 64).
    #[arg(long)]
    allocation_window_mib: Option<u64>,
    /// Delay of each delay level, level 1 first (RocketMQ's messageDelayLevel); units ms, s,
    /// m, h, d.
    #[arg(long, default_value = shardmq::broker::schedule::DELAY_LEVELS_DEFAULT)]
    message_delay_level: String,
    /// Transactions: a half message this old without an end gets checked with its producer
    /// (RocketMQ's transactionTimeOut).
    #[arg(long, default_value_t = 6_000)]
    transaction_timeout_ms: u64,
    /// Transactions: how often undecided half messages are checked
    /// (transactionCheckInterval).
    #[arg(long, default_value_t = 30_000)]
    transaction_check_interval_ms: u64,
    /// Transactions: checks of one half message before it is discarded (transactionCheckMax).
    #[arg(long, default_value_t = 15)]
    transaction_check_max: u32,
    /// Retention: hours a commitlog segment is kept after its last write (RocketMQ's
    /// fileReservedTime; fractions allowed).
    #[arg(long = "fileReservedTime", default_value_t = 72.0)]
    file_reserved_time: f64,
    /// Retention: hours of the day when expired segments are deleted, `;`-separated
    /// (deleteWhen).
    #[arg(long = "deleteWhen", default_value = "04")]
    delete_when: String,
    /// Retention: disk used % above which expired segments go at any hour
    /// (diskMaxUsedSpaceRatio; 10..=95).
    #[arg(long = "diskMaxUsedSpaceRatio", default_value_t = 75)]
    disk_max_used_space_ratio: u32,
    /// Retention: disk used % above which the oldest segments go even when not expired
    /// (diskSpaceCleanForciblyRatio; 30..=98).
    #[arg(long = "diskSpaceCleanForciblyRatio", default_value_t = 85)]
    disk_space_clean_forcibly_ratio: u32,
    /// Disk used % above which sends are refused until space returns
    /// (diskSpaceWarningLevelRatio; 35..=99).
    #[arg(long = "diskSpaceWarningLevelRatio", default_value_t = 90)]
    disk_space_warning_level_ratio: u32,
    /// Retention: whether unexpired segments may go past diskSpaceCleanForciblyRatio
    /// (cleanFileForciblyEnable).
    #[arg(long = "cleanFileForciblyEnable", default_value_t = true, action = clap::ArgAction::Set)]
    clean_file_forcibly_enable: bool,
    /// Retention: ms between two retention passes (cleanResourceInterval).
    #[arg(long = "cleanResourceInterval", default_value_t = 10_000)]
    clean_resource_interval: u64,
    /// Retention: ms between two segment deletions of one pass
    /// (deleteCommitLogFilesInterval).
    #[arg(long = "deleteCommitLogFilesInterval", default_value_t = 100)]
    delete_commit_log_files_interval: u64,
    /// Retention: a master whose disk is below diskMaxUsedSpaceRatio gives an expired
    /// segment's file to a later segment instead of removing it (durable writes over written
    /// blocks are cheaper). false: expired segments are removed, and at start the recycled
    /// files found are made plain again (broker.conf segmentRecycleEnable).
    #[arg(long = "segment-recycle-enable", default_value_t = true, action = clap::ArgAction::Set)]
    segment_recycle_enable: bool,
    /// AccessKey the brokers sign their namesrv requests with (RocketMQ 5's
    /// innerClientAuthenticationCredentials); with --acl-file and no key given, the first
    /// admin account of that file (by accessKey) is used.
    #[arg(long, requires = "inner_secret_key")]
    inner_access_key: Option<String>,
    /// SecretKey of --inner-access-key.
    #[arg(long, requires = "inner_access_key")]
    inner_secret_key: Option<String>,
    /// Port of the Prometheus endpoint (GET /metrics, RocketMQ 5's metricsPromExporterPort),
    /// on --listen-ip; 0 turns it off. A port already taken is logged and left out.
    #[arg(long, default_value_t = 5557)]
    metrics_port: u16,
    /// Whether a send may create its topic from TBW102 (RocketMQ's autoCreateTopicEnable).
    #[arg(long = "autoCreateTopicEnable", default_value_t = true, action = clap::ArgAction::Set)]
    auto_create_topic_enable: bool,
    /// Queues of TBW102, the most a topic created by a send gets (defaultTopicQueueNums).
    #[arg(long = "defaultTopicQueueNums", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    default_topic_queue_nums: u32,
    /// Let the web console on the metrics port create topics and subscription groups
    /// (without it the console is read-only and refuses POSTs with 403).
    #[arg(long)]
    console_write: bool,
    /// The brokers speak TLS to the namesrv (RocketMQ's tls.enable); on by itself for
    /// `serve --tls-server-mode enforcing`.
    #[arg(long)]
    tls_enable: bool,
    /// Verify the namesrv's certificate against these PEM CA certificates
    /// (tls.client.trustCertPath; without it any certificate is taken, as RocketMQ does).
    #[arg(long)]
    tls_client_trust_cert_path: Option<PathBuf>,
    /// Certificate the brokers present to a namesrv that asks for one (tls.client.certPath).
    #[arg(long, requires = "tls_client_key_path")]
    tls_client_cert_path: Option<PathBuf>,
    /// Key of --tls-client-cert-path (tls.client.keyPath).
    #[arg(long, requires = "tls_client_cert_path")]
    tls_client_key_path: Option<PathBuf>,
    /// Replication role of every shard (RocketMQ's brokerRole): ASYNC_MASTER, SYNC_MASTER
    /// (a send is answered once the slave has it) or SLAVE (shard i copies shard i of its
    /// master node and serves reads).
    #[arg(long = "brokerRole", visible_alias = "broker-role", default_value = "ASYNC_MASTER",
          value_parser = parse_broker_role)]
    broker_role: shardmq::ha::BrokerRole,
    /// 0 for a master, > 0 for a slave (RocketMQ's brokerId).
    #[arg(long = "brokerId", visible_alias = "broker-id", default_value_t = 0)]
    broker_id: u64,
    /// A slave's master: the HA address (host:port) of the master node's shard 0 (its broker
    /// port + 1); shard i adds --port-stride × i. Without it a slave learns its master from
    /// the namesrv (RocketMQ's haMasterAddress).
    #[arg(long = "haMasterAddress", visible_alias = "ha-master-address")]
    ha_master_address: Option<String>,
    /// Shard 0's HA port, where its slaves connect (haListenPort); shard i adds --port-stride
    /// × i. Default: each shard's broker port + 1, RocketMQ's default.
    #[arg(long = "haListenPort", visible_alias = "ha-listen-port")]
    ha_listen_port: Option<u16>,
    /// ms between a slave's offset reports and an idle master's heartbeats
    /// (haSendHeartbeatInterval).
    #[arg(long = "haSendHeartbeatInterval", default_value_t = 5_000)]
    ha_send_heartbeat_interval: u64,
    /// ms of silence after which either side of an HA connection closes it
    /// (haHousekeepingInterval).
    #[arg(long = "haHousekeepingInterval", default_value_t = 20_000)]
    ha_housekeeping_interval: u64,
    /// Most bytes one HA transfer carries (haTransferBatchSize; larger is allowed and
    /// catches up faster).
    #[arg(long = "haTransferBatchSize", default_value_t = 32 * 1024)]
    ha_transfer_batch_size: usize,
    /// A slave further behind than this many bytes does not count for SYNC_MASTER
    /// (haMaxGapNotInSync, 4.x haSlaveFallbehindMax).
    #[arg(long = "haMaxGapNotInSync", default_value_t = 256 << 20)]
    ha_max_gap_not_in_sync: u64,
    /// How long a SYNC_MASTER send waits for the slave before FLUSH_SLAVE_TIMEOUT
    /// (slaveTimeout), ms.
    #[arg(long = "slaveTimeout", default_value_t = 3_000)]
    slave_timeout: u64,
    /// The master suggests the slave (suggestWhichBrokerId 1) for pulls of data no longer in
    /// memory (slaveReadEnable).
    #[arg(long = "slaveReadEnable", default_value_t = false, action = clap::ArgAction::Set)]
    slave_read_enable: bool,
    /// Where a slave with an empty store starts: newest (the master's newest segment, as
    /// RocketMQ) or oldest (everything the master still holds).
    #[arg(long = "ha-start-from", default_value = "newest", value_parser = ["newest", "oldest"])]
    ha_start_from: String,
    /// A slave whose log cannot continue its master's (it fell behind the master's retained
    /// range, or holds bytes the master never had: an old master after a promotion)
    /// discards its store and copies the master's from its oldest segment; without it the
    /// slave says so and does not replicate (broker.conf haResetWhenBehind).
    #[arg(long = "ha-reset-when-behind", default_value_t = false, action = clap::ArgAction::Set)]
    ha_reset_when_behind: bool,
    /// TEST ONLY (fault injection): every commitlog flush first waits this long, as a slow
    /// disk would. Hidden, and only in builds with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_only_flush_delay_ms: Option<u64>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    broker: BrokerOptions,
    #[arg(long, default_value_t = 9876)]
    namesrv_port: u16,
}

#[derive(Args)]
struct NamesrvArgs {
    #[command(flatten)]
    shard: ShardArgs,
    #[arg(long, default_value_t = 9876)]
    namesrv_port: u16,
}

#[derive(Args)]
struct BrokerArgs {
    #[command(flatten)]
    shard: ShardArgs,
    #[command(flatten)]
    broker: BrokerOptions,
    /// Namesrv address(es), `host:port[;host:port]` (or namesrvAddr in the -c file).
    #[arg(long)]
    namesrv: Option<String>,
}

#[derive(Args)]
struct TuneArgs {
    /// The profile the host is checked for (a built-in name or a TOML file).
    #[arg(long, default_value = tuning::DEFAULT_PROFILE)]
    profile: String,
    /// Where the data will live: its disk's scheduler and write cache are checked.
    #[arg(long, default_value = "shardmq-data")]
    data_dir: PathBuf,
    /// Make the changes marked [change] (needs root; each write is reported).
    #[arg(long)]
    apply: bool,
}

/// The profile with the explicit flags applied, checked against this host's online CPUs.
fn tuning(shard: &ShardArgs, broker: Option<&BrokerOptions>) -> anyhow::Result<Tuning> {
    let mut profile = Profile::load(&shard.profile)?;
    let mut overrides = Overrides {
        shards: shard.shards,
        cpus: (!shard.cpus.is_empty()).then(|| shard.cpus.clone()),
        no_pin: shard.no_pin,
        ..Overrides::default()
    };
    if let Some(broker) = broker {
        overrides.flush = broker.flush.map(|flush| match flush {
            Flush::Sync => FlushMode::Sync,
            Flush::Async => FlushMode::Async,
        });
        overrides.flush_interval_ms = broker.flush_interval_ms;
        overrides.segment_size_mib = broker.segment_size_mib;
        overrides.allocation_window_mib = broker.allocation_window_mib;
    }
    profile.apply(&overrides);
    Ok(profile.resolve(&shards::runtime::online_cpus())?)
}

fn parse_broker_role(text: &str) -> Result<shardmq::ha::BrokerRole, String> {
    shardmq::ha::BrokerRole::parse(text)
}

fn parse_namesrv_list(text: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addrs = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let addr = part
            .to_socket_addrs()
            .with_context(|| format!("bad namesrv address {part:?} (want host:port)"))?
            .next()
            .with_context(|| format!("namesrv address {part:?} resolves to nothing"))?;
        addrs.push(addr);
    }
    if addrs.is_empty() {
        bail!("--namesrv needs at least one host:port");
    }
    Ok(addrs)
}

fn base_config(shard: &ShardArgs, broker: Option<&BrokerOptions>) -> anyhow::Result<NodeConfig> {
    let tuning = tuning(shard, broker)?;
    Ok(NodeConfig {
        run_namesrv: false,
        run_broker: false,
        data_dir: shard.data_dir.clone(),
        listen_ip: shard.listen_ip,
        broker_ip: shard.listen_ip,
        namesrv_port: 9876,
        broker_port: 10911,
        port_stride: 10,
        namesrv_addrs: Vec::new(),
        cluster_name: "DefaultCluster".into(),
        broker_name: "broker".into(),
        profile: tuning.source,
        placement: tuning.placement,
        flush_mode: tuning.flush_mode,
        flush_interval_ms: tuning.flush_interval_ms,
        flush_dirty_max_bytes: tuning.flush_dirty_max_bytes,
        segment_size_bytes: tuning.segment_size_bytes,
        allocation_window_bytes: tuning.allocation_window_bytes,
        read_cache_windows: tuning.read_cache_windows,
        store_open_stall_ms: tuning.store_open_stall_ms,
        connection_limits: tuning.connection_limits,
        delay_levels: Default::default(),
        test_flush_delay_ms: None,
        transaction: Default::default(),
        retention: Default::default(),
        acl: shard
            .acl_file
            .as_deref()
            .map(shardmq::acl::AclSource::open)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        inner_credentials: None,
        tls: None,
        namesrv_tls: None,
        metrics_port: 0,
        metrics: None,
        auto_create: Default::default(),
        console_write: false,
        ha: Default::default(),
    })
}

fn apply_broker_options(config: &mut NodeConfig, options: &BrokerOptions) -> anyhow::Result<()> {
    if options.broker_port < 2 || options.port_stride < 3 {
        bail!("--broker-port must be at least 2 and --port-stride at least 3");
    }
    let last_port = u32::from(options.broker_port)
        + u32::from(options.port_stride) * (config.placement.cpus.len() as u32 - 1);
    if last_port > u32::from(u16::MAX) {
        bail!(
            "--broker-port {} with {} shards runs past port 65535",
            options.broker_port,
            config.placement.cpus.len()
        );
    }
    config.run_broker = true;
    config.broker_port = options.broker_port;
    config.port_stride = options.port_stride;
    config.broker_ip = options
        .broker_ip
        .unwrap_or(if config.listen_ip.is_unspecified() {
            Ipv4Addr::LOCALHOST
        } else {
            config.listen_ip
        });
    config.cluster_name = options.cluster_name.clone();
    config.broker_name = options.broker_name.clone();
    config.delay_levels =
        shardmq::broker::schedule::DelayLevels::parse(&options.message_delay_level)
            .map_err(|e| anyhow::anyhow!("--message-delay-level: {e}"))?;
    #[cfg(feature = "fault-injection")]
    {
        config.test_flush_delay_ms = options.test_only_flush_delay_ms;
    }
    if options.transaction_check_interval_ms == 0 {
        bail!("--transaction-check-interval-ms must be positive");
    }
    config.transaction = shardmq::broker::transaction::TransactionConfig {
        timeout_ms: options.transaction_timeout_ms,
        check_interval_ms: options.transaction_check_interval_ms,
        check_max: options.transaction_check_max,
    };
    config.retention = shards::store::RetentionConfig {
        file_reserved_time_hours: options.file_reserved_time,
        delete_when_hours: shards::store::parse_delete_when(&options.delete_when)
            .map_err(|e| anyhow::anyhow!("--deleteWhen: {e}"))?,
        disk_max_used_space_ratio: options.disk_max_used_space_ratio,
        disk_space_clean_forcibly_ratio: options.disk_space_clean_forcibly_ratio,
        disk_space_warning_level_ratio: options.disk_space_warning_level_ratio,
        clean_file_forcibly_enable: options.clean_file_forcibly_enable,
        clean_resource_interval_ms: options.clean_resource_interval,
        delete_commit_log_files_interval_ms: options.delete_commit_log_files_interval,
        segment_recycle_enable: options.segment_recycle_enable,
    };
    config
        .retention
        .validate()
        .map_err(|e| anyhow::anyhow!("retention: {e}"))?;
    if options.tls_enable {
        config.namesrv_tls = Some(namesrv_tls(options)?);
    }
    config.metrics_port = options.metrics_port;
    config.auto_create = shardmq::broker::topics::AutoCreate {
        enable: options.auto_create_topic_enable,
        default_topic_queue_nums: options.default_topic_queue_nums,
    };
    config.console_write = options.console_write;
    config.ha = shardmq::ha::HaConfig {
        role: options.broker_role,
        broker_id: options.broker_id,
        master_address: options
            .ha_master_address
            .as_deref()
            .map(|text| {
                text.to_socket_addrs()
                    .ok()
                    .and_then(|mut addrs| addrs.next())
                    .with_context(|| format!("--haMasterAddress {text:?}: want host:port"))
            })
            .transpose()?,
        listen_port: options.ha_listen_port,
        heartbeat_interval_ms: options.ha_send_heartbeat_interval,
        housekeeping_interval_ms: options.ha_housekeeping_interval,
        transfer_batch_bytes: options.ha_transfer_batch_size,
        max_gap_bytes: options.ha_max_gap_not_in_sync,
        slave_timeout_ms: options.slave_timeout,
        slave_read_enable: options.slave_read_enable,
        start_from: match options.ha_start_from.as_str() {
            "oldest" => shardmq::ha::StartFrom::Oldest,
            _ => shardmq::ha::StartFrom::Newest,
        },
        reset_when_behind: options.ha_reset_when_behind,
    };
    config.ha.validate().map_err(anyhow::Error::msg)?;
    config.inner_credentials = match (&options.inner_access_key, &options.inner_secret_key) {
        (Some(access_key), Some(secret_key)) => Some(
            shardmq::remoting::signature::Credentials::new(access_key, secret_key),
        ),
        _ => config.acl.as_ref().and_then(|acl| {
            let rules = acl.rules();
            let admin = rules.first_admin()?;
            log::info!(
                "brokers sign their namesrv requests as admin account {} of the ACL file",
                admin.access_key
            );
            Some(shardmq::remoting::signature::Credentials::new(
                &admin.access_key,
                &admin.secret_key,
            ))
        }),
    };
    Ok(())
}

/// The brokers' TLS towards the namesrv.
fn namesrv_tls(options: &BrokerOptions) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    let client = shardmq_client::TlsOptions {
        trust_cert_path: options.tls_client_trust_cert_path.clone(),
        client_cert: options
            .tls_client_cert_path
            .clone()
            .zip(options.tls_client_key_path.clone()),
    };
    client
        .client_config()
        .map_err(|e| anyhow::anyhow!("TLS towards the namesrv: {e}"))
}

/// `shardmq tune`: print the findings; with --apply make the safe changes and report each.
fn tune(args: &TuneArgs) -> anyhow::Result<()> {
    let profile = Profile::load(&args.profile)?;
    let tuning = profile.resolve(&shards::runtime::online_cpus())?;
    let host = host::Host::real();
    let findings = host::inspect(
        &host,
        host::ProcessFacts::of_this_process(),
        &tuning,
        &args.data_dir,
    );
    println!(
        "shardmq tune: this host, for profile {} ({}), data dir {}",
        tuning.source,
        profile.description,
        args.data_dir.display()
    );
    print!("{}", host::render(&findings));
    let changes = findings
        .iter()
        .filter(|finding| finding.verdict == host::Verdict::Change)
        .count();
    let manual = findings
        .iter()
        .filter(|finding| finding.verdict == host::Verdict::Manual)
        .count();
    if !args.apply {
        println!(
            "{changes} change(s) suggested, {manual} for the operator; nothing applied \
             (`shardmq tune --apply` makes the [change] ones, as root)"
        );
        return Ok(());
    }
    let applied = host::apply(&host, &findings);
    let failed = applied.iter().filter(|a| a.result.is_err()).count();
    for outcome in &applied {
        match &outcome.result {
            Ok(()) => println!("applied: {} = {}", outcome.write.path, outcome.write.value),
            Err(error) => println!(
                "failed:  {} = {}: {error}",
                outcome.write.path, outcome.write.value
            ),
        }
    }
    println!(
        "{} write(s) applied, {failed} failed; {manual} finding(s) left for the operator \
         (changes last until reboot)",
        applied.len() - failed
    );
    if failed > 0 {
        bail!("{failed} change(s) could not be applied (see above)");
    }
    Ok(())
}

/// `--print-config`: every setting, its value and where it came from; the profile's knobs
/// that no flag or file set show what the profile resolved to on this host.
fn render_provenance(provenance: &Provenance, config: &NodeConfig) -> String {
    let profile = |flag: &str| -> Option<String> {
        Some(match flag {
            "shards" => config.placement.cpus.len().to_string(),
            "cpus" => config
                .placement
                .cpus
                .iter()
                .map(|cpu| cpu.map_or("floating".to_string(), |cpu| cpu.to_string()))
                .collect::<Vec<_>>()
                .join(","),
            "flush" => format!("{:?}", config.flush_mode).to_lowercase(),
            "flush-interval-ms" => config.flush_interval_ms.to_string(),
            "segment-size-mib" => (config.segment_size_bytes >> 20).to_string(),
            "allocation-window-mib" => (config.allocation_window_bytes >> 20).to_string(),
            _ => return None,
        })
    };
    let mut out = format!("# shardmq settings (profile {})\n", config.profile);
    for row in &provenance.rows {
        let (value, source) = match (&row.value, profile(&row.flag)) {
            (Some(value), _) => (value.clone(), row.source.clone()),
            (None, Some(value)) => (value, format!("profile {}", config.profile)),
            (None, None) => ("(not set)".to_string(), String::new()),
        };
        out.push_str(&format!("--{:<32} {:<32} {source}\n", row.flag, value));
    }
    if let Some(file) = &provenance.file {
        for ignored in &file.ignored {
            out.push_str(&format!(
                "# {}:{}: {} ignored: {}\n",
                file.path.display(),
                ignored.line,
                ignored.key,
                ignored.reason
            ));
        }
    }
    out
}

/// Errors end the process with status 1 and one line: the chain of causes, no backtrace.
fn main() -> std::process::ExitCode {
    let (cli, provenance) = match provenance::parse::<Cli>(std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(provenance::Failure::Clap(error)) => error.exit(),
        Err(provenance::Failure::File(error)) => {
            eprintln!("shardmq: error: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match run(cli, provenance) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shardmq: error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, provenance: Provenance) -> anyhow::Result<()> {
    let shard_args = match &cli.command {
        Command::Serve(args) => Some(&args.shard),
        Command::Namesrv(args) => Some(&args.shard),
        Command::Broker(args) => Some(&args.shard),
        Command::Tune(_) | Command::Admin(_) | Command::Verify(_) => None,
    };
    let print_config = shard_args.is_some_and(|shard| shard.print_config);
    if let Some(shard) = shard_args.filter(|_| !print_config) {
        shardmq::logging::init(&shard.log_level, shard.log_dir.as_deref())?;
    }
    if let Some(file) = &provenance.file {
        for ignored in &file.ignored {
            log::info!(
                "{}:{}: {} ignored: {}",
                file.path.display(),
                ignored.line,
                ignored.key,
                ignored.reason
            );
        }
    }
    let tls_options = shard_args.map(ShardArgs::tls_options);
    let mut config = match cli.command {
        Command::Admin(args) => std::process::exit(shardmq::admin::run(args)),
        Command::Verify(args) => std::process::exit(shardmq::verify::run(&args)),
        Command::Serve(args) => {
            let mut config = base_config(&args.shard, Some(&args.broker))?;
            apply_broker_options(&mut config, &args.broker)?;
            config.run_namesrv = true;
            config.namesrv_port = args.namesrv_port;
            let local = if config.listen_ip.is_unspecified() {
                Ipv4Addr::LOCALHOST
            } else {
                config.listen_ip
            };
            config.namesrv_addrs = vec![SocketAddr::from((local, args.namesrv_port))];
            // The node's own brokers reach its namesrv over TLS when plaintext is refused.
            if args.shard.tls_server_mode == shardmq::tls::TlsMode::Enforcing
                && config.namesrv_tls.is_none()
            {
                config.namesrv_tls = Some(namesrv_tls(&args.broker)?);
            }
            if config.acl.is_some() && config.inner_credentials.is_none() {
                bail!(
                    "with --acl-file this node's namesrv takes registrations only from an admin \
                     account: list one in the file (admin: true) or give --inner-access-key \
                     and --inner-secret-key"
                );
            }
            config
        }
        Command::Namesrv(args) => {
            let mut config = base_config(&args.shard, None)?;
            config.run_namesrv = true;
            config.namesrv_port = args.namesrv_port;
            config
        }
        Command::Broker(args) => {
            let mut config = base_config(&args.shard, Some(&args.broker))?;
            apply_broker_options(&mut config, &args.broker)?;
            let namesrv = args.namesrv.as_deref().context(
                "the broker needs its name server: --namesrv host:port, or namesrvAddr in the \
                 -c file",
            )?;
            config.namesrv_addrs = parse_namesrv_list(namesrv)?;
            config
        }
        Command::Tune(args) => return tune(&args),
    };
    if print_config {
        print!("{}", render_provenance(&provenance, &config));
        return Ok(());
    }
    if let Some(options) = &tls_options {
        let names = [config.broker_ip.to_string(), config.listen_ip.to_string()];
        config.tls =
            shardmq::tls::server(options, &names, &config.data_dir).map_err(anyhow::Error::msg)?;
    }
    log::info!(
        "shardmq {}: {} shard(s), profile {}, data in {}",
        env!("CARGO_PKG_VERSION"),
        config.placement.cpus.len(),
        config.profile,
        config.data_dir.display()
    );
    node::run(config)
}
