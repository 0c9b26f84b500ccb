//! Liveness (public, on both listeners) and readiness (the ops listener only). Neither passes
//! admission control or the throttles: a probe must report the truth however loaded the process
//! is.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::ops_listener::OpsState;

/// `/health`: on the public listener and the ops listener (it reads no state, so either's).
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/health", get(health))
}

/// `/ready`: on the ops listener only (it asks PostgreSQL and Redis, on its own connections).
pub(crate) fn ready_router() -> Router<OpsState> {
    Router::new().route("/ready", get(ready))
}

/// Liveness answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    status: &'static str,
}

/// Liveness: the process is up and its runtime answers. Touches nothing else.
#[utoipa::path(get, path = "/health", tag = "ops", responses((status = 200, body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Readiness {
    /// `ready` or `not_ready`.
    status: &'static str,
    /// `ok`, `unreachable`, or `shutting_down`.
    database: &'static str,
    /// `ok` or `unreachable`: reported, not required (throttles fall back to in-process).
    redis: &'static str,
}

/// How long readiness waits for each dependency.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Readiness: PostgreSQL answers and the process is not shutting down. Redis is reported but
/// not required: without it the throttles run in-process and the API still serves safely. Both
/// are asked on readiness's own connections (`ops_listener::Probes`): a request pool busy to its
/// last connection is the bulkhead at work, not a database that does not answer.
pub(crate) async fn ready(State(state): State<OpsState>) -> (StatusCode, Json<Readiness>) {
    let probes = &state.probes;
    let redis = if crate::redis::ping(&probes.redis, PROBE_TIMEOUT).await { "ok" } else { "unreachable" };
    let database = if state.app.is_shutting_down() {
        "shutting_down"
    } else {
        match tokio::time::timeout(PROBE_TIMEOUT, breakwater_domain::database::ping(&probes.database)).await {
            Ok(Ok(_)) => "ok",
            _ => "unreachable",
        }
    };
    let ok = database == "ok";
    let status = if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Readiness { status: if ok { "ready" } else { "not_ready" }, database, redis }))
}
