//! Errors of opening, syncing and closing a workspace session. Messages say what is wrong in
//! the core's words; a front end adds how to fix it with its own options.

use std::path::PathBuf;

use crate::backend::BackendError;
use crate::meta::{JournalError, MetaError};
use crate::remote::RemoteError;
use crate::types::{ErrorKind, io_error_kind};
use crate::vfs::VfsError;

/// Why a session could not open or take a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Vfs(#[from] VfsError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A snapshot session empties its data dir; one that holds anything else is refused.
    #[error("data dir {} is not empty and is not a snapshot cache", .0.display())]
    NotSnapshotCache(PathBuf),
    /// The store's servers did not refuse a conditional create of an existing object, so two
    /// writers could both append to a workspace's journal.
    #[error(
        "the store cannot fence concurrent writers: its servers ignore conditional writes ({0}); such a \
         store must be fenced by lease (docs/SEMANTICS.md, \"Surviving a runtime reset\")"
    )]
    NoConditionalWrites(#[source] BackendError),
    #[error("this workspace has no store: there is nothing to sync to")]
    NoStore,
    /// The data dir is the local copy of another workspace; nothing was changed.
    #[error(
        "data dir {} holds workspace {workspace:?} of store {store}, not workspace {wanted:?}: opening it for {wanted:?} would copy the other workspace's files into it; nothing was changed",
        data_dir.display()
    )]
    OtherWorkspace { data_dir: PathBuf, store: String, workspace: String, wanted: String },
    #[error("this session is read-only: it takes no snapshots")]
    ReadOnly,
    #[error("only a read-only session can follow a workspace another node writes")]
    FollowNotReadOnly,
    /// The cache's key derives from the store's data key.
    #[error("encrypting the cache needs a store: its key derives from the store's key")]
    EncryptCacheNoStore,
    #[error("{dirty} bytes could not be uploaded within {} s; nothing was committed", timeout.as_secs())]
    NotUploaded { dirty: u64, timeout: std::time::Duration },
}

impl SessionError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SessionError::Vfs(e) => e.kind(),
            SessionError::Meta(e) => e.kind(),
            SessionError::Remote(e) => e.kind(),
            SessionError::Io { source, .. } => io_error_kind(source),
            SessionError::NotSnapshotCache(_) | SessionError::OtherWorkspace { .. } => ErrorKind::Conflict,
            SessionError::NoConditionalWrites(_)
            | SessionError::NoStore
            | SessionError::ReadOnly
            | SessionError::FollowNotReadOnly
            | SessionError::EncryptCacheNoStore => ErrorKind::InvalidInput,
            SessionError::NotUploaded { .. } => ErrorKind::Unavailable,
        }
    }
}

/// Why a flush or a close did not make everything durable before its deadline.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error(
        "{dirty} bytes were not yet uploaded to the store when the deadline passed (they are safe on local \
         disk and are uploaded by the next session of this data dir)"
    )]
    NotUploaded { dirty: u64 },
    #[error("flushing to local disk failed: {0}")]
    Local(#[source] VfsError),
    #[error("flushing did not finish before the deadline")]
    Deadline,
    #[error("metadata not in the store: {0}")]
    MetadataNotStored(#[source] JournalError),
    #[error("{0}")]
    Thread(String),
}

impl FlushError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            FlushError::NotUploaded { .. } | FlushError::Deadline => ErrorKind::Unavailable,
            FlushError::MetadataNotStored(e) => e.kind(),
            FlushError::Local(e) => e.kind(),
            FlushError::Thread(_) => ErrorKind::Internal,
        }
    }
}
