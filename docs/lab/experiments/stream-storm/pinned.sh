#!/usr/bin/env bash
# #26's reconnection storm at the production shape: STREAMS streams opened all at once (as after a
# task's restart), against one fresh pinned API (0.25 core / 512 MiB, the lab's production tier)
# on a 50-tenant small seed, with the production settings: the throttles on (Redis
# at REDIS_URL), their limits out of the way so that only admission and the edge refuse,
# `LISTEN_BACKLOG` at its default. Per storm: the time until every stream was open (goal 30 s),
# the opening's p50 / p99, the refusals at opening, and the slowest `/health` probe during it
# (goal: always answering; a probe gives up after 1 s). ROUNDS storms, 15 s apart, each on a fresh
# API.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` of breakwater-api,
# breakwater-seed, loadlab and xtask:   pinned.sh [ROUNDS]   (the shared parts: ../pinned-api.sh)
# env: STREAMS (10000), HOLD (10), PGURL (the server), REDIS_URL (redis://127.0.0.1:6379)
source "$(dirname "$0")/../pinned-api.sh"
STREAMS=${STREAMS:-10000}
HOLD=${HOLD:-10}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
DB=stream_storm_pinned
PORT=18500
PROBER=
cleanup_more() { if [ -n "$PROBER" ]; then kill "$PROBER" 2>/dev/null || true; fi; }
ulimit -n "$(ulimit -Hn)"   # each stream is a socket on both sides

seed_streams_data

BIG=1000000
for r in $(seq 1 "$ROUNDS"); do
  start_api "storm-$r" "$BIN/breakwater-api" THROTTLES=on REDIS_URL="$REDIS_URL" \
    THROTTLE_KEY_PREFIX="storm-$$-$r" \
    THROTTLE_TENANT_RATE=$BIG THROTTLE_TENANT_BURST=$BIG THROTTLE_USER_RATE=$BIG THROTTLE_USER_BURST=$BIG \
    THROTTLE_IP_RATE=$BIG THROTTLE_IP_BURST=$BIG \
    MAX_CONNECTIONS=12000 STREAM_MAX=11000 STREAM_MAX_PER_TENANT=1000
  # /health every 100 ms through the storm: the slowest answer and the failures (1 s timeout).
  (while :; do
     curl -s -o /dev/null -m 1 -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$PORT/health" || echo "000 1"
     sleep 0.1
   done) > "$WORK/health-$r.txt" &
  PROBER=$!
  "$BIN/loadlab" streams --base "http://127.0.0.1:$PORT" --tokens "$WORK/tokens.jsonl" --streams "$STREAMS" \
    --open-rate 0 --hold "${HOLD}s" --out "$WORK/storm-$r.json" > /dev/null 2>&1 || true
  kill "$PROBER" 2>/dev/null || true; wait "$PROBER" 2>/dev/null || true; PROBER=
  jq -r --arg r "$r" '"storm \($r): \(.opened) of \(.streams) open in \(.all_open_seconds * 10 | round / 10) s; opening p50 \(.open.p50_ms / 100 | round / 10) s, p99 \(.open.p99_ms / 100 | round / 10) s; refused at opening \(.refused); errors \(.errors)"' "$WORK/storm-$r.json"
  awk -v r="$r" '{n++; if ($1 != "200") f++; if ($2 > m) m = $2} END {printf "storm %s: /health %d probes, %d failed or over 1 s, slowest %.0f ms\n", r, n, f, m * 1000}' "$WORK/health-$r.txt"
  stop_api "storm-$r"
  [ "$r" = "$ROUNDS" ] || sleep 15
done
