//! The public error of the tierfs library: a message a user can act on plus an
//! [`ErrorKind`] that tells a caller what to do about it.
//!
//! Every module error converts into it, each through its own exhaustive `kind()` (no
//! catch-all, no error turned into a string on the way), so a front end, a language binding
//! or a metric can tell a store that is down from corrupt data, a fenced writer, a missing
//! thing and bad input. The module error stays reachable as the source
//! ([`Error::module_error`]); binaries add context with `anyhow`, never by matching on
//! message text.

use crate::backend::BackendError;
use crate::block::BlockError;
use crate::crypto::CryptoError;
use crate::export::ExportError;
use crate::history::HistoryError;
use crate::meta::{JournalError, MetaError};
use crate::remote::RemoteError;
use crate::session::{FlushError, FollowError, SessionError};
use crate::store::StoreError;
use crate::tier::{ColdError, HotTierError};
use crate::vfs::VfsError;
use crate::watch::WatchError;

pub use crate::types::ErrorKind;

/// The library's public error.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct Error {
    kind: ErrorKind,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The module error this one was made from, when it is a `T`.
    pub fn module_error<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.source.downcast_ref::<T>()
    }
}

/// `From` for each module error, through its `kind()`, and [`kind_of`] over the same list.
macro_rules! from_module_errors {
    ($($error:ty),* $(,)?) => {
        $(impl From<$error> for Error {
            fn from(e: $error) -> Error {
                Error { kind: e.kind(), source: Box::new(e) }
            }
        })*

        /// The kind of `e` when it is this library's [`Error`] or one of its module errors,
        /// for a front end that holds the error behind `dyn Error` (a cause chain).
        pub fn kind_of(e: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
            if let Some(e) = e.downcast_ref::<Error>() {
                return Some(e.kind());
            }
            $(if let Some(e) = e.downcast_ref::<$error>() {
                return Some(e.kind());
            })*
            None
        }
    };
}

from_module_errors!(
    BackendError,
    BlockError,
    CryptoError,
    MetaError,
    JournalError,
    StoreError,
    HotTierError,
    ColdError,
    RemoteError,
    VfsError,
    SessionError,
    FlushError,
    FollowError,
    WatchError,
    ExportError,
    HistoryError,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_survive_the_layers() {
        let down = BackendError::Unavailable { backend: "s3".into(), reason: "connection refused".into() };
        let cold = ColdError::from(StoreError::from(down));
        let err = Error::from(VfsError::Cold(cold));
        assert_eq!(err.kind(), ErrorKind::Unavailable, "a store that is down is worth a retry");
        assert!(err.module_error::<VfsError>().is_some());

        let bad = BackendError::Corrupt { key: "p/1".into(), reason: "hash mismatch".into() };
        assert_eq!(Error::from(VfsError::Cold(ColdError::from(StoreError::from(bad)))).kind(), ErrorKind::Corrupt);

        let held = RemoteError::Held { workspace: "w".into(), holder: "n:1".into(), expires: "soon".into() };
        assert_eq!(Error::from(SessionError::Remote(held)).kind(), ErrorKind::Fenced);
        assert_eq!(Error::from(RemoteError::NoSnapshot("x".into())).kind(), ErrorKind::NotFound);
        assert_eq!(Error::from(StoreError::Crypto(CryptoError::WrongKey)).kind(), ErrorKind::InvalidInput);
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let io = HotTierError::Io { op: "write", path: "/d".into(), source: full };
        assert_eq!(Error::from(VfsError::HotTier(io)).kind(), ErrorKind::NoSpace);
        assert_eq!(Error::from(VfsError::TooBig).kind(), ErrorKind::InvalidInput);
        assert_eq!(Error::from(FlushError::Deadline).kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn kind_of_reads_a_module_error_or_the_public_one_behind_dyn_error() {
        let fenced = RemoteError::Held { workspace: "w".into(), holder: "n:1".into(), expires: "soon".into() };
        assert_eq!(kind_of(&fenced), Some(ErrorKind::Fenced));
        assert_eq!(kind_of(&Error::from(VfsError::TooBig)), Some(ErrorKind::InvalidInput));
        assert_eq!(kind_of(&std::fmt::Error), None, "not an error of this library");
    }

    #[test]
    fn kind_names_round_trip() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("NotFound"), None, "names are the lower-case ones");
    }
}
