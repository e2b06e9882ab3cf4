//! The write side of the cold tier: what the vfs calls before it changes a data file
//! ([`ColdTier::begin_write`], [`ColdTier::begin_zero`], [`ColdTier::begin_shift`]), and the
//! dirty bound that throttles writers.
//!
//! Invariants: every chunk a change touches is marked dirty under the state lock before the
//! caller writes, and its unsealed marker (and the inode's dirty marker) is committed before
//! the write lands, in the caller's one batch ([`WriteGuard::commit`]; a mark stays pending,
//! and every later write of the chunk carries it too, until a batch with it is committed); an evicted or unverified chunk that the change does not overwrite whole is
//! checked or fetched first, so a write never mixes new bytes into a hole or unchecked bytes;
//! writers wait while the dirty bound is exceeded, and are never failed for it. The
//! [`WriteGuard`] returned ends the write (and moves the chunks' epochs) when it is dropped.

use std::fs::File;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::{ColdError, ColdTier, Marks, State, WriteGuard, chunks_of};
use crate::block::CHUNK_SIZE;
use crate::types::Ino;

impl ColdTier {
    /// Before writing `range` of `ino` (whose size is `size`): waits while too much is dirty,
    /// fetches evicted chunks the write only partly covers, and marks the chunks dirty.
    /// Every chunk of `range` is marked, so `range` is what the caller writes (a write, a
    /// copy), never a length a program merely claims.
    ///
    /// `overwrites` says the operation replaces every byte of `range`: a chunk it covers
    /// completely need not be fetched first.
    pub fn begin_write(
        &self,
        ino: Ino,
        file: &File,
        range: Range<u64>,
        size: u64,
        overwrites: bool,
    ) -> Result<WriteGuard<'_>, ColdError> {
        let chunks: Vec<u64> = chunks_of(&range).collect();
        self.begin_change(ino, file, chunks, range, size, overwrites)
    }

    /// Before taking in what a writer the engine did not see wrote into `ino` (FUSE
    /// passthrough: the kernel writes its data file), now `size` bytes: marks every chunk that
    /// holds data dirty, whole. Found from the data file's extents, so the holes of a sparse
    /// file cost nothing (the kernel's writes only add data; a hole is punched through the
    /// engine). Nothing is fetched: such a file is wholly local while the writer is open.
    pub fn begin_rewrite(&self, ino: Ino, file: &File, size: u64) -> Result<WriteGuard<'_>, ColdError> {
        let mut chunks = std::collections::BTreeSet::new();
        for run in self.hot.data(file, ino).data_extents(0..size)? {
            chunks.extend(chunks_of(&run));
        }
        self.begin_change(ino, file, chunks.into_iter().collect(), 0..size, size, true)
    }

    /// Before zeroing `range` of `ino` (punch hole, zero range, the tail of a shrinking
    /// truncate): only chunks that hold data or have a record change; a hole stays a hole and
    /// costs nothing, so a range of any length is cheap.
    pub fn begin_zero(&self, ino: Ino, file: &File, range: Range<u64>, size: u64) -> Result<WriteGuard<'_>, ColdError> {
        let chunks = self.known_chunks(ino, chunks_of(&range));
        self.begin_change(ino, file, chunks, range, size, true)
    }

    /// Before collapsing (`insert` false) or inserting `len` bytes at `offset` of a file of
    /// `size` bytes: every chunk with data from `offset` on moves by `len`, so it and the
    /// chunks it lands on change. Costs what the file holds past `offset`, not its length.
    pub fn begin_shift(
        &self,
        ino: Ino,
        file: &File,
        offset: u64,
        len: u64,
        insert: bool,
        size: u64,
    ) -> Result<WriteGuard<'_>, ColdError> {
        let from = offset / CHUNK_SIZE;
        let held = self.known_chunks(ino, from..u64::MAX);
        let mut chunks: std::collections::BTreeSet<u64> = held.iter().copied().collect();
        for &idx in &held {
            let start = idx * CHUNK_SIZE;
            let moved = if insert {
                start.max(offset).saturating_add(len)..(start + CHUNK_SIZE).saturating_add(len)
            } else {
                start.max(offset + len).saturating_sub(len)..(start + CHUNK_SIZE).saturating_sub(len)
            };
            chunks.extend(chunks_of(&moved));
        }
        let end = if insert { size.saturating_add(len) } else { size };
        // Nothing in the range is overwritten: every byte that moves must be local first.
        self.begin_change(ino, file, chunks.into_iter().collect(), offset..end, size, false)
    }

    /// The chunks of `ino` in `idxs` that have a state (data written here, or a record).
    fn known_chunks(&self, ino: Ino, idxs: Range<u64>) -> Vec<u64> {
        let st = self.state.lock();
        st.files.get(&ino).map_or_else(Vec::new, |f| f.chunks.range(idxs).map(|(i, _)| *i).collect())
    }

    /// Marks `chunks` of `ino` dirty for a change of `range` (see [`ColdTier::begin_write`]).
    fn begin_change(
        &self,
        ino: Ino,
        file: &File,
        chunks: Vec<u64>,
        range: Range<u64>,
        size: u64,
        overwrites: bool,
    ) -> Result<WriteGuard<'_>, ColdError> {
        self.throttle(ino, &chunks);
        let needs_bytes = |idx: u64| {
            let start = idx * CHUNK_SIZE;
            let covers_all = range.start <= start && range.end >= start + CHUNK_SIZE.min(size.saturating_sub(start));
            !(overwrites && covers_all)
        };
        let mut marks = Marks::default();
        {
            // Fetch what must be fetched, then mark under the lock — re-checking, since the
            // evictor may have punched a chunk again between the fetch and the lock.
            let mut st = loop {
                let st = self.state.lock();
                let missing: Vec<u64> = match st.files.get(&ino) {
                    Some(f) => chunks.iter().copied().filter(|&i| needs_bytes(i) && f.not_ready(i)).collect(),
                    None => Vec::new(),
                };
                if missing.is_empty() {
                    break st;
                }
                drop(st);
                for idx in missing {
                    self.verify(ino, file, idx)?;
                    self.hydrate(ino, file, idx)?;
                }
            };
            let State { files, dirty_bytes, resident_bytes, tick, epochs, dirty_inos, .. } = &mut *st;
            *tick += 1;
            let f = files.entry(ino).or_default();
            for &idx in &chunks {
                let c = f.chunks.entry(idx).or_default();
                let start = idx * CHUNK_SIZE;
                let end_in_chunk = range.end.clamp(start, start + CHUNK_SIZE) - start;
                if let Some(r) = c.rec.as_mut().filter(|r| !r.resident) {
                    // A whole-chunk overwrite of an evicted chunk: nothing to fetch. The record
                    // says resident again so that, after a crash, the unsealed mark re-seals it.
                    r.resident = true;
                    c.mark_pending = true;
                }
                if !c.dirty {
                    c.dirty = true;
                    f.dirty_chunks += 1;
                    dirty_inos.insert(ino);
                    c.mark_pending = true;
                }
                if c.mark_pending {
                    marks.chunk(ino, idx, c);
                }
                let start_in_chunk = range.start.clamp(start, start + CHUNK_SIZE) - start;
                let (lo, hi) = if c.dirty_len == 0 {
                    (start_in_chunk, end_in_chunk)
                } else {
                    (c.dirty_from.min(start_in_chunk), (c.dirty_from + c.dirty_len).max(end_in_chunk))
                };
                // The span only grows: it contains the old one.
                *dirty_bytes += hi - lo - c.dirty_len;
                c.dirty_from = lo;
                c.dirty_len = hi - lo;
                // At most the write's bytes more on disk (an overwrite adds none): an upper
                // bound until the chunk is sealed, which counts its data exactly.
                let grown = (c.local_len + (end_in_chunk - start_in_chunk)).min(CHUNK_SIZE);
                *resident_bytes += grown.saturating_sub(c.local_len);
                c.local_len = c.local_len.max(grown);
                c.inflight += 1;
                *epochs += 1;
                c.epoch = *epochs;
                c.last_access = *tick;
            }
            if !chunks.is_empty() {
                f.dirty_since.get_or_insert_with(Instant::now);
                if !f.marked_dirty {
                    f.marked_dirty = true;
                    f.dirty_mark_pending = true;
                }
                if f.dirty_mark_pending {
                    marks.batch.put_dirty(ino);
                    marks.inode = true;
                }
            }
        }
        // The marks are committed by the caller, with its own changes, before the write lands.
        Ok(WriteGuard { tier: self, ino, chunks, marks })
    }

    /// Whether reading `range` of `ino` (or writing it, with `write`) may have to wait: for a
    /// fetch of evicted or unverified chunks, or for the dirty bound. A hint for callers that
    /// serve many requests on few threads; the state may change right after it is given.
    pub fn may_wait(&self, ino: Ino, range: Range<u64>, write: bool) -> bool {
        let chunks = chunks_of(&range);
        let st = self.state.lock();
        let fetch = st.files.get(&ino).is_some_and(|f| chunks.clone().any(|i| f.not_ready(i)));
        fetch || (write && self.over_dirty_bound(&st))
    }

    /// Whether writers that dirty more bytes must wait ([`ColdConfig::max_dirty`]).
    ///
    /// [`ColdConfig::max_dirty`]: super::ColdConfig::max_dirty
    fn over_dirty_bound(&self, st: &State) -> bool {
        st.dirty_bytes >= self.config.max_dirty
    }

    /// Waits while the dirty bound is exceeded and this write would dirty more.
    fn throttle(&self, ino: Ino, chunks: &[u64]) {
        let mut st = self.state.lock();
        loop {
            let adds = match st.files.get(&ino) {
                Some(f) => chunks.iter().any(|i| f.chunks.get(i).is_none_or(|c| !c.dirty)),
                None => !chunks.is_empty(),
            };
            if !adds || !self.over_dirty_bound(&st) || st.stopping {
                return;
            }
            self.changed.wait_for(&mut st, Duration::from_millis(200));
        }
    }
}
