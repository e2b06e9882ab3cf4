//! The implementation side: the same operations on a real `Vfs`, with the kernel's part (path walk, following symlinks) played by the harness.

use super::*;

pub(crate) fn e(err: VfsError) -> i32 {
    err.errno()
}

/// Walks `comps` from the root with `lookup`, as the kernel does for a path.
pub(crate) fn resolve(fs: &Vfs, comps: &[&str]) -> Result<Ino, i32> {
    let mut cur = ROOT_INO;
    for c in comps {
        cur = fs.lookup(cur, c.as_bytes()).map_err(e)?.ino;
    }
    Ok(cur)
}

/// The parent directory of `path` and its last component. Like the kernel's path walk, this
/// fails with ENOTDIR itself when the parent is not a directory, so the `Vfs` is only ever
/// handed directories as parents (`regression_non_directory_parent_is_enotdir` covers the
/// other case).
pub(crate) fn locate<'p>(fs: &Vfs, path: &'p str) -> Result<(Ino, &'p [u8]), i32> {
    let (dir, name) = split(path);
    let parent = resolve(fs, &dir)?;
    if fs.getattr(parent).map_err(e)?.kind != FileKind::Dir {
        return Err(libc::ENOTDIR);
    }
    Ok((parent, name.as_bytes()))
}

pub(crate) fn lookup_path(fs: &Vfs, path: &str) -> Result<Attr, i32> {
    let (parent, name) = locate(fs, path)?;
    fs.lookup(parent, name).map_err(e)
}

pub(crate) struct Real {
    // Dropped before `dir`.
    pub(crate) vfs: Option<Vfs>,
    pub(crate) handles: Vec<(Ino, u64)>,
    /// The cold tier of the cold variant: a store in memory and a cache so small that every
    /// sealed chunk is evicted, so reads, writes and truncates keep racing with sealing,
    /// eviction and fetching.
    pub(crate) store: Option<AttachedStore>,
    pub(crate) dir: TempDir,
}

impl Real {
    pub(crate) fn new(tier: Tier) -> Result<Real, String> {
        let dir = tempfile::tempdir().map_err(|err| format!("tempdir: {err}"))?;
        let store = (tier != Tier::Hot).then(|| {
            let mut config = ColdConfig::new(Some(1));
            // Every read of an evicted chunk streams (from blocks in memory), or none does
            // (fetched chunks are written back into the data file).
            config.stream_above = (tier == Tier::Streamed).then_some(0);
            config.seal_after = std::time::Duration::ZERO;
            config.uploaders = 2;
            config.prefetchers = 1;
            config.prefetch_chunks = 2;
            config.min_free_ratio = 0.0;
            AttachedStore { store: Arc::new(MemStore::new()), config }
        });
        let mut real = Real { vfs: None, handles: Vec::new(), store, dir };
        real.vfs = Some(Vfs::new(real.config()).map_err(|err| format!("Vfs::new: {err}"))?);
        Ok(real)
    }

    pub(crate) fn config(&self) -> VfsConfig {
        let mut config = VfsConfig::new(self.dir.path());
        config.store = self.store.clone();
        config
    }

    pub(crate) fn fs(&self) -> &Vfs {
        self.vfs.as_ref().expect("vfs is open")
    }

    pub(crate) fn apply(&mut self, op: &Op) -> Result<Result<Vec<u8>, i32>, String> {
        if let Op::Reopen { release_first } = *op {
            return self.reopen(release_first).map(Ok);
        }
        Ok(self.apply_fs(op))
    }

    pub(crate) fn apply_fs(&mut self, op: &Op) -> Result<Vec<u8>, i32> {
        let fs = self.vfs.as_ref().expect("vfs is open");
        let handles = &mut self.handles;
        let done = Ok(Vec::new());
        let pick = |handles: &Vec<(Ino, u64)>, h: usize| handles[h % handles.len()];
        match *op {
            Op::Create { at, mode, excl, trunc, keep_open } => {
                let (parent, name) = locate(fs, at)?;
                let mut flags = libc::O_RDWR | libc::O_CREAT;
                if excl {
                    flags |= libc::O_EXCL;
                }
                if trunc {
                    flags |= libc::O_TRUNC;
                }
                let (attr, fh) = fs.create(ME, parent, name, mode, UMASK, flags).map_err(e)?;
                if keep_open {
                    handles.push((attr.ino, fh));
                } else {
                    fs.release(attr.ino, fh).map_err(e)?;
                }
                done
            }
            Op::Mkdir { at, mode } => {
                let (parent, name) = locate(fs, at)?;
                fs.mkdir(ME, parent, name, mode, UMASK).map_err(e)?;
                done
            }
            Op::Unlink { at } => {
                let (parent, name) = locate(fs, at)?;
                fs.unlink(ME, parent, name).map_err(e)?;
                done
            }
            Op::Rmdir { at } => {
                let (parent, name) = locate(fs, at)?;
                fs.rmdir(ME, parent, name).map_err(e)?;
                done
            }
            Op::Rename { from, to, how } => {
                let (sp, sname) = locate(fs, from)?;
                let (dp, dname) = locate(fs, to)?;
                let flags = RenameFlags {
                    noreplace: how == How::NoReplace,
                    exchange: how == How::Exchange,
                    whiteout: how == How::Whiteout,
                };
                fs.rename(ME, sp, sname, dp, dname, flags).map_err(e)?;
                done
            }
            Op::Link { from, to } => {
                let src = lookup_path(fs, from)?;
                let (parent, name) = locate(fs, to)?;
                fs.link(ME, src.ino, parent, name).map_err(e)?;
                done
            }
            Op::Symlink { at, target } => {
                let (parent, name) = locate(fs, at)?;
                fs.symlink(ME, parent, name, target.as_bytes()).map_err(e)?;
                done
            }
            Op::Mknod { at, kind, perm, rdev } => {
                let (parent, name) = locate(fs, at)?;
                fs.mknod(ME, parent, name, kind.file_kind().mode_bits() | perm, UMASK, rdev).map_err(e)?;
                done
            }
            Op::Write { at, offset, len, seed } => {
                let ino = lookup_path(fs, at)?.ino;
                let fh = fs.open(ME, ino, libc::O_RDWR).map_err(e)?;
                let written = fs.write(ino, fh, offset, &pattern(seed, len));
                fs.release(ino, fh).map_err(e)?;
                Ok(written.map_err(e)?.to_le_bytes().to_vec())
            }
            Op::Truncate { at, size } => {
                let ino = lookup_path(fs, at)?.ino;
                fs.setattr(ME, ino, &SetAttr { size: Some(size), ..SetAttr::default() }, None).map_err(e)?;
                done
            }
            Op::Chmod { at, mode } => {
                let ino = lookup_path(fs, at)?.ino;
                fs.setattr(ME, ino, &SetAttr { mode: Some(mode), ..SetAttr::default() }, None).map_err(e)?;
                done
            }
            Op::Utimens { at, atime, mtime } => {
                let ino = lookup_path(fs, at)?.ino;
                let set =
                    SetAttr { atime: Some(TimeSet::At(atime)), mtime: Some(TimeSet::At(mtime)), ..SetAttr::default() };
                let attr = fs.setattr(ME, ino, &set, None).map_err(e)?;
                Ok(times_bytes(attr.atime, attr.mtime))
            }
            Op::SetXattr { at, name, value, flags } => {
                let ino = lookup_path(fs, at)?.ino;
                fs.setxattr(ME, ino, name.as_bytes(), value.as_bytes(), flags.bits()).map_err(e)?;
                done
            }
            Op::RemoveXattr { at, name } => {
                let ino = lookup_path(fs, at)?.ino;
                fs.removexattr(ME, ino, name.as_bytes()).map_err(e)?;
                done
            }
            Op::Fallocate { at, mode, offset, len } => {
                let ino = lookup_path(fs, at)?.ino;
                let fh = fs.open(ME, ino, libc::O_RDWR).map_err(e)?;
                let r = fs.fallocate(ino, fh, offset, len, mode.bits());
                fs.release(ino, fh).map_err(e)?;
                r.map_err(e)?;
                done
            }
            Op::Open { at, trunc } => {
                let ino = lookup_path(fs, at)?.ino;
                let flags = libc::O_RDWR | if trunc { libc::O_TRUNC } else { 0 };
                let fh = fs.open(ME, ino, flags).map_err(e)?;
                handles.push((ino, fh));
                done
            }
            Op::OpenUnlink { at } => {
                let (parent, name) = locate(fs, at)?;
                let ino = fs.lookup(parent, name).map_err(e)?.ino;
                let fh = fs.open(ME, ino, libc::O_RDWR).map_err(e)?;
                handles.push((ino, fh));
                fs.unlink(ME, parent, name).map_err(e)?;
                done
            }
            Op::Read { h, offset, len } => {
                let (ino, fh) = pick(handles, h);
                fs.read(ino, fh, offset, len).map_err(e)
            }
            Op::WriteH { h, offset, len, seed } => {
                let (ino, fh) = pick(handles, h);
                Ok(fs.write(ino, fh, offset, &pattern(seed, len)).map_err(e)?.to_le_bytes().to_vec())
            }
            Op::TruncateH { h, size } => {
                let (ino, fh) = pick(handles, h);
                fs.setattr(ME, ino, &SetAttr { size: Some(size), ..SetAttr::default() }, Some(fh)).map_err(e)?;
                done
            }
            Op::FallocateH { h, mode, offset, len } => {
                let (ino, fh) = pick(handles, h);
                fs.fallocate(ino, fh, offset, len, mode.bits()).map_err(e)?;
                done
            }
            Op::CopyH { h_in, off_in, h_out, off_out, len } => {
                let (ino_in, fh_in) = pick(handles, h_in);
                let (ino_out, fh_out) = pick(handles, h_out);
                let n = fs.copy_file_range(ino_in, fh_in, off_in, ino_out, fh_out, off_out, len).map_err(e)?;
                Ok(n.to_le_bytes().to_vec())
            }
            Op::SeekH { h, offset, hole } => {
                let (ino, fh) = pick(handles, h);
                let whence = if hole { libc::SEEK_HOLE } else { libc::SEEK_DATA };
                Ok(fs.lseek(ino, fh, offset as i64, whence).map_err(e)?.to_le_bytes().to_vec())
            }
            Op::Release { h } => {
                let n = handles.len();
                let (ino, fh) = handles.remove(h % n);
                fs.release(ino, fh).map_err(e)?;
                done
            }
            Op::Reopen { .. } => unreachable!("handled by apply"),
        }
    }

    /// Drops the `Vfs` and opens a new one; every attribute of every path must survive.
    pub(crate) fn reopen(&mut self, release_first: bool) -> Result<Vec<u8>, String> {
        let before = self.snapshot()?.attrs;
        if release_first {
            for (ino, fh) in std::mem::take(&mut self.handles) {
                self.fs().release(ino, fh).map_err(|err| format!("release before reopen: {err}"))?;
            }
        }
        self.handles.clear();
        drop(self.vfs.take());
        self.vfs = Some(Vfs::new(self.config()).map_err(|err| format!("reopen: {err}"))?);
        let after = self.snapshot()?.attrs;
        if before != after {
            let mut out = String::from("attributes changed across reopen:\n");
            for (p, a) in &before {
                match after.get(p) {
                    Some(b) if a == b => {}
                    b => out += &format!("  {p}:\n    before: {a:?}\n    after:  {b:?}\n"),
                }
            }
            for (p, b) in &after {
                if !before.contains_key(p) {
                    out += &format!("  {p}: new after reopen: {b:?}\n");
                }
            }
            return Err(out);
        }
        Ok(Vec::new())
    }

    pub(crate) fn entry(&self, attr: &Attr) -> Result<EntrySnap, String> {
        let fs = self.fs();
        let ino = attr.ino;
        let ctx = |what: &str, err: VfsError| format!("{what} of inode {ino}: {err}");
        let (size, data, target) = match attr.kind {
            FileKind::File => {
                let fh = fs.open(ME, ino, libc::O_RDONLY).map_err(|err| ctx("open", err))?;
                let data = fs.read(ino, fh, 0, attr.size as u32 + 1).map_err(|err| ctx("read", err));
                fs.release(ino, fh).map_err(|err| ctx("release", err))?;
                (Some(attr.size), Some(Bytes(data?)), None)
            }
            FileKind::Symlink => {
                let t = fs.readlink(ino).map_err(|err| ctx("readlink", err))?;
                (Some(attr.size), None, Some(String::from_utf8_lossy(&t).into_owned()))
            }
            FileKind::Dir => (None, None, None),
            _ => (Some(attr.size), None, None),
        };
        let names = fs.listxattr(ino).map_err(|err| ctx("listxattr", err))?;
        let mut xattrs = Vec::new();
        for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let value = fs.getxattr(ino, name).map_err(|err| ctx("getxattr", err))?;
            xattrs.push((String::from_utf8_lossy(name).into_owned(), Bytes(value)));
        }
        ensure!(
            names.is_empty() || names.last() == Some(&0),
            "listxattr of inode {ino}: not NUL-terminated: {names:?}"
        );
        xattrs.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(EntrySnap {
            kind: attr.kind,
            perm: Perm(attr.perm),
            rdev: attr.rdev,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            size,
            data,
            target,
            xattrs,
            listing: None,
            same_as: String::new(),
        })
    }

    /// Lists directory `dir` (whose parent is `parent`), checking the listing's own invariants.
    pub(crate) fn listing(&self, dir: Ino, parent: Ino, path: &str) -> Result<Vec<DirEnt>, String> {
        let fs = self.fs();
        let ctx = |what: &str, err: VfsError| format!("{what} of {path}: {err}");
        let fh = fs.opendir(dir).map_err(|err| ctx("opendir", err))?;
        // A listing comes in batches: each call resumes after the cookie of the last entry.
        let mut all: Vec<DirEntry> = Vec::new();
        loop {
            let cookie = all.last().map_or(0, |d| d.offset);
            let batch = fs.readdir(dir, fh, cookie).map_err(|err| ctx("readdir", err))?;
            if batch.is_empty() {
                break;
            }
            ensure!(all.len() < 10_000, "{path}: readdir does not end");
            all.extend(batch);
        }
        // Every cookie resumes right after its entry.
        for (k, ent) in all.iter().enumerate() {
            let rest = fs.readdir(dir, fh, ent.offset).map_err(|err| ctx("readdir", err))?;
            ensure!(
                all[k + 1..].starts_with(&rest) && (rest.is_empty() == (k + 1 == all.len())),
                "{path}: readdir from the cookie of {:?} gives {rest:?}, not the start of {:?}",
                ent,
                &all[k + 1..]
            );
        }
        let mut plus: Vec<(DirEntry, Attr)> = Vec::new();
        loop {
            let cookie = plus.last().map_or(0, |(d, _)| d.offset);
            let batch = fs.readdirplus(dir, fh, cookie).map_err(|err| ctx("readdirplus", err))?;
            if batch.is_empty() {
                break;
            }
            ensure!(plus.len() < 10_000, "{path}: readdirplus does not end");
            plus.extend(batch);
        }
        fs.releasedir(dir, fh).map_err(|err| ctx("releasedir", err))?;
        ensure!(
            plus.iter().map(|(d, _)| d).eq(all.iter()),
            "{path}: readdirplus entries {plus:?} differ from readdir {all:?}"
        );
        for (d, a) in &plus {
            let mut now = fs.getattr(d.ino).map_err(|err| ctx("getattr", err))?;
            if self.store.is_some() {
                // Eviction runs in the background and moves st_blocks between "allocated here"
                // and "stored"; everything else must match.
                now.blocks = a.blocks;
            }
            ensure!(*a == now, "{path}: readdirplus attr of {:?} is {a:?}, getattr says {now:?}", d.name);
        }
        let dots: Vec<_> = all.iter().filter(|d| d.name == b"." || d.name == b"..").collect();
        ensure!(dots.len() == 2, "{path}: readdir has {} dot entries: {all:?}", dots.len());
        for d in dots {
            let want = if d.name == b"." { dir } else { parent };
            ensure!(
                d.ino == want && d.kind == FileKind::Dir,
                "{path}: readdir entry {:?} has inode {} kind {:?}, expected inode {want}",
                String::from_utf8_lossy(&d.name),
                d.ino,
                d.kind
            );
        }
        Ok(all
            .into_iter()
            .map(|d| DirEnt { name: String::from_utf8_lossy(&d.name).into_owned(), ino: d.ino, kind: d.kind })
            .collect())
    }

    /// The observable state, with the inode behind every path and handle and its `Attr`.
    pub(crate) fn snapshot(&self) -> Result<RealState, String> {
        let fs = self.fs();
        let mut raw = Vec::new();
        let mut attrs = BTreeMap::new();
        let root = fs.getattr(ROOT_INO).map_err(|err| format!("getattr of /: {err}"))?;
        let mut stack = vec![("/".to_string(), root, ROOT_INO)];
        while let Some((path, attr, parent)) = stack.pop() {
            let mut entry = self.entry(&attr)?;
            if attr.kind == FileKind::Dir {
                let dotdot = fs.lookup(attr.ino, b"..").map_err(|err| format!("lookup {path}/..: {err}"))?.ino;
                ensure!(dotdot == parent, "lookup {path}/.. gives inode {dotdot}, expected {parent}");
                let list = self.listing(attr.ino, parent, &path)?;
                let mut names: Vec<String> = list.iter().map(|d| d.name.clone()).collect();
                names.sort();
                entry.listing = Some(names);
                for d in list.into_iter().filter(|d| d.name != "." && d.name != "..") {
                    let child = join(&path, &d.name);
                    let a = fs.lookup(attr.ino, d.name.as_bytes()).map_err(|err| format!("lookup {child}: {err}"))?;
                    ensure!(
                        a.ino == d.ino && a.kind == d.kind,
                        "{child}: readdir says inode {} {:?}, lookup says {} {:?}",
                        d.ino,
                        d.kind,
                        a.ino,
                        a.kind
                    );
                    let mut g = fs.getattr(a.ino).map_err(|err| format!("getattr {child}: {err}"))?;
                    if self.store.is_some() {
                        g.blocks = a.blocks; // see `listing`: eviction moves st_blocks
                    }
                    ensure!(g == a, "{child}: lookup gives {a:?}, getattr gives {g:?}");
                    stack.push((child, a, attr.ino));
                }
            }
            raw.push((path.clone(), attr.ino, entry));
            let mut attr = attr;
            if self.store.is_some() {
                attr.blocks = 0; // see `listing`: eviction moves st_blocks
            }
            attrs.insert(path, attr);
        }
        let mut handles = Vec::new();
        let mut by_ino: HashMap<Ino, Attr> = attrs.values().map(|a: &Attr| (a.ino, a.clone())).collect();
        for &(ino, fh) in &self.handles {
            let attr = fs.getattr(ino).map_err(|err| format!("getattr of open inode {ino}: {err}"))?;
            by_ino.insert(ino, attr.clone());
            let mut entry = self.entry(&attr)?;
            // And through the handle itself, which is what a program holding it uses.
            let via = fs.read(ino, fh, 0, attr.size as u32 + 1).map_err(|err| format!("read handle {fh}: {err}"))?;
            ensure!(
                entry.data.as_ref() == Some(&Bytes(via.clone())),
                "inode {ino}: handle {fh} reads {:?}",
                Bytes(via)
            );
            entry.listing = None;
            handles.push((ino, entry));
        }
        let stats = fs.stats();
        let (snap, paths, handle_inos) = finish(raw, handles, stats.inodes, stats.open_files);
        Ok(RealState { snap, paths, handle_inos, attrs, by_ino })
    }

    /// Regular files under the hot tier's `data/` directory.
    pub(crate) fn data_files(&self) -> usize {
        fn count(p: &Path) -> usize {
            let Ok(rd) = std::fs::read_dir(p) else { return 0 };
            rd.flatten()
                .map(|d| match d.file_type() {
                    Ok(t) if t.is_dir() => count(&d.path()),
                    Ok(t) if t.is_file() => 1,
                    _ => 0,
                })
                .sum()
        }
        count(&self.dir.path().join("data"))
    }
}

/// What [`Real::snapshot`] sees.
pub(crate) struct RealState {
    pub(crate) snap: Snapshot,
    /// (path, inode number), sorted by path.
    pub(crate) paths: Vec<(String, u64)>,
    /// The inode of each open handle.
    pub(crate) handle_inos: Vec<u64>,
    /// Every path's full attributes.
    pub(crate) attrs: BTreeMap<String, Attr>,
    /// The attributes of every inode reachable by a path or a handle.
    pub(crate) by_ino: HashMap<Ino, Attr>,
}

pub(crate) struct DirEnt {
    pub(crate) name: String,
    pub(crate) ino: Ino,
    pub(crate) kind: FileKind,
}
