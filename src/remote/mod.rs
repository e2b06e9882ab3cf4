//! Remote metadata: a workspace's metadata in the store, so a new node can restore it.
//!
//! A workspace lives under `ws/<name hash>/` of its store (docs/FORMAT.md, "Workspaces"):
//!
//! ```text
//! j/<segment>     journal segments: numbered batches of metadata changes, created with
//!                 If-None-Match so a segment number can be taken once only (the fence)
//! cp/<seq>        checkpoints: the whole metadata after batch <seq>, as a list of parts
//! part/<hash>     checkpoint parts, content addressed (unchanged parts are not re-uploaded)
//! snap/<id>       snapshots: a checkpoint with a name, a message and a time
//! lease           who writes the workspace, until when
//! hot             the hot set: the chunks the last node held, for the next node's refill
//! ```
//!
//! Invariants:
//! - the journal is one chain of consecutive segment numbers; a writer appends segment `n`
//!   only with a conditional create, so two writers can never both extend the chain, and a
//!   writer that finds its next number taken stops (another writer took over);
//! - a segment only names blocks that are already in the store (chunk records are committed
//!   after their pack), so restoring any prefix of the chain never names a missing block;
//! - a checkpoint at batch `s` with next segment `g` holds every batch `≤ s`; batches after
//!   `s` are in segments `≥ g`. Restore = newest checkpoint, then segments from `g` on, in
//!   order, until the first missing number, skipping batches `≤ s`;
//! - every batch carries its commit time (format 4) and compaction keeps, from the newest
//!   checkpoint older than the retention window on, everything a point-in-time restore to a
//!   time inside the window reads (`at`);
//! - every object is sealed (AES-256-GCM, kind and name bound), names reveal nothing.

mod at;
mod committer;
mod diff;
mod gc;
mod lease;
mod trash;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, CreateOutcome};
use crate::crypto::{CryptoError, ObjectKind};
use crate::meta::journal::{Decoder, MIN_BATCH_LEN};
use crate::meta::{JournalBatch, JournalError, JournalOp, MetaError, MetaStore};
use crate::store::{Fencing, Store, StoreError, WholeObject};
use crate::types::ErrorKind;
pub use at::{AtReport, JournalSpan, PointKind, Timeline, TimelinePoint, rfc3339_ms};
pub use committer::{Committer, RemoteStats};
pub use diff::{Change, diff};
pub use gc::{ForgetReport, GcReport, KeepPolicy, gc};
pub use lease::{Lease, LeaseRecord};
pub use trash::{EntryKind, Removal, TrashEntry};

/// Format version of segments, checkpoints and snapshots. Version 2: the inode records they
/// carry may be of layout version 2; version 3: the chunk records, too; version 4: segments
/// carry each batch's commit time and manifests the time of their state (docs/FORMAT.md).
/// Objects of earlier versions are still read.
pub const REMOTE_FORMAT: u32 = 4;
/// The first format whose segments carry batch times.
const TIMED_FORMAT: u32 = 4;

use crate::store::limits::MAX_PART_BYTES;
pub use crate::store::limits::MAX_SEGMENT_BYTES;
/// How far back point-in-time restore reaches by default: the journal and checkpoints a
/// restore to any time this recent needs are kept (by compaction and by `tierfs gc`).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 86_400);
/// A checkpoint part ends after about 1024 entries (content-defined: where a key hash has ten
/// zero bits), or at MAX_PART_BYTES.
const PART_MASK: u16 = 0x03ff;

/// Why a remote metadata operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("{what} in the store is damaged or not a tierfs object: {reason}")]
    Corrupt { what: String, reason: String },
    #[error(
        "{what} was written by a newer tierfs (format {found}, this one reads up to {REMOTE_FORMAT}): upgrade tierfs"
    )]
    TooNew { what: String, found: u32 },
    #[error("workspace {workspace:?} is in use by {holder} until {expires} (lease renewed while it runs)")]
    Held { workspace: String, holder: String, expires: String },
    #[error(
        "another writer ({holder}) took over workspace {workspace:?}: this node stopped writing to the store; \
         changes made here after the takeover are only on this node"
    )]
    TakenOver { workspace: String, holder: String },
    /// Another node wrote the workspace since this node last did, and everything this node
    /// wrote is in the store: its local state can be dropped and restored.
    #[error(
        "this node's copy of workspace {workspace:?} is older than the store's (batch {local} here, {remote} in \
         the store): another node wrote it since"
    )]
    StaleLocal { workspace: String, local: u64, remote: u64 },
    #[error(
        "workspace {workspace:?} diverged: this node has changes that never reached the store (batches {durable}..{local}), \
         and another node wrote the store since (up to batch {remote}). tierfs will not merge them: an empty data dir \
         takes the store's state (this node's unsynced changes are then lost)"
    )]
    Diverged { workspace: String, durable: u64, local: u64, remote: u64 },
    /// The store is behind what this node saw it hold: objects were deleted or put back
    /// (a rolled-back bucket, a lagging replica, a deleter without the key).
    #[error(
        "workspace {workspace:?}: the store holds batches up to {store}, but {witness} saw it hold up to {seen}: it \
         went back in time (objects deleted or put back). Nothing was changed. Find out why; a writer mounted with \
         `--accept-rollback` takes the store's state as it is now, dropping this node's copy (a follower keeps what \
         it shows until it is mounted again)"
    )]
    RolledBack { workspace: String, witness: String, seen: u64, store: u64 },
    #[error("no snapshot {0:?} in this workspace")]
    NoSnapshot(String),
    /// The committer stopped for good earlier (another writer took over, …): the error it
    /// stopped on, with its kind.
    #[error(transparent)]
    Stopped(JournalError),
    /// A point-in-time restore asked for a time that has not come yet.
    #[error("{at} is in the future (it is {now} now): there is nothing to restore at that time yet")]
    AtInFuture { at: String, now: String },
    /// A point-in-time restore asked for a time the store no longer (or never) holds.
    #[error("workspace {workspace:?} cannot be restored to {at}: {why}")]
    AtUnavailable { workspace: String, at: String, why: String },
    #[error(
        "workspace {workspace:?} is in use by {holder}, which is still renewing its lease: this store is fenced by \
         lease only (its servers ignore conditional writes), so a live writer cannot be taken over; unmount it \
         there, or stop that node, and mount again"
    )]
    StillRenewing { workspace: String, holder: String },
}

impl RemoteError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RemoteError::Store(e) => e.kind(),
            RemoteError::Backend(e) => e.kind(),
            RemoteError::Meta(e) => e.kind(),
            RemoteError::Corrupt { .. } => ErrorKind::Corrupt,
            RemoteError::TooNew { .. } => ErrorKind::InvalidInput,
            RemoteError::Held { .. } | RemoteError::TakenOver { .. } | RemoteError::StillRenewing { .. } => {
                ErrorKind::Fenced
            }
            RemoteError::StaleLocal { .. } | RemoteError::Diverged { .. } => ErrorKind::Conflict,
            RemoteError::RolledBack { .. } => ErrorKind::Corrupt,
            RemoteError::NoSnapshot(_) | RemoteError::AtUnavailable { .. } => ErrorKind::NotFound,
            RemoteError::AtInFuture { .. } => ErrorKind::InvalidInput,
            RemoteError::Stopped(e) => e.kind(),
        }
    }
}

impl From<CryptoError> for RemoteError {
    fn from(e: CryptoError) -> RemoteError {
        RemoteError::Store(StoreError::Crypto(e))
    }
}

type Result<T> = std::result::Result<T, RemoteError>;

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The header of a journal segment (JSON, inside the sealed object).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SegmentHeader {
    format: u32,
    segment: u64,
    /// The writer session that appended it.
    session: String,
    holder: String,
    created_unix: u64,
    batches: u32,
    /// Format 4: the batches' commit times, the first in unix milliseconds, each next one as
    /// the milliseconds after the one before it. Older segments have none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    batch_ms: Vec<u64>,
}

/// A checkpoint or snapshot: the parts that hold the metadata after batch `seq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The last batch the parts contain.
    pub seq: u64,
    /// Batches after `seq` are in journal segments from this number on.
    pub next_segment: u64,
    pub parts: Vec<String>,
    pub entries: u64,
    pub created_unix: u64,
    /// Snapshots only.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// Journal segments below this number have been deleted (compaction's progress).
    #[serde(default)]
    pub compacted_below: u64,
    /// Format 4: the time (unix milliseconds, by the writer's journal clock) the state it
    /// holds was current at: every batch `≤ seq` was committed at or before it.
    #[serde(default)]
    pub state_unix_ms: Option<u64>,
}

impl Manifest {
    /// The time its state was current at; for a manifest from before format 4, the end of the
    /// second it was written in (its state cannot be younger).
    pub fn state_ms(&self) -> u64 {
        self.state_unix_ms.unwrap_or_else(|| self.created_unix.saturating_mul(1000).saturating_add(999))
    }
}

/// One snapshot, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub id: String,
    pub seq: u64,
    pub created_unix: u64,
    pub message: Option<String>,
    pub entries: u64,
}

/// What a checkpoint cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointReport {
    pub seq: u64,
    pub entries: u64,
    pub parts: u64,
    pub parts_uploaded: u64,
    pub bytes_uploaded: u64,
}

/// Where a restore or an open left the chain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainState {
    /// The last batch the store has.
    pub remote_seq: u64,
    /// The next free segment number.
    pub next_segment: u64,
    /// Segments read (replayed or scanned).
    pub segments: u64,
    /// Entries imported from a checkpoint (restore only).
    pub entries: u64,
    /// The newest checkpoint's next segment (1 without a checkpoint): segments before it are
    /// not needed by a restore.
    pub checkpoint_next_segment: u64,
    /// Journal segments below this number are deleted already.
    pub compacted_below: u64,
}

/// A follower's place in the chain: the next segment it reads and the last batch it applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainPoint {
    pub next_segment: u64,
    pub seq: u64,
}

impl From<ChainState> for ChainPoint {
    fn from(s: ChainState) -> ChainPoint {
        ChainPoint { next_segment: s.next_segment, seq: s.remote_seq }
    }
}

/// A newer head of the workspace than a follower's ([`Workspace::head_after`]).
#[derive(Debug)]
pub struct NewHead {
    /// Where the chain ends now.
    pub point: ChainPoint,
    /// With `whole == false`, the changes since the follower's place, in order; with
    /// `whole == true`, a checkpoint's entries (all puts) and the changes after it: they
    /// replace the follower's whole state.
    pub ops: Vec<JournalOp>,
    pub whole: bool,
}

/// A workspace of a store.
pub struct Workspace {
    store: Arc<Store>,
    name: String,
    prefix: String,
    /// Parts known to be in the store (so checkpoints upload only new ones).
    known_parts: Mutex<Option<HashSet<String>>>,
}

impl Workspace {
    /// How this workspace's store keeps writers to one (see [`Fencing`]).
    pub fn fencing(&self) -> Fencing {
        self.store.config().fencing
    }

    pub fn new(store: Arc<Store>, name: &str) -> Workspace {
        let h = store.keys().name_hash("workspace", name.as_bytes());
        let prefix = format!("ws/{}/", hex::encode(&h[..16]));
        Workspace { store, name: name.to_string(), prefix, known_parts: Mutex::new(None) }
    }

    /// A workspace known only by its store prefix (`ws/<hash>/`), e.g. for `tierfs gc`,
    /// which sees every workspace of a store but not their names.
    pub fn at_prefix(store: Arc<Store>, hash: &str) -> Workspace {
        Workspace { store, name: format!("ws/{hash}"), prefix: format!("ws/{hash}/"), known_parts: Mutex::new(None) }
    }

    /// The hashes of every workspace that has objects in `store`.
    pub async fn list_all(store: &Store) -> Result<Vec<String>> {
        let mut out: Vec<String> = store
            .backend()
            .list("ws/")
            .await?
            .iter()
            .filter_map(|o| o.key.strip_prefix("ws/").and_then(|r| r.split('/').next()).map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    fn segment_key(&self, n: u64) -> String {
        format!("{}j/{n:016x}", self.prefix)
    }

    fn checkpoint_key(&self, seq: u64) -> String {
        format!("{}cp/{seq:016x}", self.prefix)
    }

    fn part_key(&self, id: &str) -> String {
        format!("{}part/{id}", self.prefix)
    }

    fn snapshot_key(&self, id: &str) -> String {
        format!("{}snap/{id}", self.prefix)
    }

    fn history_key(&self, seq: u64) -> String {
        format!("{}hist/{seq:016x}", self.prefix)
    }

    fn hot_set_key(&self) -> String {
        format!("{}hot", self.prefix)
    }

    fn lease_key(&self) -> String {
        format!("{}lease", self.prefix)
    }

    /// The names under `dir` of this workspace (keys without the prefix), sorted.
    async fn list_names(&self, dir: &str) -> Result<Vec<String>> {
        self.list_names_after(dir, None).await
    }

    /// The names under `dir` that sort after `after` (a name under `dir`).
    async fn list_names_after(&self, dir: &str, after: Option<&str>) -> Result<Vec<String>> {
        let prefix = format!("{}{dir}", self.prefix);
        let after = after.map(|a| format!("{prefix}{a}"));
        Ok(self
            .store
            .backend()
            .list_after(&prefix, after.as_deref())
            .await?
            .into_iter()
            .filter_map(|o| o.key.strip_prefix(&prefix).map(str::to_string))
            .collect())
    }

    /// Numbers after `dir` in the keys under it (hex), sorted.
    async fn list_numbers(&self, dir: &str) -> Result<Vec<u64>> {
        self.list_numbers_from(dir, 0).await
    }

    /// The numbers `≥ from` under `dir`: the server skips the smaller ones.
    async fn list_numbers_from(&self, dir: &str, from: u64) -> Result<Vec<u64>> {
        let after = from.checked_sub(1).map(|n| format!("{n:016x}"));
        let mut out: Vec<u64> = self
            .list_names_after(dir, after.as_deref())
            .await?
            .iter()
            .filter_map(|n| u64::from_str_radix(n, 16).ok())
            .filter(|&n| n >= from)
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Reads and opens a sealed object of `kind`, an object `whole` is; `None` if it does not
    /// exist. Bigger than `whole` allows is `Corrupt`, and not read.
    async fn get_sealed(&self, kind: ObjectKind, whole: WholeObject, key: &str) -> Result<Option<Vec<u8>>> {
        let keys = self.store.keys();
        let verify = |b: &[u8]| keys.open(kind, key.as_bytes(), b).is_ok();
        match self.store.backend().get_object(key, whole.limit(), &verify).await {
            Ok(bytes) => Ok(Some(keys.open(kind, key.as_bytes(), &bytes)?)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// [`Self::get_sealed`] of what a majority of the object's copies hold
    /// (`RedundantStore::get_object_majority`): for the reads that decide who owns a segment
    /// or holds the lease, where a minority copy (a lost create's, a lagging replica's) must
    /// not answer.
    pub(crate) async fn get_sealed_majority(
        &self,
        kind: ObjectKind,
        whole: WholeObject,
        key: &str,
    ) -> Result<Option<Vec<u8>>> {
        let keys = self.store.keys();
        let verify = |b: &[u8]| keys.open(kind, key.as_bytes(), b).is_ok();
        match self.store.backend().get_object_majority(key, whole.limit(), &verify).await? {
            Some(bytes) => Ok(Some(keys.open(kind, key.as_bytes(), &bytes)?)),
            None => Ok(None),
        }
    }

    async fn put_sealed(&self, kind: ObjectKind, whole: WholeObject, key: &str, plain: &[u8]) -> Result<()> {
        let sealed = self.store.keys().seal(kind, key.as_bytes(), plain);
        whole.check(key, sealed.len())?;
        self.store.backend().put_object(key, Bytes::from(sealed)).await?;
        Ok(())
    }

    // ---- history objects --------------------------------------------------------------

    /// Stores history object `seq` (its bytes are the history module's); `false` if another
    /// writer stored `seq` first.
    pub async fn create_history(&self, seq: u64, plain: &[u8]) -> Result<bool> {
        let key = self.history_key(seq);
        if self.fencing() == Fencing::Lease && self.get_history(seq).await?.is_some() {
            // The servers would overwrite: look first.
            return Ok(false);
        }
        let sealed = self.store.keys().seal(ObjectKind::History, key.as_bytes(), plain);
        WholeObject::History.check(&key, sealed.len())?;
        Ok(matches!(self.store.backend().create_object(&key, Bytes::from(sealed)).await?, CreateOutcome::Created))
    }

    /// History object `seq`, opened; `None` if there is none.
    pub async fn get_history(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        self.get_sealed(ObjectKind::History, WholeObject::History, &self.history_key(seq)).await
    }

    /// The numbers `>= from` of the history objects in the store, in order.
    pub async fn history_numbers_from(&self, from: u64) -> Result<Vec<u64>> {
        self.list_numbers_from("hist/", from).await
    }

    // ---- the hot set ------------------------------------------------------------------

    /// Stores the workspace's hot set (its bytes are the cold tier's), replacing the last one.
    /// Only a hint for the next node's refill: a stale writer's copy costs a worse refill,
    /// never data.
    pub async fn put_hot_set(&self, plain: &[u8]) -> Result<()> {
        self.put_sealed(ObjectKind::HotSet, WholeObject::HotSet, &self.hot_set_key(), plain).await
    }

    /// The workspace's hot set, opened; `None` if no node wrote one.
    pub async fn get_hot_set(&self) -> Result<Option<Vec<u8>>> {
        self.get_sealed(ObjectKind::HotSet, WholeObject::HotSet, &self.hot_set_key()).await
    }

    // ---- journal segments -------------------------------------------------------------

    /// Appends segment `n` with `batches`; `false` if the number was already taken by
    /// another writer (the chain has moved on without this writer).
    pub async fn append_segment(&self, n: u64, session: &str, holder: &str, batches: &[JournalBatch]) -> Result<bool> {
        let plain = encode_segment(n, session, holder, unix_now(), batches)?;
        let key = self.segment_key(n);
        if self.fencing() == Fencing::Lease {
            // The servers would overwrite: look first (this session's own copy of `n`, from
            // an earlier try, counts as written).
            if let Some((session_of_n, _)) = self.segment_owner(n).await? {
                return Ok(session_of_n == session);
            }
        }
        let sealed = self.store.keys().seal(ObjectKind::Journal, key.as_bytes(), &plain);
        WholeObject::JournalSegment.check(&key, sealed.len())?;
        match self.store.backend().create_object(&key, Bytes::from(sealed)).await? {
            CreateOutcome::Created => Ok(true),
            // Taken, by another session or by this one: an earlier try of this create that
            // reached the store and lost its answer (a dropped connection; the backend then
            // tried again). This session's own copy counts as written, not as a takeover.
            // Read from a majority: this session's own copy made on the way may be a minority one.
            CreateOutcome::Exists => Ok(self.segment_owner(n).await?.is_some_and(|(s, _)| s == session)),
        }
    }

    async fn read_segment(&self, n: u64) -> Result<Option<(SegmentHeader, Vec<JournalBatch>)>> {
        self.read_segment_from(n, false).await
    }

    /// [`Self::read_segment`]; with `majority`, of what a majority of its copies hold.
    async fn read_segment_from(&self, n: u64, majority: bool) -> Result<Option<(SegmentHeader, Vec<JournalBatch>)>> {
        let key = self.segment_key(n);
        let (kind, whole) = (ObjectKind::Journal, WholeObject::JournalSegment);
        let read = if majority {
            self.get_sealed_majority(kind, whole, &key).await?
        } else {
            self.get_sealed(kind, whole, &key).await?
        };
        let Some(plain) = read else {
            return Ok(None);
        };
        parse_segment(n, &key, &plain).map(Some)
    }

    /// Who appended segment `n`, if it exists.
    pub async fn segment_writer(&self, n: u64) -> Result<Option<(String, String)>> {
        Ok(self.read_segment(n).await?.map(|(h, _)| (h.session, h.holder)))
    }

    /// [`Self::segment_writer`] as a majority of the segment's copies say: who owns it.
    async fn segment_owner(&self, n: u64) -> Result<Option<(String, String)>> {
        Ok(self.read_segment_from(n, true).await?.map(|(h, _)| (h.session, h.holder)))
    }

    // ---- checkpoints ----------------------------------------------------------------

    /// Writes the metadata of `meta` as a checkpoint (and, with `snapshot`, as a named
    /// snapshot with that message). Only parts the store does not have are uploaded.
    pub async fn checkpoint(
        &self,
        meta: &MetaStore,
        snapshot: Option<Option<String>>,
        compacted_below: u64,
    ) -> Result<(Manifest, CheckpointReport)> {
        let keys = self.store.keys();
        // Cut the export into parts at content-defined boundaries: a change moves only the
        // boundaries next to it, so an unchanged region gives byte-identical parts.
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = Vec::new();
        let mut entries = 0u64;
        let (seq, next_segment) = meta.export(|k, v| {
            JournalOp::Put { key: k.to_vec(), value: v.to_vec() }.encode(&mut cur);
            entries += 1;
            let h = keys.name_hash("cut", k);
            if u16::from_le_bytes([h[0], h[1]]) & PART_MASK == 0 || cur.len() >= MAX_PART_BYTES {
                parts.push(std::mem::take(&mut cur));
            }
            Ok(())
        })?;
        if !cur.is_empty() {
            parts.push(cur);
        }
        // Read after the cut: every batch it holds was stamped at or before this time.
        let state_unix_ms = meta.journal().now_ms();
        let known = self.known_parts().await?;
        let ids: Vec<String> = parts.iter().map(|p| hex::encode(keys.name_hash("part", p))).collect();
        let todo: Vec<(String, Vec<u8>)> =
            ids.iter().zip(parts).filter(|(id, _)| !known.contains(*id)).map(|(id, p)| (id.clone(), p)).collect();
        let mut report = CheckpointReport {
            seq,
            entries,
            parts: ids.len() as u64,
            parts_uploaded: todo.len() as u64,
            bytes_uploaded: 0,
        };
        let uploaded: Vec<(String, usize)> = stream::iter(todo)
            .map(|(id, p)| async move {
                let key = self.part_key(&id);
                self.put_sealed(ObjectKind::Metadata, WholeObject::CheckpointPart, &key, &p).await?;
                Ok::<_, RemoteError>((id, p.len()))
            })
            .buffer_unordered(8)
            .try_collect()
            .await?;
        {
            let mut guard = self.known_parts.lock();
            let set = guard.get_or_insert_with(HashSet::new);
            for (id, len) in uploaded {
                report.bytes_uploaded += len as u64;
                set.insert(id);
            }
        }
        let mut manifest = Manifest {
            format: REMOTE_FORMAT,
            seq,
            next_segment,
            parts: ids,
            entries,
            created_unix: unix_now(),
            id: None,
            message: None,
            compacted_below,
            state_unix_ms: Some(state_unix_ms),
        };
        let body = |m: &Manifest| serde_json::to_vec(m).expect("a manifest serializes");
        let cp = self.checkpoint_key(seq);
        let cp_body = body(&manifest);
        report.bytes_uploaded += cp_body.len() as u64;
        self.put_sealed(ObjectKind::Head, WholeObject::Checkpoint, &cp, &cp_body).await?;
        if let Some(message) = snapshot {
            let id = snapshot_id(seq);
            manifest.id = Some(id.clone());
            manifest.message = message;
            let snap_body = body(&manifest);
            report.bytes_uploaded += snap_body.len() as u64;
            self.put_sealed(ObjectKind::Snapshot, WholeObject::Snapshot, &self.snapshot_key(&id), &snap_body).await?;
        }
        Ok((manifest, report))
    }

    async fn known_parts(&self) -> Result<HashSet<String>> {
        if let Some(k) = self.known_parts.lock().clone() {
            return Ok(k);
        }
        let set: HashSet<String> = self.list_names("part/").await?.into_iter().collect();
        *self.known_parts.lock() = Some(set.clone());
        Ok(set)
    }

    async fn read_manifest(
        &self,
        kind: ObjectKind,
        whole: WholeObject,
        key: &str,
        what: &str,
    ) -> Result<Option<Manifest>> {
        let Some(plain) = self.get_sealed(kind, whole, key).await? else { return Ok(None) };
        decode_manifest(what, &plain).map(Some)
    }

    /// The newest checkpoint, if any.
    async fn latest_checkpoint(&self) -> Result<Option<Manifest>> {
        for seq in self.list_numbers("cp/").await?.into_iter().rev() {
            let key = self.checkpoint_key(seq);
            if let Some(m) = self
                .read_manifest(ObjectKind::Head, WholeObject::Checkpoint, &key, &format!("checkpoint {seq}"))
                .await?
            {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// Reads every part of `manifest` and calls `f` with each part's entries, in order.
    async fn for_each_part(&self, manifest: &Manifest, mut f: impl FnMut(Vec<JournalOp>) -> Result<()>) -> Result<u64> {
        let keys = self.store.keys();
        let mut parts = stream::iter(manifest.parts.iter().cloned())
            .map(|id| async move {
                let key = self.part_key(&id);
                let plain = self
                    .get_sealed(ObjectKind::Metadata, WholeObject::CheckpointPart, &key)
                    .await?
                    .ok_or_else(|| RemoteError::Corrupt {
                        what: format!("checkpoint {}", manifest.seq),
                        reason: format!("part {id} is missing"),
                    })?;
                if hex::encode(keys.name_hash("part", &plain)) != id {
                    return Err(RemoteError::Corrupt {
                        what: format!("part {id}"),
                        reason: "content hash mismatch".into(),
                    });
                }
                Ok::<_, RemoteError>(plain)
            })
            .buffered(8);
        let mut entries = 0u64;
        while let Some(plain) = parts.next().await {
            let ops = decode_part(manifest.seq, &plain?)?;
            entries += ops.len() as u64;
            f(ops)?;
        }
        Ok(entries)
    }

    /// Imports the parts of `manifest` into `meta` (which must be empty).
    async fn import_manifest(&self, meta: &MetaStore, manifest: &Manifest) -> Result<u64> {
        self.for_each_part(manifest, |ops| Ok(meta.import(&ops, manifest.seq)?)).await
    }

    /// Replays segments from `from` on (batches after `after` only), handing each batch to
    /// `apply`, until the first missing segment number.
    async fn replay(
        &self,
        from: u64,
        after: u64,
        mut apply: impl FnMut(JournalBatch) -> Result<()>,
    ) -> Result<ChainState> {
        let listed: Vec<u64> = self.list_numbers_from("j/", from).await?;
        // Consecutive numbers from `from`: a gap ends the chain (an abandoned number).
        let chain: Vec<u64> =
            listed.iter().enumerate().take_while(|(i, n)| **n == from + *i as u64).map(|(_, n)| *n).collect();
        let mut state = ChainState {
            remote_seq: after,
            next_segment: from,
            segments: 0,
            entries: 0,
            checkpoint_next_segment: from,
            compacted_below: 0,
        };
        let mut segs = stream::iter(chain).map(|n| async move { (n, self.read_segment(n).await) }).buffered(16);
        while let Some((n, seg)) = segs.next().await {
            let Some((_, batches)) = seg? else { break };
            for b in batches {
                if b.seq <= state.remote_seq {
                    continue;
                }
                state.remote_seq = b.seq;
                apply(b)?;
            }
            state.next_segment = n + 1;
            state.segments += 1;
        }
        Ok(state)
    }

    /// The oldest checkpoint a restore inside the retention window starts from: the newest
    /// one before checkpoint `newest_seq` whose state is at or before `keep_after_ms`.
    /// `None`: none is that old, and the whole journal stays.
    ///
    /// A binary search over the checkpoints (their state times grow with their numbers), so a
    /// window holding many costs a few reads: any anchor whose state is old enough is safe (a
    /// restore to a time in the window can start from it), the newest such keeps the least.
    pub async fn retention_anchor(&self, newest_seq: u64, keep_after_ms: u64) -> Result<Option<Manifest>> {
        let seqs: Vec<u64> = self.list_numbers("cp/").await?.into_iter().filter(|&s| s < newest_seq).collect();
        let (mut lo, mut hi, mut found) = (0, seqs.len(), None);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let key = self.checkpoint_key(seqs[mid]);
            let what = format!("checkpoint {}", seqs[mid]);
            match self.read_manifest(ObjectKind::Head, WholeObject::Checkpoint, &key, &what).await? {
                Some(m) if m.state_ms() <= keep_after_ms => {
                    found = Some(m);
                    lo = mid + 1;
                }
                // Too young, or gone (deleted by a compaction meanwhile): look older.
                _ => hi = mid,
            }
        }
        Ok(found)
    }

    /// Deletes what no restore reads any more: journal segments `from..below` (by number: no
    /// listing) and the checkpoints up to `newest_seq` but the newest two of them and those
    /// from `keep_seq` on (the retention window's). A newer checkpoint (one written while this
    /// compaction ran in the background) is kept.
    pub async fn compact(&self, from: u64, below: u64, newest_seq: u64, keep_seq: u64) -> Result<()> {
        let backend = self.store.backend();
        let segments = (from..below).map(|n| self.segment_key(n));
        let checkpoints: Vec<u64> = self.list_numbers("cp/").await?;
        // Keep the newest and the one before it.
        let keep: Vec<u64> = checkpoints.iter().copied().filter(|&s| s <= newest_seq).rev().take(2).collect();
        let old_cps = checkpoints
            .into_iter()
            .filter(|&s| s <= newest_seq && s < keep_seq && !keep.contains(&s))
            .map(|s| self.checkpoint_key(s));
        let doomed: Vec<String> = segments.chain(old_cps).collect();
        stream::iter(doomed)
            .map(|key| async move { backend.delete_object(&key).await })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Restores the workspace's latest state into the empty `meta`. An empty workspace (never
    /// written) restores to nothing and starts the chain at segment 1.
    pub async fn restore(&self, meta: &MetaStore) -> Result<ChainState> {
        self.read_latest(Some(meta)).await
    }

    /// Where the store's chain ends, without changing anything locally.
    pub async fn chain_state(&self) -> Result<ChainState> {
        self.read_latest(None).await
    }

    /// Reads the newest checkpoint and the journal after it, applying both to `meta` if given
    /// (each import records its batch number there).
    async fn read_latest(&self, meta: Option<&MetaStore>) -> Result<ChainState> {
        let (after, from, compacted, entries) = match self.latest_checkpoint().await? {
            Some(m) => {
                let entries = match meta {
                    Some(meta) => self.import_manifest(meta, &m).await?,
                    None => 0,
                };
                (m.seq, m.next_segment, m.compacted_below, entries)
            }
            None => (0, 1, 0, 0),
        };
        let mut state = self
            .replay(from, after, |b| match meta {
                Some(meta) => Ok(meta.import(&b.ops, b.seq)?),
                None => Ok(()),
            })
            .await?;
        state.entries = entries;
        state.compacted_below = compacted;
        Ok(state)
    }

    /// What the store holds past `at` (a follower's place in the chain): the batches of the
    /// segments from `at.next_segment` on, or, when the writer compacted the journal past
    /// that segment or a checkpoint covered batches no segment holds, the newest checkpoint's
    /// whole state and the segments after it. `None`: nothing new (yet). Costs one listing of the journal while nothing changed, plus one of the
    /// checkpoints when the follower's next segment is not there.
    ///
    /// A store that went back in time past `at` is an error ([`RemoteError::RolledBack`]): the
    /// segment `at` was read from is gone while no checkpoint covers `at.seq` (compaction
    /// removes a segment only once a checkpoint covers it). The follower keeps what it has.
    pub async fn head_after(&self, at: ChainPoint) -> Result<Option<NewHead>> {
        // From the segment `at` was read from, to see that it is still there: one listing.
        let last_read = at.next_segment.checked_sub(1).filter(|_| at.seq > 0);
        let mut listed = self.list_numbers_from("j/", last_read.unwrap_or(at.next_segment)).await?;
        let last_read_there = last_read.is_none_or(|n| listed.first() == Some(&n));
        listed.retain(|&n| n >= at.next_segment);
        if listed.first() == Some(&at.next_segment) {
            if let Some((point, ops)) = self.replay_dense(at).await? {
                return Ok((point != at).then_some(NewHead { point, ops, whole: false }));
            }
            // A gap: a checkpoint covered batches that never went into a segment.
        } else {
            // Nobody wrote since, or the journal was compacted past this follower's place.
            let newest = self.list_numbers("cp/").await?.last().copied().unwrap_or(0);
            if !last_read_there && newest < at.seq {
                let workspace = self.name().to_string();
                let witness = "this follower".to_string();
                return Err(RemoteError::RolledBack { workspace, witness, seen: at.seq, store: newest });
            }
            if newest <= at.seq {
                return Ok(None);
            }
        }
        let Some(m) = self.latest_checkpoint().await? else { return Ok(None) };
        if m.seq <= at.seq {
            // The checkpoint that covers the gap is still being written: the next look.
            return Ok(None);
        }
        let mut ops = Vec::new();
        self.for_each_part(&m, |part| {
            ops.extend(part);
            Ok(())
        })
        .await?;
        let Some((point, after)) = self.replay_dense(ChainPoint { next_segment: m.next_segment, seq: m.seq }).await?
        else {
            return Ok(None);
        };
        ops.extend(after);
        Ok(Some(NewHead { point, ops, whole: true }))
    }

    /// The ops of the batches after `at`, read from its next segment on, and where they end;
    /// `None` if their numbers do not follow `at.seq` without a gap. Batch numbers are dense,
    /// but a checkpoint may cover batches that never went into a segment, and only that
    /// checkpoint holds them.
    async fn replay_dense(&self, at: ChainPoint) -> Result<Option<(ChainPoint, Vec<JournalOp>)>> {
        let (mut ops, mut expected, mut gap) = (Vec::new(), at.seq + 1, false);
        let state = self
            .replay(at.next_segment, at.seq, |b| {
                gap |= b.seq != expected;
                if !gap {
                    expected += 1;
                    ops.extend(b.ops);
                }
                Ok(())
            })
            .await?;
        Ok((!gap).then_some((ChainPoint { next_segment: state.next_segment, seq: state.remote_seq }, ops)))
    }

    /// Restores snapshot `id` into the empty `meta`.
    pub async fn restore_snapshot(&self, meta: &MetaStore, id: &str) -> Result<Manifest> {
        let m = self
            .read_manifest(
                ObjectKind::Snapshot,
                WholeObject::Snapshot,
                &self.snapshot_key(id),
                &format!("snapshot {id}"),
            )
            .await?
            .ok_or_else(|| RemoteError::NoSnapshot(id.to_string()))?;
        self.import_manifest(meta, &m).await?;
        Ok(m)
    }

    /// Every snapshot, oldest first.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        Ok(self
            .snapshot_manifests()
            .await?
            .into_iter()
            .map(|m| SnapshotInfo {
                id: m.id.unwrap_or_default(),
                seq: m.seq,
                created_unix: m.created_unix,
                message: m.message,
                entries: m.entries,
            })
            .collect())
    }

    /// Every snapshot's manifest (its `id` set), oldest first.
    async fn snapshot_manifests(&self) -> Result<Vec<Manifest>> {
        let ids = self.list_names("snap/").await?;
        let mut out: Vec<Manifest> = stream::iter(ids)
            .map(|id| async move {
                let m = self
                    .read_manifest(
                        ObjectKind::Snapshot,
                        WholeObject::Snapshot,
                        &self.snapshot_key(&id),
                        &format!("snapshot {id}"),
                    )
                    .await?;
                Ok::<_, RemoteError>(m.map(|m| Manifest { id: Some(id), ..m }))
            })
            .buffer_unordered(16)
            .try_filter_map(|x| async move { Ok(x) })
            .try_collect()
            .await?;
        out.sort_by(|a, b| (a.seq, a.created_unix, &a.id).cmp(&(b.seq, b.created_unix, &b.id)));
        Ok(out)
    }

    /// The lease of this workspace, for the holder named `holder`.
    pub fn lease(self: &Arc<Self>, holder: &str, ttl: Duration) -> Lease {
        Lease::new(self.clone(), holder, ttl)
    }
}

/// The plaintext of journal segment `n`: `header_len u32 LE | header JSON | batches`
/// (docs/FORMAT.md, "Workspaces").
#[doc(hidden)]
pub fn encode_segment(
    n: u64,
    session: &str,
    holder: &str,
    created_unix: u64,
    batches: &[JournalBatch],
) -> Result<Vec<u8>> {
    let mut batch_ms = Vec::with_capacity(batches.len());
    let mut last = None;
    for b in batches {
        batch_ms.push(last.map_or(b.unix_ms, |l| b.unix_ms.saturating_sub(l)));
        last = Some(b.unix_ms);
    }
    let header = SegmentHeader {
        format: REMOTE_FORMAT,
        segment: n,
        session: session.to_string(),
        holder: holder.to_string(),
        created_unix,
        batches: batches.len() as u32,
        batch_ms,
    };
    let header = serde_json::to_vec(&header)
        .map_err(|e| RemoteError::Corrupt { what: "segment header".into(), reason: e.to_string() })?;
    let mut plain = Vec::with_capacity(4 + header.len() + batches.iter().map(|b| b.encoded_len()).sum::<usize>());
    plain.extend_from_slice(&(header.len() as u32).to_le_bytes());
    plain.extend_from_slice(&header);
    for b in batches {
        b.encode(&mut plain);
    }
    Ok(plain)
}

/// Decodes the plaintext of journal segment `n`, stored at `key`.
fn parse_segment(n: u64, key: &str, plain: &[u8]) -> Result<(SegmentHeader, Vec<JournalBatch>)> {
    let corrupt = |reason: String| RemoteError::Corrupt { what: format!("journal segment {n} ({key})"), reason };
    let mut d = Decoder::new(plain);
    let hlen = d.u32().map_err(|e| corrupt(e.to_string()))? as usize;
    let rest = plain.get(4..4 + hlen).ok_or_else(|| corrupt("header cut short".into()))?;
    let header: SegmentHeader = serde_json::from_slice(rest).map_err(|e| corrupt(e.to_string()))?;
    if header.format > REMOTE_FORMAT {
        return Err(RemoteError::TooNew { what: format!("journal segment {n}"), found: header.format });
    }
    let mut d = Decoder::new(&plain[4 + hlen..]);
    // The count is the store's word: no more batches than the bytes left can hold, and
    // each still has to decode from the bytes that are there.
    if header.batches as usize > d.remaining() / MIN_BATCH_LEN {
        return Err(corrupt(format!(
            "its header says {} batches, more than its {} bytes of batches can hold",
            header.batches,
            d.remaining()
        )));
    }
    let mut batches = Vec::with_capacity(header.batches as usize);
    for _ in 0..header.batches {
        batches.push(JournalBatch::decode(&mut d).map_err(|e| corrupt(e.to_string()))?);
    }
    if header.batch_ms.is_empty() {
        if header.format >= TIMED_FORMAT && !batches.is_empty() {
            return Err(corrupt("its header has no batch times".into()));
        }
        // Before format 4: every batch at the latest time it can have been committed, the
        // end of the second the segment was written in.
        let t = header.created_unix.saturating_mul(1000).saturating_add(999);
        batches.iter_mut().for_each(|b| b.unix_ms = t);
    } else {
        if header.batch_ms.len() != batches.len() {
            return Err(corrupt(format!(
                "its header has {} batch times for {} batches",
                header.batch_ms.len(),
                batches.len()
            )));
        }
        let mut t: Option<u64> = None;
        for (b, &d) in batches.iter_mut().zip(&header.batch_ms) {
            let now = match t {
                None => d,
                Some(t) => t.checked_add(d).ok_or_else(|| corrupt("a batch time past the year 500 million".into()))?,
            };
            b.unix_ms = now;
            t = Some(now);
        }
    }
    Ok((header, batches))
}

/// The batches of the plaintext of journal segment `n` (stored at `key`), as a restore reads
/// them; exposed for the decoder fuzz tests (`tests/fuzz_decoders.rs`).
#[doc(hidden)]
pub fn decode_segment(n: u64, key: &str, plain: &[u8]) -> Result<Vec<JournalBatch>> {
    parse_segment(n, key, plain).map(|(_, batches)| batches)
}

/// Decodes the plaintext of a checkpoint or snapshot manifest (`what` names it in errors).
#[doc(hidden)]
pub fn decode_manifest(what: &str, plain: &[u8]) -> Result<Manifest> {
    #[derive(Deserialize)]
    struct Version {
        format: u32,
    }
    let corrupt = |e: serde_json::Error| RemoteError::Corrupt { what: what.to_string(), reason: e.to_string() };
    let v: Version = serde_json::from_slice(plain).map_err(corrupt)?;
    if v.format > REMOTE_FORMAT {
        return Err(RemoteError::TooNew { what: what.to_string(), found: v.format });
    }
    serde_json::from_slice(plain).map_err(corrupt)
}

/// Decodes the plaintext of a part of checkpoint `seq`: its entries, in order.
#[doc(hidden)]
pub fn decode_part(seq: u64, plain: &[u8]) -> Result<Vec<JournalOp>> {
    let mut d = Decoder::new(plain);
    let mut ops = Vec::new();
    while !d.is_empty() {
        ops.push(
            d.op().map_err(|e| RemoteError::Corrupt { what: format!("checkpoint {seq}"), reason: e.to_string() })?,
        );
    }
    Ok(ops)
}

/// A snapshot id: sortable by time, unique enough for one workspace.
fn snapshot_id(seq: u64) -> String {
    let t = chrono_like(unix_now());
    let r: u16 = rand::random();
    format!("{t}-{seq:x}-{r:04x}")
}

/// `YYYYMMDDTHHMMSSZ` for a unix time (UTC); a time past what chrono can hold (year
/// 262143) is shown as seconds.
pub fn chrono_like(secs: u64) -> String {
    utc(secs).map_or_else(|| format!("{secs}s"), |t| t.format("%Y%m%dT%H%M%SZ").to_string())
}

/// A unix time as a UTC date and time, if chrono can hold it.
pub(crate) fn utc(secs: u64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(i64::try_from(secs).ok()?, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workspace `w` on a fresh `file://` store, and journaling metadata to commit into it.
    async fn workspace_on_a_file_store() -> (tempfile::TempDir, Workspace, MetaStore) {
        use crate::crypto::{KdfParams, Secret};
        use crate::store::StoreConfig;
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = StoreConfig::new(vec![format!("file://{}", t.path().join("b").display())]);
        let store = Store::init(&cfg, &Secret::Passphrase(b"p"), KdfParams::for_tests()).await.expect("init");
        let ws = Workspace::new(Arc::new(store), "w");
        let meta = MetaStore::open(&t.path().join("meta")).expect("meta");
        meta.enable_journal(1).expect("journal");
        (t, ws, meta)
    }

    #[tokio::test]
    async fn compaction_keeps_what_a_restore_reads() {
        use crate::meta::MetaBatch;
        let (t, ws, meta) = workspace_on_a_file_store().await;
        for n in 1..=10 {
            assert!(ws.append_segment(n, "s", "h", &[]).await.expect("append"));
        }
        let mut seqs = Vec::new();
        for i in 0..3u8 {
            let mut b = MetaBatch::new();
            b.put_xattr(1, b"user.i", &[i]);
            meta.commit(b).expect("commit");
            seqs.push(ws.checkpoint(&meta, None, 0).await.expect("checkpoint").0.seq);
        }
        // A compaction that started before the newest checkpoint was written leaves it alone.
        ws.compact(1, 3, seqs[1], seqs[0]).await.expect("compact");
        assert_eq!(ws.list_numbers("cp/").await.expect("list"), seqs);
        ws.compact(3, 5, seqs[2], seqs[1]).await.expect("compact");
        assert_eq!(ws.list_numbers("j/").await.expect("list"), (5..=10).collect::<Vec<u64>>());
        assert_eq!(ws.list_numbers("cp/").await.expect("list"), vec![seqs[1], seqs[2]]);
        // And the newest state still restores.
        let again = MetaStore::open(&t.path().join("meta2")).expect("meta");
        ws.restore(&again).await.expect("restore");
        assert_eq!(again.xattr(1, b"user.i").expect("read"), Some(vec![2]));
    }

    #[tokio::test]
    async fn the_retention_anchor_is_the_newest_checkpoint_older_than_the_window() {
        use crate::meta::MetaBatch;
        use std::sync::atomic::{AtomicU64, Ordering};
        let (_dir, ws, meta) = workspace_on_a_file_store().await;
        let now = Arc::new(AtomicU64::new(1_000_000));
        let clock = now.clone();
        meta.journal().set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
        let mut cps = Vec::new();
        for i in 0..3u8 {
            let mut b = MetaBatch::new();
            b.put_xattr(1, b"user.i", &[i]);
            meta.commit(b).expect("commit");
            cps.push(ws.checkpoint(&meta, None, 0).await.expect("checkpoint").0);
            now.fetch_add(60_000, Ordering::SeqCst);
        }
        assert_eq!(cps[1].state_unix_ms, Some(1_060_000));
        let anchor = |keep_after| {
            let ws = &ws;
            let newest = cps[2].seq;
            async move { ws.retention_anchor(newest, keep_after).await.expect("anchor").map(|m| m.seq) }
        };
        // A window reaching before every checkpoint keeps the whole journal.
        assert_eq!(anchor(999_999).await, None);
        assert_eq!(anchor(1_000_000).await, Some(cps[0].seq));
        assert_eq!(anchor(1_059_999).await, Some(cps[0].seq));
        // Never the newest: it is what the window is measured back from.
        assert_eq!(anchor(u64::MAX).await, Some(cps[1].seq));
    }

    #[tokio::test]
    async fn a_follower_reads_the_checkpoint_when_the_journal_skips_batches() {
        use crate::meta::MetaBatch;
        let (_dir, ws, meta) = workspace_on_a_file_store().await;
        let batch = |seq| JournalBatch { seq, ops: Vec::new(), unix_ms: 0 };
        assert!(ws.append_segment(1, "s", "h", &[batch(1), batch(2), batch(3)]).await.expect("append"));
        let at = ChainPoint { next_segment: 2, seq: 3 };
        assert!(ws.head_after(at).await.expect("head").is_none(), "nothing new");
        // Batches 4..=6 are only in a checkpoint; batch 7 is in the next segment.
        for i in 0..6u8 {
            let mut b = MetaBatch::new();
            b.put_xattr(1, b"user.i", &[i]);
            meta.commit(b).expect("commit");
        }
        assert_eq!(ws.checkpoint(&meta, None, 0).await.expect("checkpoint").0.seq, 6);
        assert!(ws.append_segment(2, "s", "h", &[batch(7)]).await.expect("append"));
        let head = ws.head_after(at).await.expect("head").expect("a new head");
        assert!(head.whole, "batches 4..=6 are in no segment");
        assert_eq!(head.point, ChainPoint { next_segment: 3, seq: 7 });
        assert!(!head.ops.is_empty(), "the checkpoint's entries");
        // Without a gap, the journal alone.
        let head = ws.head_after(ChainPoint { next_segment: 2, seq: 6 }).await.expect("head").expect("a new head");
        assert!(!head.whole);
        assert_eq!(head.point, ChainPoint { next_segment: 3, seq: 7 });
    }

    #[tokio::test]
    async fn a_follower_is_told_when_the_store_went_back_in_time() {
        let (_dir, ws, _meta) = workspace_on_a_file_store().await;
        let batch = |seq| JournalBatch { seq, ops: Vec::new(), unix_ms: 0 };
        for n in 1..=3 {
            assert!(ws.append_segment(n, "s", "h", &[batch(n)]).await.expect("append"));
        }
        let at = ChainPoint { next_segment: 4, seq: 3 };
        assert!(ws.head_after(at).await.expect("a healthy store").is_none(), "nothing new");
        // The newest segment deleted (no key needed): the store is behind the follower.
        ws.store.backend().delete_object(&ws.segment_key(3)).await.expect("delete");
        let err = ws.head_after(at).await.expect_err("a rolled-back store went unnoticed");
        assert!(matches!(err, RemoteError::RolledBack { seen: 3, .. }), "{err}");
        assert_eq!(err.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn segment_batch_times_are_checked_and_older_segments_get_their_write_time() {
        let batch = |seq, unix_ms| JournalBatch { seq, ops: Vec::new(), unix_ms };
        let plain = encode_segment(1, "s", "h", 9, &[batch(1, 5_000), batch(2, 7_500)]).expect("encode");
        let times = |plain: &[u8]| -> Result<Vec<u64>> {
            Ok(decode_segment(1, "j/1", plain)?.iter().map(|b| b.unix_ms).collect())
        };
        assert_eq!(times(&plain).expect("decode"), vec![5_000, 7_500]);
        // The same segment with its header changed.
        let with_header = |change: &dyn Fn(&mut serde_json::Value)| {
            let hlen = u32::from_le_bytes(plain[..4].try_into().expect("len")) as usize;
            let mut header: serde_json::Value = serde_json::from_slice(&plain[4..4 + hlen]).expect("json");
            change(&mut header);
            let header = serde_json::to_vec(&header).expect("json");
            let mut out = (header.len() as u32).to_le_bytes().to_vec();
            out.extend_from_slice(&header);
            out.extend_from_slice(&plain[4 + hlen..]);
            out
        };
        for (what, change) in [
            (
                "a time short",
                &(|h: &mut serde_json::Value| h["batch_ms"] = serde_json::json!([5000])) as &dyn Fn(&mut _),
            ),
            ("no times in format 4", &|h: &mut serde_json::Value| {
                drop(h.as_object_mut().map(|o| o.remove("batch_ms")))
            }),
            ("a sum past 2^64", &|h: &mut serde_json::Value| h["batch_ms"] = serde_json::json!([u64::MAX, 1])),
        ] {
            let err = times(&with_header(change)).expect_err(what);
            assert_eq!(err.kind(), ErrorKind::Corrupt, "{what}: {err}");
        }
        // A format-3 segment has no times: its batches count as written at the end of its second.
        let old = with_header(&|h: &mut serde_json::Value| {
            h["format"] = serde_json::json!(3);
            h.as_object_mut().map(|o| o.remove("batch_ms"));
        });
        assert_eq!(times(&old).expect("an older segment reads"), vec![9_999, 9_999]);
    }

    #[test]
    fn dates_format_like_iso() {
        assert_eq!(chrono_like(0), "19700101T000000Z");
        assert_eq!(chrono_like(1_796_000_000), "20261130T005320Z");
    }
}
