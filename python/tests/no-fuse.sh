#!/bin/sh
# Runs COMMAND where FUSE is unavailable, as in a notebook container started without
# `--device /dev/fuse`: in a private mount namespace of its own (unshare), /dev is a fresh
# tmpfs with only the nodes a Python process and a Jupyter kernel use (null, zero, full,
# random, urandom, tty, ptmx, pts, shm, fd). The rest of the filesystem is the host's, so
# files, control sockets and the store are shared with the processes outside; nothing
# mounted inside is seen outside, and the namespace ends with its last process.
#
# Usage: sh no-fuse.sh [--fuse missing|dead] COMMAND [ARGS...]   (as root)
#   --fuse missing  no /dev/fuse at all [default]
#   --fuse dead     a /dev/fuse node with no driver behind it (open fails with ENODEV, as
#                   on a host whose fuse module is not loaded)
#
# A mount namespace needs CAP_SYS_ADMIN; COMMAND keeps it (a FUSE mount fails for want of
# the device, not of the capability). The python tests check that it does fail.
set -eu
fuse=missing
if [ "${1:-}" = --fuse ]; then
    fuse=$2
    shift 2
fi
case $fuse in missing | dead) ;; *)
    echo "no-fuse.sh: --fuse missing or dead, not '$fuse'" >&2
    exit 2
    ;;
esac
[ $# -gt 0 ] || {
    echo "no-fuse.sh: no command" >&2
    exit 2
}
exec unshare --mount --propagation private -- /bin/sh -euc '
    fuse=$1
    shift
    # Built aside, then moved over /dev in one step.
    dev=$(mktemp -d "${TMPDIR:-/tmp}/no-fuse-dev.XXXXXX")
    mount -t tmpfs -o mode=755,nosuid no-fuse-dev "$dev"
    mknod -m 666 "$dev/null" c 1 3
    mknod -m 666 "$dev/zero" c 1 5
    mknod -m 666 "$dev/full" c 1 7
    mknod -m 666 "$dev/random" c 1 8
    mknod -m 666 "$dev/urandom" c 1 9
    mknod -m 666 "$dev/tty" c 5 0
    # Misc minor 250 has no driver: the node is there, opening it is ENODEV.
    [ "$fuse" = missing ] || mknod -m 666 "$dev/fuse" c 10 250
    ln -s /proc/self/fd "$dev/fd"
    ln -s /proc/self/fd/0 "$dev/stdin"
    ln -s /proc/self/fd/1 "$dev/stdout"
    ln -s /proc/self/fd/2 "$dev/stderr"
    mkdir "$dev/pts" "$dev/shm"
    mount --bind /dev/pts "$dev/pts"
    mount --bind /dev/shm "$dev/shm"
    ln -s pts/ptmx "$dev/ptmx"
    mount --move "$dev" /dev
    rmdir "$dev"
    exec "$@"
' no-fuse "$fuse" "$@"
