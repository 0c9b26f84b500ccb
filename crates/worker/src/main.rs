//! `breakwater-worker`: runs the job queue until SIGTERM/SIGINT; `breakwater-worker bench`
//! measures the queue's throughput.

mod bench;

use std::time::Duration;

use anyhow::Context as _;
use breakwater_worker::Worker;
use breakwater_worker::settings::Settings;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "breakwater-worker", version, about = "Breakwater's job runner")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Settings,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measures queue throughput with no-op jobs, in one and more worker processes. Use a
    /// scratch database: it migrates it and prunes its completed jobs.
    Bench(bench::BenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let telemetry = cli.config.log.init("breakwater-worker", "info")?;
    let result = match &cli.command {
        Some(Command::Bench(args)) => bench::run(&cli.config.db.database_url, args).await,
        None => run(&cli.config).await,
    };
    // The spans of the last jobs are still in the batch processor's buffer.
    telemetry.shutdown(Duration::from_secs(3));
    result
}

async fn run(config: &Settings) -> anyhow::Result<()> {
    let options = config.options()?;
    let pool = config.pool()?;
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            breakwater_process::shutdown_signal().await;
            tracing::info!("stop signal received");
            stop.cancel();
        }
    });
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
