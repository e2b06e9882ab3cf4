//! Hand-off of `tierfs mount` and `tierfs watch` to the node daemon: when one runs, the
//! command asks it to serve the mount instead of starting a process of its own.
//!
//! Protocol: the node daemon listens on `node.sock` in its runtime directory. The client
//! writes one JSON [`HandoffRequest`] line, the fully resolved [`MountConfig`] of the mount
//! as data, and reads one [`ReadyMessage`] line, sent once the mount is live or has failed
//! to start.
//!
//! Invariants:
//! - Only root and the user the node daemon runs as may hand a mount over (`SO_PEERCRED`):
//!   the arguments name a data dir and a store file, which the daemon opens with its own
//!   rights. Anyone else gets an error line saying so, and the client of such a user never
//!   asks (it starts its own process, as without a node daemon).
//! - A handed-off mount is served under the node's runtime directory, owned by the caller, so
//!   `tierfs status`, `sync` and `umount` reach it as they reach the node's declared mounts.
//! - No node socket, or one nobody answers on (a node daemon that died), means no node
//!   daemon: the command goes on alone. A node daemon that answers and fails the mount is an
//!   error, never a silent fallback.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::UnixStream;

use crate::config::MountConfig;
use crate::launch::{ReadyInfo, ReadyMessage};
use crate::logging::{Reason, Reported, failure};
use tierfs::ErrorKind;

/// The node daemon's hand-off socket in its runtime directory.
pub const NODE_SOCKET: &str = "node.sock";

/// Longest request line the node reads.
const MAX_LINE: usize = 64 * 1024;

/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A mount handed to the node daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoffRequest {
    /// The mount, resolved by the client (the node serves it under its own runtime dir).
    pub config: MountConfig,
}

/// Whether `uid` may hand mounts to a node daemon running as `node_uid`.
pub fn may_hand_off(uid: u32, node_uid: u32) -> Result<(), Reported> {
    if uid == 0 || uid == node_uid {
        Ok(())
    } else {
        Err(Reported::new(
            ErrorKind::InvalidInput,
            format!(
                "uid {uid} may not hand mounts to the node daemon (uid {node_uid}): only root and uid {node_uid} \
                 may; `tierfs mount --standalone` serves the mount in a process of your own"
            ),
        ))
    }
}

/// The node's hand-off socket if a node daemon may serve this user's mounts: it exists and
/// belongs to root or to this user (who then may hand mounts over).
pub fn node_socket(node_runtime_dir: &Path) -> Option<PathBuf> {
    let socket = node_runtime_dir.join(NODE_SOCKET);
    let owner = std::fs::metadata(&socket).ok()?.uid();
    let me = rustix::process::geteuid().as_raw();
    may_hand_off(me, owner).ok().map(|()| socket)
}

/// Asks the node daemon at `socket` to serve `config`, waiting up to `timeout` for the mount
/// to be live. `Ok(None)`: no node daemon answers there (go on alone).
pub fn hand_off(socket: &Path, config: &MountConfig, timeout: Duration) -> Result<Option<ReadyInfo>> {
    let mut stream = match StdUnixStream::connect(socket) {
        Ok(stream) => stream,
        // A socket file left by a node daemon that is gone.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("connecting to the node daemon at {}", socket.display())),
    };
    stream.set_read_timeout(Some(timeout)).context("setting a timeout on the node socket")?;
    let mut line = serde_json::to_string(&HandoffRequest { config: config.clone() })?;
    line.push('\n');
    stream.write_all(line.as_bytes()).with_context(|| format!("writing to the node daemon at {}", socket.display()))?;
    let mut answer = String::new();
    let mut reader = std::io::Read::take(BufReader::new(&stream), MAX_LINE as u64);
    reader.read_line(&mut answer).map_err(|e| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            failure!(Reason::Timeout, "the node daemon did not report the mount ready within {} s", timeout.as_secs())
        } else {
            anyhow::Error::new(e).context(format!("reading the node daemon's answer at {}", socket.display()))
        }
    })?;
    if answer.is_empty() {
        return Err(failure!(
            ErrorKind::Unavailable,
            "the node daemon at {} closed the connection without an answer",
            socket.display()
        ));
    }
    match serde_json::from_str::<ReadyMessage>(answer.trim()) {
        Ok(ReadyMessage::Ready(info)) => Ok(Some(info)),
        Ok(ReadyMessage::Failed { error, kind, reason }) => Err(anyhow::Error::new(Reported::from_names(
            format!("the node daemon could not serve the mount: {error}"),
            kind.as_deref(),
            reason.as_deref(),
        ))),
        Err(e) => Err(failure!(ErrorKind::Internal, "the node daemon answered {:?}: {e}", answer.trim())),
    }
}

/// What the node makes of one connection: the caller and the mount it asks for.
pub struct Asked {
    pub uid: u32,
    pub config: MountConfig,
}

/// Reads one hand-off request from `stream`, checks its caller and resolves its mount under
/// the node's `runtime_dir`. An `Err` is the line to answer with.
pub async fn read_request(stream: &mut AsyncBufReader<UnixStream>, runtime_dir: &Path) -> Result<Asked, ReadyMessage> {
    let failed = |error: String| ReadyMessage::failed(Reported::new(tierfs::ErrorKind::InvalidInput, error));
    let uid = stream.get_ref().peer_cred().map_err(|e| failed(format!("reading the caller's credentials: {e}")))?.uid();
    let mut line = String::new();
    let read = tokio::time::timeout(REQUEST_TIMEOUT, stream.take(MAX_LINE as u64 + 1).read_line(&mut line)).await;
    match read {
        Ok(Ok(n)) if n > 0 && n <= MAX_LINE => {}
        Ok(Ok(_)) => return Err(failed("empty or too long request".into())),
        Ok(Err(e)) => return Err(failed(format!("reading the request: {e}"))),
        Err(_) => return Err(failed("no request within 5 s".into())),
    }
    may_hand_off(uid, rustix::process::geteuid().as_raw()).map_err(ReadyMessage::failed)?;
    let request: HandoffRequest =
        serde_json::from_str(line.trim()).map_err(|e| failed(format!("bad hand-off request: {e}")))?;
    let mut config = request.config;
    config.check().map_err(|e| failed(format!("bad mount configuration: {e:#}")))?;
    config.runtime_dir = runtime_dir.to_path_buf();
    config.owner = Some(uid);
    config.metered = true;
    Ok(Asked { uid, config })
}

/// Writes the one answer line of a hand-off.
pub async fn answer(stream: &mut AsyncBufReader<UnixStream>, message: &ReadyMessage) -> std::io::Result<()> {
    let mut line = serde_json::to_string(message).map_err(std::io::Error::other)?;
    line.push('\n');
    let stream = stream.get_mut();
    stream.write_all(line.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_nodes_user_may_hand_off() {
        assert!(may_hand_off(0, 0).is_ok());
        assert!(may_hand_off(1000, 1000).is_ok());
        assert!(may_hand_off(0, 1000).is_ok());
        let refusal = may_hand_off(1001, 0).expect_err("another user");
        assert!(refusal.message.contains("uid 1001") && refusal.message.contains("--standalone"), "{refusal}");
        assert_eq!(refusal.kind, Some(ErrorKind::InvalidInput));
    }
}
