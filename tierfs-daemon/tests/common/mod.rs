//! Shared fixtures of the real-mount integration tests: a temporary workspace (data
//! directory, mountpoint, runtime directory) mounted with the real `tierfs` binary, in the
//! background (`tierfs mount`, which returns once the mount is ready) or in the foreground
//! (`tierfs mount --foreground` as a child process, for `kill -9`).
//!
//! Invariants:
//! - a [`Fixture`] never leaves a mount behind: its `Drop` asks `tierfs umount`, falls back to
//!   `fusermount3 -u -z`, and kills (by pid) a daemon that is still alive, so a failing test
//!   cleans up while it unwinds;
//! - every command runs with a deadline ([`run`]), so a hung mount fails the test instead of
//!   hanging the run;
//! - each fixture has its own runtime directory (`TIERFS_RUNTIME_DIR`), so tests running in
//!   parallel, or a developer's own mounts, never see each other's control sockets.
//!
//! The tests need root and `/dev/fuse`; without them they fail with a message saying so
//! (CI has FUSE, so a missing device is a broken environment, not a reason to skip).

#![allow(dead_code)] // each test binary uses its own subset of the helpers

use std::ffi::CString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The `tierfs` binary under test.
pub const TIERFS: &str = env!("CARGO_BIN_EXE_tierfs");

/// How long a mount may take to become ready (RocksDB open, FUSE handshake).
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `tierfs umount` may take (flush, unmount, daemon exit).
pub const UMOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// Fails the test unless it can mount: root and a FUSE device.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests mount tierfs for real and need the FUSE device \
         (load the fuse module, or run the container with --device /dev/fuse)"
    );
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "the real-mount tests run as root (they chown and mount)");
}

/// The output of a finished command.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with everything the command printed unless it succeeded.
    pub fn assert_success(&self, what: &str) -> &Output {
        assert!(self.success(), "{what} failed ({}):\nstdout: {}\nstderr: {}", self.status, self.stdout, self.stderr);
        self
    }
}

fn drain<R: Read + Send + 'static>(mut reader: R) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = reader.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `cmd` to completion, killing it (by pid) if it outlives `timeout`.
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let description = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {description}: {e}"));
    let out = drain(child.stdout.take().expect("piped stdout"));
    let err = drain(child.stderr.take().expect("piped stderr"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for a child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().expect("reaping a killed child");
            let stderr = err.join().unwrap_or_default();
            panic!("{description} did not finish within {timeout:?} ({status}); stderr:\n{stderr}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    // A background daemon never holds our pipes (its output goes to its log), so these end.
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

/// Whether `path` is a mount point in this mount namespace (per `/proc/self/mountinfo`).
pub fn is_mounted(path: &Path) -> bool {
    let table = fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    let wanted = escape_mountinfo(path);
    table.lines().any(|line| line.split(' ').nth(4) == Some(wanted.as_str()))
}

fn escape_mountinfo(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.push_str(&format!("\\{b:03o}")),
            _ => out.push(b as char),
        }
    }
    out
}

/// `fusermount3 -u -z MOUNTPOINT` (lazy: works on a dead or busy mount).
pub fn fusermount_lazy(mountpoint: &Path) -> Output {
    run(Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint), Duration::from_secs(30))
}

/// Whether process `pid` still exists (a zombie counts as gone, once its last thread is
/// gone too: a killed group leader turns zombie while its other threads still exit, and
/// until the last one has, the process's files, and so its locks, stay open).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            let threads = fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
            !matches!(state, Some('Z') | Some('X') | None) || threads > 1
        }
        Err(_) => false,
    }
}

/// A temporary workspace: `data/`, `mnt/` and `run/` in one temporary directory, plus the
/// pid of the background daemon serving `mnt/` while it is mounted.
pub struct Fixture {
    pub data_dir: PathBuf,
    pub mountpoint: PathBuf,
    pub runtime_dir: PathBuf,
    /// Pid of the background daemon of the current mount, if this fixture mounted one.
    pub daemon_pid: Option<u32>,
    /// Extra `tierfs mount` options of every mount of this fixture (e.g. `--writeback-cache`).
    pub mount_args: Vec<String>,
    /// Declared last: removed only after `Drop::drop` has unmounted.
    pub tmp: tempfile::TempDir,
}

impl Fixture {
    /// A fresh workspace, not mounted yet.
    pub fn new() -> Fixture {
        require_fuse();
        let tmp = tempfile::Builder::new().prefix("tierfs-it-").tempdir().expect("creating a temporary directory");
        let root = fs::canonicalize(tmp.path()).expect("resolving the temporary directory");
        let fixture = Fixture {
            data_dir: root.join("data"),
            mountpoint: root.join("mnt"),
            runtime_dir: root.join("run"),
            daemon_pid: None,
            mount_args: Vec::new(),
            tmp,
        };
        fs::create_dir(&fixture.mountpoint).expect("creating the mountpoint");
        fixture
    }

    /// A fresh workspace mounted in the background.
    pub fn mounted() -> Fixture {
        let mut fixture = Fixture::new();
        fixture.mount();
        fixture
    }

    /// A fresh workspace mounted in the background with extra `tierfs mount` options.
    pub fn mounted_with(args: &[&str]) -> Fixture {
        let mut fixture = Fixture::new();
        fixture.mount_args = args.iter().map(|a| (*a).to_owned()).collect();
        fixture.mount();
        fixture
    }

    /// A `tierfs` command that uses this fixture's runtime directory.
    pub fn tierfs(&self) -> Command {
        let mut cmd = Command::new(TIERFS);
        cmd.env("TIERFS_RUNTIME_DIR", &self.runtime_dir).env_remove("TIERFS_DATA_DIR");
        cmd
    }

    /// `tierfs mount --json --data-dir DATA MOUNTPOINT`, without checking the outcome.
    pub fn try_mount_at(&self, data_dir: &Path, mountpoint: &Path) -> Output {
        let mut cmd = self.tierfs();
        cmd.args(["--json", "mount"]).args(&self.mount_args).arg("--data-dir").arg(data_dir).arg(mountpoint);
        run(&mut cmd, MOUNT_TIMEOUT)
    }

    /// Mounts the workspace in the background; panics with the command's output on failure.
    pub fn mount(&mut self) {
        let out = self.try_mount_at(&self.data_dir.clone(), &self.mountpoint.clone());
        out.assert_success("tierfs mount");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("tierfs mount --json printed {:?}: {e}", out.stdout));
        assert_eq!(json["ok"], true, "{json}");
        let pid = json["pid"].as_u64().unwrap_or_else(|| panic!("no pid in {json}"));
        self.daemon_pid = Some(u32::try_from(pid).expect("pid fits u32"));
        assert!(is_mounted(&self.mountpoint), "tierfs mount returned but {} is not mounted", self.mountpoint.display());
    }

    /// `tierfs umount MOUNTPOINT`, without checking the outcome.
    pub fn try_umount(&self) -> Output {
        let mut cmd = self.tierfs();
        cmd.arg("umount").arg(&self.mountpoint);
        run(&mut cmd, UMOUNT_TIMEOUT)
    }

    /// Unmounts cleanly: `tierfs umount` must succeed, the mount must be gone and the daemon
    /// must have exited (so the data directory is free again).
    pub fn umount(&mut self) {
        self.try_umount().assert_success("tierfs umount");
        assert!(!is_mounted(&self.mountpoint), "{} still mounted after tierfs umount", self.mountpoint.display());
        if let Some(pid) = self.daemon_pid.take() {
            assert!(!process_alive(pid), "daemon pid {pid} still running after tierfs umount");
        }
    }

    /// Unmounts and mounts the same data directory again.
    pub fn remount(&mut self) {
        self.umount();
        self.mount();
    }

    /// A path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mountpoint.join(rel)
    }

    /// `tierfs status --json MOUNTPOINT`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let mut cmd = self.tierfs();
        cmd.args(["status", "--json"]).arg(&self.mountpoint);
        let out = run(&mut cmd, Duration::from_secs(30));
        out.assert_success("tierfs status");
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("status printed {:?}: {e}", out.stdout))
    }

    /// Starts `tierfs mount --foreground` for this workspace and waits for it to report the
    /// mount ready. The child *is* the serving process.
    pub fn spawn_foreground(&self) -> ForegroundMount {
        let log = self.tmp.path().join("foreground.log");
        let log_file = fs::OpenOptions::new().create(true).append(true).open(&log).expect("opening the foreground log");
        let mut cmd = self.tierfs();
        cmd.args(["--json", "mount", "--foreground", "--data-dir"])
            .arg(&self.data_dir)
            .arg(&self.mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file));
        let mut child = cmd.spawn().expect("starting tierfs mount --foreground");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let reader = thread::spawn(move || read_ready_line(stdout, tx));
        let line = match rx.recv_timeout(MOUNT_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log_text = fs::read_to_string(&log).unwrap_or_default();
                panic!("tierfs mount --foreground did not report ready in {MOUNT_TIMEOUT:?}; log:\n{log_text}");
            }
        };
        let Some(line) = line else {
            let status = child.wait().expect("reaping tierfs mount --foreground");
            let log_text = fs::read_to_string(&log).unwrap_or_default();
            panic!("tierfs mount --foreground exited ({status}) before the mount was ready; log:\n{log_text}");
        };
        let json: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("readiness line {line:?}: {e}"));
        assert_eq!(json["pid"].as_u64(), Some(u64::from(child.id())), "the foreground child serves: {json}");
        assert!(is_mounted(&self.mountpoint), "foreground mount reported ready but is not in the mount table");
        ForegroundMount { child: Some(child), mountpoint: self.mountpoint.clone(), log, _reader: reader }
    }
}

/// Sends the first stdout line (the readiness JSON), or `None` at end of file, then keeps
/// reading so the child never writes into a closed pipe.
fn read_ready_line(stdout: ChildStdout, tx: mpsc::Sender<Option<String>>) {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let first = match reader.read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().to_owned()),
    };
    let _ = tx.send(first);
    let _ = io::copy(&mut reader, &mut io::sink());
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            let out = self.try_umount();
            if !out.success() || is_mounted(&self.mountpoint) {
                eprintln!("cleanup: tierfs umount {} failed: {}", self.mountpoint.display(), out.stderr.trim());
                let lazy = fusermount_lazy(&self.mountpoint);
                if !lazy.success() {
                    eprintln!("cleanup: fusermount3 -u -z failed: {}", lazy.stderr.trim());
                }
            }
        }
        if let Some(pid) = self.daemon_pid.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while process_alive(pid) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            if process_alive(pid) {
                eprintln!("cleanup: daemon pid {pid} still alive after unmount; killing it");
                // SAFETY: kill(2) on the pid of the daemon this fixture started.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// A `tierfs mount --foreground` child serving the fixture's mountpoint.
pub struct ForegroundMount {
    child: Option<Child>,
    pub mountpoint: PathBuf,
    /// The child's stderr (its log).
    pub log: PathBuf,
    _reader: JoinHandle<()>,
}

impl ForegroundMount {
    /// What the serving process has logged so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("the foreground child was already reaped")
    }

    /// `kill -9` the serving process, reap it, and detach the dead mount it leaves behind.
    pub fn kill9(&mut self) -> ExitStatus {
        let status = self.kill9_leaving_the_dead_mount();
        self.unmount_dead();
        status
    }

    /// SIGKILL and reap, leaving the dead mount in the mount table, where every call fails
    /// (ENOTCONN): a program still writing there must be stopped before [`Self::unmount_dead`],
    /// or its next call would land in the directory beneath.
    pub fn kill9_leaving_the_dead_mount(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the foreground child was already reaped");
        // SAFETY: kill(2) on our own, not yet reaped, child.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0, "kill -9 {}: {}", child.id(), io::Error::last_os_error());
        child.wait().expect("reaping the killed child")
    }

    /// Lazily unmounts the dead mount a [`Self::kill9_leaving_the_dead_mount`] left.
    pub fn unmount_dead(&self) {
        if is_mounted(&self.mountpoint) {
            fusermount_lazy(&self.mountpoint).assert_success("fusermount3 -u -z of the dead mount");
        }
        assert!(!is_mounted(&self.mountpoint), "the dead mount is still in the mount table");
    }

    /// SIGTERM (clean shutdown: flush and unmount), waiting up to `timeout` for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("the foreground child was already reaped");
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("waiting for the foreground child") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let status = child.wait();
                panic!("tierfs mount --foreground ignored SIGTERM for {timeout:?} ({status:?})");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ForegroundMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if is_mounted(&self.mountpoint) {
            let _ = fusermount_lazy(&self.mountpoint);
        }
    }
}

/// A path as a C string, for raw libc calls.
pub fn cpath(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path without NUL bytes")
}

/// setxattr(2); returns its return value (check `errno()` on -1).
pub fn setxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> i64 {
    let (p, n) = (cpath(path), CString::new(name).expect("xattr name"));
    // SAFETY: valid C strings and a value buffer of the given length.
    (unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }) as i64
}

/// getxattr with a probe for the size first, as programs do.
pub fn getxattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (p, n) = (cpath(path), CString::new(name).expect("xattr name"));
    // SAFETY: a NULL buffer of size 0 asks for the value's size.
    let size = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; size as usize];
    // SAFETY: buf is valid for buf.len() bytes.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(got as usize);
    Ok(buf)
}

/// Creates (or truncates) `path` with `data` and fsyncs it; returns its inode number.
pub fn write_synced(path: &Path, data: &[u8]) -> u64 {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let mut f = fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    f.sync_all().unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
    f.metadata().expect("fstat").ino()
}

/// Where the hot tier keeps the data file of inode `ino` of the data dir `data_dir`
/// (docs/ARCHITECTURE.md, "Data"), for tests that damage it behind tierfs's back.
pub fn data_file(data_dir: &Path, ino: u64) -> PathBuf {
    data_dir.join("data").join(format!("{:02x}", ino & 0xff)).join(format!("{ino:016x}"))
}

/// The errno of the last failed libc call.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Asserts that a libc call returned -1 with `expected` errno.
#[track_caller]
pub fn assert_errno(rc: i64, expected: i32, what: &str) {
    let err = io::Error::last_os_error();
    assert_eq!(rc, -1, "{what}: expected failure with errno {expected}, got rc {rc}");
    assert_eq!(
        err.raw_os_error(),
        Some(expected),
        "{what}: expected {} but got {err}",
        io::Error::from_raw_os_error(expected)
    );
}

/// Asserts that an `io::Result` failed with `expected` errno.
#[track_caller]
pub fn assert_io_errno<T: std::fmt::Debug>(result: io::Result<T>, expected: i32, what: &str) {
    match result {
        Ok(v) => panic!("{what}: expected {} but it succeeded: {v:?}", io::Error::from_raw_os_error(expected)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(expected),
            "{what}: expected {} but got {e}",
            io::Error::from_raw_os_error(expected)
        ),
    }
}

/// A small deterministic generator (splitmix64): tests print their seed, so a failure can
/// be replayed exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed from `TIERFS_TEST_SEED` if set, else from the clock.
    pub fn seed_from_env() -> u64 {
        match std::env::var("TIERFS_TEST_SEED") {
            Ok(text) => text.trim().parse().unwrap_or_else(|e| panic!("TIERFS_TEST_SEED={text:?}: {e}")),
            Err(_) => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
            }
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo < hi, "empty range {lo}..{hi}");
        lo + self.next_u64() % (hi - lo)
    }

    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.range(0, denominator) < numerator
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.fill(&mut buf);
        buf
    }
}

/// What a tree walk compares of an entry besides its metadata: its kind and its body (a
/// file's blake3 hash, a symlink's target; empty for the rest).
pub fn kind_and_body(path: &Path, m: &fs::Metadata) -> (&'static str, String) {
    use std::os::unix::fs::FileTypeExt;
    let ft = m.file_type();
    if ft.is_dir() {
        ("dir", String::new())
    } else if ft.is_symlink() {
        ("symlink", fs::read_link(path).expect("readlink").display().to_string())
    } else if ft.is_file() {
        ("file", blake3::hash(&fs::read(path).expect("read")).to_hex().to_string())
    } else if ft.is_fifo() {
        ("fifo", String::new())
    } else {
        ("other", String::new())
    }
}

/// Every entry under `root`: relative path → kind and contents (hashed) or link target.
pub fn manifest(root: &Path) -> std::collections::BTreeMap<String, String> {
    walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let (kind, body) = kind_and_body(&path, &m);
            (rel, format!("{kind} {body}"))
        })
        .collect()
}

/// Every entry under `root`, recursively, symlinks not followed: its path relative to `root`
/// (`dir/name`), its full path and its `lstat`. Panics (naming the path) on any error.
pub fn walk_tree(root: &Path) -> Vec<(String, PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(root.join(&dir)).unwrap_or_else(|e| panic!("readdir {dir:?}: {e}")) {
            let entry = entry.expect("directory entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if dir.is_empty() { name } else { format!("{dir}/{name}") };
            let m = fs::symlink_metadata(entry.path()).unwrap_or_else(|e| panic!("lstat {rel}: {e}"));
            if m.is_dir() {
                stack.push(rel.clone());
            }
            out.push((rel, entry.path(), m));
        }
    }
    out
}

/// Runs `f` in a forked child process and returns its exit code. `f` runs between fork and
/// `_exit` in a copy of a multi-threaded process, so it must only make async-signal-safe
/// calls (raw syscalls; no allocation, no locks, no panics).
pub fn in_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only runs `f` (async-signal-safe by contract) and then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        let code = f();
        // SAFETY: leaving the child without running any destructor or atexit handler.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "child did not exit normally (status {status:#x})");
    libc::WEXITSTATUS(status)
}

/// errno inside a forked child (no allocation).
pub fn child_errno() -> i32 {
    // SAFETY: reading the thread's errno location.
    unsafe { *libc::__errno_location() }
}

/// Polls `tierfs status` until it reports `want` inodes (release is asynchronous in FUSE:
/// close(2) returns before tierfs hears of it).
#[track_caller]
pub fn wait_for_inodes(fx: &Fixture, want: u64, what: &str) {
    wait_for_status(fx, "inodes", want, what);
}

#[track_caller]
pub fn wait_for_status(fx: &Fixture, field: &str, want: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = fx.status()[field].as_u64().unwrap_or_else(|| panic!("no {field} in status"));
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: status says {field} = {got}, expected {want}");
        thread::sleep(Duration::from_millis(50));
    }
}
