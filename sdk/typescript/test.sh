#!/usr/bin/env bash
# Installs, builds and tests the TypeScript SDK against a real `asbx up`.
set -euo pipefail
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
if [ -z "${ASBX_BIN:-}" ] && [ ! -x "$root/target/debug/asbx" ]; then
  (cd "$root" && cargo build -p asbx)
fi
npm ci --no-audit --no-fund --loglevel=error
# The REST types are generated from the checked-in OpenAPI documents: a
# document that changed without `npm run gen:types` fails here.
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
for doc in workspace runner; do
  npx --no-install openapi-typescript "$root/openapi/$doc.json" -o "$gen/$doc.ts" >/dev/null 2>&1
  cmp -s "$gen/$doc.ts" "src/openapi/$doc.ts" || {
    echo "sdk/typescript: src/openapi/$doc.ts is out of date with openapi/$doc.json; run npm run gen:types" >&2
    exit 1
  }
done
# The event and code unions are generated from schemas/ the same way.
node scripts/gen-unions.mjs --check
npm run build
npm run typecheck
npm test
