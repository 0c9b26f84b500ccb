-- One tenant shaped like the seed's 55% tenant: 10 inboxes, 117 agents, 200,000 conversations.
INSERT INTO tenants (id, name) VALUES ('00000000-0000-7000-8000-000000000001', 'big');
INSERT INTO inboxes (tenant_id, id, name, channel)
  SELECT '00000000-0000-7000-8000-000000000001', ('00000000-0000-7000-8001-' || lpad(i::text, 12, '0'))::uuid, 'inbox ' || i, 'web'
  FROM generate_series(1, 10) i;
INSERT INTO users (tenant_id, id, name, email)
  SELECT '00000000-0000-7000-8000-000000000001', ('00000000-0000-7000-8002-' || lpad(i::text, 12, '0'))::uuid, 'agent ' || i, 'a' || i || '@x.example'
  FROM generate_series(1, 117) i;
INSERT INTO contacts (tenant_id, id, name)
  SELECT '00000000-0000-7000-8000-000000000001', ('00000000-0000-7000-8003-' || lpad(i::text, 12, '0'))::uuid, 'contact ' || i
  FROM generate_series(1, 50000) i;
CREATE TABLE bench_ids (k int PRIMARY KEY, id uuid NOT NULL);
INSERT INTO bench_ids SELECT i, gen_random_uuid() FROM generate_series(1, 200000) i;
INSERT INTO conversations (tenant_id, id, inbox_id, contact_id, assignee_id, status)
  SELECT '00000000-0000-7000-8000-000000000001', b.id,
         ('00000000-0000-7000-8001-' || lpad((1 + (k % 10))::text, 12, '0'))::uuid,
         ('00000000-0000-7000-8003-' || lpad((1 + (k % 50000))::text, 12, '0'))::uuid,
         CASE WHEN k % 4 = 0 THEN NULL ELSE ('00000000-0000-7000-8002-' || lpad((1 + (k % 117))::text, 12, '0'))::uuid END,
         (ARRAY['open','pending','closed'])[1 + (k % 3)]::conversation_status
  FROM bench_ids b;
-- Spread at random: inbox and status uniform, one in five unassigned.
UPDATE conversations SET inbox_id = ('00000000-0000-7000-8001-' || lpad((1 + floor(random()*10))::text, 12, '0'))::uuid,
  status = (ARRAY['open','pending','closed'])[1 + floor(random()*3)]::conversation_status,
  assignee_id = CASE WHEN random() < 0.2 THEN NULL ELSE ('00000000-0000-7000-8002-' || lpad((1 + floor(random()*117))::text, 12, '0'))::uuid END;
-- The "tenant" variant's one counter row.
CREATE TABLE bench_tenant_counts (tenant_id uuid PRIMARY KEY, n bigint NOT NULL);
INSERT INTO bench_tenant_counts VALUES ('00000000-0000-7000-8000-000000000001', 200000);
VACUUM ANALYZE;
