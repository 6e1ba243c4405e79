//! Sends messages in every mode: `cargo run --release --example producer -- [namesrv] [topic]`.
//! Start a node first: `cargo run --release -- serve`.

use std::time::Instant;

use shardmq_client::{Message, Producer, ProducerOptions, SelectByHash};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".to_string());
    let topic = args.next().unwrap_or_else(|| "ExampleTopic".to_string());
    let producer = Producer::start(ProducerOptions::new("example-producer", &namesrv)).await?;

    // Sync: one at a time, each acknowledged.
    for i in 0..3 {
        let message = Message::new(&topic, format!("sync {i}"))
            .with_tags("sync")
            .with_keys([format!("key-{i}")]);
        let result = producer.send(message).await?;
        println!(
            "sync {i}: {:?} queue {}:{} offset {} id {}",
            result.status,
            result.queue.broker_name,
            result.queue.queue_id,
            result.queue_offset,
            result.msg_id
        );
    }

    // Async: many in flight at once on one connection per broker.
    let started = Instant::now();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let count = 1_000;
    for i in 0..count {
        let done_tx = done_tx.clone();
        producer.send_async(Message::new(&topic, format!("async {i}")), move |result| {
            let _ = done_tx.send(result.is_ok());
        });
    }
    let mut ok = 0;
    for _ in 0..count {
        ok += usize::from(done_rx.recv().await.unwrap_or(false));
    }
    println!(
        "async: {ok}/{count} acknowledged in {:?}",
        started.elapsed()
    );

    // Ordered per key: the same order id always lands on the same queue.
    for step in ["created", "paid", "shipped"] {
        let message = Message::new(&topic, format!("order 42 {step}")).with_tags(step);
        let result = producer
            .send_with_selector(message, &SelectByHash, "42")
            .await?;
        println!("order 42 {step}: queue {}", result.queue.queue_id);
    }

    // Oneway and batch.
    producer
        .send_oneway(Message::new(&topic, "fire and forget"))
        .await?;
    let batch = (0..10)
        .map(|i| Message::new(&topic, format!("batch {i}")))
        .collect();
    let result = producer.send_batch(batch).await?;
    println!("batch: first offset {}", result.queue_offset);

    producer.shutdown().await;
    Ok(())
}
