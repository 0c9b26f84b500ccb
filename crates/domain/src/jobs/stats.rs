//! The queue's health, read from the table: depth by kind and state, and the rates and
//! claim-to-start latency of the jobs finished in the last [`STATS_WINDOW_SECONDS`].

use serde::Serialize;

use crate::{Pool, Result};

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
