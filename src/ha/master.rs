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

use super::{last_report, transfer_header, SlaveLink, StartFrom};
use crate::broker::Broker;

/// Wait after a failed accept (descriptors short).
const ACCEPT_RETRY_MS: u64 = 100;

/// Accepts slaves forever.
pub async fn serve(listener: TcpListener, broker: Rc<Broker>) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                runtime::spawn_detached(serve_slave(stream, broker.clone()));
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
        caught_up_ms: std::cell::Cell::new(runtime::monotonic_ms()),
        reported: Default::default(),
    });
    log::info!("{name}: slave {peer} connected to the HA port");
    let first = std::cell::Cell::new(None::<u64>);
    let outcome = futures_lite::future::or(
        read_reports(reader, &link, &broker, &first),
        write_stream(writer, &link, &broker, &first),
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
        if offset >= max {
            link.caught_up_ms.set(runtime::monotonic_ms());
        }
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
    let mut last_write = std::time::Instant::now();
    // The next batch, read while the one before it is written to the socket: a slave catching
    // up from disk otherwise waits for each DMA read and each socket write in turn.
    let mut ahead: Option<Vec<u8>> = None;
    loop {
        let grew = broker.ha.log_grew.wait();
        let data = match ahead.take() {
            Some(data) => data,
            None => match broker.store.read_log(next, batch).await {
                Ok(data) => data,
                Err(error) => return format!("reading the commitlog at {next}: {error}"),
            },
        };
        if data.is_empty() {
            let waited = last_write.elapsed();
            if waited < heartbeat {
                let _ = runtime::timeout(heartbeat - waited, grew).await;
                continue;
            }
            if let Err(error) = writer.write_all(&transfer_header(next, 0)).await {
                return error.to_string();
            }
            last_write = std::time::Instant::now();
            continue;
        }
        drop(grew);
        let header = transfer_header(next, data.len() as u32);
        let sent = async {
            writer.write_all(&header).await?;
            writer.write_all(&data).await?;
            writer.flush().await
        };
        let following = next + data.len() as u64;
        let read_ahead = broker.store.read_log(following, batch);
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
