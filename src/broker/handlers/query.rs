//! Message lookup: QUERY_MESSAGE (12) by key or UNIQ_KEY through the store's message index,
//! and VIEW_MESSAGE_BY_ID (33) by offset msgId.

use std::rc::Rc;

use shards::store::MessageQuery;

use crate::broker::Broker;
use crate::error::{store_error, RequestError};
use crate::remoting::{response_code, FrameEncoder, RemotingCommand};
use crate::server::Connection;

/// Messages a unique-key query returns (RocketMQ's defaultQueryMaxNum, which it forces).
pub const QUERY_UNIQUE_KEY_MESSAGES: u32 = 32;

/// The ext key that marks a query by UNIQ_KEY (RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG).
pub const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";

impl Broker {
    pub(crate) fn query_message(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let topic = ext.required("topic")?.to_string();
        let key = ext.required("key")?.to_string();
        let mut max_messages = ext.required_i32("maxNum")?.max(1) as u32;
        let begin_timestamp_ms = ext.required_i64("beginTimestamp")?;
        let end_timestamp_ms = ext.required_i64("endTimestamp")?;
        let unique_key = ext.get(UNIQUE_MSG_QUERY_FLAG) == Some("true");
        if unique_key {
            max_messages = QUERY_UNIQUE_KEY_MESSAGES;
        }
        if request.is_oneway() {
            return Ok(()); // a query nobody waits for
        }
        let (broker, connection, opaque) = (self.clone(), connection.clone(), request.opaque);
        let in_flight = connection.in_flight();
        shards::runtime::spawn_detached(async move {
            let _in_flight = in_flight;
            let query = MessageQuery {
                topic: &topic,
                key: &key,
                max_messages,
                begin_timestamp_ms,
                end_timestamp_ms,
                unique_key,
            };
            let result = match broker.store.query_messages(&query).await {
                Ok(result) => result,
                Err(error) => return store_error(error).respond(&connection, opaque),
            };
            let last = result.index_last_update;
            connection.send_with(|out| {
                let found = result.message_count > 0;
                let code = if found {
                    response_code::SUCCESS
                } else {
                    response_code::QUERY_NOT_FOUND
                };
                let mut frame = FrameEncoder::response(out, code, opaque);
                if !found {
                    frame.remark("can not find message, maybe time range not correct");
                }
                frame
                    .ext_i64("indexLastUpdateTimestamp", last.timestamp_ms)
                    .ext_i64("indexLastUpdatePhyoffset", last.physical_offset as i64);
                frame.finish(&result.body);
            });
        });
        Ok(())
    }
}

impl Broker {
    pub(crate) fn view_message_by_id(
        self: &Rc<Self>,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let offset = request.ext_fields.required_i64("offset")?;
        if request.is_oneway() {
            return Ok(()); // a read nobody waits for
        }
        let (broker, connection) = (self.clone(), connection.clone());
        let opaque = request.opaque;
        shards::runtime::spawn_detached(async move {
            match broker
                .store
                .read_record(shards::CommitLogOffset(offset.max(0) as u64))
                .await
            {
                Ok(Some(record)) => connection.send_with(|out| {
                    FrameEncoder::response(out, response_code::SUCCESS, opaque).finish(&record);
                }),
                Ok(None) => RequestError::SystemError(format!(
                    "can not find message by the offset, {offset}"
                ))
                .respond(&connection, opaque),
                Err(error) => store_error(error).respond(&connection, opaque),
            }
        });
        Ok(())
    }
}
