//! Route bodies: `TopicRouteData` (GET_ROUTEINFO_BY_TOPIC) and `ClusterInfo`
//! (GET_BROKER_CLUSTER_INFO), REMOTING.md §4.2, §4.3, §4.6.
//!
//! Writing follows the rule every client parses: strict standard JSON, **no whitespace at
//! all** (Go splits `brokerAddrs` as raw text), numeric keys quoted (`"0"`), every member
//! present (`filterServerTable` `{}`, `enableActingMaster`, `topicSysFlag`), nulls omitted.
//! Reading accepts Java's bare numeric keys (`{0:"addr"}`) and missing members.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::json::{encode_compact, parse_object, Fields};
use super::BodyError;

/// One broker name's queues for a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueData {
    pub broker_name: String,
    pub read_queue_nums: u32,
    pub write_queue_nums: u32,
    pub perm: u32,
    pub topic_sys_flag: u32,
}

/// One broker name's addresses by broker id (0 = master).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerData {
    pub cluster: String,
    pub broker_name: String,
    pub broker_addrs: BTreeMap<u64, String>,
    pub enable_acting_master: bool,
}

/// GET_ROUTEINFO_BY_TOPIC response body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopicRouteData {
    pub order_topic_conf: Option<String>,
    pub queue_datas: Vec<QueueData>,
    pub broker_datas: Vec<BrokerData>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QueueDataWire<'a> {
    broker_name: &'a str,
    perm: u32,
    read_queue_nums: u32,
    topic_sys_flag: u32,
    write_queue_nums: u32,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BrokerDataWire<'a> {
    /// serde_json writes integer map keys quoted: `{"0":"addr"}`.
    broker_addrs: &'a BTreeMap<u64, String>,
    broker_name: &'a str,
    cluster: &'a str,
    enable_acting_master: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TopicRouteWire<'a> {
    broker_datas: Vec<BrokerDataWire<'a>>,
    /// Always `{}`: filter servers are long gone, but the Rust client requires the member.
    filter_server_table: BTreeMap<String, Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_topic_conf: Option<&'a str>,
    queue_datas: Vec<QueueDataWire<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterInfoWire<'a> {
    broker_addr_table: BTreeMap<&'a str, BrokerDataWire<'a>>,
    cluster_addr_table: &'a BTreeMap<String, BTreeSet<String>>,
}

impl QueueData {
    fn wire(&self) -> QueueDataWire<'_> {
        QueueDataWire {
            broker_name: &self.broker_name,
            perm: self.perm,
            read_queue_nums: self.read_queue_nums,
            topic_sys_flag: self.topic_sys_flag,
            write_queue_nums: self.write_queue_nums,
        }
    }

    fn from_fields(fields: Fields<'_>) -> Result<QueueData, BodyError> {
        Ok(QueueData {
            broker_name: fields.required_string("brokerName")?,
            read_queue_nums: fields.u32("readQueueNums")?.unwrap_or(0),
            write_queue_nums: fields.u32("writeQueueNums")?.unwrap_or(0),
            perm: fields.u32("perm")?.unwrap_or(0),
            topic_sys_flag: fields.u32("topicSysFlag")?.unwrap_or(0),
        })
    }
}

impl BrokerData {
    fn wire(&self) -> BrokerDataWire<'_> {
        BrokerDataWire {
            broker_addrs: &self.broker_addrs,
            broker_name: &self.broker_name,
            cluster: &self.cluster,
            enable_acting_master: self.enable_acting_master,
        }
    }

    fn from_fields(fields: Fields<'_>) -> Result<BrokerData, BodyError> {
        let mut broker_addrs = BTreeMap::new();
        if let Some(addrs) = fields.object("brokerAddrs")? {
            for (id, addr) in addrs.map.iter().filter(|(_, addr)| !addr.is_null()) {
                let id = id.trim().parse::<u64>().map_err(|_| {
                    BodyError::malformed(fields.what, format!("brokerAddrs: bad broker id {id:?}"))
                })?;
                let addr = addr.as_str().ok_or_else(|| {
                    BodyError::malformed(fields.what, "brokerAddrs: address is not a string")
                })?;
                broker_addrs.insert(id, addr.to_string());
            }
        }
        Ok(BrokerData {
            cluster: fields.string("cluster")?.unwrap_or_default(),
            broker_name: fields.required_string("brokerName")?,
            broker_addrs,
            enable_acting_master: fields.bool("enableActingMaster")?.unwrap_or(false),
        })
    }

    /// The master's address (broker id 0), where clients send and commit.
    pub fn master_addr(&self) -> Option<&str> {
        self.broker_addrs.get(&0).map(String::as_str)
    }
}

impl TopicRouteData {
    /// Strict compact JSON, numeric keys quoted, nulls omitted.
    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&TopicRouteWire {
            broker_datas: self.broker_datas.iter().map(BrokerData::wire).collect(),
            filter_server_table: BTreeMap::new(),
            order_topic_conf: self.order_topic_conf.as_deref(),
            queue_datas: self.queue_datas.iter().map(QueueData::wire).collect(),
        })
    }

    /// Lenient: bare or quoted numeric keys, nulls, unknown members (zoneName, static-topic maps).
    pub fn parse(body: &[u8]) -> Result<TopicRouteData, BodyError> {
        const WHAT: &str = "TopicRouteData";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let queue_datas = fields
            .array("queueDatas")?
            .iter()
            .map(|item| QueueData::from_fields(Fields::of(WHAT, item)?))
            .collect::<Result<Vec<_>, _>>()?;
        let broker_datas = fields
            .array("brokerDatas")?
            .iter()
            .map(|item| BrokerData::from_fields(Fields::of(WHAT, item)?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TopicRouteData {
            order_topic_conf: fields.string("orderTopicConf")?,
            queue_datas,
            broker_datas,
        })
    }
}

/// GET_BROKER_CLUSTER_INFO response body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterInfo {
    /// Broker name → its addresses.
    pub broker_addr_table: BTreeMap<String, BrokerData>,
    /// Cluster name → broker names.
    pub cluster_addr_table: BTreeMap<String, BTreeSet<String>>,
}

impl ClusterInfo {
    /// Strict compact JSON with quoted broker-id keys (Java writes bare ones here).
    pub fn encode(&self) -> Vec<u8> {
        encode_compact(&ClusterInfoWire {
            broker_addr_table: self
                .broker_addr_table
                .iter()
                .map(|(name, data)| (name.as_str(), data.wire()))
                .collect(),
            cluster_addr_table: &self.cluster_addr_table,
        })
    }

    pub fn parse(body: &[u8]) -> Result<ClusterInfo, BodyError> {
        const WHAT: &str = "ClusterInfo";
        let map = parse_object(WHAT, body)?;
        let fields = Fields::new(WHAT, &map);
        let mut broker_addr_table = BTreeMap::new();
        if let Some(table) = fields.object("brokerAddrTable")? {
            for (name, value) in table.map.iter().filter(|(_, value)| !value.is_null()) {
                broker_addr_table.insert(
                    name.clone(),
                    BrokerData::from_fields(Fields::of(WHAT, value)?)?,
                );
            }
        }
        let mut cluster_addr_table = BTreeMap::new();
        if let Some(table) = fields.object("clusterAddrTable")? {
            for name in table.map.keys() {
                let brokers = table.string_array(name)?;
                cluster_addr_table.insert(name.clone(), brokers.into_iter().collect());
            }
        }
        Ok(ClusterInfo {
            broker_addr_table,
            cluster_addr_table,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample_route() -> TopicRouteData {
        TopicRouteData {
            order_topic_conf: None,
            queue_datas: vec![QueueData {
                broker_name: "broker-a".into(),
                read_queue_nums: 4,
                write_queue_nums: 4,
                perm: 6,
                topic_sys_flag: 0,
            }],
            broker_datas: vec![BrokerData {
                cluster: "DefaultCluster".into(),
                broker_name: "broker-a".into(),
                broker_addrs: BTreeMap::from([
                    (0, "10.0.0.1:10911".into()),
                    (1, "10.0.0.2:10911".into()),
                ]),
                enable_acting_master: false,
            }],
        }
    }

    #[test]
    fn route_matches_reference_bytes() {
        let expected = r#"{"brokerDatas":[{"brokerAddrs":{"0":"10.0.0.1:10911","1":"10.0.0.2:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;
        assert_eq!(
            String::from_utf8(sample_route().encode()).ok().as_deref(),
            Some(expected)
        );
    }

    #[test]
    fn route_parses_bare_keys_and_nulls() {
        let body = br#"{"orderTopicConf":null,"brokerDatas":[{"brokerAddrs":{0:"a:1", 1 : "b:2"},"brokerName":"b","cluster":"c","zoneName":null}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":"6","readQueueNums":4,"writeQueueNums":4}]}"#;
        let route = TopicRouteData::parse(body).expect("parses");
        assert_eq!(route.order_topic_conf, None);
        assert_eq!(route.broker_datas[0].master_addr(), Some("a:1"));
        assert_eq!(
            route.broker_datas[0]
                .broker_addrs
                .get(&1)
                .map(String::as_str),
            Some("b:2")
        );
        assert_eq!(route.queue_datas[0].perm, 6);
        assert!(TopicRouteData::parse(
            br#"{"brokerDatas":[{"brokerName":"b","brokerAddrs":{"x":"a"}}]}"#
        )
        .is_err());
    }

    #[test]
    fn cluster_info_shape() {
        let route = sample_route();
        let info = ClusterInfo {
            broker_addr_table: BTreeMap::from([("broker-a".into(), route.broker_datas[0].clone())]),
            cluster_addr_table: BTreeMap::from([(
                "DefaultCluster".into(),
                BTreeSet::from(["broker-a".into()]),
            )]),
        };
        let text = String::from_utf8(info.encode()).unwrap_or_default();
        assert!(text.starts_with(r#"{"brokerAddrTable":{"broker-a":{"brokerAddrs":{"0":"#));
        assert!(text.ends_with(r#""clusterAddrTable":{"DefaultCluster":["broker-a"]}}"#));
        let bare = text.replace(r#""0":"#, "0:").replace(r#""1":"#, "1:");
        assert_eq!(ClusterInfo::parse(bare.as_bytes()).ok(), Some(info));
    }

    fn broker_data_strategy() -> impl Strategy<Value = BrokerData> {
        (
            "[a-z-]{1,8}",
            "[a-z-]{1,8}",
            proptest::collection::btree_map(any::<u64>(), "[0-9.:]{3,21}", 0..4),
            any::<bool>(),
        )
            .prop_map(
                |(cluster, broker_name, broker_addrs, enable_acting_master)| BrokerData {
                    cluster,
                    broker_name,
                    broker_addrs,
                    enable_acting_master,
                },
            )
    }

    fn route_strategy() -> impl Strategy<Value = TopicRouteData> {
        let queue =
            ("\\PC{1,8}", any::<(u32, u32, u32, u32)>()).prop_map(|(broker_name, (r, w, p, f))| {
                QueueData {
                    broker_name,
                    read_queue_nums: r,
                    write_queue_nums: w,
                    perm: p,
                    topic_sys_flag: f,
                }
            });
        (
            proptest::option::of("[a-z:;0-9]{0,12}"),
            proptest::collection::vec(queue, 0..4),
            proptest::collection::vec(broker_data_strategy(), 0..4),
        )
            .prop_map(
                |(order_topic_conf, queue_datas, broker_datas)| TopicRouteData {
                    order_topic_conf,
                    queue_datas,
                    broker_datas,
                },
            )
    }

    /// Java's pre-401 form: every quoted numeric key made bare.
    fn make_keys_bare(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("\"brokerAddrs\":{") {
            let (head, tail) = rest.split_at(start + "\"brokerAddrs\":{".len());
            out.push_str(head);
            let end = tail.find('}').unwrap_or(tail.len());
            let addrs = &tail[..end];
            // Keys are `"<digits>":`; addresses contain no quotes-colon after digits.
            let mut piece = String::new();
            for entry in addrs.split(",\"") {
                let entry = entry.trim_start_matches('"');
                if !piece.is_empty() {
                    piece.push(',');
                }
                piece.push_str(&entry.replacen("\":", ":", 1));
            }
            out.push_str(&piece);
            rest = &tail[end..];
        }
        out.push_str(rest);
        out
    }

    proptest! {
        #[test]
        fn route_round_trip(route in route_strategy()) {
            let encoded = route.encode();
            prop_assert!(!encoded.iter().any(|b| b.is_ascii_whitespace() && *b != b' ') );
            prop_assert_eq!(TopicRouteData::parse(&encoded).ok(), Some(route.clone()));
            let bare = make_keys_bare(&String::from_utf8_lossy(&encoded));
            prop_assert_eq!(TopicRouteData::parse(bare.as_bytes()).ok(), Some(route));
        }

        #[test]
        fn cluster_info_round_trip(brokers in proptest::collection::vec(broker_data_strategy(), 0..4)) {
            let mut info = ClusterInfo::default();
            for broker in brokers {
                info.cluster_addr_table.entry(broker.cluster.clone()).or_default().insert(broker.broker_name.clone());
                info.broker_addr_table.insert(broker.broker_name.clone(), broker);
            }
            prop_assert_eq!(ClusterInfo::parse(&info.encode()).ok(), Some(info));
        }
    }
}
