//! The `tierfs` subcommands (`mount`, `umount`, `status`, and the store commands), and their
//! human and JSON output.
//!
//! Invariants:
//! - A command succeeds only when its effect is observable: `mount` returns once the mount
//!   answers on its control socket, `umount` once the mount is gone from the kernel's table
//!   *and* the serving process has exited (so the data directory is free for the next
//!   mount).
//! - The kernel mount table, not a socket file, decides whether something is mounted; a
//!   socket nobody answers on is stale and is cleaned up.
//! - With `--json`, stdout carries exactly one JSON document per invocation.
//! - Only `mount` creates the embedded default store (with its key file, never asking for a
//!   passphrase) and says so on stderr; the one-shot store commands use it without `--store`
//!   when it exists, and otherwise fail saying what creates it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use tierfs::types::ErrorKind;

use crate::cli::{
    Cli, Command, DiffCommand, FlushCommand, ForgetCommand, GcCommand, InitCommand, KeyAction, KeyCommand,
    MountCommand, RestoreCommand, ScrubCommand, SnapshotsCommand, StatusCommand, SyncCommand, UmountCommand,
    WarmupCommand,
};
use crate::control::{self, ClientError, Request, StatusReport, UnmountReport};
use crate::frontend;
use crate::handoff;
use crate::history;
use crate::launch::{self, Readiness, ReadyInfo};
use crate::logging::{self, Reason, Reported, bail_with, failure};
use crate::mounts;
use crate::paths;
use crate::store_link;

/// How long a liveness ping may take before the serving process counts as hung.
const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a status query may take (it reads metadata).
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// How often to look again while waiting for an unmount to complete.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Runs one `tierfs` invocation.
pub fn run(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Mount(cmd) => mount(cli, cmd, false),
        Command::Umount(cmd) => umount(cli, cmd, false),
        Command::Watch(cmd) => mount(cli, cmd, true),
        Command::Unwatch(cmd) => umount(cli, cmd, true),
        Command::Status(cmd) => status(cli, cmd),
        Command::Init(cmd) => init(cli, cmd),
        Command::Key(cmd) => key(cli, cmd),
        Command::Scrub(cmd) => scrub(cli, cmd),
        Command::Warmup(cmd) => warmup(cli, cmd),
        Command::Sync(cmd) => sync(cli, cmd),
        Command::Flush(cmd) => flush(cli, cmd),
        Command::Snapshots(cmd) => snapshots(cli, cmd),
        Command::Restore(cmd) => restore(cli, cmd),
        Command::Forget(cmd) => forget(cli, cmd),
        Command::Gc(cmd) => gc(cli, cmd),
        Command::Diff(cmd) if cmd.patch || !cmd.paths.is_empty() => history::diff(cli, cmd, running(cli)?),
        Command::Diff(cmd) => diff(cli, cmd),
        Command::Log(cmd) => history::log(cli, cmd, running(cli)?),
        Command::Show(cmd) => history::show(cli, cmd, running(cli)?),
        Command::Checkout(cmd) => history::checkout(cli, cmd, running(cli)?),
        Command::History(cmd) => history::history(cli, &cmd.action, running(cli)?),
    }
}

/// Every mount and watch of this user that answers.
fn running(cli: &Cli) -> Result<Vec<StatusReport>> {
    all_statuses(cli.runtime_dir.as_deref())
}

fn diff(cli: &Cli, cmd: &DiffCommand) -> Result<()> {
    let store = paths::command_store_file(cmd.store.as_deref())?;
    let Some(b) = &cmd.b else {
        bail_with!(
            ErrorKind::InvalidInput,
            "`tierfs diff A B` lists what changed between two snapshots (B may be `latest`); `tierfs diff -p A` shows the history's diff from A to the workspace as it is now"
        )
    };
    let changes = store_link::diff(&store, &cmd.workspace, &cmd.a, b)?;
    if cli.json {
        return print_json(&changes);
    }
    for c in &changes {
        if c.what.is_empty() {
            println!("{} {}", c.op, c.path);
        } else {
            println!("{} {} ({})", c.op, c.path, c.what.join(", "));
        }
    }
    Ok(())
}

fn forget(cli: &Cli, cmd: &ForgetCommand) -> Result<()> {
    let policy = tierfs::remote::KeepPolicy {
        last: cmd.keep_last,
        daily: cmd.keep_daily,
        weekly: cmd.keep_weekly,
        monthly: cmd.keep_monthly,
        within_secs: cmd.keep_within.map_or(0, |d| d.as_secs()),
    };
    if policy.is_empty() {
        bail_with!(
            ErrorKind::InvalidInput,
            "say what to keep (--keep-last, --keep-daily, --keep-weekly, --keep-monthly, --keep-within); forget never removes every snapshot"
        );
    }
    let store = paths::command_store_file(cmd.store.as_deref())?;
    let report = store_link::forget(&store, &cmd.workspace, &policy, cmd.dry_run)?;
    if cli.json {
        return print_json(&report);
    }
    let verb = if cmd.dry_run { "would remove" } else { "removed" };
    for id in &report.removed {
        println!("{verb} {id}");
    }
    println!("kept {} snapshots, {verb} {}", report.kept.len(), report.removed.len());
    Ok(())
}

fn gc(cli: &Cli, cmd: &GcCommand) -> Result<()> {
    let store = paths::command_store_file(cmd.store.as_deref())?;
    let report = store_link::gc(&store, cmd.dry_run, cmd.keep_within, cli.json)?;
    if cli.json {
        return print_json(&report);
    }
    let verb = if cmd.dry_run { "would delete" } else { "deleted" };
    println!(
        "{} workspaces, {} snapshots, {} referenced blocks in {} packs",
        report.workspaces,
        report.snapshots,
        report.referenced_blocks,
        report.packs - report.packs_deleted
    );
    println!(
        "{verb} {} packs ({}), {} index segments, {} old checkpoints, {} journal segments, {} metadata parts",
        report.packs_deleted,
        format_bytes(report.bytes_deleted),
        report.index_segments_deleted,
        report.checkpoints_deleted,
        report.journal_segments_deleted,
        report.parts_deleted
    );
    println!(
        "kept for restore --at within {}: {} journal segments, {} checkpoints",
        humantime::format_duration(cmd.keep_within),
        report.journal_segments_kept,
        report.checkpoints_kept
    );
    Ok(())
}

fn restore(cli: &Cli, cmd: &RestoreCommand) -> Result<()> {
    let store = paths::command_store_file(cmd.store.as_deref())?;
    let dir = paths::absolute(&cmd.dir)?;
    let from = match (&cmd.snapshot, &cmd.at) {
        (Some(id), _) => crate::restore::From::Snapshot(id.clone()),
        (None, Some(time)) => {
            crate::restore::From::At(crate::restore::parse_time(time, tierfs::meta::system_unix_ms())?)
        }
        (None, None) => crate::restore::From::Latest,
    };
    let report = crate::restore::restore(&store, &cmd.workspace, &from, &dir, cmd.same_owner, cli.json)?;
    if cli.json {
        return print_json(&report);
    }
    if let Some(at) = &report.at {
        let base = match (at.base.kind, &at.base.id) {
            (tierfs::remote::PointKind::Sync, Some(id)) => format!("sync {id}"),
            (tierfs::remote::PointKind::Checkpoint, _) => format!("checkpoint at batch {}", at.base.seq),
            _ => "the start of the journal".to_string(),
        };
        println!(
            "as of {}: the state of {} (batch {}), from {base} and {} journal batches after it",
            at.at, at.state, at.seq, at.batches
        );
        if let Some(seq) = at.gap_after {
            println!(
                "note: the journal skips batches after {seq} (only a newer checkpoint holds them): this is the \
                 state at {}, earlier than asked",
                at.state
            );
        }
        if !at.incomplete.is_empty() {
            println!(
                "incomplete: {} files whose data at {} had not all reached the store, restored as the store had them:",
                at.incomplete.len(),
                at.at
            );
            for p in &at.incomplete {
                println!("  {p}");
            }
        }
    }
    println!(
        "restored {} files ({}), {} directories, {} symlinks, {} hard links into {} in {} ms",
        report.written.files,
        format_bytes(report.written.bytes),
        report.written.dirs,
        report.written.symlinks,
        report.written.hard_links,
        dir.display(),
        report.millis
    );
    let left = &report.written.left_out;
    if !left.is_empty() {
        println!(
            "left out (--same-owner, as root, restores them): {} owners, {} setuid/setgid bits, {} device nodes, \
             {} security/trusted xattrs",
            left.owners, left.setid_bits, left.devices, left.xattrs
        );
    }
    Ok(())
}

/// One mount's outcome of `tierfs flush`.
#[derive(Debug, Serialize)]
struct FlushOutcome {
    mountpoint: PathBuf,
    #[serde(flatten)]
    report: control::FlushReport,
}

/// `tierfs flush`: every mount given (or every one that answers) flushes in parallel.
fn flush(cli: &Cli, cmd: &FlushCommand) -> Result<()> {
    let sockets: Vec<(PathBuf, PathBuf)> = if cmd.mountpoints.is_empty() {
        all_statuses(cli.runtime_dir.as_deref())?.into_iter().map(|r| (r.mountpoint, r.socket)).collect()
    } else {
        let mut out = Vec::new();
        for m in &cmd.mountpoints {
            let m = paths::canonical_mountpoint(m)?;
            let socket = paths::find_socket(cli.runtime_dir.as_deref(), &m)?;
            out.push((m, socket));
        }
        out
    };
    let secs = cmd.deadline.as_secs().max(1);
    // The answer may take the whole deadline; a little more to read it.
    let wait = Duration::from_secs(secs) + Duration::from_secs(5);
    let outcomes: Vec<FlushOutcome> = std::thread::scope(|s| {
        let asked: Vec<_> = sockets
            .iter()
            .map(|(m, socket)| {
                s.spawn(move || {
                    let failed = control::FlushReport::failed;
                    let report = match control::request(socket, &Request::Flush { timeout_secs: secs }, wait) {
                        Ok(r) if r.ok => r.flush.unwrap_or_else(|| {
                            failed("answered without a flush report".into(), Some(ErrorKind::Internal))
                        }),
                        Ok(r) => failed(
                            r.error.unwrap_or_else(|| "refused".into()),
                            r.kind.as_deref().and_then(ErrorKind::from_name),
                        ),
                        Err(e) => {
                            let e = explain_unserved(e, m);
                            failed(logging::error_message(&e), logging::error_kind(&e))
                        }
                    };
                    FlushOutcome { mountpoint: m.clone(), report }
                })
            })
            .collect();
        asked.into_iter().map(|h| h.join().expect("a flush thread panicked")).collect()
    });
    let left: Vec<&FlushOutcome> = outcomes.iter().filter(|o| !o.report.flushed).collect();
    if cli.json {
        print_json(&serde_json::json!({ "ok": left.is_empty(), "mounts": &outcomes }))?;
    } else if outcomes.is_empty() {
        println!("tierfs: no tierfs mounts to flush");
    } else {
        for o in &outcomes {
            let r = &o.report;
            match &r.error {
                None => println!("tierfs: {}: all in the store ({} ms)", o.mountpoint.display(), r.millis),
                Some(e) => println!(
                    "tierfs: {}: NOT all in the store: {} in {} files only on this node ({e})",
                    o.mountpoint.display(),
                    format_bytes(r.dirty_bytes),
                    r.dirty_files
                ),
            }
        }
    }
    if !left.is_empty() {
        // The kind of the first mount that says why (`fenced`, `unavailable`, ...).
        let kind = left.iter().find_map(|o| o.report.kind.as_deref().and_then(ErrorKind::from_name));
        let message = format!(
            "{} of {} mounts are not all in the store: {}",
            left.len(),
            outcomes.len(),
            left.iter().map(|o| o.mountpoint.display().to_string()).collect::<Vec<_>>().join(", ")
        );
        return Err(Reported { message, kind, reason: None }.into());
    }
    Ok(())
}

fn sync(cli: &Cli, cmd: &SyncCommand) -> Result<()> {
    let mountpoint = match &cmd.mountpoint {
        Some(m) => paths::canonical_mountpoint(m)?,
        None => {
            let all = all_statuses(cli.runtime_dir.as_deref())?;
            match all.as_slice() {
                [one] => one.mountpoint.clone(),
                [] => bail_with!(
                    ErrorKind::NotFound,
                    "no tierfs mount of this user is running; mount one first (`tierfs mount MOUNTPOINT`)"
                ),
                _ => bail_with!(
                    ErrorKind::InvalidInput,
                    "several tierfs mounts are running ({}); say which: `tierfs sync MOUNTPOINT`",
                    all.iter().map(|r| r.mountpoint.display().to_string()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
    };
    let socket = paths::find_socket(cli.runtime_dir.as_deref(), &mountpoint)?;
    // Pages the kernel still holds (writeback cache) reach tierfs first: the barrier covers
    // everything written before `tierfs sync` started.
    mounts::syncfs(&mountpoint).with_context(|| format!("syncfs {}", mountpoint.display()))?;
    if !cli.json {
        eprintln!("tierfs: uploading and committing {} ...", mountpoint.display());
    }
    let request = Request::Sync { message: cmd.message.clone(), timeout_secs: cmd.timeout.as_secs().max(1) };
    let response = control::request(&socket, &request, cmd.timeout + STATUS_TIMEOUT)
        .map_err(|e| explain_unserved(e, &mountpoint))?;
    let report = match response.sync {
        Some(report) if response.ok => report,
        _ => {
            let failed = response.failure("no answer");
            return Err(anyhow::Error::new(failed).context(format!("sync of {} failed", mountpoint.display())));
        }
    };
    if let Some(e) = &report.history_error {
        // The snapshot is safe; the history step is what failed, and that is not success.
        bail_with!(
            ErrorKind::Internal,
            "snapshot {} is committed, but its code and configs were not recorded in the history: {e}",
            report.snapshot
        );
    }
    if cli.json {
        return print_json(&report);
    }
    println!(
        "uploaded {} of data and {} of metadata ({} of {} parts changed) in {} ms",
        format_bytes(report.data_bytes),
        format_bytes(report.metadata_bytes),
        report.parts_uploaded,
        report.parts,
        report.millis
    );
    match report.history.as_ref().map(|h| (h.commit.as_deref(), h.counts.files)) {
        Some((Some(commit), files)) => {
            println!("history: commit {} ({files} files recorded)", &commit[..10.min(commit.len())])
        }
        Some((None, _)) => println!("history: no change in the recorded files"),
        None => {}
    }
    println!("{}", report.snapshot);
    Ok(())
}

fn snapshots(cli: &Cli, cmd: &SnapshotsCommand) -> Result<()> {
    let store = paths::command_store_file(cmd.store.as_deref())?;
    if cmd.timeline {
        return timeline(cli, &store, &cmd.workspace);
    }
    let list = store_link::list_snapshots(&store, &cmd.workspace)?;
    if cli.json {
        return print_json(&list);
    }
    if list.is_empty() {
        println!("no snapshots in workspace {:?}", cmd.workspace);
        return Ok(());
    }
    for s in &list {
        println!("{}  {} entries  {}", s.id, s.entries, s.message.as_deref().unwrap_or(""));
    }
    Ok(())
}

/// `tierfs snapshots --timeline`: the restorable points, oldest first, and the journal's span.
fn timeline(cli: &Cli, store: &Path, workspace: &str) -> Result<()> {
    use tierfs::remote::PointKind;
    let t = store_link::timeline(store, workspace)?;
    if cli.json {
        return print_json(&t);
    }
    let Some(oldest) = &t.oldest else {
        println!("workspace {workspace:?} has nothing to restore");
        return Ok(());
    };
    for p in &t.points {
        let what = match p.kind {
            PointKind::Start => "start     ".to_string(),
            PointKind::Checkpoint => "checkpoint".to_string(),
            PointKind::Sync => format!("sync       {}", p.id.as_deref().unwrap_or("")),
        };
        let message = p.message.as_deref().map(|m| format!("  {m}")).unwrap_or_default();
        let alone = if p.journal_after { "" } else { "  (journal after it deleted: restores only itself)" };
        println!("{}  {what}  batch {}{message}{alone}", p.time, p.seq);
    }
    if let Some(j) = &t.journal {
        println!("journal: batches from {} to {} (segments {} to {})", j.from, j.to, j.first_segment, j.last_segment);
    }
    println!("restorable from {oldest} on");
    Ok(())
}

/// `tierfs mount` output with `--json`.
#[derive(Debug, Serialize)]
struct MountOutput<'a> {
    ok: bool,
    already_mounted: bool,
    #[serde(flatten)]
    info: &'a ReadyInfo,
}

/// `tierfs mount`, and with `watch` `tierfs watch`.
fn mount(cli: &Cli, cmd: &MountCommand, watch: bool) -> Result<()> {
    // The embedded store made here, like all a serving process makes, is private.
    crate::private::private_umask();
    store_link::prepare_mount_store(&cmd.mount)?;
    let mut config = cmd.mount.resolve(cli.runtime_dir.as_deref())?;
    config.watch |= watch;

    // Re-running the mount command of a live mount (a re-executed notebook cell) is fine.
    if let Some((socket, pong)) = serving(&config.runtime_dir, &config.mountpoint) {
        if pong.watch != config.watch {
            let (is, stop) = if pong.watch { ("watched", "tierfs unwatch") } else { ("mounted", "tierfs umount") };
            bail_with!(
                Reason::PathInUse,
                "{} is already {is} by tierfs (pid {}), not {}; stop that first (`{stop} {}`)",
                pong.mountpoint.display(),
                pong.pid,
                if config.watch { "watched" } else { "mounted" },
                pong.mountpoint.display()
            );
        }
        if pong.data_dir != config.data_dir {
            bail_with!(
                Reason::PathInUse,
                "{} is already mounted from data dir {} (pid {}); unmount it first",
                pong.mountpoint.display(),
                pong.data_dir.display(),
                pong.pid
            );
        }
        let info = ReadyInfo { pid: pong.pid, mountpoint: pong.mountpoint, data_dir: pong.data_dir, socket, log: None };
        if cli.json {
            print_json(&MountOutput { ok: true, already_mounted: true, info: &info })?;
        } else {
            println!(
                "tierfs: {} is already mounted (pid {}, data dir {})",
                info.mountpoint.display(),
                info.pid,
                info.data_dir.display()
            );
        }
        return Ok(());
    }

    if cmd.foreground {
        let rt = crate::config::build_runtime()?;
        let mut readiness = Readiness::Print { json: cli.json };
        let result = frontend::run(&rt, &config, &mut readiness);
        rt.shutdown_timeout(Duration::from_secs(1));
        return result;
    }

    let node_socket = if cmd.standalone { None } else { handoff::node_socket(&paths::node_runtime_dir()) };
    let handed = match node_socket {
        Some(socket) => handoff::hand_off(&socket, &config, cmd.timeout)?,
        None => None,
    };
    let (info, served_by) = match handed {
        Some(info) => {
            let by = format!("served by the node daemon (pid {}; its log has the details)", info.pid);
            (info, by)
        }
        None => {
            let info = launch::spawn_daemon(&config, cmd.timeout)?;
            let log = info.log.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
            let by = format!("daemon pid {}, log {log}", info.pid);
            (info, by)
        }
    };
    if cli.json {
        print_json(&MountOutput { ok: true, already_mounted: false, info: &info })?;
    } else {
        println!(
            "tierfs: {} {} (data dir {}, {served_by})",
            if config.watch { "watching" } else { "mounted" },
            info.mountpoint.display(),
            info.data_dir.display(),
        );
    }
    Ok(())
}

/// The process serving `mountpoint` and its socket, if one answers: a mount of this user's,
/// or of the node daemon's.
fn serving(runtime_dir: &Path, mountpoint: &Path) -> Option<(PathBuf, control::Pong)> {
    paths::with_node_dir(runtime_dir.to_path_buf()).into_iter().find_map(|dir| {
        let socket = paths::socket_path(&dir, mountpoint).ok()?;
        control::ping(&socket, PING_TIMEOUT).ok().flatten().map(|pong| (socket, pong))
    })
}

/// `tierfs umount` output with `--json`.
#[derive(Debug, Serialize)]
struct UmountOutput {
    ok: bool,
    mountpoint: PathBuf,
    /// `control-socket` when the serving process flushed and unmounted, otherwise the
    /// helper that cleared a mount nobody served.
    method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    flush: Option<UnmountReport>,
}

/// `tierfs umount`, and with `watch` `tierfs unwatch` (the same request; no mount to clear).
fn umount(cli: &Cli, cmd: &UmountCommand, watch: bool) -> Result<()> {
    let mountpoint = paths::canonical_mountpoint(&cmd.mountpoint)?;
    let socket = paths::find_socket(cli.runtime_dir.as_deref(), &mountpoint)?;
    let deadline = Instant::now() + cmd.timeout;

    let pong = match control::ping(&socket, PING_TIMEOUT) {
        Ok(pong) => pong,
        Err(err) => {
            eprintln!("tierfs: warning: {err}; unmounting without the serving process");
            None
        }
    };
    let Some(pong) = pong else {
        if watch {
            bail_with!(
                ErrorKind::NotFound,
                "{} is not watched (no tierfs process answers for it)",
                mountpoint.display()
            );
        }
        return umount_unserved(cli, cmd, &mountpoint, &socket, deadline);
    };
    if watch && cmd.lazy {
        bail_with!(
            ErrorKind::InvalidInput,
            "--lazy detaches a busy FUSE mount; a watched directory has no mount to detach: drop --lazy"
        );
    }
    if pong.watch != watch {
        let (is, stop) = if pong.watch { ("watched", "tierfs unwatch") } else { ("a FUSE mount", "tierfs umount") };
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is {is} (pid {}): stop it with `{stop} {}`",
            mountpoint.display(),
            pong.pid,
            mountpoint.display()
        );
    }

    let response = control::request(&socket, &Request::Unmount { lazy: cmd.lazy }, cmd.timeout)
        .with_context(|| format!("asking pid {} to unmount {}", pong.pid, mountpoint.display()))?;
    if !response.ok {
        return Err(response.failure("the serving process refused to unmount").into());
    }
    let report = response
        .unmount
        .ok_or_else(|| failure!(ErrorKind::Internal, "the serving process answered without an unmount report"))?;
    // The node daemon goes on serving its other mounts: only the mount itself goes.
    let serving_pid = (!pong.node).then_some(pong.pid);
    wait_until_gone(serving_pid, &mountpoint, !cmd.lazy, deadline)?;

    if cli.json {
        print_json(&UmountOutput {
            ok: report.flushed,
            mountpoint: mountpoint.clone(),
            method: "control-socket".into(),
            pid: Some(pong.pid),
            flush: Some(report.clone()),
        })?;
    } else if report.flushed {
        let done = if watch { "stopped watching" } else { "unmounted" };
        println!("tierfs: {done} {} (flushed in {} ms)", mountpoint.display(), report.flush_millis);
    }
    if !report.flushed {
        // The kind of what stopped the flush (`fenced`, `no_space`, ...), else worth a retry.
        let kind = report.flush_kind.as_deref().and_then(ErrorKind::from_name).unwrap_or(ErrorKind::Unavailable);
        bail_with!(
            kind,
            "{} {}, but the flush did not complete: {}",
            if watch { "stopped watching" } else { "unmounted" },
            mountpoint.display(),
            report.flush_error.as_deref().unwrap_or("unknown reason")
        );
    }
    Ok(())
}

/// No tierfs process answers for `mountpoint`: clear a stale mount with the system helper.
fn umount_unserved(cli: &Cli, cmd: &UmountCommand, mountpoint: &Path, socket: &Path, deadline: Instant) -> Result<()> {
    // A socket file nobody answers on was left by a dead process.
    if control::ping(socket, PING_TIMEOUT).ok().flatten().is_none() {
        let _ = fs::remove_file(socket);
    }
    let entry = mounts::find_mount(mountpoint)
        .context("reading the mount table")?
        .ok_or_else(|| failure!(ErrorKind::NotFound, "{} is not mounted", mountpoint.display()))?;
    if !(entry.fs_type == "fuse.tierfs" || (entry.is_fuse() && entry.source == "tierfs")) {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is a {} mount of {}, not a tierfs mount; not touching it",
            mountpoint.display(),
            entry.fs_type,
            entry.source
        );
    }
    let method = mounts::unmount(mountpoint, cmd.lazy)?;
    wait_until_gone(None, mountpoint, true, deadline)?;
    if cli.json {
        print_json(&UmountOutput {
            ok: true,
            mountpoint: mountpoint.to_path_buf(),
            method: method.to_string(),
            pid: None,
            flush: None,
        })?;
    } else {
        println!(
            "tierfs: unmounted {} with {method} (no tierfs process was serving it, so nothing \
             was flushed)",
            mountpoint.display()
        );
    }
    Ok(())
}

/// Waits until the serving process `pid` has exited and, if `check_table`, the mount is
/// gone from the kernel's table.
fn wait_until_gone(pid: Option<u32>, mountpoint: &Path, check_table: bool, deadline: Instant) -> Result<()> {
    loop {
        let alive = pid.is_some_and(mounts::process_alive);
        let mounted = check_table && mounts::find_mount(mountpoint).context("reading the mount table")?.is_some();
        if !alive && !mounted {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let what = match (alive, pid) {
                (true, Some(pid)) => format!("serving process {pid} to exit"),
                _ => format!("{} to disappear from the mount table", mountpoint.display()),
            };
            bail_with!(Reason::Timeout, "timed out waiting for {what}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn status(cli: &Cli, cmd: &StatusCommand) -> Result<()> {
    match &cmd.mountpoint {
        Some(mountpoint) => {
            let mountpoint = paths::canonical_mountpoint(mountpoint)?;
            let socket = paths::find_socket(cli.runtime_dir.as_deref(), &mountpoint)?;
            let report = query_status(&socket).map_err(|err| explain_unserved(err, &mountpoint))?;
            if cli.json {
                print_json(&report)
            } else {
                print!("{}", format_status(&report));
                Ok(())
            }
        }
        None => {
            let reports = all_statuses(cli.runtime_dir.as_deref())?;
            if cli.json {
                print_json(&reports)
            } else {
                print!("{}", format_table(&reports));
                Ok(())
            }
        }
    }
}

fn query_status(socket: &Path) -> Result<StatusReport, ClientError> {
    let response = control::request(socket, &Request::Status, STATUS_TIMEOUT)?;
    match response.status {
        Some(status) if response.ok => Ok(status),
        _ => Err(ClientError::Refused {
            path: socket.to_path_buf(),
            message: response.error.unwrap_or_else(|| "status answer without a report".into()),
        }),
    }
}

/// Turns "nobody answers" into what the user should know about the mountpoint.
fn explain_unserved(err: ClientError, mountpoint: &Path) -> anyhow::Error {
    if !matches!(err, ClientError::NotServing(_)) {
        return err.into();
    }
    match mounts::find_mount(mountpoint) {
        Ok(Some(entry)) if entry.is_fuse() => failure!(
            ErrorKind::NotFound,
            "{} is mounted ({}) but no tierfs process answers for it: its daemon died or runs \
             with another --runtime-dir; `tierfs umount {}` clears a stale mount",
            mountpoint.display(),
            entry.fs_type,
            mountpoint.display()
        ),
        _ => failure!(ErrorKind::NotFound, "{} is not a tierfs mount", mountpoint.display()),
    }
}

/// Every mount that answers in `runtime_dir`, sorted by mountpoint.
/// Every mount and watch that answers in [`paths::runtime_dirs`]: this user's and the node
/// daemon's (a node mount of another user refuses the query and is left out).
fn all_statuses(explicit: Option<&Path>) -> Result<Vec<StatusReport>> {
    let mut reports: Vec<StatusReport> = Vec::new();
    // The first directory is the user's own; the node's comes after it.
    for (i, runtime_dir) in paths::runtime_dirs(explicit)?.into_iter().enumerate() {
        let entries = match fs::read_dir(&runtime_dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("listing {}", runtime_dir.display()));
            }
        };
        for entry in entries {
            let path = entry.with_context(|| format!("listing {}", runtime_dir.display()))?.path();
            // The node's hand-off socket speaks another protocol: it serves no mount.
            if path.extension().is_none_or(|ext| ext != "sock")
                || path.file_name().is_some_and(|n| n == crate::handoff::NODE_SOCKET)
            {
                continue;
            }
            match query_status(&path) {
                Ok(report) if !reports.iter().any(|r| r.socket == report.socket) => reports.push(report),
                Ok(_) | Err(ClientError::NotServing(_)) => {}
                // Another user's node mount: not this caller's to see.
                Err(ClientError::Refused { .. }) if i > 0 => {}
                Err(err) => eprintln!("tierfs: warning: {err}"),
            }
        }
    }
    reports.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    Ok(reports)
}

/// One mount, as `key value` lines.
pub fn format_status(report: &StatusReport) -> String {
    let mut options = vec![if report.read_only { "read-only" } else { "read-write" }];
    if report.writeback_cache {
        options.push("writeback cache");
    }
    if report.cache_encrypted {
        options.push("cache encrypted at rest");
    }
    if report.allow_other {
        options.push("allow_other");
    }
    let mut rows = vec![
        ("mountpoint", report.mountpoint.display().to_string()),
        ("data dir", report.data_dir.display().to_string()),
        ("pid", report.pid.to_string()),
        ("uptime", format_duration(report.uptime_secs)),
        ("inodes", report.inodes.to_string()),
        ("open files", report.open_files.to_string()),
        ("data", format!("{} ({} bytes)", format_bytes(report.data_bytes), report.data_bytes)),
        ("cache size", report.cache_size.map(format_bytes).unwrap_or_else(|| "not limited".into())),
        ("disk free", disk_free_row(report.disk_free, report.reserve)),
        ("options", options.join(", ")),
        ("socket", report.socket.display().to_string()),
        ("version", report.version.clone()),
    ];
    if let Some(p) = &report.passthrough {
        // After the options: how the mount serves reads.
        let at = rows.iter().position(|(k, _)| *k == "options").map_or(rows.len(), |i| i + 1);
        rows.insert(at, ("passthrough", passthrough_row(p)));
    }
    for b in &report.backends {
        let state = if b.available { "ok".to_string() } else { "DOWN".to_string() };
        let detail = match (&b.last_error, b.consecutive_failures) {
            (Some(e), n) if n > 0 => format!(" ({n} failures; last: {e})"),
            _ => String::new(),
        };
        rows.push(("backend", format!("{state}  {}{detail}", b.name)));
    }
    if report.pending_repairs > 0 {
        rows.push(("repairs", format!("{} copies waiting for a backend", report.pending_repairs)));
    }
    if let Some(r) = &report.remote {
        rows.push(("workspace", r.workspace.clone()));
        rows.push((
            "metadata",
            format!(
                "{} batches ({}) not yet in the store, oldest {} ms; last commit {}",
                r.pending_batches,
                format_bytes(r.pending_bytes),
                r.oldest_pending_ms,
                tierfs::remote::chrono_like(r.last_commit_unix)
            ),
        ));
        rows.push(("snapshot", r.last_snapshot.clone().unwrap_or_else(|| "none this session".into())));
        rows.push((
            "lease",
            format!(
                "{} until {} (fencing: {})",
                r.lease_holder,
                tierfs::remote::chrono_like(r.lease_expires_unix),
                r.fencing
            ),
        ));
        if let Some(stop) = &r.stopped {
            rows.push(("STOPPED", stop.clone()));
        } else if let Some(e) = &r.last_error {
            rows.push(("remote error", e.clone()));
        }
    }
    if let (Some(store), Some(c)) = (&report.store, &report.cold) {
        rows.push(("store", store.display().to_string()));
        rows.push((
            "pending",
            format!("{} in {} files, oldest {} ms", format_bytes(c.dirty_bytes), c.dirty_files, c.oldest_dirty_ms),
        ));
        rows.push((
            "cached",
            format!("{} ({} evicted)", format_bytes(c.resident_bytes), format_bytes(c.evicted_bytes)),
        ));
        rows.push((
            "uploaded",
            format!(
                "{} in {} packs; fetched {} ({} streamed, not cached)",
                format_bytes(c.uploaded_bytes),
                c.uploaded_packs,
                format_bytes(c.fetched_bytes),
                format_bytes(c.streamed_bytes)
            ),
        ));
        if c.neighbour_blocks > 0 {
            rows.push((
                "neighbours",
                format!(
                    "{} blocks ({}) fetched beside misses, {} used",
                    c.neighbour_blocks,
                    format_bytes(c.neighbour_bytes),
                    c.neighbour_hits
                ),
            ));
        }
        if let Some(r) = &c.refill {
            rows.push(("refill", refill_line(r)));
        }
        if c.upload_errors > 0 {
            rows.push((
                "errors",
                format!("{} upload retries; last: {}", c.upload_errors, c.last_error.as_deref().unwrap_or("-")),
            ));
        }
    }
    if let Some(f) = &report.follow {
        let unix_now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let checked =
            f.checked_unix.map_or_else(|| "not yet".to_owned(), |t| format!("{} s ago", unix_now().saturating_sub(t)));
        rows.push((
            "following",
            format!(
                "batch {}, switched {} s ago ({} new heads); store read {checked}, every {} s",
                f.seq,
                unix_now().saturating_sub(f.switched_unix),
                f.heads,
                f.interval_secs
            ),
        ));
        if let Some(e) = &f.last_error {
            rows.push(("follow error", format!("{e} ({} failures in all)", f.errors)));
        }
    }
    if let Some(w) = &report.watch {
        rows[0] = ("watching", w.dir.display().to_string());
        let mode = match &w.fallback_reason {
            Some(why) => format!("{} ({why})", w.mode),
            None => w.mode.clone(),
        };
        rows.push(("watch", format!("{mode}; started {}; {} passes ({} full)", w.start, w.passes, w.full_passes)));
        rows.push(("changes", format!("{} directories waiting, oldest {} ms", w.pending_dirs, w.oldest_pending_ms)));
        let t = &w.totals;
        rows.push((
            "synced",
            format!(
                "{} files read ({}), {} chunks uploaded ({}); {} created, {} renamed, {} removed",
                t.files_read,
                format_bytes(t.bytes_read),
                t.chunks_uploaded,
                format_bytes(t.bytes_uploaded),
                t.created,
                t.renamed,
                t.removed
            ),
        ));
        if t.cloned_reads > 0 {
            rows.push(("clones", format!("{} files read through reflink clones", t.cloned_reads)));
        }
        if !w.unstable.is_empty() {
            rows.push(("unstable", format!("{} (kept their last good version)", w.unstable.join(", "))));
        }
        for (path, why) in &w.unreadable {
            rows.push(("unreadable", format!("{path}: {why}")));
        }
        if let Some(e) = &w.last_error {
            rows.push(("watch error", e.clone()));
        }
    }
    rows.iter().map(|(key, value)| format!("{key:<12}{value}\n")).collect()
}

/// Several mounts, as an aligned table.
pub fn format_table(reports: &[StatusReport]) -> String {
    if reports.is_empty() {
        return "no tierfs mounts\n".into();
    }
    let header = ["MOUNTPOINT", "PID", "UPTIME", "INODES", "OPEN", "DATA", "CACHE", "DATA DIR"];
    let rows: Vec<[String; 8]> = reports
        .iter()
        .map(|r| {
            [
                format!("{}{}", r.mountpoint.display(), if r.watch.is_some() { " (watch)" } else { "" }),
                r.pid.to_string(),
                format_duration(r.uptime_secs),
                r.inodes.to_string(),
                r.open_files.to_string(),
                format_bytes(r.data_bytes),
                r.cache_size.map(format_bytes).unwrap_or_else(|| "-".into()),
                r.data_dir.display().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut text =
            cells.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect::<Vec<_>>().join("  ");
        text.truncate(text.trim_end().len());
        text.push('\n');
        text
    };
    let mut out = line(header.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The status row of FUSE passthrough: on (with how many opens it served, how many are open
/// and how many fell back), or off and why.
fn passthrough_row(p: &tierfs::vfs::PassthroughStats) -> String {
    if p.on {
        format!(
            "on: {} opens served by the kernel from the local data files, {} open now, {} served here \
             (other handles open, or not all local)",
            p.opens, p.open_now, p.fallbacks
        )
    } else {
        format!("off: {}", p.off_reason.as_deref().unwrap_or("unknown"))
    }
}

/// The status row of the data dir's disk: free space, what writes may still take of it, and
/// a warning once writes fail (the reserve is reached).
fn disk_free_row(free: u64, reserve: u64) -> String {
    let writable = free.saturating_sub(reserve);
    let full = if writable == 0 { "; FULL: writes fail with ENOSPC until files are deleted" } else { "" };
    format!(
        "{} ({} for writes, {} kept for metadata{full})",
        format_bytes(free),
        format_bytes(writable),
        format_bytes(reserve)
    )
}

/// `1536` → `1.5 KiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `3723` → `1h 2m 3s`.
pub fn format_duration(secs: u64) -> String {
    let (days, hours, minutes, seconds) = (secs / 86_400, secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m {seconds}s"),
        (0, _, _) => format!("{hours}h {minutes}m {seconds}s"),
        _ => format!("{days}d {hours}h {minutes}m"),
    }
}

/// A small runtime for the store commands (network I/O only).
fn store_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn init(cli: &Cli, cmd: &InitCommand) -> Result<()> {
    let rt = store_runtime()?;
    let store_file = paths::absolute(&cmd.store)?;
    let new = store_link::NewStore {
        backends: cmd.backends.clone(),
        replicas: cmd.replicas,
        erasure: cmd.erasure.clone(),
        key_file: cmd.key_file.clone(),
        pack_size: cmd.pack_size,
        fencing: cmd.fencing,
    };
    let out = store_link::init(rt.handle(), &store_file, new)?;
    if let Some(key_file) = &out.key_file_created {
        eprintln!("created key file {} (keep a copy: without it the store cannot be read)", key_file.display());
    }
    if cli.json {
        return print_json(&out);
    }
    println!("created store {} ({}; unlocked by {}; fencing: {})", out.store_id, out.redundancy, out.key, out.fencing);
    for b in &out.backends {
        println!("  backend {b}");
    }
    println!("store file: {}", out.store_file.display());
    println!("mount a workspace with: tierfs mount --store {} MOUNTPOINT", out.store_file.display());
    Ok(())
}

/// One wrapped key in `tierfs key list`.
#[derive(Debug, Serialize)]
struct KeyRow {
    id: String,
    label: String,
    method: String,
    created_unix: u64,
}

fn new_secret(key_file: Option<&Path>) -> Result<store_link::SecretBytes> {
    match key_file {
        Some(path) => {
            let path = paths::absolute(path)?;
            if !path.exists() {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                f.write_all(tierfs::crypto::generate_key_file().as_bytes())
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            store_link::read_key_file(&path)
        }
        None => match std::env::var_os("TIERFS_NEW_PASSPHRASE") {
            Some(p) if !p.is_empty() => Ok(store_link::SecretBytes::Passphrase(p.into_encoded_bytes())),
            _ => {
                // The prompt helper reads TIERFS_PASSPHRASE first; a new one must be typed.
                if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                    bail_with!(
                        ErrorKind::InvalidInput,
                        "set TIERFS_NEW_PASSPHRASE (or run in a terminal) to give the new passphrase"
                    );
                }
                // SAFETY: single-threaded at this point; removes the variable for this process only.
                unsafe { std::env::remove_var(store_link::PASSPHRASE_ENV) };
                store_link::passphrase("New passphrase: ", true)
            }
        },
    }
}

fn key(cli: &Cli, cmd: &KeyCommand) -> Result<()> {
    let rt = store_runtime()?;
    let h = rt.handle();
    match &cmd.action {
        KeyAction::List { store } => {
            let (store, _) = store_link::open_store(h, &paths::command_store_file(store.as_deref())?)?;
            let keys = h.block_on(store.list_keys())?;
            let rows: Vec<KeyRow> = keys
                .into_iter()
                .map(|k| KeyRow { id: k.id, label: k.label, method: k.method, created_unix: k.created_unix })
                .collect();
            if cli.json {
                return print_json(&rows);
            }
            for r in rows {
                println!("{}  {:<9} {}  (created {})", r.id, r.method, r.label, r.created_unix);
            }
            Ok(())
        }
        KeyAction::Add { store, key_file, label } => {
            let (opened, _) = store_link::open_store(h, &paths::command_store_file(store.as_deref())?)?;
            let new = new_secret(key_file.as_deref())?;
            let wrapped = h.block_on(opened.add_key(&new.as_secret(), store_link::kdf_params(), label))?;
            if cli.json {
                return print_json(&serde_json::json!({ "added": wrapped.id }));
            }
            println!("added key {} ({})", wrapped.id, wrapped.method);
            Ok(())
        }
        KeyAction::Remove { store, id } => {
            let (store, _) = store_link::open_store(h, &paths::command_store_file(store.as_deref())?)?;
            h.block_on(store.remove_key(id))?;
            if cli.json {
                return print_json(&serde_json::json!({ "removed": id }));
            }
            println!("removed key {id}");
            Ok(())
        }
        KeyAction::Passwd { store } => {
            let (opened, _) = store_link::open_store(h, &paths::command_store_file(store.as_deref())?)?;
            let old = opened.unlocked_by().to_string();
            let new = new_secret(None)?;
            let wrapped = h.block_on(opened.add_key(&new.as_secret(), store_link::kdf_params(), "passphrase"))?;
            h.block_on(opened.remove_key(&old))?;
            if cli.json {
                return print_json(&serde_json::json!({ "added": wrapped.id, "removed": old }));
            }
            println!("passphrase changed (key {} replaces {old})", wrapped.id);
            Ok(())
        }
    }
}

fn scrub(cli: &Cli, cmd: &ScrubCommand) -> Result<()> {
    let store = paths::command_store_file(cmd.store.as_deref())?;
    let rt = store_runtime()?;
    let report = store_link::scrub(rt.handle(), &store, cmd.repair, cli.json)?;
    if cli.json {
        print_json(&report)?;
    } else {
        println!(
            "checked {} objects and {} packs: {} copies good, {} bad, {} missing, {} repaired",
            report.objects, report.packs, report.copies_ok, report.copies_bad, report.copies_missing, report.repaired
        );
        for key in &report.unrepaired {
            println!("  NOT REPAIRED: {key}");
        }
    }
    if !report.unrepaired.is_empty() {
        bail_with!(
            ErrorKind::Corrupt,
            "{} objects are damaged{}",
            report.unrepaired.len(),
            if cmd.repair { " and could not be repaired" } else { "; run with --repair" }
        );
    }
    Ok(())
}

fn warmup(cli: &Cli, cmd: &WarmupCommand) -> Result<()> {
    let (files, bytes) = store_link::warmup(&cmd.paths, cli.json)?;
    if cli.json {
        return print_json(&serde_json::json!({ "files": files, "bytes": bytes }));
    }
    println!("warmed up {files} file{} ({})", if files == 1 { "" } else { "s" }, format_bytes(bytes));
    Ok(())
}

fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value).context("encoding JSON output")?);
    Ok(())
}

/// The refill's row of `tierfs status`.
fn refill_line(r: &tierfs::tier::RefillStats) -> String {
    use tierfs::tier::RefillState;
    let progress = format!(
        "{} of {} ({} of {} chunks) in {:.1} s",
        format_bytes(r.fetched_bytes),
        format_bytes(r.planned_bytes),
        r.fetched_chunks,
        r.planned_chunks,
        r.elapsed_ms as f64 / 1000.0
    );
    match r.state {
        RefillState::Running => {
            format!("running: {} of {} back", format_bytes(r.fetched_bytes), format_bytes(r.planned_bytes))
        }
        RefillState::Done => format!("done: {progress}"),
        RefillState::Stopped => format!("stopped: {} ({progress})", r.stopped.as_deref().unwrap_or("-")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn report(mountpoint: &str) -> StatusReport {
        StatusReport {
            version: "0.1.0".into(),
            pid: 42,
            mountpoint: mountpoint.into(),
            data_dir: "/data".into(),
            socket: "/run/x.sock".into(),
            started_at_unix: 0,
            uptime_secs: 3723,
            inodes: 10,
            open_files: 2,
            data_bytes: 1536,
            cache_size: Some(10 << 30),
            disk_free: 3 << 30,
            reserve: 256 << 20,
            store: None,
            cold: None,
            remote: None,
            backends: Vec::new(),
            pending_repairs: 0,
            allow_other: true,
            read_only: false,
            writeback_cache: true,
            cache_encrypted: false,
            passthrough: None,
            watch: None,
            fuse_ops: Vec::new(),
            follow: None,
        }
    }

    #[test]
    fn human_numbers() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(10 << 30), "10.0 GiB");
        assert_eq!(format_duration(5), "5s");
        assert_eq!(format_duration(65), "1m 5s");
        assert_eq!(format_duration(3723), "1h 2m 3s");
        assert_eq!(format_duration(90_061), "1d 1h 1m");
    }

    #[test]
    fn status_text_names_every_field() {
        let text = format_status(&report("/content/work"));
        for needle in [
            "/content/work",
            "/data",
            "42",
            "1h 2m 3s",
            "1.5 KiB (1536 bytes)",
            "10.0 GiB",
            "3.0 GiB (2.8 GiB for writes, 256.0 MiB kept for metadata)",
            "writeback cache, allow_other",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in\n{text}");
        }
        assert!(!text.contains("FULL"), "{text}");
    }

    #[test]
    fn status_says_when_the_disk_is_full_for_writes() {
        let mut r = report("/m");
        r.disk_free = 100 << 20;
        let text = format_status(&r);
        assert!(text.contains("100.0 MiB (0 B for writes, 256.0 MiB kept for metadata; FULL"), "{text}");
    }

    #[test]
    fn table_is_aligned() {
        let text = format_table(&[report("/a"), report("/content/work")]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let pid_column = lines[0].find("PID").unwrap();
        assert_eq!(&lines[1][pid_column..pid_column + 2], "42");
        assert_eq!(&lines[2][pid_column..pid_column + 2], "42");
        assert_eq!(format_table(&[]), "no tierfs mounts\n");
    }
}
