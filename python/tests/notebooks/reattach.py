# %% [markdown]
# A new kernel after a restart or a crash: the daemon outlived the old kernel, and `mount()`
# reattaches to the running mount instead of starting another.

# %%
import json
import os
from pathlib import Path

import tierfs

MNT = Path(os.environ["TIERFS_NB_MNT"])
before = json.loads(Path(os.environ["TIERFS_NB_RESULTS"]).read_text())
m = tierfs.mount(MNT, store=os.environ["TIERFS_NB_STORE"])
assert m.reattached and m.pid == before["pid"], (m, before)
assert (MNT / "written-before-the-crash.txt").read_text() == "still here\n"
assert (MNT / "ckpt" / before["last_checkpoint"]).is_file()
m

# %%
%load_ext tierfs
%tierfs status
