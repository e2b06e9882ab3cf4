#!/usr/bin/env bash
# scripts/garage.sh [OUTDIR]
#
# tierfs against Garage, the distributed S3 engine users run: a 3-node Garage cluster
# (replication factor 3) on 127.0.0.1, started with benches/harness/servers/start_garage.sh.
# Garage 2.x ignores conditional writes (If-None-Match), so:
#   1. a store made with the default fencing must be refused at mount, naming `--fencing lease`;
#   2. a store made with `tierfs init --fencing lease` mounts; files written and fsynced,
#      `tierfs sync`, a second writer refused, one Garage node stopped while writing (writes
#      go on: Garage keeps 2 of 3), unmount, then a fresh node (empty data dir) sees the same
#      bytes, read back cold through a cache half the size of the big file.
# Prints a table (also OUTDIR/table.md) and exits non-zero if a check fails. The rates in the
# table are for information only; no check depends on them.
#
# The `garage` step of scripts/test.sh (so CI) runs it with small sizes on the debug build;
# scripts/setup-debian.sh installs Garage (cargo install, about 12 minutes, once) into
# ${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/garage.
# Knobs: GARAGE_BIN, TIERFS_BIN_DIR (default: build release), SIZE_MIB [256], CACHE_MIB [128],
# BENCH_PY (a python with boto3, default the test tools' moto venv).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
HERE=$REPO/benches
# shellcheck source=benches/lib.sh
. "$HERE/lib.sh"
OUT=${1:-${TMPDIR:-/tmp}/tierfs-bench/garage-$(date +%Y%m%d-%H%M%S)}
SIZE_MIB=${SIZE_MIB:-256}
CACHE_MIB=${CACHE_MIB:-128}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
LOG=$OUT/garage.log
log() { echo "[garage.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
# a python with boto3 (the start script creates the bucket with it): the test tools' venv
export BENCH_PY=${BENCH_PY:-/var/lib/tierfs-test-tools/moto-venv/bin/python}
export GARAGE_BIN=${GARAGE_BIN:-${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/garage/bin/garage}
[[ -x $GARAGE_BIN ]] || { echo "garage.sh: no Garage binary at $GARAGE_BIN (scripts/setup-debian.sh installs it)" >&2; exit 2; }
tierfs_binaries
T() { "$BIN_DIR/tierfs" --runtime-dir "$W/run" "$@"; }

W=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-garage.XXXXXX")
export S3_STATE_ROOT=$W/garage GARAGE_WIPE=1 BUCKET=tierfs-garage
cleanup() {
  # a failed check: keep the daemons' logs and show their ends (the work dir goes away)
  if ((${failed:-0})); then
    for d in "$W"/data-*; do
      [[ -f $d/daemon.log ]] || continue
      cp "$d/daemon.log" "$OUT/daemon-${d##*/data-}.log"
      echo "--- last lines of the daemon log of ${d##*/data-} (all of it: $OUT/daemon-${d##*/data-}.log)" >&2
      tail -n 15 "$d/daemon.log" >&2
    done
  fi
  for m in "$W"/mnt-*; do [[ -d $m ]] && mountpoint -q "$m" && { T umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m"; }; done
  "$HERE/harness/servers/stop_garage.sh" 3 >/dev/null 2>&1
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
eval "$("$HERE/harness/servers/start_garage.sh" 3)" || { echo "garage.sh: Garage did not start" >&2; exit 1; }
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY TIERFS_TEST_FAST_KDF=test
url() { echo "s3://$BUCKET/$1?endpoint=http://127.0.0.1:3910&region=garage"; }
rows=() failed=0
row() { rows+=("| $1 | $2 | $3 |"); [[ $2 == ok* ]] || failed=1; echo "$1: $2 ($3)" >&2; }
mnt() { mkdir -p "$W/mnt-$1" "$W/data-$1"; echo "$W/mnt-$1"; }

# 1. default fencing: refused, with the way out named
T init --store "$W/plain.toml" --backend "$(url plain)" --key-file "$W/key" >/dev/null 2>"$OUT/init-plain.log"
m=$(mnt plain)
if T mount --store "$W/plain.toml" --data-dir "$W/data-plain" "$m" >"$OUT/mount-plain.log" 2>&1; then
  row "default fencing on Garage" "FAIL: mounted" "the probe should refuse a server that ignores If-None-Match"
  T umount "$m" >/dev/null 2>&1
elif grep -q -- "--fencing lease" "$OUT/mount-plain.log"; then
  row "default fencing on Garage" "ok: refused" "$(grep -o 'ignores[^;]*' "$OUT/mount-plain.log" | head -1)"
else
  row "default fencing on Garage" "FAIL: unclear refusal" "$(tail -1 "$OUT/mount-plain.log")"
fi

# 2. lease fencing
T init --store "$W/lease.toml" --backend "$(url lease)" --key-file "$W/key" --fencing lease >/dev/null 2>"$OUT/init-lease.log"
a=$(mnt a) b=$(mnt b)
if ! T mount --store "$W/lease.toml" --cache-size "${CACHE_MIB}M" --data-dir "$W/data-a" "$a" >"$OUT/mount-a.log" 2>&1; then
  row "lease fencing: mount" "FAIL" "$(tail -1 "$OUT/mount-a.log")"
else
  row "lease fencing: mount" "ok" "$(tail -1 "$OUT/mount-a.log")"
  head -c $((SIZE_MIB << 20)) /dev/urandom >"$W/big.src"
  t0=$(date +%s.%N)
  cp "$W/big.src" "$a/big" && sync -f "$a/big"
  t1=$(date +%s.%N)
  for i in $(seq 200); do head -c $((RANDOM * 3)) /dev/urandom >"$a/small-$i"; done
  python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd)" "$a/small-200"
  row "write ${SIZE_MIB} MiB + fsync through Garage" "ok" "$(python3 -c "print(round($SIZE_MIB/($t1-$t0)), 'MiB/s')")"
  if T mount --store "$W/lease.toml" --data-dir "$W/data-b" "$b" >"$OUT/mount-b.log" 2>&1; then
    row "second writer" "FAIL: mounted" ""; T umount "$b" >/dev/null 2>&1
  else
    row "second writer" "ok: refused" "$(grep -o 'in use by [^ ]*' "$OUT/mount-b.log" | head -1)"
  fi
  "$HERE/harness/servers/stop_garage.sh" 3 2 >/dev/null 2>&1
  if head -c $((8 << 20)) /dev/urandom >"$a/during-outage" &&
     python3 -c "import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd)" "$a/during-outage"; then
    row "write + fsync with Garage node 2 stopped" "ok" "2 of 3 Garage nodes"
  else
    row "write + fsync with Garage node 2 stopped" "FAIL" "$(tail -2 "$W/data-a/daemon.log")"
  fi
  GARAGE_WIPE=0 "$HERE/harness/servers/start_garage.sh" 3 >/dev/null 2>&1
  if T sync "$a" >"$OUT/sync.log" 2>&1; then row "tierfs sync" "ok" "snapshot $(tail -1 "$OUT/sync.log")"; else row "tierfs sync" "FAIL" "$(tail -1 "$OUT/sync.log")"; fi
  (cd "$a" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$OUT/a.sums"
  T umount "$a" >"$OUT/umount-a.log" 2>&1 || row "unmount a" "FAIL" "$(tail -1 "$OUT/umount-a.log")"
  c=$(mnt c)
  if T mount --store "$W/lease.toml" --cache-size "${CACHE_MIB}M" --data-dir "$W/data-c" "$c" >"$OUT/mount-c.log" 2>&1; then
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
    t0=$(date +%s.%N)
    if cat "$c/big" >/dev/null 2>"$OUT/cold-read.log"; then
      t1=$(date +%s.%N)
      row "cold read of ${SIZE_MIB} MiB on a fresh node (cache ${CACHE_MIB} MiB)" "ok" "$(python3 -c "print(round($SIZE_MIB/($t1-$t0)), 'MiB/s')")"
    else
      row "cold read of ${SIZE_MIB} MiB on a fresh node (cache ${CACHE_MIB} MiB)" "FAIL" "$(tail -1 "$OUT/cold-read.log")"
    fi
    (cd "$c" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$OUT/c.sums"
    if cmp -s "$OUT/a.sums" "$OUT/c.sums"; then
      row "fresh node sees the same files" "ok" "$(wc -l <"$OUT/a.sums") files, sha256 equal"
    else
      row "fresh node sees the same files" "FAIL" "see $OUT/a.sums and c.sums"
    fi
    T umount "$c" >/dev/null 2>&1
  else
    row "fresh node mount" "FAIL" "$(tail -1 "$OUT/mount-c.log")"
  fi
fi
{
  echo "## tierfs on Garage $("$GARAGE_BIN" --version 2>/dev/null | head -1) (3 nodes, replication 3, 127.0.0.1), $(date -Is)"
  echo
  echo "| check | result | detail |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT/table.md"
exit $failed
