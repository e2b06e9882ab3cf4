//! The workspace's hot set in the store, and the refill of a fresh node's cache from it
//! (docs/SEMANTICS.md, "The cache after a reset").
//!
//! A writing session saves the chunks its node holds (most recently used first) at every
//! snapshot, every [`HOT_SET_INTERVAL`] when they changed, on a preemption flush and at close.
//! A session that starts on an empty data dir (a fresh node, or a node after a reset) reads
//! the last saved set and refills its cache from it in the background.
//!
//! Invariants: an empty set is never saved; while a refill runs, nothing is saved (the node holds only part of the set it
//! is refilling, and saving that would lose the rest for the next node); the refill thread is
//! stopped and joined before the session lets go of the [`Vfs`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tracing::{info, warn};

use crate::remote::{RemoteError, Workspace};
use crate::tier::{HotSet, RefillState};
use crate::vfs::Vfs;

/// How often a writing session saves its hot set when it changed.
pub const HOT_SET_INTERVAL: Duration = Duration::from_secs(60);

/// One session's hot set: saving it and refilling from it.
pub(super) struct HotSets {
    vfs: Arc<Vfs>,
    ws: Arc<Workspace>,
    /// The hash of the last set saved (nothing is uploaded while it stays the same).
    last: Mutex<Option<blake3::Hash>>,
    refilling: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl HotSets {
    pub(super) fn new(vfs: Arc<Vfs>, ws: Arc<Workspace>) -> Arc<HotSets> {
        Arc::new(HotSets {
            vfs,
            ws,
            last: Mutex::new(None),
            refilling: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        })
    }

    /// Saves the node's hot set if it changed since the last save; `false` if nothing was
    /// saved (unchanged, empty, no cold tier, or a refill running).
    pub(super) async fn save(self: Arc<Self>) -> Result<bool, RemoteError> {
        if self.refilling.load(Ordering::Acquire) {
            return Ok(false);
        }
        let me = self.clone();
        // An empty set is never saved: a node that held nothing (it read nothing, or mounted
        // with --no-refill and was reset soon) leaves the last useful set to the next node.
        let encoded =
            tokio::task::spawn_blocking(move || me.vfs.hot_set().filter(|s| !s.chunks.is_empty()).map(|s| s.encode()))
                .await;
        let Ok(Some(plain)) = encoded else { return Ok(false) };
        let hash = blake3::hash(&plain);
        if *self.last.lock().unwrap_or_else(PoisonError::into_inner) == Some(hash) {
            return Ok(false);
        }
        self.ws.put_hot_set(&plain).await?;
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(hash);
        Ok(true)
    }

    /// [`HotSets::save`], logging instead of failing: the set is a hint, and its loss costs the
    /// next node a slower start, never data.
    pub(super) async fn save_or_warn(self: Arc<Self>, when: &str) {
        if let Err(e) = self.save().await {
            warn!("saving the hot set {when}: {e} (the next node's refill uses the last one saved)");
        }
    }

    /// Starts refilling the cache from the saved hot set on a thread of its own.
    pub(super) fn spawn_refill(self: &Arc<Self>, handle: Handle) {
        self.refilling.store(true, Ordering::Release);
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("tierfs-refill".into()).spawn(move || {
            me.run_refill(&handle);
            me.refilling.store(false, Ordering::Release);
        });
        match spawned {
            Ok(t) => *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(t),
            Err(e) => {
                self.refilling.store(false, Ordering::Release);
                warn!("cannot start the refill of the cache: {e}");
            }
        }
    }

    fn run_refill(&self, handle: &Handle) {
        let set = match handle.block_on(self.ws.get_hot_set()) {
            Ok(Some(plain)) => HotSet::decode(&plain).map_err(|e| e.to_string()),
            Ok(None) => {
                info!("no hot set in the store (no node saved one): nothing to refill");
                return;
            }
            Err(e) => Err(format!("reading the hot set: {e}")),
        };
        let set = match set {
            Ok(set) => set,
            Err(why) => {
                warn!("{why}; the cache fills as files are read");
                self.vfs.refill_not_started(why);
                return;
            }
        };
        let Some(stats) = self.vfs.refill(&set, &self.stop) else { return };
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        match stats.state {
            RefillState::Stopped => info!(
                "refill stopped after {:.1} of {:.1} MiB in {} ms: {}",
                mib(stats.fetched_bytes),
                mib(stats.planned_bytes),
                stats.elapsed_ms,
                stats.stopped.as_deref().unwrap_or("")
            ),
            _ => info!(
                "refill done: {} chunks, {:.1} MiB in {} ms ({} skipped, {} failed)",
                stats.fetched_chunks,
                mib(stats.fetched_bytes),
                stats.elapsed_ms,
                stats.skipped_chunks,
                stats.failed_chunks
            ),
        }
    }

    /// Stops a running refill and waits for its thread (at most one batch of fetches).
    pub(super) fn stop_refill(&self) {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}
