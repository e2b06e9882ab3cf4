//! [`TierFuse`]: the `fuser::Filesystem` implementation, one short method per FUSE operation.
//!
//! Each method converts its arguments, calls the matching `Vfs` method and replies, on the
//! request thread, except operations that may wait for more than the local disk (fsync,
//! truncation, reads and writes that `Vfs::may_wait` flags, and the other calls that may
//! fetch from the store): those run and reply on the [`crate::pool`]. Locking
//! operations (`getlk`, `setlk`, flock) are deliberately absent: `init` does not request
//! `FUSE_POSIX_LOCKS` or `FUSE_FLOCK_LOCKS`, so the kernel keeps those locks locally, which is
//! correct for a filesystem mounted once per node.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tierfs::vfs::{Attr, Caller, DataFileRemoval, Opened, PageCache, SetAttr, Vfs, VfsError};

use crate::MountOptions;
use crate::backing::Backings;
use crate::convert::{
    XattrReply, errno, file_attr, file_type, rename_flags, shared_ttl, time_set, timestamp_from_kernel, xattr_reply,
};
use crate::meter::{FuseOp, FuseStats, Timer, fail};
use crate::pool::Pool;

/// Largest write the kernel may send in one request. 1 MiB is the kernel's default page
/// limit per request (`fuse_max_pages_limit` = 256 pages); a larger value would be clamped.
const MAX_WRITE: u32 = 1 << 20;

/// Pending background requests (readahead, writeback) before the kernel throttles. The
/// kernel default of 12 starves sequential I/O with readahead and the writeback cache on.
const MAX_BACKGROUND: u16 = 64;

/// Three quarters of `MAX_BACKGROUND`, the ratio the kernel itself uses.
const CONGESTION_THRESHOLD: u16 = 48;

/// Largest byte count one `copy_file_range` reply reports: the reply field is a u32, and a
/// page-aligned count lets the caller's next round start on a page boundary.
const MAX_COPY: u32 = !0xfff;

/// Generation numbers are always 0: tierfs never reuses inode numbers.
const GENERATION: Generation = Generation(0);

/// The FUSE adapter over one [`Vfs`].
pub struct TierFuse {
    vfs: Arc<Vfs>,
    opts: MountOptions,
    /// Runs the operations that may wait (see [`crate::pool`]); `None`: all run inline.
    pool: Option<Pool>,
    /// One thread removing the data files that unlinks and renames freed (see
    /// [`TierFuse::removal_result`]); present exactly when `pool` is. Apart from the pool so
    /// a removal never queues behind writes that wait for the room it makes.
    reaper: Option<Pool>,
    /// Counts every request when the mount is metered (see [`crate::meter`]).
    stats: Option<Arc<FuseStats>>,
    /// The kernel's ids of the data files passthrough handles read (see [`crate::backing`]).
    backings: Arc<Backings>,
}

impl std::fmt::Debug for TierFuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierFuse").field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl TierFuse {
    /// An adapter serving `vfs` with the caching behaviour `opts` asks for.
    /// Fails only if the pool's threads cannot be started.
    pub fn new(vfs: Arc<Vfs>, opts: MountOptions) -> io::Result<TierFuse> {
        let (pool, reaper) = match opts.io_threads {
            0 => (None, None),
            n => (Some(Pool::new("tierfs-io", n)?), Some(Pool::new("tierfs-reap", 1)?)),
        };
        Ok(TierFuse { vfs, opts, pool, reaper, stats: None, backings: Arc::default() })
    }

    /// Counts each request's outcome and latency in `stats`.
    pub fn metered(mut self, stats: Arc<FuseStats>) -> TierFuse {
        self.stats = Some(stats);
        self
    }

    /// Starts timing one request.
    /// The timer of request `req` on inode `ino` (its first inode), which carries its span.
    fn time(&self, op: FuseOp, req: &Request, ino: INodeNo) -> Timer {
        Timer::start(op, self.stats.as_ref(), req.unique().0, ino.0)
    }

    /// Runs `op` on the pool, or here when there is none. For operations that may wait for
    /// the store or the dirty bound, so that the request threads go on with the others.
    fn offload(&self, op: impl FnOnce(&Vfs) + Send + 'static) {
        self.offload_if(true, op);
    }

    /// [`TierFuse::offload`] when `may_wait`, else runs `op` here.
    fn offload_if(&self, may_wait: bool, op: impl FnOnce(&Vfs) + Send + 'static) {
        self.run_on(self.pool.as_ref().filter(|_| may_wait), op);
    }

    /// Runs `op` on `pool`, or here without one.
    fn run_on(&self, pool: Option<&Pool>, op: impl FnOnce(&Vfs) + Send + 'static) {
        match pool {
            Some(pool) => {
                let vfs = Arc::clone(&self.vfs);
                pool.run(move || op(&vfs));
            }
            None => op(&self.vfs),
        }
    }

    fn reply_entry(&self, reply: ReplyEntry, attr: &Attr) {
        reply.entry_with_ttls(&self.opts.attr_ttl, &self.opts.entry_ttl, &file_attr(attr), GENERATION);
    }

    fn entry_result(&self, t: Timer, result: Result<Attr, VfsError>, reply: ReplyEntry) {
        match result {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    /// Replies to an unlink or rename, then removes the data file it freed: any but an empty
    /// file's on the reaper thread. In an `rm -rf` of a tree whose ext4 inodes had left the
    /// cache each removal took ~150 us, which the request thread spent before it read the
    /// next request (a GETATTR of the parent directory that then waited 190 us at the
    /// median). A hand-off costs a wake-up of the reaper, more than removing what an empty
    /// file left (mostly nothing): deleting 10 000 empty files ran at 11 700-12 300 a second
    /// with every removal handed off, 17 300-17 800 with the empty ones removed here. A write
    /// that finds the disk full waits for pending removals (`Vfs::claim_space`).
    fn removal_result(&self, t: Timer, result: Result<DataFileRemoval, VfsError>, reply: ReplyEmpty) {
        let removal = match result {
            Ok(removal) => removal,
            Err(err) => return reply.error(t.fail(&err)),
        };
        reply.ok();
        let op = t.name();
        drop(t); // answered: the removal below is not the request's
        if !removal.is_needed() {
            return;
        }
        let reaper = self.reaper.as_ref().filter(|_| !removal.was_empty());
        self.run_on(reaper, move |vfs| {
            if let Err(err) = removal.finish(vfs) {
                fail(op, &err);
            }
        });
    }

    /// Answers a create or tmpfile that made (or, for a create, opened) the file of `created`.
    fn created_result(&self, t: Timer, created: Result<(Attr, Opened), VfsError>, reply: ReplyCreate) {
        let (attr, opened) = match created {
            Ok(created) => created,
            Err(err) => return reply.error(t.fail(&err)),
        };
        let (ttl, attr, fh) = (self.ttl(), file_attr(&attr), FileHandle(opened.fh));
        // A new file is written through passthrough, and so is an existing one with
        // passthrough handles open (the kernel would refuse a normal open of it).
        let Some(file) = opened.backing.clone() else {
            return reply.created(&ttl, &attr, GENERATION, fh, file_open_flags());
        };
        match backing_of(&self.vfs, &self.backings, attr.ino, &opened, || reply.open_backing(&*file)) {
            Ok(Some(id)) => reply.created_passthrough(&ttl, &attr, GENERATION, fh, FopenFlags::FOPEN_NOFLUSH, &id),
            Ok(None) => reply.created(&ttl, &attr, GENERATION, fh, file_open_flags()),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    /// Asks the kernel for passthrough when the core wants it and it can work, else tells
    /// the core why not (shown by `status`).
    fn ask_passthrough(&self, config: &mut KernelConfig) {
        if !self.vfs.passthrough_wanted() {
            return;
        }
        if let Some(reason) = passthrough_missing(&self.opts) {
            return self.vfs.passthrough_unavailable(reason);
        }
        if config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_err() {
            return self.vfs.passthrough_unavailable("the kernel lacks FUSE passthrough (Linux 6.9 or later has it)");
        }
        // 1 on a plain disk (an overlayfs may then sit on the mount: `tierfs layer`), 2 (the
        // kernel's limit) when the data dir is itself on a stacked filesystem.
        let depth = self.vfs.passthrough_stack_depth();
        match config.set_max_stack_depth(depth) {
            Ok(_) => self.vfs.passthrough_declared(depth),
            Err(nearest) => {
                if config.set_max_stack_depth(nearest).is_ok() {
                    self.vfs.passthrough_declared(nearest);
                }
            }
        }
    }

    fn ttl(&self) -> Duration {
        shared_ttl(self.opts.attr_ttl, self.opts.entry_ttl)
    }
}

/// The credentials of the process that made the request.
fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
}

fn empty_result(t: Timer, result: Result<(), VfsError>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(err) => reply.error(t.fail(&err)),
    }
}

fn xattr_result(t: Timer, size: u32, result: Result<Vec<u8>, VfsError>, reply: ReplyXattr) {
    let value = match result {
        Ok(value) => value,
        // An attribute the file lacks is an answer, like a negative lookup: the kernel asks
        // for `security.capability` at every write.
        Err(VfsError::NoXattr) => return reply.error(errno(&VfsError::NoXattr)),
        Err(err) => return reply.error(t.fail(&err)),
    };
    match xattr_reply(size, value.len()) {
        Ok(XattrReply::Size(len)) => reply.size(len),
        Ok(XattrReply::Data) => reply.data(&value),
        Err(errno) => reply.error(t.errno(errno)),
    }
}

/// Page cache stays valid across opens: every change to file data goes through this mount.
/// `close` needs no FLUSH round trip (`Vfs::flush` promises nothing beyond what `write`
/// did, and locks stay in the kernel); the kernel honours `FOPEN_NOFLUSH` only without the
/// writeback cache, where it saves one round trip per `close`.
fn file_open_flags() -> FopenFlags {
    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
}

/// Answers an open: normally, or through passthrough with the data file `opened` names
/// (see [`backing_of`]).
fn reply_opened(vfs: &Vfs, backings: &Backings, ino: INodeNo, opened: Opened, reply: ReplyOpen) {
    let fh = FileHandle(opened.fh);
    let Some(file) = opened.backing.clone() else { return reply.opened(fh, open_flags(opened.page_cache)) };
    match backing_of(vfs, backings, ino, &opened, || reply.open_backing(&*file)) {
        Ok(Some(id)) => reply.opened_passthrough(fh, FopenFlags::FOPEN_NOFLUSH, &id),
        Ok(None) => reply.opened(fh, file_open_flags()),
        Err(err) => reply.error(errno(&err)),
    }
}

/// The kernel's id of the data file a passthrough handle is served from, registered for its
/// inode by `register` (the first handle registers it), or `None` when the kernel refused the
/// registration: passthrough is then off (the core records why) and the handle a normal one.
fn backing_of(
    vfs: &Vfs,
    backings: &Backings,
    ino: INodeNo,
    opened: &Opened,
    register: impl FnOnce() -> io::Result<BackingId>,
) -> Result<Option<Arc<BackingId>>, VfsError> {
    let err = match backings.acquire(ino.0, opened.fh, register) {
        Ok(id) => return Ok(Some(id)),
        Err(err) => err,
    };
    let reason = match err.raw_os_error() {
        Some(libc::EPERM) => "the kernel refused the backing file: the mount lacks CAP_SYS_ADMIN".to_owned(),
        _ => format!("the kernel refused the backing file: {err}"),
    };
    vfs.passthrough_failed(ino.0, opened.fh, &reason)?;
    Ok(None)
}

/// Why the kernel cannot serve this mount's files through passthrough, if it cannot:
/// `--writeback-cache` (the kernel refuses both together) or a process without
/// CAP_SYS_ADMIN (the kernel refuses to register a backing file for it).
fn passthrough_missing(opts: &MountOptions) -> Option<&'static str> {
    // CAP_SYS_ADMIN is bit 21 of the effective set.
    const CAP_SYS_ADMIN: u32 = 21;
    if opts.writeback_cache {
        return Some("not with --writeback-cache (the kernel serves passthrough files without its page cache)");
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    (effective & (1 << CAP_SYS_ADMIN) == 0).then_some("the mount's process lacks CAP_SYS_ADMIN (mount as root)")
}

/// The flags of an open, by what it does with the file's cached pages: a follower's open
/// of a file whose pages hold an older version drops them (no `FOPEN_KEEP_CACHE`, so the
/// kernel invalidates them) or, while a handle still reads them, reads around them.
fn open_flags(page_cache: PageCache) -> FopenFlags {
    match page_cache {
        PageCache::Keep => file_open_flags(),
        PageCache::Drop => FopenFlags::FOPEN_NOFLUSH,
        PageCache::Bypass => FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
    }
}

impl Filesystem for TierFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each setter refuses an out-of-range value and names the nearest valid one.
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        // The kernel offers its readahead window as the maximum; take all of it.
        if let Err(nearest) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(CONGESTION_THRESHOLD);

        let mut wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            // A symlink's target never changes (inode numbers are not reused).
            | InitFlags::FUSE_CACHE_SYMLINKS
            // Setuid and setgid are cleared by the core (`tierfs::vfs` `setid`), so the kernel
            // need not ask for `security.capability` before every write.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.opts.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        self.ask_passthrough(config);
        // add_capabilities is all-or-nothing, so ask for each flag on its own.
        for flag in wanted.iter() {
            if let Err(missing) = config.add_capabilities(flag) {
                if missing.contains(InitFlags::FUSE_WRITEBACK_CACHE) {
                    tracing::warn!("kernel lacks FUSE_WRITEBACK_CACHE; mount without the writeback cache");
                } else {
                    tracing::debug!(?missing, "kernel lacks a FUSE capability");
                }
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // Operations still running on the pool finish before the final sync.
        for pool in [&self.pool, &self.reaper].into_iter().flatten() {
            pool.shutdown();
        }
        if let Err(err) = self.vfs.sync_all() {
            tracing::error!(error = %err, "sync at unmount failed");
        }
    }

    /// A name that does not exist is answered as a negative entry (node id 0) the kernel may
    /// cache for the entry TTL: every create, link and rename into the directory passes through
    /// this mount and replaces it, and programs probe missing names again and again (`$PATH`
    /// searches, build tools, config-file probes).
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.time(FuseOp::Lookup, req, parent);
        match self.vfs.lookup(parent.0, name.as_bytes()) {
            Ok(attr) => self.reply_entry(reply, &attr),
            Err(VfsError::NotFound) => {
                reply.entry_with_ttls(&Duration::ZERO, &self.opts.entry_ttl, &file_attr(&Attr::gone(0)), GENERATION)
            }
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    /// Inodes have no in-memory lifetime in tierfs, so there is nothing to release.
    fn forget(&self, _req: &Request, _ino: INodeNo, _nlookup: u64) {}

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let t = self.time(FuseOp::Getattr, req, ino);
        match self.vfs.getattr(ino.0) {
            Ok(attr) => reply.attr(&self.opts.attr_ttl, &file_attr(&attr)),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let t = self.time(FuseOp::Setattr, req, ino);
        let changes = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(timestamp_from_kernel),
        };
        let (caller, ttl, fh) = (caller(req), self.opts.attr_ttl, fh.map(|fh| fh.0));
        let op = move |vfs: &Vfs| match vfs.setattr(&caller, ino.0, &changes, fh) {
            Ok(attr) => reply.attr(&ttl, &file_attr(&attr)),
            Err(err) => reply.error(t.fail(&err)),
        };
        // A truncate may fetch the chunk it cuts through from the store.
        self.offload_if(size.is_some(), op);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let t = self.time(FuseOp::Readlink, req, ino);
        match self.vfs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let t = self.time(FuseOp::Mknod, req, parent);
        let result = self.vfs.mknod(&caller(req), parent.0, name.as_bytes(), mode, umask, rdev);
        self.entry_result(t, result, reply);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let t = self.time(FuseOp::Mkdir, req, parent);
        let result = self.vfs.mkdir(&caller(req), parent.0, name.as_bytes(), mode, umask);
        self.entry_result(t, result, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Unlink, req, parent);
        self.removal_result(t, self.vfs.unlink_deferred(&caller(req), parent.0, name.as_bytes()), reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Rmdir, req, parent);
        empty_result(t, self.vfs.rmdir(&caller(req), parent.0, name.as_bytes()), reply);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let t = self.time(FuseOp::Symlink, req, parent);
        let target = target.as_os_str().as_bytes();
        let result = self.vfs.symlink(&caller(req), parent.0, link_name.as_bytes(), target);
        self.entry_result(t, result, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let t = self.time(FuseOp::Rename, req, parent);
        let flags = match rename_flags(flags.bits()) {
            Ok(flags) => flags,
            Err(errno) => return reply.error(t.errno(errno)),
        };
        let result =
            self.vfs.rename_deferred(&caller(req), parent.0, name.as_bytes(), newparent.0, newname.as_bytes(), flags);
        self.removal_result(t, result, reply);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let t = self.time(FuseOp::Link, req, ino);
        let result = self.vfs.link(&caller(req), ino.0, newparent.0, newname.as_bytes());
        self.entry_result(t, result, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let t = self.time(FuseOp::Open, req, ino);
        let caller = caller(req);
        let backings = Arc::clone(&self.backings);
        let op = move |vfs: &Vfs| match vfs.open_for(&caller, ino.0, flags.0) {
            Ok(opened) => reply_opened(vfs, &backings, ino, opened, reply),
            Err(err) => reply.error(t.fail(&err)),
        };
        // O_TRUNC truncates, which may fetch from the store (see `setattr`).
        self.offload_if(flags.0 & libc::O_TRUNC != 0, op);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let t = self.time(FuseOp::Read, req, ino);
        let op = move |vfs: &Vfs| match vfs.read_bytes(ino.0, fh.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(err) => reply.error(t.fail(&err)),
        };
        self.offload_if(self.vfs.may_wait(ino.0, offset, u64::from(size), false), op);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let t = self.time(FuseOp::Write, req, ino);
        // The writer lacks CAP_FSETID: setuid and setgid go before the bytes move.
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(err) = self.vfs.drop_setid(ino.0) {
                return reply.error(t.fail(&err));
            }
        }
        let result = move |vfs: &Vfs, data: &[u8], reply: ReplyWrite| match vfs.write(ino.0, fh.0, offset, data) {
            Ok(written) => reply.written(written),
            Err(err) => reply.error(t.fail(&err)),
        };
        if self.pool.is_some() && self.vfs.may_wait(ino.0, offset, data.len() as u64, true) {
            let data = data.to_vec(); // the request buffer is reused once this returns
            self.offload(move |vfs| result(vfs, &data, reply));
        } else {
            result(&self.vfs, data, reply);
        }
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Flush, req, ino);
        empty_result(t, self.vfs.flush(ino.0, fh.0), reply);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let t = self.time(FuseOp::Release, req, ino);
        let result = self.vfs.release(ino.0, fh.0);
        self.backings.release(fh.0);
        empty_result(t, result, reply);
    }

    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Fsync, req, ino);
        self.offload(move |vfs| empty_result(t, vfs.fsync(ino.0, fh.0, datasync), reply));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let t = self.time(FuseOp::Opendir, req, ino);
        match self.vfs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let t = self.time(FuseOp::Readdir, req, ino);
        match self.vfs.readdir(ino.0, fh.0, offset) {
            Ok(entries) => {
                for e in &entries {
                    if reply.add(INodeNo(e.ino), e.offset, file_type(e.kind), OsStr::from_bytes(&e.name)) {
                        break; // buffer full; the kernel resumes from the last cookie it got
                    }
                }
                reply.ok();
            }
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let t = self.time(FuseOp::Readdirplus, req, ino);
        match self.vfs.readdirplus(ino.0, fh.0, offset) {
            Ok(entries) => {
                let ttl = self.ttl();
                for (e, attr) in &entries {
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(INodeNo(e.ino), e.offset, name, &ttl, &file_attr(attr), GENERATION) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Releasedir, req, ino);
        empty_result(t, self.vfs.releasedir(ino.0, fh.0), reply);
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Fsyncdir, req, ino);
        self.offload(move |vfs| empty_result(t, vfs.fsyncdir(ino.0), reply));
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let t = self.time(FuseOp::Statfs, req, ino);
        match self.vfs.statfs() {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize),
            Err(err) => reply.error(t.fail(&err)),
        }
    }

    /// `position` is a macOS resource-fork offset; Linux always sends 0.
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let t = self.time(FuseOp::Setxattr, req, ino);
        empty_result(t, self.vfs.setxattr(&caller(req), ino.0, name.as_bytes(), value, flags), reply);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let t = self.time(FuseOp::Getxattr, req, ino);
        xattr_result(t, size, self.vfs.getxattr(ino.0, name.as_bytes()), reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let t = self.time(FuseOp::Listxattr, req, ino);
        xattr_result(t, size, self.vfs.listxattr(ino.0), reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Removexattr, req, ino);
        empty_result(t, self.vfs.removexattr(&caller(req), ino.0, name.as_bytes()), reply);
    }

    /// Not sent while `default_permissions` is on (the kernel checks), kept for completeness.
    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let t = self.time(FuseOp::Access, req, ino);
        empty_result(t, self.vfs.access(&caller(req), ino.0, mask.bits()), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let t = self.time(FuseOp::Create, req, parent);
        let created = self.vfs.create_open(&caller(req), parent.0, name.as_bytes(), (mode, umask), flags);
        self.created_result(t, created, reply);
    }

    /// `open(dir, O_TMPFILE)` (the vendored fuser's tmpfile operation): a new file with no
    /// name, answered as a create. The kernel checked write and search permission on `parent`.
    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let t = self.time(FuseOp::Tmpfile, req, parent);
        let created = self.vfs.tmpfile(&caller(req), parent.0, mode, umask, flags);
        self.created_result(t, created, reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (t, caller) = (self.time(FuseOp::Fallocate, req, ino), caller(req));
        let op = move |vfs: &Vfs| {
            vfs.drop_setid_for(&caller, ino.0).and_then(|()| vfs.fallocate(ino.0, fh.0, offset, length, mode))
        };
        self.offload(move |vfs| empty_result(t, op(vfs), reply));
    }

    /// The kernel sends only SEEK_DATA and SEEK_HOLE; it resolves the other whences itself.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let t = self.time(FuseOp::Ioctl, req, ino);
        if cmd != tierfs::vfs::IOCTL_KEEP_CACHED {
            return reply.error(t.errno(Errno::ENOTTY));
        }
        self.offload(move |vfs| match vfs.keep_cached(ino.0) {
            Ok(()) => reply.ioctl(0, &[]),
            Err(err) => reply.error(t.fail(&err)),
        });
    }

    fn lseek(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let t = self.time(FuseOp::Lseek, req, ino);
        // With the writeback cache, written bytes may still sit in the kernel's page cache, and
        // the kernel does not flush them before FUSE_LSEEK: the data file would report a hole
        // where the program just wrote, and `cp`/`tar` (which skip holes with SEEK_DATA) would
        // copy zeros. ENOSYS makes the kernel answer from its own size instead: the whole
        // file is data, which POSIX allows and never skips a byte.
        if self.opts.writeback_cache {
            return reply.error(t.errno(Errno::ENOSYS));
        }
        // SEEK_DATA/SEEK_HOLE may fetch the file's evicted chunks.
        self.offload(move |vfs| match vfs.lseek(ino.0, fh.0, offset, whence) {
            Ok(offset) => reply.offset(offset),
            Err(err) => reply.error(t.fail(&err)),
        });
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let t = self.time(FuseOp::CopyFileRange, req, ino_in);
        // copy_file_range(2) defines no flags yet.
        if !flags.is_empty() {
            return reply.error(t.errno(Errno::EINVAL));
        }
        // A short copy is allowed; the caller loops.
        let len = len.min(u64::from(MAX_COPY));
        let caller = caller(req);
        self.offload(move |vfs| {
            let copy =
                |vfs: &Vfs| vfs.copy_file_range(ino_in.0, fh_in.0, offset_in, ino_out.0, fh_out.0, offset_out, len);
            match vfs.drop_setid_for(&caller, ino_out.0).and_then(|()| copy(vfs)) {
                Ok(copied) => reply.written(u32::try_from(copied).unwrap_or(MAX_COPY)),
                Err(err) => reply.error(t.fail(&err)),
            }
        });
    }
}
