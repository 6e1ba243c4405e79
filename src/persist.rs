//! Config and offset files: written whole to a temp file, fsynced, the previous version kept
//! as `<file>.bak`, then renamed into place and the directory fsynced (RocketMQ's layout).
//! Reading falls back to `.bak` when the file is missing or does not parse.
//!
//! A table that lives on a shard (topics, groups, offsets) is written by a writer task of its
//! own (`run_writer`): a change only counts a version (`Persisted::note_change`); the writer
//! clones the table as it is then, on the shard, and encodes and writes it on the shard's
//! helper thread (the fsync and rename never block the shard), so many changes in a row cost
//! one write.
//! A change whose caller must know it is on disk (an admin request answered SUCCESS) waits
//! for `Persisted::durable`. A failed write (a full disk) is logged, answered as a failure to
//! those waiting, and tried again every `PERSIST_RETRY_MS` until it succeeds.
//!
//! A table that grows to thousands of entries (topics, groups) is journaled
//! (`Persisted::journaled`): a change appends one line to `<file>.journal` (fdatasync'd, so
//! an admin change costs one small write whatever the table's size), and the whole file is
//! written again only when the journal has grown past the file's size (each change pays for
//! a constant share of it) or once changes have been quiet for `JOURNAL_QUIET_MS` (so the
//! file RocketMQ's tools read is current soon after). Its lines carry the table's
//! `dataVersion` counter; loading applies the lines newer than the file's (`read_journal`),
//! so a crash between a rewrite and the journal's truncation replays nothing twice.

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

/// Quiet time after the last journaled change before the whole file is written again.
pub const JOURNAL_QUIET_MS: u64 = 1_000;

/// The journal may grow to the larger of this and the file's size before a rewrite.
pub const JOURNAL_MIN_BYTES: u64 = 64 * 1024;

/// One change of a journaled table, as read back from its journal.
#[derive(Debug, PartialEq)]
pub enum JournalEntry {
    Set(serde_json::Value),
    Remove(String),
}

/// A journal line: `{"dataVersion":N,"set":{..}}` or `{"dataVersion":N,"remove":"name"}`.
pub fn journal_line(counter: i64, entry: &JournalEntry) -> Vec<u8> {
    let value = match entry {
        JournalEntry::Set(value) => serde_json::json!({ "dataVersion": counter, "set": value }),
        JournalEntry::Remove(name) => {
            serde_json::json!({ "dataVersion": counter, "remove": name })
        }
    };
    let mut line = serde_json::to_vec(&value).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The journal beside `path`.
pub fn journal_path(path: &Path) -> PathBuf {
    with_suffix(path, ".journal")
}

/// The changes in `path`'s journal newer than `after` (a counter), oldest first, and the
/// journal's length. Reading stops at the first line that does not parse: a torn last
/// append (its change was never acknowledged).
pub fn read_journal(path: &Path, after: i64) -> (Vec<(i64, JournalEntry)>, u64) {
    let Ok(bytes) = fs::read(journal_path(path)) else {
        return (Vec::new(), 0);
    };
    let mut entries = Vec::new();
    for line in bytes.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
        let parsed = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|v| {
                let counter = v.get("dataVersion")?.as_i64()?;
                let entry = match (v.get("set"), v.get("remove")) {
                    (Some(set), None) => JournalEntry::Set(set.clone()),
                    (None, Some(name)) => JournalEntry::Remove(name.as_str()?.to_string()),
                    _ => return None,
                };
                Some((counter, entry))
            });
        match parsed {
            Some((counter, entry)) if counter > after => entries.push((counter, entry)),
            Some(_) => {}
            None => {
                log::warn!(
                    "{}: a line does not parse (a torn write); the lines after it are ignored",
                    journal_path(path).display()
                );
                break;
            }
        }
    }
    (entries, bytes.len() as u64)
}

/// The journal side of a journaled file (see the module doc).
#[derive(Default)]
struct Journal {
    /// Lines of changes not yet written.
    pending: RefCell<Vec<u8>>,
    /// Bytes in the journal file.
    on_disk: Cell<u64>,
    /// Size of the whole file as last written.
    file_bytes: Cell<u64>,
    /// A change came without a line (or an append failed): the next write is a rewrite.
    needs_rewrite: Cell<bool>,
}

impl Journal {
    fn rewrite_due(&self) -> bool {
        let appending = self.pending.borrow().len() as u64;
        self.needs_rewrite.get()
            || self.on_disk.get() + appending > self.file_bytes.get().max(JOURNAL_MIN_BYTES)
    }
}

fn append_durably(path: &Path, lines: &[u8]) -> io::Result<()> {
    let created = !path.exists();
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(lines)?;
    file.sync_data()?;
    if created {
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

fn truncate_durably(path: &Path) -> io::Result<()> {
    match fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => {
            file.set_len(0)?;
            file.sync_data()
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// The bytes of a whole table, made on the helper thread from what the shard cloned.
pub type Encoder = Box<dyn FnOnce() -> Vec<u8> + Send>;

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
    journal: Option<Journal>,
}

impl Persisted {
    /// A file whose current content (just loaded) is version 0.
    pub fn new(path: PathBuf) -> Rc<Persisted> {
        Rc::new(Persisted::with_journal(path, None))
    }

    /// A journaled file (see the module doc) whose content and journal (`journal_bytes`
    /// long) were just loaded as version 0.
    pub fn journaled(path: PathBuf, journal_bytes: u64) -> Rc<Persisted> {
        let journal = Journal::default();
        journal.on_disk.set(journal_bytes);
        journal
            .file_bytes
            .set(fs::metadata(&path).map(|m| m.len()).unwrap_or(0));
        Rc::new(Persisted::with_journal(path, Some(journal)))
    }

    fn with_journal(path: PathBuf, journal: Option<Journal>) -> Persisted {
        Persisted {
            path,
            changed: Cell::new(0),
            durable: Cell::new(0),
            attempt: RefCell::new((0, None)),
            wake_writer: Signal::default(),
            waiters: Rc::default(),
            failure_log: RefCell::new(LogThrottle::default()),
            journal,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counts a change of the table and wakes its writer; returns the version to wait for.
    /// A journaled file is then written whole.
    pub fn note_change(&self) -> u64 {
        if let Some(journal) = &self.journal {
            journal.needs_rewrite.set(true);
        }
        self.count_change()
    }

    /// Counts a change that `line` (a [`journal_line`]) describes; returns the version to
    /// wait for. On a file that is not journaled, the same as [`Persisted::note_change`].
    pub fn note_journaled_change(&self, line: &[u8]) -> u64 {
        match &self.journal {
            Some(journal) => {
                journal.pending.borrow_mut().extend_from_slice(line);
                self.count_change()
            }
            None => self.note_change(),
        }
    }

    fn count_change(&self) -> u64 {
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

/// Writes `persisted`'s file whenever it changed: `snapshot` (on the shard) clones the table
/// as it is at that moment and returns how to encode it; the encoding and the write run on
/// the shard's helper thread. A journaled file gets its new lines appended instead while the
/// journal is small (see the module doc). Runs until the shard stops; `Weak` owners make
/// `snapshot` return None once the table is gone.
pub async fn run_writer(persisted: Rc<Persisted>, snapshot: impl Fn() -> Option<Encoder>) {
    loop {
        if persisted.is_clean() && !wait_for_change(&persisted).await {
            // Quiet after journaled changes: time to write the whole file.
            if let Some(journal) = &persisted.journal {
                journal.needs_rewrite.set(true);
            }
        }
        let version = persisted.changed.get();
        let written = match &persisted.journal {
            Some(journal) if !journal.rewrite_due() => append_pending(&persisted, journal).await,
            journal => {
                let Some(encode) = snapshot() else { return };
                rewrite(&persisted, journal.as_ref(), encode).await
            }
        };
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

/// Appends the journal's pending lines durably.
async fn append_pending(persisted: &Persisted, journal: &Journal) -> io::Result<()> {
    let lines = std::mem::take(&mut *journal.pending.borrow_mut());
    let appended = lines.len() as u64;
    let path = journal_path(&persisted.path);
    let result = shards::runtime::blocking(move || append_durably(&path, &lines)).await;
    match result {
        Ok(()) => journal.on_disk.set(journal.on_disk.get() + appended),
        // Part of a line may be there: only a rewrite (which empties the journal) is safe.
        Err(_) => journal.needs_rewrite.set(true),
    }
    result
}

/// Writes the whole file (encoded on the helper thread), then empties its journal.
async fn rewrite(
    persisted: &Persisted,
    journal: Option<&Journal>,
    encode: Encoder,
) -> io::Result<()> {
    if let Some(journal) = journal {
        // The table as cloned covers every pending line.
        journal.pending.borrow_mut().clear();
        journal.needs_rewrite.set(false);
    }
    let path = persisted.path.clone();
    let journaled = journal.is_some();
    let result = shards::runtime::blocking(move || {
        let bytes = encode();
        write_file_durably(&path, &bytes)?;
        if journaled {
            truncate_durably(&journal_path(&path))?;
        }
        Ok::<u64, io::Error>(bytes.len() as u64)
    })
    .await;
    if let Some(journal) = journal {
        match &result {
            Ok(bytes) => {
                journal.file_bytes.set(*bytes);
                journal.on_disk.set(0);
            }
            Err(_) => journal.needs_rewrite.set(true),
        }
    }
    result.map(|_| ())
}

/// Waits until the table changes again: true when it did, false when a journaled file has
/// lines on disk and `JOURNAL_QUIET_MS` passed without a change (time to write it whole).
async fn wait_for_change(persisted: &Persisted) -> bool {
    while persisted.is_clean() {
        let journal_on_disk = persisted
            .journal
            .as_ref()
            .is_some_and(|journal| journal.on_disk.get() > 0);
        if !journal_on_disk {
            persisted.wake_writer.wait().await;
            continue;
        }
        let quiet = Duration::from_millis(JOURNAL_QUIET_MS);
        if shards::runtime::timeout(quiet, persisted.wake_writer.wait())
            .await
            .is_none()
        {
            return false;
        }
    }
    true
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

    #[test]
    fn journal_replays_newer_lines_and_stops_at_a_torn_one() {
        let dir = std::env::temp_dir().join(format!("shardmq-journal-{}", std::process::id()));
        let path = dir.join("t.json");
        fs::create_dir_all(&dir).unwrap();
        let set = |n: i64| journal_line(n, &JournalEntry::Set(serde_json::json!({ "n": n })));
        let mut bytes = [
            set(1),
            set(2),
            journal_line(3, &JournalEntry::Remove("x".into())),
        ]
        .concat();
        fs::write(journal_path(&path), &bytes).unwrap();
        let (entries, length) = read_journal(&path, 1);
        assert_eq!(length, bytes.len() as u64);
        assert_eq!(
            entries,
            vec![
                (2, JournalEntry::Set(serde_json::json!({ "n": 2 }))),
                (3, JournalEntry::Remove("x".into()))
            ],
            "lines at or below the file's counter are already in it"
        );
        bytes.extend_from_slice(&set(4)[..10]);
        fs::write(journal_path(&path), &bytes).unwrap();
        assert_eq!(
            read_journal(&path, 0).0.len(),
            3,
            "a torn last append is ignored"
        );
        assert_eq!(read_journal(&dir.join("none.json"), 0), (Vec::new(), 0));
        fs::remove_dir_all(&dir).unwrap();
    }
}
