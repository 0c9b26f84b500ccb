//! A conversation's messages, and appending one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::conversations::ConversationStatus;
use crate::cursor::start;
use crate::{Cursor, DomainError, Page, Pool, Result, TenantId, UserId, ids::new_id};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[sqlx(type_name = "message_sender", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum MessageSender {
    /// The end customer.
    Contact,
    /// An agent of the tenant (`author_id` says which).
    Agent,
    /// The platform.
    System,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message's id.
    pub id: Uuid,
    /// The conversation it belongs to.
    pub conversation_id: Uuid,
    /// Who wrote it.
    pub sender: MessageSender,
    /// The agent who wrote it, when `sender` is `agent`.
    pub author_id: Option<Uuid>,
    /// Its text.
    pub body: String,
    /// When it was written.
    pub created_at: DateTime<Utc>,
}

impl Message {
    fn cursor(&self) -> Cursor {
        Cursor::Time(self.created_at, self.id)
    }
}

/// The order of a message list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Oldest first (reading a conversation from the start).
    #[default]
    Asc,
    /// Newest first (opening a conversation at its end).
    Desc,
}

/// The longest preview kept on the conversation.
pub const PREVIEW_CHARS: usize = 140;
/// The longest message body accepted.
pub const MAX_BODY_CHARS: usize = 10_000;

/// Whether the conversation is visible to the tenant (exists, is theirs, contact not erased).
async fn visible<'e>(db: impl sqlx::PgExecutor<'e>, tenant: TenantId, conversation: Uuid) -> Result<()> {
    let found = sqlx::query_scalar!(
        r#"SELECT 1 AS "one!" FROM conversations c
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           WHERE c.tenant_id = $1 AND c.id = $2 AND ct.erased_at IS NULL"#,
        tenant.0,
        conversation
    )
    .fetch_optional(db)
    .await?;
    found.map(|_| ()).ok_or(DomainError::NotFound)
}

/// One page of a conversation's messages: `$order` is the order's keyset comparison and sort,
/// so each order has its own static query. `$1` tenant, `$2` conversation, `$3`/`$4` the keyset
/// boundary, `$5` the row count.
macro_rules! messages_page {
    ($conn:expr, $order:tt, $($arg:expr),+) => {
        sqlx::query_as!(
            Message,
            r#"SELECT id, conversation_id, sender AS "sender: MessageSender", author_id, body, created_at
               FROM messages
               WHERE tenant_id = $1 AND conversation_id = $2 AND "#
                + $order
                + " LIMIT $5",
            $($arg),+
        )
        .fetch_all($conn)
        .await?
    };
}

/// A conversation's messages, keyset-paginated in either order.
///
/// # Errors
/// [`DomainError::NotFound`] when the conversation is not visible to the tenant;
/// [`DomainError::BadQuery`] for a bad cursor.
#[tracing::instrument(name = "db messages.list", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn list(
    pool: &Pool,
    tenant: TenantId,
    conversation: Uuid,
    order: Order,
    cursor: Option<&Cursor>,
    limit: u32,
) -> Result<Page<Message>> {
    // Both statements on one connection: one pool checkout per call.
    let mut conn = pool.acquire().await?;
    visible(&mut *conn, tenant, conversation).await?;
    let n = i64::from(limit) + 1;
    let boundary = cursor.map(|c| c.time().map_err(|e| DomainError::BadQuery(e.to_string()))).transpose()?;
    let rows = match order {
        Order::Asc => {
            let (at, id) = boundary.unwrap_or_else(start::oldest);
            messages_page!(
                &mut *conn,
                "(created_at, id) > ($3, $4) ORDER BY created_at, id",
                tenant.0,
                conversation,
                at,
                id,
                n
            )
        }
        Order::Desc => {
            let (at, id) = boundary.unwrap_or_else(start::newest);
            messages_page!(
                &mut *conn,
                "(created_at, id) < ($3, $4) ORDER BY created_at DESC, id DESC",
                tenant.0,
                conversation,
                at,
                id,
                n
            )
        }
    };
    Ok(Page::from_rows(rows, limit, Message::cursor))
}

/// What a successful append returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// The message (the first one, for a replayed idempotent request).
    pub message: Message,
    /// `true` when an `Idempotency-Key` matched an earlier request and nothing new was written.
    pub replayed: bool,
}

/// Appends an agent's message to a conversation and, in the same transaction, bumps the
/// conversation's activity, preview and count and enqueues its outbound delivery when the inbox
/// has a webhook.
///
/// With an idempotency key, a retry of the same request returns the first message and writes
/// nothing; the same key with a different body or conversation is a [`DomainError::Conflict`].
/// `traceparent` (the caller's W3C trace context) is carried by the delivery job to the worker.
///
/// # Errors
/// [`DomainError::NotFound`] when the conversation is not visible; [`DomainError::Invalid`] for
/// an empty or oversized body; [`DomainError::UnknownPrincipal`] when the token's user does not
/// exist in the tenant.
#[tracing::instrument(name = "db messages.post", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn post(
    pool: &Pool,
    tenant: TenantId,
    author: UserId,
    conversation: Uuid,
    body: &str,
    idempotency_key: Option<&str>,
    traceparent: Option<String>,
) -> Result<Posted> {
    let chars = body.chars().count();
    if body.trim().is_empty() || chars > MAX_BODY_CHARS {
        return Err(DomainError::Invalid(format!("body must be 1 to {MAX_BODY_CHARS} characters")));
    }
    let id = new_id();
    let mut tx = pool.begin().await?;

    if let Some(key) = idempotency_key {
        match use_idempotency_key(&mut tx, tenant, author, key, conversation, body, id).await? {
            KeyUse::First => {}
            KeyUse::Replay(message) => {
                tx.rollback().await?;
                return Ok(Posted { message, replayed: true });
            }
            KeyUse::DifferentRequest => {
                tx.rollback().await?;
                return Err(DomainError::Conflict("Idempotency-Key was already used for a different request".into()));
            }
        }
    }

    // Lock the conversation (serialises appends to it) and share-lock its contact (an erasure
    // requested concurrently waits for us; one already committed hides the conversation).
    let target = sqlx::query!(
        r#"SELECT c.inbox_id, c.contact_id, c.status AS "status: ConversationStatus", c.assignee_id,
                  (i.webhook_url IS NOT NULL) AS "has_webhook!"
           FROM conversations c
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           JOIN inboxes i ON i.tenant_id = c.tenant_id AND i.id = c.inbox_id
           WHERE c.tenant_id = $1 AND c.id = $2 AND ct.erased_at IS NULL
           FOR NO KEY UPDATE OF c FOR SHARE OF ct"#,
        tenant.0,
        conversation
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(DomainError::NotFound)?;

    // The message, the conversation's activity, preview and count, and the live inbox's
    // `message.created` event, in one statement: one round trip. With the event appended by a
    // statement of its own (`stream::append`, as the rarer writers append theirs), a post with
    // its event ran at 0.85-0.87 of the posts a second without it on the quarter-core API; in
    // one statement, 0.92-1.00 (docs/lab/history/2026-12-04-streams-post-and-heartbeats.md).
    let preview: String = body.chars().take(PREVIEW_CHARS).collect();
    let message = sqlx::query_as!(
        Message,
        r#"WITH m AS (
               INSERT INTO messages (tenant_id, id, conversation_id, sender, author_id, body, created_at)
               VALUES ($1, $2, $3, 'agent', $4, $5, clock_timestamp())
               RETURNING id, conversation_id, sender, author_id, body, created_at),
           c AS (
               UPDATE conversations
               SET last_activity_at = GREATEST(last_activity_at, (SELECT created_at FROM m)),
                   last_message_preview = $6,
                   message_count = message_count + 1
               WHERE tenant_id = $1 AND id = $3),
           e AS (
               INSERT INTO stream_events (tenant_id, kind, contact_id, conversation_id, inbox_id, status,
                                          assignee_id, message_id, preview)
               VALUES ($1, 'message.created', $7, $3, $8, $9, $10, $2, $6))
           SELECT id AS "id!", conversation_id AS "conversation_id!", sender AS "sender!: MessageSender",
                  author_id, body AS "body!", created_at AS "created_at!"
           FROM m"#,
        tenant.0,
        id,
        conversation,
        author.0,
        body,
        preview,
        target.contact_id,
        target.inbox_id,
        target.status as ConversationStatus,
        target.assignee_id
    )
    .fetch_one(&mut *tx)
    .await?;

    if target.has_webhook {
        let job = crate::jobs::NewJob::deliver_message(tenant, target.inbox_id, conversation, id)
            .with_traceparent(traceparent);
        crate::jobs::enqueue(&mut tx, job).await?;
    }
    tx.commit().await?;
    Ok(Posted { message, replayed: false })
}

/// What an idempotency key says about the request that carries it.
enum KeyUse {
    /// The key's first use: it is now taken by this request.
    First,
    /// A retry of the request that first used the key: that request's message.
    Replay(Message),
    /// The key was first used for a different body or conversation.
    DifferentRequest,
}

/// Takes an idempotency key for this request (whose message will be `id`), or finds what the
/// key was first used for.
async fn use_idempotency_key(
    conn: &mut PgConnection,
    tenant: TenantId,
    author: UserId,
    key: &str,
    conversation: Uuid,
    body: &str,
    id: Uuid,
) -> Result<KeyUse> {
    let hash = request_hash(conversation, body);
    // The key's row is inserted first: a concurrent retry with the same key blocks on it until
    // this transaction ends, then sees it. The foreign key to the message is deferred.
    let inserted = sqlx::query_scalar!(
        r#"INSERT INTO idempotency_keys (tenant_id, user_id, key, request_hash, message_id)
               VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT DO NOTHING
               RETURNING 1 AS "one!""#,
        tenant.0,
        author.0,
        key,
        &hash[..],
        id
    )
    .fetch_optional(&mut *conn)
    .await?;
    if inserted.is_some() {
        return Ok(KeyUse::First);
    }
    let first = sqlx::query!(
        "SELECT request_hash, message_id FROM idempotency_keys
                 WHERE tenant_id = $1 AND user_id = $2 AND key = $3",
        tenant.0,
        author.0,
        key
    )
    .fetch_one(&mut *conn)
    .await?;
    if first.request_hash != hash {
        return Ok(KeyUse::DifferentRequest);
    }
    // The first request's message, read on this connection (one pool checkout per call), and
    // only while its contact stands: after an erasure was requested, a replay is a 404 like every
    // other read of that contact's data.
    let message = get_visible(&mut *conn, tenant, first.message_id).await?;
    Ok(KeyUse::Replay(message))
}

/// A message whose conversation's contact has not been erased.
async fn get_visible<'e>(db: impl sqlx::PgExecutor<'e>, tenant: TenantId, id: Uuid) -> Result<Message> {
    sqlx::query_as!(
        Message,
        r#"SELECT m.id, m.conversation_id, m.sender AS "sender: MessageSender", m.author_id, m.body, m.created_at
           FROM messages m
           JOIN conversations c ON c.tenant_id = m.tenant_id AND c.id = m.conversation_id
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           WHERE m.tenant_id = $1 AND m.id = $2 AND ct.erased_at IS NULL"#,
        tenant.0,
        id
    )
    .fetch_optional(db)
    .await?
    .ok_or(DomainError::NotFound)
}

/// Deletes idempotency keys older than `older_than_seconds`, at most `batch` of them; returns
/// how many. A retry after the retention is a new request.
///
/// # Errors
/// A database error.
pub async fn prune_idempotency_keys(pool: &Pool, older_than_seconds: f64, batch: i64) -> Result<u64> {
    Ok(sqlx::query!(
        "DELETE FROM idempotency_keys WHERE (tenant_id, user_id, key) IN (
             SELECT tenant_id, user_id, key FROM idempotency_keys
             WHERE created_at < now() - make_interval(secs => $1)
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        older_than_seconds,
        batch
    )
    .execute(pool)
    .await?
    .rows_affected())
}

fn request_hash(conversation: Uuid, body: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(conversation.as_bytes());
    h.update(body.as_bytes());
    h.finalize().into()
}
