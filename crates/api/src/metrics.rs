//! `/metrics`: Prometheus text exposition of the app's figures ([`crate::figures`]), read at
//! scrape time; and the figures this module keeps itself: request counts and latency histograms
//! by matched route and outcome (`ok`, `client_error`, `refused` for a deliberate 429/503,
//! `error` for a 500 and the 503s that are failures), and the tokio runtime's health, sampled
//! every `RUNTIME_METRICS_INTERVAL_MS` by a task that ends with the app ([`sample_runtime`]).
//! The figures belong to the app (no global recorder), so several apps in one process (tests)
//! do not mix them.
//!
//! Runtime health uses what stable tokio offers (no `--cfg tokio_unstable`): the runtime's
//! workers, live tasks, global queue depth, busy time and parks, and, for the request futures
//! themselves (a `TaskMonitor` around each), their polls, poll time, slow polls and the time
//! they waited to be polled after being woken (the sign of a saturated runtime). Per-worker
//! poll counts, poll-time histograms and local queue depths need `tokio_unstable`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

use crate::error::Failure;
use crate::figures::{Figures, Kind, Lines, NOT_ALARMED, Unit};
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

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~8 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// The figures the app keeps itself: requests and the runtime.
#[derive(Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    runtime: RuntimeSeries,
    /// Wraps every request future: its polls and scheduling delays.
    tasks: tokio_metrics::TaskMonitor,
    /// Routed requests by outcome since start, probes and scrapes left out, for CloudWatch's
    /// `Requests`, `ServerErrors` and `Refused` (the families above cannot be summed without
    /// encoding them).
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
    /// No request or runtime figure yet.
    #[must_use]
    pub fn new() -> Self {
        Self {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            runtime: RuntimeSeries::default(),
            tasks: {
                let mut b = tokio_metrics::TaskMonitor::builder();
                b.with_slow_poll_threshold(SLOW).with_long_delay_threshold(SLOW);
                b.build()
            },
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

    /// The requests' figures: by route (the middleware's families), and by outcome for
    /// CloudWatch.
    pub(crate) fn publish_requests(&self, out: &mut Figures) {
        const BY_ROUTE: &str = "per route, CloudWatch has the load balancer's own request count and \
            TargetResponseTime (the p99 alarm reads it); routed_requests gives the totals by outcome";
        const NO_OPS: &str =
            "a rate, read from /metrics or CloudWatch: /v1/ops/status holds each layer's limits and state";
        out.live(
            Kind::Counter,
            "http_requests",
            "HTTP requests by matched route, method and outcome",
            Box::new(self.requests.clone()),
        )
        .no_emf(BY_ROUTE)
        .no_ops(NO_OPS);
        out.live(
            Kind::Histogram,
            "http_request_duration_seconds",
            "Handler latency by matched route, method and outcome",
            Box::new(self.latency.clone()),
        )
        .no_emf(BY_ROUTE)
        .no_ops(NO_OPS);
        let o = self.outcomes();
        out.figure(Kind::Counter, "routed_requests", "Routed requests by outcome, probes and scrapes left out")
            .series(&[("outcome", "ok")], o.ok)
            .series(&[("outcome", "client_error")], o.client_error)
            .series(&[("outcome", "refused")], o.refused)
            .series(&[("outcome", "error")], o.error)
            .no_prometheus("http_requests has them, by route and with the probes")
            .emf("Requests", Unit::Count, Lines::Task)
            .emf_only("ServerErrors", "outcome", "error")
            .emf_only("Refused", "outcome", "refused")
            .no_ops(NO_OPS);
    }

    /// The runtime's figures, as last sampled.
    pub(crate) fn publish_runtime(&self, out: &mut Figures) {
        const NO_OPS: &str = "the process's health, not a layer's: /v1/ops/status holds the layers";
        let r = &self.runtime;
        out.gauge("tokio_workers", "Tokio worker threads", r.workers.get()).no_emf(NOT_ALARMED).no_ops(NO_OPS);
        out.gauge("tokio_alive_tasks", "Tasks alive in the tokio runtime", r.alive_tasks.get())
            .no_emf(NOT_ALARMED)
            .no_ops(NO_OPS);
        out.gauge(
            "tokio_global_queue_depth",
            "Tasks waiting in the runtime's global (injection) queue",
            r.global_queue_depth.get(),
        )
        .no_emf(NOT_ALARMED)
        .no_ops(NO_OPS);
        out.gauge(
            "tokio_busy_ratio",
            "Share of the workers' time spent running tasks over the last sampling interval (0..1)",
            r.busy_ratio.get(),
        )
        .emf("TokioBusyRatio", Unit::None, Lines::Task)
        .no_ops(NO_OPS);
        let counters: [(&'static str, &'static str, crate::figures::Number); 8] = [
            ("tokio_busy_seconds", "Time the workers spent running tasks, summed", r.busy_seconds.get().into()),
            ("tokio_parks", "Times a worker parked with nothing to run", r.parks.get().into()),
            ("tokio_request_polls", "Polls of request futures", r.polls.get().into()),
            ("tokio_request_poll_seconds", "Time spent polling request futures", r.poll_seconds.get().into()),
            (
                "tokio_request_slow_polls",
                "Polls of request futures longer than 1 ms (blocking work on a worker)",
                r.slow_polls.get().into(),
            ),
            (
                "tokio_request_schedules",
                "Times a request future was woken and waited to be polled",
                r.schedules.get().into(),
            ),
            (
                "tokio_request_scheduled_seconds",
                "Time request futures waited for a worker after being woken (runtime saturation)",
                r.scheduled_seconds.get().into(),
            ),
            (
                "tokio_request_long_schedule_delays",
                "Wake-to-poll waits of request futures longer than 1 ms",
                r.long_schedule_delays.get().into(),
            ),
        ];
        for (name, help, total) in counters {
            out.figure(Kind::Counter, name, help).series(&[], total).no_emf(NOT_ALARMED).no_ops(NO_OPS);
        }
    }

    /// The figures as Prometheus text.
    fn render(figures: Figures) -> String {
        let mut registry = Registry::with_prefix("breakwater");
        registry.register_collector(Box::new(figures));
        breakwater_telemetry::prometheus::encode(&registry)
    }
}

impl Metrics {
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
    let body = Metrics::render(crate::figures::read(&state, queue));
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
