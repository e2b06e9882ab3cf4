#!/usr/bin/env bash
# benches/callgrind-stat.sh BIN_DIR [OUTDIR]
#
# Issue 19: what one `stat` costs the daemon, in instructions (deterministic, unlike ab.sh's
# stat ops/s). Serves a hot-tier mount the way compare.sh's tierfs peer does (`tierfs-daemon
# --data-dir D MNT`, i.e. what `tierfs mount --data-dir D MNT` starts, plus MOUNT_OPTS) under
# `valgrind --tool=callgrind`, lays out meta's tree (N_FILES empty files over N_DIRS
# directories, created the way fsops.py meta does: os.open O_CREAT|O_EXCL, close), dumps (part
# 1: start and creation; a dump zeroes the counters), stats every file ROUNDS times (python3
# os.stat, in meta's order), dumps again (part 2: the stat phase) and unmounts. Reports part 2's
# Ir (every thread of the daemon), the FUSE lookup/getattr requests it served (calls to
# TierFuse's lookup and getattr, counted by callgrind), Ir per stat and per request, and the
# RocksDB memtable gets and key comparisons in it (memtable inserts: part 1). With
# compare.sh's settings (kernel attr/entry TTLs of 60 s) the kernel answers the stats from its
# caches and the daemon sees none; MOUNT_OPTS="--attr-ttl 0 --entry-ttl 0" sends every one to
# the daemon.
# Each build's BIN_DIR holds `tierfs` and `tierfs-daemon` (release builds, see ab.sh).
# A benchmark run by hand: nothing here is a test. Needs valgrind, python3, fuse3.
#
# OPS=meta (issue 48): what one create, rename and delete cost instead. After the directories
# are made and the counters dumped, creates the files (as above; part 2), renames each to
# NAME.r in its directory (part 3) and deletes each (part 4), dumping after each phase (with
# SETTLE_S between a phase and its dump), and reports Ir per operation for each phase, with
# its memtable inserts and gets. `callgrind_annotate --inclusive=yes` a part for its functions.
#
# Env: OPS [stat], N_FILES [2000], N_DIRS [20], ROUNDS [3], MOUNT_OPTS [""] (extra daemon options, word-split),
#   SETTLE_S [5] seconds between the creation and the first dump (background work after
#   the creates stays out of the stat phase), VALGRIND_OPTS [""] (extra valgrind options, e.g.
#   --aspace-minaddr=0x10000000 to move every mapping: RocksDB seeds its memtable skiplist's
#   random heights with the writing thread's pthread id, i.e. an address), BENCH_ROOT
#   [${TMPDIR:-/tmp}/tierfs-bench].
# Output in OUTDIR (default $BENCH_ROOT/callgrind-stat/<date>): callgrind.out.<pid>.1 (start and
#   creation), callgrind.out.<pid>.2 (the stat phase; `callgrind_annotate --inclusive=yes` it),
#   callgrind.out.<pid> (the rest, at exit), valgrind.log (the daemon's stderr), result.json,
#   and one summary line on stdout.
set -uo pipefail
[[ $# -ge 1 ]] || { sed -n '2,35p' "$0" >&2; exit 2; }
BIN_DIR=$(cd "$1" && pwd) || exit 1
BENCH_ROOT=${BENCH_ROOT:-${TMPDIR:-/tmp}/tierfs-bench}
OUTDIR=${2:-$BENCH_ROOT/callgrind-stat/$(date +%Y%m%d-%H%M%S)}
N_FILES=${N_FILES:-2000}
N_DIRS=${N_DIRS:-20}
ROUNDS=${ROUNDS:-3}
SETTLE_S=${SETTLE_S:-5}
OPS=${OPS:-stat}
[[ $OPS == stat || $OPS == meta ]] || { echo "callgrind-stat.sh: OPS is stat or meta, not $OPS" >&2; exit 2; }
MOUNT_OPTS=${MOUNT_OPTS:-}
VALGRIND_OPTS=${VALGRIND_OPTS:-}
for bin in tierfs tierfs-daemon; do [[ -x $BIN_DIR/$bin ]] || { echo "callgrind-stat.sh: no $BIN_DIR/$bin" >&2; exit 1; }; done
for tool in valgrind callgrind_control python3; do
  command -v "$tool" >/dev/null || { echo "callgrind-stat.sh: $tool missing" >&2; exit 1; }
done
mkdir -p "$OUTDIR" "$BENCH_ROOT"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "$BENCH_ROOT/callgrind-stat-work.XXXXXX") || exit 1
MNT=$WORK/mnt RUN=$WORK/run
mkdir -p "$MNT" "$RUN"
log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
VPID=
cleanup() {
  if mountpoint -q "$MNT"; then
    "$BIN_DIR/tierfs" --runtime-dir "$RUN" umount --timeout 600 "$MNT" >/dev/null 2>&1 || fusermount3 -u -z "$MNT" 2>/dev/null
  fi
  if [[ -n $VPID ]]; then
    for _ in $(seq 1200); do kill -0 "$VPID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$VPID" 2>/dev/null && { log "daemon $VPID still running 10 min after umount: SIGTERM"; kill "$VPID"; }
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --read-ahead-kib 0: setting the window stats the mountpoint from the daemon's own thread,
# which waits for the FUSE INIT its other threads answer; valgrind holds its one lock
# through a stat (not a syscall it expects to block), so the daemon would wait forever.
# (`--sim-hints=fuse-compatible` fixes that, but valgrind 3.19 then asserts in readlink.)
log "starting $BIN_DIR/tierfs-daemon under callgrind (mount opts '$MOUNT_OPTS', valgrind opts '$VALGRIND_OPTS')"
# shellcheck disable=SC2086  # MOUNT_OPTS and VALGRIND_OPTS are word lists
valgrind --tool=callgrind --dump-instr=no $VALGRIND_OPTS --callgrind-out-file="$OUTDIR/callgrind.out.%p" \
  "$BIN_DIR/tierfs-daemon" --runtime-dir "$RUN" --data-dir "$WORK/data" --read-ahead-kib 0 $MOUNT_OPTS "$MNT" \
  >"$OUTDIR/valgrind.log" 2>&1 &
VPID=$!
for i in $(seq 1200); do
  mountpoint -q "$MNT" && break
  kill -0 "$VPID" 2>/dev/null || { log "daemon exited: $(tail -5 "$OUTDIR/valgrind.log")"; exit 1; }
  ((i == 1200)) && { log "not mounted after 10 min"; exit 1; }
  sleep 0.5
done
# tree PHASE: meta's tree (N_FILES names over N_DIRS directories, in round-robin order) under
# $MNT/meta: `mkdirs` makes the directories, `create` the files (os.open O_CREAT|O_EXCL, close),
# `rename` renames each NAME to NAME.r, `delete` unlinks each NAME.r.
tree() {
  python3 - "$MNT/meta" "$N_FILES" "$N_DIRS" "$1" <<'PY'
import os, sys
root, n, nd, phase = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dirs = [os.path.join(root, "d%03d" % i) for i in range(nd)]
names = [os.path.join(d, "f%05d" % j) for j in range(n // nd) for d in dirs]
if phase == "mkdirs":
    os.makedirs(root)
    for d in dirs:
        os.mkdir(d)
for p in names:
    if phase == "create":
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    elif phase == "rename":
        os.rename(p, p + ".r")
    elif phase == "delete":
        os.unlink(p + ".r")
PY
}
dump() { callgrind_control -d "$VPID" >/dev/null 2>&1 || { log "callgrind_control -d failed"; exit 1; }; }
log "mounted (pid $VPID); creating $N_FILES files in $N_DIRS dirs"
tree mkdirs || exit 1
if [[ $OPS == meta ]]; then
  dump
  for phase in create rename delete; do
    tree $phase || { log "$phase failed"; exit 1; }
    sleep "$SETTLE_S"
    dump
    log "$phase done"
  done
  n_stats=$((N_FILES / N_DIRS * N_DIRS)) stat_s=0
else
  tree create || exit 1
  sleep "$SETTLE_S"
  dump
  stats=$(python3 - "$MNT/meta" "$N_FILES" "$N_DIRS" "$ROUNDS" <<'PY'
import os, sys, time
root, n, nd, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = [os.path.join(root, "d%03d" % i, "f%05d" % j) for j in range(n // nd) for i in range(nd)]
t0 = time.perf_counter()
for _ in range(rounds):
    for p in names:
        os.stat(p)
print(len(names) * rounds, round(time.perf_counter() - t0, 3))
PY
  ) || { log "stat loop failed"; exit 1; }
  read -r n_stats stat_s <<<"$stats"
  dump
fi
setup=$OUTDIR/callgrind.out.$VPID.1 dump=$OUTDIR/callgrind.out.$VPID.2
[[ -f $setup && -f $dump ]] || { log "no dumps $setup, $dump"; exit 1; }
log "$n_stats operations a phase ($OPS, ${stat_s} s under valgrind); dumps in $OUTDIR; unmounting"
"$BIN_DIR/tierfs" --runtime-dir "$RUN" umount --timeout 600 "$MNT" >>"$OUTDIR/umount.log" 2>&1 || log "umount failed (see $OUTDIR/umount.log)"
for _ in $(seq 1200); do kill -0 "$VPID" 2>/dev/null || break; sleep 0.5; done
python3 - "$setup" "$dump" "$n_stats" "$stat_s" "$OUTDIR/result.json" "$BIN_DIR" "$MOUNT_OPTS" "$VALGRIND_OPTS" "$N_FILES" "$N_DIRS" "$ROUNDS" "$OPS" <<'PY'
import json, re, sys
setup, dump, n_stats, stat_s, out, bin_dir, opts, vg_opts, n_files, n_dirs, rounds, ops = sys.argv[1:13]
n_stats = int(n_stats)
COUNTED = {  # what to count calls of (summed over call sites), by the callee's name
    "lookup": r"TierFuse as fuser::.*Filesystem>::lookup$",
    "getattr": r"TierFuse as fuser::.*Filesystem>::getattr$",
    "memtable_get": r"^rocksdb::MemTable::Get\(",
    "memtable_add": r"^rocksdb::MemTable::Add\(",
    "key_compare": r"^rocksdb::MemTable::KeyComparator::operator\(\)\(char const\*, rocksdb::Slice const&\) const$",
}
def parse(path):
    names, total, cfn, pending, counted = {}, None, None, None, {}
    def name_of(rest):
        m = re.match(r"\((\d+)\)(?: (.*))?$", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")
    pats = {k: re.compile(v) for k, v in COUNTED.items()}
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if pending is not None:
            parts = line.split()
            c = counted.setdefault(pending[0], [0, 0])
            c[0] += pending[1]
            c[1] += int(parts[1]) if len(parts) > 1 else 0
            pending = None
        elif line.startswith("fn="):
            name_of(line[3:])
        elif line.startswith("cfn="):
            cfn = name_of(line[4:])
        elif line.startswith("calls="):
            for k, p in pats.items():
                if p.search(cfn or ""):
                    pending = (k, int(line[6:].split()[0]))
                    break
        elif line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    return total, {k: {"calls": v[0], "inclusive_ir": v[1]} for k, v in sorted(counted.items())}
n = lambda d, k: d.get(k, {}).get("calls", 0)
if ops == "meta":
    r = {"bin_dir": bin_dir, "mount_opts": opts, "valgrind_opts": vg_opts, "n_dirs": int(n_dirs), "ops_per_phase": n_stats}
    for part, phase in ((2, "create"), (3, "rename"), (4, "delete")):
        total, calls = parse(dump[: -len(".2")] + f".{part}")
        r[phase] = {"total_ir": total, "calls": calls, "ir_per_op": round(total / n_stats, 1)}
        print(f"{bin_dir} opts='{opts}': {phase}: Ir/op {r[phase]['ir_per_op']}, memtable inserts/op "
              f"{n(calls, 'memtable_add') / n_stats:.2f}, gets/op {n(calls, 'memtable_get') / n_stats:.2f}")
    json.dump(r, open(out, "w"), indent=1)
    sys.exit(0)
setup_ir, setup_calls = parse(setup)
total, calls = parse(dump)
reqs = sum(calls.get(k, {}).get("calls", 0) for k in ("lookup", "getattr"))
r = {"bin_dir": bin_dir, "mount_opts": opts, "valgrind_opts": vg_opts, "n_files": int(n_files), "n_dirs": int(n_dirs),
     "rounds": int(rounds), "stats": n_stats, "stat_s_under_valgrind": float(stat_s), "dump": dump, "total_ir": total,
     "calls": calls, "setup_ir": setup_ir, "setup_calls": setup_calls,
     "ir_per_stat": round(total / n_stats, 1) if total and n_stats else None,
     "ir_per_request": round(total / reqs, 1) if total and reqs else None,
     "key_compares_per_memtable_get": round(n(calls, "key_compare") / n(calls, "memtable_get"), 2) if n(calls, "memtable_get") else None}
json.dump(r, open(out, "w"), indent=1)
print(f"{bin_dir} opts='{opts}' vg='{vg_opts}': {n_stats} stats, Ir {total}, lookup {n(calls, 'lookup')}, "
      f"getattr {n(calls, 'getattr')}, Ir/stat {r['ir_per_stat']}, Ir/request {r['ir_per_request']}, "
      f"memtable gets {n(calls, 'memtable_get')} x {r['key_compares_per_memtable_get']} key compares "
      f"(memtable inserts at creation: {n(setup_calls, 'memtable_add')})")
PY
