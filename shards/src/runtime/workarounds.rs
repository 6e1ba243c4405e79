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
//! | the watchdog of executors without a node (`run_local`) | — | `nudges` |
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
//! **Executors without a node.** Symptom: a store's lib test hung now and then (one
//! run in 100-200 with three test processes on two cores), its thread asleep in
//! io_uring_enter on glommio's main ring, nothing else running. Seen with io_uring tracepoints
//! (ftrace, the stress of a store's open, appends, two resets at once and close, 2-3 test
//! processes, a hang every 1,000-2,000 rounds): a file operation that io_uring hands its worker
//! thread (a STATX of a segment file being created) had been submitted, the worker was idle
//! and no completion was in any ring; the thread slept until its next timer fired (30 s: the
//! idle-maps pass), and the operation completed at once after that wake-up. A stall ended by
//! SIGSTOP + SIGCONT as well; it happened with our commit ring set up with or without
//! COOP_TASKRUN. The mechanism (in the kernel or in glommio) is not found; what releases it
//! is any wake-up of the thread. A node's shards beat the heartbeat below (a timer each
//! `HEARTBEAT_MS`) under the watchdog, so there the stall lasts a second or two at most. `run_local` executors (every
//! store test, the tools) had neither. A timer alone (each second) bounded the stress's stalls
//! (none in 7,108 rounds, where 2 of 30 s came in 2,100 without it), but the store's tests,
//! run three at a time beside the test command, still stalled once: one test ran for over a
//! minute while the two processes beside it ran all eleven in 18.5 s, and it ended within
//! 3 s of SIGSTOP + SIGCONT: the watchdog's case above. So `run_local` executors now
//! beat under a watchdog of their own (`LocalWatch`: one thread for the process, nudging an
//! executor whose beat is overdue, as for shards). Cost: one wake-up a second of an idle
//! executor, and the watchdog thread's four a second.
//!
//! **Store open retry.** Symptom: opening a store at start never finished (a glommio file
//! operation's completion was lost between its rings). A fresh attempt went through, and
//! recovery is idempotent. The retry used to impose a 3 s deadline, which abandoned every
//! legitimate recovery longer than that (5 GB past the checkpoint); now an attempt is abandoned
//! only when no I/O step completed for `store_open_stall_ms` (recovery reports each step in
//! `store::OpenProgress`), so a long recovery runs as long as it needs.
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
}

/// The process's counters.
pub fn counters() -> &'static Counters {
    static COUNTERS: std::sync::OnceLock<Counters> = std::sync::OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

extern "C" fn on_nudge(_: libc::c_int) {}

/// Installs the nudge signal's handler: one that does nothing, without SA_RESTART, so that an
/// executor's io_uring_enter returns EINTR instead of being restarted.
fn install_nudge_handler() -> io::Result<()> {
    // SAFETY: installs a handler that does nothing.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_nudge as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

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
        install_nudge_handler()?;
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
        loop {
            std::thread::sleep(Duration::from_millis(interval_ms));
            let now = super::monotonic_ms();
            for (thread, beat) in self.threads.iter().zip(self.beats.iter()) {
                let id = thread.load(Ordering::Relaxed);
                if id == 0 || beat.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                // SAFETY: the id was registered by a live shard thread; shard threads live
                // until the process exits.
                unsafe { nudge_if_overdue(id, beat, now) };
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
        beat_now(&self.beats[shard_id.0]);
    }

    /// The shard's heartbeat task (see the module doc).
    pub(crate) async fn heartbeat(self, shard_id: ShardId) {
        loop {
            self.beat(shard_id);
            super::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
        }
    }
}

/// A heartbeat: the monotonic ms now (never 0, which means "not beating yet").
fn beat_now(beat: &AtomicU64) {
    beat.store(super::monotonic_ms().max(1), Ordering::Relaxed);
}

/// Nudges the thread `id` when its `beat` is overdue at `now`, and counts it. The beat moves
/// on, so that a thread busy for long is nudged once a period.
///
/// # Safety
/// `id` is the pthread id of a thread that lives through the call.
unsafe fn nudge_if_overdue(id: u64, beat: &AtomicU64, now: u64) {
    let overdue_ms = HEARTBEAT_MS + STALL_GRACE_MS;
    if now.saturating_sub(beat.load(Ordering::Relaxed)) <= overdue_ms {
        return;
    }
    counters().nudges.fetch_add(1, Ordering::Relaxed);
    beat.store(now, Ordering::Relaxed);
    // SAFETY: the caller's promise.
    unsafe { libc::pthread_kill(id as libc::pthread_t, libc::SIGUSR1) };
}

/// The watchdog of executors that run no node (`run_local`: tests and tools driving a
/// store): one thread for the process, started with the first, watching the threads that run
/// such an executor now. Each beats like a shard; one whose beat is overdue is nudged.
struct LocalWatchdog {
    /// Per executor running now: its pthread id and its last beat. The watchdog signals under
    /// this lock, and an executor leaves under it, so no thread is signalled after it left.
    running: std::sync::Mutex<Vec<(u64, Arc<AtomicU64>)>>,
}

/// A `run_local` executor's place under the local watchdog; dropping it (the executor
/// returned, or unwound) takes the thread out.
pub(crate) struct LocalWatch {
    beat: Arc<AtomicU64>,
}

impl LocalWatch {
    /// The current thread, watched from now until the returned value is dropped; None when
    /// the watchdog could not start (the executor then runs unwatched).
    pub(crate) fn start() -> Option<LocalWatch> {
        let watchdog = local_watchdog()?;
        // SAFETY: pthread_self has no preconditions.
        let id = unsafe { libc::pthread_self() } as u64;
        let beat = Arc::new(AtomicU64::new(0));
        beat_now(&beat);
        let mut running = watchdog.running.lock().unwrap_or_else(|e| e.into_inner());
        running.push((id, beat.clone()));
        Some(LocalWatch { beat })
    }

    /// The executor's heartbeat task (it runs until the executor is dropped).
    pub(crate) fn heartbeat(&self) -> impl std::future::Future<Output = ()> + 'static {
        let beat = self.beat.clone();
        async move {
            loop {
                beat_now(&beat);
                super::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
            }
        }
    }
}

impl Drop for LocalWatch {
    fn drop(&mut self) {
        if let Some(watchdog) = local_watchdog() {
            let mut running = watchdog.running.lock().unwrap_or_else(|e| e.into_inner());
            running.retain(|(_, beat)| !Arc::ptr_eq(beat, &self.beat));
        }
    }
}

fn local_watchdog() -> Option<&'static LocalWatchdog> {
    static LOCAL: std::sync::OnceLock<Option<LocalWatchdog>> = std::sync::OnceLock::new();
    LOCAL
        .get_or_init(|| {
            install_nudge_handler().ok()?;
            std::thread::Builder::new()
                .name("local-watchdog".into())
                .spawn(|| watch_local(WATCHDOG_DEFAULT_MS))
                .ok()?;
            Some(LocalWatchdog {
                running: std::sync::Mutex::new(Vec::new()),
            })
        })
        .as_ref()
}

fn watch_local(interval_ms: u64) {
    loop {
        std::thread::sleep(Duration::from_millis(interval_ms));
        let Some(watchdog) = local_watchdog() else {
            return;
        };
        let now = super::monotonic_ms();
        let running = watchdog.running.lock().unwrap_or_else(|e| e.into_inner());
        for (id, beat) in running.iter() {
            // SAFETY: the thread is in `running`, so it is inside `run_local` (it takes itself
            // out under this lock before it leaves): alive.
            unsafe { nudge_if_overdue(*id, beat, now) };
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
