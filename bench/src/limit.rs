//! `shardmq-bench limit`: the ceiling of this machine for a broker's hot path, to compare a
//! broker with. A minimal server, one glommio executor per core, that speaks just enough of
//! the remoting protocol for `shardmq-bench producer` to run against it: a namesrv (routes and
//! cluster info naming its shards), UPDATE_AND_CREATE_TOPIC, and SEND_MESSAGE (10, 310, 320),
//! whose messages it appends, as records of the commitlog's size, to one O_DIRECT file per
//! core and acknowledges after the write and the fdatasync that cover them (`--flush sync`,
//! one write + fdatasync at a time, every message that arrived meanwhile in the next: group
//! commit), or on arrival (`--flush async`, written the same way, fdatasync every 200 ms). No
//! queues, no index, no validation beyond framing: what is left of a broker's cost is the
//! network, the copy and the disk.
//!
//! The file is a ring (`--ring-mib`, zeroed before the server listens) written round and
//! round: a durable write over blocks written before is the cheapest the disk offers (no
//! extent conversion, no size change for the journal to commit), which is the best a broker
//! that zero-fills ahead of its writes can reach. The content is not kept. With
//! `--unwritten` the ring is only allocated, so that (until the writes come round) every
//! durable write also commits its extent conversion, as one into a new segment file does.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::io::DmaFile;
use glommio::net::{TcpListener, TcpStream};
use glommio::{LocalExecutorBuilder, Placement};
use shardmq_protocol::body::{perm, BrokerData, ClusterInfo, QueueData, TopicRouteData};
use shardmq_protocol::remoting::{
    decode_frame, request_code, response_code, FrameEncoder, RemotingCommand,
};
use shards::sync::Signal;

/// Queues per shard of a topic nobody created (what auto-creation through TBW102 gives).
const DEFAULT_QUEUES: u32 = 8;

/// Bytes of a commitlog record besides its body, topic and properties (shardmq's and
/// RocketMQ's fixed fields), written per message so the disk carries what a broker's does.
const RECORD_FIXED_BYTES: usize = 92;

/// Zeros written at a time while the ring is prepared.
const ZERO_CHUNK_BYTES: usize = 8 << 20;

/// Async mode: longest time between fdatasyncs.
const ASYNC_SYNC_INTERVAL: Duration = Duration::from_millis(200);

const READ_CHUNK_BYTES: usize = 64 * 1024;

const CLUSTER: &str = "LimitCluster";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    Sync,
    Async,
}

#[derive(Debug, Clone)]
pub struct LimitOptions {
    pub listen_ip: IpAddr,
    pub namesrv_port: u16,
    /// Shard i listens on broker_port + port_stride · i.
    pub broker_port: u16,
    pub port_stride: u16,
    /// One shard per CPU, pinned.
    pub cpus: Vec<usize>,
    pub data_dir: PathBuf,
    pub flush: Flush,
    /// Size of each shard's ring file.
    pub ring_bytes: u64,
    /// The ring is allocated, not zeroed (`--unwritten`).
    pub unwritten: bool,
}

impl LimitOptions {
    fn broker_addr(&self, shard: usize) -> SocketAddr {
        let port = usize::from(self.broker_port) + usize::from(self.port_stride) * shard;
        SocketAddr::new(self.listen_ip, port as u16)
    }
}

/// Topic → queues per shard, shared by the shards and the namesrv.
type Topics = Arc<Mutex<BTreeMap<String, u32>>>;

/// Runs until the process is stopped.
pub fn run_limit(options: LimitOptions) -> anyhow::Result<()> {
    if options.cpus.is_empty() {
        bail!("--cpus names no CPU");
    }
    let last_port = usize::from(options.broker_port)
        + usize::from(options.port_stride) * (options.cpus.len() - 1);
    if last_port > usize::from(u16::MAX) {
        bail!(
            "the broker ports of {} shards pass 65535",
            options.cpus.len()
        );
    }
    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("creating {}", options.data_dir.display()))?;
    let topics: Topics = Arc::default();
    // As the broker places them: the kernel's io_uring workers (the fdatasync, and any write
    // that cannot be issued without blocking) run on the CPUs that no shard runs on.
    let io_worker_cpus: Vec<usize> = shards::runtime::online_cpus()
        .into_iter()
        .filter(|cpu| !options.cpus.contains(cpu))
        .collect();
    let mut handles = Vec::new();
    for (shard, &cpu) in options.cpus.iter().enumerate() {
        let options = options.clone();
        let topics = topics.clone();
        let io_worker_cpus = io_worker_cpus.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("limit-{shard}"))
            .spawn(move || async move {
                shards::runtime::bind_io_workers(&io_worker_cpus);
                if let Err(error) = run_shard(shard, &options, topics).await {
                    eprintln!("shardmq-bench limit: shard {shard}: {error:#}");
                    std::process::exit(1);
                }
            })
            .map_err(|error| anyhow::anyhow!("starting shard {shard} on CPU {cpu}: {error}"))?;
        handles.push(handle);
    }
    println!(
        "limit: namesrv on {}:{}, {} shard(s) from {} (CPUs {:?}, io_uring workers on {:?}), \
         flush {}, data in {}",
        options.listen_ip,
        options.namesrv_port,
        options.cpus.len(),
        options.broker_addr(0),
        options.cpus,
        io_worker_cpus,
        match options.flush {
            Flush::Sync => "sync (ack after write + fdatasync)",
            Flush::Async => "async (ack on arrival)",
        },
        options.data_dir.display()
    );
    for handle in handles {
        let _ = handle.join();
    }
    Ok(())
}

async fn run_shard(shard: usize, options: &LimitOptions, topics: Topics) -> anyhow::Result<()> {
    let path = options.data_dir.join(format!("limit-{shard}.log"));
    let _ = std::fs::remove_file(&path);
    let file = DmaFile::create(&path)
        .await
        .map_err(|error| anyhow::anyhow!("creating {}: {error}", path.display()))?;
    let log = Rc::new(Log {
        file,
        flush: options.flush,
        staged: RefCell::default(),
        waiting: RefCell::default(),
        wake: Signal::default(),
        next_offset: Cell::new(0),
    });
    let started = Instant::now();
    if options.unwritten {
        log.file
            .pre_allocate(options.ring_bytes, false)
            .await
            .map_err(|error| anyhow::anyhow!("allocating the ring: {error}"))?;
    } else {
        zero_ring(&log.file, options.ring_bytes).await?;
    }
    println!(
        "limit: shard {shard}: {} MiB ring {} in {:.1} s",
        options.ring_bytes >> 20,
        if options.unwritten {
            "allocated"
        } else {
            "zeroed"
        },
        started.elapsed().as_secs_f64()
    );
    glommio::spawn_local(commit_loop(log.clone(), options.ring_bytes)).detach();
    if shard == 0 {
        let addr = SocketAddr::new(options.listen_ip, options.namesrv_port);
        let listener =
            TcpListener::bind(addr).map_err(|error| anyhow::anyhow!("binding {addr}: {error}"))?;
        let brokers: Vec<SocketAddr> = (0..options.cpus.len())
            .map(|i| options.broker_addr(i))
            .collect();
        let topics = topics.clone();
        glommio::spawn_local(async move {
            let routes = Rc::new(Routes { brokers, topics });
            while let Ok(stream) = listener.accept().await {
                let routes = routes.clone();
                glommio::spawn_local(serve(stream, move |request, out| {
                    routes.answer(request, out);
                }))
                .detach();
            }
        })
        .detach();
    }
    let addr = options.broker_addr(shard);
    let listener =
        TcpListener::bind(addr).map_err(|error| anyhow::anyhow!("binding {addr}: {error}"))?;
    println!("limit: shard {shard} ready on {addr}");
    while let Ok(stream) = listener.accept().await {
        let (log, topics) = (log.clone(), topics.clone());
        let connection = Rc::new(Out::default());
        let out = connection.clone();
        glommio::spawn_local(serve_with(stream, connection, move |request, reply| {
            broker_answer(&log, &topics, &out, request, reply)
        }))
        .detach();
    }
    Ok(())
}

/// What a connection has to write, and the signal that wakes its writer.
#[derive(Default)]
struct Out {
    bytes: RefCell<Vec<u8>>,
    wake: Signal,
}

impl Out {
    fn push(&self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.bytes.borrow_mut());
        self.wake.notify();
    }
}

async fn serve(stream: TcpStream, answer: impl Fn(&RemotingCommand<'_>, &mut Vec<u8>)) {
    serve_with(stream, Rc::new(Out::default()), answer).await;
}

/// Reads frames and answers each request with `answer` (which may write nothing, when the
/// answer comes later through the connection's [`Out`]).
async fn serve_with(
    stream: TcpStream,
    out: Rc<Out>,
    answer: impl Fn(&RemotingCommand<'_>, &mut Vec<u8>),
) {
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let writer_out = out.clone();
    let writer_task = glommio::spawn_local(async move {
        let mut spare = Vec::new();
        loop {
            while writer_out.bytes.borrow().is_empty() {
                writer_out.wake.wait().await;
            }
            std::mem::swap(&mut spare, &mut *writer_out.bytes.borrow_mut());
            if writer.write_all(&spare).await.is_err() {
                return;
            }
            spare.clear();
        }
    });
    let mut input = vec![0u8; READ_CHUNK_BYTES];
    let mut filled = 0;
    loop {
        if filled == input.len() {
            input.resize(input.len() * 2, 0);
        }
        match reader.read(&mut input[filled..]).await {
            Ok(0) | Err(_) => break,
            Ok(read) => filled += read,
        }
        let mut consumed = 0;
        let mut answers = Vec::new();
        loop {
            match decode_frame(&input[consumed..filled]) {
                Ok(Some((request, size))) => {
                    if !request.is_response() {
                        answer(&request, &mut answers);
                    }
                    consumed += size;
                }
                Ok(None) => break,
                Err(_) => {
                    drop(writer_task);
                    return; // not a remoting stream
                }
            }
        }
        input.copy_within(consumed..filled, 0);
        filled -= consumed;
        if !answers.is_empty() {
            out.push(|bytes| bytes.extend_from_slice(&answers));
        }
    }
    drop(writer_task);
}

/// The namesrv's side: every topic is routed to every shard.
struct Routes {
    brokers: Vec<SocketAddr>,
    topics: Topics,
}

impl Routes {
    fn broker_data(&self, shard: usize) -> BrokerData {
        BrokerData {
            cluster: CLUSTER.to_string(),
            broker_name: format!("limit-{shard}"),
            broker_addrs: BTreeMap::from([(0, self.brokers[shard].to_string())]),
            enable_acting_master: false,
        }
    }

    fn answer(&self, request: &RemotingCommand<'_>, out: &mut Vec<u8>) {
        match request.code {
            request_code::GET_ROUTEINFO_BY_TOPIC => {
                let topic = request.ext_fields.get("topic").unwrap_or_default();
                let queues = self.topics.lock().map_or(DEFAULT_QUEUES, |topics| {
                    topics.get(topic).copied().unwrap_or(DEFAULT_QUEUES)
                });
                let route = TopicRouteData {
                    order_topic_conf: None,
                    queue_datas: (0..self.brokers.len())
                        .map(|shard| QueueData {
                            broker_name: format!("limit-{shard}"),
                            read_queue_nums: queues,
                            write_queue_nums: queues,
                            perm: perm::READ | perm::WRITE,
                            topic_sys_flag: 0,
                        })
                        .collect(),
                    broker_datas: (0..self.brokers.len())
                        .map(|shard| self.broker_data(shard))
                        .collect(),
                };
                FrameEncoder::response(out, response_code::SUCCESS, request.opaque)
                    .finish(&route.encode());
            }
            request_code::GET_BROKER_CLUSTER_INFO => {
                let names = (0..self.brokers.len()).map(|i| format!("limit-{i}"));
                let info = ClusterInfo {
                    broker_addr_table: (0..self.brokers.len())
                        .map(|shard| (format!("limit-{shard}"), self.broker_data(shard)))
                        .collect(),
                    cluster_addr_table: BTreeMap::from([(CLUSTER.to_string(), names.collect())]),
                };
                FrameEncoder::response(out, response_code::SUCCESS, request.opaque)
                    .finish(&info.encode());
            }
            _ => FrameEncoder::response(out, response_code::SUCCESS, request.opaque).finish(&[]),
        }
    }
}

fn broker_answer(
    log: &Log,
    topics: &Topics,
    connection: &Rc<Out>,
    request: &RemotingCommand<'_>,
    out: &mut Vec<u8>,
) {
    let ext = &request.ext_fields;
    match request.code {
        request_code::SEND_MESSAGE | request_code::SEND_MESSAGE_V2 => {
            let (topic, properties) = match request.code {
                request_code::SEND_MESSAGE => (ext.get("topic"), ext.get("properties")),
                _ => (ext.get("b"), ext.get("i")),
            };
            let record = RECORD_FIXED_BYTES
                + topic.map_or(0, str::len)
                + properties.map_or(0, str::len)
                + request.body.len();
            log.append(record, request.body, connection, request.opaque, out);
        }
        request_code::SEND_BATCH_MESSAGE => {
            // Each message of the batch gets its record header; the body carries them all.
            let topic = ext.get("b").map_or(0, str::len);
            let messages =
                shardmq_protocol::batch::decode(request.body, usize::MAX).map_or(1, |m| m.len());
            let record = (RECORD_FIXED_BYTES + topic) * messages + request.body.len();
            log.append(record, request.body, connection, request.opaque, out);
        }
        request_code::UPDATE_AND_CREATE_TOPIC => {
            let topic = ext.get("topic").unwrap_or_default().to_string();
            let queues = ext
                .get("writeQueueNums")
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(DEFAULT_QUEUES);
            if let Ok(mut topics) = topics.lock() {
                topics.insert(topic, queues.max(1));
            }
            FrameEncoder::response(out, response_code::SUCCESS, request.opaque).finish(&[]);
        }
        _ => FrameEncoder::response(out, response_code::SUCCESS, request.opaque).finish(&[]),
    }
}

/// One shard's log: what arrived since the last write, and who waits for it.
struct Log {
    file: DmaFile,
    flush: Flush,
    staged: RefCell<Vec<u8>>,
    /// (connection, opaque, queue offset) of every send in `staged` (sync mode).
    waiting: RefCell<Vec<(Rc<Out>, i32, u64)>>,
    wake: Signal,
    next_offset: Cell<u64>,
}

impl Log {
    /// Stages `record` bytes (the body, then filler for the header fields) and answers now
    /// (async) or once they are durable (sync).
    fn append(
        &self,
        record: usize,
        body: &[u8],
        connection: &Rc<Out>,
        opaque: i32,
        out: &mut Vec<u8>,
    ) {
        let mut staged = self.staged.borrow_mut();
        staged.extend_from_slice(body);
        let filled = staged.len() + record.saturating_sub(body.len());
        staged.resize(filled, 0);
        let offset = self.next_offset.get();
        self.next_offset.set(offset + 1);
        match self.flush {
            Flush::Sync => self
                .waiting
                .borrow_mut()
                .push((connection.clone(), opaque, offset)),
            Flush::Async => send_ok(out, opaque, offset),
        }
        self.wake.notify();
    }
}

fn send_ok(out: &mut Vec<u8>, opaque: i32, offset: u64) {
    let mut frame = FrameEncoder::response(out, response_code::SUCCESS, opaque);
    frame
        .ext("msgId", "00000000000000000000000000000000")
        .ext_i64("queueId", 0)
        .ext_i64("queueOffset", offset as i64);
    frame.finish(&[]);
}

/// Writes `ring_bytes` of zeros and makes them durable.
async fn zero_ring(file: &DmaFile, ring_bytes: u64) -> anyhow::Result<()> {
    let mut at = 0;
    while at < ring_bytes {
        let size = (ring_bytes - at).min(ZERO_CHUNK_BYTES as u64) as usize;
        let mut buffer = file.alloc_dma_buffer(size);
        buffer.as_bytes_mut().fill(0);
        file.write_at(buffer, at)
            .await
            .map_err(|error| anyhow::anyhow!("zeroing the ring: {error}"))?;
        at += size as u64;
    }
    file.fdatasync()
        .await
        .map_err(|error| anyhow::anyhow!("zeroing the ring: {error}"))
}

/// Writes what is staged, one O_DIRECT write (and, in sync mode, one fdatasync) at a time;
/// the partial last block is written again with the next batch; a batch that would pass the
/// ring's end starts again at its beginning.
async fn commit_loop(log: Rc<Log>, ring_bytes: u64) {
    let alignment = log.file.alignment() as usize;
    let mut tail: Vec<u8> = Vec::new();
    let mut tail_at: u64 = 0;
    let mut last_sync = Instant::now();
    loop {
        while log.staged.borrow().is_empty() {
            log.wake.wait().await;
        }
        let staged = std::mem::take(&mut *log.staged.borrow_mut());
        let waiting = std::mem::take(&mut *log.waiting.borrow_mut());
        let length = tail.len() + staged.len();
        let padded = length.div_ceil(alignment) * alignment;
        if tail_at + padded as u64 > ring_bytes {
            tail_at = 0;
        }
        let mut buffer = log.file.alloc_dma_buffer(padded);
        let bytes = buffer.as_bytes_mut();
        bytes[..tail.len()].copy_from_slice(&tail);
        bytes[tail.len()..length].copy_from_slice(&staged);
        bytes[length..].fill(0);
        let end = tail_at + length as u64;
        let new_tail_at = end / alignment as u64 * alignment as u64;
        let new_tail = bytes[(new_tail_at - tail_at) as usize..length].to_vec();
        if let Err(error) = log.file.write_at(buffer, tail_at).await {
            eprintln!("shardmq-bench limit: write failed: {error}");
            std::process::exit(1);
        }
        let sync_now = log.flush == Flush::Sync || last_sync.elapsed() >= ASYNC_SYNC_INTERVAL;
        if sync_now {
            if let Err(error) = log.file.fdatasync().await {
                eprintln!("shardmq-bench limit: fdatasync failed: {error}");
                std::process::exit(1);
            }
            last_sync = Instant::now();
        }
        (tail, tail_at) = (new_tail, new_tail_at);
        for (connection, opaque, offset) in waiting {
            connection.push(|out| send_ok(out, opaque, offset));
        }
    }
}
