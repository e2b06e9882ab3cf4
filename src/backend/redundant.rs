//! [`RedundantStore`]: the redundancy contract of DESIGN.md §4.3 over several [`Backend`]s.
//!
//! - Small objects (config, keys, index segments, heads, journal) are replicated: `Replicas(n)`
//!   keeps `n` copies, `Erasure { data: k, parity: m }` keeps `max(m + 1, min(3, k + m))`
//!   (at least the backend losses the packs survive, and three where possible so a majority
//!   quorum survives losing one backend). Packs are replicated the same way under `Replicas`, and
//!   Reed-Solomon coded under `Erasure` (layout in `erasure.rs`).
//! - Placement is a pure function of the key and the number of backends `B`: starting at
//!   `u64::from_le_bytes(blake3(key)[0..8]) % B`, consecutive backends (copy or shard `i` on
//!   `(start + i) % B`). Nothing has to be looked up to read, and load spreads evenly.
//! - Writes go out in parallel and are acknowledged at a quorum (a majority of the copies;
//!   `k + m - 1` shards, at least `k`, so losing one backend never stops writes). Copies that failed are queued for repair with their bytes
//!   (bounded, see `repair.rs`). Once the quorum is in, stragglers get a grace period (the time
//!   the quorum took, at least `straggler_grace`); writes still running then are queued as
//!   repairs and left to finish in the background, so one slow backend does not slow every write.
//! - Every read is verified: by the caller's `verify` for whole objects and ranges, and by each
//!   shard's blake3 trailer for whole shards. A missing or bad copy found on the way is rewritten
//!   from good data at once (read repair), falling back to the repair queue.
//! - "Not found" is only reported when every backend that should hold the object said so; if
//!   some could not be asked, the answer is `Unavailable`, never a false "missing".
//! - Conditional create (`create_object`, for fenced append-only chains such as `…/j/<seq>`):
//!   If-None-Match on every copy, and the key is ours only when a majority of the copies took
//!   our bytes. Two majorities share a backend, and a backend's create is atomic, so two writers
//!   can never both win; the winner overwrites a loser's minority copies and queues the
//!   unreachable ones for repair, a loser changes nothing. This rests on every backend honouring
//!   If-None-Match, which `check_conditional_create` probes (Garage 2.x, for one, ignores it).
//!
//! Read repair assumes the bytes under a key do not change, or that the caller's `verify`
//! rejects stale versions (mutable objects such as heads carry their own version).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{BoxFuture, join_all};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};

use super::erasure::{Codec, TRAILER_LEN, open_shard, shard_key, split_shard_key};
use super::error::BackendError;
use super::repair::{DEFAULT_REPAIR_MEMORY, RepairQueue, RepairSource, RepairTask, SavedRepair, SavedSource};
use super::single::{Backend, BackendHealth, ObjectInfo, validate_key};

/// How a store spreads its data over its backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Redundancy {
    /// `n` full copies on `n` different backends.
    Replicas(u8),
    /// Packs: Reed-Solomon, `data + parity` shards on as many backends, any `data` rebuild it.
    /// Small objects: `parity + 1` copies.
    Erasure { data: u8, parity: u8 },
}

impl Redundancy {
    /// Copies kept of a small object.
    pub fn object_copies(&self) -> usize {
        match *self {
            Redundancy::Replicas(n) => n as usize,
            // At least three copies where there are three backends, so a majority write
            // quorum still tolerates losing one backend (DESIGN.md §4.3).
            Redundancy::Erasure { data, parity } => (parity as usize + 1).max((data as usize + parity as usize).min(3)),
        }
    }

    /// How many backends can be lost without losing data.
    pub fn fault_tolerance(&self) -> usize {
        match *self {
            Redundancy::Replicas(n) => (n as usize).saturating_sub(1),
            Redundancy::Erasure { parity, .. } => parity as usize,
        }
    }

    /// Checks the policy against the number of backends, with a message saying what to change.
    pub fn validate(&self, backends: usize) -> Result<(), BackendError> {
        let bad = |m: String| Err(BackendError::BadConfig(m));
        match *self {
            Redundancy::Replicas(0) => bad("replicas must be at least 1".into()),
            Redundancy::Replicas(n) if n as usize > backends => bad(format!(
                "replicas = {n} needs {n} different backends, but {backends} {} configured",
                if backends == 1 { "is" } else { "are" }
            )),
            Redundancy::Erasure { data: 0, .. } => bad("erasure coding needs data >= 1".into()),
            Redundancy::Erasure { data, parity } if data as usize + parity as usize > 255 => {
                bad(format!("erasure {data}+{parity} has more than 255 shards"))
            }
            Redundancy::Erasure { data, parity } if data as usize + parity as usize > backends => bad(format!(
                "erasure {data}+{parity} stores {} shards on different backends, but {backends} {} configured",
                data as usize + parity as usize,
                if backends == 1 { "is" } else { "are" }
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::Replicas(n) => write!(f, "{n} replicas"),
            Redundancy::Erasure { data, parity } => write!(f, "erasure {data}+{parity}"),
        }
    }
}

/// What a redundant write achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutReport {
    /// Copies or shards acknowledged by their backend.
    pub stored: usize,
    /// Copies or shards the policy wants.
    pub wanted: usize,
    /// Copies or shards left to the repair queue.
    pub queued_repairs: usize,
}

/// What a conditional create ([`RedundantStore::create_object`]) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    /// A majority of the copies hold our bytes (created now, or by an earlier attempt of ours
    /// with the same bytes): the key is ours.
    Created,
    /// Another writer's object holds the key on so many copies that ours can never reach a
    /// majority: the key is taken, and nothing was changed.
    Exists,
}

/// The caller's check of bytes read back (AEAD tag, content hash).
pub type Verify<'a> = &'a (dyn Fn(&[u8]) -> bool + Send + Sync);

/// The caller's check of a pack range read back that takes the bytes over: `Some` with what
/// it made of them (say, the plaintext, decrypted where the bytes lie), `None` if they fail.
/// A failed copy's bytes are never used again, so the callback may leave them as it likes.
pub type Open<'a, T> = &'a (dyn Fn(Bytes) -> Option<T> + Send + Sync);

/// What a scrub of one object or pack found (counted per copy, or per shard).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScrubOutcome {
    pub copies_ok: usize,
    pub copies_bad: usize,
    pub copies_missing: usize,
    /// Copies or shards whose backend could not be asked (state unknown; scrub again later).
    pub copies_unreachable: usize,
    pub repaired: usize,
    /// No good data could be found to repair from (or the rebuilt data fails `verify`).
    pub unrepairable: bool,
}

impl ScrubOutcome {
    /// Every copy was checked and is good.
    pub fn is_healthy(&self) -> bool {
        self.copies_bad == 0 && self.copies_missing == 0 && self.copies_unreachable == 0 && !self.unrepairable
    }
}

/// Objects bigger than this are erasure coded and hashed on a blocking thread.
const BLOCKING_THRESHOLD: usize = 1 << 20;
/// Repairs run concurrently by `run_repairs`.
const REPAIR_CONCURRENCY: usize = 8;
/// Default minimum wait for straggling writes after the quorum is in.
const DEFAULT_STRAGGLER_GRACE: Duration = Duration::from_secs(1);

/// Several backends under one redundancy policy. `Send + Sync`.
pub struct RedundantStore {
    backends: Vec<Arc<Backend>>,
    redundancy: Redundancy,
    /// Present under `Erasure`.
    codec: Option<Arc<Codec>>,
    repairs: Arc<RepairQueue>,
    straggler_grace: Duration,
}

/// One copy or shard read back.
enum CopyState {
    Good(Bytes),
    Bad(String),
    Missing,
    Unreachable(String),
}

/// One write of a copy or shard.
struct Write {
    backend: usize,
    key: String,
    data: Bytes,
    fallback: RepairSource,
}

type WriteFuture = BoxFuture<'static, (usize, Result<(), BackendError>)>;

/// How a failed write is described in a `QuorumFailed` list.
fn describe(backend: &Backend, err: &BackendError) -> String {
    let msg = err.to_string();
    if msg.contains(backend.name()) { msg } else { format!("{}: {msg}", backend.name()) }
}

/// Runs `f` on a blocking thread when the input is big, inline otherwise.
async fn maybe_blocking<T, F>(big: bool, f: F) -> Result<T, BackendError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if big {
        tokio::task::spawn_blocking(f).await.map_err(|e| BackendError::Internal(format!("blocking task failed: {e}")))
    } else {
        Ok(f())
    }
}

impl RedundantStore {
    /// Validates: `Replicas(n)` needs `1 <= n <= backends`; `Erasure` needs `data >= 1` and
    /// `data + parity <= backends` (and `<= 255`). Backends must have distinct names: two
    /// copies on one backend are not redundancy.
    pub fn new(backends: Vec<Backend>, redundancy: Redundancy) -> Result<RedundantStore, BackendError> {
        if backends.is_empty() {
            return Err(BackendError::BadConfig("no backends configured".into()));
        }
        redundancy.validate(backends.len())?;
        let mut seen = std::collections::HashSet::new();
        for b in &backends {
            if !seen.insert(b.name().to_string()) {
                return Err(BackendError::BadConfig(format!(
                    "backend {} is listed twice; copies on the same backend give no redundancy",
                    b.name()
                )));
            }
        }
        let codec = match redundancy {
            Redundancy::Erasure { data, parity } => Some(Arc::new(Codec::new(data as usize, parity as usize)?)),
            Redundancy::Replicas(_) => None,
        };
        Ok(RedundantStore {
            backends: backends.into_iter().map(Arc::new).collect(),
            redundancy,
            codec,
            repairs: Arc::new(RepairQueue::new(DEFAULT_REPAIR_MEMORY)),
            straggler_grace: DEFAULT_STRAGGLER_GRACE,
        })
    }

    /// Minimum time to wait for the remaining writes once the quorum is in (default 1 s).
    pub fn with_straggler_grace(mut self, grace: Duration) -> RedundantStore {
        self.straggler_grace = grace;
        self
    }

    /// Bytes the repair queue may hold (default 256 MiB); past it, repairs re-read good copies.
    pub fn with_repair_memory_limit(self, bytes: usize) -> RedundantStore {
        self.repairs.set_limit(bytes);
        self
    }

    pub fn redundancy(&self) -> Redundancy {
        self.redundancy
    }

    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.backends
    }

    pub fn health(&self) -> Vec<BackendHealth> {
        self.backends.iter().map(|b| b.health()).collect()
    }

    pub fn pending_repairs(&self) -> usize {
        self.repairs.len()
    }

    /// The queued repairs in the form a later run can queue again ([`Self::restore_repairs`]),
    /// sorted. A repair that holds its bytes is saved as a copy from any other backend.
    pub fn saved_repairs(&self) -> Vec<SavedRepair> {
        let name = |b: usize| self.backends[b].name().to_string();
        let mut saved: Vec<SavedRepair> = self
            .repairs
            .tasks()
            .into_iter()
            .map(|t| {
                let from = match t.source {
                    RepairSource::Data(_) => {
                        SavedSource::Copies((0..self.backends.len()).filter(|&b| b != t.backend).map(name).collect())
                    }
                    RepairSource::CopyFrom(sources) => SavedSource::Copies(sources.into_iter().map(name).collect()),
                    RepairSource::RebuildShard { pack_key, index } => SavedSource::Shard { pack_key, index },
                };
                SavedRepair { backend: name(t.backend), key: t.key, from }
            })
            .collect();
        saved.sort();
        saved
    }

    /// Queues repairs an earlier run saved; those for a backend this store no longer has (or
    /// with an invalid key) are skipped. Returns how many were queued.
    pub fn restore_repairs(&self, saved: &[SavedRepair]) -> usize {
        let index = |name: &str| self.backends.iter().position(|b| b.name() == name);
        let mut queued = 0;
        for r in saved {
            let Some(b) = index(&r.backend) else { continue };
            if validate_key(&r.key).is_err() {
                continue;
            }
            let source = match &r.from {
                SavedSource::Copies(names) => {
                    RepairSource::CopyFrom(names.iter().filter_map(|n| index(n)).filter(|&s| s != b).collect())
                }
                SavedSource::Shard { pack_key, index } => {
                    RepairSource::RebuildShard { pack_key: pack_key.clone(), index: *index }
                }
            };
            self.repairs.enqueue_source(b, &r.key, source);
            queued += 1;
        }
        queued
    }

    // ----- placement -----

    fn start(&self, key: &str) -> usize {
        let hash = blake3::hash(key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash.as_bytes()[..8]);
        (u64::from_le_bytes(first) % self.backends.len() as u64) as usize
    }

    /// The backends holding the copies of a small object, in placement order.
    fn object_placement(&self, key: &str) -> Vec<usize> {
        let start = self.start(key);
        let n = self.backends.len();
        (0..self.redundancy.object_copies().min(n)).map(|i| (start + i) % n).collect()
    }

    /// Backend of shard `index` of a pack.
    fn shard_backend(&self, key: &str, index: usize) -> usize {
        (self.start(key) + index) % self.backends.len()
    }

    /// Placement order with backends whose breaker is open moved last.
    fn read_order(&self, placement: &[usize]) -> Vec<usize> {
        let (mut up, down): (Vec<usize>, Vec<usize>) =
            placement.iter().copied().partition(|&b| self.backends[b].is_available());
        up.extend(down);
        up
    }

    // ----- writes -----

    /// Small objects: replicated, acknowledged at a majority of the copies.
    pub async fn put_object(&self, key: &str, data: Bytes) -> Result<PutReport, BackendError> {
        validate_key(key)?;
        let placement = self.object_placement(key);
        let needed = placement.len() / 2 + 1;
        let writes = placement
            .iter()
            .map(|&b| Write {
                backend: b,
                key: key.to_string(),
                data: data.clone(),
                fallback: RepairSource::CopyFrom(placement.iter().copied().filter(|&o| o != b).collect()),
            })
            .collect();
        self.write_quorum(key, writes, needed).await
    }

    /// Packs: like `put_object` under `Replicas`; Reed-Solomon shards under `Erasure`,
    /// acknowledged at `k + m - 1` shards (at least `k`).
    pub async fn put_pack(&self, key: &str, data: Bytes) -> Result<PutReport, BackendError> {
        validate_key(key)?;
        let Some(codec) = self.codec.clone() else {
            return self.put_object(key, data).await;
        };
        let big = data.len() >= BLOCKING_THRESHOLD;
        let shards = maybe_blocking(big, move || codec.encode(&data)).await??;
        let k = self.codec.as_ref().map_or(1, |c| c.data_shards());
        // k + m - 1: a write survives losing any one backend (DESIGN.md §4.3: losing one never
        // stops writes); the missing shard is queued for repair.
        let needed = (shards.len().saturating_sub(1)).max(k);
        let writes = shards
            .into_iter()
            .enumerate()
            .map(|(i, shard)| Write {
                backend: self.shard_backend(key, i),
                key: shard_key(key, i),
                data: shard,
                fallback: RepairSource::RebuildShard { pack_key: key.to_string(), index: i },
            })
            .collect();
        self.write_quorum(key, writes, needed).await
    }

    async fn write_quorum(&self, key: &str, writes: Vec<Write>, needed: usize) -> Result<PutReport, BackendError> {
        let wanted = writes.len();
        let mut pending: FuturesUnordered<WriteFuture> = writes
            .iter()
            .enumerate()
            .map(|(slot, w)| {
                let (backend, key, data) = (self.backends[w.backend].clone(), w.key.clone(), w.data.clone());
                let fut: WriteFuture = Box::pin(async move { (slot, backend.put(&key, data).await) });
                fut
            })
            .collect();
        let started = Instant::now();
        let mut results: Vec<Option<Result<(), BackendError>>> = (0..wanted).map(|_| None).collect();
        let (mut acks, mut failures) = (0, 0);
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let next = match deadline {
                None => pending.next().await,
                Some(at) => tokio::time::timeout_at(at, pending.next()).await.unwrap_or_default(),
            };
            let Some((slot, result)) = next else { break };
            if result.is_ok() {
                acks += 1;
            } else {
                failures += 1;
            }
            results[slot] = Some(result);
            if acks >= needed && deadline.is_none() {
                let grace = started.elapsed().max(self.straggler_grace);
                deadline = Some(tokio::time::Instant::now() + grace);
            }
            if wanted - failures < needed {
                break;
            }
        }

        if acks < needed {
            let errors = writes
                .iter()
                .zip(&results)
                .filter_map(|(w, r)| {
                    let backend = &self.backends[w.backend];
                    match r {
                        Some(Ok(())) => None,
                        Some(Err(e)) => Some(describe(backend, e)),
                        None => Some(format!("{}: abandoned, the quorum was already out of reach", backend.name())),
                    }
                })
                .collect();
            return Err(BackendError::QuorumFailed { key: key.to_string(), stored: acks, needed, errors });
        }

        let mut queued = 0;
        let mut stragglers = HashMap::new();
        for (slot, (w, r)) in writes.iter().zip(&results).enumerate() {
            match r {
                Some(Ok(())) => self.repairs.forget(w.backend, &w.key),
                Some(Err(e)) => {
                    tracing::warn!(key = %w.key, backend = %self.backends[w.backend].name(), error = %e,
                        "copy not written; queued for repair");
                    self.repairs.enqueue(w.backend, &w.key, w.data.clone(), w.fallback.clone());
                    queued += 1;
                }
                None => {
                    let generation = self.repairs.enqueue(w.backend, &w.key, w.data.clone(), w.fallback.clone());
                    stragglers.insert(slot, (w.backend, w.key.clone(), generation));
                    queued += 1;
                }
            }
        }
        if !stragglers.is_empty() {
            self.finish_in_background(pending, stragglers);
        }
        Ok(PutReport { stored: acks, wanted, queued_repairs: queued })
    }

    /// Lets straggling writes finish on their own; each completes its repair entry on success.
    fn finish_in_background(
        &self,
        mut pending: FuturesUnordered<WriteFuture>,
        stragglers: HashMap<usize, (usize, String, u64)>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime to finish them on; the repair queue has them.
        };
        let repairs = self.repairs.clone();
        runtime.spawn(async move {
            while let Some((slot, result)) = pending.next().await {
                if let (Ok(()), Some((backend, key, generation))) = (result, stragglers.get(&slot)) {
                    repairs.complete(*backend, key, *generation);
                }
            }
        });
    }

    /// Rewrites `data` at `key` on `targets` now; failures go to the repair queue. Returns how
    /// many were rewritten.
    async fn rewrite(&self, key: &str, data: &Bytes, targets: &[usize], fallback: RepairSource) -> usize {
        let results =
            join_all(targets.iter().map(|&b| async move { (b, self.backends[b].put(key, data.clone()).await) })).await;
        let mut done = 0;
        for (b, result) in results {
            match result {
                Ok(()) => {
                    tracing::info!(key, backend = %self.backends[b].name(), "repaired copy");
                    self.repairs.forget(b, key);
                    done += 1;
                }
                Err(e) => {
                    tracing::warn!(key, backend = %self.backends[b].name(), error = %e, "repair failed; queued");
                    self.repairs.enqueue(b, key, data.clone(), fallback.clone());
                }
            }
        }
        done
    }

    // ----- conditional create -----

    /// Creates a small object only if it is absent (If-None-Match: *), decided by majority: the
    /// building block of fenced, append-only chains (journal entries `…/j/<seq>`) where two
    /// writers must never both own a key.
    ///
    /// One conditional create per copy of the object's placement (that of [`Self::put_object`]),
    /// in parallel, every answer awaited. [`CreateOutcome::Created`] when a majority of the
    /// copies took our bytes (or already held exactly them, so retrying with the same bytes is
    /// safe); a competitor's minority copies are then overwritten with ours and copies that could
    /// not be written are queued for repair. [`CreateOutcome::Exists`] when other objects hold so
    /// many copies that ours cannot reach a majority; nothing is overwritten or queued (a copy of
    /// ours made on the way is the winner's to overwrite). Otherwise too many backends could not
    /// be asked to tell: [`BackendError::QuorumFailed`], retry with the same bytes.
    ///
    /// Writers must create different bytes (e.g. carry a writer id): identical bytes from two
    /// writers both count as `Created`. [`Self::get_object`] serves the first copy that passes
    /// `verify`, which can be a loser's minority copy until the winner's overwrite lands.
    pub async fn create_object(&self, key: &str, data: Bytes) -> Result<CreateOutcome, BackendError> {
        validate_key(key)?;
        let placement = self.object_placement(key);
        let needed = placement.len() / 2 + 1;
        let answers = join_all(placement.iter().map(|&b| self.backends[b].put_if_absent(key, data.clone()))).await;
        let holding = |created: bool| -> Vec<usize> {
            placement
                .iter()
                .zip(&answers)
                .filter(|(_, a)| matches!(a, Ok(c) if *c == created))
                .map(|(&b, _)| b)
                .collect()
        };
        let (ours, theirs) = (holding(true), holding(false));

        if ours.len() >= needed {
            let fallback = RepairSource::CopyFrom(ours.clone());
            for (&b, answer) in placement.iter().zip(&answers) {
                match answer {
                    Ok(true) => self.repairs.forget(b, key),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(key, backend = %self.backends[b].name(), error = %e,
                            "copy not created; queued for repair");
                        self.repairs.enqueue(b, key, data.clone(), fallback.clone());
                    }
                }
            }
            if !theirs.is_empty() {
                // The majority decided: a competitor's minority copy is stale, and left in place
                // it could be served to readers.
                tracing::info!(key, copies = theirs.len(), "overwriting a competing writer's minority copies");
                self.rewrite(key, &data, &theirs, fallback).await;
            }
            return Ok(CreateOutcome::Created);
        }
        if !theirs.is_empty() && placement.len() - theirs.len() < needed {
            tracing::debug!(key, ours = ours.len(), theirs = theirs.len(), "conditional create lost");
            return Ok(CreateOutcome::Exists);
        }
        let errors = placement
            .iter()
            .zip(&answers)
            .filter_map(|(&b, answer)| {
                let backend = &self.backends[b];
                match answer {
                    Ok(true) => None,
                    Ok(false) => Some(format!("{}: another writer's object is there", backend.name())),
                    Err(e) => Some(describe(backend, e)),
                }
            })
            .collect();
        Err(BackendError::QuorumFailed { key: key.to_string(), stored: ours.len(), needed, errors })
    }

    /// Checks that the backends honour conditional creates, which [`Self::create_object`] (and
    /// so the fencing of writers) relies on: on each backend, creates a probe object
    /// `probe/cc-<random hex>` twice with different bytes, expects the second create to be
    /// refused, and deletes the probe (best effort). A backend that lets the second create
    /// through ignores If-None-Match: [`BackendError::NotSupported`] naming it. Unreachable
    /// backends are skipped (check again once they are back), but at least one backend must
    /// have been probed; other errors (access denied, …) are returned as they are.
    pub async fn check_conditional_create(&self) -> Result<(), BackendError> {
        let key = format!("probe/cc-{}", hex::encode(rand::random::<[u8; 8]>()));
        let probes = join_all(self.backends.iter().map(|b| probe_conditional_create(b, &key))).await;
        let mut unreachable = Vec::new();
        for (b, probe) in self.backends.iter().zip(probes) {
            match probe {
                Ok(()) => {}
                Err(e) if e.is_transient() => {
                    tracing::warn!(backend = %b.name(), error = %e, "conditional create not checked: unreachable");
                    unreachable.push((b, e));
                }
                Err(e) => return Err(e),
            }
        }
        if unreachable.len() < self.backends.len() {
            return Ok(());
        }
        if unreachable.len() == 1 {
            if let Some((_, e)) = unreachable.pop() {
                return Err(e);
            }
        }
        Err(BackendError::Unavailable {
            backend: unreachable.iter().map(|(b, _)| b.name()).collect::<Vec<_>>().join(", "),
            reason: format!(
                "no backend could be checked for conditional create ({})",
                unreachable.iter().map(|(b, e)| describe(b, e)).collect::<Vec<_>>().join("; ")
            ),
        })
    }

    // ----- replicated reads -----

    /// Reads a copy from the first backend (placement order, healthy ones first) whose bytes
    /// pass `verify`; missing or bad copies seen before it are repaired from it.
    pub async fn get_object(&self, key: &str, verify: Verify<'_>) -> Result<Bytes, BackendError> {
        validate_key(key)?;
        self.get_replicated(key, None, verify).await
    }

    async fn get_replicated(
        &self,
        key: &str,
        expected_len: Option<u64>,
        verify: Verify<'_>,
    ) -> Result<Bytes, BackendError> {
        let placement = self.object_placement(key);
        let mut damaged = Vec::new();
        let mut bad = Vec::new();
        let mut unreachable = Vec::new();
        // Placement first; then the other backends, in case the backend list changed (a copy
        // found there is put back where it belongs).
        let others: Vec<usize> = (0..self.backends.len()).filter(|b| !placement.contains(b)).collect();
        for (pass, order) in [self.read_order(&placement), others].into_iter().enumerate() {
            for b in order {
                match self.read_copy(b, key, expected_len, verify).await {
                    CopyState::Good(bytes) => {
                        if !damaged.is_empty() {
                            self.rewrite(key, &bytes, &damaged, RepairSource::CopyFrom(vec![b])).await;
                        }
                        return Ok(bytes);
                    }
                    CopyState::Bad(reason) => {
                        bad.push(format!("{}: {reason}", self.backends[b].name()));
                        if pass == 0 {
                            damaged.push(b);
                        }
                    }
                    CopyState::Missing => {
                        if pass == 0 {
                            damaged.push(b);
                        }
                    }
                    CopyState::Unreachable(e) => unreachable.push((b, e)),
                }
            }
        }
        // A copy that could not be asked may be good: that is "try again", never "lost".
        let placement_unreachable: Vec<(usize, String)> =
            unreachable.iter().filter(|(b, _)| placement.contains(b)).cloned().collect();
        if !placement_unreachable.is_empty() {
            let mut reason =
                format!("no copy of {key} could be read and verified ({}", join_errors(&placement_unreachable));
            if !bad.is_empty() {
                reason.push_str(&format!("; {}", bad.join("; ")));
            }
            reason.push(')');
            return Err(BackendError::Unavailable {
                backend: placement_unreachable
                    .iter()
                    .map(|(b, _)| self.backends[*b].name())
                    .collect::<Vec<_>>()
                    .join(", "),
                reason,
            });
        }
        if !bad.is_empty() {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("no copy passed verification ({})", bad.join("; ")),
            });
        }
        Err(BackendError::NotFound { key: key.to_string() })
    }

    /// Reads and checks one whole copy.
    async fn read_copy(&self, b: usize, key: &str, expected_len: Option<u64>, verify: Verify<'_>) -> CopyState {
        match self.backends[b].get(key).await {
            Ok(bytes) => match expected_len {
                Some(len) if bytes.len() as u64 != len => {
                    CopyState::Bad(format!("{} bytes, the index says {len}", bytes.len()))
                }
                _ if verify(&bytes) => CopyState::Good(bytes),
                _ => CopyState::Bad("failed verification".into()),
            },
            Err(e) if e.is_not_found() => CopyState::Missing,
            Err(BackendError::Corrupt { reason, .. }) => CopyState::Bad(reason),
            Err(e) => CopyState::Unreachable(e.to_string()),
        }
    }

    // ----- packs -----

    /// Reads `range` of a pack of `pack_len` bytes (the length this layer stored) and returns
    /// what `open` makes of it.
    ///
    /// `open` gets each candidate's bytes by value, so it can decrypt them where they lie (a
    /// body read from one GET is held by nothing else). Replicas: a range GET from the first
    /// available replica whose bytes pass `open`; earlier
    /// bad or missing replicas are rewritten from a whole copy of the good one. Erasure: range
    /// GETs of the data shard(s) holding the range; if one fails or `open` rejects the result,
    /// whole shards are fetched, checked by their trailers, the pack rebuilt from any `k` good
    /// ones, the range served and the bad or missing shards rewritten.
    pub async fn get_pack_range<T>(
        &self,
        key: &str,
        pack_len: u64,
        range: Range<u64>,
        open: Open<'_, T>,
    ) -> Result<T, BackendError> {
        validate_key(key)?;
        if range.start > range.end || range.end > pack_len {
            return Err(BackendError::BadRange { key: key.to_string(), range, len: pack_len });
        }
        if range.is_empty() {
            return open(Bytes::new()).ok_or_else(|| BackendError::Corrupt {
                key: key.to_string(),
                reason: "an empty range failed verification".into(),
            });
        }
        let Some(codec) = self.codec.clone() else {
            return self.get_replicated_range(key, pack_len, range, open).await;
        };

        // Fast path: only the data shards holding the range, no decoding.
        let pieces = codec.locate(pack_len, range.clone())?;
        let reads = join_all(pieces.iter().map(|(i, r)| {
            let b = self.shard_backend(key, *i);
            let shard = shard_key(key, *i);
            async move { self.backends[b].get_range(&shard, r.clone()).await }
        }))
        .await;
        let mut fast_error = None;
        if reads.iter().all(Result::is_ok) {
            let parts: Vec<Bytes> = reads.into_iter().flatten().collect();
            let bytes = if parts.len() == 1 {
                parts.into_iter().next().unwrap_or_default()
            } else {
                Bytes::from(parts.concat())
            };
            if let Some(opened) = open(bytes) {
                return Ok(opened);
            }
            fast_error = Some("range failed verification".to_string());
        } else if let Some(Err(e)) = reads.into_iter().find(Result::is_err) {
            fast_error = Some(e.to_string());
        }
        tracing::info!(key, error = fast_error.as_deref().unwrap_or(""), "degraded pack read; rebuilding from shards");

        // Degraded path: all shards at once (latency over bandwidth: this is a user's read).
        let (pack, copies) = self.read_erasure(key, pack_len, true).await?;
        let start = usize::try_from(range.start).map_err(|_| BackendError::Internal("range too large".into()))?;
        let end = usize::try_from(range.end).map_err(|_| BackendError::Internal("range too large".into()))?;
        let Some(opened) = open(Bytes::copy_from_slice(&pack[start..end])) else {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: "the range rebuilt from shards with valid hashes fails verification; the pack was stored \
                         damaged"
                    .into(),
            });
        };
        self.repair_shards(key, pack, &copies).await;
        Ok(opened)
    }

    /// The whole pack (used by scrub and repacking); `verify` is called on the whole pack.
    pub async fn get_pack(&self, key: &str, pack_len: u64, verify: Verify<'_>) -> Result<Bytes, BackendError> {
        validate_key(key)?;
        if self.codec.is_none() {
            return self.get_replicated(key, Some(pack_len), verify).await;
        }
        let (pack, copies) = self.read_erasure(key, pack_len, false).await?;
        if !verify(&pack) {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: "the pack read from shards with valid hashes fails verification".into(),
            });
        }
        if needs_repair(&copies) {
            self.repair_shards(key, pack.clone(), &copies).await;
        }
        Ok(Bytes::from(pack))
    }

    async fn get_replicated_range<T>(
        &self,
        key: &str,
        pack_len: u64,
        range: Range<u64>,
        open: Open<'_, T>,
    ) -> Result<T, BackendError> {
        let placement = self.object_placement(key);
        let mut damaged = Vec::new();
        let mut bad = Vec::new();
        let mut unreachable = Vec::new();
        for b in self.read_order(&placement) {
            match self.backends[b].get_range(key, range.clone()).await.map(open) {
                Ok(Some(opened)) => {
                    if !damaged.is_empty() {
                        self.repair_from(b, key, pack_len, &damaged).await;
                    }
                    return Ok(opened);
                }
                Ok(None) => {
                    bad.push(format!("{}: range failed verification", self.backends[b].name()));
                    damaged.push(b);
                }
                Err(e) if e.is_not_found() => damaged.push(b),
                Err(BackendError::Corrupt { reason, .. }) => {
                    bad.push(format!("{}: {reason}", self.backends[b].name()));
                    damaged.push(b);
                }
                Err(e) => unreachable.push((b, e.to_string())),
            }
        }
        if !unreachable.is_empty() {
            let mut reason = format!("no replica of {key} served the range verified ({}", join_errors(&unreachable));
            if !bad.is_empty() {
                reason.push_str(&format!("; {}", bad.join("; ")));
            }
            reason.push(')');
            return Err(BackendError::Unavailable {
                backend: unreachable.iter().map(|(b, _)| self.backends[*b].name()).collect::<Vec<_>>().join(", "),
                reason,
            });
        }
        if !bad.is_empty() {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("no replica served the range verified ({})", bad.join("; ")),
            });
        }
        // Missing everywhere it should be: maybe stored before the backend list changed.
        let whole = self.get_replicated(key, Some(pack_len), &|_| true).await?;
        let part = whole.slice(range.start as usize..range.end as usize);
        open(part)
            .ok_or_else(|| BackendError::Corrupt { key: key.to_string(), reason: "range failed verification".into() })
    }

    /// Copies the whole object from backend `source` to `targets` (read repair after a range read).
    async fn repair_from(&self, source: usize, key: &str, pack_len: u64, targets: &[usize]) {
        match self.backends[source].get(key).await {
            Ok(whole) if whole.len() as u64 == pack_len => {
                self.rewrite(key, &whole, targets, RepairSource::CopyFrom(vec![source])).await;
            }
            Ok(whole) => {
                tracing::warn!(key, len = whole.len(), pack_len, "not repairing from a copy of the wrong length")
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "could not fetch a good copy for read repair; queued");
                for &t in targets {
                    self.repairs.enqueue_source(t, key, RepairSource::CopyFrom(vec![source]));
                }
            }
        }
    }

    /// Fetches whole shards (data shards first, or all at once) and returns the pack and what
    /// each shard looked like (`None`: not fetched).
    async fn read_erasure(
        &self,
        key: &str,
        pack_len: u64,
        all_at_once: bool,
    ) -> Result<(Vec<u8>, Vec<Option<CopyState>>), BackendError> {
        let codec = self.codec.clone().ok_or_else(|| BackendError::Internal("not an erasure store".into()))?;
        let (k, total) = (codec.data_shards(), codec.total_shards());
        let shard_len = codec.shard_len(pack_len)?;
        let mut copies: Vec<Option<CopyState>> = (0..total).map(|_| None).collect();
        let first: Vec<usize> = if all_at_once { (0..total).collect() } else { (0..k).collect() };
        self.fetch_shards(key, shard_len, &first, &mut copies).await;
        let good =
            |copies: &[Option<CopyState>]| copies.iter().filter(|c| matches!(c, Some(CopyState::Good(_)))).count();
        let data_complete = copies[..k].iter().all(|c| matches!(c, Some(CopyState::Good(_))));
        if !data_complete {
            let rest: Vec<usize> = (0..total).filter(|&i| copies[i].is_none()).collect();
            self.fetch_shards(key, shard_len, &rest, &mut copies).await;
        }
        if good(&copies) < k {
            return Err(self.shards_error(key, k, &copies));
        }
        let shards = good_shards(&copies);
        let big = pack_len as usize >= BLOCKING_THRESHOLD;
        let pack = maybe_blocking(big, move || {
            let mut shards = shards;
            codec.reconstruct(&mut shards, true)?;
            codec.join(&shards, pack_len)
        })
        .await?
        .map_err(|reason| BackendError::Corrupt { key: key.to_string(), reason })?;
        Ok((pack, copies))
    }

    /// Fetches and checks whole shards `indices` into `copies`.
    async fn fetch_shards(&self, key: &str, shard_len: usize, indices: &[usize], copies: &mut [Option<CopyState>]) {
        let fetched = join_all(indices.iter().map(|&i| {
            let b = self.shard_backend(key, i);
            let shard = shard_key(key, i);
            async move {
                let copy = match self.backends[b].get(&shard).await {
                    Ok(object) => match open_shard(&object, shard_len) {
                        Ok(body) => CopyState::Good(body),
                        Err(reason) => CopyState::Bad(reason),
                    },
                    Err(e) if e.is_not_found() => CopyState::Missing,
                    Err(e) => CopyState::Unreachable(e.to_string()),
                };
                (i, copy)
            }
        }))
        .await;
        for (i, copy) in fetched {
            copies[i] = Some(copy);
        }
    }

    /// The error when fewer than `k` shards are good.
    fn shards_error(&self, key: &str, k: usize, copies: &[Option<CopyState>]) -> BackendError {
        let mut details = Vec::new();
        let (mut good, mut missing, mut bad, mut unreachable) = (0, 0, 0, Vec::new());
        for (i, c) in copies.iter().enumerate() {
            let b = &self.backends[self.shard_backend(key, i)];
            match c {
                Some(CopyState::Good(_)) => good += 1,
                Some(CopyState::Missing) => {
                    missing += 1;
                    details.push(format!("shard {i} on {}: missing", b.name()));
                }
                Some(CopyState::Bad(r)) => {
                    bad += 1;
                    details.push(format!("shard {i} on {}: {r}", b.name()));
                }
                Some(CopyState::Unreachable(e)) => {
                    unreachable.push(b.name().to_string());
                    details.push(format!("shard {i}: {e}"));
                }
                None => {}
            }
        }
        let summary = format!("only {good} of {} shards of {key} are good, {k} needed", copies.len());
        if !unreachable.is_empty() {
            BackendError::Unavailable {
                backend: unreachable.join(", "),
                reason: format!("{summary} ({})", details.join("; ")),
            }
        } else if good == 0 && bad == 0 && missing > 0 {
            BackendError::NotFound { key: key.to_string() }
        } else {
            BackendError::Corrupt { key: key.to_string(), reason: format!("{summary} ({})", details.join("; ")) }
        }
    }

    /// Rewrites the bad and missing shards of a pack whose bytes are known good.
    async fn repair_shards(&self, key: &str, pack: Vec<u8>, copies: &[Option<CopyState>]) -> usize {
        let targets: Vec<usize> =
            (0..copies.len()).filter(|&i| matches!(copies[i], Some(CopyState::Bad(_) | CopyState::Missing))).collect();
        if targets.is_empty() {
            return 0;
        }
        let Some(codec) = self.codec.clone() else { return 0 };
        let big = pack.len() >= BLOCKING_THRESHOLD;
        let shards = match maybe_blocking(big, move || codec.encode(&pack)).await {
            Ok(Ok(shards)) => shards,
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(key, error = %e, "cannot re-encode pack for repair");
                return 0;
            }
        };
        self.rewrite_shards(key, &shards, &targets).await
    }

    /// Writes shard objects `targets` of a pack to their backends, in parallel.
    async fn rewrite_shards(&self, key: &str, shards: &[Bytes], targets: &[usize]) -> usize {
        let writes = targets.iter().map(|&i| async move {
            let b = self.shard_backend(key, i);
            let fallback = RepairSource::RebuildShard { pack_key: key.to_string(), index: i };
            self.rewrite(&shard_key(key, i), &shards[i], &[b], fallback).await
        });
        join_all(writes).await.into_iter().sum()
    }

    // ----- scrub -----

    /// Checks every copy of a small object; with `repair`, rewrites bad and missing ones.
    pub async fn scrub_object(&self, key: &str, verify: Verify<'_>, repair: bool) -> ScrubOutcome {
        if validate_key(key).is_err() {
            return ScrubOutcome { unrepairable: true, ..ScrubOutcome::default() };
        }
        self.scrub_replicated(key, None, verify, repair).await
    }

    /// Checks every copy or shard of a pack; with `repair`, rewrites bad and missing ones.
    /// Under `Erasure` the rebuilt pack must pass `verify`, and every shard must equal what
    /// encoding that pack gives (so a stale shard with a valid hash is caught too).
    pub async fn scrub_pack(&self, key: &str, pack_len: u64, verify: Verify<'_>, repair: bool) -> ScrubOutcome {
        if validate_key(key).is_err() {
            return ScrubOutcome { unrepairable: true, ..ScrubOutcome::default() };
        }
        let Some(codec) = self.codec.clone() else {
            return self.scrub_replicated(key, Some(pack_len), verify, repair).await;
        };
        let mut outcome = ScrubOutcome::default();
        let shard_len = match codec.shard_len(pack_len) {
            Ok(s) => s,
            Err(_) => {
                outcome.unrepairable = true;
                return outcome;
            }
        };
        let total = codec.total_shards();
        let mut copies: Vec<Option<CopyState>> = (0..total).map(|_| None).collect();
        let all: Vec<usize> = (0..total).collect();
        self.fetch_shards(key, shard_len, &all, &mut copies).await;
        let shards = good_shards(&copies);
        let big = pack_len as usize >= BLOCKING_THRESHOLD;
        let codec2 = codec.clone();
        let rebuilt = maybe_blocking(big, move || {
            let mut shards = shards;
            codec2.reconstruct(&mut shards, true)?;
            codec2.join(&shards, pack_len)
        })
        .await;
        let expected = match rebuilt {
            Ok(Ok(pack)) if verify(&pack) => {
                let encoded = maybe_blocking(big, move || codec.encode(&pack)).await;
                match encoded {
                    Ok(Ok(shards)) => Some(shards),
                    _ => None,
                }
            }
            _ => None,
        };
        let mut targets = Vec::new();
        for (i, copy) in copies.iter().enumerate() {
            match copy {
                Some(CopyState::Good(body)) => match &expected {
                    Some(shards) if shards[i][..shard_len] != body[..] => {
                        outcome.copies_bad += 1;
                        targets.push(i);
                    }
                    _ => outcome.copies_ok += 1,
                },
                Some(CopyState::Bad(_)) => {
                    outcome.copies_bad += 1;
                    targets.push(i);
                }
                Some(CopyState::Missing) => {
                    outcome.copies_missing += 1;
                    targets.push(i);
                }
                Some(CopyState::Unreachable(_)) | None => outcome.copies_unreachable += 1,
            }
        }
        let Some(shards) = expected else {
            outcome.unrepairable = true;
            return outcome;
        };
        if repair {
            outcome.repaired = self.rewrite_shards(key, &shards, &targets).await;
        }
        outcome
    }

    async fn scrub_replicated(
        &self,
        key: &str,
        expected_len: Option<u64>,
        verify: Verify<'_>,
        repair: bool,
    ) -> ScrubOutcome {
        let placement = self.object_placement(key);
        let copies = join_all(placement.iter().map(|&b| self.read_copy(b, key, expected_len, verify))).await;
        let mut outcome = ScrubOutcome::default();
        let mut good: Option<(usize, Bytes)> = None;
        let mut targets = Vec::new();
        for (&b, copy) in placement.iter().zip(copies) {
            match copy {
                CopyState::Good(bytes) => {
                    outcome.copies_ok += 1;
                    good.get_or_insert((b, bytes));
                }
                CopyState::Bad(_) => {
                    outcome.copies_bad += 1;
                    targets.push(b);
                }
                CopyState::Missing => {
                    outcome.copies_missing += 1;
                    targets.push(b);
                }
                CopyState::Unreachable(_) => outcome.copies_unreachable += 1,
            }
        }
        match good {
            None => outcome.unrepairable = true,
            Some((source, bytes)) if repair && !targets.is_empty() => {
                outcome.repaired = self.rewrite(key, &bytes, &targets, RepairSource::CopyFrom(vec![source])).await;
            }
            Some(_) => {}
        }
        outcome
    }

    // ----- repairs -----

    /// Retries queued repairs (call periodically and before shutdown); returns how many are
    /// still pending. Backends whose breaker is open are skipped until a probe is due.
    pub async fn run_repairs(&self) -> usize {
        let tasks = self.repairs.tasks();
        futures::stream::iter(tasks).for_each_concurrent(REPAIR_CONCURRENCY, |t| self.run_repair(t)).await;
        self.repairs.len()
    }

    async fn run_repair(&self, task: RepairTask) {
        let backend = &self.backends[task.backend];
        if !backend.is_available() {
            return;
        }
        let data = match &task.source {
            RepairSource::Data(data) => Ok(data.clone()),
            RepairSource::CopyFrom(sources) => self.copy_source(&task.key, sources).await,
            RepairSource::RebuildShard { pack_key, index } => self.rebuild_shard(pack_key, *index).await,
        };
        let data = match data {
            Ok(data) => data,
            Err(e) if e.is_not_found() => {
                // Deleted meanwhile: nothing to repair.
                self.repairs.complete(task.backend, &task.key, task.generation);
                return;
            }
            Err(e) => {
                self.repairs.failed(task.backend, &task.key, task.generation, e.to_string());
                return;
            }
        };
        match backend.put(&task.key, data).await {
            Ok(()) => {
                tracing::info!(key = %task.key, backend = %backend.name(), "repaired");
                self.repairs.complete(task.backend, &task.key, task.generation);
            }
            Err(e) => self.repairs.failed(task.backend, &task.key, task.generation, e.to_string()),
        }
    }

    /// The object from the first source backend that has it.
    async fn copy_source(&self, key: &str, sources: &[usize]) -> Result<Bytes, BackendError> {
        let mut last = BackendError::NotFound { key: key.to_string() };
        let mut any_unreachable = false;
        for &s in sources {
            match self.backends[s].get(key).await {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    any_unreachable = true;
                    last = e;
                }
            }
        }
        if any_unreachable { Err(last) } else { Err(BackendError::NotFound { key: key.to_string() }) }
    }

    /// Rebuilds shard `index` of a pack from its other shards (shard length taken from them).
    async fn rebuild_shard(&self, pack_key: &str, index: usize) -> Result<Bytes, BackendError> {
        let codec = self.codec.clone().ok_or_else(|| BackendError::Internal("not an erasure store".into()))?;
        let total = codec.total_shards();
        let objects = join_all((0..total).filter(|&i| i != index).map(|i| {
            let b = self.shard_backend(pack_key, i);
            let shard = shard_key(pack_key, i);
            async move { (i, self.backends[b].get(&shard).await) }
        }))
        .await;
        // The shard length is the one most objects agree on.
        let mut lengths: BTreeMap<usize, usize> = BTreeMap::new();
        for (_, r) in &objects {
            if let Ok(o) = r {
                *lengths.entry(o.len()).or_default() += 1;
            }
        }
        let Some(object_len) = lengths.iter().max_by_key(|(_, n)| **n).map(|(len, _)| *len) else {
            let all_missing = objects.iter().all(|(_, r)| r.as_ref().is_err_and(BackendError::is_not_found));
            return Err(if all_missing {
                BackendError::NotFound { key: pack_key.to_string() }
            } else {
                BackendError::Unavailable {
                    backend: "shard backends".into(),
                    reason: format!("no shard of {pack_key} readable"),
                }
            });
        };
        let shard_len = object_len.saturating_sub(TRAILER_LEN);
        let mut shards: Vec<Option<Vec<u8>>> = (0..total).map(|_| None).collect();
        for (i, r) in objects {
            if let Ok(object) = r {
                if let Ok(body) = open_shard(&object, shard_len) {
                    shards[i] = Some(body.to_vec());
                }
            }
        }
        let big = shard_len * codec.data_shards() >= BLOCKING_THRESHOLD;
        let rebuilt = maybe_blocking(big, move || {
            let mut shards = shards;
            codec.reconstruct(&mut shards, false)?;
            shards.into_iter().nth(index).flatten().ok_or_else(|| "shard not rebuilt".to_string())
        })
        .await?
        .map_err(|reason| BackendError::Corrupt { key: shard_key(pack_key, index), reason })?;
        let mut sealed = rebuilt;
        sealed.reserve_exact(TRAILER_LEN);
        Ok(super::erasure::seal(sealed))
    }

    // ----- deletes and listing -----

    /// Deletes every copy of a small object (and forgets its queued repairs). Errors if some
    /// copy could not be deleted; the remaining copies show up in listings for a later retry.
    pub async fn delete_object(&self, key: &str) -> Result<(), BackendError> {
        validate_key(key)?;
        let keys = vec![key.to_string()];
        self.repairs.forget_keys(&keys);
        let targets: Vec<(usize, String)> =
            self.object_placement(key).into_iter().map(|b| (b, key.to_string())).collect();
        self.delete_all(key, targets).await
    }

    /// Deletes every copy or shard of a pack (and forgets its queued repairs).
    pub async fn delete_pack(&self, key: &str) -> Result<(), BackendError> {
        validate_key(key)?;
        let Some(codec) = &self.codec else {
            return self.delete_object(key).await;
        };
        let targets: Vec<(usize, String)> =
            (0..codec.total_shards()).map(|i| (self.shard_backend(key, i), shard_key(key, i))).collect();
        let keys: Vec<String> = targets.iter().map(|(_, k)| k.clone()).collect();
        self.repairs.forget_keys(&keys);
        self.delete_all(key, targets).await
    }

    async fn delete_all(&self, key: &str, targets: Vec<(usize, String)>) -> Result<(), BackendError> {
        let results = join_all(targets.iter().map(|(b, k)| self.backends[*b].delete(k))).await;
        let errors: Vec<String> = targets
            .iter()
            .zip(results)
            .filter_map(|((b, _), r)| r.err().map(|e| describe(&self.backends[*b], &e)))
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        Err(BackendError::Unavailable {
            backend: format!("{} of {} backends", errors.len(), targets.len()),
            reason: format!("{key} was not deleted everywhere ({})", errors.join("; ")),
        })
    }

    /// Union of keys under `prefix` (a key path, see [`Backend::list`]) across backends, shard
    /// suffixes `.sN` folded into the pack key, with the largest size seen (for a pack under
    /// `Erasure` that is a shard object's size). Fails only if more backends failed than the
    /// policy tolerates, since then an object could be missing from the union.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.list_after(prefix, None).await
    }

    /// Like [`RedundantStore::list`], only keys sorting after `after` (see `Backend::list_after`).
    pub async fn list_after(&self, prefix: &str, after: Option<&str>) -> Result<Vec<ObjectInfo>, BackendError> {
        let trimmed = prefix.trim_end_matches('/');
        if !trimmed.is_empty() {
            validate_key(trimmed)?;
        }
        let results = join_all(self.backends.iter().map(|b| b.list_after(prefix, after))).await;
        let mut union: BTreeMap<String, u64> = BTreeMap::new();
        let mut failed = Vec::new();
        for (b, result) in self.backends.iter().zip(results) {
            match result {
                Ok(objects) => {
                    for o in objects {
                        let key = match split_shard_key(&o.key) {
                            Some((base, _)) if self.codec.is_some() => base.to_string(),
                            _ => o.key,
                        };
                        let size = union.entry(key).or_default();
                        *size = (*size).max(o.size);
                    }
                }
                Err(e) => failed.push(describe(b, &e)),
            }
        }
        if failed.len() > self.redundancy.fault_tolerance() || failed.len() == self.backends.len() {
            return Err(BackendError::ListIncomplete { prefix: prefix.to_string(), failed });
        }
        Ok(union.into_iter().map(|(key, size)| ObjectInfo { key, size }).collect())
    }
}

/// One backend's conditional-create probe (see `check_conditional_create`).
async fn probe_conditional_create(backend: &Backend, key: &str) -> Result<(), BackendError> {
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let first = Bytes::from(format!("tierfs conditional-create probe {nonce}: first"));
    let second = Bytes::from(format!("tierfs conditional-create probe {nonce}: second"));
    let outcome = match backend.put_if_absent(key, first).await {
        Ok(_) => backend.put_if_absent(key, second).await,
        Err(e) => return Err(e),
    };
    if let Err(e) = backend.delete(key).await {
        tracing::debug!(backend = %backend.name(), key, error = %e, "probe object not deleted");
    }
    match outcome {
        Ok(false) => Ok(()),
        Ok(true) => Err(BackendError::NotSupported {
            backend: backend.name().to_string(),
            operation: "conditional create (If-None-Match: *)".into(),
            reason: "a second create of an existing object succeeded and replaced it: the server ignores the \
                     header (Garage 2.x does), so two writers could both think they own the workspace; use AWS S3, \
                     MinIO or another server that honours conditional writes"
                .into(),
        }),
        Err(e) => Err(e),
    }
}

/// Some shard was found bad or missing (not merely unreachable).
fn needs_repair(copies: &[Option<CopyState>]) -> bool {
    copies.iter().any(|c| matches!(c, Some(CopyState::Bad(_) | CopyState::Missing)))
}

fn join_errors(errors: &[(usize, String)]) -> String {
    errors.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("; ")
}

impl fmt::Debug for RedundantStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedundantStore")
            .field("redundancy", &self.redundancy)
            .field("backends", &self.backends.iter().map(|b| b.name()).collect::<Vec<_>>())
            .field("pending_repairs", &self.pending_repairs())
            .finish()
    }
}

/// The verified shards, `None` where a shard is missing or bad (the decoder's input).
fn good_shards(copies: &[Option<CopyState>]) -> Vec<Option<Vec<u8>>> {
    copies
        .iter()
        .map(|c| match c {
            Some(CopyState::Good(b)) => Some(b.to_vec()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::backend::{BackendOptions, BackendSpec, Credentials, Fault};
    use object_store::memory::InMemory;
    use proptest::prelude::*;

    fn opts() -> BackendOptions {
        BackendOptions { max_retries: 1, ..BackendOptions::for_tests() }
    }

    fn store(n: usize, redundancy: Redundancy) -> RedundantStore {
        let backends =
            (0..n).map(|i| Backend::from_object_store(format!("mem-{i}"), Arc::new(InMemory::new()), opts())).collect();
        RedundantStore::new(backends, redundancy).unwrap().with_straggler_grace(Duration::from_millis(20))
    }

    fn pack(len: usize, seed: u8) -> Bytes {
        Bytes::from(
            (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect::<Vec<u8>>(),
        )
    }

    /// A verify callback that accepts exactly `want`.
    fn exactly(want: Bytes) -> impl Fn(&[u8]) -> bool + Send + Sync {
        move |got: &[u8]| got == &want[..]
    }

    /// `exactly` for `get_pack_range`: the bytes themselves when they are `want`.
    fn exact_range(want: Bytes) -> impl Fn(Bytes) -> Option<Bytes> + Send + Sync {
        move |got: Bytes| (got == want).then_some(got)
    }

    async fn raw(s: &RedundantStore, b: usize, key: &str) -> Option<Bytes> {
        s.backends()[b].get(key).await.ok()
    }

    #[test]
    fn new_validates_the_policy() {
        let msg = |n, r| RedundantStore::new(mems(n), r).unwrap_err().to_string();
        assert!(
            msg(2, Redundancy::Replicas(3)).contains("replicas = 3 needs 3 different backends, but 2 are configured")
        );
        assert!(msg(2, Redundancy::Replicas(0)).contains("at least 1"));
        assert!(msg(5, Redundancy::Erasure { data: 4, parity: 2 }).contains("6 shards on different backends, but 5"));
        assert!(msg(3, Redundancy::Erasure { data: 0, parity: 1 }).contains("data >= 1"));
        assert!(msg(0, Redundancy::Replicas(1)).contains("no backends"));
        let twice = vec![
            Backend::from_object_store("same".into(), Arc::new(InMemory::new()), opts()),
            Backend::from_object_store("same".into(), Arc::new(InMemory::new()), opts()),
        ];
        assert!(RedundantStore::new(twice, Redundancy::Replicas(2)).unwrap_err().to_string().contains("listed twice"));
        assert!(RedundantStore::new(mems(3), Redundancy::Erasure { data: 2, parity: 1 }).is_ok());
        assert_eq!(Redundancy::Erasure { data: 4, parity: 2 }.to_string(), "erasure 4+2");
        assert_eq!(Redundancy::Erasure { data: 4, parity: 2 }.object_copies(), 3);
    }

    fn mems(n: usize) -> Vec<Backend> {
        (0..n).map(|i| Backend::from_object_store(format!("m{i}"), Arc::new(InMemory::new()), opts())).collect()
    }

    #[test]
    fn placement_is_deterministic_and_spread() {
        let s = store(5, Redundancy::Replicas(3));
        let mut starts = [0usize; 5];
        for i in 0..500 {
            let key = format!("packs/{i:02x}/{i}");
            let p = s.object_placement(&key);
            assert_eq!(p, s.object_placement(&key));
            assert_eq!(p.len(), 3);
            assert_eq!(p[1], (p[0] + 1) % 5);
            starts[p[0]] += 1;
        }
        assert!(starts.iter().all(|&n| n > 50), "{starts:?}");
        let all = store(3, Redundancy::Replicas(3));
        let mut p = all.object_placement("config");
        p.sort_unstable();
        assert_eq!(p, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn quorum_put_with_one_backend_down_queues_a_repair() {
        let s = store(3, Redundancy::Replicas(3));
        let data = Bytes::from_static(b"config v1");
        s.backends()[1].inject_fault(Some(Fault::Down));
        let report = s.put_object("config", data.clone()).await.unwrap();
        assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
        assert_eq!(s.pending_repairs(), 1);
        assert!(s.get_object("config", &exactly(data.clone())).await.is_ok());

        // Still down: the repair stays queued.
        assert_eq!(s.run_repairs().await, 1);
        s.backends()[1].inject_fault(None);
        tokio::time::sleep(Duration::from_millis(30)).await; // a tripped breaker's probe is due
        assert_eq!(s.run_repairs().await, 0);
        assert_eq!(raw(&s, 1, "config").await, Some(data));
    }

    #[tokio::test]
    async fn quorum_fails_with_two_backends_down() {
        let s = store(3, Redundancy::Replicas(3));
        s.backends()[0].inject_fault(Some(Fault::Down));
        s.backends()[2].inject_fault(Some(Fault::Down));
        let err = s.put_object("config", Bytes::from_static(b"x")).await.unwrap_err();
        match &err {
            BackendError::QuorumFailed { stored, needed, errors, .. } => {
                assert_eq!((*stored, *needed, errors.len()), (1, 2, 2));
                assert!(errors.iter().any(|e| e.contains("mem-0")) && errors.iter().any(|e| e.contains("mem-2")));
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("1 of the 2 copies needed"), "{err}");
        assert_eq!(s.pending_repairs(), 0, "nothing acknowledged, nothing queued");
    }

    #[tokio::test]
    async fn read_repairs_missing_and_corrupt_copies() {
        let s = store(3, Redundancy::Replicas(3));
        let data = Bytes::from_static(b"index segment");
        s.put_object("index/1", data.clone()).await.unwrap();
        let p = s.object_placement("index/1");
        s.backends()[p[0]].delete("index/1").await.unwrap();
        s.backends()[p[1]].put("index/1", Bytes::from_static(b"garbage")).await.unwrap();
        assert_eq!(s.get_object("index/1", &exactly(data.clone())).await.unwrap(), data);
        for &b in &p {
            assert_eq!(raw(&s, b, "index/1").await, Some(data.clone()), "backend {b} repaired");
        }
        assert_eq!(s.pending_repairs(), 0);

        // Corruption in transit on the first replica: served from the next one.
        s.backends()[p[0]].inject_fault(Some(Fault::CorruptReads));
        assert_eq!(s.get_object("index/1", &exactly(data.clone())).await.unwrap(), data);
    }

    #[tokio::test]
    async fn all_copies_bad_missing_or_unreachable() {
        let s = store(3, Redundancy::Replicas(3));
        let data = Bytes::from_static(b"head");
        s.put_object("refs/ws/head", data.clone()).await.unwrap();
        let err = s.get_object("refs/ws/head", &|_| false).await.unwrap_err();
        assert!(matches!(err, BackendError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("mem-1: failed verification"), "{err}");
        assert!(s.get_object("refs/ws/none", &|_| true).await.unwrap_err().is_not_found());

        // One backend down and the others missing the object: not a false "not found".
        s.backends()[0].inject_fault(Some(Fault::Down));
        let err = s.get_object("refs/ws/none", &|_| true).await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("mem-0"), "{err}");
        // …but the object itself is still readable.
        assert_eq!(s.get_object("refs/ws/head", &exactly(data.clone())).await.unwrap(), data);
        // Bad copies plus one unreachable: maybe the unreachable one is good, so "unavailable".
        let err = s.get_object("refs/ws/head", &|_| false).await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn copies_found_off_placement_are_moved_back() {
        // Two replicas over three backends; simulate a copy left on the third by an older layout.
        let s = store(3, Redundancy::Replicas(2));
        let p = s.object_placement("keys/k1");
        let other = (0..3).find(|b| !p.contains(b)).unwrap();
        let data = Bytes::from_static(b"wrapped key");
        s.backends()[other].put("keys/k1", data.clone()).await.unwrap();
        assert_eq!(s.get_object("keys/k1", &exactly(data.clone())).await.unwrap(), data);
        for &b in &p {
            assert_eq!(raw(&s, b, "keys/k1").await, Some(data.clone()));
        }
    }

    #[tokio::test]
    async fn replicated_pack_ranges_and_repair() {
        let s = store(3, Redundancy::Replicas(2));
        let data = pack(5000, 1);
        s.put_pack("packs/aa/p1", data.clone()).await.unwrap();
        let p = s.object_placement("packs/aa/p1");
        let want = data.slice(100..4000);
        assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 100..4000, &exact_range(want.clone())).await.unwrap(), want);

        s.backends()[p[0]].put("packs/aa/p1", pack(5000, 9)).await.unwrap();
        assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 100..4000, &exact_range(want.clone())).await.unwrap(), want);
        assert_eq!(raw(&s, p[0], "packs/aa/p1").await, Some(data.clone()), "whole copy repaired");

        assert_eq!(s.get_pack("packs/aa/p1", 5000, &exactly(data.clone())).await.unwrap(), data);
        let short = s.get_pack("packs/aa/p1", 4999, &|_| true).await.unwrap_err();
        assert!(matches!(short, BackendError::Corrupt { .. }), "{short:?}");
        let bad = s.get_pack_range("packs/aa/p1", 5000, 10..5001, &Some).await.unwrap_err();
        assert!(matches!(bad, BackendError::BadRange { .. }), "{bad:?}");
        assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 7..7, &Some).await.unwrap(), Bytes::new());
        let empty_refused = s.get_pack_range("packs/aa/p1", 5000, 7..7, &|_| None::<Bytes>).await.unwrap_err();
        assert!(matches!(empty_refused, BackendError::Corrupt { .. }), "{empty_refused:?}");
    }

    async fn check_erasure_round_trip(s: &RedundantStore, len: usize) {
        let key = format!("packs/ec/{len}");
        let data = pack(len, 3);
        let report = s.put_pack(&key, data.clone()).await.unwrap();
        let total = match s.redundancy() {
            Redundancy::Erasure { data, parity } => (data + parity) as usize,
            Redundancy::Replicas(_) => unreachable!(),
        };
        assert_eq!(report, PutReport { stored: total, wanted: total, queued_repairs: 0 });
        let n = len as u64;
        for r in [0..n, 0..1, n - 1..n, n / 3..n / 3 * 2, 1..n - 1].into_iter().filter(|r| r.start < r.end) {
            let want = data.slice(r.start as usize..r.end as usize);
            let got = s.get_pack_range(&key, n, r.clone(), &exact_range(want.clone())).await.unwrap();
            assert_eq!(got, want, "range {r:?} of {len}");
        }
        assert_eq!(s.get_pack(&key, n, &exactly(data.clone())).await.unwrap(), data);
        assert!(s.scrub_pack(&key, n, &exactly(data), false).await.is_healthy());
    }

    #[tokio::test]
    async fn erasure_round_trips() {
        let s21 = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        let s42 = store(6, Redundancy::Erasure { data: 4, parity: 2 });
        for len in [1, 2, 3, 7, 1000, 4097] {
            check_erasure_round_trip(&s21, len).await;
            check_erasure_round_trip(&s42, len).await;
        }
        // Shards land on consecutive backends from the key's start.
        let start = s42.start("packs/ec/1000");
        for i in 0..6 {
            let object = raw(&s42, (start + i) % 6, &format!("packs/ec/1000.s{i}")).await.unwrap();
            assert_eq!(object.len(), 250 + TRAILER_LEN);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_packs_code_on_blocking_threads() {
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        let data = pack(3 << 20, 5);
        s.put_pack("packs/big/1", data.clone()).await.unwrap();
        s.backends()[s.shard_backend("packs/big/1", 0)].delete("packs/big/1.s0").await.unwrap();
        let want = data.slice(1_000_000..2_000_000);
        let got =
            s.get_pack_range("packs/big/1", 3 << 20, 1_000_000..2_000_000, &exact_range(want.clone())).await.unwrap();
        assert_eq!(got, want);
        assert!(raw(&s, s.shard_backend("packs/big/1", 0), "packs/big/1.s0").await.is_some(), "shard rebuilt");
    }

    #[tokio::test]
    async fn erasure_write_quorum_and_repair_queue() {
        // 4+2 acknowledges at 5 shards: one backend down is fine.
        let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
        let data = pack(10_000, 7);
        let down = s.shard_backend("packs/q/1", 5);
        s.backends()[down].inject_fault(Some(Fault::Down));
        let report = s.put_pack("packs/q/1", data.clone()).await.unwrap();
        assert_eq!(report, PutReport { stored: 5, wanted: 6, queued_repairs: 1 });
        s.backends()[down].inject_fault(None);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(s.run_repairs().await, 0);
        assert!(s.scrub_pack("packs/q/1", 10_000, &exactly(data.clone()), false).await.is_healthy());

        // Two down: 4 of the needed 5.
        s.backends()[0].inject_fault(Some(Fault::Down));
        s.backends()[1].inject_fault(Some(Fault::Down));
        let err = s.put_pack("packs/q/2", data.clone()).await.unwrap_err();
        assert!(matches!(err, BackendError::QuorumFailed { stored: 4, needed: 5, .. }), "{err:?}");

        // 2+1 with one backend down still writes (k shards now, the third queued); two down fail.
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        s.backends()[0].inject_fault(Some(Fault::Down));
        let report = s.put_pack("packs/q/3", data.clone()).await.unwrap();
        assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
        s.backends()[1].inject_fault(Some(Fault::Down));
        let err = s.put_pack("packs/q/4", data).await.unwrap_err();
        assert!(matches!(err, BackendError::QuorumFailed { stored: 1, needed: 2, .. }), "{err:?}");
    }

    #[tokio::test]
    async fn repairs_without_kept_bytes_reread_good_data() {
        for redundancy in [Redundancy::Replicas(3), Redundancy::Erasure { data: 4, parity: 2 }] {
            let n = if redundancy == Redundancy::Replicas(3) { 3 } else { 6 };
            let s = store(n, redundancy).with_repair_memory_limit(0);
            let data = pack(3000, 11);
            let target = match redundancy {
                Redundancy::Replicas(_) => s.object_placement("packs/m/1")[2],
                Redundancy::Erasure { .. } => s.shard_backend("packs/m/1", 2),
            };
            s.backends()[target].inject_fault(Some(Fault::Down));
            let report = s.put_pack("packs/m/1", data.clone()).await.unwrap();
            assert_eq!(report.queued_repairs, 1, "{redundancy}");
            assert!(s.repairs.tasks().iter().all(|t| !matches!(t.source, RepairSource::Data(_))));
            s.backends()[target].inject_fault(None);
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert_eq!(s.run_repairs().await, 0, "{redundancy}");
            let outcome = s.scrub_pack("packs/m/1", 3000, &exactly(data.clone()), false).await;
            assert!(outcome.is_healthy(), "{redundancy}: {outcome:?}");
        }
    }

    /// Stores over the same in-memory object stores, as two runs of a daemon see them.
    fn shared_stores(n: usize, redundancy: Redundancy, runs: usize) -> Vec<RedundantStore> {
        let objects: Vec<Arc<InMemory>> = (0..n).map(|_| Arc::new(InMemory::new())).collect();
        (0..runs)
            .map(|_| {
                let backends = objects
                    .iter()
                    .enumerate()
                    .map(|(i, o)| Backend::from_object_store(format!("mem-{i}"), o.clone(), opts()))
                    .collect();
                RedundantStore::new(backends, redundancy).unwrap().with_straggler_grace(Duration::from_millis(20))
            })
            .collect()
    }

    #[tokio::test]
    async fn saved_repairs_are_done_by_the_next_run() {
        for (redundancy, n, memory) in [
            (Redundancy::Replicas(3), 3, DEFAULT_REPAIR_MEMORY), // repairs that hold their bytes
            (Redundancy::Replicas(3), 3, 0),                     // repairs that copy from a replica
            (Redundancy::Erasure { data: 2, parity: 1 }, 3, 0),  // shards rebuilt from the others
        ] {
            let mut runs = shared_stores(n, redundancy, 2).into_iter();
            let (first, second) = (runs.next().unwrap().with_repair_memory_limit(memory), runs.next().unwrap());
            let data = pack(5000, 3);
            first.backends()[1].inject_fault(Some(Fault::Down));
            first.put_object("config", Bytes::from_static(b"config v1")).await.unwrap();
            first.put_pack("packs/r/1", data.clone()).await.unwrap();
            assert!(first.pending_repairs() >= 1, "{redundancy}");
            let saved = first.saved_repairs();
            assert!(saved.iter().all(|r| r.backend == "mem-1"), "{redundancy}: {saved:?}");
            // What a daemon writes to disk and reads back, plus an entry for a backend that is gone.
            let mut back: Vec<SavedRepair> = serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
            assert_eq!(back, saved);
            back.push(SavedRepair {
                backend: "removed".into(),
                key: "config".into(),
                from: SavedSource::Copies(vec!["mem-0".into()]),
            });
            drop(first); // the first run ends with backend 1 still down

            assert_eq!(second.restore_repairs(&back), saved.len(), "{redundancy}");
            assert_eq!(second.run_repairs().await, 0, "{redundancy}");
            assert_eq!(raw(&second, 1, "config").await, Some(Bytes::from_static(b"config v1")), "{redundancy}");
            let outcome = second.scrub_pack("packs/r/1", 5000, &exactly(data), false).await;
            assert!(outcome.is_healthy(), "{redundancy}: {outcome:?}");
        }
    }

    #[tokio::test]
    async fn slow_backends_finish_in_the_background() {
        let s = store(3, Redundancy::Replicas(3));
        let slow = 2;
        s.backends()[slow].inject_fault(Some(Fault::Slow(Duration::from_millis(1500))));
        let started = Instant::now();
        let report = s.put_object("journal/ws/1", Bytes::from_static(b"segment")).await.unwrap();
        assert!(started.elapsed() < Duration::from_millis(1000), "{:?}", started.elapsed());
        assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
        assert_eq!(s.pending_repairs(), 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.pending_repairs() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(s.pending_repairs(), 0, "the straggler landed and cleared its repair");
        s.backends()[slow].inject_fault(None);
        assert_eq!(raw(&s, slow, "journal/ws/1").await, Some(Bytes::from_static(b"segment")));
    }

    /// Every copy of `key` in `s`'s placement, as stored.
    async fn copies(s: &RedundantStore, key: &str) -> Vec<Option<Bytes>> {
        let mut out = Vec::new();
        for b in s.object_placement(key) {
            out.push(raw(s, b, key).await);
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn competing_creates_have_exactly_one_winner() {
        let s = Arc::new(store(3, Redundancy::Replicas(3)));
        for seq in 0..50 {
            let key = format!("refs/ws/j/{seq}");
            let (a, b) = (Bytes::from(format!("writer a, entry {seq}")), Bytes::from(format!("writer b, entry {seq}")));
            let ta = tokio::spawn({
                let (s, key, a) = (s.clone(), key.clone(), a.clone());
                async move { s.create_object(&key, a).await.unwrap() }
            });
            let tb = tokio::spawn({
                let (s, key, b) = (s.clone(), key.clone(), b.clone());
                async move { s.create_object(&key, b).await.unwrap() }
            });
            let (oa, ob) = (ta.await.unwrap(), tb.await.unwrap());
            let winner = match (oa, ob) {
                (CreateOutcome::Created, CreateOutcome::Exists) => a,
                (CreateOutcome::Exists, CreateOutcome::Created) => b,
                other => panic!("{key}: {other:?}"),
            };
            // The winner overwrote any minority copy of the loser before returning.
            assert_eq!(copies(&s, &key).await, vec![Some(winner.clone()); 3], "{key}");
            // Retrying either create changes nothing.
            assert_eq!(s.create_object(&key, winner.clone()).await.unwrap(), CreateOutcome::Created);
            let loser = Bytes::from(format!("writer c, entry {seq}"));
            assert_eq!(s.create_object(&key, loser).await.unwrap(), CreateOutcome::Exists);
        }
        assert_eq!(s.pending_repairs(), 0);
    }

    #[tokio::test]
    async fn a_competitors_minority_copy_is_overwritten() {
        let s = store(3, Redundancy::Replicas(3));
        let key = "refs/ws/j/7";
        let p = s.object_placement(key);
        let (ours, theirs) = (Bytes::from_static(b"ours"), Bytes::from_static(b"theirs"));
        // A competitor got one copy in first, then stopped (crashed, or lost the other two).
        assert!(s.backends()[p[1]].put_if_absent(key, theirs.clone()).await.unwrap());
        assert_eq!(s.create_object(key, ours.clone()).await.unwrap(), CreateOutcome::Created);
        assert_eq!(copies(&s, key).await, vec![Some(ours.clone()); 3]);
        assert_eq!(s.pending_repairs(), 0);
        // The competitor's retry now finds the majority taken.
        assert_eq!(s.create_object(key, theirs).await.unwrap(), CreateOutcome::Exists);

        // Two competing copies: ours cannot win; our copy made on the way is left, nothing queued.
        let key = "refs/ws/j/8";
        let p = s.object_placement(key);
        for &b in &p[..2] {
            s.backends()[b].put(key, Bytes::from_static(b"theirs")).await.unwrap();
        }
        assert_eq!(s.create_object(key, ours.clone()).await.unwrap(), CreateOutcome::Exists);
        assert_eq!(raw(&s, p[0], key).await, Some(Bytes::from_static(b"theirs")));
        assert_eq!(s.pending_repairs(), 0);
    }

    #[tokio::test]
    async fn create_with_one_backend_down_queues_a_repair() {
        let s = store(3, Redundancy::Replicas(3));
        let key = "refs/ws/j/1";
        let down = s.object_placement(key)[0];
        s.backends()[down].inject_fault(Some(Fault::Down));
        let data = Bytes::from_static(b"entry 1");
        assert_eq!(s.create_object(key, data.clone()).await.unwrap(), CreateOutcome::Created);
        assert_eq!(s.pending_repairs(), 1);
        // The same bytes again (our retry after a lost answer): still ours.
        assert_eq!(s.create_object(key, data.clone()).await.unwrap(), CreateOutcome::Created);
        // Someone else's bytes: two copies answer "taken", which settles it without the third.
        assert_eq!(s.create_object(key, Bytes::from_static(b"other")).await.unwrap(), CreateOutcome::Exists);

        s.backends()[down].inject_fault(None);
        tokio::time::sleep(Duration::from_millis(30)).await; // a tripped breaker's probe is due
        assert_eq!(s.run_repairs().await, 0);
        assert_eq!(copies(&s, key).await, vec![Some(data); 3]);
    }

    #[tokio::test]
    async fn create_without_a_majority_fails() {
        let s = store(3, Redundancy::Replicas(3));
        let key = "refs/ws/j/2";
        let p = s.object_placement(key);
        s.backends()[p[0]].inject_fault(Some(Fault::Down));
        s.backends()[p[2]].inject_fault(Some(Fault::Down));
        let err = s.create_object(key, Bytes::from_static(b"entry 2")).await.unwrap_err();
        match &err {
            BackendError::QuorumFailed { stored: 1, needed: 2, errors, .. } => assert_eq!(errors.len(), 2, "{err}"),
            other => panic!("{other:?}"),
        }
        assert!(err.is_transient());
        assert_eq!(s.pending_repairs(), 0, "nothing acknowledged, nothing queued");

        // One "taken" and one unreachable: the unreachable copy could decide either way.
        s.backends()[p[0]].inject_fault(None);
        s.backends()[p[1]].put(key, Bytes::from_static(b"theirs")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let err = s.create_object(key, Bytes::from_static(b"entry 2")).await.unwrap_err();
        assert!(matches!(err, BackendError::QuorumFailed { stored: 1, needed: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("another writer's object is there"), "{err}");
        assert_eq!(s.pending_repairs(), 0);

        assert!(matches!(s.create_object("a//b", Bytes::new()).await, Err(BackendError::BadKey { .. })));
    }

    #[tokio::test]
    async fn create_on_file_backends() {
        let dir = tempfile::tempdir().unwrap();
        let backends = (0..3)
            .map(|i| {
                let spec = BackendSpec::File { path: dir.path().join(format!("b{i}")) };
                Backend::open(&spec, &Credentials::default(), &opts()).unwrap()
            })
            .collect();
        let s = RedundantStore::new(backends, Redundancy::Erasure { data: 2, parity: 1 }).unwrap();
        s.check_conditional_create().await.unwrap();
        let key = "refs/ws/j/1";
        let (a, b) = (Bytes::from_static(b"writer a"), Bytes::from_static(b"writer b"));
        let (oa, ob) = tokio::join!(s.create_object(key, a.clone()), s.create_object(key, b.clone()));
        let (oa, ob) = (oa.unwrap(), ob.unwrap());
        assert_ne!(oa, ob, "exactly one winner");
        let winner = if oa == CreateOutcome::Created { a } else { b };
        assert_eq!(copies(&s, key).await, vec![Some(winner.clone()); 3]);
        assert_eq!(s.get_object(key, &exactly(winner)).await.unwrap().len(), 8);
        assert!(s.list("").await.unwrap().iter().all(|o| !o.key.starts_with("probe")), "probes deleted");
    }

    #[tokio::test]
    async fn conditional_create_check_names_a_backend_that_ignores_it() {
        let s = store(3, Redundancy::Replicas(3));
        s.check_conditional_create().await.unwrap();
        s.backends()[1].inject_fault(Some(Fault::IgnoreConditional));
        let err = s.check_conditional_create().await.unwrap_err();
        match &err {
            BackendError::NotSupported { backend, operation, .. } => {
                assert_eq!((backend.as_str(), operation.as_str()), ("mem-1", "conditional create (If-None-Match: *)"));
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("mem-1 does not support") && msg.contains("Garage"), "{msg}");
        for b in s.backends() {
            assert!(b.list("").await.unwrap().is_empty(), "{}: probe deleted", b.name());
        }

        // Unreachable backends are skipped, as long as one could be probed.
        s.backends()[1].inject_fault(Some(Fault::Down));
        s.backends()[2].inject_fault(Some(Fault::Down));
        s.check_conditional_create().await.unwrap();
        s.backends()[0].inject_fault(Some(Fault::Down));
        let err = s.check_conditional_create().await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("mem-0") && err.to_string().contains("mem-2"), "{err}");
    }

    #[tokio::test]
    async fn scrub_finds_and_repairs() {
        let s = store(3, Redundancy::Replicas(3));
        let data = Bytes::from_static(b"snapshot descriptor");
        s.put_object("snapshots/1", data.clone()).await.unwrap();
        s.backends()[0].delete("snapshots/1").await.unwrap();
        s.backends()[1].put("snapshots/1", Bytes::from_static(b"rot")).await.unwrap();
        let v = exactly(data.clone());
        let found = s.scrub_object("snapshots/1", &v, false).await;
        assert_eq!(
            found,
            ScrubOutcome {
                copies_ok: 1,
                copies_bad: 1,
                copies_missing: 1,
                copies_unreachable: 0,
                repaired: 0,
                unrepairable: false
            }
        );
        let fixed = s.scrub_object("snapshots/1", &v, true).await;
        assert_eq!(fixed.repaired, 2);
        assert!(s.scrub_object("snapshots/1", &v, false).await.is_healthy());
        assert!(s.scrub_object("snapshots/1", &|_| false, true).await.unrepairable);

        // Erasure: a stale parity shard with a valid trailer is caught by re-encoding.
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        let data = pack(1001, 2);
        s.put_pack("packs/s/1", data.clone()).await.unwrap();
        let other = Codec::new(2, 1).unwrap().encode(&pack(1001, 99)).unwrap();
        s.backends()[s.shard_backend("packs/s/1", 2)].put("packs/s/1.s2", other[2].clone()).await.unwrap();
        let v = exactly(data.clone());
        let found = s.scrub_pack("packs/s/1", 1001, &v, true).await;
        assert_eq!(
            (found.copies_ok, found.copies_bad, found.copies_missing, found.repaired),
            (2, 1, 0, 1),
            "{found:?}"
        );
        assert!(s.scrub_pack("packs/s/1", 1001, &v, false).await.is_healthy());
        // With only k shards left and one of them stale, nothing good can be rebuilt.
        s.backends()[s.shard_backend("packs/s/1", 2)].put("packs/s/1.s2", other[2].clone()).await.unwrap();
        s.backends()[s.shard_backend("packs/s/1", 0)].delete("packs/s/1.s0").await.unwrap();
        assert!(s.scrub_pack("packs/s/1", 1001, &v, true).await.unrepairable);

        // 4+2: a missing data shard and a stale parity shard, rebuilt from the other four.
        let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
        s.put_pack("packs/s/1", data.clone()).await.unwrap();
        let other = Codec::new(4, 2).unwrap().encode(&pack(1001, 99)).unwrap();
        s.backends()[s.shard_backend("packs/s/1", 5)].put("packs/s/1.s5", other[5].clone()).await.unwrap();
        s.backends()[s.shard_backend("packs/s/1", 0)].delete("packs/s/1.s0").await.unwrap();
        let found = s.scrub_pack("packs/s/1", 1001, &v, true).await;
        assert_eq!(
            (found.copies_ok, found.copies_bad, found.copies_missing, found.repaired),
            (4, 1, 1, 2),
            "{found:?}"
        );
        assert!(s.scrub_pack("packs/s/1", 1001, &v, false).await.is_healthy());
        let lost = s.scrub_pack("packs/s/none", 1001, &v, true).await;
        assert!(lost.unrepairable && lost.copies_missing == 6, "{lost:?}");
    }

    #[tokio::test]
    async fn list_folds_shards_and_tolerates_failures() {
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        s.put_pack("packs/ab/p1", pack(100, 1)).await.unwrap();
        s.put_pack("packs/cd/p2", pack(10, 1)).await.unwrap();
        s.put_object("config", Bytes::from_static(b"c")).await.unwrap();
        let packs = s.list("packs/").await.unwrap();
        assert_eq!(
            packs,
            vec![
                ObjectInfo { key: "packs/ab/p1".into(), size: 50 + TRAILER_LEN as u64 },
                ObjectInfo { key: "packs/cd/p2".into(), size: 5 + TRAILER_LEN as u64 }
            ]
        );
        assert_eq!(s.list("").await.unwrap().len(), 3);
        s.backends()[0].inject_fault(Some(Fault::Down));
        assert_eq!(s.list("packs").await.unwrap().len(), 2, "one backend lost is tolerated");
        s.backends()[1].inject_fault(Some(Fault::Down));
        let err = s.list("packs").await.unwrap_err();
        assert!(matches!(err, BackendError::ListIncomplete { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn deletes_remove_every_copy_and_queued_repairs() {
        let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
        s.backends()[s.shard_backend("packs/d/1", 1)].inject_fault(Some(Fault::Down));
        s.put_pack("packs/d/1", pack(100, 1)).await.unwrap();
        assert_eq!(s.pending_repairs(), 1);
        assert!(s.delete_pack("packs/d/1").await.is_err(), "one shard's backend is down");
        assert_eq!(s.pending_repairs(), 0, "no repair resurrects a deleted pack");
        s.put_object("index/d", Bytes::from_static(b"i")).await.unwrap();
        for b in s.backends() {
            b.inject_fault(None);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        s.delete_pack("packs/d/1").await.unwrap();
        s.delete_object("index/d").await.unwrap();
        assert!(s.list("").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn health_reports_each_backend() {
        let backends = (0..3)
            .map(|i| {
                let opts = BackendOptions { breaker_probe_after: Duration::from_secs(60), ..opts() };
                Backend::from_object_store(format!("mem-{i}"), Arc::new(InMemory::new()), opts)
            })
            .collect();
        let s = RedundantStore::new(backends, Redundancy::Replicas(3)).unwrap();
        s.backends()[2].inject_fault(Some(Fault::Down));
        for i in 0..5 {
            let _ = s.put_object(&format!("journal/w/{i}"), Bytes::from_static(b"j")).await;
        }
        let health = s.health();
        assert!(health[0].available && health[0].consecutive_failures == 0);
        assert!(!health[2].available && health[2].consecutive_failures == 5, "{:?}", health[2]);
        assert!(health[2].last_error.as_deref().unwrap_or_default().contains("injected fault"));
    }

    #[tokio::test]
    async fn bad_keys_are_refused_up_front() {
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        for key in ["", "a//b", "../x", "sp ace"] {
            let err = s.put_object(key, Bytes::new()).await.unwrap_err();
            assert!(matches!(err, BackendError::BadKey { .. }), "{key:?}: {err:?}");
            assert!(matches!(s.get_pack(key, 1, &|_| true).await, Err(BackendError::BadKey { .. })));
            assert!(s.scrub_object(key, &|_| true, true).await.unrepairable);
        }
        assert!(matches!(s.list("a//b").await, Err(BackendError::BadKey { .. })));
        assert!(s.health().iter().all(|h| h.consecutive_failures == 0));
    }

    #[test]
    fn futures_are_send() {
        fn send<T: Send>(_: T) {}
        let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
        let v: Verify<'_> = &|_| true;
        send(s.put_object("k", Bytes::new()));
        send(s.put_pack("k", Bytes::new()));
        send(s.get_object("k", v));
        send(s.get_pack_range("k", 1, 0..1, &Some));
        send(s.get_pack("k", 1, v));
        send(s.scrub_object("k", v, true));
        send(s.scrub_pack("k", 1, v, true));
        send(s.run_repairs());
        send(s.list(""));
        send(s.create_object("k", Bytes::new()));
        send(s.check_conditional_create());
        fn sync<T: Send + Sync>(_: &T) {}
        sync(&s);
    }

    /// What happens to one shard in the erasure property test.
    #[derive(Clone, Copy, Debug)]
    enum Damage {
        Delete,
        Corrupt,
        Down,
        CorruptReads,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn any_m_shards_can_fail(
            four_two in any::<bool>(),
            len in 1usize..5000,
            damaged in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..4), 0..3),
            range in (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        ) {
            let (k, m) = if four_two { (4u8, 2u8) } else { (2, 1) };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let s = store((k + m) as usize, Redundancy::Erasure { data: k, parity: m });
                let data = pack(len, len as u8);
                s.put_pack("packs/pp/x", data.clone()).await.unwrap();
                let total = (k + m) as usize;
                let mut hit: Vec<(usize, Damage)> = Vec::new();
                for (idx, how) in damaged.into_iter().take(m as usize) {
                    let i = idx.index(total);
                    if hit.iter().any(|(j, _)| *j == i) {
                        continue;
                    }
                    let how = [Damage::Delete, Damage::Corrupt, Damage::Down, Damage::CorruptReads][how as usize];
                    let b = &s.backends()[s.shard_backend("packs/pp/x", i)];
                    let shard = shard_key("packs/pp/x", i);
                    match how {
                        Damage::Delete => b.delete(&shard).await.unwrap(),
                        Damage::Corrupt => {
                            let mut bytes = b.get(&shard).await.unwrap().to_vec();
                            bytes[0] ^= 0x80;
                            b.put(&shard, Bytes::from(bytes)).await.unwrap();
                        }
                        Damage::Down => b.inject_fault(Some(Fault::Down)),
                        Damage::CorruptReads => b.inject_fault(Some(Fault::CorruptReads)),
                    }
                    hit.push((i, how));
                }
                let a = range.0.index(len) as u64;
                let z = a + 1 + range.1.index(len - a as usize) as u64;
                let want = data.slice(a as usize..z as usize);
                let got = s.get_pack_range("packs/pp/x", len as u64, a..z, &exact_range(want.clone())).await.unwrap();
                assert_eq!(got, want);
                assert_eq!(s.get_pack("packs/pp/x", len as u64, &exactly(data.clone())).await.unwrap(), data);

                let v = exactly(data.clone());
                let scrub = s.scrub_pack("packs/pp/x", len as u64, &v, true).await;
                assert!(!scrub.unrepairable, "{scrub:?}");
                let down = hit.iter().filter(|(_, h)| matches!(h, Damage::Down)).count();
                assert_eq!(scrub.copies_unreachable, down, "{scrub:?} {hit:?}");
                for b in s.backends() {
                    b.inject_fault(None);
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
                let after = s.scrub_pack("packs/pp/x", len as u64, &v, true).await;
                // Shards behind a downed backend were never damaged at rest.
                assert!(after.is_healthy(), "{after:?} after {hit:?}");
            });
        }
    }
}
