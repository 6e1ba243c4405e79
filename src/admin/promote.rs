//! `promote`: a slave becomes the master of its broker name (what RocketMQ's operators do by
//! restarting it with brokerId 0), after saying what the promotion may lose.
//!
//! Each slave is asked for its runtime figures first: its log's end, what its master last
//! sent, and the master's role and log end at its last metadata copy. A slave still connected
//! to its master is refused (two masters of one name) unless `--force`. Without `--yes`
//! nothing changes: the warning is all. With it, each slave gets UPDATE_BROKER_CONFIG
//! `brokerRole=<role>`, `brokerId=0` (the broker side is `ha::promote`), and the command
//! prints the role and epoch each took.

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;

use crate::body::parse_kv_table;
use crate::remoting::request_code as rc;

use super::table::Table;
use super::{brokers_of, Admin, BrokerRef, Outcome};

#[derive(Args, Debug)]
pub struct PromoteArgs {
    /// A slave to promote, by address (host:port); repeat it for each shard of a node.
    #[arg(long, short = 'b', required_unless_present = "node")]
    pub broker: Vec<String>,
    /// Every slave registered from this host (all the shards of a slave node).
    #[arg(long, conflicts_with = "broker")]
    pub node: Option<String>,
    /// The role the slave takes.
    #[arg(long, default_value = "ASYNC_MASTER", value_parser = ["ASYNC_MASTER", "SYNC_MASTER"])]
    pub role: String,
    /// Promote. Without it, the command only says what a promotion would lose.
    #[arg(long)]
    pub yes: bool,
    /// Promote a slave even while it is connected to its master (two masters of one broker
    /// name until the old one stops: its new writes would not be on the promoted node).
    #[arg(long)]
    pub force: bool,
}

/// JSON: `{"promoted":[{"brokerName","addr","brokerRole","haEpoch","logEnd"}],
/// "warnings":[..]}`.
pub fn promote(admin: &mut Admin, args: &PromoteArgs) -> anyhow::Result<Outcome> {
    let slaves = targets(admin, args)?;
    let mut notes = Vec::new();
    let mut ends = Vec::new();
    for slave in &slaves {
        let figures = runtime(admin, slave)?;
        let figure = |key: &str| figures.get(key).map_or("", String::as_str);
        if figure("brokerRole") != "SLAVE" {
            bail!(
                "{} ({}) is brokerRole {}, not a SLAVE: nothing to promote",
                slave.name,
                slave.addr,
                figure("brokerRole")
            );
        }
        if figure("haConnectionState") == "CONNECTED" && !args.force {
            bail!(
                "{} ({}) is still connected to its master {}: promoting it now makes two \
                 masters of {} (what the old one takes after would not be on the promoted \
                 node). Stop the master first, or add --force",
                slave.name,
                slave.addr,
                figure("haMasterAddress"),
                slave.name
            );
        }
        let note = loss_note(&slave.name, &slave.addr, &figures);
        admin.warn(note.clone());
        notes.push(note);
        ends.push(figure("commitLogMaxOffset").to_string());
    }
    if !args.yes {
        bail!(
            "nothing promoted: read the warning(s) above, then run again with --yes to promote \
             {} slave(s)",
            slaves.len()
        );
    }
    let body = format!("brokerRole={}\nbrokerId=0\n", args.role);
    let mut table = Table::new(&["Broker", "Address", "Role", "Epoch (own log from@ms)"]);
    let mut promoted = Vec::new();
    for (slave, end) in slaves.iter().zip(ends) {
        admin
            .broker_expect(slave, rc::UPDATE_BROKER_CONFIG, &[], body.as_bytes())
            .with_context(|| format!("promoting {} ({})", slave.name, slave.addr))?;
        let figures = runtime(admin, slave)?;
        let figure = |key: &str| figures.get(key).cloned().unwrap_or_default();
        table.row(vec![
            slave.name.clone(),
            slave.addr.clone(),
            figure("brokerRole"),
            figure("haEpoch"),
        ]);
        promoted.push(json!({
            "brokerName": slave.name,
            "addr": slave.addr,
            "brokerRole": figure("brokerRole"),
            "haEpoch": figure("haEpoch"),
            "logEnd": end,
        }));
    }
    Ok(Outcome {
        json: json!({ "promoted": promoted }),
        text: format!(
            "{}\nThe namesrv now routes each broker name to its promoted master. Bring the old \
             master back only as a SLAVE (brokerRole=SLAVE, brokerId=1).\n",
            table.render()
        ),
    })
}

/// The slaves the arguments name.
fn targets(admin: &mut Admin, args: &PromoteArgs) -> anyhow::Result<Vec<BrokerRef>> {
    let info = admin.cluster_info()?;
    let known = brokers_of(&info, None, true);
    if let Some(node) = &args.node {
        let slaves: Vec<BrokerRef> = known
            .into_iter()
            .filter(|b| b.id > 0 && b.addr.rsplit_once(':').is_some_and(|(h, _)| h == node))
            .collect();
        if slaves.is_empty() {
            bail!("the name server knows no slave (brokerId > 0) at {node}");
        }
        return Ok(slaves);
    }
    Ok(args
        .broker
        .iter()
        .map(|addr| {
            known
                .iter()
                .find(|b| &b.addr == addr)
                .cloned()
                .unwrap_or(BrokerRef {
                    cluster: String::new(),
                    name: addr.clone(),
                    id: 1,
                    addr: addr.clone(),
                })
        })
        .collect())
}

fn runtime(admin: &mut Admin, broker: &BrokerRef) -> anyhow::Result<BTreeMap<String, String>> {
    let reply = admin.broker_expect(broker, rc::GET_BROKER_RUNTIME_INFO, &[], &[])?;
    Ok(parse_kv_table(&reply.body)?)
}

/// What promoting this slave may lose, from its figures.
fn loss_note(name: &str, addr: &str, figures: &BTreeMap<String, String>) -> String {
    let number = |key: &str| figures.get(key).and_then(|v| v.parse::<u64>().ok());
    let end = number("commitLogMaxOffset").unwrap_or(0);
    let mut note = format!("{name} ({addr}): its log ends at {end}");
    if let Some(sent) = number("haMasterOffset").filter(|&sent| sent > end) {
        note.push_str(&format!(
            "; its master had sent up to {sent} (the {} bytes between, part of a record the \
             link cut, are dropped)",
            sent - end
        ));
    }
    let role = figures.get("haMasterRole").map(String::as_str);
    if let (Some(master_end), Some(ago)) = (
        number("haMasterCommitLogMaxOffset"),
        number("haMasterSeenMsAgo"),
    ) {
        note.push_str(&format!(
            "; {:.0} s ago its master said it was {} with its log at {master_end}",
            ago as f64 / 1000.0,
            role.unwrap_or("?")
        ));
    }
    note.push_str(". ");
    if role == Some("SYNC_MASTER") {
        note.push_str(
            "SYNC_MASTER: every send it answered SUCCESS is on this slave; sends it answered \
             SLAVE_NOT_AVAILABLE (11) or FLUSH_SLAVE_TIMEOUT (12) may not be.",
        );
    } else {
        let behind = match number("haMasterCommitLogMaxOffset") {
            Some(master_end) => format!(
                "{} bytes by its last figure, more if it took sends after it",
                master_end.saturating_sub(end)
            ),
            None => "how many is not known: this slave has not heard from its master since \
                     it started"
                .into(),
        };
        note.push_str(&format!(
            "ASYNC_MASTER (or unknown): messages it acknowledged after the last bytes it sent \
             this slave are not here ({behind}); they stay on the old master's disk only, and \
             consumers of the promoted node will not see them."
        ));
    }
    note
}
