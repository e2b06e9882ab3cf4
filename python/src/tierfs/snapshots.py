"""Snapshots of a workspace: :class:`Snapshot`, :func:`snapshots` and :func:`restore`.

A snapshot is a named, committed state of the whole workspace in its store
(``Mount.sync`` makes one). Listing and restoring need no mount: they read the store, so
they work after a runtime reset, from any machine that has the store file and its key.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import _cli
from .errors import CommandTimeoutError
from .progress import Progress

__all__ = ["Snapshot", "RestoreResult", "snapshots", "restore"]

PathLike = str | os.PathLike[str]

#: How long listing snapshots may take (it opens the store: a key derivation and a listing).
SNAPSHOTS_TIMEOUT = 300.0


@dataclass(frozen=True)
class Snapshot:
    """One committed state of a workspace.

    Attributes:
        id: the snapshot's id (give it to :func:`restore` or ``tierfs mount --snapshot``).
        seq: the last metadata batch it holds.
        entries: metadata entries in it.
        message: the message given to ``sync`` (``None`` without one).
        created: when it was committed (``None`` when the CLI did not say, as ``sync`` does not).
        data_bytes: file data the sync that made it uploaded (``None`` for a listed snapshot).
        millis: how long that sync took (``None`` for a listed snapshot).
    """

    id: str
    seq: int
    entries: int
    message: str | None = None
    created: datetime | None = None
    data_bytes: int | None = None
    millis: int | None = None

    @classmethod
    def from_listing(cls, info: Mapping[str, Any]) -> Snapshot:
        """From one entry of ``tierfs --json snapshots``."""
        created = info.get("created_unix")
        return cls(
            id=str(info["id"]),
            seq=int(info.get("seq", 0)),
            entries=int(info.get("entries", 0)),
            message=info.get("message"),
            created=datetime.fromtimestamp(int(created), tz=timezone.utc) if created else None,
        )

    @classmethod
    def from_sync(cls, report: Mapping[str, Any], message: str | None) -> Snapshot:
        """From the report of ``tierfs --json sync``."""
        return cls(
            id=str(report["snapshot"]),
            seq=int(report.get("seq", 0)),
            entries=int(report.get("entries", 0)),
            message=message,
            created=datetime.now(timezone.utc),
            data_bytes=int(report.get("data_bytes", 0)),
            millis=int(report.get("millis", 0)),
        )


@dataclass(frozen=True)
class RestoreResult:
    """What :func:`restore` wrote."""

    target: str
    snapshot: str | None
    files: int
    dirs: int
    symlinks: int
    hard_links: int
    bytes: int
    millis: int


def _store_args(store: PathLike | None, workspace: str) -> list[str]:
    args = ["--workspace", workspace]
    if store is not None:
        args = ["--store", os.fspath(Path(store).expanduser().absolute()), *args]
    return args


def snapshots(
    store: PathLike | None = None,
    workspace: str = "default",
    *,
    passphrase: str | None = None,
    timeout: float = SNAPSHOTS_TIMEOUT,
) -> list[Snapshot]:
    """The snapshots of ``workspace``, oldest first.

    Args:
        store: the store file (from ``tierfs init``); ``None``: ``$TIERFS_STORE``, else the
            embedded default store of this machine's data home.
        workspace: the workspace in the store.
        passphrase: unlocks a store made with a passphrase (else ``$TIERFS_PASSPHRASE``; a
            store with a key file needs none).
        timeout: seconds the listing may take.

    Raises:
        WrongKeyError: the passphrase does not unlock the store.
        NotFoundError: there is no such store.
        UnavailableError: the store does not answer.
    """
    listing = _cli.run_json(["snapshots", *_store_args(store, workspace)], timeout=timeout, passphrase=passphrase)
    return [Snapshot.from_listing(info) for info in listing]


def restore(
    target: PathLike,
    snapshot: str | None = None,
    store: PathLike | None = None,
    workspace: str = "default",
    *,
    passphrase: str | None = None,
    timeout: float = 3600.0,
    progress: bool | None = None,
) -> RestoreResult:
    """Writes a plain copy of the workspace (its latest state, or ``snapshot``) into
    ``target``, which must be empty or new. Needs no mount and takes no lease.

    Args:
        target: the directory to write (created if missing).
        snapshot: a snapshot id (see :func:`snapshots`); ``None``: the latest state.
        store: the store file; ``None`` as in :func:`snapshots`.
        workspace: the workspace in the store.
        passphrase: as in :func:`snapshots`.
        timeout: seconds the restore may take.
        progress: show the bytes written so far (``tqdm.auto``, or plain text without it);
            ``None`` shows it once the restore takes longer than a second.

    Raises:
        InvalidInputError: ``target`` is not empty.
        NotFoundError: no such snapshot or store.
        WrongKeyError: the passphrase does not unlock the store.
    """
    target_path = Path(target).expanduser().absolute()
    args = ["restore", *_store_args(store, workspace)]
    if snapshot is not None:
        args += ["--snapshot", snapshot]
    args.append(os.fspath(target_path))
    cmd = _cli.argv(args)
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli.command_env(passphrase),
    )
    # The CLI reports no progress with --json: what is on disk in the target tells it.
    done = threading.Event()
    bar = Progress("tierfs restore", total=None, show=progress)
    watcher = threading.Thread(target=_watch_size, args=(target_path, bar, done), daemon=True)
    watcher.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise CommandTimeoutError(
            f"restore into {target_path} did not finish within {timeout:g} s", command=cmd
        ) from None
    finally:
        done.set()
        watcher.join()
    report = _cli.parse(cmd, proc.returncode, stdout, stderr)
    bar.update_to(int(report.get("bytes", 0)))
    bar.close()
    return RestoreResult(
        target=os.fspath(target_path),
        snapshot=report.get("snapshot"),
        files=int(report.get("files", 0)),
        dirs=int(report.get("dirs", 0)),
        symlinks=int(report.get("symlinks", 0)),
        hard_links=int(report.get("hard_links", 0)),
        bytes=int(report.get("bytes", 0)),
        millis=int(report.get("millis", 0)),
    )


def _watch_size(target: Path, bar: Progress, done: threading.Event) -> None:
    while not done.wait(0.5):
        bar.update_to(_tree_bytes(target))


def _tree_bytes(root: Path) -> int:
    total = 0
    stack = [os.fspath(root)]
    started = time.monotonic()
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
        # A tree of millions of files: an estimate every half second is not worth more.
        if time.monotonic() - started > 0.2:
            break
    return total
