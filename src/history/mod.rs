//! The history of a workspace's code and configs: at every snapshot the files the settings
//! include (`*.py`, `*.yaml`, notebooks stripped of outputs, ...; see [`config`]) are
//! committed with libgit2 into a bare repository that belongs to the workspace, so what
//! changed between experiments reads with the git tools people know (`tierfs log`, `diff`,
//! `show`, `checkout`, `history push`, `history export`).
//!
//! The repository in the data dir (`history.git`) is a cache. What counts is in the store:
//! each commit's new git objects go up as one sealed *history object*
//! (`ws/<hash>/hist/<seq>`, docs/FORMAT.md): a git pack of what the commit added, headed by
//! the commit it brings. A fresh node imports the objects it lacks, in order, before any use,
//! so the history comes back with the workspace after a reset.
//!
//! Invariants:
//! - `refs/heads/main` moves only after the commit's history object is stored: the local
//!   repository never holds a commit the store lacks, so a failed upload leaves nothing to
//!   reconcile;
//! - a snapshot whose recorded tree equals the last commit's makes no commit;
//! - one commit per snapshot; its message is the snapshot's message plus a
//!   `Tierfs-Snapshot: <id>` trailer, by which a snapshot id names its commit;
//! - the history objects are numbered from 1 without gaps and created conditionally, so two
//!   writers cannot both extend the history (the second is told and imports the first's);
//! - calls block (they enter the runtime with `Handle::block_on`): make them from a plain
//!   thread.

pub mod config;
mod error;
pub mod notebook;
mod tree;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tracing::info;

use crate::remote::Workspace;
use crate::vfs::Vfs;

pub use config::HistoryConfig;
pub use error::HistoryError;
pub use tree::{BlobCache, POINTER_HEADER, WalkCounts, pointer_size};

pub type Result<T, E = HistoryError> = std::result::Result<T, E>;

/// The history repository's directory in the data dir.
pub const REPO_DIR: &str = "history.git";
/// The branch the history is on.
pub const BRANCH: &str = "refs/heads/main";
/// The trailer that names a commit's snapshot.
pub const SNAPSHOT_TRAILER: &str = "Tierfs-Snapshot: ";
/// The version of the history object layout.
const OBJECT_FORMAT: u32 = 1;
/// The file in the repository that says how many history objects it holds.
const STATE_FILE: &str = "tierfs-seq";

/// The header of a history object (docs/FORMAT.md).
#[derive(Debug, Serialize, Deserialize)]
struct ObjectHeader {
    format: u32,
    seq: u64,
    /// The commit the pack brings (hex).
    head: String,
    /// The commit before it, whose objects the pack leaves out.
    parent: Option<String>,
    snapshot: String,
}

/// What recording a snapshot did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recorded {
    /// The new commit; `None` when the tree had not changed (no commit).
    pub commit: Option<String>,
    #[serde(flatten)]
    pub counts: WalkCounts,
    /// Bytes of the history object stored (0 without a commit).
    pub object_bytes: u64,
}

/// One entry of `log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub commit: String,
    /// The snapshot the commit was recorded at.
    pub snapshot: Option<String>,
    /// The first line of the message.
    pub summary: String,
    pub message: String,
    pub author: String,
    pub time_unix: i64,
    /// With a path: `added`, `modified` or `deleted` (what the commit did to it).
    pub change: Option<String>,
}

/// A file as a commit holds it (`show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    pub commit: String,
    pub snapshot: Option<String>,
    pub path: String,
    pub executable: bool,
    pub content: Vec<u8>,
    /// For a file recorded as a pointer: the size of the real file.
    pub pointer_size: Option<u64>,
}

/// What `push` or `export` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub to: String,
    pub head: String,
    pub commits: u64,
}

/// The whole history as one git pack, for a client to write with its own rights
/// (`history export`, `history push`): the serving process, which may run as root, never
/// writes outside its data dir on a caller's behalf (docs/ARCHITECTURE.md, "Trust: who writes
/// where").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    /// The newest commit (hex).
    pub head: String,
    pub commits: u64,
    /// The remote the workspace's history settings name, if any.
    pub remote: Option<String>,
    /// Every object reachable from `head`.
    #[serde(with = "base64_bytes")]
    pub pack: Vec<u8>,
}

/// A byte string as base64 text in JSON (a third of the size of a number array).
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

impl Bundle {
    /// Writes the history into `dir` (new or empty) as a plain git repository with a work tree
    /// of the newest commit.
    pub fn export(&self, dir: &Path) -> Result<Published> {
        match std::fs::read_dir(dir) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(HistoryError::NotEmpty(dir.to_path_buf()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HistoryError::Io { what: "reading", path: dir.to_path_buf(), source: e }),
        }
        let repo = self.unpack(dir, false)?;
        let mut checkout = git2::build::CheckoutBuilder::new();
        checkout.force();
        repo.checkout_head(Some(&mut checkout)).map_err(HistoryError::git(format!("writing {}", dir.display())))?;
        Ok(Published { to: dir.display().to_string(), head: self.head.clone(), commits: self.commits })
    }

    /// Pushes the branch to git remote `remote` (a path or URL; the settings' `remote` when
    /// `None`), from a bare copy made in `scratch` (an empty directory the caller removes).
    pub fn push(&self, remote: Option<&str>, scratch: &Path) -> Result<Published> {
        let url = match remote.map(str::to_string).or_else(|| self.remote.clone()) {
            Some(u) => u,
            None => return Err(HistoryError::NoRemote),
        };
        let repo = self.unpack(scratch, true)?;
        push_branch(&repo, &url)?;
        Ok(Published { to: redact_url(&url), head: self.head.clone(), commits: self.commits })
    }

    /// A new repository in `dir` holding the pack, its branch at `head`.
    fn unpack(&self, dir: &Path, bare: bool) -> Result<git2::Repository> {
        let mut opts = git2::RepositoryInitOptions::new();
        opts.bare(bare).initial_head("main").mkpath(true).no_reinit(true);
        let repo = git2::Repository::init_opts(dir, &opts)
            .map_err(HistoryError::git(format!("creating a repository in {}", dir.display())))?;
        let bad = |reason: String| HistoryError::Git {
            what: "reading the history sent by the serving process".into(),
            source: git2::Error::from_str(&reason),
        };
        let head = git2::Oid::from_str(&self.head).map_err(|e| bad(e.to_string()))?;
        add_pack(&repo, &self.pack, head, "tierfs history", &bad)?;
        Ok(repo)
    }
}

/// Adds git pack `pack` to `repo` and moves [`BRANCH`] to `head`, which the pack must bring;
/// what is wrong with the pack is told by `bad`.
fn add_pack(
    repo: &git2::Repository,
    pack: &[u8],
    head: git2::Oid,
    reflog: &str,
    bad: &dyn Fn(String) -> HistoryError,
) -> Result<()> {
    {
        let odb = repo.odb().map_err(HistoryError::git("opening the object database"))?;
        let mut w = odb.packwriter().map_err(HistoryError::git("importing a pack"))?;
        std::io::Write::write_all(&mut w, pack).map_err(|e| bad(e.to_string()))?;
        w.commit().map_err(|e| bad(format!("pack does not index: {e}")))?;
        repo.find_commit(head).map_err(|e| bad(format!("head {head} not in the pack: {e}")))?;
    }
    repo.reference(BRANCH, head, true, reflog).map_err(HistoryError::git("moving the branch"))?;
    Ok(())
}

/// Adds history object `n` (`plain`: its envelope opened) to `repo`: its header decoded, its
/// git pack indexed by libgit2, its head looked up. What is wrong with it is `Corrupt`.
fn import_object(repo: &git2::Repository, n: u64, plain: &[u8]) -> Result<()> {
    let corrupt = |reason: String| HistoryError::Corrupt { seq: n, reason };
    let (head, pack) = decode_history_object(n, plain)?;
    add_pack(repo, pack, head, &format!("import {n}"), &corrupt)
}

/// Imports history object `n` into a new bare repository in `dir`, as a fresh node's first
/// import does: for tests that feed it hostile bytes.
#[doc(hidden)]
pub fn import_into_new_repository(dir: &Path, n: u64, plain: &[u8]) -> Result<()> {
    let repo = git2::Repository::init_bare(dir).map_err(HistoryError::git("creating a repository"))?;
    import_object(&repo, n, plain)
}

/// `url` as it may be shown: a user name or password in it (`https://user:token@host/...`)
/// is replaced by `***`, so that logs, errors and `--json` never carry a credential.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if !u.username().is_empty() || u.password().is_some() => {
            let _ = u.set_username("***");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Pushes [`BRANCH`] of `repo` to `url`; a remote whose branch has other commits refuses.
/// Errors name the remote with its credentials redacted ([`redact_url`]).
fn push_branch(repo: &git2::Repository, url: &str) -> Result<()> {
    let shown = redact_url(url);
    let secret = url::Url::parse(url).ok().and_then(|u| u.password().map(str::to_string)).filter(|p| !p.is_empty());
    // libgit2's messages may quote the URL, credentials and all.
    let scrub = |reason: &str| {
        let reason = reason.replace(url, &shown);
        match &secret {
            Some(p) => reason.replace(p.as_str(), "***"),
            None => reason,
        }
    };
    let failed = |reason: String| HistoryError::Push { remote: shown.clone(), reason: scrub(&reason) };
    let mut r = repo.remote_anonymous(url).map_err(|e| failed(e.message().to_string()))?;
    let mut refused: Option<(String, String)> = None;
    {
        let mut callbacks = git2::RemoteCallbacks::new();
        callbacks.push_update_reference(|reference, status| {
            if let Some(s) = status {
                refused = Some((reference.to_string(), s.to_string()));
            }
            Ok(())
        });
        let mut opts = git2::PushOptions::new();
        opts.remote_callbacks(callbacks);
        let spec = format!("{BRANCH}:{BRANCH}");
        if let Err(e) = r.push(&[spec.as_str()], Some(&mut opts)) {
            return Err(if e.code() == git2::ErrorCode::NotFastForward {
                HistoryError::PushRejected {
                    remote: shown.clone(),
                    reference: BRANCH.into(),
                    reason: scrub(&format!("{} (the remote has commits the history lacks)", e.message())),
                }
            } else {
                failed(e.message().to_string())
            });
        }
    }
    match refused {
        Some((reference, reason)) => {
            let reason = scrub(&reason);
            Err(HistoryError::PushRejected { remote: shown, reference, reason })
        }
        None => Ok(()),
    }
}

/// A workspace's history (see the module documentation).
pub struct History {
    repo: git2::Repository,
    dir: PathBuf,
    ws: Arc<Workspace>,
    handle: Handle,
    cache: BlobCache,
    /// History objects the local repository holds (imported or written).
    seq: u64,
    /// The repository is in memory ([`MEMORY_DIR`]) and goes with this value.
    in_memory: bool,
}

impl Drop for History {
    fn drop(&mut self) {
        if self.in_memory {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Where a history kept in memory lives: a tmpfs every Linux node has.
pub const MEMORY_DIR: &str = "/dev/shm";

/// The name of a history directory in [`MEMORY_DIR`] starts with this, then the pid of the
/// process that made it.
const MEMORY_PREFIX: &str = "tierfs-history-";

/// Removes the history directories of this user's processes that are gone (a `kill -9` drops
/// no value): memory a tmpfs would otherwise hold until the node reboots.
fn remove_dead_memory_dirs(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(MEMORY_PREFIX)).and_then(|r| r.split('-').next())
        else {
            continue;
        };
        let mine = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        if mine && pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A new private (0700) directory for a history in [`MEMORY_DIR`], refused when that is not a
/// tmpfs (the history would reach a disk in plaintext).
fn memory_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = Path::new(MEMORY_DIR);
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let on_tmpfs = rustix::fs::statfs(base).is_ok_and(|s| s.f_type as u64 == TMPFS_MAGIC);
    if !on_tmpfs {
        return Err(HistoryError::Io {
            what: "keeping the history in memory (the cache is encrypted at rest) in",
            path: base.to_path_buf(),
            source: std::io::Error::other("not a tmpfs on this node"),
        });
    }
    remove_dead_memory_dirs(base);
    let name = format!("{MEMORY_PREFIX}{}-{}", std::process::id(), hex::encode(rand::random::<[u8; 8]>()));
    let dir = base.join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(HistoryError::io("creating", &dir))?;
    Ok(dir)
}

impl History {
    /// Opens (or creates) the history repository of data dir `data_dir`, then imports the
    /// store's history objects it lacks. Blocking.
    ///
    /// `in_memory` (a data dir whose cache is encrypted at rest): the repository is kept in a
    /// private directory of memory ([`MEMORY_DIR`], a tmpfs), never on the data dir's disk,
    /// rebuilt from the store at first use and removed when the history is dropped; a copy
    /// an older version left in the data dir is removed.
    pub fn open(data_dir: &Path, in_memory: bool, ws: Arc<Workspace>, handle: Handle) -> Result<History> {
        let dir = if in_memory {
            let left = data_dir.join(REPO_DIR);
            if left.exists() {
                std::fs::remove_dir_all(&left).map_err(HistoryError::io("removing", &left))?;
                info!("history: removed the plaintext copy {} (the cache is encrypted at rest)", left.display());
            }
            memory_dir()?
        } else {
            data_dir.join(REPO_DIR)
        };
        let opened = History::open_at(dir.clone(), in_memory, ws, handle);
        if opened.is_err() && in_memory {
            let _ = std::fs::remove_dir_all(&dir);
        }
        opened
    }

    fn open_at(dir: PathBuf, in_memory: bool, ws: Arc<Workspace>, handle: Handle) -> Result<History> {
        let repo = if dir.join("HEAD").exists() {
            git2::Repository::open_bare(&dir).map_err(HistoryError::git(format!("opening {}", dir.display())))?
        } else {
            let mut opts = git2::RepositoryInitOptions::new();
            opts.bare(true).initial_head("main").mkpath(true);
            git2::Repository::init_opts(&dir, &opts)
                .map_err(HistoryError::git(format!("creating {}", dir.display())))?
        };
        let seq = match std::fs::read_to_string(dir.join(STATE_FILE)) {
            Ok(s) => s.trim().parse().unwrap_or(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(HistoryError::Io { what: "reading", path: dir.join(STATE_FILE), source: e }),
        };
        let mut h = History { repo, dir, ws, handle, cache: BlobCache::default(), seq, in_memory };
        h.catch_up()?;
        Ok(h)
    }

    /// The local repository (for tools that read it directly).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Imports the history objects after the ones the repository holds.
    fn catch_up(&mut self) -> Result<()> {
        let ws = self.ws.clone();
        let numbers = self.handle.block_on(ws.history_numbers_from(self.seq + 1))?;
        let mut imported = 0;
        for n in numbers {
            if n != self.seq + 1 {
                return Err(HistoryError::Corrupt { seq: self.seq + 1, reason: format!("missing (the next is {n})") });
            }
            let plain = self
                .handle
                .block_on(ws.get_history(n))?
                .ok_or_else(|| HistoryError::Corrupt { seq: n, reason: "listed but not readable".into() })?;
            self.import(n, &plain)?;
            imported += 1;
        }
        if imported > 0 {
            info!(objects = imported, seq = self.seq, "history: imported from the store");
        }
        Ok(())
    }

    fn import(&mut self, n: u64, plain: &[u8]) -> Result<()> {
        import_object(&self.repo, n, plain)?;
        self.set_seq(n)
    }

    fn set_seq(&mut self, n: u64) -> Result<()> {
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        std::fs::write(&tmp, format!("{n}\n")).map_err(HistoryError::io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(HistoryError::io("renaming", &path))?;
        self.seq = n;
        Ok(())
    }

    fn head(&self) -> Result<Option<git2::Commit<'_>>> {
        match self.repo.find_reference(BRANCH) {
            Ok(r) => Ok(Some(r.peel_to_commit().map_err(HistoryError::git("reading the branch"))?)),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(HistoryError::Git { what: "reading the branch".into(), source: e }),
        }
    }

    /// Commits the recorded files of `vfs` for snapshot `snapshot` (unless nothing changed)
    /// and stores the commit's objects. Blocking.
    pub fn record(&mut self, vfs: &Vfs, snapshot: &str, message: Option<&str>) -> Result<Recorded> {
        self.catch_up()?;
        let settings = tree::read_settings(vfs)?;
        let (tree_id, counts) = tree::write_tree(&self.repo, vfs, &settings, &mut self.cache)?;
        let (commit, parent_id) = {
            let parent = self.head()?;
            let unchanged = match &parent {
                Some(p) => p.tree_id() == tree_id,
                None => counts.files == 0,
            };
            if unchanged {
                return Ok(Recorded { commit: None, counts, object_bytes: 0 });
            }
            let tree = self.repo.find_tree(tree_id).map_err(HistoryError::git("reading the new tree"))?;
            let sig = self.signature(&settings)?;
            let text = commit_message(message, snapshot);
            let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
            let commit =
                self.repo.commit(None, &sig, &sig, &text, &tree, &parents).map_err(HistoryError::git("committing"))?;
            (commit, parent.as_ref().map(|p| p.id()))
        };
        let pack = self.pack(commit, parent_id)?;
        let n = self.seq + 1;
        let header = ObjectHeader {
            format: OBJECT_FORMAT,
            seq: n,
            head: commit.to_string(),
            parent: parent_id.map(|p| p.to_string()),
            snapshot: snapshot.to_string(),
        };
        let plain = encode_object(&header, &pack);
        let ws = self.ws.clone();
        if !self.handle.block_on(ws.create_history(n, &plain))? {
            return Err(HistoryError::Taken(n));
        }
        self.repo.reference(BRANCH, commit, true, "record").map_err(HistoryError::git("moving the branch"))?;
        self.set_seq(n)?;
        Ok(Recorded { commit: Some(commit.to_string()), counts, object_bytes: plain.len() as u64 })
    }

    /// A git pack of the objects `commit` has that `parent` does not.
    fn pack(&self, commit: git2::Oid, parent: Option<git2::Oid>) -> Result<Vec<u8>> {
        let err = HistoryError::git;
        let mut walk = self.repo.revwalk().map_err(err("walking"))?;
        walk.push(commit).map_err(err("walking"))?;
        if let Some(p) = parent {
            walk.hide(p).map_err(err("walking"))?;
        }
        let mut pb = self.repo.packbuilder().map_err(err("packing"))?;
        pb.insert_walk(&mut walk).map_err(err("packing"))?;
        let mut buf = git2::Buf::new();
        pb.write_buf(&mut buf).map_err(err("packing"))?;
        Ok(buf.to_vec())
    }

    /// The author and committer: the settings' `author`, else the user's git config, else
    /// `tierfs <tierfs@HOST>`.
    fn signature(&self, settings: &HistoryConfig) -> Result<git2::Signature<'static>> {
        let err = HistoryError::git("making the commit's author");
        if let Some((name, email)) = settings.author.as_deref().and_then(config::parse_author) {
            return git2::Signature::now(name, email).map_err(err);
        }
        if let Ok(cfg) = git2::Config::open_default() {
            if let (Ok(name), Ok(email)) = (cfg.get_string("user.name"), cfg.get_string("user.email")) {
                return git2::Signature::now(&name, &email).map_err(err);
            }
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host = if host.trim().is_empty() { "localhost" } else { host.trim() };
        git2::Signature::now("tierfs", &format!("tierfs@{host}")).map_err(err)
    }

    /// The commit `rev` names: a commit id (or unique prefix), a revision expression
    /// (`HEAD~2`, `main^`), or a snapshot id (or unique prefix) whose snapshot made a commit.
    fn resolve(&self, rev: &str) -> Result<git2::Commit<'_>> {
        if self.head()?.is_none() {
            return Err(HistoryError::Empty);
        }
        if let Ok(c) = self.repo.revparse_single(rev).and_then(|o| o.peel_to_commit()) {
            return Ok(c);
        }
        let mut found = None;
        for c in self.commits()? {
            if snapshot_of(&c).is_some_and(|s| s == rev || (rev.len() >= 8 && s.starts_with(rev))) {
                if found.is_some() {
                    return Err(HistoryError::UnknownRevision(format!("{rev} (names several snapshots)")));
                }
                found = Some(c.id());
            }
        }
        let id = found.ok_or_else(|| HistoryError::UnknownRevision(rev.to_string()))?;
        self.repo.find_commit(id).map_err(HistoryError::git("reading a commit"))
    }

    /// Every commit, newest first.
    fn commits(&self) -> Result<Vec<git2::Commit<'_>>> {
        let Some(head) = self.head()? else { return Ok(Vec::new()) };
        let err = HistoryError::git;
        let mut walk = self.repo.revwalk().map_err(err("walking"))?;
        walk.push(head.id()).map_err(err("walking"))?;
        walk.map(|id| {
            let id = id.map_err(err("walking"))?;
            self.repo.find_commit(id).map_err(err("reading a commit"))
        })
        .collect()
    }

    /// The newest `limit` commits (that changed `path`, with a path), newest first.
    pub fn log(&mut self, path: Option<&str>, limit: usize) -> Result<Vec<LogEntry>> {
        self.catch_up()?;
        let path = path.map(clean_path).transpose()?;
        let mut out = Vec::new();
        for c in self.commits()? {
            if out.len() >= limit {
                break;
            }
            let change = match &path {
                None => None,
                Some(p) => {
                    let now = blob_at(&c, p);
                    let before = c.parent(0).ok().and_then(|parent| blob_at(&parent, p));
                    match (before, now) {
                        (None, Some(_)) => Some("added"),
                        (Some(_), None) => Some("deleted"),
                        (Some(a), Some(b)) if a != b => Some("modified"),
                        _ => continue,
                    }
                }
            };
            out.push(entry(&c, change));
        }
        if let (Some(p), true) = (&path, out.is_empty()) {
            if self.head()?.is_some() {
                return Err(HistoryError::NotInHistory { rev: "any commit".into(), path: p.clone() });
            }
        }
        Ok(out)
    }

    /// File `path` as commit `rev` holds it.
    pub fn show(&mut self, rev: &str, path: &str) -> Result<Shown> {
        self.catch_up()?;
        let path = clean_path(path)?;
        let c = self.resolve(rev)?;
        let not_in = || HistoryError::NotInHistory { rev: rev.to_string(), path: path.clone() };
        let e =
            c.tree().map_err(HistoryError::git("reading a tree"))?.get_path(Path::new(&path)).map_err(|_| not_in())?;
        if e.kind() != Some(git2::ObjectType::Blob) {
            return Err(not_in());
        }
        let blob = self.repo.find_blob(e.id()).map_err(HistoryError::git("reading a blob"))?;
        Ok(Shown {
            commit: c.id().to_string(),
            snapshot: snapshot_of(&c),
            executable: e.filemode() == 0o100755,
            pointer_size: pointer_size(blob.content()),
            content: blob.content().to_vec(),
            path,
        })
    }

    /// A unified diff from `from` to `to` (the workspace as it is now when `None`), of
    /// `paths` only when some are given.
    pub fn diff(&mut self, vfs: &Vfs, from: &str, to: Option<&str>, paths: &[String]) -> Result<String> {
        self.catch_up()?;
        let paths: Vec<String> = paths.iter().map(|p| clean_path(p)).collect::<Result<_>>()?;
        let live = match to {
            Some(_) => None,
            None => {
                let settings = tree::read_settings(vfs)?;
                Some(tree::write_tree(&self.repo, vfs, &settings, &mut self.cache)?.0)
            }
        };
        let a = self.resolve(from)?.tree().map_err(HistoryError::git("reading a tree"))?;
        let b = match (to, live) {
            (Some(rev), _) => self.resolve(rev)?.tree().map_err(HistoryError::git("reading a tree"))?,
            (None, Some(id)) => self.repo.find_tree(id).map_err(HistoryError::git("reading the workspace's tree"))?,
            (None, None) => unreachable!("the live tree is written when no second revision is given"),
        };
        for p in &paths {
            let here = |t: &git2::Tree<'_>| t.get_path(Path::new(p)).is_ok();
            if !here(&a) && !here(&b) {
                return Err(HistoryError::NotInHistory {
                    rev: format!("{from} or {}", to.unwrap_or("the workspace")),
                    path: p.clone(),
                });
            }
        }
        let mut opts = git2::DiffOptions::new();
        for p in &paths {
            opts.pathspec(p);
        }
        let diff = self
            .repo
            .diff_tree_to_tree(Some(&a), Some(&b), Some(&mut opts))
            .map_err(HistoryError::git("comparing trees"))?;
        let mut out = String::new();
        diff.print(git2::DiffFormat::Patch, |_, _, line| {
            if matches!(line.origin(), '+' | '-' | ' ') {
                out.push(line.origin());
            }
            out.push_str(&String::from_utf8_lossy(line.content()));
            true
        })
        .map_err(HistoryError::git("printing the diff"))?;
        Ok(out)
    }

    /// The whole history and the settings' remote, for a client to export or push
    /// ([`Bundle`]).
    pub fn bundle(&mut self, vfs: &Vfs) -> Result<Bundle> {
        self.catch_up()?;
        let settings = tree::read_settings(vfs)?;
        let head = self.head()?.ok_or(HistoryError::Empty)?.id();
        let pack = self.pack(head, None)?;
        let commits = self.commits()?.len() as u64;
        Ok(Bundle { head: head.to_string(), commits, remote: settings.remote, pack })
    }
}

/// The commit message for snapshot `snapshot`.
fn commit_message(message: Option<&str>, snapshot: &str) -> String {
    let subject = message.map(str::trim).filter(|m| !m.is_empty()).unwrap_or("tierfs sync");
    format!("{subject}\n\n{SNAPSHOT_TRAILER}{snapshot}\n")
}

/// The snapshot id in `c`'s trailer.
fn snapshot_of(c: &git2::Commit<'_>) -> Option<String> {
    let msg = String::from_utf8_lossy(c.message_bytes()).to_string();
    msg.lines().rev().find_map(|l| l.strip_prefix(SNAPSHOT_TRAILER)).map(|s| s.trim().to_string())
}

fn entry(c: &git2::Commit<'_>, change: Option<&str>) -> LogEntry {
    let author = c.author();
    LogEntry {
        commit: c.id().to_string(),
        snapshot: snapshot_of(c),
        summary: String::from_utf8_lossy(c.summary_bytes().unwrap_or_default()).to_string(),
        message: c.message().unwrap_or("").to_string(),
        author: format!("{} <{}>", author.name().unwrap_or("?"), author.email().unwrap_or("?")),
        time_unix: c.time().seconds(),
        change: change.map(str::to_string),
    }
}

/// The blob id of `path` in `c`, if it holds a file there.
fn blob_at(c: &git2::Commit<'_>, path: &str) -> Option<git2::Oid> {
    let e = c.tree().ok()?.get_path(Path::new(path)).ok()?;
    (e.kind() == Some(git2::ObjectType::Blob)).then(|| e.id())
}

/// `path` relative to the workspace root, without `.`/empty components; `..` is refused.
fn clean_path(path: &str) -> Result<String> {
    let mut parts = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => return Err(HistoryError::NotInHistory { rev: "any commit".into(), path: path.to_string() }),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(HistoryError::NotInHistory { rev: "any commit".into(), path: path.to_string() });
    }
    Ok(parts.join("/"))
}

fn encode_object(header: &ObjectHeader, pack: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(header).unwrap_or_else(|_| unreachable!("the header serializes"));
    let mut out = Vec::with_capacity(4 + h.len() + pack.len());
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(pack);
    out
}

/// The plaintext of history object `n`, as [`History::record`] stores it; exposed for the
/// decoder fuzz tests (`tests/fuzz_decoders.rs`).
#[doc(hidden)]
pub fn encode_history_object(n: u64, head: &str, parent: Option<&str>, snapshot: &str, pack: &[u8]) -> Vec<u8> {
    let header = ObjectHeader {
        format: OBJECT_FORMAT,
        seq: n,
        head: head.to_string(),
        parent: parent.map(str::to_string),
        snapshot: snapshot.to_string(),
    };
    encode_object(&header, pack)
}

/// The commit history object `n` brings and its git pack, from the object's plaintext: its
/// header's format and number are checked here, the pack by libgit2 when it is imported.
#[doc(hidden)]
pub fn decode_history_object(n: u64, plain: &[u8]) -> Result<(git2::Oid, &[u8])> {
    let corrupt = |reason: String| HistoryError::Corrupt { seq: n, reason };
    let (header, pack) = decode_object(plain).map_err(corrupt)?;
    if header.format > OBJECT_FORMAT || header.seq != n {
        return Err(corrupt(format!(
            "format {} seq {} (expected format ≤ {OBJECT_FORMAT}, seq {n})",
            header.format, header.seq
        )));
    }
    let head = git2::Oid::from_str(&header.head).map_err(|e| corrupt(e.to_string()))?;
    Ok((head, pack))
}

fn decode_object(plain: &[u8]) -> std::result::Result<(ObjectHeader, &[u8]), String> {
    let len = plain.get(..4).ok_or("cut short")?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let h = plain.get(4..4 + len).ok_or("header cut short")?;
    let header: ObjectHeader = serde_json::from_slice(h).map_err(|e| e.to_string())?;
    Ok((header, &plain[4 + len..]))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_remote_url_are_never_shown() {
        assert_eq!(redact_url("https://bob:s3cret@git.example.org/x.git"), "https://***@git.example.org/x.git");
        assert_eq!(redact_url("https://tok3n@git.example.org/x.git"), "https://***@git.example.org/x.git");
        assert_eq!(redact_url("file:///srv/x.git"), "file:///srv/x.git");
        assert_eq!(redact_url("/srv/x.git"), "/srv/x.git");
    }

    #[test]
    fn objects_round_trip_and_cut_ones_fail() {
        let h = ObjectHeader { format: 1, seq: 3, head: "ab".into(), parent: None, snapshot: "s".into() };
        let bytes = encode_object(&h, b"PACK...");
        let (back, pack) = decode_object(&bytes).unwrap();
        assert_eq!((back.seq, back.head.as_str(), pack), (3, "ab", &b"PACK..."[..]));
        assert!(decode_object(&bytes[..6]).is_err());
        assert!(decode_object(b"").is_err());
    }

    #[test]
    fn paths_are_cleaned_and_escapes_refused() {
        assert_eq!(clean_path("./a//b/c.py").unwrap(), "a/b/c.py");
        assert!(clean_path("../etc/passwd").is_err());
        assert!(clean_path("/").is_err());
    }

    #[test]
    fn the_message_carries_the_snapshot() {
        assert_eq!(commit_message(Some("lr 3e-4\n"), "S1"), "lr 3e-4\n\nTierfs-Snapshot: S1\n");
        assert_eq!(commit_message(None, "S2"), "tierfs sync\n\nTierfs-Snapshot: S2\n");
    }
}
