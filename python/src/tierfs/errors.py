"""The exceptions of the tierfs package, one class per kind of failure.

Every failure of the bundled ``tierfs`` command reaches Python as a :class:`TierfsError`
subclass that carries the command's own message (what went wrong and what to do), so a
notebook shows the same words the command line would. The class tells a program what to do
about it; the kinds are the core's (``tierfs::ErrorKind``: not found, conflict, fenced,
unavailable, no space, invalid input, corrupt, internal), named as the CLI names them.

How a failure gets its class: ``tierfs --json`` prints ``{"ok": false, "error": MESSAGE}``
and, when the error has one, ``"kind": KIND`` (the core's errors and a daemon's failure to
start carry it; some checks of the CLI's own do not yet). The kind decides; refinements (a
wrong passphrase is invalid input, a busy mount point is a conflict) are read from the
message (:func:`classify`): a table of the core's own message texts, tested against real
failures in ``python/tests``. Without a kind, that table alone decides.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
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
    "classify",
]


class TierfsError(Exception):
    """A tierfs operation failed. ``str(err)`` is the CLI's message.

    Attributes:
        message: what went wrong, in the words of the ``tierfs`` command.
        kind: the core's error kind (``"not_found"``, ``"conflict"``, ``"fenced"``,
            ``"unavailable"``, ``"no_space"``, ``"invalid_input"``, ``"corrupt"``,
            ``"internal"``), or ``None`` when it could not be told.
        command: the ``tierfs`` command line that failed, if one ran.
        stderr: everything the command wrote on stderr (its log lines included).
    """

    #: The kind of every instance of this class (subclasses override it).
    default_kind: str | None = None

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        command: Sequence[str] | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind if kind is not None else self.default_kind
        self.command = list(command) if command is not None else None
        self.stderr = stderr


class NotFoundError(TierfsError):
    """The named thing does not exist: a mount, a snapshot, a store, a path."""

    default_kind = "not_found"


class ConflictError(TierfsError):
    """Someone else holds it: another mount of the data directory, an existing name."""

    default_kind = "conflict"


class PathInUseError(ConflictError):
    """The mount point (or the data directory) is taken: not empty, already a mount point of
    another filesystem or workspace, or in use by another tierfs process."""


class FencedError(TierfsError):
    """Another writer holds the workspace's lease (or took it over): this node must not write.
    Wait for it, take over, or start from the store's state."""

    default_kind = "fenced"


class UnavailableError(TierfsError):
    """A resource is unavailable for now (a store that does not answer): try again later."""

    default_kind = "unavailable"


class CommandTimeoutError(UnavailableError, TimeoutError):
    """The ``tierfs`` command did not finish within the time it was given."""


class NoSpaceError(TierfsError):
    """The disk of the data directory is full: free space, then try again."""

    default_kind = "no_space"


class InvalidInputError(TierfsError, ValueError):
    """The request itself is wrong: bad arguments, configuration or credentials."""

    default_kind = "invalid_input"


class WrongKeyError(InvalidInputError):
    """The passphrase or key file does not unlock the store (or none was given)."""


class CorruptError(TierfsError):
    """Stored data failed verification or could not be decoded."""

    default_kind = "corrupt"


class InternalError(TierfsError):
    """A bug or an unexpected system failure."""

    default_kind = "internal"


class BinaryNotFoundError(TierfsError):
    """The bundled ``tierfs`` binary is missing: the package is not installed from its wheel."""

    default_kind = "not_found"


_KIND_CLASSES = {
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "fenced": FencedError,
    "unavailable": UnavailableError,
    "no_space": NoSpaceError,
    "invalid_input": InvalidInputError,
    "corrupt": CorruptError,
    "internal": InternalError,
}

# The core's and the CLI's message texts, most specific first: the first match decides.
# Each entry quotes (a stable part of) a message the Rust code writes; keep them in step.
_MESSAGE_CLASSES: Sequence[tuple[re.Pattern[str], type[TierfsError]]] = [
    (re.compile(p, re.IGNORECASE), cls)
    for p, cls in [
        # crypto: CryptoError::WrongKey; store_link::passphrase; bad key files
        (r"wrong passphrase or key file", WrongKeyError),
        (r"needs a passphrase", WrongKeyError),
        (r"TIERFS_PASSPHRASE is set but empty", WrongKeyError),
        (r"bad key file|reading key file", WrongKeyError),
        # remote: Held / TakenOver / lease-only fencing
        (r"workspace \".*\" is in use by .* (until|which is still renewing)", FencedError),
        (r"took over workspace|stopped writing to the store", FencedError),
        # mount point and data dir
        (r"is already mounted|is already a mount point|is already served by", PathInUseError),
        (r"mountpoint .* is not empty", PathInUseError),
        # watch mode: a directory with other files than the workspace's
        (r"is not empty and does not hold this workspace", PathInUseError),
        (r" is busy", PathInUseError),
        (r"data directory .* is in use", PathInUseError),
        (r"data dir .* is not empty", PathInUseError),
        (r"is not a directory", PathInUseError),
        (r"diverged", ConflictError),
        # space
        (r"no space left", NoSpaceError),
        # no FUSE here (tierfs-daemon's check_fuse_device, which gives no kind)
        (r"/dev/fuse is missing|FUSE is not available here", UnavailableError),
        # a store or backend that does not answer
        (r"is unavailable|unavailable:", UnavailableError),
        (r"connection refused|error trying to connect|dns error|timed out|timeout", UnavailableError),
        (r"could not be uploaded within|did not finish before the deadline", UnavailableError),
        (r"did not report the mount ready", UnavailableError),
        # damage
        (r"failed authentication|is corrupt|damaged|is truncated", CorruptError),
        # missing things
        (r"no snapshot|no tierfs store at|is not mounted|is not a tierfs mount", NotFoundError),
        (r"no tierfs mount|not found|no such file|does not exist", NotFoundError),
        (r"no tierfs process answers", NotFoundError),
        # bad input
        (r"bad backend|is not a size|unknown unit|invalid value|unexpected argument", InvalidInputError),
        (r"has no store|is read-only", InvalidInputError),
        (r"is not empty", InvalidInputError),
    ]
]


def classify(message: str, kind: str | None = None) -> type[TierfsError]:
    """The exception class for a CLI failure with ``message`` (and ``kind``, when the CLI
    gave one).

    A known kind picks the class; a message-specific subclass of it (for example
    :class:`WrongKeyError` for ``invalid_input``) refines it. Without a kind the message
    alone decides, and an unknown message gives :class:`TierfsError` itself.
    """
    by_message = next((cls for pattern, cls in _MESSAGE_CLASSES if pattern.search(message)), None)
    by_kind = _KIND_CLASSES.get(kind) if kind else None
    if by_kind is None:
        return by_message or TierfsError
    if by_message is not None and issubclass(by_message, by_kind):
        return by_message
    return by_kind
