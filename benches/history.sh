#!/usr/bin/env bash
# benches/history.sh [OUTDIR]
#
# Issue 21 (history of code and configs), the overhead of the history per sync: the same
# tree of N_FILES small files (N_DIRS directories; one in INCLUDED_EVERY is a `.py`, the
# rest `.bin`, which the history does not record) is written into two fresh mounts, each on a
# `file://` store of its own: one with `--no-history`, one with the history on. On each,
# three syncs: the first (the whole tree: data upload plus, with history, reading and
# committing every `.py`), a second after CHANGED `.py` files were rewritten, and a third
# with nothing changed. Reports the wall time of each `tierfs sync`, the ratio with/without
# history, the history's commit (files recorded, bytes read) and the bytes of the store's
# history objects, and the daemon's VmHWM. A benchmark run by hand: nothing here is a test.
#
# Env: N_FILES [100000], N_DIRS [N_FILES/100], INCLUDED_EVERY [5], CHANGED [10], FILE_BYTES
#   [2048], TIERFS_BIN_DIR (else a release build in $CARGO_TARGET_DIR [/var/tmp/tierfs-target]),
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench], KEEP_WORK=1 keeps the work dir.
# Output in OUTDIR (default $BENCH_ROOT/history/<date>): table.md, results.json, history.log,
#   the daemons' logs.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
OUTDIR=${1:-$BENCH_ROOT/history/$(date +%Y%m%d-%H%M%S)}
N_FILES=${N_FILES:-100000}
N_DIRS=${N_DIRS:-$((N_FILES / 100))}
INCLUDED_EVERY=${INCLUDED_EVERY:-5}
CHANGED=${CHANGED:-10}
FILE_BYTES=${FILE_BYTES:-2048}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
export TIERFS_PASSPHRASE=history-bench TIERFS_TEST_FAST_KDF=test
mkdir -p "$OUTDIR"
LOG=$OUTDIR/history.log
log() { printf '%s %s\n' "$(date +%T)" "$*" | tee -a "$LOG" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"
tierfs_binaries
WORK=$(mktemp -d "$BENCH_ROOT/history-work.XXXXXX") || die "mktemp"
MOUNTS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do "$TIERFS" umount "$m" >/dev/null 2>&1 || fusermount3 -u -z "$m" 2>/dev/null; done
  [[ ${KEEP_WORK:-0} == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

now() { date +%s.%N; }
# sync_ms MOUNTPOINT MESSAGE OUT: wall ms of one `tierfs --json sync`; its JSON in OUT
sync_ms() {
  local t0 t1
  t0=$(now)
  "$TIERFS" --json sync -m "$2" "$1" >"$3" 2>>"$LOG" || die "sync of $1 failed: $(cat "$3")"
  t1=$(now)
  python3 -c "print(round(($t1 - $t0) * 1000))"
}

RESULTS=()
for mode in off on; do
  dir=$WORK/$mode
  mkdir -p "$dir/mnt"
  "$TIERFS" init --store "$dir/store.toml" --backend "file://$dir/backend" >>"$LOG" 2>&1 || die "init"
  opts=(--store "$dir/store.toml" --data-dir "$dir/data" --cache-size 4G)
  [[ $mode == off ]] && opts+=(--no-history)
  "$TIERFS" --json mount "${opts[@]}" "$dir/mnt" >"$OUTDIR/mount-$mode.json" 2>>"$LOG" || die "mount: $(cat "$OUTDIR/mount-$mode.json")"
  MOUNTS+=("$dir/mnt")
  pid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$OUTDIR/mount-$mode.json")
  log "$mode: writing $N_FILES files in $N_DIRS directories"
  python3 - "$dir/mnt" "$N_FILES" "$N_DIRS" "$INCLUDED_EVERY" "$FILE_BYTES" <<'PY'
import os, random, sys
root, n, dirs, every, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(21)
for d in range(dirs):
    os.makedirs(f"{root}/d{d:05}", exist_ok=True)
for i in range(n):
    ext = "py" if i % every == 0 else "bin"
    body = (f"# file {i}\n" + "x = %d\n" % i * (size // 8)).encode()[:size] if ext == "py" else rng.randbytes(size)
    with open(f"{root}/d{i % dirs:05}/f{i:07}.{ext}", "wb") as f:
        f.write(body)
PY
  first=$(sync_ms "$dir/mnt" first "$OUTDIR/sync1-$mode.json")
  for i in $(seq 0 $((CHANGED - 1))); do
    f=$((i * INCLUDED_EVERY))
    echo "y = $i" >>"$dir/mnt/d$(printf %05d $((f % N_DIRS)))/f$(printf %07d $f).py"
  done
  second=$(sync_ms "$dir/mnt" second "$OUTDIR/sync2-$mode.json")
  third=$(sync_ms "$dir/mnt" third "$OUTDIR/sync3-$mode.json")
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
  hist_bytes=$(find "$dir/backend" -path '*/hist/*' -type f -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {print s+0}')
  store_bytes=$(du -sb "$dir/backend" | cut -f1)
  log "$mode: syncs ${first}/${second}/${third} ms, VmHWM ${hwm} kB, history objects $hist_bytes B of $store_bytes B"
  RESULTS+=("$mode $first $second $third $hwm $hist_bytes $store_bytes")
  cp "$dir/data/daemon.log" "$OUTDIR/daemon-$mode.log" 2>/dev/null
  "$TIERFS" umount "$dir/mnt" >>"$LOG" 2>&1 || log "umount $mode failed"
  stop_daemon "$pid"
  MOUNTS=()
done

python3 - "$OUTDIR" "$N_FILES" "$INCLUDED_EVERY" "$CHANGED" "${RESULTS[@]}" <<'PY'
import json, sys
out, n, every, changed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = {}
for r in sys.argv[5:]:
    mode, *v = r.split()
    rows[mode] = dict(zip(["first_ms", "second_ms", "third_ms", "vmhwm_kb", "history_bytes", "store_bytes"], map(int, v)))
hist = [json.load(open(f"{out}/sync{i}-on.json")).get("history", {}) for i in (1, 2, 3)]
lines = [f"History overhead per sync: {n} files, 1 in {every} a .py, {changed} changed before the 2nd sync", "",
         "| sync | no history (ms) | history (ms) | ratio | history commit | files recorded | bytes read |", "| --- | ---: | ---: | ---: | --- | ---: | ---: |"]
for i, k in enumerate(["first_ms", "second_ms", "third_ms"]):
    off, on = rows["off"][k], rows["on"][k]
    h = hist[i]
    lines.append(f"| {i + 1} | {off} | {on} | {on / max(off, 1):.2f} | {'yes' if h.get('commit') else 'no change'} | {h.get('files', 0)} | {h.get('read_bytes', 0)} |")
lines += ["", f"history objects in the store: {rows['on']['history_bytes']} bytes of {rows['on']['store_bytes']} (store without history: {rows['off']['store_bytes']})",
          f"daemon VmHWM: {rows['off']['vmhwm_kb']} kB without history, {rows['on']['vmhwm_kb']} kB with"]
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
json.dump({"rows": rows, "history": hist, "n_files": n}, open(f"{out}/results.json", "w"))
print("\n".join(lines))
PY
