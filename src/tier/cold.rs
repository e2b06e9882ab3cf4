//! The cold tier engine: seals dirty chunks of the hot tier into blocks, uploads them, evicts
//! what is safely stored, and fetches it back on a miss.
//!
//! Every regular file is a sequence of [`CHUNK_SIZE`] chunks at the data file's own offsets
//! (docs/ARCHITECTURE.md, "Extent model"). A chunk is
//! - **dirty**: written since it was last sealed (only the local data file has its bytes);
//! - **sealed**: its bytes are a block in the store, recorded in a [`ChunkRecord`], and still
//!   resident locally;
//! - **evicted**: sealed, and the local bytes were punched out; a read fetches the block back.
//!
//! Invariants (all state transitions happen under one mutex, `ColdTier::state`):
//! - a chunk record is committed only after `put_blocks` returned, so a record always names a
//!   block that is in the store at quorum; eviction only punches chunks that have one and are
//!   not dirty, so eviction never loses a byte;
//! - writers mark a chunk dirty *before* their `pwrite` and bump its epoch *after* it (see
//!   [`WriteGuard`]); the uploader seals a chunk only if its epoch did not move and no write is
//!   in flight, so a write racing with sealing leaves the chunk dirty, never falsely clean;
//! - eviction punches under the mutex, and writers mark under the mutex before writing, so a
//!   write never lands in a chunk that is being punched; a write to an evicted chunk first
//!   fetches it (unless it overwrites the whole chunk);
//! - an inode with dirty chunks carries a persistent dirty marker, so after a crash its chunks
//!   are re-sealed (and a stale chunk record is never trusted over newer local bytes);
//! - writers are throttled, never failed, while dirty bytes exceed the bound;
//! - a file larger than [`ColdConfig::stream_above`] is *streamed*: the blocks its reads fetch
//!   go to a small in-memory buffer keyed by block id, not into the data file, and its chunks
//!   stay evicted. A read is served from that buffer only while its chunk is evicted, clean
//!   and its record names that block, so the buffer can never show stale bytes (a write first
//!   fetches the chunk into the data file and marks it dirty).
//!
//! The store is reached through [`BlockStore`] (blocking calls from worker threads), so this
//! layer knows nothing of backends, encryption or async runtimes.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::{DataFile, HotTier, HotTierError};
use crate::block::{BlockId, BlockLoc, CHUNK_SIZE, PackBuilder, ZERO_BLOCK};
use crate::crypto::Keys;
use crate::meta::{ChunkRecord, MetaBatch, MetaError, MetaStore};
use crate::store::StoreError;
use crate::types::ErrorKind;
use crate::types::Ino;

/// Chunks used within this many of the engine's ticks (one per read, write or fetch) are not
/// evicted to keep the disk's free-space floor.
const RECENT_TICKS: u64 = 256;

/// Read-ahead fetches up to this many consecutive chunks of a file together.
const FETCH_GROUP: usize = 4;

/// What [`ColdTier::start_fetch`] found.
enum Fetch {
    /// Resident (or gone): nothing to fetch.
    Done,
    /// Someone else is fetching it.
    Busy,
    /// This caller fetches it (its record).
    Mine(ChunkRecord),
}

/// How long a small upload waits for more small files to share its pack.
const GATHER: Duration = Duration::from_millis(200);

/// The store as the tier sees it. Calls block; they are made from worker threads and from
/// FUSE worker threads, never from inside an async runtime.
pub trait BlockStore: Send + Sync {
    /// This store's keys: block ids are keyed hashes under them, and blocks are sealed with them.
    fn keys(&self) -> &Keys;
    /// The id of a block with these bytes (keyed hash: only the store's key holder can compute it).
    fn block_id(&self, data: &[u8]) -> BlockId {
        self.keys().block_id(data)
    }
    /// Uploads a pack the tier filled (blocks sealed with [`BlockStore::keys`]) and returns
    /// where each block landed, after they are durable.
    fn put_pack(&self, pack: PackBuilder) -> Result<Vec<(BlockId, BlockLoc)>, StoreError>;
    /// Fetches and verifies one block.
    fn get_block(&self, id: &BlockId, loc: &BlockLoc) -> Result<Bytes, StoreError>;
    /// Fetches and verifies several blocks (in order); blocks next to each other in one pack
    /// may come in one request.
    fn get_blocks(&self, blocks: &[(BlockId, BlockLoc)]) -> Result<Vec<Bytes>, StoreError> {
        blocks.iter().map(|(id, loc)| self.get_block(id, loc)).collect()
    }
    /// Target bytes per pack.
    fn pack_size(&self) -> usize;
}

/// Why a cold-tier operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ColdError {
    /// The store failed; its error keeps its kind (unavailable, corrupt, not found).
    #[error("store: {0}")]
    Store(Arc<StoreError>),
    /// A batched fetch ended without an answer for this block (a bug, reported as EIO).
    #[error("the store returned no data for a requested block")]
    NotFetched,
    #[error("block {block} (chunk {index} of inode {ino}) is not in the local block index")]
    MissingLocation { ino: Ino, index: u64, block: String },
    #[error("block of chunk {index} of inode {ino} has {got} bytes, expected {want}")]
    WrongLength { ino: Ino, index: u64, got: usize, want: usize },
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    HotTier(#[from] HotTierError),
}

impl ColdError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ColdError::Store(e) => e.kind(),
            ColdError::NotFetched => ErrorKind::Internal,
            ColdError::MissingLocation { .. } | ColdError::WrongLength { .. } => ErrorKind::Corrupt,
            ColdError::Meta(e) => e.kind(),
            ColdError::HotTier(e) => e.kind(),
        }
    }
}

impl From<StoreError> for ColdError {
    fn from(e: StoreError) -> ColdError {
        ColdError::Store(Arc::new(e))
    }
}

impl ColdError {
    pub fn errno(&self) -> i32 {
        match self {
            ColdError::HotTier(e) => e.errno(),
            ColdError::Meta(e) => e.errno(),
            _ => libc::EIO,
        }
    }
}

/// Tuning of the cold tier.
#[derive(Debug, Clone)]
pub struct ColdConfig {
    /// Upper bound of the hot tier's size (bytes); eviction keeps below it.
    pub cache_size: Option<u64>,
    /// Writers wait while more than this many bytes are dirty.
    pub max_dirty: u64,
    /// A chunk written this long ago is sealed even if its file is still open.
    pub seal_after: Duration,
    /// Parallel uploads.
    pub uploaders: usize,
    /// Parallel fetches for read-ahead.
    pub prefetchers: usize,
    /// Chunks fetched ahead of a sequential reader.
    pub prefetch_chunks: u64,
    /// Evict until at least this fraction of the disk is free.
    pub min_free_ratio: f64,
    /// Reads of a file larger than this stream: fetched blocks stay in memory for the reader
    /// and are not written to the hot tier (a file that cannot stay cached would only push
    /// everything else out, and writing it costs the reader a copy through the page cache).
    /// `None`: every fetched block is cached.
    pub stream_above: Option<u64>,
}

impl ColdConfig {
    pub fn new(cache_size: Option<u64>) -> ColdConfig {
        let max_dirty = cache_size.map_or(1 << 30, |c| (c / 2).clamp(2 * CHUNK_SIZE, 1 << 30));
        ColdConfig {
            cache_size,
            max_dirty,
            seal_after: Duration::from_millis(500),
            uploaders: 4,
            prefetchers: 4,
            prefetch_chunks: 16,
            min_free_ratio: 0.05,
            stream_above: cache_size.map(|c| c / 2),
        }
    }
}

/// Numbers for `tierfs status` (also its JSON form).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColdStats {
    /// Bytes written but not yet in the store.
    pub dirty_bytes: u64,
    pub dirty_files: u64,
    pub oldest_dirty_ms: u64,
    pub resident_bytes: u64,
    pub evicted_bytes: u64,
    pub uploaded_bytes: u64,
    pub uploaded_packs: u64,
    pub fetched_bytes: u64,
    pub evictions: u64,
    pub upload_errors: u64,
    /// Cached chunks that failed their check against the store at start (fetched again).
    #[serde(default)]
    pub verify_failures: u64,
    /// Of `fetched_bytes`, those fetched for streamed reads (kept in memory, not cached).
    #[serde(default)]
    pub streamed_bytes: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
struct Chunk {
    /// Last sealed content, if any.
    rec: Option<ChunkRecord>,
    dirty: bool,
    /// Estimate of the dirty bytes (for the dirty bound and `status`): the length of the span
    /// from the first to the last byte written since the last seal, so a small write far
    /// into a chunk counts its own bytes, not the hole before it.
    dirty_len: u64,
    /// Where that span starts, as an offset in the chunk.
    dirty_from: u64,
    /// Bytes held locally (0 when evicted).
    local_len: u64,
    epoch: u64,
    inflight: u32,
    /// Reads between their fetch and their `pread`: not evictable.
    readers: u32,
    /// The local bytes were checked against the record's block id since this process
    /// started (or were written, sealed or fetched by it): only then are they served.
    verified: bool,
    claimed: bool,
    fetching: bool,
    last_access: u64,
}

impl Chunk {
    fn evicted(&self) -> bool {
        self.rec.is_some_and(|r| !r.resident)
    }

    /// Bytes that live only in the store. A zero block is stored nowhere: like a hole, it
    /// takes no space.
    fn evicted_len(&self) -> u64 {
        self.rec.filter(|r| !r.resident && r.block != ZERO_BLOCK).map_or(0, |r| u64::from(r.len))
    }

    /// Clean, resident bytes from an earlier run that were not checked yet.
    fn unverified(&self) -> bool {
        !self.dirty && !self.verified && self.rec.is_some_and(|r| r.resident)
    }

    /// Must be checked or fetched before its bytes are used.
    fn not_ready(&self) -> bool {
        self.evicted() || self.unverified()
    }
}

#[derive(Debug, Default)]
struct FileState {
    chunks: BTreeMap<u64, Chunk>,
    dirty_chunks: usize,
    dirty_since: Option<Instant>,
    open: bool,
    marked_dirty: bool,
    /// Larger than [`ColdConfig::stream_above`] when last read: read-ahead fetches into the
    /// stream buffer, not into the data file.
    streaming: bool,
    /// Never streamed, whatever its size ([`ColdTier::keep_cached`]).
    keep_cached: bool,
    /// The chunk after the last streamed read that queued read-ahead.
    stream_ahead_from: Option<u64>,
}

impl FileState {
    /// Whether chunk `idx` must be fetched or verified before its bytes are used.
    fn not_ready(&self, idx: u64) -> bool {
        self.chunks.get(&idx).is_some_and(Chunk::not_ready)
    }
}

#[derive(Default)]
struct State {
    files: HashMap<Ino, FileState>,
    dirty_bytes: u64,
    resident_bytes: u64,
    tick: u64,
    flush: bool,
    /// Files an fsync waits for (with how many waiters): sealed at once, partial chunks too.
    urgent: HashMap<Ino, u32>,
    stopping: bool,
    prefetch: VecDeque<(Ino, u64)>,
    /// Files that may have dirty chunks (a superset: cleaned up as the uploaders look), so
    /// claiming work does not walk every file of a large workspace on every wake-up.
    dirty_inos: HashSet<Ino>,
    /// Blocks fetched for streamed files (see the module invariants).
    streamed: StreamBuffer,
}

/// Verified plaintext of recently fetched blocks of streamed files, by block id.
/// Content-addressed, so an entry is never stale; whether it may serve a read is decided by
/// the chunk's state. When full, blocks that were read already go first (least recently used
/// first), then blocks fetched ahead and not read yet (oldest first): plain LRU dropped blocks
/// fetched ahead before their reader got to them, while the blocks behind it, just read,
/// looked recent.
///
/// The blocks of one fetch may share one buffer (a range GET decrypted where it was
/// received), which is freed only when the last of them goes. So the cap counts fetch
/// groups: a group weighs all the blocks it came with until its last one is dropped, and the
/// buffer's memory stays within `cap` blocks whatever order they are read and dropped in.
#[derive(Default)]
struct StreamBuffer {
    blocks: HashMap<BlockId, BufferedBlock>,
    /// Per fetch group: (blocks fetched together, how many of them are still here).
    groups: HashMap<u64, (usize, usize)>,
    next_group: u64,
}

struct BufferedBlock {
    data: Bytes,
    /// Engine tick of the last use (or of the fetch).
    used: u64,
    /// Read at least once since it was fetched.
    read: bool,
    /// The fetch it came with.
    group: u64,
}

impl StreamBuffer {
    fn get(&mut self, id: &BlockId, tick: u64) -> Option<Bytes> {
        let block = self.blocks.get_mut(id)?;
        block.used = tick;
        block.read = true;
        Some(block.data.clone())
    }

    /// A new fetch group of `size` blocks, to pass to [`StreamBuffer::insert`] with each.
    fn new_group(&mut self, size: usize) -> (u64, usize) {
        self.next_group += 1;
        (self.next_group, size.max(1))
    }

    /// Blocks' worth of memory held: every group with a block left, at its full size.
    fn retained(&self) -> usize {
        self.groups.values().map(|&(size, _)| size).sum()
    }

    fn insert(&mut self, id: BlockId, data: Bytes, tick: u64, cap: usize, (group, size): (u64, usize)) {
        self.remove(&id);
        let new_weight = if self.groups.contains_key(&group) { 0 } else { size };
        while self.retained() + new_weight > cap.max(1) {
            // Only other groups' blocks: dropping one of this group's frees nothing.
            let victim = self.blocks.iter().filter(|(_, b)| b.group != group).min_by_key(|(_, b)| (!b.read, b.used));
            let Some(victim) = victim.map(|(k, _)| *k) else { break };
            self.remove(&victim);
        }
        self.groups.entry(group).or_insert((size, 0)).1 += 1;
        self.blocks.insert(id, BufferedBlock { data, used: tick, read: false, group });
    }

    fn remove(&mut self, id: &BlockId) {
        let Some(block) = self.blocks.remove(id) else { return };
        if let Some(g) = self.groups.get_mut(&block.group) {
            g.1 -= 1;
            if g.1 == 0 {
                self.groups.remove(&block.group);
            }
        }
    }
}

#[derive(Default)]
struct Counters {
    uploaded_bytes: AtomicU64,
    uploaded_packs: AtomicU64,
    fetched_bytes: AtomicU64,
    evictions: AtomicU64,
    upload_errors: AtomicU64,
    verify_failures: AtomicU64,
    streamed_bytes: AtomicU64,
}

/// The cold tier of one workspace.
pub struct ColdTier {
    store: Arc<dyn BlockStore>,
    meta: Arc<MetaStore>,
    hot: Arc<HotTier>,
    config: ColdConfig,
    state: Mutex<State>,
    /// Waiters on the state: fetches, throttled writers, flushes, truncates.
    changed: Condvar,
    /// Uploaders wait here: woken (one at a time) by a finished write or a closed file, all
    /// at once by a flush; they also look every 100 ms. Apart from `changed`, so that each
    /// write does not wake every worker thread (a file of an untar woke nine).
    work: Condvar,
    /// Read-ahead threads wait here, woken when chunks are queued ahead of a reader.
    ahead: Condvar,
    /// The evictor's 200 ms tick (woken early only to stop).
    tick: Condvar,
    counters: Counters,
    last_error: Mutex<Option<String>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// Chunk indexes covering `range`.
fn chunks_of(range: &Range<u64>) -> Range<u64> {
    if range.start >= range.end {
        return 0..0;
    }
    range.start / CHUNK_SIZE..(range.end - 1) / CHUNK_SIZE + 1
}

fn chunk_len(size: u64, index: u64) -> u64 {
    size.saturating_sub(index * CHUNK_SIZE).min(CHUNK_SIZE)
}

/// Marks an in-flight write; dropping it ends the write (see the module invariants).
pub struct WriteGuard<'a> {
    tier: &'a ColdTier,
    ino: Ino,
    chunks: Vec<u64>,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.tier.state.lock();
        if let Some(f) = st.files.get_mut(&self.ino) {
            for idx in &self.chunks {
                if let Some(c) = f.chunks.get_mut(idx) {
                    c.inflight = c.inflight.saturating_sub(1);
                    c.epoch += 1;
                }
            }
        }
        drop(st);
        // Only an uploader cares: the chunk may be sealable now.
        self.tier.work.notify_one();
    }
}

/// Pins chunks against eviction while a read uses them.
pub struct ReadGuard<'a> {
    tier: &'a ColdTier,
    ino: Ino,
    /// The chunks pinned (those with a state: a hole has nothing to pin).
    chunks: Vec<u64>,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if self.chunks.is_empty() {
            return;
        }
        let mut st = self.tier.state.lock();
        if let Some(f) = st.files.get_mut(&self.ino) {
            for idx in &self.chunks {
                if let Some(c) = f.chunks.get_mut(idx) {
                    c.readers = c.readers.saturating_sub(1);
                }
            }
        }
    }
}

struct Claim {
    ino: Ino,
    index: u64,
    epoch: u64,
}

impl ColdTier {
    /// Loads the chunk state from the metadata store, marks everything not yet stored as
    /// dirty, and starts the uploader, evictor and prefetcher threads.
    pub fn start(
        store: Arc<dyn BlockStore>,
        meta: Arc<MetaStore>,
        hot: Arc<HotTier>,
        config: ColdConfig,
    ) -> Result<Arc<ColdTier>, ColdError> {
        let mut st = State::default();
        for (ino, index, rec) in meta.chunks()? {
            let local_len = if rec.resident { u64::from(rec.len) } else { 0 };
            st.files
                .entry(ino)
                .or_default()
                .chunks
                .insert(index, Chunk { rec: Some(rec), local_len, ..Chunk::default() });
        }
        // Inodes marked dirty by a version that marked inodes only (their resident chunks
        // are re-sealed), and the chunks marked unsealed: written, maybe not sealed since.
        let marked: HashSet<Ino> = meta.dirty_inodes()?.into_iter().collect();
        let mut unsealed = meta.unsealed_chunks()?;
        let mut stale = MetaBatch::new();
        let mut sizes: HashMap<Ino, u64> = HashMap::new();
        for (ino, size, dense) in meta.file_sizes()? {
            sizes.insert(ino, size);
            let n = size.div_ceil(CHUNK_SIZE);
            let f = st.files.entry(ino).or_default();
            f.marked_dirty = marked.contains(&ino);
            let marks = unsealed.remove(&ino).unwrap_or_default();
            let mut dirty: HashSet<u64> = HashSet::new();
            for &idx in &marks {
                if idx < n {
                    dirty.insert(idx);
                } else {
                    stale.delete_unsealed(ino, idx);
                }
            }
            if f.marked_dirty {
                // Written after it was sealed (crash before re-sealing).
                dirty.extend(f.chunks.range(..n).filter(|(_, c)| !c.evicted()).map(|(i, _)| *i));
            }
            // Chunks with no record that hold data here were never sealed (a data dir used
            // without a store before). Found from the data file's extents, never by reading:
            // a chunk with neither data nor a record is a hole and stays one.
            if (f.chunks.range(..n).count() as u64) < n {
                if dense {
                    dirty.extend((0..n).filter(|i| !f.chunks.contains_key(i)));
                } else if let Some(file) = hot.open_existing(ino)? {
                    for run in (DataFile { file: &file, ino }).data_extents(0..size)? {
                        dirty.extend(chunks_of(&run).filter(|i| !f.chunks.contains_key(i)));
                    }
                }
            }
            for index in dirty {
                let len = chunk_len(size, index);
                let c = f.chunks.entry(index).or_insert_with(|| Chunk { local_len: len, ..Chunk::default() });
                if !c.dirty {
                    c.dirty = true;
                    c.dirty_len = len;
                    f.dirty_chunks += 1;
                    st.dirty_bytes += len;
                }
                if !marks.contains(&index) {
                    stale.put_unsealed(ino, index);
                }
            }
            if f.dirty_chunks > 0 {
                f.dirty_since = Some(Instant::now());
                st.dirty_inos.insert(ino);
            }
        }
        // Marks of files that are gone or empty.
        for (ino, marks) in unsealed {
            for idx in marks {
                stale.delete_unsealed(ino, idx);
            }
        }
        // Chunk records past the end of a file (a crash between a truncate and its cleanup)
        // or of deleted files are dropped.
        st.files.retain(|ino, f| {
            let size = sizes.get(ino).copied().unwrap_or(0);
            let n = size.div_ceil(CHUNK_SIZE);
            let beyond: Vec<u64> = f.chunks.range(n..).map(|(i, _)| *i).collect();
            for i in beyond {
                stale.delete_chunk(*ino, i);
                f.chunks.remove(&i);
            }
            if f.chunks.is_empty() && f.marked_dirty {
                stale.delete_dirty(*ino);
            }
            !f.chunks.is_empty()
        });
        st.resident_bytes =
            st.files.values().flat_map(|f| f.chunks.values()).map(|c| if c.evicted() { 0 } else { c.local_len }).sum();
        meta.commit(stale)?;
        let tier = Arc::new(ColdTier {
            store,
            meta,
            hot,
            config,
            state: Mutex::new(st),
            changed: Condvar::new(),
            work: Condvar::new(),
            ahead: Condvar::new(),
            tick: Condvar::new(),
            counters: Counters::default(),
            last_error: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for i in 0..tier.config.uploaders.max(1) {
            let t = tier.clone();
            threads.push(spawn(format!("tierfs-upload-{i}"), move || t.upload_loop()));
        }
        for i in 0..tier.config.prefetchers.max(1) {
            let t = tier.clone();
            threads.push(spawn(format!("tierfs-fetch-{i}"), move || t.prefetch_loop()));
        }
        let t = tier.clone();
        threads.push(spawn("tierfs-evict".into(), move || t.evict_loop()));
        let t = tier.clone();
        threads.push(spawn("tierfs-verify".into(), move || t.verify_loop()));
        *tier.threads.lock() = threads;
        Ok(tier)
    }

    /// Stops the worker threads (after [`ColdTier::flush`] if nothing may stay behind).
    pub fn shutdown(&self) {
        self.state.lock().stopping = true;
        for c in [&self.changed, &self.work, &self.ahead, &self.tick] {
            c.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }

    // ---- called by the vfs -------------------------------------------------------------

    /// Before writing `range` of `ino` (whose size is `size`): waits while too much is dirty,
    /// fetches evicted chunks the write only partly covers, and marks the chunks dirty.
    /// Every chunk of `range` is marked, so `range` is what the caller writes (a write, a
    /// copy), never a length a program merely claims.
    ///
    /// `overwrites` says the operation replaces every byte of `range`: a chunk it covers
    /// completely need not be fetched first.
    pub fn begin_write(
        &self,
        ino: Ino,
        file: &File,
        range: Range<u64>,
        size: u64,
        overwrites: bool,
    ) -> Result<WriteGuard<'_>, ColdError> {
        let chunks: Vec<u64> = chunks_of(&range).collect();
        self.begin_change(ino, file, chunks, range, size, overwrites)
    }

    /// Before zeroing `range` of `ino` (punch hole, zero range, the tail of a shrinking
    /// truncate): only chunks that hold data or have a record change; a hole stays a hole and
    /// costs nothing, so a range of any length is cheap.
    pub fn begin_zero(&self, ino: Ino, file: &File, range: Range<u64>, size: u64) -> Result<WriteGuard<'_>, ColdError> {
        let chunks = self.known_chunks(ino, chunks_of(&range));
        self.begin_change(ino, file, chunks, range, size, true)
    }

    /// Before collapsing (`insert` false) or inserting `len` bytes at `offset` of a file of
    /// `size` bytes: every chunk with data from `offset` on moves by `len`, so it and the
    /// chunks it lands on change. Costs what the file holds past `offset`, not its length.
    pub fn begin_shift(
        &self,
        ino: Ino,
        file: &File,
        offset: u64,
        len: u64,
        insert: bool,
        size: u64,
    ) -> Result<WriteGuard<'_>, ColdError> {
        let from = offset / CHUNK_SIZE;
        let held = self.known_chunks(ino, from..u64::MAX);
        let mut chunks: std::collections::BTreeSet<u64> = held.iter().copied().collect();
        for &idx in &held {
            let start = idx * CHUNK_SIZE;
            let moved = if insert {
                start.max(offset).saturating_add(len)..(start + CHUNK_SIZE).saturating_add(len)
            } else {
                start.max(offset + len).saturating_sub(len)..(start + CHUNK_SIZE).saturating_sub(len)
            };
            chunks.extend(chunks_of(&moved));
        }
        let end = if insert { size.saturating_add(len) } else { size };
        // Nothing in the range is overwritten: every byte that moves must be local first.
        self.begin_change(ino, file, chunks.into_iter().collect(), offset..end, size, false)
    }

    /// The chunks of `ino` in `idxs` that have a state (data written here, or a record).
    fn known_chunks(&self, ino: Ino, idxs: Range<u64>) -> Vec<u64> {
        let st = self.state.lock();
        st.files.get(&ino).map_or_else(Vec::new, |f| f.chunks.range(idxs).map(|(i, _)| *i).collect())
    }

    /// Marks `chunks` of `ino` dirty for a change of `range` (see [`ColdTier::begin_write`]).
    fn begin_change(
        &self,
        ino: Ino,
        file: &File,
        chunks: Vec<u64>,
        range: Range<u64>,
        size: u64,
        overwrites: bool,
    ) -> Result<WriteGuard<'_>, ColdError> {
        self.throttle(ino, &chunks);
        let needs_bytes = |idx: u64| {
            let start = idx * CHUNK_SIZE;
            let covers_all = range.start <= start && range.end >= start + CHUNK_SIZE.min(size.saturating_sub(start));
            !(overwrites && covers_all)
        };
        let mut batch = MetaBatch::new();
        let mut persist = false;
        {
            // Fetch what must be fetched, then mark under the lock — re-checking, since the
            // evictor may have punched a chunk again between the fetch and the lock.
            let mut st = loop {
                let st = self.state.lock();
                let missing: Vec<u64> = match st.files.get(&ino) {
                    Some(f) => chunks.iter().copied().filter(|&i| needs_bytes(i) && f.not_ready(i)).collect(),
                    None => Vec::new(),
                };
                if missing.is_empty() {
                    break st;
                }
                drop(st);
                for idx in missing {
                    self.verify(ino, file, idx)?;
                    self.hydrate(ino, file, idx)?;
                }
            };
            let State { files, dirty_bytes, resident_bytes, tick, dirty_inos, .. } = &mut *st;
            *tick += 1;
            let f = files.entry(ino).or_default();
            for &idx in &chunks {
                let c = f.chunks.entry(idx).or_default();
                let start = idx * CHUNK_SIZE;
                let end_in_chunk = range.end.clamp(start, start + CHUNK_SIZE) - start;
                if c.evicted() {
                    // A whole-chunk overwrite of an evicted chunk: nothing to fetch. The record
                    // says resident again so that, after a crash, the dirty marker re-seals it.
                    if let Some(r) = c.rec.as_mut() {
                        r.resident = true;
                        batch.set_chunk_residency(ino, idx, r);
                        persist = true;
                    }
                }
                if !c.dirty {
                    c.dirty = true;
                    f.dirty_chunks += 1;
                    dirty_inos.insert(ino);
                    // Before the write lands: a node that restores the workspace after this
                    // one stopped knows the chunk's data may not be in the store.
                    batch.put_unsealed(ino, idx);
                    persist = true;
                }
                let start_in_chunk = range.start.clamp(start, start + CHUNK_SIZE) - start;
                let (lo, hi) = if c.dirty_len == 0 {
                    (start_in_chunk, end_in_chunk)
                } else {
                    (c.dirty_from.min(start_in_chunk), (c.dirty_from + c.dirty_len).max(end_in_chunk))
                };
                // The span only grows: it contains the old one.
                *dirty_bytes += hi - lo - c.dirty_len;
                c.dirty_from = lo;
                c.dirty_len = hi - lo;
                if end_in_chunk > c.local_len {
                    *resident_bytes += end_in_chunk - c.local_len;
                    c.local_len = end_in_chunk;
                }
                c.inflight += 1;
                c.epoch += 1;
                c.last_access = *tick;
            }
            if !chunks.is_empty() {
                f.dirty_since.get_or_insert_with(Instant::now);
                if !f.marked_dirty {
                    f.marked_dirty = true;
                    batch.put_dirty(ino);
                    persist = true;
                }
            }
        }
        let guard = WriteGuard { tier: self, ino, chunks };
        if persist {
            self.meta.commit(batch)?;
        }
        Ok(guard)
    }

    /// Whether reading `range` of `ino` (or writing it, with `write`) may have to wait: for a
    /// fetch of evicted or unverified chunks, or for the dirty bound. A hint for callers that
    /// serve many requests on few threads; the state may change right after it is given.
    pub fn may_wait(&self, ino: Ino, range: Range<u64>, write: bool) -> bool {
        let chunks = chunks_of(&range);
        let st = self.state.lock();
        let fetch = st.files.get(&ino).is_some_and(|f| chunks.clone().any(|i| f.not_ready(i)));
        fetch || (write && self.over_dirty_bound(&st))
    }

    /// Whether writers that dirty more bytes must wait ([`ColdConfig::max_dirty`]).
    fn over_dirty_bound(&self, st: &State) -> bool {
        st.dirty_bytes >= self.config.max_dirty
    }

    /// Waits while the dirty bound is exceeded and this write would dirty more.
    fn throttle(&self, ino: Ino, chunks: &[u64]) {
        let mut st = self.state.lock();
        loop {
            let adds = match st.files.get(&ino) {
                Some(f) => chunks.iter().any(|i| f.chunks.get(i).is_none_or(|c| !c.dirty)),
                None => !chunks.is_empty(),
            };
            if !adds || !self.over_dirty_bound(&st) || st.stopping {
                return;
            }
            self.changed.wait_for(&mut st, Duration::from_millis(200));
        }
    }

    /// Before reading `range` of `ino`: fetches evicted chunks and pins them until the guard
    /// is dropped (so the evictor cannot punch them before the read), and queues read-ahead.
    pub fn begin_read(&self, ino: Ino, file: &File, range: Range<u64>) -> Result<ReadGuard<'_>, ColdError> {
        let chunks = chunks_of(&range);
        let mut missed = false;
        let mut pinned = Vec::new();
        loop {
            let missing: Vec<u64> = {
                let mut st = self.state.lock();
                let State { files, tick, .. } = &mut *st;
                *tick += 1;
                let Some(f) = files.get_mut(&ino) else {
                    return Ok(ReadGuard { tier: self, ino, chunks: Vec::new() });
                };
                // Only chunks with a state: a hole (no record, never written) is read from
                // the data file's own hole, and costs nothing here however long it is.
                let missing: Vec<u64> =
                    f.chunks.range(chunks.clone()).filter(|(_, c)| c.not_ready()).map(|(i, _)| *i).collect();
                if missing.is_empty() {
                    for (&idx, c) in f.chunks.range_mut(chunks.clone()) {
                        c.last_access = *tick;
                        c.readers += 1;
                        pinned.push(idx);
                    }
                    break;
                }
                missing
            };
            missed = true;
            for idx in missing {
                self.verify(ino, file, idx)?;
                self.hydrate(ino, file, idx)?;
            }
        }
        let guard = ReadGuard { tier: self, ino, chunks: pinned };
        // Read-ahead: when a read reaches evicted data, or the chunk after it is evicted.
        let mut st = self.state.lock();
        let ahead: Vec<u64> = match st.files.get(&ino) {
            Some(f) => {
                let next = chunks.end;
                if missed || f.chunks.get(&next).is_some_and(|c| c.evicted() && !c.fetching) {
                    (next..next + self.config.prefetch_chunks)
                        .filter(|i| f.chunks.get(i).is_some_and(|c| c.evicted() && !c.fetching))
                        .collect()
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        };
        if !ahead.is_empty() {
            for idx in ahead {
                if !st.prefetch.contains(&(ino, idx)) {
                    st.prefetch.push_back((ino, idx));
                }
            }
            drop(st);
            self.ahead.notify_all();
        }
        Ok(guard)
    }

    /// Reads `range` of a file of `size` bytes that is larger than
    /// [`ColdConfig::stream_above`] straight from the store's blocks, without caching them:
    /// missed chunks are fetched into the stream buffer, read-ahead goes there too.
    /// `None`: the file is not streamed, or part of the range is resident, dirty or a hole
    /// with no record; the caller reads through [`ColdTier::begin_read`] instead.
    pub fn read_streamed(&self, ino: Ino, range: Range<u64>, size: u64) -> Result<Option<Bytes>, ColdError> {
        if self.config.stream_above.is_none_or(|limit| size <= limit) {
            return Ok(None);
        }
        let range = range.start..range.end.min(size);
        if range.is_empty() {
            return Ok(None);
        }
        let chunks = chunks_of(&range);
        // The second pass finds what the first one fetched (unless other streams pushed it out
        // of the buffer meanwhile: then the caller's cached read takes over).
        for pass in 0..2 {
            let missing = {
                let mut st = self.state.lock();
                let State { files, tick, streamed, prefetch, .. } = &mut *st;
                *tick += 1;
                let Some(f) = files.get_mut(&ino) else { return Ok(None) };
                if f.keep_cached {
                    return Ok(None);
                }
                f.streaming = true;
                let mut parts = Vec::new();
                let mut missing = Vec::new();
                for idx in chunks.clone() {
                    let Some(rec) = f.chunks.get(&idx).filter(|c| c.evicted() && !c.dirty).and_then(|c| c.rec) else {
                        return Ok(None);
                    };
                    if rec.block == ZERO_BLOCK {
                        parts.push((idx, rec, None));
                    } else if let Some(data) = streamed.get(&rec.block, *tick) {
                        parts.push((idx, rec, Some(data)));
                    } else {
                        missing.push(idx);
                    }
                }
                if missing.is_empty() {
                    // Read-ahead when the reader moves on to another chunk (wherever its read
                    // starts: the kernel's read-ahead windows need not start at a chunk's first
                    // byte), or after a miss.
                    let queued = if pass > 0 || f.stream_ahead_from != Some(chunks.end) {
                        f.stream_ahead_from = Some(chunks.end);
                        self.queue_streamed_ahead(f, streamed, prefetch, ino, chunks.end)
                    } else {
                        false
                    };
                    drop(st);
                    if queued {
                        self.ahead.notify_all();
                    }
                    return Ok(Some(assemble(&range, &parts)));
                }
                missing
            };
            if pass > 0 {
                break;
            }
            for idx in missing {
                self.fetch_streamed(ino, idx)?;
            }
        }
        Ok(None)
    }

    /// Queues the chunks of a streamed file after `next` that are neither in the stream buffer
    /// nor being fetched; whether anything was queued.
    fn queue_streamed_ahead(
        &self,
        f: &FileState,
        streamed: &StreamBuffer,
        prefetch: &mut VecDeque<(Ino, u64)>,
        ino: Ino,
        next: u64,
    ) -> bool {
        let mut queued = false;
        for idx in next..next + self.config.prefetch_chunks {
            let Some(c) = f.chunks.get(&idx) else { break };
            let wanted = c.evicted()
                && !c.dirty
                && !c.fetching
                && c.rec.is_some_and(|r| r.block != ZERO_BLOCK && !streamed.blocks.contains_key(&r.block));
            if wanted && !prefetch.contains(&(ino, idx)) {
                prefetch.push_back((ino, idx));
                queued = true;
            }
        }
        queued
    }

    /// Fetches chunk `idx` of a streamed file into the stream buffer, or waits for whoever is
    /// fetching it (read-ahead, usually) and then looks no further.
    fn fetch_streamed(&self, ino: Ino, idx: u64) -> Result<(), ColdError> {
        let rec = {
            let mut st = self.state.lock();
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Done => return Ok(()),
                Fetch::Mine(rec) => rec,
                Fetch::Busy => {
                    while st.files.get(&ino).and_then(|f| f.chunks.get(&idx)).is_some_and(|c| c.fetching) {
                        self.changed.wait_for(&mut st, Duration::from_millis(100));
                    }
                    return Ok(());
                }
            }
        };
        let mut results = self.fetch_group(ino, &[(idx, rec)]);
        let result = results.pop().unwrap_or_else(|| Err(ColdError::NotFetched));
        let group = self.state.lock().streamed.new_group(1);
        self.finish_streamed(ino, idx, &rec, result, group)
    }

    /// Ends a fetch for a streamed file: the chunk stays evicted, its block goes to the
    /// stream buffer.
    fn finish_streamed(
        &self,
        ino: Ino,
        idx: u64,
        rec: &ChunkRecord,
        result: Result<Option<Bytes>, ColdError>,
        group: (u64, usize),
    ) -> Result<(), ColdError> {
        let result = result.and_then(|data| match data {
            Some(data) => check_len(ino, idx, rec, &data).map(|()| Some(data)),
            None => Ok(None),
        });
        let mut st = self.state.lock();
        st.tick += 1;
        let State { files, tick, streamed, .. } = &mut *st;
        if let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) {
            c.fetching = false;
        }
        let outcome = match result {
            Ok(Some(data)) => {
                let len = data.len() as u64;
                streamed.insert(rec.block, data, *tick, self.stream_buffer_blocks(), group);
                self.counters.fetched_bytes.fetch_add(len, Ordering::Relaxed);
                self.counters.streamed_bytes.fetch_add(len, Ordering::Relaxed);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        drop(st);
        self.changed.notify_all();
        outcome
    }

    /// Blocks the stream buffer holds: what read-ahead keeps in flight, twice.
    fn stream_buffer_blocks(&self) -> usize {
        2 * (self.config.prefetch_chunks as usize).max(FETCH_GROUP * self.config.prefetchers.max(1))
    }

    /// Fetches and pins every chunk of `ino` (lseek, warm-up).
    pub fn begin_read_all(&self, ino: Ino, file: &File) -> Result<ReadGuard<'_>, ColdError> {
        let end = match self.state.lock().files.get(&ino) {
            Some(f) => f.chunks.keys().next_back().map_or(0, |last| (last + 1) * CHUNK_SIZE),
            None => 0,
        };
        self.begin_read(ino, file, 0..end)
    }

    /// A truncate to `new_size` drops the chunks past the end (their records go in `batch`,
    /// which the caller commits with the new size).
    pub fn truncate(&self, ino: Ino, new_size: u64, batch: &mut MetaBatch) {
        let first_gone = new_size.div_ceil(CHUNK_SIZE);
        let mut st = self.state.lock();
        loop {
            let busy = st.files.get(&ino).is_some_and(|f| f.chunks.range(first_gone..).any(|(_, c)| c.fetching));
            if !busy {
                break;
            }
            self.changed.wait_for(&mut st, Duration::from_millis(100));
        }
        let State { files, dirty_bytes, resident_bytes, .. } = &mut *st;
        let Some(f) = files.get_mut(&ino) else { return };
        if self.config.stream_above.is_none_or(|limit| new_size <= limit) {
            f.streaming = false;
        }
        let gone: Vec<u64> = f.chunks.range(first_gone..).map(|(i, _)| *i).collect();
        for idx in gone {
            if let Some(c) = f.chunks.remove(&idx) {
                if c.dirty {
                    f.dirty_chunks -= 1;
                    *dirty_bytes -= c.dirty_len;
                    batch.delete_unsealed(ino, idx);
                }
                if !c.evicted() {
                    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
                }
                if c.rec.is_some() {
                    batch.delete_chunk(ino, idx);
                }
            }
        }
    }

    /// The inode is gone: forget its chunks, deleting their records in `batch` (the batch that
    /// deletes the inode).
    pub fn forget(&self, ino: Ino, batch: &mut MetaBatch) {
        let mut st = self.state.lock();
        let State { files, dirty_bytes, resident_bytes, .. } = &mut *st;
        if let Some(f) = files.remove(&ino) {
            for (&idx, c) in &f.chunks {
                if c.dirty {
                    *dirty_bytes -= c.dirty_len;
                    batch.delete_unsealed(ino, idx);
                }
                if !c.evicted() {
                    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
                }
                // One point delete per chunk (the map holds every record of the file): a
                // range delete per unlinked file piles up range tombstones that every later
                // RocksDB read must sort through (unlinks went from 15 000/s to 700/s).
                batch.delete_chunk(ino, idx);
            }
        }
        batch.delete_dirty(ino);
        drop(st);
        self.changed.notify_all();
    }

    /// Reads of `ino` are cached from now on, whatever its size (`tierfs warmup`).
    pub fn keep_cached(&self, ino: Ino) {
        let mut st = self.state.lock();
        let f = st.files.entry(ino).or_default();
        f.keep_cached = true;
        f.streaming = false;
    }

    /// Whether `ino` has open handles (a closed file is sealed at once).
    pub fn set_open(&self, ino: Ino, open: bool) {
        let mut st = self.state.lock();
        if let Some(f) = st.files.get_mut(&ino) {
            f.open = open;
            // A closed file with no chunk state (empty, or all hole) keeps nothing in memory:
            // the engine's memory follows the files that hold data, not every file opened.
            if !open && f.chunks.is_empty() && !f.marked_dirty && !f.keep_cached {
                st.files.remove(&ino);
            }
        } else if open {
            st.files.entry(ino).or_default().open = true;
        }
        drop(st);
        if !open {
            self.work.notify_one(); // a closed file is sealed at once
        }
    }

    /// Whether every chunk of the first `size` bytes of `ino` is sealed (in the store, not
    /// written since): then its data file holds nothing the store does not have.
    pub fn all_sealed(&self, ino: Ino, size: u64) -> bool {
        let st = self.state.lock();
        let Some(f) = st.files.get(&ino) else { return false };
        let n = size.div_ceil(CHUNK_SIZE);
        let mut known = 0;
        for c in f.chunks.range(..n).map(|(_, c)| c) {
            if c.rec.is_none() || c.dirty {
                return false;
            }
            known += 1;
        }
        known == n
    }

    /// Bytes of `ino` that live only in the store (counted in `st_blocks`).
    pub fn evicted_bytes(&self, ino: Ino) -> u64 {
        let st = self.state.lock();
        st.files.get(&ino).map_or(0, |f| f.chunks.values().map(Chunk::evicted_len).sum())
    }

    /// Seals and uploads everything dirty now; returns once nothing is dirty or `timeout`
    /// passed (then `Err` with the bytes still dirty).
    pub fn flush(&self, timeout: Duration) -> Result<(), u64> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        st.flush = true;
        self.work.notify_all();
        let result = loop {
            let busy = st.files.values().any(|f| f.dirty_chunks > 0);
            if !busy {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(st.dirty_bytes.max(1));
            }
            self.changed.wait_for(&mut st, Duration::from_millis(50));
        };
        st.flush = false;
        result
    }

    /// Seals and uploads the dirty chunks of `ino` now (fsync); `Err` with the bytes of it
    /// still dirty when `timeout` passed first.
    pub fn flush_inode(&self, ino: Ino, timeout: Duration) -> Result<(), u64> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        *st.urgent.entry(ino).or_default() += 1;
        self.work.notify_all();
        let result = loop {
            let dirty = st
                .files
                .get(&ino)
                .map_or(0, |f| f.chunks.values().filter(|c| c.dirty).map(|c| c.dirty_len.max(1)).sum());
            if dirty == 0 {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(dirty);
            }
            self.changed.wait_for(&mut st, Duration::from_millis(50));
        };
        if let Some(n) = st.urgent.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                st.urgent.remove(&ino);
            }
        }
        result
    }

    /// A number that changes whenever an upload or an eviction completes (cheap: two
    /// counters), for a writer waiting for the disk to make room.
    pub fn progress(&self) -> u64 {
        self.counters
            .uploaded_bytes
            .load(Ordering::Relaxed)
            .wrapping_add(self.counters.evictions.load(Ordering::Relaxed))
    }

    pub fn stats(&self) -> ColdStats {
        let st = self.state.lock();
        let oldest = st.files.values().filter(|f| f.dirty_chunks > 0).filter_map(|f| f.dirty_since).min();
        let evicted = st.files.values().flat_map(|f| f.chunks.values()).map(Chunk::evicted_len).sum();
        ColdStats {
            dirty_bytes: st.dirty_bytes,
            dirty_files: st.files.values().filter(|f| f.dirty_chunks > 0).count() as u64,
            oldest_dirty_ms: oldest.map_or(0, |t| t.elapsed().as_millis() as u64),
            resident_bytes: st.resident_bytes,
            evicted_bytes: evicted,
            uploaded_bytes: self.counters.uploaded_bytes.load(Ordering::Relaxed),
            uploaded_packs: self.counters.uploaded_packs.load(Ordering::Relaxed),
            fetched_bytes: self.counters.fetched_bytes.load(Ordering::Relaxed),
            evictions: self.counters.evictions.load(Ordering::Relaxed),
            upload_errors: self.counters.upload_errors.load(Ordering::Relaxed),
            verify_failures: self.counters.verify_failures.load(Ordering::Relaxed),
            streamed_bytes: self.counters.streamed_bytes.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }

    // ---- fetching ------------------------------------------------------------------------

    /// The block id of a chunk's bytes; all zeros get [`ZERO_BLOCK`] (never uploaded).
    fn content_id(&self, data: &[u8]) -> BlockId {
        if data.iter().all(|&b| b == 0) { ZERO_BLOCK } else { self.store.block_id(data) }
    }

    /// Checks a cached chunk from an earlier run against its block id. A chunk that does not
    /// match (the local disk corrupted it) is dropped from the cache, so it is fetched again.
    fn verify(&self, ino: Ino, file: &File, idx: u64) -> Result<(), ColdError> {
        let (epoch, rec) = {
            let st = self.state.lock();
            match st.files.get(&ino).and_then(|f| f.chunks.get(&idx)) {
                Some(c) if c.unverified() => match c.rec {
                    Some(r) => (c.epoch, r),
                    None => return Ok(()),
                },
                _ => return Ok(()),
            }
        };
        let mut data = vec![0u8; rec.len as usize];
        read_full(file, ino, idx * CHUNK_SIZE, &mut data)?;
        let id = self.content_id(&data);
        let mut st = self.state.lock();
        let State { files, resident_bytes, .. } = &mut *st;
        let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { return Ok(()) };
        if c.epoch != epoch || !c.unverified() {
            return Ok(()); // changed meanwhile: the caller looks again
        }
        if id == rec.block {
            c.verified = true;
            return Ok(());
        }
        tracing::warn!(
            "cached chunk {idx} of inode {ino} does not match its stored block (local disk corruption?); \
             fetching it again from the store"
        );
        self.counters.verify_failures.fetch_add(1, Ordering::Relaxed);
        let mut b = MetaBatch::new();
        punch_out(ino, idx, c, Some(file), resident_bytes, &mut b)?;
        self.meta.commit(b)?;
        Ok(())
    }

    /// Checks every cached chunk left by an earlier run, in the background, so that reads
    /// rarely have to wait for the check.
    fn verify_loop(self: Arc<Self>) {
        let todo: Vec<(Ino, u64)> = {
            let st = self.state.lock();
            st.files
                .iter()
                .flat_map(|(&ino, f)| f.chunks.iter().filter(|(_, c)| c.unverified()).map(move |(&i, _)| (ino, i)))
                .collect()
        };
        let mut files = OpenFiles::default();
        for (ino, idx) in todo {
            if self.state.lock().stopping {
                return;
            }
            let file = match files.get(&self.hot, ino) {
                Ok(f) => f,
                Err(err) => {
                    tracing::warn!("verifying the cache: {err}");
                    continue;
                }
            };
            if let Some(file) = file {
                if let Err(err) = self.verify(ino, file, idx) {
                    tracing::warn!("verifying chunk {idx} of inode {ino}: {err}");
                }
            }
        }
    }

    /// Makes chunk `idx` of `ino` resident, fetching its block if it was evicted. Concurrent
    /// callers for one chunk share one fetch.
    fn hydrate(&self, ino: Ino, file: &File, idx: u64) -> Result<(), ColdError> {
        let Some(rec) = self.claim_fetch(ino, idx) else { return Ok(()) };
        let result = self.fetch_into(ino, file, idx, &rec);
        self.finish_fetch(ino, idx, rec, result)
    }

    /// Claims the fetch of chunk `idx` of `ino`, waiting while someone else fetches it;
    /// `None`: nothing to fetch (any more).
    fn claim_fetch(&self, ino: Ino, idx: u64) -> Option<ChunkRecord> {
        let mut st = self.state.lock();
        loop {
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Done => return None,
                Fetch::Mine(rec) => return Some(rec),
                Fetch::Busy => {
                    self.changed.wait_for(&mut st, Duration::from_millis(100));
                }
            }
        }
    }

    /// Claims the fetch of chunk `idx` of `ino` if it is evicted and nobody fetches it yet.
    fn start_fetch(&self, st: &mut MutexGuard<'_, State>, ino: Ino, idx: u64) -> Fetch {
        let Some(c) = st.files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { return Fetch::Done };
        match c.rec {
            Some(rec) if c.evicted() && !c.fetching => {
                c.fetching = true;
                Fetch::Mine(rec)
            }
            _ if c.evicted() => Fetch::Busy,
            _ => Fetch::Done,
        }
    }

    /// Ends a fetch started by [`ColdTier::start_fetch`]: on success the chunk is resident,
    /// verified and the most recently used (it is often fetched ahead of its reader).
    fn finish_fetch(
        &self,
        ino: Ino,
        idx: u64,
        rec: ChunkRecord,
        result: Result<(), ColdError>,
    ) -> Result<(), ColdError> {
        let mut st = self.state.lock();
        st.tick += 1;
        let State { files, resident_bytes, tick, .. } = &mut *st;
        if let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) {
            c.fetching = false;
            c.last_access = *tick;
            if result.is_ok() {
                let mut r = rec;
                r.resident = true;
                c.rec = Some(r);
                c.verified = true;
                c.local_len = u64::from(r.len);
                *resident_bytes += c.local_len;
                let mut b = MetaBatch::new();
                b.set_chunk_residency(ino, idx, &r);
                // Committed under the state lock so it cannot overtake a later eviction's record.
                let committed = self.meta.commit(b);
                drop(st);
                self.changed.notify_all();
                return committed.map_err(ColdError::from);
            }
        }
        drop(st);
        self.changed.notify_all();
        result
    }

    /// The location of a chunk's block (`None` for the zero block, which is never stored).
    fn locate(&self, ino: Ino, idx: u64, rec: &ChunkRecord) -> Result<Option<BlockLoc>, ColdError> {
        if rec.block == ZERO_BLOCK {
            return Ok(None);
        }
        let loc = self.meta.block(&rec.block)?.ok_or_else(|| ColdError::MissingLocation {
            ino,
            index: idx,
            block: hex::encode(rec.block),
        })?;
        Ok(Some(loc))
    }

    /// Writes a fetched block into the chunk's hole.
    /// `fetched`: the bytes came from the store (not from the stream buffer).
    fn store_fetched(
        &self,
        ino: Ino,
        file: &File,
        idx: u64,
        rec: &ChunkRecord,
        data: &[u8],
        fetched: bool,
    ) -> Result<(), ColdError> {
        check_len(ino, idx, rec, data)?;
        DataFile { file, ino }.write_at(idx * CHUNK_SIZE, data)?;
        if fetched {
            self.counters.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fetch_into(&self, ino: Ino, file: &File, idx: u64, rec: &ChunkRecord) -> Result<(), ColdError> {
        // A zero block: the punched hole already reads as zeros.
        let Some(loc) = self.locate(ino, idx, rec)? else { return Ok(()) };
        // A streamed file's block may be in memory already (a write into a streamed chunk).
        let buffered = {
            let mut st = self.state.lock();
            let tick = st.tick;
            st.streamed.get(&rec.block, tick)
        };
        if let Some(data) = buffered {
            return self.store_fetched(ino, file, idx, rec, &data, false);
        }
        let data = self.store.get_block(&rec.block, &loc)?;
        self.store_fetched(ino, file, idx, rec, &data, true)
    }

    /// Fetches several chunks of one file at once (read-ahead): blocks that lie next to each
    /// other in one pack come in one ranged GET.
    /// `file`: the data file, if there is one (a streamed file needs none: a node that has
    /// never cached a byte of it has none).
    fn hydrate_group(&self, ino: Ino, file: Option<&File>, idxs: &[u64]) {
        // Where the blocks go: the data file, or (`None`) the stream buffer.
        let (mut mine, into): (Vec<(u64, ChunkRecord)>, Option<&File>) = {
            let mut st = self.state.lock();
            let streaming = st.files.get(&ino).is_some_and(|f| f.streaming);
            let into = match file {
                _ if streaming => None,
                Some(file) => Some(file),
                // Neither streamed nor cached here: nothing to fetch into.
                None => return,
            };
            let State { files, streamed, .. } = &*st;
            // A streamed chunk whose block is in the buffer already needs nothing.
            let buffered = |idx: &u64| {
                streaming
                    && files
                        .get(&ino)
                        .and_then(|f| f.chunks.get(idx))
                        .and_then(|c| c.rec)
                        .is_some_and(|r| streamed.blocks.contains_key(&r.block))
            };
            let wanted: Vec<u64> = idxs.iter().copied().filter(|idx| !buffered(idx)).collect();
            let mine = wanted
                .iter()
                .filter_map(|&idx| match self.start_fetch(&mut st, ino, idx) {
                    Fetch::Mine(rec) => Some((idx, rec)),
                    _ => None,
                })
                .collect();
            (mine, into)
        };
        self.extend_to_pack_end(ino, &mut mine, into.is_none());
        let results = self.fetch_group(ino, &mine);
        let group = self.state.lock().streamed.new_group(mine.len());
        for ((idx, rec), result) in mine.into_iter().zip(results) {
            let done = match into {
                Some(file) => {
                    let stored = result.and_then(|data| match data {
                        Some(data) => self.store_fetched(ino, file, idx, &rec, &data, true),
                        None => Ok(()),
                    });
                    self.finish_fetch(ino, idx, rec, stored)
                }
                // A streamed file: the blocks go to the stream buffer, the chunks stay evicted.
                None => self.finish_streamed(ino, idx, &rec, result, group),
            };
            if let Err(e) = done {
                tracing::debug!("read-ahead of inode {ino} chunk {idx}: {e}");
            }
        }
    }

    /// Claims the chunks right after `mine` whose blocks lie in the same pack as its last one,
    /// so that read-ahead reads each pack in one request. A server may read a whole pack for
    /// any range of it (moto does): two groups that share a pack cost it the pack twice, and
    /// with 4 MiB blocks in 16 MiB packs most groups of four did.
    fn extend_to_pack_end(&self, ino: Ino, mine: &mut Vec<(u64, ChunkRecord)>, streaming: bool) {
        let Some(&(last_idx, last_rec)) = mine.last() else { return };
        let Ok(Some(last_loc)) = self.locate(ino, last_idx, &last_rec) else { return };
        for idx in last_idx + 1..=last_idx + FETCH_GROUP as u64 {
            let rec = {
                let st = self.state.lock();
                let chunk = st.files.get(&ino).and_then(|f| f.chunks.get(&idx));
                chunk.filter(|c| c.evicted() && !c.dirty && !c.fetching).and_then(|c| c.rec)
            };
            let Some(rec) = rec else { break };
            match self.locate(ino, idx, &rec) {
                Ok(Some(loc)) if loc.pack == last_loc.pack => {}
                _ => break,
            }
            let mut st = self.state.lock();
            if streaming && st.streamed.blocks.contains_key(&rec.block) {
                break;
            }
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Mine(rec) => mine.push((idx, rec)),
                _ => break,
            }
        }
    }

    /// The blocks of the claimed chunks `mine` of `ino`, in order (`None`: the zero block).
    fn fetch_group(&self, ino: Ino, mine: &[(u64, ChunkRecord)]) -> Vec<Result<Option<Bytes>, ColdError>> {
        let mut wanted = Vec::new();
        let mut results: Vec<Option<Result<Option<Bytes>, ColdError>>> = Vec::with_capacity(mine.len());
        for (idx, rec) in mine {
            match self.locate(ino, *idx, rec) {
                Ok(Some(loc)) => {
                    wanted.push((results.len(), (rec.block, loc)));
                    results.push(None);
                }
                Ok(None) => results.push(Some(Ok(None))),
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if !wanted.is_empty() {
            let blocks: Vec<(BlockId, BlockLoc)> = wanted.iter().map(|(_, b)| *b).collect();
            match self.store.get_blocks(&blocks) {
                Ok(datas) => {
                    for ((slot, _), data) in wanted.iter().zip(datas) {
                        results[*slot] = Some(Ok(Some(data)));
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    for (slot, _) in &wanted {
                        results[*slot] = Some(Err(ColdError::Store(e.clone())));
                    }
                }
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(ColdError::NotFetched))).collect()
    }

    fn prefetch_loop(self: Arc<Self>) {
        loop {
            let (ino, idxs) = {
                let mut st = self.state.lock();
                loop {
                    if st.stopping {
                        return;
                    }
                    if let Some((ino, first)) = st.prefetch.pop_front() {
                        // The chunks queued right after it, of the same file, go with it.
                        let mut idxs = vec![first];
                        while idxs.len() < FETCH_GROUP {
                            let next = first + idxs.len() as u64;
                            match st.prefetch.iter().position(|&j| j == (ino, next)) {
                                Some(pos) => {
                                    st.prefetch.remove(pos);
                                    idxs.push(next);
                                }
                                None => break,
                            }
                        }
                        break (ino, idxs);
                    }
                    self.ahead.wait_for(&mut st, Duration::from_millis(500));
                }
            };
            // A streamed file may have no data file (nothing of it was ever cached here).
            match self.hot.open_existing(ino) {
                Ok(file) => self.hydrate_group(ino, file.as_ref(), &idxs),
                Err(e) => tracing::debug!("read-ahead of inode {ino}: {e}"),
            }
        }
    }

    // ---- sealing and uploading -----------------------------------------------------------

    fn upload_loop(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let claims = {
                let mut st = self.state.lock();
                loop {
                    let claims = self.claim(&mut st);
                    if !claims.is_empty() {
                        break claims;
                    }
                    if st.stopping {
                        return;
                    }
                    self.work.wait_for(&mut st, Duration::from_millis(100));
                }
            };
            match self.seal(&claims) {
                Ok(()) => backoff = Duration::from_millis(200),
                Err(e) => {
                    self.counters.upload_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("upload failed, will retry in {backoff:?}: {e}");
                    *self.last_error.lock() = Some(e.to_string());
                    self.unclaim(&claims);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Picks dirty chunks that are ready to seal, up to about one pack.
    fn claim(&self, st: &mut MutexGuard<'_, State>) -> Vec<Claim> {
        let flushing = st.flush || st.stopping;
        let pressure = flushing || st.dirty_bytes >= self.config.max_dirty / 2;
        // First what is settled: chunks of closed files, full chunks (a sequential writer has
        // moved past them) and chunks quiet for `seal_after`. Only under pressure also the
        // partial chunks of files still being written, which would otherwise be uploaded
        // again after their next write.
        let mut out = self.claim_pass(st, flushing);
        if out.is_empty() && pressure && !flushing {
            out = self.claim_pass(st, true);
        }
        // Small files closed one after another: wait a moment for more, so they share a pack
        // (one PUT for many files) — unless someone waits for them or memory is short.
        if !out.is_empty() && !pressure && st.urgent.is_empty() {
            let mut bytes = 0;
            let mut oldest: Option<Instant> = None;
            for cl in &out {
                if let Some(f) = st.files.get(&cl.ino) {
                    bytes += f.chunks.get(&cl.index).map_or(0, |c| c.dirty_len);
                    oldest = match (oldest, f.dirty_since) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
            let young = oldest.is_none_or(|t| t.elapsed() < GATHER);
            if young && bytes < self.store.pack_size() as u64 / 2 {
                for cl in &out {
                    if let Some(c) = st.files.get_mut(&cl.ino).and_then(|f| f.chunks.get_mut(&cl.index)) {
                        c.claimed = false;
                    }
                }
                return Vec::new();
            }
        }
        out
    }

    fn claim_pass(&self, st: &mut MutexGuard<'_, State>, everything: bool) -> Vec<Claim> {
        let budget = self.store.pack_size() as u64;
        let mut bytes = 0u64;
        let mut out = Vec::new();
        let State { files, urgent, dirty_inos, .. } = &mut **st;
        dirty_inos.retain(|ino| files.get(ino).is_some_and(|f| f.dirty_chunks > 0));
        for &ino in dirty_inos.iter() {
            let Some(f) = files.get_mut(&ino) else { continue };
            let settled = everything
                || !f.open
                || urgent.contains_key(&ino)
                || f.dirty_since.is_some_and(|t| t.elapsed() >= self.config.seal_after);
            for (&index, c) in f.chunks.iter_mut() {
                let ready = settled || c.dirty_len >= CHUNK_SIZE;
                if ready && c.dirty && !c.claimed && c.inflight == 0 {
                    c.claimed = true;
                    out.push(Claim { ino, index, epoch: c.epoch });
                    bytes += c.dirty_len.max(1);
                    if bytes >= budget {
                        return out;
                    }
                }
            }
        }
        out
    }

    fn unclaim(&self, claims: &[Claim]) {
        let mut st = self.state.lock();
        for cl in claims {
            if let Some(c) = st.files.get_mut(&cl.ino).and_then(|f| f.chunks.get_mut(&cl.index)) {
                c.claimed = false;
            }
        }
    }

    /// Reads the claimed chunks, uploads the blocks the store does not have, and records the
    /// chunks that did not change meanwhile as sealed. Each chunk is read straight into the
    /// pack, hashed there and encrypted in place (no copy of its plaintext).
    fn seal(&self, claims: &[Claim]) -> Result<(), ColdError> {
        let mut files = OpenFiles::default();
        let mut sealed: Vec<(usize, BlockId, u32)> = Vec::new();
        let mut gone = Vec::new();
        // A claim stops at the first chunk that reaches the pack size: room for one chunk more.
        let mut pack = PackBuilder::new(self.store.pack_size() + CHUNK_SIZE as usize);
        let mut seen = HashSet::new();
        for (i, cl) in claims.iter().enumerate() {
            let Some(rec) = self.meta.inode(cl.ino)? else {
                gone.push(i);
                continue;
            };
            let len = chunk_len(rec.attr.size, cl.index);
            if len == 0 {
                gone.push(i);
                continue;
            }
            let start = cl.index * CHUNK_SIZE;
            let file = files.get(&self.hot, cl.ino)?;
            // Only the chunk's data is read (the staged buffer starts as zeros); a chunk that
            // is all hole (punched, zeroed) is the zero block: not read, not hashed.
            let runs = match file {
                Some(file) => DataFile { file, ino: cl.ino }.data_extents(start..start + len)?,
                None => Vec::new(),
            };
            if runs.is_empty() {
                sealed.push((i, ZERO_BLOCK, len as u32));
                continue;
            }
            let data = pack.stage(len as usize);
            if let Some(file) = file {
                for run in runs {
                    let (from, to) = ((run.start - start) as usize, (run.end - start) as usize);
                    read_full(file, cl.ino, run.start, &mut data[from..to])?;
                }
            }
            let id = self.content_id(pack.staged());
            sealed.push((i, id, len as u32));
            // Blocks the store already has (dedup) and zero blocks are not uploaded again.
            if id == ZERO_BLOCK || !seen.insert(id) || self.meta.block(&id)?.is_some() {
                pack.drop_staged();
            } else {
                pack.seal_staged(self.store.keys(), &id);
            }
        }
        let mut batch = MetaBatch::new();
        if !pack.is_empty() {
            let locs = self.store.put_pack(pack)?;
            let bytes: u64 = locs.iter().map(|(_, loc)| u64::from(loc.plain_len)).sum();
            self.counters.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.counters.uploaded_packs.fetch_add(1, Ordering::Relaxed);
            for (id, loc) in &locs {
                batch.put_block(id, loc);
            }
        }
        let mut st = self.state.lock();
        let State { files: fstate, dirty_bytes, resident_bytes, .. } = &mut *st;
        let mut touched = HashSet::new();
        for (i, id, len) in &sealed {
            let cl = &claims[*i];
            touched.insert(cl.ino);
            let Some(f) = fstate.get_mut(&cl.ino) else { continue };
            let Some(c) = f.chunks.get_mut(&cl.index) else { continue };
            c.claimed = false;
            if c.epoch != cl.epoch || c.inflight > 0 || !c.dirty {
                continue; // written meanwhile: stays dirty
            }
            c.dirty = false;
            f.dirty_chunks -= 1;
            *dirty_bytes -= c.dirty_len;
            c.dirty_len = 0;
            let r = ChunkRecord { block: *id, len: *len, resident: true };
            c.rec = Some(r);
            c.verified = true;
            *resident_bytes = *resident_bytes - c.local_len.min(*resident_bytes) + u64::from(*len);
            c.local_len = u64::from(*len);
            batch.put_chunk(cl.ino, cl.index, &r);
            batch.delete_unsealed(cl.ino, cl.index);
        }
        for i in gone {
            // Past the end of the file (or the file is gone): nothing to seal. Dropped here
            // unless written meanwhile, so the uploader does not claim it forever.
            let cl = &claims[i];
            touched.insert(cl.ino);
            let Some(f) = fstate.get_mut(&cl.ino) else { continue };
            let Some(c) = f.chunks.get_mut(&cl.index) else { continue };
            c.claimed = false;
            if c.epoch == cl.epoch && c.inflight == 0 {
                if let Some(c) = f.chunks.remove(&cl.index) {
                    if c.dirty {
                        f.dirty_chunks -= 1;
                        *dirty_bytes -= c.dirty_len;
                        batch.delete_unsealed(cl.ino, cl.index);
                    }
                    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
                    if c.rec.is_some() {
                        batch.delete_chunk(cl.ino, cl.index);
                    }
                }
            }
        }
        for ino in touched {
            if let Some(f) = fstate.get_mut(&ino) {
                if f.dirty_chunks == 0 {
                    f.dirty_since = None;
                    if f.marked_dirty {
                        f.marked_dirty = false;
                        batch.delete_dirty(ino);
                    }
                }
            }
        }
        // Under the state lock, so a writer that dirties a chunk next cannot be overtaken.
        let committed = self.meta.commit(batch);
        drop(st);
        self.changed.notify_all();
        committed?;
        Ok(())
    }

    // ---- eviction ------------------------------------------------------------------------

    fn evict_loop(self: Arc<Self>) {
        loop {
            {
                let mut st = self.state.lock();
                if st.stopping {
                    return;
                }
                self.tick.wait_for(&mut st, Duration::from_millis(200));
                if st.stopping {
                    return;
                }
            }
            if let Err(e) = self.evict_some() {
                tracing::warn!("eviction: {e}");
            }
        }
    }

    /// Bytes to free now: `(above the cache size, below the free-space floor of the disk,
    /// below twice the write reserve)`. The last is critical: writes are about to fail with
    /// ENOSPC, so even recently used chunks go.
    fn excess(&self, resident: u64) -> (u64, u64, u64) {
        let mut cache = 0;
        if let Some(limit) = self.config.cache_size {
            if resident > limit {
                // Evict down to 90% so eviction runs in batches, not per write.
                cache = resident - limit / 10 * 9;
            }
        }
        let (mut disk, mut critical) = (0, 0);
        if let Ok(s) = self.hot.disk_stats() {
            let total = s.f_blocks as f64 * s.f_frsize as f64;
            let free = s.f_bavail as f64 * s.f_frsize as f64;
            // Never less than twice the reserve writes leave alone, or a small disk would
            // refuse writes (ENOSPC at the reserve) while evictable chunks fill it.
            let low = 2.0 * self.hot.reserve() as f64;
            let want = (total * self.config.min_free_ratio).max(low);
            if free < want {
                disk = (want - free) as u64 + CHUNK_SIZE;
            }
            if free < low {
                critical = (low - free) as u64 + CHUNK_SIZE;
            }
        }
        (cache, disk, critical)
    }

    fn evict_some(&self) -> Result<(), ColdError> {
        let resident = self.state.lock().resident_bytes;
        let (cache_need, disk_need, critical_need) = self.excess(resident);
        if cache_need == 0 && disk_need == 0 {
            return Ok(());
        }
        let mut st = self.state.lock();
        let mut candidates: Vec<(u64, Ino, u64)> = st
            .files
            .iter()
            .flat_map(|(&ino, f)| {
                f.chunks.iter().filter_map(move |(&idx, c)| {
                    let clean = c.rec.is_some_and(|r| r.resident) && !c.dirty && c.inflight == 0 && c.readers == 0;
                    (clean && !c.claimed && !c.fetching && c.local_len > 0).then_some((c.last_access, ino, idx))
                })
            })
            .collect();
        candidates.sort_unstable();
        // A disk filled by something else cannot be freed by evicting what is being read: the
        // free-space floor spares the most recently used chunks (read-ahead included), or a
        // sequential reader would fetch every chunk again and again. The cache size is a hard
        // limit and spares nothing, and neither does a disk about to refuse writes (a file
        // written bigger than the disk has only recently used chunks to give).
        let recent = st.tick.saturating_sub(RECENT_TICKS);
        let mut batch = MetaBatch::new();
        let mut files = OpenFiles::default();
        let State { files: fstate, resident_bytes, .. } = &mut *st;
        let mut freed = 0u64;
        for (last_access, ino, idx) in candidates {
            let wanted = freed < cache_need || freed < critical_need || (freed < disk_need && last_access < recent);
            if !wanted {
                if freed >= cache_need.max(disk_need) {
                    break;
                }
                continue;
            }
            let Some(c) = fstate.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { continue };
            freed += c.local_len;
            // Punched under the state lock: no writer can be mid-write in this chunk.
            punch_out(ino, idx, c, files.get(&self.hot, ino)?, resident_bytes, &mut batch)?;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.meta.commit(batch)?;
        Ok(())
    }
}

/// Data files opened by one pass of a worker, each opened once (`None`: no data file).
#[derive(Default)]
struct OpenFiles(HashMap<Ino, Option<File>>);

impl OpenFiles {
    fn get(&mut self, hot: &HotTier, ino: Ino) -> Result<Option<&File>, HotTierError> {
        let file = match self.0.entry(ino) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(hot.open_existing(ino)?),
        };
        Ok(file.as_ref())
    }
}

/// Drops a sealed chunk's local bytes: punches them out of the data file and records the
/// chunk as evicted in `batch`. The caller holds the state lock and commits `batch`.
fn punch_out(
    ino: Ino,
    idx: u64,
    c: &mut Chunk,
    file: Option<&File>,
    resident_bytes: &mut u64,
    batch: &mut MetaBatch,
) -> Result<(), ColdError> {
    let Some(mut r) = c.rec else { return Ok(()) };
    if let Some(file) = file {
        DataFile { file, ino }.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            idx * CHUNK_SIZE,
            u64::from(r.len),
        )?;
    }
    r.resident = false;
    c.rec = Some(r);
    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
    c.local_len = 0;
    batch.set_chunk_residency(ino, idx, &r);
    Ok(())
}

/// A fetched block must have the length its chunk record names.
fn check_len(ino: Ino, idx: u64, rec: &ChunkRecord, data: &[u8]) -> Result<(), ColdError> {
    if data.len() == rec.len as usize {
        Ok(())
    } else {
        Err(ColdError::WrongLength { ino, index: idx, got: data.len(), want: rec.len as usize })
    }
}

/// A chunk of a streamed read: its index, record and block (`None`: the zero block).
type StreamPart = (u64, ChunkRecord, Option<Bytes>);

/// The bytes of `range` (inside the file) from the blocks of its chunks; bytes past a block's
/// end are zeros. A range inside one block's bytes is a view of the block, not a copy.
fn assemble(range: &Range<u64>, parts: &[StreamPart]) -> Bytes {
    if let [(idx, rec, Some(d))] = parts {
        let chunk_start = idx * CHUNK_SIZE;
        let (from, to) = (range.start - chunk_start, range.end - chunk_start);
        if to <= u64::from(rec.len).min(d.len() as u64) {
            return d.slice(from as usize..to as usize);
        }
    }
    let mut out = Vec::with_capacity((range.end - range.start) as usize);
    for (idx, rec, data) in parts {
        let chunk_start = idx * CHUNK_SIZE;
        let from = range.start.max(chunk_start) - chunk_start;
        let to = range.end.min(chunk_start + CHUNK_SIZE) - chunk_start;
        let have = data.as_ref().map_or(0, |d| (u64::from(rec.len)).min(d.len() as u64));
        if let Some(d) = data {
            let copy_to = to.min(have);
            if from < copy_to {
                out.extend_from_slice(&d[from as usize..copy_to as usize]);
            }
        }
        let zeros_from = from.max(have);
        if zeros_from < to {
            out.resize(out.len() + (to - zeros_from) as usize, 0);
        }
    }
    Bytes::from(out)
}

fn read_full(file: &File, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<(), ColdError> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break, // past the data file's end: zeros (already in buf)
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(ColdError::HotTier(HotTierError::Io {
                    op: "read",
                    path: format!("data file of inode {ino}").into(),
                    source: e,
                }));
            }
        }
    }
    Ok(())
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    match std::thread::Builder::new().name(name).spawn(f) {
        Ok(h) => h,
        // Thread creation fails only when the process is out of resources; nothing to salvage.
        Err(e) => panic!("cannot start a tierfs worker thread: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(len: u32) -> ChunkRecord {
        ChunkRecord { block: [7; 32], len, resident: false }
    }

    #[test]
    fn the_stream_buffer_counts_a_fetch_group_whole_until_its_last_block_goes() {
        let id = |n: u8| [n; 32];
        let block = |n: u8| Bytes::from(vec![n; 16]);
        let mut buf = StreamBuffer::default();
        // Group a: four blocks (one buffer, say), three of them read.
        let a = buf.new_group(4);
        for n in 1..=4 {
            buf.insert(id(n), block(n), u64::from(n), 8, a);
        }
        for n in 1..=3 {
            assert_eq!(buf.get(&id(n), 10 + u64::from(n)), Some(block(n)));
        }
        let b = buf.new_group(4);
        for n in 11..=14 {
            buf.insert(id(n), block(n), 20 + u64::from(n), 8, b);
        }
        assert_eq!((buf.blocks.len(), buf.retained()), (8, 8));
        // A block of group c: five blocks would fit a count of blocks, but group a holds its
        // whole buffer while any of its blocks is here, so all of a goes (the read blocks
        // first, then the unread one), and b stays.
        let c = buf.new_group(4);
        buf.insert(id(21), block(21), 40, 8, c);
        assert!((1..=4).all(|n| !buf.blocks.contains_key(&id(n))), "group a dropped whole");
        assert!((11..=14).all(|n| buf.blocks.contains_key(&id(n))), "group b kept");
        assert_eq!((buf.blocks.len(), buf.retained()), (5, 8));
        // The rest of c needs no more room; a group larger than the cap still gets in.
        for n in 22..=24 {
            buf.insert(id(n), block(n), 40 + u64::from(n), 8, c);
        }
        assert_eq!((buf.blocks.len(), buf.retained()), (8, 8));
        let big = buf.new_group(9);
        buf.insert(id(31), block(31), 60, 8, big);
        assert_eq!((buf.blocks.len(), buf.retained()), (1, 9));
        assert_eq!(buf.get(&id(31), 61), Some(block(31)));
    }

    #[test]
    fn a_read_inside_one_block_is_a_view_of_it_and_anything_else_is_assembled() {
        let block = Bytes::from((0..=255u8).cycle().take(1000).collect::<Vec<u8>>());
        let base = CHUNK_SIZE; // chunk 1
        let one = [(1, rec(1000), Some(block.clone()))];

        let view = assemble(&(base + 10..base + 500), &one);
        assert_eq!(&view[..], &block[10..500]);
        assert_eq!(view.as_ptr(), block[10..].as_ptr(), "a copy where a view would do");

        // Past the block's bytes: zeros, in a buffer of its own.
        let past = assemble(&(base + 900..base + 1100), &one);
        assert_eq!(&past[..100], &block[900..]);
        assert!(past[100..].iter().all(|&b| b == 0) && past.len() == 200);

        // Two chunks: the end of one block, then the start of the next.
        let other = Bytes::from(vec![9u8; 64]);
        let two =
            [(0, rec(CHUNK_SIZE as u32), Some(Bytes::from(vec![1u8; CHUNK_SIZE as usize]))), (1, rec(64), Some(other))];
        let joined = assemble(&(CHUNK_SIZE - 4..CHUNK_SIZE + 4), &two);
        assert_eq!(&joined[..], &[1, 1, 1, 1, 9, 9, 9, 9]);

        // The zero block (no data) reads as zeros.
        let zero = assemble(&(base..base + 16), &[(1, rec(1000), None)]);
        assert_eq!(&zero[..], &[0u8; 16]);
    }
}
