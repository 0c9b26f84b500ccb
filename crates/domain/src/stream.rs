//! The live inbox's events: an outbox written in the same transaction as each change, read by
//! the API's stream (`GET /v1/stream`) and replayed to a client that reconnects.
//!
//! Every write that changes what an inbox shows appends one event here, as the last statement of
//! its transaction ([`append`]): `conversations::create` and `::update`, `messages::post`, and
//! `contacts::request_erasure`. An event's id is its tenant's next number, taken under the
//! tenant's `stream_heads` row lock, so ids increase per tenant in commit order without gaps
//! between writers: whoever has read id n has read every committed event of the tenant below n.
//! The price is that a tenant's writes commit one at a time from that statement on (the lock is
//! held only for the commit itself; docs/PERFORMANCE.md has the measurement).
//!
//! The same statement notifies [`CHANNEL`] with `tenant:id`. A notification is delivered after
//! its commit, in commit order; one lost with a dropped connection is found again by
//! [`heads`], which every listener reads when it (re)connects.
//!
//! Lock order: the head row is the last lock a writing transaction takes (after the
//! conversation, contact and counter rows), and nothing else is locked after it, so it never
//! joins a cycle.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::conversations::{Conversation, ConversationStatus};
use crate::{DomainError, Pool, Result, TenantId};

/// The channel every appended event is notified on, with the payload `tenant_id:event_id`.
pub const CHANNEL: &str = "breakwater_stream";

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

/// An event about to be appended: what [`Event`] holds, less its id and time.
#[derive(Debug, Clone, Default)]
pub(crate) struct NewEvent {
    pub(crate) contact_id: Uuid,
    pub(crate) conversation_id: Option<Uuid>,
    pub(crate) inbox_id: Option<Uuid>,
    pub(crate) status: Option<ConversationStatus>,
    pub(crate) assignee_id: Option<Uuid>,
    pub(crate) previous_status: Option<ConversationStatus>,
    pub(crate) previous_assignee_id: Option<Uuid>,
    pub(crate) message_id: Option<Uuid>,
    pub(crate) preview: Option<String>,
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

/// Appends an event to the tenant's sequence and notifies [`CHANNEL`]; returns its id. Call it
/// as the last statement of the writing transaction (the module's lock order).
pub(crate) async fn append(conn: &mut PgConnection, tenant: TenantId, kind: EventKind, e: NewEvent) -> Result<i64> {
    let id = sqlx::query_scalar!(
        r#"WITH head AS (
               INSERT INTO stream_heads AS h (tenant_id, last_id) VALUES ($1, 1)
               ON CONFLICT (tenant_id) DO UPDATE SET last_id = h.last_id + 1
               RETURNING last_id),
           event AS (
               INSERT INTO stream_events (tenant_id, id, kind, contact_id, conversation_id, inbox_id, status,
                                          assignee_id, previous_status, previous_assignee_id, message_id, preview)
               SELECT $1, head.last_id, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM head
               RETURNING id)
           SELECT event.id AS "id!" FROM event, pg_notify('breakwater_stream', $12 || event.id::text)"#,
        tenant.0,
        kind as EventKind,
        e.contact_id,
        e.conversation_id,
        e.inbox_id,
        e.status as Option<ConversationStatus>,
        e.assignee_id,
        e.previous_status as Option<ConversationStatus>,
        e.previous_assignee_id,
        e.message_id,
        e.preview,
        format!("{tenant}:"),
    )
    .fetch_one(conn)
    .await?;
    Ok(id)
}

/// Deletes a contact's events (their previews are the contact's words); its erasure's
/// transaction calls it before appending `contact.erased`.
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
        r#"SELECT tenant_id, id, kind AS "kind: EventKind", at, contact_id, conversation_id, inbox_id,
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
                   USING (SELECT tenant_id, id FROM stream_events
                          WHERE at < now() - make_interval(secs => $1)
                          ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED) old
                   WHERE e.tenant_id = old.tenant_id AND e.id = old.id
                   RETURNING e.tenant_id, e.id),
               per_tenant AS (SELECT tenant_id, max(id) AS through, count(*) AS n FROM gone GROUP BY tenant_id),
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
                       USING (SELECT tenant_id, id FROM stream_events
                              WHERE tenant_id = $1 AND id <= $2
                              ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) old
                       WHERE e.tenant_id = old.tenant_id AND e.id = old.id
                       RETURNING e.id)
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
