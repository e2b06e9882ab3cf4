#!/usr/bin/env bash
# benches/env.sh BIN_DIR... [-- OUTDIR]
#
# Issue 47's bench: after a runtime reset, the time from `tierfs mount` to a finished
# `import pandas` (the heaviest stack the environment wheelhouse holds: pandas, numpy,
# dateutil, pytz, tzdata) from a virtualenv kept in the workspace, with the refill and with
# `--no-refill`, against what a runtime without it does: a fresh `pip install --no-index` of
# the same wheels from the local wheelhouse into a venv on the local disk, then the same
# import; and a fresh `pip install` of the same pinned versions from the package index with no
# pip cache, when the index answers (what a user after a reset really does). Also the same
# import on a warm node (the writer's own data dir mounted again), and the floor: the same
# import from a venv on the local disk with no tierfs at all, which bounds how much faster than
# a reinstall any kept environment can be. For each build given (a directory with `tierfs` and
# `tierfs-daemon`), on the embedded store (`file://`) and on one local moto server.
#
# Per build and store: a writer mounts a fresh workspace, makes the venv in it
# (`python3 -m venv --system-site-packages`, as `tierfs.mount(env=True)` does), pip installs
# the wheels into it, imports pandas, syncs and unmounts; a second session on the same node
# imports pandas (its hot set records that import's reads first) and unmounts. Then ROUNDS
# of: a warm mount + import; a reset (fresh data dir) + mount + import with the refill; the
# same with `--no-refill`. The page cache is dropped before every mount. Prints a markdown
# table of medians; a benchmark run by hand, nothing here is a test.
#
# `tierfs status --json` right after each reset import is kept as
# OUTDIR/status-b<build>-<store>-r<round>-{refill,norefill}.json (what the refill had
# fetched by then, the misses), and that daemon's log as daemon-….log (with
# RUST_LOG=info,tierfs::backend=trace it has every store request, timed); env.log has the
# UTC times each mount started and returned and each import ended, moto.log moto's requests.
# Env (knobs):
#   ROUNDS [3]           rounds of each measurement
#   WHEELS [/var/lib/tierfs-test-tools/python-env-wheels]   the wheelhouse
#   STORES ["file moto"] which stores ("": the reinstalls and the floor only)
#   CACHE_MIB [2048]     tierfs --cache-size
#   INDEX [1]            0: no reinstall from the package index
# Needs root (drop_caches), python3 with venv, bc, curl, fuse3, and moto as
# scripts/setup-debian.sh installs it (MOTO_SERVER to override). Everything started here is
# stopped on exit.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILDS=()
while (($# > 0)) && [[ $1 != -- ]]; do BUILDS+=("$(cd "$1" && pwd)"); shift; done
[[ ${1:-} == -- ]] && shift
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/env/$(date +%Y%m%d-%H%M%S)}
ROUNDS=${ROUNDS:-3}
WHEELS=${WHEELS:-/var/lib/tierfs-test-tools/python-env-wheels}
STORES=${STORES-file moto}
CACHE_MIB=${CACHE_MIB:-2048}
PACKAGES=(pandas tabulate more-itertools markupsafe)
MOTO_SERVER=${MOTO_SERVER:-/var/lib/tierfs-test-tools/moto-venv/bin/moto_server}
BENCH_PY=${BENCH_PY:-$(dirname "$MOTO_SERVER")/python}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
BUCKET=env-bench
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/env.log
: >"$LOG"
log() { echo "[env.sh $(date +%T)] $*" | tee -a "$LOG" >&2; }
die() { log "ERROR: $*"; exit 1; }
((${#BUILDS[@]} > 0)) || die "usage: benches/env.sh BIN_DIR... [-- OUTDIR]"
[[ -d $WHEELS ]] || die "no wheelhouse at $WHEELS (scripts/setup-debian.sh makes it)"
# shellcheck source=benches/lib.sh
source "$HERE/lib.sh"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-env.XXXXXX")
MOTO_PID='' TMNT='' TBIN=''
cleanup() {
  [[ -n $TMNT ]] && mountpoint -q "$TMNT" && { t umount "$TMNT" >>"$LOG" 2>&1 || fusermount3 -u "$TMNT"; }
  [[ -n $MOTO_PID ]] && kill "$MOTO_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }

[[ " $STORES " == *" moto "* ]] && start_moto

# mount_at DATA [OPTIONS...]: mounts store $STORE on data dir DATA at $WORK/mnt
mount_at() {
  local data=$1
  shift
  TMNT=$WORK/mnt
  mkdir -p "$TMNT"
  t mount --store "$STORE" --cache-size "${CACHE_MIB}M" --data-dir "$data" "$@" "$TMNT" >>"$LOG" 2>&1 ||
    die "mount failed (see $LOG)"
}
umount_t() { t umount --timeout 300 "$TMNT" >>"$LOG" 2>&1 || die "umount failed"; TMNT=''; }
import_pandas() { "$TMNT/.tierfs/env/bin/python" -c 'import pandas' >>"$LOG" 2>&1 || die "import pandas failed"; }

# session KEY DATA [OPTIONS...]: drop caches, mount, import; RESULT[KEY] = mount to imported,
# RESULT[KEY-import] = the import alone
declare -A RESULT=()
session() {
  local key=$1 t0 t1 t2
  shift
  drop_caches
  t0=$(now)
  mount_at "$@"
  t1=$(now)
  import_pandas
  t2=$(now)
  RESULT[$key]=$(secs "$t0" "$t2")
  RESULT[$key-import]=$(secs "$t1" "$t2")
  # To line up with the daemon's log (kept in OUTDIR) and moto's.
  echo "[env.sh] $key: mount started $(date -u -d "@$t0" +%T.%6N), returned $(date -u -d "@$t1" +%T.%6N), imported $(date -u -d "@$t2" +%T.%6N) UTC" >>"$LOG"
}

setup_workspace() {
  local url
  case $S in
    file) url="file://$WORK/objects-$B" ;;
    moto) url="s3://$BUCKET/b$B?endpoint=$S3_ENDPOINT&region=us-east-1" ;;
  esac
  STORE=$WORK/store-$B-$S
  t init --store "$STORE" --backend "$url" >>"$LOG" 2>&1 || die "init failed (see $LOG)"
  mount_at "$WORK/data-$B-$S-w"
  mkdir -p "$TMNT/.tierfs"
  python3 -m venv --system-site-packages "$TMNT/.tierfs/env" >>"$LOG" 2>&1 || die "venv failed"
  "$TMNT/.tierfs/env/bin/python" -m pip install --quiet --no-index --disable-pip-version-check \
    --find-links "$WHEELS" "${PACKAGES[@]}" >>"$LOG" 2>&1 || die "pip install into the env failed"
  import_pandas
  t sync "$TMNT" >>"$LOG" 2>&1 || die "sync failed"
  umount_t
  # A session that imports: the workspace's usual first cell, whose reads the hot set records.
  session "$B,$S,use" "$WORK/data-$B-$S-w"
  umount_t
}

for B in "${!BUILDS[@]}"; do
  TBIN=${BUILDS[$B]}
  log "build $B: $TBIN ($(cat "$TBIN/COMMIT" 2>/dev/null || echo '?'))"
  for S in $STORES; do
    setup_workspace
    for r in $(seq "$ROUNDS"); do
      session "$B,$S,warm,$r" "$WORK/data-$B-$S-w"
      umount_t
      for mode in refill norefill; do
        data=$WORK/data-$B-$S-$mode-$r
        opts=()
        [[ $mode == norefill ]] && opts=(--no-refill)
        session "$B,$S,$mode,$r" "$data" "${opts[@]}"
        t status --json "$TMNT" >"$OUTDIR/status-b$B-$S-r$r-$mode.json" 2>>"$LOG"
        umount_t
        cp "$data/daemon.log" "$OUTDIR/daemon-b$B-$S-r$r-$mode.log" 2>>"$LOG"
        rm -rf "$data"
      done
      log "build $B $S round $r: warm ${RESULT[$B,$S,warm,$r]} s, reset+refill ${RESULT[$B,$S,refill,$r]} s," \
        "reset --no-refill ${RESULT[$B,$S,norefill,$r]} s (mount to imported)"
    done
  done
done
# What a runtime without the env does after a reset, and the floor. Per round, page cache
# dropped before each: a fresh venv on the local disk with the same wheels installed from the
# local wheelhouse, then the same import (reinstall); the same import again from that venv,
# no tierfs and nothing installed (the floor: what any env costs to import from this disk);
# and the same pinned versions (`pip freeze` of that venv) installed from the index with no
# pip cache (what a user after a reset really does), skipped with a line when the index does
# not answer or INDEX=0.
reachable_index() {
  [[ ${INDEX:-1} != 0 ]] || return 1
  env -u PIP_FIND_LINKS "$WORK/reinstall/bin/python" -m pip download --no-cache-dir --no-deps --quiet -d "$WORK/probe" \
    "$(head -1 "$WORK/pins.txt")" >>"$LOG" 2>&1
}
fresh_venv() {
  rm -rf "$1"
  python3 -m venv --system-site-packages "$1" >>"$LOG" 2>&1 || die "venv failed"
}
for r in $(seq "$ROUNDS"); do
  drop_caches
  t0=$(now)
  fresh_venv "$WORK/reinstall"
  "$WORK/reinstall/bin/python" -m pip install --quiet --no-index --disable-pip-version-check \
    --find-links "$WHEELS" "${PACKAGES[@]}" >>"$LOG" 2>&1 || die "pip install failed"
  "$WORK/reinstall/bin/python" -c 'import pandas' >>"$LOG" 2>&1 || die "import pandas failed"
  RESULT[reinstall,$r]=$(secs "$t0" "$(now)")
  drop_caches
  t0=$(now)
  "$WORK/reinstall/bin/python" -c 'import pandas' >>"$LOG" 2>&1 || die "import pandas failed"
  RESULT[floor,$r]=$(secs "$t0" "$(now)")
  log "round $r: reinstall from the wheelhouse ${RESULT[reinstall,$r]} s, floor (import from a local venv) ${RESULT[floor,$r]} s"
done
"$WORK/reinstall/bin/python" -m pip freeze --local >"$WORK/pins.txt" 2>>"$LOG" || die "pip freeze failed"
INDEXED=0
if reachable_index; then
  INDEXED=1
  for r in $(seq "$ROUNDS"); do
    drop_caches
    t0=$(now)
    fresh_venv "$WORK/reinstall-index"
    # PIP_FIND_LINKS (a machine's local wheels) would let pip skip the download.
    env -u PIP_FIND_LINKS -u PIP_NO_INDEX "$WORK/reinstall-index/bin/python" -m pip install --quiet \
      --no-cache-dir --disable-pip-version-check -r "$WORK/pins.txt" >>"$LOG" 2>&1 ||
      die "pip install from the index failed (see $LOG)"
    "$WORK/reinstall-index/bin/python" -c 'import pandas' >>"$LOG" 2>&1 || die "import pandas failed"
    RESULT[index,$r]=$(secs "$t0" "$(now)")
    log "round $r: reinstall from the index ${RESULT[index,$r]} s"
  done
else
  log "the package index did not answer (or INDEX=0): no reinstall from the index measured"
fi

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
med() {
  local v=() r
  for r in $(seq "$ROUNDS"); do v+=("${RESULT[$1,$r]}"); done
  median "${v[@]}"
}
medi() {
  local v=() r
  for r in $(seq "$ROUNDS"); do v+=("${RESULT[$1,$r-import]}"); done
  median "${v[@]}"
}
reinstall=$(med reinstall) floor=$(med floor) index=''
((INDEXED)) && index=$(med index)
ratio() { [[ -n $1 ]] && printf '%.1fx' "$(echo "$1 / $2" | bc -l)" || echo -; }
{
  echo "| build, store | warm: mount to imported (import alone) | reset + refill | reset, --no-refill | wheelhouse reinstall / reset+refill | index reinstall / reset+refill | reset+refill / floor | reset import / warm import (refill; no refill) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  for B in "${!BUILDS[@]}"; do
    for S in $STORES; do
      w=$(med "$B,$S,warm") wi=$(medi "$B,$S,warm")
      f=$(med "$B,$S,refill") fr=$(medi "$B,$S,refill")
      n=$(med "$B,$S,norefill") ni=$(medi "$B,$S,norefill")
      printf '| %s (%s), %s | %.2f s (%.2f) | %.2f s (%.2f) | %.2f s (%.2f) | %s | %s | %s | %.2f; %.2f |\n' \
        "${BUILDS[$B]}" "$(cat "${BUILDS[$B]}/COMMIT" 2>/dev/null || echo '?')" "$S" "$w" "$wi" "$f" "$fr" "$n" "$ni" \
        "$(ratio "$reinstall" "$f")" "$(ratio "$index" "$f")" "$(ratio "$f" "$floor")" \
        "$(echo "$fr / $wi" | bc -l)" "$(echo "$ni / $wi" | bc -l)"
    done
  done
  echo
  echo "reinstall from the wheelhouse (fresh venv on the local disk + pip install --no-index of ${PACKAGES[*]} + import pandas): $(printf '%.2f' "$reinstall") s"
  if ((INDEXED)); then
    echo "reinstall from the index (the same pinned versions, --no-cache-dir): $(printf '%.2f' "$index") s"
  else
    echo "reinstall from the index: not measured (the index did not answer, or INDEX=0)"
  fi
  echo "floor (import pandas from that venv on the local disk, page cache dropped, no tierfs): $(printf '%.2f' "$floor") s;" \
    "the most any env can be faster than the wheelhouse reinstall: $(ratio "$reinstall" "$floor")" \
    "$( ((INDEXED)) && echo "(than the index reinstall: $(ratio "$index" "$floor"))")"
  echo "medians of $ROUNDS rounds; page cache dropped before each; cache ${CACHE_MIB} MiB; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUTDIR/table.md"
