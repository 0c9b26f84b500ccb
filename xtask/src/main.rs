//! `cargo xtask`: the project's chores, so the only tool a newcomer needs is cargo. The
//! experiments live in the `breakwater-lab` crate (crates/lab); this is their command line.
//!
//! - `cargo xtask dev`: a served, seeded stack on this machine (PostgreSQL found or started,
//!   migrated, seeded small; API and worker running; a token and a curl line printed).
//! - `cargo xtask test`: every test, against a real PostgreSQL and Redis.
//! - `cargo xtask pinned -- <command...>`: a command in a cgroup at the production task's shape.
//! - `cargo xtask bench-queries`: the API's queries timed on the full skewed seed.
//! - `cargo xtask chaos [--quick]`: the reliability suite (faults and hostile input, under load).
//! - `cargo xtask lab [--quick]`: the headline experiment (admission off, static, adaptive) pinned.
//! - `cargo xtask fleet [--quick]`: pinned tasks behind HAProxy, autoscaled through a surge.

mod dev;

use breakwater_lab::rig::pinned::command as pinned;
use breakwater_lab::rig::services;
use breakwater_lab::{bench_queries, chaos, fleet, lab};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Breakwater's development chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API and the worker over a small seeded database, until Ctrl-C.
    Dev(dev::DevArgs),
    /// Run every test (`cargo test --workspace`) against real PostgreSQL and Redis.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a command in a cgroup at the production task's shape (0.25 core, 512 MiB, no swap).
    Pinned(pinned::PinnedArgs),
    /// Times the API's queries on the full skewed seed and saves their plans (docs/explain/
    /// and its README.md); fails if a plan scans conversations, messages or contacts.
    BenchQueries(bench_queries::Args),
    /// The reliability suite: PostgreSQL and Redis faults, SIGTERM, hostile clients and fuzzing,
    /// under load, against private servers; exits non-zero on any violated expectation.
    Chaos(chaos::ChaosArgs),
    /// The headline experiment: admission off, static and adaptive, under every load shape
    /// at the production shape (the goals in docs/PERFORMANCE.md, the whole report in docs/lab/; `--quick` for a CI
    /// smoke run).
    Lab(lab::LabArgs),
    /// Pinned API tasks behind HAProxy configured as the stack's ALB, scaled like the stack's
    /// ECS service, through a surge: the minute a new task takes to start (report in
    /// docs/PERFORMANCE.md and docs/fleet/; `--quick` for a short check). Root, like `lab`.
    Fleet(fleet::FleetArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = || tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    match cli.command {
        Command::BenchQueries(args) => bench_queries::main(&args),
        Command::Chaos(args) => runtime()?.block_on(chaos::run(args)),
        Command::Dev(args) => runtime()?.block_on(dev::run(args)),
        Command::Test { args } => runtime()?.block_on(test(args)),
        Command::Pinned(args) => runtime()?.block_on(pinned::run(args)),
        Command::Lab(args) => runtime()?.block_on(lab::run(args)),
        Command::Fleet(args) => runtime()?.block_on(fleet::run(args)),
    }
}

async fn test(args: Vec<String>) -> anyhow::Result<()> {
    let db = services::ensure_postgres(&services::database_url()).await?;
    services::report_redis(&services::redis_url());
    // Tests create a fresh database per test through the server's maintenance database.
    let admin_url = services::with_database(&db, "postgres");
    let status = std::process::Command::new(services::cargo())
        .args(["test", "--workspace"])
        .args(&args)
        .env("DATABASE_URL", &admin_url)
        .status()?;
    anyhow::ensure!(status.success(), "tests failed");
    Ok(())
}
