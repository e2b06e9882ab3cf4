//! Background mounts: `tierfs mount` starts its daemon detached (its own executable, run as
//! `tierfs-daemon serve`: [`daemon_executable`]) and returns only once the daemon says the
//! mount is ready, or prints the daemon's own error and fails.
//!
//! The handshake is a pipe. The parent creates it close-on-exec, the child clears that flag
//! on the write end only (between fork and exec) and learns its number from the hidden
//! `--ready-fd` option. The daemon writes exactly one JSON line, [`ReadyMessage`], and
//! closes the pipe. End of file without a line means the daemon died before it could say
//! anything (a crash, a usage error), and the parent then shows the tail of the daemon log.
//!
//! Invariants:
//! - The daemon runs in its own session (`setsid`): it survives the terminal or notebook
//!   cell that started it, and a Ctrl-C there does not reach it.
//! - Its stdin is /dev/null and stdout/stderr append to `<data dir>/daemon.log` (0600).
//! - The parent never leaves a half-started daemon behind: on timeout it stops it.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use rustix::io::FdFlags;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tracing::warn;

use tierfs::ErrorKind;

use crate::config::MountConfig;
use crate::control::ControlHandler;
use crate::logging::{Reason, Reported, bail_with, failure};
use crate::paths;

/// How many lines of the daemon log to show when it dies without a message.
const LOG_TAIL_LINES: usize = 20;

/// What a ready mount looks like to whoever started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyInfo {
    pub pid: u32,
    pub mountpoint: PathBuf,
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    /// The daemon's log file, when it runs in the background.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
}

impl ReadyInfo {
    /// This process, serving `mountpoint` from `data_dir` with its control socket at `socket`
    /// (the log is filled in by whoever started it in the background).
    pub fn of_this_process(mountpoint: &Path, data_dir: &Path, socket: &Path) -> ReadyInfo {
        ReadyInfo {
            pid: std::process::id(),
            mountpoint: mountpoint.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            socket: socket.to_path_buf(),
            log: None,
        }
    }
}

/// The one line a daemon writes on its ready pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ReadyMessage {
    Ready(ReadyInfo),
    Failed {
        error: String,
        /// The error's kind ([`tierfs::ErrorKind::name`]), when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        /// Its refinement ([`crate::logging::Reason::name`]), when it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl ReadyMessage {
    /// The line for a failure, with its kind and reason.
    pub fn failed(e: Reported) -> ReadyMessage {
        ReadyMessage::Failed {
            error: e.message,
            kind: e.kind.map(|k| k.name().to_string()),
            reason: e.reason.map(|r| r.name().to_string()),
        }
    }
}

/// How a serving process tells its starter that the mount is ready (or why it is not).
#[derive(Debug)]
pub enum Readiness {
    /// Nobody is waiting (a service manager started us; the log says it).
    Quiet,
    /// `tierfs mount --foreground`: tell the user on stdout.
    Print { json: bool },
    /// `tierfs-daemon --ready-fd N`: one JSON line on the pipe, then close it.
    Pipe(Option<File>),
    /// The node daemon: the ready mount's control handler (for `status` and `/metrics`), or
    /// why it failed to start, goes to the node.
    Node(Option<oneshot::Sender<Result<NodeReady, Reported>>>),
}

/// A mount the node daemon serves, once it is ready.
///
/// Its handler is held weakly: the node (its registry, a scrape) never keeps a mount's
/// session alive, so the session ends, and its workers are joined, on the mount's own thread.
/// Dropped under the registry's lock instead, a session whose store is cut off held every
/// scrape until its uploads timed out.
#[derive(Clone)]
pub struct NodeReady {
    pub info: ReadyInfo,
    pub handler: Weak<dyn ControlHandler>,
}

impl std::fmt::Debug for NodeReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeReady").field("info", &self.info).finish_non_exhaustive()
    }
}

impl Readiness {
    /// Takes ownership of the inherited pipe `fd`.
    pub fn from_fd(fd: i32) -> Result<Readiness> {
        // SAFETY: F_GETFD only inspects the descriptor table; it fails with EBADF when `fd`
        // is not open, which we check before taking ownership.
        if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            bail_with!(ErrorKind::InvalidInput, "--ready-fd {fd} is not an open file descriptor");
        }
        // SAFETY: `fd` is open (checked above) and was handed to this process for its sole
        // use by `tierfs mount`; nothing else in the process owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        // Keep it out of any process we might start (fusermount3).
        rustix::io::fcntl_setfd(&file, FdFlags::CLOEXEC).context("--ready-fd")?;
        Ok(Readiness::Pipe(Some(file)))
    }

    /// Reports a ready mount, served by `handler`.
    pub fn ready(&mut self, info: &ReadyInfo, handler: &Arc<dyn ControlHandler>) {
        match self {
            Readiness::Quiet => {}
            Readiness::Print { json: true } => match serde_json::to_string(info) {
                Ok(line) => println!("{line}"),
                Err(err) => warn!("encoding readiness: {err}"),
            },
            Readiness::Print { json: false } => {
                println!(
                    "tierfs: mounted {} (data dir {}, pid {}); Ctrl-C or `tierfs umount {}` \
                     unmounts",
                    info.mountpoint.display(),
                    info.data_dir.display(),
                    info.pid,
                    info.mountpoint.display()
                );
            }
            Readiness::Pipe(file) => send(file, &ReadyMessage::Ready(info.clone())),
            Readiness::Node(tx) => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Ok(NodeReady { info: info.clone(), handler: Arc::downgrade(handler) }));
                }
            }
        }
    }

    /// Reports a failure to start; a no-op once readiness was reported.
    pub fn failed(&mut self, err: &anyhow::Error) {
        match self {
            Readiness::Pipe(file) => send(file, &ReadyMessage::failed(Reported::of(err))),
            Readiness::Node(tx) => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Err(Reported::of(err)));
                }
            }
            Readiness::Quiet | Readiness::Print { .. } => {}
        }
    }
}

fn send(file: &mut Option<File>, message: &ReadyMessage) {
    // Taking the file closes it after the write: the parent reads to end of file.
    let Some(mut file) = file.take() else {
        return;
    };
    let result = serde_json::to_string(message).map_err(io::Error::other).and_then(|mut line| {
        line.push('\n');
        file.write_all(line.as_bytes())
    });
    if let Err(err) = result {
        // The parent may have given up waiting; the log still has the story.
        warn!("reporting readiness to `tierfs mount`: {err}");
    }
}

/// The name a background daemon runs under: what `ps`, `pgrep -f tierfs-daemon` and a
/// service's scripts look for, whichever executable serves.
pub const DAEMON_NAME: &str = "tierfs-daemon";

/// The executable that serves a background mount, and the name (`argv[0]`) it runs under:
/// `$TIERFS_DAEMON` if set, else this very executable (both binaries serve
/// [`SERVE_COMMAND`], `frontend::serve_main`) named [`DAEMON_NAME`] as if it lay beside it. After a
/// runtime reset the page cache is empty: the running `tierfs` is read from disk already,
/// and starting it again costs none of the cold start a second binary of the same size
/// would (some 0.3 s for a debug build).
pub fn daemon_executable() -> Result<(PathBuf, PathBuf)> {
    if let Some(explicit) = std::env::var_os("TIERFS_DAEMON") {
        return Ok((PathBuf::from(&explicit), PathBuf::from(explicit)));
    }
    let current = std::env::current_exe().context("finding the tierfs executable")?;
    let name = current.with_file_name(DAEMON_NAME);
    Ok((current, name))
}

/// The first argument of `tierfs-daemon` that makes it serve the [`MountConfig`] it reads as
/// one JSON line on its stdin (how `tierfs mount` starts it).
pub const SERVE_COMMAND: &str = "serve";

/// Reads the configuration [`SERVE_COMMAND`] serves from `input` (at most 1 MiB) and checks it,
/// also against the `mountpoint` its command line shows, when it shows one.
pub fn read_serve_config(input: impl Read, mountpoint: Option<&Path>) -> Result<MountConfig> {
    let config = read_config(input)?;
    if let Some(shown) = mountpoint.filter(|m| *m != config.mountpoint) {
        bail_with!(
            ErrorKind::InvalidInput,
            "the command line names the mountpoint {} but the configuration on stdin is for {}",
            shown.display(),
            config.mountpoint.display()
        );
    }
    Ok(config)
}

/// Reads the configuration [`SERVE_COMMAND`] serves from `input` (at most 1 MiB) and checks it.
pub fn read_config(input: impl Read) -> Result<MountConfig> {
    let mut line = String::new();
    std::io::BufReader::new(input.take(1 << 20)).read_line(&mut line).context("reading the mount configuration")?;
    let config: MountConfig = serde_json::from_str(&line).context("the mount configuration on stdin")?;
    config.check()?;
    Ok(config)
}

/// Starts `tierfs-daemon` for `config` in the background and waits up to `timeout` for it to
/// report the mount ready.
pub fn spawn_daemon(config: &MountConfig, timeout: Duration) -> Result<ReadyInfo> {
    let (daemon, name) = daemon_executable()?;
    paths::ensure_private_dir(&config.data_dir)?;
    let log_path = paths::mount_log_path(config)?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening daemon log {}", log_path.display()))?;
    let log_start =
        log.metadata().map(|m| m.len()).with_context(|| format!("reading daemon log {}", log_path.display()))?;
    let log_err = log.try_clone().context("duplicating the daemon log handle")?;

    let (read_end, write_end) = ready_pipe()?;
    let write_fd = write_end.as_raw_fd();

    let mut command = Command::new(&daemon);
    // The configuration is data: one JSON line on its stdin, never a command line to parse again.
    command
        .arg0(&name)
        .arg(SERVE_COMMAND)
        .arg("--ready-fd")
        .arg(write_fd.to_string())
        // Only for `ps` and whoever looks for the daemon of a mount: the configuration decides.
        .arg("--")
        .arg(&config.mountpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err));
    detach_in_child(&mut command, write_fd);
    let mut child = command.spawn().with_context(|| format!("starting {}", daemon.display()))?;
    // Only the daemon may hold the write end, or we would never see end of file.
    drop(write_end);
    let mut line = serde_json::to_vec(config).context("encoding the mount configuration")?;
    line.push(b'\n');
    let written = child.stdin.take().map(|mut stdin| stdin.write_all(&line));
    if let Some(Err(e)) = written {
        // The daemon failed before it read its configuration: its readiness says why.
        warn!("handing tierfs-daemon its configuration: {e}");
    }

    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("tierfs-ready".into())
        .spawn(move || {
            let mut text = String::new();
            let result = File::from(read_end).read_to_string(&mut text).map(|_| text);
            let _ = tx.send(result);
        })
        .context("starting the readiness reader")?;

    let answer = match rx.recv_timeout(timeout) {
        Ok(answer) => answer.context("reading the daemon's readiness pipe")?,
        Err(_) => {
            // Our own child, not reaped yet: its pid is still its own. Gone already is fine.
            let _ = child_pid(&child).map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::TERM));
            let _ = child.wait();
            bail_with!(
                Reason::Timeout,
                "tierfs-daemon did not report the mount ready within {} s and was stopped; \
                 see {}",
                timeout.as_secs_f64(),
                log_path.display()
            );
        }
    };

    ready_outcome(&answer, &mut child, log_path, log_start)
}

/// What the daemon's readiness `answer` says: the mount's details, or why it failed (its
/// own report, or its exit status and the last lines it logged after `log_start`).
fn ready_outcome(answer: &str, child: &mut Child, log_path: PathBuf, log_start: u64) -> Result<ReadyInfo> {
    match answer.lines().next().map(serde_json::from_str::<ReadyMessage>) {
        Some(Ok(ReadyMessage::Ready(mut info))) => {
            info.log = Some(log_path);
            Ok(info)
        }
        Some(Ok(ReadyMessage::Failed { error, kind, reason })) => {
            let _ = child.wait();
            Err(Reported::from_names(error, kind.as_deref(), reason.as_deref()).into())
        }
        Some(Err(err)) => {
            let _ = child.wait();
            Err(failure!(
                ErrorKind::Internal,
                "tierfs-daemon sent an unreadable readiness message {answer:?}: {err}; see {}",
                log_path.display()
            ))
        }
        None => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_else(|e| format!("unknown status ({e})"));
            let tail = log_tail(&log_path, log_start).unwrap_or_default();
            if tail.trim().is_empty() {
                Err(failure!(
                    ErrorKind::Internal,
                    "tierfs-daemon exited ({status}) before the mount was ready, without a \
                     message; see {}",
                    log_path.display()
                ))
            } else {
                Err(failure!(
                    ErrorKind::Internal,
                    "tierfs-daemon exited ({status}) before the mount was ready; last lines of \
                     {}:\n{tail}",
                    log_path.display()
                ))
            }
        }
    }
}

/// Makes the child `command` starts a session leader of its own (so the terminal's signals
/// and hang-up do not reach the daemon) that inherits `write_fd`, its readiness pipe.
fn detach_in_child(command: &mut Command, write_fd: i32) {
    // SAFETY: between fork and exec only async-signal-safe calls are made: setsid(2) and
    // fcntl(2), on a descriptor that is open in the child (inherited from us, so borrowing
    // its number is sound).
    unsafe {
        command.pre_exec(move || {
            rustix::process::setsid()?;
            rustix::io::fcntl_setfd(std::os::fd::BorrowedFd::borrow_raw(write_fd), FdFlags::empty())?;
            Ok(())
        });
    }
}

/// The pid of a child not reaped yet (`None` for one the kernel's type cannot hold).
fn child_pid(child: &std::process::Child) -> Option<rustix::process::Pid> {
    rustix::process::Pid::from_raw(i32::try_from(child.id()).ok()?)
}

/// A close-on-exec pipe: (read end, write end).
fn ready_pipe() -> Result<(OwnedFd, OwnedFd)> {
    let (read_end, write_end) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).context("creating the readiness pipe")?;
    // If our stdio was closed the pipe may sit on 0-2, which the child's stdio redirection
    // would overwrite: move such an end above 2.
    Ok((above_stdio(read_end)?, above_stdio(write_end)?))
}

fn above_stdio(fd: OwnedFd) -> Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    rustix::io::fcntl_dupfd_cloexec(&fd, 3).context("moving the readiness pipe")
}

/// The last lines the daemon wrote to its log since `from`.
fn log_tail(path: &Path, from: u64) -> io::Result<String> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(from))?;
    let lines: Vec<String> = BufReader::new(file).lines().collect::<io::Result<_>>()?;
    let skip = lines.len().saturating_sub(LOG_TAIL_LINES);
    Ok(lines[skip..].iter().map(|line| format!("  {line}")).collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn ready_message_wire_format() {
        let failed = ReadyMessage::Failed { error: "data dir locked".into(), kind: None, reason: None };
        assert_eq!(serde_json::to_string(&failed).unwrap(), r#"{"status":"failed","error":"data dir locked"}"#);
        let kinded = ReadyMessage::Failed { error: "held".into(), kind: Some("fenced".into()), reason: None };
        let line = serde_json::to_string(&kinded).unwrap();
        assert_eq!(line, r#"{"status":"failed","error":"held","kind":"fenced"}"#);
        assert_eq!(serde_json::from_str::<ReadyMessage>(&line).unwrap(), kinded);
        let reasoned = ReadyMessage::failed(Reported::new(Reason::PathInUse, "busy"));
        let line = serde_json::to_string(&reasoned).unwrap();
        assert_eq!(line, r#"{"status":"failed","error":"busy","kind":"conflict","reason":"path_in_use"}"#);
        assert_eq!(serde_json::from_str::<ReadyMessage>(&line).unwrap(), reasoned);
        let ready = ReadyMessage::Ready(ReadyInfo {
            pid: 1,
            mountpoint: "/m".into(),
            data_dir: "/d".into(),
            socket: "/s".into(),
            log: None,
        });
        let line = serde_json::to_string(&ready).unwrap();
        assert!(line.starts_with(r#"{"status":"ready","pid":1"#), "{line}");
        assert_eq!(serde_json::from_str::<ReadyMessage>(&line).unwrap(), ready);
    }

    #[test]
    fn pipe_readiness_writes_one_line_and_closes() {
        let (read_end, write_end) = ready_pipe().unwrap();
        let mut readiness = Readiness::Pipe(Some(File::from(write_end)));
        readiness.failed(&anyhow::anyhow!("inner").context("outer"));
        // A second report is a no-op: the pipe is already closed.
        readiness.failed(&anyhow::anyhow!("again"));
        let mut text = String::new();
        File::from(read_end).read_to_string(&mut text).unwrap();
        assert_eq!(text, "{\"status\":\"failed\",\"error\":\"outer: inner\"}\n");
    }

    #[test]
    fn log_tail_shows_only_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.log");
        fs::write(&path, "old\n").unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "new 1\nnew 2").unwrap();
        assert_eq!(log_tail(&path, 4).unwrap(), "  new 1\n  new 2");
    }
}
