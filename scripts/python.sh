#!/usr/bin/env bash
# Build the tierfs Python wheel (python/: the `tierfs` module plus the `tierfs` and
# `tierfs-daemon` binaries) with maturin, and test the built wheel: installed into fresh
# venvs, driving real mounts, and executing real notebooks in real Jupyter kernels.
#
# Usage: scripts/python.sh [--release] [--build-only] [--out DIR] [--wheel FILE] [-- PYTEST_ARGS...]
#   --release     the wheel for users: the release profile (its own RocksDB build the first
#                 time, ~25 minutes on 2 cores; later builds reuse it)
#   --build-only  build the wheel, print its name and size, test nothing
#   --out DIR     where the wheel goes [default: $CARGO_TARGET_DIR/wheels/PROFILE]
#   --wheel FILE  test this wheel instead of building one
#   PYTEST_ARGS   passed to pytest, e.g. -- -k path_in_use
#
# Without --release the wheel is built in the dev profile, from the same CARGO_TARGET_DIR as
# the `build` step of scripts/test.sh: RocksDB's C++ is reused, not compiled again
# (python/README.md, "How the wheel is built", says what maturin does rebuild and why).
#
# Needs what scripts/setup-debian.sh installs under $TIERFS_TOOLS_DIR
# (default /var/lib/tierfs-test-tools): maturin (python-venv/) and the test wheels
# (python-wheels/). The tests make their venvs from Debian's /usr/bin/python3.
#
# Environment:
#   TIERFS_TOOLS_DIR  the test tools (see above)
#   PYTHON_KEEP=1     keep the work directory even when everything passed
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

PROFILE=dev
BUILD_ONLY=
OUT=
WHEEL=
PYTEST_ARGS=()
while (($# > 0)); do
    case $1 in
        --release) PROFILE=release ;;
        --build-only) BUILD_ONLY=1 ;;
        --out)
            (($# >= 2)) || die "--out needs a directory"
            OUT=$2
            shift
            ;;
        --wheel)
            (($# >= 2)) || die "--wheel needs a file"
            WHEEL=$(realpath "$2")
            [[ -f $WHEEL ]] || die "no wheel at $2"
            shift
            ;;
        --)
            shift
            PYTEST_ARGS=("$@")
            break
            ;;
        *) die "unknown argument '$1' (see the top of $0)" ;;
    esac
    shift
done
OUT=${OUT:-$CARGO_TARGET_DIR/wheels/$PROFILE}

TOOLS_DIR=${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}
MATURIN=$TOOLS_DIR/python-venv/bin/maturin
WHEELHOUSE=$TOOLS_DIR/python-wheels
ENV_WHEELHOUSE=$TOOLS_DIR/python-env-wheels
SYSTEM_PYTHON=/usr/bin/python3

# seconds since START (a `date +%s.%N` value), to a tenth
since() { awk -v s="$1" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }'; }
mib() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# --- build --------------------------------------------------------------------------
# maturin copies the binaries from $CARGO_TARGET_DIR/debug/ (or release/), where every cargo
# run links its own build of them: a cargo command in the same target dir that ran while
# maturin did may have put its binary (with debuginfo; maturin's are stripped) there first.
# stripped WHEEL: true when both binaries in WHEEL have no debuginfo.
stripped() {
    local unpacked bin file ok=0
    unpacked=$(mktemp -d)
    "$SYSTEM_PYTHON" -m zipfile -e "$1" "$unpacked"
    for bin in tierfs tierfs-daemon; do
        file=$(find "$unpacked" -path "*.data/scripts/$bin")
        [[ -n $file ]] || die "the wheel has no $bin binary"
        if readelf -S "$file" | grep -q '\.debug_info'; then
            warn "$bin in the wheel has debuginfo: another cargo command replaced maturin's build of it"
            ok=1
        fi
    done
    rm -rf "$unpacked"
    return "$ok"
}

build() {
    [[ -x $MATURIN ]] || die "$MATURIN not found: run scripts/setup-debian.sh"
    require_tool cargo
    mkdir -p "$OUT"
    local start attempt wheels
    start=$(date +%s.%N)
    for attempt in 1 2 3; do
        rm -f "$OUT"/tierfs-*.whl
        log "building the wheel (maturin, $PROFILE profile, CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
        # --strip: the binaries without symbols (the dev profile's debuginfo would make the
        # wheel ~10x larger). maturin checks the binaries' glibc symbols and tags the wheel with
        # the manylinux level they need.
        if (cd python && "$MATURIN" build --profile "$PROFILE" --strip --out "$OUT"); then
            wheels=("$OUT"/tierfs-*.whl)
            [[ -f ${wheels[0]} ]] || die "maturin built no wheel in $OUT"
            WHEEL=${wheels[0]}
            stripped "$WHEEL" && break
        else
            # A compile error fails every attempt; a cargo command that ran in between (and
            # relinked a binary while maturin moved it aside to pack it) fails only this one.
            warn "maturin failed (attempt $attempt)"
        fi
        ((attempt < 3)) || die "the wheel could not be built in three attempts (see above)"
    done
    build_secs=$(since "$start")
    log "built $(basename "$WHEEL") in ${build_secs} s: $(mib "$WHEEL") MiB"
}

if [[ -z $WHEEL ]]; then
    build
else
    build_secs=
    [[ -z $BUILD_ONLY ]] || die "--wheel and --build-only: nothing to do"
    stripped "$WHEEL" || warn "testing $WHEEL anyway"
    log "testing $WHEEL (not built now)"
fi
if [[ -n $BUILD_ONLY ]]; then
    echo "$WHEEL"
    exit 0
fi

[[ -f $WHEELHOUSE/.stamp ]] || die "$WHEELHOUSE is incomplete: run scripts/setup-debian.sh"
[[ -f $ENV_WHEELHOUSE/.stamp ]] || die "$ENV_WHEELHOUSE is incomplete: run scripts/setup-debian.sh"

# --- test ---------------------------------------------------------------------------
# A short path: control sockets live below it (108 bytes at most for a socket address).
WORK=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/tierfs-py.XXXXXX")")
RESULT=1
# shellcheck disable=SC2317 # run by the EXIT trap
on_exit() {
    local rc=$?
    set +e
    # Whatever a failed run left: daemons started below WORK (by pid) and mounts below it.
    local pid point
    for pid in $(pgrep -f "tierfs-daemon.*$WORK" || true); do
        kill -KILL "$pid" 2>/dev/null
    done
    while read -r point; do
        warn "detaching $point, left mounted"
        fusermount3 -u -z "$point" 2>/dev/null || umount -l "$point" 2>/dev/null
    done < <(awk -v w="$WORK/" 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    if ((rc != 0 || RESULT != 0)) || [[ -n ${PYTHON_KEEP:-} ]]; then
        log "kept the work directory: $WORK (executed notebooks in $WORK/notebooks)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pip_install() {
    local venv=$1
    shift
    "$venv/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check --no-input "$@"
}

# What a user does after a reset: pip install the wheel (no index, no network) and run it.
"$SYSTEM_PYTHON" -m venv "$WORK/install-venv"
start=$(date +%s.%N)
pip_install "$WORK/install-venv" --no-index "$WHEEL"
install_secs=$(since "$start")
version=$("$WORK/install-venv/bin/tierfs" --version)
"$WORK/install-venv/bin/python" -c 'import tierfs; print(tierfs.tierfs_binary())' >/dev/null
log "pip install of the wheel into a fresh venv: ${install_secs} s; $version works"

# The test runner's venv: pytest, nbclient and the wheel, nothing from the source tree.
"$SYSTEM_PYTHON" -m venv "$WORK/test-venv"
pip_install "$WORK/test-venv" --no-index --find-links "$WHEELHOUSE" pytest nbclient nbformat "$WHEEL"

METRICS=$WORK/metrics.json
log "running the tests (work directory $WORK)"
rc=0
# From WORK, so that neither the clone nor python/src is on sys.path: `import tierfs` finds
# the installed wheel only.
(
    cd "$WORK"
    env TIERFS_TEST_WORK="$WORK" TIERFS_TEST_WHEEL="$WHEEL" TIERFS_TEST_WHEELHOUSE="$WHEELHOUSE" \
        TIERFS_TEST_ENV_WHEELHOUSE="$ENV_WHEELHOUSE" \
        TIERFS_TEST_METRICS="$METRICS" TIERFS_TOOLS_DIR="$TOOLS_DIR" \
        "$WORK/test-venv/bin/python" -m pytest -p no:cacheprovider --rootdir "$REPO_ROOT/python" \
        -c "$REPO_ROOT/python/pyproject.toml" "$REPO_ROOT/python/tests" ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}
) || rc=$?
RESULT=$rc

log "numbers of this run (measured, not asserted):"
[[ -z $build_secs ]] || log "  wheel build:                  ${build_secs} s ($PROFILE profile)"
log "  wheel size:                   $(mib "$WHEEL") MiB ($(basename "$WHEEL"))"
log "  pip install into a fresh venv: ${install_secs} s"
if [[ -f $METRICS ]]; then
    "$SYSTEM_PYTHON" - "$METRICS" <<'EOF'
import json, sys
names = {
    "kernel_venv_secs": "kernel venv (ipykernel, numpy, tqdm)",
    "wheel_install_into_kernel_venv_secs": "wheel install from a notebook cell",
    "reset_wheel_install_secs": "wheel install after the reset",
    "reset_mount_secs": "mount() after the reset",
    "reset_mount_to_usable_secs": "mount() to checkpoint read, after the reset",
    "no_fuse_mount_secs": "mount() without FUSE (watch mode, fresh)",
    "env_fuse_reset_to_pandas_secs": "env, FUSE: mount(env=True) to import pandas, after a reset",
    "env_fuse_reset_mount_secs": "env, FUSE: of which mount() and activation",
    "env_watch_reset_mount_secs": "env, watch: of which mount() and activation",
    "env_fuse_install_secs": "env, FUSE: %pip install from the wheelhouse into the env",
    "env_watch_reset_to_pandas_secs": "env, watch: mount(env=True) to import pandas, after a reset",
    "env_watch_install_secs": "env, watch: %pip install from the wheelhouse into the env",
    "reinstall_wheelhouse_secs": "reinstall: pip install from the wheelhouse + import pandas",
}
for key, value in json.load(open(sys.argv[1])).items():
    print(f"python:   {names.get(key, key) + ':':<44} {value} s")
EOF
fi
exit "$rc"
