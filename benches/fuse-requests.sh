#!/usr/bin/env bash
# benches/fuse-requests.sh BIN_DIR [OUTDIR]
#
# What the kernel asks the daemon while a program writes: fio 4k random writes (buffered, over a
# 64 MiB file laid out first, page cache dropped: small enough for a writer to open through
# passthrough, PASSTHROUGH_REWRITE_MAX; SIZE=1G shows the daemon's path) on the local disk and on tierfs with and
# without passthrough, one after another, with every FUSE request the kernel sends counted
# by opcode through the `fuse:fuse_request_send` tracepoint (perf, system-wide; Linux 6.13+).
# Counts, not only times: a request per write is a round trip through the daemon however
# fast the machine is. Prints one table (IOPS, mean completion latency, requests per write
# by opcode) and writes it to OUTDIR/table.md.
#
# BIN_DIR holds `tierfs` and `tierfs-daemon`. Run as root (perf, drop_caches, passthrough).
# Knobs: PEERS ["local tierfs tierfs_nopt"], WRITES [262144], SIZE [64M], BENCH_ROOT
# [/var/tmp/tierfs-fuse-requests]. Only the daemons started here are unmounted; their data
# dirs are removed at the end.
set -euo pipefail
BIN=${1:?usage: fuse-requests.sh BIN_DIR [OUTDIR]}
OUT=${2:-${TMPDIR:-/tmp}/tierfs-fuse-requests/$(date -u +%Y%m%dT%H%M%S)}
PEERS=${PEERS:-local tierfs tierfs_nopt}
WRITES=${WRITES:-262144}
SIZE=${SIZE:-64M}
ROOT=${BENCH_ROOT:-/var/tmp/tierfs-fuse-requests}
mkdir -p "$OUT" "$ROOT/run"
command -v perf >/dev/null && command -v fio >/dev/null || { echo "needs perf and fio" >&2; exit 1; }
{ uname -r; uptime; "$BIN/tierfs" --version; } >"$OUT/env.txt"

mounted=()
cleanup() {
  for m in "${mounted[@]}"; do "$BIN/tierfs" --runtime-dir "$ROOT/run" umount "$m" >/dev/null 2>&1 || true; done
  rm -rf "$ROOT"/data-*
}
trap cleanup EXIT

# dir_of PEER: sets `d` to the directory the peer's file lives in (mounting tierfs first; not
# in a subshell, so that `mounted` keeps the mount for the cleanup).
dir_of() {
  local peer=$1 opts=()
  case $peer in
    local) mkdir -p "$ROOT/local"; d="$ROOT/local"; return ;;
    tierfs) ;;
    tierfs_nopt) opts=(--no-passthrough) ;;
    *) echo "unknown peer $peer" >&2; exit 1 ;;
  esac
  local m="$ROOT/mnt-$peer"
  mkdir -p "$m"
  "$BIN/tierfs" --runtime-dir "$ROOT/run" mount --no-store --data-dir "$ROOT/data-$peer" "${opts[@]}" "$m" >/dev/null
  mounted+=("$m")
  d=$m
}

printf '| peer | 4k random writes | IOPS | mean latency, us | FUSE requests per write |\n|---|---:|---:|---:|---|\n' >"$OUT/table.md"
for peer in $PEERS; do
  dir_of "$peer"
  fio --name=lay --filename="$d/f" --rw=write --bs=1M --size="$SIZE" --end_fsync=1 --output=/dev/null
  sync
  echo 3 >/proc/sys/vm/drop_caches
  perf record -q -e fuse:fuse_request_send -a -o "$OUT/$peer.perf" -- \
    fio --name=rw --filename="$d/f" --rw=randwrite --bs=4k --size="$SIZE" --io_size="$((WRITES * 4))k" --number_ios="$WRITES" \
      --randrepeat=1 --output-format=json --output="$OUT/$peer.fio.json" >/dev/null 2>&1
  perf script -i "$OUT/$peer.perf" 2>/dev/null | grep -o 'FUSE_[A-Z_]*' | sort | uniq -c >"$OUT/$peer.requests" || true
  python3 - "$OUT/$peer.fio.json" "$OUT/$peer.requests" "$peer" >>"$OUT/table.md" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
ios = w["total_ios"]
per = []
for line in open(sys.argv[2]):
    n, op = line.split()
    per.append((int(n) / ios, op))
reqs = ", ".join(f"{op} {r:.2f}" for r, op in sorted(per, reverse=True) if r >= 0.01) or "none"
print(f"| {sys.argv[3]} | {ios} | {w['iops']:.0f} | {w['clat_ns']['mean'] / 1000:.1f} | {reqs} |")
PY
done
uptime >>"$OUT/env.txt"
cat "$OUT/table.md"
