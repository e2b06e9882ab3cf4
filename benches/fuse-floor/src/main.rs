//! `tierfs-fuse-floor MOUNTPOINT`: a benchmark peer, not part of tierfs.
//!
//! An in-memory FUSE filesystem that does as little as a filesystem can: one map of inodes
//! behind one lock, no disk, no durability. It mounts with tierfs's FUSE settings (one
//! request thread, `default_permissions`, 60 s attribute and entry TTLs, the same INIT flags,
//! 1 MiB writes, no writeback cache, `FOPEN_KEEP_CACHE | FOPEN_NOFLUSH`) so the kernel sends it
//! the same requests it sends tierfs. Its rates in `benches/compare.sh` are the most any FUSE
//! filesystem with those settings reaches on the machine: the round trips through the kernel
//! and fuser are all it pays. Serves in the foreground until unmounted; everything is lost
//! then. Supports what the benchmark workloads use (files, directories, symlinks, hard links,
//! rename, attributes, reads and writes); xattrs are absent (ENODATA), locks stay in the kernel.
//! Knobs for what-if runs (environment): `FLOOR_THREADS=N` request threads, `FLOOR_WRITEBACK=1`
//! the writeback cache, `FLOOR_NO_DEFAULT_PERMISSIONS=1` no kernel permission checks, and
//! `FLOOR_LOG=PATH`: every namespace or attribute change (create, mknod, mkdir, symlink, link,
//! unlink, rmdir, rename, setattr) appends a 256-byte record to PATH with one `write(2)` before
//! it is answered, which is what tierfs's promise that an acknowledged change survives
//! `kill -9` costs at the least (tierfs writes RocksDB's log the same way, one `write(2)` per
//! change). Data writes are not logged.
//!
//! Two more what-ifs put RocksDB, tierfs's metadata store, under the same floor (issue 48
//! item 3 asks whether a namespace served from memory reaches 0.9x of the floor on one CPU):
//! `FLOOR_ROCKS=DIR` writes each change as one RocksDB batch of [`keys_per_change`] keys (WAL
//! on, no sync: `MetaStore`'s settings) before it is answered; `FLOOR_ROCKS=DIR` with
//! `FLOOR_LOG=PATH` keeps the `write(2)` inline and writes RocksDB *behind*: a thread wakes
//! every few milliseconds and applies what has queued as one batch, with RocksDB's own WAL
//! off (the log is the durability). The namespace is served from the in-memory map in all of them.
//!
//! `FLOOR_PASSTHROUGH=DIR` (root): every regular file's bytes live in `DIR/<inode>` and every
//! open of one is answered with FUSE passthrough to that file (as tierfs opens a hot file), so
//! reads, writes and mmap go to it inside the kernel; `getattr` and lookups report its size
//! and mtime, and the last unlink of a file removes it. What passthrough costs here is the
//! kernel's, not a filesystem's. The floor asks for `FUSE_HANDLE_KILLPRIV_V2`, as tierfs does,
//! so the kernel marks inodes `S_NOSEC` and sends no `getxattr` of `security.capability`
//! before each write (a floor clears no setuid bit itself).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};

const TTL: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
const MAX_WRITE: u32 = 1 << 20;

struct Node {
    attr: FileAttr,
    /// Directory entries (directories only).
    children: BTreeMap<OsString, u64>,
    /// File contents, or a symlink's target.
    data: Vec<u8>,
}

/// One directory entry as `readdir` returns it: inode, kind, name.
type DirEntry = (u64, FileType, OsString);

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    /// Open directory handles: the listing `opendir` took, which `readdir` pages through by
    /// index, so listing a directory of n entries costs O(n) in all (as a filesystem with a
    /// directory index does), not O(n) per `readdir` call.
    dirs: HashMap<u64, Vec<DirEntry>>,
    next_fh: u64,
    /// Regular files whose last name went, for `FLOOR_PASSTHROUGH` to remove their backing
    /// files (`None` without it: nothing is kept).
    freed: Option<Vec<u64>>,
}

struct Floor {
    state: Mutex<State>,
    /// `FLOOR_WRITEBACK=1`: ask for the kernel's writeback cache (tierfs's `--writeback-cache`).
    writeback: bool,
    /// `FLOOR_LOG=PATH`: the log each change is appended to (written under `state`'s lock, so
    /// in the order the changes were made).
    log: Option<Mutex<File>>,
    /// `FLOOR_ROCKS=DIR`: where each change's keys go, inline or behind (see the module doc).
    rocks: Option<Rocks>,
    /// `FLOOR_PASSTHROUGH=DIR`: the backing files, and the kernel's id for each inode open.
    passthrough: Option<Passthrough>,
}

/// Regular files kept in backing files and opened with FUSE passthrough.
struct Passthrough {
    dir: PathBuf,
    /// Per inode with handles open: its backing id and how many handles hold it.
    open: Mutex<HashMap<u64, (Arc<fuser::BackingId>, u32)>>,
    /// Open handle to its inode.
    handles: Mutex<HashMap<u64, u64>>,
    next_fh: std::sync::atomic::AtomicU64,
}

impl Passthrough {
    fn path(&self, ino: u64) -> PathBuf {
        self.dir.join(ino.to_string())
    }

    /// The backing id of `ino` for a new handle (registering its file when no handle holds
    /// one), and the handle.
    fn acquire(
        &self,
        ino: u64,
        truncate: bool,
        register: impl FnOnce(&File) -> std::io::Result<fuser::BackingId>,
    ) -> std::io::Result<(Arc<fuser::BackingId>, FileHandle)> {
        let file = File::options().read(true).write(true).create(true).truncate(truncate).open(self.path(ino))?;
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = match open.get_mut(&ino) {
            Some((id, handles)) => {
                *handles += 1;
                Arc::clone(id)
            }
            None => {
                let id = Arc::new(register(&file)?);
                open.insert(ino, (Arc::clone(&id), 1));
                id
            }
        };
        let fh = self.next_fh.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.handles.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(fh, ino);
        Ok((id, FileHandle(fh)))
    }

    fn release(&self, fh: FileHandle) {
        let Some(ino) = self.handles.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&fh.0) else {
            return;
        };
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, handles)) = open.get_mut(&ino) {
            *handles -= 1;
            if *handles == 0 {
                open.remove(&ino);
            }
        }
    }

    /// `attr` with the backing file's size and mtime, when it has one.
    fn attr(&self, mut attr: FileAttr) -> FileAttr {
        if attr.kind == FileType::RegularFile
            && let Ok(meta) = std::fs::metadata(self.path(attr.ino.0))
        {
            attr.size = meta.len();
            attr.blocks = meta.len().div_ceil(512);
            attr.mtime = meta.modified().unwrap_or(attr.mtime);
        }
        attr
    }
}

/// RocksDB under the floor: written inline with each change, or by a thread behind the log.
enum Rocks {
    Inline(rocksdb::DB),
    Behind(Arc<Mutex<Vec<Change>>>),
}

/// One change as the RocksDB side sees it: its op letter, inode and name.
type Change = (u8, u64, OsString);

/// Keys a change writes, about as many as tierfs's namespace batch for it has: a create or
/// other new name the inode, the entry and the parent's times; a rename the two entries, the
/// inode's ctime and a parent; a removal the entry, the inode and the parent; a setattr the
/// inode.
fn keys_per_change(op: u8) -> u8 {
    match op {
        b'a' => 1,
        b'm' => 4,
        _ => 3,
    }
}

/// Bytes of each value written: about an encoded inode record.
const ROCKS_VALUE: usize = 120;

/// Adds the keys of one change to `batch`.
fn put_change(batch: &mut rocksdb::WriteBatch, (op, ino, name): &Change) {
    let value = [*op; ROCKS_VALUE];
    for k in 0..keys_per_change(*op) {
        let mut key = Vec::with_capacity(10 + name.len());
        key.push(b'A' + k);
        key.extend_from_slice(&ino.to_be_bytes());
        key.extend_from_slice(name.as_bytes());
        batch.put(&key, value);
    }
}

fn open_rocks(dir: &OsStr) -> rocksdb::DB {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.increase_parallelism(2);
    opts.set_max_background_jobs(2);
    rocksdb::DB::open(&opts, dir).unwrap_or_else(|err| {
        eprintln!("tierfs-fuse-floor: FLOOR_ROCKS {}: {err}", Path::new(dir).display());
        std::process::exit(1);
    })
}

/// How often the writer behind the log wakes to apply what has queued: no change wakes it,
/// so a change costs its queueing and its share of one batch.
const BEHIND_EVERY: Duration = Duration::from_millis(5);

/// The writer behind the log: every [`BEHIND_EVERY`] applies every change that has queued as
/// one batch, with RocksDB's WAL off, for as long as the process lives.
fn write_behind(db: &rocksdb::DB, queue: &Mutex<Vec<Change>>) {
    let mut no_wal = rocksdb::WriteOptions::default();
    no_wal.disable_wal(true);
    loop {
        std::thread::sleep(BEHIND_EVERY);
        let changes = std::mem::take(&mut *queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        if changes.is_empty() {
            continue;
        }
        let mut batch = rocksdb::WriteBatch::default();
        for change in &changes {
            put_change(&mut batch, change);
        }
        if let Err(err) = db.write_opt(batch, &no_wal) {
            eprintln!("tierfs-fuse-floor: RocksDB behind the log: {err}");
        }
    }
}

/// Bytes per log record: about what one namespace change adds to tierfs's RocksDB log.
const LOG_RECORD: usize = 256;

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl State {
    fn node(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        let dir = self.nodes.get(&parent).ok_or(Errno::ENOENT)?;
        if dir.attr.kind != FileType::Directory {
            return Err(Errno::ENOTDIR);
        }
        dir.children.get(name).copied().ok_or(Errno::ENOENT)
    }

    fn touch_dir(&mut self, ino: u64) -> Result<(), Errno> {
        let now = SystemTime::now();
        let dir = self.node(ino)?;
        dir.attr.mtime = now;
        dir.attr.ctime = now;
        Ok(())
    }

    /// Adds a new inode named `name` in `parent`.
    fn make(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        kind: FileType,
        mode: u32,
        data: Vec<u8>,
    ) -> Result<FileAttr, Errno> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        if self.child(parent, name).is_ok() {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let mut attr = new_attr(ino, kind, (mode & 0o7777) as u16, req.uid(), req.gid());
        attr.size = data.len() as u64;
        self.nodes.insert(ino, Node { attr, children: BTreeMap::new(), data });
        if kind == FileType::Directory {
            self.node(parent)?.attr.nlink += 1;
        }
        self.node(parent)?.children.insert(name.to_owned(), ino);
        self.touch_dir(parent)?;
        Ok(attr)
    }

    /// Drops one link to `ino`; the inode goes with its last link.
    fn drop_link(&mut self, ino: u64) -> Result<(), Errno> {
        let node = self.node(ino)?;
        node.attr.ctime = SystemTime::now();
        node.attr.nlink = node.attr.nlink.saturating_sub(if node.attr.kind == FileType::Directory { 2 } else { 1 });
        if node.attr.nlink == 0 {
            if let (FileType::RegularFile, Some(freed)) = (node.attr.kind, &mut self.freed) {
                freed.push(ino);
            }
            self.nodes.remove(&ino);
        }
        Ok(())
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        let node = self.node(ino)?;
        match (dir, node.attr.kind == FileType::Directory) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) if !node.children.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.node(parent)?.children.remove(name);
        if dir {
            self.node(parent)?.attr.nlink -= 1;
        }
        self.touch_dir(parent)?;
        self.drop_link(ino)
    }

    fn rename(&mut self, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        let is_dir = self.node(ino)?.attr.kind == FileType::Directory;
        if let Ok(target) = self.child(newparent, newname) {
            if target == ino {
                return Ok(());
            }
            self.remove(newparent, newname, is_dir)?;
        }
        self.node(parent)?.children.remove(name);
        self.node(newparent)?.children.insert(newname.to_owned(), ino);
        if is_dir && parent != newparent {
            self.node(parent)?.attr.nlink -= 1;
            self.node(newparent)?.attr.nlink += 1;
        }
        self.touch_dir(parent)?;
        self.touch_dir(newparent)?;
        self.node(ino)?.attr.ctime = SystemTime::now();
        Ok(())
    }
}

impl Floor {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Errno>) -> Result<T, Errno> {
        match self.state.lock() {
            Ok(mut state) => f(&mut state),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    /// [`Floor::with`] for a change: on success, one record naming `op`, `ino` and `name` is
    /// appended to the log (when there is one) before the result is returned.
    fn changed<T>(
        &self,
        op: u8,
        ino: u64,
        name: &OsStr,
        f: impl FnOnce(&mut State) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        if self.log.is_none() && self.rocks.is_none() {
            return self.with(f);
        }
        let mut log = self.log.as_ref().map(|log| log.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let out = self.with(f)?;
        if let Some(log) = &mut log {
            let mut record = [0u8; LOG_RECORD];
            record[0] = op;
            record[1..9].copy_from_slice(&ino.to_le_bytes());
            let name = &name.as_bytes()[..name.len().min(LOG_RECORD - 9)];
            record[9..9 + name.len()].copy_from_slice(name);
            log.write_all(&record).map_err(Errno::from)?;
        }
        match &self.rocks {
            None => {}
            Some(Rocks::Inline(db)) => {
                let mut batch = rocksdb::WriteBatch::default();
                put_change(&mut batch, &(op, ino, name.to_owned()));
                db.write(batch).map_err(|_| Errno::EIO)?;
            }
            Some(Rocks::Behind(queue)) => {
                queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((op, ino, name.to_owned()));
            }
        }
        Ok(out)
    }

    fn entry(&self, reply: ReplyEntry, result: Result<FileAttr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&TTL, &self.attr(attr), Generation(0)),
            Err(err) => reply.error(err),
        }
    }

    /// Removes the backing files of the regular files whose last name went (`FLOOR_PASSTHROUGH`;
    /// an open handle keeps reading and writing its file), as tierfs removes a data file.
    fn reap(&self) {
        let Some(pt) = &self.passthrough else { return };
        let freed = self.with(|s| Ok(s.freed.as_mut().map(std::mem::take).unwrap_or_default())).unwrap_or_default();
        for ino in freed {
            let _ = std::fs::remove_file(pt.path(ino));
        }
    }

    /// `attr` as the kernel is told it: with `FLOOR_PASSTHROUGH`, a file's size and mtime are
    /// its backing file's.
    fn attr(&self, attr: FileAttr) -> FileAttr {
        self.passthrough.as_ref().map_or(attr, |pt| pt.attr(attr))
    }
}

fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(err) => reply.error(err),
    }
}

fn open_flags() -> FopenFlags {
    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
}

impl Filesystem for Floor {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(nearest);
        }
        let mut wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if self.writeback {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        for flag in wanted.iter() {
            let _ = config.add_capabilities(flag);
        }
        if self.passthrough.is_some() {
            config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).map_err(|_| {
                std::io::Error::other("FLOOR_PASSTHROUGH: the kernel lacks FUSE passthrough (Linux 6.9 or later)")
            })?;
            let _ = config.set_max_stack_depth(1);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.with(|s| {
            let ino = s.child(parent.0, name)?;
            Ok(s.node(ino)?.attr)
        }) {
            Ok(attr) => reply.entry(&TTL, &self.attr(attr), Generation(0)),
            Err(err) if err == Errno::ENOENT => {
                let gone = new_attr(0, FileType::RegularFile, 0, 0, 0);
                reply.entry_with_ttls(&Duration::ZERO, &TTL, &gone, Generation(0))
            }
            Err(err) => reply.error(err),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|s| Ok(s.node(ino.0)?.attr)) {
            Ok(attr) => reply.attr(&TTL, &self.attr(attr)),
            Err(err) => reply.error(err),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.changed(b'a', ino.0, OsStr::new(""), |s| {
            let node = s.node(ino.0)?;
            let a = &mut node.attr;
            if let Some(mode) = mode {
                a.perm = (mode & 0o7777) as u16;
            }
            a.uid = uid.unwrap_or(a.uid);
            a.gid = gid.unwrap_or(a.gid);
            if let Some(size) = size {
                if let Some(pt) = &self.passthrough {
                    File::options().write(true).create(true).truncate(false).open(pt.path(ino.0))?.set_len(size)?;
                }
                node.data.resize(usize::try_from(size).map_err(|_| Errno::EFBIG)?, 0);
                node.attr.size = size;
                node.attr.mtime = SystemTime::now();
            }
            let a = &mut node.attr;
            if let Some(t) = atime {
                a.atime = time(t);
            }
            if let Some(t) = mtime {
                a.mtime = time(t);
            }
            a.ctime = SystemTime::now();
            Ok(*a)
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &self.attr(attr)),
            Err(err) => reply.error(err),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.with(|s| Ok(s.node(ino.0)?.data.clone())) {
            Ok(target) => reply.data(&target),
            Err(err) => reply.error(err),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::RegularFile,
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            _ => return reply.error(Errno::EPERM),
        };
        self.entry(
            reply,
            self.changed(b'n', parent.0, name, |s| s.make(req, parent.0, name, kind, mode & !umask, Vec::new())),
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        self.entry(
            reply,
            self.changed(b'd', parent.0, name, |s| {
                s.make(req, parent.0, name, FileType::Directory, mode & !umask, Vec::new())
            }),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = self.changed(b'u', parent.0, name, |s| s.remove(parent.0, name, false));
        self.reap();
        empty(reply, result);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.changed(b'r', parent.0, name, |s| s.remove(parent.0, name, true)));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let target = target.as_os_str().as_bytes().to_vec();
        self.entry(
            reply,
            self.changed(b's', parent.0, link_name, |s| {
                s.make(req, parent.0, link_name, FileType::Symlink, 0o777, target)
            }),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let result = self.changed(b'm', parent.0, name, |s| s.rename(parent.0, name, newparent.0, newname));
        self.reap();
        empty(reply, result);
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.entry(
            reply,
            self.changed(b'l', newparent.0, newname, |s| {
                if s.child(newparent.0, newname).is_ok() {
                    return Err(Errno::EEXIST);
                }
                s.node(newparent.0)?.children.insert(newname.to_owned(), ino.0);
                s.touch_dir(newparent.0)?;
                let node = s.node(ino.0)?;
                node.attr.nlink += 1;
                node.attr.ctime = SystemTime::now();
                Ok(node.attr)
            }),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let result = self.with(|s| {
            let node = s.node(ino.0)?;
            if flags.0 & libc::O_TRUNC != 0 {
                node.data.clear();
                node.attr.size = 0;
            }
            Ok(())
        });
        if let (Ok(()), Some(pt)) = (&result, &self.passthrough) {
            let truncate = flags.0 & libc::O_TRUNC != 0;
            return match pt.acquire(ino.0, truncate, |file| reply.open_backing(file)) {
                Ok((id, fh)) => reply.opened_passthrough(fh, FopenFlags::FOPEN_NOFLUSH, &id),
                Err(err) => reply.error(Errno::from(err)),
            };
        }
        match result {
            Ok(()) => reply.opened(FileHandle(0), open_flags()),
            Err(err) => reply.error(err),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let result = self.with(|s| {
            let data = &s.node(ino.0)?.data;
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
            let end = start.saturating_add(size as usize).min(data.len());
            Ok(data[start..end].to_vec())
        });
        match result {
            Ok(data) => reply.data(&data),
            Err(err) => reply.error(err),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.with(|s| {
            let node = s.node(ino.0)?;
            let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
            let end = start.checked_add(data.len()).ok_or(Errno::EFBIG)?;
            if node.data.len() < end {
                node.data.resize(end, 0);
            }
            node.data[start..end].copy_from_slice(data);
            node.attr.size = node.data.len() as u64;
            node.attr.blocks = node.attr.size.div_ceil(512);
            let now = SystemTime::now();
            node.attr.mtime = now;
            node.attr.ctime = now;
            Ok(data.len() as u32)
        });
        match result {
            Ok(n) => reply.written(n),
            Err(err) => reply.error(err),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(pt) = &self.passthrough {
            pt.release(fh);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let result = self.with(|s| {
            let dir = s.nodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            let mut entries = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (ino.0, FileType::Directory, OsString::from("..")),
            ];
            for (name, &child) in &dir.children {
                let kind = s.nodes.get(&child).map_or(FileType::RegularFile, |n| n.attr.kind);
                entries.push((child, kind, name.clone()));
            }
            s.next_fh += 1;
            s.dirs.insert(s.next_fh, entries);
            Ok(s.next_fh)
        });
        match result {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(err) => reply.error(err),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let result = self.with(|s| {
            let entries = s.dirs.get(&fh.0).ok_or(Errno::EBADF)?;
            let skip = usize::try_from(offset).unwrap_or(usize::MAX);
            for (i, (child, kind, name)) in entries.iter().enumerate().skip(skip) {
                if reply.add(INodeNo(*child), (i + 1) as u64, *kind, name) {
                    break;
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(err) => reply.error(err),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        empty(
            reply,
            self.with(|s| {
                s.dirs.remove(&fh.0);
                Ok(())
            }),
        );
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 30, 1 << 29, 1 << 29, 1 << 24, 1 << 23, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 { reply.size(0) } else { reply.data(&[]) }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.changed(b'c', parent.0, name, |s| {
            s.make(req, parent.0, name, FileType::RegularFile, mode & !umask, Vec::new())
        }) {
            Ok(attr) => match &self.passthrough {
                None => reply.created(&TTL, &attr, Generation(0), FileHandle(0), open_flags()),
                Some(pt) => match pt.acquire(attr.ino.0, true, |file| reply.open_backing(file)) {
                    Ok((id, fh)) => {
                        reply.created_passthrough(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_NOFLUSH, &id);
                    }
                    Err(err) => reply.error(Errno::from(err)),
                },
            },
            Err(err) => reply.error(err),
        }
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let (Some(mountpoint), None) = (args.next(), args.next()) else {
        eprintln!("usage: tierfs-fuse-floor MOUNTPOINT   (serves in the foreground until unmounted)");
        std::process::exit(2);
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let root =
        Node { attr: new_attr(ROOT, FileType::Directory, 0o755, uid, 0), children: BTreeMap::new(), data: Vec::new() };
    let rocks = std::env::var_os("FLOOR_ROCKS").map(|dir| {
        let db = open_rocks(&dir);
        if std::env::var_os("FLOOR_LOG").is_none() {
            return Rocks::Inline(db);
        }
        let queue = Arc::new(Mutex::new(Vec::new()));
        let behind = Arc::clone(&queue);
        std::thread::spawn(move || write_behind(&db, &behind));
        Rocks::Behind(queue)
    });
    let floor = Floor {
        state: Mutex::new(State {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            dirs: HashMap::new(),
            next_fh: 0,
            freed: std::env::var_os("FLOOR_PASSTHROUGH").map(|_| Vec::new()),
        }),
        writeback: env_flag("FLOOR_WRITEBACK"),
        log: match std::env::var_os("FLOOR_LOG") {
            None => None,
            Some(path) => match File::options().create(true).append(true).open(&path) {
                Ok(file) => Some(Mutex::new(file)),
                Err(err) => {
                    eprintln!("tierfs-fuse-floor: FLOOR_LOG {}: {err}", Path::new(&path).display());
                    std::process::exit(1);
                }
            },
        },
        rocks,
        passthrough: std::env::var_os("FLOOR_PASSTHROUGH").map(|dir| Passthrough {
            dir: PathBuf::from(dir),
            open: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: std::sync::atomic::AtomicU64::new(1),
        }),
    };
    let mut config = Config::default();
    // FLOOR_THREADS=N: request threads (tierfs's `--threads`, default 1).
    let threads = std::env::var("FLOOR_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1usize).max(1);
    config.n_threads = Some(threads);
    config.clone_fd = threads > 1;
    config.mount_options =
        vec![MountOption::FSName("fuse-floor".to_owned()), MountOption::Subtype("fuse-floor".to_owned())];
    // FLOOR_NO_DEFAULT_PERMISSIONS=1: no kernel permission checks (and none here: a
    // what-if for the cost of `default_permissions`, which tierfs needs).
    if !env_flag("FLOOR_NO_DEFAULT_PERMISSIONS") {
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    if uid == 0 {
        config.acl = SessionACL::All;
    }
    if let Err(err) = fuser::mount(floor, &mountpoint, &config) {
        eprintln!("tierfs-fuse-floor: mount {}: {err}", Path::new(&mountpoint).display());
        std::process::exit(1);
    }
}
