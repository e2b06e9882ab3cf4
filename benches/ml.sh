#!/usr/bin/env bash
# benches/ml.sh BIN_DIR [OUTDIR]
#
# Issue 24's benches in one command: the ML data path after a reset, each bench beside its
# peers, one after another (never two at once: each times what the 2 cores give it).
#   1. smallfiles.sh  the workspace and imagenet-like trees read back on a fresh node (walks,
#                     random reads by 8 workers, the hot set's refill), against raw parallel
#                     GETs, rclone and s3fs, on three moto replicas;
#   2. mmap.sh        a cold safetensors-like file walked through mmap in random page order,
#                     against a sequential cold read, with the hot and local-disk floors;
#   3. checkpoint.sh  a torch.save-style write (write, fsync, rename), against a plain
#                     directory and the raw PUT;
#   4. compare.sh     meta, untar and smallfile on the floor, bindfs, tierfs and tierfs on the
#                     embedded store;
#   5. metapin.sh     the metadata operations with the client and server placed three ways,
#                     beside the floor and the floor with a log.
# BIN_DIR holds a release build's tierfs, tierfs-daemon and tierfs-fuse-floor
# (`cargo build --release -p tierfs-daemon -p tierfs-fuse-floor`). Each bench's own knobs
# pass through the environment (see each script and benches/README.md); the defaults here are
# the sizes issue 24 names where this machine holds them: a 2 GiB mmap file, a 1 GiB
# checkpoint, the imagenet tree at smallfiles.sh's default (moto keeps objects in memory; the
# 100k tree runs with STORE=garage, see benches/README.md). BENCHES picks a subset
# ("smallfiles mmap checkpoint compare metapin"). Output: OUTDIR/<bench>/ (each bench's own
# output, table.md among it) and OUTDIR/summary.md (every table, in order). Needs root, as
# the benches do. A benchmark run by hand: nothing here is a test.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(cd "${1:?usage: benches/ml.sh BIN_DIR [OUTDIR]}" && pwd) || exit 1
OUTDIR=${2:-${TMPDIR:-/tmp}/tierfs-bench/ml/$(date +%Y%m%d-%H%M%S)}
BENCHES=${BENCHES:-smallfiles mmap checkpoint compare metapin}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
for bin in tierfs tierfs-daemon tierfs-fuse-floor; do
  [[ -x $BIN/$bin ]] || { echo "ml.sh: no $BIN/$bin (build with cargo build --release)" >&2; exit 1; }
done
log() { echo "[ml.sh $(date +%T)] $*" | tee -a "$OUTDIR/ml.log" >&2; }
SUMMARY=$OUTDIR/summary.md
{
  echo "# issue 24 benches, $(date -u +%FT%TZ), $(cat "$BIN/COMMIT" 2>/dev/null || echo "build in $BIN")"
  echo "$(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, load $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$SUMMARY"
failed=()

# run NAME CMD...: runs one bench with its output in OUTDIR/NAME and appends its table.
run() {
  local name=$1 out=$OUTDIR/$1 t0=$SECONDS
  shift
  mkdir -p "$out"
  log "$name: $*"
  if "$@" >"$out/stdout.txt" 2>"$out/stderr.txt"; then
    log "$name done in $((SECONDS - t0)) s"
  else
    log "$name FAILED after $((SECONDS - t0)) s (see $out/stderr.txt)"
    failed+=("$name")
  fi
  {
    echo
    echo "## $name ($((SECONDS - t0)) s)"
    echo
    if [[ -s $out/table.md ]]; then cat "$out/table.md"; else grep '^|' "$out/stdout.txt" || echo "(no table)"; fi
  } >>"$SUMMARY"
}

for bench in $BENCHES; do
  case $bench in
    smallfiles) run smallfiles "$HERE/smallfiles.sh" "$BIN" -- "$OUTDIR/smallfiles" ;;
    mmap) run mmap env SIZE_MIB="${SIZE_MIB:-2048}" CACHE_MIB="${CACHE_MIB:-4096}" "$HERE/mmap.sh" "$BIN" -- "$OUTDIR/mmap" ;;
    checkpoint) run checkpoint "$HERE/checkpoint.sh" "$BIN" -- "$OUTDIR/checkpoint" ;;
    compare)
      run compare env PEERS="bindfs floor tierfs tierfs_store" WORKLOADS="meta untar smallfile" \
        ROUNDS="${ROUNDS:-3}" TIERFS_BIN="$BIN/tierfs" FLOOR_BIN="$BIN/tierfs-fuse-floor" \
        "$HERE/compare.sh" "$OUTDIR/compare" ;;
    metapin) run metapin "$HERE/metapin.sh" "$BIN" "$OUTDIR/metapin" ;;
    *) log "unknown bench $bench (one of: smallfiles mmap checkpoint compare metapin)"; failed+=("$bench") ;;
  esac
done
log "summary: $SUMMARY"
((${#failed[@]} == 0)) || { log "failed: ${failed[*]}"; exit 1; }
