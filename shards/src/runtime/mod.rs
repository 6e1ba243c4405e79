//! The runtime layer: the only module that names glommio. Everything else — the store, the
//! mesh, the broker — reaches executors, timers, tasks, sockets and files through it, so a
//! runtime swap stays a change to this module.
//!
//! Every shard is one glommio `LocalExecutor` pinned to one core; shard state is `Rc`/`RefCell`
//! and never crosses threads. `run_shards` starts them, hands each its end of the control-plane
//! mesh, runs the caller's shard body, and stops the whole process when any shard panics (a
//! node must never keep serving with half its shards gone).
//!
//! | submodule | what |
//! |---|---|
//! | [`fan_out`] | blocking file work of a store's open spread over threads |
//! | [`fs`] | O_DIRECT files and the buffered-file steps the store takes |
//! | [`sockets`] | client sockets made ready by one epoll set per shard, not a poll each |
//! | [`wake`] | the one cross-thread wake-up primitive (a socket-pair byte): no polling loops |
//! | [`workarounds`] | every runtime trap's workaround, its knob and its counter |

use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use glommio::{CpuSet, LocalExecutorBuilder, Placement, PoolPlacement};

use crate::mesh::Mesh;
use crate::ShardId;

pub mod fan_out;
pub mod fs;
pub mod read_ahead;
pub mod sockets;
pub mod wake;
pub mod workarounds;

pub use glommio::net::TcpStream;
pub use glommio::Task;

/// Default memory glommio registers with io_uring per shard for its DMA buffers; locked
/// memory, so RLIMIT_MEMLOCK is checked against it at start. It holds the store's read-cache
/// windows (16 of 1 MiB, `store::read_cache`) with room for the odd record read beside them:
/// glommio's own 10 MiB held a few, and every other window was fresh heap memory to fault in
/// and clear (docs/performance.md).
pub const IO_MEMORY_DEFAULT_BYTES_PER_SHARD: usize = 24 << 20;
/// Default io_uring ring depth per shard (each of glommio's three rings): enough for
/// hundreds of requests in flight.
pub const RING_DEPTH_DEFAULT_ENTRIES: usize = 512;
pub use crate::limits::RING_DEPTH_MAX_ENTRIES;
/// Default preemption timer: how long the executor runs tasks before it polls I/O again
/// (each poll re-arms its rings' timers; 100 us spent a shard on polls at 500 connections).
pub const PREEMPT_TIMER_DEFAULT_US: u64 = 1000;
pub use crate::limits::MESH_CHANNEL_CAPACITY_MESSAGES;

/// Where and how a node's shards run: their cores and their executors' knobs (a tuning
/// profile sets all of them; `first_cpus` gives the defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlacement {
    /// One entry per shard: the CPU it is pinned to, or None to float.
    pub cpus: Vec<Option<usize>>,
    /// CPUs floating shards may run on (their thread's affinity); empty: any online CPU.
    pub float_cpus: Vec<usize>,
    /// CPUs for each shard's helper thread (glommio's blocking pool: file opens, renames);
    /// empty: glommio's default (unbound). Profiles give it the reserved cores, so that
    /// helper work stays off the shard cores.
    pub helper_cpus: Vec<usize>,
    /// io_uring ring depth of each of a shard's rings, in entries (1..=RING_DEPTH_MAX_ENTRIES).
    pub ring_depth_entries: usize,
    /// Locked memory glommio registers per shard for DMA buffers, in bytes.
    pub io_memory_bytes: usize,
    /// glommio preemption timer: how long a task runs before I/O is polled again.
    pub preempt_timer_us: u64,
    /// Busy-spin before parking an idle executor (0 = park at once).
    pub spin_before_park_us: u64,
    /// How often the watchdog looks for a stalled shard (`workarounds`); 0 turns it off.
    pub watchdog_ms: u64,
}

impl ShardPlacement {
    /// `count` shards on the first `count` online CPUs (floating when there are fewer CPUs),
    /// with the default executor knobs.
    pub fn first_cpus(count: usize) -> ShardPlacement {
        let online = online_cpus();
        let cpus = (0..count)
            .map(|i| {
                if count <= online.len() {
                    Some(online[i])
                } else {
                    None
                }
            })
            .collect();
        ShardPlacement {
            cpus,
            float_cpus: Vec::new(),
            helper_cpus: Vec::new(),
            ring_depth_entries: RING_DEPTH_DEFAULT_ENTRIES,
            io_memory_bytes: IO_MEMORY_DEFAULT_BYTES_PER_SHARD,
            preempt_timer_us: PREEMPT_TIMER_DEFAULT_US,
            spin_before_park_us: 0,
            watchdog_ms: workarounds::WATCHDOG_DEFAULT_MS,
        }
    }

    /// glommio's placement for shard `shard_id`: its fixed CPU, fenced to `float_cpus`, or
    /// unbound.
    fn executor_placement(&self, shard_id: ShardId) -> io::Result<Placement> {
        if let Some(cpu) = self.cpus[shard_id.0] {
            return Ok(Placement::Fixed(cpu));
        }
        if self.float_cpus.is_empty() {
            return Ok(Placement::Unbound);
        }
        Ok(Placement::Fenced(cpu_set(
            &self.float_cpus,
            "shards may float on",
        )?))
    }

    /// CPUs where the kernel's io_uring workers of every shard run (`bind_io_workers`), and
    /// so the commitlog writes they start (`store::commit_ring`): the helper CPUs when the
    /// profile names them, else the online CPUs that no shard runs on (pinned there, or
    /// floating over `float_cpus`); none (the workers run where the shard's thread may, and
    /// writes are issued on its core) when every online CPU runs a shard, or shards float
    /// over every CPU.
    pub fn io_worker_cpus(&self) -> Vec<usize> {
        if !self.helper_cpus.is_empty() {
            return self.helper_cpus.clone();
        }
        let pinned: Option<Vec<usize>> = self.cpus.iter().copied().collect();
        let shard_cpus = match pinned {
            Some(pinned) => pinned,
            None if !self.float_cpus.is_empty() => self.float_cpus.clone(),
            None => return Vec::new(),
        };
        online_cpus()
            .into_iter()
            .filter(|cpu| !shard_cpus.contains(cpu))
            .collect()
    }

    /// Where a shard's helper thread runs, when `helper_cpus` says.
    fn helper_placement(&self) -> io::Result<Option<PoolPlacement>> {
        if self.helper_cpus.is_empty() {
            return Ok(None);
        }
        let set = cpu_set(&self.helper_cpus, "helper threads may run on")?;
        Ok(Some(PoolPlacement::Fenced(HELPER_THREADS_PER_SHARD, set)))
    }
}

/// glommio's blocking-pool threads per shard (its default).
const HELPER_THREADS_PER_SHARD: usize = 1;

/// The online CPUs among `cpus`, as glommio's set; an error when none is online.
fn cpu_set(cpus: &[usize], what: &str) -> io::Result<CpuSet> {
    let set = CpuSet::online()
        .map_err(|e| io::Error::other(format!("cannot read the CPU topology: {e}")))?
        .filter(|location| cpus.contains(&location.cpu));
    if set.is_empty() {
        return Err(io::Error::other(format!(
            "none of the CPUs {cpus:?} that {what} is online"
        )));
    }
    Ok(set)
}

/// The online CPU ids, in order.
pub fn online_cpus() -> Vec<usize> {
    match core_affinity::get_core_ids() {
        Some(ids) if !ids.is_empty() => ids.into_iter().map(|c| c.id).collect(),
        _ => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// What a shard body gets: its id, the shard count and its end of the control mesh.
pub struct ShardContext<M: Send + 'static> {
    pub shard_id: ShardId,
    pub shard_count: usize,
    pub mesh: Mesh<M>,
}

/// Start-up checks that turn an obscure io_uring failure into an actionable message.
/// `io_memory_bytes` is the locked memory each shard registers (`ShardPlacement`).
pub fn check_environment(shard_count: usize, io_memory_bytes: usize) -> Result<(), String> {
    if let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        match text.trim() {
            "2" => {
                return Err(
                    "io_uring is disabled on this host (sysctl kernel.io_uring_disabled=2); \
                     run `sysctl -w kernel.io_uring_disabled=0` (or 1 and add this user to \
                     kernel.io_uring_group)"
                        .to_string(),
                )
            }
            "1" if !is_root() => {
                return Err("io_uring is restricted to root and kernel.io_uring_group \
                     (sysctl kernel.io_uring_disabled=1); run as a member of that group or set \
                     it to 0"
                    .to_string())
            }
            _ => {}
        }
    }
    let needed_bytes = io_memory_bytes.saturating_mul(shard_count) as u64;
    let limit_bytes = memlock_limit_bytes();
    if !is_root() && limit_bytes < needed_bytes {
        return Err(format!(
            "the locked-memory limit (RLIMIT_MEMLOCK) is {} KiB but {} shards need {} KiB for \
             io_uring buffers; raise it with `ulimit -l unlimited` (or LimitMEMLOCK=infinity in \
             a systemd unit, or --memlock in docker run)",
            limit_bytes / 1024,
            shard_count,
            needed_bytes / 1024
        ));
    }
    Ok(())
}

/// Whether this process runs as root (root ignores RLIMIT_MEMLOCK).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The soft RLIMIT_MEMLOCK of this process, in bytes (u64::MAX: unlimited or unknown).
pub fn memlock_limit_bytes() -> u64 {
    resource_limit(libc::RLIMIT_MEMLOCK).map_or(u64::MAX, |limit| limit.rlim_cur)
}

/// This process's soft and hard limits of `resource` (getrlimit(2)).
fn resource_limit(resource: libc::__rlimit_resource_t) -> io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and has no other effect.
    if unsafe { libc::getrlimit(resource, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(limit)
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (as RocketMQ's os.sh sets
/// `ulimit -n`): every connection and store file is a descriptor, and the usual soft limit of
/// 1,024 is exhausted by ~1,000 idle connections. Returns (before, after).
pub fn raise_descriptor_limit() -> io::Result<(u64, u64)> {
    let mut limit = resource_limit(libc::RLIMIT_NOFILE)?;
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass and changes nothing else of ours.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
    }
    Ok((before, limit.rlim_cur))
}

/// Grows this process's descriptor table to hold `count` descriptors now, before the shards
/// run. The kernel grows the table as descriptors are opened, doubling it, and in a process of
/// many threads each growth waits for an RCU grace period inside the open or accept that
/// crossed the size: 8–19 ms on a 2-core VM, on the shard thread that accepted the 256th,
/// 512th, 1,024th … connection, with every request on that shard waiting behind it. The table
/// never shrinks, so one growth here (a copy at descriptor `count - 1`, closed again) spares
/// them all: 8 bytes of kernel memory per descriptor. `count` is capped at the soft
/// RLIMIT_NOFILE. Returns the count reserved.
pub fn reserve_descriptor_table(count: u64) -> io::Result<u64> {
    let limit = resource_limit(libc::RLIMIT_NOFILE)?.rlim_cur;
    let count = count.min(limit).min(libc::c_int::MAX as u64);
    if count == 0 {
        return Ok(0);
    }
    let probe = std::fs::File::open("/dev/null")?;
    // SAFETY: F_DUPFD_CLOEXEC takes the lowest free number at or above `count - 1`, so no
    // open descriptor is replaced; the copy is ours and is closed at once.
    unsafe {
        let copy = libc::fcntl(
            probe.as_raw_fd(),
            libc::F_DUPFD_CLOEXEC,
            (count - 1) as libc::c_int,
        );
        if copy == -1 {
            return Err(io::Error::last_os_error());
        }
        libc::close(copy);
    }
    Ok(count)
}

/// Runs one executor per placement entry, each running `body(context)`, and waits for all.
/// A panic on any shard aborts the process (see the module docs).
pub fn run_shards<M, F, Fut>(placement: &ShardPlacement, body: F) -> io::Result<()>
where
    M: Send + 'static,
    F: Fn(ShardContext<M>) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    install_abort_on_panic();
    let shard_count = placement.cpus.len();
    let meshes = crate::mesh::build::<M>(shard_count, MESH_CHANNEL_CAPACITY_MESSAGES)?;
    let watchdog = workarounds::Watchdog::start(shard_count, placement.watchdog_ms)?;
    let mut handles = Vec::with_capacity(shard_count);
    for (shard_index, mesh) in (0..shard_count).zip(meshes) {
        let shard_id = ShardId(shard_index);
        assert!((1..=RING_DEPTH_MAX_ENTRIES).contains(&placement.ring_depth_entries));
        let mut builder = LocalExecutorBuilder::new(placement.executor_placement(shard_id)?)
            .name(&format!("shard-{shard_id}"))
            .io_memory(placement.io_memory_bytes)
            .ring_depth(placement.ring_depth_entries)
            .preempt_timer(Duration::from_micros(placement.preempt_timer_us))
            .spin_before_park(Duration::from_micros(placement.spin_before_park_us));
        if let Some(helpers) = placement.helper_placement()? {
            builder = builder.blocking_thread_pool_placement(helpers);
        }
        let body = body.clone();
        let watchdog = watchdog.clone();
        let io_worker_cpus = placement.io_worker_cpus();
        // Our own thread, registered with the watchdog before glommio runs anything on it:
        // glommio's own `spawn` once parked a fresh executor before it polled its first task.
        let handle = std::thread::Builder::new()
            .name(format!("shard-{shard_id}"))
            .spawn(move || {
                watchdog.register_current_thread(shard_id);
                if bind_io_workers(&io_worker_cpus) {
                    IO_WORKER_CPUS.with(|cpus| *cpus.borrow_mut() = io_worker_cpus);
                }
                let executor = builder
                    .make()
                    .map_err(|e| io::Error::other(format!("cannot start shard {shard_id}: {e}")))?;
                IN_EXECUTOR.with(|in_executor| in_executor.set(true));
                executor.run(async move {
                    spawn_detached(watchdog.heartbeat(shard_id));
                    body(ShardContext {
                        shard_id,
                        shard_count,
                        mesh: mesh.bind(),
                    })
                    .await;
                });
                Ok::<(), io::Error>(())
            })?;
        handles.push(handle);
    }
    for handle in handles {
        match handle.join() {
            Ok(result) => result?,
            Err(_) => return Err(io::Error::other("a shard thread panicked")),
        }
    }
    Ok(())
}

fn install_abort_on_panic() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        log::error!("a shard panicked; stopping the whole process");
        std::process::exit(101);
    }));
}

/// Runs `make()` to completion on a fresh executor on this thread (tests and tools that drive
/// a store without a node).
pub fn run_local<F, Fut>(make: F) -> Fut::Output
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    let executor = LocalExecutorBuilder::default()
        .make()
        .expect("a glommio executor on this thread");
    let was = IN_EXECUTOR.with(|in_executor| in_executor.replace(true));
    // Dropped after the executor returns or unwinds: the thread is no longer signalled.
    let watch = workarounds::LocalWatch::start();
    let heartbeat = watch.as_ref().map(workarounds::LocalWatch::heartbeat);
    let output = executor.run(async move {
        if let Some(heartbeat) = heartbeat {
            spawn_detached(heartbeat);
        }
        make().await
    });
    drop(watch);
    IN_EXECUTOR.with(|in_executor| in_executor.set(was));
    output
}

/// Spawns a task on the current shard and lets it run to completion on its own.
pub fn spawn_detached<T: 'static>(future: impl Future<Output = T> + 'static) {
    glommio::spawn_local(future).detach();
}

/// Spawns a task on the current shard; dropping the returned handle cancels it.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    glommio::spawn_local(future)
}

thread_local! {
    /// `ShardPlacement::io_worker_cpus` of the shard running on this thread.
    static IO_WORKER_CPUS: std::cell::RefCell<Vec<usize>> =
        const { std::cell::RefCell::new(Vec::new()) };
    /// This shard's poll hooks (see `run_poll_hooks`).
    static POLL_HOOKS: std::cell::RefCell<Vec<std::rc::Weak<dyn Fn()>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Binds the io_uring workers of this thread to `cpus`, before any of its rings exists; false
/// when `cpus` is empty or the kernel refused (the workers then run where the thread may).
/// The kernel hands a worker what it cannot issue without blocking: an fdatasync, a write to
/// tmpfs, many O_DIRECT writes with RWF_DSYNC, a file's open. A worker starts on the CPUs
/// its thread may run on, and `IORING_REGISTER_IOWQ_AFF` binds only the workers started
/// after it: one started on a shard's core before its commit ring registered (at the store's
/// open) stayed there for good, and took that core from the shard in turns (a fifth of it
/// under SYNC_FLUSH on tmpfs here). The binding belongs to the thread: every ring it makes
/// shares it.
pub fn bind_io_workers(cpus: &[usize]) -> bool {
    if cpus.is_empty() {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET only writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let bound = io_uring::IoUring::new(2).and_then(|ring| ring.submitter().register_iowq_aff(&set));
    match bound {
        Ok(()) => true,
        Err(error) => {
            log::warn!(
                "the io_uring workers of {} stay on its own CPUs: cannot bind them to {cpus:?} \
                 ({error})",
                std::thread::current().name().unwrap_or("this thread")
            );
            false
        }
    }
}

/// CPUs where this shard's io_uring workers are bound (`bind_io_workers`), to issue its
/// commitlog writes (empty: on this thread, inline; also outside `run_shards`, as in store
/// tests).
pub fn io_worker_cpus() -> Vec<usize> {
    IO_WORKER_CPUS.with(|cpus| cpus.borrow().clone())
}

/// Posts the completions of one of our own io_uring rings (set up COOP_TASKRUN +
/// TASKRUN_FLAG) that wait for this thread to run their task work: one io_uring_enter that
/// neither submits nor waits, made only when the kernel flags such work. Ok(true) when it
/// entered; EINTR counts as entered (the work runs at the next entry).
pub(crate) fn post_ring_task_work(ring: &mut io_uring::IoUring) -> io::Result<bool> {
    /// io_uring_enter flag: collect completions (the kernel's uapi value).
    const IORING_ENTER_GETEVENTS: u32 = 1;
    if !ring.submission().taskrun() {
        return Ok(false);
    }
    // SAFETY: no submissions, no argument.
    let entered = unsafe {
        ring.submitter()
            .enter::<libc::sigset_t>(0, 0, IORING_ENTER_GETEVENTS, None)
    };
    match entered {
        Err(error) if error.raw_os_error() != Some(libc::EINTR) => Err(error),
        _ => Ok(true),
    }
}

/// Registers `hook` to be called by `run_poll_hooks` on this shard until its last strong
/// reference goes (the owner keeps the `Rc`).
pub fn register_poll_hook(hook: &std::rc::Rc<dyn Fn()>) {
    POLL_HOOKS.with(|hooks| hooks.borrow_mut().push(std::rc::Rc::downgrade(hook)));
}

/// Runs this shard's poll hooks: completion checks of I/O that glommio does not drive (the
/// commitlog ring), cheap when there is nothing to collect. Busy loops call it between steps
/// so that such completions are seen without waiting for the executor's next I/O poll.
pub fn run_poll_hooks() {
    let mut index = 0;
    while let Some(hook) = POLL_HOOKS.with(|hooks| hooks.borrow().get(index).cloned()) {
        match hook.upgrade() {
            Some(hook) => {
                hook();
                index += 1;
            }
            None => POLL_HOOKS.with(|hooks| {
                hooks.borrow_mut().swap_remove(index);
            }),
        }
    }
}

/// Runs blocking work (file writes with fsync, renames) on this shard's helper thread (the
/// profile's reserved cores, `ShardPlacement::helper_cpus`) and resolves with its result,
/// so the shard keeps serving meanwhile.
pub fn blocking<F, R>(work: F) -> impl Future<Output = R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    glommio::executor().spawn_blocking(work)
}

thread_local! {
    /// Whether this thread runs a shard's executor (`run_shards`, `run_local`).
    static IN_EXECUTOR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Hands `work` to this shard's helper thread and goes on without waiting for it: work whose
/// result nobody needs (faulting pages in ahead of the shard). False, with nothing run, on a
/// thread that runs no shard executor (tests that drive a store directly).
pub fn on_helper_detached(work: impl FnOnce() + Send + 'static) -> bool {
    if !IN_EXECUTOR.with(std::cell::Cell::get) {
        return false;
    }
    spawn_detached(blocking(work));
    true
}

/// Runs long blocking work (many reads at random, fanning out) on a thread of its own, named
/// `name`, and resolves with its result; an error when no thread could start or the work
/// panicked. Unlike `blocking`, it holds up none of the shard's other blocking work (the
/// persisted configuration files, new segment files), which waits for the one helper thread.
pub async fn on_thread_of_its_own<F, R>(name: &str, work: F) -> io::Result<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let (waker, mut receiver) = wake::pair()?;
    let slot = std::sync::Arc::new(std::sync::Mutex::new(None));
    let out = slot.clone();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let result = work();
            *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            waker.wake();
        })?;
    loop {
        let woken = receiver.wait().await;
        if let Some(result) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Ok(result);
        }
        if woken.is_err() {
            return Err(io::Error::other(format!(
                "the {name} thread ended without a result"
            )));
        }
    }
}

/// Asks the allocator to give its free pages back to the system (glibc keeps freed blocks in
/// its arenas for good), on this shard's helper thread: a trim walks every arena.
pub async fn release_free_memory() {
    blocking(trim_free_memory).await;
}

/// `release_free_memory` on the calling thread (one that may block).
pub fn trim_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator; no pointer is given.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Gives the executor back once, so other tasks of this shard run before this one goes on.
pub async fn yield_now() {
    futures_lite::future::yield_now().await
}

thread_local! {
    /// File reads and writes this shard's executor submitted to its io_uring rings so far
    /// (glommio hands out what happened since its last report; this keeps the sum).
    static FILE_OPS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// (reads, writes) of files this shard's executor submitted to io_uring since it started
/// (DMA and buffered; network operations are not counted by glommio). Call on a shard.
pub fn executor_file_ops() -> (u64, u64) {
    let rings = glommio::executor().io_stats().all_rings();
    let reads = rings.file_reads().0 + rings.file_buffered_reads().0;
    let writes = rings.file_writes().0 + rings.file_buffered_writes().0;
    FILE_OPS.with(|total| {
        let (r, w) = total.get();
        total.set((r + reads, w + writes));
        total.get()
    })
}

/// Sleeps on the current shard's timer.
pub async fn sleep(duration: Duration) {
    glommio::timer::sleep(duration).await
}

/// Milliseconds on this process's monotonic clock (since its first call): the clock of the
/// shards' timer wheels, which never goes backwards when the wall clock is set.
pub fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Runs `future` with a deadline; `None` when it ran out.
pub async fn timeout<T>(duration: Duration, future: impl Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(future.await) }, async {
        sleep(duration).await;
        None
    })
    .await
}

/// Connects over TCP from the current shard.
pub async fn connect(addr: std::net::SocketAddr) -> io::Result<TcpStream> {
    TcpStream::connect(addr).await.map_err(io::Error::from)
}

/// A listening socket of the current shard (`bind`, `bind_shared`); its connections come
/// through `acceptor`, from the shard's epoll set (`sockets::Listening`), as client sockets'
/// input does. They used to come from glommio's accept, an io_uring request on its latency
/// ring: in full-suite runs a broker port's connections were now and then left unserved for
/// seconds while the shard was awake, the last time with the listener's queue empty, which
/// fits an accept completed in the kernel whose completion the shard never collected.
pub struct TcpListener {
    /// Non-blocking.
    socket: std::net::TcpListener,
}

impl TcpListener {
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.socket.local_addr()
    }

    /// Takes this listener's connections, on the shard that calls it.
    pub fn acceptor(&self) -> Acceptor<'_> {
        Acceptor {
            listener: self,
            listening: None,
        }
    }
}

/// One listener's connections, taken on the shard that serves it: the listener joins that
/// shard's epoll set at the first accept, and leaves it when the acceptor goes.
pub struct Acceptor<'a> {
    listener: &'a TcpListener,
    listening: Option<sockets::Listening>,
}

impl Acceptor<'_> {
    /// The next connection (blocking mode: `sockets::Socket::adopt` or `stream_of` take it
    /// over); an error (descriptors short) leaves it queued for the next call.
    pub async fn accept(&mut self) -> io::Result<std::net::TcpStream> {
        use std::os::fd::AsRawFd;
        let listening = match &mut self.listening {
            Some(listening) => listening,
            empty => empty.insert(sockets::Listening::register(
                self.listener.socket.as_raw_fd(),
            )?),
        };
        Ok(std::net::TcpStream::from(listening.accept().await?))
    }
}

/// A connection accepted through an `Acceptor`, as a stream read and written through glommio.
pub fn stream_of(stream: std::net::TcpStream) -> TcpStream {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the stream takes over a connected socket's descriptor, owned here alone.
    unsafe { TcpStream::from_raw_fd(stream.into_raw_fd()) }
}

/// Binds a listener only this shard serves: a second bind of the port, by this process or
/// another, fails with "address in use" (no SO_REUSEPORT, which would let another process
/// join the port silently and take part of its connections). SO_REUSEADDR, so that the
/// connections it accepted, left in TIME_WAIT after a stop, do not keep a restarted node off
/// its own ports.
pub fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    bind_with(addr, false)
}

/// Binds a listener that every shard of this process binds (the namesrv port): with
/// SO_REUSEPORT, the kernel spreads its connections over the shards. The node checks with a
/// plain bind first that no other process holds the port.
pub fn bind_shared(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    bind_with(addr, true)
}

fn bind_with(addr: std::net::SocketAddr, shared: bool) -> io::Result<TcpListener> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let std::net::SocketAddr::V4(addr) = addr else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "only IPv4 listen addresses",
        ));
    };
    // SAFETY: plain socket calls on a descriptor we own; every return value is checked and
    // the descriptor is closed by OwnedFd on any error.
    unsafe {
        let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
        let fd = libc::socket(libc::AF_INET, kind, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let owned = OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        let options: &[libc::c_int] = if shared {
            &[libc::SO_REUSEADDR, libc::SO_REUSEPORT]
        } else {
            &[libc::SO_REUSEADDR]
        };
        for &option in options {
            let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let value = &one as *const libc::c_int as *const libc::c_void;
            if libc::setsockopt(fd, libc::SOL_SOCKET, option, value, size) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let mut sockaddr: libc::sockaddr_in = std::mem::zeroed();
        sockaddr.sin_family = libc::AF_INET as libc::sa_family_t;
        sockaddr.sin_port = addr.port().to_be();
        sockaddr.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
        let sockaddr_ptr = &sockaddr as *const libc::sockaddr_in as *const libc::sockaddr;
        let sockaddr_size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, sockaddr_ptr, sockaddr_size) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::listen(fd, LISTEN_BACKLOG_CONNECTIONS) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(TcpListener {
            socket: std::net::TcpListener::from(owned),
        })
    }
}

/// Pending connections the kernel queues per listener.
pub const LISTEN_BACKLOG_CONNECTIONS: libc::c_int = 1024;

#[cfg(test)]
mod tests {
    use super::ShardPlacement;

    /// The size of this process's descriptor table (`FDSize` in /proc/self/status).
    fn descriptor_table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line["FDSize:".len()..].trim().parse().unwrap()
    }

    #[test]
    fn the_descriptor_table_is_grown_ahead() {
        let before = descriptor_table_size();
        let limit = super::resource_limit(libc::RLIMIT_NOFILE).unwrap().rlim_cur;
        let wanted = (before * 4).min(limit);
        if wanted <= before {
            println!("could not run: the open-file limit {limit} leaves no room to grow {before}");
            return;
        }
        assert_eq!(super::reserve_descriptor_table(wanted).unwrap(), wanted);
        assert!(descriptor_table_size() >= wanted);
        // The copy went to the highest number and was closed again. (Counting /proc/self/fd
        // would race with the other tests of this process.)
        // SAFETY: F_GETFD only asks whether the number is an open descriptor.
        let flags = unsafe { libc::fcntl((wanted - 1) as libc::c_int, libc::F_GETFD) };
        assert_eq!(flags, -1, "descriptor {} is left open", wanted - 1);
        // Asking past the limit reserves up to it.
        assert_eq!(
            super::reserve_descriptor_table(u64::MAX).unwrap(),
            limit.min(i32::MAX as u64)
        );
    }

    #[test]
    fn io_workers_run_where_no_shard_runs() {
        let online = super::online_cpus();
        let first = online[0];
        let others: Vec<usize> = online[1..].to_vec();
        let mut placement = ShardPlacement::first_cpus(1);
        placement.cpus = vec![Some(first)];
        assert_eq!(placement.io_worker_cpus(), others, "pinned to {first}");
        placement.cpus = vec![None];
        placement.float_cpus = vec![first];
        assert_eq!(placement.io_worker_cpus(), others, "floating over {first}");
        placement.float_cpus = online.clone();
        assert!(
            placement.io_worker_cpus().is_empty(),
            "floating over every CPU"
        );
        placement.float_cpus = Vec::new();
        assert!(placement.io_worker_cpus().is_empty(), "floating anywhere");
        placement.helper_cpus = vec![first];
        assert_eq!(placement.io_worker_cpus(), vec![first], "helper CPUs named");
    }

    #[test]
    fn work_on_a_thread_of_its_own_comes_back_and_a_panic_is_an_error() {
        super::run_local(|| async {
            let shard = std::thread::current().id();
            let (value, thread) =
                super::on_thread_of_its_own("test-work", move || (42, std::thread::current().id()))
                    .await
                    .unwrap();
            assert_eq!(value, 42);
            assert_ne!(thread, shard);
            let failed = super::on_thread_of_its_own("test-panic", || -> u32 {
                panic!("on purpose");
            })
            .await;
            assert!(failed.is_err());
        });
    }
}
