#!/usr/bin/env bash
# benches/holes.sh [OUTDIR]
#
# Issue 25 ("holes and extreme lengths"), the bench numbers: how the tierfs-daemon's memory
# (VmRSS, VmHWM) and the wall time of `tierfs status`, `ls -R` and `tierfs umount` behave with
#   many    N_MANY files in directories of PER_DIR files each,
#   sparse  one SPARSE_SIZE sparse file holding 1 MiB of data (4 pieces of 256 KiB: at the
#           start, a third, two thirds, the end), with `tierfs sync`'s time and the pending,
#           uploaded and cached bytes `tierfs status --json` reports after it,
#   dir     N_DIR files in one directory, and `ls -f` of it on tierfs beside a bindfs mount of a
#           local directory holding the same files and that local directory itself (PEERS),
# each on its own workspace: `tierfs init` with a key file and a `file://` backend in the work
# dir (what the embedded store is, but at a path of its own), `tierfs mount --store --data-dir`.
# Every phase then unmounts, mounts again (the same data dir) and repeats its listing (sparse:
# its status and a read-back), for the memory of a daemon that starts on that state. Prints a
# markdown table (one row per measurement). See benches/README.md, "Holes and extreme lengths
# (holes.sh)". A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   QUICK=1             a quick run: N_MANY and N_DIR default to 20000 and 5000
#   N_MANY [1000000]    files of the `many` phase (empty, created with os.open/close)
#   PER_DIR [1000]      files per directory in the `many` phase
#   N_DIR [100000]      files in the one directory of the `dir` phase
#   SPARSE_SIZE [1T]    size of the sparse file (truncate -s; K, M, G, T are powers of 1024;
#                       tierfs's limit is 16T less 4K)
#   PEERS ["bindfs local"]  what `ls -f` of the `dir` phase also runs on (tierfs always); bindfs
#                       is installed with apt-get if missing (as root) and the table says so
#   BINDFS_OPTS         extra bindfs options, e.g. --multithreaded
#   LS_ROUNDS [3]       `ls -f` rounds, interleaved (tierfs, bindfs, local, tierfs, ...); each
#                       round drops the page cache, lists once (caches dropped), then once more
#                       (warm); the table gives medians and the median of the per-round ratios
#   PHASES ["many sparse dir"]  the phases to run, in the order given
#   VERIFY [1]          check untimed what each phase wrote (file counts, the sparse file's bytes
#                       and a hole after the remount)
#   DROP_CACHES [1]     drop the page cache before each timed listing (needs root)
#   UMOUNT_TIMEOUT [1800]  `tierfs umount --timeout`
#   TIERFS_BIN_DIR      directory with `tierfs` and `tierfs-daemon`: skips the build
#   CARGO_TARGET_DIR [/var/tmp/tierfs-target]  where `cargo build --release` puts them
#   SKIP_BUILD=1        use the binaries already in $CARGO_TARGET_DIR/release
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options (word-split), e.g. "--dirty-age 30 --fsync
#                       local" for the embedded store's defaults
#   TIERFS_INIT_OPTS    extra `tierfs init` options (word-split)
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (stores, data dirs, mounts, the
#                       local directory): put it on the disk you want to measure
#   KEEP_WORK=1         keep the work dir (stores and data dirs) after the run
# Output in OUTDIR (default ${OUTDIR:-${TMPDIR:-/tmp}/tierfs-bench/holes/<date>}): table.md,
#   results.json (every measurement, the knobs, env.txt), measurements.jsonl (the same, one
#   line each), <phase>-*.json (tierfs's JSON output: mount, status, sync, umount),
#   tierfs-daemon-<phase>.log, holes.log (this script's log), env.txt.
# Needs root (drop_caches, apt-get), fuse3, python3, bindfs for the bindfs peer; everything
# started here is unmounted and stopped and the work dir removed on exit (also on Ctrl-C or
# SIGTERM).
set -uo pipefail
export LC_ALL=C # ls sorts bytewise; $EPOCHREALTIME has a decimal point
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUTDIR=${1:-${OUTDIR:-${TMPDIR:-/tmp}/tierfs-bench/holes/$(date +%Y%m%d-%H%M%S)}}
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
  N_MANY=${N_MANY:-20000} N_DIR=${N_DIR:-5000}
fi
N_MANY=${N_MANY:-1000000}
PER_DIR=${PER_DIR:-1000}
N_DIR=${N_DIR:-100000}
SPARSE_SIZE=${SPARSE_SIZE:-1T}
PEERS=${PEERS-"bindfs local"}
LS_ROUNDS=${LS_ROUNDS:-3}
PHASES=${PHASES:-"many sparse dir"}
VERIFY=${VERIFY:-1}
DROP_CACHES=${DROP_CACHES:-1}
UMOUNT_TIMEOUT=${UMOUNT_TIMEOUT:-1800}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
PIECE=$((256 << 10)) # the sparse file's data: 4 pieces of this many bytes

mkdir -p "$OUTDIR" || { echo "holes.sh: cannot create $OUTDIR" >&2; exit 1; }
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/holes.log
M=$OUTDIR/measurements.jsonl
: >"$LOG"
: >"$M"
log() { echo "[holes.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }

for v in N_MANY PER_DIR N_DIR LS_ROUNDS UMOUNT_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v=${!v} is not a positive number"
done
SPARSE_BYTES=$(numfmt --from=iec "$SPARSE_SIZE" 2>/dev/null) || die "SPARSE_SIZE=$SPARSE_SIZE: not a size (e.g. 1T, 64G)"
((SPARSE_BYTES >= 16 << 20)) || die "SPARSE_SIZE=$SPARSE_SIZE: at least 16M (the 4 pieces must not overlap)"
for p in $PHASES; do
  case $p in many | sparse | dir) ;; *) die "unknown phase $p (PHASES: many sparse dir)" ;; esac
done
for p in $PEERS; do
  case $p in bindfs | local) ;; *) die "unknown peer $p (PEERS: bindfs local)" ;; esac
done
for tool in python3 dd cmp mountpoint fusermount3 numfmt truncate; do
  command -v "$tool" >/dev/null || die "$tool missing (scripts/setup-debian.sh installs fuse3, python3)"
done
IS_ROOT=0; [[ $(id -u) == 0 ]] && IS_ROOT=1
((IS_ROOT)) || log "WARNING: not root: page cache drops fail (listings are then warm) and bindfs cannot be installed"

# --- state for cleanup ---------------------------------------------------------------------
WORK='' TIERFS='' TRUN='' CHILD=''
declare -A TPID=()  # tierfs mountpoint -> daemon pid
declare -A TPHASE=() # tierfs mountpoint -> phase (for the daemon log's name)
declare -A BPID=()  # bindfs mountpoint -> bindfs pid

# t ARGS...: the tierfs CLI with the bench's runtime dir (the store is unlocked by its key file)
t() { TIERFS_TEST_FAST_KDF="test" "$TIERFS" --runtime-dir "$TRUN" "$@"; }

# since T0: seconds from $EPOCHREALTIME value T0 to now
since() { local t1=$EPOCHREALTIME; awk -v a="$1" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }

# in_bg OUT CMD...: runs CMD in the background, its stdout to the file OUT and its stderr to
# $LOG, and waits for it, so that a SIGTERM or SIGINT to this script runs the cleanup at once
# (bash defers traps until a foreground command ends; the redirections are CMD's, not this
# function's, so the trap's messages go where they belong); the cleanup stops CMD by its pid
# ($CHILD). Returns CMD's status.
in_bg() {
  local out=$1
  shift
  "$@" >"$out" 2>>"$LOG" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=''
  return "$rc"
}

# run_timed VAR OUT CMD...: runs CMD (in_bg OUT CMD...); VAR = its wall time in seconds;
# returns CMD's status
run_timed() {
  local -n _rt_out=$1
  shift
  local t0=$EPOCHREALTIME rc t1
  in_bg "$@"
  rc=$?
  t1=$EPOCHREALTIME
  _rt_out=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  return "$rc"
}

# rec PHASE KEY LABEL VALUE UNIT [NOTE [EXTRA_JSON]]: one measurement (one row of the table);
# VALUE '' is recorded as null (the table shows ERR and the note)
rec() {
  python3 - "$@" >>"$M" <<'PY'
import json, sys
a = sys.argv[1:] + [""] * (7 - len(sys.argv[1:]))
phase, key, label, value, unit, note, extra = a[:7]
d = {"phase": phase, "key": key, "label": label, "value": float(value) if value != "" else None,
     "unit": unit, "note": note}
if extra:
    d.update(json.loads(extra))
print(json.dumps(d))
PY
  log "$1: $3: ${4:-ERR} $5${6:+ ($6)}"
}
rec_err() { rec "$1" "$2" "$3" "" "" "ERROR: $4"; }  # rec_err PHASE KEY LABEL MESSAGE

# jget JSON KEY.PATH: a field of a JSON document ('' if missing)
jget() {
  python3 -c 'import json,sys
d = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else d if isinstance(d, str) else json.dumps(d))' "$1" "$2" 2>/dev/null
}

drop_caches() {
  [[ $DROP_CACHES == 1 ]] || return 0
  sync
  if ((IS_ROOT)); then echo 3 >/proc/sys/vm/drop_caches || log "WARNING: drop_caches failed"; fi
}

# rss PHASE KEY LABEL MNT [NOTE]: the VmRSS (value) and VmHWM of the daemon serving MNT
rss() {
  local pid=${TPID[$4]:-} rss hwm
  if [[ -z $pid || ! -r /proc/$pid/status ]]; then
    rec_err "$1" "$2" "$3" "no daemon process for $4 (pid '${pid}')"
    return 1
  fi
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
  hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")
  rec "$1" "$2" "$3" "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" MiB \
    "VmHWM $(awk -v k="$hwm" 'BEGIN { printf "%.1f", k / 1024 }') MiB${5:+; $5}" \
    "{\"vmrss_kib\": $rss, \"vmhwm_kib\": $hwm, \"pid\": $pid}"
}

# ws_init PHASE: a store ($WORK/PHASE/store.toml, key file, file:// backend) and its paths
ws_init() {
  local w=$WORK/$1
  mkdir -p "$w/objects" "$w/data" "$w/mnt"
  # shellcheck disable=SC2086  # TIERFS_INIT_OPTS is a word list
  t init --store "$w/store.toml" --key-file "$w/store.key" --backend "file://$w/objects" \
    ${TIERFS_INIT_OPTS:-} >>"$LOG" 2>&1
}

# tmount PHASE KEY LABEL: mounts PHASE's workspace on $WORK/PHASE/mnt, records the mount's time
tmount() {
  local w=$WORK/$1 out secs pid spid j=$OUTDIR/$1-$2.json
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  run_timed secs "$j" t --json mount --store "$w/store.toml" --data-dir "$w/data" ${TIERFS_MOUNT_OPTS:-} "$w/mnt" ||
    { rec_err "$1" "$2" "$3" "tierfs mount failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  out=$(cat "$j")
  pid=$(jget "$out" pid)
  [[ -n $pid ]] || { rec_err "$1" "$2" "$3" "no pid in the mount's JSON: $out"; return 1; }
  TPID[$w/mnt]=$pid TPHASE[$w/mnt]=$1
  spid=$(jget "$(t --json status "$w/mnt" 2>>"$LOG")" pid)
  [[ $spid == "$pid" ]] || log "WARNING: tierfs status $w/mnt says pid '$spid', the mount said $pid"
  rec "$1" "$2" "$3" "$secs" s "tierfs mount; daemon pid $pid"
}

# tstatus PHASE KEY LABEL MNT: times `tierfs status MNT`, then saves its --json form (untimed)
tstatus() {
  local secs out
  run_timed secs /dev/null t status "$4" ||
    { rec_err "$1" "$2" "$3" "tierfs status failed"; return 1; }
  out=$(t --json status "$4" 2>>"$LOG")
  printf '%s\n' "$out" >"$OUTDIR/$1-$2.json"
  rec "$1" "$2" "$3" "$secs" s "status reports $(jget "$out" inodes) inodes, $(jget "$out" data_bytes) data bytes"
}

# tumount PHASE KEY LABEL MNT: times `tierfs umount` (flush, unmount, daemon exit)
tumount() {
  local mnt=$4 pid=${TPID[$4]:-} secs out rc j=$OUTDIR/$1-$2.json
  run_timed secs "$j" t --json umount --timeout "$UMOUNT_TIMEOUT" "$mnt"
  rc=$?
  out=$(cat "$j")
  if ((rc == 0)); then
    rec "$1" "$2" "$3" "$secs" s "tierfs umount; flushed $(jget "$out" flush.flushed) in $(jget "$out" flush.flush_millis) ms"
  else
    rec_err "$1" "$2" "$3" "tierfs umount failed after $secs s: $(tail -2 "$LOG" | tr '\n' ' ')"
  fi
  stop_tierfs "$mnt"
  [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null
}

# stop_tierfs MNT: makes sure MNT is unmounted and its daemon gone (by its pid)
stop_tierfs() {
  local mnt=$1 pid=${TPID[$1]:-} ph=${TPHASE[$1]:-x}
  if mountpoint -q "$mnt"; then
    t umount --timeout 120 "$mnt" >>"$LOG" 2>&1 || {
      log "tierfs umount $mnt failed: fusermount3 -u"
      fusermount3 -u "$mnt" 2>>"$LOG" || umount -l "$mnt" 2>>"$LOG"
    }
  fi
  [[ -z $pid ]] || stop_daemon "$pid"
  [[ -f $(dirname "$mnt")/data/daemon.log ]] && cp "$(dirname "$mnt")/data/daemon.log" "$OUTDIR/tierfs-daemon-$ph.log"
  unset "TPID[$mnt]" "TPHASE[$mnt]"
}

stop_bindfs() {
  local mnt=$1 pid=${BPID[$1]:-}
  if mountpoint -q "$mnt"; then
    fusermount3 -u "$mnt" 2>>"$LOG" || { sleep 1; umount -l "$mnt" 2>>"$LOG"; }
  fi
  if [[ -n $pid ]]; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; sleep 1; kill -0 "$pid" 2>/dev/null && kill -9 "$pid"; fi
  fi
  unset "BPID[$mnt]"
}

cleanup() {
  trap - EXIT INT TERM
  set +e
  local m
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
    kill "$CHILD" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$CHILD" 2>/dev/null && kill -9 "$CHILD" 2>/dev/null
  fi
  for m in "${!BPID[@]}"; do stop_bindfs "$m"; done
  for m in "${!TPID[@]}"; do stop_tierfs "$m"; done
  if [[ -n $WORK && -d $WORK ]]; then
    if mount | grep -qF " $WORK/"; then
      echo "holes.sh: WARNING: mounts left under $WORK, not removing it:" >&2
      mount | grep -F " $WORK/" >&2
    elif [[ ${KEEP_WORK:-0} == 1 ]]; then
      echo "holes.sh: work dir kept: $WORK" >&2
    else
      rm -rf "$WORK"
    fi
  fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# --- binaries, peers -----------------------------------------------------------------------
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"
tierfs_binaries
INSTALLED=''
if [[ " $PHASES " == *" dir "* && " $PEERS " == *" bindfs "* ]] && ! command -v bindfs >/dev/null; then
  ((IS_ROOT)) || die "bindfs missing and not root: apt-get install bindfs, or PEERS=local"
  log "bindfs missing: apt-get install -y bindfs"
  { apt-get install -y bindfs || { apt-get update && apt-get install -y bindfs; }; } >>"$LOG" 2>&1 ||
    die "apt-get install bindfs failed (see $LOG)"
  INSTALLED=bindfs
fi

# --- work dir, helper, env -----------------------------------------------------------------
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/holes.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
TRUN=$WORK/run
mkdir -p "$TRUN"
CREATE=$WORK/create.py
cat >"$CREATE" <<'PY'
"""create.py ROOT N PER_DIR: N empty files under ROOT, PER_DIR to a directory (d00000/f0000, ...),
or all in ROOT itself with PER_DIR 0 (f0000000, ...). Prints JSON (files, dirs, seconds)."""
import json, os, sys, time
root, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
dirs, d, step = 0, root, max(n // 10, 1)
t0 = time.perf_counter()
for i in range(n):
    if per:
        if i % per == 0:
            d = os.path.join(root, f"d{i // per:05d}")
            os.mkdir(d)
            dirs += 1
        name = f"{d}/f{i % per:04d}"
    else:
        name = f"{root}/f{i:07d}"
    os.close(os.open(name, flags, 0o644))
    if (i + 1) % step == 0 and i + 1 < n:
        s = time.perf_counter() - t0
        print(f"  {i + 1} files in {s:.1f} s ({(i + 1) / s:.0f}/s)", file=sys.stderr, flush=True)
secs = time.perf_counter() - t0
print(json.dumps({"files": n, "dirs": dirs, "seconds": round(secs, 3), "files_s": round(n / secs, 1)}))
PY

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2009  # pgrep refuses patterns longer than 15 characters
  echo "busy at start: $(ps -eo comm= | grep -cxE 'cargo|rustc|cc1plus|cc1|ld|fio') compiler/cargo/fio processes"
  echo "work dir: $WORK ($(df -h --output=source,fstype,avail "$WORK" | tail -1 | tr -s ' '))"
  echo "QUICK=$QUICK N_MANY=$N_MANY PER_DIR=$PER_DIR N_DIR=$N_DIR SPARSE_SIZE=$SPARSE_SIZE PEERS='$PEERS' LS_ROUNDS=$LS_ROUNDS PHASES='$PHASES' VERIFY=$VERIFY DROP_CACHES=$DROP_CACHES"
  echo "tierfs: $("$TIERFS" --version) ($TIERFS, $(stat -c %s "$TIERFS") bytes, built $(date -r "$TIERFS" +%FT%T)), checkout git $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo none)$(cd "$REPO" && [[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' (dirty tree)'), mount opts '${TIERFS_MOUNT_OPTS:-}', init opts '${TIERFS_INIT_OPTS:-}'"
  [[ " $PEERS " == *" bindfs "* ]] && echo "bindfs: $(bindfs --version 2>/dev/null | head -1) opts '${BINDFS_OPTS:-}'"
  [[ -n $INSTALLED ]] && echo "installed by this run (apt-get): $INSTALLED"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2
if [[ $(cut -d' ' -f1 /proc/loadavg | cut -d. -f1) -ge 1 ]] || grep -q ' [1-9]' <(grep '^busy' "$OUTDIR/env.txt"); then
  log "WARNING: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy"
fi

# create PHASE KEY LABEL ROOT N PER_DIR: creates the files, records the time
create() {
  local out j=$OUTDIR/$1-$2.json
  in_bg "$j" python3 "$CREATE" "$4" "$5" "$6" ||
    { rec_err "$1" "$2" "$3" "creating files under $4 failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  out=$(cat "$j")
  rec "$1" "$2" "$3" "$(jget "$out" seconds)" s "$(jget "$out" files_s) files/s; $(jget "$out" dirs) dirs (python3 os.open/close, one process)"
}

# ls_timed PHASE KEY LABEL ENTRIES LS_ARGS...: drops caches, times `ls LS_ARGS > /dev/null`
ls_timed() {
  local ph=$1 key=$2 label=$3 n=$4 secs shown
  shift 4
  shown="$*"
  shown=${shown//"$WORK/"/} # the work dir's random name is noise in the table
  drop_caches
  if run_timed secs /dev/null ls "$@"; then
    rec "$ph" "$key" "$label" "$secs" s "$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / (s > 0 ? s : 1e-9) }') entries/s, ls $shown$([[ $DROP_CACHES == 1 ]] && echo ', page cache dropped first')"
  else
    rec_err "$ph" "$key" "$label" "ls $shown failed"
  fi
}

# du_rec PHASE KEY LABEL DIR: bytes allocated under DIR (du -sB1)
du_rec() {
  rec "$1" "$2" "$3" "$(du -sB1 "$4" 2>>"$LOG" | cut -f1)" B "du -sB1 $(basename "$4"), $(find "$4" -type f 2>/dev/null | wc -l) files"
}

# --- 1. many files -------------------------------------------------------------------------
phase_many() {
  local ph=many mnt=$WORK/many/mnt dirs=$(((N_MANY + PER_DIR - 1) / PER_DIR)) n got
  n=$((N_MANY + dirs))
  log "many: $N_MANY files in $dirs dirs of $PER_DIR"
  ws_init $ph || { rec_err $ph init "tierfs init" "tierfs init failed (see holes.log)"; return 1; }
  tmount $ph mount_s "mount (fresh workspace)" || return 1
  rss $ph rss_mount "daemon RSS after mount" "$mnt"
  create $ph create_s "create $N_MANY files in $dirs dirs" "$mnt" "$N_MANY" "$PER_DIR" || return 1
  rss $ph rss_create "daemon RSS after creating them" "$mnt"
  tstatus $ph status_s "tierfs status" "$mnt"
  ls_timed $ph ls_R_s "ls -R" "$n" -R "$mnt"
  rss $ph rss_ls "daemon RSS after ls -R" "$mnt"
  tumount $ph umount_s "tierfs umount" "$mnt"
  remounted $ph "$n" -R "$mnt" || return 1
  if [[ $VERIFY == 1 ]]; then
    in_bg "$WORK/many-count" find "$mnt" -type f -printf .
    got=$(stat -c %s "$WORK/many-count")
    if ((got == N_MANY)); then log "many: $got files after the remount, as created"
    else rec_err $ph verify "files after the remount" "find counts $got files, $N_MANY created"; fi
  fi
  tumount $ph umount_remount_s "tierfs umount after the remount" "$mnt"
  du_rec $ph data_dir_bytes "data dir on disk" "$WORK/many/data"
  du_rec $ph store_bytes "store (file:// objects) on disk" "$WORK/many/objects"
}

# remounted PHASE N FLAG DIR: mounts PHASE's workspace again and records its RSS, the time of
# `ls FLAG DIR` (N entries), the RSS after it and the time of `tierfs status`
remounted() {
  local ph=$1 mnt=$WORK/$1/mnt
  tmount "$ph" remount_s "mount again (same data dir)" || return 1
  rss "$ph" rss_remount "daemon RSS after the remount" "$mnt"
  ls_timed "$ph" "ls_${3#-}_remount_s" "ls $3 after the remount" "$2" "$3" "$4"
  rss "$ph" rss_remount_ls "daemon RSS after the remount and ls $3" "$mnt"
  tstatus "$ph" status_remount_s "tierfs status after the remount" "$mnt"
}

# --- 2. one sparse file --------------------------------------------------------------------
# write_pieces FILE OFF0 OFF1 OFF2 OFF3: $WORK/piece<i> into FILE at OFF<i>, in place
write_pieces() {
  local f=$1 j
  shift
  for j in 0 1 2 3; do
    dd if="$WORK/piece$j" of="$f" bs="$PIECE" count=1 seek="$1" oflag=seek_bytes conv=notrunc status=none || return 1
    shift
  done
}

phase_sparse() {
  local ph=sparse mnt=$WORK/sparse/mnt f secs out st i off ok=1
  local -a offs
  f=$mnt/sparse
  offs=(0 $((SPARSE_BYTES / 3 / 4096 * 4096)) $((SPARSE_BYTES * 2 / 3 / 4096 * 4096)) $((SPARSE_BYTES - PIECE)))
  log "sparse: one $SPARSE_SIZE file ($SPARSE_BYTES bytes), $((4 * PIECE)) bytes of data at ${offs[*]}"
  for i in 0 1 2 3; do
    dd if=/dev/urandom of="$WORK/piece$i" bs="$PIECE" count=1 status=none || die "writing $WORK/piece$i failed"
  done
  ws_init $ph || { rec_err $ph init "tierfs init" "tierfs init failed (see holes.log)"; return 1; }
  tmount $ph mount_s "mount (fresh workspace)" || return 1
  rss $ph rss_mount "daemon RSS after mount" "$mnt"
  run_timed secs /dev/null truncate -s "$SPARSE_BYTES" "$f" ||
    { rec_err $ph truncate_s "truncate -s $SPARSE_SIZE" "truncate failed: $(tail -1 "$LOG")"; return 1; }
  rec $ph truncate_s "truncate -s $SPARSE_SIZE" "$secs" s "an empty file to $SPARSE_BYTES bytes"
  run_timed secs /dev/null write_pieces "$f" "${offs[@]}" ||
    { rec_err $ph write_s "write 1 MiB" "dd failed: $(tail -1 "$LOG")"; return 1; }
  rec $ph write_s "write 1 MiB in 4 pieces" "$secs" s "dd conv=notrunc, $PIECE bytes at each of ${offs[*]}"
  run_timed secs "$OUTDIR/$ph-sync.json" t --json sync -m holes-bench "$mnt" ||
    { rec_err $ph sync_s "tierfs sync" "tierfs sync failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  out=$(cat "$OUTDIR/$ph-sync.json")
  rec $ph sync_s "tierfs sync" "$secs" s "snapshot of $(jget "$out" entries) entries: data_bytes $(jget "$out" data_bytes), metadata_bytes $(jget "$out" metadata_bytes), $(jget "$out" millis) ms by the daemon's count"
  st=$(t --json status "$mnt" 2>>"$LOG")
  printf '%s\n' "$st" >"$OUTDIR/$ph-status-after-sync.json"
  rec $ph pending_bytes "pending bytes after the sync" "$(jget "$st" cold.dirty_bytes)" B \
    "status cold.dirty_bytes (data not yet uploaded; $(jget "$st" cold.dirty_files) dirty files); remote.pending_bytes (metadata not yet in the store) $(jget "$st" remote.pending_bytes)"
  rec $ph uploaded_bytes "uploaded bytes after the sync" "$(jget "$st" cold.uploaded_bytes)" B \
    "status cold.uploaded_bytes, $(jget "$st" cold.uploaded_packs) packs; for $((4 * PIECE)) bytes of data"
  rec $ph cached_bytes "cached bytes after the sync" "$(jget "$st" cold.resident_bytes)" B \
    "status cold.resident_bytes; data_bytes $(jget "$st" data_bytes)"
  rec $ph allocated_bytes "the file's st_blocks on the mount" "$(($(stat -c %b "$f") * 512))" B "stat -c %b x 512; st_size $(stat -c %s "$f")"
  rss $ph rss_sync "daemon RSS after the sync" "$mnt"
  tstatus $ph status_s "tierfs status" "$mnt"
  ls_timed $ph ls_R_s "ls -R" 1 -R "$mnt"
  tumount $ph umount_s "tierfs umount" "$mnt"
  du_rec $ph data_dir_bytes "data dir on disk" "$WORK/sparse/data"
  du_rec $ph store_bytes "store (file:// objects) on disk" "$WORK/sparse/objects"
  tmount $ph remount_s "mount again (same data dir)" || return 1
  rss $ph rss_remount "daemon RSS after the remount" "$mnt"
  tstatus $ph status_remount_s "tierfs status after the remount" "$mnt"
  if [[ $VERIFY == 1 ]]; then
    [[ $(stat -c %s "$f") == "$SPARSE_BYTES" ]] || { ok=0; log "ERROR: sparse: size $(stat -c %s "$f") after the remount"; }
    for i in 0 1 2 3; do
      cmp -s -n "$PIECE" -i "0:${offs[$i]}" "$WORK/piece$i" "$f" || { ok=0; log "ERROR: sparse: piece $i at ${offs[$i]} differs after the remount"; }
    done
    off=$((SPARSE_BYTES / 6 / 4096 * 4096))
    cmp -s -n $((1 << 20)) -i "0:$off" /dev/zero "$f" || { ok=0; log "ERROR: sparse: the hole at $off does not read as zeros"; }
    if ((ok)); then
      log "sparse: size, the 4 pieces and a hole read back right after the remount"
    else
      rec_err $ph verify "content after the remount" "size, pieces or hole differ (see holes.log)"
    fi
  fi
  tumount $ph umount_remount_s "tierfs umount after the remount" "$mnt"
}

# --- 3. one big directory, beside bindfs and a local directory -----------------------------
phase_dir() {
  local ph=dir w=$WORK/dir mnt=$WORK/dir/mnt p r secs pid n=$N_DIR
  local -A dirof=()
  log "dir: $N_DIR files in one directory; ls -f on tierfs${PEERS:+ and $PEERS}"
  ws_init $ph || { rec_err $ph init "tierfs init" "tierfs init failed (see holes.log)"; return 1; }
  tmount $ph mount_s "mount (fresh workspace)" || return 1
  rss $ph rss_mount "daemon RSS after mount" "$mnt"
  mkdir "$mnt/one" || { rec_err $ph create_s "create" "mkdir on the mount failed"; return 1; }
  create $ph create_s "create $N_DIR files in one dir" "$mnt/one" "$N_DIR" 0 || return 1
  rss $ph rss_create "daemon RSS after creating them" "$mnt"
  dirof[tierfs]=$mnt/one
  if [[ " $PEERS " == *" local "* || " $PEERS " == *" bindfs "* ]]; then
    mkdir -p "$w/local/one"
    create $ph create_local_s "local: create $N_DIR files in one dir" "$w/local/one" "$N_DIR" 0 || return 1
    [[ " $PEERS " == *" local "* ]] && dirof[local]=$w/local/one
  fi
  if [[ " $PEERS " == *" bindfs "* ]]; then
    mkdir -p "$w/bindfs"
    # shellcheck disable=SC2086  # BINDFS_OPTS is a word list
    bindfs -f ${BINDFS_OPTS:-} "$w/local" "$w/bindfs" >>"$OUTDIR/bindfs.log" 2>&1 &
    pid=$!
    BPID[$w/bindfs]=$pid
    for _ in $(seq 300); do
      mountpoint -q "$w/bindfs" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if mountpoint -q "$w/bindfs"; then
      dirof[bindfs]=$w/bindfs/one
    else
      rec_err $ph ls_f_bindfs_s "bindfs: ls -f" "bindfs mount failed: $(tail -2 "$OUTDIR/bindfs.log" | tr '\n' ' ')"
    fi
  fi
  local -a order=(tierfs)
  for p in $PEERS; do [[ -n ${dirof[$p]:-} ]] && order+=("$p"); done
  if [[ $VERIFY == 1 ]]; then
    for p in "${order[@]}"; do
      # shellcheck disable=SC2012  # the count of ls -f is what is measured
      r=$(ls -f "${dirof[$p]}" | wc -l)
      ((r == n + 2)) || rec_err $ph "verify_$p" "$p: entries" "ls -f lists $r entries, $n files + . and .. expected"
    done
  fi
  # rounds of (tierfs, bindfs, local): each drops the page cache, lists (cold), lists (warm)
  local lsj=$OUTDIR/$ph-ls-rounds.jsonl
  : >"$lsj"
  for r in $(seq "$LS_ROUNDS"); do
    for p in "${order[@]}"; do
      drop_caches
      run_timed secs /dev/null ls -f "${dirof[$p]}" || secs=''
      echo "{\"round\": $r, \"peer\": \"$p\", \"kind\": \"cold\", \"s\": ${secs:-null}}" >>"$lsj"
      run_timed secs /dev/null ls -f "${dirof[$p]}" || secs=''
      echo "{\"round\": $r, \"peer\": \"$p\", \"kind\": \"warm\", \"s\": ${secs:-null}}" >>"$lsj"
    done
  done
  # medians per peer and the median of the per-round ratios -> rec lines
  python3 - "$lsj" "$n" "$DROP_CACHES" "${order[@]}" <<'PY' >"$WORK/ls-recs.tsv"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n, dropped, order = int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
def times(p, k):
    return {d["round"]: d["s"] for d in rows if d["peer"] == p and d["kind"] == k and d["s"] is not None}
for k, what in (("cold", "page cache dropped first" if dropped else "page cache NOT dropped"),
                ("warm", "right after the cold one")):
    for p in order:
        t = times(p, k)
        if not t:
            print(f"ls_f_{k}_{p}_s\x1f{p}: ls -f ({k})\x1f\x1fs\x1fERROR: every ls -f failed")
            continue
        v = sorted(t.values())
        m = v[(len(v) - 1) // 2]
        print(f"ls_f_{k}_{p}_s\x1f{p}: ls -f ({k})\x1f{m}\x1fs\x1flower median of {len(v)} rounds ({', '.join(f'{x:.3f}' for x in v)} s); "
              f"{n / m if m else 0:.0f} entries/s; {what}")
    tt = times("tierfs", k)
    for p in order[1:]:
        q = times(p, k)
        r = sorted(tt[i] / q[i] for i in tt if i in q and q[i])
        if r:
            print(f"ratio_{k}_tierfs_{p}\x1fls -f ({k}) time, tierfs/{p}\x1f{statistics.median(r):.3f}\x1fx\x1f"
                  f"median of the per-round ratios ({', '.join(f'{x:.2f}' for x in r)}); above 1: tierfs slower")
PY
  while IFS=$'\x1f' read -r key label value unit note; do
    rec $ph "$key" "$label" "$value" "$unit" "$note"
  done <"$WORK/ls-recs.tsv"
  rss $ph rss_ls "daemon RSS after the ls -f rounds" "$mnt"
  [[ -n ${BPID[$w/bindfs]:-} ]] && stop_bindfs "$w/bindfs"
  tstatus $ph status_s "tierfs status" "$mnt"
  tumount $ph umount_s "tierfs umount" "$mnt"
  remounted $ph "$n" -f "$mnt/one" || return 1
  tumount $ph umount_remount_s "tierfs umount after the remount" "$mnt"
}

for p in $PHASES; do
  "phase_$p" || log "phase $p stopped early (see the ERR rows)"
  # a phase that stopped early may leave its mount: unmount it before the next one
  for m in "${!TPID[@]}"; do stop_tierfs "$m"; done
  for m in "${!BPID[@]}"; do stop_bindfs "$m"; done
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"

# --- table ---------------------------------------------------------------------------------
python3 - "$OUTDIR" "$QUICK" "$N_MANY" "$PER_DIR" "$N_DIR" "$SPARSE_SIZE" "$SPARSE_BYTES" "$PEERS" "$LS_ROUNDS" "$PHASES" "$INSTALLED" <<'PY' | tee "$OUTDIR/table.md"
import json, os, sys
out, quick, n_many, per_dir, n_dir, sparse_size, sparse_bytes, peers, ls_rounds, phases, installed = sys.argv[1:12]
rows = [json.loads(l) for l in open(os.path.join(out, "measurements.jsonl"))]
def human(b):
    for u, s in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b / s:.2f} {u}"
    return f"{b:.0f} B"
def fmt(d):
    v, u = d["value"], d["unit"]
    if v is None:
        return "ERR"
    if u == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if u == "MiB":
        return f"{v:.1f} MiB"
    if u == "B":
        return f"{human(v)} ({v:.0f})" if v >= 1024 else f"{v:.0f} B"
    if u == "x":
        return f"{v:.2f}x"
    return f"{v:g} {u}".strip()
dirs = -(-int(n_many) // int(per_dir))
what = {"many": f"{int(n_many):,} files in {dirs:,} dirs of {int(per_dir):,}",
        "sparse": f"one {sparse_size} ({int(sparse_bytes):,} bytes) sparse file, 1 MiB of data",
        "dir": f"{int(n_dir):,} files in one dir"}
print(f"## tierfs: holes and extreme lengths (issue 25){' - QUICK' if quick == '1' else ''}\n")
for p in phases.split():
    print(f"- {p}: {what[p]}")
print("\n| phase | measurement | value | notes |\n|---|---|---:|---|")
for d in rows:
    print(f"| {d['phase']} | {d['label']} | {fmt(d)} | {d['note']} |")
notes = []
for p in phases.split():
    log = os.path.join(out, f"tierfs-daemon-{p}.log")
    if os.path.exists(log):
        bad = [l.rstrip() for l in open(log, errors="replace") if " WARN " in l or " ERROR " in l]
        notes.append(f"tierfs-daemon-{p}.log: {len(bad)} WARN/ERROR lines" + (f", first: `{bad[0][:200]}`" if bad else ""))
if installed:
    notes.append(f"installed by this run with apt-get: {installed}.")
env = open(os.path.join(out, "env.txt")).read().splitlines()
notes += [l for l in env if l.startswith(("loadavg", "busy", "tierfs:"))]
print()
for n in notes:
    print(f"- {n}")
params = {"quick": quick == "1", "n_many": int(n_many), "per_dir": int(per_dir), "n_dir": int(n_dir),
          "sparse_size": sparse_size, "sparse_bytes": int(sparse_bytes), "peers": peers.split(),
          "ls_rounds": int(ls_rounds), "phases": phases.split()}
results = {"params": params, "env": env, "measurements": rows,
           "by_key": {f"{d['phase']}.{d['key']}": d["value"] for d in rows}}
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
PY
log "results: $OUTDIR"
