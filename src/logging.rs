//! The process's logger behind the `log` facade: every part of shardmq (the store, the
//! runtime, the broker, the namesrv) logs with `log::{error, warn, info, debug, trace}`, and
//! this writes one line per event:
//!
//! `2026-12-01T09:49:52.123Z INFO  shard-0 shardmq: <message>`
//!
//! time (UTC, ms), level, the thread (a shard's thread is `shard-<i>`, so every line says which
//! shard it is about), then the message. `--log-level` (error, warn, info, debug, trace;
//! default info) sets what is written; refusals of requests are logged at debug, so they can
//! be turned on without flooding a production log. Repeated failures are throttled where they
//! happen (`shards::throttle`).
//!
//! Where lines go: standard output (what a service manager's journal collects), or with
//! `--log-dir DIR` the file `DIR/shardmq.log`, rotated
//! when it passes `LOG_FILE_MAX_BYTES` (`shardmq.log.1` … `shardmq.log.<LOG_FILES_KEPT>`, the
//! oldest dropped), so the log never grows without bound.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A log file is rotated past this size.
pub const LOG_FILE_MAX_BYTES: u64 = 64 << 20;
/// Rotated files kept besides the current one.
pub const LOG_FILES_KEPT: u32 = 4;

const LOG_FILE_NAME: &str = "shardmq.log";

enum Sink {
    Stdout,
    File {
        dir: PathBuf,
        file: File,
        written_bytes: u64,
    },
}

struct Logger {
    level: log::LevelFilter,
    sink: Mutex<Sink>,
}

/// Installs the logger: `level` as RocketMQ operators name levels, `dir` for rotated files.
pub fn init(level: &str, dir: Option<&Path>) -> anyhow::Result<()> {
    let level: log::LevelFilter = level.parse().map_err(|_| {
        anyhow::anyhow!("--log-level {level:?}: want error, warn, info, debug or trace")
    })?;
    let sink = match dir {
        None => Sink::Stdout,
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                anyhow::anyhow!("cannot create the log directory {}: {e}", dir.display())
            })?;
            let (file, written_bytes) = open_log(dir)?;
            Sink::File {
                dir: dir.to_path_buf(),
                file,
                written_bytes,
            }
        }
    };
    let logger = Box::new(Logger {
        level,
        sink: Mutex::new(sink),
    });
    // A second init (tests) keeps the first logger.
    if log::set_boxed_logger(logger).is_ok() {
        log::set_max_level(level);
    }
    Ok(())
}

fn open_log(dir: &Path) -> io::Result<(File, u64)> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG_FILE_NAME))?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

/// `shardmq.log` → `.1` → `.2` …, the oldest dropped; then a fresh `shardmq.log`.
fn rotate(dir: &Path) -> io::Result<(File, u64)> {
    let name = |n: u32| match n {
        0 => dir.join(LOG_FILE_NAME),
        n => dir.join(format!("{LOG_FILE_NAME}.{n}")),
    };
    let _ = std::fs::remove_file(name(LOG_FILES_KEPT));
    for n in (0..LOG_FILES_KEPT).rev() {
        let _ = std::fs::rename(name(n), name(n + 1));
    }
    open_log(dir)
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let thread = std::thread::current();
        let line = format!(
            "{} {:<5} {} shardmq: {}\n",
            utc_now(),
            record.level(),
            thread.name().unwrap_or("main"),
            record.args()
        );
        let Ok(mut sink) = self.sink.lock() else {
            return;
        };
        match &mut *sink {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            }
            Sink::File {
                dir,
                file,
                written_bytes,
            } => {
                if *written_bytes + line.len() as u64 > LOG_FILE_MAX_BYTES {
                    if let Ok((fresh, size)) = rotate(dir) {
                        (*file, *written_bytes) = (fresh, size);
                    }
                }
                if file.write_all(line.as_bytes()).is_ok() {
                    *written_bytes += line.len() as u64;
                }
            }
        }
    }

    fn flush(&self) {
        if let Ok(mut sink) = self.sink.lock() {
            if let Sink::File { file, .. } = &mut *sink {
                let _ = file.flush();
            }
        }
    }
}

/// The wall clock as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, millis) = (now.as_secs() as i64, now.subsec_millis());
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_rotation() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        let dir = std::env::temp_dir().join(format!("shardmq-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..(LOG_FILES_KEPT + 2) {
            std::fs::write(dir.join(LOG_FILE_NAME), format!("round {round}")).unwrap();
            rotate(&dir).unwrap();
        }
        let kept = std::fs::read_dir(&dir).unwrap().count() as u32;
        assert_eq!(
            kept,
            LOG_FILES_KEPT + 1,
            "the current file and LOG_FILES_KEPT old ones"
        );
        let newest = std::fs::read_to_string(dir.join(format!("{LOG_FILE_NAME}.1"))).unwrap();
        assert_eq!(newest, format!("round {}", LOG_FILES_KEPT + 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
