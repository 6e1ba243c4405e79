//! What the operator's tools ask a broker: GET_BROKER_RUNTIME_INFO (28), GET_TOPIC_STATS_INFO
//! (202), GET_CONSUME_STATS (208).
//!
//! Retention shows in them: a topic's `minOffset` is the first offset still held, and
//! GET_CONSUME_STATS reports a consumer offset below it as the minimum (where the consumer's
//! next pull moves it), so the lag counts only messages that can still be consumed.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use shards::store::{record, Store};

use crate::body::{self, ConsumeStats, MessageQueue, OffsetWrapper, TopicOffset, TopicStatsTable};
use crate::broker::schedule::SCHEDULE_TOPIC;
use crate::broker::{store_stats, Broker};
use crate::error::RequestError;
use crate::remoting::{RemotingCommand, BROKER_VERSION};
use crate::server::Connection;

pub use crate::limits::CONSUME_STATS_TOPICS_MAX;

/// Separator of GET_CONSUME_STATS's `topicList`.
pub(crate) const TOPIC_LIST_SEPARATOR: char = ';';

/// Store time of the message at `queue_offset`; 0 when there is none (RocketMQ's
/// getMessageStoreTimeStamp answers -1 then; admin bodies carry 0).
pub(crate) async fn store_time_at(
    store: &Store,
    topic: &str,
    queue_id: u32,
    queue_offset: u64,
) -> i64 {
    let found = store
        .get_messages(
            topic,
            shards::QueueId(queue_id),
            shards::QueueOffset(queue_offset),
            1,
            1,
            &|_| true,
        )
        .await;
    let Ok(found) = found else { return 0 };
    record::decode(&found.body).map_or(0, |m| m.store_timestamp_ms)
}

impl Broker {
    pub(crate) fn topic_stats_info(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?.to_string();
        let config = self.topics.borrow().get(&topic).cloned();
        let Some(config) = config else {
            return Err(RequestError::TopicNotExist(format!(
                "topic[{topic}] not exist"
            )));
        };
        let queue_count = config.write_queue_nums.max(config.read_queue_nums);
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let mut table = TopicStatsTable::default();
            for queue_id in 0..queue_count {
                let min_offset = broker
                    .store
                    .min_queue_offset(&topic, shards::QueueId(queue_id));
                let max_offset = broker
                    .store
                    .max_queue_offset(&topic, shards::QueueId(queue_id));
                let last_update_timestamp = match max_offset.0 {
                    0 => 0,
                    max => store_time_at(&broker.store, &topic, queue_id, max - 1).await,
                };
                table.offset_table.push((
                    broker.message_queue(&topic, queue_id),
                    TopicOffset {
                        min_offset: min_offset.0 as i64,
                        max_offset: max_offset.0 as i64,
                        last_update_timestamp,
                    },
                ));
            }
            if !oneway {
                connection.respond_body_to(opaque, &table.encode());
            }
        });
        Ok(())
    }
}

impl Broker {
    pub(crate) fn consume_stats(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("consumerGroup")?.to_string();
        let topic_list: Vec<String> = ext
            .get_non_empty("topicList")
            .map(|list| {
                list.split(TOPIC_LIST_SEPARATOR)
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let topics = if topic_list.is_empty() {
            self.consumed_topics(&group, ext.get_non_empty("topic"))
        } else {
            topic_list
        };
        let mut queues = Vec::new();
        for topic in topics.iter().take(CONSUME_STATS_TOPICS_MAX) {
            let Some(config) = self.topics.borrow().get(topic).cloned() else {
                continue;
            };
            let offsets = self.offsets.borrow();
            for queue_id in 0..config.read_queue_nums {
                let consumer_offset = offsets.query(&group, topic, queue_id).unwrap_or(0).max(0);
                queues.push((topic.clone(), queue_id, consumer_offset));
            }
        }
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let mut stats = ConsumeStats::default();
            for (topic, queue_id, committed) in queues {
                let broker_offset = broker
                    .store
                    .max_queue_offset(&topic, shards::QueueId(queue_id))
                    .0 as i64;
                // Below the queue's minimum (retention deleted what lies between) the
                // consumer's next pull moves it to the minimum: the lag counts only what it
                // can still consume. A Java broker reports the committed offset as it is.
                let min = broker
                    .store
                    .min_queue_offset(&topic, shards::QueueId(queue_id))
                    .0 as i64;
                let consumer_offset = committed.max(min);
                let last_timestamp = match consumer_offset {
                    0 => 0,
                    offset => {
                        let at = (offset - 1) as u64;
                        store_time_at(&broker.store, &topic, queue_id, at).await
                    }
                };
                stats.offset_table.push((
                    broker.message_queue(&topic, queue_id),
                    OffsetWrapper {
                        broker_offset,
                        consumer_offset,
                        pull_offset: consumer_offset,
                        last_timestamp,
                    },
                ));
            }
            if !oneway {
                connection.respond_body_to(opaque, &stats.encode());
            }
        });
        Ok(())
    }
}

impl Broker {
    /// The topics GET_CONSUME_STATS reports for a group without a topic list: the asked
    /// topic, or every topic the group committed offsets for; while the group is online,
    /// only those it subscribes (RocketMQ's rule).
    pub(crate) fn consumed_topics(&self, group: &str, topic: Option<&str>) -> Vec<String> {
        let mut topics: BTreeSet<String> = match topic {
            Some(topic) => BTreeSet::from([topic.to_string()]),
            None => self
                .offsets
                .borrow()
                .entries()
                .keys()
                .filter_map(|key| key.split_once('@'))
                .filter(|(_, key_group)| *key_group == group)
                .map(|(topic, _)| topic.to_string())
                .collect(),
        };
        let clients = self.clients.borrow();
        if let Some(online) = clients.consumers.get(group) {
            if !online.subscriptions.is_empty() {
                topics.retain(|t| online.subscriptions.contains_key(t));
            }
        }
        topics.into_iter().collect()
    }
}

impl Broker {
    pub(crate) fn message_queue(&self, topic: &str, queue_id: u32) -> MessageQueue {
        MessageQueue {
            topic: topic.to_string(),
            broker_name: self.identity.broker_name.clone(),
            queue_id,
        }
    }
}

impl Broker {
    /// GET_BROKER_RUNTIME_INFO (28): every key of a Java broker's table
    /// (AdminBrokerProcessor.prepareRuntimeInfo, DefaultMessageStore and StoreStatsService's
    /// getRuntimeInfo, 4.9 and 5.x) in Java's formats, then shardmq's own figures. Keys about
    /// JVM thread pools answer what they mean on a shard: nothing queues for a pool (size 0,
    /// capacity the per-connection bound of requests in flight), and the head wait is how
    /// late the shard runs.
    pub(crate) fn runtime_info(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let mut table = self.java_runtime_table();
        self.shardmq_runtime_keys(&mut table);
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let earliest = broker.earliest_message_time().await;
            table.insert("earliestMessageTimeStamp".into(), earliest.to_string());
            if !oneway {
                connection.respond_body_to(opaque, &body::encode_kv_table(&table));
            }
        });
        Ok(())
    }

    fn java_runtime_table(&self) -> BTreeMap<String, String> {
        let mut table = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            table.insert(key.to_string(), value);
        };
        let stats = &self.stats;
        let now_ms = self.clock.now_ms();
        put("brokerVersion", BROKER_VERSION.to_string());
        put(
            "brokerVersionDesc",
            format!("shardmq {}", env!("CARGO_PKG_VERSION")),
        );
        put("brokerActive", "true".into());
        put("bootTimestamp", stats.started_at_ms.get().to_string());
        put("startAcceptSendRequestTimeStamp", "0".into());
        put(
            "runtime",
            store_stats::format_runtime(now_ms - stats.started_at_ms.get()),
        );
        let days = stats.day_marks.get();
        put("msgPutTotalTodayNow", stats.messages_put.get().to_string());
        put(
            "msgPutTotalTodayMorning",
            days.put_today_morning.to_string(),
        );
        put(
            "msgPutTotalYesterdayMorning",
            days.put_yesterday_morning.to_string(),
        );
        put("msgGetTotalTodayNow", stats.messages_got.get().to_string());
        put(
            "msgGetTotalTodayMorning",
            days.get_today_morning.to_string(),
        );
        put(
            "msgGetTotalYesterdayMorning",
            days.get_yesterday_morning.to_string(),
        );
        let puts = stats.messages_put.get();
        let put_bytes = stats.flows.borrow().in_total.bytes;
        let latency = stats.put_latency.borrow();
        put("putMessageEntireTimeMax", latency.max_ms.to_string());
        put("putMessageTimesTotal", puts.max(1).to_string());
        put("putMessageFailedTimes", latency.failures.to_string());
        put("putMessageSizeTotal", put_bytes.to_string());
        put(
            "putMessageAverageSize",
            store_stats::java_double(put_bytes as f64 / puts.max(1) as f64),
        );
        put("putMessageDistributeTime", latency.distribution());
        put("putLatency99", latency.percentile_ms(0.99));
        put("putLatency999", latency.percentile_ms(0.999));
        drop(latency);
        put(
            "getMessageEntireTimeMax",
            stats.get_time_max_ms.get().to_string(),
        );
        let history = stats.history.borrow();
        put("putTps", history.rates(|c| c.puts));
        put("getFoundTps", history.rates(|c| c.gets_found));
        put("getMissTps", history.rates(|c| c.gets_missed));
        put(
            "getTotalTps",
            history.rates(|c| c.gets_found + c.gets_missed),
        );
        let transferred = history.rates(|c| c.transferred);
        put("getTransferedTps", transferred.clone());
        put("getTransferredTps", transferred);
        drop(history);
        // Dispatch to consume queues and index happens inside the append: nothing is behind
        // and no dispatch buffer exists.
        put("dispatchBehindBytes", "0".into());
        put("dispatchMaxBuffer", "0".into());
        put("pageCacheLockTimeMills", "0".into());
        put("remainTransientStoreBufferNumbs", "0".into());
        let max_offset = self.store.max_physical_offset().0;
        let unflushed = max_offset.saturating_sub(self.store.durable_offset().0);
        put("remainHowManyDataToFlush", human_readable_bytes(unflushed));
        put("commitLogMaxOffset", max_offset.to_string());
        put(
            "commitLogMinOffset",
            self.store.min_physical_offset().0.to_string(),
        );
        // RocketMQ's disk keys: the used ratio of the store's filesystem (0..1, as Java's
        // double prints), the consume queues living on the same one.
        let ratio = self
            .store
            .disk_used_ratio()
            .or(self.retention.used_ratio())
            .unwrap_or(-1.0);
        put("commitLogDiskRatio", store_stats::java_double(ratio));
        put("consumeQueueDiskRatio", store_stats::java_double(ratio));
        if let Some((total, free)) = self.store.disk_capacity_bytes() {
            put(
                "commitLogDirCapacity",
                format!(
                    "Total : {}, Free : {}.",
                    human_readable_bytes(total),
                    human_readable_bytes(free)
                ),
            );
        }
        let lateness_ms = self
            .load
            .lateness(std::time::Instant::now())
            .as_millis()
            .to_string();
        let capacity = crate::limits::IN_FLIGHT_REQUESTS_MAX.to_string();
        for pool in ["send", "pull", "query", "ack", "litePull"] {
            put(&format!("{pool}ThreadPoolQueueSize"), "0".into());
            put(&format!("{pool}ThreadPoolQueueCapacity"), capacity.clone());
            put(
                &format!("{pool}ThreadPoolQueueHeadWaitTimeMills"),
                lateness_ms.clone(),
            );
        }
        put("EndTransactionQueueSize", "0".into());
        put("EndTransactionThreadPoolQueueCapacity", capacity);
        let schedule = self.schedule.borrow();
        for (level, offset) in schedule.level_offsets() {
            let queue = shards::QueueId(level.saturating_sub(1));
            let max = self.store.max_queue_offset(SCHEDULE_TOPIC, queue).0;
            put(
                &format!("scheduleMessageOffset_{level}"),
                format!("{offset},{max}"),
            );
        }
        table
    }

    /// What only shardmq reports (brokerStatus shows them beside RocketMQ's).
    fn shardmq_runtime_keys(&self, table: &mut BTreeMap<String, String>) {
        let mut put = |key: &str, value: String| {
            table.insert(key.to_string(), value);
        };
        let refusal = self.store.space_refusal();
        put("diskFull", refusal.is_some().to_string());
        put("storeWritesRefused", refusal.unwrap_or_default());
        put(
            "retentionDeletedSegments",
            self.retention.deleted_segments.get().to_string(),
        );
        let store = self.store.stats();
        put(
            "retentionRecycledSegments",
            store.segments_recycled.to_string(),
        );
        put("storeGroupCommits", store.flushes.to_string());
        put(
            "storeGroupCommittedMessages",
            store.flushed_messages.to_string(),
        );
        put("storeCorruptRecords", store.corrupt_records.to_string());
        // Pulls of durable records through the read cache's windows (read_cache.rs): found
        // there, and read from disk.
        put("storeReadCacheHits", store.read_cache_hits.to_string());
        put("storeReadCacheMisses", store.read_cache_misses.to_string());
        put(
            "storeReadCacheRefetches",
            store.read_cache_refetches.to_string(),
        );
        put(
            "storeReadCacheBypasses",
            store.read_cache_bypasses.to_string(),
        );
        put(
            "storeReadCacheSpanShares",
            store.read_cache_span_shares.to_string(),
        );
        put("parkedPulls", self.pull_waiters.len().to_string());
        put("sendRefusedBusy", self.load.refused_sends.get().to_string());
        for (key, value) in self.ha.runtime_info(self.store.max_physical_offset().0) {
            put(key, value);
        }
        let transactions = self.transactions.borrow();
        put(
            "transactionHalfPending",
            transactions.pending_len().to_string(),
        );
        let tx = transactions.stats;
        put("transactionCommitted", tx.committed.to_string());
        put("transactionRolledBack", tx.rolled_back.to_string());
        put("transactionChecksSent", tx.checks_sent.to_string());
        put("transactionDiscarded", tx.discarded.to_string());
        drop(transactions);
        let flush = match self.store.flush_mode() {
            shards::store::FlushMode::Sync => "SYNC_FLUSH",
            shards::store::FlushMode::Async => "ASYNC_FLUSH",
        };
        put("flushDiskType", flush.into());
        // Process-wide: the times each runtime workaround mattered (runtime::workarounds).
        let workarounds = shards::runtime::workarounds::counters();
        let count = |counter: &std::sync::atomic::AtomicU64| {
            counter
                .load(std::sync::atomic::Ordering::Relaxed)
                .to_string()
        };
        put("workaroundNudges", count(&workarounds.nudges));
        put(
            "workaroundStoreOpensAbandoned",
            count(&workarounds.store_opens_abandoned),
        );
    }

    /// RocketMQ's getEarliestMessageTime: the store time of the oldest message held, -1 when
    /// there is none.
    async fn earliest_message_time(&self) -> i64 {
        let min = self.store.min_physical_offset();
        if min.0 >= self.store.max_physical_offset().0 {
            return -1;
        }
        match self.store.read_record(min).await {
            Ok(Some(bytes)) => record::decode(&bytes).map_or(-1, |m| m.store_timestamp_ms),
            _ => -1,
        }
    }
}

/// MixAll.humanReadableByteCount(bytes, false): `512 B`, `1.5 KiB`, `3.0 GiB`.
fn human_readable_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let exponent = ((bytes as f64).ln() / 1024f64.ln()) as i32;
    let prefix = ["K", "M", "G", "T", "P", "E"][(exponent as usize - 1).min(5)];
    format!("{:.1} {prefix}iB", bytes as f64 / 1024f64.powi(exponent))
}

impl Broker {
    /// QUERY_TOPIC_CONSUME_BY_WHO (300), as AdminBrokerProcessor answers it: the groups with
    /// a connected consumer subscribed to the topic, and those holding offsets of it, as a
    /// GroupList body (`{"groupList":[…]}`). mqadmin's queryMsgById and topicStatus ask it.
    pub(crate) fn topic_consume_by_who(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let topic = request.ext_fields.required("topic")?;
        let mut groups: BTreeSet<String> = self
            .clients
            .borrow()
            .consumers
            .iter()
            .filter(|(_, group)| group.subscriptions.contains_key(topic))
            .map(|(name, _)| name.clone())
            .collect();
        let offsets = self.offsets.borrow();
        groups.extend(
            offsets
                .entries()
                .keys()
                .filter_map(|key| key.split_once('@'))
                .filter(|(offset_topic, _)| *offset_topic == topic)
                .map(|(_, group)| group.to_string()),
        );
        drop(offsets);
        let body = serde_json::json!({ "groupList": groups }).to_string();
        connection.respond_body(request, body.as_bytes());
        Ok(())
    }
}
