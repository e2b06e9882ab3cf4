#!/usr/bin/env bash
# benches/cold.sh [OUTDIR]
#
# The cold tier against one local S3 server (moto), in one run: raw parallel PUT/GET with boto3
# (benches/s3_raw.py, the ceiling), tierfs's write-to-store rate and cold sequential read, and
# the same cold read through rclone mount (--vfs-cache-mode full) and s3fs; prints a markdown
# table with the ratios the performance issue sets targets for. See benches/README.md,
# "Cold tier (cold.sh)". A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   SIZE_MIB [1024]     bytes per measurement: raw PUT/GET total, tierfs files A and B, peer object
#   OBJECT_MIB [16]     raw PUT object size;  THREADS [8]: raw PUT/GET threads
#   CACHE_MIB [256]     tierfs --cache-size (must be < SIZE_MIB so that B evicts A)
#   ROUNDS [3]          cold reads: this many rounds of (raw GET, tierfs cold read), one right
#                       after the other; the table gives medians and judges the median of the
#                       per-round ratios (the raw GET alone varies by 40% between runs here).
#                       The writes always come in two rounds: (raw PUT, tierfs write of A),
#                       (raw PUT, tierfs write of B), judged on the mean of the two ratios
#   COLD_FLOOR [1]      also run the cold floor (benches/cold-floor) in every round: the same
#                       required work as tierfs's cold read (GET, AES-GCM, blake3, FUSE to dd) and
#                       nothing else, so its rate is the ceiling for tierfs's. 0: skip it
#   COLD_FLOOR_BIN      use this tierfs-cold-floor binary and skip its build
#   PEERS ["rclone s3fs"]  FUSE peers to read through (empty: none). Missing ones are installed
#                       with apt-get (Debian packages rclone, s3fs) and the table says so.
#   TIERFS_BIN_DIR      directory with `tierfs` and `tierfs-daemon`: skips the build
#   CARGO_TARGET_DIR [/var/tmp/tierfs-target]  where `cargo build --release` puts them
#   SKIP_BUILD=1        use the binaries already in $CARGO_TARGET_DIR/release
#   TIERFS_MOUNT_OPTS   extra `tierfs mount` options (word-split)
#   TIERFS_INIT_OPTS    extra `tierfs init` options (word-split), e.g. "--pack-size 4M"
#   TIERFS_BACKEND_PARAMS  appended to tierfs's backend URL, e.g. "&payload=signed" (SigV4
#                       signs every upload's SHA-256 instead of the default CRC64NVME header)
#   MOTO_SERVER [/var/lib/tierfs-test-tools/moto-venv/bin/moto_server]; BENCH_PY [python next
#                       to it] (needs boto3); MOTO_PORT [a free port]
#   BENCH_ROOT [${TMPDIR:-/tmp}/tierfs-bench]  work dir parent (source files, data dir, caches,
#                       mounts): put it on the disk you want to measure
#   VERIFY [1]          after the timed cold read, compare tierfs's A with its source (untimed)
#   COLD_READ_PERF      record a system-wide `perf record -a -g` profile of the cold read to this
#                       file (where the CPU goes; perf must be installed)
#   POLL_S [0.1]        `tierfs status` polling interval while waiting for the store
#   DRAIN_TIMEOUT_S [1800]  give up waiting for dirty_bytes == 0 after this long
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/cold/<date>): table.md, results.json,
#   one <phase>.json per measurement, tierfs-write-{A,B}.samples.jsonl (status every POLL_S),
#   tierfs-daemon.log, moto.log, rclone.log, s3fs.log, cold.log (this script's log), env.txt.
# Needs root (drop_caches, apt-get), fuse3, python3, dd; everything started here is stopped and
# the work dir removed on exit (also on Ctrl-C / SIGTERM).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/cold/$(date +%Y%m%d-%H%M%S)}
SIZE_MIB=${SIZE_MIB:-1024}
OBJECT_MIB=${OBJECT_MIB:-16}
THREADS=${THREADS:-8}
CACHE_MIB=${CACHE_MIB:-256}
ROUNDS=${ROUNDS:-3}
PEERS=${PEERS-"rclone s3fs"}
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
VERIFY=${VERIFY:-1}
POLL_S=${POLL_S:-0.1}
DRAIN_TIMEOUT_S=${DRAIN_TIMEOUT_S:-1800}
BUCKET=cold-bench
PEER_KEY=peer-cold.bin

mkdir -p "$OUTDIR" || { echo "cold.sh: cannot create $OUTDIR" >&2; exit 1; }
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/cold.log
: >"$LOG"
log() { echo "[cold.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
# phase_error NAME MESSAGE: record a failed measurement (the table shows ERR) and go on
phase_error() {
  log "ERROR in $1: $2"
  python3 -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' "$2" >"$OUTDIR/$1.json"
}

[[ $SIZE_MIB =~ ^[0-9]+$ && $SIZE_MIB -gt 0 ]] || die "SIZE_MIB=$SIZE_MIB is not a positive number"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -gt 0 ]] || die "ROUNDS=$ROUNDS is not a positive number"
[[ $CACHE_MIB =~ ^[0-9]+$ && $CACHE_MIB -lt $SIZE_MIB ]] ||
  die "CACHE_MIB=$CACHE_MIB must be a number below SIZE_MIB=$SIZE_MIB (B has to evict A)"
for tool in python3 dd cmp curl mountpoint fusermount3; do
  command -v "$tool" >/dev/null || die "$tool missing (scripts/setup-debian.sh installs fuse3, python3, curl)"
done
[[ -x $MOTO_SERVER ]] || die "moto_server not found at $MOTO_SERVER (scripts/setup-debian.sh installs it; or set MOTO_SERVER)"
"$BENCH_PY" -c 'import boto3' 2>/dev/null || die "$BENCH_PY has no boto3 (set BENCH_PY to a python with boto3)"
IS_ROOT=0; [[ $(id -u) == 0 ]] && IS_ROOT=1
((IS_ROOT)) || log "WARNING: not root: page cache drops fail (cold reads are then warm) and peers cannot be installed"

# --- state for cleanup ---------------------------------------------------------------------
WORK='' MOTO_PID='' TIERFS='' TIERFS_PID='' TMNT='' TRUN=''
declare -A PEER_PID=() PEER_MNT=()

drop_caches() {
  sync
  if ((IS_ROOT)); then echo 3 >/proc/sys/vm/drop_caches || log "WARNING: drop_caches failed"; fi
}

# t ARGS...: the tierfs CLI with the bench's runtime dir, credentials and passphrase
t() {
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
    TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test \
    "$TIERFS" --runtime-dir "$TRUN" "$@"
}

tierfs_umount() {
  [[ -n $TMNT ]] || return 0
  if mountpoint -q "$TMNT"; then
    t --json status "$TMNT" >"$OUTDIR/tierfs-status-umount.json" 2>&1
    local t0=$SECONDS
    if t --json umount --timeout 120 "$TMNT" >"$OUTDIR/tierfs-umount.json" 2>>"$LOG"; then
      log "tierfs umount ok ($((SECONDS - t0)) s)"
    else
      log "tierfs umount FAILED; fusermount3 -u"
      fusermount3 -u "$TMNT" 2>>"$LOG" || umount -l "$TMNT" 2>>"$LOG"
    fi
  fi
  [[ -z $TIERFS_PID ]] || stop_daemon "$TIERFS_PID"
  [[ -f $WORK/tierfs-data/daemon.log ]] && cp "$WORK/tierfs-data/daemon.log" "$OUTDIR/tierfs-daemon.log"
  TMNT='' TIERFS_PID=''
}

peer_umount() {
  local p=$1 mnt=${PEER_MNT[$1]:-} pid=${PEER_PID[$1]:-}
  if [[ -n $mnt ]] && mountpoint -q "$mnt"; then
    fusermount3 -u "$mnt" 2>>"$LOG" || umount "$mnt" 2>>"$LOG" || { sleep 1; umount -l "$mnt" 2>>"$LOG"; }
  fi
  if [[ -n $pid ]]; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; sleep 1; kill -0 "$pid" 2>/dev/null && kill -9 "$pid"; fi
  fi
  rm -rf "${WORK:?}/$p-cache"
  unset "PEER_PID[$p]" "PEER_MNT[$p]"
}

cleanup() {
  trap - EXIT INT TERM
  set +e
  for p in "${!PEER_MNT[@]}"; do peer_umount "$p"; done
  tierfs_umount
  if [[ -n $WORK ]] && mountpoint -q "$WORK/mnt-floor" 2>/dev/null; then
    fusermount3 -u "$WORK/mnt-floor" 2>/dev/null || umount -l "$WORK/mnt-floor"
  fi
  if [[ -n $MOTO_PID ]]; then
    kill "$MOTO_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$MOTO_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$MOTO_PID" 2>/dev/null && kill -9 "$MOTO_PID" 2>/dev/null
  fi
  [[ -n $WORK && -d $WORK ]] && rm -rf "$WORK"
  mount | grep -F "${WORK:-/nonexistent}" >&2 && echo "cold.sh: WARNING: mounts left under $WORK" >&2
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# --- binaries ------------------------------------------------------------------------------
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"
tierfs_binaries
COLD_FLOOR=${COLD_FLOOR:-1}
if [[ $COLD_FLOOR == 1 ]]; then
  if [[ -z ${COLD_FLOOR_BIN:-} ]]; then
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
      (cd "$REPO" && cargo build --release -p tierfs-cold-floor) >>"$LOG" 2>&1 ||
        die "cargo build -p tierfs-cold-floor failed (see $LOG)"
    fi
    COLD_FLOOR_BIN=$CARGO_TARGET_DIR/release/tierfs-cold-floor
  fi
  [[ -x $COLD_FLOOR_BIN ]] || die "no tierfs-cold-floor at $COLD_FLOOR_BIN (or COLD_FLOOR=0)"
  COLD_FLOOR=$COLD_FLOOR_BIN
else
  COLD_FLOOR=''
fi

# --- peers: install if missing -------------------------------------------------------------
INSTALLED=''
for p in $PEERS; do
  case $p in rclone | s3fs) ;; *) die "unknown peer $p (PEERS: rclone, s3fs)" ;; esac
  command -v "$p" >/dev/null && continue
  ((IS_ROOT)) || die "$p missing and not root: apt-get install $p, or PEERS= to skip it"
  log "$p missing: apt-get install -y $p"
  { apt-get install -y "$p" || { apt-get update && apt-get install -y "$p"; }; } >>"$LOG" 2>&1 ||
    die "apt-get install $p failed (see $LOG)"
  INSTALLED+="$p "
done

# --- work dir, helper ----------------------------------------------------------------------
mkdir -p "$BENCH_ROOT" || die "cannot create $BENCH_ROOT"
WORK=$(mktemp -d "$BENCH_ROOT/cold.XXXXXX") || die "mktemp in $BENCH_ROOT failed"
TRUN=$WORK/run
mkdir -p "$TRUN"
H=$WORK/coldhelp.py
cat >"$H" <<'PY'
"""Timing and status helpers for cold.sh (one process per phase, so polling is cheap)."""
import json, os, re, subprocess, sys, time

MIB = 1 << 20


def status(tierfs, run, mnt):
    env = dict(os.environ)
    out = subprocess.run([tierfs, "--runtime-dir", run, "--json", "status", mnt], capture_output=True,
                         text=True, timeout=30, env=env)
    if out.returncode != 0:
        raise SystemExit(f"tierfs status {mnt} failed: {out.stderr.strip() or out.stdout.strip()}")
    cold = json.loads(out.stdout).get("cold")
    if cold is None:
        raise SystemExit(f"tierfs status {mnt}: no 'cold' section (mounted without --store?)")
    return cold


def write(tierfs, run, mnt, src, dst, poll, timeout, samples_path):
    """Copies src to dst with dd bs=4M; polls status until nothing is dirty. Prints JSON."""
    size = os.path.getsize(src)
    before = status(tierfs, run, mnt)
    samples = []
    t0 = time.perf_counter()
    dd = subprocess.Popen(["dd", f"if={src}", f"of={dst}", "bs=4M"], stderr=subprocess.PIPE, text=True)
    copy_s = None
    while True:
        now = time.perf_counter() - t0
        if copy_s is None and dd.poll() is not None:
            copy_s = time.perf_counter() - t0
            if dd.returncode != 0:
                raise SystemExit(f"dd {src} -> {dst} failed: {dd.stderr.read().strip()}")
        st = status(tierfs, run, mnt)
        samples.append({"t": round(now, 3), "copying": copy_s is None, **{k: st[k] for k in (
            "dirty_bytes", "uploaded_bytes", "resident_bytes", "evicted_bytes", "upload_errors")}})
        if copy_s is not None and st["dirty_bytes"] == 0:
            drain_s = time.perf_counter() - t0
            break
        if now > timeout:
            raise SystemExit(f"store not caught up after {timeout} s: {st}")
        time.sleep(poll)
    with open(samples_path, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    # longest stretch, while something was dirty, in which uploaded_bytes did not move
    gap, since = 0.0, None
    for a, b in zip(samples, samples[1:]):
        if a["dirty_bytes"] > 0 and b["uploaded_bytes"] == a["uploaded_bytes"]:
            since = a["t"] if since is None else since
            gap = max(gap, b["t"] - since)
        else:
            since = None
    uploaded = st["uploaded_bytes"] - before["uploaded_bytes"]
    print(json.dumps({
        "bytes": size, "copy_s": round(copy_s, 3), "seconds": round(drain_s, 3),
        "mib_s": round(size / MIB / drain_s, 2), "copy_mib_s": round(size / MIB / copy_s, 2),
        "uploaded_bytes": uploaded, "upload_amplification": round(uploaded / size, 3),
        "uploaded_packs": st["uploaded_packs"] - before["uploaded_packs"],
        "upload_errors": st["upload_errors"] - before["upload_errors"], "last_error": st["last_error"],
        "max_dirty_bytes": max(s["dirty_bytes"] for s in samples),
        "longest_upload_stall_s": round(gap, 3), "polls": len(samples),
        "status_before": before, "status_after": st}))


def wait_evict(tierfs, run, mnt, want_evicted, cache_bytes, timeout):
    """Waits until evicted_bytes >= want_evicted and resident_bytes <= cache_bytes (or timeout)."""
    t0 = time.perf_counter()
    while True:
        st = status(tierfs, run, mnt)
        done = st["evicted_bytes"] >= want_evicted and st["resident_bytes"] <= cache_bytes
        if done or time.perf_counter() - t0 > timeout:
            print(json.dumps({"waited_s": round(time.perf_counter() - t0, 2), "reached": done, "status": st}))
            return
        time.sleep(0.2)


def read(path, expect):
    """Times dd if=path of=/dev/null bs=4M. Prints JSON."""
    t0 = time.perf_counter()
    dd = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M"], stderr=subprocess.PIPE, text=True)
    secs = time.perf_counter() - t0
    if dd.returncode != 0:
        raise SystemExit(f"dd if={path} failed: {dd.stderr.strip()}")
    m = re.search(r"^(\d+) bytes", dd.stderr, re.M)
    got = int(m.group(1)) if m else -1
    if got != expect:
        raise SystemExit(f"dd if={path} read {got} bytes, expected {expect}: {dd.stderr.strip()}")
    print(json.dumps({"bytes": got, "seconds": round(secs, 3), "mib_s": round(got / MIB / secs, 2)}))


def proc_cpu(pid):
    """CPU seconds (user + system) process pid has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()  # the fields after the command name
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def cpu(args):
    """cpu NAME=PID... -- CMD...: runs CMD (which prints a JSON line) and adds "cpu_s": the CPU
    seconds each named process and CMD itself with its children ("client") used meanwhile."""
    import resource
    cut = args.index("--")
    pids = {n: int(p) for n, p in (a.split("=", 1) for a in args[:cut]) if p}
    before = {n: proc_cpu(p) for n, p in pids.items()}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(args[cut + 1:], stdout=subprocess.PIPE, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"{args[cut + 1]} failed (exit {out.returncode})")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    used = {n: round(proc_cpu(p) - before[n], 3) for n, p in pids.items()}
    used["client"] = round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 3)
    d["cpu_s"] = used
    print(json.dumps(d))


def cold_delta(before, after):
    """fetched/evicted deltas of two status JSON files around a read; merged into read.json."""
    b, a = (json.load(open(p)) for p in (before, after))
    d = {k + "_delta": a[k] - b[k] for k in ("fetched_bytes", "uploaded_bytes", "evictions")}
    d.update(evicted_bytes_before=b["evicted_bytes"], resident_bytes_before=b["resident_bytes"])  # gauges
    return d


def merge(path, *extra_files, **kv):
    d = json.load(open(path))
    for f in extra_files:
        d.update(json.load(open(f)))
    d.update(kv)
    json.dump(d, open(path, "w"))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        if cmd == "status":
            print(json.dumps(status(*args)))
        elif cmd == "write":
            tierfs, run, mnt, src, dst, poll, timeout, samples = args
            write(tierfs, run, mnt, src, dst, float(poll), float(timeout), samples)
        elif cmd == "wait-evict":
            tierfs, run, mnt, want, cache, timeout = args
            wait_evict(tierfs, run, mnt, int(want), int(cache), float(timeout))
        elif cmd == "read":
            read(args[0], int(args[1]))
        elif cmd == "cpu":
            cpu(args)
        elif cmd == "delta":
            path, before, after = args
            merge(path, **cold_delta(before, after))
        else:
            raise SystemExit(f"coldhelp: unknown command {cmd}")
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"timeout: {e}")
PY

# phase NAME CMD...: run a measurement, its JSON (last stdout line) to OUTDIR/NAME.json
phase() {
  local name=$1; shift
  local out err rc
  err=$WORK/$name.err
  out=$("$@" 2>"$err"); rc=$?
  cat "$err" >>"$LOG"
  if ((rc != 0)) || [[ -z $out ]]; then
    phase_error "$name" "$(tail -3 "$err" | tr '\n' ' ')(exit $rc)"
    return 1
  fi
  printf '%s\n' "$out" | tail -1 >"$OUTDIR/$name.json"
  log "$name: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.update(d.get("status", {})); print(", ".join(f"{k}={d[k]}" for k in ("mib_s","seconds","bytes","upload_amplification","fetched_bytes_delta","reached","waited_s","evicted_bytes","resident_bytes") if k in d))' "$OUTDIR/$name.json")"
}

{
  echo "date: $(date -Is)"
  echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2009  # pgrep refuses patterns longer than 15 characters
  echo "busy at start: $(ps -eo comm= | grep -cxE 'cargo|rustc|cc1plus|cc1|ld|fio') compiler/cargo/fio processes"
  echo "work dir: $WORK ($(df -h --output=source,fstype "$WORK" | tail -1 | tr -s ' '))"
  echo "SIZE_MIB=$SIZE_MIB OBJECT_MIB=$OBJECT_MIB THREADS=$THREADS CACHE_MIB=$CACHE_MIB ROUNDS=$ROUNDS PEERS='$PEERS' VERIFY=$VERIFY POLL_S=$POLL_S"
  echo "tierfs: $("$TIERFS" --version) ($TIERFS, built $(date -r "$TIERFS" +%FT%T)), checkout git $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo none)$(cd "$REPO" && [[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' (dirty tree)'), mount opts '${TIERFS_MOUNT_OPTS:-}', backend params '${TIERFS_BACKEND_PARAMS:-}'"
  echo "moto: $("$BENCH_PY" -c 'import moto, boto3; print("moto", moto.__version__, "boto3", boto3.__version__)' 2>/dev/null)"
  for p in $PEERS; do
    case $p in
      rclone) echo "rclone: $(rclone version 2>/dev/null | head -1)" ;;
      s3fs) echo "s3fs: $(s3fs --version 2>/dev/null | head -1)" ;;
    esac
  done
  [[ -n $INSTALLED ]] && echo "installed by this run (apt-get): $INSTALLED"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2
if [[ $(cut -d' ' -f1 /proc/loadavg | cut -d. -f1) -ge 1 ]] || grep -q ' [1-9]' <(grep '^busy' "$OUTDIR/env.txt"); then
  log "WARNING: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)); numbers will be noisy"
fi

# --- sources -------------------------------------------------------------------------------
SIZE=$((SIZE_MIB << 20))
log "preparing two ${SIZE_MIB} MiB random source files in $WORK"
for f in A B; do
  dd if=/dev/urandom of="$WORK/src-$f" bs=1M count="$SIZE_MIB" status=none || die "writing $WORK/src-$f failed (disk full?)"
done

# --- S3 server -----------------------------------------------------------------------------
start_moto
# CPU NAME=PID... -- CMD: CMD's JSON with the CPU seconds moto, the named processes and CMD used
CPU=(python3 "$H" cpu moto="$MOTO_PID")

# --- 1. raw parallel PUT / GET -------------------------------------------------------------
# raw_put_round R: the raw parallel PUT of SIZE_MIB into raw/, round R. Each runs right before
# a tierfs write of the same size (2.); the raw GETs of the same objects run later, each right
# before a tierfs cold read (3.).
raw_put_round() {
  log "raw PUT round $1: $SIZE_MIB MiB as $OBJECT_MIB MiB objects, $THREADS threads"
  phase "raw_put_r$1" "${CPU[@]}" -- "${RAW[@]}" put --prefix raw/ --size-mib "$SIZE_MIB" --object-mib "$OBJECT_MIB" --threads "$THREADS"
}

# raw_get_round R: the raw parallel GET of the raw/ objects, round R
raw_get_round() {
  drop_caches
  log "raw GET round $1: $SIZE_MIB MiB, $THREADS threads"
  phase "raw_get_r$1" "${CPU[@]}" -- "${RAW[@]}" get --prefix raw/ --threads "$THREADS"
}

# floor_put: uploads the cold floor's SIZE_MIB (sealed as tierfs seals blocks) under floor/
floor_put() {
  [[ -n $COLD_FLOOR ]] || return 0
  log "cold floor: uploading $SIZE_MIB MiB of sealed blocks under floor/"
  phase floor_put "$COLD_FLOOR" put --endpoint "$S3_ENDPOINT" --bucket "$BUCKET" --size-mib "$SIZE_MIB" \
    --object-mib "$OBJECT_MIB" --concurrency "$THREADS" --state "$WORK/floor-state.json" || COLD_FLOOR=''
}

# floor_round R: round R of the cold floor (benches/cold-floor): GET only, GET + decrypt +
# verify, and the same served through FUSE to dd; each from a cold page cache
floor_round() {
  [[ -n $COLD_FLOOR ]] || return 0
  local mode
  mkdir -p "$WORK/mnt-floor"
  for mode in get open fuse; do
    drop_caches
    log "cold floor: mode $mode, round $1"
    phase "floor_${mode}_r$1" "${CPU[@]}" -- "$COLD_FLOOR" read --state "$WORK/floor-state.json" --mode "$mode" \
      --mountpoint "$WORK/mnt-floor" --concurrency "$THREADS"
  done
}

# tierfs_cold_read R: round R's cold read of A (dd bs=4M), with the store traffic it caused.
# A is larger than the stream limit (half the cache), so a read leaves nothing in the cache and
# every round is as cold as the first; fetched_bytes_delta in the JSON shows it.
tierfs_cold_read() {
  local r=$1 perf_pid=
  drop_caches
  python3 "$H" status "$TIERFS" "$TRUN" "$TMNT" >"$WORK/before-read.json" 2>>"$LOG" ||
    { phase_error "tierfs_cold_read_r$r" "tierfs status failed"; return 1; }
  log "tierfs: cold read of A, round $r (dd bs=4M)"
  if [[ -n ${COLD_READ_PERF:-} && $r == 1 ]]; then
    perf record -a -g -o "$COLD_READ_PERF" >>"$LOG" 2>&1 &
    perf_pid=$!
    sleep 1
  fi
  phase "tierfs_cold_read_r$r" "${CPU[@]}" tierfs="${TIERFS_PID:-}" -- python3 "$H" read "$TMNT/A" "$SIZE" || return 1
  if [[ -n $perf_pid ]]; then kill -INT "$perf_pid"; wait "$perf_pid"; fi
  python3 "$H" status "$TIERFS" "$TRUN" "$TMNT" >"$WORK/after-read.json" 2>>"$LOG" &&
    python3 "$H" delta "$OUTDIR/tierfs_cold_read_r$r.json" "$WORK/before-read.json" "$WORK/after-read.json" &&
    log "tierfs: cold read round $r fetched $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["fetched_bytes_delta"] >> 20)' "$OUTDIR/tierfs_cold_read_r$r.json") MiB from the store"
}

# --- 2. tierfs: write to the store ---------------------------------------------------------
tierfs_phases() {
  local store=$WORK/store.toml data=$WORK/tierfs-data out
  TMNT=$WORK/mnt-tierfs
  mkdir -p "$TMNT" "$data"
  log "tierfs init (s3://$BUCKET/tierfs on $S3_ENDPOINT)"
  t init --store "$store" --backend "s3://$BUCKET/tierfs?endpoint=$S3_ENDPOINT&region=us-east-1${TIERFS_BACKEND_PARAMS:-}" ${TIERFS_INIT_OPTS:-} >>"$LOG" 2>&1 ||
    { phase_error tierfs_write_A "tierfs init failed (see cold.log)"; return 1; }
  # shellcheck disable=SC2086  # TIERFS_MOUNT_OPTS is a word list
  out=$(t --json mount --store "$store" --cache-size "${CACHE_MIB}M" --data-dir "$data" ${TIERFS_MOUNT_OPTS:-} "$TMNT" 2>>"$LOG") ||
    { phase_error tierfs_write_A "tierfs mount failed: $(tail -2 "$LOG" | tr '\n' ' ')"; return 1; }
  TIERFS_PID=$(printf '%s' "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("pid") or "")' 2>/dev/null)
  log "tierfs mounted on $TMNT (daemon pid ${TIERFS_PID:-unknown}, cache ${CACHE_MIB} MiB)"
  t --json status "$TMNT" >"$OUTDIR/tierfs-status-mount.json" 2>&1

  local i=0
  for f in A B; do
    i=$((i + 1))
    raw_put_round "$i"
    drop_caches
    cat "$WORK/src-$f" >/dev/null   # the source comes from RAM: the local disk read is not timed
    log "tierfs: writing $f ($SIZE_MIB MiB, dd bs=4M), then waiting until dirty_bytes == 0"
    phase "tierfs_write_$f" "${CPU[@]}" tierfs="${TIERFS_PID:-}" -- python3 "$H" write "$TIERFS" "$TRUN" "$TMNT" "$WORK/src-$f" "$TMNT/$f" \
      "$POLL_S" "$DRAIN_TIMEOUT_S" "$OUTDIR/tierfs-write-$f.samples.jsonl" || return 1
  done

  # --- 3. cold sequential reads: rounds of (raw GET, tierfs cold read of A) ---
  log "tierfs: waiting for eviction (evicted >= $SIZE_MIB MiB, resident <= $CACHE_MIB MiB)"
  phase tierfs_evict python3 "$H" wait-evict "$TIERFS" "$TRUN" "$TMNT" "$SIZE" "$((CACHE_MIB << 20))" 60
  local r
  for r in $(seq "$ROUNDS"); do
    raw_get_round "$r"
    tierfs_cold_read "$r" || return 1
    floor_round "$r"
  done
  if [[ $VERIFY == 1 ]]; then
    local ok=False
    if cmp -s "$WORK/src-A" "$TMNT/A"; then
      log "tierfs: A reads back identical to its source"
      ok=True
    else
      log "ERROR: tierfs: A differs from its source"
    fi
    python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["verified"]=sys.argv[2]=="True"; json.dump(d,open(p,"w"))' \
      "$OUTDIR/tierfs_cold_read_r1.json" "$ok"
  fi
  "${RAW[@]}" du --prefix tierfs/ >"$OUTDIR/tierfs_bucket_du.json" 2>>"$LOG"
}
floor_put
if ! tierfs_phases; then
  # The raw PUT and GETs still run: the table shows the ceiling next to tierfs's ERR.
  [[ -f $OUTDIR/raw_put_r1.json ]] || raw_put_round 1
  for r in $(seq "$ROUNDS"); do
    [[ -f $OUTDIR/raw_get_r$r.json ]] || raw_get_round "$r"
    [[ -f $OUTDIR/floor_fuse_r$r.json ]] || floor_round "$r"
  done
fi
tierfs_umount
"${RAW[@]}" delete --prefix raw/ >/dev/null 2>>"$LOG" || log "WARNING: deleting raw/ failed"

# --- 4. FUSE peers, reading the same bytes cold --------------------------------------------
wait_mount() {  # wait_mount MNT PID LOGFILE
  local i
  for i in $(seq 300); do
    mountpoint -q "$1" && return 0
    kill -0 "$2" 2>/dev/null || { log "mount of $1 failed: $(tail -3 "$3" | tr '\n' ' ')"; return 1; }
    sleep 0.1
  done
  log "timeout waiting for the mount $1"; return 1
}

mount_peer() {  # mount_peer rclone|s3fs : mounts the bucket, sets PEER_MNT / PEER_PID
  local p=$1 mnt=$WORK/mnt-$1 cache=$WORK/$1-cache plog=$OUTDIR/$1.log
  mkdir -p "$mnt" "$cache"
  PEER_MNT[$p]=$mnt
  case $p in
    rclone)
      # rclone remote from env only; AWS_CA_BUNDLE breaks rclone 1.60's S3 client
      env -u AWS_CA_BUNDLE RCLONE_CONFIG=/dev/null RCLONE_CONFIG_COLDS3_TYPE=s3 \
        RCLONE_CONFIG_COLDS3_PROVIDER=Other RCLONE_CONFIG_COLDS3_ENV_AUTH=false \
        RCLONE_CONFIG_COLDS3_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" \
        RCLONE_CONFIG_COLDS3_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" \
        RCLONE_CONFIG_COLDS3_ENDPOINT="$S3_ENDPOINT" RCLONE_CONFIG_COLDS3_REGION=us-east-1 \
        RCLONE_CONFIG_COLDS3_FORCE_PATH_STYLE=true \
        rclone mount "colds3:$BUCKET" "$mnt" --vfs-cache-mode full --cache-dir "$cache" \
        --log-level NOTICE >>"$plog" 2>&1 &
      ;;
    s3fs)
      (umask 077; echo "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" >"$WORK/s3fs.passwd")
      s3fs "$BUCKET" "$mnt" -f \
        -o "passwd_file=$WORK/s3fs.passwd,url=$S3_ENDPOINT,endpoint=us-east-1,use_path_request_style" \
        -o "use_cache=$cache,dbglevel=warn" >>"$plog" 2>&1 &
      ;;
  esac
  PEER_PID[$p]=$!
  wait_mount "$mnt" "${PEER_PID[$p]}" "$plog"
}

if [[ -n ${PEERS// /} ]]; then
  log "uploading the peers' object $PEER_KEY (source A, multipart)"
  if "${RAW[@]}" upload "$WORK/src-A" "$PEER_KEY" >"$OUTDIR/peer_upload.json" 2>>"$LOG"; then
    for p in $PEERS; do
      log "$p: mount, drop caches, cold read of $PEER_KEY (dd bs=4M)"
      if mount_peer "$p"; then
        drop_caches
        phase "${p}_cold_read" python3 "$H" read "${PEER_MNT[$p]}/$PEER_KEY" "$SIZE"
      else
        phase_error "${p}_cold_read" "$p mount failed (see $p.log)"
      fi
      peer_umount "$p"
    done
  else
    for p in $PEERS; do phase_error "${p}_cold_read" "uploading $PEER_KEY failed (see cold.log)"; done
  fi
fi
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"

# --- table ---------------------------------------------------------------------------------
python3 - "$OUTDIR" "$SIZE_MIB" "$CACHE_MIB" "$PEERS" "$INSTALLED" "$ROUNDS" <<'PY' | tee "$OUTDIR/table.md"
import json, os, statistics, sys
out, size_mib, cache_mib, peers, installed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()
rounds = int(sys.argv[6])
def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None
names = ["tierfs_write_A", "tierfs_write_B",
         "rclone_cold_read", "s3fs_cold_read", "tierfs_evict", "tierfs_bucket_du", "peer_upload"]
res = {n: load(n) for n in names}
# The cold reads ran in rounds (raw GET, then tierfs): each row shows the median round, and
# the ratio to the raw GET is the median of the per-round ratios (both sides measured
# seconds apart, so a drift of the machine or of moto hits both).
floors = ("floor_get", "floor_open", "floor_fuse")
per_round = {n: [load(f"{n}_r{r}") for r in range(1, rounds + 1)] for n in ("raw_get", "tierfs_cold_read") + floors}
# The writes too: a raw PUT right before each tierfs write (file A in round 1, B in round 2).
per_round["raw_put"] = [load(f"raw_put_r{r}") for r in (1, 2)]
def ok(d):
    return d is not None and "error" not in d
for n, runs in per_round.items():
    good = [d for d in runs if ok(d)]
    if not good:
        res[n] = next((d for d in runs if d is not None), None)
        continue
    mid = sorted(good, key=lambda d: d["mib_s"])[(len(good) - 1) // 2]  # the lower median: a real round
    res[n] = dict(mid, rounds=[d["mib_s"] if ok(d) else None for d in runs], median_of=len(good))
    # The content check runs once, after the last round, and is recorded in round 1's JSON.
    checked = [d["verified"] for d in good if "verified" in d]
    if checked:
        res[n]["verified"] = all(checked)
def pairs(a, b):
    """a / b per round, for the rounds where both were measured."""
    return [x["mib_s"] / y["mib_s"] for x, y in zip(per_round[a], per_round[b]) if ok(x) and ok(y)]
paired = pairs("tierfs_cold_read", "raw_get")
floor_paired = pairs("floor_fuse", "raw_get")
tierfs_floor = pairs("tierfs_cold_read", "floor_fuse")
paired_writes = [res[w]["mib_s"] / p["mib_s"] for p, w in zip(per_round["raw_put"], ("tierfs_write_A", "tierfs_write_B"))
                 if ok(p) and ok(res.get(w))]
def rate(n):
    d = res.get(n)
    return d.get("mib_s") if d and "error" not in d else None
def cell(n):
    d = res.get(n)
    if d is None:
        return "-"
    return "ERR" if "error" in d else f"{d['mib_s']:.1f}"
MIB = 1 << 20
def rounds_note(d):
    r = ", ".join("ERR" if v is None else f"{v:.0f}" for v in d["rounds"])
    return f"median of {d['median_of']} rounds ({r} MiB/s)"
def note(n):
    d = res.get(n)
    if not d:
        return "not measured"
    if "error" in d:
        return "ERROR: " + d["error"][:200]
    if n == "raw_put":
        return f"boto3, {d['objects']} objects of {d['object_bytes'] // MIB} MiB, {d['threads']} threads; {rounds_note(d)}"
    if n == "raw_get":
        return f"boto3, {d['objects']} objects, {d['threads']} threads; {rounds_note(d)}"
    if n.startswith("tierfs_write"):
        return (f"dd done at {d['copy_s']:.1f} s ({d['copy_mib_s']:.0f} MiB/s), nothing dirty at {d['seconds']:.1f} s; "
                f"uploaded {d['uploaded_bytes'] / MIB:.0f} MiB ({d['upload_amplification']:.2f}x) in {d['uploaded_packs']} packs; "
                f"{d['upload_errors']} upload errors; longest upload stall {d['longest_upload_stall_s']:.1f} s")
    if n == "tierfs_cold_read":
        v = {True: ", content verified", False: ", CONTENT DIFFERS"}.get(d.get("verified"), "")
        f = d.get("fetched_bytes_delta", 0)
        return (f"{rounds_note(d)}; the median round fetched {f / MIB:.0f} MiB from the store "
                f"({f / d['bytes']:.2f}x the file), {d.get('evictions_delta', 0)} evictions during the read{v}")
    if n in floors:
        what = {"floor_get": "whole-object GETs with tierfs's HTTP client (object_store), no checks",
                "floor_open": "the same GETs, every block decrypted (AES-256-GCM) and its blake3 id checked",
                "floor_fuse": "the same, served through a FUSE mount to dd bs=4M (dd timed)"}[n]
        return f"{what}; {d.get('concurrency')} GETs in flight; {rounds_note(d)}"
    return {"rclone_cold_read": "rclone mount --vfs-cache-mode full", "s3fs_cold_read": "s3fs use_cache"}[n]
rows = [("raw parallel PUT", "raw_put"), ("tierfs write to store (file A)", "tierfs_write_A"),
        ("tierfs write to store (file B)", "tierfs_write_B"), ("raw parallel GET", "raw_get"),
        ("tierfs cold read", "tierfs_cold_read"), ("cold floor: GET only", "floor_get"),
        ("cold floor: GET + decrypt + verify", "floor_open"), ("cold floor: all that + FUSE", "floor_fuse")]
rows += [(f"{p} cold read", f"{p}_cold_read") for p in peers]
print(f"## Cold tier vs raw S3 (moto, one run, {size_mib} MiB each, {rounds} rounds of cold reads, tierfs cache {cache_mib} MiB)\n")
print("| | MiB/s | s | notes |\n|---|---:|---:|---|")
for label, n in rows:
    d = res.get(n) or {}
    secs = f"{d['seconds']:.2f}" if d and "error" not in d else ""
    print(f"| {label} | {cell(n)} | {secs} | {note(n)} |")
# write rate: the mean of A and B when both exist (both are one file of SIZE into the store)
writes = [rate(n) for n in ("tierfs_write_A", "tierfs_write_B") if rate(n)]
r = rate("tierfs_cold_read")
def ratio(a, b):
    return a / b if a and b else None
checks = [("tierfs write to store / raw PUT (mean of the rounds' ratios)",
           statistics.mean(paired_writes) if paired_writes else None, 0.8),
          ("tierfs cold read / raw GET (median of the rounds' ratios)", statistics.median(paired) if paired else None, 0.8)]
info = [("cold floor (GET, decrypt, verify, FUSE) / raw GET", floor_paired),
        ("cold floor, GET + decrypt + verify without FUSE / raw GET", pairs("floor_open", "raw_get")),
        ("tierfs cold read / cold floor", tierfs_floor)]
for p in peers:
    checks.append((f"tierfs cold read / {p} cold read", ratio(r, rate(f"{p}_cold_read")), 2.0))
print("\n| ratio | value | target | met |\n|---|---:|---:|:-:|")
for label, v, target in checks:
    print(f"| {label} | {'-' if v is None else f'{v:.2f}x'} | >= {target:g}x | {'-' if v is None else ('yes' if v >= target else 'NO')} |")
print("\n| what the target leaves room for (median of the rounds' ratios) | value | per round |\n|---|---:|---|")
for label, v in info:
    print(f"| {label} | {f'{statistics.median(v):.2f}x' if v else '-'} | {', '.join(f'{x:.2f}' for x in v)} |")
cpu_rows = [(label, n) for label, n in rows if ok(res.get(n)) and "cpu_s" in res[n]]
if cpu_rows:
    print(f"\n| CPU seconds ({size_mib} MiB) | moto | tierfs daemon | client | all |\n|---|---:|---:|---:|---:|")
    for label, n in cpu_rows:
        c = res[n]["cpu_s"]
        cells = [c.get(k) for k in ("moto", "tierfs", "client")]
        print(f"| {label} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in cells)
              + f" | {sum(v for v in cells if v):.2f} |")
    print("\nclient: the measuring process with its children: boto3 for the raw PUT and GET (with the"
          " interpreter's start and imports, which the timed seconds leave out); for tierfs's write dd and"
          " the `tierfs status` polls, for its read dd; the floor and its dd for the floor. Medians are"
          " the median round's; writes are one round each.")
ev = res.get("tierfs_evict")
notes = []
if paired:
    notes.append("cold read / raw GET per round: " + ", ".join(f"{x:.2f}x" for x in paired) + ".")
if paired_writes:
    notes.append("write / raw PUT per round (A, then B, each right after its raw PUT): "
                 + ", ".join(f"{x:.2f}x" for x in paired_writes) + ".")
if len(writes) == 2:
    notes.append("B's write also pushes A out of the cache.")
if ev and "error" not in ev:
    s = ev["status"]
    notes.append(f"before the cold read: evicted {s['evicted_bytes'] / MIB:.0f} MiB, resident {s['resident_bytes'] / MIB:.0f} MiB"
                 + ("" if ev["reached"] else f" (WARNING: A may not be fully evicted after {ev['waited_s']} s)"))
du = res.get("tierfs_bucket_du")
if du and "error" not in du:
    notes.append(f"bucket under tierfs/: {du['objects']} objects, {du['bytes'] / MIB:.0f} MiB for {2 * size_mib} MiB written.")
if installed:
    notes.append(f"installed by this run with apt-get: {', '.join(installed)}.")
daemon_log = os.path.join(out, "tierfs-daemon.log")
if os.path.exists(daemon_log):
    bad = [l.rstrip() for l in open(daemon_log, errors="replace") if " WARN " in l or " ERROR " in l]
    notes.append(f"tierfs-daemon.log: {len(bad)} WARN/ERROR lines" + (f", first: `{bad[0][:200]}`" if bad else ""))
env = open(os.path.join(out, "env.txt")).read().splitlines()
notes += [l for l in env if l.startswith("loadavg")]
print()
for n in notes:
    print(f"- {n}")
results = {"params": {"size_mib": size_mib, "cache_mib": cache_mib, "rounds": rounds, "peers": peers}, "env": env,
           "results": res, "ratios": {label: {"value": v, "target": t} for label, v, t in checks},
           "floor_ratios": {label: {"median": statistics.median(v) if v else None, "rounds": v} for label, v in info}}
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1)
PY
log "results: $OUTDIR"
