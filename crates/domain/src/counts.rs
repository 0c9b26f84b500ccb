//! The inbox counts: per status, how many conversations the tenant has, how many are the
//! caller's and how many nobody's, in the whole tenant or in one inbox.
//!
//! They are counters, not counts: every function that changes which bucket a conversation is in
//! (`conversations::create`, `conversations::update`, `contacts::request_erasure`) moves it
//! between buckets here, in its own transaction, so reading them never counts conversations. A
//! bucket is (inbox, status, assignee); the tables are the migration's `conversation_counts`
//! (every conversation and the unassigned ones per inbox, status and shard) and
//! `conversation_assignee_counts` (the assigned ones per agent, inbox and status).
//!
//! They count what the inbox list shows: a conversation leaves the counts when its contact's
//! erasure is requested (the tombstone hides it), and the worker's later deletion of the rows
//! (`contacts::erase`) changes nothing here.
//!
//! Lock order: counter rows are locked last in a transaction, after the conversation and
//! contact rows, `conversation_counts` before `conversation_assignee_counts`, each in key order
//! (the statements sort their rows), so two writers never wait on each other in a cycle.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::conversations::ConversationStatus;
use crate::{Pool, Result, TenantId, UserId};

/// Where a conversation counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub(crate) inbox_id: Uuid,
    pub(crate) status: ConversationStatus,
    pub(crate) assignee_id: Option<Uuid>,
}

/// One status's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusCounts {
    /// Every conversation in this status.
    pub all: i64,
    /// Those assigned to the caller.
    pub mine: i64,
    /// Those assigned to nobody.
    pub unassigned: i64,
}

/// The counts of every status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Waiting for an agent.
    pub open: StatusCounts,
    /// Waiting for the contact.
    pub pending: StatusCounts,
    /// Done.
    pub closed: StatusCounts,
}

struct Row {
    status: ConversationStatus,
    all: i64,
    mine: i64,
    unassigned: i64,
}

/// One counts query: one row per status, zeros included. `$1` tenant, `$2` the caller; the
/// filter fragment (from `$3`) applies to both tables.
macro_rules! counts_query {
    ($pool:expr, $filter:tt, $($arg:expr),+) => {
        sqlx::query_as!(
            Row,
            r#"SELECT s.status AS "status!: ConversationStatus",
                      coalesce(t.total, 0) AS "all!", coalesce(m.n, 0) AS "mine!",
                      coalesce(t.unassigned, 0) AS "unassigned!"
               FROM unnest(enum_range(NULL::conversation_status)) s (status)
               LEFT JOIN (SELECT status, sum(total) AS total, sum(unassigned) AS unassigned
                          FROM conversation_counts
                          WHERE tenant_id = $1 "# + $filter + r#" GROUP BY status) t ON t.status = s.status
               LEFT JOIN (SELECT status, sum(n) AS n
                          FROM conversation_assignee_counts
                          WHERE tenant_id = $1 AND assignee_id = $2 "# + $filter + r#" GROUP BY status) m
                      ON m.status = s.status"#,
            $($arg),+
        )
        .fetch_all($pool)
        .await?
    };
}

/// The tenant's counts, for `user` ("mine"), in one inbox or all of them. An inbox that is
/// unknown, or another tenant's, has no conversations of this tenant: zeros, as the inbox
/// list's filter gives an empty page.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db counts.get", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn get(pool: &Pool, tenant: TenantId, user: UserId, inbox_id: Option<Uuid>) -> Result<Counts> {
    let rows = match inbox_id {
        None => counts_query!(pool, "", tenant.0, user.0),
        Some(inbox) => counts_query!(pool, "AND inbox_id = $3", tenant.0, user.0, inbox),
    };
    let mut counts = Counts::default();
    for r in rows {
        let slot = match r.status {
            ConversationStatus::Open => &mut counts.open,
            ConversationStatus::Pending => &mut counts.pending,
            ConversationStatus::Closed => &mut counts.closed,
        };
        *slot = StatusCounts { all: r.all, mine: r.mine, unassigned: r.unassigned };
    }
    Ok(counts)
}

/// Moves conversation `id` from bucket `before` to bucket `after`; `None` is "not counted" (a
/// conversation being opened has no `before`). Writes only the rows whose counts change.
pub(crate) async fn shift(
    conn: &mut PgConnection,
    tenant: TenantId,
    id: Uuid,
    before: Option<Bucket>,
    after: Option<Bucket>,
) -> Result<()> {
    // A missing side is the other side with weight 0, so one static statement serves every
    // case; the statements add the two rows up per key and skip what nets to zero.
    let (Some(from), Some(to)) = (before.or(after), after.or(before)) else { return Ok(()) };
    let (w_from, w_to) = (if before.is_some() { -1 } else { 0 }, i32::from(after.is_some()));
    let unassigned = |b: Bucket, w: i32| if b.assignee_id.is_none() { w } else { 0 };
    let totals_change = w_from + w_to != 0
        || (from.inbox_id, from.status) != (to.inbox_id, to.status)
        || unassigned(from, w_from) + unassigned(to, w_to) != 0;
    if totals_change {
        sqlx::query!(
            r#"INSERT INTO conversation_counts AS cc (tenant_id, inbox_id, status, shard, total, unassigned)
               SELECT $1, d.inbox_id, d.status, conversation_counts_shard($2), sum(d.total), sum(d.unassigned)
               FROM (VALUES ($3::uuid, $4::conversation_status, $5::int, $6::int),
                            ($7::uuid, $8::conversation_status, $9::int, $10::int)) d (inbox_id, status, total, unassigned)
               GROUP BY d.inbox_id, d.status
               HAVING sum(d.total) <> 0 OR sum(d.unassigned) <> 0
               ORDER BY d.inbox_id, d.status
               ON CONFLICT (tenant_id, inbox_id, status, shard) DO UPDATE
               SET total = cc.total + EXCLUDED.total, unassigned = cc.unassigned + EXCLUDED.unassigned"#,
            tenant.0,
            id,
            from.inbox_id,
            from.status as ConversationStatus,
            w_from,
            unassigned(from, w_from),
            to.inbox_id,
            to.status as ConversationStatus,
            w_to,
            unassigned(to, w_to),
        )
        .execute(&mut *conn)
        .await?;
    }
    let assigned_change =
        (from.assignee_id.is_some() || to.assignee_id.is_some()) && (w_from + w_to != 0 || from != to);
    if assigned_change {
        sqlx::query!(
            r#"INSERT INTO conversation_assignee_counts AS ca (tenant_id, assignee_id, inbox_id, status, n)
               SELECT $1, d.assignee_id, d.inbox_id, d.status, sum(d.n)
               FROM (VALUES ($2::uuid, $3::uuid, $4::conversation_status, $5::int),
                            ($6::uuid, $7::uuid, $8::conversation_status, $9::int)) d (assignee_id, inbox_id, status, n)
               WHERE d.assignee_id IS NOT NULL
               GROUP BY d.assignee_id, d.inbox_id, d.status
               HAVING sum(d.n) <> 0
               ORDER BY d.assignee_id, d.inbox_id, d.status
               ON CONFLICT (tenant_id, assignee_id, inbox_id, status) DO UPDATE SET n = ca.n + EXCLUDED.n"#,
            tenant.0,
            from.assignee_id,
            from.inbox_id,
            from.status as ConversationStatus,
            w_from,
            to.assignee_id,
            to.inbox_id,
            to.status as ConversationStatus,
            w_to,
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Takes every conversation of `contact` out of the counts: its erasure was requested. The
/// caller holds the contact's row lock (the tombstone's `UPDATE`), which every conversation
/// write waits for (their `FOR SHARE` of the contact), so the conversations read here are final.
pub(crate) async fn forget_contact(conn: &mut PgConnection, tenant: TenantId, contact: Uuid) -> Result<()> {
    sqlx::query!(
        r#"INSERT INTO conversation_counts AS cc (tenant_id, inbox_id, status, shard, total, unassigned)
           SELECT c.tenant_id, c.inbox_id, c.status, conversation_counts_shard(c.id),
                  -count(*), -count(*) FILTER (WHERE c.assignee_id IS NULL)
           FROM conversations c
           WHERE c.tenant_id = $1 AND c.contact_id = $2
           GROUP BY c.tenant_id, c.inbox_id, c.status, conversation_counts_shard(c.id)
           ORDER BY c.inbox_id, c.status, conversation_counts_shard(c.id)
           ON CONFLICT (tenant_id, inbox_id, status, shard) DO UPDATE
           SET total = cc.total + EXCLUDED.total, unassigned = cc.unassigned + EXCLUDED.unassigned"#,
        tenant.0,
        contact
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        r#"INSERT INTO conversation_assignee_counts AS ca (tenant_id, assignee_id, inbox_id, status, n)
           SELECT c.tenant_id, c.assignee_id, c.inbox_id, c.status, -count(*)
           FROM conversations c
           WHERE c.tenant_id = $1 AND c.contact_id = $2 AND c.assignee_id IS NOT NULL
           GROUP BY c.tenant_id, c.assignee_id, c.inbox_id, c.status
           ORDER BY c.assignee_id, c.inbox_id, c.status
           ON CONFLICT (tenant_id, assignee_id, inbox_id, status) DO UPDATE SET n = ca.n + EXCLUDED.n"#,
        tenant.0,
        contact
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Recounts every tenant's counters from the conversations, replacing what they held, then
/// analyses the counter tables: for data written around the domain (the seeder's bulk load).
/// Blocks conversation and contact writes while it counts.
///
/// # Errors
/// A database error; nothing is changed then (one transaction).
#[tracing::instrument(name = "db counts.rebuild", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn rebuild(pool: &Pool) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query!("LOCK TABLE conversations, contacts IN SHARE MODE").execute(&mut *tx).await?;
    sqlx::query!("DELETE FROM conversation_counts").execute(&mut *tx).await?;
    sqlx::query!("DELETE FROM conversation_assignee_counts").execute(&mut *tx).await?;
    sqlx::query!(
        r#"INSERT INTO conversation_counts (tenant_id, inbox_id, status, shard, total, unassigned)
           SELECT c.tenant_id, c.inbox_id, c.status, conversation_counts_shard(c.id),
                  count(*), count(*) FILTER (WHERE c.assignee_id IS NULL)
           FROM conversations c
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           WHERE ct.erased_at IS NULL
           GROUP BY c.tenant_id, c.inbox_id, c.status, conversation_counts_shard(c.id)"#
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"INSERT INTO conversation_assignee_counts (tenant_id, assignee_id, inbox_id, status, n)
           SELECT c.tenant_id, c.assignee_id, c.inbox_id, c.status, count(*)
           FROM conversations c
           JOIN contacts ct ON ct.tenant_id = c.tenant_id AND ct.id = c.contact_id
           WHERE ct.erased_at IS NULL AND c.assignee_id IS NOT NULL
           GROUP BY c.tenant_id, c.assignee_id, c.inbox_id, c.status"#
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    sqlx::query!("ANALYZE conversation_counts, conversation_assignee_counts").execute(pool).await?;
    Ok(())
}
