#!/usr/bin/env bash
# Tests of the Python SDK against a real `asbx up`: a fresh venv in a temp
# dir, `pip install` of this package, pytest and mypy (from PyPI), then tests/
# (tests/test_generated.py checks the generated _sync.py and _unions.py,
# tests/test_types.py runs mypy --strict).
# Needs python3 (>= 3.11) with venv (Debian: python3 python3-venv), root for
# the jailed runner, and target/debug/asbx (`cargo build -p asbx`) or $ASBX_BIN.
# Exits non-zero when a test fails. Extra arguments go to pytest.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "test.sh: $python is older than 3.11" >&2; exit 2; }

venv="$(mktemp -d "${TMPDIR:-/tmp}/asbx-sdk-py-venv.XXXXXX")"
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$here[websocket]" "pytest>=7" "mypy>=1.8"

cd "$here"
"$venv/bin/python" -m pytest -p no:cacheprovider -rs -q tests "$@"
