#!/usr/bin/env bash
# What a refusal costs with and without the memory of verified tokens (`JwtKeys::principal`):
# the lab's refusal-only step (`cargo xtask lab --only refusals`: the API refusing everything,
# then a bare hyper server answering the same bytes, both pinned at 0.25 core / 512 MiB, 16
# closed-loop callers kept alive and on new connections) for two API binaries, alternating, in
# one sitting. Prints each run's CPU per refusal, kept alive, the API's against the bare server's.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` (the lab's binaries) and a
# release build of the other commit's API, e.g. from a worktree of the commit before the memory:
#   git worktree add /some/dir c92ccba && (cd /some/dir && cargo build --release -p breakwater-api)
#   ab.sh OLD_API_BINARY NEW_API_BINARY [ROUNDS]      (ROUNDS: 3)
# Each run's report goes to target/verified-tokens/NAME-ROUND/; target/release/breakwater-api is
# put back as it was at the end.
set -euo pipefail
OLD=$1 NEW=$2 ROUNDS=${3:-3}
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
API=target/release/breakwater-api
OUT=target/verified-tokens
mkdir -p "$OUT"
cp "$API" "$OUT/api-as-built"
trap 'cp "$OUT/api-as-built" "$API"' EXIT
for round in $(seq "$ROUNDS"); do
  for name in old new; do
    if [ "$name" = old ]; then cp "$OLD" "$API"; else cp "$NEW" "$API"; fi
    cargo xtask lab --no-build --only refusals --variants adaptive --capacity 550 \
      --out "$OUT/$name-$round" > "$OUT/$name-$round.log" 2>&1
    echo "$name round $round: $(grep -h 'CPU per refusal, kept alive' "$OUT/$name-$round.log" | sed 's/.*; \([0-9.]* us against [0-9.]* us\).*/\1/')"
  done
done
