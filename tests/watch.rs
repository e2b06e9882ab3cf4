//! Watch mode's core (`tierfs::watch::Mirror`) on real directories, real RocksDB and a real
//! `file://` store: a tree mirrored, snapshotted and restored into an empty directory on a
//! fresh node; incremental passes that read and upload only what changed and record renames as
//! renames; reads raced by a writer never recorded torn; bad directories refused with nothing
//! changed. (Change notification is the daemon's; its tests use real inotify.)

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tierfs::session::{Access, Session};
use tierfs::vfs::{Caller, ROOT_INO};
use tierfs::watch::{Mirror, Start, WatchError};
use tierfs_test_support::file_store::FileStore;

const PASSPHRASE: &[u8] = b"watch test";
const MIB: u64 = 1 << 20;

/// The shared `file://` fixture, with watch mode's sessions (a small cache) and directories.
struct Fixture(FileStore);

impl std::ops::Deref for Fixture {
    type Target = FileStore;
    fn deref(&self) -> &FileStore {
        &self.0
    }
}

impl Fixture {
    fn new() -> Fixture {
        Fixture(FileStore::new(PASSPHRASE))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A session on data dir `data` (a small cache: watch mode keeps no copy).
    fn open(&self, data: &str) -> Session {
        let mut config = self.config(data, Access::ReadWrite);
        config.cache_size = Some(8 * MIB);
        Session::open(config, self.rt.handle()).expect("open session")
    }

    fn dir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        fs::create_dir_all(&p).expect("mkdir");
        p
    }
}

/// A tree with what watch mode must carry: nested dirs, an executable, a file with a hole of
/// several chunks before its end, hard links, symlinks (a loop among them) and a fifo.
fn build_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).expect("mkdir -p");
    fs::write(root.join("a/b/c/deep.txt"), b"deep").expect("write");
    fs::write(root.join("train.py"), b"print('hi')\n").expect("write");
    let run = root.join("run.sh");
    fs::write(&run, b"#!/bin/sh\necho ok\n").expect("write");
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).expect("chmod");
    let sparse = fs::File::create(root.join("sparse.img")).expect("create");
    sparse.write_all_at(b"head", 0).expect("write");
    sparse.write_all_at(b"tail", 13 * MIB).expect("write");
    let big: Vec<u8> = (0..9 * MIB).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    fs::write(root.join("a/big.bin"), &big).expect("write");
    fs::hard_link(root.join("train.py"), root.join("a/train-link.py")).expect("link");
    std::os::unix::fs::symlink("train.py", root.join("to-train")).expect("symlink");
    std::os::unix::fs::symlink("loop2", root.join("loop1")).expect("symlink");
    std::os::unix::fs::symlink("loop1", root.join("loop2")).expect("symlink");
    let fifo = std::ffi::CString::new(root.join("a/pipe").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
    fs::write(root.join("empty"), b"").expect("write");
}

/// Each entry under `root`: kind, mode, size, mtime (files), content or target, and which
/// entries share an inode.
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> =
            fs::read_dir(root.join(&rel)).expect("list").map(|e| e.expect("entry").file_name()).collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let p = root.join(&r);
            let md = fs::symlink_metadata(&p).expect("lstat");
            let ft = md.file_type();
            let what = if ft.is_dir() {
                stack.push(r.clone());
                format!("dir {:o}", md.mode() & 0o7777)
            } else if ft.is_symlink() {
                format!("symlink -> {}", fs::read_link(&p).expect("readlink").display())
            } else if ft.is_file() {
                let data = fs::read(&p).expect("read");
                let link = if md.nlink() > 1 {
                    let first = inodes.entry(md.ino()).or_insert_with(|| r.display().to_string());
                    format!(" linked with {first}")
                } else {
                    String::new()
                };
                format!(
                    "file {:o} {} bytes mtime {}.{:09} blake3 {}{link}",
                    md.mode() & 0o7777,
                    md.len(),
                    md.mtime(),
                    md.mtime_nsec(),
                    blake3::hash(&data)
                )
            } else {
                format!("special {:o}", md.mode())
            };
            out.insert(r.display().to_string(), what);
        }
    }
    out
}

#[test]
fn a_mirrored_tree_restores_identical_into_an_empty_directory_on_a_fresh_node() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    build_tree(&src);
    let session = fx.open("data-a");
    let mut mirror = Mirror::new(session.vfs().clone(), &src).expect("mirror");
    assert_eq!(mirror.start().expect("start"), Start::Fresh);
    let pass = mirror.rescan().expect("first pass");
    assert!(pass.unreadable.is_empty() && pass.unstable.is_empty(), "{pass:?}");
    assert_eq!(pass.counts.linked, 1, "{pass:?}");
    // The 13 MiB sparse file: two chunks with data, the ones between are holes, never read.
    assert!(pass.counts.bytes_read < 9 * MIB + 2 * 4 * MIB + 4096, "{pass:?}");
    // The mount-side view holds the same bytes, fetched from the store.
    let vfs = session.vfs();
    let big = vfs.lookup(vfs.lookup(ROOT_INO, b"a").expect("a").ino, b"big.bin").expect("big.bin");
    let fh = vfs.open(&Caller::ROOT, big.ino, libc::O_RDONLY).expect("open");
    let got = vfs.read(big.ino, fh, 5 * MIB, 4096).expect("read");
    assert_eq!(got, fs::read(src.join("a/big.bin")).expect("read")[5 << 20..(5 << 20) + 4096]);
    vfs.release(big.ino, fh).expect("release");
    session.sync(Some("tree".into()), Duration::from_secs(30)).expect("snapshot");
    fx.close(session);

    // A fresh node: an empty data dir and an empty directory.
    let dst = fx.dir("dst");
    let session = fx.open("data-b");
    let mut mirror = Mirror::new(session.vfs().clone(), &dst).expect("mirror");
    let Start::Restored(counts) = mirror.start().expect("restore") else { panic!("not restored") };
    assert!(counts.created > 10, "{counts:?}");
    assert_eq!(describe(&dst), describe(&src));
    // Holes stay holes.
    let alloc = fs::metadata(dst.join("sparse.img")).expect("stat").blocks() * 512;
    assert!(alloc < 4 * MIB, "the restored sparse file allocates {alloc} bytes");
    // The first pass after a restore reads nothing again and uploads nothing.
    let pass = mirror.rescan().expect("pass after restore");
    assert_eq!((pass.counts.files_read, pass.counts.chunks_uploaded, pass.counts.created), (0, 0, 0), "{pass:?}");
    fx.close(session);
}

#[test]
fn passes_read_and_upload_only_what_changed_and_renames_stay_renames() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    build_tree(&src);
    let session = fx.open("data");
    let mut mirror = Mirror::new(session.vfs().clone(), &src).expect("mirror");
    mirror.start().expect("start");
    mirror.rescan().expect("first pass");

    // Nothing changed: nothing read.
    let pass = mirror.rescan().expect("idle pass");
    assert_eq!((pass.counts.files_read, pass.counts.bytes_read, pass.counts.chunks_uploaded), (0, 0, 0), "{pass:?}");

    // 1 MiB appended to the 9 MiB file: its last chunk and a new one change.
    let f = fs::OpenOptions::new().append(true).open(src.join("a/big.bin")).expect("open");
    f.write_all_at(&vec![7u8; MIB as usize], 9 * MIB).expect("append");
    drop(f);
    let pass = mirror.rescan().expect("pass");
    assert_eq!(pass.counts.files_read, 1, "{pass:?}");
    assert!(pass.counts.chunks_uploaded <= 2 && pass.counts.bytes_uploaded <= 4 * MIB + MIB, "{pass:?}");

    // A file and a directory renamed: renames, nothing read.
    fs::rename(src.join("a/big.bin"), src.join("big-moved.bin")).expect("rename");
    fs::rename(src.join("a/b"), src.join("b-moved")).expect("rename dir");
    let pass = mirror.rescan().expect("pass");
    assert_eq!((pass.counts.renamed, pass.counts.files_read, pass.counts.created), (2, 0, 0), "{pass:?}");
    let vfs = session.vfs();
    assert!(vfs.lookup(ROOT_INO, b"big-moved.bin").is_ok() && vfs.lookup(ROOT_INO, b"b-moved").is_ok());

    // A mode change alone (to a setuid mode, which the owner the scan sets with it must not
    // clear), and a removal.
    fs::set_permissions(src.join("train.py"), fs::Permissions::from_mode(0o4700)).expect("chmod");
    fs::remove_dir_all(src.join("b-moved")).expect("rm -rf");
    let pass = mirror.rescan().expect("pass");
    assert_eq!(pass.counts.files_read, 0, "{pass:?}");
    assert!(pass.counts.attrs_set >= 1 && pass.counts.removed == 3, "{pass:?}");
    assert!(vfs.lookup(ROOT_INO, b"b-moved").is_err());
    let train = vfs.lookup(ROOT_INO, b"train.py").expect("train.py");
    assert_eq!(train.perm, 0o4700);

    // A user xattr alone (only the ctime moves): seen, and not again in the next pass.
    let c = std::ffi::CString::new(src.join("run.sh").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: valid C strings and a 3-byte value.
    let rc = unsafe { libc::setxattr(c.as_ptr(), c"user.tag".as_ptr(), b"yes".as_ptr().cast(), 3, 0) };
    assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    let pass = mirror.rescan().expect("pass");
    assert_eq!((pass.counts.xattrs_set, pass.counts.files_read), (1, 0), "{pass:?}");
    let run = vfs.lookup(ROOT_INO, b"run.sh").expect("run.sh");
    assert_eq!(vfs.getxattr(run.ino, b"user.tag").expect("xattr in the workspace"), b"yes");
    assert_eq!(mirror.rescan().expect("pass").counts.xattrs_set, 0);

    // .tierfsignore: matching paths are not synced; what the workspace had of them stays.
    fs::write(src.join(".tierfsignore"), "*.tmp\ncache/\nempty\n").expect("write");
    fs::write(src.join("scratch.tmp"), b"scratch").expect("write");
    fs::create_dir(src.join("cache")).expect("mkdir");
    fs::write(src.join("cache/blob"), b"blob").expect("write");
    fs::remove_file(src.join("empty")).expect("rm");
    let pass = mirror.rescan().expect("pass");
    assert!(pass.unreadable.is_empty(), "{pass:?}");
    assert!(vfs.lookup(ROOT_INO, b".tierfsignore").is_ok(), "the ignore file itself is synced");
    assert!(
        vfs.lookup(ROOT_INO, b"scratch.tmp").is_err() && vfs.lookup(ROOT_INO, b"cache").is_err(),
        "ignored paths synced"
    );
    assert!(vfs.lookup(ROOT_INO, b"empty").is_ok(), "an ignored path was removed from the workspace");

    // Only the changed directory, as the watcher asks.
    fs::write(src.join("a/new.txt"), b"new").expect("write");
    let pass = mirror.rescan_dirs(&[PathBuf::from("a")]).expect("pass of a");
    assert_eq!((pass.counts.created, pass.counts.files_read), (1, 1), "{pass:?}");
    // (new.txt may have the inode number `empty` had: never a rename of an ignored path.)
    assert!(vfs.lookup(ROOT_INO, b"empty").is_ok(), "an ignored path left the workspace");
    fx.close(session);
}

/// A file rewritten over and over in `src` while passes read it: no pass records a torn
/// version. Returns the reads discarded as torn and the reads made through a clone.
fn rewrite_race(fx: &Fixture, src: &Path, data: &str) -> (u64, u64) {
    const LEN: usize = 6 << 20;
    fs::write(src.join("hot.bin"), vec![b'a'; LEN]).expect("write");
    let session = fx.open(data);
    let mut mirror = Mirror::new(session.vfs().clone(), src).expect("mirror");
    mirror.start().expect("start");
    mirror.rescan().expect("first pass");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (src.join("hot.bin"), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(1);
                let Ok(f) = fs::OpenOptions::new().write(true).truncate(true).open(&path) else { return };
                for piece in 0..6 {
                    if f.write_all_at(&vec![b'a' + n % 26; LEN / 6], (piece * LEN / 6) as u64).is_err() {
                        return;
                    }
                }
            }
        })
    };
    let vfs = session.vfs().clone();
    // Passes until a few reads were raced, or a few cloned (each pass checks what it
    // recorded), within 60 s. Counted apart: on XFS a raced read before the first clones must
    // not end the run with fewer clones than the test asks for.
    let (mut torn, mut cloned) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut passes = 0;
    while ((torn < 3 && cloned < 3) || passes < 20) && std::time::Instant::now() < deadline {
        passes += 1;
        let pass = mirror.rescan().expect("pass");
        torn += pass.counts.torn_reads;
        cloned += pass.counts.cloned_reads;
        let attr = vfs.lookup(ROOT_INO, b"hot.bin").expect("lookup");
        let fh = vfs.open(&Caller::ROOT, attr.ino, libc::O_RDONLY).expect("open");
        let mut data = Vec::new();
        while (data.len() as u64) < attr.size {
            data.extend(vfs.read(attr.ino, fh, data.len() as u64, 1 << 20).expect("read"));
        }
        vfs.release(attr.ino, fh).expect("release");
        // Every version the writer leaves between its calls is whole: empty right after the
        // truncate, then one more sixth per write, all of one letter. A read raced by a change
        // would show two letters, or zeros where a write landed after the size was read.
        assert_eq!(data.len() % (LEN / 6), 0, "a version no write left");
        assert!(data.iter().all(|&b| b == data[0]), "a torn version was recorded");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("writer");
    fx.close(session);
    (torn, cloned)
}

#[test]
fn a_file_rewritten_during_passes_is_never_recorded_torn() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    let (torn, cloned) = rewrite_race(&fx, &src, "data");
    assert!(torn > 0, "the writer never raced a read: the test tested nothing");
    assert_eq!(cloned, 0, "a clone on a filesystem without reflinks");
}

/// An XFS file system (reflinks on) in a sparse image on a loop device, unmounted on drop.
struct Xfs {
    mnt: PathBuf,
}

impl Xfs {
    /// `None` (the test skips) only outside CI, as a user without root or mkfs.xfs; CI has
    /// both (scripts/setup-debian.sh installs xfsprogs), and there a failure fails the test.
    fn mount(under: &Path) -> Option<Xfs> {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let have_mkfs = std::process::Command::new("mkfs.xfs").arg("-V").output().is_ok_and(|o| o.status.success());
        if !(root && have_mkfs) {
            assert!(std::env::var_os("CI").is_none(), "CI must run the XFS test: root {root}, mkfs.xfs {have_mkfs}");
            eprintln!("skipped: a loop-mounted XFS needs root and mkfs.xfs (xfsprogs)");
            return None;
        }
        let img = under.join("xfs.img");
        fs::File::create(&img).expect("image").set_len(512 * MIB).expect("sparse image");
        let run = |cmd: &mut std::process::Command| {
            let out = cmd.output().expect("run");
            assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(std::process::Command::new("mkfs.xfs").args(["-q", "-m", "reflink=1"]).arg(&img));
        let mnt = under.join("xfs");
        fs::create_dir_all(&mnt).expect("mkdir");
        run(std::process::Command::new("mount").args(["-o", "loop"]).arg(&img).arg(&mnt));
        Some(Xfs { mnt })
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let done = std::process::Command::new("umount").arg(&self.mnt).status().is_ok_and(|s| s.success());
        if !done {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Where the filesystem has reflinks, a changed file is read through a clone taken in one
/// step: the writer's versions are recorded whole without the read-and-verify retries.
#[test]
fn on_xfs_changed_files_are_read_through_reflink_clones() {
    let fx = Fixture::new();
    let Some(xfs) = Xfs::mount(fx.dir.path()) else { return };
    let src = xfs.mnt.join("src");
    fs::create_dir_all(&src).expect("mkdir");
    let (_torn, cloned) = rewrite_race(&fx, &src, "data");
    assert!(cloned >= 3, "reads on XFS did not go through clones ({cloned})");
    // The clones were unnamed and are gone: nothing but the file is left in the directory.
    let names: Vec<_> = fs::read_dir(&src).expect("readdir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("hot.bin")]);
    drop(xfs);
}

#[test]
fn bad_directories_are_refused_and_nothing_changes() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    fs::write(src.join("mine.txt"), b"mine").expect("write");
    let session = fx.open("data");
    let vfs = session.vfs().clone();
    let mut mirror = Mirror::new(vfs.clone(), &src).expect("mirror");
    mirror.start().expect("start");
    mirror.rescan().expect("pass");

    assert!(matches!(Mirror::new(vfs.clone(), &fx.path("missing")), Err(WatchError::Missing(_))));
    assert!(matches!(Mirror::new(vfs.clone(), &src.join("mine.txt")), Err(WatchError::NotADirectory(_))));
    let inside = fx.path("data").join("sub");
    fs::create_dir_all(&inside).expect("mkdir");
    assert!(matches!(Mirror::new(vfs.clone(), &inside), Err(WatchError::Overlaps { .. })));

    // A directory with other files: refused, both sides untouched.
    let other = fx.dir("other");
    fs::write(other.join("theirs.txt"), b"theirs").expect("write");
    let before = describe(&other);
    let err = Mirror::new(vfs.clone(), &other).expect("mirror").start().expect_err("a foreign directory");
    assert!(matches!(err, WatchError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("theirs.txt") && err.to_string().contains("mine.txt"), "{err}");
    assert_eq!(describe(&other), before);
    assert!(vfs.lookup(ROOT_INO, b"mine.txt").is_ok() && vfs.lookup(ROOT_INO, b"theirs.txt").is_err());
    fx.close(session);
}

/// Every name in the workspace, as paths from its root.
fn workspace_names(session: &Session) -> Vec<String> {
    let meta = session.vfs().meta();
    let mut out = Vec::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((ino, at)) = stack.pop() {
        for (name, child, kind) in meta.list_dir(ino).expect("listing the workspace") {
            let path = format!("{at}/{}", String::from_utf8_lossy(&name));
            if kind == tierfs::types::FileKind::Dir {
                stack.push((child, path.clone()));
            }
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The swap the watcher cannot prevent (a directory of the tree replaced by a symlink to
/// somewhere else after a listing named it) must lead no pass out of the tree: a pass for
/// changes inside the swapped directory, and a full pass, read nothing outside, and the
/// workspace gets the symlink as a symlink. Nor is `.tierfsignore` read through a symlink.
#[test]
fn a_directory_swapped_for_a_symlink_leads_no_pass_outside_the_tree() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    fs::create_dir_all(src.join("d/sub")).expect("mkdir");
    fs::write(src.join("d/sub/a.txt"), b"inside").expect("write");
    let outside = fx.dir("outside");
    fs::create_dir_all(outside.join("sub")).expect("mkdir");
    fs::write(outside.join("sub/secret.txt"), b"marker-0b7e").expect("write");
    fs::write(outside.join("ignore-all"), b"*\n").expect("write");
    let session = fx.open("data");
    let mut mirror = Mirror::new(session.vfs().clone(), &src).expect("mirror");
    mirror.start().expect("start");
    mirror.rescan().expect("first pass");
    assert!(workspace_names(&session).contains(&"/d/sub/a.txt".to_owned()));

    fs::rename(src.join("d"), src.join("d.old")).expect("rename");
    std::os::unix::fs::symlink(&outside, src.join("d")).expect("symlink");
    // What inotify reports for a change inside the directory as it was.
    let pass = mirror.rescan_dirs(&[PathBuf::from("d/sub")]).expect("a pass for d/sub");
    // The pass falls back to the root, where d.old is new: its 6 bytes are the only ones read.
    assert!(pass.counts.bytes_read <= b"inside".len() as u64, "read a file outside the tree: {pass:?}");
    let names = workspace_names(&session);
    assert!(!names.iter().any(|n| n.contains("secret")), "{names:?}");

    std::os::unix::fs::symlink(outside.join("ignore-all"), src.join(".tierfsignore")).expect("symlink");
    let pass = mirror.rescan().expect("a full pass");
    let names = workspace_names(&session);
    assert!(!names.iter().any(|n| n.contains("secret")), "{names:?}");
    assert!(names.contains(&"/d.old/sub/a.txt".to_owned()), "the rename is seen: {names:?} {pass:?}");
    let d = session.vfs().lookup(ROOT_INO, b"d").expect("d");
    assert_eq!(d.kind, tierfs::types::FileKind::Symlink, "d is the symlink it is now");
    assert_eq!(session.vfs().readlink(d.ino).expect("readlink"), outside.as_os_str().as_encoded_bytes());
    fx.close(session);
}

/// Bytes no two chunks of which are equal (so none is deduplicated away).
fn distinct_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// A file with more new data than one pack holds fills the pack while it is being read: the
/// pack is put mid-file, and the blocks it carried must still be recorded with the file (a
/// 25 MiB shared library of numpy, `pip install`ed into a watched directory, came back from
/// the store as "not in the local block index").
#[test]
fn a_file_larger_than_a_pack_restores_on_a_fresh_node() {
    let fx = Fixture::new();
    let src = fx.dir("src");
    let data = distinct_bytes(25 * MIB as usize + 4321, 7);
    fs::write(src.join("big.so"), &data).expect("write");
    let session = fx.open("data-a");
    let mut mirror = Mirror::new(session.vfs().clone(), &src).expect("mirror");
    assert_eq!(mirror.start().expect("start"), Start::Fresh);
    mirror.rescan().expect("first pass");
    session.sync(Some("big".into()), Duration::from_secs(60)).expect("snapshot");
    fx.close(session);

    let dst = fx.dir("dst");
    let session = fx.open("data-b");
    let mut mirror = Mirror::new(session.vfs().clone(), &dst).expect("mirror");
    let Start::Restored(_) = mirror.start().expect("restore") else { panic!("not restored") };
    assert!(fs::read(dst.join("big.so")).expect("read") == data, "the restored file differs");
    fx.close(session);
}
