//! Stores seen from the binaries: unlocking a store (key file, `TIERFS_PASSPHRASE` or a
//! prompt), the store commands `tierfs init`, `tierfs key …`, `tierfs scrub` and
//! `tierfs warmup`, and the creation of the embedded default store at the first mount that
//! uses it. (The cold tier's view of a store and the saved repairs are the core's
//! `tierfs::session`.)
//!
//! Invariants:
//! - a secret is never printed or logged, and a wrong one fails before anything changes;
//! - the embedded default store is created by a mount only (never by a one-shot command),
//!   with a key file, so creating it never asks anything;
//! - one-shot commands enter the async store with `Handle::block_on` from the main thread,
//!   never from a runtime thread.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tierfs::crypto::{self, KdfParams, Secret};
use tierfs::store::{Fencing, Progress, Store, StoreConfig};
use tokio::runtime::{Handle, Runtime};

use crate::cli::{MountArgs, MountStore};
use crate::logging::{Reason, bail_with, failure};
use crate::status::format_bytes;
use tierfs::ErrorKind;

/// Environment variable holding the store passphrase (for scripts and the background daemon).
pub const PASSPHRASE_ENV: &str = "TIERFS_PASSPHRASE";
/// Environment variable with a fast key-derivation setting for tests ("test"): never use it
/// for real data.
pub const KDF_ENV: &str = "TIERFS_TEST_FAST_KDF";

/// An owned secret, wiped from memory when dropped. The node daemon hands it to a worker
/// (`crate::worker`) as data.
#[derive(zeroize::Zeroize, zeroize::ZeroizeOnDrop, serde::Serialize, serde::Deserialize)]
pub enum SecretBytes {
    Passphrase(Vec<u8>),
    KeyFile(Vec<u8>),
}

impl SecretBytes {
    pub fn as_secret(&self) -> Secret<'_> {
        match self {
            SecretBytes::Passphrase(p) => Secret::Passphrase(p),
            SecretBytes::KeyFile(k) => Secret::KeyFile(k),
        }
    }
}

/// Key-derivation cost for new passphrases. `TIERFS_TEST_FAST_KDF=test` weakens it in debug
/// builds only (the tests'); a release build ignores it.
pub fn kdf_params() -> KdfParams {
    if cfg!(debug_assertions) && std::env::var(KDF_ENV).is_ok_and(|v| v == "test") {
        KdfParams::for_tests()
    } else {
        KdfParams::recommended()
    }
}

/// Reads a key file, refusing one that other users can read.
pub fn read_key_file(path: &Path) -> Result<SecretBytes> {
    crate::private::check_secret_file(path, "key file")?;
    let contents = zeroize::Zeroizing::new(
        std::fs::read(path).map_err(|e| failure!(Reason::WrongKey, "reading key file {}: {e}", path.display()))?,
    );
    let key = crypto::parse_key_file(&contents).with_context(|| format!("key file {}", path.display()))?;
    Ok(SecretBytes::KeyFile(key))
}

/// The secret that unlocks `config`'s store: its key file, else `TIERFS_PASSPHRASE`, else a
/// prompt on the terminal.
pub fn unlock_secret(config: &StoreConfig) -> Result<SecretBytes> {
    if let Some(path) = &config.key_file {
        return read_key_file(path);
    }
    passphrase("Store passphrase: ", false)
}

/// `TIERFS_PASSPHRASE` as [`take_passphrase_env`] took it from a long-lived process's
/// environment: `None` inside when it was not set.
static TAKEN_PASSPHRASE: std::sync::OnceLock<Option<zeroize::Zeroizing<Vec<u8>>>> = std::sync::OnceLock::new();

/// Takes `TIERFS_PASSPHRASE` out of this process's environment, wiping its bytes there, and
/// keeps it (wiped at exit) for [`passphrase`]. A long-lived serving process calls it first,
/// before it starts a thread, so that the passphrase is in no environment a reader of
/// `/proc/PID/environ` or a child process would see.
pub fn take_passphrase_env() {
    let name = c"TIERFS_PASSPHRASE";
    // SAFETY: called at the start of `main`, before any other thread exists, so nothing reads
    // or changes the environment meanwhile. getenv's pointer is to the variable's value in
    // the process's own environment block, writable memory of `strlen` bytes, which is
    // overwritten in place before the variable is removed.
    let value = unsafe {
        let p = libc::getenv(name.as_ptr());
        if p.is_null() {
            None
        } else {
            let len = libc::strlen(p);
            let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec();
            std::ptr::write_bytes(p, 0, len);
            libc::unsetenv(name.as_ptr());
            Some(zeroize::Zeroizing::new(bytes))
        }
    };
    let _ = TAKEN_PASSPHRASE.set(value);
}

/// A passphrase from the environment (or what [`take_passphrase_env`] took from it) or the
/// terminal (asked twice when `confirm`).
pub fn passphrase(prompt: &str, confirm: bool) -> Result<SecretBytes> {
    let given = match TAKEN_PASSPHRASE.get() {
        Some(taken) => taken.as_ref().map(|p| p.to_vec()),
        None => std::env::var_os(PASSPHRASE_ENV).map(std::ffi::OsString::into_encoded_bytes),
    };
    if let Some(p) = given {
        if p.is_empty() {
            bail_with!(Reason::WrongKey, "{PASSPHRASE_ENV} is set but empty");
        }
        return Ok(SecretBytes::Passphrase(p));
    }
    if !std::io::stdin().is_terminal() {
        bail_with!(
            Reason::WrongKey,
            "this store needs a passphrase: set {PASSPHRASE_ENV}, or create the store with a key \
             file (`tierfs init --key-file FILE`)"
        );
    }
    let first = zeroize::Zeroizing::new(prompt_hidden(prompt)?);
    if first.is_empty() {
        bail_with!(ErrorKind::InvalidInput, "an empty passphrase is not allowed");
    }
    if confirm && *zeroize::Zeroizing::new(prompt_hidden("Repeat passphrase: ")?) != *first {
        bail_with!(ErrorKind::InvalidInput, "the passphrases do not match");
    }
    Ok(SecretBytes::Passphrase(first.to_vec()))
}

/// Reads one line from the terminal with echo off (rpassword: the prompt and the answer go
/// through the controlling terminal, as ssh's do).
fn prompt_hidden(prompt: &str) -> Result<Vec<u8>> {
    let line = rpassword::prompt_password(prompt).context("reading the passphrase")?;
    Ok(line.into_bytes())
}

/// Opens the store described by the store file at `path`.
pub fn open_store(handle: &Handle, path: &Path) -> Result<(Store, StoreConfig)> {
    let config = StoreConfig::load(path)?;
    let secret = unlock_secret(&config)?;
    let store = handle
        .block_on(Store::open(&config, &secret.as_secret()))
        .with_context(|| format!("opening the store of {}", path.display()))?;
    Ok((store, config))
}

/// A runtime for a one-shot command and `workspace` of the store of `store_file`.
pub fn open_workspace(store_file: &Path, workspace: &str) -> Result<(Runtime, tierfs::remote::Workspace)> {
    let rt = crate::config::build_runtime()?;
    let (store, _) = open_store(rt.handle(), store_file)?;
    let ws = tierfs::remote::Workspace::new(Arc::new(store), workspace);
    Ok((rt, ws))
}

/// The snapshots of `workspace` (`tierfs snapshots`).
pub fn list_snapshots(store_file: &Path, workspace: &str) -> Result<Vec<tierfs::remote::SnapshotInfo>> {
    let (rt, ws) = open_workspace(store_file, workspace)?;
    rt.block_on(ws.snapshots()).context("listing snapshots")
}

/// `tierfs snapshots --timeline`.
pub fn timeline(store_file: &Path, workspace: &str) -> Result<tierfs::remote::Timeline> {
    let (rt, ws) = open_workspace(store_file, workspace)?;
    rt.block_on(ws.timeline()).context("reading the workspace's timeline")
}

/// `tierfs forget`.
pub fn forget(
    store_file: &Path,
    workspace: &str,
    policy: &tierfs::remote::KeepPolicy,
    dry_run: bool,
) -> Result<tierfs::remote::ForgetReport> {
    let (rt, ws) = open_workspace(store_file, workspace)?;
    rt.block_on(ws.forget(policy, dry_run)).context("forgetting snapshots")
}

/// `tierfs diff`: restores the metadata of `a` and `b` (snapshot ids or `latest`) into
/// scratch stores and compares them.
pub fn diff(store_file: &Path, workspace: &str, a: &str, b: &str) -> Result<Vec<tierfs::remote::Change>> {
    let (rt, ws) = open_workspace(store_file, workspace)?;
    let scratch = tempfile::Builder::new().prefix("tierfs-diff-").tempdir().context("creating a scratch directory")?;
    let load = |which: &str, dir: &str| -> Result<tierfs::meta::MetaStore> {
        let meta = tierfs::meta::MetaStore::open(&scratch.path().join(dir))?;
        if which == "latest" {
            rt.block_on(ws.restore(&meta)).context("reading the latest state")?;
        } else {
            rt.block_on(ws.restore_snapshot(&meta, which)).with_context(|| format!("reading snapshot {which}"))?;
        }
        // Sizes as a restore shows them: data the writer never stored is cut off.
        meta.cut_to_stored_data()?;
        Ok(meta)
    };
    let (ma, mb) = (load(a, "a")?, load(b, "b")?);
    Ok(tierfs::remote::diff(&ma, &mb)?)
}

/// `tierfs gc`, with progress lines on stderr (unless `json`).
pub fn gc(store_file: &Path, dry_run: bool, keep_within: Duration, json: bool) -> Result<tierfs::remote::GcReport> {
    let rt = crate::config::build_runtime()?;
    let (store, _) = open_store(rt.handle(), store_file)?;
    let scratch = tempfile::Builder::new().prefix("tierfs-gc-").tempdir().context("creating a scratch directory")?;
    let holder = format!("tierfs gc on {}", tierfs::session::holder_name());
    let progress = |line: &str| {
        if !json {
            eprintln!("gc: {line}");
        }
    };
    rt.block_on(tierfs::remote::gc(Arc::new(store), scratch.path(), &holder, dry_run, keep_within, &progress))
        .context("gc")
}

// ---- commands ----------------------------------------------------------------------------

/// Before a mount: creates the embedded default store if `args` use it and it does not exist
/// yet (saying so in one line on stderr), and refuses a snapshot mount of an embedded store
/// that does not exist. A no-op for `--store FILE` and hot-tier-only mounts.
pub fn prepare_mount_store(args: &MountArgs) -> Result<()> {
    let create = match args.store_choice() {
        MountStore::Embedded { create } => create,
        MountStore::None | MountStore::Given(_) => return Ok(()),
    };
    let embedded = crate::paths::EmbeddedStore::locate()?;
    if !create {
        embedded.existing_store_file()?;
        return Ok(());
    }
    let exists = embedded
        .store_file
        .try_exists()
        .with_context(|| format!("looking for the local store {}", embedded.store_file.display()))?;
    if exists {
        return Ok(());
    }
    // Objects but no store.toml: a first mount stopped between writing the store's objects
    // and its config. Creating another store over them would fail less clearly.
    let leftover = std::fs::read_dir(&embedded.objects).map(|mut d| d.next().is_some()).unwrap_or(false);
    if leftover {
        bail_with!(
            ErrorKind::NotFound,
            "{} holds a store's objects but {} is missing (was the first mount interrupted?); move \
             the objects directory aside (nothing was written to that store yet) and mount again",
            embedded.objects.display(),
            embedded.store_file.display()
        );
    }
    crate::paths::ensure_private_dir(&embedded.home)?;
    let rt = crate::config::build_runtime()?;
    let new = NewStore {
        backends: vec![embedded.backend_url()],
        replicas: Some(1),
        erasure: None,
        key_file: Some(embedded.key_file.clone()),
        pack_size: None,
        fencing: Fencing::Conditional,
    };
    init(rt.handle(), &embedded.store_file, new)
        .with_context(|| format!("creating the local store {}", embedded.store_file.display()))?;
    eprintln!(
        "tierfs: created the local store {} (objects in {}, key file {}: without the key the store \
         cannot be read)",
        embedded.store_file.display(),
        embedded.objects.display(),
        embedded.key_file.display()
    );
    Ok(())
}

/// `tierfs init` output.
#[derive(Debug, Serialize)]
pub struct InitOutput {
    pub store_file: PathBuf,
    pub store_id: String,
    pub backends: Vec<String>,
    pub redundancy: String,
    pub key: String,
    /// `conditional` or `lease` (see `tierfs init --fencing`).
    pub fencing: String,
    /// The key file, when `init` created it (keep a copy: without it the store cannot be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file_created: Option<PathBuf>,
}

/// What a new store is made of (`tierfs init`'s options; the embedded store's defaults).
pub struct NewStore {
    pub backends: Vec<String>,
    pub replicas: Option<u8>,
    pub erasure: Option<String>,
    /// Unlocked by this key file (created if missing) instead of a passphrase.
    pub key_file: Option<PathBuf>,
    pub pack_size: Option<u64>,
    pub fencing: Fencing,
}

/// Creates a store and writes its store file. A missing key file is created (and named in
/// the output); with a key file nothing is asked, so this also serves non-interactive callers.
pub fn init(handle: &Handle, store_file: &Path, new: NewStore) -> Result<InitOutput> {
    if store_file.exists() {
        bail_with!(ErrorKind::Conflict, "{} already exists; choose another --store path", store_file.display());
    }
    let mut config = StoreConfig::new(new.backends);
    if new.erasure.is_some() {
        config.replicas = None;
        config.erasure = new.erasure;
    }
    if let Some(r) = new.replicas {
        config.replicas = Some(r);
    }
    if let Some(p) = new.pack_size {
        config.pack_size = p;
    }
    config.fencing = new.fencing;
    let mut key_file_created = None;
    let secret = match &new.key_file {
        Some(path) => {
            let path = crate::paths::absolute(path)?;
            if !path.exists() {
                write_private(&path, crypto::generate_key_file().as_bytes())?;
                key_file_created = Some(path.clone());
            }
            config.key_file = Some(path.clone());
            read_key_file(&path)?
        }
        None => passphrase("New store passphrase: ", true)?,
    };
    config.validate()?;
    let redundancy = format!("{:?}", config.redundancy()?);
    handle.block_on(Store::init(&config, &secret.as_secret(), kdf_params())).context("creating the store")?;
    config.save_new(store_file)?;
    Ok(InitOutput {
        store_file: store_file.to_path_buf(),
        store_id: config.store_id.clone(),
        backends: config.backends.clone(),
        redundancy,
        key: if config.key_file.is_some() { "key file".into() } else { "passphrase".into() },
        fencing: config.fencing.name().into(),
        key_file_created,
    })
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(data).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", path.display()))
}

/// `tierfs scrub`: checks (and with `repair`, fixes) every copy of every object.
pub fn scrub(handle: &Handle, store_file: &Path, repair: bool, json: bool) -> Result<tierfs::store::ScrubReport> {
    let (store, _) = open_store(handle, store_file)?;
    let started = Instant::now();
    let show = !json && std::io::stderr().is_terminal();
    let progress = move |p: Progress| {
        if show {
            eprint!("\rscrub: {}/{} objects and packs checked", p.done, p.total);
        }
    };
    let report = handle.block_on(store.scrub(repair, &progress))?;
    if show {
        eprintln!(" ({:.1} s)", started.elapsed().as_secs_f64());
    }
    Ok(report)
}

/// `tierfs warmup`: reads every file under `paths` through the mount, which fetches evicted
/// data into the cache (with read-ahead), showing progress.
pub fn warmup(paths: &[PathBuf], json: bool) -> Result<(u64, u64)> {
    let mut files = Vec::new();
    for p in paths {
        collect_files(p, &mut files)?;
    }
    let total: u64 = files.iter().map(|(_, len)| *len).sum();
    let show = !json && std::io::stderr().is_terminal();
    let mut done = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let started = Instant::now();
    let mut warned = false;
    for (path, _) in &files {
        let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        // Files larger than half the cache would otherwise stream past it. tierfs's own
        // request number, which neither rustix nor nix names a safe call for.
        // SAFETY: an ioctl that takes no argument, on a file descriptor this function owns.
        let kept = match unsafe { libc::ioctl(fd, tierfs::vfs::IOCTL_KEEP_CACHED as _) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        };
        // Pages the kernel still holds would be served without asking tierfs, which then
        // would not fetch them: drop the file's clean pages first (a hint; errors do not matter).
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        if let (Err(err), false) = (kept, warned) {
            eprintln!(
                "warmup: warning: {} is not on a tierfs mount, or its daemon is older ({err}): reading it anyway, \
                 but a file larger than half the cache may not stay cached",
                path.display()
            );
            warned = true;
        }
        loop {
            let n = f.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                break;
            }
            done += n as u64;
            if show {
                // Padded: a shorter line than the last one must cover it.
                eprint!("\rwarmup: {:>10} of {}", format_bytes(done), format_bytes(total));
            }
        }
    }
    if show {
        eprintln!(" in {:.1} s", started.elapsed().as_secs_f64());
    }
    Ok((files.len() as u64, done))
}

fn collect_files(path: &Path, out: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("listing {}", path.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            collect_files(&e.path(), out)?;
        }
    } else if meta.is_file() {
        out.push((path.to_path_buf(), meta.len()));
    }
    Ok(())
}
