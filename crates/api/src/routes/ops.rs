//! `/v1/ops/status`: every limit of every layer, in the order a request meets them, with its
//! live value. Publishing these is what lets an operator (or a customer) see which layer is the
//! bottleneck without guessing.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::ops_listener::OpsState;
use crate::state::AppState;

/// On the ops listener; it reads the request pool, so it runs on the request runtime.
pub(crate) fn router() -> Router<OpsState> {
    Router::new().route(
        "/v1/ops/status",
        get(|State(s): State<OpsState>| async move { s.on_requests(status(State(s.app.clone()))).await }),
    )
}

/// The whole picture.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct OpsStatus {
    /// `development` or `production`.
    env: &'static str,
    /// The build's version.
    version: &'static str,
    /// Seconds since the process started.
    uptime_seconds: u64,
    /// Whether shutdown has begun.
    shutting_down: bool,
    /// The limits, outermost first.
    layers: Layers,
}

/// Each layer's limits, in the order a request meets them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Layers {
    /// Socket accept and connection timeouts.
    connections: Connections,
    /// The request body: its cap and read timeout, and what they refused.
    body: crate::body::BodyStatus,
    /// Admission control: the adaptive limit, in-flight, queue, sheds, per class.
    #[schema(value_type = Object)]
    capacity: breakwater_admission::Snapshot,
    /// Refusals to callers back before their `Retry-After`: the budget, and how many waited.
    #[schema(value_type = Object)]
    retry_pacing: breakwater_admission::PacingSnapshot,
    /// Per-tenant, per-user and per-IP throttles.
    throttles: crate::throttle::ThrottleStatus,
    /// The live inbox's streams: the caps, what is open, and what was refused or resynced.
    streams: crate::stream::StreamStatus,
    /// Slots for database work (a request without one in time gets 503 `db_saturated`).
    bulkhead: crate::bulkhead::BulkheadStatus,
    /// The database pool behind the bulkhead.
    pool: Pool,
    /// PostgreSQL's own connection limit.
    postgres: Postgres,
    /// The job queue behind the API (message deliveries, erasures); null when the database has
    /// not answered in time since start.
    jobs: Option<Jobs>,
}

/// The job queue's figures, read through a cache (`JOBS_STATS_TTL_MS`) with a bounded wait
/// (`JOBS_STATS_TIMEOUT_MS`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Jobs {
    /// How old these figures are, seconds.
    age_seconds: f64,
    /// The figures.
    #[serde(flatten)]
    stats: breakwater_domain::jobs::QueueStats,
}

/// PostgreSQL's own limits.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Postgres {
    /// `max_connections`, or null when the database did not answer in time.
    max_connections: Option<i64>,
}

/// Connection-level limits.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Connections {
    /// Most open connections.
    max: usize,
    /// Connections open now.
    open: usize,
    /// What happens to a connection past `max`.
    overflow: crate::server::ConnectionOverflow,
    /// Most connections being refused at once past `max`; further ones are reset.
    refusing_max: usize,
    /// Connections answered the canned 503 past `max`, since start.
    refused: u64,
    /// Connections reset at accept (too many refusals under way), since start.
    reset: u64,
    /// Health and ops requests served on connections past `max`, since start.
    served_over_cap: u64,
    /// Most new connections accepted a second, and the burst; absent when unlimited.
    accept_rate: Option<crate::throttle::gcra::Limit>,
    /// Times the accept loop paused for `accept_rate`, since start.
    accept_paced: u64,
    /// Connections accepted and not answered once yet.
    unanswered: usize,
    /// Unanswered connections past which a new one's first request is refused; 0: no cap.
    max_unanswered: usize,
    /// First requests refused because `max_unanswered` connections were unanswered, since start.
    refused_behind: u64,
    /// The listen socket's backlog as configured (the kernel caps it at `net.core.somaxconn`).
    listen_backlog: u32,
    /// Idle keep-alive timeout, seconds (longer than the load balancer's).
    keep_alive_timeout_seconds: u64,
    /// Header read timeout, seconds.
    header_read_timeout_seconds: u64,
    /// The longest a response may go without a byte written before the connection is closed,
    /// seconds.
    write_stall_timeout_seconds: u64,
    /// Connections closed so (the client stopped reading), since start.
    write_stalls: u64,
    /// Handler timeout, seconds.
    request_timeout_seconds: u64,
}

/// The PostgreSQL pool.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Pool {
    /// Most connections.
    max: u32,
    /// Connections open now.
    size: u32,
    /// Of those, idle.
    idle: usize,
    /// Of those, in use.
    in_use: usize,
    /// How long a request waits for a connection before 503 `db_saturated`, ms.
    acquire_timeout_ms: u64,
    /// PostgreSQL `statement_timeout`, ms.
    statement_timeout_ms: u64,
    /// A connection idle at least this long is pinged before use, ms (0: every time).
    ping_after_idle_ms: u64,
}

impl Pool {
    /// The pool's limits and its connections now.
    pub(crate) fn read(state: &AppState) -> Self {
        let cfg = &state.config;
        let size = state.pool.size();
        let idle = state.pool.num_idle();
        Self {
            max: cfg.db.pool_size(),
            size,
            idle,
            in_use: (size as usize).saturating_sub(idle),
            acquire_timeout_ms: cfg.db.db_acquire_timeout_ms,
            statement_timeout_ms: cfg.db.shared.db_statement_timeout_ms,
            ping_after_idle_ms: cfg.db.shared.db_ping_after_idle_ms,
        }
    }
}

impl crate::figures::Publish for Pool {
    fn publish(&self, out: &mut crate::figures::Figures) {
        use crate::figures::NOT_ALARMED;
        out.gauge("pool_connections", "Open database connections", self.size).no_emf(NOT_ALARMED).ops("size");
        out.gauge("pool_idle_connections", "Idle database connections", self.idle).no_emf(NOT_ALARMED).ops("idle");
    }
}

/// Every limit of every layer, with live values.
pub(crate) async fn status(State(state): State<AppState>) -> Json<OpsStatus> {
    let cfg = &state.config;
    let max_connections = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        breakwater_domain::database::max_connections(&state.pool),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .map(i64::from);
    let jobs = state
        .queue_stats
        .get(&state.pool)
        .await
        .map(|r| Jobs { age_seconds: r.age().as_secs_f64(), stats: (*r.stats).clone() });
    Json(OpsStatus {
        env: cfg.app_env.as_str(),
        version: env!("CARGO_PKG_VERSION"),
        uptime_seconds: state.started_at.elapsed().as_secs(),
        shutting_down: state.is_shutting_down(),
        layers: Layers {
            connections: Connections {
                max: cfg.max_connections,
                open: state.connections.open(),
                overflow: state.connections.overflow(),
                refusing_max: state.connections.refusing_max(),
                refused: state.connections.refused(),
                reset: state.connections.reset(),
                served_over_cap: state.connections.served_over_cap(),
                accept_rate: state.connections.accept_rate(),
                accept_paced: state.connections.paced(),
                unanswered: state.connections.unanswered(),
                max_unanswered: state.connections.max_unanswered(),
                refused_behind: state.connections.refused_behind(),
                listen_backlog: cfg.listen_backlog,
                keep_alive_timeout_seconds: cfg.keep_alive_timeout_secs,
                header_read_timeout_seconds: cfg.header_read_timeout_secs,
                write_stall_timeout_seconds: cfg.write_stall_timeout_secs,
                write_stalls: state.connections.write_stalls(),
                request_timeout_seconds: cfg.request_timeout_secs,
            },
            body: state.body.status(),
            capacity: state.admission.snapshot(),
            retry_pacing: state.pacing.snapshot(),
            throttles: state.throttles.status(),
            streams: state.streams.status(),
            bulkhead: state.bulkhead.status(),
            pool: Pool::read(&state),
            postgres: Postgres { max_connections },
            jobs,
        },
    })
}
