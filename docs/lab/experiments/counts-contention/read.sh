#!/usr/bin/env bash
# The counts' read on a seeded database (docs/lab/history/2026-12-03-inbox-counts.md): the query of
# `breakwater_domain::counts::get` (a copy of its text: keep the two alike) for the biggest
# tenant, its busiest agent as "mine", the whole tenant and its busiest inbox; then the
# `COUNT(*)` the counters replace. pgbench -M prepared (as sqlx's statement cache), one client,
# p50 and p99 from its per-transaction log.
#
# Usage: read.sh DATABASE_URL [SECONDS]   (a database the seeder filled)
set -euo pipefail
URL=${1:?a seeded database URL}
SECONDS_EACH=${2:-10}
q() { psql -At "$URL" -c "$1"; }
T=$(q "SELECT tenant_id FROM conversations GROUP BY 1 ORDER BY count(*) DESC LIMIT 1")
A=$(q "SELECT assignee_id FROM conversation_assignee_counts WHERE tenant_id = '$T' GROUP BY 1 ORDER BY sum(n) DESC LIMIT 1")
I=$(q "SELECT inbox_id FROM conversation_counts WHERE tenant_id = '$T' GROUP BY 1 ORDER BY sum(total) DESC LIMIT 1")
echo "tenant $T: $(q "SELECT count(*) FROM conversation_counts WHERE tenant_id = '$T'") counter rows, agent $A, inbox $I"
dir=$(mktemp -d)
counts() {
  cat <<SQL
SELECT s.status, coalesce(t.total, 0), coalesce(m.n, 0), coalesce(t.unassigned, 0)
FROM unnest(enum_range(NULL::conversation_status)) s (status)
LEFT JOIN (SELECT status, sum(total) AS total, sum(unassigned) AS unassigned
           FROM conversation_counts WHERE tenant_id = '$T' $1 GROUP BY status) t ON t.status = s.status
LEFT JOIN (SELECT status, sum(n) AS n FROM conversation_assignee_counts
           WHERE tenant_id = '$T' AND assignee_id = '$A' $1 GROUP BY status) m ON m.status = s.status;
SQL
}
counts "" > "$dir/tenant.sql"
counts "AND inbox_id = '$I'" > "$dir/inbox.sql"
cat > "$dir/count_star.sql" <<SQL
SELECT c.status, count(*), count(*) FILTER (WHERE c.assignee_id = '$A'), count(*) FILTER (WHERE c.assignee_id IS NULL)
FROM conversations c JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
WHERE c.tenant_id = '$T' AND ct.erased_at IS NULL GROUP BY c.status;
SQL
for name in tenant inbox count_star; do
  (cd "$dir" && pgbench -n -M prepared -c 1 -T "$SECONDS_EACH" -f "$name.sql" --log --log-prefix="lat_$name" "$URL" > /dev/null 2>&1)
  cat "$dir"/lat_"$name"* | awk '{print $3}' | sort -n |
    awk -v q="$name" '{a[NR] = $1} END {printf "%-10s n=%d p50=%.2f ms p99=%.2f ms\n", q, NR, a[int(NR * 0.5)] / 1000, a[int(NR * 0.99)] / 1000}'
done
rm -rf "$dir"
