//! Following another node's writes: a read-only follower imports each newer head of the
//! workspace and hands the cold tier the chunk records it now names for every file whose
//! records changed; a file opened before the change keeps reading the version it opened,
//! whose blocks come from the store through the stream buffer.
//!
//! Invariants: a cached chunk is kept only while the new record names the same block (the
//! bytes in the data file are that block's, verified when they were fetched); every other
//! cached chunk of the file is punched out of the data file under the state lock, after any
//! fetch of it finished, so no read of the new version sees bytes of the old one. A version
//! read never touches the data file or the chunk state: it is served from blocks by id,
//! which cannot be stale.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::fetch::check_len;
use super::stream::{StreamPart, assemble};
use super::{Chunk, ColdError, ColdTier, OpenFiles, State, chunks_of};
use crate::block::{CHUNK_SIZE, ZERO_BLOCK};
use crate::meta::ChunkRecord;
use crate::types::Ino;

impl ColdTier {
    /// The record of chunk `idx` of `ino` as this engine knows it (`None`: a hole).
    pub fn chunk_record(&self, ino: Ino, idx: u64) -> Option<ChunkRecord> {
        self.state.lock().files.get(&ino).and_then(|f| f.chunks.get(&idx)).and_then(|c| c.rec)
    }

    /// Switches the chunk state of the files in `files` (inode, every chunk record it has
    /// in the new head) to the new head after a follower's `import` of it, which runs under
    /// the state lock: no fetch can record an old block's residency over the new records in
    /// between (see the module invariants).
    pub fn follow_files<E: From<ColdError>>(
        &self,
        files: &BTreeMap<Ino, Vec<(u64, ChunkRecord)>>,
        import: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut st = self.state.lock();
        let busy = |st: &State| {
            files.keys().any(|ino| st.files.get(ino).is_some_and(|f| f.chunks.values().any(|c| c.fetching)))
        };
        while busy(&st) {
            self.changed.wait_for(&mut st, Duration::from_millis(100));
        }
        import()?;
        let mut data_files = OpenFiles::default();
        for (&ino, records) in files {
            self.follow_file(&mut st, &mut data_files, ino, records)?;
        }
        drop(st);
        self.changed.notify_all();
        Ok(())
    }

    /// One file of [`ColdTier::follow_files`].
    fn follow_file(
        &self,
        st: &mut State,
        data_files: &mut OpenFiles,
        ino: Ino,
        records: &[(u64, ChunkRecord)],
    ) -> Result<(), ColdError> {
        let State { files, resident_bytes, epochs, .. } = st;
        let f = files.entry(ino).or_default();
        let mut old = std::mem::take(&mut f.chunks);
        let mut fresh = BTreeMap::new();
        for &(idx, rec) in records {
            let same = |c: &Chunk| c.rec.is_some_and(|r| r.block == rec.block && r.len == rec.len);
            match old.remove(&idx) {
                Some(c) if same(&c) => {
                    fresh.insert(idx, c);
                }
                gone => {
                    if let Some(c) = gone {
                        old.insert(idx, c);
                    }
                    *epochs += 1;
                    let rec = ChunkRecord { resident: false, ..rec };
                    fresh.insert(idx, Chunk { rec: Some(rec), epoch: *epochs, verified: true, ..Chunk::default() });
                }
            }
        }
        f.chunks = fresh;
        f.streaming = false;
        f.stream_ahead_from = None;
        if f.chunks.is_empty() && !f.open && !f.keep_cached {
            files.remove(&ino);
        }
        // What is left of the old state: chunks of the old version, whose bytes must go.
        for (idx, c) in old {
            if c.local_len == 0 {
                continue;
            }
            if let Some(file) = data_files.get(&self.hot, ino)? {
                self.hot.data(file, ino).fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    idx * CHUNK_SIZE,
                    CHUNK_SIZE,
                )?;
            }
            *resident_bytes = resident_bytes.saturating_sub(c.local_len);
        }
        Ok(())
    }

    /// The bytes of `range` of a version of `ino` that is not (or no longer) the cached one:
    /// `chunks` holds the record of every chunk the range covers (`None`: a hole). Blocks
    /// come from the stream buffer, or from the store into it.
    pub fn read_version(
        &self,
        ino: Ino,
        chunks: &[(u64, Option<ChunkRecord>)],
        range: Range<u64>,
    ) -> Result<Bytes, ColdError> {
        debug_assert!(chunks.iter().map(|(i, _)| *i).eq(chunks_of(&range)));
        let hole = ChunkRecord { block: ZERO_BLOCK, len: 0, data: 0, resident: false };
        let mut parts: Vec<StreamPart> = Vec::with_capacity(chunks.len());
        let mut missing = Vec::new();
        {
            let mut st = self.state.lock();
            let State { tick, streamed, .. } = &mut *st;
            *tick += 1;
            for &(idx, rec) in chunks {
                let rec = rec.unwrap_or(hole);
                let data = if rec.block == ZERO_BLOCK { None } else { streamed.get(&rec.block, *tick) };
                if rec.block != ZERO_BLOCK && data.is_none() {
                    missing.push((idx, rec));
                }
                parts.push((idx, rec, data));
            }
        }
        if !missing.is_empty() {
            let fetched = self.fetch_group(ino, &missing);
            let mut st = self.state.lock();
            st.tick += 1;
            let group = st.streamed.new_group(missing.len());
            let State { tick, streamed, .. } = &mut *st;
            for ((idx, rec), result) in missing.iter().zip(fetched) {
                let Some(data) = result? else { continue };
                check_len(ino, *idx, rec, &data)?;
                self.counters.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                streamed.insert(rec.block, data.clone(), *tick, self.config.stream_blocks(), group);
                if let Some(part) = parts.iter_mut().find(|p| p.0 == *idx) {
                    part.2 = Some(data);
                }
            }
        }
        Ok(assemble(&range, &parts))
    }
}
