-- Appended to update.sql by run.sh for the bucket variant: the migration's counters, as `counts::shift` writes them.
INSERT INTO conversation_counts AS cc (tenant_id, inbox_id, status, shard, total, unassigned)
  SELECT '00000000-0000-7000-8000-000000000001', :inbox::uuid, d.status, conversation_counts_shard(:cid::uuid), sum(d.total), sum(d.unassigned)
  FROM (VALUES (:old_status::conversation_status, -1, -:old_un), (:new_status::conversation_status, 1, :new_un)) d (status, total, unassigned)
  GROUP BY d.status HAVING sum(d.total) <> 0 OR sum(d.unassigned) <> 0 ORDER BY d.status
  ON CONFLICT (tenant_id, inbox_id, status, shard) DO UPDATE SET total = cc.total + EXCLUDED.total, unassigned = cc.unassigned + EXCLUDED.unassigned;
INSERT INTO conversation_assignee_counts AS ca (tenant_id, assignee_id, inbox_id, status, n)
  SELECT '00000000-0000-7000-8000-000000000001', d.assignee_id, :inbox::uuid, d.status, sum(d.n)
  FROM (VALUES (:old_assignee::uuid, :old_status::conversation_status, -1), (:new_assignee::uuid, :new_status::conversation_status, 1)) d (assignee_id, status, n)
  WHERE d.assignee_id IS NOT NULL
  GROUP BY d.assignee_id, d.status HAVING sum(d.n) <> 0 ORDER BY d.assignee_id, d.status
  ON CONFLICT (tenant_id, assignee_id, inbox_id, status) DO UPDATE SET n = ca.n + EXCLUDED.n;
