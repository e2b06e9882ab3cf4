#!/usr/bin/env bash
# benches/retention.sh BIN_DIR [ROUNDS]
#
# Issue 49 (undo to the second): what the retention window costs in store bytes. A `file://`
# store, a mount, 50 files of 256 KiB (random: nothing dedups or compresses), then ROUNDS
# rounds (default 60: an hour of edits at one round a minute) that each rewrite 10 of them
# whole with new random data and flush. After the unmount: the bytes of the store's backend,
# after `tierfs gc --keep-within 7d` (the default: every version a restore inside the window
# reads stays) and after `tierfs gc --keep-within 0` (the latest state only). The difference
# is the cost of the window for that hour; a day of such edits costs 24 times it. A benchmark
# run by hand: nothing here is a test.
#
# Needs root and fuse3.
set -euo pipefail
BIN=$(cd "${1:?BIN_DIR with tierfs and tierfs-daemon}" && pwd)
ROUNDS=${2:-60}
export TIERFS_PASSPHRASE=bench TIERFS_TEST_FAST_KDF=test
T=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-retention-bench.XXXX")
export TIERFS_RUNTIME_DIR=$T/run
"$BIN/tierfs" init --store "$T/store.toml" --backend "file://$T/b" >/dev/null
mkdir "$T/mnt"
"$BIN/tierfs" mount --standalone --store "$T/store.toml" --data-dir "$T/data" "$T/mnt" >/dev/null
for i in $(seq 1 50); do head -c 262144 /dev/urandom >"$T/mnt/f$i"; done
"$BIN/tierfs" flush "$T/mnt" >/dev/null
for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 9); do head -c 262144 /dev/urandom >"$T/mnt/f$(((r * 10 + k) % 50 + 1))"; done
    "$BIN/tierfs" flush "$T/mnt" >/dev/null
done
"$BIN/tierfs" umount "$T/mnt" >/dev/null
bytes() { du -sb "$T/b" | cut -f1; }
live=$((50 * 262144))
before=$(bytes)
"$BIN/tierfs" gc --store "$T/store.toml" --keep-within 7d >/dev/null
kept=$(bytes)
"$BIN/tierfs" gc --store "$T/store.toml" --keep-within 0 >/dev/null
latest=$(bytes)
echo "rounds $ROUNDS, live data $live B; store: before gc $before B, gc --keep-within 7d $kept B, gc --keep-within 0 $latest B"
echo "the window's cost for this hour: $((kept - latest)) B ($((kept * 100 / latest))% of the latest state's store)"
rm -rf "$T"
