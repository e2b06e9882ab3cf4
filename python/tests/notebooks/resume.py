# %% [markdown]
# # Resume after a runtime reset
# A fresh runtime: new kernel venv, empty data dir, no daemon. Install the wheel, mount the
# same workspace from the store, and resume training from the last checkpoint.

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
EPOCHS = int(os.environ["TIERFS_NB_EPOCHS"])
MORE = int(os.environ["TIERFS_NB_MORE_EPOCHS"])
before = json.loads(RESULTS.read_text())
assert not Path(os.environ["XDG_DATA_HOME"], "tierfs").exists(), "the data home should be empty after a reset"

# %%
started = time.monotonic()
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", WHEEL], check=True)
install_secs = time.monotonic() - started
import numpy as np
import tierfs

%load_ext tierfs

# %% [markdown]
# From `mount()` to a usable workspace: the mount is up and the last checkpoint is read.

# %%
t0 = time.monotonic()
m = tierfs.mount(MNT, store=STORE)
mount_secs = time.monotonic() - t0
ckpt = MNT / "ckpt"
names = sorted(p.name for p in ckpt.iterdir())
last = ckpt / names[-1]
raw = last.read_bytes()
usable_secs = time.monotonic() - t0
assert not m.reattached and m.pid != before["pid"], m
print(f"mount() {mount_secs:.2f} s, last checkpoint read {usable_secs:.2f} s after mount() was called")

# %%
digest = lambda data: hashlib.sha256(data).hexdigest()
assert names[-1] == before["last_checkpoint"], (names, before)
assert len(names) == EPOCHS, names
assert digest(raw) == before["checkpoint_sha256"], "the checkpoint file changed across the reset"
with np.load(last) as state:  # an open .npz holds its file: the unmount below needs it closed
    w, b, start = state["w"], float(state["b"]), int(state["epoch"]) + 1
assert digest(w.tobytes() + np.array(b).tobytes()) == before["weights_sha256"], "weights differ after the reset"

# %% [markdown]
# The virtualenv made before the reset still runs: exec bits and symlinks came back from the
# store.

# %%
venv = MNT / "venv"
out = subprocess.run([str(venv / "bin" / "hello")], check=True, capture_output=True, text=True).stdout
assert out.strip() == f"hello from {venv}", out
pip_version = subprocess.run([str(venv / "bin" / "pip"), "--version"], check=True, capture_output=True, text=True).stdout
assert str(venv) in pip_version, pip_version

# %% [markdown]
# Resume for a few more epochs, then check against a run that was never interrupted: the
# same weights, byte for byte.

# %%
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8))
    y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=512) > 0).astype(np.float64)
    return x, y


def epoch(w, b, x, y, lr=0.5):
    p = 1 / (1 + np.exp(-(x @ w + b)))
    return w - lr * x.T @ (p - y) / len(y), b - lr * float(np.mean(p - y))


x, y = data()
for e in range(start, start + MORE):
    w, b = epoch(w, b, x, y)
    np.savez(ckpt / f"epoch_{e:03d}.npz", w=w, b=np.array(b), epoch=np.array(e))
rw, rb = np.zeros(8), 0.0
for e in range(start + MORE):
    rw, rb = epoch(rw, rb, x, y)
assert w.tobytes() == rw.tobytes() and np.array(b).tobytes() == np.array(rb).tobytes(), (w, rw, b, rb)

# %%
snap = m.sync("resumed")
%tierfs snapshots

# %%
ids = [s.id for s in m.snapshots()]
assert before["snapshot"] in ids and before["magic_snapshot"] in ids and ids[-1] == snap.id, ids
m.unmount()
assert not m.is_mounted
before.update(reset_install_secs=install_secs, reset_mount_secs=mount_secs, reset_usable_secs=usable_secs, resumed_snapshot=snap.id)
_ = RESULTS.write_text(json.dumps(before))
