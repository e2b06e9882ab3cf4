//! A workspace session: one data dir opened against its store (or none), served by any front
//! end (the FUSE mount, the watcher, a node daemon, the Python package), then closed safely.
//!
//! [`Session::open`] does everything that comes before serving: it reloads the repairs the
//! last run saved, restores the workspace into an empty data dir (or a read-only or snapshot
//! view of it), checks a used one against the store and drops it when it is only an outdated
//! copy, takes the writer lease, opens the [`Vfs`] and starts the background work (the
//! committer, the repair loop, the sweep of leftover data files). The front end serves the
//! [`Vfs`] it hands out; [`Session::flush`] and [`Session::close`] make everything durable
//! within one deadline and say how far they got.
//!
//! Invariants:
//! - nothing a user wrote is removed: only a data dir whose every change is in the store
//!   (`RemoteError::StaleLocal`) is cleared, and a snapshot cache only when it carries the
//!   snapshot marker;
//! - a read-only or snapshot session takes no lease and writes nothing to the store;
//! - defaults live here ([`SessionConfig::new`], the constants below); front ends only map
//!   their options onto [`SessionConfig`];
//! - blocking calls (`open`, `sync`) enter the runtime with `Handle::block_on`, so they are
//!   made from a plain thread, never from a runtime thread.

mod blocks;
mod error;
mod follow;
mod hot;
mod repairs;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::backend::BackendHealth;
use crate::history::{History, HistoryError, Recorded};
use crate::meta::{Clock, system_unix_ms};
use crate::remote::{
    AtReport, ChainPoint, ChainState, CheckpointReport, Committer, RemoteError, RemoteStats, Workspace,
};
use crate::store::{ConditionalCreate, Fencing, Store};
use crate::tier::{ColdConfig, DEFAULT_INFLIGHT_BUDGET, DEFAULT_RESERVE};
use crate::vfs::{AttachedStore, HeadChange, PASSTHROUGH_TAKE_IN, Prepared, Vfs, VfsConfig, VfsStats};

pub use blocks::StoreBlocks;
pub use error::{FlushError, SessionError};
use follow::Follower;
pub use follow::{FOLLOW_INTERVAL, FollowError, FollowStatus};
pub use hot::HOT_SET_INTERVAL;
use hot::HotSets;
pub use repairs::{RepairLog, SAVED_REPAIRS};

/// A node that vanishes keeps its workspace's lease this long (others wait or take over).
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// With [`FsyncMode::Remote`], how long fsync waits for the store before failing with EIO.
pub const FSYNC_REMOTE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often copies that a backend missed are retried (and how long the last try at close
/// may take).
pub const REPAIR_INTERVAL: Duration = Duration::from_secs(5);
/// How long data of an open file may stay dirty before it is uploaded to a store on other
/// machines.
pub const DIRTY_AGE: Duration = Duration::from_millis(500);
/// The same for a store on this machine's own disk ([`StoreLocality::SameDisk`]): an upload
/// protects against nothing a local fsync does not, so rewrites are sealed seldom.
pub const SAME_DISK_DIRTY_AGE: Duration = Duration::from_secs(30);
/// How long a close may take to make everything durable.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);
/// The cache size of a restore's scratch session.
pub const RESTORE_CACHE_SIZE: u64 = 1 << 30;
/// The marker file of a snapshot session's data dir (a cache, rebuilt at every open).
pub const SNAPSHOT_MARKER: &str = ".tierfs-snapshot-cache";

/// What a session may do with the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Read and write; with a store, takes the writer lease and journals every change.
    ReadWrite,
    /// Read only, no lease; an empty data dir shows the workspace's latest state.
    ReadOnly,
    /// Read only, one snapshot; the data dir is a cache of it, rebuilt at every open.
    Snapshot(String),
    /// Read only, the workspace as it was at this time of day (unix milliseconds), from the
    /// journal (`Workspace::restore_at`); the data dir is a cache of it, rebuilt at every open.
    At(u64),
    /// Read only, the workspace just before journal batch `seq`, committed at `unix_ms`
    /// (`Workspace::restore_before`): a file as it was when that batch removed it (the trash).
    Before { unix_ms: u64, seq: u64 },
}

impl Access {
    /// A fixed past state (a snapshot or a time), not the workspace's head.
    fn is_past(&self) -> bool {
        matches!(self, Access::Snapshot(_) | Access::At(_) | Access::Before { .. })
    }
}

/// When fsync returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncMode {
    /// Once the data is on local disk.
    Local,
    /// Once the data and the metadata that finds it are in the store.
    Remote,
}

/// Reads of files larger than a size bypass the cache, or never do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StreamLimit {
    /// The cold tier's default (half the cache).
    Default,
    Off,
    Above(u64),
}

/// Where the store keeps its objects, which sets the defaults that depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreLocality {
    /// On other machines (S3 servers): a reset of this node does not lose it.
    Remote,
    /// On this machine's own disk (the embedded default store).
    SameDisk,
}

impl StoreLocality {
    /// The default dirty age for a store here.
    pub fn dirty_age(self) -> Duration {
        match self {
            StoreLocality::Remote => DIRTY_AGE,
            StoreLocality::SameDisk => SAME_DISK_DIRTY_AGE,
        }
    }

    /// The default fsync mode for a store here: an upload to the same disk adds nothing to a
    /// local fsync.
    pub fn fsync(self) -> FsyncMode {
        match self {
            StoreLocality::Remote => FsyncMode::Remote,
            StoreLocality::SameDisk => FsyncMode::Local,
        }
    }
}

/// Everything a session is opened from.
#[derive(Clone)]
pub struct SessionConfig {
    /// The hot tier and the metadata store; created if missing.
    pub data_dir: PathBuf,
    /// The opened store behind the cold tier and the workspace; `None`: local only.
    pub store: Option<Arc<Store>>,
    pub workspace: String,
    pub access: Access,
    /// Hot-tier size limit (`None`: the disk).
    pub cache_size: Option<u64>,
    /// Free disk space file data leaves for metadata.
    pub reserve: u64,
    /// Bound on bytes written but not uploaded (`None`: the cold tier's default).
    pub dirty_limit: Option<u64>,
    /// Data of open files is uploaded once this old.
    pub dirty_age: Duration,
    pub stream_above: StreamLimit,
    /// Bound on memory for work in flight: uploads being packed, fetches, the stream buffer
    /// (`ColdConfig::share_budget`).
    pub inflight_budget: u64,
    pub fsync: FsyncMode,
    pub lease_ttl: Duration,
    /// This node's name in the lease.
    pub holder: String,
    /// Take the workspace over from a live lease.
    pub takeover: bool,
    /// Mount even though the store holds less than this node saw it hold (see
    /// `RemoteError::RolledBack`): this node's copy is dropped and the store's state taken.
    pub accept_rollback: bool,
    /// The front end keeps mtime/ctime of written files (the FUSE writeback cache).
    pub kernel_owns_times: bool,
    /// Files of the front end in the data dir that clearing it keeps (a daemon's log).
    pub keep_files: Vec<OsString>,
    /// Record the code and configs in the workspace's history at every snapshot.
    pub history: bool,
    /// Keep the workspace's hot set: save it (a writing session) and refill an empty data
    /// dir's cache from it (with `refill`). Off for front ends that serve files from
    /// elsewhere (watch mode).
    pub hot_set: bool,
    /// On an empty data dir, refill the cache from the workspace's hot set in the background.
    pub refill: bool,
    /// A read-only session that follows the workspace as another node writes it: looks for a
    /// newer head this often and switches to it (`None`: shows the head it opened with).
    pub follow: Option<Duration>,
    /// Encrypt the hot tier at rest under a key derived from the store's (`--encrypt-cache`).
    pub encrypt_cache: bool,
    /// Serve wholly local files through FUSE passthrough where the front end can
    /// (`--no-passthrough` turns it off; see [`Vfs::open_for`]).
    pub passthrough: bool,
    /// The clock journal batches are stamped from (`None`: the system clock); tests of
    /// point-in-time restore set their own.
    pub clock: Option<Clock>,
    /// How far back point-in-time restore reaches: a writer's compaction keeps the journal
    /// and checkpoints a restore to any time this recent needs.
    pub retention: Duration,
}

impl std::fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionConfig")
            .field("data_dir", &self.data_dir)
            .field("store", &self.store.is_some())
            .field("workspace", &self.workspace)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl SessionConfig {
    /// A read-write session of workspace `default` in `data_dir` with every default; with a
    /// store at `locality`, the defaults that depend on where it is.
    pub fn new(data_dir: impl Into<PathBuf>, store: Option<(Arc<Store>, StoreLocality)>) -> SessionConfig {
        let locality = store.as_ref().map_or(StoreLocality::Remote, |(_, l)| *l);
        SessionConfig {
            data_dir: data_dir.into(),
            store: store.map(|(s, _)| s),
            workspace: "default".into(),
            access: Access::ReadWrite,
            cache_size: None,
            reserve: DEFAULT_RESERVE,
            dirty_limit: None,
            dirty_age: locality.dirty_age(),
            stream_above: StreamLimit::Default,
            inflight_budget: DEFAULT_INFLIGHT_BUDGET,
            fsync: locality.fsync(),
            lease_ttl: LEASE_TTL,
            holder: holder_name(),
            takeover: false,
            accept_rollback: false,
            kernel_owns_times: false,
            keep_files: Vec::new(),
            history: true,
            hot_set: true,
            refill: true,
            follow: None,
            encrypt_cache: false,
            passthrough: true,
            clock: None,
            retention: crate::remote::DEFAULT_RETENTION,
        }
    }

    fn cold_config(&self) -> ColdConfig {
        let mut cold = ColdConfig::new(self.cache_size);
        if let Some(limit) = self.dirty_limit {
            cold.max_dirty = limit.max(2 * crate::block::CHUNK_SIZE);
        }
        cold.seal_after = self.dirty_age;
        match self.stream_above {
            StreamLimit::Default => {}
            StreamLimit::Off => cold.stream_above = None,
            StreamLimit::Above(size) => cold.stream_above = Some(size),
        }
        if let Some(store) = &self.store {
            cold.share_budget(self.inflight_budget, store.config().pack_size);
        }
        cold
    }
}

/// This process's name in leases: `host:pid`.
pub fn holder_name() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{}:{}", if host.is_empty() { "localhost" } else { &host }, std::process::id())
}

/// What [`Session::sync`] committed.
#[derive(Debug, Clone)]
pub struct Synced {
    pub snapshot: String,
    pub report: CheckpointReport,
    /// File data uploaded by this sync.
    pub data_bytes: u64,
    pub took: Duration,
    /// What the history recorded after the snapshot was committed; `None` when the session
    /// records no history. A failure here leaves the snapshot intact.
    pub history: Option<Result<Recorded, Arc<HistoryError>>>,
}

/// Numbers for a status report.
#[derive(Debug, Clone)]
pub struct SessionStatus {
    pub vfs: VfsStats,
    pub remote: Option<RemoteStats>,
    pub backends: Vec<BackendHealth>,
    pub pending_repairs: u64,
    /// A follower's place (`None` unless the session follows).
    pub follow: Option<FollowStatus>,
}

/// The background work of an open session, stopped by [`Session::close`].
struct Background {
    stop_remote: watch::Sender<bool>,
    remote_task: Option<JoinHandle<()>>,
    repairer: Option<JoinHandle<()>>,
    /// Saves the hot set every [`HOT_SET_INTERVAL`].
    hot_saver: Option<JoinHandle<()>>,
    /// A follower's loop.
    follower: Option<JoinHandle<()>>,
    /// The sweep of leftover data files, and what stops it: it holds the Vfs (and with it
    /// the data dir's lock) while it runs, so closing stops it and waits.
    sweep: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// The periodic take-in of passthrough writers that stay open, and what stops it.
    take_in: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

/// An open workspace (see the module documentation).
pub struct Session {
    vfs: Arc<Vfs>,
    store: Option<Arc<Store>>,
    committer: Option<Arc<Committer>>,
    repairs: Option<Arc<RepairLog>>,
    handle: Handle,
    background: Mutex<Option<Background>>,
    closed: AtomicBool,
    data_dir: PathBuf,
    /// The workspace in the store (`None` without a store), for its history.
    workspace: Option<Arc<Workspace>>,
    record_history: bool,
    /// The cache is encrypted at rest: the history is kept in memory, not in the data dir.
    encrypt_cache: bool,
    /// Opened on first use.
    history: Mutex<Option<History>>,
    /// The hot set: saved by a writing session, refilled from on a fresh node.
    hot: Option<Arc<HotSets>>,
    /// A follower's state.
    follower: Option<Arc<Follower>>,
    /// What a point-in-time session ([`Access::At`]) restored.
    restored_at: Option<AtReport>,
}

impl Session {
    /// Opens the session `config` describes (see the module documentation). Blocking.
    pub fn open(config: SessionConfig, handle: &Handle) -> Result<Session, SessionError> {
        check_config(&config)?;
        let store = config.store.clone();
        // Before anything may clear the data dir.
        let repairs = store.as_ref().map(|s| Arc::new(RepairLog::load(&config.data_dir, s)));
        if config.access.is_past() || config.follow.is_some() {
            // A view's cache: restored anew at every open (a follower's head moved on anyway).
            reset_snapshot_dir(&config.data_dir, &config.keep_files)?;
        }
        let cache_cipher = store.as_ref().filter(|_| config.encrypt_cache).map(|s| s.keys().cache_cipher());
        let mut prepared = prepare(&config, cache_cipher.clone())?;
        // Nothing local yet: a fresh node (or one after a reset), whose cache starts empty.
        let mut fresh = prepared.meta().is_empty()?;
        let owner = store.as_ref().map(|s| format!("{}\n{}\n", s.config().store_id, config.workspace));
        if let (Some(owner), Access::ReadWrite) = (&owner, &config.access) {
            check_owner(&config.data_dir, owner, &config.workspace)?;
        }
        let (follow_from, restored_at) = match &store {
            Some(store) => restore_view(&config, store, &prepared, handle)?,
            None => (None, None),
        };
        let committer = match &store {
            Some(store) if config.access == Access::ReadWrite => {
                let (committer, reprepared, cleared) =
                    open_writer(&config, store, prepared, cache_cipher.as_ref(), handle)?;
                prepared = reprepared;
                fresh |= cleared;
                Some(committer)
            }
            _ => None,
        };
        if let (Some(owner), Some(_)) = (&owner, &committer) {
            let path = config.data_dir.join(OWNER_FILE);
            std::fs::write(&path, owner).map_err(io_error("writing", &path))?;
        }
        let vfs = open_vfs(&config, committer.as_ref(), prepared, cache_cipher, handle)?;
        let new_workspace = |s: &Arc<Store>| Arc::new(Workspace::new(s.clone(), &config.workspace));
        let workspace = committer.as_ref().map(|c| c.workspace().clone()).or_else(|| store.as_ref().map(new_workspace));
        let hot = workspace
            .as_ref()
            .filter(|_| config.hot_set && !config.access.is_past())
            .map(|ws| HotSets::new(vfs.clone(), ws.clone()));
        let follower = config.follow.zip(follow_from).map(|(every, from)| Follower::new(every, from));
        let session = Session {
            follower,
            vfs,
            store,
            committer,
            repairs,
            handle: handle.clone(),
            background: Mutex::new(None),
            closed: AtomicBool::new(false),
            data_dir: config.data_dir.clone(),
            workspace,
            record_history: config.history,
            encrypt_cache: config.encrypt_cache,
            history: Mutex::new(None),
            hot,
            restored_at,
        };
        session.start(config.access == Access::ReadWrite);
        if let Some(hot) = &session.hot {
            if fresh && config.refill {
                hot.spawn_refill(handle.clone());
            }
        }
        Ok(session)
    }

    /// Starts the committer, the repair loop and (when writable) the sweep.
    fn start(&self, writable: bool) {
        let (stop_remote, stop_rx) = watch::channel(false);
        let remote_task = self.committer.clone().map(|c| self.handle.spawn(c.run(stop_rx)));
        // Copies a backend could not take when they were written (it was down) are retried
        // until they are in; what is left is saved for the next session.
        let repairer = self.store.clone().zip(self.repairs.clone()).map(|(store, log)| {
            self.handle.spawn(async move {
                loop {
                    tokio::time::sleep(REPAIR_INTERVAL).await;
                    store.run_repairs().await;
                    log.save(&store);
                }
            })
        });
        // Holds the hot set weakly: an aborted task is dropped only when the runtime gets to
        // it, and must not keep the Vfs (and the data dir's lock) alive after the session.
        let hot_saver = self.hot.as_ref().filter(|_| self.committer.is_some()).map(|hot| {
            let hot = Arc::downgrade(hot);
            self.handle.spawn(async move {
                loop {
                    tokio::time::sleep(HOT_SET_INTERVAL).await;
                    let Some(hot) = hot.upgrade() else { return };
                    hot.save_or_warn("periodically").await;
                }
            })
        });
        let follower = self
            .follower
            .as_ref()
            .zip(self.workspace.clone())
            .map(|(f, ws)| f.spawn(&self.handle, ws, Arc::downgrade(&self.vfs)));
        let sweep = if writable { spawn_sweep(self.vfs.clone()) } else { None };
        let take_in = if writable { spawn_take_in(Arc::downgrade(&self.vfs)) } else { None };
        *self.background.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Background { stop_remote, remote_task, repairer, hot_saver, follower, sweep, take_in });
    }

    /// The filesystem the front end serves.
    /// What a point-in-time session ([`Access::At`]) restored; `None` for any other.
    pub fn restored_at(&self) -> Option<&AtReport> {
        self.restored_at.as_ref()
    }

    pub fn vfs(&self) -> &Arc<Vfs> {
        &self.vfs
    }

    /// The store, when the session has one.
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.store.as_ref()
    }

    /// Whether this session journals to the store (a read-write session with a store).
    pub fn is_synced(&self) -> bool {
        self.committer.is_some()
    }

    /// Numbers for a status report.
    pub fn status(&self) -> SessionStatus {
        SessionStatus {
            vfs: self.vfs.stats(),
            remote: self.committer.as_ref().map(|c| c.stats()),
            backends: self.store.as_ref().map(|s| s.backend().health()).unwrap_or_default(),
            pending_repairs: self.store.as_ref().map_or(0, |s| s.backend().pending_repairs() as u64),
            follow: self.follower.as_ref().map(|f| f.status()),
        }
    }

    /// Calls `f` with what each new head changed, once the follower switched to it (a front
    /// end drops those entries from its caches). Only a following session has heads.
    pub fn on_new_head(&self, f: impl Fn(&HeadChange) + Send + Sync + 'static) {
        if let Some(follower) = &self.follower {
            follower.set_listener(Box::new(f));
        }
    }

    /// A follower looks for a newer head now, and switches to it (what its loop does every
    /// interval): `None` when there was none, or the session does not follow. Blocking.
    pub fn follow_now(&self) -> Result<Option<HeadChange>, FollowError> {
        let (Some(follower), Some(ws)) = (&self.follower, &self.workspace) else { return Ok(None) };
        self.handle.block_on(follower.step(ws, self.vfs.clone()))
    }

    /// Uploads everything written so far (waiting up to `timeout`), then commits a snapshot
    /// named `message`. Blocking.
    pub fn sync(&self, message: Option<String>, timeout: Duration) -> Result<Synced, SessionError> {
        let Some(c) = &self.committer else {
            return Err(if self.store.is_none() { SessionError::NoStore } else { SessionError::ReadOnly });
        };
        let start = Instant::now();
        let uploaded = || self.vfs.stats().cold.map_or(0, |s| s.uploaded_bytes);
        let before = uploaded();
        self.vfs.flush_to_store(timeout).map_err(|dirty| SessionError::NotUploaded { dirty, timeout })?;
        let data_bytes = uploaded().saturating_sub(before);
        let subject = message.clone();
        let (manifest, report) = self.handle.block_on(async {
            // The journal first: a removal just before the sync reaches a segment, not only
            // the snapshot, so the trash (a replay of the journal) shows it.
            c.journal_pending(timeout.saturating_sub(start.elapsed())).await?;
            c.confirm_lease().await?;
            c.checkpoint(Some(message)).await
        })?;
        let snapshot = manifest.id.unwrap_or_default();
        if let Some(hot) = &self.hot {
            self.handle.block_on(hot.clone().save_or_warn("at the snapshot"));
        }
        let history = self.record_history.then(|| {
            self.history(|h, vfs| h.record(vfs, &snapshot, subject.as_deref())).map_err(|e| {
                warn!("snapshot {snapshot} is committed, but recording its history failed: {e}");
                Arc::new(e)
            })
        });
        Ok(Synced { snapshot, report, data_bytes, took: start.elapsed(), history })
    }

    /// Runs `f` on the workspace's history, opened (and brought up to date from the store) on
    /// first use. Blocking.
    pub fn history<T>(&self, f: impl FnOnce(&mut History, &Vfs) -> Result<T, HistoryError>) -> Result<T, HistoryError> {
        let ws = self.workspace.as_ref().ok_or(HistoryError::NoStore)?;
        let mut guard = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let history = match &mut *guard {
            Some(h) => h,
            empty => empty.insert(History::open(&self.data_dir, self.encrypt_cache, ws.clone(), self.handle.clone())?),
        };
        f(history, &self.vfs)
    }

    /// Uploads what is dirty, then makes everything durable on local disk, before `deadline`.
    /// Runs on its own thread rather than `spawn_blocking`, so a flush stuck past the
    /// deadline never holds up the runtime's shutdown.
    pub async fn flush(&self, deadline: tokio::time::Instant) -> Result<(), FlushError> {
        let (tx, rx) = oneshot::channel();
        let vfs = self.vfs.clone();
        let spawned = std::thread::Builder::new().name("tierfs-flush".into()).spawn(move || {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let result = match vfs.flush_to_store(remaining) {
                Ok(()) => vfs.sync_all().map_err(FlushError::Local),
                Err(dirty) => Err(FlushError::NotUploaded { dirty }),
            };
            // Drop this thread's reference before reporting, so the session holds the last one
            // and closes RocksDB in order: a reference left here could be the last at process
            // exit, and RocksDB torn down during exit() aborts.
            drop(vfs);
            let _ = tx.send(result);
        });
        if let Err(err) = spawned {
            return Err(FlushError::Thread(format!("starting the flush thread: {err}")));
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(FlushError::Thread("the flush thread panicked".into())),
            Err(_) => Err(FlushError::Deadline),
        }
    }

    /// Ends the session after the front end stopped serving and [`Session::flush`] ran:
    /// waits until every metadata change is in the store, writes a checkpoint (so the next
    /// restore reads one object set instead of a long journal), releases the lease, stops the
    /// background work and tries the repairs left once more, saving what remains. A second
    /// call does nothing.
    pub async fn close(&self, deadline: tokio::time::Instant) -> Result<(), FlushError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(hot) = self.hot.clone() {
            let _ = tokio::task::spawn_blocking(move || hot.stop_refill()).await;
        }
        let drained = match &self.committer {
            Some(c) => self.drain_remote(c, deadline).await,
            None => Ok(()),
        };
        let background = self.background.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(bg) = background {
            let _ = bg.stop_remote.send(true);
            if let Some(mut task) = bg.remote_task {
                // Not done in time (a request to a store that is away): aborted and waited for,
                // since a task left running would keep the metadata store, and the data dir's
                // RocksDB lock with it, after the session ended.
                if tokio::time::timeout(Duration::from_secs(5), &mut task).await.is_err() {
                    task.abort();
                    let _ = task.await;
                }
            }
            if let Some(repairer) = bg.repairer {
                repairer.abort();
            }
            if let Some(follower) = bg.follower {
                follower.abort();
                let _ = follower.await;
            }
            if let Some(saver) = bg.hot_saver {
                // Waited for: a save in flight holds the Vfs until it is dropped.
                saver.abort();
                let _ = saver.await;
            }
            if let Some((stop, sweep)) = bg.sweep {
                stop.store(true, Ordering::Relaxed);
                let _ = tokio::task::spawn_blocking(move || sweep.join()).await;
            }
            if let Some((stop, take_in)) = bg.take_in {
                // Woken and waited for: a round in flight holds the Vfs.
                stop.store(true, Ordering::Release);
                take_in.thread().unpark();
                let _ = tokio::task::spawn_blocking(move || take_in.join()).await;
            }
        }
        if let Some(store) = &self.store {
            let pending = match tokio::time::timeout(REPAIR_INTERVAL, store.run_repairs()).await {
                Ok(pending) => pending,
                Err(_) => store.backend().pending_repairs(),
            };
            if let Some(log) = &self.repairs {
                log.save(store);
            }
            if pending > 0 {
                warn!(
                    "{pending} copies could not be repaired before the session closed (a backend is still \
                     down); the next session of this data dir retries them (a scrub with repair does too)"
                );
            }
        }
        drained
    }

    /// For a preemption notice (a spot instance about to go): uploads what is dirty and waits
    /// until every metadata change made so far is in the store, all before `timeout` has
    /// passed; the workspace stays open and served. Blocking.
    pub fn flush_to_store(&self, timeout: Duration) -> Result<(), FlushError> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.handle.block_on(async {
            self.flush(deadline).await?;
            if self.committer.is_some() {
                self.wait_metadata(deadline).await?;
                // The next node refills what this one held (a preempted node's last act).
                if let Some(hot) = self.hot.clone() {
                    let _ = tokio::time::timeout_at(deadline, hot.save_or_warn("at the flush")).await;
                }
            }
            Ok(())
        })
    }

    /// Waits until every metadata change journaled so far is in the store, in a journal
    /// segment (not only in a checkpoint: the trash reads the journal).
    async fn wait_metadata(&self, deadline: tokio::time::Instant) -> Result<(), FlushError> {
        let meta = self.vfs.meta().clone();
        let last = meta.journal().last_seq();
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        let waited = tokio::task::spawn_blocking(move || meta.journal().wait_journaled(last, timeout)).await;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(FlushError::MetadataNotStored(e)),
            Err(e) => Err(FlushError::Thread(format!("waiting for the store: {e}"))),
        }
    }

    async fn drain_remote(&self, c: &Arc<Committer>, deadline: tokio::time::Instant) -> Result<(), FlushError> {
        self.wait_metadata(deadline).await?;
        if let Some(hot) = self.hot.clone() {
            if tokio::time::timeout_at(deadline, hot.save_or_warn("at close")).await.is_err() {
                warn!("saving the hot set did not finish in time (the next node refills from the last one saved)");
            }
        }
        match tokio::time::timeout_at(deadline, c.checkpoint(None)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!("final checkpoint: {e} (the journal has everything; restore replays it)"),
            Err(_) => warn!("final checkpoint did not finish in time (the journal has everything)"),
        }
        if let Err(e) = c.release().await {
            warn!("releasing the workspace lease: {e} (it expires on its own)");
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Closed or not, nothing of the session keeps running (an unclosed session leaves the
        // lease to expire and its journal to the next session).
        if let Some(bg) = self.background.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = bg.stop_remote.send(true);
            for task in [bg.remote_task, bg.repairer, bg.hot_saver, bg.follower].into_iter().flatten() {
                task.abort();
            }
            if let Some((stop, take_in)) = bg.take_in {
                stop.store(true, Ordering::Release);
                take_in.thread().unpark();
            }
        }
        if let Some(hot) = &self.hot {
            hot.stop_refill();
        }
    }
}

/// A read-only session with nothing local shows the latest state; a snapshot session, the
/// snapshot; a point-in-time session, the state at its time (and returns what it restored).
/// Each is shown as a node after a reset would show it: data that was never stored is cut
/// off. A follower's restore keeps the marks of data not stored yet (the follower cuts in
/// memory, and uncuts when the data arrives) and returns where the chain ended.
fn restore_view(
    config: &SessionConfig,
    store: &Arc<Store>,
    prepared: &Prepared,
    handle: &Handle,
) -> Result<(Option<ChainPoint>, Option<AtReport>), SessionError> {
    let ws = Workspace::new(store.clone(), &config.workspace);
    let mut restored_at = None;
    match &config.access {
        Access::ReadWrite => return Ok((None, None)),
        Access::ReadOnly if config.follow.is_some() => {
            let state = handle.block_on(restore_checked(&ws, prepared, config.accept_rollback))?;
            info!(remote_seq = state.remote_seq, entries = state.entries, "latest state restored to follow");
            return Ok((Some(state.into()), None));
        }
        Access::ReadOnly => {
            if !prepared.meta().is_empty()? {
                return Ok((None, None));
            }
            let state = handle.block_on(restore_checked(&ws, prepared, config.accept_rollback))?;
            info!(remote_seq = state.remote_seq, entries = state.entries, "latest state restored read-only");
        }
        Access::Snapshot(id) => {
            let m = handle.block_on(ws.restore_snapshot(prepared.meta(), id))?;
            info!(snapshot = %id, entries = m.entries, "snapshot restored read-only");
        }
        Access::At(at_ms) => restored_at = Some(restore_past(&ws, prepared, *at_ms, u64::MAX, handle)?),
        Access::Before { unix_ms, seq } => restored_at = Some(restore_past(&ws, prepared, *unix_ms, *seq, handle)?),
    }
    prepared.meta().cut_to_stored_data()?;
    Ok((None, restored_at))
}

/// The state at `at_ms`, before batch `before` (read-only views of the past).
fn restore_past(
    ws: &Workspace,
    prepared: &Prepared,
    at_ms: u64,
    before: u64,
    handle: &Handle,
) -> Result<AtReport, SessionError> {
    let report = handle.block_on(ws.restore_before(prepared.meta(), at_ms, before, system_unix_ms()))?;
    info!(at = %report.at, seq = report.seq, batches = report.batches, "point in time restored read-only");
    Ok(report)
}

/// The data dir's local state, its journal on the configured clock.
fn prepare(config: &SessionConfig, cache_cipher: Option<crate::crypto::CacheCipher>) -> Result<Prepared, SessionError> {
    let prepared = Vfs::prepare(&config.data_dir, cache_cipher)?;
    if let Some(clock) = &config.clock {
        prepared.meta().journal().set_clock(clock.clone());
    }
    Ok(prepared)
}

/// Refuses a configuration whose parts do not go together, before anything is touched.
fn check_config(config: &SessionConfig) -> Result<(), SessionError> {
    let no_store = config.store.is_none();
    if config.access.is_past() && no_store {
        return Err(SessionError::NoStore);
    }
    if config.encrypt_cache && no_store {
        return Err(SessionError::EncryptCacheNoStore);
    }
    if config.follow.is_some() {
        if config.access != Access::ReadOnly {
            return Err(SessionError::FollowNotReadOnly);
        }
        if no_store {
            return Err(SessionError::NoStore);
        }
    }
    Ok(())
}

/// Restores the workspace's latest state, refused before anything is written when the lease's
/// last holder saw the store hold more (unless `accept_rollback`).
async fn restore_checked(
    ws: &Workspace,
    prepared: &Prepared,
    accept_rollback: bool,
) -> Result<ChainState, SessionError> {
    if !accept_rollback {
        ws.check_lease_mark(None).await?;
    }
    Ok(ws.restore(prepared.meta()).await?)
}

/// The file in a data dir that names the store and workspace it is a copy of.
pub const OWNER_FILE: &str = "workspace-of";

/// Refuses a data dir that is the copy of another workspace (or of a workspace of another
/// store): opened for this one, its files would be uploaded into it. A data dir without the
/// file (new, or from before it existed) is taken as this workspace's.
fn check_owner(data_dir: &Path, owner: &str, workspace: &str) -> Result<(), SessionError> {
    match std::fs::read_to_string(data_dir.join(OWNER_FILE)) {
        Ok(has) if has != owner => {
            let mut lines = has.lines();
            let (store, ws) = (lines.next().unwrap_or("").to_owned(), lines.next().unwrap_or("").to_owned());
            Err(SessionError::OtherWorkspace {
                data_dir: data_dir.to_path_buf(),
                store,
                workspace: ws,
                wanted: workspace.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// The session's [`Vfs`] over the prepared data dir, with the store attached when there is
/// one. If it cannot be built, the writer's lease is released first: nothing was served.
fn open_vfs(
    config: &SessionConfig,
    committer: Option<&Arc<Committer>>,
    prepared: Prepared,
    cache_cipher: Option<crate::crypto::CacheCipher>,
    handle: &Handle,
) -> Result<Arc<Vfs>, SessionError> {
    let attached = config.store.as_ref().map(|s| AttachedStore {
        store: Arc::new(StoreBlocks::new(s.clone(), handle.clone())),
        config: config.cold_config(),
    });
    let fsync_remote = (committer.is_some() && config.fsync == FsyncMode::Remote).then_some(FSYNC_REMOTE_TIMEOUT);
    let vfs = Vfs::from_prepared(
        VfsConfig {
            data_dir: config.data_dir.clone(),
            kernel_owns_times: config.kernel_owns_times,
            cache_size: config.cache_size,
            store: attached,
            fsync_remote,
            reserve: config.reserve,
            follow: config.follow.is_some(),
            cache_cipher,
            passthrough: config.passthrough,
        },
        prepared,
    );
    match vfs {
        Ok(vfs) => Ok(Arc::new(vfs)),
        Err(e) => {
            if let Some(c) = committer {
                // Nothing was served: let the next attempt (or node) have the workspace.
                let _ = handle.block_on(c.release());
            }
            Err(e.into())
        }
    }
}

/// Opens the writer's side of the store: [`open_remote`], and when this node's copy is only
/// an outdated cache (or the store went back in time and the user accepts it), drops that
/// copy, prepares the data dir anew and opens again. Returns the committer, the data dir's
/// [`Prepared`] state and whether that copy was dropped (the cache starts empty).
fn open_writer(
    config: &SessionConfig,
    store: &Arc<Store>,
    prepared: Prepared,
    cache_cipher: Option<&crate::crypto::CacheCipher>,
    handle: &Handle,
) -> Result<(Arc<Committer>, Prepared, bool), SessionError> {
    match open_remote(config, store, &prepared, handle) {
        Ok(c) => Ok((c, prepared, false)),
        // Another node wrote the workspace since, and everything this node wrote is
        // in the store: its copy is only an outdated cache. Or the store went back
        // in time and the user accepts its state as it is now.
        Err(SessionError::Remote(e @ RemoteError::StaleLocal { .. }))
        | Err(SessionError::Remote(e @ RemoteError::RolledBack { .. }))
            if config.accept_rollback || matches!(e, RemoteError::StaleLocal { .. }) =>
        {
            warn!("{e}; dropping this node's copy and restoring the store's state");
            drop(prepared);
            clear_data_dir(&config.data_dir, &config.keep_files)?;
            let prepared = prepare(config, cache_cipher.cloned())?;
            let committer = open_remote(config, store, &prepared, handle)?;
            Ok((committer, prepared, true))
        }
        Err(e) => Err(e),
    }
}

/// Takes the workspace's lease and brings the local metadata in line with the store.
fn open_remote(
    config: &SessionConfig,
    store: &Arc<Store>,
    prepared: &Prepared,
    handle: &Handle,
) -> Result<Arc<Committer>, SessionError> {
    let ws = Arc::new(Workspace::new(store.clone(), &config.workspace));
    handle.block_on(async {
        match store.config().fencing {
            Fencing::Conditional => check_conditional_writes(store).await?,
            Fencing::Lease => info!(
                "workspace {:?} is fenced by its lease only: a takeover waits out the holder's lease",
                config.workspace
            ),
        }
        let started = Instant::now();
        let lease = ws.lease(&config.holder, config.lease_ttl);
        let (committer, state) =
            Committer::open(ws.clone(), prepared.meta().clone(), lease, config.takeover, config.accept_rollback)
                .await?;
        committer.set_retention(config.retention);
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

/// Checks that the store's servers honour conditional creates, which fencing a writer rests
/// on, unless the store's config records that every one of them did (then no request at all);
/// a probe that passed is recorded for the next node (best effort).
async fn check_conditional_writes(store: &Store) -> Result<(), SessionError> {
    if store.conditional_create_recorded() {
        return Ok(());
    }
    if let ConditionalCreate::Unreadable(why) = &store.info().conditional_create {
        warn!(
            "the store's config records its conditional-create check in a form this tierfs does not read ({why}); checking the backends again"
        );
    }
    let honoured = store.backend().check_conditional_create().await.map_err(SessionError::NoConditionalWrites)?;
    if let Err(e) = store.record_conditional_create(&honoured).await {
        warn!("recording the conditional-create check in the store's config: {e}");
    }
    Ok(())
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SessionError + use<> {
    let path = path.to_path_buf();
    move |source| SessionError::Io { what, path, source }
}

/// A snapshot session's data dir holds nothing but a cache of the snapshot: it is emptied
/// before each such session. A directory that is not one (no marker) is refused, never wiped.
fn reset_snapshot_dir(dir: &Path, keep: &[OsString]) -> Result<(), SessionError> {
    fs::create_dir_all(dir).map_err(io_error("creating", dir))?;
    let mut entries = fs::read_dir(dir).map_err(io_error("reading", dir))?;
    let foreign = entries.any(|e| e.is_ok_and(|e| e.file_name() != SNAPSHOT_MARKER && !keep.contains(&e.file_name())));
    if foreign && !dir.join(SNAPSHOT_MARKER).exists() {
        return Err(SessionError::NotSnapshotCache(dir.to_path_buf()));
    }
    clear_data_dir(dir, keep)?;
    let marker = dir.join(SNAPSHOT_MARKER);
    fs::write(&marker, b"tierfs: the cache of a read-only view (a snapshot, or a follower's), rebuilt at every mount\n")
        .map_err(io_error("marking", &marker))
}

/// Removes this node's copy of a workspace (metadata and cached data), keeping `keep`.
fn clear_data_dir(dir: &Path, keep: &[OsString]) -> Result<(), SessionError> {
    for e in fs::read_dir(dir).map_err(io_error("reading", dir))? {
        let e = e.map_err(io_error("reading", dir))?;
        if keep.contains(&e.file_name()) {
            continue;
        }
        let path = e.path();
        let removed =
            if e.file_type().is_ok_and(|t| t.is_dir()) { fs::remove_dir_all(&path) } else { fs::remove_file(&path) };
        removed.map_err(io_error("removing", &path))?;
    }
    Ok(())
}

/// Takes in what passthrough writers that stay open wrote, every [`PASSTHROUGH_TAKE_IN`]
/// (`Vfs::take_in_passthrough_writers`), until stopped. It holds the Vfs only during a round.
fn spawn_take_in(vfs: std::sync::Weak<Vfs>) -> Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let theirs = stop.clone();
    let spawned = std::thread::Builder::new().name("tierfs-take-in".into()).spawn(move || {
        loop {
            std::thread::park_timeout(PASSTHROUGH_TAKE_IN);
            if theirs.load(Ordering::Acquire) {
                return;
            }
            let Some(vfs) = vfs.upgrade() else { return };
            vfs.take_in_passthrough_writers(true);
        }
    });
    match spawned {
        Ok(thread) => Some((stop, thread)),
        Err(e) => {
            warn!("cannot start the periodic take-in of passthrough writers: {e}");
            None
        }
    }
}

/// Removes, in the background, data files that a crash left behind after their inode was
/// deleted (`Vfs::sweep_leftover_data_files`); one walk of the data dir per session.
fn spawn_sweep(vfs: Arc<Vfs>) -> Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let theirs = stop.clone();
    let spawned = std::thread::Builder::new().name("tierfs-sweep".into()).spawn(move || {
        let started = Instant::now();
        match vfs.sweep_leftover_data_files(&theirs) {
            Ok(0) => tracing::debug!(millis = started.elapsed().as_millis(), "no leftover data files"),
            Ok(n) => info!(
                millis = started.elapsed().as_millis(),
                "removed {n} data files left behind by a crash (their files were already deleted)"
            ),
            Err(e) => warn!("sweeping leftover data files: {e}"),
        }
    });
    match spawned {
        Ok(thread) => Some((stop, thread)),
        Err(e) => {
            warn!("cannot start the sweep of leftover data files: {e}");
            None
        }
    }
}
