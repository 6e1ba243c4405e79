//! The master side of a shard's HA stream (RocketMQ's DefaultHAService.AcceptSocketService
//! and HAConnection): accepts slaves on the shard's HA port; for each, reads its reports
//! (the last whole 8-byte word of what arrived) and streams the commitlog from the offset it
//! first reported, in transfers of at most haTransferBatchSize, with a size-0 transfer as a
//! heartbeat when there is nothing to send. Either side closes after haHousekeepingInterval
//! without hearing the other.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use shards::runtime::{self, TcpListener, TcpStream};

use shards::store::{CommitLogOffset, FlushMode, StoreError};

use super::{last_report, transfer_header, SlaveLink, StartFrom};
use crate::broker::Broker;

/// Wait after a failed accept (descriptors short).
const ACCEPT_RETRY_MS: u64 = 100;

/// Accepts slaves forever.
pub async fn serve(listener: TcpListener, broker: Rc<Broker>) {
    let mut acceptor = listener.acceptor();
    let gate = crate::server::PortGate::new("HA", crate::limits::HA_CONNECTIONS_MAX);
    loop {
        match acceptor.accept().await {
            Ok(stream) => {
                let stream = runtime::stream_of(stream);
                // Refused: closed here, when the stream goes.
                let Some(ticket) = gate.admit(stream.peer_addr().ok()) else {
                    continue;
                };
                let broker = broker.clone();
                runtime::spawn_detached(async move {
                    let _ticket = ticket;
                    serve_slave(stream, broker).await;
                });
            }
            Err(error) => {
                log::warn!("{}: HA accept failed: {error}", broker.identity.broker_name);
                runtime::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
            }
        }
    }
}

async fn serve_slave(stream: TcpStream, broker: Rc<Broker>) {
    let Ok(peer) = stream.peer_addr() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let name = broker.identity.broker_name.clone();
    if broker.ha.is_slave() {
        log::warn!("{name}: HA connection from {peer} refused: this shard is a SLAVE");
        return;
    }
    let (reader, writer) = futures_lite::io::split(stream);
    let link = Rc::new(SlaveLink {
        peer,
        ack_offset: std::cell::Cell::new(0),
        reported: Default::default(),
        grown: Default::default(),
    });
    log::info!("{name}: slave {peer} connected to the HA port");
    let first = std::cell::Cell::new(None::<u64>);
    let outcome = futures_lite::future::or(
        futures_lite::future::or(
            read_reports(reader, &link, &broker, &first),
            write_stream(writer, &link, &broker, &first),
        ),
        sample_growth(&link, &broker),
    )
    .await;
    broker
        .ha
        .slaves
        .borrow_mut()
        .retain(|s| !Rc::ptr_eq(s, &link));
    broker.ha.acked.notify();
    log::warn!(
        "{name}: slave {peer} disconnected ({outcome}); it had {} bytes",
        link.ack_offset.get()
    );
}

/// How often the log's end is noted for the lag in ms.
const GROWTH_SAMPLE_MS: u64 = 10;

/// Notes the log's end every GROWTH_SAMPLE_MS while the slave lacks some of it
/// (`SlaveLink::grown`): what `lag_ms` reads the age of the slave's first missing byte from.
/// Never returns.
async fn sample_growth(link: &SlaveLink, broker: &Broker) -> String {
    loop {
        runtime::sleep(Duration::from_millis(GROWTH_SAMPLE_MS)).await;
        let end = broker.store.max_physical_offset().0;
        let mut grown = link.grown.borrow_mut();
        if end > link.ack_offset.get() && grown.back().is_none_or(|&(last, _)| last < end) {
            if grown.len() == super::GROWTH_SAMPLES_MAX {
                grown.pop_front();
            }
            grown.push_back((end, runtime::monotonic_ms()));
        }
    }
}

/// Reads the slave's reports until the connection ends or falls silent; returns why.
async fn read_reports(
    mut reader: futures_lite::io::ReadHalf<TcpStream>,
    link: &Rc<SlaveLink>,
    broker: &Broker,
    first: &std::cell::Cell<Option<u64>>,
) -> String {
    let silence = Duration::from_millis(broker.ha.config.housekeeping_interval_ms);
    let mut buffer = [0u8; 1024];
    let mut kept = 0usize;
    loop {
        let read = match runtime::timeout(silence, reader.read(&mut buffer[kept..])).await {
            None => return format!("no report for {} ms", silence.as_millis()),
            Some(Err(error)) => return error.to_string(),
            Some(Ok(0)) => return "closed by the slave".into(),
            Some(Ok(read)) => read,
        };
        let filled = kept + read;
        let (report, rest) = last_report(&buffer[..filled]);
        buffer.copy_within(filled - rest..filled, 0);
        kept = rest;
        let Some(offset) = report else { continue };
        let max = broker.store.max_physical_offset().0;
        if offset > max {
            // A report past what this master holds is no slave of its (apache/rocketmq#3015):
            // it must not count as an acknowledgement.
            log::warn!(
                "{}: HA peer {} reported offset {offset} past this master's end {max}; ignored",
                broker.identity.broker_name,
                link.peer
            );
            continue;
        }
        if first.get().is_none() {
            first.set(Some(offset));
            broker.ha.slaves.borrow_mut().push(link.clone());
        }
        link.ack_offset.set(offset);
        let mut grown = link.grown.borrow_mut();
        while grown.front().is_some_and(|&(end, _)| end <= offset) {
            grown.pop_front();
        }
        drop(grown);
        link.reported.notify();
        broker.ha.acked.notify();
    }
}

/// Where the stream starts for a slave whose first report was `reported`.
fn start_offset(broker: &Broker, reported: u64) -> u64 {
    let store = &broker.store;
    let (min, max) = (store.min_physical_offset().0, store.max_physical_offset().0);
    if reported != 0 {
        return reported;
    }
    match broker.ha.config.start_from {
        // RocketMQ: a slave with nothing starts at the master's newest segment.
        StartFrom::Newest => {
            let segment = store.config().segment_size_bytes;
            (max - max % segment).max(min)
        }
        StartFrom::Oldest => min,
    }
}

/// The commitlog bytes from `from` the stream may send now, at most `max_bytes`: only those a
/// crash of this master keeps, so that it never comes back with less than its slave holds
/// (its slave would then refuse to go on: `epoch_after_an_unclean_stop`). Under SYNC_FLUSH
/// those are the durable ones (a power loss takes what was not flushed); under ASYNC_FLUSH the
/// written ones (appends wait in memory up to flushIntervalCommitLog, and a kill -9 takes
/// them), as RocketMQ sends only what it has committed to the file. A SYNC_MASTER send waits
/// for both anyway.
async fn read_sendable(
    broker: &Broker,
    from: u64,
    max_bytes: usize,
) -> Result<Vec<u8>, StoreError> {
    let end = sendable_end(broker);
    if from >= end {
        return Ok(Vec::new());
    }
    broker
        .store
        .read_log(from, max_bytes.min((end - from) as usize))
        .await
}

/// The end of what `read_sendable` may send.
fn sendable_end(broker: &Broker) -> u64 {
    match broker.store.flush_mode() {
        FlushMode::Sync => broker.store.durable_offset().0,
        FlushMode::Async => broker.store.written_offset().0,
    }
}

/// Resolves once the log past `next` may be sent (`read_sendable`): durable under SYNC_FLUSH;
/// written under ASYNC_FLUSH, which the store then does at once rather than within
/// flushIntervalCommitLog (a SYNC_MASTER's sends wait for the slave, and an ASYNC slave stays
/// as close behind as when appends were sent).
async fn sendable(broker: &Broker, next: u64) -> Result<(), StoreError> {
    let past = CommitLogOffset(next + 1);
    match broker.store.flush_mode() {
        FlushMode::Sync => broker.store.wait_durable(past).await,
        FlushMode::Async => broker.store.wait_written(past).await,
    }
}

/// Most transfers one write to the slave carries.
const TRANSFERS_PER_WRITE: usize = 16;

/// `data` (the log from `offset`) as transfers of at most `batch` bytes, each with its header.
fn frame_transfers(offset: u64, data: &[u8], batch: usize) -> Vec<u8> {
    let transfers = data.len().div_ceil(batch);
    let mut framed = Vec::with_capacity(data.len() + transfers * super::TRANSFER_HEADER_BYTES);
    let mut at = offset;
    for chunk in data.chunks(batch) {
        framed.extend_from_slice(&transfer_header(at, chunk.len() as u32));
        framed.extend_from_slice(chunk);
        at += chunk.len() as u64;
    }
    framed
}

/// Streams the commitlog to the slave; returns why it stopped.
async fn write_stream(
    mut writer: futures_lite::io::WriteHalf<TcpStream>,
    link: &Rc<SlaveLink>,
    broker: &Broker,
    first: &std::cell::Cell<Option<u64>>,
) -> String {
    let heartbeat = Duration::from_millis(broker.ha.config.heartbeat_interval_ms);
    // Nothing is sent before the slave's first report (RocketMQ waits for it too).
    let reported = loop {
        if let Some(offset) = first.get() {
            break offset;
        }
        let silence = Duration::from_millis(broker.ha.config.housekeeping_interval_ms);
        if runtime::timeout(silence, link.reported.wait())
            .await
            .is_none()
        {
            return "no first report".into();
        }
    };
    let mut next = start_offset(broker, reported);
    let min = broker.store.min_physical_offset().0;
    if next < min {
        log::error!(
            "{}: slave {} asks for offset {next}, below this master's oldest retained offset \
             {min}: it cannot catch up by replication; it is sent the log from {min} (its own \
             log then ends short of that, so it stops and says so)",
            broker.identity.broker_name,
            link.peer
        );
        next = min;
    }
    let batch = broker.ha.config.transfer_batch_bytes;
    // Up to this many transfers go out in one write: a stream that sent one batch per turn
    // of the shard's executor fell behind a busy master (its turns come once per round of
    // request work, ~1 ms), while one write of several keeps up with what the master takes.
    let read_size = batch * TRANSFERS_PER_WRITE;
    let mut last_write = std::time::Instant::now();
    // The next batch, read while the one before it is written to the socket: a slave catching
    // up from disk otherwise waits for each DMA read and each socket write in turn.
    let mut ahead: Option<Vec<u8>> = None;
    loop {
        let grew = broker.ha.log_grew.wait();
        let data = match ahead.take() {
            Some(data) => data,
            None => match read_sendable(broker, next, read_size).await {
                Ok(data) => data,
                Err(error) => return format!("reading the commitlog at {next}: {error}"),
            },
        };
        if data.is_empty() {
            let waited = last_write.elapsed();
            if waited < heartbeat {
                let left = heartbeat - waited;
                if broker.store.max_physical_offset().0 > next {
                    // Appended, not yet where a crash keeps it: sent once it is.
                    if let Some(Err(_)) = runtime::timeout(left, sendable(broker, next)).await {
                        runtime::sleep(left).await; // a poisoned store: heartbeats only
                    }
                    continue;
                }
                let _ = runtime::timeout(left, grew).await;
                continue;
            }
            if let Err(error) = writer.write_all(&transfer_header(next, 0)).await {
                return error.to_string();
            }
            last_write = std::time::Instant::now();
            continue;
        }
        drop(grew);
        let framed = frame_transfers(next, &data, batch);
        let sent = async {
            writer.write_all(&framed).await?;
            writer.flush().await
        };
        let following = next + data.len() as u64;
        let read_ahead = read_sendable(broker, following, read_size);
        let (sent, read) = futures_lite::future::zip(sent, read_ahead).await;
        if let Err(error) = sent {
            return error.to_string();
        }
        last_write = std::time::Instant::now();
        next = following;
        let ha = &broker.ha;
        ha.bytes_transferred
            .set(ha.bytes_transferred.get() + data.len() as u64);
        match read {
            Ok(data) if !data.is_empty() => ahead = Some(data),
            Ok(_) => {}
            Err(error) => return format!("reading the commitlog at {next}: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_goes_out_as_transfers_of_at_most_the_batch() {
        let data: Vec<u8> = (0..10u8).collect();
        let framed = frame_transfers(100, &data, 4);
        let mut expected = Vec::new();
        for (at, chunk) in [(100u64, &data[..4]), (104, &data[4..8]), (108, &data[8..])] {
            expected.extend_from_slice(&transfer_header(at, chunk.len() as u32));
            expected.extend_from_slice(chunk);
        }
        assert_eq!(framed, expected);
        assert!(frame_transfers(0, &[], 4).is_empty());
    }
}
