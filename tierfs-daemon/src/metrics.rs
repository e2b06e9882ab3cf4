//! The node daemon's HTTP endpoint: Prometheus `/metrics` in the text exposition format
//! (version 0.0.4), and `/healthz`.
//!
//! Every series is computed at scrape time from what the mounts report anyway (the same
//! `StatusReport` that `tierfs status` prints), so a scrape costs one status per mount and
//! serving costs nothing between scrapes. The encoder is our own few lines rather than the
//! `prometheus-client` crate: the values are the core's own counters, read whole at each
//! scrape, which that crate's registry of owned metric objects would only copy.
//!
//! Invariants:
//! - Names follow Prometheus' conventions: `tierfs_` prefix, base units, `_bytes`,
//!   `_seconds`, `_total` on counters. Every series of a mount carries `workspace` and
//!   `mountpoint` labels; label values are escaped.
//! - All samples of one family are written together under one `# HELP` and `# TYPE`.
//! - `/healthz` answers 200 while the daemon serves, with one line per mount, so a liveness
//!   probe never restarts the node (and every mount on it) because one mount failed; that
//!   mount's `tierfs_mount_up` is 0.
//! - The server reads at most [`MAX_REQUEST`] bytes of a request, for at most
//!   [`REQUEST_TIMEOUT`], and answers each connection once.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use tierfs::telemetry::HistogramSnapshot;

use crate::config::MountConfig;
use crate::control::StatusReport;
use crate::launch::NodeReady;

/// Longest request head read.
pub const MAX_REQUEST: usize = 8 * 1024;

/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One mount of the node, as the metrics see it.
pub struct MountState {
    pub mountpoint: PathBuf,
    pub workspace: String,
    pub watch: bool,
    pub phase: Phase,
    /// Times the node started it again after it failed.
    pub restarts: u64,
}

/// Where a mount is in its life.
pub enum Phase {
    Starting,
    Live(NodeReady),
    /// Did not start, with why.
    Failed(String),
    /// Served and stopped; `Some` when its last flush was incomplete.
    Stopped(Option<String>),
    /// Handed off, then unmounted: no longer shown.
    Retired,
}

impl MountState {
    pub fn starting(config: &MountConfig) -> MountState {
        MountState {
            mountpoint: config.mountpoint.clone(),
            workspace: config.workspace.clone(),
            watch: config.watch,
            phase: Phase::Starting,
            restarts: 0,
        }
    }

    pub fn live(&mut self, ready: NodeReady) {
        self.phase = Phase::Live(ready);
    }

    pub fn failed(&mut self, message: String) {
        self.phase = Phase::Failed(message);
    }

    /// Ended: a mount that failed to start stays failed.
    pub fn stopped(&mut self, error: Option<String>) {
        if !matches!(self.phase, Phase::Failed(_)) {
            self.phase = Phase::Stopped(error);
        }
    }

    fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Starting => "starting",
            Phase::Live(_) => "live",
            Phase::Failed(_) => "failed",
            Phase::Stopped(_) => "stopped",
            Phase::Retired => "retired",
        }
    }
}

/// The node's mounts, shared by the node, the mounts' threads and the HTTP server.
pub struct Registry {
    mounts: Mutex<Vec<MountState>>,
}

impl Registry {
    pub fn new(mounts: Vec<MountState>) -> Registry {
        Registry { mounts: Mutex::new(mounts) }
    }

    /// Adds a mount (one handed to the node while it runs) and returns its index.
    pub fn add(&self, mount: MountState) -> usize {
        let mut mounts = self.mounts.lock().unwrap_or_else(PoisonError::into_inner);
        mounts.push(mount);
        mounts.len() - 1
    }

    /// Drops mount `i` from the metrics and `/healthz` (a handed-off mount that ended: the
    /// node's configuration does not name it). Indices of the others stay.
    pub fn retire(&self, i: usize) {
        self.set(i, |m| m.phase = Phase::Retired);
    }

    /// Changes mount `i`.
    pub fn set(&self, i: usize, f: impl FnOnce(&mut MountState)) {
        if let Some(m) = self.mounts.lock().unwrap_or_else(PoisonError::into_inner).get_mut(i) {
            f(m);
        }
    }

    /// Each mount's labels and phase, with the status of those that are live. Blocks while the
    /// live mounts answer (they read their metadata).
    fn snapshot(&self) -> Vec<MountView> {
        let mounts: Vec<_> = {
            let mounts = self.mounts.lock().unwrap_or_else(PoisonError::into_inner);
            mounts
                .iter()
                .filter(|m| !matches!(m.phase, Phase::Retired))
                .map(|m| {
                    let labels = Labels::mount(&m.workspace, &m.mountpoint);
                    let handler = match &m.phase {
                        Phase::Live(ready) => ready.handler.upgrade(),
                        _ => None,
                    };
                    let detail = match &m.phase {
                        Phase::Failed(e) | Phase::Stopped(Some(e)) => e.clone(),
                        _ if m.watch => "watch".into(),
                        _ => "fuse".into(),
                    };
                    // Live, but its handler gone: it is ending on its own thread.
                    let phase = match (&m.phase, &handler) {
                        (Phase::Live(_), None) => "stopping",
                        _ => m.phase_name(),
                    };
                    (labels, phase, detail, m.restarts, handler)
                })
                .collect()
        };
        // Outside the lock: a status may take a while, and the mounts' threads may set their
        // phase meanwhile.
        mounts
            .into_iter()
            .map(|(labels, phase, detail, restarts, h)| MountView {
                labels,
                phase,
                detail,
                restarts,
                status: h.and_then(|h| {
                    let status = h.try_status();
                    release(h);
                    status
                }),
            })
            .collect()
    }
}

/// Drops a scrape's hold on a mount's handler. Should the mount have ended meanwhile, the
/// hold is the last one and dropping it ends the session (joining workers that may wait on a
/// store): that happens on a thread of its own rather than in the scrape.
fn release(handler: Arc<dyn crate::control::ControlHandler>) {
    if Arc::strong_count(&handler) > 1 {
        return;
    }
    let spawned = std::thread::Builder::new().name("tierfs-release".into()).spawn(move || drop(handler));
    if let Err(e) = spawned {
        warn!("ending a mount's session on the scrape's thread: {e}");
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` on a thread with a runtime of its own
/// for the rest of the process (see the node's invariants). A taken port is the error.
pub fn spawn_server(addr: std::net::SocketAddr, registry: Arc<Registry>) -> anyhow::Result<()> {
    use anyhow::Context;
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("listening for /metrics on {addr} ([node] metrics_addr)"))?;
    listener.set_nonblocking(true).context("the /metrics listener")?;
    let bound = listener.local_addr().unwrap_or(addr);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime of /metrics")?;
    std::thread::Builder::new()
        .name("tierfs-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, registry).await,
                    Err(e) => warn!("/metrics is not served: {e}"),
                }
            })
        })
        .context("starting the thread of /metrics")?;
    tracing::info!("metrics on http://{bound}/metrics");
    Ok(())
}

/// Accepts HTTP connections until the process ends.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let registry = registry.clone();
                tokio::spawn(async move {
                    if let Err(err) = answer(stream, registry).await {
                        debug!("metrics connection from {peer}: {err}");
                    }
                });
            }
            Err(err) => {
                warn!("metrics accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, registry: Arc<Registry>) -> std::io::Result<()> {
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await;
    let head = match head {
        Ok(head) => head?,
        Err(_) => return respond(&mut stream, 408, "text/plain", "request timeout\n").await,
    };
    let Some(line) = head.lines().next() else {
        return respond(&mut stream, 400, "text/plain", "bad request\n").await;
    };
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return respond(&mut stream, 405, "text/plain", "only GET is served\n").await;
    }
    match path {
        "/metrics" => {
            let body = tokio::task::spawn_blocking(move || render(&registry.snapshot(), unix_now()))
                .await
                .map_err(std::io::Error::other)?;
            respond(&mut stream, 200, "text/plain; version=0.0.4; charset=utf-8", &body).await
        }
        "/healthz" => {
            let body = {
                let mounts = registry.mounts.lock().unwrap_or_else(PoisonError::into_inner);
                let mut body = String::from("ok\n");
                for m in mounts.iter().filter(|m| !matches!(m.phase, Phase::Retired)) {
                    let _ = writeln!(body, "{} {} {}", m.phase_name(), m.workspace, m.mountpoint.display());
                }
                body
            };
            respond(&mut stream, 200, "text/plain; charset=utf-8", &body).await
        }
        _ => respond(&mut stream, 404, "text/plain", "not found: try /metrics or /healthz\n").await,
    }
}

/// The request head, up to the blank line (or [`MAX_REQUEST`] bytes, or the end).
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while buf.len() < MAX_REQUEST && !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

async fn respond(stream: &mut TcpStream, code: u16, content_type: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Timeout",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One mount as a scrape sees it.
pub struct MountView {
    pub labels: Labels,
    pub phase: &'static str,
    /// Why it failed, or its kind (`fuse`, `watch`).
    pub detail: String,
    pub restarts: u64,
    /// While it is live.
    pub status: Option<StatusReport>,
}

/// The exposition of the node's state (see the module documentation for the rules).
pub fn render(mounts: &[MountView], now_unix: u64) -> String {
    let mut f = Families::default();
    f.gauge(
        "tierfs_build_info",
        "The tierfs version serving, as a label; always 1.",
        &Labels(vec![("version", crate::serve::VERSION.into())]),
        1.0,
    );
    for MountView { labels, phase, detail, restarts, status } in mounts {
        let state = labels.with("state", phase).with("detail", detail);
        f.gauge(
            "tierfs_mount_state",
            "The mount's phase (starting, live, stopping, failed, stopped) as a label; always 1.",
            &state,
            1.0,
        );
        let up = if status.is_some() { 1.0 } else { 0.0 };
        f.gauge("tierfs_mount_up", "1 while the mount (or watched directory) is served.", labels, up);
        f.counter(
            "tierfs_mount_restarts_total",
            "Times the node started the mount again after it failed to start or failed while served.",
            labels,
            *restarts as f64,
        );
        if let Some(s) = status {
            mount_series(&mut f, labels, s, now_unix);
        }
    }
    f.render()
}

/// The series of one live mount.
fn mount_series(f: &mut Families, l: &Labels, s: &StatusReport, now: u64) {
    let n = |v: u64| v as f64;
    f.gauge("tierfs_mount_uptime_seconds", "Time since the mount became ready.", l, n(s.uptime_secs));
    f.gauge("tierfs_inodes", "Files, directories and other inodes in the workspace.", l, n(s.inodes));
    f.gauge("tierfs_open_files", "Files open on the mount.", l, n(s.open_files));
    f.gauge("tierfs_local_data_bytes", "File data held on the local disk.", l, n(s.data_bytes));
    f.gauge("tierfs_disk_free_bytes", "Free space on the data dir's disk.", l, n(s.disk_free));
    f.gauge("tierfs_disk_reserve_bytes", "Of the free space, what file data leaves to the metadata.", l, n(s.reserve));
    if let Some(cap) = s.cache_size {
        f.gauge("tierfs_cache_capacity_bytes", "The cache's size limit (--cache-size).", l, n(cap));
    }
    let cached = s.cold.as_ref().map_or(s.data_bytes, |c| c.resident_bytes);
    f.gauge(
        "tierfs_cache_used_bytes",
        "Workspace data cached on this node: what a scheduler reads to prefer nodes that hold a dataset.",
        l,
        n(cached),
    );
    if let Some(c) = &s.cold {
        f.gauge("tierfs_dirty_bytes", "Bytes written and not yet in the store.", l, n(c.dirty_bytes));
        f.gauge("tierfs_dirty_files", "Files with bytes not yet in the store.", l, n(c.dirty_files));
        f.gauge(
            "tierfs_dirty_oldest_age_seconds",
            "Age of the oldest change not yet in the store.",
            l,
            c.oldest_dirty_ms as f64 / 1000.0,
        );
        f.gauge(
            "tierfs_evicted_bytes",
            "File data held only in the store (evicted from the cache).",
            l,
            n(c.evicted_bytes),
        );
        f.counter("tierfs_cache_evictions_total", "Chunks evicted from the cache.", l, n(c.evictions));
        f.counter(
            "tierfs_cache_miss_bytes_total",
            "Bytes fetched from the store: reads the cache lacked, read-ahead and the refill.",
            l,
            n(c.fetched_bytes),
        );
        f.counter(
            "tierfs_stream_bytes_total",
            "Of those, bytes of streamed reads (kept out of the cache).",
            l,
            n(c.streamed_bytes),
        );
        f.counter(
            "tierfs_store_uploaded_bytes_total",
            "File data bytes uploaded to the store.",
            l,
            n(c.uploaded_bytes),
        );
        f.counter(
            "tierfs_store_uploaded_packs_total",
            "Packs (store objects of file data) uploaded.",
            l,
            n(c.uploaded_packs),
        );
        f.counter(
            "tierfs_store_upload_errors_total",
            "Uploads of file data that failed (and were retried).",
            l,
            n(c.upload_errors),
        );
        f.counter(
            "tierfs_cache_hits_total",
            "Reads whose chunks were all in the cache (streamed reads aside).",
            l,
            n(c.read_hits),
        );
        f.counter("tierfs_cache_hit_bytes_total", "Bytes of those reads.", l, n(c.read_hit_bytes));
        f.counter(
            "tierfs_cache_misses_total",
            "Reads that waited for a chunk from the store (their bytes: tierfs_cache_miss_bytes_total).",
            l,
            n(c.read_misses),
        );
        f.counter(
            "tierfs_cache_neighbour_blocks_total",
            "Blocks fetched beside a missed small block, from around it in its pack (pack neighbours).",
            l,
            n(c.neighbour_blocks),
        );
        f.counter("tierfs_cache_neighbour_bytes_total", "Bytes of those blocks.", l, n(c.neighbour_bytes));
        f.counter(
            "tierfs_cache_neighbour_hits_total",
            "Chunks a later fetch took from those blocks in memory instead of the store.",
            l,
            n(c.neighbour_hits),
        );
        f.counter(
            "tierfs_cache_verify_failures_total",
            "Cached chunks that failed their check against the store at start.",
            l,
            n(c.verify_failures),
        );
        if let Some(r) = &c.refill {
            f.gauge(
                "tierfs_refill_planned_bytes",
                "Bytes of the hot set the refill after a reset fetches back.",
                l,
                n(r.planned_bytes),
            );
            f.gauge("tierfs_refill_fetched_bytes", "Of those, bytes fetched back so far.", l, n(r.fetched_bytes));
            f.gauge(
                "tierfs_refill_running",
                "1 while the refill after a reset runs.",
                l,
                if r.state == tierfs::tier::RefillState::Running { 1.0 } else { 0.0 },
            );
        }
    }
    if let Some(fw) = &s.follow {
        f.gauge("tierfs_follow_head_seq", "The last batch of the head a follower serves.", l, n(fw.seq));
        f.counter("tierfs_follow_heads_total", "Newer heads a follower switched to.", l, n(fw.heads));
        f.gauge(
            "tierfs_follow_switch_timestamp_seconds",
            "When a follower switched to the head it serves (Unix time).",
            l,
            n(fw.switched_unix),
        );
        f.counter("tierfs_follow_errors_total", "Failed looks for, or switches to, a newer head.", l, n(fw.errors));
    }
    if s.store.is_some() {
        f.gauge(
            "tierfs_repair_queue_length",
            "Copies a backend missed, waiting to be written to it.",
            l,
            n(s.pending_repairs),
        );
    }
    for b in &s.backends {
        let bl = l.with("backend", &b.name);
        f.gauge(
            "tierfs_backend_up",
            "1 while the backend's circuit breaker lets requests through.",
            &bl,
            if b.available { 1.0 } else { 0.0 },
        );
        f.gauge(
            "tierfs_backend_consecutive_failures",
            "Requests to the backend that failed in a row.",
            &bl,
            n(u64::from(b.consecutive_failures)),
        );
        let t = &b.traffic;
        for m in t.requests.iter().filter(|m| m.calls > 0) {
            let ml = bl.with("method", &m.op);
            f.counter("tierfs_store_requests_total", "Requests to the backend, by method.", &ml, n(m.calls));
            f.counter(
                "tierfs_store_request_errors_total",
                "Of those, requests that failed (after their retries).",
                &ml,
                n(m.errors),
            );
            f.histogram(
                "tierfs_store_request_duration_seconds",
                "Time from a request's admission to its outcome, retries included.",
                &ml,
                &m.latency,
            );
        }
        f.counter("tierfs_store_retries_total", "Attempts made again after a transient failure.", &bl, n(t.retries));
        f.counter(
            "tierfs_store_refused_requests_total",
            "Requests the open circuit breaker refused without sending.",
            &bl,
            n(t.refused),
        );
        f.counter(
            "tierfs_store_received_bytes_total",
            "Object bytes received from the backend.",
            &bl,
            n(t.received_bytes),
        );
        f.counter("tierfs_store_sent_bytes_total", "Object bytes sent to the backend.", &bl, n(t.sent_bytes));
    }
    for op in &s.fuse_ops {
        let ol = l.with("op", &op.op);
        f.counter("tierfs_fuse_requests_total", "FUSE requests answered, by operation.", &ol, n(op.calls));
        f.counter("tierfs_fuse_request_errors_total", "Of those, answered with an error.", &ol, n(op.errors));
        f.histogram(
            "tierfs_fuse_request_duration_seconds",
            "Time from a FUSE request's arrival in tierfs to its reply.",
            &ol,
            &op.latency,
        );
    }
    if let Some(r) = &s.remote {
        f.gauge("tierfs_metadata_pending_bytes", "Metadata changes not yet in the store.", l, n(r.pending_bytes));
        f.gauge("tierfs_metadata_pending_batches", "Metadata batches not yet in the store.", l, n(r.pending_batches));
        f.gauge(
            "tierfs_metadata_oldest_pending_seconds",
            "Age of the oldest metadata change not yet in the store.",
            l,
            r.oldest_pending_ms as f64 / 1000.0,
        );
        f.counter(
            "tierfs_journal_segments_total",
            "Metadata journal segments written to the store.",
            l,
            n(r.segments_written),
        );
        f.gauge(
            "tierfs_last_commit_timestamp_seconds",
            "When metadata last reached the store.",
            l,
            n(r.last_commit_unix),
        );
        if r.last_snapshot_unix > 0 {
            f.gauge(
                "tierfs_last_snapshot_timestamp_seconds",
                "When this mount last committed a snapshot.",
                l,
                n(r.last_snapshot_unix),
            );
        }
        let held = r.stopped.is_none() && r.lease_expires_unix > now;
        f.gauge(
            "tierfs_lease_held",
            "1 while this node holds the workspace's write lease.",
            l,
            if held { 1.0 } else { 0.0 },
        );
        f.gauge(
            "tierfs_lease_expiry_timestamp_seconds",
            "When the write lease runs out unless renewed.",
            l,
            n(r.lease_expires_unix),
        );
    }
    if let Some(w) = &s.watch {
        f.counter(
            "tierfs_watch_passes_total",
            "Passes over changed directories of a watched directory.",
            l,
            n(w.passes),
        );
        f.counter("tierfs_watch_full_passes_total", "Of those, passes over the whole directory.", l, n(w.full_passes));
        f.gauge("tierfs_watch_pending_dirs", "Directories changed and not passed yet.", l, n(w.pending_dirs));
        f.gauge(
            "tierfs_watch_oldest_pending_seconds",
            "Age of the oldest change not passed yet.",
            l,
            w.oldest_pending_ms as f64 / 1000.0,
        );
        f.gauge(
            "tierfs_watch_rescan_only",
            "1 when change events could not be trusted and only full passes run.",
            l,
            if w.mode == "events" { 0.0 } else { 1.0 },
        );
    }
}

/// The labels of one series, in order.
#[derive(Debug, Clone, Default)]
pub struct Labels(Vec<(&'static str, String)>);

impl Labels {
    pub fn mount(workspace: &str, mountpoint: &std::path::Path) -> Labels {
        Labels(vec![("workspace", workspace.into()), ("mountpoint", mountpoint.display().to_string())])
    }

    fn with(&self, name: &'static str, value: &str) -> Labels {
        let mut labels = self.clone();
        labels.0.push((name, value.into()));
        labels
    }

    fn write(&self, out: &mut String) {
        if self.0.is_empty() {
            return;
        }
        out.push('{');
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(name);
            out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        out.push('}');
    }
}

/// Metric families in the order first seen, each with its samples.
#[derive(Default)]
struct Families(Vec<Family>);

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: String,
}

impl Families {
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &Labels, value: f64) {
        self.sample(name, help, "gauge", labels, value);
    }

    fn counter(&mut self, name: &'static str, help: &'static str, labels: &Labels, value: f64) {
        debug_assert!(name.ends_with("_total"), "{name}: a counter's name ends in _total");
        self.sample(name, help, "counter", labels, value);
    }

    /// A histogram of latencies: `_bucket{le}` (cumulative), `_sum` in seconds, `_count`.
    fn histogram(&mut self, name: &'static str, help: &'static str, labels: &Labels, h: &HistogramSnapshot) {
        debug_assert!(name.ends_with("_seconds"), "{name}: a latency histogram's name ends in _seconds");
        let out = self.samples(name, help, "histogram");
        for (le, n) in h.cumulative() {
            let _ = write!(out, "{name}_bucket");
            labels.with("le", &format_value(le)).write(out);
            let _ = writeln!(out, " {n}");
        }
        let _ = write!(out, "{name}_sum");
        labels.write(out);
        let _ = writeln!(out, " {}", format_value(h.sum_ns as f64 / 1e9));
        let _ = write!(out, "{name}_count");
        labels.write(out);
        let _ = writeln!(out, " {}", h.count());
    }

    fn sample(&mut self, name: &'static str, help: &'static str, kind: &'static str, labels: &Labels, value: f64) {
        let out = self.samples(name, help, kind);
        out.push_str(name);
        labels.write(out);
        let _ = writeln!(out, " {}", format_value(value));
    }

    /// The samples of family `name`, created empty when first named.
    fn samples(&mut self, name: &'static str, help: &'static str, kind: &'static str) -> &mut String {
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family { name, help, kind, samples: String::new() });
                self.0.len() - 1
            }
        };
        &mut self.0[i].samples
    }

    fn render(self) -> String {
        let mut out = String::new();
        for f in self.0 {
            // A counter family's name in HELP and TYPE is the name without `_total`.
            let family = if f.kind == "counter" { f.name.trim_end_matches("_total") } else { f.name };
            let _ = writeln!(out, "# HELP {family} {}", f.help);
            let _ = writeln!(out, "# TYPE {family} {}", f.kind);
            out.push_str(&f.samples);
        }
        out
    }
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount's handler that records its end; the registry never asks it anything here.
    struct Ends(Arc<std::sync::atomic::AtomicBool>);

    impl Drop for Ends {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl crate::control::ControlHandler for Ends {
        fn pong(&self) -> crate::control::Pong {
            unreachable!("not asked")
        }
        fn status(&self) -> StatusReport {
            unreachable!("not asked")
        }
    }

    #[test]
    fn the_registry_never_keeps_a_mounts_session_alive() {
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handler: Arc<dyn crate::control::ControlHandler> = Arc::new(Ends(ended.clone()));
        let mount = MountState {
            mountpoint: "/m".into(),
            workspace: "w".into(),
            watch: false,
            phase: Phase::Starting,
            restarts: 0,
        };
        let registry = Registry::new(vec![mount]);
        let info = crate::launch::ReadyInfo {
            pid: 1,
            mountpoint: "/m".into(),
            data_dir: "/d".into(),
            socket: "/s".into(),
            log: None,
        };
        registry.set(0, |m| m.live(NodeReady { info, handler: Arc::downgrade(&handler) }));
        // The mount's thread lets go: its session ends there, not later under the registry's
        // lock when the phase changes.
        drop(handler);
        assert!(ended.load(std::sync::atomic::Ordering::SeqCst), "the registry kept the handler");
        let views = registry.snapshot();
        assert_eq!((views[0].phase, views[0].status.is_none()), ("stopping", true));
    }

    #[test]
    fn families_group_their_samples_and_escape_labels() {
        let a = Labels::mount("a", std::path::Path::new("/mnt/a"));
        let b = Labels::mount("b\"x", std::path::Path::new("/mnt/b\\\n"));
        let mut f = Families::default();
        f.gauge("tierfs_up", "Up.", &a, 1.0);
        f.counter("tierfs_ops_total", "Ops.", &a, 3.0);
        f.gauge("tierfs_up", "Up.", &b, 0.5);
        let text = f.render();
        assert_eq!(
            text,
            "# HELP tierfs_up Up.\n# TYPE tierfs_up gauge\n\
             tierfs_up{workspace=\"a\",mountpoint=\"/mnt/a\"} 1\n\
             tierfs_up{workspace=\"b\\\"x\",mountpoint=\"/mnt/b\\\\\\n\"} 0.5\n\
             # HELP tierfs_ops Ops.\n# TYPE tierfs_ops counter\n\
             tierfs_ops_total{workspace=\"a\",mountpoint=\"/mnt/a\"} 3\n"
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_a_sum_and_a_count() {
        let h = tierfs::telemetry::Histogram::default();
        h.observe(Duration::from_micros(20));
        h.observe(Duration::from_millis(3));
        let l = Labels::mount("w", std::path::Path::new("/m")).with("op", "read");
        let mut f = Families::default();
        f.histogram("tierfs_x_seconds", "X.", &l, &h.snapshot());
        let text = f.render();
        assert!(text.starts_with("# HELP tierfs_x_seconds X.\n# TYPE tierfs_x_seconds histogram\n"), "{text}");
        let base = "workspace=\"w\",mountpoint=\"/m\",op=\"read\"";
        for line in [
            format!("tierfs_x_seconds_bucket{{{base},le=\"0.00005\"}} 1"),
            format!("tierfs_x_seconds_bucket{{{base},le=\"0.0025\"}} 1"),
            format!("tierfs_x_seconds_bucket{{{base},le=\"0.005\"}} 2"),
            format!("tierfs_x_seconds_bucket{{{base},le=\"+Inf\"}} 2"),
            format!("tierfs_x_seconds_sum{{{base}}} 0.00302"),
            format!("tierfs_x_seconds_count{{{base}}} 2"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_failed_mount_is_down_and_says_why() {
        let labels = Labels::mount("w", std::path::Path::new("/m"));
        let view = MountView { labels, phase: "failed", detail: "store unreachable".into(), restarts: 2, status: None };
        let text = render(&[view], 0);
        assert!(text.contains("tierfs_mount_restarts_total{workspace=\"w\",mountpoint=\"/m\"} 2\n"), "{text}");
        assert!(text.contains("tierfs_mount_up{workspace=\"w\",mountpoint=\"/m\"} 0\n"), "{text}");
        assert!(text.contains("state=\"failed\",detail=\"store unreachable\"} 1\n"), "{text}");
        assert!(text.contains("tierfs_build_info{version="), "{text}");
    }
}
