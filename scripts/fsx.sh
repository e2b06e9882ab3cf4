#!/usr/bin/env bash
# Run fsx (random file operations, every read verified) on files in a fresh
# tierfs mount, then unmount, mount again and check that every file kept its
# content. With POSIX_STORE=1 (scripts/lib.sh) the mount has a store: the
# runs must fetch evicted data back from it, and a mount on a fresh data dir
# must restore every file from the store alone.
#
# Usage: scripts/fsx.sh [--dir DIR]
#   --dir DIR   run in DIR instead of a tierfs mount (same as POSIX_DIR=DIR)
# The mount can be replaced (POSIX_MOUNT_CMD, ...): see scripts/lib.sh.
# Other environment:
#   FSX              the fsx binary (default: fsx on PATH)
#   FSX_OPS_PERCENT  scale the number of operations of every run (default 100)
#   FSX_SKIP_OPS     operations to turn off, e.g. "punch_hole" for bindfs,
#                    which does not support it (space or comma separated)
#   FSX_TIMEOUT      seconds one run may take before it counts as hung (default 600)
#
# Exit status: 0 when every run passed; 1 when a run failed (its operation log
# and the expected file content are kept), or the mount, the unmount or the
# remount check failed.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; }

while (($# > 0)); do
    case $1 in
        --dir)
            POSIX_DIR=${2:?--dir needs a directory}
            shift 2
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage >&2
            die "unknown argument: $1"
            ;;
    esac
done

FSX=${FSX:-fsx}
require_tool "$FSX"

# name, config, seed, operations. Fixed seeds: a failure reproduces exactly
# with the command printed below. These 68,000 operations took 140 s on a
# FUSE passthrough (bindfs) and 146 s on a release tierfs, on 2 cores busy
# with other builds: most of it is waiting for msync/fsync to reach the disk,
# not CPU, so a debug tierfs should stay near the ~3 minutes budgeted for fsx
# in CI. The small file gets most steps (dense overlapping edits), the large
# one fewer, longer steps.
RUNS=(
    "small-1 fsx.toml 1 40000"
    "small-2 fsx.toml 2 20000"
    "large-3 fsx-large.toml 3 8000"
)

posix_work_setup fsx

# The configs, with FSX_SKIP_OPS weights set to zero, are copied into the
# logs so that a failure can be replayed from the logs alone.
for conf in fsx.toml fsx-large.toml; do
    cp "$REPO_ROOT/tests/posix/$conf" "$POSIX_LOGS/$conf"
    for op in ${FSX_SKIP_OPS:+${FSX_SKIP_OPS//,/ }}; do
        grep -q "^$op = " "$POSIX_LOGS/$conf" || die "FSX_SKIP_OPS: no operation '$op' in $conf"
        sed -i "s/^$op = .*/$op = 0/" "$POSIX_LOGS/$conf"
    done
done
[[ -z ${FSX_SKIP_OPS:-} ]] || log "operations turned off: $FSX_SKIP_OPS"

posix_mount

failed=()
total_ops=0
start_all=$SECONDS
for run in "${RUNS[@]}"; do
    read -r name conf seed ops <<<"$run"
    ops=$((ops * ${FSX_OPS_PERCENT:-100} / 100))
    ((ops > 0)) || ops=1
    total_ops=$((total_ops + ops))
    file=$POSIX_MNT/fsx-$name
    artifacts=$POSIX_LOGS/$name
    mkdir -p "$artifacts"
    cmd=("$FSX" -f "$POSIX_LOGS/$conf" -N "$ops" -S "$seed" -P "$artifacts" "$file")
    start=$SECONDS
    rc=0
    # RUST_BACKTRACE=0: fsx panics on an unexpected errno, and the message
    # (with its source line) names the operation; a backtrace adds nothing.
    RUST_BACKTRACE=0 run_bounded "${FSX_TIMEOUT:-600}" "$artifacts/fsx.log" "${cmd[@]}" || rc=$?
    if ((rc == 0)); then
        log "$name: seed $seed, $ops operations: ok ($((SECONDS - start))s)"
        continue
    fi
    failed+=("$name")
    posix_fail
    if ((rc == 124 || rc == 137)); then
        log "$name: seed $seed, $ops operations: TIMED OUT after $((SECONDS - start))s"
    else
        log "$name: seed $seed, $ops operations: FAILED (status $rc, $((SECONDS - start))s)"
    fi
    # fsx prints what check failed, then "LOG DUMP" and up to 1024 of the
    # operations that led to it: show the check and the last operations.
    if grep -q 'LOG DUMP' "$artifacts/fsx.log"; then
        sed '/LOG DUMP/q' "$artifacts/fsx.log" | tail -n 25 | sed 's/^/    /'
        echo "    [...]"
        sed '1,/LOG DUMP/d' "$artifacts/fsx.log" | tail -n 15 | sed 's/^/    /'
    else
        # A panic (an unexpected errno from an operation): no dump.
        tail -n 40 "$artifacts/fsx.log" | sed 's/^/    /'
    fi
    # fsx saved what the file should contain (*.fsxgood); keep what it does
    # contain next to it for cmp(1).
    timeout 60 cp "$file" "$artifacts/fsx-$name.fsxbad" 2>/dev/null || true
    log "$name: log and artifacts (.fsxgood = expected, .fsxbad = actual): $artifacts"
    log "$name: replay: ${cmd[*]}"
done
log "all runs: $total_ops operations in $((SECONDS - start_all))s"

# With a store (POSIX_STORE=1), the runs must have gone through the cold
# tier: data evicted from the cache and fetched back from the store while
# fsx checked every read. A cache big enough to hold everything would pass
# without testing that, so it fails instead. Both read paths must have run:
# fetched back into the cache (files up to half the cache) and streamed from
# memory (larger files: fsx-large's 8 MiB file on a 4 MiB cache).
if [[ -n ${POSIX_STORE:-} && -z ${POSIX_DIR:-} ]]; then
    fetched=$(posix_cold_stat fetched_bytes)
    streamed=$(posix_cold_stat streamed_bytes)
    log "cold tier: uploaded $(posix_cold_stat uploaded_bytes), evicted $(posix_cold_stat evicted_bytes), fetched $fetched bytes ($streamed of them streamed, not cached)"
    if ((fetched == streamed)); then
        failed+=(cold-tier)
        posix_fail
        log "cold tier: FAILED: nothing was fetched back into the cache; make --cache-size smaller than the files"
    fi
    if ((streamed == 0)); then
        failed+=(cold-tier-streamed)
        posix_fail
        log "cold tier: FAILED: no read was streamed; make --cache-size less than twice fsx-large's file"
    fi
fi

# mount_and_compare NAME WHAT: mount, compare every file with the checksums
# taken before the first unmount, unmount. A difference fails the run as NAME.
mount_and_compare() {
    posix_mount
    if (cd "$POSIX_MNT" && sha256sum --quiet -c "$POSIX_LOGS/before-umount.sha256") >"$POSIX_LOGS/after-$1.txt" 2>&1; then
        log "$2: all files read back unchanged"
    else
        failed+=("$1")
        posix_fail
        log "$2: FAILED: files differ:"
        sed 's/^/    /' "$POSIX_LOGS/after-$1.txt"
    fi
    posix_umount || die "unmount failed; logs: $POSIX_LOGS"
}

# Durability across a clean unmount: every file must read back the same
# after unmount and mount (tierfs reopens its data directory). Skipped when
# nothing was mounted.
if [[ -z ${POSIX_DIR:-} ]]; then
    (cd "$POSIX_MNT" && sha256sum fsx-*) >"$POSIX_LOGS/before-umount.sha256"
    posix_umount || die "unmount failed; logs: $POSIX_LOGS"
    mount_and_compare remount "remount"
    # With a store: a fresh node (an empty data dir, as after a runtime reset)
    # restores the workspace from the store alone and reads the same bytes.
    if [[ -n ${POSIX_STORE:-} ]]; then
        mv "$POSIX_DATA" "$POSIX_WORK/data-before-reset"
        mount_and_compare restore "fresh data dir, restored from the store"
    fi
else
    # In a directory of someone else's: leave nothing behind on success.
    ((${#failed[@]} > 0)) || rm -f "$POSIX_MNT"/fsx-*
fi

if ((${#failed[@]} > 0)); then
    die "failed: ${failed[*]}; logs: $POSIX_LOGS"
fi
log "OK"
