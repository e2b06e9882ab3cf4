//! The public error of the tierfs library: a message a user can act on plus an
//! [`ErrorKind`] that tells a caller what to do about it.
//!
//! Module errors ([`VfsError`], and through it the metadata and hot-tier errors) convert into
//! it; binaries add context with `anyhow`, never by matching on message text.

use crate::tier::HotTierError;
use crate::vfs::VfsError;

/// What a caller can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The named thing does not exist.
    NotFound,
    /// Someone else holds it (another mount of the data directory, an existing name).
    Conflict,
    /// Try again later: a resource is temporarily unavailable.
    Unavailable,
    /// The request itself is wrong.
    InvalidInput,
    /// Stored data failed verification or could not be decoded.
    Corrupt,
    /// Anything else: a bug or an unexpected system failure.
    Internal,
}

/// The library's public error.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct Error {
    kind: ErrorKind,
    #[source]
    source: VfsError,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl From<VfsError> for Error {
    fn from(source: VfsError) -> Error {
        use crate::meta::MetaError;
        let kind = match &source {
            VfsError::NotFound | VfsError::NoXattr => ErrorKind::NotFound,
            VfsError::Exists | VfsError::NotEmpty | VfsError::HotTier(HotTierError::InUse { .. }) => {
                ErrorKind::Conflict
            }
            VfsError::Meta(MetaError::Corrupt(_)) | VfsError::Meta(MetaError::SchemaTooNew { .. }) => {
                ErrorKind::Corrupt
            }
            VfsError::Meta(_) | VfsError::HotTier(_) | VfsError::Cold(_) => ErrorKind::Unavailable,
            _ => ErrorKind::InvalidInput,
        };
        Error { kind, source }
    }
}
