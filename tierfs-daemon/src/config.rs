//! What a serving process is given: the resolved mount configuration the command line makes
//! (`cli::MountArgs::resolve`) and `serve` and `launch` consume, and the process-wide pieces
//! every command shares (the async runtime).
//!
//! It sits below `cli`, `launch`, `serve` and `store_link` and imports none of them, so the
//! daemon's modules form no cycle (`tests/layers.rs` checks it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::logging::{Reported, bail_with};
use anyhow::{Context, Result};
use tierfs::ErrorKind;
pub use tierfs::session::StreamLimit;
use tierfs::session::{Access, FsyncMode, SessionConfig};
use tierfs::store::Store;
use tokio::runtime::Runtime;

/// The daemon's own log in the data dir (open while it serves): a reset of the data dir
/// keeps it.
pub const DAEMON_LOG: &str = "daemon.log";

/// The configuration file the node daemon (`tierfs-daemon node`) reads unless told otherwise.
pub const NODE_CONFIG: &str = "/etc/tierfs/config.toml";

/// A fully resolved mount configuration (see `cli::MountArgs::resolve`). It is data: the
/// node daemon hands it to a worker serving a mount as its owner (`crate::worker`) as JSON,
/// never as a command line to parse again, and a field it does not know is refused.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The kernel's readahead window in KiB (`--read-ahead-kib`); `None`: the default.
    pub read_ahead_kib: Option<u32>,
    pub writeback_cache: bool,
    pub attr_ttl: Option<Duration>,
    pub entry_ttl: Option<Duration>,
    pub read_only: bool,
    pub nonempty: bool,
    pub flush_timeout: Duration,
    /// fsync waits for the store (with a store).
    pub fsync_remote: bool,
    /// Bound on bytes written but not uploaded (`None`: the core's default).
    pub dirty_limit: Option<u64>,
    /// Memory for the cold tier's work in flight (`--memory-budget`).
    pub memory_budget: u64,
    /// Reads of larger files stream past the cache.
    pub stream_above: StreamLimit,
    /// Data of open files is uploaded once this old.
    pub dirty_age: Duration,
    /// Take the workspace over from a live lease.
    pub takeover: bool,
    /// Mount a store that went back in time (`--accept-rollback`).
    pub accept_rollback: bool,
    /// Mount this snapshot read-only (its data dir is rebuilt from the store).
    pub snapshot: Option<String>,
    /// Mount the workspace read-only as it was at this time (unix milliseconds; `--at`).
    #[serde(default)]
    pub at_unix_ms: Option<u64>,
    /// Watch mode: `mountpoint` is a plain directory kept in sync, not a FUSE mount.
    pub watch: bool,
    /// Record no history of code and configs at snapshots (`--no-history`).
    pub no_history: bool,
    /// No refill of an empty cache from the workspace's hot set (`--no-refill`).
    pub no_refill: bool,
    /// Encrypt the hot tier at rest (`--encrypt-cache`).
    pub encrypt_cache: bool,
    /// Never serve files through FUSE passthrough (`--no-passthrough`).
    pub no_passthrough: bool,
    /// Follow the workspace as another node writes it, looking for a new head this often
    /// (`--follow`, `--follow-interval`); implies `read_only`.
    pub follow: Option<Duration>,
    /// A user who may control the mount besides the serving user and root (`owner` of a
    /// mount of the node daemon; never set from the command line).
    pub owner: Option<u32>,
    /// Count every FUSE request (by operation: calls, errors, latency) for the node's metrics.
    /// Set for the node daemon's mounts only: a standalone mount reads no clock per request.
    pub metered: bool,
}

impl MountConfig {
    /// Checks a configuration that arrived as data (`tierfs mount` starting `tierfs-daemon
    /// serve`, a hand-off to the node daemon) for what `cli::MountArgs::resolve` makes sure
    /// of: absolute paths, a workspace name, a read-only follower or snapshot.
    pub fn check(&self) -> Result<()> {
        for (what, path) in
            [("mountpoint", &self.mountpoint), ("data_dir", &self.data_dir), ("runtime_dir", &self.runtime_dir)]
                .into_iter()
                .chain(self.store.iter().map(|s| ("store", s)))
        {
            if !path.is_absolute() {
                bail_with!(ErrorKind::InvalidInput, "{what} {} is not an absolute path", path.display());
            }
        }
        if self.workspace.is_empty() {
            bail_with!(ErrorKind::InvalidInput, "the workspace name is empty");
        }
        if (self.follow.is_some() || self.snapshot.is_some() || self.at_unix_ms.is_some()) && !self.read_only {
            bail_with!(ErrorKind::InvalidInput, "a follower or a snapshot mount is read-only");
        }
        Ok(())
    }

    /// The core's session configuration for this mount, with `store` opened from
    /// [`MountConfig::store`]. Only a mapping: every default was filled in by `resolve`, from
    /// the core's defaults.
    pub fn session_config(&self, store: Option<Arc<Store>>) -> SessionConfig {
        let mut config = SessionConfig::new(&self.data_dir, None);
        config.store = store;
        config.workspace = self.workspace.clone();
        config.access = match (&self.snapshot, self.read_only, self.at_unix_ms) {
            (_, _, Some(ms)) => Access::At(ms),
            (Some(id), _, None) => Access::Snapshot(id.clone()),
            (None, true, None) => Access::ReadOnly,
            (None, false, None) => Access::ReadWrite,
        };
        config.cache_size = self.cache_size;
        config.reserve = self.reserve;
        config.dirty_limit = self.dirty_limit;
        config.inflight_budget = self.memory_budget;
        config.dirty_age = self.dirty_age;
        config.stream_above = self.stream_above;
        config.fsync = if self.fsync_remote { FsyncMode::Remote } else { FsyncMode::Local };
        config.takeover = self.takeover;
        config.accept_rollback = self.accept_rollback;
        config.kernel_owns_times = self.writeback_cache;
        config.keep_files = vec![DAEMON_LOG.into()];
        config.history = !self.no_history;
        // A watched directory holds its files itself: the hot tier has nothing to refill.
        config.refill = !self.no_refill && !self.watch;
        config.hot_set = !self.watch;
        config.follow = self.follow;
        config.encrypt_cache = self.encrypt_cache;
        config.passthrough = !self.no_passthrough;
        config
    }

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
            read_ahead_kib: self.read_ahead_kib.unwrap_or(defaults.read_ahead_kib),
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

/// A TIME of `tierfs restore --at`, as unix milliseconds: RFC 3339 (with `Z` or an offset; a
/// time without one is UTC), `now`, or a duration (humantime's: `10m`, `1h 30m`, `2days`)
/// followed by `ago`. `now_ms` is the time of day now. Refused with `InvalidInput`.
pub fn parse_time(s: &str, now_ms: u64) -> Result<u64> {
    let t = s.trim();
    let invalid = |why: String| {
        anyhow::Error::new(Reported::new(
            ErrorKind::InvalidInput,
            format!("--at {s:?}: {why}; give a time as RFC 3339 (2026-12-06T14:03:27Z) or relative (10m ago)"),
        ))
    };
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_ms);
    }
    if let Some(ago) = t.strip_suffix("ago").or_else(|| t.strip_suffix("AGO")) {
        let d = humantime::parse_duration(ago.trim()).map_err(|e| invalid(e.to_string()))?;
        let ms = u64::try_from(d.as_millis()).map_err(|_| invalid("too long ago".into()))?;
        return now_ms.checked_sub(ms).ok_or_else(|| invalid("before 1970".into()));
    }
    let ms = match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(dt) => dt.timestamp_millis(),
        Err(_) => {
            let st = humantime::parse_rfc3339_weak(t).map_err(|e| invalid(e.to_string()))?;
            match st.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
                Err(_) => -1,
            }
        }
    };
    u64::try_from(ms).map_err(|_| invalid("before 1970".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_rfc3339_or_relative_and_nonsense_is_invalid_input() {
        let now = 1_796_000_000_000; // 2026-11-30T00:53:20Z
        assert_eq!(parse_time("2026-11-30T00:53:20Z", now).expect("utc"), now);
        assert_eq!(parse_time("2026-11-30T01:53:20.250+01:00", now).expect("offset"), now + 250);
        assert_eq!(parse_time("2026-11-30 00:53:19", now).expect("no zone: utc"), now - 1000);
        assert_eq!(parse_time("10m ago", now).expect("relative"), now - 600_000);
        assert_eq!(parse_time("1h 30m ago", now).expect("relative"), now - 5_400_000);
        assert_eq!(parse_time("now", now).expect("now"), now);
        for bad in ["yesterday", "10 parsecs ago", "2026-13-01T00:00:00Z", "", "1969-12-31T23:59:59Z"] {
            let err = parse_time(bad, now).expect_err(bad);
            assert_eq!(crate::logging::error_kind(&err), Some(ErrorKind::InvalidInput), "{bad}: {err}");
        }
    }
}
