//! Crash consistency with a store: `kill -9` at a random point of a write workload, the
//! node's disk lost, and a fresh node restoring the workspace from the store (moto on
//! loopback).
//!
//! Each round makes a new store, mounts node A on it and runs a seeded workload from a
//! worker thread: appends of 1 B .. 3 MiB to six files in two directories (each file's
//! content is a deterministic byte stream, so byte `o` of a file is known whatever happens),
//! one in three followed by an fsync of the file, plus new empty files and directories, most
//! followed by an fsync of their parent. After a random delay the daemon is killed with
//! SIGKILL, A's data directory is removed, and node B mounts the store with an empty data
//! dir and `--takeover` (A's lease has not expired). What B must show:
//! - every file that was fsynced exists, and its first `fsynced_len` bytes are the stream
//!   (with `--fsync remote`, the default, fsync returns once data and metadata are stored);
//! - every file that exists holds exactly the stream's first `len` bytes, with `len` no
//!   longer than what was written: never zeros or foreign bytes (the restore cuts a file back
//!   to the data that reached the store);
//! - every directory and empty file whose parent was fsynced after its creation exists;
//! - the names are a prefix of the creations (metadata reaches the store as one ordered
//!   journal): no name exists while an earlier-created one is missing, and every name created
//!   before the last fsync that returned exists.
//!
//! The seed is printed; `TIERFS_TEST_SEED=<seed>` replays the same workloads and kill delays
//! (the kill point still depends on timing). On failure both daemon logs are printed.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::IntoRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use common::Rng;
use moto::MotoServer;
use store_node::Node;

const BUCKET: &str = "tierfs-crash";

/// Rounds per run, each with a new store and its own kill point.
const ROUNDS: usize = 5;
/// Directories made (and fsynced) before the workload starts.
const DIRS: [&str; 2] = ["a", "b"];
/// The files the workload appends to.
const FILES: [&str; 6] = ["a/f0", "a/f1", "a/f2", "b/f3", "b/f4", "b/f5"];
/// The longest single append.
const MAX_APPEND: u64 = 3 << 20;
/// When the kill comes, after the workload starts.
const KILL_AFTER_MS: (u64, u64) = (300, 2000);
/// Lines of each daemon log shown with a failure.
const LOG_TAIL: usize = 150;

/// `len` bytes of file `key`'s stream from offset `start`. Word `w` (bytes `8w..8w+8`) is
/// the `w+1`-th output of `Rng::new(key)`, computed directly, so any range is cheap.
fn stream(key: u64, start: u64, len: usize) -> Vec<u8> {
    let skip = (start % 8) as usize;
    let mut word = start / 8;
    let mut out = Vec::with_capacity(skip + len + 8);
    while out.len() < skip + len {
        let seed = key.wrapping_add(word.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        out.extend_from_slice(&Rng::new(seed).next_u64().to_le_bytes());
        word += 1;
    }
    out.truncate(skip + len);
    out.drain(..skip);
    out
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

/// What the workload did to one file.
#[derive(Debug, Default, Clone)]
struct FileLog {
    /// The stream of the file; `None` for an empty file that is never written.
    key: Option<u64>,
    /// Bytes of every append that was started (acknowledged or in flight at the kill).
    attempted: u64,
    /// The length at the last acknowledged close.
    closed: u64,
    /// The length at the last fsync that returned.
    fsynced: Option<u64>,
    closes: usize,
    fsyncs: usize,
}

/// A name the workload created.
#[derive(Debug, Clone)]
struct Created {
    path: String,
    dir: bool,
    /// The create / mkdir returned.
    acked: bool,
    /// An fsync of its parent directory returned after it.
    fsynced: bool,
}

/// The workload's record, shared with the test thread.
#[derive(Debug, Default)]
struct Log {
    files: BTreeMap<String, FileLog>,
    /// Directories the workload made (beyond `DIRS`).
    dirs: BTreeSet<String>,
    /// Every name created, in order (the last one may be in flight at the kill).
    created: Vec<Created>,
    /// How many of `created` were acknowledged when the last fsync or fsyncdir returned.
    covered: usize,
    /// One line per step, for failure messages.
    history: Vec<String>,
    steps: usize,
    fsyncs: usize,
    bytes: u64,
    /// The error that stopped the workload, and whether the kill had been ordered by then.
    error: Option<(String, bool)>,
    /// What the workload saw go wrong before the kill that was not an I/O error.
    anomalies: Vec<String>,
}

fn lock(log: &Mutex<Log>) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(PoisonError::into_inner)
}

/// close(2) with its error reported (a silent close would hide a failed write-back).
fn close(f: File) -> io::Result<()> {
    let fd = f.into_raw_fd();
    // SAFETY: closing the descriptor we own (taken out of the File above).
    if unsafe { libc::close(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn append(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().append(true).create(true).open(path)?;
    for chunk in data.chunks(256 << 10) {
        f.write_all(chunk)?;
    }
    close(f)
}

/// open + fsync + close of a file or directory; returns the size it had.
fn fsync(path: &Path) -> io::Result<u64> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    f.sync_all()?;
    close(f)?;
    Ok(len)
}

fn random_len(rng: &mut Rng) -> u64 {
    match rng.range(0, 3) {
        0 => rng.range(1, 4097),
        1 => rng.range(4097, 256 << 10),
        _ => rng.range(256 << 10, MAX_APPEND + 1),
    }
}

/// Runs steps until an operation fails (the kill) or the kill is ordered.
fn workload(root: &Path, keys: &[u64], rng: &mut Rng, log: &Mutex<Log>, killed: &AtomicBool) -> io::Result<()> {
    let mut parents: Vec<String> = DIRS.iter().map(|d| d.to_string()).collect();
    let mut step = 0;
    loop {
        if killed.load(Ordering::SeqCst) {
            return Ok(());
        }
        step += 1;
        lock(log).steps = step;
        let roll = rng.range(0, 100);
        if roll < 80 {
            let i = rng.range(0, FILES.len() as u64) as usize;
            let path = FILES[i];
            let len = random_len(rng);
            let start = {
                let mut l = lock(log);
                if !l.files.contains_key(path) {
                    l.created.push(Created { path: path.into(), dir: false, acked: false, fsynced: false });
                }
                let f =
                    l.files.entry(path.into()).or_insert_with(|| FileLog { key: Some(keys[i]), ..FileLog::default() });
                let start = f.attempted;
                f.attempted += len;
                l.history.push(format!("#{step} append {path} [{start}..{})", start + len));
                start
            };
            append(&root.join(path), &stream(keys[i], start, len as usize))?;
            {
                let mut l = lock(log);
                if let Some(c) = l.created.iter_mut().find(|c| c.path == path) {
                    c.acked = true;
                }
                let f = l.files.get_mut(path).expect("logged above");
                f.closed = start + len;
                f.closes += 1;
                l.bytes += len;
            }
            if rng.chance(1, 3) {
                lock(log).history.push(format!("#{step} fsync {path} at {}", start + len));
                let size = fsync(&root.join(path))?;
                let mut l = lock(log);
                if size != start + len && !killed.load(Ordering::SeqCst) {
                    l.anomalies
                        .push(format!("#{step}: {path} has size {size} before its fsync, {} written", start + len));
                }
                let f = l.files.get_mut(path).expect("logged above");
                f.fsynced = Some(start + len);
                f.fsyncs += 1;
                l.fsyncs += 1;
                l.covered = l.created.len();
            }
        } else {
            let dir = roll >= 90;
            let parent = parents[rng.range(0, parents.len() as u64) as usize].clone();
            let path = join(&parent, &format!("{}{step:04}", if dir { "d" } else { "e" }));
            {
                let mut l = lock(log);
                l.created.push(Created { path: path.clone(), dir, acked: false, fsynced: false });
                if dir {
                    l.dirs.insert(path.clone());
                } else {
                    l.files.insert(path.clone(), FileLog::default());
                }
                l.history.push(format!("#{step} {} {path}", if dir { "mkdir" } else { "create empty" }));
            }
            if dir {
                fs::create_dir(root.join(&path))?;
                parents.push(path.clone());
            } else {
                close(OpenOptions::new().write(true).create_new(true).open(root.join(&path))?)?;
            }
            lock(log).created.last_mut().expect("pushed above").acked = true;
            if rng.chance(3, 4) {
                lock(log).history.push(format!("#{step} fsyncdir {parent}"));
                fsync(&root.join(&parent))?;
                let mut l = lock(log);
                l.created.last_mut().expect("pushed above").fsynced = true;
                l.fsyncs += 1;
                l.covered = l.created.len();
            }
        }
    }
}

/// What the restored mount shows.
#[derive(Debug)]
enum Seen {
    Dir,
    File(Vec<u8>),
    Other,
}

fn observe(root: &Path) -> BTreeMap<String, Seen> {
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let seen = if m.is_dir() {
                Seen::Dir
            } else if m.is_file() {
                let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {rel}: {e}"));
                assert_eq!(bytes.len() as u64, m.len(), "{rel}: size and contents disagree");
                Seen::File(bytes)
            } else {
                Seen::Other
            };
            (rel, seen)
        })
        .collect()
}

/// Where and how `bytes` leave file `key`'s stream, if they do.
fn stream_mismatch(bytes: &[u8], key: u64, keys: &[u64]) -> Option<String> {
    let want = stream(key, 0, bytes.len());
    let at = bytes.iter().zip(&want).position(|(a, b)| a != b)?;
    let zeros = bytes[at..].iter().take_while(|&&b| b == 0).count();
    let probe = &bytes[at..bytes.len().min(at + 64)];
    let foreign = keys.iter().position(|&k| k != key && stream(k, at as u64, probe.len()) == probe);
    let what = if zeros > 0 {
        format!("{zeros} zero bytes there")
    } else if let Some(other) = foreign {
        format!("the bytes of {} at that offset", FILES[other])
    } else {
        format!("garbage ({:02x?}...)", &probe[..probe.len().min(8)])
    };
    let wrong = bytes.iter().zip(&want).filter(|(a, b)| a != b).count();
    Some(format!("first difference from its stream at byte {at} (chunk {}): {what}; {wrong} bytes differ", at >> 22))
}

/// Everything B shows that breaks the promises (see the module comment), and a summary.
fn check(seen: &BTreeMap<String, Seen>, log: &Log, keys: &[u64]) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut summary = Vec::new();
    for (path, s) in seen {
        if DIRS.contains(&path.as_str()) || log.dirs.contains(path) {
            if !matches!(s, Seen::Dir) {
                problems.push(format!("{path}: a directory was made there, B shows {s:?}"));
            }
            continue;
        }
        let Some(f) = log.files.get(path) else {
            problems.push(format!("{path}: never created, yet B shows it"));
            continue;
        };
        let Seen::File(bytes) = s else {
            problems.push(format!("{path}: a file, B shows {s:?}"));
            continue;
        };
        let len = bytes.len() as u64;
        if len > f.attempted {
            problems.push(format!("{path}: {len} bytes, longer than the {} ever written", f.attempted));
        }
        match f.key {
            Some(key) => {
                if let Some(why) = stream_mismatch(bytes, key, keys) {
                    problems.push(format!("{path} ({len} bytes): {why}"));
                }
            }
            None if len > 0 => problems.push(format!("{path}: created empty, never written, B shows {len} bytes")),
            None => {}
        }
    }
    for (path, f) in log.files.iter().filter(|(_, f)| f.key.is_some()) {
        let restored = match seen.get(path) {
            Some(Seen::File(bytes)) => bytes.len().to_string(),
            _ => "nothing".to_owned(),
        };
        summary.push(format!(
            "{path}: written {} (closed at {} after {} closes), fsynced at {:?} ({} fsyncs), restored {restored}",
            f.attempted, f.closed, f.closes, f.fsynced, f.fsyncs
        ));
    }
    for d in DIRS {
        if !seen.contains_key(d) {
            problems.push(format!("{d}: made and fsynced before the workload, missing on B"));
        }
    }
    for (path, f) in &log.files {
        if let Some(synced) = f.fsynced {
            match seen.get(path) {
                Some(Seen::File(bytes)) if bytes.len() as u64 >= synced => {}
                Some(Seen::File(bytes)) => problems.push(format!(
                    "{path}: fsynced at {synced} bytes, B shows only {} (lost {} fsynced bytes)",
                    bytes.len(),
                    synced - bytes.len() as u64
                )),
                other => problems.push(format!("{path}: fsynced at {synced} bytes, B shows {other:?}")),
            }
        }
    }
    for c in log.created.iter().filter(|c| c.fsynced && !seen.contains_key(&c.path)) {
        let kind = if c.dir { "directory" } else { "empty file" };
        problems.push(format!("{}: {kind} whose parent was fsynced after its creation, missing on B", c.path));
    }
    for c in log.created[..log.covered].iter().filter(|c| !c.fsynced && !seen.contains_key(&c.path)) {
        problems.push(format!(
            "{}: created before an fsync that returned, missing on B (not a prefix of the journal)",
            c.path
        ));
    }
    if let Some(first_missing) = log.created.iter().position(|c| !seen.contains_key(&c.path)) {
        for c in log.created[first_missing + 1..].iter().filter(|c| seen.contains_key(&c.path)) {
            problems.push(format!(
                "{}: exists on B though {} was created before it and is missing (names are not a prefix)",
                c.path, log.created[first_missing].path
            ));
        }
    }
    let restored = log.created.iter().filter(|c| seen.contains_key(&c.path)).count();
    summary.push(format!(
        "names: {} created ({} acknowledged, {} covered by an fsync), {restored} restored",
        log.created.len(),
        log.created.iter().filter(|c| c.acked).count(),
        log.covered
    ));
    (problems, summary)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The workload steps that name one of the paths in `problems`, and the last few steps.
fn relevant_history(log: &Log, problems: &[String]) -> String {
    let paths: BTreeSet<&str> =
        problems.iter().filter_map(|p| p.split([':', ' ']).next()).filter(|p| !p.is_empty()).collect();
    let last = log.history.len().saturating_sub(10);
    log.history
        .iter()
        .enumerate()
        .filter(|(i, h)| *i >= last || paths.iter().any(|p| h.ends_with(p) || h.contains(&format!("{p} "))))
        .map(|(_, h)| format!("  {h}\n"))
        .collect()
}

struct Report<'a> {
    seed: u64,
    round: usize,
    a_log: &'a str,
}

impl Report<'_> {
    fn fail(&self, what: &str, b_log: Option<&str>) -> ! {
        panic!(
            "seed {} (TIERFS_TEST_SEED={} replays), round {}: {what}\n\
             ---- node A daemon.log (last {LOG_TAIL} lines) ----\n{}\n\
             ---- node B daemon.log (last {LOG_TAIL} lines) ----\n{}\n",
            self.seed,
            self.seed,
            self.round,
            tail(self.a_log, LOG_TAIL),
            b_log.map_or_else(|| "(B not started)".to_owned(), |l| tail(l, LOG_TAIL)),
        )
    }
}

fn round(seed: u64, round: usize, rng: &mut Rng) {
    let started = Instant::now();
    let keys: Vec<u64> = FILES.iter().map(|_| rng.next_u64()).collect();
    let worker_seed = rng.next_u64();
    let delay = Duration::from_millis(rng.range(KILL_AFTER_MS.0, KILL_AFTER_MS.1 + 1));

    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "crash");
    if let Some(out) = Some(a.try_mount(&[])).filter(|o| !o.success()) {
        out.assert_success("tierfs mount --store (node A)");
    }
    for d in DIRS {
        fs::create_dir(a.fx.p(d)).expect("mkdir");
    }
    fsync(&a.fx.mountpoint).expect("fsync of the root");
    let prepared = started.elapsed();

    let log = Arc::new(Mutex::new(Log::default()));
    let killed = Arc::new(AtomicBool::new(false));
    let worker = {
        let (root, keys, log, killed) = (a.fx.mountpoint.clone(), keys.clone(), log.clone(), killed.clone());
        thread::spawn(move || {
            let mut rng = Rng::new(worker_seed);
            if let Err(e) = workload(&root, &keys, &mut rng, &log, &killed) {
                let after_kill = killed.load(Ordering::SeqCst);
                let mut l = lock(&log);
                let step = l.history.last().cloned().unwrap_or_default();
                l.error = Some((format!("{step}: {e}"), after_kill));
            }
        })
    };
    let kill_at = Instant::now() + delay;
    while Instant::now() < kill_at && !worker.is_finished() {
        thread::sleep(Duration::from_millis(5));
    }
    killed.store(true, Ordering::SeqCst);
    a.kill9();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !worker.is_finished() {
        assert!(Instant::now() < deadline, "round {round}: the workload is still stuck 60 s after the kill");
        thread::sleep(Duration::from_millis(10));
    }
    if let Err(panic) = worker.join() {
        std::panic::resume_unwind(panic);
    }
    let log = std::mem::take(&mut *lock(&log));
    let a_log = a.daemon_log();
    let report = Report { seed, round, a_log: &a_log };
    if let Some((error, false)) = &log.error {
        report.fail(&format!("the workload failed before the kill: {error}"), None);
    }
    if !log.anomalies.is_empty() {
        report.fail(&format!("the workload saw before the kill: {:#?}", log.anomalies), None);
    }
    println!(
        "round {round}: killed after {delay:?}: {} steps, {} MiB appended, {} fsyncs returned; the workload then saw: {}",
        log.steps,
        log.bytes >> 20,
        log.fsyncs,
        log.error.as_ref().map_or("nothing (stopped)", |(e, _)| e.as_str())
    );

    // The runtime reset: A's disk is gone; B starts from the store alone.
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    let restore_started = Instant::now();
    if let Some(out) = Some(b.try_mount(&["--takeover"])).filter(|o| !o.success()) {
        report.fail(
            &format!("node B did not mount ({}):\nstdout: {}\nstderr: {}", out.status, out.stdout, out.stderr),
            Some(&b.daemon_log()),
        );
    }
    let seen = observe(&b.fx.mountpoint);
    let restored_in = restore_started.elapsed();
    let (problems, summary) = check(&seen, &log, &keys);
    for line in &summary {
        println!("round {round}:   {line}");
    }
    if !problems.is_empty() {
        report.fail(
            &format!(
                "node B breaks the crash promises:\n{problems:#?}\nworkload steps naming those paths, and the last \
                 ones:\n{}",
                relevant_history(&log, &problems)
            ),
            Some(&b.daemon_log()),
        );
    }
    b.fx.umount();
    println!(
        "round {round}: ok ({} entries on B; setup {prepared:?}, restore and read {restored_in:?}, round {:?})",
        seen.len(),
        started.elapsed()
    );
}

#[test]
fn kill_9_at_random_points_leaves_every_fsynced_file_intact_on_a_fresh_node() {
    let seed = Rng::seed_from_env();
    println!("remote_crash seed {seed} (TIERFS_TEST_SEED={seed} replays the workloads)");
    let mut rng = Rng::new(seed);
    for r in 0..ROUNDS {
        round(seed, r, &mut rng);
    }
}
