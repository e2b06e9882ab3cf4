//! The node daemon's HTTP endpoint: `/metrics` (OpenMetrics text) and `/healthz`, served by
//! hyper, and the node's record of its mounts that both read.
//!
//! Every series is computed at scrape time from what the mounts report anyway (the same
//! `StatusReport` that `tierfs status` prints), so a scrape costs one status per mount and
//! serving costs nothing between scrapes. Which series exist, and from which field, is
//! [`defs`]' one table; `prometheus-client` encodes them.
//!
//! Invariants:
//! - `/healthz` answers 200 while the daemon serves, with one line per mount, so a liveness
//!   probe never restarts the node (and every mount on it) because one mount failed; that
//!   mount's `tierfs_mount_up` is 0.
//! - A client is hostile until it has sent a request: hyper reads at most [`MAX_REQUEST`]
//!   bytes of a request head, for at most [`REQUEST_TIMEOUT`]; only `GET` (and `HEAD`) are
//!   answered, anything else gets 405; each connection is answered once (no keep-alive), and
//!   a connection, slow reader included, ends after [`CONNECTION_TIMEOUT`].

pub mod defs;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::config::MountConfig;
use crate::launch::NodeReady;
use defs::{MountView, mount_labels};

/// Longest request head read (hyper's smallest read buffer).
pub const MAX_REQUEST: usize = 8 * 1024;

/// How long a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may last in all, answer included: a client that reads slowly does
/// not hold its task for ever.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

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
                    let labels = mount_labels(&m.workspace, &m.mountpoint);
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

    /// The body of `/healthz`: `ok`, then each mount's phase, workspace and mountpoint.
    fn health(&self) -> String {
        let mounts = self.mounts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut body = String::from("ok\n");
        for m in mounts.iter().filter(|m| !matches!(m.phase, Phase::Retired)) {
            let _ = writeln!(body, "{} {} {}", m.phase_name(), m.workspace, m.mountpoint.display());
        }
        body
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
                    let service = service_fn(move |request| {
                        let registry = registry.clone();
                        async move { Ok::<_, Infallible>(answer(&request, registry).await) }
                    });
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(REQUEST_TIMEOUT)
                        .max_buf_size(MAX_REQUEST)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service);
                    match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => debug!("metrics connection from {peer}: {err}"),
                        Err(_) => debug!("metrics connection from {peer}: cut after {CONNECTION_TIMEOUT:?}"),
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

async fn answer(request: &Request<Incoming>, registry: Arc<Registry>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET is served\n".into());
    }
    match request.uri().path() {
        "/metrics" => {
            let body = tokio::task::spawn_blocking(move || defs::render(registry.snapshot(), unix_now())).await;
            match body {
                Ok(Ok(body)) => respond(StatusCode::OK, OPENMETRICS, body),
                Ok(Err(e)) => {
                    warn!("encoding /metrics: {e}");
                    respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "encoding the metrics failed\n".into())
                }
                Err(e) => respond(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("scrape failed: {e}\n")),
            }
        }
        "/healthz" => respond(StatusCode::OK, "text/plain; charset=utf-8", registry.health()),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found: try /metrics or /healthz\n".into()),
    }
}

/// The content type of the OpenMetrics text exposition.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn respond(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
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
        fn status(&self) -> crate::control::StatusReport {
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

    /// The status line of the answer to `request` sent raw to a server on a loopback port,
    /// or "" when the server closed the connection without one.
    fn exchange(port: u16, request: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connecting");
        // A bound for a broken server only: the server's own timeouts are far shorter.
        stream.set_read_timeout(Some(Duration::from_secs(120))).expect("read timeout");
        // The server may close while we still send (an oversized head): what it answered counts.
        let _ = stream.write_all(request);
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let raw = String::from_utf8_lossy(&raw);
        raw.lines().next().unwrap_or_default().to_owned()
    }

    #[test]
    fn the_endpoint_answers_get_only_and_cuts_oversized_and_silent_clients() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding");
        let port = listener.local_addr().expect("address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let registry = Arc::new(Registry::new(Vec::new()));
        std::thread::spawn(move || {
            rt.block_on(async move { serve(TcpListener::from_std(listener).expect("listener"), registry).await })
        });

        let ok = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(ok, "HTTP/1.1 200 OK", "a scrape");
        let health = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(health, "HTTP/1.1 200 OK", "the health check");
        let post = exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
        assert_eq!(post, "HTTP/1.1 405 Method Not Allowed");
        let other = exchange(port, b"GET /etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(other, "HTTP/1.1 404 Not Found");
        let garbage = exchange(port, b"\x16\x03\x01 not http at all\r\n\r\n");
        assert!(!garbage.contains("200"), "garbage got {garbage:?}");
        let huge = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(4 * MAX_REQUEST));
        let huge = exchange(port, huge.as_bytes());
        assert!(!huge.contains("200"), "a head over {MAX_REQUEST} bytes got {huge:?}");
        // Sends half a head and waits: the server gives up on it (its header timeout) rather
        // than holding the connection; the client's own bound is far longer.
        let slow = exchange(port, b"GET /metrics HTTP/1.1\r\n");
        assert!(!slow.contains("200"), "a silent client got {slow:?}");
    }
}
