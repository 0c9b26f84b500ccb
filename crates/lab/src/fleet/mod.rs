//! `cargo xtask fleet`: API tasks, each pinned at the production shape, behind HAProxy configured
//! as the stack's ALB and target group, scaled by a copy of the stack's CPU target tracking, all
//! sharing one PostgreSQL (the seed) and one Redis, with one worker; a steady load, a surge and
//! the way back, per admission variant. What it measures is the minute a new task takes to
//! start: the report (docs/PERFORMANCE.md, the fleet section) says what each second saw.

pub(crate) mod autoscaler;
mod capacity;
mod costs;
pub(crate) mod haproxy;
pub(crate) mod plan;
mod processes;
pub(crate) mod record;
pub(crate) mod stack;
mod surge;
mod throttles;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use self::autoscaler::{Autoscaler, Policy};
use self::haproxy::Slot;
use self::plan::Plan;
use self::processes::{Balancer, Launch, Proc};
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
    let pin = pin_tasks(cpus, args.quick)?;
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
    check_experiments(&args.experiments)?;
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
        let variant = admission_variant(variant)?;
        fresh_copy(&server, template, &db).await?;
        let run = ctx(variant, &db).surge().await.with_context(|| format!("the {variant} fleet"))?;
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
        fleet = added_to_saved(fleet, &out_dir.join("fleet.json"), wants)?;
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

/// Whether each task runs pinned at `cpus` and the production memory (root and cgroups); only
/// `--quick` may go on without.
fn pin_tasks(cpus: Millicores, quick: bool) -> Result<bool> {
    match Pinned::create(Limits::new(cpus, 100_000, crate::lab::phase::MEMORY)?) {
        Ok(_) => Ok(true),
        Err(e) if quick => {
            log(&format!("WARNING: cannot pin the tasks ({e:#}); --quick goes on unpinned"));
            Ok(false)
        }
        Err(e) => Err(e.context("the fleet pins each task at 0.25 core / 512 MiB (run as root with cgroups)")),
    }
}

/// `--experiments` names only experiments there are.
fn check_experiments(experiments: &[String]) -> Result<()> {
    for e in experiments {
        anyhow::ensure!(
            ["surge", "throttles", "capacity"].contains(&e.as_str()),
            "unknown experiment {e:?} (surge, throttles, capacity)"
        );
    }
    Ok(())
}

/// One of `--variants`: the admission variant it names.
fn admission_variant(variant: &str) -> Result<&'static str> {
    Ok(match variant {
        "adaptive" => "adaptive",
        "static" => "static",
        "off" => "off",
        other => anyhow::bail!("unknown variant {other:?} (adaptive, static, off)"),
    })
}

/// The saved record at `path` with `fleet`'s throttles and capacity in place of its own, for
/// the experiments `wants` names; the rest (the surge among them) stays as saved. Without a
/// saved record, `fleet` as it is.
fn added_to_saved(mut fleet: record::Fleet, path: &Path, wants: impl Fn(&str) -> bool) -> Result<record::Fleet> {
    let saved = match std::fs::read_to_string(path) {
        Ok(text) => Some(
            serde_json::from_str::<record::Fleet>(&text)
                .with_context(|| format!("{} does not parse: move it away to start a new record", path.display()))?,
        ),
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
    Ok(fleet)
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
}
