//! The metadata store: inodes, directory entries, xattrs, symlink targets and counters in
//! RocksDB.
//!
//! Invariants:
//! - every POSIX operation commits as exactly one [`MetaBatch`] (one RocksDB write batch), so a
//!   crash leaves either all or none of an operation's changes;
//! - batches go through the write-ahead log without an fsync: the log is written with
//!   `write(2)` before a batch is acknowledged, so a `kill -9` of the serving process loses
//!   nothing, and [`MetaStore::sync`] (fsync, fsyncdir, unmount) makes it survive power loss;
//! - the schema version key is checked on open: a newer schema is refused with a clear error.
//!
//! The store is unaware of POSIX rules; `vfs` decides what to write, this module only encodes
//! and stores it (key layout in [`codec`] and docs/FORMAT.md).

pub mod cache;
pub mod codec;
pub mod journal;
pub mod seal;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rocksdb::{BlockBasedOptions, DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions};

use crate::block::CHUNK_SIZE;
use crate::types::{ErrorKind, FileKind, Ino, MAX_FILE_SIZE, NAME_MAX, SYMLINK_MAX, XATTR_SIZE_MAX};
use cache::{DentryCache, Entry, InodeCache, Lookup, Touched};
pub use codec::{ChunkRecord, InodeRecord};
pub use journal::{Clock, Journal, JournalBatch, JournalError, JournalOp, JournalStats, system_unix_ms};
use seal::Sealing;

/// The first key after every key that starts with `prefix` (`None`: no such key, the
/// prefix is all 0xff).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The inode whose record `key` is, if it is one.
fn inode_of_key(key: &[u8]) -> Option<Ino> {
    (key.len() == 9 && key[..1] == codec::INODE_TABLE).then(|| codec::key_ino(key).ok()).flatten()
}

/// Whether deleting `[from, to)` reaches into the table whose keys start with `table`'s tag:
/// `[tag, tag + 1)`.
fn range_covers_table(from: &[u8], to: &[u8], table: [u8; 1]) -> bool {
    from < [table[0] + 1].as_slice() && to > table.as_slice()
}

/// The inode records `ops` write or delete.
fn touched_inodes(ops: &[JournalOp]) -> Touched<Ino> {
    let mut inos = Vec::new();
    for op in ops {
        match op {
            JournalOp::Put { key, .. } | JournalOp::Delete { key } => inos.extend(inode_of_key(key)),
            JournalOp::DeleteRange { from, to } if range_covers_table(from, to, codec::INODE_TABLE) => {
                return Touched::All;
            }
            JournalOp::DeleteRange { .. } => {}
        }
    }
    Touched::Keys(inos)
}

/// Whether `key` is a directory entry's.
fn is_dentry_key(key: &[u8]) -> bool {
    key.len() > 9 && key[..1] == codec::DENTRY_TABLE
}

/// A record from the store, checked before anything is written. Every checkpoint part and
/// journal batch reaches the database through [`MetaStore::import`], so this is the one check
/// of what a store says about the tree:
/// - a directory entry's name is one path component (1 to 255 bytes, no `/` or NUL, not `.`
///   or `..`), or a restore that turns names into paths would write outside its target;
/// - an inode record decodes, and its size is at most [`MAX_FILE_SIZE`];
/// - a symlink target is 1 to [`SYMLINK_MAX`] bytes without NUL;
/// - an xattr name is 1 to 255 bytes without NUL, its value at most [`XATTR_SIZE_MAX`];
/// - a chunk record decodes, at an index inside the largest file, holding at most one chunk;
/// - every other record's value decodes.
fn check_put(key: &[u8], value: &[u8]) -> Result<()> {
    let Some(&tag) = key.first() else { return Ok(()) };
    let ino = || codec::key_ino(key);
    let bad = |what: String| -> Result<()> {
        Err(MetaError::Corrupt(format!("the store holds {what} (inode {})", ino().unwrap_or_default())))
    };
    // What follows the inode number in an entry's or xattr's key: its name.
    let name = || ino().map(|_| &key[9..]);
    match tag {
        t if t == codec::DENTRY_TABLE[0] => {
            let name = name()?;
            let why = match name {
                [] => Some("an empty name"),
                b"." | b".." => Some("a name that is `.` or `..`"),
                n if n.len() > NAME_MAX => Some("a name longer than 255 bytes"),
                n if n.contains(&b'/') => Some("a name with a `/`"),
                n if n.contains(&0) => Some("a name with a NUL byte"),
                _ => None,
            };
            if let Some(why) = why {
                return bad(format!("a directory entry with {why} ({:?})", String::from_utf8_lossy(name)));
            }
            codec::decode_dentry(value)?;
        }
        t if t == codec::INODE_TABLE[0] => {
            let rec = codec::decode_inode(ino()?, value)?;
            if rec.attr.size > MAX_FILE_SIZE {
                return bad(format!("a file of {} bytes, past the largest ({MAX_FILE_SIZE})", rec.attr.size));
            }
        }
        t if t == codec::SYMLINK_TABLE[0] => {
            ino()?;
            if value.is_empty() || value.len() > SYMLINK_MAX || value.contains(&0) {
                return bad(format!("a symlink target of {} bytes (1 to {SYMLINK_MAX}, no NUL)", value.len()));
            }
        }
        t if t == codec::XATTR_TABLE[0] => {
            let name = name()?;
            if name.is_empty() || name.len() > NAME_MAX || name.contains(&0) {
                return bad(format!("an xattr name of {} bytes (1 to 255, no NUL)", name.len()));
            }
            if value.len() > XATTR_SIZE_MAX {
                return bad(format!("an xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len()));
            }
        }
        t if t == codec::CHUNK_TABLE[0] => {
            let (_, index) = codec::decode_chunk_key(key)?;
            let chunk = codec::decode_chunk(value)?;
            if index > MAX_FILE_SIZE / CHUNK_SIZE || u64::from(chunk.len) > CHUNK_SIZE || chunk.data > chunk.len {
                return bad(format!(
                    "chunk {index} of {} bytes, {} of them data (at most {CHUNK_SIZE} bytes a chunk)",
                    chunk.len, chunk.data
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The directory entries `ops` write or delete, by key.
fn touched_dentries(ops: &[JournalOp]) -> Touched<Vec<u8>> {
    let mut keys = Vec::new();
    for op in ops {
        match op {
            JournalOp::Put { key, .. } | JournalOp::Delete { key } if is_dentry_key(key) => keys.push(key.clone()),
            JournalOp::DeleteRange { from, to } if range_covers_table(from, to, codec::DENTRY_TABLE) => {
                return Touched::All;
            }
            JournalOp::Put { .. } | JournalOp::Delete { .. } | JournalOp::DeleteRange { .. } => {}
        }
    }
    Touched::Keys(keys)
}

/// What the directory entries `ops` write leave behind, in the order written: an entry for a
/// put, a name that does not exist for a delete. What a commit puts into the entry cache
/// (a range over the entries is never committed: [`touched_dentries`] drops them all then).
fn written_dentries(ops: &[JournalOp]) -> Vec<(Vec<u8>, Entry)> {
    let mut out: Vec<(Vec<u8>, Entry)> = Vec::new();
    for op in ops {
        let (key, entry) = match op {
            JournalOp::Put { key, value } if is_dentry_key(key) => match codec::decode_dentry(value) {
                Ok(entry) => (key, Some(entry)),
                Err(_) => continue,
            },
            JournalOp::Delete { key } if is_dentry_key(key) => (key, None),
            _ => continue,
        };
        out.retain(|(k, _)| k != key);
        out.push((key.clone(), entry));
    }
    out
}

/// The inode records `ops` leave behind, decoded, in the order written: what a commit puts
/// into the inode cache. An inode whose last change in `ops` is a delete is left out.
fn written_inodes(ops: &[JournalOp]) -> Vec<InodeRecord> {
    let mut out: Vec<InodeRecord> = Vec::new();
    for op in ops {
        match op {
            JournalOp::Put { key, value } => {
                if let Some(rec) = inode_of_key(key).and_then(|ino| codec::decode_inode(ino, value).ok()) {
                    out.retain(|r| r.attr.ino != rec.attr.ino);
                    out.push(rec);
                }
            }
            JournalOp::Delete { key } => {
                if let Some(ino) = inode_of_key(key) {
                    out.retain(|r| r.attr.ino != ino);
                }
            }
            // A range over the inode table drops everything written before it.
            JournalOp::DeleteRange { from, to } if range_covers_table(from, to, codec::INODE_TABLE) => out.clear(),
            JournalOp::DeleteRange { .. } => {}
        }
    }
    out
}

/// The metadata schema this build writes and understands. Version 2: inode records may be
/// of layout version 2 (a flags byte); version 3: chunk records may be of layout version 2 (a
/// data length). An older store is upgraded in place when opened (its records stay
/// readable), so an older tierfs refuses it afterwards instead of misreading it.
pub const SCHEMA_VERSION: u32 = 3;

/// Why a metadata operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("RocksDB: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error(
        "metadata in {path} has schema version {found}, newer than the {supported} this tierfs \
         understands; upgrade tierfs to open it"
    )]
    SchemaTooNew { path: PathBuf, found: u32, supported: u32 },
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    #[error(
        "the metadata in {path} is damaged ({detail}). With a store: move the data directory \
         aside and mount again, and the workspace is restored from the store. Without one, the \
         files' bytes are still in the data directory's data/ (one file per inode) but their \
         names are not"
    )]
    Damaged { path: PathBuf, detail: String },
    #[error(
        "the metadata in {path} is encrypted at rest: mount it with --encrypt-cache (and the store \
         it was encrypted for)"
    )]
    Encrypted { path: PathBuf },
    #[error(
        "the metadata in {path} is not encrypted, and --encrypt-cache applies only to a new data \
         dir: mount without --encrypt-cache, or give the workspace a new --data-dir (after `tierfs \
         sync`, everything this one holds is in the store)"
    )]
    NotEncrypted { path: PathBuf },
    #[error(
        "the metadata in {path} was encrypted under another key (of another store?): use the data \
         dir with the store it belongs to, or give this workspace a new --data-dir"
    )]
    KeyMismatch { path: PathBuf },
}

impl MetaError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            MetaError::Rocks(_) if self.errno() == libc::ENOSPC => ErrorKind::NoSpace,
            MetaError::Rocks(_) => ErrorKind::Unavailable,
            MetaError::SchemaTooNew { .. }
            | MetaError::Encrypted { .. }
            | MetaError::NotEncrypted { .. }
            | MetaError::KeyMismatch { .. } => ErrorKind::InvalidInput,
            MetaError::Corrupt(_) | MetaError::Damaged { .. } => ErrorKind::Corrupt,
        }
    }
}

impl MetaError {
    /// Every metadata failure is an I/O error to a program (the operation did not happen),
    /// except a full disk, which is ENOSPC: the program can tell the user what to do.
    pub fn errno(&self) -> i32 {
        match self {
            MetaError::Rocks(e) if e.to_string().contains("No space left") => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

type Result<T> = std::result::Result<T, MetaError>;

/// The RocksDB-backed metadata of one workspace on this node.
pub struct MetaStore {
    db: DB,
    write_opts: WriteOptions,
    /// The options of every point read on a hot path, made once: `DB::get_pinned` makes and
    /// frees a C++ `ReadOptions` per call.
    read_opts: ReadOptions,
    journal: Journal,
    /// Inode records read recently (see [`cache`]): every write of one goes through
    /// [`MetaStore::commit`] or [`MetaStore::import`], which keep it current.
    inodes: InodeCache,
    /// Directory entries read or written recently, and names looked up that do not exist;
    /// kept current the same way.
    dentries: DentryCache,
    /// Held across a write that changes inode records or entries and the cache update after
    /// it, so RocksDB and the caches see such writes in one order (a commit stores what it
    /// wrote in the caches; two commits of one key must not store it in the other order).
    cached_writes: Mutex<()>,
    /// Names and values sealed at rest under `--encrypt-cache` (see [`seal`]).
    sealing: Sealing,
    /// Batches committed since open ([`MetaStore::commits`]).
    commits: AtomicU64,
}

impl MetaStore {
    /// Opens (creating if needed) the store in `dir` and checks its schema version.
    pub fn open(dir: &Path) -> Result<MetaStore> {
        MetaStore::open_sealed(dir, None)
    }

    /// [`MetaStore::open`], with names and values sealed at rest with `cipher` (`--encrypt-cache`,
    /// see [`seal`]). A store is sealed from its start or never: a sealed one opened without the
    /// cipher (or with another key), or one with plaintext metadata opened with it, is refused
    /// before anything is read or changed.
    pub fn open_sealed(dir: &Path, cipher: Option<crate::crypto::CacheCipher>) -> Result<MetaStore> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.increase_parallelism(2);
        opts.set_max_background_jobs(2);
        // Point-in-time recovery: after a crash the store is a prefix of the acknowledged
        // batches, never a state with a hole in the middle.
        opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        // Most point reads of a namespace operation are misses (a create's lookup of the new
        // name, a rename's of its target): a bloom filter per table, and one over the
        // memtable, answer those without searching each table's index and blocks.
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        opts.set_block_based_table_factory(&table);
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.02);
        let db = DB::open(&opts, dir).map_err(|e| match e.kind() {
            rocksdb::ErrorKind::Corruption => MetaError::Damaged { path: dir.to_path_buf(), detail: e.to_string() },
            _ => MetaError::Rocks(e),
        })?;
        let mut write_opts = WriteOptions::default();
        write_opts.set_sync(false);
        let store = MetaStore {
            db,
            write_opts,
            read_opts: ReadOptions::default(),
            journal: Journal::default(),
            inodes: InodeCache::default(),
            dentries: DentryCache::default(),
            cached_writes: Mutex::new(()),
            sealing: Sealing::new(cipher.clone()),
            commits: AtomicU64::new(0),
        };
        let found = match store.db.get(codec::SCHEMA_KEY)? {
            None => None,
            Some(v) => Some(
                v.as_slice()
                    .try_into()
                    .map(u32::from_le_bytes)
                    .map_err(|_| MetaError::Corrupt("schema version key".into()))?,
            ),
        };
        if let Some(found) = found.filter(|&f| f > SCHEMA_VERSION) {
            return Err(MetaError::SchemaTooNew { path: dir.to_path_buf(), found, supported: SCHEMA_VERSION });
        }
        // A new store, or an older one upgraded in place (see SCHEMA_VERSION).
        if found != Some(SCHEMA_VERSION) {
            let mut b = WriteBatch::default();
            b.put(codec::SCHEMA_KEY, SCHEMA_VERSION.to_le_bytes());
            store.db.write_opt(b, &store.write_opts)?;
        }
        let path = dir.to_path_buf();
        match (cipher, store.db.get(codec::SEALED_KEY)?) {
            (None, None) => {}
            (None, Some(_)) => return Err(MetaError::Encrypted { path }),
            (Some(c), Some(check)) if check != c.key_check().as_bytes() => return Err(MetaError::KeyMismatch { path }),
            (Some(_), Some(_)) => {}
            (Some(_), None) if !store.is_empty()? => return Err(MetaError::NotEncrypted { path }),
            (Some(c), None) => store.db.put_opt(codec::SEALED_KEY, c.key_check().as_bytes(), &store.write_opts)?,
        }
        Ok(store)
    }

    pub fn inode(&self, ino: Ino) -> Result<Option<InodeRecord>> {
        let generation = match self.inodes.lookup(&ino) {
            Lookup::Hit(rec) => return Ok(Some(rec)),
            Lookup::Miss(generation) => generation,
        };
        match self.db.get_pinned_opt(codec::inode_key(ino), &self.read_opts)? {
            None => Ok(None),
            Some(v) => {
                let rec = codec::decode_inode(ino, &v)?;
                self.inodes.fill(ino, generation, rec.clone());
                Ok(Some(rec))
            }
        }
    }

    /// Whether `ino` has a record, read from RocksDB without decoding it or filling the
    /// inode cache (for walks over many inodes that are not about to be used).
    pub fn inode_exists(&self, ino: Ino) -> Result<bool> {
        Ok(self.db.get_pinned_opt(codec::inode_key(ino), &self.read_opts)?.is_some())
    }

    pub fn dentry(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        let key = codec::dentry_key(parent, name);
        let generation = match self.dentries.lookup(&key) {
            Lookup::Hit(entry) => return Ok(entry),
            Lookup::Miss(generation) => generation,
        };
        let entry = match self.db.get_pinned_opt(&*self.sealing.key(&key), &self.read_opts)? {
            None => None,
            Some(v) => Some(codec::decode_dentry(&v)?),
        };
        self.dentries.fill(key, generation, entry);
        Ok(entry)
    }

    /// Calls `f(key_suffix, value)` for every key starting with `prefix`, in key order, until
    /// `f` returns false.
    /// Keys and values are plaintext; their order is the order on disk (see [`seal`]).
    fn scan(&self, prefix: &[u8], f: impl FnMut(&[u8], &[u8]) -> Result<bool>) -> Result<()> {
        self.scan_from(prefix, None, f)
    }

    /// [`Self::scan`] of the keys after the key `after` (which starts with `prefix`).
    fn scan_from(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool>,
    ) -> Result<()> {
        // The first key past `after`: `after` itself with a 0 byte appended.
        let from = match after {
            Some(key) => [&*self.sealing.key(key), &[0]].concat(),
            None => prefix.to_vec(),
        };
        // Bounded: without an upper bound, a seek into an empty prefix walks on over every
        // deleted key that follows it (the tombstones of the next table) to find a live one,
        // which made each unlink on a store mount slower than the last (15 000/s down to
        // 900/s after 30 000 files: `xattr_names` seeks `X<ino>`, the dirty markers `Y…` follow).
        let mut opts = rocksdb::ReadOptions::default();
        if let Some(end) = prefix_end(prefix) {
            opts.set_iterate_upper_bound(end);
        }
        for item in self.db.iterator_opt(IteratorMode::From(&from, Direction::Forward), opts) {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            let key = self.sealing.open_key(&k)?;
            let value = self.sealing.open_value(&key, &v)?;
            if !f(&key[prefix.len()..], &value)? {
                break;
            }
        }
        Ok(())
    }

    /// All entries of directory `parent`, sorted by name (by sealed name under
    /// `--encrypt-cache`: an order that stays the same, see [`seal`]).
    pub fn list_dir(&self, parent: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
        let mut out = Vec::new();
        self.scan(&codec::dentry_prefix(parent), |name, v| {
            let (ino, kind) = codec::decode_dentry(v)?;
            out.push((name.to_vec(), ino, kind));
            Ok(true)
        })?;
        Ok(out)
    }

    /// At most `limit` entries of directory `parent` that come after the entry `after` (from
    /// the first with `None`), in [`MetaStore::list_dir`]'s order: a listing read in pieces,
    /// each costing one seek.
    pub fn list_dir_after(
        &self,
        parent: Ino,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
        let prefix = codec::dentry_prefix(parent);
        let after = after.map(|name| codec::dentry_key(parent, name));
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.scan_from(&prefix, after.as_deref(), |name, v| {
            let (ino, kind) = codec::decode_dentry(v)?;
            out.push((name.to_vec(), ino, kind));
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    pub fn dir_is_empty(&self, parent: Ino) -> Result<bool> {
        let mut empty = true;
        self.scan(&codec::dentry_prefix(parent), |_, _| {
            empty = false;
            Ok(false)
        })?;
        Ok(empty)
    }

    pub fn xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get_sealed(&codec::xattr_key(ino, name))
    }

    /// The plaintext value of the plaintext `key`.
    fn get_sealed(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.db.get(&*self.sealing.key(key))? {
            None => Ok(None),
            Some(v) => Ok(Some(self.sealing.open_value(key, &v)?.into_owned())),
        }
    }

    /// Names of all xattrs of `ino`, sorted.
    pub fn xattr_names(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.scan(&codec::xattr_prefix(ino), |name, _| {
            out.push(name.to_vec());
            Ok(true)
        })?;
        Ok(out)
    }

    pub fn symlink(&self, ino: Ino) -> Result<Option<Vec<u8>>> {
        self.get_sealed(&codec::symlink_key(ino))
    }

    /// The next inode number to hand out (1 + the highest ever used).
    pub fn next_ino(&self) -> Result<Option<u64>> {
        self.db.get_pinned(codec::NEXT_INO_KEY)?.map(|v| codec::decode_u64(&v)).transpose()
    }

    /// Inodes that were unlinked while open and must be reclaimed.
    pub fn orphans(&self) -> Result<Vec<Ino>> {
        self.marked_inodes(&codec::ORPHAN_TABLE)
    }

    /// The inode numbers of a table of per-inode markers (`tag` ino → empty).
    fn marked_inodes(&self, table: &[u8]) -> Result<Vec<Ino>> {
        let mut out = Vec::new();
        self.scan(table, |rest, _| {
            let mut key = table.to_vec();
            key.extend_from_slice(rest);
            out.push(codec::key_ino(&key)?);
            Ok(true)
        })?;
        Ok(out)
    }

    /// Number of inodes in the store (a full scan of the inode table; used at open).
    pub fn count_inodes(&self) -> Result<u64> {
        let mut n = 0;
        self.scan(&codec::INODE_TABLE, |_, _| {
            n += 1;
            Ok(true)
        })?;
        Ok(n)
    }

    /// Every chunk record: `(ino, chunk index, record)`, in key order.
    pub fn chunks(&self) -> Result<Vec<(Ino, u64, ChunkRecord)>> {
        let mut out = Vec::new();
        self.scan(&codec::CHUNK_TABLE, |rest, v| {
            let mut key = codec::CHUNK_TABLE.to_vec();
            key.extend_from_slice(rest);
            let (ino, idx) = codec::decode_chunk_key(&key)?;
            out.push((ino, idx, codec::decode_chunk(v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Inodes marked dirty (written since their chunks were last sealed).
    pub fn dirty_inodes(&self) -> Result<Vec<Ino>> {
        self.marked_inodes(&codec::DIRTY_TABLE)
    }

    /// The inodes whose dirty marker says a writer through FUSE passthrough had the file
    /// open ([`MetaBatch::put_dirty_passthrough`]): their data files hold writes the records
    /// may not have taken in.
    pub fn passthrough_dirty_inodes(&self) -> Result<Vec<Ino>> {
        let mut out = Vec::new();
        self.scan(&codec::DIRTY_TABLE, |rest, value| {
            if value == PASSTHROUGH_MARK {
                let mut key = codec::DIRTY_TABLE.to_vec();
                key.extend_from_slice(rest);
                out.push(codec::key_ino(&key)?);
            }
            Ok(true)
        })?;
        Ok(out)
    }

    /// Chunks marked unsealed (written since they were last sealed), by inode, each inode's
    /// chunk indexes in order.
    pub fn unsealed_chunks(&self) -> Result<BTreeMap<Ino, Vec<u64>>> {
        let mut out: BTreeMap<Ino, Vec<u64>> = BTreeMap::new();
        self.scan(&codec::UNSEALED_TABLE, |rest, _| {
            let mut key = codec::UNSEALED_TABLE.to_vec();
            key.extend_from_slice(rest);
            let (ino, idx) = codec::decode_chunk_key(&key)?;
            out.entry(ino).or_default().push(idx);
            Ok(true)
        })?;
        Ok(out)
    }

    /// The chunk records of one file: `(chunk index, record)`, in index order.
    pub fn file_chunks(&self, ino: Ino) -> Result<Vec<(u64, ChunkRecord)>> {
        let mut out = Vec::new();
        self.scan(&codec::chunk_prefix(ino), |rest, v| {
            let idx = rest
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| MetaError::Corrupt(format!("chunk key of inode {ino}: {rest:?}")))?;
            out.push((idx, codec::decode_chunk(v)?));
            Ok(true)
        })?;
        Ok(out)
    }

    /// After a restore: cuts every file whose data did not all reach the store back to the
    /// data that did, and drops the unsealed-chunk marks (they describe the last writer's
    /// local state). Returns how many files were cut.
    ///
    /// Only a chunk marked unsealed can have lost data: a chunk with neither a record nor a
    /// mark is a hole and reads as zeros, however far into the file it is. A marked chunk
    /// whose record (if any) covers all of its part of the file keeps that record's bytes
    /// (the write that marked it was not acknowledged as stored); one whose record is short
    /// or missing ends the file there. Costs what the marks and records cost, never what the
    /// files' lengths claim.
    pub fn cut_to_stored_data(&self) -> Result<u64> {
        let chunk = crate::block::CHUNK_SIZE;
        let marks = self.unsealed_chunks()?;
        let mut batch = MetaBatch::new();
        let mut cut = 0;
        for (&ino, indexes) in &marks {
            for &idx in indexes {
                batch.delete_unsealed(ino, idx);
            }
            let Some(mut rec) = self.inode(ino)? else { continue };
            if rec.attr.kind != FileKind::File {
                continue;
            }
            let size = rec.attr.size;
            let records: HashMap<u64, ChunkRecord> = self.file_chunks(ino)?.into_iter().collect();
            let mut stored_end = size;
            for &idx in indexes {
                let start = idx.saturating_mul(chunk);
                if start >= size {
                    break;
                }
                let want = (size - start).min(chunk);
                let have = records.get(&idx).map_or(0, |r| u64::from(r.len));
                if have < want {
                    stored_end = start + have;
                    break;
                }
            }
            if stored_end < size {
                rec.attr.size = stored_end;
                batch.put_inode(&rec);
                let first_gone = stored_end.div_ceil(chunk);
                for &idx in records.keys().filter(|&&idx| idx >= first_gone) {
                    batch.delete_chunk(ino, idx);
                }
                cut += 1;
            }
        }
        if !marks.is_empty() {
            self.commit(batch)?;
        }
        Ok(cut)
    }

    /// Every regular file with data: `(ino, size, dense)` (a scan of the inode table).
    pub fn file_sizes(&self) -> Result<Vec<(Ino, u64, bool)>> {
        let mut out = Vec::new();
        self.scan(&codec::INODE_TABLE, |rest, v| {
            let ino = rest
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| MetaError::Corrupt(format!("inode key {rest:?}")))?;
            let rec = codec::decode_inode(ino, v)?;
            if rec.attr.kind == FileKind::File && rec.attr.size > 0 {
                out.push((rec.attr.ino, rec.attr.size, rec.dense));
            }
            Ok(true)
        })?;
        Ok(out)
    }

    /// Every block location this workspace knows.
    pub fn blocks(&self) -> Result<Vec<([u8; 32], crate::block::BlockLoc)>> {
        let mut out = Vec::new();
        self.scan(b"B", |rest, v| {
            let id: [u8; 32] = rest.try_into().map_err(|_| MetaError::Corrupt(format!("block key {rest:?}")))?;
            let loc = crate::block::BlockLoc::decode(v)
                .ok_or_else(|| MetaError::Corrupt(format!("block index entry of {} bytes", v.len())))?;
            out.push((id, loc));
            Ok(true)
        })?;
        Ok(out)
    }

    /// Where a stored block lives, if this node knows it.
    pub fn block(&self, id: &[u8; 32]) -> Result<Option<crate::block::BlockLoc>> {
        match self.db.get_pinned_opt(codec::block_key(id), &self.read_opts)? {
            None => Ok(None),
            Some(v) => crate::block::BlockLoc::decode(&v)
                .map(Some)
                .ok_or_else(|| MetaError::Corrupt(format!("block index entry of {} bytes", v.len()))),
        }
    }

    /// Applies one batch atomically (numbered and queued for the store when journaling).
    /// The inode records and directory entries it writes go into the caches: the kernel asks
    /// for the attributes of a directory again after every change to it, and an entry just
    /// made is the next one renamed or removed; those reads are then answered from memory.
    pub fn commit(&self, batch: MetaBatch) -> Result<()> {
        let MetaBatch { writes, ops } = batch;
        let mut wb = WriteBatch::default();
        for (key, value) in &writes {
            let disk = self.sealing.key(key);
            match value {
                Some(value) => wb.put(&disk, self.sealing.value(key, value)),
                None => wb.delete(&disk),
            }
        }
        let touched = touched_inodes(&ops);
        let touched_names = touched_dentries(&ops);
        let written = written_inodes(&ops);
        let written_names = written_dentries(&ops);
        let _order = (!touched.is_empty() || !touched_names.is_empty()).then(|| self.cached_writes.lock());
        self.inodes.invalidate(&touched);
        self.dentries.invalidate(&touched_names);
        let result = self.journal.append(ops, |seq| {
            if let Some(seq) = seq {
                wb.put(codec::JOURNAL_SEQ_KEY, seq.to_le_bytes());
            }
            self.db.write_opt(wb, &self.write_opts)?;
            Ok(())
        });
        self.inodes.invalidate(&touched);
        self.dentries.invalidate(&touched_names);
        if result.is_ok() {
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.inodes.store(written.into_iter().map(|rec| (rec.attr.ino, rec)));
            self.dentries.store(written_names);
        }
        result
    }

    /// How many batches [`MetaStore::commit`] wrote since the store was opened: each is one
    /// RocksDB write (and one record of its log), the cost an operation pays per commit.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The journal of shared changes (idle until [`MetaStore::enable_journal`]).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The number of the last journaled batch this store holds (0 if it never journaled).
    pub fn local_seq(&self) -> Result<u64> {
        self.db.get_pinned(codec::JOURNAL_SEQ_KEY)?.map_or(Ok(0), |v| codec::decode_u64(&v))
    }

    /// The last journaled batch this node knows reached the store (0 if none).
    pub fn durable_seq(&self) -> Result<u64> {
        self.db.get_pinned(codec::DURABLE_SEQ_KEY)?.map_or(Ok(0), |v| codec::decode_u64(&v))
    }

    /// Records that every batch up to `seq` is in the store (local bookkeeping only).
    pub fn set_durable_seq(&self, seq: u64) -> Result<()> {
        self.db.put_opt(codec::DURABLE_SEQ_KEY, seq.to_le_bytes(), &self.write_opts)?;
        Ok(())
    }

    /// Starts numbering and queueing batches after [`MetaStore::local_seq`]; segments of the
    /// remote journal are numbered from `next_segment`.
    pub fn enable_journal(&self, next_segment: u64) -> Result<()> {
        self.journal.enable(self.local_seq()?, next_segment);
        Ok(())
    }

    /// Calls `f(key, value)` for every key of the shared tables as of one consistent cut, and
    /// returns the cut's `(last batch, next segment)` (see [`Journal::at_cut`]). Chunk records
    /// come out as not resident.
    pub fn export(&self, mut f: impl FnMut(&[u8], &[u8]) -> Result<()>) -> Result<(u64, u64)> {
        let (seq, segment, snap) =
            self.journal.at_cut(|seq, seg| Ok::<_, MetaError>((seq, seg, self.db.snapshot())))?;
        for item in snap.iterator(IteratorMode::Start) {
            let (k, v) = item?;
            if !codec::is_shared(&k) {
                continue;
            }
            let k = self.sealing.open_key(&k)?;
            let v = self.sealing.open_value(&k, &v)?;
            if codec::is_chunk_key(&k) {
                f(&k, &codec::not_resident(&v))?;
            } else {
                f(&k, &v)?;
            }
        }
        Ok((seq, segment))
    }

    /// Applies changes from the store (restore): puts and deletes of shared keys, and sets the
    /// local journal position to `seq`.
    pub fn import(&self, ops: &[JournalOp], seq: u64) -> Result<()> {
        let mut wb = WriteBatch::default();
        for op in ops {
            let key = match op {
                JournalOp::Put { key, .. } | JournalOp::Delete { key } | JournalOp::DeleteRange { from: key, .. } => {
                    key
                }
            };
            if !codec::is_shared(key) {
                return Err(MetaError::Corrupt(format!("journal changes a local key {key:?}")));
            }
            match op {
                JournalOp::Put { key, value } => {
                    check_put(key, value)?;
                    wb.put(self.sealing.key(key), self.sealing.value(key, value))
                }
                JournalOp::Delete { key } => wb.delete(self.sealing.key(key)),
                JournalOp::DeleteRange { from, to } => {
                    wb.delete_range(self.sealing.bound(from)?, self.sealing.bound(to)?)
                }
            }
        }
        wb.put(codec::JOURNAL_SEQ_KEY, seq.to_le_bytes());
        let touched = touched_inodes(ops);
        let touched_names = touched_dentries(ops);
        let _order = self.cached_writes.lock();
        self.inodes.invalidate(&touched);
        self.dentries.invalidate(&touched_names);
        let result = self.db.write_opt(wb, &self.write_opts);
        self.inodes.invalidate(&touched);
        self.dentries.invalidate(&touched_names);
        Ok(result?)
    }

    /// The changes that turn this store's shared state into the state `ops` describe: a
    /// checkpoint's entries (all puts) followed by the journal after it. A follower applies
    /// them with [`MetaStore::import`] when the writer compacted the journal past its place:
    /// only what differs is written, and chunk records that differ only in residency (this
    /// node's cache) are left alone. Holds both states in memory.
    pub fn diff_to_state(&self, ops: Vec<JournalOp>) -> Result<Vec<JournalOp>> {
        let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for op in ops {
            match op {
                JournalOp::Put { key, value } => {
                    want.insert(key, value);
                }
                JournalOp::Delete { key } => {
                    want.remove(&key);
                }
                JournalOp::DeleteRange { from, to } => {
                    let doomed: Vec<Vec<u8>> = want.range(from..to).map(|(k, _)| k.clone()).collect();
                    for k in doomed {
                        want.remove(&k);
                    }
                }
            }
        }
        let same = |k: &[u8], have: &[u8], new: &[u8]| {
            have == new || (codec::is_chunk_key(k) && codec::not_resident(have) == codec::not_resident(new))
        };
        let mut out = Vec::new();
        for item in self.db.iterator(IteratorMode::Start) {
            let (k, v) = item?;
            if !codec::is_shared(&k) {
                continue;
            }
            let k = self.sealing.open_key(&k)?;
            let v = self.sealing.open_value(&k, &v)?;
            match want.remove(k.as_ref()) {
                Some(new) if same(&k, &v, &new) => {}
                Some(new) => out.push(JournalOp::Put { key: k.to_vec(), value: new }),
                None => out.push(JournalOp::Delete { key: k.to_vec() }),
            }
        }
        out.extend(want.into_iter().map(|(key, value)| JournalOp::Put { key, value }));
        Ok(out)
    }

    /// `ops` with every range delete replaced by point deletes of the keys it covers here, so
    /// a follower can tell which inodes and entries a change touched.
    pub fn expand_ranges(&self, ops: Vec<JournalOp>) -> Result<Vec<JournalOp>> {
        if !ops.iter().any(|op| matches!(op, JournalOp::DeleteRange { .. })) {
            return Ok(ops);
        }
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let JournalOp::DeleteRange { from, to } = op else {
                out.push(op);
                continue;
            };
            // Keys put earlier in `ops`, then the keys this store has.
            let earlier: Vec<Vec<u8>> = out
                .iter()
                .filter_map(|op| match op {
                    JournalOp::Put { key, .. } if *key >= from && *key < to => Some(key.clone()),
                    _ => None,
                })
                .collect();
            out.extend(earlier.into_iter().map(|key| JournalOp::Delete { key }));
            let (disk_from, disk_to) = (self.sealing.bound(&from)?, self.sealing.bound(&to)?);
            for item in self.db.iterator(IteratorMode::From(&disk_from, Direction::Forward)) {
                let (k, _) = item?;
                if k.as_ref() >= &*disk_to {
                    break;
                }
                out.push(JournalOp::Delete { key: self.sealing.open_key(&k)?.into_owned() });
            }
        }
        Ok(out)
    }

    /// Whether the store holds no shared state at all (a node that never had this workspace).
    pub fn is_empty(&self) -> Result<bool> {
        let mut empty = true;
        for item in self.db.iterator(IteratorMode::Start) {
            let (k, _) = item?;
            if codec::is_shared(&k) {
                empty = false;
                break;
            }
        }
        Ok(empty)
    }

    /// Makes every committed batch durable against power loss.
    pub fn sync(&self) -> Result<()> {
        self.db.flush_wal(true)?;
        Ok(())
    }
}

/// The value of a dirty marker put while a writer through FUSE passthrough has the file open
/// (a plain marker's value is empty; versions before it read any value as a plain marker).
const PASSTHROUGH_MARK: &[u8] = b"p";

/// The changes of one POSIX operation, committed atomically by [`MetaStore::commit`]: the
/// RocksDB batch, and the journaled form of its shared changes.
#[derive(Default)]
pub struct MetaBatch {
    /// The writes to make here, in order, with plaintext keys and values (`None`: a delete):
    /// [`MetaStore::commit`] seals them.
    writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ops: Vec<JournalOp>,
}

impl MetaBatch {
    pub fn new() -> MetaBatch {
        MetaBatch::default()
    }
    /// Adds `other`'s changes after this batch's own (both then commit as one).
    pub fn append(&mut self, mut other: MetaBatch) {
        self.writes.append(&mut other.writes);
        self.ops.append(&mut other.ops);
    }
    fn put(&mut self, key: Vec<u8>, value: &[u8]) {
        self.local_put(key.clone(), value);
        self.ops.push(JournalOp::Put { key, value: value.to_vec() });
    }
    fn delete(&mut self, key: Vec<u8>) {
        self.local_delete(key.clone());
        self.ops.push(JournalOp::Delete { key });
    }
    /// A write of this node's own state, not journaled.
    fn local_put(&mut self, key: Vec<u8>, value: &[u8]) {
        self.writes.push((key, Some(value.to_vec())));
    }
    fn local_delete(&mut self, key: Vec<u8>) {
        self.writes.push((key, None));
    }
    pub fn put_inode(&mut self, rec: &InodeRecord) {
        self.put(codec::inode_key(rec.attr.ino), &codec::encode_inode(rec));
    }
    pub fn delete_inode(&mut self, ino: Ino) {
        self.delete(codec::inode_key(ino));
    }
    pub fn put_dentry(&mut self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) {
        self.put(codec::dentry_key(parent, name), &codec::encode_dentry(ino, kind));
    }
    pub fn delete_dentry(&mut self, parent: Ino, name: &[u8]) {
        self.delete(codec::dentry_key(parent, name));
    }
    pub fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) {
        self.put(codec::xattr_key(ino, name), value);
    }
    pub fn delete_xattr(&mut self, ino: Ino, name: &[u8]) {
        self.delete(codec::xattr_key(ino, name));
    }
    pub fn put_symlink(&mut self, ino: Ino, target: &[u8]) {
        self.put(codec::symlink_key(ino), target);
    }
    pub fn delete_symlink(&mut self, ino: Ino) {
        self.delete(codec::symlink_key(ino));
    }
    pub fn put_orphan(&mut self, ino: Ino) {
        self.put(codec::orphan_key(ino), &[]);
    }
    pub fn delete_orphan(&mut self, ino: Ino) {
        self.delete(codec::orphan_key(ino));
    }
    /// A chunk's new content (journaled as not resident).
    pub fn put_chunk(&mut self, ino: Ino, index: u64, rec: &ChunkRecord) {
        let key = codec::chunk_key(ino, index);
        self.local_put(key.clone(), &codec::encode_chunk(rec));
        let shared = ChunkRecord { resident: false, ..*rec };
        self.ops.push(JournalOp::Put { key, value: codec::encode_chunk(&shared).to_vec() });
    }
    /// Only whether a chunk is resident changed: local cache state, not journaled.
    pub fn set_chunk_residency(&mut self, ino: Ino, index: u64, rec: &ChunkRecord) {
        self.local_put(codec::chunk_key(ino, index), &codec::encode_chunk(rec));
    }
    pub fn delete_chunk(&mut self, ino: Ino, index: u64) {
        self.delete(codec::chunk_key(ino, index));
    }
    pub fn put_dirty(&mut self, ino: Ino) {
        self.local_put(codec::dirty_key(ino), &[]);
    }
    /// The dirty marker of `ino` while a writer through FUSE passthrough has it open: the
    /// kernel writes its data file without the engine, so after a crash the data file's
    /// length, not the record's size, is the file's (docs/FORMAT.md, "Local metadata").
    pub fn put_dirty_passthrough(&mut self, ino: Ino) {
        self.local_put(codec::dirty_key(ino), PASSTHROUGH_MARK);
    }
    pub fn delete_dirty(&mut self, ino: Ino) {
        self.local_delete(codec::dirty_key(ino));
    }
    /// Chunk `index` of `ino` is written and not sealed yet (journaled).
    pub fn put_unsealed(&mut self, ino: Ino, index: u64) {
        self.put(codec::unsealed_key(ino, index), &[]);
    }
    pub fn delete_unsealed(&mut self, ino: Ino, index: u64) {
        self.delete(codec::unsealed_key(ino, index));
    }
    pub fn delete_block(&mut self, id: &[u8; 32]) {
        self.delete(codec::block_key(id));
    }
    pub fn put_block(&mut self, id: &[u8; 32], loc: &crate::block::BlockLoc) {
        let mut v = Vec::with_capacity(crate::block::BlockLoc::ENCODED_LEN);
        loc.encode(&mut v);
        self.put(codec::block_key(id), &v);
    }
    pub fn put_next_ino(&mut self, next: u64) {
        self.put(codec::NEXT_INO_KEY.to_vec(), &next.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Attr;

    #[test]
    fn writes_name_the_inode_records_they_touch() {
        let mut b = MetaBatch::new();
        b.delete_inode(5);
        b.put_dentry(5, b"x", 6, FileKind::File);
        b.delete_xattr(7, b"user.a");
        assert_eq!(touched_inodes(&b.ops), Touched::Keys(vec![5]));
        let range = |from: &[u8], to: &[u8]| vec![JournalOp::DeleteRange { from: from.to_vec(), to: to.to_vec() }];
        assert_eq!(touched_inodes(&range(b"A", b"Z")), Touched::All);
        assert_eq!(touched_inodes(&range(&codec::inode_key(3), &codec::inode_key(9))), Touched::All);
        assert_eq!(touched_inodes(&range(b"D", b"E")), Touched::Keys(vec![]));
        assert_eq!(touched_inodes(&range(b"J", b"K")), Touched::Keys(vec![]));
    }

    #[test]
    fn inode_reads_see_every_commit_and_import() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let mut rec = codec::test_file_record(9, 1);
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        store.commit(b).expect("commit");
        assert_eq!(store.inode(9).expect("read").map(|r| r.attr.size), Some(1)); // fills the cache
        rec.attr.size = 2;
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        store.commit(b).expect("commit");
        assert_eq!(store.inode(9).expect("read").map(|r| r.attr.size), Some(2));
        rec.attr.size = 3;
        let value = codec::encode_inode(&rec);
        store.import(&[JournalOp::Put { key: codec::inode_key(9), value }], 1).expect("import");
        assert_eq!(store.inode(9).expect("read").map(|r| r.attr.size), Some(3));
        let mut b = MetaBatch::new();
        b.delete_inode(9);
        store.commit(b).expect("commit");
        assert_eq!(store.inode(9).expect("read"), None);
    }

    #[test]
    fn a_commit_caches_the_records_it_leaves_and_not_those_it_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let cached = |ino| match store.inodes.lookup(&ino) {
            Lookup::Hit(r) => Some(r.attr.size),
            Lookup::Miss(_) => None,
        };
        let mut b = MetaBatch::new();
        b.put_inode(&codec::test_file_record(1, 10));
        b.put_inode(&codec::test_file_record(2, 20));
        b.put_inode(&codec::test_file_record(2, 21)); // the later put wins
        b.put_inode(&codec::test_file_record(3, 30));
        b.delete_inode(3); // put, then deleted in the same batch
        store.commit(b).expect("commit");
        assert_eq!((cached(1), cached(2), cached(3)), (Some(10), Some(21), None));
        assert_eq!(store.inode(2).expect("read").map(|r| r.attr.size), Some(21));
        assert_eq!(store.inode(3).expect("read"), None);
        // What the cache holds is what RocksDB holds.
        let mut b = MetaBatch::new();
        b.delete_inode(1);
        store.commit(b).expect("commit");
        assert_eq!(cached(1), None);
        assert_eq!(store.inode(1).expect("read"), None);

        let range =
            |from: Ino, to: Ino| JournalOp::DeleteRange { from: codec::inode_key(from), to: codec::inode_key(to) };
        let put = |ino, size| JournalOp::Put {
            key: codec::inode_key(ino),
            value: codec::encode_inode(&codec::test_file_record(ino, size)),
        };
        let sizes = |ops: &[JournalOp]| written_inodes(ops).iter().map(|r| r.attr.size).collect::<Vec<_>>();
        assert_eq!(sizes(&[put(4, 1), range(1, 9), put(5, 2)]), vec![2]);
        assert_eq!(sizes(&[put(4, 1), JournalOp::Delete { key: codec::dentry_key(4, b"x") }]), vec![1]);
    }

    #[test]
    fn writes_name_the_entries_they_touch() {
        let mut b = MetaBatch::new();
        b.put_dentry(5, b"x", 6, FileKind::File);
        b.delete_dentry(5, b"y");
        b.put_inode(&codec::test_file_record(6, 0));
        assert_eq!(
            touched_dentries(&b.ops),
            Touched::Keys(vec![codec::dentry_key(5, b"x"), codec::dentry_key(5, b"y")])
        );
        assert_eq!(
            written_dentries(&b.ops),
            vec![(codec::dentry_key(5, b"x"), Some((6, FileKind::File))), (codec::dentry_key(5, b"y"), None)]
        );
        let range = |from: &[u8], to: &[u8]| vec![JournalOp::DeleteRange { from: from.to_vec(), to: to.to_vec() }];
        assert_eq!(touched_dentries(&range(b"A", b"Z")), Touched::All);
        assert_eq!(touched_dentries(&range(&codec::dentry_prefix(3), &codec::dentry_prefix(4))), Touched::All);
        assert_eq!(touched_dentries(&range(b"E", b"K")), Touched::Keys(vec![]));
        assert_eq!(touched_dentries(&range(b"A", b"D")), Touched::Keys(vec![]));
    }

    #[test]
    fn an_entry_from_the_store_whose_name_is_no_path_component_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let good = JournalOp::Put {
            key: codec::dentry_key(1, b"ok"),
            value: codec::encode_dentry(7, FileKind::File).to_vec(),
        };
        let long = vec![b'x'; 256];
        for name in [&b""[..], b".", b"..", b"../../escape", b"/etc/cron.d/x", b"a/b", b"nul\0byte", &long] {
            let bad = JournalOp::Put {
                key: codec::dentry_key(1, name),
                value: codec::encode_dentry(8, FileKind::File).to_vec(),
            };
            let err = store.import(&[good.clone(), bad], 1).expect_err("a bad name was imported");
            assert!(matches!(err, MetaError::Corrupt(_)) && err.to_string().contains("directory entry"), "{err}");
            assert_eq!(store.dentry(1, b"ok").expect("read"), None, "nothing of the batch was written");
        }
        let bad_value = JournalOp::Put { key: codec::dentry_key(1, b"v"), value: vec![1, 2] };
        assert!(store.import(&[bad_value], 1).is_err(), "a value that does not decode");
        store.import(&[good], 1).expect("a good entry imports");
        assert_eq!(store.dentry(1, b"ok").expect("read"), Some((7, FileKind::File)));
    }

    #[test]
    fn records_from_the_store_past_their_bounds_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let good = JournalOp::Put {
            key: codec::dentry_key(1, b"ok"),
            value: codec::encode_dentry(7, FileKind::File).to_vec(),
        };
        let huge = codec::InodeRecord {
            attr: Attr { size: MAX_FILE_SIZE + 1, ..codec::test_file_record(9, 0).attr },
            ..codec::test_file_record(9, 0)
        };
        let chunk = |len: u32, data: u32| codec::ChunkRecord { block: [1; 32], len, data, resident: false };
        let put = |key: Vec<u8>, value: Vec<u8>| JournalOp::Put { key, value };
        let bad = [
            ("a file of", put(codec::inode_key(9), codec::encode_inode(&huge))),
            ("record of 3 bytes", put(codec::inode_key(9), vec![2, 1, 0])),
            ("a symlink target of 0 bytes", put(codec::symlink_key(9), Vec::new())),
            ("a symlink target of 4097 bytes", put(codec::symlink_key(9), vec![b'a'; SYMLINK_MAX + 1])),
            ("a symlink target of 3 bytes", put(codec::symlink_key(9), b"a\0b".to_vec())),
            ("an xattr name of 0 bytes", put(codec::xattr_key(9, b""), b"v".to_vec())),
            ("an xattr name of 256 bytes", put(codec::xattr_key(9, &[b'u'; 256]), b"v".to_vec())),
            ("an xattr value of 65537 bytes", put(codec::xattr_key(9, b"user.x"), vec![0; XATTR_SIZE_MAX + 1])),
            ("of 4194305 bytes", put(codec::chunk_key(9, 0), codec::encode_chunk(&chunk(4 << 20 | 1, 1)).to_vec())),
            ("2 of them data", put(codec::chunk_key(9, 0), codec::encode_chunk(&chunk(1, 2)).to_vec())),
            ("chunk 4194304", put(codec::chunk_key(9, 4 << 20), codec::encode_chunk(&chunk(1, 1)).to_vec())),
            ("chunk record of 5 bytes", put(codec::chunk_key(9, 0), vec![2; 5])),
            ("short key", put(b"D12".to_vec(), codec::encode_dentry(8, FileKind::File).to_vec())),
        ];
        for (said, op) in bad {
            let err = store.import(&[good.clone(), op], 1).expect_err(said);
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{said}: {err}");
            assert!(err.to_string().contains(said), "{said}: {err}");
            assert_eq!(store.dentry(1, b"ok").expect("read"), None, "{said}: nothing of the batch was written");
        }
        // At the bounds: imported.
        let largest = codec::InodeRecord {
            attr: Attr { size: MAX_FILE_SIZE, ..codec::test_file_record(9, 0).attr },
            ..codec::test_file_record(9, 0)
        };
        let ok = [
            put(codec::inode_key(9), codec::encode_inode(&largest)),
            put(codec::symlink_key(9), vec![b'a'; SYMLINK_MAX]),
            put(codec::xattr_key(9, &[b'u'; 255]), vec![0; XATTR_SIZE_MAX]),
            put(codec::chunk_key(9, MAX_FILE_SIZE / (4 << 20)), codec::encode_chunk(&chunk(4 << 20, 0)).to_vec()),
            good,
        ];
        store.import(&ok, 1).expect("records at their bounds import");
    }

    #[test]
    fn entry_reads_see_every_commit_and_import_also_of_names_that_did_not_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        // Missing: cached as missing, then made by a commit.
        assert_eq!(store.dentry(1, b"a").expect("read"), None);
        assert!(matches!(store.dentries.lookup(&codec::dentry_key(1, b"a")), Lookup::Hit(None)));
        let mut b = MetaBatch::new();
        b.put_dentry(1, b"a", 7, FileKind::File);
        store.commit(b).expect("commit");
        assert!(matches!(store.dentries.lookup(&codec::dentry_key(1, b"a")), Lookup::Hit(Some((7, FileKind::File)))));
        assert_eq!(store.dentry(1, b"a").expect("read"), Some((7, FileKind::File)));
        // An import changes it, and removes another that was read and cached.
        let mut b = MetaBatch::new();
        b.put_dentry(1, b"b", 8, FileKind::Dir);
        store.commit(b).expect("commit");
        assert_eq!(store.dentry(1, b"b").expect("read"), Some((8, FileKind::Dir)));
        let ops = [
            JournalOp::Put {
                key: codec::dentry_key(1, b"a"),
                value: codec::encode_dentry(9, FileKind::Symlink).to_vec(),
            },
            JournalOp::Delete { key: codec::dentry_key(1, b"b") },
        ];
        store.import(&ops, 1).expect("import");
        assert_eq!(store.dentry(1, b"a").expect("read"), Some((9, FileKind::Symlink)));
        assert_eq!(store.dentry(1, b"b").expect("read"), None);
        // A range delete over the directory drops every cached entry.
        store
            .import(&[JournalOp::DeleteRange { from: codec::dentry_prefix(1), to: codec::dentry_prefix(2) }], 2)
            .expect("import");
        assert_eq!(store.dentry(1, b"a").expect("read"), None);
        // A removed entry reads as missing from the cache, like RocksDB.
        let mut b = MetaBatch::new();
        b.put_dentry(1, b"c", 10, FileKind::File);
        store.commit(b).expect("commit");
        let mut b = MetaBatch::new();
        b.delete_dentry(1, b"c");
        store.commit(b).expect("commit");
        assert!(matches!(store.dentries.lookup(&codec::dentry_key(1, b"c")), Lookup::Hit(None)));
        assert_eq!(store.dentry(1, b"c").expect("read"), None);
    }

    #[test]
    fn damaged_metadata_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(MetaStore::open(dir.path()).expect("open"));
        std::fs::write(dir.path().join("CURRENT"), b"garbage\n").expect("damage CURRENT");
        let err = MetaStore::open(dir.path()).err().expect("a damaged store must not open");
        assert!(matches!(err, MetaError::Damaged { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("move the data directory aside") && msg.contains("restored from the store"), "{msg}");
    }

    #[test]
    fn newer_schema_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = MetaStore::open(dir.path()).expect("open");
            let mut b = WriteBatch::default();
            b.put(codec::SCHEMA_KEY, (SCHEMA_VERSION + 1).to_le_bytes());
            store.db.write(b).expect("write");
        }
        let err = MetaStore::open(dir.path()).err().expect("must refuse");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("schema version {}", SCHEMA_VERSION + 1)) && msg.contains("upgrade tierfs"),
            "{msg}"
        );
    }

    #[test]
    fn prefix_ends_bound_exactly_the_prefix() {
        assert_eq!(prefix_end(b"X\x00\x01"), Some(b"X\x00\x02".to_vec()));
        assert_eq!(prefix_end(b"X\x00\xff"), Some(b"X\x01".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn an_older_schema_is_upgraded_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = MetaStore::open(dir.path()).expect("open");
            let mut b = WriteBatch::default();
            b.put(codec::SCHEMA_KEY, 1u32.to_le_bytes());
            store.db.write(b).expect("write");
        }
        let store = MetaStore::open(dir.path()).expect("an older schema opens");
        let v = store.db.get(codec::SCHEMA_KEY).expect("get").expect("schema key");
        assert_eq!(v, SCHEMA_VERSION.to_le_bytes());
    }

    #[test]
    fn list_dir_stays_inside_its_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let mut b = MetaBatch::new();
        b.put_dentry(1, b"a", 2, FileKind::File);
        b.put_dentry(1, b"b", 3, FileKind::Dir);
        b.put_dentry(2, b"c", 4, FileKind::File);
        store.commit(b).expect("commit");
        let names: Vec<_> = store.list_dir(1).expect("list").into_iter().map(|e| e.0).collect();
        assert_eq!(names, vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(!store.dir_is_empty(2).expect("scan"));
        assert!(store.dir_is_empty(3).expect("scan"));
    }

    #[test]
    fn a_listing_read_in_pieces_resumes_after_a_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetaStore::open(dir.path()).expect("open");
        let mut b = MetaBatch::new();
        for (i, name) in [&b"a"[..], b"a\x00", b"ab", b"b", b"\xff"].iter().enumerate() {
            b.put_dentry(1, name, 10 + i as u64, FileKind::File);
        }
        b.put_dentry(2, b"0", 4, FileKind::File);
        store.commit(b).expect("commit");
        let names = |after: Option<&[u8]>, limit| -> Vec<Vec<u8>> {
            store.list_dir_after(1, after, limit).expect("list").into_iter().map(|e| e.0).collect()
        };
        assert_eq!(names(None, 2), vec![b"a".to_vec(), b"a\x00".to_vec()]);
        assert_eq!(names(Some(b"a\x00"), 2), vec![b"ab".to_vec(), b"b".to_vec()]);
        assert_eq!(names(Some(b"b"), 9), vec![b"\xff".to_vec()]);
        // A name that is gone meanwhile: the listing goes on after where it sorted.
        assert_eq!(names(Some(b"aa"), 1), vec![b"ab".to_vec()]);
        assert!(names(Some(b"\xff"), 9).is_empty(), "nothing of directory 2 leaks in");
        assert!(names(None, 0).is_empty());
    }
}
