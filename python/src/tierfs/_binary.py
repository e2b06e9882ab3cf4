"""Finding the ``tierfs`` binary that came with this package.

The wheel carries ``tierfs`` and ``tierfs-daemon`` as scripts of the distribution: pip puts
them in the environment's ``bin`` directory (a venv's ``bin/``, ``/usr/local/bin`` for a
system install), side by side, which is where ``tierfs mount`` looks for the daemon. The
distribution's own file list (its ``RECORD``) says where they went, so the binary found is
the one installed with this module, never another ``tierfs`` that happens to be first on
``PATH``.

``TIERFS_BIN`` overrides it (a development build, a test of another binary).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from .errors import BinaryNotFoundError

_DIST = "tierfs"
_found: str | None = None


def _from_distribution() -> Iterator[Path]:
    try:
        dist = metadata.distribution(_DIST)
    except metadata.PackageNotFoundError:
        return
    for entry in dist.files or ():
        if entry.name == "tierfs" and entry.parent.name in ("bin", "scripts"):
            yield Path(str(dist.locate_file(entry))).resolve()


def _candidates() -> Iterator[Path]:
    yield from _from_distribution()
    # A layout the RECORD does not describe (an unusual installer): the scripts directory of
    # the running interpreter's scheme, then PATH.
    yield Path(sysconfig.get_path("scripts")) / "tierfs"
    yield Path(sys.prefix) / "bin" / "tierfs"
    which = shutil.which("tierfs")
    if which:
        yield Path(which)


def tierfs_binary() -> str:
    """The path of the ``tierfs`` executable to run.

    Raises:
        BinaryNotFoundError: when neither ``TIERFS_BIN`` nor the installed package has one.
    """
    global _found
    explicit = os.environ.get("TIERFS_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BinaryNotFoundError(f"TIERFS_BIN={explicit} is not an executable file")
        return explicit
    if _found is not None and os.access(_found, os.X_OK):
        return _found
    for candidate in _candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            _found = str(candidate)
            return _found
    raise BinaryNotFoundError(
        "the tierfs binary is missing: install this package from its wheel "
        "(`pip install tierfs-*.whl`, built by scripts/python.sh), or set TIERFS_BIN"
    )
