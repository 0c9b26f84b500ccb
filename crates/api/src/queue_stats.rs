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

/// The job queue's figures: the cache's reading (none until the database first answers) and its
/// failed reads.
#[derive(Debug)]
pub struct JobFigures {
    /// The cached figures, if ever read.
    pub reading: Option<Reading>,
    /// Reads that failed since start.
    pub failures: u64,
}

impl crate::figures::Publish for JobFigures {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::{Kind, Lines, NOT_ALARMED, Number, Unit};
        let q = self.reading.as_ref().map(|r| &*r.stats);
        // Never read: the figures are unknown (Prometheus, which has no null, shows 0; the
        // CloudWatch lines leave them out), except their age, which says so with -1.
        let depth = out.figure(
            Kind::Gauge,
            "jobs",
            "Live jobs by kind and state (ready: due now; scheduled: due later; running; dead: until pruned)",
        );
        for k in q.map_or(&[][..], |q| &q.by_kind) {
            for (state, n) in [("ready", k.ready), ("scheduled", k.scheduled), ("running", k.running), ("dead", k.dead)]
            {
                depth.series(&[("kind", k.kind.as_str()), ("state", state)], n);
            }
        }
        depth.no_emf(NOT_ALARMED).ops("by_kind/{kind}/{state}");
        let float = |v: Option<f64>| v.map(Number::from);
        out.figure(
            Kind::Gauge,
            "jobs_oldest_ready_age_seconds",
            "How long the oldest due job has waited (0 when none waits)",
        )
        .maybe(&[], float(q.map(|q| q.oldest_ready_age_seconds.unwrap_or(0.0))))
        .unknown_in_prometheus_as(0.0)
        .emf("JobsOldestReadyAge", Unit::Seconds, Lines::Task)
        .ops("oldest_ready_age_seconds");
        out.figure(
            Kind::Gauge,
            "jobs_running_lease_expired",
            "Running jobs whose lease expired (their worker died; the rescuer returns them)",
        )
        .maybe(&[], q.map(|q| q.running_lease_expired.into()))
        .emf("JobsRunningLeaseExpired", Unit::Count, Lines::Task)
        .ops("running_lease_expired");
        out.figure(Kind::Gauge, "jobs_retrying", "Due jobs that already failed at least once")
            .maybe(&[], q.map(|q| q.retrying.into()))
            .emf("JobsRetrying", Unit::Count, Lines::Task)
            .ops("retrying");
        out.figure(Kind::Gauge, "jobs_throughput_per_second", "Jobs completed per second over the last minute")
            .maybe(&[], float(q.map(|q| q.throughput_per_second)))
            .unknown_in_prometheus_as(0.0)
            .no_emf("the worker publishes JobsCompleted, which CloudWatch sums over any period")
            .ops("throughput_per_second");
        out.figure(
            Kind::Gauge,
            "jobs_start_latency_p99_seconds",
            "p99 of due-to-start latency of the jobs completed in the last minute (0 when none)",
        )
        .maybe(&[], float(q.map(|q| q.start_latency.map_or(0.0, |l| l.p99_ms / 1000.0))))
        .unknown_in_prometheus_as(0.0)
        .no_emf(NOT_ALARMED)
        // Null there while no job completed in the window; its `p99_ms` in ms.
        .ops("start_latency");
        out.figure(Kind::Gauge, "jobs_dead_in_window", "Jobs that went dead in the last minute")
            .maybe(&[], q.map(|q| q.dead_in_window.into()))
            .emf("JobsDeadInWindow", Unit::Count, Lines::Task)
            .ops("dead_in_window");
        out.gauge(
            "jobs_stats_age_seconds",
            "Age of the job queue figures above (-1: never read)",
            self.reading.as_ref().map_or(-1.0, |r| r.age().as_secs_f64()),
        )
        .emf("JobsStatsAge", Unit::Seconds, Lines::Task)
        .ops("age_seconds");
        out.counter("jobs_stats_failures", "Job queue figure reads that failed", self.failures)
            .no_emf(NOT_ALARMED)
            .no_ops("not published there yet: /v1/ops/status shows the last figures read and their age");
    }
}
