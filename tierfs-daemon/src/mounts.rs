//! What the kernel says is mounted where, and how to unmount a FUSE filesystem.
//!
//! The kernel's mount table (`/proc/self/mountinfo`) is the truth for "is this mounted":
//! a daemon can die and leave a stale mount behind, and a control socket can outlive its
//! daemon, so neither is trusted alone. Unmounting uses `umount2(2)` when we are root and
//! the setuid `fusermount3 -u` helper otherwise, as libfuse does; a busy mountpoint is
//! reported as [`UnmountError::Busy`] so callers can choose between refusing and detaching
//! lazily.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::mount::UnmountFlags;

/// One line of `/proc/self/mountinfo`, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// File system type, e.g. `fuse`, `fuse.tierfs`, `ext4`.
    pub fs_type: String,
    /// Mount source (for FUSE the `fsname` option).
    pub source: String,
    /// The superblock's options, as the kernel prints them (e.g. an overlay's `upperdir=`).
    pub super_options: String,
}

impl MountEntry {
    /// Whether this is a FUSE mount (of any FUSE filesystem).
    pub fn is_fuse(&self) -> bool {
        self.fs_type == "fuse" || self.fs_type.starts_with("fuse.")
    }
}

/// Why an unmount failed. It crosses from the node daemon to a worker (`crate::worker`)
/// as data, so a worker tells a busy mount from a failed unmount as a local caller does.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum UnmountError {
    #[error(
        "{0} is busy: a process has a file open there or its working directory inside; \
         close it, or unmount lazily (`tierfs umount --lazy`)"
    )]
    Busy(PathBuf),
    #[error("{0} is not mounted")]
    NotMounted(PathBuf),
    #[error("unmounting {path}: {message}")]
    Failed { path: PathBuf, message: String },
}

impl UnmountError {
    /// This error with its kind, for a caller in another process.
    pub fn reported(&self) -> crate::logging::Reported {
        use crate::logging::{Reason, Reported};
        match self {
            UnmountError::Busy(_) => Reported::new(Reason::PathInUse, self.to_string()),
            UnmountError::NotMounted(_) => Reported::new(tierfs::ErrorKind::NotFound, self.to_string()),
            UnmountError::Failed { .. } => Reported::new(tierfs::ErrorKind::Internal, self.to_string()),
        }
    }
}

/// The current mount table of this process's mount namespace.
pub fn mount_table() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mount whose mount point is exactly `path`, if any. When mounts are stacked on the
/// same path the last one (the visible one) wins.
pub fn find_mount(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mount_table()?.into_iter().rev().find(|entry| entry.mount_point == path))
}

/// Parses the text of `/proc/<pid>/mountinfo`; malformed lines are skipped.
///
/// Format (proc(5)): `id parent major:minor root mount_point options [optional...] - fstype
/// source super_options`. Paths escape space, tab, newline and backslash as `\ooo`.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let mount_point = fields.nth(4)?;
            let mut rest = fields.skip_while(|f| *f != "-");
            rest.next()?; // the "-" separator
            let fs_type = rest.next()?;
            let source = rest.next()?;
            let super_options = rest.next().unwrap_or_default();
            Some(MountEntry {
                mount_point: PathBuf::from(std::ffi::OsString::from_vec(unescape_octal(mount_point))),
                fs_type: fs_type.to_string(),
                source: String::from_utf8_lossy(&unescape_octal(source)).into_owned(),
                super_options: String::from_utf8_lossy(&unescape_octal(super_options)).into_owned(),
            })
        })
        .collect()
}

/// Decodes the `\ooo` octal escapes of mountinfo fields.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = &bytes[i + 1..(i + 4).min(bytes.len())];
            if digits.len() == 3 && digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Whether the effective user is root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Unmounts the FUSE filesystem at `path`. `lazy` detaches it even when busy (`MNT_DETACH`,
/// `fusermount3 -u -z`): it disappears from the namespace at once and the kernel ends the
/// FUSE session when the last open file is closed.
pub fn unmount(path: &Path, lazy: bool) -> Result<UnmountMethod, UnmountError> {
    if is_root() {
        let flags = if lazy { UnmountFlags::DETACH } else { UnmountFlags::empty() };
        let err = match rustix::mount::unmount(path, flags) {
            Ok(()) => return Ok(UnmountMethod::Umount2),
            Err(errno) => io::Error::from(errno),
        };
        return Err(match err.raw_os_error() {
            Some(libc::EBUSY) => UnmountError::Busy(path.to_path_buf()),
            Some(libc::EINVAL) => UnmountError::NotMounted(path.to_path_buf()),
            _ => UnmountError::Failed { path: path.to_path_buf(), message: err.to_string() },
        });
    }
    fusermount_unmount(path, lazy)
}

/// How an unmount was done, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmountMethod {
    Umount2,
    Fusermount(&'static str),
    /// By the node daemon, for a worker that serves the mount as its owner.
    NodeDaemon,
}

impl std::fmt::Display for UnmountMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmountMethod::Umount2 => f.write_str("umount2"),
            UnmountMethod::Fusermount(helper) => f.write_str(helper),
            UnmountMethod::NodeDaemon => f.write_str("by the node daemon"),
        }
    }
}

fn fusermount_unmount(path: &Path, lazy: bool) -> Result<UnmountMethod, UnmountError> {
    let mut last_error = String::new();
    for helper in ["fusermount3", "fusermount"] {
        let mut cmd = Command::new(helper);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--").arg(path);
        match cmd.output() {
            Ok(output) if output.status.success() => return Ok(UnmountMethod::Fusermount(helper)),
            Ok(output) => {
                let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
                return Err(classify_fusermount_error(path, stderr));
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                last_error = format!("{helper} not found");
            }
            Err(err) => {
                return Err(UnmountError::Failed {
                    path: path.to_path_buf(),
                    message: format!("running {helper}: {err}"),
                });
            }
        }
    }
    Err(UnmountError::Failed {
        path: path.to_path_buf(),
        message: format!("{last_error}; install fuse3 (fusermount3) to unmount as a non-root user"),
    })
}

fn classify_fusermount_error(path: &Path, stderr: String) -> UnmountError {
    if stderr.contains("busy") {
        UnmountError::Busy(path.to_path_buf())
    } else if stderr.contains("not found in /etc/mtab") || stderr.contains("Invalid argument") {
        UnmountError::NotMounted(path.to_path_buf())
    } else {
        UnmountError::Failed { path: path.to_path_buf(), message: stderr }
    }
}

/// `syncfs(2)` on the filesystem holding `path`: the kernel writes back every dirty page it
/// caches for that filesystem (for FUSE with the writeback cache: sends them to the daemon).
pub fn syncfs(path: &Path) -> io::Result<()> {
    let dir = fs::File::open(path)?;
    Ok(rustix::fs::syncfs(&dir)?)
}

/// Checks that the FUSE device exists, with advice when it does not.
pub fn check_fuse_device() -> anyhow::Result<()> {
    let unavailable = |message: String| {
        anyhow::Error::new(crate::logging::Reported::new(crate::logging::Reason::FuseUnavailable, message))
    };
    // Opened, not only looked at: a node of a kernel without the FUSE driver exists but fails
    // to open (ENODEV, ENXIO), and that must show before the store is opened and its lease
    // taken. No permission to open it is fine: fusermount3 (setuid) opens it for a user.
    match fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(unavailable(
            "/dev/fuse is missing: FUSE is not available here. Load the kernel module \
             (`modprobe fuse`), or in a container pass `--device /dev/fuse --cap-add SYS_ADMIN`; \
             without FUSE, `tierfs watch DIR` syncs a plain directory instead"
                .into(),
        )),
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENODEV | libc::ENXIO)) => Err(unavailable(format!(
            "/dev/fuse cannot be opened ({err}): this kernel has no FUSE driver loaded. Load it \
             (`modprobe fuse`), or use `tierfs watch DIR`, which needs no FUSE"
        ))),
        Err(err) if matches!(err.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => Ok(()),
        Err(err) => Err(unavailable(format!("checking /dev/fuse: {err}"))),
    }
}

/// Whether process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name, which may
        // itself contain spaces and parentheses: search from the last ')'.
        Ok(stat) => match stat.rfind(')') {
            Some(end) => !matches!(stat[end + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
36 25 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
120 36 0:55 / /tmp/my\\040mount rw,nosuid,nodev,relatime shared:70 - fuse tierfs rw,user_id=0,group_id=0
121 36 0:56 / /content/work rw,nosuid,nodev,relatime - fuse.tierfs tierfs rw,user_id=0,group_id=0
garbage line
";

    #[test]
    fn parses_mountinfo_with_escapes_and_optional_fields() {
        let table = parse_mountinfo(SAMPLE);
        assert_eq!(table.len(), 4);
        assert_eq!(table[2].mount_point, PathBuf::from("/tmp/my mount"));
        assert_eq!(table[2].fs_type, "fuse");
        assert_eq!(table[2].source, "tierfs");
        assert!(table[2].is_fuse());
        assert_eq!(table[3].mount_point, PathBuf::from("/content/work"));
        assert!(table[3].is_fuse());
        assert!(!table[1].is_fuse());
    }

    #[test]
    fn unescape_handles_edge_cases() {
        assert_eq!(unescape_octal("a\\040b"), b"a b");
        assert_eq!(unescape_octal("a\\134b"), b"a\\b");
        assert_eq!(unescape_octal("tail\\04"), b"tail\\04");
        assert_eq!(unescape_octal("\\999"), b"\\999");
    }

    #[test]
    fn own_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
    }
}
