//! The value types every layer shares: inode numbers, file kinds, timestamps, attributes and
//! the [`ErrorKind`] a caller acts on. The bottom of the core: this module imports nothing
//! from the crate, so any layer may use it (docs/ARCHITECTURE.md, "Layers"; `tests/layers.rs`
//! checks it). `vfs` and `error` re-export them where callers expect them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An inode number. `ROOT_INO` is the workspace root; numbers are never reused.
pub type Ino = u64;

/// The root directory's inode number (the kernel's FUSE_ROOT_ID).
pub const ROOT_INO: Ino = 1;

/// Longest file name component in bytes (NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Block size reported in `st_blksize` and used for `st_blocks` rounding.
pub const BLOCK_SIZE: u32 = 4096;

/// Longest symlink target in bytes (PATH_MAX; the kernel itself passes at most 4095).
pub const SYMLINK_MAX: usize = 4096;

/// Largest xattr value (Linux XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;

/// Largest file size tierfs supports: 16 TiB less 4 KiB, what ext4 (with 4 KiB blocks, the
/// usual data-dir filesystem) can hold in one data file. One limit everywhere, so a
/// workspace restores on any node whatever its data dir's filesystem; a truncate, write,
/// fallocate or copy past it fails with EFBIG before anything is touched, and a store's
/// record of a larger file is refused (docs/SEMANTICS.md, "Limits").
pub const MAX_FILE_SIZE: u64 = (16 << 40) - 4096;

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::BlockDev => libc::S_IFBLK,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }

    /// Stable one-byte code used in the metadata encoding (see docs/FORMAT.md).
    pub fn code(self) -> u8 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }

    /// Inverse of [`FileKind::code`].
    pub fn from_code(code: u8) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// A timestamp with nanosecond precision, seconds relative to the Unix epoch (may be negative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timestamp { secs: -(d.as_secs() as i64), nanos: 0 }
                } else {
                    Timestamp { secs: -(d.as_secs() as i64) - 1, nanos: 1_000_000_000 - d.subsec_nanos() }
                }
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> SystemTime {
        if t.secs >= 0 {
            UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + Duration::from_nanos(u64::from(t.nanos))
        }
    }
}

/// The attributes of an inode, as `stat` shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// Bytes allocated on the hot tier, in 512-byte units (`st_blocks`).
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
}

impl Attr {
    /// The attributes reported for a file that no longer exists (no links, no data).
    pub fn gone(ino: Ino) -> Attr {
        let t = Timestamp::now();
        Attr {
            ino,
            kind: FileKind::File,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        }
    }

    /// The full `st_mode` (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// What a caller can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The named thing does not exist.
    NotFound,
    /// Someone else holds it (another mount of the data directory, an existing name).
    Conflict,
    /// Another writer holds the workspace's lease or took it over: this node must not write
    /// (wait, take over, or start from the store's state).
    Fenced,
    /// Try again later: a resource is temporarily unavailable.
    Unavailable,
    /// The disk is full: free space, then try again.
    NoSpace,
    /// The request itself is wrong (bad input, configuration or credentials).
    InvalidInput,
    /// Stored data failed verification or could not be decoded.
    Corrupt,
    /// Anything else: a bug or an unexpected system failure.
    Internal,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Fenced,
        ErrorKind::Unavailable,
        ErrorKind::NoSpace,
        ErrorKind::InvalidInput,
        ErrorKind::Corrupt,
        ErrorKind::Internal,
    ];

    /// The kind a [`ErrorKind::name`] names (as another process printed it).
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// A stable lower-case name for scripts, bindings and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Fenced => "fenced",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Internal => "internal",
        }
    }
}

/// The kind of a local I/O error: a full disk, a missing path, a refused one, or the disk
/// failing (worth a retry once it is fixed).
pub fn io_error_kind(e: &std::io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => return ErrorKind::NoSpace,
        _ => {}
    }
    match e.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
        std::io::ErrorKind::AlreadyExists => ErrorKind::Conflict,
        _ => ErrorKind::Unavailable,
    }
}
