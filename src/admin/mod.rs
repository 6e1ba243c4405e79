//! `shardmq admin`: the operator's command line, modelled on RocketMQ's `mqadmin`, against
//! shardmq or any RocketMQ name server and its brokers.
//!
//! `shardmq admin <command> [--namesrv host:port[;host:port]] [--json] [--timeout-ms N]`
//!
//! | Command | What it does (request codes) |
//! |---|---|
//! | `clusterList` | clusters, brokers and their runtime figures (106, 28) |
//! | `brokerStatus` | every runtime figure of brokers (28), disk ratio and refusals included |
//! | `deleteExpiredCommitLog` | brokers delete their expired commitlog segments now (329) |
//! | `updateTopic`, `deleteTopic` | create/update a topic on the masters; delete it there and in the namesrv (17; 215, 216) |
//! | `topicList`, `topicRoute`, `topicStatus` | names (206/224), route (105), per-queue min/max/last update (202) |
//! | `updateSubGroup`, `deleteSubGroup`, `subGroupList` | subscription groups on the masters (200, 207, 201) |
//! | `consumerProgress` | per queue broker offset, consumer offset, lag; the group's clients (208, 203) |
//! | `resetOffsetByTime` | move a group's offsets to a time (222; 29 + 15 when the group is offline) |
//! | `queryMsgByKey`, `queryMsgByUniqueKey` | QUERY_MESSAGE on every broker of the topic (12) |
//! | `queryMsgById` | an offset msgId (33), else a unique id (12) |
//! | `queryMsgByOffset` | one queue position (11) |
//! | `sendMessage` | a test message (310) |
//! | `promote` | a slave becomes its broker name's master, after a warning of what may be lost (28, 25) |
//!
//! Output: aligned tables for people; with `--json` one JSON document on stdout for scripts
//! (each command's shape is documented on its function). Warnings (a broker that did not
//! answer while others did) go to stderr and, with `--json`, into a `warnings` array.
//! Failures (unknown topic or group, unreachable namesrv, a broker refusing a change) print
//! `shardmq admin: error: ...` on stderr, `{"error": "..."}` on stdout with `--json`, and exit
//! with status 1; bad arguments exit with status 2.
//!
//! Runs on the calling thread with blocking sockets (`client.rs`); no shard runtime.

mod client;
mod cluster;
pub(crate) mod group;
pub(crate) mod message;
mod promote;
mod table;
pub(crate) mod topic;

use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::body::{ClusterInfo, TopicRouteData};
use crate::remoting::{request_code as rc, response_code};

use client::{Client, Reply};

/// Exit status of a failed command (bad arguments exit with clap's 2).
pub const EXIT_FAILURE: i32 = 1;
/// Default wait for each answer: QUERY_MESSAGE reads records from disk.
pub const TIMEOUT_DEFAULT_MS: u64 = 5_000;
/// Longest wait accepted for one answer.
pub const TIMEOUT_MAX_MS: u64 = 600_000;

/// Options shared by every admin command.
#[derive(Args, Debug)]
pub struct AdminArgs {
    /// Name server address(es): host:port[;host:port].
    #[arg(long, short = 'n', global = true, default_value = "127.0.0.1:9876")]
    pub namesrv: String,
    /// One JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Longest wait for a connection or an answer, in milliseconds.
    #[arg(long, global = true, default_value_t = TIMEOUT_DEFAULT_MS)]
    pub timeout_ms: u64,
    /// AccessKey to sign every request with (brokers with ACL on; mqadmin's -ak).
    #[arg(long, global = true, requires = "secret_key")]
    pub access_key: Option<String>,
    /// SecretKey of --access-key (mqadmin's -sk).
    #[arg(long, global = true, requires = "access_key")]
    pub secret_key: Option<String>,
    /// Speak TLS to the name server and brokers.
    #[arg(long, global = true)]
    pub tls: bool,
    /// Verify their certificates against these PEM CA certificates (without it, any
    /// certificate is taken, as RocketMQ's tools do without tls.client.trustCertPath).
    #[arg(long, global = true, requires = "tls")]
    pub tls_trust_cert_path: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// Which brokers a command addresses: one by address, the masters of a cluster, or (neither
/// given) every master the name server knows.
#[derive(Args, Debug, Clone, Default)]
pub struct Target {
    /// One broker, by address (host:port).
    #[arg(long, short = 'b')]
    pub broker: Option<String>,
    /// Every master of this cluster.
    #[arg(long, short = 'c')]
    pub cluster: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Clusters and their brokers, with each broker's version and message totals.
    #[command(name = "clusterList")]
    ClusterList {
        #[arg(long, short = 'c')]
        cluster: Option<String>,
    },
    /// Every runtime figure of brokers (GET_BROKER_RUNTIME_INFO).
    #[command(name = "brokerStatus")]
    BrokerStatus(Target),
    /// Ask brokers to delete their expired commitlog segments now, whatever the hour
    /// (DELETE_EXPIRED_COMMITLOG).
    #[command(name = "deleteExpiredCommitLog")]
    DeleteExpiredCommitLog(Target),
    /// Create or update a topic on the masters.
    #[command(name = "updateTopic")]
    UpdateTopic(topic::UpdateTopicArgs),
    /// Delete a topic from the masters and the name server.
    #[command(name = "deleteTopic")]
    DeleteTopic {
        #[arg(long, short = 't')]
        topic: String,
        #[arg(long, short = 'c')]
        cluster: Option<String>,
    },
    /// Names of all topics (of one cluster).
    #[command(name = "topicList")]
    TopicList {
        #[arg(long, short = 'c')]
        cluster: Option<String>,
    },
    /// A topic's route: its brokers and queue counts.
    #[command(name = "topicRoute")]
    TopicRoute {
        #[arg(long, short = 't')]
        topic: String,
    },
    /// Min offset, max offset and last update time of every queue of a topic.
    #[command(name = "topicStatus")]
    TopicStatus {
        #[arg(long, short = 't')]
        topic: String,
    },
    /// Create or update a subscription group on the masters.
    #[command(name = "updateSubGroup")]
    UpdateSubGroup(group::UpdateSubGroupArgs),
    /// Delete a subscription group (and its retry and DLQ topics) from the masters.
    #[command(name = "deleteSubGroup")]
    DeleteSubGroup {
        #[arg(long, short = 'g')]
        group: String,
        #[command(flatten)]
        target: Target,
        /// Also drop the group's committed offsets.
        #[arg(long)]
        remove_offset: bool,
    },
    /// The subscription groups the masters know.
    #[command(name = "subGroupList")]
    SubGroupList(Target),
    /// A consumer group's progress per queue (broker offset, consumer offset, lag) and its
    /// clients.
    #[command(name = "consumerProgress")]
    ConsumerProgress {
        #[arg(long, short = 'g')]
        group: String,
        /// Only this topic.
        #[arg(long, short = 't')]
        topic: Option<String>,
    },
    /// Move a group's offsets on a topic to the first message stored at or after a time.
    #[command(name = "resetOffsetByTime")]
    ResetOffsetByTime {
        #[arg(long, short = 'g')]
        group: String,
        #[arg(long, short = 't')]
        topic: String,
        /// Milliseconds since the epoch, `now`, or `now-10m` (s, m, h, d).
        #[arg(long, short = 's')]
        timestamp: String,
        /// Also move offsets forward (not only back).
        #[arg(long, short = 'f', default_value_t = true, action = clap::ArgAction::Set)]
        force: bool,
    },
    /// Messages of a topic by key (KEYS), newest first.
    #[command(name = "queryMsgByKey")]
    QueryMsgByKey(message::QueryByKeyArgs),
    /// A message by the id a send returned: an offset msgId, or a unique id (UNIQ_KEY).
    #[command(name = "queryMsgById")]
    QueryMsgById {
        #[arg(long, short = 'i')]
        id: String,
        /// The topic, for unique ids (without it every topic is searched).
        #[arg(long, short = 't')]
        topic: Option<String>,
    },
    /// A message of a topic by its unique id (UNIQ_KEY).
    #[command(name = "queryMsgByUniqueKey")]
    QueryMsgByUniqueKey {
        #[arg(long, short = 'i')]
        id: String,
        #[arg(long, short = 't')]
        topic: String,
    },
    /// The message at one queue position.
    #[command(name = "queryMsgByOffset")]
    QueryMsgByOffset {
        #[arg(long, short = 't')]
        topic: String,
        /// Broker name (as in the topic's route).
        #[arg(long, short = 'b')]
        broker: String,
        #[arg(long, short = 'q')]
        queue: u32,
        #[arg(long, short = 'o')]
        offset: u64,
    },
    /// Send one test message and print where it went.
    #[command(name = "sendMessage")]
    SendMessage(message::SendArgs),
    /// Make a slave the master of its broker name (what RocketMQ's operators do by
    /// restarting it with brokerId 0); says first what the promotion may lose.
    #[command(name = "promote")]
    Promote(promote::PromoteArgs),
}

/// What a command produced: the JSON document and the text for people.
pub struct Outcome {
    pub json: Value,
    pub text: String,
}

/// Runs one admin command; returns the process exit status.
pub fn run(args: AdminArgs) -> i32 {
    let timeout = Duration::from_millis(args.timeout_ms.clamp(1, TIMEOUT_MAX_MS));
    let credentials = match (&args.access_key, &args.secret_key) {
        (Some(access_key), Some(secret_key)) => Some(crate::remoting::signature::Credentials::new(
            access_key, secret_key,
        )),
        _ => None,
    };
    let tls = match args.tls {
        false => None,
        true => {
            let options = shardmq_client::TlsOptions {
                trust_cert_path: args.tls_trust_cert_path.clone(),
                client_cert: None,
            };
            match options.client_config() {
                Ok(config) => Some(config),
                Err(error) => {
                    eprintln!("shardmq admin: error: --tls: {error}");
                    return 1;
                }
            }
        }
    };
    let mut admin = Admin::new(&args.namesrv, timeout, credentials, tls);
    let result = execute(&mut admin, &args.command);
    for warning in &admin.warnings {
        eprintln!("shardmq admin: warning: {warning}");
    }
    match result {
        Ok(mut outcome) => {
            if args.json {
                if !admin.warnings.is_empty() {
                    if let Value::Object(map) = &mut outcome.json {
                        map.insert("warnings".into(), json!(admin.warnings));
                    }
                }
                println!("{}", outcome.json);
            } else {
                print!("{}", outcome.text);
            }
            0
        }
        Err(error) => {
            let text = format!("{error:#}");
            eprintln!("shardmq admin: error: {text}");
            if args.json {
                println!("{}", json!({ "error": text }));
            }
            EXIT_FAILURE
        }
    }
}

/// Runs one command against `admin`'s name server (the web console calls it too).
pub(crate) fn execute(admin: &mut Admin, command: &AdminCommand) -> anyhow::Result<Outcome> {
    match command {
        AdminCommand::ClusterList { cluster } => cluster::cluster_list(admin, cluster.as_deref()),
        AdminCommand::BrokerStatus(target) => cluster::broker_status(admin, target),
        AdminCommand::DeleteExpiredCommitLog(target) => {
            cluster::delete_expired_commit_log(admin, target)
        }
        AdminCommand::UpdateTopic(args) => topic::update_topic(admin, args),
        AdminCommand::DeleteTopic { topic, cluster } => {
            topic::delete_topic(admin, topic, cluster.as_deref())
        }
        AdminCommand::TopicList { cluster } => topic::topic_list(admin, cluster.as_deref()),
        AdminCommand::TopicRoute { topic } => topic::topic_route(admin, topic),
        AdminCommand::TopicStatus { topic } => topic::topic_status(admin, topic),
        AdminCommand::UpdateSubGroup(args) => group::update_sub_group(admin, args),
        AdminCommand::DeleteSubGroup {
            group,
            target,
            remove_offset,
        } => group::delete_sub_group(admin, group, target, *remove_offset),
        AdminCommand::SubGroupList(target) => group::sub_group_list(admin, target),
        AdminCommand::ConsumerProgress { group, topic } => {
            group::consumer_progress(admin, group, topic.as_deref())
        }
        AdminCommand::ResetOffsetByTime {
            group,
            topic,
            timestamp,
            force,
        } => group::reset_offset_by_time(admin, group, topic, timestamp, *force),
        AdminCommand::QueryMsgByKey(args) => message::query_by_key(admin, args),
        AdminCommand::QueryMsgById { id, topic } => {
            message::query_by_id(admin, id, topic.as_deref())
        }
        AdminCommand::QueryMsgByUniqueKey { id, topic } => {
            message::query_by_unique_key(admin, topic, id)
        }
        AdminCommand::QueryMsgByOffset {
            topic,
            broker,
            queue,
            offset,
        } => message::query_by_offset(admin, topic, broker, *queue, *offset),
        AdminCommand::SendMessage(args) => message::send_message(admin, args),
        AdminCommand::Promote(args) => promote::promote(admin, args),
    }
}

/// A broker endpoint the command talks to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BrokerRef {
    pub cluster: String,
    pub name: String,
    pub id: u64,
    pub addr: String,
}

/// The command's connections and what it learned on the way.
pub(crate) struct Admin {
    namesrv: Vec<String>,
    client: Client,
    /// Problems that did not stop the command (a broker that did not answer).
    pub warnings: Vec<String>,
}

impl Admin {
    pub(crate) fn new(
        namesrv: &str,
        timeout: Duration,
        credentials: Option<crate::remoting::signature::Credentials>,
        tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    ) -> Admin {
        Admin {
            namesrv: namesrv
                .split(';')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect(),
            client: Client::new(timeout, credentials, tls),
            warnings: Vec::new(),
        }
    }

    pub fn warn(&mut self, text: impl Into<String>) {
        self.warnings.push(text.into());
    }

    /// A request to the name server (the first of the list that answers).
    pub fn namesrv_call(&mut self, code: i32, ext: &[(&str, &str)]) -> anyhow::Result<Reply> {
        if self.namesrv.is_empty() {
            bail!("no name server given (--namesrv host:port)");
        }
        let mut failures = Vec::new();
        for addr in self.namesrv.clone() {
            match self.client.call(&addr, code, ext, &[]) {
                Ok(reply) => return Ok(reply),
                Err(error) => failures.push(format!("{addr}: {error:#}")),
            }
        }
        bail!("cannot reach the name server ({})", failures.join("; "))
    }

    /// A request to a broker.
    pub fn broker_call(
        &mut self,
        addr: &str,
        code: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        self.client
            .call(addr, code, ext, body)
            .map_err(|error| anyhow!("cannot reach broker {addr}: {error:#}"))
    }

    /// A broker request that must succeed; `what` names it in the error.
    pub fn broker_expect(
        &mut self,
        broker: &BrokerRef,
        code: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Reply> {
        let reply = self.broker_call(&broker.addr, code, ext, body)?;
        if !reply.is_success() {
            bail!(
                "broker {} ({}) refused {}: {}",
                broker.name,
                broker.addr,
                request_name(code),
                reply.describe()
            );
        }
        Ok(reply)
    }

    pub fn cluster_info(&mut self) -> anyhow::Result<ClusterInfo> {
        let reply = self.namesrv_call(rc::GET_BROKER_CLUSTER_INFO, &[])?;
        if !reply.is_success() {
            bail!(
                "the name server refused GET_BROKER_CLUSTER_INFO: {}",
                reply.describe()
            );
        }
        Ok(ClusterInfo::parse(&reply.body)?)
    }

    /// The topic's route; None when the name server has none.
    pub fn route_if_any(&mut self, topic: &str) -> anyhow::Result<Option<TopicRouteData>> {
        let reply = self.namesrv_call(rc::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic)])?;
        match reply.code {
            response_code::SUCCESS => Ok(Some(TopicRouteData::parse(&reply.body)?)),
            response_code::TOPIC_NOT_EXIST => Ok(None),
            _ => bail!(
                "the name server refused the route of topic {topic}: {}",
                reply.describe()
            ),
        }
    }

    /// The topic's route; an unknown topic is an error naming it.
    pub fn route(&mut self, topic: &str) -> anyhow::Result<TopicRouteData> {
        self.route_if_any(topic)?
            .ok_or_else(|| anyhow!("unknown topic {topic}: the name server has no route for it"))
    }

    /// The masters holding a topic, by broker name.
    pub fn topic_masters(&mut self, topic: &str) -> anyhow::Result<Vec<BrokerRef>> {
        let route = self.route(topic)?;
        Ok(route_masters(&route))
    }

    /// Brokers a `Target` names: the one given by address, or the masters of the cluster
    /// (every cluster when none is given). `all_ids`: slaves too.
    pub fn targets(&mut self, target: &Target, all_ids: bool) -> anyhow::Result<Vec<BrokerRef>> {
        if let Some(addr) = &target.broker {
            let info = self.cluster_info()?;
            let known = brokers_of(&info, None, true)
                .into_iter()
                .find(|b| &b.addr == addr);
            return Ok(vec![known.unwrap_or(BrokerRef {
                cluster: String::new(),
                name: addr.clone(),
                id: 0,
                addr: addr.clone(),
            })]);
        }
        let info = self.cluster_info()?;
        if let Some(cluster) = &target.cluster {
            if !info.cluster_addr_table.contains_key(cluster) {
                let known: Vec<&String> = info.cluster_addr_table.keys().collect();
                bail!("unknown cluster {cluster} (the name server knows {known:?})");
            }
        }
        let brokers = brokers_of(&info, target.cluster.as_deref(), all_ids);
        if brokers.is_empty() {
            bail!("the name server knows no broker");
        }
        Ok(brokers)
    }
}

/// Brokers of the cluster info: masters only unless `all_ids`; of one cluster if given.
pub(crate) fn brokers_of(
    info: &ClusterInfo,
    cluster: Option<&str>,
    all_ids: bool,
) -> Vec<BrokerRef> {
    let mut brokers = Vec::new();
    for (cluster_name, names) in &info.cluster_addr_table {
        if cluster.is_some_and(|c| c != cluster_name) {
            continue;
        }
        for name in names {
            let Some(data) = info.broker_addr_table.get(name) else {
                continue;
            };
            for (&id, addr) in &data.broker_addrs {
                if id == 0 || all_ids {
                    brokers.push(BrokerRef {
                        cluster: cluster_name.clone(),
                        name: name.clone(),
                        id,
                        addr: addr.clone(),
                    });
                }
            }
        }
    }
    brokers.sort();
    brokers
}

/// The masters of a route, by broker name.
pub(crate) fn route_masters(route: &TopicRouteData) -> Vec<BrokerRef> {
    let mut brokers: Vec<BrokerRef> = route
        .broker_datas
        .iter()
        .filter_map(|data| {
            Some(BrokerRef {
                cluster: data.cluster.clone(),
                name: data.broker_name.clone(),
                id: 0,
                addr: data.master_addr()?.to_string(),
            })
        })
        .collect();
    brokers.sort();
    brokers
}

/// RocketMQ's name of a request code, with the number: for messages.
pub(crate) fn request_name(code: i32) -> String {
    match crate::remoting::request_code_name(code) {
        Some(name) => format!("{name} ({code})"),
        None => format!("request {code}"),
    }
}

/// Wall-clock milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    crate::error::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        admin: AdminArgs,
    }

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["x", "--json", "queryMsgByKey", "-t", "T", "-k", "K"])
            .expect("global options before the command");
        assert!(cli.admin.json);
        let cli =
            Cli::try_parse_from(["x", "resetOffsetByTime", "-g", "G", "-t", "T", "-s", "now"])
                .expect("reset");
        assert!(matches!(
            cli.admin.command,
            AdminCommand::ResetOffsetByTime { force: true, .. }
        ));
    }
}
