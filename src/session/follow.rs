//! A follower session's loop: every interval, ask the store whether the workspace has a newer
//! head than the one served ([`Workspace::head_after`]: one listing while nothing changed),
//! switch the [`Vfs`] to it ([`Vfs::apply_head`]) and tell the front end what changed, so it
//! drops those entries from the kernel's caches.
//!
//! Invariants: the served head only moves forward, one whole head at a time; a head that
//! failed to read or apply is retried at the next interval from the last one applied, and
//! the failure is counted and kept for `status`; the loop holds the [`Vfs`] weakly, so it
//! never keeps a closed session's data dir open.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::remote::{ChainPoint, RemoteError, Workspace};
use crate::types::ErrorKind;
use crate::vfs::{HeadChange, Vfs, VfsError};

/// How often a follower looks for a new head unless told otherwise.
pub const FOLLOW_INTERVAL: Duration = Duration::from_secs(3);

/// Where a follower stands, for `status` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowStatus {
    pub interval: Duration,
    /// The last batch of the head served.
    pub seq: u64,
    /// The next journal segment the follower reads.
    pub next_segment: u64,
    /// Heads switched to since the session opened.
    pub heads: u64,
    /// When the head served was switched to (unix seconds; the open's restore at first).
    pub switched_unix: u64,
    /// When the store was last asked successfully.
    pub checked_unix: Option<u64>,
    /// Failed checks or switches since the session opened.
    pub errors: u64,
    /// The last failure, until a check succeeds.
    pub last_error: Option<String>,
}

type Listener = Box<dyn Fn(&HeadChange) + Send + Sync>;

/// The follower's shared state: its status and the front end's listener.
pub(super) struct Follower {
    status: Mutex<FollowStatus>,
    listener: Mutex<Option<Listener>>,
    /// The head served; held through a step.
    point: tokio::sync::Mutex<ChainPoint>,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Follower {
    pub(super) fn new(interval: Duration, from: ChainPoint) -> Arc<Follower> {
        Arc::new(Follower {
            status: Mutex::new(FollowStatus {
                interval,
                seq: from.seq,
                next_segment: from.next_segment,
                switched_unix: unix_now(),
                ..FollowStatus::default()
            }),
            listener: Mutex::new(None),
            point: tokio::sync::Mutex::new(from),
        })
    }

    pub(super) fn status(&self) -> FollowStatus {
        self.status.lock().clone()
    }

    pub(super) fn set_listener(&self, f: Listener) {
        *self.listener.lock() = Some(f);
    }

    fn failed(&self, e: FollowError) -> FollowError {
        warn!("following the workspace: {e} (tried again in the next interval)");
        let mut s = self.status.lock();
        s.errors += 1;
        s.last_error = Some(e.to_string());
        e
    }

    /// Starts the loop: a [`Follower::step`] every interval.
    pub(super) fn spawn(self: &Arc<Self>, handle: &Handle, ws: Arc<Workspace>, vfs: Weak<Vfs>) -> JoinHandle<()> {
        let me = self.clone();
        let interval = self.status.lock().interval;
        handle.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(strong) = vfs.upgrade() else { return };
                // Errors are counted and kept in the status by the step itself.
                let _ = me.step(&ws, strong).await;
            }
        })
    }

    /// Looks for a newer head once and switches to it: `None` when there was none. One step
    /// at a time (the loop's and a caller's wait for each other).
    pub(super) async fn step(&self, ws: &Workspace, vfs: Arc<Vfs>) -> Result<Option<HeadChange>, FollowError> {
        let mut point = self.point.lock().await;
        let head = match ws.head_after(*point).await {
            Ok(head) => head,
            Err(e) => return Err(self.failed(FollowError::Read(e))),
        };
        {
            let mut s = self.status.lock();
            s.checked_unix = Some(unix_now());
            s.last_error = None;
        }
        let Some(head) = head else { return Ok(None) };
        let (next, whole, count) = (head.point, head.whole, head.ops.len());
        let change = if head.ops.is_empty() {
            HeadChange { whole, ..HeadChange::default() }
        } else {
            match tokio::task::spawn_blocking(move || vfs.apply_head(head.ops, next.seq, whole)).await {
                Ok(Ok(change)) => change,
                Ok(Err(e)) => return Err(self.failed(FollowError::Apply(e))),
                Err(e) => return Err(self.failed(FollowError::Thread(e.to_string()))),
            }
        };
        *point = next;
        {
            let mut s = self.status.lock();
            s.seq = next.seq;
            s.next_segment = next.next_segment;
            s.heads += 1;
            s.switched_unix = unix_now();
        }
        if whole {
            info!(seq = next.seq, changes = count, "followed the workspace to its newest checkpoint");
        } else {
            debug!(seq = next.seq, changes = count, inodes = change.inodes.len(), "followed a new head");
        }
        if let Some(listener) = &*self.listener.lock() {
            listener(&change);
        }
        Ok(Some(change))
    }
}

/// Why a follower did not switch to a newer head (it tries again at the next interval).
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("reading the store: {0}")]
    Read(#[source] RemoteError),
    #[error("switching to the new head: {0}")]
    Apply(#[source] VfsError),
    #[error("switching to the new head: {0}")]
    Thread(String),
}

impl FollowError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            FollowError::Read(e) => e.kind(),
            FollowError::Apply(e) => e.kind(),
            FollowError::Thread(_) => ErrorKind::Unavailable,
        }
    }
}
