//! `breakwater-worker`: runs the job queue until SIGTERM/SIGINT; `breakwater-worker bench`
//! measures the queue's throughput.

mod bench;

use std::time::Duration;

use anyhow::Context as _;
use breakwater_domain::webhooks::WebhookPolicy;
use breakwater_worker::{Backoff, ClientOptions, Worker, WorkerOptions};
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "breakwater-worker", version, about = "Breakwater's job runner")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Config,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measures queue throughput with no-op jobs, in one and more worker processes. Use a
    /// scratch database: it migrates it and prunes its completed jobs.
    Bench(bench::BenchArgs),
}

/// Where the process runs; production refuses unsafe settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AppEnv {
    /// A laptop or CI.
    Development,
    /// Anything real: webhooks must be https to public addresses.
    Production,
}

/// `synchronous_commit` values the worker accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SyncCommit {
    /// Wait for the WAL flush on every commit.
    On,
    /// Do not wait: a crash of PostgreSQL may lose the last fraction of a second of commits.
    Off,
}

/// Everything the worker reads, from flags or the environment.
#[derive(Debug, Clone, clap::Args)]
struct Config {
    /// `development` or `production`.
    #[arg(long, env = "APP_ENV", value_enum, default_value = "development", global = true)]
    app_env: AppEnv,
    /// PostgreSQL connection string.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/breakwater", global = true)]
    database_url: String,
    /// Database connections (default: concurrency + 4).
    #[arg(long, env = "DB_POOL_SIZE")]
    db_pool_size: Option<u32>,
    /// PostgreSQL `synchronous_commit` for the worker's own connections. `off` is safe here:
    /// every write the worker makes (claim, heartbeat, completion, failure, erasure batch) that
    /// a database crash loses only makes a job run again, which the at-least-once contract
    /// already allows; it saves a WAL flush per statement. Enqueues (the API's) stay durable.
    #[arg(long, env = "WORKER_DB_SYNCHRONOUS_COMMIT", default_value = "off", global = true)]
    db_synchronous_commit: SyncCommit,
    /// Jobs run at once by this process.
    #[arg(long, env = "WORKER_CONCURRENCY", default_value_t = 16)]
    concurrency: usize,
    /// Most jobs claimed per statement (never more than the free slots).
    #[arg(long, env = "WORKER_BATCH", default_value_t = 16)]
    batch: usize,
    /// Job kinds to claim, comma-separated (default: all this worker knows).
    #[arg(long, env = "WORKER_KINDS", value_delimiter = ',')]
    kinds: Vec<String>,
    /// Lease of a claimed job, ms; heartbeats every third of it, a dead worker's jobs come back
    /// after it.
    #[arg(long, env = "WORKER_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    /// Poll interval when no notification arrives, ms.
    #[arg(long, env = "WORKER_POLL_MS", default_value_t = 1_000)]
    poll_ms: u64,
    /// How often expired leases are rescued, ms (default: a quarter of the lease).
    #[arg(long, env = "WORKER_RESCUE_MS")]
    rescue_ms: Option<u64>,
    /// How often finished jobs are pruned, s.
    #[arg(long, env = "WORKER_PRUNE_SECS", default_value_t = 60)]
    prune_secs: u64,
    /// How long completed jobs are kept, s.
    #[arg(long, env = "WORKER_COMPLETED_RETENTION_SECS", default_value_t = 86_400)]
    completed_retention_secs: u64,
    /// How long dead jobs are kept, s.
    #[arg(long, env = "WORKER_DEAD_RETENTION_SECS", default_value_t = 604_800)]
    dead_retention_secs: u64,
    /// How long a message's Idempotency-Key is remembered, s; older keys are pruned with the
    /// finished jobs, and a retry after it is a new request.
    #[arg(long, env = "WORKER_IDEMPOTENCY_RETENTION_SECS", default_value_t = 86_400)]
    idempotency_retention_secs: u64,
    /// On SIGTERM, how long running jobs get to finish before they are released, s. Keep it
    /// below the container's stop timeout (ECS and Docker default to 30 s).
    #[arg(long, env = "WORKER_SHUTDOWN_BUDGET_SECS", default_value_t = 20)]
    shutdown_budget_secs: u64,
    /// The longest one attempt may run, s.
    #[arg(long, env = "WORKER_JOB_TIMEOUT_SECS", default_value_t = 300)]
    job_timeout_secs: u64,
    /// Retry delay after the first failure, ms (doubles per attempt, with jitter).
    #[arg(long, env = "WORKER_BACKOFF_BASE_MS", default_value_t = 2_000)]
    backoff_base_ms: u64,
    /// Longest retry delay, s.
    #[arg(long, env = "WORKER_BACKOFF_MAX_SECS", default_value_t = 600)]
    backoff_max_secs: u64,
    /// Rows deleted per statement by an erasure.
    #[arg(long, env = "WORKER_ERASE_BATCH", default_value_t = 2_000)]
    erase_batch: i64,
    /// Allow webhooks to private, loopback and link-local addresses (development and tests
    /// only; refused in production).
    #[arg(long, env = "WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
    webhook_allow_private: bool,
    /// Webhook connect timeout, ms.
    #[arg(long, env = "WEBHOOK_CONNECT_TIMEOUT_MS", default_value_t = 3_000)]
    webhook_connect_timeout_ms: u64,
    /// Webhook request timeout (connect to response), ms.
    #[arg(long, env = "WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    webhook_timeout_ms: u64,
    /// How long an idle webhook connection is kept, s (below receivers' keep-alive timeouts).
    #[arg(long, env = "WEBHOOK_IDLE_SECS", default_value_t = 4)]
    webhook_idle_secs: u64,
    /// Idle webhook connections kept per origin.
    #[arg(long, env = "WEBHOOK_MAX_IDLE_PER_HOST", default_value_t = 32)]
    webhook_max_idle_per_host: usize,
    /// Address to serve `/metrics` and `/health` on, e.g. `0.0.0.0:9091`. Unset or empty: not
    /// served (the benchmark and the tests run several workers on one machine).
    #[arg(long, env = "WORKER_METRICS_ADDR")]
    metrics_addr: Option<String>,
    /// The CloudWatch metric lines (`METRICS_EMF_*`, the API's variables).
    #[command(flatten)]
    metrics_emf: breakwater_telemetry::emf::Options,
    /// Exit once the queue has nothing due and nothing is running (the benchmark's workers).
    #[arg(long, env = "WORKER_EXIT_WHEN_IDLE", default_value_t = false, hide = true)]
    exit_when_idle: bool,
    /// Log format: `pretty` or `json` (one object per line), the API's variable.
    #[arg(long, env = "LOG_FORMAT", default_value = "pretty", value_parser = ["pretty", "json"], global = true)]
    log_format: String,
    /// The OpenTelemetry collector's base URL (OTLP over HTTP, protobuf): spans are sent to
    /// `{endpoint}/v1/traces`. Unset or empty: no traces are exported. A job's span continues
    /// the trace of the request that enqueued it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    otel_exporter_otlp_endpoint: Option<String>,
}

impl Config {
    fn options(&self) -> anyhow::Result<WorkerOptions> {
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
            kinds: if self.kinds.is_empty() { breakwater_worker::all_kinds() } else { self.kinds.clone() },
            concurrency: self.concurrency,
            batch: self.batch,
            poll_interval: Duration::from_millis(self.poll_ms),
            rescue_interval: self.rescue_ms.map_or(defaults.rescue_interval, Duration::from_millis),
            prune_interval: Duration::from_secs(self.prune_secs.max(1)),
            completed_retention: Duration::from_secs(self.completed_retention_secs),
            dead_retention: Duration::from_secs(self.dead_retention_secs),
            idempotency_retention: Duration::from_secs(self.idempotency_retention_secs),
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

    fn pool(&self, size: u32) -> anyhow::Result<sqlx::PgPool> {
        let options: sqlx::postgres::PgConnectOptions = self.database_url.parse()?;
        let sync = match self.db_synchronous_commit {
            SyncCommit::On => "on",
            SyncCommit::Off => "off",
        };
        Ok(breakwater_domain::pool_options(Duration::from_millis(breakwater_domain::PING_AFTER_IDLE_MS))
            .max_connections(size)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options.application_name("breakwater-worker").options([("synchronous_commit", sync)])))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let telemetry = breakwater_telemetry::Telemetry::init(&breakwater_telemetry::Settings {
        service: "breakwater-worker",
        logs: if cli.config.log_format == "json" {
            breakwater_telemetry::LogOutput::Json
        } else {
            breakwater_telemetry::LogOutput::Pretty
        },
        default_filter: "info",
        otlp_endpoint: cli.config.otel_exporter_otlp_endpoint.as_deref(),
    })?;
    let result = match &cli.command {
        Some(Command::Bench(args)) => bench::run(&cli.config.database_url, args).await,
        None => run(&cli.config).await,
    };
    // The spans of the last jobs are still in the batch processor's buffer.
    telemetry.shutdown(Duration::from_secs(3));
    result
}

async fn run(config: &Config) -> anyhow::Result<()> {
    let options = config.options()?;
    let size =
        config.db_pool_size.unwrap_or_else(|| u32::try_from(options.concurrency).unwrap_or(u32::MAX).saturating_add(4));
    let pool = config.pool(size)?;
    let stop = CancellationToken::new();
    tokio::spawn(stop_on_signal(stop.clone()));
    let worker = Worker::new(pool, options);
    // Served until the worker has stopped, so the last figures can still be read while it drains.
    let served = CancellationToken::new();
    let server = match config.metrics_addr.as_deref().filter(|a| !a.is_empty()) {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("WORKER_METRICS_ADDR {addr}: cannot listen"))?;
            tracing::info!(addr = %listener.local_addr()?, "serving /metrics and /health");
            Some(tokio::spawn(breakwater_worker::metrics::serve(listener, worker.clone(), served.clone())))
        }
        None => None,
    };
    let emf = config.metrics_emf.start(breakwater_worker::emf::Publisher::new(
        &config.metrics_emf.namespace,
        &config.metrics_emf.environment,
        worker.clone(),
    ));
    let counts = worker.run(stop).await;
    // The last line once the worker has stopped, so its releases are counted.
    if let Some(emf) = emf {
        emf.finish().await;
    }
    served.cancel();
    if let Some(server) = server {
        match server.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the metrics server failed"),
            Err(e) => tracing::warn!(error = %e, "the metrics server panicked"),
            Ok(Ok(())) => {}
        }
    }
    let counts = counts?;
    // One line a supervisor (or the benchmark) can read.
    println!("{}", serde_json::to_string(&counts)?);
    Ok(())
}

/// SIGTERM (what ECS and Docker send) or SIGINT starts the graceful shutdown.
async fn stop_on_signal(stop: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!("stop signal received");
    stop.cancel();
}
