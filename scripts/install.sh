#!/usr/bin/env bash
# Install tierfs on a Debian machine: system packages (fuse3, clang for the
# RocksDB build), a release build of `tierfs` and `tierfs-daemon`, and a copy of
# both in /usr/local/bin (root) or ~/.local/bin (others), so `tierfs` works in
# any shell.
#
# Usage: scripts/install.sh
#   The first build compiles RocksDB from C++ (about 10 minutes on 2 cores);
#   the build cache is $CARGO_TARGET_DIR (default /var/tmp/tierfs-target, the
#   same one scripts/test.sh uses), so later installs take seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SETUP_TEST_TOOLS=0 scripts/setup-debian.sh
PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}

echo "install: building tierfs (release)"
cargo build --locked --release -p tierfs-daemon --bins

if [[ $(id -u) -eq 0 ]]; then dest=/usr/local/bin; else dest=$HOME/.local/bin; fi
mkdir -p "$dest"
# Both binaries side by side: `tierfs mount` starts the `tierfs-daemon` next to it.
install -m 0755 "$CARGO_TARGET_DIR/release/tierfs" "$CARGO_TARGET_DIR/release/tierfs-daemon" "$dest/"
echo "install: $("$dest/tierfs" --version) installed in $dest"
case ":$PATH:" in *":$dest:"*) ;; *) echo "install: add $dest to your PATH" ;; esac
