//! The `shardmq` command: `serve` (namesrv + broker on every shard, the embedded default),
//! `namesrv` and `broker` (the roles apart), and `admin` (the operator's tool, see
//! `shardmq::admin`).

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use shardmq::node::{self, NodeConfig};
use shards::runtime::ShardPlacement;
use shards::store::FlushMode;

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
    /// Administration against shardmq or any RocketMQ name server (like mqadmin).
    Admin(shardmq::admin::AdminArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Flush {
    Sync,
    Async,
}

#[derive(Args)]
struct ShardArgs {
    /// Number of shards (one pinned core each); default: all online cores.
    #[arg(long)]
    shards: Option<usize>,
    /// Comma-separated CPU ids to pin shards to (overrides --shards).
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
    /// sync: acknowledge a send after the fdatasync that covers it; async: after append.
    #[arg(long, value_enum, default_value = "async")]
    flush: Flush,
    /// Async flush: longest time between an append and its flush.
    #[arg(long, default_value_t = 200)]
    flush_interval_ms: u64,
    /// Commitlog segment size in MiB.
    #[arg(long, default_value_t = 1024)]
    segment_size_mib: u64,
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
    /// TEST ONLY (fault injection): every commitlog flush first waits this long, as a slow
    /// disk would. Hidden: never for production.
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
    /// Namesrv address(es), `host:port[;host:port]`.
    #[arg(long)]
    namesrv: String,
}

fn placement(args: &ShardArgs) -> anyhow::Result<ShardPlacement> {
    if !args.cpus.is_empty() {
        let online = shards::runtime::online_cpus();
        if let Some(missing) = args.cpus.iter().find(|cpu| !online.contains(cpu)) {
            bail!("--cpus names CPU {missing}, which is not online (online: {online:?})");
        }
        let mut placement = ShardPlacement::first_cpus(args.cpus.len());
        placement.cpus = args.cpus.iter().map(|cpu| Some(*cpu)).collect();
        return Ok(placement);
    }
    let count = args
        .shards
        .unwrap_or_else(|| shards::runtime::online_cpus().len());
    if !(1..=256).contains(&count) {
        bail!("--shards must be between 1 and 256, got {count}");
    }
    Ok(ShardPlacement::first_cpus(count))
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

fn base_config(shard: &ShardArgs) -> anyhow::Result<NodeConfig> {
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
        placement: placement(shard)?,
        flush_mode: FlushMode::Async,
        flush_interval_ms: 200,
        segment_size_bytes: 1 << 30,
        delay_levels: Default::default(),
        test_flush_delay_ms: None,
        transaction: Default::default(),
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
    if !(1..=16 * 1024).contains(&options.segment_size_mib) {
        bail!("--segment-size-mib must be between 1 and 16384");
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
    config.flush_mode = match options.flush {
        Flush::Sync => FlushMode::Sync,
        Flush::Async => FlushMode::Async,
    };
    config.flush_interval_ms = options.flush_interval_ms.clamp(1, 60_000);
    config.segment_size_bytes = options.segment_size_mib << 20;
    config.delay_levels =
        shardmq::broker::schedule::DelayLevels::parse(&options.message_delay_level)
            .map_err(|e| anyhow::anyhow!("--message-delay-level: {e}"))?;
    config.test_flush_delay_ms = options.test_only_flush_delay_ms;
    if options.transaction_check_interval_ms == 0 {
        bail!("--transaction-check-interval-ms must be positive");
    }
    config.transaction = shardmq::broker::transaction::TransactionConfig {
        timeout_ms: options.transaction_timeout_ms,
        check_interval_ms: options.transaction_check_interval_ms,
        check_max: options.transaction_check_max,
    };
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = match cli.command {
        Command::Admin(args) => std::process::exit(shardmq::admin::run(args)),
        Command::Serve(args) => {
            let mut config = base_config(&args.shard)?;
            apply_broker_options(&mut config, &args.broker)?;
            config.run_namesrv = true;
            config.namesrv_port = args.namesrv_port;
            let local = if config.listen_ip.is_unspecified() {
                Ipv4Addr::LOCALHOST
            } else {
                config.listen_ip
            };
            config.namesrv_addrs = vec![SocketAddr::from((local, args.namesrv_port))];
            config
        }
        Command::Namesrv(args) => {
            let mut config = base_config(&args.shard)?;
            config.run_namesrv = true;
            config.namesrv_port = args.namesrv_port;
            config
        }
        Command::Broker(args) => {
            let mut config = base_config(&args.shard)?;
            apply_broker_options(&mut config, &args.broker)?;
            config.namesrv_addrs = parse_namesrv_list(&args.namesrv)?;
            config
        }
    };
    println!(
        "shardmq {}: {} shard(s), data in {}",
        env!("CARGO_PKG_VERSION"),
        config.placement.cpus.len(),
        config.data_dir.display()
    );
    node::run(config)
}
