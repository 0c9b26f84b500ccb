//! `cargo xtask bench-queries`: the API's queries timed on the full skewed seed.
//!
//! Each case calls the `breakwater_domain` function the API calls, so what is timed is exactly
//! the SQL the API runs, through sqlx's per-connection prepared-statement cache (after five
//! executions PostgreSQL may switch a prepared statement to its generic plan; the warm-up runs
//! get past that). Latencies are client-measured over one connection on loopback.
//!
//! Plans come from `auto_explain` (`log_analyze`, `log_buffers`, nested statements, at NOTICE
//! level, captured from sqlx's notice log) on a second connection that runs each case the same
//! way: they are the plans of the very statements timed, with their real parameters, after the
//! plan cache has settled, including the foreign-key trigger queries an erasure fires. They are
//! saved in `docs/explain/`, and the command fails if any of them scans `conversations`,
//! `messages` or `contacts` sequentially.

use std::time::Instant;

use anyhow::{Context as _, bail};
use breakwater_domain::Pool;
use sqlx::Executor as _;
use sqlx::postgres::PgPoolOptions;

use self::cases::{cases, subjects};
use self::erasures::{erasures_of, restore};
use self::measure::{Timing, dedupe, explained, ms, percentile, seq_scan};
use self::notices::Notices;
use self::report::Report;

mod cases;
mod erasures;
mod measure;
mod notices;
mod report;

/// Options of `cargo xtask bench-queries`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The database to measure. Seeded with the full default first if it has no data.
    #[arg(long, env = "BENCH_DATABASE_URL", default_value = "postgres://postgres@127.0.0.1:5432/breakwater_bench")]
    database_url: String,
    /// Timed runs of each query.
    #[arg(long, default_value_t = 300)]
    runs: usize,
    /// Untimed runs before them (the plan cache settles after five).
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Pages walked by keyset to reach the deep page.
    #[arg(long, default_value_t = 400)]
    deep_pages: usize,
    /// Contacts erased (the tenant's biggest ones, one erasure each; all are restored after).
    #[arg(long, default_value_t = 9)]
    erasures: usize,
    /// Measure a debug build as it is instead of re-running in release.
    #[arg(long)]
    debug_build: bool,
    /// Write nothing under docs/ (still fails on a sequential scan).
    #[arg(long)]
    no_write: bool,
}

pub fn main(args: &Args) -> anyhow::Result<()> {
    if cfg!(debug_assertions) && !args.debug_build {
        eprintln!(
            "bench-queries: a debug build would time the client; running the release build (--debug-build skips)"
        );
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["run", "--release", "--quiet", "--package", "xtask", "--"])
            .args(std::env::args_os().skip(1))
            .status()
            .context("running cargo")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    let notices = Notices::default();
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(notices.clone()))
            .context("installing the notice capture")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run(args, &notices))
}

async fn run(args: &Args, notices: &Notices) -> anyhow::Result<()> {
    let started = chrono::Utc::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pool = match connect(&args.database_url).await {
        Ok(pool) => pool,
        Err(_) => {
            seed(&args.database_url).await?;
            connect(&args.database_url).await?
        }
    };
    let tenants: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants").fetch_one(&pool).await.unwrap_or(0);
    if tenants == 0 {
        seed(&args.database_url).await?;
    }
    restore(&pool).await?;

    let subjects = subjects(&pool, args.erasures + 1).await?;
    for s in &subjects {
        println!(
            "{}: tenant {} — {} conversations, {} messages, {} contacts",
            s.label, s.tenant, s.conversations, s.messages, s.contacts
        );
    }
    let cases = cases(&pool, &subjects, args.deep_pages).await?;

    let mut timings = Vec::with_capacity(cases.len());
    for case in &cases {
        let subject = &subjects[case.subject];
        let mut samples = Vec::with_capacity(args.runs);
        let mut rows = 0;
        for _ in 0..args.warmup {
            case.query.run(&pool, subject.tenant).await?;
        }
        for _ in 0..args.runs {
            let t = Instant::now();
            rows = case.query.run(&pool, subject.tenant).await?.0;
            samples.push(t.elapsed());
        }
        samples.sort_unstable();
        // One more run, on the same connection and statements, with auto_explain on.
        let plans = explained(&pool, notices, case.query.run(&pool, subject.tenant)).await?;
        let explain = format!("-- {}: {} ({})\n\n{}", case.key, case.title, subject.label, dedupe(&plans));
        let timing = Timing {
            p50: percentile(&samples, 50),
            p99: percentile(&samples, 99),
            rows,
            seq_scan: seq_scan(&explain),
            explain,
        };
        println!(
            "{:<16} {:<44} p50 {:>7} ms  p99 {:>7} ms  rows {:>3}{}",
            subject.key,
            case.title,
            ms(timing.p50),
            ms(timing.p99),
            timing.rows,
            if timing.seq_scan { "  SEQ SCAN" } else { "" }
        );
        timings.push(timing);
    }

    let mut erasures = Vec::new();
    for (i, subject) in subjects.iter().enumerate() {
        let e = erasures_of(&pool, notices, subject, args.erasures).await;
        restore(&pool).await?;
        let e = e?;
        println!(
            "{:<16} {:<44} p50 {:>7} ms  p99 {:>7} ms  (request p50 {} ms, largest {} ms){}",
            subject.key,
            "erasure: request + erase job",
            ms(e.total.p50),
            ms(e.total.p99),
            ms(e.request.p50),
            ms(e.largest),
            if e.total.seq_scan { "  SEQ SCAN" } else { "" }
        );
        erasures.push((i, e));
    }
    sqlx::raw_sql("VACUUM (ANALYZE) contacts, conversations, messages, jobs").execute(&pool).await?;

    let report = Report {
        runs: args.runs,
        warmup: args.warmup,
        started,
        load_before,
        subjects: &subjects,
        cases: &cases,
        timings: &timings,
        erasures: &erasures,
    };
    if !args.no_write {
        report.write().await?;
    }
    let scans: Vec<String> = cases
        .iter()
        .zip(&timings)
        .filter(|(_, t)| t.seq_scan)
        .map(|(c, _)| c.key.clone())
        .chain(erasures.iter().filter(|(_, e)| e.total.seq_scan).map(|(i, _)| format!("{}-erasure", subjects[*i].key)))
        .collect();
    if !scans.is_empty() {
        bail!("sequential scans on conversations, messages or contacts in: {}", scans.join(", "));
    }
    Ok(())
}

/// The one connection everything runs on: with `auto_explain` loaded but off until
/// [`explained`] turns it on for one run, so the plans shown are those of the statements timed,
/// in the state the timed runs left the plan cache in.
async fn connect(url: &str) -> anyhow::Result<Pool> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(
                    "LOAD 'auto_explain';
                     SET auto_explain.log_min_duration = -1; SET auto_explain.log_analyze = on;
                     SET auto_explain.log_buffers = on; SET auto_explain.log_timing = on;
                     SET auto_explain.log_triggers = on; SET auto_explain.log_nested_statements = on;
                     SET auto_explain.log_level = notice",
                )
                .await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .context("connecting to the bench database (auto_explain needs a superuser)")?;
    Ok(pool)
}

async fn seed(url: &str) -> anyhow::Result<()> {
    println!("bench-queries: the database has no data; seeding the full default first");
    let options =
        breakwater_seed::Options { progress: true, ..breakwater_seed::Options::new(url, breakwater_seed::Sizes::FULL) };
    let summary = breakwater_seed::run(&options).await?;
    println!("{summary}");
    Ok(())
}
