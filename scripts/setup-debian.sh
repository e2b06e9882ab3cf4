#!/usr/bin/env bash
# Prepare a Debian 12 machine to build and test tierfs.
#
# Idempotent: every step checks first and does nothing when the machine is
# already set up, so scripts/test.sh can run it on every CI run at almost no
# cost. Run it as root, or as a user with sudo (apt and /etc/fuse.conf need
# root; the Rust tools install into that user's ~/.cargo/bin, moto, maturin and the
# deployment checks into venvs under ${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}).
#
# Needs the network (Debian mirrors, crates.io, PyPI) only the first time; a
# machine that has everything is left untouched and nothing is downloaded.
set -euo pipefail

say() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: error: %s\n' "$*" >&2
    exit 1
}

# Root does it directly; anyone else goes through sudo.
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "not root and sudo is missing: run this script as root"
    SUDO=(sudo)
fi

# --- Debian packages ---------------------------------------------------------
# fuse3: fusermount3 and the kernel interface for the mount and its tests.
# clang, libclang-dev: bindgen (librocksdb-sys, exacl in pjdfstest).
# libacl1-dev, acl, attr: pjdfstest links libacl; setfacl/getfattr for
#   debugging xattr behaviour by hand.
# pkg-config: -sys crates find their C libraries with it.
# bindfs: a reference FUSE filesystem to check the POSIX runners themselves.
# fio: benchmarks. python3: helper scripts and the notebook module.
# python3-venv: the virtualenv that holds moto (the S3 server of the
#   integration tests, below); Debian's pip refuses installs into the system
#   Python (PEP 668), and the venv brings its own pip.
# e2fsprogs: chattr, with which a test makes a data file impossible to remove
#   (the test skips without it; Debian installs it by default).
# openssl: the Garage start script makes its RPC secret and admin token with it.
# binutils: readelf, with which scripts/python.sh checks the binaries in the wheel.
# systemd: systemd-analyze, with which scripts/deploy-check.sh verifies the node daemon's
#   unit (Debian installs it by default; a container image may not have it).
# xfsprogs: mkfs.xfs, for the watch-mode test that reads changed files through reflink
#   clones on a loop-mounted XFS image.
# rclone, s3fs: the S3 FUSE peers benches/anchors.sh (and cold.sh, smallfiles.sh) put tierfs
#   beside, on the same moto server.
PACKAGES=(fuse3 libclang-dev clang libacl1-dev pkg-config bindfs fio attr acl python3 python3-venv e2fsprogs openssl
    binutils systemd xfsprogs rclone s3fs)

missing=()
for pkg in "${PACKAGES[@]}"; do
    # dpkg -s is a local database lookup: much cheaper than an apt-get run,
    # which would refresh and lock the package lists.
    if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]} > 0)); then
    say "installing Debian packages: ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    say "Debian packages present: ${PACKAGES[*]}"
fi

# --- FUSE --------------------------------------------------------------------
# pjdfstest switches to other users (nobody, daemon), so its mount must be
# allow_other; a non-root user may only ask for that when fuse.conf allows it.
FUSE_CONF=/etc/fuse.conf
if [[ -f $FUSE_CONF ]] && grep -Eq '^[[:space:]]*user_allow_other[[:space:]]*$' "$FUSE_CONF"; then
    say "$FUSE_CONF already has user_allow_other"
else
    say "adding user_allow_other to $FUSE_CONF"
    echo user_allow_other | "${SUDO[@]}" tee -a "$FUSE_CONF" >/dev/null
fi

if [[ ! -c /dev/fuse ]]; then
    # Not fatal here (fmt, clippy and unit tests still work), but every mount
    # will fail; in a container this needs --device /dev/fuse --cap-add SYS_ADMIN.
    say "WARNING: /dev/fuse is missing: FUSE mounts (integration tests, pjdfstest, fsx) will fail"
fi

# The pjdfstest configuration (tests/posix/pjdfstest.toml) switches to these
# users and groups; Debian ships them in base-passwd.
for user in nobody daemon; do
    getent passwd "$user" >/dev/null || die "user '$user' is missing (needed by pjdfstest)"
done
for group in nogroup daemon; do
    getent group "$group" >/dev/null || die "group '$group' is missing (needed by pjdfstest)"
done

# --- Rust toolchain ----------------------------------------------------------
# rustup installs into ~/.cargo/bin, which a non-login shell (CI) may not
# have on its PATH yet.
if [[ -d ${CARGO_HOME:-$HOME/.cargo}/bin ]]; then
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    export PATH
fi

if ! command -v cargo >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        say "rustup present but no toolchain: installing stable"
        rustup toolchain install stable --profile minimal --component rustfmt,clippy
        rustup default stable
    else
        die "cargo not found. Install Rust with rustup (https://rustup.rs):
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
then open a new shell (or: source \"\$HOME/.cargo/env\") and run this script again."
    fi
fi

# The workspace is edition 2024 with rust-version 1.85.
RUST_MIN=1.85
rustc_version=$(rustc --version | awk '{print $2}')
if [[ $(printf '%s\n%s\n' "$RUST_MIN" "$rustc_version" | sort -V | head -n1) != "$RUST_MIN" ]]; then
    die "rustc $rustc_version is older than $RUST_MIN: run 'rustup update stable'"
fi
say "Rust toolchain: $(cargo --version)"

for component in rustfmt clippy; do
    sub=${component/rustfmt/fmt}
    if ! cargo "$sub" --version >/dev/null 2>&1; then
        command -v rustup >/dev/null 2>&1 || die "cargo $sub is missing and rustup is not installed"
        say "adding Rust component $component"
        rustup component add "$component"
    fi
done

# --- Test tools --------------------------------------------------------------
# scripts/install.sh (users who only want to mount) skips them.
if [[ ${SETUP_TEST_TOOLS:-1} == 0 ]]; then
    say "skipping the test tools (SETUP_TEST_TOOLS=0)"
    exit 0
fi

# --- moto: the S3 server of the integration tests ---------------------------
# The tests start `moto_server` (in-memory S3 that honours conditional PUT) on
# loopback themselves (tests/support/src/moto.rs). They look for it, in order, at
# $TIERFS_MOTO_SERVER, at $TIERFS_TOOLS_DIR/moto-venv/bin/moto_server (this
# install; TIERFS_TOOLS_DIR defaults to /var/lib/tierfs-test-tools on both
# sides, so scripts/test.sh passes nothing), then on PATH.
# Outside the clone, so that CI's fresh clones reuse it.
# Pinned: a moto release changes S3 behaviour the tests rely on (paging,
# conditional writes, error codes). Bump deliberately, with a full test run.
MOTO_VERSION=5.2.5
TOOLS_DIR=${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}
MOTO_VENV=$TOOLS_DIR/moto-venv
# Debian's interpreter, not whatever python3 comes first on PATH (pyenv): the
# venv must outlive a developer's shell setup, and python3-venv is Debian's.
SYSTEM_PYTHON=/usr/bin/python3
# $TOOLS_DIR, made if missing; /var/lib is root's: a sudo user gets the directory for their own.
own_tools_dir() {
    mkdir -p "$TOOLS_DIR" 2>/dev/null || "${SUDO[@]}" mkdir -p "$TOOLS_DIR"
    [[ -w $TOOLS_DIR ]] || "${SUDO[@]}" chown "$(id -u):$(id -g)" "$TOOLS_DIR"
}
# fresh_venv VENV REQUIREMENT...: a venv of Debian's Python at VENV holding the pinned
# REQUIREMENTs. --clear: start from an empty venv whatever a failed run left behind.
fresh_venv() {
    local venv=$1
    shift
    own_tools_dir
    "$SYSTEM_PYTHON" -m venv --clear "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$@"
}
# The installed moto version, empty when the venv is missing or broken (a
# Python upgrade, an interrupted install). Checks the server extra's Flask too.
moto_have=$("$MOTO_VENV/bin/python" -c '
import importlib.metadata as m
m.version("flask"), m.version("flask-cors")
print(m.version("moto"))' 2>/dev/null || true)
if [[ -x $MOTO_VENV/bin/moto_server && $moto_have == "$MOTO_VERSION" ]]; then
    say "moto $moto_have present"
else
    say "installing moto[server] $MOTO_VERSION into $MOTO_VENV (had: ${moto_have:-none})"
    fresh_venv "$MOTO_VENV" "moto[server]==$MOTO_VERSION"
    [[ -x $MOTO_VENV/bin/moto_server ]] || die "pip installed moto but $MOTO_VENV/bin/moto_server is missing"
fi
say "moto_server at $MOTO_VENV/bin/moto_server"

# --- Python package: maturin and the notebook tests' wheels -----------------------
# scripts/python.sh (the `python` step of scripts/test.sh) builds the wheel of python/ with
# maturin from this venv, then tests the wheel in fresh venvs that install everything from
# the local wheelhouse below (pytest, nbclient, ipykernel, numpy, tqdm and their
# dependencies, pinned in python/tests/requirements.txt): the test run itself downloads
# nothing. Both live under $TOOLS_DIR, outside the clone, like moto. Pinned for the same
# reason: a maturin release may change how it calls cargo (and so what it rebuilds).
MATURIN_VERSION=1.16.0
PY_VENV=$TOOLS_DIR/python-venv
WHEELHOUSE=$TOOLS_DIR/python-wheels
PY_REQUIREMENTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/python/tests/requirements.txt
maturin_have=$("$PY_VENV/bin/maturin" --version 2>/dev/null | awk '{print $2}' || true)
if [[ $maturin_have == "$MATURIN_VERSION" ]]; then
    say "maturin $maturin_have present"
else
    say "installing maturin $MATURIN_VERSION into $PY_VENV (had: ${maturin_have:-none})"
    fresh_venv "$PY_VENV" "maturin==$MATURIN_VERSION"
fi
# wheelhouse DIR REQUIREMENTS WHAT: the wheels of REQUIREMENTS (and their dependencies) in
# DIR. A wheelhouse is complete for exactly one requirements file and interpreter: a stamp
# holds both, so an edit of the pins or a Python upgrade downloads again.
wheelhouse() {
    local dir=$1 requirements=$2 what=$3 stamp
    stamp="$(sha256sum "$requirements" | awk '{print $1}') $("$SYSTEM_PYTHON" -c 'import sys; print(sys.version.split()[0])')"
    if [[ -f $dir/.stamp && $(<"$dir/.stamp") == "$stamp" ]]; then
        say "$what present in $dir"
        return
    fi
    say "downloading the $what into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    "$PY_VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-input \
        --only-binary :all: -d "$dir" -r "$requirements"
    echo "$stamp" >"$dir/.stamp"
}
wheelhouse "$WHEELHOUSE" "$PY_REQUIREMENTS" "Python test wheels"
# The environment tests' packages (python/tests/env-requirements.txt: pandas, numpy and one
# of each other kind) in a wheelhouse of their own, which a test can make unreachable while
# the kernels' stays; about 30 MB, kept, like the other, until the pins or Python change.
wheelhouse "$TOOLS_DIR/python-env-wheels" "$(dirname "$PY_REQUIREMENTS")/env-requirements.txt" "environment test wheels"

# --- Deployment checks: yamllint and kubernetes-validate ----------------------
# scripts/deploy-check.sh (the `deploy` step of scripts/test.sh) lints the node daemon's
# DaemonSet (tierfs-daemon/deploy/) and validates it offline against the Kubernetes schemas
# that kubernetes-validate bundles, from a venv of their own under $TOOLS_DIR, like moto.
# Pinned: a yamllint release may add rules, and a kubernetes-validate release changes the
# schemas it carries (the script pins the Kubernetes version too). Bump deliberately.
YAMLLINT_VERSION=1.38.0
KUBE_VALIDATE_VERSION=1.37.0
DEPLOY_VENV=$TOOLS_DIR/deploy-venv
deploy_have=$("$DEPLOY_VENV/bin/python" -c '
import importlib.metadata as m
print(m.version("yamllint"), m.version("kubernetes-validate"))' 2>/dev/null || true)
if [[ -x $DEPLOY_VENV/bin/yamllint && -x $DEPLOY_VENV/bin/kubernetes-validate &&
    $deploy_have == "$YAMLLINT_VERSION $KUBE_VALIDATE_VERSION" ]]; then
    say "yamllint and kubernetes-validate present ($deploy_have)"
else
    say "installing yamllint $YAMLLINT_VERSION and kubernetes-validate $KUBE_VALIDATE_VERSION into $DEPLOY_VENV (had: ${deploy_have:-none})"
    fresh_venv "$DEPLOY_VENV" "yamllint==$YAMLLINT_VERSION" "kubernetes-validate==$KUBE_VALIDATE_VERSION"
    [[ -x $DEPLOY_VENV/bin/kubernetes-validate ]] || die "pip installed kubernetes-validate but $DEPLOY_VENV/bin/kubernetes-validate is missing"
fi
say "yamllint and kubernetes-validate in $DEPLOY_VENV/bin"

# --- External POSIX test suites ----------------------------------------------
# Pinned: scripts/pjdfstest.sh parses pjdfstest's output and
# tests/posix/pjdfstest-expected-failures.txt names its test cases, both of
# which may change between releases. Bump deliberately, together.
declare -A TOOLS=([pjdfstest]=0.2.2 [fsx]=0.3.2)
for tool in pjdfstest fsx; do
    want=${TOOLS[$tool]}
    have=$("$tool" --version 2>/dev/null | awk '{print $2}' || true)
    if [[ $have == "$want" ]]; then
        say "$tool $have present"
    else
        say "installing $tool $want with cargo install (had: ${have:-none}; a few minutes)"
        # Without CARGO_TARGET_DIR, cargo install builds in a temporary
        # directory and deletes it, instead of filling the project's cache.
        env -u CARGO_TARGET_DIR cargo install --locked "$tool@$want"
    fi
done

# --- Garage: the distributed S3 engine users run ------------------------------
# scripts/garage.sh (the `garage` step of scripts/test.sh) runs tierfs against a
# 3-node Garage cluster on loopback. Garage is not a Debian package: cargo
# builds it (about 12 minutes on two cores, once; CI's fresh clones reuse the
# binary under $TOOLS_DIR). Pinned for the same reason as moto: the checks rely
# on how this release treats conditional writes. SETUP_GARAGE=0 skips it.
GARAGE_VERSION=2.5.0
GARAGE_ROOT=$TOOLS_DIR/garage
if [[ ${SETUP_GARAGE:-1} == 0 ]]; then
    say "skipping Garage (SETUP_GARAGE=0)"
else
    garage_have=$("$GARAGE_ROOT/bin/garage" --version 2>/dev/null | awk '{print $2}' || true)
    if [[ $garage_have == "cargo:$GARAGE_VERSION" ]]; then
        say "Garage $GARAGE_VERSION present"
    else
        say "installing Garage $GARAGE_VERSION into $GARAGE_ROOT with cargo install (had: ${garage_have:-none}; about 12 minutes)"
        own_tools_dir
        env -u CARGO_TARGET_DIR cargo install --locked --root "$GARAGE_ROOT" "garage@$GARAGE_VERSION"
    fi
    say "garage at $GARAGE_ROOT/bin/garage"
fi

say "done"
