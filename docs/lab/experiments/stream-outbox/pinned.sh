#!/usr/bin/env bash
# What the live inbox's event costs a message POST at the production shape, end to end (the
# goal's own terms; run.sh measures the database alone). The release API pinned at 0.25 core /
# 512 MiB (`xtask pinned`, one tokio worker and the accept rate as the lab's production tier),
# admission and throttles off (capacity is measured here, not protection), on the full default
# seed. CALLERS closed-loop callers (`loadlab sweep --body`, each on its own connection) POST a
# message, round-robin into 64 conversations of the seed's 55% tenant, for SECONDS_EACH after a
# 5 s warm-up, against each variant in a fresh process:
#   with     this commit's API;
#   without  the same commit with without-outbox.patch applied (the event's part taken out of
#            the post's statement), built into target/without-outbox.
# The rounds alternate which variant goes first. Prints each run's 2xx/s and latency and each
# round's ratio with/without.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` of breakwater-api,
# breakwater-seed, loadlab and xtask:   pinned.sh [ROUNDS]   (the shared parts: ../pinned-api.sh)
# env: SECONDS_EACH (20), CALLERS (16), PGURL (the server)
source "$(dirname "$0")/../pinned-api.sh"
SECONDS_EACH=${SECONDS_EACH:-20}
CALLERS=${CALLERS:-16}
DB=stream_outbox_pinned
PORT=18480
WITHOUT=$ROOT/target/without-outbox/release/breakwater-api

echo "seeding $DB (the full default seed)" >&2
psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB"
"$BIN/breakwater-seed" --database-url "$PGURL/$DB" > "$WORK/seed.log"

# The baseline. The patched query is not in the offline query data: sqlx checks it against the
# seeded database.
build_variant "$HERE/without-outbox.patch" "$ROOT/target/without-outbox" SQLX_OFFLINE=false DATABASE_URL="$PGURL/$DB"

P="psql -qAt -v ON_ERROR_STOP=1 $PGURL/$DB"
TENANT=$($P -c "SELECT tenant_id FROM conversations GROUP BY 1 ORDER BY count(*) DESC LIMIT 1")
USER_ID=$($P -c "SELECT id FROM users WHERE tenant_id = '$TENANT' ORDER BY id LIMIT 1")
echo "{\"tenant_id\":\"$TENANT\",\"user_id\":\"$USER_ID\"}" > "$WORK/tokens.jsonl"
URLS=()
for id in $($P -c "SELECT c.id FROM conversations c JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
                    WHERE c.tenant_id = '$TENANT' AND ct.erased_at IS NULL ORDER BY md5(c.id::text) LIMIT 64"); do
  URLS+=(--url "http://127.0.0.1:$PORT/v1/conversations/$id/messages")
done

# sweep SECONDS OUT: the closed loop against the running API.
sweep() {
  "$BIN/loadlab" sweep "${URLS[@]}" --body '{"body":"a benchmark message"}' --concurrency "$CALLERS" \
    --step "$1s" --pause 0s --tokens "$WORK/tokens.jsonl" --quiet --out "$2" > /dev/null 2>&1
}

# run VARIANT: a fresh pinned API, warmed, then measured; prints one line, leaves the 2xx/s in $WORK/VARIANT.
run() {
  local variant=$1 server=$BIN/breakwater-api
  [ "$variant" = without ] && server=$WITHOUT
  start_api "$variant" "$server" ADMISSION=off THROTTLES=off
  sweep 5 "$WORK/warm.json"
  local before; before=$(head -1 /proc/stat)
  sweep "$SECONDS_EACH" "$WORK/$variant.json"
  # The whole machine's busy share over the measured sweep (idle and iowait are not busy).
  local busy; busy=$(printf '%s\n%s\n' "$before" "$(head -1 /proc/stat)" |
    awk '{ t = 0; for (i = 2; i <= NF; i++) t += $i; idle[NR] = $5 + $6; total[NR] = t }
         END { printf "%.0f%%", 100 * (1 - (idle[2] - idle[1]) / (total[2] - total[1])) }')
  jq -r --arg v "$variant" '.steps[0] | "\($v | .+"       " | .[0:7]) 2xx/s=\(.goodput_rps | . * 10 | round / 10) p50_ms=\(.ok.uncorrected.p50_ms) p99_ms=\(.ok.uncorrected.p99_ms) refused=\(.refused.count) errors=\(.errors.count) machine_busy=\($busy)"' --arg busy "$busy" "$WORK/$variant.json"
  jq -r '.steps[0].goodput_rps' "$WORK/$variant.json" > "$WORK/$variant"
  stop_api "$variant"
}

for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then run with; run without; else run without; run with; fi
  echo "round $r: with / without = $(awk -v a="$(cat "$WORK/with")" -v b="$(cat "$WORK/without")" 'BEGIN { printf "%.3f", a / b }')"
done
