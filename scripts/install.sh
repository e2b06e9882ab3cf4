#!/usr/bin/env bash
# Install tierfs on a Debian machine: system packages (fuse3, clang for the
# RocksDB build), then the `tierfs` and `tierfs-daemon` binaries into
# ~/.cargo/bin (on PATH after rustup's env is sourced) and a symlink in
# /usr/local/bin when run as root, so `tierfs` works in any shell.
#
# Usage: scripts/install.sh [--debug]
#   The first build compiles RocksDB from C++ (about 10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SETUP_TEST_TOOLS=0 scripts/setup-debian.sh
PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

profile=()
[[ ${1:-} == --debug ]] && profile=(--debug)
echo "install: building tierfs (cargo install --path tierfs-daemon)"
cargo install --locked --force "${profile[@]}" --path tierfs-daemon

bin=${CARGO_HOME:-$HOME/.cargo}/bin
if [[ $(id -u) -eq 0 && -d /usr/local/bin ]]; then
    ln -sf "$bin/tierfs" /usr/local/bin/tierfs
    ln -sf "$bin/tierfs-daemon" /usr/local/bin/tierfs-daemon
fi
echo "install: done: $("$bin/tierfs" --version)"
