//! [`BackendError`]: everything that can go wrong between tierfs and its object stores.
//!
//! Every message names what a user needs to act: the backend by its URL (never a secret: the
//! URL carries none, credentials live elsewhere), the object key, and what to check. Variants
//! are grouped by what a caller does about them, see [`BackendError::kind`]: fix the
//! configuration (`BadUrl`, `BadConfig`, `BadKey`, `AccessDenied`, `NotSupported`), treat as
//! absent (`NotFound`), retry later (`Unavailable`, `Timeout`, `QuorumFailed`, `NoMajority`, `ListIncomplete`,
//! `Io`), or report damaged data (`Corrupt`).

use std::ops::Range;

use crate::types::{ErrorKind, io_error_kind};

/// An error of the object-storage layer.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A backend URL could not be parsed or is not supported.
    #[error("bad backend URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The backend or redundancy configuration is unusable.
    #[error("bad backend configuration: {0}")]
    BadConfig(String),
    /// An object key this layer cannot store (empty, `..`, empty path segments, …); a caller bug.
    #[error("bad object key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    /// The object does not exist (on this backend, or on every backend that should hold it).
    #[error("object {key} not found")]
    NotFound { key: String },
    /// A conditional create found the object already there (mapped to `Ok(false)` by
    /// `put_if_absent`; other callers never see it).
    #[error("object {key} already exists on {backend}")]
    AlreadyExists { backend: String, key: String },
    /// The backend cannot be reached or failed the request; retrying later may help.
    #[error("{backend} is unavailable: {reason}")]
    Unavailable { backend: String, reason: String },
    /// A request did not finish within the configured request timeout.
    #[error(
        "request to {backend} timed out — is the endpoint reachable, and is the request timeout long enough for \
         the object sizes used?"
    )]
    Timeout { backend: String },
    /// The backend refused the credentials or the operation.
    #[error(
        "access denied by {backend} for {key}: {reason} — check the access key and secret (store config or \
         AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) and the bucket policy"
    )]
    AccessDenied { backend: String, key: String, reason: String },
    /// The backend does not implement an operation tierfs needs (e.g. conditional create).
    #[error("{backend} does not support {operation}: {reason}")]
    NotSupported { backend: String, operation: String, reason: String },
    /// A redundant write reached fewer copies than its quorum; nothing was acknowledged.
    #[error(
        "could not store {key} redundantly: {stored} of the {needed} copies needed were written ({})",
        errors.join("; ")
    )]
    QuorumFailed { key: String, stored: usize, needed: usize, errors: Vec<String> },
    /// A read that must come from a majority of the copies found none agreeing (a replica
    /// lags, or copies are missing or unreachable): retry.
    #[error("no majority of the copies of {key} agree: {agreeing} of the {needed} needed ({})", errors.join("; "))]
    NoMajority { key: String, agreeing: usize, needed: usize, errors: Vec<String> },
    /// No copy of the object passed verification (or could be reconstructed).
    #[error("{key} is corrupt: {reason}")]
    Corrupt { key: String, reason: String },
    /// A redundant listing could not reach enough backends to be complete.
    #[error("listing {prefix:?} is incomplete: {} could not be listed ({})", failed.len(), failed.join("; "))]
    ListIncomplete { prefix: String, failed: Vec<String> },
    /// A byte range outside the object.
    #[error("range {}..{} is outside {key} (length {len})", range.start, range.end)]
    BadRange { key: String, range: Range<u64>, len: u64 },
    /// Local I/O around a backend failed (e.g. creating a `file://` directory); the kind is
    /// the I/O error's (a full disk, a refused or missing path).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A bug or an unexpected failure inside this layer.
    #[error("internal error in the backend layer: {0}")]
    Internal(String),
}

impl BackendError {
    /// The object does not exist: the one error callers routinely treat as an answer.
    pub fn is_not_found(&self) -> bool {
        matches!(self, BackendError::NotFound { .. })
    }

    /// Retrying later may succeed (the backend or enough of the backends were unreachable).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            BackendError::Unavailable { .. }
                | BackendError::Timeout { .. }
                | BackendError::QuorumFailed { .. }
                | BackendError::NoMajority { .. }
                | BackendError::ListIncomplete { .. }
                | BackendError::Io { .. }
        )
    }

    /// What a caller can do about this error, for conversion into the library's public error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BackendError::NotFound { .. } => ErrorKind::NotFound,
            BackendError::AlreadyExists { .. } => ErrorKind::Conflict,
            BackendError::BadUrl { .. }
            | BackendError::BadConfig(_)
            | BackendError::BadKey { .. }
            | BackendError::BadRange { .. }
            | BackendError::AccessDenied { .. }
            | BackendError::NotSupported { .. } => ErrorKind::InvalidInput,
            BackendError::Unavailable { .. }
            | BackendError::Timeout { .. }
            | BackendError::QuorumFailed { .. }
            | BackendError::NoMajority { .. }
            | BackendError::ListIncomplete { .. } => ErrorKind::Unavailable,
            BackendError::Io { source, .. } => io_error_kind(source),
            BackendError::Corrupt { .. } => ErrorKind::Corrupt,
            BackendError::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn messages_name_backend_key_and_remedy() {
        let e = BackendError::Unavailable {
            backend: "s3://b/p?endpoint=http://127.0.0.1:9001".into(),
            reason: "cannot connect to http://127.0.0.1:9001: connection refused — is the server running?".into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("s3://b/p") && msg.contains("is the server running"), "{msg}");
        assert!(e.is_transient() && !e.is_not_found());
        assert_eq!(e.kind(), ErrorKind::Unavailable);

        let e = BackendError::QuorumFailed {
            key: "config".into(),
            stored: 1,
            needed: 2,
            errors: vec!["mem-a: down".into(), "mem-b: down".into()],
        };
        let msg = e.to_string();
        assert!(msg.contains("config") && msg.contains("1 of the 2") && msg.contains("mem-b: down"), "{msg}");

        assert!(BackendError::NotFound { key: "k".into() }.is_not_found());
        assert_eq!(BackendError::Corrupt { key: "k".into(), reason: "r".into() }.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn local_io_keeps_its_error_and_kind() {
        use std::error::Error as _;
        let io = |errno| BackendError::Io {
            what: "cannot create /b".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        assert_eq!(io(libc::ENOSPC).kind(), ErrorKind::NoSpace);
        assert_eq!(io(libc::EACCES).kind(), ErrorKind::InvalidInput);
        assert_eq!(io(libc::EIO).kind(), ErrorKind::Unavailable);
        let e = io(libc::EACCES);
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error is the source");
        assert_eq!(source.raw_os_error(), Some(libc::EACCES));
        assert!(e.to_string().starts_with("cannot create /b: "), "{e}");
    }
}
