//! `breakwater-seed`: fills a Breakwater database with a skewed, production-shaped dataset.

use std::process::ExitCode;

use breakwater_seed::{DEFAULT_DATABASE_URL, DEFAULT_UNTIL, Options, Sizes};
use chrono::{DateTime, Utc};
use clap::Parser;

/// Seeds a Breakwater database: by default 50 tenants, 400,000 conversations and 2,000,000
/// messages, one tenant holding 55% of them. Creates and migrates the database if needed.
#[derive(Debug, Parser)]
#[command(name = "breakwater-seed", version)]
struct Cli {
    /// PostgreSQL connection string (the database is created if missing).
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
    /// The small preset, for tests and the dev stack: 5 tenants, 2,000 conversations, 10,000
    /// messages (the size flags still override it).
    #[arg(long)]
    small: bool,
    /// Tenants [default: 50, or 5 with --small].
    #[arg(long)]
    tenants: Option<usize>,
    /// Conversations over all tenants [default: 400000, or 2000 with --small].
    #[arg(long)]
    conversations: Option<usize>,
    /// Messages over all tenants [default: 2000000, or 10000 with --small].
    #[arg(long)]
    messages: Option<usize>,
    /// The biggest tenant's share of conversations, contacts and messages.
    #[arg(long, default_value_t = 0.55)]
    skew: f64,
    /// Which dataset: the same seed always gives the same rows.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The end of the seeded year (RFC 3339); fixed so that a seed gives the same rows on any day.
    #[arg(long, default_value = DEFAULT_UNTIL)]
    until: DateTime<Utc>,
    /// Wipe (TRUNCATE) a database that already has data, or an interrupted seed, first.
    #[arg(long)]
    reset: bool,
    /// Connections writing and building at once.
    #[arg(long, default_value_t = 3)]
    connections: usize,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
    /// Also print when each step of the load ran (start, end, seconds).
    #[arg(long, short)]
    verbose: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let preset = if cli.small { Sizes::SMALL } else { Sizes::FULL };
    let sizes = Sizes {
        tenants: cli.tenants.unwrap_or(preset.tenants),
        conversations: cli.conversations.unwrap_or(preset.conversations),
        messages: cli.messages.unwrap_or(preset.messages),
        skew: cli.skew,
    };
    let options = Options {
        seed: cli.seed,
        until: cli.until,
        reset: cli.reset,
        connections: cli.connections,
        progress: !cli.quiet,
        ..Options::new(cli.database_url, sizes)
    };
    match breakwater_seed::run(&options).await {
        Ok(summary) => {
            if cli.verbose {
                println!("  start     end    secs  step\n{}", summary.timeline());
            }
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("breakwater-seed: {e}");
            ExitCode::FAILURE
        }
    }
}
