//! Serving one mount from start to finish, as a composition of the core's workspace
//! [`Session`], the FUSE adapter, the control socket and signals: check the mountpoint, open
//! the session, bind the control socket, mount, report readiness, then wait for
//! SIGTERM/SIGINT, an `unmount` request or an external unmount, and shut down with a bounded,
//! reported flush and close of the session.
//!
//! Invariants:
//! - Everything that can fail is checked *before* readiness is reported: a caller told
//!   "ready" has a working mount and a control socket that answers.
//! - Shutdown order is unmount → `Session::flush` → (if files are still open on a lazily
//!   detached mount) wait for the FUSE session to end → `Session::flush` again →
//!   `Session::close`. The unmount
//!   comes first because only then has the kernel handed over every write it held (closing a
//!   file flushes its writeback pages; a non-busy unmount means all are closed). Before a
//!   lazy detach on a signal, `syncfs` makes the kernel hand over what open files wrote so
//!   far. All waits share one deadline, `--flush-timeout`; the outcome is logged and
//!   returned to the unmount requester, and the process exits 1 when it is incomplete.
//! - A control `unmount` of a busy mountpoint is refused and the mount keeps serving; a
//!   signal detaches a busy mount lazily instead, since the process is asked to go away.
//! - The unmount is done with our own `umount2`/`fusermount3` call rather than fuser's
//!   one-shot unmounter, so a refused (busy) unmount can be retried later; fuser's handle is
//!   used up right after ours succeeds (see `FuserMount`).
//! - FUSE requests are served by fuser's request thread and the adapter's pool; the tokio
//!   runtime only runs the control socket, the signal handlers and the shutdown sequence.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use tierfs::session::{Session, SessionError};
use tierfs::store::Store;
use tierfs_mount::SessionUnmounter;
use tierfs_mount::meter::FuseStats;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::config::MountConfig;
use crate::control::{
    self, ControlHandler, FlushReport, HistoryAnswer, HistoryOp, Pong, StatusReport, SyncReport, UnmountReport,
    UnmountRequest,
};
use crate::launch::{Readiness, ReadyInfo};
use crate::logging::{Reason, Reported, bail_with, failure};
use crate::mounts::{self, UnmountError};
use crate::paths;
use crate::stop::Stop;
use tierfs::ErrorKind;

/// The version reported over the control socket.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long a control client that asked for the unmount gets to read the answer before
/// the process exits anyway.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// What the node daemon prepared with root's rights for a worker that serves a mount as its
/// owner (`crate::worker`): with these the worker opens no path of root's and mounts nothing.
pub(crate) struct Supplied {
    /// The `/dev/fuse` descriptor the node daemon mounted at `config.mountpoint` (none for
    /// a watch).
    pub fuse: Option<OwnedFd>,
    /// The control socket, bound by the node daemon (which removes it at the end).
    pub socket: GivenSocket,
    /// The store, opened from the configuration and secret the node daemon read.
    pub store: Option<Store>,
    /// Unmounts the mount: the node daemon does it, as unmounting needs root.
    pub unmount: SupervisorUnmount,
}

/// A control socket someone else bound at `path`.
pub(crate) struct GivenSocket {
    pub listener: StdUnixListener,
    pub path: PathBuf,
}

/// An unmount the node daemon makes for a worker: `lazy` as for [`mounts::unmount`].
pub(crate) type SupervisorUnmount = Arc<dyn Fn(bool) -> Result<mounts::UnmountMethod, UnmountError> + Send + Sync>;

/// Serves the mount described by `config` until it is unmounted, with what the node daemon
/// `supplied` when a worker serves it. Returns an error when the mount could not be set up,
/// or when the final flush did not complete.
pub(crate) fn run(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    stop: Stop,
    supplied: Option<Supplied>,
) -> Result<()> {
    // Everything fallible, including the tokio listener and signal handlers, is set up before
    // the mount, so an error never leaves a mount behind.
    let _rt_context = rt.enter();
    let (mountpoint, store, given) = match supplied {
        // The node daemon checked the mountpoint and mounted it.
        Some(s) => (config.mountpoint.clone(), s.store.map(Arc::new), Some((s.fuse, s.socket, s.unmount))),
        None => {
            let mountpoint = prepare_mountpoint(config)?;
            mounts::check_fuse_device()?;
            let store = match &config.store {
                Some(file) => Some(Arc::new(crate::store_link::open_store(rt.handle(), file)?.0)),
                None => None,
            };
            (mountpoint, store, None)
        }
    };
    let session = Session::open(config.session_config(store), rt.handle()).map_err(|e| session_context(e, config))?;
    let session = Arc::new(session);
    let served = serve(rt, config, readiness, stop, &session, &mountpoint, given);
    if served.is_err() {
        // Set-up failed after the session opened, or the final flush did: give the lease back
        // (a no-op when the session was closed already).
        let deadline = tokio::time::Instant::now() + config.flush_timeout;
        if let Err(e) = rt.block_on(session.close(deadline)) {
            error!("closing the workspace: {e}");
        }
    }
    served
}

/// Mounts the session's filesystem, serves it and the control socket until an unmount, then
/// flushes and closes the session within `--flush-timeout`.
fn serve(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    mut stop: Stop,
    session: &Arc<Session>,
    mountpoint: &Path,
    given: Option<(Option<OwnedFd>, GivenSocket, SupervisorUnmount)>,
) -> Result<()> {
    let (given_fuse, given_socket, given_unmount) = match given {
        Some((fuse, socket, unmount)) => (Some(fuse), Some(socket), Some(unmount)),
        None => (None, None, None),
    };
    let (listener, socket_guard) = control_listener(config, mountpoint, given_socket)?;
    let socket = socket_guard.path().to_path_buf();

    let fuse_stats = config.metered.then(|| Arc::new(FuseStats::default()));
    let (unmounter, session_thread, session_done) =
        run_fuse(config, session, mountpoint, given_fuse, given_unmount, fuse_stats.as_ref())?;

    let handler: Arc<dyn ControlHandler> =
        Arc::new(Served::new(session.clone(), config.clone(), mountpoint.to_path_buf(), socket.clone(), fuse_stats));
    let info = ReadyInfo::of_this_process(mountpoint, &config.data_dir, &socket);

    let report = rt.block_on(async {
        let (unmount_tx, mut unmount_rx) = mpsc::channel::<UnmountRequest>(4);
        let server = tokio::spawn(control::serve(listener, handler.clone(), config.owner, unmount_tx));
        readiness.ready(&info, &handler);
        info!(
            mountpoint = %mountpoint.display(),
            data_dir = %config.data_dir.display(),
            socket = %socket.display(),
            pid = info.pid,
            "tierfs {VERSION} serving"
        );

        let mut session_done = session_done;
        let mut session_ended = None;
        let mut requester = None;
        loop {
            tokio::select! {
                reason = stop.wait() => {
                    signal_unmount(mountpoint, reason, &unmounter, config.flush_timeout).await;
                    break;
                }
                ended = &mut session_done => {
                    info!("{} was unmounted from outside (umount or fusermount -u)", mountpoint.display());
                    session_ended = Some(flatten_session_result(ended));
                    break;
                }
                Some(request) = unmount_rx.recv() => {
                    info!(lazy = request.lazy, "unmount requested over the control socket");
                    match unmount_blocking(mountpoint, request.lazy, &unmounter).await {
                        Ok(method) => {
                            info!("unmounted {} ({method})", mountpoint.display());
                            requester = Some(request);
                            break;
                        }
                        Err(err) => {
                            warn!("refusing unmount: {err}");
                            let _ = request.reply.send(Err(err.reported()));
                        }
                    }
                }
            }
        }

        let report = finish(session, config, mountpoint, session_ended, session_done).await;
        if let Some(request) = requester {
            let _ = request.reply.send(Ok(report.clone()));
            let _ = tokio::time::timeout(ANSWER_GRACE, request.written).await;
        }
        // Wait for the aborted server, so its hold on the session ends here.
        server.abort();
        let _ = server.await;
        report
    });
    drop(socket_guard);

    if report.flushed {
        // The session has ended, so joining is immediate.
        if session_thread.join().is_err() {
            error!("the FUSE session thread panicked");
        }
        Ok(())
    } else {
        Err(failure!(
            ErrorKind::Unavailable,
            "{}",
            report.flush_error.unwrap_or_else(|| "the final flush did not complete".into())
        ))
    }
}

/// Opens the mount's FUSE session and runs it on a thread of its own, with a follower's new
/// heads passed on to the kernel's caches. Returns how to unmount it (the node daemon's
/// `given_unmount` for a worker), the thread, and the session's end.
fn run_fuse(
    config: &MountConfig,
    session: &Arc<Session>,
    mountpoint: &Path,
    given_fuse: Option<Option<OwnedFd>>,
    given_unmount: Option<SupervisorUnmount>,
    fuse_stats: Option<&Arc<FuseStats>>,
) -> Result<(Unmounter, std::thread::JoinHandle<()>, oneshot::Receiver<io::Result<()>>)> {
    let mut fuse = open_fuse(config, session, mountpoint, given_fuse, fuse_stats)?;
    // A follower's new heads reach the kernel's caches, which otherwise keep names,
    // attributes and pages for their TTLs (file pages for as long as the kernel likes).
    let notifier = fuse.notifier();
    session.on_new_head(move |change| tierfs_mount::invalidate(&notifier, change));
    let unmounter = match given_unmount {
        Some(unmount) => Unmounter::NodeDaemon(unmount),
        None => Unmounter::Fuser(Arc::new(Mutex::new(fuse.unmount_callable()))),
    };
    let (session_tx, session_done) = oneshot::channel();
    let session_thread = std::thread::Builder::new().name("tierfs-session".into()).spawn(move || {
        let result = fuse.run();
        let _ = session_tx.send(result);
    });
    // On an error the FUSE session (and with it the mount) was moved into the closure and dropped.
    let session_thread = session_thread.context("starting the FUSE session thread")?;
    if matches!(unmounter, Unmounter::Fuser(_)) {
        // (The node daemon sets a worker's: the window is writable by root only.)
        set_read_ahead(mountpoint, config.mount_options().read_ahead_kib);
    }
    Ok((unmounter, session_thread, session_done))
}

/// The FUSE session of the mount: on the `/dev/fuse` descriptor the node daemon handed over
/// (`given`), or mounted here; metered when `stats` are kept (the node daemon's mounts).
fn open_fuse(
    config: &MountConfig,
    session: &Arc<Session>,
    mountpoint: &Path,
    given: Option<Option<OwnedFd>>,
    stats: Option<&Arc<FuseStats>>,
) -> Result<tierfs_mount::Session<tierfs_mount::TierFuse>> {
    let vfs = session.vfs().clone();
    let fuse = match (given, stats) {
        (Some(Some(fd)), stats) => tierfs_mount::session_from_fd(vfs, fd, &config.mount_options(), stats.cloned()),
        (Some(None), _) => bail_with!(
            ErrorKind::Internal,
            "the node daemon handed over no FUSE descriptor for {}",
            mountpoint.display()
        ),
        (None, Some(stats)) => tierfs_mount::session_metered(vfs, mountpoint, &config.mount_options(), stats.clone()),
        (None, None) => tierfs_mount::session(vfs, mountpoint, &config.mount_options()),
    };
    fuse.map_err(|err| explain_mount_error(err, config, mountpoint))
}

/// Says what was being opened when a session failed to open (the fix is added where the
/// error is printed, `logging::error_message`).
pub(crate) fn session_context(err: SessionError, config: &MountConfig) -> anyhow::Error {
    let context = match &err {
        SessionError::Remote(_) | SessionError::NoConditionalWrites(_) => {
            format!("opening workspace {:?} of the store", config.workspace)
        }
        _ => format!("opening data directory {}", config.data_dir.display()),
    };
    anyhow::Error::new(err).context(context)
}

/// Makes sure `config.mountpoint` is a directory we may mount on, creating it if missing,
/// and returns its canonical path.
pub(crate) fn prepare_mountpoint(config: &MountConfig) -> Result<PathBuf> {
    let path = &config.mountpoint;
    match fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => bail_with!(Reason::PathInUse, "mountpoint {} is not a directory", path.display()),
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(path).with_context(|| format!("creating mountpoint {}", path.display()))?;
            info!("created mountpoint {}", path.display());
        }
        Err(err) if err.raw_os_error() == Some(libc::ENOTCONN) => clear_stale_mount(path)?,
        Err(err) => {
            return Err(err).with_context(|| format!("checking mountpoint {}", path.display()));
        }
    }
    let canonical = fs::canonicalize(path).with_context(|| format!("resolving mountpoint {}", path.display()))?;
    if let Some(entry) = mounts::find_mount(&canonical).context("reading the mount table")? {
        // A `stat` can be answered from the kernel's cached attributes of a mount whose
        // daemon is gone (the daemon itself stats the root when it sets the readahead
        // window); a `statfs` always asks the daemon, and a dead one answers ENOTCONN.
        if !(entry.is_fuse() && connection_is_dead(&canonical)) {
            bail_with!(
                Reason::MountpointTaken,
                "{} is already a mount point ({} from {}); unmount it first (`tierfs umount {}`)",
                canonical.display(),
                entry.fs_type,
                entry.source,
                canonical.display()
            );
        }
        clear_stale_mount(&canonical)?;
    }
    if !config.nonempty {
        let mut entries =
            fs::read_dir(&canonical).with_context(|| format!("reading mountpoint {}", canonical.display()))?;
        if entries.next().is_some() {
            bail_with!(
                Reason::MountpointTaken,
                "mountpoint {} is not empty; its files would be hidden while mounted. Move them \
                 away, pick an empty directory, or pass --nonempty",
                canonical.display()
            );
        }
    }
    Ok(canonical)
}

/// Whether the FUSE mount at `path` has lost its daemon (`statfs` fails with ENOTCONN).
fn connection_is_dead(path: &Path) -> bool {
    rustix::fs::statfs(path).is_err_and(|e| e == rustix::io::Errno::NOTCONN)
}

/// A tierfs mount whose daemon died (kill -9, OOM) leaves a mount that fails every access
/// with ENOTCONN. Mounting again is the natural recovery, so clear it; anything else there
/// is not ours to touch.
fn clear_stale_mount(path: &Path) -> Result<()> {
    let entry = mounts::find_mount(path).context("reading the mount table")?;
    match entry {
        Some(entry) if entry.is_fuse() && (entry.source == "tierfs" || entry.fs_type == "fuse.tierfs") => {
            warn!("{} is a stale tierfs mount (its daemon is gone); detaching it", path.display());
            mounts::unmount(path, true).with_context(|| format!("clearing the stale mount at {}", path.display()))?;
            Ok(())
        }
        _ => bail_with!(
            Reason::PathInUse,
            "mountpoint {} is not accessible (transport endpoint is not connected): a stale \
             FUSE mount of another filesystem; unmount it first (`fusermount3 -u {}`)",
            path.display(),
            path.display()
        ),
    }
}

/// Binds the mount's control socket owner-only, replacing a socket file left behind by a
/// dead process but never one that still answers.
pub(crate) fn bind_control_socket(config: &MountConfig, mountpoint: &Path) -> Result<(StdUnixListener, SocketFile)> {
    // A mount with an owner (node daemon) is controlled by that user too: its socket is
    // reachable by everyone and each connection is checked (`control::serve`).
    let shared = config.owner.is_some();
    paths::ensure_runtime_dir(&config.runtime_dir, shared)?;
    let socket = paths::socket_path(&config.runtime_dir, mountpoint)?;
    if fs::symlink_metadata(&socket).is_ok() {
        if let Ok(Some(pong)) = control::ping(&socket, Duration::from_secs(2)) {
            bail_with!(
                Reason::PathInUse,
                "{} is already served by tierfs pid {} (data dir {})",
                pong.mountpoint.display(),
                pong.pid,
                pong.data_dir.display()
            );
        }
        fs::remove_file(&socket).with_context(|| format!("removing stale control socket {}", socket.display()))?;
    }
    let listener =
        StdUnixListener::bind(&socket).with_context(|| format!("creating control socket {}", socket.display()))?;
    let guard = SocketFile::new(socket)?;
    let mode = if shared { 0o666 } else { 0o600 };
    fs::set_permissions(&guard.path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {} to {mode:o}", guard.path.display()))?;
    Ok((listener, guard))
}

/// The control socket of a mount: the one the node daemon bound for a worker (`given`), or
/// one bound here ([`bind_control_socket`]), which is removed when the guard is dropped.
pub(crate) fn control_listener(
    config: &MountConfig,
    mountpoint: &Path,
    given: Option<GivenSocket>,
) -> Result<(tokio::net::UnixListener, ControlSocket)> {
    let (listener, socket) = match given {
        Some(GivenSocket { listener, path }) => (listener, ControlSocket::Given(path)),
        None => {
            let (listener, file) = bind_control_socket(config, mountpoint)?;
            (listener, ControlSocket::Bound(file))
        }
    };
    listener.set_nonblocking(true).context("configuring the control socket")?;
    let listener = tokio::net::UnixListener::from_std(listener).context("registering the control socket")?;
    Ok((listener, socket))
}

/// Where the control socket is, and whether this process removes it at the end.
pub(crate) enum ControlSocket {
    /// Bound by the node daemon, which removes it.
    Given(PathBuf),
    /// Bound here: removed when dropped.
    Bound(SocketFile),
}

impl ControlSocket {
    pub(crate) fn path(&self) -> &Path {
        match self {
            ControlSocket::Given(path) => path,
            ControlSocket::Bound(file) => &file.path,
        }
    }
}

/// Adds what a user needs to fix a failed mount.
fn explain_mount_error(err: io::Error, config: &MountConfig, mountpoint: &Path) -> anyhow::Error {
    let refused = err.kind() == io::ErrorKind::PermissionDenied && !mounts::is_root();
    if refused && config.allow_other {
        // An option the user can drop, not a reason to do without FUSE.
        return anyhow::Error::new(err).context(format!(
            "mounting FUSE filesystem at {} (allow_other needs `user_allow_other` in /etc/fuse.conf; or mount \
             with --no-allow-other)",
            mountpoint.display()
        ));
    }
    let hint =
        if refused { " (non-root mounts need the setuid fusermount3 helper from the fuse3 package)" } else { "" };
    failure!(Reason::FuseUnavailable, "mounting FUSE filesystem at {}{hint}: {err}", mountpoint.display())
}

/// Unmount on a signal: the process is asked to go away, so a busy mount is detached
/// lazily rather than kept.
async fn signal_unmount(mountpoint: &Path, signal: &str, unmounter: &Unmounter, flush_timeout: Duration) {
    info!("{signal} received: unmounting {}", mountpoint.display());
    match unmount_blocking(mountpoint, false, unmounter).await {
        Ok(method) => info!("unmounted {} ({method})", mountpoint.display()),
        Err(UnmountError::Busy(_)) => {
            warn!(
                "{} is busy; detaching it lazily: open files keep working until closed or \
                 until the flush timeout",
                mountpoint.display()
            );
            // Once detached the path no longer reaches the mount: have the kernel hand over
            // the writes it still caches for the open files first.
            let path = mountpoint.to_path_buf();
            let synced =
                tokio::time::timeout(flush_timeout, tokio::task::spawn_blocking(move || mounts::syncfs(&path)));
            match synced.await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => warn!("syncfs {}: {err}", mountpoint.display()),
                Ok(Err(err)) => warn!("syncfs task failed: {err}"),
                Err(_) => warn!("syncfs {} did not finish within the flush timeout", mountpoint.display()),
            }
            if let Err(err) = unmount_blocking(mountpoint, true, unmounter).await {
                error!("lazy unmount failed: {err}");
            }
        }
        Err(UnmountError::NotMounted(_)) => {}
        Err(err) => error!("unmount failed: {err}; flushing and exiting anyway"),
    }
}

/// fuser's own handle on the mount. When a session ends, fuser unmounts the mountpoint again
/// (its "still mounted?" check answers yes even after an unmount), which would hit a *new*
/// mount made there in the meantime. So once our own unmount has succeeded, the handle is
/// used up at once, while nothing else can have been mounted there yet; its attempt then
/// fails harmlessly (EINVAL) and the session's end has nothing left to unmount.
type FuserMount = Arc<Mutex<SessionUnmounter>>;

/// Who unmounts this process's mount.
#[derive(Clone)]
enum Unmounter {
    /// This process mounted: it unmounts with [`mounts::unmount`], then uses fuser's handle up.
    Fuser(FuserMount),
    /// A worker: the node daemon mounted as root, and unmounts when asked.
    NodeDaemon(SupervisorUnmount),
}

/// Unmounts with [`mounts::unmount`] (whose busy refusal can be retried, unlike fuser's
/// one-shot unmounter), or through the node daemon, on a blocking thread.
async fn unmount_blocking(
    mountpoint: &Path,
    lazy: bool,
    unmounter: &Unmounter,
) -> Result<mounts::UnmountMethod, UnmountError> {
    let path = mountpoint.to_path_buf();
    let unmounter = unmounter.clone();
    let task = tokio::task::spawn_blocking(move || match unmounter {
        Unmounter::NodeDaemon(unmount) => unmount(lazy),
        Unmounter::Fuser(fuser_mount) => {
            let method = mounts::unmount(&path, lazy)?;
            let mut unmounter = fuser_mount.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(err) = unmounter.unmount() {
                debug!("fuser's own unmount after ours: {err} (expected)");
            }
            Ok(method)
        }
    });
    match task.await {
        Ok(result) => result,
        Err(join) => Err(UnmountError::Failed {
            path: mountpoint.to_path_buf(),
            message: format!("unmount task failed: {join}"),
        }),
    }
}

fn flatten_session_result(ended: Result<io::Result<()>, oneshot::error::RecvError>) -> Result<(), String> {
    match ended {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(format!("the FUSE session ended with an error: {err}")),
        Err(_) => Err("the FUSE session thread panicked".into()),
    }
}

/// How long a session normally takes to end after a (non-lazy) unmount; waiting this long
/// before the first flush makes the common case a single flush.
const SESSION_END_GRACE: Duration = Duration::from_secs(2);

/// After the unmount: make everything durable, close the session and say how it went, all
/// within `config.flush_timeout`.
///
/// A normal unmount ends the FUSE session at once, and one flush follows. A lazily detached
/// mount may still have open files: then what they wrote so far is flushed first, the FUSE
/// session's end is awaited (until the deadline) and a final flush catches the rest.
async fn finish(
    session: &Session,
    config: &MountConfig,
    mountpoint: &Path,
    fuse_ended: Option<Result<(), String>>,
    mut fuse_done: oneshot::Receiver<io::Result<()>>,
) -> UnmountReport {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + config.flush_timeout;
    let timeout_secs = config.flush_timeout.as_secs_f64();
    let flush = || async {
        session.flush(deadline).await.map_err(|e| (format!("{e} (--flush-timeout {timeout_secs} s)"), Some(e.kind())))
    };

    let mut fuse = fuse_ended;
    if fuse.is_none() {
        let grace = SESSION_END_GRACE.min(config.flush_timeout);
        if let Ok(ended) = tokio::time::timeout(grace, &mut fuse_done).await {
            fuse = Some(flatten_session_result(ended));
        }
    }
    let mut flushed = flush().await;
    let fuse = match fuse {
        Some(result) => result.map_err(|e| (e, None)),
        None => {
            info!("files are still open on the detached mount; waiting for them to be closed");
            match tokio::time::timeout_at(deadline, fuse_done).await {
                Ok(ended) => {
                    flushed = flush().await;
                    flatten_session_result(ended).map_err(|e| (e, None))
                }
                Err(_) => Err((
                    format!(
                        "files were still open on the lazily detached mount when the {timeout_secs} s \
                         flush timeout expired: what they wrote before the flush is safe, later \
                         writes are lost"
                    ),
                    Some(ErrorKind::Unavailable),
                )),
            }
        }
    };
    // Local data is flushed and uploaded; now the metadata that finds it.
    let closed = session.close(deadline).await.map_err(|e| (e.to_string(), Some(e.kind())));

    let flush_millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let errors = [fuse, flushed, closed].into_iter().filter_map(Result::err).collect();
    let report = UnmountReport::new(mountpoint, flush_millis, timeout_secs, errors);
    match &report.flush_error {
        None => info!("flushed everything for {} in {flush_millis} ms", mountpoint.display()),
        Some(message) => error!("flush of {} incomplete after {flush_millis} ms: {message}", mountpoint.display()),
    }
    report
}

/// What the control socket reports about this mount.
pub(crate) struct Served {
    session: Arc<Session>,
    config: MountConfig,
    mountpoint: PathBuf,
    socket: PathBuf,
    started: Instant,
    started_at_unix: u64,
    fuse_stats: Option<Arc<FuseStats>>,
}

impl Served {
    pub(crate) fn new(
        session: Arc<Session>,
        config: MountConfig,
        mountpoint: PathBuf,
        socket: PathBuf,
        fuse_stats: Option<Arc<FuseStats>>,
    ) -> Served {
        let started_at_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Served { session, config, mountpoint, socket, started: Instant::now(), started_at_unix, fuse_stats }
    }
}

impl ControlHandler for Served {
    fn sync(&self, message: Option<String>, timeout: Duration) -> Result<SyncReport, Reported> {
        // Messages (and the flag that fixes them) as every command's errors get them.
        let synced = self.session.sync(message, timeout).map_err(|e| match e {
            SessionError::ReadOnly => Reported::new(e.kind(), "this mount is read-only: it takes no snapshots"),
            SessionError::NoStore | SessionError::NotUploaded { .. } => Reported::of(&e.into()),
            e => Reported::of(&anyhow::Error::new(e).context("committing the snapshot")),
        })?;
        Ok(SyncReport {
            snapshot: synced.snapshot,
            seq: synced.report.seq,
            entries: synced.report.entries,
            parts: synced.report.parts,
            parts_uploaded: synced.report.parts_uploaded,
            metadata_bytes: synced.report.bytes_uploaded,
            data_bytes: synced.data_bytes,
            millis: synced.took.as_millis() as u64,
            history_error: synced.history.as_ref().and_then(|h| h.as_ref().err()).map(|e| e.to_string()),
            history: synced.history.and_then(Result::ok),
        })
    }

    fn flush(&self, timeout: Duration) -> FlushReport {
        let start = Instant::now();
        let result = self.session.flush_to_store(timeout);
        let cold = self.session.status().vfs.cold;
        let report = FlushReport {
            flushed: result.is_ok(),
            kind: result.as_ref().err().map(|e| e.kind().name().to_string()),
            error: result.err().map(|e| e.to_string()),
            dirty_bytes: cold.as_ref().map_or(0, |c| c.dirty_bytes),
            dirty_files: cold.as_ref().map_or(0, |c| c.dirty_files),
            millis: start.elapsed().as_millis() as u64,
        };
        match &report.error {
            None => info!("flushed on request in {} ms", report.millis),
            Some(e) => warn!("a flush on request did not complete: {e}"),
        }
        report
    }

    fn history(&self, op: HistoryOp) -> Result<HistoryAnswer, Reported> {
        let answer = self.session.history(|h, vfs| {
            Ok(match op {
                HistoryOp::Log { path, limit } => HistoryAnswer::Log(h.log(path.as_deref(), limit)?),
                HistoryOp::Show { rev, path } => HistoryAnswer::Show(h.show(&rev, &path)?),
                HistoryOp::Diff { from, to, paths } => {
                    HistoryAnswer::Diff(h.diff(vfs, &from, to.as_deref(), &paths)?)
                }
                HistoryOp::Bundle => HistoryAnswer::Bundle(h.bundle(vfs)?),
            })
        });
        answer.map_err(|e| Reported::new(e.kind(), e.to_string()))
    }

    fn pong(&self) -> Pong {
        Pong {
            pid: std::process::id(),
            version: VERSION.to_owned(),
            mountpoint: self.mountpoint.clone(),
            data_dir: self.config.data_dir.clone(),
            watch: self.config.watch,
            // Metered: exactly the node daemon's mounts.
            node: self.config.metered,
        }
    }

    fn status(&self) -> StatusReport {
        let status = self.session.status();
        let stats = status.vfs;
        StatusReport {
            version: VERSION.to_owned(),
            pid: std::process::id(),
            mountpoint: self.mountpoint.clone(),
            data_dir: stats.data_dir,
            socket: self.socket.clone(),
            started_at_unix: self.started_at_unix,
            uptime_secs: self.started.elapsed().as_secs(),
            inodes: stats.inodes,
            open_files: stats.open_files,
            data_bytes: stats.data_bytes,
            cache_size: stats.cache_size,
            meta_commits: stats.meta_commits,
            disk_free: stats.disk_free,
            reserve: stats.reserve,
            store: self.config.store.clone(),
            cold: stats.cold,
            remote: status.remote,
            backends: status.backends,
            pending_repairs: status.pending_repairs,
            allow_other: self.config.allow_other,
            owner: self.config.owner,
            read_only: self.config.read_only,
            writeback_cache: self.config.writeback_cache,
            cache_encrypted: self.config.encrypt_cache,
            passthrough: Some(stats.passthrough),
            watch: None,
            fuse_ops: self.fuse_stats.as_ref().map(|s| s.snapshot()).unwrap_or_default(),
            follow: status.follow.map(Into::into),
            summary: crate::control::StatusSummary::default(),
        }
    }
}

/// Widens the kernel's readahead window of the mount to `kib` KiB (0: leaves it), now that the
/// session serves. A failure costs speed only, so it is logged and serving goes on: without
/// root the window stays at the kernel's 128 KiB.
pub(crate) fn set_read_ahead(mountpoint: &Path, kib: u32) {
    if kib == 0 {
        return;
    }
    match tierfs_mount::set_read_ahead(mountpoint, kib) {
        Ok(before) => info!(before_kib = before, kib, "kernel readahead window set"),
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => info!(
            "kernel readahead window left at the kernel's: setting it needs root ({err}); \
             mmapped files fault in 128 KiB at a time"
        ),
        Err(err) => warn!("could not set the kernel readahead window to {kib} KiB: {err}"),
    }
}

/// The control socket file, removed when serving ends however it ends, but only if it is
/// still the file we created (a new daemon for the same mountpoint may have replaced it).
pub(crate) struct SocketFile {
    pub(crate) path: PathBuf,
    identity: (u64, u64),
}

impl SocketFile {
    fn new(path: PathBuf) -> Result<SocketFile> {
        let meta = fs::symlink_metadata(&path).with_context(|| format!("reading control socket {}", path.display()))?;
        Ok(SocketFile { identity: (meta.dev(), meta.ino()), path })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours =
            fs::symlink_metadata(&self.path).map(|meta| (meta.dev(), meta.ino()) == self.identity).unwrap_or(false);
        if ours {
            if let Err(err) = fs::remove_file(&self.path) {
                warn!("removing control socket {}: {err}", self.path.display());
            }
        }
    }
}
