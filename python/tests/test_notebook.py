"""The notebook flow end to end, in real Jupyter kernels (nbclient + ipykernel) over a real
FUSE mount: install the wheel, mount, train with checkpoints, sync, restart and crash the
kernel, reset the runtime, resume from the store.

The notebooks are ``notebooks/*.py`` (``# %%`` cells); they assert what they do themselves
(a failing cell fails the test) and hand what they saw to the next one in a results file
outside the mount. The executed notebooks are kept in the work directory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import Runtime, cell_text, daemon_pids, make_file_store, record_metric

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


def test_installed_not_source() -> None:
    """The tests import the installed wheel, not python/src."""
    here = Path(tierfs.__file__).resolve()
    assert "site-packages" in here.parts, here
    assert not str(here).startswith(str(Path(__file__).resolve().parents[1] / "src")), here
    binary = Path(tierfs.tierfs_binary()).resolve()
    assert binary.parent == Path(sys.prefix, "bin").resolve(), (binary, sys.prefix)
