//! systemd's readiness protocol (`sd_notify(3)`): datagrams such as `READY=1` or `STOPPING=1`
//! to the socket named by `$NOTIFY_SOCKET`, a path or, with a leading `@`, an abstract name.
//!
//! Without `$NOTIFY_SOCKET` (not started by systemd with `Type=notify`) every send is a
//! no-op. A failed send is logged, never fatal: the mounts matter more than the manager's
//! view of them.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use tracing::{debug, warn};

/// Where readiness goes, if anywhere.
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` asks for; an unusable value is an error.
    pub fn from_env() -> io::Result<Notifier> {
        let Some(name) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(Notifier { target: None });
        };
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str());
        let addr = match bytes.strip_prefix(b"@") {
            Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
            None => SocketAddr::from_pathname(&name)?,
        };
        Ok(Notifier { target: Some((UnixDatagram::unbound()?, addr)) })
    }

    /// Sends `state`, lines such as `READY=1\nSTATUS=2 of 2 mounts live`.
    pub fn send(&self, state: &str) {
        let Some((socket, addr)) = &self.target else {
            return;
        };
        match socket.send_to_addr(state.as_bytes(), addr) {
            Ok(_) => debug!(state, "sd_notify"),
            Err(err) => warn!("telling the service manager {state:?}: {err}"),
        }
    }
}
