//! Commitlog segment files: naming, creation, and the DMA read/write helpers.
//!
//! Lives on the store's shard. A segment is `<root>/commitlog/<20-digit start offset>`, exactly
//! `segment_size_bytes` long, starting at a multiple of that size. Files are opened O_DIRECT
//! through glommio's `DmaFile`; only the flusher task writes them (and recovery, before the
//! flusher starts), so a zero-fill write can never race a data write to the same range.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{Directory, DmaBuffer, DmaFile, OpenOptions};

use super::error::{io_error, raw_os_error_of};
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
    pub(crate) files: BTreeMap<u64, Rc<DmaFile>>,
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
            let size = file.file_size().await.map_err(io_error)?;
            if size > segment_size_bytes {
                return Err(StoreError::Config(format!(
                    "commitlog segment {start} is {size} bytes, larger than segment_size_bytes \
                     {segment_size_bytes} (was it changed?)"
                )));
            }
            if size < segment_size_bytes {
                file.truncate(segment_size_bytes).await.map_err(io_error)?;
            }
            segments.files.insert(start, Rc::new(file));
            progress.step();
        }
        Ok(segments)
    }

    /// The file holding `offset`, if it exists.
    pub(crate) fn file_for(&self, offset: u64) -> Option<(u64, Rc<DmaFile>)> {
        let start = self.segment_start(offset);
        self.files.get(&start).map(|f| (start, f.clone()))
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
/// (space is allocated a window at a time, `allocate`), and makes its name durable.
pub(crate) async fn create_segment(
    dir: &Path,
    segment_size_bytes: u64,
    start: u64,
) -> Result<DmaFile, StoreError> {
    assert_eq!(
        start % segment_size_bytes,
        0,
        "segment starts are segment-aligned"
    );
    let file = open_segment_file(dir, start, true).await?;
    file.truncate(segment_size_bytes).await.map_err(io_error)?;
    sync_dir(dir).await?;
    Ok(file)
}

/// Allocates the first `len` bytes of a segment file (blocks already allocated stay as they
/// are). A filesystem without fallocate allocates nothing and says so with `Ok(false)`: its
/// writes may then find the disk full themselves.
pub(crate) async fn allocate(file: &DmaFile, len: u64) -> io::Result<bool> {
    match file.pre_allocate(len, true).await.map_err(io_error) {
        Ok(()) => Ok(true),
        Err(error) if raw_os_error_of(&error) == Some(libc::EOPNOTSUPP) => Ok(false),
        Err(error) => Err(error),
    }
}

async fn open_segment_file(dir: &Path, start: u64, create: bool) -> Result<DmaFile, StoreError> {
    let path = dir.join(segment_name(start));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .dma_open(&path)
        .await
        .map_err(io_error)?;
    Ok(file)
}

/// fsync of a directory, so that a new name in it survives a crash.
pub(crate) async fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    let handle = Directory::open(dir).await.map_err(io_error)?;
    handle.sync().await.map_err(io_error)?;
    handle.close().await.map_err(io_error)?;
    Ok(())
}

/// Reads exactly `out.len()` bytes at `pos` of `file` (any alignment).
pub(crate) async fn read_exact_at(file: &DmaFile, pos: u64, out: &mut [u8]) -> io::Result<()> {
    let read = file.read_at(pos, out.len()).await.map_err(io_error)?;
    if read.len() != out.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short read at {pos}: {} of {} bytes", read.len(), out.len()),
        ));
    }
    out.copy_from_slice(&read);
    Ok(())
}

/// Writes a whole DMA buffer at the aligned position `pos`; a short write is an error.
pub(crate) async fn write_buffer_at(file: &DmaFile, pos: u64, buffer: DmaBuffer) -> io::Result<()> {
    write_shared_buffer_at(file, pos, Rc::new(buffer)).await
}

/// [`write_buffer_at`] with a buffer that may be written again elsewhere (the flusher's zeros).
pub(crate) async fn write_shared_buffer_at(
    file: &DmaFile,
    pos: u64,
    buffer: Rc<DmaBuffer>,
) -> io::Result<()> {
    let len = buffer.len();
    assert_eq!(pos % BLOCK_BYTES, 0, "DMA writes start on a block");
    assert_eq!(len as u64 % BLOCK_BYTES, 0, "DMA writes cover whole blocks");
    let written = file.write_rc_at(buffer, pos).await.map_err(io_error)?;
    if written != len {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write at {pos}: {written} of {len} bytes"),
        ));
    }
    Ok(())
}
