//! Every workaround for a runtime trap seen on these machines, in one place: what was seen,
//! where, how the workaround works, the evidence, its cost, the knob that turns it off, and the
//! counter of the times it mattered (GET_BROKER_RUNTIME_INFO shows them), so that whether each
//! is still needed is measured, not believed.
//!
//! | workaround | knob (off) | counter |
//! |---|---|---|
//! | the watchdog's nudge of a stalled shard | `runtime.watchdog_ms` = 0 | `nudges` |
//! | a store open abandoned for want of progress, and tried again | `STORE_OPEN_STALL_MS` → `store_open_stall_ms` = 0 | `store_opens_abandoned` |
//! | the DMA probe priming | — (a wrong device answer breaks every read) | — |
//! | a connection taken from a listener's queue while its accept still waits | — (one accept attempt a second per listener) | `accepts_found_waiting` |
//!
//! **Watchdog.** Symptom: a shard slept through its own timers and new connections until
//! something else woke it (a debugger attaching freed it). Seen: now and then at start-up on
//! these virtio VMs (1 stall in 50 starts). Mechanism: glommio parks an idle executor in
//! io_uring_enter on its main ring, linked to its latency ring by a POLL_ADD; that link now
//! and then did not fire. A signal interrupts the wait (EINTR) and glommio then reaps every
//! ring. The first version sent SIGUSR1 to every shard every 5 ms (0 stalls in 160 starts), at
//! a cost of 200 wake-ups a second per idle shard (12% of a core for an idle two-shard node).
//! Now each shard's runtime beats a heartbeat every `HEARTBEAT_MS`; the watchdog thread looks
//! every `watchdog_ms` and signals only a shard whose heartbeat is overdue by more than
//! `STALL_GRACE_MS`, counting each nudge. An idle shard sleeps; a stall is bounded by about a
//! second instead of 5 ms, and the counter says whether stalls still happen.
//!
//! **Store open retry.** Symptom: opening a store at start never finished (a glommio file
//! operation's completion was lost between its rings). A fresh attempt went through, and
//! recovery is idempotent. The retry used to impose a 3 s deadline, which abandoned every
//! legitimate recovery longer than that (5 GB past the checkpoint); now an attempt is abandoned
//! only when no I/O step completed for `store_open_stall_ms` (recovery reports each step in
//! `store::OpenProgress`), so a long recovery runs as long as it needs.
//!
//! **Accept recheck.** Symptom: in a full CI run a test's connections to a broker port were
//! closed only about 5 s late each (when its client gave up), for minutes: the shard logged
//! its refusals about every 5 s while its timers kept time, so the shard was awake but its
//! accept did not complete while connections waited in the listener's queue. Seen: twice in
//! full-suite runs (one on CI), never in 45 runs of the test alone. Mechanism: not found; the
//! accept is an io_uring request on one of glommio's rings, and a completion that is not
//! reaped (the watchdog's trap, without the missed timers) fits. Workaround: `Acceptor`
//! keeps the ring's accept pending and, whenever it has waited `ACCEPT_RECHECK_MS`, tries a
//! non-blocking accept of its own on the listener; a connection found that way counts in
//! `accepts_found_waiting` (a few may be races with a completion about to be reaped, so a
//! steady rise is the sign). Cost: one accept attempt a second per idle listener.
//!
//! **DMA probe priming.** glommio 0.9 reads the first DMA file opened on a device (per thread)
//! to decide whether the device takes polled I/O; on an empty file the read "succeeds", the
//! device is marked pollable, and every later O_DIRECT read on a virtio disk fails with
//! EOPNOTSUPP (os error 95). Each store opens a non-empty `.dma_probe` file first
//! (`prime_dma_probe`).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::ShardId;

/// How often each shard's runtime beats its heartbeat (one wake-up per second when idle).
pub const HEARTBEAT_MS: u64 = 1_000;
/// A heartbeat this much overdue means the shard is stalled (or busy without yielding).
pub const STALL_GRACE_MS: u64 = 500;
/// Default watchdog period; 0 turns the watchdog off.
pub const WATCHDOG_DEFAULT_MS: u64 = 250;
/// How long a listener's accept waits before the listener's queue is looked at directly.
pub const ACCEPT_RECHECK_MS: u64 = 1_000;
/// Default: an open without an I/O step for this long is abandoned and tried again.
pub const STORE_OPEN_STALL_DEFAULT_MS: u64 = 10_000;
/// Attempts of a store open before the node gives up.
pub const STORE_OPEN_ATTEMPTS_MAX: u32 = 3;
/// The non-empty file opened first on each data device (see the module doc).
pub const DMA_PROBE_FILE_NAME: &str = ".dma_probe";

/// Times each workaround mattered, process-wide.
#[derive(Debug, Default)]
pub struct Counters {
    /// Nudges the watchdog sent to stalled shards.
    pub nudges: AtomicU64,
    /// Store opens abandoned for want of progress.
    pub store_opens_abandoned: AtomicU64,
    /// Connections a listener's recheck found waiting while its accept had not completed.
    pub accepts_found_waiting: AtomicU64,
}

/// The process's counters.
pub fn counters() -> &'static Counters {
    static COUNTERS: std::sync::OnceLock<Counters> = std::sync::OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

extern "C" fn on_nudge(_: libc::c_int) {}

/// The shards' heartbeats and thread ids, shared with the watchdog thread.
#[derive(Clone)]
pub(crate) struct Watchdog {
    /// Per shard: pthread id (0 until registered) and the monotonic ms of its last beat.
    threads: Arc<Vec<AtomicU64>>,
    beats: Arc<Vec<AtomicU64>>,
}

impl Watchdog {
    /// Installs the nudge signal's handler and, unless `interval_ms` is 0, starts the thread.
    pub(crate) fn start(shard_count: usize, interval_ms: u64) -> io::Result<Watchdog> {
        // SAFETY: installs a handler that does nothing; without SA_RESTART, so that a
        // shard's io_uring_enter returns EINTR instead of being restarted.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_nudge as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let make = || {
            (0..shard_count)
                .map(|_| AtomicU64::new(0))
                .collect::<Vec<_>>()
        };
        let watchdog = Watchdog {
            threads: Arc::new(make()),
            beats: Arc::new(make()),
        };
        if interval_ms > 0 {
            let watched = watchdog.clone();
            std::thread::Builder::new()
                .name("shard-watchdog".into())
                .spawn(move || watched.run(interval_ms))?;
        }
        Ok(watchdog)
    }

    fn run(&self, interval_ms: u64) {
        let overdue_ms = HEARTBEAT_MS + STALL_GRACE_MS;
        loop {
            std::thread::sleep(Duration::from_millis(interval_ms));
            let now = super::monotonic_ms();
            for (shard, thread) in self.threads.iter().enumerate() {
                let id = thread.load(Ordering::Relaxed);
                let beat = self.beats[shard].load(Ordering::Relaxed);
                if id == 0 || beat == 0 || now.saturating_sub(beat) <= overdue_ms {
                    continue;
                }
                counters().nudges.fetch_add(1, Ordering::Relaxed);
                // The beat moves on so that a shard busy for long is nudged once a period.
                self.beats[shard].store(now, Ordering::Relaxed);
                // SAFETY: the id was registered by a live shard thread; shard threads live
                // until the process exits.
                unsafe { libc::pthread_kill(id as libc::pthread_t, libc::SIGUSR1) };
            }
        }
    }

    /// Called on the shard's own thread before its executor runs anything.
    pub(crate) fn register_current_thread(&self, shard_id: ShardId) {
        // SAFETY: pthread_self has no preconditions.
        let id = unsafe { libc::pthread_self() } as u64;
        self.threads[shard_id.0].store(id, Ordering::Relaxed);
        self.beat(shard_id);
    }

    pub(crate) fn beat(&self, shard_id: ShardId) {
        self.beats[shard_id.0].store(super::monotonic_ms().max(1), Ordering::Relaxed);
    }

    /// The shard's heartbeat task (see the module doc).
    pub(crate) async fn heartbeat(self, shard_id: ShardId) {
        loop {
            self.beat(shard_id);
            super::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
        }
    }
}

/// Watches an operation that reports progress through `steps` (a counter it moves after
/// every completed I/O step): resolves once `steps` has not moved for `stall_ms`. With
/// `stall_ms` 0 it never resolves (the workaround is off).
pub async fn stalled(steps: impl Fn() -> u64, stall_ms: u64, mut on_tick: impl FnMut()) {
    let tick = Duration::from_millis(500);
    let mut last = steps();
    let mut quiet_ms = 0u64;
    loop {
        super::sleep(tick).await;
        on_tick();
        let now = steps();
        if now != last {
            (last, quiet_ms) = (now, 0);
            continue;
        }
        quiet_ms += tick.as_millis() as u64;
        if stall_ms > 0 && quiet_ms >= stall_ms {
            return;
        }
    }
}

/// Opens a non-empty file with DMA in `dir` before any other on its device, and checks that
/// a DMA read works (see the module doc). Plain std I/O makes the file: no DMA file may be
/// opened on this device before this one.
pub async fn prime_dma_probe(dir: &Path) -> io::Result<()> {
    const PROBE_BYTES: usize = 4096;
    let path = dir.join(DMA_PROBE_FILE_NAME);
    let ready = std::fs::metadata(&path).is_ok_and(|m| m.len() >= PROBE_BYTES as u64);
    if !ready {
        std::fs::write(&path, vec![0x5Au8; PROBE_BYTES])?;
        std::fs::File::open(&path)?.sync_all()?;
    }
    let file = super::fs::DirectFile::open_read_only(&path).await?;
    let read = file.read_aligned(0, PROBE_BYTES).await;
    file.close().await?;
    match read {
        Ok(bytes) if bytes.len() == PROBE_BYTES => Ok(()),
        Ok(bytes) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("short read of {}: {} bytes", path.display(), bytes.len()),
        )),
        Err(error) if super::fs::raw_os_error_of(&error) == Some(libc::EOPNOTSUPP) => {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "O_DIRECT reads fail with EOPNOTSUPP under {}: glommio marked this device \
                 pollable because an empty DMA file was opened on it earlier on this thread; \
                 open the store before any other DMA file on this device",
                    dir.display()
                ),
            ))
        }
        Err(error) => Err(error),
    }
}

/// The connections of one listener, accepted through glommio's ring and, should that accept
/// not complete while connections wait, by the recheck (see the module doc). The ring's
/// accept stays pending between rechecks: cancelling it could lose a connection it had just
/// taken.
pub struct Acceptor<'a> {
    listener: &'a glommio::net::TcpListener,
    /// The listener's descriptor (glommio's listener does not tell it).
    fd: std::os::fd::RawFd,
    pending: Option<PendingAccept<'a>>,
}

type PendingAccept<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = glommio::Result<super::TcpStream, ()>> + 'a>,
>;

impl<'a> Acceptor<'a> {
    pub(crate) fn new(
        listener: &'a glommio::net::TcpListener,
        fd: std::os::fd::RawFd,
    ) -> Acceptor<'a> {
        Acceptor {
            listener,
            fd,
            pending: None,
        }
    }

    /// The next connection.
    pub async fn accept(&mut self) -> io::Result<super::TcpStream> {
        let listener = self.listener;
        loop {
            let pending = self
                .pending
                .get_or_insert_with(|| Box::pin(listener.accept()));
            let recheck = Duration::from_millis(ACCEPT_RECHECK_MS);
            if let Some(accepted) = super::timeout(recheck, pending.as_mut()).await {
                self.pending = None;
                return accepted.map_err(io::Error::from);
            }
            if let Some(stream) = accept_waiting(self.fd)? {
                counters()
                    .accepts_found_waiting
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(stream);
            }
        }
    }
}

/// A connection waiting in the queue of listener `fd`, taken without blocking; None when none waits.
fn accept_waiting(fd: std::os::fd::RawFd) -> io::Result<Option<super::TcpStream>> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl and accept4 on a descriptor the listener owns, every result checked; the
    // descriptor accept4 returns is new and owned by the stream made from it.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        // The listener is blocking (glommio sets O_NONBLOCK only around its own attempt).
        let toggled = flags & libc::O_NONBLOCK == 0;
        if toggled && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
        let accepted = libc::accept4(
            fd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        );
        let error = io::Error::last_os_error();
        if toggled {
            libc::fcntl(fd, libc::F_SETFL, flags);
        }
        if accepted >= 0 {
            return Ok(Some(super::TcpStream::from_raw_fd(accepted)));
        }
        match error.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::ECONNABORTED) => Ok(None),
            _ => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime;

    #[test]
    fn the_recheck_takes_a_waiting_connection_and_nothing_else() {
        runtime::run_local(|| async {
            let listener = runtime::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let address = listener.local_addr().unwrap();
            assert!(accept_waiting(listener.fd).unwrap().is_none());
            let peer = std::net::TcpStream::connect(address).unwrap();
            let stream = accept_waiting(listener.fd)
                .unwrap()
                .expect("a waiting connection");
            assert_eq!(stream.peer_addr().unwrap(), peer.local_addr().unwrap());
            assert!(accept_waiting(listener.fd).unwrap().is_none());
            // The listener is left blocking, as glommio expects it.
            // SAFETY: F_GETFL on a descriptor the listener owns.
            let flags = unsafe { libc::fcntl(listener.fd, libc::F_GETFL) };
            assert_eq!(flags & libc::O_NONBLOCK, 0);
        });
    }

    #[test]
    fn the_acceptor_serves_connections_across_rechecks() {
        runtime::run_local(|| async {
            let listener = runtime::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let address = listener.local_addr().unwrap();
            let mut acceptor = listener.acceptor();
            // One connection at once, one after the ring's accept has waited past a recheck.
            let peers = std::thread::spawn(move || {
                let first = std::net::TcpStream::connect(address).unwrap();
                std::thread::sleep(Duration::from_millis(ACCEPT_RECHECK_MS * 3 / 2));
                let second = std::net::TcpStream::connect(address).unwrap();
                (first.local_addr().unwrap(), second.local_addr().unwrap())
            });
            let first = acceptor.accept().await.unwrap().peer_addr().unwrap();
            let second = acceptor.accept().await.unwrap().peer_addr().unwrap();
            assert_eq!((first, second), peers.join().unwrap());
        });
    }
}
