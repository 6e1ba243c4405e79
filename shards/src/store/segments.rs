//! Commitlog segment files: naming, creation, and the DMA read/write helpers.
//!
//! Lives on the store's shard. A segment is `<root>/commitlog/<20-digit start offset>`, exactly
//! `segment_size_bytes` long, starting at a multiple of that size. Files are opened O_DIRECT
//! (`runtime::fs::DirectFile`); only the flusher task writes them (and recovery, before the
//! flusher starts), so a zero-fill write can never race a data write to the same range.

use std::collections::BTreeMap;
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
}

fn segment_name(start: u64) -> String {
    format!("{start:020}")
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
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            let Some(start) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            if start % segment_size_bytes != 0 {
                return Err(StoreError::Config(format!(
                    "commitlog segment {name:?} does not start at a multiple of \
                     segment_size_bytes {segment_size_bytes} (was it changed?)"
                )));
            }
            starts.push(start);
        }
        starts.sort_unstable();
        let mut segments = Segments {
            dir,
            segment_size_bytes,
            files: BTreeMap::new(),
        };
        for start in starts {
            let file = open_segment_file(&segments.dir, start, false).await?;
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
        self.dir.join(segment_name(start))
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
}
