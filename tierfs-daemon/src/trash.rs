//! `tierfs trash list|restore`: the files, symlinks and directory trees a live mount or
//! watched directory lost (unlinked, `rm -rf`, or replaced by a rename over them) within the
//! retention window, read from the journal in the store, and putting one back.
//!
//! This process does the work with its caller's rights: it asks the serving process only to
//! flush (so the latest removals are in the store) and for nothing else, reads the store
//! itself (as `tierfs restore` does, with no lease), and writes the file back *through* the
//! mount or watched directory, so the live namespace sees an ordinary new file and the journal
//! records it. Writing into the data dir or the store instead would be invisible to the
//! running front end, or overwritten by it.
//!
//! Invariants:
//! - PATH is hostile: it must lie in a running mount or watch of this user, and the file is
//!   made beneath the mount's root through descriptors (`export::write_beneath`): no
//!   `..` above the root, no symlink on the way; a refusal writes nothing;
//! - nothing is overwritten: a taken path gets the entry beside it, `NAME.restored-TIME`,
//!   and the answer names the path it got; a directory comes back with its whole tree, each
//!   entry made new;
//! - a file whose data at that time had not all reached the store is restored with what the
//!   store had, and the answer says so (`incomplete`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tierfs::ErrorKind;
use tierfs::remote::{DEFAULT_RETENTION, EntryKind, Removal, TrashEntry, rfc3339_ms};
use tierfs::session::Access;
use tierfs::vfs::{FileKind, Ino, ROOT_INO};

use crate::cli::{Cli, TrashAction};
use crate::control::{self, Request, StatusReport};
use crate::history::{self, Target};
use crate::logging::{Reported, bail_with, failure};
use crate::store_link;

/// How long the serving process may take to put what it holds in the store before the
/// journal is read (the latest removals are in it after that).
const FLUSH_SECS: u64 = 30;

/// `tierfs trash restore` output.
#[derive(Debug, Serialize)]
pub struct Restored {
    /// The path asked for, and the path the file got (beside it when that was taken), both
    /// inside the mount or watched directory.
    pub path: PathBuf,
    pub restored_as: PathBuf,
    pub beside: bool,
    /// The version put back: the state at this time (RFC 3339, unix ms).
    pub version: String,
    pub version_unix_ms: u64,
    /// What had happened to it, when it came from the trash.
    pub what: Option<Removal>,
    pub kind: EntryKind,
    /// A file's bytes (a symlink's target's length; 0 for a directory).
    pub size: u64,
    /// Entries made: 1 for a file or a symlink, a directory's whole tree with itself.
    pub entries: u64,
    /// Its data at that time had not all reached the store: restored with what the store had.
    pub incomplete: bool,
}

pub fn run(cli: &Cli, action: &TrashAction, all: Vec<StatusReport>) -> Result<()> {
    match action {
        TrashAction::List { dir } => list(cli, dir.as_deref(), all),
        TrashAction::Restore { path, at } => restore(cli, path, at.as_deref(), all),
    }
}

fn list(cli: &Cli, dir: Option<&Path>, all: Vec<StatusReport>) -> Result<()> {
    let t = history::target_dir(all, dir)?;
    let under = t.path.clone().unwrap_or_default();
    let entries: Vec<TrashEntry> =
        removed(&t)?.into_iter().filter(|e| under.is_empty() || is_under(&e.path, &under)).collect();
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&entries).context("encoding JSON output")?);
        return Ok(());
    }
    if entries.is_empty() {
        println!("the trash of {} is empty", t.status.mountpoint.join(&under).display());
    }
    for e in &entries {
        let what = match e.what {
            Removal::Deleted => "deleted ",
            Removal::Replaced => "replaced",
        };
        let path = if e.kind == EntryKind::Dir { format!("{}/", e.path) } else { e.path.clone() };
        println!("{}  {what}  {:>12} B  {path}", e.time, e.size);
    }
    Ok(())
}

/// Whether workspace path `path` is `dir` or lies beneath it.
fn is_under(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The store file and workspace of a mount, or a refusal when it has none.
fn store_of(status: &StatusReport) -> Result<(PathBuf, String)> {
    match (&status.store, &status.remote) {
        (Some(store), Some(remote)) => Ok((store.clone(), remote.workspace.clone())),
        _ => bail_with!(
            ErrorKind::InvalidInput,
            "{} has no store: without a journal there is no trash (mount it with a store)",
            status.mountpoint.display()
        ),
    }
}

/// Asks the serving process to put what it holds in the store, so the journal read next has
/// the latest removals. A mount that cannot is no reason to refuse: the trash is then what
/// reached the store.
fn flush(status: &StatusReport) {
    let wait = Duration::from_secs(FLUSH_SECS + 5);
    if let Err(e) = control::request(&status.socket, &Request::Flush { timeout_secs: FLUSH_SECS }, wait) {
        tracing::warn!("{}: no flush before reading the trash: {e}", status.mountpoint.display());
    }
}

/// Every removal the journal holds within the retention window, oldest first.
fn removed(t: &Target) -> Result<Vec<TrashEntry>> {
    let (store, workspace) = store_of(&t.status)?;
    flush(&t.status);
    let (rt, ws) = store_link::open_workspace(&store, &workspace)?;
    let scratch = tempfile::Builder::new().prefix("tierfs-trash-").tempdir().context("creating a scratch directory")?;
    let meta = tierfs::meta::MetaStore::open(scratch.path()).context("opening a scratch metadata store")?;
    let now = tierfs::meta::system_unix_ms();
    let since = now.saturating_sub(DEFAULT_RETENTION.as_millis() as u64);
    rt.block_on(ws.trash(&meta, since, now)).map_err(|e| Reported::new(e.kind(), e.to_string()).into())
}

fn restore(cli: &Cli, path: &Path, at: Option<&str>, all: Vec<StatusReport>) -> Result<()> {
    let t = history::target(all, None, Some(path))?;
    if t.status.read_only {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is mounted read-only: nothing can be put back into it",
            t.status.mountpoint.display()
        );
    }
    let rel = t.path.clone().unwrap_or_default();
    let (store, workspace) = store_of(&t.status)?;
    // Which version: the state at TIME, or just before the newest removal of the path.
    let (access, version_ms, entry) = match at {
        Some(time) => {
            let ms = crate::restore::parse_time(time, tierfs::meta::system_unix_ms())?;
            flush(&t.status);
            (Access::At(ms), ms, None)
        }
        None => {
            let Some(e) = removed(&t)?.into_iter().rev().find(|e| e.path == rel) else {
                bail_with!(
                    ErrorKind::NotFound,
                    "{rel} was not deleted or replaced within the last {} days; `tierfs trash list` shows what was",
                    DEFAULT_RETENTION.as_secs() / 86_400
                );
            };
            (Access::Before { unix_ms: e.unix_ms, seq: e.seq }, e.unix_ms, Some(e))
        }
    };
    let rt = crate::config::build_runtime()?;
    let (session, _scratch) = crate::restore::past_session(&rt, &store, &workspace, access, &std::env::temp_dir())?;
    let vfs = session.vfs();
    let ino = match &entry {
        Some(e) => e.ino,
        None => entry_at(vfs, &rel, version_ms)?,
    };
    let kind = match vfs.getattr(ino).map(|a| a.kind) {
        Ok(FileKind::Dir) => EntryKind::Dir,
        Ok(FileKind::Symlink) => EntryKind::Symlink,
        _ => EntryKind::File,
    };
    let incomplete = session.restored_at().is_some_and(|r| incomplete_under(vfs, ino, &r.incomplete));
    let suffix = format!("restored-{}", stamp(version_ms));
    let (got, written) = tierfs::export::write_beneath(vfs, ino, &t.status.mountpoint, Path::new(&rel), &suffix)
        .map_err(|e| Reported::new(e.kind(), e.to_string()))?;
    let out = Restored {
        path: t.status.mountpoint.join(&rel),
        restored_as: t.status.mountpoint.join(&got),
        beside: got != Path::new(&rel),
        version: rfc3339_ms(version_ms),
        version_unix_ms: version_ms,
        what: entry.map(|e| e.what),
        kind,
        size: if kind == EntryKind::Dir { 0 } else { vfs.getattr(ino).map(|a| a.size).unwrap_or(written.bytes) },
        entries: written.files + written.dirs + written.symlinks + written.hard_links + written.other,
        incomplete,
    };
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&out).context("encoding JSON output")?);
        return Ok(());
    }
    let place = if out.beside {
        format!("beside it as {} ({} is taken)", out.restored_as.display(), out.path.display())
    } else {
        format!("at {}", out.path.display())
    };
    match out.kind {
        EntryKind::Dir => println!("restored {rel}/ as of {} ({} entries) {place}", out.version, out.entries),
        _ => println!("restored {rel} as of {} ({} bytes) {place}", out.version, out.size),
    }
    if out.incomplete {
        println!("incomplete: its data at {} had not all reached the store; restored as the store had it", out.version);
    }
    Ok(())
}

/// Whether `ino`, or for a directory anything beneath it, is among `incomplete` (files
/// whose data had not all reached the store).
fn incomplete_under(vfs: &tierfs::vfs::Vfs, ino: Ino, incomplete: &[Ino]) -> bool {
    if incomplete.is_empty() {
        return false;
    }
    let mut todo = vec![ino];
    while let Some(i) = todo.pop() {
        if incomplete.contains(&i) {
            return true;
        }
        if vfs.getattr(i).is_ok_and(|a| a.kind == FileKind::Dir) {
            todo.extend(tierfs::export::entries(vfs, i).unwrap_or_default().into_iter().map(|e| e.ino));
        }
    }
    false
}

/// The inode of `rel` (a file, a symlink or a directory) in the state a past session shows.
fn entry_at(vfs: &tierfs::vfs::Vfs, rel: &str, at_ms: u64) -> Result<Ino> {
    let mut ino = ROOT_INO;
    let mut kind = FileKind::Dir;
    for name in rel.split('/').filter(|n| !n.is_empty()) {
        let attr = vfs.lookup(ino, name.as_bytes()).map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                failure!(ErrorKind::NotFound, "{rel} did not exist at {}", rfc3339_ms(at_ms))
            } else {
                failure!(e.kind(), "{rel} at {}: {e}", rfc3339_ms(at_ms))
            }
        })?;
        (ino, kind) = (attr.ino, attr.kind);
    }
    if rel.split('/').all(str::is_empty) {
        bail_with!(
            ErrorKind::InvalidInput,
            "that is the root of the mount; `tierfs restore --at TIME DIR` copies the whole workspace"
        );
    }
    if !matches!(kind, FileKind::File | FileKind::Symlink | FileKind::Dir) {
        bail_with!(
            ErrorKind::InvalidInput,
            "{rel} was not a file, a symlink or a directory at {}; `tierfs restore --at` copies whole trees",
            rfc3339_ms(at_ms)
        );
    }
    Ok(ino)
}

/// `unix_ms` as a compact UTC time for a file name: `20261206T140327Z`.
fn stamp(unix_ms: u64) -> String {
    i64::try_from(unix_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(|| unix_ms.to_string(), |t| t.format("%Y%m%dT%H%M%SZ").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_a_directory_are_its_own_not_its_namesakes() {
        assert!(is_under("out/a.txt", "out"));
        assert!(is_under("out", "out"));
        assert!(!is_under("outputs/a.txt", "out"));
    }

    #[test]
    fn stamps_are_compact_utc() {
        assert_eq!(stamp(1_796_000_000_000), "20261130T005320Z");
    }
}
