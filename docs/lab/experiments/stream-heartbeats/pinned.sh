#!/usr/bin/env bash
# The inbox list's tail while 5,000 idle streams are open, at the production shape: #26's goal
# (its p99 within 20% of the same load with no stream open), with VARIANTS among:
#   grid100ms  this commit's API: heartbeats on a 100 ms grid, the first a whole interval after
#              the opening, so 5,000 streams opened within five seconds share 50 of a 20 s
#              interval's 200 ticks;
#   silent     the same build with STREAM_HEARTBEAT_SECS=70: the streams are open but send no
#              heartbeat during the run, the control that tells the heartbeats' share of a rise
#              from the open streams' other costs;
#   phase      the same commit with first-phase.patch applied: each stream's first heartbeat at
#              a random point of its first interval, so streams opened together beat at
#              different ticks (measured on 2026-12-04 and not kept); built into
#              target/stream-heartbeats.
# (The whole-second grid that the 100 ms grid replaced was measured with this script's version
# at d265817, whose whole-second.patch applied there.)
# Each run is a fresh API, pinned at 0.25 core / 512 MiB (`xtask pinned`, the lab's production
# tier; throttles off, the stream caps out of the way) on a 50-tenant small seed. RATE req/s of
# `GET /v1/conversations?status=open` over the 50 tenants' tokens for SECONDS_EACH with no
# stream open, then again SETTLE s after STREAMS idle streams began opening at 1,000 a second
# (`loadlab streams`, held through the second load), then again 3 s after they closed (the
# same process later, without streams: how far the baseline drifts within a run). Prints the
# corrected p99 of the three, the ratios with / without and with / after, and the pinned
# wrapper's account of the process; the rounds rotate which variant goes first.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` of breakwater-api,
# breakwater-seed, loadlab and xtask:   pinned.sh [ROUNDS]   (the shared parts: ../pinned-api.sh)
# env: VARIANTS ("grid100ms silent"), SECONDS_EACH (30), RATE (420: half the capacity measured on
#      this data set on 2026-12-04, on a slower machine), STREAMS (5000), SETTLE (7), PGURL (the
#      server)
source "$(dirname "$0")/../pinned-api.sh"
SECONDS_EACH=${SECONDS_EACH:-30}
RATE=${RATE:-420}
STREAMS=${STREAMS:-5000}
SETTLE=${SETTLE:-7}
read -r -a VARIANTS <<< "${VARIANTS:-grid100ms silent}"
DB=stream_heartbeats_pinned
PORT=18490
PHASE=$ROOT/target/stream-heartbeats/release/breakwater-api
STREAMER=
cleanup_more() { if [ -n "$STREAMER" ]; then kill "$STREAMER" 2>/dev/null || true; fi; }
ulimit -n "$(ulimit -Hn)"   # each stream is a socket on both sides

seed_streams_data

if [[ " ${VARIANTS[*]} " == *" phase "* ]]; then
  build_variant "$HERE/first-phase.patch" "$ROOT/target/stream-heartbeats"
fi

# inbox OUT: RATE req/s of the inbox list for SECONDS_EACH; prints its corrected p99, ms.
inbox() {
  "$BIN/loadlab" ramp --url "http://127.0.0.1:$PORT/v1/conversations?status=open" --rates "$RATE" \
    --step "${SECONDS_EACH}s" --pause 0s --tokens "$WORK/tokens.jsonl" --quiet --out "$1" > /dev/null 2>&1
  jq -r '.steps[0] | "\(.ok.corrected.p99_ms) (p50 \(.ok.corrected.p50_ms), refused \(.refused.count), errors \(.errors.count))"' "$1"
}

# ratio A B: the corrected p99 of run A over run B's.
ratio() {
  jq -rn --slurpfile a "$WORK/$1.json" --slurpfile b "$WORK/$2.json" \
    '$a[0].steps[0].ok.corrected.p99_ms / $b[0].steps[0].ok.corrected.p99_ms * 1000 | round / 1000'
}

# run VARIANT: a fresh pinned API; the inbox list without streams, with them open, and after.
run() {
  local variant=$1 server=$BIN/breakwater-api beat=()
  [ "$variant" = phase ] && server=$PHASE
  [ "$variant" = silent ] && beat=(STREAM_HEARTBEAT_SECS=70)
  start_api "$variant" "$server" THROTTLES=off MAX_CONNECTIONS=12000 STREAM_MAX=11000 STREAM_MAX_PER_TENANT=1000 \
    "${beat[@]}"
  SECONDS_EACH=5 inbox "$WORK/warm.json" > /dev/null
  local without with after
  without=$(inbox "$WORK/$variant-without.json")
  "$BIN/loadlab" streams --base "http://127.0.0.1:$PORT" --tokens "$WORK/tokens.jsonl" --streams "$STREAMS" \
    --open-rate 1000 --hold "$((SETTLE + SECONDS_EACH + 3))s" --out "$WORK/$variant-streams.json" > /dev/null 2>&1 &
  STREAMER=$!
  sleep "$SETTLE"
  with=$(inbox "$WORK/$variant-with.json")
  wait "$STREAMER" || true; STREAMER=
  sleep 3
  after=$(inbox "$WORK/$variant-after.json")
  local opened; opened=$(jq -r '"\(.opened) of \(.streams) streams opened, \(.heartbeats) heartbeats"' "$WORK/$variant-streams.json")
  echo "$variant: p99 ms without streams $without; with $with; after $after; $opened"
  echo "$variant: with / without = $(ratio "$variant-with" "$variant-without"); with / after = $(ratio "$variant-with" "$variant-after")"
  stop_api "$variant"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r"
  n=${#VARIANTS[@]}
  for i in $(seq 0 $((n - 1))); do run "${VARIANTS[$(((i + r - 1) % n))]}"; done
done
