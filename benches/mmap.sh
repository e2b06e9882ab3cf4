#!/usr/bin/env bash
# benches/mmap.sh BIN_DIR... [-- OUTDIR]
#
# Issue 24 item 3 (mmap and whole-file loads): a cold file read through mmap, one byte of every
# 4 KiB page in a seeded random order (what a loader that maps a checkpoint and reads its
# tensors out of order does), against a plain sequential cold read (`dd bs=4M`) of the same
# file, on a fresh node each time (empty data dir, page cache dropped), for each build given
# (a directory with `tierfs` and `tierfs-daemon`), against one local moto server. Prints a
# markdown table: per build the median of ROUNDS of each read, and mmap/sequential, the ratio
# issue 24 wants near 1. Two floors come with it, the same two reads with no store in the way:
# the file on the local disk, and the file hot in tierfs (the writer's own data dir mounted
# again), each with the page cache dropped. Their ratio is what random page faults cost
# anyway. A benchmark run by hand: nothing here is a test.
#
# `tierfs status --json` after each cold read is kept as OUTDIR/status-b<build>-r<round>-{mmap,seq}.json
# (what the read fetched, its misses and its GETs).
# Env (knobs):
#   SIZE_MIB [192]    the file
#   CACHE_MIB [2048]  tierfs --cache-size
#   ROUNDS [3]        fresh-node reads of each kind per build, alternated
# Needs root (drop_caches), python3, dd, curl, fuse3, and moto as scripts/setup-debian.sh
# installs it (MOTO_SERVER to override). Everything started here is stopped on exit.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILDS=()
while (($# > 0)) && [[ $1 != -- ]]; do BUILDS+=("$(cd "$1" && pwd)"); shift; done
[[ ${1:-} == -- ]] && shift
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/mmap/$(date +%Y%m%d-%H%M%S)}
SIZE_MIB=${SIZE_MIB:-192}
CACHE_MIB=${CACHE_MIB:-2048}
ROUNDS=${ROUNDS:-3}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=mmap-bench
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/mmap.log
: >"$LOG"
log() { echo "[mmap.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
((${#BUILDS[@]} > 0)) || die "usage: benches/mmap.sh BIN_DIR... [-- OUTDIR]"
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-mmap.XXXXXX")
MOTO_PID='' TMNT='' TBIN=''
cleanup() {
  [[ -n $TMNT ]] && mountpoint -q "$TMNT" && { t umount "$TMNT" >>"$LOG" 2>&1 || fusermount3 -u "$TMNT"; }
  [[ -n $MOTO_PID ]] && kill "$MOTO_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

start_moto
dd if=/dev/urandom of="$WORK/src" bs=1M count="$SIZE_MIB" status=none || die "writing the source failed"

# mount_fresh DATA: mounts the store on a fresh data dir at $WORK/mnt
mount_fresh() {
  TMNT=$WORK/mnt
  mkdir -p "$TMNT"
  t mount --store "$WORK/store-$B" --cache-size "${CACHE_MIB}M" --data-dir "$1" "$TMNT" >>"$LOG" 2>&1 ||
    die "mount failed (see $LOG)"
}
umount_t() { t umount --timeout 300 "$TMNT" >>"$LOG" 2>&1 || die "umount failed"; TMNT=''; }

# timed CMD...: prints the wall seconds CMD took
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >>"$LOG" 2>&1 || die "$* failed"; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }

MMAP_WALK='
import mmap, os, random, sys
f = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(f).st_size
m = mmap.mmap(f, size, prot=mmap.PROT_READ)
pages = list(range(size // 4096))
random.Random(24).shuffle(pages)
s = 0
for p in pages:
    s += m[p * 4096]
print(s)
'

declare -A RESULT=()
for B in "${!BUILDS[@]}"; do
  TBIN=${BUILDS[$B]}
  log "build $B: $TBIN ($(cat "$TBIN/COMMIT" 2>/dev/null || echo '?'))"
  t init --store "$WORK/store-$B" --backend "s3://$BUCKET/b$B?endpoint=$S3_ENDPOINT&region=us-east-1" >>"$LOG" 2>&1 ||
    die "init failed (see $LOG)"
  mount_fresh "$WORK/data-$B-w"
  cp "$WORK/src" "$TMNT/ckpt.bin" || die "writing the file failed"
  t sync "$TMNT" >>"$LOG" 2>&1 || die "sync failed"
  umount_t
  for r in $(seq "$ROUNDS"); do
    mount_fresh "$WORK/data-$B-m$r"; drop_caches
    RESULT[$B,mmap,$r]=$(timed python3 -c "$MMAP_WALK" "$TMNT/ckpt.bin")
    t status --json "$TMNT" >"$OUTDIR/status-b$B-r$r-mmap.json" 2>>"$LOG"
    cmp -s "$WORK/src" "$TMNT/ckpt.bin" || die "build $B: the file reads back different"
    umount_t
    mount_fresh "$WORK/data-$B-s$r"; drop_caches
    RESULT[$B,seq,$r]=$(timed dd if="$TMNT/ckpt.bin" of=/dev/null bs=4M)
    t status --json "$TMNT" >"$OUTDIR/status-b$B-r$r-seq.json" 2>>"$LOG"
    umount_t
    log "build $B round $r: mmap walk ${RESULT[$B,mmap,$r]} s, sequential ${RESULT[$B,seq,$r]} s"
    # The floor in tierfs: the same reads of the file hot in the writer's data dir.
    mount_fresh "$WORK/data-$B-w"; drop_caches
    RESULT[$B,hotmmap,$r]=$(timed python3 -c "$MMAP_WALK" "$TMNT/ckpt.bin")
    umount_t
    mount_fresh "$WORK/data-$B-w"; drop_caches
    RESULT[$B,hotseq,$r]=$(timed dd if="$TMNT/ckpt.bin" of=/dev/null bs=4M)
    umount_t
    log "build $B round $r, hot: mmap walk ${RESULT[$B,hotmmap,$r]} s, sequential ${RESULT[$B,hotseq,$r]} s"
  done
done
# The floor without FUSE: the source file on the local disk.
for r in $(seq "$ROUNDS"); do
  drop_caches
  RESULT[local,mmap,$r]=$(timed python3 -c "$MMAP_WALK" "$WORK/src")
  drop_caches
  RESULT[local,seq,$r]=$(timed dd if="$WORK/src" of=/dev/null bs=4M)
  log "local disk round $r: mmap walk ${RESULT[local,mmap,$r]} s, sequential ${RESULT[local,seq,$r]} s"
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# row NAME KEY MMAP SEQ: one table row from RESULT[KEY,MMAP,r] and RESULT[KEY,SEQ,r]
row() {
  local m=() s=() r mm ms
  for r in $(seq "$ROUNDS"); do m+=("${RESULT[$2,$3,$r]}"); s+=("${RESULT[$2,$4,$r]}"); done
  mm=$(median "${m[@]}") ms=$(median "${s[@]}")
  printf '| %s | %.2f s (%s) | %.2f s (%s) | %.2f |\n' "$1" "$mm" "${m[*]}" "$ms" "${s[*]}" "$(echo "$mm / $ms" | bc -l)"
}
{
  echo "| read | mmap random page walk (median of $ROUNDS) | sequential dd (median) | mmap / sequential |"
  echo "|---|---:|---:|---:|"
  for B in "${!BUILDS[@]}"; do
    name="${BUILDS[$B]} ($(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || echo '?'))"
    row "$name, cold" "$B" mmap seq
    row "$name, hot (floor)" "$B" hotmmap hotseq
  done
  row "local disk (floor)" local mmap seq
  echo
  echo "${SIZE_MIB} MiB file, cache ${CACHE_MIB} MiB, one moto server on loopback; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUTDIR/table.md"
