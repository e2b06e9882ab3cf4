//! `O_TMPFILE` on a real mount (the vendored fuser's `FUSE_TMPFILE`, see
//! `vendor/fuser/TIERFS-PATCH.md`), in the manner of pjdfstest: an unnamed file is an open
//! regular file with no link, listed nowhere, whose last close leaves nothing behind (its
//! data file included); `linkat` of its descriptor names it with its contents, and the name
//! survives a remount, a reset from the store and a `kill -9`, while an unnamed one does not
//! survive the crash and leaks no space; `O_EXCL` makes it unlinkable (the kernel's ENOENT);
//! the errors and the permission rule are a create's (the kernel checks write and search
//! permission on the directory; the owner and a setgid directory's group are tierfs's).

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use common::{Fixture, Rng, assert_io_errno, child_errno, cpath, data_file, in_child, wait_for_inodes};
use store_node::Node;

const MIB: usize = 1 << 20;

/// `open(dir, O_TMPFILE | O_RDWR | extra, mode)`.
fn open_tmpfile(dir: &Path, extra: i32, mode: u32) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE | extra).mode(mode).open(dir)
}

/// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW)`: how programs
/// without CAP_DAC_READ_SEARCH name an `O_TMPFILE` file; the errno on failure.
fn link_through_proc(file: &File, to: &Path) -> Result<(), i32> {
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL");
    let to = cpath(to);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc =
        unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if rc == 0 { Ok(()) } else { Err(common::errno()) }
}

/// `linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH)` (needs CAP_DAC_READ_SEARCH: the tests are root).
fn link_empty_path(file: &File, to: &Path) -> Result<(), i32> {
    let to = cpath(to);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::linkat(file.as_raw_fd(), c"".as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_EMPTY_PATH) };
    if rc == 0 { Ok(()) } else { Err(common::errno()) }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn inodes(fx: &Fixture) -> u64 {
    fx.status()["inodes"].as_u64().expect("inodes in status")
}

fn passthrough_writers(fx: &Fixture) -> u64 {
    fx.status()["passthrough"]["write_opens"].as_u64().expect("passthrough.write_opens in status")
}

/// An unnamed file: written, read and synced through its descriptor (through FUSE
/// passthrough when `passthrough`), seen by fstat as a regular file with no link and the mode
/// and owner asked for, in no listing; counted while open, and gone with its data file after
/// the last close.
fn check_an_unnamed_file_lives_while_open(fx: &Fixture, passthrough: bool) {
    fs::create_dir(fx.p("dir")).expect("mkdir");
    fs::write(fx.p("dir/kept"), b"kept").expect("write dir/kept");
    let (before, writers) = (inodes(fx), passthrough_writers(fx));
    let mut f = open_tmpfile(&fx.p("dir"), 0, 0o600).expect("open(dir, O_TMPFILE | O_RDWR, 0600)");
    assert_eq!(passthrough_writers(fx) - writers, u64::from(passthrough), "which path the handle took");
    let data = Rng::new(47).bytes(3 * MIB + 5);
    f.write_all(&data).expect("write to the unnamed file");
    f.sync_all().expect("fsync of the unnamed file");
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 0).expect("read from the unnamed file");
    assert!(back == data, "the unnamed file reads back other bytes than were written");
    let m = f.metadata().expect("fstat");
    assert!(m.file_type().is_file(), "not a regular file: {m:?}");
    assert_eq!((m.nlink(), m.mode() & 0o7777, m.uid(), m.len()), (0, 0o600, 0, data.len() as u64));
    assert_eq!(names_in(&fx.p("dir")), ["kept"], "the unnamed file is listed");
    assert_eq!(inodes(fx), before + 1, "the unnamed file is not counted while open");
    let data_file = data_file(&fx.data_dir, m.ino());
    assert!(data_file.exists(), "no data file at {} for the written unnamed file", data_file.display());

    drop(f);
    wait_for_inodes(fx, before, "the unnamed file is reclaimed at its last close");
    assert!(!data_file.exists(), "the unnamed file's data file {} is left behind", data_file.display());
    assert_eq!(names_in(&fx.p("dir")), ["kept"]);
}

#[test]
fn an_unnamed_file_lives_while_open_and_leaves_nothing() {
    check_an_unnamed_file_lives_while_open(&Fixture::mounted(), true);
}

#[test]
fn an_unnamed_file_lives_while_open_and_leaves_nothing_without_passthrough() {
    check_an_unnamed_file_lives_while_open(&Fixture::mounted_with(&["--no-passthrough"]), false);
}

#[test]
fn an_unnamed_file_lives_while_open_and_leaves_nothing_with_writeback_cache() {
    check_an_unnamed_file_lives_while_open(&Fixture::mounted_with(&["--writeback-cache"]), false);
}

/// `linkat` names an unnamed file with what it holds (both ways programs call it), the name
/// survives its close and a remount; with `O_EXCL` the kernel refuses (ENOENT), and a file
/// named once and unlinked again cannot be named again.
#[test]
fn linkat_names_an_unnamed_file_unless_it_was_opened_with_o_excl() {
    let mut fx = Fixture::mounted();
    let before = inodes(&fx);
    let mut f = open_tmpfile(&fx.mountpoint, 0, 0o640).expect("O_TMPFILE");
    f.write_all(b"complete before it has a name").expect("write");
    link_through_proc(&f, &fx.p("named")).expect("linkat of /proc/self/fd/N");
    assert_eq!(f.metadata().expect("fstat").nlink(), 1);
    assert_eq!(fs::read(fx.p("named")).expect("read the new name"), b"complete before it has a name");
    link_empty_path(&f, &fx.p("second")).expect("linkat with AT_EMPTY_PATH");
    f.write_all(b", and after").expect("write after linking");
    let ino = f.metadata().expect("fstat").ino();
    drop(f);
    assert_eq!(names_in(&fx.mountpoint), ["named", "second"]);

    fx.remount();
    for name in ["named", "second"] {
        let m = fs::metadata(fx.p(name)).expect("stat after the remount");
        assert_eq!((m.ino(), m.nlink(), m.mode() & 0o7777), (ino, 2, 0o640), "{name}");
        assert_eq!(fs::read(fx.p(name)).expect("read after the remount"), b"complete before it has a name, and after");
    }
    assert_eq!(inodes(&fx), before + 1);

    let excl = open_tmpfile(&fx.mountpoint, libc::O_EXCL, 0o600).expect("O_TMPFILE | O_EXCL");
    assert_eq!(link_through_proc(&excl, &fx.p("excl")), Err(libc::ENOENT), "linkat of an O_EXCL unnamed file");
    let once = open_tmpfile(&fx.mountpoint, 0, 0o600).expect("O_TMPFILE");
    link_through_proc(&once, &fx.p("once")).expect("linkat");
    fs::remove_file(fx.p("once")).expect("unlink while open");
    assert_eq!(link_through_proc(&once, &fx.p("twice")), Err(libc::ENOENT), "linkat of an unlinked file");
    assert_eq!(inodes(&fx), before + 3, "the two open unnamed files are not counted");
    drop((excl, once));
    wait_for_inodes(&fx, before + 1, "the unnamed files are reclaimed at their last close");
    assert_eq!(names_in(&fx.mountpoint), ["named", "second"]);
}

/// The errors of an open of a directory with `O_TMPFILE`, and its permission rule as a user
/// other than root: EACCES without write permission on the directory; with it, the file is the
/// caller's, in the group of a setgid directory.
#[test]
fn o_tmpfile_errors_and_permissions_are_those_of_a_create() {
    let fx = Fixture::mounted();
    fs::write(fx.p("file"), b"x").expect("write");
    assert_io_errno(open_tmpfile(&fx.p("file"), 0, 0o600), libc::ENOTDIR, "O_TMPFILE on a regular file");
    assert_io_errno(open_tmpfile(&fx.p("missing"), 0, 0o600), libc::ENOENT, "O_TMPFILE on a missing directory");
    let read_only = OpenOptions::new().read(true).custom_flags(libc::O_TMPFILE).open(&fx.mountpoint);
    assert_io_errno(read_only, libc::EINVAL, "O_TMPFILE without write access");
    fs::create_dir(fx.p("closed")).expect("mkdir");
    fs::set_permissions(fx.p("closed"), fs::Permissions::from_mode(0o755)).expect("chmod 755");
    fs::create_dir(fx.p("shared")).expect("mkdir");
    std::os::unix::fs::chown(fx.p("shared"), Some(0), Some(4242)).expect("chown");
    fs::set_permissions(fx.p("shared"), fs::Permissions::from_mode(0o2777)).expect("chmod 2777");

    let (closed, shared) = (cpath(&fx.p("closed")), cpath(&fx.p("shared")));
    let code = in_child(|| {
        // SAFETY: raw syscalls only (async-signal-safe) in the forked child.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return 100;
            }
            if libc::open(closed.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) >= 0 {
                return 101;
            }
            if child_errno() != libc::EACCES {
                return 102;
            }
            let fd = libc::open(shared.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600);
            let mut st: libc::stat = std::mem::zeroed();
            if fd < 0 || libc::fstat(fd, &mut st) != 0 {
                return 103;
            }
            match (st.st_uid, st.st_gid, st.st_nlink) {
                (65534, 4242, 0) => 0,
                _ => 104,
            }
        }
    });
    assert_eq!(
        code, 0,
        "as nobody (100: setuid, 101: O_TMPFILE in a 0755 root directory worked, 102: it failed with \
         another errno than EACCES, 103: O_TMPFILE in a 2777 directory failed, 104: wrong owner, group or nlink)"
    );
    assert_eq!(names_in(&fx.p("closed")), Vec::<String>::new());
    assert_eq!(names_in(&fx.p("shared")), Vec::<String>::new());
}

/// A file named through `linkat` is in the store like any other: it comes back on a fresh
/// node (empty data dir) after a runtime reset, with `--encrypt-cache` on both nodes.
#[test]
fn a_named_unnamed_file_comes_back_after_a_reset_from_the_store() {
    let mut a = Node::init_file();
    a.mount(&["--encrypt-cache"]);
    let data = Rng::new(7).bytes(5 * MIB);
    let mut f = open_tmpfile(&a.fx.mountpoint, 0, 0o644).expect("O_TMPFILE");
    f.write_all(&data).expect("write");
    link_through_proc(&f, &a.fx.p("checkpoint.pt")).expect("linkat");
    let unnamed = open_tmpfile(&a.fx.mountpoint, 0, 0o600).expect("O_TMPFILE");
    unnamed.write_all_at(b"never named", 0).expect("write");
    a.sync("named").assert_success("tierfs sync");
    drop((f, unnamed));
    a.fx.umount();
    a.wipe_local_state();

    let mut b = Node::new(&a.store_file);
    b.mount(&["--encrypt-cache"]);
    assert_eq!(names_in(&b.fx.mountpoint), ["checkpoint.pt"]);
    let back = fs::read(b.fx.p("checkpoint.pt")).expect("read after the reset");
    assert!(back == data, "the named file came back with other bytes ({} of {})", back.len(), data.len());
    assert_eq!(inodes(&b.fx), 2, "the root and the named file, and nothing of the unnamed one");
    b.fx.umount();
}

/// `kill -9` of the daemon while one unnamed file is open and another was named: after the
/// restart the named one is there with its bytes, the unnamed one is gone with its data file.
#[test]
fn kill_9_with_an_unnamed_file_open_leaves_neither_it_nor_its_data() {
    let mut fx = Fixture::new();
    let mut server = fx.spawn_foreground();
    let mut unnamed = open_tmpfile(&fx.mountpoint, 0, 0o600).expect("O_TMPFILE");
    unnamed.write_all(&vec![7u8; 2 * MIB]).expect("write");
    unnamed.sync_all().expect("fsync");
    let ino = unnamed.metadata().expect("fstat").ino();
    let mut named = open_tmpfile(&fx.mountpoint, 0, 0o600).expect("O_TMPFILE");
    named.write_all(b"named before the crash").expect("write");
    link_through_proc(&named, &fx.p("named")).expect("linkat");
    named.sync_all().expect("fsync");
    let leftover = data_file(&fx.data_dir, ino);
    assert!(leftover.exists(), "no data file at {} for the written unnamed file", leftover.display());

    server.kill9();
    drop((unnamed, named));
    fx.mount();
    assert_eq!(names_in(&fx.mountpoint), ["named"]);
    assert_eq!(fs::read(fx.p("named")).expect("read after the restart"), b"named before the crash");
    assert_eq!(inodes(&fx), 2, "the root and the named file: the unnamed one was not reclaimed");
    assert!(!leftover.exists(), "the unnamed file's data file {} leaked", leftover.display());
    fx.umount();
}
