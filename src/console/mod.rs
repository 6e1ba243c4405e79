//! The web console (issue 15): pages and a JSON API on the metrics port, beside
//! `GET /metrics`, served by `metrics::http` on shard 0.
//!
//! Pages (`/`, `/topics`, `/groups`, `/message`, `/charts`) are one HTML document with a small
//! script and style sheet compiled into the binary (`assets/`); the script reads the JSON API
//! and draws. Nothing is built or fetched from elsewhere.
//!
//! Where the data comes from:
//! - cluster, topics, groups, message lookup: the admin tool's own commands (`crate::admin`:
//!   clusterList, topicList + topicStatus, subGroupList + consumerProgress, queryMsgByKey,
//!   queryMsgById), against this node's namesrv, signed with the node's inner credentials
//!   and over TLS as its brokers reach the namesrv. The admin client blocks, so each query
//!   runs on a thread of its own (see `QUERY_POLL_INTERVAL_MS`), never on a shard's thread;
//!   at most `QUERIES_IN_FLIGHT_MAX` at once, past which the API answers 503.
//! - rates and charts: the shards' published snapshots (`MetricsBoard`), sampled by
//!   `history.rs` on shard 0; send latency from `rocketmq_rpc_latency`'s SEND codes.
//!
//! Read-only unless the node runs with `--console-write`: then `POST /api/topic` and
//! `POST /api/group` create topics and subscription groups (updateTopic, updateSubGroup);
//! without it every POST is answered 403.

mod history;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use shards::runtime;

use crate::admin::{self, Admin, AdminCommand, Target};
use crate::metrics::MetricsBoard;

use history::{History, Sample, HISTORY_INTERVAL_MS};

/// Admin queries running at once (each holds the blocking helper and connections).
pub const QUERIES_IN_FLIGHT_MAX: usize = 4;
/// How often shard 0 looks whether a query thread has finished. Queries run on threads of
/// their own, not on the shard's blocking helper (`runtime::blocking`): that helper does the
/// shard's fsyncs, and a query that creates a topic waits for shard 0 to persist it, which
/// deadlocked until the query timed out. The thread's answer is picked up by polling, once
/// per interval, because a std channel cannot wake a glommio task; a console query is rare
/// and slow next to it.
pub const QUERY_POLL_INTERVAL_MS: u64 = 20;
/// Wait for each answer of an admin query.
pub const QUERY_TIMEOUT_MS: u64 = 3_000;
/// Topics and groups whose details one page shows (the rest are listed by name only).
pub const DETAILS_SHOWN_MAX: usize = 100;
/// Messages a lookup by key asks each broker for.
pub const LOOKUP_MESSAGES_MAX: u32 = 32;

const PAGE_HTML: &str = include_str!("assets/page.html");
const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// How the console reaches this node's namesrv and brokers.
#[derive(Clone)]
pub struct Access {
    /// host:port[;host:port].
    pub namesrv: String,
    pub credentials: Option<crate::remoting::signature::Credentials>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `--console-write`.
    pub write_enabled: bool,
}

/// One HTTP answer: status line, content type, body.
pub struct Answer {
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Answer {
    fn json(status: &'static str, value: &Value) -> Answer {
        Answer {
            status,
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }

    fn text(status: &'static str, content_type: &'static str, text: &str) -> Answer {
        Answer {
            status,
            content_type,
            body: text.as_bytes().to_vec(),
        }
    }
}

/// The console's state on shard 0.
pub struct Console {
    access: Access,
    board: Arc<MetricsBoard>,
    history: RefCell<History>,
    queries_in_flight: Cell<usize>,
}

impl Console {
    /// The console of this node; starts its sampler on the calling shard.
    pub fn new(access: Access, board: &Arc<MetricsBoard>) -> Rc<Console> {
        let console = Rc::new(Console {
            access,
            board: board.clone(),
            history: RefCell::new(History::default()),
            queries_in_flight: Cell::new(0),
        });
        let sampler = console.clone();
        runtime::spawn_detached(async move {
            loop {
                let sample = Sample::of(runtime::monotonic_ms(), &sampler.board.snapshots());
                sampler.history.borrow_mut().push(sample);
                runtime::sleep(Duration::from_millis(HISTORY_INTERVAL_MS)).await;
            }
        });
        console
    }

    /// The answer to `method path?query` with `body` (a form, for POSTs).
    pub async fn respond(&self, method: &str, path: &str, query: &str, body: &[u8]) -> Answer {
        let params = form_params(query);
        match (method, path) {
            ("GET", "/" | "/topics" | "/groups" | "/message" | "/charts") => {
                Answer::text("200 OK", "text/html; charset=utf-8", PAGE_HTML)
            }
            ("GET", "/console.js") => Answer::text(
                "200 OK",
                "application/javascript; charset=utf-8",
                CONSOLE_JS,
            ),
            ("GET", "/console.css") => {
                Answer::text("200 OK", "text/css; charset=utf-8", CONSOLE_CSS)
            }
            ("GET", "/api/history") => Answer::json(
                "200 OK",
                &json!({ "points": self.history.borrow().points() }),
            ),
            ("GET", "/api/cluster") => self.query_then(cluster, |c, v| c.node_rates(v)).await,
            ("GET", "/api/topics") => self.query_then(topics, |c, v| c.topic_rates(v)).await,
            ("GET", "/api/groups") => self.query_then(groups, |c, v| c.group_rates(v)).await,
            ("GET", "/api/message") => match lookup_command(&params) {
                Ok(command) => self.query(move |a| run(a, command)).await,
                Err(error) => bad_request(&error),
            },
            ("POST", "/api/topic" | "/api/group") if !self.access.write_enabled => Answer::json(
                "403 Forbidden",
                &json!({ "error": "the console is read-only: start the node with \
                                   --console-write to create topics and groups" }),
            ),
            ("POST", "/api/topic") => {
                let form = form_params(&String::from_utf8_lossy(body));
                match topic_args(&form) {
                    Ok(args) => {
                        self.query(move |a| run(a, AdminCommand::UpdateTopic(args)))
                            .await
                    }
                    Err(error) => bad_request(&error),
                }
            }
            ("POST", "/api/group") => {
                let form = form_params(&String::from_utf8_lossy(body));
                match group_args(&form) {
                    Ok(args) => {
                        self.query(move |a| run(a, AdminCommand::UpdateSubGroup(args)))
                            .await
                    }
                    Err(error) => bad_request(&error),
                }
            }
            ("GET", _) => Answer::text(
                "404 Not Found",
                "text/plain; charset=utf-8",
                "not found: the console is at /, the metrics at /metrics\n",
            ),
            _ => Answer::text(
                "405 Method Not Allowed",
                "text/plain; charset=utf-8",
                "only GET (and POST to /api/topic, /api/group) is served\n",
            ),
        }
    }

    async fn query<F>(&self, work: F) -> Answer
    where
        F: FnOnce(&mut Admin) -> anyhow::Result<Value> + Send + 'static,
    {
        self.query_then(work, |_, value| value).await
    }

    /// Runs `work` on the blocking helper with a fresh admin session, then `finish` here.
    async fn query_then<F>(&self, work: F, finish: impl FnOnce(&Console, Value) -> Value) -> Answer
    where
        F: FnOnce(&mut Admin) -> anyhow::Result<Value> + Send + 'static,
    {
        if self.queries_in_flight.get() >= QUERIES_IN_FLIGHT_MAX {
            let busy = json!({ "error": "the console is busy with other queries; try again" });
            return Answer::json("503 Service Unavailable", &busy);
        }
        let _slot = QuerySlot::take(&self.queries_in_flight);
        let access = self.access.clone();
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("console-query".into())
            .spawn(move || {
                let timeout = Duration::from_millis(QUERY_TIMEOUT_MS);
                let mut admin =
                    Admin::new(&access.namesrv, timeout, access.credentials, access.tls);
                let result = work(&mut admin).map_err(|e| format!("{e:#}"));
                let _ = sender.send((result, std::mem::take(&mut admin.warnings)));
            });
        if let Err(error) = spawned {
            let error = json!({ "error": format!("cannot start a query thread: {error}") });
            return Answer::json("503 Service Unavailable", &error);
        }
        let result = loop {
            match receiver.try_recv() {
                Ok(result) => break result,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    runtime::sleep(Duration::from_millis(QUERY_POLL_INTERVAL_MS)).await
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    break (Err("the query thread stopped".to_string()), Vec::new())
                }
            }
        };
        match result {
            (Ok(value), warnings) => {
                let mut value = finish(self, value);
                if let Value::Object(map) = &mut value {
                    map.insert("warnings".into(), json!(warnings));
                    map.insert("writeEnabled".into(), json!(self.access.write_enabled));
                }
                Answer::json("200 OK", &value)
            }
            (Err(error), warnings) => Answer::json(
                "502 Bad Gateway",
                &json!({ "error": error, "warnings": warnings }),
            ),
        }
    }

    fn node_rates(&self, mut value: Value) -> Value {
        let history = self.history.borrow();
        for cluster in value["clusters"].as_array_mut().into_iter().flatten() {
            for broker in cluster["brokers"].as_array_mut().into_iter().flatten() {
                let (stored, delivered) =
                    history.node_rates(broker["brokerName"].as_str().unwrap_or(""));
                broker["produceTps"] = json!(stored);
                broker["consumeTps"] = json!(delivered);
            }
        }
        value
    }

    fn topic_rates(&self, mut value: Value) -> Value {
        let history = self.history.borrow();
        if let Some(topics) = value["topics"].as_array_mut() {
            for topic in topics {
                let rate = history.topic_rate(topic["topic"].as_str().unwrap_or(""));
                topic["produceTps"] = json!(rate);
            }
        }
        value
    }

    fn group_rates(&self, mut value: Value) -> Value {
        let history = self.history.borrow();
        if let Some(groups) = value["groups"].as_array_mut() {
            for group in groups {
                let rate = history.group_rate(group["group"].as_str().unwrap_or(""));
                group["consumeRate"] = json!(rate);
            }
        }
        value
    }
}

/// One of the `QUERIES_IN_FLIGHT_MAX` query slots, given back when dropped (also when the
/// connection's deadline drops the answer being prepared).
struct QuerySlot<'c>(&'c Cell<usize>);

impl<'c> QuerySlot<'c> {
    fn take(in_flight: &'c Cell<usize>) -> QuerySlot<'c> {
        in_flight.set(in_flight.get() + 1);
        QuerySlot(in_flight)
    }
}

impl Drop for QuerySlot<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// `a=1&b=x+y` → map, %-escapes decoded.
fn form_params(text: &str) -> HashMap<String, String> {
    text.split('&')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (!key.is_empty()).then(|| (percent_decode(key), percent_decode(value)))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        index += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn run(admin: &mut Admin, command: AdminCommand) -> anyhow::Result<Value> {
    Ok(admin::execute(admin, &command)?.json)
}

/// `{"clusters": clusterList's}`.
fn cluster(admin: &mut Admin) -> anyhow::Result<Value> {
    run(admin, AdminCommand::ClusterList { cluster: None })
}

/// `{"topics":[{"topic","system","queues":[topicStatus's]|null,"error"?}]}`: user topics
/// first, details for the first `DETAILS_SHOWN_MAX`.
fn topics(admin: &mut Admin) -> anyhow::Result<Value> {
    let list = run(admin, AdminCommand::TopicList { cluster: None })?;
    let info = admin.cluster_info()?;
    let mut names: Vec<String> = list["topics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str().map(String::from))
        .filter(|t| !info.cluster_addr_table.contains_key(t))
        .filter(|t| !info.broker_addr_table.contains_key(t))
        .collect();
    names.sort_by_key(|t| (admin::message::is_system_topic(t), t.clone()));
    let mut entries = Vec::new();
    for (index, topic) in names.iter().enumerate() {
        let system = admin::message::is_system_topic(topic);
        let mut entry = json!({ "topic": topic, "system": system, "queues": null });
        if !system && index < DETAILS_SHOWN_MAX {
            match run(
                admin,
                AdminCommand::TopicStatus {
                    topic: topic.clone(),
                },
            ) {
                Ok(status) => entry["queues"] = status["queues"].clone(),
                Err(error) => entry["error"] = json!(format!("{error:#}")),
            }
        }
        entries.push(entry);
    }
    Ok(json!({ "topics": entries }))
}

/// `{"groups":[{"group","system","progress": consumerProgress's|null,"error"?}]}`.
fn groups(admin: &mut Admin) -> anyhow::Result<Value> {
    let list = run(admin, AdminCommand::SubGroupList(Target::default()))?;
    let mut entries = Vec::new();
    let groups = list["groups"].as_array().cloned().unwrap_or_default();
    for (index, group) in groups.iter().enumerate() {
        let name = group["groupName"].as_str().unwrap_or("").to_string();
        let system = name.starts_with("CID_RMQ_SYS_")
            || ["TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP"]
                .contains(&name.as_str())
            || name.contains("RMQ_SYS");
        let mut entry = json!({ "group": name, "system": system, "progress": null });
        if !system && index < DETAILS_SHOWN_MAX {
            let command = AdminCommand::ConsumerProgress {
                group: name.clone(),
                topic: None,
            };
            match run(admin, command) {
                Ok(progress) => entry["progress"] = progress,
                Err(error) => entry["error"] = json!(format!("{error:#}")),
            }
        }
        entries.push(entry);
    }
    entries.sort_by_key(|e| (e["system"].as_bool(), e["group"].as_str().map(String::from)));
    Ok(json!({ "groups": entries }))
}

fn bad_request(error: &str) -> Answer {
    Answer::json("400 Bad Request", &json!({ "error": error }))
}

/// A non-empty, trimmed parameter.
fn param(params: &HashMap<String, String>, key: &str) -> Option<String> {
    params
        .get(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `?topic=T&key=K` (queryMsgByKey) or `?id=I[&topic=T]` (queryMsgById).
fn lookup_command(params: &HashMap<String, String>) -> Result<AdminCommand, String> {
    if let Some(id) = param(params, "id") {
        let topic = param(params, "topic");
        return Ok(AdminCommand::QueryMsgById { id, topic });
    }
    match (param(params, "topic"), param(params, "key")) {
        (Some(topic), Some(key)) => Ok(AdminCommand::QueryMsgByKey(
            admin::message::QueryByKeyArgs {
                topic,
                key,
                begin: None,
                end: None,
                max_num: LOOKUP_MESSAGES_MAX,
            },
        )),
        _ => Err("give topic and key, or id (a msgId)".into()),
    }
}

/// The form of `POST /api/topic`: `topic`, `queues` (read and write, default 8).
fn topic_args(form: &HashMap<String, String>) -> Result<admin::topic::UpdateTopicArgs, String> {
    let topic = param(form, "topic").ok_or("give the topic's name")?;
    let queues = match param(form, "queues") {
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|q| (1..=1024).contains(q))
            .ok_or_else(|| format!("queues must be 1 to 1024, not {text}"))?,
        None => admin::topic::TOPIC_QUEUES_DEFAULT,
    };
    Ok(admin::topic::UpdateTopicArgs {
        topic,
        target: Target::default(),
        read_queues: queues,
        write_queues: queues,
        perm: admin::topic::PERM_READ_WRITE,
        order: false,
    })
}

/// The form of `POST /api/group`: `group`, with mqadmin's defaults for the rest.
fn group_args(form: &HashMap<String, String>) -> Result<admin::group::UpdateSubGroupArgs, String> {
    let group = param(form, "group").ok_or("give the group's name")?;
    Ok(admin::group::UpdateSubGroupArgs {
        group,
        target: Target::default(),
        consume_enable: true,
        consume_from_min_enable: true,
        broadcast_enable: true,
        orderly: false,
        retry_queues: 1,
        retry_max_times: 16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_parameters_are_decoded() {
        let params = form_params("topic=Orders%2Fa&key=k+1&empty=&bad=%zz&x");
        assert_eq!(params["topic"], "Orders/a");
        assert_eq!(params["key"], "k 1");
        assert_eq!(params["empty"], "");
        assert_eq!(params["bad"], "%zz");
        assert_eq!(params["x"], "");
        assert_eq!(percent_decode("%4"), "%4");
    }

    #[test]
    fn forms_are_checked_before_any_request() {
        let form = form_params("topic=T&queues=3");
        assert_eq!(topic_args(&form).map(|a| a.write_queues), Ok(3));
        assert!(topic_args(&form_params("queues=3")).is_err());
        assert!(topic_args(&form_params("topic=T&queues=0")).is_err());
        assert!(group_args(&form_params("group=+")).is_err());
        assert!(lookup_command(&form_params("topic=T")).is_err());
        assert!(matches!(
            lookup_command(&form_params("id=ABC")),
            Ok(AdminCommand::QueryMsgById { .. })
        ));
    }
}
