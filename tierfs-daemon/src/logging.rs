//! Log setup and error rendering shared by both binaries: `tracing` events (and fuser's `log` records, through
//! tracing-subscriber's log bridge) to stderr, filtered by `RUST_LOG`.
//!
//! Serving processes default to `info`, so the daemon log tells when a mount started, how
//! it stopped and whether the final flush completed; one-shot commands default to `warn`
//! to keep their output to the answer; fuser's own records are shown from `error` up (it
//! warns about every request it leaves unimplemented). Colours only when stderr is a terminal, so the
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

/// An error and its causes on one line, `outer: inner: root`, like anyhow's `{:#}` but
/// without repeating a cause whose text the previous message already includes (thiserror
/// variants such as `#[error("metadata: {0}")]` both print and expose their source).
pub fn error_message(err: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("data directory is in use")]
        Locked,
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("hot tier: {0}")]
        Tier(#[from] Inner),
    }

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let err = anyhow::Error::new(Outer::from(Inner::Locked)).context("opening /d");
        assert_eq!(error_message(&err), "opening /d: hot tier: data directory is in use");
        let plain = anyhow::anyhow!("root").context("middle").context("top");
        assert_eq!(error_message(&plain), "top: middle: root");
    }
}
