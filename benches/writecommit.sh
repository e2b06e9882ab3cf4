#!/usr/bin/env bash
# benches/writecommit.sh: the cost of a FUSE write's metadata commit (issue 48 item 2), two
# builds side by side. fio 4k random writes into one 256 MiB file, without and with an fsync
# per write, on a `--no-store` mount and on a mount with a `file://` store (where a write
# that turns a chunk dirty also commits its unsealed mark), rounds interleaved, medians.
# Also prints the metadata commits per write the mount's status reports (`meta_commits`,
# builds that have it). Never pass/fail.
#
#   benches/writecommit.sh BIN_DIR_A BIN_DIR_B [ROUNDS]
#
# Each BIN_DIR holds `tierfs` and `tierfs-daemon`. Runs as root; writes under $WORK
# (default /var/tmp/writecommit).
set -euo pipefail

A=${1:?BIN_DIR_A}
B=${2:?BIN_DIR_B}
ROUNDS=${3:-3}
WORK=${WORK:-/var/tmp/writecommit}
RUNTIME=${RUNTIME:-8}
export TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test

log() { echo "[writecommit] $*" >&2; }

# one BIN_DIR MODE FSYNC: prints "iops commits_per_write" for one fio run.
one() {
  local bin=$1 mode=$2 fsync=$3 dir
  dir=$(mktemp -d "$WORK/run.XXXX")
  mkdir -p "$dir/mnt"
  local args=(--data-dir "$dir/data")
  if [[ $mode == store ]]; then
    "$bin/tierfs" init --store "$dir/store.toml" --backend "file://$dir/backend" >/dev/null 2>&1
    args+=(--store "$dir/store.toml")
  else
    args+=(--no-store)
  fi
  "$bin/tierfs" mount "${args[@]}" "$dir/mnt" >/dev/null
  local before after writes
  before=$("$bin/tierfs" --json status "$dir/mnt" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("meta_commits", -1))')
  fio --name=w --filename="$dir/mnt/f" --size=256M --bs=4k --rw=randwrite --ioengine=psync \
    --fsync="$fsync" --time_based --runtime="$RUNTIME" --output-format=json >"$dir/fio.json" 2>/dev/null
  after=$("$bin/tierfs" --json status "$dir/mnt" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("meta_commits", -1))')
  python3 - "$dir/fio.json" "$before" "$after" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]["write"]
before, after = int(sys.argv[2]), int(sys.argv[3])
per = "n/a" if before < 0 else "%.3f" % ((after - before) / max(job["total_ios"], 1))
print("%.0f %s" % (job["iops"], per))
EOF
  "$bin/tierfs" umount "$dir/mnt" >/dev/null 2>&1 || umount -l "$dir/mnt"
  rm -rf "$dir"
}

mkdir -p "$WORK"
declare -A results
for r in $(seq "$ROUNDS"); do
  for mode in nostore store; do
    for fsync in 0 1; do
      for side in A B; do
        bin=$A; [[ $side == B ]] && bin=$B
        out=$(one "$bin" "$mode" "$fsync")
        log "round $r $mode fsync=$fsync $side: iops commits/write = $out"
        results[$side.$mode.$fsync]+="$out;"
      done
    done
  done
done
echo "| mount | fsync per write | A iops (median) | B iops (median) | B/A | commits/write A | commits/write B |"
echo "|---|---|---:|---:|---:|---:|---:|"
for mode in nostore store; do
  for fsync in 0 1; do
    python3 - "$mode" "$fsync" "${results[A.$mode.$fsync]}" "${results[B.$mode.$fsync]}" <<'EOF'
import statistics, sys
mode, fsync, a, b = sys.argv[1:]
def parse(s):
    runs = [x.split() for x in s.strip(";").split(";")]
    return statistics.median(float(x[0]) for x in runs), [x[1] for x in runs]
ia, ca = parse(a); ib, cb = parse(b)
print("| %s | %s | %.0f | %.0f | %.2f | %s | %s |" % (mode, "yes" if fsync == "1" else "no", ia, ib, ib / ia, ",".join(ca), ",".join(cb)))
EOF
  done
done
