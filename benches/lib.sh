# shellcheck shell=bash
# benches/lib.sh: shell functions shared by the benchmark scripts (sourced, not run).
# Expects the caller to define log and die, and REPO, LOG and CARGO_TARGET_DIR.

# t ARGS...: the tierfs under test ($TBIN/tierfs) with the benches' passphrase and a runtime
# dir in $WORK; drop_caches: empties the page cache. A script that defined its own before
# sourcing this file keeps it.
declare -F t >/dev/null ||
  t() { TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test "$TBIN/tierfs" --runtime-dir "$WORK/run" "$@"; }
declare -F drop_caches >/dev/null || drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# tierfs_binaries: sets BIN_DIR and TIERFS to the `tierfs` and `tierfs-daemon` to measure:
# $TIERFS_BIN_DIR if set, else a release build in $CARGO_TARGET_DIR (skipped with SKIP_BUILD=1).
tierfs_binaries() {
  if [[ -n ${TIERFS_BIN_DIR:-} ]]; then
    BIN_DIR=$TIERFS_BIN_DIR
  else
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
      log "building tierfs (release) in $CARGO_TARGET_DIR; waits for other cargo builds holding the lock"
      (cd "$REPO" && cargo build --release -p tierfs-daemon --bins) >>"$LOG" 2>&1 ||
        die "cargo build failed (see $LOG)"
    fi
    BIN_DIR=$CARGO_TARGET_DIR/release
  fi
  TIERFS=$BIN_DIR/tierfs
  [[ -x $TIERFS && -x $BIN_DIR/tierfs-daemon ]] || die "no tierfs and tierfs-daemon in $BIN_DIR"
}

# tierfs_umount: unmounts the tierfs at $TMNT (`tierfs umount`, else fusermount3 -u), waits
# for its daemon $TPID (stop_daemon), removes its data dir $TDATA and clears the three; a no-op
# when nothing is mounted. Logs to $LOG.
declare -F tierfs_umount >/dev/null ||
  tierfs_umount() {
    [[ -n ${TMNT:-} ]] || return 0
    if mountpoint -q "$TMNT"; then
      t --json umount --timeout 600 "$TMNT" >>"$LOG" 2>&1 ||
        { log "tierfs umount FAILED; fusermount3 -u"; fusermount3 -u "$TMNT" 2>>"$LOG" || umount -l "$TMNT" 2>>"$LOG"; }
    fi
    [[ -n ${TPID:-} ]] && stop_daemon "$TPID"
    [[ -n ${TDATA:-} ]] && rm -rf "$TDATA"
    TMNT='' TPID='' TDATA=''
  }

# start_moto: starts moto ($MOTO_SERVER) on $MOTO_PORT or a free port, logging to
# $OUTDIR/moto.log; exports S3_ENDPOINT, S3_BUCKET (= $BUCKET) and moto's credentials; sets
# MOTO_PID (the caller stops it) and RAW (benches/s3_raw.py with $BENCH_PY); creates $BUCKET.
start_moto() {
  PORT=${MOTO_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  export S3_ENDPOINT=http://127.0.0.1:$PORT S3_BUCKET=$BUCKET AWS_REGION=us-east-1
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
  log "starting moto on $S3_ENDPOINT"
  PYTHONUNBUFFERED=1 "$MOTO_SERVER" -H 127.0.0.1 -p "$PORT" >"$OUTDIR/moto.log" 2>&1 &
  MOTO_PID=$!
  for i in $(seq 600); do
    curl -s -o /dev/null -m 1 "$S3_ENDPOINT/" && break
    kill -0 "$MOTO_PID" 2>/dev/null || die "moto exited at start; $(tail -3 "$OUTDIR/moto.log")"
    ((i == 600)) && die "moto did not answer on $S3_ENDPOINT within 60 s"
    sleep 0.1
  done
  RAW=("$BENCH_PY" "$HERE/s3_raw.py")
  "${RAW[@]}" mkbucket 2>>"$LOG" || die "creating bucket $BUCKET failed (see $LOG)"
}

# stop_daemon PID: waits up to 30 s for a tierfs daemon to exit after its unmount, then ends
# it (SIGTERM, and SIGKILL 5 s later), saying so in the log.
stop_daemon() {
  local pid=$1
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "tierfs daemon $pid still running 30 s after umount: SIGTERM"
  kill "$pid"; sleep 5; kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  return 0
}

# stop_moto: ends the moto server start_moto started ($MOTO_PID, if any): SIGTERM, and SIGKILL
# 5 s later.
stop_moto() {
  [[ -n ${MOTO_PID:-} ]] || return 0
  kill "$MOTO_PID" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$MOTO_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$MOTO_PID" 2>/dev/null && kill -9 "$MOTO_PID" 2>/dev/null
  return 0
}

# since T0: seconds since the $EPOCHREALTIME value T0
since() { local now=$EPOCHREALTIME; awk -v a="$1" -v b="$now" 'BEGIN { printf "%.3f\n", b - a }'; }
