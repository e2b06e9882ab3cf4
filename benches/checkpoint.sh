#!/usr/bin/env bash
# benches/checkpoint.sh BIN_DIR... [-- OUTDIR]
#
# Issue 24 item 4 (checkpoints): a `torch.save`-style write (one large file written
# sequentially in 4 MiB writes under a temporary name, fsync, rename over the final name,
# fsync of the directory), timed phase by phase, into a plain directory on the data dir's disk
# (the local-disk speed the issue asks for), and for each build given (a directory with
# `tierfs` and `tierfs-daemon`) into three tierfs mounts: the hot tier alone (--no-store), the
# embedded default store (same disk, fsync local), and a store on moto (three buckets of one
# moto server as replicas; fsync returns once the data is durable there, the time the issue
# wants reported). The raw parallel PUT of the same bytes to moto is the floor of that fsync.
# Every round writes fresh random bytes (a repeated checkpoint would dedup). Prints a markdown
# table of medians. A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   SIZE_MIB [1024]   the checkpoint
#   CACHE_MIB [4096]  tierfs --cache-size (larger than the checkpoint: it stays in the hot tier)
#   ROUNDS [3]        writes per target (each with its own bytes), interleaved over the targets
#   REPLICAS [3]      buckets of the moto server the store replicates to
# Needs root (drop_caches), python3, curl, fuse3, and moto as scripts/setup-debian.sh installs
# it (MOTO_SERVER to override). Everything started here is stopped on exit.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILDS=()
while (($# > 0)) && [[ $1 != -- ]]; do BUILDS+=("$(cd "$1" && pwd)"); shift; done
[[ ${1:-} == -- ]] && shift
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/checkpoint/$(date +%Y%m%d-%H%M%S)}
SIZE_MIB=${SIZE_MIB:-1024}
CACHE_MIB=${CACHE_MIB:-4096}
ROUNDS=${ROUNDS:-3}
REPLICAS=${REPLICAS:-3}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=ckpt-raw
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/checkpoint.log
: >"$LOG"
log() { echo "[checkpoint.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
((${#BUILDS[@]} > 0)) || die "usage: benches/checkpoint.sh BIN_DIR... [-- OUTDIR]"
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-ckpt.XXXXXX")
MOTO_PID='' TMNT='' TBIN=''
t() {
  XDG_DATA_HOME=$WORK/xdg TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test \
    "$TBIN/tierfs" --runtime-dir "$WORK/run" "$@"
}
cleanup() {
  [[ -n $TMNT ]] && mountpoint -q "$TMNT" && { t umount "$TMNT" >>"$LOG" 2>&1 || fusermount3 -u "$TMNT"; }
  [[ -n $MOTO_PID ]] && kill "$MOTO_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# The writer: phases timed separately, printed as one JSON line.
WRITER='
import json, os, sys, time
src, target_dir = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
tmp, final = os.path.join(target_dir, "ckpt.pt.tmp"), os.path.join(target_dir, "ckpt.pt")
t0 = time.monotonic()
fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
view, step = memoryview(data), 4 << 20
for off in range(0, len(data), step):
    os.write(fd, view[off:off + step])
t1 = time.monotonic()
os.fsync(fd)
os.close(fd)
t2 = time.monotonic()
os.rename(tmp, final)
d = os.open(target_dir, os.O_RDONLY)
os.fsync(d)
os.close(d)
t3 = time.monotonic()
print(json.dumps({"write_s": t1 - t0, "fsync_s": t2 - t1, "rename_s": t3 - t2, "total_s": t3 - t0,
                  "bytes": len(data)}))
'

start_moto
[[ -n ${RAW:-} ]] || die "no raw S3 client"
# record KEY JSON: keeps one measurement
record() { echo "$1 $2" >>"$OUTDIR/results.txt"; log "$1: $2"; }
fresh_source() { dd if=/dev/urandom of="$WORK/src" bs=1M count="$SIZE_MIB" status=none || die "writing the source failed"; }

for B in "${!BUILDS[@]}"; do
  TBIN=${BUILDS[$B]}
  backends=()
  for i in $(seq 0 $((REPLICAS - 1))); do
    "${RAW[@]}" --bucket "ckpt-b$B-r$i" mkbucket 2>>"$LOG" || die "creating a bucket failed"
    backends+=(--backend "s3://ckpt-b$B-r$i/ws?endpoint=$S3_ENDPOINT&region=us-east-1")
  done
  t init --store "$WORK/store-$B.toml" "${backends[@]}" >>"$LOG" 2>&1 || die "init failed (see $LOG)"
done

# mount_target B KIND: mounts build B's tierfs of KIND (nostore, embedded, store) at $TMNT
mount_target() {
  local data=$WORK/data-$1-$2
  TBIN=${BUILDS[$1]} TMNT=$WORK/mnt
  rm -rf "$data" "$WORK/xdg"; mkdir -p "$TMNT"
  case $2 in
    nostore) t mount --no-store --data-dir "$data" "$TMNT" >>"$LOG" 2>&1 ;;
    embedded) t mount --cache-size "${CACHE_MIB}M" "$TMNT" >>"$LOG" 2>&1 ;;
    store) t mount --store "$WORK/store-$1.toml" --cache-size "${CACHE_MIB}M" --data-dir "$data" "$TMNT" >>"$LOG" 2>&1 ;;
  esac || die "build $1: mount ($2) failed (see $LOG)"
}
umount_target() { t umount --timeout 600 "$TMNT" >>"$LOG" 2>&1 || die "umount failed"; TMNT=''; }

KINDS=(nostore embedded store)
for r in $(seq "$ROUNDS"); do
  drop_caches
  record "raw.put.r$r" "$("${RAW[@]}" put --prefix "r$r/" --threads 8 --size-mib "$SIZE_MIB" 2>>"$LOG")"
  rm -rf "$WORK/local"; mkdir -p "$WORK/local"
  fresh_source; drop_caches
  record "local.r$r" "$(python3 -c "$WRITER" "$WORK/src" "$WORK/local")" || die "the local write failed"
  rm -rf "$WORK/local"
  for B in "${!BUILDS[@]}"; do
    for kind in "${KINDS[@]}"; do
      fresh_source
      mount_target "$B" "$kind"
      drop_caches
      record "b$B.$kind.r$r" "$(python3 -c "$WRITER" "$WORK/src" "$TMNT")" || die "build $B: the $kind write failed"
      cmp -s "$WORK/src" "$TMNT/ckpt.pt" || die "build $B: the $kind checkpoint reads back different"
      umount_target
    done
  done
done

python3 - "$OUTDIR/results.txt" "$ROUNDS" "$SIZE_MIB" "${BUILDS[@]}" <<'PY' | tee "$OUTDIR/table.md"
import json, statistics, sys
path, rounds, size_mib, builds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
res = {}
for line in open(path):
    key, js = line.split(" ", 1)
    name = key.rsplit(".r", 1)[0]
    res.setdefault(name, []).append(json.loads(js))
med = lambda name, k: statistics.median(m[k] for m in res[name]) if name in res else None
local_w = med("local", "write_s")
raw = med("raw.put", "seconds")
print(f"| target | write s | MiB/s | write vs local | fsync s | rename + dir fsync s | total s | total vs local |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
def row(label, name):
    w, f, rn, tot = (med(name, k) for k in ("write_s", "fsync_s", "rename_s", "total_s"))
    print(f"| {label} | {w:.2f} | {size_mib / w:.0f} | {local_w / w:.2f}x | {f:.2f} | {rn:.3f} | {tot:.2f} | {med('local', 'total_s') / tot:.2f}x |")
row("plain directory (the data dir's disk)", "local")
kinds = {"nostore": "hot tier only (--no-store)", "embedded": "embedded default store (fsync local)",
         "store": "store on moto, fsync remote (durable there)"}
for b, d in enumerate(builds):
    try:
        commit = open(f"{d}/COMMIT").read().strip()
    except OSError:
        commit = d
    for k, label in kinds.items():
        if f"b{b}.{k}" in res:
            row(f"tierfs {commit}: {label}", f"b{b}.{k}")
print(f"\nraw parallel PUT of the same {size_mib} MiB to moto (8 threads, 16 MiB objects, one copy): "
      f"{raw:.2f} s ({size_mib / raw:.0f} MiB/s); the store mount uploads 3 copies")
print(f"medians of {rounds} rounds, each with fresh random bytes; page cache dropped before each write")
PY
echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUTDIR/table.md"
log "results: $OUTDIR"
