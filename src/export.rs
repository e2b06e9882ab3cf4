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
//! - nothing is overwritten: every entry is created new (`O_EXCL`, `mkdirat`, `mknodat`), so
//!   a target that is not empty fails at the first name it already holds;
//! - nothing is written outside the target, whatever happens to it meanwhile: every entry is
//!   made relative to a descriptor of its directory, opened again without following a
//!   symlink (and checked to be what was made) before its attributes are set through that
//!   descriptor, and a hard link finds its first name beneath the target with no symlink
//!   followed (`openat2`). A directory swapped for a symlink while it is filled fails the
//!   restore instead of leading it elsewhere;
//! - directories are made owner-only first and get their own mode after their entries, so a
//!   read-only directory can still be filled.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
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
    /// A path to write a file at that does not stay beneath its root (`..`, absolute).
    #[error("{}: not a path beneath the target ({reason})", path.display())]
    Outside { path: PathBuf, reason: &'static str },
    /// An entry put back one by one that is not a file, a symlink or a directory.
    #[error("{}: a {kind} is not put back on its own (only files, symlinks and directories)", path.display())]
    NotRestorable { path: PathBuf, kind: &'static str },
}

impl ExportError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExportError::Workspace { source, .. } => source.kind(),
            ExportError::Io { source, .. } => crate::types::io_error_kind(source),
            ExportError::ShortRead { .. } | ExportError::NotATree { .. } => ErrorKind::Corrupt,
            ExportError::Outside { .. } | ExportError::NotRestorable { .. } => ErrorKind::InvalidInput,
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
    // The target itself is the caller's (a symlink to a directory is its choice); what is
    // made beneath it is not followed.
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = rustix::fs::open(target, flags, Mode::empty()).map_err(io("open", target))?;
    let mut w = Writer::new(&root, vfs, privileged, visitor);
    w.dir(ROOT_INO, &root, target, Path::new(""))?;
    Ok(w.written)
}

/// How many `<name>.<suffix>-N` a file written beside a taken name tries before giving up.
const BESIDE_TRIES: u32 = 100;

/// Writes entry `ino` of `vfs` (a file, a symlink, or a directory with its whole tree) as
/// `rel` beneath `root`, an existing directory, and returns the path it got (relative to
/// `root`) and what was written. Nothing is overwritten: when `rel` is taken the entry goes
/// beside it, as `<name>.<suffix>`, then `<name>.<suffix>-2`, and so on. Missing directories
/// on the way are made (mode 0755 less the umask). `rel` may not climb out (`..`, an absolute
/// path) and no component on the way may be a symlink (`openat2` beneath `root`), whatever
/// happens to the tree meanwhile. Modes, times and xattrs are the workspace's; owners, setuid
/// and setgid bits and device nodes are left out, as in an unprivileged [`write_tree`].
pub fn write_beneath(vfs: &Vfs, ino: Ino, root: &Path, rel: &Path, suffix: &str) -> Result<(PathBuf, Written)> {
    let (root_fd, dir, at, name) = parent_beneath(root, rel)?;
    let attr = vfs.getattr(ino).map_err(ExportError::workspace(rel))?;
    let mut quiet = NoVisitor;
    let mut w = Writer::new(&root_fd, vfs, false, &mut quiet);
    for n in 0..BESIDE_TRIES {
        let mut got = name.clone();
        match n {
            0 => {}
            1 => got.push(format!(".{suffix}")),
            n => got.push(format!(".{suffix}-{n}")),
        }
        let rel_got = rel.parent().map_or_else(|| PathBuf::from(&got), |d| d.join(&got));
        match w.entry_beneath(ino, &attr, &dir, &got, (&at.join(&got), &rel_got)) {
            Ok(()) => return Ok((rel_got, w.written)),
            Err(ExportError::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(ExportError::Io {
        op: "create",
        path: at.join(name),
        source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the name and every name beside it are taken"),
    })
}

/// The directory `rel` goes in, beneath `root`, made where missing and opened with no symlink
/// followed: `root` open, that directory open, its path, and the last name of `rel`.
fn parent_beneath(root: &Path, rel: &Path) -> Result<(OwnedFd, OwnedFd, PathBuf, std::ffi::OsString)> {
    let outside = |reason| ExportError::Outside { path: rel.to_path_buf(), reason };
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(n) => parts.push(n),
            std::path::Component::CurDir => {}
            _ => return Err(outside("only plain names, no `..` or leading `/`")),
        }
    }
    let Some((name, dirs)) = parts.split_last() else { return Err(outside("no file name")) };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root_fd = rustix::fs::open(root, flags, Mode::empty()).map_err(io("open", root))?;
    let mut dir = rustix::io::dup(&root_fd).map_err(io("open", root))?;
    let mut at = root.to_path_buf();
    for d in dirs {
        at.push(d);
        match rustix::fs::mkdirat(&dir, *d, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io("mkdir", &at)(e)),
        }
        dir = rustix::fs::openat2(&dir, *d, flags | OFlags::NOFOLLOW, Mode::empty(), CONFINED).map_err(|e| {
            use rustix::io::Errno;
            // A symlink (refused by RESOLVE_NO_SYMLINKS or O_NOFOLLOW), or not a directory.
            if [Errno::LOOP, Errno::XDEV, Errno::NOTDIR].contains(&e) {
                outside("a symlink or a non-directory on the way")
            } else {
                io("open", &at)(e)
            }
        })?;
    }
    Ok((root_fd, dir, at, name.to_os_string()))
}

/// A [`Visitor`] that is told nothing.
struct NoVisitor;

impl Visitor for NoVisitor {}

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
    /// The target directory: hard links find their first name beneath it.
    root: &'a OwnedFd,
    vfs: &'a Vfs,
    privileged: bool,
    /// Owners are applied (privileged, as root).
    chown: bool,
    /// This process's uid and gid: the owner of what it makes.
    me: (u32, u32),
    visitor: &'a mut dyn Visitor,
    /// Inodes with several links: the first path written for each, relative to the target.
    links: HashMap<Ino, PathBuf>,
    /// Directories entered: one met again is refused, so a cycle never recurses.
    entered: HashSet<Ino>,
    written: Written,
}

impl<'a> Writer<'a> {
    fn new(root: &'a OwnedFd, vfs: &'a Vfs, privileged: bool, visitor: &'a mut dyn Visitor) -> Writer<'a> {
        Writer {
            root,
            privileged,
            chown: privileged && rustix::process::geteuid().is_root(),
            me: (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw()),
            vfs,
            visitor,
            links: HashMap::new(),
            entered: HashSet::from([ROOT_INO]),
            written: Written::default(),
        }
    }

    /// Makes entry `ino` as the new name `name` of `dirfd` (`at`: its path, and the same
    /// relative to the root), a directory with everything beneath it. A name that is taken
    /// fails with `AlreadyExists` before anything is written.
    fn entry_beneath(
        &mut self,
        ino: Ino,
        attr: &Attr,
        dirfd: &OwnedFd,
        name: &OsStr,
        at: (&Path, &Path),
    ) -> Result<()> {
        let (p, rel) = at;
        match attr.kind {
            FileKind::Dir => {
                rustix::fs::mkdirat(dirfd, name, Mode::from_raw_mode(0o700)).map_err(io("mkdir", p))?;
                let child = open_made(dirfd, name, FileKind::Dir, p)?;
                self.entered.insert(ino);
                self.dir(ino, &child, p, rel)?;
                self.written.dirs += 1;
                self.xattrs(ino, &child, p)?;
                self.attrs(Target::Fd(&child), attr, p)
            }
            FileKind::Symlink => {
                let target = self.vfs.readlink(ino).map_err(ExportError::workspace(p))?;
                rustix::fs::symlinkat(OsStr::from_bytes(&target), dirfd, name).map_err(io("symlink", p))?;
                self.written.symlinks += 1;
                self.attrs(Target::Symlink(dirfd, name), attr, p)
            }
            FileKind::File => {
                let fd = self.file(ino, attr, dirfd, name, p)?;
                self.written.files += 1;
                self.xattrs(ino, &fd, p)?;
                self.attrs(Target::Fd(&fd), attr, p)
            }
            _ => Err(ExportError::NotRestorable { path: rel.to_path_buf(), kind: "device, fifo or socket" }),
        }
    }

    /// Writes the entries of workspace directory `dir` into the directory open as `dirfd`
    /// (at `path`, for messages). Every entry is made relative to `dirfd` and opened again
    /// without following a symlink, so a name swapped for a symlink meanwhile leads nowhere.
    fn dir(&mut self, dir: Ino, dirfd: &OwnedFd, path: &Path, rel: &Path) -> Result<()> {
        for e in entries(self.vfs, dir).map_err(ExportError::workspace(path))? {
            let name = OsStr::from_bytes(&e.name);
            let (p, child_rel) = (path.join(name), rel.join(name));
            let attr = self.vfs.getattr(e.ino).map_err(ExportError::workspace(&p))?;
            if attr.kind != FileKind::Dir && attr.nlink > 1 {
                if let Some(first) = self.links.get(&e.ino) {
                    self.link(first, dirfd, name, &p)?;
                    self.written.hard_links += 1;
                    self.visitor.written(&p, e.ino, dir, &e.name)?;
                    continue;
                }
                self.links.insert(e.ino, child_rel.clone());
            }
            let made = match attr.kind {
                FileKind::Dir => {
                    if !self.entered.insert(e.ino) {
                        let reason =
                            format!("directory {} is already in the tree (a cycle or a hard link to it)", e.ino);
                        return Err(ExportError::NotATree { path: p, reason });
                    }
                    rustix::fs::mkdirat(dirfd, name, Mode::from_raw_mode(0o700)).map_err(io("mkdir", &p))?;
                    let child = open_made(dirfd, name, FileKind::Dir, &p)?;
                    self.dir(e.ino, &child, &p, &child_rel)?;
                    self.written.dirs += 1;
                    Some(child)
                }
                FileKind::File => {
                    let fd = self.file(e.ino, &attr, dirfd, name, &p)?;
                    self.written.files += 1;
                    Some(fd)
                }
                FileKind::Symlink => {
                    let target = self.vfs.readlink(e.ino).map_err(ExportError::workspace(&p))?;
                    rustix::fs::symlinkat(OsStr::from_bytes(&target), dirfd, name).map_err(io("symlink", &p))?;
                    self.written.symlinks += 1;
                    None
                }
                FileKind::CharDev | FileKind::BlockDev if !self.privileged => {
                    self.written.left_out.devices += 1;
                    self.links.remove(&e.ino);
                    continue;
                }
                kind => {
                    let file_type = rustix::fs::FileType::from_raw_mode(kind.mode_bits());
                    let dev = rustix::fs::Dev::from(attr.rdev);
                    rustix::fs::mknodat(dirfd, name, file_type, Mode::from_raw_mode(u32::from(attr.perm) & 0o777), dev)
                        .map_err(io("mknod", &p))?;
                    self.written.other += 1;
                    Some(open_made(dirfd, name, kind, &p)?)
                }
            };
            match &made {
                // Linux keeps user xattrs off symlinks.
                Some(fd) => {
                    self.xattrs(e.ino, fd, &p)?;
                    self.attrs(Target::Fd(fd), &attr, &p)?;
                }
                None => self.attrs(Target::Symlink(dirfd, name), &attr, &p)?,
            }
            drop(made);
            self.visitor.written(&p, e.ino, dir, &e.name)?;
            self.visitor.progress(&self.written);
        }
        Ok(())
    }

    /// A hard link `name` in `dirfd` to the entry written first at `first` (relative to the
    /// target), found again beneath the target without following a symlink.
    fn link(&self, first: &Path, dirfd: &OwnedFd, name: &OsStr, p: &Path) -> Result<()> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat2(self.root, first, flags, Mode::empty(), CONFINED).map_err(io("link", p))?;
        rustix::fs::linkat(rustix::fs::CWD, fd_path(&fd), dirfd, name, AtFlags::SYMLINK_FOLLOW).map_err(io("link", p))
    }

    /// Writes file `ino` as `name` in `dirfd`, a new file; returns it open.
    fn file(&mut self, ino: Ino, attr: &Attr, dirfd: &OwnedFd, name: &OsStr, p: &Path) -> Result<OwnedFd> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let out = std::fs::File::from(
            rustix::fs::openat(dirfd, name, flags, Mode::from_raw_mode(0o600)).map_err(io("create", p))?,
        );
        let fh = self.vfs.open(&Caller::ROOT, ino, libc::O_RDONLY).map_err(ExportError::workspace(p))?;
        let copied = self.copy_chunks(ino, fh, attr.size, &out, p);
        let released = self.vfs.release(ino, fh).map_err(ExportError::workspace(p));
        copied?;
        released?;
        out.set_len(attr.size).map_err(ExportError::io("truncate", p))?;
        Ok(OwnedFd::from(out))
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

    /// Mode, owner and times of an entry written, with what gives rights left out (and
    /// counted) unless privileged.
    fn attrs(&mut self, target: Target<'_>, attr: &Attr, p: &Path) -> Result<()> {
        let mut attr = attr.clone();
        if !self.privileged {
            if drop_setid_bits(&mut attr) {
                self.written.left_out.setid_bits += 1;
            }
            if (attr.uid, attr.gid) != self.me {
                self.written.left_out.owners += 1;
            }
        }
        apply(target, &attr, self.chown, p)
    }

    fn xattrs(&mut self, ino: Ino, fd: &OwnedFd, p: &Path) -> Result<()> {
        let names = self.vfs.listxattr(ino).map_err(ExportError::workspace(p))?;
        let at = fd_path(fd);
        for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            if !self.privileged && (name.starts_with(b"security.") || name.starts_with(b"trusted.")) {
                self.written.left_out.xattrs += 1;
                continue;
            }
            let value = self.vfs.getxattr(ino, name).map_err(ExportError::workspace(p))?;
            let n = CString::new(name).map_err(|e| ExportError::Io {
                op: "setxattr",
                path: p.into(),
                source: std::io::Error::other(e),
            })?;
            rustix::fs::setxattr(&at, n.as_c_str(), &value, rustix::fs::XattrFlags::empty())
                .map_err(io("setxattr", p))?;
        }
        Ok(())
    }
}

/// Where [`Writer::attrs`] sets attributes: an entry open without following a symlink, or a
/// symlink by its name in its directory (attributes of the link itself).
enum Target<'a> {
    Fd(&'a OwnedFd),
    Symlink(&'a OwnedFd, &'a OsStr),
}

/// How a path beneath a directory descriptor is resolved where nothing may lead out of it:
/// no `..` above it, no absolute path, no symlink on any component (`openat2`).
pub(crate) const CONFINED: ResolveFlags =
    ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// `/proc/self/fd/N` of `fd`: a name for exactly the inode `fd` holds.
pub(crate) fn fd_path(fd: &impl AsFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

/// The entry `name` of `dirfd` just made as a `kind`, opened without following a symlink (a
/// directory to write into, anything else `O_PATH`), and refused if it is not what was made.
fn open_made(dirfd: &OwnedFd, name: &OsStr, kind: FileKind, p: &Path) -> Result<OwnedFd> {
    let flags = match kind {
        FileKind::Dir => OFlags::RDONLY | OFlags::DIRECTORY,
        _ => OFlags::PATH,
    };
    let fd = rustix::fs::openat(dirfd, name, flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
        .map_err(io("open", p))?;
    let st = rustix::fs::fstat(&fd).map_err(io("stat", p))?;
    if FileKind::from_mode(st.st_mode) != Some(kind) {
        let source = std::io::Error::other("replaced by something else while it was restored");
        return Err(ExportError::Io { op: "open", path: p.into(), source });
    }
    Ok(fd)
}

/// The mapper of a failed system call `op` on `p`, for `map_err`.
fn io<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(rustix::io::Errno) -> ExportError + 'a {
    move |e| ExportError::Io { op, path: p.to_path_buf(), source: e.into() }
}

/// Clears the setuid and setgid bits of `attr` (not of a symlink, which has no mode);
/// whether it had any.
fn drop_setid_bits(attr: &mut Attr) -> bool {
    let had = attr.kind != FileKind::Symlink && attr.perm & 0o6000 != 0;
    attr.perm &= !0o6000;
    had
}

/// Sets owner (with `chown`, which needs root), mode (not of a symlink) and times of `target`
/// from `attr`.
fn apply(target: Target<'_>, attr: &Attr, chown: bool, p: &Path) -> Result<()> {
    let ts = |t: Timestamp| rustix::fs::Timespec { tv_sec: t.secs, tv_nsec: t.nanos.into() };
    let times = rustix::fs::Timestamps { last_access: ts(attr.atime), last_modification: ts(attr.mtime) };
    let (uid, gid) = (Some(rustix::fs::Uid::from_raw(attr.uid)), Some(rustix::fs::Gid::from_raw(attr.gid)));
    match target {
        Target::Symlink(dirfd, name) => {
            if chown {
                rustix::fs::chownat(dirfd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW).map_err(io("chown", p))?;
            }
            rustix::fs::utimensat(dirfd, name, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(io("set times of", p))?;
        }
        Target::Fd(fd) => {
            // The descriptor's /proc entry names exactly the inode it holds (no symlink).
            let at = fd_path(fd);
            if chown {
                rustix::fs::chownat(rustix::fs::CWD, &at, uid, gid, AtFlags::empty()).map_err(io("chown", p))?;
            }
            rustix::fs::chmodat(rustix::fs::CWD, &at, Mode::from_raw_mode(u32::from(attr.perm)), AtFlags::empty())
                .map_err(io("chmod", p))?;
            rustix::fs::utimensat(rustix::fs::CWD, &at, &times, AtFlags::empty()).map_err(io("set times of", p))?;
        }
    }
    Ok(())
}

/// Owner, mode and times of the target directory `p` itself from `attr` (the workspace
/// root's), by the rules of [`write_tree`]: owner and setuid/setgid bits only when
/// `privileged`.
pub fn set_attrs(p: &Path, attr: &Attr, privileged: bool) -> Result<()> {
    let fd = rustix::fs::open(p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(io("open", p))?;
    let mut attr = attr.clone();
    if !privileged {
        drop_setid_bits(&mut attr);
    }
    apply(Target::Fd(&fd), &attr, privileged && rustix::process::geteuid().is_root(), p)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::meta::{JournalOp, codec};
    use crate::vfs::VfsConfig;

    struct Quiet;
    impl Visitor for Quiet {}

    /// Swaps the directory being filled for a symlink to `outside` once `f1` is written.
    struct Swapper {
        target: PathBuf,
        outside: PathBuf,
    }

    impl Visitor for Swapper {
        fn written(&mut self, path: &Path, _ino: Ino, _parent: Ino, name: &[u8]) -> Result<()> {
            if name == b"f1" {
                let d = self.target.join("d");
                std::fs::rename(&d, self.target.join("d.moved")).unwrap();
                std::os::unix::fs::symlink(&self.outside, &d).unwrap();
                assert!(path.starts_with(&d));
            }
            Ok(())
        }
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_while_it_is_filled_leads_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let vfs = Vfs::new(VfsConfig::new(dir.path().join("data"))).unwrap();
        let d = vfs.mkdir(&Caller::ROOT, ROOT_INO, b"d", 0o755, 0).unwrap();
        for name in [&b"f1"[..], b"f2", b"f3"] {
            let (f, fh) = vfs.create(&Caller::ROOT, d.ino, name, 0o644, 0, libc::O_RDWR).unwrap();
            vfs.write(f.ino, fh, 0, b"data").unwrap();
            vfs.release(f.ino, fh).unwrap();
        }
        let (target, outside) = (dir.path().join("out"), dir.path().join("outside"));
        std::fs::create_dir(&target).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let mut swapper = Swapper { target: target.clone(), outside: outside.clone() };
        let written = write_tree(&vfs, &target, false, &mut swapper).unwrap();
        assert_eq!(written.files, 3);
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "a file was written through the symlink");
        // (A Vfs without a store has no chunk records to copy: only the names and sizes count.)
        for name in ["f1", "f2", "f3"] {
            assert_eq!(std::fs::metadata(target.join("d.moved").join(name)).unwrap().len(), 4, "{name}");
        }
    }

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
