# %% [markdown]
# # Train on a tierfs workspace
# The first session of a runtime: install the wheel, mount, put a virtualenv on the mount,
# train a tiny model with a checkpoint every epoch, and sync with a message.
# The test passes its parameters as `TIERFS_NB_*` environment variables.

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
print(sys.executable)

# %% [markdown]
# After a reset nothing but the store is left: install the wheel (built once, kept beside the
# store) into the kernel's environment. No network, no Rust toolchain.

# %%
started = time.monotonic()
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", WHEEL], check=True)
install_secs = time.monotonic() - started
print(f"installed {Path(WHEEL).name} in {install_secs:.2f} s")

# %%
import tierfs

site = Path(tierfs.__file__).resolve()
assert str(site).startswith(sys.prefix), f"tierfs imported from {site}, not from the kernel's venv {sys.prefix}"
assert Path(tierfs.tierfs_binary()).resolve().parent == Path(sys.prefix, "bin").resolve(), tierfs.tierfs_binary()
print(tierfs.__version__, tierfs.tierfs_binary())
%load_ext tierfs

# %%
m = tierfs.mount(MNT, store=STORE)
assert m.mode == "fuse" and m.workspace == "default" and not m.reattached, m
again = tierfs.mount(MNT, store=STORE)  # a re-run cell: the same mount
assert again.reattached and again.pid == m.pid, (again, m)
m

# %% [markdown]
# A virtualenv on the mount, and scripts run from it: exec bits and symlinks must hold.

# %%
venv = MNT / "venv"
subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
hello = venv / "bin" / "hello"
hello.write_text(f"#!{venv}/bin/python\nimport sys\nprint('hello from', sys.prefix)\n")
hello.chmod(0o755)
out = subprocess.run([str(hello)], check=True, capture_output=True, text=True).stdout
assert out.strip() == f"hello from {venv}", out
pip_version = subprocess.run([str(venv / "bin" / "pip"), "--version"], check=True, capture_output=True, text=True).stdout
assert str(venv) in pip_version, pip_version
print(out.strip(), "|", pip_version.strip())

# %% [markdown]
# A tiny numpy model (logistic regression, full-batch gradient descent: deterministic), with a
# checkpoint saved every epoch.

# %%
import numpy as np


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8))
    y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=512) > 0).astype(np.float64)
    return x, y


def epoch(w, b, x, y, lr=0.5):
    p = 1 / (1 + np.exp(-(x @ w + b)))
    return w - lr * x.T @ (p - y) / len(y), b - lr * float(np.mean(p - y))


x, y = data()
w, b = np.zeros(8), 0.0
ckpt = MNT / "ckpt"
ckpt.mkdir(exist_ok=True)
for e in range(EPOCHS):
    w, b = epoch(w, b, x, y)
    np.savez(ckpt / f"epoch_{e:03d}.npz", w=w, b=np.array(b), epoch=np.array(e))
last = ckpt / f"epoch_{EPOCHS - 1:03d}.npz"
print(sorted(p.name for p in ckpt.iterdir()))

# %%
snap = m.sync(f"epoch {EPOCHS - 1}", progress=True)
assert snap.message == f"epoch {EPOCHS - 1}" and snap.id, snap
status = m.status()
# Data written before the sync is in the store; metadata the sync itself writes may still
# be on its way, so `status.synced` is not asserted here.
assert status.pending_bytes == 0 and status.last_snapshot == snap.id, status
print(snap.id)

# %% [markdown]
# The magics show that snapshot (the test also reads these cells' output).

# %%
%tierfs snapshots

# %%
%tierfs status

# %%
from IPython.utils.capture import capture_output

with capture_output() as listed:
    get_ipython().run_line_magic("tierfs", "snapshots")
assert snap.id in listed.stdout and f"epoch {EPOCHS - 1}" in listed.stdout, listed.stdout
with capture_output() as shown:
    get_ipython().run_line_magic("tierfs", "status")
assert snap.id in shown.stdout and "WARNING" not in shown.stdout, shown.stdout
with capture_output() as synced:
    get_ipython().run_line_magic("tierfs", 'sync "from the magic"')
magic_snap = synced.stdout.split()[1]
assert "'from the magic'" in synced.stdout and magic_snap != snap.id, synced.stdout
listing = {s.id: s.message for s in tierfs.snapshots(STORE)}
assert listing[snap.id] == f"epoch {EPOCHS - 1}" and listing[magic_snap] == "from the magic", listing

# %%
digest = lambda data: hashlib.sha256(data).hexdigest()
_ = RESULTS.write_text(
    json.dumps(
        {
            "install_secs": install_secs,
            "pid": m.pid,
            "snapshot": snap.id,
            "magic_snapshot": magic_snap,
            "last_checkpoint": last.name,
            "checkpoint_sha256": digest(last.read_bytes()),
            "weights_sha256": digest(w.tobytes() + np.array(b).tobytes()),
        }
    )
)
