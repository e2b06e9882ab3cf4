#!/usr/bin/env bash
# benches/ab.sh A_BIN_DIR B_BIN_DIR [OUTDIR]
#
# Two builds of tierfs, one beside the other: compare.sh's metadata workloads and cold.sh's
# write to the store and cold read, in alternated rounds (A, B, A, B, ...), so that a change
# meant to leave speed alone (a refactor) can show it did. Each BIN_DIR holds `tierfs` and
# `tierfs-daemon` (release builds: `cargo build --release -p tierfs-daemon --bins` in a
# checkout of each commit, copied out). Prints, for every timing and rate the runs report,
# the median of A's rounds, of B's, and B/A. A benchmark run by hand: nothing here is a test.
#
# Env (knobs):
#   ROUNDS [2]            rounds per build
#   WORKLOADS ["meta untar"]  compare.sh workloads (its other knobs pass through)
#   AB_PEER [tierfs]      compare.sh's peer the builds run as: tierfs (no store) or
#                         tierfs_store (the embedded default store)
#   COLD [1]              also run cold.sh (against moto) in every round; 0 skips it
#   SIZE_MIB [256] CACHE_MIB [64]  cold.sh's sizes (smaller than its defaults: a round is quick)
# Output in OUTDIR (default ${TMPDIR:-/tmp}/tierfs-bench/ab/<date>): one directory per run
#   (compare-A-1, cold-B-2, ...) with what compare.sh and cold.sh write there, and table.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[[ $# -ge 2 ]] || { sed -n '2,19p' "$0" >&2; exit 2; }
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
for dir in "$A" "$B"; do
  for bin in tierfs tierfs-daemon; do
    [[ -x $dir/$bin ]] || { echo "ab.sh: $dir/$bin is missing" >&2; exit 1; }
  done
done
OUTDIR=${3:-${TMPDIR:-/tmp}/tierfs-bench/ab/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
ROUNDS=${ROUNDS:-2}
export WORKLOADS=${WORKLOADS:-"meta untar"}
{
  echo "A: $A ($("$A/tierfs" --version 2>/dev/null || echo '?'))"
  echo "B: $B ($("$B/tierfs" --version 2>/dev/null || echo '?'))"
  echo "rounds: $ROUNDS; workloads: $WORKLOADS; cold: ${COLD:-1}"
} | tee "$OUTDIR/env.txt"

for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    dir=$A
    [[ $side == B ]] && dir=$B
    echo "ab.sh: round $round, $side: compare.sh" >&2
    PEERS=${AB_PEER:-tierfs} TIERFS_BIN=$dir/tierfs "$HERE/compare.sh" "$OUTDIR/compare-$side-$round" >"$OUTDIR/compare-$side-$round.out" 2>&1 ||
      echo "ab.sh: compare.sh failed in round $round ($side): see $OUTDIR/compare-$side-$round.out" >&2
    if [[ ${COLD:-1} == 1 ]]; then
      echo "ab.sh: round $round, $side: cold.sh" >&2
      TIERFS_BIN_DIR=$dir PEERS="" COLD_FLOOR=0 ROUNDS=1 SIZE_MIB=${SIZE_MIB:-256} CACHE_MIB=${CACHE_MIB:-64} \
        "$HERE/cold.sh" "$OUTDIR/cold-$side-$round" >"$OUTDIR/cold-$side-$round.out" 2>&1 ||
        echo "ab.sh: cold.sh failed in round $round ($side): see $OUTDIR/cold-$side-$round.out" >&2
    fi
  done
done

python3 - "$OUTDIR" "${AB_PEER:-tierfs}" <<'PY' | tee "$OUTDIR/table.md"
import glob, json, os, re, statistics, sys
out, peer = sys.argv[1], sys.argv[2]

def leaves(prefix, value, into):
    """Every numeric leaf of a JSON value, by dotted path."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        into[prefix] = float(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            leaves(f"{prefix}.{k}" if prefix else k, v, into)

runs = {}  # (side, round) -> {metric: value}
for path in glob.glob(os.path.join(out, "compare-*-*", peer + ".jsonl")):
    side, rnd = re.search(r"compare-([AB])-(\d+)", path).groups()
    m = runs.setdefault((side, rnd), {})
    for line in open(path):
        row = json.loads(line)
        leaves(row["workload"], row.get("metrics", {}), m)
for path in glob.glob(os.path.join(out, "cold-*-*", "results.json")):
    side, rnd = re.search(r"cold-([AB])-(\d+)", path).groups()
    res = json.load(open(path)).get("results", {})
    m = runs.setdefault((side, rnd), {})
    for name, value in res.items():
        if name.startswith("tierfs") and isinstance(value, dict):
            leaves("cold." + name, value, m)

# Rates and times only: counts, return codes and sizes are the same on both sides.
keep = re.compile(r"(_s|_per_s|ops_s|mib_s|MiB_s|bw|iops|rate|seconds)$", re.IGNORECASE)
metrics = sorted({k for m in runs.values() for k in m if keep.search(k)})
print("| metric | A (median) | B (median) | B/A | A rounds | B rounds |")
print("| --- | ---: | ---: | ---: | --- | --- |")
for k in metrics:
    vals = {s: [m[k] for (side, _), m in sorted(runs.items()) if side == s and k in m] for s in "AB"}
    if not vals["A"] or not vals["B"]:
        continue
    a, b = statistics.median(vals["A"]), statistics.median(vals["B"])
    ratio = f"{b / a:.2f}" if a else "-"
    fmt = lambda xs: ", ".join(f"{x:.3g}" for x in xs)
    print(f"| {k} | {a:.4g} | {b:.4g} | {ratio} | {fmt(vals['A'])} | {fmt(vals['B'])} |")
PY
