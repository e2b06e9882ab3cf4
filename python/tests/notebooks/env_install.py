# %% [markdown]
# # The environment in the workspace: install
# `tierfs.mount(..., env=True)` keeps a virtualenv in the workspace (`.tierfs/env`) and makes
# it this kernel's: `%pip install` puts packages into it and `import` finds them at once. The
# test passes its parameters as `TIERFS_NB_*` environment variables; `MODE` is `fuse` or
# `watch` (a kernel without `/dev/fuse`).

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
WHEELHOUSE = os.environ["TIERFS_NB_WHEELHOUSE"]
MODE = os.environ["TIERFS_NB_MODE"]
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", WHEEL], check=True)
import tierfs

%load_ext tierfs

# %%
m = tierfs.mount(MNT, store=STORE, env=True)
env = m.env
assert m.mode == MODE and env is not None and env.created and env.set_aside is None, (m, env)
assert env.path == str(MNT / ".tierfs" / "env") and os.environ["VIRTUAL_ENV"] == env.path
assert os.environ["PATH"].split(os.pathsep)[0] == env.bin_dir
assert os.environ["HF_HOME"].startswith(str(MNT)) and os.environ["PIP_CACHE_DIR"].startswith(str(MNT))
assert env.site_packages in sys.path
again = tierfs.mount(MNT, store=STORE, env=True)  # a re-run cell: the same env, nothing new
assert again.reattached and not again.env.created and sys.path.count(env.site_packages) == 1

# %% [markdown]
# `%pip` runs this kernel's own pip; `PIP_PYTHON` sends it into the env.

# %%
t0 = time.monotonic()
%pip install --quiet --no-index --find-links {WHEELHOUSE} pandas tabulate more-itertools markupsafe
install_secs = time.monotonic() - t0

# %%
import markupsafe
import more_itertools
import numpy
import pandas
import tabulate
from markupsafe import _speedups

for module in (pandas, numpy, tabulate, more_itertools, markupsafe, _speedups):
    assert module.__file__.startswith(env.site_packages), (module, module.__file__)
frame = pandas.DataFrame({"epoch": [1, 2, 3], "loss": [0.9, 0.5, 0.3]})
assert frame.loss.idxmin() == 2 and list(more_itertools.chunked([1, 2, 3], 2)) == [[1, 2], [3]]
table = MNT / "table.txt"
table.write_text("name value\nx 1\n")
shown = subprocess.run(["tabulate", "-1", str(table)], check=True, capture_output=True, text=True).stdout
assert "name" in shown and "-----" in shown, shown
print(shown)

# %% [markdown]
# The kernel keeps the mount busy now (the packages' shared libraries are mapped from it):
# the test unmounts once the kernel has ended.

# %%
%tierfs sync "env with pandas"

# %%
_ = RESULTS.write_text(json.dumps({"install_secs": install_secs, "pandas": pandas.__version__}))
