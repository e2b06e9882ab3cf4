//! The cold tier's side of directory-order read-ahead (the vfs's walk decides which files a
//! walk reads next): a bounded queue of files whose first chunks a walk wants soon, fetched by
//! the read-ahead threads in batches planned pack by pack. A batch takes the pack of the file
//! the walk wants first with every queued file whose block lies in it, then the pack of the
//! next file not taken, up to a batch's bytes. Files made round-robin across directories lie
//! in their packs between files of the other directories, which the same walk has queued too
//! (its window spans the tree): the pack comes in one ranged GET instead of one GET per file,
//! and the store's gap cap (`store::get_blocks`) only weighs blocks nobody queued.
//!
//! Invariants: at most [`MAX_WALK_QUEUE`] files wait; a batch holds at most
//! [`WALK_BATCH_BYTES`] (what one fetcher holds in memory, as a read-ahead group does) and
//! never evicts (it fits in the cache's room, or the queue is left to the readers); one
//! fetcher plans at a time and a file leaves the queue when a batch takes it, so each queued
//! file is taken by one batch; files no longer cold (read, fetched, streamed) leave the queue
//! when a batch is planned; read-ahead of files being read goes first (`fetch.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{ColdTier, State};
use crate::block::CHUNK_SIZE;
use crate::crypto::Hash;
use crate::meta::ChunkRecord;
use crate::store::RunJoin;
use crate::types::Ino;

/// Files waiting for directory-order read-ahead at most (the vfs's window is as wide).
pub const MAX_WALK_QUEUE: usize = 4096;
/// Bytes of one batch of directory-order read-ahead at most: one pack of the default size.
const WALK_BATCH_BYTES: u64 = 4 * CHUNK_SIZE;

/// A queued file's first chunk, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Queued {
    /// The pack its block lies in and where (`None`: nothing to read, the zero block or a
    /// block with no location, which the fetch reports).
    pub at: Option<(Hash, u64)>,
    /// Its bytes.
    pub bytes: u64,
}

/// The entries of `queue` (in the walk's order) one batch takes, at most `budget` bytes: the
/// first entry's pack, each of its queued blocks from the first entry's on and then those
/// before it, then the pack of the next entry not taken, and so on. Entries with nothing to
/// read go with the batch that reaches them. Empty when the first entry does not fit. The
/// queue is grouped by pack once (not searched whole for each pack a batch reaches).
pub(super) fn plan_batch(queue: &[Queued], budget: u64) -> Vec<usize> {
    let mut packs: HashMap<Hash, Vec<usize>> = HashMap::new();
    for (i, q) in queue.iter().enumerate() {
        if let Some((pack, _)) = q.at {
            packs.entry(pack).or_default().push(i);
        }
    }
    for same in packs.values_mut() {
        same.sort_by_key(|&i| queue[i].at.map(|(_, offset)| offset));
    }
    let mut taken = vec![false; queue.len()];
    let mut left = budget;
    let mut out = Vec::new();
    for head in 0..queue.len() {
        if taken[head] {
            continue;
        }
        let Some((pack, _)) = queue[head].at else {
            taken[head] = true;
            out.push(head);
            continue;
        };
        if queue[head].bytes > left {
            break;
        }
        let same: Vec<usize> =
            packs.get(&pack).map(|all| all.iter().copied().filter(|&i| !taken[i]).collect()).unwrap_or_default();
        let h = same.iter().position(|&i| i == head).unwrap_or(0);
        // From the head on, then back from it, each up to the first entry that does not fit.
        let mut take = |run: &mut dyn Iterator<Item = usize>| {
            for i in run {
                if queue[i].bytes > left {
                    break;
                }
                left -= queue[i].bytes;
                taken[i] = true;
                out.push(i);
            }
        };
        take(&mut same[h..].iter().copied());
        take(&mut same[..h].iter().rev().copied());
    }
    out
}

impl ColdTier {
    /// The hot tier's size bound (a walk's window is a share of it).
    pub fn cache_size(&self) -> Option<u64> {
        self.config.cache_size
    }

    /// A walk of the listing of `dir` opened `opened`: its misses judge pack neighbours as the
    /// walk's (`near.rs`), and the first chunks of `inos` are queued for directory-order
    /// read-ahead (the read-ahead threads fetch them in batches, pack by pack, several ranged
    /// GETs at once). At most [`MAX_WALK_QUEUE`] wait.
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

    /// Fetches one batch of the walk queue ([`plan_batch`]) within the cache's room; without
    /// room for the next file, the queue is left to the readers.
    pub(super) fn fetch_walk(&self) {
        let mut planner = self.walk_planner.lock();
        let (room, _) = self.refill_room();
        let cold = self.walk_queue_cold();
        let queue: Vec<Queued> = cold
            .iter()
            .map(|(ino, rec)| {
                let at = *planner
                    .entry(rec.block)
                    .or_insert_with(|| self.locate(*ino, 0, rec).ok().flatten().map(|loc| (loc.pack, loc.offset)));
                Queued { at, bytes: u64::from(rec.data) }
            })
            .collect();
        let picked = plan_batch(&queue, room.min(WALK_BATCH_BYTES));
        let chosen: HashSet<Ino> = picked.iter().map(|&i| cold[i].0).collect();
        {
            let mut st = self.state.lock();
            if chosen.is_empty() {
                st.walk.clear();
            } else {
                st.walk.retain(|ino| !chosen.contains(ino));
            }
        }
        let waiting: HashSet<Hash> = cold
            .iter()
            .filter(|(ino, _)| !chosen.is_empty() && !chosen.contains(ino))
            .map(|(_, rec)| rec.block)
            .collect();
        planner.retain(|block, _| waiting.contains(block));
        drop(planner);
        let items: Vec<(Ino, u64, Arc<std::fs::File>)> = picked
            .iter()
            .filter_map(|&i| match self.hot.open_or_create(cold[i].0) {
                Ok(f) => Some((cold[i].0, 0, Arc::new(f))),
                Err(e) => {
                    tracing::debug!("read-ahead of inode {}: {e}", cold[i].0);
                    None
                }
            })
            .collect();
        self.fetch_many(&items, true, RunJoin::Tight, &|_| ());
    }

    /// The queued files whose first chunk is still only in the store and not being fetched,
    /// with its record, in queue order; the others leave the queue.
    fn walk_queue_cold(&self) -> Vec<(Ino, ChunkRecord)> {
        let mut st = self.state.lock();
        let State { files, walk, .. } = &mut *st;
        let mut cold = Vec::with_capacity(walk.len());
        walk.retain(|&ino| {
            let rec = files.get(&ino).and_then(|f| match f.chunks.get(&0) {
                Some(c) if !f.streaming && c.evicted() && !c.fetching => c.rec,
                _ => None,
            });
            rec.inspect(|&r| cold.push((ino, r))).is_some()
        });
        cold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pack: u8, offset: u64, bytes: u64) -> Queued {
        Queued { at: Some(([pack; 32], offset)), bytes }
    }

    #[test]
    fn a_batch_takes_the_first_files_pack_whole_then_the_next_pack() {
        // Made round-robin over two directories in two packs, a0 b0 a1 b1 | a2 b2 a3 b3, 10
        // bytes each; the walk queued a1 a2 a3 b0 b1 b2 b3 (a0 is being read).
        let queue =
            [at(1, 20, 10), at(2, 0, 10), at(2, 20, 10), at(1, 10, 10), at(1, 30, 10), at(2, 10, 10), at(2, 30, 10)];
        // a1's pack: a1, b1, then b0 before it; then a2's pack as far as the budget goes.
        assert_eq!(plan_batch(&queue, 50), vec![0, 4, 3, 1, 5]);
        assert_eq!(plan_batch(&queue, 1000), vec![0, 4, 3, 1, 5, 2, 6]);
        // The first file alone does not fit: nothing.
        assert_eq!(plan_batch(&queue, 9), Vec::<usize>::new());
        // A pack larger than the budget: from the first file on.
        assert_eq!(plan_batch(&queue, 25), vec![0, 4]);
    }

    #[test]
    fn files_with_nothing_to_read_go_with_the_batch_that_reaches_them() {
        let none = Queued { at: None, bytes: 0 };
        let queue = [none, at(1, 0, 10), none, at(2, 0, 10), none];
        assert_eq!(plan_batch(&queue, 10), vec![0, 1, 2]);
        assert_eq!(plan_batch(&queue, 20), vec![0, 1, 2, 3, 4]);
        assert!(plan_batch(&[], 10).is_empty());
    }

    /// The first planner, which searched the whole queue for each pack a batch reached.
    fn plan_by_search(queue: &[Queued], budget: u64) -> Vec<usize> {
        let (mut taken, mut left, mut out) = (vec![false; queue.len()], budget, Vec::new());
        while let Some(head) = (0..queue.len()).find(|&i| !taken[i]) {
            let pack = match queue[head].at {
                None => {
                    taken[head] = true;
                    out.push(head);
                    continue;
                }
                Some(_) if queue[head].bytes > left => break,
                Some((pack, _)) => pack,
            };
            let mut same: Vec<usize> =
                (0..queue.len()).filter(|&i| !taken[i] && queue[i].at.is_some_and(|(p, _)| p == pack)).collect();
            same.sort_by_key(|&i| queue[i].at.map(|(_, offset)| offset));
            let h = same.iter().position(|&i| i == head).unwrap_or(0);
            let (ahead, behind) = (same[h..].to_vec(), same[..h].iter().rev().copied().collect::<Vec<_>>());
            for part in [ahead, behind] {
                let fits =
                    part.iter().scan(left, |l, &i| (queue[i].bytes <= *l).then(|| *l -= queue[i].bytes).map(|()| i));
                let fits: Vec<usize> = fits.collect();
                left -= fits.iter().map(|&i| queue[i].bytes).sum::<u64>();
                fits.iter().for_each(|&i| taken[i] = true);
                out.extend(fits);
            }
        }
        out
    }

    #[test]
    fn grouping_by_pack_plans_what_searching_the_queue_planned() {
        // Pseudo-random queues (a fixed LCG): up to 300 files in up to 12 packs, sizes that
        // leave the budget short mid-pack, some with nothing to read.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |m: u64| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % m
        };
        for _ in 0..200 {
            let n = next(300) as usize;
            let packs = next(12) + 1;
            let queue: Vec<Queued> = (0..n)
                .map(|_| match next(10) {
                    0 => Queued { at: None, bytes: 0 },
                    _ => at(next(packs) as u8, next(1 << 20), next(64) + 1),
                })
                .collect();
            let budget = next(4000);
            assert_eq!(plan_batch(&queue, budget), plan_by_search(&queue, budget), "budget {budget}");
        }
    }
}
