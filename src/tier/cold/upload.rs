//! Sealing and uploading: the uploader threads claim dirty chunks that are ready, read each
//! straight into a pack, upload the blocks the store does not have yet and record the chunks
//! as sealed; [`ColdTier::flush`] and [`ColdTier::flush_inode`] make them do it now.
//!
//! Invariants: a chunk record is committed only after `put_pack` returned, so a record always
//! names a block that is in the store; a claimed chunk is recorded as sealed only if its epoch
//! did not move and no write is in flight, otherwise it stays dirty; the records are committed
//! under the state lock, so a writer that dirties a chunk next cannot be overtaken by them. A
//! failed upload leaves its chunks dirty and unclaimed, and is retried with a backoff.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::{ColdError, ColdTier, OpenFiles, State, chunk_len, read_full};
use crate::block::{self, BlockId, CHUNK_SIZE, PackBuilder, ZERO_BLOCK};
use crate::meta::{ChunkRecord, MetaBatch};
use crate::types::Ino;

/// How long a small upload waits for more small files to share its pack.
const GATHER: Duration = Duration::from_millis(200);

struct Claim {
    ino: Ino,
    index: u64,
    epoch: u64,
}

/// A chunk read for sealing: its claim's index, its block id, its length and the bytes of
/// data in it.
type Sealed = (usize, BlockId, u32, u32);

impl ColdTier {
    /// Seals and uploads everything dirty now; returns once nothing is dirty or `timeout`
    /// passed (then `Err` with the bytes still dirty).
    pub fn flush(&self, timeout: Duration) -> Result<(), u64> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        st.flush = true;
        self.work.notify_all();
        let result = loop {
            let busy = st.files.values().any(|f| f.dirty_chunks > 0);
            if !busy {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(st.dirty_bytes.max(1));
            }
            self.changed.wait_for(&mut st, Duration::from_millis(50));
        };
        st.flush = false;
        result
    }

    /// Seals and uploads the dirty chunks of `ino` now (fsync); `Err` with the bytes of it
    /// still dirty when `timeout` passed first.
    pub fn flush_inode(&self, ino: Ino, timeout: Duration) -> Result<(), u64> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        *st.urgent.entry(ino).or_default() += 1;
        self.work.notify_all();
        let result = loop {
            let dirty = st
                .files
                .get(&ino)
                .map_or(0, |f| f.chunks.values().filter(|c| c.dirty).map(|c| c.dirty_len.max(1)).sum());
            if dirty == 0 {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(dirty);
            }
            self.changed.wait_for(&mut st, Duration::from_millis(50));
        };
        if let Some(n) = st.urgent.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                st.urgent.remove(&ino);
            }
        }
        result
    }

    pub(super) fn upload_loop(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let claims = {
                let mut st = self.state.lock();
                loop {
                    let claims = self.claim(&mut st);
                    if !claims.is_empty() {
                        break claims;
                    }
                    if st.stopping {
                        return;
                    }
                    self.work.wait_for(&mut st, Duration::from_millis(100));
                }
            };
            match self.seal(&claims) {
                Ok(()) => backoff = Duration::from_millis(200),
                Err(e) => {
                    self.counters.upload_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("upload failed, will retry in {backoff:?}: {e}");
                    *self.last_error.lock() = Some(e.to_string());
                    self.unclaim(&claims);
                    // A shutdown ends the retries: the session's final flush has had its
                    // deadline, and what is still dirty stays in the data dir (the next
                    // session uploads it). Retrying here would hold `shutdown`, and with it
                    // the session's end, for as long as the store is away.
                    let until = Instant::now() + backoff;
                    let mut st = self.state.lock();
                    while !st.stopping && Instant::now() < until {
                        self.work.wait_until(&mut st, until);
                    }
                    if st.stopping {
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Picks dirty chunks that are ready to seal, up to about one pack.
    fn claim(&self, st: &mut MutexGuard<'_, State>) -> Vec<Claim> {
        let flushing = st.flush || st.stopping;
        let pressure = self.under_pressure(st);
        // First what is settled: chunks of closed files, full chunks (a sequential writer has
        // moved past them) and chunks quiet for `seal_after`. Only under pressure also the
        // partial chunks of files still being written, which would otherwise be uploaded
        // again after their next write.
        let mut out = self.claim_pass(st, flushing);
        if out.is_empty() && pressure && !flushing {
            out = self.claim_pass(st, true);
        }
        // Small files closed one after another: wait a moment for more, so they share a pack
        // (one PUT for many files) — unless someone waits for them or memory is short.
        if !out.is_empty() && !pressure && st.urgent.is_empty() {
            let mut bytes = 0;
            let mut oldest: Option<Instant> = None;
            for cl in &out {
                if let Some(f) = st.files.get(&cl.ino) {
                    bytes += f.chunks.get(&cl.index).map_or(0, |c| c.dirty_len);
                    oldest = match (oldest, f.dirty_since) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
            let young = oldest.is_none_or(|t| t.elapsed() < GATHER);
            if young && bytes < self.store.pack_size() as u64 / 2 {
                for cl in &out {
                    if let Some(c) = st.files.get_mut(&cl.ino).and_then(|f| f.chunks.get_mut(&cl.index)) {
                        c.claimed = false;
                    }
                }
                return Vec::new();
            }
        }
        out
    }

    fn claim_pass(&self, st: &mut MutexGuard<'_, State>, everything: bool) -> Vec<Claim> {
        let budget = self.store.pack_size() as u64;
        let mut bytes = 0u64;
        let mut out = Vec::new();
        let State { files, urgent, dirty_inos, .. } = &mut **st;
        dirty_inos.retain(|ino| files.get(ino).is_some_and(|f| f.dirty_chunks > 0));
        for &ino in dirty_inos.iter() {
            let Some(f) = files.get_mut(&ino) else { continue };
            let settled = everything
                || !f.open
                || urgent.contains_key(&ino)
                || f.dirty_since.is_some_and(|t| t.elapsed() >= self.config.seal_after);
            for (&index, c) in f.chunks.iter_mut() {
                let ready = settled || c.dirty_len >= CHUNK_SIZE;
                if ready && c.dirty && !c.claimed && c.inflight == 0 {
                    c.claimed = true;
                    out.push(Claim { ino, index, epoch: c.epoch });
                    bytes += c.dirty_len.max(1);
                    if bytes >= budget {
                        return out;
                    }
                }
            }
        }
        out
    }

    fn unclaim(&self, claims: &[Claim]) {
        let mut st = self.state.lock();
        for cl in claims {
            if let Some(c) = st.files.get_mut(&cl.ino).and_then(|f| f.chunks.get_mut(&cl.index)) {
                c.claimed = false;
            }
        }
    }

    /// Stores `pack` (when it holds anything): the batch that records where its blocks are.
    fn upload(&self, pack: PackBuilder) -> Result<MetaBatch, ColdError> {
        let mut batch = MetaBatch::new();
        if !pack.is_empty() {
            let locs = self.store.put_pack(pack)?;
            // What went into the store: a sparse block's data, not its holes.
            let bytes: u64 = locs.iter().map(|(_, loc)| loc.stored_len()).sum();
            self.counters.uploaded_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.counters.uploaded_packs.fetch_add(1, Ordering::Relaxed);
            for (id, loc) in &locs {
                batch.put_block(id, loc);
            }
        }
        Ok(batch)
    }

    /// Reads the claimed chunks, uploads the blocks the store does not have, and records the
    /// chunks that did not change meanwhile as sealed. Each chunk is read straight into the
    /// pack, hashed there and encrypted in place (no copy of its plaintext).
    fn seal(&self, claims: &[Claim]) -> Result<(), ColdError> {
        // A claim stops at the first chunk that reaches the pack size: room for one chunk more.
        let mut pack = PackBuilder::new(self.store.pack_size() + CHUNK_SIZE as usize);
        let (sealed, gone) = self.stage_claims(claims, &mut pack)?;
        let batch = self.upload(pack)?;
        self.settle_claims(claims, &sealed, gone, batch)
    }

    /// Reads each claimed chunk into `pack`, hashes it there and seals the blocks the store
    /// does not have yet. Returns the chunks read (a zero block or a block id each) and the
    /// index of each claim with nothing to seal (its file gone, or the chunk past the end).
    fn stage_claims(&self, claims: &[Claim], pack: &mut PackBuilder) -> Result<(Vec<Sealed>, Vec<usize>), ColdError> {
        let mut files = OpenFiles::default();
        let mut sealed: Vec<Sealed> = Vec::new();
        let mut gone = Vec::new();
        let mut seen = HashSet::new();
        for (i, cl) in claims.iter().enumerate() {
            let Some(rec) = self.meta.inode(cl.ino)? else {
                gone.push(i);
                continue;
            };
            let len = chunk_len(rec.attr.size, cl.index);
            if len == 0 {
                gone.push(i);
                continue;
            }
            let start = cl.index * CHUNK_SIZE;
            let file = files.get(&self.hot, cl.ino)?;
            // Only the chunk's data is read (the staged buffer starts as zeros); a chunk that
            // is all hole (punched, zeroed) is the zero block: not read, not hashed.
            let runs = match file {
                Some(file) => self.hot.data(file, cl.ino).data_extents(start..start + len)?,
                None => Vec::new(),
            };
            if runs.is_empty() {
                sealed.push((i, ZERO_BLOCK, len as u32, 0));
                continue;
            }
            let data = pack.stage(len as usize);
            if let Some(file) = file {
                for run in runs {
                    let (from, to) = ((run.start - start) as usize, (run.end - start) as usize);
                    read_full(&self.hot, file, cl.ino, run.start, &mut data[from..to])?;
                }
            }
            // The pages of zeros around the data (holes, or zeros written) are not stored; a
            // chunk with no other pages is the zero block (one scan finds both).
            let data_runs = block::data_runs(pack.staged());
            let id = if data_runs.is_empty() { ZERO_BLOCK } else { self.store.block_id(pack.staged()) };
            let data = data_runs.iter().map(|r| r.len() as u32).sum();
            sealed.push((i, id, len as u32, data));
            // Blocks the store already has (dedup) and zero blocks are not uploaded again.
            if id == ZERO_BLOCK || !seen.insert(id) || self.meta.block(&id)?.is_some() {
                pack.drop_staged();
            } else {
                pack.seal_staged_runs(self.store.keys(), &id, &data_runs);
            }
        }
        Ok((sealed, gone))
    }

    /// Records in the chunk state and the metadata store, in one batch with the upload's
    /// block index, the chunks of `sealed` that did not change meanwhile as sealed, and drops
    /// the `gone` ones unless written meanwhile.
    fn settle_claims(
        &self,
        claims: &[Claim],
        sealed: &[Sealed],
        gone: Vec<usize>,
        mut batch: MetaBatch,
    ) -> Result<(), ColdError> {
        let mut st = self.state.lock();
        let State { files: fstate, dirty_bytes, resident_bytes, .. } = &mut *st;
        let mut touched = HashSet::new();
        for (i, id, len, data) in sealed {
            let cl = &claims[*i];
            touched.insert(cl.ino);
            let Some(f) = fstate.get_mut(&cl.ino) else { continue };
            let Some(c) = f.chunks.get_mut(&cl.index) else { continue };
            c.claimed = false;
            if c.epoch != cl.epoch || c.inflight > 0 || !c.dirty {
                continue; // written meanwhile: stays dirty
            }
            c.dirty = false;
            f.dirty_chunks -= 1;
            *dirty_bytes -= c.dirty_len;
            c.dirty_len = 0;
            let r = ChunkRecord { block: *id, len: *len, data: *data, resident: true };
            c.rec = Some(r);
            c.verified = true;
            *resident_bytes = *resident_bytes - c.local_len.min(*resident_bytes) + u64::from(*data);
            c.local_len = u64::from(*data);
            batch.put_chunk(cl.ino, cl.index, &r);
            batch.delete_unsealed(cl.ino, cl.index);
        }
        for i in gone {
            // Past the end of the file (or the file is gone): nothing to seal. Dropped here
            // unless written meanwhile, so the uploader does not claim it forever.
            let cl = &claims[i];
            touched.insert(cl.ino);
            let Some(f) = fstate.get_mut(&cl.ino) else { continue };
            let Some(c) = f.chunks.get_mut(&cl.index) else { continue };
            c.claimed = false;
            if c.epoch == cl.epoch && c.inflight == 0 {
                if let Some(c) = f.chunks.remove(&cl.index) {
                    if c.dirty {
                        f.dirty_chunks -= 1;
                        *dirty_bytes -= c.dirty_len;
                        batch.delete_unsealed(cl.ino, cl.index);
                    }
                    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
                    if c.rec.is_some() {
                        batch.delete_chunk(cl.ino, cl.index);
                    }
                }
            }
        }
        for ino in touched {
            if let Some(f) = fstate.get_mut(&ino) {
                f.clean_if_sealed(ino, &mut batch);
            }
        }
        // Under the state lock, so a writer that dirties a chunk next cannot be overtaken.
        let committed = self.meta.commit(batch);
        drop(st);
        self.changed.notify_all();
        committed?;
        Ok(())
    }
}
