//! Consumer offsets on the client: the next queue offset to consume per queue, kept in memory
//! and persisted every 5 s and at shutdown. Clustering groups keep them on the broker
//! (`RemoteBrokerOffsetStore`: QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET); broadcasting
//! consumers in a local JSON file (`LocalFileOffsetStore`), since every consumer reads every
//! queue and the broker keeps one offset per group.
//!
//! Local file: `<dir>/<clientIP>@<instanceName>/<group>/offsets.json`,
//! `{"offsetTable":[{"brokerName":..,"queueId":..,"topic":..,"offset":..}]}`, written to a
//! temporary file and renamed, so a crash leaves the old or the new table, never half of one.
//!
//! Invariant: with `increase_only`, an offset never moves back (a slow consume task that
//! finishes after a faster one does not undo its progress).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::connection::Request;
use super::error::{ClientError, ClientResult};
use super::instance::{lock, ClientInstance};
use super::message::MessageQueue;
use crate::remoting::{request_code, response_code};

/// Where offsets persist.
#[derive(Debug, Clone)]
pub enum OffsetBackend {
    /// The broker that owns the queue (clustering).
    Broker,
    /// A JSON file (broadcasting).
    LocalFile(PathBuf),
}

pub struct OffsetStore {
    instance: Arc<ClientInstance>,
    group: String,
    backend: OffsetBackend,
    table: Mutex<HashMap<MessageQueue, i64>>,
    /// What the local file held at start (LocalFile only).
    file_table: Mutex<HashMap<MessageQueue, i64>>,
}

impl OffsetStore {
    pub fn new(instance: Arc<ClientInstance>, group: &str, backend: OffsetBackend) -> OffsetStore {
        let file_table = match &backend {
            OffsetBackend::LocalFile(path) => read_file(path),
            OffsetBackend::Broker => HashMap::new(),
        };
        OffsetStore {
            instance,
            group: group.to_string(),
            backend,
            table: Mutex::default(),
            file_table: Mutex::new(file_table),
        }
    }

    /// Records `offset` as the next one to consume of `queue`.
    pub fn update(&self, queue: &MessageQueue, offset: i64, increase_only: bool) {
        let mut table = lock(&self.table);
        let entry = table.entry(queue.clone()).or_insert(offset);
        if !increase_only || offset > *entry {
            *entry = offset;
        }
    }

    pub fn read_memory(&self, queue: &MessageQueue) -> Option<i64> {
        lock(&self.table).get(queue).copied()
    }

    /// The persisted offset, also kept in memory: `Ok(None)` when none was ever committed.
    pub async fn read_store(&self, queue: &MessageQueue) -> ClientResult<Option<i64>> {
        let offset = self.fetch_committed(queue).await?;
        if let Some(offset) = offset {
            self.update(queue, offset, false);
        }
        Ok(offset)
    }

    /// The persisted offset, leaving memory alone.
    pub async fn fetch_committed(&self, queue: &MessageQueue) -> ClientResult<Option<i64>> {
        match &self.backend {
            OffsetBackend::LocalFile(_) => Ok(lock(&self.file_table).get(queue).copied()),
            OffsetBackend::Broker => self.query_broker(queue).await,
        }
    }

    async fn query_broker(&self, queue: &MessageQueue) -> ClientResult<Option<i64>> {
        let addr = self.broker_addr(queue).await?;
        let request = Request::new(request_code::QUERY_CONSUMER_OFFSET)
            .ext("consumerGroup", &self.group)
            .ext("topic", &queue.topic)
            .ext("queueId", queue.queue_id);
        let response = self
            .instance
            .remoting
            .invoke(&addr, &request, self.instance.config.request_timeout)
            .await?;
        match response.code {
            response_code::SUCCESS => Ok(Some(response.ext_i64("offset")?)),
            response_code::QUERY_NOT_FOUND => Ok(None),
            _ => Err(response.into_error(&addr)),
        }
    }

    async fn broker_addr(&self, queue: &MessageQueue) -> ClientResult<String> {
        if let Some(addr) = self.instance.master_addr(&queue.broker_name) {
            return Ok(addr);
        }
        self.instance.update_route(&queue.topic).await?;
        self.instance.require_master_addr(&queue.broker_name)
    }

    /// Persists the offsets of `queues` (those with an offset in memory).
    pub async fn persist_all(&self, queues: &[MessageQueue]) -> ClientResult<()> {
        let entries: Vec<(MessageQueue, i64)> = {
            let table = lock(&self.table);
            queues
                .iter()
                .filter_map(|q| table.get(q).map(|offset| (q.clone(), *offset)))
                .collect()
        };
        match &self.backend {
            OffsetBackend::LocalFile(path) => self.write_file(path),
            OffsetBackend::Broker => {
                let mut result = Ok(());
                for (queue, offset) in entries {
                    if let Err(error) = self.commit_to_broker(&queue, offset).await {
                        result = Err(error);
                    }
                }
                result
            }
        }
    }

    /// Persists one queue's offset.
    pub async fn persist(&self, queue: &MessageQueue) -> ClientResult<()> {
        self.persist_all(std::slice::from_ref(queue)).await
    }

    /// UPDATE_CONSUMER_OFFSET, waiting for the broker's answer (so the next owner of the
    /// queue reads it after a rebalance).
    pub async fn commit_to_broker(&self, queue: &MessageQueue, offset: i64) -> ClientResult<()> {
        let addr = self.broker_addr(queue).await?;
        let request = Request::new(request_code::UPDATE_CONSUMER_OFFSET)
            .ext("consumerGroup", &self.group)
            .ext("topic", &queue.topic)
            .ext("queueId", queue.queue_id)
            .ext("commitOffset", offset);
        self.instance.invoke_ok(&addr, &request).await.map(|_| ())
    }

    /// Forgets a queue (after it moved to another consumer).
    pub fn remove(&self, queue: &MessageQueue) {
        lock(&self.table).remove(queue);
    }

    fn write_file(&self, path: &PathBuf) -> ClientResult<()> {
        let mut merged = lock(&self.file_table).clone();
        merged.extend(lock(&self.table).iter().map(|(q, o)| (q.clone(), *o)));
        let entries: Vec<Value> = merged
            .iter()
            .map(|(queue, offset)| {
                json!({"brokerName": queue.broker_name, "queueId": queue.queue_id,
                       "topic": queue.topic, "offset": offset})
            })
            .collect();
        let text = json!({ "offsetTable": entries }).to_string();
        let io_error = |error: std::io::Error| ClientError::LocalIo {
            path: path.display().to_string(),
            reason: error.to_string(),
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, text).map_err(io_error)?;
        std::fs::rename(&temporary, path).map_err(io_error)?;
        *lock(&self.file_table) = merged;
        Ok(())
    }
}

fn read_file(path: &PathBuf) -> HashMap<MessageQueue, i64> {
    let Ok(text) = std::fs::read(path) else {
        return HashMap::new();
    };
    let Ok(value) = serde_json::from_slice::<Value>(&text) else {
        return HashMap::new();
    };
    let mut table = HashMap::new();
    for entry in value["offsetTable"].as_array().into_iter().flatten() {
        let (Some(topic), Some(broker_name), Some(queue_id), Some(offset)) = (
            entry["topic"].as_str(),
            entry["brokerName"].as_str(),
            entry["queueId"].as_u64(),
            entry["offset"].as_i64(),
        ) else {
            continue;
        };
        let Ok(queue_id) = u32::try_from(queue_id) else {
            continue;
        };
        table.insert(
            MessageQueue {
                topic: topic.to_string(),
                broker_name: broker_name.to_string(),
                queue_id,
            },
            offset,
        );
    }
    table
}
