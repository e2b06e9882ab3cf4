#!/usr/bin/env bash
# benches/smallfiles.sh BIN_DIR... [-- OUTDIR]
#
# Issue 24 (cold reads of many small files): how fast a fresh node, after a reset, reads back
# trees of many small files from the store, for each build given (a directory with `tierfs`
# and `tierfs-daemon`), against the raw parallel GET rate of the same bytes and against
# rclone mount and s3fs, all on one local S3 server (moto, or Garage with STORE=garage). Trees (benches/smallfiles.py, seeded):
#   ws        a workspace: git clone + virtualenv + untarred sources, WS_FILES files of
#             WS_MIB in all (most 1-20 KiB, some 100 KiB-1 MiB, a few 5-10 MiB)
#   imagenet  IMAGENET_FILES files of IMAGENET_KIB KiB, PER_DIR to a directory
# Each tree is written through a tierfs mount into its own workspace of the build's store
# (REPLICAS buckets of the moto server as replicas), `tierfs sync`, `tierfs umount`, and the
# data dir deleted: the reset. Then, per round: page cache dropped, the workspace mounted on an
# empty data dir (timed: "mount ready") and every file read once in sorted os.walk order (the
# listing included, like `find | xargs cat`; smallfiles.py walk), timed; and on another fresh
# node RANDOM_FILES random files of the imagenet tree (seeded) read by WORKERS threads. The
# same trees as plain objects in another bucket: boto3 GETs of all of them with each of
# RAW_THREADS threads (the ceiling), and the same walk and random reads through each peer
# (fresh cache dir, page cache dropped). Prints a markdown table and the issue's ratios:
# tierfs / raw parallel GET (goal >= 0.5), tierfs / rclone on the imagenet tree (goal >= 3).
# A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   WS_FILES [2157], WS_MIB [95]        the workspace tree
#   IMAGENET_FILES [20000], IMAGENET_KIB [100], PER_DIR [1000]  the imagenet tree (the issue
#                       asks 100k files; moto keeps objects under 5 MiB in memory, so every
#                       copy of 100k x 100 KiB is 10 GiB of its RAM: 20k by default)
#   RANDOM_FILES [2000], WORKERS [8]    the random reads (files in all, threads)
#   RAW_THREADS ["8 32"]                thread counts of the raw GETs
#   TREES ["ws imagenet"]               which trees to walk (the random reads need imagenet)
#   REFILL [1]          also measure, per build and tree, how long a fresh node nobody reads
#                       takes to refill its cache from the hot set (`tierfs status` polled),
#                       against the raw GET time of the bytes it fetched (issue 24: <= 2x)
#   STORE [moto]        the S3 server: moto (objects in RAM), or garage: a Garage cluster of
#                       GARAGE_NODES [1] nodes on 127.0.0.1 (replication factor = nodes;
#                       objects on disk, so the issue's 100k tree fits), stores made with
#                       `--fencing lease` (Garage ignores If-None-Match); GARAGE_BIN [the test
#                       tools' Garage]
#   REPLICAS [3 on moto, 1 on garage]  buckets (prefixes on Garage) of the one server the
#                       store replicates to; 1: one
#   CACHE_MIB [4096]    tierfs --cache-size
#   ROUNDS [1]          rounds of every read (raw, each build, each peer, in that order); the
#                       table gives medians
#   PEERS ["rclone s3fs"]  FUSE peers (empty: none); a missing one is skipped with a note
#   VERIFY [1]          after the first round's walk, check every file tierfs serves against
#                       the tree's manifest (size and CRC-32; untimed)
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options (word-split)
#   NO_REFILL_TOO       set: each build's walk and random reads also run on a mount with
#                       --no-refill (reader b<N>n): the cold reads with no refill beside them
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (trees, data dirs, caches)
#   MOTO_SERVER [/var/lib/tierfs-test-tools/moto-venv/bin/moto_server]; BENCH_PY [python next
#                       to it] (needs boto3); MOTO_PORT [a free port]
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/smallfiles/<date>): table.md, one
#   <reader>.<tree>.<read>.r<N>.json per measurement, status/ (`tierfs status --json` before
#   and after each tierfs read), write-b<N>.<tree>.json (the write, sync and umount times),
#   daemon-b<N>-*.log, moto.log, rclone.log, s3fs.log, smallfiles.log, env.txt.
# Needs root (drop_caches), python3, curl, fuse3, and moto as scripts/setup-debian.sh installs
# it. Everything started here is stopped and the work dir removed on exit (also on Ctrl-C).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILDS=()
while (($# > 0)) && [[ $1 != -- ]]; do BUILDS+=("$(cd "$1" && pwd)"); shift; done
[[ ${1:-} == -- ]] && shift
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/smallfiles/$(date +%Y%m%d-%H%M%S)}
WS_FILES=${WS_FILES:-2157}
WS_MIB=${WS_MIB:-95}
IMAGENET_FILES=${IMAGENET_FILES:-20000}
IMAGENET_KIB=${IMAGENET_KIB:-100}
PER_DIR=${PER_DIR:-1000}
RANDOM_FILES=${RANDOM_FILES:-2000}
WORKERS=${WORKERS:-8}
RAW_THREADS=${RAW_THREADS:-"8 32"}
TREES=${TREES:-"ws imagenet"}
REFILL=${REFILL:-1}
STORE=${STORE:-moto}
GARAGE_NODES=${GARAGE_NODES:-1}
if [[ $STORE == garage ]]; then REPLICAS=${REPLICAS:-1}; else REPLICAS=${REPLICAS:-3}; fi
CACHE_MIB=${CACHE_MIB:-4096}
ROUNDS=${ROUNDS:-1}
PEERS=${PEERS-"rclone s3fs"}
VERIFY=${VERIFY:-1}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=smallfiles-raw
SF=$HERE/smallfiles.py
mkdir -p "$OUTDIR/status" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/smallfiles.log
: >"$LOG"
log() { echo "[smallfiles.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
((${#BUILDS[@]} > 0)) || die "usage: benches/smallfiles.sh BIN_DIR... [-- OUTDIR]"
case $STORE in moto | garage) ;; *) die "STORE=$STORE: moto or garage" ;; esac
for n in WS_FILES WS_MIB IMAGENET_FILES IMAGENET_KIB PER_DIR RANDOM_FILES WORKERS REPLICAS CACHE_MIB ROUNDS; do
  [[ ${!n} =~ ^[0-9]+$ && ${!n} -gt 0 ]] || die "$n=${!n} is not a positive number"
done
for tool in python3 curl mountpoint fusermount3; do command -v "$tool" >/dev/null || die "$tool missing"; done
[[ -x $MOTO_SERVER ]] || die "moto_server not found at $MOTO_SERVER (scripts/setup-debian.sh installs it; or set MOTO_SERVER)"
if [[ $STORE == garage ]]; then
  export GARAGE_BIN=${GARAGE_BIN:-${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/garage/bin/garage}
  [[ -x $GARAGE_BIN ]] || die "no Garage binary at $GARAGE_BIN (scripts/setup-debian.sh installs it)"
  [[ $GARAGE_NODES == 1 || $GARAGE_NODES == 3 ]] || die "GARAGE_NODES=$GARAGE_NODES: 1 or 3"
fi
"$BENCH_PY" -c 'import boto3' 2>/dev/null || die "$BENCH_PY has no boto3 (set BENCH_PY to a python with boto3)"
[[ $(id -u) == 0 ]] || die "needs root (drop_caches): reads would be warm otherwise"
for B in "${!BUILDS[@]}"; do
  [[ -x ${BUILDS[$B]}/tierfs && -x ${BUILDS[$B]}/tierfs-daemon ]] || die "no tierfs and tierfs-daemon in ${BUILDS[$B]}"
done
SKIPPED=''
for p in $PEERS; do
  case $p in rclone | s3fs) ;; *) die "unknown peer $p (PEERS: rclone, s3fs)" ;; esac
  command -v "$p" >/dev/null || { log "$p missing: skipped (Debian package $p)"; SKIPPED+="$p "; PEERS=${PEERS//$p/}; }
done
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

# --- state for cleanup ---------------------------------------------------------------------
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/smallfiles.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
MOTO_PID='' EXTRA_OPTS=() TBIN='' TMNT='' TPID='' TDATA='' PMNT='' PPID_='' UMOUNT_S=0
peer_umount() {
  [[ -n $PMNT ]] || return 0
  if mountpoint -q "$PMNT"; then
    fusermount3 -u "$PMNT" 2>>"$LOG" || umount "$PMNT" 2>>"$LOG" || { sleep 1; umount -l "$PMNT" 2>>"$LOG"; }
  fi
  if [[ -n $PPID_ ]]; then
    for _ in $(seq 100); do kill -0 "$PPID_" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$PPID_" 2>/dev/null; then kill "$PPID_"; sleep 1; kill -0 "$PPID_" 2>/dev/null && kill -9 "$PPID_"; fi
  fi
  rm -rf "$WORK/peer-cache"
  PMNT='' PPID_=''
}
# tierfs_umount [TAG]: `tierfs umount` (fusermount3 if it fails), the daemon waited for, its
# log kept as daemon-TAG.log, the data dir removed
tierfs_umount() {
  [[ -n $TMNT ]] || return 0
  local t0=$EPOCHREALTIME
  if mountpoint -q "$TMNT"; then
    t --json umount --timeout 600 "$TMNT" >>"$LOG" 2>&1 ||
      { log "tierfs umount FAILED; fusermount3 -u"; fusermount3 -u "$TMNT" 2>>"$LOG" || umount -l "$TMNT" 2>>"$LOG"; }
  fi
  [[ -n $TPID ]] && stop_daemon "$TPID"
  UMOUNT_S=$(since "$t0")
  [[ -n ${1:-} && -f $TDATA/daemon.log ]] && cp "$TDATA/daemon.log" "$OUTDIR/daemon-$1.log"
  rm -rf "$TDATA"
  TMNT='' TPID='' TDATA=''
}
cleanup() {
  trap - EXIT INT TERM
  set +e
  peer_umount
  tierfs_umount
  [[ $STORE == garage ]] && S3_STATE_ROOT=$WORK/garage "$HERE/harness/servers/stop_garage.sh" "$GARAGE_NODES" >/dev/null 2>&1
  if [[ -n $MOTO_PID ]]; then
    kill "$MOTO_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$MOTO_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$MOTO_PID" 2>/dev/null && kill -9 "$MOTO_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
  mount | grep -F "$WORK" >&2 && echo "smallfiles.sh: WARNING: mounts left under $WORK" >&2
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM
# since T0: seconds since the $EPOCHREALTIME value T0
since() { local now=$EPOCHREALTIME; awk -v a="$1" -v b="$now" 'BEGIN { printf "%.3f\n", b - a }'; }
# measure NAME CMD...: CMD's JSON line (its last line on stdout) into OUTDIR/NAME.json
measure() {
  local name=$1 out; shift
  out=$("$@" 2>>"$LOG") || { log "ERROR in $name: $* failed (see $LOG)"; return 1; }
  printf '%s\n' "$out" | tail -1 >"$OUTDIR/$name.json"
  log "$name: $(tail -1 "$OUTDIR/$name.json")"
}
# merge NAME JSON: add the keys of JSON to OUTDIR/NAME.json
merge() {
  python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d.update(json.loads(sys.argv[2])); json.dump(d,open(p,"w"))' \
    "$OUTDIR/$1.json" "$2"
}

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2009  # pgrep refuses patterns longer than 15 characters
  echo "busy at start: $(ps -eo comm= | grep -cxE 'cargo|rustc|cc1plus|cc1|ld|fio') compiler/cargo/fio processes"
  for B in "${!BUILDS[@]}"; do echo "build b$B: ${BUILDS[$B]} ($(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || echo '?'))"; done
  echo "WS_FILES=$WS_FILES WS_MIB=$WS_MIB IMAGENET_FILES=$IMAGENET_FILES IMAGENET_KIB=$IMAGENET_KIB PER_DIR=$PER_DIR"
  echo "RANDOM_FILES=$RANDOM_FILES WORKERS=$WORKERS RAW_THREADS='$RAW_THREADS' TREES='$TREES' REPLICAS=$REPLICAS"
  echo "STORE=$STORE$([[ $STORE == garage ]] && echo " ($GARAGE_NODES nodes, $("$GARAGE_BIN" --version 2>/dev/null | head -1))")"
  echo "CACHE_MIB=$CACHE_MIB ROUNDS=$ROUNDS PEERS='$PEERS' skipped='$SKIPPED' mount opts '${TIERFS_MOUNT_OPTS:-}'"
  echo "moto: $("$BENCH_PY" -c 'import moto, boto3; print("moto", moto.__version__, "boto3", boto3.__version__)' 2>/dev/null)"
  for p in $PEERS; do echo "$p: $("$p" --version 2>/dev/null | head -1)"; done
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2
if [[ $(cut -d' ' -f1 /proc/loadavg | cut -d. -f1) -ge 1 ]] || grep -q ' [1-9]' <(grep '^busy' "$OUTDIR/env.txt"); then
  log "WARNING: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy"
fi

# --- trees, moto, the plain objects ----------------------------------------------------------
log "making the trees in $WORK/src"
mkdir -p "$WORK/src" "$WORK/run"
if [[ " $TREES " == *" ws "* ]]; then
  measure tree.ws python3 "$SF" mktree ws "$WORK/src/ws" --files "$WS_FILES" --mib "$WS_MIB" || die "mktree ws failed"
fi
if [[ " $TREES " == *" imagenet "* ]]; then
  measure tree.imagenet python3 "$SF" mktree imagenet "$WORK/src/imagenet" --files "$IMAGENET_FILES" \
    --kib "$IMAGENET_KIB" --per-dir "$PER_DIR" || die "mktree imagenet failed"
fi
if [[ $STORE == garage ]]; then
  # one bucket: the plain objects under <tree>/, the stores under b<N>-r<i>/
  log "starting Garage ($GARAGE_NODES nodes) in $WORK/garage"
  env=$(S3_STATE_ROOT=$WORK/garage GARAGE_WIPE=1 BUCKET=$BUCKET BENCH_PY=$BENCH_PY \
    "$HERE/harness/servers/start_garage.sh" "$GARAGE_NODES" 2>>"$LOG") || die "Garage did not start (see $LOG)"
  eval "$env"
  export S3_ENDPOINT S3_BUCKET AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
  RAW=("$BENCH_PY" "$HERE/s3_raw.py")
  store_url() { echo "s3://$BUCKET/b$1-r$2?endpoint=$S3_ENDPOINT&region=$AWS_REGION"; }
  INIT_OPTS=(--fencing lease)
  SERVER_DESC="Garage $("$GARAGE_BIN" --version 2>/dev/null | grep -o '[0-9][0-9.]*' | head -1) ($GARAGE_NODES node(s), replication factor $GARAGE_NODES, data on disk)"
else
  start_moto
  for i in $(seq 0 $((REPLICAS - 1))); do
    "${RAW[@]}" --bucket "smallfiles-r$i" mkbucket 2>>"$LOG" || die "creating bucket smallfiles-r$i failed"
  done
  store_url() { echo "s3://smallfiles-r$2/b$1?endpoint=$S3_ENDPOINT&region=$AWS_REGION"; }
  INIT_OPTS=()
  SERVER_DESC="one moto server"
fi
for tree in $TREES; do
  log "uploading $tree as plain objects to s3://$BUCKET/$tree/ (32 threads)"
  measure "upload.$tree" "$BENCH_PY" "$SF" upload "$WORK/src/$tree" "$tree/" --threads 32 || die "upload of $tree failed"
done

# --- tierfs ---------------------------------------------------------------------------------
# tierfs_mount TREE: mounts workspace TREE of build B's store on a fresh data dir; sets TMNT,
# TPID, TDATA and MOUNT_S (the seconds until `tierfs mount` returned: the mount is ready)
tierfs_mount() {
  local out t0
  TDATA=$WORK/data-b$B TMNT=$WORK/mnt
  rm -rf "$TDATA"; mkdir -p "$TDATA" "$TMNT"
  t0=$EPOCHREALTIME
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  out=$(t --json mount --timeout 1800 --store "$WORK/store-b$B.toml" --workspace "$1" --data-dir "$TDATA" \
    --cache-size "${CACHE_MIB}M" ${TIERFS_MOUNT_OPTS:-} "${EXTRA_OPTS[@]}" "$TMNT" 2>>"$LOG") || { TMNT=''; die "build b$B: mount of $1 failed (see $LOG)"; }
  MOUNT_S=$(since "$t0")
  TPID=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pid") or "")' 2>/dev/null)
}
# tierfs_read NAME CMD...: CMD (a reader of $TMNT) measured as NAME, with `tierfs status` around it
tierfs_read() {
  local name=$1; shift
  t --json status "$TMNT" >"$OUTDIR/status/$name.before.json" 2>>"$LOG"
  measure "$name" "$@" || die "$name failed"
  t --json status "$TMNT" >"$OUTDIR/status/$name.after.json" 2>>"$LOG"
  merge "$name" "{\"mount_s\": $MOUNT_S}"
  merge "$name" "$(python3 "$SF" delta "$OUTDIR/status/$name.before.json" "$OUTDIR/status/$name.after.json")"
}

for B in "${!BUILDS[@]}"; do
  TBIN=${BUILDS[$B]}
  log "build b$B: $TBIN ($(cat "$TBIN/COMMIT" 2>/dev/null || echo '?'))"
  backends=()
  for i in $(seq 0 $((REPLICAS - 1))); do
    backends+=(--backend "$(store_url "$B" "$i")")
  done
  t init --store "$WORK/store-b$B.toml" "${backends[@]}" "${INIT_OPTS[@]}" >>"$LOG" 2>&1 || die "build b$B: tierfs init failed (see $LOG)"
  for tree in $TREES; do
    tierfs_mount "$tree"
    t0=$EPOCHREALTIME
    cp -r "$WORK/src/$tree/." "$TMNT/" || die "build b$B: writing $tree failed"
    copy_s=$(since "$t0") t0=$EPOCHREALTIME
    t sync --timeout 1800 "$TMNT" >>"$LOG" 2>&1 || die "build b$B: tierfs sync of $tree failed (see $LOG)"
    sync_s=$(since "$t0")
    tierfs_umount "b$B-write-$tree"
    umount_s=$UMOUNT_S
    echo "{\"mount_s\": $MOUNT_S, \"copy_s\": $copy_s, \"sync_s\": $sync_s, \"umount_s\": $umount_s}" >"$OUTDIR/write-b$B.$tree.json"
    log "build b$B: $tree written in $copy_s s, synced in $sync_s s, unmounted in $umount_s s"
  done
done
# the source trees are in the store now; only their manifests are read from here on (a 100k
# tree is 10 GiB of disk)
for tree in $TREES; do rm -rf "${WORK:?}/src/$tree"; done

# --- peers ----------------------------------------------------------------------------------
# peer_mount P: mounts the plain-object bucket with peer P (fresh cache dir); sets PMNT,
# PPID_ and MOUNT_S (until the mountpoint is there)
peer_mount() {
  local p=$1 t0 plog=$OUTDIR/$1.log
  PMNT=$WORK/mnt-peer
  mkdir -p "$PMNT" "$WORK/peer-cache"
  t0=$EPOCHREALTIME
  case $p in
    rclone)
      # rclone remote from env only; AWS_CA_BUNDLE breaks rclone 1.60's S3 client
      env -u AWS_CA_BUNDLE RCLONE_CONFIG=/dev/null RCLONE_CONFIG_SF_TYPE=s3 RCLONE_CONFIG_SF_PROVIDER=Other \
        RCLONE_CONFIG_SF_ENV_AUTH=false RCLONE_CONFIG_SF_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" \
        RCLONE_CONFIG_SF_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" RCLONE_CONFIG_SF_ENDPOINT="$S3_ENDPOINT" \
        RCLONE_CONFIG_SF_REGION="$AWS_REGION" RCLONE_CONFIG_SF_FORCE_PATH_STYLE=true \
        rclone mount "sf:$BUCKET" "$PMNT" --vfs-cache-mode full --cache-dir "$WORK/peer-cache" \
        --log-level NOTICE >>"$plog" 2>&1 &
      ;;
    s3fs)
      (umask 077; echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >"$WORK/s3fs.passwd")
      s3fs "$BUCKET" "$PMNT" -f \
        -o "passwd_file=$WORK/s3fs.passwd,url=$S3_ENDPOINT,endpoint=$AWS_REGION,use_path_request_style" \
        -o "use_cache=$WORK/peer-cache,dbglevel=warn" >>"$plog" 2>&1 &
      ;;
  esac
  PPID_=$!
  for _ in $(seq 600); do
    mountpoint -q "$PMNT" && break
    kill -0 "$PPID_" 2>/dev/null || die "$p mount failed: $(tail -3 "$plog" | tr '\n' ' ')"
    sleep 0.05
  done
  mountpoint -q "$PMNT" || die "$p: no mount after 30 s"
  MOUNT_S=$(since "$t0")
}
peer_read() {
  local name=$1; shift
  measure "$name" "$@" || die "$name failed"
  merge "$name" "{\"mount_s\": $MOUNT_S}"
}

# refill_wait NAME: on a fresh mount nobody reads, how long until the refill from the hot set
# ended (`tierfs status` polled every 50 ms from when the mount was ready), into NAME.json; a
# build without a refill (nothing in status after 2 s) is recorded as such
refill_wait() {
  local t0=$EPOCHREALTIME st state=''
  while :; do
    st=$(t --json status "$TMNT" 2>>"$LOG")
    state=$(printf '%s' "$st" | python3 -c 'import json,sys; r=json.load(sys.stdin)["cold"].get("refill"); print(r["state"] if r else "none")')
    [[ $state == running ]] || { [[ $state == none ]] && awk -v s="$(since "$t0")" 'BEGIN { exit !(s < 2) }'; } || break
    sleep 0.05
  done
  printf '%s' "$st" | python3 -c 'import json,sys; r=json.load(sys.stdin)["cold"].get("refill") or {}
print(json.dumps({"op": "refill", "seconds": float(sys.argv[1]), "mount_s": float(sys.argv[2]), "state": r.get("state", "none"), "bytes": r.get("fetched_bytes", 0), "planned": r.get("planned_bytes", 0), "chunks": r.get("fetched_chunks", 0), "stopped": r.get("stopped")}))' \
    "$(since "$t0")" "$MOUNT_S" >"$OUTDIR/$1.json"
  log "$1: $(cat "$OUTDIR/$1.json")"
}

# --- the reads, ROUNDS times ----------------------------------------------------------------
for r in $(seq "$ROUNDS"); do
  for tree in $TREES; do
    for n in $RAW_THREADS; do
      drop_caches
      measure "raw$n.$tree.get.r$r" "${RAW[@]}" get --prefix "$tree/" --threads "$n" || die "raw GET failed"
    done
  done
  for B in "${!BUILDS[@]}"; do
    TBIN=${BUILDS[$B]}
    # the walk and the random reads as the build mounts by default (refill running beside
    # them), and with NO_REFILL_TOO=1 also with --no-refill (name b<N>n): the cold reads alone
    for V in '' ${NO_REFILL_TOO:+n}; do
      X=b$B$V EXTRA_OPTS=()
      [[ $V == n ]] && EXTRA_OPTS=(--no-refill)
      for tree in $TREES; do
        drop_caches
        tierfs_mount "$tree"
        tierfs_read "$X.$tree.walk.r$r" python3 "$SF" walk "$TMNT"
        if [[ $VERIFY == 1 && $r == 1 ]]; then
          measure "$X.$tree.verify" python3 "$SF" verify "$TMNT" "$WORK/src/$tree.manifest" ||
            log "ERROR: build $X: $tree reads back different from what was written (see $OUTDIR/$X.$tree.verify.json)"
        fi
        tierfs_umount "$X-$tree-walk-r$r"
        merge "$X.$tree.walk.r$r" "{\"umount_s\": $UMOUNT_S}"
      done
      if [[ " $TREES " == *" imagenet "* ]]; then
        drop_caches
        tierfs_mount imagenet
        tierfs_read "$X.imagenet.random.r$r" python3 "$SF" random "$TMNT" "$WORK/src/imagenet.manifest" \
          --workers "$WORKERS" --count "$RANDOM_FILES"
        tierfs_umount "$X-imagenet-random-r$r"
        merge "$X.imagenet.random.r$r" "{\"umount_s\": $UMOUNT_S}"
      fi
    done
    EXTRA_OPTS=()
    if [[ $REFILL == 1 ]]; then
      for tree in $TREES; do
        drop_caches
        tierfs_mount "$tree"
        refill_wait "b$B.$tree.refill.r$r"
        tierfs_umount "b$B-$tree-refill-r$r"
      done
    fi
  done
  for p in $PEERS; do
    for tree in $TREES; do
      drop_caches
      peer_mount "$p"
      peer_read "$p.$tree.walk.r$r" python3 "$SF" walk "$PMNT/$tree"
      peer_umount
    done
    if [[ " $TREES " == *" imagenet "* ]]; then
      drop_caches
      peer_mount "$p"
      peer_read "$p.imagenet.random.r$r" python3 "$SF" random "$PMNT/imagenet" "$WORK/src/imagenet.manifest" \
        --workers "$WORKERS" --count "$RANDOM_FILES"
      peer_umount
    fi
  done
done

# --- table ----------------------------------------------------------------------------------
LABELS=()
for B in "${!BUILDS[@]}"; do
  LABELS+=(--label "b$B=tierfs $(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || basename "${BUILDS[$B]}")")
  [[ -n ${NO_REFILL_TOO:-} ]] &&
    LABELS+=(--label "b${B}n=tierfs $(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || basename "${BUILDS[$B]}") --no-refill")
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"
python3 "$SF" table "$OUTDIR" --rounds "$ROUNDS" --trees "$TREES" --raw-threads "$RAW_THREADS" \
  --peers "$PEERS" --skipped "$SKIPPED" --replicas "$REPLICAS" --server "$SERVER_DESC" --cache-mib "$CACHE_MIB" --workers "$WORKERS" \
  "${LABELS[@]}" | tee "$OUTDIR/table.md"
if [[ $REFILL == 1 ]]; then
  # The hot set back on an idle fresh node, against the raw GET time of the same bytes.
  python3 - "$OUTDIR" "$TREES" "$RAW_THREADS" "${LABELS[@]}" <<'PY' | tee -a "$OUTDIR/table.md"
import glob, json, os, statistics, sys
out, trees, threads = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
labels = dict(a.split("=", 1) for a in sys.argv[5::2])
def med(pattern, key):
    vals = [json.load(open(f))[key] for f in glob.glob(os.path.join(out, pattern))]
    return statistics.median(vals) if vals else None
print("\n| tree | build | hot set back (s, from mount ready) | MiB | state | raw GET of those bytes (s, best threads) | ratio (goal <= 2x) |")
print("|---|---|---:|---:|---|---:|---:|")
for tree in trees:
    raw = [med(f"raw{n}.{tree}.get.r*.json", "seconds") for n in threads]
    raw_bytes = med(f"raw{threads[0]}.{tree}.get.r*.json", "bytes")
    best = min(r for r in raw if r is not None)
    for b, label in labels.items():
        s = med(f"{b}.{tree}.refill.r*.json", "seconds")
        if s is None:
            continue
        got = med(f"{b}.{tree}.refill.r*.json", "bytes")
        state = json.load(open(sorted(glob.glob(os.path.join(out, f"{b}.{tree}.refill.r*.json")))[0]))["state"]
        if state == "none":
            print(f"| {tree} | {label} | - | - | no refill | | |")
            continue
        raw_s = best * got / raw_bytes if raw_bytes else None
        ratio = f"{s / raw_s:.2f}x" if raw_s else ""
        print(f"| {tree} | {label} | {s:.2f} | {got / 2**20:.1f} | {state} | {raw_s:.2f} | {ratio} |")
PY
fi
log "results: $OUTDIR"
