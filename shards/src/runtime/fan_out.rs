//! Blocking file work spread over a few threads for a store's open, so the disk sees many
//! small reads at once instead of one at a time.
//!
//! Opening a store with 80,000 queues reads a directory block, an inode and a page of every
//! queue. With the page cache cold (after a reboot) each of those is a random read that the
//! shard waited for alone, at queue depth one: a 50 s recovery was mostly the shard asleep in
//! `folio_wait_bit_common`. `map` runs the same calls on `FAN_OUT_THREADS` threads, the
//! caller's one of them (they inherit the shard's CPU placement: the work is waiting, not
//! computing). Meant for the store's open, when the shard serves nothing yet; its caller
//! blocks until every item is done.

/// Threads `map` runs its work on: enough to keep a disk's queue busy with small reads.
pub const FAN_OUT_THREADS: usize = 16;
/// Fewer items than this are done on the caller's thread (starting threads costs more).
pub const FAN_OUT_MIN_ITEMS: usize = 64;

/// `work` applied to every item, on up to `FAN_OUT_THREADS` threads; the results in the
/// items' order.
pub fn map<T, R, F>(items: Vec<T>, work: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(T) -> R + Sync,
{
    if items.len() < FAN_OUT_MIN_ITEMS {
        return items.into_iter().map(work).collect();
    }
    let per_chunk = items.len().div_ceil(FAN_OUT_THREADS * 4);
    let mut chunks = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        chunks.push(items.by_ref().take(per_chunk).collect::<Vec<T>>());
    }
    let chunk_count = chunks.len();
    // Chunks are taken in turn by whichever thread is free, the caller's among them: a
    // thread that cannot start (out of threads or memory) only means fewer at work.
    let pending = std::sync::Mutex::new(chunks.into_iter().enumerate());
    let done = std::sync::Mutex::new(Vec::with_capacity(chunk_count));
    let run = || loop {
        let next = pending.lock().unwrap_or_else(|e| e.into_inner()).next();
        let Some((at, chunk)) = next else {
            return;
        };
        let results: Vec<R> = chunk.into_iter().map(&work).collect();
        done.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((at, results));
    };
    // Named after the caller (`shard-3` runs `shard-3-open`), so a profile or `top -H`
    // tells whose open it is.
    let name = format!(
        "{}-open",
        std::thread::current().name().unwrap_or("fan-out")
    );
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..FAN_OUT_THREADS)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name(name.clone())
                    .spawn_scoped(scope, run)
                    .ok()
            })
            .collect();
        run();
        for helper in helpers {
            // A panic in the work is the caller's panic, as if it ran here.
            if let Err(panic) = helper.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_unstable_by_key(|(at, _)| *at);
    done.into_iter().flat_map(|(_, results)| results).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_order_of_the_items_across_threads() {
        for count in [0, 1, FAN_OUT_MIN_ITEMS - 1, FAN_OUT_MIN_ITEMS, 1_001] {
            let items: Vec<u64> = (0..count as u64).collect();
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let out = map(items, |n| {
                threads.lock().unwrap().insert(std::thread::current().id());
                // Long enough that the caller cannot take every chunk before a helper starts.
                std::thread::sleep(std::time::Duration::from_micros(200));
                n * 2
            });
            assert_eq!(out, (0..count as u64).map(|n| n * 2).collect::<Vec<_>>());
            let used = threads.lock().unwrap().len();
            if count >= FAN_OUT_MIN_ITEMS {
                assert!(used > 1, "{count} items ran on {used} thread(s)");
            } else {
                assert!(used <= 1);
            }
        }
    }
}
