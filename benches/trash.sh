#!/usr/bin/env bash
# benches/trash.sh BIN_DIR [ENTRIES] [REMOVED]
#
# Issue 49 (the trash): the time `tierfs trash list` takes after `rm -rf` of REMOVED files
# (default 10 000) from a directory `big/out` beside ENTRIES - 1 other entries of `big/`
# (default 100 000 in all), on a `file://` store. The listing replays the whole retention
# window of the journal (every create here, too) and names each removed file by its path, so
# this measures both: the replay per batch, and whether naming a removal costs a listing of
# the big directory. Prints the entries listed, the journal's batches (the workspace's last
# batch number: the listing replays them all, the window being younger than 7 days) and the
# command's wall time. A benchmark run by hand: nothing here is a test.
#
# Needs root and fuse3.
set -euo pipefail
BIN=$(cd "${1:?BIN_DIR with tierfs and tierfs-daemon}" && pwd)
ENTRIES=${2:-100000}
REMOVED=${3:-10000}
export TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test
T=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-trash-bench.XXXX")
export TIERFS_RUNTIME_DIR=$T/run
"$BIN/tierfs" init --store "$T/store.toml" --backend "file://$T/b" >/dev/null
mkdir "$T/mnt"
"$BIN/tierfs" mount --standalone --store "$T/store.toml" --data-dir "$T/data" "$T/mnt" >/dev/null
mkdir -p "$T/mnt/big/out"
for i in $(seq 1 $((ENTRIES - 1))); do : >"$T/mnt/big/f$i"; done
for i in $(seq 1 "$REMOVED"); do : >"$T/mnt/big/out/r$i"; done
"$BIN/tierfs" flush "$T/mnt" >/dev/null
rm -rf "$T/mnt/big/out"
"$BIN/tierfs" flush "$T/mnt" >/dev/null
"$BIN/tierfs" --json status "$T/mnt" >"$T/status.json"
start=$(date +%s.%N)
"$BIN/tierfs" --json trash list "$T/mnt" >"$T/list.json"
end=$(date +%s.%N)
python3 - "$T/list.json" "$T/status.json" "$start" "$end" <<'PY'
import json, sys
listed = json.load(open(sys.argv[1]))
def last_seq(v):
    if isinstance(v, dict):
        if "last_seq" in v:
            return v["last_seq"]
        v = list(v.values())
    if isinstance(v, list):
        for x in v:
            if (s := last_seq(x)) is not None:
                return s
    return None
batches = last_seq(json.load(open(sys.argv[2])))
wall = float(sys.argv[4]) - float(sys.argv[3])
per_k = f" ms_per_1k_batches={wall * 1e6 / batches:.0f}" if batches else ""
print(f"listed={len(listed)} journal_batches={batches} wall_s={wall:.2f}{per_k}")
PY
"$BIN/tierfs" umount "$T/mnt" >/dev/null
rm -rf "$T"
