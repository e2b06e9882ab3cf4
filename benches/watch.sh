#!/usr/bin/env bash
# benches/watch.sh [OUTDIR]
#
# Issue 20 ("tierfs watch DIR"), the bench numbers, in one run:
#   rpo   RPO of watch mode under a steady writer: a writer creates one small file every
#         WRITE_MS in a watched DIR (each file holds its sequence number); after RPO_S seconds
#         the watcher (the tierfs-daemon pid from `tierfs --json watch`) is killed with
#         SIGKILL; a fresh node (fresh data dir, fresh empty DIR, same store, `--takeover`)
#         restores the workspace into its DIR, and every file the writer finished before the
#         kill is checked there: the lost window is the time between the last file the writer
#         wrote before the kill and the newest file that came back intact, with the count of
#         files lost; RPO_ROUNDS times, and a summary table of the rounds. A second load
#         (RPO_MODES) appends a 64-byte line to one file every WRITE_MS instead.
#   tree  N_FILES small files (FILE_MIN..FILE_MAX bytes of seeded random data, in N_DIRS
#         directories, the same tree for every SEED): the initial scan and upload of `tierfs
#         watch` (start to ready, which includes the first pass, then `tierfs sync DIR`)
#         against the first `restic backup` of the same directory into a local repository and
#         the first `rclone sync` of it to a local directory; the watcher left alone for IDLE_S
#         (its CPU and passes); then the watcher started again (a resume), one file rewritten
#         and `tierfs sync DIR` against the second `restic backup` and `rclone sync`: wall
#         time, CPU time, bytes uploaded (each tool's own count, and the bytes of the files new
#         or changed in its destination), peak RSS; the watcher's VmRSS/VmHWM after the first
#         pass, the sync, each resume and the change; then (a second resume) another changed
#         file left to the inotify events alone (time until status shows it read). The peers
#         run while the watcher is stopped (`tierfs unwatch`), so that neither takes the
#         other's CPU.
# The store is a `file://` store (`tierfs init --store FILE --backend file://DIR`) unlocked by
# the test passphrase (TIERFS_PASSPHRASE, TIERFS_TEST_FAST_KDF=test, as the daemon's tests);
# its objects dir's size is what tierfs wrote. Prints a markdown table (one row per
# measurement, then the tree's comparison table) and the results as one JSON line. See
# benches/README.md, "Watch mode (watch.sh)". A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   QUICK=1             a smoke run: N_FILES 2000, RPO_S 4, IDLE_S 5, RPO_ROUNDS 1 unless set
#   N_FILES [100000]    files of the tree;  N_DIRS [N_FILES/100]: its directories
#   FILE_MIN, FILE_MAX [1024, 6144]  size range of the tree's files, bytes (uniform)
#   SEED [20]           the tree's seed (content and sizes)
#   RPO_S [15]          seconds of steady writing before the kill
#   RPO_ROUNDS [3]      loads of each mode (each on a store of its own); round R kills after
#                       RPO_S + 0.7 x (R - 1) s, so that the kills land at different points of
#                       the watcher's pass cycle (one kill is one draw of the lost window)
#   IDLE_S [10]         tree phase: seconds the watcher is left alone after the sync (its CPU
#                       and passes then are overhead)
#   WRITE_MS [10]       the writer's period (one file, or one appended line, per period)
#   RPO_FILE_BYTES [1024]  size of each file of the create load (its first line is "seq N")
#   RPO_MODES ["create append"]  the RPO loads: create (a new file per period), append (a line
#                       of 64 bytes appended to one file per period, open/write/close each)
#   POLL_S [0.5]        `tierfs --json status` sampling interval during the RPO load
#   PHASES ["rpo tree"] the phases, in the order given
#   PEERS ["restic rclone"]  the tree phase's peers; a missing one is installed with apt-get
#                       (as root) or skipped, and the table says so either way
#   DROP_CACHES [1]     drop the page cache before each initial scan/backup/sync (needs root)
#   WATCH_TIMEOUT [3600]  `tierfs watch --timeout` (the first pass happens before ready)
#   TIERFS_BIN_DIR      directory with `tierfs` and `tierfs-daemon` [$CARGO_TARGET_DIR/release
#                       if it has tierfs, else /var/tmp/tierfs-target/debug]; nothing is built
#   CARGO_TARGET_DIR [/var/tmp/tierfs-target]
#   TIERFS_WATCH_OPTS   extra `tierfs watch` options (word-split), e.g. "--memory-budget 128M"
#   TIERFS_INIT_OPTS    extra `tierfs init` options (word-split), e.g. "--pack-size 4M"
#   RESTIC_PASSWORD [watch-bench]
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (stores, trees, repos, data
#                       dirs): put it on the disk you want to measure
#   KEEP_WORK=1         keep the work dir after the run
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/watch/<date>): table.md, results.json
#   (one line: measurements, knobs, env), measurements.jsonl, <phase>-*.json (tierfs's JSON
#   output of every watch, status, sync and unwatch; restic's summaries, rclone's stats, GNU
#   time's), rpo-<mode>-<round>-writes.jsonl (the writer's log), -samples.jsonl (status
#   samples), tierfs-daemon-<node>.log, restic.log, rclone.log, watch.log (this script's log),
#   env.txt (load average at start, at each phase's start and end, and at the end).
# Needs python3, GNU time (/usr/bin/time); root for drop_caches and apt-get. Every watcher,
# writer and peer started here is stopped and the work dir removed on exit (also on Ctrl-C or
# SIGTERM).
set -uo pipefail
export LC_ALL=C # $EPOCHREALTIME has a decimal point
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUTDIR=${1:-${OUTDIR:-${TMPDIR:-/tmp}/tierfs-bench/watch/$(date +%Y%m%d-%H%M%S)}}
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
  N_FILES=${N_FILES:-2000} RPO_S=${RPO_S:-4} IDLE_S=${IDLE_S:-5} RPO_ROUNDS=${RPO_ROUNDS:-1}
fi
N_FILES=${N_FILES:-100000}
N_DIRS=${N_DIRS:-$(((N_FILES + 99) / 100))}
FILE_MIN=${FILE_MIN:-1024}
FILE_MAX=${FILE_MAX:-6144}
SEED=${SEED:-20}
RPO_S=${RPO_S:-15}
IDLE_S=${IDLE_S:-10}
RPO_ROUNDS=${RPO_ROUNDS:-3}
WRITE_MS=${WRITE_MS:-10}
RPO_FILE_BYTES=${RPO_FILE_BYTES:-1024}
RPO_MODES=${RPO_MODES:-"create append"}
POLL_S=${POLL_S:-0.5}
PHASES=${PHASES:-"rpo tree"}
PEERS=${PEERS-"restic rclone"}
DROP_CACHES=${DROP_CACHES:-1}
WATCH_TIMEOUT=${WATCH_TIMEOUT:-3600}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
export RESTIC_PASSWORD=${RESTIC_PASSWORD:-watch-bench}
PASSPHRASE="watch-bench passphrase"

mkdir -p "$OUTDIR" || { echo "watch.sh: cannot create $OUTDIR" >&2; exit 1; }
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/watch.log
M=$OUTDIR/measurements.jsonl
: >"$LOG"
: >"$M"
log() { echo "[watch.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }

for v in N_FILES N_DIRS FILE_MIN FILE_MAX RPO_S RPO_ROUNDS IDLE_S WRITE_MS RPO_FILE_BYTES WATCH_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "$v=${!v} is not a positive number"
done
((FILE_MIN <= FILE_MAX)) || die "FILE_MIN=$FILE_MIN is above FILE_MAX=$FILE_MAX"
((N_DIRS <= N_FILES)) || die "N_DIRS=$N_DIRS is above N_FILES=$N_FILES"
((RPO_FILE_BYTES >= 16)) || die "RPO_FILE_BYTES=$RPO_FILE_BYTES: at least 16 (the sequence number line)"
[[ $POLL_S =~ ^[0-9]*\.?[0-9]+$ ]] || die "POLL_S=$POLL_S is not a number of seconds"
for p in $PHASES; do
  case $p in rpo | tree) ;; *) die "unknown phase $p (PHASES: rpo tree)" ;; esac
done
for p in $RPO_MODES; do
  case $p in create | append) ;; *) die "unknown RPO mode $p (RPO_MODES: create append)" ;; esac
done
for p in $PEERS; do
  case $p in restic | rclone) ;; *) die "unknown peer $p (PEERS: restic rclone)" ;; esac
done
for tool in python3 getconf; do
  command -v "$tool" >/dev/null || die "$tool missing"
done
[[ -x /usr/bin/time ]] || die "/usr/bin/time missing (apt-get install time): it measures the peers' CPU and peak RSS"
IS_ROOT=0; [[ $(id -u) == 0 ]] && IS_ROOT=1
((IS_ROOT)) || log "WARNING: not root: page cache drops fail (first scans are then warm) and peers cannot be installed"
CLK_TCK=$(getconf CLK_TCK)

# --- binaries: never built here ------------------------------------------------------------
if [[ -n ${TIERFS_BIN_DIR:-} ]]; then
  BIN_DIR=$TIERFS_BIN_DIR
elif [[ -x $CARGO_TARGET_DIR/release/tierfs ]]; then
  BIN_DIR=$CARGO_TARGET_DIR/release
else
  BIN_DIR=/var/tmp/tierfs-target/debug
fi
TIERFS=$BIN_DIR/tierfs
[[ -x $TIERFS && -x $BIN_DIR/tierfs-daemon ]] ||
  die "no tierfs and tierfs-daemon in $BIN_DIR (build them: CARGO_TARGET_DIR=/var/tmp/tierfs-target cargo build -p tierfs-daemon --bins; or set TIERFS_BIN_DIR)"
BIN_DIR=$(cd "$BIN_DIR" && pwd)
TIERFS=$BIN_DIR/tierfs
case $(basename "$BIN_DIR") in
  release) BUILD=release ;;
  debug) BUILD=debug ;;
  *) BUILD="unknown ($BIN_DIR)" ;;
esac
"$TIERFS" watch --help >/dev/null 2>&1 || die "$TIERFS has no watch command (built before 88af2b8?)"

# --- state for cleanup ---------------------------------------------------------------------
WORK='' TRUN='' CHILD=''
declare -A WPID=()  # watched dir -> daemon pid
declare -A WNODE=() # watched dir -> node name (for the daemon log's name)
declare -A WDATA=() # watched dir -> its data dir
declare -a BG=()    # background helpers (writer, poller) still running

# t ARGS...: the tierfs CLI with the bench's runtime dir and the test passphrase
t() { TIERFS_PASSPHRASE=$PASSPHRASE TIERFS_TEST_FAST_KDF=test "$TIERFS" --runtime-dir "$TRUN" "$@"; }

# in_bg OUT CMD...: runs CMD in the background (stdout to OUT, stderr to $LOG) and waits for
# it, so that a SIGTERM or SIGINT runs the cleanup at once; the cleanup stops it by its pid.
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

# run_timed VAR OUT CMD...: in_bg OUT CMD...; VAR = its wall time in seconds
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
# VALUE '' is recorded as null (the table shows ERR, or "skipped" when the note says so)
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
rec_err() { rec "$1" "$2" "$3" "" "" "ERROR: $4"; } # rec_err PHASE KEY LABEL MESSAGE

# jget JSON KEY.PATH: a field of a JSON document ('' if missing)
jget() {
  python3 -c 'import json,sys
d = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else d if isinstance(d, str) else json.dumps(d))' "$1" "$2" 2>/dev/null
}
# jdelta JSON_A JSON_B KEY.PATH: B's field minus A's
jdelta() {
  local a b
  a=$(jget "$1" "$3") b=$(jget "$2" "$3")
  [[ -n $a && -n $b ]] || { echo ''; return; }
  awk -v a="$a" -v b="$b" 'BEGIN { printf "%.0f", b - a }'
}

# nz VALUE: VALUE, or null when it is empty (for the JSON of rec's extra fields)
nz() { echo "${1:-null}"; }

drop_caches() {
  [[ $DROP_CACHES == 1 ]] || return 0
  sync
  if ((IS_ROOT)); then echo 3 >/proc/sys/vm/drop_caches || log "WARNING: drop_caches failed"; fi
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
note_load() { echo "loadavg at $1: $(loadavg)" >>"$OUTDIR/env.txt"; log "load average ($1): $(loadavg)"; }

# cpu_s PID: user + system CPU seconds of PID so far ('' if gone)
cpu_s() {
  local -a f
  read -r -a f <"/proc/$1/stat" 2>/dev/null || { echo ''; return; }
  awk -v u="${f[13]}" -v s="${f[14]}" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (u + s) / hz }'
}
sub() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }

# rss PHASE KEY LABEL PID [NOTE]: the VmRSS (value) and VmHWM of PID
rss() {
  local pid=$4 rss hwm
  if [[ -z $pid || ! -r /proc/$pid/status ]]; then
    rec_err "$1" "$2" "$3" "no process '$pid'"
    return 1
  fi
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status")
  hwm=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status")
  rec "$1" "$2" "$3" "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')" MiB \
    "VmHWM $(awk -v k="$hwm" 'BEGIN { printf "%.1f", k / 1024 }') MiB${5:+; $5}" \
    "{\"vmrss_kib\": $rss, \"vmhwm_kib\": $hwm, \"pid\": $pid}"
}

# dsize DIR: {"files": N, "bytes": B} of the regular files under DIR
dsize() { python3 "$H" dsize "$1"; }
# dsnap DIR FILE: lists DIR's regular files (size, mtime, inode) into FILE
dsnap() { python3 "$H" dsnap "$1" "$2"; }
# dwritten FILE_BEFORE FILE_AFTER: what was written between two dsnaps: {"written_files",
# "written_bytes" (files new or changed: the destination's upload), "removed_files",
# "removed_bytes", "net_bytes", "files", "bytes" (after)}
dwritten() { python3 "$H" dwritten "$1" "$2"; }

# ws_init PHASE: a store $WORK/PHASE/store.toml on file://$WORK/PHASE/objects
ws_init() {
  local w=$WORK/$1
  mkdir -p "$w/objects"
  # shellcheck disable=SC2086  # TIERFS_INIT_OPTS is a word list
  t init --store "$w/store.toml" --backend "file://$w/objects" ${TIERFS_INIT_OPTS:-} >>"$LOG" 2>&1
}

# twatch PHASE KEY LABEL NODE DIR DATA [OPTS...]: `tierfs --json watch` of DIR on PHASE's
# store with data dir DATA, timed (returns once the daemon is ready: after its first pass);
# sets WATCH_PID
WATCH_PID=''
twatch() {
  local ph=$1 key=$2 label=$3 node=$4 dir=$5 data=$6 secs out pid j=$OUTDIR/$1-$2.json
  shift 6
  WATCH_PID=''
  # shellcheck disable=SC2086  # TIERFS_WATCH_OPTS is a word list
  run_timed secs "$j" t --json watch --timeout "$WATCH_TIMEOUT" --store "$WORK/$ph/store.toml" --data-dir "$data" \
    ${TIERFS_WATCH_OPTS:-} "$@" "$dir" ||
    { rec_err "$ph" "$key" "$label" "tierfs watch failed after ${secs} s: $(head -c 300 "$j") $(tail -2 "$LOG" | tr '\n' ' ')"
      [[ -f $data/daemon.log ]] && cp "$data/daemon.log" "$OUTDIR/tierfs-daemon-$node.log"
      return 1; }
  out=$(cat "$j")
  pid=$(jget "$out" pid)
  [[ -n $pid ]] || { rec_err "$ph" "$key" "$label" "no pid in the watch's JSON: $out"; return 1; }
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == tierfs-daemon ]] ||
    log "WARNING: pid $pid of the watch of $dir is '$(cat "/proc/$pid/comm" 2>/dev/null)', not tierfs-daemon"
  WPID[$dir]=$pid WNODE[$dir]=$node WDATA[$dir]=$data WATCH_PID=$pid
  rec "$ph" "$key" "$label" "$secs" s "tierfs watch${*:+ $*}; daemon pid $pid, CPU $(cpu_s "$pid") s"
}

# tstatus DIR OUT: `tierfs --json status DIR` into OUT, and on stdout
tstatus() { t --json status "$1" 2>>"$LOG" | tee "$2"; }

# check_mode PHASE KEY STATUS_JSON: an ERR row when the watcher is not on inotify events (its
# numbers are then those of full passes every 10 s; e.g. the watch limit was reached, which a
# test lowering /proc/sys/fs/inotify/max_user_watches beside the bench causes)
check_mode() {
  local mode
  mode=$(jget "$3" watch.mode)
  [[ $mode == events ]] && return 0
  rec_err "$1" "$2" "watcher mode" "'$mode', not events: $(jget "$3" watch.fallback_reason) (max_user_watches now $(cat /proc/sys/fs/inotify/max_user_watches))"
}

# tunwatch PHASE KEY LABEL DIR: times `tierfs unwatch` (last pass, flush, daemon exit)
tunwatch() {
  local dir=$4 secs out j=$OUTDIR/$1-$2.json
  if run_timed secs "$j" t --json unwatch --timeout 600 "$dir"; then
    out=$(cat "$j")
    rec "$1" "$2" "$3" "$secs" s "tierfs unwatch: a last full pass, flush (flushed $(jget "$out" flush.flushed) in $(jget "$out" flush.flush_millis) ms), daemon exit"
  else
    rec_err "$1" "$2" "$3" "tierfs unwatch failed after $secs s: $(head -c 300 "$j")"
  fi
  [[ -n ${WPID[$dir]:-} ]] && stop_daemon "${WPID[$dir]}" # it exits after its answer
  stop_watch "$dir"
}

# stop_watch DIR: makes sure the watch of DIR is over and its daemon gone (by its pid)
stop_watch() {
  local dir=$1 pid=${WPID[$1]:-} node=${WNODE[$1]:-x} data=${WDATA[$1]:-}
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    t unwatch --timeout 120 "$dir" >>"$LOG" 2>&1 || log "tierfs unwatch $dir failed"
    stop_daemon "$pid"
  fi
  [[ -n $data && -f $data/daemon.log ]] && cp "$data/daemon.log" "$OUTDIR/tierfs-daemon-$node.log"
  unset "WPID[$dir]" "WNODE[$dir]" "WDATA[$dir]"
}

stop_pid() { # stop_pid PID: SIGTERM to PID's children (GNU time's command) and PID, SIGKILL after 5 s
  pkill -TERM -P "$1" 2>/dev/null
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
}

cleanup() {
  trap - EXIT INT TERM
  set +e
  local d p
  [[ -n $CHILD ]] && stop_pid "$CHILD"
  for p in "${BG[@]}"; do stop_pid "$p"; done
  for d in "${!WPID[@]}"; do stop_watch "$d"; done
  if [[ -n $WORK && -d $WORK ]]; then
    if [[ ${KEEP_WORK:-0} == 1 ]]; then
      echo "watch.sh: work dir kept: $WORK" >&2
    else
      rm -rf "$WORK"
    fi
  fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# shellcheck source=benches/lib.sh
source "$HERE/lib.sh" # stop_daemon

# --- peers: install if missing, else skip (said in the table) ------------------------------
INSTALLED='' SKIPPED=''
declare -A SKIP_WHY=()
if [[ " $PHASES " == *" tree "* ]]; then
  for p in $PEERS; do
    command -v "$p" >/dev/null && continue
    if ((IS_ROOT)); then
      log "$p missing: apt-get install -y $p"
      if { apt-get install -y "$p" || { apt-get update && apt-get install -y "$p"; }; } >>"$LOG" 2>&1; then
        INSTALLED+="$p "
        continue
      fi
      SKIP_WHY[$p]="apt-get install $p failed (see watch.log)"
    else
      SKIP_WHY[$p]="$p missing and not root (apt-get install $p)"
    fi
    log "WARNING: skipping peer $p: ${SKIP_WHY[$p]}"
    SKIPPED+="$p "
  done
fi
have_peer() { [[ " $PEERS " == *" $1 "* && -z ${SKIP_WHY[$1]:-} ]]; }

# --- work dir, helper, env -----------------------------------------------------------------
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/watch.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
WORK=$(cd "$WORK" && pwd -P)
TRUN=$WORK/run
mkdir -p "$TRUN" "$WORK/bin"
# private copies: the shared target dir may be rebuilt while the bench runs
BIN_BUILT=$(date -r "$TIERFS" +%FT%T)
cp "$BIN_DIR/tierfs" "$BIN_DIR/tierfs-daemon" "$WORK/bin/" || die "copying the binaries to $WORK/bin failed"
TIERFS=$WORK/bin/tierfs
export TIERFS_DAEMON=$WORK/bin/tierfs-daemon
# the peers' commands (arrays, not functions: GNU time runs them)
RESTIC_CMD=(env "RESTIC_CACHE_DIR=$WORK/tree/restic-cache" restic -r "$WORK/tree/restic")
RCLONE_CMD=(rclone --config "$WORK/rclone.conf")
H=$WORK/watchhelp.py
cat >"$H" <<'PY'
"""watch.sh's helpers: mktree, change, writer, poll, verify, samples, dsize, dsnap, dwritten,
restic, rclone, gtime."""
import json, os, random, signal, statistics, subprocess, sys, time

LINE = 64  # bytes of one appended line (append load)


def file_body(seq, size):
    head = f"seq {seq:07d}\n".encode()
    fill = (f"{seq:07d}." * (size // 8 + 1)).encode()
    return head + fill[: size - len(head)]


def line_body(seq):
    s = f"seq {seq:07d} ".encode()
    return s + b"." * (LINE - 1 - len(s)) + b"\n"


def mktree(root, n, dirs, lo, hi, seed):
    """N files of LO..HI seeded random bytes, in DIRS directories d0000.. (files f000000..)."""
    rng = random.Random(seed)
    per = -(-n // dirs)
    t0 = time.perf_counter()
    total = 0
    for d in range(-(-n // per)):
        os.mkdir(f"{root}/d{d:04d}")
    for i in range(n):
        size = rng.randint(lo, hi)
        with open(f"{root}/d{i // per:04d}/f{i:06d}", "wb") as f:
            f.write(rng.randbytes(size))
        total += size
    secs = time.perf_counter() - t0
    print(json.dumps({"files": n, "dirs": -(-n // per), "bytes": total, "seconds": round(secs, 3)}))


def change(root, n, dirs, which, seed):
    """Rewrites file WHICH of the tree in place (truncate + write) with new bytes of its size."""
    per = -(-n // dirs)
    path = f"{root}/d{which // per:04d}/f{which:06d}"
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(random.Random(f"{seed}/{which}/{time.time()}").randbytes(size))
    print(json.dumps({"path": os.path.relpath(path, root), "bytes": size}))


def writer(mode, root, log, period_ms, size):
    """A file (create) or a line (append) every PERIOD_MS, on an absolute schedule, until
    SIGTERM; logs each one's start and completion time (after close)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    period = period_ms / 1000
    os.makedirs(f"{root}/w", exist_ok=True)
    late = 0.0
    with open(log, "w") as out:
        t0 = time.time()
        seq = 0
        while not stop:
            target = t0 + seq * period
            now = time.time()
            if target > now:
                time.sleep(target - now)
            else:
                late = max(late, now - target)
            if stop:
                break
            ts = time.time()
            if mode == "create":
                fd = os.open(f"{root}/w/{seq:07d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.write(fd, file_body(seq, size))
            else:
                fd = os.open(f"{root}/w/log", os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
                os.write(fd, line_body(seq))
            os.close(fd)
            te = time.time()
            out.write(json.dumps({"seq": seq, "t0": ts, "t": te}) + "\n")
            out.flush()
            seq += 1
    print(json.dumps({"writes": seq, "max_late_s": round(late, 4)}))


def poll(out, period, cmd):
    """`CMD` (tierfs --json status DIR) every PERIOD s until SIGTERM, one sample a line."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    with open(out, "w") as f:
        while not stop:
            t = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True)
            try:
                s = json.loads(r.stdout)
            except ValueError:
                s = {"error": (r.stderr or r.stdout).strip()[:200]}
            w, rem = s.get("watch") or {}, s.get("remote") or {}
            f.write(json.dumps({"t": t, "status_s": round(time.time() - t, 4), "error": s.get("error"),
                                "passes": w.get("passes"), "full_passes": w.get("full_passes"),
                                "pending_dirs": w.get("pending_dirs"), "watch_oldest_pending_ms": w.get("oldest_pending_ms"),
                                "files_read": (w.get("totals") or {}).get("files_read"),
                                "torn_reads": (w.get("totals") or {}).get("torn_reads"),
                                "remote_oldest_pending_ms": rem.get("oldest_pending_ms"),
                                "remote_pending_batches": rem.get("pending_batches"),
                                "seq_lag": (rem["last_seq"] - rem["durable_seq"]) if "last_seq" in rem else None}) + "\n")
            f.flush()
            left = period - (time.time() - t)
            if left > 0 and not stop:
                time.sleep(left)


def samples(path, t_kill):
    """Max, p50, p95 of the status samples taken before T_KILL."""
    rows = [json.loads(l) for l in open(path)]
    rows = [r for r in rows if r["t"] < t_kill and not r.get("error")]
    res = {"samples": len(rows)}
    for k in ("watch_oldest_pending_ms", "remote_oldest_pending_ms", "remote_pending_batches", "seq_lag", "status_s"):
        v = sorted(r[k] for r in rows if r.get(k) is not None)
        if v:
            res[k] = {"max": v[-1], "p50": v[len(v) // 2], "p95": v[min(len(v) - 1, int(len(v) * 0.95))]}
    if len(rows) >= 2:
        p = [r["passes"] for r in rows if r.get("passes") is not None]
        span = rows[-1]["t"] - rows[0]["t"]
        if len(p) >= 2 and span > 0:
            res["passes_per_s"] = round((p[-1] - p[0]) / span, 2)
        res["torn_reads"] = rows[-1].get("torn_reads")
    print(json.dumps(res))


def verify(mode, root, log, t_kill, size):
    """Which of the writes completed before T_KILL came back intact in ROOT (the restored DIR)."""
    writes = [json.loads(l) for l in open(log)]
    before = [w for w in writes if w["t"] < t_kill]
    after = len(writes) - len(before)
    by_seq = {w["seq"]: w for w in writes}
    intact, empty, corrupt = set(), [], []
    unexpected = 0
    if mode == "create":
        d = f"{root}/w"
        names = os.listdir(d) if os.path.isdir(d) else []
        for name in names:
            try:
                seq = int(name)
            except ValueError:
                unexpected += 1
                continue
            data = open(f"{d}/{name}", "rb").read()
            if seq not in by_seq:
                unexpected += 1
            elif data == file_body(seq, size):
                intact.add(seq)
            elif data == b"":
                empty.append(seq)  # an earlier version: created, not yet written
            else:
                corrupt.append(seq)
    else:
        p = f"{root}/w/log"
        data = open(p, "rb").read() if os.path.exists(p) else b""
        n = len(data) // LINE
        for seq in range(n):
            if data[seq * LINE:(seq + 1) * LINE] == line_body(seq):
                intact.add(seq)
            else:
                corrupt.append(seq)
        if len(data) % LINE:
            corrupt.append(n)  # a torn last line
    res = {"mode": mode, "writes_logged": len(writes), "writes_before_kill": len(before), "writes_after_kill": after,
           "intact": len(intact), "intact_before_kill": sum(1 for w in before if w["seq"] in intact),
           "empty": len(empty), "corrupt": len(corrupt), "corrupt_seqs": sorted(corrupt)[:20], "unexpected": unexpected}
    res["lost"] = res["writes_before_kill"] - res["intact_before_kill"]
    if before:
        last = before[-1]
        res["last_written_seq"], res["last_written_t"] = last["seq"], last["t"]
        res["kill_after_last_write_s"] = round(t_kill - last["t"], 4)
    if intact:
        newest = by_seq[max(intact)]
        res["newest_intact_seq"], res["newest_intact_t"] = newest["seq"], newest["t"]
        if before:
            res["lost_window_s"] = round(before[-1]["t"] - newest["t"], 4)
        res["kill_minus_newest_s"] = round(t_kill - newest["t"], 4)
        missing = [w["seq"] for w in before if w["seq"] not in intact]
        res["first_lost_seq"] = missing[0] if missing else None
        # consistent prefix: everything up to the write before the oldest lost one came back
        if missing and missing[0] > 0:
            res["prefix_window_s"] = round(before[-1]["t"] - by_seq[missing[0] - 1]["t"], 4)
        elif not missing:
            res["prefix_window_s"] = 0.0
        res["intact_after_first_lost"] = sum(1 for s in intact if missing and s > missing[0])
    elif before:
        res["lost_window_s"] = res["prefix_window_s"] = round(before[-1]["t"] - before[0]["t0"], 4)
        res["first_lost_seq"], res["intact_after_first_lost"] = before[0]["seq"], 0
        res["note"] = "nothing came back: the window is the whole load"
    print(json.dumps(res))


def dsnap(root, out):
    snap = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            snap[os.path.relpath(p, root)] = [st.st_size, st.st_mtime_ns, st.st_ino]
    json.dump(snap, open(out, "w"))


def dwritten(a, b):
    a, b = json.load(open(a)), json.load(open(b))
    new = [k for k, v in b.items() if a.get(k) != v]
    gone = [k for k in a if k not in b]
    print(json.dumps({"written_files": len(new), "written_bytes": sum(b[k][0] for k in new),
                      "removed_files": len(gone), "removed_bytes": sum(a[k][0] for k in gone),
                      "net_bytes": sum(v[0] for v in b.values()) - sum(v[0] for v in a.values()),
                      "files": len(b), "bytes": sum(v[0] for v in b.values())}))


def dsize(root):
    files = total = 0
    for d, _, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            files += 1
            total += st.st_size
    print(json.dumps({"files": files, "bytes": total}))


def restic(path):
    """The summary line of `restic backup --json` output."""
    s = {}
    for l in open(path, errors="replace"):
        try:
            d = json.loads(l)
        except ValueError:
            continue
        if d.get("message_type") == "summary":
            s = d
    print(json.dumps(s))


def rclone(path):
    """The final stats of `rclone --use-json-log -v --stats 1h` (the last line with stats)."""
    s = {}
    for l in open(path, errors="replace"):
        try:
            d = json.loads(l)
        except ValueError:
            continue
        if "stats" in d:
            s = d["stats"]
    print(json.dumps(s))


def gtime(path):
    """GNU time's -f '%e %U %S %M' line as JSON."""
    e, u, s, m = open(path).read().split()[-4:]
    print(json.dumps({"wall_s": float(e), "cpu_s": round(float(u) + float(s), 2), "maxrss_kib": int(m)}))


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "mktree":
    mktree(args[0], *map(int, args[1:6]))
elif cmd == "change":
    change(args[0], *map(int, args[1:5]))
elif cmd == "writer":
    writer(args[0], args[1], args[2], float(args[3]), int(args[4]))
elif cmd == "poll":
    poll(args[0], float(args[1]), args[2:])
elif cmd == "samples":
    samples(args[0], float(args[1]))
elif cmd == "verify":
    verify(args[0], args[1], args[2], float(args[3]), int(args[4]))
elif cmd in ("dsize", "restic", "rclone", "gtime"):
    globals()[cmd](args[0])
elif cmd in ("dsnap", "dwritten"):
    globals()[cmd](args[0], args[1])
else:
    sys.exit(f"unknown helper command {cmd}")
PY

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(loadavg)"
  # shellcheck disable=SC2009  # pgrep refuses patterns longer than 15 characters
  echo "busy at start: $(ps -eo comm= | grep -cxE 'cargo|rustc|cc1plus|cc1|ld|fio|restic|rclone') compiler/cargo/fio/restic/rclone processes"
  echo "inotify: max_user_watches $(cat /proc/sys/fs/inotify/max_user_watches), max_user_instances $(cat /proc/sys/fs/inotify/max_user_instances), max_queued_events $(cat /proc/sys/fs/inotify/max_queued_events)"
  echo "work dir: $WORK ($(df -h --output=source,fstype,avail "$WORK" | tail -1 | tr -s ' '))"
  echo "QUICK=$QUICK N_FILES=$N_FILES N_DIRS=$N_DIRS FILE_MIN=$FILE_MIN FILE_MAX=$FILE_MAX SEED=$SEED RPO_S=$RPO_S RPO_ROUNDS=$RPO_ROUNDS IDLE_S=$IDLE_S WRITE_MS=$WRITE_MS RPO_FILE_BYTES=$RPO_FILE_BYTES RPO_MODES='$RPO_MODES' POLL_S=$POLL_S PHASES='$PHASES' PEERS='$PEERS' DROP_CACHES=$DROP_CACHES"
  echo "tierfs: $BUILD build: $("$TIERFS" --version) ($BIN_DIR, built $BIN_BUILT, copied to the work dir), checkout git $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo none) of $(cd "$REPO" && git log -1 --format=%cI 2>/dev/null)$(cd "$REPO" && [[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' (dirty tree)'), watch opts '${TIERFS_WATCH_OPTS:-}', init opts '${TIERFS_INIT_OPTS:-}'"
  [[ $BUILD == debug ]] && echo "tierfs: a DEBUG build (core crate opt-level 2, crypto crates 3; see Cargo.toml): not release numbers"
  have_peer restic && echo "restic: $(restic version 2>/dev/null) (local repository)"
  have_peer rclone && echo "rclone: $(rclone version 2>/dev/null | head -1) (sync to a local directory)"
  [[ -n $INSTALLED ]] && echo "installed by this run (apt-get): $INSTALLED"
  [[ -n $SKIPPED ]] && echo "peers skipped: $SKIPPED"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2
if [[ $(cut -d' ' -f1 /proc/loadavg | cut -d. -f1) -ge 1 ]] || grep -q ' [1-9]' <(grep '^busy' "$OUTDIR/env.txt"); then
  log "WARNING: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy"
fi

# --- 1. RPO under a steady writer ----------------------------------------------------------
# phase_rpo MODE ROUND: one load, kill and restore on a store of its own; the kill comes after
# RPO_S + 0.7 s x (ROUND - 1), so that rounds hit different points of the pass cycle
phase_rpo() {
  local mode=$1 ph=rpo-$1-$2 w=$WORK/rpo-$1-$2 pid t_kill out st secs writer poller wj=$OUTDIR/rpo-$1-$2-writes.jsonl
  local load_s
  load_s=$(awk -v s="$RPO_S" -v r="$2" 'BEGIN { printf "%.1f", s + 0.7 * (r - 1) }')
  local what="one $RPO_FILE_BYTES-byte file every $WRITE_MS ms"
  [[ $mode == append ]] && what="one 64-byte line appended to w/log every $WRITE_MS ms (open, write, close)"
  log "rpo ($mode, round $2): $what for $load_s s, then kill -9 of the watcher, restore on a fresh node"
  mkdir -p "$w"
  ws_init "$ph" || { rec_err "$ph" init "tierfs init" "tierfs init failed (see watch.log)"; return 1; }
  mkdir "$w/dir"
  twatch "$ph" watch_s "watch (fresh store, empty DIR)" "$ph-killed" "$w/dir" "$w/data" || return 1
  pid=$WATCH_PID
  python3 "$H" writer "$mode" "$w/dir" "$wj" "$WRITE_MS" "$RPO_FILE_BYTES" >"$OUTDIR/$ph-writer.json" 2>>"$LOG" &
  writer=$!
  BG+=("$writer")
  python3 "$H" poll "$OUTDIR/$ph-samples.jsonl" "$POLL_S" "$TIERFS" --runtime-dir "$TRUN" --json status "$w/dir" 2>>"$LOG" &
  poller=$!
  BG+=("$poller")
  in_bg /dev/null sleep "$load_s"
  kill -0 "$writer" 2>/dev/null || { rec_err "$ph" writer "writer" "the writer exited early: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  rss "$ph" rss_load "watcher RSS at the kill, after $load_s s of load" "$pid" "CPU $(cpu_s "$pid") s since its start"
  st=$(tstatus "$w/dir" "$OUTDIR/$ph-status-before-kill.json")
  t_kill=$EPOCHREALTIME
  kill -9 "$pid"
  log "rpo ($mode): watcher $pid killed (-9) at $t_kill; last status: passes $(jget "$st" watch.passes), files_read $(jget "$st" watch.totals.files_read), remote.pending_batches $(jget "$st" remote.pending_batches)"
  in_bg /dev/null sleep 0.3
  stop_pid "$writer"
  stop_pid "$poller"
  wait "$writer" "$poller" 2>/dev/null
  BG=()
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && log "WARNING: watcher $pid alive 10 s after SIGKILL"
  cp "$w/data/daemon.log" "$OUTDIR/tierfs-daemon-$ph-killed.log" 2>/dev/null
  unset "WPID[$w/dir]" "WNODE[$w/dir]" "WDATA[$w/dir]"
  check_mode "$ph" mode_load "$st"
  out=$(cat "$OUTDIR/$ph-writer.json")
  rec "$ph" writes "writes during the load" "$(wc -l <"$wj")" "" \
    "$what; at most $(jget "$out" max_late_s) s behind schedule"
  out=$(python3 "$H" samples "$OUTDIR/$ph-samples.jsonl" "$t_kill" 2>>"$LOG")
  printf '%s\n' "$out" >"$OUTDIR/$ph-samples-summary.json"
  rec "$ph" watch_pending_ms "watcher: oldest event not yet passed, max" "$(jget "$out" watch_oldest_pending_ms.max)" ms \
    "status watch.oldest_pending_ms (set when a pass ends) every $POLL_S s ($(jget "$out" samples) samples): p50 $(jget "$out" watch_oldest_pending_ms.p50), p95 $(jget "$out" watch_oldest_pending_ms.p95); $(jget "$out" passes_per_s) passes/s; torn reads $(jget "$out" torn_reads)"
  rec "$ph" remote_pending_ms "store lag of the metadata, max" "$(jget "$out" remote_oldest_pending_ms.max)" ms \
    "status remote.oldest_pending_ms: p50 $(jget "$out" remote_oldest_pending_ms.p50), p95 $(jget "$out" remote_oldest_pending_ms.p95); pending batches max $(jget "$out" remote_pending_batches.max)"

  log "rpo ($mode): fresh node: empty DIR, empty data dir, same store, --takeover"
  mkdir "$w/dir2"
  twatch "$ph" restore_s "fresh node: watch --takeover of an empty DIR (restore + first pass)" "$ph-fresh" "$w/dir2" "$w/data2" --takeover ||
    { rec_err "$ph" verify "restored files" "no fresh node"; return 1; }
  st=$(tstatus "$w/dir2" "$OUTDIR/$ph-status-fresh.json")
  check_mode "$ph" mode_fresh "$st"
  rec "$ph" fresh_files_read "fresh node's first pass: files read again" "$(jget "$st" watch.totals.files_read)" "" \
    "start: $(jget "$st" watch.start); a restore leaves times equal, so nothing should be read again"
  out=$(python3 "$H" verify "$mode" "$w/dir2" "$wj" "$t_kill" "$RPO_FILE_BYTES" 2>>"$LOG") ||
    { rec_err "$ph" verify "restored files" "verify failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  printf '%s\n' "$out" >"$OUTDIR/$ph-verify.json"
  rec "$ph" lost "writes lost (finished before the kill, not back intact)" "$(jget "$out" lost)" "" \
    "$(jget "$out" writes_before_kill) finished before the kill, $(jget "$out" intact_before_kill) back intact, $(jget "$out" empty) back empty (created, not yet written: an earlier version), $(jget "$out" corrupt) with wrong bytes, $(jget "$out" intact_after_first_lost) intact after the oldest lost one; $(jget "$out" writes_after_kill) finished after the kill (not counted)"
  rec "$ph" lost_window_s "lost window: last write before the kill - newest write back" "$(jget "$out" lost_window_s)" s \
    "seq $(jget "$out" last_written_seq) - seq $(jget "$out" newest_intact_seq); the kill came $(jget "$out" kill_after_last_write_s) s after the last write; kill - newest back: $(jget "$out" kill_minus_newest_s) s"
  rec "$ph" prefix_window_s "consistent-prefix window" "$(jget "$out" prefix_window_s)" s \
    "last write before the kill - the write before the oldest lost one (seq $(jget "$out" first_lost_seq))"
  if [[ $(jget "$out" corrupt) != 0 || $(jget "$out" unexpected) != 0 ]]; then
    rec_err "$ph" verify_bad "restored files with wrong bytes" "$(jget "$out" corrupt) corrupt (seqs $(jget "$out" corrupt_seqs)), $(jget "$out" unexpected) unexpected names"
  fi
  rss "$ph" rss_fresh "fresh node's watcher RSS after the restore" "${WPID[$w/dir2]:-}"
  tunwatch "$ph" unwatch_s "fresh node: tierfs unwatch" "$w/dir2"
}

# --- 2. the tree: tierfs watch against restic and rclone -----------------------------------
# peer_run PHASE KEY LABEL PEER OUT CMD...: runs a peer command under GNU time (timed, CPU,
# peak RSS); sets PEER_SECS and PEER_TIME (the JSON of GNU time's numbers)
PEER_SECS='' PEER_TIME=''
peer_run() {
  local ph=$1 key=$2 label=$3 peer=$4 out=$5 tf=$WORK/$2.time
  shift 5
  PEER_SECS='' PEER_TIME=''
  [[ -n ${1:-} ]] || { rec_err "$ph" "$key" "$label" "no $peer command (a bug of watch.sh)"; return 1; }
  if ! run_timed PEER_SECS "$out" /usr/bin/time -o "$tf" -f '%e %U %S %M' "$@"; then
    rec_err "$ph" "$key" "$label" "$peer failed after $PEER_SECS s (see $peer.log, watch.log)"
    return 1
  fi
  PEER_TIME=$(python3 "$H" gtime "$tf" 2>>"$LOG")
  printf '%s\n' "$PEER_TIME" >"$OUTDIR/$ph-$key.time.json"
}


# restic_backup KEY LABEL: `restic backup --json` of the tree, recorded
restic_backup() {
  local ph=tree key=$1 label=$2 j=$OUTDIR/tree-$1.json s d
  dsnap "$WORK/tree/restic" "$WORK/snap-restic-0"
  peer_run $ph "$key" "$label" restic "$j" "${RESTIC_CMD[@]}" backup --json --host watch-bench "$WORK/tree/dir" || return 1
  s=$(python3 "$H" restic "$j")
  dsnap "$WORK/tree/restic" "$WORK/snap-restic-1"
  d=$(dwritten "$WORK/snap-restic-0" "$WORK/snap-restic-1")
  rec $ph "$key" "$label" "$PEER_SECS" s \
    "restic's own count: $(jget "$s" files_new) new, $(jget "$s" files_changed) changed files; data_added $(jget "$s" data_added) B; $(jget "$s" total_bytes_processed) B processed; CPU $(jget "$PEER_TIME" cpu_s) s, peak RSS $(jget "$PEER_TIME" maxrss_kib) KiB" \
    "{\"cpu_s\": $(nz "$(jget "$PEER_TIME" cpu_s)"), \"maxrss_kib\": $(nz "$(jget "$PEER_TIME" maxrss_kib)"), \"own_bytes\": $(nz "$(jget "$s" data_added)"), \"dest\": $d}"
  rec $ph "${key}_written" "$label: written to the repository" "$(jget "$d" written_bytes)" B \
    "$(jget "$d" written_files) files new or changed, $(jget "$d" removed_files) removed ($(jget "$d" removed_bytes) B); repository now $(jget "$d" files) files, $(jget "$d" bytes) B"
}

# rclone_sync KEY LABEL: `rclone sync` of the tree to a local directory, recorded
rclone_sync() {
  local ph=tree key=$1 label=$2 j=$OUTDIR/tree-$1.jsonl s d
  dsnap "$WORK/tree/rclone-dst" "$WORK/snap-rclone-0"
  peer_run $ph "$key" "$label" rclone /dev/null "${RCLONE_CMD[@]}" sync "$WORK/tree/dir" "$WORK/tree/rclone-dst" \
    --use-json-log -v --stats 1h --log-file "$j" || return 1
  s=$(python3 "$H" rclone "$j")
  dsnap "$WORK/tree/rclone-dst" "$WORK/snap-rclone-1"
  d=$(dwritten "$WORK/snap-rclone-0" "$WORK/snap-rclone-1")
  rec $ph "$key" "$label" "$PEER_SECS" s \
    "rclone's own count: $(jget "$s" transfers) transfers, $(jget "$s" bytes) B, $(jget "$s" checks) checks; destination: $(jget "$d" written_files) files written, $(jget "$d" written_bytes) B; CPU $(jget "$PEER_TIME" cpu_s) s, peak RSS $(jget "$PEER_TIME" maxrss_kib) KiB" \
    "{\"cpu_s\": $(nz "$(jget "$PEER_TIME" cpu_s)"), \"maxrss_kib\": $(nz "$(jget "$PEER_TIME" maxrss_kib)"), \"own_bytes\": $(nz "$(jget "$s" bytes)"), \"dest\": $d}"
  cat "$j" >>"$OUTDIR/rclone.log"
}

# tresume KEY LABEL NODE: `tierfs watch` of the tree again on its data dir (a resume: the
# first pass only stats), recorded with what that pass read and the watcher's RSS; sets pid
tresume() {
  local ph=tree w=$WORK/tree st
  twatch $ph "$1" "$2" "$3" "$w/dir" "$w/data" || return 1
  pid=$WATCH_PID
  st=$(tstatus "$w/dir" "$OUTDIR/tree-status-$1.json")
  rec $ph "${1%_s}_files_read" "$2: files read by its first pass" "$(jget "$st" watch.totals.files_read)" "" \
    "start: $(jget "$st" watch.start); $(jget "$st" watch.totals.bytes_uploaded) B uploaded (nothing changed while it was stopped)"
  rss $ph "rss_${1%_s}" "watcher RSS after $2" "$pid" "CPU $(cpu_s "$pid") s"
}

phase_tree() {
  local ph=tree w=$WORK/tree pid='' out st0 st1 o1 c0 c1 secs sj which n
  log "tree: $N_FILES files of $FILE_MIN-$FILE_MAX bytes in $N_DIRS dirs; tierfs watch${PEERS:+, against $PEERS}"
  mkdir -p "$w/dir" "$w/restic-cache" "$w/rclone-dst"
  : >"$WORK/rclone.conf"
  ws_init $ph || { rec_err $ph init "tierfs init" "tierfs init failed (see watch.log)"; return 1; }
  dsnap "$w/objects" "$WORK/snap-objects-0"
  in_bg "$OUTDIR/tree-mktree.json" python3 "$H" mktree "$w/dir" "$N_FILES" "$N_DIRS" "$FILE_MIN" "$FILE_MAX" "$SEED" ||
    { rec_err $ph mktree "create the tree" "mktree failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  out=$(cat "$OUTDIR/tree-mktree.json")
  rec $ph tree_bytes "the tree" "$(jget "$out" bytes)" B "$(jget "$out" files) files in $(jget "$out" dirs) dirs, seed $SEED; created in $(jget "$out" seconds) s (python3, page cache then dropped)"

  # initial: tierfs watch (start to ready includes the first pass), then tierfs sync
  drop_caches
  twatch $ph watch_s "tierfs watch: start to ready (first pass: scan + upload)" tree "$w/dir" "$w/data" || return 1
  pid=$WATCH_PID
  c0=$(cpu_s "$pid")
  st0=$(tstatus "$w/dir" "$OUTDIR/tree-status-ready.json")
  rec $ph first_pass_uploaded "first pass: bytes uploaded (tierfs's count)" "$(jget "$st0" watch.totals.bytes_uploaded)" B \
    "watch.totals: $(jget "$st0" watch.totals.files_read) files read, $(jget "$st0" watch.totals.bytes_read) B read, $(jget "$st0" watch.totals.chunks_uploaded) chunks; cold.uploaded_bytes $(jget "$st0" cold.uploaded_bytes), cold.evicted_bytes $(jget "$st0" cold.evicted_bytes); start $(jget "$st0" watch.start)"
  rss $ph rss_ready "watcher RSS after the first pass (ready)" "$pid" "CPU $c0 s"
  sj=$OUTDIR/tree-sync1.json
  if run_timed secs "$sj" t --json sync -m "watch bench: initial" "$w/dir"; then
    out=$(cat "$sj")
    rec $ph sync1_s "tierfs sync after the first pass" "$secs" s \
      "a full pass + snapshot of $(jget "$out" entries) entries: $(jget "$out" parts_uploaded)/$(jget "$out" parts) parts, metadata_bytes $(jget "$out" metadata_bytes), $(jget "$out" millis) ms by the daemon's count"
  else
    rec_err $ph sync1_s "tierfs sync after the first pass" "failed after $secs s: $(head -c 300 "$sj")"
  fi
  c1=$(cpu_s "$pid")
  dsnap "$w/objects" "$WORK/snap-objects-1"
  o1=$(dwritten "$WORK/snap-objects-0" "$WORK/snap-objects-1")
  st1=$(tstatus "$w/dir" "$OUTDIR/tree-status-sync1.json")
  rec $ph initial_store "tierfs initial: store (objects dir) size" "$(jget "$o1" bytes)" B \
    "$(jget "$o1" files) objects; watcher CPU $c1 s (first pass $c0 s, sync $(sub "$c1" "$c0") s); $(jget "$st1" watch.passes) passes, $(jget "$st1" watch.full_passes) full" \
    "{\"cpu_s\": $(nz "$c1"), \"own_bytes\": $(nz "$(jget "$st1" watch.totals.bytes_uploaded)"), \"dest\": $o1}"
  rss $ph rss_sync1 "watcher RSS after the sync" "$pid"

  # the watcher with nothing happening in DIR
  st0=$st1
  c0=$(cpu_s "$pid")
  in_bg /dev/null sleep "$IDLE_S"
  c1=$(cpu_s "$pid")
  st1=$(tstatus "$w/dir" "$OUTDIR/tree-status-idle.json")
  check_mode $ph mode_initial "$st1"
  rec $ph idle_cpu_s "watcher CPU with DIR untouched for $IDLE_S s" "$(sub "$c1" "$c0")" s \
    "passes $(jget "$st0" watch.passes) -> $(jget "$st1" watch.passes) (full $(jget "$st0" watch.full_passes) -> $(jget "$st1" watch.full_passes)), files read $(jget "$st0" watch.totals.files_read) -> $(jget "$st1" watch.totals.files_read); nothing changed, so any pass here is overhead"
  # the peers run with the watcher stopped, so that neither takes CPU from the other
  tunwatch $ph unwatch1_s "tierfs unwatch (before the peers run)" "$w/dir"

  # initial: the peers, each from a dropped page cache
  if have_peer restic; then
    if "${RESTIC_CMD[@]}" init >>"$OUTDIR/restic.log" 2>&1; then
      drop_caches
      restic_backup restic1_s "restic backup (first run)"
    else
      rec_err $ph restic1_s "restic backup (first run)" "restic init failed (see restic.log)"
    fi
  else
    rec $ph restic1_s "restic backup (first run)" "" "" "skipped: ${SKIP_WHY[restic]:-not in PEERS}"
  fi
  if have_peer rclone; then
    drop_caches
    rclone_sync rclone1_s "rclone sync (first run, to a local dir)"
  else
    rec $ph rclone1_s "rclone sync (first run)" "" "" "skipped: ${SKIP_WHY[rclone]:-not in PEERS}"
  fi

  # one changed file: tierfs sync (the watcher started again first), restic backup, rclone sync
  tresume resume1_s "tierfs watch again (resume, same data dir)" tree || return 1
  # counts from before the change: an event pass may take the change before the sync starts
  st0=$(tstatus "$w/dir" "$OUTDIR/tree-status-before-change.json")
  dsnap "$w/objects" "$WORK/snap-objects-2"
  c0=$(cpu_s "$pid")
  which=$((N_FILES / 2))
  out=$(python3 "$H" change "$w/dir" "$N_FILES" "$N_DIRS" "$which" "$SEED" 2>>"$LOG") ||
    { rec_err $ph change "change one file" "failed"; return 1; }
  log "tree: rewrote $(jget "$out" path) ($(jget "$out" bytes) bytes) in place"
  n=$(jget "$out" bytes)
  sj=$OUTDIR/tree-sync2.json
  if run_timed secs "$sj" t --json sync -m "watch bench: one change" "$w/dir"; then
    out=$(cat "$sj")
    c1=$(cpu_s "$pid")
    dsnap "$w/objects" "$WORK/snap-objects-3"
    o1=$(dwritten "$WORK/snap-objects-2" "$WORK/snap-objects-3")
    st1=$(tstatus "$w/dir" "$OUTDIR/tree-status-sync2.json")
    check_mode $ph mode_sync2 "$st1"
    rec $ph sync2_s "one changed file ($n B): tierfs sync" "$secs" s \
      "started right after the change (an event pass may take the change first): full pass + snapshot ($(jget "$out" parts_uploaded)/$(jget "$out" parts) parts, metadata_bytes $(jget "$out" metadata_bytes)); watch.totals since the change: files read $(jdelta "$st0" "$st1" watch.totals.files_read), bytes uploaded $(jdelta "$st0" "$st1" watch.totals.bytes_uploaded), passes $(jdelta "$st0" "$st1" watch.passes); watcher CPU $(sub "$c1" "$c0") s" \
      "{\"cpu_s\": $(nz "$(sub "$c1" "$c0")"), \"own_bytes\": $(nz "$(jdelta "$st0" "$st1" watch.totals.bytes_uploaded)"), \"dest\": $o1, \"metadata_bytes\": $(nz "$(jget "$out" metadata_bytes)")}"
    rec $ph sync2_written "one changed file: written to the tierfs store" "$(jget "$o1" written_bytes)" B \
      "$(jget "$o1" written_files) objects new or changed (pack, metadata parts, snapshot), $(jget "$o1" removed_files) removed ($(jget "$o1" removed_bytes) B: compaction); tierfs's count of data uploaded: $(jdelta "$st0" "$st1" watch.totals.bytes_uploaded) B in $(jdelta "$st0" "$st1" watch.totals.chunks_uploaded) chunks; cold.uploaded_bytes $(jget "$st1" cold.uploaded_bytes)"
  else
    rec_err $ph sync2_s "one changed file: tierfs sync" "failed after $secs s: $(head -c 300 "$sj")"
  fi
  rss $ph rss_sync2 "watcher RSS after the change and its sync" "$pid"
  tunwatch $ph unwatch2_s "tierfs unwatch (before the peers run)" "$w/dir"
  if have_peer restic && [[ -d $w/restic/snapshots ]]; then
    restic_backup restic2_s "one changed file: restic backup"
  else
    rec $ph restic2_s "one changed file: restic backup" "" "" "skipped: ${SKIP_WHY[restic]:-no first backup}"
  fi
  if have_peer rclone; then
    rclone_sync rclone2_s "one changed file: rclone sync"
  else
    rec $ph rclone2_s "one changed file: rclone sync" "" "" "skipped: ${SKIP_WHY[rclone]:-not in PEERS}"
  fi

  # a second changed file, left to the events: how long until a pass has read it
  tresume resume2_s "tierfs watch again (second resume)" tree || return 1
  st0=$(tstatus "$w/dir" "$OUTDIR/tree-status-before-event.json")
  python3 "$H" change "$w/dir" "$N_FILES" "$N_DIRS" "$((which + 1))" "$SEED" >>"$LOG" 2>&1
  local t0=$EPOCHREALTIME base got='' cur
  base=$(jget "$st0" watch.totals.files_read)
  for _ in $(seq 600); do
    st1=$(t --json status "$w/dir" 2>>"$LOG")
    cur=$(jget "$st1" watch.totals.files_read)
    if ((${cur:-0} > ${base:-0})); then got=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'); break; fi
    sleep 0.05
  done
  if [[ -n $got ]]; then
    rec $ph event_s "a second changed file, by inotify alone: read after" "$got" s \
      "status polled every 50 ms until watch.totals.files_read grew (quiet time 200 ms, then a pass of its directory); passes $(jget "$st0" watch.passes) -> $(jget "$st1" watch.passes)"
  else
    rec_err $ph event_s "a second changed file, by inotify alone" "not read within 30 s+ (status: $(jget "$st1" watch))"
  fi
  check_mode $ph mode_end "$st1"
  rss $ph rss_end "watcher RSS at the end" "$pid" "CPU $(cpu_s "$pid") s since its start"
  tunwatch $ph unwatch_s "tierfs unwatch" "$w/dir"
  out=$(dsize "$w/data")
  rec $ph data_dir_bytes "data dir on disk" "$(du -sB1 "$w/data" 2>>"$LOG" | cut -f1)" B "du -sB1; $(jget "$out" files) files, $(jget "$out" bytes) B apparent (metadata only: DIR holds the bytes)"
}

for p in $PHASES; do
  note_load "$p start"
  if [[ $p == rpo ]]; then
    for r in $(seq "$RPO_ROUNDS"); do
      for mode in $RPO_MODES; do phase_rpo "$mode" "$r" || log "phase rpo ($mode, round $r) stopped early (see the ERR rows)"; done
    done
  else
    "phase_$p" || log "phase $p stopped early (see the ERR rows)"
  fi
  for d in "${!WPID[@]}"; do stop_watch "$d"; done
  note_load "$p end"
done
echo "loadavg at end: $(loadavg)" >>"$OUTDIR/env.txt"

# --- table ---------------------------------------------------------------------------------
python3 - "$OUTDIR" "$QUICK" "$N_FILES" "$N_DIRS" "$FILE_MIN" "$FILE_MAX" "$RPO_S" "$WRITE_MS" "$RPO_MODES" "$PHASES" "$PEERS" "$INSTALLED" "$SKIPPED" "$BUILD" <<'PY' | tee "$OUTDIR/table.md"
import json, os, sys
(out, quick, n_files, n_dirs, fmin, fmax, rpo_s, write_ms, rpo_modes, phases, peers, installed, skipped,
 build) = sys.argv[1:15]
rows = [json.loads(l) for l in open(os.path.join(out, "measurements.jsonl"))]
by = {f"{d['phase']}.{d['key']}": d for d in rows}
def human(b):
    for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= s:
            return f"{b / s:.2f} {u}"
    return f"{b:.0f} B"
def fmt(d):
    v, u = d["value"], d["unit"]
    if v is None:
        return "skipped" if d["note"].startswith("skipped") else "ERR"
    if u == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    if u == "MiB":
        return f"{v:.1f} MiB"
    if u == "ms":
        return f"{v:.0f} ms"
    if u == "B":
        return human(v) + (f" ({v:.0f})" if abs(v) >= 1024 else "")
    return f"{v:g} {u}".strip()
env = open(os.path.join(out, "env.txt")).read().splitlines()
print(f"## tierfs watch mode (issue 20){' - QUICK' if quick == '1' else ''}, {build} build\n")
if "rpo" in phases.split():
    print(f"- rpo: writer ({rpo_modes}) every {write_ms} ms for {rpo_s} s (+0.7 s per round), kill -9 of the watcher, restore on a fresh node (--takeover)")
if "tree" in phases.split():
    print(f"- tree: {int(n_files):,} files of {fmin}-{fmax} bytes in {int(n_dirs):,} dirs; peers: {peers or 'none'} (restic: local repository; rclone: a local directory)")
print("\n| phase | measurement | value | notes |\n|---|---|---:|---|")
for d in rows:
    print(f"| {d['phase']} | {d['label']} | {fmt(d)} | {d['note']} |")

rpo = {}
for d in rows:
    if d["phase"].startswith("rpo-") and d["key"] in ("lost_window_s", "lost", "prefix_window_s", "writes"):
        mode, rnd = d["phase"][4:].rsplit("-", 1)
        rpo.setdefault(mode, {}).setdefault(rnd, {})[d["key"]] = d["value"]
if rpo:
    print(f"\n### RPO under a steady writer (kill -9 of the watcher, restore on a fresh node)\n")
    print("| load | rounds | lost window per round | median | max | writes lost per round (of those finished before the kill) |\n|---|---:|---|---:|---:|---|")
    for mode, rounds in rpo.items():
        ws = [r.get("lost_window_s") for _, r in sorted(rounds.items())]
        ok = sorted(w for w in ws if w is not None)
        lost = [r.get("lost") for _, r in sorted(rounds.items())]
        what = f"a line appended every {write_ms} ms" if mode == "append" else f"a new file every {write_ms} ms"
        print(f"| {what} | {len(rounds)} | {', '.join('ERR' if w is None else f'{w:.2f} s' for w in ws)} | "
              f"{f'{ok[(len(ok) - 1) // 2]:.2f} s' if ok else 'ERR'} | {f'{ok[-1]:.2f} s' if ok else 'ERR'} | "
              f"{', '.join('ERR' if x is None else f'{x:.0f}' for x in lost)} |")


def cell(key, field="value", unit=None):
    d = by.get(key)
    if d is None:
        return "-"
    if d["value"] is None:
        return "skipped" if d["note"].startswith("skipped") else "ERR"
    v = d["value"]
    if field != "value":
        v = d
        for k in field.split("."):
            v = v.get(k) if isinstance(v, dict) else None
    if v is None:
        return "-"
    if unit == "s":
        return f"{v:.2f} s" if v < 100 else f"{v:.0f} s"
    if unit == "B":
        return human(v)
    if unit == "KiB":
        return f"{v / 1024:.0f} MiB"
    return f"{v}"
if "tree" in phases.split():
    w = by.get("tree.watch_s", {}).get("value")
    s = by.get("tree.sync1_s", {}).get("value")
    tot = f"{w + s:.1f} s ({w:.1f} + {s:.1f})" if w is not None and s is not None else "ERR"
    hwm = max([by[k].get("vmhwm_kib") or 0 for k in ("tree.rss_ready", "tree.rss_sync1", "tree.rss_resume1", "tree.rss_sync2", "tree.rss_resume2", "tree.rss_end") if k in by] or [0])
    print(f"\n### {int(n_files):,}-file tree: tierfs watch against restic and rclone\n")
    print("| | tierfs watch | restic backup | rclone sync |\n|---|---:|---:|---:|")
    print(f"| initial: wall time | {tot} | {cell('tree.restic1_s', unit='s')} | {cell('tree.rclone1_s', unit='s')} |")
    print(f"| initial: CPU time | {cell('tree.initial_store', 'cpu_s', 's')} | {cell('tree.restic1_s', 'cpu_s', 's')} | {cell('tree.rclone1_s', 'cpu_s', 's')} |")
    print(f"| initial: data uploaded (own count) | {cell('tree.initial_store', 'own_bytes', 'B')} | {cell('tree.restic1_s', 'own_bytes', 'B')} | {cell('tree.rclone1_s', 'own_bytes', 'B')} |")
    print(f"| initial: destination size | {cell('tree.initial_store', 'dest.bytes', 'B')} ({cell('tree.initial_store', 'dest.files')} objects) | {cell('tree.restic1_s', 'dest.bytes', 'B')} ({cell('tree.restic1_s', 'dest.files')} files) | {cell('tree.rclone1_s', 'dest.bytes', 'B')} ({cell('tree.rclone1_s', 'dest.files')} files) |")
    print(f"| one changed file: wall time | {cell('tree.sync2_s', unit='s')} | {cell('tree.restic2_s', unit='s')} | {cell('tree.rclone2_s', unit='s')} |")
    print(f"| one changed file: CPU time | {cell('tree.sync2_s', 'cpu_s', 's')} | {cell('tree.restic2_s', 'cpu_s', 's')} | {cell('tree.rclone2_s', 'cpu_s', 's')} |")
    print(f"| one changed file: data uploaded (own count) | {cell('tree.sync2_s', 'own_bytes', 'B')} | {cell('tree.restic2_s', 'own_bytes', 'B')} | {cell('tree.rclone2_s', 'own_bytes', 'B')} |")
    print(f"| one changed file: written to the destination | {cell('tree.sync2_s', 'dest.written_bytes', 'B')} ({cell('tree.sync2_s', 'dest.written_files')} objects) | {cell('tree.restic2_s', 'dest.written_bytes', 'B')} ({cell('tree.restic2_s', 'dest.written_files')} files) | {cell('tree.rclone2_s', 'dest.written_bytes', 'B')} ({cell('tree.rclone2_s', 'dest.written_files')} file) |")
    print(f"| watcher idle {cell('tree.idle_cpu_s', 'label').split(' for ')[-1] if 'tree.idle_cpu_s' in by else ''}: CPU time | {cell('tree.idle_cpu_s', unit='s')} | | |")
    print(f"| peak RSS | {f'{hwm / 1024:.0f} MiB (VmHWM of the watcher)' if hwm else '-'} | {cell('tree.restic1_s', 'maxrss_kib', 'KiB')} (first run) | {cell('tree.rclone1_s', 'maxrss_kib', 'KiB')} (first run) |")
    print("\nCPU: the watcher's (tierfs-daemon, /proc/PID/stat) for the first pass plus the sync, and for the"
          " sync after the change; the peers' user + system time (GNU time), one process each. tierfs's"
          " destination: its file:// store's objects (packs, metadata parts, snapshot); written: the"
          " destination's files that are new or changed after the run (tierfs's compaction also removes"
          " objects: see the rows above). The tierfs CLI processes (a few ms each) are not counted.")
notes = []
for f in sorted(os.listdir(out)):
    if f.startswith("tierfs-daemon-") and f.endswith(".log"):
        bad = [l.rstrip() for l in open(os.path.join(out, f), errors="replace") if " WARN " in l or " ERROR " in l]
        notes.append(f"{f}: {len(bad)} WARN/ERROR lines" + (f", first: `{bad[0][:200]}`" if bad else ""))
if installed:
    notes.append(f"installed by this run with apt-get: {installed}.")
if skipped:
    notes.append(f"peers skipped (missing): {skipped}.")
notes += [l for l in env if l.startswith(("loadavg", "busy", "inotify", "tierfs:", "restic:", "rclone:"))]
print()
for n in notes:
    print(f"- {n}")
params = {"quick": quick == "1", "n_files": int(n_files), "n_dirs": int(n_dirs), "file_min": int(fmin),
          "file_max": int(fmax), "rpo_s": float(rpo_s), "write_ms": float(write_ms), "rpo_modes": rpo_modes.split(),
          "phases": phases.split(), "peers": peers.split(), "build": build}
results = {"bench": "watch", "params": params, "env": env, "by_key": {k: d["value"] for k, d in by.items()},
           "measurements": rows}
line = json.dumps(results, separators=(",", ":"))
open(os.path.join(out, "results.json"), "w").write(line + "\n")
print()
print(line)
PY
log "results: $OUTDIR"
