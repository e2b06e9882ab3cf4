//! Plain value types of the POSIX surface: the caller's credentials, directory entries and
//! the option sets of setattr, rename and statfs, plus the shared value types of
//! [`crate::types`] (re-exported here, where callers look for them).
//!
//! They carry no behaviour beyond conversions, so the FUSE adapter, the reference model and
//! the metadata codec can all share them without depending on each other.

pub use crate::types::{Attr, BLOCK_SIZE, FileKind, Ino, NAME_MAX, ROOT_INO, Timestamp};

/// A new value for a timestamp in `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// The changes of one `setattr` call; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (`mode & 0o7777`; type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timestamp>,
}

/// Who is asking: the credentials the kernel reports for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, pid: 0 };
}

/// One entry of a directory listing. `offset` is the cookie to resume after this entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileKind,
    pub name: Vec<u8>,
    pub offset: u64,
}

/// `renameat2` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
    /// `RENAME_WHITEOUT` (overlayfs's): the source name is left holding a whiteout, a
    /// character device 0:0, made in the same batch as the move.
    pub whiteout: bool,
}

impl RenameFlags {
    /// Decodes the kernel's `RENAME_*` bits; unknown bits are rejected by the caller.
    pub fn from_bits(bits: u32) -> RenameFlags {
        RenameFlags {
            noreplace: bits & libc::RENAME_NOREPLACE != 0,
            exchange: bits & libc::RENAME_EXCHANGE != 0,
            whiteout: bits & libc::RENAME_WHITEOUT != 0,
        }
    }
}

/// `statfs` numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}
