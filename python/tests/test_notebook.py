"""The notebook flow end to end, in real Jupyter kernels (nbclient + ipykernel) over a real
FUSE mount: install the wheel, mount, train with checkpoints, sync, restart and crash the
kernel, reset the runtime, resume from the store. And the same ``mount()`` in kernels that
run where FUSE is unavailable (conftest's ``without_fuse``): watch mode, through a restart
and a crash, to a store that restores what they wrote.

The notebooks are ``notebooks/*.py`` (``# %%`` cells); they assert what they do themselves
(a failing cell fails the test) and hand what they saw to the next one in a results file
outside the mount. The executed notebooks are kept in the work directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import Runtime, cell_text, daemon_pids, make_file_store, record_metric, without_fuse

import tierfs
from tierfs import _mounttable

EPOCHS = 5
MORE_EPOCHS = 3


def test_train_restart_crash_reset_resume(work: Path, wheel: Path, wheelhouse: Path) -> None:
    flow = work / "flow"
    persistent = flow / "persistent"  # the store: what survives a reset (a bucket, a Drive folder)
    store = make_file_store(persistent)
    mnt = flow / "content" / "work"  # the same path in every runtime, like /content/work
    results = persistent / "results.json"
    outputs = work / "notebooks"
    params = dict(wheel=wheel, store=store, mnt=mnt, results=results, epochs=EPOCHS, more_epochs=MORE_EPOCHS)

    first = Runtime(flow / "runtime-1", wheelhouse, "first")
    record_metric("kernel_venv_secs", round(first.make_kernel_venv(), 2))

    nb = first.run_notebook("train", params, outputs)
    seen = json.loads(results.read_text())
    text = cell_text(nb)
    # What the magics printed, as a person reading the notebook sees it.
    assert seen["snapshot"] in text and f"epoch {EPOCHS - 1}" in text, text
    assert "last snapshot" in text
    assert "tierfs sync" in text, "sync(progress=True) showed no progress"
    record_metric("wheel_install_into_kernel_venv_secs", round(seen["install_secs"], 2))

    # The kernel is gone (nbclient shut it down); the daemon is not.
    assert seen["pid"] in daemon_pids(first.root), "the daemon died with the kernel"
    assert (entry := _mounttable.find(str(mnt))) is not None and entry.is_tierfs, entry

    # A kernel killed with SIGKILL while the workspace is mounted, then a new kernel.
    first.run_notebook("crash", params, outputs, allow_dead=True)
    assert seen["pid"] in daemon_pids(first.root), "the daemon died with a crashed kernel"
    nb = first.run_notebook("reattach", params, outputs)
    assert str(mnt) in cell_text(nb)

    # The reset: the runtime is recycled without an unmount. Nothing of it survives but the
    # store; what the first runtime wrote after its last sync may be lost, nothing before it.
    first.reset(mnt)
    assert not daemon_pids(flow) and _mounttable.find(str(mnt)) is None

    second = Runtime(flow / "runtime-2", wheelhouse, "second")
    second.make_kernel_venv()
    nb = second.run_notebook("resume", params, outputs)
    done = json.loads(results.read_text())
    assert done["resumed_snapshot"] in cell_text(nb)
    assert _mounttable.find(str(mnt)) is None, "the resumed notebook unmounted"
    record_metric("reset_wheel_install_secs", round(done["reset_install_secs"], 2))
    record_metric("reset_mount_secs", round(done["reset_mount_secs"], 2))
    record_metric("reset_mount_to_usable_secs", round(done["reset_usable_secs"], 2))


def test_no_fuse_kernel_falls_back_to_watch(
    work: Path, wheel: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = work / "no-fuse"
    store = make_file_store(flow / "persistent")
    mnt = flow / "content" / "work"
    results = flow / "persistent" / "results.json"
    outputs = work / "notebooks" / "no-fuse"
    params = dict(wheel=wheel, store=store, mnt=mnt, results=results)

    # Every kernel of this runtime starts in a mount namespace of its own without /dev/fuse.
    runtime = Runtime(flow / "runtime", wheelhouse, "no-fuse")
    runtime.make_kernel_venv(wrapper=without_fuse([]))
    nb = runtime.run_notebook("watch", params, outputs)
    seen = json.loads(results.read_text())
    text = cell_text(nb)
    said = [line for line in text.splitlines() if line.startswith("tierfs: no FUSE here")]
    assert len(said) == 1 and "/dev/fuse is missing" in said[0] and "watch mode" in said[0], text
    assert seen["snapshot"] in text and f"(watch, pid {seen['pid']})" in text, text
    assert "ran from the watched directory" in text
    record_metric("no_fuse_mount_secs", round(seen["mount_secs"], 2))

    # The watcher outlives the kernel; it is no mount, so nothing is in this table either.
    assert seen["pid"] in daemon_pids(runtime.root), "the watcher died with the kernel"
    assert _mounttable.find(str(mnt)) is None
    runtime.run_notebook("crash", params, outputs, allow_dead=True)
    assert seen["pid"] in daemon_pids(runtime.root), "the watcher died with a crashed kernel"
    nb = runtime.run_notebook("watch_finish", params, outputs)
    assert "stopped watching" in cell_text(nb) and not daemon_pids(runtime.root)

    # A fresh restore, from the store alone, has what the three kernels wrote.
    monkeypatch.setenv("XDG_DATA_HOME", str(flow / "restorer"))
    copy = flow / "restored"
    tierfs.restore(copy, store=store)
    ckpt = copy / "ckpt" / seen["last_checkpoint"]
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == seen["checkpoint_sha256"]
    assert sorted(p.name for p in (copy / "ckpt").iterdir()) == [f"epoch_{e:03d}.npz" for e in range(3)]
    assert (copy / "written-before-the-crash.txt").read_text() == "still here\n"
    assert (copy / "written-last.txt").read_text() == "just before unwatch\n"
    assert os.access(copy / "run.sh", os.X_OK)


def test_installed_not_source() -> None:
    """The tests import the installed wheel, not python/src."""
    here = Path(tierfs.__file__).resolve()
    assert "site-packages" in here.parts, here
    assert not str(here).startswith(str(Path(__file__).resolve().parents[1] / "src")), here
    binary = Path(tierfs.tierfs_binary()).resolve()
    assert binary.parent == Path(sys.prefix, "bin").resolve(), (binary, sys.prefix)
