#!/usr/bin/env bash
# benches/floor-peer.sh mount|umount
#
# Mounts/unmounts the `floor` peer of benches/compare.sh: tierfs-fuse-floor
# (benches/fuse-floor), an in-memory FUSE filesystem with tierfs's FUSE settings that does no
# work of its own. Its rates are the ceiling any FUSE filesystem with those settings reaches
# on this machine (see benches/README.md, "The FUSE floor, and why some targets are out of
# reach"). `mount` prints the mountpoint on stdout (everything else goes to stderr).
#
# Env: FLOOR_BIN (the tierfs-fuse-floor binary), BENCH_ROOT (mountpoint parent),
#      OUTDIR (the log lands here), FLOOR_PEER [floor] (names the mountpoint, pid and log, so
#      two floors can be peers), FLOOR_PASSTHROUGH=DIR (made empty on mount: files' bytes in
#      DIR, opened through FUSE passthrough; see benches/fuse-floor).
set -uo pipefail
: "${FLOOR_BIN:?FLOOR_BIN not set}" "${BENCH_ROOT:?BENCH_ROOT not set}"
PEER=${FLOOR_PEER:-floor}
MNT=$BENCH_ROOT/mnt/$PEER-cmp
PIDFILE=$BENCH_ROOT/$PEER.pid
case ${1:-} in
  mount)
    mkdir -p "$MNT"
    if [[ -n ${FLOOR_PASSTHROUGH:-} ]]; then rm -rf "$FLOOR_PASSTHROUGH"; mkdir -p "$FLOOR_PASSTHROUGH"; fi
    nohup "$FLOOR_BIN" "$MNT" >"${OUTDIR:-$BENCH_ROOT}/$PEER.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 100); do mountpoint -q "$MNT" && { echo "$MNT"; exit 0; }; sleep 0.1; done
    echo "floor-peer.sh: $MNT not mounted after 10 s (see floor.log)" >&2
    exit 1 ;;
  umount)
    mountpoint -q "$MNT" && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
    if [[ -f $PIDFILE ]]; then
      pid=$(cat "$PIDFILE")
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill "$pid" 2>/dev/null
      rm -f "$PIDFILE"
    fi
    [[ -n ${FLOOR_PASSTHROUGH:-} ]] && rm -rf "$FLOOR_PASSTHROUGH"
    true ;;
  *) echo "usage: floor-peer.sh mount|umount" >&2; exit 2 ;;
esac
