#!/usr/bin/env bash
# Callers that keep coming back before their Retry-After, told twice as long each time (up to the
# longest hold), against the commit before, which told them what the refusing limit said: the
# lab's closed-loop sweeps of spinning callers (weighted and one tenant), adaptive only, the
# builds alternating in one sitting at one given capacity. Prints each step's 2xx/s, refused share
# and admitted p99.
#
# Usage, as root (the cgroup): build the lab's binaries (`cargo build --release --locked`), copy
# target/release/breakwater-api to BASE_API, apply told-longer.patch (`git apply`), build the API
# again, then
#   ab.sh BASE_API [ROUNDS] [CAPACITY] [ONLY]   (ROUNDS: 3, CAPACITY: 450, ONLY: sweep,sweep-one) Arms: base; told longer with the default longest hold
# (2 s); told longer with RETRY_HOLD_MAX_MS=4000. Each run's report goes to
# target/early-callers/NAME-ROUND/; target/release/breakwater-api is put back as it was.
set -euo pipefail
BASE=$1 ROUNDS=${2:-3} CAPACITY=${3:-450} ONLY=${4:-sweep,sweep-one}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../ab-lib.sh"
ab_setup early-callers
[ -x "$BASE" ] || { echo "no base API at $BASE (see Usage)" >&2; exit 2; }
cp "$API" "$OUT/api-told-longer"
cp "$BASE" "$OUT/api-base"
trap 'cp "$OUT/api-told-longer" "$API"' EXIT

for round in $(seq "$ROUNDS"); do
  for name in base longer-2s longer-4s; do
    case $name in
      base) cp "$OUT/api-base" "$API"; env=() ;;
      longer-2s) cp "$OUT/api-told-longer" "$API"; env=() ;;
      longer-4s) cp "$OUT/api-told-longer" "$API"; env=(--api-env RETRY_HOLD_MAX_MS=4000) ;;
    esac
    ab_run "$name" "$round" "$CAPACITY" "$ONLY" "${env[@]}"
  done
done
