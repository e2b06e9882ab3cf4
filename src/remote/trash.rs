//! The trash: the files, symlinks and directory trees a workspace lost within the retention
//! window, found in the journal (docs/SEMANTICS.md, "Trash"). Nothing is moved aside when a
//! file is unlinked: the journal already holds every name removal with its time, and retention
//! keeps the journal and the blocks it names, so a removed entry is the state just before the
//! batch that removed it.
//!
//! Invariants:
//! - an entry is a name of a regular file, a symlink or a directory that a batch removed:
//!   deleted (unlinked, or its directory's tree removed name by name) or replaced (another
//!   inode renamed or linked over it). A rename that moves an entry keeps it and is no entry;
//! - each entry names the batch its state is read before (`seq`, `unix_ms`): for a file or a
//!   symlink the batch that removed it; for a directory the first batch of the run that
//!   emptied it (`rm -rf` removes the files first), so that state holds its whole tree. A run
//!   is the removals in the directory's subtree since anything was last put into it;
//! - the path is the one the entry had in that state, resolved through its directories'
//!   recorded parents; a directory whose place cannot be found (a damaged store) shows as
//!   `#ino` rather than a guess. Everything read comes through `remote`'s decoders;
//! - cost grows with what was removed, not with the size of directories: each directory's
//!   path is found once per replay (one listing of its parent gives every sibling directory
//!   too) and kept until a batch renames or removes it.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::{Result, Workspace, rfc3339_ms};
use crate::meta::{JournalBatch, JournalOp, MetaStore, codec};
use crate::types::{FileKind, Ino, ROOT_INO};

/// A chain of parents longer than this is a cycle a damaged store made.
const MAX_DEPTH: usize = 4096;

/// How an entry left its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Removal {
    /// Unlinked (`rm`, `rm -rf`).
    Deleted,
    /// Another entry renamed (or linked) over it: the old version.
    Replaced,
}

/// What a trash entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Symlink,
    /// A directory: restoring it brings back its whole tree.
    Dir,
}

/// One entry of the trash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrashEntry {
    /// Relative to the workspace root.
    pub path: String,
    pub what: Removal,
    pub kind: EntryKind,
    /// When its removal began (unix milliseconds), and the same in RFC 3339.
    pub unix_ms: u64,
    pub time: String,
    /// The batch its state is read before: the one that removed it (a directory: the first
    /// of the run that emptied it), so the state just before holds it whole.
    pub seq: u64,
    /// Bytes of a file, of a symlink's target; 0 for a directory.
    pub size: u64,
    pub ino: Ino,
}

impl Workspace {
    /// The entries removed from their names after `since_ms` (or since the oldest point the
    /// store can rebuild, when that is later) up to `now_ms`, in the order they went. `meta`
    /// is an empty scratch store the journal is replayed into.
    pub async fn trash(&self, meta: &MetaStore, since_ms: u64, now_ms: u64) -> Result<Vec<TrashEntry>> {
        let mut found = Vec::new();
        let mut replay = Replay::default();
        let mut watch = |meta: &MetaStore, batch: &JournalBatch| -> Result<()> {
            found.extend(replay.batch(meta, batch)?);
            Ok(())
        };
        self.replay_since(meta, since_ms, now_ms, &mut watch).await?;
        Ok(found)
    }
}

/// One name a batch puts (`new`) or deletes (`None`).
struct NameChange<'a> {
    parent: Ino,
    name: &'a [u8],
    new: Option<(Ino, FileKind)>,
}

/// What a replay of the journal keeps between batches to find removals cheaply.
#[derive(Default)]
struct Replay {
    paths: DirPaths,
    /// Directories whose subtree lost entries since anything was last put into it: the first
    /// batch of that run (`seq`, `unix_ms`). A directory removed at the end of such a run
    /// (`rm -rf`) is restored from the state before its first batch.
    emptying: HashMap<Ino, (u64, u64)>,
}

impl Replay {
    /// The entries `batch` removes from their names, read from `meta` before it is applied.
    fn batch(&mut self, meta: &MetaStore, batch: &JournalBatch) -> Result<Vec<TrashEntry>> {
        let ops = meta.expand_ranges(batch.ops.clone())?;
        let changes = name_changes(&ops)?;
        // Inodes given a name in this batch: an entry renamed away is moved, not removed.
        let named: HashSet<Ino> = changes.iter().filter_map(|c| c.new.map(|(ino, _)| ino)).collect();
        let mut out = Vec::new();
        let mut moved_dirs = Vec::new();
        for c in &changes {
            if let Some((ino, FileKind::Dir)) = c.new {
                moved_dirs.push(ino);
            }
            let Some((old, kind)) = meta.dentry(c.parent, c.name)? else { continue };
            if kind == FileKind::Dir && c.new.is_none_or(|(n, _)| n != old) {
                moved_dirs.push(old);
            }
            let what = match c.new {
                Some((new, _)) if new == old => continue,
                Some(_) => Removal::Replaced,
                None if named.contains(&old) => continue,
                None => Removal::Deleted,
            };
            let kind = match kind {
                FileKind::File => EntryKind::File,
                FileKind::Symlink => EntryKind::Symlink,
                FileKind::Dir => EntryKind::Dir,
                _ => continue,
            };
            let mut from = (batch.seq, batch.unix_ms);
            if kind == EntryKind::Dir {
                from = self.emptying.remove(&old).unwrap_or(from);
            }
            let run = self.emptying.entry(c.parent).or_insert(from);
            *run = (*run).min(from);
            let size = if kind == EntryKind::Dir { 0 } else { meta.inode(old)?.map_or(0, |r| r.attr.size) };
            let mut path = self.paths.dir(meta, c.parent)?;
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(&String::from_utf8_lossy(c.name));
            let (seq, unix_ms) = from;
            out.push(TrashEntry { path, what, kind, unix_ms, time: rfc3339_ms(unix_ms), seq, size, ino: old });
        }
        self.ends_runs(meta, &ops, &changes)?;
        for dir in moved_dirs {
            self.paths.forget(dir, named.contains(&dir));
        }
        for c in &changes {
            if let Some((ino, FileKind::Dir)) = c.new {
                self.paths.named(c.parent, c.name, ino);
            }
        }
        Ok(out)
    }

    /// Something put into a directory (a new name, a file written) ends the run of removals
    /// in it and in every directory above it.
    fn ends_runs(&mut self, meta: &MetaStore, ops: &[JournalOp], changes: &[NameChange<'_>]) -> Result<()> {
        if self.emptying.is_empty() {
            return Ok(());
        }
        let mut filled: Vec<Ino> = changes.iter().filter(|c| c.new.is_some()).map(|c| c.parent).collect();
        for op in ops {
            if let JournalOp::Put { key, value } = op
                && key.len() == 9
                && key[..1] == codec::INODE_TABLE
            {
                let rec = codec::decode_inode(codec::key_ino(key)?, value)?;
                // A file written, not one losing its last name (nor a directory's times).
                if rec.attr.kind != FileKind::Dir && rec.attr.nlink > 0 {
                    filled.push(rec.parent);
                }
            }
        }
        for mut dir in filled {
            for _ in 0..MAX_DEPTH {
                self.emptying.remove(&dir);
                if dir == ROOT_INO {
                    break;
                }
                let Some(rec) = meta.inode(dir)? else { break };
                dir = rec.parent;
            }
        }
        Ok(())
    }
}

/// The names `ops` put or delete.
fn name_changes(ops: &[JournalOp]) -> Result<Vec<NameChange<'_>>> {
    let dentry = |key: &[u8]| key.len() > 9 && key[..1] == codec::DENTRY_TABLE;
    let mut out = Vec::new();
    for op in ops {
        let (key, new) = match op {
            JournalOp::Put { key, value } if dentry(key) => (key, Some(codec::decode_dentry(value)?)),
            JournalOp::Delete { key } if dentry(key) => (key, None),
            _ => continue,
        };
        out.push(NameChange { parent: codec::key_ino(key)?, name: &key[9..], new });
    }
    Ok(out)
}

/// The paths of directories, relative to the root, found once per replay: finding one lists
/// its parent, and that listing names every directory in it.
#[derive(Default)]
struct DirPaths {
    known: HashMap<Ino, String>,
    /// Directories whose entries were listed (so `known` may hold directories below them).
    listed: HashSet<Ino>,
}

impl DirPaths {
    /// The path of directory `dir` (empty for the root); `#ino` for one whose place is not
    /// found (a damaged store).
    fn dir(&mut self, meta: &MetaStore, dir: Ino) -> Result<String> {
        // Up to the root or to a directory whose path is known...
        let mut chain = Vec::new();
        let mut top = dir;
        while top != ROOT_INO && !self.known.contains_key(&top) {
            let Some(rec) = meta.inode(top)? else { return Ok(format!("#{dir}")) };
            if chain.len() >= MAX_DEPTH {
                return Ok(format!("#{dir}"));
            }
            chain.push(top);
            top = rec.parent;
        }
        let mut path = self.known.get(&top).cloned().unwrap_or_default();
        // ...then down, one listing per directory on the way.
        for &child in chain.iter().rev() {
            if !self.known.contains_key(&child) {
                self.listed.insert(top);
                for (name, ino, kind) in meta.list_dir(top)? {
                    if kind == FileKind::Dir {
                        let name = String::from_utf8_lossy(&name);
                        let p = if path.is_empty() { name.into_owned() } else { format!("{path}/{name}") };
                        self.known.insert(ino, p);
                    }
                }
            }
            let Some(p) = self.known.get(&child) else { return Ok(format!("#{dir}")) };
            path = p.clone();
            top = child;
        }
        Ok(path)
    }

    /// Directory `ino` got the name `name` in `parent`: known at once when the directories of
    /// `parent` are (a directory listed has all of its directories known).
    fn named(&mut self, parent: Ino, name: &[u8], ino: Ino) {
        if !self.listed.contains(&parent) {
            return;
        }
        let name = String::from_utf8_lossy(name);
        let path = match self.known.get(&parent) {
            Some(p) => format!("{p}/{name}"),
            None if parent == ROOT_INO => name.into_owned(),
            None => return,
        };
        self.known.insert(ino, path);
    }

    /// Directory `dir` was removed or got another name: its path, and with `renamed` those
    /// of the directories below it, are found again when asked for. (A removed directory is
    /// empty: nothing below it is known.)
    fn forget(&mut self, dir: Ino, renamed: bool) {
        let Some(path) = self.known.remove(&dir) else { return };
        if renamed && self.listed.remove(&dir) {
            let below = format!("{path}/");
            self.known.retain(|_, p| !p.starts_with(&below));
        }
        self.listed.remove(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ino: Ino, parent: Ino, kind: FileKind) -> JournalOp {
        let mut rec = codec::test_file_record(ino, 10);
        rec.attr.kind = kind;
        rec.parent = parent;
        JournalOp::Put { key: codec::inode_key(ino), value: codec::encode_inode(&rec) }
    }

    fn name(parent: Ino, name: &str, ino: Ino, kind: FileKind) -> JournalOp {
        let value = codec::encode_dentry(ino, kind).to_vec();
        JournalOp::Put { key: codec::dentry_key(parent, name.as_bytes()), value }
    }

    fn unname(parent: Ino, name: &str) -> JournalOp {
        JournalOp::Delete { key: codec::dentry_key(parent, name.as_bytes()) }
    }

    /// Shows `ops` to the replay as batch `seq`, then applies them, as a trash listing does.
    fn step(meta: &MetaStore, replay: &mut Replay, seq: u64, ops: Vec<JournalOp>) -> Vec<(String, EntryKind, u64)> {
        let batch = JournalBatch { seq, ops, unix_ms: seq * 1000 };
        let found = replay.batch(meta, &batch).expect("replay");
        meta.import(&batch.ops, seq).expect("import");
        found.into_iter().map(|e| (e.path, e.kind, e.seq)).collect()
    }

    #[test]
    fn paths_follow_directory_renames_within_the_window_and_a_tree_goes_from_its_first_removal() {
        use FileKind::{Dir, File};
        let scratch = tempfile::tempdir().expect("tempdir");
        let meta = MetaStore::open(scratch.path()).expect("meta");
        let mut r = Replay::default();
        // a/ (2), a/b/ (3), a/b/{f,g,h} (4, 5, 6)
        let mut ops = vec![record(2, ROOT_INO, Dir), name(ROOT_INO, "a", 2, Dir)];
        ops.extend([record(3, 2, Dir), name(2, "b", 3, Dir)]);
        for (ino, n) in [(4, "f"), (5, "g"), (6, "h")] {
            ops.extend([record(ino, 3, File), name(3, n, ino, File)]);
        }
        assert!(step(&meta, &mut r, 1, ops).is_empty());
        assert_eq!(step(&meta, &mut r, 2, vec![unname(3, "f")]), [("a/b/f".into(), EntryKind::File, 2)]);
        // `a` renamed to `z`: what is known of the paths below it is not reused.
        assert!(step(&meta, &mut r, 3, vec![unname(ROOT_INO, "a"), name(ROOT_INO, "z", 2, Dir)]).is_empty());
        assert_eq!(step(&meta, &mut r, 4, vec![unname(3, "g")]), [("z/b/g".into(), EntryKind::File, 4)]);
        // `z/b` moved to the root as `c`: a move, not a removal.
        let moved = vec![unname(2, "b"), name(ROOT_INO, "c", 3, Dir), record(3, ROOT_INO, Dir)];
        assert!(step(&meta, &mut r, 5, moved).is_empty());
        assert_eq!(step(&meta, &mut r, 6, vec![unname(3, "h")]), [("c/h".into(), EntryKind::File, 6)]);
        // The directory goes last; its state is read before the first removal in it since
        // anything was put into it, which held its whole tree.
        assert_eq!(step(&meta, &mut r, 7, vec![unname(ROOT_INO, "c")]), [("c".into(), EntryKind::Dir, 2)]);
        // A new name in a directory starts its run again.
        let ops =
            vec![record(7, ROOT_INO, Dir), name(ROOT_INO, "d", 7, Dir), record(8, 7, File), name(7, "x", 8, File)];
        assert!(step(&meta, &mut r, 8, ops).is_empty());
        assert_eq!(step(&meta, &mut r, 9, vec![unname(7, "x")]), [("d/x".into(), EntryKind::File, 9)]);
        assert_eq!(step(&meta, &mut r, 10, vec![unname(ROOT_INO, "d")]), [("d".into(), EntryKind::Dir, 9)]);
    }
}
