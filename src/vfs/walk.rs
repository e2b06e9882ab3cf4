//! Directory-order read-ahead: a program that lists a directory and then opens its files one
//! after another (`cp -r`, `tar c`, `du`-then-read, a DataLoader over a folder, `cat d/*/*`)
//! gets the first chunk of the next files fetched before it opens them, in batches the cold
//! tier takes pack by pack (several ranged GETs in flight), so the walk's speed does not
//! depend on the order the files were made in: files written together come in one request,
//! and files written round-robin across directories lie in their packs beside files of the
//! other directories, which a window as wide as the tree has queued too (issue 48).
//!
//! The walk goes from one listing to the next in the order their directories appeared in
//! their parent's listing, not in the order they were listed: bash lists the directories of
//! `t/*/*` last to first and then sorts what it found, so `cat` opens `t/d00`'s files first,
//! whose listing was made last (a window that ran on in listing order stopped there, and every
//! file after the third directory was fetched on its own).
//!
//! Invariants: memory is bounded (at most [`WALK_FILES`] files over all the listings kept, and
//! [`WALK_DIRS`] listings, the oldest dropped first; at most [`WALK_FILES`] directories' places
//! in their parents' listings); a listing restarts when its directory is listed from the start;
//! each listed file is queued at most once per listing; the window runs on from the end of a
//! listing into the listings of the directories listed after its own in their parent (a glob
//! lists every directory before the first file is opened), or made after it when a directory's
//! parent was not listed; the files queued ahead of the one opened stay within a
//! [`Window`] of files and of bytes (first chunks), and more are queued only once they fall
//! under half of either bound; only an open of a file whose first chunk is in the store alone
//! (a cold file) queues anything, so a walk of cached files costs a lookup per open.

use std::collections::{HashMap, VecDeque};

use crate::block::CHUNK_SIZE;
use crate::types::Ino;

/// Listings kept (the directories listed last): a glob over a tree lists every directory of
/// it before its first file is opened.
pub const WALK_DIRS: usize = 1024;
/// Files kept over all listings (the first ones listed of each): about 50 bytes each.
pub const WALK_FILES: usize = 64 << 10;
/// Files queued ahead of the one opened at most: as many as the cold tier's walk queue holds
/// (`MAX_WALK_QUEUE` in `tier/cold/walk.rs`). A tree made round-robin across directories is read well
/// only when the window spans every directory whose files share the packs: 4096 files cover
/// 20 directories of 200 files.
pub const AHEAD_FILES: usize = 4096;
/// Bytes (first chunks) queued ahead of the one opened at most, and at most a quarter of the
/// cache: read-ahead never evicts, so this is cache room the walk borrows until it reads the
/// files (the default 256 MiB cache gives 64 MiB: 1 365 files of 48 KiB).
pub const AHEAD_BYTES: u64 = 256 << 20;

/// How far ahead of the file opened a walk queues files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub files: usize,
    pub bytes: u64,
}

impl Window {
    /// The window for a cache of `cache_size` bytes (`None`: unbounded).
    pub(super) fn for_cache(cache_size: Option<u64>) -> Window {
        Window { files: AHEAD_FILES, bytes: cache_size.map_or(AHEAD_BYTES, |c| (c / 4).min(AHEAD_BYTES)) }
    }

    /// The bytes of a file of `size` bytes the walk fetches ahead: its first chunk.
    pub(super) fn first_chunk(size: u64) -> u64 {
        size.min(CHUNK_SIZE)
    }
}

/// One directory's listing: its regular files in the order they were listed.
struct Listing {
    dir: Ino,
    /// Where the walk reaches it: the directory's place in its parent's listing.
    rank: u64,
    files: Vec<Ino>,
    /// The bytes each queued file counts in the window (0 until it is queued, or if skipped).
    bytes: Vec<u64>,
    pos: HashMap<Ino, usize>,
    /// Files before this position were queued (or passed).
    queued_upto: usize,
}

/// The listings read last (see the module invariants).
#[derive(Default)]
pub(super) struct Walks {
    listings: VecDeque<Listing>,
    /// Files over all listings.
    files: usize,
    /// Directories' places in the listings of their parents (at most [`WALK_FILES`]).
    ranks: HashMap<Ino, u64>,
    /// The last place given.
    last_rank: u64,
}

impl Walks {
    /// `dir` is being listed from its start.
    pub(super) fn restart(&mut self, dir: Ino) {
        if let Some(at) = self.listings.iter().position(|l| l.dir == dir) {
            self.drop_at(at);
        }
        if self.listings.len() == WALK_DIRS {
            self.drop_at(0);
        }
        let rank = match self.ranks.get(&dir) {
            Some(&rank) => rank,
            None => self.next_rank(),
        };
        self.listings.push_back(Listing {
            dir,
            rank,
            files: Vec::new(),
            bytes: Vec::new(),
            pos: HashMap::new(),
            queued_upto: 0,
        });
    }

    fn next_rank(&mut self) -> u64 {
        self.last_rank += 1;
        self.last_rank
    }

    /// A directory listed (in the listing being made): its listing, if it is listed too, comes
    /// next in a walk after the directories listed before it.
    pub(super) fn listed_dir(&mut self, dir: Ino) {
        if self.ranks.len() >= WALK_FILES {
            self.ranks.clear();
        }
        let rank = self.next_rank();
        self.ranks.insert(dir, rank);
    }

    fn drop_at(&mut self, at: usize) {
        if let Some(l) = self.listings.remove(at) {
            self.files -= l.files.len();
        }
    }

    /// A regular file listed in `dir`, after the ones listed before. Past [`WALK_FILES`], the
    /// oldest other listings make room; a listing that holds them all takes no more.
    pub(super) fn listed(&mut self, dir: Ino, file: Ino) {
        let Some(mut at) = self.listings.iter().rposition(|l| l.dir == dir) else { return };
        while self.files >= WALK_FILES && at > 0 {
            self.drop_at(0);
            at -= 1;
        }
        let l = &mut self.listings[at];
        if self.files < WALK_FILES && !l.pos.contains_key(&file) {
            l.pos.insert(file, l.files.len());
            l.files.push(file);
            l.bytes.push(0);
            self.files += 1;
        }
    }

    /// `file` is opened: the directory whose listing holds it, and the files after it to fetch
    /// ahead now (none, mostly: a batch at a time), running on into the listings made later,
    /// within `window`. `bytes` tells what a file counts in the window, `None` for a file not
    /// to fetch ahead (it streams, or is gone), which is passed over.
    pub(super) fn ahead(
        &mut self,
        file: Ino,
        window: Window,
        bytes: impl Fn(Ino) -> Option<u64>,
    ) -> Option<(Ino, Vec<Ino>)> {
        let (at, p) = self.listings.iter().enumerate().rev().find_map(|(i, l)| l.pos.get(&file).map(|&p| (i, p)))?;
        let dir = self.listings[at].dir;
        // This listing, then those the walk reaches after it, in its order.
        let rank = self.listings[at].rank;
        let mut order: Vec<usize> = (0..self.listings.len()).filter(|&i| self.listings[i].rank > rank).collect();
        order.sort_by_key(|&i| self.listings[i].rank);
        order.insert(0, at);
        // Files queued after this one: the rest of its listing's window, then whole windows of
        // the listings after it (they are queued from their start, in order).
        let (mut files, mut held) = (0, 0);
        for &i in &order {
            let l = &self.listings[i];
            let from = if i == at { (p + 1).min(l.queued_upto) } else { 0 };
            files += l.queued_upto - from;
            held += l.bytes[from..l.queued_upto].iter().sum::<u64>();
        }
        if files * 2 >= window.files || held * 2 >= window.bytes {
            return Some((dir, Vec::new()));
        }
        let mut out = Vec::new();
        'listings: for &i in &order {
            let l = &mut self.listings[i];
            let from = if i == at { l.queued_upto.max(p + 1) } else { l.queued_upto };
            for k in from..l.files.len() {
                let counts = bytes(l.files[k]);
                if let Some(b) = counts {
                    if files + 1 > window.files || held + b > window.bytes {
                        break 'listings;
                    }
                    files += 1;
                    held += b;
                    l.bytes[k] = b;
                    out.push(l.files[k]);
                }
                l.queued_upto = k + 1;
            }
        }
        Some((dir, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of 8 files and, with files of one byte each, no byte bound.
    const W: Window = Window { files: 8, bytes: u64::MAX };

    fn next(w: &mut Walks, file: Ino) -> Vec<Ino> {
        w.ahead(file, W, |_| Some(1)).map(|(_, next)| next).unwrap_or_default()
    }

    #[test]
    fn a_walk_queues_each_file_once_in_large_batches() {
        let mut w = Walks::default();
        w.restart(1);
        for f in 0..30 {
            w.listed(1, f);
        }
        assert_eq!(w.ahead(0, W, |_| Some(1)), Some((1, (1..=8).collect::<Vec<_>>())));
        // Still enough queued ahead: nothing new until fewer than half the window are left.
        for f in 1..=4 {
            assert!(next(&mut w, f).is_empty(), "at {f}");
        }
        assert_eq!(next(&mut w, 5), (9..=13).collect::<Vec<_>>());
        // A file opened out of order far ahead queues from just after itself.
        assert_eq!(next(&mut w, 25), (26..30).collect::<Vec<_>>());
        assert!(next(&mut w, 29).is_empty());
        assert_eq!(w.ahead(1 << 40, W, |_| Some(1)), None, "a file of no listing");
    }

    #[test]
    fn the_window_holds_its_bytes_and_passes_over_files_not_to_fetch() {
        let mut w = Walks::default();
        w.restart(1);
        for f in 0..40 {
            w.listed(1, f);
        }
        let window = Window { files: 100, bytes: 10 };
        // Files of 3 bytes, every fifth one streams: 1, 2, 3 fit (9 bytes), 4 would not.
        let bytes = |f: Ino| (f % 5 != 0).then_some(3);
        assert_eq!(w.ahead(0, window, bytes), Some((1, vec![1, 2, 3])));
        // 6 bytes still ahead of 1: more than half the window, nothing new.
        assert_eq!(w.ahead(1, window, bytes), Some((1, vec![])));
        // 3 bytes ahead of 2: 4 and 6 come (5 streams), then 7 would pass 10 bytes.
        assert_eq!(w.ahead(2, window, bytes), Some((1, vec![4, 6])));
        assert_eq!(w.ahead(6, window, bytes), Some((1, vec![7, 8, 9])));
    }

    const PER: u64 = 4;
    const D1: Ino = 1 << 20;
    const D2: Ino = 2 << 20;
    const D3: Ino = 3 << 20;

    /// Directories 1, 2 and 3 of [`PER`] files each, listed in `order` (a glob lists every
    /// directory before it opens the first file); `parent`: their parent was listed first.
    fn listed_three(order: [Ino; 3], parent: bool) -> Walks {
        let mut w = Walks::default();
        if parent {
            w.restart(100);
            for d in 1..=3 {
                w.listed_dir(d);
            }
        }
        for d in order {
            w.restart(d);
            for f in 0..PER {
                w.listed(d, d << 20 | f);
            }
        }
        w
    }

    /// Opens the files of directory 1, then 2: the window runs on from 1 into 2 and 3, and
    /// goes on from where it stopped, each file once.
    fn walk_three(w: &mut Walks) {
        let first: Vec<Ino> = (D1 + 1..D1 + PER).chain(D2..D2 + PER).chain(D3..D3 + 1).collect();
        assert_eq!(w.ahead(D1, W, |_| Some(1)), Some((1, first)));
        for f in [D1 + 1, D1 + 2, D1 + 3, D2] {
            assert!(next(w, f).is_empty(), "at {f:x}");
        }
        assert_eq!(next(w, D2 + 1), (D3 + 1..D3 + PER).collect::<Vec<_>>());
    }

    #[test]
    fn the_window_runs_on_into_the_listings_made_after() {
        let mut w = listed_three([1, 2, 3], false);
        walk_three(&mut w);
        assert!(next(&mut w, D3).is_empty());
        assert_eq!(w.ahead(D3 + PER - 1, W, |_| Some(1)).map(|(dir, _)| dir), Some(3));
    }

    #[test]
    fn the_window_runs_on_in_the_parents_order_whatever_order_the_directories_were_listed_in() {
        // bash's `cat t/*/*`: t lists d1 d2 d3, bash lists d3, d2 then d1, and cat opens d1's
        // files first; in d2 the window runs on into d3, not back into d1.
        let mut w = listed_three([3, 2, 1], true);
        walk_three(&mut w);
        // The places kept are bounded.
        for d in 0..WALK_FILES as u64 + 5 {
            w.listed_dir(1000 + d);
        }
        assert!(w.ranks.len() <= WALK_FILES);
    }

    #[test]
    fn a_window_follows_the_cache() {
        assert_eq!(Window::for_cache(None), Window { files: AHEAD_FILES, bytes: AHEAD_BYTES });
        assert_eq!(Window::for_cache(Some(64 << 20)).bytes, 16 << 20);
        assert_eq!(Window::for_cache(Some(1 << 40)).bytes, AHEAD_BYTES);
        assert_eq!(Window::first_chunk(1 << 40), CHUNK_SIZE);
        assert_eq!(Window::first_chunk(5), 5);
    }

    #[test]
    fn listings_are_bounded_and_restart() {
        let mut w = Walks::default();
        for d in 0..(WALK_DIRS as u64 + 2) {
            w.restart(d);
            w.listed(d, d << 20 | 1);
            w.listed(d, d << 20 | 2);
        }
        assert_eq!(w.listings.len(), WALK_DIRS);
        assert_eq!(w.ahead(1, W, |_| Some(1)), None, "the oldest listing was dropped");
        let last = WALK_DIRS as u64 + 1;
        assert_eq!(next(&mut w, last << 20 | 1), vec![last << 20 | 2]);
        w.restart(last);
        assert_eq!(w.ahead(last << 20 | 1, W, |_| Some(1)), None, "a restarted listing forgets what it had");
        // A listing of more files than all listings may hold pushes the others out and stops.
        w.restart(u64::MAX);
        for f in 0..(WALK_FILES as u64 + 10) {
            w.listed(u64::MAX, f);
        }
        assert_eq!(w.listings.len(), 1);
        assert_eq!(w.files, WALK_FILES);
        assert_eq!(w.listings.back().map(|l| l.files.len()), Some(WALK_FILES));
    }
}
