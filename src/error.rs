//! The public error of the tierfs library: a message a user can act on plus an
//! [`ErrorKind`] that tells a caller what to do about it.
//!
//! Module errors ([`VfsError`], and through it the metadata and hot-tier errors) convert into
//! it; binaries add context with `anyhow`, never by matching on message text.

use crate::tier::HotTierError;
use crate::vfs::VfsError;

pub use crate::types::ErrorKind;

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
