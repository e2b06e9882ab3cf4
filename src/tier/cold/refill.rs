//! The cache after a reset: a workspace's *hot set* (the chunks its session read first, in the
//! order it first read them, then the others its node holds, most recently used first) is
//! saved in the store, and a fresh node fetches it back into its cache in the background, in
//! that order (the *refill*), so reads after a reset find their data local again, and an
//! environment's imports, which are a notebook's first reads, find theirs first. Also the
//! fetch of chunks of many files at once, which both the refill and directory read-ahead use:
//! blocks of one pack come in one ranged GET, whatever files they belong to.
//!
//! Invariants:
//! - a refill fetch claims its chunk like every fetch ([`ColdTier::start_fetch`]): one fetch
//!   per chunk at a time, and a chunk written, truncated away or fetched meanwhile is skipped;
//! - a refill never evicts: a batch starts only while the cache stays under 90% of its size
//!   (where the evictor stops) and the disk above its free-space floor, and the refill stops
//!   for good at the first batch that does not fit;
//! - a refill batch starts only while no read or write waits for the store and no read-ahead
//!   is queued, so foreground fetches never queue behind it; refilled chunks keep the age
//!   they had (none on a fresh node), so they are evicted before anything used here;
//! - a batch is one stretch of one pack (its planned blocks within [`BATCH_SPAN`] bytes) of
//!   either the set's ordered prefix or the rest, never both, and batches go in the order of
//!   their first chunk in the plan, so the ordered prefix leads;
//!   a batch is read with [`RunJoin::Loose`]: in one ranged GET while the gaps (blocks not
//!   planned, or local already) stay within the bytes it wants, so the refill reads at most
//!   twice what it refills (and a trailer, at most 64 KiB, per run that spans a whole pack),
//!   and a worker holds at most one stretch in memory;
//! - the batches of the set's ordered prefix are fetched by every worker, the rest by one;
//! - each chunk of the plan is fetched by one batch: the plan's next, or the rest of a file
//!   a foreground read found not yet refilled (that file goes first), whichever takes it first;
//! - a hot set is only a hint: it names chunks by inode and index, and whatever record such
//!   a chunk has when the refill reaches it is fetched (or nothing, if it is gone).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::fetch::Fetch;
use super::{ColdError, ColdTier};
use crate::block::{BlockId, BlockLoc, CHUNK_SIZE, ZERO_BLOCK};
use crate::meta::ChunkRecord;
use crate::store::RunJoin;
use crate::types::Ino;

/// A hot set names at most this many chunks (the store's limits derive its size bound from it).
pub use crate::store::limits::{MAX_HOT_CHUNKS, MAX_HOT_ORDERED};
/// A refill batch: about this many bytes of data, in one or a few ranged GETs.
const BATCH_BYTES: u64 = 2 * CHUNK_SIZE;
/// ...or this many chunks (small files; each batch opens their data files at once).
const BATCH_CHUNKS: usize = 256;
/// ...whose blocks lie within this many bytes of one pack: a batch is one stretch of one pack,
/// read in one ranged GET when its planned blocks fill at least half of it
/// ([`RunJoin::Loose`]), so what a batch holds in memory stays within this bound.
const BATCH_SPAN: u64 = 2 * CHUNK_SIZE;
/// How often a refill worker looks again while foreground reads use the store.
const YIELD: Duration = Duration::from_millis(5);

/// The format before the ordered prefix: runs by recency only.
const MAGIC_V1: &[u8; 4] = b"TFH1";
const MAGIC: &[u8; 4] = b"TFH2";
/// One run: `ino u64 | first chunk u64 | count u32`.
const RUN: usize = 20;

/// Chunks of a workspace in the order a fresh node wants them back: first the `ordered`
/// chunks the last session read first, in the order it read them (an environment's imports),
/// then the rest, most recently used first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotSet {
    pub chunks: Vec<(Ino, u64)>,
    /// How many of `chunks`, from the start, are in first-read order.
    pub ordered: usize,
}

/// A hot set that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("the workspace's hot set is damaged: {0}")]
pub struct HotSetError(&'static str);

impl HotSet {
    /// `"TFH2" | p u32 LE | n u32 LE | n × (ino u64 LE | first chunk u64 LE | count u32 LE)`:
    /// runs of consecutive chunks of one file, in the set's order, the first `p` runs being
    /// its ordered prefix (docs/FORMAT.md, "Hot set").
    pub fn encode(&self) -> Vec<u8> {
        let ordered = self.ordered.min(self.chunks.len());
        let prefix = runs(&self.chunks[..ordered]);
        let rest = runs(&self.chunks[ordered..]);
        let mut out = Vec::with_capacity(12 + (prefix.len() + rest.len()) * RUN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(prefix.len() as u32).to_le_bytes());
        out.extend_from_slice(&((prefix.len() + rest.len()) as u32).to_le_bytes());
        for (ino, first, n) in prefix.into_iter().chain(rest) {
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    }

    /// Decodes a set in either format (`"TFH1"` has no ordered prefix), checking every count
    /// and length against the set's bounds ([`MAX_HOT_CHUNKS`], [`MAX_HOT_ORDERED`]).
    pub fn decode(b: &[u8]) -> Result<HotSet, HotSetError> {
        let (prefix_runs, n, runs) = if let Some(body) = b.strip_prefix(MAGIC) {
            let (p, body) = body.split_first_chunk::<4>().ok_or(HotSetError("cut short"))?;
            let (n, runs) = body.split_first_chunk::<4>().ok_or(HotSetError("cut short"))?;
            (u32::from_le_bytes(*p) as usize, u32::from_le_bytes(*n) as usize, runs)
        } else {
            let body = b.strip_prefix(MAGIC_V1).ok_or(HotSetError("not a hot set (bad magic)"))?;
            let (n, runs) = body.split_first_chunk::<4>().ok_or(HotSetError("cut short"))?;
            (0, u32::from_le_bytes(*n) as usize, runs)
        };
        if runs.len() != n.checked_mul(RUN).ok_or(HotSetError("too many runs"))? {
            return Err(HotSetError("its length does not match its run count"));
        }
        if prefix_runs > n {
            return Err(HotSetError("its ordered prefix has more runs than the set"));
        }
        let mut set = HotSet::default();
        for (i, run) in runs.chunks_exact(RUN).enumerate() {
            let ino = u64::from_le_bytes(run[0..8].try_into().expect("8 bytes"));
            let first = u64::from_le_bytes(run[8..16].try_into().expect("8 bytes"));
            let count = u32::from_le_bytes(run[16..20].try_into().expect("4 bytes"));
            if count == 0 || first.checked_add(u64::from(count)).is_none_or(|end| end > u64::MAX / CHUNK_SIZE) {
                return Err(HotSetError("a run is empty or beyond any file"));
            }
            if set.chunks.len() + count as usize > MAX_HOT_CHUNKS {
                return Err(HotSetError("it names more chunks than a hot set may"));
            }
            set.chunks.extend((first..first + u64::from(count)).map(|idx| (ino, idx)));
            if i < prefix_runs {
                set.ordered = set.chunks.len();
                if set.ordered > MAX_HOT_ORDERED {
                    return Err(HotSetError("its ordered prefix names more chunks than it may"));
                }
            }
        }
        Ok(set)
    }
}

/// `chunks` as runs of consecutive chunks of one file, in order.
fn runs(chunks: &[(Ino, u64)]) -> Vec<(Ino, u64, u32)> {
    let mut runs: Vec<(Ino, u64, u32)> = Vec::new();
    for &(ino, idx) in chunks {
        match runs.last_mut() {
            Some((i, first, n)) if *i == ino && *first + u64::from(*n) == idx && *n < u32::MAX => *n += 1,
            _ => runs.push((ino, idx, 1)),
        }
    }
    runs
}

/// Where a refill is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefillState {
    #[default]
    Running,
    /// Every chunk of the plan is back (or was skipped: written or gone meanwhile).
    Done,
    /// Stopped before the end (`stopped` says why).
    Stopped,
}

/// A refill's progress (`tierfs status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefillStats {
    pub state: RefillState,
    /// Chunks of the hot set that were not local when the refill started, and their data bytes.
    pub planned_chunks: u64,
    pub planned_bytes: u64,
    /// Of those, the first ones, from the set's ordered prefix (what the last session read
    /// first, in that order): they are fetched first.
    #[serde(default)]
    pub ordered_chunks: u64,
    /// Of those, fetched back so far.
    pub fetched_chunks: u64,
    pub fetched_bytes: u64,
    /// Of those, not fetched by the refill: resident, written or gone when it got there.
    pub skipped_chunks: u64,
    /// Fetches that failed (the chunk stays in the store; a read fetches it then).
    pub failed_chunks: u64,
    /// Since the refill started (until its last batch while it runs).
    pub elapsed_ms: u64,
    /// Why the refill stopped early (the cache or disk full, the session closing, an error).
    pub stopped: Option<String>,
}

/// One chunk of a refill plan.
#[derive(Clone, Copy)]
struct Planned {
    ino: Ino,
    idx: u64,
    data: u64,
    /// Where its block lay when the refill was planned (`None`: not in the local index; the
    /// fetch reports it). Only to cut the plan into batches: a fetch locates the block again.
    loc: Option<BlockLoc>,
}

/// A running refill's plan, shared by its workers: each chunk is taken by one batch only,
/// either in the plan's order or with its file when a read bumped it.
struct RefillRun {
    plan: Vec<Planned>,
    /// Each chunk of the plan, once taken.
    taken: Vec<AtomicBool>,
    /// The plan's batches, as lists of its indices ([`batches`]).
    batches: Vec<Vec<usize>>,
    /// The plan's indices of each file's chunks.
    by_ino: HashMap<Ino, Vec<usize>>,
    next: AtomicUsize,
    /// Batches holding the set's ordered prefix: all workers fetch those, one the rest.
    prefix_batches: usize,
    /// Why the refill halts (the first reason stays).
    halt: parking_lot::Mutex<Option<String>>,
    /// Bytes of batches being fetched: not resident yet, but already spoken for.
    reserved: parking_lot::Mutex<u64>,
}

impl RefillRun {
    fn new(plan: Vec<Planned>, ordered: usize) -> RefillRun {
        let mut by_ino: HashMap<Ino, Vec<usize>> = HashMap::new();
        for (i, p) in plan.iter().enumerate() {
            by_ino.entry(p.ino).or_default().push(i);
        }
        let batches = batches(&plan, ordered);
        RefillRun {
            taken: plan.iter().map(|_| AtomicBool::new(false)).collect(),
            prefix_batches: batches.iter().take_while(|b| b[0] < ordered).count(),
            batches,
            by_ino,
            plan,
            next: AtomicUsize::new(0),
            halt: parking_lot::Mutex::new(None),
            reserved: parking_lot::Mutex::new(0),
        }
    }

    /// The chunks of plan indices `idxs` no batch took yet, taken now.
    fn claim(&self, idxs: impl IntoIterator<Item = usize>) -> Vec<Planned> {
        idxs.into_iter().filter(|&i| !self.taken[i].swap(true, Ordering::AcqRel)).map(|i| self.plan[i]).collect()
    }
}

impl ColdTier {
    /// The chunks worth having back after a reset, up to 90% of the cache size and
    /// [`MAX_HOT_CHUNKS`]: first those this session read first, in that order (its ordered
    /// prefix), then the others held here, most recently used first. Only chunks whose block is
    /// in the store (a record, not the zero block); the prefix also names chunks evicted since.
    pub fn hot_set(&self) -> HotSet {
        let st = self.state.lock();
        let stored = |ino: Ino, idx: u64| {
            let c = st.files.get(&ino)?.chunks.get(&idx)?;
            c.rec.filter(|r| r.block != ZERO_BLOCK).map(|r| (c, u64::from(r.data)))
        };
        let first: Vec<(Ino, u64, u64)> = st
            .first_reads
            .order()
            .iter()
            .filter_map(|&(ino, idx)| stored(ino, idx).map(|(_, data)| (ino, idx, data)))
            .collect();
        let in_first: std::collections::HashSet<(Ino, u64)> = first.iter().map(|&(i, x, _)| (i, x)).collect();
        let mut held: Vec<(u64, Ino, u64, u64)> = st
            .files
            .iter()
            .flat_map(|(&ino, f)| f.chunks.keys().map(move |&idx| (ino, idx)))
            .filter(|c| !in_first.contains(c))
            .filter_map(|(ino, idx)| match stored(ino, idx) {
                Some((c, data)) if !c.evicted() => Some((c.last_access, ino, idx, data)),
                _ => None,
            })
            .collect();
        drop(st);
        held.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let ordered = first.len();
        let limit = self.config.cache_size.map_or(u64::MAX, |c| c / 10 * 9);
        let mut bytes = 0u64;
        let chunks: Vec<(Ino, u64)> = first
            .into_iter()
            .chain(held.into_iter().map(|(_, ino, idx, data)| (ino, idx, data)))
            .take_while(|&(_, _, data)| {
                bytes = bytes.saturating_add(data);
                bytes <= limit
            })
            .take(MAX_HOT_CHUNKS)
            .map(|(ino, idx, _)| (ino, idx))
            .collect();
        HotSet { ordered: ordered.min(chunks.len()), chunks }
    }

    /// The refill's progress, if one ran in this session.
    pub fn refill_stats(&self) -> Option<RefillStats> {
        self.refill.lock().clone()
    }

    /// Records a refill that could not start (its hot set unreadable), for `status`.
    pub fn refill_not_started(&self, why: String) {
        *self.refill.lock() =
            Some(RefillStats { state: RefillState::Stopped, stopped: Some(why), ..RefillStats::default() });
    }

    /// Fetches the chunks of `set` that are not local back into the cache, in the set's order,
    /// with up to as many workers as read-ahead has (see the module invariants). A file a
    /// foreground read finds not yet refilled goes first: its remaining chunks are the next
    /// batch. `open` gives the data file of an inode (`None`: it is gone); `stop` ends the
    /// refill between batches. Blocking; returns the final progress.
    pub fn refill(
        &self,
        set: &HotSet,
        open: &(dyn Fn(Ino) -> Option<Arc<File>> + Sync),
        stop: &AtomicBool,
    ) -> RefillStats {
        let started = Instant::now();
        let (plan, ordered) = self.refill_plan(set);
        *self.refill.lock() = Some(RefillStats {
            planned_chunks: plan.len() as u64,
            ordered_chunks: ordered as u64,
            planned_bytes: plan.iter().map(|p| p.data).sum(),
            ..RefillStats::default()
        });
        let run = RefillRun::new(plan, ordered);
        self.state.lock().refill_bumps = Some(VecDeque::new());
        let workers = self.config.prefetchers.clamp(1, 4);
        std::thread::scope(|s| {
            for worker in 0..workers {
                let run = &run;
                s.spawn(move || self.refill_worker(run, worker, open, stop, started));
            }
        });
        self.state.lock().refill_bumps = None;
        let mut guard = self.refill.lock();
        let stats = guard.get_or_insert_with(RefillStats::default);
        stats.elapsed_ms = started.elapsed().as_millis() as u64;
        stats.stopped = run.halt.into_inner();
        stats.state = if stats.stopped.is_some() { RefillState::Stopped } else { RefillState::Done };
        stats.clone()
    }

    /// One refill worker: takes batches (a file a read bumped first, else the plan's next) until
    /// the plan is done or the refill halts.
    fn refill_worker(
        &self,
        run: &RefillRun,
        worker: usize,
        open: &(dyn Fn(Ino) -> Option<Arc<File>> + Sync),
        stop: &AtomicBool,
        started: Instant,
    ) {
        loop {
            if let Some(why) = self.refill_may_go(stop, &run.halt) {
                run.halt.lock().get_or_insert(why);
                return;
            }
            // A batch is taken and its room reserved under one lock, so batches reserve in
            // the plan's order: when the cache is about to fill, the chunks it ends up
            // holding are the plan's first, whichever worker runs.
            let mut r = run.reserved.lock();
            if run.halt.lock().is_some() {
                return;
            }
            let bumped = self.state.lock().refill_bumps.as_mut().and_then(VecDeque::pop_front);
            let batch = match bumped {
                Some(ino) => self.bumped_batch(run, ino),
                // Past the ordered prefix (what the last session's first reads, an env's
                // imports, want), one worker goes on: the rest is not urgent, and more
                // workers would take the CPU and disk from this session's own first reads.
                None if worker > 0 && run.next.load(Ordering::Acquire) >= run.prefix_batches => return,
                None => match run.batches.get(run.next.fetch_add(1, Ordering::AcqRel)) {
                    Some(batch) => run.claim(batch.iter().copied()),
                    None => return,
                },
            };
            let (fit, bytes) = self.reserve_fitting(&batch, &mut r, &run.halt);
            drop(r);
            // Each chunk's reservation ends as it lands (it counts as resident from then on),
            // not when the whole batch is back: else a batch's landed bytes count twice, and
            // the next batch finds no room it has.
            let left = std::cell::Cell::new(bytes);
            let landed = |b: u64| {
                let b = b.min(left.get());
                left.set(left.get() - b);
                *run.reserved.lock() -= b;
            };
            if !fit.is_empty() {
                self.refill_batch(fit, open, started, &landed);
            }
            *run.reserved.lock() -= left.get();
        }
    }

    /// The next batch of file `ino`'s planned chunks no batch took yet (a batch's size at
    /// most); the file stays first in line while more are left.
    fn bumped_batch(&self, run: &RefillRun, ino: Ino) -> Vec<Planned> {
        let mut bytes = 0;
        let planned = || run.by_ino.get(&ino).into_iter().flatten().copied();
        let left = planned().filter(|&i| !run.taken[i].load(Ordering::Acquire));
        let batch = run.claim(left.take(BATCH_CHUNKS).take_while(|&i| {
            let fits = bytes < BATCH_BYTES;
            bytes += run.plan[i].data;
            fits
        }));
        let more = planned().any(|i| !run.taken[i].load(Ordering::Acquire));
        if more && let Some(q) = self.state.lock().refill_bumps.as_mut() {
            q.push_front(ino);
        }
        batch
    }

    /// The chunks of `set` to fetch, each once, in the set's order: those evicted here whose
    /// record says they hold data, each with where its block lies (looked up once the state
    /// is unlocked); with how many of them come from its ordered prefix.
    fn refill_plan(&self, set: &HotSet) -> (Vec<Planned>, usize) {
        let st = self.state.lock();
        let mut seen = std::collections::HashSet::new();
        let mut ordered = 0;
        let wanted: Vec<(Ino, u64, ChunkRecord)> = set
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| seen.insert(**c))
            .filter_map(|(i, &(ino, idx))| {
                let c = st.files.get(&ino)?.chunks.get(&idx)?;
                let r = c.rec.filter(|r| c.evicted() && r.block != ZERO_BLOCK)?;
                ordered += usize::from(i < set.ordered);
                Some((ino, idx, r))
            })
            .collect();
        drop(st);
        let plan = wanted
            .into_iter()
            .map(|(ino, idx, r)| Planned {
                ino,
                idx,
                data: u64::from(r.data),
                loc: self.locate(ino, idx, &r).ok().flatten(),
            })
            .collect();
        (plan, ordered)
    }

    /// The part of `batch` that fits in the cache's room beside the bytes already `reserved`
    /// by other workers, reserved in turn; returns it with its bytes. A batch cut short
    /// records why in `halt`: the refill ends where it stops.
    fn reserve_fitting<'a>(
        &self,
        batch: &'a [Planned],
        r: &mut u64,
        halt: &parking_lot::Mutex<Option<String>>,
    ) -> (&'a [Planned], u64) {
        let (room, why) = self.refill_room();
        let mut left = room.saturating_sub(*r);
        let fit = batch
            .iter()
            .take_while(|p| {
                let fits = p.data <= left;
                left = left.saturating_sub(p.data);
                fits
            })
            .count();
        if fit < batch.len() {
            halt.lock().get_or_insert(why);
        }
        let bytes: u64 = batch[..fit].iter().map(|p| p.data).sum();
        *r += bytes;
        (&batch[..fit], bytes)
    }

    /// Waits until the foreground leaves the store alone; `Some(reason)` if the refill must stop.
    fn refill_may_go(&self, stop: &AtomicBool, halt: &parking_lot::Mutex<Option<String>>) -> Option<String> {
        loop {
            if stop.load(Ordering::Acquire) || self.state.lock().stopping {
                return Some("the session is closing".into());
            }
            if halt.lock().is_some() {
                return Some(String::new());
            }
            let busy = self.foreground.load(Ordering::Acquire) > 0 || {
                let st = self.state.lock();
                !st.prefetch.is_empty() || !st.walk.is_empty()
            };
            if !busy {
                return None;
            }
            std::thread::sleep(YIELD);
        }
    }

    /// How many more bytes may be cached without evicting (below 90% of the cache size and
    /// above the disk's free-space floor), and what ends the room.
    pub(super) fn refill_room(&self) -> (u64, String) {
        let resident = self.state.lock().resident_bytes;
        let mut room = (u64::MAX, String::new());
        if let Some(limit) = self.config.cache_size {
            room = (
                (limit / 10 * 9).saturating_sub(resident),
                format!("the cache is full ({resident} of {limit} bytes used)"),
            );
        }
        if let Some(f) = self.free_space() {
            let floor = f.floor + CHUNK_SIZE;
            let disk = f.free.saturating_sub(floor);
            if disk < room.0 {
                room = (disk, format!("the disk is full ({} bytes free, {floor} kept free)", f.free));
            }
        }
        room
    }

    fn refill_batch(
        &self,
        batch: &[Planned],
        open: &(dyn Fn(Ino) -> Option<Arc<File>> + Sync),
        started: Instant,
        landed: &dyn Fn(u64),
    ) {
        let mut files: HashMap<Ino, Option<Arc<File>>> = HashMap::new();
        let items: Vec<(Ino, u64, Arc<File>)> = batch
            .iter()
            .filter_map(|p| files.entry(p.ino).or_insert_with(|| open(p.ino)).clone().map(|f| (p.ino, p.idx, f)))
            .collect();
        let gone = (batch.len() - items.len()) as u64;
        let got = self.fetch_many(&items, false, RunJoin::Loose, landed);
        if let Some(stats) = self.refill.lock().as_mut() {
            stats.fetched_chunks += got.chunks;
            stats.fetched_bytes += got.bytes;
            stats.failed_chunks += got.failed;
            stats.skipped_chunks += gone + (items.len() as u64 - got.chunks - got.failed);
            stats.elapsed_ms = started.elapsed().as_millis() as u64;
        }
    }

    /// Whether the first chunk of `ino` is only in the store (a walk that opens it is cold).
    pub fn first_chunk_evicted(&self, ino: Ino) -> bool {
        self.state.lock().files.get(&ino).and_then(|f| f.chunks.get(&0)).is_some_and(|c| c.evicted())
    }

    /// Fetches chunks of any files (each with its data file) that are evicted and not being
    /// fetched, sorted by where their blocks lie so each pack is read in as few ranged GETs as
    /// the gaps `join` accepts allow; a block several chunks hold is read once. `touch`: the
    /// chunks count as just used (read-ahead for a reader), or keep their age (the refill).
    /// `landed` is told the data bytes of each chunk as it becomes resident.
    pub(super) fn fetch_many(
        &self,
        items: &[(Ino, u64, Arc<File>)],
        touch: bool,
        join: RunJoin,
        landed: &dyn Fn(u64),
    ) -> Fetched {
        let mine: Vec<Claimed<'_>> = {
            let mut st = self.state.lock();
            items
                .iter()
                .filter_map(|(ino, idx, file)| match self.start_fetch(&mut st, *ino, *idx) {
                    Fetch::Mine(rec) => Some(Claimed { ino: *ino, idx: *idx, rec, file }),
                    _ => None,
                })
                .collect()
        };
        let mut done = Fetched::default();
        let mut located: Vec<(BlockLoc, Claimed<'_>)> = Vec::with_capacity(mine.len());
        for c in mine {
            match self.locate(c.ino, c.idx, &c.rec) {
                Ok(Some(loc)) => located.push((loc, c)),
                // A zero block reads from the hole already there.
                Ok(None) => done.count(self.finish_fetch_aged(c.ino, c.idx, c.rec, Ok(()), touch), 0),
                Err(e) => done.count(self.finish_fetch_aged(c.ino, c.idx, c.rec, Err(e), touch), 0),
            }
        }
        located.sort_by_key(|(loc, c)| (loc.pack, loc.offset, c.rec.block));
        // Each block once (a run cannot hold one block twice): `of[k]` is located[k]'s block.
        let mut blocks: Vec<(BlockId, BlockLoc)> = Vec::with_capacity(located.len());
        let of: Vec<usize> = located
            .iter()
            .map(|(loc, c)| {
                if blocks.last() != Some(&(c.rec.block, *loc)) {
                    blocks.push((c.rec.block, *loc));
                }
                blocks.len() - 1
            })
            .collect();
        let results: Vec<Result<bytes::Bytes, ColdError>> = match self.get_blocks_buffered(&blocks, join) {
            Ok(datas) => of.iter().map(|&k| datas.get(k).cloned().ok_or(ColdError::NotFetched)).collect(),
            Err(ColdError::Store(e)) => of.iter().map(|_| Err(ColdError::Store(e.clone()))).collect(),
            Err(_) => of.iter().map(|_| Err(ColdError::NotFetched)).collect(),
        };
        for ((_, c), data) in located.into_iter().zip(results) {
            let stored = data.and_then(|data| self.store_fetched(c.ino, c.file, c.idx, &c.rec, &data, true));
            let result = self.finish_fetch_aged(c.ino, c.idx, c.rec, stored, touch);
            if result.is_ok() {
                landed(u64::from(c.rec.data));
            }
            done.count(result, u64::from(c.rec.data));
        }
        done
    }
}

/// A chunk whose fetch [`ColdTier::fetch_many`] claimed, with its data file.
struct Claimed<'a> {
    ino: Ino,
    idx: u64,
    rec: ChunkRecord,
    file: &'a File,
}

/// What [`ColdTier::fetch_many`] brought back.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Fetched {
    pub chunks: u64,
    pub bytes: u64,
    pub failed: u64,
}

impl Fetched {
    fn count(&mut self, result: Result<(), ColdError>, bytes: u64) {
        match result {
            Ok(()) => {
                self.chunks += 1;
                self.bytes += bytes;
            }
            Err(e) => {
                tracing::debug!("background fetch: {e}");
                self.failed += 1;
            }
        }
    }
}

/// Cuts the plan into batches, as lists of its indices: the planned chunks of one stretch of
/// one pack (blocks within [`BATCH_SPAN`] bytes of its first), at most [`BATCH_CHUNKS`] of
/// them and about [`BATCH_BYTES`] of data (a batch holds at least one chunk); chunks with no
/// location go in batches of their own, and a chunk of half a chunk's data or more alone. The set's ordered prefix (the plan's first `ordered`
/// chunks) is cut apart from the rest, so its batches hold only its chunks and its workers
/// fetch nothing else. The batches are in the order of their first chunk in the plan: the
/// stretch of a pack that holds the plan's first chunk comes first, with the chunks of the
/// same part of the plan that lie beside it (a pack read in a few requests, not one request
/// per gap between the chunks the plan wanted first).
fn batches(plan: &[Planned], ordered: usize) -> Vec<Vec<usize>> {
    let mut by_pack: HashMap<(bool, Option<crate::crypto::Hash>), Vec<usize>> = HashMap::new();
    let mut batches: Vec<Vec<usize>> = Vec::new();
    for (i, p) in plan.iter().enumerate() {
        if p.data >= CHUNK_SIZE / 2 {
            // A large chunk is a request's worth alone, and joined to small ones it would
            // take the room of the plan's next small chunks when the cache is nearly full.
            batches.push(vec![i]);
        } else {
            by_pack.entry((i < ordered, p.loc.map(|l| l.pack))).or_default().push(i);
        }
    }
    for mut same in by_pack.into_values() {
        same.sort_by_key(|&i| (plan[i].loc.map(|l| l.offset), i));
        let mut batch: Vec<usize> = Vec::new();
        let (mut from, mut bytes) = (0, 0);
        for i in same {
            let p = &plan[i];
            let (offset, end) = p.loc.map_or((0, 0), |l| (l.offset, l.range().end));
            if !batch.is_empty() && (batch.len() >= BATCH_CHUNKS || bytes >= BATCH_BYTES || end > from + BATCH_SPAN) {
                batches.push(std::mem::take(&mut batch));
            }
            if batch.is_empty() {
                (from, bytes) = (offset, 0);
            }
            batch.push(i);
            bytes += p.data;
        }
        batches.push(batch);
    }
    for b in &mut batches {
        b.sort_unstable();
    }
    batches.sort_unstable_by_key(|b| b[0]);
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A set in the old format, `"TFH1" | n u32 | n × run`.
    fn v1(runs: &[(u64, u64, u32)]) -> Vec<u8> {
        let mut b = b"TFH1".to_vec();
        b.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for &(ino, first, n) in runs {
            b.extend_from_slice(&ino.to_le_bytes());
            b.extend_from_slice(&first.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        b
    }

    #[test]
    fn a_hot_set_round_trips_in_runs() {
        let set = HotSet { chunks: vec![(5, 0), (5, 1), (5, 2), (9, 7), (5, 3), (2, 0)], ordered: 0 };
        let bytes = set.encode();
        // Four runs: 5:0..3, 9:7, 5:3, 2:0.
        assert_eq!(bytes.len(), 12 + 4 * 20);
        assert_eq!(HotSet::decode(&bytes).expect("decodes"), set);
        assert_eq!(HotSet::decode(&HotSet::default().encode()).expect("empty"), HotSet::default());
    }

    #[test]
    fn the_ordered_prefix_round_trips_and_no_run_spans_its_end() {
        // 7:0..2 read first, then 3:0; the rest continues 3:1 (a run split at the prefix's end).
        let set = HotSet { chunks: vec![(7, 0), (7, 1), (3, 0), (3, 1), (3, 2), (1, 0)], ordered: 3 };
        let bytes = set.encode();
        assert_eq!(&bytes[4..8], &2u32.to_le_bytes(), "two runs in the prefix");
        assert_eq!(&bytes[8..12], &4u32.to_le_bytes(), "4 runs in all: 7:0..2, 3:0 | 3:1..3, 1:0");
        assert_eq!(HotSet::decode(&bytes).expect("decodes"), set);
    }

    #[test]
    fn an_old_hot_set_decodes_with_no_ordered_prefix() {
        let set = HotSet::decode(&v1(&[(5, 0, 2), (9, 7, 1)])).expect("TFH1 decodes");
        assert_eq!(set, HotSet { chunks: vec![(5, 0), (5, 1), (9, 7)], ordered: 0 });
        assert!(HotSet::decode(&v1(&[(5, 0, 0)])).is_err(), "an empty run in the old format");
        let mut short = v1(&[(5, 0, 2)]);
        short.pop();
        assert!(HotSet::decode(&short).is_err());
    }

    #[test]
    fn damaged_hot_sets_are_refused() {
        let good = HotSet { chunks: vec![(1, 0), (1, 1)], ordered: 0 }.encode();
        assert!(HotSet::decode(&good[..good.len() - 1]).is_err());
        assert!(HotSet::decode(b"TFH2\0\0\0\0").is_err(), "cut short before the run count");
        assert!(HotSet::decode(b"TFH3\0\0\0\0\0\0\0\0").is_err(), "an unknown format");
        let mut zero = good.clone();
        zero[28..32].copy_from_slice(&0u32.to_le_bytes());
        assert!(HotSet::decode(&zero).is_err());
        let mut far = good.clone();
        far[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(HotSet::decode(&far).is_err());
        let mut huge = good.clone();
        huge[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(HotSet::decode(&huge).is_err(), "more chunks than a hot set may name");
        let mut prefix = good.clone();
        prefix[4..8].copy_from_slice(&2u32.to_le_bytes());
        assert!(HotSet::decode(&prefix).is_err(), "a prefix of more runs than the set has");
        let mut count = good;
        count[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(HotSet::decode(&count).is_err(), "a run count the length does not match");
    }

    fn planned(pack: u8, offset: u64, len: u32) -> Planned {
        let loc = BlockLoc { pack: [pack; 32], offset, sealed_len: len, plain_len: len - 44, pack_len: 1 << 24 };
        Planned { ino: 1, idx: offset, data: u64::from(len - 44), loc: Some(loc) }
    }

    #[test]
    fn a_plan_is_cut_into_stretches_of_packs_in_the_order_of_their_first_chunk() {
        let kib = 1u32 << 10;
        // Read first: the second chunk of packs 1 and 2, then their first; then the rest,
        // which lies between them in pack 1, and one chunk with no location.
        let mut plan = vec![
            planned(1, 100_000, 50 * kib),
            planned(2, 0, 50 * kib),
            planned(1, 0, 50 * kib),
            planned(1, 300_000, 50 * kib),
            planned(1, 200_000, 50 * kib),
        ];
        plan.push(Planned { loc: None, ..plan[0] });
        // Pack 1's prefix (indices 0, 2, 3) in one batch, then pack 2's; the rest apart.
        assert_eq!(batches(&plan, 4), vec![vec![0, 2, 3], vec![1], vec![4], vec![5]]);
        // No prefix: pack 1 whole, in one batch, first since it holds the plan's first chunk.
        assert_eq!(batches(&plan, 0), vec![vec![0, 2, 3, 4], vec![1], vec![5]]);
        // A stretch ends BATCH_SPAN bytes from its first block; a batch at BATCH_CHUNKS.
        let far: Vec<Planned> = (0..3).map(|i| planned(1, i * (BATCH_SPAN / 2 + 1), 4 * kib)).collect();
        assert_eq!(batches(&far, 0), vec![vec![0, 1], vec![2]]);
        // A large chunk between small ones of its pack goes alone.
        let big = [planned(1, 0, 4 * kib), planned(1, 4096, 3 << 20), planned(1, 4 << 20, 4 * kib)];
        assert_eq!(batches(&big, 0), vec![vec![0, 2], vec![1]]);
        let many: Vec<Planned> = (0..BATCH_CHUNKS as u64 + 1).map(|i| planned(1, i * 100, 100)).collect();
        let cut = batches(&many, 0);
        assert_eq!((cut.len(), cut[0].len()), (2, BATCH_CHUNKS));
        assert!(batches(&[], 0).is_empty());
    }

    #[test]
    fn an_ordered_prefix_past_its_bound_is_refused() {
        let n = MAX_HOT_ORDERED as u32 + 1;
        let over = HotSet { chunks: (0..u64::from(n)).map(|i| (1, i)).collect(), ordered: n as usize };
        assert!(HotSet::decode(&over.encode()).is_err(), "more ordered chunks than a prefix may hold");
        let at = HotSet { chunks: (0..u64::from(n)).map(|i| (1, i)).collect(), ordered: n as usize - 1 };
        assert_eq!(HotSet::decode(&at.encode()).expect("at the bound").ordered, n as usize - 1);
    }
}
