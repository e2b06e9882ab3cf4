//! The control socket of one mount: the protocol types, the async server run by the
//! serving process, and the small blocking client used by the `tierfs` CLI.
//!
//! Protocol: a Unix stream socket; the client writes one JSON request per line
//! (`{"cmd":"ping"}`, `{"cmd":"status"}`, `{"cmd":"unmount"}`,
//! `{"cmd":"unmount","lazy":true}`, `{"cmd":"history","op":{"log":{...}}}`) and reads one JSON
//! [`Response`] per line. A connection
//! may carry several requests. `unmount` answers only when the flush and unmount are done.
//!
//! Invariants:
//! - The server checks each peer's credentials (`SO_PEERCRED`): only the serving user, root
//!   and the mount's owner (a mount of the node daemon may name one) may talk to it; anyone
//!   else gets an error line saying so, and the connection is closed. Anyone who can talk
//!   to it can unmount the workspace. Without an owner the socket file is also owner-only
//!   (0600) in an owner-only (0700) runtime directory; with one it is 0666 in a 0755
//!   directory, so that the owner can reach it and the credential check decides.
//! - The server never performs the unmount itself: it hands an [`UnmountRequest`] to the
//!   serving loop, which owns the FUSE session, and relays the answer.
//! - Request lines are bounded ([`MAX_LINE`]) so a confused client cannot grow memory.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::admit::{Admission, IDLE};
use tierfs::ErrorKind;

use crate::logging::Reported;

/// Whether the user `uid` may talk to a mount served by this process whose owner is `owner`:
/// the serving user, root and the owner may.
pub fn may_control(uid: u32, owner: Option<u32>) -> Result<(), Reported> {
    let euid = rustix::process::geteuid().as_raw();
    if uid == euid || uid == 0 || owner == Some(uid) {
        return Ok(());
    }
    let owners = match owner {
        Some(owner) if owner != 0 && owner != euid => {
            format!("uid {owner} (its owner), uid {euid} (the daemon) and root")
        }
        _ if euid == 0 => "root".to_owned(),
        _ => format!("uid {euid} (the daemon) and root"),
    };
    Err(Reported::new(ErrorKind::InvalidInput, format!("uid {uid} may not control this mount: only {owners} may")))
}

/// Longest request line the server reads.
pub const MAX_LINE: usize = 64 * 1024;

/// A request to the serving process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Liveness and identity: answers with [`Pong`].
    Ping,
    /// Answers with [`StatusReport`].
    Status,
    /// Upload everything and commit a snapshot; answers with [`SyncReport`] when done.
    Sync {
        #[serde(default)]
        message: Option<String>,
        /// Give up (and fail) after this long.
        #[serde(default = "default_sync_timeout")]
        timeout_secs: u64,
    },
    /// Flush everything and unmount; answers with [`UnmountReport`] when done.
    Unmount {
        /// Detach even if busy (`MNT_DETACH`).
        #[serde(default)]
        lazy: bool,
    },
    /// Read or publish the workspace's history; answers with [`HistoryAnswer`].
    History { op: HistoryOp },
    /// Upload what is dirty and put every metadata change in the store within `timeout_secs`,
    /// staying mounted (a preemption notice); answers with [`FlushReport`].
    Flush { timeout_secs: u64 },
}

/// The answer to [`Request::Flush`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushReport {
    /// Everything written before the request is in the store.
    pub flushed: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `error`, what the caller can do about it (`ErrorKind::name`: `fenced` for a
    /// writer another node took the workspace from), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// What is still only on this node when the answer is sent.
    pub dirty_bytes: u64,
    pub dirty_files: u64,
    pub millis: u64,
}

impl FlushReport {
    /// A flush that did not run (nothing known of what is left).
    pub fn failed(error: String, kind: Option<ErrorKind>) -> FlushReport {
        let kind = kind.map(|k| k.name().to_string());
        FlushReport { flushed: false, error: Some(error), kind, dirty_bytes: 0, dirty_files: 0, millis: 0 }
    }
}

/// What a `history` request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryOp {
    /// The newest `limit` commits (that changed `path`).
    Log { path: Option<String>, limit: usize },
    /// File `path` at revision `rev`.
    Show { rev: String, path: String },
    /// A unified diff from `from` to `to` (the live workspace when `None`).
    Diff { from: String, to: Option<String>, paths: Vec<String> },
    /// The whole history as one git pack, which the client exports or pushes with its own
    /// rights: no request names a path outside the mount for the serving process to write.
    Bundle,
}

/// The answer to a `history` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryAnswer {
    Log(Vec<tierfs::history::LogEntry>),
    Show(tierfs::history::Shown),
    Diff(String),
    Bundle(tierfs::history::Bundle),
}

fn default_sync_timeout() -> u64 {
    3600
}

/// One response line. Exactly one of the payload fields is set when `ok` is true;
/// `error` is set when it is false.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// With `error`, what the caller can do about it (`ErrorKind::name`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// With `error`, a refinement of the kind (`logging::Reason::name`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pong: Option<Pong>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmount: Option<UnmountReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<FlushReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryAnswer>,
}

/// The outcome of `sync`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReport {
    /// The id of the snapshot committed.
    pub snapshot: String,
    /// The last metadata batch it holds.
    pub seq: u64,
    /// Metadata entries in the snapshot.
    pub entries: u64,
    pub parts: u64,
    /// Parts that had changed since the last checkpoint (uploaded now).
    pub parts_uploaded: u64,
    /// Metadata bytes uploaded now.
    pub metadata_bytes: u64,
    /// File data uploaded by this sync (bytes that were not yet in the store).
    pub data_bytes: u64,
    pub millis: u64,
    /// What the history recorded (`None`: this mount records no history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<tierfs::history::Recorded>,
    /// Why recording the history failed; the snapshot is committed all the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_error: Option<String>,
}

impl Response {
    pub fn error(message: impl Into<String>) -> Response {
        Response { ok: false, error: Some(message.into()), ..Response::default() }
    }

    /// The answer for a failure with its kind and reason.
    pub fn failed(e: Reported) -> Response {
        Response {
            kind: e.kind.map(|k| k.name().to_string()),
            reason: e.reason.map(|r| r.name().to_string()),
            ..Response::error(e.message)
        }
    }

    /// This answer's failure as the client's error (`otherwise` when it gives no message).
    pub fn failure(self, otherwise: &str) -> Reported {
        let message = self.error.unwrap_or_else(|| otherwise.to_string());
        Reported::from_names(message, self.kind.as_deref(), self.reason.as_deref())
    }
}

/// Who is serving: the answer to `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    pub pid: u32,
    pub version: String,
    pub mountpoint: PathBuf,
    pub data_dir: PathBuf,
    /// A watched directory (`tierfs watch`), not a FUSE mount. Absent from older daemons.
    #[serde(default)]
    pub watch: bool,
    /// Served by the node daemon (`pid` is the node's, which goes on after an unmount).
    #[serde(default)]
    pub node: bool,
}

/// The state of one mount: the answer to `status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub version: String,
    pub pid: u32,
    pub mountpoint: PathBuf,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    /// When the mount became ready, seconds since the Unix epoch.
    pub started_at_unix: u64,
    pub uptime_secs: u64,
    pub inodes: u64,
    pub open_files: u64,
    pub data_bytes: u64,
    pub cache_size: Option<u64>,
    /// Metadata batches (RocksDB writes) committed since the mount started.
    #[serde(default)]
    pub meta_commits: u64,
    /// Free bytes on the data dir's disk, and how many of them writes leave for the metadata
    /// (`--reserve`): writes fail with ENOSPC once `disk_free` reaches `reserve`.
    #[serde(default)]
    pub disk_free: u64,
    #[serde(default)]
    pub reserve: u64,
    /// The store file, when the mount has a cold tier.
    #[serde(default)]
    pub store: Option<PathBuf>,
    /// The cold tier's numbers.
    #[serde(default)]
    pub cold: Option<ColdStatus>,
    /// The remote metadata: how far the store trails, lease, last snapshot.
    #[serde(default)]
    pub remote: Option<RemoteStatus>,
    /// Each backend of the store: reachable or not (circuit breaker), recent failures.
    #[serde(default)]
    pub backends: Vec<tierfs::backend::BackendHealth>,
    /// Copies a backend missed, waiting to be written to it.
    #[serde(default)]
    pub pending_repairs: u64,
    pub allow_other: bool,
    /// The user the mount serves besides its serving user and root: a node daemon's mount of
    /// that user's workspace (`None` for a mount a user serves for itself).
    #[serde(default)]
    pub owner: Option<u32>,
    pub read_only: bool,
    pub writeback_cache: bool,
    /// The local cache is encrypted at rest (`--encrypt-cache`).
    #[serde(default)]
    pub cache_encrypted: bool,
    /// Whether wholly local files are served through FUSE passthrough, why not, and how
    /// often. Absent from older daemons and from watch mode.
    #[serde(default)]
    pub passthrough: Option<tierfs::vfs::PassthroughStats>,
    /// Set for a watched directory (watch mode), not a FUSE mount.
    #[serde(default)]
    pub watch: Option<WatchStatus>,
    /// The FUSE requests served, per operation (metered mounts only: the node daemon's).
    #[serde(default)]
    pub fuse_ops: Vec<tierfs::telemetry::OpSnapshot>,
    /// A follower's place (`tierfs mount --follow`).
    #[serde(default)]
    pub follow: Option<FollowReport>,
    /// What the fields above add up to, as the control server sends it
    /// ([`StatusSummary::of`]); default in a report built in-process.
    #[serde(default)]
    pub summary: StatusSummary,
}

/// The answers a reader wants first, derived from the rest of a [`StatusReport`] in this one
/// place: `tierfs --json status` carries it, and the CLI's text, the metrics and the Python
/// package read it rather than each adding the report up on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusSummary {
    /// `fuse` (a FUSE mount) or `watch` (a watched directory).
    pub mode: String,
    /// File data written and not yet in the store, and the files holding it.
    pub pending_bytes: u64,
    pub pending_files: u64,
    /// Metadata changes not yet in the store.
    pub pending_metadata_bytes: u64,
    /// Age of the oldest change not yet in the store (file data, metadata, or in watch mode a
    /// change no pass has seen); `None` when everything is there.
    pub oldest_unsynced_ms: Option<u64>,
    /// Workspace data held on this node's disk.
    pub cache_used_bytes: u64,
    /// Every backend answers and the mount still writes to the store (in watch mode: and its
    /// last pass succeeded).
    pub healthy: bool,
    /// Why the mount stopped writing to the store, why the last pass failed, or the last
    /// store error, in that order.
    pub error: Option<String>,
}

impl StatusSummary {
    pub fn of(s: &StatusReport) -> StatusSummary {
        let dirty = s.cold.as_ref().filter(|c| c.dirty_bytes > 0 || c.dirty_files > 0).map(|c| c.oldest_dirty_ms);
        let metadata = s.remote.as_ref().filter(|r| r.pending_batches > 0).map(|r| r.oldest_pending_ms);
        let unseen = s.watch.as_ref().filter(|w| w.pending_dirs > 0).map(|w| w.oldest_pending_ms);
        let stopped = s.remote.as_ref().and_then(|r| r.stopped.clone());
        let pass_error = s.watch.as_ref().and_then(|w| w.last_error.clone());
        let store_error = s.remote.as_ref().and_then(|r| r.last_error.clone());
        let cold_error = s.cold.as_ref().and_then(|c| c.last_error.clone());
        StatusSummary {
            mode: if s.watch.is_some() { "watch" } else { "fuse" }.into(),
            pending_bytes: s.cold.as_ref().map_or(0, |c| c.dirty_bytes),
            pending_files: s.cold.as_ref().map_or(0, |c| c.dirty_files),
            pending_metadata_bytes: s.remote.as_ref().map_or(0, |r| r.pending_bytes),
            oldest_unsynced_ms: [dirty, metadata, unseen].into_iter().flatten().max(),
            cache_used_bytes: s.cold.as_ref().map_or(s.data_bytes, |c| c.resident_bytes),
            healthy: s.backends.iter().all(|b| b.available) && stopped.is_none() && pass_error.is_none(),
            error: stopped.or(pass_error).or(store_error).or(cold_error),
        }
    }
}

/// What `tierfs status` shows of a follower.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FollowReport {
    /// Seconds between looks for a newer head.
    pub interval_secs: f64,
    /// The last batch of the head served.
    pub seq: u64,
    /// Heads switched to since the mount.
    pub heads: u64,
    /// When the head served was switched to (Unix seconds).
    pub switched_unix: u64,
    /// When the store was last read successfully (Unix seconds).
    pub checked_unix: Option<u64>,
    /// Failed looks or switches since the mount.
    pub errors: u64,
    /// The last failure, until a look succeeds.
    pub last_error: Option<String>,
}

impl From<tierfs::session::FollowStatus> for FollowReport {
    fn from(s: tierfs::session::FollowStatus) -> FollowReport {
        FollowReport {
            interval_secs: s.interval.as_secs_f64(),
            seq: s.seq,
            heads: s.heads,
            switched_unix: s.switched_unix,
            checked_unix: s.checked_unix,
            errors: s.errors,
            last_error: s.last_error,
        }
    }
}

/// What `tierfs status` shows of a watched directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WatchStatus {
    pub dir: PathBuf,
    /// `events` (inotify) or `rescan-only` (events could not be trusted; full passes only).
    pub mode: String,
    /// Why the watch fell back to full passes.
    pub fallback_reason: Option<String>,
    /// How the directory and the workspace met at start.
    pub start: String,
    pub passes: u64,
    /// Full passes (periodic, overflow, storm, barrier).
    pub full_passes: u64,
    /// Directories changed and not passed yet, and for how long (ms).
    pub pending_dirs: u64,
    pub oldest_pending_ms: u64,
    /// Since when the oldest waiting change waits (`oldest_pending_ms` is computed from it
    /// when the status is asked for).
    #[serde(skip)]
    pub pending_since: Option<std::time::Instant>,
    pub unstable: Vec<String>,
    pub unreadable: Vec<(String, String)>,
    pub last_error: Option<String>,
    pub totals: tierfs::watch::Counts,
}

/// Where the workspace's metadata stands in the store.
pub use tierfs::remote::RemoteStats as RemoteStatus;
/// How far the store trails the mount, and the cache.
pub use tierfs::tier::ColdStats as ColdStatus;

/// The outcome of `unmount`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnmountReport {
    pub mountpoint: PathBuf,
    /// Whether everything was flushed within the timeout.
    pub flushed: bool,
    /// How long the final flush took (or ran before the timeout hit).
    pub flush_millis: u64,
    pub flush_timeout_secs: f64,
    /// Why the flush did not complete, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_error: Option<String>,
    /// With `flush_error`, the kind of its first failure that has one (`fenced` for a writer
    /// another node took the workspace from), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_kind: Option<String>,
}

impl UnmountReport {
    /// The report of a flush that ended with `errors` (each with its kind, when known).
    pub fn new(
        mountpoint: &Path,
        flush_millis: u64,
        flush_timeout_secs: f64,
        errors: Vec<(String, Option<ErrorKind>)>,
    ) -> UnmountReport {
        let flush_kind = errors.iter().find_map(|(_, kind)| *kind).map(|k| k.name().to_string());
        let flush_error =
            (!errors.is_empty()).then(|| errors.into_iter().map(|(e, _)| e).collect::<Vec<_>>().join("; "));
        UnmountReport {
            mountpoint: mountpoint.to_path_buf(),
            flushed: flush_error.is_none(),
            flush_millis,
            flush_timeout_secs,
            flush_error,
            flush_kind,
        }
    }
}

/// An unmount asked for over the socket, handed to the serving loop.
#[derive(Debug)]
pub struct UnmountRequest {
    pub lazy: bool,
    /// Where the serving loop sends the outcome (or why it refuses, e.g. busy).
    pub reply: oneshot::Sender<Result<UnmountReport, Reported>>,
    /// Fired by the connection once the answer is written, so the serving loop does not
    /// exit (and tear the connection down) before the client has it.
    pub written: oneshot::Receiver<()>,
}

/// What the server needs from the serving process.
pub trait ControlHandler: Send + Sync + 'static {
    fn pong(&self) -> Pong;
    /// May block briefly (it reads metadata); called from a blocking-capable thread.
    fn status(&self) -> StatusReport;
    /// [`ControlHandler::status`], or `None` when it cannot be had (a worker that does not
    /// answer): the node's metrics then show the mount without its status.
    fn try_status(&self) -> Option<StatusReport> {
        Some(self.status())
    }
    /// Blocks until the barrier is done; called from a blocking-capable thread.
    fn sync(&self, _message: Option<String>, _timeout: Duration) -> Result<SyncReport, Reported> {
        Err(Reported::new(ErrorKind::InvalidInput, "this mount cannot take snapshots"))
    }
    /// Blocks (it may read the store); called from a blocking-capable thread.
    fn history(&self, _op: HistoryOp) -> Result<HistoryAnswer, Reported> {
        Err(Reported::new(ErrorKind::InvalidInput, "this mount has no history"))
    }
    /// Blocks up to `timeout`; called from a blocking-capable thread.
    fn flush(&self, _timeout: Duration) -> FlushReport {
        FlushReport::failed("this mount cannot flush".into(), Some(ErrorKind::InvalidInput))
    }
}

/// Accepts connections on `listener` until the task is dropped or aborted. `owner` is a user
/// who may control the mount besides the serving user and root. Connections are admitted
/// within [`crate::admit`]'s bounds; one past them is answered with a refusal and closed.
pub async fn serve(
    listener: UnixListener,
    handler: Arc<dyn ControlHandler>,
    owner: Option<u32>,
    unmounts: mpsc::Sender<UnmountRequest>,
) {
    let admission = Admission::new();
    loop {
        match listener.accept().await {
            Ok((stream, _addr)) => {
                let permit = match admission.admit_peer(&stream) {
                    Ok(permit) => permit,
                    Err(refusal) => {
                        debug!("refused a control connection: {refusal}");
                        tokio::spawn(refuse_now(stream, refusal));
                        continue;
                    }
                };
                let handler = handler.clone();
                let unmounts = unmounts.clone();
                tokio::spawn(async move {
                    if let Err(err) = serve_connection(stream, handler, owner, unmounts).await {
                        debug!("control connection ended: {err}");
                    }
                    drop(permit);
                });
            }
            Err(err) => {
                warn!("control socket accept failed: {err}");
                // Avoid a hot loop on persistent errors such as EMFILE.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers a connection that was not admitted with one refusal line and closes it without
/// waiting for its request: the client reads the line even when its own write failed.
async fn refuse_now(mut stream: UnixStream, refusal: Reported) {
    if let Ok(mut line) = serde_json::to_string(&Response::failed(refusal)) {
        line.push('\n');
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(line.as_bytes())).await;
    }
}

async fn serve_connection(
    stream: UnixStream,
    handler: Arc<dyn ControlHandler>,
    owner: Option<u32>,
    unmounts: mpsc::Sender<UnmountRequest>,
) -> std::io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let (read, mut write) = stream.into_split();
    let mut reader = AsyncBufReader::new(read);
    let mut line = String::new();
    if let Err(refusal) = may_control(uid, owner) {
        warn!("refused control connection: {refusal}");
        // The answer follows the request, so that the client has written it before the close
        // (else its write fails with EPIPE and the message is never read).
        let mut bounded = (&mut reader).take(MAX_LINE as u64 + 1);
        let _ = tokio::time::timeout(Duration::from_secs(5), bounded.read_line(&mut line)).await;
        return send(&mut write, &Response::failed(refusal)).await;
    }
    loop {
        line.clear();
        let next = tokio::time::timeout(IDLE, (&mut reader).take(MAX_LINE as u64 + 1).read_line(&mut line)).await;
        let Ok(n) = next else {
            debug!("closing a control connection silent for {} s", IDLE.as_secs());
            return Ok(());
        };
        let n = n?;
        if n == 0 {
            return Ok(());
        }
        if n > MAX_LINE {
            send(&mut write, &Response::error("request line too long")).await?;
            return Ok(());
        }
        let request = match serde_json::from_str::<Request>(line.trim()) {
            Ok(request) => request,
            Err(err) => {
                let response = Response::error(format!(
                    "bad request {:?}: {err}; expected e.g. {{\"cmd\":\"status\"}}",
                    line.trim()
                ));
                send(&mut write, &response).await?;
                continue;
            }
        };
        debug!(?request, "control request");
        if let Request::Unmount { lazy } = request {
            if unmount_and_answer(lazy, &unmounts, &mut write).await? {
                return Ok(());
            }
            continue;
        }
        send(&mut write, &answer(request, &handler).await).await?;
    }
}

/// The answer to a request other than `unmount` (which [`unmount_and_answer`] answers, as
/// it may end the connection).
async fn answer(request: Request, handler: &Arc<dyn ControlHandler>) -> Response {
    match request {
        Request::Ping => Response { ok: true, pong: Some(handler.pong()), ..Response::default() },
        Request::Status => {
            let h = handler.clone();
            off_runtime(
                "status",
                move || h.status(),
                |status| {
                    let status = StatusReport { summary: StatusSummary::of(&status), ..status };
                    Response { ok: true, status: Some(status), ..Response::default() }
                },
            )
            .await
        }
        Request::Sync { message, timeout_secs } => {
            let h = handler.clone();
            let timeout = Duration::from_secs(timeout_secs);
            off_runtime(
                "sync",
                move || h.sync(message, timeout),
                |answer| match answer {
                    Ok(report) => Response { ok: true, sync: Some(report), ..Response::default() },
                    Err(failed) => Response::failed(failed),
                },
            )
            .await
        }
        Request::Flush { timeout_secs } => {
            let h = handler.clone();
            let timeout = Duration::from_secs(timeout_secs);
            off_runtime(
                "flush",
                move || h.flush(timeout),
                |report| Response { ok: true, flush: Some(report), ..Response::default() },
            )
            .await
        }
        Request::History { op } => {
            let h = handler.clone();
            off_runtime(
                "history",
                move || h.history(op),
                |answer| match answer {
                    Ok(answer) => Response { ok: true, history: Some(answer), ..Response::default() },
                    Err(e) => Response::failed(e),
                },
            )
            .await
        }
        Request::Unmount { .. } => Response::error("unmount is answered on its own"),
    }
}

/// Runs the handler's call `call` (which may block) off the runtime's workers and makes its
/// result a response with `answer`; a call that panicked is the error "`what` failed: …".
async fn off_runtime<T: Send + 'static>(
    what: &str,
    call: impl FnOnce() -> T + Send + 'static,
    answer: impl FnOnce(T) -> Response,
) -> Response {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => answer(result),
        Err(err) => Response::error(format!("{what} failed: {err}")),
    }
}

/// Hands an `unmount` to the serving process and sends its outcome; true once unmounted
/// (the connection then ends).
async fn unmount_and_answer(
    lazy: bool,
    unmounts: &mpsc::Sender<UnmountRequest>,
    write: &mut tokio::net::unix::OwnedWriteHalf,
) -> std::io::Result<bool> {
    let (reply, reply_rx) = oneshot::channel();
    let (written_tx, written) = oneshot::channel();
    let request = UnmountRequest { lazy, reply, written };
    let response = if unmounts.send(request).await.is_err() {
        Response::error("the mount is already being unmounted")
    } else {
        match reply_rx.await {
            Ok(Ok(report)) => Response { ok: true, unmount: Some(report), ..Response::default() },
            Ok(Err(failed)) => Response::failed(failed),
            Err(_) => Response::error("the mount is already being unmounted"),
        }
    };
    let sent = send(write, &response).await;
    // The receiver may be gone (refusals do not wait); that is fine.
    let _ = written_tx.send(());
    sent?;
    Ok(response.ok)
}

async fn send(write: &mut tokio::net::unix::OwnedWriteHalf, response: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(response).map_err(std::io::Error::other)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await?;
    write.flush().await
}

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody serves this socket: no file, or a file left behind by a dead process.
    #[error("no tierfs process answers on {0}")]
    NotServing(PathBuf),
    #[error("control socket {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("control socket {path}: unreadable answer {line:?}: {source}")]
    BadResponse { path: PathBuf, line: String, source: serde_json::Error },
    /// The serving process answered with an error (a refused uid, say).
    #[error("control socket {path}: {message}")]
    Refused { path: PathBuf, message: String },
}

/// Sends one request and reads its response, blocking up to `timeout` for each of
/// connect, write and read.
pub fn request(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let io_err = |source| ClientError::Io { path: socket.to_path_buf(), source };
    let stream = match StdUnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(err) if matches!(err.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
            return Err(ClientError::NotServing(socket.to_path_buf()));
        }
        Err(err) => return Err(io_err(err)),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let mut line = serde_json::to_string(request).map_err(|e| io_err(std::io::Error::other(e)))?;
    line.push('\n');
    // A server that refuses the connection answers and closes without reading: its refusal
    // is still there to read when this write fails.
    let written = (&stream).write_all(line.as_bytes());
    let mut reader = BufReader::new(&stream);
    let mut answer = String::new();
    let n = match reader.read_line(&mut answer) {
        Ok(n) => n,
        Err(e) => return Err(io_err(written.err().unwrap_or(e))),
    };
    if n == 0 {
        if let Err(e) = written {
            return Err(io_err(e));
        }
        return Err(io_err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the serving process closed the connection without answering",
        )));
    }
    serde_json::from_str(answer.trim()).map_err(|source| ClientError::BadResponse {
        path: socket.to_path_buf(),
        line: answer.trim().to_string(),
        source,
    })
}

/// Pings `socket`: `Some(pong)` when a tierfs process answers, `None` when nobody does.
pub fn ping(socket: &Path, timeout: Duration) -> Result<Option<Pong>, ClientError> {
    match request(socket, &Request::Ping, timeout) {
        Ok(Response { ok: true, pong: Some(pong), .. }) => Ok(Some(pong)),
        Ok(other) => Err(ClientError::Io {
            path: socket.to_path_buf(),
            source: std::io::Error::other(format!(
                "unexpected answer to ping: {}",
                other.error.unwrap_or_else(|| "no pong".into())
            )),
        }),
        Err(ClientError::NotServing(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn request_wire_format() {
        assert_eq!(serde_json::to_string(&Request::Ping).unwrap(), r#"{"cmd":"ping"}"#);
        assert_eq!(serde_json::from_str::<Request>(r#"{"cmd":"unmount"}"#).unwrap(), Request::Unmount { lazy: false });
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"unmount","lazy":true}"#).unwrap(),
            Request::Unmount { lazy: true }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"format_disk"}"#).is_err());
    }

    #[test]
    fn error_response_omits_empty_payloads() {
        let line = serde_json::to_string(&Response::error("nope")).unwrap();
        assert_eq!(line, r#"{"ok":false,"error":"nope"}"#);
    }

    struct Fixed;

    impl ControlHandler for Fixed {
        fn pong(&self) -> Pong {
            Pong {
                pid: 7,
                version: "v".into(),
                mountpoint: "/m".into(),
                data_dir: "/d".into(),
                watch: false,
                node: false,
            }
        }
        fn status(&self) -> StatusReport {
            StatusReport {
                version: "v".into(),
                pid: 7,
                mountpoint: "/m".into(),
                data_dir: "/d".into(),
                socket: "/s".into(),
                started_at_unix: 1,
                uptime_secs: 2,
                inodes: 3,
                open_files: 4,
                data_bytes: 5,
                cache_size: None,
                meta_commits: 8,
                disk_free: 6,
                reserve: 7,
                store: None,
                cold: None,
                remote: None,
                backends: Vec::new(),
                pending_repairs: 0,
                allow_other: false,
                owner: None,
                read_only: false,
                writeback_cache: true,
                cache_encrypted: true,
                passthrough: None,
                watch: None,
                fuse_ops: Vec::new(),
                follow: None,
                summary: StatusSummary::default(),
            }
        }
    }

    #[test]
    fn server_answers_ping_status_and_relays_unmount() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sock");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let listener = {
            let _guard = rt.enter();
            UnixListener::bind(&path).unwrap()
        };
        rt.spawn(serve(listener, Arc::new(Fixed), None, tx));
        // The serving loop: refuse the first unmount (busy), accept the second.
        rt.spawn(async move {
            let first: UnmountRequest = rx.recv().await.unwrap();
            first.reply.send(Err(Reported::new(crate::logging::Reason::PathInUse, "busy"))).unwrap();
            let second = rx.recv().await.unwrap();
            assert!(second.lazy);
            second
                .reply
                .send(Ok(UnmountReport {
                    mountpoint: "/m".into(),
                    flushed: true,
                    flush_millis: 1,
                    flush_timeout_secs: 60.0,
                    flush_error: None,
                    flush_kind: None,
                }))
                .unwrap();
            second.written.await.unwrap();
        });

        let t = Duration::from_secs(5);
        assert_eq!(ping(&path, t).unwrap().unwrap().pid, 7);
        let status = request(&path, &Request::Status, t).unwrap();
        assert_eq!(status.status.unwrap().inodes, 3);
        let refused = request(&path, &Request::Unmount { lazy: false }, t).unwrap();
        assert_eq!(refused.error.as_deref(), Some("busy"));
        let done = request(&path, &Request::Unmount { lazy: true }, t).unwrap();
        assert!(done.ok && done.unmount.unwrap().flushed);

        let missing = dir.path().join("missing.sock");
        assert!(ping(&missing, t).unwrap().is_none());
    }

    /// The summary Python's `Status` shows (`oldest_unsynced_secs`, `healthy`, `error`): the
    /// oldest of every kind of pending change, and health from every backend and the writer.
    #[test]
    fn the_summary_adds_up_the_report() {
        let cold = ColdStatus {
            dirty_bytes: 5 << 20,
            dirty_files: 2,
            oldest_dirty_ms: 900_000,
            resident_bytes: 7 << 20,
            ..ColdStatus::default()
        };
        let remote = RemoteStatus {
            workspace: "default".into(),
            pending_batches: 3,
            pending_bytes: 4096,
            oldest_pending_ms: 1000,
            ..RemoteStatus::default()
        };
        let backend = tierfs::backend::BackendHealth {
            name: "file:///s/objects".into(),
            available: true,
            consecutive_failures: 0,
            last_error: None,
            traffic: Default::default(),
        };
        let report = StatusReport {
            data_bytes: 1,
            cold: Some(cold.clone()),
            remote: Some(remote),
            backends: vec![backend.clone()],
            ..StatusReport::default()
        };
        let s = StatusSummary::of(&report);
        assert_eq!(
            (s.mode.as_str(), s.pending_bytes, s.pending_files, s.pending_metadata_bytes),
            ("fuse", 5 << 20, 2, 4096)
        );
        assert_eq!(
            (s.oldest_unsynced_ms, s.cache_used_bytes, s.healthy, s.error),
            (Some(900_000), 7 << 20, true, None)
        );

        let fresh =
            StatusReport { cold: Some(ColdStatus { dirty_bytes: 0, dirty_files: 0, ..cold }), ..report.clone() };
        assert_eq!(StatusSummary::of(&fresh).oldest_unsynced_ms, Some(1000), "the metadata still waits");

        let down = tierfs::backend::BackendHealth { available: false, last_error: Some("refused".into()), ..backend };
        let down = StatusReport { backends: vec![down], ..report.clone() };
        assert!(!StatusSummary::of(&down).healthy);

        let mut stopped = report.clone();
        if let Some(r) = stopped.remote.as_mut() {
            (r.stopped, r.last_error) = (Some("fenced by node b".into()), Some("timeout".into()));
        }
        let s = StatusSummary::of(&stopped);
        assert_eq!((s.healthy, s.error.as_deref()), (false, Some("fenced by node b")), "why it stopped comes first");

        let bare = StatusSummary::of(&StatusReport { data_bytes: 9, ..StatusReport::default() });
        assert_eq!((bare.oldest_unsynced_ms, bare.cache_used_bytes, bare.healthy), (None, 9, true), "no store");
    }

    #[test]
    fn a_watchs_summary_counts_unseen_changes_and_a_failed_pass() {
        let watch = WatchStatus { dir: "/content/work".into(), mode: "events".into(), ..WatchStatus::default() };
        let report = StatusReport { watch: Some(watch.clone()), ..StatusReport::default() };
        let s = StatusSummary::of(&report);
        assert_eq!((s.mode.as_str(), s.oldest_unsynced_ms, s.healthy), ("watch", None, true));
        // Changes no pass has seen yet are not in the store.
        let waiting = WatchStatus { pending_dirs: 2, oldest_pending_ms: 400_000, ..watch.clone() };
        let s = StatusSummary::of(&StatusReport { watch: Some(waiting), ..report.clone() });
        assert_eq!(s.oldest_unsynced_ms, Some(400_000));
        // A failed pass makes the watch unhealthy, and says why.
        let failing = WatchStatus { last_error: Some("reading sub: EIO".into()), ..watch };
        let s = StatusSummary::of(&StatusReport { watch: Some(failing), ..report });
        assert_eq!((s.healthy, s.error.as_deref()), (false, Some("reading sub: EIO")));
    }
}
