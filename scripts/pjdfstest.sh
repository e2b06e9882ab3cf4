#!/usr/bin/env bash
# Run the pjdfstest POSIX suite in a fresh tierfs mount and compare its
# failures with tests/posix/pjdfstest-expected-failures.txt.
#
# Usage: scripts/pjdfstest.sh [--dir DIR] [--secondary DIR] [-- PATTERN...]
#   --dir DIR        run in DIR instead of a tierfs mount (same as POSIX_DIR=DIR)
#   --secondary DIR  a directory on another filesystem, for the EXDEV cases
#                    (default: the work directory when mounting; none with --dir)
#   PATTERN...       only cases whose name contains a pattern (pjdfstest's own
#                    filter), e.g. `-- chmod:: rename::`
# The mount can be replaced (POSIX_MOUNT_CMD, ...): see scripts/lib.sh. E.g.
#   POSIX_MOUNT_CMD='bindfs -o allow_other "$POSIX_DATA" "$POSIX_MNT"' \
#   POSIX_UMOUNT_CMD='fusermount3 -u "$POSIX_MNT"' scripts/pjdfstest.sh
# Other environment: PJDFSTEST (the binary), PJDFSTEST_CONFIG,
# PJDFSTEST_EXPECTED (the expected-failures file), PJDFSTEST_TIMEOUT (seconds,
# default 900).
#
# Exit status: 0 when every failing case is listed as expected; 1 otherwise
# (an unlisted failure, a crash or time-out of the suite, a failed mount or
# unmount).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; }

secondary=${POSIX_SECONDARY_FS:-}
patterns=()
while (($# > 0)); do
    case $1 in
        --dir)
            POSIX_DIR=${2:?--dir needs a directory}
            shift 2
            ;;
        --secondary)
            secondary=${2:?--secondary needs a directory}
            shift 2
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        --)
            shift
            patterns=("$@")
            break
            ;;
        *)
            usage >&2
            die "unknown argument: $1"
            ;;
    esac
done

PJDFSTEST=${PJDFSTEST:-pjdfstest}
CONFIG=${PJDFSTEST_CONFIG:-$REPO_ROOT/tests/posix/pjdfstest.toml}
EXPECTED=${PJDFSTEST_EXPECTED:-$REPO_ROOT/tests/posix/pjdfstest-expected-failures.txt}
require_tool "$PJDFSTEST"
[[ -f $CONFIG ]] || die "config $CONFIG not found"
[[ -f $EXPECTED ]] || die "expected-failures file $EXPECTED not found"
# Half of the cases switch users, and the others are weaker without root.
[[ $(id -u) -eq 0 ]] || warn "not root: pjdfstest skips every case that needs root"

posix_work_setup pjdfstest
posix_mount

args=(-c "$CONFIG" -p "$POSIX_MNT")
if [[ -z $secondary && -z ${POSIX_DIR:-} ]]; then
    # The work directory is on the host filesystem, so it is a different
    # filesystem from the mount: link/rename into it must fail with EXDEV.
    secondary=$POSIX_WORK/secondary
    mkdir -m 0755 "$secondary"
fi
[[ -z $secondary ]] || args+=(-s "$secondary")

LOG=$POSIX_LOGS/pjdfstest.log
log "running: $PJDFSTEST ${args[*]} ${patterns[*]:+-- ${patterns[*]}}"
log "full log: $LOG"
start=$SECONDS
rc=0
# NO_COLOR: plain text to parse; RUST_BACKTRACE=0: the assertion message says
# enough, backtraces of the runner would only bury it. The time limit covers a
# hung filesystem: the suite takes well under a minute on a healthy one.
run_bounded "${PJDFSTEST_TIMEOUT:-900}" "$LOG" env NO_COLOR=1 RUST_BACKTRACE=0 \
    "$PJDFSTEST" "${args[@]}" -- "${patterns[@]}" || rc=$?
log "pjdfstest exited with status $rc after $((SECONDS - start))s"

# Each case prints one line, "NAME<spaces>STATUS", and a failure adds lines
# indented by a tab with the assertion that failed. Colour codes are removed
# in case a future version ignores NO_COLOR.
RESULTS=$POSIX_LOGS/pjdfstest.results
sed -E 's/\x1b\[[0-9;]*m//g' "$LOG" |
    sed -nE 's/^([^[:space:]]+)[[:space:]]+(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/\1\t\2/p' \
        >"$RESULTS"
summary=$(sed -E 's/\x1b\[[0-9;]*m//g' "$LOG" | grep -E '^Summary: ' || true)

if [[ -z $summary ]]; then
    posix_fail
    tail -n 30 "$LOG" >&2 || true
    ((rc == 124 || rc == 137)) && die "pjdfstest timed out (hung filesystem?); log: $LOG"
    die "pjdfstest did not finish (status $rc; crashed?); log: $LOG"
fi

# The verdict rests on parsing, so check that every case was understood: a
# new output format must fail loudly, not pass with nothing counted.
total=$(sed -nE 's/.* ([0-9]+) total$/\1/p' <<<"$summary")
parsed=$(wc -l <"$RESULTS")
if [[ $total != "$parsed" ]]; then
    posix_fail
    die "parsed $parsed result lines but pjdfstest reports ${total:-?} cases: has its output format changed? log: $LOG"
fi
((total > 0)) || die "pjdfstest ran no case (patterns: ${patterns[*]:-none}); log: $LOG"

# Sets of names, sorted for comm(1).
failed=$(awk -F'\t' '$2 == "FAILED" { print $1 }' "$RESULTS" | sort -u)
passed=$(awk -F'\t' '$2 == "ok" { print $1 }' "$RESULTS" | sort -u)
ran=$(cut -f1 "$RESULTS" | sort -u)
expected=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$EXPECTED" | grep -v '^$' | sort -u || true)

unexpected=$(comm -23 <(printf '%s\n' "$failed") <(printf '%s\n' "$expected") | grep -v '^$' || true)
fixed=$(comm -12 <(printf '%s\n' "$passed") <(printf '%s\n' "$expected") | grep -v '^$' || true)
count() { grep -c . <<<"$1" || true; }
indent() { sed 's/^/    /'; }

log "$summary"
log "$(count "$failed") failed ($(count "$(comm -12 <(printf '%s\n' "$failed") <(printf '%s\n' "$expected"))") of them expected), $(count "$unexpected") unexpected"

if [[ -n $fixed ]]; then
    log "NOTICE: these cases are listed in ${EXPECTED#"$REPO_ROOT"/} but now pass; delete their lines:"
    indent <<<"$fixed"
fi
# A name that no case has (a typo, or a case renamed in a new pjdfstest) would
# otherwise hide silently; only checkable when the whole suite ran.
if ((${#patterns[@]} == 0)); then
    unknown=$(comm -23 <(printf '%s\n' "$expected") <(printf '%s\n' "$ran") | grep -v '^$' || true)
    if [[ -n $unknown ]]; then
        log "NOTICE: these names in ${EXPECTED#"$REPO_ROOT"/} match no pjdfstest case:"
        indent <<<"$unknown"
    fi
fi

if [[ -n $unexpected ]]; then
    posix_fail
    log "UNEXPECTED FAILURES (fix them, or list them with a reason in ${EXPECTED#"$REPO_ROOT"/}):"
    # Print each failing case with the assertion lines that follow it.
    sed -E 's/\x1b\[[0-9;]*m//g' "$LOG" | awk -v names="$unexpected" '
        BEGIN { n = split(names, a, "\n"); for (i = 1; i <= n; i++) want[a[i]] = 1 }
        /^[^\t]/ { show = ($1 in want) && $NF == "FAILED" }
        show { print "    " $0 }'
    log "full log: $LOG"
fi

posix_umount || {
    posix_fail
    die "unmount failed after the suite; logs: $POSIX_LOGS"
}
[[ -z $unexpected ]] || exit 1
log "OK"
