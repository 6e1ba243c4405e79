//! A slave shard's copy of its master's metadata (RocketMQ's SlaveSynchronize): every
//! `SYNC_INTERVAL_MS` it asks the master shard's broker port for GET_ALL_TOPIC_CONFIG (21),
//! GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45) and
//! GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) and takes what it is given: topics and groups are
//! upserted, each queue's committed offset and each delay level's progress replaced by the
//! master's (as RocketMQ's putAll), so consumers that move to the slave resume near where
//! they were. Offsets clients committed on the slave while its master was away are kept over
//! the master's older ones and handed back to it (UPDATE_CONSUMER_OFFSET, 15) once it answers
//! again, so a group that stopped while reading from the slave resumes there on the master.
//! It also asks for the master's GET_BROKER_RUNTIME_INFO (28): its role and log end, what
//! `shardmq admin promote` tells the operator a promotion may lose.

use std::rc::Rc;
use std::time::Duration;

use crate::body::{ConsumerOffsetTable, SubscriptionGroupTable, TopicConfigTable};
use crate::broker::registration::NamesrvConnection;
use crate::broker::Broker;
use crate::remoting::{request_code, response_code};

/// How often a slave copies its master's metadata (RocketMQ: every 10 s).
pub const SYNC_INTERVAL_MS: u64 = 10_000;

/// Copies the master's metadata for as long as this shard is a slave.
pub async fn run(broker: Rc<Broker>) {
    let mut connection: Option<NamesrvConnection> = None;
    let mut failures = 0u64;
    // The first copy comes soon after the master is known.
    let mut wait = Duration::from_millis(1_000);
    while broker.ha.is_slave() {
        shards::runtime::sleep(wait).await;
        if !broker.ha.replicating() {
            // Promoted meanwhile (or being promoted): the old master's tables no longer apply.
            continue;
        }
        let master = *broker.ha.master.broker_address.borrow();
        let Some(master) = master else {
            continue;
        };
        wait = Duration::from_millis(SYNC_INTERVAL_MS);
        if connection.as_ref().is_none_or(|c| c.addr != master) {
            connection = Some(NamesrvConnection::new(master, broker.namesrv_tls.clone()));
        }
        let Some(connection) = connection.as_mut() else {
            continue;
        };
        match sync_all(&broker, connection).await {
            Ok(()) => failures = 0,
            Err(why) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(30) {
                    log::warn!(
                        "{}: cannot copy the master's metadata from {master}: {why}",
                        broker.identity.broker_name
                    );
                }
            }
        }
    }
}

/// How long after start a slave compares its shard count with its master's (both have
/// registered by then).
const SHARD_CHECK_DELAY_MS: u64 = 15_000;

/// Shard i of a slave copies shard i of its master: a master node with another number of
/// shards leaves shards uncopied or slave shards without a master. Shard 0 of a slave node
/// compares, once its master is known, the masters of `<base>-<i>` the namesrv lists with its
/// own shard count, and says so (an error line, and `haShardCountMismatch` in brokerStatus)
/// while they differ.
pub async fn check_shard_count(
    broker: Rc<Broker>,
    namesrvs: Vec<std::net::SocketAddr>,
    base: String,
    shards: usize,
) {
    shards::runtime::sleep(Duration::from_millis(SHARD_CHECK_DELAY_MS)).await;
    let prefix = format!("{base}-");
    while broker.ha.is_slave() {
        for namesrv in &namesrvs {
            let mut connection = NamesrvConnection::new(*namesrv, broker.namesrv_tls.clone());
            let Ok(body) = fetch(
                &broker,
                &mut connection,
                request_code::GET_BROKER_CLUSTER_INFO,
            )
            .await
            else {
                continue;
            };
            let Ok(info) = crate::body::ClusterInfo::parse(&body) else {
                continue;
            };
            let masters = info
                .broker_addr_table
                .iter()
                .filter(|(name, data)| {
                    let index = name.strip_prefix(&prefix);
                    index.is_some_and(|i| i.parse::<usize>().is_ok())
                        && data.broker_addrs.contains_key(&0)
                })
                .count();
            let note = (masters != shards && masters > 0).then(|| {
                format!(
                    "the master node runs {masters} shard(s) ({prefix}N with brokerId 0), this \
                     slave node {shards}: shard i copies shard i, so run both with the same \
                     --shards"
                )
            });
            if let Some(note) = &note {
                log::error!("{}: {note}", broker.identity.broker_name);
            }
            *broker.ha.master.shard_mismatch.borrow_mut() = note;
            break;
        }
        shards::runtime::sleep(Duration::from_millis(60_000)).await;
    }
}

async fn fetch(
    broker: &Broker,
    connection: &mut NamesrvConnection,
    code: i32,
) -> Result<Vec<u8>, String> {
    let answer = connection
        .call_for_fields(|out, opaque| {
            broker.encode_namesrv_request(out, code, opaque, Vec::new(), &[])
        })
        .await?;
    if answer.code != response_code::SUCCESS {
        return Err(format!(
            "request {code}: code {} {}",
            answer.code,
            answer.remark.unwrap_or_default()
        ));
    }
    Ok(answer.body)
}

/// The master's GET_BROKER_RUNTIME_INFO; keeps its role and log end (`last_runtime`).
pub async fn master_runtime(
    broker: &Broker,
    connection: &mut NamesrvConnection,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let body = fetch(broker, connection, request_code::GET_BROKER_RUNTIME_INFO).await?;
    let info = crate::body::parse_kv_table(&body).map_err(|e| format!("runtime info: {e}"))?;
    let role = info.get("brokerRole").cloned().unwrap_or_default();
    let end = info
        .get("commitLogMaxOffset")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    *broker.ha.master.last_runtime.borrow_mut() =
        Some((role, end, shards::runtime::monotonic_ms()));
    Ok(info)
}

/// One copy of all four tables.
pub async fn sync_all(broker: &Broker, connection: &mut NamesrvConnection) -> Result<(), String> {
    master_runtime(broker, connection).await?;
    let topics = fetch(broker, connection, request_code::GET_ALL_TOPIC_CONFIG).await?;
    let topics = TopicConfigTable::parse(&topics).map_err(|e| format!("topics: {e}"))?;
    {
        let mut table = broker.topics.borrow_mut();
        let mut changed = Vec::new();
        for config in topics.topics.into_values() {
            let name = config.topic_name.clone();
            if table.upsert(config) {
                changed.push(name);
            }
        }
        if !changed.is_empty() {
            table.persist();
        }
        drop(table);
        // The namesrv routes these topics to this slave too (clients read from it when
        // the master is gone).
        for topic in &changed {
            broker.registration.topic_changed(topic);
        }
    }
    let offsets = fetch(broker, connection, request_code::GET_ALL_CONSUMER_OFFSET).await?;
    let offsets = ConsumerOffsetTable::parse(&offsets).map_err(|e| format!("offsets: {e}"))?;
    let handed_back = take_offsets(broker, offsets);
    for ((group, topic, queue_id), offset) in handed_back {
        let fields = vec![
            ("consumerGroup", group.clone()),
            ("topic", topic.clone()),
            ("queueId", queue_id.to_string()),
            ("commitOffset", offset.to_string()),
        ];
        let answer = connection
            .call_for_fields(|out, opaque| {
                broker.encode_namesrv_request(
                    out,
                    request_code::UPDATE_CONSUMER_OFFSET,
                    opaque,
                    fields.clone(),
                    &[],
                )
            })
            .await?;
        if answer.code == response_code::SUCCESS {
            log::info!(
                "{}: handed the offset {offset} of {group} on {topic}:{queue_id}, committed \
                 here while the master was away, back to the master",
                broker.identity.broker_name
            );
        }
    }
    let delays = fetch(broker, connection, request_code::GET_ALL_DELAY_OFFSET).await?;
    let delays: serde_json::Value =
        serde_json::from_slice(&delays).map_err(|e| format!("delay offsets: {e}"))?;
    if let Some(levels) = delays.get("offsetTable").and_then(|t| t.as_object()) {
        let mut schedule = broker.schedule.borrow_mut();
        for (level, offset) in levels {
            if let (Ok(level), Some(offset)) = (level.parse::<u32>(), offset.as_u64()) {
                if schedule.level_offsets.insert(level, offset) != Some(offset) {
                    schedule.dirty = true;
                }
            }
        }
    }
    let groups = fetch(
        broker,
        connection,
        request_code::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    )
    .await?;
    let groups = SubscriptionGroupTable::parse(&groups).map_err(|e| format!("groups: {e}"))?;
    {
        let mut table = broker.groups.borrow_mut();
        for config in groups.groups.into_values() {
            if table.get(&config.group_name) != Some(&config) {
                table.upsert(config).map_err(|e| format!("group: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Takes the master's committed offsets, except where a client committed a later one here
/// while the master was away: those are kept, and returned to be handed back to the master.
/// A local commit the master has caught up with is forgotten.
fn take_offsets(
    broker: &Broker,
    offsets: ConsumerOffsetTable,
) -> Vec<((String, String, u32), i64)> {
    let mut local = broker.ha.master.local_commits.borrow_mut();
    let mut table = broker.offsets.borrow_mut();
    for (key, queues) in offsets.offsets {
        let Some((topic, group)) = key.split_once('@') else {
            continue;
        };
        for (queue_id, offset) in queues {
            let key = (group.to_string(), topic.to_string(), queue_id);
            match local.get(&key) {
                Some(&ours) if ours > offset => continue,
                Some(_) => {
                    local.remove(&key);
                }
                None => {}
            }
            table.commit(group, topic, queue_id, offset);
        }
    }
    local
        .iter()
        .map(|(key, &offset)| (key.clone(), offset))
        .collect()
}
