//! Reads one queue from its beginning with a lite pull consumer, then commits:
//! `cargo run --release --example lite_pull_consumer -- [namesrv] [topic] [group]`.

use std::time::Duration;

use shardmq_client::{ConsumerOptions, LitePullConsumer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let namesrv = args.next().unwrap_or_else(|| "127.0.0.1:9876".to_string());
    let topic = args.next().unwrap_or_else(|| "ExampleTopic".to_string());
    let group = args.next().unwrap_or_else(|| "example-lite".to_string());

    let mut consumer = LitePullConsumer::new(ConsumerOptions::new(&group, &namesrv));
    consumer.set_auto_commit(false);
    consumer.start().await?;
    let queues = consumer.fetch_message_queues(&topic).await?;
    let Some(queue) = queues.first().cloned() else {
        println!("{topic} has no readable queue");
        return Ok(());
    };
    consumer.assign(vec![queue.clone()]).await?;
    consumer.seek_to_begin(&queue).await?;
    let mut total = 0;
    loop {
        let messages = consumer.poll(Duration::from_secs(2)).await;
        if messages.is_empty() {
            break;
        }
        for message in &messages {
            println!(
                "{}: {}",
                message.queue_offset,
                String::from_utf8_lossy(message.body())
            );
        }
        total += messages.len();
    }
    consumer.commit_sync().await?;
    println!(
        "{total} messages from {queue:?}; committed offset {:?}",
        consumer.committed(&queue).await?
    );
    consumer.shutdown().await;
    Ok(())
}
