//! The workspace's recorded files as a git tree: a walk of the [`Vfs`] that picks the files
//! the settings include and `.gitignore` files do not exclude, and writes each as a blob
//! (a notebook stripped, a file over the size limit as a pointer).
//!
//! Invariants:
//! - only regular files are recorded; `.git` directories (users' own repositories) are never
//!   entered, so they are ordinary files to tierfs and never mixed into the history;
//! - a file is read only when its inode, size, mtime or ctime moved since the last walk of
//!   this session (the cache), and a file over the limit is never read: its pointer names
//!   its size and a hash of its chunks' block ids, which the metadata holds;
//! - names that are not UTF-8 are skipped (and counted): the globs match text.

use std::collections::HashMap;

use ignore::gitignore::Gitignore;

use super::config::{self, HistoryConfig, SETTINGS_FILE};
use super::{HistoryError, Result, notebook};
use crate::types::{FileKind, Ino, ROOT_INO, Timestamp};
use crate::vfs::{Caller, Vfs};

/// The first line of a pointer file, which stands for a file over the size limit.
pub const POINTER_HEADER: &str = "tierfs pointer v1\n";
/// Largest read the walk asks the workspace for at once.
const READ_PIECE: u64 = 1 << 20;

/// What a recorded file was, for the cache: same inode, size and times mean same content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Seen {
    ino: Ino,
    size: u64,
    mtime: Timestamp,
    ctime: Timestamp,
}

/// Blobs of files recorded before, by what the file was.
#[derive(Debug, Default)]
pub struct BlobCache {
    blobs: HashMap<Seen, git2::Oid>,
}

/// Counts of one walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WalkCounts {
    pub files: u64,
    /// Files recorded as pointers (over the size limit).
    pub pointers: u64,
    /// Bytes read from the workspace (files not in the cache).
    pub read_bytes: u64,
    /// Entries skipped because their names are not UTF-8.
    pub skipped_names: u64,
}

/// Writes the files of `vfs` that `settings` record into `repo` as blobs and returns the
/// tree's id.
pub fn write_tree(
    repo: &git2::Repository,
    vfs: &Vfs,
    settings: &HistoryConfig,
    cache: &mut BlobCache,
) -> Result<(git2::Oid, WalkCounts)> {
    let mut index = git2::Index::new().map_err(HistoryError::git("making an index"))?;
    let mut w = Walk { repo, vfs, cache, settings, index: &mut index, counts: WalkCounts::default() };
    let mut ignores = Vec::new();
    w.dir(ROOT_INO, "", &mut ignores)?;
    let counts = w.counts;
    let tree = index.write_tree_to(repo).map_err(HistoryError::git("writing the tree"))?;
    Ok((tree, counts))
}

/// The settings the workspace holds (`.tierfshistory.toml`), or the defaults.
pub fn read_settings(vfs: &Vfs) -> Result<HistoryConfig> {
    match vfs.lookup(ROOT_INO, SETTINGS_FILE.as_bytes()) {
        Ok(attr) if attr.kind == FileKind::File => {
            let bytes = read_file(vfs, attr.ino, attr.size, SETTINGS_FILE)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| HistoryError::Config { path: SETTINGS_FILE.into(), reason: "not UTF-8".into() })?;
            HistoryConfig::parse(&text)
        }
        Ok(_) | Err(crate::vfs::VfsError::NotFound) => Ok(HistoryConfig::defaults()),
        Err(source) => Err(HistoryError::Workspace { path: SETTINGS_FILE.into(), source }),
    }
}

struct Walk<'a> {
    repo: &'a git2::Repository,
    vfs: &'a Vfs,
    cache: &'a mut BlobCache,
    settings: &'a HistoryConfig,
    index: &'a mut git2::Index,
    counts: WalkCounts,
}

impl Walk<'_> {
    fn dir(&mut self, dir: Ino, rel: &str, ignores: &mut Vec<Gitignore>) -> Result<()> {
        let at =
            |source| HistoryError::Workspace { path: if rel.is_empty() { "/".into() } else { rel.into() }, source };
        let entries = list(self.vfs, dir).map_err(at)?;
        let pushed = match entries.iter().find(|(name, attr)| name == b".gitignore" && attr.kind == FileKind::File) {
            Some((_, attr)) => {
                let path = join(rel, ".gitignore");
                let text = read_file(self.vfs, attr.ino, attr.size.min(READ_PIECE), &path)?;
                ignores.push(config::gitignore(rel, &String::from_utf8_lossy(&text)));
                true
            }
            None => false,
        };
        for (name, attr) in entries {
            let Ok(name) = String::from_utf8(name) else {
                self.counts.skipped_names += 1;
                continue;
            };
            let path = join(rel, &name);
            match attr.kind {
                FileKind::Dir => {
                    if name == ".git" || ignored(ignores, &path, true) || self.settings.excludes_dir(&path) {
                        continue;
                    }
                    self.dir(attr.ino, &path, ignores)?;
                }
                FileKind::File if self.settings.includes(&path) && !ignored(ignores, &path, false) => {
                    self.file(&path, &attr)?;
                }
                _ => {}
            }
        }
        if pushed {
            ignores.pop();
        }
        Ok(())
    }

    fn file(&mut self, path: &str, attr: &crate::types::Attr) -> Result<()> {
        let seen = Seen { ino: attr.ino, size: attr.size, mtime: attr.mtime, ctime: attr.ctime };
        let pointer = attr.size > self.settings.max_file_size;
        let oid = match self.cache.blobs.get(&seen) {
            Some(oid) => *oid,
            None => {
                let content = if pointer {
                    pointer_text(self.vfs, attr.ino, attr.size)
                } else {
                    let bytes = read_file(self.vfs, attr.ino, attr.size, path)?;
                    self.counts.read_bytes += bytes.len() as u64;
                    match path.ends_with(".ipynb").then(|| notebook::strip(&bytes)).flatten() {
                        Some(stripped) => stripped,
                        None => bytes,
                    }
                };
                let oid = self.repo.blob(&content).map_err(HistoryError::git(format!("storing {path}")))?;
                self.cache.blobs.insert(seen, oid);
                oid
            }
        };
        self.counts.files += 1;
        self.counts.pointers += u64::from(pointer);
        let mode = if attr.perm & 0o111 != 0 { 0o100755 } else { 0o100644 };
        let entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode,
            uid: 0,
            gid: 0,
            file_size: 0,
            id: oid,
            flags: path.len().min(0xfff) as u16,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        };
        self.index.add(&entry).map_err(HistoryError::git(format!("recording {path}")))
    }
}

/// Whether the `.gitignore` rules in force (innermost last) exclude `path`.
fn ignored(ignores: &[Gitignore], path: &str, is_dir: bool) -> bool {
    for g in ignores.iter().rev() {
        let m = g.matched(path, is_dir);
        if m.is_ignore() {
            return true;
        }
        if m.is_whitelist() {
            return false;
        }
    }
    false
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") }
}

/// The entries of `dir` with their attributes, without `.` and `..`.
fn list(vfs: &Vfs, dir: Ino) -> crate::vfs::VfsResult<Vec<(Vec<u8>, crate::types::Attr)>> {
    let fh = vfs.opendir(dir)?;
    let mut out: Vec<(Vec<u8>, crate::types::Attr)> = Vec::new();
    let mut offset = 0;
    let listed = loop {
        match vfs.readdirplus(dir, fh, offset) {
            Ok(batch) if batch.is_empty() => break Ok(()),
            Ok(batch) => {
                offset = batch.last().map_or(offset, |(e, _)| e.offset);
                out.extend(batch.into_iter().map(|(e, a)| (e.name, a)));
            }
            Err(e) => break Err(e),
        }
    };
    vfs.releasedir(dir, fh)?;
    listed?;
    out.retain(|(name, _)| name != b"." && name != b"..");
    Ok(out)
}

/// The first `size` bytes of file `ino` (fewer when it shrank meanwhile).
pub fn read_file(vfs: &Vfs, ino: Ino, size: u64, path: &str) -> Result<Vec<u8>> {
    let at = |source| HistoryError::Workspace { path: path.into(), source };
    let fh = vfs.open(&Caller::ROOT, ino, libc::O_RDONLY).map_err(at)?;
    let mut out = Vec::with_capacity(size as usize);
    let read = loop {
        let left = size - out.len() as u64;
        if left == 0 {
            break Ok(());
        }
        match vfs.read_bytes(ino, fh, out.len() as u64, left.min(READ_PIECE) as u32) {
            Ok(b) if b.is_empty() => break Ok(()),
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => break Err(e),
        }
    };
    let released = vfs.release(ino, fh);
    read.map_err(at)?;
    released.map_err(at)?;
    Ok(out)
}

/// The pointer recorded for a file over the size limit: its size and a hash of its chunks'
/// block ids (keyed content hashes: equal contents give equal pointers).
fn pointer_text(vfs: &Vfs, ino: Ino, size: u64) -> Vec<u8> {
    let mut h = blake3::Hasher::new();
    for (idx, rec) in vfs.chunk_records(ino) {
        h.update(&idx.to_le_bytes());
        h.update(&rec.block);
        h.update(&rec.len.to_le_bytes());
    }
    format!("{POINTER_HEADER}size {size}\nchunks {}\n", h.finalize().to_hex()).into_bytes()
}

/// The size a pointer file names, if `content` is one.
pub fn pointer_size(content: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(content).ok()?.strip_prefix(POINTER_HEADER)?;
    text.lines().find_map(|l| l.strip_prefix("size ")).and_then(|s| s.parse().ok())
}
