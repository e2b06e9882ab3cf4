"""IPython magics: ``%load_ext tierfs`` gives ``%tierfs status``, ``%tierfs sync "msg"``,
``%tierfs snapshots``, ``%tierfs trash``, ``%tierfs undo PATH`` and ``%tierfs env`` (the
workspace's Python environment, activated in this kernel as ``mount(..., env=True)`` does).

Each magic works on one mount: the ``PATH`` it is given, else the mount returned by the
last :func:`tierfs.mount` of this kernel, else the only tierfs mount of this user (so the
magics work in a restarted kernel before ``mount()`` was called again). They print text
(``%tierfs status`` with a warning line when unsynced data waits too long) and return
nothing, so a cell shows no ``Out[]`` value.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from . import mount as _mount
from .errors import NotFoundError
from .snapshots import Snapshot
from .status import UNSYNCED_WARNING_SECS, format_bytes

__all__ = ["load_ipython_extension", "tierfs_magic"]

_USAGE = """\
%tierfs status [PATH] [--warn-after SECS]   what is not yet in the store, last snapshot, cache, backends
%tierfs sync ["MESSAGE"] [--path PATH]      upload everything and commit a snapshot
%tierfs snapshots [PATH]                    the workspace's snapshots, oldest first
%tierfs trash [PATH]                        files deleted or replaced in the last 7 days
%tierfs undo PATH [--at TIME]               put a deleted or replaced file or directory back (beside it if taken)
%tierfs mounts                              every tierfs mount of this user
%tierfs env [PATH] [--env DIR]              keep a Python env in the workspace and use it in this kernel"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would call sys.exit
        raise _UsageError(f"{message}\n{_USAGE}")


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%tierfs", add_help=False)
    sub = p.add_subparsers(dest="command")
    status = sub.add_parser("status", add_help=False)
    status.add_argument("path", nargs="?")
    status.add_argument("--warn-after", type=float, default=UNSYNCED_WARNING_SECS)
    sync = sub.add_parser("sync", add_help=False)
    sync.add_argument("message", nargs="?")
    sync.add_argument("--path")
    snaps = sub.add_parser("snapshots", add_help=False)
    snaps.add_argument("path", nargs="?")
    trash = sub.add_parser("trash", add_help=False)
    trash.add_argument("path", nargs="?")
    undo = sub.add_parser("undo", add_help=False)
    undo.add_argument("file")
    undo.add_argument("--at")
    sub.add_parser("mounts", add_help=False)
    env = sub.add_parser("env", add_help=False)
    env.add_argument("path", nargs="?")
    env.add_argument("--env", default=True)
    sub.add_parser("help", add_help=False)
    return p


def _target(path: str | None) -> _mount.Mount:
    if path:
        return _mount.attach(path)
    m = _mount.current()
    if m is not None and m.is_mounted:
        return m
    found = _mount.mounts()
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFoundError("no tierfs mount is running: mount one with tierfs.mount(PATH)")
    raise NotFoundError(
        "several tierfs mounts are running (" + ", ".join(m.path for m in found) + "); say which: %tierfs status PATH"
    )


def format_snapshots(listing: list[Snapshot], mark: str | None = None) -> str:
    """The ``%tierfs snapshots`` table; ``mark`` flags one id (the last sync's)."""
    if not listing:
        return 'no snapshots yet: %tierfs sync "message" takes one'
    rows = []
    for s in listing:
        when = s.created.strftime("%Y-%m-%d %H:%M:%S UTC") if s.created else "-"
        flag = "  <- last sync" if mark is not None and s.id == mark else ""
        rows.append(f"{s.id}  {when}  {s.entries:>7} entries  {s.message or ''}{flag}")
    return "\n".join(rows)


def tierfs_magic(line: str) -> None:
    """``%tierfs COMMAND ...``: see ``%tierfs help``."""
    try:
        args = _parser().parse_args(shlex.split(line))
    except _UsageError as err:
        print(err)
        return
    if args.command in (None, "help"):
        print(_USAGE)
        return
    if args.command == "mounts":
        found = _mount.mounts()
        print("\n".join(repr(m) for m in found) if found else "no tierfs mounts")
        return
    if args.command == "undo":
        _undo(args.file, args.at)
        return
    m = _target(getattr(args, "path", None))
    if args.command == "status":
        print(m.status().format(warn_after=args.warn_after))
    elif args.command == "sync":
        snap = m.sync(args.message)
        said = f" {snap.message!r}" if snap.message else ""
        print(
            f"snapshot {snap.id}{said} committed: {format_bytes(snap.data_bytes or 0)} of data "
            f"uploaded in {snap.millis} ms"
        )
    elif args.command == "env":
        _mount.activate_env(m, args.env)
    elif args.command == "snapshots":
        mark = m.last_snapshot.id if m.last_snapshot else m.status().last_snapshot
        print(format_snapshots(m.snapshots(), mark))
    elif args.command == "trash":
        listing = m.trash()
        rows = [f"{e.time}  {e.what:<8}  {e.size:>12} B  {e.path}{'/' if e.kind == 'dir' else ''}" for e in listing]
        print("\n".join(rows) if rows else f"the trash of {m.path} is empty")


def _undo(file: str, at: str | None) -> None:
    """``%tierfs undo PATH``: the mount PATH lies in (else the current one) puts it back."""
    absolute = os.path.abspath(file)
    inside = [m for m in _mount.mounts() if absolute.startswith(m.path.rstrip("/") + "/")]
    m = inside[0] if inside else _target(None)
    done = m.restore(absolute if inside else file, at=at)
    where = f"beside it as {done.restored_as}" if done.beside else f"at {done.path}"
    what = f"{done.entries} entries" if done.kind == "dir" else f"{done.size} bytes"
    print(f"restored {file} as of {done.version} ({what}) {where}")
    if done.incomplete:
        print("incomplete: its data at that time had not all reached the store; restored as the store had it")


def load_ipython_extension(ipython: Any) -> None:
    """Registers ``%tierfs`` (``%load_ext tierfs`` calls this)."""
    ipython.register_magic_function(tierfs_magic, magic_kind="line", magic_name="tierfs")


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo: the magic is replaced on the next load."""
