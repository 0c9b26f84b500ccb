//! The one cheaply cloneable state every handler receives.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::auth::JwtKeys;
use crate::bulkhead::Bulkhead;
use crate::config::Config;
use crate::redis::RedisPool;
use crate::server::Connections;
use crate::throttle::Throttles;

/// Pools, keys and configuration, shared by every request: one `Arc` around [`Shared`], so the
/// clone that each layer and handler takes per request (axum's `State`) is one reference count,
/// not one per field.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct Shared {
    /// The PostgreSQL pool.
    pub pool: sqlx::PgPool,
    /// The Redis pool (throttles; optional at run time).
    pub redis: RedisPool,
    /// JWT keys derived from the secret.
    pub jwt: Arc<JwtKeys>,
    /// Seals the lists' cursors, under a key derived from the same secret.
    pub cursors: crate::cursor_seal::CursorSeal,
    /// The configuration the process started with.
    pub config: Arc<Config>,
    /// Set when shutdown begins: readiness turns false so load balancers stop sending.
    pub shutting_down: Arc<AtomicBool>,
    /// Admission control (shared by every connection).
    pub admission: breakwater_admission::Admission,
    /// Paces refusals to callers that came back before their `Retry-After`.
    pub pacing: breakwater_admission::RetryPacing,
    /// Its route classes.
    pub classes: crate::admission::Classes,
    /// The request body's cap and read timeout, with what they refused.
    pub body: Arc<crate::body::BodyIntake>,
    /// The database bulkhead.
    pub bulkhead: Arc<Bulkhead>,
    /// The tenant/user/IP throttles.
    pub throttles: Arc<Throttles>,
    /// Prometheus metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Open client connections, counted by the server.
    pub connections: Arc<Connections>,
    /// The live inbox's streams open on this task.
    pub streams: Arc<crate::stream::Hub>,
    /// The job queue's figures, cached.
    pub queue_stats: Arc<crate::queue_stats::QueueStatsCache>,
    /// When the process started.
    pub started_at: Instant,
}

impl AppState {
    /// Builds the state from a configuration and the pools.
    ///
    /// # Errors
    /// When the admission settings contradict each other.
    pub fn new(config: Config, pool: sqlx::PgPool, redis: RedisPool) -> anyhow::Result<Self> {
        let (admission, classes) = config.admission.build()?;
        Ok(Self(Arc::new(Shared {
            admission,
            pacing: breakwater_admission::RetryPacing::new(config.pacing()),
            classes,
            body: Arc::new(crate::body::BodyIntake::new(config.body_limit_bytes, config.body_read_timeout())),
            bulkhead: Arc::new(Bulkhead::new(config.db.pool_size() as usize, config.db.acquire_timeout())),
            throttles: Arc::new(Throttles::new(config.throttle.settings(), redis.clone())),
            pool,
            redis,
            connections: Arc::new(
                Connections::new(config.max_connections, config.connection_overflow, config.max_refusing_connections)
                    .with_accept_rate(config.max_accept_rate, config.max_accept_burst)
                    .with_max_unanswered(config.max_unanswered_connections),
            ),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            streams: Arc::new(crate::stream::Hub::new(config.stream_settings())),
            queue_stats: Arc::new(crate::queue_stats::QueueStatsCache::new(
                config.jobs_stats_ttl(),
                config.jobs_stats_timeout(),
            )),
            started_at: Instant::now(),
            cursors: crate::cursor_seal::CursorSeal::from_secret(&config.jwt_secret),
            jwt: Arc::new(JwtKeys::with_policy(&config.jwt_secret, &config.token_policy())),
            config: Arc::new(config),
            shutting_down: Arc::new(AtomicBool::new(false)),
        })))
    }

    /// Whether shutdown has begun.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}
