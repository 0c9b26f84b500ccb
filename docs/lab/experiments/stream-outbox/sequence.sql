-- The sequencer, as `stream::sequence` runs it (its statement copied from the domain): number the
-- committed events under the advisory lock, notify per tenant. A pause between passes stands for
-- the listener batching the notifications that arrive while it works.
BEGIN;
SELECT pg_advisory_xact_lock(127978043417965);
WITH pending AS (
                   SELECT tenant_id, seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq) AS n
                   FROM (SELECT tenant_id, seq FROM stream_events WHERE id IS NULL ORDER BY seq LIMIT 5000) p),
               counts AS (SELECT tenant_id, count(*) AS n FROM pending GROUP BY tenant_id),
               heads AS (
                   INSERT INTO stream_heads AS h (tenant_id, last_id) SELECT tenant_id, n FROM counts
                   ON CONFLICT (tenant_id) DO UPDATE SET last_id = h.last_id + EXCLUDED.last_id
                   RETURNING h.tenant_id, h.last_id),
               numbered AS (
                   UPDATE stream_events e SET id = heads.last_id - counts.n + pending.n
                   FROM pending JOIN counts USING (tenant_id) JOIN heads USING (tenant_id)
                   WHERE e.seq = pending.seq
                   RETURNING e.tenant_id, e.id)
               SELECT tenant_id AS "tenant_id!", max(id) AS "head!", count(*) AS "n!",
                      pg_notify('breakwater_stream', tenant_id::text || ':' || max(id)::text)::text AS "notified"
               FROM numbered GROUP BY tenant_id;
COMMIT;
\sleep 10 ms
