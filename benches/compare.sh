#!/usr/bin/env bash
# benches/compare.sh [OUTDIR]
#
# Builds tierfs (release), then runs the same workloads (harness/workloads.sh) on every peer in
# one go -- same machine, same minute -- and prints a table of each metric with its ratio to
# `local` (plain directory) and to `bindfs` (passthrough FUSE), plus a check of tierfs against
# its performance targets (see benches/README.md). The `floor` peer (benches/fuse-floor) is FUSE
# with tierfs's settings and no work at all: the most any FUSE filesystem reaches here, so the
# target table also gives the floor's ratio and tierfs's share of it.
#
# Env:
#   PEERS       "local bindfs floor tierfs" (default). Optional: tierfs_store (tierfs on the
#               embedded default store, as `tierfs mount ~/tierfs` gives a user: every change
#               also goes to a local encrypted store), tierfs_enc (the same with the cache
#               encrypted at rest, --encrypt-cache), floor_pt (the floor with FUSE passthrough to
#               a backing file per file: the kernel's passthrough cost alone), tierfs_nopt (tierfs without a store
#               and with --no-passthrough: every read through the daemon, beside `tierfs`,
#               whose hot files the kernel reads through FUSE passthrough when run as root);
#               S3 peers rclone, s3fs (need an S3 server, see S3_BACKEND).
#   S3_BACKEND  none (default unless PEERS has rclone or s3fs, then garage1) | garage1 | garage3
#               | moto | s3sfs -- S3 server for rclone/s3fs, started by harness/servers/start_*.sh
#   BENCH_ROOT  [${TMPDIR:-/tmp}/tierfs-bench] mounts, source dirs, tierfs data dirs, tarball
#   TIERFS_BIN  use this `tierfs` binary and skip the build (tierfs-daemon must sit next to it)
#   FLOOR_BIN   use this tierfs-fuse-floor binary and skip its build
#   SKIP_BUILD=1  don't run cargo; use the binary already in the cargo target dir
#   TIERFS_MOUNT_OPTS  extra `tierfs mount` options, e.g. "--threads 4" or "--no-writeback-cache"
#   TIERFS_COLD_CMD / TIERFS_COLD_NOTE  what fio_coldread does to tierfs first. Default: only
#               drop the page cache (tierfs mounts here without a store; cold.sh measures cold
#               reads from one), noted in the table.
#   PEER_MOUNT_<peer> / PEER_UMOUNT_<peer>  commands to mount/unmount a peer (override the
#               built-in ones); the mount command must print the mountpoint on stdout
#   ROUNDS      [1] run every peer this many times, interleaved (local, bindfs, tierfs, local,
#               ...); the table shows medians and judges the targets on the median of the
#               per-round ratios, listing each round's (harness/table.py)
#   + every knob of harness/workloads.sh: FIO_SIZE [1G], FIO_RAND_S [20], META_FILES [10000],
#     SMALL_FILES [2000], PHASE_MAX_S [60 here], WORKLOADS (subset, space-separated)
# Output: OUTDIR/<peer>.jsonl (raw), OUTDIR/<peer>.log (workload log), OUTDIR/*.fio.json,
#   OUTDIR/tierfs-daemon.log (the daemon's log), OUTDIR/table.md (the table), OUTDIR/env.txt.
# Needs: fio, bindfs, fuse3, python3 (scripts/setup-debian.sh installs them), root for
#   dropping the page cache (without it caches are not dropped and reads are warmer).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
H=$HERE/harness
OUTDIR=${1:-${TMPDIR:-/tmp}/tierfs-bench/results/$(date +%Y%m%d-%H%M%S)}
PEERS=${PEERS:-"local bindfs floor tierfs"}
case " $PEERS " in
  *" rclone "* | *" s3fs "*) S3_BACKEND=${S3_BACKEND:-garage1} ;;
  *) S3_BACKEND=${S3_BACKEND:-none} ;;
esac
export BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
export PHASE_MAX_S=${PHASE_MAX_S:-60}
export TARBALL=${TARBALL:-$BENCH_ROOT/tree.tar}
mkdir -p "$OUTDIR" "$BENCH_ROOT"
OUTDIR=$(cd "$OUTDIR" && pwd)
export OUTDIR
# shellcheck source=harness/peers.sh
. "$H/peers.sh"

for tool in fio python3; do
  command -v "$tool" >/dev/null || { echo "compare.sh: $tool missing (scripts/setup-debian.sh)" >&2; exit 1; }
done
[[ " $PEERS " == *" bindfs "* ]] && ! command -v bindfs >/dev/null &&
  { echo "compare.sh: bindfs missing (scripts/setup-debian.sh)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || echo "compare.sh: WARNING: not root, page cache drops will silently fail" >&2

# --- tierfs: build + mount/unmount commands -----------------------------------------------
if [[ " $PEERS " == *" tierfs "* || " $PEERS " == *" tierfs_store "* || " $PEERS " == *" tierfs_enc "* ||
      " $PEERS " == *" tierfs_nopt "* ]]; then
  if [[ -z ${TIERFS_BIN:-} ]]; then
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
      echo "=== building tierfs (release)" >&2
      # -p: the workspace root is the `tierfs` library package, so a bare --bins builds nothing
      (cd "$REPO" && cargo build --release -p tierfs-daemon --bins) >&2 ||
        { echo "compare.sh: cargo build failed" >&2; exit 1; }
    fi
    tdir=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])') ||
      { echo "compare.sh: cargo metadata failed" >&2; exit 1; }
    TIERFS_BIN=$tdir/release/tierfs
  fi
  [[ -x $TIERFS_BIN && -x $(dirname "$TIERFS_BIN")/tierfs-daemon ]] ||
    { echo "compare.sh: $TIERFS_BIN or tierfs-daemon next to it missing" >&2; exit 1; }
  export TIERFS_BIN TIERFS_MOUNT_OPTS=${TIERFS_MOUNT_OPTS:-}
  # a fresh data dir for every run; own runtime dir so that other tierfs mounts on this machine
  # (tests, other users) are never touched
  TIERFS_DATA=$BENCH_ROOT/tierfs-data/$(date +%Y%m%d-%H%M%S)-$$
  export TIERFS_DATA TIERFS_MNT=$BENCH_ROOT/mnt/tierfs-cmp TIERFS_RUN=$BENCH_ROOT/tierfs-run
  PEER_MOUNT_tierfs=${PEER_MOUNT_tierfs:-"'$HERE/tierfs-peer.sh' mount"}
  PEER_UMOUNT_tierfs=${PEER_UMOUNT_tierfs:-"'$HERE/tierfs-peer.sh' umount"}
  export PEER_MOUNT_tierfs PEER_UMOUNT_tierfs
  # The embedded-store variant: its own mountpoint and data root, same binary and options.
  store_env="TIERFS_EMBEDDED=1 TIERFS_MNT=$BENCH_ROOT/mnt/tierfs-store-cmp TIERFS_DATA=\$TIERFS_DATA-store"
  PEER_MOUNT_tierfs_store=${PEER_MOUNT_tierfs_store:-"$store_env '$HERE/tierfs-peer.sh' mount"}
  PEER_UMOUNT_tierfs_store=${PEER_UMOUNT_tierfs_store:-"$store_env '$HERE/tierfs-peer.sh' umount"}
  export PEER_MOUNT_tierfs_store PEER_UMOUNT_tierfs_store
  # The same with the cache encrypted at rest.
  enc_env="TIERFS_EMBEDDED=1 TIERFS_MNT=$BENCH_ROOT/mnt/tierfs-enc-cmp TIERFS_DATA=\$TIERFS_DATA-enc"
  enc_env+=" TIERFS_MOUNT_OPTS='$TIERFS_MOUNT_OPTS --encrypt-cache'"
  PEER_MOUNT_tierfs_enc=${PEER_MOUNT_tierfs_enc:-"$enc_env '$HERE/tierfs-peer.sh' mount"}
  PEER_UMOUNT_tierfs_enc=${PEER_UMOUNT_tierfs_enc:-"$enc_env '$HERE/tierfs-peer.sh' umount"}
  export PEER_MOUNT_tierfs_enc PEER_UMOUNT_tierfs_enc
  # Without passthrough: every read of a hot file through the daemon.
  nopt_env="TIERFS_MNT=$BENCH_ROOT/mnt/tierfs-nopt-cmp TIERFS_DATA=\$TIERFS_DATA-nopt"
  nopt_env+=" TIERFS_MOUNT_OPTS='$TIERFS_MOUNT_OPTS --no-passthrough'"
  PEER_MOUNT_tierfs_nopt=${PEER_MOUNT_tierfs_nopt:-"$nopt_env '$HERE/tierfs-peer.sh' mount"}
  PEER_UMOUNT_tierfs_nopt=${PEER_UMOUNT_tierfs_nopt:-"$nopt_env '$HERE/tierfs-peer.sh' umount"}
  export PEER_MOUNT_tierfs_nopt PEER_UMOUNT_tierfs_nopt
  # Mounted without a store: "cold" read = page cache dropped only, i.e. the same as fio_seqread.
  TIERFS_COLD_CMD=${TIERFS_COLD_CMD-'sync; echo 3 >/proc/sys/vm/drop_caches'}
  TIERFS_COLD_NOTE=${TIERFS_COLD_NOTE-"mounted without a store: COLD_CMD only drops the page cache, data still comes from the local hot tier (cold.sh measures cold reads from a store)"}
fi

# --- floor: build + mount/unmount commands ------------------------------------------------
if [[ " $PEERS " == *" floor "* || " $PEERS " == *" floor_pt "* ]]; then
  if [[ -z ${FLOOR_BIN:-} ]]; then
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
      (cd "$REPO" && cargo build --release -p tierfs-fuse-floor) >&2 ||
        { echo "compare.sh: cargo build of tierfs-fuse-floor failed" >&2; exit 1; }
    fi
    FLOOR_BIN=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/tierfs-fuse-floor
  fi
  [[ -x $FLOOR_BIN ]] || { echo "compare.sh: $FLOOR_BIN missing" >&2; exit 1; }
  export FLOOR_BIN
  PEER_MOUNT_floor=${PEER_MOUNT_floor:-"'$HERE/floor-peer.sh' mount"}
  PEER_UMOUNT_floor=${PEER_UMOUNT_floor:-"'$HERE/floor-peer.sh' umount"}
  # floor_pt: the floor with every file's bytes in a backing file opened through FUSE
  # passthrough (FLOOR_PASSTHROUGH): what the kernel's passthrough path costs by itself.
  pt_env="FLOOR_PEER=floor_pt FLOOR_PASSTHROUGH='$BENCH_ROOT/floor-pt-data'"
  PEER_MOUNT_floor_pt=${PEER_MOUNT_floor_pt:-"$pt_env '$HERE/floor-peer.sh' mount"}
  PEER_UMOUNT_floor_pt=${PEER_UMOUNT_floor_pt:-"$pt_env '$HERE/floor-peer.sh' umount"}
  export PEER_MOUNT_floor PEER_UMOUNT_floor PEER_MOUNT_floor_pt PEER_UMOUNT_floor_pt
fi

# --- optional S3 server (rclone / s3fs peers) ---------------------------------------------
# moto answers `HEAD key?versionId=null` (which rclone sends after a multipart upload, because moto
# returned x-amz-version-id: null) with 400, so rclone re-uploads forever; --s3-no-head skips that HEAD.
[[ $S3_BACKEND == moto ]] && export RCLONE_EXTRA_OPTS=${RCLONE_EXTRA_OPTS:-"--s3-no-head"}
case $S3_BACKEND in
  garage1) eval "$("$H/servers/start_garage.sh" 1)" ;;
  garage3) eval "$("$H/servers/start_garage.sh" 3)" ;;
  moto) eval "$("$H/servers/start_moto.sh")" ;;
  s3sfs) eval "$("$H/servers/start_s3sfs.sh")" ;;
  none) ;;
  *) echo "unknown S3_BACKEND $S3_BACKEND" >&2; exit 2 ;;
esac
[[ -f $TARBALL ]] || python3 "$H/mktree.py" "$TARBALL" >&2

{
  echo "date: $(date -Is)"; echo "host: $(uname -r), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "bench root: $BENCH_ROOT ($(df -h --output=source,fstype "$BENCH_ROOT" | tail -1 | tr -s ' '))"
  echo "S3 backend: $S3_BACKEND ${S3_ENDPOINT:-}"
  echo "peers: $PEERS  (RCLONE_EXTRA_OPTS=${RCLONE_EXTRA_OPTS:-} BINDFS_OPTS=${BINDFS_OPTS:-})"
  echo "ROUNDS=${ROUNDS:-1} FIO_SIZE=${FIO_SIZE:-1G} FIO_RAND_S=${FIO_RAND_S:-20} META_FILES=${META_FILES:-10000} SMALL_FILES=${SMALL_FILES:-2000} PHASE_MAX_S=$PHASE_MAX_S"
  [[ -n ${WORKLOADS:-} ]] && echo "WORKLOADS=$WORKLOADS"
  if [[ " $PEERS " == *" tierfs "* ]]; then
    echo "tierfs: $("$TIERFS_BIN" --version) ($TIERFS_BIN), git $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo none)$(cd "$REPO" && [[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' (dirty tree)')"
    echo "tierfs: data dir $TIERFS_DATA, mount opts '${TIERFS_MOUNT_OPTS:-}'"
    echo "tierfs fio_coldread: COLD_CMD='$TIERFS_COLD_CMD' ($TIERFS_COLD_NOTE)"
  fi
  echo "versions: $(fio --version) | bindfs $(bindfs --version 2>/dev/null | awk '{print $2}')$(
    [[ " $PEERS " == *" rclone "* ]] && echo " | rclone $(rclone version 2>/dev/null | head -1 | awk '{print $2}')")$(
    [[ " $PEERS " == *" s3fs "* ]] && echo " | $(s3fs --version 2>/dev/null | head -1 | grep -o 'V[0-9.]*')")"
} >"$OUTDIR/env.txt"
cat "$OUTDIR/env.txt" >&2

_unmount() {
  local v="PEER_UMOUNT_$1"
  if [[ -n ${!v:-} ]]; then bash -c "${!v}" >/dev/null 2>&1; else umount_peer "$1" cmp >/dev/null 2>&1; fi
}
cleanup() { for p in $PEERS; do _unmount "$p"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM   # EXIT trap then unmounts (stop a run: kill the compare.sh PID, then its children)

ROUNDS=${ROUNDS:-1}
tierfs_data_base=${TIERFS_DATA:-}
for round in $(seq 1 "$ROUNDS"); do
for p in $PEERS; do
  # each round on a fresh tierfs data dir (the unmount removes it)
  [[ ($p == tierfs || $p == tierfs_store || $p == tierfs_enc || $p == tierfs_nopt) && -n $tierfs_data_base && $ROUNDS -gt 1 ]] && export TIERFS_DATA=$tierfs_data_base-r$round
  v="PEER_MOUNT_$p"
  if [[ -n ${!v:-} ]]; then mnt=$(bash -c "${!v}") || { echo "mount $p failed" >&2; continue; }
  else mnt=$(mount_peer "$p" cmp) || { echo "mount $p failed" >&2; continue; }; fi
  drain='' cold='' note=''
  case $p in
    rclone)
      drain=$(rclone_drain_cmd cmp)
      cold="source '$H/peers.sh'; bash -c $(printf '%q' "$drain"); umount_peer rclone cmp && mount_peer rclone cmp" ;;
    s3fs)
      cold="source '$H/peers.sh'; umount_peer s3fs cmp && mount_peer s3fs cmp" ;;
    tierfs | tierfs_store | tierfs_enc | tierfs_nopt)
      cold=$TIERFS_COLD_CMD note=$TIERFS_COLD_NOTE ;;
  esac
  echo "=== $p on $mnt (S3: ${S3_SERVER:-none}), round $round of $ROUNDS" >&2
  t0=$(date +%s)
  DRAIN_CMD=$drain COLD_CMD=$cold COLD_NOTE=$note "$H/workloads.sh" "$mnt" "$p" "$OUTDIR"
  echo "=== $p done in $(( $(date +%s) - t0 )) s" >&2
  _unmount "$p"
done
done
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUTDIR/env.txt"

# shellcheck disable=SC2086  # PEERS is a word list
python3 "$H/table.py" "$OUTDIR" $PEERS | tee "$OUTDIR/table.md"
echo "results: $OUTDIR" >&2
