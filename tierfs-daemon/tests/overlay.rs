//! overlayfs with its upper layer on a tierfs mount: what is installed over a system
//! directory (`/usr/local`, or any lower directory) lands in the workspace and comes back on a
//! fresh node after a runtime reset. overlayfs takes a FUSE filesystem as its upper layer only
//! when it supports `RENAME_WHITEOUT` and xattrs (it refuses it with "upper fs missing required
//! features"); about `O_TMPFILE` (copy-up through an unnamed file) it only warns, and on
//! tierfs it has no reason to since the vendored fuser carries the tmpfile operation. These
//! tests mount a real overlay on a real tierfs mount with a `file://` store.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Output, run};
use store_node::Node;

/// The directories of an overlay: `lower` outside tierfs, `upper` and `work` inside the
/// mount at `root`, and `merged` where the overlay is mounted.
struct Overlay {
    lower: PathBuf,
    upper: PathBuf,
    work: PathBuf,
    merged: PathBuf,
}

impl Overlay {
    fn new(lower: &Path, root: &Path, merged: &Path) -> Overlay {
        let o = Overlay {
            lower: lower.to_path_buf(),
            upper: root.join("env/upper"),
            work: root.join("env/work"),
            merged: merged.to_path_buf(),
        };
        for d in [&o.upper, &o.work, &o.merged] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        }
        o
    }

    fn mount(&self) {
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.lower.display(),
            self.upper.display(),
            self.work.display()
        );
        let out = run(
            Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(&self.merged),
            Duration::from_secs(30),
        );
        if !out.success() {
            let dmesg = run(&mut Command::new("dmesg"), Duration::from_secs(10));
            let said: Vec<&str> = dmesg.stdout.lines().filter(|l| l.contains("overlay")).collect();
            panic!("mounting the overlay failed: {}\nkernel: {}", out.stderr, said.join("\n"));
        }
    }

    fn umount(&self) {
        let out: Output = run(Command::new("umount").arg(&self.merged), Duration::from_secs(30));
        out.assert_success("umount of the overlay");
    }
}

/// The kernel's log from the moment it is opened on (`/dev/kmsg` read without blocking, from
/// its end): what overlayfs says about its upper layer at mount time.
struct KernelLog(File);

impl KernelLog {
    fn open() -> KernelLog {
        let open = OpenOptions::new().read(true).write(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg");
        let mut log = open.expect("opening /dev/kmsg");
        log.seek(SeekFrom::End(0)).expect("seeking /dev/kmsg to its end");
        KernelLog(log)
    }

    /// Adds `line` to the kernel's log (so a reader can tell it reads what came after it opened).
    fn mark(&mut self, line: &str) {
        self.0.write_all(format!("{line}\n").as_bytes()).expect("writing /dev/kmsg");
    }

    /// Every record logged since the open (or the last call), one string each.
    fn since(&mut self) -> Vec<String> {
        let mut records = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match self.0.read(&mut buf) {
                Ok(0) => return records,
                Ok(n) => records.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                // Records overwritten before they were read: the next read goes on after them.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return records,
                Err(e) => panic!("reading /dev/kmsg: {e}"),
            }
        }
    }
}

fn write(path: &Path, body: &str, mode: u32) {
    fs::create_dir_all(path.parent().expect("a parent")).expect("creating the parent");
    fs::write(path, body).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `renameat2(from, to, flags)` in one directory, as an errno on failure.
fn renameat2(from: &Path, to: &Path, flags: u32) -> Result<(), i32> {
    let (from, to) = (CString::new(from.as_os_str().as_bytes()), CString::new(to.as_os_str().as_bytes()));
    let (from, to) = (from.expect("no NUL"), to.expect("no NUL"));
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
    if rc == 0 { Ok(()) } else { Err(common::errno()) }
}

/// The whiteout overlayfs reads as "deleted here": a character device 0:0.
fn is_whiteout(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

#[test]
fn rename_whiteout_leaves_a_whiteout_in_the_same_step_and_refuses_exchange() {
    let mut node = Node::init_file();
    node.mount(&[]);
    let root = node.fx.mountpoint.clone();
    let p = |rel: &str| root.join(rel);
    write(&p("a"), "moved", 0o644);
    write(&p("b"), "replaced", 0o600);

    renameat2(&p("a"), &p("b"), libc::RENAME_WHITEOUT).expect("RENAME_WHITEOUT over a file");
    assert_eq!(fs::read_to_string(p("b")).expect("the target"), "moved");
    assert!(is_whiteout(&p("a")), "no whiteout at the source: {:?}", fs::symlink_metadata(p("a")));
    assert_eq!(fs::symlink_metadata(p("a")).expect("whiteout").mode() & 0o7777, 0, "a whiteout has no permission bits");

    // The kernel refuses whiteout with exchange before tierfs sees it; with NOREPLACE it
    // reaches tierfs, which keeps NOREPLACE's promise.
    assert_eq!(renameat2(&p("b"), &p("a"), libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE), Err(libc::EINVAL));
    assert_eq!(renameat2(&p("b"), &p("a"), libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE), Err(libc::EEXIST));
    assert_eq!(fs::read_to_string(p("b")).expect("the target"), "moved", "a refused rename changed the target");

    // The whiteout is an inode like any other: it survives a remount.
    node.fx.remount();
    assert!(is_whiteout(&p("a")), "the whiteout is gone after a remount");
    node.fx.umount();
}

#[test]
fn an_overlay_upper_layer_on_tierfs_comes_back_after_a_reset() {
    let mut a = Node::init_file();
    a.mount(&[]);
    let outside = a.fx.tmp.path().to_path_buf();
    // The image's directory: what a fresh runtime has again after the reset.
    let lower = outside.join("lower");
    write(&lower.join("bin/tool"), "tool v1\n", 0o755);
    write(&lower.join("lib/gone.so"), "removed by the user\n", 0o644);
    write(&lower.join("share/doc/readme"), "docs\n", 0o644);

    let first = Overlay::new(&lower, &a.fx.mountpoint, &outside.join("merged-a"));
    let mut kernel = KernelLog::open();
    first.mount();
    // overlayfs tries an O_TMPFILE in its work dir at mount time and warns when the upper
    // layer refuses it; the mark shows the log was read past the mount.
    let mark = format!("tierfs-test {}: overlay on tierfs mounted", std::process::id());
    kernel.mark(&mark);
    let said = kernel.since();
    assert!(said.iter().any(|r| r.contains(&mark)), "the kernel log read back no mark: {said:?}");
    let refused: Vec<&String> = said.iter().filter(|r| r.contains("does not support tmpfile")).collect();
    assert!(refused.is_empty(), "overlayfs found no O_TMPFILE on tierfs: {refused:?}");
    let m = |rel: &str| first.merged.join(rel);
    write(&m("bin/new-tool"), "#!/bin/sh\necho installed\n", 0o755);
    write(&m("bin/tool"), "tool v2\n", 0o755); // copied up, then replaced
    fs::remove_file(m("lib/gone.so")).expect("removing a lower file through the overlay");
    fs::remove_dir_all(m("share/doc")).expect("removing a lower directory through the overlay");
    fs::create_dir_all(m("opt/pkg")).expect("a new directory");
    write(&m("opt/pkg/data"), "new data\n", 0o644);
    first.umount();
    assert!(is_whiteout(&first.upper.join("lib/gone.so")), "the removal is not a whiteout in the upper layer");

    a.sync("overlay").assert_success("tierfs sync");
    a.fx.umount();
    a.wipe_local_state();

    // A fresh node: empty data dir, the same store, the same lower directory.
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let second = Overlay::new(&lower, &b.fx.mountpoint, &outside.join("merged-b"));
    second.mount();
    let m = |rel: &str| second.merged.join(rel);
    assert_eq!(fs::read_to_string(m("bin/tool")).expect("bin/tool"), "tool v2\n");
    assert_eq!(fs::read_to_string(m("bin/new-tool")).expect("bin/new-tool"), "#!/bin/sh\necho installed\n");
    assert_eq!(fs::metadata(m("bin/new-tool")).expect("new-tool").mode() & 0o777, 0o755);
    assert!(!m("lib/gone.so").exists(), "a file removed through the overlay is back");
    assert!(m("lib").is_dir() && !m("share/doc").exists(), "the removed directory is back");
    assert_eq!(fs::read_to_string(m("opt/pkg/data")).expect("opt/pkg/data"), "new data\n");
    let ran = run(&mut Command::new(m("bin/new-tool")), Duration::from_secs(10));
    assert_eq!(ran.assert_success("the installed tool").stdout, "installed\n");
    // The lower directory itself was never written.
    assert_eq!(fs::read_to_string(lower.join("bin/tool")).expect("lower bin/tool"), "tool v1\n");
    assert!(lower.join("lib/gone.so").exists() && lower.join("share/doc/readme").exists());
    second.umount();
    b.fx.umount();
}

/// `tierfs layer add DIR --in MOUNTPOINT` on node `node`, checked; its JSON answer.
fn layer_add(node: &Node, dir: &Path) -> serde_json::Value {
    let (dir, holder) = (dir.display().to_string(), node.fx.mountpoint.display().to_string());
    let (out, json) = node.tierfs_json(&["layer", "add", &dir, "--in", &holder]);
    out.assert_success("tierfs layer add");
    json
}

fn layer_remove(node: &Node, dir: &Path) -> serde_json::Value {
    let (out, json) = node.tierfs_json(&["layer", "remove", &dir.display().to_string()]);
    out.assert_success("tierfs layer remove");
    json
}

/// `tierfs layer`: a system directory stand-in is layered, written to, and layered again on
/// a fresh node after a reset; what was installed is back, what the image ships is untouched,
/// and bad directories are refused with one line that changes nothing.
#[test]
fn tierfs_layer_keeps_what_is_installed_into_a_directory_across_a_reset() {
    let mut a = Node::init_file();
    a.mount(&[]);
    let system = a.fx.tmp.path().join("usr-local");
    write(&system.join("bin/shipped"), "from the image\n", 0o755);

    let added = layer_add(&a, &system);
    assert_eq!(added["unchanged"], false, "{added}");
    let upper = PathBuf::from(added["upper"].as_str().expect("the upper layer"));
    assert!(upper.starts_with(&a.fx.mountpoint), "the upper layer {} is not in the workspace", upper.display());
    assert_eq!(layer_add(&a, &system)["unchanged"], true, "a second add is a no-op");
    let (out, listed) = a.tierfs_json(&["layer", "list"]);
    out.assert_success("tierfs layer list");
    assert!(listed.as_array().is_some_and(|l| l.iter().any(|x| x["dir"] == system.display().to_string())), "{listed}");

    write(&system.join("bin/installed"), "#!/bin/sh\necho back\n", 0o755);
    fs::remove_file(system.join("bin/shipped")).expect("removing a shipped file through the layer");
    assert!(upper.join("bin/installed").is_file(), "the write did not land in the workspace");

    // Refusals: each one line with a kind, nothing mounted or created.
    for (bad, kind) in [("/", "invalid_input"), (&*a.fx.mountpoint.display().to_string(), "invalid_input")] {
        let (out, json) = a.tierfs_json(&["layer", "add", bad, "--in", &a.fx.mountpoint.display().to_string()]);
        assert!(!out.success(), "layer add {bad} succeeded");
        assert_eq!(json["kind"], kind, "layer add {bad}: {json}");
        assert_eq!(out.stderr.trim().lines().count(), 1, "more than one line for a refusal: {}", out.stderr);
    }

    // The mount that keeps a layer is not unmounted under it.
    let (out, json) = a.tierfs_json(&["umount", &a.fx.mountpoint.display().to_string()]);
    assert!(!out.success(), "umount under a layer succeeded");
    assert_eq!((json["kind"].as_str(), json["reason"].as_str()), (Some("conflict"), Some("path_in_use")), "{json}");
    assert!(common::is_mounted(&a.fx.mountpoint), "the refused umount unmounted");
    let (_, listed) = a.tierfs_json(&["layer", "list"]);
    assert_eq!(listed[0]["upper"], upper.display().to_string(), "{listed}");

    assert_eq!(layer_remove(&a, &system)["unchanged"], false);
    assert_eq!(layer_remove(&a, &system)["unchanged"], true, "a second remove is a no-op");
    assert!(system.join("bin/shipped").is_file() && !system.join("bin/installed").exists(), "the image was written");
    a.sync("layer").assert_success("tierfs sync");
    a.fx.umount();
    a.wipe_local_state();

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    layer_add(&b, &system);
    let ran = run(&mut Command::new(system.join("bin/installed")), Duration::from_secs(10));
    assert_eq!(ran.assert_success("the installed tool").stdout, "back\n");
    assert!(!system.join("bin/shipped").exists(), "a removal through the layer did not survive the reset");
    layer_remove(&b, &system);
    assert!(system.join("bin/shipped").is_file(), "the image's own file is gone");
    b.fx.umount();
}

/// An overlayfs the test makes in a directory of its own, unmounted (lazily) when dropped.
struct OwnOverlay {
    merged: PathBuf,
    _dir: tempfile::TempDir,
}

impl OwnOverlay {
    fn new() -> OwnOverlay {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| dir.path().join(d));
        for d in [&lower, &upper, &work, &merged] {
            fs::create_dir_all(d).expect("mkdir");
        }
        let options = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        let out = run(
            Command::new("mount").args(["-t", "overlay", "overlay", "-o", &options]).arg(&merged),
            Duration::from_secs(30),
        );
        out.assert_success("mounting an overlay for the data dir");
        OwnOverlay { merged, _dir: dir }
    }
}

impl Drop for OwnOverlay {
    fn drop(&mut self) {
        let _ = run(Command::new("umount").arg("-l").arg(&self.merged), Duration::from_secs(30));
    }
}

/// Issue 47: a mount whose data dir is on overlayfs declares the kernel's whole stack depth
/// with FUSE passthrough (2), so overlayfs would refuse it as an upper layer (EINVAL).
/// `status` shows the depth, and `tierfs layer add` refuses up front with one line and its
/// reason, changing nothing; remounted with `--no-passthrough`, the mount holds the layer.
#[test]
fn a_mount_whose_data_dir_is_on_overlayfs_refuses_a_layer_until_remounted_without_passthrough() {
    let overlay = OwnOverlay::new();
    let mut a = Node::init_file();
    a.fx.data_dir = overlay.merged.join("data");
    a.mount(&[]);
    let status = a.fx.status();
    assert_eq!(status["passthrough"]["on"], true, "passthrough is off: {status}");
    assert_eq!(status["passthrough"]["stack_depth"], 2, "{status}");
    let system = a.fx.tmp.path().join("usr-local");
    write(&system.join("bin/shipped"), "from the image\n", 0o755);

    let (dir, holder) = (system.display().to_string(), a.fx.mountpoint.display().to_string());
    let (out, json) = a.tierfs_json(&["layer", "add", &dir, "--in", &holder]);
    assert!(!out.success(), "layer add on a full passthrough stack succeeded");
    assert_eq!(
        (json["kind"].as_str(), json["reason"].as_str()),
        (Some("conflict"), Some("passthrough_stack_full")),
        "{json}"
    );
    assert!(json["error"].as_str().is_some_and(|e| e.contains("--no-passthrough")), "{json}");
    assert_eq!(out.stderr.trim().lines().count(), 1, "more than one line for a refusal: {}", out.stderr);
    assert!(!common::is_mounted(&system), "the refused add mounted something");
    assert!(!a.fx.mountpoint.join(".tierfs/layers").exists(), "the refused add made the layer's directories");

    a.fx.umount();
    a.mount(&["--no-passthrough"]);
    let status = a.fx.status();
    assert!(status["passthrough"]["stack_depth"].is_null(), "{status}");
    assert_eq!(layer_add(&a, &system)["unchanged"], false);
    write(&system.join("bin/installed"), "kept\n", 0o644);
    layer_remove(&a, &system);
    a.fx.umount();
}
