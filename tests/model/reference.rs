//! The reference model: an in-memory POSIX filesystem written from the rules, not from the implementation, with what each operation must return.

use super::*;

pub(crate) type Id = usize;
pub(crate) const MROOT: Id = 0;

#[derive(Debug, Clone)]
pub(crate) enum Body {
    File(Vec<u8>),
    Dir(BTreeMap<String, Id>),
    Symlink(String),
    /// A FIFO, socket or device node, with its rdev.
    Special(FileKind, u32),
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) body: Body,
    pub(crate) perm: u16,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) xattrs: BTreeMap<String, Vec<u8>>,
}

impl Node {
    pub(crate) fn kind(&self) -> FileKind {
        match self.body {
            Body::File(_) => FileKind::File,
            Body::Dir(_) => FileKind::Dir,
            Body::Symlink(_) => FileKind::Symlink,
            Body::Special(kind, _) => kind,
        }
    }
}

/// What the model says an operation does: skip it (the harness, standing in for the kernel,
/// would not send it: e.g. `open` of a symlink follows it), succeed with this output, or fail
/// with one of these errnos.
#[derive(Debug)]
pub(crate) enum Expect {
    Skip,
    Ok(Vec<u8>),
    Err(Vec<i32>),
    /// `lseek(SEEK_DATA / SEEK_HOLE)` from `offset` (< size) in a file holding `data`: where
    /// holes are depends on the disk, so [`seek_ok`] checks the answer is consistent.
    Seek {
        data: Vec<u8>,
        offset: u64,
        hole: bool,
    },
}

/// Whether an lseek answer fits the contents: SEEK_DATA skips only zeros, and finds data
/// (or ENXIO when only zeros follow); SEEK_HOLE lands on a zero byte or at the end.
pub(crate) fn seek_ok(data: &[u8], offset: u64, hole: bool, got: &Result<Vec<u8>, i32>) -> bool {
    let zeros = |from: u64, to: u64| data[from as usize..to as usize].iter().all(|&b| b == 0);
    let size = data.len() as u64;
    match got {
        Err(e) => !hole && *e == libc::ENXIO && zeros(offset, size),
        Ok(bytes) => {
            let Ok(raw) = <[u8; 8]>::try_from(bytes.as_slice()) else { return false };
            let Ok(r) = u64::try_from(i64::from_le_bytes(raw)) else { return false };
            if hole {
                (offset..=size).contains(&r) && (r == size || data[r as usize] == 0)
            } else {
                (offset..size).contains(&r) && zeros(offset, r)
            }
        }
    }
}

pub(crate) type M<T> = Result<T, Vec<i32>>;

/// Not an errno: marks a SEEK_DATA/SEEK_HOLE answer that `seek_ok` checks against the model.
pub(crate) const SEEK_CHECK: i32 = -1;

pub(crate) fn fail<T>(errno: i32) -> M<T> {
    Err(vec![errno])
}

/// Which fallocate modes the disk under the data directory supports (ext4 and xfs: all).
pub(crate) fn falloc_support() -> &'static [bool; 6] {
    static SUPPORT: OnceLock<[bool; 6]> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        FALLOCS.map(|mode| {
            let file = std::fs::File::create(dir.path().join(format!("{mode:?}"))).expect("probe file");
            file.set_len(16384).expect("probe size");
            // SAFETY: plain syscall on an owned descriptor.
            unsafe { libc::fallocate(file.as_raw_fd(), mode.bits(), 4096, 4096) == 0 }
        })
    })
}

pub(crate) struct Model {
    pub(crate) nodes: HashMap<Id, Node>,
    pub(crate) next_id: Id,
    /// Open handles, by the inode they hold (same order as the implementation's).
    pub(crate) handles: Vec<Id>,
    /// Whose (mtime, ctime) the last successful op changes; other inodes keep theirs.
    pub(crate) touched: HashMap<Id, (Change, Change)>,
}

/// Whether an operation changes a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Change {
    Never,
    /// POSIX leaves it open (or Linux file systems differ).
    May,
    Must,
}

use Change::{May, Must, Never};

impl Model {
    pub(crate) fn new() -> Model {
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let root = Node { body: Body::Dir(BTreeMap::new()), perm: 0o755, uid, gid, xattrs: BTreeMap::new() };
        Model { nodes: HashMap::from([(MROOT, root)]), next_id: 1, handles: Vec::new(), touched: HashMap::new() }
    }

    pub(crate) fn node(&self, id: Id) -> &Node {
        &self.nodes[&id]
    }

    pub(crate) fn node_mut(&mut self, id: Id) -> &mut Node {
        self.nodes.get_mut(&id).expect("live model node")
    }

    pub(crate) fn children(&self, id: Id) -> Option<&BTreeMap<String, Id>> {
        match &self.node(id).body {
            Body::Dir(c) => Some(c),
            _ => None,
        }
    }

    pub(crate) fn children_mut(&mut self, id: Id) -> &mut BTreeMap<String, Id> {
        match &mut self.node_mut(id).body {
            Body::Dir(c) => c,
            _ => panic!("model: {id} is not a directory"),
        }
    }

    pub(crate) fn data_mut(&mut self, id: Id) -> &mut Vec<u8> {
        match &mut self.node_mut(id).body {
            Body::File(d) => d,
            _ => panic!("model: {id} is not a file"),
        }
    }

    pub(crate) fn is_dir(&self, id: Id) -> bool {
        self.children(id).is_some()
    }

    pub(crate) fn alloc(&mut self, node: Node) -> Id {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        id
    }

    /// The directory holding directory `id` (None for the root).
    pub(crate) fn parent_of(&self, id: Id) -> Option<Id> {
        self.nodes
            .iter()
            .find(|(_, n)| matches!(&n.body, Body::Dir(c) if c.values().any(|&v| v == id)))
            .map(|(&p, _)| p)
    }

    /// True if `anc` is `d` or one of its ancestors.
    pub(crate) fn is_ancestor_or_self(&self, anc: Id, mut d: Id) -> bool {
        loop {
            if d == anc {
                return true;
            }
            match self.parent_of(d) {
                Some(p) => d = p,
                None => return false,
            }
        }
    }

    pub(crate) fn nlink(&self, id: Id) -> u32 {
        match &self.node(id).body {
            Body::Dir(c) => 2 + c.values().filter(|&&v| self.is_dir(v)).count() as u32,
            _ => self
                .nodes
                .values()
                .filter_map(|n| match &n.body {
                    Body::Dir(c) => Some(c.values().filter(|&&v| v == id).count() as u32),
                    _ => None,
                })
                .sum(),
        }
    }

    /// Every path below the root (relative, sorted) and what it names.
    pub(crate) fn paths(&self) -> Vec<(String, Id)> {
        let mut out = Vec::new();
        let mut stack = vec![(String::new(), MROOT)];
        while let Some((path, id)) = stack.pop() {
            for (name, &child) in self.children(id).into_iter().flatten() {
                let name = token(name);
                let p = if path.is_empty() { name } else { format!("{path}/{name}") };
                stack.push((p.clone(), child));
                out.push((p, child));
            }
        }
        out.sort();
        out
    }

    /// `op` with its selectors resolved: paths (see [`Model::pick`]), and the xattr name `?` of
    /// `RemoveXattr`, which becomes the first xattr the entry has (`user.a` if none).
    pub(crate) fn concretize(&self, op: &Op) -> Op {
        let mut op = op.map_paths(|p| self.pick(p));
        if let Op::RemoveXattr { at, name } = &mut op {
            if *name == "?" {
                let first = self.existing(at).ok().and_then(|id| self.node(id).xattrs.keys().next().cloned());
                *name = first.map_or("user.a", intern);
            }
        }
        op
    }

    /// Resolves a path selector against the current tree; plain paths pass through.
    /// `?aK`: the K-th existing entry; `?fK`: the K-th regular file; `?DK`: the K-th directory;
    /// `?xK`: the K-th entry with an xattr;
    /// `?dK/name`: `name` inside the K-th directory counting the root (indices wrap around).
    /// With nothing to pick, a selector falls back to `a`.
    pub(crate) fn pick(&self, sel: &'static str) -> &'static str {
        let Some(rest) = sel.strip_prefix('?') else { return sel };
        let (class, rest) = rest.split_at(1);
        let (index, name) = match rest.split_once('/') {
            Some((i, name)) => (i, Some(name)),
            None => (rest, None),
        };
        let k: usize = index.parse().expect("selector index");
        let mut paths = self.paths();
        match class {
            "a" => {}
            "f" => paths.retain(|(_, id)| self.node(*id).kind() == FileKind::File),
            "D" | "d" => paths.retain(|(_, id)| self.is_dir(*id)),
            "x" => paths.retain(|(_, id)| !self.node(*id).xattrs.is_empty()),
            _ => panic!("bad selector {sel}"),
        }
        if class == "d" {
            paths.insert(0, (String::new(), MROOT));
        }
        let Some((path, _)) = (!paths.is_empty()).then(|| &paths[k % paths.len()]) else { return "a" };
        match name {
            Some(name) if path.is_empty() => intern(name.to_string()),
            Some(name) => intern(format!("{path}/{name}")),
            None => intern(path.clone()),
        }
    }

    /// Walks `comps` from the root, as path resolution does.
    pub(crate) fn resolve(&self, comps: &[&str]) -> M<Id> {
        let mut cur = MROOT;
        for c in comps {
            let Some(children) = self.children(cur) else { return fail(libc::ENOTDIR) };
            cur = *children.get(*c).ok_or_else(|| vec![libc::ENOENT])?;
        }
        Ok(cur)
    }

    /// The parent directory of `path`, its last component and what that names.
    pub(crate) fn locate<'p>(&self, path: &'p str) -> M<(Id, &'p str, Option<Id>)> {
        let (dir, name) = split(path);
        let parent = self.resolve(&dir)?;
        let Some(children) = self.children(parent) else { return fail(libc::ENOTDIR) };
        Ok((parent, name, children.get(name).copied()))
    }

    pub(crate) fn existing(&self, path: &str) -> M<Id> {
        let (_, name, id) = self.locate(path)?;
        name_ok(name)?;
        id.ok_or_else(|| vec![libc::ENOENT])
    }

    /// The file `path` names for an operation that opens it: EISDIR for a directory, None
    /// (skip) for a symlink (the kernel would follow it) or a special file (the kernel opens
    /// FIFOs and devices itself, without asking the file system).
    pub(crate) fn file_at(&self, path: &str) -> M<Option<Id>> {
        let id = self.existing(path)?;
        match self.node(id).kind() {
            FileKind::Dir => fail(libc::EISDIR),
            FileKind::File => Ok(Some(id)),
            _ => Ok(None),
        }
    }

    /// Whether root may set or remove xattr `name` of `id`: `user.*` only on regular files and
    /// directories (EPERM), `trusted.*` and `security.*` anywhere, other namespaces not at all.
    pub(crate) fn xattr_ok(&self, id: Id, name: &str) -> M<()> {
        if name.starts_with("user.") {
            if !matches!(self.node(id).kind(), FileKind::File | FileKind::Dir) {
                return fail(libc::EPERM);
            }
        } else if !name.starts_with("trusted.") && !name.starts_with("security.") {
            return fail(libc::EOPNOTSUPP);
        }
        Ok(())
    }

    pub(crate) fn handle(&self, h: usize) -> Option<Id> {
        (!self.handles.is_empty()).then(|| self.handles[h % self.handles.len()])
    }

    pub(crate) fn new_node(&self, parent: Id, body: Body, perm: u32) -> Node {
        let dir = self.node(parent);
        // setgid directory: new entries take its group, new directories its setgid bit.
        let setgid = u32::from(dir.perm) & libc::S_ISGID != 0;
        let mut perm = perm & 0o7777;
        if setgid && matches!(body, Body::Dir(_)) {
            perm |= libc::S_ISGID;
        }
        Node {
            body,
            perm: perm as u16,
            uid: ME.uid,
            gid: if setgid { dir.gid } else { ME.gid },
            xattrs: BTreeMap::new(),
        }
    }

    pub(crate) fn write(&mut self, id: Id, offset: u64, bytes: &[u8]) {
        let data = self.data_mut(id);
        let (start, end) = (offset as usize, offset as usize + bytes.len());
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        // Setuid/setgid stay: the writer is root (CAP_FSETID), and clearing them for others is
        // the kernel's job (file_remove_privs sends a setattr before the write).
    }

    /// A `write` of `len` pattern bytes: one of zero bytes does nothing at all (POSIX), not
    /// even at an offset past the end.
    pub(crate) fn write_op(&mut self, id: Id, offset: u64, len: usize, seed: u8) -> M<Option<Vec<u8>>> {
        // Cut short at the size limit, EFBIG at or past it (as ext4).
        let len = if len > 0 {
            size_ok(offset + 1)?;
            let len = len.min((tierfs::vfs::MAX_FILE_SIZE - offset) as usize);
            self.write(id, offset, &pattern(seed, len));
            self.touch(id, Must, Must);
            len
        } else {
            0
        };
        Ok(Some((len as u32).to_le_bytes().to_vec()))
    }

    pub(crate) fn truncate(&mut self, id: Id, size: u64) {
        self.data_mut(id).resize(size as usize, 0);
    }

    pub(crate) fn fallocate(&mut self, id: Id, mode: Falloc, offset: u64, len: u64) -> M<()> {
        let unsupported = mode == Falloc::PunchHoleNoKeepSize || !falloc_support()[mode as usize];
        match (unsupported, size_ok(offset + len).is_err()) {
            (true, true) => return Err(vec![libc::EFBIG, libc::EOPNOTSUPP]),
            (true, false) => return fail(libc::EOPNOTSUPP),
            (false, true) => return fail(libc::EFBIG),
            (false, false) => {}
        }
        let data = self.data_mut(id);
        let (start, end) = (offset as usize, (offset + len) as usize);
        let zero = |data: &mut Vec<u8>| {
            let stop = end.min(data.len());
            if start < stop {
                data[start..stop].fill(0);
            }
        };
        match mode {
            // Plain allocation keeps the bytes it covers and extends the size.
            Falloc::Alloc => {}
            Falloc::ZeroRange | Falloc::PunchHole | Falloc::ZeroRangeKeepSize => zero(data),
            Falloc::AllocKeepSize => {}
            Falloc::PunchHoleNoKeepSize => unreachable!("refused above"),
        }
        if matches!(mode, Falloc::Alloc | Falloc::ZeroRange) && data.len() < end {
            data.resize(end, 0);
        }
        Ok(())
    }

    /// Records that `id`'s mtime and ctime change as `m` and `c` say.
    pub(crate) fn touch(&mut self, id: Id, m: Change, c: Change) {
        let t = self.touched.entry(id).or_insert((Never, Never));
        *t = (t.0.max(m), t.1.max(c));
    }

    /// A directory entry was added or removed in `dir`.
    pub(crate) fn touch_dir(&mut self, dir: Id) {
        self.touch(dir, Must, Must);
    }

    pub(crate) fn apply(&mut self, op: &Op) -> Expect {
        self.touched.clear();
        match self.apply_inner(op) {
            Ok(Some(out)) => Expect::Ok(out),
            Ok(None) => Expect::Skip,
            Err(errs) if errs == [SEEK_CHECK] => {
                let Op::SeekH { h, offset, hole } = *op else { unreachable!("only SeekH defers") };
                let id = self.handle(h).expect("SeekH found a handle");
                let Body::File(data) = &self.node(id).body else { unreachable!("handles are files") };
                Expect::Seek { data: data.clone(), offset, hole }
            }
            Err(errs) => Expect::Err(errs),
        }
    }

    /// Applies `op`; on failure the model is left unchanged.
    pub(crate) fn apply_inner(&mut self, op: &Op) -> M<Option<Vec<u8>>> {
        let done = Ok(Some(Vec::new()));
        match *op {
            Op::Create { at, mode, excl, trunc, keep_open } => {
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                let id = match existing {
                    None => {
                        let node = self.new_node(parent, Body::File(Vec::new()), mode & !UMASK);
                        let id = self.alloc(node);
                        self.children_mut(parent).insert(name.to_string(), id);
                        self.touch_dir(parent);
                        id
                    }
                    Some(_) if excl => return fail(libc::EEXIST),
                    Some(id) => match self.node(id).kind() {
                        FileKind::Dir => return fail(libc::EISDIR),
                        FileKind::File => {
                            if trunc {
                                self.truncate(id, 0);
                                self.touch(id, May, May);
                            }
                            id
                        }
                        // The kernel would follow a symlink, and opens special files itself.
                        _ => return Ok(None),
                    },
                };
                if keep_open {
                    self.handles.push(id);
                }
                done
            }
            Op::Mkdir { at, mode } => {
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                if existing.is_some() {
                    return fail(libc::EEXIST);
                }
                let node = self.new_node(parent, Body::Dir(BTreeMap::new()), mode & !UMASK);
                let id = self.alloc(node);
                self.children_mut(parent).insert(name.to_string(), id);
                self.touch_dir(parent);
                done
            }
            Op::Unlink { at } => {
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                let id = existing.ok_or_else(|| vec![libc::ENOENT])?;
                if self.is_dir(id) {
                    return fail(libc::EISDIR);
                }
                self.children_mut(parent).remove(name);
                self.touch_dir(parent);
                self.touch(id, Never, Must);
                done
            }
            Op::Rmdir { at } => {
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                let id = existing.ok_or_else(|| vec![libc::ENOENT])?;
                match self.children(id) {
                    None => return fail(libc::ENOTDIR),
                    Some(c) if !c.is_empty() => return fail(libc::ENOTEMPTY),
                    Some(_) => {}
                }
                self.children_mut(parent).remove(name);
                self.touch_dir(parent);
                done
            }
            Op::Rename { from, to, how } => self.rename(from, to, how).map(|()| Some(Vec::new())),
            Op::Link { from, to } => {
                let src = self.existing(from)?;
                let (parent, name, existing) = self.locate(to)?;
                name_ok(name)?;
                let mut errs = Vec::new();
                if self.is_dir(src) {
                    errs.push(libc::EPERM);
                }
                if existing.is_some() {
                    errs.push(libc::EEXIST);
                }
                if !errs.is_empty() {
                    return Err(errs);
                }
                self.children_mut(parent).insert(name.to_string(), src);
                self.touch_dir(parent);
                self.touch(src, Never, Must);
                done
            }
            Op::Symlink { at, target } => {
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                if existing.is_some() {
                    return fail(libc::EEXIST);
                }
                let node = self.new_node(parent, Body::Symlink(target.to_string()), 0o777);
                let id = self.alloc(node);
                self.children_mut(parent).insert(name.to_string(), id);
                self.touch_dir(parent);
                done
            }
            Op::Mknod { at, kind, perm, rdev } => {
                let kind = kind.file_kind();
                let (parent, name, existing) = self.locate(at)?;
                name_ok(name)?;
                if existing.is_some() {
                    return fail(libc::EEXIST);
                }
                let body = match kind {
                    FileKind::File => Body::File(Vec::new()),
                    FileKind::CharDev | FileKind::BlockDev => Body::Special(kind, rdev),
                    _ => Body::Special(kind, 0), // rdev means nothing for FIFOs and sockets
                };
                let node = self.new_node(parent, body, perm & !UMASK);
                let id = self.alloc(node);
                self.children_mut(parent).insert(name.to_string(), id);
                self.touch_dir(parent);
                done
            }
            Op::Write { at, offset, len, seed } => {
                let Some(id) = self.file_at(at)? else { return Ok(None) };
                self.write_op(id, offset, len, seed)
            }
            Op::Truncate { at, size } => {
                let id = self.existing(at)?;
                match self.node(id).kind() {
                    FileKind::File => {}
                    FileKind::Dir => return fail(libc::EISDIR),
                    FileKind::Symlink => return Ok(None), // truncate follows symlinks
                    _ => return fail(libc::EINVAL),
                }
                size_ok(size)?;
                self.truncate(id, size);
                self.touch(id, Must, Must);
                done
            }
            Op::Chmod { at, mode } => {
                let id = self.existing(at)?;
                if self.node(id).kind() == FileKind::Symlink {
                    return Ok(None); // chmod follows symlinks
                }
                self.node_mut(id).perm = (mode & 0o7777) as u16;
                self.touch(id, Never, Must);
                done
            }
            Op::Utimens { at, atime, mtime } => {
                let id = self.existing(at)?;
                self.touch(id, May, Must); // mtime as given, which may be what it was
                Ok(Some(times_bytes(atime, mtime)))
            }
            Op::SetXattr { at, name, value, flags } => {
                let id = self.existing(at)?;
                self.xattr_ok(id, name)?;
                let exists = self.node(id).xattrs.contains_key(name);
                if flags == XFlags::CreateOnly && exists {
                    return fail(libc::EEXIST);
                }
                if flags == XFlags::ReplaceOnly && !exists {
                    return fail(libc::ENODATA);
                }
                self.node_mut(id).xattrs.insert(name.to_string(), value.as_bytes().to_vec());
                self.touch(id, Never, Must);
                done
            }
            Op::RemoveXattr { at, name } => {
                let id = self.existing(at)?;
                self.xattr_ok(id, name)?;
                if self.node_mut(id).xattrs.remove(name).is_none() {
                    return fail(libc::ENODATA);
                }
                self.touch(id, Never, Must);
                done
            }
            Op::Fallocate { at, mode, offset, len } => {
                let Some(id) = self.file_at(at)? else { return Ok(None) };
                self.fallocate(id, mode, offset, len)?;
                self.touch(id, May, May);
                done
            }
            Op::Open { at, trunc } => {
                let Some(id) = self.file_at(at)? else { return Ok(None) };
                if trunc {
                    self.truncate(id, 0);
                    self.touch(id, May, May);
                }
                self.handles.push(id);
                done
            }
            Op::OpenUnlink { at } => {
                let (parent, name, _) = self.locate(at)?;
                let Some(id) = self.file_at(at)? else { return Ok(None) };
                self.handles.push(id);
                self.children_mut(parent).remove(name);
                self.touch_dir(parent);
                self.touch(id, Never, Must);
                done
            }
            Op::Read { h, offset, len } => {
                let Some(id) = self.handle(h) else { return Ok(None) };
                let Body::File(data) = &self.node(id).body else { panic!("model: handle on a non-file") };
                let start = (offset as usize).min(data.len());
                let end = (offset as usize + len as usize).min(data.len());
                Ok(Some(data[start..end].to_vec()))
            }
            Op::WriteH { h, offset, len, seed } => {
                let Some(id) = self.handle(h) else { return Ok(None) };
                self.write_op(id, offset, len, seed)
            }
            Op::TruncateH { h, size } => {
                let Some(id) = self.handle(h) else { return Ok(None) };
                size_ok(size)?;
                self.truncate(id, size);
                self.touch(id, Must, Must);
                done
            }
            Op::FallocateH { h, mode, offset, len } => {
                let Some(id) = self.handle(h) else { return Ok(None) };
                self.fallocate(id, mode, offset, len)?;
                self.touch(id, May, May);
                done
            }
            Op::CopyH { h_in, off_in, h_out, off_out, len } => {
                let (Some(src), Some(dst)) = (self.handle(h_in), self.handle(h_out)) else { return Ok(None) };
                let Body::File(data) = &self.node(src).body else { panic!("model: handle on a non-file") };
                // Linux clamps the length to the source's end, then refuses overlapping ranges
                // within one file.
                let count = len.min((data.len() as u64).saturating_sub(off_in));
                if src == dst && count > 0 && off_out < off_in + count && off_in < off_out + count {
                    return fail(libc::EINVAL);
                }
                if count > 0 {
                    let bytes = data[off_in as usize..(off_in + count) as usize].to_vec();
                    self.write(dst, off_out, &bytes);
                    self.touch(dst, Must, Must);
                }
                Ok(Some(count.to_le_bytes().to_vec()))
            }
            Op::SeekH { h, offset, .. } => {
                let Some(id) = self.handle(h) else { return Ok(None) };
                let Body::File(data) = &self.node(id).body else { panic!("model: handle on a non-file") };
                if offset >= data.len() as u64 {
                    return fail(libc::ENXIO);
                }
                Err(vec![SEEK_CHECK]) // checked by `seek_ok` against the contents
            }
            Op::Release { h } => {
                if self.handles.is_empty() {
                    return Ok(None);
                }
                let n = self.handles.len();
                self.handles.remove(h % n);
                done
            }
            Op::Reopen { .. } => {
                self.handles.clear();
                done
            }
        }
    }

    pub(crate) fn rename(&mut self, from: &str, to: &str, how: How) -> M<()> {
        // Both paths are walked (old first) before the source must exist.
        let (sp, sname, src) = self.locate(from)?;
        let (dp, dname, dst) = self.locate(to)?;
        name_ok(sname)?;
        if name_ok(dname).is_err() {
            // Linux looks the source up first; an implementation may check the new name first.
            return Err(if src.is_none() { vec![libc::ENOENT, libc::ENAMETOOLONG] } else { vec![libc::ENAMETOOLONG] });
        }
        let src = src.ok_or_else(|| vec![libc::ENOENT])?;
        let src_dir = self.is_dir(src);
        let exchange = how == How::Exchange;
        // Every rule the call breaks; Linux reports one of them (its order of checks is not
        // the contract).
        let mut errs = Vec::new();
        if how == How::NoReplace && dst.is_some() {
            errs.push(libc::EEXIST);
        }
        if exchange && dst.is_none() {
            errs.push(libc::ENOENT);
        }
        if src_dir && self.is_ancestor_or_self(src, dp) {
            errs.push(libc::EINVAL); // a directory into its own subtree
        }
        if let Some(dst) = dst {
            let dst_dir = self.is_dir(dst);
            if dst_dir && self.is_ancestor_or_self(dst, sp) {
                // The target is an ancestor of the source.
                errs.push(if exchange { libc::EINVAL } else { libc::ENOTEMPTY });
            }
            if !exchange && dst != src {
                if src_dir && !dst_dir {
                    errs.push(libc::ENOTDIR);
                }
                if !src_dir && dst_dir {
                    errs.push(libc::EISDIR);
                }
                if dst_dir && self.children(dst).is_some_and(|c| !c.is_empty()) {
                    errs.push(libc::ENOTEMPTY);
                }
            }
        }
        if !errs.is_empty() {
            errs.sort_unstable();
            errs.dedup();
            return Err(errs);
        }
        if dst == Some(src) {
            return Ok(()); // two names of one inode: nothing happens
        }
        if exchange {
            let dst = dst.expect("checked above");
            self.children_mut(sp).insert(sname.to_string(), dst);
            self.children_mut(dp).insert(dname.to_string(), src);
        } else {
            self.children_mut(sp).remove(sname);
            self.children_mut(dp).insert(dname.to_string(), src);
            if how == How::Whiteout {
                // What overlayfs reads as "deleted here": a character device 0:0, mode 0.
                let whiteout = self.new_node(sp, Body::Special(FileKind::CharDev, 0), 0);
                let id = self.alloc(whiteout);
                self.children_mut(sp).insert(sname.to_string(), id);
            }
        }
        self.touch_dir(sp);
        self.touch_dir(dp);
        // Linux file systems update the ctime of moved and replaced inodes; POSIX leaves it
        // open, and a moved directory's ".." change may count as a modification.
        for id in [Some(src), dst].into_iter().flatten() {
            self.touch(id, May, May);
        }
        Ok(())
    }

    /// Forgets inodes with no name and no open handle.
    pub(crate) fn gc(&mut self) {
        let mut live: HashSet<Id> = HashSet::new();
        let mut stack: Vec<Id> = vec![MROOT];
        stack.extend(self.handles.iter().copied());
        while let Some(id) = stack.pop() {
            if live.insert(id) {
                if let Some(c) = self.children(id) {
                    stack.extend(c.values().copied());
                }
            }
        }
        self.nodes.retain(|id, _| live.contains(id));
    }

    pub(crate) fn entry(&self, id: Id) -> EntrySnap {
        let n = self.node(id);
        let (size, data, target, listing) = match &n.body {
            Body::File(d) => (Some(d.len() as u64), Some(Bytes(d.clone())), None, None),
            Body::Symlink(t) => (Some(t.len() as u64), None, Some(t.clone()), None),
            Body::Special(..) => (Some(0), None, None, None),
            Body::Dir(c) => {
                let mut names: Vec<String> = c.keys().cloned().collect();
                names.extend([".".to_string(), "..".to_string()]);
                names.sort();
                (None, None, None, Some(names))
            }
        };
        EntrySnap {
            kind: n.kind(),
            perm: Perm(n.perm),
            rdev: if let Body::Special(_, rdev) = n.body { rdev } else { 0 },
            nlink: self.nlink(id),
            uid: n.uid,
            gid: n.gid,
            size,
            data,
            target,
            xattrs: n.xattrs.iter().map(|(k, v)| (k.clone(), Bytes(v.clone()))).collect(),
            listing,
            same_as: String::new(),
        }
    }

    /// The observable state, plus (path, inode) and the inodes of the open handles.
    pub(crate) fn snapshot(&self) -> (Snapshot, Vec<(String, u64)>, Vec<u64>) {
        let mut raw = Vec::new();
        let mut stack = vec![("/".to_string(), MROOT)];
        while let Some((path, id)) = stack.pop() {
            if let Some(c) = self.children(id) {
                for (name, &child) in c {
                    stack.push((join(&path, name), child));
                }
            }
            raw.push((path, id as u64, self.entry(id)));
        }
        let handles = self.handles.iter().map(|&id| (id as u64, self.entry(id))).collect();
        let open: HashSet<Id> = self.handles.iter().copied().collect();
        finish(raw, handles, self.nodes.len() as u64, open.len() as u64)
    }
}

pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

pub(crate) fn times_bytes(atime: Timestamp, mtime: Timestamp) -> Vec<u8> {
    let mut v = Vec::new();
    for t in [atime, mtime] {
        v.extend_from_slice(&t.secs.to_le_bytes());
        v.extend_from_slice(&t.nanos.to_le_bytes());
    }
    v
}
