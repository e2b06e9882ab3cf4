//! The order in which a session first reads its chunks: what an environment's imports (the
//! first cell of a notebook after a reset) read, in the order they read it. The saved hot set
//! carries it as an ordered prefix, so the next fresh node refills those chunks first, in that
//! order, before the rest by recency (docs/SEMANTICS.md, "The cache after a reset").
//!
//! Invariants: each chunk is recorded once, at its first read; recording stops for good at
//! [`MAX_HOT_ORDERED`] chunks or [`FIRST_READ_WINDOW`] after the session's first read,
//! whichever comes first, so the sequence is bounded and costs a read nothing after that. It
//! is kept in memory only: a session that restarts starts a new one.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::store::limits::MAX_HOT_ORDERED;
use crate::types::Ino;

/// How long after its first read a session records the order of first reads. A notebook's
/// first cell (activating the env, importing the stack) is over well within it; what is read
/// later is ranked by recency like before.
pub const FIRST_READ_WINDOW: Duration = Duration::from_secs(120);

/// The chunks first read in this session, in that order (bounded: see the module invariants).
#[derive(Debug, Default)]
pub(super) struct FirstReads {
    order: Vec<(Ino, u64)>,
    seen: HashSet<(Ino, u64)>,
    /// When recording ends ([`FIRST_READ_WINDOW`] after the first read); `None` before it.
    until: Option<Instant>,
    closed: bool,
}

impl FirstReads {
    /// Records the chunks `idxs` of `ino`, read now (`now` tells when, asked only while
    /// recording), that were not read before.
    pub(super) fn record(&mut self, ino: Ino, idxs: impl IntoIterator<Item = u64>, now: impl FnOnce() -> Instant) {
        if self.closed {
            return;
        }
        let now = now();
        if now >= *self.until.get_or_insert(now + FIRST_READ_WINDOW) {
            self.close();
            return;
        }
        for idx in idxs {
            if self.order.len() >= MAX_HOT_ORDERED {
                self.close();
                return;
            }
            if self.seen.insert((ino, idx)) {
                self.order.push((ino, idx));
            }
        }
    }

    /// Stops recording and lets go of the lookup set (the order stays).
    fn close(&mut self) {
        self.closed = true;
        self.seen = HashSet::new();
    }

    /// The chunks in the order they were first read.
    pub(super) fn order(&self) -> &[(Ino, u64)] {
        &self.order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_reads_are_kept_once_in_their_order() {
        let t = Instant::now();
        let mut r = FirstReads::default();
        r.record(7, [0, 1], || t);
        r.record(3, [0], || t);
        r.record(7, [1, 2], || t);
        r.record(3, [0], || t);
        assert_eq!(r.order(), &[(7, 0), (7, 1), (3, 0), (7, 2)]);
    }

    #[test]
    fn recording_ends_after_the_window_and_at_the_bound() {
        let t = Instant::now();
        let mut r = FirstReads::default();
        r.record(1, [0], || t);
        r.record(2, [0], || t + FIRST_READ_WINDOW);
        r.record(3, [0], || t);
        assert_eq!(r.order(), &[(1, 0)], "nothing is recorded once the window closed");

        let mut r = FirstReads::default();
        r.record(1, 0..MAX_HOT_ORDERED as u64 + 10, || t);
        r.record(2, [0], || t);
        assert_eq!(r.order().len(), MAX_HOT_ORDERED);
        assert!(r.seen.is_empty(), "the lookup set is dropped when recording ends");
    }
}
