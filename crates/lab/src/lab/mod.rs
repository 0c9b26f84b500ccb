//! `cargo xtask lab`: the headline experiment in one command (docs/lab/REPORT.md; its goals in
//! docs/PERFORMANCE.md).
//!
//! Builds the release binaries, seeds its own database (reused while the seed parameters match),
//! then, for each admission variant (`off`, `static` 80, `adaptive`), starts the API alone in a
//! cgroup at the production task's shape (0.25 core, 512 MiB) and drives it with the `loadlab`
//! binary from outside the cgroup: the closed-loop sweep, an open-loop ramp from 0.25x to 10x the
//! measured capacity over the full request mix, a capacity-change run (a competing load on
//! PostgreSQL mid-run) and a noisy-neighbour run. Beside the load lab's own server samples it
//! samples the cgroup's throttling counters, PostgreSQL's CPU, the machine's CPU and `/health`,
//! so that every step says what saturated. What it measured is a
//! `record::LabRecord`, rendered by `report`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;

use self::dataset::{commit, seed, tokens};
use self::faults::{Burn, Slowdown};
use self::phase::{Ctx, Load, MEMORY, Server, Spec, Throttles};
use self::progress::log;
use crate::plan::{PHASES, Plan, VARIANTS, quarter_core};
use crate::record::reading;
use crate::record::{self, Capacity, Flood, LabRecord, Machine, Noisy, RefusalCost, Variant};
use crate::report;
use crate::rig::pinned::{Limits, Millicores, Pinned};
use crate::rig::services;

pub(crate) mod dataset;
mod faults;
pub(crate) mod phase;
pub(crate) mod probes;
mod progress;

/// Options of `cargo xtask lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// A few minutes in all (small seed, short steps, fewer points): a smoke check for CI that
    /// asserts nothing about speed. Writes under target/ unless --out is given.
    #[arg(long)]
    quick: bool,
    /// Where the report, charts and JSON go [default: docs/lab/ and the goals' section of
    /// docs/PERFORMANCE.md for a full run, target/lab-quick/ for --quick]. Raw load lab reports go to OUT/runs/
    /// (target/lab/runs/ for a full run without --out).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The database the lab seeds and serves (on the server of DATABASE_URL) [default:
    /// breakwater_lab, or breakwater_lab_quick with --quick].
    #[arg(long)]
    database: Option<String>,
    /// Port the API listens on (127.0.0.1); its ops listener takes the next one.
    #[arg(long, default_value_t = 18_080)]
    port: u16,
    /// PostgreSQL's CPU, in cores, for the API's database in the middle of the capacity-change
    /// run: its backends are moved under this CPU quota, then back (as if a competing load took
    /// the database server's CPU). Needs root and cgroups, as pinning does.
    #[arg(long, default_value = "0.15", value_parser = crate::rig::pinned::parse_cpus)]
    db_cpus: Millicores,
    /// Without cgroups, the capacity-change run slows PostgreSQL with this many connections of
    /// competing CPU-heavy queries instead (on a 2-core machine, 3 slowed it too little to move
    /// the admission limit: the API's queries still got their share of the CPU).
    #[arg(long, default_value_t = 3)]
    burners: usize,
    /// Do not build (use the binaries already in target/release, or target/debug with --quick).
    #[arg(long)]
    no_build: bool,
    /// Measure nothing: write the report again from a run's `lab.json` (to the same places as a
    /// run with the same --quick and --out would).
    #[arg(long, value_name = "LAB_JSON")]
    from_json: Option<PathBuf>,
    /// The API's CPU quota, in cores. Anything but the production task's 0.25 is an experiment:
    /// the calibration rates scale with it, and the report goes under target/lab-custom/ unless
    /// --out is given (never into docs/PERFORMANCE.md).
    #[arg(long, default_value = "0.25", value_parser = crate::rig::pinned::parse_cpus)]
    api_cpus: Millicores,
    /// Only these runs (comma-separated: refusals, sweep, sweep-honouring, sweep-one, ramp,
    /// ramp-one, ramp-honouring, change, noisy, flood); the capacity is always calibrated first.
    /// A subset is an experiment, reported like --api-cpus.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// The variants, in order (comma-separated: off, static, adaptive). Anything but all three is
    /// an experiment, reported like --api-cpus.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Skip the calibration and run at this capacity (req/s): to compare two builds at the same
    /// offered load, since the calibration moves from run to run on a shared machine. An
    /// experiment, reported like --api-cpus.
    #[arg(long, value_name = "RPS", value_parser = parse_capacity)]
    capacity: Option<f64>,
    /// More of the API's settings, `NAME=value`, over the production tier's (`MAX_ACCEPT_RATE=0`
    /// for a task without an accept rate); repeat it for more. The lab's own settings (the
    /// variant, the addresses, the database) still win. An experiment, reported like --api-cpus.
    #[arg(long, value_name = "NAME=value", value_parser = parse_api_env)]
    api_env: Vec<String>,
}

fn parse_api_env(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((name, _))
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') =>
        {
            Ok(s.to_owned())
        }
        _ => Err(format!("{s:?} is not NAME=value with an upper-case setting name, as MAX_ACCEPT_RATE=0")),
    }
}

fn parse_capacity(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rps) if rps.is_finite() && rps >= 1.0 => Ok(rps),
        _ => Err(format!("{s:?} is not a rate of at least 1 request per second")),
    }
}

/// `cargo xtask lab`: the whole lab, or its report again from a saved `lab.json`.
pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let plan = plan(&args)?;
    let root = services::root();
    let (out, runs_dir, docs) = match (&args.out, args.quick) {
        (Some(o), _) => (o.clone(), o.join("runs"), false),
        (None, _) if plan.is_experiment() => {
            (root.join("target/lab-custom"), root.join("target/lab-custom/runs"), false)
        }
        (None, true) => (root.join("target/lab-quick"), root.join("target/lab-quick/runs"), false),
        (None, false) => (root.join("docs/lab"), root.join("target/lab/runs"), true),
    };
    std::fs::create_dir_all(&out)?;
    let perf_md = docs.then(|| root.join("docs/PERFORMANCE.md"));
    if let Some(json) = &args.from_json {
        return from_json(json, &args, out, perf_md);
    }
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;
    let pinning = pinning(&args)?;
    let (ctx, mut lab) = prepare(&args, &plan, pinning, runs_dir).await?;

    // 1. The capacity, once: a short absolute-rate ramp against the adaptive variant. (The
    // noisy-neighbour and flood rates depend on it: the profiles file is written again below.)
    std::fs::write(ctx.runs.join("profiles.toml"), plan.profiles(1.0, 1.0))?;
    let capacity = capacity(&ctx).await?;
    log(&format!("capacity {:.0} req/s ({})", capacity.rps, capacity.how));
    lab.capacity = Some(capacity.clone());
    let noisy_rps = ctx.tokens.noisy_rps(capacity.rps * plan.noisy_base, plan.noisy_factor);
    let others_rps = capacity.rps * plan.noisy_base * (1.0 - ctx.tokens.top_share);
    std::fs::write(ctx.runs.join("profiles.toml"), plan.profiles(noisy_rps, others_rps))?;

    // 2. What a refusal costs: the API refusing everything, and a bare hyper server's canned 503.
    if plan.runs("refusals") {
        lab.refusal_cost = Some(refusal_cost(&ctx).await?);
    }

    // 3. Each variant: the sweeps, the ramps, the capacity change, the noisy neighbour, the flood.
    for variant in plan.variants.iter().map(String::as_str) {
        lab.variants.push(variant_runs(&ctx, &args, variant, capacity.rps).await?);
    }
    lab.wall_s = started.elapsed().as_secs_f64();
    lab.machine.load_average.1 = probes::load_average();

    // 4. The report.
    reading::recompute(&mut lab);
    let written = report::write(&lab, &out, perf_md.as_deref())?;
    println!("\n{}", report::summary(&lab));
    for w in written {
        println!("wrote {}", w.display());
    }
    println!("raw load lab reports: {}", ctx.runs.display());
    Ok(())
}

/// The plan the flags ask for: the full lab, `--quick`, or an experiment.
fn plan(args: &LabArgs) -> anyhow::Result<Plan> {
    let mut plan = Plan::new(args.quick);
    for p in &args.only {
        anyhow::ensure!(PHASES.contains(&p.as_str()), "unknown run {p:?}; known: {PHASES:?}");
    }
    if args.api_cpus != Millicores::QUARTER {
        // The calibration's rates scale with the CPU, so the capacity is found at any quota.
        let scale = args.api_cpus.cores() / quarter_core();
        plan.calibration_rps = plan.calibration_rps.iter().map(|r| (r * scale).round()).collect();
        plan.api_cpus = args.api_cpus.cores();
    }
    for v in &args.variants {
        anyhow::ensure!(VARIANTS.contains(&v.as_str()), "unknown variant {v:?}; known: {VARIANTS:?}");
    }
    if !args.variants.is_empty() {
        plan.variants.clone_from(&args.variants);
    }
    plan.given_capacity = args.capacity;
    plan.api_env.clone_from(&args.api_env);
    if !args.only.is_empty() {
        plan.phases = PHASES.iter().filter(|p| args.only.iter().any(|o| o == *p)).map(|p| (*p).to_owned()).collect();
    }
    Ok(plan)
}

/// `--from-json`: the report again from a saved run, measuring nothing.
fn from_json(json: &Path, args: &LabArgs, out: PathBuf, perf_md: Option<PathBuf>) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let lab = LabRecord::from_json(&text, &json.display().to_string())?;
    // A saved experiment is still an experiment: never into docs/PERFORMANCE.md.
    let (out, perf_md) = if lab.plan.is_experiment() && args.out.is_none() {
        let custom = services::root().join("target/lab-custom");
        std::fs::create_dir_all(&custom)?;
        (custom, None)
    } else {
        (out, perf_md)
    };
    let written = report::write(&lab, &out, perf_md.as_deref())?;
    println!("{}", report::summary(&lab));
    for w in written {
        println!("wrote {}", w.display());
    }
    Ok(())
}

/// Whether the production shape is available: full runs need it; quick runs say so loudly and
/// go on (`Err` holds why the API runs unpinned).
fn pinning(args: &LabArgs) -> anyhow::Result<Result<(), String>> {
    let limits = Limits::new(args.api_cpus, 100_000, MEMORY)?;
    match Pinned::create(limits) {
        Ok(p) => {
            log(&format!("the API runs pinned: {}", p.describe()));
            Ok(Ok(()))
        }
        Err(e) if args.quick => {
            eprintln!(
                "\nlab: WARNING: cannot pin the API ({e:#}).\nlab: WARNING: --quick goes on UNPINNED: its figures \
                 are not at the production shape, and the report says so.\n"
            );
            Ok(Err(format!("{e:#}")))
        }
        Err(e) => Err(
            e.context(format!("the lab pins the API at {} core / 512 MiB (run as root with cgroups)", args.api_cpus))
        ),
    }
}

/// The binaries built, the template seeded, the tokens written: the context of every run, and
/// the record the runs fill in.
async fn prepare(
    args: &LabArgs,
    plan: &Plan,
    pinning: Result<(), String>,
    runs_dir: PathBuf,
) -> anyhow::Result<(Ctx, LabRecord)> {
    let root = services::root();
    let server = services::ensure_postgres(&services::database_url()).await?;
    let database = args
        .database
        .clone()
        .unwrap_or_else(|| if args.quick { "breakwater_lab_quick".into() } else { "breakwater_lab".into() });
    // The seeded database is a template, never served: each run against the API gets a fresh
    // copy of it, so every run starts from the same rows (journeys write replies and move open
    // conversations to pending, which would otherwise drain the inboxes run after run).
    let served = format!("{database}_run");
    let db_url = services::with_database(&server, &served);
    // A full run measures release builds. A quick run asserts nothing about speed: it uses debug
    // builds, which reuse what `cargo test` just compiled in CI.
    let bin = root.join(if args.quick { "target/debug" } else { "target/release" });
    if !args.no_build {
        build(&root, args.quick)?;
    }
    let seed = seed(&bin, &server, &database, args.quick).await?;
    let tokens = tokens(&services::with_database(&server, &database), &runs_dir, plan.noisy_factor).await?;
    log(&format!("{} tenants, the heaviest at {:.0}% of the traffic", tokens.tenants, tokens.top_share * 100.0));

    let lab = LabRecord {
        schema: record::SCHEMA.into(),
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        machine: Machine::read(pinning.as_ref().err().cloned()),
        commit: commit(&root),
        seed,
        database: database.clone(),
        plan: plan.clone(),
        capacity: None,
        variants: Vec::new(),
        noisy_tenant_share: tokens.top_share,
        refusal_cost: None,
        wall_s: 0.0,
    };
    let ctx = Ctx {
        template: database,
        bin,
        db_url,
        server,
        runs: runs_dir,
        port: args.port,
        plan: plan.clone(),
        tokens,
        pin: pinning.is_ok(),
        cpus: args.api_cpus,
    };
    Ok((ctx, lab))
}

/// Builds the API, the seeder, the load lab and the canned refusal (debug builds for `--quick`).
fn build(root: &Path, quick: bool) -> anyhow::Result<()> {
    log(&format!(
        "building the {} binaries (api, seed, loadlab, the canned refusal)",
        if quick { "debug" } else { "release" }
    ));
    let profile = if quick { None } else { Some("--release") };
    let status = std::process::Command::new(services::cargo())
        .args(["build", "-p", "breakwater-api", "-p", "breakwater-seed", "-p", "breakwater-loadlab"])
        .args(profile)
        .args(["--bin", "breakwater-api", "--bin", "breakwater-seed", "--bin", "loadlab"])
        .args(["--example", "canned_refusal"])
        .current_dir(root)
        .status()?;
    anyhow::ensure!(status.success(), "the build failed");
    Ok(())
}

/// The capacity the ramps are scaled to: given with `--capacity`, or calibrated once against the
/// adaptive variant.
async fn capacity(ctx: &Ctx) -> anyhow::Result<Capacity> {
    Ok(match ctx.plan.given_capacity {
        Some(rps) => Capacity { rps, how: "given with --capacity, not measured".into(), calibration: Vec::new() },
        None => {
            let cal = ctx.phase(Spec::api("adaptive", "calibrate", ctx.profile("lab-calibrate", None))).await?;
            Capacity::from_calibration(&cal, ctx.plan.quick)?
        }
    })
}

/// What a refusal costs: the API refusing everything, and a bare hyper server's canned 503, on
/// kept-alive and on new connections.
async fn refusal_cost(ctx: &Ctx) -> anyhow::Result<RefusalCost> {
    let mut cost = RefusalCost::default();
    for (server, name) in [(Server::Api, "api"), (Server::Floor, "floor")] {
        for new_connections in [false, true] {
            let phase = format!("refusals-{}", if new_connections { "new-connections" } else { "kept-alive" });
            let spec = Spec { server, ..Spec::api(name, &phase, Load::Refusals { new_connections }) };
            let run = ctx.phase(spec).await?;
            cost.record(name, new_connections, reading::rows(&run, None).into_iter().next());
        }
    }
    Ok(cost)
}

/// One variant's runs: the sweeps, the ramps, the capacity change, the noisy neighbour, the flood.
async fn variant_runs(ctx: &Ctx, args: &LabArgs, variant: &str, capacity: f64) -> anyhow::Result<Variant> {
    let plan = &ctx.plan;
    let mut v = Variant { name: variant.into(), ..Variant::default() };
    let mut done = Vec::new();
    let weighted = ctx.tokens.path.clone();
    let one = ctx.tokens.one_path.clone();
    for (phase, tokens, honour) in
        [("sweep", &weighted, false), ("sweep-honouring", &weighted, true), ("sweep-one", &one, false)]
    {
        if plan.runs(phase) {
            let run = ctx.phase(Spec::api(variant, phase, Load::Sweep { tokens: tokens.clone(), honour })).await?;
            let rows = reading::rows(&run, None);
            match phase {
                "sweep" => v.sweep = rows,
                "sweep-honouring" => v.sweep_honouring = rows,
                _ => v.sweep_one = rows,
            }
            done.push(run);
        }
    }
    for (phase, profile, tokens, honour) in [
        ("ramp", "lab-ramp", &weighted, false),
        ("ramp-one", "lab-ramp", &one, false),
        ("ramp-honouring", "lab-ramp-honouring", &weighted, true),
    ] {
        if plan.runs(phase) {
            let load = Load::Profile { name: profile, capacity: Some(capacity), tokens: tokens.clone(), honour };
            let run = ctx.phase(Spec::api(variant, phase, load)).await?;
            let rows = reading::rows(&run, Some(capacity));
            match phase {
                "ramp" => v.ramp = rows,
                "ramp-one" => v.ramp_one = rows,
                _ => v.ramp_honouring = rows,
            }
            done.push(run);
        }
    }
    if plan.runs("change") {
        let slowdown = if ctx.pin {
            Slowdown::Cap(args.db_cpus)
        } else {
            Slowdown::Burn(Burn::new(args.burners.max(1) / if plan.quick { 2 } else { 1 }))
        };
        let load = ctx.profile("lab-capacity-change", Some(capacity));
        let change =
            ctx.phase(Spec { slowdown: Some(slowdown), ..Spec::api(variant, "capacity-change", load) }).await?;
        v.change = reading::change(&change);
        done.push(change);
    }
    if plan.runs("noisy") {
        let load =
            Load::Profile { name: "lab-noisy", capacity: None, tokens: ctx.tokens.noisy_path.clone(), honour: false };
        let noisy = ctx.phase(Spec { throttles: Throttles::Tenants, ..Spec::api(variant, "noisy", load) }).await?;
        v.noisy = Noisy::from_run(&noisy, &ctx.tokens.noisy_tenant);
        done.push(noisy);
    }
    if plan.runs("flood") {
        let rate = (capacity * plan.flood_share).max(1.0);
        let spec = Spec { throttles: Throttles::Flood, ..Spec::api(variant, "flood", Load::Flood { rate }) };
        let flood = ctx.phase(spec).await?;
        v.flood = Flood::from_run(&flood, &ctx.tokens.noisy_tenant, rate);
        done.push(flood);
    }
    v.peak_rss_bytes = done.iter().filter_map(|p| p.cgroup_peak).max();
    v.oom_kills = done.iter().map(|p| p.cgroup_oom_kills).sum();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_capacity_is_a_rate_and_makes_an_experiment() {
        assert_eq!(parse_capacity("1200"), Ok(1200.0));
        for bad in ["0", "0.5", "-3", "NaN", "inf", "fast"] {
            assert!(parse_capacity(bad).is_err(), "{bad}");
        }
        let mut plan = Plan::new(false);
        plan.given_capacity = Some(1200.0);
        assert!(plan.is_experiment(), "never into docs/PERFORMANCE.md");
        let old: Plan = serde_json::from_value({
            let mut v = serde_json::to_value(Plan::new(false)).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.remove("given_capacity");
            }
            v
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!old.is_experiment(), "a lab.json from before --capacity");
    }
}
