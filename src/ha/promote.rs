//! Promotion by hand: a slave shard becomes the master of its broker name.
//!
//! RocketMQ's operators do it by restarting the slave with brokerId 0 and a master role;
//! shardmq takes the same keys live, through UPDATE_BROKER_CONFIG (`brokerRole`, `brokerId`;
//! `shardmq admin promote` sends them after saying what may be lost). The shard stops its
//! stream from the old master, keeps its log's end as its epoch start (`epoch.rs`, saved
//! before anything changes), saves the role in `config/broker.properties` (so a restart keeps
//! it master), and registers at once as brokerId 0: the namesrv replaces the slave's entry
//! with the master's, clients send to it, and delay delivery and transaction checks resume
//! on it (they run on masters only).
//!
//! The old master coming back as a master is refused by the namesrv while the promoted one
//! lives (another live master holds the name and id); it then refuses writes too
//! (`replaced`), rather than take messages no consumer will be routed to. It comes back as
//! a slave: its bytes past the epoch start are checked (`epoch::divergence`).

use crate::broker::Broker;
use crate::ha::epoch::Epoch;
use crate::ha::BrokerRole;

impl Broker {
    /// The role change UPDATE_BROKER_CONFIG asks for: None when it asks none (or the role
    /// it has), else the master role a slave takes; what cannot change live is refused.
    pub(crate) fn role_change(
        &self,
        role: Option<BrokerRole>,
        broker_id: Option<u64>,
    ) -> Result<Option<BrokerRole>, String> {
        let ha = &self.ha;
        let (role, broker_id) = (
            role.unwrap_or(ha.role()),
            broker_id.unwrap_or(ha.broker_id()),
        );
        if (role, broker_id) == (ha.role(), ha.broker_id()) {
            return Ok(None);
        }
        match (ha.role(), role) {
            (_, BrokerRole::Slave) => Err(format!(
                "{} is {}: a master becomes a slave only by a restart with brokerRole=SLAVE and \
                 a brokerId > 0 (its log is then checked against its new master's)",
                self.identity.broker_name,
                ha.role().name()
            )),
            (_, _) if broker_id != 0 => Err(format!(
                "brokerRole {} with brokerId {broker_id}: a master's brokerId is 0",
                role.name()
            )),
            (BrokerRole::Slave, master) => Ok(Some(master)),
            // ASYNC_MASTER <-> SYNC_MASTER: the answers of sends change from now on.
            (_, master) => Ok(Some(master)),
        }
    }

    /// Takes the master role (after the epoch and the role are saved).
    pub(crate) fn take_role(&self, role: BrokerRole, epoch: Epoch) {
        let ha = &self.ha;
        let was = ha.role();
        ha.set_role(role, 0);
        ha.halted.set(false);
        if was != BrokerRole::Slave {
            return log::info!(
                "{}: brokerRole {} → {}",
                self.identity.broker_name,
                was.name(),
                role.name()
            );
        }
        ha.epoch.set(epoch);
        ha.master.connected.set(false);
        *ha.master.fell_behind.borrow_mut() = None;
        *ha.master.diverged.borrow_mut() = None;
        ha.master.local_commits.borrow_mut().clear();
        self.registration.everything();
        log::warn!(
            "{}: promoted from SLAVE to {} (brokerId 0); its log ends at {} (epoch {epoch}); \
             bring the old master back only as a SLAVE",
            self.identity.broker_name,
            role.name(),
            epoch.start_offset
        );
    }

    /// What a namesrv's answer to this shard's registration says of its role: a master
    /// refused because another live master holds its name is replaced, and takes no writes
    /// until a namesrv accepts it again.
    pub(crate) fn note_registration_answer(&self, code: i32, remark: Option<&str>) {
        use crate::remoting::response_code;
        let ha = &self.ha;
        if ha.is_slave() {
            return;
        }
        let name = &self.identity.broker_name;
        match (code, remark) {
            (response_code::SUCCESS, _) if ha.replaced.borrow().is_some() => {
                *ha.replaced.borrow_mut() = None;
                log::warn!("{name}: the namesrv takes this master again; writes resume");
            }
            (response_code::NO_PERMISSION, Some(remark)) if remark.contains(" id 0 is ") => {
                if ha.replaced.borrow().is_none() {
                    log::error!(
                        "{name}: another master holds this broker name ({remark}); this node \
                         takes no writes. Was its slave promoted? Restart this node as a \
                         SLAVE (brokerRole=SLAVE, brokerId=1)"
                    );
                }
                *ha.replaced.borrow_mut() = Some(remark.to_string());
            }
            _ => {}
        }
    }

    /// Reads this master's epoch file at start. After an unclean stop a master begins a new
    /// epoch where its recovered log ends (`epoch_after_an_unclean_stop`).
    pub(crate) fn load_epoch(&self) {
        let path = super::epoch::master_epoch_path(&self.identity.shard_dir);
        match Epoch::load(&path) {
            Ok(Some(epoch)) if !self.ha.is_slave() => self.ha.epoch.set(epoch),
            Ok(_) => {}
            Err(why) => log::error!("{}: {why}", self.identity.broker_name),
        }
        if let Some(epoch) = self.epoch_after_an_unclean_stop() {
            match epoch.save(&path) {
                Ok(()) => self.ha.epoch.set(epoch),
                Err(error) => log::error!(
                    "{}: cannot save epoch {epoch} to {}: {error}; a slave holding bytes past \
                     {} that this master lost is not told",
                    self.identity.broker_name,
                    path.display(),
                    epoch.start_offset
                ),
            }
        }
    }

    /// The epoch a master begins after an unclean stop, at the end of its recovered log. The
    /// HA stream sends what a master appended, written or not: after a kill -9 (the last
    /// appends still in memory) or a power loss its log may end before bytes a slave already
    /// holds, and the records it writes next take their offsets. Streamed from its end, the
    /// slave would keep the lost tail and miss those records (and its reports would
    /// acknowledge them to SYNC_MASTER). With the master's log its own from here on, a slave
    /// past this offset finds that it diverged (`epoch::divergence`) before it connects.
    /// None for a slave, after a clean stop, and for an empty log (an epoch at 0 is none).
    fn epoch_after_an_unclean_stop(&self) -> Option<Epoch> {
        if self.ha.is_slave() {
            return None;
        }
        let recovered = self.store.config().progress.recovered.get()?;
        let end = self.store.max_physical_offset().0;
        (!recovered.clean && end > 0).then(|| Epoch {
            start_offset: end,
            promoted_at_ms: crate::error::now_ms().max(0) as u64,
        })
    }
}
