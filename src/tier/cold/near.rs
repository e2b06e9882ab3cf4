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
//! - neighbours are fetched only while they pay, judged per *stream*: the walk of one
//!   directory's listing (`vfs/walk.rs`), or all reads outside any walk together. Once most of
//!   the neighbours a stream fetched lately were dropped unused (random reads, or a walk of
//!   files made round-robin across directories, whose pack neighbours belong to other
//!   directories), its misses fetch their block alone, and one miss in [`PROBE_EVERY`] tries
//!   again; a stream whose neighbours are used again gets them again. A new stream starts from
//!   what all streams saw lately, so a tree of many small directories does not learn afresh
//!   in each. At most [`MAX_STREAMS`] streams are tracked, the one missed longest ago dropped.
//!
//! [`ColdConfig::near_buffer`]: super::ColdConfig::near_buffer

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{ColdError, ColdTier};
use crate::block::{BlockId, BlockLoc};
use crate::meta::ChunkRecord;
use crate::store::RunJoin;
use crate::types::Ino;

/// While neighbours go unused, one miss in this many still fetches them (a walk may start).
pub(super) const PROBE_EVERY: u64 = 16;
/// Neighbours fetched before their use decides anything.
const LEARN: u64 = 64;
/// The counts of fetched and used neighbours are halved past this, so the recent past decides.
const DECAY_AT: u64 = 1024;
/// Streams whose payback is tracked at once.
const MAX_STREAMS: usize = 256;

/// Whose misses fetched a neighbour: the walk of a directory's listing, or (`None`) any read
/// outside a walk.
pub(super) type Stream = Option<Ino>;

/// Neighbours fetched and used lately (decayed), and misses, for the on/off decision.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Payback {
    fetched: u64,
    used: u64,
    misses: u64,
    /// When this stream last missed (the buffer's miss count), to drop the stalest.
    last: u64,
}

impl Payback {
    /// Neighbours pay while at least one in eight is used lately (or too few were fetched yet
    /// to tell); else one miss in [`PROBE_EVERY`] fetches them.
    fn pays(&self) -> bool {
        self.fetched < LEARN || self.used * 8 >= self.fetched || self.misses % PROBE_EVERY == 0
    }

    fn fetched(&mut self, n: u64) {
        self.fetched += n;
        if self.fetched > DECAY_AT {
            self.fetched /= 2;
            self.used /= 2;
        }
    }

    /// A new stream's start: the ratio `all` saw lately, scaled down to [`LEARN`] neighbours so
    /// that the stream's own ones soon outweigh it (nothing while `all` is still learning).
    fn inherited(all: &Payback) -> Payback {
        if all.fetched < LEARN {
            return Payback::default();
        }
        Payback { fetched: LEARN, used: all.used.min(all.fetched) * LEARN / all.fetched, ..Payback::default() }
    }
}

/// Verified blocks fetched beside a miss, by id (with the stream that fetched them), oldest
/// first out.
#[derive(Default)]
pub(super) struct NearBuffer {
    blocks: HashMap<BlockId, (Bytes, Stream)>,
    order: VecDeque<BlockId>,
    bytes: u64,
    /// Every stream's neighbours together, and each tracked stream's.
    all: Payback,
    streams: HashMap<Stream, Payback>,
}

impl NearBuffer {
    /// Takes block `id` out if it is here (it is about to be written into its chunk); the
    /// stream that fetched it is paid back.
    pub(super) fn take(&mut self, id: &BlockId) -> Option<Bytes> {
        let (data, stream) = self.blocks.remove(id)?;
        self.bytes -= data.len() as u64;
        self.all.used += 1;
        if let Some(p) = self.streams.get_mut(&stream) {
            p.used += 1;
        }
        Some(data)
    }

    /// Keeps `blocks`, which a miss of `stream` fetched, dropping the oldest entries beyond
    /// `cap` bytes.
    pub(super) fn insert(&mut self, blocks: Vec<(BlockId, Bytes)>, stream: Stream, cap: u64) {
        let mut kept = 0;
        for (id, data) in blocks {
            if data.len() as u64 > cap || self.blocks.contains_key(&id) {
                continue;
            }
            kept += 1;
            self.bytes += data.len() as u64;
            self.blocks.insert(id, (data, stream));
            self.order.push_back(id);
        }
        self.all.fetched(kept);
        if let Some(p) = self.streams.get_mut(&stream) {
            p.fetched(kept);
        }
        while self.bytes > cap {
            let Some(old) = self.order.pop_front() else { break };
            if let Some((data, _)) = self.blocks.remove(&old) {
                self.bytes -= data.len() as u64;
            }
        }
        // Ids taken out earlier are still queued: drop them from the front lazily, and
        // rebuild the queue when it holds many more ids than the map.
        if self.order.len() > 2 * self.blocks.len() + 64 {
            self.order.retain(|id| self.blocks.contains_key(id));
        }
    }

    /// Whether this miss of `stream` should fetch neighbours (see the module invariants).
    pub(super) fn wanted(&mut self, stream: Stream) -> bool {
        self.all.misses += 1;
        let now = self.all.misses;
        if !self.streams.contains_key(&stream) && self.streams.len() >= MAX_STREAMS {
            let stalest = self.streams.iter().min_by_key(|(_, p)| p.last).map(|(s, _)| *s);
            stalest.and_then(|s| self.streams.remove(&s));
        }
        let all = self.all;
        let p = self.streams.entry(stream).or_insert_with(|| Payback::inherited(&all));
        p.misses += 1;
        p.last = now;
        p.pays()
    }
}

impl ColdTier {
    /// The block of chunk record `rec` at `loc` for a miss of `stream`: from the neighbour
    /// buffer if an earlier miss brought it, else from the store with its neighbours when the
    /// block is small and neighbours pay for this stream.
    pub(super) fn get_missed_block(
        &self,
        stream: Stream,
        rec: &ChunkRecord,
        loc: &BlockLoc,
    ) -> Result<Bytes, ColdError> {
        if let Some(data) = self.near.lock().take(&rec.block) {
            self.counters.neighbour_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(data);
        }
        let window = self.config.near_window;
        let small = u64::from(loc.sealed_len).saturating_mul(4) <= window;
        if !small || !self.near.lock().wanted(stream) {
            return Ok(self.store.get_block(&rec.block, loc)?);
        }
        let (data, near) = self.store.get_block_near(&rec.block, loc, window)?;
        if !near.is_empty() {
            let bytes: u64 = near.iter().map(|(_, d)| d.len() as u64).sum();
            self.counters.neighbour_blocks.fetch_add(near.len() as u64, Ordering::Relaxed);
            self.counters.neighbour_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.near.lock().insert(near, stream, self.config.near_buffer);
        }
        Ok(data)
    }

    /// [`BlockStore::get_blocks`], with the blocks an earlier miss brought as neighbours taken
    /// from the buffer instead.
    ///
    /// [`BlockStore::get_blocks`]: super::BlockStore::get_blocks
    pub(super) fn get_blocks_buffered(
        &self,
        blocks: &[(BlockId, BlockLoc)],
        join: RunJoin,
    ) -> Result<Vec<Bytes>, ColdError> {
        let mut out: Vec<Option<Bytes>> = {
            let mut near = self.near.lock();
            blocks.iter().map(|(id, _)| near.take(id)).collect()
        };
        let hits = out.iter().filter(|b| b.is_some()).count() as u64;
        self.counters.neighbour_hits.fetch_add(hits, Ordering::Relaxed);
        let rest: Vec<(BlockId, BlockLoc)> =
            blocks.iter().zip(&out).filter(|(_, got)| got.is_none()).map(|(b, _)| *b).collect();
        if !rest.is_empty() {
            let mut fetched = self.store.get_blocks(&rest, join)?.into_iter();
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

    fn id(i: u64) -> BlockId {
        let mut id = [0; 32];
        id[..8].copy_from_slice(&i.to_le_bytes());
        id
    }

    /// A miss of `stream` that fetches `n` neighbours (ids from `first`) if it wants them.
    fn miss(b: &mut NearBuffer, stream: Stream, first: u64, n: u64) -> bool {
        let wanted = b.wanted(stream);
        if wanted {
            b.insert((first..first + n).map(|i| (id(i), Bytes::from_static(b"x"))).collect(), stream, 1 << 30);
        }
        wanted
    }

    #[test]
    fn the_buffer_keeps_its_cap_and_drops_the_oldest_first() {
        let mut b = NearBuffer::default();
        b.insert((1..=4).map(|i| (id(i), Bytes::from(vec![i as u8; 100]))).collect(), None, 300);
        assert!(b.bytes <= 300);
        assert!(b.take(&id(1)).is_none(), "the oldest block stayed past the cap");
        assert_eq!(b.take(&id(4)).as_deref(), Some(&[4u8; 100][..]));
        assert!(b.take(&id(4)).is_none(), "a block is taken once");
        // A block bigger than the whole buffer is not kept.
        b.insert(vec![(id(9), Bytes::from(vec![9; 400]))], None, 300);
        assert!(b.take(&id(9)).is_none());
    }

    #[test]
    fn neighbours_stop_while_unused_and_are_tried_again_now_and_then() {
        let mut b = NearBuffer::default();
        // Learning: every miss fetches neighbours.
        for i in 0..LEARN {
            assert!(miss(&mut b, None, i, 1));
        }
        // None of them used: only one miss in PROBE_EVERY fetches neighbours.
        let on = (0..10 * PROBE_EVERY).filter(|_| b.wanted(None)).count() as u64;
        assert_eq!(on, 10);
        // Used again (a walk): every miss fetches them.
        for i in 0..LEARN {
            b.take(&id(i));
        }
        assert!((0..PROBE_EVERY).all(|_| b.wanted(None)));
    }

    #[test]
    fn each_walk_pays_for_its_own_neighbours() {
        let mut b = NearBuffer::default();
        let (paying, wasting) = (Some(7), Some(8));
        // Two walks miss in turn, 8 neighbours a miss; only the first one's are read.
        let mut next = 0;
        for _ in 0..32 {
            if miss(&mut b, paying, next, 8) {
                (next..next + 8).for_each(|i| assert!(b.take(&id(i)).is_some()));
            }
            next += 8;
            miss(&mut b, wasting, next, 8);
            next += 8;
        }
        let on = |b: &mut NearBuffer, s| (0..4 * PROBE_EVERY).filter(|_| b.wanted(s)).count() as u64;
        assert_eq!(on(&mut b, paying), 4 * PROBE_EVERY, "the walk that reads its neighbours keeps them");
        assert!(on(&mut b, wasting) <= 5, "the walk whose neighbours go unread still fetches them");
        // The wasting walk's neighbours start to pay: it fetches them again.
        let mut probes = 0;
        while probes < 8 {
            if miss(&mut b, wasting, next, 8) {
                (next..next + 8).for_each(|i| assert!(b.take(&id(i)).is_some()));
                probes += 1;
            }
            next += 8;
        }
        assert!((0..PROBE_EVERY).all(|_| b.wanted(wasting)), "paying again, it fetches on every miss");
    }

    #[test]
    fn a_new_walk_starts_from_what_the_others_saw_and_streams_are_bounded() {
        let mut b = NearBuffer::default();
        // Many walks whose neighbours go unread (round-robin directories).
        for s in 0..MAX_STREAMS as u64 + 10 {
            miss(&mut b, Some(s), s * 100, 20);
        }
        assert_eq!(b.streams.len(), MAX_STREAMS, "the stalest stream was dropped");
        assert!(!b.streams.contains_key(&Some(0)));
        // A new walk inherits "unused": it does not fetch neighbours on its first miss.
        assert!(!b.wanted(Some(1 << 40)));
        // On a fresh buffer a new walk learns: it fetches them.
        assert!(NearBuffer::default().wanted(Some(1)));
    }
}
