//! A mount's status as people read it: `tierfs status` (one mount as `key value` lines,
//! several as a table) and the one formatter of byte sizes and durations every command's
//! text uses.
//!
//! It renders a [`StatusReport`] and derives nothing a program would want: what the report
//! adds up to is [`crate::control::StatusSummary`], which `--json` carries for scripts and
//! the Python package. Sizes are binary (`1.5 KiB`, from `bytesize`), durations
//! `humantime`'s (`1h 2m 3s`).

use std::time::Duration;

use crate::control::StatusReport;

/// One row of `tierfs status`: a key and its value.
type Row = (&'static str, String);

/// One mount, as `key value` lines.
pub fn format_status(report: &StatusReport) -> String {
    let mut rows = mount_rows(report);
    rows.extend(backend_rows(report));
    if let Some(r) = &report.remote {
        rows.extend(remote_rows(r));
    }
    if let (Some(store), Some(c)) = (&report.store, &report.cold) {
        rows.push(("store", store.display().to_string()));
        rows.extend(cold_rows(c));
    }
    if let Some(f) = &report.follow {
        rows.extend(follow_rows(f));
    }
    if let Some(w) = &report.watch {
        rows[0] = ("watching", w.dir.display().to_string());
        rows.extend(watch_rows(w));
    }
    rows.iter().map(|(key, value)| format!("{key:<12}{value}\n")).collect()
}

/// What every mount has: where it is, its process, its size and its options.
fn mount_rows(report: &StatusReport) -> Vec<Row> {
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
    ];
    if let Some(p) = &report.passthrough {
        // After the options: how the mount serves reads.
        rows.push(("passthrough", passthrough_row(p)));
    }
    rows.push(("socket", report.socket.display().to_string()));
    rows.push(("version", report.version.clone()));
    rows
}

/// The status row of FUSE passthrough: on (with how many opens it served, how many are open
/// and how many fell back), or off and why.
fn passthrough_row(p: &tierfs::vfs::PassthroughStats) -> String {
    let depth = match p.stack_depth {
        Some(d) if d >= 2 => format!("; stack depth {d}, the kernel's limit: no overlay (`tierfs layer`) fits on it"),
        Some(d) => format!("; stack depth {d}"),
        None => String::new(),
    };
    if p.on {
        format!(
            "on: {} opens served by the kernel from the local data files ({} for writing), {} open now \
             ({} writing), {} served here (other handles open, not all local, or no room for a writer){depth}",
            p.opens, p.write_opens, p.open_now, p.writers_now, p.fallbacks
        )
    } else {
        format!("off: {}{depth}", p.off_reason.as_deref().unwrap_or("unknown"))
    }
}

/// Each backend's breaker, and the copies waiting for one.
fn backend_rows(report: &StatusReport) -> Vec<Row> {
    let mut rows = Vec::new();
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
    rows
}

/// The metadata in the store: what trails, the last snapshot, the lease.
fn remote_rows(r: &crate::control::RemoteStatus) -> Vec<Row> {
    let mut rows = vec![
        ("workspace", r.workspace.clone()),
        (
            "metadata",
            format!(
                "{} batches ({}) not yet in the store, oldest {} ms; last commit {}",
                r.pending_batches,
                format_bytes(r.pending_bytes),
                r.oldest_pending_ms,
                tierfs::remote::chrono_like(r.last_commit_unix)
            ),
        ),
        ("snapshot", r.last_snapshot.clone().unwrap_or_else(|| "none this session".into())),
        (
            "lease",
            format!(
                "{} until {} (fencing: {})",
                r.lease_holder,
                tierfs::remote::chrono_like(r.lease_expires_unix),
                r.fencing
            ),
        ),
    ];
    if let Some(stop) = &r.stopped {
        rows.push(("STOPPED", stop.clone()));
    } else if let Some(e) = &r.last_error {
        rows.push(("remote error", e.clone()));
    }
    rows
}

/// The file data: what waits for the store, the cache, the traffic.
fn cold_rows(c: &crate::control::ColdStatus) -> Vec<Row> {
    let mut rows = vec![
        (
            "pending",
            format!("{} in {} files, oldest {} ms", format_bytes(c.dirty_bytes), c.dirty_files, c.oldest_dirty_ms),
        ),
        ("cached", format!("{} ({} evicted)", format_bytes(c.resident_bytes), format_bytes(c.evicted_bytes))),
        (
            "uploaded",
            format!(
                "{} in {} packs; fetched {} ({} streamed, not cached)",
                format_bytes(c.uploaded_bytes),
                c.uploaded_packs,
                format_bytes(c.fetched_bytes),
                format_bytes(c.streamed_bytes)
            ),
        ),
    ];
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
    rows
}

/// A follower's head, and how long ago it moved.
fn follow_rows(f: &crate::control::FollowReport) -> Vec<Row> {
    let unix_now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let checked =
        f.checked_unix.map_or_else(|| "not yet".to_owned(), |t| format!("{} s ago", unix_now().saturating_sub(t)));
    let mut rows = vec![(
        "following",
        format!(
            "batch {}, switched {} s ago ({} new heads); store read {checked}, every {} s",
            f.seq,
            unix_now().saturating_sub(f.switched_unix),
            f.heads,
            f.interval_secs
        ),
    )];
    if let Some(e) = &f.last_error {
        rows.push(("follow error", format!("{e} ({} failures in all)", f.errors)));
    }
    rows
}

/// A watched directory: how changes are seen, what waits, what was synced.
fn watch_rows(w: &crate::control::WatchStatus) -> Vec<Row> {
    let mode = match &w.fallback_reason {
        Some(why) => format!("{} ({why})", w.mode),
        None => w.mode.clone(),
    };
    let t = &w.totals;
    let mut rows = vec![
        ("watch", format!("{mode}; started {}; {} passes ({} full)", w.start, w.passes, w.full_passes)),
        ("changes", format!("{} directories waiting, oldest {} ms", w.pending_dirs, w.oldest_pending_ms)),
        (
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
        ),
    ];
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
    rows
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

/// `1536` → `1.5 KiB`: binary units, one decimal.
pub fn format_bytes(bytes: u64) -> String {
    bytesize::ByteSize(bytes).to_string()
}

/// `3723` → `1h 2m 3s`.
pub fn format_duration(secs: u64) -> String {
    humantime::format_duration(Duration::from_secs(secs)).to_string()
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
            meta_commits: 0,
            disk_free: 3 << 30,
            reserve: 256 << 20,
            store: None,
            cold: None,
            remote: None,
            backends: Vec::new(),
            pending_repairs: 0,
            allow_other: true,
            owner: None,
            passthrough: None,
            read_only: false,
            writeback_cache: true,
            cache_encrypted: false,
            watch: None,
            fuse_ops: Vec::new(),
            follow: None,
            summary: crate::control::StatusSummary::default(),
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
        assert_eq!(format_duration(90_061), "1day 1h 1m 1s");
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
