//! `cargo xtask fleet`: API tasks, each pinned at the production shape, behind HAProxy configured
//! as the stack's ALB and target group, scaled by a copy of the stack's CPU target tracking, all
//! sharing one PostgreSQL (the seed) and one Redis, with one worker; a steady load, a surge and
//! the way back, per admission variant. What it measures is the minute a new task takes to
//! start: the report (docs/PERFORMANCE.md, the fleet section) says what each second saw.

pub(crate) mod autoscaler;
mod capacity;
mod costs;
pub(crate) mod haproxy;
mod processes;
pub(crate) mod record;
pub(crate) mod stack;
mod throttles;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use self::autoscaler::{Autoscaler, Event, Policy, TaskState};
use self::haproxy::Slot;
use self::processes::{Balancer, Launch, Proc};
use self::record::TaskSecond;
use crate::rig::pinned::{Limits, Millicores, Pinned};
use crate::rig::services;

#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// A short run (small seed, debug builds, phases of tens of seconds, health checks every
    /// 2 s): a check that the fleet works, not a measurement.
    #[arg(long)]
    quick: bool,
    /// Tasks at the start [default: the stack's ApiMinTasks].
    #[arg(long)]
    tasks: Option<u32>,
    /// The most tasks the autoscaler may run: this machine's two cores carry them, PostgreSQL,
    /// the balancer and the load generator [default: 3; the stack allows ApiMaxTasks].
    #[arg(long, default_value_t = 3)]
    max_tasks: u32,
    /// From a scale-out decision to the new task's process starting (image pull, container
    /// start), seconds [default: 60; 10 with --quick].
    #[arg(long)]
    start_delay: Option<u64>,
    /// Periods in a row over the target before a scale-out. The policy's high alarm in AWS
    /// wants 3 one-minute datapoints; 1 lets the new task join within the three-minute surge.
    #[arg(long, default_value_t = 1)]
    out_periods: u32,
    /// One task's capacity, req/s of the lab's mix [default: the last full lab's calibrated
    /// capacity, docs/lab/lab.json; 60 with --quick].
    #[arg(long)]
    capacity: Option<f64>,
    /// Admission variants of the surge, one fleet after the other.
    #[arg(long, value_delimiter = ',', default_value = "adaptive,off")]
    variants: Vec<String>,
    /// The experiments: `surge` (the autoscaling minute, per variant), `throttles` (the most
    /// tasks sharing one tenant's limit through Redis, then Redis killed halfway) and, only when
    /// asked, `capacity` (the lab's calibration through the balancer to one task, then to the
    /// most tasks).
    #[arg(long, value_delimiter = ',', default_value = "surge,throttles")]
    experiments: Vec<String>,
    /// The first of the ports the balancer and the tasks listen on (127.0.0.1).
    #[arg(long, default_value_t = 18_300)]
    port: u16,
    /// Use the binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Write the report again from a saved run (its fleet.json), measuring nothing.
    #[arg(long)]
    from_json: Option<std::path::PathBuf>,
}

/// The load's shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) capacity_one: f64,
    pub(crate) capacity_how: String,
    /// Multiples of two tasks' capacity.
    pub(crate) steady_x: f64,
    pub(crate) surge_x: f64,
    pub(crate) steady_s: u64,
    pub(crate) surge_s: u64,
    pub(crate) after_s: u64,
    /// Share of the load from clients that honour Retry-After.
    pub(crate) honour_share: f64,
    pub(crate) tasks: u32,
    pub(crate) max_tasks: u32,
    pub(crate) period_s: u64,
    pub(crate) out_periods: u32,
    pub(crate) start_delay_s: u64,
    pub(crate) health_interval_s: u64,
}

impl Plan {
    fn profiles(&self) -> String {
        format!(
            "# Written by `cargo xtask fleet`.\n\n[defaults]\nreader_share = 0.3\nthink_time = \"200ms\"\n\
             pause = \"0s\"\narrivals = \"poisson\"\n\n[profiles.fleet-surge]\n\
             description = \"Steady at {sx}x two tasks' capacity, a surge to {ux}x, then back.\"\nstages = [\n  \
             {{ name = \"steady\", duration = \"{a}s\", capacity = {sx} }},\n  \
             {{ name = \"surge\", duration = \"{b}s\", capacity = {ux} }},\n  \
             {{ name = \"after\", duration = \"{c}s\", capacity = {sx} }},\n]\n",
            sx = self.steady_x,
            ux = self.surge_x,
            a = self.steady_s,
            b = self.surge_s,
            c = self.after_s,
        )
    }

    /// The load's shape from the flags and the stack.
    fn new(args: &FleetArgs, stack: &stack::Stack, root: &Path) -> Result<Self> {
        let capacity = match (args.capacity, args.quick) {
            (Some(c), _) => (c, "given with --capacity".to_owned()),
            (None, true) => (60.0, "a nominal 60 req/s: --quick measures nothing".to_owned()),
            (None, false) => lab_capacity(root)?,
        };
        let plan = Plan {
            quick: args.quick,
            capacity_one: capacity.0,
            capacity_how: capacity.1,
            steady_x: 0.8,
            surge_x: 2.5,
            steady_s: if args.quick { 20 } else { 120 },
            surge_s: if args.quick { 60 } else { 180 },
            after_s: if args.quick { 45 } else { 120 },
            honour_share: 0.2,
            tasks: args.tasks.unwrap_or(stack.scaling.min_tasks),
            max_tasks: args.max_tasks,
            period_s: if args.quick { 10 } else { 60 },
            out_periods: args.out_periods,
            start_delay_s: args.start_delay.unwrap_or(if args.quick { 10 } else { 60 }),
            health_interval_s: if args.quick { 2 } else { stack.balancer.health.interval.as_secs() },
        };
        anyhow::ensure!(plan.tasks >= 1 && plan.tasks <= plan.max_tasks, "--tasks must be between 1 and --max-tasks");
        Ok(plan)
    }
}

fn log(msg: &str) {
    eprintln!("fleet: {msg}");
}

pub async fn run(args: FleetArgs) -> Result<()> {
    let root = services::root();
    if let Some(json) = &args.from_json {
        return from_json(&root, json);
    }
    let stack = stack::Stack::load(&root)?;
    ensure_haproxy()?;
    let plan = Plan::new(&args, &stack, &root)?;
    let out_dir = if args.quick { root.join("target/fleet-quick") } else { root.join("docs/fleet") };
    let runs = root.join(if args.quick { "target/fleet-quick/runs" } else { "target/fleet/runs" });
    std::fs::create_dir_all(&runs)?;

    let cpus = Millicores::QUARTER;
    let pin = match Pinned::create(Limits::new(cpus, 100_000, crate::lab::phase::MEMORY)?) {
        Ok(_) => true,
        Err(e) if args.quick => {
            log(&format!("WARNING: cannot pin the tasks ({e:#}); --quick goes on unpinned"));
            false
        }
        Err(e) => return Err(e.context("the fleet pins each task at 0.25 core / 512 MiB (run as root with cgroups)")),
    };
    let server = services::ensure_postgres(&services::database_url()).await?;
    let bin = root.join(if args.quick { "target/debug" } else { "target/release" });
    if !args.no_build {
        build(&root, args.quick)?;
    }
    let template = if args.quick { "breakwater_lab_quick" } else { "breakwater_lab" };
    let seed = crate::lab::dataset::seed(&bin, &server, template, args.quick).await?;
    let tokens = crate::lab::dataset::tokens(&services::with_database(&server, template), &runs, 1.0).await?;

    let mut fleet = record::Fleet {
        schema: record::SCHEMA.into(),
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        commit: crate::lab::dataset::commit(&root),
        seed,
        pinned: pin,
        plan: plan.clone(),
        stack: stack.clone(),
        runs: Vec::new(),
        throttles: None,
        capacity: None,
    };
    for e in &args.experiments {
        anyhow::ensure!(
            ["surge", "throttles", "capacity"].contains(&e.as_str()),
            "unknown experiment {e:?} (surge, throttles, capacity)"
        );
    }
    let wants = |e: &str| args.experiments.iter().any(|x| x == e);
    let variants: &[String] = if wants("surge") { &args.variants } else { &[] };
    let ctx = |variant: &'static str, db: &str| Ctx {
        server: server.clone(),
        bin: &bin,
        runs: &runs,
        db_url: services::with_database(&server, db),
        tokens: &tokens.path,
        variant,
        plan: &plan,
        stack: &stack,
        port: args.port,
        pin,
        cpus,
        redis_url: services::redis_url(),
        key_prefix: format!("bwfleet{}{variant}", std::process::id()),
    };
    let db = format!("{template}_fleet");
    for variant in variants {
        let variant: &'static str = match variant.as_str() {
            "adaptive" => "adaptive",
            "static" => "static",
            "off" => "off",
            other => anyhow::bail!("unknown variant {other:?} (adaptive, static, off)"),
        };
        fresh_copy(&server, template, &db).await?;
        let run = ctx(variant, &db).run().await.with_context(|| format!("the {variant} fleet"))?;
        log(&record::summary(&plan, &run, stack.balancer.deregistration_delay.as_secs()));
        record::check(&run)?;
        fleet.runs.push(run);
    }
    let mut broken = Vec::new();
    if wants("throttles") {
        fresh_copy(&server, template, &db).await?;
        let (mut t, missed) = ctx("adaptive", &db).throttles_checked(&tokens.path).await?;
        t.measured = format!("{} at `{}`", fleet.date, fleet.commit);
        fleet.throttles = Some(t);
        broken = missed;
    }
    if wants("capacity") {
        fresh_copy(&server, template, &db).await?;
        let mut c = ctx("adaptive", &db).capacities(plan.max_tasks).await?;
        c.measured = format!("{} at `{}`", fleet.date, fleet.commit);
        fleet.capacity = Some(c);
    }
    // A full run without the surge adds what it measured to the saved record, whose surge stays;
    // each part says when it was measured.
    if !args.quick && !wants("surge") {
        let path = out_dir.join("fleet.json");
        let saved =
            match std::fs::read_to_string(&path) {
                Ok(text) => Some(serde_json::from_str::<record::Fleet>(&text).with_context(|| {
                    format!("{} does not parse: move it away to start a new record", path.display())
                })?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            };
        if let Some(mut saved) = saved {
            if wants("throttles") {
                saved.throttles = fleet.throttles.take();
            }
            if wants("capacity") {
                saved.capacity = fleet.capacity.take();
            }
            fleet = saved;
        }
    }
    // A run that missed a correctness goal is kept beside its raw files, not in the docs.
    let (out, perf_md) = if broken.is_empty() {
        (&out_dir, (!args.quick).then(|| root.join("docs/PERFORMANCE.md")))
    } else {
        (&runs, None)
    };
    for w in record::write(&fleet, out, perf_md.as_deref())? {
        println!("wrote {}", w.display());
    }
    anyhow::ensure!(broken.is_empty(), "the fleet-wide throttles missed: {}", broken.join("; "));
    Ok(())
}

/// `--from-json`: the report again from a saved run, measuring nothing.
fn from_json(root: &Path, json: &Path) -> Result<()> {
    let text = std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let fleet: record::Fleet = serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    let quick = fleet.plan.quick;
    let out = if quick { root.join("target/fleet-quick") } else { root.join("docs/fleet") };
    for w in record::write(&fleet, &out, (!quick).then(|| root.join("docs/PERFORMANCE.md")).as_deref())? {
        println!("wrote {}", w.display());
    }
    Ok(())
}

/// The binaries a run starts: debug for `--quick`, release otherwise.
fn build(root: &Path, quick: bool) -> Result<()> {
    log("building the binaries (api, worker, seed, loadlab)");
    let status = std::process::Command::new(services::cargo())
        .args(["build", "-p", "breakwater-api", "-p", "breakwater-worker", "-p", "breakwater-seed"])
        .args(["-p", "breakwater-loadlab"])
        .args((!quick).then_some("--release"))
        .args(["--bin", "breakwater-api", "--bin", "breakwater-worker", "--bin", "breakwater-seed", "--bin", "loadlab"])
        .current_dir(root)
        .status()?;
    anyhow::ensure!(status.success(), "the build failed");
    Ok(())
}

/// HAProxy from the distribution's packages, installed when missing (root).
fn ensure_haproxy() -> Result<()> {
    if std::process::Command::new("haproxy").arg("-v").output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    log("installing haproxy (apt-get)");
    let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
    anyhow::ensure!(
        ok(std::process::Command::new("apt-get").args(["update", "-qq"]))
            && ok(std::process::Command::new("apt-get")
                .args(["install", "-y", "-qq", "haproxy"])
                .env("DEBIAN_FRONTEND", "noninteractive")),
        "haproxy is not installed and apt-get could not install it (as root: apt-get install haproxy)"
    );
    Ok(())
}

/// One task's capacity from the last full lab (docs/lab/lab.json).
fn lab_capacity(root: &Path) -> Result<(f64, String)> {
    let path = root.join("docs/lab/lab.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).context("docs/lab/lab.json")?)?;
    let rps =
        v.pointer("/capacity/rps").and_then(serde_json::Value::as_f64).context("docs/lab/lab.json has no capacity")?;
    let commit = v.get("commit").and_then(serde_json::Value::as_str).unwrap_or("?");
    Ok((rps, format!("one pinned task's capacity calibrated by the full lab at {commit} (docs/lab/lab.json)")))
}

async fn fresh_copy(server: &str, template: &str, db: &str) -> Result<()> {
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&services::with_database(server, "postgres"))
        .await?;
    let q = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", q(db))).execute(&admin).await?;
    sqlx::raw_sql(&format!("CREATE DATABASE {} TEMPLATE {}", q(db), q(template))).execute(&admin).await?;
    admin.close().await;
    Ok(())
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Ctx<'a> {
    /// The PostgreSQL server's URL (its maintenance database).
    server: String,
    bin: &'a Path,
    runs: &'a Path,
    db_url: String,
    tokens: &'a Path,
    variant: &'a str,
    plan: &'a Plan,
    stack: &'a stack::Stack,
    port: u16,
    pin: bool,
    cpus: Millicores,
    /// The Redis the tasks share, and their keys' prefix (one for the whole fleet).
    redis_url: String,
    key_prefix: String,
}

impl Ctx<'_> {
    fn listen(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn slots(&self) -> Vec<Slot> {
        (0..Autoscaler::slots(&self.policy()))
            .map(|i| {
                let base = self.port + 10 + 2 * u16::try_from(i).unwrap_or(0);
                Slot {
                    name: format!("task{i}"),
                    api: SocketAddr::from(([127, 0, 0, 1], base)),
                    ops: SocketAddr::from(([127, 0, 0, 1], base + 1)),
                }
            })
            .collect()
    }

    fn loadlab(&self, honour: bool, out: &Path) -> tokio::process::Command {
        let p = self.plan;
        let share = if honour { p.honour_share } else { 1.0 - p.honour_share };
        let mut ll = tokio::process::Command::new(self.bin.join("loadlab"));
        ll.args(["profile", "fleet-surge", "--base", &format!("http://{}", self.listen())])
            .arg("--profiles")
            .arg(self.runs.join("fleet-profiles.toml"))
            .args(["--capacity", &format!("{:.1}", 2.0 * p.capacity_one * share)])
            .arg("--tokens")
            .arg(self.tokens)
            .args([
                "--timeline",
                "--max-in-flight",
                "4096",
                "--timeout",
                "30s",
                "--seed",
                if honour { "2" } else { "1" },
            ])
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        // No smoke stage: it asks /ready on an ops listener, which (as behind the ALB) the
        // balancer does not route to; the runner has seen the first tasks pass their checks.
        ll.arg("--no-smoke");
        if honour {
            ll.arg("--honour-retry-after");
        }
        ll
    }

    fn launch(&self) -> Launch<'_> {
        self.launch_as(self.variant, self.variant, &self.redis_url, None)
    }

    /// How the tasks of a run named `name` start: admission, Redis and the tenant limit.
    fn launch_as<'b>(
        &'b self,
        name: &'b str,
        admission: &'b str,
        redis_url: &'b str,
        tenant_limit: Option<(f64, u32)>,
    ) -> Launch<'b> {
        Launch {
            bin: self.bin,
            runs: self.runs,
            db_url: &self.db_url,
            name,
            admission,
            redis_url,
            key_prefix: &self.key_prefix,
            tenant_limit,
            pin: self.pin,
            cpus: self.cpus,
        }
    }

    /// HAProxy configured from the stack for `slots` (every one in maintenance until
    /// registered), its files named after the run.
    async fn balancer(&self, name: &str, slots: &[Slot]) -> Result<Balancer> {
        let mut balancer_cfg = self.stack.balancer.clone();
        balancer_cfg.health.interval = Duration::from_secs(self.plan.health_interval_s);
        let socket = self.runs.join(format!("{name}-haproxy.sock"));
        let cfg = self.runs.join(format!("{name}-haproxy.cfg"));
        std::fs::write(&cfg, haproxy::config(&balancer_cfg, self.listen(), slots, &socket))?;
        Balancer::start(&cfg, &socket, &self.runs.join(format!("{name}-haproxy.log")), self.listen()).await
    }

    /// The balancer and `tasks` tasks started as `launch` says, registered and past their health
    /// checks (no autoscaler, no worker): the fixed fleets of the throttles' and capacity runs.
    async fn serving(&self, name: &str, tasks: u32, launch: &Launch<'_>) -> Result<(Balancer, Vec<Proc>)> {
        let slots: Vec<Slot> = self.slots().into_iter().take(tasks as usize).collect();
        let balancer = self.balancer(name, &slots).await?;
        let mut procs = Vec::new();
        let mut up = Ok(());
        for slot in &slots {
            match Proc::api(launch, slot, tasks) {
                Ok(p) => procs.push(p),
                Err(e) => {
                    up = Err(e);
                    break;
                }
            }
            if let Err(e) = balancer.register(&slot.name).await {
                up = Err(e);
                break;
            }
        }
        if up.is_ok() {
            let names: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
            up = balancer.wait_up(&names, Duration::from_secs(60 + 3 * self.plan.health_interval_s)).await;
        }
        if let Err(e) = up {
            for p in procs {
                p.stop(Duration::from_secs(15)).await;
            }
            balancer.stop().await;
            return Err(e);
        }
        Ok((balancer, procs))
    }

    fn policy(&self) -> Policy {
        let (p, sc) = (self.plan, &self.stack.scaling);
        // `Autoscaler::slots` counts on a scale-in's tasks being gone before the next scale-out.
        assert!(
            self.stack.balancer.deregistration_delay <= sc.scale_out_cooldown,
            "the deregistration delay outlasts the scale-out cooldown: the fleet's slots would not suffice"
        );
        Policy {
            target: f64::from(sc.cpu_target_percent) / 100.0,
            min_tasks: p.tasks.min(sc.min_tasks),
            max_tasks: p.max_tasks,
            period: Duration::from_secs(p.period_s),
            out_periods: p.out_periods,
            // The policy's low alarm: 15 one-minute datapoints under 90% of the target.
            in_periods: 15,
            out_cooldown: sc.scale_out_cooldown,
            in_cooldown: sc.scale_in_cooldown,
            start_delay: Duration::from_secs(p.start_delay_s),
            drain_delay: self.stack.balancer.deregistration_delay,
        }
    }

    /// One variant's fleet through the load.
    async fn run(&self) -> Result<record::Run> {
        let p = self.plan;
        log(&format!("== {} : {} tasks, at most {} ==", self.variant, p.tasks, p.max_tasks));
        std::fs::write(self.runs.join("fleet-profiles.toml"), p.profiles())?;
        let mut live = self.start().await?;
        let admin = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&services::with_database(&self.server, "postgres"))
            .await?;
        let before = costs::read(&self.redis_url, &live.balancer).await;
        let outs = [
            self.runs.join(format!("{}-load.json", self.variant)),
            self.runs.join(format!("{}-honouring.json", self.variant)),
        ];
        let mut loads = Vec::new();
        for (i, out) in outs.iter().enumerate() {
            let log = std::fs::File::create(out.with_extension("log"))?;
            loads.push(self.loadlab(i == 1, out).stderr(log).spawn().context("starting loadlab")?);
        }
        let drove = self.drive(&mut live, &mut loads, &admin).await;
        let after = costs::read(&self.redis_url, &live.balancer).await;
        let decisions =
            live.scaler.decisions.iter().map(|d| (d.at_s, d.from, d.to, d.cpu.is_finite().then_some(d.cpu))).collect();
        live.stop().await;
        let (seconds, peak_rss, connections) = drove?;
        for (mut ll, what) in loads.into_iter().zip(["the load", "the honouring load"]) {
            let status = ll.wait().await?;
            anyhow::ensure!(status.success(), "{what} failed ({status}): see {}", self.runs.display());
        }
        let load = breakwater_loadlab::report::Report::read_json(&outs[0])?;
        let honour = breakwater_loadlab::report::Report::read_json(&outs[1])?;
        let requests = [&load, &honour].iter().flat_map(|r| r.steps.iter()).map(|s| s.completed).sum();
        Ok(record::Run {
            costs: costs::between(&before, &after, requests, connections),
            variant: self.variant.to_owned(),
            phases: record::phases(&load),
            seconds: record::merge(&seconds, &[&load, &honour]),
            decisions,
            honouring: honour.steps.iter().filter_map(|s| s.logical.clone()).collect(),
            peak_rss_bytes: peak_rss,
        })
    }

    /// The balancer, the worker and the first tasks, registered and past their health checks
    /// (the load starts on a service that is up, as after its first deployment).
    async fn start(&self) -> Result<Live<'_>> {
        let p = self.plan;
        let slots = self.slots();
        let balancer = self.balancer(self.variant, &slots).await?;
        let launch = self.launch();
        let worker = Proc::worker(&launch)?;
        let mut tasks: Vec<Option<Proc>> = (0..slots.len()).map(|_| None).collect();
        for (i, slot) in slots.iter().enumerate().take(p.tasks as usize) {
            tasks[i] = Some(Proc::api(&launch, slot, p.max_tasks)?);
            balancer.register(&slot.name).await?;
        }
        let live = Live {
            balancer,
            worker,
            tasks,
            scaler: Autoscaler::new(self.policy(), p.tasks),
            slots,
            launch,
            jiffies: None,
        };
        let first: Vec<&str> = live.slots.iter().take(p.tasks as usize).map(|s| s.name.as_str()).collect();
        let within = Duration::from_secs(60 + 3 * p.health_interval_s);
        if let Err(e) = live.balancer.wait_up(&first, within).await {
            live.stop().await;
            return Err(e.context("the first tasks"));
        }
        Ok(live)
    }

    /// Every second until the load ends: samples each task, feeds the autoscaler and carries
    /// out what it decides. A third of the way into the last phase an operator lowers the
    /// desired count to the minimum, so that every run also measures a scale-in's drain.
    async fn drive(
        &self,
        live: &mut Live<'_>,
        loads: &mut [tokio::process::Child],
        admin: &sqlx::PgPool,
    ) -> Result<(Vec<TaskSecond>, u64, BTreeMap<String, u64>)> {
        let p = self.plan;
        let t0 = Instant::now();
        let scale_in_at = p.steady_s + p.surge_s + p.after_s / 3;
        let http = reqwest::Client::builder().timeout(Duration::from_millis(800)).build()?;
        let mut seconds = Vec::new();
        let mut period_cpu: Vec<f64> = Vec::new();
        let mut peak_rss = 0u64;
        let mut connections = BTreeMap::new();
        let database = services::database_name(&self.db_url);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let t = t0.elapsed().as_secs();
            let mut running = false;
            for ll in loads.iter_mut() {
                running |= ll.try_wait()?.is_none();
            }
            if !running {
                return Ok((seconds, peak_rss, connections));
            }
            for (app, n) in costs::connections(admin, &database).await {
                let peak = connections.entry(app).or_insert(0);
                *peak = n.max(*peak);
            }
            let row = live.sample(t, &http, self.cpus.cores(), &mut peak_rss).await;
            let cpus: Vec<f64> = row.tasks.iter().filter_map(|s| s.cpu).collect();
            if !cpus.is_empty() {
                period_cpu.push(cpus.iter().sum::<f64>() / cpus.len() as f64);
            }
            seconds.push(row);
            let mut events = live.scaler.tick(t);
            if t > 0 && t.is_multiple_of(p.period_s) && !period_cpu.is_empty() {
                let avg = period_cpu.iter().sum::<f64>() / period_cpu.len() as f64;
                period_cpu.clear();
                let before = live.scaler.decisions.len();
                events.extend(live.scaler.on_period(t, avg));
                if let Some(d) = live.scaler.decisions.get(before) {
                    log(&format!("{t:>4} s: CPU {:.0}% of the quota: {} -> {} tasks", avg * 100.0, d.from, d.to));
                }
            }
            if t == scale_in_at && live.scaler.desired() > live.scaler.policy().min_tasks {
                log(&format!("{t:>4} s: scale-in to the minimum (the desired count lowered by hand)"));
                events.extend(live.scaler.scale_in(t, 0, f64::NAN));
            }
            for e in events {
                live.apply(t, e).await?;
            }
        }
    }
}

/// A fleet that is up.
struct Live<'a> {
    balancer: Balancer,
    worker: Proc,
    tasks: Vec<Option<Proc>>,
    scaler: Autoscaler,
    slots: Vec<Slot>,
    launch: Launch<'a>,
    /// The machine's (busy, total) jiffies at the last sample.
    jiffies: Option<(u64, u64)>,
}

impl Live<'_> {
    /// One second of every task: its CPU, admission and the balancer's view.
    async fn sample(&mut self, t: u64, http: &reqwest::Client, quota: f64, peak_rss: &mut u64) -> TaskSecond {
        let states = self.balancer.states().await.unwrap_or_default();
        let jiffies = crate::lab::probes::machine_jiffies();
        let machine_busy = match (self.jiffies, jiffies) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => Some((b1 - b0) as f64 / (t1 - t0) as f64),
            _ => None,
        };
        self.jiffies = jiffies;
        let mut row = TaskSecond { t, desired: self.scaler.desired(), machine_busy, tasks: Vec::new() };
        for (i, slot) in self.slots.iter().enumerate() {
            let state = self.scaler.tasks().get(i).copied();
            let Some(proc) = self.tasks[i].as_mut() else {
                if let Some(TaskState::Pending { .. }) = state {
                    row.tasks.push(record::TaskSample::pending(&slot.name));
                }
                continue;
            };
            let cpu = proc.cpu_share(quota);
            *peak_rss = (*peak_rss).max(proc.peak_bytes().unwrap_or(0));
            let admission = processes::admission(http, slot.ops).await;
            row.tasks.push(record::TaskSample {
                name: slot.name.clone(),
                state: if matches!(state, Some(TaskState::Draining { .. })) {
                    "draining".into()
                } else {
                    "running".into()
                },
                balancer: states.get(&slot.name).cloned().unwrap_or_default(),
                cpu,
                limit: admission.and_then(|a| a.0),
                in_flight: admission.map(|a| a.1),
            });
        }
        row
    }

    async fn apply(&mut self, t: u64, event: Event) -> Result<()> {
        match event {
            Event::Start(i) => {
                log(&format!("{t:>4} s: {} starts", self.slots[i].name));
                self.tasks[i] = Some(Proc::api(&self.launch, &self.slots[i], self.scaler.policy().max_tasks)?);
                self.balancer.register(&self.slots[i].name).await?;
            }
            Event::Deregister(i) => {
                log(&format!("{t:>4} s: {} deregistered, draining", self.slots[i].name));
                self.balancer.drain(&self.slots[i].name).await?;
            }
            Event::Stop(i) => {
                log(&format!("{t:>4} s: {} gets SIGTERM", self.slots[i].name));
                if let Some(proc) = self.tasks[i].take() {
                    proc.stop(Duration::from_secs(15)).await;
                }
                self.balancer.remove(&self.slots[i].name).await?;
            }
        }
        Ok(())
    }

    async fn stop(self) {
        for proc in self.tasks.into_iter().flatten() {
            proc.stop(Duration::from_secs(15)).await;
        }
        self.worker.stop(Duration::from_secs(15)).await;
        self.balancer.stop().await;
    }
}
