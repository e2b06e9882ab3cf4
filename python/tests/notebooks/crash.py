# %% [markdown]
# A kernel that dies (SIGKILL, as an out-of-memory kill would) while the workspace is mounted.

# %%
import os
import signal
from pathlib import Path

import tierfs

MNT = Path(os.environ["TIERFS_NB_MNT"])
m = tierfs.mount(MNT, store=os.environ["TIERFS_NB_STORE"])
assert m.reattached, m
(MNT / "written-before-the-crash.txt").write_text("still here\n")

# %%
os.kill(os.getpid(), signal.SIGKILL)
