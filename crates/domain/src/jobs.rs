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

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::{Pool, Result, TenantId, ids::new_id};

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
    /// Higher runs first.
    pub priority: i16,
    /// Not before this time (`None`: now).
    pub run_at: Option<DateTime<Utc>>,
    /// W3C trace context of the request that enqueued the job.
    pub traceparent: Option<String>,
}

impl NewJob {
    /// A job of `kind` with default settings: no tenant, no unique key, 10 attempts, now.
    #[must_use]
    pub fn new(kind: &'static str, payload: serde_json::Value) -> Self {
        Self {
            tenant: None,
            kind,
            payload,
            unique_key: None,
            max_attempts: 10,
            priority: 0,
            run_at: None,
            traceparent: None,
        }
    }

    /// The erasure of a tombstoned contact. Unique per contact.
    #[must_use]
    pub fn erase_contact(tenant: TenantId, contact: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            unique_key: Some(format!("{}:{tenant}:{contact}", kind::ERASE_CONTACT)),
            max_attempts: 25,
            // Privacy erasure has a legal deadline; deliveries can wait a moment.
            priority: 1,
            ..Self::new(kind::ERASE_CONTACT, json!({ "contact_id": contact }))
        }
    }

    /// The outbound delivery of an agent's message. Unique per message.
    #[must_use]
    pub fn deliver_message(tenant: TenantId, inbox: Uuid, conversation: Uuid, message: Uuid) -> Self {
        Self {
            tenant: Some(tenant),
            unique_key: Some(format!("{}:{tenant}:{message}", kind::DELIVER_MESSAGE)),
            ..Self::new(
                kind::DELIVER_MESSAGE,
                json!({ "inbox_id": inbox, "conversation_id": conversation, "message_id": message }),
            )
        }
    }

    /// Carries the enqueuing request's W3C `traceparent` to the worker.
    #[must_use]
    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        self.traceparent = traceparent;
        self
    }
}

/// Enqueues a job inside the caller's transaction and returns its id. With a unique key that a
/// live (ready or running) job already holds, returns that job's id instead: the partial unique
/// index makes this race-free, a concurrent enqueue of the same key waits for ours to commit.
///
/// # Errors
/// A database error.
#[tracing::instrument(name = "db jobs.enqueue", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn enqueue(conn: &mut PgConnection, job: NewJob) -> Result<Uuid> {
    // The live job holding the key can finish between the INSERT and the SELECT below; then the
    // key is free again and the next round inserts.
    loop {
        let id = new_id();
        let inserted = sqlx::query_scalar!(
            "INSERT INTO jobs (id, tenant_id, kind, payload, unique_key, max_attempts, priority, run_at, traceparent)
             VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, now()), $9)
             ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN ('ready', 'running')
             DO NOTHING
             RETURNING id",
            id,
            job.tenant.map(|t| t.0),
            job.kind,
            job.payload,
            job.unique_key,
            job.max_attempts,
            job.priority,
            job.run_at,
            job.traceparent,
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
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = existing {
            return Ok(id);
        }
    }
}

/// Enqueues many jobs of one kind, without tenant or unique key, in one statement (the
/// benchmark and bulk back-fills). Returns how many were inserted.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.enqueue_many", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn enqueue_many(conn: &mut PgConnection, kind: &'static str, payloads: &[serde_json::Value]) -> Result<u64> {
    let ids: Vec<Uuid> = payloads.iter().map(|_| new_id()).collect();
    let inserted = sqlx::query!(
        "INSERT INTO jobs (id, kind, payload)
         SELECT id, $2, payload FROM unnest($1::uuid[], $3::jsonb[]) AS t(id, payload)",
        &ids,
        kind,
        payloads
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(inserted)
}

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

async fn notify(conn: &mut PgConnection) -> Result<()> {
    sqlx::query!("SELECT pg_notify('breakwater_jobs', '')").execute(&mut *conn).await?;
    Ok(())
}

/// What one pass of the rescuer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rescued {
    /// Jobs whose lease expired, returned to `ready` to run at once.
    pub requeued: u64,
    /// Jobs whose lease expired on their last attempt, now `dead`.
    pub dead: u64,
}

/// Returns up to `batch` running jobs whose lease expired (their worker died or hung) to the
/// queue, due at once; those that were on their last attempt go dead instead (a job that kills
/// its worker every time must not kill every worker). Safe to run from every worker at once.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.rescue", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn rescue(pool: &Pool, batch: i64) -> Result<Rescued> {
    let mut tx = pool.begin().await?;
    let states = sqlx::query_scalar!(
        r#"UPDATE jobs j
           SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead'::job_state ELSE 'ready'::job_state END,
               finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
               run_at = now(),
               last_error = 'lease of ' || COALESCE(j.lease_owner, '?') || ' expired during attempt ' || j.attempts,
               lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
           FROM (SELECT id FROM jobs
                 WHERE state = 'running' AND lease_expires_at < now()
                 ORDER BY lease_expires_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED) expired
           WHERE j.id = expired.id
           RETURNING j.state AS "state: JobState""#,
        batch
    )
    .fetch_all(&mut *tx)
    .await?;
    let dead = states.iter().filter(|s| **s == JobState::Dead).count() as u64;
    let rescued = Rescued { requeued: states.len() as u64 - dead, dead };
    if rescued.requeued > 0 {
        notify(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(rescued)
}

/// Deletes up to `batch` completed jobs finished more than `completed_after_seconds` ago and
/// dead ones finished more than `dead_after_seconds` ago; returns how many. Call it until it
/// returns less than `2 * batch`.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.prune", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn prune(pool: &Pool, completed_after_seconds: f64, dead_after_seconds: f64, batch: i64) -> Result<u64> {
    let completed = sqlx::query!(
        "DELETE FROM jobs WHERE id IN (
             SELECT id FROM jobs
             WHERE finished_at < now() - make_interval(secs => $1) AND state = 'completed'
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        completed_after_seconds,
        batch
    )
    .execute(pool)
    .await?
    .rows_affected();
    let dead = sqlx::query!(
        "DELETE FROM jobs WHERE id IN (
             SELECT id FROM jobs
             WHERE finished_at < now() - make_interval(secs => $1) AND state = 'dead'
             LIMIT $2 FOR UPDATE SKIP LOCKED)",
        dead_after_seconds,
        batch
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(completed + dead)
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

/// The queue's depth for one kind of job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KindDepth {
    /// The job kind.
    pub kind: String,
    /// Ready and due now: the backlog.
    pub ready: i64,
    /// Ready but due later (mostly retries waiting out their backoff).
    pub scheduled: i64,
    /// Leased to a worker.
    pub running: i64,
    /// Given up, kept with their last error until pruned.
    pub dead: i64,
}

/// The claim-to-start latency (from a job being due to a worker starting it), over the jobs
/// finished in the window, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Latency {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
}

/// The queue's health, read from the table (published on `/v1/ops/status`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueStats {
    /// Depth by kind and state (completed jobs are counted in the window figures only).
    pub by_kind: Vec<KindDepth>,
    /// Ready and due, all kinds.
    pub ready: i64,
    /// Ready but due later, all kinds.
    pub scheduled: i64,
    /// Running, all kinds.
    pub running: i64,
    /// Running with an expired lease: their worker died; the rescuer returns them shortly.
    pub running_lease_expired: i64,
    /// Dead, all kinds, until pruned.
    pub dead: i64,
    /// Ready jobs that already failed at least once (retries pending).
    pub retrying: i64,
    /// How long the oldest due job has waited, in seconds (`null` when none waits).
    pub oldest_ready_age_seconds: Option<f64>,
    /// The window of the figures below, in seconds.
    pub window_seconds: i64,
    /// Jobs completed in the window.
    pub completed_in_window: i64,
    /// Completions per second over the window.
    pub throughput_per_second: f64,
    /// Jobs completed in the window that needed more than one attempt.
    pub retried_in_window: i64,
    /// Jobs that went dead in the window.
    pub dead_in_window: i64,
    /// Claim-to-start latency of the jobs completed in the window (`null` when none).
    pub start_latency: Option<Latency>,
}

/// The window of [`QueueStats`]' rates.
pub const STATS_WINDOW_SECONDS: i64 = 60;

/// Reads the queue's health: the live jobs (ready, running, dead) through their partial indexes,
/// and the jobs finished in the last [`STATS_WINDOW_SECONDS`] through the finished index.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.stats", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn stats(pool: &Pool) -> Result<QueueStats> {
    let rows = sqlx::query!(
        r#"SELECT kind,
                  count(*) FILTER (WHERE state = 'ready' AND run_at <= now()) AS "ready!",
                  count(*) FILTER (WHERE state = 'ready' AND run_at > now()) AS "scheduled!",
                  count(*) FILTER (WHERE state = 'running') AS "running!",
                  count(*) FILTER (WHERE state = 'running' AND lease_expires_at < now()) AS "lease_expired!",
                  count(*) FILTER (WHERE state = 'dead') AS "dead!",
                  count(*) FILTER (WHERE state = 'ready' AND attempts > 0) AS "retrying!",
                  extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'ready' AND run_at <= now()))::float8
                      AS oldest_ready_age
           FROM jobs
           WHERE state IN ('ready', 'running', 'dead')
           GROUP BY kind
           ORDER BY kind"#
    )
    .fetch_all(pool)
    .await?;
    let window = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE state = 'completed') AS "completed!",
                  count(*) FILTER (WHERE state = 'completed' AND attempts > 1) AS "retried!",
                  count(*) FILTER (WHERE state = 'dead') AS "dead!",
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM attempted_at - run_at)::float8)
                      FILTER (WHERE state = 'completed') AS p50,
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM attempted_at - run_at)::float8)
                      FILTER (WHERE state = 'completed') AS p99,
                  max(extract(epoch FROM attempted_at - run_at)::float8) FILTER (WHERE state = 'completed') AS max
           FROM jobs
           WHERE finished_at > now() - make_interval(secs => $1)"#,
        STATS_WINDOW_SECONDS as f64
    )
    .fetch_one(pool)
    .await?;

    let mut stats = QueueStats {
        by_kind: Vec::with_capacity(rows.len()),
        ready: 0,
        scheduled: 0,
        running: 0,
        running_lease_expired: 0,
        dead: 0,
        retrying: 0,
        oldest_ready_age_seconds: None,
        window_seconds: STATS_WINDOW_SECONDS,
        completed_in_window: window.completed,
        throughput_per_second: window.completed as f64 / STATS_WINDOW_SECONDS as f64,
        retried_in_window: window.retried,
        dead_in_window: window.dead,
        start_latency: match (window.p50, window.p99, window.max) {
            (Some(p50), Some(p99), Some(max)) => {
                Some(Latency { p50_ms: p50 * 1000.0, p99_ms: p99 * 1000.0, max_ms: max * 1000.0 })
            }
            _ => None,
        },
    };
    for row in rows {
        stats.ready += row.ready;
        stats.scheduled += row.scheduled;
        stats.running += row.running;
        stats.running_lease_expired += row.lease_expired;
        stats.dead += row.dead;
        stats.retrying += row.retrying;
        if let Some(age) = row.oldest_ready_age {
            stats.oldest_ready_age_seconds = Some(stats.oldest_ready_age_seconds.map_or(age, |a: f64| a.max(age)));
        }
        stats.by_kind.push(KindDepth {
            kind: row.kind,
            ready: row.ready,
            scheduled: row.scheduled,
            running: row.running,
            dead: row.dead,
        });
    }
    Ok(stats)
}
