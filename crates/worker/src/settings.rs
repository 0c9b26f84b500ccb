//! The worker's settings, from flags or the environment: the groups every binary shares
//! (`APP_ENV`, the database, logs and traces) and the worker's own. Each default is written once,
//! in [`defaults`], which [`WorkerOptions::default`](crate::WorkerOptions) uses too.

use std::time::Duration;

use breakwater_domain::webhooks::WebhookPolicy;
pub use breakwater_process::AppEnv;
use breakwater_process::{DatabaseArgs, PoolShape};
use breakwater_telemetry::LogArgs;
use clap::ValueEnum;

use crate::{Backoff, ClientOptions, WorkerOptions};

/// The worker's defaults, shared by the flags and [`WorkerOptions::default`].
pub mod defaults {
    /// Jobs run at once by one process.
    pub const CONCURRENCY: usize = 16;
    /// Most jobs claimed per statement.
    pub const BATCH: usize = 16;
    /// A claimed job's lease, ms.
    pub const LEASE_MS: u64 = 30_000;
    /// Poll interval when no notification arrives, ms.
    pub const POLL_MS: u64 = 1_000;
    /// How often finished jobs are pruned, s.
    pub const PRUNE_SECS: u64 = 60;
    /// How long completed jobs are kept, s.
    pub const COMPLETED_RETENTION_SECS: u64 = 86_400;
    /// How long dead jobs are kept, s.
    pub const DEAD_RETENTION_SECS: u64 = 604_800;
    /// How long a message's `Idempotency-Key` is remembered, s.
    pub const IDEMPOTENCY_RETENTION_SECS: u64 = 86_400;
    /// How long the live inbox's events are kept for resuming clients, s.
    pub const STREAM_RETENTION_SECS: u64 = 86_400;
    /// Most live-inbox events kept per tenant.
    pub const STREAM_KEEP_PER_TENANT: i64 = 10_000;
    /// On stop, how long running jobs get to finish, s.
    pub const SHUTDOWN_BUDGET_SECS: u64 = 20;
    /// The longest one attempt may run, s.
    pub const JOB_TIMEOUT_SECS: u64 = 300;
    /// Retry delay after the first failure, ms.
    pub const BACKOFF_BASE_MS: u64 = 2_000;
    /// Longest retry delay, s.
    pub const BACKOFF_MAX_SECS: u64 = 600;
    /// Webhook connect timeout, ms.
    pub const WEBHOOK_CONNECT_TIMEOUT_MS: u64 = 3_000;
    /// Webhook request timeout, ms.
    pub const WEBHOOK_TIMEOUT_MS: u64 = 10_000;
    /// How long an idle webhook connection is kept, s.
    pub const WEBHOOK_IDLE_SECS: u64 = 4;
    /// Idle webhook connections kept per origin.
    pub const WEBHOOK_MAX_IDLE_PER_HOST: usize = 32;
}

/// `synchronous_commit` values the worker accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyncCommit {
    /// Wait for the WAL flush on every commit.
    On,
    /// Do not wait: a crash of PostgreSQL may lose the last fraction of a second of commits.
    Off,
}

/// Everything the worker reads, from flags or the environment.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// `development` or `production`.
    #[arg(long, env = "APP_ENV", value_enum, default_value = "development", global = true)]
    pub app_env: AppEnv,
    /// `DATABASE_URL`, `DB_POOL_SIZE` (default: concurrency + 4), `DB_STATEMENT_TIMEOUT_MS`,
    /// `DB_PING_AFTER_IDLE_MS`: the group every binary shares.
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// PostgreSQL `synchronous_commit` for the worker's own connections. `off` is safe here:
    /// every write the worker makes (claim, heartbeat, completion, failure, erasure batch) that
    /// a database crash loses only makes a job run again, which the at-least-once contract
    /// already allows; it saves a WAL flush per statement. Enqueues (the API's) stay durable.
    #[arg(long, env = "WORKER_DB_SYNCHRONOUS_COMMIT", default_value = "off", global = true)]
    pub db_synchronous_commit: SyncCommit,
    /// Jobs run at once by this process.
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = defaults::CONCURRENCY)]
    pub concurrency: usize,
    /// Most jobs claimed per statement (never more than the free slots).
    #[arg(long, env = "WORKER_BATCH", default_value_t = defaults::BATCH)]
    pub batch: usize,
    /// Job kinds to claim, comma-separated (default: all this worker knows).
    #[arg(long, env = "WORKER_KINDS", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Lease of a claimed job, ms; heartbeats every third of it, a dead worker's jobs come back
    /// after it.
    #[arg(long, env = "WORKER_LEASE_MS", default_value_t = defaults::LEASE_MS)]
    pub lease_ms: u64,
    /// Poll interval when no notification arrives, ms.
    #[arg(long, env = "WORKER_POLL_MS", default_value_t = defaults::POLL_MS)]
    pub poll_ms: u64,
    /// How often expired leases are rescued, ms (default: a quarter of the lease).
    #[arg(long, env = "WORKER_RESCUE_MS")]
    pub rescue_ms: Option<u64>,
    /// How often finished jobs are pruned, s.
    #[arg(long, env = "WORKER_PRUNE_SECS", default_value_t = defaults::PRUNE_SECS)]
    pub prune_secs: u64,
    /// How long completed jobs are kept, s.
    #[arg(long, env = "WORKER_COMPLETED_RETENTION_SECS", default_value_t = defaults::COMPLETED_RETENTION_SECS)]
    pub completed_retention_secs: u64,
    /// How long dead jobs are kept, s.
    #[arg(long, env = "WORKER_DEAD_RETENTION_SECS", default_value_t = defaults::DEAD_RETENTION_SECS)]
    pub dead_retention_secs: u64,
    /// How long a message's Idempotency-Key is remembered, s; older keys are pruned with the
    /// finished jobs, and a retry after it is a new request.
    #[arg(long, env = "WORKER_IDEMPOTENCY_RETENTION_SECS", default_value_t = defaults::IDEMPOTENCY_RETENTION_SECS)]
    pub idempotency_retention_secs: u64,
    /// How long the live inbox's events are kept for clients that resume with `Last-Event-ID`,
    /// s; a client further behind gets `resync`. Pruned on the prune interval.
    #[arg(long, env = "WORKER_STREAM_RETENTION_SECS", default_value_t = defaults::STREAM_RETENTION_SECS)]
    pub stream_retention_secs: u64,
    /// Most live-inbox events kept per tenant, however young (a tenant's burst cannot grow the
    /// table without bound).
    #[arg(long, env = "WORKER_STREAM_KEEP_PER_TENANT", default_value_t = defaults::STREAM_KEEP_PER_TENANT)]
    pub stream_keep_per_tenant: i64,
    /// On SIGTERM, how long running jobs get to finish before they are released, s. Keep it
    /// below the container's stop timeout (ECS and Docker default to 30 s).
    #[arg(long, env = "WORKER_SHUTDOWN_BUDGET_SECS", default_value_t = defaults::SHUTDOWN_BUDGET_SECS)]
    pub shutdown_budget_secs: u64,
    /// The longest one attempt may run, s.
    #[arg(long, env = "WORKER_JOB_TIMEOUT_SECS", default_value_t = defaults::JOB_TIMEOUT_SECS)]
    pub job_timeout_secs: u64,
    /// Retry delay after the first failure, ms (doubles per attempt, with jitter).
    #[arg(long, env = "WORKER_BACKOFF_BASE_MS", default_value_t = defaults::BACKOFF_BASE_MS)]
    pub backoff_base_ms: u64,
    /// Longest retry delay, s.
    #[arg(long, env = "WORKER_BACKOFF_MAX_SECS", default_value_t = defaults::BACKOFF_MAX_SECS)]
    pub backoff_max_secs: u64,
    /// Rows deleted per statement by an erasure.
    #[arg(long, env = "WORKER_ERASE_BATCH", default_value_t = breakwater_domain::contacts::ERASE_BATCH)]
    pub erase_batch: i64,
    /// Allow webhooks to private, loopback and link-local addresses (development and tests
    /// only; refused in production).
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
    pub webhook_allow_private: bool,
    /// Webhook connect timeout, ms.
    #[arg(long, env = "WEBHOOK_CONNECT_TIMEOUT_MS", default_value_t = defaults::WEBHOOK_CONNECT_TIMEOUT_MS)]
    pub webhook_connect_timeout_ms: u64,
    /// Webhook request timeout (connect to response), ms.
    #[arg(long, env = "WEBHOOK_TIMEOUT_MS", default_value_t = defaults::WEBHOOK_TIMEOUT_MS)]
    pub webhook_timeout_ms: u64,
    /// How long an idle webhook connection is kept, s (below receivers' keep-alive timeouts).
    #[arg(long, env = "WEBHOOK_IDLE_SECS", default_value_t = defaults::WEBHOOK_IDLE_SECS)]
    pub webhook_idle_secs: u64,
    /// Idle webhook connections kept per origin.
    #[arg(long, env = "WEBHOOK_MAX_IDLE_PER_HOST", default_value_t = defaults::WEBHOOK_MAX_IDLE_PER_HOST)]
    pub webhook_max_idle_per_host: usize,
    /// Address to serve `/metrics` and `/health` on, e.g. `0.0.0.0:9091`. Unset or empty: not
    /// served (the benchmark and the tests run several workers on one machine).
    #[arg(long, env = "WORKER_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// The CloudWatch metric lines (`METRICS_EMF_*`, the API's variables).
    #[command(flatten)]
    pub metrics_emf: breakwater_telemetry::emf::Options,
    /// Exit once the queue has nothing due and nothing is running (the benchmark's workers).
    #[arg(long, env = "WORKER_EXIT_WHEN_IDLE", default_value_t = false, hide = true)]
    pub exit_when_idle: bool,
    /// Logs and traces (`LOG_FORMAT`, `OTEL_EXPORTER_OTLP_ENDPOINT`, the API's variables).
    #[command(flatten)]
    pub log: LogArgs,
}

impl Settings {
    /// The worker's options from these settings.
    ///
    /// # Errors
    /// A setting production refuses, or one out of range.
    pub fn options(&self) -> anyhow::Result<WorkerOptions> {
        if self.app_env == AppEnv::Production && self.webhook_allow_private {
            anyhow::bail!("WEBHOOK_ALLOW_PRIVATE is refused when APP_ENV=production");
        }
        if self.lease_ms < 100 || self.concurrency == 0 || self.batch == 0 {
            anyhow::bail!("WORKER_LEASE_MS must be at least 100, WORKER_CONCURRENCY and WORKER_BATCH at least 1");
        }
        self.metrics_emf.validate()?;
        let policy = match self.app_env {
            AppEnv::Production => WebhookPolicy::production(),
            AppEnv::Development => WebhookPolicy::development(),
        }
        .allow_private(self.webhook_allow_private);
        let defaults = WorkerOptions::default().with_lease(Duration::from_millis(self.lease_ms));
        Ok(WorkerOptions {
            kinds: if self.kinds.is_empty() { crate::all_kinds() } else { self.kinds.clone() },
            concurrency: self.concurrency,
            batch: self.batch,
            poll_interval: Duration::from_millis(self.poll_ms),
            rescue_interval: self.rescue_ms.map_or(defaults.rescue_interval, Duration::from_millis),
            prune_interval: Duration::from_secs(self.prune_secs.max(1)),
            completed_retention: Duration::from_secs(self.completed_retention_secs),
            dead_retention: Duration::from_secs(self.dead_retention_secs),
            idempotency_retention: Duration::from_secs(self.idempotency_retention_secs),
            stream_retention: Duration::from_secs(self.stream_retention_secs),
            stream_keep_per_tenant: self.stream_keep_per_tenant.max(1),
            shutdown_budget: Duration::from_secs(self.shutdown_budget_secs),
            job_timeout: Duration::from_secs(self.job_timeout_secs.max(1)),
            backoff: Backoff {
                base: Duration::from_millis(self.backoff_base_ms),
                max: Duration::from_secs(self.backoff_max_secs),
            },
            erase_batch: self.erase_batch.max(1),
            exit_when_idle: self.exit_when_idle,
            client: ClientOptions {
                policy,
                connect_timeout: Duration::from_millis(self.webhook_connect_timeout_ms),
                request_timeout: Duration::from_millis(self.webhook_timeout_ms),
                idle_timeout: Duration::from_secs(self.webhook_idle_secs),
                max_idle_per_host: self.webhook_max_idle_per_host,
                check_stale: true,
            },
            ..defaults
        })
    }

    /// The worker's pool: `DB_POOL_SIZE`, or one connection per running job plus the claim loop,
    /// heartbeat, listener and maintenance; `synchronous_commit` as set.
    ///
    /// # Errors
    /// When the URL does not parse.
    pub fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        let sync = match self.db_synchronous_commit {
            SyncCommit::On => "on",
            SyncCommit::Off => "off",
        };
        let default_size = u32::try_from(self.concurrency).unwrap_or(u32::MAX).saturating_add(4);
        self.db.pool(&PoolShape {
            application_name: "breakwater-worker",
            default_size,
            acquire_timeout: Duration::from_secs(10),
            session: &[("synchronous_commit", sync)],
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    #[test]
    fn the_flags_defaults_are_the_libraries_defaults() {
        let settings = Cli::try_parse_from(["breakwater-worker"]).unwrap_or_else(|e| panic!("{e}")).settings;
        let flags = settings.options().unwrap_or_else(|e| panic!("{e}"));
        let lib = WorkerOptions::default();
        let pick = |o: &WorkerOptions| {
            (
                (o.concurrency, o.batch, o.lease, o.heartbeat, o.poll_interval, o.rescue_interval, o.prune_interval),
                (o.completed_retention, o.dead_retention, o.idempotency_retention, o.shutdown_budget, o.job_timeout),
                (o.backoff.base, o.backoff.max, o.erase_batch, o.exit_when_idle, o.kinds.clone()),
                (o.client.connect_timeout, o.client.request_timeout, o.client.idle_timeout, o.client.max_idle_per_host),
                (o.stream_retention, o.stream_keep_per_tenant),
            )
        };
        assert_eq!(pick(&flags), pick(&lib));
        assert_eq!(lib.rescue_interval, lib.lease / 4, "the rescue follows the lease, as with_lease sets it");
    }

    #[test]
    fn production_refuses_private_webhooks() {
        let cli = Cli::try_parse_from(["breakwater-worker", "--app-env", "production", "--webhook-allow-private"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(cli.settings.options().is_err());
    }
}
