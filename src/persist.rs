//! Config and offset files: written whole to a temp file, fsynced, the previous version kept
//! as `<file>.bak`, then renamed into place and the directory fsynced (RocketMQ's layout).
//! Reading falls back to `.bak` when the file is missing or does not parse.
//!
//! A table that lives on a shard (topics, groups, offsets) is written by a writer task of its
//! own (`run_writer`): a change only counts a version (`Persisted::note_change`); the writer
//! encodes the table as it is then, on the shard, and writes it on the shard's helper thread
//! (the fsync and rename never block the shard), so many changes in a row cost one write.
//! A change whose caller must know it is on disk (an admin request answered SUCCESS) waits
//! for `Persisted::durable`. A failed write (a full disk) is logged, answered as a failure to
//! those waiting, and tried again every `PERSIST_RETRY_MS` until it succeeds.

use std::cell::{Cell, RefCell};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use shards::sync::{Signal, WaiterSet};
use shards::throttle::LogThrottle;

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Attempts of a durable write interrupted by a signal (shard threads get SIGUSR1 nudges
/// without SA_RESTART, and not every std call retries EINTR itself).
const INTERRUPTED_ATTEMPTS_MAX: u32 = 10;

/// Replaces `path` with `bytes` durably, keeping the previous version as `path.bak`.
pub fn write_file_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut attempt = 1;
    loop {
        match write_file_durably_once(path, bytes) {
            Err(error)
                if error.kind() == io::ErrorKind::Interrupted
                    && attempt < INTERRUPTED_ATTEMPTS_MAX =>
            {
                attempt += 1;
            }
            result => return result,
        }
    }
}

fn write_file_durably_once(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let temp = with_suffix(path, ".tmp");
    let written = File::create(&temp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_data()
    });
    if let Err(error) = written {
        // No half-written temp file stays behind (a full disk leaves an empty one).
        let _ = fs::remove_file(&temp);
        return Err(error);
    }
    if path.exists() {
        fs::copy(path, with_suffix(path, ".bak"))?;
    }
    fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// [`write_json_file`] on the shard's helper thread (the fsync and rename never block the
/// shard); a failure is logged as [`write_or_log`] logs it. True when written.
pub async fn write_json_off_shard(path: PathBuf, value: serde_json::Value) -> bool {
    let shown = path.clone();
    let written = shards::runtime::blocking(move || write_json_file(&path, &value)).await;
    logged(&shown, written)
}

/// Writes a JSON value pretty-printed (as RocketMQ's config files are).
pub fn write_json_file(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_file_durably(path, &bytes)
}

/// [`write_file_durably`] for a table that stays in memory and is written again on its next
/// change: a failure is logged (`shardmq: cannot persist <path>: <error>`), not returned.
/// True when written.
pub fn write_or_log(path: &Path, bytes: &[u8]) -> bool {
    logged(path, write_file_durably(path, bytes))
}

/// [`write_json_file`], a failure logged as [`write_or_log`] logs it.
pub fn write_json_or_log(path: &Path, value: &serde_json::Value) -> bool {
    logged(path, write_json_file(path, value))
}

fn logged(path: &Path, result: io::Result<()>) -> bool {
    match result {
        Ok(()) => true,
        Err(error) => {
            log::warn!("cannot persist {}: {error}", path.display());
            false
        }
    }
}

/// Reads `path`, or `path.bak` when `path` is missing or `parse` rejects it.
pub fn read_with_fallback<T>(path: &Path, parse: impl Fn(&[u8]) -> Option<T>) -> Option<T> {
    for candidate in [path.to_path_buf(), with_suffix(path, ".bak")] {
        if let Ok(bytes) = fs::read(&candidate) {
            if let Some(value) = parse(&bytes) {
                return Some(value);
            }
            log::warn!("{} does not parse; trying its backup", candidate.display());
        }
    }
    None
}

/// Wait before a failed background write of a table is tried again.
pub const PERSIST_RETRY_MS: u64 = 1_000;

/// The on-disk state of one shard-local table file (see the module doc).
pub struct Persisted {
    path: PathBuf,
    /// Version of the latest change.
    changed: Cell<u64>,
    /// Latest version known to be on disk.
    durable: Cell<u64>,
    /// The last write attempt: the version it covered and, if it failed, why.
    attempt: RefCell<(u64, Option<String>)>,
    wake_writer: Signal,
    waiters: Rc<WaiterSet<()>>,
    failure_log: RefCell<LogThrottle>,
}

impl Persisted {
    /// A file whose current content (just loaded) is version 0.
    pub fn new(path: PathBuf) -> Rc<Persisted> {
        Rc::new(Persisted {
            path,
            changed: Cell::new(0),
            durable: Cell::new(0),
            attempt: RefCell::new((0, None)),
            wake_writer: Signal::default(),
            waiters: Rc::default(),
            failure_log: RefCell::new(LogThrottle::default()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counts a change of the table and wakes its writer; returns the version to wait for.
    pub fn note_change(&self) -> u64 {
        self.changed.set(self.changed.get() + 1);
        self.wake_writer.notify();
        self.changed.get()
    }

    /// The latest version (what a shutdown waits for).
    pub fn latest(&self) -> u64 {
        self.changed.get()
    }

    /// The latest version known to be on disk.
    pub fn durable_version(&self) -> u64 {
        self.durable.get()
    }

    /// Whether every change is on disk.
    pub fn is_clean(&self) -> bool {
        self.durable.get() >= self.changed.get()
    }

    /// Resolves once `version` is on disk, or with the reason when a write that covered it
    /// failed (the writer keeps trying; the change stays in memory meanwhile).
    pub async fn durable(self: &Rc<Self>, version: u64) -> Result<(), String> {
        let settled = || {
            self.durable.get() >= version || {
                let attempt = self.attempt.borrow();
                attempt.0 >= version && attempt.1.is_some()
            }
        };
        if !settled() {
            self.waiters.wait_until((), settled).await;
        }
        if self.durable.get() >= version {
            return Ok(());
        }
        Err(self.attempt.borrow().1.clone().unwrap_or_default())
    }
}

/// Writes `persisted`'s file whenever it changed: `encode` (on the shard) gives the table's
/// bytes as they are at that moment, the write runs on the shard's helper thread. Runs until
/// the shard stops; `Weak` owners make `encode` return None once the table is gone.
pub async fn run_writer(persisted: Rc<Persisted>, encode: impl Fn() -> Option<Vec<u8>>) {
    loop {
        while persisted.is_clean() {
            persisted.wake_writer.wait().await;
        }
        let version = persisted.changed.get();
        let Some(bytes) = encode() else { return };
        let path = persisted.path.clone();
        let written = shards::runtime::blocking(move || write_file_durably(&path, &bytes)).await;
        match written {
            Ok(()) => {
                persisted.durable.set(persisted.durable.get().max(version));
                *persisted.attempt.borrow_mut() = (version, None);
                persisted.waiters.wake_all();
            }
            Err(error) => {
                let why = format!("cannot write {}: {error}", persisted.path.display());
                let allowed = persisted.failure_log.borrow_mut().allow(Instant::now());
                if let Some(left_out) = allowed {
                    log::warn!(
                        "{why}; kept in memory, trying again every {PERSIST_RETRY_MS} \
                         ms{}",
                        LogThrottle::repeats(left_out)
                    );
                }
                *persisted.attempt.borrow_mut() = (version, Some(why));
                persisted.waiters.wake_all();
                shards::runtime::sleep(Duration::from_millis(PERSIST_RETRY_MS)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_backup_and_falls_back_to_it() {
        let dir = std::env::temp_dir().join(format!("shardmq-persist-{}", std::process::id()));
        let path = dir.join("config").join("x.json");
        write_file_durably(&path, b"1").unwrap();
        write_file_durably(&path, b"2").unwrap();
        assert_eq!(fs::read(with_suffix(&path, ".bak")).unwrap(), b"1");
        fs::write(&path, b"garbage").unwrap();
        let parse = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u32>().ok();
        assert_eq!(read_with_fallback(&path, parse), Some(1));
        fs::remove_dir_all(&dir).unwrap();
    }
}
