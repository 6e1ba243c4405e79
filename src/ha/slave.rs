//! The slave side of a shard's HA stream (RocketMQ's DefaultHAClient): connects to the
//! master shard's HA address, reports its commitlog max offset at start, after every applied
//! transfer and every haSendHeartbeatInterval, and appends what the master streams at the
//! same physical offsets (`Store::append_replicated`, which dispatches into consume queues and
//! index as recovery does). Transfers are not cut at record boundaries: the bytes of a record
//! that has not wholly arrived wait in `pending` for the next transfer.
//!
//! A master that pushes another offset than this slave's end ends the session, as RocketMQ's
//! "master pushed offset not equal the max phy offset in slave"; an empty slave instead moves
//! its store's start to where the master begins (`Store::start_empty_at`). A master whose log
//! starts past this slave's end is logged and shown in brokerStatus (`slaveFallBehindMuch`):
//! replication cannot close that gap; with haResetWhenBehind the slave discards its store and
//! continues empty from the master's offset (`Store::reset_empty_at`).
//!
//! Before each connection a slave holding bytes checks they are its master's
//! (`epoch::divergence`): an old master brought back as the slave of its promoted slave does
//! not stream the new log behind its own.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shards::runtime::{self, TcpStream};

use super::epoch::Epoch;
use super::TRANSFER_HEADER_BYTES;
use crate::broker::registration::NamesrvConnection;
use crate::broker::Broker;

/// Pause before connecting again after a session ended or a connect failed (RocketMQ's
/// HAClient waits 5 s; a shorter wait loses less time after a master restart).
const RECONNECT_MS: u64 = 1_000;

/// How long a slave shard waits to learn its master before it says so.
const NO_MASTER_WARN_MS: u64 = 30_000;

/// Wait before appending again when the store has no space ready (or the disk is full).
const SPACE_RETRY_MS: u64 = 20;

/// Bytes one read takes from the socket.
const READ_CHUNK_BYTES: usize = 256 * 1024;

/// Wait before checking the master's epoch again when it could not be checked or differs.
const EPOCH_RETRY_MS: u64 = 5_000;

/// Why replication does not start now.
enum NotYet {
    /// The master's epoch could not be learned (its broker port does not answer, or is not
    /// known yet): tried again.
    Unknown(String),
    /// This slave's log is another's past the master's epoch start.
    Diverged(String),
}

/// Whether this slave's log may continue its master's (`epoch::divergence`); with
/// haResetWhenBehind a log that may not is discarded, the store continuing empty at the
/// master's oldest offset. Records the master's epoch once it may.
async fn check_epoch(
    broker: &Rc<Broker>,
    connection: &mut Option<NamesrvConnection>,
) -> Result<(), NotYet> {
    let store = &broker.store;
    let empty = store.max_physical_offset().0 == store.min_physical_offset().0;
    let master = *broker.ha.master.broker_address.borrow();
    let Some(master) = master else {
        // Its epoch is asked at its broker port, known from the namesrv.
        return match empty {
            true => Ok(()),
            false => Err(NotYet::Unknown(
                "the master's broker address is not known yet (from the namesrv's answer): \
                 its epoch cannot be checked"
                    .into(),
            )),
        };
    };
    if connection.as_ref().is_none_or(|c| c.addr != master) {
        *connection = Some(NamesrvConnection::new(master, broker.namesrv_tls.clone()));
    }
    let connection = connection.as_mut().expect("set above");
    let info = super::metadata::master_runtime(broker, connection)
        .await
        .map_err(|why| {
            NotYet::Unknown(format!(
                "cannot ask the master {master} for its epoch: {why}"
            ))
        })?;
    // A RocketMQ master shows no epoch: it was never promoted by shardmq.
    let epoch = info
        .get("haEpoch")
        .and_then(|text| Epoch::parse(text))
        .unwrap_or_default();
    let shard_dir = &broker.identity.shard_dir;
    let copied_path = super::epoch::copied_epoch_path(shard_dir);
    let copied = Epoch::load(&copied_path).map_err(NotYet::Unknown)?;
    let end = store.max_physical_offset().0;
    if let Some(why) = super::epoch::divergence(end, copied, epoch) {
        if !broker.ha.config.reset_when_behind {
            return Err(NotYet::Diverged(why));
        }
        let min: u64 = info
            .get("commitLogMinOffset")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let segment = store.config().segment_size_bytes;
        let start = min - min % segment;
        log::warn!(
            "{}: {why}. haResetWhenBehind: discarding this shard's store (its log [{}, {end})) \
             to copy the master's from {start}",
            broker.identity.broker_name,
            store.min_physical_offset().0
        );
        discard_store(broker, start)
            .await
            .map_err(NotYet::Unknown)?;
    }
    if copied != Some(epoch) {
        runtime::blocking(move || epoch.save(&copied_path))
            .await
            .map_err(|error| {
                NotYet::Unknown(format!("cannot record the master's epoch {epoch}: {error}"))
            })?;
    }
    Ok(())
}

/// Discards everything the store holds; it continues empty at `offset` (a segment start).
async fn discard_store(broker: &Broker, offset: u64) -> Result<(), String> {
    broker
        .store
        .reset_empty_at(offset)
        .await
        .map_err(|error| format!("cannot discard the store to start at {offset}: {error}"))
}

/// Replicates from the master for as long as this shard is a slave.
pub async fn run(broker: Rc<Broker>) {
    let name = broker.identity.broker_name.clone();
    let mut failures = 0u64;
    let mut waited_ms = 0u64;
    let mut epoch_connection = None;
    while broker.ha.is_slave() {
        let address = *broker.ha.master.ha_address.borrow();
        let Some(address) = address else {
            waited_ms += RECONNECT_MS;
            if waited_ms == NO_MASTER_WARN_MS {
                log::warn!(
                    "{name}: no master known after {} s: the namesrv lists no brokerId 0 of \
                     this name (is the master node up, with as many shards as this one?), \
                     and no haMasterAddress was given",
                    NO_MASTER_WARN_MS / 1000
                );
            }
            runtime::sleep(Duration::from_millis(RECONNECT_MS)).await;
            continue;
        };
        match check_epoch(&broker, &mut epoch_connection).await {
            Ok(()) => *broker.ha.master.diverged.borrow_mut() = None,
            Err(NotYet::Diverged(why)) => {
                if broker.ha.master.diverged.borrow().as_deref() != Some(why.as_str()) {
                    log::error!("{name}: replication from {address} does not start: {why}");
                }
                *broker.ha.master.diverged.borrow_mut() = Some(why);
                runtime::sleep(Duration::from_millis(EPOCH_RETRY_MS)).await;
                continue;
            }
            Err(NotYet::Unknown(why)) => {
                failures += 1;
                // As for connections: one line at the first failure, then one a minute.
                if failures == 1 || failures.is_multiple_of(60) {
                    log::warn!("{name}: replication from {address} waits: {why}");
                }
                runtime::sleep(Duration::from_millis(RECONNECT_MS)).await;
                continue;
            }
        }
        match runtime::connect(address).await {
            Ok(stream) => {
                failures = 0;
                let _ = stream.set_nodelay(true);
                log::info!("{name}: connected to master {address} for replication");
                broker.ha.master.connected.set(true);
                let ended = session(stream, &broker).await;
                broker.ha.master.connected.set(false);
                log::warn!("{name}: replication from {address} stopped: {ended}");
            }
            Err(error) => {
                failures += 1;
                // One line at the first failure, then one a minute.
                if failures == 1 || failures.is_multiple_of(60) {
                    log::warn!(
                        "{name}: cannot connect to master {address} for replication: {error} \
                         ({failures} attempt(s))"
                    );
                }
            }
        }
        runtime::sleep(Duration::from_millis(RECONNECT_MS)).await;
    }
}

/// One connection to the master; returns why it ended.
async fn session(stream: TcpStream, broker: &Rc<Broker>) -> String {
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let store = &broker.store;
    let config = &broker.ha.config;
    let heartbeat = Duration::from_millis(config.heartbeat_interval_ms);
    let silence_ms = config.housekeeping_interval_ms;
    let mut reported = store.max_physical_offset().0;
    if let Err(error) = writer.write_all(&reported.to_be_bytes()).await {
        return error.to_string();
    }
    let mut last_report = std::time::Instant::now();
    let mut last_read = std::time::Instant::now();
    let mut received: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    // Bytes of the master's log past this slave's end, not yet a whole record.
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        if !broker.ha.replicating() {
            return "this shard is being promoted to master".into();
        }
        let read = runtime::timeout(heartbeat, reader.read(&mut chunk)).await;
        match read {
            None => {}
            Some(Err(error)) => return error.to_string(),
            Some(Ok(0)) => return "closed by the master".into(),
            Some(Ok(read)) => {
                received.extend_from_slice(&chunk[..read]);
                last_read = std::time::Instant::now();
            }
        }
        if last_read.elapsed().as_millis() as u64 > silence_ms {
            return format!("nothing from the master for {silence_ms} ms");
        }
        // Every whole transfer in `received`.
        let mut at = 0;
        while received.len() - at >= TRANSFER_HEADER_BYTES {
            let header = &received[at..at + TRANSFER_HEADER_BYTES];
            let offset = u64::from_be_bytes(header[..8].try_into().expect("8 bytes"));
            let size = u32::from_be_bytes(header[8..].try_into().expect("4 bytes")) as usize;
            if received.len() - at < TRANSFER_HEADER_BYTES + size {
                break;
            }
            let body = &received[at + TRANSFER_HEADER_BYTES..at + TRANSFER_HEADER_BYTES + size];
            at += TRANSFER_HEADER_BYTES + size;
            broker.ha.master.master_offset.set(offset + size as u64);
            if size == 0 {
                continue; // a heartbeat
            }
            if let Err(why) = accept_transfer(broker, offset, body, &mut pending).await {
                return why;
            }
            broker
                .ha
                .master
                .last_transfer_ms
                .set(runtime::monotonic_ms());
            let ha = &broker.ha;
            ha.bytes_transferred
                .set(ha.bytes_transferred.get() + size as u64);
        }
        received.drain(..at);
        let max = store.max_physical_offset().0;
        if max != reported || last_report.elapsed() >= heartbeat {
            if let Err(error) = writer.write_all(&max.to_be_bytes()).await {
                return error.to_string();
            }
            reported = max;
            last_report = std::time::Instant::now();
        }
    }
}

/// Appends one transfer (`body`, starting at the master's `offset`) behind what `pending`
/// already holds; whole records go to the store, the rest waits in `pending`.
async fn accept_transfer(
    broker: &Broker,
    offset: u64,
    body: &[u8],
    pending: &mut Vec<u8>,
) -> Result<(), String> {
    let store = &broker.store;
    let end = store.max_physical_offset().0;
    let expected = end + pending.len() as u64;
    if offset != expected {
        let empty = end == 0 && store.min_physical_offset().0 == 0 && pending.is_empty();
        let segment = store.config().segment_size_bytes;
        if empty && offset.is_multiple_of(segment) {
            store
                .start_empty_at(offset)
                .await
                .map_err(|error| format!("cannot start the empty store at {offset}: {error}"))?;
            log::info!(
                "{}: empty store starts at the master's offset {offset}",
                broker.identity.broker_name
            );
        } else if offset > expected
            && broker.ha.config.reset_when_behind
            && offset.is_multiple_of(segment)
        {
            log::warn!(
                "{}: master pushed offset {offset}, this slave's log ends at {expected}: the \
                 master no longer holds the bytes between. haResetWhenBehind: discarding this \
                 shard's store to copy the master's from {offset}",
                broker.identity.broker_name
            );
            pending.clear();
            discard_store(broker, offset).await?;
        } else {
            let why = format!("master pushed offset {offset}, this slave's log ends at {expected}");
            if offset > expected {
                let note = format!(
                    "{why}: the master no longer holds this slave's next bytes (its log \
                     starts later); replication cannot close the gap — start this slave with \
                     an empty store, set haResetWhenBehind, or promote it (shardmq admin \
                     promote) if its data is needed"
                );
                log::error!("{}: {note}", broker.identity.broker_name);
                *broker.ha.master.fell_behind.borrow_mut() = Some(note);
            }
            return Err(why);
        }
    }
    *broker.ha.master.fell_behind.borrow_mut() = None;
    pending.extend_from_slice(body);
    loop {
        if !broker.ha.replicating() {
            return Err("this shard is being promoted to master".into());
        }
        let at = store.max_physical_offset().0;
        match store.append_replicated(at, pending) {
            Ok(0) => return Ok(()),
            Ok(consumed) => {
                pending.drain(..consumed);
                if pending.is_empty() {
                    return Ok(());
                }
            }
            Err(shards::store::StoreError::Busy { .. }) => {
                // The disk is behind: wait for room (the master waits on the socket).
                store.room().await;
            }
            Err(shards::store::StoreError::SpaceNotReady { .. })
            | Err(shards::store::StoreError::DiskFull { .. }) => {
                // The flusher allocates (or space returns); `room` would not wait for that.
                runtime::sleep(Duration::from_millis(SPACE_RETRY_MS)).await;
            }
            Err(error) => return Err(format!("cannot append the master's bytes at {at}: {error}")),
        }
    }
}
