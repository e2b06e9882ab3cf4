//! The CLI side of the workspace history (`tierfs log`, `show`, `checkout`, `diff -p`,
//! `history push|export`): finds the mount or watched directory a command is about and the
//! path inside it, asks its serving process over the control socket (which owns the history
//! through its session), and prints the answer.
//!
//! Invariants:
//! - a PATH names a file of the workspace either through the mount or watched directory it
//!   lies in, or relative to the workspace root; `..` never leaves the workspace;
//! - `checkout` writes through the mount or watched directory (a new file renamed over the
//!   old one), never into the data dir, so the front end sees an ordinary write and the next
//!   sync records it; nothing is written before every file's content is fetched.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::cli::{CheckoutCommand, Cli, DiffCommand, HistoryAction, LogCommand, ShowCommand};
use crate::control::{self, HistoryAnswer, HistoryOp, Request, StatusReport};
use crate::logging::{Reported, bail_with, failure};
use tierfs::ErrorKind;

/// How long a history request may take (an export or push of a long history).
const HISTORY_TIMEOUT: Duration = Duration::from_secs(600);

/// The mount a history command works on, and `path` relative to its workspace root.
pub(crate) struct Target {
    pub(crate) status: StatusReport,
    pub(crate) path: Option<String>,
}

/// Picks the mount: `--mount`, else the one `path` (or the current directory) is in, else the
/// only one running. `all` is every running mount and watch of this user.
pub(crate) fn target(all: Vec<StatusReport>, mount: Option<&Path>, path: Option<&Path>) -> Result<Target> {
    pick(all, mount, path, false)
}

/// [`target`] for a directory: `path` may be the mount's root itself (an empty path).
pub(crate) fn target_dir(all: Vec<StatusReport>, path: Option<&Path>) -> Result<Target> {
    pick(all, None, path, true)
}

fn pick(all: Vec<StatusReport>, mount: Option<&Path>, path: Option<&Path>, root_too: bool) -> Result<Target> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let abs = path.map(|p| normalize(&cwd.join(p)));
    let inside = |s: &StatusReport, p: &Path| p.starts_with(&s.mountpoint);
    let listing = || all.iter().map(|s| s.mountpoint.display().to_string()).collect::<Vec<_>>().join(", ");
    let status = if let Some(m) = mount {
        let m = std::fs::canonicalize(m).with_context(|| format!("--mount {}", m.display()))?;
        match all.iter().find(|s| s.mountpoint == m) {
            Some(s) => s.clone(),
            None => bail_with!(ErrorKind::NotFound, "no tierfs mount or watch of this user is at {}", m.display()),
        }
    } else if let Some(s) = abs.as_ref().and_then(|a| all.iter().find(|s| inside(s, a))) {
        s.clone()
    } else if let Some(s) = all.iter().find(|s| inside(s, &cwd)) {
        s.clone()
    } else {
        match all.as_slice() {
            [one] => one.clone(),
            [] => bail_with!(
                ErrorKind::NotFound,
                "no tierfs mount or watch of this user is running; the history is read through one"
            ),
            _ => bail_with!(
                ErrorKind::InvalidInput,
                "several tierfs mounts are running ({}); say which with --mount DIR",
                listing()
            ),
        }
    };
    let rel = match (path, &abs) {
        (Some(p), Some(a)) => Some(match a.strip_prefix(&status.mountpoint) {
            Ok(r) => r.to_string_lossy().into_owned(),
            Err(_) if p.is_relative() => normalize(p).to_string_lossy().into_owned(),
            Err(_) => {
                bail_with!(ErrorKind::InvalidInput, "{} is not inside {}", p.display(), status.mountpoint.display())
            }
        }),
        _ => None,
    };
    if rel.as_deref().is_some_and(|r| (r.is_empty() && !root_too) || r.starts_with("..")) {
        bail_with!(
            ErrorKind::InvalidInput,
            "{} is not a file of the workspace at {}",
            path.map(|p| p.display().to_string()).unwrap_or_default(),
            status.mountpoint.display()
        );
    }
    Ok(Target { status, path: rel })
}

/// `p` with `.` and `..` resolved lexically (a file that was deleted has history too).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            // `..` takes back a name, stays at `/`, and otherwise is kept (`../../x` stays
            // above the start: popping a `..` it kept would walk back down).
            Component::ParentDir => match out.components().next_back() {
                Some(Component::Normal(_)) => {
                    out.pop();
                }
                Some(Component::RootDir) => {}
                _ => out.push(".."),
            },
            c => out.push(c),
        }
    }
    out
}

/// Sends `op` to the serving process of `status` and returns its answer; a refusal keeps
/// the daemon's message and kind.
fn ask(status: &StatusReport, op: HistoryOp) -> Result<HistoryAnswer> {
    let response = control::request(&status.socket, &Request::History { op }, HISTORY_TIMEOUT)?;
    match response.history {
        Some(answer) if response.ok => Ok(answer),
        _ => Err(response.failure("the serving process gave no answer").into()),
    }
}

fn unexpected(answer: HistoryAnswer) -> anyhow::Error {
    failure!(ErrorKind::Internal, "unexpected answer from the serving process: {answer:?}")
}

fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value).context("encoding JSON output")?);
    Ok(())
}

pub fn log(cli: &Cli, cmd: &LogCommand, all: Vec<StatusReport>) -> Result<()> {
    let t = target(all, cmd.mount.as_deref(), cmd.path.as_deref())?;
    let entries = match ask(&t.status, HistoryOp::Log { path: t.path.clone(), limit: cmd.limit })? {
        HistoryAnswer::Log(entries) => entries,
        other => return Err(unexpected(other)),
    };
    if cli.json {
        return print_json(&entries);
    }
    if entries.is_empty() {
        println!("no history yet: `tierfs sync` records the code and configs");
    }
    for e in &entries {
        let when = tierfs::remote::chrono_like(e.time_unix.max(0) as u64);
        let change = e.change.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
        println!(
            "{} {when} {}{change}  {}",
            &e.commit[..e.commit.len().min(10)],
            e.snapshot.as_deref().unwrap_or("-"),
            e.summary
        );
    }
    Ok(())
}

/// `REV:PATH` split at its first colon.
fn split_spec(spec: &str) -> Result<(&str, &str)> {
    match spec.split_once(':') {
        Some((rev, path)) if !rev.is_empty() && !path.is_empty() => Ok((rev, path)),
        _ => bail_with!(ErrorKind::InvalidInput, "expected REV:PATH (e.g. HEAD:train.py), got {spec:?}"),
    }
}

/// `tierfs show --json` output: the file's text, or its bytes as a list when not UTF-8.
#[derive(Serialize)]
struct ShowOutput<'a> {
    commit: &'a str,
    snapshot: Option<&'a str>,
    path: &'a str,
    executable: bool,
    size: usize,
    pointer_size: Option<u64>,
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<&'a [u8]>,
}

pub fn show(cli: &Cli, cmd: &ShowCommand, all: Vec<StatusReport>) -> Result<()> {
    let (rev, path) = split_spec(&cmd.spec)?;
    let t = target(all, cmd.mount.as_deref(), Some(Path::new(path)))?;
    let rel = t.path.unwrap_or_default();
    let shown = match ask(&t.status, HistoryOp::Show { rev: rev.into(), path: rel })? {
        HistoryAnswer::Show(s) => s,
        other => return Err(unexpected(other)),
    };
    if cli.json {
        let text = std::str::from_utf8(&shown.content).ok();
        return print_json(&ShowOutput {
            commit: &shown.commit,
            snapshot: shown.snapshot.as_deref(),
            path: &shown.path,
            executable: shown.executable,
            size: shown.content.len(),
            pointer_size: shown.pointer_size,
            text,
            bytes: text.is_none().then_some(shown.content.as_slice()),
        });
    }
    std::io::stdout().write_all(&shown.content).context("writing to stdout")
}

pub fn diff(cli: &Cli, cmd: &DiffCommand, all: Vec<StatusReport>) -> Result<()> {
    let first = cmd.paths.first().map(PathBuf::as_path);
    let t = target(all, cmd.mount.as_deref(), first)?;
    let mut paths = Vec::new();
    for p in &cmd.paths {
        let one = target(vec![t.status.clone()], Some(&t.status.mountpoint), Some(p))?;
        paths.extend(one.path);
    }
    let op = HistoryOp::Diff { from: cmd.a.clone(), to: cmd.b.clone(), paths };
    let text = match ask(&t.status, op)? {
        HistoryAnswer::Diff(text) => text,
        other => return Err(unexpected(other)),
    };
    if cli.json {
        return print_json(&serde_json::json!({ "diff": text }));
    }
    print!("{text}");
    Ok(())
}

/// `tierfs checkout` output with `--json`: the files written.
#[derive(Serialize)]
struct CheckedOut {
    commit: String,
    files: Vec<PathBuf>,
}

pub fn checkout(cli: &Cli, cmd: &CheckoutCommand, all: Vec<StatusReport>) -> Result<()> {
    let t = target(all, cmd.mount.as_deref(), cmd.paths.first().map(PathBuf::as_path))?;
    // Every file is fetched before anything is written: an unknown revision or a path not in
    // it changes nothing.
    let mut files = Vec::new();
    for p in &cmd.paths {
        let one = target(vec![t.status.clone()], Some(&t.status.mountpoint), Some(p))?;
        let rel = one.path.unwrap_or_default();
        let shown = match ask(&t.status, HistoryOp::Show { rev: cmd.rev.clone(), path: rel.clone() })? {
            HistoryAnswer::Show(s) => s,
            other => return Err(unexpected(other)),
        };
        if let Some(size) = shown.pointer_size {
            bail_with!(
                ErrorKind::InvalidInput,
                "{rel} at {} is recorded as a pointer ({size} bytes, over the history's size limit); its content is in snapshot {}: `tierfs restore --snapshot {}` writes a copy",
                cmd.rev,
                shown.snapshot.as_deref().unwrap_or("?"),
                shown.snapshot.as_deref().unwrap_or("ID")
            );
        }
        files.push((t.status.mountpoint.join(&rel), shown));
    }
    let mut written = Vec::new();
    let mut commit = String::new();
    for (dest, shown) in files {
        write_replacing(&dest, &shown.content, shown.executable)?;
        if !cli.json {
            println!(
                "{} ({} bytes, from {})",
                dest.display(),
                shown.content.len(),
                &shown.commit[..10.min(shown.commit.len())]
            );
        }
        commit = shown.commit;
        written.push(dest);
    }
    if cli.json {
        return print_json(&CheckedOut { commit, files: written });
    }
    Ok(())
}

/// Writes `content` to `dest` whole: a new file beside it, then a rename over it.
fn write_replacing(dest: &Path, content: &[u8], executable: bool) -> Result<()> {
    let dir =
        dest.parent().ok_or_else(|| failure!(ErrorKind::InvalidInput, "{} has no parent directory", dest.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tierfs-checkout-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(content).with_context(|| format!("writing {}", tmp.display()))?;
        // The file's own mode, with execute bits where it can be read when the history says
        // executable (as git does), and none when it does not.
        let mode = match std::fs::metadata(dest) {
            Ok(m) if executable => (m.permissions().mode() & 0o7777) | ((m.permissions().mode() & 0o444) >> 2),
            Ok(m) => m.permissions().mode() & 0o7777 & !0o111,
            Err(_) if executable => 0o755,
            Err(_) => 0o644,
        };
        f.set_permissions(std::fs::Permissions::from_mode(mode)).with_context(|| format!("chmod {}", tmp.display()))?;
        f.sync_all().with_context(|| format!("fsync {}", tmp.display()))?;
        std::fs::rename(&tmp, dest).with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `tierfs history push|export`: the serving process sends the whole history
/// ([`tierfs::history::Bundle`]) and this process, with its user's rights, writes it into the
/// directory or pushes it to the remote. The serving process may run as root (the node
/// daemon), so it is never asked to write where a caller names.
pub fn history(cli: &Cli, action: &HistoryAction, all: Vec<StatusReport>) -> Result<()> {
    let mount = match action {
        HistoryAction::Push { mount, .. } | HistoryAction::Export { mount, .. } => mount,
    };
    let t = target(all, mount.as_deref(), None)?;
    let bundle = match ask(&t.status, HistoryOp::Bundle)? {
        HistoryAnswer::Bundle(b) => b,
        other => return Err(unexpected(other)),
    };
    let published = match action {
        HistoryAction::Push { remote, .. } => {
            let scratch = tempfile::Builder::new()
                .prefix("tierfs-history-push.")
                .tempdir()
                .context("making a scratch directory for the push")?;
            bundle.push(remote.as_deref(), scratch.path()).map_err(reported)?
        }
        HistoryAction::Export { dir, .. } => {
            let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
            bundle.export(&dir).map_err(reported)?
        }
    };
    if cli.json {
        return print_json(&published);
    }
    println!(
        "{} commits, main at {}, in {}",
        published.commits,
        &published.head[..10.min(published.head.len())],
        published.to
    );
    Ok(())
}

/// A history failure with its kind, for `--json`.
fn reported(e: tierfs::history::HistoryError) -> anyhow::Error {
    Reported::new(e.kind(), e.to_string()).into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_lexically() {
        assert_eq!(normalize(Path::new("/m/a/./b/../c.py")), PathBuf::from("/m/a/c.py"));
        assert_eq!(normalize(Path::new("a/../../x")), PathBuf::from("../x"));
        assert_eq!(normalize(Path::new("../../etc/passwd")), PathBuf::from("../../etc/passwd"));
        assert_eq!(normalize(Path::new("/../x")), PathBuf::from("/x"));
    }

    #[test]
    fn specs_split_at_the_first_colon() {
        assert_eq!(split_spec("HEAD~1:conf/a:b.yaml").unwrap(), ("HEAD~1", "conf/a:b.yaml"));
        assert!(split_spec("train.py").is_err());
        assert!(split_spec(":x").is_err());
    }
}
