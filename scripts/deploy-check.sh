#!/usr/bin/env bash
# scripts/deploy-check.sh: offline checks of the node daemon's deployment files in
# tierfs-daemon/deploy/ (or $DEPLOY_DIR), the `deploy` step of scripts/test.sh.
#   1. systemd-analyze verify of the unit. It exits 0 on warnings, so its output is the
#      verdict: any line is a failure. The unit names /usr/local/bin/tierfs-daemon, which a
#      test machine lacks, so a copy pointing at the built binary is verified instead.
#   2. yamllint (strict) and kubernetes-validate (strict: unknown fields fail) of the
#      DaemonSet manifest, against Kubernetes $K8S_VERSION.
#   3. `tierfs-daemon node --check` of the example config.toml and of the config.toml the
#      manifest's ConfigMap carries.
# The tools come from PyPI into $TOOLS_DIR/deploy-venv (scripts/setup-debian.sh).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPLOY_DIR=${DEPLOY_DIR:-$REPO/tierfs-daemon/deploy}
VENV=${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/deploy-venv
DAEMON=${TIERFS_DAEMON:-${CARGO_TARGET_DIR:-/var/tmp/tierfs-target}/debug/tierfs-daemon}
K8S_VERSION=${K8S_VERSION:-1.30.0}
die() { echo "deploy-check: $*" >&2; exit 1; }
[[ -x $VENV/bin/yamllint && -x $VENV/bin/kubernetes-validate ]] || die "no $VENV (scripts/setup-debian.sh installs it)"
[[ -x $DAEMON ]] || die "no $DAEMON (build first)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== systemd-analyze verify tierfs-daemon.service"
sed "s#/usr/local/bin/tierfs-daemon#$DAEMON#g" "$DEPLOY_DIR/tierfs-daemon.service" >"$work/tierfs-daemon.service"
out=$(systemd-analyze verify "$work/tierfs-daemon.service" 2>&1) || die "systemd-analyze failed: $out"
[[ -z $out ]] || die "systemd-analyze verify complained:"$'\n'"$out"

echo "== yamllint, kubernetes-validate daemonset.yaml"
"$VENV/bin/yamllint" -s -d "{extends: default, rules: {line-length: {max: 120}}}" "$DEPLOY_DIR/daemonset.yaml"
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$DEPLOY_DIR/daemonset.yaml"

echo "== tierfs-daemon node --check"
"$DAEMON" node --check --config "$DEPLOY_DIR/config.toml"
"$VENV/bin/python" - "$DEPLOY_DIR/daemonset.yaml" "$work/configmap.toml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "ConfigMap"]
assert docs and "config.toml" in docs[0]["data"], "no ConfigMap with config.toml in the manifest"
open(sys.argv[2], "w").write(docs[0]["data"]["config.toml"])
PY
"$DAEMON" node --check --config "$work/configmap.toml"
echo "deploy-check: all passed"
