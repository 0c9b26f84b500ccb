-- A message post into a random conversation of the 55%-shaped tenant, as `messages::post`
-- writes it without the live inbox's event: lock the conversation, share-lock its contact,
-- insert the message, move the conversation's preview and count. The variant's event follows
-- (post_locked.sql, post_outbox.sql; plain has none), then COMMIT.
\set k random(1, 200000)
BEGIN;
SELECT quote_literal(c.id) AS cid, quote_literal(c.inbox_id) AS inbox, quote_literal(c.contact_id) AS contact,
       quote_literal(c.status) AS status, quote_nullable(c.assignee_id) AS assignee
  FROM bench_ids b JOIN conversations c ON c.tenant_id = '00000000-0000-7000-8000-000000000001' AND c.id = b.id
  JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
  WHERE b.k = :k AND ct.erased_at IS NULL FOR NO KEY UPDATE OF c FOR SHARE OF ct \gset
INSERT INTO messages (tenant_id, id, conversation_id, sender, author_id, body, created_at)
  VALUES ('00000000-0000-7000-8000-000000000001', gen_random_uuid(), :cid, 'agent',
          '00000000-0000-7000-8002-000000000001', 'a benchmark message', clock_timestamp());
UPDATE conversations SET last_activity_at = clock_timestamp(), last_message_preview = 'a benchmark message',
       message_count = message_count + 1
  WHERE tenant_id = '00000000-0000-7000-8000-000000000001' AND id = :cid;
