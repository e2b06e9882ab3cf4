//! What a serving process is given: the resolved mount configuration the command line makes
//! (`cli::MountArgs::resolve`) and `serve` and `launch` consume, and the process-wide pieces
//! every command shares (the async runtime, this process's lease holder name).
//!
//! It sits below `cli`, `launch`, `serve` and `store_link` and imports none of them, so the
//! daemon's modules form no cycle (`tests/layers.rs` checks it).

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::runtime::Runtime;

/// A fully resolved mount configuration (see `cli::MountArgs::resolve`).
#[derive(Debug, Clone, PartialEq)]
pub struct MountConfig {
    /// Absolute; canonical when it existed at resolution time.
    pub mountpoint: PathBuf,
    pub data_dir: PathBuf,
    pub runtime_dir: PathBuf,
    pub cache_size: Option<u64>,
    /// Free disk space file data leaves for metadata (`--reserve`).
    pub reserve: u64,
    /// Store file of the cold tier, if any.
    pub store: Option<PathBuf>,
    pub workspace: String,
    pub allow_other: bool,
    /// Threads reading FUSE requests; `None` takes the adapter's default.
    pub threads: Option<usize>,
    /// Threads for FUSE operations that may wait for the store; `None`: the default.
    pub io_threads: Option<usize>,
    pub writeback_cache: bool,
    pub attr_ttl: Option<Duration>,
    pub entry_ttl: Option<Duration>,
    pub read_only: bool,
    pub nonempty: bool,
    pub flush_timeout: Duration,
    /// fsync waits for the store (with a store).
    pub fsync_remote: bool,
    /// Bound on bytes written but not uploaded (`None`: the cold tier's default).
    pub dirty_limit: Option<u64>,
    /// Reads of larger files stream past the cache (`None`: the cold tier's default).
    pub stream_above: Option<StreamLimit>,
    /// Data of open files is uploaded once this old.
    pub dirty_age: Duration,
    /// Take the workspace over from a live lease.
    pub takeover: bool,
    /// Mount this snapshot read-only (its data dir is rebuilt from the store).
    pub snapshot: Option<String>,
}

/// `--stream-above`: reads of files larger than a size bypass the cache, or never do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamLimit {
    Off,
    Above(u64),
}

impl MountConfig {
    /// The adapter's options for this configuration.
    pub fn mount_options(&self) -> tierfs_mount::MountOptions {
        let defaults = tierfs_mount::MountOptions::default();
        tierfs_mount::MountOptions {
            allow_other: self.allow_other,
            n_threads: self.threads.unwrap_or(defaults.n_threads),
            io_threads: self.io_threads.unwrap_or(defaults.io_threads),
            attr_ttl: self.attr_ttl.unwrap_or(defaults.attr_ttl),
            entry_ttl: self.entry_ttl.unwrap_or(defaults.entry_ttl),
            writeback_cache: self.writeback_cache,
            fsname: "tierfs".to_owned(),
            read_only: self.read_only,
        }
    }
}

/// The tokio runtime of a serving process: two workers are plenty for the control socket
/// and shutdown; FUSE requests never run on it.
pub fn build_runtime() -> Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tierfs-rt")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// This node's name in leases: `host:pid`.
pub fn holder_name() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{}:{}", if host.is_empty() { "localhost" } else { &host }, std::process::id())
}
