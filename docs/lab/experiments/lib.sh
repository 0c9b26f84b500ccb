# Shared by the pgbench experiments' run.sh scripts (sourced, from the experiment's directory):
# their settings, a fresh migrated database, scripts assembled from a common body and a
# variant's statements, and one timed run with its lock waits sampled.
#
# env: SECONDS_EACH (15), CLIENTS (16), PGURL (the server)
SECONDS_EACH=${SECONDS_EACH:-15}
CLIENTS=${CLIENTS:-16}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
SCRIPTS=$(mktemp -d)
trap 'rm -rf "$SCRIPTS"' EXIT

# fresh_database DB: DB dropped and created again, migrated, and set up with the counts
# experiment's tenant (setup.sql: 10 inboxes, 117 agents, 200,000 conversations). Sets P, a psql
# command line on it.
fresh_database() {
  DB=$1
  psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
  P="psql -q -v ON_ERROR_STOP=1 $PGURL/$DB"
  local f
  for f in ../../../../migrations/*.sql; do $P -f "$f"; done
  $P -f ../counts-contention/setup.sql
}

# script BODY VARIANT: the path of a pgbench script made of BODY.sql (a transaction left open),
# then BODY_VARIANT.sql if there is one (the variant's own statements), then COMMIT.
script() {
  local out="$SCRIPTS/$1_$2.sql"
  { cat "$1.sql"; if [ -f "$1_$2.sql" ]; then cat "$1_$2.sql"; fi; echo 'COMMIT;'; } > "$out"
  echo "$out"
}

# measure LABEL PGBENCH_ARGS...: runs pgbench (CLIENTS clients, SECONDS_EACH s) with the given
# scripts while sampling, every 50 ms, the share of its busy sessions waiting on a lock; prints
# LABEL, the throughput, the mean latency, that share and the count of errors.
measure() {
  local label=$1; shift
  local out; out=$(mktemp)
  pgbench -n -M simple -c "$CLIENTS" -j 2 -T "$SECONDS_EACH" "$@" "$PGURL/$DB" > "$out" 2>&1 &
  local bench=$!
  local locks
  locks=$($P -At -c "CREATE TEMP TABLE s (lock int, busy int)" \
    -c "DO \$\$ BEGIN FOR i IN 1..$((SECONDS_EACH * 20 - 10)) LOOP
          INSERT INTO s SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*)
            FROM pg_stat_activity WHERE datname = '$DB' AND application_name = 'pgbench' AND state <> 'idle';
          COMMIT; PERFORM pg_sleep(0.05); END LOOP; END \$\$" \
    -c "SELECT round(100.0 * sum(lock) / nullif(sum(busy), 0), 1) FROM s" | tail -1)
  wait "$bench"
  printf '%s clients=%s: tps=%s latency_avg_ms=%s lock_wait_pct=%s errors=%s\n' \
    "$label" "$CLIENTS" "$(awk '/^tps/ {print $3}' "$out")" \
    "$(awk '/^latency average/ {print $4}' "$out")" "$locks" "$(grep -c error "$out" || true)"
  rm -f "$out"
}
