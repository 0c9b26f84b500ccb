//! `cargo xtask chaos [--quick]`: the reliability suite. It drives the real binaries against a
//! private PostgreSQL cluster and a private Redis (both on free ports, in a temporary directory;
//! the shared servers are never touched), injects one fault per scenario under load, and exits
//! non-zero when any expectation is violated. Every figure it prints is measured in this run.
//!
//! Scenarios (see docs/RELIABILITY.md for what each expects and why):
//! - `postgres`: the cluster stopped and started under load at half of measured capacity;
//! - `redis`: Redis killed and restarted under load;
//! - `sigterm`: the API terminated under load, and a new process started on the same port;
//! - `hostile-tenant`: one agent stalls bodies on every write route at 10x the pool, reads large
//!   lists slowly and forges tokens claiming another tenant, while ops paths are probed on the
//!   public port; the other tenants' load must not notice (`chaos/hostile_tenant.rs`);
//! - `hostile`: slowloris, idle keep-alives, oversized headers and bodies, a connection flood;
//! - `fuzz`: schemathesis against `/openapi.json` with two tenants' tokens.
//!
//! Every response is classified as the load lab classifies it (`load.rs`, through
//! `breakwater_loadlab::classify`), so the two report the same ok, refused and error: a 429, or a
//! 503 with the typed envelope (`load_shed`, `db_unavailable`, ...), is a refusal, counted by its
//! code and never an error. A refused connection is an error of kind `connect`, as in the lab;
//! only `sigterm` expects some (while its port changes hands), and it reports them apart.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;

use self::load::capacity;
use self::sigterm::READ_LOG;
use self::testbed::{Testbed, free_port, report_panics, stop_api, wait_healthy};
use self::verdict::Report;
use crate::rig::services;

mod fuzz;
mod hostile;
mod hostile_tenant;
mod load;
mod postgres;
mod redis;
mod sigterm;
mod testbed;
mod verdict;

/// Options of `cargo xtask chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Shorter runs and a shorter fuzzing budget (about 5 minutes in all). CI runs it with
    /// `--only postgres,redis,sigterm,hostile-tenant,fuzz`.
    #[arg(long)]
    quick: bool,
    /// Only these scenarios (comma-separated: postgres, redis, sigterm, hostile, hostile-tenant,
    /// fuzz).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Build and run the release binaries (the default is the debug build CI already has). The
    /// hostile scenario's /health bound is for the production build at the production shape.
    #[arg(long)]
    release: bool,
    /// The hostile scenario's `MAX_ACCEPT_RATE` for the API (new connections a second; 0: no
    /// limit). The default is the production task's (docs/DEPLOY.md, the 0.25 vCPU tier).
    #[arg(long, default_value_t = 2000)]
    accept_rate: u32,
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let all = ["postgres", "redis", "sigterm", "hostile-tenant", "hostile", "fuzz"];
    for s in &args.only {
        anyhow::ensure!(all.contains(&s.as_str()), "unknown scenario {s:?}; known: {all:?}");
    }
    let wanted = |s: &str| args.only.is_empty() || args.only.iter().any(|o| o == s);
    let started = Instant::now();

    let profile: &[&str] = if args.release { &["--release"] } else { &[] };
    let status = Command::new(services::cargo())
        .args(["build", "-p", "breakwater-api", "-p", "breakwater-worker"])
        .args(profile)
        .status()?;
    anyhow::ensure!(status.success(), "build failed");
    let bin = services::root().join("target").join(if args.release { "release" } else { "debug" });

    let mut bed = Testbed::start(bin, args.quick).await?;
    let mut report = Report::default();
    println!(
        "chaos: private PostgreSQL on port {}, private Redis on port {}, {} build",
        bed.pg.port,
        bed.redis_port,
        if args.release { "release" } else { "debug" }
    );

    let port = free_port()?;
    // Every request read is logged (for the SIGTERM scenario's accounting; see `read_request_ids`).
    let mut api = bed.spawn_api(port, &[("RUST_LOG", READ_LOG)], false)?;
    wait_healthy(&api.base(), Duration::from_secs(20)).await?;
    let capacity = capacity(&api.base(), &bed.tenants).await?;
    let rate = (capacity * 0.5).clamp(10.0, 400.0);
    report.note(format!(
        "capacity (closed loop, 16 clients, 50/50 POST message / GET inbox, 3 s): {capacity:.0} req/s; \
         scenarios run at {rate:.0} req/s"
    ));

    if wanted("postgres") {
        println!("\n== postgres: cluster stopped and started under load");
        postgres::run(&mut bed, &api, rate, &mut report).await?;
    }
    if wanted("redis") {
        println!("\n== redis: killed and restarted under load");
        redis::run(&mut bed, &api, rate, &mut report).await?;
    }
    if wanted("sigterm") {
        println!("\n== sigterm: drain under load, a new process on the same port");
        api = sigterm::run(&bed, api, rate, &mut report).await?;
    }
    if wanted("hostile-tenant") {
        println!("\n== hostile-tenant: one agent stalls bodies, reads slowly, forges tokens; ops paths probed");
        hostile_tenant::run(&bed, args.release, &mut report).await?;
    }
    if wanted("hostile") {
        println!("\n== hostile: slowloris, idle keep-alives, oversized input, a connection flood");
        stop_api(&mut api);
        report_panics(&api, "api", &mut report);
        let port = free_port()?;
        api = hostile::run(&bed, port, args.accept_rate, &mut report).await?;
    }
    if wanted("fuzz") {
        println!("\n== fuzz: schemathesis against /openapi.json, two tenants");
        fuzz::run(&bed, &api, &mut report).await?;
    }
    stop_api(&mut api);
    report_panics(&api, "api", &mut report);

    println!("\n== summary ({} s)", started.elapsed().as_secs());
    println!("| scenario | expectation | expected | measured | |");
    println!("|---|---|---|---|---|");
    for c in &report.checks {
        println!(
            "| {} | {} | {} | {} | {} |",
            c.scenario,
            c.what,
            c.expected,
            c.measured,
            if c.ok { "ok" } else { "FAIL" }
        );
    }
    let failed = report.checks.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        bail!("{failed} of {} expectations violated", report.checks.len());
    }
    println!("all {} expectations held", report.checks.len());
    Ok(())
}
