//! Retention and garbage collection: `tierfs forget` drops snapshots by a keep policy,
//! `tierfs gc` deletes what nothing references any more.
//!
//! Invariants:
//! - gc runs only while it holds the writer lease of *every* workspace of the store, taken
//!   the way a mount takes it (refused while another node holds one, fenced by a journal
//!   segment), so no upload can be in flight and no block can be reused by dedup while packs
//!   are deleted;
//! - a pack is deleted only if no block of the latest state, of any snapshot, or of any
//!   checkpoint or journal segment a point-in-time restore inside the retention window reads,
//!   of any workspace, lies in it; the latest state's block index is pruned to the referenced
//!   blocks (committed as a normal journaled change plus a checkpoint *before* any pack is
//!   deleted, so a crash in between leaves only unreferenced packs behind, never a dangling
//!   reference);
//! - the retained journal is the newest checkpoint older than the window (the anchor) and
//!   everything after it; checkpoints before the anchor, journal segments before it, and
//!   checkpoint parts that no kept checkpoint or snapshot lists are deleted last. With a window
//!   of 0, the anchor is the checkpoint before gc's own.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Datelike;
use serde::{Deserialize, Serialize};

use super::{Committer, Manifest, RemoteError, Result, SnapshotInfo, Workspace};
use crate::block::{self, BlockLoc, ZERO_BLOCK};
use crate::crypto::Hash;
use crate::crypto::ObjectKind;
use crate::meta::{ChunkRecord, JournalOp, MetaBatch, MetaStore, codec};
use crate::store::{Store, WholeObject};

/// How long gc's leases live (renewed by nobody: gc finishes well within it or the next
/// writer waits it out).
const GC_LEASE_TTL: Duration = Duration::from_secs(600);

/// A retention policy for `tierfs forget` (restic's meaning: the union of what each rule keeps).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepPolicy {
    pub last: usize,
    pub daily: usize,
    pub weekly: usize,
    pub monthly: usize,
    /// Keep every snapshot made within this many seconds before now (0: none by age).
    #[serde(default)]
    pub within_secs: u64,
}

impl KeepPolicy {
    pub fn is_empty(&self) -> bool {
        self.last + self.daily + self.weekly + self.monthly == 0 && self.within_secs == 0
    }

    /// The ids to keep out of `snapshots` (any order); `now_unix` is the time of day now.
    pub fn keep(&self, snapshots: &[SnapshotInfo], now_unix: u64) -> HashSet<String> {
        let mut newest_first: Vec<&SnapshotInfo> = snapshots.iter().collect();
        newest_first.sort_by_key(|s| std::cmp::Reverse((s.created_unix, s.seq)));
        let mut keep: HashSet<String> = newest_first.iter().take(self.last).map(|s| s.id.clone()).collect();
        if self.within_secs > 0 {
            let since = now_unix.saturating_sub(self.within_secs);
            keep.extend(newest_first.iter().filter(|s| s.created_unix >= since).map(|s| s.id.clone()));
        }
        let mut by_period = |n: usize, period: &dyn Fn(u64) -> u64| {
            let mut seen = HashSet::new();
            for s in &newest_first {
                if seen.len() == n {
                    break;
                }
                if seen.insert(period(s.created_unix)) {
                    keep.insert(s.id.clone());
                }
            }
        };
        // Calendar days, ISO weeks (from Monday) and months, in UTC.
        let period = |t: u64, of: fn(chrono::DateTime<chrono::Utc>) -> u64| super::utc(t).map_or(0, of);
        by_period(self.daily, &|t| period(t, |d| d.num_days_from_ce() as u64));
        by_period(self.weekly, &|t| period(t, |d| d.iso_week().year() as u64 * 100 + u64::from(d.iso_week().week())));
        by_period(self.monthly, &|t| period(t, |d| d.year() as u64 * 12 + u64::from(d.month0())));
        keep
    }
}

/// What `forget` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForgetReport {
    pub kept: Vec<String>,
    pub removed: Vec<String>,
}

impl Workspace {
    /// Removes the snapshots `policy` does not keep (only the snapshot records: `gc` frees the
    /// data). With `dry_run`, only reports.
    pub async fn forget(&self, policy: &KeepPolicy, dry_run: bool) -> Result<ForgetReport> {
        let all = self.snapshots().await?;
        let keep = policy.keep(&all, super::unix_now());
        let mut report = ForgetReport::default();
        for s in all {
            if keep.contains(&s.id) {
                report.kept.push(s.id);
            } else {
                if !dry_run {
                    self.store.backend().delete_object(&self.snapshot_key(&s.id)).await?;
                }
                report.removed.push(s.id);
            }
        }
        Ok(report)
    }
}

/// What `gc` found and deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    pub workspaces: u64,
    pub snapshots: u64,
    pub referenced_blocks: u64,
    pub packs: u64,
    pub packs_deleted: u64,
    /// Stored bytes of the deleted packs (one copy).
    pub bytes_deleted: u64,
    pub index_segments_deleted: u64,
    pub block_index_entries_dropped: u64,
    pub checkpoints_deleted: u64,
    pub journal_segments_deleted: u64,
    pub parts_deleted: u64,
    /// Journal segments and checkpoints kept for point-in-time restore (`keep_within`).
    #[serde(default)]
    pub journal_segments_kept: u64,
    #[serde(default)]
    pub checkpoints_kept: u64,
    pub dry_run: bool,
}

/// Blocks (and where they are) one manifest or metadata store references.
#[derive(Default)]
struct Refs {
    blocks: HashSet<Hash>,
    locs: HashMap<Hash, BlockLoc>,
}

impl Refs {
    /// What snapshot `m` of `ws` references.
    async fn of_snapshot(ws: &Workspace, m: &Manifest) -> Result<Refs> {
        let mut snap = Refs::default();
        ws.for_each_part(m, |ops| {
            for op in ops {
                if let JournalOp::Put { key, value } = op {
                    snap.add_entry(&key, &value)?;
                }
            }
            Ok(())
        })
        .await?;
        Ok(snap)
    }

    /// Takes `other`'s blocks and their locations in (a location known already stays).
    fn absorb(&mut self, other: Refs) {
        self.blocks.extend(other.blocks.iter().copied());
        for (b, loc) in other.locs {
            self.locs.entry(b).or_insert(loc);
        }
    }

    fn add_entry(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if codec::is_chunk_key(key) {
            let rec: ChunkRecord = codec::decode_chunk(value)?;
            if rec.block != ZERO_BLOCK {
                self.blocks.insert(rec.block);
            }
        } else if key.first() == Some(&b'B') && key.len() == 33 {
            let id: Hash = key[1..].try_into().map_err(|_| corrupt("block key"))?;
            let loc = BlockLoc::decode(value).ok_or_else(|| corrupt("block location"))?;
            self.locs.insert(id, loc);
        }
        Ok(())
    }

    /// Packs holding referenced blocks; a referenced block without a location is an error
    /// (deleting anything then could lose it).
    fn packs(&self, what: &str) -> Result<HashSet<Hash>> {
        let mut out = HashSet::new();
        for b in &self.blocks {
            match self.locs.get(b) {
                Some(loc) => {
                    out.insert(loc.pack);
                }
                None => {
                    return Err(RemoteError::Corrupt {
                        what: what.to_string(),
                        reason: format!("block {} is referenced but has no location; gc stopped", hex::encode(b)),
                    });
                }
            }
        }
        Ok(out)
    }
}

fn corrupt(what: &str) -> RemoteError {
    RemoteError::Corrupt { what: "workspace metadata".into(), reason: format!("bad {what}") }
}

/// One workspace under gc: its committer (lease held, latest state restored into `meta`).
struct Held {
    ws: Arc<Workspace>,
    meta: Arc<MetaStore>,
    committer: Arc<Committer>,
    /// Snapshots' manifests.
    snapshots: Vec<Manifest>,
}

/// What the retention window keeps of a workspace's journal: the anchor checkpoint's seq and
/// the first segment kept (`None`: no checkpoint is older than the window, all is kept).
fn retained(anchor: Option<&Manifest>) -> (u64, u64) {
    // The segment just before the anchor's next stays: it names the writer.
    anchor.map_or((0, 0), |a| (a.seq, a.next_segment.saturating_sub(1)))
}

/// Collects the garbage of every workspace of `store`. `scratch` is an empty directory for
/// the restored metadata; `progress` gets one line per step.
///
/// `keep_within`: the retention window of point-in-time restore; what a restore to any time
/// that recent reads is kept (by the time of the gc node's clock).
pub async fn gc(
    store: Arc<Store>,
    scratch: &Path,
    holder: &str,
    dry_run: bool,
    keep_within: Duration,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<GcReport> {
    let mut report = GcReport { dry_run, ..GcReport::default() };
    let mut held: Vec<Held> = Vec::new();
    let keep_after = crate::meta::system_unix_ms().saturating_sub(keep_within.as_millis() as u64);
    let result = gc_held(&store, scratch, holder, keep_within, keep_after, &mut held, &mut report, progress).await;
    for h in &held {
        if let Err(e) = h.committer.release().await {
            tracing::warn!("releasing the gc lease of {}: {e}", h.ws.name());
        }
    }
    result.map(|()| report)
}

/// Step 3 of [`gc_held`]: deletes the packs no live state references, and the index segments
/// that name only such packs (with `report.dry_run`, counts them only).
async fn delete_unreferenced_packs(
    store: &Arc<Store>,
    live_packs: &HashSet<Hash>,
    report: &mut GcReport,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<()> {
    let dry_run = report.dry_run;
    let backend = store.backend();
    let mut dead: HashMap<Hash, u64> = HashMap::new();
    for o in backend.list("packs/").await? {
        let Some(id) = o.key.rsplit('/').next().and_then(|h| hex::decode(h).ok()).and_then(|v| Hash::try_from(v).ok())
        else {
            continue;
        };
        report.packs += 1;
        if !live_packs.contains(&id) {
            dead.insert(id, o.size);
        }
    }
    progress(&format!("{} of {} packs are unreferenced", dead.len(), report.packs));
    let segments = backend.list("index/").await?;
    let mut dead_segments = Vec::new();
    for o in &segments {
        let Some(seg) =
            o.key.strip_prefix("index/").and_then(|h| hex::decode(h).ok()).and_then(|v| Hash::try_from(v).ok())
        else {
            continue;
        };
        let keys = store.keys();
        let verify = |b: &[u8]| block::open_index(keys, &seg, b).is_ok();
        let bytes = backend.get_object(&o.key, WholeObject::IndexSegment.limit(), &verify).await?;
        let entries = block::open_index(keys, &seg, &bytes)
            .map_err(|e| RemoteError::Corrupt { what: o.key.clone(), reason: e.to_string() })?;
        if !entries.is_empty() && entries.iter().all(|(_, loc)| dead.contains_key(&loc.pack)) {
            dead_segments.push(o.key.clone());
        }
    }
    if !dry_run {
        for (id, _) in dead.iter() {
            backend.delete_pack(&block::pack_key(id)).await?;
        }
        for key in &dead_segments {
            backend.delete_object(key).await?;
        }
    }
    report.packs_deleted = dead.len() as u64;
    report.bytes_deleted = dead.values().sum();
    report.index_segments_deleted = dead_segments.len() as u64;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn gc_held(
    store: &Arc<Store>,
    scratch: &Path,
    holder: &str,
    keep_within: Duration,
    keep_after: u64,
    held: &mut Vec<Held>,
    report: &mut GcReport,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<()> {
    // 1. Every workspace: lease, latest state, snapshots.
    open_workspaces(store, scratch, holder, keep_within, held, report).await?;
    progress(&format!("{} workspaces, {} snapshots: reading what they reference", report.workspaces, report.snapshots));

    // 2. What is referenced: the latest state and every snapshot of every workspace.
    let mut live_packs: HashSet<Hash> = HashSet::new();
    let mut referenced = 0u64;
    for h in held.iter() {
        referenced += mark_workspace(h, keep_within, keep_after, &mut live_packs, report).await?;
    }
    report.referenced_blocks = referenced;

    // Still ours (renewed for another GC_LEASE_TTL) before anything is deleted.
    for h in held.iter() {
        h.committer.confirm_lease().await?;
    }

    // 3. Packs nothing references, and their index segments.
    delete_unreferenced_packs(store, &live_packs, report, progress).await?;

    // 4. Checkpoints and the journal before the retention window's anchor (without a window:
    // before the newest checkpoint), unlisted parts.
    for h in held.iter() {
        let doomed = expired_metadata(h, keep_within, keep_after, report).await?;
        if !report.dry_run {
            for key in doomed {
                store.backend().delete_object(&key).await?;
            }
        }
    }
    progress("done");
    Ok(())
}

/// Opens every workspace of the store under the collector's lease, with its latest state
/// in a scratch metadata store and its snapshot manifests, and counts them in `report`.
async fn open_workspaces(
    store: &Arc<Store>,
    scratch: &Path,
    holder: &str,
    keep_within: Duration,
    held: &mut Vec<Held>,
    report: &mut GcReport,
) -> Result<()> {
    for (i, hash) in Workspace::list_all(store).await?.into_iter().enumerate() {
        let ws = Arc::new(Workspace::at_prefix(store.clone(), &hash));
        let meta = Arc::new(MetaStore::open(&scratch.join(format!("ws{i}")))?);
        let lease = ws.lease(holder, GC_LEASE_TTL);
        let (committer, _) = Committer::open(ws.clone(), meta.clone(), lease, false, false).await?;
        committer.set_retention(keep_within);
        let snapshots = ws.snapshot_manifests().await?;
        report.snapshots += snapshots.len() as u64;
        held.push(Held { ws, meta, committer, snapshots });
    }
    report.workspaces = held.len() as u64;
    Ok(())
}

/// Adds to `live_packs` every pack one workspace still references (its latest state, its
/// snapshots, the retained journal window), prunes its block index to those blocks and
/// (unless a dry run) checkpoints it; returns how many blocks it references.
async fn mark_workspace(
    h: &Held,
    keep_within: Duration,
    keep_after: u64,
    live_packs: &mut HashSet<Hash>,
    report: &mut GcReport,
) -> Result<u64> {
    let dry_run = report.dry_run;
    let mut head = Refs::default();
    h.meta.export(|k, v| head.add_entry(k, v).map_err(|e| crate::meta::MetaError::Corrupt(e.to_string())))?;
    for m in &h.snapshots {
        let snap = Refs::of_snapshot(&h.ws, m).await?;
        live_packs.extend(snap.packs(&format!("snapshot {}", m.id.as_deref().unwrap_or("?")))?);
        head.absorb(snap);
    }
    // What a point-in-time restore inside the window reads: the checkpoints from the
    // anchor on and every journal segment after it.
    let window = if keep_within.is_zero() { Refs::default() } else { h.ws.retained_refs(keep_after).await? };
    live_packs.extend(window.packs(&format!("the retained journal of workspace {}", h.ws.name()))?);
    head.absorb(window);
    live_packs.extend(head.packs(&format!("workspace {}", h.ws.name()))?);
    // Prune the latest state's block index to what is referenced, durably, first.
    let stale: Vec<Hash> =
        h.meta.blocks()?.into_iter().map(|(id, _)| id).filter(|id| !head.blocks.contains(id)).collect();
    report.block_index_entries_dropped += stale.len() as u64;
    if !dry_run && !stale.is_empty() {
        let mut batch = MetaBatch::new();
        for id in &stale {
            batch.delete_block(id);
        }
        h.meta.commit(batch)?;
    }
    if !dry_run {
        h.committer.checkpoint(None).await?;
    }
    Ok(head.blocks.len() as u64)
}

/// The keys of one workspace's checkpoints and journal segments before the retention
/// anchor and of the parts no kept checkpoint or snapshot lists, counted in `report`.
async fn expired_metadata(
    h: &Held,
    keep_within: Duration,
    keep_after: u64,
    report: &mut GcReport,
) -> Result<Vec<String>> {
    let mut doomed = Vec::new();
    let Some(newest) = h.ws.latest_checkpoint().await? else { return Ok(doomed) };
    let anchor = if keep_within.is_zero() {
        Some(newest.clone())
    } else {
        h.ws.retention_anchor(newest.seq, keep_after).await?
    };
    let (keep_seq, keep_segment) = retained(anchor.as_ref());
    let mut keep_parts: HashSet<String> = newest.parts.iter().cloned().collect();
    for m in &h.snapshots {
        keep_parts.extend(m.parts.iter().cloned());
    }
    for seq in h.ws.list_numbers("cp/").await? {
        if seq != newest.seq && seq < keep_seq {
            doomed.push(h.ws.checkpoint_key(seq));
            report.checkpoints_deleted += 1;
        } else {
            let key = h.ws.checkpoint_key(seq);
            let what = format!("checkpoint {seq}");
            if let Some(m) = h.ws.read_manifest(ObjectKind::Head, WholeObject::Checkpoint, &key, &what).await? {
                keep_parts.extend(m.parts);
            }
            report.checkpoints_kept += u64::from(seq != newest.seq);
        }
    }
    for n in h.ws.list_numbers("j/").await? {
        if n < keep_segment {
            doomed.push(h.ws.segment_key(n));
            report.journal_segments_deleted += 1;
        } else if n + 1 < newest.next_segment {
            report.journal_segments_kept += 1;
        }
    }
    for id in h.ws.list_names("part/").await? {
        if !keep_parts.contains(&id) {
            doomed.push(h.ws.part_key(&id));
            report.parts_deleted += 1;
        }
    }
    Ok(doomed)
}

impl Workspace {
    /// The blocks (and their locations) that a point-in-time restore to any time after
    /// `keep_after_ms` can read: every checkpoint from the retention anchor on and every
    /// journal segment after the anchor (from segment 1 without an anchor).
    async fn retained_refs(&self, keep_after_ms: u64) -> Result<Refs> {
        let newest = self.list_numbers("cp/").await?.last().copied().unwrap_or(0);
        let anchor = self.retention_anchor(newest, keep_after_ms).await?;
        let (keep_seq, keep_segment) = retained(anchor.as_ref());
        let mut refs = Refs::default();
        for seq in self.list_numbers("cp/").await?.into_iter().filter(|&s| s >= keep_seq) {
            let key = self.checkpoint_key(seq);
            let what = format!("checkpoint {seq}");
            let Some(m) = self.read_manifest(ObjectKind::Head, WholeObject::Checkpoint, &key, &what).await? else {
                continue;
            };
            self.for_each_part(&m, |ops| {
                for op in ops {
                    if let JournalOp::Put { key, value } = op {
                        refs.add_entry(&key, &value)?;
                    }
                }
                Ok(())
            })
            .await?;
        }
        for n in self.list_numbers_from("j/", keep_segment).await? {
            let Some((_, batches)) = self.read_segment(n).await? else { continue };
            for b in batches {
                for op in b.ops {
                    if let JournalOp::Put { key, value } = op {
                        refs.add_entry(&key, &value)?;
                    }
                }
            }
        }
        Ok(refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot named `id`, made at `created_unix`.
    fn snap(id: &str, created_unix: u64) -> SnapshotInfo {
        SnapshotInfo { id: id.into(), seq: created_unix, created_unix, message: None, entries: 1 }
    }

    #[test]
    fn keep_within_keeps_every_snapshot_that_recent_and_joins_the_other_rules() {
        let all = [snap("old", 1_000), snap("day-old", 100_000 - 86_400), snap("recent", 99_000), snap("now", 100_000)];
        let within = KeepPolicy { within_secs: 86_400, ..KeepPolicy::default() };
        assert!(!within.is_empty());
        let mut kept: Vec<String> = within.keep(&all, 100_000).into_iter().collect();
        kept.sort();
        assert_eq!(kept, ["day-old", "now", "recent"]);
        let with_last = KeepPolicy { last: 1, within_secs: 1_500, ..KeepPolicy::default() };
        let mut kept: Vec<String> = with_last.keep(&all, 100_000).into_iter().collect();
        kept.sort();
        assert_eq!(kept, ["now", "recent"]);
    }

    /// Days, ISO weeks (a week starts on Monday) and months are the calendar's, in UTC.
    #[test]
    fn daily_weekly_and_monthly_follow_the_calendar() {
        // 2026-11-29 (a Sunday) 23:00, 2026-11-30 (Monday) 01:00 and 23:00, 2026-12-01 00:30 UTC.
        let all = [
            snap("sun", 1_795_993_200),
            snap("mon-early", 1_796_000_400),
            snap("mon-late", 1_796_079_600),
            snap("tue", 1_796_085_000),
        ];
        assert_eq!(super::super::chrono_like(all[0].created_unix), "20261129T230000Z");
        assert_eq!(super::super::chrono_like(all[3].created_unix), "20261201T003000Z");
        let keep = |p: KeepPolicy| {
            let mut kept: Vec<String> = p.keep(&all, all[3].created_unix).into_iter().collect();
            kept.sort();
            kept
        };
        assert_eq!(keep(KeepPolicy { daily: 3, ..KeepPolicy::default() }), ["mon-late", "sun", "tue"]);
        assert_eq!(keep(KeepPolicy { weekly: 2, ..KeepPolicy::default() }), ["sun", "tue"]);
        assert_eq!(keep(KeepPolicy { monthly: 2, ..KeepPolicy::default() }), ["mon-late", "tue"]);
    }
}
