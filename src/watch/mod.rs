//! Watch mode's core: a plain directory (the *watched directory*) mirrored into a workspace,
//! for machines where FUSE is unavailable. The directory holds the bytes; the workspace holds
//! the same tree as a FUSE mount would write it (the same inodes, chunk boundaries and block
//! ids, so the two modes dedup against each other and restore each other), with every chunk
//! recorded as evicted: this node keeps metadata only.
//!
//! A [`Mirror`] knows nothing of change notification: the front end (the daemon's watcher)
//! tells it which directories to look at again, and [`Mirror::rescan`] or
//! [`Mirror::rescan_dirs`] make the workspace match them.
//!
//! Invariants:
//! - The workspace changes only through the [`Vfs`], one metadata batch per operation, and a
//!   file's new content (size, times, mode and every chunk record) lands in one batch
//!   ([`Vfs::adopt_content`]) after the blocks it names are in the store: a snapshot holds a
//!   file's old version or its new one.
//! - A file's bytes are taken only when a read of it was not raced by a change: the open
//!   file's `fstat` before and after, and an `lstat` of its path after, must agree on size,
//!   mtime, ctime and inode; otherwise the read is discarded and retried with a backoff, and a
//!   file that keeps changing keeps its last good version (listed as unstable).
//! - A chunk whose block id is unchanged is neither uploaded nor re-recorded; a block the
//!   workspace has is never uploaded again. Holes (`SEEK_HOLE`) are never read.
//! - Removals of a pass are applied at its end, so an entry moved within one pass is renamed in
//!   the workspace, not removed and created again; an entry that kept its inode, size and
//!   mtime is not read again.
//! - The watched directory and the data dir never contain each other.
//! - A path `.tierfsignore` (gitignore syntax, at the top of the directory) matches is neither
//!   added nor updated nor removed: what the workspace has of it stays as it was.
//! - User xattrs (`user.*`) are compared when an entry is new or its ctime moved.
//! - Nothing outside the directory is read: every path is resolved beneath a descriptor of
//!   it with no symlink followed on any component (`beneath.rs`), so a directory swapped for a
//!   symlink between a listing and a read leads nowhere.

mod beneath;
mod error;
mod import;
mod restore;
mod scan;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::WatchError;
use serde::{Deserialize, Serialize};

use self::beneath::Beneath;
use self::import::Packer;
use crate::tier::BlockStore;
use crate::types::{Ino, ROOT_INO};
use crate::vfs::Vfs;

pub type Result<T, E = WatchError> = std::result::Result<T, E>;

/// How often a read raced by a change is tried before the file is left at its last good
/// version.
const READ_ATTEMPTS: u32 = 4;

/// The file in the data dir that names the directory this workspace copy mirrors.
const MARKER: &str = "watched-dir";

/// What [`Mirror::start`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// The directory was empty and the workspace was not: the workspace was written into it.
    Restored(Counts),
    /// The directory already mirrors this workspace (the marker in the data dir names it, or
    /// its top-level entries are the workspace's).
    Resumed,
    /// The workspace was empty: the first scan uploads the directory.
    Fresh,
}

/// Totals of what passes did (cumulative in [`Mirror::totals`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Files whose content was read and recorded anew.
    pub files_read: u64,
    /// Bytes read from changed files (holes excluded).
    pub bytes_read: u64,
    /// Chunks uploaded (new blocks), and their plaintext bytes.
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    pub created: u64,
    pub renamed: u64,
    pub linked: u64,
    pub removed: u64,
    /// Entries whose mode, owner or times alone changed.
    pub attrs_set: u64,
    /// Entries whose user xattrs changed.
    pub xattrs_set: u64,
    /// Reads discarded because the file changed during them.
    pub torn_reads: u64,
    /// Files read through a clone (reflink): a consistent version taken in one step.
    #[serde(default)]
    pub cloned_reads: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.files_read += o.files_read;
        self.bytes_read += o.bytes_read;
        self.chunks_uploaded += o.chunks_uploaded;
        self.bytes_uploaded += o.bytes_uploaded;
        self.created += o.created;
        self.renamed += o.renamed;
        self.linked += o.linked;
        self.removed += o.removed;
        self.attrs_set += o.attrs_set;
        self.xattrs_set += o.xattrs_set;
        self.torn_reads += o.torn_reads;
        self.cloned_reads += o.cloned_reads;
    }
}

/// What one pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Pass {
    pub counts: Counts,
    /// Files that kept changing during every read: their last good version stays.
    pub unstable: Vec<String>,
    /// Entries that could not be read, with why (the rest synced).
    pub unreadable: Vec<(String, String)>,
}

/// The identity of an entry of the watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LocalId {
    dev: u64,
    ino: u64,
}

/// Where an entry of the watched directory is in the workspace.
#[derive(Debug, Clone)]
struct Known {
    ino: Ino,
    parent: Ino,
    name: Vec<u8>,
    /// Its ctime when last looked at: an xattr change moves only the ctime.
    ctime: (i64, i64),
}

/// The file in the watched directory whose gitignore patterns exclude paths from sync.
pub const IGNORE_FILE: &str = ".tierfsignore";

/// `.tierfsignore`, reread when it changes.
#[derive(Default)]
struct Ignore {
    matcher: Option<ignore::gitignore::Gitignore>,
    stamp: Option<(i64, i64, u64)>,
}

impl Ignore {
    /// Rereads the file if it changed; a file that does not parse is reported, not fatal. It
    /// is read beneath the watched directory, never through a symlink.
    fn refresh(&mut self, root: &Path, beneath: &Beneath) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let path = root.join(IGNORE_FILE);
        let rel = Path::new(IGNORE_FILE);
        let stamp = beneath.lstat(rel).ok().filter(|m| m.is_file()).map(|m| (m.mtime(), m.mtime_nsec(), m.ino()));
        if stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        self.matcher = None;
        stamp?;
        let text = match beneath.open_read(rel).and_then(std::io::read_to_string) {
            Ok(text) => text,
            Err(e) => return Some(format!("{}: {e}", path.display())),
        };
        let mut b = ignore::gitignore::GitignoreBuilder::new(root);
        let mut problem = None;
        for line in text.lines() {
            if let Err(e) = b.add_line(Some(path.clone()), line) {
                problem.get_or_insert_with(|| format!("{}: {e}", path.display()));
            }
        }
        match b.build() {
            Ok(m) => self.matcher = Some(m),
            Err(e) => return Some(format!("{}: {e}", path.display())),
        }
        problem
    }

    fn ignores(&self, rel: &Path, is_dir: bool) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.matched_path_or_any_parents(rel, is_dir).is_ignore())
    }
}

/// A watched directory and the workspace that mirrors it.
pub struct Mirror {
    vfs: Arc<Vfs>,
    root: PathBuf,
    /// Every access to the directory goes through it, confined to the directory.
    beneath: Beneath,
    data_dir: PathBuf,
    packer: Packer,
    /// Entries of the directory seen by earlier passes, by inode: how renames and hard links
    /// are told from new files.
    known: HashMap<LocalId, Known>,
    ignore: Ignore,
    totals: Counts,
    unstable: Vec<String>,
    unreadable: Vec<(String, String)>,
    /// Devices where a clone failed once (no reflinks there): their files are read and verified.
    no_clones: HashSet<u64>,
}

impl Mirror {
    /// A mirror of `dir` into the workspace `vfs` serves (which needs a store). Checks `dir`;
    /// changes nothing.
    pub fn new(vfs: Arc<Vfs>, dir: &Path) -> Result<Mirror> {
        let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => WatchError::Missing(dir.to_path_buf()),
            _ => WatchError::Io { op: "stat", path: dir.to_path_buf(), source: e },
        })?;
        if !meta.is_dir() {
            return Err(WatchError::NotADirectory(dir.to_path_buf()));
        }
        let root = dir.canonicalize().map_err(WatchError::io("resolve", dir))?;
        let data_dir = vfs.stats().data_dir;
        let data_dir = data_dir.canonicalize().map_err(WatchError::io("resolve", &data_dir))?;
        if root.starts_with(&data_dir) || data_dir.starts_with(&root) {
            return Err(WatchError::Overlaps { dir: root, data_dir });
        }
        let blocks: Arc<dyn BlockStore> = vfs.block_store().ok_or(WatchError::NoStore)?;
        let beneath = Beneath::open(&root).map_err(WatchError::io("open", &root))?;
        Ok(Mirror {
            vfs,
            root,
            beneath,
            data_dir,
            packer: Packer::new(blocks),
            known: HashMap::new(),
            ignore: Ignore::default(),
            totals: Counts::default(),
            unstable: Vec::new(),
            unreadable: Vec::new(),
            no_clones: HashSet::new(),
        })
    }

    /// The watched directory (resolved).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Decides how the directory and the workspace meet (see [`Start`]), restoring the
    /// workspace into an empty directory. A directory that is not empty and does not hold the
    /// workspace is refused, and nothing is changed.
    pub fn start(&mut self) -> Result<Start> {
        let local = scan::local_names(&self.beneath, &self.root)?;
        let ws: Vec<String> = self
            .vfs
            .meta()
            .list_dir(ROOT_INO)
            .map_err(|e| WatchError::Vfs { path: self.root.clone(), source: e.into() })?
            .into_iter()
            .map(|(n, _, _)| String::from_utf8_lossy(&n).into_owned())
            .collect();
        let marker = self.data_dir.join(MARKER);
        let marked = std::fs::read(&marker).is_ok_and(|m| m == self.root.as_os_str().as_encoded_bytes());
        let start = if ws.is_empty() {
            Start::Fresh
        } else if local.is_empty() {
            Start::Restored(self.restore()?)
        } else if marked || same_names(&local, &ws) {
            Start::Resumed
        } else {
            let only_local = local.iter().filter(|n| !ws.contains(n)).cloned().collect();
            let only_workspace = ws.iter().filter(|n| !local.contains(n)).cloned().collect();
            return Err(WatchError::Mismatch { dir: self.root.clone(), only_local, only_workspace });
        };
        std::fs::write(&marker, self.root.as_os_str().as_encoded_bytes()).map_err(WatchError::io("write", &marker))?;
        Ok(start)
    }

    /// Makes the whole workspace match the directory (a full pass).
    pub fn rescan(&mut self) -> Result<Pass> {
        self.pass(&[PathBuf::new()], true)
    }

    /// Makes the workspace match the entries of the directories `dirs` (relative to the
    /// watched directory; empty: the root): what change events name. Their subdirectories
    /// are not descended into unless they are new or moved. A directory that is gone is looked
    /// at from the nearest parent that exists.
    pub fn rescan_dirs(&mut self, dirs: &[PathBuf]) -> Result<Pass> {
        self.pass(dirs, false)
    }

    fn pass(&mut self, dirs: &[PathBuf], deep: bool) -> Result<Pass> {
        let problem = self.ignore.refresh(&self.root, &self.beneath);
        let mut pass = scan::Pass::new(self, deep);
        if let Some(p) = problem {
            pass.report_unreadable(IGNORE_FILE, p);
        }
        let dirs = if deep { scan::outermost(dirs) } else { dirs.to_vec() };
        for d in dirs {
            pass.reconcile_path(&d)?;
        }
        let out = pass.finish()?;
        self.totals.add(&out.counts);
        self.unstable.clone_from(&out.unstable);
        self.unreadable.clone_from(&out.unreadable);
        Ok(out)
    }

    /// Everything every pass did so far.
    pub fn totals(&self) -> &Counts {
        &self.totals
    }

    /// Files left at their last good version by the last pass.
    pub fn unstable(&self) -> &[String] {
        &self.unstable
    }

    /// Entries the last pass could not read.
    pub fn unreadable(&self) -> &[(String, String)] {
        &self.unreadable
    }
}

fn same_names(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}
