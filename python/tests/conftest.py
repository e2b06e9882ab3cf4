"""Fixtures of the tierfs Python tests: the installed wheel, isolated runtimes, stores and
real notebooks run in real Jupyter kernels.

The tests run in a fresh venv that has the built wheel installed (``scripts/python.sh``
makes it), never against the source tree: ``test_installed_not_source`` checks that.
:func:`without_fuse` runs a command where FUSE is unavailable (``no-fuse.sh``: a private
mount namespace whose ``/dev`` has no ``/dev/fuse``; or without ``CAP_SYS_ADMIN``, where the
device opens and the kernel refuses the FUSE mount), for the watch-mode fallback. A
:class:`Runtime` stands for one notebook runtime (a Colab VM): its own XDG directories (data
home, control sockets), its own fresh kernel venv, its own daemons. A runtime *reset* kills
its daemons with SIGKILL, clears its mounts and deletes all of it; only the store, kept in
``persistent/`` (the bucket, the Drive folder), survives.

Environment (set by scripts/python.sh):
    TIERFS_TEST_WORK        work directory (mount points, runtimes, stores, logs)
    TIERFS_TEST_WHEEL       the wheel under test
    TIERFS_TEST_WHEELHOUSE  local wheels for the kernels' venvs (ipykernel, numpy, tqdm)
    TIERFS_TEST_ENV_WHEELHOUSE  local wheels the environment tests install (env-requirements.txt)
    TIERFS_TEST_METRICS     JSON file that collects the measured numbers
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import tierfs
from tierfs import _mounttable

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE / "notebooks"

#: Seconds one notebook cell may run (a venv on the mount, training, a sync).
CELL_TIMEOUT = 600

#: How :func:`without_fuse` takes FUSE away: ``missing`` (no ``/dev/fuse``), ``dead`` (a
#: ``/dev/fuse`` node that does not open: ENODEV), ``no-cap`` (``/dev/fuse`` works, but
#: ``CAP_SYS_ADMIN`` is dropped from the bounding set, so the kernel refuses the mount: a
#: container run without ``--cap-add SYS_ADMIN``).
NO_FUSE_WAYS = ("missing", "dead", "no-cap")


def without_fuse(argv: Sequence[str], how: str = "missing") -> list[str]:
    """``argv`` wrapped to run where FUSE is unavailable (see :data:`NO_FUSE_WAYS`)."""
    if how == "no-cap":
        return ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--", *argv]
    if how not in NO_FUSE_WAYS:
        raise ValueError(how)
    return ["/bin/sh", str(HERE / "no-fuse.sh"), "--fuse", how, *argv]


def run_without_fuse(code: str, *args: str, how: str = "missing", timeout: float = 300) -> dict[str, Any]:
    """Runs Python ``code`` (with ``args`` in ``sys.argv[1:]``) in a process of the test
    venv where FUSE is unavailable, and returns what it printed on its ``RESULT {json}``
    line; fails the test with its output when it exits non-zero or prints none."""
    cmd = without_fuse([sys.executable, "-c", code, *args], how)
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    shown = shlex.join(without_fuse([sys.executable, "-c", "...", *args], how))
    output = f"$ {shown}\n{done.stdout}\n{done.stderr}"
    if done.returncode != 0:
        raise AssertionError(f"the no-FUSE process ({how}) failed with status {done.returncode}:\n{output}")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            result["stdout"] = done.stdout
            return result
    raise AssertionError(f"the no-FUSE process ({how}) printed no RESULT line:\n{output}")


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is not set: run the Python tests with scripts/python.sh", returncode=2)
    return Path(value)


@pytest.fixture(scope="session")
def work() -> Path:
    return _env_path("TIERFS_TEST_WORK")


@pytest.fixture(scope="session")
def wheel() -> Path:
    return _env_path("TIERFS_TEST_WHEEL")


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    return _env_path("TIERFS_TEST_WHEELHOUSE")


@pytest.fixture(scope="session")
def env_wheelhouse() -> Path:
    return _env_path("TIERFS_TEST_ENV_WHEELHOUSE")


def record_metric(name: str, value: Any) -> None:
    """Adds a measured number to the metrics file (reported by scripts/python.sh, never
    asserted on)."""
    path = os.environ.get("TIERFS_TEST_METRICS")
    if not path:
        return
    metrics = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    metrics[name] = value
    Path(path).write_text(json.dumps(metrics, indent=2))


def tierfs_cmd(*args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300):
    """Runs the installed ``tierfs`` binary (the one in the wheel)."""
    done = subprocess.run(
        [tierfs.tierfs_binary(), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"tierfs {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done


def make_file_store(root: Path, passphrase: str | None = None) -> Path:
    """A store with one ``file://`` backend in ``root``: unlocked by a key file there, or by
    ``passphrase``."""
    root.mkdir(parents=True, exist_ok=True)
    store = root / "store.toml"
    args = ["init", "--store", str(store), "--backend", f"file://{root / 'objects'}"]
    env = dict(os.environ)
    if passphrase is None:
        args += ["--key-file", str(root / "store.key")]
    else:
        env["TIERFS_PASSPHRASE"] = passphrase
    tierfs_cmd(*args, env=env)
    return store


def daemon_pids(under: Path) -> list[int]:
    """Live tierfs-daemon processes whose command line names a path under ``under``: the
    ones these tests started."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"tierfs-daemon") and any(str(under).encode() in a for a in argv):
            pids.append(int(proc.name))
    return pids


def mounts_under(root: Path) -> list[str]:
    """Mount points below ``root`` in the kernel's table."""
    prefix = str(root) + "/"
    found = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            point = _mounttable._unescape(line.split()[4])
            if point.startswith(prefix):
                found.append(point)
    return found


def force_clear(root: Path) -> None:
    """Kills (SIGKILL, by pid) every daemon these tests started under ``root`` and detaches
    every mount below it: what a runtime reset does, and the last resort of a cleanup."""
    for pid in daemon_pids(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while daemon_pids(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    for point in reversed(mounts_under(root)):
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
        if point in mounts_under(root):
            subprocess.run(["umount", "-l", point], capture_output=True)


def nothing_mounted_at(path: Path, runtime_root: Path) -> None:
    """Asserts that nothing is left of a failed mount at ``path``: no mount, no daemon of
    ``runtime_root`` serving it, no control socket answering for it."""
    canonical = os.path.realpath(path)
    entry = _mounttable.find(canonical)
    assert entry is None, f"{canonical} is still mounted: {entry}"
    left = [pid for pid in daemon_pids(runtime_root) if canonical.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert not left, f"tierfs-daemon processes for {canonical} are still running: {left}"
    served = [m.path for m in tierfs.mounts()]
    assert canonical not in served, f"a control socket still answers for {canonical}: {served}"


class Runtime:
    """One notebook runtime: XDG directories, a kernel venv, the daemons it starts."""

    def __init__(self, root: Path, wheelhouse: Path, name: str) -> None:
        self.root = root
        self.name = name
        self.wheelhouse = wheelhouse
        self.venv = root / "venv"
        self.jupyter = root / "jupyter"
        self.kernel_name = f"tierfs-{name}"
        xdg = root / "xdg"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERFS_", "JUPYTER", "VIRTUAL_ENV"))}
        self.env.update(
            XDG_DATA_HOME=str(xdg / "data"),
            XDG_CONFIG_HOME=str(xdg / "config"),
            XDG_STATE_HOME=str(xdg / "state"),
            XDG_CACHE_HOME=str(xdg / "cache"),
            XDG_RUNTIME_DIR=str(xdg / "run"),
            TIERFS_TEST_FAST_KDF="test",
            PYTHONUNBUFFERED="1",
        )
        # The kernel's venv, not the test runner's, comes first: `pip`, `python` and the
        # installed `tierfs` in the notebook are the kernel's.
        self.env["PATH"] = f"{self.venv / 'bin'}:{self.env.get('PATH', '/usr/bin:/bin')}"
        for key in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            Path(self.env[key]).mkdir(parents=True, exist_ok=True)
        Path(self.env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)

    def make_kernel_venv(
        self, wrapper: Sequence[str] = (), packages: Sequence[str] = ("ipykernel", "numpy", "tqdm")
    ) -> float:
        """A fresh venv with ``packages`` (no tierfs: the notebook installs it), registered
        as a Jupyter kernel whose command line starts with ``wrapper`` (e.g.
        :func:`without_fuse`). Returns the seconds it took."""
        started = time.monotonic()
        subprocess.run(["/usr/bin/python3", "-m", "venv", str(self.venv)], check=True)
        subprocess.run(
            [
                str(self.venv / "bin/python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-compile",
                "--disable-pip-version-check",
                "--no-index",
                "--find-links",
                str(self.wheelhouse),
                *packages,
            ],
            check=True,
        )
        spec = self.jupyter / "kernels" / self.kernel_name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [
                        *wrapper,
                        str(self.venv / "bin/python"),
                        "-m",
                        "ipykernel_launcher",
                        "-f",
                        "{connection_file}",
                    ],
                    "display_name": f"tierfs test ({self.name})",
                    "language": "python",
                }
            )
        )
        return time.monotonic() - started

    def run_notebook(self, name: str, params: dict[str, Any], out_dir: Path, allow_dead: bool = False) -> Any:
        """Runs ``notebooks/NAME.py`` (``# %%`` cells) as a notebook in a new kernel of this
        runtime and returns the executed notebook (also saved as ``out_dir/NAME.ipynb``).
        ``params`` reach the notebook as ``TIERFS_NB_<KEY>`` environment variables."""
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, DeadKernelError

        nb = notebook_from_percent(NOTEBOOKS / f"{name}.py")
        env = dict(self.env)
        env.update({f"TIERFS_NB_{k.upper()}": str(v) for k, v in params.items()})
        os.environ["JUPYTER_PATH"] = str(self.jupyter)
        client = NotebookClient(
            nb,
            kernel_name=self.kernel_name,
            timeout=CELL_TIMEOUT,
            startup_timeout=120,
            resources={"metadata": {"path": str(self.root)}},
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            client.execute(env=env)
        except DeadKernelError:
            if not allow_dead:
                raise
        except CellExecutionError:
            nbformat.write(nb, str(out_dir / f"{name}.ipynb"))
            raise
        nbformat.write(nb, str(out_dir / f"{name}.ipynb"))
        return nb

    def reset(self, *mountpoints: Path) -> None:
        """The runtime is recycled: its daemons die (SIGKILL), its mounts (``mountpoints``,
        wherever they are) go, its disk is wiped."""
        force_clear(self.root)
        for point in mountpoints:
            entry = _mounttable.find(os.path.realpath(point))
            if entry is not None and entry.is_tierfs:
                subprocess.run(["fusermount3", "-u", "-z", os.path.realpath(point)], capture_output=True)
        shutil.rmtree(self.root)


def notebook_from_percent(path: Path) -> Any:
    """A notebook from a ``# %%`` script: each ``# %%`` line starts a code cell, ``# %% [markdown]``
    a markdown cell whose lines drop their leading ``# ``."""
    import nbformat

    cells = []
    kind, lines = None, []

    def flush() -> None:
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(text))
        elif kind == "code" and text:
            cells.append(nbformat.v4.new_code_cell(text))

    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
            continue
        if kind == "markdown":
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        elif kind == "code":
            lines.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def cell_text(nb: Any) -> str:
    """Everything the notebook's cells printed (stdout, stderr, results)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif out.get("output_type") in ("execute_result", "display_data"):
                parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.fixture
def isolated(work: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test process as a runtime of its own: XDG directories under a fresh root, so the
    `tierfs` commands that `import tierfs` runs see only this test's mounts. Yields the root;
    every daemon started under it is stopped and every mount below it detached afterwards."""
    # Short: the control socket's path must fit in a socket address (107 bytes).
    root = work / "api" / f"{len(list((work / 'api').glob('*'))) if (work / 'api').exists() else 0:02d}"
    root.mkdir(parents=True)
    (root / "test").write_text(request.node.name)
    for key in list(os.environ):
        if key.startswith("TIERFS_"):
            monkeypatch.delenv(key)
    for name in ("data", "config", "state", "cache"):
        (root / "xdg" / name).mkdir(parents=True)
        monkeypatch.setenv(f"XDG_{name.upper()}_HOME", str(root / "xdg" / name))
    (root / "xdg" / "run").mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root / "xdg" / "run"))
    monkeypatch.setenv("TIERFS_TEST_FAST_KDF", "test")
    yield root
    for point in reversed(mounts_under(root)):
        subprocess.run([tierfs.tierfs_binary(), "umount", "--timeout", "60", point], capture_output=True, timeout=120)
    force_clear(root)


@pytest.fixture(scope="session", autouse=True)
def _sweep(work: Path) -> Iterator[None]:
    """Nothing these tests mounted outlives the session."""
    yield
    force_clear(work)


def pytest_report_header(config: pytest.Config) -> str:
    return f"tierfs {tierfs.__version__} from {Path(tierfs.__file__).parent} (python {sys.version.split()[0]})"
