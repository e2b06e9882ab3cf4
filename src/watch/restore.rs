//! Restoring a workspace into an empty watched directory (a fresh node): every entry is
//! written from the workspace, its data fetched from the store chunk by chunk and holes left
//! as holes (whole chunks without a record, and zero pages inside a chunk), then mode, owner, times and user xattrs are set (a directory's times after its
//! entries). Hard links of the workspace become hard links.
//!
//! Invariants: only the data chunks are fetched (a hole is never read); the mirror learns every
//! entry written, so the first pass after it reads nothing again.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use super::{Counts, Known, LocalId, Mirror, Result, WatchError};
use crate::block::CHUNK_SIZE;

/// The unit a restored file is written in: an all-zero page is left a hole.
const PAGE: usize = 4096;
use crate::types::{Attr, FileKind, Ino, ROOT_INO, Timestamp};
use crate::vfs::Caller;

impl Mirror {
    pub(super) fn restore(&mut self) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut links: HashMap<Ino, std::path::PathBuf> = HashMap::new();
        let root = self.root.clone();
        self.restore_dir(ROOT_INO, &root, &mut links, &mut counts)?;
        Ok(counts)
    }

    fn restore_dir(
        &mut self,
        dir: Ino,
        path: &Path,
        links: &mut HashMap<Ino, std::path::PathBuf>,
        counts: &mut Counts,
    ) -> Result<()> {
        let entries =
            self.vfs.meta().list_dir(dir).map_err(|e| WatchError::Vfs { path: path.into(), source: e.into() })?;
        for (name, ino, kind) in entries {
            let p = path.join(OsStr::from_bytes(&name));
            let attr = self.vfs.getattr(ino).map_err(WatchError::vfs(&p))?;
            if kind != FileKind::Dir {
                if let Some(first) = links.get(&ino) {
                    std::fs::hard_link(first, &p).map_err(WatchError::io("link", &p))?;
                    counts.linked += 1;
                    self.learn(&p, ino, dir, &name)?;
                    continue;
                }
                if attr.nlink > 1 {
                    links.insert(ino, p.clone());
                }
            }
            match kind {
                FileKind::Dir => {
                    std::fs::create_dir(&p).map_err(WatchError::io("mkdir", &p))?;
                    self.restore_dir(ino, &p, links, counts)?;
                }
                FileKind::File => self.restore_file(ino, &attr, &p, counts)?,
                FileKind::Symlink => {
                    let target = self.vfs.readlink(ino).map_err(WatchError::vfs(&p))?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &p)
                        .map_err(WatchError::io("symlink", &p))?;
                }
                _ => {
                    let c = cstr(&p)?;
                    // SAFETY: `c` is a valid C string for the call.
                    if unsafe { libc::mknod(c.as_ptr(), kind.mode_bits() | u32::from(attr.perm), u64::from(attr.rdev)) }
                        != 0
                    {
                        return Err(WatchError::Io { op: "mknod", path: p, source: std::io::Error::last_os_error() });
                    }
                }
            }
            counts.created += 1;
            self.restore_xattrs(ino, &p)?;
            set_owner_mode_times(&p, &attr)?;
            self.learn(&p, ino, dir, &name)?;
        }
        Ok(())
    }

    fn restore_file(&mut self, ino: Ino, attr: &Attr, p: &Path, counts: &mut Counts) -> Result<()> {
        let file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(p).map_err(WatchError::io("create", p))?;
        let fh = self.vfs.open(&Caller::ROOT, ino, libc::O_RDONLY).map_err(WatchError::vfs(p))?;
        let result = (|| {
            for (idx, rec) in self.vfs.chunk_records(ino) {
                let at = idx * CHUNK_SIZE;
                if at >= attr.size {
                    break;
                }
                let len = u64::from(rec.len).min(attr.size - at);
                let data = self.vfs.read_bytes(ino, fh, at, len as u32).map_err(WatchError::vfs(p))?;
                // Zero pages inside a chunk stay holes too (the store keeps whole chunks).
                for (i, page) in data.chunks(PAGE).enumerate() {
                    if page.iter().any(|&b| b != 0) {
                        file.write_all_at(page, at + (i * PAGE) as u64).map_err(WatchError::io("write", p))?;
                    }
                }
                counts.bytes_read += data.len() as u64;
            }
            file.set_len(attr.size).map_err(WatchError::io("truncate", p))
        })();
        let _ = self.vfs.release(ino, fh);
        result?;
        counts.files_read += 1;
        Ok(())
    }

    fn restore_xattrs(&self, ino: Ino, p: &Path) -> Result<()> {
        let names =
            self.vfs.meta().xattr_names(ino).map_err(|e| WatchError::Vfs { path: p.into(), source: e.into() })?;
        for name in names {
            let Some(value) =
                self.vfs.meta().xattr(ino, &name).map_err(|e| WatchError::Vfs { path: p.into(), source: e.into() })?
            else {
                continue;
            };
            let (c, n) = (
                cstr(p)?,
                CString::new(name).map_err(|e| WatchError::Io {
                    op: "setxattr",
                    path: p.into(),
                    source: std::io::Error::other(e),
                })?,
            );
            // SAFETY: valid C strings and a buffer of `value.len()` bytes.
            let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
            if r != 0 {
                return Err(WatchError::Io { op: "setxattr", path: p.into(), source: std::io::Error::last_os_error() });
            }
        }
        Ok(())
    }

    /// Remembers a restored entry, and gives it the workspace's times back once its own
    /// entries are done.
    fn learn(&mut self, p: &Path, ino: Ino, parent: Ino, name: &[u8]) -> Result<()> {
        let md = std::fs::symlink_metadata(p).map_err(WatchError::io("stat", p))?;
        let ctime = (md.ctime(), md.ctime_nsec());
        self.known.insert(LocalId { dev: md.dev(), ino: md.ino() }, Known { ino, parent, name: name.to_vec(), ctime });
        Ok(())
    }
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| WatchError::Io {
        op: "name",
        path: p.into(),
        source: std::io::Error::other(e),
    })
}

fn timespec(t: Timestamp) -> libc::timespec {
    libc::timespec { tv_sec: t.secs, tv_nsec: i64::from(t.nanos) }
}

/// Owner (when allowed), mode (not of a symlink) and times of `p` from `attr`.
fn set_owner_mode_times(p: &Path, attr: &Attr) -> Result<()> {
    let c = cstr(p)?;
    // SAFETY: valid C string; fchownat/fchmodat/utimensat read only it and `times`.
    unsafe {
        // Only root may give files away; others keep their own uid.
        let _ = libc::fchownat(libc::AT_FDCWD, c.as_ptr(), attr.uid, attr.gid, libc::AT_SYMLINK_NOFOLLOW);
        if attr.kind != FileKind::Symlink && libc::chmod(c.as_ptr(), u32::from(attr.perm)) != 0 {
            return Err(WatchError::Io { op: "chmod", path: p.into(), source: std::io::Error::last_os_error() });
        }
        let times = [timespec(attr.atime), timespec(attr.mtime)];
        if libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return Err(WatchError::Io { op: "set times of", path: p.into(), source: std::io::Error::last_os_error() });
        }
    }
    Ok(())
}
