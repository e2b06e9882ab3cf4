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
//!   setgid-directory inheritance, xattr namespaces, and clearing setuid and setgid when a file's
//!   bytes or owner change (`setid`: the mount leaves it to the filesystem);
//! - an inode unlinked while open becomes an *orphan* (marked in the same batch) and is
//!   reclaimed on its last release, or at the next start after a crash; an `O_TMPFILE` file
//!   ([`Vfs::tmpfile`]) is an orphan from the batch that makes it until a `link` names it;
//! - errors are [`VfsError`]s; `VfsError::errno` is the single errno mapping.

mod adopt;
mod contents;
mod dirs;
pub mod error;
mod follow;
mod namespace;
mod passthrough;
mod setid;
pub mod types;
mod walk;
mod xattr;

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, MutexGuard, RwLock};

use crate::crypto::CacheCipher;
use crate::meta::{InodeRecord, MetaBatch, MetaStore};
use crate::tier::{
    BlockStore, ColdConfig, ColdStats, ColdTier, DataDirLock, HotSet, HotTier, HotTierError, RefillStats, WriteGuard,
};
pub use adopt::Content;
pub use error::{VfsError, VfsResult};
pub use follow::{HeadChange, PageCache};
pub use passthrough::{Opened, PASSTHROUGH_TAKE_IN, PassthroughStats};
pub use types::*;

/// Number of striped inode locks. A power of two well above the FUSE worker count, so two
/// busy inodes rarely share a stripe.
pub const STRIPES: usize = 64;

/// How many inode numbers one write of `Cnext_ino` reserves. Writing it with every new inode
/// made it one of a create's four keys, each a RocksDB memtable insert and part of the log
/// record; now one create in this many writes it. A restart skips what the last reservation
/// left unused: numbers are never reused, and a u64 does not run out.
pub const INO_RESERVE: u64 = 1024;

/// `ioctl(fd, IOCTL_KEEP_CACHED)` on a file of a tierfs mount (`_IO(0xB7, 1)`): its reads are
/// cached from now on (until the mount ends) even if it is larger than the stream limit.
/// `tierfs warmup` uses it, so that warming up a big file really fills the cache.
pub const IOCTL_KEEP_CACHED: u32 = 0xB701;

/// Most entries one readdir call returns: more than a kernel reply buffer holds, so each call
/// fills one reply, and a listing of n entries costs O(n) rather than O(n²).
const READDIR_BATCH: usize = 512;
/// The same for readdirplus, where each entry costs a metadata read and is ~4x larger.
const READDIRPLUS_BATCH: usize = 128;

pub use crate::types::{MAX_FILE_SIZE, XATTR_SIZE_MAX};

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
    /// A read-only follower of another node's writes ([`Vfs::apply_head`]).
    pub follow: bool,
    /// Encrypt the hot tier at rest with this cipher (`--encrypt-cache`).
    pub cache_cipher: Option<CacheCipher>,
    /// Let front ends serve wholly local files through FUSE passthrough ([`Vfs::open_for`];
    /// on by default, `--no-passthrough` turns it off).
    pub passthrough: bool,
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
            follow: false,
            cache_cipher: None,
            passthrough: true,
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
    pub passthrough: PassthroughStats,
    /// Metadata batches committed since the mount opened ([`MetaStore::commits`]).
    pub meta_commits: u64,
}

/// An open regular file: its data file (opened on first use, so creating and closing an
/// empty file costs no data-file syscalls) and how many handles share it.
struct OpenInode {
    file: Mutex<Option<Arc<File>>>,
    handles: AtomicU64,
    /// Whether the data file's directory entry is known to be on disk (fsynced once).
    dir_synced: AtomicBool,
    /// Set when the last link went while the file was open, or for an `O_TMPFILE` file
    /// that has no name yet: reclaim at the last release.
    orphaned: AtomicBool,
    /// An `O_TMPFILE` file not opened with `O_EXCL` that has had no name yet: [`Vfs::link`]
    /// may give it one (the kernel's `I_LINKABLE`).
    linkable: AtomicBool,
    /// Which handles the kernel serves through passthrough ([`passthrough`]).
    modes: Mutex<passthrough::Modes>,
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
    /// The inode number the store's `Cnext_ino` holds: every number below it may have been
    /// handed out, none at or above it (see [`INO_RESERVE`]).
    ino_reserved: AtomicU64,
    inode_count: AtomicU64,
    /// Data files freed by committed unlinks and renames whose removal has not finished yet
    /// (see [`DataFileRemoval`]): a write that finds the disk full waits for them.
    pending_removals: AtomicU64,
    open: RwLock<HashMap<Ino, Arc<OpenInode>>>,
    dir_handles: Mutex<HashMap<u64, Arc<Mutex<dirs::DirHandle>>>>,
    /// The directories listed last, for directory-order read-ahead (with a store only).
    walks: Mutex<walk::Walks>,
    next_fh: AtomicU64,
    /// A follower's state (`None` unless [`VfsConfig::follow`]).
    follow: Option<follow::Follow>,
    passthrough: passthrough::Passthrough,
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
        let prepared = Vfs::prepare(&config.data_dir, config.cache_cipher.clone())?;
        Vfs::from_prepared(config, prepared)
    }

    /// The first half of [`Vfs::new`]: locks the data directory and opens its metadata store
    /// (sealed with `cipher` under `--encrypt-cache`, which must then be the cache's too), so a
    /// caller can restore or check it (remote metadata) before the workspace is served.
    pub fn prepare(dir: &std::path::Path, cipher: Option<CacheCipher>) -> VfsResult<Prepared> {
        std::fs::create_dir_all(dir).map_err(|source| HotTierError::Io { op: "create", path: dir.into(), source })?;
        let lock = DataDirLock::acquire(dir, "")?;
        let meta = Arc::new(MetaStore::open_sealed(&dir.join("meta"), cipher)?);
        Ok(Prepared { lock, meta })
    }

    /// The second half of [`Vfs::new`], on a directory [`Vfs::prepare`] opened.
    pub fn from_prepared(config: VfsConfig, prepared: Prepared) -> VfsResult<Vfs> {
        let Prepared { lock, meta } = prepared;
        let dir = &config.data_dir;
        let hot = Arc::new(HotTier::open(dir, config.reserve, config.cache_cipher.clone())?);
        let next_ino = meta.next_ino()?.unwrap_or(ROOT_INO + 1);
        let vfs = Vfs {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            next_ino: AtomicU64::new(next_ino),
            ino_reserved: AtomicU64::new(next_ino),
            inode_count: AtomicU64::new(0),
            pending_removals: AtomicU64::new(0),
            namespace: Mutex::new(()),
            open: RwLock::new(HashMap::new()),
            dir_handles: Mutex::new(HashMap::new()),
            walks: Mutex::new(walk::Walks::default()),
            next_fh: AtomicU64::new(1),
            follow: config.follow.then(follow::Follow::default),
            passthrough: passthrough::Passthrough::new(&config),
            cold: None,
            config,
            meta,
            hot,
            _lock: lock,
        };
        let mut vfs = vfs;
        if vfs.meta.inode(ROOT_INO)?.is_none() {
            let now = Timestamp::now();
            let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
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
        // Before the cold tier starts: it re-seals what the recovered writers wrote.
        vfs.recover_passthrough_writes()?;
        // Before the cold tier starts: it would take the writer's unsealed marks for dirty
        // data of its own.
        vfs.start_following()?;
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
        let mut rec = self.meta.inode(ino)?.ok_or(VfsError::NotFound)?;
        if let Some(follow) = &self.follow {
            let shown = follow.shown_size(ino, rec.attr.size);
            if shown < rec.attr.size {
                rec.attr.size = shown;
                rec.attr.blocks = shown.div_ceil(512);
            }
        }
        Ok(rec)
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
        if ino >= self.ino_reserved.load(Ordering::Relaxed) {
            // In the batch that makes the first inode past the last reservation: every inode
            // a committed batch made is below what the store holds.
            let reserved = ino.saturating_add(INO_RESERVE);
            self.ino_reserved.store(reserved, Ordering::Relaxed);
            batch.put_next_ino(reserved);
        }
        ino
    }

    /// Commits a batch that may hold inodes from [`Vfs::alloc_ino`]. When it fails, the
    /// reservation it may carry did not reach the store: the next inode reserves again.
    fn commit_new_inodes(&self, batch: MetaBatch) -> VfsResult<()> {
        self.meta.commit(batch).inspect_err(|_| self.ino_reserved.store(0, Ordering::Relaxed))?;
        Ok(())
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
        let mut attr = self.attr_of(self.record(ino)?);
        self.passthrough_attr(ino, &mut attr);
        Ok(attr)
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

    pub fn setattr(&self, caller: &Caller, ino: Ino, ch: &SetAttr, _fh: Option<u64>) -> VfsResult<Attr> {
        self.catch_up_passthrough(ino)?;
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
        if a.kind == FileKind::File && setid::drops_setid(caller, ch) {
            a.perm = setid::without_setid(a.perm);
        }
        let mut shrink_to = None;
        let mut b = MetaBatch::new();
        let mut cold_write = None;
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
                    cold_write = Some(cold.begin_zero(ino, &file, size..a.size, a.size)?);
                }
            }
            if size >= a.size {
                // Growing: zero-extend the data first, then commit (see tier invariants).
                self.hot.data(&file, ino).set_len(size)?;
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
        // One batch: the record, the dropped chunks and the marks of the zeroed tail.
        self.commit_change(cold_write.as_mut(), b)?;
        if let (Some(size), Some(file)) = (shrink_to, &data_file) {
            // Shrinking: commit first, then cut the data, so a crash in between leaves the
            // truncate done (the data file is trimmed to the recorded size when next opened).
            self.hot.data(file, ino).set_len(size)?;
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

    /// With remote fsync: uploads `ino`'s dirty data (if given), then waits until every
    /// metadata change so far is in the store.
    fn wait_remote(&self, ino: Option<Ino>) -> VfsResult<()> {
        let Some(timeout) = self.config.fsync_remote else { return Ok(()) };
        let journal = self.meta.journal();
        if !journal.is_enabled() {
            return Ok(());
        }
        if let (Some(ino), Some(cold)) = (ino, &self.cold) {
            cold.flush_inode(ino, timeout).map_err(|dirty| VfsError::NotUploaded { ino, dirty, timeout })?;
        }
        Ok(journal.wait_durable(journal.last_seq(), timeout)?)
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

    // ---- whole-filesystem -----------------------------------------------------------------

    /// Makes everything acknowledged so far durable on the local disk: every open data file
    /// and the metadata log. Used at unmount and on SIGTERM.
    pub fn sync_all(&self) -> VfsResult<()> {
        self.take_in_passthrough_writers(false);
        let open: Vec<(Ino, Arc<OpenInode>)> = self.open.read().iter().map(|(i, o)| (*i, o.clone())).collect();
        for (ino, oi) in open {
            let file = oi.file.lock().clone();
            if let Some(file) = file {
                self.hot.data(&file, ino).sync_data()?;
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
            passthrough: self.passthrough_stats(),
            meta_commits: self.meta.commits(),
        }
    }

    /// The chunks this node holds, most recently used first (`None` without a store).
    pub fn hot_set(&self) -> Option<HotSet> {
        self.cold.as_ref().map(|c| c.hot_set())
    }

    /// Fetches the chunks of `set` that are not local into the cache, in the background's
    /// place (see [`ColdTier::refill`]), until done or `stop`. `None` without a store.
    pub fn refill(&self, set: &HotSet, stop: &std::sync::atomic::AtomicBool) -> Option<RefillStats> {
        let cold = self.cold.as_ref()?;
        // An inode that is gone (or whose data file cannot be opened) is skipped, and so is a
        // file whose reads stream past the cache: caching it would push the rest out.
        let open = |ino: Ino| {
            let size = self.record(ino).ok()?.attr.size;
            if cold.streams(ino, size) {
                return None;
            }
            self.file_for(ino, true).ok()
        };
        Some(cold.refill(set, &open, stop))
    }

    /// Records that the refill could not start, and why (for `status`).
    pub fn refill_not_started(&self, why: String) {
        if let Some(cold) = &self.cold {
            cold.refill_not_started(why);
        }
    }

    /// Seals and uploads everything written so far; `Err` with the bytes still dirty when
    /// `timeout` passed first. A no-op without a store.
    pub fn flush_to_store(&self, timeout: std::time::Duration) -> Result<(), u64> {
        self.take_in_passthrough_writers(false);
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
