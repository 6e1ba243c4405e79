//! Topic commands: `updateTopic`, `deleteTopic`, `topicList`, `topicRoute`, `topicStatus`.

use anyhow::bail;
use clap::Args;
use serde_json::{json, Value};

use crate::body::{parse_topic_list, TopicRouteData, TopicStatsTable};
use crate::remoting::request_code as rc;

use super::table::{format_time_ms, Table};
use super::{Admin, BrokerRef, Outcome, Target};

/// Queues of a topic `updateTopic` creates when not told (mqadmin's default).
pub const TOPIC_QUEUES_DEFAULT: u32 = 8;
/// Read and write permission (RocketMQ's PermName).
pub const PERM_READ_WRITE: u32 = 6;

#[derive(Args, Debug)]
pub struct UpdateTopicArgs {
    #[arg(long, short = 't')]
    pub topic: String,
    #[command(flatten)]
    pub target: Target,
    /// Read queues per broker.
    #[arg(long, short = 'r', default_value_t = TOPIC_QUEUES_DEFAULT)]
    pub read_queues: u32,
    /// Write queues per broker.
    #[arg(long, short = 'w', default_value_t = TOPIC_QUEUES_DEFAULT)]
    pub write_queues: u32,
    /// Permission bits: 2 write, 4 read, 6 both.
    #[arg(long, short = 'p', default_value_t = PERM_READ_WRITE)]
    pub perm: u32,
    /// An ordered topic.
    #[arg(long, short = 'o')]
    pub order: bool,
}

/// JSON: `{"topic","readQueueNums","writeQueueNums","perm","brokers":[{"brokerName","addr"}]}`.
pub fn update_topic(admin: &mut Admin, args: &UpdateTopicArgs) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(&args.target, false)?;
    let (read, write, perm) = (
        args.read_queues.to_string(),
        args.write_queues.to_string(),
        args.perm.to_string(),
    );
    let ext = [
        ("topic", args.topic.as_str()),
        ("defaultTopic", "TBW102"),
        ("readQueueNums", read.as_str()),
        ("writeQueueNums", write.as_str()),
        ("perm", perm.as_str()),
        ("topicFilterType", "SINGLE_TAG"),
        ("topicSysFlag", "0"),
        ("order", if args.order { "true" } else { "false" }),
    ];
    let mut text = String::new();
    let mut done = Vec::new();
    for broker in &brokers {
        admin.broker_expect(broker, rc::UPDATE_AND_CREATE_TOPIC, &ext, &[])?;
        text.push_str(&format!(
            "create topic {} on {} ({}): success\n",
            args.topic, broker.name, broker.addr
        ));
        done.push(json!({ "brokerName": broker.name, "addr": broker.addr }));
    }
    Ok(Outcome {
        json: json!({
            "topic": args.topic,
            "readQueueNums": args.read_queues,
            "writeQueueNums": args.write_queues,
            "perm": args.perm,
            "brokers": done,
        }),
        text,
    })
}

/// JSON: `{"topic","brokers":[{"brokerName","addr"}],"namesrv":true}`.
pub fn delete_topic(
    admin: &mut Admin,
    topic: &str,
    cluster: Option<&str>,
) -> anyhow::Result<Outcome> {
    let masters: Vec<BrokerRef> = admin
        .topic_masters(topic)?
        .into_iter()
        .filter(|b| cluster.is_none_or(|c| c == b.cluster))
        .collect();
    if masters.is_empty() {
        bail!(
            "topic {topic} has no broker in cluster {}",
            cluster.unwrap_or("")
        );
    }
    let mut text = String::new();
    let mut done = Vec::new();
    for broker in &masters {
        admin.broker_expect(broker, rc::DELETE_TOPIC_IN_BROKER, &[("topic", topic)], &[])?;
        text.push_str(&format!(
            "delete topic {topic} from {} ({}): success\n",
            broker.name, broker.addr
        ));
        done.push(json!({ "brokerName": broker.name, "addr": broker.addr }));
    }
    let mut ext = vec![("topic", topic)];
    if let Some(cluster) = cluster {
        ext.push(("clusterName", cluster));
    }
    let reply = admin.namesrv_call(rc::DELETE_TOPIC_IN_NAMESRV, &ext)?;
    if !reply.is_success() {
        bail!(
            "the name server refused to delete topic {topic}: {}",
            reply.describe()
        );
    }
    text.push_str(&format!(
        "delete topic {topic} from the name server: success\n"
    ));
    Ok(Outcome {
        json: json!({ "topic": topic, "brokers": done, "namesrv": true }),
        text,
    })
}

/// JSON: `{"topics":[..]}` (sorted).
pub fn topic_list(admin: &mut Admin, cluster: Option<&str>) -> anyhow::Result<Outcome> {
    let reply = match cluster {
        Some(cluster) => {
            let target = Target {
                broker: None,
                cluster: Some(cluster.to_string()),
            };
            admin.targets(&target, false)?;
            admin.namesrv_call(rc::GET_TOPICS_BY_CLUSTER, &[("cluster", cluster)])?
        }
        None => admin.namesrv_call(rc::GET_ALL_TOPIC_LIST_FROM_NAMESERVER, &[])?,
    };
    if !reply.is_success() {
        bail!(
            "the name server refused the topic list: {}",
            reply.describe()
        );
    }
    let mut topics = parse_topic_list(&reply.body)?;
    topics.sort();
    let mut text = String::new();
    for topic in &topics {
        text.push_str(topic);
        text.push('\n');
    }
    Ok(Outcome {
        json: json!({ "topics": topics }),
        text,
    })
}

/// JSON: the route as the name server gives it (TopicRouteData, keys quoted).
pub fn topic_route(admin: &mut Admin, topic: &str) -> anyhow::Result<Outcome> {
    let route = admin.route(topic)?;
    Ok(Outcome {
        json: serde_json::from_slice::<Value>(&route.encode())?,
        text: route_text(&route),
    })
}

fn route_text(route: &TopicRouteData) -> String {
    let mut brokers = Table::new(&["Broker Name", "Cluster", "BID", "Addr"]);
    for data in &route.broker_datas {
        for (id, addr) in &data.broker_addrs {
            brokers.row(vec![
                data.broker_name.clone(),
                data.cluster.clone(),
                id.to_string(),
                addr.clone(),
            ]);
        }
    }
    let mut queues = Table::new(&["Broker Name", "Read Queues", "Write Queues", "Perm"]);
    for queue in &route.queue_datas {
        queues.row(vec![
            queue.broker_name.clone(),
            queue.read_queue_nums.to_string(),
            queue.write_queue_nums.to_string(),
            queue.perm.to_string(),
        ]);
    }
    format!("{}\n{}", brokers.render(), queues.render())
}

/// JSON: `{"topic","queues":[{"brokerName","queueId","minOffset","maxOffset",
/// "lastUpdateTimestamp"}]}`, sorted by broker name and queue id.
pub fn topic_status(admin: &mut Admin, topic: &str) -> anyhow::Result<Outcome> {
    let masters = admin.topic_masters(topic)?;
    let mut queues = Vec::new();
    let mut answered = 0;
    for broker in &masters {
        let reply = admin.broker_expect(broker, rc::GET_TOPIC_STATS_INFO, &[("topic", topic)], &[]);
        match reply.and_then(|r| Ok(TopicStatsTable::parse(&r.body)?)) {
            Ok(stats) => {
                answered += 1;
                queues.extend(stats.offset_table);
            }
            Err(error) => admin.warn(format!("{error:#}")),
        }
    }
    if answered == 0 {
        bail!("no broker of topic {topic} answered GET_TOPIC_STATS_INFO (see the warnings)");
    }
    queues.sort_by(|a, b| (&a.0.broker_name, a.0.queue_id).cmp(&(&b.0.broker_name, b.0.queue_id)));
    let mut table = Table::new(&[
        "Broker Name",
        "QID",
        "Min Offset",
        "Max Offset",
        "Last Updated",
    ]);
    let mut entries = Vec::new();
    for (queue, offset) in &queues {
        table.row(vec![
            queue.broker_name.clone(),
            queue.queue_id.to_string(),
            offset.min_offset.to_string(),
            offset.max_offset.to_string(),
            format_time_ms(offset.last_update_timestamp),
        ]);
        entries.push(json!({
            "brokerName": queue.broker_name,
            "queueId": queue.queue_id,
            "minOffset": offset.min_offset,
            "maxOffset": offset.max_offset,
            "lastUpdateTimestamp": offset.last_update_timestamp,
        }));
    }
    Ok(Outcome {
        json: json!({ "topic": topic, "queues": entries }),
        text: table.render(),
    })
}
