# %% [markdown]
# # No FUSE: the same `mount()`, in watch mode
# This kernel runs where FUSE is unavailable (no `/dev/fuse`, as in a container started
# without `--device /dev/fuse`). `tierfs.mount()` serves the same path in watch mode: the
# directory stays a plain directory and a watcher syncs it to the store. The test passes its
# parameters as `TIERFS_NB_*` environment variables.

# %%
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WHEEL = os.environ["TIERFS_NB_WHEEL"]
STORE = os.environ["TIERFS_NB_STORE"]
MNT = Path(os.environ["TIERFS_NB_MNT"])
RESULTS = Path(os.environ["TIERFS_NB_RESULTS"])
assert not os.path.exists("/dev/fuse"), "this kernel should run without /dev/fuse"

# %%
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", WHEEL], check=True)
import tierfs

%load_ext tierfs

# %%
t0 = time.monotonic()
m = tierfs.mount(MNT, store=STORE)
mount_secs = time.monotonic() - t0
assert m.mode == "watch" and not m.reattached and "/dev/fuse is missing" in (m.fallback_reason or ""), m
again = tierfs.mount(MNT, store=STORE)  # a re-run cell: the same watch
assert again.reattached and again.pid == m.pid and again.mode == "watch", (again, m)
m

# %% [markdown]
# Work in the directory as on a local disk: checkpoints every epoch, and a script run from it.

# %%
import numpy as np

ckpt = MNT / "ckpt"
ckpt.mkdir(exist_ok=True)
rng = np.random.default_rng(0)
w = np.zeros(8)
for e in range(3):
    w = w + rng.normal(size=8)
    np.savez(ckpt / f"epoch_{e:03d}.npz", w=w, epoch=np.array(e))
last = ckpt / "epoch_002.npz"
run = MNT / "run.sh"
run.write_text("#!/bin/sh\necho ran from the watched directory\n")
run.chmod(0o755)
print(subprocess.run([str(run)], check=True, capture_output=True, text=True).stdout.strip())

# %%
%tierfs sync "watched epoch 2"

# %%
%tierfs status

# %%
from IPython.utils.capture import capture_output

with capture_output() as shown:
    get_ipython().run_line_magic("tierfs", "status")
status = m.status()
assert status.mode == "watch" and status.last_snapshot and status.pending_bytes == 0, status
assert f"(watch, pid {m.pid})" in shown.stdout and status.last_snapshot in shown.stdout, shown.stdout
listing = {s.id: s.message for s in tierfs.snapshots(STORE)}
assert listing[status.last_snapshot] == "watched epoch 2", listing
_ = RESULTS.write_text(
    json.dumps(
        {
            "pid": m.pid,
            "mount_secs": mount_secs,
            "snapshot": status.last_snapshot,
            "last_checkpoint": last.name,
            "checkpoint_sha256": hashlib.sha256(last.read_bytes()).hexdigest(),
        }
    )
)
