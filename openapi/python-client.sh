#!/usr/bin/env bash
# The workspace's OpenAPI document through the most used Python client
# generator: openapi-python-client (from PyPI, pinned) generates a client
# from the document a live `asbx up` serves at /openapi.json, and fails this
# script on any error or warning about the schema (an unnamed variant, a
# duplicate model, a dropped schema). Then openapi/python_client_check.py
# makes real data (an environment, an agent with MCP servers and a skill, a
# run, a chat with a turn and an attachment) and calls every read route
# (GET) with the generated client, parsing each answer into its generated
# model: a model that cannot be imported or does not parse fails.
#
#   bash openapi/python-client.sh
#
# Uses target/debug/asbx (built by `cargo test`), or ASBX_BIN. Needs python3
# with venv, and root for the jailed runner (as `asbx up` does). Cleans up
# what it started.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="${ASBX_BIN:-$root/target/debug/asbx}"
version=0.29.1
[ -x "$bin" ] || (cd "$root" && cargo build --locked -p asbx)

work="$(mktemp -d /tmp/asbx-python-client.XXXXXX)"
up_pid=""
cleanup() {
  if [ -n "$up_pid" ]; then
    kill -TERM "$up_pid" 2>/dev/null || true
    wait "$up_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "openapi-python-client==$version"

# Made before the start: the loop below reads them at once, maybe before
# the background command opened them (under load, `sed` found no file).
: >"$work/banner"
: >"$work/log"
env -u OPENAI_API_KEY -u OPENAI_BASE_URL -u ANTHROPIC_API_KEY -u ANTHROPIC_BASE_URL \
  -u ASBX_MODEL -u ASBX_REQUIRE_AUTH -u DATABASE_URL -u ASBX_RUNNER_TOKEN \
  ASBX_LOG=warn "$bin" up --listen 127.0.0.1:0 --data "$work/data" \
  >"$work/banner" 2>"$work/log" &
up_pid=$!
ws=""
for _ in $(seq 1 300); do
  ws="$(sed -n 's/^ *open *\(http:[^ ]*\).*/\1/p' "$work/banner")"
  [ -n "$ws" ] && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$work/log" >&2; echo "python-client: asbx up died" >&2; exit 1; }
  sleep 0.1
done
[ -n "$ws" ] || { cat "$work/banner" "$work/log" >&2; echo "python-client: no URL in the banner" >&2; exit 1; }
echo "python-client: workspace at $ws" >&2

status=0
"$work/venv/bin/python" "$here/python_client_check.py" "$ws" "$work" || status=1
if [ "$status" != 0 ]; then
  echo "python-client: failures above; asbx up's log:" >&2
  tail -n 50 "$work/log" >&2
fi
exit "$status"
