//! Point-in-time restore: the workspace as it was at a given time of day, rebuilt from the
//! newest checkpoint or snapshot whose state is not younger than that time plus the journal
//! batches committed after it up to that time; and the timeline of the points a workspace can
//! be restored to (docs/SEMANTICS.md, "Point-in-time restore").
//!
//! Invariants:
//! - a restore at T holds the batches committed at or before T (by the writing node's journal
//!   clock) that reached the store, and no other: a base whose state time is ≤ T, then the
//!   journal's batches after the base, in order, up to the first one stamped after T. A
//!   writer's batch times never go back (`meta::journal`), so these batches are a prefix of
//!   the journal;
//! - nothing is guessed: a T in the future, before the oldest point the store can rebuild, or
//!   reachable only through journal segments that were deleted, is refused
//!   ([`RemoteError::AtInFuture`], [`RemoteError::AtUnavailable`]) before anything is written;
//! - a file whose data at T had not reached the store (a chunk marked unsealed at T) is named
//!   in the report ([`AtReport::incomplete`]); the caller restores it as the store had it (cut
//!   back, as after a reset), never silently;
//! - everything read from the store goes through the decoders of `remote` (counts, lengths and
//!   times checked there); this module only orders what they return.

use futures::stream::{self, StreamExt, TryStreamExt};
use serde::Serialize;

use super::{Manifest, RemoteError, Result, Workspace};
use crate::crypto::ObjectKind;
use crate::meta::{JournalBatch, MetaStore};
use crate::store::WholeObject;
use crate::types::{FileKind, Ino};

/// How many segments the timeline reads at either end of the journal to find its first and
/// last batch (a writer's first segment after a mount has none).
const SPAN_PROBE: usize = 32;

/// What a restorable point is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PointKind {
    /// The first change of the workspace (its journal from segment 1 is whole).
    Start,
    /// A checkpoint the writer wrote.
    Checkpoint,
    /// A `tierfs sync` snapshot.
    Sync,
}

/// One point of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelinePoint {
    pub kind: PointKind,
    /// The time its state was current at (unix milliseconds) and the same in RFC 3339.
    pub unix_ms: u64,
    pub time: String,
    /// The last batch its state holds.
    pub seq: u64,
    /// A sync's snapshot id and message.
    pub id: Option<String>,
    pub message: Option<String>,
    /// The journal after it is in the store, so any time from it on can be restored through
    /// it (a point whose journal was compacted away restores only itself, by its id).
    pub journal_after: bool,
}

/// The stretch of time the journal in the store covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JournalSpan {
    pub first_segment: u64,
    pub last_segment: u64,
    /// The first and last batch found at its ends (unix milliseconds, and RFC 3339).
    pub from_unix_ms: u64,
    pub to_unix_ms: u64,
    pub from: String,
    pub to: String,
}

/// The points a workspace can be restored to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// Oldest first.
    pub points: Vec<TimelinePoint>,
    pub journal: Option<JournalSpan>,
    /// The oldest time `restore --at` accepts (`None`: nothing to restore).
    pub oldest_unix_ms: Option<u64>,
    pub oldest: Option<String>,
}

/// What a point-in-time restore rebuilt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AtReport {
    /// The time asked for (unix milliseconds) and the same in RFC 3339.
    pub at_unix_ms: u64,
    pub at: String,
    /// The point it started from.
    pub base: TimelinePoint,
    /// Batches replayed after the base, and the last batch of the state restored.
    pub batches: u64,
    pub seq: u64,
    /// When the restored state became current: the last batch replayed (or the base).
    pub state_unix_ms: u64,
    /// Segments read after the base.
    pub segments: u64,
    /// Files whose data at that time had not all reached the store: restored with what the
    /// store had (inode numbers; the caller names them).
    pub incomplete: Vec<Ino>,
    /// Set when the journal skips batches after `seq` that are older than the time asked
    /// for (a checkpoint covered them, and only a newer one holds them): the state restored
    /// is the one at `state_unix_ms`, earlier than asked.
    pub gap_after: Option<u64>,
    /// How long rebuilding the metadata took (reading the base and the journal, applying them).
    pub millis: u64,
}

/// `unix_ms` as RFC 3339 in UTC with milliseconds.
pub fn rfc3339_ms(unix_ms: u64) -> String {
    i64::try_from(unix_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(|| format!("{unix_ms} ms after 1970"), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// A state a restore can start from.
struct Base {
    point: TimelinePoint,
    next_segment: u64,
    manifest: Option<Manifest>,
}

impl Base {
    fn of(kind: PointKind, m: Manifest, listed: &[u64]) -> Base {
        let unix_ms = m.state_ms();
        let point = TimelinePoint {
            kind,
            unix_ms,
            time: rfc3339_ms(unix_ms),
            seq: m.seq,
            id: m.id.clone(),
            message: m.message.clone(),
            journal_after: journal_from(listed, m.next_segment),
        };
        Base { point, next_segment: m.next_segment, manifest: Some(m) }
    }
}

/// Whether the journal after a state that ends before segment `next` is in the store: that
/// segment is, or no segment after it was ever written.
fn journal_from(listed: &[u64], next: u64) -> bool {
    listed.binary_search(&next).is_ok() || listed.last().is_none_or(|&last| last < next)
}

impl Workspace {
    /// Every checkpoint and snapshot, and the start of the journal when it is whole, as
    /// restore bases, oldest state first. `listed`: the journal's segment numbers.
    async fn bases(&self, listed: &[u64]) -> Result<Vec<Base>> {
        let checkpoints: Vec<Option<Manifest>> = stream::iter(self.list_numbers("cp/").await?)
            .map(|seq| async move {
                let key = self.checkpoint_key(seq);
                let what = format!("checkpoint {seq}");
                self.read_manifest(ObjectKind::Head, WholeObject::Checkpoint, &key, &what).await
            })
            .buffered(16)
            .try_collect()
            .await?;
        let mut bases: Vec<Base> =
            checkpoints.into_iter().flatten().map(|m| Base::of(PointKind::Checkpoint, m, listed)).collect();
        for m in self.snapshot_manifests().await? {
            bases.push(Base::of(PointKind::Sync, m, listed));
        }
        if listed.first() == Some(&1) {
            // The journal from its first segment: the workspace from its first change on.
            if let Some(unix_ms) = self.first_batch_ms(listed).await? {
                let point = TimelinePoint {
                    kind: PointKind::Start,
                    unix_ms,
                    time: rfc3339_ms(unix_ms),
                    seq: 0,
                    id: None,
                    message: None,
                    journal_after: true,
                };
                bases.push(Base { point, next_segment: 1, manifest: None });
            }
        }
        bases.sort_by_key(|b| (b.point.unix_ms, b.point.seq));
        Ok(bases)
    }

    /// The time of the first batch in the first segments of `listed` (consecutive ones).
    async fn first_batch_ms(&self, listed: &[u64]) -> Result<Option<u64>> {
        for (i, &n) in listed.iter().take(SPAN_PROBE).enumerate() {
            if n != listed[0] + i as u64 {
                break;
            }
            let Some((_, batches)) = self.read_segment(n).await? else { break };
            if let Some(b) = batches.first() {
                return Ok(Some(b.unix_ms));
            }
        }
        Ok(None)
    }

    /// The points this workspace can be restored to (`tierfs snapshots --timeline`).
    pub async fn timeline(&self) -> Result<Timeline> {
        let listed = self.list_numbers("j/").await?;
        let bases = self.bases(&listed).await?;
        let journal = self.journal_span(&listed).await?;
        let oldest_unix_ms = bases.iter().filter(|b| b.point.journal_after).map(|b| b.point.unix_ms).min();
        Ok(Timeline {
            points: bases.into_iter().map(|b| b.point).collect(),
            journal,
            oldest_unix_ms,
            oldest: oldest_unix_ms.map(rfc3339_ms),
        })
    }

    /// The stretch of time between the first and the last batch of the journal's unbroken
    /// run of segments from its first listed one.
    async fn journal_span(&self, listed: &[u64]) -> Result<Option<JournalSpan>> {
        let Some(&first) = listed.first() else { return Ok(None) };
        let run = listed.iter().enumerate().take_while(|(i, n)| **n == first + *i as u64).count();
        let last = first + run as u64 - 1;
        let Some(from_unix_ms) = self.first_batch_ms(&listed[..run]).await? else { return Ok(None) };
        let mut to_unix_ms = from_unix_ms;
        for n in (first..=last).rev().take(SPAN_PROBE) {
            if let Some(b) = self.read_segment(n).await?.and_then(|(_, batches)| batches.last().cloned()) {
                to_unix_ms = b.unix_ms;
                break;
            }
        }
        Ok(Some(JournalSpan {
            first_segment: first,
            last_segment: last,
            from_unix_ms,
            to_unix_ms,
            from: rfc3339_ms(from_unix_ms),
            to: rfc3339_ms(to_unix_ms),
        }))
    }

    /// Restores the workspace as it was at `at_ms` (unix milliseconds) into the empty `meta`;
    /// `now_ms` is the time of day now (a later `at_ms` is refused). See the module
    /// documentation. The caller cuts files back to their stored data afterwards
    /// (`MetaStore::cut_to_stored_data`), as for any restore.
    pub async fn restore_at(&self, meta: &MetaStore, at_ms: u64, now_ms: u64) -> Result<AtReport> {
        self.restore_before(meta, at_ms, u64::MAX, now_ms).await
    }

    /// [`Workspace::restore_at`] that also stops before batch `before_seq`: the state just
    /// before that batch when it was committed at or before `at_ms` (what `tierfs trash
    /// restore` reads, since several batches can share a millisecond).
    pub async fn restore_before(&self, meta: &MetaStore, at_ms: u64, before_seq: u64, now_ms: u64) -> Result<AtReport> {
        let started = std::time::Instant::now();
        if at_ms > now_ms {
            return Err(RemoteError::AtInFuture { at: rfc3339_ms(at_ms), now: rfc3339_ms(now_ms) });
        }
        let listed = self.list_numbers("j/").await?;
        let bases = self.bases(&listed).await?;
        let usable = |b: &&Base| b.point.unix_ms <= at_ms && b.point.seq < before_seq && b.point.journal_after;
        let Some(base) = bases.iter().rev().find(usable) else {
            let oldest = bases.iter().filter(|b| b.point.journal_after).map(|b| b.point.unix_ms).min();
            return Err(self.unavailable(
                at_ms,
                match oldest {
                    Some(t) => format!("that is before the oldest point the store can rebuild ({})", rfc3339_ms(t)),
                    None if bases.is_empty() && listed.is_empty() => "the store holds nothing of it".into(),
                    None => "the journal after every checkpoint and snapshot it holds was deleted".into(),
                },
            ));
        };
        let limit = Limit { watch_after_ms: u64::MAX, until_ms: at_ms, before_seq };
        let mut report = self.replay_to(meta, &listed, base, limit, &mut |_, _| Ok(())).await?;
        report.at_unix_ms = at_ms;
        report.at = rfc3339_ms(at_ms);
        if base.point.kind == PointKind::Start && report.batches == 0 {
            return Err(self.unavailable(
                at_ms,
                format!("that is before the workspace's first change ({})", rfc3339_ms(base.point.unix_ms)),
            ));
        }
        for ino in meta.unsealed_chunks()?.into_keys() {
            if meta.inode(ino)?.is_some_and(|rec| rec.attr.kind == FileKind::File) {
                report.incomplete.push(ino);
            }
        }
        report.millis = started.elapsed().as_millis() as u64;
        Ok(report)
    }

    fn unavailable(&self, at_ms: u64, why: String) -> RemoteError {
        RemoteError::AtUnavailable { workspace: self.name().to_string(), at: rfc3339_ms(at_ms), why }
    }

    /// Rebuilds the state from `oldest_ms` on (or from the oldest point the store can rebuild,
    /// when that is later) into the empty `meta`, then replays the journal up to `now_ms`,
    /// showing `watch` every batch committed after the state's start, before it is applied.
    pub(super) async fn replay_since(
        &self,
        meta: &MetaStore,
        oldest_ms: u64,
        now_ms: u64,
        watch: &mut Watch<'_>,
    ) -> Result<AtReport> {
        let listed = self.list_numbers("j/").await?;
        let bases = self.bases(&listed).await?;
        let mut usable = bases.iter().filter(|b| b.point.journal_after);
        let Some(first) = usable.next() else { return Err(self.unavailable(oldest_ms, "nothing to replay".into())) };
        let base = bases.iter().rev().find(|b| b.point.journal_after && b.point.unix_ms <= oldest_ms).unwrap_or(first);
        let from = oldest_ms.max(base.point.unix_ms);
        let limit = Limit { watch_after_ms: from, until_ms: now_ms, before_seq: u64::MAX };
        self.replay_to(meta, &listed, base, limit, watch).await
    }

    /// Imports `base` into the empty `meta`, then the journal's unbroken run of segments after
    /// it, batch by batch, up to `limit`.
    async fn replay_to(
        &self,
        meta: &MetaStore,
        listed: &[u64],
        base: &Base,
        limit: Limit,
        watch: &mut Watch<'_>,
    ) -> Result<AtReport> {
        if let Some(m) = &base.manifest {
            self.import_manifest(meta, m).await?;
        }
        let mut report = AtReport {
            at_unix_ms: limit.until_ms,
            at: rfc3339_ms(limit.until_ms),
            base: base.point.clone(),
            batches: 0,
            seq: base.point.seq,
            state_unix_ms: base.point.unix_ms,
            segments: 0,
            incomplete: Vec::new(),
            gap_after: None,
            millis: 0,
        };
        // The journal's unbroken run from the base's next segment, read in order until the
        // first batch past the limit.
        let from = base.next_segment;
        let start = listed.partition_point(|&n| n < from);
        let chain: Vec<u64> =
            listed[start..].iter().enumerate().take_while(|(i, n)| **n == from + *i as u64).map(|(_, n)| *n).collect();
        // Read ahead, 16 segments in flight; what is still in flight past the limit is dropped.
        let mut segments = stream::iter(chain).map(|n| self.read_segment(n)).buffered(16);
        'segments: while let Some(segment) = segments.next().await {
            let Some((_, batches)) = segment? else { break };
            report.segments += 1;
            for b in batches {
                if b.seq <= report.seq {
                    continue;
                }
                if b.unix_ms > limit.until_ms || b.seq >= limit.before_seq {
                    break 'segments;
                }
                if b.seq != report.seq + 1 {
                    report.gap_after = Some(report.seq);
                    break 'segments;
                }
                if b.unix_ms > limit.watch_after_ms {
                    watch(meta, &b)?;
                }
                meta.import(&b.ops, b.seq)?;
                report.seq = b.seq;
                report.state_unix_ms = b.unix_ms;
                report.batches += 1;
            }
        }
        Ok(report)
    }
}

/// Shown each batch of a replay before it is applied, with the state it applies to.
pub(super) type Watch<'a> = dyn FnMut(&MetaStore, &JournalBatch) -> Result<()> + Send + 'a;

/// Where a replay stops, and from when it shows batches to its watcher.
#[derive(Debug, Clone, Copy)]
struct Limit {
    watch_after_ms: u64,
    /// The last batch time applied, and the first batch not applied.
    until_ms: u64,
    before_seq: u64,
}
