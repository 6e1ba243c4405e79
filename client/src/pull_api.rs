//! PULL_MESSAGE (11) / LITE_PULL_MESSAGE (361) from the client side (Java `PullAPIWrapper`):
//! builds the request header (REMOTING.md §3.3), maps the answer to a status, decodes the
//! records and re-filters them by tag string (the broker filters on tag hash codes only, so a
//! hash collision can let a foreign tag through).

use std::time::Duration;

use super::connection::Request;
use super::error::{ClientError, ClientResult};
use super::instance::ClientInstance;
use super::message::{decode_pull_body, MessageExt, MessageQueue};
use crate::body::{property, SubscriptionData, TagFilter};
use crate::remoting::{request_code, response_code};

/// PullSysFlag bit: commit `commitOffset` for the group.
const PULL_FLAG_COMMIT_OFFSET: i32 = 0x1;
/// PullSysFlag bit: the broker may hold the pull until a message arrives.
const PULL_FLAG_SUSPEND: i32 = 0x2;
/// PullSysFlag bit: `subscription` carries the expression.
const PULL_FLAG_SUBSCRIPTION: i32 = 0x4;
/// PullSysFlag bit: lite pull consumer.
const PULL_FLAG_LITE: i32 = 0x10;
/// Added to the broker's hold time to get the request timeout (Java: 15 s hold, 30 s timeout).
const PULL_TIMEOUT_MARGIN_MS: u64 = 15_000;

/// One pull request.
pub struct PullSpec<'a> {
    pub group: &'a str,
    pub queue: &'a MessageQueue,
    pub offset: i64,
    pub max_nums: u32,
    /// The group's offset to commit on the way (clustering push consumers).
    pub commit_offset: Option<i64>,
    /// How long the broker may hold the pull; 0 = answer at once.
    pub suspend_ms: u64,
    pub subscription: &'a SubscriptionData,
    pub lite: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStatus {
    Found,
    NoNewMessage,
    NoMatchedMessage,
    OffsetIllegal,
}

/// What a pull brought.
#[derive(Debug)]
pub struct PullOutcome {
    pub status: PullStatus,
    pub next_begin_offset: i64,
    /// Found messages that match the subscription's tags.
    pub messages: Vec<MessageExt>,
}

/// Sends one pull to the master of `spec.queue`'s broker.
pub async fn pull(instance: &ClientInstance, spec: &PullSpec<'_>) -> ClientResult<PullOutcome> {
    let addr = match instance.master_addr(&spec.queue.broker_name) {
        Some(addr) => addr,
        None => {
            instance.update_route(&spec.queue.topic).await?;
            instance.require_master_addr(&spec.queue.broker_name)?
        }
    };
    let mut sys_flag = PULL_FLAG_SUBSCRIPTION;
    if spec.suspend_ms > 0 {
        sys_flag |= PULL_FLAG_SUSPEND;
    }
    if spec.lite {
        sys_flag |= PULL_FLAG_LITE;
    }
    let commit_offset = spec.commit_offset.unwrap_or(-1);
    if commit_offset > 0 {
        sys_flag |= PULL_FLAG_COMMIT_OFFSET;
    }
    let code = if spec.lite {
        request_code::LITE_PULL_MESSAGE
    } else {
        request_code::PULL_MESSAGE
    };
    let request = Request::new(code)
        .ext("consumerGroup", spec.group)
        .ext("topic", &spec.queue.topic)
        .ext("queueId", spec.queue.queue_id)
        .ext("queueOffset", spec.offset)
        .ext("maxMsgNums", spec.max_nums)
        .ext("sysFlag", sys_flag)
        .ext("commitOffset", commit_offset)
        .ext("suspendTimeoutMillis", spec.suspend_ms)
        .ext("subscription", &spec.subscription.sub_string)
        .ext("subVersion", spec.subscription.sub_version)
        .ext("expressionType", &spec.subscription.expression_type)
        .ext("bname", &spec.queue.broker_name);
    let timeout = Duration::from_millis(spec.suspend_ms + PULL_TIMEOUT_MARGIN_MS);
    let response = instance.remoting.invoke(&addr, &request, timeout).await?;
    let status = match response.code {
        response_code::SUCCESS => PullStatus::Found,
        response_code::PULL_NOT_FOUND => PullStatus::NoNewMessage,
        response_code::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMessage,
        response_code::PULL_OFFSET_MOVED => PullStatus::OffsetIllegal,
        _ => return Err(response.into_error(&addr)),
    };
    let next_begin_offset = response.ext_i64("nextBeginOffset")?;
    let min_offset = response.ext_i64("minOffset").unwrap_or(0);
    let max_offset = response.ext_i64("maxOffset").unwrap_or(0);
    let mut messages = Vec::new();
    if status == PullStatus::Found {
        messages = decode_pull_body(&response.body, &spec.queue.broker_name)?;
        if let Some(filter) = spec.subscription.tag_filter() {
            if !matches!(filter, TagFilter::All) {
                messages.retain(|m| filter.matches_tag(m.tags()));
            }
        }
        // As Java does: each message tells the queue's range at the time of the pull.
        for message in &mut messages {
            let fields = &mut message.message;
            fields.set_property(property::MIN_OFFSET, min_offset.to_string());
            fields.set_property(property::MAX_OFFSET, max_offset.to_string());
        }
    }
    if next_begin_offset < 0 {
        return Err(ClientError::Malformed(format!(
            "nextBeginOffset {next_begin_offset}"
        )));
    }
    Ok(PullOutcome {
        status,
        next_begin_offset,
        messages,
    })
}

/// GET_MAX_OFFSET: the queue's next offset to be written.
pub async fn max_offset(instance: &ClientInstance, queue: &MessageQueue) -> ClientResult<i64> {
    let addr = broker_addr(instance, queue).await?;
    let request = Request::new(request_code::GET_MAX_OFFSET)
        .ext("topic", &queue.topic)
        .ext("queueId", queue.queue_id);
    instance.invoke_ok(&addr, &request).await?.ext_i64("offset")
}

/// GET_MIN_OFFSET: the queue's oldest offset still stored.
pub async fn min_offset(instance: &ClientInstance, queue: &MessageQueue) -> ClientResult<i64> {
    let addr = broker_addr(instance, queue).await?;
    let request = Request::new(request_code::GET_MIN_OFFSET)
        .ext("topic", &queue.topic)
        .ext("queueId", queue.queue_id);
    instance.invoke_ok(&addr, &request).await?.ext_i64("offset")
}

/// SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after `timestamp_ms`.
pub async fn search_offset(
    instance: &ClientInstance,
    queue: &MessageQueue,
    timestamp_ms: i64,
) -> ClientResult<i64> {
    let addr = broker_addr(instance, queue).await?;
    let request = Request::new(request_code::SEARCH_OFFSET_BY_TIMESTAMP)
        .ext("topic", &queue.topic)
        .ext("queueId", queue.queue_id)
        .ext("timestamp", timestamp_ms);
    instance.invoke_ok(&addr, &request).await?.ext_i64("offset")
}

async fn broker_addr(instance: &ClientInstance, queue: &MessageQueue) -> ClientResult<String> {
    if let Some(addr) = instance.master_addr(&queue.broker_name) {
        return Ok(addr);
    }
    instance.update_route(&queue.topic).await?;
    instance.require_master_addr(&queue.broker_name)
}
