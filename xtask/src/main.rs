//! `cargo xtask`: development chores, so that the only tool a newcomer needs is cargo.

use clap::{Parser, Subcommand};

mod bench_queries;

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "Breakwater's development chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Times the API's queries on the full skewed seed and saves their plans (docs/explain/,
    /// docs/PERFORMANCE.md); fails if a plan scans conversations, messages or contacts.
    BenchQueries(bench_queries::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::BenchQueries(args) => bench_queries::main(&args),
    }
}
