//! The one cross-thread wake-up primitive: a socket pair whose read end a shard's task waits
//! on through glommio (so a parked shard wakes, as for any network read), and whose write end
//! any thread — another shard, a signal handler, the kernel finishing a commitlog chain —
//! writes one byte to. It replaces polling loops: the mesh inbox, the shutdown flag and the
//! route-replica waits are all woken this way, and an idle shard sleeps.
//!
//! Coalescing: a `Waker` sets `pending` before it writes and writes only when it was clear,
//! so a burst of wake-ups costs one byte and one syscall. The receiver clears it once its read
//! returns, before its caller looks for work, and with a swap (a read-modify-write that
//! acquires): a waker that found it still set and wrote nothing published its work before
//! that, and the caller sees it. A plain release store there let the caller's first look run
//! ahead of the clear (x86 holds a store in its buffer past later loads): that look could miss
//! work whose waker still saw the flag set, and the wake-up was lost.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_lite::AsyncReadExt;
use glommio::net::UnixStream;

/// The write end: `Send + Sync`, cheap to clone, safe to use from any thread.
#[derive(Clone)]
pub struct Waker {
    inner: Arc<WakerInner>,
}

struct WakerInner {
    socket: std::os::unix::net::UnixStream,
    pending: Arc<AtomicBool>,
}

/// The read end, owned by one shard's task.
pub struct WakeReceiver {
    stream: UnixStream,
    pending: Arc<AtomicBool>,
}

/// The read end before it is bound to the shard that waits on it (`Send`: it may be made on
/// one thread and moved to its shard).
pub struct UnboundReceiver {
    socket: std::os::unix::net::UnixStream,
    pending: Arc<AtomicBool>,
}

impl UnboundReceiver {
    /// Binds the read end to the current shard's executor.
    pub fn bind(self) -> WakeReceiver {
        // SAFETY: the descriptor is a socket this value owned whole.
        let stream = unsafe { UnixStream::from_raw_fd(self.socket.into_raw_fd()) };
        WakeReceiver {
            stream,
            pending: self.pending,
        }
    }
}

/// A connected pair whose read end is to be bound on the shard that waits on it.
pub fn unbound_pair() -> io::Result<(Waker, UnboundReceiver)> {
    let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    let pending = Arc::new(AtomicBool::new(false));
    let waker = Waker {
        inner: Arc::new(WakerInner {
            socket: tx,
            pending: pending.clone(),
        }),
    };
    Ok((
        waker,
        UnboundReceiver {
            socket: rx,
            pending,
        },
    ))
}

/// A connected pair, its read end bound to the current shard.
pub fn pair() -> io::Result<(Waker, WakeReceiver)> {
    let (waker, receiver) = unbound_pair()?;
    Ok((waker, receiver.bind()))
}

impl Waker {
    /// Wakes the receiver (once, however often this is called before it looks).
    pub fn wake(&self) {
        if self.inner.pending.swap(true, Ordering::AcqRel) {
            return;
        }
        write_byte(self.inner.socket.as_raw_fd());
    }

    /// The socket a signal handler (or the kernel, for the commitlog ring) writes to; writing
    /// one byte there wakes the receiver without the coalescing flag.
    pub fn raw_fd(&self) -> RawFd {
        self.inner.socket.as_raw_fd()
    }
}

/// Writes one byte to `fd` without blocking; a full socket already holds a wake-up.
/// Async-signal-safe (one `send`).
pub fn write_byte(fd: RawFd) {
    let byte = 1u8;
    // SAFETY: send(2) of one byte from a live stack variable; errors are ignored (EAGAIN
    // means a wake-up is already waiting).
    unsafe {
        libc::send(
            fd,
            &byte as *const u8 as *const libc::c_void,
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
}

impl WakeReceiver {
    /// Resolves at the next wake-up (at once if one came since the last call); Err(()) when
    /// every `Waker` is gone.
    pub async fn wait(&mut self) -> Result<(), ()> {
        let mut bytes = [0u8; 256];
        match self.stream.read(&mut bytes).await {
            Ok(0) | Err(_) => Err(()),
            Ok(_) => {
                self.clear_pending();
                Ok(())
            }
        }
    }

    /// Like `wait`, but a wake-up arriving by `write_byte` alone (no flag): the commitlog
    /// ring's kernel-sent bytes. Returns how many bytes were read.
    pub async fn read_some(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let read = self.stream.read(out).await?;
        self.clear_pending();
        Ok(read)
    }

    /// After a read: wakers write again from here on (see the module's doc).
    fn clear_pending(&self) {
        self.pending.swap(false, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ups_from_another_thread_coalesce_and_are_not_lost() {
        glommio::LocalExecutor::default().run(async {
            let (waker, mut receiver) = pair().unwrap();
            let remote = waker.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    remote.wake();
                }
            })
            .join()
            .unwrap();
            receiver.wait().await.unwrap();
            // The burst was one wake-up; a new one after the wait is seen again.
            waker.wake();
            receiver.wait().await.unwrap();
            drop(waker);
        });
    }
}
