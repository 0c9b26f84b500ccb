#!/usr/bin/env bash
# The target's floor backing off at most once per round trip (once-per-round-trip.patch) against
# this commit's, which backs off in every window whose p95 is over half the target: the lab's
# open-loop ramps, weighted and from one tenant, adaptive only, the two API builds alternating in
# one sitting at one given capacity. Prints each step's 2xx/s, refused share and admitted p99.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` (the lab's binaries):
#   ab.sh [ROUNDS] [CAPACITY]      (ROUNDS: 2, CAPACITY: 700 req/s)
# The variant's API is built from this commit with the patch applied, in its own worktree and
# target directory (target/floor-rtt/); each run's report goes to target/floor-rtt/NAME-ROUND/;
# target/release/breakwater-api is put back as it was at the end.
set -euo pipefail
ROUNDS=${1:-2} CAPACITY=${2:-700}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../ab-lib.sh"
ab_setup floor-rtt
cp "$API" "$OUT/api-base"
trap 'cp "$OUT/api-base" "$API"' EXIT

tree=$OUT/tree
git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
git worktree prune
git worktree add -q --detach "$tree" HEAD
git -C "$tree" apply "$HERE/once-per-round-trip.patch"
(cd "$tree" && CARGO_TARGET_DIR="$OUT" cargo build -q --release --locked -p breakwater-api --bin breakwater-api)
git worktree remove --force "$tree"
cp "$OUT/release/breakwater-api" "$OUT/api-rtt"

for round in $(seq "$ROUNDS"); do
  for name in base rtt; do
    cp "$OUT/api-$name" "$API"
    ab_run "$name" "$round" "$CAPACITY" ramp,ramp-one
  done
done
