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
/// The variable that, in a debug build, makes `tierfs` replace every failure's message with
/// words of its own (`reworded <n>`), so that a test can show its callers decide by `kind`
/// and `reason` only, never by the wording.
pub const REWORD_ENV: &str = "TIERFS_TEST_REWORD";

/// The message `tierfs` shows for a failure: [`error_message`], or in a debug build with
/// [`REWORD_ENV`] set, none of its words.
pub fn shown_message(err: &anyhow::Error) -> String {
    let message = error_message(err);
    if cfg!(debug_assertions) && std::env::var_os(REWORD_ENV).is_some() {
        let n = message.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        return format!("reworded {n:08x}");
    }
    message
}

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

/// A refinement of an [`ErrorKind`] that scripts act on: printed by `tierfs --json` as
/// `"reason"` beside `"kind"`. This is the one list of reasons; `tierfs --help`, the README
/// and python/README.md document it, and the Python package maps it to its exception classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The passphrase or key file does not unlock the store, or none was given
    /// (`invalid_input`).
    WrongKey,
    /// The mount point or data directory is taken: not empty, another filesystem's mount
    /// point, another workspace's mount or watch, in use by another tierfs process, or busy
    /// (`conflict`).
    PathInUse,
    /// The mount point itself is refused before FUSE is tried: it is not empty, or it is
    /// already another filesystem's mount point (`conflict`). Distinct from
    /// [`Reason::PathInUse`] so that a caller which falls back to watch mode when FUSE is
    /// missing can tell "this directory" from "this machine" without reading the message.
    MountpointTaken,
    /// FUSE does not work here: no `/dev/fuse`, a device that does not open, or a FUSE mount
    /// the kernel refuses (`unavailable`): `tierfs watch` serves without it.
    FuseUnavailable,
    /// The command gave up waiting for a daemon within its timeout (`unavailable`).
    Timeout,
    /// `tierfs layer add` on a mount whose passthrough declared the kernel's whole stack
    /// depth (its data dir is on overlayfs or another stacked filesystem), so no overlay can
    /// sit on it until it is remounted with `--no-passthrough` (`conflict`).
    PassthroughStackFull,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::WrongKey,
        Reason::PathInUse,
        Reason::MountpointTaken,
        Reason::FuseUnavailable,
        Reason::Timeout,
        Reason::PassthroughStackFull,
    ];

    /// The stable name `--json` prints.
    pub fn name(self) -> &'static str {
        match self {
            Reason::WrongKey => "wrong_key",
            Reason::PathInUse => "path_in_use",
            Reason::MountpointTaken => "mountpoint_taken",
            Reason::FuseUnavailable => "fuse_unavailable",
            Reason::Timeout => "timeout",
            Reason::PassthroughStackFull => "passthrough_stack_full",
        }
    }

    /// The reason a [`Reason::name`] names (as another process printed it).
    pub fn from_name(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The kind this reason refines.
    pub fn kind(self) -> ErrorKind {
        match self {
            Reason::WrongKey => ErrorKind::InvalidInput,
            Reason::PathInUse | Reason::MountpointTaken | Reason::PassthroughStackFull => ErrorKind::Conflict,
            Reason::FuseUnavailable | Reason::Timeout => ErrorKind::Unavailable,
        }
    }
}

/// What a [`Reported`] failure is: a kind, or a reason (which gives its kind).
pub trait Why {
    fn kind_and_reason(self) -> (ErrorKind, Option<Reason>);
}

impl Why for ErrorKind {
    fn kind_and_reason(self) -> (ErrorKind, Option<Reason>) {
        (self, None)
    }
}

impl Why for Reason {
    fn kind_and_reason(self) -> (ErrorKind, Option<Reason>) {
        (self.kind(), Some(self))
    }
}

/// The daemon's own typed failure: a message with the kind (and reason) a caller acts on, for
/// what is not a core error: a check of the CLI's own, or a failure another process (a
/// serving process on its readiness pipe, a control socket's answer) reported with its kind.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Reported {
    pub message: String,
    pub kind: Option<ErrorKind>,
    pub reason: Option<Reason>,
}

impl Reported {
    /// A failure of kind `why` (an [`ErrorKind`] or a [`Reason`]).
    pub fn new(why: impl Why, message: impl Into<String>) -> Reported {
        let (kind, reason) = why.kind_and_reason();
        Reported { message: message.into(), kind: Some(kind), reason }
    }

    /// `err` as another process is told it: its one-line message, kind and reason.
    pub fn of(err: &anyhow::Error) -> Reported {
        Reported { message: error_message(err), kind: error_kind(err), reason: error_reason(err) }
    }

    /// A failure another process printed, with the names of its kind and reason (unknown
    /// names are dropped: an older or newer tierfs).
    pub fn from_names(message: impl Into<String>, kind: Option<&str>, reason: Option<&str>) -> Reported {
        let reason = reason.and_then(Reason::from_name);
        let kind = kind.and_then(ErrorKind::from_name).or(reason.map(Reason::kind));
        Reported { message: message.into(), kind, reason }
    }
}

/// `anyhow!` with a kind or a [`Reason`]: `failure!(ErrorKind::NotFound, "no {x}")` is an
/// [`anyhow::Error`] holding a [`Reported`].
macro_rules! failure {
    ($why:expr, $($arg:tt)+) => {
        anyhow::Error::new($crate::logging::Reported::new($why, format!($($arg)+)))
    };
}
pub(crate) use failure;

/// `bail!` with a kind or a [`Reason`] (see [`failure!`]).
macro_rules! bail_with {
    ($why:expr, $($arg:tt)+) => {
        return Err($crate::logging::failure!($why, $($arg)+).into())
    };
}
pub(crate) use bail_with;

/// What a caller can do about `err`: the kind of the outermost cause that has one (a core
/// error, a [`Reported`] failure, or a local I/O error). `None` when no cause says.
pub fn error_kind(err: &anyhow::Error) -> Option<ErrorKind> {
    // A `Reported` given as context is no element of the chain; anyhow finds it.
    if let Some(kind) = err.downcast_ref::<Reported>().and_then(|r| r.kind) {
        return Some(kind);
    }
    err.chain().find_map(|cause| {
        tierfs::error::kind_of(cause)
            .or_else(|| cause.downcast_ref::<Reported>().and_then(|r| r.kind))
            .or_else(|| cause.downcast_ref::<std::io::Error>().map(tierfs::types::io_error_kind))
    })
}

/// The [`Reason`] of `err`, when a cause has one: a [`Reported`] failure's, or that of a core
/// error that means one (a wrong key, a data directory in use), looked for through the core's
/// wrappers as [`cli_hint`] does.
pub fn error_reason(err: &anyhow::Error) -> Option<Reason> {
    if let Some(reason) = err.downcast_ref::<Reported>().and_then(|r| r.reason) {
        return Some(reason);
    }
    err.chain().find_map(|cause| cause.downcast_ref::<Reported>().and_then(|r| r.reason).or_else(|| core_reason(cause)))
}

/// The reason a core error means, if any. Presentation only, like [`cli_hint`].
fn core_reason(cause: &(dyn std::error::Error + 'static)) -> Option<Reason> {
    use tierfs::crypto::CryptoError;
    use tierfs::remote::RemoteError;
    use tierfs::session::SessionError;
    use tierfs::store::StoreError;
    use tierfs::tier::HotTierError;
    use tierfs::vfs::VfsError;
    use tierfs::watch::WatchError;

    fn crypto(e: &CryptoError) -> Option<Reason> {
        matches!(e, CryptoError::WrongKey | CryptoError::BadKeyFile(_)).then_some(Reason::WrongKey)
    }
    fn store(e: &StoreError) -> Option<Reason> {
        match e {
            StoreError::Crypto(e) => crypto(e),
            _ => None,
        }
    }
    fn remote(e: &RemoteError) -> Option<Reason> {
        match e {
            RemoteError::Store(e) => store(e),
            _ => None,
        }
    }
    fn hot(e: &HotTierError) -> Option<Reason> {
        matches!(e, HotTierError::InUse { .. }).then_some(Reason::PathInUse)
    }
    fn vfs(e: &VfsError) -> Option<Reason> {
        match e {
            VfsError::HotTier(e) => hot(e),
            _ => None,
        }
    }
    fn session(e: &SessionError) -> Option<Reason> {
        match e {
            SessionError::Remote(e) => remote(e),
            SessionError::Vfs(e) => vfs(e),
            SessionError::NotSnapshotCache(_) | SessionError::OtherWorkspace { .. } => Some(Reason::PathInUse),
            _ => None,
        }
    }
    if let Some(WatchError::Mismatch { .. }) = cause.downcast_ref::<WatchError>() {
        return Some(Reason::PathInUse);
    }
    cause
        .downcast_ref::<SessionError>()
        .and_then(session)
        .or_else(|| cause.downcast_ref::<RemoteError>().and_then(remote))
        .or_else(|| cause.downcast_ref::<StoreError>().and_then(store))
        .or_else(|| cause.downcast_ref::<CryptoError>().and_then(crypto))
        .or_else(|| cause.downcast_ref::<VfsError>().and_then(vfs))
        .or_else(|| cause.downcast_ref::<HotTierError>().and_then(hot))
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
        let reported = Reported::new(ErrorKind::NoSpace, "no space left");
        assert_eq!(error_kind(&anyhow::Error::new(reported).context("mounting /m")), Some(ErrorKind::NoSpace));
        let missing = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(error_kind(&anyhow::Error::new(missing).context("reading /x")), Some(ErrorKind::NotFound));
        assert_eq!(error_kind(&anyhow::anyhow!("plain")), None);
    }

    #[test]
    fn reasons_come_from_the_daemons_checks_and_the_core_and_cross_processes_by_name() {
        use tierfs::crypto::CryptoError;
        use tierfs::store::StoreError;
        let busy = failure!(Reason::PathInUse, "mountpoint {} is not empty", "/m").context("mounting /m");
        assert_eq!((error_kind(&busy), error_reason(&busy)), (Some(ErrorKind::Conflict), Some(Reason::PathInUse)));
        let wrong = anyhow::Error::new(StoreError::Crypto(CryptoError::WrongKey)).context("opening the store");
        assert_eq!((error_kind(&wrong), error_reason(&wrong)), (Some(ErrorKind::InvalidInput), Some(Reason::WrongKey)));
        let context = anyhow::Error::new(std::io::Error::other("refused"))
            .context(Reported::new(Reason::FuseUnavailable, "mounting FUSE filesystem at /m"));
        assert_eq!(error_reason(&context), Some(Reason::FuseUnavailable), "a Reported given as context counts");
        assert_eq!(error_kind(&context), Some(ErrorKind::Unavailable));
        let plain = failure!(ErrorKind::NotFound, "no such mount");
        assert_eq!((error_kind(&plain), error_reason(&plain)), (Some(ErrorKind::NotFound), None));
        for reason in Reason::ALL {
            assert_eq!(Reason::from_name(reason.name()), Some(reason));
            let back = Reported::from_names("m", None, Some(reason.name()));
            assert_eq!((back.kind, back.reason), (Some(reason.kind()), Some(reason)), "a reason gives its kind");
        }
        let newer = Reported::from_names("m", Some("fenced"), Some("not_known_yet"));
        assert_eq!((newer.kind, newer.reason), (Some(ErrorKind::Fenced), None));
    }
}
