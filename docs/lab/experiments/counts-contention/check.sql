-- The counters against COUNT(*) per bucket, both ways, and rows below zero: every line must say 0.
SELECT 'totals mismatches', count(*) FROM (
 (SELECT inbox_id, status, count(*)::bigint t, count(*) FILTER (WHERE assignee_id IS NULL)::bigint u FROM conversations GROUP BY 1,2
  EXCEPT SELECT inbox_id, status, sum(total), sum(unassigned) FROM conversation_counts GROUP BY 1,2 HAVING sum(total) > 0)
 UNION ALL
 (SELECT inbox_id, status, sum(total), sum(unassigned) FROM conversation_counts GROUP BY 1,2 HAVING sum(total) > 0
  EXCEPT SELECT inbox_id, status, count(*)::bigint, count(*) FILTER (WHERE assignee_id IS NULL)::bigint FROM conversations GROUP BY 1,2)) x;
SELECT 'assignee mismatches', count(*) FROM (
 (SELECT assignee_id, inbox_id, status, count(*)::bigint FROM conversations WHERE assignee_id IS NOT NULL GROUP BY 1,2,3
  EXCEPT SELECT assignee_id, inbox_id, status, n FROM conversation_assignee_counts WHERE n <> 0)
 UNION ALL
 (SELECT assignee_id, inbox_id, status, n FROM conversation_assignee_counts WHERE n <> 0
  EXCEPT SELECT assignee_id, inbox_id, status, count(*)::bigint FROM conversations WHERE assignee_id IS NOT NULL GROUP BY 1,2,3)) x;
SELECT 'negative rows', (SELECT count(*) FROM conversation_counts WHERE total < 0 OR unassigned < 0 OR unassigned > total) + (SELECT count(*) FROM conversation_assignee_counts WHERE n < 0);
