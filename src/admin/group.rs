//! Consumer-group commands: `updateSubGroup`, `deleteSubGroup`, `subGroupList`,
//! `consumerProgress`, `resetOffsetByTime`.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use clap::{ArgAction, Args};
use serde_json::{json, Map, Value};

use crate::body::{
    parse_subscription_group_table, ConsumeStats, ConsumerConnection, MessageQueue, ResetOffsetBody,
};
use crate::remoting::{request_code as rc, response_code};

use super::table::{format_time_ms, parse_time_ms, Table};
use super::{now_ms, request_name, route_masters, Admin, BrokerRef, Outcome, Target};

const RETRY_TOPIC_PREFIX: &str = "%RETRY%";
const DLQ_TOPIC_PREFIX: &str = "%DLQ%";

#[derive(Args, Debug)]
pub struct UpdateSubGroupArgs {
    #[arg(long, short = 'g')]
    pub group: String,
    #[command(flatten)]
    pub target: Target,
    /// Whether the group may consume.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub consume_enable: bool,
    /// Whether a new group starts from the first offset.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub consume_from_min_enable: bool,
    /// Whether broadcast consumption is allowed.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub broadcast_enable: bool,
    /// Whether the group consumes orderly.
    #[arg(long, default_value_t = false, action = ArgAction::Set)]
    pub orderly: bool,
    /// Queues of the group's retry topic.
    #[arg(long, default_value_t = 1)]
    pub retry_queues: u32,
    /// Retries before a message goes to the dead-letter queue.
    #[arg(long, default_value_t = 16)]
    pub retry_max_times: u32,
}

/// JSON: `{"group","brokers":[{"brokerName","addr"}],"config":{SubscriptionGroupConfig}}`.
pub fn update_sub_group(admin: &mut Admin, args: &UpdateSubGroupArgs) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(&args.target, false)?;
    let config = json!({
        "brokerId": 0,
        "consumeBroadcastEnable": args.broadcast_enable,
        "consumeEnable": args.consume_enable,
        "consumeFromMinEnable": args.consume_from_min_enable,
        "consumeMessageOrderly": args.orderly,
        "consumeTimeoutMinute": 15,
        "groupName": args.group,
        "groupSysFlag": 0,
        "notifyConsumerIdsChangedEnable": true,
        "retryMaxTimes": args.retry_max_times,
        "retryQueueNums": args.retry_queues,
        "whichBrokerWhenConsumeSlowly": 1,
    });
    let body = serde_json::to_vec(&config)?;
    let mut text = String::new();
    let mut done = Vec::new();
    for broker in &brokers {
        admin.broker_expect(broker, rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, &[], &body)?;
        text.push_str(&format!(
            "create subscription group {} on {} ({}): success\n",
            args.group, broker.name, broker.addr
        ));
        done.push(json!({ "brokerName": broker.name, "addr": broker.addr }));
    }
    Ok(Outcome {
        json: json!({ "group": args.group, "brokers": done, "config": config }),
        text,
    })
}

/// JSON: `{"group","brokers":[{"brokerName","addr"}],"removeOffset"}`. The group's retry and
/// DLQ topics go too (as mqadmin does); failing to drop those is only a warning.
pub fn delete_sub_group(
    admin: &mut Admin,
    group: &str,
    target: &Target,
    remove_offset: bool,
) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(target, false)?;
    let clean = if remove_offset { "true" } else { "false" };
    let mut text = String::new();
    let mut done = Vec::new();
    for broker in &brokers {
        let ext = [("groupName", group), ("cleanOffset", clean)];
        admin.broker_expect(broker, rc::DELETE_SUBSCRIPTIONGROUP, &ext, &[])?;
        text.push_str(&format!(
            "delete subscription group {group} from {} ({}): success\n",
            broker.name, broker.addr
        ));
        done.push(json!({ "brokerName": broker.name, "addr": broker.addr }));
    }
    for topic in [
        format!("{RETRY_TOPIC_PREFIX}{group}"),
        format!("{DLQ_TOPIC_PREFIX}{group}"),
    ] {
        for broker in &brokers {
            let ext = [("topic", topic.as_str())];
            if let Err(error) = admin.broker_expect(broker, rc::DELETE_TOPIC_IN_BROKER, &ext, &[]) {
                admin.warn(format!("{error:#}"));
            }
        }
        match admin.namesrv_call(rc::DELETE_TOPIC_IN_NAMESRV, &[("topic", topic.as_str())]) {
            Ok(reply) if reply.is_success() => {}
            Ok(reply) => admin.warn(format!(
                "the name server refused to delete topic {topic}: {}",
                reply.describe()
            )),
            Err(error) => admin.warn(format!("{error:#}")),
        }
    }
    Ok(Outcome {
        json: json!({ "group": group, "brokers": done, "removeOffset": remove_offset }),
        text,
    })
}

/// JSON: `{"groups":[{"groupName","brokers":[..],"config":{..}}]}` (sorted by name).
pub fn sub_group_list(admin: &mut Admin, target: &Target) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(target, false)?;
    let mut groups: BTreeMap<String, (Vec<String>, Value)> = BTreeMap::new();
    for broker in &brokers {
        let reply = admin.broker_expect(broker, rc::GET_ALL_SUBSCRIPTIONGROUP_CONFIG, &[], &[])?;
        let table = parse_subscription_group_table(&reply.body).map_err(|e| {
            anyhow!(
                "broker {} sent an unreadable subscription group table: {e}",
                broker.name
            )
        })?;
        for (name, config) in table {
            let entry = groups.entry(name).or_insert_with(|| (Vec::new(), config));
            entry.0.push(broker.name.clone());
        }
    }
    let mut table = Table::new(&[
        "Group",
        "Consume",
        "Broadcast",
        "Retry Queues",
        "Retry Max Times",
        "Brokers",
    ]);
    let mut entries = Vec::new();
    for (name, (names, config)) in groups {
        let field = |key: &str| config.get(key).map_or("-".into(), |v| v.to_string());
        table.row(vec![
            name.clone(),
            field("consumeEnable"),
            field("consumeBroadcastEnable"),
            field("retryQueueNums"),
            field("retryMaxTimes"),
            names.join(","),
        ]);
        entries.push(json!({ "groupName": name, "brokers": names, "config": config }));
    }
    Ok(Outcome {
        json: json!({ "groups": entries }),
        text: table.render(),
    })
}

/// The brokers that hold a group's progress: the topic's, else its retry topic's, else every
/// master.
fn progress_brokers(
    admin: &mut Admin,
    group: &str,
    topic: Option<&str>,
) -> anyhow::Result<Vec<BrokerRef>> {
    if let Some(topic) = topic {
        return admin.topic_masters(topic);
    }
    match admin.route_if_any(&format!("{RETRY_TOPIC_PREFIX}{group}"))? {
        Some(route) => Ok(route_masters(&route)),
        None => admin.targets(&Target::default(), false),
    }
}

/// The group's clients, from the first broker that knows them online.
fn group_connection(
    admin: &mut Admin,
    group: &str,
    brokers: &[BrokerRef],
) -> Option<ConsumerConnection> {
    for broker in brokers {
        let reply = admin.broker_call(
            &broker.addr,
            rc::GET_CONSUMER_CONNECTION_LIST,
            &[("consumerGroup", group)],
            &[],
        );
        match reply {
            Ok(reply) if reply.is_success() => match ConsumerConnection::parse(&reply.body) {
                Ok(connection) => return Some(connection),
                Err(error) => admin.warn(format!("broker {}: {error}", broker.name)),
            },
            Ok(reply) if reply.code == response_code::CONSUMER_NOT_ONLINE => {}
            Ok(reply) => admin.warn(format!(
                "broker {} refused {}: {}",
                broker.name,
                request_name(rc::GET_CONSUMER_CONNECTION_LIST),
                reply.describe()
            )),
            Err(error) => admin.warn(format!("{error:#}")),
        }
    }
    None
}

/// JSON: `{"group","consumeTps","totalLag","queues":[{"topic","brokerName","queueId",
/// "brokerOffset","consumerOffset","lag","lastTimestamp"}],"online","clients":[{"clientId",
/// "clientAddr","language","version"}],"subscriptions":[{"topic","subString"}]}`.
pub fn consumer_progress(
    admin: &mut Admin,
    group: &str,
    topic: Option<&str>,
) -> anyhow::Result<Outcome> {
    let brokers = progress_brokers(admin, group, topic)?;
    let mut stats = ConsumeStats::default();
    let mut ext = vec![("consumerGroup", group)];
    if let Some(topic) = topic {
        ext.push(("topic", topic));
    }
    for broker in &brokers {
        let reply = admin.broker_expect(broker, rc::GET_CONSUME_STATS, &ext, &[]);
        match reply.and_then(|r| Ok(ConsumeStats::parse(&r.body)?)) {
            Ok(found) => {
                stats.consume_tps += found.consume_tps;
                stats.offset_table.extend(found.offset_table);
            }
            Err(error) => admin.warn(format!("{error:#}")),
        }
    }
    let connection = group_connection(admin, group, &brokers);
    if stats.offset_table.is_empty() && connection.is_none() {
        bail!(
            "unknown consumer group {group}: no broker reports progress for it{} and none of \
             its clients is online",
            topic.map(|t| format!(" on topic {t}")).unwrap_or_default()
        );
    }
    let key = |q: &MessageQueue| (q.topic.clone(), q.broker_name.clone(), q.queue_id);
    stats.offset_table.sort_by_key(|(queue, _)| key(queue));
    Ok(progress_outcome(group, &stats, connection.as_ref()))
}

fn progress_outcome(
    group: &str,
    stats: &ConsumeStats,
    connection: Option<&ConsumerConnection>,
) -> Outcome {
    let mut table = Table::new(&[
        "Topic",
        "Broker Name",
        "QID",
        "Broker Offset",
        "Consumer Offset",
        "Diff",
        "LastTime",
    ]);
    let mut queues = Vec::new();
    for (queue, offsets) in &stats.offset_table {
        let lag = (offsets.broker_offset - offsets.consumer_offset).max(0);
        table.row(vec![
            queue.topic.clone(),
            queue.broker_name.clone(),
            queue.queue_id.to_string(),
            offsets.broker_offset.to_string(),
            offsets.consumer_offset.to_string(),
            lag.to_string(),
            format_time_ms(offsets.last_timestamp),
        ]);
        queues.push(json!({
            "topic": queue.topic,
            "brokerName": queue.broker_name,
            "queueId": queue.queue_id,
            "brokerOffset": offsets.broker_offset,
            "consumerOffset": offsets.consumer_offset,
            "lag": lag,
            "lastTimestamp": offsets.last_timestamp,
        }));
    }
    let mut text = table.render();
    text.push_str(&format!(
        "\nConsume TPS: {:.2}\nConsume Diff Total: {}\n",
        stats.consume_tps,
        stats.total_lag()
    ));
    let mut json = Map::new();
    json.insert("group".into(), json!(group));
    json.insert("consumeTps".into(), json!(stats.consume_tps));
    json.insert("totalLag".into(), json!(stats.total_lag()));
    json.insert("queues".into(), json!(queues));
    json.insert("online".into(), json!(connection.is_some()));
    match connection {
        Some(connection) => clients_section(connection, &mut text, &mut json),
        None => {
            text.push_str("\nNo client of the group is online.\n");
            json.insert("clients".into(), json!([]));
            json.insert("subscriptions".into(), json!([]));
        }
    }
    Outcome {
        json: Value::Object(json),
        text,
    }
}

/// The online group's clients and subscriptions, in text and JSON.
fn clients_section(
    connection: &ConsumerConnection,
    text: &mut String,
    json: &mut Map<String, Value>,
) {
    let mut clients = Table::new(&["Client Id", "Client Addr", "Language", "Version"]);
    for client in &connection.connections {
        clients.row(vec![
            client.client_id.clone(),
            client.client_addr.clone(),
            client.language.clone(),
            client.version.to_string(),
        ]);
    }
    text.push_str(&format!(
        "\nClients ({}):\n{}",
        connection.connections.len(),
        clients.render()
    ));
    json.insert(
        "consumeType".into(),
        json!(connection.consume_type.name_str()),
    );
    json.insert(
        "messageModel".into(),
        json!(connection.message_model.name_str()),
    );
    json.insert(
        "consumeFromWhere".into(),
        json!(connection.consume_from_where.name_str()),
    );
    let clients: Vec<Value> = connection
        .connections
        .iter()
        .map(|c| {
            json!({
                "clientId": c.client_id,
                "clientAddr": c.client_addr,
                "language": c.language,
                "version": c.version,
            })
        })
        .collect();
    let subscriptions: Vec<Value> = connection
        .subscriptions
        .iter()
        .map(|s| json!({ "topic": s.topic, "subString": s.sub_string }))
        .collect();
    json.insert("clients".into(), json!(clients));
    json.insert("subscriptions".into(), json!(subscriptions));
}

/// JSON: `{"group","topic","timestamp","offline","queues":[{"brokerName","queueId",
/// "offset"}]}`. Brokers reset through INVOKE_BROKER_TO_RESET_OFFSET, which also tells the
/// group's online clients; a broker answering CONSUMER_NOT_ONLINE gets the offline way
/// (SEARCH_OFFSET_BY_TIMESTAMP + UPDATE_CONSUMER_OFFSET per queue), as mqadmin does.
pub fn reset_offset_by_time(
    admin: &mut Admin,
    group: &str,
    topic: &str,
    timestamp: &str,
    force: bool,
) -> anyhow::Result<Outcome> {
    let request = ResetRequest {
        group,
        topic,
        timestamp_ms: parse_time_ms(timestamp, now_ms()).map_err(|e| anyhow!(e))?,
        force,
    };
    let route = admin.route(topic)?;
    let (timestamp_text, force_text) = (request.timestamp_ms.to_string(), force.to_string());
    let ext = [
        ("topic", topic),
        ("group", group),
        ("timestamp", timestamp_text.as_str()),
        ("isForce", force_text.as_str()),
    ];
    let mut reset: Vec<(MessageQueue, i64)> = Vec::new();
    let mut offline = false;
    for broker in &route_masters(&route) {
        let reply =
            admin.broker_call(&broker.addr, rc::INVOKE_BROKER_TO_RESET_OFFSET, &ext, &[])?;
        match reply.code {
            response_code::SUCCESS => {
                reset.extend(ResetOffsetBody::parse(&reply.body)?.offset_table);
            }
            response_code::CONSUMER_NOT_ONLINE => {
                offline = true;
                let queues = route
                    .queue_datas
                    .iter()
                    .find(|q| q.broker_name == broker.name)
                    .map_or(0, |q| q.read_queue_nums);
                for queue_id in 0..queues {
                    let queue = MessageQueue {
                        topic: topic.to_string(),
                        broker_name: broker.name.clone(),
                        queue_id,
                    };
                    if let Some(offset) = reset_offline(admin, broker, &request, &queue)? {
                        reset.push((queue, offset));
                    }
                }
            }
            _ => bail!(
                "broker {} ({}) refused {}: {}",
                broker.name,
                broker.addr,
                request_name(rc::INVOKE_BROKER_TO_RESET_OFFSET),
                reply.describe()
            ),
        }
    }
    Ok(reset_outcome(&request, offline, reset))
}

/// What `resetOffsetByTime` was asked.
struct ResetRequest<'a> {
    group: &'a str,
    topic: &'a str,
    timestamp_ms: i64,
    force: bool,
}

fn reset_outcome(
    request: &ResetRequest<'_>,
    offline: bool,
    mut reset: Vec<(MessageQueue, i64)>,
) -> Outcome {
    reset.sort_by(|a, b| (&a.0.broker_name, a.0.queue_id).cmp(&(&b.0.broker_name, b.0.queue_id)));
    let mut table = Table::new(&["Broker Name", "QID", "Offset"]);
    let mut queues = Vec::new();
    for (queue, offset) in &reset {
        table.row(vec![
            queue.broker_name.clone(),
            queue.queue_id.to_string(),
            offset.to_string(),
        ]);
        queues.push(json!({
            "brokerName": queue.broker_name,
            "queueId": queue.queue_id,
            "offset": offset,
        }));
    }
    let (group, topic, timestamp_ms) = (request.group, request.topic, request.timestamp_ms);
    let when = if offline {
        " while the group is offline"
    } else {
        ""
    };
    Outcome {
        json: json!({
            "group": group,
            "topic": topic,
            "timestamp": timestamp_ms,
            "offline": offline,
            "queues": queues,
        }),
        text: format!(
            "reset group {group} on topic {topic} to {} ({timestamp_ms}){when}\n{}",
            format_time_ms(timestamp_ms),
            table.render()
        ),
    }
}

/// One queue reset the offline way; None when the offset would move forward without force.
fn reset_offline(
    admin: &mut Admin,
    broker: &BrokerRef,
    request: &ResetRequest<'_>,
    queue: &MessageQueue,
) -> anyhow::Result<Option<i64>> {
    let group = request.group;
    let queue_id = queue.queue_id.to_string();
    let timestamp = request.timestamp_ms.to_string();
    let search = [
        ("topic", queue.topic.as_str()),
        ("queueId", queue_id.as_str()),
        ("timestamp", timestamp.as_str()),
    ];
    let found = admin.broker_expect(broker, rc::SEARCH_OFFSET_BY_TIMESTAMP, &search, &[])?;
    let offset = found.ext_i64("offset").ok_or_else(|| {
        anyhow!(
            "broker {} answered an offset search without offset",
            broker.name
        )
    })?;
    let query = [
        ("consumerGroup", group),
        ("topic", queue.topic.as_str()),
        ("queueId", queue_id.as_str()),
    ];
    let current = admin.broker_call(&broker.addr, rc::QUERY_CONSUMER_OFFSET, &query, &[])?;
    let current = current
        .is_success()
        .then(|| current.ext_i64("offset"))
        .flatten();
    if !request.force && current.is_some_and(|c| offset > c) {
        return Ok(None);
    }
    let commit = offset.to_string();
    let update = [
        ("consumerGroup", group),
        ("topic", queue.topic.as_str()),
        ("queueId", queue_id.as_str()),
        ("commitOffset", commit.as_str()),
    ];
    admin.broker_expect(broker, rc::UPDATE_CONSUMER_OFFSET, &update, &[])?;
    Ok(Some(offset))
}
