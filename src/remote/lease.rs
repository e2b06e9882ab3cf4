//! The writer lease of a workspace: who writes it, and until when.
//!
//! The lease is what a second writer is told ("in use by host:pid until …"); the fence is the
//! journal chain (see the parent module): the first thing a writer does after taking the lease
//! is to append a segment, and a writer whose next segment number is taken stops. So even two
//! nodes that both believe they hold the lease (a forced `--takeover` while the old node still
//! runs, clocks far apart) can never both extend the workspace.
//!
//! Invariants: a lease is renewed well before it expires (every third of its time to live); a
//! writer that finds another session's lease at renewal stops writing to the store. A lease
//! whose holder was a process of this machine and pid namespace that no longer exists (a
//! restart after `kill -9`) is free at once; anywhere else it is free once it expires.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RemoteError, Result, Workspace, chrono_like, unix_now};
use crate::crypto::ObjectKind;

/// The stored lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub format: u32,
    pub session: String,
    /// `host:pid`, for messages.
    pub holder: String,
    pub acquired_unix: u64,
    pub expires_unix: u64,
    /// Set by a clean unmount: anyone may take the workspace at once.
    pub released: bool,
    /// `boot id/pid namespace/pid` of the holder: on the same machine and pid namespace, a
    /// holder whose process is gone (kill -9, crash) is known dead without waiting for expiry.
    #[serde(default)]
    pub process: String,
}

/// This process as [`LeaseRecord::process`] names it.
fn this_process() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{}/{}/{}", boot.trim(), pidns, std::process::id())
}

/// Whether `process` (a [`LeaseRecord::process`]) is a process of this machine and pid
/// namespace that no longer exists.
fn is_dead_here(process: &str) -> bool {
    let mine = this_process();
    let (Some((place, pid)), Some((my_place, _))) = (process.rsplit_once('/'), mine.rsplit_once('/')) else {
        return false;
    };
    let Ok(pid) = pid.parse::<i32>() else { return false };
    if place != my_place || place.starts_with('/') || !place.contains("pid:[") || pid <= 0 {
        return false; // another machine or namespace, or identity unknown: wait for expiry
    }
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // A killed daemon nobody has reaped yet (its parent is gone) is a zombie: dead too.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// This node's claim on a workspace.
pub struct Lease {
    ws: Arc<Workspace>,
    holder: String,
    session: String,
    ttl: Duration,
}

impl Lease {
    pub(super) fn new(ws: Arc<Workspace>, holder: &str, ttl: Duration) -> Lease {
        let session = hex::encode(rand::random::<[u8; 12]>());
        Lease { ws, holder: holder.to_string(), session, ttl }
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// How often [`Lease::renew`] should run.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// The current lease record, if any.
    pub async fn current(&self) -> Result<Option<LeaseRecord>> {
        let key = self.ws.lease_key();
        let Some(plain) = self.ws.get_sealed(ObjectKind::Lease, &key).await? else { return Ok(None) };
        serde_json::from_slice(&plain)
            .map(Some)
            .map_err(|e| RemoteError::Corrupt { what: "workspace lease".into(), reason: e.to_string() })
    }

    async fn write(&self, released: bool, acquired_unix: u64) -> Result<()> {
        let now = unix_now();
        let rec = LeaseRecord {
            format: super::REMOTE_FORMAT,
            session: self.session.clone(),
            holder: self.holder.clone(),
            acquired_unix,
            expires_unix: if released { now } else { now + self.ttl.as_secs() },
            released,
            process: this_process(),
        };
        let body = serde_json::to_vec(&rec).expect("a lease serializes");
        self.ws.put_sealed(ObjectKind::Lease, &self.ws.lease_key(), &body).await
    }

    /// Takes the lease: refused while another session holds an unexpired one, unless
    /// `takeover`.
    pub async fn acquire(&self, takeover: bool) -> Result<()> {
        if let Some(cur) = self.current().await? {
            let mut live = !cur.released && cur.expires_unix > unix_now() && cur.session != self.session;
            if live && is_dead_here(&cur.process) {
                tracing::info!(holder = %cur.holder, "the last holder of the lease was a process of this machine that is gone");
                live = false;
            }
            if live && !takeover {
                return Err(RemoteError::Held {
                    workspace: self.ws.name().to_string(),
                    holder: cur.holder,
                    expires: chrono_like(cur.expires_unix),
                });
            }
            if live {
                tracing::warn!(holder = %cur.holder, "taking over workspace {:?} from a live lease", self.ws.name());
            }
        }
        self.write(false, unix_now()).await
    }

    /// Extends the lease; [`RemoteError::TakenOver`] if another session holds it now.
    pub async fn renew(&self) -> Result<()> {
        match self.current().await? {
            Some(cur) if cur.session != self.session => {
                Err(RemoteError::TakenOver { workspace: self.ws.name().to_string(), holder: cur.holder })
            }
            cur => self.write(false, cur.map_or_else(unix_now, |c| c.acquired_unix)).await,
        }
    }

    /// Gives the lease up (clean unmount), if this session still holds it.
    pub async fn release(&self) -> Result<()> {
        match self.current().await? {
            Some(cur) if cur.session == self.session => self.write(true, cur.acquired_unix).await,
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gone_process_of_this_machine_and_namespace_counts_as_dead() {
        let mine = this_process();
        assert!(!is_dead_here(&mine), "this process is alive: {mine}");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        let (place, _) = mine.rsplit_once('/').expect("an identity");
        // Exited but not reaped yet (a zombie), then reaped.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(is_dead_here(&format!("{place}/{pid}")), "an exited child is dead");
        child.wait().expect("wait");
        assert!(is_dead_here(&format!("{place}/{pid}")), "a reaped child is gone");
        // Elsewhere (another boot id), or unknown: never assumed dead.
        assert!(!is_dead_here(&format!("00000000-0000-0000-0000-000000000000/pid:[1]/{pid}")));
        assert!(!is_dead_here(""));
        assert!(!is_dead_here(&format!("//{pid}")));
    }
}
