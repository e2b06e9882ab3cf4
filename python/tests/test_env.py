"""The environment in the workspace (``mount(..., env=True)``, :mod:`tierfs.env`), in real
Jupyter kernels with real packages and no network: a notebook ``%pip install``s pandas,
numpy, a console script, a pure-Python and a compiled package into the env and syncs; the
runtime is reset; a fresh one (new HOME, empty data dir, a kernel venv with ipykernel only,
the index and the wheelhouse out of reach) runs the same ``mount()`` and imports them all.
The same pair without FUSE (watch mode). And an env another Python made is set aside with
one line, and a record that does not decode is refused with nothing changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    Runtime,
    cell_text,
    make_file_store,
    nothing_mounted_at,
    record_metric,
    tierfs_cmd,
    without_fuse,
)

#: The packages the notebooks install (python/tests/env-requirements.txt).
PACKAGES = ("pandas", "tabulate", "more-itertools", "markupsafe")
#: Where pip would look in the fresh runtime: nothing answers there.
DEAD_INDEX = "http://127.0.0.1:9/simple/"


@pytest.mark.parametrize("mode", ["fuse", "watch"])
def test_env_survives_a_reset(work: Path, wheel: Path, wheelhouse: Path, env_wheelhouse: Path, mode: str) -> None:
    flow = work / f"env-{mode}"
    store = make_file_store(flow / "persistent")
    mnt = flow / "content" / "work"
    results = flow / "persistent" / "results.json"
    outputs = work / "notebooks" / f"env-{mode}"
    # A copy the first runtime installs from and the reset takes away.
    local_wheels = flow / "wheelhouse"
    shutil.copytree(env_wheelhouse, local_wheels)
    params = dict(wheel=wheel, store=store, mnt=mnt, results=results, wheelhouse=local_wheels, mode=mode)
    wrapper = without_fuse([]) if mode == "watch" else []

    first = Runtime(flow / "runtime-1", wheelhouse, f"env-{mode}-1")
    first.make_kernel_venv(wrapper, packages=["ipykernel"])
    nb = first.run_notebook("env_install", params, outputs)
    assert "snapshot" in cell_text(nb)
    installed = json.loads(results.read_text())
    # A kernel that imported from the env keeps a FUSE mount busy: unmount once it ended.
    tierfs_cmd("unwatch" if mode == "watch" else "umount", str(mnt), env=first.env)
    first.reset(mnt)
    shutil.rmtree(local_wheels)
    if mode == "watch":
        shutil.rmtree(mnt)  # the reset takes the watched directory with the runtime's disk

    second = Runtime(flow / "runtime-2", wheelhouse, f"env-{mode}-2")
    second.make_kernel_venv(wrapper, packages=["ipykernel"])
    second.env.update(PIP_INDEX_URL=DEAD_INDEX, PIP_RETRIES="0", PIP_TIMEOUT="2")
    nb = second.run_notebook("env_reset", params, outputs)
    seen = json.loads(results.read_text())
    tierfs_cmd("unwatch" if mode == "watch" else "umount", str(mnt), env=second.env)
    text = cell_text(nb)
    assert "environment" in text and "activated" in text, text
    record_metric(f"env_{mode}_install_secs", round(installed["install_secs"], 2))
    record_metric(f"env_{mode}_reset_to_pandas_secs", round(seen["to_pandas_secs"], 2))
    record_metric(f"env_{mode}_reset_mount_secs", round(seen["mount_secs"], 2))
    if mode == "fuse":
        _measure_reinstall(flow, env_wheelhouse)


def _measure_reinstall(flow: Path, env_wheelhouse: Path) -> None:
    """What the env saves: the same packages reinstalled into a fresh venv from the local
    wheelhouse, then ``import pandas`` (measured, never asserted). pip's wheel cache would
    do no better: it keeps the wheels it built or downloaded, and installs them as it does
    the wheelhouse's."""
    target = flow / "reinstall"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(target)], check=True)
    started = time.monotonic()
    pip = [sys.executable, "-m", "pip", "--python", str(target / "bin/python"), "install", "--quiet", "--no-index"]
    subprocess.run([*pip, "--find-links", str(env_wheelhouse), *PACKAGES], check=True)
    subprocess.run([str(target / "bin/python"), "-c", "import pandas"], check=True)
    record_metric("reinstall_wheelhouse_secs", round(time.monotonic() - started, 2))


def _run(code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    if check and done.returncode != 0:
        raise AssertionError(f"status {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


_MOUNT = """
import json, os, sys, tierfs
m = tierfs.mount(sys.argv[1], store=sys.argv[2], env=True)
print("RESULT " + json.dumps({"path": m.env.path, "aside": m.env.set_aside, "created": m.env.created,
      "sys_path": sys.path}))
m.unmount()
"""


def _result(done: subprocess.CompletedProcess[str]) -> dict:
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_another_pythons_env_is_set_aside(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    made = _result(_run(_MOUNT, str(mnt), str(store)))
    assert made["created"] and made["aside"] is None
    # The platform upgraded its image: its record says another Python made this env.
    record_file = mnt / ".tierfs" / "env" / "tierfs-env.json"
    _run("import tierfs; tierfs.mount(__import__('sys').argv[1], store=__import__('sys').argv[2])", str(mnt), str(store))
    record = json.loads(record_file.read_text())
    record.update(python="3.10.12", abi="cpython-310-x86_64-linux-gnu")
    record_file.write_text(json.dumps(record))
    (mnt / ".tierfs" / "env" / "lib" / "python3.10" / "site-packages" / "oldpkg").mkdir(parents=True)
    subprocess.run([sys.executable, "-c", "import tierfs; tierfs.attach(__import__('sys').argv[1]).unmount()", str(mnt)])

    done = _run(_MOUNT, str(mnt), str(store))
    said = [line for line in done.stdout.splitlines() if "set it aside" in line]
    assert len(said) == 1 and "made by CPython 3.10" in said[0] and "%pip install" in said[0], done.stdout
    seen = _result(done)
    aside = Path(seen["aside"])
    assert seen["created"] and aside.name.startswith("env.set-aside-cpython-3.10-"), seen
    assert not any(p.startswith(str(aside)) for p in seen["sys_path"]), "the old env was loaded"
    # Kept, not deleted: a remount still has it, beside the new env.
    _run("import tierfs, sys; tierfs.mount(sys.argv[1], store=sys.argv[2])", str(mnt), str(store))
    assert (mnt / ".tierfs" / aside.name / "lib" / "python3.10" / "site-packages" / "oldpkg").is_dir()
    assert json.loads(record_file.read_text())["python"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")


def test_a_record_that_does_not_decode_changes_nothing(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    _result(_run(_MOUNT, str(mnt), str(store)))
    _run("import tierfs, sys; tierfs.mount(sys.argv[1], store=sys.argv[2])", str(mnt), str(store))
    record_file = mnt / ".tierfs" / "env" / "tierfs-env.json"
    record_file.write_text('{"format": 1, "python": "3.11.2", "implementation": ["x"]}')
    listing = sorted(os.listdir(mnt / ".tierfs"))
    _run("import tierfs, sys; tierfs.attach(sys.argv[1]).unmount()", str(mnt), str(store))

    code = """
import sys, tierfs
try:
    tierfs.mount(sys.argv[1], store=sys.argv[2], env=True)
except tierfs.CorruptError as err:
    print("REFUSED", err.reason, str(err).count("\\n"))
"""
    done = _run(code, str(mnt), str(store))
    assert "REFUSED env_record 0" in done.stdout, done.stdout + done.stderr
    nothing_mounted_at(mnt, isolated)
    # Nothing changed: the same entries, the record as it was.
    _run("import tierfs, sys; tierfs.mount(sys.argv[1], store=sys.argv[2])", str(mnt), str(store))
    assert sorted(os.listdir(mnt / ".tierfs")) == listing
    assert '"implementation": ["x"]' in record_file.read_text()
