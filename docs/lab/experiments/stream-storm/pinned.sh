#!/usr/bin/env bash
# #26's reconnection storm at the production shape: STREAMS streams opened all at once (as after a
# task's restart), against one fresh pinned API (0.25 core / 512 MiB, the lab's production tier)
# on a 50-tenant small seed, with the production settings: the throttles on (Redis
# at REDIS_URL), their limits out of the way so that only admission and the edge refuse,
# `LISTEN_BACKLOG` at its default. Per storm:
# - the time until every stream was open (goal 30 s), the opening's p50 / p99 from the first
#   attempt, the refusals at opening (by status, and by code with the longest Retry-After each
#   gave);
# - where an opening's time went: the TCP connect's p99 (a wait in the listen queue, or a SYN
#   the kernel dropped and the client sent again a second or more later) and the admitted
#   request's p50 / p99 (sent on an open connection, to the stream's first frame; goal 200 ms),
#   and the same apart for openings sent as a new connection's first request (which wait for
#   the server to accept the connection) and on a connection kept from a refusal;
# - the SYNs the kernel dropped from the full listen queue (`ListenOverflows` in
#   /proc/net/netstat, machine-wide, over the storm);
# - `/health` probed every 100 ms on the public listener, which the storm shares, and on the ops
#   listener, which it does not, and `/ready` (the balancer's check, which asks PostgreSQL and
#   Redis) on the ops listener, each probe on a new connection, given up after 5 s: the probes
#   over 1 s and the slowest (goal: always answering).
# ROUNDS storms, 15 s apart, each on a fresh API.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` of breakwater-api,
# breakwater-seed, loadlab and xtask:   pinned.sh [ROUNDS]   (the shared parts: ../pinned-api.sh)
# env: STREAMS (10000), HOLD (10), PGURL (the server), REDIS_URL (redis://127.0.0.1:6379),
#      API_ENV (more of the API's settings as NAME=value words, over the tier's: a variant),
#      API_BIN (the API binary; target/release's by default)
source "$(dirname "$0")/../pinned-api.sh"
STREAMS=${STREAMS:-10000}
HOLD=${HOLD:-10}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
DB=stream_storm_pinned
PORT=18500
PROBERS=
cleanup_more() { if [ -n "$PROBERS" ]; then kill $PROBERS 2>/dev/null || true; fi; }
# probe LISTENER_PORT PATH OUT: PATH every 100 ms until killed; a line per probe: status, seconds.
probe() {
  while :; do
    curl -s -o /dev/null -m 5 -w '%{http_code} %{time_total}\n' "http://127.0.0.1:$1$2" || echo "000 5"
    sleep 0.1
  done > "$3"
}
# The kernel's count of SYNs dropped because a listen queue was full.
listen_overflows() { awk '/^TcpExt:/ { if (!seen++) { split($0, h); next } for (i = 2; i <= NF; i++) if (h[i] == "ListenOverflows") print $i }' /proc/net/netstat; }
# health_line STORM WHAT FILE: the probes, those over 1 s or failed, the slowest.
health_line() {
  awk -v r="$1" -v what="$2" '{n++; if ($1 != "200" || $2 > 1) f++; if ($2 > m) m = $2}
    END {printf "storm %s: %s: %d probes, %d failed or over 1 s, slowest %.0f ms\n", r, what, n, f, m * 1000}' "$3"
}
ulimit -n "$(ulimit -Hn)"   # each stream is a socket on both sides

seed_streams_data

BIG=1000000
for r in $(seq 1 "$ROUNDS"); do
  # shellcheck disable=SC2086 # API_ENV is words
  start_api "storm-$r" "${API_BIN:-$BIN/breakwater-api}" THROTTLES=on REDIS_URL="$REDIS_URL" \
    THROTTLE_KEY_PREFIX="storm-$$-$r" \
    THROTTLE_TENANT_RATE=$BIG THROTTLE_TENANT_BURST=$BIG THROTTLE_USER_RATE=$BIG THROTTLE_USER_BURST=$BIG \
    THROTTLE_IP_RATE=$BIG THROTTLE_IP_BURST=$BIG \
    MAX_CONNECTIONS=12000 STREAM_MAX=11000 STREAM_MAX_PER_TENANT=1000 ${API_ENV:-}
  probe "$PORT" /health "$WORK/health-$r.txt" &
  PROBERS=$!
  probe "$((PORT + 1))" /health "$WORK/ops-health-$r.txt" &
  PROBERS="$PROBERS $!"
  probe "$((PORT + 1))" /ready "$WORK/ops-ready-$r.txt" &
  PROBERS="$PROBERS $!"
  overflows=$(listen_overflows)
  "$BIN/loadlab" streams --base "http://127.0.0.1:$PORT" --tokens "$WORK/tokens.jsonl" --streams "$STREAMS" \
    --open-rate 0 --hold "${HOLD}s" --out "$WORK/storm-$r.json" > /dev/null 2>&1 || true
  overflows=$(($(listen_overflows) - overflows))
  kill $PROBERS 2>/dev/null || true; wait $PROBERS 2>/dev/null || true; PROBERS=
  jq -r --arg r "$r" '"storm \($r): \(.opened) of \(.streams) open in \(.all_open_seconds * 10 | round / 10) s; opening p50 \(.open.p50_ms / 100 | round / 10) s, p99 \(.open.p99_ms / 100 | round / 10) s; refused at opening \(.refused); errors \(.errors)"' "$WORK/storm-$r.json"
  jq -r --arg r "$r" '"storm \($r): refusals by code: \(.refusal_codes | to_entries | map("\(.key) \(.value.count) (longest Retry-After \(.value.longest_retry_after_seconds) s)") | join(", "))"' "$WORK/storm-$r.json"
  jq -r --arg r "$r" --arg o "$overflows" '"storm \($r): connect p99 \(.connect.p99_ms / 100 | round / 10) s (\($o) SYNs dropped from a full listen queue); admitted p50 \(.admitted.p50_ms * 10 | round / 10) ms, p99 \(.admitted.p99_ms * 10 | round / 10) ms"' "$WORK/storm-$r.json"
  jq -r --arg r "$r" '"storm \($r): admitted as a new connection'"'"'s first request: \(.admitted_first_on_connection.count), p50 \(.admitted_first_on_connection.p50_ms * 10 | round / 10) ms, p99 \(.admitted_first_on_connection.p99_ms * 10 | round / 10) ms; on a kept connection: \(.admitted_on_kept_connection.count), p50 \(.admitted_on_kept_connection.p50_ms * 10 | round / 10) ms, p99 \(.admitted_on_kept_connection.p99_ms * 10 | round / 10) ms"' "$WORK/storm-$r.json"
  health_line "$r" "/health on the public listener" "$WORK/health-$r.txt"
  health_line "$r" "/health on the ops listener" "$WORK/ops-health-$r.txt"
  health_line "$r" "/ready on the ops listener" "$WORK/ops-ready-$r.txt"
  stop_api "storm-$r"
  [ "$r" = "$ROUNDS" ] || sleep 15
done
