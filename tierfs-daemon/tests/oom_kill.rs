//! A real OOM kill of the serving daemon loses nothing it acknowledged.
//!
//! The daemon of a store mount is moved into a memory cgroup of its own with a small limit,
//! then made to grow (64 KiB xattr values land in RocksDB's memtable) until the kernel's OOM
//! killer ends it: the cgroup's `oom_kill` counter says it was the OOM killer, not a crash.
//! Then the dead mount is detached and the same data dir mounted again: every file written
//! before (fsynced or only closed), every directory, and every xattr whose `setxattr`
//! returned success is there. After a `tierfs sync`, a fresh node (an empty data dir) shows
//! the same.
//!
//! Needs the memory controller of cgroup v1 (`/sys/fs/cgroup/memory`) or v2 and root; fails
//! saying so otherwise.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Rng;
use store_node::Node;

const LIMIT: u64 = 16 << 20;
const XATTR_VALUE: usize = 64 << 10;
/// Far more than the limit needs; the loop ends at the kill.
const MAX_XATTRS: usize = 20_000;

/// A memory cgroup of this test, removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let name = format!("tierfs-oom-test-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2_controllers = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() || v1.join("cgroup.procs").exists() {
            (v1.join(&name), false)
        } else if v2_controllers.split_whitespace().any(|c| c == "memory") {
            (Path::new("/sys/fs/cgroup").join(&name), true)
        } else {
            panic!("this test needs the cgroup memory controller (v1 at /sys/fs/cgroup/memory, or v2) and root");
        };
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating cgroup {}: {e} (run as root)", dir.display()));
        let cg = MemoryCgroup { dir, v2 };
        let (file, swap) = if v2 { ("memory.max", Some("memory.swap.max")) } else { ("memory.limit_in_bytes", None) };
        fs::write(cg.dir.join(file), limit.to_string()).expect("setting the memory limit");
        if let Some(swap) = swap {
            let _ = fs::write(cg.dir.join(swap), "0");
        }
        cg
    }

    fn enter(&self, pid: u32) {
        fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("moving the daemon into the cgroup");
    }

    /// How many processes the OOM killer ended in this cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = fs::read_to_string(self.dir.join(file)).expect("reading the cgroup's OOM counter");
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no oom_kill line in {file}: {text}"))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The files and directories written before the kill, with their bytes.
fn tree() -> Vec<(&'static str, Option<Vec<u8>>)> {
    vec![
        ("dir", None),
        ("dir/fsynced.bin", Some(Rng::new(1).bytes(3 << 20))),
        ("closed.txt", Some(b"acknowledged, closed, never fsynced".to_vec())),
        ("dir/nested", None),
        ("dir/nested/small", Some(Rng::new(2).bytes(10_000))),
    ]
}

fn check_tree(root: &Path, acked: &[String], what: &str) {
    for (rel, body) in tree() {
        let path = root.join(rel);
        match body {
            None => assert!(path.is_dir(), "{what}: directory {rel} is missing"),
            Some(bytes) => {
                let got = fs::read(&path).unwrap_or_else(|e| panic!("{what}: reading {rel}: {e}"));
                assert!(got == bytes, "{what}: {rel} has {} bytes, not the {} written", got.len(), bytes.len());
            }
        }
    }
    let target = root.join("closed.txt");
    for name in acked {
        let value =
            common::getxattr(&target, name).unwrap_or_else(|e| panic!("{what}: acknowledged xattr {name}: {e}"));
        assert_eq!(value.len(), XATTR_VALUE, "{what}: xattr {name} changed");
    }
}

#[test]
fn an_oom_killed_daemon_loses_nothing_it_acknowledged() {
    common::require_fuse();
    let mut node = Node::init_file();
    node.mount(&[]);
    let mnt = node.fx.mountpoint.clone();
    for (rel, body) in tree() {
        let path = mnt.join(rel);
        match body {
            None => fs::create_dir(&path).expect("mkdir"),
            Some(bytes) if rel.contains("fsynced") => {
                common::write_synced(&path, &bytes);
            }
            Some(bytes) => fs::write(&path, bytes).expect("write"),
        }
    }

    let pid = node.fx.daemon_pid.expect("daemon pid");
    let cgroup = MemoryCgroup::new(LIMIT);
    cgroup.enter(pid);
    // Grow the daemon until the OOM killer ends it; every setxattr that returned success
    // was acknowledged and must survive.
    let target = mnt.join("closed.txt");
    let value = Rng::new(9).bytes(XATTR_VALUE);
    let mut acked = Vec::new();
    let started = Instant::now();
    for i in 0..MAX_XATTRS {
        let name = format!("user.grow{i}");
        match common::setxattr(&target, &name, &value, 0) {
            0 => acked.push(name),
            _ => {
                let e = std::io::Error::last_os_error();
                eprintln!("setxattr stopped after {i} values ({e}) in {:?}", started.elapsed());
                break;
            }
        }
    }
    for _ in 0..400 {
        if !common::process_alive(pid) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(!common::process_alive(pid), "the daemon outlived {MAX_XATTRS} xattrs of 64 KiB under a 16 MiB limit");
    assert!(cgroup.oom_kills() >= 1, "the daemon died, but not by the OOM killer:\n{}", node.daemon_log());
    assert!(!acked.is_empty(), "no xattr was acknowledged before the kill: the test proves nothing");
    node.fx.daemon_pid = None;
    if common::is_mounted(&mnt) {
        common::fusermount_lazy(&mnt).assert_success("fusermount3 -u -z of the dead mount");
    }
    drop(cgroup);

    // The same data dir again: what was acknowledged is there.
    node.mount(&[]);
    check_tree(&mnt, &acked, "after the OOM kill");
    node.sync("after the OOM kill").assert_success("tierfs sync");
    node.fx.umount();

    // A runtime reset after the sync: a fresh node shows the same.
    node.wipe_local_state();
    node.mount(&[]);
    check_tree(&mnt, &acked, "on a fresh node");
    node.fx.umount();
}
