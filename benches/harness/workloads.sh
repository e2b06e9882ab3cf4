#!/usr/bin/env bash
# workloads.sh MOUNTPOINT LABEL OUTDIR
#
# Runs a fixed set of workloads in MOUNTPOINT/bench-LABEL and appends one JSON line per
# workload to OUTDIR/LABEL.jsonl:
#   {"label":..,"workload":..,"metrics":{name: value, ..},"params":{..},"ts":..}
#
# Workloads (all sizes overridable by env, defaults in brackets):
#   fio_seqwrite   sequential write FIO_SIZE [1G], bs=1M, end_fsync=1
#   fio_seqread    sequential read of the same file, page cache dropped first (peer's own cache warm)
#   fio_coldread   same, after COLD_CMD (compare.sh: unmount, wipe the peer's local cache, remount,
#                  so every byte comes from S3); without COLD_CMD only the page cache is dropped
#   fio_randread   4k random read, FIO_RAND_S [20] s, on the same file, page cache dropped first;
#                  FIO_FADVISE [1] is fio's fadvise_hint: 1 tells the kernel the reads are random
#                  (POSIX_FADV_RANDOM), 0 leaves its readahead on. Through FUSE passthrough the hint
#                  reaches the FUSE file, not the backing file, whose readahead then pulls the file
#                  into memory over a long run: FIO_FADVISE=0 gives every peer the same readahead,
#                  and FIO_RAND_DIRECT=1 reads with O_DIRECT (no page cache, no readahead: every
#                  peer's reads reach the disk; passthrough passes O_DIRECT to the backing file)
#   fio_mmapread   a walk of the same file through mmap (fio's mmap engine, 1 MiB reads in order),
#                  page cache dropped first
#   fio_randwrite  4k random write, FIO_RAND_S s, end_fsync=1, on the same file
#   meta           META_FILES [10000] empty files in 100 dirs: create, stat, rename, delete (ops/s each)
#   smallfile      SMALL_FILES [2000] x 16 KiB: write (+sync), drop caches, read back
#   untar          extract the deterministic tarball from mktree.py (~7000 files, ~45 MB),
#                  then `du -s`, `find | wc -l` (caches dropped first), `rm -rf`
#
# Env knobs:
#   WORKLOADS="fio_seqwrite fio_seqread ..."  subset to run (default: all, in the order above)
#   PHASE_MAX_S [120]  per-phase time cap for meta/smallfile/untar (slow peers get a truncated
#                      phase, marked "truncated":true; rates stay valid)
#   DRAIN_CMD          optional command run (and timed as drain_s) after each write workload;
#                      compare.sh sets it for rclone to wait for the VFS upload queue to empty,
#                      i.e. the time until data written through the mount is really in S3.
#   COLD_CMD           command that empties the peer's own cache (see fio_coldread)
#   COLD_NOTE          free text recorded as params.cold_note of fio_coldread (table.py prints it
#                      as a footnote), e.g. what COLD_CMD really does for this peer
#   TARBALL [${TMPDIR:-/tmp}/tierfs-peers/bench/tree.tar]  built by mktree.py if missing
set -uo pipefail

MNT=${1:?usage: workloads.sh MOUNTPOINT LABEL OUTDIR}
LABEL=${2:?label}
OUTDIR=${3:?outdir}
HERE=$(cd "$(dirname "$0")" && pwd)
FIO_SIZE=${FIO_SIZE:-1G}
FIO_RAND_S=${FIO_RAND_S:-20}
FIO_FADVISE=${FIO_FADVISE:-1}
FIO_RAND_DIRECT=${FIO_RAND_DIRECT:-0}
META_FILES=${META_FILES:-10000}
SMALL_FILES=${SMALL_FILES:-2000}
PHASE_MAX_S=${PHASE_MAX_S:-120}
TARBALL=${TARBALL:-${TMPDIR:-/tmp}/tierfs-peers/bench/tree.tar}
WORKLOADS=${WORKLOADS:-"fio_seqwrite fio_seqread fio_coldread fio_randread fio_mmapread fio_randwrite meta smallfile untar"}
PY=${PY:-python3}

mkdir -p "$OUTDIR"
OUT=$OUTDIR/$LABEL.jsonl
W=$MNT/bench-$LABEL
mkdir -p "$W" || { echo "cannot create $W" >&2; exit 1; }
LOG=$OUTDIR/$LABEL.log

now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 4))" "$1" "$2"; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
log() { echo "[$(date +%T)] $LABEL: $*" | tee -a "$LOG" >&2; }

# emit WORKLOAD METRICS_JSON [PARAMS_JSON]
emit() {
  local params=${3:-}; [[ -n $params ]] || params='{}'
  "$PY" - "$LABEL" "$1" "$2" "$params" >>"$OUT" <<'PY'
import json, sys, time
label, wl, m, p = sys.argv[1:5]
print(json.dumps({"label": label, "workload": wl, "metrics": json.loads(m), "params": json.loads(p),
                  "ts": round(time.time(), 1)}))
PY
}

drain() {  # prints seconds spent in DRAIN_CMD (0 if none)
  if [[ -n ${DRAIN_CMD:-} ]]; then
    local t0; t0=$(now); bash -c "$DRAIN_CMD" >>"$LOG" 2>&1; elapsed "$t0" "$(now)"
  else echo 0; fi
}

# run_fio NAME extra-fio-args... ; prints metrics JSON (fio's own bw + wall clock incl. fsync)
run_fio() {
  local name=$1; shift
  local j=$OUTDIR/$LABEL.$name.fio.json t0 t1
  t0=$(now)
  fio --name="$name" --filename="$W/fio.dat" --size="$FIO_SIZE" --ioengine=psync --direct=0 \
      --fallocate=none --numjobs=1 --group_reporting --output-format=json --output="$j" "$@" >>"$LOG" 2>&1
  local rc=$?
  t1=$(now)
  "$PY" - "$j" "$(elapsed "$t0" "$t1")" "$rc" <<'PY'
import json, sys
path, wall, rc = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
m = {"wall_s": wall, "rc": rc}
try:
    txt = open(path).read()
    d = json.loads(txt[txt.index("{"):])  # fio may print warnings before the JSON
    job = d["jobs"][0]
    for op in ("read", "write"):
        s = job[op]
        if s["io_bytes"] > 0:
            m[op + "_MiBps"] = round(s["bw_bytes"] / 1048576, 2)
            m[op + "_iops"] = round(s["iops"], 1)
            m[op + "_MiB"] = round(s["io_bytes"] / 1048576, 1)
            m[op + "_clat_p99_us"] = round(s.get("clat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1000, 1)
            m[op + "_wall_MiBps"] = round(s["io_bytes"] / 1048576 / wall, 2) if wall else None
except Exception as e:  # noqa: BLE001
    m["error"] = str(e)[:200]
print(json.dumps(m))
PY
}

merge() {  # merge JSON objects given as args (later wins)
  "$PY" -c 'import json,sys; d={}; [d.update(json.loads(a)) for a in sys.argv[1:]]; print(json.dumps(d))' "$@"
}

for wl in $WORKLOADS; do
  log "start $wl"
  case $wl in
    fio_seqwrite)
      rm -f "$W/fio.dat"
      m=$(run_fio seqwrite --rw=write --bs=1M --end_fsync=1)
      d=$(drain)
      emit "$wl" "$(merge "$m" "{\"drain_s\": $d}")" "{\"size\": \"$FIO_SIZE\", \"bs\": \"1M\", \"end_fsync\": 1}"
      ;;
    fio_seqread)
      drop_caches
      m=$(run_fio seqread --rw=read --bs=1M)
      emit "$wl" "$m" "{\"size\": \"$FIO_SIZE\", \"bs\": \"1M\", \"dropped_caches\": true}"
      ;;
    fio_coldread)
      t0=$(now)
      if [[ -n ${COLD_CMD:-} ]]; then bash -c "$COLD_CMD" >>"$LOG" 2>&1 || log "COLD_CMD failed"; fi
      cold_s=$(elapsed "$t0" "$(now)")
      drop_caches
      m=$(run_fio coldread --rw=read --bs=1M)
      p=$("$PY" -c 'import json,sys; print(json.dumps({"size": sys.argv[1], "bs": "1M", "cold_cmd": sys.argv[2] == "1", **({"cold_note": sys.argv[3]} if sys.argv[3] else {})}))' \
          "$FIO_SIZE" "$([[ -n ${COLD_CMD:-} ]] && echo 1 || echo 0)" "${COLD_NOTE:-}")
      emit "$wl" "$(merge "$m" "{\"cold_cmd_s\": $cold_s}")" "$p"
      ;;
    fio_randread)
      drop_caches
      m=$(run_fio randread --rw=randread --bs=4k --time_based --runtime="$FIO_RAND_S" --randrepeat=1 \
            --fadvise_hint="$FIO_FADVISE" --direct="$FIO_RAND_DIRECT")
      emit "$wl" "$m" "{\"size\": \"$FIO_SIZE\", \"bs\": \"4k\", \"runtime_s\": $FIO_RAND_S, \"fadvise_hint\": $FIO_FADVISE, \"direct\": $FIO_RAND_DIRECT}"
      ;;
    fio_mmapread)
      drop_caches
      m=$(run_fio mmapread --rw=read --bs=1M --ioengine=mmap)
      emit "$wl" "$m" "{\"size\": \"$FIO_SIZE\", \"bs\": \"1M\", \"engine\": \"mmap\", \"dropped_caches\": true}"
      ;;
    fio_randwrite)
      m=$(run_fio randwrite --rw=randwrite --bs=4k --time_based --runtime="$FIO_RAND_S" --end_fsync=1 --randrepeat=1)
      d=$(drain)
      emit "$wl" "$(merge "$m" "{\"drain_s\": $d}")" "{\"size\": \"$FIO_SIZE\", \"bs\": \"4k\", \"runtime_s\": $FIO_RAND_S, \"end_fsync\": 1}"
      rm -f "$W/fio.dat"
      ;;
    meta)
      m=$("$PY" "$HERE/fsops.py" meta "$W" --files "$META_FILES" --dirs 100 --phase-max-s "$PHASE_MAX_S" 2>>"$LOG") || m='{"error": "fsops meta failed"}'
      d=$(drain)
      emit "$wl" "$(merge "$m" "{\"drain_s\": $d}")" "{\"files\": $META_FILES, \"dirs\": 100}"
      ;;
    smallfile)
      m=$("$PY" "$HERE/fsops.py" smallfile "$W" --files "$SMALL_FILES" --size 16384 --phase-max-s "$PHASE_MAX_S" --drop-caches 2>>"$LOG") || m='{"error": "fsops smallfile failed"}'
      d=$(drain)
      emit "$wl" "$(merge "$m" "{\"drain_s\": $d}")" "{\"files\": $SMALL_FILES, \"size\": 16384}"
      ;;
    untar)
      [[ -f $TARBALL ]] || "$PY" "$HERE/mktree.py" "$TARBALL" >>"$LOG"
      rm -rf "$W/untar"; mkdir -p "$W/untar"
      drop_caches
      t0=$(now); timeout "$PHASE_MAX_S" tar -xf "$TARBALL" -C "$W/untar"; rc_tar=$?; t1=$(now)
      t_sync0=$(now); sync; t_sync1=$(now)
      d=$(drain)
      drop_caches
      t2=$(now); du_kb=$(timeout "$PHASE_MAX_S" du -sk "$W/untar" | cut -f1); t3=$(now)
      drop_caches
      t4=$(now); nfind=$(timeout "$PHASE_MAX_S" find "$W/untar" | wc -l); t5=$(now)
      t6=$(now); timeout "$PHASE_MAX_S" rm -rf "$W/untar"; rc_rm=$?; t7=$(now)
      nfiles=$(tar -tf "$TARBALL" | wc -l)
      tar_s=$(elapsed "$t0" "$t1")
      # rates use the entries actually present (find_entries - 1 for the root), so a tar cut
      # short by PHASE_MAX_S still gives a comparable entries/s
      m=$("$PY" - <<PY
import json
n = max(0, int("${nfind:-0}" or 0) - 1)
t = dict(tar=$tar_s, du=$(elapsed "$t2" "$t3"), find=$(elapsed "$t4" "$t5"), rm=$(elapsed "$t6" "$t7"))
m = {"tar_rc": $rc_tar, "rm_rc": $rc_rm, "entries": n, "entries_expected": $nfiles,
     "truncated": n < $nfiles, "sync_s": $(elapsed "$t_sync0" "$t_sync1"), "drain_s": $d,
     "du_kb": int("${du_kb:-0}" or 0)}
for k, v in t.items():
    m[k + "_s"] = v
    m[k + "_entries_per_s"] = round(n / v, 1) if v > 0 else None
print(json.dumps(m))
PY
)
      emit "$wl" "$m" "{\"tarball\": \"$(basename "$TARBALL")\", \"entries\": $nfiles, \"bytes\": $(stat -c %s "$TARBALL")}"
      ;;
    *) log "unknown workload $wl" ;;
  esac
  log "done $wl: $(tail -n1 "$OUT" | cut -c1-300)"
done
rm -rf "$W" 2>/dev/null
exit 0
