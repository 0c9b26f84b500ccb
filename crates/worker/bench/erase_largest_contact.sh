#!/usr/bin/env bash
# Measures the erasure of the largest contact of the largest tenant on a fully seeded database:
# the plans of the erase statements (no sequential scan), the job's duration, and the latency of
# inbox reads of the same tenant running concurrently (baseline, then during the erasure).
#
# Usage: DATABASE_URL=postgres://.../a_copy_of_the_full_seed crates/worker/bench/erase_largest_contact.sh
# It erases data: point it at a copy (CREATE DATABASE x TEMPLATE <seeded db>), migrated.
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL to a copy of the fully seeded database}"
BATCH="${WORKER_ERASE_BATCH:-2000}"
READERS="${READERS:-4}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

read -r TENANT CONTACT CONVS MSGS < <(psql "$DATABASE_URL" -AtF ' ' -c "
  WITH big AS (SELECT tenant_id FROM conversations GROUP BY 1 ORDER BY count(*) DESC LIMIT 1)
  SELECT c.tenant_id, c.contact_id, count(*), sum(c.message_count)
  FROM conversations c JOIN big USING (tenant_id) JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
  WHERE ct.erased_at IS NULL
  GROUP BY 1, 2 ORDER BY 4 DESC LIMIT 1")
echo "tenant $TENANT, contact $CONTACT: $CONVS conversations, $MSGS messages"

echo "--- plans of the first batch of each erase statement (rolled back)"
psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -q <<SQL | grep -E "Scan|Delete|Limit|Execution Time" | sed 's/^ *//'
BEGIN;
EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM messages m
 USING (SELECT m2.tenant_id, m2.id FROM conversations c
        JOIN messages m2 ON m2.tenant_id = c.tenant_id AND m2.conversation_id = c.id
        WHERE c.tenant_id = '$TENANT' AND c.contact_id = '$CONTACT' LIMIT $BATCH) doomed
 WHERE m.tenant_id = doomed.tenant_id AND m.id = doomed.id;
ROLLBACK;
BEGIN;
DELETE FROM messages WHERE tenant_id = '$TENANT' AND conversation_id IN
  (SELECT id FROM conversations WHERE tenant_id = '$TENANT' AND contact_id = '$CONTACT');
EXPLAIN (ANALYZE, COSTS OFF) DELETE FROM conversations c
 USING (SELECT id FROM conversations WHERE tenant_id = '$TENANT' AND contact_id = '$CONTACT' LIMIT $BATCH) doomed
 WHERE c.tenant_id = '$TENANT' AND c.id = doomed.id;
ROLLBACK;
SQL

# The inbox's first page for the tenant, as conversations::list reads it.
cat > "$tmp/inbox.sql" <<SQL
SELECT c.id, c.inbox_id, c.contact_id, ct.name, c.assignee_id, c.status, c.created_at, c.last_activity_at,
       c.last_message_preview, c.message_count
FROM conversations c JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
WHERE c.tenant_id = '$TENANT' AND ct.erased_at IS NULL
  AND (c.last_activity_at, c.id) < ('infinity'::timestamptz, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
ORDER BY c.last_activity_at DESC, c.id DESC LIMIT 26;
SQL

latency() { # pgbench per-transaction log -> p50 / p99 / max in ms
  cat "$1"/pgbench_log.* | awk '{print $3/1000}' | sort -n | awk '{a[NR]=$1} END {
    printf "%d reads, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", NR, a[int(NR*0.5)+1], a[int(NR*0.99)+1], a[NR] }'
  rm -f "$1"/pgbench_log.*
}

echo "--- inbox reads, baseline (3 s, $READERS clients)"
(cd "$tmp" && pgbench -n -c "$READERS" -j 2 -T 3 -l -f inbox.sql "$DATABASE_URL" >/dev/null 2>&1)
latency "$tmp"

echo "--- erasure through the worker, with inbox reads running"
JOB=$(psql "$DATABASE_URL" -At -v ON_ERROR_STOP=1 <<SQL | grep -E '^[0-9a-f-]{36}$'
BEGIN;
UPDATE contacts SET erased_at = now() WHERE tenant_id = '$TENANT' AND id = '$CONTACT';
INSERT INTO jobs (id, tenant_id, kind, payload, unique_key, max_attempts, priority)
VALUES (gen_random_uuid(), '$TENANT', 'erase_contact', json_build_object('contact_id', '$CONTACT'),
        'erase_contact:$TENANT:$CONTACT', 25, 1) RETURNING id;
COMMIT;
SQL
)
(cd "$tmp" && pgbench -n -c "$READERS" -j 2 -T 4 -l -f inbox.sql "$DATABASE_URL" >/dev/null 2>&1) &
readers=$!
sleep 1
WORKER_KINDS=erase_contact WORKER_EXIT_WHEN_IDLE=true WORKER_ERASE_BATCH="$BATCH" RUST_LOG=warn \
  cargo run -q --release -p breakwater-worker >/dev/null
wait "$readers"
latency "$tmp"
psql "$DATABASE_URL" -At -c "SELECT 'job ' || state || ' after ' || attempts || ' attempt(s); erasure took ' ||
  round(extract(epoch FROM finished_at - attempted_at) * 1000, 1) || ' ms' FROM jobs WHERE id = '$JOB'"
psql "$DATABASE_URL" -At -c "SELECT 'left: ' || (SELECT count(*) FROM conversations WHERE tenant_id = '$TENANT' AND contact_id = '$CONTACT')
  || ' conversations, ' || (SELECT count(*) FROM contacts WHERE tenant_id = '$TENANT' AND id = '$CONTACT') || ' contact'"
