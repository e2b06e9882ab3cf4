"""tierfs for notebooks: a workspace that survives runtime resets, mounted from Python.

The package drives the ``tierfs`` and ``tierfs-daemon`` binaries that its wheel installs
(no Rust toolchain needed on the runtime)::

    import tierfs

    m = tierfs.mount("/content/work", store="/content/drive/tierfs/store.toml")
    ...                                  # work in /content/work as on a local disk
    snap = m.sync("epoch 3")             # everything so far is in the store, as a snapshot
    print(m.status())                    # what is not in the store yet, cache, backends
    tierfs.snapshots("/content/drive/tierfs/store.toml")
    m.unmount()

After a runtime reset, ``pip install`` the wheel again and call the same ``mount``: the
workspace comes back from the store. In a notebook, ``%load_ext tierfs`` adds
``%tierfs status``, ``%tierfs sync "msg"`` and ``%tierfs snapshots``.

The daemon that serves a mount outlives the kernel: after a kernel restart, ``mount()``
with the same arguments returns a handle to the running mount.

Without FUSE (no ``/dev/fuse``, or a FUSE mount the runtime refuses), ``mount()`` serves the
same path in watch mode (a plain directory that a watcher syncs to the store), says so in
one line and reports ``mode == "watch"``; ``mode="fuse"`` / ``"watch"`` or ``$TIERFS_MODE``
choose one.

``mount(..., env=True)`` keeps a Python environment in the workspace (``.tierfs/env``) and
activates it in this kernel, so ``%pip install`` survives a reset too (:mod:`tierfs.env`;
``eval "$(python -m tierfs env activate DIR)"`` in a shell).

Modules: :mod:`tierfs.mount` (mount, Mount), :mod:`tierfs.env` (the environment),
:mod:`tierfs.status` (Status),
:mod:`tierfs.snapshots` (Snapshot, snapshots, restore), :mod:`tierfs.errors` (the
exceptions), :mod:`tierfs.magics` (the IPython magics), :mod:`tierfs.progress`.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from ._binary import tierfs_binary
from .errors import (
    BinaryNotFoundError,
    CommandTimeoutError,
    ConflictError,
    CorruptError,
    FencedError,
    InternalError,
    InvalidInputError,
    NoSpaceError,
    NotFoundError,
    PathInUseError,
    TierfsError,
    UnavailableError,
    WrongKeyError,
)
from .magics import load_ipython_extension, unload_ipython_extension
from .mount import Mount, MountMode, attach, mount, mounted, mounts
from .snapshots import RestoreResult, Snapshot, restore, snapshots
from .status import UNSYNCED_WARNING_SECS, BackendHealth, Status, WatchState
from .trash import Restored, TrashEntry

try:
    __version__ = _metadata.version("tierfs")
except _metadata.PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "0+unknown"

__all__ = [
    "mount",
    "mounted",
    "mounts",
    "attach",
    "Mount",
    "MountMode",
    "Status",
    "BackendHealth",
    "WatchState",
    "Snapshot",
    "RestoreResult",
    "TrashEntry",
    "Restored",
    "snapshots",
    "restore",
    "tierfs_binary",
    "UNSYNCED_WARNING_SECS",
    "TierfsError",
    "NotFoundError",
    "ConflictError",
    "PathInUseError",
    "FencedError",
    "UnavailableError",
    "CommandTimeoutError",
    "NoSpaceError",
    "InvalidInputError",
    "WrongKeyError",
    "CorruptError",
    "InternalError",
    "BinaryNotFoundError",
    "load_ipython_extension",
    "unload_ipython_extension",
]
