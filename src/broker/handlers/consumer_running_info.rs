//! GET_CONSUMER_RUNNING_INFO (307), as AdminBrokerProcessor.callConsumer answers it: the
//! request goes on to the consumer (found by group and clientId among this shard's
//! connections) with the same ext fields and body under a new opaque, and the consumer's
//! answer comes back to the asker as it is: `mqadmin consumerStatus` and the dashboard's
//! "consumer detail" read the client's ConsumerRunningInfo (properties, subscriptions, each
//! queue's process queue). The wait is bounded (`CONSUMER_CALL_TIMEOUT_MS`); a consumer that
//! is not connected here, or does not answer in time, is SYSTEM_ERROR with RocketMQ's remark.

use std::rc::Rc;
use std::time::Duration;

use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// How long the consumer has to answer (RocketMQ's callConsumer waits 5 s).
pub const CONSUMER_CALL_TIMEOUT_MS: u64 = 5_000;

impl Broker {
    pub(crate) fn consumer_running_info(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let group = request.ext_fields.required("consumerGroup")?.to_string();
        let client_id = request.ext_fields.required("clientId")?.to_string();
        let consumer = self
            .clients
            .borrow()
            .consumers
            .get(&group)
            .and_then(|clients| clients.clients.get(&client_id))
            .map(|channel| channel.connection.clone());
        let Some(consumer) = consumer else {
            return Err(RequestError::SystemError(format!(
                "The Consumer <{group}> <{client_id}> not online"
            )));
        };
        let ext: Vec<(String, String)> = request
            .ext_fields
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        let body = request.body.to_vec();
        let (code, asker, opaque) = (request.code, connection.clone(), request.opaque);
        let oneway = request.is_oneway();
        shards::runtime::spawn_detached(async move {
            let timeout = Duration::from_millis(CONSUMER_CALL_TIMEOUT_MS);
            let answer = consumer
                .call(timeout, |out, forwarded_opaque| {
                    let mut frame = FrameEncoder::request(out, code, forwarded_opaque, false);
                    for (key, value) in &ext {
                        frame.ext(key, value);
                    }
                    frame.finish(&body);
                })
                .await;
            if oneway {
                return;
            }
            match answer {
                Some(answer) => asker.send_with(|out| {
                    let mut frame = FrameEncoder::response(out, answer.code, opaque);
                    if let Some(remark) = &answer.remark {
                        frame.remark(remark);
                    }
                    frame.finish(&answer.body);
                }),
                None => RequestError::SystemError(format!(
                    "invoke consumer <{group}> <{client_id}> Exception: no answer within \
                     {CONSUMER_CALL_TIMEOUT_MS} ms"
                ))
                .respond(&asker, opaque),
            }
        });
        Ok(())
    }
}
