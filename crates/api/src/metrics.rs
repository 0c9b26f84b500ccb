//! `/metrics`: Prometheus text exposition.
//!
//! Request counts and latency histograms by matched route and outcome (`ok`, `client_error`,
//! `refused` for a deliberate 429/503, `error`), and every live figure the layers publish on
//! `/v1/ops/status`, read at scrape time. The registry belongs to the app (no global recorder),
//! so several apps in one process (tests) do not mix their figures.

use std::sync::Arc;
use std::time::Instant;

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

use crate::state::AppState;

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
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    gauges: LiveGauges,
}

#[derive(Debug, Default)]
struct LiveGauges {
    connections_open: Gauge,
    connections_max: Gauge,
    connections_refused: Gauge,
    connections_reset: Gauge,
    bulkhead_size: Gauge,
    bulkhead_in_use: Gauge,
    bulkhead_waiting: Gauge,
    bulkhead_timeouts: Gauge,
    pool_size: Gauge,
    pool_idle: Gauge,
    throttle_degraded: Gauge,
    throttle_checks: Gauge,
    throttle_fallback_checks: Gauge,
    throttle_redis_errors: Gauge,
    throttle_refused: Family<KindLabel, Gauge>,
    admission_limit: Family<ClassLabel, Gauge>,
    admission_in_flight: Family<ClassLabel, Gauge>,
    admission_queue_depth: Family<ClassLabel, Gauge>,
    admission_admitted: Family<ClassLabel, Gauge>,
    admission_shed: Family<ShedLabels, Gauge>,
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

/// Classifies a status for the `outcome` label: a deliberate refusal is not an error.
#[must_use]
pub fn outcome(status: StatusCode) -> &'static str {
    match status.as_u16() {
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
        let gauges = LiveGauges::default();
        let g = &gauges;
        registry.register("connections_open", "Open client connections", g.connections_open.clone());
        registry.register("connections_max", "Connection cap", g.connections_max.clone());
        registry.register(
            "connections_refused",
            "Connections answered 503 load_shed at accept (over the cap) since start",
            g.connections_refused.clone(),
        );
        registry.register(
            "connections_reset",
            "Connections reset at accept (over the cap, refusals saturated) since start",
            g.connections_reset.clone(),
        );
        registry.register("bulkhead_slots", "Database bulkhead slots", g.bulkhead_size.clone());
        registry.register("bulkhead_in_use", "Database bulkhead slots held", g.bulkhead_in_use.clone());
        registry.register("bulkhead_waiting", "Requests waiting for a database slot", g.bulkhead_waiting.clone());
        registry.register(
            "bulkhead_acquire_timeouts",
            "Requests refused with db_saturated since start",
            g.bulkhead_timeouts.clone(),
        );
        registry.register("pool_connections", "Open database connections", g.pool_size.clone());
        registry.register("pool_idle_connections", "Idle database connections", g.pool_idle.clone());
        registry.register(
            "throttle_degraded",
            "1 while throttles run in process (Redis unavailable)",
            g.throttle_degraded.clone(),
        );
        registry.register(
            "throttle_checks",
            "Requests checked by the throttles since start",
            g.throttle_checks.clone(),
        );
        registry.register(
            "throttle_fallback_checks",
            "Requests checked in process since start",
            g.throttle_fallback_checks.clone(),
        );
        registry.register(
            "throttle_redis_errors",
            "Redis throttle calls failed or over budget",
            g.throttle_redis_errors.clone(),
        );
        registry.register(
            "throttle_refused",
            "Requests refused by throttle bucket kind since start",
            g.throttle_refused.clone(),
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
        registry.register("admission_admitted", "Requests admitted since start", g.admission_admitted.clone());
        registry.register(
            "admission_shed",
            "Requests refused by admission since start, by reason",
            g.admission_shed.clone(),
        );
        registry.register("admission_p95_ms", "p95 latency of admitted requests, ms", g.admission_p95_ms.clone());
        Self { registry, requests, latency, gauges }
    }

    fn record(&self, route: String, method: String, status: StatusCode, seconds: f64) {
        let labels = RequestLabels { route, method, outcome: outcome(status) };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    fn render(&self, state: &AppState) -> String {
        let g = &self.gauges;
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let usize_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        g.connections_open.set(usize_i64(state.connections.open()));
        g.connections_max.set(usize_i64(state.connections.max()));
        g.connections_refused.set(to_i64(state.connections.refused()));
        g.connections_reset.set(to_i64(state.connections.reset()));
        let b = state.bulkhead.status();
        g.bulkhead_size.set(usize_i64(b.size));
        g.bulkhead_in_use.set(usize_i64(b.in_use));
        g.bulkhead_waiting.set(usize_i64(b.waiting));
        g.bulkhead_timeouts.set(to_i64(b.acquire_timeouts));
        g.pool_size.set(i64::from(state.pool.size()));
        g.pool_idle.set(usize_i64(state.pool.num_idle()));
        let t = state.throttles.status();
        g.throttle_degraded.set(i64::from(t.state == "degraded"));
        g.throttle_checks.set(to_i64(t.checks));
        g.throttle_fallback_checks.set(to_i64(t.fallback_checks));
        g.throttle_redis_errors.set(to_i64(t.redis_errors));
        for (kind, n) in [("tenant", t.refused.tenant), ("user", t.refused.user), ("ip", t.refused.ip)] {
            g.throttle_refused.get_or_create(&KindLabel { kind }).set(to_i64(n));
        }
        for c in state.admission.snapshot().classes {
            let class = ClassLabel { class: c.name.clone() };
            g.admission_limit.get_or_create(&class).set(c.limit.map_or(-1, usize_i64));
            g.admission_in_flight.get_or_create(&class).set(usize_i64(c.in_flight));
            g.admission_queue_depth.get_or_create(&class).set(usize_i64(c.queue_depth));
            g.admission_admitted.get_or_create(&class).set(to_i64(c.admitted_total));
            g.admission_p95_ms.get_or_create(&class).set(c.p95_ms.unwrap_or(0.0));
            for (reason, n) in [
                ("queue_full", c.shed.queue_full),
                ("queue_timeout", c.shed.queue_timeout),
                ("deadline", c.shed.deadline),
            ] {
                g.admission_shed.get_or_create(&ShedLabels { class: c.name.clone(), reason }).set(to_i64(n));
            }
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Middleware (inside routing, so the matched route is known): counts and times requests.
pub(crate) async fn record(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response<Body> {
    let route = req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(req).await;
    metrics.record(route, method, response.status(), started.elapsed().as_secs_f64());
    response
}

/// `GET /metrics`.
pub(crate) async fn scrape(State(state): State<AppState>) -> impl IntoResponse {
    let body = state.metrics.render(&state);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}
