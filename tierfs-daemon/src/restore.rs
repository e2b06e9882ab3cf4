//! `tierfs restore`: a plain copy of a workspace (its latest state, or one snapshot) into a
//! local directory, without mounting anything and without taking the writer lease.
//!
//! The workspace's metadata is restored into a scratch data directory, opened with the core
//! `Vfs` and its cold tier (file data is fetched from the store as it is read), and walked:
//! directories, regular files (sparse regions stay holes), symlinks, hard links (one inode,
//! several names), fifos, modes, xattrs, times, and ownership when run as root.
//!
//! Invariants: the target directory must be empty or missing (nothing of the user's is
//! overwritten); the scratch directory is removed afterwards however the copy ends; a file
//! that cannot be read fully is an error, never a silently short copy.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tierfs::session::{Access, RESTORE_CACHE_SIZE, Session, SessionConfig};
use tierfs::vfs::{Attr, Caller, FileKind, Ino, ROOT_INO, Timestamp, Vfs};

use crate::store_link::open_store;

/// What a restore wrote.
#[derive(Debug, Default, Serialize)]
pub struct RestoreReport {
    pub snapshot: Option<String>,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    pub other: u64,
    pub bytes: u64,
    pub millis: u64,
}

/// Restores the workspace (or `snapshot`) of `store_file` into `target`.
pub fn restore(
    store_file: &Path,
    workspace: &str,
    snapshot: Option<&str>,
    target: &Path,
    json: bool,
) -> Result<RestoreReport> {
    if target.exists()
        && fs::read_dir(target).with_context(|| format!("reading {}", target.display()))?.next().is_some()
    {
        bail!("{} is not empty; restore writes into an empty or new directory only", target.display());
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
    let session = Session::open(config, rt.handle()).context("reading the workspace from the store")?;
    let vfs = session.vfs();
    let snapshot_id = snapshot.map(str::to_owned);
    let mut copier = Copier {
        vfs,
        report: RestoreReport { snapshot: snapshot_id, ..RestoreReport::default() },
        links: HashMap::new(),
        show: !json && std::io::stderr().is_terminal(),
        total: 0,
        last_shown: Instant::now(),
    };
    copier.total = copier.count_bytes(ROOT_INO)?;
    copier.dir(ROOT_INO, target)?;
    let root = vfs.getattr(ROOT_INO)?;
    set_meta(target, &root, true)?;
    if copier.show {
        eprintln!();
    }
    let mut report = copier.report;
    report.millis = started.elapsed().as_millis() as u64;
    drop(session);
    drop(scratch);
    Ok(report)
}

struct Copier<'a> {
    vfs: &'a Vfs,
    report: RestoreReport,
    /// Inodes with several links: the first path written for each.
    links: HashMap<Ino, PathBuf>,
    show: bool,
    total: u64,
    last_shown: Instant,
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).context("path with a NUL byte")
}

fn timespec(t: Timestamp) -> libc::timespec {
    libc::timespec { tv_sec: t.secs as libc::time_t, tv_nsec: t.nanos as libc::c_long }
}

/// Mode, ownership (as root) and times of `path` from `attr` (symlinks: ownership and times).
fn set_meta(path: &Path, attr: &Attr, set_mode: bool) -> Result<()> {
    let c = cpath(path)?;
    // SAFETY: valid NUL-terminated path; the calls have no other preconditions.
    unsafe {
        if libc::geteuid() == 0 {
            libc::lchown(c.as_ptr(), attr.uid, attr.gid);
        }
    }
    if set_mode {
        fs::set_permissions(path, fs::Permissions::from_mode(u32::from(attr.perm)))
            .with_context(|| format!("chmod {}", path.display()))?;
    }
    let times = [timespec(attr.atime), timespec(attr.mtime)];
    // SAFETY: as above; `times` has the two entries utimensat reads.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        bail!("setting the times of {}: {}", path.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

impl Copier<'_> {
    fn entries(&self, dir: Ino) -> Result<Vec<tierfs::vfs::DirEntry>> {
        let fh = self.vfs.opendir(dir)?;
        let mut out = Vec::new();
        loop {
            let batch = self.vfs.readdir(dir, fh, out.len() as u64)?;
            if batch.is_empty() {
                break;
            }
            out.extend(batch);
        }
        self.vfs.releasedir(dir, fh)?;
        out.retain(|e| e.name != b"." && e.name != b"..");
        Ok(out)
    }

    fn count_bytes(&self, dir: Ino) -> Result<u64> {
        let mut n = 0;
        for e in self.entries(dir)? {
            match e.kind {
                FileKind::Dir => n += self.count_bytes(e.ino)?,
                FileKind::File => n += self.vfs.getattr(e.ino)?.size,
                _ => {}
            }
        }
        Ok(n)
    }

    fn progress(&mut self) {
        if self.show && self.last_shown.elapsed().as_millis() >= 200 {
            self.last_shown = Instant::now();
            eprint!("\rrestore: {} files, {} of {} MiB", self.report.files, self.report.bytes >> 20, self.total >> 20);
        }
    }

    fn xattrs(&self, ino: Ino, path: &Path) -> Result<()> {
        let names = self.vfs.listxattr(ino)?;
        for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let value = self.vfs.getxattr(ino, name)?;
            let (c, n) = (cpath(path)?, CString::new(name).context("xattr name")?);
            // SAFETY: valid NUL-terminated strings and buffer.
            let rc = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                bail!("setting xattr {} on {}: {err}", String::from_utf8_lossy(name), path.display());
            }
        }
        Ok(())
    }

    fn dir(&mut self, ino: Ino, path: &Path) -> Result<()> {
        for e in self.entries(ino)? {
            let child = path.join(std::ffi::OsStr::from_bytes(&e.name));
            let attr = self.vfs.getattr(e.ino)?;
            if attr.kind != FileKind::Dir && attr.nlink > 1 {
                if let Some(first) = self.links.get(&e.ino) {
                    fs::hard_link(first, &child).with_context(|| format!("linking {}", child.display()))?;
                    self.report.hard_links += 1;
                    continue;
                }
                self.links.insert(e.ino, child.clone());
            }
            match attr.kind {
                FileKind::Dir => {
                    fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&child)
                        .with_context(|| format!("mkdir {}", child.display()))?;
                    self.dir(e.ino, &child)?;
                    self.report.dirs += 1;
                    self.xattrs(e.ino, &child)?;
                    set_meta(&child, &attr, true)?;
                }
                FileKind::File => {
                    self.file(e.ino, &attr, &child)?;
                    self.report.files += 1;
                    self.xattrs(e.ino, &child)?;
                    set_meta(&child, &attr, true)?;
                }
                FileKind::Symlink => {
                    let target = self.vfs.readlink(e.ino)?;
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &child)
                        .with_context(|| format!("symlink {}", child.display()))?;
                    self.report.symlinks += 1;
                    set_meta(&child, &attr, false)?;
                }
                _ => {
                    let c = cpath(&child)?;
                    let mode = u32::from(attr.perm) | attr.kind.mode_bits();
                    // SAFETY: valid path; mknod of a fifo/socket/device node.
                    let rc = unsafe { libc::mknod(c.as_ptr(), mode, libc::dev_t::from(attr.rdev)) };
                    if rc != 0 {
                        let err = std::io::Error::last_os_error();
                        bail!("mknod {}: {err} (device nodes need root)", child.display());
                    }
                    self.report.other += 1;
                    self.xattrs(e.ino, &child)?;
                    set_meta(&child, &attr, true)?;
                }
            }
            self.progress();
        }
        Ok(())
    }

    fn file(&mut self, ino: Ino, attr: &Attr, path: &Path) -> Result<()> {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let fh = self.vfs.open(&Caller::ROOT, ino, libc::O_RDONLY)?;
        let mut off = 0u64;
        const STEP: u32 = 4 << 20;
        while off < attr.size {
            let want = (attr.size - off).min(u64::from(STEP)) as u32;
            let data = self.vfs.read(ino, fh, off, want)?;
            if data.len() != want as usize {
                bail!("{}: read {} of {want} bytes at offset {off}", path.display(), data.len());
            }
            // All-zero 64 KiB pieces stay holes.
            for (i, piece) in data.chunks(64 << 10).enumerate() {
                if piece.iter().any(|&b| b != 0) {
                    std::os::unix::fs::FileExt::write_all_at(&out, piece, off + (i as u64) * (64 << 10))
                        .with_context(|| format!("writing {}", path.display()))?;
                }
            }
            off += u64::from(want);
            self.report.bytes += u64::from(want);
            self.progress();
        }
        out.set_len(attr.size).with_context(|| format!("sizing {}", path.display()))?;
        out.flush()?;
        self.vfs.release(ino, fh)?;
        Ok(())
    }
}
