-- The live inbox's events (`GET /v1/stream`): an outbox the domain writes in the same
-- transaction as each change (`crates/domain/src/stream.rs`), so an event exists if and only if
-- its change committed. A writer inserts its event without a number; one sequencer at a time
-- (any API task, polling, under an advisory lock) numbers the committed ones per tenant and
-- notifies `breakwater_stream`; every task's listener then reads the numbered rows. A client that reconnects with `Last-Event-ID`
-- replays what it missed from here. The worker prunes the table by age and by count per tenant.

CREATE TYPE stream_event_kind AS ENUM (
    'conversation.created', 'conversation.updated', 'message.created', 'contact.erased'
);

-- Per tenant: the newest event's id, and the highest id retention has removed. Only the
-- sequencer writes `last_id` (writers never lock this row, so a busy tenant's writes do not
-- queue on it), and it numbers a tenant's events `last_id + 1, + 2, ...` in one transaction at a
-- time, so ids become visible in order with no gaps: a reader that has seen id n has seen every
-- event below it. A client whose `Last-Event-ID` is below `pruned_through` has missed events
-- that are gone: it gets `resync`.
CREATE TABLE stream_heads (
    tenant_id      uuid   PRIMARY KEY REFERENCES tenants (id),
    last_id        bigint NOT NULL,
    pruned_through bigint NOT NULL DEFAULT 0
);

-- One event. What the stream's filters need (inbox, status, assignee, and for an update the
-- values before it) is a column, so a task filters without reading the conversation. No
-- foreign keys to the conversation or message: an event outlives neither (an erasure deletes a
-- contact's events with its rows), but a conversation is never deleted otherwise, and the
-- table is written on every change, so it carries no more indexes than it needs.
CREATE TABLE stream_events (
    -- The order of insertion (a sequence: no lock), which the sequencer numbers by.
    seq                  bigint              GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id            uuid                NOT NULL REFERENCES tenants (id),
    -- The tenant's event number; null until the sequencer numbers the committed event.
    id                   bigint,
    kind                 stream_event_kind   NOT NULL,
    at                   timestamptz         NOT NULL DEFAULT now(),
    contact_id           uuid                NOT NULL,
    conversation_id      uuid,
    inbox_id             uuid,
    status               conversation_status,
    assignee_id          uuid,
    previous_status      conversation_status,
    previous_assignee_id uuid,
    message_id           uuid,
    -- The start of a message (the inbox list's preview), never the whole body.
    preview              text
);
-- A tenant's events in order (the listener, a resume, pruning by count).
CREATE UNIQUE INDEX stream_events_tenant_id_idx ON stream_events (tenant_id, id);
-- What the sequencer has still to number.
CREATE INDEX stream_events_pending_idx ON stream_events (seq) WHERE id IS NULL;
-- An erasure deletes the contact's events (their previews are the contact's words).
CREATE INDEX stream_events_contact_idx ON stream_events (tenant_id, contact_id);
-- Pruning by age, oldest first, across tenants.
CREATE INDEX stream_events_at_idx ON stream_events (at);
