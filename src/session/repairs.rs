//! Repairs (copies a backend missed while it was down) saved across runs of one data dir.
//!
//! The saved list is read and queued when a session opens, and written again whenever the
//! queue changed: the session's repair loop saves it every [`super::REPAIR_INTERVAL`], and
//! once more at close. Invariant: a crash loses at most the changes of the last interval,
//! which a scrub with repair still finds; an unreadable file is reported, never fatal.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::backend::SavedRepair;
use crate::store::Store;

/// The file in a data dir that holds the repairs its last session could not finish.
pub const SAVED_REPAIRS: &str = "pending-repairs.json";

/// The saved repair queue of one data dir.
pub struct RepairLog {
    path: PathBuf,
    written: Mutex<Vec<SavedRepair>>,
}

impl RepairLog {
    /// Queues in `store` what an earlier run of `data_dir` saved.
    pub fn load(data_dir: &Path, store: &Store) -> RepairLog {
        let path = data_dir.join(SAVED_REPAIRS);
        let unreadable = |e: &dyn std::fmt::Display| {
            tracing::warn!("ignoring {}: {e}; a scrub with repair finds what it listed", path.display());
            Vec::new()
        };
        let saved: Vec<SavedRepair> = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| unreadable(&e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => unreadable(&e),
        };
        if !saved.is_empty() {
            let queued = store.backend().restore_repairs(&saved);
            tracing::info!(queued, saved = saved.len(), "repairs left by the last run queued again");
        }
        RepairLog { path, written: Mutex::new(saved) }
    }

    /// Writes the queue if it changed since the last write (atomically; none left: no file).
    pub fn save(&self, store: &Store) {
        let now = store.backend().saved_repairs();
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if *written == now {
            return;
        }
        let result = if now.is_empty() {
            std::fs::remove_file(&self.path)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
        } else {
            let tmp = self.path.with_extension("json.tmp");
            serde_json::to_vec(&now)
                .map_err(std::io::Error::other)
                .and_then(|bytes| std::fs::write(&tmp, bytes))
                .and_then(|()| std::fs::rename(&tmp, &self.path))
        };
        match result {
            Ok(()) => *written = now,
            Err(e) => tracing::warn!("cannot save the repair queue to {}: {e}", self.path.display()),
        }
    }
}
