//! A real S3-compatible server for integration tests: moto's standalone server
//! (`moto_server`), started on a free loopback port by the test that needs it, plus a
//! small raw HTTP/1.1 client to look at and tamper with what the server stores.
//!
//! Invariants:
//! - a [`MotoServer`] never leaves a server running: its `Drop` kills the process (SIGKILL,
//!   which also ends a paused one) and reaps it, so a failing test cleans up while it
//!   unwinds. (A server kept in a `static` is never dropped: give each test its own.)
//! - every wait has a deadline: readiness ([`READY_TIMEOUT`]) and every HTTP request
//!   ([`REQUEST_TIMEOUT`], or the caller's own in [`MotoServer::try_request`]).
//! - loopback only: the server listens on 127.0.0.1 and the client talks to nothing else.
//!
//! moto keeps everything in memory, so [`MotoServer::kill`] is total data loss and
//! [`MotoServer::restart`] brings back an empty server on the same port, while
//! [`MotoServer::pause`] / [`MotoServer::resume`] (SIGSTOP / SIGCONT) make requests hang
//! and then let them through with the data intact.
//!
//! Plain std + libc; the test suites reach it as `tierfs_test_support::moto`.
//! The binary is looked up in the order `$TIERFS_MOTO_SERVER`, then
//! `${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/moto-venv/bin/moto_server` (where
//! `scripts/setup-debian.sh` installs a pinned moto), then `moto_server` on `PATH`.

#![allow(dead_code)] // each test crate uses its own subset of the helpers

use std::env;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a freshly spawned server may take to answer HTTP (Python start-up and
/// moto's imports: under a second here, much more on a loaded 2-core CI machine).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of one request of the helper's own (create, list, get, put, delete).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The region moto is addressed with; moto accepts any, tierfs needs one.
pub const REGION: &str = "us-east-1";

/// Where `scripts/setup-debian.sh` installs the test tools unless `TIERFS_TOOLS_DIR` says.
pub const DEFAULT_TOOLS_DIR: &str = "/var/lib/tierfs-test-tools";

/// moto does not check signatures, but it treats a request without an `Authorization`
/// header as anonymous: object reads and overwrites of a private object get 403. Any
/// SigV4-shaped header makes the request "signed", and its credential scope routes it to S3.
const FAKE_AUTHORIZATION: &str =
    "AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

/// Attempts at finding a free port in [`MotoServer::start`]: between probing a port and
/// moto binding it another process may take it, which moto reports by exiting.
const START_ATTEMPTS: u32 = 3;

/// A running (or killed, or paused) `moto_server` on a loopback port.
pub struct MotoServer {
    binary: PathBuf,
    port: u16,
    /// Temporary directory holding `moto.log` (stdout and stderr of every launch).
    dir: PathBuf,
    /// `None` after [`MotoServer::kill`]. Behind a mutex so that `&self` methods can reap
    /// and signal it, and the server can be shared between threads.
    child: Mutex<Option<Child>>,
    launches: u32,
    /// Answers one request at a time ([`MotoServer::start_serial`]).
    serial: bool,
}

/// A response of the raw HTTP client.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as text, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a launch did not produce a ready server.
enum LaunchError {
    /// The process exited before it answered (e.g. the port was taken): worth a retry.
    Exited(ExitStatus),
    /// Still not answering at the deadline (it has been killed).
    NotReady,
}

impl LaunchError {
    fn describe(&self) -> String {
        match self {
            LaunchError::Exited(status) => format!("exited ({status})"),
            LaunchError::NotReady => format!("did not answer within {READY_TIMEOUT:?}"),
        }
    }
}

impl MotoServer {
    /// Starts `moto_server` on a free loopback port and waits until it answers HTTP.
    ///
    /// Panics when the binary is missing (naming `scripts/setup-debian.sh`), or when the
    /// server does not come up within [`READY_TIMEOUT`] (with the end of its log).
    pub fn start() -> MotoServer {
        MotoServer::start_with(false)
    }

    /// The same, serving one request at a time. moto checks `If-None-Match: *` and then stores
    /// the object in two steps with no lock between them (moto/s3/responses.py, put_object),
    /// so two conditional creates that overlap on one threaded server can both succeed; served
    /// one at a time they cannot, as on S3. For tests that race conditional creates.
    pub fn start_serial() -> MotoServer {
        MotoServer::start_with(true)
    }

    fn start_with(serial: bool) -> MotoServer {
        let binary = moto_server_binary();
        let dir = make_temp_dir();
        let log = dir.join("moto.log");
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            match launch(&binary, port, &log, attempt, serial) {
                Ok(child) => {
                    return MotoServer { binary, port, dir, child: Mutex::new(Some(child)), launches: attempt, serial };
                }
                Err(LaunchError::Exited(status)) if attempt < START_ATTEMPTS => {
                    eprintln!("moto: {} exited ({status}) on port {port}; trying another port", binary.display());
                }
                Err(err) => panic!(
                    "moto_server {} {} on 127.0.0.1:{port}; log {}:\n{}",
                    binary.display(),
                    err.describe(),
                    log.display(),
                    tail(&log)
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `n` servers, each with `bucket` created.
    pub fn start_many(n: usize, bucket: &str) -> Vec<MotoServer> {
        (0..n)
            .map(|_| {
                let s = MotoServer::start();
                s.create_bucket(bucket);
                s
            })
            .collect()
    }

    /// `n` serial servers ([`MotoServer::start_serial`]), each with `bucket` created.
    pub fn start_many_serial(n: usize, bucket: &str) -> Vec<MotoServer> {
        (0..n)
            .map(|_| {
                let s = MotoServer::start_serial();
                s.create_bucket(bucket);
                s
            })
            .collect()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A tierfs backend URL for `prefix` in `bucket` on this server.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!("s3://{bucket}/{prefix}?endpoint={}&region={REGION}", self.endpoint())
    }

    /// The environment a tierfs process needs to talk to moto: any credentials do (moto
    /// does not check them, but the S3 client refuses to sign without), and plain HTTP
    /// must be allowed explicitly (`AWS_ALLOW_HTTP`, read by object_store's `from_env`).
    pub fn env() -> Vec<(&'static str, &'static str)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", REGION),
            ("AWS_ALLOW_HTTP", "true"),
        ]
    }

    /// The log of every launch (stdout and stderr of `moto_server`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("moto.log")
    }

    /// Creates `bucket`; panics unless the server answers 2xx (recreating an existing
    /// bucket in us-east-1 is a 200, as on AWS).
    pub fn create_bucket(&self, bucket: &str) {
        self.must("PUT", &format!("/{}", encode(bucket, false)), b"");
    }

    /// Writes `data` to `key` in `bucket`, bypassing tierfs (corruption, foreign writes).
    pub fn put_raw(&self, bucket: &str, key: &str, data: &[u8]) {
        self.must("PUT", &object_path(bucket, key), data);
    }

    /// Deletes `key` from `bucket`, bypassing tierfs (loss). Deleting a missing key is a
    /// success, as in S3.
    pub fn delete_raw(&self, bucket: &str, key: &str) {
        self.must("DELETE", &object_path(bucket, key), b"");
    }

    /// The bytes stored at `key`, `None` when there is no such object.
    pub fn get_raw(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let path = object_path(bucket, key);
        let resp = self.request_or_panic("GET", &path, b"");
        match resp.status {
            404 => None,
            _ if resp.is_success() => Some(resp.body),
            status => panic!("moto: GET {path} answered {status}: {}", resp.text()),
        }
    }

    /// Every key in `bucket`, in S3's (byte-wise) order, following continuation tokens
    /// (moto returns at most 1000 keys a page).
    pub fn list_keys(&self, bucket: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/{}?list-type=2", encode(bucket, false));
            if let Some(token) = &token {
                let _ = write!(path, "&continuation-token={}", encode(token, false));
            }
            let resp = self.must("GET", &path, b"");
            let xml = resp.text();
            keys.extend(xml_elements(&xml, "Key").into_iter().map(|k| xml_unescape(&k)));
            let truncated = xml_elements(&xml, "IsTruncated").first().is_some_and(|t| t == "true");
            if !truncated {
                return keys;
            }
            let next = xml_elements(&xml, "NextContinuationToken").into_iter().next().map(|t| xml_unescape(&t));
            match next {
                // A token that does not move would loop forever.
                Some(next) if Some(&next) != token.as_ref() => token = Some(next),
                other => panic!("moto: truncated listing of {bucket} with continuation token {other:?}:\n{xml}"),
            }
        }
    }

    /// Every object in `bucket` with its raw bytes, sorted by key. Used to prove what does
    /// (and does not) reach the server.
    pub fn dump_bucket(&self, bucket: &str) -> Vec<(String, Vec<u8>)> {
        let mut objects = Vec::new();
        for key in self.list_keys(bucket) {
            // Deleted between the listing and the read (a test racing a live daemon): skip.
            if let Some(data) = self.get_raw(bucket, &key) {
                objects.push((key, data));
            }
        }
        objects
    }

    /// One raw request (`path` already percent-encoded, with its query) with its own
    /// deadline; errors (refused, reset, timed out) are returned, not panicked on.
    pub fn try_request(&self, method: &str, path: &str, body: &[u8], timeout: Duration) -> io::Result<HttpResponse> {
        http_request(self.port, method, path, body, timeout)
    }

    /// SIGKILLs the server and reaps it: its in-memory state is gone. No-op when it is not
    /// running.
    pub fn kill(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = child.take() {
            // Err only when it has already exited, which is what we want anyway.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOPs the server: connections are still accepted by the kernel, but nothing is
    /// answered until [`MotoServer::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP, "pause");
    }

    /// SIGCONTs a paused server.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT, "resume");
    }

    /// Starts the server again on the same port, empty (recreate buckets yourself), and
    /// waits until it answers. A server that is still running is killed first.
    pub fn restart(&mut self) {
        self.kill();
        self.launches += 1;
        let log = self.log_path();
        match launch(&self.binary, self.port, &log, self.launches, self.serial) {
            Ok(child) => *self.child.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(child),
            Err(err) => panic!(
                "moto_server restart on 127.0.0.1:{} {}; log {}:\n{}",
                self.port,
                err.describe(),
                log.display(),
                tail(&log)
            ),
        }
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock_child().as_ref().map(Child::id)
    }

    /// Whether the process is alive (a paused server is running).
    pub fn is_running(&self) -> bool {
        let mut child = self.lock_child();
        match child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_))) => {
                // Exited on its own: reap it now so that nobody signals a recycled pid.
                *child = None;
                false
            }
            Some(Err(e)) => panic!("moto: waitpid failed: {e}"),
            None => false,
        }
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self, sig: libc::c_int, what: &str) {
        let child = self.lock_child();
        let child = child.as_ref().unwrap_or_else(|| panic!("moto: {what}: the server is not running"));
        let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child
        // (the lock is held), so it cannot have been recycled for another process.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "moto: {what} (kill {pid}): {}", io::Error::last_os_error());
    }

    fn request_or_panic(&self, method: &str, path: &str, body: &[u8]) -> HttpResponse {
        self.try_request(method, path, body, REQUEST_TIMEOUT).unwrap_or_else(|e| {
            panic!("moto: {method} {path} on {} failed: {e} (log {})", self.endpoint(), self.log_path().display())
        })
    }

    /// A request that must succeed with a 2xx.
    fn must(&self, method: &str, path: &str, body: &[u8]) -> HttpResponse {
        let resp = self.request_or_panic(method, path, body);
        assert!(resp.is_success(), "moto: {method} {path} answered {}: {}", resp.status, resp.text());
        resp
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            eprintln!("moto: kept the server log {}", self.log_path().display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The `moto_server` to run: `$TIERFS_MOTO_SERVER`, the venv of `scripts/setup-debian.sh`,
/// or `PATH`. Panics with how to install it when there is none.
pub fn moto_server_binary() -> PathBuf {
    // Empty counts as unset, as `${VAR:-default}` does in the setup script.
    let var = |name: &str| env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var("TIERFS_MOTO_SERVER") {
        let path = PathBuf::from(path);
        assert!(is_executable(&path), "TIERFS_MOTO_SERVER={} is not an executable file", path.display());
        return path;
    }
    let tools = var("TIERFS_TOOLS_DIR").map_or_else(|| PathBuf::from(DEFAULT_TOOLS_DIR), PathBuf::from);
    let venv = tools.join("moto-venv/bin/moto_server");
    if is_executable(&venv) {
        return venv;
    }
    if let Some(found) = var("PATH")
        .and_then(|paths| env::split_paths(&paths).map(|dir| dir.join("moto_server")).find(|p| is_executable(p)))
    {
        return found;
    }
    panic!(
        "moto_server not found (looked at $TIERFS_MOTO_SERVER, {}, and PATH): the S3 integration tests \
         run moto's server; install it with scripts/setup-debian.sh, or set TIERFS_MOTO_SERVER to a \
         moto_server binary",
        venv.display()
    );
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A port nobody listens on right now (the kernel's pick for port 0).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr of a bound socket").port()
}

/// A fresh directory under the system temp dir, unique within and across processes.
fn make_temp_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = env::temp_dir().join(format!("tierfs-moto-{}-{n}-{nanos}", std::process::id()));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("moto: create {}: {e}", dir.display()));
    dir
}

/// Runs moto's server with werkzeug's `run_simple` told not to start a thread per request
/// (werkzeug then also speaks HTTP/1.0, one request per connection, so no client can hold
/// the only worker with a kept-alive connection). Arguments as for `moto_server`.
const SERIAL_MOTO: &str = "import sys, werkzeug.serving as serving
run_simple = serving.run_simple
serving.run_simple = lambda *args, **kwargs: run_simple(*args, **dict(kwargs, threaded=False))
from moto.server import main
main(sys.argv[1:])";

/// Spawns `moto_server` on `port` (output appended to `log`) and waits until it answers;
/// `serial`: one request at a time (see [`MotoServer::start_serial`]), with the Python next
/// to the `moto_server` script (its virtualenv), else `python3`.
fn launch(binary: &Path, port: u16, log: &Path, launch: u32, serial: bool) -> Result<Child, LaunchError> {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("moto: open {}: {e}", log.display()));
    let _ = writeln!(out, "--- launch {launch}: {} -H 127.0.0.1 -p {port}", binary.display());
    let err = out.try_clone().unwrap_or_else(|e| panic!("moto: dup log file: {e}"));
    let mut command = if serial {
        let python = binary.with_file_name("python");
        let mut c = Command::new(if python.exists() { python } else { PathBuf::from("python3") });
        c.args(["-c", SERIAL_MOTO]);
        c
    } else {
        Command::new(binary)
    };
    let mut child = command
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        // Unbuffered, so that the log is complete when a test panics.
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("moto: spawn {}: {e}", binary.display()));
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(LaunchError::Exited(status)),
            Ok(None) => {}
            Err(e) => panic!("moto: waitpid failed: {e}"),
        }
        // Ready means S3 answers a ListBuckets: that it is moto, not whatever else might
        // have grabbed the port in the meantime.
        if let Ok(resp) = http_request(port, "GET", "/", b"", Duration::from_secs(2))
            && resp.status == 200
            && resp.text().contains("ListAllMyBucketsResult")
        {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::NotReady);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of a log, for panic messages.
fn tail(log: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(log) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `/bucket/key`, percent-encoded (the slashes of the key stay path separators).
fn object_path(bucket: &str, key: &str) -> String {
    format!("/{}/{}", encode(bucket, false), encode(key, true))
}

/// Percent-encodes everything but RFC 3986's unreserved characters (and `/` when
/// `keep_slash`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// One HTTP/1.1 request to 127.0.0.1:`port`, the whole exchange bounded by `timeout`.
pub fn http_request(port: u16, method: &str, path: &str, body: &[u8], timeout: Duration) -> io::Result<HttpResponse> {
    let deadline = Instant::now() + timeout;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    let timed_out =
        || io::Error::new(io::ErrorKind::TimedOut, format!("{method} {path}: no response within {timeout:?}"));
    let remaining = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
    stream.set_write_timeout(Some(remaining().ok_or_else(timed_out)?))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         Authorization: {FAKE_AUTHORIZATION}\r\n\
         x-amz-content-sha256: UNSIGNED-PAYLOAD\r\n\
         Content-Type: application/octet-stream\r\n\
         Content-Length: {}\r\n\
         Accept-Encoding: identity\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).map_err(|e| if is_timeout(&e) { timed_out() } else { e })?;
    // Read until the response is complete by its own framing, or else until EOF
    // (Connection: close). Not always EOF: werkzeug closes the connection some 10 ms after
    // its answer, which adds up over the thousands of requests of a bucket dump.
    let head_request = method.eq_ignore_ascii_case("HEAD");
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        stream.set_read_timeout(Some(remaining().ok_or_else(timed_out)?))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if response_complete(&raw, head_request) {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(timed_out()),
            Err(e) => return Err(e),
        }
    }
    parse_response(&raw, head_request)
}

/// A socket timeout shows up as WouldBlock on Unix.
fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// How the body of a response ends.
enum Framing {
    /// No body (HEAD, 204, 304).
    Empty,
    Length(usize),
    Chunked,
    /// Neither length nor chunks: the body is everything up to EOF.
    UntilEof,
}

/// The status line and headers of the final (non-1xx) response in `raw`, with the offset
/// of its body and how the body is framed; `None` while the head is incomplete.
fn parse_head(raw: &[u8], head_request: bool) -> io::Result<Option<(HttpResponse, usize, Framing)>> {
    let mut offset = 0;
    loop {
        let Some(end) = find(&raw[offset..], b"\r\n\r\n") else { return Ok(None) };
        let head = String::from_utf8_lossy(&raw[offset..offset + end]).into_owned();
        offset += end + 4;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let bad_status = || invalid(format!("bad status line {status_line:?}"));
        let mut parts = status_line.split_whitespace();
        let status = match (parts.next(), parts.next()) {
            (Some(version), Some(code)) if version.starts_with("HTTP/") => {
                code.parse::<u16>().map_err(|_| bad_status())?
            }
            _ => return Err(bad_status()),
        };
        // An interim response (100 Continue) precedes the real one.
        if (100..200).contains(&status) {
            continue;
        }
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let resp = HttpResponse { status, headers, body: Vec::new() };
        let framing = if head_request || status == 204 || status == 304 {
            Framing::Empty
        } else if resp.header("transfer-encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked")) {
            Framing::Chunked
        } else if let Some(len) = resp.header("content-length") {
            Framing::Length(len.parse().map_err(|_| invalid(format!("bad Content-Length {len:?}")))?)
        } else {
            Framing::UntilEof
        };
        return Ok(Some((resp, offset, framing)));
    }
}

/// Whether `raw` already holds a whole response (one framed by length or chunks).
fn response_complete(raw: &[u8], head_request: bool) -> bool {
    match parse_head(raw, head_request) {
        Ok(Some((_, offset, framing))) => match framing {
            Framing::Empty => true,
            Framing::Length(len) => raw.len() - offset >= len,
            // The last chunk and the (empty) trailer end with an empty line.
            Framing::Chunked => raw.ends_with(b"\r\n\r\n") && decode_chunked(&raw[offset..]).is_ok(),
            Framing::UntilEof => false,
        },
        // Incomplete, or broken: reading on to EOF decides (and parse_response reports).
        _ => false,
    }
}

/// Parses a complete HTTP/1.1 response (everything up to EOF): status, headers, and the
/// body framed by `Transfer-Encoding: chunked`, `Content-Length`, or EOF.
pub fn parse_response(raw: &[u8], head_request: bool) -> io::Result<HttpResponse> {
    let (mut resp, offset, framing) =
        parse_head(raw, head_request)?.ok_or_else(|| invalid("truncated response head"))?;
    let rest = &raw[offset..];
    resp.body = match framing {
        Framing::Empty => Vec::new(),
        Framing::Chunked => decode_chunked(rest)?,
        Framing::Length(len) if rest.len() < len => {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("body truncated: {} of {len} bytes", rest.len()),
            ));
        }
        Framing::Length(len) => rest[..len].to_vec(),
        Framing::UntilEof => rest.to_vec(),
    };
    Ok(resp)
}

/// Decodes a `Transfer-Encoding: chunked` body (extensions and trailers are ignored).
pub fn decode_chunked(mut data: &[u8]) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = find(data, b"\r\n").ok_or_else(|| invalid("truncated chunk size line"))?;
        let line = String::from_utf8_lossy(&data[..eol]);
        let size_hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| invalid(format!("bad chunk size {line:?}")))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(body);
        }
        if data.len() < size + 2 || &data[size..size + 2] != b"\r\n" {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated chunk"));
        }
        body.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The text of every `<name>…</name>` element, in order (an empty `<name/>` is skipped).
/// Enough for S3's flat listing XML; not a general XML parser.
pub fn xml_elements(xml: &str, name: &str) -> Vec<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(after[..end].to_string());
        rest = &after[end + close.len()..];
    }
    out
}

/// Resolves XML's predefined entities and character references.
pub fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let Some(semi) = rest.find(';') else { break };
        let entity = &rest[1..semi];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .or_else(|| entity.strip_prefix("#X"))
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            // Not an entity: keep the '&' literally and go on after it.
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}
