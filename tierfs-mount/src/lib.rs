//! The FUSE adapter: kernel requests in, `tierfs::vfs` calls out.
//!
//! [`TierFuse`] implements `fuser::Filesystem` with one short method per operation: convert
//! the arguments, call the matching [`Vfs`] method, reply. It holds no file system state of
//! its own (only the [`pool`] that runs operations which may wait), so all of tierfs's POSIX
//! behaviour can be tested through `Vfs` without a kernel (the mountpoint-s3 split between
//! `fuse.rs` and `fs.rs`).
//!
//! Invariants:
//! - No semantics here. Every decision about what an operation means lives in
//!   `tierfs::vfs`, and every errno comes from `VfsError::errno`. The adapter only refuses
//!   what cannot be expressed in the `Vfs` API (unknown rename or copy flags: EINVAL).
//! - The kernel checks permissions (`default_permissions`) and keeps flock/fcntl locks
//!   locally (no `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS`).
//! - The kernel caches attributes and entries for the configured TTLs and keeps a file's page
//!   cache across opens. That is only correct because every change to the tree passes through
//!   this mount; anything that changes it behind the kernel's back must invalidate through the
//!   session's `Notifier`.
//! - With the writeback cache on, the kernel owns the timestamps of writes: open the `Vfs`
//!   with `VfsConfig::kernel_owns_times == MountOptions::writeback_cache`. It is off by
//!   default: with it the kernel asks again for the attributes of every closed file (its
//!   `st_blocks` may have changed) and sends a SETATTR of times after each rename, unlink and
//!   link, round trips that cost metadata work more than buffering saves small writes.
//! - Requests are read on `n_threads` threads (one by default) and answered there, except
//!   those that may wait for the store, which go to the pool; no request thread waits on the
//!   network.
//! - Wholly local files are served through FUSE passthrough where the core says so
//!   (`Vfs::open_for`): the adapter registers the data file with the kernel ([`backing`]) and
//!   answers the open with it; the kernel then reads it without asking. `init` asks the
//!   kernel for passthrough only when the process holds CAP_SYS_ADMIN and the writeback cache
//!   is off (the kernel refuses the two together), and tells the core why not otherwise.
//! - When the session ends, however it ends, `destroy` runs once, lets the pool finish, and
//!   calls `Vfs::sync_all`.
//!
//! Serving until the kernel unmounts, with a way to unmount from a signal handler:
//!
//! ```no_run
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! fn serve(vfs: Arc<tierfs::vfs::Vfs>) -> std::io::Result<()> {
//!     let opts = tierfs_mount::MountOptions::default();
//!     let mut session = tierfs_mount::session(vfs, Path::new("/mnt/tierfs"), &opts)?;
//!     let mut unmounter = session.unmount_callable();
//!     std::thread::spawn(move || {
//!         // ...wait for SIGTERM, then:
//!         let _ = unmounter.unmount();
//!     });
//!     session.run() // returns after the unmount, once `Vfs::sync_all` has run
//! }
//! ```

// No function over the length clippy.toml sets (clippy checks it in CI).
#![warn(clippy::too_many_lines)]

mod backing;
mod convert;
mod filesystem;
pub mod meter;
pub mod pool;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use fuser::{BackgroundSession, Notifier, Session, SessionUnmounter};
use fuser::{Config, MountOption, SessionACL};
use tierfs::vfs::Vfs;

pub use crate::filesystem::TierFuse;

/// How to mount a tierfs workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Let users other than the mounting one in (`allow_other`; non-root mounts need
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Threads reading kernel requests (each with its own cloned /dev/fuse fd when more
    /// than one). One by default: the kernel wakes the reader that has waited longest, and
    /// a metadata operation is answered fastest by the thread that just ran (measured in
    /// benches/results/compare.md, the run of 2026-12-01 10:53 UTC).
    pub n_threads: usize,
    /// Threads for the operations that may wait for the store (see [`pool`]); 0 runs them
    /// on the request threads.
    pub io_threads: usize,
    /// How long the kernel may cache an inode's attributes.
    pub attr_ttl: Duration,
    /// How long the kernel may cache a name's lookup.
    pub entry_ttl: Duration,
    /// Let the kernel buffer writes in its page cache (`FUSE_WRITEBACK_CACHE`). Must match
    /// `VfsConfig::kernel_owns_times`.
    pub writeback_cache: bool,
    /// The source shown in /proc/mounts.
    pub fsname: String,
    /// Mount read-only (the kernel refuses changes with EROFS).
    pub read_only: bool,
    /// The kernel's readahead window for the mount, in KiB, set by [`set_read_ahead`] once
    /// the mount is up; 0 leaves the kernel's (128 KiB, which INIT cannot raise).
    pub read_ahead_kib: u32,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            allow_other: false,
            n_threads: 1,
            // Eight readers of cold files wait on the store side by side: with four, eight
            // DataLoader-style readers had 3.7 GETs in flight and read 178 files/s; with eight,
            // 7.5 and 275 (benches/results/smallfiles.md, the run of f77f00f).
            io_threads: 8,
            // Long: every change to the tree passes through this mount and the kernel updates
            // or invalidates its cache on each of them (pjdfstest passes with 1 h TTLs and a
            // 50 ms naptime), so a long TTL only saves round trips.
            attr_ttl: Duration::from_secs(60),
            entry_ttl: Duration::from_secs(60),
            writeback_cache: false,
            fsname: "tierfs".to_owned(),
            read_only: false,
            // One request's worth (256 pages): a page fault in an mmapped file then brings
            // 1 MiB around it instead of 128 KiB. A cold miss fetches a whole 4 MiB chunk
            // anyway, so this costs no store traffic; a random page walk of a 1 GiB file hot
            // in tierfs ran in 1.6-2.0 s instead of 2.6-3.2 s (benches/README.md, mmap).
            read_ahead_kib: 1024,
        }
    }
}

/// Sets the kernel's readahead window of the FUSE mount at `mountpoint` to `kib` KiB and
/// returns the window it replaced. The window is the mount's backing device's
/// (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, writable by root only): FUSE's INIT can only
/// lower it below the kernel's 128 KiB. Call it once the session serves: the `stat` of the
/// mountpoint that finds the device waits for INIT, which would otherwise lower the window
/// again when it completes.
pub fn set_read_ahead(mountpoint: &Path, kib: u32) -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    let before = std::fs::read_to_string(&path)?;
    let before = before
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{path} holds {before:?}")))?;
    std::fs::write(&path, kib.to_string())?;
    Ok(before)
}

/// The fuser session configuration for `opts`.
pub fn fuser_config(opts: &MountOptions) -> Config {
    let n_threads = opts.n_threads.max(1);
    let mut config = Config::default();
    config.n_threads = Some(n_threads);
    // One fd per worker: the kernel hands requests to whichever thread is free without the
    // workers contending on a single fd.
    config.clone_fd = n_threads > 1;
    config.mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        MountOption::Subtype("tierfs".to_owned()),
        MountOption::DefaultPermissions,
    ];
    if opts.read_only {
        config.mount_options.push(MountOption::RO);
    }
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config
}

/// Mounts `vfs` at `mountpoint` and completes the FUSE handshake, without serving yet.
///
/// Take `Session::unmount_callable()` first if something else (a signal handler) must be
/// able to unmount, then call `Session::run()`: it serves on `opts.n_threads` threads and
/// returns once the filesystem is unmounted, by that unmounter or by `umount`/`fusermount -u`.
pub fn session(vfs: Arc<Vfs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<Session<TierFuse>> {
    Session::new(TierFuse::new(vfs, opts.clone())?, mountpoint, &fuser_config(opts))
}

/// [`session`], counting every request in `stats` (see [`meter`]).
pub fn session_metered(
    vfs: Arc<Vfs>,
    mountpoint: &Path,
    opts: &MountOptions,
    stats: Arc<meter::FuseStats>,
) -> io::Result<Session<TierFuse>> {
    Session::new(TierFuse::new(vfs, opts.clone())?.metered(stats), mountpoint, &fuser_config(opts))
}

/// Serves `vfs` on a `/dev/fuse` descriptor that someone else mounted (the node daemon,
/// which mounts as root and hands the descriptor to a worker running as the mount's owner),
/// completing the FUSE handshake, without serving yet. Requests are admitted from root and
/// from this process's user, or from everyone with `opts.allow_other`: the mount was made
/// with the kernel's `allow_other`, so this check is the only one. Counts every request in
/// `stats` when given (see [`meter`]). Nothing here can unmount: the one who mounted does.
pub fn session_from_fd(
    vfs: Arc<Vfs>,
    fd: std::os::fd::OwnedFd,
    opts: &MountOptions,
    stats: Option<Arc<meter::FuseStats>>,
) -> io::Result<Session<TierFuse>> {
    let fs = TierFuse::new(vfs, opts.clone())?;
    let fs = match stats {
        Some(stats) => fs.metered(stats),
        None => fs,
    };
    let acl = if opts.allow_other { SessionACL::All } else { SessionACL::RootAndOwner };
    Session::from_fd(fs, fd, acl, fuser_config(opts))
}

/// The kernel's mount options (the `data` of mount(2)) for a FUSE mount of `opts` on the
/// `/dev/fuse` descriptor `fd`, served for `uid`/`gid`: those [`session`] would have fuser
/// pass. The kernel admits every user (`allow_other`) and [`session_from_fd`] admits whom
/// `opts` say.
pub fn kernel_mount_data(fd: i32, uid: u32, gid: u32) -> String {
    format!("fd={fd},rootmode=40000,user_id={uid},group_id={gid},default_permissions,allow_other")
}

/// Mounts `vfs` at `mountpoint` and serves it from a background thread.
///
/// `BackgroundSession::umount_and_join` unmounts and waits for the session to end;
/// `BackgroundSession::join` waits for an unmount made elsewhere. Dropping the handle
/// unmounts without waiting, so `Vfs::sync_all` may still be running. A `SessionUnmounter`
/// cannot be had for a spawned session; use [`session`] when a signal handler must unmount.
pub fn mount(vfs: Arc<Vfs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<BackgroundSession> {
    session(vfs, mountpoint, opts)?.spawn()
}

/// Mounts `vfs` at `mountpoint` and serves it on the calling thread (plus the workers) until
/// the filesystem is unmounted.
pub fn mount_blocking(vfs: Arc<Vfs>, mountpoint: &Path, opts: &MountOptions) -> io::Result<()> {
    session(vfs, mountpoint, opts)?.run()
}

/// Drops what a follower's new head changed from the kernel's caches: the attributes and
/// cached pages of each changed inode (only the attributes of those whose pages an open
/// handle of an older version reads), and each added, removed or replaced name. An inode or
/// name the kernel does not hold answers ENOENT, which is not an error here.
pub fn invalidate(notifier: &Notifier, change: &tierfs::vfs::HeadChange) {
    use std::os::unix::ffi::OsStrExt;
    let report = |what: &str, result: io::Result<()>| match result {
        Err(err) if err.raw_os_error() != Some(libc::ENOENT) => {
            tracing::warn!(what, error = %err, "the kernel kept a stale cache entry after a new head");
        }
        _ => {}
    };
    for &ino in &change.inodes {
        // A negative offset drops the attributes only: the pages an open handle reads stay.
        let offset = if change.kept.contains(&ino) { -1 } else { 0 };
        report("inode", notifier.inval_inode(fuser::INodeNo(ino), offset, 0));
    }
    for (parent, name) in &change.entries {
        report("name", notifier.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::from_bytes(name)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_match_the_documented_defaults() {
        let opts = MountOptions::default();
        assert_eq!((opts.n_threads, opts.io_threads), (1, 8));
        assert_eq!(opts.attr_ttl, Duration::from_secs(60));
        assert!(!opts.writeback_cache && !opts.allow_other && !opts.read_only);
    }

    #[test]
    fn config_reflects_options() {
        let config = fuser_config(&MountOptions { n_threads: 4, ..MountOptions::default() });
        assert_eq!(config.n_threads, Some(4));
        assert!(config.clone_fd);
        assert_eq!(config.acl, SessionACL::Owner);
        assert!(config.mount_options.contains(&MountOption::DefaultPermissions));
        assert!(config.mount_options.contains(&MountOption::FSName("tierfs".to_owned())));
        assert!(!config.mount_options.contains(&MountOption::RO));

        let opts = MountOptions { allow_other: true, read_only: true, n_threads: 0, ..MountOptions::default() };
        let config = fuser_config(&opts);
        assert_eq!(config.n_threads, Some(1));
        assert!(!config.clone_fd);
        assert_eq!(config.acl, SessionACL::All);
        assert!(config.mount_options.contains(&MountOption::RO));
    }
}
