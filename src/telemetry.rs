//! Counters and latency histograms that a front end reads whole, at any time, without
//! stopping the code that updates them: the per-operation numbers behind the node daemon's
//! Prometheus series (FUSE requests in `tierfs-mount`, store requests in `backend`).
//!
//! Invariants:
//! - Updating is lock-free: a few relaxed atomic adds, no allocation, so instrumenting a hot
//!   path costs tens of nanoseconds. A reader may see one update half applied (a count
//!   without its bucket yet); every value only grows, so the next read is whole again.
//! - The buckets are fixed ([`LATENCY_BOUNDS_NS`], 50 µs to 10 s), the same for every
//!   histogram, so series from different operations and nodes can be summed.
//! - Snapshots hold integers only (nanoseconds, counts), so they compare exactly and travel
//!   as JSON unchanged; a front end converts to seconds when it renders.
//! - This module imports nothing from the crate: any layer may use it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the latency buckets, in nanoseconds (a last, unbounded bucket follows).
pub const LATENCY_BOUNDS_NS: [u64; 16] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    10_000_000_000,
];

/// A latency histogram over [`LATENCY_BOUNDS_NS`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative); the last one is above every bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_NS.iter().position(|&bound| ns <= bound).unwrap_or(LATENCY_BOUNDS_NS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// A histogram read whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    /// Observations per bucket of [`LATENCY_BOUNDS_NS`] (not cumulative), plus one above them.
    pub buckets: Vec<u64>,
    /// The sum of every observation, in nanoseconds.
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// `(upper bound in seconds, observations at or below it)` for each bound, then
    /// `(+Inf, count)`: the cumulative form Prometheus' `_bucket{le}` series use.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (i, n) in self.buckets.iter().enumerate() {
            total += n;
            let le = LATENCY_BOUNDS_NS.get(i).map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
            out.push((le, total));
        }
        out
    }
}

/// One kind of operation: how often it ran, how often it failed, how long it took.
#[derive(Debug, Default)]
pub struct OpStats {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub latency: Histogram,
}

impl OpStats {
    /// One finished call.
    pub fn record(&self, took: Duration, failed: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency.observe(took);
    }

    pub fn snapshot(&self, op: &str) -> OpSnapshot {
        OpSnapshot {
            op: op.to_owned(),
            calls: self.calls.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency: self.latency.snapshot(),
        }
    }
}

/// An [`OpStats`] read whole, named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSnapshot {
    pub op: String,
    pub calls: u64,
    pub errors: u64,
    pub latency: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10)); // bucket 0 (≤ 50 µs)
        h.observe(Duration::from_micros(50)); // bucket 0: bounds are inclusive
        h.observe(Duration::from_micros(51)); // bucket 1
        h.observe(Duration::from_secs(60)); // above every bound
        let s = h.snapshot();
        assert_eq!(s.count(), 4);
        assert_eq!((s.buckets[0], s.buckets[1], s.buckets[16]), (2, 1, 1));
        assert_eq!(s.sum_ns, 10_000 + 50_000 + 51_000 + 60_000_000_000);
        let c = s.cumulative();
        assert_eq!(c.len(), 17);
        assert_eq!(c[0], (0.00005, 2));
        assert_eq!(c[1].1, 3);
        assert_eq!(c[15], (10.0, 3));
        assert_eq!(c[16], (f64::INFINITY, 4));
    }

    #[test]
    fn an_op_counts_calls_and_errors() {
        let op = OpStats::default();
        op.record(Duration::from_millis(1), false);
        op.record(Duration::from_millis(2), true);
        let s = op.snapshot("get");
        assert_eq!((s.op.as_str(), s.calls, s.errors, s.latency.count()), ("get", 2, 1, 2));
    }
}
