//! One pass of the mirror: walks directories of the watched directory beside the workspace's
//! same directories and makes the workspace match (see the module invariants in `mod.rs`).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::beneath::Beneath;
use super::import::{Read, clone_of, unchanged};
use super::{Known, LocalId, Mirror, READ_ATTEMPTS, Result, WatchError};
use crate::types::{FileKind, Ino, ROOT_INO, Timestamp};
use crate::vfs::{Caller, RenameFlags, SetAttr, TimeSet};

const ROOT: &Caller = &Caller::ROOT;

/// The top-level names of the watched directory `dir` (to decide how a directory and a
/// workspace meet).
pub(super) fn local_names(beneath: &Beneath, dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for e in beneath.read_dir(Path::new("")).map_err(WatchError::io("list", dir))? {
        let e = e.map_err(WatchError::io("list", dir))?;
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    Ok(out)
}

/// `dirs` without those inside another of them.
pub(super) fn outermost(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut sorted: Vec<PathBuf> = dirs.to_vec();
    sorted.sort();
    let mut out: Vec<PathBuf> = Vec::new();
    for d in sorted {
        if !out.iter().any(|o| d.starts_with(o)) {
            out.push(d);
        }
    }
    out
}

fn kind_of(md: &std::fs::Metadata) -> Option<FileKind> {
    FileKind::from_mode(md.mode())
}

fn mtime_of(md: &std::fs::Metadata) -> Timestamp {
    Timestamp { secs: md.mtime(), nanos: md.mtime_nsec() as u32 }
}

fn atime_of(md: &std::fs::Metadata) -> Timestamp {
    Timestamp { secs: md.atime(), nanos: md.atime_nsec() as u32 }
}

fn ctime_of(md: &std::fs::Metadata) -> (i64, i64) {
    (md.ctime(), md.ctime_nsec())
}

/// An entry that went away, or was swapped for a symlink that would lead out of the watched
/// directory, since it was listed: a later pass sees what is there then.
fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EXDEV))
}

fn id_of(md: &std::fs::Metadata) -> LocalId {
    LocalId { dev: md.dev(), ino: md.ino() }
}

/// A workspace entry not found in the directory, removed at the end of the pass unless it
/// was renamed meanwhile.
struct Gone {
    parent: Ino,
    name: Vec<u8>,
    ino: Ino,
    kind: FileKind,
}

pub(super) struct Pass<'a> {
    m: &'a mut Mirror,
    out: super::Pass,
    gone: Vec<Gone>,
    /// Workspace directories by where they are in the watched directory, as seen this pass.
    dir_paths: HashMap<Ino, PathBuf>,
    /// Whether directories that exist on both sides are descended into (a full pass) or only
    /// their own entries are looked at (a pass for events, which name each changed directory).
    deep: bool,
}

impl<'a> Pass<'a> {
    pub fn new(m: &'a mut Mirror, deep: bool) -> Pass<'a> {
        let mut dir_paths = HashMap::new();
        dir_paths.insert(ROOT_INO, PathBuf::new());
        Pass { m, out: super::Pass::default(), gone: Vec::new(), dir_paths, deep }
    }

    /// Reconciles `rel` (a directory, with everything below it), or its nearest ancestor that
    /// is a directory on both sides.
    pub fn reconcile_path(&mut self, rel: &Path) -> Result<()> {
        let mut rel = rel.to_path_buf();
        loop {
            let local_dir = self.m.beneath.lstat(&rel).is_ok_and(|m| m.is_dir());
            if local_dir {
                if let Some(ino) = self.ws_dir(&rel)? {
                    return self.reconcile_dir(&rel, ino);
                }
            }
            if !rel.pop() {
                return self.reconcile_dir(Path::new(""), ROOT_INO);
            }
        }
    }

    /// The workspace directory at `rel`, if there is one.
    fn ws_dir(&self, rel: &Path) -> Result<Option<Ino>> {
        let mut ino = ROOT_INO;
        for c in rel.components() {
            let name = c.as_os_str().as_bytes();
            match self.m.vfs.meta().dentry(ino, name).map_err(|e| self.meta_err(rel, e))? {
                Some((child, FileKind::Dir)) => ino = child,
                _ => return Ok(None),
            }
        }
        Ok(Some(ino))
    }

    fn meta_err(&self, rel: &Path, e: crate::meta::MetaError) -> WatchError {
        WatchError::Vfs { path: self.m.root.join(rel), source: e.into() }
    }

    fn reconcile_dir(&mut self, rel: &Path, dir: Ino) -> Result<()> {
        self.dir_paths.insert(dir, rel.to_path_buf());
        let listing = match self.m.beneath.read_dir(rel) {
            Ok(l) => l,
            Err(e) if gone(&e) => return Ok(()), // gone meanwhile
            Err(e) => {
                self.unreadable(rel, &e);
                return Ok(());
            }
        };
        let mut entries = Vec::new();
        for e in listing {
            match e.and_then(|e| Ok((e.file_name(), e.metadata()?))) {
                Ok(x) => entries.push(x),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // removed while listed
                Err(e) => {
                    self.unreadable(rel, &e);
                    return Ok(()); // a partial listing must not remove what it missed
                }
            }
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut ws: HashMap<Vec<u8>, (Ino, FileKind)> = self
            .m
            .vfs
            .meta()
            .list_dir(dir)
            .map_err(|e| self.meta_err(rel, e))?
            .into_iter()
            .map(|(n, i, k)| (n, (i, k)))
            .collect();
        for (name, md) in entries {
            let Some(kind) = kind_of(&md) else { continue };
            let child = rel.join(&name);
            let nb = name.as_bytes();
            if self.m.ignore.ignores(&child, md.is_dir()) {
                ws.remove(nb); // left as the workspace has it
                continue;
            }
            match ws.remove(nb) {
                Some((ino, k)) if k == kind => self.update(&child, dir, nb, ino, kind, &md)?,
                Some((ino, k)) => {
                    self.remove(dir, nb, ino, k, &child)?;
                    self.add(&child, dir, nb, kind, &md)?;
                }
                None => self.add(&child, dir, nb, kind, &md)?,
            }
        }
        for (name, (ino, kind)) in ws {
            if !self.m.ignore.ignores(&rel.join(std::ffi::OsStr::from_bytes(&name)), kind == FileKind::Dir) {
                self.gone.push(Gone { parent: dir, name, ino, kind });
            }
        }
        if let Ok(md) = self.m.beneath.lstat(rel) {
            self.set_attrs(rel, dir, &md, true)?;
        }
        Ok(())
    }

    /// An entry present on both sides with the same kind.
    fn update(
        &mut self,
        rel: &Path,
        parent: Ino,
        name: &[u8],
        ino: Ino,
        kind: FileKind,
        md: &std::fs::Metadata,
    ) -> Result<()> {
        let ctime = ctime_of(md);
        let prev = self.m.known.insert(id_of(md), Known { ino, parent, name: name.to_vec(), ctime });
        if kind != FileKind::Symlink && prev.is_none_or(|k| k.ctime != ctime || k.ino != ino) {
            self.sync_xattrs(rel, ino)?;
        }
        match kind {
            FileKind::Dir if self.deep => self.reconcile_dir(rel, ino),
            FileKind::Dir => {
                self.dir_paths.insert(ino, rel.to_path_buf());
                match self.m.beneath.lstat(rel) {
                    Ok(md) => self.set_attrs(rel, ino, &md, true),
                    Err(_) => Ok(()), // gone meanwhile: a later pass sees it
                }
            }
            FileKind::File => {
                let attr = self.m.vfs.getattr(ino).map_err(WatchError::vfs(&self.m.root.join(rel)))?;
                if attr.size == md.len() && attr.mtime == mtime_of(md) {
                    self.set_attrs(rel, ino, md, false)
                } else {
                    self.import(rel, ino)
                }
            }
            FileKind::Symlink => {
                let target = self.m.beneath.read_link(rel);
                let ws_target = self.m.vfs.readlink(ino).map_err(WatchError::vfs(&self.m.root.join(rel)))?;
                match target {
                    Ok(t) if t.as_os_str().as_bytes() == ws_target.as_slice() => self.set_attrs(rel, ino, md, false),
                    Ok(_) => {
                        self.remove(parent, name, ino, kind, rel)?;
                        self.add(rel, parent, name, kind, md)
                    }
                    Err(_) => Ok(()), // changed meanwhile: a later pass sees it
                }
            }
            _ => {
                let attr = self.m.vfs.getattr(ino).map_err(WatchError::vfs(&self.m.root.join(rel)))?;
                if u64::from(attr.rdev) != md.rdev() {
                    self.remove(parent, name, ino, kind, rel)?;
                    return self.add(rel, parent, name, kind, md);
                }
                self.set_attrs(rel, ino, md, false)
            }
        }
    }

    /// An entry of the directory the workspace does not have under this name: a rename or a
    /// hard link of an entry seen before, or a new one.
    fn add(&mut self, rel: &Path, parent: Ino, name: &[u8], kind: FileKind, md: &std::fs::Metadata) -> Result<()> {
        let path = self.m.root.join(rel);
        let id = id_of(md);
        // The workspace entry of an ignored path is left as it is: never the source of a
        // rename or a link (a new file may get the number of an ignored file deleted here).
        let old_rel = |k: &Known| self.dir_paths.get(&k.parent).map(|p| p.join(std::ffi::OsStr::from_bytes(&k.name)));
        let known = self
            .m
            .known
            .get(&id)
            .cloned()
            .filter(|k| old_rel(k).is_none_or(|old| !self.m.ignore.ignores(&old, kind == FileKind::Dir)));
        if let Some(k) = known {
            let meta = self.m.vfs.meta();
            let in_place = meta.dentry(k.parent, &k.name).map_err(|e| self.meta_err(rel, e))? == Some((k.ino, kind));
            if in_place {
                let old = old_rel(&k);
                let still_there = old.and_then(|p| self.m.beneath.lstat(&p).ok()).is_some_and(|m| id_of(&m) == id);
                if still_there && kind != FileKind::Dir {
                    self.m.vfs.link(ROOT, k.ino, parent, name).map_err(WatchError::vfs(&path))?;
                    self.out.counts.linked += 1;
                    return Ok(());
                }
                if !still_there {
                    self.m
                        .vfs
                        .rename(ROOT, k.parent, &k.name, parent, name, RenameFlags::default())
                        .map_err(WatchError::vfs(&path))?;
                    self.out.counts.renamed += 1;
                    if kind == FileKind::Dir {
                        // Events inside it may have named its old path: look at all of it.
                        self.moved_dir(k.ino, rel);
                        let ctime = ctime_of(md);
                        self.m.known.insert(id, Known { ino: k.ino, parent, name: name.to_vec(), ctime });
                        return self.reconcile_dir(rel, k.ino);
                    }
                    return self.update(rel, parent, name, k.ino, kind, md);
                }
            }
        }
        let mode = md.mode() & 0o7777;
        let attr = match kind {
            FileKind::Dir => self.m.vfs.mkdir(ROOT, parent, name, mode, 0),
            FileKind::Symlink => match self.m.beneath.read_link(rel) {
                Ok(t) => self.m.vfs.symlink(ROOT, parent, name, t.as_os_str().as_bytes()),
                Err(_) => return Ok(()), // gone meanwhile
            },
            FileKind::File => self.m.vfs.mknod(ROOT, parent, name, libc::S_IFREG | mode, 0, 0),
            _ => self.m.vfs.mknod(ROOT, parent, name, kind.mode_bits() | mode, 0, md.rdev() as u32),
        }
        .map_err(WatchError::vfs(&path))?;
        self.out.counts.created += 1;
        self.m.known.insert(id, Known { ino: attr.ino, parent, name: name.to_vec(), ctime: ctime_of(md) });
        if kind != FileKind::Symlink {
            self.sync_xattrs(rel, attr.ino)?;
        }
        match kind {
            FileKind::Dir => self.reconcile_dir(rel, attr.ino),
            FileKind::File if md.len() > 0 => self.import(rel, attr.ino),
            _ => self.set_attrs(rel, attr.ino, md, false),
        }
    }

    /// A workspace directory moved to `rel`: it and the directories under it are there now.
    fn moved_dir(&mut self, ino: Ino, rel: &Path) {
        let Some(old) = self.dir_paths.get(&ino).cloned() else { return };
        for p in self.dir_paths.values_mut() {
            if let Ok(rest) = p.strip_prefix(&old) {
                *p = rel.join(rest);
            }
        }
    }

    /// Reads a file's content into the workspace, retrying reads a change raced.
    fn import(&mut self, rel: &Path, ino: Ino) -> Result<()> {
        let path = self.m.root.join(rel);
        for attempt in 0..READ_ATTEMPTS {
            let file = match self.m.beneath.open_read(rel) {
                Ok(f) => f,
                Err(e) if gone(&e) => {
                    return Ok(()); // gone or replaced meanwhile: a later pass sees it
                }
                Err(e) => {
                    self.unreadable(rel, &e);
                    return Ok(());
                }
            };
            let before = file.metadata().map_err(WatchError::io("stat", &path))?;
            if !before.is_file() {
                return Ok(());
            }
            let m = &mut *self.m;
            // Through a clone where the filesystem has reflinks: one consistent version,
            // read without a race (if the file did not move while it was cloned).
            let clone = if m.no_clones.contains(&before.dev()) {
                None
            } else {
                let parent = rel.parent().unwrap_or(Path::new(""));
                let c = m.beneath.tmpfile_in(parent).ok().and_then(|tmp| clone_of(&file, tmp));
                if c.is_none() {
                    m.no_clones.insert(before.dev());
                }
                c.filter(|_| file.metadata().is_ok_and(|after| unchanged(&before, &after)))
            };
            let (source, verify) = match &clone {
                Some(c) => (c, false),
                None => (&file, true),
            };
            let beneath = &m.beneath;
            let again = || beneath.lstat(rel);
            match m.packer.read(&m.vfs, ino, &path, source, &before, verify, &again, &mut self.out.counts)? {
                Read::Done(p) => {
                    self.out.counts.files_read += 1;
                    return m.packer.push(&m.vfs, *p);
                }
                Read::Torn => std::thread::sleep(Duration::from_millis(10 << (2 * attempt))),
            }
        }
        self.out.unstable.push(rel.to_string_lossy().into_owned());
        Ok(())
    }

    /// Mode, owner and times of `ino` as the directory has them (a directory's after its
    /// entries changed, since those changes move its workspace times).
    fn set_attrs(&mut self, rel: &Path, ino: Ino, md: &std::fs::Metadata, is_dir: bool) -> Result<()> {
        let path = self.m.root.join(rel);
        let attr = self.m.vfs.getattr(ino).map_err(WatchError::vfs(&path))?;
        let perm = (md.mode() & 0o7777) as u16;
        let same = attr.mtime == mtime_of(md) && attr.uid == md.uid() && attr.gid == md.gid();
        let same = same && (attr.kind == FileKind::Symlink || attr.perm == perm);
        if same {
            return Ok(());
        }
        let ch = SetAttr {
            mode: (attr.kind != FileKind::Symlink).then_some(u32::from(perm)),
            uid: Some(md.uid()),
            gid: Some(md.gid()),
            atime: Some(TimeSet::At(atime_of(md))),
            mtime: Some(TimeSet::At(mtime_of(md))),
            ..SetAttr::default()
        };
        self.m.vfs.setattr(ROOT, ino, &ch, None).map_err(WatchError::vfs(&path))?;
        if !is_dir {
            self.out.counts.attrs_set += 1;
        }
        Ok(())
    }

    /// Removes a workspace entry (a directory with everything in it).
    fn remove(&mut self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind, rel: &Path) -> Result<()> {
        let path = self.m.root.join(rel);
        if kind == FileKind::Dir {
            let children = self.m.vfs.meta().list_dir(ino).map_err(|e| self.meta_err(rel, e))?;
            for (n, i, k) in children {
                self.remove(ino, &n, i, k, &rel.join(std::ffi::OsStr::from_bytes(&n)))?;
            }
            self.m.vfs.rmdir(ROOT, parent, name).map_err(WatchError::vfs(&path))?;
        } else {
            self.m.vfs.unlink(ROOT, parent, name).map_err(WatchError::vfs(&path))?;
        }
        self.out.counts.removed += 1;
        Ok(())
    }

    fn unreadable(&mut self, rel: &Path, e: &std::io::Error) {
        self.out.unreadable.push((rel.to_string_lossy().into_owned(), e.to_string()));
    }

    /// Reports something of the directory this pass could not use.
    pub fn report_unreadable(&mut self, what: &str, why: String) {
        self.out.unreadable.push((what.to_owned(), why));
    }

    /// Makes the user xattrs of `ino` those of the entry at `rel`.
    fn sync_xattrs(&mut self, rel: &Path, ino: Ino) -> Result<()> {
        let path = self.m.root.join(rel);
        let local = match self.m.beneath.user_xattrs(rel) {
            Ok(x) => x,
            Err(e) if gone(&e) => return Ok(()), // gone meanwhile
            Err(e) => {
                self.unreadable(rel, &e);
                return Ok(());
            }
        };
        let meta = self.m.vfs.meta();
        let ws: Vec<Vec<u8>> = meta
            .xattr_names(ino)
            .map_err(|e| self.meta_err(rel, e))?
            .into_iter()
            .filter(|n| n.starts_with(b"user."))
            .collect();
        let mut changed = false;
        for n in &ws {
            if !local.contains_key(n) {
                self.m.vfs.removexattr(ROOT, ino, n).map_err(WatchError::vfs(&path))?;
                changed = true;
            }
        }
        for (n, v) in &local {
            if meta.xattr(ino, n).map_err(|e| self.meta_err(rel, e))?.as_deref() != Some(v.as_slice()) {
                self.m.vfs.setxattr(ROOT, ino, n, v, 0).map_err(WatchError::vfs(&path))?;
                changed = true;
            }
        }
        if changed {
            self.out.counts.xattrs_set += 1;
        }
        Ok(())
    }

    /// Records what is waiting for its pack, then removes what the directory no longer has.
    pub fn finish(mut self) -> Result<super::Pass> {
        let m = &mut *self.m;
        m.packer.put_pack(&m.vfs)?;
        let mut touched = std::collections::BTreeSet::new();
        for g in std::mem::take(&mut self.gone) {
            let here = self.m.vfs.meta().dentry(g.parent, &g.name).map_err(|e| self.meta_err(Path::new(""), e))?;
            if here.is_some_and(|(i, _)| i == g.ino) {
                let dir = self.dir_paths.get(&g.parent).cloned().unwrap_or_default();
                self.remove(g.parent, &g.name, g.ino, g.kind, &dir.join(std::ffi::OsStr::from_bytes(&g.name)))?;
                touched.insert((g.parent, dir));
            }
        }
        // The removals moved their directories' workspace times.
        for (ino, rel) in touched {
            if let Ok(md) = self.m.beneath.lstat(&rel) {
                self.set_attrs(&rel, ino, &md, true)?;
            }
        }
        Ok(self.out)
    }
}
