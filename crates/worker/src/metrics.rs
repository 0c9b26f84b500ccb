//! The worker's own figures on `/metrics` (Prometheus text), with `/health`, served on
//! `WORKER_METRICS_ADDR` by [`serve`].
//!
//! The queue's figures (jobs by kind and state, the oldest ready job's age, throughput, jobs gone
//! dead) are read from PostgreSQL and published on the API's `/metrics`: one reading for the
//! whole fleet. These are this process's: what became of the attempts it ran, by kind; how long
//! a due job waited to be claimed and a claimed one for its task; the jobs it holds and its
//! slots; the jobs it claimed, released at shutdown, rescued and pruned; and its webhook
//! client's connections. The same library (`prometheus-client`) and prefix as the API's.

use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use breakwater_telemetry::prometheus::{CONTENT_TYPE, advance, encode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::{Counts, Worker};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    kind: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

type LatencyFamily = Family<KindLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// What one attempt came to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    /// The handler succeeded (the completer marks the job completed).
    Completed,
    /// Failed, back in the queue with a backoff.
    Retried,
    /// Failed for good: dead.
    Dead,
    /// Failed, and the lease had moved on (another worker rescued the job).
    LeaseLost,
    /// Failed, and recording the failure failed too (the lease will expire and be rescued).
    Unrecorded,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Retried => "retried",
            Self::Dead => "dead",
            Self::LeaseLost => "lease_lost",
            Self::Unrecorded => "unrecorded",
        }
    }
}

/// The worker's series. Attempts and waits are recorded as they happen; the totals the
/// worker keeps in [`Counts`] and the jobs it holds are read at scrape time.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    attempts: Family<OutcomeLabels, Counter>,
    claim_to_start: LatencyFamily,
    due_to_claim: LatencyFamily,
    held: Gauge,
    slots: Gauge,
    claimed: Counter,
    released: Counter,
    rescued: Counter,
    pruned: Counter,
    keys_pruned: Counter,
    stream_events_pruned: Counter,
    connections_opened: Counter,
    connections_reused: Counter,
    /// Scrapes advance the totals, then encode: one at a time.
    render_lock: Mutex<()>,
}

impl Metrics {
    pub(crate) fn new(slots: usize) -> Self {
        let m = Self {
            registry: Registry::with_prefix("breakwater_worker"),
            attempts: Family::default(),
            claim_to_start: Family::new_with_constructor(latency_histogram),
            due_to_claim: Family::new_with_constructor(latency_histogram),
            held: Gauge::default(),
            slots: Gauge::default(),
            claimed: Counter::default(),
            released: Counter::default(),
            rescued: Counter::default(),
            pruned: Counter::default(),
            keys_pruned: Counter::default(),
            stream_events_pruned: Counter::default(),
            connections_opened: Counter::default(),
            connections_reused: Counter::default(),
            render_lock: Mutex::new(()),
        };
        m.slots.set(i64::try_from(slots).unwrap_or(i64::MAX));
        m.registered()
    }

    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "jobs",
            "Attempts this process ran, by kind and outcome (completed, retried, dead, lease_lost, unrecorded)",
            self.attempts.clone(),
        );
        r.register(
            "due_to_claim_seconds",
            "From a job's due time to its claim by this process, by kind",
            self.due_to_claim.clone(),
        );
        r.register(
            "claim_to_start_seconds",
            "From a job's claim to its attempt starting in this process, by kind",
            self.claim_to_start.clone(),
        );
        r.register("held", "Jobs this process holds a lease on now (running or being completed)", self.held.clone());
        r.register("slots", "Jobs this process runs at once at most (WORKER_CONCURRENCY)", self.slots.clone());
        r.register("claimed", "Jobs this process claimed", self.claimed.clone());
        r.register("released", "Jobs this process released unfinished at shutdown", self.released.clone());
        r.register(
            "rescued",
            "Jobs with an expired lease (a dead worker's) this process returned to the queue or buried",
            self.rescued.clone(),
        );
        r.register("pruned", "Finished jobs this process deleted after their retention", self.pruned.clone());
        r.register(
            "idempotency_keys_pruned",
            "Idempotency keys this process deleted after their retention",
            self.keys_pruned.clone(),
        );
        r.register(
            "stream_events_pruned",
            "Live-inbox events this process deleted after their retention (age or per-tenant count)",
            self.stream_events_pruned.clone(),
        );
        r.register(
            "webhook_connections_opened",
            "Connections the webhook client opened",
            self.connections_opened.clone(),
        );
        r.register(
            "webhook_connections_reused",
            "Webhook requests sent on a pooled connection",
            self.connections_reused.clone(),
        );
        self
    }

    /// An attempt of a `kind` job ended so.
    pub(crate) fn attempt(&self, kind: &str, outcome: Outcome) {
        self.attempts.get_or_create(&OutcomeLabels { kind: kind.to_owned(), outcome: outcome.label() }).inc();
    }

    /// An attempt started: how long the job waited after its due time to be claimed, and after
    /// its claim for a task.
    pub(crate) fn started(&self, kind: &str, due_to_claim: Duration, claim_to_start: Duration) {
        let kind = KindLabel { kind: kind.to_owned() };
        self.due_to_claim.get_or_create(&kind).observe(due_to_claim.as_secs_f64());
        self.claim_to_start.get_or_create(&kind).observe(claim_to_start.as_secs_f64());
    }

    /// The text exposition, with the totals and the jobs held that `read` returns (read under
    /// the scrape lock, so a later scrape never reads older totals).
    pub(crate) fn render(&self, read: impl FnOnce() -> (Counts, usize)) -> String {
        let _one_at_a_time = self.render_lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (counts, held) = read();
        self.held.set(i64::try_from(held).unwrap_or(i64::MAX));
        advance(&self.claimed, counts.claimed);
        advance(&self.released, counts.released);
        advance(&self.rescued, counts.rescued);
        advance(&self.pruned, counts.pruned);
        advance(&self.keys_pruned, counts.keys_pruned);
        advance(&self.stream_events_pruned, counts.stream_events_pruned);
        advance(&self.connections_opened, counts.client.connections_opened);
        advance(&self.connections_reused, counts.client.reused);
        encode(&self.registry)
    }
}

/// Serves `GET /metrics` and `GET /health` (200 and the worker's counts, as JSON) on `listener`
/// until `stop`.
///
/// # Errors
/// When the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, worker: Worker, stop: CancellationToken) -> std::io::Result<()> {
    let app = Router::new().route("/metrics", get(scrape)).route("/health", get(health)).with_state(worker);
    axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await
}

async fn scrape(State(worker): State<Worker>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], worker.render_metrics())
}

async fn health(State(worker): State<Worker>) -> impl IntoResponse {
    axum::Json(serde_json::json!({ "status": "ok", "owner": worker.owner(), "counts": worker.counts() }))
}
