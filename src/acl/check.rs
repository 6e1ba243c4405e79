//! Whether one request may run, decided as RocketMQ's PlainPermissionManager.validate and
//! PlainAccessValidator.parse decide it (CAPABILITIES.md §4.1), before any handler sees it:
//!
//! 1. a peer on `globalWhiteRemoteAddresses` passes;
//! 2. the request must name an account (`AccessKey`) the file has;
//! 3. a peer on that account's `whiteRemoteAddress` passes without a signature;
//! 4. the `Signature` must be the account's signature of the request;
//! 5. a send to the trace topic passes; an admin account passes;
//! 6. admin-only codes need an admin account;
//! 7. every resource the request touches needs its permission, the account's own for that
//!    topic or group, else its `defaultTopicPerm` / `defaultGroupPerm`.
//!
//! On the namesrv, reads are open (routes are what every client asks first) and every write
//! (REGISTER/UNREGISTER_BROKER, KV config, topic deletes) needs a signed admin account, so a
//! stranger cannot register a fake broker into the routes. A refusal says which account,
//! which resource and which permission is missing.

use std::borrow::Cow;
use std::net::IpAddr;

use crate::body::{HeartbeatData, LockBatchRequest};
use crate::broker::state::topics::RETRY_GROUP_TOPIC_PREFIX;
use crate::remoting::{request_code as rc, request_code_name, signature, RemotingCommand};

use super::rules::{Account, AclRules, Perm};

/// RocketMQ's message-trace topic: always writable (TopicValidator.RMQ_SYS_TRACE_TOPIC).
pub const TRACE_TOPIC: &str = "RMQ_SYS_TRACE_TOPIC";

/// Which port the request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Broker,
    Namesrv,
}

/// What a permission is checked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource<'r> {
    Topic(Cow<'r, str>),
    Group(Cow<'r, str>),
}

impl<'r> Resource<'r> {
    /// A topic name as a resource: a retry topic (`%RETRY%group`) is its group.
    fn of_topic(topic: impl Into<Cow<'r, str>>) -> Resource<'r> {
        let topic = topic.into();
        match topic.strip_prefix(RETRY_GROUP_TOPIC_PREFIX) {
            Some(group) => Resource::Group(Cow::Owned(group.to_string())),
            None => Resource::Topic(topic),
        }
    }
}

impl std::fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Topic(topic) => write!(f, "topic:{topic}"),
            Resource::Group(group) => write!(f, "group:{group}"),
        }
    }
}

/// Codes only an admin account may send to a broker: RocketMQ's `Permission.ADMIN_CODE`,
/// plus what resets offsets or deletes files here.
pub fn broker_admin_only(code: i32) -> bool {
    matches!(
        code,
        rc::UPDATE_AND_CREATE_TOPIC
            | rc::UPDATE_AND_CREATE_TOPIC_LIST
            | rc::UPDATE_BROKER_CONFIG
            | rc::DELETE_TOPIC_IN_BROKER
            | rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
            | rc::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST
            | rc::DELETE_SUBSCRIPTIONGROUP
            | rc::UPDATE_AND_CREATE_STATIC_TOPIC
            | rc::INVOKE_BROKER_TO_RESET_OFFSET
            | rc::RESET_CONSUMER_OFFSET_IN_BROKER
            | rc::CLONE_GROUP_OFFSET
            | rc::DELETE_EXPIRED_COMMITLOG
            | rc::TRIGGER_DELETE_FILES
            | rc::CLEAN_EXPIRED_CONSUMEQUEUE
            | rc::CLEAN_UNUSED_TOPIC
            | rc::WIPE_WRITE_PERM_OF_BROKER
            | rc::ADD_WRITE_PERM_OF_BROKER
    )
}

/// The namesrv codes that change what it serves.
pub fn namesrv_write(code: i32) -> bool {
    matches!(
        code,
        rc::REGISTER_BROKER
            | rc::UNREGISTER_BROKER
            | rc::PUT_KV_CONFIG
            | rc::DELETE_KV_CONFIG
            | rc::DELETE_TOPIC_IN_NAMESRV
            | rc::REGISTER_TOPIC_IN_NAMESRV
            | rc::UPDATE_NAMESRV_CONFIG
            | rc::WIPE_WRITE_PERM_OF_BROKER
            | rc::ADD_WRITE_PERM_OF_BROKER
    )
}

/// `Ok` when `request` from `peer` may run under `rules`; else the remark of its
/// NO_PERMISSION answer.
pub fn check(
    rules: &AclRules,
    role: Role,
    request: &RemotingCommand<'_>,
    peer: IpAddr,
) -> Result<(), String> {
    if role == Role::Namesrv && !namesrv_write(request.code) {
        return Ok(());
    }
    if rules
        .global_white_remote_addresses
        .iter()
        .any(|pattern| pattern.matches(peer))
    {
        return Ok(());
    }
    // Named only in refusals: formatted then, not for every request.
    let code = CodeName(request.code);
    let access_key = request
        .ext_fields
        .get_non_empty(signature::ACCESS_KEY)
        .ok_or_else(|| {
            format!(
                "No accessKey is configured: {code} from {peer} is not signed (ACL is on: \
                 give the client an AccessKey and SecretKey)"
            )
        })?;
    let account = rules
        .accounts
        .get(access_key)
        .ok_or_else(|| format!("No acl config for {access_key}"))?;
    if account.white_remote_address.matches(peer) {
        return Ok(());
    }
    let signed = request
        .ext_fields
        .get(signature::SIGNATURE)
        .is_some_and(|received| {
            signature::verify(
                &account.secret_key,
                request.ext_fields.iter(),
                request.body,
                request.version,
                received,
            )
        });
    if !signed {
        return Err(format!(
            "Check signature failed for accessKey={access_key} ({code}): the Signature is \
             missing or was not made with this account's secretKey"
        ));
    }
    let admin_only = match role {
        Role::Broker => broker_admin_only(request.code),
        Role::Namesrv => true,
    };
    if account.admin {
        return Ok(());
    }
    if admin_only {
        return Err(format!(
            "Need admin permission for request code={}{}, but accessKey={access_key} is not \
             admin",
            request.code,
            request_code_name(request.code).map_or(String::new(), |name| format!(" ({name})"))
        ));
    }
    let needed = needed(request).map_err(|why| {
        format!("accessKey={access_key}: {code}: cannot tell what it touches: {why}")
    })?;
    if needed == [(Resource::Topic(TRACE_TOPIC.into()), Perm::PUB)] {
        return Ok(());
    }
    for (resource, perm) in &needed {
        check_resource(account, resource, *perm)?;
    }
    Ok(())
}

/// A request code as refusals name it: "SEND_MESSAGE_V2 (310)", or "request code 9999".
struct CodeName(i32);

impl std::fmt::Display for CodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match request_code_name(self.0) {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "request code {}", self.0),
        }
    }
}

fn check_resource(account: &Account, resource: &Resource<'_>, needed: Perm) -> Result<(), String> {
    let (own, default, default_name) = match resource {
        Resource::Topic(topic) => (
            account.topic_perms.get(topic.as_ref()),
            account.default_topic_perm,
            "defaultTopicPerm",
        ),
        Resource::Group(group) => (
            account.group_perms.get(group.as_ref()),
            account.default_group_perm,
            "defaultGroupPerm",
        ),
    };
    let access_key = &account.access_key;
    match own {
        Some(own) if own.grants(needed) => Ok(()),
        Some(own) => Err(format!(
            "No permission for {resource}: accessKey={access_key} needs {} and has {}",
            needed.name(),
            own.name()
        )),
        None if default.grants(needed) => Ok(()),
        None => Err(format!(
            "No default permission for {resource}: accessKey={access_key} needs {} and its \
             {default_name} is {}",
            needed.name(),
            default.name()
        )),
    }
}

/// The resources `request` touches and the permission each needs (PlainAccessValidator's
/// table, and ACL 2.0's for QUERY_CONSUMER_OFFSET, LOCK/UNLOCK and END_TRANSACTION).
pub fn needed<'r>(request: &'r RemotingCommand<'_>) -> Result<Vec<(Resource<'r>, Perm)>, String> {
    let field = |key: &'static str| request.ext_fields.get_non_empty(key);
    let mut needed: Vec<(Resource<'r>, Perm)> = Vec::new();
    let mut send = |topic: Option<&'r str>| {
        if let Some(topic) = topic {
            let resource = Resource::of_topic(topic);
            // Sending to a retry topic is consuming: SUB on its group.
            let perm = match resource {
                Resource::Group(_) => Perm::SUB,
                Resource::Topic(_) => Perm::PUB,
            };
            needed.push((resource, perm));
        }
    };
    match request.code {
        rc::SEND_MESSAGE | rc::SEND_REPLY_MESSAGE | rc::END_TRANSACTION => send(field("topic")),
        rc::SEND_MESSAGE_V2 | rc::SEND_BATCH_MESSAGE | rc::SEND_REPLY_MESSAGE_V2 => {
            send(field("b"))
        }
        _ => {}
    }
    let sub_topic = |topic: Option<&'r str>| topic.map(|t| (Resource::of_topic(t), Perm::SUB));
    let sub_group = |group: Option<&'r str>| group.map(|g| (Resource::Group(g.into()), Perm::SUB));
    match request.code {
        rc::CONSUMER_SEND_MSG_BACK => needed.extend(sub_group(field("group"))),
        rc::PULL_MESSAGE | rc::LITE_PULL_MESSAGE => {
            needed.extend(sub_topic(field("topic")));
            needed.extend(sub_group(field("consumerGroup")));
        }
        rc::QUERY_MESSAGE => needed.extend(sub_topic(field("topic"))),
        rc::UNREGISTER_CLIENT | rc::GET_CONSUMER_LIST_BY_GROUP => {
            needed.extend(sub_group(field("consumerGroup")))
        }
        rc::UPDATE_CONSUMER_OFFSET | rc::QUERY_CONSUMER_OFFSET => {
            needed.extend(sub_group(field("consumerGroup")));
            needed.extend(sub_topic(field("topic")));
        }
        rc::HEART_BEAT => {
            let heartbeat = HeartbeatData::parse(request.body).map_err(|e| e.to_string())?;
            for consumer in heartbeat.consumers {
                needed.push((Resource::Group(consumer.group_name.into()), Perm::SUB));
                for subscription in consumer.subscriptions {
                    needed.push((Resource::of_topic(subscription.topic), Perm::SUB));
                }
            }
        }
        rc::LOCK_BATCH_MQ | rc::UNLOCK_BATCH_MQ => {
            let body = LockBatchRequest::parse(request.body).map_err(|e| e.to_string())?;
            needed.push((Resource::Group(body.consumer_group.into()), Perm::SUB));
            for queue in body.mq_set {
                needed.push((Resource::of_topic(queue.topic), Perm::SUB));
            }
        }
        _ => {}
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remoting::{decode_frame, signature::Credentials, FrameEncoder};

    const RULES: &str = r#"
globalWhiteRemoteAddresses: [10.9.0.*]
accounts:
  - accessKey: producer1
    secretKey: secret-p
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms: [orders=PUB, audit=SUB]
  - accessKey: consumer1
    secretKey: secret-c
    defaultTopicPerm: SUB
    groupPerms: [billing=SUB, other=DENY]
  - accessKey: operator
    secretKey: secret-a
    admin: true
  - accessKey: trusted
    secretKey: secret-t
    whiteRemoteAddress: 192.168.7.*
"#;

    fn frame(
        code: i32,
        fields: &[(&str, &str)],
        body: &[u8],
        signer: Option<(&str, &str)>,
    ) -> Vec<u8> {
        let mut fields: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some((ak, sk)) = signer {
            Credentials::new(ak, sk).sign_request(&mut fields, body);
        }
        let mut out = Vec::new();
        let mut encoder = FrameEncoder::request(&mut out, code, 1, false);
        for (key, value) in &fields {
            encoder.ext(key, value);
        }
        encoder.finish(body);
        out
    }

    fn decide(frame: &[u8], role: Role, peer: &str) -> Result<(), String> {
        let rules = AclRules::parse(RULES).unwrap();
        let (request, _) = decode_frame(frame).unwrap().unwrap();
        check(&rules, role, &request, peer.parse().unwrap())
    }

    const LOCAL: &str = "127.0.0.1";

    #[test]
    fn a_signed_send_with_pub_passes_and_without_is_refused_saying_why() {
        let send = |topic: &str, signer| {
            frame(
                rc::SEND_MESSAGE_V2,
                &[("a", "g"), ("b", topic)],
                b"body",
                signer,
            )
        };
        assert_eq!(
            decide(
                &send("orders", Some(("producer1", "secret-p"))),
                Role::Broker,
                LOCAL
            ),
            Ok(())
        );
        let error = decide(
            &send("audit", Some(("producer1", "secret-p"))),
            Role::Broker,
            LOCAL,
        )
        .unwrap_err();
        assert!(
            error.contains("topic:audit") && error.contains("needs PUB and has SUB"),
            "{error}"
        );
        let error = decide(
            &send("other", Some(("producer1", "secret-p"))),
            Role::Broker,
            LOCAL,
        )
        .unwrap_err();
        assert!(error.contains("defaultTopicPerm is DENY"), "{error}");
        let error = decide(
            &send("orders", Some(("producer1", "wrong!"))),
            Role::Broker,
            LOCAL,
        )
        .unwrap_err();
        assert!(
            error.starts_with("Check signature failed for accessKey=producer1"),
            "{error}"
        );
        let error = decide(&send("orders", None), Role::Broker, LOCAL).unwrap_err();
        assert!(error.starts_with("No accessKey is configured"), "{error}");
        let error = decide(
            &send("orders", Some(("nobody1", "secret-p"))),
            Role::Broker,
            LOCAL,
        )
        .unwrap_err();
        assert_eq!(error, "No acl config for nobody1");
        // The trace topic is always writable by a signed account.
        assert_eq!(
            decide(
                &send(TRACE_TOPIC, Some(("consumer1", "secret-c"))),
                Role::Broker,
                LOCAL
            ),
            Ok(())
        );
    }

    #[test]
    fn a_tampered_body_fails_the_signature() {
        let mut signed = frame(
            rc::SEND_MESSAGE_V2,
            &[("b", "orders")],
            b"body",
            Some(("producer1", "secret-p")),
        );
        let last = signed.len() - 1;
        signed[last] ^= 1;
        assert!(decide(&signed, Role::Broker, LOCAL)
            .unwrap_err()
            .contains("Check signature failed"));
    }

    #[test]
    fn pulls_need_sub_on_the_topic_and_the_group() {
        let pull = |group: &str| {
            frame(
                rc::PULL_MESSAGE,
                &[
                    ("consumerGroup", group),
                    ("topic", "orders"),
                    ("queueId", "0"),
                ],
                b"",
                Some(("consumer1", "secret-c")),
            )
        };
        assert_eq!(decide(&pull("billing"), Role::Broker, LOCAL), Ok(()));
        let error = decide(&pull("other"), Role::Broker, LOCAL).unwrap_err();
        assert!(
            error.contains("group:other") && error.contains("has DENY"),
            "{error}"
        );
        // Sending to a group's retry topic is consuming: SUB on the group.
        let back = frame(
            rc::SEND_MESSAGE,
            &[("topic", "%RETRY%billing")],
            b"",
            Some(("consumer1", "secret-c")),
        );
        assert_eq!(decide(&back, Role::Broker, LOCAL), Ok(()));
    }

    #[test]
    fn admin_codes_need_an_admin_account() {
        let create = |signer| {
            frame(
                rc::UPDATE_AND_CREATE_TOPIC,
                &[("topic", "new")],
                b"",
                Some(signer),
            )
        };
        let error = decide(&create(("consumer1", "secret-c")), Role::Broker, LOCAL).unwrap_err();
        assert!(
            error.contains("Need admin permission for request code=17"),
            "{error}"
        );
        assert_eq!(
            decide(&create(("operator", "secret-a")), Role::Broker, LOCAL),
            Ok(())
        );
        let reset = frame(
            rc::INVOKE_BROKER_TO_RESET_OFFSET,
            &[("topic", "orders"), ("group", "billing")],
            b"",
            Some(("consumer1", "secret-c")),
        );
        assert!(decide(&reset, Role::Broker, LOCAL).is_err());
    }

    #[test]
    fn white_addresses_pass_as_rocketmq_lets_them() {
        let unsigned = frame(rc::UPDATE_AND_CREATE_TOPIC, &[("topic", "new")], b"", None);
        assert_eq!(decide(&unsigned, Role::Broker, "10.9.0.5"), Ok(()));
        let named = frame(
            rc::UPDATE_AND_CREATE_TOPIC,
            &[("topic", "new"), ("AccessKey", "trusted")],
            b"",
            None,
        );
        assert_eq!(decide(&named, Role::Broker, "192.168.7.1"), Ok(()));
        assert!(decide(&named, Role::Broker, "192.168.8.1").is_err());
    }

    #[test]
    fn heartbeats_need_sub_on_every_group_and_subscribed_topic() {
        let body = br#"{"clientID":"c1","producerDataSet":[],"consumerDataSet":[{"groupName":"billing","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","unitMode":false,"subscriptionDataSet":[{"topic":"orders","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1},{"topic":"%RETRY%billing","subString":"*","tagsSet":[],"codeSet":[],"subVersion":1}]}]}"#;
        let beat = frame(rc::HEART_BEAT, &[], body, Some(("consumer1", "secret-c")));
        assert_eq!(decide(&beat, Role::Broker, LOCAL), Ok(()));
        let beat = frame(rc::HEART_BEAT, &[], body, Some(("producer1", "secret-p")));
        let error = decide(&beat, Role::Broker, LOCAL).unwrap_err();
        assert!(error.contains("topic:orders"), "{error}");
    }

    #[test]
    fn the_namesrv_serves_reads_to_anyone_and_writes_to_admins() {
        let route = frame(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &[("topic", "orders")],
            b"",
            None,
        );
        assert_eq!(decide(&route, Role::Namesrv, LOCAL), Ok(()));
        let register = |signer| frame(rc::REGISTER_BROKER, &[("brokerName", "b")], b"{}", signer);
        assert!(decide(&register(None), Role::Namesrv, LOCAL)
            .unwrap_err()
            .contains("No accessKey"));
        let error = decide(
            &register(Some(("producer1", "secret-p"))),
            Role::Namesrv,
            LOCAL,
        )
        .unwrap_err();
        assert!(error.contains("not admin"), "{error}");
        assert_eq!(
            decide(
                &register(Some(("operator", "secret-a"))),
                Role::Namesrv,
                LOCAL
            ),
            Ok(())
        );
    }
}
