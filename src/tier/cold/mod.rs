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
//!   in flight, so a write racing with sealing leaves the chunk dirty, never falsely clean.
//!   Epochs come from one counter of the engine, never from the chunk: a chunk dropped by a
//!   truncate and written again while an uploader holds a claim on its old bytes gets an
//!   epoch that claim never saw, so the old bytes are not recorded as the new chunk's;
//! - eviction punches under the mutex, and writers mark under the mutex before writing, so a
//!   write never lands in a chunk that is being punched; a write to an evicted chunk first
//!   fetches it (unless it overwrites the whole chunk);
//! - an inode with dirty chunks carries a persistent dirty marker, so after a crash its chunks
//!   are re-sealed (and a stale chunk record is never trusted over newer local bytes); the
//!   marks a write needs are committed in the caller's one batch before its bytes land
//!   ([`WriteGuard::commit`]), and a mark another write has not committed yet is carried by
//!   every write into that chunk until one does (`Chunk::mark_pending`);
//! - writers are throttled, never failed, while dirty bytes exceed the bound;
//! - a file larger than [`ColdConfig::stream_above`] is *streamed*: the blocks its reads fetch
//!   go to a small in-memory buffer keyed by block id, not into the data file, and its chunks
//!   stay evicted. A read is served from that buffer only while its chunk is evicted, clean
//!   and its record names that block, so the buffer can never show stale bytes (a write first
//!   fetches the chunk into the data file and marks it dirty).
//!
//! The store is reached through [`BlockStore`] (blocking calls from worker threads), so this
//! layer knows nothing of backends, encryption or async runtimes.
//!
//! The engine is one [`ColdTier`] whose methods are spread over files by what they do to a
//! chunk. This file holds the types, the shared state, start and shutdown, the calls that keep
//! a file's chunk state in step with the vfs (truncate, forget, open, close) and the stats;
//! - `write.rs`: marking chunks dirty before a change, and the dirty bound;
//! - `fetch.rs`: bringing evicted chunks back for a read or a write, and read-ahead;
//! - `verify.rs`: checking cached chunks left by an earlier run;
//! - `stream.rs`: reads of large files served from the stream buffer, past the cache;
//! - `upload.rs`: claiming, sealing and uploading dirty chunks, and flushes;
//! - `refill.rs`: the hot set, the refill after a reset, and fetches of many files' chunks at
//!   once;
//! - `evict.rs`: punching sealed chunks out to keep the cache size and the disk's free space;
//! - `adopt.rs`: a file's whole content handed in as records of blocks already stored (watch
//!   mode).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

pub use self::refill::{HotSet, HotSetError, MAX_HOT_CHUNKS, RefillState, RefillStats};
use self::stream::StreamBuffer;
use super::{HotTier, HotTierError};
use crate::block::{BlockId, BlockLoc, CHUNK_SIZE, PackBuilder, ZERO_BLOCK};
use crate::crypto::{Hash, Keys};
use crate::meta::{ChunkRecord, MetaBatch, MetaError, MetaStore};
use crate::store::{RunJoin, StoreError};
use crate::types::ErrorKind;
use crate::types::Ino;

mod adopt;
mod evict;
mod fetch;
mod follow;
mod near;
mod order;
mod refill;
mod stream;
mod upload;
mod verify;
mod walk;
mod write;

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
    /// Fetches and verifies several blocks (in order); blocks near each other in one pack may
    /// come in one request, with the gaps between them that `join` accepts.
    fn get_blocks(&self, blocks: &[(BlockId, BlockLoc)], join: RunJoin) -> Result<Vec<Bytes>, StoreError> {
        let _ = join;
        blocks.iter().map(|(id, loc)| self.get_block(id, loc)).collect()
    }
    /// Fetches and verifies block `id` and, in the same request where the store can, the
    /// blocks around it in its pack, within `window / 2` bytes on either side (each with its
    /// id). A store that cannot returns the block alone.
    fn get_block_near(&self, id: &BlockId, loc: &BlockLoc, window: u64) -> Result<Near, StoreError> {
        let _ = window;
        Ok((self.get_block(id, loc)?, Vec::new()))
    }
    /// Target bytes per pack.
    fn pack_size(&self) -> usize;
}

/// A block and its neighbours in its pack ([`BlockStore::get_block_near`]).
pub type Near = (Bytes, Vec<(BlockId, Bytes)>);

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
    /// Blocks the stream buffer keeps in memory (read-ahead included); `None`: twice what
    /// read-ahead fetches at once.
    pub stream_buffer_blocks: Option<usize>,
    /// A miss on a block of at most a quarter of this many bytes also fetches the blocks
    /// around it in its pack, half of this many bytes on either side, in the same request
    /// (pack neighbours, `near.rs`); 0: never.
    pub near_window: u64,
    /// Bytes of pack neighbours kept in memory until a read wants them.
    pub near_buffer: u64,
}

/// The default bound on memory for work in flight ([`ColdConfig::share_budget`]): enough that
/// the budget changes none of the defaults with 16 MiB packs.
pub const DEFAULT_INFLIGHT_BUDGET: u64 = 320 << 20;

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
            stream_buffer_blocks: None,
            near_window: 1 << 20,
            near_buffer: 16 << 20,
        }
    }

    /// Shares `budget` bytes of memory for work in flight out, so that the cold tier's buffers
    /// stay under one bound whatever the workload: a quarter for uploads (each uploader packs
    /// up to `pack_size` bytes plus one chunk), a quarter for read-ahead (each fetcher holds a
    /// group of four blocks), half for the stream buffer (and a sequential
    /// reader's read-ahead at most half of that), and the pack neighbours' buffer at most a
    /// thirty-second, out of what rounding leaves. Counts never go above the defaults of
    /// [`ColdConfig::new`] nor below one uploader, one fetcher and eight streamed blocks, so
    /// the floor with 16 MiB packs is 68 MiB. Foreground fetches by FUSE threads are not
    /// counted (each holds at most one group, 16 MiB).
    pub fn share_budget(&mut self, budget: u64, pack_size: u64) {
        let group = fetch::FETCH_GROUP as u64 * CHUNK_SIZE;
        let fits = |share: u64, each: u64| usize::try_from(share / each.max(1)).unwrap_or(usize::MAX);
        self.uploaders = fits(budget / 4, pack_size + CHUNK_SIZE).clamp(1, self.uploaders.max(1));
        self.prefetchers = fits(budget / 4, group).clamp(1, self.prefetchers.max(1));
        let min_stream = 2 * fetch::FETCH_GROUP;
        let stream = fits(budget / 2, CHUNK_SIZE).clamp(min_stream, self.stream_blocks().max(min_stream));
        self.stream_buffer_blocks = Some(stream);
        self.prefetch_chunks = self.prefetch_chunks.min(stream as u64 / 2).max(1);
        // Pack neighbours: a thirty-second (what the shares above leave over in rounding).
        self.near_buffer = self.near_buffer.min(budget / 32);
    }

    /// Whether reads of a file of `size` bytes stream past the cache (see `stream_above`).
    pub(super) fn streams_at(&self, size: u64) -> bool {
        self.stream_above.is_some_and(|limit| size > limit)
    }

    /// The most memory the buffers of work in flight take with this configuration.
    pub fn inflight_bound(&self, pack_size: u64) -> u64 {
        let group = fetch::FETCH_GROUP as u64 * CHUNK_SIZE;
        self.uploaders as u64 * (pack_size + CHUNK_SIZE)
            + self.prefetchers as u64 * group
            + self.stream_blocks() as u64 * CHUNK_SIZE
            + self.near_buffer
    }

    /// The stream buffer's size in blocks.
    pub(super) fn stream_blocks(&self) -> usize {
        self.stream_buffer_blocks
            .unwrap_or_else(|| 2 * (self.prefetch_chunks as usize).max(fetch::FETCH_GROUP * self.prefetchers.max(1)))
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
    /// Reads (of cached files; streamed ones aside) whose chunks were all local, and their bytes.
    #[serde(default)]
    pub read_hits: u64,
    #[serde(default)]
    pub read_hit_bytes: u64,
    /// Reads that waited for at least one chunk to be fetched (from the store, or from the
    /// pack neighbours an earlier miss brought).
    #[serde(default)]
    pub read_misses: u64,
    /// Blocks (and their bytes) fetched beside a miss from the same pack, and how many of them
    /// a later fetch found in memory instead of asking the store (pack neighbours).
    #[serde(default)]
    pub neighbour_blocks: u64,
    #[serde(default)]
    pub neighbour_bytes: u64,
    #[serde(default)]
    pub neighbour_hits: u64,
    /// The refill after a reset, if this session runs one.
    #[serde(default)]
    pub refill: Option<RefillStats>,
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
    /// Moved (from [`State::epochs`]) by every write, before and after it lands.
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
    /// Its unsealed mark (and, if it has one, its resident record) is in a batch that was not
    /// committed yet: every write into it puts them in its own batch too, until one commits
    /// (see [`WriteGuard::commit`]).
    mark_pending: bool,
}

impl Chunk {
    fn evicted(&self) -> bool {
        self.rec.is_some_and(|r| !r.resident)
    }

    /// Bytes of data that live only in the store. A zero block is stored nowhere, and the
    /// zero pages of a sparse one are holes: like a hole of the file, they take no space.
    fn evicted_len(&self) -> u64 {
        self.rec.filter(|r| !r.resident && r.block != ZERO_BLOCK).map_or(0, |r| u64::from(r.data))
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
    /// The dirty marker is in a batch that was not committed yet (as [`Chunk::mark_pending`]).
    dirty_mark_pending: bool,
    /// Larger than [`ColdConfig::stream_above`] when last read: read-ahead fetches into the
    /// stream buffer, not into the data file.
    streaming: bool,
    /// Never streamed, whatever its size ([`ColdTier::keep_cached`]).
    keep_cached: bool,
    /// The directory whose listing a walk opened it from: its misses' pack neighbours are
    /// judged with the walk's (`near.rs`).
    walk: Option<Ino>,
    /// The chunk after the last streamed read that queued read-ahead.
    stream_ahead_from: Option<u64>,
    /// Handles the kernel serves from the data file itself (FUSE passthrough): while any is
    /// open, nothing of the file is evicted.
    passthrough: u32,
    /// Of those, the handles that may write behind the engine's back: the dirty marker stays
    /// while any is open (see [`ColdTier::passthrough_open`]).
    passthrough_writers: u32,
}

impl FileState {
    /// A file none of whose chunks is dirty any more is clean: its dirty time is cleared, and
    /// its marker (from a version that marked inodes only) removed in `batch`.
    fn clean_if_sealed(&mut self, ino: Ino, batch: &mut MetaBatch) {
        if self.dirty_chunks == 0 {
            self.dirty_since = None;
            if self.marked_dirty && self.passthrough_writers == 0 {
                self.marked_dirty = false;
                batch.delete_dirty(ino);
            }
        }
    }
}

impl FileState {
    /// Whether chunk `idx` must be fetched or verified before its bytes are used.
    fn not_ready(&self, idx: u64) -> bool {
        self.chunks.get(&idx).is_some_and(Chunk::not_ready)
    }
}

/// Files a foreground read found not yet refilled, at most, waiting for the refill to fetch
/// their remaining chunks before its plan's next batch (a few: a read bumps one file).
const MAX_REFILL_BUMPS: usize = 64;

#[derive(Default)]
struct State {
    files: HashMap<Ino, FileState>,
    dirty_bytes: u64,
    resident_bytes: u64,
    tick: u64,
    /// The last epoch given to a chunk (see the module invariants): only grows.
    epochs: u64,
    flush: bool,
    /// Files an fsync waits for (with how many waiters): sealed at once, partial chunks too.
    urgent: HashMap<Ino, u32>,
    stopping: bool,
    prefetch: VecDeque<(Ino, u64)>,
    /// Files whose first chunk a walk will want soon (directory-order read-ahead).
    walk: VecDeque<Ino>,
    /// Files that may have dirty chunks (a superset: cleaned up as the uploaders look), so
    /// claiming work does not walk every file of a large workspace on every wake-up. In inode
    /// order, which is creation order: files made together are packed together, in that
    /// order, so a miss's pack neighbours are the files made with it (`near.rs`).
    dirty_inos: BTreeSet<Ino>,
    /// Blocks fetched for streamed files (see the module invariants).
    streamed: StreamBuffer,
    /// The order of this session's first reads (the hot set's ordered prefix).
    first_reads: order::FirstReads,
    /// While a refill runs: files a read found not yet refilled, whose remaining chunks the
    /// refill fetches next (at most [`MAX_REFILL_BUMPS`]).
    refill_bumps: Option<VecDeque<Ino>>,
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
    read_hits: AtomicU64,
    read_hit_bytes: AtomicU64,
    read_misses: AtomicU64,
    neighbour_blocks: AtomicU64,
    neighbour_bytes: AtomicU64,
    neighbour_hits: AtomicU64,
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
    /// Held by the read-ahead thread planning a walk batch (`walk.rs`): one plans at a time.
    /// Its cache, where the queued files' first blocks lie (block to pack and offset, `None`
    /// for nothing to read), so a block is looked up once while it stays queued. Only the
    /// planning reads it: a fetch locates its blocks again.
    walk_planner: Mutex<HashMap<Hash, Option<(Hash, u64)>>>,
    /// The evictor's 200 ms tick (woken early only to stop).
    tick: Condvar,
    counters: Counters,
    /// Blocks fetched beside a miss, until a read wants them.
    near: Mutex<near::NearBuffer>,
    /// Fetches callers wait for (reads and writes of evicted chunks): the refill waits while any run.
    foreground: AtomicUsize,
    /// The refill's progress, once one started.
    refill: Mutex<Option<RefillStats>>,
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
///
/// It carries the marks the change needs committed before its bytes land (unsealed marks,
/// the dirty marker, records made resident again): the caller adds its own changes (size,
/// times) and commits them all in one batch with [`WriteGuard::commit`].
pub struct WriteGuard<'a> {
    tier: &'a ColdTier,
    ino: Ino,
    chunks: Vec<u64>,
    marks: Marks,
}

/// What a [`WriteGuard`] must have committed before its change lands.
#[derive(Default)]
struct Marks {
    batch: MetaBatch,
    /// The chunks whose marks are in `batch`.
    chunks: Vec<u64>,
    /// The inode's dirty marker is in `batch`.
    inode: bool,
}

impl Marks {
    /// Chunk `idx` of `ino` (state `c`) turned dirty, or its marks are not committed yet:
    /// they go in this batch. Before the write lands, so that a node that restores the
    /// workspace after this one stopped knows the chunk's data may not be in the store, and
    /// this node re-seals it after a crash.
    fn chunk(&mut self, ino: Ino, idx: u64, c: &Chunk) {
        self.batch.put_unsealed(ino, idx);
        if let Some(r) = &c.rec {
            self.batch.set_chunk_residency(ino, idx, r);
        }
        self.chunks.push(idx);
    }
}

impl WriteGuard<'_> {
    /// Whether the change has marks to commit before its bytes land (a chunk turned dirty,
    /// or one whose mark another write has not committed yet). Without marks, a caller may
    /// land the bytes first and commit its own changes after.
    pub fn has_marks(&self) -> bool {
        !self.marks.chunks.is_empty() || self.marks.inode
    }

    /// Commits `batch` together with the change's marks, as one batch; the marks count as
    /// committed from then on. On an error they stay pending: the next write of those chunks
    /// commits them again.
    pub fn commit(&mut self, mut batch: MetaBatch) -> Result<(), ColdError> {
        let marks = std::mem::take(&mut self.marks);
        batch.append(marks.batch);
        self.tier.meta.commit(batch)?;
        if marks.chunks.is_empty() && !marks.inode {
            return Ok(());
        }
        let mut st = self.tier.state.lock();
        if let Some(f) = st.files.get_mut(&self.ino) {
            f.dirty_mark_pending &= !marks.inode;
            for idx in &marks.chunks {
                if let Some(c) = f.chunks.get_mut(idx) {
                    c.mark_pending = false;
                }
            }
        }
        Ok(())
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.tier.state.lock();
        let pressure = self.tier.under_pressure(&st);
        let State { files, epochs, urgent, .. } = &mut *st;
        // Whether a chunk this write held became one an uploader would claim now (see
        // `claim`): no write in it any more, and full, or of a closed file, or of one an fsync
        // waits for, or any chunk while dirty bytes press. Other chunks wait for the
        // uploaders' own round (`seal_after`): waking one for them would cost a context switch
        // per write for nothing.
        let mut sealable = false;
        if let Some(f) = files.get_mut(&self.ino) {
            let settled = pressure || !f.open || urgent.contains_key(&self.ino);
            for idx in &self.chunks {
                if let Some(c) = f.chunks.get_mut(idx) {
                    c.inflight = c.inflight.saturating_sub(1);
                    *epochs += 1;
                    c.epoch = *epochs;
                    sealable |= c.inflight == 0 && c.dirty && (settled || c.dirty_len >= CHUNK_SIZE);
                }
            }
        }
        drop(st);
        if sealable {
            self.tier.work.notify_one();
        }
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

/// Drops the chunk records past the end of a file (a crash between a truncate and its
/// cleanup) or of deleted files, at start.
fn drop_chunks_past_the_end(st: &mut State, sizes: &HashMap<Ino, u64>, stale: &mut MetaBatch) {
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
}

/// The chunks of one file (`size` bytes, `dense` if its data file has no holes) that must be
/// sealed again: those marked unsealed, all of a file marked dirty, and those holding data
/// here with no record. Marks past the end are deleted in `stale`.
fn chunks_to_seal(
    ino: Ino,
    size: u64,
    dense: bool,
    f: &FileState,
    marks: &[u64],
    stale: &mut MetaBatch,
    hot: &HotTier,
) -> Result<HashSet<u64>, ColdError> {
    let n = size.div_ceil(CHUNK_SIZE);
    let mut dirty: HashSet<u64> = HashSet::new();
    for &idx in marks {
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
            for run in hot.data(&file, ino).data_extents(0..size)? {
                dirty.extend(chunks_of(&run).filter(|i| !f.chunks.contains_key(i)));
            }
        }
    }
    Ok(dirty)
}

/// The chunk state as the metadata store left it: every chunk not yet stored is marked
/// dirty (and its unsealed mark written), stale marks and chunks past a file's end dropped.
fn load_state(meta: &MetaStore, hot: &HotTier) -> Result<State, ColdError> {
    let mut st = State::default();
    for (ino, index, rec) in meta.chunks()? {
        let local_len = if rec.resident { u64::from(rec.data) } else { 0 };
        st.files.entry(ino).or_default().chunks.insert(index, Chunk { rec: Some(rec), local_len, ..Chunk::default() });
    }
    // Inodes marked dirty by a version that marked inodes only (their resident chunks
    // are re-sealed), and the chunks marked unsealed: written, maybe not sealed since.
    let marked: HashSet<Ino> = meta.dirty_inodes()?.into_iter().collect();
    let mut unsealed = meta.unsealed_chunks()?;
    let mut stale = MetaBatch::new();
    let mut sizes: HashMap<Ino, u64> = HashMap::new();
    for (ino, size, dense) in meta.file_sizes()? {
        sizes.insert(ino, size);
        let f = st.files.entry(ino).or_default();
        f.marked_dirty = marked.contains(&ino);
        let marks = unsealed.remove(&ino).unwrap_or_default();
        let dirty = chunks_to_seal(ino, size, dense, f, &marks, &mut stale, hot)?;
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
    drop_chunks_past_the_end(&mut st, &sizes, &mut stale);
    st.resident_bytes =
        st.files.values().flat_map(|f| f.chunks.values()).map(|c| if c.evicted() { 0 } else { c.local_len }).sum();
    meta.commit(stale)?;
    Ok(st)
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
        let st = load_state(&meta, &hot)?;
        let tier = Arc::new(ColdTier {
            store,
            meta,
            hot,
            config,
            state: Mutex::new(st),
            changed: Condvar::new(),
            work: Condvar::new(),
            ahead: Condvar::new(),
            walk_planner: Mutex::new(HashMap::new()),
            tick: Condvar::new(),
            counters: Counters::default(),
            near: Mutex::new(near::NearBuffer::default()),
            foreground: AtomicUsize::new(0),
            refill: Mutex::new(None),
            last_error: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
        });
        tier.spawn_workers();
        Ok(tier)
    }

    /// Starts the uploader, prefetcher, evictor and verifier threads and keeps their handles
    /// for [`ColdTier::shutdown`].
    fn spawn_workers(self: &Arc<Self>) {
        let mut threads = Vec::new();
        for i in 0..self.config.uploaders.max(1) {
            let t = self.clone();
            threads.push(spawn(format!("tierfs-upload-{i}"), move || t.upload_loop()));
        }
        for i in 0..self.config.prefetchers.max(1) {
            let t = self.clone();
            threads.push(spawn(format!("tierfs-fetch-{i}"), move || t.prefetch_loop()));
        }
        let t = self.clone();
        threads.push(spawn("tierfs-evict".into(), move || t.evict_loop()));
        let t = self.clone();
        threads.push(spawn("tierfs-verify".into(), move || t.verify_loop()));
        *self.threads.lock() = threads;
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

    /// The block id of a chunk's bytes; all zeros get [`ZERO_BLOCK`] (never uploaded).
    fn content_id(&self, data: &[u8]) -> BlockId {
        if data.iter().all(|&b| b == 0) { ZERO_BLOCK } else { self.store.block_id(data) }
    }

    // ---- called by the vfs -------------------------------------------------------------

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
        if !self.config.streams_at(new_size) {
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

    /// Whether uploaders take every dirty chunk now, not only settled ones: a flush or the
    /// shutdown is under way, or dirty bytes reached half their bound.
    fn under_pressure(&self, st: &State) -> bool {
        st.flush || st.stopping || st.dirty_bytes >= self.config.max_dirty / 2
    }

    /// Whether `ino` has open handles (a closed file is sealed at once).
    pub fn set_open(&self, ino: Ino, open: bool) {
        let mut st = self.state.lock();
        // A closed file with dirty chunks is sealed at once: an uploader is woken for it. A
        // clean one (read, or created empty) gives the uploaders nothing to do.
        let mut seal = false;
        if let Some(f) = st.files.get_mut(&ino) {
            f.open = open;
            seal = !open && f.dirty_chunks > 0;
            // A closed file with no chunk state (empty, or all hole) keeps nothing in memory:
            // the engine's memory follows the files that hold data, not every file opened.
            if !open && f.chunks.is_empty() && !f.marked_dirty && !f.keep_cached {
                st.files.remove(&ino);
            }
        } else if open {
            st.files.entry(ino).or_default().open = true;
        }
        drop(st);
        if seal {
            self.work.notify_one();
        }
    }

    /// A handle of `ino` the kernel will serve from its data file (FUSE passthrough) opens.
    /// With `check`, only if every chunk is local and checked (none evicted or unverified):
    /// returns false, and pins nothing, otherwise. While such handles are open the file is not
    /// evicted. `writes`: the handle may write without the engine seeing it, so the inode's
    /// dirty marker is committed now and kept until it closes; after a crash every resident
    /// chunk is then sealed again, never trusted (the caller marks the chunks dirty when the
    /// handle is synced or closed).
    pub fn passthrough_open(&self, ino: Ino, check: bool, writes: bool, marked: bool) -> Result<bool, ColdError> {
        let mut st = self.state.lock();
        let State { files, tick, first_reads, .. } = &mut *st;
        let f = files.entry(ino).or_default();
        if check && f.chunks.values().any(Chunk::not_ready) {
            return Ok(false);
        }
        // The kernel's reads never reach the engine: the open counts as a use of every chunk
        // (eviction's recency and the hot set's order, its first reads too), and so does the
        // release.
        *tick += 1;
        f.chunks.values_mut().for_each(|c| c.last_access = *tick);
        first_reads.record(ino, f.chunks.keys().copied(), Instant::now);
        f.passthrough += 1;
        if writes {
            f.passthrough_writers += 1;
            if f.passthrough_writers == 1 {
                // The first writer: the marker says so (a crash then keeps the data file's
                // length, `Vfs::recover_passthrough_writes`), replacing a plain one.
                let was = std::mem::replace(&mut f.marked_dirty, true);
                if marked {
                    // Committed with the file's create (`Vfs::create_open`).
                    return Ok(true);
                }
                let mut batch = MetaBatch::new();
                batch.put_dirty_passthrough(ino);
                if let Err(e) = self.meta.commit(batch) {
                    f.marked_dirty = was;
                    f.passthrough -= 1;
                    f.passthrough_writers -= 1;
                    return Err(e.into());
                }
            }
        }
        Ok(true)
    }

    /// A handle [`ColdTier::passthrough_open`] opened closed.
    pub fn passthrough_release(&self, ino: Ino, writes: bool) {
        let mut st = self.state.lock();
        let State { files, tick, .. } = &mut *st;
        if let Some(f) = files.get_mut(&ino) {
            *tick += 1;
            f.chunks.values_mut().for_each(|c| c.last_access = *tick);
            f.passthrough = f.passthrough.saturating_sub(1);
            if writes {
                f.passthrough_writers = f.passthrough_writers.saturating_sub(1);
                if f.passthrough_writers == 0 && f.marked_dirty {
                    // The last writer left (its writes taken in): a plain marker while chunks
                    // wait to be sealed, none once they are.
                    let mut batch = MetaBatch::new();
                    if f.dirty_chunks > 0 {
                        batch.put_dirty(ino);
                    } else {
                        f.marked_dirty = false;
                        batch.delete_dirty(ino);
                    }
                    if let Err(e) = self.meta.commit(batch) {
                        tracing::warn!(ino, "updating the dirty marker after a passthrough writer: {e}");
                    }
                }
            }
        }
    }

    /// The bytes of file data this node holds (what `--cache-size` bounds).
    pub fn resident_bytes(&self) -> u64 {
        self.state.lock().resident_bytes
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
            read_hits: self.counters.read_hits.load(Ordering::Relaxed),
            read_hit_bytes: self.counters.read_hit_bytes.load(Ordering::Relaxed),
            read_misses: self.counters.read_misses.load(Ordering::Relaxed),
            neighbour_blocks: self.counters.neighbour_blocks.load(Ordering::Relaxed),
            neighbour_bytes: self.counters.neighbour_bytes.load(Ordering::Relaxed),
            neighbour_hits: self.counters.neighbour_hits.load(Ordering::Relaxed),
            refill: self.refill.lock().clone(),
            last_error: self.last_error.lock().clone(),
        }
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

/// Fills `buf` from `offset` of a data file; past its end the bytes stay zeros (as `buf` holds).
fn read_full(hot: &HotTier, file: &File, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<(), ColdError> {
    hot.data(file, ino).read_into(offset, buf)?;
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
mod budget_tests {
    use super::*;

    const PACK: u64 = 16 << 20;

    #[test]
    fn the_default_budget_keeps_the_defaults_and_a_small_one_bounds_memory() {
        let defaults = ColdConfig::new(Some(1 << 30));
        let mut shared = defaults.clone();
        shared.share_budget(DEFAULT_INFLIGHT_BUDGET, PACK);
        assert_eq!((shared.uploaders, shared.prefetchers, shared.prefetch_chunks), (4, 4, 16));
        assert_eq!(shared.stream_blocks(), defaults.stream_blocks());
        assert!(shared.inflight_bound(PACK) <= DEFAULT_INFLIGHT_BUDGET);

        for budget in [96 << 20, 128 << 20, 200 << 20] {
            let mut small = defaults.clone();
            small.share_budget(budget, PACK);
            assert!(small.inflight_bound(PACK) <= budget, "{budget}: {small:?}");
            assert!(small.prefetch_chunks as usize <= small.stream_blocks() / 2);
        }
        // Below the floor: one of each, eight streamed blocks.
        let mut tiny = defaults.clone();
        tiny.share_budget(1 << 20, PACK);
        assert_eq!((tiny.uploaders, tiny.prefetchers, tiny.stream_blocks()), (1, 1, 8));
        assert_eq!(tiny.inflight_bound(PACK), (68 << 20) + (1 << 20) / 32);
        // Big packs take fewer uploaders.
        let mut big = defaults;
        big.share_budget(DEFAULT_INFLIGHT_BUDGET, 64 << 20);
        assert_eq!(big.uploaders, 1);
    }
}
