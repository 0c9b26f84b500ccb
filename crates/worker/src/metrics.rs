//! The worker's own figures, each described once on the list of
//! [`breakwater_telemetry::figures`] (the model the API's figures use), and their three views:
//! `/metrics` (Prometheus text) and `/health` (JSON), served on `WORKER_METRICS_ADDR` by
//! [`serve`], and the CloudWatch lines ([`crate::emf`]).
//!
//! The queue's figures (jobs by kind and state, the oldest ready job's age, throughput, jobs gone
//! dead) are read from PostgreSQL and published on the API's `/metrics`: one reading for the
//! whole fleet. These are this process's: what became of the attempts it ran, by kind; how long
//! a due job waited to be claimed and a claimed one for its task; the jobs it holds and its
//! slots; the jobs it claimed, completed, retried, buried, lost, released at shutdown, rescued
//! and pruned; and its webhook client's connections. The same library (`prometheus-client`) and
//! prefix as the API's.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use breakwater_telemetry::figures::{Figures, Kind, Lines, NOT_ALARMED, Unit};
use breakwater_telemetry::prometheus::{CONTENT_TYPE, encode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
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

/// What the worker's figures are read from, now: its totals, the jobs it holds, its slots.
/// `/health` is this, serialised.
#[derive(Debug, Clone, Serialize)]
pub struct Reading {
    /// What it did so far.
    pub counts: Counts,
    /// Jobs it holds a lease on now.
    pub held: usize,
    /// Jobs it runs at once at most (`WORKER_CONCURRENCY`).
    pub slots: usize,
}

/// The series recorded as attempts happen (by kind, which a total cannot say); the rest of the
/// figures are read from a [`Reading`] when they are published.
#[derive(Debug)]
pub(crate) struct Metrics {
    attempts: Family<OutcomeLabels, Counter>,
    claim_to_start: LatencyFamily,
    due_to_claim: LatencyFamily,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            attempts: Family::default(),
            claim_to_start: Family::new_with_constructor(latency_histogram),
            due_to_claim: Family::new_with_constructor(latency_histogram),
        }
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

    /// Every figure of the worker, read from `r` and the live series, in the order `/metrics`
    /// lists them.
    pub(crate) fn figures(&self, r: &Reading) -> Figures {
        const BY_KIND: &str = "a distribution by kind: only /metrics carries it";
        let mut out = Figures::default();
        out.live(
            Kind::Counter,
            "jobs",
            "Attempts this process ran, by kind and outcome (completed, retried, dead, lease_lost, unrecorded)",
            Box::new(self.attempts.clone()),
        )
        .no_emf("by kind: CloudWatch carries the process's totals by outcome (JobsCompleted, ...)")
        .no_ops("by kind: /health carries the process's totals by outcome");
        out.live(
            Kind::Histogram,
            "due_to_claim_seconds",
            "From a job's due time to its claim by this process, by kind",
            Box::new(self.due_to_claim.clone()),
        )
        .no_emf(NOT_ALARMED)
        .no_ops(BY_KIND);
        out.live(
            Kind::Histogram,
            "claim_to_start_seconds",
            "From a job's claim to its attempt starting in this process, by kind",
            Box::new(self.claim_to_start.clone()),
        )
        .no_emf(NOT_ALARMED)
        .no_ops(BY_KIND);
        out.gauge("held", "Jobs this process holds a lease on now (running or being completed)", r.held)
            .emf("JobsHeld", Unit::Count, Lines::Task)
            .ops("/held");
        out.setting("slots", "Jobs this process runs at once at most (WORKER_CONCURRENCY)", r.slots).ops("/slots");
        let c = &r.counts;
        let alarmed = [
            ("claimed", "Jobs this process claimed", c.claimed, "JobsClaimed"),
            ("completed", "Jobs this process ran and marked completed", c.completed, "JobsCompleted"),
            ("retried", "Failed attempts this process sent back to the queue with a backoff", c.retried, "JobsRetried"),
            ("dead", "Jobs that went dead in this process (failed for good, or out of attempts)", c.dead, "JobsDead"),
            ("released", "Jobs this process released unfinished at shutdown", c.released, "JobsReleased"),
            (
                "lease_lost",
                "Jobs whose lease this process lost while running them (expired and rescued elsewhere)",
                c.lease_lost,
                "JobsLeaseLost",
            ),
            (
                "rescued",
                "Jobs with an expired lease (a dead worker's) this process returned to the queue or buried",
                c.rescued,
                "JobsRescued",
            ),
        ];
        for (name, help, total, metric) in alarmed {
            out.counter(name, help, total).emf(metric, Unit::Count, Lines::Task).ops(&format!("/counts/{name}"));
        }
        let pruned = [
            ("pruned", "Finished jobs this process deleted after their retention", c.pruned, "/counts/pruned"),
            (
                "idempotency_keys_pruned",
                "Idempotency keys this process deleted after their retention",
                c.keys_pruned,
                "/counts/keys_pruned",
            ),
            (
                "stream_events_pruned",
                "Live-inbox events this process deleted after their retention (age or per-tenant count)",
                c.stream_events_pruned,
                "/counts/stream_events_pruned",
            ),
            (
                "webhook_connections_opened",
                "Connections the webhook client opened",
                c.client.connections_opened,
                "/counts/client/connections_opened",
            ),
            (
                "webhook_connections_reused",
                "Webhook requests sent on a pooled connection",
                c.client.reused,
                "/counts/client/reused",
            ),
        ];
        for (name, help, total, pointer) in pruned {
            out.counter(name, help, total).no_emf(NOT_ALARMED).ops(pointer);
        }
        out
    }

    /// The text exposition of `figures`.
    pub(crate) fn render(figures: Figures) -> String {
        let mut registry = Registry::with_prefix("breakwater_worker");
        registry.register_collector(Box::new(figures));
        encode(&registry)
    }
}

/// Serves `GET /metrics` and `GET /health` (200 and the worker's counts, as JSON) on `listener`
/// until `stop`.
///
/// # Errors
/// When the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, worker: Worker, stop: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router(worker)).with_graceful_shutdown(async move { stop.cancelled().await }).await
}

/// `GET /metrics` and `GET /health` of `worker`.
pub fn router(worker: Worker) -> Router {
    Router::new().route("/metrics", get(scrape)).route("/health", get(health)).with_state(worker)
}

async fn scrape(State(worker): State<Worker>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], worker.render_metrics())
}

/// `/health`'s body: the process's name and what its figures are read from.
#[derive(Serialize)]
struct Health {
    status: &'static str,
    owner: String,
    #[serde(flatten)]
    reading: Reading,
}

async fn health(State(worker): State<Worker>) -> impl IntoResponse {
    axum::Json(Health { status: "ok", owner: worker.owner().to_owned(), reading: worker.reading() })
}
