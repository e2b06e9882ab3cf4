//! Surviving runtime resets, through real mounts and a real S3 server (moto on loopback): a
//! tree synced with `tierfs sync` comes back identical on a node with no local state; an
//! fsynced file survives `kill -9` plus the loss of the node's disk; a second writer is
//! refused, `--takeover` works, and the writer that lost the workspace stops claiming
//! durability.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{Rng, run};
use moto::MotoServer;
use store_node::{Node, env};

const BUCKET: &str = "tierfs-rt";

/// Everything `ls -lR` + `getfattr` would show, keyed by path (atime left out).
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: String,
    mode: u32,
    nlink: u64,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// File contents (hashed), or a symlink's target.
    body: String,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = common::cpath(path);
    let mut names = vec![0u8; 4096];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "listxattr {}: {}", path.display(), std::io::Error::last_os_error());
    let mut out = BTreeMap::new();
    for name in names[..n as usize].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = std::ffi::CString::new(name).expect("xattr name");
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let len = unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        assert!(len >= 0, "getxattr {}: {}", path.display(), std::io::Error::last_os_error());
        value.truncate(len as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), value);
    }
    out
}

fn walk(root: &Path) -> BTreeMap<String, Entry> {
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let (kind, body) = common::kind_and_body(&path, &m);
            let entry = Entry {
                kind: kind.into(),
                mode: m.mode(),
                nlink: m.nlink(),
                uid: m.uid(),
                gid: m.gid(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
                body,
                xattrs: xattrs(&path),
            };
            (rel, entry)
        })
        .collect()
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let c = common::cpath(path);
    let n = std::ffi::CString::new(name).expect("name");
    // SAFETY: valid NUL-terminated strings and a valid buffer.
    let rc = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr {}: {}", path.display(), std::io::Error::last_os_error());
}

/// Files, directories, symlinks, hard links, xattrs, modes, sparse and empty files, a fifo.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("src/deep/er")).expect("mkdir");
    fs::create_dir(root.join("private")).expect("mkdir");
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::write(root.join("src/main.py"), b"print('hello')\n").expect("write");
    fs::write(root.join("src/deep/er/model.bin"), random_bytes(1, (9 << 20) + 12345)).expect("write");
    fs::write(root.join("empty"), b"").expect("write");
    for i in 0..50 {
        fs::write(root.join(format!("src/deep/n{i}.txt")), format!("note {i}\n").repeat(i + 1)).expect("write");
    }
    let sparse = fs::File::create(root.join("sparse.img")).expect("create");
    sparse.set_len(64 << 20).expect("truncate");
    std::os::unix::fs::FileExt::write_at(&sparse, b"middle", 20 << 20).expect("pwrite");
    drop(sparse);
    fs::set_permissions(root.join("src/main.py"), fs::Permissions::from_mode(0o751)).expect("chmod");
    std::os::unix::fs::symlink("src/main.py", root.join("link-to-main")).expect("symlink");
    std::os::unix::fs::symlink("/nowhere/dangling", root.join("dangling")).expect("symlink");
    fs::hard_link(root.join("src/main.py"), root.join("private/hard")).expect("link");
    set_xattr(&root.join("src/main.py"), "user.tag", b"v1");
    set_xattr(&root.join("private"), "user.empty", b"");
    let fifo = common::cpath(&root.join("pipe"));
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");
}

#[test]
fn a_synced_tree_comes_back_identical_on_a_node_with_no_local_state() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "rt");
    a.mount(&[]);
    build_tree(&a.fx.mountpoint);
    let out = a.sync("first");
    out.assert_success("tierfs sync");
    let id = out.stdout.lines().last().unwrap_or_default().trim().to_string();
    assert!(!id.is_empty(), "sync printed no snapshot id: {}", out.stdout);
    let before = walk(&a.fx.mountpoint);
    assert!(before.len() > 55, "tree too small: {}", before.len());
    let (out, listed) = a.tierfs_json(&["snapshots", "--store", &a.store_file.display().to_string()]);
    out.assert_success("tierfs snapshots");
    assert!(
        listed.as_array().is_some_and(|l| l.iter().any(|s| s["id"] == id.as_str() && s["message"] == "first")),
        "snapshot {id} not listed: {listed}"
    );
    a.fx.umount();

    // The reset: a new node (new data dir) with nothing but the store file.
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let after = walk(&b.fx.mountpoint);
    for (path, e) in &before {
        assert_eq!(after.get(path), Some(e), "{path} differs after the reset");
    }
    assert_eq!(after.len(), before.len(), "extra entries after the reset");
    // And the restored node writes on: its changes reach the next node too.
    fs::write(b.fx.p("after-reset.txt"), b"second life").expect("write");
    b.fx.umount();
    let mut c = Node::new(&a.store_file);
    c.mount(&[]);
    assert_eq!(fs::read(c.fx.p("after-reset.txt")).expect("read"), b"second life");
    assert_eq!(fs::read(c.fx.p("src/main.py")).expect("read"), b"print('hello')\n");
    c.fx.umount();
}

#[test]
fn an_fsynced_file_survives_kill_9_and_the_loss_of_the_local_disk() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "rt");
    a.mount(&[]);
    fs::create_dir(a.fx.p("ckpt")).expect("mkdir");
    let data = random_bytes(7, (5 << 20) + 77);
    let mut f = fs::File::create(a.fx.p("ckpt/step-100.pt")).expect("create");
    f.write_all(&data).expect("write");
    f.sync_all().expect("fsync (remote by default)");
    drop(f);
    let status = a.fx.status();
    let remote = &status["remote"];
    assert_eq!(remote["pending_batches"], 0, "fsync returned with metadata pending: {status}");
    assert_eq!(status["backends"][0]["available"], true, "backend health missing: {status}");
    assert!(remote["lease_holder"].as_str().is_some_and(|h| h.contains(':')), "no lease holder: {status}");
    a.kill9();
    a.wipe_local_state();

    // The dead daemon's lease has 30 s left, but its holder was a process of this machine that
    // is gone: the next mount here takes the workspace without --takeover (another machine
    // would need it, see the second-writer test).
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    assert!(fs::read(b.fx.p("ckpt/step-100.pt")).expect("read") == data, "fsynced file differs after the reset");
    b.fx.umount();
}

#[test]
fn a_second_writer_is_refused_and_a_takeover_fences_the_first() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "rt");
    a.mount(&[]);
    common::write_synced(&a.fx.p("before"), b"from a");

    let mut b = Node::new(&a.store_file);
    let refused = b.try_mount(&[]);
    assert!(!refused.success(), "a second writer was allowed");
    assert!(refused.stderr.contains("in use by"), "unclear refusal: {}", refused.stderr);
    assert!(!common::is_mounted(&b.fx.mountpoint), "the refused mount left a mount behind");

    b.mount(&["--takeover"]);
    assert_eq!(fs::read(b.fx.p("before")).expect("read"), b"from a");

    // A no longer owns the workspace: its next durable write fails instead of lying.
    let mut f = fs::File::create(a.fx.p("after-takeover")).expect("create");
    f.write_all(b"lost").expect("write");
    let err = f.sync_all().expect_err("fsync on the fenced node must fail");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(f);
    let status = a.fx.status();
    assert!(status["remote"]["stopped"].is_string(), "fenced node does not say it stopped: {status}");
    // The failure keeps its kind up to the command line: `fenced`, which no retry fixes, not
    // `unavailable`.
    assert_fenced(&a, &["flush", "--deadline", "20"]);
    assert_fenced(&a, &["sync"]);
    // It unmounts, but its last metadata cannot reach the store: fenced too.
    assert_fenced(&a, &["umount"]);

    fs::write(b.fx.p("from-b"), b"b wins").expect("write");
    b.fx.umount();
    let mut c = Node::new(&a.store_file);
    c.mount(&[]);
    assert_eq!(fs::read(c.fx.p("from-b")).expect("read"), b"b wins");
    assert!(!c.fx.p("after-takeover").exists(), "the fenced node's write reached the store");
    c.fx.umount();
}

/// `tierfs --json ARGS MOUNTPOINT` on node `a`, fenced by a takeover, fails with kind
/// `fenced` on its last JSON line (and in the mount's own report, for `flush`).
fn assert_fenced(a: &Node, args: &[&str]) {
    let mountpoint = a.fx.mountpoint.to_str().expect("utf-8 mountpoint");
    let (out, _) = a.tierfs_json(&[args, &[mountpoint]].concat());
    assert!(!out.success(), "`tierfs {args:?}` succeeded on a fenced node: {out:?}");
    // The answer (pretty-printed, for `flush`), then the failure line.
    let lines: Vec<serde_json::Value> =
        serde_json::Deserializer::from_str(&out.stdout).into_iter().map_while(Result::ok).collect();
    let last = lines.last().unwrap_or_else(|| panic!("`tierfs {args:?}` printed no JSON: {out:?}"));
    assert_eq!(last["ok"], false, "{last}");
    assert_eq!(last["kind"], "fenced", "`tierfs {args:?}` on a fenced node: {last}");
    if args[0] == "flush" {
        let mount = &lines[0]["mounts"][0];
        assert_eq!((mount["flushed"].as_bool(), mount["kind"].as_str()), (Some(false), Some("fenced")), "{mount}");
    }
}

/// A store made for servers that ignore conditional writes (`--fencing lease`): one writer at
/// a time by the lease alone, and a takeover never fences a writer that is still alive.
#[test]
fn a_lease_fenced_store_keeps_one_writer_and_never_takes_over_a_live_one() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init_with(&servers, BUCKET, "lf", &["--fencing", "lease"]);
    let config = fs::read_to_string(&a.store_file).expect("store file");
    assert!(config.contains("fencing = \"lease\""), "{config}");
    a.mount(&[]);
    let status = a.fx.status();
    assert_eq!(status["remote"]["fencing"], "lease", "{status}");
    common::write_synced(&a.fx.p("kept"), b"from a");

    let mut b = Node::new(&a.store_file);
    let refused = b.try_mount(&[]);
    assert!(!refused.success() && refused.stderr.contains("in use by"), "second writer: {refused:?}");
    // A takeover waits the lease out, and a renews it (every 10 s) meanwhile: refused.
    let refused = b.try_mount(&["--takeover"]);
    assert!(!refused.success(), "a live writer was taken over on a lease-fenced store");
    assert!(refused.stderr.contains("still renewing its lease"), "unclear refusal: {}", refused.stderr);
    assert!(!common::is_mounted(&b.fx.mountpoint), "the refused mount left a mount behind");
    // a was not disturbed: it still writes durably.
    let mut f = fs::File::create(a.fx.p("still-a")).expect("create");
    f.write_all(b"a goes on").expect("write");
    f.sync_all().expect("fsync on the undisturbed writer");
    drop(f);
    a.fx.umount();

    b.mount(&[]);
    assert_eq!(fs::read(b.fx.p("kept")).expect("read"), b"from a");
    assert_eq!(fs::read(b.fx.p("still-a")).expect("read"), b"a goes on");
    b.fx.umount();
}

#[test]
fn snapshots_mount_read_only_beside_the_writer_and_restore_to_a_plain_copy() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "rt");
    a.mount(&[]);
    build_tree(&a.fx.mountpoint);
    fs::write(a.fx.p("notes.txt"), b"version one").expect("write");
    let out = a.sync("v1");
    out.assert_success("tierfs sync");
    let v1 = out.stdout.lines().last().unwrap_or_default().trim().to_string();
    let tree_v1 = walk(&a.fx.mountpoint);
    fs::write(a.fx.p("notes.txt"), b"version two, longer").expect("write");
    fs::remove_file(a.fx.p("empty")).expect("unlink");

    // A read-only mount of v1 while the writer goes on.
    let mut s = Node::new(&a.store_file);
    s.mount(&["--snapshot", &v1]);
    assert_eq!(fs::read(s.fx.p("notes.txt")).expect("read"), b"version one");
    assert!(s.fx.p("empty").exists(), "the snapshot lost a file deleted later");
    let err = fs::write(s.fx.p("new"), b"x").expect_err("a snapshot mount is read-only");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(walk(&s.fx.mountpoint), tree_v1, "the snapshot mount differs from the tree at sync");
    s.fx.umount();
    assert_eq!(fs::read(a.fx.p("notes.txt")).expect("read"), b"version two, longer");

    // A plain copy of v1, with no mount.
    let dir = s.fx.tmp.path().join("copy");
    let mut cmd = env(s.fx.tierfs());
    cmd.args(["--json", "restore", "--store"]).arg(&a.store_file).args(["--snapshot", &v1]).arg(&dir);
    let out = run(&mut cmd, Duration::from_secs(120));
    out.assert_success("tierfs restore");
    let copy = walk(&dir);
    assert_eq!(copy.len(), tree_v1.len(), "entries differ: {:?}", copy.keys().collect::<Vec<_>>());
    for (path, want) in &tree_v1 {
        let got = copy.get(path).unwrap_or_else(|| panic!("{path} missing from the copy"));
        // A copy has its own ctime, and the local filesystem's directory sizes; everything
        // else is the snapshot's.
        let size = if want.kind == "dir" { want.size } else { got.size };
        assert_eq!(
            Entry { ctime: want.ctime, size, ..clone_entry(got) },
            clone_entry(want),
            "{path} differs in the copy"
        );
    }
    let sparse = fs::metadata(dir.join("sparse.img")).expect("stat");
    assert!(sparse.blocks() * 512 < 1 << 20, "the sparse file was written out in full");

    // What changed since v1, from metadata alone.
    let out = a.sync("v2");
    out.assert_success("tierfs sync");
    let v2 = out.stdout.lines().last().unwrap_or_default().trim().to_string();
    // A read-only mount on a node with nothing local shows the latest state, beside the writer.
    let mut r = Node::new(&a.store_file);
    r.mount(&["--read-only"]);
    assert_eq!(fs::read(r.fx.p("notes.txt")).expect("read"), b"version two, longer");
    r.fx.umount();
    let mut cmd = env(a.fx.tierfs());
    cmd.args(["--json", "diff", "--store"]).arg(&a.store_file).args([&v1, &v2]);
    let out = run(&mut cmd, Duration::from_secs(60));
    out.assert_success("tierfs diff");
    let changes: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("diff --json");
    let ops: Vec<(String, String)> = changes
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| (c["op"].as_str().unwrap_or("").to_string(), c["path"].as_str().unwrap_or("").to_string()))
        .collect();
    assert!(ops.contains(&("M".into(), "/notes.txt".into())), "{changes}");
    assert!(ops.contains(&("-".into(), "/empty".into())), "{changes}");
    assert!(!ops.iter().any(|(_, p)| p.starts_with("/src")), "unchanged paths listed: {changes}");
    a.fx.umount();
}

fn clone_entry(e: &Entry) -> Entry {
    Entry {
        kind: e.kind.clone(),
        mode: e.mode,
        nlink: e.nlink,
        uid: e.uid,
        gid: e.gid,
        size: e.size,
        mtime: e.mtime,
        ctime: e.ctime,
        body: e.body.clone(),
        xattrs: e.xattrs.clone(),
    }
}

#[test]
fn gc_after_forget_frees_what_only_old_snapshots_held_and_keeps_every_referenced_byte() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "rt");
    let store = a.store_file.display().to_string();
    a.mount(&[]);
    let keep = random_bytes(11, 3 << 20);
    let big = random_bytes(12, 12 << 20);
    // big.bin alone first, so its blocks fill packs of their own (gc frees whole packs only).
    fs::write(a.fx.p("big.bin"), &big).expect("write");
    a.sync("big alone").assert_success("tierfs sync");
    fs::write(a.fx.p("keep.bin"), &keep).expect("write");
    let s1 = a.sync("with big").stdout.lines().last().unwrap_or_default().trim().to_string();
    fs::remove_file(a.fx.p("big.bin")).expect("unlink");
    let new = random_bytes(13, 2 << 20);
    fs::write(a.fx.p("new.bin"), &new).expect("write");
    let out = a.sync("without big");
    out.assert_success("tierfs sync");

    // Never while a workspace is mounted.
    let (refused, _) = a.tierfs_json(&["gc", "--store", &store]);
    assert!(!refused.success() && refused.stderr.contains("in use by"), "gc ran beside a writer: {}", refused.stderr);
    a.fx.umount();

    // s1 still references big.bin: gc must keep it.
    let (out, report) = a.tierfs_json(&["gc", "--store", &store]);
    out.assert_success("tierfs gc");
    assert!(report["referenced_blocks"].as_u64().unwrap_or(0) >= 4, "{report}");
    let copy = a.fx.tmp.path().join("s1-copy");
    let (out, _) = a.tierfs_json(&["restore", "--store", &store, "--snapshot", &s1, copy.to_str().expect("utf-8")]);
    out.assert_success("tierfs restore --snapshot s1 after gc");
    assert!(fs::read(copy.join("big.bin")).expect("read") == big, "gc lost a block a snapshot references");

    let (out, forgot) = a.tierfs_json(&["forget", "--store", &store, "--keep-last", "1"]);
    out.assert_success("tierfs forget");
    assert_eq!(forgot["removed"].as_array().map(Vec::len), Some(2), "{forgot}");
    assert!(forgot["removed"].as_array().is_some_and(|r| r.contains(&serde_json::json!(s1))), "{forgot}");
    // With no point-in-time window: the journal that still names big.bin goes too.
    let (out, report) = a.tierfs_json(&["gc", "--store", &store, "--keep-within", "0"]);
    out.assert_success("tierfs gc after forget");
    assert!(report["packs_deleted"].as_u64().unwrap_or(0) >= 1, "nothing freed: {report}");
    assert!(report["bytes_deleted"].as_u64().unwrap_or(0) >= 12 << 20, "big.bin not freed: {report}");

    // Everything still referenced is intact: a fresh node, and the old node's data dir
    // (outdated by gc's commit: dropped and restored), and a clean scrub.
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    assert!(fs::read(b.fx.p("keep.bin")).expect("read") == keep, "keep.bin damaged by gc");
    assert!(fs::read(b.fx.p("new.bin")).expect("read") == new, "new.bin damaged by gc");
    assert!(!b.fx.p("big.bin").exists());
    b.fx.umount();
    a.mount(&[]);
    assert!(fs::read(a.fx.p("keep.bin")).expect("read") == keep, "the old node reads a damaged keep.bin");
    a.fx.umount();
    let (out, scrub) = a.tierfs_json(&["scrub", "--store", &store]);
    out.assert_success("tierfs scrub after gc");
    assert_eq!(scrub["copies_missing"], 0, "{scrub}");
}

/// A store put back as it was (what deleting its newest objects does, with no key needed) is
/// refused by the node that saw it hold more, naming both positions, and changes nothing;
/// `--accept-rollback` takes the store's state as it is now, as a fresh node would.
#[test]
fn a_store_that_went_back_in_time_is_refused_by_a_node_that_saw_more() {
    let mut a = Node::init_file();
    let backend = a.fx.tmp.path().join("backend");
    let backup = a.fx.tmp.path().join("backend-then");
    a.mount(&[]);
    fs::write(a.fx.p("first.txt"), b"one").expect("write");
    a.sync("first").assert_success("sync");
    // What the store held after the first sync.
    a.fx.umount();
    run(std::process::Command::new("cp").arg("-a").arg(&backend).arg(&backup), Duration::from_secs(60))
        .assert_success("copying the store");
    a.mount(&[]);
    for i in 2..=6 {
        fs::write(a.fx.p(&format!("file-{i}.txt")), format!("{i}")).expect("write");
        a.sync(&format!("sync {i}")).assert_success("sync");
    }
    a.fx.umount();
    fs::remove_dir_all(&backend).expect("rm");
    run(std::process::Command::new("cp").arg("-a").arg(&backup).arg(&backend), Duration::from_secs(60))
        .assert_success("putting the old store back");

    let out = a.try_mount(&[]);
    assert!(!out.success(), "a rolled-back store was mounted: {}", out.stdout);
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
    assert_eq!(json["kind"], "corrupt", "{}\n{}", out.stdout, out.stderr);
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(said.contains("went back in time") && said.contains("--accept-rollback"), "{said}");
    assert!(!common::is_mounted(&a.fx.mountpoint));

    let listing = |dir: &Path| common::walk_tree(dir).into_iter().map(|(rel, _, m)| (rel, m.len())).collect::<Vec<_>>();
    assert_eq!(listing(&backend), listing(&backup), "the refused mount changed the store");
    a.mount(&["--accept-rollback"]);
    assert_eq!(fs::read_to_string(a.fx.p("first.txt")).expect("the store's state"), "one");
    assert!(!a.fx.p("file-6.txt").exists(), "the dropped copy is still served");
    a.fx.umount();
    // The store is consistent again: a fresh node sees the same state, and its files read.
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    assert_eq!(fs::read_to_string(b.fx.p("first.txt")).expect("on a fresh node"), "one");
    assert!(!b.fx.p("file-2.txt").exists());
    b.fx.umount();
}

/// A workspace's newest checkpoints and journal segments deleted (or older ones put back) while
/// its lease stays: the lease carries the highest batch its writer saw stored, so even a node
/// with no data dir of its own refuses the store (mount, read-only mount, restore), naming both
/// positions and changing nothing; `--accept-rollback` takes it as it is, and starts the mark
/// over so that the next node mounts it.
#[test]
fn a_chain_rolled_back_behind_its_lease_is_refused_by_a_node_with_no_data_dir() {
    let mut a = Node::init_file();
    let backend = a.fx.tmp.path().join("backend");
    let saved = a.fx.tmp.path().join("chain-then");
    let chain_dirs = |root: &Path| -> Vec<String> {
        common::walk_tree(root)
            .into_iter()
            .filter(|(rel, _, m)| m.is_dir() && (rel.ends_with("/cp") || rel.ends_with("/j")))
            .map(|(rel, _, _)| rel)
            .collect()
    };
    a.mount(&[]);
    fs::write(a.fx.p("first.txt"), b"one").expect("write");
    a.sync("first").assert_success("sync");
    a.fx.umount();
    let copy_dir = |from: &Path, to: &Path| {
        fs::create_dir_all(to).expect("mkdir");
        run(std::process::Command::new("cp").arg("-a").arg(from.join(".")).arg(to), Duration::from_secs(60))
            .assert_success("copying a directory of the store");
    };
    let dirs = chain_dirs(&backend);
    assert_eq!(dirs.len(), 2, "a checkpoint and a journal directory: {dirs:?}");
    for dir in &dirs {
        copy_dir(&backend.join(dir), &saved.join(dir));
    }
    a.mount(&[]);
    for i in 2..=6 {
        fs::write(a.fx.p(&format!("file-{i}.txt")), format!("{i}")).expect("write");
        a.sync(&format!("sync {i}")).assert_success("sync");
    }
    a.fx.umount();
    // The chain put back as it was; the lease, packs and everything else stay.
    for dir in &dirs {
        fs::remove_dir_all(backend.join(dir)).expect("rm");
        copy_dir(&saved.join(dir), &backend.join(dir));
    }
    let listing = |dir: &Path| common::walk_tree(dir).into_iter().map(|(rel, _, m)| (rel, m.len())).collect::<Vec<_>>();
    let before = listing(&backend);

    let refused = |out: &common::Output, what: &str| {
        assert!(!out.success(), "{what}: a rolled-back store was taken: {}", out.stdout);
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
        assert_eq!(json["kind"], "corrupt", "{what}: {}\n{}", out.stdout, out.stderr);
        let said = format!("{}{}", out.stdout, out.stderr);
        assert!(said.contains("went back in time") && said.contains("last writer"), "{what}: {said}");
    };
    let mut b = Node::new(&a.store_file);
    refused(&b.try_mount(&[]), "a fresh writer");
    assert!(!common::is_mounted(&b.fx.mountpoint));
    refused(&b.try_mount(&["--read-only"]), "a fresh read-only mount");
    let copy = b.fx.tmp.path().join("copy");
    let mut cmd = env(b.fx.tierfs());
    cmd.args(["--json", "restore", "--store"]).arg(&a.store_file).arg(&copy);
    refused(&run(&mut cmd, Duration::from_secs(120)), "a restore");
    assert!(!copy.exists() || fs::read_dir(&copy).expect("readdir").next().is_none(), "the refused restore wrote");
    assert_eq!(listing(&backend), before, "a refusal changed the store");

    b.wipe_local_state();
    b.mount(&["--accept-rollback"]);
    assert_eq!(fs::read_to_string(b.fx.p("first.txt")).expect("the store's state"), "one");
    assert!(!b.fx.p("file-2.txt").exists(), "the chain's later state is gone");
    b.fx.umount();
    // Accepted: the mark starts over from the store's state, and the next node mounts it.
    let mut c = Node::new(&a.store_file);
    c.mount(&[]);
    assert_eq!(fs::read_to_string(c.fx.p("first.txt")).expect("on the next node"), "one");
    c.fx.umount();
}

/// Store requests of `op` (`put_if_absent`, `delete`, …) a mounted node has sent so far,
/// as its `status --json` counts them.
fn requests(node: &Node, op: &str) -> u64 {
    let status = node.fx.status();
    let backends = status["backends"].as_array().expect("backends");
    backends
        .iter()
        .flat_map(|b| b["traffic"]["requests"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["op"] == op)
        .map(|r| r["calls"].as_u64().expect("calls"))
        .sum()
}

/// The first writer of a store probes its server for conditional creates (two creates and a
/// delete) and records the answer in the store's `config`; a fresh node after it, a reset,
/// makes no probe request: its one conditional create is its fencing segment. A record that
/// does not check is reported in one line and probed again (and recorded anew).
#[test]
fn a_fresh_node_reads_the_conditional_create_check_from_the_store_config() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "cc");
    a.mount(&[]);
    assert_eq!((requests(&a, "put_if_absent"), requests(&a, "delete")), (3, 1), "the first writer probes");
    a.fx.umount();
    let config: serde_json::Value =
        serde_json::from_slice(&servers[0].get_raw(BUCKET, "cc/config").expect("config")).expect("config is JSON");
    let record = config["conditional_create"].as_array().expect("the probe's answer is recorded");
    assert_eq!(record.len(), 1, "{config}");
    assert!(!config.to_string().contains(&servers[0].endpoint()), "the config names the backend: {config}");

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    assert_eq!((requests(&b, "put_if_absent"), requests(&b, "delete")), (1, 0), "a fresh node probed again");
    b.fx.umount();

    let mut garbage = config.clone();
    garbage["conditional_create"] = serde_json::json!("yes, trust me");
    servers[0].put_raw(BUCKET, "cc/config", &serde_json::to_vec(&garbage).expect("json"));
    let mut c = Node::new(&a.store_file);
    c.mount(&[]);
    assert_eq!((requests(&c, "put_if_absent"), requests(&c, "delete")), (3, 1), "garbage was taken as a record");
    c.fx.umount();
    let log = c.daemon_log();
    let said: Vec<_> = log.lines().filter(|l| l.contains("conditional-create check in a form")).collect();
    assert_eq!(said.len(), 1, "not one clear line: {log}");
    let fixed: serde_json::Value =
        serde_json::from_slice(&servers[0].get_raw(BUCKET, "cc/config").expect("config")).expect("config is JSON");
    assert_eq!(fixed["conditional_create"], config["conditional_create"], "the record is made again");
    assert_eq!(fixed["store_id"], config["store_id"], "the rewrite kept the config's fields");
}
