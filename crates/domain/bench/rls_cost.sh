#!/usr/bin/env bash
# Measures what PostgreSQL row-level security on tenant_id would cost the inbox query, against
# the application's own tenant filter alone, in one run on one seeded database.
#
# Usage: DATABASE_URL=postgres://.../a_seeded_database crates/domain/bench/rls_cost.sh
# It adds two roles and RLS policies to that database (and removes them at the end): point it at
# a database of your own (`breakwater-seed` into a fresh name), never a shared one.
#
# Three variants of the same transaction, each run by pgbench (prepared statements, 2 clients) in
# ROUNDS interleaved rounds of RUN_SECONDS each, on the largest tenant's inbox, first page:
#   app      BEGIN; <inbox query with WHERE c.tenant_id = $1>; COMMIT     role with BYPASSRLS
#   app+set  BEGIN; set_config('app.tenant_id', $1, true); <same>; COMMIT role with BYPASSRLS
#   rls      BEGIN; set_config('app.tenant_id', $1, true); <same>; COMMIT role under the policies
# `app+set` isolates the extra round trip that setting the tenant per transaction costs from
# the cost of the policy itself. Latency medians come from pgbench's per-transaction logs.
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL to a seeded database of your own}"
ROUNDS="${ROUNDS:-3}"
SECONDS_PER_RUN="${RUN_SECONDS:-5}"
CLIENTS="${CLIENTS:-2}"
tmp="$(mktemp -d)"
cleanup() {
  psql "$DATABASE_URL" -q -v ON_ERROR_STOP=0 >/dev/null 2>&1 <<'SQL' || true
DROP POLICY IF EXISTS tenant_isolation ON conversations;
DROP POLICY IF EXISTS tenant_isolation ON contacts;
ALTER TABLE conversations DISABLE ROW LEVEL SECURITY;
ALTER TABLE contacts DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON conversations, contacts FROM bw_rls_app, bw_rls_bypass;
DROP ROLE IF EXISTS bw_rls_app;
DROP ROLE IF EXISTS bw_rls_bypass;
SQL
  rm -rf "$tmp"
}
trap cleanup EXIT

read -r TENANT CONVS < <(psql "$DATABASE_URL" -AtF ' ' -c "
  SELECT tenant_id, count(*) FROM conversations GROUP BY 1 ORDER BY 2 DESC LIMIT 1")
TOTAL="$(psql "$DATABASE_URL" -Atc "SELECT count(*) FROM conversations")"
echo "largest tenant $TENANT: $CONVS of $TOTAL conversations"

psql "$DATABASE_URL" -q -v ON_ERROR_STOP=1 <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bw_rls_app') THEN
    CREATE ROLE bw_rls_app LOGIN NOSUPERUSER NOBYPASSRLS;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bw_rls_bypass') THEN
    CREATE ROLE bw_rls_bypass LOGIN NOSUPERUSER BYPASSRLS;
  END IF;
END $$;
GRANT SELECT ON conversations, contacts TO bw_rls_app, bw_rls_bypass;
ALTER TABLE conversations ENABLE ROW LEVEL SECURITY;
ALTER TABLE contacts ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON conversations;
DROP POLICY IF EXISTS tenant_isolation ON contacts;
-- missing_ok: without the setting the policy compares with NULL and shows nothing.
CREATE POLICY tenant_isolation ON conversations
  USING (tenant_id = current_setting('app.tenant_id', true)::uuid);
CREATE POLICY tenant_isolation ON contacts
  USING (tenant_id = current_setting('app.tenant_id', true)::uuid);
SQL

# The inbox query exactly as conversations::list sends it for the unfiltered first page.
QUERY="SELECT c.id, c.inbox_id, c.contact_id, ct.name AS contact_name, c.assignee_id, c.status,
  c.created_at, c.last_activity_at, c.last_message_preview, c.message_count
  FROM conversations c
  JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
  WHERE c.tenant_id = :t AND ct.erased_at IS NULL
    AND (c.last_activity_at, c.id) < ('9999-12-31 23:59:59+00', 'ffffffff-ffff-ffff-ffff-ffffffffffff')
  ORDER BY c.last_activity_at DESC, c.id DESC LIMIT 26;"
printf 'BEGIN;\n%s\nCOMMIT;\n' "$QUERY" >"$tmp/app.sql"
printf "BEGIN;\nSELECT set_config('app.tenant_id', :t, true);\n%s\nCOMMIT;\n" "$QUERY" >"$tmp/set.sql"

as_role() { # role: the same URL with another user
  printf '%s' "$DATABASE_URL" | sed -E "s#^(postgres(ql)?://)([^@/]*@)?#\1$1@#"
}

echo "--- plans (the policy must not change the index the query uses)"
LITERAL="${QUERY//:t/\'$TENANT\'}"
for variant in bypass app; do
  psql "$(as_role "bw_rls_$variant")" -q -v ON_ERROR_STOP=1 <<SQL | grep -E "Scan|Filter|Index Cond|Execution Time" | sed "s/^ */[$variant] /"
BEGIN;
SELECT set_config('app.tenant_id', '$TENANT', true) \\g /dev/null
EXPLAIN (ANALYZE, COSTS OFF) $LITERAL
COMMIT;
SQL
done

run() { # name role script round
  pgbench "$(as_role "$2")" -n -M prepared -c "$CLIENTS" -j 1 -T "$SECONDS_PER_RUN" -D t="$TENANT" \
    -f "$tmp/$3.sql" -l --log-prefix="$tmp/$1-$4" >/dev/null 2>"$tmp/$1-$4.err" \
    || { cat "$tmp/$1-$4.err" >&2; exit 1; }
}
echo "--- rows each variant reads (the same page, or the comparison is void)"
for role in bw_rls_bypass bw_rls_app; do
  rows="$(psql "$(as_role "$role")" -qAt -v ON_ERROR_STOP=1 <<SQL
BEGIN;
SELECT set_config('app.tenant_id', '$TENANT', true) \\g /dev/null
SELECT count(*) FROM (${LITERAL%;}) page;
COMMIT;
SQL
)"
  echo "$role: $rows rows"
  [ "$rows" = 26 ] || { echo "expected 26 rows as $role" >&2; exit 1; }
done

# Each round runs the three variants in a rotated order, so none always runs first or last.
variants=("app bw_rls_bypass app" "appset bw_rls_bypass set" "rls bw_rls_app set")
for round in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2; do
    # shellcheck disable=SC2086
    set -- ${variants[$(((round + k) % 3))]}
    run "$1" "$2" "$3" "$round"
  done
done

stats() { # name -> "n median p99"
  cat "$tmp/$1"-*.* 2>/dev/null | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {
    m = a[int((NR+1)/2)]; p = a[int(NR*0.99 + 0.999)]; printf "%d %.3f %.3f\n", NR, m/1000, p/1000 }'
}
read -r n_app med_app p99_app < <(stats app)
read -r n_set med_set p99_set < <(stats appset)
read -r n_rls med_rls p99_rls < <(stats rls)
echo "--- $ROUNDS interleaved rounds of ${SECONDS_PER_RUN} s, $CLIENTS clients, latency per transaction (ms)"
printf '%-8s %9s %9s %9s\n' variant txns median p99
printf '%-8s %9d %9.3f %9.3f\n' app "$n_app" "$med_app" "$p99_app"
printf '%-8s %9d %9.3f %9.3f\n' app+set "$n_set" "$med_set" "$p99_set"
printf '%-8s %9d %9.3f %9.3f\n' rls "$n_rls" "$med_rls" "$p99_rls"
awk -v a="$med_app" -v s="$med_set" -v r="$med_rls" 'BEGIN {
  printf "median ratios: rls / app = %.2f, rls / app+set = %.2f, app+set / app = %.2f\n", r/a, r/s, s/a }'
