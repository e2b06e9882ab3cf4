//! What a serving process keeps to itself. The node daemon runs as root on nodes that other
//! users share, and a data dir holds a workspace's names, metadata, history and log in the
//! clear (without `--encrypt-cache`, its data too), so:
//!
//! - every file and directory a serving process makes is private to its user: the process
//!   umask is 077 from its start ([`private_umask`]), so RocksDB's files, the history
//!   repository, logs and the embedded store come out 0600/0700 whoever wrote them;
//! - a data dir made looser by an older version or by hand is tightened to 0700 when it is
//!   mounted, and the log says so ([`tighten_data_dir`]): another user cannot reach anything
//!   beneath it;
//! - a key file that another user can read, write or run is refused with the `chmod` that
//!   fixes it, as ssh refuses such a private key ([`check_secret_file`]); the core's
//!   `StoreConfig::load` refuses a store file by the same check (`tierfs::store::private_mode`).
//!
//! Sockets and the directories that hold them are the exception: they are reachable on
//! purpose, with the modes `paths` and `control` give them, and every connection is checked
//! by its peer's credentials.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::logging::{Reason, bail_with};
use anyhow::{Context, Result};
use rustix::fs::Mode;
use tracing::warn;

/// Makes everything this process creates from now on private to its user (umask 077).
/// Idempotent; every entry point of a serving process calls it first.
pub fn private_umask() {
    rustix::process::umask(Mode::from_raw_mode(0o077));
}

/// Tightens an existing data dir that other users could enter or read to 0700, saying so.
/// A data dir that does not exist yet is left to be made (under [`private_umask`]).
pub fn tighten_data_dir(dir: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading the data dir {}", dir.display())),
    };
    if !meta.is_dir() {
        bail_with!(Reason::PathInUse, "the data dir {} is not a directory", dir.display());
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making the data dir {} private (chmod 700)", dir.display()))?;
        warn!("the data dir {} was open to other users (mode {mode:04o}): made it 0700", dir.display());
    }
    Ok(())
}

/// Refuses a secret file (`what`: "key file") that users other than its owner may read,
/// write or run, naming the command that fixes it.
pub fn check_secret_file(path: &Path, what: &str) -> Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {what} {}", path.display()))?;
    Ok(tierfs::store::private_mode(path, meta.mode(), what)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn an_open_data_dir_is_tightened_and_a_missing_one_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        tighten_data_dir(&dir).unwrap();
        assert!(!dir.exists());
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        tighten_data_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(tighten_data_dir(&file).is_err(), "a file is no data dir");
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("store.key");
        std::fs::write(&key, b"k").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refusal = check_secret_file(&key, "key file").unwrap_err().to_string();
        assert!(refusal.contains("mode 0644") && refusal.contains("chmod 600"), "{refusal}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        check_secret_file(&key, "key file").unwrap();
    }
}
