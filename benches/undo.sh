#!/usr/bin/env bash
# benches/undo.sh BIN_DIR [BATCHES...]
#
# Issue 49 (undo to the second): the time `tierfs restore --at` takes for a point N journal
# batches after its base. For each N: a `file://` store, a mount, a sync (the base), N/3 small
# files written (a create, a write and a close: three batches each), a flush, the time of day
# between two 1.2 s pauses (T), an unmount (whose checkpoint is younger than T, so the sync
# stays the base), then `tierfs --json restore --at T`. Prints the batches replayed, the
# metadata rebuild (`at.rebuild_millis`: reading the base and the journal, applying them), the
# whole restore (`millis`, the copy of the files included) and the command's wall time. A
# benchmark run by hand: nothing here is a test.
#
# Needs root and fuse3. BATCHES defaults to 1000 10000 100000.
set -euo pipefail
BIN=$(cd "${1:?BIN_DIR with tierfs and tierfs-daemon}" && pwd)
shift
SIZES=("$@")
((${#SIZES[@]})) || SIZES=(1000 10000 100000)
export TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test
for n in "${SIZES[@]}"; do
    T=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-undo-bench.XXXX")
    export TIERFS_RUNTIME_DIR=$T/run
    "$BIN/tierfs" init --store "$T/store.toml" --backend "file://$T/b" >/dev/null
    mkdir "$T/mnt"
    "$BIN/tierfs" mount --standalone --store "$T/store.toml" --data-dir "$T/data" "$T/mnt" >/dev/null
    "$BIN/tierfs" sync -m base "$T/mnt" >/dev/null 2>&1
    for i in $(seq 1 $((n / 3))); do echo "file $i" >"$T/mnt/f$i"; done
    "$BIN/tierfs" flush "$T/mnt" >/dev/null
    sleep 1.2
    AT=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
    sleep 1.2
    "$BIN/tierfs" umount "$T/mnt" >/dev/null
    start=$(date +%s.%N)
    "$BIN/tierfs" --json restore --store "$T/store.toml" --at "$AT" "$T/out" >"$T/report.json"
    end=$(date +%s.%N)
    python3 - "$T/report.json" "$start" "$end" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"batches={r['at']['batches']} base={r['at']['base']['kind']} files={r['files']} "
      f"rebuild_ms={r['at']['rebuild_millis']} restore_ms={r['millis']} wall_s={wall:.2f}")
PY
    rm -rf "$T"
done
