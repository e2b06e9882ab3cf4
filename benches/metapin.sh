#!/usr/bin/env bash
# benches/metapin.sh BIN_DIR [OUTDIR]
#
# Issue 24 item 5 (metadata operations at the FUSE floor), taken apart: runs benches/metacpu.py
# (create, rename and delete of FILES empty files in 100 directories) on four peers, each with
# the client and server placed three ways (`--pin none|same|split`, see metacpu.py), and prints
# one markdown table of median rates with tierfs's ratio to each floor. The peers:
#   floor        tierfs-fuse-floor: tierfs's FUSE settings, no work, nothing kept;
#   floor_log    the same with FLOOR_LOG: one 256-byte write(2) per change before the reply,
#                the least that tierfs's promise (an acknowledged change survives kill -9) costs;
#   floor_rocks  the floor with FLOOR_ROCKS: each change one RocksDB batch (WAL on, no sync)
#                before the reply, the namespace still served from memory (not run by default);
#   floor_behind the floor with FLOOR_LOG and FLOOR_ROCKS: the write(2) inline and RocksDB
#                written behind by a thread, WAL off (issue 48 item 3's design; not by default);
#   floor_pt     the floor with FLOOR_PASSTHROUGH: each file created with a backing file on the
#                local disk and opened through passthrough, as tierfs creates (not by default);
#   tierfs       `tierfs mount --data-dir` (no store);
#   tierfs_store `tierfs mount` on the embedded default store (what a user's `tierfs mount
#                ~/tierfs` gives: the journal and uploads run beside the operations).
# BIN_DIR holds tierfs, tierfs-daemon and tierfs-fuse-floor (a release build:
# `cargo build --release -p tierfs -p tierfs-daemon -p tierfs-fuse-floor`).
# Env: FILES [10000], ROUNDS [3] (metacpu rounds per peer and placement), PINS ["none same split"],
#      PEERS ["floor floor_log tierfs tierfs_store"].
# Needs python3 and fuse3. A benchmark run by hand: nothing here is a test.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "${1:?usage: benches/metapin.sh BIN_DIR [OUTDIR]}" && pwd)
OUTDIR=${2:-${TMPDIR:-/tmp}/tierfs-bench/metapin/$(date +%Y%m%d-%H%M%S)}
FILES=${FILES:-10000}
ROUNDS=${ROUNDS:-3}
PINS=${PINS:-none same split}
PEERS=${PEERS:-floor floor_log tierfs tierfs_store}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-metapin.XXXXXX")
RESULTS=$OUTDIR/metapin.jsonl
: >"$RESULTS"
log() { echo "[metapin.sh $(date +%T)] $*" >&2; }
FLOOR_PID='' MNT='' CUR=''
cleanup() {
  [[ -n $MNT ]] && umount_peer "$CUR"
  [[ -n $FLOOR_PID ]] && kill "$FLOOR_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

# mount PEER: mounts a fresh instance of PEER; sets MNT and SERVER (the PID answering it).
mount_peer() {
  local peer=$1 i
  CUR=$peer MNT=$WORK/mnt-$peer
  mkdir -p "$MNT"
  case $peer in
    floor | floor_log | floor_rocks | floor_behind | floor_pt)
      rm -rf "$WORK/floor.log" "$WORK/floor.rocks" "$WORK/floor.pt"
      local env=()
      [[ $peer == floor_pt ]] && mkdir -p "$WORK/floor.pt" && env+=("FLOOR_PASSTHROUGH=$WORK/floor.pt")
      [[ $peer == floor_log || $peer == floor_behind ]] && env+=("FLOOR_LOG=$WORK/floor.log")
      [[ $peer == floor_rocks || $peer == floor_behind ]] && env+=("FLOOR_ROCKS=$WORK/floor.rocks")
      env "${env[@]}" "$BIN/tierfs-fuse-floor" "$MNT" >>"$OUTDIR/floor.log" 2>&1 &
      FLOOR_PID=$! SERVER=$!
      for i in $(seq 100); do mountpoint -q "$MNT" && return 0; sleep 0.1; done
      return 1 ;;
    tierfs | tierfs_store)
      rm -rf "$WORK/tierfs-data"
      export TIERFS_BIN=$BIN/tierfs TIERFS_DATA=$WORK/tierfs-data TIERFS_MNT=$MNT TIERFS_RUN=$WORK/tierfs-run
      export OUTDIR TIERFS_EMBEDDED=$([[ $peer == tierfs_store ]] && echo 1 || echo 0)
      "$HERE/tierfs-peer.sh" mount >/dev/null || return 1
      SERVER=$(cat "$TIERFS_RUN/bench.pid") ;;
  esac
}

umount_peer() {
  case $1 in
    floor | floor_log | floor_rocks | floor_behind | floor_pt)
      fusermount3 -u "$MNT"; wait "$FLOOR_PID" 2>/dev/null; FLOOR_PID='' ;;
    tierfs | tierfs_store) "$HERE/tierfs-peer.sh" umount >/dev/null 2>&1 ;;
  esac
  MNT=''
}

log "peers: $PEERS; placements: $PINS; $FILES files, $ROUNDS rounds each; results in $OUTDIR"
for pin in $PINS; do
  for peer in $PEERS; do
    # A fresh mount per placement: a pinned server stays pinned.
    mount_peer "$peer" || { log "ERROR: mounting $peer failed (logs in $OUTDIR)"; exit 1; }
    log "$peer, --pin $pin"
    python3 "$HERE/metacpu.py" "$MNT" "$SERVER" --files "$FILES" --rounds "$ROUNDS" --pin "$pin" --json |
      python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); r["peer"] = sys.argv[1]; print(json.dumps(r), flush=True)' "$peer" >>"$RESULTS" ||
      { log "ERROR: metacpu.py failed on $peer"; exit 1; }
    umount_peer "$peer"
  done
done

python3 - "$RESULTS" <<'EOF' | tee "$OUTDIR/table.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(peer, pin, phase, key):
    v = [r[key] for r in rows if (r["peer"], r["pin"], r["phase"]) == (peer, pin, phase)]
    return statistics.median(v) if v else None
peers = list(dict.fromkeys(r["peer"] for r in rows))
pins = list(dict.fromkeys(r["pin"] for r in rows))
# The floors with RocksDB, when run, against the floor.
extra = [(p, "floor") for p in ("floor_rocks", "floor_behind", "floor_pt") if p in peers]
if "floor_pt" in peers and "tierfs" in peers:
    extra.append(("tierfs", "floor_pt"))
print("| placement | operation | " + " | ".join(f"{p} ops/s (server us/op)" for p in peers) + " | tierfs/floor | tierfs/floor_log | tierfs_store/floor_log |"
      + "".join(f" {a}/{b} |" for a, b in extra))
print("|---|---|" + "---:|" * (len(peers) + 3 + len(extra)))
for pin in pins:
    for phase in ("create", "rename", "delete"):
        cells = []
        for p in peers:
            o, c = med(p, pin, phase, "ops_s"), med(p, pin, phase, "server_cpu_us_per_op")
            cells.append("-" if o is None else f"{o:.0f} ({c:.0f})")
        def ratio(a, b):
            x, y = med(a, pin, phase, "ops_s"), med(b, pin, phase, "ops_s")
            return "-" if x is None or y is None else f"{x / y:.2f}"
        print(f"| {pin} | {phase} | " + " | ".join(cells)
              + f" | {ratio('tierfs', 'floor')} | {ratio('tierfs', 'floor_log')} | {ratio('tierfs_store', 'floor_log')} |"
              + "".join(f" {ratio(a, b)} |" for a, b in extra))
print(f"\nMedians of {len({r['round'] for r in rows})} rounds; server us/op is the server's CPU (user + system) per operation.")
EOF
