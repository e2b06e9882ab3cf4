//! Errors of the workspace history. Messages say what is wrong in the core's words; the CLI
//! adds the command that fixes it.

use std::path::PathBuf;

use crate::remote::RemoteError;
use crate::types::{ErrorKind, io_error_kind};
use crate::vfs::VfsError;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// libgit2 failed on the history repository itself.
    #[error("history repository: {what}: {source}")]
    Git {
        what: String,
        #[source]
        source: git2::Error,
    },
    #[error("reading {path} from the workspace: {source}")]
    Workspace {
        path: String,
        #[source]
        source: VfsError,
    },
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The workspace's history settings (`.tierfshistory.toml`) do not parse.
    #[error("history settings {path}: {reason}")]
    Config { path: String, reason: String },
    #[error(
        "unknown revision {0:?}: not a history commit, a snapshot id with a history commit, or a revision \
         expression such as HEAD~1"
    )]
    UnknownRevision(String),
    #[error("{path} is not in the history at {rev}")]
    NotInHistory { rev: String, path: String },
    /// A file over the size limit is recorded as a pointer; its bytes are only in a snapshot.
    #[error(
        "{path} at {rev} is recorded as a pointer ({size} bytes, over the history's size limit): its content is \
         in snapshot {snapshot}, not in the history"
    )]
    Pointer { rev: String, path: String, size: u64, snapshot: String },
    #[error("the history is empty: no snapshot has recorded any file yet")]
    Empty,
    /// The git remote could not be reached or read.
    #[error("pushing the history to {remote}: {reason}")]
    Push { remote: String, reason: String },
    /// The git remote answered and refused the update of `reference`.
    #[error("{remote} refused the history push of {reference}: {reason}")]
    PushRejected { remote: String, reference: String, reason: String },
    #[error("no git remote given, and the history settings name none (`remote = \"...\"`)")]
    NoRemote,
    #[error("{} is not empty: the history is exported only into a new or empty directory", .0.display())]
    NotEmpty(PathBuf),
    /// A history object in the store does not decode.
    #[error("history object {seq} in the store: {reason}")]
    Corrupt { seq: u64, reason: String },
    /// Another writer stored history object `seq` first.
    #[error("history object {0} was already written by another writer of this workspace")]
    Taken(u64),
    #[error("this workspace has no store, so it has no history")]
    NoStore,
}

impl HistoryError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            HistoryError::Git { source, .. } => git_kind(source),
            HistoryError::Workspace { source, .. } => source.kind(),
            HistoryError::Remote(e) => e.kind(),
            HistoryError::Io { source, .. } => io_error_kind(source),
            HistoryError::Config { .. }
            | HistoryError::NoRemote
            | HistoryError::Pointer { .. }
            | HistoryError::NoStore => ErrorKind::InvalidInput,
            HistoryError::UnknownRevision(_) | HistoryError::NotInHistory { .. } | HistoryError::Empty => {
                ErrorKind::NotFound
            }
            HistoryError::Push { .. } => ErrorKind::Unavailable,
            HistoryError::NotEmpty(_) | HistoryError::Taken(_) | HistoryError::PushRejected { .. } => {
                ErrorKind::Conflict
            }
            HistoryError::Corrupt { .. } => ErrorKind::Corrupt,
        }
    }

    /// The mapper of a libgit2 failure while doing `what`, for `map_err`.
    pub(crate) fn git(what: impl Into<String>) -> impl FnOnce(git2::Error) -> HistoryError {
        let what = what.into();
        move |source| HistoryError::Git { what, source }
    }

    pub(crate) fn io<'a>(
        what: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> HistoryError + 'a {
        move |source| HistoryError::Io { what, path: path.to_path_buf(), source }
    }
}

fn git_kind(e: &git2::Error) -> ErrorKind {
    match e.code() {
        git2::ErrorCode::NotFound => ErrorKind::NotFound,
        git2::ErrorCode::Exists | git2::ErrorCode::Locked | git2::ErrorCode::Conflict => ErrorKind::Conflict,
        git2::ErrorCode::Invalid | git2::ErrorCode::InvalidSpec | git2::ErrorCode::Ambiguous => ErrorKind::InvalidInput,
        _ => match e.class() {
            git2::ErrorClass::Os | git2::ErrorClass::Net => ErrorKind::Unavailable,
            _ => ErrorKind::Internal,
        },
    }
}
