-- The inbox counts (`GET /v1/conversations/counts`): per inbox and status, how many
-- conversations there are, how many are unassigned, and how many each agent holds. The domain
-- maintains them in the same transaction as every change to a conversation
-- (`crates/domain/src/counts.rs`), so reading them sums a few hundred small rows at most instead
-- of counting conversations.
--
-- They count what the inbox list shows: a conversation whose contact is erased (tombstoned) is
-- taken out when the erasure is requested, not when the worker deletes its rows.

-- The shard a conversation counts in, from its id (the last byte of a UUIDv7 is random). A
-- busy (inbox, status) pair, new conversations in a big tenant's main inbox say, is spread over
-- this many rows, so concurrent writes lock different rows instead of queueing on one; a
-- conversation always counts in its own shard, so each row is exact and never negative, and a
-- read sums the shards. docs/PERFORMANCE.md has the measurement behind the number.
CREATE FUNCTION conversation_counts_shard(id uuid) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
    RETURN get_byte(uuid_send(id), 15) % 8;

-- Every conversation, and the unassigned ones, per (inbox, status, shard).
CREATE TABLE conversation_counts (
    tenant_id   uuid                NOT NULL REFERENCES tenants (id),
    inbox_id    uuid                NOT NULL,
    status      conversation_status NOT NULL,
    shard       smallint            NOT NULL,
    -- Never negative and `unassigned <= total`, but not as a CHECK: the upsert's proposed row
    -- of a decrement (-1) would fail it before ON CONFLICT adds it to the stored one.
    total       integer             NOT NULL,
    unassigned  integer             NOT NULL,
    PRIMARY KEY (tenant_id, inbox_id, status, shard),
    CONSTRAINT conversation_counts_inbox_fk FOREIGN KEY (tenant_id, inbox_id) REFERENCES inboxes (tenant_id, id)
);

-- The assigned conversations per (agent, inbox, status): "mine" for the agent who asks. Not
-- sharded: an agent's rows change with that agent's conversations only.
CREATE TABLE conversation_assignee_counts (
    tenant_id   uuid                NOT NULL REFERENCES tenants (id),
    assignee_id uuid                NOT NULL,
    inbox_id    uuid                NOT NULL,
    status      conversation_status NOT NULL,
    n           integer             NOT NULL,
    PRIMARY KEY (tenant_id, assignee_id, inbox_id, status),
    CONSTRAINT conversation_assignee_counts_assignee_fk FOREIGN KEY (tenant_id, assignee_id) REFERENCES users (tenant_id, id),
    CONSTRAINT conversation_assignee_counts_inbox_fk    FOREIGN KEY (tenant_id, inbox_id)    REFERENCES inboxes (tenant_id, id)
);
CREATE INDEX conversation_assignee_counts_inbox_idx ON conversation_assignee_counts (tenant_id, inbox_id);
