-- A message post into a random conversation of the 55%-shaped tenant, as `messages::post`
-- wrote it in the first design of the live inbox's outbox: lock the conversation, share-lock its contact,
-- insert the message, move the conversation's preview and count, then append the event under
-- the tenant's head row and notify, as `stream::append` did then (the last statement).
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
WITH head AS (
       INSERT INTO stream_heads AS h (tenant_id, last_id) VALUES ('00000000-0000-7000-8000-000000000001', 1)
       ON CONFLICT (tenant_id) DO UPDATE SET last_id = h.last_id + 1 RETURNING last_id),
     event AS (
       INSERT INTO stream_events (tenant_id, id, kind, contact_id, conversation_id, inbox_id, status, assignee_id, message_id, preview)
       SELECT '00000000-0000-7000-8000-000000000001', head.last_id, 'message.created', :contact, :cid, :inbox,
              :status::conversation_status, :assignee::uuid, gen_random_uuid(), 'a benchmark message' FROM head
       RETURNING id)
SELECT event.id FROM event, pg_notify('breakwater_stream', '00000000-0000-7000-8000-000000000001:' || event.id::text);
COMMIT;
