//! `breakwater-worker bench`: queue throughput with no-op jobs. Enqueues N jobs, starts P
//! worker processes (this same binary) that exit once the queue is empty, and reports jobs per
//! second from their start to the last one's exit. The figures are in `docs/PERFORMANCE.md`
//! (the parts) and in full in `docs/lab/history/2a146a5-job-queue-throughput.md`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use breakwater_domain::jobs::{self, kind};
use breakwater_worker::Counts;
use serde_json::json;
use tokio::io::AsyncReadExt as _;

/// Benchmark settings.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
    /// No-op jobs per run.
    #[arg(long, default_value_t = 50_000)]
    jobs: usize,
    /// Worker process counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    processes: Vec<usize>,
    /// Runs per process count (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Concurrency of each worker process.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Claim batch of each worker process.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// The workers' `synchronous_commit` (`on` or `off`).
    #[arg(long, default_value = "off")]
    synchronous_commit: String,
}

pub(crate) async fn run(database_url: &str, args: &BenchArgs) -> anyhow::Result<()> {
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(database_url).await?;
    breakwater_domain::migrate(&pool).await?;
    let exe = std::env::current_exe()?;
    println!("concurrency {}, batch {}, synchronous_commit {}", args.concurrency, args.batch, args.synchronous_commit);
    println!("| worker processes | jobs | runs (jobs/s) | median jobs/s |");
    println!("|---|---|---|---|");
    for &processes in &args.processes {
        let mut rates = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            // Start from an empty table: completed jobs of earlier runs are pruned.
            while jobs::prune(&pool, 0.0, 1e9, 50_000).await? > 0 {}
            let live = jobs::stats(&pool).await?;
            anyhow::ensure!(
                live.ready + live.scheduled + live.running == 0,
                "the database has live jobs: use a scratch one"
            );
            let mut conn = pool.acquire().await?;
            for chunk in (0..args.jobs).collect::<Vec<_>>().chunks(10_000) {
                let payloads: Vec<_> = chunk.iter().map(|i| json!({ "n": i })).collect();
                jobs::enqueue_many(&mut conn, kind::NOOP, &payloads).await?;
            }
            drop(conn);

            let started = Instant::now();
            let mut children = Vec::with_capacity(processes);
            for _ in 0..processes {
                children.push(
                    tokio::process::Command::new(&exe)
                        .env("DATABASE_URL", database_url)
                        .env("WORKER_KINDS", kind::NOOP)
                        .env("WORKER_CONCURRENCY", args.concurrency.to_string())
                        .env("WORKER_BATCH", args.batch.to_string())
                        .env("WORKER_DB_SYNCHRONOUS_COMMIT", &args.synchronous_commit)
                        .env("WORKER_EXIT_WHEN_IDLE", "true")
                        .env("RUST_LOG", "warn")
                        .stdout(Stdio::piped())
                        .kill_on_drop(true)
                        .spawn()?,
                );
            }
            let mut completed = 0;
            for mut child in children {
                let mut out = String::new();
                if let Some(mut stdout) = child.stdout.take() {
                    stdout.read_to_string(&mut out).await?;
                }
                let status = child.wait().await?;
                anyhow::ensure!(status.success(), "a worker process failed: {status}");
                let counts: Counts = serde_json::from_str(out.lines().last().unwrap_or("{}"))?;
                completed += counts.completed;
            }
            let elapsed = started.elapsed();
            anyhow::ensure!(usize::try_from(completed) == Ok(args.jobs), "completed {completed} of {} jobs", args.jobs);
            rates.push(rate(args.jobs, elapsed));
        }
        let runs: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        rates.sort_by(f64::total_cmp);
        let median = rates.get(rates.len() / 2).copied().unwrap_or_default();
        println!("| {processes} | {} | {} | **{median:.0}** |", args.jobs, runs.join(", "));
    }
    Ok(())
}

#[allow(clippy::cast_precision_loss)] // job counts are far below 2^52
fn rate(jobs: usize, elapsed: Duration) -> f64 {
    jobs as f64 / elapsed.as_secs_f64()
}
