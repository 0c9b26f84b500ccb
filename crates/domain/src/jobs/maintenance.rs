//! The queue's upkeep, run by every worker: returning jobs whose lease expired, and deleting
//! finished ones past their retention.

use serde::Serialize;

use super::{JobState, notify};
use crate::{Pool, Result};

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

/// Deletes up to `$batch` jobs in `$state` (an SQL literal, so each state has its own static
/// query) finished more than `$after_seconds` ago; returns how many.
macro_rules! prune_query {
    ($pool:expr, $state:tt, $after_seconds:expr, $batch:expr) => {
        sqlx::query!(
            "DELETE FROM jobs WHERE id IN (
                 SELECT id FROM jobs
                 WHERE finished_at < now() - make_interval(secs => $1) AND state = "
                + $state
                + " LIMIT $2 FOR UPDATE SKIP LOCKED)",
            $after_seconds,
            $batch
        )
        .execute($pool)
        .await?
        .rows_affected()
    };
}

/// Deletes up to `batch` completed jobs finished more than `completed_after_seconds` ago and
/// dead ones finished more than `dead_after_seconds` ago; returns how many. Call it until it
/// returns less than `2 * batch`.
///
/// # Errors
/// A database error.
#[tracing::instrument(level = "debug", name = "db jobs.prune", skip_all, fields(otel.kind = "client", db.system.name = "postgresql"))]
pub async fn prune(pool: &Pool, completed_after_seconds: f64, dead_after_seconds: f64, batch: i64) -> Result<u64> {
    let completed = prune_query!(pool, "'completed'", completed_after_seconds, batch);
    let dead = prune_query!(pool, "'dead'", dead_after_seconds, batch);
    Ok(completed + dead)
}
