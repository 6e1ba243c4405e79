//! Consumes a topic with a push consumer until Ctrl-C:
//! `cargo run --release --example push_consumer -- [namesrv] [topic] [group] [--orderly]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use shardmq_client::{
    ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, ConsumerOptions, MessageExt, PushConsumer,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let orderly = args.iter().any(|a| a == "--orderly");
    let mut positional = args.iter().filter(|a| !a.starts_with("--"));
    let namesrv = positional
        .next()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:9876".into());
    let topic = positional
        .next()
        .cloned()
        .unwrap_or_else(|| "ExampleTopic".into());
    let group = positional
        .next()
        .cloned()
        .unwrap_or_else(|| "example-consumers".into());

    let mut consumer = PushConsumer::new(ConsumerOptions::new(&group, &namesrv));
    consumer.subscribe(&topic, "*")?;
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    if orderly {
        consumer.register_message_listener_orderly(
            move |messages: &[MessageExt], context: &mut ConsumeOrderlyContext| {
                for message in messages {
                    seen.fetch_add(1, Ordering::Relaxed);
                    println!(
                        "queue {} offset {}: {}",
                        context.queue.queue_id,
                        message.queue_offset,
                        String::from_utf8_lossy(message.body())
                    );
                }
                ConsumeOrderlyStatus::Success
            },
        );
    } else {
        consumer.register_message_listener_concurrently(
            move |messages: &[MessageExt], _context: &mut ConsumeConcurrentlyContext| {
                for message in messages {
                    seen.fetch_add(1, Ordering::Relaxed);
                    println!(
                        "{} [{}] {}",
                        message.msg_id,
                        message.tags().unwrap_or("-"),
                        String::from_utf8_lossy(message.body())
                    );
                }
                ConsumeConcurrentlyStatus::ConsumeSuccess
            },
        );
    }
    consumer.start().await?;
    println!("consuming {topic} as {group}; Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    consumer.shutdown().await;
    println!("{} messages consumed", count.load(Ordering::Relaxed));
    Ok(())
}
