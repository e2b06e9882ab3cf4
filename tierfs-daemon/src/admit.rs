//! Admission to the daemon's sockets. Every local user can connect to the node's hand-off
//! socket and to a node mount's control socket (their modes let the credential check decide),
//! so each socket bounds what one user, and all users together, can hold open.
//!
//! Invariants:
//! - a socket holds at most [`PER_UID`] connections of one uid and [`TOTAL`] in all; a
//!   connection past either bound is answered with one refusal line in the socket's own
//!   protocol and closed at once, so it holds nothing;
//! - a peer that stays silent for [`IDLE`] is closed by the server that admitted it;
//! - a [`Permit`] gives its place back when dropped, however the connection ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tierfs::ErrorKind;
use tierfs::types::io_error_kind;

use crate::logging::Reported;

/// Connections one uid may hold open on one socket.
pub const PER_UID: usize = 32;
/// Connections all uids together may hold open on one socket.
pub const TOTAL: usize = 256;
/// How long a connection may stay silent before the server closes it.
pub const IDLE: Duration = Duration::from_secs(30);

/// The connections a socket holds, by uid.
#[derive(Debug, Default)]
pub struct Admission {
    held: Mutex<HashMap<u32, usize>>,
}

/// One admitted connection's place.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    uid: u32,
}

impl Admission {
    pub fn new() -> Arc<Admission> {
        Arc::new(Admission::default())
    }

    /// A place for a connection of `uid`, or the refusal to answer with (`Unavailable`: a
    /// place comes back when a connection closes).
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Permit, Reported> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = held.values().sum();
        let mine = held.get(&uid).copied().unwrap_or(0);
        if mine >= PER_UID {
            let refusal =
                format!("uid {uid} already holds {mine} connections to this socket; close some and try again");
            return Err(Reported::new(ErrorKind::Unavailable, refusal));
        }
        if total >= TOTAL {
            let refusal = format!("this socket already holds {total} connections; try again shortly");
            return Err(Reported::new(ErrorKind::Unavailable, refusal));
        }
        *held.entry(uid).or_insert(0) += 1;
        Ok(Permit { admission: self.clone(), uid })
    }

    /// A place for the connection `stream`, by its peer's uid (`SO_PEERCRED`).
    pub fn admit_peer(self: &Arc<Self>, stream: &tokio::net::UnixStream) -> Result<Permit, Reported> {
        let credentials = stream.peer_cred();
        let uid = credentials
            .map_err(|e| Reported::new(io_error_kind(&e), format!("reading the caller's credentials: {e}")))?
            .uid();
        self.admit(uid)
    }

    /// Connections held now, in all.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).values().sum()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.admission.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn one_uid_is_bounded_alone_and_all_together_and_places_come_back() {
        let a = Admission::new();
        let mine: Vec<Permit> = (0..PER_UID).map(|_| a.admit(1000).unwrap()).collect();
        let refusal = a.admit(1000).unwrap_err();
        assert!(refusal.message.contains("uid 1000"), "{refusal}");
        assert_eq!(refusal.kind, Some(ErrorKind::Unavailable), "a place comes back: worth a retry");
        let other = a.admit(1001).expect("another uid still gets in");
        drop(mine);
        assert_eq!(a.held(), 1);
        drop(other);
        assert_eq!(a.held(), 0);
        let many: Vec<Permit> = (0..TOTAL as u32).map(|i| a.admit(2000 + i).unwrap()).collect();
        assert!(a.admit(0).unwrap_err().message.contains("already holds"));
        drop(many);
        a.admit(0).unwrap();
    }
}
