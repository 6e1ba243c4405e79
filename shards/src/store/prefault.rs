//! Pages of the index's and the consume queues' maps made present before the shard writes
//! them.
//!
//! The first write to a page of a shared file map faults, and the fault (a page of the page
//! cache found or made, ext4's `page_mkwrite` with its journal handle) ran on the shard: 3.8%
//! of a shard's samples at ~280,000 SYNC sends of 1 KiB a second, 61% of the faults in the
//! index (its entries and, while a file is young, its slot table) and 39% in the queues'
//! units. When a file's blocks are reserved ahead, the shard's helper thread now faults the
//! reserved pages in (`MADV_POPULATE_WRITE`, Linux 5.14; an older kernel refuses it and the
//! shard faults as before). A queue does so only when it filled its previous reservation
//! within `HOT_RESERVE_MS`: a page made present is dirty, and a slow queue's would be written
//! to disk as zeros before its units reach it.

use memmap2::MmapMut;

/// A queue file that took less than this to fill its previous reservation
/// (`CQ_RESERVE_CHUNK_BYTES`, 1,638 units: over ~1,600 units a second) has its next one
/// faulted in ahead.
pub(crate) const HOT_RESERVE_MS: u64 = 1_000;

const PAGE_BYTES: usize = 4096;

/// Faults in, on the shard's helper thread, the pages of `map` from the first page boundary
/// at or after `from` up to `to` (the page holding `from` is being written by the shard now).
pub(crate) fn populate_ahead(map: &MmapMut, from: usize, to: usize) {
    let to = to.min(map.len());
    let base = map.as_ptr() as usize;
    let start = (base + from).next_multiple_of(PAGE_BYTES);
    let end = base + to;
    if end <= start {
        return;
    }
    crate::runtime::on_helper_detached(move || {
        // SAFETY: MADV_POPULATE_WRITE changes no byte of memory: it makes the pages present
        // and writable as a write would, without writing. If the map was dropped meanwhile,
        // the call fails, or faults in the pages of whatever mapping took its addresses since,
        // again without changing a byte. Its result is ignored: the shard's own writes fault
        // in whatever is not present.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident bytes of the mapping that starts at `address` (`Rss:` in /proc/self/smaps).
    fn resident_bytes(address: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let head = format!("{address:x}-");
        let mut lines = smaps.lines().skip_while(|line| !line.starts_with(&head));
        lines.next()?;
        let rss = lines.find(|line| line.starts_with("Rss:"))?;
        let kib: u64 = rss.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    fn mapped_file(dir: &std::path::Path, bytes: u64) -> MmapMut {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("map"))
            .unwrap();
        file.set_len(bytes).unwrap();
        // SAFETY: a file of this test's own, not truncated while mapped.
        unsafe { MmapMut::map_mut(&file) }.unwrap()
    }

    #[test]
    fn pages_ahead_are_made_present_by_the_helper_thread_and_only_there() {
        let dir = tempfile::tempdir().unwrap();
        let map = mapped_file(dir.path(), 1 << 20);
        let address = map.as_ptr() as usize;
        // No shard executor on this thread: nothing runs.
        populate_ahead(&map, 100, 1 << 20);
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(resident_bytes(address), Some(0));
        // The page holding `from` is the shard's to write; the pages after `to` stay out.
        let expected = (512 << 10) - 4096;
        crate::runtime::run_local(|| async {
            populate_ahead(&map, 100, 512 << 10);
            // The helper thread's fault of a page can wait for the disk's journal: with the
            // whole suite beside it, 2 s once left the last page out.
            for _ in 0..3_000 {
                if resident_bytes(address).unwrap() >= expected {
                    break;
                }
                crate::runtime::sleep(std::time::Duration::from_millis(10)).await;
            }
        });
        let resident = resident_bytes(address).unwrap();
        if resident == 0 {
            println!("MADV_POPULATE_WRITE did nothing here (a kernel before 5.14?): not checked");
            return;
        }
        assert_eq!(resident, expected);
    }
}
