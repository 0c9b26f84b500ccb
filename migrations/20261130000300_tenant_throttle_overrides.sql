-- Per-tenant throttle overrides (a tenant's plan). NULL means the configured default for the
-- tenant key; the API loads these at start-up and refreshes them periodically.
ALTER TABLE tenants
    ADD COLUMN throttle_rate_per_sec double precision CHECK (throttle_rate_per_sec > 0),
    ADD COLUMN throttle_burst        integer          CHECK (throttle_burst > 0);
