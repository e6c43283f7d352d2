#!/usr/bin/env bash
# Installs, builds and tests the TypeScript SDK against a real `asbx up`.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
if [ -z "${ASBX_BIN:-}" ] && [ ! -x "$root/target/debug/asbx" ]; then
  (cd "$root" && cargo build -p asbx)
fi
npm ci --no-audit --no-fund --loglevel=error
npm run build
npm run typecheck
npm test
