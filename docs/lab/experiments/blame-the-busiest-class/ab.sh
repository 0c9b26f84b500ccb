#!/usr/bin/env bash
# Congestion blamed on the class holding the most in flight, against the commit before, where each
# class's target floor backed off for its own latency: the lab's ramps (weighted and one tenant)
# and the weighted closed-loop sweep, adaptive only, the builds alternating in one sitting at one
# given capacity. Prints each step's 2xx/s, refused share and admitted p99.
#
# Usage, as root (the cgroup): build the lab's binaries (`cargo build --release --locked`), copy
# target/release/breakwater-api to BASE_API, apply blame-the-busiest.patch (`git apply`), build
# the API again and copy it to VARIANT_API, then
#   ab.sh BASE_API VARIANT_API [ROUNDS] [CAPACITY] [ONLY]   (3, 400, ramp,ramp-one,sweep)
# Each run's report goes to target/blame-busiest/NAME-ROUND/; target/release/breakwater-api is
# put back as it was.
set -euo pipefail
BASE=$1 VARIANT=$2 ROUNDS=${3:-3} CAPACITY=${4:-400} ONLY=${5:-ramp,ramp-one,sweep}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../ab-lib.sh"
ab_setup blame-busiest
[ -x "$BASE" ] && [ -x "$VARIANT" ] || { echo "no API at $BASE or $VARIANT (see Usage)" >&2; exit 2; }
cp "$API" "$OUT/api-before-ab"
cp "$BASE" "$OUT/api-base"
cp "$VARIANT" "$OUT/api-busiest"
trap 'cp "$OUT/api-before-ab" "$API"' EXIT

for round in $(seq "$ROUNDS"); do
  for name in base busiest; do
    cp "$OUT/api-$name" "$API"
    ab_run "$name" "$round" "$CAPACITY" "$ONLY"
  done
done
