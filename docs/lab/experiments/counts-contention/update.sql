-- Changes a random conversation's status and assignee, locking as `conversations::update` does;
-- the counters' statements of the variant follow (update_tenant.sql, update_bucket.sql; none has
-- none), then COMMIT.
\set k random(1, 200000)
\set s random(1, 3)
\set a random(0, 116)
BEGIN;
SELECT quote_literal(c.id) AS cid, quote_literal(c.inbox_id) AS inbox, quote_literal(c.status) AS old_status, quote_nullable(c.assignee_id) AS old_assignee, (c.assignee_id IS NULL)::int AS old_un
  FROM bench_ids b JOIN conversations c ON c.tenant_id = '00000000-0000-7000-8000-000000000001' AND c.id = b.id
  JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
  WHERE b.k = :k AND ct.erased_at IS NULL FOR NO KEY UPDATE OF c FOR SHARE OF ct \gset
SELECT quote_literal((ARRAY['open','pending','closed'])[:s]) AS new_status,
       CASE WHEN :a < 30 THEN 'NULL' ELSE quote_literal('00000000-0000-7000-8002-' || lpad((:a + 1 - 30)::text, 12, '0')) END AS new_assignee, (:a < 30)::int AS new_un \gset
UPDATE conversations SET status = :new_status::conversation_status, assignee_id = :new_assignee::uuid WHERE tenant_id = '00000000-0000-7000-8000-000000000001' AND id = :cid;
