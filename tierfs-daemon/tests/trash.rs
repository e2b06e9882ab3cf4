//! The trash of a live mount, through the `tierfs` binary, a real FUSE mount and a real store
//! (`file://`, and moto): `rm -rf` and a rename over a file, then `tierfs trash list` shows
//! both, `tierfs trash restore` brings the deleted file back at its path and the replaced
//! version beside the file now there; a removed directory comes back with its whole tree and
//! a removed symlink on its own; a removal just before a `tierfs sync` is in the trash too; a path that leads out of the mount (`..`, a path
//! elsewhere, a symlink on the way) is refused with its kind and changes nothing; and the same
//! point-in-time restore works after a reset, on a fresh node with an empty data dir
//! (docs/SEMANTICS.md, "Trash"); `tierfs mount --at` shows the workspace read-only as it was.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::manifest;
use store_node::{Node, env};

/// The time of day now, RFC 3339, between two pauses so no change on either side shares its
/// millisecond (a boundary, not a timing: nothing here measures how long anything takes).
fn boundary() -> String {
    std::thread::sleep(Duration::from_millis(50));
    let t = tierfs::remote::rfc3339_ms(tierfs::meta::system_unix_ms());
    std::thread::sleep(Duration::from_millis(50));
    t
}

/// `tierfs --json trash ARGS…` run from `cwd`.
fn trash(node: &Node, cwd: &Path, args: &[&str]) -> (common::Output, serde_json::Value) {
    let mut cmd = env(node.fx.tierfs());
    cmd.current_dir(cwd).args(["--json", "trash"]).args(args);
    let out = common::run(&mut cmd, Duration::from_secs(180));
    let json = serde_json::from_str(out.stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out, json)
}

/// `tierfs flush MOUNTPOINT`: the data written so far in the store.
fn flush(node: &Node) {
    let mut cmd = env(node.fx.tierfs());
    cmd.arg("flush").arg(&node.fx.mountpoint);
    common::run(&mut cmd, Duration::from_secs(120)).assert_success("tierfs flush");
}

#[test]
fn trash_restores_a_deleted_file_and_a_replaced_version_on_a_file_store() {
    the_trash(Node::init_file());
}

#[test]
fn trash_restores_a_deleted_file_and_a_replaced_version_on_moto() {
    let servers = moto::MotoServer::start_many(1, "tierfs-trash");
    the_trash(Node::init(&servers, "tierfs-trash", "trash"));
}

fn the_trash(mut a: Node) {
    a.mount(&[]);
    let m = a.fx.mountpoint.clone();
    fs::create_dir(m.join("outputs")).expect("mkdir");
    fs::write(m.join("outputs/a.txt"), b"first output").expect("write");
    fs::write(m.join("outputs/b.bin"), vec![7u8; 300_000]).expect("write");
    fs::write(m.join("ckpt.pt"), b"last night's checkpoint").expect("write");
    fs::create_dir(m.join("d")).expect("mkdir");
    fs::write(m.join("d/f"), b"in d").expect("write");
    // Their data in the store (a `file://` store on this disk seals closed files late).
    flush(&a);
    let before_overwrite = boundary();

    // rm -rf, a rename over the checkpoint, and a directory swapped for a symlink out.
    fs::remove_dir_all(m.join("outputs")).expect("rm -rf");
    fs::write(m.join("new.pt"), b"tonight's checkpoint").expect("write");
    fs::rename(m.join("new.pt"), m.join("ckpt.pt")).expect("rename over");
    let outside = a.fx.tmp.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::remove_dir_all(m.join("d")).expect("rm -rf d");
    std::os::unix::fs::symlink(&outside, m.join("d")).expect("symlink");

    let (out, list) = trash(&a, &m, &["list"]);
    out.assert_success("tierfs trash list");
    let entries = list.as_array().expect("a list");
    let find = |path: &str| entries.iter().find(|e| e["path"] == path).cloned().unwrap_or_default();
    assert_eq!(
        (find("outputs/a.txt")["what"].clone(), find("outputs/a.txt")["size"].clone()),
        ("deleted".into(), 12.into()),
        "{list}"
    );
    assert_eq!(find("outputs/b.bin")["size"], 300_000, "{list}");
    assert_eq!(find("ckpt.pt")["what"], "replaced", "{list}");
    assert!(find("new.pt").is_null(), "a rename that moves a file put it in the trash: {list}");
    // Listing a directory lists it and what was under it.
    let (out, under) = trash(&a, &m, &["list", "outputs"]);
    out.assert_success("tierfs trash list outputs");
    assert_eq!(under.as_array().map(Vec::len), Some(3), "{under}");

    // The deleted file comes back at its path (its directory made again), through the mount.
    let (out, got) = trash(&a, &m, &["restore", "outputs/a.txt"]);
    out.assert_success("tierfs trash restore outputs/a.txt");
    assert_eq!((got["beside"].clone(), got["what"].clone()), (false.into(), "deleted".into()), "{got}");
    assert_eq!(got["incomplete"], false, "{got}");
    assert_eq!(fs::read(m.join("outputs/a.txt")).expect("read"), b"first output");
    let (out, _) = trash(&a, &m, &["restore", "outputs/b.bin"]);
    out.assert_success("tierfs trash restore outputs/b.bin");
    assert_eq!(fs::read(m.join("outputs/b.bin")).expect("read"), vec![7u8; 300_000]);

    // The replaced version lands beside the file there now, which is left alone.
    let (out, got) = trash(&a, &m, &["restore", "ckpt.pt"]);
    out.assert_success("tierfs trash restore ckpt.pt");
    let beside = got["restored_as"].as_str().expect("restored_as").to_string();
    assert!(got["beside"] == true && beside.contains("ckpt.pt.restored-"), "{got}");
    assert_eq!(fs::read(&beside).expect("read"), b"last night's checkpoint");
    assert_eq!(fs::read(m.join("ckpt.pt")).expect("read"), b"tonight's checkpoint");

    // Paths that lead out of the mount: one line, a kind, and nothing changes.
    let mine = manifest(&m);
    for path in ["../../etc/passwd", "/etc/passwd", "d/f"] {
        let (out, json) = trash(&a, &m, &["restore", path, "--at", &before_overwrite]);
        assert!(!out.success(), "trash restore {path} succeeded: {}", out.stdout);
        assert!(json["kind"] == "invalid_input" && json["error"].is_string(), "{path}: {json}");
        assert_eq!(out.stderr.trim().lines().count(), 1, "{path}: {}", out.stderr);
    }
    assert_eq!(manifest(&m), mine, "a refused restore changed the mount");
    assert_eq!(fs::read_dir(&outside).expect("ls").count(), 0, "a restore followed a symlink out of the mount");
    // Nothing in the trash at a path: not found.
    let (out, json) = trash(&a, &m, &["restore", "never-there.txt"]);
    assert!(!out.success() && json["kind"] == "not_found", "{json}");
    a.fx.umount();

    // A reset: a fresh node, empty data dir, the same store. The version at a time comes back.
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let m = b.fx.mountpoint.clone();
    let (out, got) = trash(&b, &m, &["restore", "ckpt.pt", "--at", &before_overwrite]);
    out.assert_success("tierfs trash restore --at on a fresh node");
    let beside = got["restored_as"].as_str().expect("restored_as").to_string();
    assert_eq!(fs::read(&beside).expect("read"), b"last night's checkpoint");
    assert_eq!(fs::read(m.join("ckpt.pt")).expect("read"), b"tonight's checkpoint");
    // The trash survived the reset too.
    let (out, list) = trash(&b, &m, &["list"]);
    out.assert_success("tierfs trash list on a fresh node");
    assert!(list.as_array().is_some_and(|l| l.iter().any(|e| e["path"] == "ckpt.pt")), "{list}");
    b.fx.umount();

    // `tierfs mount --at`: the workspace read-only as it was then, beside nothing else.
    let mut c = Node::new(&a.store_file);
    c.mount(&["--at", &before_overwrite]);
    let m = c.fx.mountpoint.clone();
    assert_eq!(fs::read(m.join("ckpt.pt")).expect("read"), b"last night's checkpoint");
    assert_eq!(fs::read(m.join("outputs/a.txt")).expect("read"), b"first output");
    let err = fs::write(m.join("new.txt"), b"x").expect_err("a write to a mount --at");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    c.fx.umount();
    // A time before the workspace existed is refused, and nothing is mounted.
    let mut d = Node::new(&a.store_file);
    let out = d.try_mount(&["--at", "2001-01-01T00:00:00Z"]);
    assert!(!out.success() && out.stdout.contains("not_found"), "{out:?}");
}

#[test]
fn a_removal_just_before_a_sync_is_in_the_trash_on_a_file_store() {
    removal_then_sync(Node::init_file());
}

#[test]
fn a_removal_just_before_a_sync_is_in_the_trash_on_moto() {
    let servers = moto::MotoServer::start_many(1, "tierfs-trash-sync");
    removal_then_sync(Node::init(&servers, "tierfs-trash-sync", "trash-sync"));
}

/// `rm` and a rename over a file, then `tierfs sync` at once and the node dies: the snapshot's
/// checkpoint must not be the only place the removals reached (the trash replays the
/// journal), on this node nor on a fresh one.
fn removal_then_sync(mut a: Node) {
    a.mount(&[]);
    let m = a.fx.mountpoint.clone();
    fs::create_dir(m.join("keep")).expect("mkdir");
    fs::write(m.join("keep/notes.txt"), b"notes of the day").expect("write");
    fs::write(m.join("model.pt"), b"the good model").expect("write");
    fs::write(m.join("worse.pt"), b"a worse model").expect("write");
    flush(&a);

    // Nothing left to upload: the sync is one checkpoint, at once after the removals.
    fs::remove_file(m.join("keep/notes.txt")).expect("rm");
    fs::rename(m.join("worse.pt"), m.join("model.pt")).expect("rename over");
    a.sync("right after rm").assert_success("tierfs sync");
    a.kill9();
    a.wipe_local_state();

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let m = b.fx.mountpoint.clone();
    let (out, list) = trash(&b, &m, &["list"]);
    out.assert_success("tierfs trash list");
    let entries = list.as_array().expect("a list");
    let what = |path: &str| entries.iter().find(|e| e["path"] == path).map(|e| e["what"].clone());
    assert_eq!(what("keep/notes.txt"), Some("deleted".into()), "{list}");
    assert_eq!(what("model.pt"), Some("replaced".into()), "{list}");
    let (out, _) = trash(&b, &m, &["restore", "keep/notes.txt"]);
    out.assert_success("tierfs trash restore keep/notes.txt");
    assert_eq!(fs::read(m.join("keep/notes.txt")).expect("read"), b"notes of the day");
    b.fx.umount();
}

#[test]
fn trash_restores_a_removed_tree_and_a_symlink_on_a_file_store() {
    tree_and_symlink(Node::init_file());
}

#[test]
fn trash_restores_a_removed_tree_and_a_symlink_on_moto() {
    let servers = moto::MotoServer::start_many(1, "tierfs-trash-tree");
    tree_and_symlink(Node::init(&servers, "tierfs-trash-tree", "trash-tree"));
}

/// Every entry under `root`: kind and contents (or link target), mode and mtime.
fn tree_state(root: &Path) -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::MetadataExt;
    let bodies = manifest(root);
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, _, m)| {
            let mode = if m.file_type().is_symlink() { 0 } else { m.mode() & 0o7777 };
            let state = format!("{} mode {mode:o} mtime {}.{:09}", bodies[&rel], m.mtime(), m.mtime_nsec());
            (rel, state)
        })
        .collect()
}

/// `rm -rf outputs/` then `tierfs trash restore outputs` brings the tree back as it was (bytes,
/// modes, mtimes, symlinks, a nested directory); a deleted symlink comes back on its own; the
/// refusals stay: a path out of the mount is refused and nothing is written.
fn tree_and_symlink(mut a: Node) {
    use std::os::unix::fs::PermissionsExt;
    a.mount(&[]);
    let m = a.fx.mountpoint.clone();
    fs::create_dir_all(m.join("outputs/run1/plots")).expect("mkdir");
    fs::write(m.join("outputs/run1/metrics.json"), b"{\"loss\": 0.1}").expect("write");
    fs::write(m.join("outputs/run1/plots/loss.png"), vec![9u8; 200_000]).expect("write");
    fs::write(m.join("outputs/run.sh"), b"#!/bin/sh\necho hi\n").expect("write");
    fs::set_permissions(m.join("outputs/run.sh"), fs::Permissions::from_mode(0o750)).expect("chmod");
    fs::set_permissions(m.join("outputs/run1/plots"), fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::symlink("run1/metrics.json", m.join("outputs/latest")).expect("symlink");
    std::os::unix::fs::symlink("outputs/run.sh", m.join("go")).expect("symlink");
    flush(&a);
    let before = tree_state(&m.join("outputs"));
    assert_eq!(before.len(), 6, "{before:#?}");

    fs::remove_dir_all(m.join("outputs")).expect("rm -rf");
    fs::remove_file(m.join("go")).expect("rm symlink");

    let (out, list) = trash(&a, &m, &["list"]);
    out.assert_success("tierfs trash list");
    let entries = list.as_array().expect("a list");
    let kind = |path: &str| entries.iter().find(|e| e["path"] == path).map(|e| e["kind"].clone());
    assert_eq!(kind("outputs"), Some("dir".into()), "{list}");
    assert_eq!(kind("outputs/run1/plots"), Some("dir".into()), "{list}");
    assert_eq!(kind("outputs/latest"), Some("symlink".into()), "{list}");
    assert_eq!(kind("go"), Some("symlink".into()), "{list}");

    let (out, got) = trash(&a, &m, &["restore", "outputs"]);
    out.assert_success("tierfs trash restore outputs");
    assert_eq!((got["kind"].clone(), got["beside"].clone()), ("dir".into(), false.into()), "{got}");
    assert_eq!(got["entries"], 7, "the directory and the six entries beneath it: {got}");
    assert_eq!(tree_state(&m.join("outputs")), before, "the tree came back different");
    let (out, got) = trash(&a, &m, &["restore", "go"]);
    out.assert_success("tierfs trash restore go");
    assert_eq!(got["kind"], "symlink", "{got}");
    assert_eq!(fs::read_link(m.join("go")).expect("readlink"), Path::new("outputs/run.sh"));

    // A second restore of the tree lands beside it, whole too; refusals write nothing.
    let (out, got) = trash(&a, &m, &["restore", "outputs"]);
    out.assert_success("tierfs trash restore outputs again");
    let beside = got["restored_as"].as_str().expect("restored_as").to_string();
    assert!(got["beside"] == true && beside.contains("outputs.restored-"), "{got}");
    assert_eq!(tree_state(Path::new(&beside)), before);
    let mine = manifest(&m);
    let (out, json) = trash(&a, &m, &["restore", "../../etc"]);
    assert!(!out.success() && json["kind"] == "invalid_input", "{json}");
    assert_eq!(manifest(&m), mine, "a refused restore changed the mount");
    a.fx.umount();
}
