//! The queue catalog: what a clean stop knew of every consume queue's files, so the next
//! start opens its queues without reading their directories.
//!
//! A start walked `consumequeue/<topic>/<queueId>/` and looked into each queue's first file.
//! With the page cache cold (after a reboot) every queue cost a directory block, an inode and
//! a page read from disk at random, and a node of 80,000 queues a shard waited 20–26 s for
//! them. A clean stop (`flusher::exit`) knows all of it, so before its clean checkpoint it
//! writes `<root>/consumequeue.catalog`: each queue's topic, id, first unit held and the first
//! unit of each of its files, plus how far retention has expired the queues. The checkpoint
//! names the catalog by a stamp (`Checkpoint::catalog`).
//!
//! Every synced checkpoint writes one too, of the queues as it counts them. A start after a
//! restart of the machine (a power loss) recovers from the last synced checkpoint, and with
//! its catalog it reads no queue directory or file before it serves either: the queues are
//! settled once it serves (`Settle` in consume_queue.rs), which is where the files made or
//! removed since the checkpoint are found. That catalog stays until the next synced
//! checkpoint replaces it, and none is written before the queues are settled, so a crash
//! meanwhile recovers from the two again.
//!
//! A clean stop's catalog is used only from the clean checkpoint that names it, and only when
//! nothing has renamed, added or removed a topic directory since (`consumequeue/`'s mtime is
//! not past the catalog's), and the start removes the file (with a directory sync) before it
//! changes any queue file. A queue that was still
//! waiting for its files at the stop is not listed; the clean checkpoint then records where
//! its units start (`awaiting_from`), and recovery rebuilds it from the log in memory, as
//! after a crash (should its file have been made after all, the helper thread keeps it and
//! writes the units again). A queue directory no queue of the table held at the stop (left by
//! a deletion that failed) is not opened, where a walk would have taken it up again.
//!
//! Layout, little-endian: `SHMQCQL1`, stamp u64, units per file u64, expired-below u64 (the
//! commitlog offset every queue's first unit was last found at or past), queue count u64;
//! then per queue a topic length u16 and the topic's bytes, queue id u32, min offset u64,
//! file count u32 and each file's first unit u64; then a CRC32 of everything before it.

use std::io;
use std::path::Path;

use crate::runtime::fs;

pub(crate) const FILE_NAME: &str = "consumequeue.catalog";
const TEMP_FILE_NAME: &str = "consumequeue.catalog.tmp";
const MAGIC: &[u8; 8] = b"SHMQCQL1";
const HEADER_BYTES: usize = 8 + 4 * 8;
/// A catalog larger than this is not ours (~40 bytes a queue: 25 million queues).
const CATALOG_SIZE_MAX_BYTES: u64 = 1 << 30;

/// One queue as the catalog lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub topic: String,
    pub queue_id: u32,
    pub min_offset: u64,
    /// The first unit of each of its files, in order.
    pub files: Vec<u64>,
}

/// A catalog read back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Catalog {
    pub expired_below: u64,
    pub queues: Vec<Listed>,
}

/// A stamp for a new catalog: the time in nanoseconds, so that a catalog left from an older
/// stop never matches a newer checkpoint.
pub(crate) fn new_stamp() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |since| since.as_nanos());
    // Never 0, and the low 64 bits of the nanoseconds change with every stop.
    (nanos as u64).max(1)
}

/// The bytes of a catalog of `queues`.
pub(crate) fn encode<'a>(
    stamp: u64,
    units_per_file: u64,
    expired_below: u64,
    queues: impl ExactSizeIterator<Item = (&'a str, u32, u64, &'a [u64])>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + queues.len() * 48 + 4);
    out.extend_from_slice(MAGIC);
    for value in [stamp, units_per_file, expired_below, queues.len() as u64] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for (topic, queue_id, min_offset, files) in queues {
        // Topic names are at most 127 bytes (`validate_topic`).
        out.extend_from_slice(&(topic.len() as u16).to_le_bytes());
        out.extend_from_slice(topic.as_bytes());
        out.extend_from_slice(&queue_id.to_le_bytes());
        out.extend_from_slice(&min_offset.to_le_bytes());
        out.extend_from_slice(&(files.len() as u32).to_le_bytes());
        for start in files {
            out.extend_from_slice(&start.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads `bytes` as a catalog stamped `stamp`, for `units_per_file` when given (else for
/// what it says); an error says what is wrong with it.
pub(crate) fn decode(
    bytes: &[u8],
    stamp: u64,
    units_per_file: Option<u64>,
) -> Result<Catalog, String> {
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        return Err("too short".into());
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return Err("its CRC does not match (torn or damaged)".into());
    }
    let mut reader = Reader { bytes: body };
    if reader.take(8)? != MAGIC {
        return Err("not a queue catalog".into());
    }
    let found_stamp = reader.u64()?;
    if found_stamp != stamp {
        return Err(format!(
            "stamped {found_stamp}, the checkpoint names {stamp}"
        ));
    }
    let found_units = reader.u64()?;
    let units_per_file = units_per_file.unwrap_or(found_units);
    if found_units != units_per_file || units_per_file == 0 {
        return Err(format!(
            "made for {found_units} units a file, the store uses {units_per_file}"
        ));
    }
    let expired_below = reader.u64()?;
    let count = reader.u64()?;
    let mut queues = Vec::with_capacity(count.min(body.len() as u64 / 18) as usize);
    for _ in 0..count {
        let topic_len = usize::from(u16::from_le_bytes(reader.array()?));
        let topic = std::str::from_utf8(reader.take(topic_len)?)
            .map_err(|_| "a topic is not UTF-8".to_string())?
            .to_string();
        let queue_id = u32::from_le_bytes(reader.array()?);
        let min_offset = reader.u64()?;
        let file_count = u32::from_le_bytes(reader.array()?);
        let mut files = Vec::with_capacity(file_count.min(1024) as usize);
        for _ in 0..file_count {
            let start = reader.u64()?;
            let in_order = files.last().is_none_or(|&last| last < start);
            if start % units_per_file != 0 || !in_order {
                return Err(format!("{topic}/{queue_id} lists a file at unit {start}"));
            }
            files.push(start);
        }
        queues.push(Listed {
            topic,
            queue_id,
            min_offset,
            files,
        });
    }
    if !reader.bytes.is_empty() {
        return Err("bytes follow its last queue".into());
    }
    Ok(Catalog {
        expired_below,
        queues,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], String> {
        if self.bytes.len() < len {
            return Err("cut short".into());
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let taken = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(taken);
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// Writes the catalog durably (temp file, fdatasync, rename). The checkpoint written next
/// syncs the directory, and names the catalog only once this returned.
pub(crate) async fn write(root: &Path, bytes: Vec<u8>) -> io::Result<()> {
    let temp = root.join(TEMP_FILE_NAME);
    fs::write_small_file(&temp, bytes).await?;
    fs::rename(&temp, &root.join(FILE_NAME)).await
}

/// Takes the catalog out of `root`: what it lists when the clean checkpoint names it by
/// `stamp`, it is whole, and no topic directory under `queue_root` changed after it was
/// written; None otherwise (said in the log when it was there), and the queues are read from
/// their directories. Either way the file is removed, with a sync of `root`, before the store
/// changes any queue file: no later start may take the listing for theirs. With `synced`
/// (the checkpoint recovery starts from is a synced one, not clean) the catalog is what it
/// lists when it is whole and stamped `stamp`, and it stays.
pub(crate) async fn take(
    root: &Path,
    queue_root: &Path,
    stamp: Option<u64>,
    units_per_file: u64,
    synced: bool,
) -> io::Result<Option<Catalog>> {
    if !root.join(FILE_NAME).exists() && !root.join(TEMP_FILE_NAME).exists() {
        return Ok(None);
    }
    let taken = |found: Result<Catalog, String>| match found {
        Ok(catalog) => Some(catalog),
        Err(why) => {
            log::warn!(
                "store: not using the queue catalog {} ({why}); reading every queue's directory",
                root.join(FILE_NAME).display()
            );
            None
        }
    };
    if synced {
        // A synced checkpoint's: it stays until the next synced one replaces it, for a
        // crash before the queues are settled recovers from the two again.
        return Ok(stamp.and_then(|stamp| taken(read(root, stamp, Some(units_per_file)))));
    }
    let catalog =
        stamp.and_then(|stamp| taken(usable(root, queue_root, stamp, Some(units_per_file))));
    remove(root).await?;
    Ok(catalog)
}

/// The catalog in `root` when the next start would take it (see `take`), else why not. With
/// `units_per_file` None it is read for what it says (`shardmq verify`).
pub(crate) fn usable(
    root: &Path,
    queue_root: &Path,
    stamp: u64,
    units_per_file: Option<u64>,
) -> Result<Catalog, String> {
    let path = root.join(FILE_NAME);
    let meta = bounded_metadata(&path)?;
    // A topic directory made, removed or renamed since the stop (by hand) changes the
    // listing the catalog holds.
    let changed_after = std::fs::metadata(queue_root)
        .and_then(|queues| Ok(queues.modified()? > meta.modified()?))
        .unwrap_or(true);
    if changed_after {
        return Err("consumequeue/ changed after it was written".into());
    }
    read_file(&path, stamp, units_per_file)
}

/// The catalog in `root` stamped `stamp`, whatever changed since it was written.
fn read(root: &Path, stamp: u64, units_per_file: Option<u64>) -> Result<Catalog, String> {
    let path = root.join(FILE_NAME);
    bounded_metadata(&path)?;
    read_file(&path, stamp, units_per_file)
}

/// The catalog file's metadata; an error when it is past `CATALOG_SIZE_MAX_BYTES`.
fn bounded_metadata(path: &Path) -> Result<std::fs::Metadata, String> {
    let meta = std::fs::metadata(path).map_err(|error| error.to_string())?;
    if meta.len() > CATALOG_SIZE_MAX_BYTES {
        return Err("oversized".into());
    }
    Ok(meta)
}

fn read_file(path: &Path, stamp: u64, units_per_file: Option<u64>) -> Result<Catalog, String> {
    let bytes = std::fs::read(path).map_err(|error| error.to_string())?;
    decode(&bytes, stamp, units_per_file)
}

/// Removes the catalog and a temp file an interrupted write left, then syncs `root`.
async fn remove(root: &Path) -> io::Result<()> {
    for name in [FILE_NAME, TEMP_FILE_NAME] {
        fs::remove_if_present(&root.join(name))?;
    }
    fs::sync_dir(root).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(String, u32, u64, Vec<u64>)> {
        vec![
            ("TopicA".into(), 0, 0, vec![0]),
            ("TopicA".into(), 7, 12, vec![0, 100, 200]),
            ("%RETRY%group".into(), 1, 300, vec![300]),
            ("Empty".into(), 3, 0, vec![]),
        ]
    }

    fn encoded(stamp: u64) -> Vec<u8> {
        let queues = sample();
        encode(
            stamp,
            100,
            4096,
            queues
                .iter()
                .map(|(t, id, min, files)| (t.as_str(), *id, *min, files.as_slice())),
        )
    }

    #[test]
    fn a_catalog_reads_back_as_written_and_only_with_its_stamp() {
        let bytes = encoded(42);
        let catalog = decode(&bytes, 42, Some(100)).unwrap();
        assert_eq!(catalog.expired_below, 4096);
        let back: Vec<_> = catalog
            .queues
            .into_iter()
            .map(|l| (l.topic, l.queue_id, l.min_offset, l.files))
            .collect();
        assert_eq!(back, sample());
        assert!(decode(&bytes, 43, Some(100))
            .unwrap_err()
            .contains("stamped 42"));
        assert!(decode(&bytes, 42, Some(300))
            .unwrap_err()
            .contains("100 units"));
    }

    #[test]
    fn a_torn_or_damaged_catalog_is_refused() {
        let bytes = encoded(7);
        for cut in [0, 3, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut], 7, Some(100)).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[HEADER_BYTES + 3] ^= 0x40;
        assert!(decode(&flipped, 7, Some(100)).unwrap_err().contains("CRC"));
        // Whole, but a file that does not start at a multiple of the units per file.
        let bad = encode(7, 100, 0, std::iter::once(("T", 0, 0, &[0u64, 150][..])));
        assert!(decode(&bad, 7, None).unwrap_err().contains("T/0"));
    }
}
