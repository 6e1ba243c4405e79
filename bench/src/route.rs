//! Where to send: asks the name server for the topic's route (GET_ROUTEINFO_BY_TOPIC, 105,
//! REMOTING.md §3.1) and turns it into publish targets, as clients do (§4.3).
//!
//! A topic the name server does not know (TOPIC_NOT_EXIST, 17) is published with the route
//! of "TBW102", each broker's queue count capped at 4, and the broker auto-creates the topic
//! on the first send (§6.1), exactly as the Java producer behaves.
//!
//! This runs once, before the load starts, with plain blocking sockets.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use shardmq::protocol::{perm, TopicRouteData};
use shardmq::remoting::{decode_frame, request_code, response_code, FrameEncoder};

use crate::send_frame::{DEFAULT_TOPIC, DEFAULT_TOPIC_QUEUE_NUMS};

/// Broker id of a master in `brokerAddrs`.
const MASTER_BROKER_ID: u64 = 0;
/// Read size while waiting for the route response.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// One master broker to load, and how many write queues it has for the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishTarget {
    pub broker_name: String,
    pub broker_addr: String,
    pub write_queue_nums: u32,
}

/// The publish targets of `topic`, from the first name server in `namesrv_list` (a
/// `host:port;host:port` list, as RocketMQ writes it) that answers.
pub fn fetch_publish_targets(
    namesrv_list: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<PublishTarget>> {
    let mut failures = Vec::new();
    for namesrv in namesrv_list
        .split(';')
        .map(str::trim)
        .filter(|addr| !addr.is_empty())
    {
        match fetch_from(namesrv, topic, timeout) {
            Ok(targets) => return Ok(targets),
            Err(NamesrvError::Unreachable(error)) => {
                failures.push(format!("{namesrv}: {error:#}"));
            }
            Err(NamesrvError::Answered(error)) => return Err(error),
        }
    }
    if failures.is_empty() {
        bail!("--namesrv {namesrv_list:?} names no address");
    }
    bail!("name server unreachable: {}", failures.join("; "))
}

enum NamesrvError {
    /// Try the next name server.
    Unreachable(anyhow::Error),
    /// The name server answered; its answer is final.
    Answered(anyhow::Error),
}

fn fetch_from(
    namesrv: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<PublishTarget>, NamesrvError> {
    let mut stream = connect(namesrv, timeout).map_err(NamesrvError::Unreachable)?;
    let route =
        match get_route(&mut stream, topic, 1, timeout).map_err(NamesrvError::Unreachable)? {
            RouteAnswer::Found(route) => publish_targets(&route, None),
            RouteAnswer::NotFound(remark) => {
                eprintln!(
                    "topic {topic} has no route ({remark}); using the route of {DEFAULT_TOPIC}, \
                 the broker will auto-create the topic"
                );
                match get_route(&mut stream, DEFAULT_TOPIC, 2, timeout)
                    .map_err(NamesrvError::Unreachable)?
                {
                    RouteAnswer::Found(route) => {
                        publish_targets(&route, Some(DEFAULT_TOPIC_QUEUE_NUMS))
                    }
                    RouteAnswer::NotFound(_) => {
                        return Err(NamesrvError::Answered(anyhow!(
                            "topic {topic} has no route on name server {namesrv}, and neither has \
                         {DEFAULT_TOPIC} (topic auto-creation is off): create the topic first"
                        )))
                    }
                }
            }
        };
    let targets = route.map_err(NamesrvError::Answered)?;
    Ok(targets)
}

enum RouteAnswer {
    Found(TopicRouteData),
    /// TOPIC_NOT_EXIST, with the name server's remark.
    NotFound(String),
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

fn get_route(
    stream: &mut TcpStream,
    topic: &str,
    opaque: i32,
    timeout: Duration,
) -> anyhow::Result<RouteAnswer> {
    let mut request = Vec::new();
    let mut encoder = FrameEncoder::request(
        &mut request,
        request_code::GET_ROUTEINFO_BY_TOPIC,
        opaque,
        false,
    );
    encoder.ext("topic", topic);
    encoder.finish(&[]);
    stream
        .write_all(&request)
        .context("sending GET_ROUTEINFO_BY_TOPIC")?;

    let deadline = Instant::now() + timeout;
    let mut buffer = Vec::new();
    loop {
        let frame = decode_frame(&buffer).context("malformed response from the name server")?;
        if let Some((response, consumed)) = frame {
            if !response.is_response() || response.opaque != opaque {
                buffer.drain(..consumed);
                continue;
            }
            return match response.code {
                response_code::SUCCESS => TopicRouteData::parse(response.body)
                    .map(RouteAnswer::Found)
                    .map_err(|error| anyhow!("route of {topic} unreadable: {error}")),
                response_code::TOPIC_NOT_EXIST => Ok(RouteAnswer::NotFound(
                    response.remark.as_deref().unwrap_or_default().to_owned(),
                )),
                code => Err(anyhow!(
                    "name server answered GET_ROUTEINFO_BY_TOPIC for {topic} with code {code}: {}",
                    response.remark.as_deref().unwrap_or_default()
                )),
            };
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no route response within {} ms", timeout.as_millis());
        }
        stream.set_read_timeout(Some(left))?;
        let filled = buffer.len();
        buffer.resize(filled + READ_CHUNK_BYTES, 0);
        let read = stream
            .read(&mut buffer[filled..])
            .context("reading the route response")?;
        buffer.truncate(filled + read);
        if read == 0 {
            bail!("the name server closed the connection");
        }
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
        let master = route
            .broker_datas
            .iter()
            .filter(|broker| broker.broker_name == queue_data.broker_name)
            .find_map(|broker| broker.broker_addrs.get(&MASTER_BROKER_ID));
        let Some(master) = master else { continue };
        let write_queue_nums = match queue_nums_cap {
            Some(cap) => queue_data.write_queue_nums.min(cap),
            None => queue_data.write_queue_nums,
        };
        targets.push(PublishTarget {
            broker_name: queue_data.broker_name.clone(),
            broker_addr: master.clone(),
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
        assert!(publish_targets(&TopicRouteData::default(), None).is_err());
    }
}
