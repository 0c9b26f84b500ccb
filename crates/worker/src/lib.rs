//! Breakwater's worker: claims jobs from the PostgreSQL queue and runs them.
//!
//! Architecture invariant: the worker talks to PostgreSQL through `breakwater_domain` only.

use std::time::Duration;

use breakwater_domain::jobs::{self, ClaimedJob, kind};
use breakwater_domain::{Pool, TenantId};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Rows deleted per statement by an erasure: small enough that no statement holds many locks.
pub const ERASE_BATCH: i64 = 2_000;

/// How a worker process runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Lease owner name (unique per process).
    pub owner: String,
    /// Jobs claimed per round.
    pub batch: i64,
    /// How long a claimed job is leased.
    pub lease: Duration,
    /// Sleep between empty polls.
    pub poll_interval: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            owner: format!("worker-{}", Uuid::now_v7()),
            batch: 10,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// Runs the claim loop until `stop` is cancelled.
///
/// # Errors
/// Never for a job's failure (recorded on the job); only for an unrecoverable setup error.
pub async fn run(pool: Pool, options: WorkerOptions, stop: CancellationToken) -> anyhow::Result<()> {
    while !stop.is_cancelled() {
        match run_once(&pool, &options).await {
            Ok(0) => {
                tokio::select! {
                    () = tokio::time::sleep(options.poll_interval) => {}
                    () = stop.cancelled() => {}
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "claiming jobs failed; retrying");
                tokio::time::sleep(options.poll_interval).await;
            }
        }
    }
    Ok(())
}

/// Claims one batch and runs it; returns how many jobs were claimed.
///
/// # Errors
/// When claiming fails.
pub async fn run_once(pool: &Pool, options: &WorkerOptions) -> anyhow::Result<usize> {
    let claimed = jobs::claim(pool, &options.owner, options.batch, options.lease.as_secs_f64()).await?;
    let n = claimed.len();
    for job in claimed {
        let outcome = execute(pool, &job).await;
        match outcome {
            Ok(()) => {
                jobs::complete(pool, job.id, &options.owner).await?;
            }
            Err(JobError { message, permanent }) => {
                let backoff = 2f64.powi(job.attempts.min(10));
                tracing::warn!(job = %job.id, kind = %job.kind, attempt = job.attempts, error = %message, "job failed");
                jobs::fail(pool, job.id, &options.owner, &message, backoff, permanent).await?;
            }
        }
    }
    Ok(n)
}

struct JobError {
    message: String,
    permanent: bool,
}

impl JobError {
    fn permanent(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: true }
    }

    fn transient(message: impl Into<String>) -> Self {
        Self { message: message.into(), permanent: false }
    }
}

#[derive(Deserialize)]
struct EraseContact {
    contact_id: Uuid,
}

async fn execute(pool: &Pool, job: &ClaimedJob) -> Result<(), JobError> {
    match job.kind.as_str() {
        kind::ERASE_CONTACT => {
            let args: EraseContact = serde_json::from_value(job.payload.clone())
                .map_err(|e| JobError::permanent(format!("bad payload: {e}")))?;
            let tenant = job.tenant_id.map(TenantId).ok_or_else(|| JobError::permanent("erasure without tenant"))?;
            let (messages, conversations) =
                breakwater_domain::contacts::erase(pool, tenant, args.contact_id, ERASE_BATCH)
                    .await
                    .map_err(|e| JobError::transient(e.to_string()))?;
            tracing::info!(job = %job.id, messages, conversations, "contact erased");
            Ok(())
        }
        other => Err(JobError::permanent(format!("no handler for job kind `{other}` in this worker"))),
    }
}
