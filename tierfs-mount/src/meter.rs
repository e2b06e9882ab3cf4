//! Per-operation numbers of the FUSE requests one mount answered: how many, how many failed,
//! and how long each took from the moment the adapter got it to its reply (time queued on
//! the pool included). The node daemon renders them as Prometheus series.
//!
//! Invariants:
//! - Metering is optional ([`crate::session_metered`]): a mount without a [`FuseStats`] reads
//!   no clock and touches no counter, so the standalone mount pays nothing for it.
//! - Each request is counted exactly once, when its [`Timer`] is dropped, which happens after
//!   the reply (the timer moves with the request onto the pool). A request is an error when
//!   it was answered with an errno; a negative lookup entry, and ENODATA for an extended
//!   attribute the file lacks, are answers, not errors.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use fuser::Errno;
use tierfs::telemetry::{OpSnapshot, OpStats};
use tierfs::vfs::VfsError;

/// The FUSE operations the adapter implements, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuseOp {
    Lookup,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Releasedir,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
    Ioctl,
    Lseek,
    CopyFileRange,
    Tmpfile,
}

/// The operations' names, in [`FuseOp`] order: the `op` label of the metrics.
pub const FUSE_OPS: [&str; 34] = [
    "lookup",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "fallocate",
    "ioctl",
    "lseek",
    "copy_file_range",
    "tmpfile",
];

impl FuseOp {
    pub fn name(self) -> &'static str {
        FUSE_OPS[self as usize]
    }
}

/// The numbers of one mount's requests; share it between the adapter and whoever reads it.
#[derive(Debug)]
pub struct FuseStats {
    ops: [OpStats; FUSE_OPS.len()],
}

impl Default for FuseStats {
    fn default() -> FuseStats {
        FuseStats { ops: std::array::from_fn(|_| OpStats::default()) }
    }
}

impl FuseStats {
    /// Every operation that was requested at least once, in [`FUSE_OPS`] order.
    pub fn snapshot(&self) -> Vec<OpSnapshot> {
        self.ops.iter().zip(FUSE_OPS).map(|(stats, name)| stats.snapshot(name)).filter(|s| s.calls > 0).collect()
    }
}

/// One request on its way to its reply; counts it when dropped.
pub(crate) struct Timer {
    op: FuseOp,
    /// `fuse` at debug level, with the request's id, operation and inode: what is logged of
    /// the request (its failure) is logged inside it.
    span: tracing::Span,
    /// With the time it started, when the mount is metered.
    meter: Option<(Arc<FuseStats>, Instant)>,
    failed: Cell<bool>,
}

impl Timer {
    pub(crate) fn start(op: FuseOp, stats: Option<&Arc<FuseStats>>, id: u64, ino: u64) -> Timer {
        let span = tracing::debug_span!("fuse", id, op = op.name(), ino);
        Timer { op, span, meter: stats.map(|s| (Arc::clone(s), Instant::now())), failed: Cell::new(false) }
    }

    pub(crate) fn name(&self) -> &'static str {
        self.op.name()
    }

    /// Counts the request as failed and returns the errno to answer with.
    pub(crate) fn errno(&self, errno: Errno) -> Errno {
        self.failed.set(true);
        errno
    }

    /// Logs a failed operation (see [`fail`]), counts it, and returns
    /// its errno.
    pub(crate) fn fail(&self, err: &VfsError) -> Errno {
        let _in = self.span.enter();
        self.errno(fail(self.name(), err))
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((stats, started)) = &self.meter {
            stats.ops[self.op as usize].record(started.elapsed(), self.failed.get());
        }
    }
}

/// Logs a failed operation and returns its errno. Failures of what lies underneath (disk
/// full, metadata store, store) are warnings, at most one a second (the count of the ones
/// left out goes with the next), so a program retrying in a loop cannot flood the log.
pub(crate) fn fail(op: &'static str, err: &VfsError) -> Errno {
    static LAST_WARN_S: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    if err.is_fault() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let last = LAST_WARN_S.load(Ordering::Relaxed);
        if now > last && LAST_WARN_S.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
            tracing::warn!(op, error = %err, suppressed, "operation failed");
        } else {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        tracing::debug!(op, error = %err, "vfs operation failed");
    }
    crate::convert::errno(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_enum() {
        assert_eq!(FuseOp::Lookup.name(), "lookup");
        assert_eq!(FuseOp::Readdirplus.name(), "readdirplus");
        assert_eq!(FuseOp::CopyFileRange.name(), "copy_file_range");
        assert_eq!(FuseOp::Tmpfile.name(), "tmpfile");
        assert_eq!(FuseOp::Tmpfile as usize + 1, FUSE_OPS.len());
    }

    /// A failure is logged inside the request's span: its id, operation and inode go with it.
    #[test]
    fn a_failure_is_logged_with_the_request_it_answers() {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("lock").extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let t = Timer::start(FuseOp::Unlink, None, 4711, 42);
            assert_eq!(t.fail(&VfsError::NotFound), Errno::ENOENT);
        });
        let said = String::from_utf8(lines.0.lock().expect("lock").clone()).expect("utf-8");
        assert!(
            said.contains("fuse{id=4711 op=\"unlink\" ino=42}") && said.contains("failed"),
            "the failure was not logged in its request's span: {said:?}"
        );
    }

    #[test]
    fn a_request_counts_once_when_it_ends() {
        let stats = Arc::new(FuseStats::default());
        drop(Timer::start(FuseOp::Getattr, Some(&stats), 1, 1));
        let t = Timer::start(FuseOp::Getattr, Some(&stats), 2, 1);
        assert_eq!(t.errno(Errno::ENOENT), Errno::ENOENT);
        assert_eq!(stats.snapshot()[0].calls, 1, "not counted before it ends");
        drop(t);
        drop(Timer::start(FuseOp::Read, None, 3, 1));
        let s = stats.snapshot();
        assert_eq!(s.len(), 1, "only what was requested: {s:?}");
        assert_eq!((s[0].op.as_str(), s[0].calls, s[0].errors, s[0].latency.count()), ("getattr", 2, 1, 2));
    }
}
