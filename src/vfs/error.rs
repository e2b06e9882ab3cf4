//! The VFS error type and the one place where errors become errno values.
//!
//! Every failure of a POSIX operation is a [`VfsError`]; lower layers' errors (metadata,
//! hot and cold tier) convert into it. [`VfsError::errno`] is the only mapping to errno in tierfs, so
//! the FUSE adapter and the tests agree on what each failure looks like to a program.

use crate::meta::{JournalError, MetaError};
use crate::tier::{ColdError, HotTierError};
use crate::types::ErrorKind;

/// Why a POSIX operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VfsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("file name longer than 255 bytes")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    Access,
    #[error("no such extended attribute")]
    NoXattr,
    #[error("buffer too small")]
    Range,
    #[error("too many links")]
    TooManyLinks,
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    #[error("bad file handle")]
    BadHandle,
    #[error("file too large")]
    TooBig,
    #[error("no data at or after this offset")]
    NoDataAfter,
    #[error("metadata: {0}")]
    Meta(#[from] MetaError),
    #[error("hot tier: {0}")]
    HotTier(#[from] HotTierError),
    #[error("cold tier: {0}")]
    Cold(#[from] ColdError),
    /// fsync could not make the metadata durable in the store (it is durable locally): the
    /// committer stopped (a takeover fenced this writer) or the store did not confirm in time.
    #[error("not durable in the store: {0}")]
    NotDurable(#[from] JournalError),
    /// fsync could not upload a file's bytes to the store in time (they are durable locally).
    #[error("not durable in the store: {dirty} bytes of inode {ino} could not be uploaded within {} s", timeout.as_secs())]
    NotUploaded { ino: crate::types::Ino, dirty: u64, timeout: std::time::Duration },
}

impl VfsError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            VfsError::NotFound | VfsError::NoXattr => ErrorKind::NotFound,
            VfsError::Exists | VfsError::NotEmpty => ErrorKind::Conflict,
            VfsError::NotDir
            | VfsError::IsDir
            | VfsError::NameTooLong
            | VfsError::Invalid(_)
            | VfsError::NotPermitted
            | VfsError::Access
            | VfsError::Range
            | VfsError::TooManyLinks
            | VfsError::NotSupported(_)
            | VfsError::BadHandle
            | VfsError::TooBig
            | VfsError::NoDataAfter => ErrorKind::InvalidInput,
            VfsError::Meta(e) => e.kind(),
            VfsError::HotTier(e) => e.kind(),
            VfsError::Cold(e) => e.kind(),
            VfsError::NotDurable(e) => e.kind(),
            VfsError::NotUploaded { .. } => ErrorKind::Unavailable,
        }
    }
}

impl VfsError {
    /// The errno a program sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            VfsError::NotFound => libc::ENOENT,
            VfsError::Exists => libc::EEXIST,
            VfsError::NotDir => libc::ENOTDIR,
            VfsError::IsDir => libc::EISDIR,
            VfsError::NotEmpty => libc::ENOTEMPTY,
            VfsError::NameTooLong => libc::ENAMETOOLONG,
            VfsError::Invalid(_) => libc::EINVAL,
            VfsError::NotPermitted => libc::EPERM,
            VfsError::Access => libc::EACCES,
            VfsError::NoXattr => libc::ENODATA,
            VfsError::Range => libc::ERANGE,
            VfsError::TooManyLinks => libc::EMLINK,
            VfsError::NotSupported(_) => libc::EOPNOTSUPP,
            VfsError::BadHandle => libc::EBADF,
            VfsError::TooBig => libc::EFBIG,
            VfsError::NoDataAfter => libc::ENXIO,
            VfsError::Meta(e) => e.errno(),
            VfsError::HotTier(e) => e.errno(),
            VfsError::Cold(e) => e.errno(),
            // A fenced writer's fsync fails with EIO too (docs/SEMANTICS.md, "Surviving a
            // runtime reset"): no other errno tells a program "not durable"; the kind (`fenced`
            // or `unavailable`) tells a front end why.
            VfsError::NotDurable(_) | VfsError::NotUploaded { .. } => libc::EIO,
        }
    }

    /// True when the operation failed because something underneath failed (metadata store,
    /// disk, store) rather than because of what the program asked: worth a line in the log.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            VfsError::Meta(_)
                | VfsError::HotTier(_)
                | VfsError::Cold(_)
                | VfsError::NotDurable(_)
                | VfsError::NotUploaded { .. }
        )
    }
}

/// Result of a VFS operation.
pub type VfsResult<T> = Result<T, VfsError>;
