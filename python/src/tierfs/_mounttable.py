"""The kernel's mount table (``/proc/self/mountinfo``), read without touching the mounts.

Reading the table never ``stat``s a mount point, so a wedged or dead FUSE mount cannot hang
the caller (a ``stat`` of a dead mount fails with ENOTCONN, of a hung one blocks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountEntry:
    """One line of the mount table."""

    mountpoint: str
    fs_type: str
    source: str

    @property
    def is_tierfs(self) -> bool:
        """A tierfs FUSE mount (``fuse.tierfs``, or ``fuse`` with source ``tierfs``)."""
        return self.fs_type == "fuse.tierfs" or (self.fs_type.startswith("fuse") and self.source == "tierfs")


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as \ooo.
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def find(mountpoint: str) -> MountEntry | None:
    """The topmost mount at ``mountpoint`` (a canonical path), or ``None``."""
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
            for line in table:
                fields = line.split()
                if len(fields) < 10 or _unescape(fields[4]) != mountpoint:
                    continue
                sep = fields.index("-", 6)
                found = MountEntry(mountpoint, fields[sep + 1], _unescape(fields[sep + 2]))
    except OSError:
        return None
    return found
