#!/usr/bin/env bash
# benches/node-workers.sh: what privilege separation costs a node. Starts `tierfs-daemon
# node` with N mounts (hot tier only, each with its own data dir) twice: once with no owner
# (root serves every mount in its one process, as before workers existed) and once with an
# owner (a worker process per mount, running as that user). Reports, for each: the time
# from the start to READY=1 (sd_notify), the summed RSS of the node and its workers once
# ready, and again after FILES small files were written into every mount, and the ratio
# worker/in-process. Timings are numbers to read, not a pass/fail test.
#
# Needs root (mounts, a user made with useradd). Usage:
#   sudo benches/node-workers.sh            # release build in $CARGO_TARGET_DIR
#   TIERFS_BIN_DIR=/path/to/debug benches/node-workers.sh
# Environment: MOUNTS (3), FILES (2000), ROUNDS (3), OWNER_USER (tierfs-bench-owner).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
: "${CARGO_TARGET_DIR:=$REPO/target}"
MOUNTS=${MOUNTS:-3}
FILES=${FILES:-2000}
ROUNDS=${ROUNDS:-3}
OWNER_USER=${OWNER_USER:-tierfs-bench-owner}
OUTDIR=$(mktemp -d /tmp/tierfs-node-workers.XXXXXX)
chmod 755 "$OUTDIR"
LOG=$OUTDIR/bench.log
log() { echo "node-workers: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

[[ $(id -u) == 0 ]] || die "needs root (mounts and a user of its own)"
tierfs_binaries
id -u "$OWNER_USER" >/dev/null 2>&1 || useradd --system --no-create-home "$OWNER_USER"
OWNER_UID=$(id -u "$OWNER_USER")

# rss_kib PID...: the summed VmRSS of the node and its children.
rss_kib() {
  local node=$1 total=0 pid
  for pid in $node $(pgrep -P "$node" || true); do
    total=$((total + $(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# one_run MODE ROUND: prints "MODE ready_ms rss_ready_kib rss_after_kib processes".
one_run() {
  local mode=$1 round=$2 dir=$OUTDIR/$1-$2 i owner_line=""
  mkdir -p "$dir/run"
  [[ $mode == workers ]] && owner_line="owner = $OWNER_UID"
  {
    printf '[node]\nruntime_dir = "%s/run"\nmetrics_addr = ""\n' "$dir"
    for i in $(seq "$MOUNTS"); do
      mkdir -p "$dir/m$i"
      printf '\n[[mount]]\nmountpoint = "%s/m%d"\nno_store = true\ndata_dir = "%s/d%d"\n%s\n' \
        "$dir" "$i" "$dir" "$i" "$owner_line"
    done
  } >"$dir/config.toml"
  local notify=$dir/notify.sock
  python3 - "$notify" >"$dir/ready" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(120)
msg = s.recv(4096).decode()
print(time.monotonic_ns() // 1_000_000, msg.splitlines()[0], flush=True)
EOF
  local listener=$!
  while [[ ! -S $notify ]]; do sleep 0.01; done
  local start_ms
  start_ms=$(python3 -c 'import time; print(time.monotonic_ns() // 1_000_000)')
  NOTIFY_SOCKET=$notify "$BIN_DIR/tierfs-daemon" node --config "$dir/config.toml" >"$dir/node.log" 2>&1 &
  local node=$!
  wait "$listener" || die "no READY=1 ($mode); see $dir/node.log"
  local ready_ms
  ready_ms=$(awk '{print $1}' "$dir/ready")
  sleep 1
  local rss_ready
  rss_ready=$(rss_kib "$node")
  for i in $(seq "$MOUNTS"); do
    python3 - "$dir/m$i" "$FILES" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for k in range(n):
    d = os.path.join(root, f"d{k // 100}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{k}"), "wb") as f:
        f.write(b"x" * 4096)
EOF
  done
  local rss_after procs
  rss_after=$(rss_kib "$node")
  procs=$((1 + $(pgrep -c -P "$node" || true)))
  kill -TERM "$node"
  wait "$node" || log "node exited non-zero ($mode, round $round); see $dir/node.log"
  echo "$mode $((ready_ms - start_ms)) $rss_ready $rss_after $procs"
}

log "binaries: $BIN_DIR; $MOUNTS mounts, $FILES files each, $ROUNDS rounds; output in $OUTDIR"
results=$OUTDIR/results.txt
for round in $(seq "$ROUNDS"); do
  for mode in in-process workers; do
    one_run "$mode" "$round" | tee -a "$results"
  done
done
python3 - "$results" "$MOUNTS" "$FILES" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
mounts, files = sys.argv[2], sys.argv[3]
by = {}
for mode, ready, rss0, rss1, procs in rows:
    by.setdefault(mode, []).append((int(ready), int(rss0), int(rss1), int(procs)))
med = {m: [statistics.median(c) for c in zip(*v)] for m, v in by.items()}
print(f"\n{mounts} mounts, {files} files written into each; medians of {len(by['workers'])} rounds")
print(f"| | processes | start to READY=1 | RSS when ready | RSS after the files |")
print(f"| --- | --- | --- | --- | --- |")
for m in ("in-process", "workers"):
    ready, rss0, rss1, procs = med[m]
    print(f"| {m} | {procs:.0f} | {ready:.0f} ms | {rss0/1024:.1f} MiB | {rss1/1024:.1f} MiB |")
w, p = med["workers"], med["in-process"]
print(f"| workers / in-process | | {w[0]/p[0]:.2f}x | {w[1]/p[1]:.2f}x | {w[2]/p[2]:.2f}x |")
EOF
