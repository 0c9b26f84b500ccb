//! The job queue, in PostgreSQL: side effects are written in the same transaction as the change
//! that causes them, so a change is never committed without its job (or the reverse), and
//! workers claim them with `FOR UPDATE SKIP LOCKED` under a lease.
//!
//! A job's life: `ready` (due at `run_at`) -> `running` (leased to one worker until
//! `lease_expires_at`, extended by heartbeats) -> `completed`, or back to `ready` with a backoff
//! after a failure, or `dead` once its attempts are spent or the failure is permanent (the last
//! error is kept). A worker that dies leaves its jobs `running` until their lease expires; the
//! rescuer ([`rescue`]) then returns them to `ready`. Every state change made by a worker is
//! fenced by `(lease_owner, attempts)`: a worker whose lease was taken away can no longer
//! complete, fail or extend the job.
//!
//! Delivery is at least once: a worker killed after the side effect but before [`complete`]
//! runs the job again. Jobs are written to be idempotent (erasure is; deliveries carry a stable
//! idempotency key).
//!
//! Its parts: `enqueue` writes jobs; `lease` is a worker's side (claim, heartbeat, complete,
//! fail, release); `maintenance` rescues expired leases and prunes finished jobs; `stats` reads
//! the queue's health. All are re-exported here.

mod enqueue;
mod lease;
mod maintenance;
mod stats;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{Pool, Result};
pub use enqueue::{NewJob, enqueue, enqueue_many};
pub use lease::{ClaimedJob, Lease, claim, complete, complete_many, fail, heartbeat, release};
pub use maintenance::{Rescued, prune, rescue};
pub use stats::{KindDepth, Latency, QueueStats, STATS_WINDOW_SECONDS, stats};

/// The channel `LISTEN`ed to by idle workers; a trigger notifies it on every insert.
pub const NOTIFY_CHANNEL: &str = "breakwater_jobs";

/// Job kinds the worker runs.
pub mod kind {
    /// Deletes an erased contact's messages, conversations and the contact.
    pub const ERASE_CONTACT: &str = "erase_contact";
    /// POSTs an agent's outbound message to the inbox's webhook.
    pub const DELIVER_MESSAGE: &str = "deliver_message";
    /// Does nothing: the queue benchmark and end-to-end queue probes.
    pub const NOOP: &str = "noop";
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[sqlx(type_name = "job_state", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting to run at `run_at`.
    Ready,
    /// Leased to a worker.
    Running,
    /// Done; pruned after the retention period.
    Completed,
    /// Gave up; `last_error` says why.
    Dead,
}

/// Wakes the idle workers (a notification on [`NOTIFY_CHANNEL`]) once the caller's transaction
/// commits.
async fn notify(conn: &mut PgConnection) -> Result<()> {
    sqlx::query!("SELECT pg_notify('breakwater_jobs', '')").execute(&mut *conn).await?;
    Ok(())
}

/// One job, as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    /// The job's id.
    pub id: Uuid,
    /// Whose data it touches.
    pub tenant_id: Option<Uuid>,
    /// What it runs.
    pub kind: String,
    /// Its arguments.
    pub payload: serde_json::Value,
    /// Where it is in its life.
    pub state: JobState,
    /// Higher runs first.
    pub priority: i16,
    /// Due time (of the next attempt, while ready).
    pub run_at: DateTime<Utc>,
    /// Tries so far.
    pub attempts: i32,
    /// Tries allowed.
    pub max_attempts: i32,
    /// The last failure.
    pub last_error: Option<String>,
    /// The worker holding it, while running.
    pub lease_owner: Option<String>,
    /// When that lease ends unless extended.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Its idempotency key while live.
    pub unique_key: Option<String>,
    /// When the last attempt began.
    pub attempted_at: Option<DateTime<Utc>>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it completed or died.
    pub finished_at: Option<DateTime<Utc>>,
}

/// One job by id (operators and tests; jobs are not tenant-scoped reads).
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db jobs.get", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn get(pool: &Pool, id: Uuid) -> Result<Option<Job>> {
    let job = sqlx::query_as!(
        Job,
        r#"SELECT id, tenant_id, kind, payload, state AS "state: JobState", priority, run_at, attempts,
                  max_attempts, last_error, lease_owner, lease_expires_at, unique_key, attempted_at,
                  created_at, finished_at
           FROM jobs WHERE id = $1"#,
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(job)
}
