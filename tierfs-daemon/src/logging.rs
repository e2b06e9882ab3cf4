//! Log setup and error rendering shared by both binaries: `tracing` events (and fuser's `log` records, through
//! tracing-subscriber's log bridge) to stderr, filtered by `RUST_LOG`.
//!
//! Serving processes default to `info`, so the daemon log tells when a mount started, how
//! it stopped and whether the final flush completed; one-shot commands default to `warn`
//! to keep their output to the answer; fuser's own records are shown from `error` up (it
//! warns about every request it leaves unimplemented). Colours only when stderr is a terminal, so the
//! daemon log file stays plain text.

use std::io::IsTerminal;

use tierfs::ErrorKind;
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
///
/// The core's messages say what is wrong in its own words; this is the one place that adds
/// what to do on the command line ([`cli_hint`]).
pub fn error_message(err: &anyhow::Error) -> String {
    let mut message = String::new();
    let mut hint = None;
    for cause in err.chain() {
        hint = hint.or_else(|| cli_hint(cause));
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    if let Some(hint) = hint {
        message.push_str("; ");
        message.push_str(hint);
    }
    message
}

/// A failure a serving process reported on its readiness pipe, as its starter sees it: the
/// daemon's message and the kind of its error.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Reported {
    pub message: String,
    pub kind: Option<ErrorKind>,
}

/// What a caller can do about `err`: the kind of the outermost cause that has one (a core
/// error, a failure a daemon reported with its kind, or a local I/O error). `None` when no
/// cause says, as for the CLI's own checks.
pub fn error_kind(err: &anyhow::Error) -> Option<ErrorKind> {
    err.chain().find_map(|cause| {
        tierfs::error::kind_of(cause)
            .or_else(|| cause.downcast_ref::<Reported>().and_then(|r| r.kind))
            .or_else(|| cause.downcast_ref::<std::io::Error>().map(tierfs::types::io_error_kind))
    })
}

/// The command-line fix for a core error, looked through the core's wrappers (a
/// `#[error(transparent)]` wrapper hides its inner error from the cause chain). Presentation
/// only: no decision is taken on it.
pub fn cli_hint(cause: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    use tierfs::remote::RemoteError;
    use tierfs::session::SessionError;
    use tierfs::store::StoreError;
    use tierfs::tier::HotTierError;
    use tierfs::vfs::VfsError;

    fn remote(e: &RemoteError) -> Option<&'static str> {
        match e {
            RemoteError::Held { .. } => Some("if that node is gone, mount with --takeover"),
            RemoteError::Diverged { .. } => Some("mount with an empty --data-dir to take the store's state"),
            RemoteError::NoSnapshot(_) => Some("`tierfs snapshots` lists them"),
            RemoteError::Store(e) => store(e),
            _ => None,
        }
    }
    fn store(e: &StoreError) -> Option<&'static str> {
        match e {
            StoreError::NotInitialized(_) => Some("create a store with `tierfs init`"),
            StoreError::NoSuchKey(_) => Some("`tierfs key list` shows the store's keys"),
            _ => None,
        }
    }
    fn hot(e: &HotTierError) -> Option<&'static str> {
        match e {
            HotTierError::InUse { .. } => Some("unmount it first (`tierfs umount`) or use another --data-dir"),
            HotTierError::NoSpace { .. } => Some("or mount with a smaller --reserve"),
            _ => None,
        }
    }
    fn vfs(e: &VfsError) -> Option<&'static str> {
        match e {
            VfsError::HotTier(e) => hot(e),
            _ => None,
        }
    }
    if let Some(e) = cause.downcast_ref::<SessionError>() {
        return match e {
            SessionError::Remote(e) => remote(e),
            SessionError::Vfs(e) => vfs(e),
            SessionError::NotSnapshotCache(_) => Some("give a snapshot mount its own --data-dir"),
            SessionError::OtherWorkspace { .. } => Some("give each workspace its own --data-dir"),
            SessionError::NoConditionalWrites(_) => Some(
                "for servers that ignore conditional writes, such as Garage 2.x, set `fencing = \"lease\"` in \
                 the store file, or create it with `tierfs init --fencing lease`",
            ),
            SessionError::NoStore => Some("mount with --store FILE"),
            _ => None,
        };
    }
    cause
        .downcast_ref::<RemoteError>()
        .and_then(remote)
        .or_else(|| cause.downcast_ref::<StoreError>().and_then(store))
        .or_else(|| cause.downcast_ref::<VfsError>().and_then(vfs))
        .or_else(|| cause.downcast_ref::<HotTierError>().and_then(hot))
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

    #[test]
    fn core_errors_get_the_command_line_fix_once() {
        use tierfs::remote::RemoteError;
        use tierfs::session::SessionError;
        let held = RemoteError::Held { workspace: "w".into(), holder: "n:1".into(), expires: "soon".into() };
        let err = anyhow::Error::new(SessionError::Remote(held)).context("opening workspace \"w\"");
        let message = error_message(&err);
        assert!(message.ends_with("; if that node is gone, mount with --takeover"), "{message}");
        assert_eq!(message.matches("--takeover").count(), 1, "{message}");
        let missing = anyhow::Error::new(RemoteError::NoSnapshot("x".into()));
        assert!(error_message(&missing).contains("`tierfs snapshots`"));
        assert_eq!(error_message(&anyhow::anyhow!("plain")), "plain", "no hint for errors the core did not make");
    }

    #[test]
    fn the_kind_comes_from_the_outermost_cause_that_has_one() {
        use tierfs::remote::RemoteError;
        let held = RemoteError::Held { workspace: "w".into(), holder: "n:1".into(), expires: "soon".into() };
        let err = anyhow::Error::new(held).context("opening workspace \"w\"");
        assert_eq!(error_kind(&err), Some(ErrorKind::Fenced));
        let reported = Reported { message: "no space left".into(), kind: Some(ErrorKind::NoSpace) };
        assert_eq!(error_kind(&anyhow::Error::new(reported).context("mounting /m")), Some(ErrorKind::NoSpace));
        let missing = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(error_kind(&anyhow::Error::new(missing).context("reading /x")), Some(ErrorKind::NotFound));
        assert_eq!(error_kind(&anyhow::anyhow!("plain")), None);
    }
}
