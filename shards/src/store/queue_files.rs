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

use std::rc::Rc;
use std::time::Duration;

use super::consume_queue::make_first_file;
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
