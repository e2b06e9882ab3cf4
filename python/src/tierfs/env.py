"""The environment that survives a reset: a virtualenv and the model caches, kept inside
the workspace, so that after a reset the same :func:`tierfs.mount` makes every package
``%pip install`` put there importable again at once, with no network and no reinstall.

Layout, inside the workspace (``env=True``; ``env="DIR"`` names another directory, relative
to the workspace and beneath it)::

    .tierfs/env/                 a virtualenv (``--system-site-packages``, no pip of its own)
    .tierfs/env/tierfs-env.json  its record: which Python on which platform made it
    .tierfs/cache/               XDG_CACHE_HOME: pip's cache, huggingface/ (HF_HOME), torch/

The caches sit beside the env, not in it: a model is the same for every Python, so an env
set aside for another Python leaves them in place.

Activation (:func:`activate`) changes this process only: the env's site-packages goes into
``sys.path`` before the kernel's own site-packages (its ``.pth`` files processed), and
``VIRTUAL_ENV``, ``PATH``, ``PIP_PYTHON``, ``PIP_CACHE_DIR``, ``HF_HOME``, ``TORCH_HOME``
and ``XDG_CACHE_HOME`` point into the workspace, for this process and what it starts.
``%pip install x`` runs the kernel's own ``python -m pip`` (IPython uses ``sys.executable``);
``PIP_PYTHON`` (pip's ``--python``, pip 22.3 and later) makes that pip install into the env's
interpreter instead, so ``import x`` then works in the same kernel, and ``!pip`` or a
subprocess's ``python -m pip`` do the same. ``sys.executable`` itself is left alone: a
subprocess or multiprocessing child of the kernel must still find the kernel's packages.
``PIP_TARGET`` or ``PIP_PREFIX`` would be wrong here: they install beside a venv, not into
it, and pip's view of what is installed would then be the kernel's, not the env's.

Invariants:
- An env is made by one interpreter (implementation, ``major.minor``, ABI, platform) and
  loaded only into the same: another one's env is renamed aside (never deleted) with one
  line saying what to do, and a new empty one is made; nothing of it is put on
  ``sys.path``.
- The record is input from the workspace, which anyone with the store may have written:
  it is read without following a symlink, bounded, and decoded by :meth:`EnvRecord.decode`
  alone; one that does not decode is refused (``CorruptError``, reason ``env_record``) and
  nothing is changed.
- The record is written last (by rename), so an env without one is one whose making was
  cut short: it is set aside, like another Python's.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import shlex
import site
import stat
import sys
import sysconfig
import venv
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .errors import CorruptError, InvalidInputError, TierfsError

__all__ = ["Env", "EnvRecord", "DEFAULT_ENV_DIR", "CACHE_DIR", "RECORD_NAME", "prepare", "activate", "shell_lines"]

#: Where ``env=True`` keeps the env, relative to the workspace.
DEFAULT_ENV_DIR = ".tierfs/env"
#: Where the caches live (``XDG_CACHE_HOME``), relative to the workspace.
CACHE_DIR = ".tierfs/cache"
#: The env's record, inside the env.
RECORD_NAME = "tierfs-env.json"
#: The record's format (docs/FORMAT.md, "The environment record").
RECORD_FORMAT = 1
#: A record is a few hundred bytes; anything past this is not one of ours.
MAX_RECORD_BYTES = 4096
#: The longest value of a record's string field.
_MAX_FIELD = 200
_FIELDS = ("implementation", "python", "abi", "platform", "created")


@dataclass(frozen=True)
class EnvRecord:
    """Which interpreter made an env (``tierfs-env.json``, docs/FORMAT.md)."""

    implementation: str  #: ``sys.implementation.name``, e.g. ``cpython``
    python: str  #: the full version, e.g. ``3.11.2``
    abi: str  #: ``sysconfig``'s ``SOABI``, e.g. ``cpython-311-x86_64-linux-gnu``
    platform: str  #: ``sysconfig.get_platform()``, e.g. ``linux-x86_64``
    created: str  #: when, ISO 8601 in UTC

    @classmethod
    def current(cls) -> EnvRecord:
        """The record of an env this interpreter makes now."""
        now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
        return cls(
            implementation=sys.implementation.name,
            python=platform.python_version(),
            abi=str(sysconfig.get_config_var("SOABI") or ""),
            platform=sysconfig.get_platform(),
            created=now.isoformat().replace("+00:00", "Z"),
        )

    def encode(self) -> bytes:
        fields = {"format": RECORD_FORMAT, **{name: getattr(self, name) for name in _FIELDS}}
        return (json.dumps(fields, indent=2) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> EnvRecord:
        """The record in ``data``; raises :class:`ValueError` saying what is wrong."""
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError(f"it is {len(data)} bytes, more than {MAX_RECORD_BYTES}")
        try:
            fields = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"it is not JSON ({err})") from None
        if not isinstance(fields, dict):
            raise ValueError("it is not a JSON object")
        if fields.get("format") != RECORD_FORMAT:
            raise ValueError(f"its format is {fields.get('format')!r}, not {RECORD_FORMAT}")
        values = {}
        for name in _FIELDS:
            value = fields.get(name)
            if not isinstance(value, str) or not value.isprintable() or len(value) > _MAX_FIELD:
                raise ValueError(f"its {name!r} is not a short printable string")
            values[name] = value
        if not _is_version(values["python"]):
            raise ValueError(f"its 'python' {values['python']!r} is not a version like 3.11.2")
        return cls(**values)

    def minor(self) -> str:
        return ".".join(self.python.split(".")[:2])

    def describe(self) -> str:
        """``CPython 3.11 (linux-x86_64)``."""
        name = {"cpython": "CPython", "pypy": "PyPy"}.get(self.implementation, self.implementation)
        return f"{name} {self.minor()} ({self.platform})"

    def incompatible(self, runtime: EnvRecord) -> bool:
        """Whether an env of this record cannot be loaded into ``runtime``'s interpreter:
        compiled extensions and the site-packages path follow the ABI and ``major.minor``
        (a patch release keeps both)."""
        mine = (self.implementation, self.minor(), self.abi, self.platform)
        return mine != (runtime.implementation, runtime.minor(), runtime.abi, runtime.platform)


def _is_version(text: str) -> bool:
    parts = text.split(".")
    return 2 <= len(parts) <= 3 and all(p.isdigit() and len(p) <= 4 for p in parts[:2])


@dataclass
class Env:
    """An env in a workspace, ready to :func:`activate`.

    Attributes:
        path: the env's directory.
        cache: the caches' directory (``XDG_CACHE_HOME``).
        record: who made it.
        created: ``True`` when :func:`prepare` made it now.
        set_aside: where another Python's (or a cut-short) env was moved, if one was.
    """

    path: str
    cache: str
    record: EnvRecord
    created: bool = False
    set_aside: str | None = None

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.path, "bin")

    @property
    def python(self) -> str:
        return os.path.join(self.bin_dir, "python")

    @property
    def site_packages(self) -> str:
        return os.path.join(self.path, "lib", f"python{self.record.minor()}", "site-packages")

    def environ(self) -> dict[str, str]:
        """The variables :func:`activate` sets (``PATH`` not included)."""
        return {
            "VIRTUAL_ENV": self.path,
            "PIP_PYTHON": self.python,
            "PIP_CACHE_DIR": os.path.join(self.cache, "pip"),
            "HF_HOME": os.path.join(self.cache, "huggingface"),
            "TORCH_HOME": os.path.join(self.cache, "torch"),
            "XDG_CACHE_HOME": self.cache,
        }


def env_dir(root: str, env: bool | str | os.PathLike[str]) -> str:
    """The env's directory for ``mount(..., env=env)`` of the workspace at ``root``: a
    relative path that stays beneath it."""
    rel = DEFAULT_ENV_DIR if env is True else os.fspath(env)  # type: ignore[arg-type]
    parts = rel.split("/")
    if not rel or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise InvalidInputError(
            f"env={rel!r}: name a directory inside the workspace, relative to it and without "
            f"'.' or '..' (for example {DEFAULT_ENV_DIR!r}), or pass env=True"
        )
    return os.path.join(root, *parts)


def prepare(root: str, env: bool | str | os.PathLike[str] = True, *, say: Callable[[str], None] = print) -> Env:
    """The env of the workspace at ``root``: the one there if this interpreter made it,
    else a new one (another interpreter's, or one cut short, renamed aside first, with one
    line through ``say``).

    Raises:
        InvalidInputError: ``env`` leaves the workspace, or a directory on its path is a
            symlink or no directory.
        CorruptError: the env's record does not decode (reason ``env_record``); nothing
            was changed.
        TierfsError: the env could not be made (reason ``env_create``).
    """
    path = env_dir(root, env)
    _real_dirs(root, path)
    cache = os.path.join(root, *CACHE_DIR.split("/"))
    runtime = EnvRecord.current()
    record = _read_record(path)
    set_aside = None
    if record is not None and not record.incompatible(runtime):
        return Env(path, cache, record)
    if record is not None or _non_empty(path):
        set_aside = _set_aside(path, record)
        rel_env, rel_aside = os.path.relpath(path, root), os.path.relpath(set_aside, root)
        made_by = f"was made by {record.describe()}" if record else f"has no {RECORD_NAME} (its making was cut short)"
        say(
            f"tierfs: the environment {rel_env} {made_by}, and this runtime runs {runtime.describe()}: "
            f"set it aside as {rel_aside} (nothing deleted) and made a new, empty one; "
            f"%pip install your packages again (the old list: ls {rel_aside}/lib/*/site-packages)"
        )
    _create(path, runtime)
    os.makedirs(cache, exist_ok=True)
    return Env(path, cache, runtime, created=True, set_aside=set_aside)


def _real_dirs(root: str, path: str) -> None:
    """Every directory between ``root`` and ``path`` that exists is a directory, not a
    symlink (a symlink could lead the env, and the caches, out of the workspace)."""
    here = root
    for part in os.path.relpath(path, root).split(os.sep):
        here = os.path.join(here, part)
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            what = "a symlink" if stat.S_ISLNK(mode) else "not a directory"
            raise InvalidInputError(
                f"{here} is {what}: the environment must be a directory inside the workspace; "
                f"move it away or pass env='another/dir'"
            )


def _read_record(path: str) -> EnvRecord | None:
    """The record of the env at ``path``, or ``None`` if it has none."""
    where = os.path.join(path, RECORD_NAME)
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _bad_record(where, f"it cannot be opened as a plain file ({os.strerror(err.errno or 0)})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _bad_record(where, "it is not a plain file")
        data = f.read(MAX_RECORD_BYTES + 1)
    try:
        return EnvRecord.decode(data)
    except ValueError as err:
        raise _bad_record(where, str(err)) from None


def _bad_record(where: str, why: str) -> CorruptError:
    env = os.path.dirname(where)
    return CorruptError(
        f"{where} is not a tierfs environment record: {why}. Nothing was changed; move the "
        f"environment aside (mv {env} {env}.old) to get a new one",
        reason="env_record",
    )


def _non_empty(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is not None
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return True


def _set_aside(path: str, record: EnvRecord | None) -> str:
    """Renames the env at ``path`` to a free name beside it; returns that name."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    tag = f"{record.implementation}-{record.minor()}-{record.platform}" if record else "incomplete"
    base = f"{path}.set-aside-{tag}-{stamp}"
    for n in range(100):
        aside = base if n == 0 else f"{base}-{n}"
        if os.path.lexists(aside):
            continue
        os.rename(path, aside)
        return aside
    raise TierfsError(f"no free name to set {path} aside as ({base}...)", reason="env_create")


def _create(path: str, record: EnvRecord) -> None:
    """A virtualenv of this interpreter at ``path``; its record written last."""
    try:
        # symlinks: the env's python is the runtime's own, which a reset brings back at
        # the same place. No pip of its own: pip runs as the kernel's, with PIP_PYTHON.
        venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(path)
        tmp = os.path.join(path, f".{RECORD_NAME}.tmp")
        with open(tmp, "wb") as f:
            f.write(record.encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(path, RECORD_NAME))
    except OSError as err:
        raise TierfsError(f"making the environment {path} failed: {err}", reason="env_create") from None


def _site_index(paths: list[str]) -> int:
    """Where the env's site-packages goes in ``paths`` (``sys.path``): before the first
    site-packages (the kernel's own), after the standard library."""
    roots = set(site.getsitepackages()) | {site.getusersitepackages()}
    for i, entry in enumerate(paths):
        if entry in roots or entry.endswith(("site-packages", "dist-packages")):
            return i
    return len(paths)


def activate(env: Env) -> None:
    """Makes ``env`` this process's environment (see the module's description). Calling it
    again (a re-run cell) adds nothing to ``sys.path`` but what new ``.pth`` files name."""
    before = list(sys.path)
    site.addsitedir(env.site_packages)  # appends it and what its .pth files add
    if env.site_packages not in before:
        added = sys.path[len(before) :]
        at = _site_index(before)
        sys.path[:] = before[:at] + added + before[at:]
    importlib.invalidate_caches()
    os.environ.update(env.environ())
    os.environ["PATH"] = _with_first(os.environ.get("PATH", ""), env.bin_dir)


def _with_first(search: str, directory: str) -> str:
    parts = [p for p in search.split(os.pathsep) if p and p != directory]
    return os.pathsep.join([directory, *parts])


def shell_lines(env: Env, environ: Mapping[str, str] | None = None) -> str:
    """What a POSIX shell ``eval``s to activate ``env`` (as ``ssh-agent`` prints)."""
    environ = os.environ if environ is None else environ
    values = dict(env.environ())
    values["PATH"] = _with_first(environ.get("PATH", ""), env.bin_dir)
    lines = [f"{name}={shlex.quote(value)}; export {name};" for name, value in values.items()]
    lines.append(f"echo tierfs: environment {shlex.quote(env.path)} active;")
    return "\n".join(lines) + "\n"
