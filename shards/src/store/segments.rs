//! Commitlog segment files: naming, creation, and the DMA read/write helpers.
//!
//! Lives on the store's shard. A segment is `<root>/commitlog/<20-digit start offset>`, exactly
//! `segment_size_bytes` long, starting at a multiple of that size; one that retention gave a
//! new start instead of deleting it (`retention.rs`) is `<20-digit start>.recycled`, and its
//! records carry a seal (`record::encode_sealed_to`): the bytes past its log's end are those
//! of its earlier life, not zeros. Files are opened O_DIRECT
//! (`runtime::fs::DirectFile`); only the flusher task writes them (and recovery, before the
//! flusher starts), so a zero-fill write can never race a data write to the same range.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

pub(crate) use crate::runtime::fs::sync_dir;
use crate::runtime::fs::DirectFile;

use super::StoreError;

/// Alignment of every write and of the flushed range (covers 512 B and 4 KiB block devices).
pub const BLOCK_BYTES: u64 = 4096;

pub(crate) fn align_down(value: u64, alignment: u64) -> u64 {
    value - value % alignment
}

pub(crate) fn align_up(value: u64, alignment: u64) -> u64 {
    align_down(value + alignment - 1, alignment)
}

/// The open segment files of one commitlog, by start offset.
pub(crate) struct Segments {
    pub(crate) dir: PathBuf,
    pub(crate) segment_size_bytes: u64,
    pub(crate) files: BTreeMap<u64, Rc<DirectFile>>,
    /// Starts whose file is a recycled one (named with `RECYCLED_SUFFIX`).
    pub(crate) recycled: BTreeSet<u64>,
    /// Starts a creation or a recycling is making a file for: no other one begins there.
    pub(crate) claimed: BTreeSet<u64>,
}

/// The name ending of a segment file that held an earlier segment.
pub const RECYCLED_SUFFIX: &str = ".recycled";

pub(crate) fn segment_name(start: u64) -> String {
    format!("{start:020}")
}

/// The name of the recycled segment file starting at `start`.
pub(crate) fn recycled_name(start: u64) -> String {
    format!("{start:020}{RECYCLED_SUFFIX}")
}

/// The start a commitlog file's name gives, and whether it is a recycled one; None for a
/// name that is not a segment's.
pub fn parse_segment_name(name: &str) -> Option<(u64, bool)> {
    let (digits, recycled) = match name.strip_suffix(RECYCLED_SUFFIX) {
        Some(digits) => (digits, true),
        None => (name, false),
    };
    let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    Some((digits.parse().ok().filter(|_| plain)?, recycled))
}

impl Segments {
    pub(crate) fn segment_start(&self, offset: u64) -> u64 {
        align_down(offset, self.segment_size_bytes)
    }

    /// Opens every segment in `dir`, checking names and sizes; a file shorter than a segment
    /// (a crash while it was being created) is extended.
    pub(crate) async fn open(
        dir: PathBuf,
        segment_size_bytes: u64,
        progress: &super::OpenProgress,
    ) -> Result<Segments, StoreError> {
        let mut starts = Vec::new();
        let mut recycled = BTreeSet::new();
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let Some((start, is_recycled)) = name.to_str().and_then(parse_segment_name) else {
                continue;
            };
            if start % segment_size_bytes != 0 {
                return Err(StoreError::Config(format!(
                    "commitlog segment {name:?} does not start at a multiple of \
                     segment_size_bytes {segment_size_bytes} (was it changed?)"
                )));
            }
            if is_recycled {
                recycled.insert(start);
            }
            starts.push(start);
        }
        starts.sort_unstable();
        // Both names: a crash came while a recycled file replaced a sparse one made ahead
        // (`retention::recycle_file`), which never took a byte of the log.
        for twice in starts.windows(2).filter(|w| w[0] == w[1]) {
            let replaced = dir.join(segment_name(twice[0]));
            log::warn!(
                "commitlog segment {}: removing {} (a recycled file replaced it)",
                twice[0],
                replaced.display()
            );
            std::fs::remove_file(&replaced)?;
        }
        starts.dedup();
        let mut segments = Segments {
            dir,
            segment_size_bytes,
            files: BTreeMap::new(),
            recycled,
            claimed: BTreeSet::new(),
        };
        for start in starts {
            let file = DirectFile::open(&segments.path_of(start), false).await?;
            let size = file.size().await?;
            if size > segment_size_bytes {
                return Err(StoreError::Config(format!(
                    "commitlog segment {start} is {size} bytes, larger than segment_size_bytes \
                     {segment_size_bytes} (was it changed?)"
                )));
            }
            if size < segment_size_bytes {
                file.set_len(segment_size_bytes).await?;
            }
            segments.files.insert(start, Rc::new(file));
            progress.step();
        }
        Ok(segments)
    }

    /// The file holding `offset`, if it exists.
    pub(crate) fn file_for(&self, offset: u64) -> Option<(u64, Rc<DirectFile>)> {
        let start = self.segment_start(offset);
        self.files.get(&start).map(|f| (start, f.clone()))
    }

    /// The segments starting at or after `start`, in order.
    pub(crate) fn segments_from(
        &self,
        start: u64,
    ) -> impl Iterator<Item = (u64, Rc<DirectFile>)> + '_ {
        self.files.range(start..).map(|(&s, f)| (s, f.clone()))
    }

    pub(crate) fn first_start(&self) -> Option<u64> {
        self.files.keys().next().copied()
    }

    pub(crate) fn last_start(&self) -> Option<u64> {
        self.files.keys().next_back().copied()
    }

    pub(crate) fn path_of(&self, start: u64) -> PathBuf {
        if self.recycled.contains(&start) {
            self.dir.join(recycled_name(start))
        } else {
            self.dir.join(segment_name(start))
        }
    }

    /// Whether the records of the segment holding `offset` are sealed (a recycled file).
    pub(crate) fn sealed_at(&self, offset: u64) -> bool {
        !self.recycled.is_empty() && self.recycled.contains(&self.segment_start(offset))
    }
}

/// Creates the segment starting at `start` in `dir`, `segment_size_bytes` long but a hole
/// (space is allocated a window at a time, `flusher::allocate_ahead`), and makes its name
/// durable. The file is made without a name (O_TMPFILE), sized, then linked under the
/// segment's name, so the directory never shows a segment shorter than its size. Two
/// creators at once (the creation ahead and an allocation or flush) end with the same file:
/// the second link finds the name taken, and that creator opens the file behind it.
pub(crate) async fn create_segment(
    dir: &Path,
    segment_size_bytes: u64,
    start: u64,
) -> Result<DirectFile, StoreError> {
    assert_eq!(
        start % segment_size_bytes,
        0,
        "segment starts are segment-aligned"
    );
    let file = DirectFile::create_unnamed(dir).await?;
    let linked = match file.set_len(segment_size_bytes).await {
        Ok(()) => file.link_to(&dir.join(segment_name(start))).await,
        Err(error) => Err(error),
    };
    let file = match linked {
        Ok(()) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            file.close().await?;
            open_segment_file(dir, start, false).await?
        }
        Err(error) => {
            let _ = file.close().await;
            return Err(error.into());
        }
    };
    sync_dir(dir).await?;
    Ok(file)
}

async fn open_segment_file(dir: &Path, start: u64, create: bool) -> Result<DirectFile, StoreError> {
    Ok(DirectFile::open(&dir.join(segment_name(start)), create).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_creations_of_one_segment_end_with_one_file_of_its_size() {
        const SIZE: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        crate::runtime::run_local(|| async move {
            let (first, second) = futures_lite::future::zip(
                create_segment(&path, SIZE, SIZE),
                create_segment(&path, SIZE, SIZE),
            )
            .await;
            let (first, second) = (first.unwrap(), second.unwrap());
            let inode = |fd: std::os::fd::RawFd| {
                // SAFETY: fstat of a descriptor the file holds, into a zeroed struct.
                let mut stat: libc::stat = unsafe { std::mem::zeroed() };
                assert_eq!(unsafe { libc::fstat(fd, &mut stat) }, 0);
                stat.st_ino
            };
            use std::os::unix::fs::MetadataExt;
            let on_disk = std::fs::metadata(path.join(segment_name(SIZE)))
                .unwrap()
                .ino();
            assert_eq!(
                inode(first.as_raw_fd()),
                on_disk,
                "the first holds the file"
            );
            assert_eq!(inode(second.as_raw_fd()), on_disk, "and so does the second");
            let names: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, vec![segment_name(SIZE)], "one name");
            assert_eq!(
                std::fs::metadata(path.join(segment_name(SIZE)))
                    .unwrap()
                    .len(),
                SIZE
            );
        });
    }

    #[test]
    fn names_say_the_start_and_whether_the_file_was_recycled() {
        assert_eq!(
            parse_segment_name("00000000001073741824"),
            Some((1 << 30, false))
        );
        assert_eq!(
            parse_segment_name("00000000001073741824.recycled"),
            Some((1 << 30, true))
        );
        for other in [
            "",
            ".recycled",
            "+1",
            "12x",
            "0001.recycled.tmp",
            "checkpoint",
        ] {
            assert_eq!(parse_segment_name(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_start_with_both_names_opens_with_its_recycled_file() {
        const SIZE: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        // A crash while a recycled file replaced the sparse one made ahead for its start.
        std::fs::write(path.join(segment_name(0)), b"").unwrap();
        std::fs::write(path.join(segment_name(SIZE)), b"").unwrap();
        std::fs::write(path.join(recycled_name(SIZE)), b"old records").unwrap();
        crate::runtime::run_local(|| async move {
            let progress = crate::store::OpenProgress::default();
            let segments = Segments::open(path.clone(), SIZE, &progress).await.unwrap();
            assert_eq!(
                segments.files.keys().copied().collect::<Vec<_>>(),
                vec![0, SIZE]
            );
            assert!(segments.sealed_at(SIZE + 5) && !segments.sealed_at(5));
            assert_eq!(segments.path_of(SIZE), path.join(recycled_name(SIZE)));
            let mut names: Vec<String> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, vec![segment_name(0), recycled_name(SIZE)]);
            let kept = std::fs::read(path.join(recycled_name(SIZE))).unwrap();
            assert!(
                kept.starts_with(b"old records"),
                "the recycled file is kept"
            );
        });
    }
}
