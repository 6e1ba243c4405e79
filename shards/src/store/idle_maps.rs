//! Idle consume queues let go of their maps.
//!
//! A queue that was written holds a map of its file, and the map, the page it touched and
//! the page table under it cost the process ~5 KiB (80,000 written queues a shard: ~0.4 GB),
//! whether the queue is still written or not. Every `IDLE_MAP_PASS_MS` a pass drops the maps
//! of the queues that no read or write used since the previous pass
//! (`QueueTable::release_idle_maps`); their next read or write maps the file again, an open
//! and a mmap of tens of microseconds. A queue written or read at least once a pass keeps its
//! map. The pass goes over the table `IDLE_MAP_STEP_QUEUES` queues at a time and yields
//! between steps, so the shard goes on serving while it runs. After a pass that dropped many
//! maps the allocator gives its free pages back (`runtime::release_free_memory`).

use std::rc::Rc;
use std::time::Duration;

use super::Inner;

/// Time between two passes: a queue unused for one to two of them loses its maps.
pub(crate) const IDLE_MAP_PASS_MS: u64 = 30_000;
/// Queues looked at in one step of a pass (each dropped map is a munmap, a few µs).
const IDLE_MAP_STEP_QUEUES: usize = 256;

/// Maps dropped in one pass after which the allocator is asked to give back its free pages:
/// the queues' writes left freed blocks between the ones still held (~40 MB after 80,000
/// queues a shard were written), which glibc keeps.
const TRIM_AFTER_RELEASED: usize = 1_024;

/// Starts the passes of `inner`'s store; they stop once the store is closing or dropped.
pub(crate) fn spawn(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    crate::runtime::spawn_detached(async move {
        loop {
            crate::runtime::sleep(Duration::from_millis(IDLE_MAP_PASS_MS)).await;
            let (mut after, mut released) = (None::<String>, 0);
            loop {
                let Some(inner) = weak.upgrade() else { return };
                if inner.log.borrow().closing {
                    return;
                }
                let (dropped, last) = inner
                    .queues
                    .borrow_mut()
                    .release_idle_maps(after.as_deref(), IDLE_MAP_STEP_QUEUES);
                released += dropped;
                drop(inner);
                match last {
                    Some(topic) => after = Some(topic),
                    None => break,
                }
                crate::runtime::yield_now().await;
            }
            if released > 0 {
                log::info!("{released} consume queues idle for a pass let go of their maps");
            }
            if released >= TRIM_AFTER_RELEASED {
                crate::runtime::release_free_memory().await;
            }
        }
    });
}
