//! The read side of the cold tier: bringing evicted chunks back into the data file before a
//! read or a write uses them, and read-ahead, which fetches the chunks after a reader in
//! groups so that blocks next to each other in one pack come in one ranged GET.
//!
//! Invariants: one fetch per chunk at a time (`fetching`, claimed under the state lock; other
//! callers wait for it or leave it); a fetched block must have its record's length before it
//! is written; a chunk becomes resident and verified only once its bytes are written, and that
//! residency is committed under the state lock, so it cannot overtake a later eviction's
//! record; a read pins its chunks ([`ReadGuard`]) so the evictor cannot punch them between the
//! fetch and the `pread`.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::MutexGuard;

use super::{ColdError, ColdTier, MAX_REFILL_BUMPS, ReadGuard, State, chunks_of};
use crate::block::{self, BlockId, BlockLoc, CHUNK_SIZE, ZERO_BLOCK};
use crate::meta::{ChunkRecord, MetaBatch};
use crate::store::RunJoin;
use crate::types::Ino;

/// Counts foreground fetches in flight while alive (see [`ColdTier::hydrate`]).
pub(super) struct Foreground<'a>(&'a AtomicUsize);

impl<'a> Foreground<'a> {
    pub(super) fn new(count: &'a AtomicUsize) -> Foreground<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Foreground(count)
    }
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Read-ahead fetches up to this many consecutive chunks of a file together.
pub(super) const FETCH_GROUP: usize = 4;

/// What [`ColdTier::start_fetch`] found.
pub(super) enum Fetch {
    /// Resident (or gone): nothing to fetch.
    Done,
    /// Someone else is fetching it.
    Busy,
    /// This caller fetches it (its record).
    Mine(ChunkRecord),
}

impl ColdTier {
    /// Before reading `range` of `ino`: fetches evicted chunks and pins them until the guard
    /// is dropped (so the evictor cannot punch them before the read), and queues read-ahead.
    pub fn begin_read(&self, ino: Ino, file: &File, range: Range<u64>) -> Result<ReadGuard<'_>, ColdError> {
        let chunks = chunks_of(&range);
        let mut missed = false;
        let mut pinned = Vec::new();
        loop {
            let missing: Vec<u64> = {
                let mut st = self.state.lock();
                let State { files, tick, first_reads, refill_bumps, .. } = &mut *st;
                *tick += 1;
                let Some(f) = files.get_mut(&ino) else {
                    return Ok(ReadGuard { tier: self, ino, chunks: Vec::new() });
                };
                // Only chunks with a state: a hole (no record, never written) is read from
                // the data file's own hole, and costs nothing here however long it is.
                let missing: Vec<u64> =
                    f.chunks.range(chunks.clone()).filter(|(_, c)| c.not_ready()).map(|(i, _)| *i).collect();
                if missing.is_empty() {
                    for (&idx, c) in f.chunks.range_mut(chunks.clone()) {
                        c.last_access = *tick;
                        c.readers += 1;
                        pinned.push(idx);
                    }
                    first_reads.record(ino, pinned.iter().copied(), Instant::now);
                    break;
                }
                // A refill is running and has not reached this file yet: the rest of it next.
                if let Some(q) = refill_bumps.as_mut().filter(|q| q.len() < MAX_REFILL_BUMPS && !q.contains(&ino)) {
                    q.push_back(ino);
                }
                missing
            };
            missed = true;
            for idx in missing {
                self.verify(ino, file, idx)?;
                self.hydrate(ino, file, idx)?;
            }
        }
        if missed {
            self.counters.read_misses.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.read_hits.fetch_add(1, Ordering::Relaxed);
            self.counters.read_hit_bytes.fetch_add(range.end.saturating_sub(range.start), Ordering::Relaxed);
        }
        let guard = ReadGuard { tier: self, ino, chunks: pinned };
        // Read-ahead: when a read reaches evicted data, or the chunk after it is evicted.
        let mut st = self.state.lock();
        let ahead: Vec<u64> = match st.files.get(&ino) {
            Some(f) => {
                let next = chunks.end;
                if missed || f.chunks.get(&next).is_some_and(|c| c.evicted() && !c.fetching) {
                    (next..next + self.config.prefetch_chunks)
                        .filter(|i| f.chunks.get(i).is_some_and(|c| c.evicted() && !c.fetching))
                        .collect()
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        };
        if !ahead.is_empty() {
            for idx in ahead {
                if !st.prefetch.contains(&(ino, idx)) {
                    st.prefetch.push_back((ino, idx));
                }
            }
            drop(st);
            self.ahead.notify_all();
        }
        Ok(guard)
    }

    /// Fetches and pins every chunk of `ino` (lseek, warm-up).
    pub fn begin_read_all(&self, ino: Ino, file: &File) -> Result<ReadGuard<'_>, ColdError> {
        let end = match self.state.lock().files.get(&ino) {
            Some(f) => f.chunks.keys().next_back().map_or(0, |last| (last + 1) * CHUNK_SIZE),
            None => 0,
        };
        self.begin_read(ino, file, 0..end)
    }

    /// Makes chunk `idx` of `ino` resident, fetching its block if it was evicted. Concurrent
    /// callers for one chunk share one fetch.
    pub(super) fn hydrate(&self, ino: Ino, file: &File, idx: u64) -> Result<(), ColdError> {
        // A caller waits for this: the refill stays out of the store's way meanwhile.
        let _waiting = Foreground::new(&self.foreground);
        let Some(rec) = self.claim_fetch(ino, idx) else { return Ok(()) };
        let result = self.fetch_into(ino, file, idx, &rec);
        self.finish_fetch(ino, idx, rec, result)
    }

    /// Claims the fetch of chunk `idx` of `ino`, waiting while someone else fetches it;
    /// `None`: nothing to fetch (any more).
    fn claim_fetch(&self, ino: Ino, idx: u64) -> Option<ChunkRecord> {
        let mut st = self.state.lock();
        loop {
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Done => return None,
                Fetch::Mine(rec) => return Some(rec),
                Fetch::Busy => {
                    self.changed.wait_for(&mut st, Duration::from_millis(100));
                }
            }
        }
    }

    /// Claims the fetch of chunk `idx` of `ino` if it is evicted and nobody fetches it yet.
    pub(super) fn start_fetch(&self, st: &mut MutexGuard<'_, State>, ino: Ino, idx: u64) -> Fetch {
        let Some(c) = st.files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { return Fetch::Done };
        match c.rec {
            Some(rec) if c.evicted() && !c.fetching => {
                c.fetching = true;
                Fetch::Mine(rec)
            }
            _ if c.evicted() => Fetch::Busy,
            _ => Fetch::Done,
        }
    }

    /// Ends a fetch started by [`ColdTier::start_fetch`]: on success the chunk is resident,
    /// verified and the most recently used (it is often fetched ahead of its reader).
    fn finish_fetch(
        &self,
        ino: Ino,
        idx: u64,
        rec: ChunkRecord,
        result: Result<(), ColdError>,
    ) -> Result<(), ColdError> {
        self.finish_fetch_aged(ino, idx, rec, result, true)
    }

    /// [`ColdTier::finish_fetch`]; `touch == false` leaves the chunk's age as it was (a refill:
    /// nobody used it on this node yet).
    pub(super) fn finish_fetch_aged(
        &self,
        ino: Ino,
        idx: u64,
        rec: ChunkRecord,
        result: Result<(), ColdError>,
        touch: bool,
    ) -> Result<(), ColdError> {
        let mut st = self.state.lock();
        st.tick += 1;
        let State { files, resident_bytes, tick, .. } = &mut *st;
        if let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) {
            c.fetching = false;
            if touch {
                c.last_access = *tick;
            }
            if result.is_ok() {
                let mut r = rec;
                r.resident = true;
                c.rec = Some(r);
                c.verified = true;
                c.local_len = u64::from(r.data);
                *resident_bytes += c.local_len;
                let mut b = MetaBatch::new();
                b.set_chunk_residency(ino, idx, &r);
                // Committed under the state lock so it cannot overtake a later eviction's record.
                let committed = self.meta.commit(b);
                drop(st);
                self.changed.notify_all();
                return committed.map_err(ColdError::from);
            }
        }
        drop(st);
        self.changed.notify_all();
        result
    }

    /// The location of a chunk's block (`None` for the zero block, which is never stored).
    pub(super) fn locate(&self, ino: Ino, idx: u64, rec: &ChunkRecord) -> Result<Option<BlockLoc>, ColdError> {
        if rec.block == ZERO_BLOCK {
            return Ok(None);
        }
        let loc = self.meta.block(&rec.block)?.ok_or_else(|| ColdError::MissingLocation {
            ino,
            index: idx,
            block: hex::encode(rec.block),
        })?;
        Ok(Some(loc))
    }

    /// Writes a fetched block into the chunk's hole.
    /// `fetched`: the bytes came from the store (not from the stream buffer).
    pub(super) fn store_fetched(
        &self,
        ino: Ino,
        file: &File,
        idx: u64,
        rec: &ChunkRecord,
        data: &[u8],
        fetched: bool,
    ) -> Result<(), ColdError> {
        check_len(ino, idx, rec, data)?;
        // Only the data: the block's pages of zeros stay holes of the data file.
        let at = idx * CHUNK_SIZE;
        for run in block::data_runs(data) {
            self.hot.data(file, ino).write_at(at + run.start as u64, &data[run])?;
        }
        if fetched {
            self.counters.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fetch_into(&self, ino: Ino, file: &File, idx: u64, rec: &ChunkRecord) -> Result<(), ColdError> {
        // A zero block: the punched hole already reads as zeros.
        let Some(loc) = self.locate(ino, idx, rec)? else { return Ok(()) };
        // A streamed file's block may be in memory already (a write into a streamed chunk).
        // The walk that opened it, if any, judges pack neighbours (`near.rs`).
        let (buffered, stream) = {
            let mut st = self.state.lock();
            let tick = st.tick;
            (st.streamed.get(&rec.block, tick), st.files.get(&ino).and_then(|f| f.walk))
        };
        if let Some(data) = buffered {
            return self.store_fetched(ino, file, idx, rec, &data, false);
        }
        let data = self.get_missed_block(stream, rec, &loc)?;
        self.store_fetched(ino, file, idx, rec, &data, true)
    }

    /// Fetches several chunks of one file at once (read-ahead): blocks that lie next to each
    /// other in one pack come in one ranged GET.
    /// `file`: the data file, if there is one (a streamed file needs none: a node that has
    /// never cached a byte of it has none).
    fn hydrate_group(&self, ino: Ino, file: Option<&File>, idxs: &[u64]) {
        // Where the blocks go: the data file, or (`None`) the stream buffer.
        let (mut mine, into): (Vec<(u64, ChunkRecord)>, Option<&File>) = {
            let mut st = self.state.lock();
            let streaming = st.files.get(&ino).is_some_and(|f| f.streaming);
            let into = match file {
                _ if streaming => None,
                Some(file) => Some(file),
                // Neither streamed nor cached here: nothing to fetch into.
                None => return,
            };
            let State { files, streamed, .. } = &*st;
            // A streamed chunk whose block is in the buffer already needs nothing.
            let buffered = |idx: &u64| {
                streaming
                    && files
                        .get(&ino)
                        .and_then(|f| f.chunks.get(idx))
                        .and_then(|c| c.rec)
                        .is_some_and(|r| streamed.blocks.contains_key(&r.block))
            };
            let wanted: Vec<u64> = idxs.iter().copied().filter(|idx| !buffered(idx)).collect();
            let mine = wanted
                .iter()
                .filter_map(|&idx| match self.start_fetch(&mut st, ino, idx) {
                    Fetch::Mine(rec) => Some((idx, rec)),
                    _ => None,
                })
                .collect();
            (mine, into)
        };
        self.extend_to_pack_end(ino, &mut mine, into.is_none());
        let results = self.fetch_group(ino, &mine);
        let group = self.state.lock().streamed.new_group(mine.len());
        for ((idx, rec), result) in mine.into_iter().zip(results) {
            let done = match into {
                Some(file) => {
                    let stored = result.and_then(|data| match data {
                        Some(data) => self.store_fetched(ino, file, idx, &rec, &data, true),
                        None => Ok(()),
                    });
                    self.finish_fetch(ino, idx, rec, stored)
                }
                // A streamed file: the blocks go to the stream buffer, the chunks stay evicted.
                None => self.finish_streamed(ino, idx, &rec, result, group),
            };
            if let Err(e) = done {
                tracing::debug!("read-ahead of inode {ino} chunk {idx}: {e}");
            }
        }
    }

    /// Claims the chunks right after `mine` whose blocks lie in the same pack as its last one,
    /// so that read-ahead reads each pack in one request. A server may read a whole pack for
    /// any range of it (moto does): two groups that share a pack cost it the pack twice, and
    /// with 4 MiB blocks in 16 MiB packs most groups of four did.
    fn extend_to_pack_end(&self, ino: Ino, mine: &mut Vec<(u64, ChunkRecord)>, streaming: bool) {
        let Some(&(last_idx, last_rec)) = mine.last() else { return };
        let Ok(Some(last_loc)) = self.locate(ino, last_idx, &last_rec) else { return };
        for idx in last_idx + 1..=last_idx + FETCH_GROUP as u64 {
            let rec = {
                let st = self.state.lock();
                let chunk = st.files.get(&ino).and_then(|f| f.chunks.get(&idx));
                chunk.filter(|c| c.evicted() && !c.dirty && !c.fetching).and_then(|c| c.rec)
            };
            let Some(rec) = rec else { break };
            match self.locate(ino, idx, &rec) {
                Ok(Some(loc)) if loc.pack == last_loc.pack => {}
                _ => break,
            }
            let mut st = self.state.lock();
            if streaming && st.streamed.blocks.contains_key(&rec.block) {
                break;
            }
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Mine(rec) => mine.push((idx, rec)),
                _ => break,
            }
        }
    }

    /// The blocks of the claimed chunks `mine` of `ino`, in order (`None`: the zero block).
    pub(super) fn fetch_group(&self, ino: Ino, mine: &[(u64, ChunkRecord)]) -> Vec<Result<Option<Bytes>, ColdError>> {
        let mut wanted = Vec::new();
        let mut results: Vec<Option<Result<Option<Bytes>, ColdError>>> = Vec::with_capacity(mine.len());
        for (idx, rec) in mine {
            match self.locate(ino, *idx, rec) {
                Ok(Some(loc)) => {
                    wanted.push((results.len(), (rec.block, loc)));
                    results.push(None);
                }
                Ok(None) => results.push(Some(Ok(None))),
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if !wanted.is_empty() {
            let blocks: Vec<(BlockId, BlockLoc)> = wanted.iter().map(|(_, b)| *b).collect();
            match self.get_blocks_buffered(&blocks, RunJoin::Tight) {
                Ok(datas) => {
                    for ((slot, _), data) in wanted.iter().zip(datas) {
                        results[*slot] = Some(Ok(Some(data)));
                    }
                }
                Err(ColdError::Store(e)) => {
                    for (slot, _) in &wanted {
                        results[*slot] = Some(Err(ColdError::Store(e.clone())));
                    }
                }
                Err(_) => {}
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(|| Err(ColdError::NotFetched))).collect()
    }

    pub(super) fn prefetch_loop(self: Arc<Self>) {
        loop {
            let (ino, idxs) = {
                let mut st = self.state.lock();
                loop {
                    if st.stopping {
                        return;
                    }
                    if st.prefetch.is_empty() && !st.walk.is_empty() {
                        // Directory-order read-ahead: after the read-ahead of files being read.
                        drop(st);
                        self.fetch_walk();
                        st = self.state.lock();
                        continue;
                    }
                    if let Some((ino, first)) = st.prefetch.pop_front() {
                        // The chunks queued right after it, of the same file, go with it.
                        let mut idxs = vec![first];
                        while idxs.len() < FETCH_GROUP {
                            let next = first + idxs.len() as u64;
                            match st.prefetch.iter().position(|&j| j == (ino, next)) {
                                Some(pos) => {
                                    st.prefetch.remove(pos);
                                    idxs.push(next);
                                }
                                None => break,
                            }
                        }
                        break (ino, idxs);
                    }
                    self.ahead.wait_for(&mut st, Duration::from_millis(500));
                }
            };
            // A streamed file may have no data file (nothing of it was ever cached here).
            match self.hot.open_existing(ino) {
                Ok(file) => self.hydrate_group(ino, file.as_ref(), &idxs),
                Err(e) => tracing::debug!("read-ahead of inode {ino}: {e}"),
            }
        }
    }
}

/// A fetched block must have the length its chunk record names.
pub(super) fn check_len(ino: Ino, idx: u64, rec: &ChunkRecord, data: &[u8]) -> Result<(), ColdError> {
    if data.len() == rec.len as usize {
        Ok(())
    } else {
        Err(ColdError::WrongLength { ino, index: idx, got: data.len(), want: rec.len as usize })
    }
}
