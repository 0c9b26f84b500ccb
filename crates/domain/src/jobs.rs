//! The job queue's enqueue side: side effects are written in the same transaction as the change
//! that causes them, so a change is never committed without its job (or the reverse).

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{Result, TenantId, ids::new_id};

/// Job kinds the worker runs.
pub mod kind {
    /// Deletes an erased contact's messages, conversations and the contact.
    pub const ERASE_CONTACT: &str = "erase_contact";
    /// POSTs an agent's outbound message to the inbox's webhook.
    pub const DELIVER_MESSAGE: &str = "deliver_message";
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The tenant whose data the job touches.
    pub tenant: Option<TenantId>,
    /// What the worker runs (see [`kind`]).
    pub kind: &'static str,
    /// The job's arguments.
    pub payload: serde_json::Value,
    /// While a job with this key is ready or running, enqueueing another is a no-op.
    pub unique_key: Option<String>,
    /// How many times to try before the job goes dead.
    pub max_attempts: i32,
}

impl NewJob {
    /// The erasure of a tombstoned contact. Unique per contact.
    #[must_use]
    pub fn erase_contact(tenant: TenantId, contact: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            kind: kind::ERASE_CONTACT,
            payload: json!({ "contact_id": contact }),
            unique_key: Some(format!("{}:{tenant}:{contact}", kind::ERASE_CONTACT)),
            max_attempts: 25,
        }
    }

    /// The outbound delivery of an agent's message. Unique per message.
    #[must_use]
    pub fn deliver_message(tenant: TenantId, inbox: Uuid, conversation: Uuid, message: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            kind: kind::DELIVER_MESSAGE,
            payload: json!({ "inbox_id": inbox, "conversation_id": conversation, "message_id": message }),
            unique_key: Some(format!("{}:{tenant}:{message}", kind::DELIVER_MESSAGE)),
            max_attempts: 10,
        }
    }
}

/// Enqueues a job inside the caller's transaction and returns its id. With a unique key that a
/// live job already holds, returns that job's id instead.
///
/// # Errors
/// A database error.
pub async fn enqueue(conn: &mut PgConnection, job: NewJob) -> Result<Uuid> {
    let id = new_id();
    let inserted = sqlx::query_scalar!(
        "INSERT INTO jobs (id, tenant_id, kind, payload, unique_key, max_attempts)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('ready', 'running')
         DO NOTHING
         RETURNING id",
        id,
        job.tenant.map(|t| t.0),
        job.kind,
        job.payload,
        job.unique_key,
        job.max_attempts,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(id) = inserted {
        return Ok(id);
    }
    let existing = sqlx::query_scalar!(
        "SELECT id FROM jobs WHERE unique_key = $1 AND state IN ('ready', 'running')",
        job.unique_key
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(existing)
}

/// A job claimed by a worker, leased to it until `lease_expires_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// The job's id.
    pub id: Uuid,
    /// Whose data it touches.
    pub tenant_id: Option<Uuid>,
    /// What to run.
    pub kind: String,
    /// Its arguments.
    pub payload: serde_json::Value,
    /// Tries so far, including this one.
    pub attempts: i32,
    /// Tries allowed.
    pub max_attempts: i32,
}

/// Claims up to `batch` due jobs for `owner`, leasing them for `lease_seconds`. Concurrent
/// claimers never get the same job (`FOR UPDATE SKIP LOCKED`) and never wait for each other.
///
/// # Errors
/// A database error.
pub async fn claim(pool: &crate::Pool, owner: &str, batch: i64, lease_seconds: f64) -> Result<Vec<ClaimedJob>> {
    let jobs = sqlx::query_as!(
        ClaimedJob,
        "UPDATE jobs j
         SET state = 'running', attempts = j.attempts + 1, lease_owner = $1,
             lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
         FROM (SELECT id FROM jobs
               WHERE state = 'ready' AND run_at <= now()
               ORDER BY priority DESC, run_at, id
               LIMIT $2
               FOR UPDATE SKIP LOCKED) due
         WHERE j.id = due.id
         RETURNING j.id, j.tenant_id, j.kind, j.payload, j.attempts, j.max_attempts",
        owner,
        batch,
        lease_seconds
    )
    .fetch_all(pool)
    .await?;
    Ok(jobs)
}

/// Marks a job done, if `owner` still holds its lease.
///
/// # Errors
/// A database error.
pub async fn complete(pool: &crate::Pool, id: Uuid, owner: &str) -> Result<bool> {
    let done = sqlx::query!(
        "UPDATE jobs SET state = 'completed', finished_at = now(), updated_at = now(),
                         lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $1 AND state = 'running' AND lease_owner = $2",
        id,
        owner
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Records a failed attempt: back to `ready` after `retry_in_seconds`, or `dead` once its
/// attempts are spent (or when `permanent`), keeping the error.
///
/// # Errors
/// A database error.
pub async fn fail(
    pool: &crate::Pool,
    id: Uuid,
    owner: &str,
    error: &str,
    retry_in_seconds: f64,
    permanent: bool,
) -> Result<bool> {
    let done = sqlx::query!(
        "UPDATE jobs
         SET state = CASE WHEN $5 OR attempts >= max_attempts THEN 'dead'::job_state ELSE 'ready'::job_state END,
             run_at = now() + make_interval(secs => $4),
             finished_at = CASE WHEN $5 OR attempts >= max_attempts THEN now() END,
             last_error = $3, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
         WHERE id = $1 AND state = 'running' AND lease_owner = $2",
        id,
        owner,
        error,
        retry_in_seconds,
        permanent
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(done == 1)
}
