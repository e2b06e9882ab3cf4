//! Errors of watch mode's core: what is wrong with the watched directory, and the failures of
//! the layers below it, kept typed so the caller can tell a bad argument from a store outage.

use std::path::PathBuf;

use crate::export::ExportError;
use crate::store::StoreError;
use crate::types::ErrorKind;
use crate::vfs::VfsError;

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("{}: no such directory", .0.display())]
    Missing(PathBuf),
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("{}: the watched directory and the data dir {} must not contain each other (tierfs's own writes would be synced back)", dir.display(), data_dir.display())]
    Overlaps { dir: PathBuf, data_dir: PathBuf },
    #[error("watch mode needs a store: the bytes live in the watched directory and the store only")]
    NoStore,
    #[error(
        "{} is not empty and does not hold this workspace (only in the directory: {}; only in the workspace: {}); nothing was changed. Watch an empty directory to restore the workspace into it, or use another workspace for this directory",
        dir.display(), list(only_local), list(only_workspace)
    )]
    Mismatch { dir: PathBuf, only_local: Vec<String>, only_workspace: Vec<String> },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Vfs {
        path: PathBuf,
        #[source]
        source: VfsError,
    },
    #[error("uploading to the store: {0}")]
    Store(#[from] StoreError),
    #[error("restoring the workspace into the directory: {0}")]
    Export(#[from] ExportError),
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "nothing".into();
    }
    let mut s = names.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 5 {
        s.push_str(&format!(" and {} more", names.len() - 5));
    }
    s
}

impl WatchError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            WatchError::Missing(_) => ErrorKind::NotFound,
            WatchError::NotADirectory(_) | WatchError::Overlaps { .. } | WatchError::NoStore => ErrorKind::InvalidInput,
            WatchError::Mismatch { .. } => ErrorKind::Conflict,
            WatchError::Io { source, .. } => crate::types::io_error_kind(source),
            WatchError::Vfs { source, .. } => source.kind(),
            WatchError::Store(e) => e.kind(),
            WatchError::Export(e) => e.kind(),
        }
    }

    pub(super) fn io<'a>(
        op: &'static str,
        path: &'a std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> WatchError + 'a {
        move |source| WatchError::Io { op, path: path.to_path_buf(), source }
    }

    pub(super) fn vfs(path: &std::path::Path) -> impl FnOnce(VfsError) -> WatchError + '_ {
        move |source| WatchError::Vfs { path: path.to_path_buf(), source }
    }
}
