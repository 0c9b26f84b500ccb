#!/usr/bin/env bash
# The inbox counters' write contention (docs/lab/history/2026-12-03-inbox-counts.md). pgbench, 16
# clients, against a database of one tenant shaped like the seed's 55% one (setup.sql: 10
# inboxes, 117 agents, 200,000 conversations). Half the transactions change a random
# conversation's status and assignee (update.sql), half open a conversation, open and
# unassigned, in one of the two busiest inboxes (create.sql: the hottest bucket there is).
# Both lock and write as `conversations::update` and `conversations::create` do, with:
#   none    no counters, the baseline;
#   tenant  one counter row per tenant, written by every change (*_tenant.sql);
#   bucket  the migration's counters (`counts::shift`'s statements, *_bucket.sql), the shard
#           function set to SHARDS shards (1: one row per inbox and status).
# Prints throughput, mean latency, and the share of busy pgbench sessions found waiting on a
# lock (pg_stat_activity sampled every 50 ms), then checks the counters against COUNT(*).
#
# Usage: run.sh [ROUNDS]    env: SECONDS_EACH (15), CLIENTS (16), PGURL (the server)
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${1:-2}
. ../lib.sh
fresh_database counts_contention

run() {
  local variant=$1 shards=$2
  $P -c "CREATE OR REPLACE FUNCTION conversation_counts_shard(id uuid) RETURNS smallint
           LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT RETURN get_byte(uuid_send(id), 15) % $shards" \
     -c "TRUNCATE conversation_counts, conversation_assignee_counts" \
     -c "INSERT INTO conversation_counts (tenant_id, inbox_id, status, shard, total, unassigned)
           SELECT tenant_id, inbox_id, status, conversation_counts_shard(id), count(*),
                  count(*) FILTER (WHERE assignee_id IS NULL)
           FROM conversations GROUP BY 1, 2, 3, 4" \
     -c "INSERT INTO conversation_assignee_counts (tenant_id, assignee_id, inbox_id, status, n)
           SELECT tenant_id, assignee_id, inbox_id, status, count(*)
           FROM conversations WHERE assignee_id IS NOT NULL GROUP BY 1, 2, 3, 4" \
     -c "VACUUM ANALYZE conversation_counts, conversation_assignee_counts" -c "CHECKPOINT"
  measure "$(printf '%-7s shards=%s' "$variant" "$shards")" \
    -f "$(script update "$variant")" -f "$(script create "$variant")"
}

for _ in $(seq 1 "$ROUNDS"); do
  run none 1; run tenant 1; run bucket 1; run bucket 8
done
# The last run's counters against COUNT(*): every line must say 0.
$P -At -f check.sql
