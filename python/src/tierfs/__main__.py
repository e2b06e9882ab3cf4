"""``python -m tierfs env activate [--env DIR] WORKSPACE``: the environment of a workspace
(see :mod:`tierfs.env`) for a shell, printed as lines to ``eval``, as ``ssh-agent`` does::

    eval "$(python -m tierfs env activate /content/work)"

It checks, sets aside and makes the env exactly as ``tierfs.mount(..., env=True)`` does (the
same code: the record has one decoder), then prints ``VAR=value; export VAR;`` lines for
``VIRTUAL_ENV``, ``PATH``, ``PIP_PYTHON`` and the caches. A line about an env set aside goes
to stderr; an error is one ``tierfs: error:`` line on stderr and exit status 1, with nothing
on stdout for the shell to run.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import env as _env
from .errors import TierfsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierfs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="the workspace's environment")
    actions = env.add_subparsers(dest="action", required=True)
    act = actions.add_parser("activate", help="print the shell lines that activate it")
    act.add_argument("--env", default=_env.DEFAULT_ENV_DIR, help="the env's directory, relative to WORKSPACE")
    act.add_argument("workspace", help="the mount point (or watched directory) of the workspace")
    args = parser.parse_args(argv)
    root = os.path.realpath(args.workspace)
    try:
        if not os.path.isdir(root):
            raise TierfsError(f"{args.workspace} is not a directory: mount the workspace first (tierfs mount)")
        found = _env.prepare(root, args.env, say=lambda line: print(line, file=sys.stderr))
    except TierfsError as err:
        print(f"tierfs: error: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(_env.shell_lines(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
