//! Master/slave replication per shard, with RocketMQ's classic HA protocol
//! (CAPABILITIES.md §2.2; RocketMQ's DefaultHAService, HAConnection, HAClient).
//!
//! Shard i of a slave node replicates shard i of its master node: the same broker name
//! `<brokerName>-<i>`, brokerId 1. On the wire a shard is one RocketMQ broker with its slave:
//! the slave connects to the master shard's HA port (its broker port + 1) and reports its
//! commitlog max offset (8 bytes, big-endian) at start, after every applied batch and every
//! heartbeat interval; the master streams `[offset u64][size u32][raw commitlog bytes]` from
//! the reported offset (`master.rs`), the slave appends those bytes at the same physical
//! offsets and dispatches them into its consume queues and index as recovery does
//! (`slave.rs`, `Store::append_replicated`), so offsets and offset msgIds mean the same on
//! both. SYNC_MASTER sends wait for the slave's reported offset (`sync.rs`).
//!
//! Everything runs on the shard's own core, through the runtime's io_uring, like the rest of
//! the shard: the master's stream reads what the store already holds (the tail in memory,
//! older bytes with DMA reads) and adds no work to the produce path but a wake-up.

pub mod epoch;
pub mod master;
pub mod metadata;
pub mod promote;
pub mod slave;
pub mod sync;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;

use shards::sync::Event;

/// RocketMQ's brokerRole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerRole {
    AsyncMaster,
    SyncMaster,
    Slave,
}

impl BrokerRole {
    /// RocketMQ's name (`ASYNC_MASTER`, …).
    pub fn name(self) -> &'static str {
        match self {
            BrokerRole::AsyncMaster => "ASYNC_MASTER",
            BrokerRole::SyncMaster => "SYNC_MASTER",
            BrokerRole::Slave => "SLAVE",
        }
    }

    pub fn parse(text: &str) -> Result<BrokerRole, String> {
        match text {
            "ASYNC_MASTER" => Ok(BrokerRole::AsyncMaster),
            "SYNC_MASTER" => Ok(BrokerRole::SyncMaster),
            "SLAVE" => Ok(BrokerRole::Slave),
            other => Err(format!(
                "{other:?} is not a broker role (ASYNC_MASTER, SYNC_MASTER or SLAVE)"
            )),
        }
    }
}

/// Where a slave with an empty store starts copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The beginning of the master's newest commitlog segment, as RocketMQ does (a slave
    /// reporting offset 0).
    Newest,
    /// The master's oldest retained segment: the slave gets everything the master still has
    /// (shardmq's option).
    Oldest,
}

/// RocketMQ's HA settings (MessageStoreConfig), with its defaults.
#[derive(Debug, Clone)]
pub struct HaConfig {
    pub role: BrokerRole,
    /// brokerId: 0 for a master, > 0 for a slave.
    pub broker_id: u64,
    /// haMasterAddress: the master node's shard 0 HA address (shard i adds the port stride
    /// times i); none: learned from the namesrv's answer to REGISTER_BROKER.
    pub master_address: Option<SocketAddr>,
    /// haListenPort: this shard's HA port (the node's flag is shard 0's, shard i adds the port
    /// stride times i); none: its broker port + 1, RocketMQ's default.
    pub listen_port: Option<u16>,
    /// haSendHeartbeatInterval.
    pub heartbeat_interval_ms: u64,
    /// haHousekeepingInterval: either side closes after this long without hearing the other.
    pub housekeeping_interval_ms: u64,
    /// haTransferBatchSize: the most bytes one transfer carries.
    pub transfer_batch_bytes: usize,
    /// haMaxGapNotInSync: a slave further behind does not count for SYNC_MASTER.
    pub max_gap_bytes: u64,
    /// slaveTimeout: how long a SYNC_MASTER send waits for the slave.
    pub slave_timeout_ms: u64,
    /// slaveReadEnable: the master suggests the slave for pulls of cold data.
    pub slave_read_enable: bool,
    pub start_from: StartFrom,
    /// A slave whose log cannot continue its master's (it fell behind the master's retained
    /// range, or holds bytes past the master's epoch start that the master never had)
    /// discards its store and copies again from the master's oldest segment (shardmq's
    /// haResetWhenBehind; off: it says so and waits for the operator).
    pub reset_when_behind: bool,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            role: BrokerRole::AsyncMaster,
            broker_id: 0,
            master_address: None,
            listen_port: None,
            heartbeat_interval_ms: 5_000,
            housekeeping_interval_ms: 20_000,
            transfer_batch_bytes: 32 * 1024,
            max_gap_bytes: 256 << 20,
            slave_timeout_ms: 3_000,
            slave_read_enable: false,
            start_from: StartFrom::Newest,
            reset_when_behind: false,
        }
    }
}

impl HaConfig {
    /// The checks RocketMQ's BrokerStartup makes, and ours.
    pub fn validate(&self) -> Result<(), String> {
        match self.role {
            BrokerRole::Slave if self.broker_id == 0 => {
                Err("Slave's brokerId must be > 0 (--broker-id, brokerId)".into())
            }
            BrokerRole::AsyncMaster | BrokerRole::SyncMaster if self.broker_id != 0 => {
                Err(format!(
                    "brokerId {} with brokerRole {}: a master's brokerId is 0",
                    self.broker_id,
                    self.role.name()
                ))
            }
            _ if self.transfer_batch_bytes < 4096 => {
                Err("haTransferBatchSize must be at least 4096 bytes".into())
            }
            _ if self.heartbeat_interval_ms == 0 || self.housekeeping_interval_ms == 0 => {
                Err("haSendHeartbeatInterval and haHousekeepingInterval must be positive".into())
            }
            _ => Ok(()),
        }
    }
}

/// One slave connected to this master shard.
pub struct SlaveLink {
    pub peer: SocketAddr,
    /// The offset the slave reported last: every byte below it is on the slave.
    pub ack_offset: Cell<u64>,
    /// Told of each report.
    pub reported: Event,
    /// (log end, ms) noted every 10 ms past what the slave has (`master::sample_growth`);
    /// the first is when the slave's first missing byte had arrived.
    pub grown: RefCell<std::collections::VecDeque<(u64, u64)>>,
}

/// Most growth samples a link keeps (10 minutes at one per 10 ms); older ones go first, so a
/// slave further behind in time shows at least this long.
pub const GROWTH_SAMPLES_MAX: usize = 60_000;

impl SlaveLink {
    /// How long ago the first byte this slave lacks arrived (0 when it has everything).
    pub fn lag_ms(&self, max_offset: u64, now_ms: u64) -> u64 {
        if self.ack_offset.get() >= max_offset {
            return 0;
        }
        let grown = self.grown.borrow();
        match grown.front() {
            Some(&(_, at)) => now_ms.saturating_sub(at),
            // Arrived since the last sample: less than a sample period ago.
            None => 0,
        }
    }
}

/// What a slave shard knows of its master and its link to it.
#[derive(Default)]
pub struct MasterView {
    /// The master's HA address (haMasterAddress, or the namesrv's answer).
    pub ha_address: RefCell<Option<SocketAddr>>,
    /// The master's broker address (for the metadata it copies: topics, offsets, groups).
    pub broker_address: RefCell<Option<SocketAddr>>,
    pub connected: Cell<bool>,
    /// The offset in the master's last transfer header (its stream position).
    pub master_offset: Cell<u64>,
    /// When (ms) the last bytes arrived.
    pub last_transfer_ms: Cell<u64>,
    /// The master's log starts past this slave's end: the slave cannot catch up by
    /// replication (RocketMQ's #3388); set from the offset the master sent.
    pub fell_behind: RefCell<Option<String>>,
    /// The master node runs another number of shards (`metadata::check_shard_count`).
    pub shard_mismatch: RefCell<Option<String>>,
    /// This slave's log goes past the master's epoch start with bytes of another epoch
    /// (`epoch::check`): replication would mix two logs, so it does not run.
    pub diverged: RefCell<Option<String>>,
    /// The master's brokerRole and commitlog end as its last GET_BROKER_RUNTIME_INFO said
    /// (copied with the metadata): what a promotion may lose.
    pub last_runtime: RefCell<Option<(String, u64, u64)>>,
    /// Offsets clients committed to this slave (its master away), by (group, topic,
    /// queue): kept over the master's older ones and handed back to it when it returns.
    pub local_commits: RefCell<std::collections::BTreeMap<(String, String, u32), i64>>,
}

/// One shard's replication state (on the broker).
pub struct HaState {
    pub config: HaConfig,
    /// brokerRole and brokerId now: the configured ones until a promotion
    /// (`promote.rs`) makes a slave its broker name's master.
    role: Cell<BrokerRole>,
    broker_id: Cell<u64>,
    /// A promotion under way: the slave's stream appends nothing more.
    pub halted: Cell<bool>,
    /// Where this master's own log begins (`epoch.rs`).
    pub epoch: Cell<epoch::Epoch>,
    /// The namesrv refused this master's registration because another live master holds its
    /// broker name (a slave promoted while this one was away): writes are refused.
    pub replaced: RefCell<Option<String>>,
    /// Master side: the slaves connected now.
    pub slaves: RefCell<Vec<Rc<SlaveLink>>>,
    /// Told whenever the log grows (the store's arrival listener): wakes idle streams.
    pub log_grew: Rc<Event>,
    /// Told whenever a slave reports: wakes SYNC_MASTER answers.
    pub acked: Event,
    /// Bytes sent to slaves, and received from the master, since start
    /// (haTransferredByteInSecond is sampled from it).
    pub bytes_transferred: Cell<u64>,
    /// (bytes_transferred at the last sample, bytes in the second before it).
    rate: Cell<(u64, u64)>,
    /// Slave side.
    pub master: MasterView,
    /// SYNC_MASTER answers waiting for the slave.
    pub sync_replies: Rc<sync::SlaveReplies>,
}

impl HaState {
    pub fn new(config: HaConfig) -> HaState {
        HaState {
            master: MasterView {
                ha_address: RefCell::new(config.master_address),
                ..MasterView::default()
            },
            role: Cell::new(config.role),
            broker_id: Cell::new(config.broker_id),
            halted: Cell::new(false),
            epoch: Cell::new(epoch::Epoch::default()),
            replaced: RefCell::new(None),
            config,
            slaves: RefCell::default(),
            log_grew: Rc::default(),
            acked: Event::default(),
            bytes_transferred: Cell::new(0),
            rate: Cell::new((0, 0)),
            sync_replies: Rc::default(),
        }
    }

    pub fn role(&self) -> BrokerRole {
        self.role.get()
    }

    pub fn is_slave(&self) -> bool {
        self.role.get() == BrokerRole::Slave
    }

    /// brokerId as registered.
    pub fn broker_id(&self) -> u64 {
        self.broker_id.get()
    }

    /// The slave's stream may append: it is a slave and no promotion is under way.
    pub fn replicating(&self) -> bool {
        self.is_slave() && !self.halted.get()
    }

    /// Takes brokerRole and brokerId (a promotion, or the saved one at start).
    pub fn set_role(&self, role: BrokerRole, broker_id: u64) {
        self.role.set(role);
        self.broker_id.set(broker_id);
    }

    /// The highest offset any connected slave has reported (RocketMQ's push2SlaveMaxOffset).
    pub fn slave_ack_offset(&self) -> Option<u64> {
        let slaves = self.slaves.borrow();
        slaves.iter().map(|s| s.ack_offset.get()).max()
    }

    /// RocketMQ's isSlaveOK: a slave is connected and less than haMaxGapNotInSync behind.
    pub fn slave_in_sync(&self, max_offset: u64) -> bool {
        self.slave_ack_offset()
            .is_some_and(|ack| max_offset.saturating_sub(ack) < self.config.max_gap_bytes)
    }
}

impl HaState {
    /// Once a second: haTransferredByteInSecond.
    pub fn sample_transfer_rate(&self) {
        let now = self.bytes_transferred.get();
        let (before, _) = self.rate.get();
        self.rate.set((now, now - before));
    }

    /// The replication figures of GET_BROKER_RUNTIME_INFO (brokerStatus): the role, the
    /// link's state, how far the slave is (bytes, ms), the transfer rate.
    pub fn runtime_info(&self, max_offset: u64) -> Vec<(&'static str, String)> {
        let now = shards::runtime::monotonic_ms();
        let mut info = vec![
            ("brokerRole", self.role().name().to_string()),
            ("brokerId", self.broker_id().to_string()),
            ("haTransferredByteInSecond", self.rate.get().1.to_string()),
        ];
        if !self.is_slave() {
            info.push(("haEpoch", self.epoch.get().to_string()));
            let replaced = self.replaced.borrow().clone().unwrap_or_default();
            info.push(("haReplacedBy", replaced));
        }
        if self.is_slave() {
            let master = &self.master;
            let state = if master.connected.get() {
                "CONNECTED"
            } else {
                "DISCONNECTED"
            };
            let address = master
                .ha_address
                .borrow()
                .map_or(String::new(), |a| a.to_string());
            let behind = master.master_offset.get().saturating_sub(max_offset);
            info.extend([
                ("haConnectionState", state.to_string()),
                ("haMasterAddress", address),
                ("haMasterOffset", master.master_offset.get().to_string()),
                ("haReplicationLagBytes", behind.to_string()),
                (
                    "haLastTransferMsAgo",
                    now.saturating_sub(master.last_transfer_ms.get())
                        .to_string(),
                ),
                (
                    "slaveFallBehindMuch",
                    master.fell_behind.borrow().clone().unwrap_or_default(),
                ),
                (
                    "haShardCountMismatch",
                    master.shard_mismatch.borrow().clone().unwrap_or_default(),
                ),
                (
                    "haDiverged",
                    master.diverged.borrow().clone().unwrap_or_default(),
                ),
            ]);
            if let Some((role, end, age)) = master.last_runtime.borrow().clone() {
                info.push(("haMasterRole", role));
                info.push(("haMasterCommitLogMaxOffset", end.to_string()));
                let seen = now.saturating_sub(age);
                info.push(("haMasterSeenMsAgo", seen.to_string()));
            }
        } else {
            let slaves = self.slaves.borrow();
            let ack = self.slave_ack_offset();
            let behind = ack.map_or(0, |ack| max_offset.saturating_sub(ack));
            let lag_ms = slaves
                .iter()
                .map(|s| s.lag_ms(max_offset, now))
                .min()
                .unwrap_or(0);
            let state = match slaves.len() {
                0 => "NO_SLAVE".to_string(),
                n => format!("{n} SLAVE(S) CONNECTED"),
            };
            let peers: Vec<String> = slaves.iter().map(|s| s.peer.to_string()).collect();
            info.extend([
                ("haConnectionState", state),
                ("haSlaves", peers.join(";")),
                ("slaveAckOffset", ack.map_or(-1, |a| a as i64).to_string()),
                ("haReplicationLagBytes", behind.to_string()),
                ("haReplicationLagMs", lag_ms.to_string()),
                ("slaveFallBehindMuch", behind.to_string()),
                ("haSlaveInSync", self.slave_in_sync(max_offset).to_string()),
                ("haSyncWaiting", self.sync_replies.len().to_string()),
                (
                    "haSyncTimeouts",
                    self.sync_replies.timeouts.get().to_string(),
                ),
            ]);
        }
        info
    }
}

/// The HA address of a shard whose broker address is `address`: its port + 1 (RocketMQ's
/// haListenPort default).
pub fn ha_address_of(address: SocketAddr) -> SocketAddr {
    SocketAddr::new(address.ip(), address.port().saturating_add(1))
}

impl HaConfig {
    /// This shard's HA address, for a shard whose broker address is `address`.
    pub fn listen_address(&self, address: SocketAddr) -> SocketAddr {
        match self.listen_port {
            Some(port) => SocketAddr::new(address.ip(), port),
            None => ha_address_of(address),
        }
    }
}

/// The transfer header: `[offset u64][size u32]`, big-endian.
pub const TRANSFER_HEADER_BYTES: usize = 12;

/// The slave's report: `[max offset u64]`, big-endian.
pub const REPORT_BYTES: usize = 8;

pub fn transfer_header(offset: u64, size: u32) -> [u8; TRANSFER_HEADER_BYTES] {
    let mut header = [0u8; TRANSFER_HEADER_BYTES];
    header[..8].copy_from_slice(&offset.to_be_bytes());
    header[8..].copy_from_slice(&size.to_be_bytes());
    header
}

/// The last whole report in `received` (RocketMQ reads the last complete 8-byte word), and
/// how many bytes that leaves unread at the end.
pub fn last_report(received: &[u8]) -> (Option<u64>, usize) {
    let whole = received.len() - received.len() % REPORT_BYTES;
    let report = (whole >= REPORT_BYTES).then(|| {
        let word: [u8; REPORT_BYTES] = received[whole - REPORT_BYTES..whole]
            .try_into()
            .expect("8 bytes");
        u64::from_be_bytes(word)
    });
    (report, received.len() - whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_ids_are_checked_as_broker_startup_does() {
        assert_eq!(BrokerRole::parse("SLAVE"), Ok(BrokerRole::Slave));
        assert!(BrokerRole::parse("slave").is_err());
        let slave = HaConfig {
            role: BrokerRole::Slave,
            ..HaConfig::default()
        };
        assert!(slave.validate().unwrap_err().contains("must be > 0"));
        assert!(HaConfig {
            broker_id: 1,
            ..slave.clone()
        }
        .validate()
        .is_ok());
        assert!(HaConfig {
            broker_id: 2,
            ..HaConfig::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn the_last_whole_report_counts() {
        let mut bytes = 5u64.to_be_bytes().to_vec();
        bytes.extend_from_slice(&77u64.to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 1]);
        assert_eq!(last_report(&bytes), (Some(77), 3));
        assert_eq!(last_report(&bytes[..7]), (None, 7));
        assert_eq!(
            transfer_header(0x0102, 3),
            [0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 3]
        );
    }
}
