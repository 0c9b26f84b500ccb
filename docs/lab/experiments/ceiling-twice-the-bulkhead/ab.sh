#!/usr/bin/env bash
# A ceiling on the adaptive limit at twice the database bulkhead's slots (ADMISSION_MAX_LIMIT=20
# with the default DB_POOL_SIZE of 10) against admission's own ceiling (1000): the lab's weighted
# closed-loop sweep and open-loop ramp, adaptive only, the two settings alternating in one sitting
# at one given capacity. It is a setting, not a build: one binary serves both. Prints each
# step's 2xx/s, refused share and admitted p99.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` (the lab's binaries):
#   ab.sh [ROUNDS] [CAPACITY] [CEILING]      (ROUNDS: 2, CAPACITY: 800 req/s, CEILING: 20)
# Each run's report goes to target/ceiling/NAME-ROUND/.
set -euo pipefail
ROUNDS=${1:-2} CAPACITY=${2:-800} CEILING=${3:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../ab-lib.sh"
ab_setup ceiling

for round in $(seq "$ROUNDS"); do
  for name in base ceiling; do
    env_args=()
    [ "$name" = ceiling ] && env_args=(--api-env "ADMISSION_MAX_LIMIT=$CEILING")
    ab_run "$name" "$round" "$CAPACITY" sweep,ramp "${env_args[@]}"
  done
done
