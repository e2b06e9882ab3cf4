//! `tierfs restore`: a plain copy of a workspace (its latest state, or one snapshot) into a
//! local directory, without mounting anything and without taking the writer lease.
//!
//! The workspace's metadata is restored into a scratch data directory, opened by a read-only
//! session of the core, and written out by `tierfs::export`: directories, regular files (only
//! their data chunks are fetched; holes stay holes), symlinks, hard links (one inode, several
//! names), fifos, modes, xattrs, times, and ownership when run as root.
//!
//! Invariants: the target directory must be empty or missing (nothing of the user's is
//! overwritten); the scratch directory is removed afterwards however the copy ends; a file
//! that cannot be read fully is an error, never a silently short copy (the exporter's).

use std::fs;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use tierfs::export;
use tierfs::session::{Access, RESTORE_CACHE_SIZE, Session, SessionConfig};
use tierfs::vfs::{FileKind, Ino, ROOT_INO, Vfs};

use crate::logging::bail_with;
use crate::store_link::open_store;
use tierfs::ErrorKind;

/// What a restore wrote.
#[derive(Debug, Serialize)]
pub struct RestoreReport {
    pub snapshot: Option<String>,
    /// Entries and data written (their fields sit at the top level of the JSON).
    #[serde(flatten)]
    pub written: export::Written,
    pub millis: u64,
}

/// Restores the workspace (or `snapshot`) of `store_file` into `target`.
pub fn restore(
    store_file: &Path,
    workspace: &str,
    snapshot: Option<&str>,
    target: &Path,
    same_owner: bool,
    json: bool,
) -> Result<RestoreReport> {
    if same_owner && !rustix::process::geteuid().is_root() {
        bail_with!(
            ErrorKind::InvalidInput,
            "--same-owner restores owners, setuid/setgid bits and devices, which only root may set; run it as root or leave it out"
        );
    }
    if target.exists()
        && fs::read_dir(target).with_context(|| format!("reading {}", target.display()))?.next().is_some()
    {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is not empty; restore writes into an empty or new directory only",
            target.display()
        );
    }
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    let started = Instant::now();
    let rt = crate::config::build_runtime()?;
    let (store, _) = open_store(rt.handle(), store_file)?;
    let scratch = tempfile::Builder::new()
        .prefix(".tierfs-restore-")
        .tempdir_in(target.parent().unwrap_or(Path::new("/tmp")))
        .context("creating a scratch directory next to the target")?;
    // A read-only session of a scratch data dir restores the metadata (cut to the data that
    // reached the store, as on a new node) and fetches file data as it is read.
    let mut config = SessionConfig::new(scratch.path(), None);
    config.store = Some(Arc::new(store));
    config.workspace = workspace.to_owned();
    config.access = snapshot.map_or(Access::ReadOnly, |id| Access::Snapshot(id.to_owned()));
    config.cache_size = Some(RESTORE_CACHE_SIZE);
    // A scratch copy read once: nothing to keep warm.
    config.hot_set = false;
    let session = Session::open(config, rt.handle()).context("reading the workspace from the store")?;
    let vfs = session.vfs();
    let mut progress = Progress {
        show: !json && std::io::stderr().is_terminal(),
        total: if json { 0 } else { total_bytes(vfs, ROOT_INO)? },
        last_shown: Instant::now(),
    };
    let written = export::write_tree(vfs, target, same_owner, &mut progress)?;
    export::set_attrs(target, &vfs.getattr(ROOT_INO)?, same_owner)?;
    if progress.show {
        eprintln!();
    }
    let report =
        RestoreReport { snapshot: snapshot.map(str::to_owned), written, millis: started.elapsed().as_millis() as u64 };
    drop(session);
    drop(scratch);
    Ok(report)
}

/// The progress line on a terminal: files and bytes written of the total.
struct Progress {
    show: bool,
    total: u64,
    last_shown: Instant,
}

impl export::Visitor for Progress {
    fn progress(&mut self, written: &export::Written) {
        if self.show && self.last_shown.elapsed().as_millis() >= 200 {
            self.last_shown = Instant::now();
            eprint!("\rrestore: {} files, {} of {} MiB", written.files, written.bytes >> 20, self.total >> 20);
        }
    }
}

/// The data the files under `dir` hold (their chunks in the store, not their holes), for the
/// progress line.
fn total_bytes(vfs: &Vfs, dir: Ino) -> Result<u64> {
    let mut n = 0;
    for e in export::entries(vfs, dir)? {
        match e.kind {
            FileKind::Dir => n += total_bytes(vfs, e.ino)?,
            FileKind::File => n += vfs.chunk_records(e.ino).iter().map(|(_, r)| u64::from(r.len)).sum::<u64>(),
            _ => {}
        }
    }
    Ok(n)
}
