//! The node daemon: one `tierfs-daemon node` process per GPU node serving every mount (and
//! watched directory) of its configuration file, `/etc/tierfs/config.toml` by default, with
//! Prometheus metrics and systemd readiness.
//!
//! The file has a `[node]` table and one `[[mount]]` table per mount. A mount's keys are the
//! options of `tierfs mount`, written with `_` for `-` (`cache_size = "10G"`, `read_only =
//! true`), plus `mountpoint` and `owner`; they deserialize (serde) into the same `MountArgs`
//! the command line fills, so a key means in the file what its flag means on the command
//! line, defaults included, and an unknown key is an error naming it and its line.
//!
//! Invariants:
//! - Every mount is served by its own thread with its own session, data dir lock and control
//!   socket: one mount failing to start (its store unreachable, its disk full) or failing
//!   later is logged and reported in `/metrics`, and the others go on.
//! - READY=1 goes to systemd only once every mount has either come up or failed to; STATUS=
//!   says how many are live. A declared mount that failed to start, or failed while served
//!   (not an unmount), is started again after 1 s, doubling up to 60 s while it keeps
//!   failing (`tierfs_mount_restarts_total`). STOPPING=1 goes out on SIGTERM or SIGINT, which stops every
//!   mount at once; each flushes within its own `--flush-timeout`, so the unit's
//!   `TimeoutStopSec` must exceed the longest. The exit status is 1 when any mount failed
//!   to start or to flush, and the log names each.
//! - The metrics listener is bound before any mount starts: a taken port is an error while
//!   nothing is mounted. It is served by a thread and runtime of its own, so `/metrics` and
//!   `/healthz` answer however busy the mounts keep the node's runtime (a liveness probe
//!   that timed out behind a flush to a store that is away would get the node killed).
//!   The metrics hold each mount's handler weakly, so a mount's session ends on the mount's
//!   own thread: ending it joins workers that may wait on a store, which must never happen
//!   under the metrics' lock or in a scrape.
//! - While it runs, `tierfs mount` and `tierfs watch` hand their mounts to it over
//!   `node.sock` in its runtime directory ([`crate::handoff`]). The socket is bound before any
//!   mount starts and served once every declared mount has come up or failed; a handed-off
//!   mount is served like a declared one (its own thread, session and control socket), owned
//!   by its caller, started again like a declared one when it fails while served (a failure
//!   to start goes to its caller instead), and leaves the metrics once it is unmounted. A second node daemon on the
//!   same runtime directory is refused.

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, anyhow};
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Deserialize;
use tokio::io::BufReader as AsyncBufReader;
use tokio::net::UnixListener;
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, watch};
use tracing::{error, info, warn};

use crate::cli::{MountArgs, MountStore};
use crate::config::MountConfig;
use crate::handoff;
use crate::launch::{NodeReady, Readiness, ReadyMessage};
use crate::logging::{Reported, bail_with, failure};
use crate::metrics::{self, MountState, Registry};
use crate::notify::Notifier;
use crate::stop::Stop;
use tierfs::ErrorKind;

/// Control sockets of the node's mounts unless `[node] runtime_dir` says otherwise.
pub const DEFAULT_RUNTIME_DIR: &str = crate::paths::NODE_RUNTIME_DIR;

/// `/metrics` and `/healthz` unless `[node] metrics_addr` says otherwise: loopback only.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";

/// A node's configuration, every mount resolved as `tierfs mount` would resolve it.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub file: PathBuf,
    pub runtime_dir: PathBuf,
    /// `None`: no metrics endpoint (`metrics_addr = ""`).
    pub metrics_addr: Option<SocketAddr>,
    pub mounts: Vec<MountConfig>,
    /// The options of each mount as written, to create an embedded store like `tierfs mount`.
    args: Vec<MountArgs>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    #[serde(default)]
    node: NodeTable,
    #[serde(default)]
    mount: Vec<MountArgs>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeTable {
    runtime_dir: Option<PathBuf>,
    metrics_addr: Option<String>,
}

impl NodeConfig {
    /// Reads and checks `file`: syntax, every key of every mount, and that no two mounts share
    /// a mountpoint or a data dir.
    pub fn load(file: &Path) -> Result<NodeConfig> {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading the node configuration {}", file.display()))?;
        NodeConfig::parse(file, &text)
    }

    /// [`NodeConfig::load`] of `text`, read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<NodeConfig> {
        let at = file.display();
        let parsed: NodeFile = toml::from_str(text).map_err(|e| failure!(ErrorKind::InvalidInput, "{at}: {e}"))?;
        let runtime_dir = match parsed.node.runtime_dir {
            Some(dir) if dir.is_absolute() => dir,
            Some(dir) => bail_with!(
                ErrorKind::InvalidInput,
                "{at}: [node] runtime_dir {} must be an absolute path",
                dir.display()
            ),
            None => PathBuf::from(DEFAULT_RUNTIME_DIR),
        };
        let metrics_addr = match parsed.node.metrics_addr.as_deref().unwrap_or(DEFAULT_METRICS_ADDR) {
            "" => None,
            addr => Some(addr.parse().map_err(|e| {
                failure!(
                    ErrorKind::InvalidInput,
                    "{at}: [node] metrics_addr {addr:?} is not an address and port such as 127.0.0.1:9464 ({e})"
                )
            })?),
        };
        let mut mounts = Vec::new();
        let mut args = Vec::new();
        for (i, mount_args) in parsed.mount.into_iter().enumerate() {
            if mount_args.mountpoint.as_os_str().is_empty() {
                bail_with!(
                    ErrorKind::InvalidInput,
                    "{at}: mount {}: no mountpoint (`mountpoint = \"/mnt/NAME\"`)",
                    i + 1
                );
            }
            mount_args
                .check_conflicts()
                .with_context(|| format!("{at}: mount {} ({})", i + 1, mount_args.mountpoint.display()))?;
            let owner = mount_args.owner;
            let mut config = mount_args
                .resolve(Some(&runtime_dir))
                .with_context(|| format!("{at}: mount {} ({})", i + 1, mount_args.mountpoint.display()))?;
            // Every mount of the node has an owner (root by default), so that its socket is
            // reachable and a refusal is a message, not a bare EACCES.
            config.owner = Some(owner.unwrap_or(0));
            // A worker serves an owner's mount with the owner's rights: root's embedded store
            // and data dir under root's home are not theirs to reach.
            if owner.is_some_and(|uid| uid != 0) && matches!(mount_args.store_choice(), MountStore::Embedded { .. }) {
                bail_with!(
                    ErrorKind::InvalidInput,
                    "{at}: mount {} ({}): a mount with an owner needs `store` and `data_dir` (or `no_store = true` \
                     and `data_dir`): the embedded default store is root's",
                    i + 1,
                    mount_args.mountpoint.display()
                );
            }
            config.metered = true;
            mounts.push(config);
            args.push(mount_args);
        }
        let mut mountpoints = BTreeSet::new();
        let mut data_dirs = BTreeSet::new();
        for m in &mounts {
            if !mountpoints.insert(&m.mountpoint) {
                bail_with!(ErrorKind::InvalidInput, "{at}: two mounts on {}", m.mountpoint.display());
            }
            if !data_dirs.insert(&m.data_dir) {
                bail_with!(
                    ErrorKind::InvalidInput,
                    "{at}: two mounts share the data dir {}; give each its own data_dir",
                    m.data_dir.display()
                );
            }
        }
        Ok(NodeConfig { file: file.to_path_buf(), runtime_dir, metrics_addr, mounts, args })
    }
}

/// Serves every mount of `node` until SIGTERM or SIGINT (see the module documentation).
pub fn run(rt: &Runtime, node: &NodeConfig, notifier: &Notifier) -> Result<()> {
    let _rt_context = rt.enter();
    let mut stop = Stop::signals()?;
    crate::paths::ensure_runtime_dir(&node.runtime_dir, true)?;
    let (handoffs, _socket_guard) = bind_node_socket(&node.runtime_dir)?;
    let registry = Arc::new(Registry::new(node.mounts.iter().map(MountState::starting).collect()));
    if let Some(addr) = node.metrics_addr {
        metrics::spawn_server(addr, registry.clone())?;
    }
    let total = node.mounts.len();
    let (stop_tx, stop_rx) = watch::channel(None);
    let failed = std::thread::scope(|scope| {
        // Threads of handed-off mounts, by mountpoint, joined at the end like the declared ones.
        let handed: Mutex<Vec<(PathBuf, MountThread<'_>)>> = Mutex::new(Vec::new());
        let mut threads = Vec::new();
        let mut pending = Vec::new();
        for (i, (config, args)) in node.mounts.iter().zip(&node.args).enumerate() {
            let (tx, rx) = oneshot::channel();
            let (stop, theirs) = (stop_rx.clone(), registry.clone());
            let thread = std::thread::Builder::new().name(format!("tierfs-node-{i}")).spawn_scoped(scope, move || {
                keep_serving(rt, i, config, Some(args), tx, stop, &theirs, FirstStart::Retry).outcome
            });
            match thread {
                Ok(thread) => threads.push((i, thread)),
                Err(e) => registry.set(i, |m| m.failed(format!("starting its thread: {e}"))),
            }
            pending.push(rx);
        }
        let early = rt.block_on(await_first_starts(pending, &registry, &mut stop, notifier));
        let reason = match early {
            Some(reason) => reason,
            None => rt.block_on(async {
                let accept = serve_handoffs(
                    &handoffs,
                    &node.runtime_dir,
                    |asked| {
                        let i = registry.add(MountState::starting(&asked.config));
                        let (tx, rx) = oneshot::channel();
                        let (stop, theirs) = (stop_rx.clone(), registry.clone());
                        let mountpoint = asked.config.mountpoint.clone();
                        let thread = std::thread::Builder::new().name(format!("tierfs-node-{i}")).spawn_scoped(
                            scope,
                            move || {
                                let served =
                                    keep_serving(rt, i, &asked.config, None, tx, stop, &theirs, FirstStart::Once);
                                theirs.retire(i);
                                // A hand-off that failed to start told its caller: not the node's failure.
                                if served.started { served.outcome } else { Ok(()) }
                            },
                        );
                        match thread {
                            Ok(thread) => {
                                handed.lock().unwrap_or_else(PoisonError::into_inner).push((mountpoint, thread))
                            }
                            Err(e) => {
                                registry.retire(i);
                                warn!("starting the thread of a handed-off mount: {e}");
                            }
                        }
                        (i, rx)
                    },
                    &registry,
                );
                tokio::select! {
                    reason = stop.wait() => reason,
                    never = accept => match never {},
                }
            }),
        };
        info!("{reason} received: stopping {total} mounts");
        notifier.send(&format!("STOPPING=1\nSTATUS=flushing {total} mounts ({reason})"));
        let _ = stop_tx.send(Some(reason));
        let handed = std::mem::take(&mut *handed.lock().unwrap_or_else(PoisonError::into_inner));
        join_mounts(threads.into_iter().map(|(i, t)| (node.mounts[i].mountpoint.clone(), t)).chain(handed))
    });
    if failed.is_empty() {
        info!("tierfs node: every mount stopped and flushed");
        Ok(())
    } else {
        Err(anyhow!("{} mounts failed: {}", failed.len(), failed.join("; ")))
    }
}

/// Waits for the thread of every mount; returns the mounts that failed, each as
/// "mountpoint: why".
fn join_mounts<'scope>(all: impl Iterator<Item = (PathBuf, MountThread<'scope>)>) -> Vec<String> {
    let mut failed = Vec::new();
    for (mountpoint, thread) in all {
        let outcome = thread.join().unwrap_or_else(|_| Err("its thread panicked".into()));
        if let Err(message) = outcome {
            failed.push(format!("{}: {message}", mountpoint.display()));
        }
    }
    failed
}

/// Waits for each declared mount's first start (live or failed, as the registry records),
/// then tells systemd the node is ready. A stop during the start is heard at once (its
/// reason is returned); a mount still starting then stops as soon as it is up.
async fn await_first_starts(
    pending: Vec<oneshot::Receiver<Result<NodeReady, Reported>>>,
    registry: &Registry,
    stop: &mut Stop,
    notifier: &Notifier,
) -> Option<&'static str> {
    let total = pending.len();
    let mut live = 0;
    for (i, rx) in pending.into_iter().enumerate() {
        tokio::select! {
            answer = rx => match answer {
                Ok(Ok(ready)) => {
                    live += 1;
                    registry.set(i, |m| m.live(ready));
                }
                Ok(Err(message)) => registry.set(i, |m| m.failed(message.message)),
                Err(_) => registry.set(i, |m| m.failed("it ended before it was ready".into())),
            },
            reason = stop.wait() => return Some(reason),
        }
    }
    info!("tierfs node: {live} of {total} mounts live");
    notifier.send(&format!("READY=1\nSTATUS={live} of {total} mounts live"));
    None
}

/// Binds the node's hand-off socket in `runtime_dir`, reachable by every user (the server
/// checks each caller), and refuses to when another node daemon answers there.
fn bind_node_socket(runtime_dir: &Path) -> Result<(UnixListener, SocketGuard)> {
    let path = runtime_dir.join(handoff::NODE_SOCKET);
    if std::os::unix::net::UnixStream::connect(&path).is_ok() {
        bail_with!(
            ErrorKind::Conflict,
            "another node daemon serves {} (its socket {} answers); stop it first",
            runtime_dir.display(),
            path.display()
        );
    }
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale node socket {}", path.display())),
    }
    let listener = UnixListener::bind(&path).with_context(|| format!("binding the node socket {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666))
        .with_context(|| format!("opening the node socket {} to every user", path.display()))?;
    Ok((listener, SocketGuard(path)))
}

/// Removes the node socket when the node ends.
struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Answers hand-offs on `listener` forever: `start` starts the mount asked for (returning its
/// index in `registry` and where its readiness arrives), and the caller hears once it is live
/// or failed. Connections are served concurrently; a mount that takes long to start holds up
/// no other.
async fn serve_handoffs(
    listener: &UnixListener,
    runtime_dir: &Path,
    start: impl Fn(handoff::Asked) -> (usize, oneshot::Receiver<Result<NodeReady, Reported>>),
    registry: &Registry,
) -> std::convert::Infallible {
    let start = &start;
    let admission = crate::admit::Admission::new();
    let mut connections = FuturesUnordered::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let admitted = admission.admit_peer(&stream);
                    connections.push(async move {
                    let mut stream = AsyncBufReader::new(stream);
                    let _permit = match admitted {
                        Ok(permit) => permit,
                        Err(refusal) => {
                            let refusal = ReadyMessage::failed(refusal);
                            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), handoff::answer(&mut stream, &refusal)).await;
                            return;
                        }
                    };
                    let message = match handoff::read_request(&mut stream, runtime_dir).await {
                        Err(refusal) => {
                            warn!("refused a hand-off: {refusal:?}");
                            refusal
                        }
                        Ok(asked) => {
                            info!(uid = asked.uid, mountpoint = %asked.config.mountpoint.display(), "mount handed off");
                            let (i, ready) = start(asked);
                            match ready.await {
                                Ok(Ok(ready)) => {
                                    let info = ready.info.clone();
                                    registry.set(i, |m| m.live(ready));
                                    ReadyMessage::Ready(info)
                                }
                                Ok(Err(failed)) => ReadyMessage::failed(failed),
                                Err(_) => ReadyMessage::failed(Reported::new(
                                    tierfs::ErrorKind::Internal,
                                    "the mount ended before it was ready",
                                )),
                            }
                        }
                    };
                    if let Err(e) = handoff::answer(&mut stream, &message).await {
                        warn!("answering a hand-off: {e}");
                    }
                    });
                }
                Err(e) => {
                    warn!("node socket accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(()) = connections.next(), if !connections.is_empty() => {}
        }
    }
}

/// Serves mount `i` until the node stops; the result says whether it started and flushed at
/// its end.
fn serve_mount(
    rt: &Runtime,
    i: usize,
    config: &MountConfig,
    args: Option<&MountArgs>,
    ready: oneshot::Sender<Result<NodeReady, Reported>>,
    stop: Stop,
    registry: &Registry,
) -> Served {
    let mut readiness = Readiness::Node(Some(ready));
    // A declared mount may use the embedded store, made here as `tierfs mount` makes it; a
    // handed-off one names its store (its client made it).
    let prepared = args.map_or(Ok(()), crate::store_link::prepare_mount_store);
    let result = prepared.and_then(|()| match config.owner {
        // An owner's mount is served with the owner's rights, never root's.
        Some(uid) if uid != 0 && crate::mounts::is_root() => crate::worker::Owner::lookup(uid)
            .and_then(|owner| crate::worker::supervise(rt, config, &owner, &mut readiness, stop)),
        _ => crate::frontend::run_until(rt, config, &mut readiness, stop, None),
    });
    let started = matches!(readiness, Readiness::Node(None));
    let outcome = result.map_err(|err| {
        let message = crate::logging::error_message(&err);
        error!("{}: {message}", config.mountpoint.display());
        readiness.failed(&err);
        message
    });
    registry.set(i, |m| m.stopped(outcome.clone().err()));
    Served { started, outcome }
}

/// The thread serving one mount: its outcome is why it failed, if it did.
type MountThread<'scope> = std::thread::ScopedJoinHandle<'scope, Result<(), String>>;

/// Whether a mount that failed to start the first time is started again.
#[derive(Clone, Copy, PartialEq)]
enum FirstStart {
    /// A declared mount: the node's configuration wants it, so the node keeps trying.
    Retry,
    /// A handed-off mount: its caller heard the failure and may try again itself.
    Once,
}

/// Serves mount `i` until the node stops, starting it again, after a growing delay, whenever
/// it fails while served (its final flush failed) or, by `first`, fails to start. Its first
/// readiness goes to `ready` (the node's READY=1 or the hand-off's caller waits for it); a
/// later start sets it live in `registry`. An unmount (`tierfs umount`, or `umount` by hand)
/// that flushed is no failure: the mount stays down.
#[allow(clippy::too_many_arguments)]
fn keep_serving(
    rt: &Runtime,
    i: usize,
    config: &MountConfig,
    args: Option<&MountArgs>,
    ready: oneshot::Sender<Result<NodeReady, Reported>>,
    stop: watch::Receiver<Option<&'static str>>,
    registry: &Arc<Registry>,
    first_start: FirstStart,
) -> Served {
    let mut first = Some(ready);
    let mut delay = RESTART_DELAY;
    let mut ever_started = false;
    loop {
        let ready = first.take().unwrap_or_else(|| {
            let (tx, rx) = oneshot::channel::<Result<NodeReady, Reported>>();
            let registry = registry.clone();
            rt.spawn(async move {
                if let Ok(Ok(ready)) = rx.await {
                    info!("{}: restarted", ready.info.mountpoint.display());
                    registry.set(i, |m| m.live(ready));
                }
            });
            tx
        });
        let served = serve_mount(rt, i, config, args, ready, Stop::Node(stop.clone()), registry);
        ever_started |= served.started;
        let done = Served { started: ever_started, outcome: served.outcome.clone() };
        let Err(message) = &served.outcome else { return done };
        if stop.borrow().is_some() || (!ever_started && first_start == FirstStart::Once) {
            return done;
        }
        if served.started {
            // It ran: the next failure starts the backoff over.
            delay = RESTART_DELAY;
        }
        registry.set(i, |m| m.failed(message.clone()));
        warn!("{}: starting it again in {} s", config.mountpoint.display(), delay.as_secs());
        let mut stop_wait = Stop::Node(stop.clone());
        let stopped = rt.block_on(async {
            tokio::select! {
                _ = tokio::time::sleep(delay) => false,
                _ = stop_wait.wait() => true,
            }
        });
        if stopped {
            return done;
        }
        delay = (delay * 2).min(MAX_RESTART_DELAY);
        registry.set(i, |m| {
            m.restarts += 1;
            m.phase = crate::metrics::Phase::Starting;
        });
    }
}

/// The first delay before a failed mount is started again; it doubles up to
/// [`MAX_RESTART_DELAY`] while the mount keeps failing to start.
const RESTART_DELAY: std::time::Duration = std::time::Duration::from_secs(1);
const MAX_RESTART_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

/// How a mount's service ended.
struct Served {
    /// It came up (its readiness was reported).
    started: bool,
    /// Why it failed to start or to flush at its end.
    outcome: Result<(), String>,
}
