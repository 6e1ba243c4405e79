//! The in-process harness: a `Broker` over a temporary store on one executor, with a clock
//! the test moves by hand and connections without sockets whose answers the test reads as
//! frames. Handler behaviour — a parked pull woken by a send, a pull that times out when the
//! clock passes its suspend timeout, a transaction check round — is tested here without a
//! network, a process or a sleep; the end-to-end suite (tests/) stays for the wire and the
//! real clients.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

use shards::store::{Clock, Store, StoreConfig};

use crate::body::{HeartbeatData, TopicConfig};
use crate::remoting::{decode_frame, request_code, FrameEncoder};
use crate::server::Connection;

use super::{Broker, BrokerIdentity, BrokerOptions};

/// Longest `Harness::answers` waits for an answer that is due.
const ANSWER_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// Executor turns `Harness::quiet` lets pass.
const QUIET_TURNS: usize = 32;

/// A clock the test moves: wall and monotonic time advance together.
pub struct ManualClock {
    wall_ms: Cell<i64>,
    monotonic_ms: Cell<u64>,
}

impl ManualClock {
    pub fn advance(&self, ms: u64) {
        self.wall_ms.set(self.wall_ms.get() + ms as i64);
        self.monotonic_ms.set(self.monotonic_ms.get() + ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.wall_ms.get()
    }

    fn monotonic_ms(&self) -> u64 {
        self.monotonic_ms.get()
    }
}

/// An answer or a broker-to-client request, owned.
#[derive(Debug, Clone)]
pub struct Frame {
    pub code: i32,
    pub opaque: i32,
    pub is_response: bool,
    pub remark: Option<String>,
    pub ext: std::collections::BTreeMap<String, String>,
    pub body: Vec<u8>,
}

pub struct Harness {
    pub broker: Rc<Broker>,
    pub clock: Rc<ManualClock>,
    next_connection: Cell<u64>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A broker on a fresh store in a temporary directory, its clock at 1 700 000 000 000 ms.
    pub async fn start() -> Harness {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let address = "127.0.0.1:10911".parse().expect("an address");
        let mut config = StoreConfig::new(dir.path().join("store"), address);
        config.segment_size_bytes = 4 << 20;
        let clock = Rc::new(ManualClock {
            wall_ms: Cell::new(1_700_000_000_000),
            monotonic_ms: Cell::new(1_000),
        });
        let store = Store::open_with_clock(config, clock.clone())
            .await
            .expect("a store");
        let identity = BrokerIdentity {
            cluster_name: "HarnessCluster".into(),
            broker_name: "harness-0".into(),
            address,
            shard_dir: dir.path().to_path_buf(),
        };
        let broker = Rc::new(Broker::new(
            identity,
            store,
            Box::new(|_| {}),
            BrokerOptions::default(),
        ));
        broker.start_persisters();
        Harness {
            broker,
            clock,
            next_connection: Cell::new(1),
            _dir: dir,
        }
    }

    /// A client connection (no socket).
    pub fn connection(&self) -> Rc<Connection> {
        let id = self.next_connection.get();
        self.next_connection.set(id + 1);
        let peer = SocketAddr::from(([127, 0, 0, 1], 40_000 + id as u16));
        Connection::detached(1_000_000 + id, peer)
    }

    /// Hands `connection`'s request `code` with `ext` and `body` to the broker.
    pub fn request(
        &self,
        connection: &Rc<Connection>,
        code: i32,
        opaque: i32,
        ext: &[(&str, &str)],
        body: &[u8],
    ) {
        let mut frame = Vec::new();
        let mut encoder = FrameEncoder::request(&mut frame, code, opaque, false);
        for (key, value) in ext {
            encoder.ext(key, value);
        }
        encoder.finish(body);
        let (command, _) = decode_frame(&frame)
            .expect("our own frame decodes")
            .expect("a whole frame");
        self.broker.handle(&command, connection);
    }

    /// Waits until `connection` has output (the shard's tasks, and the helper thread that
    /// writes config files, run meanwhile), at most `ANSWER_WAIT_MAX`; its frames.
    pub async fn answers(&self, connection: &Rc<Connection>) -> Vec<Frame> {
        let deadline = std::time::Instant::now() + ANSWER_WAIT_MAX;
        loop {
            let bytes = connection.take_output();
            if !bytes.is_empty() || std::time::Instant::now() >= deadline {
                return decode_all(&bytes);
            }
            shards::runtime::yield_now().await;
            shards::runtime::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Lets the shard's tasks run a few turns (no clock involved) and returns what
    /// `connection` has then: for "nothing is answered yet".
    pub async fn quiet(&self, connection: &Rc<Connection>) -> Vec<Frame> {
        for _ in 0..QUIET_TURNS {
            shards::runtime::yield_now().await;
        }
        decode_all(&connection.take_output())
    }

    /// Moves the clock and runs one tick (the long-poll wheel's clock).
    pub fn advance(&self, ms: u64) {
        self.clock.advance(ms);
        self.broker.tick();
    }

    /// Creates `topic` with `queues` queues (as UPDATE_AND_CREATE_TOPIC would).
    pub fn create_topic(&self, topic: &str, queues: u32) {
        self.broker
            .upsert_topic_everywhere(TopicConfig::new(topic, queues, 6));
    }

    /// A producer of `group` registered on `connection` (HEART_BEAT).
    pub async fn register_producer(&self, connection: &Rc<Connection>, group: &str) {
        let data = HeartbeatData {
            client_id: format!("client-{}", connection.id),
            producer_groups: vec![group.to_string()],
            consumers: Vec::new(),
        };
        self.request(connection, request_code::HEART_BEAT, 1, &[], &data.encode());
        let answers = self.answers(connection).await;
        assert_eq!(answers.first().map(|a| a.code), Some(0), "{answers:?}");
    }
}

fn decode_all(mut bytes: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Ok(Some((command, used))) = decode_frame(bytes) {
        frames.push(Frame {
            code: command.code,
            opaque: command.opaque,
            is_response: command.is_response(),
            remark: command.remark.as_ref().map(|r| r.to_string()),
            ext: command.ext_fields.collect_owned(),
            body: command.body.to_vec(),
        });
        bytes = &bytes[used..];
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remoting::response_code;

    fn send_ext<'a>(
        topic: &'a str,
        queue: &'a str,
        properties: &'a str,
    ) -> Vec<(&'a str, &'a str)> {
        vec![
            ("a", "producers"),
            ("b", topic),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", queue),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", properties),
            ("j", "0"),
        ]
    }

    fn pull_ext<'a>(
        topic: &'a str,
        queue: &'a str,
        suspend_ms: &'a str,
    ) -> Vec<(&'a str, &'a str)> {
        vec![
            ("consumerGroup", "readers"),
            ("topic", topic),
            ("queueId", queue),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
            ("sysFlag", "2"),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", suspend_ms),
            ("subscription", "*"),
            ("subVersion", "0"),
        ]
    }

    #[test]
    fn who_consumes_a_topic_lists_subscribed_groups_and_groups_with_offsets() {
        shards::runtime::run_local(|| async {
            let harness = Harness::start().await;
            harness.create_topic("Watched", 2);
            let client = harness.connection();
            let commit = [
                ("consumerGroup", "committed"),
                ("topic", "Watched"),
                ("queueId", "1"),
                ("commitOffset", "0"),
            ];
            let code = request_code::UPDATE_CONSUMER_OFFSET;
            harness.request(&client, code, 1, &commit, &[]);
            harness.answers(&client).await;
            let beat = HeartbeatData::parse(
                br#"{"clientID":"c1","producerDataSet":[],"consumerDataSet":[{"groupName":"online","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"topic":"Watched","subString":"*"}]}]}"#,
            )
            .unwrap();
            harness.request(&client, request_code::HEART_BEAT, 2, &[], &beat.encode());
            harness.answers(&client).await;
            let code = request_code::QUERY_TOPIC_CONSUME_BY_WHO;
            harness.request(&client, code, 3, &[("topic", "Watched")], &[]);
            let answer = harness.answers(&client).await;
            assert_eq!(answer[0].code, response_code::SUCCESS, "{answer:?}");
            let body: serde_json::Value = serde_json::from_slice(&answer[0].body).unwrap();
            assert_eq!(
                body,
                serde_json::json!({"groupList": ["committed", "online"]})
            );
        });
    }

    #[test]
    fn the_producers_of_a_group_are_listed_and_an_unknown_group_is_refused() {
        shards::runtime::run_local(|| async {
            let harness = Harness::start().await;
            let producer = harness.connection();
            harness.register_producer(&producer, "makers").await;
            let admin = harness.connection();
            let code = request_code::GET_PRODUCER_CONNECTION_LIST;
            harness.request(&admin, code, 1, &[("producerGroup", "makers")], &[]);
            let answer = harness.answers(&admin).await;
            assert_eq!(answer[0].code, response_code::SUCCESS, "{answer:?}");
            let body: serde_json::Value = serde_json::from_slice(&answer[0].body).unwrap();
            let connections = body["connectionSet"].as_array().unwrap();
            assert_eq!(connections.len(), 1, "{body}");
            assert_eq!(
                connections[0]["clientId"],
                format!("client-{}", producer.id)
            );
            assert_eq!(connections[0]["clientAddr"], producer.peer.to_string());
            harness.request(&admin, request_code::GET_ALL_PRODUCER_INFO, 3, &[], &[]);
            let answer = harness.answers(&admin).await;
            let body: serde_json::Value = serde_json::from_slice(&answer[0].body).unwrap();
            let makers = body["data"]["makers"].as_array().unwrap();
            assert_eq!(makers.len(), 1, "{body}");
            assert_eq!(makers[0]["remoteIP"], format!("/{}", producer.peer));
            assert_eq!(makers[0]["lastUpdateTimestamp"], 1_700_000_000_000i64);
            harness.request(&admin, code, 2, &[("producerGroup", "nobody")], &[]);
            let answer = harness.answers(&admin).await;
            assert_eq!(answer[0].code, response_code::SYSTEM_ERROR);
            assert_eq!(
                answer[0].remark.as_deref(),
                Some("the producer group[nobody] not exist")
            );
        });
    }

    #[test]
    fn a_parked_pull_is_woken_by_a_send_to_its_queue() {
        shards::runtime::run_local(|| async {
            let harness = Harness::start().await;
            harness.create_topic("Parked", 4);
            let consumer = harness.connection();
            let producer = harness.connection();
            let pull = pull_ext("Parked", "2", "15000");
            harness.request(&consumer, request_code::PULL_MESSAGE, 7, &pull, &[]);
            assert!(
                harness.quiet(&consumer).await.is_empty(),
                "an empty queue parks the pull"
            );
            assert_eq!(harness.broker.pull_waiters.len(), 1);
            let send = send_ext("Parked", "2", "TAGS\u{1}a\u{2}");
            harness.request(&producer, request_code::SEND_MESSAGE_V2, 8, &send, b"hello");
            let sent = harness.answers(&producer).await;
            assert_eq!(sent[0].code, response_code::SUCCESS, "{sent:?}");
            let woken = harness.answers(&consumer).await;
            assert_eq!(woken.len(), 1, "the send woke the parked pull");
            assert_eq!(
                (woken[0].code, woken[0].opaque),
                (response_code::SUCCESS, 7)
            );
            let stored = crate::record::decode_all(&woken[0].body).unwrap();
            assert_eq!(stored[0].body, b"hello");
            assert_eq!(harness.broker.pull_waiters.len(), 0);
        });
    }

    #[test]
    fn a_parked_pull_is_answered_not_found_when_the_clock_passes_its_timeout() {
        shards::runtime::run_local(|| async {
            let harness = Harness::start().await;
            harness.create_topic("Quiet", 4);
            let consumer = harness.connection();
            let pull = pull_ext("Quiet", "0", "15000");
            harness.request(&consumer, request_code::PULL_MESSAGE, 9, &pull, &[]);
            assert!(harness.quiet(&consumer).await.is_empty());
            harness.advance(14_000);
            assert!(
                harness.quiet(&consumer).await.is_empty(),
                "still held before its timeout"
            );
            harness.advance(1_100);
            let answer = harness.answers(&consumer).await;
            assert_eq!(answer.len(), 1);
            assert_eq!(answer[0].code, response_code::PULL_NOT_FOUND, "{answer:?}");
        });
    }

    #[test]
    fn a_transaction_check_round_asks_a_live_producer_about_an_old_half() {
        shards::runtime::run_local(|| async {
            let harness = Harness::start().await;
            harness.create_topic("Orders", 4);
            let producer = harness.connection();
            harness.register_producer(&producer, "producers").await;
            let properties = "TRAN_MSG\u{1}true\u{2}PGROUP\u{1}producers\u{2}UNIQ_KEY\u{1}TX1\u{2}";
            let send = send_ext("Orders", "1", properties);
            harness.request(
                &producer,
                request_code::SEND_MESSAGE_V2,
                11,
                &send,
                b"order",
            );
            let sent = harness.answers(&producer).await;
            assert_eq!(sent[0].code, response_code::SUCCESS, "{sent:?}");
            // Younger than transactionTimeOut (6 s): not checked.
            harness.broker.check_transactions().await;
            assert!(harness.quiet(&producer).await.is_empty());
            harness.clock.advance(7_000);
            harness.broker.check_transactions().await;
            let checks = harness.answers(&producer).await;
            assert_eq!(checks.len(), 1, "{checks:?}");
            let check = &checks[0];
            assert!(!check.is_response);
            assert_eq!(check.code, request_code::CHECK_TRANSACTION_STATE);
            assert_eq!(check.ext.get("msgId").map(String::as_str), Some("TX1"));
            assert_eq!(
                harness.broker.transactions.borrow().pending_len(),
                1,
                "still pending until ended"
            );
        });
    }
}
