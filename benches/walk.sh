#!/usr/bin/env bash
# benches/walk.sh BIN_DIR... [-- OUTDIR]
#
# Cold walks against the order files were made in (issue 48, item 4): FILES small files of KIB
# KiB in DIRS directories, made two ways: one directory after another ("seq"), and round-robin
# across the directories ("rr": f0 of every directory, then f1 of every one...; parallel
# downloaders, sharded writers). Each build (a directory with `tierfs` and `tierfs-daemon`)
# writes both trees to its store on one moto server and syncs; then a fresh node
# (`--no-refill`, fresh data dir, page cache dropped) reads each with `cat t/*/* >/dev/null`,
# and the same `cat` runs on the local disk (the trees written there in the same order).
# Prints a markdown table: seconds, ranged GETs, bytes the store sent / bytes read, pack
# neighbours fetched and used, and the issue's goals (rr <= 1.5x seq; fetched <= 1.2x read).
# A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   FILES [2000], KIB [48], DIRS [20]    the trees
#   ROUNDS [1]          reads of each tree per build (and of the local disk); medians
#   CACHE_MIB [4096]    tierfs --cache-size (the trees fit: nothing is evicted)
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options (word-split)
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (local trees, data dirs)
#   MOTO_SERVER [/var/lib/tierfs-test-tools/moto-venv/bin/moto_server]; BENCH_PY [python next
#                       to it] (needs boto3); MOTO_PORT [a free port]
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/walk/<date>): table.md, one
#   <build>.<tree>.r<N>.json per read (with the status counters it moved), status/ (`tierfs
#   status --json` before and after each read), walk.log, moto.log, env.txt.
# Needs root (drop_caches), python3, curl, fuse3, and moto as scripts/setup-debian.sh installs
# it. Everything started here is stopped and the work dir removed on exit (also on Ctrl-C).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILDS=()
while (($# > 0)) && [[ $1 != -- ]]; do BUILDS+=("$(cd "$1" && pwd)"); shift; done
[[ ${1:-} == -- ]] && shift
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/walk/$(date +%Y%m%d-%H%M%S)}
FILES=${FILES:-2000}
KIB=${KIB:-48}
DIRS=${DIRS:-20}
ROUNDS=${ROUNDS:-1}
CACHE_MIB=${CACHE_MIB:-4096}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
BUCKET=walk-bench
mkdir -p "$OUTDIR/status" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/walk.log
: >"$LOG"
log() { echo "[walk.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
((${#BUILDS[@]} > 0)) || die "usage: benches/walk.sh BIN_DIR... [-- OUTDIR]"
for n in FILES KIB DIRS ROUNDS CACHE_MIB; do
  [[ ${!n} =~ ^[0-9]+$ && ${!n} -gt 0 ]] || die "$n=${!n} is not a positive number"
done
for tool in python3 curl mountpoint fusermount3; do command -v "$tool" >/dev/null || die "$tool missing"; done
[[ -x $MOTO_SERVER ]] || die "moto_server not found at $MOTO_SERVER (scripts/setup-debian.sh installs it; or set MOTO_SERVER)"
"$BENCH_PY" -c 'import boto3' 2>/dev/null || die "$BENCH_PY has no boto3 (set BENCH_PY to a python with boto3)"
[[ $(id -u) == 0 ]] || die "needs root (drop_caches): reads would be warm otherwise"
for B in "${!BUILDS[@]}"; do
  [[ -x ${BUILDS[$B]}/tierfs && -x ${BUILDS[$B]}/tierfs-daemon ]] || die "no tierfs and tierfs-daemon in ${BUILDS[$B]}"
done
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/walk.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
MOTO_PID='' TBIN='' TMNT='' TPID='' TDATA=''
cleanup() {
  trap - EXIT INT TERM
  set +e
  tierfs_umount
  stop_moto
  rm -rf "$WORK"
  mount | grep -F "$WORK" >&2 && echo "walk.sh: WARNING: mounts left under $WORK" >&2
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# make_tree ORDER ROOT: writes the tree under ROOT/t in ORDER (seq or rr), the same bytes
# whatever the order (file i of directory d is seeded by d and i)
make_tree() {
  python3 - "$1" "$2/t" "$FILES" "$KIB" "$DIRS" <<'PY' || die "writing the $1 tree under $2 failed"
import os, random, sys
order, root, files, kib, dirs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
per = files // dirs
for d in range(dirs):
    os.makedirs(f"{root}/d{d:02}", exist_ok=True)
pairs = [(d, i) for d in range(dirs) for i in range(per)] if order == "seq" else \
        [(d, i) for i in range(per) for d in range(dirs)]
for d, i in pairs:
    with open(f"{root}/d{d:02}/f{i:04}", "wb") as f:
        f.write(random.Random(d * 1_000_003 + i).randbytes(kib << 10))
PY
}
# walk NAME DIR: `cat DIR/t/*/* >/dev/null` timed, into OUTDIR/NAME.json
walk() {
  local t0 s
  drop_caches
  t0=$EPOCHREALTIME
  cat "$2"/t/*/* >/dev/null || die "$1: cat failed"
  s=$(since "$t0")
  echo "{\"seconds\": $s, \"bytes\": $((FILES / DIRS * DIRS * KIB * 1024))}" >"$OUTDIR/$1.json"
}
# counters BEFORE AFTER: the status counters a read moved, as JSON
counters() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def get(p):
    d = json.load(open(p))
    gets = recv = 0
    for b in d.get("backends") or []:
        tr = b.get("traffic") or {}
        recv += tr.get("received_bytes", 0)
        gets += sum(r.get("calls", 0) for r in tr.get("requests", []) if r.get("op") in ("get", "get_range"))
    c = d.get("cold") or {}
    return {"gets": gets, "received_bytes": recv, "fetched_bytes": c.get("fetched_bytes", 0),
            "neighbour_blocks": c.get("neighbour_blocks", 0), "neighbour_bytes": c.get("neighbour_bytes", 0),
            "neighbour_hits": c.get("neighbour_hits", 0), "read_misses": c.get("read_misses", 0)}
a, b = get(sys.argv[1]), get(sys.argv[2])
print(json.dumps({k: b[k] - a[k] for k in a}))
PY
}
merge() {
  python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d.update(json.loads(sys.argv[2])); json.dump(d,open(p,"w"))' \
    "$OUTDIR/$1.json" "$2"
}
tierfs_mount() {
  local out
  TDATA=$WORK/data TMNT=$WORK/mnt
  rm -rf "$TDATA"; mkdir -p "$TDATA" "$TMNT"
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  out=$(t --json mount --timeout 1800 --store "$WORK/store-b$B.toml" --workspace "$1" --data-dir "$TDATA" \
    --cache-size "${CACHE_MIB}M" ${TIERFS_MOUNT_OPTS:-} "${@:2}" "$TMNT" 2>>"$LOG") || { TMNT=''; die "build b$B: mount of $1 failed (see $LOG)"; }
  TPID=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pid") or "")' 2>/dev/null)
}

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  for B in "${!BUILDS[@]}"; do echo "build b$B: ${BUILDS[$B]} ($(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || echo '?'))"; done
  echo "FILES=$FILES KIB=$KIB DIRS=$DIRS ROUNDS=$ROUNDS CACHE_MIB=$CACHE_MIB mount opts '${TIERFS_MOUNT_OPTS:-}'"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2

start_moto
mkdir -p "$WORK/run"
for tree in seq rr; do make_tree "$tree" "$WORK/local-$tree"; done
for B in "${!BUILDS[@]}"; do
  TBIN=${BUILDS[$B]}
  t init --store "$WORK/store-b$B.toml" --backend "s3://$BUCKET/b$B?endpoint=$S3_ENDPOINT&region=$AWS_REGION" \
    >>"$LOG" 2>&1 || die "build b$B: tierfs init failed (see $LOG)"
  for tree in seq rr; do
    tierfs_mount "$tree"
    make_tree "$tree" "$TMNT"
    t sync --timeout 1800 "$TMNT" >>"$LOG" 2>&1 || die "build b$B: tierfs sync of $tree failed (see $LOG)"
    tierfs_umount
    log "build b$B: $tree written and synced"
  done
done
for r in $(seq "$ROUNDS"); do
  for tree in seq rr; do
    walk "local.$tree.r$r" "$WORK/local-$tree"
    log "local.$tree.r$r: $(cat "$OUTDIR/local.$tree.r$r.json")"
    for B in "${!BUILDS[@]}"; do
      TBIN=${BUILDS[$B]} name=b$B.$tree.r$r
      tierfs_mount "$tree" --no-refill
      t --json status "$TMNT" >"$OUTDIR/status/$name.before.json" 2>>"$LOG"
      walk "$name" "$TMNT"
      t --json status "$TMNT" >"$OUTDIR/status/$name.after.json" 2>>"$LOG"
      merge "$name" "$(counters "$OUTDIR/status/$name.before.json" "$OUTDIR/status/$name.after.json")"
      tierfs_umount
      log "$name: $(cat "$OUTDIR/$name.json")"
    done
  done
done

python3 - "$OUTDIR" "${#BUILDS[@]}" "${BUILDS[@]}" <<'PY' | tee "$OUTDIR/table.md"
import glob, json, os, statistics, sys
out, n, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def med(name, key):
    vals = [json.load(open(f)).get(key) for f in glob.glob(os.path.join(out, f"{name}.r*.json"))]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None
def label(b):
    try:
        return "tierfs " + open(os.path.join(builds[b], "COMMIT")).read().strip()
    except OSError:
        return "tierfs " + os.path.basename(builds[b])
print("| reader | tree | seconds | x local | GETs | store sent / read | neighbours fetched (MiB) / used (blocks) | rr / seq (goal <= 1.5x) |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for tree in ("seq", "rr"):
    print(f"| local disk | {tree} | {med(f'local.{tree}', 'seconds'):.2f} | 1.00 | | | | |")
for b in range(n):
    for tree in ("seq", "rr"):
        s, loc = med(f"b{b}.{tree}", "seconds"), med(f"local.{tree}", "seconds")
        read, recv = med(f"b{b}.{tree}", "bytes"), med(f"b{b}.{tree}", "received_bytes")
        nb, nh = med(f"b{b}.{tree}", "neighbour_bytes"), med(f"b{b}.{tree}", "neighbour_hits")
        ratio = f"{s / med(f'b{b}.seq', 'seconds'):.2f}x" if tree == "rr" else ""
        print(f"| {label(b)} | {tree} | {s:.2f} | {s / loc:.1f} | {med(f'b{b}.{tree}', 'gets'):.0f} | "
              f"{recv / read:.2f}x | {nb / 2**20:.1f} / {nh:.0f} | {ratio} |")
PY
log "results: $OUTDIR"
