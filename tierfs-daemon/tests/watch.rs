//! `tierfs watch DIR` end to end, with real inotify, real directories, the real daemon and a
//! real `file://` store: changes reach the workspace by events alone; a storm of edits,
//! renames, removals, links, a symlink loop, a fifo and a sparse file, then `tierfs sync`, then
//! every local state wiped, restores identical both ways, into an empty directory by `watch`
//! and through a FUSE mount; bad directories and a second watcher are refused with nothing
//! changed; with no inotify watches left the watch falls back to full passes and says so.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::run;
use store_node::{Node, env};

const MIB: u64 = 1 << 20;

/// One test at a time: one of them lowers a kernel-wide inotify limit for a moment.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn exclusive() -> OneAtATime {
    OneAtATime(ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

/// A node's watch of `dir`. The watcher it starts is killed when the test ends, however it
/// ends (a Fixture only knows of FUSE mounts).
fn watch(node: &Node, dir: &Path, extra: &[&str]) -> (common::Output, serde_json::Value) {
    let mut cmd = env(node.fx.tierfs());
    cmd.args(["--json", "watch", "--store"]).arg(&node.store_file).arg("--data-dir").arg(&node.fx.data_dir);
    cmd.args(extra).arg(dir);
    let out = run(&mut cmd, common::MOUNT_TIMEOUT);
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or(serde_json::Value::Null);
    if let Some(pid) = json["pid"].as_u64() {
        WATCHERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(pid as libc::pid_t);
    }
    (out, json)
}

/// Watchers started by this test binary's tests.
static WATCHERS: std::sync::Mutex<Vec<libc::pid_t>> = std::sync::Mutex::new(Vec::new());

/// Held by each test: at its end, every watcher still running is killed.
struct OneAtATime(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Drop for OneAtATime {
    fn drop(&mut self) {
        for pid in WATCHERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain(..) {
            if common::process_alive(pid as u32) {
                // SAFETY: kill(2) of a watcher this binary started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// A node's watch of `dir` started while `/proc/sys/fs/inotify/KNOB` is `value` (the watcher
/// reads the limit as it sets up), the limit restored right after. `None`, the test skipping,
/// without root.
fn watch_under_limit(node: &Node, dir: &Path, knob: &str, value: &str) -> Option<(common::Output, serde_json::Value)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: lowering fs.inotify.{knob} needs root");
        return None;
    }
    let path = PathBuf::from("/proc/sys/fs/inotify").join(knob);
    let saved = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {knob}: {e}"));
    fs::write(&path, value).unwrap_or_else(|e| panic!("lower {knob}: {e}"));
    let started = watch(node, dir, &[]);
    fs::write(&path, saved.trim()).unwrap_or_else(|e| panic!("restore {knob}: {e}"));
    Some(started)
}

fn tierfs(node: &Node, args: &[&str], dir: &Path) -> common::Output {
    let mut cmd = env(node.fx.tierfs());
    cmd.args(args).arg(dir);
    run(&mut cmd, Duration::from_secs(180))
}

fn status(node: &Node, dir: &Path) -> serde_json::Value {
    let out = tierfs(node, &["status", "--json"], dir);
    out.assert_success("tierfs status");
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("status printed {:?}: {e}", out.stdout))
}

fn unwatch(node: &Node, dir: &Path, pid: u64) {
    tierfs(node, &["unwatch"], dir).assert_success("tierfs unwatch");
    assert!(!common::process_alive(pid as u32), "the watcher {pid} still runs after unwatch");
}

/// Waits until `what` holds of the watch's status, or panics with the last status.
fn wait_for(node: &Node, dir: &Path, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(node, dir);
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: not within 60 s; status {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kind, mode, links, size, mtime and content (or target) of every entry under `root`.
fn describe(root: &Path) -> BTreeMap<String, String> {
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let (kind, body) = common::kind_and_body(&path, &m);
            let mtime =
                if kind == "symlink" { String::new() } else { format!(" mtime {}.{:09}", m.mtime(), m.mtime_nsec()) };
            let size = if kind == "dir" { String::new() } else { format!(" size {}", m.size()) };
            (
                rel,
                format!(
                    "{kind} {:o} nlink {}{size}{mtime} {body}",
                    m.mode(),
                    if kind == "dir" { 0 } else { m.nlink() }
                ),
            )
        })
        .collect()
}

/// The storm: what a notebook user and their tools do to a directory, fast.
fn storm(dir: &Path) {
    for i in 0..300 {
        fs::write(dir.join(format!("f{i}")), format!("file {i}")).expect("write");
    }
    // 3000 renames: each file moves ten times.
    for round in 0..10 {
        for i in 0..300 {
            fs::rename(dir.join(format!("f{i}")), dir.join(format!("f{i}.{round}"))).expect("rename");
            fs::rename(dir.join(format!("f{i}.{round}")), dir.join(format!("f{i}"))).expect("rename back");
        }
    }
    fs::create_dir_all(dir.join("a/b/c")).expect("mkdir -p");
    for i in 0..20 {
        fs::write(dir.join(format!("a/b/c/n{i}")), vec![i as u8; 1000 + i]).expect("write");
    }
    fs::create_dir_all(dir.join("tree/x")).expect("mkdir");
    fs::write(dir.join("tree/x/old"), b"old").expect("write");
    fs::remove_dir_all(dir.join("tree")).expect("rm -rf");
    fs::create_dir_all(dir.join("tree/x")).expect("mkdir again");
    fs::write(dir.join("tree/x/new"), b"new").expect("write");
    fs::rename(dir.join("a/b"), dir.join("moved")).expect("rename dir");
    fs::write(dir.join("moved/c/after-move"), b"written after the move").expect("write into the moved dir");
    fs::hard_link(dir.join("f1"), dir.join("a/f1-link")).expect("link");
    std::os::unix::fs::symlink("loop-b", dir.join("loop-a")).expect("symlink");
    std::os::unix::fs::symlink("loop-a", dir.join("loop-b")).expect("symlink");
    std::os::unix::fs::symlink("a/f1-link", dir.join("to-link")).expect("symlink");
    let fifo = common::cpath(&dir.join("pipe"));
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");
    let sparse = fs::File::create(dir.join("disk.img")).expect("create");
    sparse.write_all_at(b"boot", 0).expect("write");
    sparse.write_all_at(b"end", 12 * MIB).expect("write past a hole of chunks");
    let run = dir.join("run.sh");
    fs::write(&run, b"#!/bin/sh\necho ok\n").expect("write");
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).expect("chmod");
    for i in 200..300 {
        fs::remove_file(dir.join(format!("f{i}"))).expect("rm");
    }
}

#[test]
fn a_watched_storm_restores_identical_by_watch_and_by_mount_after_a_reset() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("before.txt"), b"there before the watch").expect("write");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    let pid = json["pid"].as_u64().expect("pid");

    // Events alone (the next full pass is minutes away) bring a change in.
    let read = |s: &serde_json::Value| s["watch"]["totals"]["files_read"].as_u64().unwrap_or(0);
    let before = read(&status(&node, &dir));
    fs::write(dir.join("by-event.txt"), b"seen by inotify").expect("write");
    let s = wait_for(&node, &dir, "the event's pass", |s| read(s) > before);
    assert_eq!(s["watch"]["mode"], "events", "{s}");

    storm(&dir);
    let out = tierfs(&node, &["sync", "-m", "storm"], &dir);
    out.assert_success("tierfs sync");
    let want = describe(&dir);
    unwatch(&node, &dir, pid);

    // The reset: every local state of tierfs gone; a fresh node watches an empty directory.
    node.wipe_local_state();
    let fresh = Node::new(&node.store_file);
    let dir2 = fresh.fx.tmp.path().join("watched");
    fs::create_dir(&dir2).expect("mkdir");
    let (out, json) = watch(&fresh, &dir2, &[]);
    out.assert_success("tierfs watch on a fresh node");
    assert_eq!(describe(&dir2), want, "restored by watch");
    let alloc = fs::metadata(dir2.join("disk.img")).expect("stat").blocks() * 512;
    assert!(alloc < 4 * MIB, "the restored sparse file allocates {alloc} bytes");
    let s = status(&fresh, &dir2);
    assert!(s["watch"]["start"].as_str().unwrap_or("").starts_with("restored"), "{s}");
    unwatch(&fresh, &dir2, json["pid"].as_u64().expect("pid"));

    // And through FUSE, on another fresh node.
    let mut mount = Node::new(&node.store_file);
    mount.mount(&[]);
    assert_eq!(describe(&mount.fx.mountpoint), want, "seen by a FUSE mount");
    mount.fx.umount();
}

#[test]
fn bad_directories_and_a_second_watcher_are_refused_and_nothing_changes() {
    let _one = exclusive();
    let node = Node::init_file();
    let missing = node.fx.tmp.path().join("missing");
    let (out, _) = watch(&node, &missing, &[]);
    assert!(!out.success() && out.stderr.contains("no such directory"), "{}", out.stderr);
    assert!(!missing.exists(), "watch created the missing directory");

    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("mine.txt"), b"mine").expect("write");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    let (out, _) = watch(&node, &dir, &["--data-dir", node.fx.tmp.path().join("data2").to_str().expect("utf-8")]);
    assert!(!out.success(), "a second watcher of the same directory: {}", out.stdout);
    // A watched directory is not a mount: `mount` and `umount` say so, `unwatch --lazy` has
    // nothing to detach.
    let mut cmd = env(node.fx.tierfs());
    cmd.args(["--json", "mount", "--store"]).arg(&node.store_file).arg("--data-dir").arg(&node.fx.data_dir).arg(&dir);
    let out = run(&mut cmd, common::MOUNT_TIMEOUT);
    assert!(!out.success() && out.stderr.contains("already watched"), "mount of a watched directory: {out:?}");
    assert!(out.stdout.contains("\"kind\":\"conflict\""), "mount of a watched directory: {}", out.stdout);
    let out = tierfs(&node, &["umount"], &dir);
    assert!(!out.success() && out.stderr.contains("tierfs unwatch"), "umount of a watched directory: {out:?}");
    let out = tierfs(&node, &["unwatch", "--lazy"], &dir);
    assert!(!out.success() && out.stderr.contains("--lazy"), "unwatch --lazy: {out:?}");
    assert_eq!(status(&node, &dir)["allow_other"], false, "a watch lets no other user in through tierfs");
    // The preemption hook on a watch: a pass over the directory, then everything to the store.
    fs::write(dir.join("late.txt"), vec![3u8; 200_000]).expect("write");
    let out = tierfs(&node, &["--json", "flush", "--deadline", "60"], &dir);
    out.assert_success("tierfs flush of a watched directory");
    let flushed: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("flush JSON");
    assert_eq!(flushed["mounts"][0]["flushed"], true, "{flushed}");
    assert_eq!(status(&node, &dir)["cold"]["dirty_bytes"], 0, "the late file is in the store after the flush");
    unwatch(&node, &dir, json["pid"].as_u64().expect("pid"));

    // A directory with other files than the workspace has: refused, untouched.
    let other = node.fx.tmp.path().join("other");
    fs::create_dir(&other).expect("mkdir");
    fs::write(other.join("theirs.txt"), b"theirs").expect("write");
    let before = describe(&other);
    let (out, _) = watch(&node, &other, &[]);
    assert!(!out.success() && out.stderr.contains("does not hold this workspace"), "{}", out.stderr);
    assert_eq!(describe(&other), before);

    // The data dir inside the watched directory would sync tierfs's own writes.
    let (out, _) = watch(&node, node.fx.tmp.path(), &[]);
    assert!(!out.success() && out.stderr.contains("must not contain each other"), "{}", out.stderr);
}

/// With no inotify watch left, the watch falls back to full passes, says so, and still syncs.
#[test]
fn without_inotify_watches_the_watch_falls_back_to_full_passes() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir_all(dir.join("sub")).expect("mkdir");
    let Some((out, json)) = watch_under_limit(&node, &dir, "max_user_watches", "1") else { return };
    out.assert_success("tierfs watch with no watches left");
    let s = status(&node, &dir);
    assert_eq!(s["watch"]["mode"], "rescan-only", "{s}");
    assert!(s["watch"]["fallback_reason"].as_str().is_some_and(|r| !r.is_empty()), "{s}");
    fs::write(dir.join("sub/late.txt"), b"found by a full pass").expect("write");
    let read = |s: &serde_json::Value| s["watch"]["totals"]["files_read"].as_u64().unwrap_or(0);
    let s = wait_for(&node, &dir, "a full pass finds the new file", |s| read(s) >= 1);
    assert!(s["watch"]["full_passes"].as_u64().unwrap_or(0) >= 2, "found without a full pass: {s}");
    unwatch(&node, &dir, json["pid"].as_u64().expect("pid"));
}

/// Mode changes: a read-only FUSE mount of the watched workspace, on a data dir of its own
/// beside the running watcher, shows the latest synced state; and watch mode takes over a
/// workspace a FUSE mount wrote last.
#[test]
fn a_read_only_mount_beside_the_watcher_shows_the_synced_state_and_watch_takes_over_a_mounted_workspace() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir_all(dir.join("src")).expect("mkdir");
    fs::write(dir.join("src/train.py"), b"print('v1')\n").expect("write");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    fs::write(dir.join("src/train.py"), b"print('v2')\n").expect("write");
    fs::write(dir.join("notes.md"), b"synced").expect("write");
    tierfs(&node, &["sync", "-m", "v2"], &dir).assert_success("tierfs sync");
    let synced = describe(&dir);

    let mut ro = Node::new(&node.store_file);
    ro.mount(&["--read-only"]);
    assert_eq!(describe(&ro.fx.mountpoint), synced, "the read-only mount beside the watcher");
    let err = fs::write(ro.fx.mountpoint.join("new.txt"), b"x").expect_err("a write on a read-only mount");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    ro.fx.umount();
    unwatch(&node, &dir, json["pid"].as_u64().expect("pid"));

    // A FUSE mount writes next; then a watch of a fresh, empty directory takes the workspace
    // over with what the mount wrote.
    let mut rw = Node::new(&node.store_file);
    rw.mount(&[]);
    fs::write(rw.fx.mountpoint.join("src/train.py"), b"print('v3 from the mount')\n").expect("write");
    rw.sync("v3").assert_success("tierfs sync on the mount");
    let mounted = describe(&rw.fx.mountpoint);
    rw.fx.umount();
    let fresh = Node::new(&node.store_file);
    let dir2 = fresh.fx.tmp.path().join("taken-over");
    fs::create_dir(&dir2).expect("mkdir");
    let (out, json) = watch(&fresh, &dir2, &[]);
    out.assert_success("tierfs watch of a workspace a mount wrote last");
    assert_eq!(describe(&dir2), mounted, "the watch restored what the mount wrote");
    unwatch(&fresh, &dir2, json["pid"].as_u64().expect("pid"));
}

/// An overflow of the kernel's event queue (the watcher stopped while a burst of changes
/// arrives, with a queue of 16 events): the watch says so in `status`, falls back to full
/// passes, and every file of the burst is synced all the same.
#[test]
fn an_overflowed_event_queue_falls_back_to_full_passes_and_misses_nothing() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir_all(dir.join("sub")).expect("mkdir");
    // The queue's length is fixed when the watcher opens its inotify instance.
    let Some((out, json)) = watch_under_limit(&node, &dir, "max_queued_events", "16") else { return };
    out.assert_success("tierfs watch");
    let pid = json["pid"].as_u64().expect("pid") as libc::pid_t;
    assert_eq!(status(&node, &dir)["watch"]["mode"], "events", "on events before the burst");
    // SAFETY: kill(2) of the watcher this test started; SIGCONT follows.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let n = 500;
    for i in 0..n {
        fs::write(dir.join(format!("sub/burst-{i:04}")), format!("file {i}")).expect("write");
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let read = |s: &serde_json::Value| s["watch"]["totals"]["files_read"].as_u64().unwrap_or(0);
    let s = wait_for(&node, &dir, "every file of the burst read", |s| read(s) >= n);
    assert_eq!(s["watch"]["mode"], "rescan-only", "{s}");
    assert!(
        s["watch"]["fallback_reason"].as_str().is_some_and(|r| r.contains("overflow")),
        "status names the overflow: {s}"
    );
    tierfs(&node, &["sync", "-m", "after the overflow"], &dir).assert_success("tierfs sync");
    unwatch(&node, &dir, pid as u64);
    // What the store holds: the whole burst, on a fresh node.
    let fresh = Node::new(&node.store_file);
    let dir2 = fresh.fx.tmp.path().join("restored");
    fs::create_dir(&dir2).expect("mkdir");
    let (out, json) = watch(&fresh, &dir2, &[]);
    out.assert_success("tierfs watch restoring");
    for i in [0, n / 2, n - 1] {
        assert_eq!(fs::read_to_string(dir2.join(format!("sub/burst-{i:04}"))).expect("restored"), format!("file {i}"));
    }
    assert_eq!(fs::read_dir(dir2.join("sub")).expect("readdir").count() as u64, n, "every file of the burst is back");
    unwatch(&fresh, &dir2, json["pid"].as_u64().expect("pid"));
}

/// kill -9 of the watcher: a restart on the same data dir resumes without reading or
/// uploading what did not change, and nothing synced before is lost.
#[test]
fn a_watcher_killed_with_sigkill_resumes_without_reading_again_and_loses_nothing_synced() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir_all(dir.join("ckpt")).expect("mkdir");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    for i in 0..100 {
        fs::write(dir.join(format!("ckpt/step-{i}.pt")), vec![i as u8; 10_000 + i]).expect("write");
    }
    tierfs(&node, &["sync", "-m", "before the kill"], &dir).assert_success("tierfs sync");
    let pid = json["pid"].as_u64().expect("pid") as libc::pid_t;
    // SAFETY: kill(2) of the watcher this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::process_alive(pid as u32) {
        assert!(Instant::now() < deadline, "the watcher survived SIGKILL");
        std::thread::sleep(Duration::from_millis(20));
    }

    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch after kill -9");
    let s = status(&node, &dir);
    assert_eq!(s["watch"]["start"], "resumed", "{s}");
    let totals = &s["watch"]["totals"];
    assert_eq!((totals["files_read"].as_u64(), totals["chunks_uploaded"].as_u64()), (Some(0), Some(0)), "{s}");
    fs::write(dir.join("after-restart.txt"), b"after").expect("write");
    tierfs(&node, &["sync", "-m", "after the restart"], &dir).assert_success("tierfs sync");
    let want = describe(&dir);
    unwatch(&node, &dir, json["pid"].as_u64().expect("pid"));

    let fresh = Node::new(&node.store_file);
    let dir2 = fresh.fx.tmp.path().join("watched");
    fs::create_dir(&dir2).expect("mkdir");
    let (out, json) = watch(&fresh, &dir2, &[]);
    out.assert_success("tierfs watch on a fresh node");
    assert_eq!(describe(&dir2), want);
    unwatch(&fresh, &dir2, json["pid"].as_u64().expect("pid"));
}

/// Watch mode records the same history as a mount: `tierfs sync DIR` commits the changed
/// code, `tierfs log` (run inside DIR) shows it, and `checkout` writes into DIR, where the
/// watcher picks it up for the next sync.
#[test]
fn a_watched_directory_has_a_history() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("train.py"), "epochs = 1\n").expect("write");
    fs::write(dir.join("data.bin"), [1u8; 100]).expect("write");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    let pid = json["pid"].as_u64().expect("a number");
    let sync = |message: &str| {
        let out = tierfs(&node, &["--json", "sync", "-m", message], &dir);
        out.assert_success("tierfs sync DIR");
        serde_json::from_str::<serde_json::Value>(out.stdout.trim()).expect("JSON")
    };
    assert!(sync("one")["history"]["commit"].is_string());
    fs::write(dir.join("train.py"), "epochs = 2\n").expect("write");
    assert!(sync("two")["history"]["commit"].is_string());
    let log = |path: &str| {
        let mut cmd = env(node.fx.tierfs());
        cmd.current_dir(&dir).args(["--json", "log", path]);
        let out = run(&mut cmd, Duration::from_secs(60));
        out.assert_success("tierfs log in DIR");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
        json.as_array()
            .expect("an array")
            .iter()
            .map(|e| e["summary"].as_str().expect("a string").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(log("train.py"), ["two", "one"]);
    let mut cmd = env(node.fx.tierfs());
    cmd.current_dir(&dir).args(["checkout", "HEAD~1", "--", "train.py"]);
    run(&mut cmd, Duration::from_secs(60)).assert_success("tierfs checkout in DIR");
    assert_eq!(fs::read_to_string(dir.join("train.py")).expect("read"), "epochs = 1\n");
    assert!(sync("three")["history"]["commit"].is_string(), "the checked-out file is a change");
    assert_eq!(log("train.py"), ["three", "two", "one"]);
    unwatch(&node, &dir, pid);
}

/// Watch mode writes the same journal as a mount, so it has the same trash: a file deleted
/// from the watched directory is listed, and comes back into the directory.
#[test]
fn a_file_deleted_from_a_watched_directory_comes_back_from_its_trash() {
    let _one = exclusive();
    let node = Node::init_file();
    let dir = node.fx.tmp.path().join("watched");
    fs::create_dir(&dir).expect("mkdir");
    let (out, json) = watch(&node, &dir, &[]);
    out.assert_success("tierfs watch");
    fs::create_dir(dir.join("results")).expect("mkdir");
    fs::write(dir.join("results/run.csv"), b"epoch,loss\n1,0.5\n").expect("write");
    // `sync` is a barrier: the watcher has taken in every change made before it.
    tierfs(&node, &["sync", "-m", "written"], &dir).assert_success("tierfs sync");
    fs::remove_file(dir.join("results/run.csv")).expect("rm");
    // Once the watcher has taken the removal in, `trash list` flushes its journal to the store.
    // (Not a sync: a sync right after a change folds its batch into the snapshot's checkpoint,
    // and the trash reads the journal; docs/SEMANTICS.md, "Trash".)
    let removed = |s: &serde_json::Value| s["watch"]["totals"]["removed"].as_u64().unwrap_or(0) > 0;
    wait_for(&node, &dir, "the removal's pass", removed);

    let out = tierfs(&node, &["--json", "trash", "list"], &dir);
    out.assert_success("tierfs trash list DIR");
    let list: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    let entry = list.as_array().and_then(|l| l.iter().find(|e| e["path"] == "results/run.csv")).cloned();
    assert_eq!(entry.map(|e| (e["what"].clone(), e["size"].clone())), Some(("deleted".into(), 17.into())), "{list}");
    let out = tierfs(&node, &["--json", "trash", "restore"], &dir.join("results/run.csv"));
    out.assert_success("tierfs trash restore in a watched directory");
    assert_eq!(fs::read(dir.join("results/run.csv")).expect("read"), b"epoch,loss\n1,0.5\n");
    unwatch(&node, &dir, json["pid"].as_u64().expect("pid"));
}
