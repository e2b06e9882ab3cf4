//! The cache after a reset: a workspace's *hot set* (the chunks its node holds, most recently
//! used first) is saved in the store, and a fresh node fetches it back into its cache in the
//! background (the *refill*), so reads after a reset find their data local again. Also the
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
//! - a hot set is only a hint: it names chunks by inode and index, and whatever record such
//!   a chunk has when the refill reaches it is fetched (or nothing, if it is gone).

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::fetch::Fetch;
use super::{ColdError, ColdTier};
use crate::block::{BlockId, BlockLoc, CHUNK_SIZE, ZERO_BLOCK};
use crate::meta::ChunkRecord;
use crate::types::Ino;

/// A hot set names at most this many chunks (the store's limits derive its size bound from it).
pub use crate::store::limits::MAX_HOT_CHUNKS;
/// A refill batch: about this many bytes of data, in one or a few ranged GETs.
const BATCH_BYTES: u64 = 2 * CHUNK_SIZE;
/// ...or this many chunks (small files).
const BATCH_CHUNKS: usize = 256;
/// Files waiting for directory-order read-ahead at most.
pub const MAX_WALK_QUEUE: usize = 4096;
/// Bytes of one batch of directory-order read-ahead at most (what one fetcher holds in memory,
/// as a read-ahead group does).
const WALK_BATCH_BYTES: u64 = 4 * CHUNK_SIZE;
/// How often a refill worker looks again while foreground reads use the store.
const YIELD: Duration = Duration::from_millis(5);

const MAGIC: &[u8; 4] = b"TFH1";

/// Chunks of a workspace, most recently used first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotSet {
    pub chunks: Vec<(Ino, u64)>,
}

/// A hot set that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("the workspace's hot set is damaged: {0}")]
pub struct HotSetError(&'static str);

impl HotSet {
    /// `"TFH1" | n u32 LE | n × (ino u64 LE | first chunk u64 LE | count u32 LE)`: runs of
    /// consecutive chunks of one file, in the set's order (docs/FORMAT.md, "Hot set").
    pub fn encode(&self) -> Vec<u8> {
        let mut runs: Vec<(Ino, u64, u32)> = Vec::new();
        for &(ino, idx) in &self.chunks {
            match runs.last_mut() {
                Some((i, first, n)) if *i == ino && *first + u64::from(*n) == idx && *n < u32::MAX => *n += 1,
                _ => runs.push((ino, idx, 1)),
            }
        }
        let mut out = Vec::with_capacity(8 + runs.len() * 20);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for (ino, first, n) in runs {
            out.extend_from_slice(&ino.to_le_bytes());
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<HotSet, HotSetError> {
        let body = b.strip_prefix(MAGIC).ok_or(HotSetError("not a hot set (bad magic)"))?;
        let (n, runs) = body.split_first_chunk::<4>().ok_or(HotSetError("cut short"))?;
        let n = u32::from_le_bytes(*n) as usize;
        if runs.len() != n.checked_mul(20).ok_or(HotSetError("too many runs"))? {
            return Err(HotSetError("its length does not match its run count"));
        }
        let mut chunks = Vec::new();
        for run in runs.chunks_exact(20) {
            let ino = u64::from_le_bytes(run[0..8].try_into().expect("8 bytes"));
            let first = u64::from_le_bytes(run[8..16].try_into().expect("8 bytes"));
            let count = u32::from_le_bytes(run[16..20].try_into().expect("4 bytes"));
            if count == 0 || first.checked_add(u64::from(count)).is_none_or(|end| end > u64::MAX / CHUNK_SIZE) {
                return Err(HotSetError("a run is empty or beyond any file"));
            }
            if chunks.len() + count as usize > MAX_HOT_CHUNKS {
                return Err(HotSetError("it names more chunks than a hot set may"));
            }
            chunks.extend((first..first + u64::from(count)).map(|idx| (ino, idx)));
        }
        Ok(HotSet { chunks })
    }
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
}

impl ColdTier {
    /// The chunks worth having back after a reset: those held here with their block in the
    /// store, most recently used first, up to 90% of the cache size and [`MAX_HOT_CHUNKS`].
    pub fn hot_set(&self) -> HotSet {
        let mut held: Vec<(u64, Ino, u64, u64)> = {
            let st = self.state.lock();
            st.files
                .iter()
                .flat_map(|(&ino, f)| {
                    f.chunks.iter().filter_map(move |(&idx, c)| match c.rec {
                        Some(r) if !c.evicted() && r.block != ZERO_BLOCK => {
                            Some((c.last_access, ino, idx, u64::from(r.data)))
                        }
                        _ => None,
                    })
                })
                .collect()
        };
        held.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        let limit = self.config.cache_size.map_or(u64::MAX, |c| c / 10 * 9);
        let mut bytes = 0u64;
        let chunks = held
            .into_iter()
            .take_while(|&(_, _, _, data)| {
                bytes = bytes.saturating_add(data);
                bytes <= limit
            })
            .take(MAX_HOT_CHUNKS)
            .map(|(_, ino, idx, _)| (ino, idx))
            .collect();
        HotSet { chunks }
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

    /// Fetches the chunks of `set` that are not local back into the cache, most recent first,
    /// with up to as many workers as read-ahead has (see the module invariants). `open` gives
    /// the data file of an inode (`None`: it is gone); `stop` ends the refill between
    /// batches. Blocking; returns the final progress.
    pub fn refill(
        &self,
        set: &HotSet,
        open: &(dyn Fn(Ino) -> Option<Arc<File>> + Sync),
        stop: &AtomicBool,
    ) -> RefillStats {
        let started = Instant::now();
        let plan = self.refill_plan(set);
        *self.refill.lock() = Some(RefillStats {
            planned_chunks: plan.len() as u64,
            planned_bytes: plan.iter().map(|p| p.data).sum(),
            ..RefillStats::default()
        });
        let batches = batches(&plan);
        let next = AtomicUsize::new(0);
        let halt: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);
        // Bytes of batches being fetched: not resident yet, but already spoken for.
        let reserved = parking_lot::Mutex::new(0u64);
        let workers = self.config.prefetchers.clamp(1, 4);
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    loop {
                        if let Some(why) = self.refill_may_go(stop, &halt) {
                            halt.lock().get_or_insert(why);
                            return;
                        }
                        let Some(batch) = batches.get(next.fetch_add(1, Ordering::AcqRel)) else { return };
                        let (fit, bytes) = self.reserve_fitting(batch, &reserved, &halt);
                        if !fit.is_empty() {
                            self.refill_batch(fit, open, started);
                        }
                        *reserved.lock() -= bytes;
                    }
                });
            }
        });
        let mut guard = self.refill.lock();
        let stats = guard.get_or_insert_with(RefillStats::default);
        stats.elapsed_ms = started.elapsed().as_millis() as u64;
        stats.stopped = halt.into_inner();
        stats.state = if stats.stopped.is_some() { RefillState::Stopped } else { RefillState::Done };
        stats.clone()
    }

    /// The chunks of `set` to fetch, each once, in the set's order: those evicted here whose
    /// record says they hold data.
    fn refill_plan(&self, set: &HotSet) -> Vec<Planned> {
        let st = self.state.lock();
        let mut seen = std::collections::HashSet::new();
        set.chunks
            .iter()
            .filter(|c| seen.insert(**c))
            .filter_map(|&(ino, idx)| {
                let c = st.files.get(&ino)?.chunks.get(&idx)?;
                let r = c.rec.filter(|r| c.evicted() && r.block != ZERO_BLOCK)?;
                Some(Planned { ino, idx, data: u64::from(r.data) })
            })
            .collect()
    }

    /// The part of `batch` that fits in the cache's room beside the bytes already `reserved`
    /// by other workers, reserved in turn; returns it with its bytes. A batch cut short
    /// records why in `halt`: the refill ends where it stops.
    fn reserve_fitting<'a>(
        &self,
        batch: &'a [Planned],
        reserved: &parking_lot::Mutex<u64>,
        halt: &parking_lot::Mutex<Option<String>>,
    ) -> (&'a [Planned], u64) {
        let mut r = reserved.lock();
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
    fn refill_room(&self) -> (u64, String) {
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

    fn refill_batch(&self, batch: &[Planned], open: &(dyn Fn(Ino) -> Option<Arc<File>> + Sync), started: Instant) {
        let mut files: HashMap<Ino, Option<Arc<File>>> = HashMap::new();
        let items: Vec<(Ino, u64, Arc<File>)> = batch
            .iter()
            .filter_map(|p| files.entry(p.ino).or_insert_with(|| open(p.ino)).clone().map(|f| (p.ino, p.idx, f)))
            .collect();
        let gone = (batch.len() - items.len()) as u64;
        let got = self.fetch_many(&items, false);
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

    /// A walk of the listing of `dir` opened `opened`: its misses judge pack neighbours as the
    /// walk's (`near.rs`), and the first chunks of `inos` are queued for directory-order
    /// read-ahead (the read-ahead threads fetch them in batches, sorted by pack, several
    /// ranged GETs at once). At most [`MAX_WALK_QUEUE`] wait.
    pub fn walk_ahead(&self, opened: Ino, dir: Ino, inos: Vec<Ino>) {
        let mut st = self.state.lock();
        if let Some(f) = st.files.get_mut(&opened) {
            f.walk = Some(dir);
        }
        if inos.is_empty() {
            return;
        }
        let room = MAX_WALK_QUEUE.saturating_sub(st.walk.len());
        st.walk.extend(inos.into_iter().take(room));
        drop(st);
        self.ahead.notify_all();
    }

    /// Fetches the first chunks of `inos` that are still evicted and not being fetched (one
    /// batch of directory-order read-ahead): those that fit in [`WALK_BATCH_BYTES`] and in the
    /// cache's room without evicting; the rest wait at the front of the queue (or, without
    /// room, are left to their reader). Streamed files are left to their reader.
    pub(super) fn fetch_walk(&self, inos: &[Ino]) {
        let (room, _) = self.refill_room();
        let mut left = room.min(WALK_BATCH_BYTES);
        let mut taken = 0;
        let cold: Vec<Ino> = {
            let mut st = self.state.lock();
            let mut cold = Vec::new();
            for &ino in inos {
                let data = st.files.get(&ino).and_then(|f| match f.chunks.get(&0) {
                    Some(c) if !f.streaming && c.evicted() && !c.fetching => c.rec.map(|r| u64::from(r.data)),
                    _ => None,
                });
                if let Some(data) = data {
                    // A first chunk is at most a quarter of a batch: a batch with room takes one.
                    if data > left {
                        break;
                    }
                    left = left.saturating_sub(data);
                    cold.push(ino);
                }
                taken += 1;
            }
            if room >= WALK_BATCH_BYTES {
                for &ino in inos[taken..].iter().rev() {
                    st.walk.push_front(ino);
                }
            }
            cold
        };
        let items: Vec<(Ino, u64, Arc<File>)> = cold
            .into_iter()
            .filter_map(|ino| match self.hot.open_or_create(ino) {
                Ok(f) => Some((ino, 0, Arc::new(f))),
                Err(e) => {
                    tracing::debug!("read-ahead of inode {ino}: {e}");
                    None
                }
            })
            .collect();
        self.fetch_many(&items, true);
    }

    /// Fetches chunks of any files (each with its data file) that are evicted and not being
    /// fetched, sorted by where their blocks lie so each pack is read in as few ranged GETs as
    /// its gaps allow. `touch`: the chunks count as just used (read-ahead for a reader), or
    /// keep their age (the refill).
    pub(super) fn fetch_many(&self, items: &[(Ino, u64, Arc<File>)], touch: bool) -> Fetched {
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
        located.sort_by_key(|(loc, _)| (loc.pack, loc.offset));
        let blocks: Vec<(BlockId, BlockLoc)> = located.iter().map(|(loc, c)| (c.rec.block, *loc)).collect();
        let results: Vec<Result<bytes::Bytes, ColdError>> = match self.get_blocks_buffered(&blocks) {
            Ok(datas) => datas.into_iter().map(Ok).collect(),
            Err(ColdError::Store(e)) => blocks.iter().map(|_| Err(ColdError::Store(e.clone()))).collect(),
            Err(_) => blocks.iter().map(|_| Err(ColdError::NotFetched)).collect(),
        };
        for ((_, c), data) in located.into_iter().zip(results) {
            let stored = data.and_then(|data| self.store_fetched(c.ino, c.file, c.idx, &c.rec, &data, true));
            done.count(self.finish_fetch_aged(c.ino, c.idx, c.rec, stored, touch), u64::from(c.rec.data));
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

/// Cuts the plan into batches of at most `BATCH_CHUNKS` chunks and about `BATCH_BYTES`
/// (a batch always holds at least one chunk).
fn batches(plan: &[Planned]) -> Vec<&[Planned]> {
    let mut batches: Vec<&[Planned]> = Vec::new();
    let mut rest = plan;
    while !rest.is_empty() {
        let mut bytes = 0;
        let n = rest
            .iter()
            .take(BATCH_CHUNKS)
            .take_while(|p| {
                let fits = bytes < BATCH_BYTES;
                bytes += p.data;
                fits
            })
            .count()
            .max(1);
        let (batch, tail) = rest.split_at(n);
        batches.push(batch);
        rest = tail;
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_set_round_trips_in_runs() {
        let set = HotSet { chunks: vec![(5, 0), (5, 1), (5, 2), (9, 7), (5, 3), (2, 0)] };
        let bytes = set.encode();
        // Four runs: 5:0..3, 9:7, 5:3, 2:0.
        assert_eq!(bytes.len(), 8 + 4 * 20);
        assert_eq!(HotSet::decode(&bytes).expect("decodes"), set);
        assert_eq!(HotSet::decode(&HotSet::default().encode()).expect("empty"), HotSet::default());
    }

    #[test]
    fn damaged_hot_sets_are_refused() {
        let good = HotSet { chunks: vec![(1, 0), (1, 1)] }.encode();
        assert!(HotSet::decode(&good[..good.len() - 1]).is_err());
        assert!(HotSet::decode(b"TFH2\0\0\0\0").is_err());
        let mut zero = good.clone();
        zero[24..28].copy_from_slice(&0u32.to_le_bytes());
        assert!(HotSet::decode(&zero).is_err());
        let mut far = good.clone();
        far[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(HotSet::decode(&far).is_err());
        let mut huge = good;
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(HotSet::decode(&huge).is_err(), "more chunks than a hot set may name");
    }
}
