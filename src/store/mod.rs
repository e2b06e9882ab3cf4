//! A store: the encrypted, redundant object store behind a workspace, as one value.
//!
//! [`Store`] ties the layers below together: the local store file ([`StoreConfig`]), the
//! backends and redundancy policy ([`crate::backend::RedundantStore`]), the keys
//! ([`crate::crypto`]) and the pack format ([`crate::block`]). Above it, the tier layer only
//! says "store these blocks" and "give me this block back".
//!
//! On-store layout (docs/FORMAT.md, "Store"):
//!
//! ```text
//! config               JSON, plaintext: format version, store id, redundancy (no secrets)
//! keys/<id>            JSON: the data key wrapped by one passphrase or key file
//! packs/<xx>/<id>      packs of encrypted blocks (erasure: one object per shard, `.s<i>`)
//! index/<id>           encrypted index segments: block -> pack, offset, length
//! ws/<hash>/…          workspaces' metadata (crate::remote; scrubbed here, written there)
//! ```
//!
//! Invariants:
//! - `put_blocks` returns only after the pack *and* its index segment are stored at quorum,
//!   so a block location handed upward always resolves after a restart;
//! - every byte read back is verified (AEAD tag bound to the object's kind and name, and for
//!   blocks the keyed blake3 id) before it is returned; a copy that fails is skipped and
//!   repaired by the redundancy layer;
//! - opening a store written by a newer format fails with a message, never a misread.

pub mod conditional;
pub mod config;
pub mod limits;

use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendError, BackendOptions, BackendSpec, Redundancy, RedundantStore, ScrubOutcome};
use crate::block::{self, BlockError, BlockId, BlockLoc, PackBuilder};
use crate::crypto::{self, CryptoError, DataKey, KdfParams, Keys, Secret, WrappedKey};
use crate::types::ErrorKind;
pub use conditional::ConditionalCreate;
pub use config::{Fencing, StoreConfig, private_mode};
pub use limits::WholeObject;

/// Format version of the store layout (the `config` object).
pub const STORE_FORMAT: u32 = 1;

const CONFIG_KEY: &str = "config";
/// A run of blocks from a pack's start to within this many bytes of its end (the trailer and
/// footer, a few hundred bytes) is read together with them: the whole pack in one GET.
const WHOLE_PACK_SLACK: u64 = 64 << 10;
/// [`Store::get_blocks`] reads two blocks of one pack with one request when at most this many
/// bytes lie between them: reading them costs less than a second request's round trip.
pub const MAX_RUN_GAP: u64 = 256 << 10;
/// ...and while the gaps of a run add up to at most one part in this many of the blocks
/// wanted, so a run never reads more than 1.2 times what it was asked for (a walk of files
/// made round-robin asks for blocks with other directories' files between them).
const GAP_SHARE: u64 = 5;

/// How [`Store::get_blocks`] joins blocks of one pack into one ranged GET: what a run may read
/// that nobody asked for (the gaps between the blocks wanted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunJoin {
    /// Reads a reader waits for (misses, read-ahead, walks): each gap at most [`MAX_RUN_GAP`]
    /// and all of a run's gaps at most a fifth of its blocks' bytes ([`GAP_SHARE`]), so a run
    /// reads at most 1.2 times what it was asked for.
    Tight,
    /// Background reads of many blocks (the refill after a reset): any gap, while a run's gaps
    /// add up to at most its blocks' bytes, so a run reads at most twice what it was asked
    /// for, in far fewer requests. The caller bounds a run's span (its batch); a store that
    /// answers each range by reading the whole object (moto) pays per request, not per byte.
    Loose,
}

impl RunJoin {
    /// Whether a run of `wanted` bytes with `gaps` bytes of gaps takes a next block of `next`
    /// bytes `gap` bytes after its end.
    fn joins(self, wanted: u64, gaps: u64, gap: u64, next: u64) -> bool {
        match self {
            RunJoin::Tight => gap <= MAX_RUN_GAP && (gaps + gap) * GAP_SHARE <= wanted + next,
            RunJoin::Loose => gaps + gap <= wanted + next,
        }
    }
}
/// [`Store::get_blocks`] reads this many runs (packs) at once.
pub const PARALLEL_RUNS: usize = 8;
/// Block entries of pack trailers kept in memory (56 bytes each, some 11 MiB): the packs of
/// the last gigabytes of small files read.
const TRAILER_CACHE_ENTRIES: usize = 200_000;
/// The first read of a pack's trailer takes this many bytes from its end: a trailer of up to
/// some 1 300 blocks, so one GET for every pack but those of the tiniest files.
const TRAILER_GUESS: u64 = 64 << 10;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Config(String),
    /// The store file could not be read; the kind is the I/O error's (a missing file is
    /// `NotFound`).
    #[error("cannot read store file {}: {source}", path.display())]
    ReadConfig {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A secret file (`what`: "store file", "key file") that users other than its owner may
    /// read, write or run ([`config::private_mode`]).
    #[error(
        "{what} {} is open to other users (mode {mode:04o}), who could unlock the store with it; run `chmod 600 {}` \
         and try again",
        path.display(),
        path.display()
    )]
    NotPrivate { what: String, path: std::path::PathBuf, mode: u32 },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Crypto(#[from] CryptoError),
    #[error(transparent)]
    Block(#[from] BlockError),
    #[error("no tierfs store at {0} (check the backend URL and prefix)")]
    NotInitialized(String),
    #[error("a tierfs store already exists at {0}; refusing to initialize it again")]
    AlreadyInitialized(String),
    #[error("the store at {backend} has id {found}, but the store file says {expected}: wrong store file or URL")]
    WrongStore { backend: String, found: String, expected: String },
    #[error(
        "the store was written by a newer tierfs (format {found}, this one reads up to {supported}): upgrade tierfs"
    )]
    TooNew { found: u32, supported: u32 },
    #[error("{0}")]
    Key(String),
    /// An object of the store's own (its config, a wrapped key) that does not decode: damaged,
    /// or written by something that is not tierfs.
    #[error("{what} in the store does not decode: {reason}")]
    Undecodable { what: String, reason: String },
    #[error("no key with id {0}")]
    NoSuchKey(String),
    /// A writer was about to store an object its kind's readers refuse (`limits.rs`).
    #[error(
        "{key} would be {len} bytes, more than the {} bytes {} can be (every reader would refuse it)",
        limit.max_len, limit.what
    )]
    TooLarge { key: String, len: u64, limit: crate::backend::SizeLimit },
}

impl StoreError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Config(_)
            | StoreError::NotPrivate { .. }
            | StoreError::WrongStore { .. }
            | StoreError::TooNew { .. }
            | StoreError::Key(_) => ErrorKind::InvalidInput,
            StoreError::ReadConfig { source, .. } => crate::types::io_error_kind(source),
            StoreError::Backend(e) => e.kind(),
            StoreError::Crypto(e) => e.kind(),
            StoreError::Block(e) => e.kind(),
            StoreError::NotInitialized(_) | StoreError::NoSuchKey(_) => ErrorKind::NotFound,
            StoreError::AlreadyInitialized(_) => ErrorKind::Conflict,
            StoreError::TooLarge { .. } => ErrorKind::InvalidInput,
            StoreError::Undecodable { .. } => ErrorKind::Corrupt,
        }
    }
}

type Result<T> = std::result::Result<T, StoreError>;

/// The plaintext `config` object at the root of a store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfo {
    pub format: u32,
    pub store_id: String,
    pub redundancy: Redundancy,
    pub created_unix: u64,
    /// The backends a writer found honouring conditional creates (`conditional.rs`).
    #[serde(
        default,
        deserialize_with = "ConditionalCreate::lenient",
        skip_serializing_if = "ConditionalCreate::is_unrecorded"
    )]
    pub conditional_create: ConditionalCreate,
}

/// Totals of a scrub.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct ScrubReport {
    pub objects: u64,
    pub packs: u64,
    pub copies_ok: u64,
    pub copies_bad: u64,
    pub copies_missing: u64,
    pub repaired: u64,
    /// Objects or packs with no good copy left (or not repaired because `repair` was off).
    pub unrepaired: Vec<String>,
}

impl ScrubReport {
    fn add(&mut self, key: &str, o: &ScrubOutcome, repair: bool) {
        self.copies_ok += o.copies_ok as u64;
        self.copies_bad += o.copies_bad as u64;
        self.copies_missing += o.copies_missing as u64;
        self.repaired += o.repaired as u64;
        let damaged = o.copies_bad + o.copies_missing > 0;
        if o.unrepairable || (damaged && (!repair || o.repaired < o.copies_bad + o.copies_missing)) {
            self.unrepaired.push(key.to_string());
        }
    }
}

/// Progress of a long store operation: `done` of `total` items.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

/// A check of an object's bytes, chosen per object kind.
type Verifier = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// An open store.
pub struct Store {
    config: StoreConfig,
    info: StoreInfo,
    keys: Keys,
    /// Kept (zeroized on drop) so keys can be added without unwrapping it again.
    data_key: DataKey,
    unlocked_by: String,
    backend: RedundantStore,
    /// The block lists of packs read lately ([`Store::get_block_near`]).
    trailers: parking_lot::Mutex<TrailerCache>,
}

/// Pack trailers read lately, by pack id: at most [`TRAILER_CACHE_ENTRIES`] block entries in
/// all, the oldest pack forgotten first.
#[derive(Default)]
struct TrailerCache {
    packs: std::collections::HashMap<crypto::Hash, Arc<Vec<(BlockId, BlockLoc)>>>,
    order: std::collections::VecDeque<crypto::Hash>,
    entries: usize,
}

impl TrailerCache {
    fn get(&self, pack: &crypto::Hash) -> Option<Arc<Vec<(BlockId, BlockLoc)>>> {
        self.packs.get(pack).cloned()
    }

    fn insert(&mut self, pack: crypto::Hash, blocks: Arc<Vec<(BlockId, BlockLoc)>>) {
        if self.packs.contains_key(&pack) {
            return;
        }
        self.entries += blocks.len();
        self.packs.insert(pack, blocks);
        self.order.push_back(pack);
        while self.entries > TRAILER_CACHE_ENTRIES && self.order.len() > 1 {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(b) = self.packs.remove(&old) {
                self.entries -= b.len();
            }
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn open_backends(config: &StoreConfig) -> Result<RedundantStore> {
    config.validate()?;
    let opts = BackendOptions::default();
    let backends = config
        .backends
        .iter()
        .map(|url| Backend::open(&BackendSpec::parse(url)?, &config.credentials, &opts))
        .collect::<std::result::Result<Vec<_>, BackendError>>()?;
    Ok(RedundantStore::new(backends, config.redundancy()?)?.with_largest_object(limits::LARGEST_OBJECT))
}

/// The bound of a scrub's read of a small object, by its key: a workspace's objects take the
/// largest of their kinds' (the keys of `crate::remote` are not parsed here).
fn scrub_limit(key: &str) -> crate::backend::SizeLimit {
    if key == CONFIG_KEY {
        WholeObject::Config.limit()
    } else if key.starts_with("keys/") {
        WholeObject::WrappedKey.limit()
    } else if key.starts_with("index/") {
        WholeObject::IndexSegment.limit()
    } else {
        crate::backend::SizeLimit { max_len: limits::LARGEST_WORKSPACE_OBJECT, what: "an object of a workspace" }
    }
}

fn json_ok<T: for<'de> Deserialize<'de>>(b: &[u8]) -> bool {
    serde_json::from_slice::<T>(b).is_ok()
}

impl Store {
    /// Creates a new store on the configured backends: writes `config` and the first wrapped
    /// key. Refuses if any backend already holds a store.
    pub async fn init(config: &StoreConfig, secret: &Secret<'_>, kdf: KdfParams) -> Result<Store> {
        Store::init_on(open_backends(config)?, config, secret, kdf).await
    }

    /// [`Store::init`] on backends opened already (tests put fault injection around them).
    pub(crate) async fn init_on(
        backend: RedundantStore,
        config: &StoreConfig,
        secret: &Secret<'_>,
        kdf: KdfParams,
    ) -> Result<Store> {
        for b in backend.backends() {
            b.check().await?;
            match b.get(CONFIG_KEY, WholeObject::Config.limit()).await {
                // Something is there (an oversized one too): not ours to overwrite.
                Ok(_) | Err(BackendError::Corrupt { .. }) => {
                    return Err(StoreError::AlreadyInitialized(b.name().to_string()));
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let info = StoreInfo {
            format: STORE_FORMAT,
            store_id: config.store_id.clone(),
            redundancy: config.redundancy()?,
            created_unix: unix_now(),
            conditional_create: ConditionalCreate::Unrecorded,
        };
        let data_key = DataKey::generate();
        let label = match secret {
            Secret::Passphrase(_) => "passphrase",
            Secret::KeyFile(_) => "key file",
        };
        let wrapped = crypto::wrap_key(&data_key, secret, kdf, label)?;
        let unlocked_by = wrapped.id.clone();
        let store = Store::assemble(config, info, data_key, unlocked_by, backend);
        // Key first: a store with a config but no key could never be opened.
        store.put_key(&wrapped).await?;
        let body = serde_json::to_vec_pretty(&store.info).map_err(|e| StoreError::Config(e.to_string()))?;
        store.backend.put_object(CONFIG_KEY, Bytes::from(body)).await?;
        Ok(store)
    }

    /// Opens an existing store, unlocking its data key with `secret`.
    pub async fn open(config: &StoreConfig, secret: &Secret<'_>) -> Result<Store> {
        let backend = open_backends(config)?;
        // Two round trips at once: a reset's mount waits for both before anything else.
        let (info, wrapped) = futures::join!(read_info(&backend), list_keys(&backend));
        let info = info?;
        if info.store_id != config.store_id {
            return Err(StoreError::WrongStore {
                backend: config.backends.join(", "),
                found: info.store_id,
                expected: config.store_id.clone(),
            });
        }
        let wrapped = wrapped?;
        if wrapped.is_empty() {
            return Err(StoreError::Key("the store has no keys (keys/ is empty): it cannot be unlocked".into()));
        }
        let (data_key, used) = crypto::unwrap_any(&wrapped, secret)?;
        let unlocked_by = wrapped[used].id.clone();
        Ok(Store::assemble(config, info, data_key, unlocked_by, backend))
    }

    fn assemble(
        config: &StoreConfig,
        info: StoreInfo,
        data_key: DataKey,
        unlocked_by: String,
        backend: RedundantStore,
    ) -> Store {
        Store {
            config: config.clone(),
            keys: Keys::new(&data_key),
            info,
            data_key,
            unlocked_by,
            backend,
            trailers: Default::default(),
        }
    }

    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    pub fn info(&self) -> &StoreInfo {
        &self.info
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The id of the wrapped key that unlocked this store (`tierfs key passwd` replaces it).
    pub fn unlocked_by(&self) -> &str {
        &self.unlocked_by
    }

    pub fn backend(&self) -> &RedundantStore {
        &self.backend
    }

    /// Packs `blocks` (id computed by the caller with [`Keys::block_id`]) into one pack,
    /// uploads it and its index segment, and returns where each block now lives (see
    /// [`Store::put_pack`]: no blocks, no upload).
    pub async fn put_blocks(&self, blocks: &[(BlockId, &[u8])]) -> Result<Vec<(BlockId, BlockLoc)>> {
        let size: usize = blocks.iter().map(|(_, b)| crypto::sealed_len(b.len())).sum();
        let mut builder = PackBuilder::new(size);
        for (id, data) in blocks {
            builder.add(&self.keys, id, data);
        }
        self.put_pack(builder).await
    }

    /// Finishes a pack the caller filled (blocks sealed with this store's keys, e.g. staged
    /// with [`PackBuilder::stage`]), uploads it and its index segment, and returns where each
    /// block now lives. An empty pack uploads nothing.
    pub async fn put_pack(&self, builder: PackBuilder) -> Result<Vec<(BlockId, BlockLoc)>> {
        if builder.is_empty() {
            return Ok(Vec::new());
        }
        let pack = builder.finish(&self.keys);
        self.backend.put_pack(&block::pack_key(&pack.id), pack.bytes.clone()).await?;
        let segment = block::random_id();
        let sealed = block::seal_index(&self.keys, &segment, &pack.blocks);
        self.backend.put_object(&block::index_key(&segment), Bytes::from(sealed)).await?;
        Ok(pack.blocks)
    }

    /// Fetches one block with a range GET of its pack, verified before it is returned. The
    /// block is decrypted in the buffer the body was read into.
    pub async fn get_block(&self, id: &BlockId, loc: &BlockLoc) -> Result<Bytes> {
        let open = |sealed: Bytes| block::open_block_bytes(&self.keys, id, loc.plain_len, sealed).ok();
        let key = block::pack_key(&loc.pack);
        Ok(self.backend.get_pack_range(&key, loc.pack_len, loc.range(), &open).await?)
    }

    /// Fetches block `id` and, in the same range GET, the blocks around it in its pack, within
    /// `window / 2` bytes on either side: a miss on a small file brings the files written
    /// with it (issue 24). Each block is verified on its own. The neighbours need the pack's
    /// block list (its trailer): the first miss in a pack reads that beside the block (two
    /// requests at once) and gets no neighbours; later misses in the pack find it cached.
    /// A failed read of the run falls back to the block alone (and no neighbours).
    pub async fn get_block_near(
        &self,
        id: &BlockId,
        loc: &BlockLoc,
        window: u64,
    ) -> Result<(Bytes, Vec<(BlockId, Bytes)>)> {
        let Some(blocks) = self.trailers.lock().get(&loc.pack) else {
            let (block, trailer) = futures::join!(self.get_block(id, loc), self.pack_blocks(&loc.pack, loc.pack_len));
            match trailer {
                Ok(blocks) => self.trailers.lock().insert(loc.pack, Arc::new(blocks)),
                Err(e) => tracing::debug!("trailer of pack {}: {e}", hex::encode(loc.pack)),
            }
            return Ok((block?, Vec::new()));
        };
        let run = neighbourhood(&blocks, id, loc, window);
        if run.len() > 1 {
            if let Ok(opened) = self.get_run(&run).await {
                let mut mine = None;
                let mut near = Vec::with_capacity(run.len() - 1);
                for ((bid, _), data) in run.iter().zip(opened) {
                    if bid == id && mine.is_none() {
                        mine = Some(data);
                    } else {
                        near.push((*bid, data));
                    }
                }
                if let Some(mine) = mine {
                    return Ok((mine, near));
                }
            }
        }
        Ok((self.get_block(id, loc).await?, Vec::new()))
    }

    /// The blocks pack `pack` (of `pack_len` bytes) holds, from its trailer: one range GET of
    /// its end, two when the trailer is longer than [`TRAILER_GUESS`].
    pub async fn pack_blocks(&self, pack: &crypto::Hash, pack_len: u64) -> Result<Vec<(BlockId, BlockLoc)>> {
        enum Tail {
            Blocks(Vec<(BlockId, BlockLoc)>),
            Longer(u64),
        }
        let key = block::pack_key(pack);
        let guess = TRAILER_GUESS.min(pack_len);
        let open = |tail: Bytes| match block::trailer_span(pack, &tail, pack_len).ok()? {
            span if span > tail.len() as u64 => Some(Tail::Longer(span)),
            _ => block::open_trailer(&self.keys, pack, &tail, pack_len).ok().map(Tail::Blocks),
        };
        match self.backend.get_pack_range(&key, pack_len, pack_len - guess..pack_len, &open).await? {
            Tail::Blocks(blocks) => Ok(blocks),
            Tail::Longer(span) => {
                let open = |tail: Bytes| block::open_trailer(&self.keys, pack, &tail, pack_len).ok();
                Ok(self.backend.get_pack_range(&key, pack_len, pack_len - span..pack_len, &open).await?)
            }
        }
    }

    /// Fetches several blocks, in order. Runs of blocks that lie in one pack in order, with
    /// gaps `join` accepts ([`RunJoin`]), are read with one range GET (then each is decrypted
    /// in its part of the body and verified on its own; the gaps, blocks nobody asked for, are
    /// skipped); a run whose read or check fails falls back to one verified read per block.
    /// Up to [`PARALLEL_RUNS`] runs are read at once (blocks of many files lie in many packs).
    pub async fn get_blocks(&self, blocks: &[(BlockId, BlockLoc)], join: RunJoin) -> Result<Vec<Bytes>> {
        let runs = runs_of(blocks, join);
        let mut read = futures::stream::iter(runs)
            .map(|r| async move { Ok::<_, StoreError>((r.start, self.get_run(&blocks[r]).await?)) })
            .buffered(PARALLEL_RUNS);
        let mut out: Vec<Bytes> = vec![Bytes::new(); blocks.len()];
        while let Some(done) = read.next().await {
            let (start, datas) = done?;
            for (k, data) in datas.into_iter().enumerate() {
                out[start + k] = data;
            }
        }
        Ok(out)
    }

    /// The blocks of one run of [`Store::get_blocks`] (one pack, in order), in one range GET
    /// when there are several, else (or if that fails) one by one.
    async fn get_run(&self, run: &[(BlockId, BlockLoc)]) -> Result<Vec<Bytes>> {
        if run.len() > 1 {
            let range = run_range(run);
            let blocks_end = run[run.len() - 1].1.range().end;
            // The run's envelopes lie in order: each is split off the front in turn, after the
            // gap before it.
            let open = |sealed: Bytes| {
                let mut rest = block::into_owned(sealed);
                let mut at = range.start;
                let mut opened = Vec::with_capacity(run.len());
                for (id, loc) in run {
                    let (gap, len) = ((loc.offset - at) as usize, loc.sealed_len as usize);
                    if gap + len > rest.len() {
                        return None;
                    }
                    rest.advance(gap);
                    opened.push(block::open_block_in(&self.keys, id, loc.plain_len, rest.split_to(len)).ok()?);
                    at = loc.range().end;
                }
                (rest.len() as u64 == range.end - blocks_end).then_some(opened)
            };
            let key = block::pack_key(&run[0].1.pack);
            if let Ok(opened) = self.backend.get_pack_range(&key, run[0].1.pack_len, range.clone(), &open).await {
                return Ok(opened);
            }
        }
        let mut out = Vec::with_capacity(run.len());
        for (id, loc) in run {
            out.push(self.get_block(id, loc).await?);
        }
        Ok(out)
    }

    /// Every index entry of the store (all segments).
    pub async fn load_index(&self) -> Result<Vec<(BlockId, BlockLoc)>> {
        let mut out = Vec::new();
        for obj in self.backend.list("index/").await? {
            let Some(seg) = segment_id(&obj.key) else { continue };
            out.extend(self.read_index(&seg).await?);
        }
        Ok(out)
    }

    async fn read_index(&self, seg: &crypto::Hash) -> Result<Vec<(BlockId, BlockLoc)>> {
        let verify = |b: &[u8]| block::open_index(&self.keys, seg, b).is_ok();
        let bytes = self.backend.get_object(&block::index_key(seg), WholeObject::IndexSegment.limit(), &verify).await?;
        Ok(block::open_index(&self.keys, seg, &bytes)?)
    }

    /// Checks every copy of every object and pack (and repairs bad or missing ones when
    /// `repair`), calling `progress` after each item.
    pub async fn scrub(&self, repair: bool, progress: &(dyn Fn(Progress) + Sync)) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        let objects: Vec<String> = std::iter::once(CONFIG_KEY.to_string())
            .chain(self.backend.list("keys/").await?.into_iter().map(|o| o.key))
            .chain(self.backend.list("index/").await?.into_iter().map(|o| o.key))
            .chain(self.backend.list("ws/").await?.into_iter().map(|o| o.key))
            .collect();
        let mut packs = std::collections::BTreeMap::new();
        let mut unreadable_index = Vec::new();
        for key in &objects {
            if let Some(seg) = segment_id(key) {
                match self.read_index(&seg).await {
                    Ok(entries) => {
                        for (_, loc) in entries {
                            packs.insert(loc.pack, loc.pack_len);
                        }
                    }
                    Err(_) => unreadable_index.push(key.clone()),
                }
            }
        }
        let total = (objects.len() + packs.len()) as u64;
        let mut done = 0;
        for key in &objects {
            let verify: Verifier = if key == CONFIG_KEY {
                Box::new(json_ok::<StoreInfo>)
            } else if key.starts_with("keys/") {
                Box::new(json_ok::<WrappedKey>)
            } else if key.starts_with("ws/") {
                // Workspace metadata (crate::remote): sealed under one of its kinds, bound to
                // its name.
                let keys = self.keys.clone();
                let name = key.clone();
                Box::new(move |b: &[u8]| {
                    use crypto::ObjectKind as K;
                    [K::Journal, K::Head, K::Metadata, K::Snapshot, K::Lease, K::History, K::HotSet]
                        .iter()
                        .any(|&kind| keys.open(kind, name.as_bytes(), b).is_ok())
                })
            } else {
                let seg = segment_id(key);
                let keys = self.keys.clone();
                Box::new(move |b: &[u8]| seg.is_some_and(|s| block::open_index(&keys, &s, b).is_ok()))
            };
            let outcome = self.backend.scrub_object(key, scrub_limit(key), &*verify, repair).await;
            report.objects += 1;
            report.add(key, &outcome, repair);
            done += 1;
            progress(Progress { done, total });
        }
        for (pack, pack_len) in &packs {
            let verify = |b: &[u8]| block::open_pack(&self.keys, pack, b).is_ok();
            let key = block::pack_key(pack);
            let outcome = self.backend.scrub_pack(&key, *pack_len, &verify, repair).await;
            report.packs += 1;
            report.add(&key, &outcome, repair);
            done += 1;
            progress(Progress { done, total });
        }
        for key in unreadable_index {
            if !report.unrepaired.contains(&key) {
                report.unrepaired.push(key);
            }
        }
        Ok(report)
    }

    /// Retries copies that could not be written at the time (a backend was down).
    pub async fn run_repairs(&self) -> usize {
        self.backend.run_repairs().await
    }

    // ---- keys -------------------------------------------------------------------------

    async fn put_key(&self, wrapped: &WrappedKey) -> Result<()> {
        let body = serde_json::to_vec_pretty(wrapped).map_err(|e| StoreError::Config(e.to_string()))?;
        self.backend.put_object(&format!("keys/{}", wrapped.id), Bytes::from(body)).await?;
        Ok(())
    }

    /// Wraps this store's data key with one more passphrase or key file.
    pub async fn add_key(&self, secret: &Secret<'_>, kdf: KdfParams, label: &str) -> Result<WrappedKey> {
        let wrapped = crypto::wrap_key(&self.data_key, secret, kdf, label)?;
        self.put_key(&wrapped).await?;
        Ok(wrapped)
    }

    pub async fn list_keys(&self) -> Result<Vec<WrappedKey>> {
        list_keys(&self.backend).await
    }

    /// Removes one wrapped key; refuses to remove the last one (the store would be lost).
    pub async fn remove_key(&self, id: &str) -> Result<()> {
        let keys = self.list_keys().await?;
        if !keys.iter().any(|k| k.id == id) {
            return Err(StoreError::NoSuchKey(id.to_string()));
        }
        if keys.len() == 1 {
            return Err(StoreError::Key("refusing to remove the store's last key: nothing could open it".into()));
        }
        for b in self.backend.backends() {
            b.delete(&format!("keys/{id}")).await?;
        }
        Ok(())
    }
}

/// The format of a store config, parsed before the rest of it.
#[derive(Deserialize)]
struct ConfigVersion {
    format: u32,
}

async fn read_info(backend: &RedundantStore) -> Result<StoreInfo> {
    // A copy whose version parses is a good copy: a newer format is then reported as such.
    let bytes = match backend.get_object(CONFIG_KEY, WholeObject::Config.limit(), &json_ok::<ConfigVersion>).await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => {
            let names: Vec<_> = backend.backends().iter().map(|b| b.name().to_string()).collect();
            return Err(StoreError::NotInitialized(names.join(", ")));
        }
        Err(e) => return Err(e.into()),
    };
    StoreInfo::decode(&bytes)
}

impl StoreInfo {
    /// Decodes the store's `config` object (JSON, in clear), its format checked first so a
    /// newer one is reported as such, not as garbage.
    pub fn decode(bytes: &[u8]) -> Result<StoreInfo> {
        let undecodable =
            |e: serde_json::Error| StoreError::Undecodable { what: "the config object".into(), reason: e.to_string() };
        let v: ConfigVersion = serde_json::from_slice(bytes).map_err(undecodable)?;
        if v.format > STORE_FORMAT {
            return Err(StoreError::TooNew { found: v.format, supported: STORE_FORMAT });
        }
        serde_json::from_slice(bytes).map_err(undecodable)
    }
}

/// Decodes the wrapped key object stored at `key` (JSON, in clear); [`crypto::unwrap_key`]
/// checks its fields.
pub fn decode_wrapped_key(key: &str, bytes: &[u8]) -> Result<WrappedKey> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Undecodable { what: format!("wrapped key {key}"), reason: e.to_string() })
}

async fn list_keys(backend: &RedundantStore) -> Result<Vec<WrappedKey>> {
    let read = |key: String| async move {
        let bytes = backend.get_object(&key, WholeObject::WrappedKey.limit(), &json_ok::<WrappedKey>).await?;
        decode_wrapped_key(&key, &bytes)
    };
    // A few at once (a store has a key or two; a hostile one could list thousands).
    let listed = backend.list("keys/").await?;
    futures::stream::iter(listed.into_iter().map(|obj| read(obj.key))).buffered(8).try_collect().await
}

/// The bytes one GET reads for a run of blocks lying back to back in one pack: their
/// envelopes, or the whole pack when the run starts at the pack's start and ends within
/// [`WHOLE_PACK_SLACK`] of its end (what is left is the trailer and footer, a few hundred
/// bytes, or a small block). A server that answers a range by slicing the whole object, as moto
/// does, then copies nothing.
/// Block `id` at `loc` and the blocks around it in `blocks` (a pack's trailer, in pack order)
/// whose envelopes lie within `window / 2` bytes before its start or after its end, with no
/// more than [`MAX_RUN_GAP`] between two of them: what [`Store::get_block_near`] reads in one
/// request, in pack order. Both sides: files are packed in the order they were made, which is
/// seldom the order a reader takes (a sorted walk of a tree copied in directory order). Just
/// the block when it is not in the list (a stale trailer cannot widen a read past it).
fn neighbourhood(
    blocks: &[(BlockId, BlockLoc)],
    id: &BlockId,
    loc: &BlockLoc,
    window: u64,
) -> Vec<(BlockId, BlockLoc)> {
    let Ok(at) = blocks.binary_search_by_key(&loc.offset, |(_, l)| l.offset) else { return vec![(*id, *loc)] };
    if blocks[at].0 != *id || blocks[at].1 != *loc {
        return vec![(*id, *loc)];
    }
    let (from, to) = (loc.offset.saturating_sub(window / 2), loc.range().end.saturating_add(window / 2));
    let mut first = at;
    while first > 0 && {
        let (prev, next) = (&blocks[first - 1].1, &blocks[first].1);
        prev.offset >= from && prev.range().end <= next.offset && next.offset - prev.range().end <= MAX_RUN_GAP
    } {
        first -= 1;
    }
    let mut last = at;
    while last + 1 < blocks.len() && {
        let (prev, next) = (&blocks[last].1, &blocks[last + 1].1);
        next.range().end <= to && next.offset >= prev.range().end && next.offset - prev.range().end <= MAX_RUN_GAP
    } {
        last += 1;
    }
    blocks[first..=last].to_vec()
}

/// The runs [`Store::get_blocks`] reads `blocks` in, as ranges of their indices: blocks that
/// lie in one pack in order, with gaps `join` accepts, go in one run.
fn runs_of(blocks: &[(BlockId, BlockLoc)], join: RunJoin) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < blocks.len() {
        let mut j = i + 1;
        // Bytes of the run's blocks and of the gaps between them.
        let (mut wanted, mut gaps) = (u64::from(blocks[i].1.sealed_len), 0);
        while j < blocks.len() && blocks[j].1.pack == blocks[i].1.pack && {
            let end = blocks[j - 1].1.range().end;
            let gap = blocks[j].1.offset.saturating_sub(end);
            let joins = blocks[j].1.offset >= end && join.joins(wanted, gaps, gap, u64::from(blocks[j].1.sealed_len));
            if joins {
                wanted += u64::from(blocks[j].1.sealed_len);
                gaps += gap;
            }
            joins
        } {
            j += 1;
        }
        runs.push(i..j);
        i = j;
    }
    runs
}

fn run_range(run: &[(BlockId, BlockLoc)]) -> std::ops::Range<u64> {
    let (Some((_, first)), Some((_, last))) = (run.first(), run.last()) else { return 0..0 };
    let end = last.range().end;
    let tail = first.pack_len.checked_sub(end);
    if first.offset == 0 && tail.is_some_and(|t| t <= WHOLE_PACK_SLACK) { 0..first.pack_len } else { first.offset..end }
}

fn segment_id(key: &str) -> Option<crypto::Hash> {
    let hex_id = key.strip_prefix("index/")?;
    hex::decode(hex_id).ok()?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_store(dirs: &[&std::path::Path]) -> StoreConfig {
        StoreConfig::new(dirs.iter().map(|d| format!("file://{}", d.display())).collect())
    }

    #[tokio::test]
    async fn init_open_put_get_and_scrub_over_three_file_backends() {
        let t = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<_> = (0..3).map(|i| t.path().join(format!("b{i}"))).collect();
        let cfg = file_store(&dirs.iter().map(|p| p.as_path()).collect::<Vec<_>>());
        let secret = Secret::Passphrase(b"correct horse");
        let store = Store::init(&cfg, &secret, KdfParams::for_tests()).await.expect("init");
        assert!(matches!(
            Store::init(&cfg, &secret, KdfParams::for_tests()).await,
            Err(StoreError::AlreadyInitialized(_))
        ));
        let data: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1000 + usize::from(i)]).collect();
        let blocks: Vec<_> = data.iter().map(|d| (store.keys().block_id(d), d.as_slice())).collect();
        let locs = store.put_blocks(&blocks).await.expect("put");
        assert_eq!(locs.len(), 5);
        assert!(locs.iter().all(|(_, l)| l.pack == locs[0].1.pack), "one pack for all");
        drop(store);

        let wrong = Store::open(&cfg, &Secret::Passphrase(b"wrong")).await;
        assert!(matches!(wrong, Err(StoreError::Crypto(CryptoError::WrongKey))), "{:?}", wrong.err());
        let store = Store::open(&cfg, &secret).await.expect("open");
        let index = store.load_index().await.expect("index");
        assert_eq!(index.len(), 5);
        for ((id, loc), d) in locs.iter().zip(&data) {
            assert_eq!(&store.get_block(id, loc).await.expect("get"), d);
        }
        let report = store.scrub(false, &|_| {}).await.expect("scrub");
        assert_eq!(report.packs, 1);
        assert!(report.unrepaired.is_empty(), "{report:?}");
        assert_eq!(report.copies_bad + report.copies_missing, 0);
    }

    #[tokio::test]
    async fn runs_of_blocks_come_back_in_order_from_one_ranged_read() {
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = file_store(&[t.path()]);
        let store = Store::init(&cfg, &Secret::Passphrase(b"p"), KdfParams::for_tests()).await.expect("init");
        let data: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i + 1; 3000 + usize::from(i)]).collect();
        let blocks: Vec<_> = data.iter().map(|d| (store.keys().block_id(d), d.as_slice())).collect();
        let locs = store.put_blocks(&blocks).await.expect("put");
        let all = store.get_blocks(&locs, RunJoin::Tight).await.expect("get all");
        assert_eq!(all, data);
        // Not adjacent, out of order, repeated: still each block's own bytes.
        let pick = [locs[3], locs[0], locs[2], locs[3]];
        let got = store.get_blocks(&pick, RunJoin::Tight).await.expect("get some");
        assert_eq!(got, vec![data[3].clone(), data[0].clone(), data[2].clone(), data[3].clone()]);
        // Every other block: one read with gaps, each block still its own bytes.
        let every_other = [locs[0], locs[2], locs[4]];
        let got = store.get_blocks(&every_other, RunJoin::Tight).await.expect("get with gaps");
        assert_eq!(got, vec![data[0].clone(), data[2].clone(), data[4].clone()]);
    }

    #[tokio::test]
    async fn a_miss_brings_the_blocks_around_it_once_the_packs_trailer_is_known() {
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = file_store(&[t.path()]);
        let store = Store::init(&cfg, &Secret::Passphrase(b"p"), KdfParams::for_tests()).await.expect("init");
        // 2 000 small blocks: a trailer of 96 000 bytes, past the first read of the pack's end.
        let data: Vec<Vec<u8>> = (0..2000u32).map(|i| i.to_le_bytes().repeat(100)).collect();
        let blocks: Vec<_> = data.iter().map(|d| (store.keys().block_id(d), d.as_slice())).collect();
        let locs = store.put_blocks(&blocks).await.expect("put");
        let listed = store.pack_blocks(&locs[0].1.pack, locs[0].1.pack_len).await.expect("trailer");
        assert_eq!(listed, locs, "the trailer lists every block, in pack order");

        let store = Store::open(&cfg, &Secret::Passphrase(b"p")).await.expect("open");
        let (id, loc) = locs[10];
        // The first miss in a pack reads its trailer beside the block: no neighbours yet.
        let (got, near) = store.get_block_near(&id, &loc, 4096).await.expect("first miss");
        assert_eq!(got, data[10]);
        assert!(near.is_empty());
        // Then the blocks around it within half the window on either side, each verified, in
        // pack order.
        let (id, loc) = locs[11];
        let (got, near) = store.get_block_near(&id, &loc, 4096).await.expect("second miss");
        assert_eq!(got, data[11]);
        let side = (2048 / u64::from(loc.sealed_len)) as usize;
        let want: Vec<usize> = (11 - side..11).chain(12..12 + side).collect();
        assert_eq!(near.len(), want.len(), "the window holds {side} blocks on either side");
        for ((nid, ndata), k) in near.iter().zip(want) {
            assert_eq!((nid, ndata.as_ref()), (&locs[k].0, data[k].as_slice()));
        }
        // The last block of the pack: only blocks before it.
        let (id, loc) = locs[1999];
        let (got, near) = store.get_block_near(&id, &loc, 8192).await.expect("last block");
        assert_eq!(got.as_ref(), data[1999].as_slice());
        assert_eq!(near.last().map(|(b, _)| *b), Some(locs[1998].0));
        assert!(near.iter().all(|(b, _)| locs[1990..1999].iter().any(|(l, _)| l == b)));
        // A location the trailer does not list (a stale one) reads that block alone.
        let (id, mut loc) = locs[5];
        loc.pack_len += 1;
        assert!(neighbourhood(&listed, &id, &loc, 1 << 20).len() == 1);
    }

    #[test]
    fn a_loose_run_reads_at_most_twice_its_blocks_in_one_request_where_a_tight_one_splits() {
        // Blocks of 60 000 bytes every 100 000 (a pack whose files are wanted three in five).
        let block = |pack: u8, offset: u64, len: u32| {
            ([0; 32], BlockLoc { pack: [pack; 32], offset, sealed_len: len, plain_len: len - 44, pack_len: 1 << 24 })
        };
        let every: Vec<_> = (0..30).map(|i| block(1, i * 100_000, 60_000)).collect();
        assert_eq!(runs_of(&every, RunJoin::Tight).len(), 30, "a 40 000-byte gap is more than a fifth");
        assert_eq!(runs_of(&every, RunJoin::Loose), vec![0..30]);
        // Wanted two in five: a run stops before its gaps pass its blocks' bytes.
        let sparse: Vec<_> = (0..30).map(|i| block(1, i * 100_000, 40_000)).collect();
        let runs = runs_of(&sparse, RunJoin::Loose);
        assert_eq!(runs.len(), 10, "{runs:?}");
        for r in runs {
            let (span, wanted) = (run_range(&sparse[r.clone()]), 40_000 * r.len() as u64);
            assert!(span.end - span.start <= 2 * wanted, "{r:?} reads {span:?} for {wanted} bytes");
        }
        // Gaps past a run's bytes start a new run, so do another pack and a block out of order.
        let far =
            [(0, 1), (50_000, 1), (5_000_000, 1), (5_100_000, 2), (0, 2)].map(|(at, pack)| block(pack, at, 40_000));
        assert_eq!(runs_of(&far, RunJoin::Loose), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(runs_of(&[], RunJoin::Loose), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    fn a_run_reaching_the_trailer_reads_the_whole_pack() {
        let mib = 1u64 << 20;
        let loc = |offset: u64, pack_len: u64| BlockLoc {
            pack: [7; 32],
            offset,
            sealed_len: (4 * mib) as u32,
            plain_len: (4 * mib - 44) as u32,
            pack_len,
        };
        let run =
            |offsets: &[u64], pack_len: u64| offsets.iter().map(|&o| ([0; 32], loc(o, pack_len))).collect::<Vec<_>>();
        // Four blocks and a 300-byte trailer: the whole pack.
        let full = 16 * mib + 300;
        assert_eq!(run_range(&run(&[0, 4 * mib, 8 * mib, 12 * mib], full)), 0..full);
        // Not from the start, or a block's worth short of the end: just the blocks.
        assert_eq!(run_range(&run(&[4 * mib, 8 * mib, 12 * mib], full)), 4 * mib..full - 300);
        assert_eq!(run_range(&run(&[0, 4 * mib, 8 * mib], full)), 0..12 * mib);
        // An index entry past its pack's end is not made into a longer read.
        assert_eq!(run_range(&run(&[0, 4 * mib], 6 * mib)), 0..8 * mib);
        assert_eq!(run_range(&[]), 0..0);
    }

    #[tokio::test]
    async fn the_store_file_must_match_the_store() {
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = file_store(&[t.path()]);
        Store::init(&cfg, &Secret::Passphrase(b"p"), KdfParams::for_tests()).await.expect("init");
        let mut other = cfg.clone();
        other.store_id = "someone-else".into();
        assert!(matches!(Store::open(&other, &Secret::Passphrase(b"p")).await, Err(StoreError::WrongStore { .. })));
        let empty = tempfile::tempdir().expect("tempdir");
        let none = file_store(&[empty.path()]);
        let err = Store::open(&none, &Secret::Passphrase(b"p")).await.err().expect("no store");
        assert!(err.to_string().contains("no tierfs store at"), "{err}");
    }
}
