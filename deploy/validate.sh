#!/usr/bin/env bash
# Validates every manifest under deploy/kubernetes against the Kubernetes
# JSON schemas of one version, offline, plus the rules in deploy/validate.py.
#
#   bash deploy/validate.sh                 # Kubernetes 1.30
#   K8S_VERSION=1.31.0 bash deploy/validate.sh
#
# Needs nothing but python3 (installed with python3-venv through apt-get
# when missing; run as root on a fresh Debian 12). kubernetes-validate,
# which bundles the schemas, goes into a throwaway venv from PyPI; that
# install is the only network access. Set ASBX_VALIDATE_VENV=/some/dir to
# keep the venv between runs (CI cache). Exits non-zero on any invalid
# manifest; the last line is the summary.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
K8S_VERSION=${K8S_VERSION:-1.30.0}
KV_VERSION=1.37.0   # kubernetes-validate: schemas for Kubernetes 1.25 ... 1.37

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
if ((${#need_apt[@]})); then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "validate.sh: needs ${need_apt[*]} (apt-get install -y ${need_apt[*]}, as root)" >&2
        exit 2
    fi
    echo "validate.sh: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

start=$SECONDS
if [ -n "${ASBX_VALIDATE_VENV:-}" ]; then
    venv=$ASBX_VALIDATE_VENV
else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    venv=$tmp/venv
fi
if ! "$venv/bin/python" -c "import kubernetes_validate" >/dev/null 2>&1; then
    if ! python3 -m venv "$venv" >/dev/null 2>&1; then
        # Some images have ensurepip but not a working venv: install it and retry.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        fi
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
installed=$SECONDS

status=0
"$venv/bin/python" "$here/validate.py" \
    --kubernetes-version "$K8S_VERSION" \
    --root "$here/kubernetes" \
    --cli "$here/../crates/asbx/src/cli.rs" || status=$?
echo "validate.sh: venv ready in $((installed - start)) s, checks took $((SECONDS - installed)) s"
exit "$status"
