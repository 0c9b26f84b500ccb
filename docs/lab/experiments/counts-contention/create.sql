-- Opens a conversation, open and unassigned, in one of the two busiest inboxes; the counters'
-- statements of the variant follow (create_tenant.sql, create_bucket.sql; none has none), then COMMIT.
\set i random(1, 2)
\set c random(1, 50000)
BEGIN;
SELECT quote_literal(gen_random_uuid()) AS cid, quote_literal('00000000-0000-7000-8001-' || lpad(:i::text, 12, '0')) AS inbox \gset
SELECT 1 FROM contacts WHERE tenant_id = '00000000-0000-7000-8000-000000000001' AND id = ('00000000-0000-7000-8003-' || lpad(:c::text, 12, '0'))::uuid AND erased_at IS NULL FOR SHARE;
INSERT INTO conversations (tenant_id, id, inbox_id, contact_id, status)
  VALUES ('00000000-0000-7000-8000-000000000001', :cid, :inbox, ('00000000-0000-7000-8003-' || lpad(:c::text, 12, '0'))::uuid, 'open');
