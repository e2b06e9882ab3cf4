//! `tierfs layer`: an overlay on a system directory (`/usr/local`, or any directory root
//! names) whose upper layer lives in a tierfs mount, so that what `apt`, `make install` or a
//! system-wide `pip` puts there is part of the workspace and comes back after a reset.
//!
//! `add DIR` mounts overlayfs on DIR with DIR itself as the lower layer (what the image
//! ships) and `<mount>/.tierfs/layers/<DIR, escaped>/upper` and `work` as the upper and work
//! directories; `remove DIR` unmounts it, leaving its files in the workspace; `list` shows
//! the layers of this machine (overlay mounts whose source is [`SOURCE`]). overlayfs takes a
//! tierfs directory as its upper layer because tierfs implements `RENAME_WHITEOUT` and xattrs.
//!
//! Trust: only root mounts an overlay, and root layers only a workspace it serves for
//! itself: a node mount of another user's workspace is refused, since its files would
//! shadow what root runs. The overlay is `nosuid,nodev` whatever the workspace holds,
//! because its files come from a store, and a store is hostile input. DIR is checked once,
//! before anything changes: an existing directory, not `/`, neither inside the holding mount
//! nor holding it, and not a mount point already (except of this very layer, which makes
//! `add` a no-op).

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rustix::mount::{MountFlags, UnmountFlags};
use serde::Serialize;
use tierfs::ErrorKind;

use crate::control::StatusReport;
use crate::logging::{Reason, bail_with};
use crate::mounts;

/// The source name of every layer's overlay mount: how `list` and `remove` tell a layer
/// from any other overlay.
pub const SOURCE: &str = "tierfs-layer";

/// The deepest the kernel stacks filesystems (`FILESYSTEM_MAX_STACK_DEPTH`).
const MAX_STACK_DEPTH: u32 = 2;

/// Where a mount keeps its layers, relative to its root.
const LAYERS_DIR: &str = ".tierfs/layers";

/// One layer, as `add`, `remove` and `list` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// The directory the overlay is mounted on.
    pub dir: PathBuf,
    /// Its upper layer, inside the tierfs mount (`None` when `list` cannot tell).
    pub upper: Option<PathBuf>,
    /// `add` found the layer already mounted; `remove` found nothing to unmount.
    pub unchanged: bool,
}

/// The name of DIR's layer inside [`LAYERS_DIR`]: its path without the leading `/`, with
/// `%` and `/` percent-encoded, so that every directory has its own and the name reads back.
fn layer_name(dir: &Path) -> String {
    let path = dir.to_string_lossy();
    path.trim_start_matches('/').replace('%', "%25").replace('/', "%2F")
}

/// Mounts the layer of `dir` whose upper layer is in the tierfs mount `holder` (the one of
/// `mounts` it names, or the only one).
pub fn add(dir: &Path, holder: Option<&Path>, mounts: &[StatusReport]) -> Result<Layer> {
    require_root()?;
    let dir = checked_dir(dir)?;
    let holder = holding_mount(holder, mounts)?;
    room_for_a_layer(holder)?;
    let mountpoint = &holder.mountpoint;
    if dir.starts_with(mountpoint) || mountpoint.starts_with(&dir) {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} and the tierfs mount {} must not contain each other: a layer's upper directory cannot be inside \
             what it covers",
            dir.display(),
            mountpoint.display()
        );
    }
    let base = mountpoint.join(LAYERS_DIR).join(layer_name(&dir));
    let (upper, work) = (base.join("upper"), base.join("work"));
    if let Some(entry) = mounts::find_mount(&dir).context("reading the mount table")? {
        if entry.fs_type == "overlay" && entry.source == SOURCE {
            return Ok(Layer { dir, upper: Some(upper), unchanged: true });
        }
        bail_with!(
            Reason::MountpointTaken,
            "{} is already a mount point ({} from {}); a layer goes on a plain directory",
            dir.display(),
            entry.fs_type,
            entry.source
        );
    }
    make_layer_dirs(&dir, &upper, &work)?;
    let options = format!("lowerdir={},upperdir={},workdir={}", dir.display(), upper.display(), work.display());
    let options = CString::new(options).context("overlay options with a NUL byte")?;
    rustix::mount::mount(SOURCE, &dir, "overlay", MountFlags::NOSUID | MountFlags::NODEV, options.as_c_str())
        .map_err(std::io::Error::from)
        .with_context(|| {
            format!(
                "mounting the overlay on {} (upper layer {}; the kernel log, `dmesg`, says why)",
                dir.display(),
                upper.display()
            )
        })?;
    Ok(Layer { dir, upper: Some(upper), unchanged: false })
}

/// Unmounts the layer on `dir`; its files stay in the workspace.
pub fn remove(dir: &Path) -> Result<Layer> {
    require_root()?;
    let dir = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    match mounts::find_mount(&dir).context("reading the mount table")? {
        Some(entry) if entry.fs_type == "overlay" && entry.source == SOURCE => {}
        _ => return Ok(Layer { dir, upper: None, unchanged: true }),
    }
    rustix::mount::unmount(&dir, UnmountFlags::empty())
        .map_err(std::io::Error::from)
        .with_context(|| format!("unmounting the layer on {} (a process may still use it)", dir.display()))?;
    Ok(Layer { dir, upper: None, unchanged: false })
}

/// The layers mounted in this mount namespace.
pub fn list() -> Result<Vec<Layer>> {
    let table = mounts::mount_table().context("reading the mount table")?;
    Ok(table
        .into_iter()
        .filter(|e| e.fs_type == "overlay" && e.source == SOURCE)
        .map(|e| Layer { upper: upper_of(&e), dir: e.mount_point, unchanged: true })
        .collect())
}

/// The directories layered from the tierfs mount at `mountpoint`: while one is, the mount
/// must not go (a lazily detached mount would take the layer's later writes with it).
pub fn held_by(mountpoint: &Path) -> Result<Vec<PathBuf>> {
    let layers = mountpoint.join(LAYERS_DIR);
    Ok(list()?
        .into_iter()
        .filter(|l| l.upper.as_ref().is_some_and(|u| u.starts_with(&layers)))
        .map(|l| l.dir)
        .collect())
}

/// An overlay's upper directory, from its superblock options.
fn upper_of(entry: &mounts::MountEntry) -> Option<PathBuf> {
    entry.super_options.split(',').find_map(|o| o.strip_prefix("upperdir=")).map(PathBuf::from)
}

fn require_root() -> Result<()> {
    if !mounts::is_root() {
        bail_with!(ErrorKind::InvalidInput, "layers are root's: mounting an overlay takes CAP_SYS_ADMIN");
    }
    Ok(())
}

/// `dir` resolved, once: an existing directory other than `/`, whose path overlayfs's
/// option syntax can carry.
fn checked_dir(dir: &Path) -> Result<PathBuf> {
    let resolved = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    if !resolved.is_dir() {
        bail_with!(ErrorKind::InvalidInput, "{} is not a directory", resolved.display());
    }
    if resolved == Path::new("/") {
        bail_with!(ErrorKind::InvalidInput, "/ cannot be a layer: name the directories to keep, e.g. /usr/local");
    }
    if resolved.as_os_str().as_bytes().iter().any(|b| matches!(b, b',' | b':' | b'\\' | b'\n')) {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} has a comma, colon, backslash or newline, which overlayfs's options cannot carry",
            resolved.display()
        );
    }
    Ok(resolved)
}

/// The tierfs mount that holds the layer: the one `holder` names, else the only one.
fn holding_mount<'a>(holder: Option<&Path>, mounts: &'a [StatusReport]) -> Result<&'a StatusReport> {
    let fuse: Vec<&StatusReport> = mounts.iter().filter(|m| m.watch.is_none() && !m.read_only).collect();
    let found = match holder {
        Some(path) => {
            let path = fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
            fuse.into_iter().find(|m| m.mountpoint == path).ok_or_else(|| {
                crate::logging::failure!(
                    ErrorKind::NotFound,
                    "{} is not a writable tierfs mount of this user (`tierfs status` lists them)",
                    path.display()
                )
            })?
        }
        None => match fuse.as_slice() {
            [only] => only,
            [] => bail_with!(ErrorKind::NotFound, "no writable tierfs mount to keep the layer in: mount one first"),
            _ => bail_with!(
                ErrorKind::InvalidInput,
                "{} tierfs mounts are running: name the one to keep the layer in with --in",
                fuse.len()
            ),
        },
    };
    if let Some(owner) = found.owner {
        bail_with!(
            ErrorKind::InvalidInput,
            "the tierfs mount {} is uid {owner}'s workspace: layering it over a system directory would make root \
             run that user's files; layer a workspace root mounts for itself",
            found.mountpoint.display()
        );
    }
    Ok(found)
}

/// The kernel stacks filesystems at most [`MAX_STACK_DEPTH`] deep, and overlayfs refuses
/// (EINVAL) an upper layer already that deep. A mount serving files through FUSE passthrough
/// declares its depth: 1 on a plain disk, 2 when its data dir is itself on overlayfs (see
/// `Vfs::passthrough_stack_depth`). The second case is refused here, before anything changes.
fn room_for_a_layer(holder: &StatusReport) -> Result<()> {
    let depth = holder.passthrough.as_ref().and_then(|p| p.stack_depth).unwrap_or(0);
    if depth >= MAX_STACK_DEPTH {
        bail_with!(
            Reason::PassthroughStackFull,
            "the data dir of the tierfs mount {} is on overlayfs (or another stacked filesystem), so the mount's \
             passthrough stack is full (depth {depth} of the kernel's {MAX_STACK_DEPTH}): remount it with \
             --no-passthrough to hold a layer",
            holder.mountpoint.display()
        );
    }
    Ok(())
}

/// Creates the upper and work directories; a new upper directory takes `dir`'s owner and
/// mode, since it becomes the merged directory's root.
fn make_layer_dirs(dir: &Path, upper: &Path, work: &Path) -> Result<()> {
    let fresh = !upper.exists();
    for d in [upper, work] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    if fresh {
        let meta = fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
        std::os::unix::fs::chown(upper, Some(meta.uid()), Some(meta.gid()))
            .with_context(|| format!("giving {} the owner of {}", upper.display(), dir.display()))?;
        fs::set_permissions(upper, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .with_context(|| format!("giving {} the mode of {}", upper.display(), dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_directory_has_its_own_layer_name() {
        assert_eq!(layer_name(Path::new("/usr/local")), "usr%2Flocal");
        assert_eq!(layer_name(Path::new("/opt/a%2Fb")), "opt%2Fa%252Fb");
        assert_ne!(layer_name(Path::new("/opt/a%2Fb")), layer_name(Path::new("/opt/a/b")));
    }

    #[test]
    fn a_layers_upper_directory_is_read_from_its_superblock_options() {
        let entry = |options: &str| mounts::MountEntry {
            mount_point: PathBuf::from("/usr/local"),
            fs_type: "overlay".into(),
            source: SOURCE.into(),
            super_options: options.into(),
        };
        let upper = "rw,lowerdir=/usr/local,upperdir=/w/.tierfs/layers/usr%2Flocal/upper,workdir=/w/x";
        assert_eq!(upper_of(&entry(upper)), Some(PathBuf::from("/w/.tierfs/layers/usr%2Flocal/upper")));
        assert_eq!(upper_of(&entry("rw,lowerdir=/a")), None);
    }

    #[test]
    fn root_never_layers_another_users_workspace() {
        let mine = StatusReport { mountpoint: PathBuf::from("/"), ..StatusReport::default() };
        let theirs = StatusReport { mountpoint: PathBuf::from("/"), owner: Some(1000), ..StatusReport::default() };
        assert!(holding_mount(None, std::slice::from_ref(&mine)).is_ok());
        let refused = holding_mount(None, std::slice::from_ref(&theirs)).expect_err("another user's mount");
        assert_eq!(crate::logging::error_kind(&refused), Some(ErrorKind::InvalidInput));
        assert!(refused.to_string().contains("uid 1000"), "{refused}");
        // Two candidates and no --in: the user picks.
        assert!(holding_mount(None, &[mine.clone(), mine]).is_err());
    }

    #[test]
    fn a_mount_whose_passthrough_stack_is_full_holds_no_layer() {
        let with_depth = |stack_depth| StatusReport {
            mountpoint: PathBuf::from("/w"),
            passthrough: Some(tierfs::vfs::PassthroughStats { stack_depth, ..Default::default() }),
            ..StatusReport::default()
        };
        for room in [None, Some(1)] {
            assert!(room_for_a_layer(&with_depth(room)).is_ok(), "depth {room:?}");
        }
        assert!(room_for_a_layer(&StatusReport::default()).is_ok(), "no passthrough");
        let refused = room_for_a_layer(&with_depth(Some(2))).expect_err("a full stack");
        assert_eq!(crate::logging::error_kind(&refused), Some(ErrorKind::Conflict));
        assert_eq!(crate::logging::error_reason(&refused), Some(Reason::PassthroughStackFull));
        assert!(refused.to_string().contains("--no-passthrough"), "{refused}");
    }
}
