//! The hot tier encrypted at rest (`--encrypt-cache`, issue 23 item 7) on a real mount: no
//! byte a program wrote is found in the data dir, every file reads back (resident, evicted and
//! fetched back, after a remount and on a fresh node), and a data dir is never read with the
//! wrong setting: an encrypted one needs the flag, a plain one with data refuses it. The
//! history of code is kept in memory then, never in the data dir.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use common::Rng;
use store_node::Node;

/// A pattern no cipher output contains by chance: found in a data file only in plaintext.
const MARKER: &[u8] = b"tierfs plaintext marker, readable only without encryption. ";

/// The files: a text of markers, random data larger than the cache (evicted, fetched back),
/// a file of 13 bytes (within one cipher block), and a sparse one with data far out.
fn write_tree(root: &Path, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        ("text".to_string(), MARKER.repeat(20_000)),
        ("big".to_string(), rng.bytes(24 << 20)),
        ("tiny".to_string(), b"13 bytes here".to_vec()),
        // Code: recorded in the history too.
        ("train.py".to_string(), [&b"# "[..], MARKER, b"\n"].concat()),
    ];
    for (name, data) in &files {
        fs::write(root.join(name), data).expect("write");
    }
    // Sparse: a hole of 64 MiB, then 5 bytes at an offset that is not on a cipher block.
    let mut f = fs::File::create(root.join("sparse")).expect("create");
    f.seek(SeekFrom::Start((64 << 20) + 7)).expect("seek");
    f.write_all(b"tail!").expect("write");
    let mut sparse = vec![0u8; (64 << 20) + 12];
    sparse[(64 << 20) + 7..].copy_from_slice(b"tail!");
    files.push(("sparse".to_string(), sparse));
    files
}

fn check_tree(root: &Path, files: &[(String, Vec<u8>)], when: &str) {
    for (name, want) in files {
        let got = fs::read(root.join(name)).unwrap_or_else(|e| panic!("{when}: read {name}: {e}"));
        assert_eq!(got.len(), want.len(), "{when}: {name} has the wrong length");
        assert!(got == *want, "{when}: {name} has the wrong bytes");
    }
}

/// Whether any file under `dir` holds `MARKER`.
fn holds_marker(dir: &Path) -> bool {
    holds(dir, MARKER)
}

/// Whether any file under `dir` holds `needle` (what `strings -a` over every file would find).
fn holds(dir: &Path, needle: &[u8]) -> bool {
    common::walk_tree(dir).iter().any(|(_, path, m)| {
        m.is_file() && fs::read(path).is_ok_and(|data| data.windows(needle.len()).any(|w| w == needle))
    })
}

/// Names, a link target and an xattr value no cipher output contains by chance.
const NAME_MARKERS: [&str; 4] = [
    "tierfs-file-name-marker-5c2a",
    "tierfs-dir-name-marker-77e0",
    "tierfs-link-marker-8d41",
    "tierfs-xattr-marker-1e9b",
];

/// A file and a directory named by markers, a symlink to a marker, and an xattr of the file
/// holding one.
fn write_named(root: &Path) {
    let [file, dir, link, xattr] = NAME_MARKERS;
    fs::create_dir(root.join(dir)).expect("mkdir");
    fs::write(root.join(dir).join(file), b"named").expect("write");
    std::os::unix::fs::symlink(format!("{link}/target"), root.join("link")).expect("symlink");
    let path = std::ffi::CString::new(root.join(dir).join(file).into_os_string().into_encoded_bytes()).expect("path");
    // SAFETY: NUL-terminated path and name, and a value buffer of the given length.
    let rc = unsafe { libc::setxattr(path.as_ptr(), c"user.note".as_ptr(), xattr.as_ptr().cast(), xattr.len(), 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// The names, target and xattr of [`write_named`] read back.
fn check_named(root: &Path, when: &str) {
    let [file, dir, link, xattr] = NAME_MARKERS;
    assert_eq!(fs::read(root.join(dir).join(file)).unwrap_or_default(), b"named", "{when}");
    assert_eq!(fs::read_link(root.join("link")).expect("readlink"), Path::new(&format!("{link}/target")), "{when}");
    let path = std::ffi::CString::new(root.join(dir).join(file).into_os_string().into_encoded_bytes()).expect("path");
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated path and name, and a buffer of the given length.
    let n = unsafe { libc::getxattr(path.as_ptr(), c"user.note".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "{when}: getxattr: {}", std::io::Error::last_os_error());
    assert_eq!(&buf[..n as usize], xattr.as_bytes(), "{when}");
}

/// No name, target or xattr value of [`write_named`] is anywhere under `dir`.
fn assert_no_named(dir: &Path, when: &str) {
    for marker in NAME_MARKERS {
        assert!(!holds(dir, marker.as_bytes()), "{when}: {marker} is in the clear under {}", dir.display());
    }
}

/// Whether no git repository (a `HEAD` naming a branch) is under `dir`.
fn no_repository(dir: &Path) -> bool {
    !common::walk_tree(dir).iter().any(|(_, path, m)| {
        m.is_file()
            && path.file_name().is_some_and(|n| n == "HEAD")
            && fs::read(path).is_ok_and(|d| d.starts_with(b"ref: refs/heads/"))
    })
}

#[test]
fn an_encrypted_cache_holds_no_plaintext_and_reads_back_everywhere() {
    common::require_fuse();
    let mut rng = Rng::new(23);
    let mut a = Node::init_file();
    a.mount(&["--encrypt-cache", "--cache-size", "8M", "--dirty-age", "1"]);
    let files = write_tree(&a.fx.mountpoint, &mut rng);
    write_named(&a.fx.mountpoint);
    a.sync("tree").assert_success("tierfs sync");
    check_tree(&a.fx.mountpoint, &files, "after writing");
    let evicted = a.fx.status()["cold"]["evictions"].as_u64().unwrap_or(0);
    let status = a.fx.status();
    assert!(evicted > 0, "nothing was evicted, so nothing is fetched back: {status}");
    assert_eq!(status["cache_encrypted"], true, "{status}");
    // The history recorded train.py, and is read back, from memory: no repository is on
    // the data dir's disk.
    let mut log = store_node::env(a.fx.tierfs());
    log.args(["--json", "log", "--mount"]).arg(&a.fx.mountpoint);
    let log = common::run(&mut log, Duration::from_secs(60));
    log.assert_success("tierfs log on an encrypted cache");
    assert!(log.stdout.contains("\"tree\""), "{}", log.stdout);
    assert!(no_repository(&a.fx.data_dir), "a git repository is in the encrypted data dir");
    a.fx.umount();
    assert!(!holds_marker(&a.fx.data_dir), "plaintext of a written file is in the encrypted data dir");
    assert_no_named(&a.fx.data_dir, "after the first mount");

    // Without the flag, the encrypted data dir is refused, and nothing is changed.
    let out = a.try_mount(&["--cache-size", "8M"]);
    assert!(!out.success(), "an encrypted cache was mounted without --encrypt-cache");
    assert!(out.stderr.contains("encrypted at rest") && out.stderr.contains("--encrypt-cache"), "{}", out.stderr);

    // A remount reads everything back, the evicted data fetched from the store and stored
    // encrypted again.
    a.mount(&["--encrypt-cache", "--cache-size", "8M"]);
    check_tree(&a.fx.mountpoint, &files, "after a remount");
    check_named(&a.fx.mountpoint, "after a remount");
    a.fx.umount();
    assert!(!holds_marker(&a.fx.data_dir), "plaintext in the data dir after reads fetched data back");
    assert_no_named(&a.fx.data_dir, "after a remount");

    // A fresh node restores the workspace into an encrypted cache of its own.
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    b.mount(&["--encrypt-cache", "--cache-size", "64M"]);
    check_tree(&b.fx.mountpoint, &files, "on a fresh node");
    check_named(&b.fx.mountpoint, "on a fresh node");
    b.fx.umount();
    assert!(!holds_marker(&b.fx.data_dir), "plaintext in the fresh node's data dir");
    assert_no_named(&b.fx.data_dir, "on a fresh node (restored from the store)");
}

#[test]
fn a_plain_cache_with_data_refuses_encryption_and_the_check_can_see_plaintext() {
    common::require_fuse();
    let mut a = Node::init_file();
    a.mount(&[]);
    fs::write(a.fx.p("text"), MARKER.repeat(100)).expect("write");
    write_named(&a.fx.mountpoint);
    a.fx.umount();
    // The scan that finds no plaintext in an encrypted data dir finds it in a plain one.
    assert!(holds_marker(&a.fx.data_dir), "the plain data dir does not hold the written text");
    for marker in NAME_MARKERS {
        assert!(holds(&a.fx.data_dir, marker.as_bytes()), "the plain data dir does not hold {marker}");
    }
    let out = a.try_mount(&["--encrypt-cache"]);
    assert!(!out.success(), "a plain cache holding data was mounted with --encrypt-cache");
    assert!(out.stderr.contains("not encrypted") && out.stderr.contains("--data-dir"), "{}", out.stderr);
    // Refused before anything was touched: the plain mount still works.
    a.mount(&[]);
    assert_eq!(fs::read(a.fx.p("text")).expect("read"), MARKER.repeat(100));
    a.fx.umount();

    let out = a.try_mount(&["--encrypt-cache", "--no-store"]);
    assert!(!out.success() && out.stderr.contains("--no-store"), "{}", out.stderr);
}
