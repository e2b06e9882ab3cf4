"""Mounting a workspace from Python: :func:`mount`, :class:`Mount` and :func:`mounted`.

Modelled on Colab's ``drive.mount`` (one call, idempotent, refuses a non-empty foreign
directory) and Modal volumes (``sync`` commits without unmounting). Every operation runs the
bundled ``tierfs`` command with ``--json``; the workspace is served by ``tierfs-daemon``,
a process of its own session, so it outlives the Python process and the Jupyter kernel: a
new kernel calls :func:`mount` again and gets a handle to the same mount.

Invariants:
- :func:`mount` either returns a handle to a live mount at ``path`` or raises, and when it
  raises nothing it started is left mounted (the CLI stops a daemon that failed to start;
  a mount that appeared anyway is unmounted again).
- A handle holds no resources: dropping it leaves the mount up; :meth:`Mount.unmount`
  ends it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, overload

from . import _cli, _mounttable
from .errors import CommandTimeoutError, InvalidInputError, NotFoundError, PathInUseError, TierfsError
from .progress import Progress
from .snapshots import Snapshot, snapshots
from .status import Status

__all__ = ["Mount", "mount", "mounted", "mounts", "attach"]

PathLike = str | os.PathLike[str]

#: Seconds a status query may take (the daemon answers from memory and its metadata).
STATUS_TIMEOUT = 30.0
#: Seconds ``tierfs mount`` may take beyond its own ``--timeout`` (opening the store file,
#: creating the embedded store).
_MOUNT_MARGIN = 60.0
#: The workspace that the CLI's default data directory belongs to.
_DEFAULT_WORKSPACE = "default"

_current: Mount | None = None
_current_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


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
        mode: ``"fuse"`` (a FUSE mount) or ``"watch"`` (a daemon in watch mode; ``mount()``
            does not fall back to it yet).
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
    ) -> None:
        self.path = path
        self.workspace = workspace
        self.store = store
        self.pid = pid
        self.data_dir = data_dir
        self.read_only = read_only
        self.reattached = reattached
        self.mode: Literal["fuse", "watch"] = "fuse"
        self.last_snapshot: Snapshot | None = None
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
        """Whether the kernel still has a tierfs mount at :attr:`path`."""
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

    def unmount(self, flush: bool = True, timeout: float = 300.0) -> None:
        """Unmounts the workspace.

        Args:
            flush: ``True`` waits until the daemon has written everything to the local disk
                and the store, unmounted and exited, and raises if the flush did not
                complete; ``False`` detaches the mount at once even if files are open
                (``umount --lazy``): the daemon flushes and exits once the last file is
                closed.
            timeout: seconds the flush, the unmount and the daemon's exit may take.

        Raises:
            TierfsError: the unmount or its flush failed (the message says what is left).
        """
        args = ["umount", "--timeout", str(max(1, int(timeout)))]
        if not flush:
            args.append("--lazy")
        args.append(self.path)
        _cli.run_json(args, timeout=timeout + STATUS_TIMEOUT)
        with _current_lock:
            global _current
            if _current is self:
                _current = None


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
    """The status of a live tierfs mount at ``path``, or ``None`` if nobody serves one."""
    entry = _mounttable.find(path)
    if entry is None or not entry.is_tierfs:
        return None
    try:
        return _status_report(path)
    except CommandTimeoutError:
        raise
    except TierfsError:
        # A dead daemon's stale mount: `tierfs mount` clears it.
        return None


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
    passphrase: str | None = None,
    takeover: bool = False,
    options: Sequence[str] = (),
    quiet: bool = False,
) -> Mount:
    """Mounts a workspace at ``path`` and returns a handle to it.

    Idempotent: when ``path`` is already a tierfs mount of this workspace (a re-run cell, a
    restarted kernel), it returns a handle to that mount and starts nothing. On a runtime
    whose local data is gone (a reset), the mount gets the workspace back from the store.

    Args:
        path: the mount point; created if missing, and it must be empty.
        store: the store file from ``tierfs init`` (S3 or ``file://`` backends).
            ``None``: ``$TIERFS_STORE`` if set, else the embedded default store in this
            machine's data home (created by the first mount; it survives a lost data dir,
            not a lost disk or a reset of the whole runtime).
        workspace: the workspace of the store to mount.
        readonly: mount read-only.
        cache_size: the local cache's limit, in bytes or as ``"10G"``; ``None``: no limit.
        timeout: seconds to wait for the mount to be ready (a restore may take a while).
        force_remount: unmount (with a flush) whatever tierfs mount is at ``path`` and
            mount again.
        passphrase: unlocks a store made with a passphrase (else ``$TIERFS_PASSPHRASE``).
            It reaches ``tierfs`` through its environment, never its command line.
        takeover: take the workspace over although another node's lease has not expired
            (after a reset, when the old runtime is gone for good).
        options: more ``tierfs mount`` options, e.g. ``["--dirty-age", "2"]``.
        quiet: print nothing (by default one line says what was mounted).

    Raises:
        PathInUseError: ``path`` is not empty, is another mount, or is a tierfs mount of
            another workspace (unless ``force_remount``).
        WrongKeyError: the passphrase or key file does not unlock the store.
        UnavailableError: the store does not answer (a mount waits up to ``timeout``).
        FencedError: another node holds the workspace's lease.
        TierfsError: any other failure, with the CLI's message.
    """
    target = _canonical(path)
    store_file = _absolute(store) if store is not None else None
    if store_file is None and os.environ.get("TIERFS_STORE"):
        store_file = _absolute(os.environ["TIERFS_STORE"])

    report = _served(target)
    if report is not None:
        existing = Mount._from_report(report, reattached=True, passphrase=passphrase)
        mismatch = _mismatch(existing, store_file, workspace, readonly)
        if mismatch is None and not force_remount:
            _say(quiet, f"tierfs: {target} is already mounted (pid {existing.pid}); reattached")
            _set_current(existing)
            return existing
        if not force_remount:
            raise PathInUseError(
                f"{target} is already a tierfs mount of {mismatch}; unmount it first "
                f"(tierfs.Mount.unmount or `tierfs umount {target}`) or pass force_remount=True"
            )
        existing.unmount(flush=True)

    args = ["mount", "--timeout", str(max(1, int(timeout))), "--workspace", workspace]
    if store_file is not None:
        args += ["--store", store_file]
    if workspace != _DEFAULT_WORKSPACE:
        # The CLI's default data dir (<data home>/default) is one per user, whatever the
        # workspace: give each workspace its own, so two workspaces never share local state.
        if store_file is None:
            raise InvalidInputError(
                f"workspace {workspace!r} needs store=...: the embedded default store is mounted "
                f"as workspace 'default' only"
            )
        args += ["--data-dir", os.path.join(_data_home(), workspace)]
    if readonly:
        args.append("--read-only")
    if cache_size is not None:
        args += ["--cache-size", str(cache_size)]
    if takeover:
        args.append("--takeover")
    args += [*options, "--", target]

    before = _mounttable.find(target)
    started = time.monotonic()
    try:
        info = _cli.run_json(args, timeout=timeout + _MOUNT_MARGIN, passphrase=passphrase)
    except TierfsError:
        _clear_half_mount(target, before)
        raise
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
    # The daemon knows what it mounted (the embedded store's file, no store at all).
    try:
        served = Mount._from_report(_status_report(handle.path), handle.reattached, passphrase)
        handle.store, handle.workspace, handle.read_only = served.store, served.workspace, served.read_only
        handle.mode = served.mode
    except TierfsError:
        pass
    where = f"workspace {handle.workspace!r} of {handle.store}" if handle.store else "no store (hot tier only)"
    _say(quiet, f"tierfs: mounted {handle.path} ({where}) in {time.monotonic() - started:.1f} s")
    _set_current(handle)
    return handle


def _mismatch(existing: Mount, store_file: str | None, workspace: str, readonly: bool) -> str | None:
    """How ``existing`` differs from what was asked for, or ``None``."""
    if existing.store is None:
        return "no store (hot tier only)"
    if (existing.workspace or _DEFAULT_WORKSPACE) != workspace:
        return f"workspace {existing.workspace!r}"
    if store_file is not None and os.path.realpath(store_file) != os.path.realpath(existing.store):
        return f"store {existing.store}"
    if existing.read_only != readonly:
        return "read-only" if existing.read_only else "read-write"
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
