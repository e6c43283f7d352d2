#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer on stable Rust (no sanitizer: the
# SanitizerCoverage passes only) and runs each for a few seconds from its
# checked-in corpus. Exits non-zero on any crash; prints each target's
# executions. Needs only the Rust toolchain and a C++ compiler (libfuzzer-sys
# builds its bundled libFuzzer with it; installed with apt when missing).
#
#   fuzz/ci.sh                 # build + 5 s per target
#   FUZZ_SECONDS=600 fuzz/ci.sh agent_line   # longer, one target
#   FUZZ_ARGS=-runs=10000000 fuzz/ci.sh ...    # more libFuzzer flags (later ones win)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
seconds="${FUZZ_SECONDS:-5}"
targets=(agent_line ndjson_decoder dispatch_request callback_payloads sse_framing egress_parse)
if (($# > 0)); then targets=("$@"); fi

if ! command -v c++ >/dev/null 2>&1; then
    echo "fuzz: no C++ compiler; installing g++" >&2
    if command -v sudo >/dev/null 2>&1 && [ "$(id -u)" != 0 ]; then s=sudo; else s=; fi
    $s apt-get update -qq && $s apt-get install -y -qq g++ >/dev/null
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
# What `cargo fuzz build -s none` passes, written out so plain stable cargo
# does it. `--target` keeps these flags off build scripts and proc macros.
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cllvm-args=-sanitizer-coverage-stack-depth \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo build --locked --release --target "$host" "${bins[@]}"

mkdir -p artifacts
fail=0
for t in "${targets[@]}"; do
    bin="${CARGO_TARGET_DIR:-target}/$host/release/$t"
    work="$(mktemp -d)"
    # Fuzz into a scratch copy: the checked-in corpus only grows by a merge.
    cp -r "corpus/$t/." "$work/" 2>/dev/null || true
    mkdir -p "artifacts/$t"
    log="$(mktemp)"
    if "$bin" "$work" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
        -rss_limit_mb=1024 -artifact_prefix="artifacts/$t/" -print_final_stats=1 \
        ${FUZZ_ARGS:-} >"$log" 2>&1; then
        status=ok
    else
        status=CRASH
        fail=1
        tail -n 40 "$log" >&2
    fi
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2 || true)"
    printf 'fuzz %-18s %-5s executions=%s coverage=%s seconds=%s\n' "$t" "$status" "${runs:-?}" "${cov:-?}" "$seconds"
    rm -rf "$work" "$log"
done
exit "$fail"
