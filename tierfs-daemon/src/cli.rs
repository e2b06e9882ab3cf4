//! Command-line definitions of the `tierfs` and `tierfs-daemon` binaries (clap derive),
//! and the value parsers they share (sizes like `10G`, durations in seconds).
//!
//! Invariants:
//! - Both binaries take the *same* mount options ([`MountArgs`]): `tierfs mount` resolves
//!   them once ([`MountArgs::resolve`]: default data dir, `allow_other` default, absolute
//!   paths) and hands the resolved [`MountConfig`] to the background daemon (or the node
//!   daemon) as data, one JSON line (`launch::SERVE_COMMAND`), so parent and daemon can
//!   never disagree about a default. A unit test round-trips config → JSON → config.
//! - Which store a mount uses is decided in one place ([`MountArgs::store_choice`]):
//!   `--store FILE`; else, with neither `--data-dir` nor `--no-store` (or with `--snapshot`,
//!   which needs a store), the embedded default store of the data home; else none (hot tier
//!   only). The daemon always gets the outcome explicitly (the store file, or none).
//! - Usage errors exit with status 2 (clap's convention), every other failure with 1.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::config::{MountConfig, StreamLimit};
use crate::logging::bail_with;
use crate::mounts;
use crate::paths;
use tierfs::ErrorKind;
use tierfs::session::{FsyncMode, StoreLocality};

/// Exit status documentation shown at the end of `--help`.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  success
  1  failure (the message on stderr says what failed; with --json also a JSON object on stdout)
  2  usage error (unknown option, bad value)

With --json a failure prints {\"ok\": false, \"error\": MESSAGE, \"kind\": KIND} on stdout (a usage
error too), and \"reason\": REASON where a script needs more than the kind:
  kind    not_found, conflict, fenced (another writer holds or took the workspace),
          unavailable (try again later), no_space, invalid_input, corrupt, internal
  reason  wrong_key (invalid_input: the passphrase or key file does not unlock the store,
          or none was given), path_in_use (conflict: the mount point or data dir is taken
          or busy), mountpoint_taken (conflict: the mount point is not empty or is another
          filesystem's mount point), fuse_unavailable (unavailable: FUSE does not work here; `tierfs watch`
          needs none), timeout (unavailable: a daemon did not answer in time),
          passthrough_stack_full (conflict: `layer add` on a mount whose data dir is on
          overlayfs; remount it with --no-passthrough)

Environment:
  RUST_LOG            log filter, e.g. `info`, `tierfs=debug` (default: warn; info for a mount)
  TIERFS_DATA_DIR     default for --data-dir
  TIERFS_RUNTIME_DIR  default for --runtime-dir
  TIERFS_NODE_RUNTIME_DIR  where a node daemon's control sockets are (default /run/tierfs):
                      status, sync and umount look there too
  TIERFS_STORE        default for --store (mount, snapshots, restore, diff, forget, gc)
  TIERFS_PASSPHRASE   the store passphrase (otherwise a key file from the store file, or a prompt)
  TIERFS_NEW_PASSPHRASE  the new passphrase for `key add` / `key passwd`
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN  S3 credentials not in the store file";

/// The `tierfs` command-line tool.
#[derive(Debug, Parser)]
#[command(
    name = "tierfs",
    version,
    about = "Mount and manage tierfs workspaces: a local-disk-speed POSIX filesystem whose \
             contents survive runtime resets",
    after_help = EXIT_STATUS_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Print machine-readable JSON on stdout instead of human-readable text.
    #[arg(long, global = true)]
    pub json: bool,

    /// Directory of the per-mount control sockets
    /// [default: $XDG_RUNTIME_DIR/tierfs, else ~/.local/share/tierfs/run; the node daemon's,
    /// $TIERFS_NODE_RUNTIME_DIR or /run/tierfs, is searched too].
    #[arg(long, global = true, env = "TIERFS_RUNTIME_DIR", value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `tierfs`.
#[derive(Debug, Subcommand)]
// Parsed once per process: the size of the mount variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Mount a workspace at MOUNTPOINT (created if missing).
    ///
    /// By default a background daemon (this executable, run as `tierfs-daemon`) serves the
    /// mount and this command returns once the mount is ready; the daemon logs to
    /// <DATA_DIR>/daemon.log. Running it again for a mount that is already up is a no-op.
    ///
    /// Without --store and --data-dir: the embedded local store, an encrypted store in the
    /// data home ($XDG_DATA_HOME/tierfs, else ~/.local/share/tierfs): store.toml, objects in
    /// objects/, unlocked by the key file store.key; created by the first such mount, with no
    /// questions asked. `tierfs sync`, snapshots and restore work on it; it lives on the same
    /// disk, so it survives a lost data dir, not a lost disk (for that: `tierfs init` with S3
    /// backends, then --store). With --data-dir alone, or --no-store: hot tier only (data
    /// stays in the data dir, nothing else is written).
    #[command(after_help = EXIT_STATUS_HELP)]
    Mount(MountCommand),

    /// Flush everything and unmount the workspace at MOUNTPOINT.
    ///
    /// Asks the serving process over its control socket to write everything it holds to
    /// disk and unmount, and waits until it has exited. When no tierfs process answers
    /// (it died), falls back to `fusermount3 -u` (umount2 as root) to clear the stale mount.
    #[command(visible_alias = "unmount", after_help = EXIT_STATUS_HELP)]
    Umount(UmountCommand),

    /// Sync a plain directory (DIR) where FUSE is unavailable.
    ///
    /// Watch mode: DIR keeps the bytes, and every change to it is synced to the workspace
    /// in the store (inotify events, plus a full pass every few minutes and whenever events
    /// cannot be trusted). An empty DIR on a fresh node first gets the workspace restored into
    /// it; a DIR that is not empty and does not hold the workspace is refused. The workspace
    /// is the one a `tierfs mount` of the same store and --workspace shows. `tierfs status
    /// DIR`, `tierfs sync DIR` (a barrier: every change made before it is in the snapshot)
    /// and `tierfs unwatch DIR` work on it. Needs a store (the embedded one by default);
    /// FUSE-only options (--allow-other, --writeback-cache, TTLs, threads) are ignored.
    #[command(
        after_help = EXIT_STATUS_HELP,
        mut_arg("mountpoint", |a| a.value_name("DIR").help("The directory to watch; it must exist (a typo is not a new workspace)"))
    )]
    Watch(MountCommand),

    /// Sync what changed, flush everything and stop watching DIR.
    #[command(after_help = EXIT_STATUS_HELP)]
    Unwatch(UmountCommand),

    /// Show the state of one mount, or of every mount of this user.
    ///
    /// Reports data dir, mountpoint, pid, uptime, inode count, open files, data bytes and
    /// cache size, as queried from each serving process's control socket.
    #[command(after_help = EXIT_STATUS_HELP)]
    Status(StatusCommand),

    /// Create a store: encrypted, redundant object storage for workspaces.
    ///
    /// Writes the store's config and its first wrapped key to every backend and the store
    /// file (TOML) to --store. The data key is random; it is wrapped by a passphrase
    /// (TIERFS_PASSPHRASE, or a prompt) or by a key file (--key-file, created if missing).
    /// S3 credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
    #[command(after_help = EXIT_STATUS_HELP)]
    Init(InitCommand),

    /// Manage the passphrases and key files that unlock a store.
    #[command(after_help = EXIT_STATUS_HELP)]
    Key(KeyCommand),

    /// Verify every copy of every object of a store (and repair with --repair).
    ///
    /// Reads every object and pack from every backend, checks its authentication tag and
    /// content hash, and with --repair rewrites bad or missing copies from good ones. Exits 1
    /// if anything is left damaged.
    #[command(after_help = EXIT_STATUS_HELP)]
    Scrub(ScrubCommand),

    /// Pull files into the local cache (fetching evicted data from the store), with progress.
    #[command(after_help = EXIT_STATUS_HELP)]
    Warmup(WarmupCommand),

    /// Keep what is installed into a system directory (/usr/local, /opt/...) in the workspace.
    ///
    /// `tierfs layer add /usr/local` mounts an overlay on /usr/local whose upper layer is in a
    /// tierfs mount (MOUNTPOINT/.tierfs/layers/usr%2Flocal/): what the image ships stays below,
    /// and everything written there from then on (apt, make install, a system-wide pip) goes
    /// into the workspace. The same command on a fresh runtime after a reset, once the
    /// workspace is mounted again, brings it all back. Root only; only a workspace root mounts
    /// for itself (never a node mount of another user's). Setuid bits and device files do not
    /// take effect through a layer (nosuid, nodev): its files come from the store. Remove a
    /// layer before unmounting the workspace that holds it.
    #[command(after_help = EXIT_STATUS_HELP)]
    Layer(LayerCommand),

    /// Make everything written so far durable in the store and commit a named snapshot.
    ///
    /// A barrier: every file written before it (closed or not) is uploaded, then the whole
    /// metadata is committed as a snapshot. Prints the snapshot id as the last line (with
    /// --json, a JSON object with `snapshot`). Fails, and says why, if anything could not be
    /// stored. Needs a mount with --store.
    #[command(after_help = EXIT_STATUS_HELP)]
    Sync(SyncCommand),

    /// Put everything written so far in the store within a deadline, staying mounted: the
    /// hook for a preemption notice (a spot instance about to be reclaimed).
    ///
    /// Every mount and watch given (default: all that answer, this user's and the node
    /// daemon's) uploads its dirty data and commits its metadata to the journal, in parallel,
    /// until --deadline. No snapshot is taken (that is `tierfs sync`), nothing is unmounted.
    /// Prints, per mount, whether it is all in the store and what is left only on this node;
    /// exits 1 if anything is. E.g. from a spot-notice watcher: `tierfs flush --deadline 25`.
    #[command(after_help = EXIT_STATUS_HELP)]
    Flush(FlushCommand),

    /// List the snapshots of a workspace (oldest first); with --timeline, every point
    /// `tierfs restore --at` can go back to.
    #[command(after_help = EXIT_STATUS_HELP)]
    Snapshots(SnapshotsCommand),

    /// Remove snapshots that a retention policy does not keep (the data they alone held is
    /// freed by `tierfs gc`). The latest state of the workspace is never affected.
    #[command(after_help = EXIT_STATUS_HELP)]
    Forget(ForgetCommand),

    /// Delete what nothing references any more: packs, index segments, old checkpoints,
    /// journal segments and metadata parts of every workspace of the store. What `tierfs
    /// restore --at` needs inside --keep-within (7 days by default) stays.
    ///
    /// Needs every workspace of the store unmounted (it takes each one's lease, as a mount
    /// would): no upload may be in flight while packs are deleted.
    #[command(after_help = EXIT_STATUS_HELP)]
    Gc(GcCommand),

    /// List the paths that differ between two snapshots, or (with -p or PATHs) show the
    /// history's unified diff of code and configs.
    ///
    /// Without -p: compares metadata only (contents by their block ids), with nothing but
    /// metadata downloaded; lines are `+ PATH` (added), `- PATH` (removed), `M PATH (what)`.
    /// With -p (or `-- PATH...`): a unified diff of the files the history records, from A to
    /// B, or to the workspace as it is now when B is left out; A and B are history commits,
    /// snapshot ids, or expressions such as HEAD~1. Needs the workspace mounted or watched.
    #[command(after_help = EXIT_STATUS_HELP)]
    Diff(DiffCommand),

    /// The history of code and configs: one commit per snapshot that changed them, newest
    /// first (only those that changed PATH, with a PATH).
    ///
    /// At every `tierfs sync` the workspace's code and config files (`*.py`, `*.ipynb`
    /// without outputs, `*.yaml`, `*.json`, `*.toml`, `*.md`, `*.txt`, `Dockerfile`, ...; see
    /// `.tierfshistory.toml` in docs/SEMANTICS.md) are committed to a git history kept,
    /// encrypted, in the store: it comes back with the workspace after a reset. PATH may be
    /// a path into a mount or watched directory, or relative to the workspace root.
    #[command(after_help = EXIT_STATUS_HELP)]
    Log(LogCommand),

    /// Print a file as the history holds it: `tierfs show REV:PATH`.
    ///
    /// REV is a history commit (or prefix), a snapshot id, or an expression such as HEAD~1.
    /// A file over the history's size limit prints as its pointer (size and content hash).
    #[command(after_help = EXIT_STATUS_HELP)]
    Show(ShowCommand),

    /// Put files back as the history holds them at REV: `tierfs checkout REV -- PATH...`.
    ///
    /// Writes each file into the live workspace, through its mount or watched directory
    /// (replaced whole, by rename), so the next `tierfs sync` records it.
    #[command(after_help = EXIT_STATUS_HELP)]
    Checkout(CheckoutCommand),

    /// Publish the history: push it to a git remote, or export it as a plain git repository.
    #[command(after_help = EXIT_STATUS_HELP)]
    History(HistoryCommand),

    /// Write a plain copy of a workspace (latest state, --snapshot ID, or --at TIME) into DIR.
    ///
    /// Needs no mount and takes no lease (a live writer may go on). File data is fetched from
    /// the store, with progress; sparse regions stay holes; modes, times, xattrs, symlinks
    /// and hard links are kept (ownership too when run as root). DIR must be empty or new.
    #[command(after_help = EXIT_STATUS_HELP)]
    Restore(RestoreCommand),

    /// The files deleted or replaced in a live mount or watched directory, and putting them back.
    ///
    /// Nothing is moved aside when a file goes: the store's journal records every change with
    /// its time, and the retention window (7 days by default, `tierfs gc --keep-within`) keeps
    /// it, so a regular file that was unlinked, or replaced by a rename over it, can be put
    /// back as it was just before. `trash restore` writes it through the mount or watched
    /// directory (as an ordinary new file, with your rights), at its path, or beside it as
    /// NAME.restored-TIME when the path is taken: nothing is ever overwritten. Needs the
    /// mount or watch running, with a store.
    #[command(after_help = EXIT_STATUS_HELP)]
    Trash(TrashCommand),
}

/// `tierfs trash`.
#[derive(Debug, Args)]
pub struct TrashCommand {
    #[command(subcommand)]
    pub action: TrashAction,
}

/// `tierfs trash list|restore`.
#[derive(Debug, Subcommand)]
pub enum TrashAction {
    /// List the files deleted or replaced within the retention window, oldest first: path,
    /// what happened (deleted / replaced), when, and size.
    List {
        /// A mount or watched directory, or a directory inside one (lists what was under it)
        /// [default: the one the current directory is in, else the only one running].
        #[arg(value_name = "MOUNTPOINT or DIR")]
        dir: Option<PathBuf>,
    },
    /// Put a deleted or replaced file back: the newest version the trash holds, or the one
    /// PATH had at TIME.
    Restore {
        /// The file, as a path into the mount or watched directory (it may not lead out of
        /// it: no `..` above its root, no symlink on the way).
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// The version PATH had at TIME: RFC 3339 (`2026-12-06T14:03:27Z`) or relative
        /// (`10m ago`) [default: just before it was last deleted or replaced].
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
    },
}

/// `tierfs diff`.
#[derive(Debug, Args)]
pub struct DiffCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    pub store: Option<PathBuf>,
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub workspace: String,
    /// The older state: a snapshot id, or `latest` (with -p: any history revision).
    #[arg(value_name = "A")]
    pub a: String,
    /// The newer state: a snapshot id, or `latest` (with -p: any history revision, or left
    /// out for the workspace as it is now).
    #[arg(value_name = "B")]
    pub b: Option<String>,
    /// Show the history's unified diff of code and configs instead of the list of paths.
    #[arg(short = 'p', long)]
    pub patch: bool,
    /// The mount or watched directory (with -p) [default: the one PATH is in, or the only one].
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
    /// Only these files (implies -p).
    #[arg(last = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// `tierfs log`.
#[derive(Debug, Args)]
pub struct LogCommand {
    /// Only commits that changed this file.
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Show at most N commits.
    #[arg(short = 'n', long = "max-count", value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// The mount or watched directory [default: the one PATH is in, or the only one].
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
}

/// `tierfs show`.
#[derive(Debug, Args)]
pub struct ShowCommand {
    /// `REV:PATH`, e.g. `HEAD~1:train.py` or `20261202T101500Z-1a-0c3f:conf/model.yaml`.
    #[arg(value_name = "REV:PATH")]
    pub spec: String,
    /// The mount or watched directory [default: the one the current directory is in, or the only one].
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
}

/// `tierfs checkout`.
#[derive(Debug, Args)]
pub struct CheckoutCommand {
    /// The revision to take the files from.
    #[arg(value_name = "REV")]
    pub rev: String,
    /// The files (after `--`).
    #[arg(last = true, required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The mount or watched directory [default: the one the PATHs are in, or the only one].
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,
}

/// `tierfs history`.
#[derive(Debug, Args)]
pub struct HistoryCommand {
    #[command(subcommand)]
    pub action: HistoryAction,
}

/// What `tierfs history` does.
#[derive(Debug, Subcommand)]
pub enum HistoryAction {
    /// Push the history's `main` branch to a git remote (a path or file:// URL; https needs
    /// a build with the `history-https` feature).
    Push {
        /// The remote [default: `remote` in the workspace's .tierfshistory.toml].
        #[arg(value_name = "REMOTE")]
        remote: Option<String>,
        /// The mount or watched directory [default: the only one].
        #[arg(long, value_name = "DIR")]
        mount: Option<PathBuf>,
    },
    /// Write the history into DIR (new or empty) as a plain git repository with a work tree.
    Export {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The mount or watched directory [default: the only one].
        #[arg(long, value_name = "DIR")]
        mount: Option<PathBuf>,
    },
}

/// `tierfs forget`.
#[derive(Debug, Args)]
pub struct ForgetCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    pub store: Option<PathBuf>,
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub workspace: String,
    /// Keep the N newest snapshots.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_last: usize,
    /// Keep the newest snapshot of each of the last N days that have one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_daily: usize,
    /// Keep the newest snapshot of each of the last N weeks that have one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_weekly: usize,
    /// Keep the newest snapshot of each of the last N months that have one.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_monthly: usize,
    /// Keep every snapshot made within DURATION of now (`7d`, `12h`). The journal that
    /// `tierfs restore --at` reads is kept by its own window (`tierfs gc --keep-within`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub keep_within: Option<Duration>,
    /// Only say what would be removed.
    #[arg(long)]
    pub dry_run: bool,
}

/// `tierfs gc`.
#[derive(Debug, Args)]
pub struct GcCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    pub store: Option<PathBuf>,
    /// Keep what `tierfs restore --at` needs to go back this far (the journal, its checkpoints
    /// and the data they reference): `7d`, `12h`, `0` for nothing but the latest state and the
    /// snapshots.
    #[arg(long, value_name = "DURATION", default_value = "7d", value_parser = parse_duration)]
    pub keep_within: Duration,
    /// Only say what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
}

/// `tierfs restore`.
#[derive(Debug, Args)]
pub struct RestoreCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    pub store: Option<PathBuf>,
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub workspace: String,
    /// A snapshot id from `tierfs snapshots` [default: the latest state].
    #[arg(long, value_name = "ID")]
    pub snapshot: Option<String>,
    /// The workspace as it was at TIME: RFC 3339 (`2026-12-06T14:03:27Z`, with an offset, or
    /// `2026-12-06 14:03:27` in UTC) or relative (`10m ago`, `1h 30m ago`). Files whose data
    /// at TIME had not reached the store are restored as the store had them and listed.
    /// `tierfs snapshots --timeline` shows how far back the store goes.
    #[arg(long, value_name = "TIME", conflicts_with = "snapshot")]
    pub at: Option<String>,
    /// Where to write the copy (created if missing; must be empty).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// As root: also restore owners, setuid/setgid bits, device nodes and security.* and
    /// trusted.* xattrs (file capabilities) as the store has them, like tar's --same-owner.
    /// Without it they are left out, and the summary counts them.
    #[arg(long)]
    pub same_owner: bool,
}

/// `tierfs sync`.
#[derive(Debug, Args)]
pub struct SyncCommand {
    /// A message stored with the snapshot.
    #[arg(short = 'm', long, value_name = "MSG")]
    pub message: Option<String>,

    /// How long to wait for the upload and the commit.
    #[arg(long, value_name = "SECS", default_value = "3600", value_parser = parse_secs)]
    pub timeout: Duration,

    /// The mounted directory [default: the only mount of this user].
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
}

/// `tierfs flush`.
#[derive(Debug, Args)]
pub struct FlushCommand {
    /// How long the flush may take in all (AWS gives a spot instance 2 minutes, GCP 30 s).
    #[arg(long, value_name = "SECS", default_value = "25", value_parser = parse_secs)]
    pub deadline: Duration,

    /// The mounted or watched directories [default: every one that answers].
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoints: Vec<PathBuf>,
}

/// `tierfs snapshots`.
#[derive(Debug, Args)]
pub struct SnapshotsCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    pub store: Option<PathBuf>,
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub workspace: String,
    /// Show every point `tierfs restore --at` can go back to: syncs, checkpoints and the span
    /// of time the journal covers.
    #[arg(long)]
    pub timeline: bool,
}

/// `tierfs init`.
#[derive(Debug, Args)]
pub struct InitCommand {
    /// Where to write the store file (must not exist).
    #[arg(long, value_name = "FILE")]
    pub store: PathBuf,

    /// A backend URL; repeat for several: `s3://BUCKET/PREFIX?endpoint=URL&region=R`
    /// (endpoint and region optional) or `file:///PATH`. Every S3 upload carries a CRC64NVME
    /// checksum of its body that the server verifies; add `&payload=signed` for a server that
    /// refuses that header or unsigned payloads (SigV4 then hashes every body with SHA-256).
    #[arg(long = "backend", value_name = "URL", required = true)]
    pub backends: Vec<String>,

    /// Copies of every object [default: 3 with three or more backends, else one per backend].
    #[arg(long, value_name = "N", conflicts_with = "erasure")]
    pub replicas: Option<u8>,

    /// Reed-Solomon code packs into K data + M parity shards on K+M backends (any K rebuild).
    #[arg(long, value_name = "K+M")]
    pub erasure: Option<String>,

    /// Unlock the store with this key file instead of a passphrase (created if missing).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Target size of pack objects (e.g. 16M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub pack_size: Option<u64>,

    /// How a workspace is kept to one writer: `conditional` (journal segments are created
    /// with If-None-Match; the servers must honour it, which every mount checks) or `lease`
    /// (for servers that ignore conditional writes, such as Garage 2.x: the writer lease
    /// alone, with clock margins; a takeover waits out the holder's lease).
    #[arg(long, value_name = "HOW", default_value = "conditional", value_parser = parse_fencing)]
    pub fencing: tierfs::store::Fencing,
}

/// `tierfs key`.
#[derive(Debug, Args)]
pub struct KeyCommand {
    #[command(subcommand)]
    pub action: KeyAction,
}

/// What `tierfs key` does. The current secret comes from the store file's key file, else
/// TIERFS_PASSPHRASE or a prompt; a new passphrase from TIERFS_NEW_PASSPHRASE or a prompt.
#[derive(Debug, Subcommand)]
pub enum KeyAction {
    /// List the wrapped keys of the store.
    List {
        /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
        #[arg(long, value_name = "FILE")]
        store: Option<PathBuf>,
    },
    /// Add a passphrase (or, with --key-file, a key file) that unlocks the store.
    Add {
        /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
        #[arg(long, value_name = "FILE")]
        store: Option<PathBuf>,
        /// Add this key file (created if missing) instead of a passphrase.
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
        /// A label shown by `tierfs key list`.
        #[arg(long, default_value = "added")]
        label: String,
    },
    /// Remove a wrapped key by id (the last key cannot be removed).
    Remove {
        /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
        #[arg(long, value_name = "FILE")]
        store: Option<PathBuf>,
        #[arg(value_name = "ID")]
        id: String,
    },
    /// Change the passphrase that unlocks the store (rewraps the data key only).
    Passwd {
        /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
        #[arg(long, value_name = "FILE")]
        store: Option<PathBuf>,
    },
}

/// `tierfs scrub`.
#[derive(Debug, Args)]
pub struct ScrubCommand {
    /// Store file [default: the embedded local store, ~/.local/share/tierfs/store.toml (under $XDG_DATA_HOME if set), if it exists].
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
    /// Rewrite bad or missing copies from good ones.
    #[arg(long)]
    pub repair: bool,
}

/// `tierfs warmup`.
#[derive(Debug, Args)]
pub struct WarmupCommand {
    /// Files or directories inside a tierfs mount.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,
}

/// `tierfs layer`.
#[derive(Debug, Args)]
pub struct LayerCommand {
    #[command(subcommand)]
    pub action: LayerAction,
}

/// What `tierfs layer` does.
#[derive(Debug, Subcommand)]
pub enum LayerAction {
    /// Mount the overlay on DIR; a no-op when its layer is already mounted.
    Add {
        /// The directory to keep, e.g. /usr/local.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The tierfs mount that keeps the layer [default: the only writable mount of this user].
        #[arg(long = "in", value_name = "MOUNTPOINT")]
        holder: Option<PathBuf>,
    },
    /// Unmount the overlay on DIR; its files stay in the workspace for the next `add`.
    Remove {
        /// The directory the layer covers.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// List the layers mounted on this machine.
    List,
}

/// `tierfs mount`.
#[derive(Debug, Args)]
pub struct MountCommand {
    /// Serve the mount in this process until it is unmounted (Ctrl-C, SIGTERM or
    /// `tierfs umount`) instead of starting a background daemon.
    #[arg(short = 'f', long)]
    pub foreground: bool,

    /// How long to wait for the background daemon to report the mount ready.
    #[arg(long, value_name = "SECS", default_value = "120", value_parser = parse_secs)]
    pub timeout: Duration,

    /// Serve the mount in a background process of its own even when a node daemon
    /// (`tierfs-daemon node`) runs; without it, the node daemon serves it (when this user
    /// may hand mounts to it: root, or the user it runs as).
    #[arg(long, conflicts_with = "foreground")]
    pub standalone: bool,

    #[command(flatten)]
    pub mount: MountArgs,
}

/// `tierfs umount`.
#[derive(Debug, Args)]
pub struct UmountCommand {
    /// Detach the mount even if it is busy: it disappears at once, and the serving process
    /// flushes and exits when the last open file there is closed (or at its --flush-timeout).
    #[arg(short = 'l', long)]
    pub lazy: bool,

    /// How long to wait for the flush, the unmount and the serving process to exit.
    #[arg(long, value_name = "SECS", default_value = "300", value_parser = parse_secs)]
    pub timeout: Duration,

    /// The mounted directory.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

/// `tierfs status`.
#[derive(Debug, Args)]
pub struct StatusCommand {
    /// The mounted directory; without it, every mount of this user is listed.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
}

/// The `tierfs-daemon` serving process.
#[derive(Debug, Parser)]
#[command(
    name = "tierfs-daemon",
    version,
    about = "Serve one tierfs mount in the foreground until it is unmounted, or every mount of a node",
    long_about = "Serve one tierfs mount in the foreground until it is unmounted.\n\n\
                  `tierfs mount` starts this process in the background; run it directly \
                  under a service manager (systemd, a Kubernetes DaemonSet). SIGTERM or \
                  SIGINT flush everything (bounded by --flush-timeout) and unmount; so does \
                  `tierfs umount MOUNTPOINT`. Logs go to stderr (filter with RUST_LOG).\n\n\
                  `tierfs-daemon node` serves every mount of a node configuration file \
                  instead, with Prometheus metrics and systemd readiness (see \
                  `tierfs-daemon node --help`).",
    after_help = EXIT_STATUS_HELP
)]
pub struct DaemonCli {
    /// Directory of the per-mount control sockets
    /// [default: $XDG_RUNTIME_DIR/tierfs, else ~/.local/share/tierfs/run; the node daemon's,
    /// $TIERFS_NODE_RUNTIME_DIR or /run/tierfs, is searched too].
    #[arg(long, env = "TIERFS_RUNTIME_DIR", value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,

    /// Inherited file descriptor on which to report readiness (one JSON line), then close.
    /// Used by `tierfs mount`.
    #[arg(long, value_name = "FD", hide = true)]
    pub ready_fd: Option<i32>,

    #[command(flatten)]
    pub mount: MountArgs,
}

/// `tierfs-daemon serve`: serve the resolved configuration `tierfs mount` writes on stdin
/// (`launch::SERVE_COMMAND`). Not for people: they run `tierfs mount` or `tierfs-daemon
/// [OPTIONS] MOUNTPOINT`.
#[derive(Debug, Parser)]
#[command(name = "tierfs-daemon serve", hide = true)]
pub struct ServeCli {
    /// Inherited file descriptor on which to report readiness (one JSON line), then close.
    #[arg(long, value_name = "FD")]
    pub ready_fd: Option<i32>,

    /// The mountpoint, shown so that `ps` tells the daemons apart; it must be the
    /// configuration's.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: Option<PathBuf>,
}

/// `tierfs-daemon node`: every mount of the node configuration in one process. Told apart
/// from a mount by its first argument (`tierfs-daemon node …`; a mountpoint named `node` is
/// written `./node`), since a subcommand beside the mount's required MOUNTPOINT would make
/// clap ask for both.
#[derive(Debug, Parser)]
#[command(
    name = "tierfs-daemon node",
    version,
    about = "Serve every mount of the node configuration: one process per node",
    long_about = "Serve every mount (and watched directory) of the node configuration \
                      file, each with its own data dir and control socket, until SIGTERM or \
                      SIGINT; then flush and unmount them all, each within its own \
                      flush_timeout.\n\n\
                      The file has a [node] table (runtime_dir, default /run/tierfs; \
                      metrics_addr, default 127.0.0.1:9464, \"\" for none) and one [[mount]] \
                      table per mount: mountpoint, owner (a uid that may control the mount \
                      besides root) and any option of `tierfs mount --help` with _ for - \
                      (store = \"/etc/tierfs/store.toml\", cache_size = \"100G\", \
                      read_only = true). tierfs-daemon/deploy/config.toml is an example.\n\n\
                      Under systemd (Type=notify) READY=1 is sent once every mount is up or \
                      has failed, STOPPING=1 at the stop. http://METRICS_ADDR/metrics serves \
                      Prometheus metrics, /healthz a liveness answer. A mount that fails to \
                      start, or fails while served, is started again (after 1 s, doubling up \
                      to 60 s). While the node runs, `tierfs mount` and `tierfs watch` by root \
                      or the node's user hand their mounts to it (RUNTIME_DIR/node.sock) \
                      unless given --standalone. Exits 1 when a mount was down at the stop \
                      (failed, waiting to start again) or failed to flush.",
    after_help = EXIT_STATUS_HELP
)]
pub struct NodeCli {
    /// The node configuration file.
    #[arg(long, value_name = "FILE", env = "TIERFS_NODE_CONFIG", default_value = crate::config::NODE_CONFIG)]
    pub config: PathBuf,

    /// Check the configuration (every key of every mount) and exit: 0 when it is good.
    #[arg(long)]
    pub check: bool,
}

/// Options of one mount, shared by `tierfs mount` and `tierfs-daemon`, and the keys of a
/// `[[mount]]` table of the node's configuration (serde, written with `_` for `-`): one type,
/// so a key means in the file what its flag means on the command line, defaults included. A
/// key the file does not know is refused, and what clap's `conflicts_with` refuses on the
/// command line [`MountArgs::check_conflicts`] refuses in the file.
#[derive(Debug, Clone, PartialEq, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountArgs {
    /// Local data directory (hot tier and metadata). Only one mount may use a data
    /// directory at a time; given without --store, the mount is hot tier only
    /// [default: $XDG_DATA_HOME/tierfs/default, else ~/.local/share/tierfs/default].
    #[arg(long, value_name = "DIR", env = "TIERFS_DATA_DIR")]
    #[serde(default)]
    pub data_dir: Option<PathBuf>,

    /// Size of the local cache, in bytes or with a binary unit: 512M, 10G, 1.5T
    /// (K, M, G, T, P are powers of 1024; a trailing B or iB is accepted).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "de::opt_size")]
    pub cache_size: Option<u64>,

    /// Free space on the data dir's disk that file data never takes, so that the metadata
    /// (on the same disk) can still record deletes, renames and truncates when the disk is
    /// full: a write that would dip into it fails with ENOSPC ("No space left on device").
    /// Same units as --cache-size [default: 256M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "de::opt_size")]
    pub reserve: Option<u64>,

    /// Store file (from `tierfs init`): sealed data is uploaded there, and the cache is kept
    /// under --cache-size by evicting what is stored [default without --data-dir: the
    /// embedded local store ~/.local/share/tierfs/store.toml, created on first use].
    #[arg(long, value_name = "FILE", env = "TIERFS_STORE")]
    #[serde(default)]
    pub store: Option<PathBuf>,

    /// Hot tier only: no store, not even the embedded local one; data stays in the data dir.
    #[arg(long, conflicts_with_all = ["store", "snapshot"])]
    #[serde(default)]
    pub no_store: bool,

    /// Workspace of the store to mount.
    #[arg(long, value_name = "NAME", default_value = "default")]
    #[serde(default = "de::default_workspace")]
    pub workspace: String,

    /// Let other users (and root) access the mount. Default: on when running as root (a
    /// node serving other users' notebooks), off otherwise. `--allow-other=false` turns it
    /// off. Non-root users need `user_allow_other` in /etc/fuse.conf.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    #[serde(default)]
    pub allow_other: Option<bool>,

    /// Same as --allow-other=false.
    #[arg(long, conflicts_with = "allow_other")]
    #[serde(default)]
    pub no_allow_other: bool,

    /// Threads reading FUSE requests [default: 1]. One answers a program's file operations
    /// fastest (the thread that just ran answers the next request); more let many programs'
    /// metadata operations run side by side on a machine with many cores.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    #[serde(default, deserialize_with = "de::opt_in_range::<_, u16, 1, 1024>")]
    pub threads: Option<u16>,

    /// Threads for the FUSE operations that may wait for the store (fsync, reads of evicted
    /// data, writes past the dirty bound, truncation) [default: 8]; 0 runs them on the
    /// request threads, where one such wait holds up every other operation.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
    #[serde(default, deserialize_with = "de::opt_in_range::<_, u16, 0, 1024>")]
    pub io_threads: Option<u16>,

    /// The kernel's readahead window for the mount, in KiB [default: 1024]. A page fault in
    /// an mmapped file (a checkpoint loaded with mmap) brings this much around it, and
    /// sequential reads ask ahead this far. Needs root (it is the mount's
    /// /sys/class/bdi/*/read_ahead_kb); otherwise the kernel's 128 KiB stays, with a note in
    /// the log. 0 leaves the kernel's window.
    #[arg(long, value_name = "KIB", value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    #[serde(default, deserialize_with = "de::opt_in_range::<_, u32, 0, 1_048_576>")]
    pub read_ahead_kib: Option<u32>,

    /// Let the kernel buffer writes in its page cache (FUSE writeback cache). Faster for
    /// many small writes to one file (4k random writes: about 1.5x); slower for metadata:
    /// the kernel then asks for the attributes of every closed file again and sends a
    /// timestamp update after each rename, unlink and link. Off by default.
    #[arg(long, conflicts_with = "no_writeback_cache")]
    #[serde(default)]
    pub writeback_cache: bool,

    /// The default: each write() reaches tierfs at once (kept for scripts that pass it).
    #[arg(long, hide = true)]
    #[serde(default)]
    pub no_writeback_cache: bool,

    /// How long the kernel may cache file attributes, in seconds (fractions allowed)
    /// [default: chosen by the FUSE adapter].
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    #[serde(default, deserialize_with = "de::opt_secs")]
    pub attr_ttl: Option<Duration>,

    /// How long the kernel may cache name lookups, in seconds (fractions allowed)
    /// [default: chosen by the FUSE adapter].
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    #[serde(default, deserialize_with = "de::opt_secs")]
    pub entry_ttl: Option<Duration>,

    /// Mount read-only.
    #[arg(long)]
    #[serde(default)]
    pub read_only: bool,

    /// Mount even if MOUNTPOINT is not empty (its files are hidden while mounted).
    #[arg(long)]
    #[serde(default)]
    pub nonempty: bool,

    /// With --store: how many bytes may be written but not yet uploaded; writers wait (never
    /// fail) beyond it [default: half of --cache-size, at most 1G].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "de::opt_size")]
    pub dirty_limit: Option<u64>,

    /// With a store: reads of a file larger than this stream from the store without filling
    /// the cache (the fetched blocks stay in memory for the reader only), so that one big
    /// file read once does not push everything else out; `off` caches every read. `tierfs
    /// warmup` caches a file whatever its size. Same units as --cache-size [default: half
    /// of --cache-size; off without --cache-size].
    #[arg(long, value_name = "SIZE|off", value_parser = parse_stream_limit)]
    #[serde(default, deserialize_with = "de::opt_stream_limit")]
    pub stream_above: Option<StreamLimit>,

    /// With a store: memory for work in flight (packs being uploaded, read-ahead, the stream
    /// buffer) stays within this; fewer parallel uploads and fetches below the default, and
    /// never less than one of each (68M with the default 16 MiB packs) [default: 320M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    #[serde(default, deserialize_with = "de::opt_size")]
    pub memory_budget: Option<u64>,

    /// With a store: data still being written is uploaded once it is this old, even if its
    /// file stays open (closed files and full 4 MiB chunks go at once) [default: 0.5 with
    /// --store; 30 with the embedded store, which is on the same disk: a file rewritten in
    /// place is then sealed again at most every 30 s instead of every half second, and the
    /// store grows that much slower].
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    #[serde(default, deserialize_with = "de::opt_secs")]
    pub dirty_age: Option<Duration>,

    /// When fsync returns (with a store): `remote` once the file's data and the metadata
    /// to find it are in the store under its redundancy policy; `local` once they are on
    /// this node's disk (the store catches up within about a second) [default: remote with
    /// --store; local with the embedded store, which is on the same disk (remote fsync there
    /// costs about 3 ms instead of 0.5 ms and saves nothing a lost disk would not take too)].
    #[arg(long, value_name = "WHERE", value_parser = ["remote", "local"])]
    #[serde(default, deserialize_with = "de::opt_fsync")]
    pub fsync: Option<String>,

    /// Mount the workspace read-only as it was at TIME (beside a live writer; no lease):
    /// RFC 3339 (`2026-12-06T14:03:27Z`) or relative (`10m ago`, taken once, when mounting).
    /// Writes fail with EROFS. Its local state lives in --data-dir [default: a directory per
    /// time next to the default data dir], rebuilt from the store at every such mount.
    /// `tierfs snapshots --timeline` shows how far back the store goes.
    #[arg(long, value_name = "TIME", conflicts_with_all = ["snapshot", "follow", "no_store", "takeover"])]
    #[serde(default)]
    pub at: Option<String>,

    /// Mount snapshot ID of the workspace read-only (beside a live writer; no lease). Its
    /// local state lives in --data-dir [default: a directory per snapshot next to the
    /// default data dir], which is rebuilt from the store at every such mount. Without
    /// --store: a snapshot of the embedded local store.
    #[arg(long, value_name = "ID")]
    #[serde(default)]
    pub snapshot: Option<String>,

    /// Take the workspace over even though another node's lease on it has not expired
    /// (after a runtime reset, when that node is gone). The other node, if it still runs,
    /// stops writing to the store.
    #[arg(long)]
    #[serde(default)]
    pub takeover: bool,

    /// Mount even though the store holds less of the workspace than this node saw it hold
    /// (objects deleted or put back: a rolled-back bucket). Refused without it; with it, the
    /// store's state is taken as it is now and this node's copy is dropped.
    #[arg(long)]
    #[serde(default)]
    pub accept_rollback: bool,

    /// Record no history of code and configs at snapshots (`tierfs log` then shows only
    /// what earlier mounts recorded).
    #[arg(long)]
    #[serde(default)]
    pub no_history: bool,

    /// On an empty data dir (a fresh node, or a runtime after a reset), do not refill the cache
    /// in the background from the chunks the workspace's last node held (its hot set). With
    /// the refill, files that were in use there are local again soon after the mount; reads
    /// never wait behind it, and it stops when the cache or the disk is 90% full.
    #[arg(long)]
    #[serde(default)]
    pub no_refill: bool,

    /// Encrypt the local cache at rest (XEX-AES-256 under a key derived from the store's
    /// key), for nodes whose disks other users can read or that are reused after the job.
    /// Applies to a new, empty data dir; once encrypted, a data dir is only mounted with it.
    /// Costs CPU on every local read and write (benches/README.md).
    #[arg(long, conflicts_with = "no_store")]
    #[serde(default)]
    pub encrypt_cache: bool,

    /// Serve every read and write through this process, never through FUSE passthrough. By
    /// default a file whose data is all on the local disk, opened while nothing else has it
    /// open, is read and written by the kernel straight in its local data file (Linux 6.9+, a
    /// root mount, not with --encrypt-cache or --writeback-cache); such writes reach the store
    /// at fsync, close or within 30 s, and the dirty bound does not throttle them.
    /// `tierfs status` says whether passthrough is on and why not.
    #[arg(long)]
    #[serde(default)]
    pub no_passthrough: bool,

    /// Follow the workspace as another node writes it (read-only, no lease; implies
    /// --read-only): every --follow-interval the mount looks for a newer state in the store
    /// and switches to it whole, so datasets and checkpoints written on one node appear on
    /// every follower within seconds. A file that is open keeps the version it had when it
    /// was opened until it is closed; data the writer has not stored yet is not shown (a
    /// file is shown as far as its data is in the store). Its local state lives in
    /// --data-dir [default: a directory per workspace next to the default data dir], rebuilt
    /// from the store at every such mount.
    #[arg(long, conflicts_with_all = ["snapshot", "no_store", "takeover"])]
    #[serde(default)]
    pub follow: bool,

    /// With --follow: seconds between looks for a newer state (one listing of the store
    /// while nothing changed) [default: 3].
    #[arg(long, value_name = "SECS", value_parser = parse_secs, requires = "follow")]
    #[serde(default, deserialize_with = "de::opt_secs")]
    pub follow_interval: Option<Duration>,

    /// At unmount or SIGTERM, how long to wait for everything to be flushed before giving
    /// up; the outcome is logged and reported to `tierfs umount`.
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = parse_secs)]
    #[serde(default = "de::default_flush_timeout", deserialize_with = "de::secs")]
    pub flush_timeout: Duration,

    /// Watch mode (what `tierfs watch` runs): MOUNTPOINT is a plain directory whose changes
    /// are synced, not a FUSE mount.
    #[arg(long, hide = true)]
    #[serde(default)]
    pub watch: bool,

    /// Directory to mount the workspace on; created if missing.
    #[arg(value_name = "MOUNTPOINT")]
    #[serde(default)]
    pub mountpoint: PathBuf,

    /// A user (uid) who owns the mount: a node's mount with an owner other than root is
    /// served by a worker running as that user (`crate::worker`). Only in the node's
    /// configuration, never on the command line.
    #[arg(skip)]
    #[serde(default)]
    pub owner: Option<u32>,
}

/// The store a mount uses (see [`MountArgs::store_choice`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStore {
    /// Hot tier only: `--no-store`, or `--data-dir` without `--store`.
    None,
    /// `--store FILE`.
    Given(PathBuf),
    /// The embedded default store ([`paths::EmbeddedStore`]); `create` when this mount makes
    /// it if it is missing (a snapshot mount must find it instead).
    Embedded { create: bool },
}

impl MountStore {
    /// Where the store keeps its objects, which picks the core's defaults that depend on it
    /// (the embedded store is on this disk; without a store they do not matter).
    fn locality(&self) -> StoreLocality {
        match self {
            MountStore::Embedded { .. } => StoreLocality::SameDisk,
            MountStore::Given(_) | MountStore::None => StoreLocality::Remote,
        }
    }
}

impl MountArgs {
    /// How old dirty data of an open file may get before it is uploaded: as `--dirty-age`
    /// says, else 0.5 s for a given store and 30 s for the embedded one (see `--dirty-age`).
    pub fn dirty_age(&self) -> Duration {
        self.dirty_age.unwrap_or_else(|| self.store_choice().locality().dirty_age())
    }

    /// Whether fsync waits for the store: as `--fsync` says, else yes for a given store and
    /// no for the embedded one (see `--fsync`).
    pub fn fsync_remote(&self) -> bool {
        match self.fsync.as_deref() {
            Some(place) => place == "remote",
            None => self.store_choice().locality().fsync() == FsyncMode::Remote,
        }
    }

    /// Refuses the combinations clap's `conflicts_with` and `requires` refuse on the command
    /// line, for options that came from a file; each refusal names both keys.
    pub fn check_conflicts(&self) -> Result<()> {
        let pairs = [
            ("no_store", self.no_store, "store", self.store.is_some()),
            ("no_store", self.no_store, "snapshot", self.snapshot.is_some()),
            ("allow_other", self.allow_other.is_some(), "no_allow_other", self.no_allow_other),
            ("writeback_cache", self.writeback_cache, "no_writeback_cache", self.no_writeback_cache),
            ("encrypt_cache", self.encrypt_cache, "no_store", self.no_store),
            ("follow", self.follow, "snapshot", self.snapshot.is_some()),
            ("at", self.at.is_some(), "snapshot", self.snapshot.is_some()),
            ("at", self.at.is_some(), "follow", self.follow),
            ("at", self.at.is_some(), "no_store", self.no_store),
            ("follow", self.follow, "no_store", self.no_store),
            ("follow", self.follow, "takeover", self.takeover),
        ];
        if let Some((a, _, b, _)) = pairs.into_iter().find(|(_, x, _, y)| *x && *y) {
            bail_with!(ErrorKind::InvalidInput, "`{a}` and `{b}` cannot be used together");
        }
        if self.follow_interval.is_some() && !self.follow {
            bail_with!(ErrorKind::InvalidInput, "`follow_interval` needs `follow = true`");
        }
        Ok(())
    }

    /// Which store this mount uses. `--data-dir` without `--store` stays hot tier only, as
    /// tests and benchmarks rely on; `--snapshot` needs a store, so it always has one.
    pub fn store_choice(&self) -> MountStore {
        match (&self.store, self.no_store, &self.snapshot, &self.data_dir) {
            (Some(file), _, _, _) => MountStore::Given(file.clone()),
            (None, true, _, _) => MountStore::None,
            (None, false, Some(_), _) => MountStore::Embedded { create: false },
            (None, false, None, _) if self.at.is_some() => MountStore::Embedded { create: false },
            (None, false, None, _) if self.follow => MountStore::Embedded { create: false },
            (None, false, None, Some(_)) => MountStore::None,
            (None, false, None, None) => MountStore::Embedded { create: true },
        }
    }

    /// Fills in every default and makes paths absolute. Touches nothing: the embedded store
    /// is named here and created (when it may be) by `tierfs mount`.
    pub fn resolve(&self, runtime_dir: Option<&std::path::Path>) -> Result<MountConfig> {
        let at_unix_ms = match &self.at {
            Some(time) => Some(crate::config::parse_time(time, tierfs::meta::system_unix_ms())?),
            None => None,
        };
        let data_dir = match (&self.data_dir, &self.snapshot) {
            (Some(dir), _) => paths::absolute(dir)?,
            (None, None) if at_unix_ms.is_some() => {
                let default = paths::default_data_dir()?;
                default.with_file_name(format!("at-{}", at_unix_ms.unwrap_or_default()))
            }
            (None, None) if self.follow => {
                let default = paths::default_data_dir()?;
                default.with_file_name(format!("follow-{}", self.workspace))
            }
            (None, None) => paths::default_data_dir()?,
            (None, Some(id)) => {
                let default = paths::default_data_dir()?;
                default.with_file_name(format!("snapshot-{id}"))
            }
        };
        let allow_other = if self.no_allow_other { false } else { self.allow_other.unwrap_or_else(mounts::is_root) };
        Ok(MountConfig {
            mountpoint: paths::canonical_mountpoint(&self.mountpoint)?,
            data_dir,
            runtime_dir: paths::runtime_dir(runtime_dir)?,
            cache_size: self.cache_size,
            reserve: self.reserve.unwrap_or(tierfs::tier::DEFAULT_RESERVE),
            store: match self.store_choice() {
                MountStore::None => None,
                MountStore::Given(file) => Some(paths::absolute(&file)?),
                MountStore::Embedded { .. } => Some(paths::EmbeddedStore::locate()?.store_file),
            },
            workspace: self.workspace.clone(),
            allow_other,
            threads: self.threads.map(usize::from),
            io_threads: self.io_threads.map(usize::from),
            read_ahead_kib: self.read_ahead_kib,
            writeback_cache: self.writeback_cache,
            attr_ttl: self.attr_ttl,
            entry_ttl: self.entry_ttl,
            read_only: self.read_only || self.snapshot.is_some() || at_unix_ms.is_some() || self.follow,
            nonempty: self.nonempty,
            flush_timeout: self.flush_timeout,
            snapshot: self.snapshot.clone(),
            at_unix_ms,
            fsync_remote: self.fsync_remote(),
            dirty_limit: self.dirty_limit,
            memory_budget: self.memory_budget.unwrap_or(tierfs::tier::DEFAULT_INFLIGHT_BUDGET),
            stream_above: self.stream_above.unwrap_or(StreamLimit::Default),
            dirty_age: self.dirty_age(),
            takeover: self.takeover,
            accept_rollback: self.accept_rollback,
            watch: self.watch,
            no_history: self.no_history,
            no_refill: self.no_refill,
            encrypt_cache: self.encrypt_cache,
            no_passthrough: self.no_passthrough,
            follow: self.follow.then(|| self.follow_interval.unwrap_or(tierfs::session::FOLLOW_INTERVAL)),
            owner: self.owner,
            metered: false,
        })
    }
}

/// Parses a byte size: a plain number of bytes, or a (possibly fractional) number with a
/// binary unit K, M, G, T or P, optionally followed by `B` or `iB`, any case: `512M`,
/// `10G`, `1.5TiB`, `4096`. Zero is refused: a cache must hold something.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit = unit.trim();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use a number of bytes or K, M, G, T, P \
                 (powers of 1024), e.g. 512M or 10G"
            ));
        }
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(format!("{text:?} is not a size; e.g. 512M, 10G or 1073741824"));
    }
    if fraction.contains('.') || (shift == 0 && !fraction.is_empty()) {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    let overflow = || format!("{text:?} is too large");
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| overflow())? };
    let mut bytes = whole.checked_shl(shift).filter(|b| b >> shift == whole).ok_or_else(overflow)?;
    if !fraction.is_empty() {
        // Exact decimal fraction of the unit, truncated to whole bytes; at most 18 digits
        // so the numerator stays within u128 comfortably.
        let digits = &fraction[..fraction.len().min(18)];
        let numerator: u128 = digits.parse().map_err(|_| overflow())?;
        let denominator = 10u128.pow(digits.len() as u32);
        let extra = (numerator << shift) / denominator;
        bytes = u64::try_from(extra).ok().and_then(|e| bytes.checked_add(e)).ok_or_else(overflow)?;
    }
    if bytes == 0 {
        return Err("the size must be greater than zero".into());
    }
    Ok(bytes)
}

/// Parses `--stream-above`: `off` or a size as [`parse_size`] reads it.
pub fn parse_stream_limit(text: &str) -> Result<StreamLimit, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(StreamLimit::Off);
    }
    parse_size(text).map(StreamLimit::Above).map_err(|e| format!("{e} (or `off`)"))
}

/// Parses `--fencing`: `conditional` or `lease` (see `store::Fencing`).
pub fn parse_fencing(s: &str) -> Result<tierfs::store::Fencing, String> {
    s.parse().map_err(|e: tierfs::store::StoreError| e.to_string())
}

/// Parses a duration in seconds with an optional decimal fraction (`30`, `0.5`,
/// `1.000000001`), exactly to the nanosecond.
/// A duration as humantime reads it (`7d`, `12h 30m`), or `0`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(t).map_err(|e| format!("{text:?} is not a duration such as 7d or 12h: {e}"))
}

fn parse_secs(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let (whole, fraction) = match trimmed.split_once('.') {
        Some((w, f)) => (w, f),
        None => (trimmed, ""),
    };
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
        return Err(format!("{text:?} is not a number of seconds, e.g. 30 or 0.5"));
    }
    if fraction.len() > 9 {
        return Err(format!("{text:?} is more precise than a nanosecond"));
    }
    let secs: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| format!("{text:?} is too large"))? };
    let nanos: u32 = if fraction.is_empty() {
        0
    } else {
        let padded = format!("{fraction:0<9}");
        padded.parse().map_err(|_| format!("{text:?} is not a number of seconds"))?
    };
    Ok(Duration::new(secs, nanos))
}

/// serde's side of the value parsers: a `[[mount]]` key takes what its flag takes (a size as
/// `"10G"` or a number of bytes, seconds as a number or a string), checked the same way.
mod de {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, de::Error};
    use tierfs::session::StreamLimit;

    /// A value written as a string or as a number.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Int(u64),
        Float(f64),
        Str(String),
    }

    impl Text {
        fn text(self) -> String {
            match self {
                Text::Int(n) => n.to_string(),
                Text::Float(f) => f.to_string(),
                Text::Str(s) => s,
            }
        }
    }

    fn parsed<'de, D: Deserializer<'de>, T>(d: D, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, D::Error> {
        let text = Text::deserialize(d)?.text();
        parse(&text).map(Some).map_err(D::Error::custom)
    }

    pub fn opt_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        parsed(d, super::parse_size)
    }

    pub fn opt_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        parsed(d, super::parse_secs)
    }

    pub fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = Text::deserialize(d)?.text();
        super::parse_secs(&text).map_err(D::Error::custom)
    }

    pub fn opt_stream_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StreamLimit>, D::Error> {
        parsed(d, super::parse_stream_limit)
    }

    pub fn opt_fsync<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        match String::deserialize(d)? {
            place if place == "remote" || place == "local" => Ok(Some(place)),
            other => Err(D::Error::custom(format!("{other:?} is not \"remote\" or \"local\""))),
        }
    }

    pub fn opt_in_range<'de, D, T, const LO: u64, const HI: u64>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<u64>,
    {
        let n = u64::deserialize(d)?;
        if !(LO..=HI).contains(&n) {
            return Err(D::Error::custom(format!("{n} is not in {LO}..={HI}")));
        }
        T::try_from(n).map(Some).map_err(|_| D::Error::custom(format!("{n} is out of range")))
    }

    pub fn default_workspace() -> String {
        "default".into()
    }

    pub fn default_flush_timeout() -> Duration {
        Duration::from_secs(60)
    }
}

/// The inverse of [`parse_secs`], exact to the nanosecond.
pub fn format_secs(duration: Duration) -> String {
    if duration.subsec_nanos() == 0 {
        duration.as_secs().to_string()
    } else {
        let fraction = format!("{:09}", duration.subsec_nanos());
        format!("{}.{}", duration.as_secs(), fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes() {
        assert_eq!(parse_stream_limit("off"), Ok(StreamLimit::Off));
        assert_eq!(parse_stream_limit("OFF"), Ok(StreamLimit::Off));
        assert_eq!(parse_stream_limit("2G"), Ok(StreamLimit::Above(2 << 30)));
        assert!(parse_stream_limit("never").unwrap_err().contains("`off`"));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("10gb"), Ok(10 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size(" 1 P "), Ok(1 << 50));
        assert_eq!(parse_size("0.3333K"), Ok(341));
    }

    #[test]
    fn bad_sizes_are_refused_with_a_reason() {
        for bad in ["", "G", "abc", "10X", "1.5", "1.2.3G", "-1G", "0", "0G", "1.2.3"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_size("16384P").is_err(), "overflow");
        assert!(parse_size("99999999999999999999").is_err(), "overflow");
        assert!(parse_size("10X").unwrap_err().contains("unit"));
    }

    #[test]
    fn seconds_round_trip() {
        assert_eq!(parse_secs("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_secs(".25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_secs("0"), Ok(Duration::ZERO));
        for bad in ["", ".", "-1", "1e3", "abc", "0.1234567891"] {
            assert!(parse_secs(bad).is_err(), "{bad:?}");
        }
        for d in [Duration::ZERO, Duration::from_secs(60), Duration::from_millis(1500), Duration::new(1, 1)] {
            assert_eq!(parse_secs(&format_secs(d)), Ok(d));
        }
    }

    #[test]
    fn clap_definitions_are_consistent() {
        Cli::command().debug_assert();
        DaemonCli::command().debug_assert();
    }

    #[test]
    fn allow_other_forms() {
        let parse = |args: &[&str]| {
            let mut argv = vec!["tierfs", "mount"];
            argv.extend_from_slice(args);
            argv.push("/mnt/x");
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Mount(m) => (m.mount.allow_other, m.mount.no_allow_other),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(parse(&[]), (None, false));
        assert_eq!(parse(&["--allow-other"]), (Some(true), false));
        assert_eq!(parse(&["--allow-other=false"]), (Some(false), false));
        assert_eq!(parse(&["--no-allow-other"]), (None, true));
        assert!(Cli::try_parse_from(["tierfs", "mount", "--allow-other", "--no-allow-other", "/m"]).is_err());
    }

    fn mount_args(args: &[&str]) -> MountArgs {
        let mut argv = vec!["tierfs", "mount"];
        argv.extend_from_slice(args);
        argv.push("/mnt/x");
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Mount(m) => m.mount,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_embedded_store_is_the_default_only_without_data_dir() {
        assert_eq!(mount_args(&[]).store_choice(), MountStore::Embedded { create: true });
        assert_eq!(mount_args(&["--no-store"]).store_choice(), MountStore::None);
        assert_eq!(mount_args(&["--data-dir", "/d"]).store_choice(), MountStore::None);
        assert_eq!(mount_args(&["--data-dir", "/d", "--no-store"]).store_choice(), MountStore::None);
        assert_eq!(mount_args(&["--store", "/s.toml"]).store_choice(), MountStore::Given("/s.toml".into()));
        assert!(!mount_args(&[]).fsync_remote(), "the embedded store is on the same disk: local fsync");
        assert!(mount_args(&["--fsync", "remote"]).fsync_remote());
        assert!(mount_args(&["--store", "/s.toml"]).fsync_remote());
        assert!(!mount_args(&["--store", "/s.toml", "--fsync", "local"]).fsync_remote());
        assert_eq!(mount_args(&[]).dirty_age(), Duration::from_secs(30), "embedded store: rewrites seal seldom");
        assert_eq!(mount_args(&["--store", "/s.toml"]).dirty_age(), Duration::from_millis(500));
        assert_eq!(mount_args(&["--dirty-age", "2"]).dirty_age(), Duration::from_secs(2));
        assert_eq!(mount_args(&[]).flush_timeout, tierfs::session::FLUSH_TIMEOUT, "clap's default is the core's");
        assert_eq!(
            mount_args(&["--store", "/s.toml", "--data-dir", "/d"]).store_choice(),
            MountStore::Given("/s.toml".into())
        );
        // A snapshot needs a store: the embedded one, which it must find, not create.
        assert_eq!(mount_args(&["--snapshot", "s1"]).store_choice(), MountStore::Embedded { create: false });
        assert_eq!(
            mount_args(&["--snapshot", "s1", "--data-dir", "/d"]).store_choice(),
            MountStore::Embedded { create: false }
        );
        for conflicting in [&["--no-store", "--store", "/s"][..], &["--no-store", "--snapshot", "s1"][..]] {
            let mut argv = vec!["tierfs", "mount"];
            argv.extend_from_slice(conflicting);
            argv.push("/m");
            let err = Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict, "{conflicting:?}: {err}");
        }
    }

    #[test]
    fn json_is_global() {
        let cli = Cli::try_parse_from(["tierfs", "status", "--json"]).unwrap();
        assert!(cli.json);
        let cli = Cli::try_parse_from(["tierfs", "--json", "status", "/m"]).unwrap();
        assert!(cli.json);
    }

    #[test]
    fn the_config_reaches_the_daemon_as_data_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let argv = [
            "tierfs",
            "mount",
            "--data-dir",
            "/data/ws",
            "--cache-size",
            "1.5G",
            "--no-allow-other",
            "--threads",
            "8",
            "--io-threads",
            "0",
            "--writeback-cache",
            "--attr-ttl",
            "0.25",
            "--entry-ttl",
            "2",
            "--read-only",
            "--nonempty",
            "--flush-timeout",
            "7.5",
            "--stream-above",
            "1G",
        ];
        let mountpoint = dir.path().join("-dashed mount");
        let mut argv: Vec<std::ffi::OsString> = argv.iter().map(std::ffi::OsString::from).collect();
        argv.push(mountpoint.clone().into());
        let Command::Mount(cmd) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not a mount command");
        };
        let run = dir.path().join("run");
        let config = cmd.mount.resolve(Some(&run)).unwrap();
        assert!(!config.allow_other);
        assert_eq!(config.cache_size, Some(3 << 29));
        assert_eq!(config.stream_above, StreamLimit::Above(1 << 30));

        assert_eq!(as_data(&config), config);

        // Defaults round-trip too, including allow_other chosen from the uid.
        let plain = Cli::try_parse_from(["tierfs", "mount", "--data-dir", "/d", "/mnt/p"]).unwrap();
        let Command::Mount(cmd) = plain.command else {
            panic!("not a mount command");
        };
        let config = cmd.mount.resolve(Some(&run)).unwrap();
        assert_eq!(config.allow_other, mounts::is_root());
        assert_eq!(as_data(&config), config);
        assert_eq!(config.store, None, "--data-dir alone is hot tier only");

        // The embedded default store reaches the daemon as an explicit --store.
        let bare = Cli::try_parse_from(["tierfs", "mount", "/mnt/p"]).unwrap();
        let Command::Mount(cmd) = bare.command else {
            panic!("not a mount command");
        };
        let config = cmd.mount.resolve(Some(&run)).unwrap();
        let embedded = paths::EmbeddedStore::locate().unwrap();
        assert_eq!(config.store.as_ref(), Some(&embedded.store_file));
        assert_eq!(config.data_dir, paths::default_data_dir().unwrap());
        assert_eq!(as_data(&config), config);
        // Data that is not a resolved configuration is refused, naming what is wrong.
        let mut relative = serde_json::to_value(&config).unwrap();
        relative["data_dir"] = "data".into();
        let err = crate::launch::read_config(relative.to_string().as_bytes()).unwrap_err();
        assert!(format!("{err:#}").contains("data_dir data is not an absolute path"), "{err:#}");
        let mut unknown = serde_json::to_value(&config).unwrap();
        unknown["cache_sise"] = 1.into();
        let err = crate::launch::read_config(unknown.to_string().as_bytes()).unwrap_err();
        assert!(format!("{err:#}").contains("unknown field `cache_sise`"), "{err:#}");
    }

    #[test]
    fn a_mount_table_means_what_the_same_flags_mean() {
        let table = "mountpoint = \"/mnt/m\"\ndata_dir = \"/d\"\ncache_size = \"1.5G\"\nreserve = 1048576\n\
                     threads = 8\nio_threads = 0\nattr_ttl = 0.25\nentry_ttl = 2\nflush_timeout = \"7.5\"\n\
                     stream_above = \"1G\"\nfsync = \"local\"\nallow_other = false\nread_only = true\n\
                     workspace = \"w\"\n";
        let from_file: MountArgs = toml::from_str(table).unwrap();
        let argv = [
            "tierfs",
            "mount",
            "--data-dir",
            "/d",
            "--cache-size",
            "1.5G",
            "--reserve",
            "1048576",
            "--threads",
            "8",
            "--io-threads",
            "0",
            "--attr-ttl",
            "0.25",
            "--entry-ttl",
            "2",
            "--flush-timeout",
            "7.5",
            "--stream-above",
            "1G",
            "--fsync",
            "local",
            "--allow-other=false",
            "--read-only",
            "--workspace",
            "w",
            "/mnt/m",
        ];
        let Command::Mount(cmd) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not a mount command");
        };
        assert_eq!(from_file, cmd.mount);
        // Defaults are the flags' defaults.
        let bare: MountArgs = toml::from_str("mountpoint = \"/mnt/m\"\n").unwrap();
        let Command::Mount(cmd) = Cli::try_parse_from(["tierfs", "mount", "/mnt/m"]).unwrap().command else {
            panic!("not a mount command");
        };
        assert_eq!(
            (bare.workspace.as_str(), bare.flush_timeout),
            (cmd.mount.workspace.as_str(), cmd.mount.flush_timeout)
        );
        // What clap refuses, the file refuses, naming the key.
        for (bad, named) in [
            ("threads = 0", "0 is not in 1..=1024"),
            ("fsync = \"sometimes\"", "sometimes"),
            ("cache_size = \"lots\"", "lots"),
            ("cache_sise = 1", "unknown field `cache_sise`"),
        ] {
            let err = toml::from_str::<MountArgs>(&format!("mountpoint = \"/m\"\n{bad}\n")).unwrap_err();
            assert!(err.to_string().contains(named), "{bad}: {err}");
        }
        let both: MountArgs = toml::from_str("mountpoint = \"/m\"\nfollow = true\ntakeover = true\n").unwrap();
        let err = both.check_conflicts().unwrap_err().to_string();
        assert!(err.contains("`follow` and `takeover`"), "{err}");
    }

    /// `config` as `tierfs-daemon serve` reads it from the JSON line `tierfs mount` writes.
    fn as_data(config: &MountConfig) -> MountConfig {
        let line = serde_json::to_string(config).unwrap() + "\n";
        crate::launch::read_config(line.as_bytes()).unwrap()
    }
}
