//! The trash: the regular files a workspace lost within the retention window, found in the
//! journal (docs/SEMANTICS.md, "Trash"). Nothing is moved aside when a file is unlinked: the
//! journal already holds every name removal with its time, and retention keeps the journal and
//! the blocks it names, so a removed file is the state just before the batch that removed it.
//!
//! Invariants:
//! - an entry is a name of a regular file that a batch removed: deleted (unlinked, or its
//!   directory's tree removed name by name) or replaced (another inode renamed or linked over
//!   it). A rename that moves a file keeps it and is no entry;
//! - each entry names the batch that removed it (`seq`, `unix_ms`): the state just before it
//!   ([`super::Workspace::restore_before`]) holds the file as it was;
//! - the path is the one the file had in that state, resolved through its directories'
//!   recorded parents; a directory whose place cannot be found (a damaged store) shows as
//!   `#ino` rather than a guess. Everything read comes through `remote`'s decoders.

use std::collections::HashSet;

use serde::Serialize;

use super::{Result, Workspace, rfc3339_ms};
use crate::meta::{JournalBatch, JournalOp, MetaStore, codec};
use crate::types::{FileKind, Ino, ROOT_INO};

/// How a file left its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Removal {
    /// Unlinked (`rm`, `rm -rf`).
    Deleted,
    /// Another file renamed (or linked) over it: the old version.
    Replaced,
}

/// One file of the trash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrashEntry {
    /// Relative to the workspace root.
    pub path: String,
    pub what: Removal,
    /// When it was removed (unix milliseconds), and the same in RFC 3339.
    pub unix_ms: u64,
    pub time: String,
    /// The batch that removed it: the state just before it holds the file.
    pub seq: u64,
    pub size: u64,
    pub ino: Ino,
}

impl Workspace {
    /// The regular files removed from their names after `since_ms` (or since the oldest point
    /// the store can rebuild, when that is later) up to `now_ms`, oldest first. `meta` is an
    /// empty scratch store the journal is replayed into.
    pub async fn trash(&self, meta: &MetaStore, since_ms: u64, now_ms: u64) -> Result<Vec<TrashEntry>> {
        let mut found = Vec::new();
        let mut watch = |meta: &MetaStore, batch: &JournalBatch| -> Result<()> {
            found.extend(removals(meta, batch)?);
            Ok(())
        };
        self.replay_since(meta, since_ms, now_ms, &mut watch).await?;
        Ok(found)
    }
}

/// The files `batch` removes from their names, read from `meta` before it is applied.
fn removals(meta: &MetaStore, batch: &JournalBatch) -> Result<Vec<TrashEntry>> {
    let ops = meta.expand_ranges(batch.ops.clone())?;
    let dentry = |key: &[u8]| key.len() > 9 && key[..1] == codec::DENTRY_TABLE;
    // Inodes given a name in this batch: a file renamed away is moved, not removed.
    let mut named: HashSet<Ino> = HashSet::new();
    for op in &ops {
        if let JournalOp::Put { key, value } = op
            && dentry(key)
        {
            named.insert(codec::decode_dentry(value)?.0);
        }
    }
    let mut out = Vec::new();
    for op in &ops {
        let (key, what) = match op {
            JournalOp::Put { key, value } if dentry(key) => (key, Some(codec::decode_dentry(value)?.0)),
            JournalOp::Delete { key } if dentry(key) => (key, None),
            _ => continue,
        };
        let parent = codec::key_ino(key)?;
        let name = &key[9..];
        let Some((old, FileKind::File)) = meta.dentry(parent, name)? else { continue };
        let what = match what {
            Some(new) if new == old => continue,
            Some(_) => Removal::Replaced,
            None if named.contains(&old) => continue,
            None => Removal::Deleted,
        };
        let size = meta.inode(old)?.map_or(0, |r| r.attr.size);
        let mut path = dir_path(meta, parent)?;
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&String::from_utf8_lossy(name));
        out.push(TrashEntry {
            path,
            what,
            unix_ms: batch.unix_ms,
            time: rfc3339_ms(batch.unix_ms),
            seq: batch.seq,
            size,
            ino: old,
        });
    }
    Ok(out)
}

/// The path of directory `dir` relative to the root (empty for the root), through each
/// directory's recorded parent; `#ino` for one whose name in its parent is not found.
fn dir_path(meta: &MetaStore, mut dir: Ino) -> Result<String> {
    let mut names: Vec<String> = Vec::new();
    // A chain longer than this is a cycle a damaged store made.
    for _ in 0..4096 {
        if dir == ROOT_INO {
            names.reverse();
            return Ok(names.join("/"));
        }
        let Some(rec) = meta.inode(dir)? else { break };
        let Some((name, _, _)) = meta.list_dir(rec.parent)?.into_iter().find(|(_, ino, _)| *ino == dir) else {
            break;
        };
        names.push(String::from_utf8_lossy(&name).into_owned());
        dir = rec.parent;
    }
    names.reverse();
    let rest = names.join("/");
    Ok(if rest.is_empty() { format!("#{dir}") } else { format!("#{dir}/{rest}") })
}
