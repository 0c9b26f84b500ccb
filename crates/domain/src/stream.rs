//! The live inbox's events: an outbox written in the same transaction as each change, read by
//! the API's stream (`GET /v1/stream`) and replayed to a client that reconnects.
//!
//! Every write that changes what an inbox shows appends one event here in its own transaction:
//! `conversations::create` and `::update` and `contacts::request_erasure` through `append`, and
//! `messages::post`, the most frequent write, in the same statement as its message (one round
//! trip fewer). The event is inserted without a number; the writer takes no lock
//! another writer waits for, and notifies nothing (a `NOTIFY` serialises every notifying commit
//! of the whole database on one lock).
//!
//! The numbers come after the commit, from one sequencer at a time ([`sequence`], which every API
//! task runs when [`pending`] says there is work, under a transaction-level advisory lock that
//! only one holds): it numbers every committed, unnumbered event, per tenant `last_id + 1, + 2,
//! ...` in insertion order, moves the tenant's `stream_heads.last_id`, and notifies [`CHANNEL`]
//! with `tenant:newest id`, all in one transaction. So a tenant's ids become visible in order
//! with no gaps: whoever has read id n has read every event of the tenant below n. A first
//! design numbered each event in its writer's transaction under the head row's lock and notified
//! from every write: a busy tenant's posts ran at 0.57 of their throughput without it, against
//! 0.80-0.86 with the sequencer, at the database (docs/lab/history/2026-12-03-streams.md); at
//! the pinned API, where a post's round trips are what costs, 0.92-1.00 since a post writes its
//! event in its message's statement (docs/lab/history/2026-12-04-streams-post-and-heartbeats.md).
//!
//! A notification is delivered after its commit, in commit order; one lost with a dropped
//! connection is found again by [`heads`] (and the pending events by [`sequence`]), which every
//! listener reads when it (re)connects.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::conversations::{Conversation, ConversationStatus};
use crate::{DomainError, Pool, Result, TenantId};

/// The channel numbered events are notified on, with the payload `tenant_id:newest event_id`.
pub const CHANNEL: &str = "breakwater_stream";

/// The advisory lock the sequencers take turns on (an arbitrary constant: "stream").
const SEQUENCER_LOCK: i64 = 0x7374_7265_616d;

/// Events numbered per sequencer statement.
const SEQUENCE_BATCH: i64 = 5_000;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type)]
#[sqlx(type_name = "stream_event_kind")]
pub enum EventKind {
    /// A conversation was opened.
    #[sqlx(rename = "conversation.created")]
    ConversationCreated,
    /// A conversation's status or assignee changed.
    #[sqlx(rename = "conversation.updated")]
    ConversationUpdated,
    /// A message was written in a conversation.
    #[sqlx(rename = "message.created")]
    MessageCreated,
    /// A contact's erasure was requested: their conversations are gone from every list.
    #[sqlx(rename = "contact.erased")]
    ContactErased,
}

impl EventKind {
    /// The name on the wire (the SSE `event:` field).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ConversationCreated => "conversation.created",
            Self::ConversationUpdated => "conversation.updated",
            Self::MessageCreated => "message.created",
            Self::ContactErased => "contact.erased",
        }
    }
}

/// One event of a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Whose.
    pub tenant_id: Uuid,
    /// Its number in the tenant's sequence.
    pub id: i64,
    /// What happened.
    pub kind: EventKind,
    /// When its transaction began.
    pub at: DateTime<Utc>,
    /// The contact concerned.
    pub contact_id: Uuid,
    /// The conversation concerned (none for `contact.erased`).
    pub conversation_id: Option<Uuid>,
    /// Its inbox.
    pub inbox_id: Option<Uuid>,
    /// Its status after the change.
    pub status: Option<ConversationStatus>,
    /// Its assignee after the change.
    pub assignee_id: Option<Uuid>,
    /// `conversation.updated`: the status before the change.
    pub previous_status: Option<ConversationStatus>,
    /// `conversation.updated`: the assignee before the change.
    pub previous_assignee_id: Option<Uuid>,
    /// `message.created`: the message.
    pub message_id: Option<Uuid>,
    /// `message.created`: the start of its body.
    pub preview: Option<String>,
}

/// An event about to be appended: what [`Event`] holds, less its id and time, and less a
/// message's id and preview (`message.created` is written by `messages::post` itself, in its
/// message's statement).
#[derive(Debug, Clone, Default)]
pub(crate) struct NewEvent {
    pub(crate) contact_id: Uuid,
    pub(crate) conversation_id: Option<Uuid>,
    pub(crate) inbox_id: Option<Uuid>,
    pub(crate) status: Option<ConversationStatus>,
    pub(crate) assignee_id: Option<Uuid>,
    pub(crate) previous_status: Option<ConversationStatus>,
    pub(crate) previous_assignee_id: Option<Uuid>,
}

impl NewEvent {
    /// A conversation as it stands now.
    pub(crate) fn of(c: &Conversation) -> Self {
        Self {
            contact_id: c.contact_id,
            conversation_id: Some(c.id),
            inbox_id: Some(c.inbox_id),
            status: Some(c.status),
            assignee_id: c.assignee_id,
            ..Self::default()
        }
    }
}

/// Appends an event, unnumbered, to the tenant's outbox.
pub(crate) async fn append(conn: &mut PgConnection, tenant: TenantId, kind: EventKind, e: NewEvent) -> Result<()> {
    sqlx::query!(
        r#"INSERT INTO stream_events (tenant_id, kind, contact_id, conversation_id, inbox_id, status,
                                      assignee_id, previous_status, previous_assignee_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#,
        tenant.0,
        kind as EventKind,
        e.contact_id,
        e.conversation_id,
        e.inbox_id,
        e.status as Option<ConversationStatus>,
        e.assignee_id,
        e.previous_status as Option<ConversationStatus>,
        e.previous_assignee_id,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Whether any committed event waits for its number: the sequencer's cheap poll (an index-only
/// look at the partial index of unnumbered events).
///
/// # Errors
/// A database error.
pub async fn pending<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<bool> {
    Ok(sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM stream_events WHERE id IS NULL) AS "pending!""#)
        .fetch_one(db)
        .await?)
}

/// Numbers every committed, unnumbered event (the module's sequencer), notifies [`CHANNEL`]
/// once per tenant with its newest id, and returns the tenants' new heads. When another
/// sequencer holds the turn, returns at once with nothing (that one numbers what is there, and
/// what commits after its look waits for the next poll). Safe to call at any time from any
/// number of processes.
///
/// # Errors
/// A database error; nothing is numbered then.
#[tracing::instrument(name = "db stream.sequence", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn sequence<C>(conn: &mut C) -> Result<Vec<(TenantId, i64)>>
where
    for<'a> &'a mut C: sqlx::PgExecutor<'a>,
{
    let mut heads = Vec::new();
    loop {
        // A transaction by hand: the caller's connection may be a `PgListener`, which is an
        // executor but not a `Connection`.
        sqlx::query!("BEGIN").execute(&mut *conn).await?;
        let numbered = match number(&mut *conn).await {
            Ok(None) => {
                sqlx::query!("ROLLBACK").execute(&mut *conn).await?;
                return Ok(heads);
            }
            Ok(Some(rows)) => rows,
            Err(err) => {
                // The connection may be gone (the caller reconnects); if not, leave it clean.
                let _ = sqlx::query!("ROLLBACK").execute(&mut *conn).await;
                return Err(err);
            }
        };
        sqlx::query!("COMMIT").execute(&mut *conn).await?;
        let total: i64 = numbered.iter().map(|r| r.2).sum();
        heads.extend(numbered.into_iter().map(|r| (r.0, r.1)));
        if total < SEQUENCE_BATCH {
            return Ok(heads);
        }
    }
}

/// One batch of the sequencer, inside its transaction: (tenant, newest id, events numbered), or
/// `None` when another sequencer holds the turn.
async fn number<C>(conn: &mut C) -> Result<Option<Vec<(TenantId, i64, i64)>>>
where
    for<'a> &'a mut C: sqlx::PgExecutor<'a>,
{
    {
        // Its own statement, before the numbering's: in READ COMMITTED the numbering's snapshot
        // is then taken after the previous holder's commit, so it never numbers a row twice.
        let turn = sqlx::query_scalar!(r#"SELECT pg_try_advisory_xact_lock($1) AS "turn!""#, SEQUENCER_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if !turn {
            return Ok(None);
        }
        let numbered = sqlx::query!(
            r#"WITH pending AS (
                   SELECT tenant_id, seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq) AS n
                   FROM (SELECT tenant_id, seq FROM stream_events WHERE id IS NULL ORDER BY seq LIMIT $1) p),
               counts AS (SELECT tenant_id, count(*) AS n FROM pending GROUP BY tenant_id),
               heads AS (
                   INSERT INTO stream_heads AS h (tenant_id, last_id) SELECT tenant_id, n FROM counts
                   ON CONFLICT (tenant_id) DO UPDATE SET last_id = h.last_id + EXCLUDED.last_id
                   RETURNING h.tenant_id, h.last_id),
               numbered AS (
                   UPDATE stream_events e SET id = heads.last_id - counts.n + pending.n
                   FROM pending JOIN counts USING (tenant_id) JOIN heads USING (tenant_id)
                   WHERE e.seq = pending.seq AND e.id IS NULL
                   RETURNING e.tenant_id, e.id)
               SELECT tenant_id AS "tenant_id!", max(id) AS "head!", count(*) AS "n!",
                      pg_notify('breakwater_stream', tenant_id::text || ':' || max(id)::text)::text AS "notified"
               FROM numbered GROUP BY tenant_id"#,
            SEQUENCE_BATCH
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(Some(numbered.into_iter().map(|r| (TenantId(r.tenant_id), r.head, r.n)).collect()))
    }
}

/// Deletes a contact's events, numbered or not (their previews are the contact's words); its
/// erasure's transaction calls it before appending `contact.erased`.
pub(crate) async fn forget_contact(conn: &mut PgConnection, tenant: TenantId, contact: Uuid) -> Result<()> {
    sqlx::query!("DELETE FROM stream_events WHERE tenant_id = $1 AND contact_id = $2", tenant.0, contact)
        .execute(conn)
        .await?;
    Ok(())
}

/// Where a tenant's sequence stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// The newest event's id (0: none yet).
    pub last_id: i64,
    /// Every event up to this id is gone (retention).
    pub pruned_through: i64,
}

/// Where the tenant's sequence stands.
///
/// # Errors
/// A database error.
pub async fn head<'e>(db: impl sqlx::PgExecutor<'e>, tenant: TenantId) -> Result<Head> {
    Ok(sqlx::query_as!(Head, "SELECT last_id, pruned_through FROM stream_heads WHERE tenant_id = $1", tenant.0)
        .fetch_optional(db)
        .await?
        .unwrap_or_default())
}

/// Every tenant's newest event id: where a listener that (re)connects catches up from.
///
/// # Errors
/// A database error.
pub async fn heads<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<Vec<(TenantId, i64)>> {
    let rows = sqlx::query!("SELECT tenant_id, last_id FROM stream_heads").fetch_all(db).await?;
    Ok(rows.into_iter().map(|r| (TenantId(r.tenant_id), r.last_id)).collect())
}

/// The tenant's events with ids in `(after, through]`, oldest first, at most `limit`.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db stream.range", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn range<'e>(
    db: impl sqlx::PgExecutor<'e>,
    tenant: TenantId,
    after: i64,
    through: i64,
    limit: i64,
) -> Result<Vec<Event>> {
    Ok(sqlx::query_as!(
        Event,
        r#"SELECT tenant_id, id AS "id!", kind AS "kind: EventKind", at, contact_id, conversation_id, inbox_id,
                  status AS "status: ConversationStatus", assignee_id,
                  previous_status AS "previous_status: ConversationStatus", previous_assignee_id,
                  message_id, preview
           FROM stream_events
           WHERE tenant_id = $1 AND id > $2 AND id <= $3
           ORDER BY id
           LIMIT $4"#,
        tenant.0,
        after,
        through,
        limit
    )
    .fetch_all(db)
    .await?)
}

/// A notification's payload, `tenant_id:event_id`.
///
/// # Errors
/// [`DomainError::BadQuery`] for a payload this module did not write.
pub fn parse_notification(payload: &str) -> Result<(TenantId, i64)> {
    let bad = || DomainError::BadQuery(format!("not a stream notification: {payload:?}"));
    let (tenant, id) = payload.split_once(':').ok_or_else(bad)?;
    Ok((TenantId(tenant.parse().map_err(|_| bad())?), id.parse().map_err(|_| bad())?))
}

/// What a prune removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pruned {
    /// Events older than the retention.
    pub by_age: u64,
    /// Events past the per-tenant count.
    pub by_count: u64,
}

/// Deletes events older than `max_age_seconds` and, per tenant, all but the newest
/// `keep_per_tenant`, at most `batch` rows per statement, and moves each tenant's
/// `pruned_through` past what went. Returns how many went.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db stream.prune", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn prune(pool: &Pool, max_age_seconds: f64, keep_per_tenant: i64, batch: i64) -> Result<Pruned> {
    let mut pruned = Pruned::default();
    loop {
        let n = sqlx::query_scalar!(
            r#"WITH gone AS (
                   DELETE FROM stream_events e
                   USING (SELECT seq FROM stream_events
                          WHERE at < now() - make_interval(secs => $1)
                          ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED) old
                   WHERE e.seq = old.seq
                   RETURNING e.tenant_id, e.id),
               per_tenant AS (SELECT tenant_id, coalesce(max(id), 0) AS through, count(*) AS n FROM gone GROUP BY tenant_id),
               moved AS (
                   UPDATE stream_heads h SET pruned_through = GREATEST(h.pruned_through, p.through)
                   FROM per_tenant p WHERE h.tenant_id = p.tenant_id)
               SELECT coalesce(sum(n), 0)::bigint AS "n!" FROM per_tenant"#,
            max_age_seconds,
            batch
        )
        .fetch_one(pool)
        .await?;
        pruned.by_age += u64::try_from(n).unwrap_or(0);
        if n < batch {
            break;
        }
    }
    // Per tenant, the events below `last_id - keep` (each tenant's rows through its primary key).
    let over = sqlx::query!(
        "SELECT tenant_id, last_id - $1 AS \"through!\" FROM stream_heads WHERE last_id - $1 > pruned_through",
        keep_per_tenant
    )
    .fetch_all(pool)
    .await?;
    for tenant in over {
        loop {
            let n = sqlx::query_scalar!(
                r#"WITH gone AS (
                       DELETE FROM stream_events e
                       USING (SELECT seq FROM stream_events
                              WHERE tenant_id = $1 AND id <= $2
                              ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) old
                       WHERE e.seq = old.seq
                       RETURNING e.seq)
                   SELECT count(*) AS "n!" FROM gone"#,
                tenant.tenant_id,
                tenant.through,
                batch
            )
            .fetch_one(pool)
            .await?;
            pruned.by_count += u64::try_from(n).unwrap_or(0);
            if n < batch {
                break;
            }
        }
        sqlx::query!(
            "UPDATE stream_heads SET pruned_through = GREATEST(pruned_through, $2) WHERE tenant_id = $1",
            tenant.tenant_id,
            tenant.through
        )
        .execute(pool)
        .await?;
    }
    Ok(pruned)
}
