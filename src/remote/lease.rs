//! The writer lease of a workspace: who writes it, and until when.
//!
//! The lease is what a second writer is told ("in use by host:pid until …"); the fence is the
//! journal chain (see the parent module): the first thing a writer does after taking the lease
//! is to append a segment, and a writer whose next segment number is taken stops. So even two
//! nodes that both believe they hold the lease (a forced `--takeover` while the old node still
//! runs, clocks far apart) can never both extend the workspace.
//!
//! Invariants: a lease is renewed well before it expires (every third of its time to live); a
//! writer that finds another session's lease at renewal stops writing to the store.

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
        };
        let body = serde_json::to_vec(&rec).expect("a lease serializes");
        self.ws.put_sealed(ObjectKind::Lease, &self.ws.lease_key(), &body).await
    }

    /// Takes the lease: refused while another session holds an unexpired one, unless
    /// `takeover`.
    pub async fn acquire(&self, takeover: bool) -> Result<()> {
        if let Some(cur) = self.current().await? {
            let live = !cur.released && cur.expires_unix > unix_now() && cur.session != self.session;
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
