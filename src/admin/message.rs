//! Message commands: `queryMsgByKey`, `queryMsgByUniqueKey`, `queryMsgById`,
//! `queryMsgByOffset`, `sendMessage`.
//!
//! Found messages are printed with their ids, queue position, times, hosts, every property
//! and a preview of the body; in JSON as `{"messages":[{"topic","msgId","uniqKey","keys",
//! "tags","brokerName","queueId","queueOffset","commitLogOffset","storeHost","bornHost",
//! "storeTimestamp","bornTimestamp","sysFlag","flag","reconsumeTimes","bodyLength","bodyCrc",
//! "compressed","properties":{..},"bodyPreview"}]}`.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use anyhow::{anyhow, bail};
use clap::Args;
use serde_json::{json, Map, Value};
use shards::store::record::{self, StoredMessage};

use crate::body::{parse_properties, parse_topic_list, TopicRouteData};
use crate::remoting::{request_code as rc, response_code};

use super::table::{format_time_ms, parse_time_ms, Table};
use super::{now_ms, request_name, route_masters, Admin, BrokerRef, Outcome};

/// Messages a key query asks each broker for, by default (RocketMQ's maxMsgsNumBatch).
pub const QUERY_MESSAGES_DEFAULT: u32 = 64;
/// What a unique-key query asks for (brokers force RocketMQ's defaultQueryMaxNum anyway).
const QUERY_UNIQUE_KEY_MESSAGES: &str = "32";
/// Body bytes shown in a preview.
pub const BODY_PREVIEW_BYTES: usize = 256;
/// Topics `queryMsgById` searches for a unique id when no topic is given, at most.
pub const UNIQUE_ID_TOPIC_SCAN_MAX: usize = 512;
/// The consumer group named in the pulls of `queryMsgByOffset` (it commits nothing).
const TOOLS_CONSUMER_GROUP: &str = "SHARDMQ_ADMIN_TOOLS";
/// The producer group of `sendMessage`.
const TOOLS_PRODUCER_GROUP: &str = "SHARDMQ_ADMIN_PRODUCER";
/// The template topic RocketMQ producers auto-create unknown topics from.
const AUTO_CREATE_TOPIC: &str = "TBW102";
/// SYSFLAG bit: the body is compressed.
const COMPRESSED_FLAG: i32 = 0x1;
/// Topics the unique-id search skips: system topics never hold user messages.
const SYSTEM_TOPIC_PREFIXES: [&str; 9] = [
    "%RETRY%",
    "%DLQ%",
    "rmq_sys_",
    "RMQ_SYS_",
    "TBW102",
    "SCHEDULE_TOPIC_",
    "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC",
    "BenchmarkTest",
];

/// Whether `topic` is one of the broker's own (by SYSTEM_TOPIC_PREFIXES).
pub(crate) fn is_system_topic(topic: &str) -> bool {
    SYSTEM_TOPIC_PREFIXES
        .iter()
        .any(|prefix| topic.starts_with(prefix))
}

#[derive(Args, Debug)]
pub struct QueryByKeyArgs {
    #[arg(long, short = 't')]
    pub topic: String,
    #[arg(long, short = 'k')]
    pub key: String,
    /// Earliest store time: milliseconds, `now`, or `now-1h` (default: the beginning).
    #[arg(long)]
    pub begin: Option<String>,
    /// Latest store time (default: no limit).
    #[arg(long)]
    pub end: Option<String>,
    /// Messages asked of each broker.
    #[arg(long, default_value_t = QUERY_MESSAGES_DEFAULT)]
    pub max_num: u32,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    #[arg(long, short = 't')]
    pub topic: String,
    /// The message body (text).
    #[arg(long, short = 'p')]
    pub body: String,
    /// Keys, separated by spaces.
    #[arg(long, short = 'k')]
    pub keys: Option<String>,
    /// The tag.
    #[arg(long, short = 'c')]
    pub tags: Option<String>,
    /// Broker name to send to (default: one of the topic's).
    #[arg(long, short = 'b')]
    pub broker: Option<String>,
    /// Queue id on that broker (default: chosen by time).
    #[arg(long, short = 'i')]
    pub queue: Option<u32>,
}

/// One record found, with the broker it came from.
struct Found {
    broker_name: String,
    bytes: Vec<u8>,
}

fn host_text(addr: &SocketAddr) -> String {
    addr.to_string()
}

/// The offset msgId of a record: store host and commitlog offset (REMOTING.md §5.7).
fn offset_msg_id(message: &StoredMessage<'_>) -> String {
    record::offset_msg_id(message.store_host, message.physical_offset)
}

/// Printable text of the first `BODY_PREVIEW_BYTES` of a body.
fn body_preview(body: &[u8]) -> String {
    let shown = &body[..body.len().min(BODY_PREVIEW_BYTES)];
    let text: String = String::from_utf8_lossy(shown)
        .chars()
        .map(|c| if c.is_control() && c != '\n' { '.' } else { c })
        .collect();
    if body.len() > shown.len() {
        format!("{text}...")
    } else {
        text
    }
}

fn property<'a>(message: &StoredMessage<'a>, name: &str) -> Option<&'a str> {
    parse_properties(message.properties)
        .into_iter()
        .rev()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

fn message_json(found: &Found, message: &StoredMessage<'_>) -> Value {
    let properties: Map<String, Value> = parse_properties(message.properties)
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "topic": message.topic,
        "msgId": offset_msg_id(message),
        "uniqKey": property(message, "UNIQ_KEY"),
        "keys": property(message, "KEYS"),
        "tags": property(message, "TAGS"),
        "brokerName": found.broker_name,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "commitLogOffset": message.physical_offset,
        "storeHost": host_text(&message.store_host),
        "bornHost": host_text(&message.born_host),
        "storeTimestamp": message.store_timestamp_ms,
        "bornTimestamp": message.born_timestamp_ms,
        "sysFlag": message.sys_flag,
        "flag": message.flag,
        "reconsumeTimes": message.reconsume_times,
        "bodyLength": message.body.len(),
        "bodyCrc": message.body_crc,
        "compressed": message.sys_flag & COMPRESSED_FLAG != 0,
        "properties": properties,
        "bodyPreview": body_preview(message.body),
    })
}

fn message_text(found: &Found, message: &StoredMessage<'_>) -> String {
    let mut table = Table::new(&["Field", "Value"]);
    let mut row = |name: &str, value: String| table.row(vec![name.to_string(), value]);
    row("Topic", message.topic.to_string());
    row("Message ID", offset_msg_id(message));
    row(
        "Unique Key",
        property(message, "UNIQ_KEY").unwrap_or("-").to_string(),
    );
    row("Keys", property(message, "KEYS").unwrap_or("-").to_string());
    row("Tags", property(message, "TAGS").unwrap_or("-").to_string());
    row("Broker", found.broker_name.clone());
    row("Queue ID", message.queue_id.to_string());
    row("Queue Offset", message.queue_offset.to_string());
    row("CommitLog Offset", message.physical_offset.to_string());
    row("Store Host", host_text(&message.store_host));
    row("Born Host", host_text(&message.born_host));
    row("Store Time", format_time_ms(message.store_timestamp_ms));
    row("Born Time", format_time_ms(message.born_timestamp_ms));
    row("Reconsume Times", message.reconsume_times.to_string());
    row(
        "Sys Flag / Flag",
        format!("{} / {}", message.sys_flag, message.flag),
    );
    for (key, value) in parse_properties(message.properties) {
        row(&format!("Property {key}"), value.to_string());
    }
    let compressed = if message.sys_flag & COMPRESSED_FLAG != 0 {
        " (compressed)"
    } else {
        ""
    };
    row(
        "Body",
        format!(
            "{} bytes{compressed}: {}",
            message.body.len(),
            body_preview(message.body)
        ),
    );
    table.render()
}

/// The outcome listing `found` (already deduplicated and ordered).
fn messages_outcome(found: &[Found], extra: Map<String, Value>) -> anyhow::Result<Outcome> {
    let mut text = String::new();
    let mut messages = Vec::new();
    for item in found {
        let message = record::decode(&item.bytes)
            .map_err(|e| anyhow!("broker {} sent an unreadable record: {e}", item.broker_name))?;
        messages.push(message_json(item, &message));
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&message_text(item, &message));
    }
    if found.is_empty() {
        text.push_str("no message found\n");
    }
    let mut json = extra;
    json.insert("messages".into(), json!(messages));
    Ok(Outcome {
        json: Value::Object(json),
        text,
    })
}

/// QUERY_MESSAGE on every master of the topic; records whose UNIQ_KEY (unique) or KEYS word
/// is `key`, newest first, each record once.
fn query_topic(
    admin: &mut Admin,
    topic: &str,
    key: &str,
    unique: bool,
    range: (i64, i64),
    max_num: u32,
) -> anyhow::Result<Vec<Found>> {
    let masters = admin.topic_masters(topic)?;
    let (begin, end, max) = (
        range.0.to_string(),
        range.1.to_string(),
        max_num.to_string(),
    );
    let mut ext = vec![
        ("topic", topic),
        ("key", key),
        (
            "maxNum",
            if unique {
                QUERY_UNIQUE_KEY_MESSAGES
            } else {
                max.as_str()
            },
        ),
        ("beginTimestamp", begin.as_str()),
        ("endTimestamp", end.as_str()),
    ];
    if unique {
        ext.push(("_UNIQUE_KEY_QUERY", "true"));
    }
    let mut found: Vec<(i64, Found)> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut answered = 0;
    for broker in &masters {
        let reply = match admin.broker_call(&broker.addr, rc::QUERY_MESSAGE, &ext, &[]) {
            Ok(reply) => reply,
            Err(error) => {
                admin.warn(format!("{error:#}"));
                continue;
            }
        };
        match reply.code {
            response_code::SUCCESS => {}
            response_code::QUERY_NOT_FOUND => {
                answered += 1;
                continue;
            }
            _ => {
                admin.warn(format!(
                    "broker {} refused {}: {}",
                    broker.name,
                    request_name(rc::QUERY_MESSAGE),
                    reply.describe()
                ));
                continue;
            }
        }
        answered += 1;
        collect_matches(broker, &reply.body, key, unique, &mut seen, &mut found)?;
    }
    if answered == 0 && !masters.is_empty() {
        bail!("no broker of topic {topic} answered the query (see the warnings)");
    }
    found.sort_by_key(|(time, _)| std::cmp::Reverse(*time));
    Ok(found.into_iter().map(|(_, f)| f).collect())
}

/// Keeps the records of a QUERY_MESSAGE body that really carry `key` (brokers that check
/// nothing, like Java's, answer hash collisions too).
fn collect_matches(
    broker: &BrokerRef,
    body: &[u8],
    key: &str,
    unique: bool,
    seen: &mut BTreeSet<String>,
    found: &mut Vec<(i64, Found)>,
) -> anyhow::Result<()> {
    let mut at = 0;
    while at < body.len() {
        let message = record::decode(&body[at..]).map_err(|e| {
            anyhow!(
                "broker {} sent an unreadable query answer: {e}",
                broker.name
            )
        })?;
        let size = message.total_size as usize;
        let uniq = property(&message, "UNIQ_KEY");
        let keyed = property(&message, "KEYS").is_some_and(|k| k.split(' ').any(|w| w == key));
        let matches = uniq == Some(key) || (!unique && keyed);
        if matches && seen.insert(offset_msg_id(&message)) {
            let item = Found {
                broker_name: broker.name.clone(),
                bytes: body[at..at + size].to_vec(),
            };
            found.push((message.store_timestamp_ms, item));
        }
        at += size;
    }
    Ok(())
}

/// `queryMsgByKey`; JSON adds `"topic"` and `"key"` to the message list.
pub fn query_by_key(admin: &mut Admin, args: &QueryByKeyArgs) -> anyhow::Result<Outcome> {
    let now = now_ms();
    let begin = match &args.begin {
        Some(text) => parse_time_ms(text, now).map_err(|e| anyhow!(e))?,
        None => 0,
    };
    let end = match &args.end {
        Some(text) => parse_time_ms(text, now).map_err(|e| anyhow!(e))?,
        None => i64::MAX,
    };
    let found = query_topic(
        admin,
        &args.topic,
        &args.key,
        false,
        (begin, end),
        args.max_num,
    )?;
    let mut extra = Map::new();
    extra.insert("topic".into(), json!(args.topic));
    extra.insert("key".into(), json!(args.key));
    messages_outcome(&found, extra)
}

/// `queryMsgByUniqueKey`: an error when nothing carries that UNIQ_KEY.
pub fn query_by_unique_key(admin: &mut Admin, topic: &str, id: &str) -> anyhow::Result<Outcome> {
    let found = query_topic(admin, topic, id, true, (0, i64::MAX), 32)?;
    if found.is_empty() {
        bail!("no message with unique key {id} in topic {topic}");
    }
    let mut extra = Map::new();
    extra.insert("topic".into(), json!(topic));
    extra.insert("uniqKey".into(), json!(id));
    messages_outcome(&found, extra)
}

/// `queryMsgById`: an offset msgId naming a broker the name server knows is read there
/// (VIEW_MESSAGE_BY_ID); anything else is taken as a unique id (UNIQ_KEY, what producers
/// return as the msgId) and looked up in the topic, or in every non-system topic.
pub fn query_by_id(admin: &mut Admin, id: &str, topic: Option<&str>) -> anyhow::Result<Outcome> {
    let mut extra = Map::new();
    extra.insert("id".into(), json!(id));
    if let Some(found) = view_by_offset_id(admin, id)? {
        extra.insert("idKind".into(), json!("offsetMsgId"));
        return messages_outcome(&[found], extra);
    }
    let topics = match topic {
        Some(topic) => vec![topic.to_string()],
        None => user_topics(admin)?,
    };
    for topic in &topics {
        let found = query_topic(admin, topic, id, true, (0, i64::MAX), 32)?;
        if !found.is_empty() {
            extra.insert("idKind".into(), json!("uniqKey"));
            return messages_outcome(&found, extra);
        }
    }
    match topic {
        Some(topic) => bail!(
            "no message with id {id}: not an offset msgId of a known broker, and no message of \
             topic {topic} has it as unique key"
        ),
        None => bail!(
            "no message with id {id}: not an offset msgId of a known broker, and no message of \
             the {} topics searched has it as unique key (give --topic)",
            topics.len()
        ),
    }
}

fn view_by_offset_id(admin: &mut Admin, id: &str) -> anyhow::Result<Option<Found>> {
    let Some((addr, offset)) = record::parse_offset_msg_id(id) else {
        return Ok(None);
    };
    let info = admin.cluster_info()?;
    let addr = addr.to_string();
    // Only brokers we know: a unique id also decodes, to an address nobody listens on.
    let Some(broker) = super::brokers_of(&info, None, true)
        .into_iter()
        .find(|b| b.addr == addr)
    else {
        return Ok(None);
    };
    let offset_text = offset.to_string();
    let reply = admin.broker_call(
        &broker.addr,
        rc::VIEW_MESSAGE_BY_ID,
        &[("offset", &offset_text)],
        &[],
    )?;
    let valid = reply.is_success() && record::decode(&reply.body).is_ok();
    Ok(valid.then(|| Found {
        broker_name: broker.name.clone(),
        bytes: reply.body,
    }))
}

/// Every topic the name server lists, system topics left out, at most
/// `UNIQUE_ID_TOPIC_SCAN_MAX`.
fn user_topics(admin: &mut Admin) -> anyhow::Result<Vec<String>> {
    let reply = admin.namesrv_call(rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER, &[])?;
    if !reply.is_success() {
        bail!(
            "the name server refused the topic list: {}",
            reply.describe()
        );
    }
    let info = admin.cluster_info()?;
    let mut topics: Vec<String> = parse_topic_list(&reply.body)?
        .into_iter()
        .filter(|t| !is_system_topic(t))
        .filter(|t| {
            !info.cluster_addr_table.contains_key(t) && !info.broker_addr_table.contains_key(t)
        })
        .collect();
    topics.sort();
    if topics.len() > UNIQUE_ID_TOPIC_SCAN_MAX {
        admin.warn(format!(
            "{} topics: searching the first {UNIQUE_ID_TOPIC_SCAN_MAX} only (give --topic)",
            topics.len()
        ));
        topics.truncate(UNIQUE_ID_TOPIC_SCAN_MAX);
    }
    Ok(topics)
}

/// `queryMsgByOffset`: the message at one position of a queue (PULL_MESSAGE, one message).
pub fn query_by_offset(
    admin: &mut Admin,
    topic: &str,
    broker_name: &str,
    queue: u32,
    offset: u64,
) -> anyhow::Result<Outcome> {
    let masters = admin.topic_masters(topic)?;
    let Some(broker) = masters.iter().find(|b| b.name == broker_name).cloned() else {
        let names: Vec<&str> = masters.iter().map(|b| b.name.as_str()).collect();
        bail!("topic {topic} has no broker named {broker_name} (its brokers: {names:?})");
    };
    let (queue_text, offset_text) = (queue.to_string(), offset.to_string());
    let ext = [
        ("consumerGroup", TOOLS_CONSUMER_GROUP),
        ("topic", topic),
        ("queueId", queue_text.as_str()),
        ("queueOffset", offset_text.as_str()),
        ("maxMsgNums", "1"),
        ("sysFlag", "4"),
        ("commitOffset", "0"),
        ("suspendTimeoutMillis", "0"),
        ("subscription", "*"),
        ("subVersion", "0"),
        ("expressionType", "TAG"),
    ];
    let reply = admin.broker_call(&broker.addr, rc::PULL_MESSAGE, &ext, &[])?;
    if !reply.is_success() || reply.body.is_empty() {
        let bound = |key| reply.ext_i64(key).map_or("?".into(), |v| v.to_string());
        bail!(
            "no message at offset {offset} of queue {queue} of topic {topic} on broker \
             {broker_name}: {} (queue min offset {}, max offset {})",
            reply.describe(),
            bound("minOffset"),
            bound("maxOffset")
        );
    }
    let first = record::decode(&reply.body)
        .map_err(|e| anyhow!("broker {broker_name} sent an unreadable record: {e}"))?;
    let size = first.total_size as usize;
    let found = Found {
        broker_name: broker.name.clone(),
        bytes: reply.body[..size].to_vec(),
    };
    let mut extra = Map::new();
    extra.insert("topic".into(), json!(topic));
    messages_outcome(&[found], extra)
}

/// A client message id in the shape of RocketMQ's (32 hex characters): local IPv4, pid,
/// a per-process value, milliseconds and a counter.
fn new_unique_id() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xFFFF;
    let ip = u32::from(std::net::Ipv4Addr::LOCALHOST);
    let pid = std::process::id() & 0xFFFF;
    let now = now_ms() as u64;
    let salt = (now >> 32) as u32 ^ std::process::id().rotate_left(16);
    format!("{ip:08X}{pid:04X}{salt:08X}{:08X}{count:04X}", now as u32)
}

/// Where `sendMessage` sends: the named broker or one chosen by time, and the named queue
/// or one of its write queues chosen by time.
fn send_target(route: &TopicRouteData, args: &SendArgs) -> anyhow::Result<(BrokerRef, u32)> {
    let masters = route_masters(route);
    let broker = match &args.broker {
        Some(name) => masters
            .iter()
            .find(|b| &b.name == name)
            .cloned()
            .ok_or_else(|| anyhow!("topic {} has no broker named {name}", args.topic))?,
        None => masters
            .get(now_ms() as usize % masters.len().max(1))
            .cloned()
            .ok_or_else(|| anyhow!("topic {} has no master broker", args.topic))?,
    };
    let write_queues = route
        .queue_datas
        .iter()
        .find(|q| q.broker_name == broker.name)
        .map_or(1, |q| q.write_queue_nums.max(1));
    let queue = args
        .queue
        .unwrap_or((now_ms() as u64 % u64::from(write_queues)) as u32);
    Ok((broker, queue))
}

/// `sendMessage`: JSON `{"status","topic","brokerName","queueId","queueOffset","msgId",
/// "offsetMsgId"}` (msgId is the UNIQ_KEY, as producers report it). An unknown topic is
/// auto-created through TBW102 when the brokers allow it, as a producer's first send does.
pub fn send_message(admin: &mut Admin, args: &SendArgs) -> anyhow::Result<Outcome> {
    let route = match admin.route_if_any(&args.topic)? {
        Some(route) => route,
        None => admin.route_if_any(AUTO_CREATE_TOPIC)?.ok_or_else(|| {
            anyhow!(
                "unknown topic {}: the name server has no route for it, and no {AUTO_CREATE_TOPIC} \
                 to auto-create it from",
                args.topic
            )
        })?,
    };
    let (broker, queue) = send_target(&route, args)?;
    let unique_id = new_unique_id();
    let mut properties = format!("UNIQ_KEY\u{1}{unique_id}\u{2}WAIT\u{1}true\u{2}");
    if let Some(keys) = args.keys.as_deref().filter(|k| !k.is_empty()) {
        properties.push_str(&format!("KEYS\u{1}{keys}\u{2}"));
    }
    if let Some(tags) = args.tags.as_deref().filter(|t| !t.is_empty()) {
        properties.push_str(&format!("TAGS\u{1}{tags}\u{2}"));
    }
    let (queue_text, born) = (queue.to_string(), now_ms().to_string());
    let ext = [
        ("a", TOOLS_PRODUCER_GROUP),
        ("b", args.topic.as_str()),
        ("c", AUTO_CREATE_TOPIC),
        ("d", "4"),
        ("e", queue_text.as_str()),
        ("f", "0"),
        ("g", born.as_str()),
        ("h", "0"),
        ("i", properties.as_str()),
        ("j", "0"),
        ("k", "false"),
    ];
    let reply = admin.broker_expect(&broker, rc::SEND_MESSAGE_V2, &ext, args.body.as_bytes())?;
    let field = |key: &str| reply.ext.get(key).cloned().unwrap_or_default();
    let json = json!({
        "status": "SEND_OK",
        "topic": args.topic,
        "brokerName": broker.name,
        "queueId": reply.ext_i64("queueId").unwrap_or(i64::from(queue)),
        "queueOffset": reply.ext_i64("queueOffset"),
        "msgId": unique_id,
        "offsetMsgId": field("msgId"),
    });
    let text = format!(
        "SEND_OK topic {} broker {} queue {} offset {}\nmsgId (unique key): {unique_id}\noffsetMsgId: {}\n",
        args.topic,
        broker.name,
        field("queueId"),
        field("queueOffset"),
        field("msgId")
    );
    Ok(Outcome { json, text })
}
