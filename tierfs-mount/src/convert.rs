//! Conversions between fuser's wire-level types and `tierfs::vfs` value types.
//!
//! Pure functions only, so the adapter's argument handling can be unit-tested without a
//! kernel. Nothing here decides POSIX behaviour; it only changes representation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use tierfs::vfs::{self, Attr, BLOCK_SIZE, FileKind, TimeSet, Timestamp, VfsError};

/// The errno the kernel sees for `err`: [`VfsError::errno`] is the one mapping.
pub(crate) fn errno(err: &VfsError) -> Errno {
    Errno::from_i32(err.errno())
}

/// The fuser file type of a tierfs inode kind.
pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// The attributes as the kernel receives them.
pub(crate) fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: SystemTime::from(attr.atime),
        mtime: SystemTime::from(attr.mtime),
        ctime: SystemTime::from(attr.ctime),
        crtime: SystemTime::from(attr.crtime),
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: BLOCK_SIZE,
        flags: 0,
    }
}

/// A timestamp the kernel sent in `setattr`.
///
/// fuser 0.18.0 (`src/time.rs`, `system_time_from_time`) builds pre-epoch times as
/// `UNIX_EPOCH - Duration::new(-secs, nsecs)`, although the kernel's `(secs, nsecs)` means
/// `secs + nsecs / 1e9` with `nsecs` always non-negative. Every `SystemTime` before the epoch
/// that fuser hands us was built that way, so the kernel's pair is recovered exactly as
/// `(-d.secs, d.nanos)`. Times at or after the epoch are unaffected. Revisit when fuser
/// changes that function.
pub(crate) fn timestamp_from_kernel(t: SystemTime) -> Timestamp {
    match UNIX_EPOCH.duration_since(t) {
        Ok(before) if !before.is_zero() => {
            Timestamp { secs: -i64::try_from(before.as_secs()).unwrap_or(i64::MAX), nanos: before.subsec_nanos() }
        }
        _ => Timestamp::from(t),
    }
}

/// A new atime or mtime from `setattr`.
pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timestamp_from_kernel(t)),
    }
}

/// The `renameat2` flags tierfs implements (`RENAME_WHITEOUT` is what lets overlayfs use a
/// tierfs directory as its upper layer); any bit unknown to us is refused with EINVAL, as
/// Linux filesystems without support do.
pub(crate) fn rename_flags(bits: u32) -> Result<vfs::RenameFlags, Errno> {
    const SUPPORTED: u32 = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
    if bits & !SUPPORTED != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(vfs::RenameFlags::from_bits(bits))
}

/// What a `getxattr`/`listxattr` reply carries for a value of `len` bytes when the caller's
/// buffer holds `size` bytes (`size == 0` asks for the length only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XattrReply {
    Size(u32),
    Data,
}

pub(crate) fn xattr_reply(size: u32, len: usize) -> Result<XattrReply, Errno> {
    let len = u32::try_from(len).map_err(|_| Errno::E2BIG)?;
    if size == 0 {
        Ok(XattrReply::Size(len))
    } else if len > size {
        Err(Errno::ERANGE)
    } else {
        Ok(XattrReply::Data)
    }
}

/// One TTL for replies that carry both an entry and its attributes (create, readdirplus):
/// the shorter of the two, so neither cache outlives its setting.
pub(crate) fn shared_ttl(attr_ttl: Duration, entry_ttl: Duration) -> Duration {
    attr_ttl.min(entry_ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind) -> Attr {
        Attr {
            ino: 42,
            kind,
            perm: 0o4755,
            nlink: 2,
            uid: 1000,
            gid: 100,
            rdev: 0x0801,
            size: 12_345,
            blocks: 32,
            atime: Timestamp { secs: 1, nanos: 2 },
            mtime: Timestamp { secs: -5, nanos: 250_000_000 },
            ctime: Timestamp { secs: 1_700_000_000, nanos: 999_999_999 },
            crtime: Timestamp { secs: 0, nanos: 0 },
        }
    }

    #[test]
    fn file_attr_carries_every_field() {
        let a = attr(FileKind::File);
        let f = file_attr(&a);
        assert_eq!(f.ino, INodeNo(42));
        assert_eq!(f.kind, FileType::RegularFile);
        assert_eq!((f.perm, f.nlink, f.uid, f.gid, f.rdev), (0o4755, 2, 1000, 100, 0x0801));
        assert_eq!((f.size, f.blocks, f.blksize, f.flags), (12_345, 32, BLOCK_SIZE, 0));
        assert_eq!(Timestamp::from(f.atime), a.atime);
        assert_eq!(Timestamp::from(f.mtime), a.mtime);
        assert_eq!(Timestamp::from(f.ctime), a.ctime);
        assert_eq!(f.crtime, UNIX_EPOCH);
    }

    #[test]
    fn every_kind_maps_to_its_file_type() {
        for (kind, ty) in [
            (FileKind::File, FileType::RegularFile),
            (FileKind::Dir, FileType::Directory),
            (FileKind::Symlink, FileType::Symlink),
            (FileKind::Fifo, FileType::NamedPipe),
            (FileKind::Socket, FileType::Socket),
            (FileKind::CharDev, FileType::CharDevice),
            (FileKind::BlockDev, FileType::BlockDevice),
        ] {
            assert_eq!(file_attr(&attr(kind)).kind, ty);
        }
    }

    /// What fuser 0.18.0 builds from the kernel's `(secs, nsecs)` (see `timestamp_from_kernel`).
    fn as_fuser_builds_it(secs: i64, nsecs: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs.unsigned_abs(), nsecs)
        } else {
            UNIX_EPOCH - Duration::new(secs.unsigned_abs(), nsecs)
        }
    }

    #[test]
    fn kernel_times_round_trip() {
        for (secs, nanos) in [(0, 0), (0, 1), (1_700_000_000, 123_456_789), (-1, 0), (-2, 800_000_000), (-86_400, 1)] {
            let got = timestamp_from_kernel(as_fuser_builds_it(secs, nanos));
            assert_eq!(got, Timestamp { secs, nanos }, "kernel time ({secs}, {nanos})");
        }
    }

    #[test]
    fn time_or_now_maps_to_time_set() {
        assert_eq!(time_set(TimeOrNow::Now), TimeSet::Now);
        let t = UNIX_EPOCH + Duration::new(10, 5);
        assert_eq!(time_set(TimeOrNow::SpecificTime(t)), TimeSet::At(Timestamp { secs: 10, nanos: 5 }));
    }

    #[test]
    fn rename_flags_accept_known_bits_only() {
        assert_eq!(rename_flags(0), Ok(vfs::RenameFlags::default()));
        let only = |f: fn(&mut vfs::RenameFlags)| {
            let mut flags = vfs::RenameFlags::default();
            f(&mut flags);
            Ok(flags)
        };
        assert_eq!(rename_flags(libc::RENAME_NOREPLACE), only(|f| f.noreplace = true));
        assert_eq!(rename_flags(libc::RENAME_EXCHANGE), only(|f| f.exchange = true));
        assert_eq!(rename_flags(libc::RENAME_WHITEOUT), only(|f| f.whiteout = true));
        assert_eq!(rename_flags(1 << 3), Err(Errno::EINVAL));
        assert_eq!(rename_flags(1 << 20), Err(Errno::EINVAL));
    }

    #[test]
    fn xattr_reply_follows_the_size_protocol() {
        assert_eq!(xattr_reply(0, 7), Ok(XattrReply::Size(7)));
        assert_eq!(xattr_reply(0, 0), Ok(XattrReply::Size(0)));
        assert_eq!(xattr_reply(7, 7), Ok(XattrReply::Data));
        assert_eq!(xattr_reply(100, 7), Ok(XattrReply::Data));
        assert_eq!(xattr_reply(6, 7), Err(Errno::ERANGE));
    }

    #[test]
    fn errno_comes_from_the_vfs_mapping() {
        assert_eq!(errno(&VfsError::NotFound), Errno::ENOENT);
        assert_eq!(errno(&VfsError::NoXattr), Errno::NO_XATTR);
        assert_eq!(errno(&VfsError::Invalid("x")), Errno::EINVAL);
    }
}
