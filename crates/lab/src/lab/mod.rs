//! `cargo xtask lab`: the headline experiment in one command (docs/PERFORMANCE.md, "The lab").
//!
//! Builds the release binaries, seeds its own database (reused while the seed parameters match),
//! then, for each admission variant (`off`, `static` 80, `adaptive`), starts the API alone in a
//! cgroup at the production task's shape (0.25 core, 512 MiB) and drives it with the `loadlab`
//! binary from outside the cgroup: the closed-loop sweep, an open-loop ramp from 0.25x to 10x the
//! measured capacity over the full request mix, a capacity-change run (a competing load on
//! PostgreSQL mid-run) and a noisy-neighbour run. Beside the load lab's own server samples it
//! samples the cgroup's throttling counters, PostgreSQL's CPU, the machine's CPU and `/health`,
//! so that every step says what saturated. The report is written by `lab_report`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use breakwater_loadlab::report::Report;
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::plan::{PHASES, Plan, VARIANTS, quarter_core};
use crate::record::reading;
use crate::record::{
    self, BurnRecord, Capacity, DbCapRecord, Flood, LabRecord, Machine, Noisy, PhaseRun, RefusalCost, Variant, XSample,
};
use crate::report;
use crate::rig::pinned::{Limits, Millicores, Pinned};
use crate::rig::services;

mod probes;

/// Options of `cargo xtask lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// A few minutes in all (small seed, short steps, fewer points): a smoke check for CI that
    /// asserts nothing about speed. Writes under target/ unless --out is given.
    #[arg(long)]
    quick: bool,
    /// Where the report, charts and JSON go [default: docs/PERFORMANCE.md's section and docs/lab/
    /// for a full run, target/lab-quick/ for --quick]. Raw load lab reports go to OUT/runs/
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
}

fn parse_capacity(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rps) if rps.is_finite() && rps >= 1.0 => Ok(rps),
        _ => Err(format!("{s:?} is not a rate of at least 1 request per second")),
    }
}

/// The API's CPU quota and memory limit: the production task (Fargate 256 CPU units, 512 MiB).
const MEMORY: u64 = 512 << 20;
/// Seed parameters of each preset; the database is reused while its comment matches.
const SEED_FULL: &str = "breakwater-seed full default (50 tenants, 400000 conversations, 2000000 messages, skew 0.55, seed 1; a template, never served)";
const SEED_SMALL: &str = "breakwater-seed --small (5 tenants, 2000 conversations, 10000 messages, skew 0.55, seed 1; a template, never served)";

fn log(msg: &str) {
    eprintln!("lab: {msg}");
}

pub async fn run(args: LabArgs) -> anyhow::Result<()> {
    let started = Instant::now();
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
    if !args.only.is_empty() {
        plan.phases = PHASES.iter().filter(|p| args.only.iter().any(|o| o == *p)).map(|p| (*p).to_owned()).collect();
    }
    let experiment = plan.is_experiment();
    let runs = |p: &str| plan.phases.iter().any(|x| x == p);
    let root = services::root();
    let (out, runs_dir, docs) = match (&args.out, args.quick) {
        (Some(o), _) => (o.clone(), o.join("runs"), false),
        (None, _) if experiment => (root.join("target/lab-custom"), root.join("target/lab-custom/runs"), false),
        (None, true) => (root.join("target/lab-quick"), root.join("target/lab-quick/runs"), false),
        (None, false) => (root.join("docs/lab"), root.join("target/lab/runs"), true),
    };
    std::fs::create_dir_all(&out)?;
    let perf_md = docs.then(|| root.join("docs/PERFORMANCE.md"));
    if let Some(json) = &args.from_json {
        let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
        let lab = LabRecord::from_json(&text, &json.display().to_string())?;
        // A saved experiment is still an experiment: never into docs/PERFORMANCE.md.
        let (out, perf_md) = if lab.plan.is_experiment() && args.out.is_none() {
            let custom = root.join("target/lab-custom");
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
        return Ok(());
    }
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;

    // Is the production shape available? Full runs need it; quick runs say so loudly and go on.
    let limits = Limits::new(args.api_cpus, 100_000, MEMORY)?;
    let pinning = match Pinned::create(limits) {
        Ok(p) => {
            log(&format!("the API runs pinned: {}", p.describe()));
            Ok(())
        }
        Err(e) if args.quick => {
            eprintln!(
                "\nlab: WARNING: cannot pin the API ({e:#}).\nlab: WARNING: --quick goes on UNPINNED: its figures \
                 are not at the production shape, and the report says so.\n"
            );
            Err(format!("{e:#}"))
        }
        Err(e) => {
            return Err(e.context(format!(
                "the lab pins the API at {} core / 512 MiB (run as root with cgroups)",
                args.api_cpus
            )));
        }
    };

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
    let (profile, bin) =
        if args.quick { (None, root.join("target/debug")) } else { (Some("--release"), root.join("target/release")) };
    if !args.no_build {
        log(&format!(
            "building the {} binaries (api, seed, loadlab, the canned refusal)",
            if args.quick { "debug" } else { "release" }
        ));
        let status = std::process::Command::new(services::cargo())
            .args(["build", "-p", "breakwater-api", "-p", "breakwater-seed", "-p", "breakwater-loadlab"])
            .args(profile)
            .args(["--bin", "breakwater-api", "--bin", "breakwater-seed", "--bin", "loadlab"])
            .args(["--example", "canned_refusal"])
            .current_dir(&root)
            .status()?;
        anyhow::ensure!(status.success(), "the build failed");
    }
    let seed = seed(&bin, &server, &database, args.quick).await?;
    let tokens = tokens(&services::with_database(&server, &database), &runs_dir, plan.noisy_factor).await?;
    log(&format!("{} tenants, the heaviest at {:.0}% of the traffic", tokens.tenants, tokens.top_share * 100.0));

    let mut lab = LabRecord {
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
    let pin = pinning.is_ok();
    let ctx = Ctx {
        template: database.clone(),
        bin,
        db_url,
        server: server.clone(),
        runs: runs_dir,
        port: args.port,
        plan: plan.clone(),
        tokens,
        pin,
        cpus: args.api_cpus,
    };

    // 1. The capacity, once: a short absolute-rate ramp against the adaptive variant. (The
    // noisy-neighbour and flood rates depend on it: the profiles file is written again below.)
    std::fs::write(ctx.runs.join("profiles.toml"), plan.profiles(1.0, 1.0))?;
    let capacity = match plan.given_capacity {
        Some(rps) => Capacity { rps, how: "given with --capacity, not measured".into(), calibration: Vec::new() },
        None => {
            let cal = ctx.phase(Spec::api("adaptive", "calibrate", ctx.profile("lab-calibrate", None))).await?;
            Capacity::from_calibration(&cal, plan.quick)?
        }
    };
    log(&format!("capacity {:.0} req/s ({})", capacity.rps, capacity.how));
    lab.capacity = Some(capacity.clone());
    let noisy_rps = ctx.tokens.noisy_rps(capacity.rps * plan.noisy_base, plan.noisy_factor);
    let others_rps = capacity.rps * plan.noisy_base * (1.0 - ctx.tokens.top_share);
    std::fs::write(ctx.runs.join("profiles.toml"), plan.profiles(noisy_rps, others_rps))?;

    // 2. What a refusal costs: the API refusing everything, and a bare hyper server's canned 503.
    if runs("refusals") {
        let mut cost = RefusalCost::default();
        for (server, name) in [(Server::Api, "api"), (Server::Floor, "floor")] {
            for new_connections in [false, true] {
                let phase = format!("refusals-{}", if new_connections { "new-connections" } else { "kept-alive" });
                let spec = Spec { server, ..Spec::api(name, &phase, Load::Refusals { new_connections }) };
                let run = ctx.phase(spec).await?;
                cost.record(name, new_connections, reading::rows(&run, None).into_iter().next());
            }
        }
        lab.refusal_cost = Some(cost);
    }

    // 3. Each variant: the sweeps, the ramps, the capacity change, the noisy neighbour, the flood.
    for variant in plan.variants.iter().map(String::as_str) {
        let mut v = Variant { name: variant.into(), ..Variant::default() };
        let mut done = Vec::new();
        let weighted = ctx.tokens.path.clone();
        let one = ctx.tokens.one_path.clone();
        for (phase, tokens, honour) in
            [("sweep", &weighted, false), ("sweep-honouring", &weighted, true), ("sweep-one", &one, false)]
        {
            if runs(phase) {
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
            if runs(phase) {
                let load =
                    Load::Profile { name: profile, capacity: Some(capacity.rps), tokens: tokens.clone(), honour };
                let run = ctx.phase(Spec::api(variant, phase, load)).await?;
                let rows = reading::rows(&run, Some(capacity.rps));
                match phase {
                    "ramp" => v.ramp = rows,
                    "ramp-one" => v.ramp_one = rows,
                    _ => v.ramp_honouring = rows,
                }
                done.push(run);
            }
        }
        if runs("change") {
            let slowdown = if ctx.pin {
                Slowdown::Cap(args.db_cpus)
            } else {
                Slowdown::Burn(Burn::new(args.burners.max(1) / if plan.quick { 2 } else { 1 }))
            };
            let load = ctx.profile("lab-capacity-change", Some(capacity.rps));
            let change =
                ctx.phase(Spec { slowdown: Some(slowdown), ..Spec::api(variant, "capacity-change", load) }).await?;
            v.change = reading::change(&change);
            done.push(change);
        }
        if runs("noisy") {
            let load = Load::Profile {
                name: "lab-noisy",
                capacity: None,
                tokens: ctx.tokens.noisy_path.clone(),
                honour: false,
            };
            let noisy = ctx.phase(Spec { throttles: Throttles::Tenants, ..Spec::api(variant, "noisy", load) }).await?;
            v.noisy = Noisy::from_run(&noisy, &ctx.tokens.noisy_tenant);
            done.push(noisy);
        }
        if runs("flood") {
            let rate = (capacity.rps * plan.flood_share).max(1.0);
            let spec = Spec { throttles: Throttles::Flood, ..Spec::api(variant, "flood", Load::Flood { rate }) };
            let flood = ctx.phase(spec).await?;
            v.flood = Flood::from_run(&flood, &ctx.tokens.noisy_tenant, rate);
            done.push(flood);
        }
        v.peak_rss_bytes = done.iter().filter_map(|p| p.cgroup_peak).max();
        v.oom_kills = done.iter().map(|p| p.cgroup_oom_kills).sum();
        lab.variants.push(v);
    }
    lab.wall_s = started.elapsed().as_secs_f64();
    lab.machine.load_average.1 = probes::load_average();

    // 3. The report.
    reading::recompute(&mut lab);
    let written = report::write(&lab, &out, perf_md.as_deref())?;
    println!("\n{}", report::summary(&lab));
    for w in written {
        println!("wrote {}", w.display());
    }
    println!("raw load lab reports: {}", ctx.runs.display());
    Ok(())
}

/// Which throttles the API runs with.
#[derive(Debug, Clone, Copy)]
enum Throttles {
    /// Off: the admission comparison is not confounded by per-tenant limits.
    Off,
    /// On, per tenant at the API's default; per IP and per user set out of reach (all load comes
    /// from one address, and each tenant's traffic from a few users).
    Tenants,
    /// On, every limit out of reach but the flooding tenant's own (its plan, set in the database).
    Flood,
}

/// What drives a run.
enum Load {
    /// The closed-loop sweep over the inbox and contacts lists.
    Sweep { tokens: PathBuf, honour: bool },
    /// A profile of the profiles file.
    Profile { name: &'static str, capacity: Option<f64>, tokens: PathBuf, honour: bool },
    /// One tenant's closed loop over its throttle (`rate` a second, as much burst) beside the
    /// others' normal open loop.
    Flood { rate: f64 },
    /// Closed-loop callers against a server that refuses everything.
    Refusals { new_connections: bool },
}

/// What answers a run.
#[derive(Debug, Clone, Copy)]
enum Server {
    Api,
    /// The canned refusal: a bare hyper server's 503, the floor of a refusal's cost.
    Floor,
}

/// One run.
struct Spec<'a> {
    variant: &'a str,
    phase: &'a str,
    server: Server,
    throttles: Throttles,
    load: Load,
    slowdown: Option<Slowdown>,
}

impl<'a> Spec<'a> {
    /// The API with `variant`, throttles off, no slowdown.
    fn api(variant: &'a str, phase: &'a str, load: Load) -> Self {
        Self { variant, phase, server: Server::Api, throttles: Throttles::Off, load, slowdown: None }
    }
}

/// The API's environment at the production task's size (the CloudFormation stack's 256-512
/// tier): one runtime thread and the accept rate it sets there.
const PRODUCTION_TIER: [(&str, &str); 2] = [("TOKIO_WORKER_THREADS", "1"), ("MAX_ACCEPT_RATE", "2000")];

struct Ctx {
    /// The seeded database each run's copy is made from.
    template: String,
    bin: PathBuf,
    db_url: String,
    server: String,
    runs: PathBuf,
    port: u16,
    plan: Plan,
    tokens: TokenSet,
    /// Whether the API runs pinned (always, except a quick run on a host without cgroups).
    pin: bool,
    /// The API's CPU quota when pinned.
    cpus: Millicores,
}

impl Ctx {
    /// (Re)creates the served database as a copy of the seeded `template`.
    async fn fresh_copy(&self, template: &str) -> anyhow::Result<()> {
        let t = Instant::now();
        let served = services::database_name(&self.db_url);
        let admin =
            PgPoolOptions::new().max_connections(1).connect(&services::with_database(&self.server, "postgres")).await?;
        let q = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", q(&served))).execute(&admin).await?;
        sqlx::raw_sql(&format!("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY", q(&served), q(template)))
            .execute(&admin)
            .await
            .with_context(|| format!("copying {template} (nothing may be connected to it)"))?;
        admin.close().await;
        log(&format!("fresh copy `{served}` of `{template}` in {:.1} s", t.elapsed().as_secs_f64()));
        Ok(())
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The API's ops listener, on the port after the public one.
    fn ops_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port + 1)
    }

    /// A profile run with the weighted tokens, not honouring `Retry-After`.
    fn profile(&self, name: &'static str, capacity: Option<f64>) -> Load {
        Load::Profile { name, capacity, tokens: self.tokens.path.clone(), honour: false }
    }

    /// The load lab's command for one load: its arguments, the sampling and the output.
    fn loadlab(&self, load: &Load, server: Server, pid: u32, out: &Path) -> Vec<tokio::process::Command> {
        let p = &self.plan;
        let base = self.base();
        let ops = self.ops_base();
        let ms = |s: f64| format!("{}ms", (s * 1000.0).round());
        let lists = [format!("{base}/v1/conversations?status=open&limit=25"), format!("{base}/v1/contacts?limit=25")];
        let sweep = |callers: &[usize], step_s: f64, tokens: &Path, extra: &[&str]| {
            let mut ll = tokio::process::Command::new(self.bin.join("loadlab"));
            let callers: Vec<String> = callers.iter().map(ToString::to_string).collect();
            ll.arg("sweep").args(["--url", &lists[0]]).args(["--url", &lists[1]]);
            ll.args(["--concurrency", &callers.join(",")]).args(["--step", &ms(step_s)]);
            ll.args(["--pause", &ms(p.pause_s)]).arg("--tokens").arg(tokens).args(extra);
            if matches!(server, Server::Api) {
                ll.args(["--ops-url", &format!("{ops}/v1/ops/status")]);
            }
            ll
        };
        let profile = |name: &str, capacity: Option<f64>, tokens: &Path, honour: bool| {
            let mut ll = tokio::process::Command::new(self.bin.join("loadlab"));
            ll.args(["profile", name, "--base", &base, "--ops-base", &ops])
                .arg("--profiles")
                .arg(self.runs.join("profiles.toml"));
            if let Some(c) = capacity {
                ll.args(["--capacity", &format!("{c:.1}")]);
            }
            ll.args(["--headroom", "1", "--server-cpus", &self.cpus.to_string()]).arg("--tokens").arg(tokens);
            if honour {
                ll.arg("--honour-retry-after");
            }
            ll
        };
        let mut cmds = match load {
            Load::Sweep { tokens, honour } => {
                vec![sweep(
                    &p.sweep_callers,
                    p.sweep_step_s,
                    tokens,
                    if *honour { &["--honour-retry-after"] } else { &[] },
                )]
            }
            Load::Profile { name, capacity, tokens, honour } => vec![profile(name, *capacity, tokens, *honour)],
            // The others first: the phase's step ends are read from the first command's lines. They
            // skip the smoke stage: the flood starts with them and may fail `/ready` meanwhile (with
            // admission off, its load fills the database pool), and the path was checked in the
            // runs before.
            Load::Flood { .. } => {
                let mut others = profile("lab-flood-others", None, &self.tokens.others_path, false);
                others.arg("--no-smoke");
                vec![others, sweep(&[p.flood_callers], p.flood_step_s, &self.tokens.one_path, &[])]
            }
            Load::Refusals { new_connections } => {
                let extra: &[&str] = if *new_connections { &["--new-connection-per-request"] } else { &[] };
                vec![sweep(&[p.refusal_callers], p.refusal_step_s, &self.tokens.path, extra)]
            }
        };
        let interval = format!("{}ms", p.sample_interval_ms);
        let timeout = ms(p.timeout_s);
        for (i, ll) in cmds.iter_mut().enumerate() {
            let out = if i == 0 { out.to_path_buf() } else { out.with_extension(format!("{i}.json")) };
            ll.args(["--pid", &pid.to_string(), "--sample-interval", &interval, "--timeout", &timeout])
                .args(["--max-in-flight", &p.max_in_flight.to_string()])
                .arg("--out")
                .arg(out)
                .stdin(Stdio::null())
                .kill_on_drop(true);
        }
        cmds
    }

    /// Starts the server (pinned when it can be), runs one load against it, stops it.
    async fn phase(&self, spec: Spec<'_>) -> anyhow::Result<PhaseRun> {
        let Spec { variant, phase, server, throttles, load, slowdown } = spec;
        let name = format!("{variant}-{phase}");
        log(&format!("== {name} =="));
        if matches!(server, Server::Api) {
            self.fresh_copy(&self.template).await?;
        }
        if let Load::Flood { rate } = load {
            self.flood_plan(rate).await?;
        }
        let limits = Limits::new(self.cpus, 100_000, MEMORY)?;
        let pinned = if self.pin { Some(Pinned::create(limits)?) } else { None };
        let argv: Vec<std::ffi::OsString> = match server {
            Server::Api => vec![self.bin.join("breakwater-api").into(), "serve".into()],
            Server::Floor => vec![self.bin.join("examples/canned_refusal").into(), self.port.to_string().into()],
        };
        let mut cmd = match &pinned {
            Some(p) => p.command(&argv)?,
            None => {
                let mut c = tokio::process::Command::new(&argv[0]);
                c.args(&argv[1..]).process_group(0);
                c
            }
        };
        let api_log = std::fs::File::create(self.runs.join(format!("{name}.api.log")))?;
        cmd.envs(PRODUCTION_TIER)
            .env("DATABASE_URL", &self.db_url)
            .env("APP_ENV", "development")
            .env("BIND_ADDR", format!("127.0.0.1:{}", self.port))
            .env("OPS_ADDR", format!("127.0.0.1:{}", self.port + 1))
            .env("ADMISSION", variant)
            .env("ADMISSION_STATIC_LIMIT", "80")
            .env("SHUTDOWN_GRACE_SECS", "2")
            .env("LOG_FORMAT", "json")
            .env("THROTTLE_KEY_PREFIX", format!("bwlab{}", std::process::id()))
            .stdin(Stdio::null())
            .stdout(api_log.try_clone()?)
            .stderr(api_log)
            .kill_on_drop(true);
        if matches!(load, Load::Refusals { .. }) {
            // Every request refused at once: no slot, no queue, no hold.
            cmd.env("ADMISSION", "static")
                .env("ADMISSION_STATIC_LIMIT", "0")
                .env("ADMISSION_QUEUE", "0")
                .env("RETRY_HOLD_MAX_MS", "0");
        }
        let unreachable = [("THROTTLE_IP_RATE", "1000000"), ("THROTTLE_IP_BURST", "1000000")];
        let users = [("THROTTLE_USER_RATE", "1000000"), ("THROTTLE_USER_BURST", "1000000")];
        match throttles {
            Throttles::Off => {
                cmd.env("THROTTLES", "off");
            }
            Throttles::Tenants => {
                cmd.env("THROTTLES", "on").envs(unreachable).envs(users);
            }
            Throttles::Flood => {
                cmd.env("THROTTLES", "on").envs(unreachable).envs(users);
                cmd.env("THROTTLE_TENANT_RATE", "1000000").env("THROTTLE_TENANT_BURST", "1000000");
            }
        }
        let mut api = cmd.spawn().context("starting the server")?;
        let pid = api.id().context("the server exited at once")?;
        wait_healthy(self.port, &mut api).await?;

        let sampler = Sampler::start(self, pinned.as_ref(), Duration::from_millis(self.plan.sample_interval_ms)).await;
        let out = self.runs.join(format!("{name}.json"));
        let mut children = Vec::new();
        let mut lines = None;
        for (i, mut ll) in self.loadlab(&load, server, pid, &out).into_iter().enumerate() {
            let table = self.runs.join(format!("{name}{}.txt", if i == 0 { String::new() } else { format!(".{i}") }));
            ll.stdout(std::fs::File::create(&table)?);
            if i == 0 {
                ll.stderr(Stdio::piped());
            } else {
                ll.stderr(std::fs::File::create(table.with_extension("log"))?);
            }
            let mut child = ll.spawn().context("starting loadlab")?;
            if i == 0 {
                let stderr = child.stderr.take().context("loadlab's stderr")?;
                lines = Some(tokio::io::BufReader::new(stderr).lines());
            }
            children.push(child);
        }
        let mut lines = lines.context("no load")?;
        let mut step_ends = Vec::new();
        let mut slowing: Option<Slowing> = None;
        let mut slowed = None;
        while let Some(line) = lines.next_line().await? {
            eprintln!("  {line}");
            if !line.starts_with("step ") {
                continue;
            }
            step_ends.push(sampler.now());
            // The capacity-change run: slow PostgreSQL down after the first stage, recover after the second.
            if let Some(how) = slowdown {
                if step_ends.len() == 1 {
                    slowing = Some(Slowing::start(self, how).await?);
                } else if step_ends.len() == 2
                    && let Some(running) = slowing.take()
                {
                    slowed = Some(running.stop().await);
                }
            }
        }
        let mut statuses = Vec::new();
        for mut child in children {
            statuses.push(child.wait().await?);
        }
        if let Some(running) = slowing.take() {
            slowed = Some(running.stop().await);
        }
        let samples = sampler.stop().await;
        let cgroup = pinned.as_ref().map(Pinned::stats);
        stop(&mut api, pid).await;
        drop(pinned);
        for status in statuses {
            anyhow::ensure!(status.success(), "loadlab failed ({status}) in {name}: see the lines above");
        }
        let report = Report::read_json(&out)?;
        let flooder = match load {
            Load::Flood { .. } => Some(Report::read_json(&out.with_extension("1.json"))?),
            _ => None,
        };
        Ok(PhaseRun {
            name,
            report,
            flooder,
            step_ends,
            samples,
            cgroup_peak: cgroup.and_then(|c| c.peak_bytes),
            cgroup_oom_kills: cgroup.and_then(|c| c.oom_kills),
            burn: slowed.as_ref().and_then(|s| s.burn.clone()),
            db_cap: slowed.and_then(|s| s.cap),
        })
    }

    /// The flood's tenant (the heaviest) gets a plan of `rate` requests a second, as much burst,
    /// in the served copy: the API reads the plans at start.
    async fn flood_plan(&self, rate: f64) -> anyhow::Result<()> {
        let pool = PgPoolOptions::new().max_connections(1).connect(&self.db_url).await?;
        let tenant: uuid::Uuid = self.tokens.noisy_tenant.parse().context("the flood's tenant id")?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let burst = rate.round().max(1.0) as i32;
        sqlx::query("UPDATE tenants SET throttle_rate_per_sec = $1, throttle_burst = $2 WHERE id = $3")
            .bind(rate)
            .bind(burst)
            .bind(tenant)
            .execute(&pool)
            .await
            .context("setting the flooding tenant's plan")?;
        pool.close().await;
        Ok(())
    }
}

/// Waits for `/health` (up to 30 s) or fails if the API exits.
async fn wait_healthy(port: u16, api: &mut tokio::process::Child) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if health(port, Duration::from_millis(500)).await.is_some() {
            return Ok(());
        }
        if let Some(status) = api.try_wait()? {
            bail!("the API exited ({status}) before answering /health: see its log under the runs directory");
        }
        if Instant::now() > deadline {
            bail!("the API did not answer /health within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /health` on a fresh connection: its latency in ms when it answered 200 in time.
async fn health(port: u16, timeout: Duration) -> Option<f64> {
    let t = Instant::now();
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"GET /health HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n").await.ok()?;
        let mut buf = Vec::with_capacity(256);
        s.read_to_end(&mut buf).await.ok()?;
        buf.starts_with(b"HTTP/1.1 200").then_some(())
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten().map(|()| t.elapsed().as_secs_f64() * 1000.0)
}

/// SIGTERM, a few seconds' grace, then SIGKILL.
async fn stop(api: &mut tokio::process::Child, pid: u32) {
    if let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(8), api.wait()).await.is_err() {
        let _ = api.kill().await;
    }
}

/// Seeds `database` unless its comment says it already holds the same seed.
async fn seed(bin: &Path, server: &str, database: &str, quick: bool) -> anyhow::Result<String> {
    let wanted = if quick { SEED_SMALL } else { SEED_FULL };
    let admin = PgPoolOptions::new().max_connections(1).connect(&services::with_database(server, "postgres")).await?;
    let comment: Option<String> =
        sqlx::query_scalar("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1")
            .bind(database)
            .fetch_optional(&admin)
            .await?
            .flatten();
    if comment.as_deref() == Some(wanted) {
        log(&format!("`{database}` already holds {wanted}: reusing it"));
        return Ok(wanted.into());
    }
    log(&format!("seeding `{database}` with {wanted}"));
    let t = Instant::now();
    let url = services::with_database(server, database);
    let mut cmd = std::process::Command::new(bin.join("breakwater-seed"));
    cmd.args(["--reset", "--quiet"]).env("DATABASE_URL", &url);
    if quick {
        cmd.arg("--small");
    }
    let status = cmd.status().context("running breakwater-seed")?;
    anyhow::ensure!(status.success(), "seeding {database} failed");
    let quoted = format!("\"{}\"", database.replace('"', "\"\""));
    sqlx::raw_sql(&format!("COMMENT ON DATABASE {quoted} IS '{}'", wanted.replace('\'', "''"))).execute(&admin).await?;
    log(&format!("seeded in {:.0} s", t.elapsed().as_secs_f64()));
    Ok(wanted.into())
}

/// The tokens files: every seeded tenant weighted by its share of conversations (the seed's
/// skew), its traffic spread over up to eight of its users; and the same with the heaviest
/// tenant at `noisy_factor` times its share.
#[derive(Debug)]
struct TokenSet {
    path: PathBuf,
    noisy_path: PathBuf,
    /// The heaviest tenant's tokens alone: the one-tenant mix, and the flood.
    one_path: PathBuf,
    /// Every other tenant's: the tenants beside the flood.
    others_path: PathBuf,
    tenants: usize,
    top_share: f64,
    noisy_tenant: String,
}

impl TokenSet {
    /// The total rate of the noisy run: the others at `base_rps` x their share, the noisy tenant
    /// at `factor` x its share of `base_rps`.
    fn noisy_rps(&self, base_rps: f64, factor: f64) -> f64 {
        base_rps * (1.0 + (factor - 1.0) * self.top_share)
    }
}

async fn tokens(db_url: &str, runs: &Path, noisy_factor: f64) -> anyhow::Result<TokenSet> {
    let pool = PgPoolOptions::new().max_connections(1).connect(db_url).await?;
    let rows: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT t.id, (SELECT count(*) FROM conversations c WHERE c.tenant_id = t.id) FROM tenants t ORDER BY 2 DESC, 1",
    )
    .fetch_all(&pool)
    .await?;
    let total: i64 = rows.iter().map(|r| r.1).sum();
    anyhow::ensure!(total > 0, "the lab database holds no conversations");
    let mut lines = Vec::new();
    for (tenant, conversations) in &rows {
        let users: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT id FROM users WHERE tenant_id = $1 ORDER BY id LIMIT 8")
                .bind(tenant)
                .fetch_all(&pool)
                .await?;
        let share = *conversations as f64 / total as f64;
        for u in &users {
            lines.push(breakwater_loadlab::tokens::TokenLine {
                tenant_id: tenant.to_string(),
                user_id: u.to_string(),
                token: None,
                weight: share / users.len() as f64,
            });
        }
    }
    pool.close().await;
    let top = rows.first().context("no tenants")?;
    let top_share = top.1 as f64 / total as f64;
    let noisy_tenant = top.0.to_string();
    let write = |path: &Path, factor: f64, keep: &dyn Fn(&str) -> bool| -> anyhow::Result<()> {
        let mut text = String::new();
        for l in lines.iter().filter(|l| keep(&l.tenant_id)) {
            let mut l = l.clone();
            if l.tenant_id == noisy_tenant {
                l.weight *= factor;
            }
            text.push_str(&serde_json::to_string(&l)?);
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    };
    let path = runs.join("tokens.jsonl");
    let noisy_path = runs.join("tokens-noisy.jsonl");
    let one_path = runs.join("tokens-one-tenant.jsonl");
    let others_path = runs.join("tokens-others.jsonl");
    write(&path, 1.0, &|_| true)?;
    write(&noisy_path, noisy_factor, &|_| true)?;
    write(&one_path, 1.0, &|t| t == noisy_tenant)?;
    write(&others_path, 1.0, &|t| t != noisy_tenant)?;
    Ok(TokenSet { path, noisy_path, one_path, others_path, tenants: rows.len(), top_share, noisy_tenant })
}

fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head} (with uncommitted changes)") } else { head }
}

/// A competing load on PostgreSQL: connections each running CPU-heavy queries back to back.
#[derive(Debug, Clone, Copy)]
struct Burn {
    connections: usize,
}

impl Burn {
    fn new(connections: usize) -> Self {
        Self { connections: connections.max(1) }
    }
}

struct Burning {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(u64, Duration)>>,
}

struct BurnDone {
    queries: u64,
    mean_ms: Option<f64>,
}

/// One heavy query: a streamed (not materialised) series, hashed and summed: CPU only.
const BURN_SQL: &str = "SELECT sum(hashint8(g)) FROM (SELECT generate_series(1::bigint, 4000000) AS g) s";

impl Burning {
    async fn start(server: &str, connections: usize) -> anyhow::Result<Self> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = services::with_database(server, "postgres");
        let opts: sqlx::postgres::PgConnectOptions = url.parse()?;
        let opts = opts.application_name("breakwater-lab-burn").options([("statement_timeout", "5s")]);
        let max = u32::try_from(connections).unwrap_or(u32::MAX);
        let pool = PgPoolOptions::new().min_connections(max).max_connections(max).connect_with(opts).await?;
        let mut tasks = Vec::new();
        for _ in 0..connections {
            let stop = Arc::clone(&stop);
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                let (mut n, mut spent) = (0u64, Duration::ZERO);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let t = Instant::now();
                    if sqlx::query(BURN_SQL).execute(&pool).await.is_err() {
                        break;
                    }
                    n += 1;
                    spent += t.elapsed();
                }
                (n, spent)
            }));
        }
        Ok(Self { stop, tasks })
    }

    async fn stop(self) -> BurnDone {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut queries, mut spent) = (0, Duration::ZERO);
        for t in self.tasks {
            if let Ok((n, s)) = t.await {
                queries += n;
                spent += s;
            }
        }
        let mean_ms = (queries > 0).then(|| spent.as_secs_f64() * 1000.0 / queries as f64);
        BurnDone { queries, mean_ms }
    }
}

/// How the capacity-change run slows PostgreSQL down.
#[derive(Debug, Clone, Copy)]
enum Slowdown {
    /// The API database's backends under a CPU quota of this many cores.
    Cap(Millicores),
    /// Competing CPU-heavy queries (without cgroups).
    Burn(Burn),
}

/// A slowdown in force.
enum Slowing {
    Capped(DbCap),
    Burning(Burn, Burning),
}

/// What a slowdown did, for the report.
struct Slowed {
    burn: Option<BurnRecord>,
    cap: Option<DbCapRecord>,
}

impl Slowing {
    async fn start(ctx: &Ctx, how: Slowdown) -> anyhow::Result<Self> {
        Ok(match how {
            Slowdown::Cap(cpus) => {
                let cap = DbCap::start(ctx, cpus).await?;
                log(&format!(
                    "slowing PostgreSQL down: the API database's {} backends under a quota of {cpus} cores \
                     (and those it opens meanwhile)",
                    lock(&cap.state).adopted.len()
                ));
                Self::Capped(cap)
            }
            Slowdown::Burn(b) => {
                log(&format!("slowing PostgreSQL down: {} connections of competing load", b.connections));
                Self::Burning(b, Burning::start(&ctx.server, b.connections).await?)
            }
        })
    }

    async fn stop(self) -> Slowed {
        match self {
            Self::Capped(cap) => {
                let record = cap.stop();
                log(&format!(
                    "PostgreSQL's quota lifted ({} backends were put under it, throttled in {:.0}% of periods)",
                    record.backends,
                    record.throttled_share * 100.0
                ));
                Slowed { burn: None, cap: Some(record) }
            }
            Self::Burning(b, running) => {
                let done = running.stop().await;
                log(&format!("competing load stopped ({} heavy queries ran)", done.queries));
                let burn =
                    BurnRecord { connections: b.connections, queries: done.queries, mean_query_ms: done.mean_ms };
                Slowed { burn: Some(burn), cap: None }
            }
        }
    }
}

/// The backends serving the API's database, moved under a CPU quota: a database server that
/// lost most of its CPU to something else, reproducible on one machine. Backends the API's pool
/// opens meanwhile are moved too (a watcher looks every 200 ms), or the pool would grow around
/// the quota. Dropping it puts every backend back; the cgroup is removed only when it is empty
/// (its removal kills what is left, and a killed backend would restart the whole server).
struct DbCap {
    cpus: Millicores,
    started: Instant,
    state: Arc<Mutex<CapState>>,
    watcher: tokio::task::JoinHandle<()>,
}

struct CapState {
    adopted: Vec<crate::rig::pinned::Adopted>,
    group: Option<Pinned>,
    /// A backend that could not be moved (and still runs): the run stops with it.
    failed: Option<String>,
}

impl CapState {
    fn adopt_new(&mut self, pids: &[i32]) {
        for &pid in pids {
            let Ok(pid) = u32::try_from(pid) else { continue };
            if self.adopted.iter().any(|a| a.pid == pid) {
                continue;
            }
            let Some(group) = &self.group else { return };
            if let Err(e) = group.adopt_cpu(pid, &mut self.adopted)
                // A backend that ended meanwhile (a connection the pool closed) is not an error.
                && Path::new("/proc").join(pid.to_string()).exists()
            {
                self.failed.get_or_insert(format!("moving PostgreSQL backend {pid} under the quota: {e:#}"));
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The backends connected to `database`, except the asking one.
async fn backends(admin: &sqlx::PgPool, database: &str) -> anyhow::Result<Vec<i32>> {
    Ok(sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(database)
        .fetch_all(admin)
        .await?)
}

impl DbCap {
    async fn start(ctx: &Ctx, cpus: Millicores) -> anyhow::Result<Self> {
        let served = services::database_name(&ctx.db_url);
        let admin =
            PgPoolOptions::new().max_connections(1).connect(&services::with_database(&ctx.server, "postgres")).await?;
        let pids = backends(&admin, &served).await?;
        // Memory is not what this limits: the group's limit is far above a backend's use.
        let group = Pinned::create(Limits::new(cpus, 100_000, 64 << 30)?)?;
        let state = Arc::new(Mutex::new(CapState { adopted: Vec::new(), group: Some(group), failed: None }));
        let watched = Arc::clone(&state);
        let mut cap = Self { cpus, started: Instant::now(), state, watcher: tokio::spawn(async {}) };
        {
            let mut st = lock(&cap.state);
            st.adopt_new(&pids);
            if let Some(e) = st.failed.take() {
                bail!(e);
            }
            anyhow::ensure!(!st.adopted.is_empty(), "no PostgreSQL backend serves `{served}`: nothing to slow down");
        }
        cap.watcher = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(pids) = backends(&admin, &served).await {
                    lock(&watched).adopt_new(&pids);
                }
            }
        });
        Ok(cap)
    }

    fn stop(self) -> DbCapRecord {
        self.watcher.abort();
        let (stats, backends) = {
            let st = lock(&self.state);
            if let Some(e) = &st.failed {
                eprintln!("lab: {e}");
            }
            (st.group.as_ref().map(Pinned::stats).unwrap_or_default(), st.adopted.len())
        };
        let elapsed = self.started.elapsed().as_secs_f64();
        DbCapRecord {
            cpus: self.cpus.cores(),
            backends,
            throttled_share: stats.throttled_ratio(),
            cpu_cores: stats.usage_us.map(|us| us as f64 / 1e6 / elapsed.max(1e-9)),
        }
        // Dropping `self` puts the backends back.
    }
}

impl Drop for DbCap {
    fn drop(&mut self) {
        self.watcher.abort();
        let mut st = lock(&self.state);
        for a in st.adopted.drain(..) {
            if let Err(e) = a.restore() {
                eprintln!("lab: could not move PostgreSQL backend {} back to its cgroup: {e:#}", a.pid);
            }
        }
        if let Some(group) = st.group.take() {
            let left = group.cpu_procs();
            if left.is_empty() {
                drop(group);
            } else {
                eprintln!("lab: processes {left:?} are still in the database's cgroup: left in place, not killed");
                std::mem::forget(group);
            }
        }
    }
}

/// Samples what the load lab cannot see from outside: the cgroup's counters, PostgreSQL's and
/// the machine's CPU, the lab database's active backends and `/health`.
struct Sampler {
    t0: Instant,
    samples: Arc<Mutex<Vec<XSample>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    async fn start(ctx: &Ctx, pinned: Option<&Pinned>, every: Duration) -> Self {
        let t0 = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let cgroup = pinned.map(Pinned::counters);
        let port = ctx.port;
        let database = services::database_name(&ctx.db_url);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&services::with_database(&ctx.server, "postgres"))
            .await
            .ok();
        let out = Arc::clone(&samples);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let t_s = t0.elapsed().as_secs_f64();
                let health_ms = health(port, Duration::from_secs(1)).await;
                let pg_active = match &pool {
                    Some(p) => sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND state = 'active'",
                    )
                    .bind(&database)
                    .fetch_one(p)
                    .await
                    .ok(),
                    None => None,
                };
                let s = XSample {
                    t_s,
                    cgroup: cgroup.as_ref().map(crate::rig::pinned::Counters::read),
                    postgres_cpu_s: probes::postgres_cpu_seconds(),
                    machine: probes::machine_jiffies(),
                    pg_active,
                    health_ms,
                };
                if let Ok(mut v) = out.lock() {
                    v.push(s);
                }
            }
        });
        Self { t0, samples, stop, task }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    async fn stop(self) -> Vec<XSample> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
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
