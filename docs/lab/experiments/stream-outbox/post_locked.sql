-- Appended to post.sql by run.sh for the locked variant, the first design of the live inbox's
-- outbox: append the event under the tenant's head row and notify, as `stream::append` did then.
WITH head AS (
       INSERT INTO stream_heads AS h (tenant_id, last_id) VALUES ('00000000-0000-7000-8000-000000000001', 1)
       ON CONFLICT (tenant_id) DO UPDATE SET last_id = h.last_id + 1 RETURNING last_id),
     event AS (
       INSERT INTO stream_events (tenant_id, id, kind, contact_id, conversation_id, inbox_id, status, assignee_id, message_id, preview)
       SELECT '00000000-0000-7000-8000-000000000001', head.last_id, 'message.created', :contact, :cid, :inbox,
              :status::conversation_status, :assignee::uuid, gen_random_uuid(), 'a benchmark message' FROM head
       RETURNING id)
SELECT event.id FROM event, pg_notify('breakwater_stream', '00000000-0000-7000-8000-000000000001:' || event.id::text);
