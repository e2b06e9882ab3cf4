//! Holes and extreme lengths through real mounts, with and without a store: a length past
//! what tierfs supports is a clean EFBIG, a hole costs nothing (no upload, no pending or
//! cached bytes, no memory), and the daemon survives every call. Outcomes only (errno,
//! bytes, status numbers, a generous RSS ceiling), never timings.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use std::collections::BTreeMap;

use common::{Fixture, Rng};
use store_node::Node;

const MIB: u64 = 1 << 20;
const TIB: u64 = 1 << 40;
/// tierfs's largest file size (docs/SEMANTICS.md, "Limits").
const MAX_FILE_SIZE: u64 = (16 << 40) - 4096;
/// The daemon's resident memory must stay below this whatever the files claim.
const RSS_CEILING: u64 = 512 * MIB;

/// A memory figure of the daemon's `/proc/PID/status` (`VmRSS`, `VmHWM`), in bytes.
fn proc_memory(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the daemon's status"));
    kib * 1024
}

fn rss(pid: u32) -> u64 {
    proc_memory(pid, "VmRSS")
}

fn assert_alive_and_small(pid: u32, when: &str) {
    assert!(common::process_alive(pid), "{when}: the daemon died");
    let rss = rss(pid);
    assert!(rss < RSS_CEILING, "{when}: the daemon holds {} MiB", rss / MIB);
}

/// fallocate(2) on `f`: `Err` with the errno.
fn fallocate(f: &fs::File, mode: i32, offset: u64, len: u64) -> Result<(), i32> {
    // SAFETY: fallocate(2) on an open descriptor; the kernel checks the range.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc == 0 { Ok(()) } else { Err(common::errno()) }
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) -> i32 {
    let e = r.expect_err(what);
    e.raw_os_error().unwrap_or_else(|| panic!("{what}: {e}"))
}

/// The extreme calls of issue 25 against the mount at `root` (served by `pid`).
fn extremes(root: &Path, pid: u32) {
    let path = root.join("big");
    let f = fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).expect("create");
    // The truncate that once made the daemon allocate per chunk until the OOM killer came.
    assert_eq!(errno_of(f.set_len(999_999_999_999_999), "truncate 999999999999999"), libc::EFBIG);
    assert_eq!(errno_of(f.set_len(MAX_FILE_SIZE + 1), "truncate past the limit"), libc::EFBIG);
    assert_eq!(f.metadata().expect("stat").len(), 0, "a refused truncate changed the size");
    // Writes, fallocate and copies past the limit, and offsets near 2^63.
    for off in [MAX_FILE_SIZE, i64::MAX as u64 - 10] {
        assert_eq!(errno_of(f.write_at(b"xyz", off), "write near 2^63"), libc::EFBIG, "write at {off}");
    }
    assert_eq!(fallocate(&f, 0, MAX_FILE_SIZE - 4096, 1 << 20), Err(libc::EFBIG), "fallocate past the limit");
    assert_eq!(
        fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, i64::MAX as u64 - 10, 5),
        Err(libc::EFBIG),
        "fallocate near 2^63"
    );

    // The largest size is fine, and cheap: a hole of 16 TiB.
    f.set_len(MAX_FILE_SIZE).expect("truncate to the largest size");
    f.write_at(b"tail", MAX_FILE_SIZE - 4).expect("write the last bytes");
    f.write_at(b"head", 0).expect("write the first bytes");
    let mut buf = [0u8; 4];
    f.read_exact_at(&mut buf, MAX_FILE_SIZE - 4).expect("read the last bytes");
    assert_eq!(&buf, b"tail");
    f.read_exact_at(&mut buf, 8 * TIB).expect("read the middle of the hole");
    assert_eq!(buf, [0; 4]);
    // SAFETY: lseek(2) on an open descriptor.
    let data = unsafe { libc::lseek(f.as_raw_fd(), 4096, libc::SEEK_DATA) };
    assert!(data as u64 >= MAX_FILE_SIZE - 4 * MIB, "SEEK_DATA found data at {data} in the hole");
    // SAFETY: as above.
    let past = unsafe { libc::lseek(f.as_raw_fd(), MAX_FILE_SIZE as i64, libc::SEEK_DATA) };
    assert_eq!((past, common::errno()), (-1, libc::ENXIO), "SEEK_DATA at the end");
    // A punch hole and a zero range over the whole length touch only the chunks with data.
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(fallocate(&f, punch, 4, MAX_FILE_SIZE - 8), Ok(()), "punch hole over 16 TiB");
    f.read_exact_at(&mut buf, 0).expect("read the first bytes");
    assert_eq!(&buf, b"head", "the punch reached before its offset");
    let r = fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, TIB, 64 * MIB);
    assert!(matches!(r, Ok(()) | Err(libc::EOPNOTSUPP)), "zero range: {r:?}");
    // Zeroing allocates: a range larger than the disk is ENOSPC, not a crash.
    let r = fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, TIB, 8 * TIB);
    assert!(matches!(r, Ok(()) | Err(libc::ENOSPC | libc::EOPNOTSUPP)), "zero range of 8 TiB: {r:?}");
    // A copy whose target would pass the limit.
    let other = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(root.join("src"))
        .expect("create");
    other.write_at(&[7u8; 8192], 0).expect("write");
    let mut off_in: i64 = 0;
    let mut off_out: i64 = (MAX_FILE_SIZE - 100) as i64;
    // SAFETY: valid descriptors and offset pointers.
    let n = unsafe { libc::copy_file_range(other.as_raw_fd(), &mut off_in, f.as_raw_fd(), &mut off_out, 8192, 0) };
    assert_eq!((n, common::errno()), (-1, libc::EFBIG), "copy_file_range past the limit");
    assert_alive_and_small(pid, "after the extreme calls");
    // Zero-length operations at the largest offsets do nothing.
    assert_eq!(f.write_at(b"", i64::MAX as u64).expect("zero-length write"), 0);
    assert_eq!(f.read_at(&mut [], MAX_FILE_SIZE).expect("zero-length read"), 0);
    drop(f);
    // Shrinking it back is cheap too.
    fs::OpenOptions::new().write(true).open(&path).expect("open").set_len(1).expect("truncate down");
    assert_eq!(fs::read(&path).expect("read"), b"h");
    assert_alive_and_small(pid, "at the end");
}

#[test]
fn extreme_lengths_are_efbig_or_cheap_without_a_store() {
    let fx = Fixture::mounted();
    extremes(&fx.mountpoint, fx.daemon_pid.expect("daemon"));
}

#[test]
fn extreme_lengths_are_efbig_or_cheap_with_a_store() {
    let mut node = Node::init_file();
    node.mount(&[]);
    extremes(&node.fx.mountpoint, node.fx.daemon_pid.expect("daemon"));
    let status = node.fx.status();
    assert_eq!(status["cold"]["upload_errors"], 0, "{status}");
    node.fx.umount();
}

/// A 1 TiB sparse file with 1 MiB of data costs that MiB: in `status`, in the upload, at
/// unmount and after a reset, where it comes back sparse.
#[test]
fn a_one_tib_sparse_file_costs_only_its_data() {
    let mut a = Node::init_file();
    a.mount(&[]);
    let path = a.fx.p("disk.img");
    let f = fs::File::create(&path).expect("create");
    f.set_len(TIB).expect("truncate -s 1T");
    let block: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    // 1.25 MiB of data: at the start, in the middle, near the end.
    for off in [0, 300 << 30, TIB - MIB] {
        f.write_at(&block[..(MIB / 4) as usize], off).expect("pwrite");
    }
    f.write_at(&block[..(MIB / 2) as usize], 600 << 30).expect("pwrite");
    drop(f);
    let status = a.fx.status();
    let pending = status["cold"]["dirty_bytes"].as_u64().expect("dirty_bytes");
    assert!(pending <= 2 * MIB, "status counts {pending} bytes pending for 1.25 MiB of data: {status}");
    a.sync("sparse").assert_success("tierfs sync");
    let status = a.fx.status();
    let uploaded = status["cold"]["uploaded_bytes"].as_u64().expect("uploaded_bytes");
    // Four chunks hold data; their blocks are sparse: the zeros around the data are not stored.
    // The chunks at 0 and at 300 GiB hold the same bytes (dedup): 1 MiB goes to the store.
    let data = 5 * MIB / 4;
    assert!(
        (MIB..MIB + 64 * 1024).contains(&uploaded),
        "{uploaded} bytes uploaded for 1.25 MiB of data in 4 chunks: {status}"
    );
    let resident = status["cold"]["resident_bytes"].as_u64().expect("resident_bytes");
    assert!(
        (data..data + 64 * 1024).contains(&resident),
        "status counts {resident} bytes cached for 1.25 MiB of data in 4 chunks: {status}"
    );
    assert_alive_and_small(a.fx.daemon_pid.expect("daemon"), "after the sync");
    a.fx.umount();
    a.wipe_local_state();

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let m = fs::metadata(b.fx.p("disk.img")).expect("stat");
    assert_eq!(m.len(), TIB);
    // The data of the four chunks; the rest of the terabyte is a hole.
    assert!(m.blocks() * 512 <= data + 64 * 1024, "the restored file allocates {} bytes", m.blocks() * 512);
    let f = fs::File::open(b.fx.p("disk.img")).expect("open");
    let mut got = vec![0u8; (MIB / 2) as usize];
    f.read_exact_at(&mut got, 600 << 30).expect("read");
    assert!(got == block[..(MIB / 2) as usize], "data in the middle of the hole differs");
    f.read_exact_at(&mut got, TIB - MIB).expect("read");
    assert!(got[..(MIB / 4) as usize] == block[..(MIB / 4) as usize], "data near the end differs");
    assert!(got[(MIB / 4) as usize..].iter().all(|&b| b == 0), "the hole after the data is not zeros");
    let mut head = vec![0u8; MIB as usize];
    f.read_exact_at(&mut head, 0).expect("read");
    assert!(head[..(MIB / 4) as usize] == block[..(MIB / 4) as usize], "data at the start differs");
    assert!(head[(MIB / 4) as usize..].iter().all(|&b| b == 0), "the hole after the first data is not zeros");
    drop(f);
    // Read back (streamed: the file is larger than half the cache), nothing counts its zeros.
    let status = b.fx.status();
    let resident = status["cold"]["resident_bytes"].as_u64().expect("resident_bytes");
    assert!(
        resident <= data + 64 * 1024,
        "status counts {resident} bytes cached after reading 1.25 MiB of data back: {status}"
    );
    let fetched = status["cold"]["fetched_bytes"].as_u64().expect("fetched_bytes");
    assert!(fetched >= data / 2, "the reads fetched only {fetched} bytes: {status}");
    b.fx.umount();
}

#[test]
fn a_file_four_times_the_cache_round_trips_within_the_memory_budget() {
    // 72 MiB for work in flight (one upload, one fetcher, a few streamed blocks), a 64 MiB
    // cache, a 256 MiB file: the file is uploaded, evicted and streamed back, and the
    // daemon's peak memory stays far below the file (a generous ceiling: the binary, RocksDB
    // and the budget).
    const FILE: u64 = 256 * MIB;
    let mut node = Node::init_file();
    node.mount(&["--cache-size", "64M", "--memory-budget", "72M"]);
    let pid = node.fx.daemon_pid.expect("daemon");
    let path = node.fx.p("big.bin");
    let piece = |i: u64| -> Vec<u8> { (0..MIB).map(|j| ((i * 7 + j / 4096) % 251) as u8 + 1).collect() };
    let f = fs::File::create(&path).expect("create");
    for i in 0..FILE / MIB {
        f.write_all_at(&piece(i), i * MIB).expect("write");
    }
    f.sync_all().expect("fsync");
    drop(f);
    node.sync("budget").assert_success("tierfs sync");
    let f = fs::File::open(&path).expect("open");
    // The kernel may still cache the written pages: drop them, so the reads reach tierfs.
    // SAFETY: fadvise on a descriptor this test owns.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let mut got = vec![0u8; MIB as usize];
    for i in 0..FILE / MIB {
        f.read_exact_at(&mut got, i * MIB).expect("read");
        assert!(got == piece(i), "MiB {i} differs after the round trip");
    }
    drop(f);
    let status = node.fx.status();
    let fetched = status["cold"]["fetched_bytes"].as_u64().unwrap_or(0);
    assert!(fetched >= FILE / 2, "only {fetched} bytes came back from the store: the test proves little: {status}");
    let peak = proc_memory(pid, "VmHWM");
    eprintln!("peak RSS {} MiB, {fetched} bytes fetched back", peak / MIB);
    assert!(peak < 200 * MIB, "the daemon peaked at {} MiB for a 72 MiB budget", peak / MIB);
    node.fx.umount();
}

/// An offset or length from the places where limits are: small, chunk edges, a terabyte, the
/// largest file size and 2^63.
fn extreme(rng: &mut Rng) -> u64 {
    let chunk = 4 * MIB;
    match rng.range(0, 6) {
        0 => rng.range(0, 20_000),
        1 => (rng.range(0, 4) * chunk + rng.range(0, 8)).saturating_sub(4),
        2 => TIB + rng.range(0, 64),
        3 => MAX_FILE_SIZE - rng.range(0, 80) + 16,
        4 => i64::MAX as u64 - rng.range(0, 100),
        _ => rng.range(0, 64) * chunk + rng.range(0, 4096),
    }
}

/// Random writes, truncates, punches and reads with extreme arguments against a model of
/// the file (its size and its non-zero bytes): every outcome and every byte read must agree,
/// and the daemon must be alive and small at the end. Seeded (`TIERFS_TEST_SEED` replays).
fn fuzz(root: &Path, pid: u32, seed: u64, ops: usize) {
    let mut rng = Rng::new(seed);
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(root.join("fuzz"))
        .expect("create");
    let mut size = 0u64;
    let mut bytes: BTreeMap<u64, u8> = BTreeMap::new();
    for step in 0..ops {
        let what = format!("seed {seed} step {step}");
        match rng.range(0, 4) {
            0 => {
                let off = extreme(&mut rng);
                let data: Vec<u8> = (0..rng.range(1, 65)).map(|_| rng.range(1, 256) as u8).collect();
                let r = f.write_at(&data, off);
                if off >= MAX_FILE_SIZE {
                    let e = errno_of(r, &format!("{what}: write of {} bytes at {off}", data.len()));
                    assert!(e == libc::EFBIG || e == libc::EINVAL, "{what}: write at {off}: errno {e}");
                } else {
                    // A write across the limit is cut short there, as on ext4.
                    let n = data.len().min((MAX_FILE_SIZE - off) as usize);
                    assert_eq!(
                        r.unwrap_or_else(|e| panic!("{what}: write at {off}: {e}")),
                        n,
                        "{what}: write at {off}"
                    );
                    for (i, b) in data[..n].iter().enumerate() {
                        bytes.insert(off + i as u64, *b);
                    }
                    size = size.max(off + n as u64);
                }
            }
            1 => {
                let to = if rng.chance(1, 2) { extreme(&mut rng) } else { rng.range(0, size + 1) };
                let r = f.set_len(to);
                if to > MAX_FILE_SIZE {
                    assert_eq!(errno_of(r, &what), libc::EFBIG, "{what}: truncate to {to}");
                } else {
                    r.unwrap_or_else(|e| panic!("{what}: truncate to {to}: {e}"));
                    bytes.retain(|&o, _| o < to);
                    size = to;
                }
            }
            2 => {
                let off = extreme(&mut rng);
                let len = if rng.chance(1, 2) { extreme(&mut rng).max(1) } else { rng.range(1, 9000) };
                let r = fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, len);
                match off.checked_add(len).filter(|&end| end <= i64::MAX as u64) {
                    Some(end) if end <= MAX_FILE_SIZE => {
                        assert_eq!(r, Ok(()), "{what}: punch {off}+{len}");
                        let gone: Vec<u64> = bytes.range(off..end).map(|(&o, _)| o).collect();
                        for o in gone {
                            bytes.remove(&o);
                        }
                    }
                    _ => assert!(matches!(r, Err(libc::EFBIG | libc::EINVAL)), "{what}: punch {off}+{len}: {r:?}"),
                }
            }
            _ => {
                let off = if rng.chance(1, 2) { extreme(&mut rng) } else { rng.range(0, size + 1) };
                let mut buf = vec![0xeeu8; rng.range(1, 65) as usize];
                let n = match f.read_at(&mut buf, off) {
                    // The kernel refuses a range whose end passes 2^63.
                    Err(e) if off + buf.len() as u64 > i64::MAX as u64 => {
                        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{what}: read at {off}: {e}");
                        continue;
                    }
                    r => r.unwrap_or_else(|e| panic!("{what}: read at {off}: {e}")),
                };
                let want = size.saturating_sub(off).min(buf.len() as u64) as usize;
                assert_eq!(n, want, "{what}: read at {off} of a {size}-byte file");
                for (i, b) in buf[..n].iter().enumerate() {
                    let o = off + i as u64;
                    assert_eq!(*b, bytes.get(&o).copied().unwrap_or(0), "{what}: byte {o}");
                }
            }
        }
        assert_eq!(f.metadata().expect("stat").len(), size, "{what}: size");
    }
    assert_alive_and_small(pid, &format!("after {ops} extreme operations (seed {seed})"));
}

#[test]
fn random_extreme_calls_agree_with_a_model_and_leave_the_daemon_alive() {
    let seed = Rng::seed_from_env();
    let mut node = Node::init_file();
    node.mount(&["--cache-size", "16M", "--dirty-age", "0"]);
    let pid = node.fx.daemon_pid.expect("daemon");
    for round in 0..3 {
        fuzz(&node.fx.mountpoint, pid, seed.wrapping_add(round), 400);
    }
    node.fx.umount();
    let hot = Fixture::mounted();
    fuzz(&hot.mountpoint, hot.daemon_pid.expect("daemon"), seed, 400);
}

/// Names of 255 bytes, paths near 4096, a tree 1000 levels deep, xattr values of 64 KiB and
/// 1000 xattrs on one file: each works up to the Linux limit and is a clean error past it.
fn linux_limits(root: &Path, pid: u32) {
    let long = "n".repeat(255);
    fs::write(root.join(&long), b"x").expect("a 255-byte name");
    assert_eq!(fs::read(root.join(&long)).expect("read"), b"x");
    common::assert_io_errno(fs::write(root.join("n".repeat(256)), b"x"), libc::ENAMETOOLONG, "a 256-byte name");
    // 1000 levels of "d/" (2000 bytes of path), written and read at the bottom, then removed.
    let deep: std::path::PathBuf = (0..1000).map(|_| "d").collect();
    fs::create_dir_all(root.join(&deep)).expect("mkdir -p 1000 levels");
    fs::write(root.join(&deep).join("leaf"), b"bottom").expect("write at the bottom");
    assert_eq!(fs::read(root.join(&deep).join("leaf")).expect("read"), b"bottom");
    // A path past PATH_MAX.
    let too_long: std::path::PathBuf = (0..20).map(|_| "p".repeat(250)).collect();
    common::assert_io_errno(fs::create_dir_all(root.join(too_long)), libc::ENAMETOOLONG, "a path of 5000 bytes");
    fs::remove_dir_all(root.join("d")).expect("rm -rf 1000 levels");
    // xattrs: a 64 KiB value, one byte more, and 1000 names on one file.
    let f = root.join("xattrs");
    fs::write(&f, b"").expect("create");
    let value = vec![7u8; 65536];
    assert_eq!(common::setxattr(&f, "user.big", &value, 0), 0, "64 KiB xattr: errno {}", common::errno());
    assert_eq!(common::getxattr(&f, "user.big").expect("getxattr"), value);
    let rc = common::setxattr(&f, "user.bigger", &vec![7u8; 65537], 0);
    assert!(rc == -1 && matches!(common::errno(), libc::E2BIG | libc::ERANGE), "a 64 KiB + 1 xattr: rc {rc}");
    for i in 0..1000 {
        assert_eq!(common::setxattr(&f, &format!("user.k{i}"), b"v", 0), 0, "xattr {i}: errno {}", common::errno());
    }
    let c = common::cpath(&f);
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let n = unsafe { libc::listxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n > 0, "listxattr: {}", std::io::Error::last_os_error());
    let listed = names[..n as usize].split(|&b| b == 0).filter(|s| s.starts_with(b"user.k")).count();
    assert_eq!(listed, 1000, "listxattr of 1000 names");
    assert_alive_and_small(pid, "after the Linux limits");
}

#[test]
fn linux_limits_are_reached_and_refused_cleanly_with_and_without_a_store() {
    let mut node = Node::init_file();
    node.mount(&[]);
    linux_limits(&node.fx.mountpoint, node.fx.daemon_pid.expect("daemon"));
    node.fx.umount();
    let hot = Fixture::mounted();
    linux_limits(&hot.mountpoint, hot.daemon_pid.expect("daemon"));
}
