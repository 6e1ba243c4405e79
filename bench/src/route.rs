//! Before the load: where to send and where to pull, asked of the name server and the
//! brokers one request at a time through the Rust client's transport (`call`).
//!
//! - Publish targets from GET_ROUTEINFO_BY_TOPIC (105, REMOTING.md §3.1), as clients do
//!   (§4.3). A topic the name server does not know (TOPIC_NOT_EXIST, 17) is published with
//!   the route of "TBW102", each broker's queue count capped at 4, and the broker auto-creates
//!   the topic on the first send (§6.1), exactly as the Java producer behaves.
//! - Subscribe targets: the readable queues of every master in the topic's route.
//! - `--queues N`: UPDATE_AND_CREATE_TOPIC (17, §3.9) on every master of the cluster
//!   (GET_BROKER_CLUSTER_INFO, 106, §4.6), then wait until the route lists them all.
//! - Start offsets: GET_MAX_OFFSET (30, §3.4) per queue.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use shardmq_client::connection::{RemotingClient, Request};
use shardmq_protocol::body::{perm, ClusterInfo, TopicRouteData, TOPIC_FILTER_TYPE_SINGLE};
use shardmq_protocol::remoting::{request_code, response_code};

use crate::send_frame::{DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS};

/// Broker id of a master in `brokerAddrs`.
const MASTER_BROKER_ID: u64 = 0;
/// How long a created topic may take to show in the route on every broker.
const TOPIC_ROUTE_WAIT: Duration = Duration::from_secs(30);
/// How often the route is asked again while waiting for it.
const TOPIC_ROUTE_POLL: Duration = Duration::from_millis(100);
/// Queues per broker a topic may be created with (RocketMQ's own limit is far lower in
/// practice; each queue is a file set on every broker).
pub const QUEUES_MAX: u32 = 1024;

/// One master broker to load, and how many write queues it has for the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishTarget {
    pub broker_name: String,
    pub broker_addr: String,
    pub write_queue_nums: u32,
}

/// One master broker to pull from, and how many read queues it has for the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeTarget {
    pub broker_name: String,
    pub broker_addr: String,
    pub read_queue_nums: u32,
}

/// A decoded response, owned.
#[derive(Debug)]
pub struct Reply {
    pub code: i32,
    pub remark: String,
    pub ext: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn ext(&self, key: &str) -> Option<&str> {
        self.ext
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    }
}

/// Resolves `addr` and connects within `timeout`, trying each resolved address.
pub fn connect(addr: &str, timeout: Duration) -> anyhow::Result<TcpStream> {
    let resolved: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr:?}"))?
        .collect();
    let mut last_error = None;
    for socket_addr in resolved {
        match TcpStream::connect_timeout(&socket_addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = Some(error),
        }
    }
    match last_error {
        Some(error) => Err(anyhow!("cannot connect to {addr}: {error}")),
        None => Err(anyhow!("{addr:?} resolves to no address")),
    }
}

/// What every request of this run is signed with (`--access-key/--secret-key`).
static CREDENTIALS: std::sync::OnceLock<shardmq_protocol::remoting::signature::Credentials> =
    std::sync::OnceLock::new();

/// Signs every request of the run with `credentials` (set once, before any request).
pub fn set_credentials(credentials: shardmq_protocol::remoting::signature::Credentials) {
    let _ = CREDENTIALS.set(credentials);
}

pub fn credentials() -> Option<&'static shardmq_protocol::remoting::signature::Credentials> {
    CREDENTIALS.get()
}

/// The TLS configuration of every connection of this run (`--tls`).
static TLS: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();

/// Every connection of the run speaks TLS with `config` (set once, before any request).
pub fn set_tls(config: std::sync::Arc<rustls::ClientConfig>) {
    let _ = TLS.set(config);
}

/// A TLS session for a connection to `addr`, when the run speaks TLS.
pub fn tls_session(addr: &str) -> anyhow::Result<Option<rustls::ClientConnection>> {
    let Some(config) = TLS.get() else {
        return Ok(None);
    };
    let name = shardmq_client::tls::server_name(addr).map_err(anyhow::Error::msg)?;
    let mut session = rustls::ClientConnection::new(config.clone(), name)?;
    // The worker bounds what it queues (its in-flight window); rustls need not.
    session.set_buffer_limit(None);
    Ok(Some(session))
}

thread_local! {
    /// The Rust client's remoting transport (one connection per address, kept for the run)
    /// on a current-thread runtime this thread blocks on: the requests before and after the
    /// load go through the same client code as `shardmq admin` and the client library.
    static REQUESTS: std::cell::RefCell<Option<(tokio::runtime::Runtime, RemotingClient)>> =
        const { std::cell::RefCell::new(None) };
}

/// Sends one request to `addr` and waits up to `timeout` for its response.
pub fn call(
    addr: &str,
    code: i32,
    ext: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<Reply> {
    let mut request = Request::new(code);
    for (key, value) in ext {
        request = request.ext(key, value);
    }
    REQUESTS.with(|requests| {
        let mut requests = requests.borrow_mut();
        if requests.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting a tokio runtime for requests")?;
            let (server_requests, _) = tokio::sync::mpsc::channel(1);
            let remoting = runtime
                .block_on(async { RemotingClient::new(server_requests) })
                .with_credentials(credentials().cloned())
                .with_tls(TLS.get().cloned());
            *requests = Some((runtime, remoting));
        }
        let (runtime, remoting) = requests.as_ref().expect("just made");
        let answer = runtime.block_on(remoting.invoke(addr, &request, timeout))?;
        Ok(Reply {
            code: answer.code,
            remark: answer.remark.unwrap_or_default(),
            ext: answer.ext.into_iter().collect(),
            body: answer.body,
        })
    })
}

/// Asks each name server of `namesrv_list` (`host:port;host:port`) in turn until one
/// answers; an answer (even an error code) is final.
fn ask_namesrv(
    namesrv_list: &str,
    timeout: Duration,
    code: i32,
    ext: &[(&str, String)],
) -> anyhow::Result<(String, Reply)> {
    let mut failures = Vec::new();
    for namesrv in namesrv_list
        .split(';')
        .map(str::trim)
        .filter(|addr| !addr.is_empty())
    {
        let reply =
            call(namesrv, code, ext, timeout).with_context(|| format!("name server {namesrv}"));
        match reply {
            Ok(reply) => return Ok((namesrv.to_string(), reply)),
            Err(error) => failures.push(format!("{namesrv}: {error:#}")),
        }
    }
    if failures.is_empty() {
        bail!("--namesrv {namesrv_list:?} names no address");
    }
    bail!("name server unreachable: {}", failures.join("; "))
}

/// The topic's route, or None when the name server does not know the topic.
pub fn fetch_route(
    namesrv_list: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Option<TopicRouteData>> {
    let ext = [("topic", topic.to_string())];
    let (namesrv, reply) = ask_namesrv(
        namesrv_list,
        timeout,
        request_code::GET_ROUTEINFO_BY_TOPIC,
        &ext,
    )?;
    match reply.code {
        response_code::SUCCESS => TopicRouteData::parse(&reply.body)
            .map(Some)
            .map_err(|error| anyhow!("route of {topic} from {namesrv} unreadable: {error}")),
        response_code::TOPIC_NOT_EXIST => Ok(None),
        code => bail!(
            "name server {namesrv} answered GET_ROUTEINFO_BY_TOPIC for {topic} with code \
             {code}: {}",
            reply.remark
        ),
    }
}

/// Where to send messages for `topic`, with the TBW102 fallback for an unknown topic.
pub fn fetch_publish_targets(
    namesrv_list: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<PublishTarget>> {
    if let Some(route) = fetch_route(namesrv_list, topic, timeout)? {
        return publish_targets(&route, None);
    }
    eprintln!(
        "topic {topic} has no route; using the route of {DEFAULT_TOPIC}, the broker will \
         auto-create the topic"
    );
    match fetch_route(namesrv_list, DEFAULT_TOPIC, timeout)? {
        Some(route) => publish_targets(&route, Some(DEFAULT_TOPIC_QUEUE_NUMS)),
        None => bail!(
            "topic {topic} has no route, and neither has {DEFAULT_TOPIC} (topic auto-creation \
             is off): create the topic first, or give --queues"
        ),
    }
}

/// Writable queues of every broker name that has a master, in route order. `queue_nums_cap`
/// caps each broker's write queues (the TBW102 fallback). Fails when nothing is writable.
pub fn publish_targets(
    route: &TopicRouteData,
    queue_nums_cap: Option<u32>,
) -> anyhow::Result<Vec<PublishTarget>> {
    let mut targets = Vec::new();
    for queue_data in &route.queue_datas {
        if !perm::is_writeable(queue_data.perm) || queue_data.write_queue_nums == 0 {
            continue;
        }
        let Some(master) = master_of(route, &queue_data.broker_name) else {
            continue;
        };
        let write_queue_nums = match queue_nums_cap {
            Some(cap) => queue_data.write_queue_nums.min(cap),
            None => queue_data.write_queue_nums,
        };
        targets.push(PublishTarget {
            broker_name: queue_data.broker_name.clone(),
            broker_addr: master.to_string(),
            write_queue_nums,
        });
    }
    if targets.is_empty() {
        bail!(
            "the route has no writable queue on a master broker ({} queue datas, {} broker datas)",
            route.queue_datas.len(),
            route.broker_datas.len()
        );
    }
    Ok(targets)
}

/// Readable queues of every broker name that has a master, in route order.
pub fn subscribe_targets(route: &TopicRouteData) -> anyhow::Result<Vec<SubscribeTarget>> {
    let mut targets = Vec::new();
    for queue_data in &route.queue_datas {
        if !perm::is_readable(queue_data.perm) || queue_data.read_queue_nums == 0 {
            continue;
        }
        let Some(master) = master_of(route, &queue_data.broker_name) else {
            continue;
        };
        targets.push(SubscribeTarget {
            broker_name: queue_data.broker_name.clone(),
            broker_addr: master.to_string(),
            read_queue_nums: queue_data.read_queue_nums,
        });
    }
    if targets.is_empty() {
        bail!("the route has no readable queue on a master broker");
    }
    Ok(targets)
}

fn master_of<'r>(route: &'r TopicRouteData, broker_name: &str) -> Option<&'r str> {
    route
        .broker_datas
        .iter()
        .filter(|broker| broker.broker_name == broker_name)
        .find_map(|broker| broker.broker_addrs.get(&MASTER_BROKER_ID))
        .map(String::as_str)
}

/// Creates (or resizes) `topic` with `queues` read and write queues on every master broker
/// the name server knows, then waits until the route lists every one of them.
pub fn create_topic(
    namesrv_list: &str,
    topic: &str,
    queues: u32,
    timeout: Duration,
) -> anyhow::Result<TopicRouteData> {
    let (namesrv, reply) = ask_namesrv(
        namesrv_list,
        timeout,
        request_code::GET_BROKER_CLUSTER_INFO,
        &[],
    )?;
    if reply.code != response_code::SUCCESS {
        bail!(
            "name server {namesrv} answered GET_BROKER_CLUSTER_INFO with code {}: {}",
            reply.code,
            reply.remark
        );
    }
    let cluster = ClusterInfo::parse(&reply.body)
        .map_err(|error| anyhow!("cluster info from {namesrv} unreadable: {error}"))?;
    let masters: Vec<(String, String)> = cluster
        .broker_addr_table
        .values()
        .filter_map(|broker| {
            let addr = broker.broker_addrs.get(&MASTER_BROKER_ID)?;
            Some((broker.broker_name.clone(), addr.clone()))
        })
        .collect();
    if masters.is_empty() {
        bail!("name server {namesrv} knows no master broker");
    }
    let queues_text = queues.to_string();
    for (broker_name, addr) in &masters {
        let ext = [
            ("topic", topic.to_string()),
            ("defaultTopic", DEFAULT_TOPIC.to_string()),
            ("readQueueNums", queues_text.clone()),
            ("writeQueueNums", queues_text.clone()),
            ("perm", (perm::READ | perm::WRITE).to_string()),
            ("topicFilterType", TOPIC_FILTER_TYPE_SINGLE.to_string()),
            ("topicSysFlag", "0".to_string()),
            ("order", "false".to_string()),
        ];
        let reply = call(addr, request_code::UPDATE_AND_CREATE_TOPIC, &ext, timeout)
            .with_context(|| format!("creating {topic} on {broker_name} ({addr})"))?;
        if reply.code != response_code::SUCCESS {
            bail!(
                "{broker_name} ({addr}) refused to create {topic}: code {} {}",
                reply.code,
                reply.remark
            );
        }
    }
    let deadline = Instant::now() + TOPIC_ROUTE_WAIT;
    loop {
        if let Some(route) = fetch_route(namesrv_list, topic, timeout)? {
            let complete = masters.iter().all(|(name, _)| {
                route.queue_datas.iter().any(|queue_data| {
                    queue_data.broker_name == *name && queue_data.write_queue_nums == queues
                })
            });
            if complete {
                return Ok(route);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "{topic} was created on {} broker(s) but the route does not list them all \
                 after {} s",
                masters.len(),
                TOPIC_ROUTE_WAIT.as_secs()
            );
        }
        std::thread::sleep(TOPIC_ROUTE_POLL);
    }
}

/// The next offset to be written in each of `queues` queues of `topic` on one broker.
pub fn max_offsets(
    broker_addr: &str,
    topic: &str,
    queues: u32,
    timeout: Duration,
) -> anyhow::Result<Vec<u64>> {
    let mut offsets = Vec::with_capacity(queues as usize);
    for queue_id in 0..queues {
        let ext = [
            ("topic", topic.to_string()),
            ("queueId", queue_id.to_string()),
        ];
        let reply = call(broker_addr, request_code::GET_MAX_OFFSET, &ext, timeout)?;
        let offset = match reply.code {
            response_code::SUCCESS => reply.ext("offset").and_then(|v| v.parse().ok()),
            _ => None,
        };
        let offset = offset.ok_or_else(|| {
            anyhow!(
                "GET_MAX_OFFSET of {topic} queue {queue_id} on {broker_addr}: code {} {}",
                reply.code,
                reply.remark
            )
        })?;
        offsets.push(offset);
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = r#"{"brokerDatas":[
        {"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},"brokerName":"broker-a"},
        {"brokerAddrs":{"1":"10.0.0.4:10911"},"brokerName":"broker-b","cluster":"C"},
        {"brokerAddrs":{"0":"10.0.0.5:10911"},"brokerName":"broker-c","cluster":"C"},
        {"brokerAddrs":{"0":"10.0.0.6:10911"},"brokerName":"broker-d","cluster":"C"}],
        "filterServerTable":{},
        "queueDatas":[
        {"brokerName":"broker-a","perm":6,"readQueueNums":8,"writeQueueNums":8},
        {"brokerName":"broker-b","perm":6,"readQueueNums":4,"writeQueueNums":4},
        {"brokerName":"broker-c","perm":4,"readQueueNums":4,"writeQueueNums":4},
        {"brokerName":"broker-d","perm":7,"readQueueNums":2,"writeQueueNums":2}]}"#;

    #[test]
    fn only_writable_masters_are_targets() {
        let route = TopicRouteData::parse(ROUTE.as_bytes()).unwrap();
        let targets = publish_targets(&route, None).unwrap();
        let expected = vec![
            PublishTarget {
                broker_name: "broker-a".into(),
                broker_addr: "10.0.0.1:10911".into(),
                write_queue_nums: 8,
            },
            PublishTarget {
                broker_name: "broker-d".into(),
                broker_addr: "10.0.0.6:10911".into(),
                write_queue_nums: 2,
            },
        ];
        assert_eq!(targets, expected);
    }

    #[test]
    fn only_readable_masters_are_subscribed() {
        let route = TopicRouteData::parse(ROUTE.as_bytes()).unwrap();
        let names: Vec<_> = subscribe_targets(&route)
            .unwrap()
            .into_iter()
            .map(|target| (target.broker_name, target.read_queue_nums))
            .collect();
        assert_eq!(
            names,
            [
                ("broker-a".to_string(), 8),
                ("broker-c".to_string(), 4),
                ("broker-d".to_string(), 2)
            ]
        );
    }

    #[test]
    fn default_topic_route_caps_queue_count() {
        let route = TopicRouteData::parse(ROUTE.as_bytes()).unwrap();
        let targets = publish_targets(&route, Some(4)).unwrap();
        let queue_nums: Vec<u32> = targets
            .iter()
            .map(|target| target.write_queue_nums)
            .collect();
        assert_eq!(queue_nums, [4, 2]);
    }

    #[test]
    fn route_without_writable_master_is_an_error() {
        let body = r#"{"brokerDatas":[{"brokerAddrs":{"1":"h:1"},"brokerName":"b"}],
            "queueDatas":[{"brokerName":"b","perm":6,"writeQueueNums":4}]}"#;
        let route = TopicRouteData::parse(body.as_bytes()).unwrap();
        assert!(publish_targets(&route, None).is_err());
        assert!(subscribe_targets(&route).is_err());
        assert!(publish_targets(&TopicRouteData::default(), None).is_err());
    }
}
