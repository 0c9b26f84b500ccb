//! The ops listener (`OPS_ADDR`: `/health`, `/ready`, `/metrics`, `/v1/ops/status`), served on a
//! thread of its own with a one-thread tokio runtime.
//!
//! The balancer health-checks `/ready` here. On the request runtime a probe waits behind every
//! task queued there: in a reconnection storm thousands of accepted connections queue in the
//! worker ahead of admission, and a probe took seconds to be answered (docs/lab/history/
//! 2026-12-04-storm-where-the-time-goes.md). A balancer that times its probes out pulls a task that
//! is busy, not broken, and the storm moves to the next task. On its own thread a probe waits only
//! for the thread's share of the CPU quota.
//!
//! What runs where:
//! - `/health` and `/ready` run here. `/ready` asks PostgreSQL and Redis on connections of its
//!   own ([`Probes`], opened on first use and owned by this runtime), so a request pool busy to its
//!   last connection (the bulkhead doing its job) does not read as an unreachable database, and no
//!   connection the requests use depends on this thread.
//! - `/metrics` and `/v1/ops/status` run on the request runtime, whose pool and job-figure cache
//!   they read ([`OpsState::on_requests`]): they wait there like a request does, and a scraper's
//!   timeout is seconds.

use std::future::{Future, IntoFuture as _};
use std::io;
use std::net::SocketAddr;

use axum::response::{IntoResponse, Response};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::ApiError;
use crate::state::AppState;

/// What the ops routes share: the app's state, readiness's own connections, and the request
/// runtime, where the routes that read the request pool run.
#[derive(Clone)]
pub(crate) struct OpsState {
    pub(crate) app: AppState,
    pub(crate) probes: std::sync::Arc<Probes>,
    requests: Handle,
}

impl OpsState {
    /// Runs `work` on the request runtime and waits for its response: the pool's connections and
    /// the tasks its queries spawn stay where every other request's are.
    pub(crate) async fn on_requests<F>(&self, work: F) -> Response
    where
        F: Future<Output: IntoResponse + Send + 'static> + Send + 'static,
    {
        match self.requests.spawn(work).await {
            Ok(response) => response.into_response(),
            Err(e) => {
                ApiError::Internal(anyhow::anyhow!("an ops route on the request runtime failed: {e}")).into_response()
            }
        }
    }
}

/// Readiness's own connections: a one-connection pool to PostgreSQL and a Redis connection, both
/// opened when first asked for and both owned by the ops runtime.
pub(crate) struct Probes {
    pub(crate) database: sqlx::PgPool,
    pub(crate) redis: crate::redis::RedisPool,
}

/// `application_name` of readiness's database connection, as `pg_stat_activity` shows it.
pub const PROBE_APPLICATION_NAME: &str = "breakwater-ready";

impl Probes {
    /// Builds both lazily; must run on the ops runtime (the pool's housekeeping and the Redis
    /// connection's driver are spawned where they are built).
    fn new(app: &AppState) -> anyhow::Result<Self> {
        let options = (*app.pool.connect_options()).clone().application_name(PROBE_APPLICATION_NAME);
        let database = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(crate::routes::health::PROBE_TIMEOUT)
            .connect_lazy_with(options);
        let redis = crate::redis::pool(&app.config.redis_url, app.config.redis_cluster)?;
        Ok(Self { database, redis })
    }
}

/// The ops listener's thread.
#[derive(Debug)]
pub struct OpsListener {
    addr: SocketAddr,
    done: oneshot::Receiver<anyhow::Result<()>>,
    /// Stops the thread if the server is dropped without a shutdown (tests).
    _stop_on_drop: DropGuard,
}

/// Binds `addr` for [`OpsListener::start`] (before anything else starts, so a port in use fails
/// the start-up with nothing left running).
///
/// # Errors
/// When the address cannot be bound.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl OpsListener {
    /// Starts serving `listener` (from [`bind`]) on a new thread. The thread stops when `shutdown`
    /// is cancelled (at most the shutdown grace later) or this value is dropped.
    ///
    /// # Errors
    /// When the thread or its runtime cannot be started.
    pub(crate) fn start(
        listener: std::net::TcpListener,
        app: AppState,
        shutdown: &CancellationToken,
    ) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let requests = Handle::current();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let stop = shutdown.child_token();
        let (done_tx, done) = oneshot::channel();
        let stopping = stop.clone();
        std::thread::Builder::new().name("ops-listener".into()).spawn(move || {
            let served = runtime.block_on(serve(listener, app, requests, stopping));
            // Its connections and tasks end with it, before the caller hears it is done.
            drop(runtime);
            let _ = done_tx.send(served);
        })?;
        Ok(Self { addr, done, _stop_on_drop: stop.drop_guard() })
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for the thread to stop (after the shutdown token is cancelled).
    ///
    /// # Errors
    /// When serving failed, or the thread panicked.
    pub(crate) async fn stopped(self) -> anyhow::Result<()> {
        self.done.await.map_err(|_| anyhow::anyhow!("the ops listener's thread panicked"))?
    }
}

/// Serves the ops routes until `stop`; then lets open requests finish for at most the grace.
async fn serve(
    listener: std::net::TcpListener,
    app: AppState,
    requests: Handle,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let grace = app.config.shutdown_grace();
    let probes = std::sync::Arc::new(Probes::new(&app)?);
    let state = OpsState { app, probes: probes.clone(), requests };
    let router = crate::routes::ops_router().with_state(state);
    let server = axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned()).into_future();
    // A connection it cannot close gracefully (the ops listener has no header timeout) gets the
    // public connections' grace, then the runtime stops under it.
    let served = tokio::select! {
        served = server => served.map_err(anyhow::Error::from),
        () = async { stop.cancelled().await; tokio::time::sleep(grace).await } => Ok(()),
    };
    probes.database.close().await;
    served
}
