//! ACL: RocketMQ's AccessKey/SecretKey model (`plain_acl.yml`, signatures, permissions),
//! checked once per request in the dispatch of each port before any handler runs.
//!
//! - [`rules`]: the file's format and what it grants;
//! - [`address`]: the remote-address patterns;
//! - [`check`]: what each request code needs, and the decision;
//! - [`AclSource`] / [`AclView`]: the file, watched by one thread for the whole process and
//!   re-read when it changes (a bad file keeps the previous rules and logs why); each shard
//!   holds a view that picks up a new version with one atomic load per request.

pub mod address;
pub mod check;
pub mod rules;

use std::cell::RefCell;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub use check::Role;
pub use rules::AclRules;

use crate::remoting::RemotingCommand;

/// How often the file is looked at for changes (RocketMQ's FileWatchService: 500 ms).
pub const ACL_FILE_WATCH_INTERVAL_MS: u64 = 500;

/// The ACL file and its rules as last read successfully; shared by every shard.
#[derive(Debug)]
pub struct AclSource {
    path: PathBuf,
    rules: Mutex<Arc<AclRules>>,
    /// Bumped after each successful re-read.
    version: AtomicU64,
}

/// What tells one version of the file from the next.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode: metadata.ino(),
    })
}

fn load(path: &Path) -> Result<AclRules, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    AclRules::parse(&text)
}

impl AclSource {
    /// Reads `path` (it must parse: a node does not start on a bad ACL file).
    pub fn open(path: &Path) -> Result<Arc<AclSource>, String> {
        let rules = load(path).map_err(|why| format!("ACL file {}: {why}", path.display()))?;
        log::info!(
            "ACL on: {} account(s), {} global white address pattern(s) from {}",
            rules.accounts.len(),
            rules.global_white_remote_addresses.len(),
            path.display()
        );
        Ok(Arc::new(AclSource {
            path: path.to_path_buf(),
            rules: Mutex::new(Arc::new(rules)),
            version: AtomicU64::new(0),
        }))
    }

    pub fn rules(&self) -> Arc<AclRules> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Starts the thread that re-reads the file whenever it changes, for the process's life.
    pub fn watch(self: &Arc<Self>) {
        let source = self.clone();
        let spawned = std::thread::Builder::new()
            .name("acl-watch".into())
            .spawn(move || {
                let mut last = stamp(&source.path);
                loop {
                    std::thread::sleep(Duration::from_millis(ACL_FILE_WATCH_INTERVAL_MS));
                    let now = stamp(&source.path);
                    if now == last {
                        continue;
                    }
                    last = now;
                    source.reload();
                }
            });
        if let Err(error) = spawned {
            log::warn!("ACL: cannot watch {}: {error}", self.path.display());
        }
    }

    fn reload(&self) {
        match load(&self.path) {
            Ok(rules) => {
                log::info!(
                    "ACL file {} re-read: {} account(s)",
                    self.path.display(),
                    rules.accounts.len()
                );
                *self.rules.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
                self.version.fetch_add(1, Ordering::Release);
            }
            Err(why) => log::warn!(
                "ACL file {} changed but is not used, the previous rules stay: {why}",
                self.path.display()
            ),
        }
    }
}

/// One shard's view of the rules: the shared source is consulted only when its version moved.
#[derive(Debug)]
pub struct AclView {
    source: Arc<AclSource>,
    cached: RefCell<(u64, Arc<AclRules>)>,
}

impl AclView {
    pub fn new(source: Arc<AclSource>) -> AclView {
        let version = source.version.load(Ordering::Acquire);
        let rules = source.rules();
        AclView {
            source,
            cached: RefCell::new((version, rules)),
        }
    }

    /// `Ok` when the request may run; else the NO_PERMISSION remark.
    pub fn check(
        &self,
        role: Role,
        request: &RemotingCommand<'_>,
        peer: IpAddr,
    ) -> Result<(), String> {
        let version = self.source.version.load(Ordering::Acquire);
        if self.cached.borrow().0 != version {
            *self.cached.borrow_mut() = (version, self.source.rules());
        }
        check::check(&self.cached.borrow().1, role, request, peer)
    }
}
