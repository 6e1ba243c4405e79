//! Sends transactional messages, one committed and one rolled back:
//! `cargo run --release --example transaction_producer -- [namesrv] [topic]`.

use shardmq_client::{
    LocalTransactionState, Message, MessageExt, ProducerOptions, TransactionListener,
    TransactionProducer,
};

/// Commits orders with an even id, rolls back the others; the check commits.
struct Orders;

impl TransactionListener for Orders {
    fn execute_local_transaction(
        &self,
        _message: &Message,
        order_id: &str,
    ) -> LocalTransactionState {
        match order_id.parse::<u64>() {
            Ok(id) if id % 2 == 0 => LocalTransactionState::CommitMessage,
            _ => LocalTransactionState::RollbackMessage,
        }
    }

    fn check_local_transaction(&self, message: &MessageExt) -> LocalTransactionState {
        println!("broker checks {}", message.msg_id);
        LocalTransactionState::CommitMessage
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".to_string());
    let topic = args
        .next()
        .unwrap_or_else(|| "ExampleTransactions".to_string());
    let producer =
        TransactionProducer::start(ProducerOptions::new("example-tx", &namesrv), Orders).await?;
    for order_id in ["2", "3"] {
        let message = Message::new(&topic, format!("order {order_id}"));
        let result = producer
            .send_message_in_transaction(message, order_id)
            .await?;
        println!("order {order_id}: {:?}", result.local_state);
    }
    producer.shutdown().await;
    Ok(())
}
