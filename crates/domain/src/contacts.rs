//! Contacts: the list with activity, creation, and privacy erasure.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Cursor, DomainError, Page, Pool, Result, TenantId, ids::new_id, jobs, stream};

/// A contact with their conversation count and newest activity (the API's view:
/// `breakwater_api::views::Contact`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contact {
    /// The contact's id.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Email address, if known.
    pub email: Option<String>,
    /// When the contact was created.
    pub created_at: DateTime<Utc>,
    /// How many conversations they have.
    pub conversation_count: i64,
    /// The newest activity over their conversations.
    pub last_activity_at: Option<DateTime<Utc>>,
    /// The list's sort key as PostgreSQL computes it (`lower(name)`, or `lower(email)` for an
    /// email search), so a cursor resumes exactly where the database's order says.
    pub sort_key: String,
}

/// How the contacts list is searched and sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ContactSearch {
    /// All contacts, by name.
    #[default]
    All,
    /// Contacts whose name starts with this (case-insensitive), by name.
    NamePrefix(String),
    /// Contacts whose email starts with this (case-insensitive), by email.
    EmailPrefix(String),
}

/// A new contact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewContact {
    /// Display name (1-200 characters).
    pub name: String,
    /// Email address.
    pub email: Option<String>,
}

/// The answer to an erasure request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErasureAccepted {
    /// The job that deletes the data.
    pub job_id: Uuid,
}

/// Escapes `LIKE` metacharacters so a prefix matches literally, and lower-cases it.
fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for ch in prefix.to_lowercase().chars() {
        if matches!(ch, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out.push('%');
    out
}

/// One contacts query: the contact with its conversation count and newest activity (a lateral
/// join on the conversations' contact index), `$key` selected as the sort key, and `$tail`
/// appended to the WHERE that keeps the tenant's (`$1`) standing contacts.
macro_rules! contact_query {
    ($key:tt, [$($tail:tt)+], $($arg:expr),+) => {
        sqlx::query_as!(
            Contact,
            r#"SELECT ct.id, ct.name, ct.email, ct.created_at,
                      a.conversation_count AS "conversation_count!", a.last_activity_at, "#
                + $key
                + r#" AS "sort_key!"
               FROM contacts ct
               CROSS JOIN LATERAL (
                   SELECT count(*) AS conversation_count, max(cv.last_activity_at) AS last_activity_at
                   FROM conversations cv WHERE cv.tenant_id = ct.tenant_id AND cv.contact_id = ct.id
               ) a
               WHERE ct.tenant_id = $1 AND ct.erased_at IS NULL "#
                + $($tail)+,
            $($arg),+
        )
    };
}

/// One page of the contacts list: a search's condition, then the keyset and order on the sort key
/// `$key` (`COLLATE "C"`, as its index), so each search has its own static query. `$1` tenant,
/// `$2`/`$3` the keyset boundary, `$4` the row count; search parameters from `$5`.
macro_rules! contacts_page {
    ($pool:expr, $key:tt, $search:tt, $($arg:expr),+) => {
        contact_query!(
            $key,
            [$search
                + " AND ("
                + $key
                + r#" COLLATE "C", ct.id) > ($2 COLLATE "C", $3) ORDER BY "#
                + $key
                + r#" COLLATE "C", ct.id LIMIT $4"#],
            $($arg),+
        )
        .fetch_all($pool)
        .await?
    };
}

/// A tenant's contacts, keyset-paginated by name (or by email for an email search), each with
/// their conversation count and newest activity from a lateral join on the conversations'
/// contact index.
///
/// # Errors
/// [`DomainError::BadQuery`] for a bad cursor.
#[tracing::instrument(name = "db contacts.list", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn list(
    pool: &Pool,
    tenant: TenantId,
    search: &ContactSearch,
    cursor: Option<&Cursor>,
    limit: u32,
) -> Result<Page<Contact>> {
    let (key, id) = match cursor {
        Some(c) => {
            let (k, id) = c.text().map_err(|e| DomainError::BadQuery(e.to_string()))?;
            (k.to_owned(), id)
        }
        // A prefix search starts its keyset at the prefix: every match sorts at or after it, so
        // the index scan begins at the first candidate instead of filtering from the start.
        None => match search {
            ContactSearch::All => (String::new(), Uuid::nil()),
            ContactSearch::NamePrefix(prefix) | ContactSearch::EmailPrefix(prefix) => {
                (prefix.to_lowercase(), Uuid::nil())
            }
        },
    };
    let n = i64::from(limit) + 1;
    let t = tenant.0;
    let rows = match search {
        ContactSearch::All => contacts_page!(pool, "lower(ct.name)", "", t, key, id, n),
        ContactSearch::NamePrefix(prefix) => contacts_page!(
            pool,
            "lower(ct.name)",
            r#"AND lower(ct.name) COLLATE "C" LIKE $5"#,
            t,
            key,
            id,
            n,
            like_prefix(prefix)
        ),
        ContactSearch::EmailPrefix(prefix) => contacts_page!(
            pool,
            "lower(ct.email)",
            r#"AND ct.email IS NOT NULL AND lower(ct.email) COLLATE "C" LIKE $5"#,
            t,
            key,
            id,
            n,
            like_prefix(prefix)
        ),
    };
    Ok(Page::from_rows(rows, limit, |c: &Contact| Cursor::Text(c.sort_key.clone(), c.id)))
}

/// One contact of the tenant, with activity.
///
/// # Errors
/// [`DomainError::NotFound`] when unknown, another tenant's, or erased.
#[tracing::instrument(name = "db contacts.get", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn get<'e>(db: impl sqlx::PgExecutor<'e>, tenant: TenantId, id: Uuid) -> Result<Contact> {
    contact_query!("lower(ct.name)", ["AND ct.id = $2"], tenant.0, id)
        .fetch_optional(db)
        .await?
        .ok_or(DomainError::NotFound)
}

/// Creates a contact.
///
/// # Errors
/// [`DomainError::Invalid`] for an empty or over-long name or email.
#[tracing::instrument(name = "db contacts.create", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn create(pool: &Pool, tenant: TenantId, new: NewContact) -> Result<Contact> {
    let name = new.name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(DomainError::Invalid("name must be 1 to 200 characters".into()));
    }
    if let Some(email) = &new.email
        && (email.len() < 3 || email.len() > 320 || !email.contains('@'))
    {
        return Err(DomainError::Invalid("email must be an address of 3 to 320 characters".into()));
    }
    let id = new_id();
    // Both statements on one connection: one pool checkout per call.
    let mut conn = pool.acquire().await?;
    sqlx::query!(
        "INSERT INTO contacts (tenant_id, id, name, email) VALUES ($1, $2, $3, $4)",
        tenant.0,
        id,
        name,
        new.email
    )
    .execute(&mut *conn)
    .await?;
    get(&mut *conn, tenant, id).await
}

/// Requests the privacy erasure (PDPA/GDPR) of a contact: in one transaction the contact is
/// tombstoned (from then on it, and every conversation of theirs, answers 404), its
/// conversations leave the inbox counts, its live-inbox events are deleted and `contact.erased`
/// appended, and an `erase_contact` job is enqueued to delete the rows. It writes one contact
/// row, one job row, one event and the counters of the contact's conversations (read through
/// the conversations' contact index), and deletes the contact's retained events (through their
/// contact index), so it is fast however much message history the contact has.
///
/// # Errors
/// [`DomainError::NotFound`] when unknown, another tenant's, or already erased.
pub async fn request_erasure(pool: &Pool, tenant: TenantId, id: Uuid) -> Result<ErasureAccepted> {
    request_erasure_traced(pool, tenant, id, None).await
}

/// As [`request_erasure`], the job carrying the caller's W3C `traceparent` to the worker.
///
/// # Errors
/// As [`request_erasure`].
#[tracing::instrument(name = "db contacts.request_erasure", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn request_erasure_traced(
    pool: &Pool,
    tenant: TenantId,
    id: Uuid,
    traceparent: Option<String>,
) -> Result<ErasureAccepted> {
    let mut tx = pool.begin().await?;
    let erased = sqlx::query_scalar!(
        "UPDATE contacts SET erased_at = now()
         WHERE tenant_id = $1 AND id = $2 AND erased_at IS NULL
         RETURNING id",
        tenant.0,
        id
    )
    .fetch_optional(&mut *tx)
    .await?;
    if erased.is_none() {
        return Err(DomainError::NotFound);
    }
    crate::counts::forget_contact(&mut tx, tenant, id).await?;
    let job_id = jobs::enqueue(&mut tx, jobs::NewJob::erase_contact(tenant, id).with_traceparent(traceparent)).await?;
    stream::forget_contact(&mut tx, tenant, id).await?;
    let erased = stream::NewEvent { contact_id: id, ..stream::NewEvent::default() };
    stream::append(&mut tx, tenant, stream::EventKind::ContactErased, erased).await?;
    tx.commit().await?;
    Ok(ErasureAccepted { job_id })
}

/// Rows an erasure deletes per statement unless told otherwise (the worker's
/// `WORKER_ERASE_BATCH`): small enough that no statement holds many locks for long.
pub const ERASE_BATCH: i64 = 2_000;

/// Runs `$sql`, a DELETE of at most one batch, until it deletes nothing; returns how many rows
/// it deleted in all.
macro_rules! delete_in_batches {
    ($pool:expr, $sql:tt, $($arg:expr),+) => {{
        let mut deleted = 0;
        loop {
            let n = sqlx::query!($sql, $($arg),+).execute($pool).await?.rows_affected();
            deleted += n;
            if n == 0 {
                break deleted;
            }
        }
    }};
}

/// Deletes an erased contact's messages, conversations and the contact itself, in batches of
/// `batch` rows so no statement holds many locks for long. Every statement reaches rows through
/// the foreign-key indexes, never a scan. Safe to run twice, and to resume after a crash. The
/// inbox counts are not touched: the conversations left them when the erasure was requested.
///
/// Returns how many messages and conversations were deleted.
///
/// # Errors
/// A database error; the job is then retried and picks up where it stopped.
#[tracing::instrument(name = "db contacts.erase", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn erase(pool: &Pool, tenant: TenantId, id: Uuid, batch: i64) -> Result<(u64, u64)> {
    let messages = delete_in_batches!(
        pool,
        "DELETE FROM messages m
         USING (SELECT m2.tenant_id, m2.id
                FROM conversations c
                JOIN messages m2 ON m2.tenant_id = c.tenant_id AND m2.conversation_id = c.id
                WHERE c.tenant_id = $1 AND c.contact_id = $2
                LIMIT $3) doomed
         WHERE m.tenant_id = doomed.tenant_id AND m.id = doomed.id",
        tenant.0,
        id,
        batch
    );
    let conversations = delete_in_batches!(
        pool,
        "DELETE FROM conversations c
         USING (SELECT id FROM conversations WHERE tenant_id = $1 AND contact_id = $2 LIMIT $3) doomed
         WHERE c.tenant_id = $1 AND c.id = doomed.id",
        tenant.0,
        id,
        batch
    );
    sqlx::query!("DELETE FROM contacts WHERE tenant_id = $1 AND id = $2 AND erased_at IS NOT NULL", tenant.0, id)
        .execute(pool)
        .await?;
    Ok((messages, conversations))
}
