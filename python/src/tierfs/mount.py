"""Mounting a workspace from Python: :func:`mount`, :class:`Mount` and :func:`mounted`.

Modelled on Colab's ``drive.mount`` (one call, idempotent, refuses a non-empty foreign
directory) and Modal volumes (``sync`` commits without unmounting). Every operation runs the
bundled ``tierfs`` command with ``--json``; the workspace is served by ``tierfs-daemon``,
a process of its own session, so it outlives the Python process and the Jupyter kernel: a
new kernel calls :func:`mount` again and gets a handle to the same mount.

Where FUSE does not work (no ``/dev/fuse``, a device that does not open, a FUSE mount the
kernel refuses: a container without ``CAP_SYS_ADMIN``), :func:`mount` serves the same path
in *watch mode* instead (``tierfs watch``: the path stays a plain directory, and a watcher
syncs every change of it to the same workspace), says so in one line, and the handle's
``mode`` is ``"watch"``. ``mode="fuse"`` or ``mode="watch"`` (or ``$TIERFS_MODE``) picks
one. Options that only a FUSE mount can honour (``readonly=True``, ``--allow-other``, ...)
are refused in watch mode, never dropped.

Invariants:
- :func:`mount` either returns a handle to a live mount or watch at ``path`` or raises, and
  when it raises nothing it started is left mounted or watching (the CLI stops a daemon
  that failed to start; a mount that appeared anyway is unmounted again).
- A handle holds no resources: dropping it leaves the mount (or watch) up;
  :meth:`Mount.unmount` ends it.
- Watch mode is used only when FUSE cannot work here (or was asked for): an error of the
  store, the key or the path never turns into a fallback.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from . import _cli, _mounttable
from . import env as _env
from .errors import CommandTimeoutError, InvalidInputError, NotFoundError, PathInUseError, TierfsError
from .progress import Progress
from .snapshots import Snapshot, snapshots
from .status import Status
from .trash import Restored, TrashEntry, time_arg

__all__ = ["Mount", "MountMode", "mount", "mounted", "mounts", "attach"]

PathLike = str | os.PathLike[str]

#: How :func:`mount` serves a workspace: ``"auto"`` (a FUSE mount where FUSE works, else
#: watch mode), ``"fuse"`` (a FUSE mount or an error) or ``"watch"`` (always watch mode).
MountMode = Literal["auto", "fuse", "watch"]
_MODES = ("auto", "fuse", "watch")
#: The default of :func:`mount`'s ``mode`` (``auto`` when unset).
MODE_ENV = "TIERFS_MODE"
FUSE_DEVICE = "/dev/fuse"

#: Seconds a status query may take (the daemon answers from memory and its metadata).
STATUS_TIMEOUT = 30.0
#: How long a trash listing or restore may take (it replays the journal of the retention
#: window, then copies the file).
TRASH_TIMEOUT = 600.0
#: Seconds ``tierfs mount`` may take beyond its own ``--timeout`` (opening the store file,
#: creating the embedded store).
_MOUNT_MARGIN = 60.0
#: The workspace that the CLI's default data directory belongs to.
_DEFAULT_WORKSPACE = "default"

_current: Mount | None = None
_current_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
#: Why a FUSE mount failed in this process for want of FUSE: later ``mode="auto"`` mounts
#: go to watch mode without trying again.
_fuse_failure: str | None = None

#: What the options of ``tierfs mount`` that only a FUSE mount honours do: watch mode
#: refuses them (the CLI would ignore most of them, which would hide that they do nothing).
_FUSE_ONLY_OPTIONS = {
    "--read-only": "a watched directory is a plain directory and stays writable",
    "--snapshot": "a snapshot is mounted read-only; use tierfs.restore() for a copy of it",
    "--nonempty": "watch mode judges a non-empty directory against the workspace itself",
    "--no-store": "watch mode needs a store",
    "--allow-other": "a watched directory has its own permissions",
    "--no-allow-other": "a watched directory has its own permissions",
    "--writeback-cache": "there is no FUSE page cache",
    "--attr-ttl": "there is no FUSE attribute cache",
    "--entry-ttl": "there is no FUSE name cache",
    "--threads": "there are no FUSE requests",
    "--io-threads": "there are no FUSE requests",
}
# How the errors of `tierfs mount` that mean FUSE does not work here (reason
# `fuse_unavailable`: tierfs-daemon's `check_fuse_device` and `explain_mount_error`) say why;
# the reason decides, this only picks the words for the line that announces watch mode.
_FUSE_ERROR = re.compile(
    r"^(?:(/dev/fuse is missing)(?::.*)?|/dev/fuse cannot be opened \((.*)\): .*|checking /dev/fuse: (.*)"
    r"|mounting FUSE filesystem at .*?: (.*))$"
)


def _canonical(path: PathLike) -> str:
    # Never stat the mount point itself here: it may be a dead FUSE mount.
    return os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(path))))


def _absolute(path: PathLike) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _data_home() -> str:
    """Where the CLI keeps data (``paths::data_home``): ``$XDG_DATA_HOME/tierfs``, else
    ``~/.local/share/tierfs``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "tierfs")
    return os.path.join(os.path.expanduser("~"), ".local", "share", "tierfs")


def _set_current(m: Mount | None) -> None:
    global _current
    with _current_lock:
        _current = m


def current() -> Mount | None:
    """The mount the last :func:`mount` call of this process returned (if still mounted)."""
    with _current_lock:
        return _current


class Mount:
    """A handle to a live tierfs mount. Get one from :func:`mount` (or :func:`mounts`).

    Attributes:
        path: the mount point (canonical).
        workspace: the workspace of the store (``None`` for a mount without a store).
        store: the store file (``None``: hot tier only).
        pid: the serving daemon's process id.
        data_dir: the local data directory (cache and metadata).
        read_only: whether the mount refuses writes.
        reattached: ``True`` when :func:`mount` found this mount already running (a
            re-run cell, a restarted kernel) instead of starting it.
        mode: ``"fuse"`` (a FUSE mount) or ``"watch"`` (a plain directory that a watcher
            syncs to the workspace: where FUSE does not work, or when asked for).
        fallback_reason: why :func:`mount` started watch mode instead of a FUSE mount
            (``None`` for a FUSE mount, a watch asked for, or one found running).
        env: the workspace's environment when ``mount(..., env=...)`` activated one
            (:class:`tierfs.env.Env`), else ``None``.
    """

    def __init__(
        self,
        path: str,
        *,
        workspace: str | None,
        store: str | None,
        pid: int,
        data_dir: str,
        read_only: bool,
        reattached: bool = False,
        passphrase: str | None = None,
        mode: Literal["fuse", "watch"] = "fuse",
    ) -> None:
        self.path = path
        self.workspace = workspace
        self.store = store
        self.pid = pid
        self.data_dir = data_dir
        self.read_only = read_only
        self.reattached = reattached
        self.mode: Literal["fuse", "watch"] = mode
        self.fallback_reason: str | None = None
        self.last_snapshot: Snapshot | None = None
        self.env: _env.Env | None = None
        self._passphrase = passphrase

    @classmethod
    def _from_report(cls, report: Mapping[str, Any], reattached: bool, passphrase: str | None) -> Mount:
        remote = report.get("remote") or {}
        handle = cls(
            str(report["mountpoint"]),
            workspace=remote.get("workspace"),
            store=str(report["store"]) if report.get("store") else None,
            pid=int(report["pid"]),
            data_dir=str(report.get("data_dir", "")),
            read_only=bool(report.get("read_only", False)),
            reattached=reattached,
            passphrase=passphrase,
        )
        handle.mode = "watch" if report.get("watch") else "fuse"
        return handle

    def __repr__(self) -> str:
        where = f"workspace={self.workspace!r}, store={self.store!r}" if self.store else "no store"
        return f"<tierfs.Mount {self.path} ({self.mode}, {where}, pid {self.pid})>"

    def __fspath__(self) -> str:
        return self.path

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    @property
    def is_mounted(self) -> bool:
        """Whether the kernel still has a tierfs mount at :attr:`path` (in watch mode:
        whether a watcher still answers for it)."""
        if self.mode == "watch":
            try:
                return bool(_status_report(self.path).get("watch"))
            except TierfsError:
                return False
        entry = _mounttable.find(self.path)
        return entry is not None and entry.is_tierfs

    def status(self) -> Status:
        """The mount's state now: what is not yet in the store, the last snapshot, the
        cache, the backends.

        Raises:
            NotFoundError: the mount is gone.
        """
        return Status.from_report(_status_report(self.path))

    @overload
    def sync(
        self,
        message: str | None = ...,
        wait: Literal[True] = ...,
        *,
        timeout: float = ...,
        progress: bool | None = ...,
    ) -> Snapshot: ...

    @overload
    def sync(
        self,
        message: str | None = ...,
        wait: Literal[False] = ...,
        *,
        timeout: float = ...,
        progress: bool | None = ...,
    ) -> concurrent.futures.Future[Snapshot]: ...

    def sync(
        self,
        message: str | None = None,
        wait: bool = True,
        *,
        timeout: float = 3600.0,
        progress: bool | None = None,
    ) -> Snapshot | concurrent.futures.Future[Snapshot]:
        """Makes everything written so far durable in the store and commits a snapshot,
        without unmounting (a barrier: files still open are included).

        Args:
            message: stored with the snapshot (``tierfs snapshots`` shows it).
            wait: ``True`` returns the :class:`Snapshot` when it is committed; ``False``
                returns at once with a :class:`concurrent.futures.Future` of it.
            timeout: seconds the upload and commit may take before the sync fails
                (nothing is committed then).
            progress: show the upload's progress (``tqdm.auto``, else plain text);
                ``None`` shows it once the sync takes longer than a second.

        Raises:
            InvalidInputError: the mount has no store (nothing to sync to) or is read-only.
            UnavailableError: the data could not be uploaded within ``timeout``.
        """
        if wait:
            return self._sync(message, timeout, progress)
        return _background().submit(self._sync, message, timeout, False if progress is None else progress)

    def _sync(self, message: str | None, timeout: float, progress: bool | None) -> Snapshot:
        args = ["sync", "--timeout", str(max(1, int(timeout)))]
        if message is not None:
            args += ["--message", message]
        args.append(self.path)
        cmd = _cli.argv(args)
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_cli.command_env(self._passphrase),
        )
        done = threading.Event()
        bar = Progress(f"tierfs sync {self.path}", total=None, show=progress)
        watcher = threading.Thread(target=self._watch_upload, args=(bar, done), daemon=True)
        watcher.start()
        try:
            stdout, stderr = proc.communicate(timeout=timeout + STATUS_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise CommandTimeoutError(f"sync of {self.path} did not finish within {timeout:g} s", command=cmd) from None
        finally:
            done.set()
            watcher.join()
        try:
            report = _cli.parse(cmd, proc.returncode, stdout, stderr)
        finally:
            if bar.total and proc.returncode == 0:
                bar.update_to(bar.total)
            bar.close()
        snapshot = Snapshot.from_sync(report, message)
        self.last_snapshot = snapshot
        return snapshot

    def _watch_upload(self, bar: Progress, done: threading.Event) -> None:
        """Feeds ``bar`` from the mount's pending bytes while a sync runs (the CLI reports no
        progress of its own with ``--json``)."""
        total: int | None = None
        while True:
            try:
                s = self.status()
            except TierfsError:
                s = None
            if s is not None:
                pending = s.pending_bytes + s.pending_metadata_bytes
                if total is None or pending > total:
                    total = pending
                    bar.set_total(total or None)
                bar.update_to(total - pending)
            if done.wait(0.5):
                return

    def snapshots(self) -> list[Snapshot]:
        """The snapshots of this mount's workspace, oldest first (see :func:`tierfs.snapshots`)."""
        if self.store is None:
            raise InvalidInputError(f"{self.path} is mounted without a store: it has no snapshots")
        return snapshots(self.store, self.workspace or _DEFAULT_WORKSPACE, passphrase=self._passphrase)

    def layer(self, directory: PathLike) -> str:
        """Keeps what is installed into ``directory`` (``/usr/local``, ``/opt/x``) in this
        workspace: an overlay on it whose upper layer is in the mount (``tierfs layer add``;
        root only, FUSE mounts only). Run it again after a reset, once the workspace is
        mounted, and what was installed there is back. A no-op when the layer is on already.

        Returns:
            the upper directory, inside the mount, that holds the layer's files.

        Raises:
            InvalidInputError: not root, a watched directory, ``/``, or a directory that
                contains the mount or is inside it.
            PathInUseError: ``directory`` is another filesystem's mount point.
        """
        if self.mode == "watch":
            raise InvalidInputError(f"{self.path} is watched, not mounted: a layer needs a FUSE mount to keep it")
        info = _cli.run_json(["layer", "add", os.fspath(directory), "--in", self.path], timeout=STATUS_TIMEOUT)
        return str(info["upper"])

    def layers(self) -> list[str]:
        """The directories layered from this mount (see :meth:`layer`)."""
        keep = os.path.join(self.path, ".tierfs", "layers") + os.sep
        listed = _cli.run_json(["layer", "list"], timeout=STATUS_TIMEOUT)
        return [str(x["dir"]) for x in listed if str(x.get("upper") or "").startswith(keep)]

    def trash(self) -> list[TrashEntry]:
        """The files, symlinks and directories deleted or replaced (renamed over) in this
        workspace within the store's retention window (7 days by default), oldest first."""
        listing = _cli.run_json(["trash", "list", self.path], timeout=TRASH_TIMEOUT, passphrase=self._passphrase)
        return [TrashEntry.from_json(e) for e in listing]

    def restore(self, path: PathLike, at: str | datetime.datetime | None = None) -> Restored:
        """Puts a file, a symlink or a directory with its whole tree back through this mount:
        the version just before it was last deleted or replaced (a directory: before its
        ``rm -rf`` began), or with ``at`` (RFC 3339, ``"10m ago"``, or a datetime; naive is
        UTC) the version it had then. ``path`` is relative to the mount, or a path inside it.
        It lands at its path, or beside it (``NAME.restored-TIME``) when that is taken;
        nothing is overwritten.

        Raises:
            NotFoundError: nothing in the trash at ``path`` (or it did not exist at ``at``).
            InvalidInputError: ``path`` leads out of the mount, or is a device or a fifo.
        """
        target = os.path.join(self.path, os.fspath(path))
        args = ["trash", "restore", target]
        if at is not None:
            args += ["--at", time_arg(at)]
        return Restored.from_json(_cli.run_json(args, timeout=TRASH_TIMEOUT, passphrase=self._passphrase))

    def unmount(self, flush: bool = True, timeout: float = 300.0) -> None:
        """Unmounts the workspace (in watch mode: stops watching; the directory and its
        files stay). The layers this mount keeps (:meth:`layer`) come off first, so their
        directories show what the image ships again.

        Args:
            flush: ``True`` waits until the daemon has written everything to the local disk
                and the store, unmounted and exited, and raises if the flush did not
                complete (in watch mode after a last full pass: ``tierfs unwatch``);
                ``False`` detaches the mount at once even if files are open
                (``umount --lazy``): the daemon flushes and exits once the last file is
                closed. In watch mode ``False`` sends the watcher SIGTERM and returns: it
                makes its last pass, flushes and exits on its own (within its
                ``--flush-timeout``, 60 s by default).
            timeout: seconds the flush, the unmount and the daemon's exit may take.

        Raises:
            TierfsError: the unmount or its flush failed (the message says what is left).
        """
        if self.mode == "watch" and not flush:
            self._stop_watcher()
        else:
            if self.mode != "watch" and os.geteuid() == 0:
                for directory in self.layers():
                    _cli.run_json(["layer", "remove", directory], timeout=STATUS_TIMEOUT)
            args = ["unwatch" if self.mode == "watch" else "umount", "--timeout", str(max(1, int(timeout)))]
            if not flush:
                args.append("--lazy")
            args.append(self.path)
            _cli.run_json(args, timeout=timeout + STATUS_TIMEOUT)
        with _current_lock:
            global _current
            if _current is self:
                _current = None

    def _stop_watcher(self) -> None:
        """SIGTERM to the process that watches :attr:`path` now (asked by its control
        socket, so a reused pid is never signalled)."""
        report = _status_report(self.path)
        if not report.get("watch"):
            raise NotFoundError(f"{self.path} is not watched (it is a FUSE mount now)")
        pid = int(report["pid"])
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return  # it stopped on its own meanwhile
        except PermissionError as err:
            raise TierfsError(f"stopping the watcher of {self.path} (pid {pid}): {err}") from None


def _background() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _current_lock:
        if _executor is None:
            # One worker: syncs of one process run one after the other, in order.
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tierfs-sync")
        return _executor


def _status_report(path: str, timeout: float = STATUS_TIMEOUT) -> Mapping[str, Any]:
    report = _cli.run_json(["status", path], timeout=timeout)
    if not isinstance(report, dict):
        raise TierfsError(f"unexpected status answer for {path}: {report!r}")
    return report


def _served(path: str) -> Mapping[str, Any] | None:
    """The status of a live tierfs mount or watch at ``path``, or ``None`` if nobody
    serves one."""
    entry = _mounttable.find(path)
    fuse = entry is not None and entry.is_tierfs
    try:
        report = _status_report(path)
    except CommandTimeoutError:
        raise
    except TierfsError:
        # Nothing answers: no mount, or a dead daemon's stale mount (`tierfs mount` clears
        # it). A watched directory has no mount of its own; its watcher answers here.
        return None
    return report if fuse or report.get("watch") else None


def attach(path: PathLike, *, passphrase: str | None = None) -> Mount:
    """A handle to the tierfs mount already at ``path``, whatever its workspace; starts
    nothing.

    Raises:
        NotFoundError: no live tierfs mount is at ``path``.
    """
    target = _canonical(path)
    report = _served(target)
    if report is None:
        raise NotFoundError(f"{target} is not a tierfs mount (or its daemon is gone)")
    return Mount._from_report(report, reattached=True, passphrase=passphrase)


def mounts() -> list[Mount]:
    """Every tierfs mount of this user that answers, sorted by mount point."""
    reports = _cli.run_json(["status"], timeout=STATUS_TIMEOUT)
    return [Mount._from_report(r, reattached=True, passphrase=None) for r in reports]


def mount(
    path: PathLike,
    store: PathLike | None = None,
    workspace: str = "default",
    readonly: bool = False,
    cache_size: int | str | None = None,
    timeout: float = 120,
    force_remount: bool = False,
    *,
    mode: MountMode | None = None,
    passphrase: str | None = None,
    takeover: bool = False,
    refill: bool = True,
    options: Sequence[str] = (),
    quiet: bool = False,
    env: bool | PathLike = False,
) -> Mount:
    """Mounts a workspace at ``path`` and returns a handle to it.

    Idempotent: when ``path`` is already a tierfs mount (or watch) of this workspace (a
    re-run cell, a restarted kernel), it returns a handle to that mount and starts nothing.
    On a runtime whose local data is gone (a reset), the mount gets the workspace back from
    the store.

    Without FUSE (no ``/dev/fuse``, a device that does not open, or a FUSE mount that fails
    for want of FUSE: no ``CAP_SYS_ADMIN``, no ``fusermount3``), the same call serves the
    workspace in watch mode on the same path (``tierfs watch``): ``path`` stays a plain
    directory, an empty one gets the workspace restored into it, and a watcher syncs every
    change to the store; one line says so, and the handle's ``mode`` is ``"watch"``.
    ``sync``, ``status``, ``unmount`` (``tierfs unwatch``) and reattaching work the same.

    Args:
        path: the mount point; created if missing, and it must be empty (in watch mode it
            may also hold this workspace's files already: the watcher resumes).
        store: the store file from ``tierfs init`` (S3 or ``file://`` backends).
            ``None``: ``$TIERFS_STORE`` if set, else the embedded default store in this
            machine's data home (created by the first mount; it survives a lost data dir,
            not a lost disk or a reset of the whole runtime).
        workspace: the workspace of the store to mount.
        readonly: mount read-only (FUSE only: refused in watch mode, where the directory
            stays writable).
        cache_size: the local cache's limit, in bytes or as ``"10G"``; ``None``: no limit.
            In watch mode it bounds only the data dir's cache of what a restore fetched:
            ``path`` itself holds every byte of the workspace.
        timeout: seconds to wait for the mount to be ready (a restore may take a while).
        force_remount: unmount (with a flush) whatever tierfs mount or watch is at ``path``
            and mount again.
        mode: ``"auto"`` (FUSE where it works, else watch mode), ``"fuse"`` (never watch
            mode: fail where FUSE does not work) or ``"watch"`` (watch mode even where FUSE
            works). ``None``: ``$TIERFS_MODE`` if set, else ``"auto"``.
        passphrase: unlocks a store made with a passphrase (else ``$TIERFS_PASSPHRASE``).
            It reaches ``tierfs`` through its environment, never its command line.
        takeover: take the workspace over although another node's lease has not expired
            (after a reset, when the old runtime is gone for good).
        refill: on a runtime whose cache is empty (after a reset), fetch the files the
            workspace's last runtime held back into the cache in the background (reads never
            wait behind it; ``status()`` shows its progress). ``False``: ``--no-refill``.
            Watch mode has no cache to refill: its directory holds every file.
        options: more ``tierfs mount`` options, e.g. ``["--dirty-age", "2"]``; in watch
            mode the FUSE-only ones (``--allow-other``, ``--writeback-cache``, TTLs,
            threads, ``--read-only``, ``--snapshot``, ``--nonempty``, ``--no-store``) are
            refused.
        quiet: print nothing (by default one line says what was mounted, and why watch
            mode when it fell back to it).
        env: ``True`` keeps a Python environment in the workspace (``.tierfs/env``; a
            relative path names another directory of it) and activates it in this process:
            its site-packages on ``sys.path``, ``%pip install`` installing into it, the pip,
            Hugging Face and torch caches in ``.tierfs/cache`` (:mod:`tierfs.env`). After a
            reset the same call makes everything installed there importable again. An env
            another Python made is set aside (renamed) with one line, and a new one made.

    Raises:
        PathInUseError: ``path`` is not empty, is another mount, or is a tierfs mount of
            another workspace (unless ``force_remount``); in watch mode: ``path`` is not
            empty and does not hold this workspace.
        InvalidInputError: an option that watch mode cannot honour, when watch mode is
            what this runtime (or ``mode``) gives; a bad ``mode``.
        WrongKeyError: the passphrase or key file does not unlock the store.
        UnavailableError: the store does not answer (a mount waits up to ``timeout``);
            with ``mode="fuse"``, also FUSE not working here.
        FencedError: another node holds the workspace's lease.
        CorruptError: the env's record does not decode (reason ``env_record``); a mount
            this call started is unmounted again.
        TierfsError: any other failure, with the CLI's message.
    """
    handle = _mount(
        path,
        store,
        workspace,
        readonly,
        cache_size,
        timeout,
        force_remount,
        mode=mode,
        passphrase=passphrase,
        takeover=takeover,
        refill=refill,
        options=options,
        quiet=quiet,
    )
    if env is not False:
        activate_env(handle, env, quiet)
    return handle


def activate_env(handle: Mount, env: bool | PathLike = True, quiet: bool = False) -> None:
    """Prepares and activates the env of ``handle``'s workspace in this process (what
    ``mount(..., env=env)`` and ``%tierfs env`` do). On failure a mount that :func:`mount`
    started (not one it reattached to) is unmounted again, so nothing it started is left,
    and the error raised."""
    started = time.monotonic()
    try:
        found = _env.prepare(handle.path, env, say=lambda line: _say(False, line))
    except TierfsError:
        if not handle.reattached:
            with contextlib.suppress(TierfsError):
                handle.unmount(flush=True)
        raise
    _env.activate(found)
    handle.env = found
    what = "made" if found.created else "activated"
    secs = time.monotonic() - started
    _say(quiet, f"tierfs: environment {found.path} {what} ({found.record.describe()}) in {secs:.1f} s")


def _mount(
    path: PathLike,
    store: PathLike | None,
    workspace: str,
    readonly: bool,
    cache_size: int | str | None,
    timeout: float,
    force_remount: bool,
    *,
    mode: MountMode | None,
    passphrase: str | None,
    takeover: bool,
    refill: bool,
    options: Sequence[str],
    quiet: bool,
) -> Mount:
    global _fuse_failure
    mode = _resolve_mode(mode)
    target = _canonical(path)
    store_file = _absolute(store) if store is not None else None
    if store_file is None and os.environ.get("TIERFS_STORE"):
        store_file = _absolute(os.environ["TIERFS_STORE"])

    report = _served(target)
    if report is not None:
        existing = Mount._from_report(report, reattached=True, passphrase=passphrase)
        mismatch = _mismatch(existing, store_file, workspace, readonly, mode)
        if mismatch is None and not force_remount:
            what = "watched" if existing.mode == "watch" else "mounted"
            _say(quiet, f"tierfs: {target} is already {what} (pid {existing.pid}); reattached")
            _set_current(existing)
            return existing
        if not force_remount:
            verb = "unwatch" if existing.mode == "watch" else "umount"
            raise PathInUseError(
                f"{target} is already {_noun(existing)} {mismatch}; unmount it first "
                f"(tierfs.Mount.unmount or `tierfs {verb} {target}`) or pass force_remount=True"
            )
        existing.unmount(flush=True)

    common = ["--timeout", str(max(1, int(timeout))), "--workspace", workspace]
    if store_file is not None:
        common += ["--store", store_file]
    if workspace != _DEFAULT_WORKSPACE:
        # The CLI's default data dir (<data home>/default) is one per user, whatever the
        # workspace: give each workspace its own, so two workspaces never share local state.
        if store_file is None:
            raise InvalidInputError(
                f"workspace {workspace!r} needs store=...: the embedded default store is mounted "
                f"as workspace 'default' only"
            )
        common += ["--data-dir", os.path.join(_data_home(), workspace)]
    if cache_size is not None:
        common += ["--cache-size", str(cache_size)]
    if takeover:
        common.append("--takeover")
    if not refill:
        common.append("--no-refill")
    extra = list(options)
    serve = _Serve(target, store_file, workspace, passphrase, timeout, quiet)

    fallback = None
    if mode == "auto":
        fallback = _fuse_failure or _fuse_problem()
    if mode == "watch" or fallback is not None:
        _refuse_in_watch_mode(target, readonly, extra, fallback)
        return serve.watch([*common, *extra], fallback)

    args = ["mount", *common]
    if readonly:
        args.append("--read-only")
    args += [*extra, "--", target]
    before = _mounttable.find(target)
    started = time.monotonic()
    try:
        info = _cli.run_json(args, timeout=timeout + _MOUNT_MARGIN, passphrase=passphrase)
    except TierfsError as err:
        _clear_half_mount(target, before)
        if mode != "auto":
            raise
        fallback = _fuse_error_reason(err)
        if fallback is None and isinstance(err, PathInUseError) and _refuses_the_directory(err):
            # The CLI judged the directory before trying FUSE: whether FUSE works at all
            # decides between this refusal and watch mode (which judges it itself).
            fallback = _probe_fuse()
        if fallback is None:
            raise
        _fuse_failure = fallback
        _refuse_in_watch_mode(target, readonly, extra, fallback)
        return serve.watch([*common, *extra], fallback)
    handle = Mount(
        str(info.get("mountpoint", target)),
        workspace=workspace if store_file is not None or workspace == _DEFAULT_WORKSPACE else None,
        store=store_file,
        pid=int(info["pid"]),
        data_dir=str(info.get("data_dir", "")),
        read_only=readonly,
        reattached=bool(info.get("already_mounted", False)),
        passphrase=passphrase,
    )
    serve.refresh(handle)
    where = f"workspace {handle.workspace!r} of {handle.store}" if handle.store else "no store (hot tier only)"
    _say(quiet, f"tierfs: mounted {handle.path} ({where}) in {time.monotonic() - started:.1f} s")
    _set_current(handle)
    return handle


class _Serve:
    """What :func:`mount` needs to start watch mode and to read back what it started."""

    def __init__(
        self, target: str, store_file: str | None, workspace: str, passphrase: str | None, timeout: float, quiet: bool
    ) -> None:
        self.target = target
        self.store_file = store_file
        self.workspace = workspace
        self.passphrase = passphrase
        self.timeout = timeout
        self.quiet = quiet

    def refresh(self, handle: Mount) -> None:
        """The daemon knows what it serves (the embedded store's file, no store at all)."""
        try:
            served = Mount._from_report(_status_report(handle.path), handle.reattached, self.passphrase)
        except TierfsError:
            return
        handle.store, handle.workspace, handle.read_only = served.store, served.workspace, served.read_only
        handle.mode = served.mode

    def watch(self, args: list[str], fallback: str | None) -> Mount:
        """Runs ``tierfs watch ARGS -- TARGET``; ``fallback`` says why (``None``: asked for)."""
        started = time.monotonic()
        # `tierfs watch` refuses a missing directory; mount() creates it, as `tierfs mount` does.
        with contextlib.suppress(OSError):
            os.makedirs(self.target, exist_ok=True)
        # A failed watch leaves nothing: the CLI stops a watcher that did not get ready.
        info = _cli.run_json(
            ["watch", *args, "--", self.target], timeout=self.timeout + _MOUNT_MARGIN, passphrase=self.passphrase
        )
        handle = Mount(
            str(info.get("mountpoint", self.target)),
            workspace=self.workspace,
            store=self.store_file,
            pid=int(info["pid"]),
            data_dir=str(info.get("data_dir", "")),
            read_only=False,
            reattached=bool(info.get("already_mounted", False)),
            passphrase=self.passphrase,
            mode="watch",
        )
        self.refresh(handle)
        handle.fallback_reason = fallback
        secs = time.monotonic() - started
        where = f"workspace {handle.workspace!r} of {handle.store}"
        if fallback is None:
            line = f"tierfs: watching {handle.path} (watch mode, as asked; {where}) in {secs:.1f} s"
        else:
            line = (
                f"tierfs: no FUSE here ({fallback}): watching {handle.path} instead (watch mode: a plain "
                f"directory synced to {where}) in {secs:.1f} s"
            )
        _say(self.quiet, line)
        _set_current(handle)
        return handle


def _resolve_mode(mode: str | None) -> MountMode:
    chosen = mode if mode is not None else (os.environ.get(MODE_ENV) or "auto")
    if chosen not in _MODES:
        source = "mode" if mode is not None else f"${MODE_ENV}"
        raise InvalidInputError(f"{source}={chosen!r} is not a mount mode: use 'auto', 'fuse' or 'watch'")
    return chosen  # type: ignore[return-value]


def _fuse_problem() -> str | None:
    """Why FUSE cannot work here, when that is certain without trying a mount: the device
    is missing, or opening it fails in a way no helper gets around (no driver, a device
    cgroup that denies it). ``None``: a FUSE mount is worth trying (a non-root user who may
    not open the device may still mount through the setuid ``fusermount3``)."""
    try:
        fd = os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{FUSE_DEVICE} is missing"
    except OSError as err:
        if err.errno in (errno.ENODEV, errno.ENXIO, errno.EPERM):
            return f"{FUSE_DEVICE} cannot be opened: {os.strerror(err.errno)}"
        return None
    os.close(fd)
    return None


def _fuse_error_reason(err: TierfsError) -> str | None:
    """Why FUSE does not work here, when ``err`` (a failed ``tierfs mount``) says so (its
    reason is ``fuse_unavailable``); else ``None``. A mount refused for an option
    (``allow_other`` without ``user_allow_other``) has no such reason: the user's to fix,
    not a reason for watch mode."""
    if err.reason != "fuse_unavailable":
        return None
    message = err.message.strip()
    first = message.splitlines()[0] if message else ""
    found = _FUSE_ERROR.match(first)
    if found is None:
        return first or "FUSE is not available here"
    if found.group(1):
        return found.group(1)
    device_error = found.group(2) or found.group(3)
    if device_error:
        return f"{FUSE_DEVICE}: {device_error}"
    return f"the FUSE mount failed: {found.group(4).strip()}"


def _refuses_the_directory(err: TierfsError) -> bool:
    """A refusal of the mount point itself (not empty, another filesystem's mount point),
    which the CLI checks before it tries FUSE (its reason ``mountpoint_taken``)."""
    return err.reason == "mountpoint_taken"


def _probe_fuse() -> str | None:
    """Mounts a scratch directory by FUSE (hot tier only) and unmounts it again: why FUSE
    does not work here, or ``None`` when it does (or the probe failed for another reason)."""
    scratch = tempfile.mkdtemp(prefix="tierfs-probe-")
    point = os.path.join(scratch, "mnt")
    try:
        try:
            _cli.run_json(
                ["mount", "--timeout", "30", "--no-store", "--data-dir", os.path.join(scratch, "data"), "--", point],
                timeout=30 + _MOUNT_MARGIN,
            )
        except TierfsError as err:
            _clear_half_mount(point, None)
            return _fuse_error_reason(err)
        with contextlib.suppress(TierfsError):
            _cli.run_json(["umount", "--timeout", "60", point], timeout=90)
        return None
    finally:
        entry = _mounttable.find(os.path.realpath(point))
        if entry is None:  # never delete through a mount that is still there
            shutil.rmtree(scratch, ignore_errors=True)


def _refuse_in_watch_mode(target: str, readonly: bool, options: Sequence[str], fallback: str | None) -> None:
    """Raises :class:`InvalidInputError`, before anything starts, for what watch mode cannot
    honour."""
    refused = []
    if readonly:
        refused.append("readonly=True (a watched directory is a plain directory and stays writable)")
    for option in options:
        name = option.split("=", 1)[0]
        if name in _FUSE_ONLY_OPTIONS:
            refused.append(f"{name} ({_FUSE_ONLY_OPTIONS[name]})")
    if not refused:
        return
    why = f"FUSE is not available here ({fallback}), so" if fallback is not None else "with mode='watch'"
    raise InvalidInputError(
        f"{why} {target} would be served in watch mode, which cannot honour "
        f"{'; '.join(refused)}. Drop {'it' if len(refused) == 1 else 'them'} to watch {target}, or mount "
        f"where FUSE works (tierfs.restore() makes a plain copy of a snapshot)"
    )


def _noun(existing: Mount) -> str:
    return "a tierfs watch" if existing.mode == "watch" else "a tierfs mount"


def _mismatch(existing: Mount, store_file: str | None, workspace: str, readonly: bool, mode: str) -> str | None:
    """How ``existing`` differs from what was asked for, or ``None``."""
    if existing.store is None:
        return "without a store (hot tier only)"
    if (existing.workspace or _DEFAULT_WORKSPACE) != workspace:
        return f"of workspace {existing.workspace!r}"
    if store_file is not None and os.path.realpath(store_file) != os.path.realpath(existing.store):
        return f"of store {existing.store}"
    if existing.read_only != readonly:
        return "that is read-only" if existing.read_only else "that is read-write (readonly=True was asked for)"
    if mode != "auto" and existing.mode != mode:
        return f"(mode={mode!r} was asked for)"
    return None


def _clear_half_mount(target: str, before: _mounttable.MountEntry | None) -> None:
    """After a failed mount: a tierfs mount at ``target`` that was not there before is
    unmounted again, so a failure never leaves a mount behind."""
    after = _mounttable.find(target)
    if after is None or not after.is_tierfs or after == before:
        return
    with contextlib.suppress(TierfsError):
        _cli.run_json(["umount", "--timeout", "60", target], timeout=90)


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, file=sys.stdout, flush=True)


@contextlib.contextmanager
def mounted(
    path: PathLike,
    store: PathLike | None = None,
    workspace: str = "default",
    readonly: bool = False,
    cache_size: int | str | None = None,
    timeout: float = 120,
    force_remount: bool = False,
    *,
    unmount_timeout: float = 300.0,
    **kwargs: Any,
) -> Iterator[Mount]:
    """``with tierfs.mounted(path, ...) as m:`` mounts as :func:`mount` does and unmounts,
    with a flush, when the block ends (also when it raises)."""
    m = mount(path, store, workspace, readonly, cache_size, timeout, force_remount, **kwargs)
    try:
        yield m
    finally:
        m.unmount(flush=True, timeout=unmount_timeout)
