//! Pack neighbours: a miss on a small file also brings the blocks packed around it, in the
//! same range GET, and keeps them in a small in-memory buffer until a read wants them. Files
//! are packed in the order they were made (the uploaders take dirty files in inode order), and
//! files made together are likely read together (a checkout, a venv, a dataset); but a tree of
//! small directories gives directory-order read-ahead little to go on, and every file of it
//! cost one request after another (issue 24).
//!
//! Invariants:
//! - the buffer is keyed by block id and holds verified plaintext, so an entry is never stale;
//!   it serves a chunk only through the normal fetch path (the chunk claimed, its record's
//!   block and length checked), never a read directly;
//! - it holds at most [`ColdConfig::near_buffer`] bytes, the oldest entries dropped first;
//! - neighbours are fetched only while they are used: once most of those fetched lately were
//!   dropped unused (random reads), a miss fetches its block alone, and one miss in
//!   [`PROBE_EVERY`] tries again.
//!
//! [`ColdConfig::near_buffer`]: super::ColdConfig::near_buffer

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{ColdError, ColdTier};
use crate::block::{BlockId, BlockLoc};
use crate::meta::ChunkRecord;

/// While neighbours go unused, one miss in this many still fetches them (a walk may start).
pub(super) const PROBE_EVERY: u64 = 16;
/// Neighbours fetched before their use decides anything.
const LEARN: u64 = 64;
/// The counts of fetched and used neighbours are halved past this, so the recent past decides.
const DECAY_AT: u64 = 1024;

/// Verified blocks fetched beside a miss, by id, oldest first out.
#[derive(Default)]
pub(super) struct NearBuffer {
    blocks: HashMap<BlockId, Bytes>,
    order: VecDeque<BlockId>,
    bytes: u64,
    /// Neighbours fetched and used lately (decayed), for the on/off decision.
    fetched: u64,
    used: u64,
    misses: u64,
}

impl NearBuffer {
    /// Takes block `id` out if it is here (it is about to be written into its chunk).
    pub(super) fn take(&mut self, id: &BlockId) -> Option<Bytes> {
        let data = self.blocks.remove(id)?;
        self.bytes -= data.len() as u64;
        self.used += 1;
        Some(data)
    }

    /// Keeps `blocks`, dropping the oldest entries beyond `cap` bytes.
    pub(super) fn insert(&mut self, blocks: Vec<(BlockId, Bytes)>, cap: u64) {
        for (id, data) in blocks {
            if data.len() as u64 > cap || self.blocks.contains_key(&id) {
                continue;
            }
            self.fetched += 1;
            self.bytes += data.len() as u64;
            self.blocks.insert(id, data);
            self.order.push_back(id);
        }
        while self.bytes > cap {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(data) = self.blocks.remove(&old) {
                self.bytes -= data.len() as u64;
            }
        }
        // Ids taken out earlier are still queued: drop them from the front lazily, and
        // rebuild the queue when it holds many more ids than the map.
        if self.order.len() > 2 * self.blocks.len() + 64 {
            self.order.retain(|id| self.blocks.contains_key(id));
        }
        if self.fetched > DECAY_AT {
            self.fetched /= 2;
            self.used /= 2;
        }
    }

    /// Whether this miss should fetch neighbours: while they are used (at least one in eight
    /// lately), else one miss in [`PROBE_EVERY`].
    pub(super) fn wanted(&mut self) -> bool {
        self.misses += 1;
        self.fetched < LEARN || self.used * 8 >= self.fetched || self.misses % PROBE_EVERY == 0
    }
}

impl ColdTier {
    /// The block of chunk record `rec` at `loc` for a miss: from the neighbour buffer if an
    /// earlier miss brought it, else from the store with its neighbours when the block is small
    /// and neighbours are being used.
    pub(super) fn get_missed_block(&self, rec: &ChunkRecord, loc: &BlockLoc) -> Result<Bytes, ColdError> {
        if let Some(data) = self.near.lock().take(&rec.block) {
            self.counters.neighbour_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(data);
        }
        let window = self.config.near_window;
        let small = u64::from(loc.sealed_len).saturating_mul(4) <= window;
        if !small || !self.near.lock().wanted() {
            return Ok(self.store.get_block(&rec.block, loc)?);
        }
        let (data, near) = self.store.get_block_near(&rec.block, loc, window)?;
        if !near.is_empty() {
            let bytes: u64 = near.iter().map(|(_, d)| d.len() as u64).sum();
            self.counters.neighbour_blocks.fetch_add(near.len() as u64, Ordering::Relaxed);
            self.counters.neighbour_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.near.lock().insert(near, self.config.near_buffer);
        }
        Ok(data)
    }

    /// [`BlockStore::get_blocks`], with the blocks an earlier miss brought as neighbours taken
    /// from the buffer instead.
    ///
    /// [`BlockStore::get_blocks`]: super::BlockStore::get_blocks
    pub(super) fn get_blocks_buffered(&self, blocks: &[(BlockId, BlockLoc)]) -> Result<Vec<Bytes>, ColdError> {
        let mut out: Vec<Option<Bytes>> = {
            let mut near = self.near.lock();
            blocks.iter().map(|(id, _)| near.take(id)).collect()
        };
        let hits = out.iter().filter(|b| b.is_some()).count() as u64;
        self.counters.neighbour_hits.fetch_add(hits, Ordering::Relaxed);
        let rest: Vec<(BlockId, BlockLoc)> =
            blocks.iter().zip(&out).filter(|(_, got)| got.is_none()).map(|(b, _)| *b).collect();
        if !rest.is_empty() {
            let mut fetched = self.store.get_blocks(&rest)?.into_iter();
            for slot in out.iter_mut().filter(|s| s.is_none()) {
                *slot = fetched.next();
            }
        }
        out.into_iter().map(|b| b.ok_or(ColdError::NotFetched)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u8) -> BlockId {
        [i; 32]
    }

    #[test]
    fn the_buffer_keeps_its_cap_and_drops_the_oldest_first() {
        let mut b = NearBuffer::default();
        b.insert((1..=4).map(|i| (id(i), Bytes::from(vec![i; 100]))).collect(), 300);
        assert!(b.bytes <= 300);
        assert!(b.take(&id(1)).is_none(), "the oldest block stayed past the cap");
        assert_eq!(b.take(&id(4)).as_deref(), Some(&[4u8; 100][..]));
        assert!(b.take(&id(4)).is_none(), "a block is taken once");
        // A block bigger than the whole buffer is not kept.
        b.insert(vec![(id(9), Bytes::from(vec![9; 400]))], 300);
        assert!(b.take(&id(9)).is_none());
    }

    #[test]
    fn neighbours_stop_while_unused_and_are_tried_again_now_and_then() {
        let mut b = NearBuffer::default();
        // Learning: every miss fetches neighbours.
        for i in 0..LEARN as u8 {
            assert!(b.wanted());
            b.insert(vec![(id(i), Bytes::from_static(b"x"))], 1 << 20);
        }
        // None of them used: only one miss in PROBE_EVERY fetches neighbours.
        let on = (0..10 * PROBE_EVERY).filter(|_| b.wanted()).count() as u64;
        assert_eq!(on, 10);
        // Used again (a walk): every miss fetches them.
        for i in 0..LEARN as u8 {
            b.take(&id(i));
        }
        assert!((0..PROBE_EVERY).all(|_| b.wanted()));
    }
}
