#!/usr/bin/env bash
# The retry hold's A/B (docs/ADMISSION.md, "Callers that ignore Retry-After"): variants one after
# another in one sitting, the release API pinned at 0.25 core / 512 MiB (`cargo xtask pinned`,
# root), throttles off, a closed loop of one token of the 55% tenant on its open inbox.
#
# Before: `cargo build --release -p breakwater-api -p breakwater-seed -p breakwater-loadlab`,
# `cargo build -p xtask`, the full default seed in `breakwater_bench`
# (`DATABASE_URL=.../breakwater_bench target/release/breakwater-seed`), and in
# OUT_ROOT/tokens.jsonl one line {"tenant_id","user_id","token","weight"} for the biggest
# tenant's admin (both ids are printed by the seeder; `breakwater-api token` mints the token).
#
# Usage: OUT_ROOT=/some/dir run.sh ROUND VARIANT...   VARIANT: off, off-hold, adaptive,
# adaptive-hold, static, static-hold (-hold: RETRY_HOLD_MAX_MS=1000, otherwise 0).
set -uo pipefail
OUT_ROOT=${OUT_ROOT:?set OUT_ROOT}
cd "$(git rev-parse --show-toplevel)"
DB=postgres://postgres@127.0.0.1:5432/breakwater_bench
PORT=18090
URL="http://127.0.0.1:$PORT/v1/conversations?status=open&limit=25"
OUT=$OUT_ROOT/$1; mkdir -p "$OUT"; shift
CALLERS=${CALLERS:-4,32,192,1000}
STEP=${STEP:-10s}
for variant in "$@"; do
  mode=${variant%%-*}; hold=0
  case "$variant" in *-hold) hold=1000;; esac
  APP_ENV=development DATABASE_URL=$DB BIND_ADDR=127.0.0.1:$PORT THROTTLES=off ADMISSION=$mode \
    ADMISSION_STATIC_LIMIT=80 RETRY_HOLD_MAX_MS=$hold LOG_FORMAT=json RUST_LOG=warn \
    target/debug/xtask pinned -- target/release/breakwater-api serve > "$OUT/$variant.api.log" 2>&1 &
  runner=$!
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
  # warm the caches
  target/release/loadlab --threads 1 sweep --url "$URL" --tokens $OUT_ROOT/tokens.jsonl --concurrency 4 --step 3s --pause 0s --quiet > /dev/null 2>&1
  target/release/loadlab --threads 1 sweep --url "$URL" --tokens $OUT_ROOT/tokens.jsonl --concurrency "$CALLERS" \
    --step "$STEP" --pause 3s --ops-url "http://127.0.0.1:$PORT/v1/ops/status" --out "$OUT/$variant.json" --quiet > "$OUT/$variant.txt" 2>&1
  curl -s "http://127.0.0.1:$PORT/v1/ops/status" > "$OUT/$variant.ops.json"
  kill -TERM $runner; wait $runner
  echo "== $variant"; cat "$OUT/$variant.txt"
done
