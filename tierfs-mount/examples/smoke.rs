#![allow(clippy::unwrap_used)]
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tierfs::vfs::{Vfs, VfsConfig};

fn exercise(mnt: &Path) {
    let f = mnt.join("a.txt");
    fs::write(&f, b"hello world").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello world");
    let mut h = fs::OpenOptions::new().read(true).write(true).open(&f).unwrap();
    h.seek(SeekFrom::Start(6)).unwrap();
    h.write_all(b"tierfs").unwrap();
    h.sync_all().unwrap();
    drop(h);
    let mut s = String::new();
    fs::File::open(&f).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello tierfs");
    // big write, > max_write
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(mnt.join("big"), &big).unwrap();
    assert_eq!(fs::read(mnt.join("big")).unwrap(), big);
    fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..300 {
        fs::write(mnt.join("d").join(format!("file-with-a-longish-name-{i:04}")), b"x").unwrap();
    }
    let mut names: Vec<_> = fs::read_dir(mnt.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names.len(), 300);
    fs::rename(mnt.join("a.txt"), mnt.join("d/b.txt")).unwrap();
    assert!(!f.exists());
    std::os::unix::fs::symlink("d/b.txt", mnt.join("ln")).unwrap();
    assert_eq!(fs::read_link(mnt.join("ln")).unwrap(), PathBuf::from("d/b.txt"));
    assert_eq!(fs::read_to_string(mnt.join("ln")).unwrap(), "hello tierfs");
    fs::hard_link(mnt.join("d/b.txt"), mnt.join("hl")).unwrap();
    assert_eq!(fs::metadata(mnt.join("hl")).unwrap().nlink(), 2);
    fs::set_permissions(mnt.join("hl"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(mnt.join("d/b.txt")).unwrap().mode() & 0o7777, 0o600);
    // xattr
    let p = std::ffi::CString::new(mnt.join("hl").as_os_str().as_encoded_bytes()).unwrap();
    let n = c"user.k";
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), b"vv".as_ptr().cast(), 2, 0) };
    assert_eq!(r, 0, "setxattr {}", std::io::Error::last_os_error());
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(len, 2);
    let mut buf = [0u8; 1];
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 1) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ERANGE)));
    let mut buf = [0u8; 16];
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..r as usize], b"user.k\0");
    // rename whiteout -> EINVAL
    let a = c"hl";
    let dfd = fs::File::open(mnt).unwrap();
    use std::os::fd::AsRawFd;
    let r = unsafe { libc::renameat2(dfd.as_raw_fd(), a.as_ptr(), dfd.as_raw_fd(), c"hl2".as_ptr(), libc::RENAME_WHITEOUT) };
    println!("whiteout rename: {r} {:?}", std::io::Error::last_os_error());
    let r = unsafe { libc::renameat2(dfd.as_raw_fd(), a.as_ptr(), dfd.as_raw_fd(), c"ln".as_ptr(), libc::RENAME_NOREPLACE) };
    assert_eq!((r, std::io::Error::last_os_error().raw_os_error()), (-1, Some(libc::EEXIST)));
    // flock is kernel-local
    let h = fs::File::open(mnt.join("hl")).unwrap();
    assert_eq!(unsafe { libc::flock(h.as_raw_fd(), libc::LOCK_EX) }, 0);
    // utimensat pre-epoch with nanos
    let ts = [libc::timespec { tv_sec: -2, tv_nsec: 800_000_000 }, libc::timespec { tv_sec: -2, tv_nsec: 800_000_000 }];
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), ts.as_ptr(), 0) }, 0);
    let m = fs::metadata(mnt.join("hl")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (-2, 800_000_000));
    // statfs
    let st = nix_statfs(mnt);
    println!("statfs bsize={} blocks={}", st.f_bsize, st.f_blocks);
    // copy_file_range
    let src = fs::File::open(mnt.join("big")).unwrap();
    let dst = fs::File::create(mnt.join("big2")).unwrap();
    let n = unsafe { libc::copy_file_range(src.as_raw_fd(), std::ptr::null_mut(), dst.as_raw_fd(), std::ptr::null_mut(), 5_000_000, 0) };
    println!("copy_file_range copied {n}");
    drop(dst);
    println!("mount line: {}", fs::read_to_string("/proc/self/mounts").unwrap().lines().find(|l| l.contains("tierfs")).unwrap_or("?"));
    println!("exercise ok");
}

fn nix_statfs(p: &Path) -> libc::statfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
    st
}

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap());
    let mode = std::env::args().nth(2).unwrap_or_default();
    let _ = fs::remove_dir_all(root.join("data"));
    fs::create_dir_all(root.join("data")).unwrap();
    fs::create_dir_all(root.join("mnt")).unwrap();
    let mut cfg = VfsConfig::new(root.join("data"));
    cfg.kernel_owns_times = true;
    let vfs = Arc::new(Vfs::new(cfg).unwrap());
    let mnt = root.join("mnt");
    let opts = tierfs_mount::MountOptions::default();
    match mode.as_str() {
        "session" => {
            let mut s = tierfs_mount::session(vfs.clone(), &mnt, &opts).unwrap();
            let mut u = s.unmount_callable();
            let m2 = mnt.clone();
            let t = std::thread::spawn(move || {
                exercise(&m2);
                std::thread::sleep(Duration::from_millis(200));
                u.unmount().unwrap();
                println!("unmounter.unmount returned");
            });
            s.run().unwrap();
            println!("run returned");
            t.join().unwrap();
        }
        "bg" => {
            let s = tierfs_mount::mount(vfs.clone(), &mnt, &opts).unwrap();
            exercise(&mnt);
            s.umount_and_join().unwrap();
            println!("umount_and_join returned");
        }
        "external" => {
            let s = tierfs_mount::mount(vfs.clone(), &mnt, &opts).unwrap();
            let st = std::process::Command::new("umount").arg(&mnt).status().unwrap();
            println!("external umount: {st}");
            s.join().unwrap();
            println!("join returned after external umount");
        }
        _ => panic!("mode"),
    }
    println!("stats after: {:?}", vfs.stats().inodes);
}
