//! What every Breakwater process shares, written once: where it runs ([`AppEnv`]), its database
//! settings and pool ([`DatabaseArgs`]), and how it is told to stop ([`shutdown_signal`]).
//!
//! The settings are clap argument groups each binary flattens into its own, so a variable means
//! the same thing, with the same default, in the API, the worker and the tools. The logging and
//! telemetry group lives with the telemetry it sets up (`breakwater_telemetry::LogArgs`).

use std::time::Duration;

/// Where the process runs; production refuses unsafe settings (the development JWT secret in the
/// API, webhooks to private addresses in the worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AppEnv {
    /// A laptop or CI.
    Development,
    /// Anything real.
    Production,
}

impl AppEnv {
    /// The name, as `APP_ENV` spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Development => "development",
            Self::Production => "production",
        }
    }
}

/// The database settings every binary that talks to PostgreSQL reads.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection string.
    #[arg(long, env = "DATABASE_URL", default_value = breakwater_domain::DEFAULT_DATABASE_URL, global = true)]
    pub database_url: String,
    /// Connections in the pool (default: the binary's own; the API's is the database bulkhead).
    #[arg(long, env = "DB_POOL_SIZE")]
    pub db_pool_size: Option<u32>,
    /// PostgreSQL `statement_timeout` for every connection, in milliseconds.
    #[arg(long, env = "DB_STATEMENT_TIMEOUT_MS", default_value_t = 5_000)]
    pub db_statement_timeout_ms: u64,
    /// A pooled connection idle at least this long is pinged (one round trip) before it is handed
    /// out, in milliseconds; one used more recently is handed out as it is (sqlx pings each
    /// connection as it goes back to the pool anyway). 0 pings on every acquire, sqlx's default.
    #[arg(long, env = "DB_PING_AFTER_IDLE_MS", default_value_t = breakwater_domain::PING_AFTER_IDLE_MS)]
    pub db_ping_after_idle_ms: u64,
}

/// What a binary decides about its own pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolShape<'a> {
    /// `application_name`, as `pg_stat_activity` shows it.
    pub application_name: &'a str,
    /// The pool's size when `DB_POOL_SIZE` is not set.
    pub default_size: u32,
    /// How long a checkout may wait for a connection.
    pub acquire_timeout: Duration,
    /// Further session settings (`SET` at connect), e.g. `synchronous_commit`.
    pub session: &'a [(&'a str, &'a str)],
}

impl DatabaseArgs {
    /// The pool's size: `DB_POOL_SIZE`, or the binary's default.
    #[must_use]
    pub fn pool_size(&self, default_size: u32) -> u32 {
        self.db_pool_size.unwrap_or(default_size)
    }

    /// Builds the pool lazily (start-up does not fail while PostgreSQL is down; readiness says):
    /// the statement timeout and the binary's session settings on every connection, slow
    /// statements logged, a connection pinged before use only after it sat idle.
    ///
    /// # Errors
    /// When the URL does not parse.
    pub fn pool(&self, shape: &PoolShape<'_>) -> anyhow::Result<sqlx::PgPool> {
        use sqlx::ConnectOptions as _;
        let options: sqlx::postgres::PgConnectOptions = self.database_url.parse()?;
        let timeout = self.db_statement_timeout_ms.to_string();
        let session = std::iter::once(("statement_timeout", timeout.as_str())).chain(shape.session.iter().copied());
        let options = options
            .options(session)
            .application_name(shape.application_name)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500));
        Ok(breakwater_domain::pool_options(Duration::from_millis(self.db_ping_after_idle_ms))
            .max_connections(self.pool_size(shape.default_size))
            .min_connections(0)
            .acquire_timeout(shape.acquire_timeout)
            .idle_timeout(Some(Duration::from_secs(300)))
            .connect_lazy_with(options))
    }
}

/// Resolves on SIGTERM (what ECS and Docker send) or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long, value_enum, default_value = "development")]
        app_env: AppEnv,
    }

    #[test]
    fn defaults_are_the_shared_ones_and_the_pool_size_is_the_binarys_unless_set() {
        let cli = Cli::try_parse_from(["x"]).unwrap_or_else(|e| panic!("{e}"));
        let expected =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| breakwater_domain::DEFAULT_DATABASE_URL.to_owned());
        assert_eq!(cli.db.database_url, expected, "the environment's, or the shared default");
        assert_eq!(cli.db.db_statement_timeout_ms, 5_000);
        assert_eq!(cli.db.pool_size(10), 10);
        assert_eq!(cli.app_env.as_str(), "development");
        let cli = Cli::try_parse_from(["x", "--db-pool-size", "3", "--app-env", "production"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.db.pool_size(10), 3);
        assert_eq!(cli.app_env, AppEnv::Production);
        assert!(Cli::try_parse_from(["x", "--app-env", "staging"]).is_err());
    }

    #[tokio::test]
    async fn the_pool_carries_the_statement_timeout_and_the_session_settings() {
        let db = DatabaseArgs {
            database_url: std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| breakwater_domain::DEFAULT_DATABASE_URL.to_owned()),
            db_pool_size: None,
            db_statement_timeout_ms: 1_234,
            db_ping_after_idle_ms: 0,
        };
        let pool = db
            .pool(&PoolShape {
                application_name: "breakwater-process-test",
                default_size: 1,
                acquire_timeout: Duration::from_secs(5),
                session: &[("synchronous_commit", "off")],
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let (timeout, sync, name): (String, String, String) = sqlx::query_as(
            "SELECT current_setting('statement_timeout'), current_setting('synchronous_commit'), \
             current_setting('application_name')",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at DATABASE_URL: {e}"));
        assert_eq!((timeout.as_str(), sync.as_str(), name.as_str()), ("1234ms", "off", "breakwater-process-test"));
    }
}
