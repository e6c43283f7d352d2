#!/usr/bin/env bash
# asbx's two commands:
#   bash dev.sh up [ARGS]   build and start the whole system (workspace + runner) on loopback
#   bash dev.sh test        install what the tests need, then run every check and test
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Installs Debian packages that are missing (the machine may be fresh).
ensure_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "dev.sh: installing ${missing[*]}" >&2
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Starts a throwaway PostgreSQL for the tests; sets ASBX_TEST_PG_URL.
start_postgres() {
  local bindir
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bindir" ] || { echo "dev.sh: PostgreSQL binaries not found" >&2; return 1; }
  PG_DIR=$(mktemp -d /tmp/asbx-pg.XXXXXX)
  chown postgres:postgres "$PG_DIR"
  local port=$(( 20000 + RANDOM % 20000 ))
  runuser -u postgres -- "$bindir/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$bindir/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-p $port -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
  export ASBX_TEST_PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
  PG_BIN="$bindir"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
  fi
}

# Prints how long the test command has run, and what it reached.
T0=$SECONDS
step() { echo "dev.sh: [$((SECONDS - T0)) s] $*" >&2; }

# Runs a lane of suites (a function) with its output in a file, printed
# only when the lane fails.
lane() {
  local name=$1 fn=$2 log
  log=$(mktemp /tmp/asbx-lane.XXXXXX)
  if "$fn" >"$log" 2>&1; then
    step "lane passed: $name"
    rm -f "$log"
  else
    echo "dev.sh: lane FAILED: $name; its output:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
}

# A lane's suites are chained with `&&`: `set -e` does not hold inside a
# function that `lane` tests with `if`.
lane_one() {
  # Coverage-guided fuzzing: every target a few seconds from its checked-in
  # corpus (fuzz/README.md has the long offline runs).
  bash fuzz/ci.sh &&
    # The Kubernetes manifests against the Kubernetes schemas, offline.
    bash deploy/validate.sh &&
    # The end-to-end browser test: the real `asbx up` (target/debug/asbx,
    # built by cargo test) driven by Debian's headless chromium through
    # playwright-core. No browser is downloaded.
    npm ci --prefix e2e/browser --no-audit --no-fund --loglevel=error >/dev/null &&
    node --test e2e/browser/ &&
    # Both OpenAPI documents against a live `asbx up` (schemathesis,
    # bounded): no 5xx, every answer as documented.
    bash openapi/schemathesis.sh
}

lane_two() {
  # The SDKs, each against a real `asbx up` it starts (sdk/*/README.md).
  bash sdk/python/test.sh &&
    bash sdk/typescript/test.sh &&
    # The workspace's document through openapi-python-client: no schema
    # warning, and every read route's real answer parses into its model.
    bash openapi/python-client.sh
}

case "${1:-}" in
  up)
    shift
    cargo build --release --locked -p asbx
    exec target/release/asbx up "$@"
    ;;
  test)
    shift
    ensure_packages postgresql bash coreutils python3 python3-venv chromium prometheus curl jq
    if [ "$(id -u)" -eq 0 ]; then
      start_postgres
      trap stop_postgres EXIT
    else
      echo "dev.sh: not root: PostgreSQL tests and strict-isolation tests will be skipped or fail" >&2
    fi
    step "start"
    cargo fmt --all --check
    cargo clippy --workspace --all-targets --locked -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
    step "clippy and doc done"
    cargo test --workspace --locked "$@"
    step "cargo test done"
    # The suites after cargo test share its build and are independent:
    # two lanes run side by side (each waits on sandboxes, browsers and
    # package installs as much as on the CPU); a lane's log is printed
    # when it fails.
    node -e 'process.exit(parseInt(process.versions.node) >= 20 ? 0 : 1)' 2>/dev/null ||
      { echo "dev.sh: the browser test needs Node.js 20 or later (node and npm on PATH)" >&2; exit 1; }
    [ -x target/debug/asbx ] || cargo build --locked -p asbx
    lane "fuzz, manifests, browser, schemathesis" lane_one &
    one=$!
    lane "SDKs, python-client" lane_two &
    two=$!
    status=0
    wait "$one" || status=1
    wait "$two" || status=1
    step "suites done"
    exit "$status"
    ;;
  *)
    echo "usage: bash dev.sh up [--listen ADDR] | bash dev.sh test" >&2
    exit 2
    ;;
esac
