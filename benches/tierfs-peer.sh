#!/usr/bin/env bash
# benches/tierfs-peer.sh mount|umount
#
# Mounts / unmounts tierfs as a benchmark peer for compare.sh (its default PEER_MOUNT_tierfs and
# PEER_UMOUNT_tierfs). `mount` prints the mountpoint on stdout (everything else goes to stderr).
#
# Env (compare.sh exports all of them):
#   TIERFS_BIN         the `tierfs` binary (tierfs-daemon must sit next to it)
#   TIERFS_DATA        data dir; should be fresh for every run (compare.sh: under $BENCH_ROOT)
#   TIERFS_MNT         mountpoint
#   TIERFS_RUN         runtime dir (control sockets): our own, so other tierfs mounts on the
#                      machine are never touched; also holds bench.pid
#   TIERFS_MOUNT_OPTS  extra `tierfs mount` options (word-split)
#   TIERFS_EMBEDDED=1  mount on the embedded default store, as `tierfs mount ~/tierfs` does
#                      for a user: no --data-dir, with XDG_DATA_HOME under TIERFS_DATA, so
#                      the data dir and the store's objects are fresh and removed with it
#   OUTDIR             status JSON, umount log and a copy of the daemon log land here
#   KEEP_TIERFS_DATA=1 keep the data dir after unmounting (default: removed)
# Only the daemon started here is ever signalled, by its PID, and only if it is still running
# 30 s after `tierfs umount` (or if the umount failed).
set -uo pipefail
: "${TIERFS_BIN:?}" "${TIERFS_DATA:?}" "${TIERFS_MNT:?}" "${TIERFS_RUN:?}" "${OUTDIR:?}"
t() { "$TIERFS_BIN" --runtime-dir "$TIERFS_RUN" "$@"; }

# first "pid" anywhere in a JSON document on stdin
json_pid() {
  python3 -c '
import json, sys
def find(d):
    if isinstance(d, dict):
        if isinstance(d.get("pid"), int):
            return d["pid"]
        d = list(d.values())
    if isinstance(d, list):
        for v in d:
            p = find(v)
            if p:
                return p
print(find(json.load(sys.stdin)) or "")' 2>/dev/null
}

# PID of the tierfs process whose command line names our (unique) data dir
pid_by_data_dir() {
  local f
  for f in /proc/[0-9]*/cmdline; do
    if tr '\0' '\n' <"$f" 2>/dev/null | grep -qxF "$TIERFS_DATA"; then
      f=${f#/proc/}; echo "${f%/cmdline}"; return
    fi
  done
}

case ${1:-} in
  mount)
    mkdir -p "$TIERFS_DATA" "$TIERFS_MNT" "$TIERFS_RUN" "$OUTDIR"
    # --standalone: the daemon is ours to watch and stop, even beside a node daemon.
    if [[ ${TIERFS_EMBEDDED:-0} == 1 ]]; then
      # shellcheck disable=SC2086
      XDG_DATA_HOME=$TIERFS_DATA/xdg t mount --standalone ${TIERFS_MOUNT_OPTS:-} "$TIERFS_MNT" >&2 || exit 1
    else
      # shellcheck disable=SC2086
      t mount --standalone --data-dir "$TIERFS_DATA" ${TIERFS_MOUNT_OPTS:-} "$TIERFS_MNT" >&2 || exit 1
    fi
    mountpoint -q "$TIERFS_MNT" || { echo "tierfs mount returned but $TIERFS_MNT is not a mountpoint" >&2; exit 1; }
    t --json status "$TIERFS_MNT" >"$OUTDIR/tierfs-status-mount.json" 2>&1
    pid=$(json_pid <"$OUTDIR/tierfs-status-mount.json")
    [[ -n $pid ]] || pid=$(pid_by_data_dir)
    if [[ -n $pid ]]; then echo "$pid" >"$TIERFS_RUN/bench.pid"; else rm -f "$TIERFS_RUN/bench.pid"; fi
    echo "tierfs: mounted $TIERFS_MNT (data dir $TIERFS_DATA, daemon pid ${pid:-unknown})" >&2
    echo "$TIERFS_MNT"
    ;;
  umount)
    log=$OUTDIR/tierfs-umount.log
    if mountpoint -q "$TIERFS_MNT"; then
      t --json status "$TIERFS_MNT" >"$OUTDIR/tierfs-status-umount.json" 2>&1
      t0=$(date +%s.%N)
      if t umount "$TIERFS_MNT" >>"$log" 2>&1; then
        echo "tierfs umount ok in $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),2))" "$t0") s" >>"$log"
      else
        echo "tierfs umount FAILED (rc=$?); falling back to fusermount3 -u" >>"$log"
        fusermount3 -u "$TIERFS_MNT" >>"$log" 2>&1 || umount -l "$TIERFS_MNT" >>"$log" 2>&1
      fi
    fi
    if [[ -f $TIERFS_RUN/bench.pid ]]; then
      pid=$(cat "$TIERFS_RUN/bench.pid")
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "tierfs daemon $pid still running 30 s after umount: SIGTERM" >>"$log"
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && { echo "SIGKILL $pid" >>"$log"; kill -9 "$pid"; }
      fi
      rm -f "$TIERFS_RUN/bench.pid"
    fi
    for log_file in "$TIERFS_DATA/daemon.log" "$TIERFS_DATA/xdg/tierfs/default/daemon.log"; do
      [[ -f $log_file ]] && cp "$log_file" "$OUTDIR/tierfs-daemon.log"
    done
    rmdir "$TIERFS_MNT" 2>/dev/null
    if [[ -d $TIERFS_DATA && ${KEEP_TIERFS_DATA:-0} != 1 ]]; then
      du -sk "$TIERFS_DATA" 2>/dev/null | awk '{print "tierfs data dir at unmount: " $1 " KiB"}' >>"$log"
      rm -rf "${TIERFS_DATA:?}"
    fi
    exit 0
    ;;
  *) echo "usage: $0 mount|umount" >&2; exit 2 ;;
esac
