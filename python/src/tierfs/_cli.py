"""Running the bundled ``tierfs`` command with ``--json`` and reading its answer.

Invariants:
- Every call has a deadline: a command that outlives it is killed and raises
  :class:`~tierfs.errors.CommandTimeoutError`, so a hung store never hangs a notebook cell.
- stdin is ``/dev/null``: the CLI never waits for a passphrase prompt; a secret goes in
  through the environment (``TIERFS_PASSPHRASE``), never on the command line, where any
  user could read it in ``ps``.
- A failure always raises a :class:`~tierfs.errors.TierfsError` subclass with the CLI's own
  message (``{"ok": false, "error": ...}`` on stdout, ``tierfs: error: ...`` on stderr).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from ._binary import tierfs_binary
from .errors import CommandTimeoutError, InvalidInputError, TierfsError, error_class

#: Exit status of a usage error (clap's convention, see `tierfs --help`).
_USAGE_EXIT = 2


def command_env(passphrase: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``tierfs`` process: this process's, plus the passphrase."""
    env = dict(os.environ)
    if passphrase is not None:
        env["TIERFS_PASSPHRASE"] = passphrase
    if extra:
        env.update(extra)
    return env


def argv(args: Sequence[str]) -> list[str]:
    """The full command line for ``tierfs --json ARGS``."""
    return [tierfs_binary(), "--json", *args]


def error_from(cmd: Sequence[str], returncode: int, stdout: str, stderr: str) -> TierfsError:
    """The exception for a failed ``tierfs`` run."""
    payload: Mapping[str, Any] = {}
    for line in reversed(stdout.strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            payload = parsed
            break
    message = payload.get("error") if isinstance(payload.get("error"), str) else None
    if message is None:
        # No JSON error: a usage error (clap prints to stderr) or a crash.
        lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith(("tierfs: error:", "error:"))]
        message = errors[-1] if errors else (lines[-1] if lines else f"tierfs exited with status {returncode}")
        message = message.removeprefix("tierfs: error: ").removeprefix("error: ")
        if returncode == _USAGE_EXIT:
            return InvalidInputError(message, command=cmd, stderr=stderr)
    kind = payload.get("kind") if isinstance(payload.get("kind"), str) else None
    reason = payload.get("reason") if isinstance(payload.get("reason"), str) else None
    cls = error_class(kind, reason)
    return cls(message, kind=kind, reason=reason, command=cmd, stderr=stderr)


def run_json(
    args: Sequence[str],
    *,
    timeout: float,
    passphrase: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Any:
    """Runs ``tierfs --json ARGS`` and returns its decoded JSON answer.

    Raises:
        CommandTimeoutError: the command did not finish within ``timeout`` seconds.
        TierfsError: the command failed (the subclass says how).
    """
    cmd = argv(args)
    try:
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=command_env(passphrase, env),
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise CommandTimeoutError(
            f"`tierfs {' '.join(args)}` did not finish within {timeout:g} s",
            command=cmd,
            stderr=_text(err.stderr),
        ) from None
    return parse(cmd, done.returncode, done.stdout, done.stderr)


def parse(cmd: Sequence[str], returncode: int, stdout: str, stderr: str) -> Any:
    """The JSON answer of a finished command, or its error raised."""
    if returncode != 0:
        raise error_from(cmd, returncode, stdout, stderr)
    try:
        return json.loads(stdout)
    except ValueError:
        raise TierfsError(
            f"tierfs printed no JSON answer: {stdout.strip()[:200]!r}", command=cmd, stderr=stderr
        ) from None


def _text(data: Any) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return str(data)
