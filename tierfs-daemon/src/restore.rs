//! `tierfs restore`: a plain copy of a workspace (its latest state, one snapshot, or the state
//! at a time of day, `--at`) into a local directory, without mounting anything and without
//! taking the writer lease.
//!
//! The workspace's metadata is restored into a scratch data directory, opened by a read-only
//! session of the core, and written out by `tierfs::export`: directories, regular files (only
//! their data chunks are fetched; holes stay holes), symlinks, hard links (one inode, several
//! names), fifos, modes, xattrs, times, and ownership when run as root.
//!
//! Invariants: the target directory must be empty or missing (nothing of the user's is
//! overwritten); the scratch directory is removed afterwards however the copy ends; a file
//! that cannot be read fully is an error, never a silently short copy (the exporter's); with
//! `--at`, every file whose data at that time had not reached the store is named in the
//! report, and a time the store cannot rebuild fails before the target is made.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use tierfs::ErrorKind;
use tierfs::export;
use tierfs::remote::{TimelinePoint, rfc3339_ms};
use tierfs::session::{Access, RESTORE_CACHE_SIZE, Session, SessionConfig};
use tierfs::vfs::{FileKind, Ino, ROOT_INO, Vfs};

pub use crate::config::parse_time;
use crate::logging::bail_with;
use crate::status::format_bytes;
use crate::store_link::open_store;

/// Which state of the workspace a restore copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    Latest,
    Snapshot(String),
    /// The state at this time of day (unix milliseconds).
    At(u64),
}

/// What a point-in-time restore rebuilt (`--at`).
#[derive(Debug, Serialize)]
pub struct PointInTime {
    /// The time asked for.
    pub at: String,
    pub at_unix_ms: u64,
    /// The sync, checkpoint or journal start it started from.
    pub base: TimelinePoint,
    /// Journal batches replayed after the base, and the last one restored.
    pub batches: u64,
    pub seq: u64,
    /// When the restored state became current (the last batch replayed, or the base).
    pub state: String,
    pub state_unix_ms: u64,
    /// Files (paths in DIR) whose data at that time had not all reached the store: restored
    /// with what the store had. A file with no name at that time (open, unlinked) is listed
    /// as `#ino`.
    pub incomplete: Vec<String>,
    /// The journal skips batches after this one: the state is older than asked.
    pub gap_after: Option<u64>,
    /// How long rebuilding the metadata at that time took (the rest of `millis` is the copy).
    pub rebuild_millis: u64,
}

/// What a restore wrote.
#[derive(Debug, Serialize)]
pub struct RestoreReport {
    pub snapshot: Option<String>,
    /// Set by `--at`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<PointInTime>,
    /// Entries and data written (their fields sit at the top level of the JSON).
    #[serde(flatten)]
    pub written: export::Written,
    pub millis: u64,
}

/// Restores the workspace's state `from` of `store_file` into `target`.
pub fn restore(
    store_file: &Path,
    workspace: &str,
    from: &From,
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
    let started = Instant::now();
    let rt = crate::config::build_runtime()?;
    let access = match from {
        From::Latest => Access::ReadOnly,
        From::Snapshot(id) => Access::Snapshot(id.clone()),
        From::At(ms) => Access::At(*ms),
    };
    // Next to the target when its parent exists (else in the temporary directory): the
    // target itself is made only once the state is read, so a refused time changes nothing.
    let near = target.parent().filter(|p| p.is_dir()).map_or_else(std::env::temp_dir, Path::to_path_buf);
    let (session, scratch) = past_session(&rt, store_file, workspace, access, &near)?;
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    let vfs = session.vfs();
    let incomplete: HashSet<Ino> =
        session.restored_at().map(|r| r.incomplete.iter().copied().collect()).unwrap_or_default();
    let mut progress = Progress {
        show: !json && std::io::stderr().is_terminal(),
        total: if json { 0 } else { total_bytes(vfs, ROOT_INO)? },
        last_shown: Instant::now(),
        target: target.to_path_buf(),
        incomplete: &incomplete,
        named: BTreeSet::new(),
        seen: HashSet::new(),
    };
    let written = export::write_tree(vfs, target, same_owner, &mut progress)?;
    export::set_attrs(target, &vfs.getattr(ROOT_INO)?, same_owner)?;
    if progress.show {
        eprintln!();
    }
    let at = session.restored_at().map(|r| {
        let mut names: Vec<String> = progress.named.iter().cloned().collect();
        // Files restored under no name (open and unlinked at that time) still count.
        let mut unnamed: Vec<Ino> = r.incomplete.iter().copied().filter(|i| !progress.seen.contains(i)).collect();
        unnamed.sort_unstable();
        names.extend(unnamed.into_iter().map(|i| format!("#{i}")));
        PointInTime {
            at: r.at.clone(),
            at_unix_ms: r.at_unix_ms,
            base: r.base.clone(),
            batches: r.batches,
            seq: r.seq,
            state: rfc3339_ms(r.state_unix_ms),
            state_unix_ms: r.state_unix_ms,
            incomplete: names,
            gap_after: r.gap_after,
            rebuild_millis: r.millis,
        }
    });
    let snapshot = match from {
        From::Snapshot(id) => Some(id.clone()),
        _ => None,
    };
    let report = RestoreReport { snapshot, at, written, millis: started.elapsed().as_millis() as u64 };
    drop(session);
    drop(scratch);
    Ok(report)
}

/// A read-only session of `workspace` in a scratch data dir made in `near` (removed when the
/// returned directory is dropped, after the session): its metadata restored as `access` says
/// (cut to the data that reached the store, as on a new node), file data fetched as it is read.
pub fn past_session(
    rt: &tokio::runtime::Runtime,
    store_file: &Path,
    workspace: &str,
    access: Access,
    near: &Path,
) -> Result<(Session, tempfile::TempDir)> {
    let (store, _) = open_store(rt.handle(), store_file)?;
    let scratch = tempfile::Builder::new()
        .prefix(".tierfs-restore-")
        .tempdir_in(near)
        .with_context(|| format!("creating a scratch directory in {}", near.display()))?;
    let mut config = SessionConfig::new(scratch.path(), None);
    config.store = Some(Arc::new(store));
    config.workspace = workspace.to_owned();
    config.access = access;
    config.cache_size = Some(RESTORE_CACHE_SIZE);
    // A scratch copy read once: nothing to keep warm.
    config.hot_set = false;
    let session = Session::open(config, rt.handle()).context("reading the workspace from the store")?;
    Ok((session, scratch))
}

/// The progress line on a terminal: files and bytes written of the total; and the names of
/// the files a point-in-time restore found incomplete.
struct Progress<'a> {
    show: bool,
    total: u64,
    last_shown: Instant,
    target: PathBuf,
    incomplete: &'a HashSet<Ino>,
    /// Their paths relative to the target, every name of each.
    named: BTreeSet<String>,
    seen: HashSet<Ino>,
}

impl export::Visitor for Progress<'_> {
    fn written(&mut self, path: &Path, ino: Ino, _parent: Ino, _name: &[u8]) -> export::Result<()> {
        if self.incomplete.contains(&ino) {
            let rel = path.strip_prefix(&self.target).unwrap_or(path);
            self.named.insert(rel.to_string_lossy().into_owned());
            self.seen.insert(ino);
        }
        Ok(())
    }

    fn progress(&mut self, written: &export::Written) {
        if self.show && self.last_shown.elapsed().as_millis() >= 200 {
            self.last_shown = Instant::now();
            // Padded: a shorter line than the last one must cover it.
            let (done, total) = (format_bytes(written.bytes), format_bytes(self.total));
            eprint!("\rrestore: {} files, {done:>10} of {total}", written.files);
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
