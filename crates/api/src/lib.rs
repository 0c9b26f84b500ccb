//! Breakwater's HTTP API.
//!
//! The request path, outermost first (see `docs/ARCHITECTURE.md`):
//!
//! ```text
//! socket accept (connection cap, header-read timeout, idle keep-alive timeout)   server/
//!   -> body read whole: cap (413), read timeout (408), before anything is held    body.rs
//!   -> token verified once (its tenant keys admission; forged: one anonymous key)  auth.rs
//!   -> refusals to callers back before their Retry-After paced     breakwater_admission
//!   -> a bucket that refused lets one through per interval; the rest 429 here  throttle/ahead.rs
//!   -> admission control (adaptive limit, bounded queue, 503 + Retry-After)       admission.rs
//!   -> request id + trace span (named by the matched route)                       here
//!   -> handler timeout                                                            here
//!   -> auth (JWT) -> throttles (tenant/user/IP, Redis GCRA) -> 429              throttle_layer.rs
//!   -> database bulkhead (slot or 503 db_saturated)                              bulkhead.rs
//!   -> handler -> domain -> PostgreSQL                                           routes/
//! ```
//!
//! Architecture invariant: handlers hold no SQL; they parse, call `breakwater_domain`, and
//! render. Every failure is an [`error::ApiError`] rendered as the typed envelope.

pub mod admission;
pub mod auth;
pub mod body;
pub mod bulkhead;
pub mod config;
pub mod cursor_seal;
pub mod emf;
pub mod error;
pub mod extract;
pub mod figures;
pub mod metrics;
pub mod openapi;
pub mod ops_listener;
pub mod permissions;
pub mod queue_stats;
pub mod redis;
mod routes;
pub mod server;
pub mod state;
pub mod stream;
pub mod telemetry;
pub mod throttle;
pub mod throttle_layer;
pub mod views;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, Response};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::{Layer as _, ServiceExt as _};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi as _;

pub use config::Config;
use error::ApiError;
pub use state::AppState;

/// The request id header: honoured when the client (or load balancer) sends one, generated
/// otherwise, and echoed on the response.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Routes polled by machines, traced at debug level only and not counted as requests.
pub(crate) const PROBES: [&str; 1] = ["/health"];

/// The routes with their inner layers (request id, trace, timeout), state applied.
pub fn router(state: AppState) -> Router {
    let body_limit = state.config.body_limit_bytes;
    routes::router(&state)
        .route("/openapi.json", axum::routing::get(openapi_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), request_timeout))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.metrics.clone(), metrics::record))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    // Named by the matched route, never the raw URI: no ids or personal data in spans.
                    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str);
                    let request_id = req.headers().get(REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
                    macro_rules! request_span {
                        ($level:expr) => {
                            tracing::span!(
                                $level,
                                "request",
                                method = %req.method(),
                                route,
                                request_id,
                                // OpenTelemetry: the span's name, kind and HTTP attributes.
                                otel.name = %format_args!("{} {route}", req.method()),
                                otel.kind = "server",
                                http.request.method = %req.method(),
                                http.route = route,
                                http.response.status_code = tracing::field::Empty,
                            )
                        };
                    }
                    // Probes and scrapes (every few seconds, from the load balancer and
                    // Prometheus) at debug: under the default filter they neither log nor
                    // start a trace each.
                    let span = if PROBES.contains(&route) {
                        request_span!(tracing::Level::DEBUG)
                    } else {
                        request_span!(tracing::Level::INFO)
                    };
                    // A caller's W3C `traceparent` makes this request part of its trace.
                    breakwater_telemetry::set_parent_from_headers(&span, req.headers());
                    span
                })
                .on_request(())
                .on_response(|res: &Response<Body>, latency: Duration, span: &tracing::Span| {
                    span.record("http.response.status_code", res.status().as_u16());
                    tracing::debug!(status = res.status().as_u16(), ?latency, "finished processing request");
                })
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn_with_state(state.clone(), close_when_draining))
        .with_state(state)
}

/// Once shutdown has begun, every HTTP/1 response says `Connection: close`, so clients stop
/// reusing their connections during the drain instead of sending a request on an idle one just
/// as the server closes it (the keep-alive race `cargo xtask chaos` measured at SIGTERM).
async fn close_when_draining(State(state): State<AppState>, req: Request, next: Next) -> Response<Body> {
    let http1 = req.version() < axum::http::Version::HTTP_2;
    let mut response = next.run(req).await;
    if http1 && state.is_shutting_down() {
        response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    response
}

/// The whole app as served: the body layer, then admission control, outside the routes. An
/// oversized request is refused before anything else runs; a body is read whole before the
/// request can hold an admission or database slot, so a client that stalls its body waits on
/// its own connection only; an over-capacity request is refused before any routing, auth or
/// database work.
pub fn app(
    state: AppState,
) -> impl tower::Service<Request, Response = Response<Body>, Error = Infallible, Future: Send> + Clone + Send + Sync + 'static
{
    let body = body::BodyLayer(state.body.clone());
    let keys = state.jwt.clone();
    let admission = state.admission.layer(admission::classify::<Body>(state.classes), admission::tenant_key::<Body>);
    let pacing = state.pacing.layer(admission::caller_key::<Body>(state.config.throttle.trusted_proxies));
    let throttles = state.throttles.clone();
    let trusted_proxies = state.config.throttle.trusted_proxies;
    let admitted = admission.layer(router(state).into_service::<Body>()).map_response(|r| r.map(Body::new));
    let throttled = throttle::ahead::ThrottledAhead::new(admitted, throttles, trusted_proxies);
    let verified = pacing.layer(throttled).map_request(move |req| auth::verify_request(&keys, req));
    body.layer(verified)
}

async fn request_timeout(State(state): State<AppState>, req: Request, next: Next) -> Response<Body> {
    match tokio::time::timeout(state.config.request_timeout(), next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn openapi_json() -> impl IntoResponse {
    axum::Json(openapi::ApiDoc::openapi())
}

/// A running server (for tests and the binary).
#[derive(Debug)]
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The ops listener's address (`/ready`, `/metrics`, `/v1/ops/status`).
    pub ops_addr: SocketAddr,
    /// Its state (pools, flags).
    pub state: AppState,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    ops: ops_listener::OpsListener,
    /// The CloudWatch lines' writer, when configured.
    emf: Option<breakwater_telemetry::emf::Publishing>,
}

impl Running {
    /// Begins a graceful shutdown: readiness turns false at once; after `drain_delay` the
    /// listener closes and in-flight requests finish; then the pools close.
    ///
    /// # Errors
    /// When the server task failed.
    pub async fn shutdown(self, drain_delay: Duration) -> anyhow::Result<()> {
        self.state.shutting_down.store(true, Ordering::Relaxed);
        // Streams end now, each with a jittered reconnect hint, while the balancer still sends
        // their reconnections elsewhere; new ones are refused.
        self.state.streams.close();
        tokio::time::sleep(drain_delay).await;
        self.shutdown.cancel();
        let served = self.task.await;
        // The ops listener closes with the public one, after the drain delay in which `/ready`
        // has said 503, within the same grace.
        let ops = self.ops.stopped().await;
        // The last lines once the server has drained, so its final requests are counted.
        if let Some(emf) = self.emf {
            emf.finish().await;
        }
        served??;
        ops?;
        self.state.pool.close().await;
        Ok(())
    }
}

/// Binds `config.bind_addr` (or the given listener) and serves in the background.
///
/// # Errors
/// When the configuration is refused or the pools cannot be built.
pub async fn start(config: Config, listener: Option<TcpListener>) -> anyhow::Result<Running> {
    let pool = config.db.pool()?;
    start_with_pool(config, pool, listener).await
}

/// As [`start`], on a pool the caller built (tests use a fresh database per test).
///
/// # Errors
/// As [`start`].
pub async fn start_with_pool(
    config: Config,
    pool: sqlx::PgPool,
    listener: Option<TcpListener>,
) -> anyhow::Result<Running> {
    config.validate()?;
    let listener = match listener {
        Some(l) => l,
        None => server::bind(config.bind_addr, config.listen_backlog)?,
    };
    let addr = listener.local_addr()?;
    let ops_socket = ops_listener::bind(config.ops_addr)?;
    let redis = redis::pool(&config.redis_url, config.redis_cluster)?;
    let state = AppState::new(config, pool, redis)?;
    throttle::spawn_override_refresh(state.throttles.clone(), state.pool.clone(), Duration::from_secs(30));
    let options = server::ServeOptions {
        keep_alive_timeout: state.config.keep_alive_timeout(),
        header_read_timeout: state.config.header_read_timeout(),
        shutdown_grace: state.config.shutdown_grace(),
        write_stall_timeout: state.config.write_stall_timeout(),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(metrics::sample_runtime(
        state.metrics.clone(),
        state.config.runtime_metrics_interval(),
        shutdown.clone(),
    ));
    let listening = stream::listener::connect_options(state.config.stream.database_url.as_deref(), &state.pool)?;
    tokio::spawn(stream::listener::run(state.streams.clone(), listening, shutdown.clone()));
    let emf = state.config.metrics_emf.start(emf::ApiSource::new(state.clone()));
    let task = tokio::spawn(server::serve(
        listener,
        app(state.clone()).map_err(|e: Infallible| match e {}),
        state.connections.clone(),
        options,
        shutdown.clone(),
    ));
    let ops = ops_listener::OpsListener::start(ops_socket, state.clone(), &shutdown)?;
    let ops_addr = ops.addr();
    Ok(Running { addr, ops_addr, state, shutdown, task, ops, emf })
}

/// Serves until SIGTERM/SIGINT, then drains.
///
/// # Errors
/// As [`start`].
pub async fn run(config: Config) -> anyhow::Result<()> {
    let running = start(config, None).await?;
    tracing::info!(addr = %running.addr, ops_addr = %running.ops_addr, "breakwater-api listening");
    breakwater_process::shutdown_signal().await;
    tracing::info!("shutdown signal received: readiness off, draining");
    // Give load balancers a moment to see readiness fail before the listener closes.
    let drain_delay = if running.state.config.app_env == config::AppEnv::Production {
        Duration::from_secs(5)
    } else {
        Duration::ZERO
    };
    running.shutdown(drain_delay).await?;
    tracing::info!("stopped");
    Ok(())
}
