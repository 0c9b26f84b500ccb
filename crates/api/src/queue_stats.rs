//! The job queue's figures (`breakwater_domain::jobs::stats`) for `/v1/ops/status` and
//! `/metrics`, read through a short cache so that scrapes and status calls cost at most one
//! stats query per `JOBS_STATS_TTL_MS`, however many arrive.
//!
//! The query runs in a task of its own, one at a time; a caller waits for it at most
//! `JOBS_STATS_TIMEOUT_MS`, then gets the previous figures (with their age), or none before the
//! first answer. A slow query (a large backlog, a busy database) therefore never holds a scrape,
//! yet still lands for the next one: it is bounded by the pool's `statement_timeout`, not by the
//! caller's patience.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use breakwater_domain::jobs::{self, QueueStats};
use tokio::sync::watch;

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

/// The cache.
#[derive(Debug)]
pub struct QueueStatsCache {
    ttl: Duration,
    timeout: Duration,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Bumped after every refresh, answered or failed.
    refreshed: watch::Sender<u64>,
    failures: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Reading>,
    refreshing: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl QueueStatsCache {
    /// Figures kept `ttl`, a refresh waited for at most `timeout`.
    #[must_use]
    pub fn new(ttl: Duration, timeout: Duration) -> Self {
        let shared = Shared {
            state: Mutex::new(State::default()),
            refreshed: watch::Sender::new(0),
            failures: AtomicU64::new(0),
        };
        Self { ttl, timeout, shared: Arc::new(shared) }
    }

    /// Stats queries that failed since start.
    #[must_use]
    pub fn failures(&self) -> u64 {
        self.shared.failures.load(Ordering::Relaxed)
    }

    /// The figures: fresh ones when the cached ones are older than the TTL and the database
    /// answers within the timeout, the last ones otherwise (`None` before the first answer).
    pub async fn get(&self, pool: &sqlx::PgPool) -> Option<Reading> {
        let mut refreshed = self.shared.refreshed.subscribe();
        {
            let mut state = self.shared.state();
            if let Some(r) = &state.last
                && r.age() < self.ttl
            {
                return Some(r.clone());
            }
            if !state.refreshing {
                state.refreshing = true;
                tokio::spawn(refresh(Arc::clone(&self.shared), pool.clone()));
            }
        }
        // Late or failed: the previous figures, if any.
        let _ = tokio::time::timeout(self.timeout, refreshed.changed()).await;
        self.shared.state().last.clone()
    }
}

async fn refresh(shared: Arc<Shared>, pool: sqlx::PgPool) {
    let result = jobs::stats(&pool).await;
    {
        let mut state = shared.state();
        state.refreshing = false;
        match result {
            Ok(stats) => state.last = Some(Reading { stats: Arc::new(stats), read_at: Instant::now() }),
            Err(e) => {
                shared.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "reading the job queue's figures failed");
            }
        }
    }
    shared.refreshed.send_modify(|n| *n = n.wrapping_add(1));
}
