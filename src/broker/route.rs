//! Where a message goes: one pure decision, `route`, for every path that stores a message
//! (a send, a consumer's send-back, a transaction's commit, a delayed message coming due).
//! No store, no clock, no state: the caller gathers what the decision needs in a
//! [`RouteRequest`], `route` answers a [`Destination`], and `Broker::append` (append.rs)
//! writes it there. The rules, in order (RocketMQ's SendMessageProcessor, EndTransaction and
//! ScheduleMessageService):
//!
//! | # | When | Destination |
//! |---|---|---|
//! | 1 | a retry (`%RETRY%<group>`) past its group's retry limit, or given up by the consumer | its dead-letter queue `%DLQ%<group>` 0, undelayed |
//! | 2 | a transactional half (`TRAN_MSG` true, sent alone) | the half queue, until END_TRANSACTION |
//! | 3 | `DELAY` level > 0 | `SCHEDULE_TOPIC_XXXX` queue level − 1, until its time |
//! | 4 | a timer property (`TIMER_DELIVER_MS`, `TIMER_DELAY_SEC`, `TIMER_DELAY_MS`, `__STARTDELIVERTIME`) in the future | `rmq_sys_wheel_timer` 0, until its time |
//! | 5 | otherwise | the queue asked for |
//!
//! Rules 3 and 4 come from the message's properties (`schedule::divert_for`, which also
//! refuses a timer too far away), decided before `route` and passed in as [`Wait`].

pub use super::schedule::Divert as Wait;

/// A retry's count against its group's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryLimit {
    /// reconsumeTimes as the message will be stored (the client's count for a re-send; the
    /// original's + 1 for a send-back).
    pub times: i32,
    /// The most times the group retries (retryMaxTimes, or the request's
    /// maxReconsumeTimes).
    pub max: i32,
    /// The consumer gave up on the message (a send-back with delayLevel < 0).
    pub give_up: bool,
}

impl RetryLimit {
    fn exhausted(&self) -> bool {
        self.give_up || self.times > self.max
    }
}

/// What decides a message's destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRequest<'a> {
    /// The topic and queue the message is for.
    pub topic: &'a str,
    pub queue_id: u32,
    /// For a message to a `%RETRY%<group>` topic: the group and its retry count.
    pub retry: Option<(&'a str, RetryLimit)>,
    /// A transactional half message (only ever a single send).
    pub half: bool,
    /// Whether (and until when) its properties make it wait.
    pub wait: Wait,
}

/// Where `Broker::append` stores a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination<'a> {
    /// The queue asked for: consumers see it at once.
    Queue { topic: &'a str, queue_id: u32 },
    /// The dead-letter queue of `group` (`%DLQ%<group>`, queue 0).
    DeadLetter { group: &'a str },
    /// The transaction half queue; its real topic and queue travel in its properties.
    Half { topic: &'a str, queue_id: u32 },
    /// A delay level's schedule queue until `deliver_ms`.
    DelayLevel {
        topic: &'a str,
        queue_id: u32,
        level: u32,
        deliver_ms: i64,
    },
    /// The timer queue until `deliver_ms`.
    Timer {
        topic: &'a str,
        queue_id: u32,
        deliver_ms: i64,
    },
}

/// The destination of a message (see the module doc's table).
pub fn route<'a>(request: &RouteRequest<'a>) -> Destination<'a> {
    let (topic, queue_id) = (request.topic, request.queue_id);
    if let Some((group, limit)) = request.retry {
        if limit.exhausted() {
            return Destination::DeadLetter { group };
        }
    }
    if request.half {
        return Destination::Half { topic, queue_id };
    }
    match request.wait {
        Wait::Level { level, deliver_ms } => Destination::DelayLevel {
            topic,
            queue_id,
            level,
            deliver_ms,
        },
        Wait::Timer { deliver_ms } => Destination::Timer {
            topic,
            queue_id,
            deliver_ms,
        },
        Wait::None => Destination::Queue { topic, queue_id },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(topic: &str) -> RouteRequest<'_> {
        RouteRequest {
            topic,
            queue_id: 3,
            retry: None,
            half: false,
            wait: Wait::None,
        }
    }

    #[test]
    fn the_table() {
        let level = Wait::Level {
            level: 3,
            deliver_ms: 10_000,
        };
        let timer = Wait::Timer { deliver_ms: 7_000 };
        let retry = |times, max, give_up| {
            Some((
                "G",
                RetryLimit {
                    times,
                    max,
                    give_up,
                },
            ))
        };
        let cases: Vec<(RouteRequest<'_>, Destination<'_>)> = vec![
            (
                request("T"),
                Destination::Queue {
                    topic: "T",
                    queue_id: 3,
                },
            ),
            (
                RouteRequest {
                    wait: level,
                    ..request("T")
                },
                Destination::DelayLevel {
                    topic: "T",
                    queue_id: 3,
                    level: 3,
                    deliver_ms: 10_000,
                },
            ),
            (
                RouteRequest {
                    wait: timer,
                    ..request("T")
                },
                Destination::Timer {
                    topic: "T",
                    queue_id: 3,
                    deliver_ms: 7_000,
                },
            ),
            (
                RouteRequest {
                    half: true,
                    wait: level,
                    ..request("T")
                },
                Destination::Half {
                    topic: "T",
                    queue_id: 3,
                },
            ),
            // A retry within its limit waits for its delay level like any other message.
            (
                RouteRequest {
                    retry: retry(16, 16, false),
                    wait: level,
                    ..request("%RETRY%G")
                },
                Destination::DelayLevel {
                    topic: "%RETRY%G",
                    queue_id: 3,
                    level: 3,
                    deliver_ms: 10_000,
                },
            ),
            // Past it, the dead-letter queue, undelayed, whatever else it carries.
            (
                RouteRequest {
                    retry: retry(17, 16, false),
                    half: true,
                    wait: level,
                    ..request("%RETRY%G")
                },
                Destination::DeadLetter { group: "G" },
            ),
            (
                RouteRequest {
                    retry: retry(0, 16, true),
                    ..request("%RETRY%G")
                },
                Destination::DeadLetter { group: "G" },
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(route(&request), expected, "{request:?}");
        }
    }
}
