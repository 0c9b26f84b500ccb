//! The worker's side of a job: claiming due jobs under a lease, extending it, and the changes
//! only the lease holder may make (complete, fail, release), each fenced by `(lease_owner,
//! attempts)`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{JobState, notify};
use crate::{Pool, Result};

/// A job claimed by a worker, leased to it until the lease expires.
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
    /// Tries so far, including this one. With the owner, it fences every later update.
    pub attempts: i32,
    /// Tries allowed.
    pub max_attempts: i32,
    /// When it became due.
    pub run_at: DateTime<Utc>,
    /// When this attempt began (the claim).
    pub attempted_at: DateTime<Utc>,
    /// W3C trace context of the request that enqueued it.
    pub traceparent: Option<String>,
}

impl ClaimedJob {
    /// The fence of this attempt, for [`complete`], [`fail`], [`heartbeat`] and [`release`].
    #[must_use]
    pub fn lease(&self) -> Lease {
        Lease { id: self.id, attempt: self.attempts }
    }
}

/// One attempt of one job: only the worker holding it may change the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The job.
    pub id: Uuid,
    /// The attempt number the lease was granted for.
    pub attempt: i32,
}

/// Claims up to `batch` due jobs of the given kinds for `owner`, leasing them for
/// `lease_seconds`, highest priority first, then oldest. Concurrent claimers never get the same
/// job (`FOR UPDATE SKIP LOCKED`) and never wait for each other.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.claim", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn claim(
    pool: &Pool,
    owner: &str,
    kinds: &[String],
    batch: i64,
    lease_seconds: f64,
) -> Result<Vec<ClaimedJob>> {
    let jobs = sqlx::query_as!(
        ClaimedJob,
        r#"UPDATE jobs j
           SET state = 'running', attempts = j.attempts + 1, lease_owner = $1,
               lease_expires_at = now() + make_interval(secs => $3), attempted_at = now(), updated_at = now()
           FROM (SELECT id FROM jobs
                 WHERE state = 'ready' AND run_at <= now() AND kind = ANY($4)
                 ORDER BY priority DESC, run_at, id
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED) due
           WHERE j.id = due.id
           RETURNING j.id, j.tenant_id, j.kind, j.payload, j.attempts, j.max_attempts, j.run_at,
                     j.attempted_at AS "attempted_at!", j.traceparent"#,
        owner,
        batch,
        lease_seconds,
        kinds
    )
    .fetch_all(pool)
    .await?;
    Ok(jobs)
}

/// Extends the leases `owner` still holds by `lease_seconds` from now and returns those it
/// holds; a lease missing from the answer was lost (expired and rescued, maybe re-claimed by
/// another worker), and its job must stop.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.heartbeat", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn heartbeat(pool: &Pool, owner: &str, leases: &[Lease], lease_seconds: f64) -> Result<Vec<Uuid>> {
    let (ids, attempts) = split(leases);
    let held = sqlx::query_scalar!(
        "UPDATE jobs j SET lease_expires_at = now() + make_interval(secs => $4)
         FROM unnest($2::uuid[], $3::int4[]) AS h(id, attempts)
         WHERE j.id = h.id AND j.attempts = h.attempts AND j.state = 'running' AND j.lease_owner = $1
         RETURNING j.id",
        owner,
        &ids,
        &attempts,
        lease_seconds
    )
    .fetch_all(pool)
    .await?;
    Ok(held)
}

fn split(leases: &[Lease]) -> (Vec<Uuid>, Vec<i32>) {
    leases.iter().map(|l| (l.id, l.attempt)).unzip()
}

/// Marks a job done, if `owner` still holds its lease.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db jobs.complete", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn complete(pool: &Pool, owner: &str, lease: Lease) -> Result<bool> {
    Ok(complete_many(pool, owner, &[lease]).await? == 1)
}

/// Marks many jobs done in one statement (the worker batches its completions), those whose
/// lease `owner` still holds; returns how many.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.complete_many", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn complete_many(pool: &Pool, owner: &str, leases: &[Lease]) -> Result<u64> {
    let (ids, attempts) = split(leases);
    let done = sqlx::query!(
        "UPDATE jobs j SET state = 'completed', finished_at = now(), updated_at = now(),
                           lease_owner = NULL, lease_expires_at = NULL
         FROM unnest($2::uuid[], $3::int4[]) AS d(id, attempts)
         WHERE j.id = d.id AND j.attempts = d.attempts AND j.state = 'running' AND j.lease_owner = $1",
        owner,
        &ids,
        &attempts
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(done)
}

/// Records a failed attempt: back to `ready` after `retry_in_seconds`, or `dead` once its
/// attempts are spent (or when `permanent`), keeping the error. Returns the job's new state,
/// or `None` when `owner` no longer held the lease.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db jobs.fail", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn fail(
    pool: &Pool,
    owner: &str,
    lease: Lease,
    error: &str,
    retry_in_seconds: f64,
    permanent: bool,
) -> Result<Option<JobState>> {
    let state = sqlx::query_scalar!(
        r#"UPDATE jobs
           SET state = CASE WHEN $6 OR attempts >= max_attempts THEN 'dead'::job_state ELSE 'ready'::job_state END,
               run_at = CASE WHEN $6 OR attempts >= max_attempts THEN run_at
                             ELSE now() + make_interval(secs => $5) END,
               finished_at = CASE WHEN $6 OR attempts >= max_attempts THEN now() END,
               last_error = $4, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
           WHERE id = $2 AND attempts = $3 AND state = 'running' AND lease_owner = $1
           RETURNING state AS "state: JobState""#,
        owner,
        lease.id,
        lease.attempt,
        error,
        retry_in_seconds,
        permanent
    )
    .fetch_optional(pool)
    .await?;
    Ok(state)
}

/// Gives jobs back to the queue at once (graceful shutdown): the lease is cleared, `run_at` is
/// now, and the interrupted attempt is not counted (a deploy is not the job's fault). Idle
/// workers are woken. Returns how many were released.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.release", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn release(pool: &Pool, owner: &str, leases: &[Lease]) -> Result<u64> {
    let (ids, attempts) = split(leases);
    let mut tx = pool.begin().await?;
    let released = sqlx::query!(
        "UPDATE jobs j
         SET state = 'ready', run_at = now(), attempts = GREATEST(j.attempts - 1, 0),
             last_error = 'released unfinished by ' || $1 || ' at shutdown',
             lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
         FROM unnest($2::uuid[], $3::int4[]) AS r(id, attempts)
         WHERE j.id = r.id AND j.attempts = r.attempts AND j.state = 'running' AND j.lease_owner = $1",
        owner,
        &ids,
        &attempts
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if released > 0 {
        notify(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(released)
}
