//! A full disk under the data directory: writes fail with ENOSPC (never EIO), the metadata
//! keeps working so space can be freed through the mount, nothing acknowledged is lost, and
//! the mount recovers by itself once space is back, including after something else filled
//! the disk to the last byte.
//!
//! The data directory lives on its own small tmpfs (mounted here; the tests run as root), so
//! "full" is reached in a second and never touches the machine's real disk.

mod common;

use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Fixture, getxattr, setxattr, write_synced};

/// A fixture whose data directory is a tmpfs of `size`; dropping it unmounts tierfs first,
/// then the tmpfs.
struct OnSmallDisk {
    fx: Option<Fixture>,
    disk: PathBuf,
}

impl OnSmallDisk {
    fn new(size: &str, mount_args: &[&str]) -> OnSmallDisk {
        let mut this = OnSmallDisk::unmounted(size);
        this.mount(mount_args);
        this
    }

    /// The tmpfs is mounted, tierfs not yet.
    fn unmounted(size: &str) -> OnSmallDisk {
        let fx = Fixture::new();
        let disk = fx.data_dir.clone();
        fs::create_dir_all(&disk).expect("creating the data dir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tierfs-test-disk"])
            .arg(&disk)
            .output()
            .expect("running mount");
        assert!(out.status.success(), "mounting a tmpfs: {}", String::from_utf8_lossy(&out.stderr));
        OnSmallDisk { fx: Some(fx), disk }
    }

    fn mount(&mut self, args: &[&str]) {
        self.fx().mount_args = args.iter().map(|a| (*a).to_owned()).collect();
        self.fx().mount();
    }

    fn fx(&mut self) -> &mut Fixture {
        self.fx.as_mut().expect("fixture")
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.fx.as_ref().expect("fixture").p(rel)
    }
}

impl Drop for OnSmallDisk {
    fn drop(&mut self) {
        drop(self.fx.take());
        let _ = Command::new("umount").arg("-l").arg(&self.disk).status();
    }
}

/// Appends 1 MiB blocks to `path` until a write fails; returns the error and the bytes
/// written. Panics if `limit` bytes go in without an error.
fn fill(path: &Path, limit: u64) -> (std::io::Error, u64) {
    let mut f = File::create(path).expect("creating the filler");
    let block = vec![0xa5u8; 1 << 20];
    let mut written = 0u64;
    while written < limit {
        if let Err(e) = f.write_all(&block).and_then(|()| f.sync_data()) {
            return (e, written);
        }
        written += block.len() as u64;
    }
    panic!("{} took {written} bytes without an error", path.display());
}

fn statvfs_avail(path: &Path) -> u64 {
    let c = common::cpath(path);
    // SAFETY: zeroed statvfs is valid plain data; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers, see above.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    st.f_bavail * st.f_frsize
}

#[test]
fn writes_stop_at_the_reserve_with_enospc_and_the_metadata_keeps_working() {
    let mut w = OnSmallDisk::new("384m", &["--reserve", "128M"]);
    let keep = b"acknowledged before the disk filled up\n";
    write_synced(&w.p("keep"), keep);

    let (err, written) = fill(&w.p("big"), 384 << 20);
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "a full disk is ENOSPC, not {err}");
    assert!(written > 64 << 20, "only {written} bytes went in before ENOSPC");
    let disk_free = statvfs_avail(&w.disk);
    assert!(disk_free >= 120 << 20, "the reserve was eaten: {disk_free} bytes left on the data disk");
    let avail = statvfs_avail(&w.p(""));
    assert!(avail < 16 << 20, "statfs of the mount still offers {avail} bytes");
    let status = w.fx().status();
    assert_eq!(status["reserve"].as_u64(), Some(128 << 20), "{status}");
    let free = status["disk_free"].as_u64().unwrap_or_else(|| panic!("no disk_free in {status}"));
    assert!((120 << 20..(128 + 16) << 20).contains(&free), "status: {free} bytes free at the reserve");

    // Full for data, not for metadata: everything that frees space or only renames works.
    fs::create_dir(w.p("dir")).expect("mkdir on a full disk");
    File::create(w.p("dir/empty")).expect("creating an empty file on a full disk");
    fs::rename(w.p("keep"), w.p("dir/keep")).expect("rename on a full disk");
    fs::hard_link(w.p("dir/keep"), w.p("keep-link")).expect("link on a full disk");
    fs::remove_file(w.p("keep-link")).expect("unlink on a full disk");
    let big = File::options().write(true).open(w.p("big")).expect("open big");
    big.set_len(8 << 20).expect("truncating on a full disk frees space");
    drop(big);

    // Space is back: writes work again.
    let mut f = File::create(w.p("after")).expect("create after");
    f.write_all(&vec![7u8; 4 << 20]).expect("writing once space is back");
    f.sync_all().expect("fsync after");
    drop(f);

    let log = fs::read_to_string(w.disk.join("daemon.log")).expect("daemon log");
    assert!(
        log.lines().any(|l| l.contains("WARN") && l.contains("no space left") && l.contains("reserve")),
        "the daemon log says nothing about the full disk:\n{log}"
    );

    w.fx().remount();
    assert_eq!(fs::read(w.p("dir/keep")).expect("keep after remount"), keep);
    assert!(w.p("dir/empty").exists());
    assert!(!w.p("keep-link").exists());
    assert_eq!(fs::metadata(w.p("big")).expect("big").len(), 8 << 20);
    assert_eq!(fs::read(w.p("after")).expect("after"), vec![7u8; 4 << 20]);
}

#[test]
fn a_disk_filled_by_another_program_fails_metadata_with_enospc_and_recovers_when_freed() {
    let mut w = OnSmallDisk::new("384m", &["--reserve", "128M"]);
    fs::write(w.p("before"), b"before").expect("write before");

    // Someone else takes every byte (tmpfs: the filler's own writes end with ENOSPC).
    let (err, _) = fill(&w.disk.join("filler"), 1 << 30);
    assert_eq!(err.kind(), ErrorKind::StorageFull, "filling the tmpfs: {err}");

    // The metadata store's log (preallocated ahead) runs out of room after some tens of
    // MiB: large xattrs get there in about a thousand operations. Then ENOSPC, never EIO.
    fs::write(w.p("x"), b"").expect("create x");
    let value = vec![b'v'; 60_000];
    let mut made = Vec::new();
    let mut failure = None;
    for i in 0..5_000 {
        if setxattr(&w.p("x"), &format!("user.k{i}"), &value, 0) == 0 {
            made.push(i);
        } else {
            failure = Some(std::io::Error::last_os_error());
            break;
        }
    }
    let failure = failure.expect("5000 xattrs of 60 kB on a full disk all succeeded");
    assert_eq!(failure.raw_os_error(), Some(libc::ENOSPC), "metadata on a full disk: {failure}");

    // Freed outside the mount: the mount recovers by itself (RocksDB resumes once it sees
    // 64 MiB free; it looks every few seconds).
    fs::remove_file(w.disk.join("filler")).expect("removing the filler");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match fs::create_dir(w.p("after")) {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "while recovering: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the mount did not recover within 60 s of freeing the disk: {e}"),
        }
    }
    fs::write(w.p("after/file"), b"after").expect("writing after recovery");

    w.fx().remount();
    assert_eq!(fs::read(w.p("before")).expect("before"), b"before");
    for i in &made {
        let got =
            getxattr(&w.p("x"), &format!("user.k{i}")).unwrap_or_else(|e| panic!("xattr {i} acknowledged, now {e}"));
        assert!(got == value, "xattr {i} changed");
    }
    assert_eq!(fs::read(w.p("after/file")).expect("after/file"), b"after");
}

#[test]
fn with_a_store_a_disk_smaller_than_the_data_is_made_room_for_by_eviction() {
    let mut w = OnSmallDisk::unmounted("256m");
    let tmp = w.fx().tmp.path().to_path_buf();
    let store = tmp.join("store.toml");
    let mut init = w.fx().tierfs();
    init.args(["init", "--store"]).arg(&store).arg("--key-file").arg(tmp.join("store.key"));
    init.arg("--backend").arg(format!("file://{}", tmp.join("objects").display()));
    common::run(&mut init, Duration::from_secs(60)).assert_success("tierfs init");
    let store = store.to_str().expect("utf-8 path").to_owned();
    // No --dirty-limit: dirty data may fill the disk, and writers wait for the uploads.
    w.mount(&["--store", &store, "--reserve", "64M"]);

    // Twice the size of the whole disk, through a cache that has to make room as it goes.
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let total = 512u64 << 20;
    let mut f = File::create(w.p("big")).expect("create big");
    for i in 0..total >> 20 {
        let mut b = block.clone();
        b[..8].copy_from_slice(&i.to_le_bytes());
        f.write_all(&b).unwrap_or_else(|e| panic!("write at {i} MiB on a 256 MiB disk with a store: {e}"));
    }
    f.sync_all().expect("fsync big");
    drop(f);
    let free = statvfs_avail(&w.disk);
    assert!(free >= 60 << 20, "the reserve was eaten: {free} bytes free on the data disk");

    w.fx().remount();
    let got = fs::read(w.p("big")).expect("read big back");
    assert_eq!(got.len() as u64, total);
    for (i, chunk) in got.chunks(1 << 20).enumerate() {
        assert_eq!(&chunk[..8], &(i as u64).to_le_bytes(), "MiB {i} of big");
        assert!(chunk[8..] == block[8..], "MiB {i} of big differs");
    }
}

/// The mount removes a deleted file's data file after it has answered the unlink (on a thread
/// of its own), so a program that deletes files to make room and writes right away must still
/// get that room: the write waits for the pending removals instead of failing. (On this
/// tmpfs the removals keep up with the unlinks, so this also passes with that wait switched
/// off; it holds the guarantee, the wait covers a removal thread that falls behind.)
#[test]
fn the_room_deletes_make_is_there_for_the_very_next_write() {
    let mut w = OnSmallDisk::new("384m", &["--reserve", "128M"]);
    fs::create_dir(w.p("d")).expect("mkdir");
    for round in 0..3 {
        let block = vec![0x5au8; 256 << 10];
        let mut files = Vec::new();
        loop {
            let path = w.p(&format!("d/f{}", files.len()));
            let done = File::create(&path).and_then(|mut f| f.write_all(&block).and_then(|()| f.sync_data()));
            files.push(path);
            match done {
                Ok(()) => assert!(files.len() < 2000, "round {round}: 500 MiB went in without ENOSPC"),
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("round {round}: filling: {e}"),
            }
        }
        let freed = (files.len() as u64 - 1) * block.len() as u64;
        assert!(freed > 64 << 20, "round {round}: only {freed} bytes went in before ENOSPC");
        for path in &files {
            fs::remove_file(path).expect("unlink on a full disk");
        }
        // Half of what the deletes freed, written at once.
        let half = vec![round as u8; (freed / 2) as usize];
        let mut f = File::create(w.p("next")).expect("create right after the deletes");
        f.write_all(&half)
            .and_then(|()| f.sync_data())
            .unwrap_or_else(|e| panic!("round {round}: writing {} bytes right after freeing {freed}: {e}", half.len()));
        drop(f);
        assert_eq!(fs::read(w.p("next")).expect("read back").len(), half.len());
        fs::remove_file(w.p("next")).expect("unlink next");
    }
    w.fx().remount();
    assert!(!w.p("next").exists() && fs::read_dir(w.p("d")).expect("readdir").next().is_none());
}
