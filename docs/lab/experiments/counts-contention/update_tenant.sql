-- Appended to update.sql by run.sh for the tenant variant: one counter row per tenant, written by every change.
UPDATE bench_tenant_counts SET n = n + 0 WHERE tenant_id = '00000000-0000-7000-8000-000000000001';
