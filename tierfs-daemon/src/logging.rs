//! Log setup shared by both binaries: `tracing` events (and fuser's `log` records, through
//! tracing-subscriber's log bridge) to stderr, filtered by `RUST_LOG`.
//!
//! Serving processes default to `info`, so the daemon log tells when a mount started, how
//! it stopped and whether the final flush completed; one-shot commands default to `warn`
//! to keep their output to the answer. Colours only when stderr is a terminal, so the
//! daemon log file stays plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG` is unset or
/// invalid. Calling it twice is harmless (the second call does nothing).
pub fn init(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
