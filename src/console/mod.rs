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
//!   runs on the shard's blocking helper (`runtime::blocking`), never on the shard's thread;
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
            ("GET", "/api/cluster") => self.query(cluster).await,
            ("GET", "/api/topics") => self.query_then(topics, |c, v| c.topic_rates(v)).await,
            ("GET", "/api/groups") => self.query_then(groups, |c, v| c.group_rates(v)).await,
            ("GET", "/api/message") => self.query(move |a| lookup(a, &params)).await,
            ("POST", "/api/topic" | "/api/group") if !self.access.write_enabled => Answer::json(
                "403 Forbidden",
                &json!({ "error": "the console is read-only: start the node with \
                                   --console-write to create topics and groups" }),
            ),
            ("POST", "/api/topic") => {
                let form = form_params(&String::from_utf8_lossy(body));
                self.query(move |a| create_topic(a, &form)).await
            }
            ("POST", "/api/group") => {
                let form = form_params(&String::from_utf8_lossy(body));
                self.query(move |a| create_group(a, &form)).await
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
        self.queries_in_flight.set(self.queries_in_flight.get() + 1);
        let access = self.access.clone();
        let result = runtime::blocking(move || {
            let timeout = Duration::from_millis(QUERY_TIMEOUT_MS);
            let mut admin = Admin::new(&access.namesrv, timeout, access.credentials, access.tls);
            let result = work(&mut admin).map_err(|e| format!("{e:#}"));
            (result, std::mem::take(&mut admin.warnings))
        })
        .await;
        self.queries_in_flight.set(self.queries_in_flight.get() - 1);
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

fn is_system_topic(topic: &str) -> bool {
    admin::message::SYSTEM_TOPIC_PREFIXES
        .iter()
        .any(|prefix| topic.starts_with(prefix))
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
    names.sort_by_key(|t| (is_system_topic(t), t.clone()));
    let mut entries = Vec::new();
    for (index, topic) in names.iter().enumerate() {
        let system = is_system_topic(topic);
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

/// `?topic=T&key=K` (queryMsgByKey) or `?id=I[&topic=T]` (queryMsgById).
fn lookup(admin: &mut Admin, params: &HashMap<String, String>) -> anyhow::Result<Value> {
    let get = |key: &str| {
        params
            .get(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(id) = get("id") {
        let command = AdminCommand::QueryMsgById {
            id,
            topic: get("topic"),
        };
        return run(admin, command);
    }
    match (get("topic"), get("key")) {
        (Some(topic), Some(key)) => run(
            admin,
            AdminCommand::QueryMsgByKey(admin::message::QueryByKeyArgs {
                topic,
                key,
                begin: None,
                end: None,
                max_num: LOOKUP_MESSAGES_MAX,
            }),
        ),
        _ => anyhow::bail!("give topic and key, or id (a msgId)"),
    }
}

fn create_topic(admin: &mut Admin, form: &HashMap<String, String>) -> anyhow::Result<Value> {
    let Some(topic) = form
        .get("topic")
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
    else {
        anyhow::bail!("give the topic's name");
    };
    let queues = match form
        .get("queues")
        .map(|q| q.trim())
        .filter(|q| !q.is_empty())
    {
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|q| (1..=1024).contains(q))
            .ok_or_else(|| anyhow::anyhow!("queues must be 1 to 1024, not {text}"))?,
        None => admin::topic::TOPIC_QUEUES_DEFAULT,
    };
    let args = admin::topic::UpdateTopicArgs {
        topic,
        target: Target::default(),
        read_queues: queues,
        write_queues: queues,
        perm: admin::topic::PERM_READ_WRITE,
        order: false,
    };
    run(admin, AdminCommand::UpdateTopic(args))
}

fn create_group(admin: &mut Admin, form: &HashMap<String, String>) -> anyhow::Result<Value> {
    let Some(group) = form
        .get("group")
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
    else {
        anyhow::bail!("give the group's name");
    };
    let args = admin::group::UpdateSubGroupArgs {
        group,
        target: Target::default(),
        consume_enable: true,
        consume_from_min_enable: true,
        broadcast_enable: true,
        orderly: false,
        retry_queues: 1,
        retry_max_times: 16,
    };
    run(admin, AdminCommand::UpdateSubGroup(args))
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
}
