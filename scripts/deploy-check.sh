#!/usr/bin/env bash
# Offline checks of the node daemon's deployment files (tierfs-daemon/deploy/), the `deploy`
# step of scripts/test.sh. Nothing is installed, started or contacted; each check runs even
# when an earlier one failed:
#   unit        systemd-analyze verify of tierfs-daemon.service
#   yamllint    yamllint --strict of daemonset.yaml
#   kubernetes  kubernetes-validate --strict of daemonset.yaml (the schema of Kubernetes
#               $K8S_VERSION, bundled with the tool: unknown fields and wrong types fail)
#   manifest    what the API server checks beyond that schema, for the fields we use:
#               enumerations (mountPropagation, hostPath type, ...), volume names,
#               Bidirectional only when privileged; and that the probes name a real port
#   config      tierfs-daemon node --check of config.toml
#   configmap   the same of the config.toml in daemonset.yaml's ConfigMap
#
# Usage: scripts/deploy-check.sh
# Environment:
#   DEPLOY_DIR        the files to check [default: tierfs-daemon/deploy]; point it at an
#                     edited copy to see a check fail
#   TIERFS_DAEMON     the daemon binary [default: $CARGO_TARGET_DIR/debug/tierfs-daemon]
#   K8S_VERSION       Kubernetes version to validate against [default: 1.30.0]
#   TIERFS_TOOLS_DIR  where scripts/setup-debian.sh put deploy-venv (yamllint,
#                     kubernetes-validate) [default: /var/lib/tierfs-test-tools]
#
# Exit status: 0 when every check passed, 1 when one failed (the summary names it).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEPLOY_DIR=${DEPLOY_DIR:-$REPO_ROOT/tierfs-daemon/deploy}
DAEMON=${TIERFS_DAEMON:-$CARGO_TARGET_DIR/debug/tierfs-daemon}
K8S_VERSION=${K8S_VERSION:-1.30.0}
VENV=${TIERFS_TOOLS_DIR:-/var/lib/tierfs-test-tools}/deploy-venv
UNIT=tierfs-daemon.service
# yamllint's defaults (which want the leading ---), lines up to 100 characters like the code.
YAMLLINT_CONFIG='{extends: default, rules: {line-length: {max: 100}}}'

require_tool systemd-analyze
for tool in yamllint kubernetes-validate; do
    [[ -x $VENV/bin/$tool ]] || die "$VENV/bin/$tool not found: run scripts/setup-debian.sh"
done
[[ -x $DAEMON ]] || die "$DAEMON not found: build it with 'cargo build --workspace --bins --tests' (or set TIERFS_DAEMON)"
[[ -d $DEPLOY_DIR ]] || die "DEPLOY_DIR=$DEPLOY_DIR is not a directory"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tierfs-deploy-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The check_* functions run as `"$@" || rc=$?` (run_check), where set -e is off: each ends
# in the command whose status is its verdict, or returns 1 itself (77: skipped).

check_unit() {
    # verify fails a unit whose Exec*= programs are missing, and this machine has no
    # /usr/local/bin/tierfs-daemon (the installed path). So the copy verified runs the built
    # binary instead; every other line is the file as shipped.
    local copy=$WORK/unit/$UNIT out rc=0 ours
    mkdir -p "$WORK/unit"
    sed "s#/usr/local/bin/tierfs-daemon#$DAEMON#g" "$DEPLOY_DIR/$UNIT" >"$copy"
    grep -qF "$DAEMON node" "$copy" || {
        echo "$UNIT runs no /usr/local/bin/tierfs-daemon node"
        return 1
    }
    # The exit status counts warnings (an unknown key, a bad value) only with
    # --recursive-errors; `no` counts those about our unit, not about the units it pulls in
    # (network-online.target, modprobe@.service), which are the machine's business.
    out=$(systemd-analyze verify --recursive-errors=no "$copy" 2>&1) || rc=$?
    # Not every complaint sets the status, so any line naming our unit fails too. Lines
    # about other units (the machine's own, loaded as dependencies) are shown, not counted:
    # they differ from machine to machine (there are none on this Debian 12 CI container).
    ours=$(grep -F "$UNIT" <<<"$out" || true)
    if [[ -n $out && -z $ours ]]; then
        sed 's/^/    not about our unit: /' <<<"$out"
    fi
    if [[ -n $ours ]]; then
        printf '%s\n' "$ours"
    fi
    ((rc == 0)) && [[ -z $ours ]]
}

check_yamllint() {
    "$VENV/bin/yamllint" --strict -d "$YAMLLINT_CONFIG" "$DEPLOY_DIR/daemonset.yaml"
}

check_kubernetes() {
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$DEPLOY_DIR/daemonset.yaml"
}

check_manifest() {
    # kubernetes-validate checks the OpenAPI schema only, which types enumerations as plain
    # strings (`mountPropagation: Sideways` passes it). What the API server checks on top
    # (pkg/apis/core/validation), for the fields this manifest uses, is repeated here, plus
    # probes that name a port the container does not have (they would fail forever).
    "$VENV/bin/python" - "$DEPLOY_DIR/daemonset.yaml" <<'PY'
import sys, yaml
ENUMS = {
    "mountPropagation": {"None", "HostToContainer", "Bidirectional"},
    "hostPath.type": {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                      "CharDevice", "BlockDevice"},
    "imagePullPolicy": {"Always", "Never", "IfNotPresent"},
    "protocol": {"TCP", "UDP", "SCTP"},
    "updateStrategy.type": {"RollingUpdate", "OnDelete"},
}
errors = []
def enum(field, value, where):
    if value is not None and value not in ENUMS[field]:
        errors.append(f"{where}: {field} {value!r} is not one of {sorted(ENUMS[field])}")
try:
    with open(sys.argv[1]) as f:
        sets = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "DaemonSet"]
except yaml.YAMLError as e:
    sys.exit(f"daemonset.yaml is not YAML: {e}")
if not sets:
    sys.exit("daemonset.yaml: no DaemonSet")
for ds in sets:
    at = f"DaemonSet {ds['metadata']['name']}"
    enum("updateStrategy.type", ds["spec"].get("updateStrategy", {}).get("type"), at)
    labels = ds["spec"]["template"]["metadata"].get("labels", {})
    for k, v in ds["spec"]["selector"].get("matchLabels", {}).items():
        if labels.get(k) != v:
            errors.append(f"{at}: selector {k}={v} does not match the template's labels")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        enum("hostPath.type", v.get("hostPath", {}).get("type"), f"{at} volume {v['name']}")
    for c in pod.get("initContainers", []) + pod["containers"]:
        where = f"{at} container {c['name']}"
        enum("imagePullPolicy", c.get("imagePullPolicy"), where)
        ports = {p.get("name"): p for p in c.get("ports", [])}
        for p in ports.values():
            enum("protocol", p.get("protocol"), where)
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                errors.append(f"{where}: volumeMount {m['name']} names no volume")
            enum("mountPropagation", m.get("mountPropagation"), f"{where} mount {m['mountPath']}")
            privileged = c.get("securityContext", {}).get("privileged")
            if m.get("mountPropagation") == "Bidirectional" and not privileged:
                errors.append(f"{where}: Bidirectional propagation needs a privileged container")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in ports:
                errors.append(f"{where}: {probe} port {port!r} is no port of the container")
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PY
}

# A daemon built before `node` existed would take "node" for a mount point: ask the
# subcommand itself whether it has --check.
if "$DAEMON" node --help 2>/dev/null | grep -q -- '--check'; then
    HAVE_NODE=1
else
    HAVE_NODE=
fi

check_config() {
    if [[ -z $HAVE_NODE ]]; then
        log "skipped: binary has no node command ($DAEMON)"
        return 77
    fi
    "$DAEMON" node --check --config "$1"
}

check_configmap() {
    local toml=$WORK/configmap-config.toml
    # PyYAML comes with kubernetes-validate.
    "$VENV/bin/python" - "$DEPLOY_DIR/daemonset.yaml" "$toml" <<'PY' || return 1
import sys, yaml
try:
    with open(sys.argv[1]) as f:
        maps = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ConfigMap"]
except yaml.YAMLError as e:
    sys.exit(f"daemonset.yaml is not YAML: {e}")
text = next((m["data"]["config.toml"] for m in maps if "config.toml" in m.get("data", {})), None)
if text is None:
    sys.exit("daemonset.yaml: no ConfigMap with a config.toml")
with open(sys.argv[2], "w") as f:
    f.write(text)
PY
    check_config "$toml"
}

FAILED=()
run_check() {
    local name=$1
    shift
    log "== $name"
    local rc=0
    "$@" || rc=$?
    case $rc in
        0) log "ok: $name" ;;
        77) ;; # skipped, and said why
        *)
            warn "FAILED: $name"
            FAILED+=("$name")
            ;;
    esac
}

run_check unit check_unit
run_check yamllint check_yamllint
run_check kubernetes check_kubernetes
run_check manifest check_manifest
run_check config check_config "$DEPLOY_DIR/config.toml"
run_check configmap check_configmap

((${#FAILED[@]} == 0)) || die "failed: ${FAILED[*]} (files in $DEPLOY_DIR)"
log "all passed (files in $DEPLOY_DIR)"
