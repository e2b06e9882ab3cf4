#!/usr/bin/env bash
# benches/anchors.sh [OUTDIR]
#
# The anchors' own measures (issue 48, item 5), defined as mountpoint-s3's benchmarks define
# them (mountpoint-s3/scripts/fs_bench.sh, fs_latency_bench.sh and the fio jobs under
# mountpoint-s3/scripts/fio/; see benches/README.md, "The anchors' measures"), run in one go on
# every peer: the local disk, bindfs, the FUSE floor (benches/fuse-floor), tierfs hot (no store,
# FUSE passthrough on as root), tierfs cold (a fresh node with --no-refill on a moto store the
# data was written to and synced), and rclone mount / s3fs on the same moto server.
#   ttfb_cold / ttfb_hot  first byte of each of TTFB_FILES files (TTFB_MIB each, opened by name,
#                         each written before a 4 MiB pad): page cache dropped, open, read(2)
#                         of one byte (timed), close; then the same files again (the second
#                         read: a cold peer's local cache now holds them)
#   ls                    `ls -f` of a directory of LS_ENTRIES empty files, kernel caches
#                         dropped before each of LS_ROUNDS listings (median)
#   create                CREATE_N one-byte files: open(O_CREAT), write 1 byte, fsync, close
#                         (median and p99 per file)
#   seqread1 / seqread4   fio, bs=256k, ioengine=sync, one file of SEQ_MIB read by 1 thread /
#                         4 files of SEQ_MIB/4 read by 4 threads, page cache dropped first
# Prints a markdown table (values, then speed as a multiple of the local disk's and the floor's)
# and writes OUTDIR/results.json. A benchmark run by hand: nothing here is a test.
#
# Env (knobs; the defaults took 12 minutes here, on a busy machine):
#   PEERS ["local bindfs floor tierfs_hot tierfs_cold rclone s3fs"]  a peer whose tool is not
#                       installed (bindfs, rclone, s3fs) is skipped with a line saying so
#   TTFB_FILES [10], TTFB_MIB [16]      the first-byte files (mountpoint-s3: 1 GiB, 10 loops)
#   LS_ENTRIES [100000], LS_ROUNDS [3]  the listing (mountpoint-s3: 100 000 files, 10 listings)
#   LS_S3 [0]           1: also list on rclone/s3fs (LS_ENTRIES PUTs to moto first: slow;
#                       not run yet)
#   CREATE_N [200]      one-byte creates per peer (mountpoint-s3: 10 loops)
#   SEQ_MIB [1024]      the sequential reads' bytes (mountpoint-s3: 100 GiB per thread, 30 s)
#   CACHE_MIB [8192]    tierfs --cache-size (everything fits: nothing is evicted)
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options for both tierfs peers (word-split)
#   TIERFS_BIN_DIR      directory with `tierfs` and `tierfs-daemon`: skips the build
#   FLOOR_BIN           the tierfs-fuse-floor binary: skips its build
#   SKIP_BUILD=1        use the binaries already in $CARGO_TARGET_DIR/release
#   CARGO_TARGET_DIR [/var/tmp/tierfs-target]
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent: the "local disk" measured
#   MOTO_SERVER [/var/lib/tierfs-test-tools/moto-venv/bin/moto_server]; BENCH_PY [python next
#                       to it] (needs boto3); MOTO_PORT [a free port]
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/anchors/<date>): table.md,
#   results.json, <peer>.<measure>.json (every sample), <peer>.seqread{1,4}.fio.json,
#   tierfs-hot-status.json, anchors.log, moto.log, env.txt.
# Needs root (drop_caches), fio, python3, curl, fuse3, and moto as scripts/setup-debian.sh
# installs them. Everything started here is stopped and the work dir removed on exit.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/anchors/$(date +%Y%m%d-%H%M%S)}
PEERS=${PEERS-"local bindfs floor tierfs_hot tierfs_cold rclone s3fs"}
TTFB_FILES=${TTFB_FILES:-10}
TTFB_MIB=${TTFB_MIB:-16}
LS_ENTRIES=${LS_ENTRIES:-100000}
LS_ROUNDS=${LS_ROUNDS:-3}
LS_S3=${LS_S3:-0}
CREATE_N=${CREATE_N:-200}
SEQ_MIB=${SEQ_MIB:-1024}
CACHE_MIB=${CACHE_MIB:-8192}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=anchors-bench
A=("python3" "$HERE/anchors.py")
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/anchors.log
: >"$LOG"
log() { echo "[anchors.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
for n in TTFB_FILES TTFB_MIB LS_ENTRIES LS_ROUNDS CREATE_N SEQ_MIB CACHE_MIB; do
  [[ ${!n} =~ ^[0-9]+$ && ${!n} -gt 0 ]] || die "$n=${!n} is not a positive number"
done
((SEQ_MIB % 4 == 0)) || die "SEQ_MIB=$SEQ_MIB must be a multiple of 4 (four threads read a quarter each)"
for p in $PEERS; do
  case $p in local | bindfs | floor | tierfs_hot | tierfs_cold | rclone | s3fs) ;; *) die "unknown peer $p" ;; esac
done
for tool in fio python3 curl mountpoint fusermount3; do command -v "$tool" >/dev/null || die "$tool missing (scripts/setup-debian.sh)"; done
[[ -x $MOTO_SERVER ]] || die "moto_server not found at $MOTO_SERVER (scripts/setup-debian.sh installs it; or set MOTO_SERVER)"
"$BENCH_PY" -c 'import boto3' 2>/dev/null || die "$BENCH_PY has no boto3 (set BENCH_PY to a python with boto3)"
[[ $(id -u) == 0 ]] || die "needs root (drop_caches): reads would be warm otherwise"
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/anchors.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
# harness/peers.sh mounts bindfs, rclone and s3fs under $BENCH_ROOT (here: our work dir)
BENCH_ROOT=$WORK/peers RCLONE_EXTRA_OPTS=${RCLONE_EXTRA_OPTS:-"--s3-no-head"}
# shellcheck source=benches/harness/peers.sh
source "$HERE/harness/peers.sh"

# The peers to run: one whose tool is missing is skipped, with a line saying so.
RUN=()
for p in $PEERS; do
  case $p in
    bindfs | rclone | s3fs)
      command -v "$p" >/dev/null || { log "SKIP $p: not installed (apt-get install $p; scripts/setup-debian.sh)"; continue; } ;;
  esac
  RUN+=("$p")
done
if [[ " ${RUN[*]} " == *" tierfs_"* ]]; then tierfs_binaries; TBIN=$BIN_DIR; fi
if [[ " ${RUN[*]} " == *" floor "* && -z ${FLOOR_BIN:-} ]]; then
  if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    (cd "$REPO" && cargo build --release -p tierfs-fuse-floor) >>"$LOG" 2>&1 || die "cargo build of the floor failed (see $LOG)"
  fi
  FLOOR_BIN=$CARGO_TARGET_DIR/release/tierfs-fuse-floor
fi
export FLOOR_BIN

MOTO_PID='' TMNT='' TPID='' TDATA='' PEER='' MNT=''
# tierfs_mount NAME ARGS...: mounts tierfs on $WORK/mnt-NAME with a fresh data dir
# $WORK/data-NAME, the cache size and TIERFS_MOUNT_OPTS; sets TMNT, TPID and TDATA (lib.sh's
# tierfs_umount unmounts it and removes the data dir)
tierfs_mount() {
  local out
  TMNT=$WORK/mnt-$1 TDATA=$WORK/data-$1
  rm -rf "$TDATA"; mkdir -p "$TDATA" "$TMNT"
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  out=$(t --json mount --timeout 1800 --data-dir "$TDATA" --cache-size "${CACHE_MIB}M" ${TIERFS_MOUNT_OPTS:-} \
    "${@:2}" "$TMNT" 2>>"$LOG") || { TMNT=''; log "tierfs mount $1 failed (see $LOG)"; return 1; }
  TPID=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pid") or "")' 2>/dev/null)
}
peer_umount() {
  case $PEER in
    tierfs_hot | tierfs_cold) tierfs_umount ;;
    floor) BENCH_ROOT=$WORK "$HERE/floor-peer.sh" umount ;;
    bindfs | rclone | s3fs) umount_peer "$PEER" anchors ;;
  esac
  PEER='' MNT=''
}
cleanup() {
  trap - EXIT INT TERM
  set +e
  peer_umount
  stop_moto
  rm -rf "$WORK"
  mount | grep -F "$WORK" >&2 && echo "anchors.sh: WARNING: mounts left under $WORK" >&2
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# The fio jobs: mountpoint-s3's seq_read.fio and seq_read_4t.fio with the file size scaled
# from 100 GiB to SEQ_MIB (each of the four threads reads its own file of SEQ_MIB/4, so both
# jobs read the same bytes) and without time_based: a 30 s run over a file this small would
# read it again from the page cache.
fio_job() {  # fio_job NAME NUMJOBS SIZE_MIB
  printf '[global]\nname=fs_bench\nbs=256k\nruntime=30s\ngroup_reporting\n\n[%s]\nsize=%sm\nrw=read\nioengine=sync\nfallocate=none\nnumjobs=%s\n' \
    "$1" "$3" "$2"
}
fio_job sequential_read 1 "$SEQ_MIB" >"$WORK/seqread1.fio"
fio_job sequential_read_four_threads 4 $((SEQ_MIB / 4)) >"$WORK/seqread4.fio"
# The source bytes, random (tierfs stores a block once: repeated bytes would be fetched once),
# in the names fio gives its jobs' files. Each first-byte file is followed by a 4 MiB pad:
# tierfs packs files in the order they were made, and a miss brings the blocks up to 512 KiB
# either side of it in its pack, so without the pad a file's read would fetch the next file's
# first block and its first byte would not come from the store.
make_sources() {
  local i src=$WORK/src
  mkdir -p "$src/ttfb" "$WORK/pad"
  for i in $(seq -w 0 $((TTFB_FILES - 1))); do
    head -c $((TTFB_MIB << 20)) /dev/urandom >"$src/ttfb/f$i" || die "writing $src/ttfb/f$i failed"
    head -c $((4 << 20)) /dev/urandom >"$WORK/pad/p$i" || die "writing $WORK/pad/p$i failed"
  done
  head -c $((SEQ_MIB << 20)) /dev/urandom >"$src/sequential_read.0.0" || die "writing the sequential source failed"
  for i in 0 1 2 3; do
    head -c $((SEQ_MIB << 18)) /dev/urandom >"$src/sequential_read_four_threads.$i.0" || die "writing the 4-thread sources failed"
  done
}
# layout DIR: the sources copied into DIR (first-byte files and pads in turn), and the big
# directory
layout() {
  local f
  mkdir -p "$1/ttfb" "$1/pad" || die "$PEER: mkdir in $1 failed"
  for f in "$WORK"/src/ttfb/*; do
    cp "$f" "$1/ttfb/" && cp "$WORK/pad/p${f##*/f}" "$1/pad/" || die "$PEER: copying $f into $1 failed"
  done
  cp "$WORK"/src/sequential_read* "$1/" || die "$PEER: copying the sequential sources into $1 failed"
  "${A[@]}" mkdir "$1/big" "$LS_ENTRIES" || die "$PEER: making $1/big failed"
  sync
}
# upload_sources BUCKET: the sources as objects of BUCKET (the S3 peers' data), and the big
# directory's empty objects with LS_S3=1
upload_sources() {
  local f
  S3_BUCKET=$1 "${RAW[@]}" mkbucket 2>>"$LOG" || return 1
  for f in $(cd "$WORK/src" && find . -type f | sed 's|^\./||'); do
    S3_BUCKET=$1 "${RAW[@]}" upload "$WORK/src/$f" "$f" >>"$LOG" 2>&1 || return 1
  done
  if ((LS_S3)); then
    "$BENCH_PY" - "$1" "$LS_ENTRIES" <<'PY' 2>>"$LOG" || return 1
import os, sys, boto3
from concurrent.futures import ThreadPoolExecutor
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"])
with ThreadPoolExecutor(16) as ex:
    list(ex.map(lambda i: s3.put_object(Bucket=sys.argv[1], Key=f"big/f{i:07}", Body=b""), range(int(sys.argv[2]))))
PY
  fi
}

# peer_mount P: mounts (and fills) peer P; sets PEER and MNT
peer_mount() {
  PEER=$1
  case $1 in
    local) MNT=$WORK/local; mkdir -p "$MNT"; layout "$MNT" ;;  # removed with the work dir
    bindfs) MNT=$(mount_peer bindfs anchors) || return 1; layout "$MNT" ;;
    floor) MNT=$(BENCH_ROOT=$WORK OUTDIR=$OUTDIR "$HERE/floor-peer.sh" mount) || return 1; layout "$MNT" ;;
    tierfs_hot)
      tierfs_mount hot --no-store || return 1
      MNT=$TMNT; layout "$MNT"
      t --json status "$MNT" >"$OUTDIR/tierfs-hot-status.json" 2>>"$LOG" ;;
    tierfs_cold)
      t init --store "$WORK/store.toml" --backend "s3://$BUCKET/anchors?endpoint=$S3_ENDPOINT&region=$AWS_REGION" \
        >>"$LOG" 2>&1 || { log "tierfs init failed (see $LOG)"; return 1; }
      tierfs_mount writer --store "$WORK/store.toml" --workspace anchors || return 1
      layout "$TMNT"
      t sync --timeout 1800 "$TMNT" >>"$LOG" 2>&1 || { log "tierfs sync failed (see $LOG)"; return 1; }
      tierfs_umount
      log "tierfs_cold: written and synced to moto; a fresh node reads it (--no-refill)"
      drop_caches
      tierfs_mount node --store "$WORK/store.toml" --workspace anchors --no-refill || return 1
      MNT=$TMNT ;;
    rclone | s3fs)
      upload_sources "peer-$1-anchors" || { log "$1: uploading the sources failed (see $LOG)"; return 1; }
      MNT=$(mount_peer "$1" anchors) || return 1 ;;
  esac
}

# fail P MEASURE MESSAGE: records a failed measure (the table shows ERR)
fail() {
  log "ERROR $1 $2: $3"
  python3 -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' "$3" >"$OUTDIR/$1.$2.json"
}
seqread() {  # seqread P N: the fio job seqread<N> on $MNT, page cache dropped first
  local out=$OUTDIR/$1.seqread$2
  drop_caches
  fio --thread --directory="$MNT" --output-format=json --output="$out.fio.json" "$WORK/seqread$2.fio" >>"$LOG" 2>&1 ||
    { fail "$1" "seqread$2" "fio failed (see $out.fio.json)"; return; }
  python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
print(json.dumps({"mib_s": j["bw"] / 1024, "bytes": j["io_bytes"], "seconds": j["runtime"] / 1000}))' \
    "$out.fio.json" >"$OUTDIR/$1.seqread$2.json"
}
listing() {  # listing P: LS_ROUNDS timed `ls -f` of $MNT/big, kernel caches dropped before each
  local n r t0 times=()
  [[ -d $MNT/big ]] || { echo '{"skipped": "no big directory on this peer (LS_S3=0)"}' >"$OUTDIR/$1.ls.json"; return; }
  n=$(ls -f "$MNT/big" | wc -l)
  ((n == LS_ENTRIES + 2)) || { fail "$1" ls "ls -f listed $n entries, not $((LS_ENTRIES + 2))"; return; }
  for r in $(seq "$LS_ROUNDS"); do
    drop_caches
    t0=$EPOCHREALTIME
    ls -f "$MNT/big" >/dev/null || { fail "$1" ls "ls -f failed"; return; }
    times+=("$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.6f", b - a }')")
  done
  python3 -c 'import json,statistics,sys; s=[float(x) for x in sys.argv[1:]]; print(json.dumps({"seconds": statistics.median(s), "samples_s": s}))' \
    "${times[@]}" >"$OUTDIR/$1.ls.json"
}
measure() {  # measure P: every measure on $MNT, cold reads first
  local p=$1 i files=()
  # The first-byte files by name, not by a glob: a glob lists the directory, and tierfs's walk
  # read-ahead (src/vfs/walk.rs) then fetches the next files of the listing before they are
  # opened, so their first bytes would not come from the store.
  for i in $(seq -w 0 $((TTFB_FILES - 1))); do files+=("$MNT/ttfb/f$i"); done
  "${A[@]}" ttfb "$OUTDIR/$p.ttfb_cold.json" "${files[@]}" 2>>"$LOG" || fail "$p" ttfb_cold "first read failed"
  "${A[@]}" ttfb "$OUTDIR/$p.ttfb_hot.json" "${files[@]}" 2>>"$LOG" || fail "$p" ttfb_hot "second read failed"
  seqread "$p" 1
  seqread "$p" 4
  listing "$p"
  mkdir -p "$MNT/create" && "${A[@]}" create "$OUTDIR/$p.create.json" "$MNT/create" "$CREATE_N" 2>>"$LOG" ||
    fail "$p" create "one-byte creates failed (see $LOG)"
}

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "bench root: $WORK ($(df -h --output=source,fstype "$WORK" | tail -1 | tr -s ' '))"
  echo "peers: ${RUN[*]}"
  [[ -n ${TBIN:-} ]] && echo "tierfs: $("$TBIN/tierfs" --version) ($TBIN), git $(cd "$REPO" && git rev-parse --short HEAD)"
  echo "TTFB_FILES=$TTFB_FILES TTFB_MIB=$TTFB_MIB LS_ENTRIES=$LS_ENTRIES LS_ROUNDS=$LS_ROUNDS LS_S3=$LS_S3 CREATE_N=$CREATE_N SEQ_MIB=$SEQ_MIB CACHE_MIB=$CACHE_MIB mount opts '${TIERFS_MOUNT_OPTS:-}'"
  echo "versions: $(fio --version)$(for p in bindfs rclone s3fs; do command -v "$p" >/dev/null && printf ' | %s' "$("$p" --version 2>&1 | head -1)"; done)"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2

start_moto
mkdir -p "$WORK/run"
make_sources
for p in "${RUN[@]}"; do
  log "$p: mount and lay out"
  if peer_mount "$p"; then
    log "$p: measuring on $MNT"
    measure "$p"
  else
    for m in ttfb_cold ttfb_hot seqread1 seqread4 ls create; do fail "$p" "$m" "mount failed (see $LOG)"; done
  fi
  peer_umount
  log "$p: done"
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"
"${A[@]}" table "$OUTDIR" "${RUN[@]}" | tee -a "$LOG"
log "results: $OUTDIR"
