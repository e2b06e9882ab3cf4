# %% [markdown]
# A new kernel, still without FUSE, after a restart and a crash: `mount()` reattaches to the
# watcher that outlived them, and `unmount()` stops watching (a last pass, then the flush).

# %%
import json
import os
from pathlib import Path

import tierfs

MNT = Path(os.environ["TIERFS_NB_MNT"])
before = json.loads(Path(os.environ["TIERFS_NB_RESULTS"]).read_text())
assert not os.path.exists("/dev/fuse"), "this kernel should run without /dev/fuse"
m = tierfs.mount(MNT, store=os.environ["TIERFS_NB_STORE"])
assert m.reattached and m.mode == "watch" and m.pid == before["pid"], (m, before)
assert (MNT / "written-before-the-crash.txt").read_text() == "still here\n"
assert (MNT / "ckpt" / before["last_checkpoint"]).is_file()
m

# %%
%load_ext tierfs
%tierfs status

# %%
(MNT / "written-last.txt").write_text("just before unwatch\n")
m.unmount()
assert not m.is_mounted and not tierfs.mounts()
print("stopped watching", MNT)
