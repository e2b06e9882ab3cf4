//! The committer: moves the metadata journal into the store, continuously, and keeps the
//! writer lease alive.
//!
//! Invariants:
//! - segments are appended in number order, each only after the previous one is stored; a
//!   segment that failed is retried with the same number and contents, never dropped;
//! - a batch is reported durable only after the segment holding it (or a checkpoint after it)
//!   is stored at quorum;
//! - group commit: whatever queued while one segment was in flight goes out as the next one,
//!   so concurrent fsyncs share a commit;
//! - when the chain or the lease shows another writer, the committer stops for good and every
//!   waiter gets the reason (fsync fails instead of claiming durability).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{ChainState, CheckpointReport, Lease, Manifest, RemoteError, Result, Workspace, unix_now};
use crate::meta::{JournalError, MetaStore};

/// A checkpoint is written after this many segments (bounds the replay of a restore)...
const SEGMENTS_PER_CHECKPOINT: u64 = 256;
/// ...but not more often than this (nor than ten times the last one took).
const MIN_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

/// How long an automatic checkpoint waits for the pending batches to go into a segment first.
const JOURNAL_FIRST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a journal segment may gather batches before it is written, when nobody waits
/// for durability: 200 ms keeps the store's copy of the metadata less than half a second
/// behind, and an untar of 7.6k files writes 30-35 segments instead of 4400-6900 (one PUT
/// each; one file each in a `file://` store, later deleted by compaction).
const GROUP_COMMIT: Duration = Duration::from_millis(200);

/// Numbers for `tierfs status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStats {
    pub workspace: String,
    pub last_seq: u64,
    pub durable_seq: u64,
    pub pending_batches: u64,
    pub pending_bytes: u64,
    pub oldest_pending_ms: u64,
    pub segments_written: u64,
    pub last_commit_unix: u64,
    pub last_checkpoint_seq: u64,
    pub last_snapshot: Option<String>,
    /// When this process committed `last_snapshot` (seconds since the epoch; 0: none yet).
    #[serde(default)]
    pub last_snapshot_unix: u64,
    pub lease_holder: String,
    pub lease_expires_unix: u64,
    /// `conditional` (If-None-Match on journal segments) or `lease` (see `store::Fencing`);
    /// empty from a daemon older than this field.
    #[serde(default)]
    pub fencing: String,
    pub last_error: Option<String>,
    pub stopped: Option<String>,
}

/// The remote side of one writable mount.
pub struct Committer {
    ws: Arc<Workspace>,
    meta: Arc<MetaStore>,
    lease: Arc<Lease>,
    segments_written: AtomicU64,
    since_checkpoint: AtomicU64,
    last_commit_unix: AtomicU64,
    last_checkpoint_seq: AtomicU64,
    lease_expires_unix: AtomicU64,
    last_snapshot: Mutex<Option<String>>,
    last_snapshot_unix: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Serializes checkpoints (sync, automatic, unmount); holds the `(seq, next segment)` of
    /// the last checkpoint this committer wrote or started from, and how long it took.
    checkpointing: tokio::sync::Mutex<LastCheckpoint>,
    /// When the lease was last renewed (or confirmed).
    renewed_at: Mutex<Instant>,
    /// How far back point-in-time restore reaches: compaction keeps the journal (and the
    /// checkpoints) a restore to any time this recent needs (milliseconds).
    retention_ms: AtomicU64,
}

/// What the append loop does after a lease check ([`Committer::after_lease_check`]).
enum LeaseStep {
    Go,
    Retry,
    Stop,
}

#[derive(Clone, Copy)]
struct LastCheckpoint {
    /// Segments below this number are deleted already.
    compacted_below: u64,
    at: Instant,
    took: Duration,
}

impl Committer {
    /// Takes the lease, brings the local metadata in line with the store (restoring it into
    /// an empty store), fences the chain by appending this session's first segment, and
    /// starts journaling. Returns the committer and where the chain stood.
    ///
    /// A store behind what this node's data dir, or the lease's last holder, saw it hold is
    /// refused ([`RemoteError::RolledBack`]); `accept_rollback` takes it as it is (the data
    /// dir's refusal stands: the caller drops its copy first).
    pub async fn open(
        ws: Arc<Workspace>,
        meta: Arc<MetaStore>,
        lease: Lease,
        takeover: bool,
        accept_rollback: bool,
    ) -> Result<(Arc<Committer>, ChainState)> {
        // A store that went back in time is refused before the lease is touched, so the refusal
        // changes nothing in it (the check is made again under the lease).
        // A node with nothing local reads the chain here only when the lease has a mark to
        // hold it against: its restore reads the chain anyway.
        let chain_end = if meta.is_empty()? {
            None
        } else {
            let state = ws.chain_state().await?;
            Committer::check_not_rolled_back(&ws, &meta, &state)?;
            Some(state.remote_seq)
        };
        if !accept_rollback {
            ws.check_lease_mark(chain_end).await?;
        }
        lease.acquire(takeover).await?;
        let lease = Arc::new(lease);
        match Committer::open_leased(ws, meta, lease.clone(), accept_rollback).await {
            Ok(done) => Ok(done),
            Err(e) => {
                // Nothing was mounted: let the next attempt (or node) have the workspace.
                if !matches!(e, RemoteError::TakenOver { .. }) {
                    let _ = lease.release().await;
                }
                Err(e)
            }
        }
    }

    /// The store acknowledged batches up to `durable_seq` to this node: holding fewer now, it
    /// went back in time, which no writer does. (A fresh node cannot tell.)
    fn check_not_rolled_back(ws: &Workspace, meta: &MetaStore, state: &ChainState) -> Result<()> {
        let durable = meta.durable_seq()?;
        if state.remote_seq < durable {
            return Err(RemoteError::RolledBack {
                workspace: ws.name().to_string(),
                witness: "this node".into(),
                seen: durable,
                store: state.remote_seq,
            });
        }
        Ok(())
    }

    async fn open_leased(
        ws: Arc<Workspace>,
        meta: Arc<MetaStore>,
        lease: Arc<Lease>,
        accept_rollback: bool,
    ) -> Result<(Arc<Committer>, ChainState)> {
        let empty = meta.is_empty()?;
        let (state, need_checkpoint) = if empty {
            let state = ws.restore(&meta).await?;
            if !accept_rollback {
                ws.check_lease_mark(Some(state.remote_seq)).await?;
            }
            (state, false)
        } else {
            let state = ws.chain_state().await?;
            let local = meta.local_seq()?;
            let durable = meta.durable_seq()?;
            let workspace = ws.name().to_string();
            Committer::check_not_rolled_back(&ws, &meta, &state)?;
            if state.remote_seq > durable && local > durable {
                return Err(RemoteError::Diverged { workspace, durable, local, remote: state.remote_seq });
            }
            if local < state.remote_seq {
                return Err(RemoteError::StaleLocal { workspace, local, remote: state.remote_seq });
            }
            // Ahead: batches committed here were not uploaded before this node stopped. A
            // local store that never journaled (hot-only before) is uploaded whole too.
            (state, local > state.remote_seq || local == 0)
        };
        if !ws.append_segment(state.next_segment, lease.session(), lease.holder(), &[]).await? {
            let holder = ws.segment_writer(state.next_segment).await?.map_or_else(|| "another node".into(), |w| w.1);
            return Err(RemoteError::TakenOver { workspace: ws.name().to_string(), holder });
        }
        meta.enable_journal(state.next_segment + 1)?;
        lease.restart_mark(state.remote_seq);
        if empty {
            // A file whose size reaches past the data that made it to the store (the last
            // writer stopped between committing a write's new size and uploading its bytes)
            // is cut back to the end of its stored data, so it shows an earlier state of the
            // file rather than zeros where the lost appends were. Holes are not lost data.
            // Committed (and journaled) as one batch.
            let clamped = meta.cut_to_stored_data()?;
            if clamped > 0 {
                tracing::info!(
                    files = clamped,
                    "restored files cut back to the data that reached the store before the last writer stopped"
                );
            }
        }
        if !need_checkpoint {
            meta.set_durable_seq(state.remote_seq)?;
        }
        let committer = Arc::new(Committer {
            ws,
            meta,
            lease,
            segments_written: AtomicU64::new(0),
            since_checkpoint: AtomicU64::new(state.segments),
            last_commit_unix: AtomicU64::new(unix_now()),
            last_checkpoint_seq: AtomicU64::new(0),
            lease_expires_unix: AtomicU64::new(0),
            last_snapshot: Mutex::new(None),
            last_snapshot_unix: AtomicU64::new(0),
            last_error: Mutex::new(None),
            checkpointing: tokio::sync::Mutex::new(LastCheckpoint {
                compacted_below: state.compacted_below,
                at: Instant::now(),
                took: Duration::ZERO,
            }),
            renewed_at: Mutex::new(Instant::now()),
            retention_ms: AtomicU64::new(super::DEFAULT_RETENTION.as_millis() as u64),
        });
        if need_checkpoint {
            committer.checkpoint(None).await?;
        }
        Ok((committer, state))
    }

    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.ws
    }

    /// How far back point-in-time restore reaches ([`super::DEFAULT_RETENTION`] unless set).
    pub fn set_retention(&self, window: Duration) {
        self.retention_ms.store(window.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// Runs until `stop` turns true and nothing is pending (or the committer fails for good).
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let journal_owner = self.clone();
        let mut next_renewal = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            if Instant::now() >= next_renewal {
                match self.renew_when_due().await {
                    Some(next) => next_renewal = next,
                    None => return,
                }
            }
            let o = journal_owner.clone();
            let taken = tokio::task::spawn_blocking(move || {
                o.meta.journal().take(Duration::from_millis(200), super::MAX_SEGMENT_BYTES, GROUP_COMMIT)
            })
            .await
            .ok()
            .flatten();
            let Some(taken) = taken else {
                if *stop.borrow() {
                    return;
                }
                continue;
            };
            let last = taken.batches.last().map_or(0, |b| b.seq);
            loop {
                // Fenced by lease only: nothing is written on a lease that may have lapsed.
                match self.after_lease_check(self.ensure_fresh_lease().await, &mut backoff).await {
                    LeaseStep::Go => {}
                    LeaseStep::Retry => continue,
                    LeaseStep::Stop => return,
                }
                match self
                    .ws
                    .append_segment(taken.segment, self.lease.session(), self.lease.holder(), &taken.batches)
                    .await
                {
                    Ok(true) => {
                        // A writer cut off from the store for longer than its lease may have
                        // been taken over meanwhile (and its fence segment compacted away):
                        // it confirms the lease before it calls anything durable.
                        if self.renewed_at.lock().elapsed() > self.lease.renew_every() * 2 {
                            match self.after_lease_check(self.confirm_lease().await, &mut backoff).await {
                                LeaseStep::Go => {}
                                // Appending the same segment again is idempotent.
                                LeaseStep::Retry => continue,
                                LeaseStep::Stop => return,
                            }
                        }
                        self.meta.journal().mark_journaled(last);
                        if let Err(e) = self.meta.set_durable_seq(last) {
                            self.note_error(format!("recording the durable batch: {e}"));
                        }
                        self.segments_written.fetch_add(1, Ordering::Relaxed);
                        self.last_commit_unix.store(unix_now(), Ordering::Relaxed);
                        *self.last_error.lock() = None;
                        backoff = Duration::from_millis(100);
                        break;
                    }
                    Ok(false) => {
                        let holder = match self.ws.segment_writer(taken.segment).await {
                            Ok(Some((_, h))) => h,
                            _ => "another node".into(),
                        };
                        let e = RemoteError::TakenOver { workspace: self.ws.name().to_string(), holder };
                        self.stop_for_good(e);
                        return;
                    }
                    Err(e) => {
                        self.note_error(format!("writing journal segment {}: {e}", taken.segment));
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.changed() => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            self.checkpoint_when_due().await;
        }
    }

    /// The run loop's renewal: when to renew next, or `None` once the lease was taken over
    /// (the journal is stopped for good then).
    async fn renew_when_due(&self) -> Option<Instant> {
        self.mark_lease();
        match self.lease.renew().await {
            Ok(()) => {
                self.lease_expires_unix.store(unix_now() + self.lease.renew_every().as_secs() * 3, Ordering::Relaxed);
                *self.renewed_at.lock() = Instant::now();
                Some(Instant::now() + self.lease.renew_every())
            }
            Err(e @ RemoteError::TakenOver { .. }) => {
                self.stop_for_good(e);
                None
            }
            Err(e) => {
                self.note_error(format!("renewing the lease: {e}"));
                Some(Instant::now() + Duration::from_secs(2))
            }
        }
    }

    /// After each segment: a checkpoint every [`SEGMENTS_PER_CHECKPOINT`] segments, but at most
    /// a tenth of the time goes there (exporting the whole metadata costs time).
    async fn checkpoint_when_due(self: &Arc<Self>) {
        if self.since_checkpoint.fetch_add(1, Ordering::Relaxed) + 1 < SEGMENTS_PER_CHECKPOINT {
            return;
        }
        let due = {
            let last = self.checkpointing.lock().await;
            last.at.elapsed() >= (last.took * 10).max(MIN_CHECKPOINT_INTERVAL)
        };
        if due {
            // Beside the journal, which keeps going meanwhile (the cut is consistent). What was
            // pending goes into a segment first, so the journal, not only the checkpoint,
            // holds every batch (the trash replays the journal).
            let c = self.clone();
            tokio::spawn(async move {
                if let Err(e) = c.journal_pending(JOURNAL_FIRST_TIMEOUT).await {
                    c.note_error(format!("before an automatic checkpoint: {e}"));
                    return;
                }
                if let Err(e) = c.checkpoint(None).await {
                    c.note_error(format!("automatic checkpoint: {e}"));
                }
            });
            self.since_checkpoint.store(0, Ordering::Relaxed);
        }
    }

    /// The append loop after a lease check: go on, back off and try again, or stop (taken
    /// over: `confirm_lease` has stopped the journal already).
    async fn after_lease_check(&self, check: Result<()>, backoff: &mut Duration) -> LeaseStep {
        match check {
            Ok(()) => LeaseStep::Go,
            Err(RemoteError::TakenOver { .. } | RemoteError::Stopped(_)) => LeaseStep::Stop,
            Err(e) => {
                self.note_error(format!("confirming the lease: {e}"));
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(5));
                LeaseStep::Retry
            }
        }
    }

    fn note_error(&self, msg: String) {
        tracing::warn!("{msg}");
        *self.last_error.lock() = Some(msg);
    }

    /// The committer cannot go on: every waiter for durability, now and later, gets `e` with
    /// its kind (`Fenced` for a takeover), which is returned too.
    fn stop_for_good(&self, e: RemoteError) -> JournalError {
        let msg = e.to_string();
        tracing::error!("{msg}");
        let stopped = JournalError::stopped(e.kind(), e);
        self.meta.journal().fail(stopped.clone());
        *self.last_error.lock() = Some(msg);
        stopped
    }

    /// Waits (up to `timeout`) until every batch committed so far is in a stored journal
    /// segment. A checkpoint written after it folds only the batches committed meanwhile, and
    /// those go into segments too; so every removal reaches the journal, which is what the
    /// trash and `restore --at` replay, even when the node dies right after the checkpoint.
    pub async fn journal_pending(&self, timeout: Duration) -> Result<()> {
        let meta = self.meta.clone();
        let last = meta.journal().last_seq();
        match tokio::task::spawn_blocking(move || meta.journal().wait_journaled(last, timeout)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(RemoteError::Stopped(e)),
            Err(e) => Err(RemoteError::Stopped(JournalError::stopped(crate::types::ErrorKind::Internal, e))),
        }
    }

    /// Writes a checkpoint (a snapshot with `snapshot = Some(message)`) of everything committed
    /// so far; every batch up to it is durable once it returns.
    pub async fn checkpoint(&self, snapshot: Option<Option<String>>) -> Result<(Manifest, CheckpointReport)> {
        if let Some(stopped) = self.meta.journal().failure() {
            return Err(RemoteError::Stopped(stopped));
        }
        let mut last = self.checkpointing.lock().await;
        self.ensure_fresh_lease().await?;
        let started = Instant::now();
        let meta = self.meta.clone();
        let ws = self.ws.clone();
        let (manifest, report) = ws.checkpoint(&meta, snapshot, last.compacted_below).await?;
        self.ensure_fresh_lease().await?;
        // The journal before the anchor (the newest checkpoint before this one whose state is
        // older than the retention window) is no longer needed by any restore, latest or
        // point-in-time (the anchor stays, and with it a fallback should the newest be
        // unreadable; so does the segment just before it, which names its writer). Deleted in
        // the background. Without retention, the anchor is the previous checkpoint.
        let keep_after = meta.journal().now_ms().saturating_sub(self.retention_ms.load(Ordering::Relaxed));
        let from = last.compacted_below;
        let mut below = from;
        match ws.retention_anchor(manifest.seq, keep_after).await {
            Ok(Some(anchor)) => {
                below = anchor.next_segment.saturating_sub(1).max(from);
                let (ws, seq) = (ws.clone(), manifest.seq);
                tokio::spawn(async move {
                    if let Err(e) = ws.compact(from, below, seq, anchor.seq).await {
                        tracing::warn!("compacting the journal: {e}");
                    }
                });
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("finding what the journal's retention keeps: {e}"),
        }
        *last = LastCheckpoint { compacted_below: below, at: Instant::now(), took: started.elapsed() };
        drop(last);
        self.meta.journal().mark_durable(manifest.seq);
        self.meta.set_durable_seq(manifest.seq)?;
        self.since_checkpoint.store(0, Ordering::Relaxed);
        self.last_checkpoint_seq.store(manifest.seq, Ordering::Relaxed);
        self.last_commit_unix.store(unix_now(), Ordering::Relaxed);
        if let Some(id) = &manifest.id {
            *self.last_snapshot.lock() = Some(id.clone());
            self.last_snapshot_unix.store(unix_now(), Ordering::Relaxed);
        }
        Ok((manifest, report))
    }

    /// On a store fenced by lease only: confirms (renews) the lease unless it was renewed
    /// recently enough that no other node can have taken it ([`Lease::fresh_for`]).
    async fn ensure_fresh_lease(&self) -> Result<()> {
        match self.lease.fresh_for() {
            Some(fresh) if self.renewed_at.lock().elapsed() > fresh => self.confirm_lease().await,
            _ => Ok(()),
        }
    }

    /// Checks the lease is still this session's (before a barrier reports success), renewing it.
    pub async fn confirm_lease(&self) -> Result<()> {
        self.mark_lease();
        match self.lease.renew().await {
            Ok(()) => {
                *self.renewed_at.lock() = Instant::now();
                Ok(())
            }
            Err(e @ RemoteError::TakenOver { .. }) => Err(RemoteError::Stopped(self.stop_for_good(e))),
            Err(e) => Err(e),
        }
    }

    /// Gives up the lease (clean unmount, after everything is durable).
    pub async fn release(&self) -> Result<()> {
        self.mark_lease();
        self.lease.release().await
    }

    /// Brings the lease's high-water mark up to the batches the store acknowledged (a read
    /// that fails leaves the mark where it was: lower, never wrong).
    fn mark_lease(&self) {
        if let Ok(seq) = self.meta.durable_seq() {
            self.lease.note_stored(seq);
        }
    }

    pub fn stats(&self) -> RemoteStats {
        let j = self.meta.journal().stats();
        RemoteStats {
            workspace: self.ws.name().to_string(),
            last_seq: j.last_seq,
            durable_seq: j.durable_seq,
            pending_batches: j.pending_batches,
            pending_bytes: j.pending_bytes,
            oldest_pending_ms: j.oldest_pending.map_or(0, |d| d.as_millis() as u64),
            segments_written: self.segments_written.load(Ordering::Relaxed),
            last_commit_unix: self.last_commit_unix.load(Ordering::Relaxed),
            last_checkpoint_seq: self.last_checkpoint_seq.load(Ordering::Relaxed),
            last_snapshot: self.last_snapshot.lock().clone(),
            last_snapshot_unix: self.last_snapshot_unix.load(Ordering::Relaxed),
            lease_holder: self.lease.holder().to_string(),
            fencing: self.ws.fencing().name().into(),
            lease_expires_unix: self.lease_expires_unix.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
            stopped: self.meta.journal().failure().map(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::CHUNK_SIZE;
    use crate::meta::codec::test_file_record;
    use crate::meta::{ChunkRecord, MetaBatch};

    /// A file of `size` with records of `(chunk, length)` and unsealed marks on `unsealed`.
    fn file(meta: &MetaStore, ino: u64, size: u64, chunks: &[(u64, u32)], unsealed: &[u64]) {
        let mut b = MetaBatch::new();
        b.put_inode(&test_file_record(ino, size));
        for &(idx, len) in chunks {
            b.put_chunk(ino, idx, &ChunkRecord { block: [7; 32], len, data: len, resident: false });
        }
        for &idx in unsealed {
            b.put_unsealed(ino, idx);
        }
        meta.commit(b).expect("commit");
    }

    #[test]
    fn restored_files_are_cut_back_to_their_stored_data_and_holes_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let meta = MetaStore::open(dir.path()).expect("open");
        let c = CHUNK_SIZE;
        let full = c as u32;
        file(&meta, 10, 2 * c + 100, &[(0, full), (1, full), (2, 100)], &[]); // all stored
        file(&meta, 11, 2 * c + 100, &[(0, full), (1, 5)], &[1]); // chunk 1 stored when shorter
        file(&meta, 12, 3 * c, &[(0, full), (2, full)], &[1]); // chunk 1 never stored
        file(&meta, 13, 50, &[], &[0]); // nothing stored
        // Holes: chunks with neither a record nor a mark, before and between the data.
        file(&meta, 14, (1 << 30) + 3, &[(256, 3)], &[]);
        file(&meta, 15, 2 * c + 1, &[(0, 100), (2, 1)], &[]);
        // A hole before a chunk whose write was lost, far past the start: cut there only.
        file(&meta, 16, 5 * c, &[(0, full)], &[3]);
        // An overwrite of a stored chunk that was lost: the old bytes stay, nothing is cut.
        file(&meta, 17, 2 * c, &[(0, full), (1, full)], &[0]);
        // The largest size: nothing may be proportional to it.
        file(&meta, 18, i64::MAX as u64, &[(7, 10)], &[]);
        assert_eq!(meta.cut_to_stored_data().expect("cut"), 4);
        let size = |ino| meta.inode(ino).expect("read").expect("exists").attr.size;
        assert_eq!(size(10), 2 * c + 100);
        assert_eq!(size(11), c + 5);
        assert_eq!(size(12), c);
        assert_eq!(size(13), 0);
        assert_eq!(size(14), (1 << 30) + 3);
        assert_eq!(size(15), 2 * c + 1);
        assert_eq!(size(16), 3 * c);
        assert_eq!(size(17), 2 * c);
        assert_eq!(size(18), i64::MAX as u64);
        let left: Vec<(u64, u64)> = meta.chunks().expect("chunks").into_iter().map(|(i, x, _)| (i, x)).collect();
        assert!(!left.contains(&(12, 2)), "a record past the cut survived: {left:?}");
        assert!(left.contains(&(11, 1)), "the partly stored chunk lost its record: {left:?}");
        assert!(left.contains(&(14, 256)) && left.contains(&(15, 2)), "a record after a hole was dropped: {left:?}");
        assert!(meta.unsealed_chunks().expect("marks").is_empty(), "the last writer's marks were kept");
    }
}
