//! Streamed reads: a file larger than [`ColdConfig::stream_above`] is read from the store's
//! blocks through a small in-memory [`StreamBuffer`], not through the data file, so a file that
//! cannot stay cached does not push everything else out of the cache.
//!
//! Invariants: a read is served from the buffer only while its chunk is evicted, clean and its
//! record names that block (the buffer is keyed by block id), so it never shows stale bytes;
//! the buffer holds at most its cap of blocks' worth of memory, counting each fetch group
//! whole until its last block goes.
//!
//! [`ColdConfig::stream_above`]: super::ColdConfig::stream_above

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::fetch::{Fetch, check_len};
use super::{ColdError, ColdTier, FileState, State, chunks_of};
use crate::block::{BlockId, CHUNK_SIZE, ZERO_BLOCK};
use crate::meta::ChunkRecord;
use crate::types::Ino;

/// Verified plaintext of recently fetched blocks of streamed files, by block id.
/// Content-addressed, so an entry is never stale; whether it may serve a read is decided by
/// the chunk's state. When full, blocks that were read already go first (least recently used
/// first), then blocks fetched ahead and not read yet (oldest first): plain LRU dropped blocks
/// fetched ahead before their reader got to them, while the blocks behind it, just read,
/// looked recent.
///
/// The blocks of one fetch may share one buffer (a range GET decrypted where it was
/// received), which is freed only when the last of them goes. So the cap counts fetch
/// groups: a group weighs all the blocks it came with until its last one is dropped, and the
/// buffer's memory stays within `cap` blocks whatever order they are read and dropped in.
#[derive(Default)]
pub(super) struct StreamBuffer {
    pub(super) blocks: HashMap<BlockId, BufferedBlock>,
    /// Per fetch group: (blocks fetched together, how many of them are still here).
    groups: HashMap<u64, (usize, usize)>,
    next_group: u64,
}

pub(super) struct BufferedBlock {
    data: Bytes,
    /// Engine tick of the last use (or of the fetch).
    used: u64,
    /// Read at least once since it was fetched.
    read: bool,
    /// The fetch it came with.
    group: u64,
}

impl StreamBuffer {
    pub(super) fn get(&mut self, id: &BlockId, tick: u64) -> Option<Bytes> {
        let block = self.blocks.get_mut(id)?;
        block.used = tick;
        block.read = true;
        Some(block.data.clone())
    }

    /// A new fetch group of `size` blocks, to pass to [`StreamBuffer::insert`] with each.
    pub(super) fn new_group(&mut self, size: usize) -> (u64, usize) {
        self.next_group += 1;
        (self.next_group, size.max(1))
    }

    /// Blocks' worth of memory held: every group with a block left, at its full size.
    fn retained(&self) -> usize {
        self.groups.values().map(|&(size, _)| size).sum()
    }

    pub(super) fn insert(&mut self, id: BlockId, data: Bytes, tick: u64, cap: usize, (group, size): (u64, usize)) {
        self.remove(&id);
        let new_weight = if self.groups.contains_key(&group) { 0 } else { size };
        while self.retained() + new_weight > cap.max(1) {
            // Only other groups' blocks: dropping one of this group's frees nothing.
            let victim = self.blocks.iter().filter(|(_, b)| b.group != group).min_by_key(|(_, b)| (!b.read, b.used));
            let Some(victim) = victim.map(|(k, _)| *k) else { break };
            self.remove(&victim);
        }
        self.groups.entry(group).or_insert((size, 0)).1 += 1;
        self.blocks.insert(id, BufferedBlock { data, used: tick, read: false, group });
    }

    fn remove(&mut self, id: &BlockId) {
        let Some(block) = self.blocks.remove(id) else { return };
        if let Some(g) = self.groups.get_mut(&block.group) {
            g.1 -= 1;
            if g.1 == 0 {
                self.groups.remove(&block.group);
            }
        }
    }
}

impl ColdTier {
    /// Whether reads of `ino`, `size` bytes long, stream past the cache: the refill and
    /// read-ahead of other files leave such a file to its reader.
    pub fn streams(&self, ino: Ino, size: u64) -> bool {
        self.config.streams_at(size) && !self.state.lock().files.get(&ino).is_some_and(|f| f.keep_cached)
    }

    /// Reads `range` of a file of `size` bytes that is larger than
    /// [`ColdConfig::stream_above`] straight from the store's blocks, without caching them:
    /// missed chunks are fetched into the stream buffer, read-ahead goes there too.
    /// `None`: the file is not streamed, or part of the range is resident, dirty or a hole
    /// with no record; the caller reads through [`ColdTier::begin_read`] instead.
    ///
    /// [`ColdConfig::stream_above`]: super::ColdConfig::stream_above
    pub fn read_streamed(&self, ino: Ino, range: Range<u64>, size: u64) -> Result<Option<Bytes>, ColdError> {
        if !self.config.streams_at(size) {
            return Ok(None);
        }
        let range = range.start..range.end.min(size);
        if range.is_empty() {
            return Ok(None);
        }
        let chunks = chunks_of(&range);
        // The second pass finds what the first one fetched (unless other streams pushed it out
        // of the buffer meanwhile: then the caller's cached read takes over).
        for pass in 0..2 {
            let missing = {
                let mut st = self.state.lock();
                let State { files, tick, streamed, prefetch, .. } = &mut *st;
                *tick += 1;
                let Some(f) = files.get_mut(&ino) else { return Ok(None) };
                if f.keep_cached {
                    return Ok(None);
                }
                f.streaming = true;
                let mut parts = Vec::new();
                let mut missing = Vec::new();
                for idx in chunks.clone() {
                    let Some(rec) = f.chunks.get(&idx).filter(|c| c.evicted() && !c.dirty).and_then(|c| c.rec) else {
                        return Ok(None);
                    };
                    if rec.block == ZERO_BLOCK {
                        parts.push((idx, rec, None));
                    } else if let Some(data) = streamed.get(&rec.block, *tick) {
                        parts.push((idx, rec, Some(data)));
                    } else {
                        missing.push(idx);
                    }
                }
                if missing.is_empty() {
                    // Read-ahead when the reader moves on to another chunk (wherever its read
                    // starts: the kernel's read-ahead windows need not start at a chunk's first
                    // byte), or after a miss.
                    let queued = if pass > 0 || f.stream_ahead_from != Some(chunks.end) {
                        f.stream_ahead_from = Some(chunks.end);
                        self.queue_streamed_ahead(f, streamed, prefetch, ino, chunks.end)
                    } else {
                        false
                    };
                    drop(st);
                    if queued {
                        self.ahead.notify_all();
                    }
                    return Ok(Some(assemble(&range, &parts)));
                }
                missing
            };
            if pass > 0 {
                break;
            }
            for idx in missing {
                self.fetch_streamed(ino, idx)?;
            }
        }
        Ok(None)
    }

    /// Queues the chunks of a streamed file after `next` that are neither in the stream buffer
    /// nor being fetched; whether anything was queued.
    fn queue_streamed_ahead(
        &self,
        f: &FileState,
        streamed: &StreamBuffer,
        prefetch: &mut VecDeque<(Ino, u64)>,
        ino: Ino,
        next: u64,
    ) -> bool {
        let mut queued = false;
        for idx in next..next + self.config.prefetch_chunks {
            let Some(c) = f.chunks.get(&idx) else { break };
            let wanted = c.evicted()
                && !c.dirty
                && !c.fetching
                && c.rec.is_some_and(|r| r.block != ZERO_BLOCK && !streamed.blocks.contains_key(&r.block));
            if wanted && !prefetch.contains(&(ino, idx)) {
                prefetch.push_back((ino, idx));
                queued = true;
            }
        }
        queued
    }

    /// Fetches chunk `idx` of a streamed file into the stream buffer, or waits for whoever is
    /// fetching it (read-ahead, usually) and then looks no further.
    fn fetch_streamed(&self, ino: Ino, idx: u64) -> Result<(), ColdError> {
        let rec = {
            let mut st = self.state.lock();
            match self.start_fetch(&mut st, ino, idx) {
                Fetch::Done => return Ok(()),
                Fetch::Mine(rec) => rec,
                Fetch::Busy => {
                    while st.files.get(&ino).and_then(|f| f.chunks.get(&idx)).is_some_and(|c| c.fetching) {
                        self.changed.wait_for(&mut st, Duration::from_millis(100));
                    }
                    return Ok(());
                }
            }
        };
        let mut results = self.fetch_group(ino, &[(idx, rec)]);
        let result = results.pop().unwrap_or_else(|| Err(ColdError::NotFetched));
        let group = self.state.lock().streamed.new_group(1);
        self.finish_streamed(ino, idx, &rec, result, group)
    }

    /// Ends a fetch for a streamed file: the chunk stays evicted, its block goes to the
    /// stream buffer.
    pub(super) fn finish_streamed(
        &self,
        ino: Ino,
        idx: u64,
        rec: &ChunkRecord,
        result: Result<Option<Bytes>, ColdError>,
        group: (u64, usize),
    ) -> Result<(), ColdError> {
        let result = result.and_then(|data| match data {
            Some(data) => check_len(ino, idx, rec, &data).map(|()| Some(data)),
            None => Ok(None),
        });
        let mut st = self.state.lock();
        st.tick += 1;
        let State { files, tick, streamed, .. } = &mut *st;
        if let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) {
            c.fetching = false;
        }
        let outcome = match result {
            Ok(Some(data)) => {
                let len = data.len() as u64;
                streamed.insert(rec.block, data, *tick, self.stream_buffer_blocks(), group);
                self.counters.fetched_bytes.fetch_add(len, Ordering::Relaxed);
                self.counters.streamed_bytes.fetch_add(len, Ordering::Relaxed);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        drop(st);
        self.changed.notify_all();
        outcome
    }

    /// Blocks the stream buffer holds: what read-ahead keeps in flight, twice.
    fn stream_buffer_blocks(&self) -> usize {
        self.config.stream_blocks()
    }
}

/// A chunk of a streamed read: its index, record and block (`None`: the zero block).
pub(super) type StreamPart = (u64, ChunkRecord, Option<Bytes>);

/// The bytes of `range` (inside the file) from the blocks of its chunks; bytes past a block's
/// end are zeros. A range inside one block's bytes is a view of the block, not a copy.
pub(super) fn assemble(range: &Range<u64>, parts: &[StreamPart]) -> Bytes {
    if let [(idx, rec, Some(d))] = parts {
        let chunk_start = idx * CHUNK_SIZE;
        let (from, to) = (range.start - chunk_start, range.end - chunk_start);
        if to <= u64::from(rec.len).min(d.len() as u64) {
            return d.slice(from as usize..to as usize);
        }
    }
    let mut out = Vec::with_capacity((range.end - range.start) as usize);
    for (idx, rec, data) in parts {
        let chunk_start = idx * CHUNK_SIZE;
        let from = range.start.max(chunk_start) - chunk_start;
        let to = range.end.min(chunk_start + CHUNK_SIZE) - chunk_start;
        let have = data.as_ref().map_or(0, |d| (u64::from(rec.len)).min(d.len() as u64));
        if let Some(d) = data {
            let copy_to = to.min(have);
            if from < copy_to {
                out.extend_from_slice(&d[from as usize..copy_to as usize]);
            }
        }
        let zeros_from = from.max(have);
        if zeros_from < to {
            out.resize(out.len() + (to - zeros_from) as usize, 0);
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(len: u32) -> ChunkRecord {
        ChunkRecord { block: [7; 32], len, data: len, resident: false }
    }

    #[test]
    fn the_stream_buffer_counts_a_fetch_group_whole_until_its_last_block_goes() {
        let id = |n: u8| [n; 32];
        let block = |n: u8| Bytes::from(vec![n; 16]);
        let mut buf = StreamBuffer::default();
        // Group a: four blocks (one buffer, say), three of them read.
        let a = buf.new_group(4);
        for n in 1..=4 {
            buf.insert(id(n), block(n), u64::from(n), 8, a);
        }
        for n in 1..=3 {
            assert_eq!(buf.get(&id(n), 10 + u64::from(n)), Some(block(n)));
        }
        let b = buf.new_group(4);
        for n in 11..=14 {
            buf.insert(id(n), block(n), 20 + u64::from(n), 8, b);
        }
        assert_eq!((buf.blocks.len(), buf.retained()), (8, 8));
        // A block of group c: five blocks would fit a count of blocks, but group a holds its
        // whole buffer while any of its blocks is here, so all of a goes (the read blocks
        // first, then the unread one), and b stays.
        let c = buf.new_group(4);
        buf.insert(id(21), block(21), 40, 8, c);
        assert!((1..=4).all(|n| !buf.blocks.contains_key(&id(n))), "group a dropped whole");
        assert!((11..=14).all(|n| buf.blocks.contains_key(&id(n))), "group b kept");
        assert_eq!((buf.blocks.len(), buf.retained()), (5, 8));
        // The rest of c needs no more room; a group larger than the cap still gets in.
        for n in 22..=24 {
            buf.insert(id(n), block(n), 40 + u64::from(n), 8, c);
        }
        assert_eq!((buf.blocks.len(), buf.retained()), (8, 8));
        let big = buf.new_group(9);
        buf.insert(id(31), block(31), 60, 8, big);
        assert_eq!((buf.blocks.len(), buf.retained()), (1, 9));
        assert_eq!(buf.get(&id(31), 61), Some(block(31)));
    }

    #[test]
    fn a_read_inside_one_block_is_a_view_of_it_and_anything_else_is_assembled() {
        let block = Bytes::from((0..=255u8).cycle().take(1000).collect::<Vec<u8>>());
        let base = CHUNK_SIZE; // chunk 1
        let one = [(1, rec(1000), Some(block.clone()))];

        let view = assemble(&(base + 10..base + 500), &one);
        assert_eq!(&view[..], &block[10..500]);
        assert_eq!(view.as_ptr(), block[10..].as_ptr(), "a copy where a view would do");

        // Past the block's bytes: zeros, in a buffer of its own.
        let past = assemble(&(base + 900..base + 1100), &one);
        assert_eq!(&past[..100], &block[900..]);
        assert!(past[100..].iter().all(|&b| b == 0) && past.len() == 200);

        // Two chunks: the end of one block, then the start of the next.
        let other = Bytes::from(vec![9u8; 64]);
        let two =
            [(0, rec(CHUNK_SIZE as u32), Some(Bytes::from(vec![1u8; CHUNK_SIZE as usize]))), (1, rec(64), Some(other))];
        let joined = assemble(&(CHUNK_SIZE - 4..CHUNK_SIZE + 4), &two);
        assert_eq!(&joined[..], &[1, 1, 1, 1, 9, 9, 9, 9]);

        // The zero block (no data) reads as zeros.
        let zero = assemble(&(base..base + 16), &[(1, rec(1000), None)]);
        assert_eq!(&zero[..], &[0u8; 16]);
    }
}
