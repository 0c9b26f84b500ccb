-- Appended to post.sql by run.sh for the outbox variant, the design kept: append the unnumbered
-- event, as `stream::append` does (no NOTIFY: the sequencer polls).
INSERT INTO stream_events (tenant_id, kind, contact_id, conversation_id, inbox_id, status, assignee_id, message_id, preview)
  VALUES ('00000000-0000-7000-8000-000000000001', 'message.created', :contact, :cid, :inbox,
          :status::conversation_status, :assignee::uuid, gen_random_uuid(), 'a benchmark message');
