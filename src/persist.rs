//! Config and offset files: written whole to a temp file, fsynced, the previous version kept
//! as `<file>.bak`, then renamed into place and the directory fsynced (RocketMQ's layout).
//! Reading falls back to `.bak` when the file is missing or does not parse.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

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
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    drop(file);
    if path.exists() {
        fs::copy(path, with_suffix(path, ".bak"))?;
    }
    fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Writes a JSON value pretty-printed (as RocketMQ's config files are).
pub fn write_json_file(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_file_durably(path, &bytes)
}

/// Reads `path`, or `path.bak` when `path` is missing or `parse` rejects it.
pub fn read_with_fallback<T>(path: &Path, parse: impl Fn(&[u8]) -> Option<T>) -> Option<T> {
    for candidate in [path.to_path_buf(), with_suffix(path, ".bak")] {
        if let Ok(bytes) = fs::read(&candidate) {
            if let Some(value) = parse(&bytes) {
                return Some(value);
            }
            eprintln!(
                "shardmq: {} does not parse; trying its backup",
                candidate.display()
            );
        }
    }
    None
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
