//! What ends a serving front end: SIGTERM or SIGINT for a process that serves one mount, or
//! the node daemon's stop, which it sends to every mount it serves at once.
//!
//! Invariants:
//! - A standalone front end installs its signal handlers before it mounts, so a handler
//!   that cannot be installed is an error while nothing is mounted yet.
//! - A mount served by the node daemon installs none: the node owns the signals and fans
//!   them out, so one SIGTERM flushes every mount in parallel, each within its own
//!   `--flush-timeout`.

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

/// Where the stop of one front end comes from (see the module documentation).
pub enum Stop {
    /// The process's own SIGTERM and SIGINT.
    Signals { term: Signal, int: Signal },
    /// The node daemon: `Some(reason)` once it stops.
    Node(watch::Receiver<Option<&'static str>>),
}

impl Stop {
    /// SIGTERM and SIGINT of this process. Call it inside the runtime's context.
    pub fn signals() -> Result<Stop> {
        let term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        Ok(Stop::Signals { term, int })
    }

    /// Waits until the front end is asked to stop and says who asked (`SIGTERM`, `SIGINT`,
    /// or the node's reason).
    pub async fn wait(&mut self) -> &'static str {
        match self {
            Stop::Signals { term, int } => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            Stop::Node(rx) => loop {
                if let Some(reason) = *rx.borrow_and_update() {
                    return reason;
                }
                if rx.changed().await.is_err() {
                    return "the node daemon stopping";
                }
            },
        }
    }
}
