//! `breakwater-worker`: runs the job queue until SIGTERM/SIGINT.

use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "breakwater-worker", version, about = "Breakwater's job runner")]
struct Cli {
    /// PostgreSQL connection string.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/breakwater")]
    database_url: String,
    /// Jobs claimed per round.
    #[arg(long, env = "WORKER_BATCH", default_value_t = 10)]
    batch: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let cli = Cli::parse();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(4).connect_lazy(&cli.database_url)?;
    let stop = CancellationToken::new();
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        signal_stop.cancel();
    });
    let options = breakwater_worker::WorkerOptions { batch: cli.batch, ..Default::default() };
    tracing::info!(owner = %options.owner, "breakwater-worker started");
    breakwater_worker::run(pool, options, stop).await
}
