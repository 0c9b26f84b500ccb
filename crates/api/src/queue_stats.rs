//! The job queue's figures (`breakwater_domain::jobs::stats`) for `/v1/ops/status` and
//! `/metrics`, read through a short cache so that scrapes and status calls cost at most one
//! stats query per `JOBS_STATS_TTL_MS`, and with a bounded wait so that a slow or unreachable
//! database cannot hang either endpoint: past `JOBS_STATS_TIMEOUT_MS` the last figures are
//! served, marked by their age, or none at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use breakwater_domain::jobs::{self, QueueStats};
use tokio::sync::Mutex;

/// Figures and when they were read.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The figures.
    pub stats: Arc<QueueStats>,
    /// When the query answered.
    pub read_at: Instant,
}

impl Reading {
    /// How old the figures are.
    #[must_use]
    pub fn age(&self) -> Duration {
        self.read_at.elapsed()
    }
}

/// The cache. One reader refreshes at a time; the others wait for its answer.
#[derive(Debug)]
pub struct QueueStatsCache {
    ttl: Duration,
    timeout: Duration,
    last: Mutex<Option<Reading>>,
    failures: AtomicU64,
}

impl QueueStatsCache {
    /// Figures kept `ttl`, a refresh waited for at most `timeout`.
    #[must_use]
    pub fn new(ttl: Duration, timeout: Duration) -> Self {
        Self { ttl, timeout, last: Mutex::new(None), failures: AtomicU64::new(0) }
    }

    /// Stats queries that failed or timed out since start.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The figures: fresh ones when the cached ones are older than the TTL and the database
    /// answers in time, the last ones otherwise (`None` before the first answer).
    pub async fn get(&self, pool: &sqlx::PgPool) -> Option<Reading> {
        // Waiting for another caller's refresh is bounded by the same timeout.
        let Ok(mut last) = tokio::time::timeout(self.timeout, self.last.lock()).await else {
            return None;
        };
        if let Some(r) = last.as_ref()
            && r.age() < self.ttl
        {
            return Some(r.clone());
        }
        match tokio::time::timeout(self.timeout, jobs::stats(pool)).await {
            Ok(Ok(stats)) => {
                let reading = Reading { stats: Arc::new(stats), read_at: Instant::now() };
                *last = Some(reading.clone());
                Some(reading)
            }
            Ok(Err(e)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "reading the job queue's figures failed");
                last.clone()
            }
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(timeout = ?self.timeout, "reading the job queue's figures timed out");
                last.clone()
            }
        }
    }
}
