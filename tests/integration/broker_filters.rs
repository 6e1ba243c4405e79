//! SQL92 property filters on the real binary, with raw frames (the PyPI C++ client cannot
//! send SQL92): pulls return exactly the matching messages, expressions come from the
//! request or the group's heartbeat, bad expressions get SUBSCRIPTION_PARSE_FAILED with a
//! message naming the problem, CHECK_CLIENT_CONFIG validates the same way, and a held pull
//! never returns a message its filter refuses.

use std::time::{Duration, Instant};

use crate::common::*;
use shardmq::remoting::{request_code as rc, response_code};

const TOPIC: &str = "SqlTopic";
const COLOURS: [&str; 3] = ["red", "blue", "green"];

/// Messages a=1..=10 on queue 0; colour cycles red, blue, green; b only on even a; tag
/// TagA on a <= 5, TagB above.
fn send_numbered(client: &mut Client) {
    for a in 1..=10u32 {
        let a_text = a.to_string();
        let colour = COLOURS[(a as usize - 1) % 3];
        let tag = if a <= 5 { "TagA" } else { "TagB" };
        let mut properties = vec![("a", a_text.as_str()), ("colour", colour), ("TAGS", tag)];
        if a % 2 == 0 {
            properties.push(("b", "x"));
        }
        let sent = send_with(client, TOPIC, 0, format!("m{a}").as_bytes(), &properties);
        assert_eq!(sent.code, response_code::SUCCESS, "{:?}", sent.remark);
    }
}

/// The `a` values a filtered pull from offset 0 returns.
fn pulled_a(client: &mut Client, expression: &str) -> Vec<u32> {
    let pulled = pull_sql(client, ("g", TOPIC, 0), 0, expression);
    if pulled.code != response_code::SUCCESS {
        assert_eq!(
            pulled.code,
            response_code::PULL_RETRY_IMMEDIATELY,
            "{expression}: {:?}",
            pulled.remark
        );
        assert_eq!(pulled.ext("nextBeginOffset"), "10", "{expression}");
        assert!(pulled.body.is_empty());
        return Vec::new();
    }
    assert_eq!(pulled.ext("nextBeginOffset"), "10", "{expression}");
    property_values(&pulled.body, "a")
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

#[test]
fn sql92_pulls_return_exactly_the_matching_messages() {
    let node = Node::start();
    let mut broker = Client::connect(node.broker_port);
    send_numbered(&mut broker);
    for (expression, expected) in [
        ("a BETWEEN 3 AND 5", vec![3, 4, 5]),
        ("colour IN ('red', 'blue')", vec![1, 2, 4, 5, 7, 8, 10]),
        ("b IS NULL", vec![1, 3, 5, 7, 9]),
        ("b IS NOT NULL AND a > 5", vec![6, 8, 10]),
        ("NOT (a > 2) OR colour = 'red'", vec![1, 2, 4, 7, 10]),
        ("a > 3 AND a < 8 AND colour <> 'green'", vec![4, 5, 7]),
        ("a NOT BETWEEN 2 AND 9", vec![1, 10]),
        ("colour NOT IN ('red')", vec![2, 3, 5, 6, 8, 9]),
        ("TAGS = 'TagB' AND a <= 7", vec![6, 7]),
        ("a = 4.0 OR a = 9", vec![4, 9]),
        ("missing = 1 OR a = 1", vec![1]),
        ("TRUE", (1..=10).collect()),
        ("a > 100", vec![]),
        ("missing = 1", vec![]),
    ] {
        assert_eq!(pulled_a(&mut broker, expression), expected, "{expression}");
    }

    // LITE_PULL_MESSAGE takes the same filter.
    let given = Expression::Given {
        text: "a >= 9",
        kind: "sql92",
    };
    let lite = pull_with(
        &mut broker,
        rc::LITE_PULL_MESSAGE,
        ("g", TOPIC, 0),
        0,
        given,
        0,
    );
    assert_eq!(lite.code, response_code::SUCCESS, "{:?}", lite.remark);
    assert_eq!(property_values(&lite.body, "a"), ["9", "10"]);

    // A pull from the middle: only later messages are candidates.
    let middle = pull_sql(&mut broker, ("g", TOPIC, 0), 6, "colour = 'red'");
    assert_eq!(property_values(&middle.body, "a"), ["7", "10"]);

    // TAG pulls are untouched.
    let given = Expression::Given {
        text: "TagB",
        kind: "TAG",
    };
    let tags = pull_with(&mut broker, rc::PULL_MESSAGE, ("g", TOPIC, 0), 0, given, 0);
    assert_eq!(property_values(&tags.body, "a"), ["6", "7", "8", "9", "10"]);
}

#[test]
fn bad_expressions_get_subscription_parse_failed_naming_the_problem() {
    let node = Node::start();
    let mut broker = Client::connect(node.broker_port);
    send_numbered(&mut broker);
    for (expression, says) in [
        ("a >", "line 1, column 4: expected a value"),
        ("a = 'red", "never closed"),
        ("a > 'x'", "cannot be compared"),
        ("a = NULL", "IS NULL"),
        ("a BETWEEN 5 AND 1", "must not be greater"),
        ("a = 1 b", "column 7: expected AND, OR"),
        ("*", "unexpected character '*'"),
    ] {
        let pulled = pull_sql(&mut broker, ("g", TOPIC, 0), 0, expression);
        assert_eq!(
            pulled.code,
            response_code::SUBSCRIPTION_PARSE_FAILED,
            "{expression}"
        );
        assert!(
            pulled.remark().contains(says),
            "{expression}: {}",
            pulled.remark()
        );
        assert!(pulled.remark().contains(expression), "{}", pulled.remark());
    }
    let given = Expression::Given {
        text: "a > 1",
        kind: "CLASS",
    };
    let unknown = pull_with(&mut broker, rc::PULL_MESSAGE, ("g", TOPIC, 0), 0, given, 0);
    assert_eq!(unknown.code, response_code::SUBSCRIPTION_PARSE_FAILED);
    assert!(
        unknown.remark().contains("by CLASS"),
        "{}",
        unknown.remark()
    );
    // The connection keeps serving.
    assert_eq!(pulled_a(&mut broker, "a = 2"), vec![2]);
}

#[test]
fn heartbeat_subscriptions_and_check_client_config() {
    let node = Node::start();
    let mut broker = Client::connect(node.broker_port);
    send_numbered(&mut broker);

    // Without the subscription bit the group's heartbeat expression applies.
    let beat = heartbeat(&mut broker, "c1", "hb", TOPIC, "a >= 8", "SQL92");
    assert_eq!(beat.code, response_code::SUCCESS);
    let from_heartbeat = pull_with(
        &mut broker,
        rc::PULL_MESSAGE,
        ("hb", TOPIC, 0),
        0,
        Expression::FromHeartbeat,
        0,
    );
    assert_eq!(property_values(&from_heartbeat.body, "a"), ["8", "9", "10"]);
    // A changed expression takes effect on the next pull.
    heartbeat(&mut broker, "c1", "hb", TOPIC, "colour = 'green'", "SQL92");
    let changed = pull_with(
        &mut broker,
        rc::PULL_MESSAGE,
        ("hb", TOPIC, 0),
        0,
        Expression::FromHeartbeat,
        0,
    );
    assert_eq!(property_values(&changed.body, "a"), ["3", "6", "9"]);
    heartbeat(&mut broker, "c1", "hb", TOPIC, "a >", "SQL92");
    let broken = pull_with(
        &mut broker,
        rc::PULL_MESSAGE,
        ("hb", TOPIC, 0),
        0,
        Expression::FromHeartbeat,
        0,
    );
    assert_eq!(broken.code, response_code::SUBSCRIPTION_PARSE_FAILED);
    assert!(
        broken.remark().contains("expected a value"),
        "{}",
        broken.remark()
    );

    // CHECK_CLIENT_CONFIG, as a Java client sends it before subscribing with SQL92.
    let check = |broker: &mut Client, expression: &str, kind: &str| {
        let body = serde_json::json!({
            "clientId": "c1",
            "group": "hb",
            "subscriptionData": {"topic": TOPIC, "subString": expression, "expressionType": kind},
        });
        broker.call(rc::CHECK_CLIENT_CONFIG, &[], body.to_string().as_bytes())
    };
    assert_eq!(
        check(&mut broker, "a > 1 AND colour IN ('red')", "SQL92").code,
        0
    );
    assert_eq!(check(&mut broker, "TagA || TagB", "TAG").code, 0);
    let bad = check(&mut broker, "a > > 1", "SQL92");
    assert_eq!(bad.code, response_code::SUBSCRIPTION_PARSE_FAILED);
    assert!(bad.remark().contains("column 5"), "{}", bad.remark());
    let other = check(&mut broker, "x", "CLASS");
    assert_eq!(other.code, response_code::SYSTEM_ERROR);
    assert!(other.remark().contains("by CLASS"), "{}", other.remark());
}

#[test]
fn held_sql_pull_never_returns_a_message_its_filter_refuses() {
    let node = Node::start();
    let mut producer = Client::connect(node.broker_port);
    send_numbered(&mut producer);
    let port = node.broker_port;
    // A consumer at the end of the queue, filtering on a > 100, held for up to 3 s.
    let consumer = std::thread::spawn(move || {
        let mut consumer = Client::connect(port);
        let mut offset = 10;
        let mut seen = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            let given = Expression::Given {
                text: "a > 100",
                kind: "SQL92",
            };
            let pulled = pull_with(
                &mut consumer,
                rc::PULL_MESSAGE,
                ("poll", TOPIC, 0),
                offset,
                given,
                3_000,
            );
            match pulled.code {
                response_code::SUCCESS => {
                    seen.extend(property_values(&pulled.body, "a"));
                    offset = pulled.ext("nextBeginOffset").parse().unwrap();
                    if seen.iter().any(|a| a == "200") {
                        return (seen, started.elapsed());
                    }
                }
                response_code::PULL_RETRY_IMMEDIATELY | response_code::PULL_NOT_FOUND => {
                    assert!(pulled.body.is_empty());
                    offset = pulled.ext("nextBeginOffset").parse().unwrap();
                }
                other => panic!("unexpected answer {other}: {:?}", pulled.remark),
            }
        }
        panic!("the matching message never came; saw {seen:?}");
    });
    wait_for_parked_pulls(port, 1);
    for a in ["50", "60"] {
        let sent = send_with(&mut producer, TOPIC, 0, b"no", &[("a", a)]);
        assert_eq!(sent.code, response_code::SUCCESS);
        // Woken, refused by its filter, parked again.
        wait_for_parked_pulls(port, 1);
    }
    let sent_at = Instant::now();
    let sent = send_with(&mut producer, TOPIC, 0, b"yes", &[("a", "200")]);
    assert_eq!(sent.code, response_code::SUCCESS);
    let (seen, _) = consumer.join().unwrap();
    assert_eq!(seen, ["200"], "only the matching message is delivered");
    // The held pull answered when the matching message arrived, not at its timeout.
    assert!(
        sent_at.elapsed() < Duration::from_millis(2_000),
        "took {:?}",
        sent_at.elapsed()
    );
}
