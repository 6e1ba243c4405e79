//! Files, as the store reaches them: the runtime layer's wrapper over glommio's io_uring file
//! types, so that the store names none of them (a runtime swap stays a change to this module).
//!
//! - [`DirectFile`]: a file opened with O_DIRECT (commitlog segments, the DMA probe), read and
//!   written through io_uring with block-aligned [`AlignedBuffer`]s; reads at any alignment
//!   are widened by glommio and copied out, aligned ones can be kept as read ([`DmaBytes`]).
//! - [`write_small_file`], [`rename`], [`sync_dir`], [`fdatasync_path`]: buffered-file steps
//!   the checkpoint and the consume-queue syncs take, through io_uring as well.
//!
//! Every error keeps its OS error code (`raw_os_error` on the result, or
//! [`raw_os_error_of`] for one wrapped with context), because the store tells a full disk
//! (ENOSPC) and a short descriptor table (EMFILE) from a failing disk by it.

use std::io;
use std::path::Path;
use std::rc::Rc;

use glommio::io::{BufferedFile, Directory, DmaBuffer, DmaFile, OpenOptions};
use glommio::GlommioError;

/// Bytes a DMA read brought in, in the (aligned) buffer they were read into.
pub struct DmaBytes(glommio::io::ReadResult);

impl std::ops::Deref for DmaBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// A read at `pos` that brought fewer than `len` bytes is an error.
fn whole(read: &[u8], pos: u64, len: usize) -> io::Result<()> {
    if read.len() == len {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("short read at {pos}: {} of {len} bytes", read.len()),
    ))
}

/// A block-aligned buffer for O_DIRECT writes, registered with io_uring (glommio's DMA
/// memory).
pub struct AlignedBuffer(DmaBuffer);

impl AlignedBuffer {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.0.as_bytes_mut()
    }

    /// Start of the buffer, for a write the store's own ring issues; the buffer must outlive
    /// that write (the ring keeps an `Rc` of it).
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
}

/// A file opened with O_DIRECT, read and written through io_uring.
pub struct DirectFile(DmaFile);

impl DirectFile {
    /// Opens `path` for reading and writing; with `create`, makes it when missing.
    pub async fn open(path: &Path, create: bool) -> io::Result<DirectFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .dma_open(path)
            .await
            .map_err(io_error)?;
        Ok(DirectFile(file))
    }

    /// Creates a file with no name in the directory `dir` (O_TMPFILE), for `link_to` to
    /// give it one once it is ready: no reader of the directory sees it before, and a crash
    /// before leaves nothing behind.
    pub async fn create_unnamed(dir: &Path) -> io::Result<DirectFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .tmpfile(true)
            .tmpfile_linkable(true)
            .dma_open(dir)
            .await
            .map_err(io_error)?;
        Ok(DirectFile(file))
    }

    /// Names a file made by `create_unnamed` `path` (linkat, on the helper thread); an
    /// `AlreadyExists` error when the name is taken, which is left as it was.
    pub async fn link_to(&self, path: &Path) -> io::Result<()> {
        let from = std::ffi::CString::new(format!("/proc/self/fd/{}", self.as_raw_fd()))?;
        let to = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
        super::blocking(move || {
            // SAFETY: two NUL-terminated paths that live for the call.
            let code = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if code == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        })
        .await
    }

    /// Opens `path` read-only.
    pub async fn open_read_only(path: &Path) -> io::Result<DirectFile> {
        DmaFile::open(path).await.map(DirectFile).map_err(io_error)
    }

    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    pub async fn size(&self) -> io::Result<u64> {
        self.0.file_size().await.map_err(io_error)
    }

    /// Sets the file's length (a hole when it grows).
    pub async fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.truncate(len).await.map_err(io_error)
    }

    /// Allocates the blocks of the first `len` bytes (blocks already allocated stay as they
    /// are). A filesystem without fallocate allocates nothing and says so with `Ok(false)`.
    pub async fn allocate(&self, len: u64) -> io::Result<bool> {
        match self.0.pre_allocate(len, true).await.map_err(io_error) {
            Ok(()) => Ok(true),
            Err(error) if raw_os_error_of(&error) == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Gives back the blocks of `[pos, pos + len)` (a hole that reads as zeros; the size
    /// stays). A filesystem that cannot punch holes does nothing and says so with `Ok(false)`.
    pub async fn deallocate(&self, pos: u64, len: u64) -> io::Result<bool> {
        match self.0.deallocate(pos, len).await.map_err(io_error) {
            Ok(()) => Ok(true),
            Err(error) if raw_os_error_of(&error) == Some(libc::EOPNOTSUPP) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// A zeroed aligned buffer of `len` bytes for this file's writes.
    pub fn alloc_buffer(&self, len: usize) -> AlignedBuffer {
        let mut buffer = self.0.alloc_dma_buffer(len);
        buffer.as_bytes_mut().fill(0);
        AlignedBuffer(buffer)
    }

    /// Reads exactly `out.len()` bytes at `pos` (any alignment); a short read is an error.
    pub async fn read_exact_at(&self, pos: u64, out: &mut [u8]) -> io::Result<()> {
        let read = self.0.read_at(pos, out.len()).await.map_err(io_error)?;
        whole(&read, pos, out.len())?;
        out.copy_from_slice(&read);
        Ok(())
    }

    /// Reads exactly `len` bytes at the block-aligned `pos` and keeps them in the buffer the
    /// kernel read them into: no zeroed buffer to read into and no copy out of it (the store's
    /// read cache holds 1 MiB windows so). A short read is an error.
    pub async fn read_exact_aligned(&self, pos: u64, len: usize) -> io::Result<DmaBytes> {
        let read = self.0.read_at_aligned(pos, len).await.map_err(io_error)?;
        whole(&read, pos, len)?;
        Ok(DmaBytes(read))
    }

    /// Reads up to `len` bytes at the block-aligned `pos`; fewer at the end of the file.
    pub async fn read_aligned(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let read = self.0.read_at_aligned(pos, len).await.map_err(io_error)?;
        Ok(read.to_vec())
    }

    /// Writes the whole buffer at the block-aligned `pos`; a short write is an error.
    pub async fn write_at(&self, pos: u64, buffer: AlignedBuffer) -> io::Result<()> {
        let len = buffer.len();
        assert_eq!(pos % 4096, 0, "DMA writes start on a block");
        assert_eq!(len % 4096, 0, "DMA writes cover whole blocks");
        let written = self.0.write_at(buffer.0, pos).await.map_err(io_error)?;
        if written != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write at {pos}: {written} of {len} bytes"),
            ));
        }
        Ok(())
    }

    pub async fn fdatasync(&self) -> io::Result<()> {
        self.0.fdatasync().await.map_err(io_error)
    }

    /// Closes the file once the last reference to it goes (readers may still hold one).
    pub async fn close_shared(file: Rc<DirectFile>) {
        if let Ok(file) = Rc::try_unwrap(file) {
            let _ = file.0.close().await;
        }
    }

    pub async fn close(self) -> io::Result<()> {
        self.0.close().await.map_err(io_error)
    }
}

/// Creates (or replaces) `path` with `bytes` and fdatasyncs it (not its directory).
pub async fn write_small_file(path: &Path, bytes: Vec<u8>) -> io::Result<()> {
    write_file(path, bytes, true).await
}

/// Creates (or replaces) `path` with `bytes`, left in the page cache (it survives a crash of
/// the process, not of the machine).
pub async fn write_small_file_cached(path: &Path, bytes: Vec<u8>) -> io::Result<()> {
    write_file(path, bytes, false).await
}

async fn write_file(path: &Path, bytes: Vec<u8>, sync: bool) -> io::Result<()> {
    let file = BufferedFile::create(path).await.map_err(io_error)?;
    let len = bytes.len();
    let written = file.write_at(bytes, 0).await.map_err(io_error)?;
    if written != len {
        let _ = file.close().await;
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write of {}", path.display()),
        ));
    }
    if sync {
        file.fdatasync().await.map_err(io_error)?;
    }
    file.close().await.map_err(io_error)
}

/// Removes the file at `path`; one already gone is no error (a removal that a crash cut
/// short, done again).
pub fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Removes the directory at `path` and all it holds; one already gone is no error.
pub fn remove_dir_all_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Renames `from` to `to` (through io_uring).
pub async fn rename(from: &Path, to: &Path) -> io::Result<()> {
    glommio::io::rename(from, to).await.map_err(io_error)
}

/// fsync of a directory, so that a new name in it survives a crash.
pub async fn sync_dir(dir: &Path) -> io::Result<()> {
    let handle = Directory::open(dir).await.map_err(io_error)?;
    handle.sync().await.map_err(io_error)?;
    handle.close().await.map_err(io_error)
}

/// syncfs(2) of the filesystem holding `path`, on a helper thread: every dirty page of every
/// file there (memory maps included) and the metadata, in one call whose cost follows the
/// dirty bytes, not the number of files.
pub async fn syncfs(path: &Path) -> io::Result<()> {
    let path = path.to_path_buf();
    super::blocking(move || {
        use std::os::unix::io::AsRawFd;
        let handle = std::fs::File::open(&path)?;
        // SAFETY: plain syscall on a descriptor we own for the call's length.
        if unsafe { libc::syncfs(handle.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    })
    .await
}

/// fdatasync of a file by path (files written through memory maps).
pub async fn fdatasync_path(path: &Path) -> io::Result<()> {
    let file = BufferedFile::open(path).await.map_err(io_error)?;
    let synced = file.fdatasync().await.map_err(io_error);
    file.close().await.map_err(io_error)?;
    synced
}

/// glommio's error as an io::Error that keeps the OS error code (glommio's own conversion
/// drops it for errors that carry a path, and the store needs ENOSPC and EOPNOTSUPP).
fn io_error<T>(error: GlommioError<T>) -> io::Error {
    match error {
        GlommioError::IoError(e) => e,
        GlommioError::EnhancedIoError {
            source,
            op,
            path,
            fd,
        } => {
            let context = format!("{op} {path:?} (fd {fd:?})");
            match source.raw_os_error() {
                Some(code) => os_error_with_context(code, context),
                None => io::Error::new(source.kind(), format!("{context}: {source}")),
            }
        }
        other => io::Error::from(other),
    }
}

/// An io::Error for OS error `code` that also says what was being done.
pub fn os_error_with_context(code: i32, context: String) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, OsErrorWithContext { code, context })
}

/// An OS error code plus what was being done; `raw_os_error_of` finds the code again.
#[derive(Debug)]
struct OsErrorWithContext {
    code: i32,
    context: String,
}

impl std::fmt::Display for OsErrorWithContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.context,
            io::Error::from_raw_os_error(self.code)
        )
    }
}

impl std::error::Error for OsErrorWithContext {}

/// The OS error code of `error`, also when it was wrapped with context.
pub fn raw_os_error_of(error: &io::Error) -> Option<i32> {
    error.raw_os_error().or_else(|| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<OsErrorWithContext>())
            .map(|e| e.code)
    })
}
