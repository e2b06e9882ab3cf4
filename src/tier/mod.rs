//! The hot tier: file contents on the node's local disk.
//!
//! Each regular file's bytes live in one sparse *data file* under `<data_dir>/data/`, at the
//! file's own offsets, so reads and writes are a single `pread`/`pwrite` with no translation,
//! holes stay holes (SEEK_DATA/SEEK_HOLE and fallocate map onto the data file), and there is no
//! lock on the data path beyond the kernel's own.
//!
//! Invariants:
//! - a data file never holds bytes the metadata does not account for: writers write data
//!   first and then commit the new size; the data file of an open inode is trimmed to its
//!   recorded size when it is opened, so bytes of an interrupted write never show up later;
//! - a missing data file is recreated empty only where that loses nothing the caller knows
//!   of; otherwise opening it is [`HotTierError::DataFileMissing`] (EIO), never zeros;
//! - the data directory is used by one process at a time ([`DataDirLock`]);
//! - writes never take the last [`SpaceReserve`] bytes of the disk: the metadata store lives
//!   on the same disk, and a full disk must still let it commit (unlink, rmdir, rename and
//!   truncate free space only through it) and recover (RocksDB resumes after a no-space
//!   error only once 64 MiB are free).
//!
//! This layout is the "dirty" state of the extent model in docs/ARCHITECTURE.md: the cold tier
//! seals fixed-size chunks of a data file into immutable content-addressed blocks and records
//! them per chunk in the metadata; a chunk that is sealed and evicted becomes a hole here.

use rustix::fs::IFlags;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use crate::crypto::CacheCipher;
use crate::types::ErrorKind;
use crate::types::Ino;

pub mod cold;
mod encrypted;
pub use cold::{
    BlockStore, ColdConfig, ColdError, ColdStats, ColdTier, DEFAULT_INFLIGHT_BUDGET, HotSet, HotSetError,
    MAX_HOT_CHUNKS, Near, RefillState, RefillStats, WriteGuard,
};
pub use encrypted::CacheEncryption;

/// Why a hot-tier operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HotTierError {
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    #[error("data directory {dir} is in use by another tierfs process ({holder})")]
    InUse { dir: PathBuf, holder: String },
    #[error(
        "no space left: the disk of {dir} has {free} bytes free and the last {reserve} are kept \
         for metadata (delete files, or lower the data dir's reserve)"
    )]
    NoSpace { dir: PathBuf, free: u64, reserve: u64 },
    #[error(
        "the cache in {dir} is encrypted at rest: mount it with --encrypt-cache (and the store \
         it was encrypted for)"
    )]
    CacheEncrypted { dir: PathBuf },
    #[error(
        "the cache in {dir} holds data that is not encrypted, and --encrypt-cache applies only to \
         an empty cache: mount without --encrypt-cache, or give the workspace a new --data-dir \
         (after `tierfs sync`, everything this one holds is in the store)"
    )]
    CacheNotEncrypted { dir: PathBuf },
    #[error(
        "the cache in {dir} was encrypted under another key (of another store?): use the data \
         dir with the store it belongs to, or give this workspace a new --data-dir"
    )]
    CacheKeyMismatch { dir: PathBuf },
    #[error(
        "the data file of inode {ino} ({size} bytes) is missing from the data directory ({path}): \
         its contents are lost (removed behind tierfs's back, or not on disk yet at a power loss); \
         delete the file, or truncate it to 0 to use it again"
    )]
    DataFileMissing { ino: Ino, size: u64, path: PathBuf },
}

impl HotTierError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            HotTierError::Io { source, .. } => crate::types::io_error_kind(source),
            HotTierError::InUse { .. } => ErrorKind::Conflict,
            HotTierError::NoSpace { .. } => ErrorKind::NoSpace,
            HotTierError::DataFileMissing { .. } => ErrorKind::Corrupt,
            HotTierError::CacheEncrypted { .. }
            | HotTierError::CacheNotEncrypted { .. }
            | HotTierError::CacheKeyMismatch { .. } => ErrorKind::InvalidInput,
        }
    }
}

impl HotTierError {
    /// The errno a program sees: the underlying OS error where there is one (ENOSPC stays
    /// ENOSPC), EIO otherwise.
    pub fn errno(&self) -> i32 {
        match self {
            HotTierError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            HotTierError::InUse { .. } => libc::EBUSY,
            HotTierError::NoSpace { .. } => libc::ENOSPC,
            HotTierError::DataFileMissing { .. } => libc::EIO,
            HotTierError::CacheEncrypted { .. }
            | HotTierError::CacheNotEncrypted { .. }
            | HotTierError::CacheKeyMismatch { .. } => libc::EINVAL,
        }
    }
}

type Result<T> = std::result::Result<T, HotTierError>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> HotTierError + 'a {
    move |source| HotTierError::Io { op, path: path.to_path_buf(), source }
}

/// An exclusive, process-lifetime lock on a data directory (`flock` on `<dir>/tierfs.lock`).
/// The kernel drops it when the process dies, so a `kill -9` never leaves a stale lock.
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock, or fails with [`HotTierError::InUse`] naming the holder.
    pub fn acquire(dir: &Path, holder_note: &str) -> Result<DataDirLock> {
        let path = dir.join("tierfs.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io_err("open", &path))?;
        if let Err(errno) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            let err = std::io::Error::from(errno);
            if errno == rustix::io::Errno::WOULDBLOCK {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(HotTierError::InUse {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() { "unknown holder".into() } else { holder.into() },
                });
            }
            return Err(HotTierError::Io { op: "lock", path, source: err });
        }
        let note = format!("pid {} {}", std::process::id(), holder_note);
        file.set_len(0).map_err(io_err("truncate", &path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err("seek", &path))?;
        file.write_all(note.trim_end().as_bytes()).map_err(io_err("write", &path))?;
        Ok(DataDirLock { _file: file })
    }
}

/// Number of fan-out directories under `data/` (one per low byte of the inode number).
const FANOUT: usize = 256;

/// Free disk space that writes to data files leave alone by default (`--reserve`): enough
/// for RocksDB to flush a memtable and to resume after a no-space error (it waits for 64 MiB).
pub const DEFAULT_RESERVE: u64 = 256 << 20;

/// How long a measurement of the free space is trusted while the budget lasts.
const SPACE_RECHECK_MS: u64 = 200;

/// The free space data writes may still take: measured with `statvfs` at most every
/// [`SPACE_RECHECK_MS`] (or when the budget runs out), counted down by every write in between.
/// Writes that overwrite allocated bytes are counted too, so the count errs on the safe side;
/// a refused write is always checked against a fresh measurement. Lock-free: two atomics.
pub struct SpaceReserve {
    reserve: u64,
    /// Bytes writes may take before the next measurement (negative: measure now).
    budget: AtomicI64,
    /// When the budget was last measured, in ms since `epoch` (`u64::MAX`: never).
    measured_ms: AtomicU64,
    epoch: Instant,
}

impl SpaceReserve {
    /// Whether the last measurement is recent enough to count down from.
    fn fresh(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.measured_ms.load(Ordering::Relaxed).checked_add(SPACE_RECHECK_MS).is_some_and(|t| now < t)
    }

    fn new(reserve: u64) -> SpaceReserve {
        SpaceReserve {
            reserve,
            budget: AtomicI64::new(-1),
            measured_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }
    }
}

/// The local data files of one workspace.
pub struct HotTier {
    root: PathBuf,
    /// Fan-out directories that may hold a data file created since their last fsync, so a
    /// whole-tier sync fsyncs only those instead of all 256.
    unsynced_dirs: Vec<AtomicBool>,
    space: SpaceReserve,
    /// Encryption at rest (`--encrypt-cache`).
    encryption: Option<CacheEncryption>,
}

/// The file in `data/` that marks an encrypted hot tier, with its cipher and key check.
const ENCRYPTED_MARK: &str = "ENCRYPTED";

impl HotTier {
    /// Uses (creating if needed) `<data_dir>/data`; writes leave `reserve` bytes of the disk
    /// free (see the module invariants).
    /// With `cipher`, the data files are encrypted at rest; a data dir is either encrypted
    /// from its first data file on, under one key, or never ([`HotTierError::CacheEncrypted`]
    /// and its siblings refuse a mismatch before anything is read).
    pub fn open(data_dir: &Path, reserve: u64, cipher: Option<CacheCipher>) -> Result<HotTier> {
        let root = data_dir.join("data");
        fs::create_dir_all(&root).map_err(io_err("create", &root))?;
        spread_subdirectories(&root);
        let encryption = cipher.map(CacheEncryption::new);
        check_encryption(&root, data_dir, encryption.as_ref())?;
        // Until the first sync, any directory may hold files from a crashed predecessor.
        let unsynced_dirs = (0..FANOUT).map(|_| AtomicBool::new(true)).collect();
        Ok(HotTier { root, unsynced_dirs, space: SpaceReserve::new(reserve), encryption })
    }

    /// The data file `file` of `ino`, read and written through this tier's encryption.
    pub fn data<'a>(&'a self, file: &'a File, ino: Ino) -> DataFile<'a> {
        DataFile { file, ino, encryption: self.encryption.as_ref() }
    }

    /// Whether the data files are encrypted at rest.
    pub fn encrypted(&self) -> bool {
        self.encryption.is_some()
    }

    /// The free space kept for metadata.
    pub fn reserve(&self) -> u64 {
        self.space.reserve
    }

    /// Takes `len` bytes of the space writes may use, or fails with
    /// [`HotTierError::NoSpace`] (ENOSPC) if the disk's free space minus the reserve is less.
    /// Called before every write that may allocate; nothing is ever given back explicitly
    /// (the next measurement sees what was freed).
    pub fn claim_space(&self, len: u64) -> Result<()> {
        let s = &self.space;
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        if s.fresh() && s.budget.fetch_sub(len, Ordering::Relaxed) >= len {
            return Ok(());
        }
        let (free, budget) = self.measure_space()?;
        if budget < len {
            s.budget.store(budget, Ordering::Relaxed);
            return Err(HotTierError::NoSpace { dir: self.root.clone(), free, reserve: s.reserve });
        }
        s.budget.store(budget - len, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `len` bytes would fit beside the reserve, without taking them: the budget
    /// [`HotTier::claim_space`] counts down, trusted for [`SPACE_RECHECK_MS`] while it holds
    /// `len`, else measured again. So a check made for every new file (whether a passthrough
    /// writer has room) costs two atomic loads, not a `statvfs`, while the disk has room.
    pub fn has_room(&self, len: u64) -> Result<bool> {
        let s = &self.space;
        let len = i64::try_from(len).unwrap_or(i64::MAX);
        if s.fresh() && s.budget.load(Ordering::Relaxed) >= len {
            return Ok(true);
        }
        let (_, budget) = self.measure_space()?;
        s.budget.store(budget, Ordering::Relaxed);
        Ok(budget >= len)
    }

    /// Measures the disk now: its free bytes, and the budget they leave past the reserve
    /// (stored by the caller, after what it takes). The measurement is trusted from now on
    /// for [`SPACE_RECHECK_MS`].
    fn measure_space(&self) -> Result<(u64, i64)> {
        let s = &self.space;
        let free = self.free_bytes()?;
        s.measured_ms.store(s.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        Ok((free, i64::try_from(free.saturating_sub(s.reserve)).unwrap_or(i64::MAX)))
    }

    /// Whether [`HotTier::claim_space`] of `len` bytes may fail for want of space (the last
    /// measured budget is smaller), so that a writer may have to wait for eviction.
    pub fn may_be_full(&self, len: u64) -> bool {
        self.space.budget.load(Ordering::Relaxed) < i64::try_from(len).unwrap_or(i64::MAX)
    }

    /// Where the data file of `ino` lives: 256 fan-out directories keep directories small.
    pub fn path(&self, ino: Ino) -> PathBuf {
        self.root.join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
    }

    /// Opens the data file of `ino` for reading and writing and trims or extends it to `size`
    /// (see the module invariants). A missing data file is created when `create_missing`;
    /// otherwise it is [`HotTierError::DataFileMissing`]: the caller knows bytes were there.
    pub fn open_file(&self, ino: Ino, size: u64, create_missing: bool) -> Result<File> {
        let path = self.path(ino);
        if !create_missing {
            return match self.open_existing(ino)? {
                Some(file) => sized(self, file, ino, size),
                None => Err(HotTierError::DataFileMissing { ino, size, path }),
            };
        }
        let file = self.open_or_create(ino)?;
        sized(self, file, ino, size)
    }

    /// Opens the data file of `ino` as it is, creating it (empty) if missing: for the cold
    /// tier's fetches ahead of a reader on a node that never had the file. It is not sized to
    /// the file: the vfs sizes it when it opens it, and a shorter data file reads as holes.
    pub fn open_or_create(&self, ino: Ino) -> Result<File> {
        let path = self.path(ino);
        self.unsynced_dirs[(ino as usize) % FANOUT].store(true, Ordering::Relaxed);
        let open = |p: &Path| OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p);
        match open(&path) {
            Ok(f) => Ok(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
                }
                open(&path).map_err(io_err("open", &path))
            }
            Err(e) => Err(HotTierError::Io { op: "open", path, source: e }),
        }
    }

    /// Opens the data file of `ino` as it is (no trimming), or `None` if it does not exist:
    /// for the cold tier's workers, which read, punch and refill chunks of files that may or
    /// may not be open.
    pub fn open_existing(&self, ino: Ino) -> Result<Option<File>> {
        let path = self.path(ino);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HotTierError::Io { op: "open", path, source: e }),
        }
    }

    /// fsyncs the directory holding the data file of `ino`, so a new data file's name is on
    /// disk too (needed once per file for power-loss durability, not for process crashes).
    pub fn sync_dir_of(&self, ino: Ino) -> Result<()> {
        let path = self.path(ino);
        let dir = path.parent().unwrap_or(&self.root);
        sync_dir(dir)
    }

    /// fsyncs every fan-out directory that may have new entries, and the data root.
    pub fn sync_all_dirs(&self) -> Result<()> {
        for (i, flag) in self.unsynced_dirs.iter().enumerate() {
            if flag.swap(false, Ordering::Relaxed) {
                if let Err(e) = sync_dir(&self.root.join(format!("{i:02x}"))) {
                    flag.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        sync_dir(&self.root)
    }

    /// Removes the data file of `ino` (no error if it never existed).
    pub fn remove(&self, ino: Ino) -> Result<()> {
        let path = self.path(ino);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(HotTierError::Io { op: "remove", path, source: e }),
        }
    }

    /// The inode numbers of every data file (walks the tree; other names are skipped).
    pub fn data_file_inos(&self) -> Result<Vec<Ino>> {
        let mut inos = Vec::new();
        for dir in fs::read_dir(&self.root).map_err(io_err("list", &self.root))? {
            let dir = dir.map_err(io_err("list", &self.root))?.path();
            if !dir.is_dir() {
                continue;
            }
            for file in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
                let name = file.map_err(io_err("list", &dir))?.file_name();
                let name = name.to_string_lossy();
                if name.len() == 16 {
                    inos.extend(u64::from_str_radix(&name, 16).ok());
                }
            }
        }
        Ok(inos)
    }

    /// Bytes allocated by all data files (for status; walks the tree).
    pub fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let mut total = 0;
        let Ok(dirs) = fs::read_dir(&self.root) else { return 0 };
        for d in dirs.flatten() {
            let Ok(files) = fs::read_dir(d.path()) else { continue };
            for f in files.flatten() {
                if let Ok(m) = f.metadata() {
                    total += m.blocks() * 512;
                }
            }
        }
        total
    }

    /// Bytes of the data files' disk that an unprivileged writer may still take.
    pub fn free_bytes(&self) -> Result<u64> {
        let st = self.disk_stats()?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// `statvfs` of the disk holding the data files.
    pub fn disk_stats(&self) -> Result<rustix::fs::StatVfs> {
        rustix::fs::statvfs(&self.root).map_err(|e| HotTierError::Io {
            op: "statvfs",
            path: self.root.clone(),
            source: e.into(),
        })
    }
}

/// Refuses a data dir whose encryption at rest differs from `encryption`, and marks a new
/// encrypted one (before its first data file, so a crash cannot leave one unmarked).
fn check_encryption(root: &Path, data_dir: &Path, encryption: Option<&CacheEncryption>) -> Result<()> {
    let mark = root.join(ENCRYPTED_MARK);
    let recorded = match fs::read_to_string(&mark) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(HotTierError::Io { op: "read", path: mark, source: e }),
    };
    let dir = data_dir.to_path_buf();
    match (encryption, recorded) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(HotTierError::CacheEncrypted { dir }),
        (Some(e), Some(text)) => {
            let check = text.lines().find_map(|l| l.strip_prefix("key check: ")).unwrap_or("");
            if check == e.key_check() { Ok(()) } else { Err(HotTierError::CacheKeyMismatch { dir }) }
        }
        (Some(e), None) => {
            if holds_data_files(root)? {
                return Err(HotTierError::CacheNotEncrypted { dir });
            }
            let text = format!("cipher: XEX-AES-256, 16-byte blocks (docs/FORMAT.md)\nkey check: {}\n", e.key_check());
            let tmp = root.join(format!("{ENCRYPTED_MARK}.tmp"));
            let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
            f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(io_err("write", &tmp))?;
            fs::rename(&tmp, &mark).map_err(io_err("rename", &mark))?;
            sync_dir(root)
        }
    }
}

/// Whether any fan-out directory under `root` holds a data file.
fn holds_data_files(root: &Path) -> Result<bool> {
    for d in fs::read_dir(root).map_err(io_err("list", root))?.flatten() {
        if d.file_type().is_ok_and(|t| t.is_dir()) {
            let path = d.path();
            if fs::read_dir(&path).map_err(io_err("list", &path))?.next().is_some() {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// `file` (the data file of `ino`) trimmed or extended to `size`.
fn sized(hot: &HotTier, file: File, ino: Ino, size: u64) -> Result<File> {
    let data = hot.data(&file, ino);
    if data.encryption.is_some() {
        // Also zeroes what an interrupted write left past the end in the last block.
        data.set_len(size)?;
    } else if data.raw_len()? != size {
        data.raw_set_len(size)?;
    }
    Ok(file)
}

/// Marks `dir` as a top of directory hierarchies (`chattr +T`) where the filesystem knows the
/// flag (ext2/3/4; elsewhere this does nothing): ext4 then places its subdirectories, the
/// fan-out directories created later, in block groups with many free inodes instead of next
/// to the parent. It matters on ext4 without a journal, which will not reuse an inode freed
/// in the last minutes and scans past every such inode on each create: data files packed in
/// the groups of a tree just deleted cost 300-550 us per create instead of 18-27 us
/// (measured, benches/results/compare.md, 2026-11-30). Best effort: any failure is only logged at debug level.
fn spread_subdirectories(dir: &Path) {
    let set = || -> std::io::Result<()> {
        let d = File::open(dir)?;
        let flags = rustix::fs::ioctl_getflags(&d)?;
        if flags.contains(IFlags::TOPDIR) {
            return Ok(());
        }
        Ok(rustix::fs::ioctl_setflags(&d, flags | IFlags::TOPDIR)?)
    };
    if let Err(e) = set() {
        tracing::debug!("chattr +T {}: {e} (not ext2/3/4? harmless)", dir.display());
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    match File::open(dir) {
        Ok(d) => d.sync_all().map_err(io_err("fsync", dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HotTierError::Io { op: "open", path: dir.to_path_buf(), source: e }),
    }
}

/// Positional I/O and space management on an open data file, with errors that name the file.
/// On a hot tier encrypted at rest, every operation goes through [`CacheEncryption`] and the
/// caller sees plaintext at the file's own offsets.
pub struct DataFile<'a> {
    pub file: &'a File,
    pub ino: Ino,
    /// The hot tier's encryption (`--encrypt-cache`); `None`: bytes are stored as they are.
    pub encryption: Option<&'a CacheEncryption>,
}

impl<'a> DataFile<'a> {
    /// A file whose bytes are stored as they are: a plain hot tier's, or one outside it.
    pub fn plain(file: &'a File, ino: Ino) -> DataFile<'a> {
        DataFile { file, ino, encryption: None }
    }

    fn err(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> HotTierError {
        let path = PathBuf::from(format!("data file of inode {}", self.ino));
        move |source| HotTierError::Io { op, path, source }
    }

    /// Reads up to `len` bytes at `offset`; short only at the end of the file.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let done = self.read_into(offset, &mut buf)?;
        buf.truncate(done);
        Ok(buf)
    }

    /// Fills `buf` from `offset` and returns how many bytes it read: fewer only at the end of
    /// the file (the rest of `buf` is left as it was).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match self.encryption {
            Some(e) => e.read_into(self, offset, buf),
            None => self.raw_read_into(offset, buf),
        }
    }

    fn raw_read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.err("read")(e)),
            }
        }
        Ok(done)
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        match self.encryption {
            Some(e) => e.write_at(self, offset, data),
            None => self.raw_write_at(offset, data),
        }
    }

    fn raw_write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file.write_all_at(data, offset).map_err(self.err("write"))
    }

    /// Trims or extends the file to `size` (encrypted: see [`CacheEncryption::set_len`]).
    pub fn set_len(&self, size: u64) -> Result<()> {
        match self.encryption {
            Some(e) => e.set_len(self, size),
            None => self.raw_set_len(size),
        }
    }

    fn raw_set_len(&self, size: u64) -> Result<()> {
        self.file.set_len(size).map_err(self.err("truncate"))
    }

    /// The plain data file's length (a passthrough writer moves it behind the vfs's back).
    pub fn plain_len(&self) -> Result<u64> {
        self.raw_len()
    }

    fn raw_len(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(self.err("stat"))?.len())
    }

    pub fn sync_data(&self) -> Result<()> {
        self.file.sync_data().map_err(self.err("fsync"))
    }

    /// `fallocate(2)` with the caller's mode bits.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        match self.encryption {
            Some(e) => e.fallocate(self, mode, offset, len),
            None => self.raw_fallocate(mode, offset, len),
        }
    }

    fn raw_fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<()> {
        let mode = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
        rustix::fs::fallocate(self.file, mode, offset, len).map_err(|e| self.err("fallocate")(e.into()))
    }

    /// `lseek(2)` with SEEK_DATA / SEEK_HOLE. Safe to share: tierfs never uses the file offset.
    pub fn seek(&self, offset: i64, whence: i32) -> Result<i64> {
        use rustix::fs::SeekFrom as At;
        let invalid = || self.err("lseek")(std::io::Error::from(rustix::io::Errno::INVAL));
        let at = match whence {
            libc::SEEK_DATA => At::Data(u64::try_from(offset).map_err(|_| invalid())?),
            libc::SEEK_HOLE => At::Hole(u64::try_from(offset).map_err(|_| invalid())?),
            libc::SEEK_SET => At::Start(u64::try_from(offset).map_err(|_| invalid())?),
            libc::SEEK_END => At::End(offset),
            libc::SEEK_CUR => At::Current(offset),
            _ => return Err(invalid()),
        };
        let pos = rustix::fs::seek(self.file, at).map_err(|e| self.err("lseek")(e.into()))?;
        i64::try_from(pos).map_err(|_| invalid())
    }

    /// The runs of `range` that hold data (`SEEK_DATA`/`SEEK_HOLE`), in order: what a scan
    /// must look at, found without reading a hole. Costs one pair of seeks per run.
    pub fn data_extents(&self, range: Range<u64>) -> Result<Vec<Range<u64>>> {
        let mut out = Vec::new();
        let mut at = range.start;
        let end = range.end.min(i64::MAX as u64);
        while at < end {
            let start = match self.seek(at as i64, libc::SEEK_DATA) {
                Ok(s) => s as u64,
                // ENXIO: no data at or after `at`.
                Err(HotTierError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENXIO) => break,
                Err(e) => return Err(e),
            };
            if start >= end {
                break;
            }
            let stop = match self.seek(start as i64, libc::SEEK_HOLE) {
                Ok(s) => (s as u64).min(end),
                Err(HotTierError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENXIO) => end,
                Err(e) => return Err(e),
            };
            if stop <= start {
                break;
            }
            out.push(start..stop);
            at = stop;
        }
        Ok(out)
    }

    /// Copies `len` bytes from `self` at `off_in` to `out` at `off_out` inside the kernel
    /// (reflinks where the disk's filesystem can); returns bytes copied. Both files are of
    /// the same hot tier.
    pub fn copy_to(&self, off_in: u64, out: &DataFile<'_>, off_out: u64, len: u64) -> Result<u64> {
        if let Some(e) = self.encryption {
            return e.copy_to(self, off_in, out, off_out, len);
        }
        let mut copied = 0u64;
        while copied < len {
            let mut i = off_in + copied;
            let mut o = off_out + copied;
            let want = usize::try_from(len - copied).unwrap_or(usize::MAX);
            let n = match rustix::fs::copy_file_range(self.file, Some(&mut i), out.file, Some(&mut o), want) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(self.err("copy_file_range")(e.into())),
            };
            if n == 0 {
                break;
            }
            copied += n as u64;
        }
        Ok(copied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_root_spreads_its_fan_out_directories_on_ext4() {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = rustix::fs::statfs(dir.path()).expect("statfs");
        if st.f_type != 0xEF53 {
            eprintln!("skipped: {} is not on ext2/3/4 (f_type {:#x})", dir.path().display(), st.f_type);
            return;
        }
        let _hot = HotTier::open(dir.path(), 0, None).expect("open");
        let d = File::open(dir.path().join("data")).expect("open data/");
        let flags = rustix::fs::ioctl_getflags(&d).expect("FS_IOC_GETFLAGS on ext4");
        assert!(flags.contains(IFlags::TOPDIR), "data/ is not marked as a top of directory hierarchies");
    }

    #[test]
    fn claim_space_refuses_what_would_take_the_reserve_and_counts_down_between_measurements() {
        let dir = tempfile::tempdir().expect("tempdir");
        let free = {
            let hot = HotTier::open(dir.path(), 0, None).expect("open");
            hot.free_bytes().expect("statvfs")
        };
        assert!(free > 1 << 30, "the test needs 1 GiB of free disk space, {free} bytes here");

        // A reserve larger than the free space: every write that allocates is refused.
        let full = HotTier::open(dir.path(), free + (1 << 30), None).expect("open");
        let err = full.claim_space(1).expect_err("nothing may be written into the reserve");
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert!(err.to_string().contains("lower the data dir's reserve"), "the message says what to change: {err}");

        // Room for a little: small claims pass, and a claim beyond the counted budget is
        // measured again and refused, even inside the 200 ms a measurement is trusted.
        // (Margins of hundreds of MiB: other tests write to the same disk meanwhile.)
        let hot = HotTier::open(dir.path(), free - (512 << 20), None).expect("open");
        hot.claim_space(1 << 20).expect("1 MiB of about 512 MiB");
        let err = hot.claim_space(8 << 30).expect_err("8 GiB does not fit in about 512 MiB");
        assert_eq!(err.errno(), libc::ENOSPC);
        hot.claim_space(1 << 20).expect("a small claim still fits after a refused big one");

        // has_room asks the same question without taking anything.
        assert!(hot.has_room(1 << 20).expect("statvfs"), "1 MiB of about 512 MiB");
        assert!(!hot.has_room(8 << 30).expect("statvfs"), "8 GiB in about 512 MiB");
        hot.claim_space(1 << 20).expect("has_room took nothing");
        assert!(!full.has_room(1).expect("statvfs"), "nothing fits beside a reserve larger than the disk");
    }
}
