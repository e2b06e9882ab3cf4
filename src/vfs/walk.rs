//! Directory-order read-ahead: a program that lists a directory and then opens its files one
//! after another (`cp -r`, `tar c`, `du`-then-read, a DataLoader over a folder) gets the first
//! chunk of the next files fetched before it opens them, in batches the cold tier fetches
//! sorted by pack, so files written together come in one request.
//!
//! Invariants: memory is bounded ([`WALK_DIRS`] listings of at most [`WALK_FILES`] files each,
//! the oldest dropped first); a listing restarts when its directory is listed from the start;
//! each listed file is queued at most once per listing; only an open of a file whose first
//! chunk is in the store alone (a cold file) queues anything, so a walk of cached files costs
//! a lookup per open.

use std::collections::{HashMap, VecDeque};

use crate::types::Ino;

/// Listings kept (the directories listed last).
pub const WALK_DIRS: usize = 4;
/// Files of one listing kept (the first ones listed).
pub const WALK_FILES: usize = 16 << 10;
/// Files queued ahead of the one opened...
const AHEAD: usize = 48;
/// ...once fewer than this many are queued ahead of it (so batches stay large).
const LOW: usize = 16;

/// One directory's listing: its regular files in the order they were listed.
struct Listing {
    dir: Ino,
    files: Vec<Ino>,
    pos: HashMap<Ino, usize>,
    /// Files before this position were queued (or passed).
    queued_upto: usize,
}

/// The listings read last (see the module invariants).
#[derive(Default)]
pub(super) struct Walks {
    listings: VecDeque<Listing>,
}

impl Walks {
    /// `dir` is being listed from its start.
    pub(super) fn restart(&mut self, dir: Ino) {
        self.listings.retain(|l| l.dir != dir);
        if self.listings.len() == WALK_DIRS {
            self.listings.pop_front();
        }
        self.listings.push_back(Listing { dir, files: Vec::new(), pos: HashMap::new(), queued_upto: 0 });
    }

    /// A regular file listed in `dir`, after the ones listed before.
    pub(super) fn listed(&mut self, dir: Ino, file: Ino) {
        let Some(l) = self.listings.iter_mut().rev().find(|l| l.dir == dir) else { return };
        if l.files.len() < WALK_FILES && !l.pos.contains_key(&file) {
            l.pos.insert(file, l.files.len());
            l.files.push(file);
        }
    }

    /// `file` is opened: the files after it to fetch ahead now (none, mostly: a batch at a time).
    pub(super) fn ahead(&mut self, file: Ino) -> Vec<Ino> {
        let Some((l, p)) = self.listings.iter_mut().rev().find_map(|l| l.pos.get(&file).copied().map(|p| (l, p)))
        else {
            return Vec::new();
        };
        if l.queued_upto >= p + 1 + LOW {
            return Vec::new();
        }
        let from = l.queued_upto.max(p + 1);
        let to = (p + 1 + AHEAD).min(l.files.len());
        if from >= to {
            return Vec::new();
        }
        l.queued_upto = to;
        l.files[from..to].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_queues_each_file_once_in_large_batches() {
        let mut w = Walks::default();
        w.restart(1);
        for f in 100..200 {
            w.listed(1, f);
        }
        assert_eq!(w.ahead(100), (101..149).collect::<Vec<_>>());
        // Still enough queued ahead: nothing new until fewer than LOW are left.
        for f in 101..132 {
            assert!(w.ahead(f).is_empty(), "at {f}");
        }
        assert_eq!(w.ahead(133), (149..182).collect::<Vec<_>>());
        // A file opened out of order far ahead queues from just after itself.
        assert_eq!(w.ahead(190), (191..200).collect::<Vec<_>>());
        assert!(w.ahead(199).is_empty());
        assert!(w.ahead(5).is_empty(), "a file of no listing");
    }

    #[test]
    fn listings_are_bounded_and_restart() {
        let mut w = Walks::default();
        for d in 0..(WALK_DIRS as u64 + 2) {
            w.restart(d);
            w.listed(d, 1000 + d);
            w.listed(d, 2000 + d);
        }
        assert_eq!(w.listings.len(), WALK_DIRS);
        assert!(w.ahead(1000).is_empty(), "the oldest listing was dropped");
        let last = WALK_DIRS as u64 + 1;
        assert_eq!(w.ahead(1000 + last), vec![2000 + last]);
        w.restart(last);
        assert!(w.ahead(1000 + last).is_empty(), "a restarted listing forgets what it had");
        w.restart(9);
        for f in 0..(WALK_FILES as u64 + 10) {
            w.listed(9, f);
        }
        assert_eq!(w.listings.back().map(|l| l.files.len()), Some(WALK_FILES));
    }
}
