//! Conversations and the inbox list.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::counts::{self, Bucket};
use crate::cursor::start;
use crate::stream::{self, EventKind, NewEvent};
use crate::{Cursor, DomainError, Page, Pool, Result, TenantId, ids::new_id};

/// Where a conversation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[sqlx(type_name = "conversation_status", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum ConversationStatus {
    /// Waiting for an agent.
    Open,
    /// Waiting for the contact.
    Pending,
    /// Done.
    Closed,
}

/// A conversation as the inbox shows it: with its contact's name and the last message preview.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// The conversation's id.
    pub id: Uuid,
    /// The inbox (channel) it arrived on.
    pub inbox_id: Uuid,
    /// The end customer.
    pub contact_id: Uuid,
    /// The contact's display name.
    pub contact_name: String,
    /// The agent it is assigned to, if any.
    pub assignee_id: Option<Uuid>,
    /// Where it stands.
    pub status: ConversationStatus,
    /// When it was opened.
    pub created_at: DateTime<Utc>,
    /// When its newest message was written (or it was opened); the inbox's sort key.
    pub last_activity_at: DateTime<Utc>,
    /// The start of the newest message.
    pub last_message_preview: Option<String>,
    /// How many messages it holds.
    pub message_count: i32,
}

impl Conversation {
    fn cursor(&self) -> Cursor {
        Cursor::Time(self.last_activity_at, self.id)
    }
}

/// The assignee part of an inbox filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AssigneeFilter {
    /// Any assignee or none.
    #[default]
    Any,
    /// Only conversations nobody is assigned to.
    Unassigned,
    /// Only this agent's conversations.
    User(Uuid),
}

/// What the inbox list is filtered by. Each shape has its own static query and a composite index
/// that matches its filter and sort exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InboxFilter {
    /// Only conversations in this status.
    pub status: Option<ConversationStatus>,
    /// Only conversations of this inbox.
    pub inbox_id: Option<Uuid>,
    /// Only conversations with this assignee (or none).
    pub assignee: AssigneeFilter,
}

/// Fields a `PATCH` may change; `None` leaves a field as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConversationChanges {
    /// The new status.
    pub status: Option<ConversationStatus>,
    /// `Some(None)` unassigns; `Some(Some(id))` assigns.
    pub assignee_id: Option<Option<Uuid>>,
}

/// A new conversation between a contact and an inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewConversation {
    /// The contact who writes in.
    pub contact_id: Uuid,
    /// The inbox they write to.
    pub inbox_id: Uuid,
    /// The agent to assign it to.
    pub assignee_id: Option<Uuid>,
    /// Its initial status (default open).
    pub status: ConversationStatus,
}

impl NewConversation {
    /// An open conversation nobody is assigned to: how a contact's first message arrives.
    #[must_use]
    pub fn open(contact_id: Uuid, inbox_id: Uuid) -> Self {
        Self { contact_id, inbox_id, assignee_id: None, status: ConversationStatus::Open }
    }
}

/// One conversation query: the conversation as the inbox shows it, of the tenant (`$1`) and
/// with its contact standing, `$tail` appended to the WHERE.
macro_rules! conversation_query {
    ([$($tail:tt)+], $($arg:expr),+) => {
        sqlx::query_as!(
            Conversation,
            r#"SELECT c.id, c.inbox_id, c.contact_id, ct.name AS contact_name, c.assignee_id,
                      c.status AS "status: ConversationStatus", c.created_at, c.last_activity_at,
                      c.last_message_preview, c.message_count
               FROM conversations c
               JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
               WHERE c.tenant_id = $1 AND ct.erased_at IS NULL "#
                + $($tail)+,
            $($arg),+
        )
    };
}

/// One inbox query: the conversation SELECT, one filter fragment, the shared keyset and sort.
/// `$1` tenant, `$2`/`$3` the keyset boundary, `$4` the row count; filter parameters from `$5`.
macro_rules! inbox_query {
    ($pool:expr, $filter:tt, $($arg:expr),+) => {
        conversation_query!(
            ["AND (c.last_activity_at, c.id) < ($2, $3) "
                + $filter
                + " ORDER BY c.last_activity_at DESC, c.id DESC LIMIT $4"],
            $($arg),+
        )
        .fetch_all($pool)
        .await?
    };
}

/// The inbox: a tenant's conversations, newest activity first, keyset-paginated.
///
/// # Errors
/// [`DomainError::BadQuery`] for a bad cursor or for `inbox_id` and an assignee filter together
/// (no index serves that shape; filter by one of them).
#[tracing::instrument(name = "db conversations.list", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn list(
    pool: &Pool,
    tenant: TenantId,
    filter: InboxFilter,
    cursor: Option<&Cursor>,
    limit: u32,
) -> Result<Page<Conversation>> {
    let (at, id) = match cursor {
        Some(c) => c.time().map_err(|e| DomainError::BadQuery(e.to_string()))?,
        None => start::newest(),
    };
    let t = tenant.0;
    let n = i64::from(limit) + 1;
    let rows = match (filter.status, filter.inbox_id, filter.assignee) {
        (None, None, AssigneeFilter::Any) => inbox_query!(pool, "", t, at, id, n),
        (Some(s), None, AssigneeFilter::Any) => {
            inbox_query!(pool, "AND c.status = $5", t, at, id, n, s as ConversationStatus)
        }
        (None, Some(inbox), AssigneeFilter::Any) => inbox_query!(pool, "AND c.inbox_id = $5", t, at, id, n, inbox),
        (Some(s), Some(inbox), AssigneeFilter::Any) => {
            inbox_query!(pool, "AND c.inbox_id = $5 AND c.status = $6", t, at, id, n, inbox, s as ConversationStatus)
        }
        (None, None, AssigneeFilter::User(user)) => inbox_query!(pool, "AND c.assignee_id = $5", t, at, id, n, user),
        (Some(s), None, AssigneeFilter::User(user)) => {
            inbox_query!(pool, "AND c.assignee_id = $5 AND c.status = $6", t, at, id, n, user, s as ConversationStatus)
        }
        (None, None, AssigneeFilter::Unassigned) => inbox_query!(pool, "AND c.assignee_id IS NULL", t, at, id, n),
        (Some(s), None, AssigneeFilter::Unassigned) => {
            inbox_query!(pool, "AND c.assignee_id IS NULL AND c.status = $5", t, at, id, n, s as ConversationStatus)
        }
        (_, Some(_), AssigneeFilter::User(_) | AssigneeFilter::Unassigned) => {
            return Err(DomainError::BadQuery("filter by inbox_id or by assignee_id, not both".into()));
        }
    };
    Ok(Page::from_rows(rows, limit, Conversation::cursor))
}

/// One conversation of the tenant; [`DomainError::NotFound`] if it is unknown, another tenant's,
/// or its contact has been erased.
///
/// # Errors
/// As above, or a database error.
#[tracing::instrument(name = "db conversations.get", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn get<'e>(db: impl sqlx::PgExecutor<'e>, tenant: TenantId, id: Uuid) -> Result<Conversation> {
    conversation_query!(["AND c.id = $2"], tenant.0, id).fetch_optional(db).await?.ok_or(DomainError::NotFound)
}

/// Opens a conversation between one of the tenant's contacts and one of its inboxes, counts it,
/// and appends its `conversation.created` event.
///
/// # Errors
/// [`DomainError::Invalid`] when the contact, inbox or assignee is not the tenant's.
#[tracing::instrument(name = "db conversations.create", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn create(pool: &Pool, tenant: TenantId, new: NewConversation) -> Result<Conversation> {
    let mut tx = pool.begin().await?;
    // FOR SHARE: an erasure requested concurrently waits for this transaction, and one already
    // committed hides the contact, so no conversation is ever opened for an erased contact.
    let contact = sqlx::query_scalar!(
        "SELECT name FROM contacts WHERE tenant_id = $1 AND id = $2 AND erased_at IS NULL FOR SHARE",
        tenant.0,
        new.contact_id
    )
    .fetch_optional(&mut *tx)
    .await?;
    if contact.is_none() {
        return Err(DomainError::Invalid("contact_id does not name a contact of this tenant".into()));
    }
    let id = new_id();
    sqlx::query!(
        "INSERT INTO conversations (tenant_id, id, inbox_id, contact_id, assignee_id, status)
         VALUES ($1, $2, $3, $4, $5, $6)",
        tenant.0,
        id,
        new.inbox_id,
        new.contact_id,
        new.assignee_id,
        new.status as ConversationStatus,
    )
    .execute(&mut *tx)
    .await?;
    let bucket = Bucket { inbox_id: new.inbox_id, status: new.status, assignee_id: new.assignee_id };
    counts::shift(&mut tx, tenant, id, None, Some(bucket)).await?;
    // Read back on the same connection: one pool checkout per call.
    let conversation = get(&mut *tx, tenant, id).await?;
    stream::append(&mut tx, tenant, EventKind::ConversationCreated, NewEvent::of(&conversation)).await?;
    tx.commit().await?;
    Ok(conversation)
}

/// Changes a conversation's status and/or assignee, and moves it between the counts' buckets.
/// A change appends a `conversation.updated` event with the values before it; a request that
/// changes nothing appends none.
///
/// # Errors
/// [`DomainError::NotFound`] as for [`get`]; [`DomainError::Invalid`] for an assignee who is not
/// a user of the tenant.
#[tracing::instrument(name = "db conversations.update", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn update(pool: &Pool, tenant: TenantId, id: Uuid, changes: ConversationChanges) -> Result<Conversation> {
    let mut tx = pool.begin().await?;
    // The bucket it leaves, locked so no concurrent change moves it meanwhile. FOR SHARE of the
    // contact, as in `create`: an erasure requested concurrently waits for this transaction, and
    // one committed first hides the conversation (the row is re-checked after the wait).
    let before = sqlx::query_as!(
        Bucket,
        r#"SELECT c.inbox_id, c.status AS "status: ConversationStatus", c.assignee_id
           FROM conversations c
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           WHERE c.tenant_id = $1 AND c.id = $2 AND ct.erased_at IS NULL
           FOR NO KEY UPDATE OF c FOR SHARE OF ct"#,
        tenant.0,
        id,
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(DomainError::NotFound)?;
    let after = Bucket {
        status: changes.status.unwrap_or(before.status),
        assignee_id: changes.assignee_id.unwrap_or(before.assignee_id),
        ..before
    };
    sqlx::query!(
        "UPDATE conversations SET status = $3, assignee_id = $4 WHERE tenant_id = $1 AND id = $2",
        tenant.0,
        id,
        after.status as ConversationStatus,
        after.assignee_id,
    )
    .execute(&mut *tx)
    .await?;
    counts::shift(&mut tx, tenant, id, Some(before), Some(after)).await?;
    let conversation = get(&mut *tx, tenant, id).await?;
    if after != before {
        let event = NewEvent {
            previous_status: Some(before.status),
            previous_assignee_id: before.assignee_id,
            ..NewEvent::of(&conversation)
        };
        stream::append(&mut tx, tenant, EventKind::ConversationUpdated, event).await?;
    }
    tx.commit().await?;
    Ok(conversation)
}
