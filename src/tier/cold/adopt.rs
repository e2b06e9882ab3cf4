//! Adoption: a front end that keeps a file's bytes elsewhere (watch mode: the watched
//! directory holds them) hands the cold tier a file's whole new content as chunk records of
//! blocks it already put in the store. The chunks are recorded evicted, so this node keeps no
//! copy; a read fetches them as it fetches any evicted chunk.
//!
//! Invariants: every record handed in names a block that is in the store (the caller put its
//! pack first); the file's old chunk state is replaced whole under the state lock, after any
//! fetch of it finished, and every record that goes is deleted in the same batch that records
//! the new ones, so a crash leaves the old content or the new, never a mix. A chunk of the new
//! content with no record is a hole.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{BlockStore, Chunk, ColdTier, State};
use crate::meta::{ChunkRecord, MetaBatch};
use crate::types::Ino;

impl ColdTier {
    /// The store the cold tier puts its blocks in (a front end that adopts chunks puts its
    /// own packs there first).
    pub fn block_store(&self) -> &Arc<dyn BlockStore> {
        &self.store
    }

    /// Counts a pack a front end put itself (`uploaded_bytes` and `uploaded_packs` in
    /// [`ColdTier::stats`] cover every upload, so `status` and `sync` report them).
    pub fn count_upload(&self, bytes: u64) {
        self.counters.uploaded_bytes.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        self.counters.uploaded_packs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The chunk records of `ino` this engine knows (index order); a missing index is a hole.
    pub fn chunk_records(&self, ino: Ino) -> Vec<(u64, ChunkRecord)> {
        let st = self.state.lock();
        st.files
            .get(&ino)
            .map_or_else(Vec::new, |f| f.chunks.iter().filter_map(|(&i, c)| c.rec.map(|r| (i, r))).collect())
    }

    /// Makes `chunks` (index, record of a block in the store) the whole content of `ino`; the
    /// caller commits `batch` with the file's new size, and empties its data file first (the
    /// new chunks are not resident). Records are stored as evicted whatever `resident` says.
    pub fn adopt(&self, ino: Ino, chunks: &[(u64, ChunkRecord)], batch: &mut MetaBatch) {
        let mut st = self.state.lock();
        while st.files.get(&ino).is_some_and(|f| f.chunks.values().any(|c| c.fetching)) {
            self.changed.wait_for(&mut st, Duration::from_millis(100));
        }
        let State { files, dirty_bytes, resident_bytes, epochs, .. } = &mut *st;
        let f = files.entry(ino).or_default();
        let old = std::mem::take(&mut f.chunks);
        for (idx, c) in old {
            if c.dirty {
                f.dirty_chunks -= 1;
                *dirty_bytes -= c.dirty_len;
                batch.delete_unsealed(ino, idx);
            }
            if !c.evicted() {
                *resident_bytes = resident_bytes.saturating_sub(c.local_len);
            }
            if c.rec.is_some() {
                batch.delete_chunk(ino, idx);
            }
        }
        let mut fresh = BTreeMap::new();
        for &(idx, rec) in chunks {
            let rec = ChunkRecord { resident: false, ..rec };
            batch.put_chunk(ino, idx, &rec);
            // A new epoch: a claim an uploader may hold on the old chunk never matches it.
            *epochs += 1;
            fresh.insert(idx, Chunk { rec: Some(rec), epoch: *epochs, verified: true, ..Chunk::default() });
        }
        f.chunks = fresh;
        f.dirty_since = None;
        if f.marked_dirty {
            f.marked_dirty = false;
            batch.delete_dirty(ino);
        }
        if f.chunks.is_empty() && !f.open && !f.keep_cached {
            files.remove(&ino);
        }
        drop(st);
        self.changed.notify_all();
    }
}
