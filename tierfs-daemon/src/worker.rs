//! Privilege separation of the node daemon. A mount or watch of the node's configuration
//! whose `owner` is not root is served by a worker process running as that owner (its uid,
//! primary gid and supplementary groups), never by root.
//!
//! The node daemon (the supervisor here) keeps what needs root, and takes no path from the
//! owner: every path it uses comes from root's configuration file. It reads the store file
//! and the secret that unlocks it, makes the data dir and gives it to the owner, checks the
//! mountpoint, binds the control socket, opens `/dev/fuse` and mounts it, and later unmounts
//! it and sets its readahead window. The worker gets all of that as data and descriptors: a
//! [`WorkerConfig`] (the resolved [`MountConfig`], the store's configuration and secret, the
//! descriptors' numbers) on a socket pair, over which it then reports readiness and asks
//! for its unmount. Everything a request can make a mount do outside the mount (history
//! export, a restore into the watched directory, the reads of a watched tree) therefore runs
//! with the owner's rights.
//!
//! Invariants:
//! - The worker makes itself undumpable and checks that nothing traces it before it reads
//!   its configuration, so the owner cannot read the store's secret from its memory or
//!   environment. Its environment is cleared but for [`KEPT_ENV`]: S3 credentials from the
//!   node's environment travel in the store's configuration instead.
//! - The supervisor answers exactly two things on the socket pair: the configuration, once,
//!   and an unmount of this mount's own mountpoint (a path from root's configuration) per
//!   request. A worker cannot name another path.
//! - The worker ends with the supervisor's thread (`PR_SET_PDEATHSIG`), and the supervisor
//!   sends it SIGTERM when the node stops; it flushes and asks for its unmount as a
//!   standalone mount does. A worker that died leaves a dead FUSE mount, which the
//!   supervisor detaches.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tierfs::store::StoreConfig;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::config::MountConfig;
use crate::control::{self, ControlHandler, Pong, Request, StatusReport};
use crate::launch::{Readiness, ReadyInfo, ReadyMessage};
use crate::logging::{Reason, Reported, bail_with, failure};
use crate::mounts::{self, UnmountError};
use crate::serve::{GivenSocket, SupervisorUnmount, Supplied};
use crate::stop::Stop;
use crate::store_link::SecretBytes;
use tierfs::ErrorKind;

/// The hidden subcommand of `tierfs-daemon` that runs a worker.
pub const WORKER_COMMAND: &str = "worker";

/// The descriptor a worker finds its socket pair on.
pub const CHANNEL_FD: RawFd = 3;

/// Environment variables a worker keeps; everything else is cleared.
pub const KEPT_ENV: &[&str] =
    &["PATH", "LANG", "LC_ALL", "RUST_LOG", "RUST_BACKTRACE", "AWS_REGION", "AWS_DEFAULT_REGION"];

/// Longest line either side reads on the socket pair (the configuration is the longest).
const MAX_LINE: u64 = 1 << 20;

/// Everything a worker is given.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    pub mount: MountConfig,
    /// The store's configuration and the secret that unlocks it.
    pub store: Option<StoreSecret>,
    /// The `/dev/fuse` descriptor, mounted at `mount.mountpoint` (none for a watch).
    pub fuse_fd: Option<RawFd>,
    /// The bound control socket's descriptor, and its path.
    pub socket_fd: RawFd,
    pub socket: PathBuf,
}

/// A store, as the supervisor read it with root's rights.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSecret {
    pub config: StoreConfig,
    pub secret: SecretBytes,
}

/// What a worker asks of the supervisor after its readiness line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnmountAsk {
    lazy: bool,
}

/// The user a worker runs as.
#[derive(Debug, Clone)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub name: String,
}

impl Owner {
    /// `uid` with its primary group and supplementary groups from the user database. A uid
    /// without an entry is refused: its groups would be a guess.
    pub fn lookup(uid: u32) -> Result<Owner> {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .with_context(|| format!("looking up owner uid {uid}"))?
            .ok_or_else(|| {
                failure!(
                    ErrorKind::InvalidInput,
                    "owner uid {uid} has no entry in the user database (add the user, or fix `owner`)"
                )
            })?;
        let name = std::ffi::CString::new(user.name.clone()).context("the owner's name")?;
        let groups = nix::unistd::getgrouplist(&name, user.gid)
            .with_context(|| format!("looking up the groups of owner {}", user.name))?;
        Ok(Owner {
            uid,
            gid: user.gid.as_raw(),
            groups: groups.into_iter().map(|g| g.as_raw()).collect(),
            name: user.name,
        })
    }
}

// ---- the supervisor's side -------------------------------------------------------------

/// Serves `config` through a worker running as `owner` until it ends (see the module
/// documentation); the result is the worker's, as [`crate::frontend::run_until`] would give.
pub fn supervise(
    rt: &Runtime,
    config: &MountConfig,
    owner: &Owner,
    readiness: &mut Readiness,
    stop: Stop,
) -> Result<()> {
    let _rt_context = rt.enter();
    crate::private::private_umask();
    give_data_dir(&config.data_dir, owner)?;
    let mountpoint = if config.watch {
        std::fs::canonicalize(&config.mountpoint)
            .with_context(|| format!("resolving the watched directory {}", config.mountpoint.display()))?
    } else {
        crate::serve::prepare_mountpoint(config)?
    };
    let mut config = config.clone();
    config.mountpoint = mountpoint.clone();
    let (listener, socket_file) = crate::serve::bind_control_socket(&config, &mountpoint)?;
    let store = config.store.as_deref().map(read_store).transpose()?;
    let fuse = if config.watch { None } else { Some(FuseMount::mount(&config, owner)?) };
    let outcome = (|| {
        let (ours, theirs) = StdUnixStream::pair().context("making the worker's socket pair")?;
        let worker_config = WorkerConfig {
            mount: config.clone(),
            store,
            fuse_fd: fuse.as_ref().map(|f| f.fd.as_raw_fd()),
            socket_fd: listener.as_raw_fd(),
            socket: socket_file.path.clone(),
        };
        let inherited: Vec<RawFd> = [Some(theirs.as_raw_fd()), worker_config.fuse_fd, Some(worker_config.socket_fd)]
            .into_iter()
            .flatten()
            .collect();
        let mut child = spawn(owner, theirs.as_fd(), &inherited)?;
        drop(theirs);
        let line = Zeroizing::new(serde_json::to_vec(&worker_config).context("encoding the worker's configuration")?);
        drop(worker_config);
        rt.block_on(converse(ours, &line, &mut child, &config, owner, readiness, stop))
    })();
    drop(listener);
    if let Some(fuse) = fuse {
        fuse.clear(&mountpoint);
    }
    drop(socket_file);
    outcome
}

/// Reads the store file and unlocks its secret with root's rights, and puts S3 credentials
/// the node takes from its environment into the configuration (the worker's environment
/// has none).
fn read_store(file: &Path) -> Result<StoreSecret> {
    let mut config = StoreConfig::load(file)?;
    let secret = crate::store_link::unlock_secret(&config)?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let creds = &mut config.credentials;
    if creds.access_key_id.is_none() {
        creds.access_key_id = env("AWS_ACCESS_KEY_ID");
        creds.session_token = creds.session_token.take().or_else(|| env("AWS_SESSION_TOKEN"));
    }
    if creds.secret_access_key.is_none() {
        creds.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    }
    Ok(StoreSecret { config, secret })
}

/// Makes `dir` the owner's: created 0700 if missing; an existing one of root's (made by a
/// version before workers, or by hand) is handed over, its contents first and the directory
/// itself last, so that the owner reaches nothing beneath it before all of it is theirs, and
/// nothing is followed (a symlink is changed itself, never what it points to). One of
/// another user is refused: that user could still be changing it while it is handed over.
fn give_data_dir(dir: &Path, owner: &Owner) -> Result<()> {
    use rustix::fs::{Gid, Uid};
    let (uid, gid) = (Uid::from_raw(owner.uid), Gid::from_raw(owner.gid));
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if !meta.is_dir() => {
            bail_with!(Reason::PathInUse, "the data dir {} is not a directory", dir.display())
        }
        Ok(meta) if meta.uid() == owner.uid => crate::private::tighten_data_dir(dir),
        Ok(meta) if meta.uid() != 0 => bail_with!(
            ErrorKind::InvalidInput,
            "the data dir {} belongs to uid {}, not to the mount's owner (uid {}); `chown -R {} {}` \
             if it is theirs, or give the mount another data_dir",
            dir.display(),
            meta.uid(),
            owner.uid,
            owner.uid,
            dir.display()
        ),
        Ok(_) => {
            crate::private::tighten_data_dir(dir)?;
            info!("handing the data dir {} over to its owner {} (uid {})", dir.display(), owner.name, owner.uid);
            for entry in walkdir::WalkDir::new(dir).follow_links(false).contents_first(true) {
                let entry = entry.with_context(|| format!("walking the data dir {}", dir.display()))?;
                rustix::fs::chownat(
                    rustix::fs::CWD,
                    entry.path(),
                    Some(uid),
                    Some(gid),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .with_context(|| format!("giving {} to uid {}", entry.path().display(), owner.uid))?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Directories made above it stay root's but open to passing through (0755), or the
            // owner could not reach their data dir.
            let missing: Vec<&Path> = dir.ancestors().skip(1).take_while(|a| !a.exists()).collect();
            for ancestor in missing.into_iter().rev() {
                std::fs::create_dir(ancestor).with_context(|| format!("creating {}", ancestor.display()))?;
                std::fs::set_permissions(ancestor, std::fs::Permissions::from_mode(0o755))
                    .with_context(|| format!("chmod 755 {}", ancestor.display()))?;
            }
            std::fs::create_dir(dir).with_context(|| format!("creating the data dir {}", dir.display()))?;
            rustix::fs::chown(dir, Some(uid), Some(gid))
                .with_context(|| format!("giving the data dir {} to uid {}", dir.display(), owner.uid))
        }
        Err(e) => Err(e).with_context(|| format!("reading the data dir {}", dir.display())),
    }
}

/// The FUSE mount the supervisor made for a worker.
struct FuseMount {
    fd: OwnedFd,
}

impl FuseMount {
    /// Opens `/dev/fuse` and mounts it at `config.mountpoint` for `owner`.
    fn mount(config: &MountConfig, owner: &Owner) -> Result<FuseMount> {
        use rustix::fs::{Mode, OFlags};
        use rustix::mount::MountFlags;
        mounts::check_fuse_device()?;
        let fd = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .context("opening /dev/fuse")?;
        let data = tierfs_mount::kernel_mount_data(fd.as_raw_fd(), owner.uid, owner.gid);
        let data = std::ffi::CString::new(data).context("the FUSE mount options")?;
        let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
        if config.read_only {
            flags |= MountFlags::RDONLY;
        }
        rustix::mount::mount("tierfs", &config.mountpoint, "fuse.tierfs", flags, data.as_c_str())
            .with_context(|| format!("mounting FUSE filesystem at {}", config.mountpoint.display()))?;
        Ok(FuseMount { fd })
    }

    /// After the worker: a mount it left (it died, or never took the descriptor) is
    /// detached, so the next start finds the mountpoint free.
    fn clear(self, mountpoint: &Path) {
        drop(self.fd);
        match mounts::find_mount(mountpoint) {
            Ok(Some(entry)) if entry.is_fuse() && entry.source == "tierfs" => {
                warn!("{}: the worker left its mount behind; detaching it", mountpoint.display());
                if let Err(e) = mounts::unmount(mountpoint, true) {
                    warn!("detaching {}: {e}", mountpoint.display());
                }
            }
            Ok(_) => {}
            Err(e) => warn!("reading the mount table: {e}"),
        }
    }
}

/// Starts `tierfs-daemon worker` as `owner`, with `channel` as its descriptor
/// [`CHANNEL_FD`] and the descriptors `inherited` kept open at their numbers.
fn spawn(owner: &Owner, channel: std::os::fd::BorrowedFd<'_>, inherited: &[RawFd]) -> Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("finding the tierfs-daemon executable")?;
    let mut command = tokio::process::Command::new(&exe);
    command.arg(WORKER_COMMAND).env_clear().stdin(std::process::Stdio::null()).kill_on_drop(true);
    for name in KEPT_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    let (uid, gid) = (rustix::fs::Uid::from_raw(owner.uid), rustix::fs::Gid::from_raw(owner.gid));
    let groups: Vec<rustix::fs::Gid> = owner.groups.iter().map(|g| rustix::fs::Gid::from_raw(*g)).collect();
    let channel = channel.as_raw_fd();
    let inherited = inherited.to_vec();
    // SAFETY: the closure runs in the forked child before exec and makes only system calls
    // (no allocation, no lock): descriptor flags, dup2 and the credential calls, which act
    // on the calling thread, the child's only one.
    unsafe {
        command.pre_exec(move || {
            use rustix::io::{FdFlags, fcntl_setfd};
            for fd in &inherited {
                fcntl_setfd(std::os::fd::BorrowedFd::borrow_raw(*fd), FdFlags::empty())?;
            }
            if channel != CHANNEL_FD {
                let mut target = std::mem::ManuallyDrop::new(OwnedFd::from_raw_fd(CHANNEL_FD));
                rustix::io::dup2(std::os::fd::BorrowedFd::borrow_raw(channel), &mut target)?;
            }
            rustix::thread::set_thread_groups(&groups)?;
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("starting the worker {} {WORKER_COMMAND} as uid {}", exe.display(), owner.uid))
}

/// The supervisor's side of the socket pair: sends `line` (the configuration), then relays
/// readiness and serves unmounts until the worker exits; SIGTERM goes to the worker when the
/// node stops.
async fn converse(
    ours: StdUnixStream,
    line: &[u8],
    child: &mut tokio::process::Child,
    config: &MountConfig,
    owner: &Owner,
    readiness: &mut Readiness,
    mut stop: Stop,
) -> Result<()> {
    ours.set_nonblocking(true).context("the worker's socket pair")?;
    let stream = tokio::net::UnixStream::from_std(ours).context("the worker's socket pair")?;
    let (reader, mut writer) = stream.into_split();
    writer.write_all(line).await.context("sending the worker its configuration")?;
    writer.write_all(b"\n").await.context("sending the worker its configuration")?;
    let (mut lines, _read_lines) = read_lines(reader);
    let mountpoint = config.mountpoint.clone();
    let mut handler: Option<Arc<dyn ControlHandler>> = None;
    let mut failure: Option<Reported> = None;
    let mut stopping = false;
    let mut channel_open = true;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the worker")?;
                drop(handler);
                if status.success() {
                    return Ok(());
                }
                // What the worker reported, with its kind, else that it ended.
                let failed = failure.unwrap_or_else(|| {
                    let ended = format!("the worker serving it as uid {} ended ({status}); its log lines are above", owner.uid);
                    Reported::new(ErrorKind::Internal, ended)
                });
                return Err(failed.into());
            }
            reason = stop.wait(), if !stopping => {
                stopping = true;
                info!("{reason}: stopping the worker of {}", mountpoint.display());
                if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
            next = lines.recv(), if channel_open => match next {
                Some(text) if handler.is_none() && failure.is_none() => {
                    match serde_json::from_str::<ReadyMessage>(&text) {
                        Ok(ReadyMessage::Ready(info)) => {
                            set_read_ahead(config);
                            let h: Arc<dyn ControlHandler> = Arc::new(WorkerHandler { info: info.clone(), watch: config.watch });
                            readiness.ready(&info, &h);
                            handler = Some(h);
                        }
                        Ok(ReadyMessage::Failed { error, kind, reason }) => {
                            failure = Some(Reported::from_names(error, kind.as_deref(), reason.as_deref()));
                        }
                        Err(e) => warn!("{}: the worker said {text:?}: {e}", mountpoint.display()),
                    }
                }
                Some(text) => {
                    let answer = unmount_asked(&text, config).await;
                    let mut reply = serde_json::to_vec(&answer).unwrap_or_default();
                    reply.push(b'\n');
                    if let Err(e) = writer.write_all(&reply).await {
                        warn!("{}: answering the worker: {e}", mountpoint.display());
                    }
                }
                None => channel_open = false,
            },
        }
    }
}

/// Reads the worker's lines (each at most `MAX_LINE` bytes, ending in a newline) on a task
/// of their own, as a partly read line must survive the other branches of
/// [`converse`]'s loop. The channel ends with the first short, overlong or failed read; the
/// task ends when the guard is dropped.
fn read_lines(reader: tokio::net::unix::OwnedReadHalf) -> (tokio::sync::mpsc::Receiver<String>, AbortOnDrop) {
    let (line_tx, lines) = tokio::sync::mpsc::channel::<String>(4);
    let read_lines = tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(reader);
        loop {
            let mut line = String::new();
            match (&mut reader).take(MAX_LINE).read_line(&mut line).await {
                Ok(n) if n > 0 && line.ends_with('\n') => {
                    if line_tx.send(line).await.is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    (lines, AbortOnDrop(read_lines))
}

/// Unmounts the worker's mount as its line `text` asks (a watch has none to unmount).
async fn unmount_asked(text: &str, config: &MountConfig) -> Result<(), UnmountError> {
    let mountpoint = &config.mountpoint;
    match serde_json::from_str::<UnmountAsk>(text) {
        Ok(ask) if !config.watch => {
            let path = mountpoint.clone();
            let done = tokio::task::spawn_blocking(move || mounts::unmount(&path, ask.lazy)).await;
            done.unwrap_or_else(|e| Err(UnmountError::Failed { path: mountpoint.clone(), message: e.to_string() }))
                .map(|_| ())
        }
        Ok(_) => Err(UnmountError::Failed { path: mountpoint.clone(), message: "a watch has no mount".into() }),
        Err(e) => Err(UnmountError::Failed { path: mountpoint.clone(), message: format!("bad request: {e}") }),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Widens a worker's mount's readahead window (root only), as `serve` does for its own.
fn set_read_ahead(config: &MountConfig) {
    if config.watch {
        return;
    }
    let (path, kib) = (config.mountpoint.clone(), config.mount_options().read_ahead_kib);
    // Its stat waits for the worker's answer: off the supervisor's async thread.
    std::thread::spawn(move || crate::serve::set_read_ahead(&path, kib));
}

/// The node's view of a worker's mount: its status, asked over its control socket as root.
struct WorkerHandler {
    info: ReadyInfo,
    watch: bool,
}

impl ControlHandler for WorkerHandler {
    fn pong(&self) -> Pong {
        Pong {
            pid: self.info.pid,
            version: crate::serve::VERSION.to_owned(),
            mountpoint: self.info.mountpoint.clone(),
            data_dir: self.info.data_dir.clone(),
            watch: self.watch,
            node: true,
        }
    }

    fn status(&self) -> StatusReport {
        self.try_status().unwrap_or_else(|| StatusReport {
            pid: self.info.pid,
            mountpoint: self.info.mountpoint.clone(),
            data_dir: self.info.data_dir.clone(),
            socket: self.info.socket.clone(),
            ..StatusReport::default()
        })
    }

    fn try_status(&self) -> Option<StatusReport> {
        match control::request(&self.info.socket, &Request::Status, Duration::from_secs(10)) {
            Ok(response) => response.status,
            Err(e) => {
                warn!("{}: the worker's status: {e}", self.info.mountpoint.display());
                None
            }
        }
    }
}

// ---- the worker's side -----------------------------------------------------------------

/// `tierfs-daemon worker`: serves the mount the supervisor describes on [`CHANNEL_FD`].
pub fn run_worker() -> Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .context("making the worker undumpable")?;
    refuse_tracer()?;
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .context("tying the worker to the node daemon")?;
    // SAFETY: the supervisor put the socket pair at CHANNEL_FD and nothing else owns it.
    let channel = unsafe { StdUnixStream::from_raw_fd(CHANNEL_FD) };
    let mut reader = BufReader::new(channel.try_clone().context("the worker's socket pair")?).take(MAX_LINE);
    let mut line = Zeroizing::new(Vec::new());
    reader.read_until(b'\n', &mut line).context("reading the worker's configuration")?;
    let given: WorkerConfig = serde_json::from_slice(&line).context("the worker's configuration")?;
    drop(line);
    let config = given.mount;
    let rt = crate::config::build_runtime()?;
    let ready_pipe = std::fs::File::from(OwnedFd::from(channel.try_clone().context("the worker's socket pair")?));
    let mut readiness = Readiness::Pipe(Some(ready_pipe));
    let result = (|| {
        let store = match given.store {
            Some(s) => Some(
                rt.block_on(tierfs::store::Store::open(&s.config, &s.secret.as_secret()))
                    .context("opening the store")?,
            ),
            None => None,
        };
        // SAFETY: the supervisor bound this socket and handed it over at this number.
        let listener = unsafe { StdUnixListener::from_raw_fd(given.socket_fd) };
        // SAFETY: the supervisor mounted this /dev/fuse descriptor and handed it over.
        let fuse = given.fuse_fd.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
        let supplied = Supplied {
            fuse,
            socket: GivenSocket { listener, path: given.socket },
            store,
            unmount: supervisor_unmount(channel, reader.into_inner()),
        };
        let stop = {
            let _rt_context = rt.enter();
            Stop::signals()?
        };
        crate::frontend::run_until(&rt, &config, &mut readiness, stop, Some(supplied))
    })();
    if let Err(err) = &result {
        readiness.failed(err);
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Refuses to go on under a tracer, which would see the secret the worker is about to read.
fn refuse_tracer() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:")).map(str::trim);
    match tracer {
        Some("0") => Ok(()),
        Some(pid) => {
            bail_with!(ErrorKind::InvalidInput, "process {pid} traces this worker; refusing to read the store's secret")
        }
        None => bail_with!(ErrorKind::Internal, "/proc/self/status has no TracerPid"),
    }
}

/// The worker's unmount: one request and its answer on the socket pair at a time.
fn supervisor_unmount(channel: StdUnixStream, reader: BufReader<StdUnixStream>) -> SupervisorUnmount {
    let pair = Mutex::new((channel, reader));
    Arc::new(move |lazy| {
        let mut pair = pair.lock().unwrap_or_else(PoisonError::into_inner);
        let (channel, reader) = &mut *pair;
        let failed = |message: String| UnmountError::Failed { path: PathBuf::from("(the worker's mount)"), message };
        let mut ask = serde_json::to_vec(&UnmountAsk { lazy }).map_err(|e| failed(e.to_string()))?;
        ask.push(b'\n');
        channel.write_all(&ask).map_err(|e| failed(format!("asking the node daemon: {e}")))?;
        let mut answer = String::new();
        reader.read_line(&mut answer).map_err(|e| failed(format!("reading the node daemon's answer: {e}")))?;
        let answer: Result<(), UnmountError> = serde_json::from_str(answer.trim())
            .map_err(|e| failed(format!("the node daemon answered {answer:?}: {e}")))?;
        answer.map(|()| mounts::UnmountMethod::NodeDaemon)
    })
}
