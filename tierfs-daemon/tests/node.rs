//! The node daemon on real mounts and real S3 servers (moto on loopback): one `tierfs-daemon
//! node` serves two workspaces, each on its own server, and a watched directory of a third,
//! from one configuration file.
//! - READY=1 reaches a test `NOTIFY_SOCKET` only once both are mounted;
//! - `/metrics` is well-formed, and its counters move with a workload: FUSE requests and
//!   their errors and latency per operation, store requests and bytes per backend and method,
//!   cache hits;
//! - a server cut off (a proxy in between refuses its connections) shows its mount's circuit
//!   breaker open in the metrics, while the other mount syncs as before, and closed again
//!   once the server is back;
//! - a uid that is not a mount's owner is refused on its control socket with a message, and
//!   the owner is served;
//! - `tierfs mount` hands a mount to the running node daemon, which serves it beside the
//!   others until `tierfs umount`, and reports a failure to start it; `--standalone` opts out;
//! - SIGTERM flushes and unmounts both, sends STOPPING=1 and exits 0;
//! - a mount whose store is away when the node starts is started again once it answers;
//! - `--check` refuses a bad configuration with a message that names what is wrong.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::run;
use moto::MotoServer;
use store_node::Node;

const DAEMON: &str = env!("CARGO_BIN_EXE_tierfs-daemon");
const BUCKET: &str = "tierfs-node";
/// The uid of `nobody`, the second user.
const OTHER_UID: u32 = 65534;

/// A running `tierfs-daemon node`, killed (and its mounts detached) if the test fails.
struct NodeDaemon {
    child: Child,
    log: PathBuf,
    mountpoints: Vec<PathBuf>,
}

impl NodeDaemon {
    /// `tierfs-daemon node --config CONFIG` with its log in `root/node.log` and a test
    /// `NOTIFY_SOCKET` at `root/notify.sock` (returned, waiting up to 120 s per message);
    /// `mountpoints` are detached if still mounted when the daemon is dropped.
    fn start(config: &Path, root: &Path, mountpoints: Vec<PathBuf>) -> (NodeDaemon, UnixDatagram) {
        let notify_path = root.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).expect("binding the notify socket");
        notify.set_read_timeout(Some(Duration::from_secs(120))).expect("notify timeout");
        let log = root.join("node.log");
        let log_file = fs::File::create(&log).expect("creating the node log");
        let mut cmd = store_node::env(Command::new(DAEMON));
        cmd.args(["node", "--config"])
            .arg(config)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file);
        let daemon = NodeDaemon { child: cmd.spawn().expect("starting tierfs-daemon node"), log, mountpoints };
        (daemon, notify)
    }

    /// SIGTERM, then its exit status (within 120 s).
    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) of our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the daemon") {
                return status;
            }
            assert!(Instant::now() < deadline, "the node daemon did not exit after SIGTERM; log:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for m in &self.mountpoints {
            if common::is_mounted(m) {
                common::fusermount_lazy(m);
            }
        }
    }
}

/// A TCP forwarder to a server on loopback that can be cut off: while cut, it accepts and at
/// once closes every connection, and the open ones are shut down.
struct Proxy {
    port: u16,
    on: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn to(upstream: u16) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let on = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (on2, conns2) = (on.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !on2.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let mut guard = conns2.lock().expect("proxy connections");
                for (mut from, mut to) in [
                    (client.try_clone().expect("clone"), server.try_clone().expect("clone")),
                    (server.try_clone().expect("clone"), client.try_clone().expect("clone")),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
                guard.extend([client, server]);
            }
        });
        Proxy { port, on, conns }
    }

    fn cut(&self) {
        self.on.store(false, Ordering::SeqCst);
        for c in self.conns.lock().expect("proxy connections").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.on.store(true, Ordering::SeqCst);
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local address").port()
}

/// `GET path` on the metrics port: the status code and the body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the metrics port");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").expect("sending the request");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("reading the response");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {raw:?}"));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("bad head {head:?}"));
    (code, body.to_owned())
}

/// The samples of a scrape by series (`name{labels}`), after checking the text format
/// (OpenMetrics): every sample belongs to a family declared once with `# HELP` and `# TYPE`
/// right before its samples, counters end in `_total`, every value is a number, and the
/// exposition ends with `# EOF`.
fn parse_scrape(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let text = text.strip_suffix("# EOF\n").unwrap_or_else(|| panic!("no `# EOF` ends the scrape:\n{text}"));
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
            assert!(declared.insert(name.into(), kind.into()).is_none(), "{name} declared twice");
            current = Some((name.into(), kind.into()));
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "unexpected line {line:?}");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        let name = series.split('{').next().unwrap_or_default();
        let (family, kind) = current.as_ref().unwrap_or_else(|| panic!("{line:?} before any TYPE"));
        let expected: Vec<String> = match kind.as_str() {
            "counter" => vec![format!("{family}_total")],
            "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
            _ => vec![family.clone()],
        };
        assert!(expected.iter().any(|e| e == name), "sample {line:?} outside its family {family} ({kind})");
        if kind == "histogram" {
            assert!(family.ends_with("_seconds"), "{family}: a latency histogram in base units");
            assert_eq!(series.contains("le=\""), name.ends_with("_bucket"), "{line:?}: le on buckets only");
        }
        assert!(name.starts_with("tierfs_"), "{name}: not prefixed tierfs_");
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line:?}: value: {e}"));
        assert!(samples.insert(series.to_owned(), value).is_none(), "{series} twice");
    }
    samples
}

/// The value of `name` for the mount of `workspace` (the first series that matches).
fn value(samples: &BTreeMap<String, f64>, name: &str, workspace: &str) -> Option<f64> {
    labelled(samples, name, workspace, "")
}

/// The value of `name` for the mount of `workspace` whose labels also contain `label`
/// (`op="write"`; "" for any): the first series that matches.
fn labelled(samples: &BTreeMap<String, f64>, name: &str, workspace: &str, label: &str) -> Option<f64> {
    series(samples, name, workspace, label).next()
}

/// The values of every series of `name` for the mount of `workspace` whose labels contain `label`.
fn series<'a>(
    samples: &'a BTreeMap<String, f64>,
    name: &'a str,
    workspace: &str,
    label: &'a str,
) -> impl Iterator<Item = f64> + 'a {
    let needle = format!("workspace=\"{workspace}\"");
    samples
        .iter()
        .filter(move |(k, _)| k.split('{').next() == Some(name) && k.contains(&needle) && k.contains(label))
        .map(|(_, v)| *v)
}

fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "{body}");
    parse_scrape(&body)
}

/// Polls the metrics until `want` holds, for at most `timeout`.
fn wait_for(port: u16, timeout: Duration, what: &str, want: impl Fn(&BTreeMap<String, f64>) -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        let samples = scrape(port);
        if want(&samples) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} did not show within {timeout:?}; last scrape:\n{samples:#?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn tierfs_as(uid: u32, runtime_dir: &Path, args: &[&str]) -> common::Output {
    tierfs_beside(uid, runtime_dir, None, args, Duration::from_secs(60))
}

/// `tierfs ARGS` as `uid` with its own `runtime_dir`, and the node daemon's sockets in
/// `node_run` (`TIERFS_NODE_RUNTIME_DIR`) when given.
fn tierfs_beside(
    uid: u32,
    runtime_dir: &Path,
    node_run: Option<&Path>,
    args: &[&str],
    timeout: Duration,
) -> common::Output {
    let mut cmd = Command::new(common::TIERFS);
    cmd.env("TIERFS_RUNTIME_DIR", runtime_dir).env("HOME", "/").args(args);
    if let Some(dir) = node_run {
        cmd.env("TIERFS_NODE_RUNTIME_DIR", dir);
    }
    if uid != 0 {
        cmd.uid(uid);
    }
    run(&mut cmd, timeout)
}

#[test]
fn one_daemon_serves_two_workspaces_with_metrics_readiness_and_access_control() {
    let (server_a, server_b) = (MotoServer::start(), MotoServer::start());
    server_a.create_bucket(BUCKET);
    server_b.create_bucket(BUCKET);
    let a = Node::init(std::slice::from_ref(&server_a), BUCKET, "a");
    // b reaches its server through a proxy that the test cuts.
    let proxy = Proxy::to(server_b.port());
    let b_url = server_b.url(BUCKET, "b").replace(&format!(":{}", server_b.port()), &format!(":{}", proxy.port));
    let b = Node::init_backends(&[b_url], &[]);
    // The second user must reach the node's runtime dir (0755, made by the daemon) through
    // the temporary directory.
    fs::set_permissions(a.fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod the temp dir");
    // b is served by a worker running as its owner, who must reach b's data dir.
    fs::set_permissions(b.fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod the temp dir");
    let root = a.fx.tmp.path().to_path_buf();
    let runtime_dir = root.join("node-run");
    let port = free_port();
    let config = root.join("config.toml");
    // a's reads are what its cache metrics count, so they go through tierfs: FUSE
    // passthrough would serve them in the kernel (that is tested in passthrough.rs).
    // A third workspace, c, on a's store: a watched directory, not a FUSE mount.
    let watched = root.join("watched");
    fs::create_dir_all(&watched).expect("mkdir");
    fs::write(watched.join("before.txt"), b"there before the node").expect("writing in the watched dir");
    fs::write(
        &config,
        format!(
            "[node]\nruntime_dir = {run:?}\nmetrics_addr = \"127.0.0.1:{port}\"\n\n\
             [[mount]]\nmountpoint = {ma:?}\nstore = {sa:?}\nworkspace = \"a\"\ndata_dir = {da:?}\ncache_size = \"1G\"\nno_passthrough = true\n\n\
             [[mount]]\nmountpoint = {mb:?}\nowner = {OTHER_UID}\nstore = {sb:?}\nworkspace = \"b\"\ndata_dir = {db:?}\n\n\
             [[mount]]\nmountpoint = {wc:?}\nwatch = true\nstore = {sa:?}\nworkspace = \"c\"\ndata_dir = {dc:?}\n",
            run = runtime_dir,
            ma = a.fx.mountpoint,
            sa = a.store_file,
            da = a.fx.data_dir,
            mb = b.fx.mountpoint,
            sb = b.store_file,
            db = b.fx.data_dir,
            wc = watched,
            dc = root.join("c-data"),
        ),
    )
    .expect("writing the node config");
    let (mut daemon, notify) =
        NodeDaemon::start(&config, &root, vec![a.fx.mountpoint.clone(), b.fx.mountpoint.clone()]);

    // READY=1 comes once, after both mounts are up.
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).unwrap_or_else(|e| panic!("no READY=1: {e}; log:\n{}", daemon.log_text()));
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(ready.contains("STATUS=3 of 3 mounts live"), "{ready:?}; log:\n{}", daemon.log_text());
    for m in &daemon.mountpoints {
        assert!(common::is_mounted(m), "READY=1 arrived before {} was mounted", m.display());
    }

    let (code, health) = http_get(port, "/healthz");
    assert_eq!(code, 200, "{health}");
    assert!(health.starts_with("ok\n") && health.matches("live ").count() == 3, "{health}");
    assert_eq!(http_get(port, "/nope").0, 404);

    // A workload on both; a snapshot of a.
    let before = scrape(port);
    assert_eq!(value(&before, "tierfs_mount_up", "a"), Some(1.0), "{before:#?}");
    assert_eq!(value(&before, "tierfs_mount_up", "b"), Some(1.0), "{before:#?}");
    assert_eq!(value(&before, "tierfs_mount_up", "c"), Some(1.0), "the watch: {before:#?}");
    assert!(before.keys().any(|k| k.starts_with("tierfs_build_info{version=")), "{before:#?}");
    let data = vec![7u8; 3 << 20];
    fs::write(a.fx.mountpoint.join("weights.bin"), &data).expect("writing on a");
    fs::write(b.fx.mountpoint.join("notes.txt"), b"b's data").expect("writing on b");
    let synced = tierfs_as(0, &runtime_dir, &["sync", "-m", "first", a.fx.mountpoint.to_str().expect("utf-8")]);
    synced.assert_success("tierfs sync of a node mount");
    // The watch syncs its directory too, into its own workspace.
    fs::write(watched.join("during.txt"), vec![5u8; 200_000]).expect("writing in the watched dir");
    tierfs_as(0, &runtime_dir, &["sync", "-m", "watched", watched.to_str().expect("utf-8")])
        .assert_success("tierfs sync of the node's watch");
    let w = scrape(port);
    assert!(
        value(&w, "tierfs_store_uploaded_bytes_total", "c").unwrap_or(0.0) >= 200_000.0,
        "the watch's upload did not count: {w:#?}"
    );
    let after = scrape(port);
    let uploaded = |s: &BTreeMap<String, f64>| value(s, "tierfs_store_uploaded_bytes_total", "a").unwrap_or(0.0);
    assert!(uploaded(&after) - uploaded(&before) >= data.len() as f64, "uploads did not count: {after:#?}");
    assert!(value(&after, "tierfs_last_snapshot_timestamp_seconds", "a").is_some_and(|t| t > 0.0), "{after:#?}");
    assert!(value(&after, "tierfs_inodes", "a") > value(&before, "tierfs_inodes", "a"), "{after:#?}");
    assert_eq!(value(&after, "tierfs_backend_up", "a"), Some(1.0), "{after:#?}");
    assert_eq!(value(&after, "tierfs_lease_held", "a"), Some(1.0), "{after:#?}");
    // FUSE requests, by operation, with their latency; an error is counted as one.
    let writes = labelled(&after, "tierfs_fuse_requests_total", "a", "op=\"write\"").unwrap_or(0.0);
    assert!(writes >= 3.0, "3 MiB in 1 MiB writes at least: {after:#?}");
    let timed = labelled(&after, "tierfs_fuse_request_duration_seconds_count", "a", "op=\"write\"");
    assert_eq!(timed, Some(writes), "every write is timed: {after:#?}");
    // (Only tierfs knows a directory is not empty: the kernel sends this one.)
    fs::create_dir(a.fx.mountpoint.join("full")).expect("mkdir on a");
    fs::write(a.fx.mountpoint.join("full/x"), b"x").expect("writing on a");
    let err = fs::remove_dir(a.fx.mountpoint.join("full")).expect_err("rmdir of a full directory");
    assert_eq!(err.kind(), std::io::ErrorKind::DirectoryNotEmpty, "{err}");
    // A request is counted once its reply is sent: the scrape may come first.
    wait_for(port, Duration::from_secs(30), "the failed rmdir counted", |s| {
        labelled(s, "tierfs_fuse_request_errors_total", "a", "op=\"rmdir\"") == Some(1.0)
    });
    let s = scrape(port);
    assert_eq!(labelled(&s, "tierfs_fuse_requests_total", "b", "op=\"rmdir\""), None, "b had no rmdir: {s:#?}");
    // The kernel asks for security.capability before a write to a file it has not marked
    // clean: a missing attribute is no error.
    let xattr_errors = labelled(&s, "tierfs_fuse_request_errors_total", "a", "op=\"getxattr\"");
    assert!(xattr_errors.unwrap_or(0.0) == 0.0, "ENODATA counted as an error: {s:#?}");
    // The mount clears setuid itself (FUSE_HANDLE_KILLPRIV_V2), so the kernel marks a file it
    // found clean and does not ask again before each write (it did: one GETXATTR per write).
    let asked = |s: &BTreeMap<String, f64>| labelled(s, "tierfs_fuse_requests_total", "a", "op=\"getxattr\"");
    let asked_before = asked(&scrape(port)).unwrap_or(0.0);
    let small = fs::File::create(a.fx.mountpoint.join("small-writes")).expect("creating on a");
    for i in 0..200u64 {
        small.write_all_at(&[i as u8; 4096], i * 4096).expect("a 4 KiB write on a");
    }
    drop(small);
    let asked_after = asked(&scrape(port)).unwrap_or(0.0);
    assert!(asked_after - asked_before <= 2.0, "200 writes asked for xattrs {} times", asked_after - asked_before);
    // Store requests by backend and method, and their bytes.
    let puts = labelled(&after, "tierfs_store_requests_total", "a", "method=\"put\"").unwrap_or(0.0);
    assert!(puts >= 1.0, "{after:#?}");
    let sent = value(&after, "tierfs_store_sent_bytes_total", "a").unwrap_or(0.0);
    assert!(sent >= data.len() as f64, "the uploads' bytes were sent: {after:#?}");
    // A read the page cache does not answer reaches the cache of tierfs: a hit.
    fs::write("/proc/sys/vm/drop_caches", "1").expect("dropping the page cache");
    assert_eq!(fs::read(a.fx.mountpoint.join("weights.bin")).expect("reading on a"), data);
    let s = scrape(port);
    assert!(value(&s, "tierfs_cache_hits_total", "a") > value(&after, "tierfs_cache_hits_total", "a"), "{s:#?}");
    assert!(value(&s, "tierfs_cache_hit_bytes_total", "a").unwrap_or(0.0) >= data.len() as f64, "{s:#?}");

    // b's server is cut off: b's breaker opens, a goes on. (Cut briefly, well within the
    // lease's 30 s, so that b keeps its lease.)
    proxy.cut();
    fs::write(b.fx.mountpoint.join("more.txt"), vec![1u8; 1 << 20]).expect("writing on b while its store is away");
    wait_for(port, Duration::from_secs(60), "b's breaker open", |s| value(s, "tierfs_backend_up", "b") == Some(0.0));
    fs::write(a.fx.mountpoint.join("during.txt"), b"a is not disturbed").expect("writing on a");
    tierfs_as(0, &runtime_dir, &["sync", "-m", "during", a.fx.mountpoint.to_str().expect("utf-8")])
        .assert_success("a syncs while b's store is away");
    // The preemption hook: every mount flushes what it can by the deadline and says so.
    fs::write(a.fx.mountpoint.join("late.txt"), vec![2u8; 300_000]).expect("writing on a");
    let flush = |deadline: &str| {
        let args = ["--json", "flush", "--deadline", deadline];
        let out = tierfs_beside(0, &root.join("nobody-run"), Some(&runtime_dir), &args, Duration::from_secs(90));
        // The report, then (on failure) the error object.
        let mut objects = serde_json::Deserializer::from_str(&out.stdout).into_iter::<serde_json::Value>();
        let json = objects.next().and_then(Result::ok).unwrap_or_default();
        let of = |m: &Path| {
            let m = fs::canonicalize(m).expect("mountpoint");
            json["mounts"]
                .as_array()
                .and_then(|l| l.iter().find(|r| r["mountpoint"] == m.to_str().expect("utf-8")).cloned())
        };
        (out, of(&a.fx.mountpoint).unwrap_or_default(), of(&b.fx.mountpoint).unwrap_or_default())
    };
    let (out, fa, fb) = flush("3");
    assert!(!out.success(), "a flush with b's store away reported success: {}", out.stdout);
    assert_eq!(fa["flushed"], true, "a's flush: {}", out.stdout);
    assert_eq!(fa["dirty_bytes"], 0, "a's flush: {}", out.stdout);
    assert_eq!(fb["flushed"], false, "b's flush with its store away: {}", out.stdout);
    assert!(fb["dirty_bytes"].as_u64().unwrap_or(0) >= 1 << 20, "b's unstored MiB is reported: {}", out.stdout);
    assert!(out.stderr.contains("not all in the store"), "{}", out.stderr);
    let s = scrape(port);
    assert_eq!(value(&s, "tierfs_backend_up", "a"), Some(1.0));
    let failed = |name| series(&s, name, "b", "").sum::<f64>();
    assert!(
        failed("tierfs_store_request_errors_total") + failed("tierfs_store_refused_requests_total") > 0.0,
        "b's failed requests are counted: {s:#?}"
    );
    proxy.restore();
    wait_for(port, Duration::from_secs(120), "b's breaker closed", |s| value(s, "tierfs_backend_up", "b") == Some(1.0));
    let (out, fa, fb) = flush("60");
    out.assert_success("tierfs flush once b's store is back");
    assert_eq!((fa["flushed"].clone(), fb["flushed"].clone()), (true.into(), true.into()), "{}", out.stdout);
    assert_eq!(fb["dirty_bytes"], 0, "{}", out.stdout);

    // Access control: the other user may control b (its owner) but not a.
    let refused = tierfs_as(OTHER_UID, &runtime_dir, &["status", a.fx.mountpoint.to_str().expect("utf-8")]);
    assert!(!refused.success(), "uid {OTHER_UID} got a's status: {}", refused.stdout);
    assert!(refused.stderr.contains(&format!("uid {OTHER_UID} may not control this mount")), "{}", refused.stderr);
    tierfs_as(OTHER_UID, &runtime_dir, &["status", b.fx.mountpoint.to_str().expect("utf-8")])
        .assert_success("the owner's status of b");

    // A user's own `tierfs status` (an empty runtime dir of their own) finds the node's
    // mounts too: all of them for root, only their own for the other user.
    let own_run = root.join("own-run");
    fs::create_dir_all(&own_run).expect("mkdir");
    fs::set_permissions(&own_run, fs::Permissions::from_mode(0o777)).expect("chmod");
    let listed = |uid: u32, args: &[&str]| {
        let args = [&["--json", "status"][..], args].concat();
        let out = tierfs_beside(uid, &own_run, Some(&runtime_dir), &args, Duration::from_secs(60));
        out.assert_success("tierfs status of the node's mounts");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("status JSON");
        let list = if json.is_array() { json.as_array().cloned().unwrap_or_default() } else { vec![json] };
        list.iter().map(|r| PathBuf::from(r["mountpoint"].as_str().expect("mountpoint"))).collect::<Vec<_>>()
    };
    let (ma, mb) = (fs::canonicalize(&a.fx.mountpoint).expect("a"), fs::canonicalize(&b.fx.mountpoint).expect("b"));
    let mc = fs::canonicalize(&watched).expect("c");
    let mut all = listed(0, &[]);
    all.sort();
    let mut want = vec![ma.clone(), mb.clone(), mc];
    want.sort();
    assert_eq!(all, want, "root lists every node mount and the watch");
    assert_eq!(listed(OTHER_UID, &[]), vec![mb.clone()], "the other user lists only their own node mount");
    assert_eq!(listed(0, &[ma.to_str().expect("utf-8")]), vec![ma.clone()], "a node mount's status by its path");

    // Hand-off: while the node daemon runs, `tierfs mount` asks it to serve the mount.
    let handed = root.join("handed");
    fs::create_dir_all(&handed).expect("mkdir");
    let handed_data = root.join("handed-data");
    let (hp, hd) = (handed.to_str().expect("utf-8"), handed_data.to_str().expect("utf-8"));
    let args = ["--json", "mount", "--no-store", "--workspace", "handed", "--data-dir", hd, hp];
    let out = tierfs_beside(0, &own_run, Some(&runtime_dir), &args, Duration::from_secs(120));
    out.assert_success("a mount handed to the node daemon");
    daemon.mountpoints.push(handed.clone());
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("mount JSON");
    assert_eq!(json["pid"], daemon.child.id(), "served by the node daemon: {json}");
    assert!(common::is_mounted(&handed), "{json}");
    fs::write(handed.join("f"), b"handed off").expect("writing on the handed-off mount");
    assert_eq!(fs::read(handed.join("f")).expect("reading"), b"handed off");
    let s = scrape(port);
    assert_eq!(value(&s, "tierfs_mount_up", "handed"), Some(1.0), "{s:#?}");
    assert_eq!(value(&s, "tierfs_mount_up", "a"), Some(1.0), "{s:#?}");
    let again = tierfs_beside(0, &own_run, Some(&runtime_dir), &args, Duration::from_secs(60));
    again.assert_success("re-running the mount command");
    let json: serde_json::Value = serde_json::from_str(again.stdout.trim()).expect("mount JSON");
    assert_eq!(json["already_mounted"], true, "{json}");
    assert_eq!(json["socket"].as_str().map(Path::new).and_then(Path::parent), Some(runtime_dir.as_path()), "{json}");
    // A second mount on the same data dir fails with the node's message, and nothing falls
    // back to a process of its own.
    let other = root.join("handed-2");
    fs::create_dir_all(&other).expect("mkdir");
    let clash = ["mount", "--no-store", "--data-dir", hd, other.to_str().expect("utf-8")];
    let out = tierfs_beside(0, &own_run, Some(&runtime_dir), &clash, Duration::from_secs(60));
    assert!(!out.success(), "two mounts on one data dir: {}", out.stdout);
    assert!(out.stderr.contains("the node daemon could not serve the mount"), "{}", out.stderr);
    assert!(!common::is_mounted(&other));
    // Unmounted: flushed, gone from the metrics, and the node goes on.
    let out = tierfs_beside(0, &own_run, Some(&runtime_dir), &["umount", hp], Duration::from_secs(60));
    out.assert_success("tierfs umount of a handed-off mount");
    assert!(!common::is_mounted(&handed));
    assert!(daemon.child.try_wait().expect("wait").is_none(), "the node daemon exited; log:\n{}", daemon.log_text());
    let s = scrape(port);
    assert_eq!(value(&s, "tierfs_mount_up", "handed"), None, "an unmounted hand-off stays in the metrics: {s:#?}");
    assert_eq!(value(&s, "tierfs_mount_up", "a"), Some(1.0), "{s:#?}");
    // A watch is handed off the same way, and unwatched.
    let hw = root.join("handed-watch");
    fs::create_dir_all(&hw).expect("mkdir");
    fs::write(hw.join("w.txt"), b"watched by the node").expect("writing in the dir to watch");
    let (hwp, hwd) = (hw.to_str().expect("utf-8"), root.join("handed-watch-data"));
    let store = a.store_file.to_str().expect("utf-8");
    let wargs =
        ["--json", "watch", "--store", store, "--workspace", "hw", "--data-dir", hwd.to_str().expect("utf-8"), hwp];
    let out = tierfs_beside(0, &own_run, Some(&runtime_dir), &wargs, Duration::from_secs(120));
    out.assert_success("a watch handed to the node daemon");
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("watch JSON");
    assert_eq!(json["pid"], daemon.child.id(), "served by the node daemon: {json}");
    assert_eq!(value(&scrape(port), "tierfs_mount_up", "hw"), Some(1.0));
    tierfs_beside(0, &own_run, Some(&runtime_dir), &["unwatch", hwp], Duration::from_secs(60))
        .assert_success("tierfs unwatch of a handed-off watch");
    // The watch's session ends on its own thread after `unwatch` answers: until then it shows
    // as stopping (0).
    wait_for(port, Duration::from_secs(30), "the unwatched watch to leave the metrics", |s| {
        value(s, "tierfs_mount_up", "hw").is_none()
    });
    assert!(daemon.child.try_wait().expect("wait").is_none(), "the node daemon exited");
    // --standalone serves it in a process of its own; the data came back.
    let mut standalone = args.to_vec();
    standalone.insert(2, "--standalone");
    let out = tierfs_beside(0, &own_run, Some(&runtime_dir), &standalone, Duration::from_secs(120));
    out.assert_success("tierfs mount --standalone");
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("mount JSON");
    assert_ne!(json["pid"], daemon.child.id(), "--standalone was handed off: {json}");
    assert_eq!(fs::read(handed.join("f")).expect("reading"), b"handed off");
    tierfs_beside(0, &own_run, Some(&runtime_dir), &["umount", hp], Duration::from_secs(60))
        .assert_success("tierfs umount of the standalone mount");

    // SIGTERM: STOPPING=1, both flushed and unmounted, exit 0.
    let status = daemon.terminate();
    let n = notify.recv(&mut buf).expect("STOPPING=1");
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(stopping.starts_with("STOPPING=1\n"), "{stopping:?}");
    let text = daemon.log_text();
    assert!(status.success(), "exit {status}; log:\n{text}");
    // a and b at SIGTERM, and the handed-off mount at its unmount; c stopped watching.
    assert_eq!(text.matches("flushed everything for").count(), 3, "{text}");
    assert!(text.contains(&format!("stopped watching {}", fs::canonicalize(&watched).expect("c").display())), "{text}");
    for m in &daemon.mountpoints {
        assert!(!common::is_mounted(m), "{} still mounted after the node stopped", m.display());
    }
}

#[test]
fn a_mount_that_cannot_start_is_started_again_once_its_store_answers() {
    let server = MotoServer::start();
    server.create_bucket(BUCKET);
    let proxy = Proxy::to(server.port());
    let url = server.url(BUCKET, "r").replace(&format!(":{}", server.port()), &format!(":{}", proxy.port));
    let r = Node::init_backends(&[url], &[]);
    let root = r.fx.tmp.path().to_path_buf();
    let port = free_port();
    let config = root.join("config.toml");
    fs::write(
        &config,
        format!(
            "[node]\nruntime_dir = {run:?}\nmetrics_addr = \"127.0.0.1:{port}\"\n\n\
             [[mount]]\nmountpoint = {m:?}\nstore = {s:?}\nworkspace = \"r\"\ndata_dir = {d:?}\n",
            run = root.join("node-run"),
            m = r.fx.mountpoint,
            s = r.store_file,
            d = r.fx.data_dir,
        ),
    )
    .expect("writing the node config");
    // The store is away when the node starts.
    proxy.cut();
    let (mut daemon, notify) = NodeDaemon::start(&config, &root, vec![r.fx.mountpoint.clone()]);
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).unwrap_or_else(|e| panic!("no READY=1: {e}; log:\n{}", daemon.log_text()));
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.contains("STATUS=0 of 1 mounts live"), "{ready:?}; log:\n{}", daemon.log_text());
    assert_eq!(value(&scrape(port), "tierfs_mount_up", "r"), Some(0.0));
    // Back: the node starts it again (1 s, then 2 s, 4 s, ... between tries).
    proxy.restore();
    wait_for(port, Duration::from_secs(90), "the mount started again", |s| {
        value(s, "tierfs_mount_up", "r") == Some(1.0) && value(s, "tierfs_mount_restarts_total", "r") >= Some(1.0)
    });
    assert!(common::is_mounted(&r.fx.mountpoint));
    fs::write(r.fx.mountpoint.join("f"), b"after the restart").expect("writing on the restarted mount");

    // A handed-off mount that fails while served is started again too: unmounted by hand while
    // its store is away, its final flush fails (what it holds stays in its data dir); once the
    // store answers, it is live again and stores what it held.
    let (handed, hd, own_run) = (root.join("handed"), root.join("handed-data"), root.join("own-run"));
    for dir in [&handed, &own_run] {
        fs::create_dir_all(dir).expect("mkdir");
    }
    daemon.mountpoints.push(handed.clone());
    let utf8 = |p: &Path| p.to_str().expect("utf-8").to_string();
    let (hp, store) = (utf8(&handed), utf8(&r.store_file));
    let hd = utf8(&hd);
    let args = [
        "--json",
        "mount",
        "--store",
        &store,
        "--workspace",
        "h",
        "--data-dir",
        &hd,
        "--dirty-age",
        "600",
        "--flush-timeout",
        "2",
        &hp,
    ];
    let node_run = root.join("node-run");
    tierfs_beside(0, &own_run, Some(&node_run), &args, Duration::from_secs(60)).assert_success("a hand-off");
    fs::write(handed.join("g"), b"held while the store was away").expect("writing on the handed-off mount");
    proxy.cut();
    run(Command::new("umount").arg(&handed), Duration::from_secs(30)).assert_success("umount by hand");
    wait_for(port, Duration::from_secs(60), "the handed-off mount's failure and a retry", |s| {
        value(s, "tierfs_mount_restarts_total", "h") >= Some(1.0) && value(s, "tierfs_mount_up", "h") == Some(0.0)
    });
    proxy.restore();
    wait_for(port, Duration::from_secs(90), "the handed-off mount started again", |s| {
        value(s, "tierfs_mount_up", "h") == Some(1.0)
    });
    assert_eq!(fs::read(handed.join("g")).expect("reading"), b"held while the store was away");
    tierfs_beside(0, &own_run, Some(&node_run), &["sync", &hp], Duration::from_secs(60))
        .assert_success("tierfs sync of the restarted hand-off");
    let status = daemon.terminate();
    let text = daemon.log_text();
    assert!(status.success(), "exit {status}: a mount that came up again and flushed is no failure; log:\n{text}");
    assert!(text.contains("starting it again in 1 s") && text.contains("restarted"), "{text}");
}

fn check(config: &str) -> common::Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("config.toml");
    fs::write(&file, config).expect("writing the config");
    run(Command::new(DAEMON).args(["node", "--check", "--config"]).arg(&file), Duration::from_secs(30))
}

#[test]
fn check_refuses_a_bad_configuration_and_names_the_problem() {
    let good = "[[mount]]\nmountpoint = \"/mnt/x\"\nstore = \"/etc/s.toml\"\ndata_dir = \"/var/d\"\nread_only = true\n";
    let out = check(good);
    out.assert_success("a good configuration");
    assert!(out.stdout.contains("1 mounts") && out.stdout.contains("/mnt/x"), "{}", out.stdout);

    for (config, expected) in [
        ("[[mount]]\nmountpoint = \"/mnt/x\"\ncache_sise = \"1G\"\ndata_dir = \"/d\"\n", "unknown field `cache_sise`"),
        ("[[mount]]\nmountpoint = \"/mnt/x\"\ncache_size = \"lots\"\ndata_dir = \"/d\"\n", "lots"),
        ("[[mount]]\nstore = \"/s\"\n", "no mountpoint"),
        ("[[mount]]\nmountpoint = \"/m\"\nowner = -1\ndata_dir = \"/d\"\n", "owner = -1"),
        ("[node]\nmetrics_addr = \"localhost\"\n", "metrics_addr"),
        ("[node]\nmetrics = \"x\"\n", "unknown field `metrics`"),
        (
            "[[mount]]\nmountpoint = \"/a\"\ndata_dir = \"/d\"\n[[mount]]\nmountpoint = \"/b\"\ndata_dir = \"/d\"\n",
            "share the data dir",
        ),
        (
            "[[mount]]\nmountpoint = \"/a\"\ndata_dir = \"/d1\"\n[[mount]]\nmountpoint = \"/a\"\ndata_dir = \"/d2\"\n",
            "two mounts on /a",
        ),
        ("[[mount]\n", "config.toml"),
    ] {
        let out = check(config);
        assert!(!out.success(), "accepted:\n{config}");
        assert_eq!(out.status.code(), Some(1), "{config}: {}", out.stderr);
        assert!(out.stderr.contains(expected), "{config}: expected {expected:?} in:\n{}", out.stderr);
    }
}

/// The uid and gid of test user `name`, made with `useradd` when missing (another test may be
/// making it at the same moment: "already exists" is no failure).
fn test_user(name: &str) -> (u32, u32) {
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, name]).output().expect("running id");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().expect("an id"))
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args(["--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
            .output()
            .expect("running useradd");
        // 9: the name exists (made meanwhile).
        assert!(out.status.success() || out.status.code() == Some(9), "useradd {name}: {out:?}");
    }
    (id("-u").expect("the user's uid"), id("-g").expect("the user's gid"))
}

/// `PROGRAM ARGS` as user `(uid, gid)` with no other group.
fn as_user(user: (u32, u32), program: &str, args: &[&str]) -> common::Output {
    let mut cmd = Command::new(program);
    cmd.args(args).uid(user.0).gid(user.1).env("HOME", "/");
    run(&mut cmd, Duration::from_secs(120))
}

/// What the issue's owner did, as a test: the owner of a node mount (a real user) tries to
/// make the root daemon write where the owner may not, another user of the node tries to
/// read the owner's files from the data dir, and floods the mount's control socket.
#[test]
fn an_owner_cannot_turn_the_root_daemon_against_the_node_and_others_read_nothing() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (a root node daemon and real users)");
        return;
    }
    let owner = test_user("tierfs-t-owner");
    let other = test_user("tierfs-t-other");
    let a = Node::init_file();
    // Both users must reach the mountpoint and the sockets through the temporary directory.
    fs::set_permissions(a.fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod the temp dir");
    let root = a.fx.tmp.path().to_path_buf();
    // The worker serving the mount runs as its owner: the store's objects must be theirs.
    chown_tree(&root.join("backend"), owner);
    let runtime_dir = root.join("node-run");
    let data_dir = root.join("data");
    // A data dir root made before is handed over to the owner whole.
    fs::create_dir_all(data_dir.join("data")).expect("mkdir");
    // The owner's watched directory, in which root's secret appears (a hard link only root
    // could make there): the watch reads with the owner's rights, so it never uploads it.
    let watched = root.join("watched");
    fs::create_dir(&watched).expect("mkdir");
    fs::write(watched.join("notes.txt"), "the owner's notes\n").expect("writing");
    chown_tree(&watched, owner);
    let root_secret = root.join("root-secret");
    fs::write(&root_secret, "marker-root-7d2e\n").expect("writing");
    fs::set_permissions(&root_secret, fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::hard_link(&root_secret, watched.join("linked-secret")).expect("hard link");
    let config = root.join("config.toml");
    fs::write(
        &config,
        format!(
            "[node]\nruntime_dir = {runtime_dir:?}\nmetrics_addr = \"\"\n\n[[mount]]\nmountpoint = {m:?}\nowner = {o}\n\
             store = {s:?}\nworkspace = \"team\"\ndata_dir = {data_dir:?}\n\n\
             [[mount]]\nmountpoint = {w:?}\nwatch = true\nowner = {o}\nstore = {s:?}\nworkspace = \"watched\"\n\
             data_dir = {wd:?}\n",
            m = a.fx.mountpoint,
            o = owner.0,
            s = a.store_file,
            w = watched,
            wd = root.join("watch-data"),
        ),
    )
    .expect("writing the node config");
    let (mut daemon, notify) = NodeDaemon::start(&config, &root, vec![a.fx.mountpoint.clone()]);
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).unwrap_or_else(|e| panic!("no READY=1: {e}; log:\n{}", daemon.log_text()));
    assert!(String::from_utf8_lossy(&buf[..n]).contains("2 of 2 mounts live"), "log:\n{}", daemon.log_text());
    let m = a.fx.mountpoint.to_str().expect("utf-8").to_owned();
    let tierfs = |user: (u32, u32), args: &[&str]| {
        let run_dir = root.join(format!("run-{}", user.0));
        fs::create_dir_all(&run_dir).expect("mkdir");
        fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
        let mut cmd = Command::new(common::TIERFS);
        cmd.env("TIERFS_RUNTIME_DIR", &run_dir).env("TIERFS_NODE_RUNTIME_DIR", &runtime_dir).env("HOME", "/");
        cmd.args(args).uid(user.0).gid(user.1);
        run(&mut cmd, Duration::from_secs(120))
    };

    // 0. The mount is served by a process running as its owner, not as root; the data dir
    // is the owner's and nobody else's.
    let status = tierfs(owner, &["--json", "status", &m]);
    status.assert_success("the owner's status");
    let pid = serde_json::from_str::<serde_json::Value>(status.stdout.trim()).expect("status JSON")["pid"]
        .as_u64()
        .expect("pid");
    assert_ne!(pid, u64::from(daemon.child.id()), "the root node daemon serves the owner's mount itself");
    let proc_status = fs::read_to_string(format!("/proc/{pid}/status")).expect("the worker's status");
    let uids = proc_status.lines().find(|l| l.starts_with("Uid:")).expect("Uid line").to_owned();
    let want = format!("Uid:\t{o}\t{o}\t{o}\t{o}", o = owner.0);
    assert_eq!(uids, want, "the worker's real, effective, saved and fs uids");
    assert!(proc_status.lines().any(|l| l == format!("Gid:\t{g}\t{g}\t{g}\t{g}", g = owner.1)), "{proc_status}");
    let dumpable = as_user(owner, "cat", &[&format!("/proc/{pid}/environ")]);
    assert!(!dumpable.success(), "the owner reads the worker's environment: {}", dumpable.stdout);
    for entry in walkdir::WalkDir::new(&data_dir) {
        let entry = entry.expect("walking the data dir");
        let meta = entry.path().symlink_metadata().expect("stat");
        assert_eq!(meta.uid(), owner.0, "{} is not the owner's", entry.path().display());
    }

    // The watch: synced with the owner's rights; root's secret is reported unreadable and
    // was never uploaded.
    let w = watched.to_str().expect("utf-8");
    tierfs(owner, &["sync", "-m", "watched", w]).assert_success("the owner's sync of the watch");
    let status = tierfs(owner, &["--json", "status", w]);
    status.assert_success("the watch's status");
    let json: serde_json::Value = serde_json::from_str(status.stdout.trim()).expect("status JSON");
    let unreadable = json["watch"]["unreadable"].to_string();
    assert!(unreadable.contains("linked-secret"), "root's file was read: {}", status.stdout);
    let restored = root.join("restored-watch");
    let mut restore = store_node::env(a.fx.tierfs());
    restore.args(["restore", "--store"]).arg(&a.store_file).args(["--workspace", "watched"]).arg(&restored);
    run(&mut restore, Duration::from_secs(60)).assert_success("restoring the watched workspace");
    assert_eq!(fs::read_to_string(restored.join("notes.txt")).expect("restored"), "the owner's notes\n");
    let leaked = fs::read_to_string(restored.join("linked-secret")).unwrap_or_default();
    assert!(!leaked.contains("marker-root"), "root's secret was uploaded by the watch");

    // A directory of the watched tree swapped for a symlink to a directory outside it (one
    // the owner may read, and root's), back and forth while the watch syncs: nothing from
    // outside reaches the workspace. (Every path is resolved beneath the watched directory,
    // and the worker has the owner's rights only.)
    let outside = root.join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("theirs.txt"), "marker-outside-4b1d\n").expect("writing");
    chown_tree(&outside, owner);
    let roots = root.join("roots-only");
    fs::create_dir(&roots).expect("mkdir");
    fs::write(roots.join("root.txt"), "marker-root-dir-9e3f\n").expect("writing");
    fs::set_permissions(&roots, fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::create_dir(watched.join("sub")).expect("mkdir");
    fs::write(watched.join("sub/mine.txt"), "the owner's sub\n").expect("writing");
    // (Only sub: the hard link to root's secret must stay root's.)
    chown_tree(&watched.join("sub"), owner);
    let racing = Arc::new(AtomicBool::new(true));
    let racer = {
        let (racing, sub, real) = (racing.clone(), watched.join("sub"), watched.join("sub.real"));
        let targets = [outside.clone(), roots.clone()];
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while racing.load(Ordering::SeqCst) {
                let target = &targets[(swaps % 2) as usize];
                if fs::rename(&sub, &real).is_ok() {
                    let _ = std::os::unix::fs::symlink(target, &sub);
                    std::thread::sleep(Duration::from_millis(1));
                    let _ = fs::remove_file(&sub);
                    let _ = fs::rename(&real, &sub);
                    swaps += 1;
                }
            }
            swaps
        })
    };
    let mut snapshots = Vec::new();
    for i in 0..3 {
        let out = tierfs(owner, &["--json", "sync", "-m", &format!("raced {i}"), w]);
        out.assert_success("a sync of the watch during swaps");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("sync JSON");
        snapshots.push(json["snapshot"].as_str().expect("a snapshot id").to_owned());
    }
    racing.store(false, Ordering::SeqCst);
    let swaps = racer.join().expect("the racer");
    assert!(swaps > 0, "no swap happened");
    tierfs(owner, &["sync", "-m", "after the race", w]).assert_success("the sync after the race");
    // Every state the watch stored, during the race and after it: nothing from outside.
    let states = snapshots.iter().map(|id| Some(id.as_str())).chain([None]);
    for (i, snapshot) in states.enumerate() {
        let raced = root.join(format!("restored-raced-{i}"));
        let mut restore = store_node::env(a.fx.tierfs());
        restore.args(["restore", "--store"]).arg(&a.store_file).args(["--workspace", "watched"]);
        if let Some(id) = snapshot {
            restore.args(["--snapshot", id]);
        }
        run(restore.arg(&raced), Duration::from_secs(60)).assert_success("restoring the raced workspace");
        for (rel, path, meta) in common::walk_tree(&raced) {
            if meta.is_file() {
                let text = fs::read(&path).expect("reading the restored file");
                let found = |m: &[u8]| text.windows(m.len()).any(|w| w == m);
                assert!(!found(b"marker-outside") && !found(b"marker-root"), "{rel} came from outside ({snapshot:?})");
            }
        }
        if snapshot.is_none() {
            let mine = fs::read_to_string(raced.join("sub/mine.txt")).expect("restored");
            assert_eq!(mine, "the owner's sub\n", "the final state has sub as it is");
        }
    }

    // The owner's secret, mode 0600, and what the history records.
    let secret = a.fx.mountpoint.join("secret.py");
    fs::write(&secret, "TOKEN = 'marker-5f1c'\n").expect("writing the secret");
    std::os::unix::fs::chown(&secret, Some(owner.0), Some(owner.1)).expect("chown");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::write(a.fx.mountpoint.join("authorized_keys"), "ssh-ed25519 AAAA owner\n").expect("writing");
    fs::write(a.fx.mountpoint.join(".tierfshistory.toml"), "include = [\"authorized_keys\"]\n").expect("writing");
    tierfs(owner, &["sync", "-m", "first", &m]).assert_success("the owner's sync");

    // 1. An export the owner may not write is refused, and nothing appears there.
    let root_only = root.join("root-only");
    fs::create_dir(&root_only).expect("mkdir");
    fs::set_permissions(&root_only, fs::Permissions::from_mode(0o700)).expect("chmod");
    let poc = root_only.join("poc");
    let out = tierfs(owner, &["history", "export", "--mount", &m, poc.to_str().expect("utf-8")]);
    assert!(!out.success(), "the owner exported into a root-only directory: {}", out.stdout);
    assert!(out.stderr.contains("ermission denied"), "{}", out.stderr);
    assert!(!poc.exists(), "the export wrote into a directory only root may write");
    // A push to a path the owner may not write is refused the same way.
    let out = tierfs(owner, &["history", "push", "--mount", &m, root_only.join("r.git").to_str().expect("utf-8")]);
    assert!(!out.success() && !root_only.join("r.git").exists(), "{}\n{}", out.stdout, out.stderr);
    assert_eq!(fs::read_dir(&root_only).expect("listing").count(), 0, "nothing was written as root");
    // Into a directory of the owner's, the export works, and its files are the owner's.
    let mine = root.join("owners");
    fs::create_dir(&mine).expect("mkdir");
    std::os::unix::fs::chown(&mine, Some(owner.0), Some(owner.1)).expect("chown");
    let exported = mine.join("history");
    tierfs(owner, &["history", "export", "--mount", &m, exported.to_str().expect("utf-8")])
        .assert_success("the owner's export into their own directory");
    let keys = exported.join("authorized_keys");
    assert_eq!(fs::read_to_string(&keys).expect("exported"), "ssh-ed25519 AAAA owner\n");
    assert_eq!(fs::metadata(&keys).expect("exported").uid(), owner.0, "written with the owner's rights");

    // 2. Another user reads nothing in the data dir: not a file, not the history.
    let data = data_dir.to_str().expect("utf-8");
    let found = as_user(other, "find", &[data, "-type", "f", "-readable"]);
    assert!(found.stdout.trim().is_empty(), "uid {} reads {}", other.0, found.stdout);
    let git_dir = format!("--git-dir={data}/history.git");
    let shown = as_user(other, "git", &[&git_dir, "show", "HEAD:secret.py"]);
    assert!(!shown.success() && !shown.stdout.contains("marker-5f1c"), "{}", shown.stdout);
    assert_eq!(fs::metadata(&data_dir).expect("data dir").mode() & 0o777, 0o700);
    let cat = as_user(other, "cat", &[secret.to_str().expect("utf-8")]);
    assert!(!cat.success() && !cat.stdout.contains("marker"), "{}", cat.stdout);

    // 3. 10 000 idle connections of the other user to the mount's control socket do not
    // keep the owner's `tierfs status` out.
    let status = tierfs((0, 0), &["--json", "status", &m]);
    status.assert_success("root's status");
    let socket = serde_json::from_str::<serde_json::Value>(status.stdout.trim()).expect("status JSON")["socket"]
        .as_str()
        .expect("socket")
        .to_owned();
    let flood = format!(
        "import socket, sys\nheld = []\nfor _ in range(10000):\n    s = socket.socket(socket.AF_UNIX)\n    \
         s.connect({socket:?})\n    held.append(s)\nprint(len(held), flush=True)\nsys.stdin.read()\n"
    );
    let mut flooder = Command::new("bash")
        .args([
            "-c",
            &format!(
                "ulimit -n 12000 && exec setpriv --reuid={} --regid={} --clear-groups /usr/bin/python3 -c \"$0\"",
                other.0, other.1
            ),
            &flood,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the flood");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(flooder.stdout.as_mut().expect("the flood's stdout")),
        &mut line,
    )
    .expect("reading the flood's count");
    assert_eq!(line.trim(), "10000", "the flood did not open its connections");
    let started = Instant::now();
    tierfs(owner, &["status", &m]).assert_success("the owner's status during the flood");
    eprintln!("the owner's status took {:?} during the flood", started.elapsed());
    drop(flooder.stdin.take());
    let _ = flooder.wait();

    assert!(daemon.terminate().success(), "log:\n{}", daemon.log_text());
}

/// Gives `dir` and everything beneath it to `user`.
fn chown_tree(dir: &Path, user: (u32, u32)) {
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry.expect("walking");
        std::os::unix::fs::lchown(entry.path(), Some(user.0), Some(user.1)).expect("chown");
    }
}

/// A key file or a store file that other users can read is refused with the `chmod` that
/// fixes it, and accepted once it is private.
#[test]
fn a_key_file_or_store_file_others_can_read_is_refused() {
    let fx = common::Fixture::new();
    let store = fx.tmp.path().join("store.toml");
    let key = fx.tmp.path().join("store.key");
    let url = format!("file://{}", fx.tmp.path().join("backend").display());
    let mut init = fx.tierfs();
    init.args(["init", "--store"]).arg(&store).arg("--key-file").arg(&key).args(["--backend", &url]);
    run(&mut init, Duration::from_secs(60)).assert_success("tierfs init");
    let scrub = || {
        let mut cmd = fx.tierfs();
        cmd.args(["scrub", "--store"]).arg(&store);
        run(&mut cmd, Duration::from_secs(60))
    };
    scrub().assert_success("scrub with private files");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = scrub();
    assert!(!out.success(), "a world-readable key file was used");
    assert!(out.stderr.contains("key file") && out.stderr.contains("chmod 600"), "{}", out.stderr);
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::set_permissions(&store, fs::Permissions::from_mode(0o640)).expect("chmod");
    let out = scrub();
    assert!(!out.success(), "a group-readable store file was used");
    assert!(out.stderr.contains("store file") && out.stderr.contains("chmod 600"), "{}", out.stderr);
    fs::set_permissions(&store, fs::Permissions::from_mode(0o600)).expect("chmod");
    scrub().assert_success("scrub once both are private again");
}
