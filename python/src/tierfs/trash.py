"""The trash of a live mount: files, symlinks and directory trees deleted or replaced
(renamed over) within the store's retention window, and putting one back (``tierfs trash
list|restore --json``).

The CLI reads the journal in the store and writes a restored entry through the mount, as the
caller, at its path or beside it (``NAME.restored-TIME``) when the path is taken: nothing is
overwritten (a directory comes back with its whole tree, every entry made new), and a path
outside the mount is refused (``InvalidInputError``).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TrashEntry", "Restored", "time_arg"]


@dataclass(frozen=True)
class TrashEntry:
    """An entry the workspace lost: ``what`` is ``"deleted"`` or ``"replaced"``, ``kind``
    ``"file"``, ``"symlink"`` or ``"dir"`` (a directory comes back with its tree)."""

    path: str
    what: str
    time: str
    unix_ms: int
    size: int
    kind: str = "file"

    @classmethod
    def from_json(cls, e: Mapping[str, Any]) -> TrashEntry:
        return cls(
            path=e["path"],
            what=e["what"],
            time=e["time"],
            unix_ms=e["unix_ms"],
            size=e["size"],
            kind=e.get("kind", "file"),
        )


@dataclass(frozen=True)
class Restored:
    """An entry put back: ``restored_as`` is ``path`` unless that was taken (``beside``);
    ``entries`` counts what was made (a directory's whole tree with itself)."""

    path: str
    restored_as: str
    beside: bool
    version: str
    size: int
    incomplete: bool
    kind: str = "file"
    entries: int = 1

    @classmethod
    def from_json(cls, r: Mapping[str, Any]) -> Restored:
        return cls(
            path=r["path"],
            restored_as=r["restored_as"],
            beside=bool(r["beside"]),
            version=r["version"],
            size=r["size"],
            incomplete=bool(r["incomplete"]),
            kind=r.get("kind", "file"),
            entries=int(r.get("entries", 1)),
        )


def time_arg(at: str | _dt.datetime) -> str:
    """``at`` as the CLI's TIME: a string is passed on (RFC 3339 or ``"10m ago"``); a
    datetime is written as RFC 3339 (a naive one is taken as UTC)."""
    if isinstance(at, _dt.datetime):
        if at.tzinfo is None:
            at = at.replace(tzinfo=_dt.timezone.utc)
        return at.isoformat()
    return at
