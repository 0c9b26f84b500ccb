//! Typed configuration, parsed once at start-up from environment variables (or flags).
//!
//! Every field has a safe default that works for a local run; every limit here is published on
//! `/v1/ops/status`. `breakwater-api serve --help` lists them all with their variables.

use std::net::SocketAddr;
use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};

/// The secret used when `JWT_SECRET` is not set. The server refuses to start with it when
/// `APP_ENV=production`.
pub const DEV_JWT_SECRET: &str = "breakwater-dev-secret-change-me";

pub use breakwater_process::AppEnv;

/// The API's database settings: the group every binary shares, and the bulkhead's wait.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseConfig {
    /// `DATABASE_URL`, `DB_POOL_SIZE`, `DB_STATEMENT_TIMEOUT_MS`, `DB_PING_AFTER_IDLE_MS`.
    #[command(flatten)]
    pub shared: breakwater_process::DatabaseArgs,
    /// How long a request may wait for a connection before it is refused with 503
    /// `db_saturated`, in milliseconds.
    #[arg(long, env = "DB_ACQUIRE_TIMEOUT_MS", default_value_t = 100)]
    pub db_acquire_timeout_ms: u64,
}

impl DatabaseConfig {
    /// The pool's size when `DB_POOL_SIZE` is not set: the database bulkhead's.
    pub const DEFAULT_POOL_SIZE: u32 = 10;

    /// Connections in the pool: the database bulkhead's size.
    #[must_use]
    pub fn pool_size(&self) -> u32 {
        self.shared.pool_size(Self::DEFAULT_POOL_SIZE)
    }

    /// The pool acquire timeout.
    #[must_use]
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }

    /// Builds the pool (lazily: start-up does not fail while PostgreSQL is down; readiness says).
    ///
    /// # Errors
    /// When the URL does not parse.
    pub fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        self.shared.pool(&breakwater_process::PoolShape {
            application_name: "breakwater",
            default_size: Self::DEFAULT_POOL_SIZE,
            acquire_timeout: self.acquire_timeout(),
            session: &[],
        })
    }
}

/// On or off, for switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    /// Enabled.
    On,
    /// Disabled (for experiments).
    Off,
}

/// The throttles: the abuse ceiling, an order of magnitude above real usage. Rates are per
/// second, bursts are requests at once.
#[derive(Debug, Clone, clap::Args)]
pub struct ThrottleConfig {
    /// `on` or `off`.
    #[arg(long = "throttles", env = "THROTTLES", value_enum, default_value = "on")]
    pub enabled: Switch,
    /// Sustained requests per second per tenant (a tenant's plan may override it).
    #[arg(long = "throttle-tenant-rate", env = "THROTTLE_TENANT_RATE", default_value_t = 500.0)]
    pub tenant_rate: f64,
    /// Burst per tenant.
    #[arg(long = "throttle-tenant-burst", env = "THROTTLE_TENANT_BURST", default_value_t = 1000)]
    pub tenant_burst: u32,
    /// Sustained requests per second per user.
    #[arg(long = "throttle-user-rate", env = "THROTTLE_USER_RATE", default_value_t = 100.0)]
    pub user_rate: f64,
    /// Burst per user.
    #[arg(long = "throttle-user-burst", env = "THROTTLE_USER_BURST", default_value_t = 200)]
    pub user_burst: u32,
    /// Sustained requests per second per client IP.
    #[arg(long = "throttle-ip-rate", env = "THROTTLE_IP_RATE", default_value_t = 200.0)]
    pub ip_rate: f64,
    /// Burst per client IP.
    #[arg(long = "throttle-ip-burst", env = "THROTTLE_IP_BURST", default_value_t = 400)]
    pub ip_burst: u32,
    /// How many API tasks share the limits: while Redis is unavailable each task enforces its
    /// share (the limits divided by this), so the fleet still holds the limit.
    #[arg(long = "throttle-api-tasks", env = "THROTTLE_API_TASKS", default_value_t = 1)]
    pub api_tasks: u32,
    /// The per-call budget for Redis, in ms; slower calls count as failures. It runs on the wall
    /// clock, so it also counts this process's own pauses: under a CPU quota the kernel stops a
    /// task for the rest of each period once its share is spent (up to 75 ms of every 100 ms at
    /// 0.25 core), and a budget shorter than that pause blames Redis for it, opens the breaker and
    /// hands the limits to the in-process fallback (docs/OPERATIONS.md, layer 8).
    #[arg(long = "throttle-redis-budget-ms", env = "THROTTLE_REDIS_BUDGET_MS", default_value_t = 100)]
    pub redis_budget_ms: u64,
    /// Prefix of the throttles' Redis keys: deployments sharing one Redis use different ones.
    #[arg(long = "throttle-key-prefix", env = "THROTTLE_KEY_PREFIX", default_value = "bw")]
    pub key_prefix: String,
    /// Proxies in front of the API that append to `X-Forwarded-For` (an ALB is one). With 0
    /// the header is ignored and the socket's peer is the client.
    #[arg(long, env = "TRUSTED_PROXIES", default_value_t = 0)]
    pub trusted_proxies: usize,
}

impl ThrottleConfig {
    /// The throttles' settings.
    #[must_use]
    pub fn settings(&self) -> crate::throttle::ThrottleSettings {
        use crate::throttle::{Limit, Limits, ThrottleSettings};
        ThrottleSettings {
            enabled: self.enabled == Switch::On,
            limits: Limits {
                tenant: Limit { rate_per_sec: self.tenant_rate, burst: self.tenant_burst },
                user: Limit { rate_per_sec: self.user_rate, burst: self.user_burst },
                ip: Limit { rate_per_sec: self.ip_rate, burst: self.ip_burst },
            },
            api_tasks: self.api_tasks.max(1),
            redis_budget: Duration::from_millis(self.redis_budget_ms),
            key_prefix: self.key_prefix.clone(),
        }
    }
}

/// The live inbox's streams (`GET /v1/stream`); docs/OPERATIONS.md sizes them per task.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamConfig {
    /// Most streams open on one task; past it, 503 `streams_full`. Each holds a connection, so
    /// it must stay below `MAX_CONNECTIONS`; 0 refuses every stream [default: half of
    /// `MAX_CONNECTIONS`].
    #[arg(long = "stream-max", env = "STREAM_MAX")]
    pub max: Option<usize>,
    /// Most streams of one tenant open on one task; past it, 429 `stream_limit` [default: 512,
    /// or `STREAM_MAX` if lower].
    #[arg(long = "stream-max-per-tenant", env = "STREAM_MAX_PER_TENANT")]
    pub max_per_tenant: Option<usize>,
    /// Events a stream may fall behind (its client reading too slowly) before it is sent
    /// `resync` and closed: the size of each tenant's ring of events on the task.
    #[arg(long = "stream-buffer", env = "STREAM_BUFFER", default_value_t = 256)]
    pub buffer: usize,
    /// Most events replayed to a client that resumes with `Last-Event-ID`; one further behind
    /// gets `resync`.
    #[arg(long = "stream-replay-max", env = "STREAM_REPLAY_MAX", default_value_t = 1_000)]
    pub replay_max: u32,
    /// Seconds between heartbeats (a comment line) on an idle stream: under the load balancer's
    /// idle timeout (an ALB's is 60 s) and `KEEP_ALIVE_TIMEOUT_SECS` [default: 20, or half of
    /// `KEEP_ALIVE_TIMEOUT_SECS` if lower].
    #[arg(long = "stream-heartbeat-secs", env = "STREAM_HEARTBEAT_SECS")]
    pub heartbeat_secs: Option<u64>,
    /// The reconnect delay clients are told (`retry:`), in ms: each is told a delay between it
    /// and twice it, so a task's streams do not all come back at once.
    #[arg(long = "stream-retry-ms", env = "STREAM_RETRY_MS", default_value_t = 2_000)]
    pub retry_ms: u64,
    /// The database the stream's listener and sequencer connect to; unset: the
    /// `DATABASE_URL`'s. Set it to the database itself when `DATABASE_URL` names a transaction
    /// pooler (PgBouncer, RDS Proxy), which cannot carry `LISTEN`.
    #[arg(
        id = "stream_database_url",
        long = "stream-database-url",
        env = "STREAM_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
}

impl StreamConfig {
    /// The per-tenant cap when `STREAM_MAX_PER_TENANT` is not set (or `STREAM_MAX` if lower).
    pub const DEFAULT_MAX_PER_TENANT: usize = 512;
    /// The heartbeat interval when `STREAM_HEARTBEAT_SECS` is not set (or half of the keep-alive
    /// timeout if lower).
    pub const DEFAULT_HEARTBEAT_SECS: u64 = 20;

    /// The hub's settings, the defaults derived from the connection cap and the keep-alive
    /// timeout they must stay under.
    #[must_use]
    pub fn settings(&self, max_connections: usize, keep_alive_secs: u64) -> crate::stream::Settings {
        let max = self.max.unwrap_or(max_connections / 2);
        crate::stream::Settings {
            max,
            max_per_tenant: self.max_per_tenant.unwrap_or(Self::DEFAULT_MAX_PER_TENANT.min(max)),
            buffer: self.buffer,
            replay_max: i64::from(self.replay_max),
            heartbeat: Duration::from_secs(
                self.heartbeat_secs.unwrap_or(Self::DEFAULT_HEARTBEAT_SECS.min(keep_alive_secs / 2).max(1)),
            ),
            retry: Duration::from_millis(self.retry_ms),
        }
    }
}

/// Everything `breakwater-api serve` reads.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// `development` or `production`; required, so that a deployment that forgets it does not
    /// silently accept the public development secret (`cargo xtask dev` and the tests set
    /// `development`).
    #[arg(long, env = "APP_ENV", value_enum)]
    pub app_env: AppEnv,
    /// Address to listen on.
    #[arg(long, env = "BIND_ADDR", default_value = "0.0.0.0:8080")]
    pub bind_addr: SocketAddr,
    /// Address of the ops listener: `/ready`, `/metrics` and `/v1/ops/status` (and `/health`),
    /// never the public port. Reachable by the load balancer's health check and the metrics
    /// scraper only (docs/OPERATIONS.md, "The ops listener"). Port 0 picks a free port.
    #[arg(long, env = "OPS_ADDR", default_value = "127.0.0.1:9090")]
    pub ops_addr: SocketAddr,
    /// Redis connection string (throttles; the API serves without it); with `REDIS_CLUSTER`,
    /// a Redis Cluster's seed nodes, comma-separated.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Whether `REDIS_URL` is a Redis Cluster: then it names one or more seed nodes,
    /// comma-separated (ElastiCache with cluster mode on: its configuration endpoint).
    #[arg(long, env = "REDIS_CLUSTER", default_value_t = false, action = clap::ArgAction::Set)]
    pub redis_cluster: bool,
    /// HS256 secret for the agents' JWTs.
    #[arg(long, env = "JWT_SECRET", default_value = DEV_JWT_SECRET, hide_env_values = true, hide_default_value = true)]
    pub jwt_secret: SecretString,
    /// The longest a token may still be valid for when it is presented (its `exp` minus now),
    /// in seconds; a token with a later `exp` is refused (401).
    #[arg(long, env = "JWT_MAX_TTL_SECS", default_value_t = 86_400)]
    pub jwt_max_ttl_secs: u64,
    /// The `iss` every token must carry; unset: not checked.
    #[arg(long, env = "JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The `aud` every token must carry; unset: not checked.
    #[arg(long, env = "JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// The database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Admission control.
    #[command(flatten)]
    pub admission: crate::admission::AdmissionSettings,
    /// The throttles.
    #[command(flatten)]
    pub throttle: ThrottleConfig,
    /// Largest request body accepted, in bytes; larger ones get 413 before anything else runs.
    #[arg(long, env = "BODY_LIMIT_BYTES", default_value_t = 64 * 1024)]
    pub body_limit_bytes: usize,
    /// The longest a client may take to send a request's body, in milliseconds. The body is
    /// read whole before admission and the database bulkhead, so a stalled body holds neither;
    /// past this it is answered 408 `body_timeout` and the connection closed.
    #[arg(long, env = "BODY_READ_TIMEOUT_MS", default_value_t = 5_000)]
    pub body_read_timeout_ms: u64,
    /// Most open client connections; what happens to further ones is `CONNECTION_OVERFLOW`.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Past `MAX_CONNECTIONS`: `refuse` (accept, answer a canned 503 `load_shed` without running
    /// the app, except a `/health` request, which is served) or `backlog` (stop accepting;
    /// connections wait in the kernel's listen backlog).
    #[arg(long, env = "CONNECTION_OVERFLOW", value_enum, default_value = "refuse")]
    pub connection_overflow: crate::server::ConnectionOverflow,
    /// Most connections being refused at once past the cap; further ones are reset at accept.
    #[arg(long, env = "MAX_REFUSING_CONNECTIONS", default_value_t = 512)]
    pub max_refusing_connections: usize,
    /// Most new connections accepted a second (`0`: no limit). Past it the accept loop pauses and
    /// connections wait in the listen backlog (HAProxy's `maxconnrate`). Size it to what the
    /// task's CPU can accept and refuse with room to spare for the connections already open.
    #[arg(long, env = "MAX_ACCEPT_RATE", default_value_t = 0)]
    pub max_accept_rate: u32,
    /// The accept rate's burst: new connections accepted at once before the rate applies, the
    /// allowance refilling at the rate (`0`: a tenth of a second's worth, at least 16). A burst
    /// as deep as the listen backlog lets a one-off reconnection storm in at once while a
    /// sustained flood is still paced.
    #[arg(long, env = "MAX_ACCEPT_BURST", default_value_t = 0)]
    pub max_accept_burst: u32,
    /// Most connections accepted and not answered once yet (`0`: no limit). While that many
    /// are, a new connection's first request is answered 503 `load_shed` at once without running
    /// the app (a probe's is served), and the connection is kept for the client's next attempt;
    /// its `Retry-After` (1 to 10 s) spreads the refused clients over the time the backlog takes
    /// to serve. A reconnection storm is then refused at once instead of queueing inside the
    /// process. A connection stops counting at its first response, its end, a read that leaves
    /// its request head incomplete (a client trickling its headers), or a second after its
    /// accept.
    #[arg(long, env = "MAX_UNANSWERED_CONNECTIONS", default_value_t = 0)]
    pub max_unanswered_connections: usize,
    /// The listen socket's backlog: connections the kernel holds before the accept loop takes
    /// them (capped by `net.core.somaxconn`). Short, so a flood is refused, not queued.
    #[arg(long, env = "LISTEN_BACKLOG", default_value_t = 1024)]
    pub listen_backlog: u32,
    /// The longest an early refusal is held, in milliseconds. A refusal is early when its caller
    /// (the verified user, or the client's address without a valid token) came back before the
    /// `Retry-After` of its last refusal; it is then held until that time, on a timer, so a
    /// caller that ignores `Retry-After` gets one refusal per `Retry-After` instead of spending
    /// the CPU on refusals. 0: never hold.
    #[arg(long, env = "RETRY_HOLD_MAX_MS", default_value_t = 2_000)]
    pub retry_hold_max_ms: u64,
    /// How long an idle keep-alive connection is kept, in seconds. Must exceed the load
    /// balancer's idle timeout (an ALB's is 60 s): a server that closes first causes resets.
    #[arg(long, env = "KEEP_ALIVE_TIMEOUT_SECS", default_value_t = 75)]
    pub keep_alive_timeout_secs: u64,
    /// How long a client may take to send a request's headers, in seconds (slowloris guard).
    #[arg(long, env = "HEADER_READ_TIMEOUT_SECS", default_value_t = 10)]
    pub header_read_timeout_secs: u64,
    /// The longest a response may go without one byte accepted by the client's socket (a client
    /// that stopped reading), in seconds; past it the connection is closed. Only the connection
    /// waits for a slow reader: its database and admission slots are freed before the write.
    #[arg(long, env = "WRITE_STALL_TIMEOUT_SECS", default_value_t = 15)]
    pub write_stall_timeout_secs: u64,
    /// The longest a handler may run before the request is answered 503, in seconds.
    #[arg(long, env = "REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,
    /// On SIGTERM, how long in-flight requests get to finish, in seconds. Keep it below the
    /// container's stop timeout.
    #[arg(long, env = "SHUTDOWN_GRACE_SECS", default_value_t = 25)]
    pub shutdown_grace_secs: u64,
    /// How long the job queue's figures (on `/metrics` and `/v1/ops/status`) are reused before
    /// the database is asked again, in ms.
    #[arg(long, env = "JOBS_STATS_TTL_MS", default_value_t = 5_000)]
    pub jobs_stats_ttl_ms: u64,
    /// The longest `/metrics` or `/v1/ops/status` waits for the job queue's figures, in ms;
    /// past it the previous figures are served (with their age) while the query finishes in
    /// the background.
    #[arg(long, env = "JOBS_STATS_TIMEOUT_MS", default_value_t = 250)]
    pub jobs_stats_timeout_ms: u64,
    /// How often the tokio runtime's figures are sampled for `/metrics`, in ms.
    #[arg(long, env = "RUNTIME_METRICS_INTERVAL_MS", default_value_t = 1_000)]
    pub runtime_metrics_interval_ms: u64,
    /// The live inbox's streams (`STREAM_*`).
    #[command(flatten)]
    pub stream: StreamConfig,
    /// The CloudWatch metric lines (`METRICS_EMF_*`, shared with the worker).
    #[command(flatten)]
    pub metrics_emf: breakwater_telemetry::emf::Options,
    /// Logs and traces (`LOG_FORMAT`, `OTEL_EXPORTER_OTLP_ENDPOINT`, shared with the worker).
    #[command(flatten)]
    pub log: breakwater_telemetry::LogArgs,
}

/// Parses a [`Config`] from the environment and arguments (the binary's `serve` flags).
#[derive(Debug, clap::Parser)]
pub struct ConfigParser {
    /// The configuration.
    #[command(flatten)]
    pub config: Config,
}

impl Config {
    /// The configuration from the environment alone, defaults for the rest.
    ///
    /// # Errors
    /// When a variable does not parse.
    pub fn from_env() -> Result<Self, clap::Error> {
        use clap::Parser as _;
        ConfigParser::try_parse_from(["breakwater-api"]).map(|p| p.config)
    }

    /// The configuration from explicit arguments (over the environment), for tests.
    ///
    /// # Errors
    /// When an argument does not parse.
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::Parser as _;
        let args = std::iter::once(std::ffi::OsString::from("breakwater-api")).chain(args.into_iter().map(Into::into));
        ConfigParser::try_parse_from(args).map(|p| p.config)
    }
}

/// A configuration the server must not start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The built-in secret is public: anyone could mint tokens.
    #[error("JWT_SECRET must be set to a private value when APP_ENV=production")]
    DevSecretInProduction,
    /// An HS256 secret shorter than its hash is guessable.
    #[error("JWT_SECRET must be at least 32 bytes when APP_ENV=production")]
    ShortSecret,
    /// A throttle rate or burst is not positive.
    #[error("throttle rates and bursts must be positive")]
    Throttles,
    /// The connection-level timeouts contradict each other.
    #[error("{0}")]
    Timeouts(&'static str),
    /// The stream caps contradict each other or the connection cap.
    #[error(
        "STREAM_MAX must be below MAX_CONNECTIONS (0: no streams), STREAM_MAX_PER_TENANT between 1 and STREAM_MAX, \
         STREAM_BUFFER, STREAM_REPLAY_MAX and STREAM_RETRY_MS positive"
    )]
    Streams,
    /// The CloudWatch namespace is empty or AWS's own, or the environment is empty.
    #[error("METRICS_EMF_NAMESPACE must be set and not start with AWS/, METRICS_EMF_ENVIRONMENT must be set")]
    Metrics,
}

impl Config {
    /// Rejects configurations that are unsafe or self-contradictory.
    ///
    /// # Errors
    /// See [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.app_env == AppEnv::Production {
            if self.jwt_secret.expose_secret() == DEV_JWT_SECRET {
                return Err(ConfigError::DevSecretInProduction);
            }
            if self.jwt_secret.expose_secret().len() < 32 {
                return Err(ConfigError::ShortSecret);
            }
        }
        if self.request_timeout_secs >= self.keep_alive_timeout_secs {
            return Err(ConfigError::Timeouts("REQUEST_TIMEOUT_SECS must be below KEEP_ALIVE_TIMEOUT_SECS"));
        }
        let t = &self.throttle;
        if [t.tenant_rate, t.user_rate, t.ip_rate].iter().any(|r| !r.is_finite() || *r <= 0.0)
            || [t.tenant_burst, t.user_burst, t.ip_burst].contains(&0)
        {
            return Err(ConfigError::Throttles);
        }
        if self.header_read_timeout_secs == 0
            || self.request_timeout_secs == 0
            || self.body_read_timeout_ms == 0
            || self.write_stall_timeout_secs == 0
        {
            return Err(ConfigError::Timeouts("timeouts must be at least one second"));
        }
        if self.jobs_stats_timeout_ms == 0 || self.runtime_metrics_interval_ms < 10 {
            return Err(ConfigError::Timeouts(
                "JOBS_STATS_TIMEOUT_MS must be positive and RUNTIME_METRICS_INTERVAL_MS at least 10",
            ));
        }
        let st = self.stream_settings();
        // STREAM_MAX 0 (or a connection cap of 1) turns streams off: each is refused.
        if (st.max > 0 && st.max_per_tenant == 0)
            || st.max_per_tenant > st.max
            || (st.max > 0 && st.max >= self.max_connections)
            || st.buffer == 0
            || st.replay_max == 0
            || st.retry.is_zero()
        {
            return Err(ConfigError::Streams);
        }
        if st.heartbeat.is_zero() || st.heartbeat.as_secs() >= self.keep_alive_timeout_secs {
            return Err(ConfigError::Timeouts("STREAM_HEARTBEAT_SECS must be between 1 and KEEP_ALIVE_TIMEOUT_SECS"));
        }
        self.metrics_emf.validate().map_err(|_| ConfigError::Metrics)?;
        Ok(())
    }

    /// The streams' settings, their defaults derived from the connection cap and keep-alive.
    #[must_use]
    pub fn stream_settings(&self) -> crate::stream::Settings {
        self.stream.settings(self.max_connections, self.keep_alive_timeout_secs)
    }

    /// Idle keep-alive timeout.
    #[must_use]
    pub fn keep_alive_timeout(&self) -> Duration {
        Duration::from_secs(self.keep_alive_timeout_secs)
    }

    /// Header read timeout.
    #[must_use]
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_secs)
    }

    /// What a token must satisfy beyond its signature and expiry.
    #[must_use]
    pub fn token_policy(&self) -> crate::auth::TokenPolicy {
        crate::auth::TokenPolicy {
            max_ttl_secs: Some(self.jwt_max_ttl_secs),
            issuer: self.jwt_issuer.clone(),
            audience: self.jwt_audience.clone(),
        }
    }

    /// Write stall timeout.
    #[must_use]
    pub fn write_stall_timeout(&self) -> Duration {
        Duration::from_secs(self.write_stall_timeout_secs)
    }

    /// Body read timeout.
    #[must_use]
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }

    /// The refusal pacer's settings.
    #[must_use]
    pub fn pacing(&self) -> breakwater_admission::PacingConfig {
        breakwater_admission::PacingConfig { max_hold: Duration::from_millis(self.retry_hold_max_ms) }
    }

    /// Handler timeout.
    #[must_use]
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// How long the job queue's figures are reused.
    #[must_use]
    pub fn jobs_stats_ttl(&self) -> Duration {
        Duration::from_millis(self.jobs_stats_ttl_ms)
    }

    /// The longest wait for the job queue's figures.
    #[must_use]
    pub fn jobs_stats_timeout(&self) -> Duration {
        Duration::from_millis(self.jobs_stats_timeout_ms)
    }

    /// The tokio runtime's sampling interval.
    #[must_use]
    pub fn runtime_metrics_interval(&self) -> Duration {
        Duration::from_millis(self.runtime_metrics_interval_ms)
    }

    /// Shutdown grace period.
    #[must_use]
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_refuses_the_development_secret() {
        let cfg = Config::from_args(["--app-env", "production", "--jwt-secret", DEV_JWT_SECRET]).expect("parses");
        assert_eq!(cfg.validate(), Err(ConfigError::DevSecretInProduction));
        let cfg = Config::from_args(["--app-env", "production", "--jwt-secret", "short"]).expect("parses");
        assert_eq!(cfg.validate(), Err(ConfigError::ShortSecret));
        let cfg = Config::from_args(["--app-env", "production", "--jwt-secret", &"x".repeat(40)]).expect("parses");
        assert_eq!(cfg.validate(), Ok(()));
        let cfg = Config::from_args(["--app-env", "development", "--jwt-secret", DEV_JWT_SECRET]).expect("parses");
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn stream_defaults_follow_the_connection_cap_and_the_keep_alive_and_explicit_ones_are_checked() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["--app-env", "development"];
            args.extend_from_slice(extra);
            Config::from_args(args).expect("parses")
        };
        let st = parse(&[]).stream_settings();
        assert_eq!((st.max, st.max_per_tenant, st.heartbeat.as_secs()), (2048, 512, 20));
        // A small connection cap and a short keep-alive lower the defaults instead of refusing.
        let small =
            parse(&["--max-connections", "8", "--keep-alive-timeout-secs", "10", "--request-timeout-secs", "5"]);
        assert_eq!(small.validate(), Ok(()));
        let st = small.stream_settings();
        assert_eq!((st.max, st.max_per_tenant, st.heartbeat.as_secs()), (4, 4, 5));
        // Values said explicitly that contradict the caps are refused, with what to fix.
        assert_eq!(parse(&["--max-connections", "100", "--stream-max", "100"]).validate(), Err(ConfigError::Streams));
        // A cap of one connection leaves none for streams: they are off, not a refusal to start.
        let one = parse(&["--max-connections", "1"]);
        assert_eq!((one.validate(), one.stream_settings().max), (Ok(()), 0));
        assert_eq!(
            parse(&["--stream-max", "10", "--stream-max-per-tenant", "11"]).validate(),
            Err(ConfigError::Streams)
        );
        assert!(matches!(parse(&["--stream-heartbeat-secs", "75"]).validate(), Err(ConfigError::Timeouts(_))));
    }

    #[test]
    fn keep_alive_outlives_the_load_balancer_and_handlers() {
        let cfg = Config::from_args(["--app-env", "development", "--keep-alive-timeout-secs", "75"]).expect("parses");
        assert!(cfg.keep_alive_timeout() > Duration::from_secs(60), "an ALB idles out at 60 s");
        let cfg = Config::from_args([
            "--app-env",
            "development",
            "--keep-alive-timeout-secs",
            "20",
            "--request-timeout-secs",
            "30",
        ])
        .expect("parses");
        assert!(matches!(cfg.validate(), Err(ConfigError::Timeouts(_))));
    }

    #[test]
    fn the_cloudwatch_lines_are_off_by_default_and_need_a_namespace_of_our_own() {
        let cfg = Config::from_args(["--app-env", "development"]).expect("parses");
        assert_eq!((cfg.metrics_emf.interval(), cfg.validate()), (None, Ok(())));
        let cfg = Config::from_args(["--app-env", "development", "--metrics-emf-interval-secs", "15"]).expect("parses");
        assert_eq!(cfg.metrics_emf.interval(), Some(Duration::from_secs(15)));
        for bad in [
            ["--metrics-emf-namespace", "AWS/ECS"],
            ["--metrics-emf-namespace", " "],
            ["--metrics-emf-environment", ""],
        ] {
            let cfg = Config::from_args(["--app-env", "development"].into_iter().chain(bad)).expect("parses");
            assert_eq!(cfg.validate(), Err(ConfigError::Metrics), "{bad:?}");
        }
    }

    #[test]
    fn app_env_must_be_said() {
        let err = Config::from_args(Vec::<&str>::new()).expect_err("APP_ENV is required");
        assert!(err.to_string().contains("--app-env"), "{err}");
    }

    #[test]
    fn the_secret_never_prints() {
        let cfg =
            Config::from_args(["--app-env", "development", "--jwt-secret", "super-secret-value"]).expect("parses");
        assert!(!format!("{cfg:?}").contains("super-secret-value"));
    }
}
