#!/usr/bin/env bash
# The tierfs test command: what CI runs (.ci/run) and what to run before
# pushing. Installs what is missing, then lints, builds and tests, including
# the external POSIX suites against a real mount.
#
# Usage: scripts/test.sh [STEP...]
#   Steps, in order: setup fmt clippy build test pjdfstest fsx pjdfstest-writeback fsx-writeback
#   pjdfstest-store fsx-store fsx-encrypted pjdfstest-encrypted garage python deploy (default:
#   all; the *-writeback steps run the suites on a --writeback-cache mount, the *-store steps
#   on a mount with a store and a 4 MiB cache, the *-encrypted ones the same with
#   --encrypt-cache; garage runs scripts/garage.sh on a 3-node Garage cluster; python builds the Python
#   wheel and runs its tests, notebooks included: scripts/python.sh; deploy checks the node
#   daemon's systemd unit and DaemonSet offline: scripts/deploy-check.sh).
#   `scripts/test.sh fmt clippy` runs just those two.
#
# Every step runs even when an earlier one failed, except that nothing runs
# after a failed setup, and nothing that needs the binaries after a failed
# build. The exit status is non-zero when any step failed; a summary of every
# step's result and duration closes the output.
#
# Environment:
#   CARGO_TARGET_DIR  build cache, kept outside the clone so that a fresh
#                     clone (as CI makes) reuses it (default /var/tmp/tierfs-target)
#   TEST_DEADLINE     seconds the whole run may take (default 5100: CI stops a
#                     run at 90 minutes, and a run that ends on its own still
#                     prints its summary)
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

ALL_STEPS=(setup fmt clippy build test pjdfstest fsx pjdfstest-writeback fsx-writeback pjdfstest-store fsx-store fsx-encrypted
    pjdfstest-encrypted garage python deploy)
if (($# > 0)); then
    for s in "$@"; do
        [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || die "unknown step '$s' (steps: ${ALL_STEPS[*]})"
    done
    SELECTED=" $* "
else
    SELECTED=" ${ALL_STEPS[*]} "
fi

export CARGO_TARGET_DIR
# Panics in our tests show where they came from.
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
DEADLINE=$((SECONDS + ${TEST_DEADLINE:-5100}))

NAMES=()
RESULTS=()
DURATIONS=()
STEP_PID=
STEP_START=0
BLOCKED=

fmt_secs() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# step NAME LIMIT_SECONDS COMMAND...: run one step, record its result.
# The limit keeps one hung step (a deadlocked mount) from eating the whole
# CI budget; it is cut further to what is left of TEST_DEADLINE.
step() {
    local name=$1 limit=$2
    shift 2
    [[ $SELECTED == *" $name "* ]] || return 0
    NAMES+=("$name")
    if [[ -n $BLOCKED ]]; then
        RESULTS+=("skipped ($BLOCKED failed)")
        DURATIONS+=(0)
        return 0
    fi
    local left=$((DEADLINE - SECONDS))
    if ((left <= 10)); then
        # Not a skip: a suite that did not run has not passed.
        RESULTS+=("FAIL (no time left)")
        DURATIONS+=(0)
        return 0
    fi
    ((limit < left)) || limit=$left
    printf '\n==> %s: %s\n' "$name" "$*"
    local rc=0
    STEP_START=$SECONDS
    # In the background so that the signal traps below can stop it: timeout
    # runs the step in a process group of its own, which Ctrl-C would miss.
    timeout --kill-after=60 "$limit" "$@" &
    STEP_PID=$!
    wait "$STEP_PID" || rc=$?
    STEP_PID=
    DURATIONS+=($((SECONDS - STEP_START)))
    if ((rc == 0)); then
        RESULTS+=(PASS)
    elif ((rc == 124 || rc == 137)); then
        RESULTS+=("FAIL (timed out after $(fmt_secs "$limit"))")
    else
        RESULTS+=("FAIL (exit $rc)")
    fi
    printf '==> %s: %s\n' "$name" "${RESULTS[-1]}"
    return "$rc"
}

summary() {
    local i passed=0 failed=0 skipped=0 total=0
    printf '\n==> summary (CARGO_TARGET_DIR=%s)\n' "$CARGO_TARGET_DIR"
    for i in "${!NAMES[@]}"; do
        printf '  %-20s %-34s %6s\n' "${NAMES[i]}" "${RESULTS[i]}" "$(fmt_secs "${DURATIONS[i]}")"
        total=$((total + DURATIONS[i]))
        case ${RESULTS[i]} in
            PASS) passed=$((passed + 1)) ;;
            FAIL*) failed=$((failed + 1)) ;;
            *) skipped=$((skipped + 1)) ;;
        esac
    done
    printf '  %-20s %-34s %6s\n' total "" "$(fmt_secs "$total")"
    echo "steps: $passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
}

# Ctrl-C or a TERM from CI: stop the running step (its own traps unmount),
# then still print the summary.
on_signal() {
    trap - INT TERM
    if [[ -n $STEP_PID ]]; then
        kill -TERM "$STEP_PID" 2>/dev/null || true
        wait "$STEP_PID" 2>/dev/null || true
        DURATIONS+=($((SECONDS - STEP_START)))
        RESULTS+=("FAIL (interrupted)")
    fi
    summary || true
    exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

step setup 1800 scripts/setup-debian.sh || BLOCKED=setup
# setup may have installed pjdfstest and fsx into ~/.cargo/bin just now.
PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
step fmt 300 cargo fmt --all --check || true
# --workspace: at the root of a workspace that has a root package, cargo
# commands cover only that package (the core library) unless told otherwise;
# the binaries and the FUSE adapter live in the member crates.
step clippy 2400 cargo clippy --workspace --all-targets -- -D warnings || true
# --tests as well as --bins: without a test target cargo leaves out the
# dev-dependencies, which changes the feature set of a crate (bitflags) that
# librocksdb-sys's build script also uses; the build script then gets another
# hash and RocksDB's C++ is compiled a second time (~10 minutes). With --tests
# this build shares every dependency with clippy and `cargo test` (checked
# with `cargo build --unit-graph`), and the test binaries it builds are the
# ones `cargo test` runs next.
step build 2400 cargo build --workspace --bins --tests || BLOCKED=${BLOCKED:-build}
step test 1800 cargo test --workspace --no-fail-fast || true
step pjdfstest 1200 scripts/pjdfstest.sh || true
step fsx 1200 scripts/fsx.sh || true
# The same suites on a --writeback-cache mount (off by default; the kernel then owns the
# timestamps of writes and flushes dirty pages late).
step pjdfstest-writeback 1200 env POSIX_MOUNT_ARGS=--writeback-cache scripts/pjdfstest.sh || true
step fsx-writeback 1200 env POSIX_MOUNT_ARGS=--writeback-cache scripts/fsx.sh || true
# The same suites on a mount with a store (a file:// store in the work dir): the metadata goes
# to its journal too, and fsx's files outgrow the 4 MiB cache, so their data is sealed,
# uploaded, evicted and fetched back while fsx checks every read (the step fails if nothing
# was fetched), and a mount on a fresh data dir must restore every file from the store.
# A quarter of fsx's operations: each msync/fsync re-uploads the chunks it changed (~3 GB).
step pjdfstest-store 1200 env POSIX_STORE=1 scripts/pjdfstest.sh || true
step fsx-store 1200 env POSIX_STORE=1 POSIX_MOUNT_ARGS="--cache-size 4M --dirty-age 1" FSX_OPS_PERCENT=25 \
    scripts/fsx.sh || true
# fsx again on a store mount whose cache is encrypted at rest (--encrypt-cache): every write
# that covers part of a 16-byte cipher block, every truncate, punch, collapse and insert goes
# through the cipher's merges, and evicted data is fetched back into enciphered data files.
step fsx-encrypted 1200 env POSIX_STORE=1 POSIX_MOUNT_ARGS="--cache-size 4M --dirty-age 1 --encrypt-cache" \
    FSX_OPS_PERCENT=25 scripts/fsx.sh || true
step pjdfstest-encrypted 1200 env POSIX_STORE=1 POSIX_MOUNT_ARGS=--encrypt-cache scripts/pjdfstest.sh || true
# tierfs on a 3-node Garage cluster (the distributed S3 engine users run; it ignores
# conditional writes, so only lease fencing may mount): scripts/garage.sh's checks, small sizes.
step garage 1200 env TIERFS_BIN_DIR="$CARGO_TARGET_DIR/debug" SIZE_MIB=64 CACHE_MIB=32 \
    scripts/garage.sh "$(mktemp -d "${TMPDIR:-/tmp}/tierfs-garage-out.XXXXXX")" || true
# The Python package (python/): maturin packs the binaries into a wheel (dev profile, from the
# build step's cache: RocksDB is not compiled again), which the tests install into fresh venvs
# to drive real mounts from Python and to run notebooks in real Jupyter kernels, a runtime
# reset included.
step python 1500 scripts/python.sh || true
# The node daemon's deployment files (tierfs-daemon/deploy/), offline: systemd-analyze verify
# of the unit, yamllint and kubernetes-validate of the DaemonSet, and the build step's
# `tierfs-daemon node --check` of both configs. Seconds of work; the limit only catches a hang.
step deploy 120 scripts/deploy-check.sh || true

summary
