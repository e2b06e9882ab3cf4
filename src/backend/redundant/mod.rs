//! [`RedundantStore`]: the store's redundancy (docs/SEMANTICS.md, "With a store") over several [`Backend`]s.
//!
//! - Small objects (config, keys, index segments, heads, journal) are replicated: `Replicas(n)`
//!   keeps `n` copies, `Erasure { data: k, parity: m }` keeps `max(m + 1, min(3, k + m))`
//!   (at least the backend losses the packs survive, and three where possible so a majority
//!   quorum survives losing one backend). Packs are replicated the same way under `Replicas`, and
//!   Reed-Solomon coded under `Erasure` (layout in `backend/erasure.rs`).
//! - Placement is a pure function of the key and the number of backends `B`: starting at
//!   `u64::from_le_bytes(blake3(key)[0..8]) % B`, consecutive backends (copy or shard `i` on
//!   `(start + i) % B`). Nothing has to be looked up to read, and load spreads evenly.
//! - Writes go out in parallel and are acknowledged at a quorum (a majority of the copies;
//!   `k + m - 1` shards, at least `k`, so losing one backend never stops writes). Copies that failed are queued for repair with their bytes
//!   (bounded, see `backend/repair.rs`). Once the quorum is in, stragglers get a grace period (the time
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
//!
//! The store is one [`RedundantStore`] whose methods are spread over files by what they do.
//! This file holds the policy and result types, the store with its constructor and accessors,
//! placement, and the helpers the other files share;
//! - `write.rs`: quorum writes of copies and shards, stragglers, and rewriting copies at once;
//! - `create.rs`: conditional create decided by majority, and the probe that backends honour it;
//! - `read.rs`: verified reads of objects, pack ranges and whole packs, with read repair;
//! - `shards.rs`: fetching, checking, decoding and rewriting the shards of an erasure-coded pack;
//! - `scrub.rs`: checking every copy or shard of a key and, on request, rewriting the bad ones;
//! - `retry.rs`: running the repair queue, and saving it for a later run and restoring it;
//! - `delete.rs`: deleting every copy or shard of a key;
//! - `list.rs`: listings merged over the backends;
//! - `tests.rs`: the unit tests.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::erasure::Codec;
use super::error::BackendError;
use super::limit::SizeLimit;
use super::repair::{DEFAULT_REPAIR_MEMORY, RepairQueue};
use super::single::{Backend, BackendHealth};

mod create;
mod delete;
mod list;
mod read;
mod retry;
mod scrub;
mod shards;
mod write;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests;

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
            // quorum still tolerates losing one backend.
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
    /// The bound of reads whose object's kind this layer does not know (repairs copy whatever
    /// object they were queued for): the largest object the store's formats allow.
    largest_object: SizeLimit,
}

/// One copy or shard read back.
enum CopyState {
    Good(Bytes),
    Bad(String),
    Missing,
    Unreachable(String),
}

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
            largest_object: SizeLimit { max_len: u64::MAX, what: "an object of this store" },
        })
    }

    /// The largest object the owner's formats allow (default: no bound): repairs, which copy
    /// objects of any kind, read no object larger whole.
    pub fn with_largest_object(mut self, max_len: u64) -> RedundantStore {
        self.largest_object.max_len = max_len;
        self
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
