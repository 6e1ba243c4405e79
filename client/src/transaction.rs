//! The transactional producer (Java `TransactionMQProducer`, REMOTING.md §3.7, §6.5).
//!
//! 1. The message is sent as a half message: property `TRAN_MSG=true`, `PGROUP=<group>`,
//!    sysFlag TRANSACTION_PREPARED (0x4). The broker stores it where consumers cannot see it.
//! 2. The local transaction runs ([`TransactionListener::execute_local_transaction`]).
//! 3. END_TRANSACTION (37, oneway) tells the broker: commitOrRollback 0x8 commit, 0xC roll
//!    back, 0 unknown. It goes to the broker that stored the half message, naming it by queue
//!    offset and commitlog offset (decoded from the offset message id).
//! 4. For a half message left unknown (or whose END_TRANSACTION was lost), the broker later
//!    sends CHECK_TRANSACTION_STATE (39) with the half message as body; the producer asks
//!    [`TransactionListener::check_local_transaction`] and answers with END_TRANSACTION,
//!    `fromTransactionCheck=true`, on the same connection's broker.
//!
//! Listener calls run on tokio's blocking pool, so they may block on a database.

use std::sync::{Arc, Weak};

use super::connection::{Request, ServerRequest};
use super::error::{ClientError, ClientResult};
use super::instance::{lock, ClientInstance};
use super::message::{
    parse_offset_msg_id, Message, MessageExt, SYS_FLAG_TRANSACTION_COMMIT,
    SYS_FLAG_TRANSACTION_ROLLBACK,
};
use super::producer::{Producer, ProducerOptions, SendResult, SendStatus};
use crate::body::property;
use crate::remoting::request_code;
use shardmq_protocol::record;

/// `commitOrRollback` for "not decided yet" (MessageSysFlag TRANSACTION_NOT_TYPE).
const TRANSACTION_NOT_TYPE: i32 = 0;

/// The outcome of a local transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalTransactionState {
    /// Make the message visible to consumers.
    CommitMessage,
    /// Discard the message.
    RollbackMessage,
    /// Not decided: the broker asks again later through the check.
    Unknown,
}

impl LocalTransactionState {
    /// END_TRANSACTION's `commitOrRollback` value.
    pub fn commit_or_rollback(self) -> i32 {
        match self {
            LocalTransactionState::CommitMessage => SYS_FLAG_TRANSACTION_COMMIT,
            LocalTransactionState::RollbackMessage => SYS_FLAG_TRANSACTION_ROLLBACK,
            LocalTransactionState::Unknown => TRANSACTION_NOT_TYPE,
        }
    }
}

/// The application's side of a transaction.
pub trait TransactionListener: Send + Sync + 'static {
    /// Runs the local transaction for a half message the broker has stored.
    fn execute_local_transaction(&self, message: &Message, arg: &str) -> LocalTransactionState;
    /// Tells the broker's check what became of the local transaction of `message`.
    fn check_local_transaction(&self, message: &MessageExt) -> LocalTransactionState;
}

/// The half message's send result and the local transaction's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionSendResult {
    pub send_result: SendResult,
    pub local_state: LocalTransactionState,
}

/// A producer of transactional messages.
///
/// ```no_run
/// use shardmq_client::{
///     LocalTransactionState, Message, MessageExt, ProducerOptions, TransactionListener,
///     TransactionProducer,
/// };
///
/// struct Orders;
/// impl TransactionListener for Orders {
///     fn execute_local_transaction(&self, _message: &Message, order_id: &str) -> LocalTransactionState {
///         // Write the order to the database in the same step...
///         if order_id.is_empty() { LocalTransactionState::RollbackMessage }
///         else { LocalTransactionState::CommitMessage }
///     }
///     fn check_local_transaction(&self, _message: &MessageExt) -> LocalTransactionState {
///         // ...and look it up here when the broker asks.
///         LocalTransactionState::CommitMessage
///     }
/// }
///
/// # async fn demo() -> Result<(), shardmq_client::ClientError> {
/// let options = ProducerOptions::new("order-tx", "127.0.0.1:9876");
/// let producer = TransactionProducer::start(options, Orders).await?;
/// let result = producer
///     .send_message_in_transaction(Message::new("orders", "order 7 created"), "7")
///     .await?;
/// assert_eq!(result.local_state, LocalTransactionState::CommitMessage);
/// producer.shutdown().await;
/// # Ok(()) }
/// ```
pub struct TransactionProducer {
    producer: Producer,
    listener: Arc<dyn TransactionListener>,
}

impl TransactionProducer {
    /// Starts the producer and registers the check handler.
    pub async fn start(
        options: ProducerOptions,
        listener: impl TransactionListener,
    ) -> ClientResult<TransactionProducer> {
        let producer = Producer::start(options).await?;
        let listener: Arc<dyn TransactionListener> = Arc::new(listener);
        let instance = Arc::downgrade(&producer.inner.instance);
        let group = producer.inner.options.group.clone();
        let check_listener = listener.clone();
        let handler = move |request: ServerRequest| {
            let (instance, group, listener) =
                (instance.clone(), group.clone(), check_listener.clone());
            tokio::spawn(answer_check(instance, group, listener, request));
        };
        *lock(&producer.inner.instance.transaction_check) = Some(Arc::new(handler));
        Ok(TransactionProducer { producer, listener })
    }

    /// The plain producer inside (for non-transactional sends on the same connections).
    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// Sends `message` as a half message, runs the local transaction with `arg`, and ends the
    /// transaction on the broker with its outcome. A half message the broker did not store
    /// cleanly is rolled back without running the local transaction.
    pub async fn send_message_in_transaction(
        &self,
        mut message: Message,
        arg: &str,
    ) -> ClientResult<TransactionSendResult> {
        let group = &self.producer.inner.options.group;
        message.remove_property(property::DELAY);
        message.set_property(property::TRAN_MSG, "true");
        message.set_property(property::PGROUP, group.clone());
        let send_result = self.producer.send(message.clone()).await?;
        let local_state = if send_result.status == SendStatus::SendOk {
            if let Some(id) = &send_result.transaction_id {
                message.set_property(property::TRANSACTION_ID, id.clone());
            }
            let listener = self.listener.clone();
            let arg = arg.to_string();
            tokio::task::spawn_blocking(move || listener.execute_local_transaction(&message, &arg))
                .await
                .unwrap_or(LocalTransactionState::Unknown)
        } else {
            LocalTransactionState::RollbackMessage
        };
        self.end_transaction(&send_result, local_state).await?;
        Ok(TransactionSendResult {
            send_result,
            local_state,
        })
    }

    async fn end_transaction(
        &self,
        send_result: &SendResult,
        state: LocalTransactionState,
    ) -> ClientResult<()> {
        let instance = &self.producer.inner.instance;
        let addr = instance.require_master_addr(&send_result.queue.broker_name)?;
        let (_, commit_log_offset) =
            parse_offset_msg_id(&send_result.offset_msg_id).ok_or_else(|| {
                ClientError::Malformed(format!(
                    "offset message id {:?} does not decode",
                    send_result.offset_msg_id
                ))
            })?;
        let transaction_id = send_result
            .transaction_id
            .clone()
            .unwrap_or_else(|| send_result.msg_id.clone());
        let request = Request::new(request_code::END_TRANSACTION)
            .ext("producerGroup", &self.producer.inner.options.group)
            .ext("tranStateTableOffset", send_result.queue_offset)
            .ext("commitLogOffset", commit_log_offset)
            .ext("commitOrRollback", state.commit_or_rollback())
            .ext("fromTransactionCheck", "false")
            .ext("msgId", &send_result.msg_id)
            .ext("transactionId", transaction_id)
            .ext("topic", &send_result.queue.topic);
        instance.remoting.invoke_oneway(&addr, &request).await
    }

    /// Unregisters and closes connections.
    pub async fn shutdown(&self) {
        *lock(&self.producer.inner.instance.transaction_check) = None;
        self.producer.shutdown().await;
    }
}

/// Answers one CHECK_TRANSACTION_STATE: decode the half message, ask the listener, send
/// END_TRANSACTION (fromTransactionCheck=true) back to the broker that asked.
async fn answer_check(
    instance: Weak<ClientInstance>,
    group: String,
    listener: Arc<dyn TransactionListener>,
    server_request: ServerRequest,
) {
    let Some(instance) = instance.upgrade() else {
        return;
    };
    let request = &server_request.request;
    let Ok(stored) = record::decode(&request.body) else {
        return; // Undecodable half message: the broker asks again.
    };
    let broker_name = instance
        .broker_name_of(&server_request.addr)
        .unwrap_or_default();
    let Ok(message) = MessageExt::from_stored(&stored, &broker_name) else {
        return;
    };
    let checked = message.clone();
    let state = tokio::task::spawn_blocking(move || listener.check_local_transaction(&checked))
        .await
        .unwrap_or(LocalTransactionState::Unknown);
    let header = |key: &str| request.ext(key).unwrap_or_default().to_string();
    let transaction_id = request
        .ext("transactionId")
        .map(str::to_string)
        .unwrap_or_else(|| message.msg_id.clone());
    let commit_log_offset = request
        .ext("commitLogOffset")
        .map(str::to_string)
        .unwrap_or_else(|| message.commit_log_offset.to_string());
    let end = Request::new(request_code::END_TRANSACTION)
        .ext("producerGroup", group)
        .ext("tranStateTableOffset", header("tranStateTableOffset"))
        .ext("commitLogOffset", commit_log_offset)
        .ext("commitOrRollback", state.commit_or_rollback())
        .ext("fromTransactionCheck", "true")
        .ext("msgId", &message.msg_id)
        .ext("transactionId", transaction_id)
        .ext("topic", message.topic());
    let _ = instance
        .remoting
        .invoke_oneway(&server_request.addr, &end)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_or_rollback_values_are_message_sys_flags() {
        assert_eq!(
            LocalTransactionState::CommitMessage.commit_or_rollback(),
            0x8
        );
        assert_eq!(
            LocalTransactionState::RollbackMessage.commit_or_rollback(),
            0xC
        );
        assert_eq!(LocalTransactionState::Unknown.commit_or_rollback(), 0);
    }
}
