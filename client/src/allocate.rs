//! Queue allocation among a group's consumers (Java `AllocateMessageQueueStrategy`). Every
//! consumer runs the same function over the same sorted inputs — all queues of a topic and all
//! client ids of the group — so each queue gets exactly one owner without any coordination.

use super::message::MessageQueue;

/// Decides which of `queues` the consumer `current` owns among `consumers`. Both slices are
/// sorted; the result is in `queues` order. A consumer not in `consumers` gets nothing.
pub trait AllocateStrategy: Send + Sync {
    fn name(&self) -> &'static str;
    fn allocate(
        &self,
        current: &str,
        queues: &[MessageQueue],
        consumers: &[String],
    ) -> Vec<MessageQueue>;
}

/// Contiguous ranges: with 8 queues and 3 consumers, 3 + 3 + 2 (Java
/// `AllocateMessageQueueAveragely`, the default).
#[derive(Debug, Default, Clone, Copy)]
pub struct AllocateAveragely;

impl AllocateStrategy for AllocateAveragely {
    fn name(&self) -> &'static str {
        "AVG"
    }

    fn allocate(
        &self,
        current: &str,
        queues: &[MessageQueue],
        consumers: &[String],
    ) -> Vec<MessageQueue> {
        let Some(index) = consumers.iter().position(|id| id == current) else {
            return Vec::new();
        };
        let (queue_count, consumer_count) = (queues.len(), consumers.len());
        if queue_count == 0 {
            return Vec::new();
        }
        let remainder = queue_count % consumer_count;
        let average = if queue_count <= consumer_count {
            1
        } else if remainder > 0 && index < remainder {
            queue_count / consumer_count + 1
        } else {
            queue_count / consumer_count
        };
        let start = if remainder > 0 && index < remainder {
            index * average
        } else {
            index * average + remainder
        };
        let range = average.min(queue_count.saturating_sub(start));
        (0..range)
            .map(|i| queues[(start + i) % queue_count].clone())
            .collect()
    }
}

/// Round the circle: queue i goes to consumer i mod n (Java
/// `AllocateMessageQueueAveragelyByCircle`).
#[derive(Debug, Default, Clone, Copy)]
pub struct AllocateAveragelyByCircle;

impl AllocateStrategy for AllocateAveragelyByCircle {
    fn name(&self) -> &'static str {
        "AVG_BY_CIRCLE"
    }

    fn allocate(
        &self,
        current: &str,
        queues: &[MessageQueue],
        consumers: &[String],
    ) -> Vec<MessageQueue> {
        let Some(index) = consumers.iter().position(|id| id == current) else {
            return Vec::new();
        };
        queues
            .iter()
            .enumerate()
            .filter(|(i, _)| i % consumers.len() == index)
            .map(|(_, queue)| queue.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(count: u32) -> Vec<MessageQueue> {
        (0..count)
            .map(|queue_id| MessageQueue {
                topic: "T".into(),
                broker_name: "b".into(),
                queue_id,
            })
            .collect()
    }

    fn ids(
        strategy: &dyn AllocateStrategy,
        queues: &[MessageQueue],
        consumers: &[String],
    ) -> Vec<Vec<u32>> {
        consumers
            .iter()
            .map(|c| {
                strategy
                    .allocate(c, queues, consumers)
                    .iter()
                    .map(|q| q.queue_id)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn averagely_gives_contiguous_ranges() {
        let consumers: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            ids(&AllocateAveragely, &queues(8), &consumers),
            vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]
        );
        assert_eq!(
            ids(&AllocateAveragely, &queues(2), &consumers),
            vec![vec![0], vec![1], vec![]]
        );
        assert!(AllocateAveragely
            .allocate("z", &queues(8), &consumers)
            .is_empty());
    }

    #[test]
    fn by_circle_deals_round_robin() {
        let consumers: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            ids(&AllocateAveragelyByCircle, &queues(8), &consumers),
            vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]
        );
    }

    #[test]
    fn every_queue_has_exactly_one_owner() {
        for queue_count in 0..20 {
            for consumer_count in 1..7 {
                let consumers: Vec<String> = (0..consumer_count).map(|i| format!("c{i}")).collect();
                for strategy in [
                    &AllocateAveragely as &dyn AllocateStrategy,
                    &AllocateAveragelyByCircle,
                ] {
                    let mut all: Vec<u32> =
                        ids(strategy, &queues(queue_count), &consumers).concat();
                    all.sort_unstable();
                    assert_eq!(all, (0..queue_count).collect::<Vec<_>>());
                }
            }
        }
    }
}
