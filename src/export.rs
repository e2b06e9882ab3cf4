//! Writing a workspace out as a plain directory tree: every entry of a [`Vfs`] is made under a
//! target directory, with file data fetched from the store chunk by chunk, then its xattrs,
//! mode, owner (as root) and times set (a directory's after its entries). Hard links of the
//! workspace become hard links. `tierfs restore` (a copy of a workspace or snapshot) and watch
//! mode's restore into an empty watched directory (a fresh node) both write through here.
//!
//! Invariants:
//! - cost follows what files hold: only chunks with a record are read, and all-zero pages
//!   inside them stay holes too, so a 1 TiB sparse file with 1 MiB of data reads 1 MiB. The
//!   [`Vfs`] must be one whose data is all in the store (a session just restored from it, read
//!   only or on an empty data dir), as every caller's is;
//! - a file is never silently short: a chunk that reads back shorter than its record is an
//!   error;
//! - the tree is a tree: a directory met a second time (a cycle, or a hard link to a
//!   directory, which only a damaged or hostile store holds) fails the export with
//!   `NotATree` before anything is written beneath it;
//! - nothing is overwritten: every entry is created new (`create_new`, `mkdir`, `mknod`), so a
//!   target that is not empty fails at the first name it already holds;
//! - directories are made owner-only first and get their own mode after their entries, so a
//!   read-only directory can still be filled.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::block::{self, CHUNK_SIZE};
use crate::types::{Attr, ErrorKind, FileKind, Ino, ROOT_INO, Timestamp};
use crate::vfs::{Caller, DirEntry, Vfs, VfsError};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{}: {source}", path.display())]
    Workspace {
        path: PathBuf,
        #[source]
        source: VfsError,
    },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: read {got} of {want} bytes at offset {offset} from the store", path.display())]
    ShortRead { path: PathBuf, offset: u64, want: u64, got: u64 },
    /// The workspace's tree is not a tree (a directory entered twice: a cycle, or a hard link
    /// to a directory), which only a damaged or hostile store makes.
    #[error("{}: {reason}", path.display())]
    NotATree { path: PathBuf, reason: String },
}

impl ExportError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExportError::Workspace { source, .. } => source.kind(),
            ExportError::Io { source, .. } => crate::types::io_error_kind(source),
            ExportError::ShortRead { .. } | ExportError::NotATree { .. } => ErrorKind::Corrupt,
        }
    }

    /// The mapper of a failed `op` on `path`, for `map_err`.
    pub fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ExportError + 'a {
        move |source| ExportError::Io { op, path: path.to_path_buf(), source }
    }

    fn workspace(path: &Path) -> impl FnOnce(VfsError) -> ExportError + '_ {
        move |source| ExportError::Workspace { path: path.to_path_buf(), source }
    }
}

pub type Result<T, E = ExportError> = std::result::Result<T, E>;

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Written {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Names made as hard links of an entry written before.
    pub hard_links: u64,
    /// Fifos, sockets and device nodes.
    pub other: u64,
    /// File data read from the workspace (the data chunks, not the holes).
    pub bytes: u64,
    /// What was not restored because the export was not privileged.
    pub left_out: LeftOut,
}

/// Attributes that give rights, left out of an export that is not privileged (as tar leaves
/// them out without `--same-owner`): a store's word alone never makes a setuid-root file, a
/// device node or a file capability.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    /// Entries whose owner (uid and gid) was not applied: they belong to the writer.
    pub owners: u64,
    /// Files and directories whose setuid or setgid bit was dropped.
    pub setid_bits: u64,
    /// Block and character devices not made.
    pub devices: u64,
    /// `security.*` and `trusted.*` extended attributes (file capabilities among them) not set.
    pub xattrs: u64,
}

impl LeftOut {
    pub fn is_empty(&self) -> bool {
        *self == LeftOut::default()
    }
}

/// Told of each entry once it is written in full (attributes set; a directory after all its
/// entries), and of progress inside big files.
pub trait Visitor {
    /// `path` is workspace entry `name` (inode `ino`) of directory `parent`.
    fn written(&mut self, _path: &Path, _ino: Ino, _parent: Ino, _name: &[u8]) -> Result<()> {
        Ok(())
    }

    /// Called between the chunks of a file and after each entry, with the totals so far.
    fn progress(&mut self, _written: &Written) {}
}

/// Writes every entry of `vfs` under `target`, an existing directory (the root's own
/// attributes are left to the caller: see [`set_attrs`]). `privileged` (root only, when asked):
/// owners, setuid/setgid bits, devices and `security.*`/`trusted.*` xattrs are restored as
/// the workspace has them; otherwise they are left out and counted ([`LeftOut`]).
pub fn write_tree(vfs: &Vfs, target: &Path, privileged: bool, visitor: &mut dyn Visitor) -> Result<Written> {
    let mut w = Writer {
        privileged,
        vfs,
        visitor,
        links: HashMap::new(),
        entered: HashSet::from([ROOT_INO]),
        written: Written::default(),
    };
    w.dir(ROOT_INO, target)?;
    Ok(w.written)
}

/// The entries of directory `dir`, without `.` and `..`.
pub fn entries(vfs: &Vfs, dir: Ino) -> Result<Vec<DirEntry>, VfsError> {
    let fh = vfs.opendir(dir)?;
    let mut out = Vec::new();
    let listed = loop {
        match vfs.readdir(dir, fh, out.len() as u64) {
            Ok(batch) if batch.is_empty() => break Ok(()),
            Ok(batch) => out.extend(batch),
            Err(e) => break Err(e),
        }
    };
    vfs.releasedir(dir, fh)?;
    listed?;
    out.retain(|e| e.name != b"." && e.name != b"..");
    Ok(out)
}

struct Writer<'a> {
    vfs: &'a Vfs,
    privileged: bool,
    visitor: &'a mut dyn Visitor,
    /// Inodes with several links: the first path written for each.
    links: HashMap<Ino, PathBuf>,
    /// Directories entered: one met again is refused, so a cycle never recurses.
    entered: HashSet<Ino>,
    written: Written,
}

impl Writer<'_> {
    fn dir(&mut self, dir: Ino, path: &Path) -> Result<()> {
        for e in entries(self.vfs, dir).map_err(ExportError::workspace(path))? {
            let p = path.join(OsStr::from_bytes(&e.name));
            let attr = self.vfs.getattr(e.ino).map_err(ExportError::workspace(&p))?;
            if attr.kind != FileKind::Dir && attr.nlink > 1 {
                if let Some(first) = self.links.get(&e.ino) {
                    std::fs::hard_link(first, &p).map_err(ExportError::io("link", &p))?;
                    self.written.hard_links += 1;
                    self.visitor.written(&p, e.ino, dir, &e.name)?;
                    continue;
                }
                self.links.insert(e.ino, p.clone());
            }
            match attr.kind {
                FileKind::Dir => {
                    if !self.entered.insert(e.ino) {
                        let reason =
                            format!("directory {} is already in the tree (a cycle or a hard link to it)", e.ino);
                        return Err(ExportError::NotATree { path: p, reason });
                    }
                    std::fs::DirBuilder::new().mode(0o700).create(&p).map_err(ExportError::io("mkdir", &p))?;
                    self.dir(e.ino, &p)?;
                    self.written.dirs += 1;
                }
                FileKind::File => {
                    self.file(e.ino, &attr, &p)?;
                    self.written.files += 1;
                }
                FileKind::Symlink => {
                    let target = self.vfs.readlink(e.ino).map_err(ExportError::workspace(&p))?;
                    std::os::unix::fs::symlink(OsStr::from_bytes(&target), &p)
                        .map_err(ExportError::io("symlink", &p))?;
                    self.written.symlinks += 1;
                }
                FileKind::CharDev | FileKind::BlockDev if !self.privileged => {
                    self.written.left_out.devices += 1;
                    self.links.remove(&e.ino);
                    continue;
                }
                _ => {
                    let c = cstr(&p)?;
                    let mode = attr.kind.mode_bits() | u32::from(attr.perm);
                    // SAFETY: `c` is a valid C string for the call.
                    if unsafe { libc::mknod(c.as_ptr(), mode, libc::dev_t::from(attr.rdev)) } != 0 {
                        return Err(ExportError::Io { op: "mknod", path: p, source: std::io::Error::last_os_error() });
                    }
                    self.written.other += 1;
                }
            }
            // Linux keeps user xattrs off symlinks.
            if attr.kind != FileKind::Symlink {
                self.xattrs(e.ino, &p)?;
            }
            self.attrs(&p, &attr)?;
            self.visitor.written(&p, e.ino, dir, &e.name)?;
            self.visitor.progress(&self.written);
        }
        Ok(())
    }

    fn file(&mut self, ino: Ino, attr: &Attr, p: &Path) -> Result<()> {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(p)
            .map_err(ExportError::io("create", p))?;
        let fh = self.vfs.open(&Caller::ROOT, ino, libc::O_RDONLY).map_err(ExportError::workspace(p))?;
        let copied = self.copy_chunks(ino, fh, attr.size, &out, p);
        let released = self.vfs.release(ino, fh).map_err(ExportError::workspace(p));
        copied?;
        released?;
        out.set_len(attr.size).map_err(ExportError::io("truncate", p))
    }

    /// The chunks of `ino` that hold data (those with a record), written into `out` with
    /// their zero pages left as holes.
    fn copy_chunks(&mut self, ino: Ino, fh: u64, size: u64, out: &std::fs::File, p: &Path) -> Result<()> {
        for (idx, rec) in self.vfs.chunk_records(ino) {
            let at = idx * CHUNK_SIZE;
            if at >= size {
                break;
            }
            let want = u64::from(rec.len).min(size - at);
            let data = self.vfs.read_bytes(ino, fh, at, want as u32).map_err(ExportError::workspace(p))?;
            if data.len() as u64 != want {
                return Err(ExportError::ShortRead { path: p.into(), offset: at, want, got: data.len() as u64 });
            }
            for run in block::data_runs(&data) {
                out.write_all_at(&data[run.clone()], at + run.start as u64).map_err(ExportError::io("write", p))?;
            }
            self.written.bytes += want;
            self.visitor.progress(&self.written);
        }
        Ok(())
    }

    /// Mode, owner and times of `p`, with what gives rights left out unless privileged.
    fn attrs(&mut self, p: &Path, attr: &Attr) -> Result<()> {
        let mut attr = attr.clone();
        let chown = self.privileged && rustix::process::geteuid().is_root();
        if !self.privileged {
            if attr.kind != FileKind::Symlink && attr.perm & 0o6000 != 0 {
                attr.perm &= !0o6000;
                self.written.left_out.setid_bits += 1;
            }
            let me = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
            if (attr.uid, attr.gid) != me {
                self.written.left_out.owners += 1;
            }
        }
        set_attrs(p, &attr, chown)
    }

    fn xattrs(&mut self, ino: Ino, p: &Path) -> Result<()> {
        let names = self.vfs.listxattr(ino).map_err(ExportError::workspace(p))?;
        for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if !self.privileged && (name.starts_with(b"security.") || name.starts_with(b"trusted.")) {
                self.written.left_out.xattrs += 1;
                continue;
            }
            let value = self.vfs.getxattr(ino, name).map_err(ExportError::workspace(p))?;
            let c = cstr(p)?;
            let n = CString::new(name).map_err(|e| ExportError::Io {
                op: "setxattr",
                path: p.into(),
                source: std::io::Error::other(e),
            })?;
            // SAFETY: valid C strings and a buffer of `value.len()` bytes.
            let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
            if r != 0 {
                return Err(ExportError::Io {
                    op: "setxattr",
                    path: p.into(),
                    source: std::io::Error::last_os_error(),
                });
            }
        }
        Ok(())
    }
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|e| ExportError::Io {
        op: "name",
        path: p.into(),
        source: std::io::Error::other(e),
    })
}

fn timespec(t: Timestamp) -> libc::timespec {
    libc::timespec { tv_sec: t.secs as libc::time_t, tv_nsec: libc::c_long::from(t.nanos) }
}

/// Owner (with `chown`, which needs root), mode (not of a symlink) and times of `p` from
/// `attr`.
pub fn set_attrs(p: &Path, attr: &Attr, chown: bool) -> Result<()> {
    let c = cstr(p)?;
    // SAFETY: valid C string; lchown, chmod and utimensat read only it and `times`.
    unsafe {
        if chown && libc::lchown(c.as_ptr(), attr.uid, attr.gid) != 0 {
            return Err(ExportError::Io { op: "chown", path: p.into(), source: std::io::Error::last_os_error() });
        }
        if attr.kind != FileKind::Symlink && libc::chmod(c.as_ptr(), u32::from(attr.perm)) != 0 {
            return Err(ExportError::Io { op: "chmod", path: p.into(), source: std::io::Error::last_os_error() });
        }
        let times = [timespec(attr.atime), timespec(attr.mtime)];
        if libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return Err(ExportError::Io {
                op: "set times of",
                path: p.into(),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::meta::{JournalOp, codec};
    use crate::vfs::VfsConfig;

    struct Quiet;
    impl Visitor for Quiet {}

    #[test]
    fn a_directory_met_twice_is_refused_and_nothing_recurses() {
        let dir = tempfile::tempdir().unwrap();
        let vfs = Vfs::new(VfsConfig::new(dir.path().join("data"))).unwrap();
        let a = vfs.mkdir(&Caller::ROOT, ROOT_INO, b"a", 0o755, 0).unwrap();
        // What only a store can hold: an entry of `a` naming the root, a cycle.
        let up = JournalOp::Put {
            key: codec::dentry_key(a.ino, b"up"),
            value: codec::encode_dentry(ROOT_INO, FileKind::Dir).to_vec(),
        };
        vfs.meta().import(&[up], 1).unwrap();
        let target = dir.path().join("out");
        std::fs::create_dir(&target).unwrap();
        let err = write_tree(&vfs, &target, false, &mut Quiet).unwrap_err();
        assert!(matches!(err, ExportError::NotATree { .. }) && err.kind() == ErrorKind::Corrupt, "{err}");
        assert!(!target.join("a/up/a").exists(), "the cycle was followed");
    }
}
