//! Files of new consume queues, made off the shard.
//!
//! A queue that an append creates (`QueueTable::get_or_begin`) holds its units in memory
//! while this task makes its directory and first file on the shard's helper thread
//! (`consume_queue::make_first_file`). A mkdir or a file creation waits for the
//! filesystem's journal: while 160,000 queues got their first message those waits (up to
//! 0.9 s) held the shard, and its requests timed out in its queue (TIMEOUT_CLEAN_QUEUE).
//! Back on the shard the file is mapped and the units are written into it. A checkpoint
//! taken meanwhile leaves those queues out and records where their units start
//! (`Checkpoint::awaiting_from`), so recovery rebuilds them from the commitlog. A making
//! that fails (a full disk, no descriptors left) is tried again after `RETRY_MS`; the units
//! stay readable from memory. Queues that recovery found without files (a crash during a
//! storm) are handed to this task the same way once the store opens.
//!
//! A second task settles the queues a start after a restart of the machine took from the
//! synced checkpoint's catalog (`spawn_settling`, `Settle` in consume_queue.rs): a thread of
//! its own lists their directories and reads in their pages, on several threads, and the shard
//! then writes the units they held back and zeroes what follows them.

use std::rc::Rc;
use std::time::Duration;

use super::consume_queue::{look_before_settling, make_first_file, ToSettle};
use super::Inner;

/// Queues whose files one job of the helper thread makes.
const BATCH_QUEUES: usize = 512;
/// Wait before a failed making is tried again.
const RETRY_MS: u64 = 1_000;

/// Starts the task of `inner`'s store; it stops once the store is closing or dropped.
pub(crate) fn spawn(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    let wanted = inner.queue_files.clone();
    crate::runtime::spawn_detached(async move {
        loop {
            wanted.wait().await;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let batch = {
                    let log = inner.log.borrow();
                    if log.closing {
                        return;
                    }
                    if log.reset.is_some() {
                        break; // the reset empties the table
                    }
                    inner.queues.borrow_mut().take_files_to_make(BATCH_QUEUES)
                };
                if batch.is_empty() {
                    break;
                }
                let units_per_file = inner.config.consume_queue_units_per_file;
                inner.log.borrow_mut().flush.queue_files_making = true;
                drop(inner);
                let made = crate::runtime::blocking(move || {
                    batch
                        .into_iter()
                        .map(|(topic, queue_id, dir)| {
                            let made = make_first_file(&dir, units_per_file, &[]);
                            (topic, queue_id, dir, made)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
                let Some(inner) = weak.upgrade() else { return };
                inner.log.borrow_mut().flush.queue_files_making = false;
                // A reset or the exit may wait for this job.
                inner.notify.signal();
                if !take_made(&inner, made) {
                    drop(inner);
                    crate::runtime::sleep(Duration::from_millis(RETRY_MS)).await;
                }
            }
        }
    });
}

/// Hands the made files to their queues; false when a making failed (it is handed out
/// again).
fn take_made(
    inner: &Inner,
    made: Vec<(String, u32, std::path::PathBuf, std::io::Result<usize>)>,
) -> bool {
    let mut failures = 0;
    let mut strays = Vec::new();
    for (topic, queue_id, dir, result) in made {
        let mut queues = inner.queues.borrow_mut();
        let outcome = result.and_then(|written| queues.file_made(&topic, queue_id, written));
        match outcome {
            Ok(true) => {}
            // The topic was deleted (or the store reset) meanwhile: what was made goes.
            Ok(false) if queues.get(&topic, queue_id).is_none() => strays.push(dir),
            Ok(false) => {}
            Err(error) => {
                if failures == 0 {
                    log::warn!(
                        "store {}: cannot make the files of consume queue {topic}/{queue_id} \
                         ({error}); its units stay in memory and the making is tried again \
                         in {RETRY_MS} ms",
                        inner.config.root_dir.display()
                    );
                }
                failures += 1;
                queues.make_again(topic, queue_id);
            }
        }
    }
    if !strays.is_empty() {
        crate::runtime::spawn_detached(crate::runtime::blocking(move || {
            for dir in strays {
                let _ = std::fs::remove_dir_all(&dir);
                // The topic's directory too, when nothing else is in it.
                if let Some(topic_dir) = dir.parent() {
                    let _ = std::fs::remove_dir(topic_dir);
                }
            }
        }));
    }
    failures == 0
}

/// Queues one job looks into before they are settled: with the page cache cold, 50-250 ms
/// of reads at random on 16 threads.
const SETTLE_BATCH_QUEUES: usize = 256;

/// Starts the task that settles the queues a start after a restart of the machine took
/// from the synced checkpoint's catalog (`Settle` in consume_queue.rs): a batch at a time,
/// a thread of its own lists their directories and reads in their pages on several threads,
/// then the shard settles them, meeting no disk read. It stops once none is left, or the
/// store is closing (the exit settles the rest, `settle_the_rest`) or dropped.
pub(crate) fn spawn_settling(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    let total = inner.queues.borrow().queues_to_settle();
    let started = std::time::Instant::now();
    crate::runtime::spawn_detached(async move {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            if inner.log.borrow().closing {
                return;
            }
            match settle_batch(inner).await {
                Some(true) => {}
                Some(false) => crate::runtime::sleep(Duration::from_millis(RETRY_MS)).await,
                None => break,
            }
        }
        if let Some(inner) = weak.upgrade() {
            log::info!(
                "store {}: settled the {total} consume queues taken from the synced \
                 checkpoint's catalog in {:.2} s",
                inner.config.root_dir.display(),
                started.elapsed().as_secs_f64()
            );
            // Checkpoints may be written again: the first is a synced one.
            inner.notify.signal();
        }
    });
}

/// At the exit: settles the queues still waiting (true when none is left).
pub(crate) async fn settle_the_rest(inner: &Inner) -> bool {
    loop {
        let batch = inner
            .queues
            .borrow_mut()
            .take_to_settle(SETTLE_BATCH_QUEUES);
        if batch.is_empty() {
            return true;
        }
        let looked = look_off_the_shard(batch, inner.config.consume_queue_units_per_file).await;
        if !settle_looked(inner, looked) {
            return false;
        }
    }
}

/// One batch: Some(whether every queue of it was settled), None when none was left. The
/// store is held only weakly while the batch is looked into.
async fn settle_batch(inner: Rc<Inner>) -> Option<bool> {
    let batch = inner
        .queues
        .borrow_mut()
        .take_to_settle(SETTLE_BATCH_QUEUES);
    if batch.is_empty() {
        return None;
    }
    let weak = Rc::downgrade(&inner);
    inner.log.borrow_mut().flush.queue_settle_job = true;
    let units_per_file = inner.config.consume_queue_units_per_file;
    drop(inner);
    let looked = look_off_the_shard(batch, units_per_file).await;
    let inner = weak.upgrade()?;
    inner.log.borrow_mut().flush.queue_settle_job = false;
    // A reset or the exit may wait for this job.
    inner.notify.signal();
    Some(settle_looked(&inner, looked))
}

type Looked = Vec<(String, u32, std::io::Result<Option<Vec<u64>>>)>;

/// On a thread of its own, not the shard's helper thread: with the page cache cold a job
/// reads for 50-250 ms, and the persisted configuration files, written there, waited behind
/// each one (10,000 topic updates right after a start took 23 s instead of 5).
async fn look_off_the_shard(batch: Vec<ToSettle>, units_per_file: u64) -> Looked {
    let keys: Vec<(String, u32)> = batch
        .iter()
        .map(|queue| (queue.topic.clone(), queue.queue_id))
        .collect();
    let looked = crate::runtime::on_thread_of_its_own("queue-settle", move || {
        crate::runtime::fan_out::map(batch, |queue| {
            let found = look_before_settling(&queue, units_per_file);
            (queue.topic, queue.queue_id, found)
        })
    })
    .await;
    match looked {
        Ok(looked) => looked,
        // No thread: each queue is tried again later.
        Err(error) => keys
            .into_iter()
            .map(|(topic, queue_id)| {
                let failed = std::io::Error::new(error.kind(), error.to_string());
                (topic, queue_id, Err(failed))
            })
            .collect(),
    }
}

/// Settles the queues looked into; false when one failed (it is handed out
/// again).
fn settle_looked(inner: &Inner, looked: Looked) -> bool {
    let mut failures = 0;
    let mut queues = inner.queues.borrow_mut();
    for (topic, queue_id, found) in looked {
        let settled = found.and_then(|listed| queues.settle(&topic, queue_id, listed.as_deref()));
        if let Err(error) = settled {
            if failures == 0 {
                log::warn!(
                    "store {}: cannot settle consume queue {topic}/{queue_id} ({error}); tried \
                     again in {RETRY_MS} ms",
                    inner.config.root_dir.display(),
                );
            }
            failures += 1;
            queues.settle_again(topic, queue_id);
        }
    }
    failures == 0
}
