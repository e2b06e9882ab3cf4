# shellcheck shell=bash
# Helpers shared by the external POSIX suite runners (pjdfstest.sh, fsx.sh):
# a throw-away tierfs mount that is always unmounted again.
#
# Source it; do not run it. The caller sets `set -euo pipefail`.
#
# Which filesystem is tested (environment):
#   POSIX_DIR=DIR          test inside DIR, mount nothing (e.g. a plain ext4
#                          or tmpfs directory, to check the runners themselves)
#   POSIX_MOUNT_CMD=CMD    mount with CMD instead of tierfs; CMD is run by bash
#                          with $POSIX_DATA (an empty backing directory) and
#                          $POSIX_MNT (an empty mount point) in its environment:
#                            POSIX_MOUNT_CMD='bindfs -o allow_other "$POSIX_DATA" "$POSIX_MNT"'
#   POSIX_UMOUNT_CMD=CMD   the matching unmount:
#                            POSIX_UMOUNT_CMD='fusermount3 -u "$POSIX_MNT"'
#   TIERFS_BIN=PATH        the tierfs CLI (default: $CARGO_TARGET_DIR/debug/tierfs)
#   POSIX_MOUNT_ARGS=ARGS  extra `tierfs mount` options (word-split), e.g. --writeback-cache
#   POSIX_STORE=1          mount with a store: a `file://` store made in the work
#                          directory (unlocked by a key file there), so that the cold
#                          tier (seal, upload, evict, fetch) is under test too; add a
#                          small --cache-size to POSIX_MOUNT_ARGS to make it evict
#   POSIX_MOUNT_TIMEOUT=S  seconds to wait for the mount to appear (default 30)
#   POSIX_UMOUNT_TIMEOUT=S seconds the unmount (with its flush) may take (default 120)
#   POSIX_KEEP=1           keep the work directory even when everything passed
#
# The work directory (mount point, data dir, logs) lives under $TMPDIR (or
# /tmp): on the host filesystem, never inside the mount.

# The Rust tools (pjdfstest, fsx) are installed by cargo into ~/.cargo/bin,
# which a non-login shell such as CI's may not have on its PATH.
if [[ -d ${CARGO_HOME:-$HOME/.cargo}/bin ]]; then
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    export PATH
fi

# shellcheck disable=SC2034 # used by the scripts that source this file
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}
TIERFS_BIN=${TIERFS_BIN:-$CARGO_TARGET_DIR/debug/tierfs}

# The script's name prefixes its messages, so interleaved CI output stays readable.
LIB_TAG=$(basename "$0" .sh)
log() { printf '%s: %s\n' "$LIB_TAG" "$*"; }
warn() { printf '%s: WARNING: %s\n' "$LIB_TAG" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$LIB_TAG" "$*" >&2
    exit 1
}

# require_tool NAME: fail early with a hint instead of a cryptic "not found".
require_tool() {
    command -v "$1" >/dev/null 2>&1 || die "$1 not found: run scripts/setup-debian.sh"
}

# is_mounted DIR: true when DIR (a canonical path) is a mount point. Reads
# /proc instead of stat()ing DIR, which would hang on a wedged FUSE daemon.
is_mounted() {
    # Field 5 of mountinfo is the mount point, with spaces escaped as \040;
    # ours never contain spaces (mktemp names).
    awk -v d="$1" '$5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo
}

# posix_work_setup NAME: create the work directory and set
#   POSIX_WORK  the work directory
#   POSIX_MNT   where the tests run (a fresh mount point, or $POSIX_DIR)
#   POSIX_DATA  tierfs --data-dir (or the bindfs source)
#   POSIX_LOGS  logs of the mount, the suite and its artifacts
# and install the EXIT trap that unmounts and cleans up.
posix_work_setup() {
    local name=$1
    # Canonical (symlinks resolved) now, while nothing is mounted: mountinfo
    # lists canonical paths, and resolving later could hang on a bad mount.
    POSIX_WORK=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/tierfs-$name.XXXXXX")")
    # The suites switch to unprivileged users (pjdfstest: nobody, daemon):
    # they must be able to walk down to the mount point.
    chmod 0755 "$POSIX_WORK"
    POSIX_LOGS=$POSIX_WORK/logs
    POSIX_DATA=$POSIX_WORK/data
    # POSIX_DATA is not created here: tierfs creates its data directory
    # itself, owner-only, and may refuse one that it did not make.
    mkdir -p "$POSIX_LOGS"
    if [[ -n ${POSIX_DIR:-} ]]; then
        [[ -d $POSIX_DIR ]] || die "POSIX_DIR=$POSIX_DIR is not a directory"
        POSIX_MNT=$(realpath "$POSIX_DIR")
    else
        POSIX_MNT=$POSIX_WORK/mnt
        mkdir -m 0755 "$POSIX_MNT"
    fi
    export POSIX_WORK POSIX_MNT POSIX_DATA POSIX_LOGS
    POSIX_MOUNTED=
    POSIX_FAILED=
    POSIX_CHILD=
    trap posix_on_exit EXIT
    # Without these traps an interrupted run (Ctrl-C, CI timeout) would exit
    # without the EXIT trap and leave the mount behind.
    trap 'posix_on_signal 130' INT
    trap 'posix_on_signal 143' TERM
}

# run_bounded SECONDS LOG COMMAND...: run COMMAND with a time limit, so that
# a hung mount fails the run instead of stalling CI, its output into LOG.
# `timeout` puts COMMAND in a process group of its own, where Ctrl-C does not
# reach; running it in the background lets posix_on_signal stop it at once.
# (LOG is an argument, not a redirection of the call: a trap that runs during
# the wait would print into LOG too.)
run_bounded() {
    local limit=$1 log=$2 rc=0
    shift 2
    # --kill-after: a process blocked in a FUSE request may ignore SIGTERM.
    timeout --kill-after=30 "$limit" "$@" >"$log" 2>&1 &
    POSIX_CHILD=$!
    wait "$POSIX_CHILD" || rc=$?
    POSIX_CHILD=
    return "$rc"
}

posix_on_signal() {
    trap - INT TERM
    if [[ -n ${POSIX_CHILD:-} ]]; then
        kill -TERM "$POSIX_CHILD" 2>/dev/null || true
        wait "$POSIX_CHILD" 2>/dev/null || true
    fi
    warn "interrupted"
    exit "$1"
}

# Environment for the tierfs CLI and its daemon: everything a tierfs process
# could look up through XDG (config, control socket, default data) points into
# the work directory, so the test daemon is isolated from any other tierfs on
# the machine and from the user's configuration.
posix_tierfs_env() {
    # tierfs's own overrides of those defaults, should the caller have set them.
    unset TIERFS_RUNTIME_DIR TIERFS_DATA_DIR
    export XDG_CONFIG_HOME=$POSIX_WORK/xdg/config
    export XDG_DATA_HOME=$POSIX_WORK/xdg/data
    export XDG_STATE_HOME=$POSIX_WORK/xdg/state
    export XDG_CACHE_HOME=$POSIX_WORK/xdg/cache
    export XDG_RUNTIME_DIR=$POSIX_WORK/xdg/run
    mkdir -p "$XDG_CONFIG_HOME" "$XDG_DATA_HOME" "$XDG_STATE_HOME" "$XDG_CACHE_HOME"
    [[ -d $XDG_RUNTIME_DIR ]] || mkdir -m 0700 "$XDG_RUNTIME_DIR"
}

# posix_store_init: create the POSIX_STORE store once per work directory
# (later mounts, also from a fresh data dir, reuse it).
posix_store_init() {
    [[ -f $POSIX_WORK/store.toml ]] && return 0
    if ! "$TIERFS_BIN" init --store "$POSIX_WORK/store.toml" --backend "file://$POSIX_WORK/objects" \
        --key-file "$POSIX_WORK/store.key" </dev/null >"$POSIX_LOGS/init.log" 2>&1; then
        cat "$POSIX_LOGS/init.log" >&2
        die "tierfs init failed"
    fi
    log "store: $POSIX_WORK/store.toml (file://$POSIX_WORK/objects)"
}

# posix_cold_stat FIELD: a counter of the mount's cold tier from
# `tierfs --json status` (fetched_bytes, evicted_bytes, uploaded_bytes, ...).
posix_cold_stat() {
    "$TIERFS_BIN" --json status "$POSIX_MNT" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["cold"][sys.argv[1]])' "$1"
}

# posix_mount: mount the filesystem under test on $POSIX_MNT (no-op with
# POSIX_DIR) and wait until it is there.
posix_mount() {
    if [[ -n ${POSIX_DIR:-} ]]; then
        log "testing directory $POSIX_MNT (POSIX_DIR set: nothing mounted)"
        return 0
    fi
    local cmd=${POSIX_MOUNT_CMD:-}
    if [[ -n $cmd ]]; then
        # Another filesystem (bindfs): its backing directory becomes the root
        # of the mount, which other users must be able to enter.
        [[ -d $POSIX_DATA ]] || mkdir -m 0755 "$POSIX_DATA"
    else
        [[ -x $TIERFS_BIN ]] || die "$TIERFS_BIN not found: build it with 'cargo build --workspace --bins --tests' (or set TIERFS_BIN)"
        posix_tierfs_env
        # --allow-other: pjdfstest switches users. The root of a fresh mount
        # must be world-searchable for the same reason (0755, as mkdir).
        # shellcheck disable=SC2016 # expanded by the bash -c below
        cmd='"$TIERFS_BIN" mount --allow-other ${POSIX_MOUNT_ARGS:-} --data-dir "$POSIX_DATA" "$POSIX_MNT"'
        if [[ -n ${POSIX_STORE:-} ]]; then
            posix_store_init
            # shellcheck disable=SC2016 # expanded by the bash -c below
            cmd+=' --store "$POSIX_WORK/store.toml"'
        fi
    fi
    log "mounting: $cmd"
    # stdout/stderr go to a file, never to our own stdout: a background
    # daemon that inherited a pipe would keep it open and hang whoever reads it.
    if ! TIERFS_BIN=$TIERFS_BIN bash -c "$cmd" </dev/null >"$POSIX_LOGS/mount.log" 2>&1; then
        cat "$POSIX_LOGS/mount.log" >&2
        die "mount command failed"
    fi
    # `tierfs mount` returns once the mount is ready; the wait only covers
    # mount commands that return earlier, and checks that something mounted.
    local waited=0 limit=${POSIX_MOUNT_TIMEOUT:-30}
    until is_mounted "$POSIX_MNT"; do
        if ((waited >= limit * 10)); then
            cat "$POSIX_LOGS/mount.log" >&2
            die "$POSIX_MNT is not mounted ${limit}s after the mount command returned"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    POSIX_MOUNTED=1
    log "mounted $(awk -v d="$POSIX_MNT" '$5 == d { for (i = 7; $i != "-"; i++); print $(i + 1), "on", d }' /proc/self/mountinfo)"
}

# posix_umount: the regular unmount (flushes in tierfs). Non-zero when it
# fails or leaves the mount behind: that is a bug of the filesystem too.
posix_umount() {
    [[ -n ${POSIX_MOUNTED:-} ]] || return 0
    # shellcheck disable=SC2016 # expanded by the bash -c below
    local cmd=${POSIX_UMOUNT_CMD:-'"$TIERFS_BIN" umount "$POSIX_MNT"'}
    log "unmounting: $cmd"
    if ! TIERFS_BIN=$TIERFS_BIN timeout "${POSIX_UMOUNT_TIMEOUT:-120}" bash -c "$cmd" </dev/null >>"$POSIX_LOGS/mount.log" 2>&1; then
        warn "unmount command failed (see $POSIX_LOGS/mount.log)"
        return 1
    fi
    local waited=0
    while is_mounted "$POSIX_MNT"; do
        if ((waited >= 100)); then
            warn "$POSIX_MNT still mounted 10s after the unmount command returned"
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    POSIX_MOUNTED=
}

# posix_force_umount: last resort, so that a broken run never leaves a mount
# (or a mount point that hangs every `ls`) behind on the CI machine.
posix_force_umount() {
    is_mounted "$POSIX_MNT" || return 0
    warn "forcing the unmount of $POSIX_MNT"
    fusermount3 -u -z "$POSIX_MNT" 2>/dev/null || umount -l "$POSIX_MNT" 2>/dev/null || true
    if is_mounted "$POSIX_MNT"; then
        warn "could not unmount $POSIX_MNT"
        return 1
    fi
}

# posix_fail: remember that the run failed (keeps the work directory).
posix_fail() { POSIX_FAILED=1; }

# EXIT trap: unmount if still mounted, then remove the work directory, or
# keep it and say where it is when something failed.
posix_on_exit() {
    local rc=$?
    set +e
    # Still mounted here means the run stopped early (failure, signal, or a
    # mount command that mounted and then failed); the regular unmount is
    # tried first so that the daemon can shut down cleanly.
    if [[ -z ${POSIX_DIR:-} ]] && is_mounted "$POSIX_MNT"; then
        POSIX_MOUNTED=1
    fi
    if [[ -n ${POSIX_MOUNTED:-} ]] && ! posix_umount; then
        posix_force_umount
        ((rc != 0)) || rc=1
    fi
    if ((rc != 0)) || [[ -n ${POSIX_FAILED:-} || -n ${POSIX_KEEP:-} ]]; then
        # tierfs-daemon logs into its data directory (daemon.log).
        if [[ -s $POSIX_DATA/daemon.log ]] && { ((rc != 0)) || [[ -n ${POSIX_FAILED:-} ]]; }; then
            log "last lines of the daemon log $POSIX_DATA/daemon.log:"
            tail -n 20 "$POSIX_DATA/daemon.log" | sed 's/^/    /'
        fi
        log "kept the work directory: $POSIX_WORK (logs: $POSIX_LOGS)"
    else
        rm -rf "$POSIX_WORK"
    fi
    exit "$rc"
}
