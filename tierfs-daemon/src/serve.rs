//! Serving one mount from start to finish: check the mountpoint, open the [`Vfs`], bind the
//! control socket, mount, report readiness, then wait for SIGTERM/SIGINT, an `unmount`
//! request or an external unmount, and shut down with a bounded, reported flush.
//!
//! Invariants:
//! - Everything that can fail is checked *before* readiness is reported: a caller told
//!   "ready" has a working mount and a control socket that answers.
//! - Shutdown order is unmount → `Vfs::sync_all` → (if files are still open on a lazily
//!   detached mount) wait for the FUSE session to end → `Vfs::sync_all` again. The unmount
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
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use tierfs::remote::{Committer, RemoteError, Workspace};
use tierfs::store::{Fencing, Store};
use tierfs::tier::ColdConfig;
use tierfs::vfs::{AttachedStore, Vfs, VfsConfig};
use tierfs_mount::SessionUnmounter;
use tokio::runtime::Runtime;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::config::{MountConfig, StreamLimit, holder_name};
use crate::control::{self, ControlHandler, Pong, StatusReport, SyncReport, UnmountReport, UnmountRequest};
use crate::launch::{Readiness, ReadyInfo};
use crate::mounts::{self, UnmountError};
use crate::paths;

/// The version reported over the control socket.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How often copies that a backend missed are retried while mounted (and how long the last
/// try at unmount may take).
const REPAIR_INTERVAL: Duration = Duration::from_secs(5);

/// A node that vanishes keeps its workspace's lease this long (others wait or --takeover).
const LEASE_TTL: Duration = Duration::from_secs(30);

/// With `--fsync=remote`, how long fsync waits for the store before failing with EIO.
const FSYNC_REMOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a control client that asked for the unmount gets to read the answer before
/// the process exits anyway.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// Serves the mount described by `config` until it is unmounted. Returns an error when
/// the mount could not be set up, or when the final flush did not complete.
pub fn run(rt: &Runtime, config: &MountConfig, readiness: &mut Readiness) -> Result<()> {
    // Everything fallible, including the tokio listener and signal handlers, is set up before
    // the mount, so an error never leaves a mount behind.
    let _rt_context = rt.enter();
    let mountpoint = prepare_mountpoint(config)?;
    mounts::check_fuse_device()?;

    let opened = match &config.store {
        Some(file) => Some(Arc::new(crate::store_link::open_store(rt.handle(), file)?.0)),
        None => None,
    };
    // Before anything may clear the data dir (a snapshot mount, an outdated copy).
    let repair_log = opened.as_ref().map(|store| Arc::new(crate::store_link::RepairLog::load(&config.data_dir, store)));
    let store = opened.as_ref().map(|store| {
        let blocks = crate::store_link::StoreBlocks { store: store.clone(), handle: rt.handle().clone() };
        let mut cold = ColdConfig::new(config.cache_size);
        if let Some(limit) = config.dirty_limit {
            cold.max_dirty = limit.max(2 * tierfs::block::CHUNK_SIZE);
        }
        cold.seal_after = config.dirty_age;
        match config.stream_above {
            Some(StreamLimit::Off) => cold.stream_above = None,
            Some(StreamLimit::Above(size)) => cold.stream_above = Some(size),
            None => {}
        }
        AttachedStore { store: Arc::new(blocks), config: cold }
    });
    let data_dir_context = || format!("opening data directory {}", config.data_dir.display());
    if config.snapshot.is_some() {
        reset_snapshot_dir(&config.data_dir)?;
    }
    let mut prepared = Vfs::prepare(&config.data_dir).with_context(data_dir_context)?;
    // Whether the metadata was just read from the store for a read-only mount.
    let mut restored = false;
    if let (true, None, Some(store)) = (config.read_only, &config.snapshot, &opened) {
        // A read-only mount takes no lease and writes nothing; on a node with nothing local
        // it shows the workspace's latest state.
        if prepared.meta().is_empty().with_context(data_dir_context)? {
            let ws = Workspace::new(store.clone(), &config.workspace);
            let state = rt.block_on(ws.restore(prepared.meta())).context("restoring the workspace read-only")?;
            info!(
                remote_seq = state.remote_seq,
                entries = state.entries,
                "latest state restored for a read-only mount"
            );
            restored = true;
        }
    }
    if let (Some(id), Some(store)) = (&config.snapshot, &opened) {
        let ws = Workspace::new(store.clone(), &config.workspace);
        let m = rt
            .block_on(ws.restore_snapshot(prepared.meta(), id))
            .with_context(|| format!("restoring snapshot {id}"))?;
        info!(snapshot = %id, entries = m.entries, "snapshot restored for a read-only mount");
        restored = true;
    }
    if restored {
        // Shown as a mount on a new node would show it: data that was never stored is cut off.
        prepared.meta().cut_to_stored_data().with_context(data_dir_context)?;
    }
    // The workspace's metadata in the store: restored into an empty data dir, checked against
    // a used one, and journaled from here on. Read-only mounts take no lease and write nothing.
    let committer = match &opened {
        Some(store) if !config.read_only => match open_remote(rt, store, config, prepared.meta()) {
            Ok(c) => Some(c),
            Err(e) if is_stale_local(&e) => {
                // Another node wrote the workspace since, and everything this node wrote is in
                // the store: its copy is only an outdated cache. Drop it and restore.
                warn!("{e:#}; dropping this node's outdated copy and restoring the store's state");
                drop(prepared);
                clear_data_dir(&config.data_dir)?;
                prepared = Vfs::prepare(&config.data_dir).with_context(data_dir_context)?;
                Some(open_remote(rt, store, config, prepared.meta())?)
            }
            Err(e) => return Err(e),
        },
        _ => None,
    };
    let vfs = Vfs::from_prepared(
        VfsConfig {
            data_dir: config.data_dir.clone(),
            kernel_owns_times: config.writeback_cache,
            cache_size: config.cache_size,
            store,
            fsync_remote: (committer.is_some() && config.fsync_remote).then_some(FSYNC_REMOTE_TIMEOUT),
            reserve: config.reserve,
        },
        prepared,
    )
    .with_context(data_dir_context)?;
    let vfs = Arc::new(vfs);

    let (listener, socket_guard) = bind_control_socket(config, &mountpoint)?;
    let socket = socket_guard.path.clone();
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;

    let mut session = tierfs_mount::session(vfs.clone(), &mountpoint, &config.mount_options())
        .map_err(|err| explain_mount_error(err, config, &mountpoint))?;
    let fuser_mount: FuserMount = Arc::new(Mutex::new(session.unmount_callable()));
    let (session_tx, session_done) = oneshot::channel();
    let session_thread = std::thread::Builder::new().name("tierfs-session".into()).spawn(move || {
        let result = session.run();
        let _ = session_tx.send(result);
    });
    let session_thread = match session_thread {
        Ok(thread) => thread,
        Err(err) => {
            // The session (and with it the mount) was moved into the closure and dropped.
            return Err(anyhow::Error::new(err).context("starting the FUSE session thread"));
        }
    };

    let started = Instant::now();
    let started_at_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let handler = Arc::new(Served {
        vfs: vfs.clone(),
        config: config.clone(),
        mountpoint: mountpoint.clone(),
        socket: socket.clone(),
        started,
        started_at_unix,
        committer: committer.clone(),
        store: opened.clone(),
        rt: rt.handle().clone(),
    });
    let info = ReadyInfo {
        pid: std::process::id(),
        mountpoint: mountpoint.clone(),
        data_dir: config.data_dir.clone(),
        socket: socket.clone(),
        log: None,
    };

    let report = rt.block_on(async {
        let (unmount_tx, mut unmount_rx) = mpsc::channel::<UnmountRequest>(4);
        let server = tokio::spawn(control::serve(listener, handler, unmount_tx));
        // Copies a backend could not take when they were written (it was down) are retried
        // until they are in; what is left is saved for the next mount (`tierfs scrub` covers
        // the last seconds before a crash).
        let repairer = opened.clone().zip(repair_log.clone()).map(|(store, log)| {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(REPAIR_INTERVAL).await;
                    store.run_repairs().await;
                    log.save(&store);
                }
            })
        });

        let (stop_remote, stop_rx) = tokio::sync::watch::channel(false);
        let remote_task = committer.clone().map(|c| tokio::spawn(c.run(stop_rx)));

        readiness.ready(&info);
        info!(
            mountpoint = %mountpoint.display(),
            data_dir = %config.data_dir.display(),
            socket = %socket.display(),
            pid = info.pid,
            "tierfs {VERSION} serving"
        );
        if !config.read_only {
            spawn_sweep(vfs.clone());
        }

        let mut session_done = session_done;
        let mut session_ended = None;
        let mut requester = None;
        loop {
            tokio::select! {
                _ = sigterm.recv() => {
                    signal_unmount(&mountpoint, "SIGTERM", &fuser_mount, config.flush_timeout).await;
                    break;
                }
                _ = sigint.recv() => {
                    signal_unmount(&mountpoint, "SIGINT", &fuser_mount, config.flush_timeout).await;
                    break;
                }
                ended = &mut session_done => {
                    info!("{} was unmounted from outside (umount or fusermount -u)", mountpoint.display());
                    session_ended = Some(flatten_session_result(ended));
                    break;
                }
                Some(request) = unmount_rx.recv() => {
                    info!(lazy = request.lazy, "unmount requested over the control socket");
                    match unmount_blocking(&mountpoint, request.lazy, &fuser_mount).await {
                        Ok(method) => {
                            info!("unmounted {} ({method})", mountpoint.display());
                            requester = Some(request);
                            break;
                        }
                        Err(err) => {
                            warn!("refusing unmount: {err}");
                            let _ = request.reply.send(Err(err.to_string()));
                        }
                    }
                }
            }
        }

        let mut report = finish(&vfs, config, &mountpoint, session_ended, session_done).await;
        if let Some(c) = &committer {
            // Local data is flushed and uploaded; now the metadata that finds it.
            if let Err(message) = drain_remote(c, &vfs, config.flush_timeout).await {
                error!("{message}");
                report.flushed = false;
                report.flush_error =
                    Some(report.flush_error.take().map_or(message.clone(), |m| format!("{m}; {message}")));
            }
        }
        let _ = stop_remote.send(true);
        if let Some(task) = remote_task {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        if let Some(repairer) = repairer {
            repairer.abort();
        }
        if let Some(store) = &opened {
            let pending = match tokio::time::timeout(REPAIR_INTERVAL, store.run_repairs()).await {
                Ok(pending) => pending,
                Err(_) => store.backend().pending_repairs(),
            };
            if let Some(log) = &repair_log {
                log.save(store);
            }
            if pending > 0 {
                warn!(
                    "{pending} copies could not be repaired before exit (a backend is still down); the \
                     next mount of this data dir retries them (or run `tierfs scrub --repair` once it is back)"
                );
            }
        }
        if let Some(request) = requester {
            let _ = request.reply.send(Ok(report.clone()));
            let _ = tokio::time::timeout(ANSWER_GRACE, request.written).await;
        }
        server.abort();
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
        Err(anyhow!("{}", report.flush_error.unwrap_or_else(|| "the final flush did not complete".into())))
    }
}

/// A snapshot mount's data dir holds nothing but a cache of the snapshot: it is emptied
/// before each such mount. A directory that is not one (no marker) is refused, never wiped.
fn reset_snapshot_dir(dir: &Path) -> Result<()> {
    const MARKER: &str = ".tierfs-snapshot-cache";
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut entries = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let foreign = entries.any(|e| e.is_ok_and(|e| e.file_name() != DAEMON_LOG && e.file_name() != MARKER));
    if foreign && !dir.join(MARKER).exists() {
        bail!(
            "data dir {} is not empty and is not a snapshot cache; give a snapshot mount its own --data-dir",
            dir.display()
        );
    }
    clear_data_dir(dir)?;
    fs::write(dir.join(MARKER), b"tierfs: a read-only snapshot's cache, rebuilt at every mount\n")
        .with_context(|| format!("marking {}", dir.display()))?;
    Ok(())
}

fn is_stale_local(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref::<RemoteError>(), Some(RemoteError::StaleLocal { .. })))
}

/// The daemon's own log in the data dir (open while it serves): never removed.
const DAEMON_LOG: &str = "daemon.log";

/// Removes this node's copy of a workspace (metadata and cached data), keeping the log.
fn clear_data_dir(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        if e.file_name() == DAEMON_LOG {
            continue;
        }
        let path = e.path();
        let removed =
            if e.file_type().is_ok_and(|t| t.is_dir()) { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        removed.with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// Takes the workspace's lease and brings the local metadata in line with the store.
fn open_remote(
    rt: &Runtime,
    store: &Arc<Store>,
    config: &MountConfig,
    meta: &Arc<tierfs::meta::MetaStore>,
) -> Result<Arc<Committer>> {
    let ws = Arc::new(Workspace::new(store.clone(), &config.workspace));
    rt.block_on(async {
        match store.config().fencing {
            Fencing::Conditional => store.backend().check_conditional_create().await.context(
                "the store cannot fence concurrent writers (for servers that ignore conditional writes, such as \
                 Garage 2.x, set `fencing = \"lease\"` in the store file, or create it with `tierfs init \
                 --fencing lease`: see docs/SEMANTICS.md, \"Surviving a runtime reset\")",
            )?,
            Fencing::Lease => info!(
                "workspace {:?} is fenced by its lease only (fencing = \"lease\"): a takeover waits out the \
                 holder's lease",
                config.workspace
            ),
        }
        let started = Instant::now();
        let lease = ws.lease(&holder_name(), LEASE_TTL);
        let (committer, state) = Committer::open(ws.clone(), meta.clone(), lease, config.takeover)
            .await
            .with_context(|| format!("opening workspace {:?} of the store", config.workspace))?;
        info!(
            workspace = %config.workspace,
            remote_seq = state.remote_seq,
            segments = state.segments,
            entries = state.entries,
            millis = started.elapsed().as_millis() as u64,
            "workspace metadata in line with the store"
        );
        Ok(committer)
    })
}

/// At unmount: waits until every metadata change is in the store, writes a checkpoint (so
/// the next restore reads one object set instead of a long journal) and releases the lease.
async fn drain_remote(c: &Arc<Committer>, vfs: &Arc<Vfs>, timeout: Duration) -> Result<(), String> {
    let meta = vfs.meta().clone();
    let last = meta.journal().last_seq();
    let waited = tokio::task::spawn_blocking(move || meta.journal().wait_durable(last, timeout)).await;
    match waited {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => return Err(format!("metadata not in the store at unmount: {reason}")),
        Err(e) => return Err(format!("waiting for the store: {e}")),
    }
    match tokio::time::timeout(timeout, c.checkpoint(None)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn!("final checkpoint: {e} (the journal has everything; restore replays it)"),
        Err(_) => warn!("final checkpoint did not finish in time (the journal has everything)"),
    }
    if let Err(e) = c.release().await {
        warn!("releasing the workspace lease: {e} (it expires on its own)");
    }
    Ok(())
}

/// Makes sure `config.mountpoint` is a directory we may mount on, creating it if missing,
/// and returns its canonical path.
fn prepare_mountpoint(config: &MountConfig) -> Result<PathBuf> {
    let path = &config.mountpoint;
    match fs::metadata(path) {
        Ok(meta) if !meta.is_dir() => bail!("mountpoint {} is not a directory", path.display()),
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
        bail!(
            "{} is already a mount point ({} from {}); unmount it first (`tierfs umount {}`)",
            canonical.display(),
            entry.fs_type,
            entry.source,
            canonical.display()
        );
    }
    if !config.nonempty {
        let mut entries =
            fs::read_dir(&canonical).with_context(|| format!("reading mountpoint {}", canonical.display()))?;
        if entries.next().is_some() {
            bail!(
                "mountpoint {} is not empty; its files would be hidden while mounted. Move them \
                 away, pick an empty directory, or pass --nonempty",
                canonical.display()
            );
        }
    }
    Ok(canonical)
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
        _ => bail!(
            "mountpoint {} is not accessible (transport endpoint is not connected): a stale \
             FUSE mount of another filesystem; unmount it first (`fusermount3 -u {}`)",
            path.display(),
            path.display()
        ),
    }
}

/// Binds the mount's control socket owner-only, replacing a socket file left behind by a
/// dead process but never one that still answers.
fn bind_control_socket(config: &MountConfig, mountpoint: &Path) -> Result<(tokio::net::UnixListener, SocketFile)> {
    paths::ensure_private_dir(&config.runtime_dir)?;
    let socket = paths::socket_path(&config.runtime_dir, mountpoint)?;
    if fs::symlink_metadata(&socket).is_ok() {
        if let Ok(Some(pong)) = control::ping(&socket, Duration::from_secs(2)) {
            bail!(
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
    fs::set_permissions(&guard.path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} owner-only", guard.path.display()))?;
    listener.set_nonblocking(true).context("configuring the control socket")?;
    let listener = tokio::net::UnixListener::from_std(listener).context("registering the control socket")?;
    Ok((listener, guard))
}

/// Adds what a user needs to fix a failed mount.
fn explain_mount_error(err: io::Error, config: &MountConfig, mountpoint: &Path) -> anyhow::Error {
    let hint = if err.kind() == io::ErrorKind::PermissionDenied && !mounts::is_root() {
        if config.allow_other {
            " (allow_other needs `user_allow_other` in /etc/fuse.conf; or mount with \
             --no-allow-other)"
        } else {
            " (non-root mounts need the setuid fusermount3 helper from the fuse3 package)"
        }
    } else {
        ""
    };
    anyhow::Error::new(err).context(format!("mounting FUSE filesystem at {}{hint}", mountpoint.display()))
}

/// Unmount on a signal: the process is asked to go away, so a busy mount is detached
/// lazily rather than kept.
async fn signal_unmount(mountpoint: &Path, signal: &str, fuser_mount: &FuserMount, flush_timeout: Duration) {
    info!("{signal} received: unmounting {}", mountpoint.display());
    match unmount_blocking(mountpoint, false, fuser_mount).await {
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
            if let Err(err) = unmount_blocking(mountpoint, true, fuser_mount).await {
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

/// Unmounts with [`mounts::unmount`] (whose busy refusal can be retried, unlike fuser's
/// one-shot unmounter) on a blocking thread.
async fn unmount_blocking(
    mountpoint: &Path,
    lazy: bool,
    fuser_mount: &FuserMount,
) -> Result<mounts::UnmountMethod, UnmountError> {
    let path = mountpoint.to_path_buf();
    let fuser_mount = fuser_mount.clone();
    let task = tokio::task::spawn_blocking(move || {
        let method = mounts::unmount(&path, lazy)?;
        let mut unmounter = fuser_mount.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(err) = unmounter.unmount() {
            debug!("fuser's own unmount after ours: {err} (expected)");
        }
        Ok(method)
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

/// After the unmount: make everything durable and say how it went, all within
/// `config.flush_timeout`.
///
/// A normal unmount ends the FUSE session at once, and one `sync_all` follows. A lazily
/// detached mount may still have open files: then what they wrote so far is flushed first,
/// the session's end is awaited (until the deadline) and a final flush catches the rest.
async fn finish(
    vfs: &Arc<Vfs>,
    config: &MountConfig,
    mountpoint: &Path,
    session_ended: Option<Result<(), String>>,
    mut session_done: oneshot::Receiver<io::Result<()>>,
) -> UnmountReport {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + config.flush_timeout;
    let timeout_secs = config.flush_timeout.as_secs_f64();

    let mut session = session_ended;
    if session.is_none() {
        let grace = SESSION_END_GRACE.min(config.flush_timeout);
        if let Ok(ended) = tokio::time::timeout(grace, &mut session_done).await {
            session = Some(flatten_session_result(ended));
        }
    }
    let mut sync = sync_all_until(vfs, deadline, timeout_secs).await;
    let session = match session {
        Some(result) => result,
        None => {
            info!("files are still open on the detached mount; waiting for them to be closed");
            match tokio::time::timeout_at(deadline, session_done).await {
                Ok(ended) => {
                    sync = sync_all_until(vfs, deadline, timeout_secs).await;
                    flatten_session_result(ended)
                }
                Err(_) => Err(format!(
                    "files were still open on the lazily detached mount when the {timeout_secs} s \
                     flush timeout expired: what they wrote before the flush is safe, later \
                     writes are lost"
                )),
            }
        }
    };

    let flush_millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let flush_error = match (session, sync) {
        (Ok(()), Ok(())) => None,
        (Err(a), Ok(())) => Some(a),
        (Ok(()), Err(b)) => Some(b),
        (Err(a), Err(b)) => Some(format!("{a}; {b}")),
    };
    match &flush_error {
        None => info!("flushed everything for {} in {flush_millis} ms", mountpoint.display()),
        Some(message) => error!("flush of {} incomplete after {flush_millis} ms: {message}", mountpoint.display()),
    }
    UnmountReport {
        mountpoint: mountpoint.to_path_buf(),
        flushed: flush_error.is_none(),
        flush_millis,
        flush_timeout_secs: timeout_secs,
        flush_error,
    }
}

/// `Vfs::sync_all` on its own thread, waited for until `deadline`. A thread rather than
/// `spawn_blocking`, so a flush stuck past the deadline never holds up the runtime's
/// shutdown: the process exits and reports it.
async fn sync_all_until(vfs: &Arc<Vfs>, deadline: tokio::time::Instant, timeout_secs: f64) -> Result<(), String> {
    let (tx, rx) = oneshot::channel();
    let sync_vfs = vfs.clone();
    let spawned = std::thread::Builder::new().name("tierfs-flush".into()).spawn(move || {
        // Everything written goes to the store first (when one is attached), then to disk.
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let result = match sync_vfs.flush_to_store(remaining) {
            Ok(()) => sync_vfs.sync_all().map_err(|e| format!("flushing to local disk failed: {e}")),
            Err(dirty) => Err(format!(
                "{dirty} bytes were not yet uploaded to the store when the {timeout_secs} s flush timeout \
                 expired (they are safe on local disk and are uploaded at the next mount)"
            )),
        };
        // Drop this thread's reference before reporting, so the serving thread holds the last
        // one and closes RocksDB in order: a reference left here could be the last at
        // process exit, and RocksDB torn down during exit() aborts.
        drop(sync_vfs);
        let _ = tx.send(result);
    });
    if let Err(err) = spawned {
        return Err(format!("starting the flush thread: {err}"));
    }
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(err))) => Err(err),
        Ok(Err(_)) => Err("the flush thread panicked".into()),
        Err(_) => Err(format!("flushing did not finish within the {timeout_secs} s flush timeout")),
    }
}

/// What the control socket reports about this mount.
struct Served {
    vfs: Arc<Vfs>,
    config: MountConfig,
    mountpoint: PathBuf,
    socket: PathBuf,
    started: Instant,
    started_at_unix: u64,
    committer: Option<Arc<Committer>>,
    store: Option<Arc<Store>>,
    rt: tokio::runtime::Handle,
}

impl ControlHandler for Served {
    fn sync(&self, message: Option<String>, timeout: Duration) -> Result<SyncReport, String> {
        let Some(c) = &self.committer else {
            return Err(if self.config.store.is_none() {
                "this mount has no store (mount with --store FILE): there is nothing to sync to".into()
            } else {
                "this mount is read-only: it takes no snapshots".into()
            });
        };
        let start = Instant::now();
        let before = self.vfs.stats().cold.map_or(0, |s| s.uploaded_bytes);
        self.vfs.flush_to_store(timeout).map_err(|dirty| {
            format!("{dirty} bytes could not be uploaded within {} s; nothing was committed", timeout.as_secs())
        })?;
        let after = self.vfs.stats().cold.map_or(0, |s| s.uploaded_bytes);
        let (manifest, report) = self
            .rt
            .block_on(async {
                c.confirm_lease().await?;
                c.checkpoint(Some(message)).await
            })
            .map_err(|e| format!("committing the snapshot: {e}"))?;
        Ok(SyncReport {
            snapshot: manifest.id.unwrap_or_default(),
            seq: manifest.seq,
            entries: report.entries,
            parts: report.parts,
            parts_uploaded: report.parts_uploaded,
            metadata_bytes: report.bytes_uploaded,
            data_bytes: after.saturating_sub(before),
            millis: start.elapsed().as_millis() as u64,
        })
    }

    fn pong(&self) -> Pong {
        Pong {
            pid: std::process::id(),
            version: VERSION.to_owned(),
            mountpoint: self.mountpoint.clone(),
            data_dir: self.config.data_dir.clone(),
        }
    }

    fn status(&self) -> StatusReport {
        let stats = self.vfs.stats();
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
            disk_free: stats.disk_free,
            reserve: stats.reserve,
            store: self.config.store.clone(),
            cold: stats.cold,
            remote: self.committer.as_ref().map(|c| c.stats()),
            backends: self.store.as_ref().map(|s| s.backend().health()).unwrap_or_default(),
            pending_repairs: self.store.as_ref().map_or(0, |s| s.backend().pending_repairs() as u64),
            allow_other: self.config.allow_other,
            read_only: self.config.read_only,
            writeback_cache: self.config.writeback_cache,
        }
    }
}

/// The control socket file, removed when serving ends however it ends, but only if it is
/// still the file we created (a new daemon for the same mountpoint may have replaced it).
struct SocketFile {
    path: PathBuf,
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

/// Removes, in the background, data files that a crash left behind after their inode was
/// deleted (`Vfs::sweep_leftover_data_files`); one walk of the data dir per mount.
fn spawn_sweep(vfs: Arc<Vfs>) {
    let spawned = std::thread::Builder::new().name("tierfs-sweep".into()).spawn(move || {
        let started = std::time::Instant::now();
        match vfs.sweep_leftover_data_files() {
            Ok(0) => tracing::debug!(millis = started.elapsed().as_millis(), "no leftover data files"),
            Ok(n) => info!(
                millis = started.elapsed().as_millis(),
                "removed {n} data files left behind by a crash (their files were already deleted)"
            ),
            Err(e) => warn!("sweeping leftover data files: {e}"),
        }
    });
    if let Err(e) = spawned {
        warn!("cannot start the sweep of leftover data files: {e}");
    }
}
