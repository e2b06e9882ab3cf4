"""What a mount reports about itself: :class:`Status`, read from ``tierfs --json status``.

A :class:`Status` is a frozen snapshot of one moment; ask the mount again for a newer one.
It answers the questions a notebook user has before a runtime may be recycled: is
everything I wrote in the store (``pending_bytes``, ``oldest_unsynced_secs``), what was the
last snapshot, how full is the cache, is the store reachable. :meth:`Status.format` renders
it as the ``%tierfs status`` text, with a warning line when unsynced data has waited longer
than a threshold (:data:`UNSYNCED_WARNING_SECS` by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Status", "BackendHealth", "WatchState", "UNSYNCED_WARNING_SECS", "format_bytes", "format_age"]

#: Unsynced data older than this (seconds) earns a warning line in :meth:`Status.format`.
#: Data normally reaches the store within seconds (a file once closed, open files after
#: ``--dirty-age``: 0.5 s with a store of your own, 30 s with the embedded one), so five
#: minutes means something holds it back: a store that does not answer, or a file that is
#: never closed.
UNSYNCED_WARNING_SECS = 300.0

Mode = Literal["fuse", "watch"]


@dataclass(frozen=True)
class BackendHealth:
    """One backend of the store, as the mount sees it."""

    name: str
    available: bool
    consecutive_failures: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class WatchState:
    """What a watcher (watch mode) reports beyond a mount's status.

    Attributes:
        detection: ``"events"`` (inotify events, plus a full pass every few minutes) or
            ``"rescan-only"`` (events could not be trusted: full passes every 10 s).
        detection_fallback: why events are not used (``None`` with events).
        start: how the directory and the workspace met (``fresh``, ``resumed``,
            ``restored (...)``).
        passes: passes over the directory so far; ``full_passes`` of them over all of it.
        full_passes: see ``passes``.
        pending_dirs: directories with changes that no pass has synced yet.
        oldest_pending_secs: how long the oldest of those has waited (``None``: none).
        unstable: files that kept changing while read: the store keeps their last good
            version.
        unreadable: ``(path, why)`` of files the watcher cannot read: they are not in the
            store.
        last_error: why the last pass failed (it is retried), or ``None``.
    """

    detection: str
    detection_fallback: str | None
    start: str
    passes: int
    full_passes: int
    pending_dirs: int
    oldest_pending_secs: float | None
    unstable: tuple[str, ...]
    unreadable: tuple[tuple[str, str], ...]
    last_error: str | None

    @classmethod
    def from_report(cls, watch: Mapping[str, Any]) -> WatchState:
        pending = int(watch.get("pending_dirs", 0))
        return cls(
            detection=str(watch.get("mode", "")),
            detection_fallback=watch.get("fallback_reason"),
            start=str(watch.get("start", "")),
            passes=int(watch.get("passes", 0)),
            full_passes=int(watch.get("full_passes", 0)),
            pending_dirs=pending,
            oldest_pending_secs=int(watch.get("oldest_pending_ms", 0)) / 1000 if pending else None,
            unstable=tuple(str(p) for p in watch.get("unstable") or ()),
            unreadable=tuple((str(p), str(why)) for p, why in watch.get("unreadable") or ()),
            last_error=watch.get("last_error"),
        )


@dataclass(frozen=True)
class Status:
    """The state of one mount at one moment.

    Attributes:
        path: the mount point (the watched directory in watch mode).
        mode: how the workspace is served: ``"fuse"`` (a FUSE mount) or ``"watch"`` (a
            plain directory that a watcher syncs: see :attr:`watch`).
        workspace: the workspace of the store (``None`` without a store).
        store: the store file (``None``: hot tier only, nothing leaves this disk).
        pid: the serving daemon's process id.
        read_only: whether the mount refuses writes.
        pending_bytes: file data written but not yet in the store.
        pending_files: files holding ``pending_bytes``.
        pending_metadata_bytes: metadata (names, sizes, modes) not yet in the store.
        oldest_unsynced_secs: age of the oldest change not yet in the store, in seconds;
            ``None`` when everything is there (in watch mode, changes no pass has seen
            yet count too).
        last_snapshot: id of the last snapshot this mount committed (``None`` if it took
            none since it started).
        cache_used_bytes: file data held on the local disk.
        cache_limit_bytes: the cache's size limit (``None``: not limited).
        backends: each backend of the store, reachable or not.
        healthy: every backend answers and the mount still writes to the store (in watch
            mode: and the last pass over the directory succeeded).
        error: the last store error, or why the mount stopped writing to it.
        data_dir: the local data directory.
        uptime_secs: how long the daemon has served the mount.
        version: the daemon's tierfs version.
        watch: the watcher's state in watch mode (``None`` for a FUSE mount).
        raw: the full ``tierfs --json status`` report, for fields not mirrored here.
    """

    path: str
    mode: Mode
    workspace: str | None
    store: str | None
    pid: int
    read_only: bool
    pending_bytes: int
    pending_files: int
    pending_metadata_bytes: int
    oldest_unsynced_secs: float | None
    last_snapshot: str | None
    cache_used_bytes: int
    cache_limit_bytes: int | None
    backends: tuple[BackendHealth, ...]
    healthy: bool
    error: str | None
    data_dir: str
    uptime_secs: int
    version: str
    watch: WatchState | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> Status:
        """A :class:`Status` from one ``tierfs --json status MOUNTPOINT`` report.

        What the report adds up to (pending changes, the oldest of them, health, the error to
        show) comes from its ``summary``, which the daemon derives: nothing is re-derived here.
        """
        summary = report["summary"]
        watch = WatchState.from_report(report["watch"]) if report.get("watch") else None
        remote = report.get("remote") or {}
        backends = tuple(
            BackendHealth(
                name=str(b.get("name", "")),
                available=bool(b.get("available", False)),
                consecutive_failures=int(b.get("consecutive_failures", 0)),
                last_error=b.get("last_error"),
            )
            for b in report.get("backends") or ()
        )
        store = report.get("store")
        oldest_ms = summary.get("oldest_unsynced_ms")
        return cls(
            path=str(report["mountpoint"]),
            mode="watch" if summary.get("mode") == "watch" else "fuse",
            workspace=remote.get("workspace") if remote else None,
            store=str(store) if store else None,
            pid=int(report["pid"]),
            read_only=bool(report.get("read_only", False)),
            pending_bytes=int(summary.get("pending_bytes", 0)),
            pending_files=int(summary.get("pending_files", 0)),
            pending_metadata_bytes=int(summary.get("pending_metadata_bytes", 0)),
            oldest_unsynced_secs=int(oldest_ms) / 1000 if oldest_ms is not None else None,
            last_snapshot=remote.get("last_snapshot"),
            cache_used_bytes=int(summary.get("cache_used_bytes", 0)),
            cache_limit_bytes=report.get("cache_size"),
            backends=backends,
            healthy=bool(summary.get("healthy", False)),
            error=summary.get("error"),
            data_dir=str(report.get("data_dir", "")),
            uptime_secs=int(report.get("uptime_secs", 0)),
            version=str(report.get("version", "")),
            watch=watch,
            raw=dict(report),
        )

    @property
    def synced(self) -> bool:
        """Whether everything written so far is in the store (in watch mode: and no file of
        the directory is unreadable)."""
        return self.oldest_unsynced_secs is None and not (self.watch is not None and self.watch.unreadable)

    def warning(self, warn_after: float = UNSYNCED_WARNING_SECS) -> str | None:
        """A one-line warning when data has waited more than ``warn_after`` seconds to reach
        the store (or the mount stopped writing to it), else ``None``."""
        if self.store is None:
            return None
        if self.error and not self.healthy:
            return f"WARNING: the store is not taking changes: {self.error}"
        age = self.oldest_unsynced_secs
        if age is not None and age > warn_after:
            return (
                f"WARNING: {format_bytes(self.pending_bytes + self.pending_metadata_bytes)} of changes "
                f"{format_age(age)} old are not in the store yet; a reset now would lose them "
                f"(run %tierfs sync, and check the backends)"
            )
        if self.watch is not None and self.watch.unreadable:
            names = ", ".join(p for p, _ in self.watch.unreadable[:3])
            more = f" and {len(self.watch.unreadable) - 3} more" if len(self.watch.unreadable) > 3 else ""
            return (
                f"WARNING: {len(self.watch.unreadable)} files of {self.path} cannot be read and are not in "
                f"the store: {names}{more} (see status().watch.unreadable)"
            )
        return None

    def format(self, warn_after: float = UNSYNCED_WARNING_SECS) -> str:
        """The status as ``%tierfs status`` prints it."""
        rows = [
            ("mount", f"{self.path} ({self.mode}{', read-only' if self.read_only else ''}, pid {self.pid})"),
        ]
        w = self.watch
        if w is not None:
            detection = f"{w.detection} ({w.detection_fallback})" if w.detection_fallback else w.detection
            rows.append(("watch", f"{detection}; started {w.start}; {w.passes} passes ({w.full_passes} full)"))
        if self.store is None:
            rows.append(("store", "none: hot tier only, nothing leaves this disk"))
        else:
            rows.append(("workspace", f"{self.workspace} in {self.store}"))
            if self.synced:
                rows.append(("pending", "nothing: every change is in the store"))
            else:
                rows.append(
                    (
                        "pending",
                        f"{format_bytes(self.pending_bytes)} in {self.pending_files} files, "
                        f"{format_bytes(self.pending_metadata_bytes)} of metadata; "
                        f"oldest {format_age(self.oldest_unsynced_secs or 0)}",
                    )
                )
            rows.append(("last snapshot", self.last_snapshot or "none since this mount started"))
        limit = format_bytes(self.cache_limit_bytes) if self.cache_limit_bytes else "no limit"
        rows.append(("cache", f"{format_bytes(self.cache_used_bytes)} used of {limit}"))
        for b in self.backends:
            state = "ok" if b.available else "DOWN"
            detail = f" ({b.consecutive_failures} failures; last: {b.last_error})" if b.consecutive_failures else ""
            rows.append(("backend", f"{state}  {b.name}{detail}"))
        if w is not None:
            if w.unstable:
                rows.append(("unstable", f"{', '.join(w.unstable)} (the store keeps their last good version)"))
            rows.extend(("unreadable", f"{p}: {why}") for p, why in w.unreadable)
        if self.error and self.healthy:
            rows.append(("last error", self.error))
        width = max(len(key) for key, _ in rows) + 2
        lines = [f"{key:<{width}}{value}" for key, value in rows]
        warning = self.warning(warn_after)
        if warning:
            lines.append(warning)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython shows a Status as its text, not as a 20-field dataclass repr.
        printer.text(self.format())


def format_bytes(n: int | None) -> str:
    """``1536`` → ``1.5 KiB`` (as the CLI writes sizes)."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_age(secs: float) -> str:
    """``75`` → ``1 min 15 s``."""
    if secs < 10:
        return f"{secs:.1f} s"
    whole = int(secs)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"
