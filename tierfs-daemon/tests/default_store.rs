//! The embedded default store, through real mounts: `tierfs mount MOUNTPOINT` with neither
//! `--store` nor `--data-dir` creates an encrypted local store in the data home and uses it,
//! so `tierfs sync`, `tierfs snapshots` and the restore of a lost data dir work with no
//! set-up; `--no-store` stays hot tier only, and a later default mount takes such a data dir
//! into the store; the one-shot store commands find the embedded store without `--store`,
//! and say clearly when there is none.
//!
//! Every test runs in its own scratch data home (`XDG_DATA_HOME`, `HOME`) and runtime dir, so
//! it never sees the developer's own store or mounts.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Fixture, Output, Rng, run};

/// How long a one-shot command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A scratch data home for `fx`: `tierfs` commands run with `XDG_DATA_HOME` and `HOME` inside
/// the fixture's temporary directory, and without any store or passphrase from the caller.
struct Home {
    /// `$XDG_DATA_HOME/tierfs`: where the default data dir and the embedded store live.
    data_home: PathBuf,
    xdg_data_home: PathBuf,
    home: PathBuf,
}

impl Home {
    fn new(root: &Path) -> Home {
        let xdg_data_home = root.join("xdg");
        let home = root.join("home");
        fs::create_dir_all(&xdg_data_home).expect("creating XDG_DATA_HOME");
        fs::create_dir_all(&home).expect("creating HOME");
        Home { data_home: xdg_data_home.join("tierfs"), xdg_data_home, home }
    }

    fn tierfs(&self, fx: &Fixture) -> Command {
        let mut cmd = fx.tierfs();
        self.env(&mut cmd);
        cmd
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("XDG_DATA_HOME", &self.xdg_data_home)
            .env("HOME", &self.home)
            .env_remove("TIERFS_STORE")
            .env_remove("TIERFS_PASSPHRASE");
    }

    fn store_file(&self) -> PathBuf {
        self.data_home.join("store.toml")
    }

    fn objects(&self) -> PathBuf {
        self.data_home.join("objects")
    }

    fn key_file(&self) -> PathBuf {
        self.data_home.join("store.key")
    }

    fn data_dir(&self) -> PathBuf {
        self.data_home.join("default")
    }

    /// `tierfs --json mount [EXTRA…] MOUNTPOINT` (no `--data-dir`, no `--store`); on success
    /// the daemon's pid is kept in the fixture, so it is cleaned up on drop.
    fn mount(&self, fx: &mut Fixture, extra: &[&str]) -> Output {
        let mut cmd = self.tierfs(fx);
        cmd.args(["--json", "mount"]).args(extra).arg(&fx.mountpoint);
        let out = run(&mut cmd, common::MOUNT_TIMEOUT);
        out.assert_success("tierfs mount without --data-dir");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("tierfs mount --json printed {:?}: {e}", out.stdout));
        fx.daemon_pid = Some(json["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).expect("a daemon pid"));
        assert_eq!(json["data_dir"].as_str().map(PathBuf::from), Some(self.data_dir()), "{json}");
        assert!(common::is_mounted(&fx.mountpoint), "tierfs mount returned but nothing is mounted");
        out
    }

    /// `tierfs --json ARGS…`, run to completion.
    fn command(&self, fx: &Fixture, args: &[&str]) -> Output {
        let mut cmd = self.tierfs(fx);
        cmd.arg("--json").args(args);
        run(&mut cmd, COMMAND_TIMEOUT)
    }
}

/// What a tree shows: kind, mode, owner, size, mtime and contents (a file's hash, a symlink's
/// target), by path.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    body: String,
}

fn snapshot_tree(root: &Path) -> BTreeMap<String, Entry> {
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let (kind, body) = common::kind_and_body(&path, &m);
            // A directory's size is the underlying filesystem's business.
            let size = if m.is_dir() { 0 } else { m.size() };
            let entry = Entry {
                kind,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size,
                mtime: (m.mtime(), m.mtime_nsec()),
                body,
            };
            (rel, entry)
        })
        .collect()
}

/// Every regular file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    common::walk_tree(dir).into_iter().filter(|(_, _, m)| m.is_file()).map(|(_, path, _)| path).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_embedded_default_keeps_an_encrypted_local_store_that_sync_and_restore_use() {
    let mut fx = Fixture::new();
    let root = fx.mountpoint.parent().expect("the fixture's directory").to_path_buf();
    let home = Home::new(&root);

    // First mount: the store is created, and said so.
    let out = home.mount(&mut fx, &[]);
    let created = format!("tierfs: created the local store {}", home.store_file().display());
    assert!(out.stderr.contains(&created), "no creation notice on stderr: {}", out.stderr);
    for named in [home.objects(), home.key_file()] {
        assert!(out.stderr.contains(&named.display().to_string()), "{} not named: {}", named.display(), out.stderr);
    }
    assert_eq!(out.stderr.lines().count(), 1, "more than one line on stderr: {}", out.stderr);
    let key_mode = fs::metadata(home.key_file()).expect("the key file").mode() & 0o777;
    assert_eq!(key_mode, 0o600, "the key file is not owner-only");
    let store_text = fs::read_to_string(home.store_file()).expect("the store file");
    assert!(store_text.contains(&format!("file://{}", home.objects().display())), "{store_text}");
    let status = fx.status();
    assert_eq!(status["store"].as_str().map(PathBuf::from), Some(home.store_file()), "{status}");

    // A tree whose names and contents carry a marker that must never reach the store in clear.
    let seed = Rng::seed_from_env();
    eprintln!("seed {seed} (TIERFS_TEST_SEED)");
    let mut rng = Rng::new(seed);
    let marker = format!("plaintext-marker-{:016x}{:016x}", rng.next_u64(), rng.next_u64());
    let dir = fx.p(&format!("dir-{marker}"));
    fs::create_dir_all(dir.join("deeper")).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
    fs::write(dir.join("notes.txt"), format!("{marker}\n").repeat(100)).expect("write");
    let mut big = rng.bytes((6 << 20) + 4321);
    big[(5 << 20)..(5 << 20) + marker.len()].copy_from_slice(marker.as_bytes());
    fs::write(dir.join("deeper/big.bin"), &big).expect("write");
    fs::write(fx.p("empty"), b"").expect("write");
    std::os::unix::fs::symlink(format!("dir-{marker}/notes.txt"), fx.p("link-to-notes")).expect("symlink");
    std::os::unix::fs::symlink(format!("/nowhere/{marker}"), fx.p("dangling")).expect("symlink");
    let before = snapshot_tree(&fx.mountpoint);
    assert_eq!(before.len(), 7, "unexpected tree: {:?}", before.keys().collect::<Vec<_>>());

    let mut sync = home.tierfs(&fx);
    sync.args(["sync", "-m", "first"]).arg(&fx.mountpoint);
    let out = run(&mut sync, COMMAND_TIMEOUT);
    out.assert_success("tierfs sync on the embedded default");
    let id = out.stdout.lines().last().unwrap_or_default().trim().to_string();
    assert!(!id.is_empty(), "sync printed no snapshot id: {}", out.stdout);

    // The store holds the tree, sealed: no object has the marker in it.
    let objects = files_under(&home.objects());
    let stored: u64 = objects.iter().map(|p| fs::metadata(p).expect("stat").len()).sum();
    assert!(objects.len() >= 4, "too few objects in the store: {objects:?}");
    assert!(stored > 6 << 20, "the store holds {stored} bytes, less than the data written");
    for object in &objects {
        let bytes = fs::read(object).expect("read an object");
        assert!(!contains(&bytes, marker.as_bytes()), "{} holds the plaintext marker", object.display());
    }
    // The search does find it where it is in clear: the hot cache (the data is on this disk
    // twice, once in the cache and once sealed in the store).
    assert!(
        files_under(&home.data_dir()).iter().any(|p| contains(&fs::read(p).unwrap_or_default(), marker.as_bytes())),
        "the marker is not even in the hot cache: the search proves nothing"
    );

    let out = home.command(&fx, &["snapshots"]);
    out.assert_success("tierfs snapshots without --store");
    let listed: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("snapshots --json");
    let listed = listed.as_array().expect("a list of snapshots");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], id.as_str(), "{listed:?}");
    assert_eq!(listed[0]["message"], "first", "{listed:?}");

    // The runtime reset: the data dir is gone, the store (beside it) is not.
    fx.umount();
    fs::remove_dir_all(home.data_dir()).expect("removing the data dir");
    let out = home.mount(&mut fx, &[]);
    assert!(!out.stderr.contains("created the local store"), "the store was created again: {}", out.stderr);
    let after = snapshot_tree(&fx.mountpoint);
    for (path, entry) in &before {
        assert_eq!(after.get(path), Some(entry), "{path} differs after the data dir was restored");
    }
    assert_eq!(after.len(), before.len(), "extra entries after the restore");
    assert!(fs::read(dir.join("deeper/big.bin")).expect("read") == big, "big.bin differs after the restore");
    assert_eq!(fs::read_link(fx.p("dangling")).expect("readlink"), PathBuf::from(format!("/nowhere/{marker}")));

    // Failures in --json say what kind they are, whether the command itself or the daemon it
    // started failed: what a script (and the Python package) decides on.
    let copy = root.join("copy").display().to_string();
    let missing = home.command(&fx, &["restore", "--snapshot", "0123456789abcdef", &copy]);
    assert_json_failure(&missing, "not_found", "no snapshot");
    let second = root.join("second-mountpoint");
    fs::create_dir_all(&second).expect("mkdir");
    let busy = home.command(&fx, &["mount", &second.display().to_string()]);
    assert_json_failure(&busy, "conflict", "in use");
    assert!(!common::is_mounted(&second), "the data dir was mounted twice");
    fx.umount();
}

/// `out` failed with `{"ok": false, "kind": KIND, "error": …}` naming `words`.
fn assert_json_failure(out: &Output, kind: &str, words: &str) {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("no JSON answer ({e}): {out:?}"));
    assert_eq!(json["ok"], false, "{json}");
    assert_eq!(json["kind"], kind, "{json}");
    let message = json["error"].as_str().unwrap_or_default();
    assert!(message.contains(words), "{json}");
}

#[test]
fn no_store_stays_hot_tier_only_and_a_later_default_mount_takes_its_data_into_the_store() {
    let mut fx = Fixture::new();
    let root = fx.mountpoint.parent().expect("the fixture's directory").to_path_buf();
    let home = Home::new(&root);
    let out = home.mount(&mut fx, &["--no-store"]);
    assert!(!out.stderr.contains("local store"), "--no-store mentioned a store: {}", out.stderr);
    fs::write(fx.p("kept.txt"), b"only on this disk").expect("write");
    let status = fx.status();
    assert!(status["store"].is_null(), "a --no-store mount has a store: {status}");
    let mut sync = home.tierfs(&fx);
    sync.arg("sync").arg(&fx.mountpoint);
    let out = run(&mut sync, COMMAND_TIMEOUT);
    assert!(!out.success() && out.stderr.contains("no store"), "sync without a store: {}", out.stderr);
    fx.umount();
    for absent in [home.store_file(), home.objects(), home.key_file()] {
        assert!(!absent.exists(), "--no-store created {}", absent.display());
    }
    assert!(home.data_dir().is_dir(), "the default data dir was not used");

    // And the data is still there on the next hot-only mount.
    home.mount(&mut fx, &["--no-store"]);
    assert_eq!(fs::read(fx.p("kept.txt")).expect("read"), b"only on this disk");
    fx.umount();
    assert!(!home.store_file().exists(), "the second --no-store mount created a store");

    // The first mount on the embedded default (an upgrade from a hot-only default data dir)
    // uploads what the data dir holds: after losing the data dir it comes back.
    let out = home.mount(&mut fx, &[]);
    assert!(out.stderr.contains("created the local store"), "{}", out.stderr);
    assert_eq!(fs::read(fx.p("kept.txt")).expect("read"), b"only on this disk");
    fx.umount();
    fs::remove_dir_all(home.data_dir()).expect("removing the data dir");
    home.mount(&mut fx, &[]);
    assert_eq!(fs::read(fx.p("kept.txt")).expect("read after the restore"), b"only on this disk");
    fx.umount();
}

#[test]
fn store_commands_without_a_store_say_what_creates_one() {
    let tmp = tempfile::Builder::new().prefix("tierfs-it-").tempdir().expect("creating a temporary directory");
    let root = fs::canonicalize(tmp.path()).expect("resolving the temporary directory");
    let home = Home::new(&root);
    let expected = format!(
        "no --store given and no local store at {} yet (it is created by the first \"tierfs mount\" without --data-dir)",
        home.store_file().display()
    );
    let copy = root.join("copy").display().to_string();
    let mountpoint = root.join("mnt").display().to_string();
    let commands: [&[&str]; 9] = [
        &["snapshots"],
        &["restore", &copy],
        &["diff", "a", "latest"],
        &["forget", "--keep-last", "1"],
        &["gc"],
        &["scrub"],
        &["key", "list"],
        &["key", "passwd"],
        &["mount", "--snapshot", "0123", &mountpoint],
    ];
    for args in commands {
        let mut cmd = Command::new(common::TIERFS);
        home.env(&mut cmd);
        cmd.env("TIERFS_RUNTIME_DIR", root.join("run")).env_remove("TIERFS_DATA_DIR").args(args);
        let out = run(&mut cmd, COMMAND_TIMEOUT);
        assert_eq!(out.status.code(), Some(1), "tierfs {args:?}: {out:?}");
        assert!(out.stderr.contains(&expected), "tierfs {args:?} said: {}", out.stderr);
        assert!(!home.data_home.join("store.toml").exists(), "tierfs {args:?} created the store");
        assert!(!home.objects().exists() && !home.key_file().exists(), "tierfs {args:?} created store files");
    }
    assert!(!root.join("mnt").exists(), "the failed snapshot mount created its mountpoint");

    // `tierfs init` still wants to be told where.
    let mut init = Command::new(common::TIERFS);
    home.env(&mut init);
    init.args(["init", "--backend", &format!("file://{}", root.join("b").display())]);
    let out = run(&mut init, COMMAND_TIMEOUT);
    assert_eq!(out.status.code(), Some(2), "init without --store: {out:?}");
    assert!(out.stderr.contains("--store"), "{}", out.stderr);
}

/// A first mount stopped after the store's objects were written but before its config was:
/// the next mount says what happened and what to do, and touches nothing.
#[test]
fn objects_without_a_store_config_are_reported_not_overwritten() {
    let fx = Fixture::new();
    let home = Home::new(&fx.tmp.path().canonicalize().expect("resolving the temporary directory"));
    fs::create_dir_all(home.objects()).expect("creating the objects directory");
    let leftover = home.objects().join("leftover");
    fs::write(&leftover, b"from an interrupted first mount").expect("writing a leftover object");
    let mut cmd = home.tierfs(&fx);
    cmd.arg("mount").arg(&fx.mountpoint);
    let out = run(&mut cmd, common::MOUNT_TIMEOUT);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.contains("holds a store's objects but") && out.stderr.contains("move the objects directory aside"),
        "{}",
        out.stderr
    );
    assert!(!common::is_mounted(&fx.mountpoint), "mounted anyway");
    assert!(!home.store_file().exists() && !home.key_file().exists(), "a store was created over the leftovers");
    assert_eq!(fs::read(&leftover).expect("the leftover object"), b"from an interrupted first mount");
}

/// What gives rights (a setuid file of another owner, a device node, a file capability) comes
/// out of `tierfs restore` only when root asks with `--same-owner`; otherwise it is left out
/// and counted in the summary.
#[test]
fn a_restore_leaves_out_what_gives_rights_unless_root_asks_for_it() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (chown, mknod)");
        return;
    }
    let mut fx = Fixture::new();
    let root = fx.mountpoint.parent().expect("the fixture's directory").to_path_buf();
    let home = Home::new(&root);
    home.mount(&mut fx, &[]);
    let suid = fx.p("suid");
    fs::write(&suid, b"#!/bin/sh\n").expect("write");
    std::os::unix::fs::chown(&suid, Some(1234), Some(1234)).expect("chown");
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).expect("chmod");
    let null = std::ffi::CString::new(fx.p("null").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string; makes a device node like /dev/null (1, 3).
    assert_eq!(unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }, 0, "mknod");
    home.command(&fx, &["sync", "-m", "rights", &fx.mountpoint.display().to_string()]).assert_success("tierfs sync");

    let plain = root.join("plain");
    let out = home.command(&fx, &["restore", &plain.display().to_string()]);
    out.assert_success("tierfs restore");
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("restore --json");
    assert_eq!(json["left_out"]["devices"], 1, "{json}");
    assert!(json["left_out"]["setid_bits"].as_u64() >= Some(1), "{json}");
    assert!(json["left_out"]["owners"].as_u64() >= Some(1), "{json}");
    let m = fs::metadata(plain.join("suid")).expect("restored");
    assert_eq!((m.mode() & 0o7777, m.uid()), (0o755, 0), "a setuid file of uid 1234 came back as the store said");
    assert!(fs::symlink_metadata(plain.join("null")).is_err(), "a device node was made");

    let same = root.join("same");
    home.command(&fx, &["restore", "--same-owner", &same.display().to_string()]).assert_success("--same-owner");
    let m = fs::metadata(same.join("suid")).expect("restored");
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o4755, 1234, 1234));
    let n = fs::symlink_metadata(same.join("null")).expect("the device");
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&n.file_type()) && n.rdev() == libc::makedev(1, 3));
    fx.umount();
}
