# %% [markdown]
# # The environment after a reset
# A fresh runtime: new HOME, empty data dir, a kernel venv with nothing but ipykernel, the
# package index and the wheelhouse both out of reach. The same `mount(env=True)` brings the
# workspace back, and with it every package installed into its env, importable at once.

# %%
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
MODE = os.environ["TIERFS_NB_MODE"]
assert not os.path.exists(os.environ["TIERFS_NB_WHEELHOUSE"]), "the wheelhouse should be gone"
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", WHEEL], check=True)
import tierfs

# %%
t0 = time.monotonic()
m = tierfs.mount(MNT, store=STORE, env=True)
mount_secs = time.monotonic() - t0
import pandas

to_pandas_secs = time.monotonic() - t0
assert m.mode == MODE and not m.env.created and m.env.set_aside is None, (m, m.env)
assert pandas.__file__.startswith(m.env.site_packages), pandas.__file__

# %%
import markupsafe
import more_itertools
import numpy
import tabulate
from markupsafe import _speedups

for module in (numpy, tabulate, more_itertools, markupsafe, _speedups):
    assert module.__file__.startswith(m.env.site_packages), (module, module.__file__)
assert pandas.DataFrame({"loss": [0.9, 0.3]}).loss.min() == 0.3
shown = subprocess.run(["tabulate", "-1", str(MNT / "table.txt")], check=True, capture_output=True, text=True).stdout
assert "name" in shown and "-----" in shown, shown
print(shown)

# %% [markdown]
# Nothing was installed: pip can reach no index here, so an install would have failed.

# %%
probe = subprocess.run(
    [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", "/nonexistent", "six"],
    capture_output=True,
    text=True,
    timeout=300,
)
assert probe.returncode != 0, probe

# %%
before = json.loads(RESULTS.read_text())
before.update(mount_secs=mount_secs, to_pandas_secs=to_pandas_secs)
_ = RESULTS.write_text(json.dumps(before))
