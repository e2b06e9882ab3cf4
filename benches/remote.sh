#!/usr/bin/env bash
# benches/remote.sh [OUTDIR]
#
# Remote metadata against one local S3 server (moto), in one run: (1) how far the store trails
# a steady writer (`tierfs status` sampled) and the real RPO (kill -9 of the daemon under load,
# takeover on a fresh node, every write checked byte for byte); (2) time to the first full
# `ls -R` on a fresh node (restore + listing) for trees of FILE_COUNTS small files; (3) an
# incremental `tierfs sync` after changing one file, next to `restic backup` of the same tree
# into the same moto. Prints a markdown table. See benches/README.md, "Remote metadata
# (remote.sh)". A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   RATE_MIB [20]        phase 1: writer rate, MiB/s, in 1 MiB writes
#   DURATION_S [30]      phase 1: load duration, s (the daemon is killed at its end)
#   WRITE_FILES [4]      phase 1: files written round-robin; FILE_MIB [16]: a full file is
#                        replaced by a new one
#   WRITE_MODE [close]   phase 1: `close` (open O_APPEND + write + close per write), `open`
#                        (files stay open, no fsync), `fsync` (fsync before each close)
#   POLL_S [0.2]         phase 1: `tierfs status` sampling interval
#   CACHE_MIB [1024]     tierfs --cache-size of every mount
#   FILE_COUNTS ["10000 100000"]  phase 2: tree sizes (100-byte files, 100 per directory)
#   PHASES ["rpo tree incr"]  which phases to run (incr uses the largest tree of phase 2)
#   RESTIC [1]           phase 3: also restic (installed with apt-get when missing; 0 skips)
#   TIERFS_BIN_DIR      directory with `tierfs` and `tierfs-daemon`: skips the build
#   CARGO_TARGET_DIR [/var/tmp/tierfs-target]  where `cargo build --release` puts them
#   SKIP_BUILD=1        use the binaries already in $CARGO_TARGET_DIR/release
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options (word-split)
#   TIERFS_INIT_OPTS    extra `tierfs init` options (word-split)
#   MOTO_SERVER [/var/lib/tierfs-test-tools/moto-venv/bin/moto_server]; BENCH_PY [python next
#                       to it] (needs boto3); MOTO_PORT [a free port]
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (data dirs, mounts, local tree)
#   KEEP_WORK=1         keep the work dir (data dirs, writer log) after the run
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/remote/<date>): table.md,
#   results.json, one <phase>.json per measurement (rpo_load, rpo_restore, rpo_verify,
#   tree_<N>, incr_tierfs, incr_restic), rpo-samples.jsonl (every status sample), rpo-writes.jsonl
#   (the writer's log), tierfs-daemon-<node>.log (each node's daemon.log), moto.log, restic.log,
#   remote.log (this script's log), env.txt.
# Needs fuse3, python3, curl; root for apt-get (restic). Everything started here is stopped
# and the work dir removed on exit (also on Ctrl-C / SIGTERM).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/remote/$(date +%Y%m%d-%H%M%S)}
RATE_MIB=${RATE_MIB:-20}
DURATION_S=${DURATION_S:-30}
WRITE_FILES=${WRITE_FILES:-4}
FILE_MIB=${FILE_MIB:-16}
WRITE_MODE=${WRITE_MODE:-close}
POLL_S=${POLL_S:-0.2}
CACHE_MIB=${CACHE_MIB:-1024}
FILE_COUNTS=${FILE_COUNTS:-"10000 100000"}
PHASES=${PHASES:-"rpo tree incr"}
RESTIC=${RESTIC:-1}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=remote-bench
HELP=$HERE/remote_help.py

mkdir -p "$OUTDIR" || { echo "remote.sh: cannot create $OUTDIR" >&2; exit 1; }
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/remote.log
: >"$LOG"
log() { echo "[remote.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
# phase_error NAME MESSAGE: record a failed measurement (the table shows ERR) and go on
phase_error() {
  log "ERROR in $1: $2"
  python3 -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' "$2" >"$OUTDIR/$1.json"
}
# jset FILE KEY JSON: set one key of a JSON object file (created if missing)
jset() {
  python3 -c 'import json,os,sys
p, k, v = sys.argv[1:]
d = json.load(open(p)) if os.path.exists(p) else {}
d[k] = json.loads(v)
json.dump(d, open(p, "w"))' "$1" "$2" "$3"
}
# since T0: seconds since $EPOCHREALTIME value T0, 3 decimals
since() { local now=$EPOCHREALTIME; awk -v a="$1" -v b="$now" 'BEGIN { printf "%.3f\n", b - a }'; }

[[ $RATE_MIB =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "RATE_MIB=$RATE_MIB is not a number"
[[ $DURATION_S =~ ^[0-9]+$ && $DURATION_S -gt 0 ]] || die "DURATION_S=$DURATION_S is not a positive number"
case $WRITE_MODE in close | open | fsync) ;; *) die "WRITE_MODE=$WRITE_MODE (close, open or fsync)" ;; esac
for n in $FILE_COUNTS; do [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "FILE_COUNTS: $n is not a positive number"; done
for tool in python3 curl mountpoint fusermount3; do
  command -v "$tool" >/dev/null || die "$tool missing (scripts/setup-debian.sh installs fuse3, python3, curl)"
done
[[ -x $MOTO_SERVER ]] || die "moto_server not found at $MOTO_SERVER (scripts/setup-debian.sh installs it; or set MOTO_SERVER)"
"$BENCH_PY" -c 'import boto3' 2>/dev/null || die "$BENCH_PY has no boto3 (set BENCH_PY to a python with boto3)"
[[ -f $HELP ]] || die "$HELP missing"
IS_ROOT=0; [[ $(id -u) == 0 ]] && IS_ROOT=1

# --- state for cleanup ---------------------------------------------------------------------
# every tierfs node: mountpoint -> daemon pid / data dir / name (for the copied daemon.log)
WORK='' MOTO_PID='' TIERFS='' TRUN=''
declare -A NODE_PID=() NODE_DATA=() NODE_NAME=()

# t ARGS...: the tierfs CLI with the bench's runtime dir, credentials and passphrase
t() {
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
    TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test \
    "$TIERFS" --runtime-dir "$TRUN" "$@"
}

# node_mount NAME STORE DATA MNT [OPTS...]: mounts a node, prints nothing; returns 1 on failure
node_mount() {
  local name=$1 store=$2 data=$3 mnt=$4 out pid; shift 4
  mkdir -p "$data" "$mnt"
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  out=$(t --json mount --timeout 1800 --store "$store" --data-dir "$data" --cache-size "${CACHE_MIB}M" \
    ${TIERFS_MOUNT_OPTS:-} "$@" "$mnt" 2>>"$LOG")
  local rc=$?
  printf '%s\n' "$out" >>"$LOG"
  NODE_DATA[$mnt]=$data NODE_NAME[$mnt]=$name
  pid=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pid") or "")' 2>/dev/null)
  NODE_PID[$mnt]=$pid
  if ((rc != 0)) || [[ -z $pid ]]; then
    log "tierfs mount of node $name failed (exit $rc): $(tail -2 "$LOG" | tr '\n' ' ')"
    node_forget "$mnt"
    return 1
  fi
  log "node $name mounted on $mnt (daemon pid $pid, data dir $data)"
}

# node_forget MNT: copy the node's daemon.log, forget it
node_forget() {
  local mnt=$1 data=${NODE_DATA[$1]:-} name=${NODE_NAME[$1]:-node}
  [[ -n $data && -f $data/daemon.log ]] && cp "$data/daemon.log" "$OUTDIR/tierfs-daemon-$name.log"
  unset "NODE_PID[$mnt]" "NODE_DATA[$mnt]" "NODE_NAME[$mnt]"
}

# wait_gone PID SECS: wait for a process to exit
wait_gone() {
  local i
  [[ -n $1 ]] || return 0
  for i in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# node_umount MNT: clean `tierfs umount` (fusermount3 / SIGTERM fallbacks); copies daemon.log
node_umount() {
  local mnt=$1 pid=${NODE_PID[$1]:-} name=${NODE_NAME[$1]:-node}
  if mountpoint -q "$mnt"; then
    if t --json umount --timeout 300 "$mnt" >>"$LOG" 2>&1; then
      log "node $name: tierfs umount ok"
    else
      log "node $name: tierfs umount FAILED; fusermount3 -u -z"
      fusermount3 -u -z "$mnt" 2>>"$LOG" || umount -l "$mnt" 2>>"$LOG"
    fi
  fi
  if [[ -n $pid ]] && ! wait_gone "$pid" 30; then
    log "node $name: daemon $pid still running 30 s after umount: SIGTERM"
    kill "$pid" 2>/dev/null; wait_gone "$pid" 5 || kill -9 "$pid" 2>/dev/null
  fi
  node_forget "$mnt"
}

cleanup() {
  trap - EXIT INT TERM
  set +e
  for m in "${!NODE_PID[@]}"; do node_umount "$m"; done
  if [[ -n $MOTO_PID ]]; then
    kill "$MOTO_PID" 2>/dev/null
    wait_gone "$MOTO_PID" 5 || kill -9 "$MOTO_PID" 2>/dev/null
  fi
  if [[ -n $WORK && -d $WORK ]]; then
    if [[ ${KEEP_WORK:-0} == 1 ]]; then log "work dir kept: $WORK"; else rm -rf "$WORK"; fi
  fi
  mount | grep -F "${WORK:-/nonexistent}" >&2 && echo "remote.sh: WARNING: mounts left under $WORK" >&2
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# --- binaries ------------------------------------------------------------------------------
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"
tierfs_binaries

# --- restic: install if missing ------------------------------------------------------------
INSTALLED=''
if [[ $RESTIC == 1 && " $PHASES " == *" incr "* ]] && ! command -v restic >/dev/null; then
  if ((IS_ROOT)); then
    log "restic missing: apt-get install -y restic"
    if { apt-get install -y restic || { apt-get update && apt-get install -y restic; }; } >>"$LOG" 2>&1; then
      INSTALLED+="restic "
    else
      log "WARNING: apt-get install restic failed (see $LOG); the restic row is ERR"
    fi
  else
    log "WARNING: restic missing and not root; the restic row is ERR (apt-get install restic, or RESTIC=0)"
  fi
fi

# --- work dir, env -------------------------------------------------------------------------
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/remote.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
TRUN=$WORK/run
mkdir -p "$TRUN"
{
  echo "date: $(date -Is)"
  echo "host: $(uname -nr), $(nproc) cpus, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "busy: $(ps -eo comm= | grep -cE '^(cargo|rustc|cc1|cc1plus|ld)$') compiler processes"
  echo "tierfs: $("$TIERFS" --version 2>/dev/null) ($TIERFS)"
  echo "git: $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null)$(cd "$REPO" && git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "moto: $MOTO_SERVER"
  command -v restic >/dev/null && echo "restic: $(restic version 2>/dev/null)"
  echo "knobs: RATE_MIB=$RATE_MIB DURATION_S=$DURATION_S WRITE_FILES=$WRITE_FILES FILE_MIB=$FILE_MIB WRITE_MODE=$WRITE_MODE POLL_S=$POLL_S CACHE_MIB=$CACHE_MIB FILE_COUNTS=\"$FILE_COUNTS\" PHASES=\"$PHASES\" TIERFS_MOUNT_OPTS=\"${TIERFS_MOUNT_OPTS:-}\" TIERFS_INIT_OPTS=\"${TIERFS_INIT_OPTS:-}\""
  echo "bench root: $BENCH_ROOT ($(df -h --output=avail "$BENCH_ROOT" | tail -1 | tr -d ' ') free)"
  [[ -n $INSTALLED ]] && echo "installed by this run (apt-get): $INSTALLED"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2
if [[ $(cut -d' ' -f1 /proc/loadavg | cut -d. -f1) -ge 1 ]] || grep -q ' [1-9]' <(grep '^busy' "$OUTDIR/env.txt"); then
  log "WARNING: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy"
fi
python3 -c 'import json,sys; k=["rate_mib","duration_s","write_files","file_mib","write_mode","poll_s","cache_mib","file_counts","phases","installed"]; d=dict(zip(k,sys.argv[1:])); d["date"]=sys.argv[-1]; print(json.dumps(d))' \
  "$RATE_MIB" "$DURATION_S" "$WRITE_FILES" "$FILE_MIB" "$WRITE_MODE" "$POLL_S" "$CACHE_MIB" "$FILE_COUNTS" "$PHASES" "$INSTALLED" "$(date +%F)" \
  >"$OUTDIR/params.json"

# --- S3 server -----------------------------------------------------------------------------
start_moto

# store_init FILE PREFIX: a store file FILE on s3://BUCKET/PREFIX
store_init() {
  # shellcheck disable=SC2086  # TIERFS_INIT_OPTS is a word list
  t init --store "$1" --backend "s3://$BUCKET/$2?endpoint=$S3_ENDPOINT&region=us-east-1" \
    ${TIERFS_INIT_OPTS:-} >>"$LOG" 2>&1
}
# s3du PREFIX: {"objects", "bytes"} under PREFIX of the bucket
s3du() { "${RAW[@]}" du --prefix "$1" 2>>"$LOG"; }
# bucket_delta BEFORE_JSON AFTER_JSON: {"objects": delta, "bytes": delta}
bucket_delta() {
  python3 -c 'import json,sys; a,b=(json.loads(x) for x in sys.argv[1:]); print(json.dumps({"objects": b["objects"]-a["objects"], "bytes": b["bytes"]-a["bytes"]}))' "$1" "$2"
}

# --- 1. RPO under steady write load --------------------------------------------------------
rpo_phase() {
  local mnt=$WORK/mnt-rpo store=$WORK/store-rpo.toml pid t0 out
  log "phase 1 (rpo): store tierfs-rpo, writer $RATE_MIB MiB/s for $DURATION_S s (mode $WRITE_MODE)"
  store_init "$store" tierfs-rpo || { phase_error rpo_load "tierfs init failed (see remote.log)"; phase_error rpo_verify "no store"; return 1; }
  node_mount rpo-killed "$store" "$WORK/data-rpo-a" "$mnt" ||
    { phase_error rpo_load "tierfs mount failed (see remote.log)"; phase_error rpo_verify "no mount"; return 1; }
  pid=${NODE_PID[$mnt]}
  t --json status "$mnt" >"$OUTDIR/tierfs-status-rpo-start.json" 2>&1
  out=$(python3 "$HELP" load "$TIERFS" "$TRUN" "$mnt" "$pid" "$RATE_MIB" "$DURATION_S" "$POLL_S" \
    "$OUTDIR/rpo-writes.jsonl" "$OUTDIR/rpo-samples.jsonl" "$WRITE_MODE" "$WRITE_FILES" "$FILE_MIB" 2>>"$LOG")
  if [[ -z $out ]]; then
    phase_error rpo_load "the load driver failed: $(tail -2 "$LOG" | tr '\n' ' ')"
    phase_error rpo_verify "no load"
    node_umount "$mnt"
    return 1
  fi
  printf '%s\n' "$out" | tail -1 >"$OUTDIR/rpo_load.json"
  log "rpo: load done, daemon $pid killed (-9): $(python3 "$HELP" show "$OUTDIR/rpo_load.json" writer/writes writer/mib_s writer/stopped_by remote.oldest_pending_ms/max cold.oldest_dirty_ms/max)"
  if kill -0 "$pid" 2>/dev/null && ! wait_gone "$pid" 10; then log "WARNING: daemon $pid alive 10 s after SIGKILL"; fi
  fusermount3 -u -z "$mnt" 2>>"$LOG" || umount -l "$mnt" 2>>"$LOG" || log "WARNING: lazy unmount of $mnt failed"
  node_forget "$mnt"

  log "rpo: fresh node: tierfs mount --takeover on an empty data dir"
  t0=$EPOCHREALTIME
  if ! node_mount rpo-takeover "$store" "$WORK/data-rpo-b" "$mnt" --takeover; then
    phase_error rpo_restore "tierfs mount --takeover failed (see remote.log)"
    phase_error rpo_verify "no restored node"
    return 1
  fi
  echo "{\"seconds\": $(since "$t0")}" >"$OUTDIR/rpo_restore.json"
  t --json status "$mnt" >"$OUTDIR/tierfs-status-rpo-takeover.json" 2>&1
  log "rpo: checking every logged write on the fresh node"
  out=$(python3 "$HELP" verify "$OUTDIR/rpo-writes.jsonl" "$OUTDIR/rpo_load.json" "$mnt" 2>>"$LOG")
  if [[ -n $out ]]; then
    printf '%s\n' "$out" | tail -1 >"$OUTDIR/rpo_verify.json"
    log "rpo: $(python3 "$HELP" show "$OUTDIR/rpo_verify.json" writes_before_kill writes_survived writes_missing writes_corrupt lost_window_s rpo_prefix_s)"
  else
    phase_error rpo_verify "verify failed: $(tail -2 "$LOG" | tr '\n' ' ')"
  fi
  node_umount "$mnt"
  rm -rf "$WORK/data-rpo-a" "$WORK/data-rpo-b"
}

# --- 2. fresh node: restore + first ls -R --------------------------------------------------
INCR_N='' INCR_MNT=''
tree_phase() {
  local n=$1 keep=$2 name=tree-$1 mnt=$WORK/mnt-tree-$1 store=$WORK/store-tree-$1.toml j=$OUTDIR/tree_$1.json t0 out
  rm -f "$j"
  log "phase 2 (tree, $n files): create through the mount, tierfs sync, umount"
  store_init "$store" "tierfs-$name" || { phase_error "tree_$n" "tierfs init failed (see remote.log)"; return 1; }
  node_mount "$name-writer" "$store" "$WORK/data-$name-a" "$mnt" ||
    { phase_error "tree_$n" "tierfs mount failed (see remote.log)"; return 1; }
  out=$(python3 "$HELP" mktree "$mnt/tree" "$n" 2>>"$LOG") ||
    { phase_error "tree_$n" "creating the tree failed: $(tail -2 "$LOG" | tr '\n' ' ')"; node_umount "$mnt"; return 1; }
  jset "$j" create "$out"
  jset "$j" create_s "$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')"
  log "tree $n: $(python3 "$HELP" show "$j" create_s create/files_s)"
  t --json status "$mnt" >"$OUTDIR/tierfs-status-$name-created.json" 2>&1
  t0=$EPOCHREALTIME
  if out=$(t --json sync -m "bench tree $n" "$mnt" 2>>"$LOG"); then
    jset "$j" sync_s "$(since "$t0")"
    jset "$j" sync "$(printf '%s' "$out" | python3 "$HELP" json)"
    log "tree $n: tierfs sync: $(python3 "$HELP" show "$j" sync_s sync/millis sync/entries sync/parts sync/metadata_bytes sync/data_bytes)"
  else
    jset "$j" sync_s '"ERR"'
    log "ERROR: tree $n: tierfs sync failed: $(tail -2 "$LOG" | tr '\n' ' ')"
  fi
  t0=$EPOCHREALTIME
  node_umount "$mnt"
  jset "$j" umount_s "$(since "$t0")"
  s3du "tierfs-$name/" >"$WORK/du.json" && jset "$j" bucket "$(cat "$WORK/du.json")"
  rm -rf "$WORK/data-$name-a"

  log "tree $n: fresh node: tierfs mount on an empty data dir (restore), then ls -R"
  t0=$EPOCHREALTIME
  if ! node_mount "$name-fresh" "$store" "$WORK/data-$name-b" "$mnt"; then
    jset "$j" restore_s '"ERR"'
    jset "$j" error '"restore mount failed (see remote.log)"'
    return 1
  fi
  jset "$j" restore_s "$(since "$t0")"
  t0=$EPOCHREALTIME
  if ls -R "$mnt" >/dev/null 2>"$WORK/ls.err"; then
    jset "$j" ls_s "$(since "$t0")"
  else
    jset "$j" ls_s '"ERR"'
    log "ERROR: tree $n: ls -R failed: $(tail -2 "$WORK/ls.err" | tr '\n' ' ')"
  fi
  t0=$EPOCHREALTIME
  ls -R "$mnt" >/dev/null 2>&1 && jset "$j" ls2_s "$(since "$t0")"
  out=$(python3 "$HELP" checktree "$mnt/tree" "$n" 200 2>>"$LOG") && jset "$j" check "$out"
  log "tree $n: $(python3 "$HELP" show "$j" restore_s ls_s ls2_s check/files_found check/sample_bad)"
  t --json status "$mnt" >"$OUTDIR/tierfs-status-$name-restored.json" 2>&1
  if [[ $keep == 1 ]]; then
    INCR_N=$n INCR_MNT=$mnt
  else
    node_umount "$mnt"
    rm -rf "$WORK/data-$name-b"
  fi
}

# --- 3. incremental sync vs restic ---------------------------------------------------------
incr_tierfs() {
  local mnt=$INCR_MNT j=$OUTDIR/incr_tierfs.json t0 out
  rm -f "$j"
  [[ -n $mnt ]] || { phase_error incr_tierfs "no restored tree from phase 2 (FILE_COUNTS / tree phase failed)"; return 1; }
  log "phase 3 (incr): tierfs: change one file of the $INCR_N-file tree, tierfs sync"
  jset "$j" files "$INCR_N"
  jset "$j" first_sync_s "$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("sync_s")))' "$OUTDIR/tree_$INCR_N.json")"
  s3du "tierfs-tree-$INCR_N/" >"$WORK/du0.json"
  out=$(python3 "$HELP" change "$mnt/tree" 2>>"$LOG") || { phase_error incr_tierfs "changing the file failed"; return 1; }
  t0=$EPOCHREALTIME
  if ! out=$(t --json sync -m "bench one change" "$mnt" 2>>"$LOG"); then
    phase_error incr_tierfs "tierfs sync failed: $(tail -2 "$LOG" | tr '\n' ' ')"
    return 1
  fi
  jset "$j" wall_s "$(since "$t0")"
  jset "$j" sync "$(printf '%s' "$out" | python3 "$HELP" json)"
  s3du "tierfs-tree-$INCR_N/" >"$WORK/du1.json" && jset "$j" bucket_delta "$(bucket_delta "$(cat "$WORK/du0.json")" "$(cat "$WORK/du1.json")")"
  log "incr: tierfs sync after one change: $(python3 "$HELP" show "$j" wall_s sync/millis sync/data_bytes sync/metadata_bytes sync/parts_uploaded sync/parts bucket_delta/objects bucket_delta/bytes)"
}

incr_restic() {
  local j=$OUTDIR/incr_restic.json src=$WORK/local-tree repo="s3:$S3_ENDPOINT/$BUCKET/restic" t0 out
  rm -f "$j"
  [[ $RESTIC == 1 ]] || return 0
  command -v restic >/dev/null || { phase_error incr_restic "restic not installed"; return 1; }
  [[ -n $INCR_N ]] || { phase_error incr_restic "no tree size (phase 2 failed)"; return 1; }
  log "phase 3 (incr): restic: local copy of the $INCR_N-file tree, init, backup, change one file, backup"
  jset "$j" version "\"$(restic version | awk '{print $2}')\""
  out=$(python3 "$HELP" mktree "$src/tree" "$INCR_N" 2>>"$LOG") || { phase_error incr_restic "creating the local tree failed"; return 1; }
  # shellcheck disable=SC2317
  r() { RESTIC_PASSWORD=bench RESTIC_CACHE_DIR=$WORK/restic-cache restic -r "$repo" "$@"; }
  r init >>"$OUTDIR/restic.log" 2>&1 || { phase_error incr_restic "restic init failed (see restic.log)"; return 1; }
  t0=$EPOCHREALTIME
  out=$(cd "$src" && r backup --json tree 2>>"$OUTDIR/restic.log") ||
    { phase_error incr_restic "restic backup failed (see restic.log)"; return 1; }
  jset "$j" first_s "$(since "$t0")"
  jset "$j" first "$(printf '%s\n' "$out" | grep '"message_type":"summary"' | tail -1)"
  s3du restic/ >"$WORK/du0.json"
  python3 "$HELP" change "$src/tree" >>"$LOG" 2>&1
  t0=$EPOCHREALTIME
  out=$(cd "$src" && r backup --json tree 2>>"$OUTDIR/restic.log") ||
    { phase_error incr_restic "second restic backup failed (see restic.log)"; return 1; }
  jset "$j" second_s "$(since "$t0")"
  jset "$j" second "$(printf '%s\n' "$out" | grep '"message_type":"summary"' | tail -1)"
  s3du restic/ >"$WORK/du1.json" && jset "$j" bucket_delta "$(bucket_delta "$(cat "$WORK/du0.json")" "$(cat "$WORK/du1.json")")"
  log "incr: restic: $(python3 "$HELP" show "$j" first_s first/data_added second_s second/data_added bucket_delta/objects bucket_delta/bytes)"
  rm -rf "$src"
}

# --- run -----------------------------------------------------------------------------------
[[ " $PHASES " == *" rpo "* ]] && rpo_phase
if [[ " $PHASES " == *" tree "* ]]; then
  LARGEST=$(printf '%s\n' $FILE_COUNTS | sort -n | tail -1)
  for n in $(printf '%s\n' $FILE_COUNTS | sort -n); do
    keep=0; [[ $n == "$LARGEST" && " $PHASES " == *" incr "* ]] && keep=1
    tree_phase "$n" "$keep"
  done
fi
if [[ " $PHASES " == *" incr "* ]]; then
  incr_tierfs
  [[ -n $INCR_MNT ]] && { node_umount "$INCR_MNT"; rm -rf "$WORK/data-tree-$INCR_N-b"; }
  incr_restic
fi
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"

# --- table ---------------------------------------------------------------------------------
python3 "$HELP" table "$OUTDIR" || log "ERROR: building the table failed"
log "results: $OUTDIR"
