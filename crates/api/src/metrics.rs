//! `/metrics`: Prometheus text exposition.
//!
//! Request counts and latency histograms by matched route and outcome (`ok`, `client_error`,
//! `refused` for a deliberate 429/503, `error` for a 500 and the 503s that are failures), and
//! every live figure the layers publish on `/v1/ops/status`, read at scrape time; the job
//! queue's figures through a short cache ([`crate::queue_stats`]); and the tokio runtime's
//! health, sampled every `RUNTIME_METRICS_INTERVAL_MS` by a task that ends with the app
//! ([`sample_runtime`]). The registry belongs to the app (no global recorder), so several apps
//! in one process (tests) do not mix their figures.
//!
//! Runtime health uses what stable tokio offers (no `--cfg tokio_unstable`): the runtime's
//! workers, live tasks, global queue depth, busy time and parks, and, for the request futures
//! themselves (a `TaskMonitor` around each), their polls, poll time, slow polls and the time
//! they waited to be polled after being woken (the sign of a saturated runtime). Per-worker
//! poll counts, poll-time histograms and local queue depths need `tokio_unstable`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Response, StatusCode, header};
use axum::middleware::Next;
use axum::response::IntoResponse;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use breakwater_telemetry::prometheus::advance;

use crate::error::Failure;
use crate::state::AppState;

type FloatGauge = Gauge<f64, AtomicU64>;

/// A poll, or a wait between wake-up and poll, longer than this counts as slow: a millisecond of
/// one request's work on a worker delays every other request queued behind it.
const SLOW: Duration = Duration::from_millis(1);
type FloatCounter = Counter<f64, AtomicU64>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~8 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// The app's metrics.
///
/// What the layers count since start (refusals, checks, admissions) is published as counters,
/// so `rate()` and counter-reset handling work as Prometheus expects; what they hold now
/// (limits, in-flight, queue depths) as gauges. Both are read from the layers at scrape time.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    gauges: LiveSeries,
    jobs: JobGauges,
    runtime: RuntimeSeries,
    /// Wraps every request future: its polls and scheduling delays.
    tasks: tokio_metrics::TaskMonitor,
    /// Scrapes set the live gauges then encode: one at a time.
    render_lock: Mutex<()>,
    /// Routed requests by outcome since start, probes and scrapes left out, for [`crate::emf`]
    /// (the families above cannot be summed without encoding them).
    outcomes: OutcomeTotals,
}

/// Routed requests by `outcome` since start.
#[derive(Debug, Default)]
struct OutcomeTotals {
    ok: AtomicU64,
    client_error: AtomicU64,
    refused: AtomicU64,
    error: AtomicU64,
}

/// Routed requests by outcome since start, probes and scrapes (`/health`, `/ready`, `/metrics`)
/// left out (requests shed by admission or at accept never reach the router: the layers count
/// those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Outcomes {
    pub ok: u64,
    pub client_error: u64,
    pub refused: u64,
    pub error: u64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    kind: String,
    state: &'static str,
}

/// The job queue's figures.
#[derive(Debug, Default)]
struct JobGauges {
    depth: Family<JobLabels, Gauge>,
    oldest_ready_age: FloatGauge,
    lease_expired: Gauge,
    retrying: Gauge,
    throughput: FloatGauge,
    start_p99: FloatGauge,
    dead_in_window: Gauge,
    stats_age: FloatGauge,
    stats_failures: Counter,
}

/// The tokio runtime and the request futures, sampled on an interval.
#[derive(Debug, Default)]
struct RuntimeSeries {
    workers: Gauge,
    alive_tasks: Gauge,
    global_queue_depth: Gauge,
    busy_ratio: FloatGauge,
    busy_seconds: FloatCounter,
    parks: Counter,
    polls: Counter,
    poll_seconds: FloatCounter,
    slow_polls: Counter,
    schedules: Counter,
    scheduled_seconds: FloatCounter,
    long_schedule_delays: Counter,
}

#[derive(Debug, Default)]
struct LiveSeries {
    connections_open: Gauge,
    connections_max: Gauge,
    connections_refused: Counter,
    connections_reset: Counter,
    connections_accept_paced: Counter,
    retry_early: Counter,
    retry_held: Counter,
    body_timed_out: Counter,
    bulkhead_size: Gauge,
    bulkhead_in_use: Gauge,
    bulkhead_waiting: Gauge,
    bulkhead_timeouts: Counter,
    pool_size: Gauge,
    pool_idle: Gauge,
    throttle_degraded: Gauge,
    throttle_checks: Counter,
    throttle_fallback_checks: Counter,
    throttle_redis_errors: Counter,
    throttle_refused: Family<KindLabel, Counter>,
    throttle_refused_ahead: Counter,
    admission_limit: Family<ClassLabel, Gauge>,
    admission_in_flight: Family<ClassLabel, Gauge>,
    admission_queue_depth: Family<ClassLabel, Gauge>,
    admission_admitted: Family<ClassLabel, Counter>,
    admission_shed: Family<ShedLabels, Counter>,
    admission_p95_ms: Family<ClassLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabels {
    class: String,
    reason: &'static str,
}

/// Classifies a response for the `outcome` label: a deliberate refusal (a 429, or a 503 such as
/// `db_saturated`) is not an error; a response marked [`Failure`] (a 500, `db_unavailable`,
/// `request_timeout`) is one, whatever its status.
#[must_use]
pub fn outcome(status: StatusCode, failed: bool) -> &'static str {
    match status.as_u16() {
        _ if failed => "error",
        429 | 503 => "refused",
        500..=599 => "error",
        400..=499 => "client_error",
        _ => "ok",
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every series registered.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("breakwater");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        registry.register("http_requests", "HTTP requests by matched route, method and outcome", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Handler latency by matched route, method and outcome",
            latency.clone(),
        );
        let gauges = LiveSeries::default();
        let g = &gauges;
        registry.register("connections_open", "Open client connections", g.connections_open.clone());
        registry.register("connections_max", "Connection cap", g.connections_max.clone());
        registry.register(
            "connections_refused",
            "Connections answered 503 load_shed at accept (over the cap)",
            g.connections_refused.clone(),
        );
        registry.register(
            "connections_reset",
            "Connections reset at accept (over the cap, refusals saturated)",
            g.connections_reset.clone(),
        );
        registry.register(
            "connections_accept_paced",
            "Times the accept loop paused for MAX_ACCEPT_RATE",
            g.connections_accept_paced.clone(),
        );
        registry.register(
            "retry_early",
            "Refusals to callers that came back before their last refusal's Retry-After",
            g.retry_early.clone(),
        );
        registry.register(
            "retry_held",
            "Of those, refusals held until the Retry-After their caller was given",
            g.retry_held.clone(),
        );
        registry.register(
            "body_timed_out",
            "Request bodies not sent within BODY_READ_TIMEOUT_MS (408 body_timeout)",
            g.body_timed_out.clone(),
        );
        registry.register("bulkhead_slots", "Database bulkhead slots", g.bulkhead_size.clone());
        registry.register("bulkhead_in_use", "Database bulkhead slots held", g.bulkhead_in_use.clone());
        registry.register("bulkhead_waiting", "Requests waiting for a database slot", g.bulkhead_waiting.clone());
        registry.register(
            "bulkhead_acquire_timeouts",
            "Requests refused with db_saturated",
            g.bulkhead_timeouts.clone(),
        );
        registry.register("pool_connections", "Open database connections", g.pool_size.clone());
        registry.register("pool_idle_connections", "Idle database connections", g.pool_idle.clone());
        registry.register(
            "throttle_degraded",
            "1 while throttles run in process (Redis unavailable)",
            g.throttle_degraded.clone(),
        );
        registry.register("throttle_checks", "Requests checked by the throttles", g.throttle_checks.clone());
        registry.register(
            "throttle_fallback_checks",
            "Requests checked in process",
            g.throttle_fallback_checks.clone(),
        );
        registry.register(
            "throttle_redis_errors",
            "Redis throttle calls failed or over budget",
            g.throttle_redis_errors.clone(),
        );
        registry.register("throttle_refused", "Requests refused by throttle bucket kind", g.throttle_refused.clone());
        registry.register(
            "throttle_refused_ahead",
            "Of those, answered before admission: the bucket was still refusing from an earlier 429",
            g.throttle_refused_ahead.clone(),
        );
        registry.register(
            "admission_limit",
            "Admission in-flight limit now, per route class",
            g.admission_limit.clone(),
        );
        registry.register("admission_in_flight", "Requests holding an admission slot", g.admission_in_flight.clone());
        registry.register(
            "admission_queue_depth",
            "Requests waiting for an admission slot",
            g.admission_queue_depth.clone(),
        );
        registry.register("admission_admitted", "Requests admitted", g.admission_admitted.clone());
        registry.register("admission_shed", "Requests refused by admission, by reason", g.admission_shed.clone());
        registry.register("admission_p95_ms", "p95 latency of admitted requests, ms", g.admission_p95_ms.clone());
        let jobs = JobGauges::default();
        register_jobs(&mut registry, &jobs);
        let runtime = RuntimeSeries::default();
        register_runtime(&mut registry, &runtime);
        Self {
            registry,
            requests,
            latency,
            gauges,
            jobs,
            runtime,
            tasks: {
                let mut b = tokio_metrics::TaskMonitor::builder();
                b.with_slow_poll_threshold(SLOW).with_long_delay_threshold(SLOW);
                b.build()
            },
            render_lock: Mutex::new(()),
            outcomes: OutcomeTotals::default(),
        }
    }

    fn record(&self, route: String, method: String, status: StatusCode, failed: bool, seconds: f64) {
        let outcome = outcome(status, failed);
        if !crate::PROBES.contains(&route.as_str()) {
            let o = &self.outcomes;
            let total = match outcome {
                "ok" => &o.ok,
                "client_error" => &o.client_error,
                "refused" => &o.refused,
                _ => &o.error,
            };
            total.fetch_add(1, Ordering::Relaxed);
        }
        let labels = RequestLabels { route, method, outcome };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    /// Routed requests by outcome since start, probes and scrapes left out.
    pub(crate) fn outcomes(&self) -> Outcomes {
        let o = &self.outcomes;
        Outcomes {
            ok: o.ok.load(Ordering::Relaxed),
            client_error: o.client_error.load(Ordering::Relaxed),
            refused: o.refused.load(Ordering::Relaxed),
            error: o.error.load(Ordering::Relaxed),
        }
    }

    /// The runtime's busy ratio over the last sampling interval (0 before the first sample).
    pub(crate) fn tokio_busy_ratio(&self) -> f64 {
        self.runtime.busy_ratio.get()
    }

    fn render(&self, state: &AppState, queue: Option<&crate::queue_stats::Reading>) -> String {
        let _one_at_a_time = self.render_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.set_jobs(queue, state.queue_stats.failures());
        let g = &self.gauges;
        let usize_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        g.connections_open.set(usize_i64(state.connections.open()));
        g.connections_max.set(usize_i64(state.connections.max()));
        advance(&g.connections_refused, state.connections.refused());
        advance(&g.connections_reset, state.connections.reset());
        advance(&g.connections_accept_paced, state.connections.paced());
        let pacing = state.pacing.snapshot();
        advance(&g.retry_early, pacing.early_total);
        advance(&g.retry_held, pacing.held_total);
        advance(&g.body_timed_out, state.body.status().timed_out);
        let b = state.bulkhead.status();
        g.bulkhead_size.set(usize_i64(b.size));
        g.bulkhead_in_use.set(usize_i64(b.in_use));
        g.bulkhead_waiting.set(usize_i64(b.waiting));
        advance(&g.bulkhead_timeouts, b.acquire_timeouts);
        g.pool_size.set(i64::from(state.pool.size()));
        g.pool_idle.set(usize_i64(state.pool.num_idle()));
        let t = state.throttles.status();
        g.throttle_degraded.set(i64::from(t.state == "degraded"));
        advance(&g.throttle_checks, t.checks);
        advance(&g.throttle_fallback_checks, t.fallback_checks);
        advance(&g.throttle_redis_errors, t.redis_errors);
        for (kind, n) in [("tenant", t.refused.tenant), ("user", t.refused.user), ("ip", t.refused.ip)] {
            advance(&g.throttle_refused.get_or_create(&KindLabel { kind }), n);
        }
        advance(&g.throttle_refused_ahead, t.refused_ahead);
        let admission = state.admission.snapshot();
        for c in admission.classes {
            let class = ClassLabel { class: c.name.clone() };
            g.admission_limit.get_or_create(&class).set(c.limit.map_or(-1, usize_i64));
            g.admission_in_flight.get_or_create(&class).set(usize_i64(c.in_flight));
            g.admission_queue_depth.get_or_create(&class).set(usize_i64(c.queue_depth));
            advance(&g.admission_admitted.get_or_create(&class), c.admitted_total);
            g.admission_p95_ms.get_or_create(&class).set(c.p95_ms.unwrap_or(0.0));
            for (reason, n) in [
                ("queue_full", c.shed.queue_full),
                ("queue_timeout", c.shed.queue_timeout),
                ("deadline", c.shed.deadline),
            ] {
                advance(&g.admission_shed.get_or_create(&ShedLabels { class: c.name.clone(), reason }), n);
            }
        }
        breakwater_telemetry::prometheus::encode(&self.registry)
    }
}

impl Metrics {
    fn set_jobs(&self, queue: Option<&crate::queue_stats::Reading>, failures: u64) {
        let j = &self.jobs;
        advance(&j.stats_failures, failures);
        let Some(reading) = queue else {
            // Never read: say so rather than publish zeros that look like an empty queue.
            j.stats_age.set(-1.0);
            return;
        };
        let q = &reading.stats;
        j.stats_age.set(reading.age().as_secs_f64());
        // Kinds with no live job drop out of the figures: forget their series too.
        j.depth.clear();
        for k in &q.by_kind {
            for (state, n) in [("ready", k.ready), ("scheduled", k.scheduled), ("running", k.running), ("dead", k.dead)]
            {
                j.depth.get_or_create(&JobLabels { kind: k.kind.clone(), state }).set(n);
            }
        }
        j.oldest_ready_age.set(q.oldest_ready_age_seconds.unwrap_or(0.0));
        j.lease_expired.set(q.running_lease_expired);
        j.retrying.set(q.retrying);
        j.throughput.set(q.throughput_per_second);
        j.start_p99.set(q.start_latency.map_or(0.0, |l| l.p99_ms / 1000.0));
        j.dead_in_window.set(q.dead_in_window);
    }

    fn observe_runtime(&self, m: &tokio_metrics::RuntimeMetrics) {
        let r = &self.runtime;
        let usize_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        r.workers.set(usize_i64(m.workers_count));
        r.alive_tasks.set(usize_i64(m.live_tasks_count));
        r.global_queue_depth.set(usize_i64(m.global_queue_depth));
        let busy = m.total_busy_duration.as_secs_f64();
        r.busy_seconds.inc_by(busy);
        #[allow(clippy::cast_precision_loss)] // a handful of workers
        let capacity = m.elapsed.as_secs_f64() * m.workers_count as f64;
        if capacity > 0.0 {
            r.busy_ratio.set((busy / capacity).clamp(0.0, 1.0));
        }
        r.parks.inc_by(m.total_park_count);
    }

    fn observe_requests(&self, t: &tokio_metrics::TaskMetrics) {
        let r = &self.runtime;
        r.polls.inc_by(t.total_poll_count);
        r.poll_seconds.inc_by(t.total_poll_duration.as_secs_f64());
        r.slow_polls.inc_by(t.total_slow_poll_count);
        r.schedules.inc_by(t.total_scheduled_count);
        r.scheduled_seconds.inc_by(t.total_scheduled_duration.as_secs_f64());
        r.long_schedule_delays.inc_by(t.total_long_delay_count);
    }
}

fn register_jobs(registry: &mut Registry, j: &JobGauges) {
    registry.register(
        "jobs",
        "Live jobs by kind and state (ready: due now; scheduled: due later; running; dead: until pruned)",
        j.depth.clone(),
    );
    registry.register(
        "jobs_oldest_ready_age_seconds",
        "How long the oldest due job has waited (0 when none waits)",
        j.oldest_ready_age.clone(),
    );
    registry.register(
        "jobs_running_lease_expired",
        "Running jobs whose lease expired (their worker died; the rescuer returns them)",
        j.lease_expired.clone(),
    );
    registry.register("jobs_retrying", "Due jobs that already failed at least once", j.retrying.clone());
    registry.register(
        "jobs_throughput_per_second",
        "Jobs completed per second over the last minute",
        j.throughput.clone(),
    );
    registry.register(
        "jobs_start_latency_p99_seconds",
        "p99 of due-to-start latency of the jobs completed in the last minute (0 when none)",
        j.start_p99.clone(),
    );
    registry.register("jobs_dead_in_window", "Jobs that went dead in the last minute", j.dead_in_window.clone());
    registry.register(
        "jobs_stats_age_seconds",
        "Age of the job queue figures above (-1: never read)",
        j.stats_age.clone(),
    );
    registry.register("jobs_stats_failures", "Job queue figure reads that failed", j.stats_failures.clone());
}

fn register_runtime(registry: &mut Registry, r: &RuntimeSeries) {
    registry.register("tokio_workers", "Tokio worker threads", r.workers.clone());
    registry.register("tokio_alive_tasks", "Tasks alive in the tokio runtime", r.alive_tasks.clone());
    registry.register(
        "tokio_global_queue_depth",
        "Tasks waiting in the runtime's global (injection) queue",
        r.global_queue_depth.clone(),
    );
    registry.register(
        "tokio_busy_ratio",
        "Share of the workers' time spent running tasks over the last sampling interval (0..1)",
        r.busy_ratio.clone(),
    );
    registry.register("tokio_busy_seconds", "Time the workers spent running tasks, summed", r.busy_seconds.clone());
    registry.register("tokio_parks", "Times a worker parked with nothing to run", r.parks.clone());
    registry.register("tokio_request_polls", "Polls of request futures", r.polls.clone());
    registry.register("tokio_request_poll_seconds", "Time spent polling request futures", r.poll_seconds.clone());
    registry.register(
        "tokio_request_slow_polls",
        "Polls of request futures longer than 1 ms (blocking work on a worker)",
        r.slow_polls.clone(),
    );
    registry.register(
        "tokio_request_schedules",
        "Times a request future was woken and waited to be polled",
        r.schedules.clone(),
    );
    registry.register(
        "tokio_request_scheduled_seconds",
        "Time request futures waited for a worker after being woken (runtime saturation)",
        r.scheduled_seconds.clone(),
    );
    registry.register(
        "tokio_request_long_schedule_delays",
        "Wake-to-poll waits of request futures longer than 1 ms",
        r.long_schedule_delays.clone(),
    );
}

/// Samples the tokio runtime and the request futures every `every` until `stop`.
pub(crate) async fn sample_runtime(metrics: Arc<Metrics>, every: Duration, stop: CancellationToken) {
    let runtime = tokio_metrics::RuntimeMonitor::new(&tokio::runtime::Handle::current());
    let mut runtime_intervals = runtime.intervals();
    let mut request_intervals = metrics.tasks.intervals();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Some(m) = runtime_intervals.next() {
            metrics.observe_runtime(&m);
        }
        if let Some(t) = request_intervals.next() {
            metrics.observe_requests(&t);
        }
    }
}

/// Middleware (inside routing, so the matched route is known): counts and times requests, and
/// runs them under the task monitor.
pub(crate) async fn record(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response<Body> {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let response = metrics.tasks.instrument(next.run(req)).await;
    let failed = response.extensions().get::<Failure>().is_some();
    metrics.record(route, method, response.status(), failed, started.elapsed().as_secs_f64());
    response
}

/// `GET /metrics`.
pub(crate) async fn scrape(State(state): State<AppState>) -> impl IntoResponse {
    let queue = state.queue_stats.get(&state.pool).await;
    let body = state.metrics.render(&state, queue.as_ref());
    ([(header::CONTENT_TYPE, breakwater_telemetry::prometheus::CONTENT_TYPE)], body)
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse as _;

    use super::*;
    use crate::error::ApiError;

    /// The outcome the middleware gives a handler's error.
    fn outcome_of(err: ApiError) -> &'static str {
        let response = err.into_response();
        outcome(response.status(), response.extensions().get::<Failure>().is_some())
    }

    #[test]
    fn a_deliberate_refusal_is_not_an_error_and_a_failing_503_is_one() {
        assert_eq!(outcome_of(ApiError::RateLimited { kind: "user", retry_after: 1 }), "refused");
        assert_eq!(outcome_of(ApiError::DbSaturated), "refused");
        assert_eq!(outcome_of(ApiError::DbUnavailable), "error");
        assert_eq!(outcome_of(ApiError::Timeout), "error");
        assert_eq!(outcome_of(ApiError::Internal(anyhow::anyhow!("bug"))), "error");
        assert_eq!(outcome_of(ApiError::NotFound), "client_error");
        // A bare status (a layer's own refusal) is classified by its status alone.
        assert_eq!(outcome(StatusCode::SERVICE_UNAVAILABLE, false), "refused");
        assert_eq!(outcome(StatusCode::BAD_GATEWAY, false), "error");
        assert_eq!(outcome(StatusCode::OK, false), "ok");
    }
}
