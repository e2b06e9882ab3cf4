"""The exceptions of the tierfs package, one class per kind of failure.

Every failure of the bundled ``tierfs`` command reaches Python as a :class:`TierfsError`
subclass that carries the command's own message (what went wrong and what to do), so a
notebook shows the same words the command line would. The class tells a program what to do
about it; the kinds are the core's (``tierfs::ErrorKind``: not found, conflict, fenced,
unavailable, no space, invalid input, corrupt, internal), named as the CLI names them.

How a failure gets its class: ``tierfs --json`` prints ``{"ok": false, "error": MESSAGE,
"kind": KIND}`` and, where the kind alone does not say enough, ``"reason": REASON``
(``tierfs --help`` lists both). The kind picks the class and the reason refines it
(:func:`error_class`): ``wrong_key`` is a :class:`WrongKeyError`, ``path_in_use`` and
``mountpoint_taken`` a :class:`PathInUseError`, ``timeout`` a :class:`CommandTimeoutError`. The message is shown,
never parsed: rewording it changes no class.
"""

from __future__ import annotations

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
    "error_class",
]


class TierfsError(Exception):
    """A tierfs operation failed. ``str(err)`` is the CLI's message.

    Attributes:
        message: what went wrong, in the words of the ``tierfs`` command.
        kind: the core's error kind (``"not_found"``, ``"conflict"``, ``"fenced"``,
            ``"unavailable"``, ``"no_space"``, ``"invalid_input"``, ``"corrupt"``,
            ``"internal"``), or ``None`` when it could not be told.
        reason: the refinement of the kind the CLI gave (``"wrong_key"``,
            ``"path_in_use"``, ``"mountpoint_taken"``, ``"fuse_unavailable"``, ``"timeout"``,
            ``"passthrough_stack_full"``), or ``None``.
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
        reason: str | None = None,
        command: Sequence[str] | None = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind if kind is not None else self.default_kind
        self.reason = reason
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

# The refinements of a kind (``"reason"`` in ``tierfs --json``), each a subclass of its
# kind's class.
_REASON_CLASSES: dict[str, type[TierfsError]] = {
    "wrong_key": WrongKeyError,
    "path_in_use": PathInUseError,
    "mountpoint_taken": PathInUseError,
    "timeout": CommandTimeoutError,
}


def error_class(kind: str | None, reason: str | None = None) -> type[TierfsError]:
    """The exception class for a CLI failure of ``kind`` and ``reason`` (as ``tierfs --json``
    printed them).

    A known reason picks its class when it refines the kind's (for example
    :class:`WrongKeyError` for ``invalid_input``); otherwise the kind picks it, and an
    unknown kind (a newer tierfs) gives :class:`TierfsError` itself.
    """
    by_kind = _KIND_CLASSES.get(kind) if kind else None
    by_reason = _REASON_CLASSES.get(reason) if reason else None
    if by_reason is not None and (by_kind is None or issubclass(by_reason, by_kind)):
        return by_reason
    return by_kind or TierfsError
