//! Serving a watched directory (`tierfs watch DIR`, watch mode): the core's [`Mirror`] keeps
//! the workspace equal to DIR; this module feeds it. A `notify` (inotify) watcher installed
//! *before* the first pass reports changes; the directories they name are passed again after a
//! short quiet time. A storm of events, a queue overflow (the Rescan flag), the watch limit or
//! any watcher error turn into full passes, the last three for good (status says
//! `rescan-only`), and a jittered full pass runs every few minutes anyway, since events get
//! lost. `sync` is a barrier: a full pass (every change made before it is seen by `stat`) and
//! then the snapshot. SIGTERM, SIGINT and `unwatch` make a last full pass, flush and close the
//! session within `--flush-timeout`.
//!
//! Invariants: one thread owns the mirror and runs every pass, so passes never overlap; the
//! data dir is outside DIR (the core refuses otherwise), so tierfs's own writes raise no
//! events; a pass that failed leaves its directories queued for the next.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use notify::{RecursiveMode, Watcher};
use tierfs::session::Session;
use tierfs::watch::{Mirror, Pass, Start};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::MountConfig;
use crate::control::{
    self, ControlHandler, FlushReport, HistoryAnswer, HistoryOp, Pong, StatusReport, SyncReport, UnmountReport,
    UnmountRequest, WatchStatus,
};
use crate::launch::{Readiness, ReadyInfo};
use crate::logging::{Reason, Reported, bail_with, failure};
use crate::serve::{GivenSocket, Served, Supplied, control_listener, session_context};
use crate::stop::Stop;
use tierfs::ErrorKind;

/// Quiet time after an event before its directories are passed again.
const QUIET: Duration = Duration::from_millis(200);
/// Longest an event waits for quiet.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// More directories than this in one batch: a full pass instead.
const STORM: usize = 1000;
/// A full pass this often anyway (plus up to a third of it at random).
const FULL_EVERY: Duration = Duration::from_secs(180);
/// Full passes this often once events cannot be trusted.
const FALLBACK_EVERY: Duration = Duration::from_secs(10);

enum Msg {
    Event(notify::Result<notify::Event>),
    /// A barrier: answers once a full pass ended.
    Barrier(Sender<PassOutcome>),
    Stop(Sender<PassOutcome>),
}

/// Serves `config.mountpoint` as a watched directory until SIGTERM, SIGINT or `unwatch`, with
/// the store and control socket the node daemon `supplied` when a worker serves the watch as
/// its owner (`crate::worker`).
pub(crate) fn run(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    stop: Stop,
    supplied: Option<Supplied>,
) -> Result<()> {
    let _rt_context = rt.enter();
    let dir = &config.mountpoint;
    if config.read_only || config.snapshot.is_some() {
        bail_with!(
            ErrorKind::InvalidInput,
            "watch mode writes the workspace from {}: --read-only and --snapshot are for mounts",
            dir.display()
        );
    }
    let Some(file) = &config.store else {
        bail_with!(
            ErrorKind::InvalidInput,
            "watch mode needs a store: the bytes of {} live there and in the directory only",
            dir.display()
        );
    };
    let (store, socket) = match supplied {
        Some(Supplied { store: Some(store), socket, .. }) => (store, Some(socket)),
        Some(Supplied { store: None, .. }) => {
            bail_with!(ErrorKind::Internal, "the node daemon handed over no store for {}", dir.display())
        }
        None => (crate::store_link::open_store(rt.handle(), file)?.0, None),
    };
    let session = Session::open(config.session_config(Some(Arc::new(store))), rt.handle())
        .map_err(|e| session_context(e, config))?;
    let session = Arc::new(session);
    let served = serve(rt, config, readiness, stop, &session, socket);
    if served.is_err() {
        let deadline = tokio::time::Instant::now() + config.flush_timeout;
        if let Err(e) = rt.block_on(session.close(deadline)) {
            error!("closing the workspace: {e}");
        }
    }
    served
}

/// Watches `dir` recursively, sending its events to `events`. Returns the watcher, or
/// `None` with the reason when changes cannot be watched here (then full passes stand in).
fn watch_dir(dir: &Path, events: Sender<Msg>) -> (Option<notify::RecommendedWatcher>, Option<String>) {
    let mut fallback = None;
    let watcher = notify::recommended_watcher(move |e| {
        let _ = events.send(Msg::Event(e));
    });
    let watcher = match watcher {
        Ok(mut w) => match w.watch(dir, RecursiveMode::Recursive) {
            Ok(()) => Some(w),
            Err(e) => {
                fallback = Some(format!("cannot watch {}: {e}", dir.display()));
                None
            }
        },
        Err(e) => {
            fallback = Some(format!("no change notification here: {e}"));
            None
        }
    };
    if let Some(reason) = &fallback {
        warn!("{reason}; falling back to a full pass every {} s", FALLBACK_EVERY.as_secs());
    }
    (watcher, fallback)
}

/// Starts the mirror of `dir` (restored, resumed or fresh) and makes the first pass over it;
/// returns the watch's status after it.
fn first_pass(mirror: &mut Mirror, dir: &Path, fallback: Option<String>) -> Result<Arc<Mutex<WatchStatus>>> {
    let start = mirror.start()?;
    let start = match start {
        Start::Restored(c) => format!("restored ({} entries, {} bytes)", c.created + c.linked, c.bytes_read),
        Start::Resumed => "resumed".into(),
        Start::Fresh => "fresh".into(),
    };
    info!(dir = %dir.display(), "watch start: {start}");
    let first = mirror.rescan().context("the first pass over the directory")?;
    info!("first pass: {:?}", first.counts);
    let state = Arc::new(Mutex::new(WatchStatus {
        dir: dir.to_path_buf(),
        mode: if fallback.is_some() { "rescan-only".into() } else { "events".into() },
        fallback_reason: fallback,
        start,
        passes: 1,
        full_passes: 1,
        unstable: first.unstable,
        unreadable: first.unreadable,
        totals: mirror.totals().clone(),
        ..WatchStatus::default()
    }));
    Ok(state)
}

fn serve(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    mut stop: Stop,
    session: &Arc<Session>,
    given_socket: Option<GivenSocket>,
) -> Result<()> {
    let mut mirror = Mirror::new(session.vfs().clone(), &config.mountpoint)?;
    let dir = mirror.root().to_path_buf();
    let (tx, rx) = channel::<Msg>();
    // Watches first, then the first pass: a change during the pass is an event, not lost.
    let (watcher, fallback) = watch_dir(&dir, tx.clone());
    let state = first_pass(&mut mirror, &dir, fallback.clone())?;

    let (listener, socket_guard) = control_listener(config, &dir, given_socket)?;
    let socket = socket_guard.path().to_path_buf();
    let worker = {
        let state = state.clone();
        std::thread::Builder::new()
            .name("tierfs-watch".into())
            .spawn(move || worker(mirror, rx, state, fallback.is_some()))
            .context("starting the watch thread")?
    };
    let handler: Arc<dyn ControlHandler> = Arc::new(Watched {
        served: Served::new(session.clone(), config.clone(), dir.clone(), socket.clone(), None),
        tx: Mutex::new(tx.clone()),
        state,
    });
    let info = ReadyInfo::of_this_process(&dir, &config.data_dir, &socket);
    let report = rt.block_on(async {
        let (unmount_tx, mut unmount_rx) = mpsc::channel::<UnmountRequest>(4);
        let server = tokio::spawn(control::serve(listener, handler.clone(), config.owner, unmount_tx));
        readiness.ready(&info, &handler);
        info!(dir = %dir.display(), data_dir = %config.data_dir.display(), socket = %socket.display(), "tierfs watching");
        let requester = tokio::select! {
            reason = stop.wait() => { info!("{reason} received: stopping the watch"); None }
            Some(r) = unmount_rx.recv() => { info!("unwatch requested over the control socket"); Some(r) }
        };
        let report = finish(session, config, &dir, &tx).await;
        if let Some(request) = requester {
            let _ = request.reply.send(Ok(report.clone()));
            let _ = tokio::time::timeout(Duration::from_secs(5), request.written).await;
        }
        // Wait for the aborted server, so its hold on the session ends here.
        server.abort();
        let _ = server.await;
        report
    });
    drop(watcher);
    drop(socket_guard);
    if worker.join().is_err() {
        error!("the watch thread panicked");
    }
    if report.flushed {
        Ok(())
    } else {
        Err(failure!(
            ErrorKind::Unavailable,
            "{}",
            report.flush_error.unwrap_or_else(|| "the final flush did not complete".into())
        ))
    }
}

/// The last pass, then the session's flush and close, within `--flush-timeout`.
async fn finish(session: &Session, config: &MountConfig, dir: &Path, tx: &Sender<Msg>) -> UnmountReport {
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + config.flush_timeout;
    let (reply, answer) = channel();
    let last = match tx.send(Msg::Stop(reply)) {
        Ok(()) => {
            let waited = tokio::task::spawn_blocking(move || answer.recv_timeout(Duration::from_secs(3600)));
            match tokio::time::timeout_at(deadline, waited).await {
                Ok(Ok(Ok(r))) => r.map_err(|(e, kind)| (e, Some(kind))),
                _ => Err((
                    "the last pass over the directory did not finish within the flush timeout".into(),
                    Some(ErrorKind::Unavailable),
                )),
            }
        }
        Err(_) => Err(("the watch thread is gone".into(), Some(ErrorKind::Internal))),
    };
    let flushed = session.flush(deadline).await.map_err(|e| (e.to_string(), Some(e.kind())));
    let closed = session.close(deadline).await.map_err(|e| (e.to_string(), Some(e.kind())));
    let errors = [last.err(), flushed.err(), closed.err()].into_iter().flatten().collect();
    let millis = start.elapsed().as_millis() as u64;
    let report = UnmountReport::new(dir, millis, config.flush_timeout.as_secs_f64(), errors);
    if report.flushed {
        info!("stopped watching {} (flushed in {} ms)", dir.display(), report.flush_millis);
    } else {
        error!("stopped watching {}, but: {}", dir.display(), report.flush_error.as_deref().unwrap_or(""));
    }
    report
}

/// How a pass the control side waited for ended: its failure's message and kind.
type PassOutcome = Result<(), (String, ErrorKind)>;

/// The watch thread: batches events into passes, and runs full passes when due or asked.
fn worker(mut mirror: Mirror, rx: Receiver<Msg>, state: Arc<Mutex<WatchStatus>>, mut rescan_only: bool) {
    let root = mirror.root().to_path_buf();
    let mut pending: BTreeSet<PathBuf> = BTreeSet::new();
    let mut first_pending: Option<Instant> = None;
    let mut last_event = Instant::now();
    let mut full_due = false;
    let mut next_full = Instant::now() + if rescan_only { FALLBACK_EVERY } else { jittered(FULL_EVERY) };
    loop {
        let wait = if first_pending.is_some() {
            QUIET.saturating_sub(last_event.elapsed())
        } else {
            next_full.saturating_duration_since(Instant::now())
        };
        let mut barrier = None;
        let mut stop = None;
        match rx.recv_timeout(wait.max(Duration::from_millis(1))) {
            // Once events cannot be trusted, only full passes sync (what status says).
            Ok(Msg::Event(Ok(_))) if rescan_only => {}
            // Opens, reads and read-only closes change nothing (and a pass's own directory
            // opens would otherwise start the next pass).
            Ok(Msg::Event(Ok(ev))) if !changes(&ev.kind) => {}
            Ok(Msg::Event(Ok(ev))) => {
                if ev.need_rescan() {
                    full_due = true;
                    rescan_only = true;
                    set_fallback(&state, "the kernel's event queue overflowed");
                }
                // The directories that hold what changed, relative to the root.
                let dirs = ev.paths.iter().filter_map(|p| p.strip_prefix(&root).ok());
                pending.extend(dirs.map(|rel| rel.parent().map(Path::to_path_buf).unwrap_or_default()));
                last_event = Instant::now();
                first_pending.get_or_insert(last_event);
                if pending.len() > STORM {
                    full_due = true;
                }
                let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
                s.pending_dirs = pending.len() as u64;
                s.pending_since = first_pending;
            }
            Ok(Msg::Event(Err(e))) => {
                warn!("watcher error: {e}; falling back to full passes");
                full_due = true;
                rescan_only = true;
                set_fallback(&state, &format!("watcher error: {e}"));
            }
            Ok(Msg::Barrier(reply)) => barrier = Some(reply),
            Ok(Msg::Stop(reply)) => stop = Some(reply),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let quiet = first_pending.is_some_and(|t| last_event.elapsed() >= QUIET || t.elapsed() >= MAX_WAIT);
        if Instant::now() >= next_full {
            full_due = true;
        }
        let full = full_due || barrier.is_some() || stop.is_some();
        if full || quiet {
            let result =
                if full { mirror.rescan() } else { mirror.rescan_dirs(&pending.iter().cloned().collect::<Vec<_>>()) };
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            s.passes += 1;
            let done = record_pass(&mut s, result, full, &mirror);
            if done.is_ok() {
                if full {
                    full_due = false;
                    next_full = Instant::now() + if rescan_only { FALLBACK_EVERY } else { jittered(FULL_EVERY) };
                }
                pending.clear();
                first_pending = None;
            }
            s.pending_dirs = pending.len() as u64;
            s.pending_since = first_pending;
            drop(s);
            if let Some(reply) = barrier {
                let _ = reply.send(done.clone());
            }
            if let Some(reply) = stop {
                let _ = reply.send(done);
                return;
            }
        }
    }
}

/// Records in the watch's status `s` how a pass (`full`, or over the pending directories)
/// ended, and returns that for whoever waits on it.
fn record_pass(s: &mut WatchStatus, result: tierfs::watch::Result<Pass>, full: bool, mirror: &Mirror) -> PassOutcome {
    match result {
        Ok(pass) => {
            if full {
                s.full_passes += 1;
            }
            s.unstable = pass.unstable;
            s.unreadable = pass.unreadable;
            s.totals = mirror.totals().clone();
            s.last_error = None;
            Ok(())
        }
        Err(e) => {
            warn!("pass over {} failed (will retry): {e}", mirror.root().display());
            s.last_error = Some(e.to_string());
            Err((e.to_string(), e.kind()))
        }
    }
}

/// Whether an event can mean a change to sync.
fn changes(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}

fn set_fallback(state: &Mutex<WatchStatus>, reason: &str) {
    let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
    if s.fallback_reason.is_none() {
        warn!("{reason}; falling back to a full pass every {} s", FALLBACK_EVERY.as_secs());
        s.fallback_reason = Some(reason.into());
    }
    s.mode = "rescan-only".into();
}

/// `d` plus up to a third of it, so that many watchers do not pass in step.
fn jittered(d: Duration) -> Duration {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    d + d / 3 * (nanos % 1000) / 1000
}

/// The control socket's view of a watch: a mount's answers plus the watch's state, and a
/// `sync` that waits for a full pass first.
struct Watched {
    served: Served,
    tx: Mutex<Sender<Msg>>,
    state: Arc<Mutex<WatchStatus>>,
}

impl Watched {
    /// A full pass over the directory, waited for up to `timeout`: every change made before
    /// the call is in the workspace once it returns.
    fn barrier(&self, timeout: Duration) -> Result<(), Reported> {
        let (reply, answer) = channel();
        let sent = self.tx.lock().unwrap_or_else(PoisonError::into_inner).send(Msg::Barrier(reply));
        sent.map_err(|_| Reported::new(ErrorKind::Internal, "the watch thread is gone"))?;
        match answer.recv_timeout(timeout) {
            Ok(Ok(())) => Ok(()),
            // The pass retries on its own; why it failed is in the message (and `status`), and
            // its kind is the failure's own: a store outage is `unavailable`, a full disk
            // `no_space`, an unreadable directory what its errno says.
            Ok(Err((e, kind))) => Err(Reported::new(kind, format!("the pass over the directory failed: {e}"))),
            Err(_) => Err(Reported::new(
                Reason::Timeout,
                format!("the pass over the directory did not finish within {} s", timeout.as_secs()),
            )),
        }
    }
}

impl ControlHandler for Watched {
    fn pong(&self) -> Pong {
        self.served.pong()
    }

    fn status(&self) -> StatusReport {
        let mut s = self.served.status();
        let mut w = self.state.lock().unwrap_or_else(PoisonError::into_inner).clone();
        w.oldest_pending_ms = w.pending_since.map_or(0, |t| t.elapsed().as_millis() as u64);
        s.watch = Some(w);
        // Nothing is mounted: no other user reaches the directory through tierfs.
        s.allow_other = false;
        // No kernel reads the files: passthrough does not apply.
        s.passthrough = None;
        s
    }

    fn sync(&self, message: Option<String>, timeout: Duration) -> Result<SyncReport, Reported> {
        self.barrier(timeout)?;
        self.served.sync(message, timeout)
    }

    fn history(&self, op: HistoryOp) -> Result<HistoryAnswer, Reported> {
        self.served.history(op)
    }

    /// A pass over the directory first (what changed there is not in the workspace yet),
    /// then the workspace's flush, within the one `timeout`.
    fn flush(&self, timeout: Duration) -> FlushReport {
        let start = Instant::now();
        let passed = self.barrier(timeout);
        let mut report = self.served.flush(timeout.saturating_sub(start.elapsed()));
        if let Err(e) = passed {
            report.flushed = false;
            report.kind = e.kind.map(|k| k.name().to_string());
            report.error = Some(e.message);
        }
        report.millis = start.elapsed().as_millis() as u64;
        report
    }
}
