//! Real-mount POSIX behaviour: each test mounts a fresh tierfs workspace with the real
//! `tierfs mount` (background daemon, default options: no writeback cache, 60 s attribute and entry TTLs;
//! the tests whose outcome depends on who owns timestamps and dirty pages run again with
//! `--writeback-cache`, see [`both_cache_modes`])
//! and drives it only through the kernel, with `std::fs` and raw `libc` calls.
//!
//! What this proves: file contents survive every write pattern programs use (sequential,
//! random offsets, sparse with holes that read as zeros and show up in SEEK_DATA/SEEK_HOLE,
//! O_APPEND, truncate both ways, fallocate modes, copy_file_range, shared writable mmap);
//! the namespace behaves as on a local filesystem (rename incl. RENAME_NOREPLACE and
//! RENAME_EXCHANGE, hard links with exact nlink right after link/unlink, symlinks,
//! ENOTEMPTY, ENAMETOOLONG, unlink while open); metadata operations (xattrs with their
//! create/replace errors, chmod/chown, utimensat with UTIME_NOW/UTIME_OMIT) take effect and
//! are not undone by a late writeback; flock and fcntl locks exclude each other across
//! processes; statfs is sane; a git-like workload is intact; everything persists across
//! unmount and mount; and a second mount of a data directory in use is refused with a
//! message naming it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{
    Fixture, Rng, assert_errno, assert_io_errno, child_errno, cpath, getxattr, in_child, is_mounted, run, setxattr,
    wait_for_inodes, wait_for_status,
};

const MIB: u64 = 1 << 20;

// ---- small helpers ---------------------------------------------------------------------

fn meta(path: &Path) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()))
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn write(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()))
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new().read(true).write(true).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn create_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()))
}

/// Compares byte strings without printing megabytes on failure.
#[track_caller]
fn assert_bytes_eq(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let first_diff = actual.iter().zip(expected).position(|(a, b)| a != b);
    panic!(
        "{what}: contents differ: actual {} bytes, expected {} bytes, first difference at {:?}",
        actual.len(),
        expected.len(),
        first_diff.or(Some(actual.len().min(expected.len())))
    );
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn set<const N: usize>(names: [&str; N]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> i64 {
    let (from, to) = (cpath(from), cpath(to));
    // SAFETY: two valid NUL-terminated paths; renameat2 has no other preconditions.
    unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) }
}

fn lsetxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> i64 {
    let (p, n) = (cpath(path), CString::new(name).expect("xattr name"));
    // SAFETY: valid C strings and a value buffer of the given length.
    (unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) }) as i64
}

fn listxattr(path: &Path) -> BTreeSet<String> {
    let p = cpath(path);
    // SAFETY: size probe with a NULL buffer.
    let size = unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
    assert!(size >= 0, "listxattr {}: {}", path.display(), io::Error::last_os_error());
    let mut buf = vec![0u8; size as usize];
    // SAFETY: buf is valid for buf.len() bytes.
    let got = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(got >= 0, "listxattr {}: {}", path.display(), io::Error::last_os_error());
    buf.truncate(got as usize);
    buf.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}

fn removexattr(path: &Path, name: &str) -> i64 {
    let (p, n) = (cpath(path), CString::new(name).expect("xattr name"));
    // SAFETY: valid C strings.
    (unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }) as i64
}

fn lseek(file: &File, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn utimens(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> i64 {
    let p = cpath(path);
    let times =
        [libc::timespec { tv_sec: atime.0, tv_nsec: atime.1 }, libc::timespec { tv_sec: mtime.0, tv_nsec: mtime.1 }];
    // SAFETY: a valid path and an array of two timespecs.
    (unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }) as i64
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs() as i64
}

// ---- file contents -----------------------------------------------------------------------

#[test]
fn create_write_read_back() {
    let fx = Fixture::mounted();
    let mut rng = Rng::new(0xC0FFEE);
    let big = rng.bytes((3 * MIB + 12_345) as usize);
    write(&fx.p("big"), &big);
    write(&fx.p("small"), b"hello, tierfs\n");
    File::create(fx.p("empty")).expect("creating an empty file");

    assert_bytes_eq(&read(&fx.p("big")), &big, "big");
    assert_eq!(read(&fx.p("small")), b"hello, tierfs\n");
    assert_eq!(read(&fx.p("empty")), b"");
    assert_eq!(meta(&fx.p("big")).len(), big.len() as u64);
    assert!(meta(&fx.p("big")).is_file());
    assert_eq!(names_in(&fx.mountpoint), set(["big", "empty", "small"]));

    // Overwrite in place through one handle, read through another.
    let f = open_rw(&fx.p("big"));
    let patch = rng.bytes(100_000);
    f.write_all_at(&patch, MIB - 7).expect("pwrite");
    let mut expected = big.clone();
    expected[(MIB - 7) as usize..(MIB - 7) as usize + patch.len()].copy_from_slice(&patch);
    assert_bytes_eq(&read(&fx.p("big")), &expected, "big after an overwrite, before close");
    drop(f);
    assert_bytes_eq(&read(&fx.p("big")), &expected, "big after an overwrite");
    assert_eq!(meta(&fx.p("big")).len(), big.len() as u64, "an overwrite inside the file keeps its size");

    // Contents must have reached tierfs, not just the kernel's page cache.
    let mut fx = fx;
    fx.remount();
    assert_bytes_eq(&read(&fx.p("big")), &expected, "big after remount");
    assert_eq!(read(&fx.p("small")), b"hello, tierfs\n");
}

#[test]
fn random_writes_at_offsets() {
    let fx = Fixture::mounted();
    let seed = Rng::seed_from_env();
    println!("random_writes_at_offsets seed {seed} (TIERFS_TEST_SEED={seed} replays)");
    let mut rng = Rng::new(seed);
    let path = fx.p("random");
    let f = create_rw(&path);
    let mut model: Vec<u8> = Vec::new();
    for i in 0..300 {
        let offset = rng.range(0, 12 * MIB) as usize;
        let len = rng.range(1, 70_000) as usize;
        let data = rng.bytes(len);
        f.write_all_at(&data, offset as u64).expect("pwrite");
        if model.len() < offset + len {
            model.resize(offset + len, 0);
        }
        model[offset..offset + len].copy_from_slice(&data);
        if i % 60 == 59 {
            assert_eq!(f.metadata().expect("fstat").len(), model.len() as u64, "size after {} writes", i + 1);
            assert_bytes_eq(&read(&path), &model, "contents through a second handle");
        }
    }
    // Random reads through the writing handle, including reads that cross end of file.
    for _ in 0..200 {
        let offset = rng.range(0, model.len() as u64 + 10_000) as usize;
        let len = rng.range(1, 200_000) as usize;
        let mut buf = vec![0u8; len];
        let mut got = 0;
        loop {
            let n = f.read_at(&mut buf[got..], (offset + got) as u64).expect("pread");
            if n == 0 {
                break;
            }
            got += n;
            if got == len {
                break;
            }
        }
        let end = (offset + len).min(model.len());
        let expected = if offset >= model.len() { &[][..] } else { &model[offset..end] };
        assert_bytes_eq(&buf[..got], expected, &format!("pread({offset}, {len})"));
    }
    drop(f);
    let mut fx = fx;
    fx.remount();
    assert_bytes_eq(&read(&path), &model, "random writes after remount");
}

#[test]
fn sparse_files_read_zeros_and_report_holes() {
    let fx = Fixture::mounted();
    let path = fx.p("sparse");
    let block = vec![0xABu8; 4096];
    {
        let f = create_rw(&path);
        f.set_len(16 * MIB).expect("ftruncate up");
        f.write_all_at(&block, 0).expect("pwrite at 0");
        f.write_all_at(&block, 8 * MIB).expect("pwrite at 8 MiB");
        f.sync_all().expect("fsync");
    }
    let contents = read(&path);
    assert_eq!(contents.len() as u64, 16 * MIB);
    let mut expected = vec![0u8; (16 * MIB) as usize];
    expected[..4096].copy_from_slice(&block);
    expected[(8 * MIB) as usize..(8 * MIB) as usize + 4096].copy_from_slice(&block);
    assert_bytes_eq(&contents, &expected, "a sparse file reads zeros in its holes");

    // With the writeback cache the kernel answers SEEK_DATA/SEEK_HOLE from its own size (the
    // whole file is data; see docs/SEMANTICS.md), which POSIX allows. What must hold on any
    // mount (checked exactly for the default mount below): SEEK_DATA never jumps over written bytes and SEEK_HOLE never reports a hole where
    // bytes were written, so `cp`/`tar` that skip holes never lose data.
    let f = File::open(&path).expect("open sparse");
    let eight = (8 * MIB) as i64;
    let end = (16 * MIB) as i64;
    assert_eq!(lseek(&f, 0, libc::SEEK_DATA).expect("SEEK_DATA 0"), 0);
    assert!((4096..=end).contains(&lseek(&f, 0, libc::SEEK_HOLE).expect("SEEK_HOLE 0")));
    assert!((4096..=eight).contains(&lseek(&f, 4096, libc::SEEK_DATA).expect("SEEK_DATA 4096")));
    assert_eq!(lseek(&f, eight + 10, libc::SEEK_DATA).expect("SEEK_DATA in data"), eight + 10);
    assert!((eight + 4096..=end).contains(&lseek(&f, eight, libc::SEEK_HOLE).expect("SEEK_HOLE 8 MiB")));
    match lseek(&f, eight + 4096, libc::SEEK_DATA) {
        Ok(off) => assert!((eight + 4096..end).contains(&off), "SEEK_DATA in the trailing hole: {off}"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "SEEK_DATA in the trailing hole"),
    }
    assert_io_errno(lseek(&f, end, libc::SEEK_DATA), libc::ENXIO, "SEEK_DATA at end of file");
    assert_io_errno(lseek(&f, end, libc::SEEK_HOLE), libc::ENXIO, "SEEK_HOLE at end of file");
    // Without the writeback cache (the default) tierfs answers from its data file: the holes
    // are reported exactly, as ext4 reports them.
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE).expect("SEEK_HOLE 0"), 4096, "the hole after the first block");
    assert_eq!(lseek(&f, 4096, libc::SEEK_DATA).expect("SEEK_DATA 4096"), eight, "the data at 8 MiB");
    assert_eq!(lseek(&f, eight, libc::SEEK_HOLE).expect("SEEK_HOLE 8 MiB"), eight + 4096, "the trailing hole");
    // The virtual hole at end of file: a file with data up to its end.
    write(&fx.p("dense"), &[1u8; 10_000]);
    let dense = File::open(fx.p("dense")).expect("open dense");
    assert_eq!(lseek(&dense, 0, libc::SEEK_HOLE).expect("SEEK_HOLE dense"), 10_000);

    // A file written just now and closed (no fsync): close hands the data to tierfs, so
    // SEEK_DATA (which `cp` uses to copy sparse files) must see it.
    let fresh = fx.p("fresh");
    {
        let f = create_rw(&fresh);
        f.set_len(4 * MIB).expect("ftruncate");
        f.write_all_at(&block, 2 * MIB).expect("pwrite");
    }
    let f = File::open(&fresh).expect("open fresh");
    assert!(lseek(&f, 0, libc::SEEK_DATA).expect("SEEK_DATA fresh") <= (2 * MIB) as i64);

    // Offsets far past 4 GiB: a 1 TiB sparse file.
    let tib = 1u64 << 40;
    {
        let f = create_rw(&fx.p("huge"));
        f.write_all_at(b"far away", tib).expect("pwrite at 1 TiB");
    }
    let f = File::open(fx.p("huge")).expect("open huge");
    assert_eq!(f.metadata().expect("fstat").len(), tib + 8);
    let mut buf = [0u8; 16];
    assert_eq!(f.read_at(&mut buf, tib - 8).expect("pread at 1 TiB - 8"), 16);
    assert_eq!(&buf, b"\0\0\0\0\0\0\0\0far away");
    assert!(lseek(&f, 0, libc::SEEK_DATA).expect("SEEK_DATA huge") as u64 <= tib - tib % 4096);
    assert_eq!(f.read_at(&mut buf, 12345).expect("pread in the hole"), 16);
    assert_eq!(buf, [0u8; 16]);
}

#[test]
fn sparse_files_report_allocated_blocks() {
    let mut fx = Fixture::mounted();
    {
        let f = create_rw(&fx.p("sparse"));
        f.set_len(1 << 30).expect("ftruncate to 1 GiB");
        f.write_all_at(&[1u8; 8192], 1 << 29).expect("pwrite 8 KiB");
        f.sync_all().expect("fsync");
    }
    // A file written from its start without gaps: its size in 4 KiB blocks, as ext4 says.
    write(&fx.p("dense"), &[7u8; 10_000]);
    // One written past its end has a hole: the data file's real allocation.
    let gap = create_rw(&fx.p("gap"));
    gap.write_all_at(&[1u8; 4096], 64 * 1024).expect("pwrite past the end");
    drop(gap);
    fx.remount(); // a fresh kernel cache: what tierfs says, not what the kernel cached
    assert_eq!(meta(&fx.p("dense")).blocks(), 24, "10 000 bytes take three 4 KiB blocks");
    assert_eq!(meta(&fx.p("gap")).blocks(), 8, "one 4 KiB block after a 64 KiB hole");
    {
        let f = open_rw(&fx.p("dense"));
        fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 8192).expect("punch");
    }
    fx.remount();
    assert_eq!(meta(&fx.p("dense")).blocks(), 8, "a punched hole no longer counts");
    let m = meta(&fx.p("sparse"));
    assert_eq!(m.len(), 1 << 30);
    assert!(
        m.blocks() * 512 < 4 * MIB,
        "a 1 GiB file holding 8 KiB reports {} bytes allocated (st_blocks {})",
        m.blocks() * 512,
        m.blocks()
    );
}

#[test]
fn seek_data_sees_unflushed_writes() {
    let fx = Fixture::mounted();
    let f = create_rw(&fx.p("f"));
    f.set_len(MIB).expect("ftruncate");
    f.write_all_at(&[b'x'; 4096], 512 * 1024).expect("pwrite");
    // No fsync, no close: the bytes were written, so the file has data at 512 KiB (ext4,
    // xfs and tmpfs all say so). `cp`, `tar` and `rsync` use SEEK_DATA to skip holes.
    // Never past the data (ext4 says exactly 512 KiB; the whole-file-is-data answer, 0, is safe).
    assert!(lseek(&f, 0, libc::SEEK_DATA).expect("SEEK_DATA") <= 512 * 1024, "SEEK_DATA before any flush");
    assert!(lseek(&f, 512 * 1024, libc::SEEK_HOLE).expect("SEEK_HOLE") >= 516 * 1024);
}

#[test]
fn append_mode_always_writes_at_the_end() {
    let fx = Fixture::mounted();
    let path = fx.p("log");
    write(&path, b"abc");
    let mut a = OpenOptions::new().append(true).open(&path).expect("open O_APPEND");
    let mut b = OpenOptions::new().append(true).open(&path).expect("open O_APPEND again");
    a.write_all(b"def").expect("append a");
    b.write_all(b"ghi").expect("append b");
    a.seek(SeekFrom::Start(0)).expect("seek");
    a.write_all(b"jkl").expect("append a after seek to 0");
    drop((a, b));
    assert_eq!(read(&path), b"abcdefghijkl");

    // Concurrent appenders never overwrite each other's records.
    let path2 = fx.p("concurrent");
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let path2 = path2.clone();
            thread::spawn(move || {
                let mut f = OpenOptions::new().append(true).create(true).open(&path2).expect("open O_APPEND|O_CREAT");
                for i in 0..200u32 {
                    let record = format!("{t}:{i:05}:{}\n", "x".repeat(40));
                    f.write_all(record.as_bytes()).expect("append record");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("appender thread");
    }
    let text = String::from_utf8(read(&path2)).expect("utf8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 800, "every appended record is there");
    for line in &lines {
        assert!(line.len() == 48 && line.ends_with(&"x".repeat(40)), "torn record {line:?}");
    }
    for t in 0..4 {
        let mine: Vec<&&str> = lines.iter().filter(|l| l.starts_with(&format!("{t}:"))).collect();
        assert_eq!(mine.len(), 200, "thread {t}'s records");
        for (i, line) in mine.iter().enumerate() {
            assert!(line.starts_with(&format!("{t}:{i:05}:")), "thread {t} records out of order at {i}: {line}");
        }
    }
}

#[test]
fn truncate_down_and_up() {
    let fx = Fixture::mounted();
    let mut rng = Rng::new(7);
    let data = rng.bytes(100_000);
    let path = fx.p("t");
    write(&path, &data);

    // By path, with nobody holding the file open.
    let c = cpath(&path);
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 40_000) }, 0, "truncate: {}", io::Error::last_os_error());
    assert_eq!(meta(&path).len(), 40_000);
    assert_bytes_eq(&read(&path), &data[..40_000], "after truncate down");
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 150_000) }, 0, "truncate up: {}", io::Error::last_os_error());
    let mut expected = data[..40_000].to_vec();
    expected.resize(150_000, 0);
    assert_bytes_eq(&read(&path), &expected, "growing again reads zeros, never the old bytes");

    // Through an open handle whose pages are cached, mixing ftruncate and writes.
    let f = open_rw(&path);
    f.write_all_at(&data, 0).expect("rewrite");
    f.set_len(10).expect("ftruncate down");
    assert_eq!(f.metadata().expect("fstat").len(), 10);
    f.set_len(70_000).expect("ftruncate up");
    f.write_all_at(b"END", 69_997).expect("write at the new end");
    let mut expected = data[..10].to_vec();
    expected.resize(69_997, 0);
    expected.extend_from_slice(b"END");
    let mut via_fd = Vec::new();
    (&f).read_to_end(&mut via_fd).expect("read through the handle");
    assert_bytes_eq(&via_fd, &expected, "through the handle");
    drop(f);
    assert_bytes_eq(&read(&path), &expected, "after close");

    // O_TRUNC empties the file.
    OpenOptions::new().write(true).truncate(true).open(&path).expect("open O_TRUNC");
    assert_eq!(meta(&path).len(), 0);
    assert_eq!(read(&path), b"");

    let mut fx = fx;
    fx.remount();
    assert_eq!(meta(&fx.p("t")).len(), 0, "the truncation persisted");
}

// ---- namespace ---------------------------------------------------------------------------

#[test]
fn rename_replaces_and_moves() {
    let fx = Fixture::mounted();
    fs::create_dir(fx.p("a")).expect("mkdir a");
    fs::create_dir(fx.p("b")).expect("mkdir b");
    write(&fx.p("a/one"), b"one");
    write(&fx.p("a/two"), b"two");

    fs::rename(fx.p("a/one"), fx.p("b/uno")).expect("rename across directories");
    assert_eq!(names_in(&fx.p("a")), set(["two"]));
    assert_eq!(names_in(&fx.p("b")), set(["uno"]));
    assert_eq!(read(&fx.p("b/uno")), b"one");

    // Rename over an existing file: the victim's open handle still reads its old contents.
    let victim = File::open(fx.p("a/two")).expect("open victim");
    let victim_ino = victim.metadata().expect("fstat").ino();
    fs::rename(fx.p("b/uno"), fx.p("a/two")).expect("rename over a file");
    assert_eq!(read(&fx.p("a/two")), b"one");
    assert_ne!(meta(&fx.p("a/two")).ino(), victim_ino);
    let mut old = String::new();
    (&victim).read_to_string(&mut old).expect("read the replaced file");
    assert_eq!(old, "two");
    assert_eq!(victim.metadata().expect("fstat victim").nlink(), 0, "the replaced file has no links left");
    let inodes = fx.status()["inodes"].as_u64().expect("inodes");
    drop(victim);
    wait_for_inodes(&fx, inodes - 1, "the replaced file is reclaimed at its last close");

    // Directories: over an empty one works, over a non-empty one does not.
    fs::create_dir(fx.p("d1")).expect("mkdir d1");
    write(&fx.p("d1/f"), b"f");
    fs::create_dir(fx.p("empty")).expect("mkdir empty");
    fs::create_dir(fx.p("full")).expect("mkdir full");
    write(&fx.p("full/x"), b"x");
    assert_io_errno(fs::rename(fx.p("d1"), fx.p("full")), libc::ENOTEMPTY, "rename onto a non-empty directory");
    fs::rename(fx.p("d1"), fx.p("empty")).expect("rename onto an empty directory");
    assert_eq!(read(&fx.p("empty/f")), b"f");
    assert!(!fx.p("d1").exists());
    assert_io_errno(fs::rename(fx.p("empty"), fx.p("a/two")), libc::ENOTDIR, "directory onto a file");
    assert_io_errno(fs::rename(fx.p("a/two"), fx.p("full")), libc::EISDIR, "file onto a directory");
    assert_io_errno(fs::rename(fx.p("full"), fx.p("full/x/..")), libc::ENOTDIR, "through a file");
    fs::create_dir(fx.p("full/sub")).expect("mkdir full/sub");
    assert_io_errno(fs::rename(fx.p("full"), fx.p("full/sub/inner")), libc::EINVAL, "directory into itself");

    // Moving a directory updates both parents' link counts and its "..".
    let root_links = meta(&fx.mountpoint).nlink();
    fs::rename(fx.p("full"), fx.p("b/full")).expect("move a directory");
    assert_eq!(meta(&fx.mountpoint).nlink(), root_links - 1);
    assert_eq!(meta(&fx.p("b")).nlink(), 3);
    assert_eq!(meta(&fx.p("b/full/sub/../..")).ino(), meta(&fx.p("b")).ino());
    assert_eq!(read(&fx.p("b/full/x")), b"x");
}

#[test]
fn renameat2_noreplace() {
    let fx = Fixture::mounted();
    write(&fx.p("src"), b"src");
    write(&fx.p("dst"), b"dst");
    assert_errno(renameat2(&fx.p("src"), &fx.p("dst"), libc::RENAME_NOREPLACE), libc::EEXIST, "NOREPLACE onto a file");
    assert_eq!(read(&fx.p("src")), b"src");
    assert_eq!(read(&fx.p("dst")), b"dst");
    assert_eq!(renameat2(&fx.p("src"), &fx.p("new"), libc::RENAME_NOREPLACE), 0, "{}", io::Error::last_os_error());
    assert!(!fx.p("src").exists());
    assert_eq!(read(&fx.p("new")), b"src");

    fs::create_dir(fx.p("d1")).expect("mkdir");
    fs::create_dir(fx.p("d2")).expect("mkdir");
    assert_errno(renameat2(&fx.p("d1"), &fx.p("d2"), libc::RENAME_NOREPLACE), libc::EEXIST, "NOREPLACE onto a dir");
    assert_errno(renameat2(&fx.p("d1"), &fx.p("new"), libc::RENAME_NOREPLACE), libc::EEXIST, "dir onto a file");
    assert_eq!(renameat2(&fx.p("d1"), &fx.p("d2/d1"), libc::RENAME_NOREPLACE), 0, "{}", io::Error::last_os_error());
    assert!(fx.p("d2/d1").is_dir());
    assert_eq!(meta(&fx.p("d2")).nlink(), 3);
    assert_errno(
        renameat2(&fx.p("nothing"), &fx.p("x"), libc::RENAME_NOREPLACE),
        libc::ENOENT,
        "NOREPLACE of a missing source",
    );
}

#[test]
fn renameat2_exchange_files_and_directories() {
    let fx = Fixture::mounted();
    // Two files.
    write(&fx.p("a"), b"contents of a");
    write(&fx.p("b"), b"b");
    let (ino_a, ino_b) = (meta(&fx.p("a")).ino(), meta(&fx.p("b")).ino());
    assert_eq!(renameat2(&fx.p("a"), &fx.p("b"), libc::RENAME_EXCHANGE), 0, "{}", io::Error::last_os_error());
    assert_eq!(read(&fx.p("a")), b"b");
    assert_eq!(read(&fx.p("b")), b"contents of a");
    assert_eq!((meta(&fx.p("a")).ino(), meta(&fx.p("b")).ino()), (ino_b, ino_a));
    assert_eq!(meta(&fx.p("a")).len(), 1, "sizes follow the inodes");

    // Two directories in different parents, with contents.
    for d in ["p1", "p2", "p1/d1", "p2/d2"] {
        fs::create_dir(fx.p(d)).expect("mkdir");
    }
    write(&fx.p("p1/d1/in1"), b"1");
    write(&fx.p("p2/d2/in2"), b"2");
    assert_eq!(renameat2(&fx.p("p1/d1"), &fx.p("p2/d2"), libc::RENAME_EXCHANGE), 0, "{}", io::Error::last_os_error());
    assert_eq!(names_in(&fx.p("p1/d1")), set(["in2"]));
    assert_eq!(names_in(&fx.p("p2/d2")), set(["in1"]));
    assert_eq!(meta(&fx.p("p1/d1/..")).ino(), meta(&fx.p("p1")).ino(), "'..' follows the exchange");
    assert_eq!(meta(&fx.p("p2/d2/..")).ino(), meta(&fx.p("p2")).ino(), "'..' follows the exchange");
    assert_eq!((meta(&fx.p("p1")).nlink(), meta(&fx.p("p2")).nlink()), (3, 3));

    // A file and a directory in different parents: the parents' link counts move.
    write(&fx.p("p1/file"), b"file");
    assert_eq!(renameat2(&fx.p("p1/file"), &fx.p("p2/d2"), libc::RENAME_EXCHANGE), 0, "{}", io::Error::last_os_error());
    assert!(fx.p("p1/file").is_dir(), "p1/file is now the directory");
    assert_eq!(names_in(&fx.p("p1/file")), set(["in1"]));
    assert_eq!(read(&fx.p("p2/d2")), b"file");
    assert_eq!(meta(&fx.p("p1")).nlink(), 4, "p1 gained a subdirectory");
    assert_eq!(meta(&fx.p("p2")).nlink(), 2, "p2 lost its subdirectory");
    assert_eq!(meta(&fx.p("p1/file/..")).ino(), meta(&fx.p("p1")).ino());

    assert_errno(renameat2(&fx.p("a"), &fx.p("missing"), libc::RENAME_EXCHANGE), libc::ENOENT, "EXCHANGE, no target");
    assert_errno(
        renameat2(&fx.p("a"), &fx.p("b"), libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE),
        libc::EINVAL,
        "EXCHANGE with NOREPLACE",
    );
    assert_errno(
        renameat2(&fx.p("p1"), &fx.p("p1/file/sub"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
        "EXCHANGE with a missing target inside",
    );
    fs::create_dir(fx.p("p1/file/sub")).expect("mkdir");
    assert_errno(
        renameat2(&fx.p("p1"), &fx.p("p1/file/sub"), libc::RENAME_EXCHANGE),
        libc::EINVAL,
        "EXCHANGE of a directory with its own descendant",
    );

    // The exchanged tree persists.
    let mut fx = fx;
    fx.remount();
    assert_eq!(read(&fx.p("a")), b"b");
    assert_eq!(read(&fx.p("p2/d2")), b"file");
    assert_eq!(names_in(&fx.p("p1/d1")), set(["in2"]));
    assert_eq!(meta(&fx.p("p1")).nlink(), 4);
}

#[test]
fn hard_links_report_exact_link_counts_at_once() {
    let fx = Fixture::mounted();
    fs::create_dir(fx.p("sub")).expect("mkdir");
    write(&fx.p("f"), b"shared");
    assert_eq!(meta(&fx.p("f")).nlink(), 1);
    fs::hard_link(fx.p("f"), fx.p("g")).expect("link f g");
    // No sleep anywhere: a stale cached attribute would show up here.
    assert_eq!(meta(&fx.p("f")).nlink(), 2, "f right after link");
    assert_eq!(meta(&fx.p("g")).nlink(), 2, "g right after link");
    assert_eq!(meta(&fx.p("f")).ino(), meta(&fx.p("g")).ino());
    fs::hard_link(fx.p("g"), fx.p("sub/h")).expect("link g sub/h");
    for name in ["f", "g", "sub/h"] {
        assert_eq!(meta(&fx.p(name)).nlink(), 3, "{name} after the second link");
    }
    // Writes through one name are seen through the others.
    {
        let f = open_rw(&fx.p("sub/h"));
        f.write_all_at(b"SHARED!", 0).expect("write through h");
    }
    assert_eq!(read(&fx.p("f")), b"SHARED!");
    let open_f = File::open(fx.p("f")).expect("open f");
    fs::remove_file(fx.p("g")).expect("unlink g");
    assert_eq!(meta(&fx.p("f")).nlink(), 2, "f right after unlink g");
    assert_eq!(meta(&fx.p("sub/h")).nlink(), 2, "h right after unlink g");
    assert_eq!(open_f.metadata().expect("fstat").nlink(), 2, "fstat right after unlink g");
    fs::remove_file(fx.p("f")).expect("unlink f");
    assert_eq!(meta(&fx.p("sub/h")).nlink(), 1, "h right after unlink f");
    assert_eq!(open_f.metadata().expect("fstat").nlink(), 1);
    assert_eq!(read(&fx.p("sub/h")), b"SHARED!");
    drop(open_f);

    // Directories cannot be hard-linked; existing names are not replaced.
    assert_io_errno(fs::hard_link(fx.p("sub"), fx.p("sub2")), libc::EPERM, "link of a directory");
    write(&fx.p("other"), b"other");
    assert_io_errno(fs::hard_link(fx.p("sub/h"), fx.p("other")), libc::EEXIST, "link onto an existing name");

    let mut fx = fx;
    fs::hard_link(fx.p("sub/h"), fx.p("h2")).expect("link");
    fx.remount();
    assert_eq!(meta(&fx.p("h2")).nlink(), 2);
    assert_eq!(meta(&fx.p("h2")).ino(), meta(&fx.p("sub/h")).ino());
}

#[test]
fn symlinks_and_readlink() {
    let fx = Fixture::mounted();
    fs::create_dir(fx.p("dir")).expect("mkdir");
    write(&fx.p("dir/target"), b"target contents");
    std::os::unix::fs::symlink("dir/target", fx.p("rel")).expect("symlink rel");
    std::os::unix::fs::symlink(fx.p("dir"), fx.p("abs")).expect("symlink abs");
    std::os::unix::fs::symlink("nowhere", fx.p("dangling")).expect("symlink dangling");
    let long_target = "x/".repeat(1500) + "end";
    std::os::unix::fs::symlink(&long_target, fx.p("long")).expect("symlink with a 3003-byte target");

    assert_eq!(fs::read_link(fx.p("rel")).expect("readlink"), PathBuf::from("dir/target"));
    assert_eq!(fs::read_link(fx.p("abs")).expect("readlink"), fx.p("dir"));
    assert_eq!(fs::read_link(fx.p("long")).expect("readlink long"), PathBuf::from(&long_target));
    let m = meta(&fx.p("rel"));
    assert!(m.file_type().is_symlink());
    assert_eq!(m.len(), "dir/target".len() as u64, "a symlink's size is its target's length");
    assert_eq!(m.mode() & 0o777, 0o777);
    assert_eq!(read(&fx.p("rel")), b"target contents", "following a relative symlink");
    assert_eq!(read(&fx.p("abs/target")), b"target contents", "a path through a symlinked directory");
    assert_io_errno(fs::metadata(fx.p("dangling")), libc::ENOENT, "stat through a dangling symlink");
    assert!(meta(&fx.p("dangling")).file_type().is_symlink());
    assert_io_errno(fs::read_link(fx.p("dir/target")), libc::EINVAL, "readlink of a regular file");
    assert_io_errno(std::os::unix::fs::symlink("again", fx.p("rel")), libc::EEXIST, "symlink onto an existing name");
    // Removing a symlink leaves its target alone.
    fs::remove_file(fx.p("rel")).expect("unlink symlink");
    assert_eq!(read(&fx.p("dir/target")), b"target contents");
}

#[test]
fn mkdir_rmdir_and_not_empty() {
    let fx = Fixture::mounted();
    let root_links = meta(&fx.mountpoint).nlink();
    fs::create_dir(fx.p("d")).expect("mkdir d");
    assert_eq!(meta(&fx.mountpoint).nlink(), root_links + 1, "a subdirectory adds a link to its parent");
    assert_eq!(meta(&fx.p("d")).nlink(), 2);
    assert_io_errno(fs::create_dir(fx.p("d")), libc::EEXIST, "mkdir of an existing directory");
    write(&fx.p("d/f"), b"f");
    assert_io_errno(fs::remove_dir(fx.p("d")), libc::ENOTEMPTY, "rmdir of a non-empty directory");
    assert_io_errno(fs::remove_dir(fx.p("d/f")), libc::ENOTDIR, "rmdir of a file");
    assert_io_errno(fs::remove_file(fx.p("d")), libc::EISDIR, "unlink of a directory");
    assert_io_errno(fs::remove_dir(fx.p("missing")), libc::ENOENT, "rmdir of a missing name");
    assert_io_errno(fs::create_dir(fx.p("missing/sub")), libc::ENOENT, "mkdir in a missing parent");
    assert_io_errno(fs::create_dir(fx.p("d/f/sub")), libc::ENOTDIR, "mkdir under a file");
    fs::remove_file(fx.p("d/f")).expect("unlink d/f");
    fs::remove_dir(fx.p("d")).expect("rmdir d");
    assert!(!fx.p("d").exists());
    assert_eq!(meta(&fx.mountpoint).nlink(), root_links);

    // A deep tree, then removed bottom-up; mode bits from mkdir (umask applies).
    let deep: PathBuf = (0..25).map(|i| format!("l{i}")).collect();
    fs::create_dir_all(fx.mountpoint.join(&deep)).expect("mkdir -p");
    write(&fx.mountpoint.join(&deep).join("leaf"), b"leaf");
    assert_eq!(read(&fx.mountpoint.join(&deep).join("leaf")), b"leaf");
    fs::remove_dir_all(fx.p("l0")).expect("rm -r");
    assert_eq!(names_in(&fx.mountpoint), BTreeSet::new());

    let c = cpath(&fx.p("m"));
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkdir(c.as_ptr(), 0o1751) }, 0, "mkdir: {}", io::Error::last_os_error());
    assert_eq!(meta(&fx.p("m")).mode() & 0o7777, 0o1751 & !current_umask(), "mkdir keeps the sticky bit");
}

fn current_umask() -> u32 {
    // SAFETY: umask(2) cannot fail; set it back at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    }
}

#[test]
fn large_directory_lists_every_entry_once() {
    let fx = Fixture::mounted();
    let mut expected = BTreeSet::new();
    for i in 0..1500 {
        let name = format!("entry-{i:05}-{}", "n".repeat(80));
        File::create(fx.mountpoint.join(&name)).expect("create");
        expected.insert(name);
    }
    let listed: Vec<String> = fs::read_dir(&fx.mountpoint)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed.len(), expected.len(), "no entry listed twice or missed");
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), expected);
}

/// A libc directory stream: `readdir` as programs call it (glibc reads 32 KiB at a time), with
/// `telldir`/`seekdir`.
struct DirStream(*mut libc::DIR);

impl DirStream {
    fn open(path: &Path) -> DirStream {
        // SAFETY: a NUL-terminated path; the stream is closed in Drop.
        let d = unsafe { libc::opendir(cpath(path).as_ptr()) };
        assert!(!d.is_null(), "opendir {}: {}", path.display(), io::Error::last_os_error());
        DirStream(d)
    }

    /// The next name, `.` and `..` skipped.
    fn next(&mut self) -> Option<String> {
        loop {
            // SAFETY: a live stream; the entry is copied out before the next call.
            let e = unsafe { libc::readdir(self.0) };
            if e.is_null() {
                return None;
            }
            // SAFETY: d_name is NUL-terminated.
            let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned();
            if name != "." && name != ".." {
                return Some(name);
            }
        }
    }

    fn tell(&mut self) -> libc::c_long {
        // SAFETY: a live stream.
        unsafe { libc::telldir(self.0) }
    }

    fn seek(&mut self, at: libc::c_long) {
        // SAFETY: a live stream and a position telldir gave.
        unsafe { libc::seekdir(self.0, at) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: opened by opendir, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

/// A listing is read in pieces, not held whole: entries deleted, added or renamed while a
/// directory is listed never make an unchanged entry show twice or go missing, and `seekdir`
/// back to a `telldir` position resumes where it was.
#[test]
fn a_directory_changed_while_it_is_listed_lists_each_unchanged_entry_once() {
    let fx = Fixture::mounted();
    let dir = fx.p("big");
    fs::create_dir(&dir).expect("mkdir");
    let n = 5000;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:05}-{}", "x".repeat(40))).collect();
    for name in &names {
        File::create(dir.join(name)).expect("create");
    }
    // `rm -rf`: every entry read is removed at once.
    let mut d = DirStream::open(&dir);
    let mut seen = BTreeSet::new();
    while let Some(name) = d.next() {
        assert!(seen.insert(name.clone()), "{name} listed twice while entries were removed");
        fs::remove_file(dir.join(&name)).expect("unlink");
    }
    drop(d);
    assert_eq!(seen.len(), n, "entries went missing while the listing removed them");
    assert!(names_in(&dir).is_empty(), "the directory is empty after the listing removed everything");

    for name in &names {
        File::create(dir.join(name)).expect("create");
    }
    // Created, removed and renamed meanwhile: each name untouched shows once; nothing twice.
    let mut d = DirStream::open(&dir);
    let mut seen = BTreeSet::new();
    let mut count = 0;
    while let Some(name) = d.next() {
        count += 1;
        assert!(seen.insert(name.clone()), "{name} listed twice while the directory changed");
        if count % 100 == 0 {
            fs::rename(dir.join(&name), dir.join(format!("{name}-renamed"))).expect("rename");
            File::create(dir.join(format!("a-new-{count}"))).expect("create");
            File::create(dir.join(format!("z-new-{count}"))).expect("create");
            let _ = fs::remove_file(dir.join(&names[(count * 7) % n]));
        }
    }
    drop(d);
    let removed: BTreeSet<&String> = (1..=count).filter(|c| c % 100 == 0).map(|c| &names[(c * 7) % n]).collect();
    for name in names.iter().filter(|nm| !removed.contains(nm)) {
        assert!(seen.contains(name), "{name}, never touched, was not listed");
    }

    // telldir / seekdir: back to a position, the same entries follow.
    let mut d = DirStream::open(&dir);
    for _ in 0..1234 {
        d.next().expect("an entry");
    }
    let at = d.tell();
    let after: Vec<String> = (0..700).map_while(|_| d.next()).collect();
    while d.next().is_some() {}
    d.seek(at);
    let again: Vec<String> = (0..700).map_while(|_| d.next()).collect();
    assert_eq!(again, after, "seekdir back to a telldir position resumed elsewhere");
}

#[test]
fn unlink_while_open_keeps_the_file_usable() {
    let fx = Fixture::mounted();
    let path = fx.p("doomed");
    let inodes_before = fx.status()["inodes"].as_u64().expect("inodes in status");
    let mut f = create_rw(&path);
    f.write_all(b"hello").expect("write");
    assert_eq!(fx.status()["inodes"].as_u64(), Some(inodes_before + 1));
    fs::remove_file(&path).expect("unlink while open");
    assert!(!path.exists());
    assert!(!names_in(&fx.mountpoint).contains("doomed"));
    assert_eq!(f.metadata().expect("fstat").nlink(), 0);

    // Keep writing and reading through the open descriptor.
    f.write_all(b", world").expect("write after unlink");
    let big = Rng::new(3).bytes(2 * MIB as usize);
    f.write_all_at(&big, 4096).expect("pwrite after unlink");
    f.sync_all().expect("fsync after unlink");
    let mut head = [0u8; 12];
    f.read_exact_at(&mut head, 0).expect("read after unlink");
    assert_eq!(&head, b"hello, world");
    let mut tail = vec![0u8; big.len()];
    f.read_exact_at(&mut tail, 4096).expect("read after unlink");
    assert_bytes_eq(&tail, &big, "data written after unlink");
    assert_eq!(f.metadata().expect("fstat").len(), 4096 + big.len() as u64);

    // A new file may take the name meanwhile, independently.
    write(&path, b"new");
    assert_eq!(read(&path), b"new");
    f.read_exact_at(&mut head, 0).expect("read old after a new file took the name");
    assert_eq!(&head, b"hello, world");
    assert_eq!(fx.status()["inodes"].as_u64(), Some(inodes_before + 2), "the orphan is still counted");
    drop(f);

    // The last close reclaims the orphan.
    wait_for_inodes(&fx, inodes_before + 1, "the orphan is reclaimed after its last close");
    assert_eq!(read(&path), b"new");
}

#[test]
fn open_flags_and_their_errors() {
    let fx = Fixture::mounted();
    let f = fx.p("f");
    write(&f, b"original");
    fs::create_dir(fx.p("d")).expect("mkdir");
    assert_io_errno(OpenOptions::new().write(true).create_new(true).open(&f), libc::EEXIST, "O_CREAT|O_EXCL");
    assert_io_errno(File::open(fx.p("missing")), libc::ENOENT, "open of a missing file");
    assert_io_errno(OpenOptions::new().write(true).open(fx.p("d")), libc::EISDIR, "open a directory for writing");
    assert_io_errno(
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(&f),
        libc::ENOTDIR,
        "O_DIRECTORY on a file",
    );
    assert_io_errno(File::open(fx.p("f/x")), libc::ENOTDIR, "a file used as a directory");
    OpenOptions::new().write(true).create(true).truncate(false).open(&f).expect("O_CREAT on an existing file");
    assert_eq!(read(&f), b"original", "O_CREAT without O_TRUNC keeps the contents");
    let mut h = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&f).expect("O_TRUNC");
    assert_eq!(h.metadata().expect("fstat").len(), 0);
    h.write_all(b"new").expect("write");
    drop(h);
    assert_eq!(read(&f), b"new");
    // A read-only file can still be created and written through the creating descriptor.
    let mut ro = OpenOptions::new().write(true).create_new(true).mode(0o444).open(fx.p("ro")).expect("create 0444");
    ro.write_all(b"written through the creating fd").expect("write to a new 0444 file");
    drop(ro);
    assert_eq!(read(&fx.p("ro")), b"written through the creating fd");
    assert_eq!(meta(&fx.p("ro")).mode() & 0o777, 0o444);
    let file = File::open(fx.p("d")).expect("open a directory read-only");
    assert!(file.metadata().expect("fstat").is_dir());
}

#[test]
fn special_files_fifo_socket_device() {
    let fx = Fixture::mounted();
    let fifo = cpath(&fx.p("fifo"));
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo: {}", io::Error::last_os_error());
    use std::os::unix::fs::FileTypeExt;
    assert!(meta(&fx.p("fifo")).file_type().is_fifo());
    let path = fx.p("fifo");
    let writer = thread::spawn(move || {
        let mut w = OpenOptions::new().write(true).open(&path).expect("open the fifo for writing");
        w.write_all(b"through the pipe").expect("write to the fifo");
    });
    let mut got = String::new();
    File::open(fx.p("fifo")).expect("open the fifo for reading").read_to_string(&mut got).expect("read the fifo");
    writer.join().expect("fifo writer");
    assert_eq!(got, "through the pipe");

    let sock_path = fx.p("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock_path).expect("bind a unix socket in the mount");
    assert!(meta(&sock_path).file_type().is_socket());
    let mut client = std::os::unix::net::UnixStream::connect(&sock_path).expect("connect");
    client.write_all(b"ping").expect("send");
    let (mut server, _) = listener.accept().expect("accept");
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).expect("receive");
    assert_eq!(&buf, b"ping");

    let dev = cpath(&fx.p("null"));
    // SAFETY: a valid path; root may create device nodes.
    let rc = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod: {}", io::Error::last_os_error());
    let m = meta(&fx.p("null"));
    assert!(m.file_type().is_char_device());
    assert_eq!(m.rdev(), libc::makedev(1, 3), "device number");
    let mut fx = fx;
    drop((listener, client, server));
    fx.remount();
    assert!(meta(&fx.p("fifo")).file_type().is_fifo());
    assert!(meta(&fx.p("sock")).file_type().is_socket());
    assert_eq!(meta(&fx.p("null")).rdev(), libc::makedev(1, 3));
}

#[test]
fn directory_and_inode_times_follow_namespace_changes() {
    let fx = Fixture::mounted();
    fs::create_dir(fx.p("a")).expect("mkdir");
    fs::create_dir(fx.p("b")).expect("mkdir");
    let old = (1_000_000_000, 0);
    let set_old = |p: &Path| assert_eq!(utimens(p, old, old), 0, "utimensat {}", p.display());
    let mtime = |p: &Path| (meta(p).mtime(), meta(p).mtime_nsec());
    let ctime = |p: &Path| (meta(p).ctime(), meta(p).ctime_nsec());
    let before = now_secs();

    set_old(&fx.p("a"));
    write(&fx.p("a/f"), b"f");
    assert!(mtime(&fx.p("a")).0 >= before, "creating a file updates its directory's mtime");
    set_old(&fx.p("a"));
    set_old(&fx.p("b"));
    set_old(&fx.p("a/f"));
    let f_ctime = ctime(&fx.p("a/f"));
    thread::sleep(Duration::from_millis(20));
    fs::rename(fx.p("a/f"), fx.p("b/g")).expect("rename");
    assert!(mtime(&fx.p("a")).0 >= before, "rename updates the source directory's mtime");
    assert!(mtime(&fx.p("b")).0 >= before, "rename updates the target directory's mtime");
    assert_eq!(mtime(&fx.p("b/g")), old, "rename leaves the file's mtime alone");
    assert!(ctime(&fx.p("b/g")) > f_ctime, "rename updates the moved file's ctime");
    set_old(&fx.p("b"));
    let g_ctime = ctime(&fx.p("b/g"));
    thread::sleep(Duration::from_millis(20));
    fs::hard_link(fx.p("b/g"), fx.p("b/h")).expect("link");
    assert!(mtime(&fx.p("b")).0 >= before, "link updates the directory's mtime");
    assert!(ctime(&fx.p("b/g")) > g_ctime, "link updates the file's ctime");
    set_old(&fx.p("b"));
    fs::remove_file(fx.p("b/h")).expect("unlink");
    assert!(mtime(&fx.p("b")).0 >= before, "unlink updates the directory's mtime");
    set_old(&fx.p("a"));
    fs::create_dir(fx.p("a/sub")).expect("mkdir");
    assert!(mtime(&fx.p("a")).0 >= before, "mkdir updates the parent's mtime");
    set_old(&fx.p("a"));
    fs::remove_dir(fx.p("a/sub")).expect("rmdir");
    assert!(mtime(&fx.p("a")).0 >= before, "rmdir updates the parent's mtime");
    let g_ctime = ctime(&fx.p("b/g"));
    thread::sleep(Duration::from_millis(20));
    assert_eq!(setxattr(&fx.p("b/g"), "user.k", b"v", 0), 0);
    assert!(ctime(&fx.p("b/g")) > g_ctime, "setxattr updates ctime");
}

#[test]
fn every_handle_is_released() {
    let fx = Fixture::mounted();
    write(&fx.p("f"), &[1u8; 10_000]);
    fs::create_dir(fx.p("d")).expect("mkdir");
    for i in 0..20 {
        let mut a = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(fx.p(&format!("n{i}")))
            .expect("create");
        a.write_all(b"x").expect("write");
        let b = a.try_clone().expect("dup");
        let c = File::open(fx.p("f")).expect("open");
        let _ = OpenOptions::new().write(true).create_new(true).open(fx.p("f")).expect_err("O_EXCL on existing");
        let _ = OpenOptions::new().write(true).open(fx.p("d")).expect_err("EISDIR");
        let _ = fs::read_dir(fx.p("d")).expect("opendir").count();
        // SAFETY: mapping and unmapping one page of an open 10 kB file.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, c.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, 4096);
        }
        drop((a, b, c));
    }
    wait_for_status(&fx, "open_files", 0, "every open file is released after close");
}

#[test]
fn concurrent_namespace_operations() {
    let fx = Fixture::mounted();
    for d in ["shared", "moved"] {
        fs::create_dir(fx.p(d)).expect("mkdir");
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (shared, moved) = (fx.p("shared"), fx.p("moved"));
            thread::spawn(move || {
                for i in 0..150 {
                    let name = format!("t{t}-{i}");
                    fs::write(shared.join(&name), name.as_bytes()).expect("create");
                    fs::create_dir(shared.join(format!("{name}.d"))).expect("mkdir");
                    fs::rename(shared.join(&name), moved.join(&name)).expect("rename");
                    if i % 2 == 0 {
                        fs::remove_file(moved.join(&name)).expect("unlink");
                        fs::remove_dir(shared.join(format!("{name}.d"))).expect("rmdir");
                    } else {
                        fs::hard_link(moved.join(&name), shared.join(format!("{name}.link"))).expect("link");
                        fs::rename(shared.join(format!("{name}.d")), moved.join(format!("{name}.d")))
                            .expect("rename a directory");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker");
    }
    let mut want_shared = BTreeSet::new();
    let mut want_moved = BTreeSet::new();
    for t in 0..4 {
        for i in (1..150).step_by(2) {
            want_shared.insert(format!("t{t}-{i}.link"));
            want_moved.insert(format!("t{t}-{i}"));
            want_moved.insert(format!("t{t}-{i}.d"));
        }
    }
    assert_eq!(names_in(&fx.p("shared")), want_shared);
    assert_eq!(names_in(&fx.p("moved")), want_moved);
    assert_eq!(meta(&fx.p("shared")).nlink(), 2, "no subdirectory left in shared");
    assert_eq!(meta(&fx.p("moved")).nlink(), 2 + 4 * 75, "moved holds 300 subdirectories");
    for name in &want_shared {
        let original = name.trim_end_matches(".link");
        assert_eq!(read(&fx.p("shared").join(name)), original.as_bytes());
        assert_eq!(meta(&fx.p("shared").join(name)).nlink(), 2);
    }
    // 600 names of 300 files, 300 directories, 2 top directories, and the root.
    assert_eq!(fx.status()["inodes"].as_u64(), Some(300 + 300 + 2 + 1));
}

// ---- metadata ----------------------------------------------------------------------------

#[test]
fn xattrs_set_get_list_remove() {
    let fx = Fixture::mounted();
    let f = fx.p("file");
    write(&f, b"x");
    fs::create_dir(fx.p("dir")).expect("mkdir");

    for target in [&f, &fx.p("dir")] {
        assert_eq!(listxattr(target), BTreeSet::new(), "no xattrs at first");
        assert_eq!(setxattr(target, "user.a", b"alpha", 0), 0, "{}", io::Error::last_os_error());
        assert_eq!(setxattr(target, "user.empty", b"", 0), 0, "{}", io::Error::last_os_error());
        let big = Rng::new(9).bytes(65_536);
        assert_eq!(setxattr(target, "user.big", &big, 0), 0, "64 KiB value: {}", io::Error::last_os_error());
        assert_eq!(getxattr(target, "user.a").expect("getxattr"), b"alpha");
        assert_eq!(getxattr(target, "user.empty").expect("getxattr empty"), b"");
        assert_bytes_eq(&getxattr(target, "user.big").expect("getxattr big"), &big, "64 KiB xattr");
        assert_eq!(listxattr(target), set(["user.a", "user.big", "user.empty"]));

        assert_errno(
            setxattr(target, "user.a", b"again", libc::XATTR_CREATE),
            libc::EEXIST,
            "XATTR_CREATE on existing",
        );
        assert_errno(
            setxattr(target, "user.missing", b"v", libc::XATTR_REPLACE),
            libc::ENODATA,
            "XATTR_REPLACE on missing",
        );
        assert_eq!(setxattr(target, "user.a", b"A2", libc::XATTR_REPLACE), 0, "{}", io::Error::last_os_error());
        assert_eq!(getxattr(target, "user.a").expect("getxattr"), b"A2");
        assert_eq!(setxattr(target, "user.new", b"n", libc::XATTR_CREATE), 0, "{}", io::Error::last_os_error());

        // A buffer too small for the value.
        let (p, n) = (cpath(target), CString::new("user.a").expect("name"));
        let mut one = [0u8; 1];
        // SAFETY: a one-byte buffer passed with its size.
        let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), one.as_mut_ptr().cast(), 1) };
        assert_errno(rc as i64, libc::ERANGE, "getxattr into a too small buffer");

        assert_eq!(removexattr(target, "user.a"), 0, "{}", io::Error::last_os_error());
        assert_io_errno(getxattr(target, "user.a"), libc::ENODATA, "getxattr after removexattr");
        assert_errno(removexattr(target, "user.a"), libc::ENODATA, "removexattr of a missing name");
        assert_io_errno(getxattr(target, "user.never"), libc::ENODATA, "getxattr of a missing name");
        assert_eq!(listxattr(target), set(["user.big", "user.empty", "user.new"]));
    }
    // Trusted xattrs work for root; user xattrs are refused on symlinks (as on Linux).
    assert_eq!(setxattr(&f, "trusted.t", b"root only", 0), 0, "{}", io::Error::last_os_error());
    assert_eq!(getxattr(&f, "trusted.t").expect("trusted"), b"root only");
    std::os::unix::fs::symlink("file", fx.p("link")).expect("symlink");
    assert_errno(lsetxattr(&fx.p("link"), "user.x", b"v", 0), libc::EPERM, "user xattr on a symlink");

    let mut fx = fx;
    fx.remount();
    assert_eq!(getxattr(&fx.p("file"), "user.new").expect("after remount"), b"n");
    assert_eq!(getxattr(&fx.p("file"), "trusted.t").expect("after remount"), b"root only");
    assert_eq!(listxattr(&fx.p("dir")), set(["user.big", "user.empty", "user.new"]));
}

#[test]
fn chmod_and_chown() {
    let fx = Fixture::mounted();
    let f = fx.p("f");
    write(&f, b"data");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).expect("chmod 640");
    assert_eq!(meta(&f).mode() & 0o7777, 0o640);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    assert_eq!(meta(&f).mode() & 0o7777, 0o4755, "setuid bit kept");
    assert!(meta(&f).is_file(), "chmod keeps the file type");

    let ctime_before = (meta(&f).ctime(), meta(&f).ctime_nsec());
    thread::sleep(Duration::from_millis(20));
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).expect("chown");
    let m = meta(&f);
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert!((m.ctime(), m.ctime_nsec()) > ctime_before, "chown updates ctime");
    assert_eq!(m.mode() & 0o7777, 0o755, "chown of a regular file clears setuid, even by root (as on Linux)");
    std::os::unix::fs::chown(&f, None, Some(42)).expect("chgrp only");
    assert_eq!((meta(&f).uid(), meta(&f).gid()), (1234, 42));

    // fchown / fchmod through a handle, lchown on a symlink itself.
    let file = File::open(&f).expect("open");
    std::os::unix::fs::fchown(&file, Some(7), Some(8)).expect("fchown");
    file.set_permissions(fs::Permissions::from_mode(0o600)).expect("fchmod");
    drop(file);
    assert_eq!((meta(&f).uid(), meta(&f).gid(), meta(&f).mode() & 0o7777), (7, 8, 0o600));
    std::os::unix::fs::symlink("f", fx.p("l")).expect("symlink");
    std::os::unix::fs::lchown(fx.p("l"), Some(99), Some(98)).expect("lchown");
    assert_eq!((meta(&fx.p("l")).uid(), meta(&fx.p("l")).gid()), (99, 98));
    assert_eq!(meta(&f).uid(), 7, "lchown does not follow the link");

    // Directories: mode and owner; a setgid directory passes its group on.
    fs::create_dir(fx.p("d")).expect("mkdir");
    std::os::unix::fs::chown(fx.p("d"), Some(500), Some(600)).expect("chown dir");
    fs::set_permissions(fx.p("d"), fs::Permissions::from_mode(0o2775)).expect("chmod g+s");
    assert_eq!(meta(&fx.p("d")).mode() & 0o7777, 0o2775);
    write(&fx.p("d/child"), b"c");
    fs::create_dir(fx.p("d/sub")).expect("mkdir in a setgid dir");
    assert_eq!(meta(&fx.p("d/child")).gid(), 600, "new files take the setgid directory's group");
    assert_eq!(meta(&fx.p("d/sub")).gid(), 600);
    assert_ne!(meta(&fx.p("d/sub")).mode() & 0o2000, 0, "new directories inherit setgid");

    // An unprivileged user is held to the mode bits (the kernel checks with
    // default_permissions, which needs correct attributes from tierfs).
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).expect("chmod 600");
    let path = cpath(&f);
    let code = in_child(|| {
        // SAFETY: raw syscalls only (async-signal-safe) in the forked child.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return 100;
            }
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            if fd >= 0 {
                return 0;
            }
            child_errno()
        }
    });
    assert_eq!(code, libc::EACCES, "nobody may not read a 0600 file owned by someone else");

    let mut fx = fx;
    fx.remount();
    assert_eq!((meta(&fx.p("f")).uid(), meta(&fx.p("f")).gid(), meta(&fx.p("f")).mode() & 0o7777), (7, 8, 0o600));
    assert_eq!(meta(&fx.p("d")).mode() & 0o7777, 0o2775);
}

fn check_writes_clear_setuid_only_as_a_local_filesystem_does(fx: Fixture) {
    let mut fx = fx;

    // An unprivileged writer loses the setuid bit (the kernel's file_remove_privs).
    let shared = fx.p("shared");
    write(&shared, b"x");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o4777)).expect("chmod 4777");
    let path = cpath(&shared);
    let code = in_child(|| {
        // SAFETY: raw syscalls only (async-signal-safe) in the forked child.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return 100;
            }
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
            if fd < 0 {
                return 101;
            }
            if libc::write(fd, b"y".as_ptr().cast(), 1) != 1 {
                return 102;
            }
            if libc::close(fd) != 0 { 103 } else { 0 }
        }
    });
    assert_eq!(code, 0, "the unprivileged writer failed (100: setuid, 101: open, 102: write, 103: close)");
    assert_eq!(meta(&shared).mode() & 0o7777, 0o777, "setuid cleared by an unprivileged write");
    fx.remount(); // a fresh kernel cache: what tierfs stored, not what the kernel cached
    assert_eq!(meta(&shared).mode() & 0o7777, 0o777, "setuid cleared, as tierfs stored it");
    assert_eq!(read(&shared), b"xy");

    // Root (CAP_FSETID) keeps it on ext4, xfs, tmpfs: `install`, package managers and
    // build systems rewrite setuid binaries as root and expect the bit to stay.
    let tool = fx.p("tool");
    write(&tool, b"#!/bin/sh\n");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    let mut f = OpenOptions::new().append(true).open(&tool).expect("open");
    f.write_all(b"exit 0\n").expect("append as root");
    drop(f);
    assert_eq!(meta(&tool).mode() & 0o7777, 0o4755, "right after root's write");
    fx.remount();
    assert_eq!(
        meta(&tool).mode() & 0o7777,
        0o4755,
        "a write by root must not clear setuid (and the mode must not change once the kernel's \
         cached attributes expire)"
    );
}

/// What an unprivileged process (uid and gid 65534) does to `path` in a child: opens it
/// with `flags`, then `ftruncate`s it to `truncate_to` if given, else writes one byte. 0 when
/// all worked, else 100 + the failed step (setuid, open, change, close).
fn as_nobody(path: &Path, flags: i32, truncate_to: Option<i64>) -> i32 {
    let path = cpath(path);
    in_child(|| {
        // SAFETY: raw syscalls only (async-signal-safe) in the forked child.
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                return 100;
            }
            let fd = libc::open(path.as_ptr(), flags);
            if fd < 0 {
                return 101;
            }
            let changed = match truncate_to {
                Some(len) => libc::ftruncate(fd, len) == 0,
                None => libc::write(fd, b"z".as_ptr().cast(), 1) == 1,
            };
            if !changed {
                return 102;
            }
            if libc::close(fd) != 0 { 103 } else { 0 }
        }
    })
}

/// The mount clears setuid and setgid itself (the kernel leaves it to the filesystem, so that
/// it need not ask for `security.capability` before every write): as ext4 does, a truncate by
/// an unprivileged process clears them, a change of owner clears them whoever makes it,
/// setgid without group execute stays on a write, and a writer that joins a reader the kernel
/// serves through passthrough (where its writes never reach the daemon) clears them too.
fn check_truncate_chown_and_joined_writers_clear_setuid_as_a_local_filesystem_does(fx: Fixture) {
    let mut fx = fx;
    let mode = |p: &Path| meta(p).mode() & 0o7777;
    let f = fx.p("f");
    write(&f, b"0123456789");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o6777)).expect("chmod 6777");
    assert_eq!(as_nobody(&f, libc::O_WRONLY, Some(4)), 0, "the unprivileged truncate failed");
    assert_eq!((mode(&f), meta(&f).len()), (0o777, 4), "setuid and setgid cleared by an unprivileged truncate");

    fs::set_permissions(&f, fs::Permissions::from_mode(0o6755)).expect("chmod 6755");
    std::os::unix::fs::chown(&f, Some(65534), Some(65534)).expect("chown by root");
    assert_eq!(mode(&f), 0o755, "a change of owner clears setuid and setgid, even by root");

    let lock = fx.p("lock");
    write(&lock, b"l");
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o6766)).expect("chmod 6766");
    assert_eq!(as_nobody(&lock, libc::O_WRONLY | libc::O_APPEND, None), 0, "the unprivileged append failed");
    assert_eq!(mode(&lock), 0o2766, "setuid cleared, setgid without group execute kept");

    // Root holds the file open to read (through passthrough where the mount has it): the
    // unprivileged writer must join that open.
    let shared = fx.p("shared");
    write(&shared, b"x");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o6777)).expect("chmod 6777");
    let reader = File::open(&shared).expect("open to read");
    assert_eq!(as_nobody(&shared, libc::O_WRONLY | libc::O_APPEND, None), 0, "the joining writer failed");
    assert_eq!(mode(&shared), 0o777, "setuid and setgid cleared by an unprivileged writer beside a reader");
    drop(reader);
    assert_eq!(read(&shared), b"xz");
    fx.remount();
    assert_eq!((mode(&f), mode(&lock), mode(&shared)), (0o755, 0o2766, 0o777), "as tierfs stored them");
}

fn check_utimensat_now_omit_and_exact(fx: Fixture) {
    let f = fx.p("f");
    write(&f, b"x");
    assert_eq!(utimens(&f, (1_000_000_000, 123_456_789), (1_100_000_000, 987_654_321)), 0, "utimensat exact");
    let m = meta(&f);
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 123_456_789), "atime to the nanosecond");
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_100_000_000, 987_654_321), "mtime to the nanosecond");

    // UTIME_OMIT keeps atime, UTIME_NOW sets mtime (and ctime) to now.
    let before = now_secs();
    assert_eq!(utimens(&f, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW)), 0, "{}", io::Error::last_os_error());
    let m = meta(&f);
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000_000, 123_456_789), "UTIME_OMIT left atime alone");
    assert!(m.mtime() >= before && m.mtime() <= now_secs() + 1, "UTIME_NOW mtime {} vs now {before}", m.mtime());
    assert!(m.ctime() >= before, "ctime updated");

    assert_eq!(utimens(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_OMIT)), 0, "{}", io::Error::last_os_error());
    let m2 = meta(&f);
    assert!(m2.atime() >= before, "UTIME_NOW atime");
    assert_eq!((m2.mtime(), m2.mtime_nsec()), (m.mtime(), m.mtime_nsec()), "UTIME_OMIT left mtime alone");

    // Pre-epoch times round-trip too.
    assert_eq!(utimens(&f, (-1, 500_000_000), (-86_400, 1)), 0, "{}", io::Error::last_os_error());
    let m = meta(&f);
    assert_eq!((m.atime(), m.atime_nsec()), (-1, 500_000_000));
    assert_eq!((m.mtime(), m.mtime_nsec()), (-86_400, 1));

    // A late writeback must not undo a utimensat made after the write: write, set the
    // times while the data is still in the page cache, then close (which flushes).
    let g = fx.p("g");
    let mut file = create_rw(&g);
    file.write_all(&vec![7u8; 300_000]).expect("write");
    assert_eq!(utimens(&g, (1_200_000_000, 0), (1_300_000_000, 5)), 0, "{}", io::Error::last_os_error());
    drop(file);
    let m = meta(&g);
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_300_000_000, 5), "mtime after close");
    let mut fx = fx;
    fx.remount();
    let m = meta(&fx.p("g"));
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_300_000_000, 5), "mtime as tierfs stored it");
    assert_eq!(m.len(), 300_000);
    let m = meta(&fx.p("f"));
    assert_eq!((m.mtime(), m.mtime_nsec()), (-86_400, 1), "pre-epoch mtime persisted");
}

fn check_writes_update_mtime_and_size_seen_by_stat(fx: Fixture) {
    let f = fx.p("f");
    write(&f, b"x");
    assert_eq!(utimens(&f, (1_000_000_000, 0), (1_000_000_000, 0)), 0);
    let before = now_secs();
    let mut file = OpenOptions::new().append(true).open(&f).expect("open");
    file.write_all(b"more").expect("write");
    let m = file.metadata().expect("fstat");
    assert_eq!(m.len(), 5);
    assert!(m.mtime() >= before, "a write updates mtime (got {})", m.mtime());
    drop(file);
    let mut fx = fx;
    fx.remount();
    let m = meta(&fx.p("f"));
    assert!(m.mtime() >= before, "the write's mtime reached tierfs (got {})", m.mtime());
}

#[test]
fn name_too_long() {
    let fx = Fixture::mounted();
    let ok = "a".repeat(255);
    let long = "b".repeat(256);
    write(&fx.mountpoint.join(&ok), b"255 bytes is fine");
    assert_eq!(read(&fx.mountpoint.join(&ok)), b"255 bytes is fine");
    fs::create_dir(fx.p("d")).expect("mkdir");
    assert_io_errno(File::create(fx.mountpoint.join(&long)), libc::ENAMETOOLONG, "create");
    assert_io_errno(fs::create_dir(fx.mountpoint.join(&long)), libc::ENAMETOOLONG, "mkdir");
    assert_io_errno(fs::metadata(fx.mountpoint.join(&long)), libc::ENAMETOOLONG, "stat");
    assert_io_errno(std::os::unix::fs::symlink("t", fx.mountpoint.join(&long)), libc::ENAMETOOLONG, "symlink");
    assert_io_errno(fs::rename(fx.mountpoint.join(&ok), fx.p("d").join(&long)), libc::ENAMETOOLONG, "rename");
    assert_io_errno(fs::hard_link(fx.mountpoint.join(&ok), fx.p("d").join(&long)), libc::ENAMETOOLONG, "link");
    assert_eq!(names_in(&fx.mountpoint), [ok, "d".to_string()].into_iter().collect());
}

// ---- space management and copies ---------------------------------------------------------

#[test]
fn fallocate_modes() {
    let fx = Fixture::mounted();
    let path = fx.p("f");
    let f = create_rw(&path);

    // Plain: allocates and extends.
    fallocate(&f, 0, 0, MIB).expect("fallocate plain");
    assert_eq!(f.metadata().expect("fstat").len(), MIB);
    assert_eq!(read(&path), vec![0u8; MIB as usize]);

    // KEEP_SIZE beyond the end: size unchanged.
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, MIB, 4 * MIB).expect("fallocate KEEP_SIZE");
    assert_eq!(f.metadata().expect("fstat").len(), MIB, "KEEP_SIZE keeps the size");

    // PUNCH_HOLE in the middle of data: zeros there, the rest intact, size unchanged.
    let data = Rng::new(11).bytes(MIB as usize);
    f.write_all_at(&data, 0).expect("write");
    fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 256 * 1024, 512 * 1024)
        .expect("fallocate PUNCH_HOLE");
    let mut expected = data.clone();
    expected[256 * 1024..768 * 1024].fill(0);
    assert_bytes_eq(&read(&path), &expected, "after PUNCH_HOLE");
    assert_eq!(f.metadata().expect("fstat").len(), MIB);
    f.sync_all().expect("fsync");
    // Holes may be reported as data (writeback-cache mounts do), never data as holes.
    assert!(lseek(&f, 0, libc::SEEK_HOLE).expect("SEEK_HOLE") >= 256 * 1024, "no hole before the punched range");
    assert!(lseek(&f, 256 * 1024, libc::SEEK_DATA).expect("SEEK_DATA") <= 768 * 1024, "data after the hole");
    assert_io_errno(fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 10), libc::EOPNOTSUPP, "PUNCH_HOLE without KEEP_SIZE");

    // ZERO_RANGE: zeros inside; past the end it extends the file unless KEEP_SIZE.
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 10, 100).expect("fallocate ZERO_RANGE");
    expected[10..110].fill(0);
    assert_bytes_eq(&read(&path), &expected, "after ZERO_RANGE");
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, MIB - 10, 1000).expect("ZERO_RANGE past the end");
    expected[(MIB - 10) as usize..].fill(0);
    expected.resize((MIB + 990) as usize, 0);
    assert_eq!(f.metadata().expect("fstat").len(), MIB + 990, "ZERO_RANGE past the end extends");
    assert_bytes_eq(&read(&path), &expected, "after ZERO_RANGE past the end");
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, MIB + 900, 50_000)
        .expect("ZERO_RANGE|KEEP_SIZE");
    expected[(MIB + 900) as usize..].fill(0);
    assert_eq!(f.metadata().expect("fstat").len(), MIB + 990);
    assert_bytes_eq(&read(&path), &expected, "after ZERO_RANGE|KEEP_SIZE");

    // COLLAPSE_RANGE and INSERT_RANGE: the kernel's FUSE refuses them before the daemon sees
    // them (docs/SEMANTICS.md), and the file stays as it was.
    for (mode, what) in
        [(libc::FALLOC_FL_COLLAPSE_RANGE, "COLLAPSE_RANGE"), (libc::FALLOC_FL_INSERT_RANGE, "INSERT_RANGE")]
    {
        assert_io_errno(fallocate(&f, mode, 0, 4096), libc::EOPNOTSUPP, what);
        assert_eq!(f.metadata().expect("fstat").len(), MIB + 990, "{what} left the size");
        assert_bytes_eq(&read(&path), &expected, what);
    }
    drop(f);

    let mut fx = fx;
    fx.remount();
    assert_bytes_eq(&read(&fx.p("f")), &expected, "fallocated file after remount");
}

fn copy_range(src: &File, off_in: u64, dst: &File, off_out: u64, len: u64) -> io::Result<u64> {
    let (mut i, mut o) = (off_in as i64, off_out as i64);
    let mut done = 0u64;
    while done < len {
        // SAFETY: valid descriptors and offset pointers.
        let n = unsafe {
            libc::copy_file_range(src.as_raw_fd(), &mut i, dst.as_raw_fd(), &mut o, (len - done) as usize, 0)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

#[test]
fn copy_file_range_copies_bytes() {
    let fx = Fixture::mounted();
    let mut rng = Rng::new(5);
    let data = rng.bytes((3 * MIB + 777) as usize);
    // The source is still in the kernel's page cache (no close, no fsync) when copied.
    let src = create_rw(&fx.p("src"));
    src.write_all_at(&data, 0).expect("write src");
    let dst = create_rw(&fx.p("dst"));
    assert_eq!(copy_range(&src, 0, &dst, 0, data.len() as u64).expect("copy_file_range"), data.len() as u64);
    assert_bytes_eq(&read(&fx.p("dst")), &data, "whole-file copy");
    assert_eq!(meta(&fx.p("dst")).len(), data.len() as u64);

    // Partial copy into the middle of an existing file, at unaligned offsets.
    let mut expected = rng.bytes(20_000);
    let other = create_rw(&fx.p("other"));
    other.write_all_at(&expected, 0).expect("write other");
    assert_eq!(copy_range(&src, 1000, &other, 7, 5000).expect("partial copy"), 5000);
    expected[7..5007].copy_from_slice(&data[1000..6000]);
    assert_bytes_eq(&read(&fx.p("other")), &expected, "partial copy");
    // Past the end of the destination: extends it (with a hole between).
    assert_eq!(copy_range(&src, 0, &other, 30_000, 100).expect("copy past the end"), 100);
    expected.resize(30_000, 0);
    expected.extend_from_slice(&data[..100]);
    assert_bytes_eq(&read(&fx.p("other")), &expected, "copy past the end");
    // Reading past the source's end copies nothing.
    assert_eq!(copy_range(&src, data.len() as u64 + 10, &other, 0, 100).expect("copy at EOF"), 0);
    // The source stays intact.
    assert_bytes_eq(&read(&fx.p("src")), &data, "source after copies");
    drop((src, dst, other));

    let mut fx = fx;
    fx.remount();
    assert_bytes_eq(&read(&fx.p("dst")), &data, "copy after remount");
    assert_bytes_eq(&read(&fx.p("other")), &expected, "partial copy after remount");
}

// ---- locks and mmap ----------------------------------------------------------------------

#[test]
fn flock_and_fcntl_locks_between_processes() {
    let fx = Fixture::mounted();
    let path = fx.p("lockfile");
    write(&path, &[0u8; 1000]);
    let c_path = cpath(&path);

    // flock: exclusive between two open file descriptions, and across processes.
    let a = open_rw(&path);
    let b = open_rw(&path);
    // SAFETY: flock on open descriptors.
    unsafe {
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0, "flock a");
        assert_errno(
            libc::flock(b.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) as i64,
            libc::EWOULDBLOCK,
            "second flock",
        );
        assert_errno(
            libc::flock(b.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) as i64,
            libc::EWOULDBLOCK,
            "shared flock against exclusive",
        );
    }
    let child_flock = || {
        in_child(|| {
            // SAFETY: raw syscalls only in the forked child.
            unsafe {
                let fd = libc::open(c_path.as_ptr(), libc::O_RDWR);
                if fd < 0 {
                    return 100;
                }
                if libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0 { 0 } else { child_errno() }
            }
        })
    };
    assert_eq!(child_flock(), libc::EWOULDBLOCK, "another process cannot flock while we hold it");
    // SAFETY: flock on open descriptors.
    unsafe {
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_UN), 0);
    }
    assert_eq!(child_flock(), 0, "free after LOCK_UN");
    // SAFETY: flock on open descriptors.
    unsafe {
        assert_eq!(libc::flock(b.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), 0, "shared");
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB), 0, "two shared locks coexist");
        assert_eq!(libc::flock(a.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(libc::flock(b.as_raw_fd(), libc::LOCK_UN), 0);
    }

    // fcntl (POSIX) record locks: a write lock on [0, 100) excludes another process there
    // but not elsewhere; F_GETLK names the holder.
    let lock = |l_type: i32, start: i64, len: i64| libc::flock {
        l_type: l_type as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    let mut wr = lock(libc::F_WRLCK, 0, 100);
    // SAFETY: fcntl with a valid flock struct.
    assert_eq!(unsafe { libc::fcntl(a.as_raw_fd(), libc::F_SETLK, &mut wr) }, 0, "F_SETLK write");
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let raw_a = a.as_raw_fd();
    let code = in_child(|| {
        let mut overlap = lock(libc::F_WRLCK, 50, 10);
        let mut elsewhere = lock(libc::F_WRLCK, 200, 100);
        let mut probe = lock(libc::F_RDLCK, 0, 1);
        // SAFETY: raw syscalls only in the forked child; POSIX locks belong to the process,
        // so the inherited descriptor is as good as our own open.
        unsafe {
            if libc::fcntl(raw_a, libc::F_SETLK, &mut overlap) == 0 {
                return 1;
            }
            let e = child_errno();
            if e != libc::EAGAIN && e != libc::EACCES {
                return 2;
            }
            if libc::fcntl(raw_a, libc::F_GETLK, &mut probe) != 0 {
                return 3;
            }
            if probe.l_type != libc::F_WRLCK as libc::c_short || probe.l_pid != me {
                return 4;
            }
            if libc::fcntl(raw_a, libc::F_SETLK, &mut elsewhere) != 0 {
                return 5;
            }
            0
        }
    });
    assert_eq!(
        code, 0,
        "child's view of the fcntl lock (1: overlapping lock granted, 2: wrong errno, 3/4: F_GETLK, 5: disjoint lock refused)"
    );
    let mut un = lock(libc::F_UNLCK, 0, 0);
    // SAFETY: fcntl with a valid flock struct.
    assert_eq!(unsafe { libc::fcntl(a.as_raw_fd(), libc::F_SETLK, &mut un) }, 0, "unlock");
    let code = in_child(|| {
        let mut overlap = lock(libc::F_WRLCK, 50, 10);
        // SAFETY: raw syscalls only in the forked child.
        unsafe { if libc::fcntl(raw_a, libc::F_SETLK, &mut overlap) == 0 { 0 } else { child_errno() } }
    });
    assert_eq!(code, 0, "the range is free after F_UNLCK");

    // Open file description locks: two descriptors of one process exclude each other.
    let mut ofd = lock(libc::F_WRLCK, 0, 10);
    // SAFETY: fcntl with a valid flock struct.
    assert_eq!(unsafe { libc::fcntl(a.as_raw_fd(), libc::F_OFD_SETLK, &mut ofd) }, 0, "OFD lock a");
    let mut ofd2 = lock(libc::F_WRLCK, 5, 10);
    // SAFETY: fcntl with a valid flock struct.
    let rc = unsafe { libc::fcntl(b.as_raw_fd(), libc::F_OFD_SETLK, &mut ofd2) };
    assert_errno(rc as i64, libc::EAGAIN, "conflicting OFD lock from another descriptor");
}

#[test]
fn shared_writable_mmap_reaches_the_file() {
    let fx = Fixture::mounted();
    let path = fx.p("mapped");
    let len = 3 * 4096 + 100;
    write(&path, &vec![b'.'; len]);
    let f = open_rw(&path);
    // SAFETY: mapping an open file of `len` bytes, shared and writable; unmapped below.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
    let mut expected = vec![b'.'; len];
    {
        // SAFETY: the mapping is `len` bytes long and nothing else aliases it here.
        let map = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) };
        assert_eq!(map[0], b'.', "the mapping shows the file");
        for (i, b) in map.iter_mut().enumerate().step_by(97) {
            *b = (i % 251) as u8;
            expected[i] = (i % 251) as u8;
        }
        map[len - 1] = b'!';
        expected[len - 1] = b'!';
    }
    // SAFETY: msync and munmap of the mapping made above.
    unsafe {
        assert_eq!(libc::msync(ptr, len, libc::MS_SYNC), 0, "msync: {}", io::Error::last_os_error());
        assert_eq!(libc::munmap(ptr, len), 0, "munmap: {}", io::Error::last_os_error());
    }
    drop(f);
    assert_bytes_eq(&read(&path), &expected, "read() after msync+munmap");

    // Dirty mapped pages without msync are written back at munmap/close too.
    let f = open_rw(&path);
    // SAFETY: as above.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
    // SAFETY: writing one byte inside the mapping, then unmapping it.
    unsafe {
        *ptr.cast::<u8>().add(5000) = b'M';
        assert_eq!(libc::munmap(ptr, len), 0);
    }
    expected[5000] = b'M';
    f.sync_all().expect("fsync");
    drop(f);
    assert_bytes_eq(&read(&path), &expected, "read() after munmap+fsync");

    let mut fx = fx;
    fx.remount();
    assert_bytes_eq(&read(&fx.p("mapped")), &expected, "mmap writes reached tierfs");
}

// ---- whole-filesystem behaviour ----------------------------------------------------------

/// The kernel's readahead window of a mount (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`).
fn read_ahead_kib(mountpoint: &Path) -> u32 {
    let dev = meta(mountpoint).dev();
    let path = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    text.trim().parse().unwrap_or_else(|e| panic!("{path} holds {text:?}: {e}"))
}

/// Issue 24, item 3: the kernel's window (128 KiB, which FUSE's INIT cannot raise) is widened
/// once the mount serves, so a page fault in an mmapped file brings 1 MiB; `--read-ahead-kib`
/// sets another size and 0 leaves the kernel's.
#[test]
fn the_mount_widens_the_kernel_readahead_window() {
    let fx = Fixture::mounted();
    assert_eq!(read_ahead_kib(&fx.mountpoint), 1024, "the default window");
    let fx = Fixture::mounted_with(&["--read-ahead-kib", "4096"]);
    assert_eq!(read_ahead_kib(&fx.mountpoint), 4096, "--read-ahead-kib 4096");
    let fx = Fixture::mounted_with(&["--read-ahead-kib", "0"]);
    assert!(read_ahead_kib(&fx.mountpoint) < 1024, "--read-ahead-kib 0 must leave the kernel's window");
    // A page-by-page walk of a mapped file reads back what was written.
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    write(&fx.p("mapped"), &data);
    let f = File::open(fx.p("mapped")).expect("open");
    // SAFETY: a read-only private mapping of a file this test owns, unmapped below.
    let ptr =
        unsafe { libc::mmap(std::ptr::null_mut(), data.len(), libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0) };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
    // SAFETY: the mapping is data.len() bytes long and stays mapped until munmap.
    let mapped = unsafe { std::slice::from_raw_parts(ptr as *const u8, data.len()) };
    for page in (0..data.len() / 4096).rev().step_by(7) {
        assert_eq!(mapped[page * 4096], data[page * 4096], "page {page}");
    }
    // SAFETY: ptr and the length are the mapping's.
    unsafe { libc::munmap(ptr, data.len()) };
}

#[test]
fn statfs_is_sane() {
    let fx = Fixture::mounted();
    // SAFETY: zeroed statfs/statvfs are valid out-parameters.
    let (mut sfs, mut svfs, mut host) = unsafe {
        (std::mem::zeroed::<libc::statfs>(), std::mem::zeroed::<libc::statvfs>(), std::mem::zeroed::<libc::statvfs>())
    };
    let (m, d) = (cpath(&fx.mountpoint), cpath(&fx.data_dir));
    // SAFETY: valid paths and out-parameters.
    unsafe {
        assert_eq!(libc::statfs(m.as_ptr(), &mut sfs), 0, "statfs: {}", io::Error::last_os_error());
        assert_eq!(libc::statvfs(m.as_ptr(), &mut svfs), 0, "statvfs: {}", io::Error::last_os_error());
        assert_eq!(libc::statvfs(d.as_ptr(), &mut host), 0, "statvfs host: {}", io::Error::last_os_error());
    }
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    assert_eq!(sfs.f_type, FUSE_SUPER_MAGIC, "a FUSE filesystem");
    assert_eq!(svfs.f_namemax, 255);
    assert!(svfs.f_bsize > 0 && svfs.f_frsize > 0);
    assert!(svfs.f_blocks > 0, "a size is reported");
    assert!(svfs.f_bfree <= svfs.f_blocks && svfs.f_bavail <= svfs.f_bfree);
    assert!(svfs.f_ffree <= svfs.f_files && svfs.f_files > 0);
    // The space is that of the disk holding the data directory.
    let bytes = |blocks: u64, frsize: u64| blocks as f64 * frsize as f64;
    let (ours, theirs) = (bytes(svfs.f_blocks, svfs.f_frsize), bytes(host.f_blocks, host.f_frsize));
    assert!((ours - theirs).abs() / theirs < 0.01, "total size {ours} vs data disk {theirs}");
    let (ours, theirs) = (bytes(svfs.f_bavail, svfs.f_frsize), bytes(host.f_bavail, host.f_frsize));
    assert!((ours - theirs).abs() / theirs.max(1.0) < 0.05, "available {ours} vs data disk {theirs}");
    // Creating files is reflected in the inode counts.
    let used_before = svfs.f_files - svfs.f_ffree;
    for i in 0..10 {
        File::create(fx.p(&format!("f{i}"))).expect("create");
    }
    // SAFETY: valid path and out-parameter.
    unsafe { assert_eq!(libc::statvfs(m.as_ptr(), &mut svfs), 0) };
    assert_eq!(svfs.f_files - svfs.f_ffree, used_before + 10, "used inodes grow with files");
}

#[test]
fn git_like_workload() {
    let fx = Fixture::mounted();
    let mut rng = Rng::new(42);
    let repo = fx.p("repo");
    fs::create_dir_all(repo.join(".git/objects")).expect("mkdir");
    let mut objects = BTreeMap::new();
    // Loose objects: write to a temporary name, fsync, rename into a fan-out directory.
    for i in 0..400 {
        let len = rng.range(0, 6000) as usize;
        let body = rng.bytes(len);
        let hash = blake3::hash(&body).to_hex().to_string();
        let dir = repo.join(".git/objects").join(&hash[..2]);
        fs::create_dir_all(&dir).expect("mkdir fan-out");
        let tmp = repo.join(format!(".git/objects/tmp_obj_{i}"));
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o444).open(&tmp).expect("create tmp");
        f.write_all(&body).expect("write object");
        if i % 10 == 0 {
            f.sync_all().expect("fsync object");
        }
        drop(f);
        fs::rename(&tmp, dir.join(&hash[2..])).expect("rename object into place");
        objects.insert(hash, body);
    }
    // The index: rewritten through index.lock and renamed over, many times.
    let mut index = Vec::new();
    for round in 0..50 {
        index = format!("index round {round}\n").into_bytes();
        let len = rng.range(100, 20_000) as usize;
        index.extend(rng.bytes(len));
        let lock = repo.join(".git/index.lock");
        let mut f = OpenOptions::new().write(true).create_new(true).open(&lock).expect("index.lock exclusive");
        f.write_all(&index).expect("write index");
        f.sync_all().expect("fsync index");
        drop(f);
        fs::rename(&lock, repo.join(".git/index")).expect("rename index.lock over index");
        assert_eq!(read(&repo.join(".git/index")), index, "index after round {round}");
    }
    let git_dir = File::open(repo.join(".git")).expect("open .git");
    git_dir.sync_all().expect("fsync a directory");

    let verify = |fx: &Fixture| {
        let repo = fx.p("repo");
        let mut count = 0;
        for fan in fs::read_dir(repo.join(".git/objects")).expect("readdir objects") {
            let fan = fan.expect("entry");
            let prefix = fan.file_name().to_string_lossy().into_owned();
            assert_eq!(prefix.len(), 2, "no temporary object left behind: {prefix}");
            for obj in fs::read_dir(fan.path()).expect("readdir fan-out") {
                let obj = obj.expect("entry");
                let hash = format!("{prefix}{}", obj.file_name().to_string_lossy());
                let body = read(&obj.path());
                assert_eq!(blake3::hash(&body).to_hex().to_string(), hash, "object {hash} intact");
                assert_eq!(obj.metadata().expect("stat").mode() & 0o777, 0o444 & !current_umask());
                count += 1;
            }
        }
        assert_eq!(count, objects.len(), "every object present");
        assert_eq!(read(&repo.join(".git/index")), index);
        assert!(!repo.join(".git/index.lock").exists());
    };
    verify(&fx);
    drop(git_dir);
    let mut fx = fx;
    fx.remount();
    verify(&fx);

    // And real git, when the machine has it.
    if Command::new("git").arg("--version").output().is_ok() {
        let work = fx.p("real");
        fs::create_dir(&work).expect("mkdir");
        for i in 0..50 {
            let sub = work.join(format!("src/m{}", i % 5));
            fs::create_dir_all(&sub).expect("mkdir");
            write(&sub.join(format!("f{i}.txt")), format!("file {i}\n").repeat(i + 1).as_bytes());
        }
        let git = |args: &[&str]| {
            let mut cmd = Command::new("git");
            cmd.arg("-C").arg(&work).args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "gc.auto=0"]).args(args);
            run(&mut cmd, Duration::from_secs(60)).assert_success(&format!("git {args:?}")).stdout.clone()
        };
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "one"]);
        write(&work.join("src/m0/f0.txt"), b"changed\n");
        fs::rename(work.join("src/m1/f1.txt"), work.join("src/m1/renamed.txt")).expect("rename");
        git(&["commit", "-q", "-a", "-m", "two"]);
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "three"]);
        git(&["gc", "-q"]);
        git(&["fsck", "--strict", "--no-progress"]);
        assert_eq!(git(&["status", "--porcelain"]), "", "a clean work tree");
        assert_eq!(git(&["rev-list", "--count", "HEAD"]).trim(), "3");
    } else {
        println!("git not installed: ran the git-like workload without real git");
    }
}

// ---- persistence and exclusivity ---------------------------------------------------------

/// Everything observable about one path, for comparing a tree before and after remount.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    ino: u64,
    mtime: (i64, i64),
    contents: Option<String>, // blake3 of a file's bytes
    link: Option<PathBuf>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

fn observe_tree(root: &Path) -> BTreeMap<PathBuf, Observed> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("readdir") {
            let path = entry.expect("entry").path();
            let m = meta(&path);
            let kind = m.file_type();
            if kind.is_dir() {
                stack.push(path.clone());
            }
            let xattrs = if kind.is_symlink() {
                BTreeMap::new()
            } else {
                listxattr(&path).into_iter().map(|n| (n.clone(), getxattr(&path, &n).expect("getxattr"))).collect()
            };
            out.insert(
                path.strip_prefix(root).expect("inside root").to_path_buf(),
                Observed {
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    size: m.len(),
                    nlink: m.nlink(),
                    ino: m.ino(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    contents: kind.is_file().then(|| blake3::hash(&read(&path)).to_hex().to_string()),
                    link: kind.is_symlink().then(|| fs::read_link(&path).expect("readlink")),
                    xattrs,
                },
            );
        }
    }
    out
}

#[test]
fn everything_persists_across_unmount_and_mount() {
    let mut fx = Fixture::mounted();
    let mut rng = Rng::new(99);
    fs::create_dir_all(fx.p("a/b/c")).expect("mkdir -p");
    write(&fx.p("a/b/c/deep"), b"deep");
    write(&fx.p("big"), &rng.bytes((5 * MIB + 3) as usize));
    File::create(fx.p("empty")).expect("create");
    {
        let f = create_rw(&fx.p("sparse"));
        f.set_len(9 * MIB).expect("ftruncate");
        f.write_all_at(b"island", 4 * MIB).expect("pwrite");
    }
    write(&fx.p("private"), b"secret");
    fs::set_permissions(fx.p("private"), fs::Permissions::from_mode(0o600)).expect("chmod");
    write(&fx.p("tool"), b"#!/bin/sh\n");
    fs::set_permissions(fx.p("tool"), fs::Permissions::from_mode(0o4751)).expect("chmod");
    std::os::unix::fs::chown(fx.p("tool"), Some(1000), Some(1001)).expect("chown");
    fs::set_permissions(fx.p("tool"), fs::Permissions::from_mode(0o4751)).expect("chmod after chown");
    fs::set_permissions(fx.p("a/b"), fs::Permissions::from_mode(0o711)).expect("chmod dir");
    fs::hard_link(fx.p("a/b/c/deep"), fx.p("deep-link")).expect("link");
    std::os::unix::fs::symlink("a/c-moved/deep", fx.p("sym")).expect("symlink");
    std::os::unix::fs::symlink("/nonexistent/target", fx.p("a/dangling")).expect("symlink");
    assert_eq!(setxattr(&fx.p("big"), "user.checksum", b"abc123", 0), 0);
    assert_eq!(setxattr(&fx.p("a"), "user.dir-note", &[0, 1, 2, 255], 0), 0);
    assert_eq!(utimens(&fx.p("empty"), (1_500_000_000, 1), (1_600_000_000, 2)), 0);
    fs::rename(fx.p("a/b/c"), fx.p("a/c-moved")).expect("rename dir");
    // A file left open (written, not closed) while unmounting would keep the mount busy:
    // everything is closed here, as `tierfs umount` requires.

    let before = observe_tree(&fx.mountpoint);
    assert!(before.len() >= 12, "the tree was built: {before:?}");
    let inodes = fx.status()["inodes"].as_u64().expect("inodes");
    fx.umount();
    assert_eq!(names_in(&fx.mountpoint), BTreeSet::new(), "nothing is left on the bare mountpoint");
    fx.mount();
    let after = observe_tree(&fx.mountpoint);
    for (path, was) in &before {
        assert_eq!(after.get(path), Some(was), "{} changed across remount", path.display());
    }
    assert_eq!(after.len(), before.len(), "no extra entries after remount");
    assert_eq!(fx.status()["inodes"].as_u64(), Some(inodes), "inode count after remount");
    assert_eq!(read(&fx.p("sym")), b"deep");
    let sparse = read(&fx.p("sparse"));
    assert_eq!(&sparse[(4 * MIB) as usize..(4 * MIB) as usize + 6], b"island");
    assert!(sparse[..(4 * MIB) as usize].iter().all(|&b| b == 0));

    // And once more, after changing things on the remounted tree.
    write(&fx.p("after"), b"second life");
    fs::remove_file(fx.p("deep-link")).expect("unlink");
    fx.remount();
    assert_eq!(read(&fx.p("after")), b"second life");
    assert!(!fx.p("deep-link").exists());
    assert_eq!(meta(&fx.p("a/c-moved/deep")).nlink(), 1);
}

#[test]
fn second_mount_of_a_data_dir_in_use_is_refused() {
    let fx = Fixture::mounted();
    write(&fx.p("keep"), b"first mount");
    let other = fx.tmp.path().join("other-mnt");
    fs::create_dir(&other).expect("mkdir");

    let out = fx.try_mount_at(&fx.data_dir, &other);
    assert!(!out.success(), "a second mount of the same data dir succeeded: {out:?}");
    assert_eq!(out.status.code(), Some(1), "failure exit status: {out:?}");
    assert!(
        out.stderr.contains("in use") && out.stderr.contains(&*fx.data_dir.to_string_lossy()),
        "the message should say the data directory {} is in use: {}",
        fx.data_dir.display(),
        out.stderr
    );
    assert!(!is_mounted(&other), "the refused mount left {} mounted", other.display());

    // The same through a foreground mount.
    let mut cmd = fx.tierfs();
    cmd.args(["mount", "--foreground", "--data-dir"]).arg(&fx.data_dir).arg(&other);
    let out = run(&mut cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "foreground second mount: {out:?}");
    assert!(out.stderr.contains("in use"), "foreground second mount message: {}", out.stderr);
    assert!(!is_mounted(&other));

    // The first mount is unharmed.
    assert_eq!(read(&fx.p("keep")), b"first mount");
    write(&fx.p("still-works"), b"yes");
    assert_eq!(read(&fx.p("still-works")), b"yes");
}

/// With the writeback cache the kernel flushes the times of a file it still caches after the
/// file was unlinked and reclaimed; that must not surface as an error of `syncfs` (in either
/// mode).
fn check_syncfs_after_unlinking_a_written_file_succeeds(fx: Fixture) {
    for i in 0..3 {
        let p = fx.p(&format!("gone-{i}"));
        write(&p, b"short-lived");
        fs::remove_file(&p).expect("unlink");
        let dir = File::open(&fx.mountpoint).expect("open the mount root");
        // SAFETY: a valid open descriptor.
        let rc = unsafe { libc::syncfs(dir.as_raw_fd()) };
        assert_eq!(rc, 0, "syncfs after unlink: {}", io::Error::last_os_error());
    }
}

/// Runs each named check twice: on a default mount (no writeback cache: tierfs owns the
/// timestamps of writes) and on a `--writeback-cache` mount (the kernel owns them and flushes
/// dirty pages and times late).
macro_rules! both_cache_modes {
    ($($check:ident => $default:ident, $writeback:ident;)*) => {$(
        #[test]
        fn $default() {
            $check(Fixture::mounted());
        }

        #[test]
        fn $writeback() {
            $check(Fixture::mounted_with(&["--writeback-cache"]));
        }
    )*};
}

both_cache_modes! {
    check_writes_clear_setuid_only_as_a_local_filesystem_does => writes_clear_setuid_only_as_a_local_filesystem_does, writes_clear_setuid_only_as_a_local_filesystem_does_with_writeback_cache;
    check_truncate_chown_and_joined_writers_clear_setuid_as_a_local_filesystem_does => truncate_chown_and_joined_writers_clear_setuid_as_a_local_filesystem_does, truncate_chown_and_joined_writers_clear_setuid_as_a_local_filesystem_does_with_writeback_cache;
    check_utimensat_now_omit_and_exact => utimensat_now_omit_and_exact, utimensat_now_omit_and_exact_with_writeback_cache;
    check_writes_update_mtime_and_size_seen_by_stat => writes_update_mtime_and_size_seen_by_stat, writes_update_mtime_and_size_seen_by_stat_with_writeback_cache;
    check_syncfs_after_unlinking_a_written_file_succeeds => syncfs_after_unlinking_a_written_file_succeeds, syncfs_after_unlinking_a_written_file_succeeds_with_writeback_cache;
}

/// Lookups of missing names are cached by the kernel (negative entries): each way of making
/// the name exist through the mount must show it at once, also to another process.
#[test]
fn missing_names_appear_as_soon_as_they_are_created() {
    let fx = Fixture::mounted();
    fs::create_dir(fx.p("d")).expect("mkdir d");
    write(&fx.p("src"), b"source");
    write(&fx.p("linked"), b"link target");
    let missing = |name: &str| {
        let err = fs::symlink_metadata(fx.p(name)).expect_err("not there yet");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{name}");
        // Twice: the second answer may come from the kernel's negative entry.
        assert!(fs::symlink_metadata(fx.p(name)).is_err(), "{name}");
    };
    let seen_by_another_process = |name: &str| {
        let path = fx.p(name);
        let status = std::process::Command::new("stat").arg("--").arg(&path).output().expect("running stat");
        assert!(status.status.success(), "another process does not see {name}: {status:?}");
    };
    type Make<'a> = &'a dyn Fn(&Path);
    let ways: [(&str, Make); 6] = [
        ("created", &|p| write(p, b"new")),
        ("made-dir", &|p| fs::create_dir(p).expect("mkdir")),
        ("symlinked", &|p| std::os::unix::fs::symlink("src", p).expect("symlink")),
        ("hard-linked", &|p| fs::hard_link(fx.p("linked"), p).expect("link")),
        ("renamed-onto", &|p| fs::rename(fx.p("src"), p).expect("rename")),
        ("d/in-subdir", &|p| write(p, b"nested")),
    ];
    for (name, make) in ways {
        missing(name);
        make(&fx.p(name));
        assert!(fs::symlink_metadata(fx.p(name)).is_ok(), "{name} not visible right after it was made");
        seen_by_another_process(name);
    }
    // Gone again, then back.
    fs::remove_file(fx.p("created")).expect("unlink");
    missing("created");
    write(&fx.p("created"), b"again");
    assert_eq!(read(&fx.p("created")), b"again");
}
