//! POSIX semantics over inode numbers: the filesystem every front end (FUSE, tests) drives.
//!
//! `Vfs` turns each POSIX operation into one atomic metadata batch ([`crate::meta`]) plus, for
//! file contents, positional I/O on the hot tier's data files ([`crate::tier`]).
//!
//! Concurrency and invariants:
//! - namespace operations (create, link, unlink, rename, ...) serialise on one mutex, so a
//!   rename's checks and its batch see one consistent tree; they are metadata-only and short;
//! - an inode's record is read-modified-written under one of [`STRIPES`] striped locks
//!   (lock order: namespace, then stripes in ascending index, then the open-file table);
//! - reads and writes take no lock on the data itself: `pread`/`pwrite` on the data file, then
//!   (for a write that extends the file) a size update under the inode's stripe;
//! - the kernel checks permissions (`default_permissions`); this layer enforces what the
//!   kernel leaves to filesystems: name length, directory emptiness, link and rename rules,
//!   setgid-directory inheritance, xattr namespaces (clearing setuid on write is the kernel's);
//! - an inode unlinked while open becomes an *orphan* (marked in the same batch) and is
//!   reclaimed on its last release, or at the next start after a crash;
//! - errors are [`VfsError`]s; `VfsError::errno` is the single errno mapping.

mod adopt;
pub mod error;
pub mod types;

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::meta::{InodeRecord, MetaBatch, MetaStore};
use crate::tier::{BlockStore, ColdConfig, ColdStats, ColdTier, DataDirLock, DataFile, HotTier, HotTierError};
pub use adopt::Content;
pub use error::{VfsError, VfsResult};
pub use types::*;

/// Number of striped inode locks. A power of two well above the FUSE worker count, so two
/// busy inodes rarely share a stripe.
pub const STRIPES: usize = 64;

/// `ioctl(fd, IOCTL_KEEP_CACHED)` on a file of a tierfs mount (`_IO(0xB7, 1)`): its reads are
/// cached from now on (until the mount ends) even if it is larger than the stream limit.
/// `tierfs warmup` uses it, so that warming up a big file really fills the cache.
pub const IOCTL_KEEP_CACHED: u32 = 0xB701;

/// Most entries one readdir call returns: more than a kernel reply buffer holds, so each call
/// fills one reply, and a listing of n entries costs O(n) rather than O(n²).
const READDIR_BATCH: usize = 512;
/// The same for readdirplus, where each entry costs a metadata read and is ~4x larger.
const READDIRPLUS_BATCH: usize = 128;

/// Largest xattr value (Linux XATTR_SIZE_MAX).
const XATTR_SIZE_MAX: usize = 65536;
/// Largest file size tierfs supports: 16 TiB less 4 KiB, what ext4 (with 4 KiB blocks, the
/// usual data-dir filesystem) can hold in one data file. One limit everywhere, so a
/// workspace restores on any node whatever its data dir's filesystem; a truncate, write,
/// fallocate or copy past it fails with EFBIG before anything is touched
/// (docs/SEMANTICS.md, "Limits").
pub const MAX_FILE_SIZE: u64 = (16 << 40) - 4096;

/// How to open a workspace's local state.
#[derive(Debug, Clone)]
pub struct VfsConfig {
    /// Directory for the hot tier and the metadata store; created if missing.
    pub data_dir: PathBuf,
    /// True when the kernel keeps mtime/ctime for written files (FUSE writeback cache): then
    /// `write` must not set them, or a late writeback would overwrite a later `utimensat`.
    pub kernel_owns_times: bool,
    /// Hot-tier size limit in bytes (enforced by eviction when a store is attached).
    pub cache_size: Option<u64>,
    /// The store behind the cold tier; without one, everything stays on the hot tier.
    pub store: Option<AttachedStore>,
    /// With a store and a journaling metadata store: fsync returns only once the file's data
    /// and the metadata to find it are in the store (`--fsync=remote`), failing after this
    /// long. `None`: fsync is local (`--fsync=local`).
    pub fsync_remote: Option<std::time::Duration>,
    /// Free disk space that writes leave for the metadata store (`--reserve`); writes that
    /// would take it fail with ENOSPC while unlink, rename and truncate keep working.
    pub reserve: u64,
}

/// A store for the cold tier, with its tuning.
#[derive(Clone)]
pub struct AttachedStore {
    pub store: Arc<dyn BlockStore>,
    pub config: ColdConfig,
}

impl std::fmt::Debug for AttachedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedStore").field("config", &self.config).finish_non_exhaustive()
    }
}

impl VfsConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> VfsConfig {
        VfsConfig {
            data_dir: data_dir.into(),
            kernel_owns_times: false,
            cache_size: None,
            store: None,
            fsync_remote: None,
            reserve: crate::tier::DEFAULT_RESERVE,
        }
    }
}

/// Numbers for `tierfs status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfsStats {
    pub inodes: u64,
    pub open_files: u64,
    pub data_bytes: u64,
    pub cache_size: Option<u64>,
    pub data_dir: PathBuf,
    /// Free bytes on the data dir's disk (`statvfs` f_bavail; 0 if it failed).
    pub disk_free: u64,
    /// Of those, what writes leave for the metadata (`--reserve`).
    pub reserve: u64,
    /// The cold tier's numbers, when a store is attached.
    pub cold: Option<ColdStats>,
}

/// An open regular file: its data file (opened on first use, so creating and closing an
/// empty file costs no data-file syscalls) and how many handles share it.
struct OpenInode {
    file: Mutex<Option<Arc<File>>>,
    handles: AtomicU64,
    /// Whether the data file's directory entry is known to be on disk (fsynced once).
    dir_synced: AtomicBool,
    /// Set when the last link went while the file was open: reclaim at the last release.
    orphaned: AtomicBool,
}

/// The data file of an inode that an unlink or rename just freed, still to be removed.
///
/// The metadata batch that freed the inode is already committed, so the removal can wait
/// until the kernel has its reply: the mount replies first and then calls
/// [`finish`](Self::finish), on its reaper thread when it has one. Removing a data file whose ext4
/// inode is no longer cached costs a disk read (unlinks in an `rm -rf` of a tree gone cold
/// took 154 us instead of 35 us), which neither the program nor the next request then waits
/// for. Inode numbers are never reused, so a late removal cannot hit a newer file. Dropped
/// unfinished, the data file stays behind as a leftover (as after a crash between the two
/// steps), never as lost data, until [`Vfs::sweep_leftover_data_files`].
#[must_use = "finish() removes the freed inode's data file"]
#[derive(Debug)]
pub struct DataFileRemoval {
    /// The freed inode and its size (at 0 its data file, if it has one, holds nothing).
    freed: Option<(Ino, u64)>,
}

impl DataFileRemoval {
    /// Whether the operation freed a data file, i.e. [`finish`](Self::finish) has work.
    pub fn is_needed(&self) -> bool {
        self.freed.is_some()
    }

    /// Whether the freed file was empty: then its data file, if it ever got one, holds no
    /// blocks, and removing it is one cheap `unlink` (most often of a name that does not
    /// exist: an empty file never written has no data file), not worth a hand-off.
    pub fn was_empty(&self) -> bool {
        self.freed.is_none_or(|(_, size)| size == 0)
    }

    /// Removes the data file from `vfs`'s hot tier, if the operation freed one.
    pub fn finish(self, vfs: &Vfs) -> VfsResult<()> {
        let Some((ino, _)) = self.freed else { return Ok(()) };
        let removed = vfs.hot.remove(ino);
        vfs.pending_removals.fetch_sub(1, Ordering::Release);
        Ok(removed?)
    }
}

/// The filesystem of one workspace on this node.
pub struct Vfs {
    config: VfsConfig,
    meta: Arc<MetaStore>,
    hot: Arc<HotTier>,
    cold: Option<Arc<ColdTier>>,
    namespace: Mutex<()>,
    stripes: Vec<Mutex<()>>,
    next_ino: AtomicU64,
    inode_count: AtomicU64,
    /// Data files freed by committed unlinks and renames whose removal has not finished yet
    /// (see [`DataFileRemoval`]): a write that finds the disk full waits for them.
    pending_removals: AtomicU64,
    open: RwLock<HashMap<Ino, Arc<OpenInode>>>,
    dir_handles: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    // Declared last so it is released only after the store is closed.
    _lock: DataDirLock,
}

fn check_name(name: &[u8]) -> VfsResult<()> {
    if name.len() > NAME_MAX {
        return Err(VfsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(VfsError::Invalid("file name"));
    }
    Ok(())
}

impl Vfs {
    /// Opens the workspace in `config.data_dir`, creating it (with an empty root) if new, and
    /// reclaims inodes orphaned by a crash. Refuses a data directory another process uses.
    pub fn new(config: VfsConfig) -> VfsResult<Vfs> {
        let prepared = Vfs::prepare(&config.data_dir)?;
        Vfs::from_prepared(config, prepared)
    }

    /// The first half of [`Vfs::new`]: locks the data directory and opens its metadata store,
    /// so a caller can restore or check it (remote metadata) before the workspace is served.
    pub fn prepare(dir: &std::path::Path) -> VfsResult<Prepared> {
        std::fs::create_dir_all(dir).map_err(|source| HotTierError::Io { op: "create", path: dir.into(), source })?;
        let lock = DataDirLock::acquire(dir, "")?;
        let meta = Arc::new(MetaStore::open(&dir.join("meta"))?);
        Ok(Prepared { lock, meta })
    }

    /// The second half of [`Vfs::new`], on a directory [`Vfs::prepare`] opened.
    pub fn from_prepared(config: VfsConfig, prepared: Prepared) -> VfsResult<Vfs> {
        let Prepared { lock, meta } = prepared;
        let dir = &config.data_dir;
        let hot = Arc::new(HotTier::open(dir, config.reserve)?);
        let vfs = Vfs {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            next_ino: AtomicU64::new(meta.next_ino()?.unwrap_or(ROOT_INO + 1)),
            inode_count: AtomicU64::new(0),
            pending_removals: AtomicU64::new(0),
            namespace: Mutex::new(()),
            open: RwLock::new(HashMap::new()),
            dir_handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            cold: None,
            config,
            meta,
            hot,
            _lock: lock,
        };
        let mut vfs = vfs;
        if vfs.meta.inode(ROOT_INO)?.is_none() {
            let now = Timestamp::now();
            // SAFETY: geteuid/getegid cannot fail.
            let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
            let root = InodeRecord {
                attr: Attr {
                    ino: ROOT_INO,
                    kind: FileKind::Dir,
                    perm: 0o755,
                    nlink: 2,
                    uid,
                    gid,
                    rdev: 0,
                    size: 0,
                    blocks: 0,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    crtime: now,
                },
                parent: ROOT_INO,
                dense: false,
                no_xattrs: true,
            };
            let mut b = MetaBatch::new();
            b.put_inode(&root);
            b.put_next_ino(ROOT_INO + 1);
            vfs.meta.commit(b)?;
            vfs.meta.sync()?;
        }
        for ino in vfs.meta.orphans()? {
            vfs.reclaim(ino)?;
        }
        vfs.inode_count.store(vfs.meta.count_inodes()?, Ordering::Relaxed);
        if let Some(att) = vfs.config.store.clone() {
            vfs.cold = Some(ColdTier::start(att.store, vfs.meta.clone(), vfs.hot.clone(), att.config)?);
        }
        Ok(vfs)
    }

    fn stripe(&self, ino: Ino) -> usize {
        (ino as usize) % STRIPES
    }

    /// Locks the stripes of `inos` in ascending order (each stripe once).
    fn lock_inodes(&self, inos: &[Ino]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = inos.iter().map(|&i| self.stripe(i)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.stripes[i].lock()).collect()
    }

    fn record(&self, ino: Ino) -> VfsResult<InodeRecord> {
        self.meta.inode(ino)?.ok_or(VfsError::NotFound)
    }

    fn dir_record(&self, ino: Ino) -> VfsResult<InodeRecord> {
        let rec = self.record(ino)?;
        if rec.attr.kind != FileKind::Dir {
            return Err(VfsError::NotDir);
        }
        // A removed directory that is still someone's cwd: nothing can be created in it.
        if rec.attr.nlink == 0 {
            return Err(VfsError::NotFound);
        }
        Ok(rec)
    }

    fn alloc_ino(&self, batch: &mut MetaBatch) -> Ino {
        // Called under the namespace lock, so the counter and its persisted value agree.
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        batch.put_next_ino(ino + 1);
        ino
    }

    fn touch_dir(rec: &mut InodeRecord, now: Timestamp) {
        rec.attr.mtime = now;
        rec.attr.ctime = now;
    }

    // ---- lookup and attributes ------------------------------------------------------------

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> VfsResult<Attr> {
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        let dir = self.record(parent)?;
        if dir.attr.kind != FileKind::Dir {
            return Err(VfsError::NotDir);
        }
        let ino = match name {
            b"." => parent,
            b".." => dir.parent,
            _ => self.meta.dentry(parent, name)?.ok_or(VfsError::NotFound)?.0,
        };
        self.getattr(ino)
    }

    pub fn getattr(&self, ino: Ino) -> VfsResult<Attr> {
        Ok(self.attr_of(self.record(ino)?))
    }

    /// The attributes the kernel sees for `rec`, with the `st_blocks` of a regular file: for a
    /// file without holes (`dense`) its size in 4 KiB blocks, as the data disk allocates it;
    /// otherwise what its data file really allocates (one `fstat`/`stat`), so `du` and
    /// sparse-aware copies see holes.
    fn attr_of(&self, rec: InodeRecord) -> Attr {
        use std::os::unix::fs::MetadataExt;
        let mut attr = rec.attr;
        if attr.kind != FileKind::File {
            return attr;
        }
        if rec.dense {
            attr.blocks = attr.size.div_ceil(u64::from(BLOCK_SIZE)) * (u64::from(BLOCK_SIZE) / 512);
            return attr;
        }
        let open = self.open.read().get(&attr.ino).and_then(|oi| oi.file.lock().clone());
        let meta = match open {
            Some(file) => file.metadata(),
            None => std::fs::metadata(self.hot.path(attr.ino)),
        };
        // No data file yet: nothing allocated.
        attr.blocks = meta.map(|m| m.blocks()).unwrap_or(0);
        if let Some(cold) = &self.cold {
            // Evicted chunks are still the file's data, only elsewhere.
            attr.blocks += cold.evicted_bytes(attr.ino).div_ceil(512);
        }
        attr
    }

    pub fn setattr(&self, _caller: &Caller, ino: Ino, ch: &SetAttr, _fh: Option<u64>) -> VfsResult<Attr> {
        let _g = self.lock_inodes(&[ino]);
        let times_only = ch.mode.is_none() && ch.uid.is_none() && ch.gid.is_none() && ch.size.is_none();
        let mut rec = match self.record(ino) {
            Ok(rec) => rec,
            // With the writeback cache the kernel flushes the times of a file it still caches
            // after the file's last link went (and it was reclaimed). There is nothing left to
            // keep them on; failing would make `syncfs` report ENOENT for an unrelated file.
            Err(VfsError::NotFound) if times_only => return Ok(Attr::gone(ino)),
            Err(e) => return Err(e),
        };
        let now = Timestamp::now();
        let a = &mut rec.attr;
        if let Some(mode) = ch.mode {
            a.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = ch.uid {
            a.uid = uid;
        }
        if let Some(gid) = ch.gid {
            a.gid = gid;
        }
        let mut shrink_to = None;
        let mut b = MetaBatch::new();
        let mut _cold_write = None;
        let mut data_file = None;
        if let Some(size) = ch.size {
            match a.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(VfsError::IsDir),
                _ => return Err(VfsError::Invalid("truncate of a special file")),
            }
            if size > MAX_FILE_SIZE {
                return Err(VfsError::TooBig);
            }
            let file = self.file_for(ino, size > 0)?;
            if let Some(cold) = &self.cold {
                // Shrinking drops the chunks past the end and zeroes the tail of the new last
                // one, which is dirty until sealed again. Growing adds a hole and changes no
                // byte (the old last chunk's record still holds all of its data), so it marks
                // nothing and costs the same for any length.
                if size < a.size {
                    cold.truncate(ino, size, &mut b);
                    _cold_write = Some(cold.begin_zero(ino, &file, size..a.size, a.size)?);
                }
            }
            if size >= a.size {
                // Growing: zero-extend the data first, then commit (see tier invariants).
                DataFile { file: &file, ino }.set_len(size)?;
            } else {
                shrink_to = Some(size);
            }
            // Growing adds a hole; an empty file has none.
            if size > a.size {
                rec.dense = false;
            } else if size == 0 {
                rec.dense = true;
            }
            data_file = Some(file);
            a.size = size;
            a.blocks = size.div_ceil(512);
            a.mtime = now;
        }
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = ch.atime {
            a.atime = resolve(t);
        }
        if let Some(t) = ch.mtime {
            a.mtime = resolve(t);
        }
        a.ctime = ch.ctime.unwrap_or(now);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        if let (Some(size), Some(file)) = (shrink_to, &data_file) {
            // Shrinking: commit first, then cut the data, so a crash in between leaves the
            // truncate done (the data file is trimmed to the recorded size when next opened).
            DataFile { file, ino }.set_len(size)?;
        }
        Ok(self.attr_of(rec))
    }

    pub fn readlink(&self, ino: Ino) -> VfsResult<Vec<u8>> {
        let rec = self.record(ino)?;
        if rec.attr.kind != FileKind::Symlink {
            return Err(VfsError::Invalid("not a symbolic link"));
        }
        self.meta.symlink(ino)?.ok_or(VfsError::NotFound)
    }

    // ---- namespace ------------------------------------------------------------------------

    /// Creates a new inode named `name` in `parent` (one batch: inode, entry, parent times).
    fn create_node(&self, caller: &Caller, parent: Ino, name: &[u8], node: NewNode<'_>) -> VfsResult<Attr> {
        check_name(name)?;
        let _ns = self.namespace.lock();
        let _g = self.lock_inodes(&[parent]);
        let mut dir = self.dir_record(parent)?;
        if name == b"." || name == b".." || self.meta.dentry(parent, name)?.is_some() {
            return Err(VfsError::Exists);
        }
        let mut perm = node.perm & 0o7777;
        let mut gid = caller.gid;
        if dir.attr.perm & libc::S_ISGID as u16 != 0 {
            // setgid directory: new entries take its group, new directories its setgid bit.
            gid = dir.attr.gid;
            if node.kind == FileKind::Dir {
                perm |= libc::S_ISGID;
            }
        }
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        let ino = self.alloc_ino(&mut b);
        let size = node.symlink.map_or(0, |t| t.len() as u64);
        let rec = InodeRecord {
            attr: Attr {
                ino,
                kind: node.kind,
                perm: perm as u16,
                nlink: if node.kind == FileKind::Dir { 2 } else { 1 },
                uid: caller.uid,
                gid,
                rdev: node.rdev,
                size,
                blocks: size.div_ceil(512),
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
            },
            parent,
            // A new file is empty: no holes yet.
            dense: node.kind == FileKind::File,
            no_xattrs: true,
        };
        if let Some(target) = node.symlink {
            b.put_symlink(ino, target);
        }
        b.put_inode(&rec);
        b.put_dentry(parent, name, ino, node.kind);
        if node.kind == FileKind::Dir {
            dir.attr.nlink += 1;
        }
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        self.meta.commit(b)?;
        self.inode_count.fetch_add(1, Ordering::Relaxed);
        Ok(rec.attr)
    }

    pub fn mknod(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> VfsResult<Attr> {
        let kind = FileKind::from_mode(mode).unwrap_or(FileKind::File);
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(VfsError::Invalid("mknod of a directory or symlink"));
        }
        let rdev = if matches!(kind, FileKind::CharDev | FileKind::BlockDev) { rdev } else { 0 };
        self.create_node(caller, parent, name, NewNode { kind, perm: mode & !umask, rdev, symlink: None })
    }

    pub fn mkdir(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, umask: u32) -> VfsResult<Attr> {
        self.create_node(
            caller,
            parent,
            name,
            NewNode { kind: FileKind::Dir, perm: mode & !umask, rdev: 0, symlink: None },
        )
    }

    pub fn symlink(&self, caller: &Caller, parent: Ino, name: &[u8], target: &[u8]) -> VfsResult<Attr> {
        if target.is_empty() {
            return Err(VfsError::NotFound);
        }
        if target.len() > libc::PATH_MAX as usize {
            return Err(VfsError::NameTooLong);
        }
        self.create_node(
            caller,
            parent,
            name,
            NewNode { kind: FileKind::Symlink, perm: 0o777, rdev: 0, symlink: Some(target) },
        )
    }

    pub fn link(&self, _caller: &Caller, ino: Ino, new_parent: Ino, new_name: &[u8]) -> VfsResult<Attr> {
        check_name(new_name)?;
        let _ns = self.namespace.lock();
        let _g = self.lock_inodes(&[ino, new_parent]);
        let mut dir = self.dir_record(new_parent)?;
        let mut rec = self.record(ino)?;
        if rec.attr.kind == FileKind::Dir {
            return Err(VfsError::NotPermitted);
        }
        if rec.attr.nlink == 0 {
            return Err(VfsError::NotFound);
        }
        if rec.attr.nlink == u32::MAX {
            return Err(VfsError::TooManyLinks);
        }
        if self.meta.dentry(new_parent, new_name)?.is_some() {
            return Err(VfsError::Exists);
        }
        let now = Timestamp::now();
        rec.attr.nlink += 1;
        rec.attr.ctime = now;
        let mut b = MetaBatch::new();
        b.put_dentry(new_parent, new_name, ino, rec.attr.kind);
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(self.attr_of(rec))
    }

    /// Drops one link of `rec` (already removed from its directory in `b`): the inode is
    /// deleted when no link and no open handle remains, or marked orphan while still open.
    fn drop_link(&self, b: &mut MetaBatch, rec: &mut InodeRecord, now: Timestamp) -> VfsResult<bool> {
        rec.attr.nlink = if rec.attr.kind == FileKind::Dir { 0 } else { rec.attr.nlink.saturating_sub(1) };
        rec.attr.ctime = now;
        if rec.attr.nlink > 0 {
            b.put_inode(rec);
            return Ok(false);
        }
        if let Some(oi) = self.open.read().get(&rec.attr.ino) {
            oi.orphaned.store(true, Ordering::Relaxed);
            b.put_inode(rec);
            b.put_orphan(rec.attr.ino);
            return Ok(false);
        }
        // It had a link until now, so it is no orphan.
        self.delete_inode_records(b, rec.attr.ino, Some(&*rec), false)?;
        Ok(true)
    }

    /// Deletes the records of an inode that is gone. Keys it cannot have (the symlink target
    /// of a file, xattrs of an inode that never had one, the orphan marker of one that was
    /// never an orphan) are not deleted: every delete leaves a tombstone that later reads skip
    /// over. `rec` is `None` when the inode record is missing: everything is deleted then.
    fn delete_inode_records(
        &self,
        b: &mut MetaBatch,
        ino: Ino,
        rec: Option<&InodeRecord>,
        orphan: bool,
    ) -> VfsResult<()> {
        b.delete_inode(ino);
        if rec.is_none_or(|r| r.attr.kind == FileKind::Symlink) {
            b.delete_symlink(ino);
        }
        if orphan {
            b.delete_orphan(ino);
        }
        if let Some(cold) = &self.cold {
            cold.forget(ino, b);
        }
        if rec.is_none_or(|r| !r.no_xattrs) {
            for name in self.meta.xattr_names(ino)? {
                b.delete_xattr(ino, &name);
            }
        }
        Ok(())
    }

    /// Frees an orphan (no links, no handles): records first, then its data file.
    fn reclaim(&self, ino: Ino) -> VfsResult<()> {
        let mut b = MetaBatch::new();
        let rec = self.meta.inode(ino)?;
        self.delete_inode_records(&mut b, ino, rec.as_ref(), true)?;
        self.meta.commit(b)?;
        self.hot.remove(ino)?;
        Ok(())
    }

    /// Removes the data files of inodes that no longer exist: what a crash between an
    /// unlink's commit and the removal of its data file left behind (see [`DataFileRemoval`]).
    /// Looks only at inode numbers handed out before the call: those are never reused, so one
    /// without a record is gone for good. Returns how many files it removed. The daemon runs
    /// it on a background thread after each mount.
    pub fn sweep_leftover_data_files(&self) -> VfsResult<u64> {
        let below = self.next_ino.load(Ordering::Relaxed);
        let mut removed = 0;
        for ino in self.hot.data_file_inos()? {
            if ino < below && !self.meta.inode_exists(ino)? {
                self.hot.remove(ino)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The removal of the data file of a freed inode (ino, size), counted as pending until
    /// it finishes.
    fn removal(&self, freed: Option<(Ino, u64)>) -> DataFileRemoval {
        if freed.is_some() {
            self.pending_removals.fetch_add(1, Ordering::Relaxed);
        }
        DataFileRemoval { freed }
    }

    fn remove_entry(&self, parent: Ino, name: &[u8], want_dir: bool) -> VfsResult<DataFileRemoval> {
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        if want_dir && name == b"." {
            return Err(VfsError::Invalid("rmdir of ."));
        }
        if want_dir && name == b".." {
            return Err(VfsError::NotEmpty);
        }
        let _ns = self.namespace.lock();
        self.dir_record(parent)?;
        let (ino, kind) = self.meta.dentry(parent, name)?.ok_or(VfsError::NotFound)?;
        let _g = self.lock_inodes(&[parent, ino]);
        let mut dir = self.dir_record(parent)?;
        let mut rec = self.record(ino)?;
        match (want_dir, kind == FileKind::Dir) {
            (true, false) => return Err(VfsError::NotDir),
            (false, true) => return Err(VfsError::IsDir),
            (true, true) if !self.meta.dir_is_empty(ino)? => return Err(VfsError::NotEmpty),
            _ => {}
        }
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        b.delete_dentry(parent, name);
        if want_dir {
            dir.attr.nlink -= 1;
        }
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        let freed = self.drop_link(&mut b, &mut rec, now)?;
        self.meta.commit(b)?;
        if freed {
            self.inode_count.fetch_sub(1, Ordering::Relaxed);
        }
        // A directory has no data file.
        Ok(self.removal((freed && !want_dir).then_some((ino, rec.attr.size))))
    }

    pub fn unlink(&self, caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<()> {
        self.unlink_deferred(caller, parent, name)?.finish(self)
    }

    /// `unlink`, leaving the removal of a freed inode's data file to the caller (see
    /// [`DataFileRemoval`]): the mount replies first and removes the file after.
    pub fn unlink_deferred(&self, _caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<DataFileRemoval> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, _caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<()> {
        self.remove_entry(parent, name, true)?.finish(self)
    }

    /// True if directory `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&self, ancestor: Ino, mut dir: Ino) -> VfsResult<bool> {
        loop {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.record(dir)?.parent;
        }
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> VfsResult<()> {
        self.rename_deferred(caller, parent, name, new_parent, new_name, flags)?.finish(self)
    }

    /// `rename`, leaving the removal of a replaced inode's data file to the caller (see
    /// [`DataFileRemoval`]).
    pub fn rename_deferred(
        &self,
        _caller: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> VfsResult<DataFileRemoval> {
        check_name(new_name)?;
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        if flags.exchange && flags.noreplace {
            return Err(VfsError::Invalid("RENAME_EXCHANGE with RENAME_NOREPLACE"));
        }
        let _ns = self.namespace.lock();
        // A parent that is not a directory is ENOTDIR before any name is looked up.
        self.dir_record(parent)?;
        self.dir_record(new_parent)?;
        let (src, src_kind) = self.meta.dentry(parent, name)?.ok_or(VfsError::NotFound)?;
        let dst = self.meta.dentry(new_parent, new_name)?;
        let mut locked = vec![parent, new_parent, src];
        if let Some((d, _)) = dst {
            locked.push(d);
        }
        let _g = self.lock_inodes(&locked);
        self.dir_record(parent)?;
        self.dir_record(new_parent)?;
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        // Records touched by this rename, keyed by inode so a directory that is both a parent
        // and a moved entry is updated once, consistently.
        let mut recs: HashMap<Ino, InodeRecord> = HashMap::new();
        let load = |ino: Ino, recs: &mut HashMap<Ino, InodeRecord>| -> VfsResult<()> {
            if let std::collections::hash_map::Entry::Vacant(slot) = recs.entry(ino) {
                slot.insert(self.record(ino)?);
            }
            Ok(())
        };
        for ino in [parent, new_parent, src] {
            load(ino, &mut recs)?;
        }
        let src_is_dir = src_kind == FileKind::Dir;
        if src_is_dir && new_parent != parent && self.is_ancestor(src, new_parent)? {
            return Err(VfsError::Invalid("cannot move a directory into itself"));
        }
        let mut freed = None;
        if flags.exchange {
            let (dst_ino, dst_kind) = dst.ok_or(VfsError::NotFound)?;
            if dst_ino == src {
                return Ok(self.removal(None));
            }
            load(dst_ino, &mut recs)?;
            let dst_is_dir = dst_kind == FileKind::Dir;
            if dst_is_dir && parent != new_parent && self.is_ancestor(dst_ino, parent)? {
                return Err(VfsError::Invalid("cannot move a directory into itself"));
            }
            b.put_dentry(parent, name, dst_ino, dst_kind);
            b.put_dentry(new_parent, new_name, src, src_kind);
            if parent != new_parent && src_is_dir != dst_is_dir {
                let (gains, loses) = if src_is_dir { (new_parent, parent) } else { (parent, new_parent) };
                if let Some(r) = recs.get_mut(&gains) {
                    r.attr.nlink += 1;
                }
                if let Some(r) = recs.get_mut(&loses) {
                    r.attr.nlink -= 1;
                }
            }
            if let Some(r) = recs.get_mut(&src) {
                r.parent = new_parent;
                r.attr.ctime = now;
            }
            if let Some(r) = recs.get_mut(&dst_ino) {
                r.parent = parent;
                r.attr.ctime = now;
            }
        } else {
            if let Some((dst_ino, dst_kind)) = dst {
                if flags.noreplace {
                    return Err(VfsError::Exists);
                }
                if dst_ino == src {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(self.removal(None));
                }
                let dst_is_dir = dst_kind == FileKind::Dir;
                if src_is_dir && !dst_is_dir {
                    return Err(VfsError::NotDir);
                }
                if !src_is_dir && dst_is_dir {
                    return Err(VfsError::IsDir);
                }
                if dst_is_dir && !self.meta.dir_is_empty(dst_ino)? {
                    return Err(VfsError::NotEmpty);
                }
                load(dst_ino, &mut recs)?;
                if dst_is_dir {
                    if let Some(r) = recs.get_mut(&new_parent) {
                        r.attr.nlink -= 1;
                    }
                }
                let mut victim = recs.remove(&dst_ino).ok_or(VfsError::NotFound)?;
                if self.drop_link(&mut b, &mut victim, now)? {
                    freed = Some((dst_ino, victim.attr.size));
                }
            }
            b.delete_dentry(parent, name);
            b.put_dentry(new_parent, new_name, src, src_kind);
            if src_is_dir && parent != new_parent {
                if let Some(r) = recs.get_mut(&parent) {
                    r.attr.nlink -= 1;
                }
                if let Some(r) = recs.get_mut(&new_parent) {
                    r.attr.nlink += 1;
                }
            }
            if let Some(r) = recs.get_mut(&src) {
                r.parent = new_parent;
                r.attr.ctime = now;
            }
        }
        for p in [parent, new_parent] {
            if let Some(r) = recs.get_mut(&p) {
                Self::touch_dir(r, now);
            }
        }
        for r in recs.values() {
            b.put_inode(r);
        }
        self.meta.commit(b)?;
        if freed.is_some() {
            self.inode_count.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(self.removal(freed.filter(|_| !src_is_dir)))
    }

    // ---- file contents --------------------------------------------------------------------

    /// Takes `len` bytes of free disk space for a write (see [`HotTier::claim_space`]). With a
    /// store, a full disk is a throttle, not an error, while it can still make room: the
    /// write waits as long as uploads or evictions keep completing (dirty data becomes
    /// evictable once uploaded; the evictor runs every 200 ms and keeps twice the reserve
    /// free), and fails with ENOSPC only after 3 s without either.
    ///
    /// Data files that unlinks and renames freed but the mount is still removing (see
    /// [`DataFileRemoval`]) are waited for first, up to 5 s: a program that deletes a file to
    /// make room gets the room for its next write.
    fn claim_space(&self, len: u64) -> VfsResult<()> {
        const STALL: std::time::Duration = std::time::Duration::from_secs(3);
        const REMOVALS: std::time::Duration = std::time::Duration::from_secs(5);
        let mut last = self.cold.as_ref().map(|c| (c.progress(), std::time::Instant::now()));
        let started = std::time::Instant::now();
        loop {
            let full = match self.hot.claim_space(len) {
                Ok(()) => return Ok(()),
                Err(e @ HotTierError::NoSpace { .. }) => e,
                Err(e) => return Err(e.into()),
            };
            if self.pending_removals.load(Ordering::Acquire) > 0 && started.elapsed() < REMOVALS {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            let (Some(cold), Some((seen, since))) = (&self.cold, &mut last) else { return Err(full.into()) };
            let now = cold.progress();
            if now != *seen {
                (*seen, *since) = (now, std::time::Instant::now());
            } else if since.elapsed() > STALL {
                return Err(full.into());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The data file of `ino`: the shared open one, or (for a file nobody has open, e.g.
    /// `truncate(2)` by path) a temporary one. `keep`: the caller needs the bytes (false for
    /// a truncate to 0, which may recreate a lost data file).
    fn file_for(&self, ino: Ino, keep: bool) -> VfsResult<Arc<File>> {
        if let Some(oi) = self.open.read().get(&ino).cloned() {
            return self.file_of_for(&oi, ino, keep);
        }
        Ok(Arc::new(self.open_data_file(ino, keep)?))
    }

    /// Opens the data file of `ino`, sized to its record. A missing one is created, except
    /// when bytes of the file can only have lived there (`keep`, not empty, never had a hole,
    /// and not every chunk is in the store): then it is an error, never a file of zeros.
    fn open_data_file(&self, ino: Ino, keep: bool) -> VfsResult<File> {
        let rec = self.record(ino)?;
        let size = rec.attr.size;
        let only_here = keep && size > 0 && rec.dense && self.cold.as_ref().is_none_or(|c| !c.all_sealed(ino, size));
        Ok(self.hot.open_file(ino, size, !only_here)?)
    }

    fn open_inode(&self, ino: Ino) -> VfsResult<Arc<OpenInode>> {
        self.open.read().get(&ino).cloned().ok_or(VfsError::BadHandle)
    }

    /// The data file of an open inode, opened (and sized to the record) on first use.
    fn file_of(&self, oi: &OpenInode, ino: Ino) -> VfsResult<Arc<File>> {
        self.file_of_for(oi, ino, true)
    }

    fn file_of_for(&self, oi: &OpenInode, ino: Ino, keep: bool) -> VfsResult<Arc<File>> {
        let mut slot = oi.file.lock();
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let f = Arc::new(self.open_data_file(ino, keep)?);
        *slot = Some(f.clone());
        Ok(f)
    }

    /// The data file of `ino`, which must be open.
    fn open_file(&self, ino: Ino) -> VfsResult<Arc<File>> {
        let oi = self.open_inode(ino)?;
        self.file_of(&oi, ino)
    }

    /// Registers one more handle on `ino`'s data file, opening it if it is the first.
    fn acquire_handle(&self, rec: &InodeRecord) -> VfsResult<u64> {
        let ino = rec.attr.ino;
        let mut open = self.open.write();
        if let Some(oi) = open.get(&ino) {
            oi.handles.fetch_add(1, Ordering::Relaxed);
        } else {
            if let Some(cold) = &self.cold {
                cold.set_open(ino, true);
            }
            open.insert(
                ino,
                Arc::new(OpenInode {
                    file: Mutex::new(None),
                    handles: AtomicU64::new(1),
                    dir_synced: AtomicBool::new(false),
                    orphaned: AtomicBool::new(rec.attr.nlink == 0),
                }),
            );
        }
        Ok(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    pub fn open(&self, caller: &Caller, ino: Ino, flags: i32) -> VfsResult<u64> {
        let rec = self.record(ino)?;
        match rec.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(VfsError::IsDir),
            _ => return Err(VfsError::NotSupported("open of a special file through tierfs")),
        }
        let fh = self.acquire_handle(&rec)?;
        if flags & libc::O_TRUNC != 0 {
            let trunc = SetAttr { size: Some(0), ..SetAttr::default() };
            if let Err(e) = self.setattr(caller, ino, &trunc, Some(fh)) {
                self.release(ino, fh)?;
                return Err(e);
            }
        }
        Ok(fh)
    }

    pub fn create(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> VfsResult<(Attr, u64)> {
        let node = NewNode { kind: FileKind::File, perm: mode & !umask, rdev: 0, symlink: None };
        match self.create_node(caller, parent, name, node) {
            Ok(attr) => {
                let fh =
                    self.acquire_handle(&InodeRecord { attr: attr.clone(), parent, dense: true, no_xattrs: true })?;
                Ok((attr, fh))
            }
            Err(VfsError::Exists) if flags & libc::O_EXCL == 0 => {
                let attr = self.lookup(parent, name)?;
                let fh = self.open(caller, attr.ino, flags)?;
                Ok((self.getattr(attr.ino)?, fh))
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a read of `len` bytes at `offset` (or a write, with `write`) may wait for more
    /// than the local disk: a fetch from the store, the dirty bound, or free space in the hot
    /// tier. A hint for callers that serve many requests on few threads (the FUSE adapter
    /// runs such calls off its request thread); it may be stale as soon as it is given.
    pub fn may_wait(&self, ino: Ino, offset: u64, len: u64, write: bool) -> bool {
        let Some(cold) = &self.cold else { return false };
        let range = offset..offset.saturating_add(len);
        cold.may_wait(ino, range, write) || (write && self.hot.may_be_full(len))
    }

    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> VfsResult<Vec<u8>> {
        self.read_bytes(ino, fh, offset, size).map(Vec::from)
    }

    /// [`Vfs::read`] without a copy where the bytes are in memory already (a streamed read
    /// inside one block is a view of that block).
    pub fn read_bytes(&self, ino: Ino, _fh: u64, offset: u64, size: u32) -> VfsResult<Bytes> {
        let range = offset..offset.saturating_add(u64::from(size));
        if let Some(cold) = &self.cold {
            // A file too large to stay cached is read from the store's blocks in memory.
            let file_size = self.record(ino)?.attr.size;
            if let Some(data) = cold.read_streamed(ino, range.clone(), file_size)? {
                return Ok(data);
            }
        }
        let file = self.open_file(ino)?;
        let _pinned = match &self.cold {
            Some(cold) => Some(cold.begin_read(ino, &file, range)?),
            None => None,
        };
        Ok(Bytes::from(DataFile { file: &file, ino }.read_at(offset, size as usize)?))
    }

    pub fn write(&self, ino: Ino, _fh: u64, offset: u64, data: &[u8]) -> VfsResult<u32> {
        if data.is_empty() {
            // A zero-length write changes nothing, not even the size when past the end.
            return Ok(0);
        }
        // As ext4 does at its size limit: a write that starts below it is cut short there
        // (the caller sees a short count), one that starts at or past it is EFBIG.
        if offset >= MAX_FILE_SIZE {
            return Err(VfsError::TooBig);
        }
        let data = &data[..data.len().min((MAX_FILE_SIZE - offset) as usize)];
        let end = offset + data.len() as u64;
        self.claim_space(data.len() as u64)?;
        let file = self.open_file(ino)?;
        // Held until the new size is committed, so the chunk is not sealed in between.
        let _cold_write = match &self.cold {
            Some(cold) => Some(cold.begin_write(ino, &file, offset..end, u64::MAX, true)?),
            None => None,
        };
        DataFile { file: &file, ino }.write_at(offset, data)?;
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        let mut changed = false;
        if offset > rec.attr.size {
            rec.dense = false; // the bytes between the old end and `offset` are a hole
        }
        if end > rec.attr.size {
            rec.attr.size = end;
            rec.attr.blocks = end.div_ceil(512);
            changed = true;
        }
        if !self.config.kernel_owns_times {
            let now = Timestamp::now();
            rec.attr.mtime = now;
            rec.attr.ctime = now;
            changed = true;
        }
        // Clearing setuid/setgid on write is the kernel's job (file_remove_privs sends a
        // setattr): it knows whether the writer has CAP_FSETID, which this layer does not.
        if changed {
            let mut b = MetaBatch::new();
            b.put_inode(&rec);
            self.meta.commit(b)?;
        }
        Ok(data.len() as u32)
    }

    pub fn flush(&self, _ino: Ino, _fh: u64) -> VfsResult<()> {
        // close() promises nothing beyond what write() already did (DESIGN.md §4.1).
        Ok(())
    }

    pub fn release(&self, ino: Ino, _fh: u64) -> VfsResult<()> {
        let reclaim = {
            let mut open = self.open.write();
            let Some(oi) = open.get(&ino) else { return Err(VfsError::BadHandle) };
            if oi.handles.fetch_sub(1, Ordering::Relaxed) == 1 {
                let orphaned = oi.orphaned.load(Ordering::Relaxed);
                open.remove(&ino);
                if let Some(cold) = &self.cold {
                    cold.set_open(ino, false);
                }
                orphaned
            } else {
                false
            }
        };
        if reclaim {
            let _ns = self.namespace.lock();
            if let Some(rec) = self.meta.inode(ino)? {
                if rec.attr.nlink == 0 && !self.open.read().contains_key(&ino) {
                    self.reclaim(ino)?;
                    self.inode_count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    pub fn fsync(&self, ino: Ino, _fh: u64, _datasync: bool) -> VfsResult<()> {
        let oi = self.open.read().get(&ino).cloned();
        if let Some(oi) = oi {
            let file = oi.file.lock().clone();
            let Some(file) = file else {
                // No data file yet: nothing but metadata to make durable.
                self.meta.sync()?;
                return self.wait_remote(Some(ino));
            };
            DataFile { file: &file, ino }.sync_data()?;
            if !oi.dir_synced.swap(true, Ordering::Relaxed) {
                self.hot.sync_dir_of(ino)?;
            }
        }
        self.meta.sync()?;
        self.wait_remote(Some(ino))
    }

    // ---- directories ----------------------------------------------------------------------

    pub fn opendir(&self, ino: Ino) -> VfsResult<u64> {
        let rec = self.record(ino)?;
        if rec.attr.kind != FileKind::Dir {
            return Err(VfsError::NotDir);
        }
        // A snapshot of the listing: cookies are positions in it, stable for this handle
        // whatever happens to the directory meanwhile.
        let mut entries = vec![
            DirEntry { ino, kind: FileKind::Dir, name: b".".to_vec(), offset: 1 },
            DirEntry { ino: rec.parent, kind: FileKind::Dir, name: b"..".to_vec(), offset: 2 },
        ];
        for (name, child, kind) in self.meta.list_dir(ino)? {
            let offset = entries.len() as u64 + 1;
            entries.push(DirEntry { ino: child, kind, name, offset });
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dir_handles.lock().insert(fh, Arc::new(entries));
        Ok(fh)
    }

    fn dir_listing(&self, fh: u64) -> VfsResult<Arc<Vec<DirEntry>>> {
        self.dir_handles.lock().get(&fh).cloned().ok_or(VfsError::BadHandle)
    }

    pub fn readdir(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<DirEntry>> {
        let list = self.dir_listing(fh)?;
        Ok(list.iter().skip(offset as usize).take(READDIR_BATCH).cloned().collect())
    }

    pub fn readdirplus(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<(DirEntry, Attr)>> {
        let list = self.dir_listing(fh)?;
        let mut out = Vec::new();
        for e in list.iter().skip(offset as usize) {
            if out.len() == READDIRPLUS_BATCH {
                break;
            }
            // Entries removed since opendir are skipped, not reported with stale attributes.
            match self.getattr(e.ino) {
                Ok(attr) => out.push((e.clone(), attr)),
                Err(VfsError::NotFound) => continue,
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    pub fn releasedir(&self, _ino: Ino, fh: u64) -> VfsResult<()> {
        self.dir_handles.lock().remove(&fh);
        Ok(())
    }

    pub fn fsyncdir(&self, _ino: Ino) -> VfsResult<()> {
        self.meta.sync()?;
        self.wait_remote(None)
    }

    /// With remote fsync: uploads `ino`'s dirty data (if given), then waits until every
    /// metadata change so far is in the store.
    fn wait_remote(&self, ino: Option<Ino>) -> VfsResult<()> {
        let Some(timeout) = self.config.fsync_remote else { return Ok(()) };
        let journal = self.meta.journal();
        if !journal.is_enabled() {
            return Ok(());
        }
        if let (Some(ino), Some(cold)) = (ino, &self.cold) {
            cold.flush_inode(ino, timeout).map_err(|dirty| {
                VfsError::NotDurable(format!(
                    "{dirty} bytes of inode {ino} could not be uploaded within {} s",
                    timeout.as_secs()
                ))
            })?;
        }
        journal.wait_durable(journal.last_seq(), timeout).map_err(VfsError::NotDurable)
    }

    /// The metadata store (for the remote committer and checkpoints).
    pub fn meta(&self) -> &Arc<MetaStore> {
        &self.meta
    }

    pub fn statfs(&self) -> VfsResult<StatFs> {
        let st = self.hot.disk_stats()?;
        let frsize = st.f_frsize;
        let to_blocks = |n: u64| n * frsize / u64::from(BLOCK_SIZE);
        let used = self.inode_count.load(Ordering::Relaxed);
        let ffree = st.f_ffree.max(1 << 20);
        Ok(StatFs {
            blocks: to_blocks(st.f_blocks),
            bfree: to_blocks(st.f_bfree),
            // What writes may take: the reserve kept for metadata is not offered.
            bavail: to_blocks(st.f_bavail.saturating_sub(self.hot.reserve() / frsize.max(1))),
            files: used + ffree,
            ffree,
            bsize: BLOCK_SIZE,
            namelen: NAME_MAX as u32,
            frsize: BLOCK_SIZE,
        })
    }

    // ---- extended attributes --------------------------------------------------------------

    fn check_xattr_access(&self, caller: &Caller, rec: &InodeRecord, name: &[u8], writing: bool) -> VfsResult<()> {
        if name.is_empty() {
            return Err(VfsError::Invalid("empty xattr name"));
        }
        if name.len() > NAME_MAX {
            return Err(VfsError::Range);
        }
        if name.starts_with(b"user.") {
            // Linux: user xattrs only on regular files and directories.
            if !matches!(rec.attr.kind, FileKind::File | FileKind::Dir) {
                return Err(if writing { VfsError::NotPermitted } else { VfsError::NoXattr });
            }
        } else if name.starts_with(b"trusted.") {
            if caller.uid != 0 {
                return Err(if writing { VfsError::NotPermitted } else { VfsError::NoXattr });
            }
        } else if !name.starts_with(b"security.") {
            return Err(VfsError::NotSupported("xattr namespace"));
        }
        Ok(())
    }

    pub fn setxattr(&self, caller: &Caller, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> VfsResult<()> {
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        self.check_xattr_access(caller, &rec, name, true)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(VfsError::Invalid("xattr value larger than 64 KiB"));
        }
        let exists = self.meta.xattr(ino, name)?.is_some();
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(VfsError::Exists);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(VfsError::NoXattr);
        }
        rec.attr.ctime = Timestamp::now();
        rec.no_xattrs = false;
        let mut b = MetaBatch::new();
        b.put_xattr(ino, name, value);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> VfsResult<Vec<u8>> {
        // The kernel asks for `security.capability` before every write and chown; an inode
        // that never had an xattr answers from its (cached) record.
        if self.record(ino)?.no_xattrs {
            return Err(VfsError::NoXattr);
        }
        self.meta.xattr(ino, name)?.ok_or(VfsError::NoXattr)
    }

    pub fn listxattr(&self, ino: Ino) -> VfsResult<Vec<u8>> {
        self.record(ino)?;
        let mut out = Vec::new();
        for name in self.meta.xattr_names(ino)? {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> VfsResult<()> {
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        self.check_xattr_access(caller, &rec, name, true)?;
        if self.meta.xattr(ino, name)?.is_none() {
            return Err(VfsError::NoXattr);
        }
        rec.attr.ctime = Timestamp::now();
        let mut b = MetaBatch::new();
        b.delete_xattr(ino, name);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(())
    }

    /// `access(2)` against the mode bits (owner, group, other; root passes except for execute
    /// on a file with no execute bit). The mount normally lets the kernel do this.
    pub fn access(&self, caller: &Caller, ino: Ino, mask: i32) -> VfsResult<()> {
        let a = self.getattr(ino)?;
        if mask == libc::F_OK {
            return Ok(());
        }
        let perm = u32::from(a.perm);
        let granted = if caller.uid == 0 {
            let any_x = perm & 0o111 != 0 || a.kind == FileKind::Dir;
            0o6 | if any_x { 0o1 } else { 0 }
        } else if caller.uid == a.uid {
            (perm >> 6) & 7
        } else if caller.gid == a.gid {
            (perm >> 3) & 7
        } else {
            perm & 7
        };
        if (mask as u32) & !granted & 7 != 0 {
            return Err(VfsError::Access);
        }
        Ok(())
    }

    // ---- space management -----------------------------------------------------------------

    pub fn fallocate(&self, ino: Ino, _fh: u64, offset: u64, length: u64, mode: i32) -> VfsResult<()> {
        const SUPPORTED: i32 = libc::FALLOC_FL_KEEP_SIZE
            | libc::FALLOC_FL_PUNCH_HOLE
            | libc::FALLOC_FL_ZERO_RANGE
            | libc::FALLOC_FL_COLLAPSE_RANGE
            | libc::FALLOC_FL_INSERT_RANGE;
        if mode & !SUPPORTED != 0 {
            return Err(VfsError::NotSupported("fallocate mode"));
        }
        let end = offset.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?;
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_COLLAPSE_RANGE) == 0 {
            self.claim_space(length)?; // allocates (or zeroes, which may allocate)
        }
        let file = self.open_file(ino)?;
        let data = DataFile { file: &file, ino };
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        // Every mode may leave a hole or allocate past the end: st_blocks comes from the data file.
        rec.dense = false;
        let old = rec.attr.size;
        let shifts = mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0;
        let new_size = if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 {
            old.saturating_sub(length)
        } else if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
            old.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?
        } else if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
            old
        } else {
            old.max(end)
        };
        let zeroes = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        let _cold_write = match &self.cold {
            // Collapse and insert move every byte after `offset`: all of it must be local.
            Some(cold) if shifts => {
                let insert = mode & libc::FALLOC_FL_INSERT_RANGE != 0;
                Some(cold.begin_shift(ino, &file, offset, length, insert, old)?)
            }
            Some(cold) if zeroes => Some(cold.begin_zero(ino, &file, offset..end, old)?),
            // Allocating keeps every byte as it was (zeros where there were holes).
            _ => None,
        };
        if new_size < old {
            // Collapse: commit the smaller size first (a crash then trims, never resurrects).
            rec.attr.size = new_size;
            let mut b = MetaBatch::new();
            if let Some(cold) = &self.cold {
                cold.truncate(ino, new_size, &mut b);
            }
            b.put_inode(&rec);
            self.meta.commit(b)?;
        }
        data.fallocate(mode, offset, length)?;
        let now = Timestamp::now();
        rec.attr.size = new_size;
        rec.attr.blocks = new_size.div_ceil(512);
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 || new_size != old {
            rec.attr.mtime = now;
        }
        rec.attr.ctime = now;
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(())
    }

    /// Reads of `ino` are cached from now on, whatever its size ([`IOCTL_KEEP_CACHED`]).
    pub fn keep_cached(&self, ino: Ino) -> VfsResult<()> {
        if self.record(ino)?.attr.kind != FileKind::File {
            return Err(VfsError::Invalid("only regular files are cached"));
        }
        if let Some(cold) = &self.cold {
            cold.keep_cached(ino);
        }
        Ok(())
    }

    pub fn lseek(&self, ino: Ino, _fh: u64, offset: i64, whence: i32) -> VfsResult<i64> {
        let file = self.open_file(ino)?;
        let size = self.record(ino)?.attr.size as i64;
        if offset < 0 {
            return Err(VfsError::Invalid("negative offset"));
        }
        match whence {
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if offset >= size {
                    return Err(VfsError::NoDataAfter);
                }
                // Evicted chunks are holes in the data file but data to the program.
                let _pinned = match &self.cold {
                    Some(cold) => Some(cold.begin_read_all(ino, &file)?),
                    None => None,
                };
                Ok(DataFile { file: &file, ino }.seek(offset, whence)?.min(size))
            }
            libc::SEEK_SET => Ok(offset),
            libc::SEEK_END => Ok(size + offset),
            _ => Err(VfsError::Invalid("lseek whence")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: Ino,
        _fh_in: u64,
        off_in: u64,
        ino_out: Ino,
        _fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> VfsResult<u64> {
        let src = self.open_file(ino_in)?;
        let dst = self.open_file(ino_out)?;
        let in_size = self.record(ino_in)?.attr.size;
        let len = len.min(in_size.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        let end = off_out.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?;
        self.claim_space(len)?;
        let _cold_write = match &self.cold {
            Some(cold) => {
                let pinned = cold.begin_read(ino_in, &src, off_in..off_in + len)?;
                Some((pinned, cold.begin_write(ino_out, &dst, off_out..end, u64::MAX, true)?))
            }
            None => None,
        };
        let copied = DataFile { file: &src, ino: ino_in }.copy_to(
            off_in,
            &DataFile { file: &dst, ino: ino_out },
            off_out,
            len,
        )?;
        let _g = self.lock_inodes(&[ino_out]);
        let mut rec = self.record(ino_out)?;
        let now = Timestamp::now();
        rec.dense = false; // the copy keeps the source's holes, and may start past the end
        rec.attr.size = rec.attr.size.max(end.min(off_out + copied));
        rec.attr.blocks = rec.attr.size.div_ceil(512);
        rec.attr.mtime = now;
        rec.attr.ctime = now;
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(copied)
    }

    // ---- whole-filesystem -----------------------------------------------------------------

    /// Makes everything acknowledged so far durable on the local disk: every open data file
    /// and the metadata log. Used at unmount and on SIGTERM.
    pub fn sync_all(&self) -> VfsResult<()> {
        let open: Vec<(Ino, Arc<OpenInode>)> = self.open.read().iter().map(|(i, o)| (*i, o.clone())).collect();
        for (ino, oi) in open {
            let file = oi.file.lock().clone();
            if let Some(file) = file {
                DataFile { file: &file, ino }.sync_data()?;
            }
        }
        self.hot.sync_all_dirs()?;
        self.meta.sync()?;
        Ok(())
    }

    pub fn stats(&self) -> VfsStats {
        VfsStats {
            inodes: self.inode_count.load(Ordering::Relaxed),
            open_files: self.open.read().len() as u64,
            data_bytes: self.hot.allocated_bytes(),
            cache_size: self.config.cache_size,
            data_dir: self.config.data_dir.clone(),
            disk_free: self.hot.free_bytes().unwrap_or(0),
            reserve: self.hot.reserve(),
            cold: self.cold.as_ref().map(|c| c.stats()),
        }
    }

    /// Seals and uploads everything written so far; `Err` with the bytes still dirty when
    /// `timeout` passed first. A no-op without a store.
    pub fn flush_to_store(&self, timeout: std::time::Duration) -> Result<(), u64> {
        match &self.cold {
            Some(cold) => cold.flush(timeout),
            None => Ok(()),
        }
    }
}

impl Drop for Vfs {
    fn drop(&mut self) {
        if let Some(cold) = &self.cold {
            cold.shutdown();
        }
    }
}

/// A locked data directory with its metadata store open (see [`Vfs::prepare`]).
pub struct Prepared {
    lock: DataDirLock,
    meta: Arc<MetaStore>,
}

impl Prepared {
    pub fn meta(&self) -> &Arc<MetaStore> {
        &self.meta
    }
}

/// What `create_node` makes.
struct NewNode<'a> {
    kind: FileKind,
    perm: u32,
    rdev: u32,
    symlink: Option<&'a [u8]>,
}
