-- The job queue's runtime support (worker, issue 8). Append-only: the table itself is in the
-- schema migration.

-- When the current (or last) attempt began: with `run_at` (when the job became due) it gives
-- the claim-to-start latency published by `jobs::stats`.
ALTER TABLE jobs ADD COLUMN attempted_at timestamptz;

-- Dead jobs by kind for `jobs::stats` (ready and running ones are found through the claim and
-- lease indexes), so the stats never scan completed jobs, the bulk of the rows until pruned.
-- Deliberately not an index on (state, kind) of every live job: the claim's predicate would
-- match it too, and with stale statistics the planner picks it and sorts, instead of reading
-- the claim index in order.
CREATE INDEX jobs_dead_idx ON jobs (kind) WHERE state = 'dead';

-- A queue table churns: every job is inserted, updated two or three times and deleted. Vacuum
-- it long before the default 20% of dead rows, so the claim index stays small.
ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- Wakes idle workers (LISTEN breakwater_jobs) when jobs are inserted. A statement-level trigger
-- fires once per INSERT however many rows it writes, and PostgreSQL delivers the notification
-- only when (and if) the inserting transaction commits, so a worker never wakes for a job it
-- cannot see yet. Workers poll as well: a lost notification delays a job, never strands it.
CREATE FUNCTION jobs_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('breakwater_jobs', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_insert AFTER INSERT ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify_insert();
