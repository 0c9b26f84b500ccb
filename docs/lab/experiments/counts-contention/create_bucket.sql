-- Appended to create.sql by run.sh for the bucket variant: the migration's counters, as `counts::shift` writes them.
INSERT INTO conversation_counts AS cc (tenant_id, inbox_id, status, shard, total, unassigned)
  VALUES ('00000000-0000-7000-8000-000000000001', :inbox, 'open', conversation_counts_shard(:cid::uuid), 1, 1)
  ON CONFLICT (tenant_id, inbox_id, status, shard) DO UPDATE SET total = cc.total + EXCLUDED.total, unassigned = cc.unassigned + EXCLUDED.unassigned;
