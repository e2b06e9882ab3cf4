//! Every access watch mode makes to the watched directory, confined to it. A watched directory
//! belongs to its user, who may swap any directory of it for a symlink at any moment, while
//! the watcher may run as root (the node daemon): a path looked up by name would then lead
//! the watcher out of the tree, and what it read there into a workspace the user can read.
//!
//! So every path is resolved from a descriptor of the watched directory, taken once, with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`: no component, the
//! last included, may be a symlink, `..` may not climb out, and an absolute path is refused.
//! A symlink is looked at as itself (`O_PATH | O_NOFOLLOW`), never through. A name that would
//! leave the tree fails with `ELOOP` or `EXDEV`, which callers treat like a name that went
//! away meanwhile: a later pass sees the tree as it is then.
//!
//! A descriptor from `openat2` names one inode whatever happens to the names after it, so
//! listings (through the descriptor's `/proc/self/fd` entry, which names that inode exactly)
//! and extended attributes are read from what was checked, not from what a name means later.

use std::fs::{File, Metadata, ReadDir};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use crate::export::{CONFINED, fd_path};

/// A descriptor of the watched directory, from which every path of it is resolved.
#[derive(Debug)]
pub(super) struct Beneath {
    root: OwnedFd,
}

impl Beneath {
    /// Opens the watched directory `dir` (already resolved by the caller).
    pub fn open(dir: &Path) -> io::Result<Beneath> {
        let root = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Beneath { root })
    }

    /// `rel` (relative to the watched directory; empty: the directory itself) opened with
    /// `flags`, confined.
    fn at(&self, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
        self.at_mode(rel, flags, Mode::empty())
    }

    /// [`Beneath::at`] with the `mode` of a file it makes.
    fn at_mode(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        Ok(rustix::fs::openat2(&self.root, rel, flags | OFlags::CLOEXEC, mode, CONFINED)?)
    }

    /// The entry at `rel` itself (a symlink as a symlink).
    pub fn lstat(&self, rel: &Path) -> io::Result<Metadata> {
        File::from(self.at(rel, OFlags::PATH | OFlags::NOFOLLOW)?).metadata()
    }

    /// The entries of the directory at `rel`; each entry's `metadata()` is its own (`lstat`
    /// beside the listing's descriptor).
    pub fn read_dir(&self, rel: &Path) -> io::Result<ReadDir> {
        let fd = self.at(rel, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW)?;
        std::fs::read_dir(fd_path(&fd))
    }

    /// The file at `rel`, for reading: never through a symlink, and never blocking on a fifo
    /// that replaced it.
    pub fn open_read(&self, rel: &Path) -> io::Result<File> {
        Ok(File::from(self.at(rel, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK)?))
    }

    /// An unnamed file (`O_TMPFILE`, gone when closed) in the directory at `rel`, private to
    /// this process's user.
    pub fn tmpfile_in(&self, rel: &Path) -> io::Result<File> {
        let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::NOFOLLOW;
        Ok(File::from(self.at_mode(rel, flags, Mode::from_raw_mode(0o600))?))
    }

    /// The target of the symlink at `rel`.
    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let (parent, name) = split(rel)?;
        let dir = self.at(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW)?;
        let target = rustix::fs::readlinkat(&dir, name, Vec::new())?;
        Ok(PathBuf::from(std::ffi::OsString::from_vec(target.into_bytes())))
    }

    /// The `user.*` extended attributes of the entry at `rel` (none for a symlink).
    pub fn user_xattrs(&self, rel: &Path) -> io::Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
        let fd = self.at(rel, OFlags::PATH | OFlags::NOFOLLOW)?;
        let mut out = std::collections::BTreeMap::new();
        if rustix::fs::fstat(&fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok(out);
        }
        // The descriptor's /proc entry names the inode checked above, which is no symlink.
        let path = fd_path(&fd);
        let mut names = vec![0u8; 1024];
        let len = loop {
            match rustix::fs::listxattr(&path, &mut names) {
                Ok(n) => break n,
                Err(rustix::io::Errno::RANGE) => names.resize(names.len() * 4, 0),
                Err(rustix::io::Errno::NOTSUP) => return Ok(out),
                Err(e) => return Err(e.into()),
            }
        };
        for name in names[..len].split(|&b| b == 0).filter(|n| n.starts_with(b"user.")) {
            let name_c = std::ffi::CString::new(name).map_err(io::Error::other)?;
            // XATTR_SIZE_MAX.
            let mut value = vec![0u8; 65536];
            match rustix::fs::getxattr(&path, name_c.as_c_str(), &mut value) {
                Ok(n) => {
                    value.truncate(n);
                    out.insert(name.to_vec(), value);
                }
                Err(rustix::io::Errno::NODATA) => {} // removed meanwhile
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }
}

/// `rel`'s parent (empty for a top-level name) and its last name.
fn split(rel: &Path) -> io::Result<(&Path, &std::ffi::OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} names no entry", rel.display()))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn nothing_outside_the_tree_is_reached_through_a_symlink_or_dotdot() {
        let tmp = tempfile::tempdir().unwrap();
        let (tree, outside) = (tmp.path().join("tree"), tmp.path().join("outside"));
        std::fs::create_dir_all(tree.join("d")).unwrap();
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("sub/secret"), b"marker").unwrap();
        std::fs::write(tree.join("d/f"), b"inside").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("link")).unwrap();
        let b = Beneath::open(&tree).unwrap();

        assert_eq!(std::io::read_to_string(b.open_read(Path::new("d/f")).unwrap()).unwrap(), "inside");
        assert_eq!(b.read_dir(Path::new("d")).unwrap().count(), 1);
        assert!(b.lstat(Path::new("link")).unwrap().file_type().is_symlink(), "a symlink is seen as itself");
        assert_eq!(b.read_link(Path::new("link")).unwrap(), outside);
        for escape in ["link/sub", "link/sub/secret", "../outside/sub/secret", "d/../../outside/sub"] {
            let p = Path::new(escape);
            assert!(b.read_dir(p).is_err(), "listed {escape}");
            assert!(b.open_read(p).is_err(), "opened {escape}");
            assert!(b.lstat(p).is_err(), "looked at {escape}");
            assert!(b.user_xattrs(p).is_err(), "read the xattrs of {escape}");
        }
        assert!(b.open_read(Path::new("/etc/hostname")).is_err(), "an absolute path");
        assert!(b.open_read(Path::new("link")).is_err(), "a symlink is never opened through");
    }
}
