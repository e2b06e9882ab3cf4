//! Where tierfs keeps things on the local node: the default data directory, the embedded
//! default store, the runtime directory of control sockets, the control socket of one mount,
//! and the daemon log.
//!
//! Invariants:
//! - The embedded default store lives beside the default data directory in the data home:
//!   `store.toml` (its store file), `objects/` (its one `file://` backend) and `store.key`
//!   (the key file that unlocks it). Only `tierfs mount` creates it; the one-shot store
//!   commands use it when it exists and `--store` is not given ([`command_store_file`]).
//! - A mount is identified by its *canonical* mountpoint path; its control socket is
//!   `<runtime dir>/<blake3(canonical path)[..32 hex]>.sock`. Any process of the same user
//!   that names the same directory (through any relative path or symlink) finds the same
//!   socket, without a registry file that could go stale.
//! - The runtime directory is per user, not per data directory, so `tierfs umount MOUNTPOINT`
//!   and `tierfs status` find every mount knowing only the mountpoint:
//!   `$TIERFS_RUNTIME_DIR` (or `--runtime-dir`), else `$XDG_RUNTIME_DIR/tierfs`, else
//!   `<data home>/run` where the data home is `$XDG_DATA_HOME/tierfs` or
//!   `~/.local/share/tierfs`.
//! - Directories holding sockets or data are created owner-only (0700) and refused when
//!   another user owns them: the control socket can unmount and inspect a workspace.
//!
//! The path logic is split into pure functions over explicit environment values so that it
//! is unit-tested without touching the process environment.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::logging::{Reason, bail_with};
use anyhow::{Context, Result};
use tierfs::ErrorKind;

/// Longest path a Unix socket address holds (`sun_path` is 108 bytes with the NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Hex digits of the mountpoint hash in a socket name: 128 bits, collision-free in practice
/// and short enough to leave room for a long runtime directory within `SOCKET_PATH_MAX`.
const SOCKET_HASH_HEX: usize = 32;

/// Name of the default workspace's data directory under the data home.
const DEFAULT_WORKSPACE: &str = "default";

/// Names of the embedded default store's files under the data home.
const EMBEDDED_STORE_FILE: &str = "store.toml";
const EMBEDDED_OBJECTS: &str = "objects";
const EMBEDDED_KEY_FILE: &str = "store.key";

/// `$XDG_DATA_HOME/tierfs`, else `$HOME/.local/share/tierfs`.
pub fn data_home() -> Result<PathBuf> {
    data_home_from(std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME"))
}

/// [`data_home`] over explicit environment values. The XDG spec says a relative
/// `XDG_DATA_HOME` is invalid and must be ignored.
pub fn data_home_from(xdg_data_home: Option<OsString>, home: Option<OsString>) -> Result<PathBuf> {
    if let Some(xdg) = xdg_data_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Ok(xdg.join("tierfs"));
    }
    match home.map(PathBuf::from) {
        Some(home) if home.is_absolute() => Ok(home.join(".local/share/tierfs")),
        _ => bail_with!(
            ErrorKind::InvalidInput,
            "cannot find a place for tierfs data: neither XDG_DATA_HOME nor HOME is set to an \
             absolute path; pass --data-dir"
        ),
    }
}

/// The data directory used when `--data-dir` is not given: `<data home>/default`.
pub fn default_data_dir() -> Result<PathBuf> {
    Ok(data_home()?.join(DEFAULT_WORKSPACE))
}

/// The embedded default store: what `tierfs mount` uses with neither `--store` nor
/// `--data-dir`. A local, encrypted store on the same disk as the data directory: it survives
/// the loss of the data directory, not the loss of the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedStore {
    /// The data home holding everything below.
    pub home: PathBuf,
    /// `<data home>/store.toml`.
    pub store_file: PathBuf,
    /// `<data home>/objects`: the store's one backend.
    pub objects: PathBuf,
    /// `<data home>/store.key`: the key file (mode 0600) that unlocks the store.
    pub key_file: PathBuf,
}

impl EmbeddedStore {
    /// The embedded store of the data home of this process's environment.
    pub fn locate() -> Result<EmbeddedStore> {
        Ok(EmbeddedStore::under(&data_home()?))
    }

    /// The embedded store kept in `data_home`.
    pub fn under(data_home: &Path) -> EmbeddedStore {
        EmbeddedStore {
            home: data_home.to_path_buf(),
            store_file: data_home.join(EMBEDDED_STORE_FILE),
            objects: data_home.join(EMBEDDED_OBJECTS),
            key_file: data_home.join(EMBEDDED_KEY_FILE),
        }
    }

    /// The URL of its backend: `file://<data home>/objects`, percent-encoded where needed.
    pub fn backend_url(&self) -> String {
        tierfs::backend::BackendSpec::File { path: self.objects.clone() }.to_url()
    }

    /// Its store file, or an error saying that it does not exist yet (and what creates it).
    pub fn existing_store_file(&self) -> Result<PathBuf> {
        let exists = self
            .store_file
            .try_exists()
            .with_context(|| format!("looking for the local store {}", self.store_file.display()))?;
        if !exists {
            bail_with!(
                ErrorKind::NotFound,
                "no --store given and no local store at {} yet (it is created by the first \
                 \"tierfs mount\" without --data-dir)",
                self.store_file.display()
            );
        }
        Ok(self.store_file.clone())
    }
}

/// The store file of a one-shot store command: `given`, else the embedded default store's if
/// it exists (see [`EmbeddedStore::existing_store_file`]).
pub fn command_store_file(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(file) => Ok(file.to_path_buf()),
        None => EmbeddedStore::locate()?.existing_store_file(),
    }
}

/// Where the node daemon (`tierfs-daemon node`) keeps its mounts' control sockets by default.
pub const NODE_RUNTIME_DIR: &str = "/run/tierfs";

/// The node daemon's socket directory as commands look for it: `TIERFS_NODE_RUNTIME_DIR`
/// (for a node whose `[node] runtime_dir` is elsewhere), else [`NODE_RUNTIME_DIR`].
pub fn node_runtime_dir() -> PathBuf {
    std::env::var_os("TIERFS_NODE_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(NODE_RUNTIME_DIR))
}

/// The directories a command looks in for control sockets: the user's ([`runtime_dir`]) and
/// then the node daemon's, so `tierfs status`, `sync` and `umount` reach the node's mounts too
/// (their sockets admit the mount's owner and root). A mountpoint is served once at most, so
/// the two never disagree.
pub fn runtime_dirs(explicit: Option<&Path>) -> Result<Vec<PathBuf>> {
    Ok(with_node_dir(runtime_dir(explicit)?))
}

/// `mine`, then the node daemon's socket directory unless it is the same (see [`runtime_dirs`]).
pub fn with_node_dir(mine: PathBuf) -> Vec<PathBuf> {
    let node = node_runtime_dir();
    if mine == node { vec![mine] } else { vec![mine, node] }
}

/// The control socket of the mount at `canonical_mountpoint`: in the first of
/// [`runtime_dirs`] that has one, else where the user's would be (for the error message).
pub fn find_socket(explicit: Option<&Path>, canonical_mountpoint: &Path) -> Result<PathBuf> {
    let dirs = runtime_dirs(explicit)?;
    for dir in &dirs {
        let socket = socket_path(dir, canonical_mountpoint)?;
        if socket.exists() {
            return Ok(socket);
        }
    }
    socket_path(&dirs[0], canonical_mountpoint)
}

/// The directory holding the control sockets (see the module docs for the order).
pub fn runtime_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    runtime_dir_from(
        explicit,
        std::env::var_os("XDG_RUNTIME_DIR"),
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
}

/// [`runtime_dir`] over explicit environment values.
pub fn runtime_dir_from(
    explicit: Option<&Path>,
    xdg_runtime_dir: Option<OsString>,
    xdg_data_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        return absolute(dir);
    }
    if let Some(xdg) = xdg_runtime_dir.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return Ok(xdg.join("tierfs"));
    }
    Ok(data_home_from(xdg_data_home, home)?.join("run"))
}

/// The control socket of the mount at `canonical_mountpoint` (see [`canonical_mountpoint`]).
pub fn socket_path(runtime_dir: &Path, canonical_mountpoint: &Path) -> Result<PathBuf> {
    let hash = blake3::hash(canonical_mountpoint.as_os_str().as_bytes());
    let hex = hash.to_hex();
    let name = format!("{}.sock", &hex.as_str()[..SOCKET_HASH_HEX]);
    let path = runtime_dir.join(name);
    if path.as_os_str().len() > SOCKET_PATH_MAX {
        bail_with!(
            ErrorKind::InvalidInput,
            "control socket path {} is longer than the {SOCKET_PATH_MAX} bytes a Unix socket \
             address holds; set TIERFS_RUNTIME_DIR (or --runtime-dir) to a shorter directory",
            path.display()
        );
    }
    Ok(path)
}

/// The daemon's log file in a data directory.
pub fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join(crate::config::DAEMON_LOG)
}

/// Where the daemon of `config` logs: its data dir, or with `--encrypt-cache` a private
/// directory of memory (`/dev/shm/tierfs-UID`, as the history), since a log may name files
/// and nothing of an encrypted cache's data dir may. A plaintext log an earlier mount left in
/// the data dir is removed then.
pub fn mount_log_path(config: &crate::config::MountConfig) -> Result<PathBuf> {
    if !config.encrypt_cache {
        return Ok(log_path(&config.data_dir));
    }
    let left = log_path(&config.data_dir);
    match fs::remove_file(&left) {
        Ok(()) => eprintln!("tierfs: removed the plaintext log {} (the cache is encrypted at rest)", left.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the plaintext log {}", left.display())),
    }
    let euid = rustix::process::geteuid().as_raw();
    let dir = Path::new(tierfs::history::MEMORY_DIR).join(format!("tierfs-{euid}"));
    ensure_private_dir(&dir)?;
    let id = blake3::hash(config.data_dir.as_os_str().as_encoded_bytes()).to_hex();
    Ok(dir.join(format!("{}.log", &id[..16])))
}

/// `path` made absolute against the current directory, with `.` and `..` removed lexically.
/// Symlinks are not resolved: this is for paths that may not exist yet.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().context("reading the current directory")?.join(path)
    };
    Ok(normalize_lexically(&joined))
}

/// Removes `.` and resolves `..` against the preceding component, without touching the
/// filesystem. `..` at the root stays at the root, as the kernel does.
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push("/");
    }
    out
}

/// The canonical form of a mountpoint, the key of its control socket.
///
/// A live mountpoint canonicalizes normally. A *stale* FUSE mount (its daemon died) fails
/// every `stat` with `ENOTCONN`, so then the parent is canonicalized and the last component
/// appended: `tierfs umount` must still find and clean such a mount. A path that does not
/// exist yet is made absolute lexically.
pub fn canonical_mountpoint(path: &Path) -> Result<PathBuf> {
    let abs = absolute(path)?;
    match fs::canonicalize(&abs) {
        Ok(canonical) => Ok(canonical),
        Err(err) => {
            let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
                // The root always canonicalizes; anything else has a parent and a name.
                return Err(err).with_context(|| format!("resolving {}", abs.display()));
            };
            match fs::canonicalize(parent) {
                Ok(parent) => Ok(parent.join(name)),
                Err(_) => Ok(abs),
            }
        }
    }
}

/// Creates `dir` (and its parents) if missing and makes it owner-only (0700). Refuses a
/// directory that another user owns, since whoever owns it can reach our sockets.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    ensure_runtime_dir(dir, false)
}

/// [`ensure_private_dir`], or with `shared` a directory others may enter too (0755, still
/// ours): the node daemon's runtime directory, whose sockets the mounts' owners reach and
/// whose connections are checked one by one (`control::may_control`).
pub fn ensure_runtime_dir(dir: &Path, shared: bool) -> Result<()> {
    let mode = if shared { 0o755 } else { 0o700 };
    match fs::DirBuilder::new().recursive(true).mode(mode).create(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err).with_context(|| format!("creating {}", dir.display())),
    }
    let meta = fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        bail_with!(Reason::PathInUse, "{} exists and is not a directory", dir.display());
    }
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is owned by uid {}, not by the current user (uid {euid}); refusing to keep \
             control sockets there",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o777 != mode {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {} to {mode:o}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn data_home_prefers_absolute_xdg_data_home() {
        let p = data_home_from(os("/xdg/data"), os("/home/u")).unwrap();
        assert_eq!(p, PathBuf::from("/xdg/data/tierfs"));
    }

    #[test]
    fn data_home_ignores_relative_xdg_data_home() {
        let p = data_home_from(os("rel/data"), os("/home/u")).unwrap();
        assert_eq!(p, PathBuf::from("/home/u/.local/share/tierfs"));
    }

    #[test]
    fn data_home_falls_back_to_home() {
        let p = data_home_from(None, os("/home/u")).unwrap();
        assert_eq!(p, PathBuf::from("/home/u/.local/share/tierfs"));
    }

    #[test]
    fn data_home_without_home_is_a_clear_error() {
        let err = data_home_from(None, None).unwrap_err();
        assert!(format!("{err}").contains("--data-dir"), "{err}");
    }

    #[test]
    fn embedded_store_lives_beside_the_default_data_dir() {
        let home = data_home_from(os("/xdg/data"), os("/home/u")).unwrap();
        let store = EmbeddedStore::under(&home);
        assert_eq!(store.home, PathBuf::from("/xdg/data/tierfs"));
        assert_eq!(store.store_file, PathBuf::from("/xdg/data/tierfs/store.toml"));
        assert_eq!(store.objects, PathBuf::from("/xdg/data/tierfs/objects"));
        assert_eq!(store.key_file, PathBuf::from("/xdg/data/tierfs/store.key"));
        assert_eq!(store.backend_url(), "file:///xdg/data/tierfs/objects");
        let fallback = EmbeddedStore::under(&data_home_from(None, os("/home/u")).unwrap());
        assert_eq!(fallback.store_file, PathBuf::from("/home/u/.local/share/tierfs/store.toml"));
    }

    #[test]
    fn embedded_store_url_survives_unusual_paths() {
        let store = EmbeddedStore::under(Path::new("/home/a b/%x/tierfs"));
        let url = store.backend_url();
        assert_eq!(url, "file:///home/a%20b/%25x/tierfs/objects");
        assert_eq!(
            tierfs::backend::BackendSpec::parse(&url).unwrap(),
            tierfs::backend::BackendSpec::File { path: store.objects }
        );
    }

    #[test]
    fn a_missing_embedded_store_is_a_clear_error_and_an_existing_one_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::under(dir.path());
        let err = store.existing_store_file().unwrap_err().to_string();
        assert!(err.contains("no --store given and no local store at"), "{err}");
        assert!(err.contains(&store.store_file.display().to_string()), "{err}");
        assert!(err.contains("\"tierfs mount\" without --data-dir"), "{err}");
        assert!(!store.store_file.exists(), "looking must not create it");
        fs::write(&store.store_file, "x").unwrap();
        assert_eq!(store.existing_store_file().unwrap(), store.store_file);
        assert_eq!(command_store_file(Some(Path::new("/s.toml"))).unwrap(), PathBuf::from("/s.toml"));
    }

    #[test]
    fn runtime_dir_order() {
        let explicit = Path::new("/explicit");
        assert_eq!(
            runtime_dir_from(Some(explicit), os("/run/user/1"), None, os("/h")).unwrap(),
            PathBuf::from("/explicit")
        );
        assert_eq!(
            runtime_dir_from(None, os("/run/user/1"), None, os("/h")).unwrap(),
            PathBuf::from("/run/user/1/tierfs")
        );
        assert_eq!(runtime_dir_from(None, None, None, os("/h")).unwrap(), PathBuf::from("/h/.local/share/tierfs/run"));
        assert_eq!(
            runtime_dir_from(None, os("relative"), os("/xdg"), os("/h")).unwrap(),
            PathBuf::from("/xdg/tierfs/run")
        );
    }

    #[test]
    fn socket_path_is_stable_and_distinct_per_mountpoint() {
        let run = Path::new("/run/user/1000/tierfs");
        let a = socket_path(run, Path::new("/content/work")).unwrap();
        let a_again = socket_path(run, Path::new("/content/work")).unwrap();
        let b = socket_path(run, Path::new("/content/work2")).unwrap();
        assert_eq!(a, a_again);
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(run));
        let name = a.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), SOCKET_HASH_HEX + ".sock".len());
        assert!(name.ends_with(".sock"));
        assert!(name[..SOCKET_HASH_HEX].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn socket_path_too_long_is_refused_with_advice() {
        let long = PathBuf::from(format!("/{}", "d".repeat(100)));
        let err = socket_path(&long, Path::new("/mnt")).unwrap_err();
        assert!(format!("{err}").contains("TIERFS_RUNTIME_DIR"), "{err}");
    }

    #[test]
    fn lexical_normalization() {
        assert_eq!(normalize_lexically(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(normalize_lexically(Path::new("/../x")), PathBuf::from("/x"));
        assert_eq!(normalize_lexically(Path::new("/a/..")), PathBuf::from("/"));
    }

    #[test]
    fn canonical_mountpoint_resolves_symlinks_and_missing_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real_canon = fs::canonicalize(&real).unwrap();
        assert_eq!(canonical_mountpoint(&link).unwrap(), real_canon);
        assert_eq!(canonical_mountpoint(&link.join("missing")).unwrap(), real_canon.join("missing"));
    }

    #[test]
    fn private_dir_is_created_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("a/b/run");
        ensure_private_dir(&run).unwrap();
        let mode = fs::metadata(&run).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&run).unwrap();
        assert_eq!(fs::metadata(&run).unwrap().mode() & 0o777, 0o700);
    }
}
