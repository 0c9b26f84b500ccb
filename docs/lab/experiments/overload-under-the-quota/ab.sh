#!/usr/bin/env bash
# Sustained overload (CoDel's short wait and the door for the tenant causing it) as it is, never,
# or from the idle clock alone (without the rule that a window offered 25% more than it admitted
# is overload at once): the lab's ramp, adaptive only, the three settings alternating in one
# sitting at one given capacity, one API build with overload-rule.patch applied (the setting is
# read from BW_OVERLOAD, an experiment's switch that the patch adds). Prints each step's 2xx/s,
# refused share and admitted p99.
#
# Usage, as root (the cgroup): apply overload-rule.patch (`git apply`), build the lab's binaries
# (`cargo build --release --locked`), then
#   ab.sh [ROUNDS] [CAPACITY] [ONLY] [SETTINGS]   (2, 1200, ramp, "default never idle")
# and take the patch out again afterwards (`git apply -R overload-rule.patch`, then build).
# Each run's report goes to target/overload-rule/NAME-ROUND/.
set -euo pipefail
ROUNDS=${1:-2} CAPACITY=${2:-1200} ONLY=${3:-ramp} SETTINGS=${4:-default never idle}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../ab-lib.sh"
ab_setup overload-rule
for round in $(seq "$ROUNDS"); do
  for name in $SETTINGS; do
    ab_run "$name" "$round" "$CAPACITY" "$ONLY" --api-env "BW_OVERLOAD=$name"
  done
done
