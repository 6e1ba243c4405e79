//! `clusterList` and `brokerStatus`: the name server's cluster table and each broker's
//! GET_BROKER_RUNTIME_INFO (a KVTable of text figures).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::body::parse_kv_table;
use crate::remoting::request_code as rc;

use super::table::Table;
use super::{brokers_of, Admin, BrokerRef, Outcome, Target};

/// The broker's runtime figures; an unreachable or refusing broker is a warning and None.
fn runtime_info(admin: &mut Admin, broker: &BrokerRef) -> Option<BTreeMap<String, String>> {
    let answer = admin
        .broker_expect(broker, rc::GET_BROKER_RUNTIME_INFO, &[], &[])
        .and_then(|reply| Ok(parse_kv_table(&reply.body)?));
    match answer {
        Ok(table) => Some(table),
        Err(error) => {
            admin.warn(format!("{error:#}"));
            None
        }
    }
}

fn figure<'a>(runtime: Option<&'a BTreeMap<String, String>>, key: &str) -> &'a str {
    runtime.and_then(|r| r.get(key)).map_or("-", String::as_str)
}

/// JSON: `{"clusters":[{"name","brokers":[{"brokerName","brokerId","addr","reachable",
/// "version","runtime":{..}}]}]}`.
pub fn cluster_list(admin: &mut Admin, cluster: Option<&str>) -> anyhow::Result<Outcome> {
    let target = Target {
        broker: None,
        cluster: cluster.map(String::from),
    };
    // Validates the cluster name; then every broker id, slaves included.
    admin.targets(&target, true)?;
    let info = admin.cluster_info()?;
    let mut table = Table::new(&[
        "Cluster Name",
        "Broker Name",
        "BID",
        "Addr",
        "Version",
        "PutTotal",
        "GetTotal",
        "CommitLogMax",
    ]);
    let mut clusters: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for broker in brokers_of(&info, cluster, true) {
        let runtime = runtime_info(admin, &broker);
        let version = runtime
            .as_ref()
            .and_then(|r| {
                r.get("brokerVersionDesc")
                    .or_else(|| r.get("brokerVersion"))
            })
            .cloned()
            .unwrap_or_else(|| "-".into());
        table.row(vec![
            broker.cluster.clone(),
            broker.name.clone(),
            broker.id.to_string(),
            broker.addr.clone(),
            version.clone(),
            figure(runtime.as_ref(), "msgPutTotalTodayNow").into(),
            figure(runtime.as_ref(), "msgGetTotalTodayNow").into(),
            figure(runtime.as_ref(), "commitLogMaxOffset").into(),
        ]);
        clusters
            .entry(broker.cluster.clone())
            .or_default()
            .push(json!({
                "brokerName": broker.name,
                "brokerId": broker.id,
                "addr": broker.addr,
                "reachable": runtime.is_some(),
                "version": version,
                "runtime": runtime.unwrap_or_default(),
            }));
    }
    let clusters: Vec<Value> = clusters
        .into_iter()
        .map(|(name, brokers)| json!({ "name": name, "brokers": brokers }))
        .collect();
    Ok(Outcome {
        json: json!({ "clusters": clusters }),
        text: table.render(),
    })
}

/// JSON: `{"brokers":[{"brokerName","addr","runtime":{..}}]}`; a broker that does not answer
/// fails the command when it was named alone, and is a warning otherwise.
pub fn broker_status(admin: &mut Admin, target: &Target) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(target, target.cluster.is_none())?;
    let single = brokers.len() == 1;
    let mut text = String::new();
    let mut entries = Vec::new();
    for broker in brokers {
        let runtime = if single {
            let reply = admin.broker_expect(&broker, rc::GET_BROKER_RUNTIME_INFO, &[], &[])?;
            parse_kv_table(&reply.body)?
        } else {
            match runtime_info(admin, &broker) {
                Some(runtime) => runtime,
                None => continue,
            }
        };
        let mut table = Table::new(&["Key", "Value"]);
        for (key, value) in &runtime {
            table.row(vec![key.clone(), value.clone()]);
        }
        text.push_str(&format!("Broker {} ({})\n", broker.name, broker.addr));
        text.push_str(&table.render());
        text.push('\n');
        entries.push(json!({
            "brokerName": broker.name,
            "addr": broker.addr,
            "runtime": runtime,
        }));
    }
    Ok(Outcome {
        json: json!({ "brokers": entries }),
        text,
    })
}

/// `deleteExpiredCommitLog`: DELETE_EXPIRED_COMMITLOG (329) to every target broker, which then
/// deletes its expired commitlog segments whatever the hour (mqadmin's command of that name).
/// JSON: `{"brokers":[{"brokerName","addr","ok","error"?}]}`; fails when no broker took it.
pub fn delete_expired_commit_log(admin: &mut Admin, target: &Target) -> anyhow::Result<Outcome> {
    let brokers = admin.targets(target, false)?;
    let mut table = Table::new(&["Broker", "Address", "Result"]);
    let mut entries = Vec::new();
    let mut taken = 0;
    for broker in brokers {
        match admin.broker_expect(&broker, rc::DELETE_EXPIRED_COMMITLOG, &[], &[]) {
            Ok(_) => {
                taken += 1;
                table.row(vec![
                    broker.name.clone(),
                    broker.addr.clone(),
                    "success".into(),
                ]);
                entries.push(json!({"brokerName": broker.name, "addr": broker.addr, "ok": true}));
            }
            Err(error) => {
                let text = format!("{error:#}");
                table.row(vec![broker.name.clone(), broker.addr.clone(), text.clone()]);
                entries.push(json!({
                    "brokerName": broker.name, "addr": broker.addr, "ok": false, "error": text
                }));
            }
        }
    }
    if taken == 0 {
        anyhow::bail!(
            "no broker took DELETE_EXPIRED_COMMITLOG:\n{}",
            table.render()
        );
    }
    Ok(Outcome {
        json: json!({ "brokers": entries }),
        text: table.render(),
    })
}
