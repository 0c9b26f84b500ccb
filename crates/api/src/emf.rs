//! CloudWatch metrics without an agent: with `METRICS_EMF_INTERVAL_SECS` set, the API writes its
//! figures to stdout every interval as CloudWatch embedded-metric-format lines
//! ([`breakwater_telemetry::emf`]). On ECS the `awslogs` driver carries them to CloudWatch Logs,
//! which turns them into metrics; the alarms in `infra/cloudformation/alarms.yaml` watch those.
//! Nothing on ECS scrapes `/metrics`, and a collector sidecar would take CPU from a task sized
//! at a quarter of a core.
//!
//! Each interval writes one line for the task (dimensions `Environment`, `Service`) and one per
//! admission class (plus `Class`). Counters are published as what happened during the interval
//! (CloudWatch sums them across tasks and periods); gauges as their value at the line's time.
//! The last line is written after the server has drained, so a stopping task's final requests
//! are counted too.

use std::collections::HashMap;
use std::time::SystemTime;

use breakwater_telemetry::emf::{Line, Source, Unit};

use crate::metrics::Outcomes;
use crate::state::AppState;

/// The `Service` dimension of the API's lines.
pub const SERVICE: &str = "api";

/// Totals since start, kept to publish each interval's difference.
#[derive(Debug, Clone, Default)]
struct Totals {
    outcomes: Outcomes,
    admitted: u64,
    shed: u64,
    connections_refused: u64,
    throttle_refused: u64,
    throttle_redis_errors: u64,
    bulkhead_timeouts: u64,
    /// Per class: admitted, shed.
    classes: HashMap<String, (u64, u64)>,
}

/// Builds the lines, remembering the totals the previous lines were computed from.
#[derive(Debug)]
pub struct Publisher {
    namespace: String,
    environment: String,
    previous: Totals,
}

impl Publisher {
    /// A publisher whose first lines count everything since the process started.
    #[must_use]
    pub fn new(namespace: &str, environment: &str) -> Self {
        Self { namespace: namespace.to_owned(), environment: environment.to_owned(), previous: Totals::default() }
    }

    /// The lines for the interval since the previous call: the task's, then one per admission
    /// class. Reads the job queue's figures through their cache (a query at most every
    /// `JOBS_STATS_TTL_MS`, never longer than `JOBS_STATS_TIMEOUT_MS`).
    pub async fn lines(&mut self, state: &AppState) -> Vec<Line> {
        let queue = state.queue_stats.get(&state.pool).await;
        let now = SystemTime::now();
        let outcomes = state.metrics.outcomes();
        let admission = state.admission.snapshot();
        let throttles = state.throttles.status();
        let bulkhead = state.bulkhead.status();
        let totals = Totals {
            outcomes,
            admitted: admission.admitted_total,
            shed: admission.shed.total(),
            connections_refused: state.connections.refused() + state.connections.reset(),
            throttle_refused: throttles.refused.tenant + throttles.refused.user + throttles.refused.ip,
            throttle_redis_errors: throttles.redis_errors,
            bulkhead_timeouts: bulkhead.acquire_timeouts,
            classes: admission.classes.iter().map(|c| (c.name.clone(), (c.admitted_total, c.shed.total()))).collect(),
        };
        let before = std::mem::replace(&mut self.previous, totals.clone());
        let (o, p) = (&totals.outcomes, &before.outcomes);
        let all = |o: &Outcomes| o.ok + o.client_error + o.refused + o.error;
        let as_u64 = |n: usize| n as u64;

        let line = || Line::new(&self.namespace, now).dimension("Environment", &self.environment);
        let mut task = line().dimension("Service", SERVICE);
        task.count_since("Requests", all(o), all(p))
            .count_since("ServerErrors", o.error, p.error)
            .count_since("Refused", o.refused, p.refused)
            .count_since("AdmissionAdmitted", totals.admitted, before.admitted)
            .count_since("AdmissionShed", totals.shed, before.shed)
            .count_since("ConnectionsRefused", totals.connections_refused, before.connections_refused)
            .count_since("ThrottleRefused", totals.throttle_refused, before.throttle_refused)
            .count_since("ThrottleRedisErrors", totals.throttle_redis_errors, before.throttle_redis_errors)
            .count_since("BulkheadTimeouts", totals.bulkhead_timeouts, before.bulkhead_timeouts)
            .count("ConnectionsOpen", as_u64(state.connections.open()))
            .count("AdmissionInFlight", as_u64(admission.in_flight))
            .count("AdmissionQueueDepth", as_u64(admission.queue_depth))
            .metric("ThrottleDegraded", Unit::None, if throttles.state == "degraded" { 1.0 } else { 0.0 })
            .metric("TokioBusyRatio", Unit::None, state.metrics.tokio_busy_ratio());
        match &queue {
            // Never read: say so (as /metrics does) rather than publish an empty queue.
            None => {
                task.metric("JobsStatsAge", Unit::Seconds, -1.0);
            }
            Some(reading) => {
                let q = &reading.stats;
                task.metric("JobsStatsAge", Unit::Seconds, reading.age().as_secs_f64())
                    .metric("JobsOldestReadyAge", Unit::Seconds, q.oldest_ready_age_seconds.unwrap_or(0.0))
                    .count("JobsDeadInWindow", non_negative(q.dead_in_window))
                    .count("JobsRunningLeaseExpired", non_negative(q.running_lease_expired))
                    .count("JobsRetrying", non_negative(q.retrying));
            }
        }

        let mut lines = vec![task];
        for c in &admission.classes {
            let (admitted, shed) = totals.classes.get(&c.name).copied().unwrap_or_default();
            let (was_admitted, was_shed) = before.classes.get(&c.name).copied().unwrap_or_default();
            let mut class = line().dimension("Service", SERVICE).dimension("Class", &c.name);
            class
                .count_since("AdmissionAdmitted", admitted, was_admitted)
                .count_since("AdmissionShed", shed, was_shed)
                .count("AdmissionInFlight", as_u64(c.in_flight))
                .count("AdmissionQueueDepth", as_u64(c.queue_depth));
            // Admission off has no limit; no traffic, no p95: left out rather than published as 0.
            if let Some(limit) = c.limit {
                class.count("AdmissionLimit", as_u64(limit));
            }
            if let Some(p95) = c.p95_ms {
                class.metric("AdmissionP95", Unit::Milliseconds, p95);
            }
            lines.push(class);
        }
        lines
    }
}

/// A count the database gives as `bigint`.
fn non_negative(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The API's [`Source`]: its publisher and the state it reads.
#[derive(Debug)]
pub(crate) struct ApiSource {
    publisher: Publisher,
    state: AppState,
}

impl ApiSource {
    /// Lines in the namespace and environment of the state's configuration.
    pub(crate) fn new(state: AppState) -> Self {
        let options = &state.config.metrics_emf;
        Self { publisher: Publisher::new(&options.namespace, &options.environment), state }
    }
}

impl Source for ApiSource {
    async fn lines(&mut self) -> Vec<Line> {
        self.publisher.lines(&self.state).await
    }
}
