//! The circuit breaker of one backend: after `threshold` consecutive failed requests the backend
//! is *open* (requests are refused at once instead of each waiting out timeouts and retries);
//! after `probe_after` exactly one request is let through as a probe (*half-open*): its success
//! closes the breaker, its failure re-opens it for another `probe_after`.
//!
//! Why: with replication a dead backend must cost nothing once it is known dead, or every write
//! waits for its timeouts. Invariants:
//! - at most one probe is in flight; a probe whose request is dropped (cancelled by a caller)
//!   releases its slot through [`Permit`]'s `Drop`, so the breaker can never stay stuck open;
//! - answers that prove the backend works (found, not found, already exists) count as successes;
//!   the caller decides that, this type only counts.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Counts consecutive failures and decides whether a request may go out.
pub(crate) struct CircuitBreaker {
    threshold: u32,
    probe_after: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    consecutive_failures: u32,
    /// Set while the breaker is open: when it (re)opened.
    opened_at: Option<Instant>,
    probe_in_flight: bool,
    last_error: Option<String>,
}

/// Why a request was refused.
pub(crate) struct Refusal {
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    pub probe_in: Duration,
}

/// The right to send one request; report its outcome with [`Permit::succeeded`] or
/// [`Permit::failed`]. Dropping it unreported counts as neither (a cancelled request).
pub(crate) struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
    reported: bool,
}

/// A point-in-time view for health reports.
pub(crate) struct BreakerSnapshot {
    pub available: bool,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
}

impl CircuitBreaker {
    /// `threshold == 0` disables tripping (failures are still counted for health reports).
    pub(crate) fn new(threshold: u32, probe_after: Duration) -> CircuitBreaker {
        CircuitBreaker { threshold, probe_after, state: Mutex::new(State::default()) }
    }

    /// Lets a request through (closed, or the single probe of a half-open breaker) or refuses it.
    pub(crate) fn admit(&self) -> Result<Permit<'_>, Refusal> {
        let mut s = self.state.lock();
        let Some(opened_at) = s.opened_at else {
            return Ok(Permit { breaker: self, probe: false, reported: false });
        };
        let elapsed = opened_at.elapsed();
        if elapsed >= self.probe_after && !s.probe_in_flight {
            s.probe_in_flight = true;
            return Ok(Permit { breaker: self, probe: true, reported: false });
        }
        Err(Refusal {
            consecutive_failures: s.consecutive_failures,
            last_error: s.last_error.clone(),
            probe_in: self.probe_after.saturating_sub(elapsed),
        })
    }

    /// Closed, or open with a probe due (so the next request would be let through).
    pub(crate) fn is_available(&self) -> bool {
        let s = self.state.lock();
        match s.opened_at {
            None => true,
            Some(at) => at.elapsed() >= self.probe_after && !s.probe_in_flight,
        }
    }

    pub(crate) fn snapshot(&self) -> BreakerSnapshot {
        let available = self.is_available();
        let s = self.state.lock();
        BreakerSnapshot { available, consecutive_failures: s.consecutive_failures, last_error: s.last_error.clone() }
    }

    fn on_success(&self, probe: bool) {
        let mut s = self.state.lock();
        s.consecutive_failures = 0;
        s.opened_at = None;
        if probe {
            s.probe_in_flight = false;
        }
    }

    fn on_failure(&self, probe: bool, error: String) {
        let mut s = self.state.lock();
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        s.last_error = Some(error);
        if probe {
            s.probe_in_flight = false;
            s.opened_at = Some(Instant::now());
        } else if s.opened_at.is_none() && self.threshold > 0 && s.consecutive_failures >= self.threshold {
            s.opened_at = Some(Instant::now());
        }
    }

    fn on_abandoned(&self, probe: bool) {
        if probe {
            self.state.lock().probe_in_flight = false;
        }
    }
}

impl Permit<'_> {
    pub(crate) fn succeeded(mut self) {
        self.reported = true;
        self.breaker.on_success(self.probe);
    }

    pub(crate) fn failed(mut self, error: String) {
        self.reported = true;
        self.breaker.on_failure(self.probe, error);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker.on_abandoned(self.probe);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn trips_after_threshold_and_probes_back() {
        let b = CircuitBreaker::new(3, Duration::from_millis(30));
        for _ in 0..3 {
            assert!(b.is_available());
            b.admit().ok().unwrap().failed("boom".into());
        }
        assert!(!b.is_available());
        let refusal = b.admit().err().unwrap();
        assert_eq!(refusal.consecutive_failures, 3);
        assert_eq!(refusal.last_error.as_deref(), Some("boom"));

        std::thread::sleep(Duration::from_millis(40));
        assert!(b.is_available());
        let probe = b.admit().ok().unwrap();
        // Only one probe at a time.
        assert!(!b.is_available());
        assert!(b.admit().is_err());
        probe.failed("still down".into());
        assert!(!b.is_available(), "a failed probe re-opens the breaker");

        std::thread::sleep(Duration::from_millis(40));
        b.admit().ok().unwrap().succeeded();
        assert!(b.is_available());
        assert_eq!(b.snapshot().consecutive_failures, 0);
    }

    #[test]
    fn a_dropped_probe_releases_its_slot() {
        let b = CircuitBreaker::new(1, Duration::ZERO);
        b.admit().ok().unwrap().failed("x".into());
        let probe = b.admit().ok().unwrap();
        assert!(b.admit().is_err());
        drop(probe);
        assert!(b.admit().is_ok());
    }

    #[test]
    fn success_resets_the_count_and_zero_threshold_never_trips() {
        let b = CircuitBreaker::new(2, Duration::from_secs(60));
        b.admit().ok().unwrap().failed("x".into());
        b.admit().ok().unwrap().succeeded();
        b.admit().ok().unwrap().failed("x".into());
        assert!(b.is_available());

        let never = CircuitBreaker::new(0, Duration::from_secs(60));
        for _ in 0..100 {
            never.admit().ok().unwrap().failed("x".into());
        }
        assert!(never.is_available());
        assert_eq!(never.snapshot().consecutive_failures, 100);
    }
}
