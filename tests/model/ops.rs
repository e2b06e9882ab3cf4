//! The operations the generator draws and the runner applies, and the small helpers on names and sizes.

use super::*;

/// How a rename is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    Plain,
    NoReplace,
    Exchange,
    /// `RENAME_WHITEOUT`: the source name keeps a whiteout (character device 0:0).
    Whiteout,
}

/// An `fallocate` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Falloc {
    Alloc,
    AllocKeepSize,
    PunchHole,
    /// `FALLOC_FL_PUNCH_HOLE` without `KEEP_SIZE`: Linux refuses it with EOPNOTSUPP.
    PunchHoleNoKeepSize,
    ZeroRange,
    ZeroRangeKeepSize,
}

pub(crate) const FALLOCS: [Falloc; 6] = [
    Falloc::Alloc,
    Falloc::AllocKeepSize,
    Falloc::PunchHole,
    Falloc::PunchHoleNoKeepSize,
    Falloc::ZeroRange,
    Falloc::ZeroRangeKeepSize,
];

impl Falloc {
    pub(crate) fn bits(self) -> i32 {
        match self {
            Falloc::Alloc => 0,
            Falloc::AllocKeepSize => libc::FALLOC_FL_KEEP_SIZE,
            Falloc::PunchHole => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            Falloc::PunchHoleNoKeepSize => libc::FALLOC_FL_PUNCH_HOLE,
            Falloc::ZeroRange => libc::FALLOC_FL_ZERO_RANGE,
            Falloc::ZeroRangeKeepSize => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        }
    }
}

/// What `mknod` makes (not `FileKind`, whose `Symlink` would clash with `Op::Symlink` in
/// pasted ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    Regular,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl NodeKind {
    pub(crate) fn file_kind(self) -> FileKind {
        match self {
            NodeKind::Regular => FileKind::File,
            NodeKind::Fifo => FileKind::Fifo,
            NodeKind::Socket => FileKind::Socket,
            NodeKind::CharDev => FileKind::CharDev,
            NodeKind::BlockDev => FileKind::BlockDev,
        }
    }
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XFlags {
    Any,
    // Not `Create`/`Replace`: pasted failing ops glob-import these next to `Op::*`.
    CreateOnly,
    ReplaceOnly,
}

impl XFlags {
    pub(crate) fn bits(self) -> i32 {
        match self {
            XFlags::Any => 0,
            XFlags::CreateOnly => libc::XATTR_CREATE,
            XFlags::ReplaceOnly => libc::XATTR_REPLACE,
        }
    }
}

/// One step of a test case. Paths are relative to the root (`"d1/a"`); `h` picks an open
/// handle (modulo the number open; the step is skipped when none is open).
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Create {
        at: &'static str,
        mode: u32,
        excl: bool,
        trunc: bool,
        keep_open: bool,
    },
    Mkdir {
        at: &'static str,
        mode: u32,
    },
    Unlink {
        at: &'static str,
    },
    Rmdir {
        at: &'static str,
    },
    Rename {
        from: &'static str,
        to: &'static str,
        how: How,
    },
    Link {
        from: &'static str,
        to: &'static str,
    },
    Symlink {
        at: &'static str,
        target: &'static str,
    },
    Mknod {
        at: &'static str,
        kind: NodeKind,
        perm: u32,
        rdev: u32,
    },
    Write {
        at: &'static str,
        offset: u64,
        len: usize,
        seed: u8,
    },
    Truncate {
        at: &'static str,
        size: u64,
    },
    Chmod {
        at: &'static str,
        mode: u32,
    },
    Utimens {
        at: &'static str,
        atime: Timestamp,
        mtime: Timestamp,
    },
    SetXattr {
        at: &'static str,
        name: &'static str,
        value: &'static str,
        flags: XFlags,
    },
    RemoveXattr {
        at: &'static str,
        name: &'static str,
    },
    Fallocate {
        at: &'static str,
        mode: Falloc,
        offset: u64,
        len: u64,
    },
    /// Opens read-write (optionally with `O_TRUNC`) and keeps the handle.
    Open {
        at: &'static str,
        trunc: bool,
    },
    /// Opens read-write, keeps the handle, then unlinks the name: the handle is an orphan's.
    OpenUnlink {
        at: &'static str,
    },
    Read {
        h: usize,
        offset: u64,
        len: u32,
    },
    WriteH {
        h: usize,
        offset: u64,
        len: usize,
        seed: u8,
    },
    TruncateH {
        h: usize,
        size: u64,
    },
    FallocateH {
        h: usize,
        mode: Falloc,
        offset: u64,
        len: u64,
    },
    /// `copy_file_range` between two open handles (possibly of one file).
    CopyH {
        h_in: usize,
        off_in: u64,
        h_out: usize,
        off_out: u64,
        len: u64,
    },
    /// `lseek` with SEEK_HOLE (`hole`) or SEEK_DATA.
    SeekH {
        h: usize,
        offset: u64,
        hole: bool,
    },
    Release {
        h: usize,
    },
    /// Drops the `Vfs` and opens a new one on the same data directory; without
    /// `release_first` the open handles are simply forgotten, as when the daemon dies.
    Reopen {
        release_first: bool,
    },
}

impl Op {
    /// The same op with every path passed through `f`.
    pub(crate) fn map_paths(&self, mut f: impl FnMut(&'static str) -> &'static str) -> Op {
        let mut op = self.clone();
        match &mut op {
            Op::Create { at, .. }
            | Op::Mkdir { at, .. }
            | Op::Unlink { at }
            | Op::Rmdir { at }
            | Op::Symlink { at, .. }
            | Op::Mknod { at, .. }
            | Op::Write { at, .. }
            | Op::Truncate { at, .. }
            | Op::Chmod { at, .. }
            | Op::Utimens { at, .. }
            | Op::SetXattr { at, .. }
            | Op::RemoveXattr { at, .. }
            | Op::Fallocate { at, .. }
            | Op::Open { at, .. }
            | Op::OpenUnlink { at } => *at = f(at),
            Op::Rename { from, to, .. } | Op::Link { from, to } => {
                *from = f(from);
                *to = f(to);
            }
            Op::Read { .. }
            | Op::WriteH { .. }
            | Op::TruncateH { .. }
            | Op::FallocateH { .. }
            | Op::CopyH { .. }
            | Op::SeekH { .. }
            | Op::Release { .. }
            | Op::Reopen { .. } => {}
        }
        op
    }
}

/// A `&'static str` for a path built at run time (a handful of distinct ones per test run).
pub(crate) fn intern(s: String) -> &'static str {
    static POOL: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&p) = pool.get(s.as_str()) {
        return p;
    }
    let p: &'static str = Box::leak(s.into_boxed_str());
    pool.insert(p);
    p
}

/// The bytes `Write` puts down: never zero, so holes and data are told apart.
pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| 1 + ((usize::from(seed) + i) % 255) as u8).collect()
}

/// A path's directory components and last component. `#N` stands for a name of N bytes
/// (`#255` is the longest valid one), so ops with long names print short.
pub(crate) fn split(path: &str) -> (Vec<&'static str>, &'static str) {
    let component = |c: &str| match c.strip_prefix('#').and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => intern("n".repeat(n)),
        None => intern(c.to_string()),
    };
    let mut comps: Vec<&'static str> = path.split('/').map(component).collect();
    let name = comps.pop().unwrap_or_default();
    (comps, name)
}

/// How a name is written in an op: the inverse of the `#N` shorthand of [`split`].
pub(crate) fn token(name: &str) -> String {
    if name.len() > 64 && name.bytes().all(|b| b == b'n') { format!("#{}", name.len()) } else { name.to_string() }
}

/// ENAMETOOLONG for a name longer than NAME_MAX.
pub(crate) fn name_ok(name: &str) -> M<()> {
    if name.len() > 255 { fail(libc::ENAMETOOLONG) } else { Ok(()) }
}

/// EFBIG when a file would reach past the largest file size tierfs supports.
pub(crate) fn size_ok(end: u64) -> M<()> {
    if end > tierfs::vfs::MAX_FILE_SIZE { fail(libc::EFBIG) } else { Ok(()) }
}
