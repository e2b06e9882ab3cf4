//! Directory-order read-ahead: a program that lists a directory and then opens its files one
//! after another (`cp -r`, `tar c`, `du`-then-read, a DataLoader over a folder, `cat d/*/*`)
//! gets the first chunk of the next files fetched before it opens them, in batches the cold
//! tier fetches sorted by pack (several ranged GETs in flight), so the walk's speed does not
//! depend on the order the files were made in: files written together come in one request,
//! files written round-robin across directories come several at a time (issue 48).
//!
//! Invariants: memory is bounded (at most [`WALK_FILES`] files over all the listings kept, and
//! [`WALK_DIRS`] listings, the oldest dropped first); a listing restarts when its directory is
//! listed from the start; each listed file is queued at most once per listing; the window runs
//! on from the end of a listing into the listings made after it (a glob lists every directory
//! before the first file is opened); only an open of a file whose first chunk is in the store
//! alone (a cold file) queues anything, so a walk of cached files costs a lookup per open.

use std::collections::{HashMap, VecDeque};

use crate::types::Ino;

/// Listings kept (the directories listed last): a glob over a tree lists every directory of
/// it before its first file is opened.
pub const WALK_DIRS: usize = 1024;
/// Files kept over all listings (the first ones listed of each): about 40 bytes each.
pub const WALK_FILES: usize = 64 << 10;
/// Files queued ahead of the one opened: enough that, sorted by pack, files made round-robin
/// across directories lie next to each other (512 files of 48 KiB made across 20 directories
/// cover 5 of them: five files a ranged GET)...
pub const AHEAD: usize = 512;
/// ...once fewer than this many are queued ahead of it (so batches stay large).
const LOW: usize = 256;

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
    /// Files over all listings.
    files: usize,
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
        self.listings.push_back(Listing { dir, files: Vec::new(), pos: HashMap::new(), queued_upto: 0 });
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
            self.files += 1;
        }
    }

    /// `file` is opened: the directory whose listing holds it, and the files after it to fetch
    /// ahead now (none, mostly: a batch at a time), running on into the listings made later.
    pub(super) fn ahead(&mut self, file: Ino) -> Option<(Ino, Vec<Ino>)> {
        let (at, p) = self.listings.iter().enumerate().rev().find_map(|(i, l)| l.pos.get(&file).map(|&p| (i, p)))?;
        let dir = self.listings[at].dir;
        // Files queued after this one: the rest of its listing's window, then whole windows of
        // the listings after it (they are queued from their start, in order).
        let queued = self.listings[at].queued_upto.saturating_sub(p + 1)
            + self.listings.iter().skip(at + 1).map(|l| l.queued_upto).sum::<usize>();
        if queued >= LOW {
            return Some((dir, Vec::new()));
        }
        let mut out = Vec::new();
        for (i, l) in self.listings.iter_mut().enumerate().skip(at) {
            let from = if i == at { l.queued_upto.max(p + 1) } else { l.queued_upto };
            let to = (from + (AHEAD - queued).saturating_sub(out.len())).min(l.files.len());
            if from < to {
                out.extend_from_slice(&l.files[from..to]);
                l.queued_upto = to;
            }
            if out.len() + queued >= AHEAD {
                break;
            }
        }
        Some((dir, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(w: &mut Walks, file: Ino) -> Vec<Ino> {
        w.ahead(file).map(|(_, next)| next).unwrap_or_default()
    }

    #[test]
    fn a_walk_queues_each_file_once_in_large_batches() {
        let (ahead, low) = (AHEAD as u64, LOW as u64);
        let mut w = Walks::default();
        w.restart(1);
        for f in 0..3 * ahead {
            w.listed(1, f);
        }
        assert_eq!(w.ahead(0), Some((1, (1..=ahead).collect::<Vec<_>>())));
        // Still enough queued ahead: nothing new until fewer than LOW are left.
        for f in 1..=ahead - low {
            assert!(next(&mut w, f).is_empty(), "at {f}");
        }
        let f = ahead - low + 1;
        assert_eq!(next(&mut w, f), (ahead + 1..=f + ahead).collect::<Vec<_>>());
        // A file opened out of order far ahead queues from just after itself.
        let far = 3 * ahead - 10;
        assert_eq!(next(&mut w, far), (far + 1..3 * ahead).collect::<Vec<_>>());
        assert!(next(&mut w, 3 * ahead - 1).is_empty());
        assert_eq!(w.ahead(1 << 40), None, "a file of no listing");
    }

    #[test]
    fn the_window_runs_on_into_the_listings_made_after() {
        // A glob: three directories listed, then their files opened in that order.
        let (ahead, low) = (AHEAD as u64, LOW as u64);
        let per = ahead / 2;
        let mut w = Walks::default();
        for d in 1..=3 {
            w.restart(d);
            for f in 0..per {
                w.listed(d, d << 20 | f);
            }
        }
        let (d1, d2, d3) = (1 << 20, 2 << 20, 3 << 20);
        let first: Vec<Ino> = (d1 + 1..d1 + per).chain(d2..d2 + per).chain(d3..d3 + 1).collect();
        assert_eq!(w.ahead(d1), Some((1, first)));
        // Opening the next directory's files goes on from where the window stopped, once.
        let refill = d2 + per - low + 1;
        for f in d2..refill {
            assert!(next(&mut w, f).is_empty(), "at {f:x}");
        }
        assert_eq!(next(&mut w, refill), (d3 + 1..d3 + per).collect::<Vec<_>>());
        assert!(next(&mut w, d3).is_empty());
        assert_eq!(w.ahead(d3 + per - 1).map(|(dir, _)| dir), Some(3));
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
        assert_eq!(w.ahead(1), None, "the oldest listing was dropped");
        let last = WALK_DIRS as u64 + 1;
        assert_eq!(next(&mut w, last << 20 | 1), vec![last << 20 | 2]);
        w.restart(last);
        assert_eq!(w.ahead(last << 20 | 1), None, "a restarted listing forgets what it had");
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
